//! Devices and their contexts: opening them, ports, GIDs, capabilities, asynchronous events and their routing, counters, device memory, fork support, the library loader.

pub(crate) mod capabilities;
pub(crate) mod context;
pub(crate) mod device_memory;
pub(crate) mod event_routing;
pub(crate) mod flow_counters;
pub(crate) mod fork;
pub(crate) mod gid;
pub(crate) mod library;
pub(crate) mod list;
pub(crate) mod port;
pub(crate) mod port_counters;

pub use crate::types::{Gid, GidIndex, GidSelector, PortNumber};
pub use capabilities::{DeviceAttrEx, Feature};
pub use context::{AtomicCap, Context, DeviceAttr};
pub use device_memory::DeviceMemory;
pub use event_routing::{
    AsyncElement, AsyncEvent, AsyncEventReceiver, AsyncEventType, CqId, QpId, SrqId,
};
pub use flow_counters::{CounterDescription, FlowCounters};
pub use fork::{fork_init, fork_status, ForkStatus};
pub use gid::{GidEntry, GidType};
pub use list::{devices, open_active, open_device, Device, DeviceList};
pub use port::{LinkLayer, Mtu, PortAttr, PortState};
pub use port_counters::{CounterSource, PortCounters};
