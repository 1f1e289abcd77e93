//! Memory windows (`struct ibv_mw`): remote access to a range of a memory
//! region, granted and revoked from the data path.
//!
//! A window is allocated in a protection domain and *bound* to a range of a
//! region registered with [`AccessFlags::MW_BIND`]. The bind hands out a new
//! remote key; invalidating the window (locally with
//! [`QueuePair::invalidate_mw`], or by the peer with a send-with-invalidate)
//! revokes it, after which a peer's access fails with a remote access error.
//!
//! Ownership: a bound window keeps its region registered (it holds the
//! region's `Arc`) until it is re-bound, invalidated locally, or dropped, so
//! `ibv_dereg_mr` never meets a bound window. Windows granting remote write
//! or atomic access are only bound over [`SharedBuffer`] memory, like
//! memory regions: a peer's writes never race a Rust reference.

use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use ibverbs_sys as sys;

use crate::buffer::{FrozenBuffer, LocalBuffer, Region, RemoteKey, RemoteMemory, SharedBuffer};
use crate::error::{ret_ptr, Error, Result};
use crate::memory_region::{AccessFlags, MrInner};
use crate::wq_table::{Keep, Payload};
use crate::{ProtectionDomain, QpState, QpType, QueuePair};

/// The type of a memory window.
///
/// # References
/// `ibv_alloc_mw(3)`
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MwType {
    /// Type 1: bound with [`QueuePair::bind_mw`] (`ibv_bind_mw`), tied to
    /// the protection domain; re-binding replaces the binding.
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

struct MwState {
    rkey: u32,
    /// The region of the current binding and what it grants.
    bound: Option<(Arc<MrInner>, RemoteMemory)>,
}

pub(crate) struct MwInner {
    mw: NonNull<sys::ibv_mw>,
    pd: ProtectionDomain,
    kind: MwType,
    state: Mutex<MwState>,
}

// SAFETY: the window is only passed to thread-safe verbs; its state is
// behind a Mutex.
unsafe impl Send for MwInner {}
// SAFETY: as above.
unsafe impl Sync for MwInner {}

impl Drop for MwInner {
    fn drop(&mut self) {
        // SAFETY: last reference: every work request naming the window holds
        // a clone. Deallocation invalidates a binding; the bound region is
        // released afterwards (field drop order). Errors cannot be reported
        // from Drop.
        unsafe { sys::ibv_dealloc_mw(self.mw.as_ptr()) };
    }
}

impl MwInner {
    fn lock(&self) -> std::sync::MutexGuard<'_, MwState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
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
    /// # fn main() -> ibverbs::Result<()> {
    /// let ctx = ibverbs::open_device("rxe0")?;
    /// let pd = ctx.alloc_pd()?;
    /// let mw = pd.alloc_mw(ibverbs::MwType::Type2)?;
    /// # Ok(()) }
    /// ```
    #[doc(alias = "ibv_alloc_mw")]
    pub fn alloc_mw(&self, kind: MwType) -> Result<MemoryWindow> {
        // SAFETY: live PD; the window is deallocated in MwInner's Drop.
        let mw = unsafe { sys::ibv_alloc_mw(self.as_ptr(), kind.raw()) };
        let mw = ret_ptr("ibv_alloc_mw", mw).map_err(|e| {
            if e.raw_os_error() == Some(libc::EOPNOTSUPP) {
                Error::Unsupported(format!(
                    "memory windows of {kind:?} (ibv_alloc_mw: EOPNOTSUPP; see the device's \
                     IBV_DEVICE_MEM_WINDOW* capability flags)"
                ))
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
                state: Mutex::new(MwState { rkey, bound: None }),
            }),
        })
    }
}

