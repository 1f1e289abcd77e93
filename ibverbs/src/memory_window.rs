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
        let table = &self.inner.send;
        let mut st = table.lock();
        self.check_sendable("ibv_post_send")?;
        table.check_room(&st, 1)?;
        let mut mws = mw.inner.lock();
        let info = sys::ibv_mw_bind_info {
            mr: region.mr.mr.as_ptr(),
            addr: region.addr(),
            length: len,
            mw_access_flags: flags,
        };
        // The previous binding's region stays registered until this request
        // completed (the device may still use the old binding until then).
        let old = mws.bound.take();
        let tag = st.reserve(
            table,
            wr_id,
            Payload {
                keep: Some(Keep::Window(mw.clone(), old)),
                ..Payload::default()
            },
        );
        let signaled = sys::ibv_send_flags::IBV_SEND_SIGNALED.0;
        let (rc, verb, new_rkey) = match mw.inner.kind {
            MwType::Type1 => {
                let mut bind = sys::ibv_mw_bind {
                    wr_id: table.encode(tag),
                    send_flags: signaled,
                    bind_info: info,
                };
                // SAFETY: live QP and window; the region is registered and
                // stays so (the window holds it below). The provider writes
                // the new key into the window on success.
                let rc = unsafe { sys::ibv_bind_mw(self.as_ptr(), mw.as_ptr(), &mut bind) };
                // SAFETY: live window; read after the provider's update.
                (rc, "ibv_bind_mw", unsafe { (*mw.as_ptr()).rkey })
            }
            MwType::Type2 => {
                // SAFETY: pure function of its argument.
                let rkey = unsafe { sys::ibv_inc_rkey(mws.rkey) };
                let mut wr = sys::ibv_send_wr {
                    wr_id: table.encode(tag),
                    opcode: sys::IBV_WR_BIND_MW,
                    send_flags: signaled,
                    ..Default::default()
                };
                wr.__bindgen_anon_2.bind_mw = sys::ibv_send_wr__bindgen_ty_4__bindgen_ty_1 {
                    mw: mw.as_ptr(),
                    rkey,
                    bind_info: info,
                };
                let mut bad = std::ptr::null_mut();
                // SAFETY: live QP; one NULL-terminated request without SGEs;
                // the window and region outlive it (held by the slot and by
                // the window).
                let rc = unsafe { sys::ibv_post_send(self.as_ptr(), &mut wr, &mut bad) };
                (rc, "ibv_post_send", rkey)
            }
        };
        if rc != 0 {
            if let Some(Payload {
                keep: Some(Keep::Window(_, old)),
                ..
            }) = st.unreserve(table, tag)
            {
                mws.bound = old;
            }
            return Err(Error::from_errno(verb, rc));
        }
        let remote = RemoteMemory {
            addr: if access.contains(AccessFlags::ZERO_BASED) {
                0
            } else {
                region.addr()
            },
            len,
            rkey: RemoteKey(new_rkey),
        };
        if mw.inner.kind == MwType::Type2 {
            // Providers name the window by `ibv_mw::rkey` in the next bind
            // or invalidate (rxe's kernel refuses a stale key), and nothing
            // else updates it for work-request binds.
            // SAFETY: live window; its fields are only touched under the
            // window's lock (held) or by this QP's post, which completed.
            unsafe { (*mw.as_ptr()).rkey = new_rkey };
        }
        mws.rkey = new_rkey;
        mws.bound = Some((region.mr.clone(), remote));
        Ok(remote)
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
        if mw.inner.kind == MwType::Type1 {
            return self.unbind_type1(mw, wr_id);
        }
        let table = &self.inner.send;
        let mut st = table.lock();
        self.check_sendable("ibv_post_send")?;
        table.check_room(&st, 1)?;
        let mut mws = mw.inner.lock();
        let old = mws.bound.take();
        let tag = st.reserve(
            table,
            wr_id,
            Payload {
                keep: Some(Keep::Window(mw.clone(), old)),
                ..Payload::default()
            },
        );
        let mut wr = sys::ibv_send_wr {
            wr_id: table.encode(tag),
            opcode: sys::IBV_WR_LOCAL_INV,
            send_flags: sys::ibv_send_flags::IBV_SEND_SIGNALED.0,
            ..Default::default()
        };
        wr.__bindgen_anon_1.invalidate_rkey = mws.rkey;
        let mut bad = std::ptr::null_mut();
        // SAFETY: live QP; one NULL-terminated request without SGEs.
        let rc = unsafe { sys::ibv_post_send(self.as_ptr(), &mut wr, &mut bad) };
        if rc != 0 {
            if let Some(Payload {
                keep: Some(Keep::Window(_, old)),
                ..
            }) = st.unreserve(table, tag)
            {
                mws.bound = old;
            }
            return Err(Error::from_errno("ibv_post_send", rc));
        }
        Ok(())
    }

    fn unbind_type1(&self, mw: &MemoryWindow, wr_id: u64) -> Result<()> {
        let table = &self.inner.send;
        let mut st = table.lock();
        self.check_sendable("ibv_bind_mw")?;
        table.check_room(&st, 1)?;
        let mut mws = mw.inner.lock();
        // Providers read the lkey of the bind's region even for a
        // zero-length bind, so it names the region of the current binding.
        let Some(old) = mws.bound.take() else {
            return Err(Error::InvalidArgument(
                "this type 1 window is not bound: there is nothing to invalidate".into(),
            ));
        };
        let mut bind = sys::ibv_mw_bind {
            wr_id: 0,
            send_flags: sys::ibv_send_flags::IBV_SEND_SIGNALED.0,
            bind_info: sys::ibv_mw_bind_info {
                mr: old.0.mr.as_ptr(),
                addr: old.0.ptr.as_ptr() as u64,
                length: 0,
                mw_access_flags: 0,
            },
        };
        let tag = st.reserve(
            table,
            wr_id,
            Payload {
                keep: Some(Keep::Window(mw.clone(), Some(old))),
                ..Payload::default()
            },
        );
        bind.wr_id = table.encode(tag);
        // SAFETY: live QP, window and region (held by the slot until the
        // request completed).
        let rc = unsafe { sys::ibv_bind_mw(self.as_ptr(), mw.as_ptr(), &mut bind) };
        if rc != 0 {
            if let Some(Payload {
                keep: Some(Keep::Window(_, old)),
                ..
            }) = st.unreserve(table, tag)
            {
                mws.bound = old;
            }
            return Err(Error::from_errno("ibv_bind_mw", rc));
        }
        // SAFETY: live window; the provider updated its key.
        mws.rkey = unsafe { (*mw.as_ptr()).rkey };
        Ok(())
    }

    /// Refuses data-path requests on a QP that is not ready to send (see
    /// [`QueuePair::post_send`]). Call with the send table locked.
    pub(crate) fn check_sendable(&self, verb: &'static str) -> Result<()> {
        // SAFETY: live QP; libibverbs records the state of every successful
        // modify, and this crate's modifies hold the send lock the caller holds.
        let state = QpState::from_raw(unsafe { (*self.as_ptr()).state });
        let name = match state {
            QpState::Reset => "RESET",
            QpState::Init => "INIT",
            QpState::Rtr => "RTR",
            _ => return Ok(()),
        };
        Err(
            Error::from_errno(verb, libc::EINVAL).with_hint(Some(format!(
                "the queue pair is in {name}: sends need RTS (connect it first)"
            ))),
        )
    }
}
