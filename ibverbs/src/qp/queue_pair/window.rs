//! Posting memory-window requests: binds and invalidations through the
//! send queue, each held by its slot as a window operation
//! ([`WindowOp`](crate::memory::memory_window::WindowOp)) until its completion
//! (DESIGN.md, "Memory windows").

use std::sync::Arc;

use rdma_verbs_sys as sys;

use super::post_ex::WindowWr;
use super::{QueuePair, SendQueue};
use crate::error::{Error, Result};
use crate::inflight::{Held, Payload};
use crate::memory::buffer::{Region, RemoteKey, RemoteMemory};
use crate::memory::memory_region::MrInner;
use crate::memory::memory_window::{
    mw_access, BindTarget, Bound, MemoryWindow, MwState, MwType, WindowOp,
};
use crate::types::{AccessFlags, QpType};

impl QueuePair {
    fn check_bind(
        &self,
        mw: &MemoryWindow,
        region: &Region,
        peer_writes: bool,
        access: AccessFlags,
    ) -> Result<()> {
        if !matches!(self.qp_type(), QpType::Rc | QpType::Uc) {
            return Err(Error::WrongQpType {
                what: "binding a memory window",
                qp_type: self.qp_type(),
            });
        }
        if !Arc::ptr_eq(&mw.inner.pd.inner, &self.inner.pd.inner) {
            return Err(Error::ForeignProtectionDomain {
                what: "memory window",
            });
        }
        if !Arc::ptr_eq(&region.mr.pd.inner, &self.inner.pd.inner) {
            return Err(Error::ForeignProtectionDomain {
                what: "memory region",
            });
        }
        if !region.mr.access.contains(AccessFlags::MW_BIND) {
            return Err(Error::MissingAccess {
                what: "a region a memory window binds",
                needed: AccessFlags::MW_BIND,
            });
        }
        if access.remote_writable() {
            if !peer_writes {
                return Err(Error::NeedsSharedBuffer {
                    what: "a memory window granting REMOTE_WRITE or REMOTE_ATOMIC",
                });
            }
            if !region.mr.access.contains(AccessFlags::LOCAL_WRITE) {
                return Err(Error::MissingAccess {
                    what: "a region behind remote write or atomic rights of a window \
                           (ibv_bind_mw(3))",
                    needed: AccessFlags::LOCAL_WRITE,
                });
            }
        }
        Ok(())
    }
}

