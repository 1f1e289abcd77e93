//! `use ibverbs::prelude::*;` imports the objects a program meets first:
//! the crate root's names except [`Error`](crate::Error) and
//! [`Result`](crate::Result), which would shadow the standard library's, and
//! except the namespaces.

pub use crate::cq::{Completion, CompletionQueue, Completions, WcOpcode, WcStatus};
pub use crate::device::{devices, open_device, Context, Device, Gid, PortNumber};
pub use crate::memory::{
    AccessFlags, LocalBuffer, MemoryRegion, ProtectionDomain, RemoteMemory, SharedBuffer,
};
pub use crate::qp::{
    ConnectOptions, Endpoint, LocalPort, QpState, QpType, QueuePair, RecvQueue, RecvRequest,
    SendQueue, SendRequest, Wr,
};