impl MemoryWindow {
    /// The window's type.
    pub fn kind(&self) -> MwType {
        self.inner.kind
    }
    /// The current remote key (the one of the latest bind posted).
    pub fn rkey(&self) -> RemoteKey {
        RemoteKey(self.inner.lock().rkey)
    }
    /// What the latest bind granted, `None` when unbound or invalidated
    /// locally.
    pub fn remote(&self) -> Option<RemoteMemory> {
        self.inner.lock().bound.as_ref().map(|b| b.1)
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
    fn region(&self) -> (&Region, bool) {
        match self {
            BindTarget::Shared(b) => (b.region(), true),
            BindTarget::Local(b) => (b.region(), false),
            BindTarget::Frozen(b) => (b.region(), false),
        }
    }
}

fn mw_access(access: AccessFlags) -> Result<u32> {
    let allowed = AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_ATOMIC
        | AccessFlags::ZERO_BASED;
    if !allowed.contains(access) {
        return Err(Error::InvalidArgument(format!(
            "a memory window grants only REMOTE_READ, REMOTE_WRITE, REMOTE_ATOMIC and \
             ZERO_BASED, not {:?}",
            access - allowed
        )));
    }
    Ok(access.bits())
}

impl QueuePair {
    fn check_bind(
        &self,
        mw: &MemoryWindow,
        region: &Region,
        peer_writes: bool,
        access: AccessFlags,
    ) -> Result<()> {
        if !matches!(self.qp_type(), QpType::Rc | QpType::Uc) {
            return Err(Error::InvalidArgument(format!(
                "memory windows are bound on RC or UC queue pairs, not {:?}",
                self.qp_type()
            )));
        }
        if !Arc::ptr_eq(&mw.inner.pd.inner, &self.inner.pd.inner)
            || !Arc::ptr_eq(&region.mr.pd.inner, &self.inner.pd.inner)
        {
            return Err(Error::InvalidArgument(
                "the window, the region and the queue pair must share one protection domain".into(),
            ));
        }
        if !region.mr.access.contains(AccessFlags::MW_BIND) {
            return Err(Error::InvalidArgument(
                "the region was registered without AccessFlags::MW_BIND".into(),
            ));
        }
        if access.remote_writable() {
            if !peer_writes {
                return Err(Error::InvalidArgument(
                    "a window granting REMOTE_WRITE or REMOTE_ATOMIC must cover a SharedBuffer: \
                     a peer could change the memory behind a Rust reference"
                        .into(),
                ));
            }
            if !region.mr.access.contains(AccessFlags::LOCAL_WRITE) {
                return Err(Error::InvalidArgument(
                    "remote write or atomic rights through a window need a region with \
                     LOCAL_WRITE (ibv_bind_mw(3))"
                        .into(),
                ));
            }
        }
        Ok(())
    }

