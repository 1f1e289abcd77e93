//! [`PreparedSend`]: a send-queue request checked and built once, posted
//! many times.
//!
//! A posting does not go through the queue's in-flight table: its `wr_id`
//! carries a pointer to the request's shared buffers, with bits 63 and 62
//! set ([`SAFE_BIT`], [`PREPARED_BIT`]; table `wr_id`s keep bit 62 clear,
//! raw-path `wr_id`s bit 63). Each posting owns one strong count of that
//! `Arc`, leaked into the `wr_id` before the provider sees the request and
//! taken back by whoever polls the completion ([`claim_prepared`]); the
//! handle keeps one spare count, so a posting leaks it with no atomic
//! operation and the next is taken after the doorbell. Posting takes no
//! lock: it reads the queue pair's state from one atomic word that modifies
//! write under the send lock, counting itself in that word while inside the
//! provider (a move to RESET waits that out: see below), and a refused
//! posting checks afterwards, under
//! that lock, that no state change overlapped it (else the provider may have
//! queued it, and its count stays leaked). A
//! completion is polled once, so each count is taken back once; one that
//! never comes back (a completion consumed by `poll_raw`, a queue pair
//! destroyed or reset with postings outstanding) leaks the buffers, which
//! is safe. Claiming is one atomic decrement, without locks: the claim sits
//! between a completion and the next doorbell of a latency loop. The
//! [`Postings`] defined here serve [`PreparedRecv`](super::PreparedRecv)
//! too.
//!
//! # A lock-free posting beside a move to RESET
//!
//! Without the send lock, the provider's `post_send` could run beside its
//! `modify_qp(RESET)` on another thread. Whether that is sound depends on
//! the provider (rdma-core v44, as Debian 12 ships it):
//!
//! * libibverbs' `ibv_modify_qp` calls the provider, then stores
//!   `qp->state` (a plain `int`) on success; no lock.
//! * rxe (`providers/rxe/rxe.c`): `rxe_modify_qp` only issues the kernel
//!   command; `rxe_post_send` touches the user-mapped queue under
//!   `sq->lock` and reads no state `modify_qp` writes. The kernel's reset
//!   (`rxe_qp_reset`) clears the queue's slots, not its indices: a request
//!   written meanwhile is lost or executed later, and a posting's count
//!   leaked into its `wr_id` keeps its buffers alive either way. Sound.
//! * mlx5 (`providers/mlx5/verbs.c`, `mlx5_modify_qp`): on RESET it calls
//!   `mlx5_init_qp_indices` (`qp.c`), which zeroes `sq.head`, `sq.tail`,
//!   `sq.cur_post` and the receive queue's indices *without* `sq.lock`,
//!   while `_mlx5_post_send` advances `sq.cur_post` under `sq.lock`: a
//!   data race in the provider. A posting that lands after the reset
//!   leaves `cur_post` past 0, and the next doorbell would hand the device
//!   stale send-queue entries from before the reset, whose buffers the
//!   reset released (`QueuePair::modify` drops the discarded requests'
//!   slots). Not sound.
//!
//! So a move to RESET excludes lock-free postings without a lock on this
//! path: each posting counts itself in and out of the queue pair's epoch
//! word around the provider call (two atomic read-modify-writes on a word
//! it reads anyway), and the RESET path, holding the send lock, clears the
//! word's "sends" bit (later postings take the send lock) and waits until
//! the count is zero before calling `ibv_modify_qp` (see `epoch.rs`).
//! Other state changes do not wait: from a state that sends, mlx5 and rxe
//! change nothing `post_send` uses except through the kernel.

use std::sync::Arc;

use ibverbs_sys as sys;

use super::post::{c_send_wr, fill_sges};
use super::request::{PostError, SendOp, SendRequest};
use crate::buffer::Buf;
use crate::error::{Error, Result};
use crate::queue_pair::epoch::Seen;
use crate::wq_table::{SgList, PREPARED_BIT, SAFE_BIT};
use crate::{AddressHandle, QueuePair};

