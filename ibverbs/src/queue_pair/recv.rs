//! Posting receive requests (QP receive queues; SRQs share the core).

use ibverbs_sys as sys;

use super::post::{check_bufs, fill_sges, RecvScratch};
use super::request::RecvRequest;
use super::work::{RecvWork, Token};
use crate::error::{Error, Result};
use crate::wq_table::{Payload, SgList, WqTable};
use crate::{QpState, QueuePair};

impl QueuePair {
    /// Posts receive work: one [`RecvRequest`], or a chain of them in a
    /// `&mut Vec` ([`RecvWork`]). The buffers come back in the completions.
    ///
    /// A queue pair moved to ERR (by [`modify`](Self::modify) and its
    /// helpers) refuses receives until it is reset: the move flushes the
    /// receives outstanding then, and a receive posted later would never
    /// be flushed (rxe, for one, holds it without a system call).
    ///
    /// # Errors
    /// A refused [`RecvRequest`] comes back whole in a
    /// [`PostError`](crate::PostError); a chain keeps the requests not
    /// posted in its `Vec`. Checked first: [`Error::ReceivesThroughSrq`],
    /// [`Error::TooManySges`], [`Error::ForeignProtectionDomain`],
    /// [`Error::FrozenBuffer`], [`Error::MissingAccess`] (a buffer without
    /// `LOCAL_WRITE`), [`Error::OutOfRange`] (a buffer longer than an SGE
    /// describes);
    /// [`Error::QueuePairInError`], [`Error::QueueFull`] (or
    /// [`Error::QueueHeldAfterReset`] after a reset), or
    /// [`Error::Verb`] naming `ibv_post_recv`.
    ///
    /// # References
    /// `ibv_post_recv(3)`
    #[doc(alias = "ibv_post_recv")]
    #[inline]
    pub fn post_recv<W: RecvWork>(&self, work: W) -> Result<(), W::Error> {
        work.post_to_qp(self, Token(()))
    }

    pub(super) fn post_recv_slice(&self, wrs: &mut [RecvRequest]) -> (usize, Result<()>) {
        let Some(table) = &self.inner.recv else {
            return (0, Err(Error::ReceivesThroughSrq));
        };
        for r in wrs.iter() {
            if let Err(e) = check_bufs(
                &r.sg,
                &self.inner.pd,
                true,
                self.inner.caps.max_recv_sge,
                "receive",
            ) {
                return (0, Err(e));
            }
        }
        // Under the receive lock, which a move to ERR holds across the
        // modify (see modify_unchecked): the check cannot race it.
        let refuse = || {
            if self.recv_refused() {
                Err(Error::QueuePairInError {
                    verb: "ibv_post_recv",
                })
            } else {
                Ok(())
            }
        };
        let (posted, result) = post_recv_common(table, wrs, refuse, |wr, bad| {
            // SAFETY: live QP; see post_recv_common.
            unsafe { self.provider_post_recv(wr, bad) }
        });
        // Providers that check the state refuse receives in RESET (IBA
        // C10-97.2.1) with a bare EINVAL: say so.
        let result = result.map_err(|e| {
            let reset = e.raw_os_error() == Some(libc::EINVAL)
                && matches!(self.state(), Ok(QpState::Reset));
            e.with_hint(
                reset
                    .then(|| "the queue pair is in RESET: receives need INIT or later".to_string()),
            )
        });
        (posted, result)
    }
}

