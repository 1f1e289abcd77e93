//! Thread domains (`ibv_alloc_td`) and parent domains
//! (`ibv_alloc_parent_domain`): a promise that objects created in a
//! thread domain are used by one thread at a time, which lets a provider
//! drop its locks (mlx5 maps a doorbell register per thread domain).
//!
//! Only allocation is offered: creating queue pairs or CQs in a parent
//! domain would hand the provider the caller's promise of single-threaded
//! use, which this library's `Sync` handles cannot keep. [`ParentDomain`]
//! exposes its raw pointer for code that creates such objects itself.

use std::ptr::NonNull;
use std::sync::Arc;

use rdma_verbs_sys as sys;

use crate::device::context::Context;
use crate::error::{ret_ptr, Result};
use crate::memory::protection_domain::ProtectionDomain;

struct TdInner {
    td: NonNull<sys::ibv_td>,
    ctx: Context,
}

// SAFETY: a thread domain is only passed to thread-safe verbs
// (`ibv_alloc_parent_domain`, `ibv_dealloc_td`); nothing here uses the
// objects the domain promises single-threaded use of.
unsafe impl Send for TdInner {}
// SAFETY: as above.
unsafe impl Sync for TdInner {}

impl Drop for TdInner {
    fn drop(&mut self) {
        // SAFETY: last reference; every parent domain over it holds a
        // clone, so none is left. A failure (EBUSY) leaves it allocated:
        // a leak; Drop must not panic.
        unsafe { sys::ibv_dealloc_td(self.td.as_ptr()) };
    }
}

/// A thread domain (`struct ibv_td`). Cheap to clone; keeps its
/// [`Context`] open, and parent domains keep it.
///
/// # References
/// `ibv_alloc_td(3)`
#[derive(Clone)]
pub struct ThreadDomain {
    inner: Arc<TdInner>,
}

impl Context {
    /// Allocates a thread domain.
    ///
    /// No device attribute announces thread domains: the provider's
    /// answer is the capability check (rxe, like every provider but mlx5
    /// in rdma-core 44, has none: libibverbs answers `EOPNOTSUPP`).
    ///
    /// # Errors
    /// [`Error::Verb`](crate::Error::Verb) naming `ibv_alloc_td`:
    /// `EOPNOTSUPP` when the provider has no thread domains, `ENOMEM`.
    ///
    /// # References
    /// `ibv_alloc_td(3)`
    #[doc(alias = "ibv_alloc_td")]
    pub fn alloc_td(&self) -> Result<ThreadDomain> {
        let mut attr = sys::ibv_td_init_attr { comp_mask: 0 };
        // SAFETY: live context; `attr` valid for the call; the domain is
        // deallocated in TdInner's Drop.
        let td = unsafe { sys::ibv_alloc_td(self.as_ptr(), &mut attr) };
        let td = ret_ptr("ibv_alloc_td", td)?;
        Ok(ThreadDomain {
            inner: Arc::new(TdInner {
                td,
                ctx: self.clone(),
            }),
        })
    }
}

impl ThreadDomain {
    /// The context the domain belongs to.
    pub fn context(&self) -> &Context {
        &self.inner.ctx
    }

    /// The raw `ibv_td` pointer, valid while `self` lives.
    pub fn as_ptr(&self) -> *mut sys::ibv_td {
        self.inner.td.as_ptr()
    }
}

impl std::fmt::Debug for ThreadDomain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadDomain").finish_non_exhaustive()
    }
}

/// A parent domain (`ibv_alloc_parent_domain`): a protection domain
/// object that names a [`ProtectionDomain`] and, optionally, a
/// [`ThreadDomain`]. Deallocated on drop (`ibv_dealloc_pd`), before the
/// domains it names, which it keeps alive.
///
/// No custom allocator callbacks (`alloc`/`free`/`pd_context`) are set:
/// the provider allocates as for the protection domain itself.
///
/// # References
/// `ibv_alloc_parent_domain(3)`
pub struct ParentDomain {
    raw: NonNull<sys::ibv_pd>,
    pd: ProtectionDomain,
    td: Option<ThreadDomain>,
}

// SAFETY: as for a protection domain: only passed to thread-safe verbs
// (`ibv_dealloc_pd`); the handle offers no way to create objects in it.
unsafe impl Send for ParentDomain {}
// SAFETY: as above; `&self` offers only accessors.
unsafe impl Sync for ParentDomain {}

impl ProtectionDomain {
    /// Allocates a parent domain over this protection domain and, if
    /// given, a thread domain of the same context.
    ///
    /// # Errors
    /// * [`Error::ForeignContext`](crate::Error::ForeignContext) when `td`
    ///   is of another context (checked before the verb).
    /// * [`Error::Verb`](crate::Error::Verb) naming
    ///   `ibv_alloc_parent_domain`: `EOPNOTSUPP` when the provider has no
    ///   parent domains (rxe), `EINVAL`.
    ///
    /// # References
    /// `ibv_alloc_parent_domain(3)`
    #[doc(alias = "ibv_alloc_parent_domain")]
    pub fn alloc_parent_domain(&self, td: Option<&ThreadDomain>) -> Result<ParentDomain> {
        if let Some(td) = td {
            if !Arc::ptr_eq(&td.context().inner, &self.context().inner) {
                return Err(crate::error::Error::ForeignContext {
                    what: "thread domain",
                });
            }
        }
        let mut attr = sys::ibv_parent_domain_init_attr {
            pd: self.as_ptr(),
            td: td.map_or(std::ptr::null_mut(), ThreadDomain::as_ptr),
            comp_mask: 0,
            alloc: None,
            free: None,
            pd_context: std::ptr::null_mut(),
        };
        // SAFETY: live context, PD and TD (all held by the result); `attr`
        // valid for the call, its comp_mask 0 so the callbacks are unread.
        let raw = unsafe { sys::ibv_alloc_parent_domain(self.context().as_ptr(), &mut attr) };
        let raw = ret_ptr("ibv_alloc_parent_domain", raw)?;
        Ok(ParentDomain {
            raw,
            pd: self.clone(),
            td: td.cloned(),
        })
    }
}

impl ParentDomain {
    /// The protection domain it names.
    pub fn protection_domain(&self) -> &ProtectionDomain {
        &self.pd
    }

    /// The thread domain it names, if any.
    pub fn thread_domain(&self) -> Option<&ThreadDomain> {
        self.td.as_ref()
    }

    /// The raw `ibv_pd` pointer of the parent domain, valid while `self`
    /// lives. Objects created in it outside this library must be
    /// destroyed before `self` is dropped.
    pub fn as_ptr(&self) -> *mut sys::ibv_pd {
        self.raw.as_ptr()
    }
}

impl Drop for ParentDomain {
    fn drop(&mut self) {
        // The PD and TD fields drop after this body, so the parent domain
        // goes first. A failure (EBUSY: raw objects still in it) leaves it
        // allocated, holding nothing of ours freed: the PD and TD
        // deallocations then fail too and leak. Drop must not panic.
        // SAFETY: sole owner (not Clone); the library creates nothing in it.
        unsafe { sys::ibv_dealloc_pd(self.raw.as_ptr()) };
    }
}

impl std::fmt::Debug for ParentDomain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ParentDomain")
            .field("thread_domain", &self.td.is_some())
            .finish_non_exhaustive()
    }
}