/// What a prepared request's postings share: its buffers (and a UD
/// destination's address handle). Every outstanding posting holds a strong
/// count, so the bytes are reachable from Rust only when the handle's is
/// the last one.
#[derive(Debug)]
struct Shared {
    sg: SgList,
    /// Held, never read: the C request points at it.
    #[allow(dead_code)]
    ah: Option<AddressHandle>,
    /// The `wr_id` the completions report.
    wr_id: u64,
}

// The pointer is stored shifted right by 3 bits below the two tag bits.
const _: () = assert!(std::mem::align_of::<Shared>() >= 8);
// Completions may be claimed (the count dropped) on any thread, and
// PreparedSend's `unsafe impl Send` relies on its `Arc<Shared>` being Send.
const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<Shared>()
};
const PTR_MASK: u64 = (1 << 61) - 1;

/// A prepared request's buffers and its postings' counts: what
/// [`PreparedSend`] and [`PreparedRecv`](super::PreparedRecv) share.
#[derive(Debug)]
pub(super) struct Postings {
    shared: Arc<Shared>,
    /// Whether the handle holds one more strong count of `shared` than
    /// `shared` itself: the next posting's, taken in advance (a clone
    /// leaked with `Arc::into_raw`, given back by `Drop` or `sg_mut`). A
    /// posting leaks it into its `wr_id` with no atomic operation, and the
    /// count for the one after is taken once the doorbell rang, so that
    /// the increment is not in a latency loop's window between a
    /// completion and the next doorbell. Not a posting: the device never
    /// sees it.
    spare: bool,
}

impl Drop for Postings {
    fn drop(&mut self) {
        self.drop_spare();
    }
}

impl Postings {
    pub(super) fn new(sg: SgList, ah: Option<AddressHandle>, wr_id: u64) -> Postings {
        Postings {
            shared: Arc::new(Shared { sg, ah, wr_id }),
            spare: false,
        }
    }

    /// The `wr_id` every posting carries: the shared allocation's address
    /// (it never moves) with bits 63 and 62 set. Each posting's count is
    /// taken separately ([`posting`](Self::posting)); the `wr_id` is the
    /// same for all, so the C request is built with it once.
    #[inline]
    pub(super) fn posting_wr_id(&self) -> u64 {
        SAFE_BIT | PREPARED_BIT | ((Arc::as_ptr(&self.shared) as usize as u64) >> 3)
    }

    /// A new posting's count (the spare one when there is one), leaked
    /// before the doorbell (another thread may poll the completion, and
    /// take the count back, as soon as the provider took the request).
    /// Until the returned [`Posting`] is settled ([`restock`](Self::restock),
    /// [`refused`](Self::refused) or [`kept`](Self::kept), all before
    /// anything else reads `spare`), `spare` is true: it stands for the
    /// posting's count then, and the settling says who owns it.
    #[inline(always)]
    pub(super) fn posting(&mut self) -> Posting {
        if !self.spare {
            self.leak_count();
            self.spare = true;
        }
        Posting(())
    }

    /// Takes a strong count of `shared` and leaks it (as `Arc::into_raw`,
    /// whose pointer is [`posting_wr_id`](Self::posting_wr_id)'s).
    #[inline(always)]
    fn leak_count(&self) {
        let ptr = Arc::into_raw(Arc::clone(&self.shared));
        debug_assert_eq!(ptr, Arc::as_ptr(&self.shared));
    }

    /// The provider took `posting`: its count is the completion's now.
    /// Takes the next posting's count (the new spare), after the doorbell.
    #[inline(always)]
    pub(super) fn restock(&mut self, posting: Posting) {
        let Posting(()) = posting;
        self.leak_count();
        debug_assert!(self.spare);
    }

    /// The provider refused the request: no completion will carry the
    /// count, so it is the spare again (as `spare` already says).
    #[cold]
    pub(super) fn refused(&mut self, posting: Posting) {
        let Posting(()) = posting;
        debug_assert!(self.spare);
    }

