//! [`PreparedRecv`]: a receive request checked and built once, posted many
//! times — the receive side of [`PreparedSend`](super::PreparedSend), with
//! the same `wr_id` scheme (see `prepared_send.rs`): each posting leaks one
//! strong count of the request's buffers into its `wr_id`, the completion's
//! claim takes it back with one atomic decrement, without a lock or a
//! table slot.

use ibverbs_sys as sys;

use super::post::{check_bufs, fill_sges};
use super::prepared_send::Postings;
use super::request::{PostError, RecvRequest};
use crate::error::{Error, Result};
use crate::wq_table::SgList;
use crate::{QueuePair, SharedReceiveQueue};

/// The refusal of a receive on a queue pair in ERR.
#[cold]
fn refused_in_err() -> Error {
    Error::QueuePairInError {
        verb: "ibv_post_recv",
    }
}

/// Where a prepared receive is posted.
#[derive(Debug)]
enum Target {
    Qp(QueuePair),
    Srq(SharedReceiveQueue),
}

impl Target {
    #[cold]
    fn verb(&self) -> &'static str {
        match self {
            Target::Qp(_) => "ibv_post_recv",
            Target::Srq(_) => "ibv_post_srq_recv",
        }
    }
}

/// A receive request checked and built once, then posted any number of
/// times with [`post`](Self::post): the receive side of
/// [`PreparedSend`](crate::PreparedSend), for loops that re-post the same
/// receive buffers (ping-pongs, RPC servers, MPI's persistent receives).
///
/// The request owns its buffers for its whole life. Each posting keeps them
/// alive until its completion is polled; the bytes are reachable from Rust
/// ([`bytes`](Self::bytes), [`bytes_mut`](Self::bytes_mut),
/// [`into_buffers`](Self::into_buffers)) only while no posting is
/// outstanding, so a peer's message can never land under a Rust
/// reference. A request may be posted again before its previous posting
/// completed (two messages then land in the same memory; Rust sees it only
/// after both completed).
///
/// The completion of a posting carries the request's `wr_id` and no
/// buffers ([`Completion::take_buffers`](crate::Completion::take_buffers)
/// gives [`SgList::Empty`]); keep one request per buffer and tell them
/// apart by `wr_id`. Any of the safe polls claims it. A completion consumed
/// by [`poll_raw`](crate::CompletionQueue::poll_raw), or never polled
/// because the queue was destroyed or reset with postings outstanding,
/// keeps the buffers allocated for good (a leak, never a use after free).
///
/// Posting costs a reference count and the provider's `post_recv` (no
/// lock of ours: `ibv_post_recv` is thread-safe), plus, on a queue pair,
/// two atomic read-modify-writes that let a move to RESET wait out a
/// posting inside the provider, and the ERR checks; claiming a completion
/// costs one reference count. Postings do not take slots of the queue's
/// in-flight table: when the receive queue is full the provider refuses the
/// posting (`ENOMEM`).
///
/// # Example
/// ```no_run
/// # use ibverbs::*;
/// # fn demo(qp: &QueuePair, cq: &CompletionQueue, bufs: Vec<LocalBuffer>) -> Result<()> {
/// let mut recvs = Vec::new();
/// for (i, b) in bufs.into_iter().enumerate() {
///     recvs.push(qp.prepare_recv(RecvRequest::new(b).wr_id(i as u64))?);
/// }
/// for r in &mut recvs {
///     r.post()?;
/// }
/// loop {
///     if let Some(c) = cq.poll_one()? {
///         c.result()?;
///         let r = &mut recvs[c.wr_id() as usize];
///         let message = r.bytes(0).expect("its only posting completed");
///         // … use the message, then give the buffer back to the device:
///         # let _ = message;
///         r.post()?;
///     }
/// }
/// # }
/// ```
///
/// A prepared receive's buffers cannot be read while the device may be
/// writing them (a UI test, its compiler output checked by
/// `ibverbs/tests/hazards.rs`):
/// ```ignore
#[doc = include_str!("../../tests/ui/prepared_recv_bytes_across_post.rs")]
/// ```
///
/// # References
/// `ibv_post_recv(3)`, `ibv_post_srq_recv(3)`
#[derive(Debug)]
#[doc(alias = "ibv_post_recv")]
#[doc(alias = "ibv_post_srq_recv")]
pub struct PreparedRecv {
    target: Target,
    /// The C request; `wr_id` is the postings' (`Postings::posting_wr_id`),
    /// `sg_list` points into `sges`, `next` is NULL.
    wr: sys::ibv_recv_wr,
    /// The SGEs. Held, never read: `wr` points into it.
    #[allow(dead_code)]
    sges: Vec<sys::ibv_sge>,
    postings: Postings,
}

