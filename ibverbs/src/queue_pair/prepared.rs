//! Prepared send requests: checked and built once, posted many times.
//!
//! A posting does not go through the send queue's in-flight table: its
//! `wr_id` carries a pointer to the request's shared buffers, with bits 63
//! and 62 set ([`SAFE_BIT`], [`PREPARED_BIT`]; table `wr_id`s keep bit 62
//! clear, raw-path `wr_id`s bit 63). Each posting owns one strong count of
//! that `Arc`, leaked into the `wr_id` before the doorbell and taken back
//! by whoever polls the completion ([`claim_prepared`]). A completion is
//! polled once, so each count is taken back once; one that never comes
//! back (a completion consumed by `poll_raw`, a queue pair destroyed with
//! postings outstanding) leaks the buffers, which is safe. Claiming is one
//! atomic decrement, without locks: the claim sits between the completion
//! and the next doorbell of a latency loop.

use std::sync::Arc;

use ibverbs_sys as sys;

use super::post::fill_sges;
use super::request::{PostError, SendRequest};
use crate::buffer::Buf;
use crate::error::{Error, Result};
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
const PTR_MASK: u64 = (1 << 61) - 1;

#[inline]
fn encode(ptr: *const Shared) -> u64 {
    SAFE_BIT | PREPARED_BIT | ((ptr as usize as u64) >> 3)
}

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
/// completion claimed at most once. (Only [`PreparedSend::post`] makes such
/// `wr_id`s: tables keep bit 62 clear, the raw path's contract bit 63.)
#[inline]
pub(crate) unsafe fn claim_prepared(wr_id: u64) -> u64 {
    let ptr = ((wr_id & PTR_MASK) << 3) as usize as *const Shared;
    // SAFETY: `ptr` is what `post` leaked with `Arc::into_raw` for this
    // posting (caller's contract); the count it owns is released here once.
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
/// `poll`, `poll_ex`, the async dispatcher); a completion consumed by
/// [`poll_raw`](crate::CompletionQueue::poll_raw), or never polled because
/// the queue pair was destroyed with postings outstanding, keeps the
/// buffers allocated for good (a leak, never a use after free).
///
/// Posting costs the send queue's lock, the queue-pair state check, a
/// reference count and the provider's `post_send`; claiming a completion
/// costs one reference count, no lock. The request is not checked or built
/// again. Postings do not take slots of the send queue's in-flight table:
/// when the device queue is full the provider refuses the posting
/// (`ibv_post_send` fails with `ENOMEM`).
///
/// # Example
/// ```no_run
/// # use ibverbs::*;
/// # fn demo(qp: &QueuePair, cq: &CompletionQueue, buf: LocalBuffer, remote: RemoteMemory) -> Result<()> {
/// let mut read = qp.prepare_send(SendRequest::read(buf, remote).wr_id(7)).map_err(|e| e.error)?;
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
/// outstanding:
/// ```compile_fail
/// # use ibverbs::*;
/// # fn demo(qp: &QueuePair, buf: LocalBuffer, remote: RemoteMemory) -> Result<()> {
/// let mut read = qp.prepare_send(SendRequest::read(buf, remote)).map_err(|e| e.error)?;
/// let bytes = read.bytes_mut(0).unwrap();
/// read.post()?;          // the device may write what `bytes` borrows
/// bytes[0] = 1;
/// # Ok(()) }
/// ```
///
/// # References
/// `ibv_post_send(3)`
#[derive(Debug)]
#[doc(alias = "ibv_post_send")]
pub struct PreparedSend {
    qp: QueuePair,
    /// The C request; `wr_id` is set per posting, `sg_list` points into
    /// `sges`, `next` is NULL.
    wr: sys::ibv_send_wr,
    /// The SGEs (or the one SGE of the inline bytes).
    sges: Vec<sys::ibv_sge>,
    /// The inline bytes (the provider copies them at each posting).
    inline: Vec<u8>,
    shared: Arc<Shared>,
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
    /// back in the [`PostError`]); [`Error::InvalidArgument`] for an
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
            Err(Error::InvalidArgument(
                "a prepared request must be signaled: its completion gives the buffers back".into(),
            ))
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
        let mut c = super::post::c_send_wr(&wr);
        c.sg_list = sges.as_mut_ptr();
        c.num_sge = num_sge as i32;
        let shared = Arc::new(Shared {
            sg: std::mem::take(&mut wr.sg),
            ah: wr.ud.take().map(|u| u.ah),
            wr_id: wr.wr_id,
        });
        Ok(PreparedSend {
            qp: self.clone(),
            wr: c,
            sges,
            inline,
            shared,
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
    /// then.
    ///
    /// # References
    /// `ibv_post_send(3)`
    #[doc(alias = "ibv_post_send")]
    #[inline]
    pub fn post(&mut self) -> Result<()> {
        // The send queue's lock orders the state check with state changes
        // (see QueuePair::post_send): a refused posting was not queued.
        let _st = self.qp.inner.send.lock();
        self.qp.check_sendable("ibv_post_send")?;
        // Before the doorbell: another thread may poll the completion as
        // soon as the provider took the request.
        let leaked = Arc::into_raw(Arc::clone(&self.shared));
        self.wr.wr_id = encode(leaked);
        let mut bad: *mut sys::ibv_send_wr = std::ptr::null_mut();
        // SAFETY: live QP (`self.qp`); `wr` is one request (`next` NULL)
        // whose SGEs point into `sges` and describe the registered buffers
        // `shared` owns (checked by prepare_send, never replaced), kept
        // alive by the count leaked above until the completion is claimed,
        // or the inline bytes the provider copies during the call.
        let rc = unsafe { sys::ibv_post_send(self.qp.as_ptr(), &mut self.wr, &mut bad) };
        if rc != 0 {
            // SAFETY: the provider refused the request, so no completion
            // will carry `leaked`: its count is taken back once, here.
            drop(unsafe { Arc::from_raw(leaked) });
            return crate::error::ret_errno("ibv_post_send", rc);
        }
        Ok(())
    }

    /// Sets the operands of a prepared compare-and-swap for the postings
    /// that follow (each posting copies the request).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the request is not a
    /// compare-and-swap.
    #[inline]
    pub fn set_compare_swap(&mut self, compare: u64, swap: u64) -> Result<()> {
        if self.wr.opcode != sys::IBV_WR_ATOMIC_CMP_AND_SWP {
            return Err(Error::InvalidArgument(
                "set_compare_swap on a request that is not a compare-and-swap".into(),
            ));
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
    /// [`Error::InvalidArgument`] when the request is not a fetch-and-add.
    #[inline]
    pub fn set_add(&mut self, add: u64) -> Result<()> {
        if self.wr.opcode != sys::IBV_WR_ATOMIC_FETCH_AND_ADD {
            return Err(Error::InvalidArgument(
                "set_add on a request that is not a fetch-and-add".into(),
            ));
        }
        self.wr.wr.atomic.compare_add = add;
        Ok(())
    }

    /// Whether a posting may still be outstanding (its completion not yet
    /// polled).
    #[inline]
    pub fn is_posted(&self) -> bool {
        Arc::strong_count(&self.shared) > 1
    }

    /// The `wr_id` each posting's completion reports.
    #[inline]
    pub fn wr_id(&self) -> u64 {
        self.shared.wr_id
    }

    /// The queue pair the request posts to.
    pub fn queue_pair(&self) -> &QueuePair {
        &self.qp
    }

    /// The bytes of buffer `index`, or `None` while a posting is
    /// outstanding (or for a [`SharedBuffer`](crate::SharedBuffer), whose
    /// bytes peers may change: use [`buffers`](Self::buffers)).
    #[inline]
    pub fn bytes(&mut self, index: usize) -> Option<&[u8]> {
        let buf = match &Arc::get_mut(&mut self.shared)?.sg {
            SgList::One(b) if index == 0 => b,
            SgList::Many(v) => v.get(index)?,
            _ => return None,
        };
        match buf {
            Buf::Local(b) => Some(b),
            Buf::Frozen(b) => Some(b),
            _ => None,
        }
    }

    /// The bytes of buffer `index` to change before the next posting, or
    /// `None` while a posting is outstanding (or for a frozen or shared
    /// buffer).
    #[inline]
    pub fn bytes_mut(&mut self, index: usize) -> Option<&mut [u8]> {
        let sg = &mut Arc::get_mut(&mut self.shared)?.sg;
        let buf = match sg {
            SgList::One(b) if index == 0 => b,
            SgList::Many(v) => v.get_mut(index)?,
            _ => return None,
        };
        match buf {
            Buf::Local(b) => Some(b),
            _ => None,
        }
    }

    /// The buffers, or `None` while a posting is outstanding.
    pub fn buffers(&mut self) -> Option<&SgList> {
        Some(&Arc::get_mut(&mut self.shared)?.sg)
    }

    /// Gives the buffers back, or the request itself while a posting is
    /// outstanding.
    ///
    /// # Errors
    /// `self`, unchanged, while [`is_posted`](Self::is_posted).
    // The request comes back by value, as PostError does.
    #[allow(clippy::result_large_err)]
    pub fn into_buffers(self) -> std::result::Result<SgList, PreparedSend> {
        let PreparedSend {
            qp,
            wr,
            sges,
            inline,
            shared,
        } = self;
        match Arc::try_unwrap(shared) {
            Ok(bufs) => Ok(bufs.sg),
            Err(shared) => Err(PreparedSend {
                qp,
                wr,
                sges,
                inline,
                shared,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wq_table::WqTable;

    #[test]
    fn a_postings_wr_id_carries_its_count_and_nothing_else_claims_it() {
        let shared = Arc::new(Shared {
            sg: SgList::Empty,
            ah: None,
            wr_id: 42,
        });
        let leaked = Arc::into_raw(Arc::clone(&shared));
        let wr_id = encode(leaked);
        assert!(is_prepared(wr_id));
        // Neither a table slot nor a raw-path id.
        assert_eq!(WqTable::<()>::decode(wr_id), None);
        assert!(!is_prepared(wr_id & !SAFE_BIT));
        assert!(!is_prepared(SAFE_BIT | (5 << 32) | 9));
        assert_eq!(Arc::strong_count(&shared), 2);
        // SAFETY: `wr_id` holds the count leaked above, claimed once.
        assert_eq!(unsafe { claim_prepared(wr_id) }, 42);
        assert_eq!(Arc::strong_count(&shared), 1);
    }
}