    /// The provider refused the request but may have queued it (the queue
    /// pair changed state during the call): the count stays leaked, so the
    /// buffers stay allocated for good rather than be freed under a request
    /// the device may still execute. The handle holds no spare then.
    #[cold]
    pub(super) fn kept(&mut self, posting: Posting) {
        let Posting(()) = posting;
        self.spare = false;
    }

    /// Gives the spare count back, if one is held.
    fn drop_spare(&mut self) {
        if std::mem::take(&mut self.spare) {
            // SAFETY: the spare is a count of `shared` leaked by
            // `leak_count` (`Arc::into_raw`, whose pointer `Arc::as_ptr`
            // gives) and owned by this handle (`spare` said so, and is
            // cleared now): released once, here. `shared` holds another, so
            // this is never the last.
            unsafe { Arc::decrement_strong_count(Arc::as_ptr(&self.shared)) };
        }
    }

    #[inline]
    pub(super) fn is_posted(&self) -> bool {
        Arc::strong_count(&self.shared) > 1 + usize::from(self.spare)
    }

    #[inline]
    pub(super) fn wr_id(&self) -> u64 {
        self.shared.wr_id
    }

    /// The buffers, or `None` while a posting is outstanding (`get_mut`
    /// acquires what the completions released with their counts).
    #[inline]
    pub(super) fn sg_mut(&mut self) -> Option<&mut SgList> {
        if self.is_posted() {
            return None;
        }
        // The spare count goes (taken again by the next posting), so that
        // `get_mut` sees the handle's count alone.
        self.drop_spare();
        Some(&mut Arc::get_mut(&mut self.shared)?.sg)
    }

    /// The bytes of buffer `index` (local or frozen), or `None` while a
    /// posting is outstanding.
    ///
    /// One load of the reference count, no read-modify-write: a loop that
    /// reads each result while the next posting is in flight pays nothing
    /// more.
    #[inline]
    pub(super) fn bytes(&self, index: usize) -> Option<&[u8]> {
        // Postings are made only by the owners' `post(&mut self)`, so none
        // can start while the returned borrow of `self` lives; a count of 1
        // (2 with the spare) means every earlier posting's completion was
        // claimed. The acquire
        // fence pairs with the claim's release decrement: the device's
        // writes, done before its completion, are visible. (No `Weak` of
        // `shared` exists.)
        if self.is_posted() {
            return None;
        }
        std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
        match self.shared.sg.iter().nth(index)? {
            Buf::Local(b) => Some(b),
            Buf::Frozen(b) => Some(b),
            _ => None,
        }
    }

    /// The bytes of local buffer `index` to change before the next
    /// posting, or `None` while a posting is outstanding (or for a frozen
    /// or shared buffer).
    #[inline]
    pub(super) fn bytes_mut(&mut self, index: usize) -> Option<&mut [u8]> {
        let buf = match self.sg_mut()? {
            SgList::One(b) if index == 0 => b,
            SgList::Many(v) => v.get_mut(index)?,
            _ => return None,
        };
        match buf {
            Buf::Local(b) => Some(b),
            _ => None,
        }
    }

    /// The buffers, taken out, or `None` while a posting is outstanding.
    pub(super) fn take(&mut self) -> Option<SgList> {
        self.sg_mut().map(std::mem::take)
    }
}

/// One posting's strong count, leaked (its `wr_id` names it, see
/// [`Postings::posting_wr_id`]) until the completion is claimed, or given
/// back to the handle when the provider refused the request; settled by
/// one of [`Postings::restock`], [`Postings::refused`], [`Postings::kept`].
#[must_use]
pub(super) struct Posting(());

/// Whether a completion's `wr_id` is a prepared request's posting.
#[inline]
pub(crate) fn is_prepared(wr_id: u64) -> bool {
    wr_id & (SAFE_BIT | PREPARED_BIT) == SAFE_BIT | PREPARED_BIT
}

