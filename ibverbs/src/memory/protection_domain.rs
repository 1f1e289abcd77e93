//! Protection domains.

use std::ptr::NonNull;
use std::sync::Arc;

use rdma_verbs_sys as sys;

use crate::device::context::Context;
use crate::error::{ret_errno, ret_ptr, Result};

pub(crate) struct PdInner {
    pub(crate) pd: NonNull<sys::ibv_pd>,
    pub(crate) ctx: Context,
}

// SAFETY: a PD is only passed to thread-safe verbs; libibverbs allows using
// it from any thread.
unsafe impl Send for PdInner {}
// SAFETY: as above.
unsafe impl Sync for PdInner {}

impl Drop for PdInner {
    fn drop(&mut self) {
        // SAFETY: last reference; every MR/QP/AH/SRQ of this PD holds a clone,
        // so nothing uses it any more. The only possible error (EBUSY) cannot
        // happen for that reason; Drop must not panic, so it is ignored.
        unsafe { sys::ibv_dealloc_pd(self.pd.as_ptr()) };
    }
}

/// A protection domain (`struct ibv_pd`): groups memory regions, queue pairs
/// and address handles that may be used together.
///
/// Cheap to clone; children keep it (and the [`Context`]) alive.
///
/// # References
/// `ibv_alloc_pd(3)`
#[derive(Clone)]
pub struct ProtectionDomain {
    pub(crate) inner: Arc<PdInner>,
}

impl Context {
    /// Allocates a protection domain.
    ///
    /// # Errors
    /// [`Error::Verb`](crate::Error::Verb) naming `ibv_alloc_pd`.
    ///
    /// # References
    /// `ibv_alloc_pd(3)`
    #[doc(alias = "ibv_alloc_pd")]
    pub fn alloc_pd(&self) -> Result<ProtectionDomain> {
        // SAFETY: live context; the PD is deallocated in PdInner's Drop.
        let pd = unsafe { sys::ibv_alloc_pd(self.as_ptr()) };
        let pd = ret_ptr("ibv_alloc_pd", pd)?;
        Ok(ProtectionDomain {
            inner: Arc::new(PdInner {
                pd,
                ctx: self.clone(),
            }),
        })
    }
}

impl ProtectionDomain {
    /// The context the PD belongs to.
    pub fn context(&self) -> &Context {
        &self.inner.ctx
    }

    /// The raw PD pointer, valid while `self` lives.
    pub fn as_ptr(&self) -> *mut sys::ibv_pd {
        self.inner.pd.as_ptr()
    }

    /// Deallocates the PD now and reports the error, if it is the last handle
    /// (`Ok(false)` when other handles or children still hold it).
    ///
    /// # Errors
    /// [`Error::Verb`](crate::Error::Verb) naming `ibv_dealloc_pd`.
    pub fn close(self) -> Result<bool> {
        match Arc::try_unwrap(self.inner) {
            Ok(inner) => {
                let inner = std::mem::ManuallyDrop::new(inner);
                // SAFETY: sole owner; the PD is not used again (no Drop runs).
                let rc = unsafe { sys::ibv_dealloc_pd(inner.pd.as_ptr()) };
                // SAFETY: release the context handle that ManuallyDrop kept.
                drop(unsafe { std::ptr::read(&inner.ctx) });
                ret_errno("ibv_dealloc_pd", rc).map(|()| true)
            }
            Err(_) => Ok(false),
        }
    }
}

impl std::fmt::Debug for ProtectionDomain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProtectionDomain")
            .field("handle", &unsafe_handle(self.as_ptr()))
            .finish()
    }
}

fn unsafe_handle(pd: *mut sys::ibv_pd) -> u32 {
    // SAFETY: `handle` is an immutable field of a live PD.
    unsafe { (*pd).handle }
}