// SAFETY: the raw pointer in `wr` points into `sges` (owned heap memory
// that does not move with the struct); it is only used by `post`, which
// takes `&mut self`.
unsafe impl Send for PreparedRecv {}

impl QueuePair {
    /// Checks `wr` and builds its C request once, for posting any number of
    /// times with [`PreparedRecv::post`].
    ///
    /// # Errors
    /// As [`post_recv`](Self::post_recv)'s checks (the request comes back
    /// in the [`PostError`]): [`Error::ReceivesThroughSrq`] when the queue
    /// pair receives through a shared receive queue (prepare there),
    /// [`Error::TooManySges`], [`Error::ForeignProtectionDomain`] for a
    /// buffer of another protection domain, [`Error::FrozenBuffer`] or
    /// [`Error::MissingAccess`] for one the device may not write.
    ///
    /// # References
    /// `ibv_post_recv(3)`
    #[doc(alias = "ibv_post_recv")]
    pub fn prepare_recv(&self, wr: RecvRequest) -> Result<PreparedRecv, PostError<RecvRequest>> {
        if self.inner.recv.is_none() {
            let error = Error::ReceivesThroughSrq;
            return Err(PostError { error, request: wr });
        }
        let max_sge = self.inner.caps.max_recv_sge;
        prepare(wr, &self.inner.pd, max_sge, Target::Qp(self.clone()))
    }
}

impl SharedReceiveQueue {
    /// Checks `wr` and builds its C request once, for posting to this
    /// shared receive queue any number of times with
    /// [`PreparedRecv::post`].
    ///
    /// # Errors
    /// As [`post_recv`](Self::post_recv)'s checks (the request comes back
    /// in the [`PostError`]).
    ///
    /// # References
    /// `ibv_post_srq_recv(3)`
    #[doc(alias = "ibv_post_srq_recv")]
    pub fn prepare_recv(&self, wr: RecvRequest) -> Result<PreparedRecv, PostError<RecvRequest>> {
        prepare(wr, self.pd(), self.max_sge(), Target::Srq(self.clone()))
    }
}

fn prepare(
    mut wr: RecvRequest,
    pd: &crate::ProtectionDomain,
    max_sge: u32,
    target: Target,
) -> Result<PreparedRecv, PostError<RecvRequest>> {
    if let Err(error) = check_bufs(&wr.sg, pd, true, max_sge, "receive") {
        return Err(PostError { error, request: wr });
    }
    let mut sges = vec![sys::ibv_sge::default(); wr.sg.len().max(1)];
    let num_sge = fill_sges(&wr.sg, &mut sges);
    let postings = Postings::new(std::mem::take(&mut wr.sg), None, wr.wr_id);
    let c = sys::ibv_recv_wr {
        wr_id: postings.posting_wr_id(),
        next: std::ptr::null_mut(),
        sg_list: sges.as_mut_ptr(),
        num_sge: num_sge as i32,
    };
    Ok(PreparedRecv {
        target,
        wr: c,
        sges,
        postings,
    })
}

impl PreparedRecv {
    /// Posts the request once more.
    ///
    /// A queue pair moved to ERR refuses receives until it is reset (as
    /// [`QueuePair::post_recv`]). A posting that raced the move (another
    /// thread's modify) is flushed by moving the queue pair to ERR once
    /// more (if that fails, the posting's buffers stay allocated for good).
    ///
    /// # Errors
    /// [`Error::QueuePairInError`] for a queue pair in ERR (checked before
    /// the provider sees the request); [`Error::Verb`](crate::Error::Verb)
    /// naming `ibv_post_recv` (or `ibv_post_srq_recv`): `ENOMEM` when the
    /// receive queue is full, `EINVAL` from providers that refuse receives
    /// in the queue pair's state. Nothing was posted then.
    ///
    /// # References
    /// `ibv_post_recv(3)`, `ibv_post_srq_recv(3)`
    #[doc(alias = "ibv_post_recv")]
    #[inline(always)]
    pub fn post(&mut self) -> Result<()> {
        if let Target::Qp(qp) = &self.target {
            if qp.recv_refused() {
                return Err(refused_in_err());
            }
            // No lock, but counted in: a move to RESET waits until no
            // posting is inside the provider (mlx5 resets the receive
            // queue's indices without the lock its post_recv holds; see
            // `epoch.rs`), and while one is under way postings wait for it.
            if !qp.inner.send_epoch.enter_recv() {
                return self.post_while_resetting();
            }
            let r = post_counted(&self.target, &mut self.wr, &mut self.postings);
            qp.inner.send_epoch.leave();
            return r;
        }
        post_counted(&self.target, &mut self.wr, &mut self.postings)
    }