/// Takes back the strong count a posting leaked into `wr_id` and returns
/// the request's `wr_id`.
///
/// # Safety
/// `wr_id` is [`is_prepared`] and comes from a polled work completion, each
/// completion claimed at most once. (Only [`Posting`] makes such `wr_id`s:
/// tables keep bit 62 clear, the raw path's contract bit 63.)
#[inline]
pub(crate) unsafe fn claim_prepared(wr_id: u64) -> u64 {
    let ptr = ((wr_id & PTR_MASK) << 3) as usize as *const Shared;
    // SAFETY: `ptr` is the pointer of the `Arc` whose count Postings::posting
    // leaked for this posting (caller's contract): `Arc::as_ptr`, which is
    // what `Arc::into_raw` of that clone returns. The count is released
    // here, once.
    let shared = unsafe { Arc::from_raw(ptr) };
    shared.wr_id
}

/// A send-queue work request checked and built once, then posted any number
/// of times with [`post`](Self::post) — the safe counterpart of a C program
/// that reuses one `ibv_send_wr` (as perftest does), or of MPI's persistent
/// requests.
///
/// The request owns its buffers for its whole life. Each posting keeps them
/// alive until its completion is polled; the bytes are reachable from Rust
/// ([`bytes`](Self::bytes), [`bytes_mut`](Self::bytes_mut),
/// [`into_buffers`](Self::into_buffers)) only while no posting is
/// outstanding. The same request may be posted again before the previous
/// posting completed (the device then reads, or writes, the same memory
/// twice; Rust sees it only after both). Postings are signaled: one that
/// never completes could never give its buffers back.
///
/// The completion of a posting carries the request's `wr_id` and no
/// buffers ([`Completion::take_buffers`](crate::Completion::take_buffers)
/// gives [`SgList::Empty`]). Poll it with any of the safe polls
/// ([`CompletionQueue::poll_one`](crate::CompletionQueue::poll_one),
/// `poll`, `poll_one`, the async dispatcher); a completion consumed by
/// [`poll_raw`](crate::CompletionQueue::poll_raw), or never polled because
/// the queue pair was destroyed with postings outstanding, keeps the
/// buffers allocated for good (a leak, never a use after free).
///
/// Posting costs two atomic read-modify-writes of one word of the queue
/// pair (its state as the last modify left it, and the count of postings
/// in flight that a move to RESET waits out: no lock) and the provider's
/// `post_send`; the reference
/// count of the next posting is taken after the doorbell. Claiming a
/// completion costs one reference count, no lock. The request is not
/// checked or built again. Postings do not take slots of the send queue's
/// in-flight table: when the device queue is full the provider refuses the
/// posting (`ibv_post_send` fails with `ENOMEM`).
///
/// # Example
/// ```no_run
/// # use ibverbs::*;
/// # fn demo(qp: &QueuePair, cq: &CompletionQueue, buf: LocalBuffer, remote: RemoteMemory) -> Result<()> {
/// let mut read = qp.prepare_send(SendRequest::read(buf, remote).wr_id(7))?;
/// for _ in 0..1000 {
///     read.post()?;
///     let c = loop {
///         if let Some(c) = cq.poll_one()? { break c; }
///     };
///     c.result()?;
/// }
/// let data = read.bytes(0).expect("nothing outstanding");
/// # let _ = data; Ok(()) }
/// ```
///
/// A prepared request's buffers cannot be reached while a posting may be
/// outstanding (UI tests, their compiler output checked by
/// `ibverbs/tests/hazards.rs`):
/// ```ignore
#[doc = include_str!("../../tests/ui/prepared_send_bytes_mut_across_post.rs")]
/// ```
/// nor read while the device may be writing them:
/// ```ignore
#[doc = include_str!("../../tests/ui/prepared_send_bytes_across_post.rs")]
/// ```
///
/// # References
/// `ibv_post_send(3)`
#[derive(Debug)]
#[doc(alias = "ibv_post_send")]
pub struct PreparedSend {
    qp: QueuePair,
    /// The C request; `wr_id` is the postings' (`Postings::posting_wr_id`),
    /// `sg_list` points into `sges`, `next` is NULL.
    wr: sys::ibv_send_wr,
    /// The SGEs (or the one SGE of the inline bytes). Held, never read:
    /// `wr` points into it.
    #[allow(dead_code)]
    sges: Vec<sys::ibv_sge>,
    /// The inline bytes (the provider copies them at each posting). Held,
    /// never read: the inline SGE points into it.
    #[allow(dead_code)]
    inline: Vec<u8>,
    postings: Postings,
}