    /// Binds `mw` over `target`'s memory, granting `access`
    /// (`REMOTE_READ`, `REMOTE_WRITE`, `REMOTE_ATOMIC`, `ZERO_BASED`), and
    /// returns what to give the peer. Type 1 windows go through
    /// `ibv_bind_mw`, type 2 through an `IBV_WR_BIND_MW` work request; both
    /// complete on this QP's send CQ with `wr_id` (signaled), and the key is
    /// valid once that completion succeeded (or, per IBA ordering, for
    /// sends posted after it on this QP).
    ///
    /// The window holds `target`'s region until it is re-bound, invalidated
    /// with [`QueuePair::invalidate_mw`], or dropped. A completion with an
    /// error (for example `MW_BIND_ERR` when a type 2 window is bound again
    /// before it was invalidated) leaves the device's binding unchanged;
    /// [`MemoryWindow::rkey`] then names the key that failed.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] (QP type, protection domains, missing
    /// `MW_BIND`, write rights over non-shared memory, rights other than the
    /// four above), [`Error::QueueFull`], or
    /// [`Error::Verb`] naming `ibv_bind_mw` / `ibv_post_send` (sends need a
    /// QP in RTS).
    ///
    /// # References
    /// `ibv_bind_mw(3)`, `ibv_post_send(3)`
    ///
    /// # Example
    /// ```no_run
    /// # fn demo(pd: &ibverbs::ProtectionDomain, qp: &ibverbs::QueuePair) -> ibverbs::Result<()> {
    /// use ibverbs::{AccessFlags, MwType};
    /// let mem = pd.alloc_shared(4096, AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND)?;
    /// let mw = pd.alloc_mw(MwType::Type2)?;
    /// let grant = qp.bind_mw(&mw, &mem, AccessFlags::REMOTE_WRITE, 1)?;
    /// // … after the bind's completion, send `grant` to the peer; later:
    /// qp.invalidate_mw(&mw, 2)?; // the peer's writes now fail
    /// # Ok(()) }
    /// ```
    #[doc(alias = "ibv_bind_mw")]
    #[doc(alias = "IBV_WR_BIND_MW")]
    pub fn bind_mw<'a>(
        &self,
        mw: &MemoryWindow,
        target: impl Into<BindTarget<'a>>,
        access: AccessFlags,
        wr_id: u64,
    ) -> Result<RemoteMemory> {
        let target = target.into();
        let (region, peer_writes) = target.region();
        let flags = mw_access(access)?;
        self.check_bind(mw, region, peer_writes, access)?;
        let len = region.len() as u64;
        let info = sys::ibv_mw_bind_info {
            mr: region.mr.mr.as_ptr(),
            addr: region.addr(),
            length: len,
            mw_access_flags: flags,
        };
        let remote = |rkey| RemoteMemory {
            addr: if access.contains(AccessFlags::ZERO_BASED) {
                0
            } else {
                region.addr()
            },
            len,
            rkey: RemoteKey(rkey),
        };
        self.post_window(mw, wr_id, |wr_id, mws, _| {
            let rkey = match mw.inner.kind {
                MwType::Type1 => self.bind_type1(mw, wr_id, info)?,
                MwType::Type2 => {
                    // SAFETY: pure function of its argument.
                    let rkey = unsafe { sys::ibv_inc_rkey(mws.rkey) };
                    let mut wr = sys::ibv_send_wr {
                        wr_id,
                        opcode: sys::IBV_WR_BIND_MW,
                        send_flags: sys::ibv_send_flags::IBV_SEND_SIGNALED.0,
                        ..Default::default()
                    };
                    wr.__bindgen_anon_2.bind_mw = sys::ibv_send_wr__bindgen_ty_4__bindgen_ty_1 {
                        mw: mw.as_ptr(),
                        rkey,
                        bind_info: info,
                    };
                    self.post_one(&mut wr)?;
                    // Providers name the window by `ibv_mw::rkey` in the next
                    // bind or invalidate (rxe's kernel refuses a stale key),
                    // and nothing else updates it for work-request binds.
                    // SAFETY: live window, touched only under its lock (held).
                    unsafe { (*mw.as_ptr()).rkey = rkey };
                    rkey
                }
            };
            mws.rkey = rkey;
            mws.bound = Some((region.mr.clone(), remote(rkey)));
            Ok(remote(rkey))
        })
    }

    /// Invalidates `mw` locally: once the completion (`wr_id`, signaled)
    /// arrived, the peer's accesses with its key fail with a remote access
    /// error. A type 2 window is invalidated with `IBV_WR_LOCAL_INV`; a type
    /// 1 window (which IBA does not let `LOCAL_INV` touch) is unbound by a
    /// zero-length bind. The window's region is released when the request
    /// completed.
    ///
    /// # Errors
    /// As [`QueuePair::bind_mw`]; [`Error::InvalidArgument`] for a type 1
    /// window that is not bound.
    ///
    /// # References
    /// `ibv_post_send(3)`, `ibv_bind_mw(3)`
    #[doc(alias = "IBV_WR_LOCAL_INV")]
    pub fn invalidate_mw(&self, mw: &MemoryWindow, wr_id: u64) -> Result<()> {
        if !Arc::ptr_eq(&mw.inner.pd.inner, &self.inner.pd.inner) {
            return Err(Error::InvalidArgument(
                "the window belongs to another protection domain".into(),
            ));
        }
        self.post_window(mw, wr_id, |wr_id, mws, old| match mw.inner.kind {
            // IBA does not let LOCAL_INV touch a type 1 window: a
            // zero-length bind unbinds it. Providers read the lkey of the
            // bind's region even then, so it names the current binding's.
            MwType::Type1 => {
                let old = old.ok_or_else(|| {
                    Error::InvalidArgument(
                        "this type 1 window is not bound: there is nothing to invalidate".into(),
                    )
                })?;
                let info = sys::ibv_mw_bind_info {
                    mr: old.mr.as_ptr(),
                    addr: old.ptr.as_ptr() as u64,
                    length: 0,
                    mw_access_flags: 0,
                };
                mws.rkey = self.bind_type1(mw, wr_id, info)?;
                Ok(())
            }
            MwType::Type2 => {
                let mut wr = sys::ibv_send_wr {
                    wr_id,
                    opcode: sys::IBV_WR_LOCAL_INV,
                    send_flags: sys::ibv_send_flags::IBV_SEND_SIGNALED.0,
                    ..Default::default()
                };
                wr.__bindgen_anon_1.invalidate_rkey = mws.rkey;
                self.post_one(&mut wr)
            }
        })
    }

