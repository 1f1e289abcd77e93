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