// SAFETY: the raw pointers in `wr` point into `sges` and `inline` (owned
// heap memory that does not move with the struct) and at the address
// handle the shared buffers keep alive; they are only used by `post`,
// which takes `&mut self`.
unsafe impl Send for PreparedSend {}

impl QueuePair {
    /// Checks `wr` and builds its C request once, for posting any number of
    /// times with [`PreparedSend::post`]. Inline data is copied into the
    /// prepared request.
    ///
    /// # Errors
    /// The checks of [`post_send`](Self::post_send) (the request comes
    /// back in the [`PostError`]); [`Error::PreparedUnsignaled`] for an
    /// unsignaled request on a queue pair that does not signal every
    /// request.
    ///
    /// # References
    /// `ibv_post_send(3)`
    #[doc(alias = "ibv_post_send")]
    // The refused request comes back by value.
    #[allow(clippy::result_large_err)]
    pub fn prepare_send<'a>(
        &self,
        mut wr: SendRequest<'a>,
    ) -> Result<PreparedSend, PostError<SendRequest<'a>>> {
        let checked = if !wr.is_signaled() && !self.inner.sq_sig_all {
            Err(Error::PreparedUnsignaled)
        } else {
            self.check_send(&wr, false)
        };
        if let Err(error) = checked {
            return Err(PostError { error, request: wr });
        }
        let inline = wr.inline.map(<[u8]>::to_vec).unwrap_or_default();
        let mut sges = vec![sys::ibv_sge::default(); wr.sg.len().max(1)];
        let num_sge = if wr.inline.is_some() {
            sges[0] = sys::ibv_sge {
                addr: inline.as_ptr() as u64,
                length: inline.len() as u32,
                lkey: 0,
            };
            usize::from(!inline.is_empty())
        } else {
            fill_sges(&wr.sg, &mut sges)
        };
        let mut c = c_send_wr(&wr);
        c.sg_list = sges.as_mut_ptr();
        c.num_sge = num_sge as i32;
        let postings = Postings::new(
            std::mem::take(&mut wr.sg),
            wr.ud.take().and_then(super::request::Dest::into_ah),
            wr.wr_id,
        );
        c.wr_id = postings.posting_wr_id();
        Ok(PreparedSend {
            qp: self.clone(),
            wr: c,
            sges,
            inline,
            postings,
        })
    }
}

impl PreparedSend {
    /// Posts the request once more.
    ///
    /// # Errors
    /// [`Error::Verb`](crate::Error::Verb) naming `ibv_post_send`: `ENOMEM`
    /// when the send queue is full, `EINVAL` for a queue pair in RESET, INIT
    /// or RTR (refused before reaching the provider). Nothing was posted
    /// then, and the request can be posted again; only when the queue pair
    /// changed state during the call (another thread modified it) may a
    /// refused request have been queued by the provider, and its buffers
    /// then stay allocated for good ([`is_posted`](Self::is_posted) stays
    /// true).
    ///
    /// # References
    /// `ibv_post_send(3)`
    #[doc(alias = "ibv_post_send")]
    #[inline(always)]
    pub fn post(&mut self) -> Result<()> {
        // No lock: the state the last modify left, with the count of state
        // changes, is one atomic word that modifies write under the send
        // lock. A refusal is checked against it afterwards (`refused`).
        // The posting is counted in it while inside the provider: a move to
        // RESET waits until no lock-free posting is (module docs, `epoch.rs`).
        let Some(seen) = self.qp.inner.send_epoch.enter() else {
            return self.post_locked();
        };
        let (posting, rc) = ring(&self.qp, &mut self.wr, &mut self.postings);
        self.qp.inner.send_epoch.leave();
        if rc != 0 {
            return self.refused(posting, rc, seen);
        }
        // After the doorbell, out of a latency loop's window.
        self.postings.restock(posting);
        Ok(())
    }

