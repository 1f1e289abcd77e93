//! Protection domains and the memory they own: buffers, registered regions, memory windows, buffer pools, thread and parent domains.

pub(crate) mod buffer;
pub(crate) mod buffer_pool;
pub(crate) mod memory_region;
pub(crate) mod memory_window;
pub(crate) mod protection_domain;
pub(crate) mod thread_domain;

pub use crate::types::AccessFlags;
pub use buffer::{
    Buf, DeviceReadable, DeviceWritable, FrozenBuffer, LocalBuffer, RemoteKey, RemoteMemory,
    SgList, SharedBuffer,
};
pub use buffer_pool::{BufferPool, BufferPoolBuilder, PooledBuffer, PutError};
pub use memory_region::{
    Advice, AnonymousMemory, DmabufRegion, ImplicitOdpRegion, MemoryRegion, OdpCaps,
    OdpGeneralCaps, OdpTransportCaps, RegisterOptions, Storage,
};
pub use memory_window::{BindTarget, MemoryWindow, MwType};
pub use protection_domain::ProtectionDomain;
pub use thread_domain::{ParentDomain, ThreadDomain};
