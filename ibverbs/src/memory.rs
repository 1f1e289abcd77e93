//! Protection domains and the memory they own: buffers, registered regions, memory windows, buffer pools, thread and parent domains.

pub(crate) mod buffer;
pub(crate) mod buffer_pool;
pub(crate) mod memory_region;
pub(crate) mod memory_window;
pub(crate) mod protection_domain;
pub(crate) mod thread_domain;