    /// Posts one memory-window request: with the send table locked and the
    /// QP ready, reserves a slot that keeps the window and the region of its
    /// current binding alive until the request completed (the device may
    /// use the old binding until then), and calls `post` with the encoded
    /// `wr_id`, the window's state (binding taken out) and the old region.
    /// If `post` fails, the slot is released and the binding restored.
    fn post_window<T>(
        &self,
        mw: &MemoryWindow,
        wr_id: u64,
        post: impl FnOnce(u64, &mut MwState, Option<&MrInner>) -> Result<T>,
    ) -> Result<T> {
        let table = &self.inner.send;
        let mut st = table.lock();
        self.check_sendable("ibv_post_send")?;
        table.check_room(&st, 1)?;
        let mut mws = mw.inner.lock();
        let old = mws.bound.take();
        let old_mr = old.as_ref().map(|b| b.0.clone());
        let keep = Some(Keep::Window(mw.clone(), old));
        let tag = st.reserve(
            table,
            wr_id,
            Payload {
                keep,
                ..Payload::default()
            },
        );
        let result = post(table.encode(tag), &mut mws, old_mr.as_deref());
        if result.is_err() {
            if let Some(Payload {
                keep: Some(Keep::Window(_, old)),
                ..
            }) = st.unreserve(table, tag)
            {
                mws.bound = old;
            }
        }
        result
    }

    /// `ibv_bind_mw` (type 1); returns the window's new key.
    fn bind_type1(
        &self,
        mw: &MemoryWindow,
        wr_id: u64,
        info: sys::ibv_mw_bind_info,
    ) -> Result<u32> {
        let mut bind = sys::ibv_mw_bind {
            wr_id,
            send_flags: sys::ibv_send_flags::IBV_SEND_SIGNALED.0,
            bind_info: info,
        };
        // SAFETY: live QP and window; the region is registered and held by
        // the slot or the window. The provider updates the window's key.
        let rc = unsafe { sys::ibv_bind_mw(self.as_ptr(), mw.as_ptr(), &mut bind) };
        crate::error::ret_errno("ibv_bind_mw", rc)?;
        // SAFETY: live window; read after the provider's update.
        Ok(unsafe { (*mw.as_ptr()).rkey })
    }

    /// Posts one request that carries no buffer.
    fn post_one(&self, wr: &mut sys::ibv_send_wr) -> Result<()> {
        let mut bad = std::ptr::null_mut();
        // SAFETY: live QP; one NULL-terminated request without SGEs whose
        // window and region are held by its slot.
        let rc = unsafe { sys::ibv_post_send(self.as_ptr(), wr, &mut bad) };
        crate::error::ret_errno("ibv_post_send", rc)
    }

    /// Refuses data-path requests on a QP that is not ready to send (see
    /// [`QueuePair::post_send`]). Call with the send table locked.
    #[inline]
    pub(crate) fn check_sendable(&self, verb: &'static str) -> Result<()> {
        // SAFETY: live QP; libibverbs records the state of every successful
        // modify, and this crate's modifies hold the send lock the caller holds.
        let state = unsafe { (*self.as_ptr()).state };
        if !crate::queue_pair::state_sends(state) {
            return Err(not_sendable(verb, QpState::from_raw(state)));
        }
        Ok(())
    }
}

/// The error of a send posted before RTS (out of line: the data path only
/// compares the state).
#[cold]
fn not_sendable(verb: &'static str, state: QpState) -> crate::Error {
    crate::Error::from_errno(verb, libc::EINVAL).with_hint(Some(format!(
        "the queue pair is in {}: sends need RTS (connect it first)",
        match state {
            QpState::Reset => "RESET",
            QpState::Init => "INIT",
            _ => "RTR",
        }
    )))
}
