//! Memory windows (`struct ibv_mw`): remote access to a range of a memory
//! region, granted and revoked from the data path.
//!
//! A window is allocated in a protection domain and *bound* to a range of a
//! region registered with [`AccessFlags::MW_BIND`]. The bind hands out a new
//! remote key; invalidating the window (locally with
//! [`SendQueue::invalidate_mw`](crate::SendQueue::invalidate_mw), or by the
//! peer with a send-with-invalidate) revokes it, after which a peer's access
//! fails with a remote access error.
//!
//! Ownership: a window keeps every region the device may reach through it
//! registered (it holds their `Arc`s) until a bind or invalidate of it
//! *completed successfully* or `ibv_dealloc_mw` succeeded, so the storage
//! of a region a peer can still write through the window is never freed.
//! One bind or invalidate per window is outstanding at a time; the state
//! logic is in `binding.rs` (see DESIGN.md, "Memory windows"). Windows
//! granting remote write or atomic access are only bound over
//! [`SharedBuffer`] memory, like memory regions: a peer's writes never race
//! a Rust reference.
//!
//! A window narrows what a peer may reach only as far as the provider
//! enforces it: rxe checks window accesses against the region's bounds, not
//! the window's (docs/providers.md). Isolate peers from each other with
//! separate registrations.

mod binding;

use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use rdma_verbs_sys as sys;

use crate::error::{ret_ptr, Error, Result};
use crate::memory::buffer::{
    FrozenBuffer, LocalBuffer, Region, RemoteKey, RemoteMemory, SharedBuffer,
};
use crate::memory::memory_region::MrInner;
use crate::memory::protection_domain::ProtectionDomain;
use crate::types::AccessFlags;
pub(crate) use binding::Bound;
use binding::{Binding, Outcome};

/// The type of a memory window.
///
/// # References
/// `ibv_alloc_mw(3)`
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MwType {
    /// Type 1: bound with [`SendQueue::bind_mw`](crate::SendQueue::bind_mw)
    /// (`ibv_bind_mw`), tied to the protection domain; re-binding replaces
    /// the binding.
    Type1,
    /// Type 2: bound by a work request (`IBV_WR_BIND_MW`), tied to the QP
    /// that bound it; must be invalidated before it is bound again.
    Type2,
}

impl MwType {
    fn raw(self) -> sys::ibv_mw_type {
        match self {
            MwType::Type1 => sys::IBV_MW_TYPE_1,
            MwType::Type2 => sys::IBV_MW_TYPE_2,
        }
    }
}

pub(crate) type MwState = Binding<MrInner>;

pub(crate) struct MwInner {
    mw: NonNull<sys::ibv_mw>,
    pub(crate) pd: ProtectionDomain,
    pub(crate) kind: MwType,
    /// Also guards `ibv_mw::rkey`, which always names the committed key
    /// between calls (providers read it as the window's current key).
    state: Mutex<MwState>,
}

// SAFETY: the window is only passed to thread-safe verbs; its state is
// behind a Mutex.
unsafe impl Send for MwInner {}
// SAFETY: as above.
unsafe impl Sync for MwInner {}

impl Drop for MwInner {
    fn drop(&mut self) {
        // SAFETY: last reference: every outstanding request naming the
        // window holds a clone in its slot. Deallocation revokes any
        // binding; the regions are released afterwards (field drop order).
        let rc = unsafe { sys::ibv_dealloc_mw(self.mw.as_ptr()) };
        if rc != 0 {
            // The window lives on in the device, bound to who knows which
            // region: keep them all (and the PD they need) for good.
            let st = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
            st.leak();
            std::mem::forget(self.pd.clone());
        }
    }
}

impl MwInner {
    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, MwState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Settles the window's outstanding request and points `ibv_mw::rkey`
    /// back at the committed key. Regions no longer reachable are dropped
    /// after the lock.
    fn settle(&self, outcome: Outcome) {
        let mut st = self.lock();
        let released = st.finish(outcome);
        // SAFETY: live window; `ibv_mw::rkey` is touched only under its
        // lock (held). Providers name the window by it in the next bind or
        // invalidate, so after a failure it must not keep the failed key
        // (rxe's provider leaves that undo to the caller).
        unsafe { (*self.mw.as_ptr()).rkey = st.rkey() };
        drop(st);
        drop(released);
    }
}

/// A window request's hold on its window, riding in the request's slot:
/// reports how the request ended, once. Completed through
/// [`complete`](Self::complete) with the completion's status; dropped
/// without one (the queue pair was reset or destroyed, or the slot retired
/// by a later completion), the outcome is unknown and the window keeps
/// every region and refuses further requests.
pub(crate) struct WindowOp {
    pub(crate) mw: Option<MemoryWindow>,
}

impl WindowOp {
    /// The completion of the request arrived with `status`.
    pub(crate) fn complete(mut self, status: sys::ibv_wc_status) {
        if let Some(mw) = self.mw.take() {
            mw.inner.settle(if status == sys::IBV_WC_SUCCESS {
                Outcome::Success
            } else {
                Outcome::Failed
            });
        }
    }
    /// The request was refused before the device saw it: nothing happened.
    pub(crate) fn cancel(mut self) {
        self.mw = None;
    }
}

impl Drop for WindowOp {
    fn drop(&mut self) {
        if let Some(mw) = self.mw.take() {
            mw.inner.settle(Outcome::Unknown);
        }
    }
}

impl std::fmt::Debug for WindowOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("WindowOp").field(&self.mw).finish()
    }
}