    /// The path of a queue pair whose last state change left it unable to
    /// send (or never changed it): under the send lock, which orders the
    /// check of `ibv_qp::state` with state changes (see
    /// QueuePair::post_send), so a refused posting was not queued.
    #[cold]
    #[inline(never)]
    fn post_locked(&mut self) -> Result<()> {
        let _st = self.qp.inner.send.lock();
        self.qp.check_sendable()?;
        let (posting, rc) = ring(&self.qp, &mut self.wr, &mut self.postings);
        if rc != 0 {
            // No completion will carry the posting's count.
            self.postings.refused(posting);
            return crate::error::ret_errno("ibv_post_send", rc);
        }
        self.postings.restock(posting);
        Ok(())
    }

    /// A refusal on the lock-free path. rxe (and others) write a request
    /// into the send queue before finding the queue pair not ready, and
    /// execute it once it is: the count comes back only if no state change
    /// overlapped the call — the epoch, read under the send lock (held by
    /// every modify for its whole call), is still the one the posting saw.
    #[cold]
    #[inline(never)]
    fn refused(&mut self, posting: Posting, rc: i32, seen: Seen) -> Result<()> {
        let st = self.qp.inner.send.lock();
        if self.qp.inner.send_epoch.unchanged_since(seen) {
            self.postings.refused(posting);
        } else {
            self.postings.kept(posting);
        }
        drop(st);
        crate::error::ret_errno("ibv_post_send", rc)
    }

    /// Sets the operands of a prepared compare-and-swap for the postings
    /// that follow (each posting copies the request).
    ///
    /// # Errors
    /// [`Error::WrongOperation`] when the request is not a
    /// compare-and-swap.
    #[inline]
    pub fn set_compare_swap(&mut self, compare: u64, swap: u64) -> Result<()> {
        if self.wr.opcode != sys::IBV_WR_ATOMIC_CMP_AND_SWP {
            return Err(Error::WrongOperation {
                expected: SendOp::CompareAndSwap,
            });
        }
        // Writes to the union member an atomic request uses (safe: Copy
        // integer fields).
        self.wr.wr.atomic.compare_add = compare;
        self.wr.wr.atomic.swap = swap;
        Ok(())
    }

