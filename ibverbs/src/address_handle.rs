//! PLACEHOLDER: address handles (being written).

use std::ptr::NonNull;
use std::sync::Arc;

use ibverbs_sys as sys;

use crate::ProtectionDomain;

pub(crate) struct AhInner {
    pub(crate) ah: NonNull<sys::ibv_ah>,
    pub(crate) pd: ProtectionDomain,
}

// SAFETY: address handles are immutable after creation and thread-safe.
unsafe impl Send for AhInner {}
// SAFETY: as above.
unsafe impl Sync for AhInner {}

impl Drop for AhInner {
    fn drop(&mut self) {
        // SAFETY: last reference; UD requests using it hold clones.
        unsafe { sys::ibv_destroy_ah(self.ah.as_ptr()) };
    }
}

/// An address handle (`struct ibv_ah`): the destination of UD sends.
#[derive(Clone)]
pub struct AddressHandle {
    pub(crate) inner: Arc<AhInner>,
}

impl AddressHandle {
    /// The raw pointer, valid while `self` lives.
    pub fn as_ptr(&self) -> *mut sys::ibv_ah {
        self.inner.ah.as_ptr()
    }
    /// The protection domain.
    pub fn pd(&self) -> &ProtectionDomain {
        &self.inner.pd
    }
}

impl std::fmt::Debug for AddressHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AddressHandle").finish_non_exhaustive()
    }
}