/// A memory window. Cheap to clone.
///
/// # References
/// `ibv_alloc_mw(3)`, `ibv_bind_mw(3)`, `ibv_post_send(3)` (`IBV_WR_BIND_MW`,
/// `IBV_WR_LOCAL_INV`, `IBV_WR_SEND_WITH_INV`)
#[derive(Clone)]
pub struct MemoryWindow {
    pub(crate) inner: Arc<MwInner>,
}

impl std::fmt::Debug for MemoryWindow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryWindow")
            .field("type", &self.inner.kind)
            .field("rkey", &format_args!("{:#x}", self.rkey().0))
            .finish()
    }
}

impl ProtectionDomain {
    /// Allocates a memory window of type `kind`.
    ///
    /// # Errors
    /// [`Error::Unsupported`] when the device does not support windows of
    /// that type (its `IBV_DEVICE_MEM_WINDOW*` capability flags say so);
    /// otherwise [`Error::Verb`] naming `ibv_alloc_mw`.
    ///
    /// # References
    /// `ibv_alloc_mw(3)`
    ///
    /// # Example
    /// ```no_run
    /// # fn main() -> rdma_verbs::Result<()> {
    /// let ctx = rdma_verbs::open_device("rxe0")?;
    /// let pd = ctx.alloc_pd()?;
    /// let mw = pd.alloc_mw(rdma_verbs::memory::MwType::Type2)?;
    /// # Ok(()) }
    /// ```
    #[doc(alias = "ibv_alloc_mw")]
    pub fn alloc_mw(&self, kind: MwType) -> Result<MemoryWindow> {
        // SAFETY: live PD; the window is deallocated in MwInner's Drop.
        let mw = unsafe { sys::ibv_alloc_mw(self.as_ptr(), kind.raw()) };
        let mw = ret_ptr("ibv_alloc_mw", mw).map_err(|e| {
            if e.raw_os_error() == Some(libc::EOPNOTSUPP) {
                Error::Unsupported(match kind {
                    MwType::Type1 => {
                        "memory windows of type 1 (ibv_alloc_mw: EOPNOTSUPP; see the \
                         device's IBV_DEVICE_MEM_WINDOW* capability flags)"
                    }
                    MwType::Type2 => {
                        "memory windows of type 2 (ibv_alloc_mw: EOPNOTSUPP; see the \
                         device's IBV_DEVICE_MEM_WINDOW* capability flags)"
                    }
                })
            } else {
                e
            }
        })?;
        // SAFETY: valid window; the provider set its initial rkey.
        let rkey = unsafe { (*mw.as_ptr()).rkey };
        Ok(MemoryWindow {
            inner: Arc::new(MwInner {
                mw,
                pd: self.clone(),
                kind,
                state: Mutex::new(Binding::new(rkey)),
            }),
        })
    }
}

impl MemoryWindow {
    /// The window's type.
    pub fn kind(&self) -> MwType {
        self.inner.kind
    }
    /// The window's remote key as of the last bind or invalidate that
    /// completed successfully (the allocation's key before any). A request
    /// still outstanding, or one that failed, does not change it.
    pub fn rkey(&self) -> RemoteKey {
        RemoteKey(self.inner.lock().rkey())
    }
    /// What the last successfully completed bind granted; `None` before
    /// any, or after a successful local invalidation.
    pub fn remote(&self) -> Option<RemoteMemory> {
        self.inner.lock().bound().map(|b| b.1)
    }
    /// The protection domain.
    pub fn pd(&self) -> &ProtectionDomain {
        &self.inner.pd
    }
    /// The raw window pointer, valid while `self` lives.
    pub fn as_ptr(&self) -> *mut sys::ibv_mw {
        self.inner.mw.as_ptr()
    }
}

/// Memory a window is bound over. Remote write and atomic rights need a
/// [`SharedBuffer`]; a [`LocalBuffer`] or [`FrozenBuffer`] can only be
/// exposed for remote reads. Built with `From` from a reference to either.
#[derive(Debug, Clone, Copy)]
pub enum BindTarget<'a> {
    /// Memory peers may write.
    Shared(&'a SharedBuffer),
    /// Exclusively owned memory (remote reads only).
    Local(&'a LocalBuffer),
    /// Read-only memory (remote reads only).
    Frozen(&'a FrozenBuffer),
}

impl<'a> From<&'a SharedBuffer> for BindTarget<'a> {
    fn from(b: &'a SharedBuffer) -> Self {
        BindTarget::Shared(b)
    }
}
impl<'a> From<&'a LocalBuffer> for BindTarget<'a> {
    fn from(b: &'a LocalBuffer) -> Self {
        BindTarget::Local(b)
    }
}
impl<'a> From<&'a FrozenBuffer> for BindTarget<'a> {
    fn from(b: &'a FrozenBuffer) -> Self {
        BindTarget::Frozen(b)
    }
}

impl BindTarget<'_> {
    pub(crate) fn region(&self) -> (&Region, bool) {
        match self {
            BindTarget::Shared(b) => (b.region(), true),
            BindTarget::Local(b) => (b.region(), false),
            BindTarget::Frozen(b) => (b.region(), false),
        }
    }
}

pub(crate) fn mw_access(access: AccessFlags) -> Result<u32> {
    let allowed = AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_ATOMIC
        | AccessFlags::ZERO_BASED;
    if !allowed.contains(access) {
        return Err(Error::AccessNotAllowed {
            what: "a memory window",
            flags: access - allowed,
        });
    }
    Ok(access.bits())
}
