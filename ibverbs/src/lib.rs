//! Safe, zero-overhead RDMA verbs over rdma-core's `libibverbs`.
//!
//! See `DESIGN.md` in the repository for the ownership model in one page.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

mod address_handle;
mod buffer;
mod completion_channel;
mod completion_queue;
mod context;
mod device;
mod error;
mod gid;
mod memory_region;
mod port;
mod protection_domain;
mod queue_pair;
mod shared_receive_queue;
mod work_completion;
mod wq_table;

pub mod hazards;

pub use ibverbs_sys as sys;

pub use address_handle::*;
pub use buffer::{
    Buf, DeviceReadable, DeviceWritable, FrozenBuffer, LocalBuffer, RemoteKey, RemoteMemory,
    SharedBuffer,
};
pub use completion_channel::CompletionChannel;
pub use completion_queue::{Completion, CompletionQueue, CompletionQueueBuilder, Completions};
pub use context::{AsyncEvent, AsyncEventType, AtomicCap, Context, DeviceAttr};
pub use device::{devices, open_device, Device, DeviceList};
pub use error::{Error, Result};
pub use gid::{Gid, GidEntry, GidIndex, GidType};
pub use memory_region::{AccessFlags, AnonymousMemory, MemoryRegion, Storage};
pub use port::{LinkLayer, Mtu, PortAttr, PortNumber, PortState};
pub use protection_domain::ProtectionDomain;
pub use queue_pair::*;
pub use shared_receive_queue::{SharedReceiveQueue, SharedReceiveQueueBuilder};
pub use work_completion::{WcOpcode, WcStatus, WorkCompletion};
pub use wq_table::SgList;