/// Shared by QP receive queues and SRQs. `check` runs under the table's
/// lock, before anything is posted (a refusal posts nothing).
pub(crate) fn post_recv_common(
    table: &WqTable<RecvScratch>,
    wrs: &mut [RecvRequest],
    check: impl FnOnce() -> Result<()>,
    post: impl FnOnce(*mut sys::ibv_recv_wr, *mut *mut sys::ibv_recv_wr) -> i32,
) -> (usize, Result<()>) {
    match wrs {
        [] => return (0, Ok(())),
        [r] if !matches!(r.sg, SgList::Many(_)) => return post_recv_single(table, r, check, post),
        _ => {}
    }
    let mut st = table.lock();
    if let Err(e) = check().and_then(|()| table.check_room(&st, wrs.len())) {
        return (0, Err(e));
    }
    let n = wrs.len();
    for (i, r) in wrs.iter().enumerate() {
        let tag = st.reserve(table, r.wr_id, Payload::default());
        if r.dispatched {
            st.dispatch(table, tag);
        }
        st.scratch.bufs().tags[i] = tag;
    }
    let scratch = st.scratch.bufs();
    let max_sge = scratch.max_sge;
    let base = scratch.wrs.as_mut_ptr();
    for (i, r) in wrs.iter().enumerate() {
        let sges = &mut scratch.sges[i * max_sge..(i + 1) * max_sge];
        let num_sge = fill_sges(&r.sg, sges);
        scratch.wrs[i] = sys::ibv_recv_wr {
            wr_id: table.encode(scratch.tags[i]),
            next: if i + 1 < n {
                // SAFETY: within the scratch array (depth checked).
                unsafe { base.add(i + 1) }
            } else {
                std::ptr::null_mut()
            },
            sg_list: sges.as_mut_ptr(),
            num_sge: num_sge as i32,
        };
    }
    let mut bad: *mut sys::ibv_recv_wr = std::ptr::null_mut();
    // The chain and its SGEs live in the locked scratch; the buffers are
    // owned by `wrs` until moved into their slots below, under the lock.
    let rc = post(base, &mut bad);
    let posted = super::post::posted_count(rc, base, bad, n);
    for (i, r) in wrs.iter_mut().enumerate().take(posted) {
        let tag = st.scratch.bufs().tags[i];
        st.store(table, tag, Payload::bufs(std::mem::take(&mut r.sg), None));
    }
    for i in (posted..n).rev() {
        let tag = st.scratch.bufs().tags[i];
        st.unreserve(table, tag);
    }
    (posted, crate::error::ret_errno("ibv_post_recv", rc))
}

/// One request with at most one buffer: its C request and SGE are built on
/// the stack, and the buffer moves into its slot once the provider took
/// the request (it stays in `r` if refused).
fn post_recv_single(
    table: &WqTable<RecvScratch>,
    r: &mut RecvRequest,
    check: impl FnOnce() -> Result<()>,
    post: impl FnOnce(*mut sys::ibv_recv_wr, *mut *mut sys::ibv_recv_wr) -> i32,
) -> (usize, Result<()>) {
    let mut st = table.lock();
    if let Err(e) = check().and_then(|()| table.check_room(&st, 1)) {
        return (0, Err(e));
    }
    let (mut sge, num_sge) = match &r.sg {
        // An empty buffer goes as no SGE (see fill_sges).
        SgList::One(b) => (b.region().sge_prechecked(), i32::from(!b.is_empty())),
        _ => (sys::ibv_sge::default(), 0),
    };
    // Doorbell first, bookkeeping after (as post_send's single request):
    // the lock is held until the buffer is in its slot, so no completion
    // can be claimed before; a refused request leaves nothing to undo.
    let mut wr = sys::ibv_recv_wr {
        wr_id: table.encode(st.next_tag(table)),
        next: std::ptr::null_mut(),
        sg_list: &mut sge,
        num_sge,
    };
    let mut bad: *mut sys::ibv_recv_wr = std::ptr::null_mut();
    // One request whose SGE points into the buffer `r` still owns (its
    // memory does not move when it moves into the slot below).
    let rc = post(&mut wr, &mut bad);
    if rc != 0 {
        return (0, crate::error::ret_errno("ibv_post_recv", rc));
    }
    let payload = Payload::bufs(std::mem::take(&mut r.sg), None);
    // Under the same lock: the tag `next_tag` gave.
    let tag = st.reserve(table, r.wr_id, payload);
    if r.dispatched {
        st.dispatch(table, tag);
    }
    (1, Ok(()))
}