    /// A posting that met a move to RESET: under the send lock, which the
    /// move holds until the queue pair is in RESET.
    #[cold]
    #[inline(never)]
    fn post_while_resetting(&mut self) -> Result<()> {
        let Target::Qp(qp) = &self.target else {
            return post_counted(&self.target, &mut self.wr, &mut self.postings);
        };
        let qp = qp.clone();
        let _send = qp.inner.send.lock();
        if qp.recv_refused() {
            return Err(refused_in_err());
        }
        // With the send lock held no move to ERR can start, so the
        // post-doorbell re-check in `post_counted` cannot call
        // `reflush_receives` (which takes that lock).
        post_counted(&self.target, &mut self.wr, &mut self.postings)
    }

    /// Whether a posting may still be outstanding (its completion not yet
    /// polled).
    #[inline]
    pub fn is_posted(&self) -> bool {
        self.postings.is_posted()
    }

    /// The `wr_id` each posting's completion reports.
    #[inline]
    pub fn wr_id(&self) -> u64 {
        self.postings.wr_id()
    }

    /// The buffers, or `None` while a posting is outstanding.
    pub fn buffers(&mut self) -> Option<&SgList> {
        self.postings.sg_mut().map(|sg| &*sg)
    }

    /// The bytes of buffer `index` (what the last message wrote there), or
    /// `None` while a posting is outstanding.
    ///
    /// One load of the reference count, no read-modify-write.
    #[inline]
    pub fn bytes(&self, index: usize) -> Option<&[u8]> {
        self.postings.bytes(index)
    }

    /// The bytes of buffer `index`, writable, or `None` while a posting is
    /// outstanding.
    #[inline]
    pub fn bytes_mut(&mut self, index: usize) -> Option<&mut [u8]> {
        self.postings.bytes_mut(index)
    }

    /// Gives the buffers back, or the request itself while a posting is
    /// outstanding.
    ///
    /// # Errors
    /// `self`, unchanged, while [`is_posted`](Self::is_posted).
    // The request comes back by value, as PostError does.
    #[allow(clippy::result_large_err)]
    pub fn into_buffers(mut self) -> std::result::Result<SgList, PreparedRecv> {
        self.postings.take().ok_or(self)
    }
}

/// The posting itself: the provider's call, the count, the ERR re-check.
#[inline(always)]
fn post_counted(target: &Target, wr: &mut sys::ibv_recv_wr, postings: &mut Postings) -> Result<()> {
    // Before the doorbell: another thread may poll the completion as
    // soon as the provider took the request.
    let posting = postings.posting();
    debug_assert_eq!(wr.wr_id, postings.posting_wr_id());
    // Written by a provider that refuses the request, never read here.
    let mut bad = std::mem::MaybeUninit::<*mut sys::ibv_recv_wr>::uninit();
    // `wr`'s SGEs point into `sges` and describe the registered,
    // device-writable buffers `postings` owns (checked by `prepare`,
    // never replaced), kept alive by the posting's count until its
    // completion is claimed.
    let rc = match target {
        Target::Qp(qp) => {
            // SAFETY: live QP (`target` holds it); one request
            // (`next` NULL), SGEs as above.
            unsafe { qp.provider_post_recv(wr, bad.as_mut_ptr()) }
        }
        Target::Srq(srq) => {
            // SAFETY: live SRQ (`target` holds it); one request,
            // SGEs as above.
            unsafe { sys::ibv_post_srq_recv(srq.as_ptr(), wr, bad.as_mut_ptr()) }
        }
    };
    if rc != 0 {
        // The provider refused the request: no completion will carry
        // the posting's count.
        postings.refused(posting);
        return crate::error::ret_errno(target.verb(), rc);
    }
    if let Target::Qp(qp) = target {
        // A move to ERR may have started since the check above, its
        // flush missing this request. The move announces itself
        // (`note_err_pending`, then a fence) before `ibv_modify_qp`; the
        // fence here orders the provider's write of the request before
        // the load: either the load sees the announcement, or the
        // flush sees the request.
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        if qp.recv_refused() {
            qp.reflush_receives();
        }
    }
    // After the doorbell: the next posting's count.
    postings.restock(posting);
    Ok(())
}