impl SendQueue {
    /// Binds `mw` over `target`'s memory, granting `access`
    /// (`REMOTE_READ`, `REMOTE_WRITE`, `REMOTE_ATOMIC`, `ZERO_BASED`), and
    /// returns what to give the peer. Type 1 windows go through
    /// `ibv_bind_mw`, type 2 through an `IBV_WR_BIND_MW` work request
    /// (`ibv_wr_bind_mw` on a queue pair created with
    /// [`SendOpFlags::BIND_MW`](crate::qp::SendOpFlags::BIND_MW)); both
    /// complete on this QP's send CQ with `wr_id` (signaled), and the key is
    /// valid once that completion succeeded (or, per IBA ordering, for
    /// sends posted after it on this QP).
    ///
    /// The window changes only when the completion is polled through a safe
    /// poll: on success, [`MemoryWindow::rkey`] and [`MemoryWindow::remote`]
    /// become the new binding's and the regions of earlier bindings are
    /// released. A completion with an error (for example `MW_BIND_ERR` when
    /// a type 2 window is bound again before it was invalidated, or
    /// `WR_FLUSH_ERR` on a failed queue pair) leaves the key and the
    /// binding as they were; as the request may have run nonetheless, the
    /// window then holds `target`'s region too, until a later bind or
    /// invalidate succeeds or the window is dropped. Memory a peer may reach
    /// through the window is never freed.
    ///
    /// # Errors
    /// - [`Error::WindowBusy`] while a bind or invalidate of `mw` (posted on
    ///   any queue pair) has not been polled yet;
    /// - [`Error::WindowIndeterminate`] when an earlier one ended without a
    ///   completion (its queue pair was reset or destroyed): the window can
    ///   only be dropped;
    /// - [`Error::WrongQpType`] on a UD queue pair;
    /// - [`Error::ForeignProtectionDomain`] when the window or the region
    ///   belongs to another protection domain than the queue pair;
    /// - [`Error::MissingAccess`] for a region without `MW_BIND` (or
    ///   without `LOCAL_WRITE` under remote write or atomic rights);
    /// - [`Error::NeedsSharedBuffer`] for write rights over non-shared
    ///   memory;
    /// - [`Error::AccessNotAllowed`] for rights other than the four above;
    /// - [`Error::QueueFull`];
    /// - [`Error::NotReadyToSend`] for a queue pair not in RTS;
    /// - [`Error::Verb`] naming `ibv_bind_mw` / `ibv_post_send` /
    ///   `ibv_wr_complete`;
    /// - [`Error::Unsupported`] when the provider left the `ibv_wr_*`
    ///   builder of a queue pair created with `BIND_MW` unset.
    ///
    /// # References
    /// `ibv_bind_mw(3)`, `ibv_post_send(3)`, `ibv_wr_post(3)`
    ///
    /// # Example
    /// ```no_run
    /// # fn demo(pd: &rdma_verbs::ProtectionDomain, qp: &rdma_verbs::QueuePair) -> rdma_verbs::Result<()> {
    /// use rdma_verbs::{AccessFlags, memory::MwType};
    /// let mem = pd.alloc_shared(4096, AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND)?;
    /// let mw = pd.alloc_mw(MwType::Type2)?;
    /// let mut sq = qp.send_queue()?;
    /// let grant = sq.bind_mw(&mw, &mem, AccessFlags::REMOTE_WRITE, 1)?;
    /// // … poll the bind's completion, send `grant` to the peer; later:
    /// sq.invalidate_mw(&mw, 2)?; // the peer's writes fail once it completed
    /// # Ok(()) }
    /// ```
    #[doc(alias = "ibv_bind_mw")]
    #[doc(alias = "IBV_WR_BIND_MW")]
    #[doc(alias = "ibv_wr_bind_mw")]
    pub fn bind_mw<'a>(
        &mut self,
        mw: &MemoryWindow,
        target: impl Into<BindTarget<'a>>,
        access: AccessFlags,
        wr_id: u64,
    ) -> Result<RemoteMemory> {
        let target = target.into();
        let (region, peer_writes) = target.region();
        let flags = mw_access(access)?;
        self.qp().check_bind(mw, region, peer_writes, access)?;
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
        self.post_window(mw, wr_id, |sq, wr_id, mws| {
            let rkey = match mw.inner.kind {
                MwType::Type1 => sq.bind_type1(mw, mws, wr_id, info)?,
                MwType::Type2 => {
                    // SAFETY: pure function of its argument.
                    let rkey = unsafe { sys::ibv_inc_rkey(mws.rkey()) };
                    let ex = WindowWr::Bind {
                        mw: mw.as_ptr(),
                        rkey,
                        info: &info,
                    };
                    if let Some(posted) = sq.qp().post_window_ex(wr_id, ex) {
                        posted?;
                        let granted = remote(rkey);
                        return Ok((granted, Some((region.mr.clone(), granted)), rkey));
                    }
                    let mut wr = sys::ibv_send_wr {
                        wr_id,
                        opcode: sys::IBV_WR_BIND_MW,
                        send_flags: sys::ibv_send_flags::IBV_SEND_SIGNALED.0,
                        ..Default::default()
                    };
                    // The provider names the window by `ibv_mw::rkey` (the
                    // committed key); `rkey` is the one it gets if this runs.
                    wr.__bindgen_anon_2.bind_mw = sys::ibv_send_wr__bindgen_ty_4__bindgen_ty_1 {
                        mw: mw.as_ptr(),
                        rkey,
                        bind_info: info,
                    };
                    sq.post_window_wr(&mut wr)?;
                    rkey
                }
            };
            let granted = remote(rkey);
            Ok((granted, Some((region.mr.clone(), granted)), rkey))
        })
    }

    /// Invalidates `mw` locally: once the completion (`wr_id`, signaled)
    /// arrived successfully, the peer's accesses with its key fail with a
    /// remote access error, and the window releases its regions. A type 2
    /// window is invalidated with `IBV_WR_LOCAL_INV` (`ibv_wr_local_inv` on
    /// a queue pair created with
    /// [`SendOpFlags::LOCAL_INV`](crate::qp::SendOpFlags::LOCAL_INV)); a type 1 window
    /// (which IBA does not let `LOCAL_INV` touch) is unbound by a
    /// zero-length bind. A completion with an error changes nothing: the
    /// window keeps its binding, its key and its regions.
    ///
    /// # Errors
    /// As [`SendQueue::bind_mw`] ([`Error::WindowBusy`],
    /// [`Error::WindowIndeterminate`], …); [`Error::WindowNotBound`] for a
    /// type 1 window that is not bound.
    ///
    /// # References
    /// `ibv_post_send(3)`, `ibv_bind_mw(3)`, `ibv_wr_post(3)`
    #[doc(alias = "IBV_WR_LOCAL_INV")]
    #[doc(alias = "ibv_wr_local_inv")]
    pub fn invalidate_mw(&mut self, mw: &MemoryWindow, wr_id: u64) -> Result<()> {
        if !Arc::ptr_eq(&mw.inner.pd.inner, &self.qp().inner.pd.inner) {
            return Err(Error::ForeignProtectionDomain {
                what: "memory window",
            });
        }
        self.post_window(mw, wr_id, |sq, wr_id, mws| match mw.inner.kind {
            // IBA does not let LOCAL_INV touch a type 1 window: a
            // zero-length bind unbinds it. Providers read the lkey of the
            // bind's region even then, so it names a region the window
            // holds (held until this request succeeded), at its device
            // address (the IOVA: a device may range-check even an empty
            // bind against it).
            MwType::Type1 => {
                let old = mws.any_region().ok_or(Error::WindowNotBound)?;
                let info = sys::ibv_mw_bind_info {
                    mr: old.mr.as_ptr(),
                    addr: old.iova,
                    length: 0,
                    mw_access_flags: 0,
                };
                let rkey = sq.bind_type1(mw, mws, wr_id, info)?;
                Ok(((), None, rkey))
            }
            MwType::Type2 => {
                let ex = WindowWr::LocalInv { rkey: mws.rkey() };
                if let Some(posted) = sq.qp().post_window_ex(wr_id, ex) {
                    posted?;
                    return Ok(((), None, mws.rkey()));
                }
                let mut wr = sys::ibv_send_wr {
                    wr_id,
                    opcode: sys::IBV_WR_LOCAL_INV,
                    send_flags: sys::ibv_send_flags::IBV_SEND_SIGNALED.0,
                    ..Default::default()
                };
                wr.__bindgen_anon_1.invalidate_rkey = mws.rkey();
                sq.post_window_wr(&mut wr)?;
                Ok(((), None, mws.rkey()))
            }
        })
    }

    /// Posts one memory-window request. With the window idle (no request
    /// of it outstanding on any QP, no unknown outcome) and its lock held,
    /// publishes a slot holding a [`WindowOp`] (which keeps the window
    /// alive and reports the request's outcome), and calls `post` with the
    /// slot's `wr_id` and the window's state. `post` gives the result, the
    /// binding the window gets if the request succeeds and the key it
    /// then has; the window records them as outstanding before its lock is
    /// released, so a completion (whose claim takes that lock to report
    /// the outcome) always finds them. If `post` fails, nothing was
    /// queued: the slot is released and the window is as it was.
    fn post_window<T>(
        &mut self,
        mw: &MemoryWindow,
        wr_id: u64,
        post: impl FnOnce(&mut Self, u64, &MwState) -> Result<(T, Option<Bound<MrInner>>, u32)>,
    ) -> Result<T> {
        let ring = self.ring();
        let slot = ring
            .reserve_head()
            .ok_or_else(|| crate::qp::queue_pair::no_room_of(ring, "send queue"))?;
        let mut mws = mw.inner.lock();
        mws.check_idle()?;
        let op = WindowOp {
            mw: Some(mw.clone()),
        };
        let payload = Payload {
            held: Held::Window(op),
            ah: None,
        };
        let ring = self.ring();
        ring.fill(&slot, wr_id, payload, true);
        ring.publish(&slot);
        let slot_wr_id = slot.wr_id;
        match post(self, slot_wr_id, &mws) {
            Ok((out, target, rkey)) => {
                mws.begin(target, rkey);
                drop(mws);
                self.ring().advance_one();
                Ok(out)
            }
            Err(e) => {
                if let Held::Window(op) = self.ring().unpublish(slot).held {
                    op.cancel();
                }
                Err(e)
            }
        }
    }

    /// `ibv_bind_mw` (type 1); returns the key the window gets if the bind
    /// succeeds. The provider names the window by `ibv_mw::rkey` and sets it
    /// to the new key once posted; it is set back to the committed key at
    /// once (the window's lock, held by the caller while `mws` lives, guards
    /// it) and advanced only by a successful completion.
    fn bind_type1(
        &mut self,
        mw: &MemoryWindow,
        mws: &MwState,
        wr_id: u64,
        info: sys::ibv_mw_bind_info,
    ) -> Result<u32> {
        let mut bind = sys::ibv_mw_bind {
            wr_id,
            send_flags: sys::ibv_send_flags::IBV_SEND_SIGNALED.0,
            bind_info: info,
        };
        // SAFETY: live QP and window; the region is registered and held by
        // the window (committed, doubtful, or the caller's target it records).
        let rc = unsafe { sys::ibv_bind_mw(self.qp().as_ptr(), mw.as_ptr(), &mut bind) };
        let raw = mw.as_ptr();
        // SAFETY: live window; read after the provider's update, reset
        // under the window's lock.
        let new = unsafe { std::mem::replace(&mut (*raw).rkey, mws.rkey()) };
        crate::error::ret_errno("ibv_bind_mw", rc)?;
        Ok(new)
    }

    /// Posts one request that carries no buffer (its window and region
    /// held by its slot).
    fn post_window_wr(&mut self, wr: &mut sys::ibv_send_wr) -> Result<()> {
        let rc = self.post_raw_one(wr);
        crate::error::ret_errno("ibv_post_send", rc)
    }
}