    /// Sets the addend of a prepared fetch-and-add for the postings that
    /// follow.
    ///
    /// # Errors
    /// [`Error::WrongOperation`] when the request is not a fetch-and-add.
    #[inline]
    pub fn set_add(&mut self, add: u64) -> Result<()> {
        if self.wr.opcode != sys::IBV_WR_ATOMIC_FETCH_AND_ADD {
            return Err(Error::WrongOperation {
                expected: SendOp::FetchAndAdd,
            });
        }
        self.wr.wr.atomic.compare_add = add;
        Ok(())
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

    /// The queue pair the request posts to.
    pub fn queue_pair(&self) -> &QueuePair {
        &self.qp
    }

    /// The buffers, or `None` while a posting is outstanding.
    pub fn buffers(&mut self) -> Option<&SgList> {
        self.postings.sg_mut().map(|sg| &*sg)
    }

    /// The bytes of buffer `index`, or `None` while a posting is
    /// outstanding (or for a [`SharedBuffer`](crate::SharedBuffer), whose
    /// bytes peers may change: use [`buffers`](Self::buffers)).
    ///
    /// One load of the reference count, no read-modify-write: a loop that
    /// reads each result while the next posting is in flight (as
    /// `atomic_lat` does) pays nothing more.
    #[inline]
    pub fn bytes(&self, index: usize) -> Option<&[u8]> {
        self.postings.bytes(index)
    }

    /// The bytes of buffer `index` to change before the next posting, or
    /// `None` while a posting is outstanding (or for a frozen or shared
    /// buffer).
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
    pub fn into_buffers(mut self) -> std::result::Result<SgList, PreparedSend> {
        self.postings.take().ok_or(self)
    }
}

/// Leaks a count of `postings` (which `wr`'s `wr_id` names) and rings
/// `qp`'s doorbell; returns the posting and `ibv_post_send`'s code (a
/// refused posting's count is the caller's to settle).
#[inline(always)]
fn ring(qp: &QueuePair, wr: &mut sys::ibv_send_wr, postings: &mut Postings) -> (Posting, i32) {
    // Before the doorbell: another thread may poll the completion as soon
    // as the provider took the request.
    let posting = postings.posting();
    debug_assert_eq!(wr.wr_id, postings.posting_wr_id());
    // Written by a provider that refuses the request, never read here.
    let mut bad = std::mem::MaybeUninit::<*mut sys::ibv_send_wr>::uninit();
    // `wr` is a PreparedSend's: its SGEs point into the request's `sges` and
    // describe the registered buffers `postings` owns (checked by
    // prepare_send, never replaced), kept alive by the posting's count until
    // its completion is claimed, or the inline bytes the provider copies
    // during the call.
    // SAFETY: live QP (`qp`); one request (`next` NULL), SGEs as above.
    let rc = unsafe { qp.provider_post_send(wr, bad.as_mut_ptr()) };
    (posting, rc)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wq_table::WqTable;

    #[test]
    fn a_postings_wr_id_carries_its_count_and_nothing_else_claims_it() {
        let mut postings = Postings::new(SgList::Empty, None, 42);
        let wr_id = postings.posting_wr_id();
        let posting = postings.posting();
        postings.restock(posting);
        assert!(is_prepared(wr_id));
        // Neither a table slot nor a raw-path id.
        assert_eq!(WqTable::<()>::decode(wr_id), None);
        assert!(!is_prepared(wr_id & !SAFE_BIT));
        assert!(!is_prepared(SAFE_BIT | (5 << 32) | 9));
        assert!(postings.is_posted());
        // SAFETY: `wr_id` holds the count leaked above, claimed once.
        assert_eq!(unsafe { claim_prepared(wr_id) }, 42);
        assert!(!postings.is_posted());
    }

    #[test]
    fn a_refused_posting_gives_its_count_back() {
        let mut postings = Postings::new(SgList::Empty, None, 1);
        let posting = postings.posting();
        postings.refused(posting);
        assert!(!postings.is_posted());
        assert_eq!(
            Arc::strong_count(&postings.shared),
            2,
            "it became the spare"
        );
        // The next posting takes no new count.
        let wr_id = postings.posting_wr_id();
        let posting = postings.posting();
        assert_eq!(Arc::strong_count(&postings.shared), 2);
        postings.restock(posting);
        assert!(postings.is_posted());
        // SAFETY: `wr_id` names the count the posting leaked, claimed once.
        unsafe { claim_prepared(wr_id) };
        assert!(!postings.is_posted());
    }

    #[test]
    fn every_count_comes_back() {
        // A posting kept (refused but maybe queued) stays leaked; the
        // handle's own counts go with it: `sg_mut` gives the spare back,
        // `Drop` too.
        let shared = {
            let mut postings = Postings::new(SgList::Empty, None, 3);
            let wr_id = postings.posting_wr_id();
            for _ in 0..3 {
                let posting = postings.posting();
                postings.restock(posting);
            }
            assert_eq!(Arc::strong_count(&postings.shared), 5);
            for _ in 0..3 {
                // SAFETY: three postings leaked three counts; one each.
                unsafe { claim_prepared(wr_id) };
            }
            assert!(!postings.is_posted());
            assert!(postings.sg_mut().is_some(), "the handle's count alone");
            assert_eq!(Arc::strong_count(&postings.shared), 1);
            let posting = postings.posting();
            postings.kept(posting);
            let weak = Arc::downgrade(&postings.shared);
            let posting = postings.posting();
            postings.restock(posting);
            // SAFETY: the restocked posting's count, claimed once.
            unsafe { claim_prepared(wr_id) };
            assert_eq!(
                Arc::strong_count(&postings.shared),
                3,
                "handle, spare, kept"
            );
            weak
        };
        assert_eq!(shared.strong_count(), 1, "only the kept posting's count");
    }
}
