//! The exclusive posting handle of a receive queue: a queue pair's, or a
//! shared receive queue's (DESIGN.md, "Posting").

use std::ptr::NonNull;
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;

use rdma_verbs_sys as sys;

use super::post::{check_bufs, fill_sges, posted_count, RecvScratch};
use super::request::RecvRequest;
use super::send_queue::{no_room, Posted, Refused};
use crate::error::{Error, Result};
use crate::inflight::{Payload, Reserved, Ring};
use crate::memory::buffer::{Buf, DeviceWritable, SgList};
use crate::memory::protection_domain::ProtectionDomain;
use crate::qp::queue_pair::QueuePair;
use crate::qp::shared_receive_queue::SharedReceiveQueue;
use crate::types::QpState;

/// A provider's `post_recv` or `post_srq_recv`, with the queue as an
/// untyped pointer (the two differ only in its type, which the ABI does
/// not see).
pub(crate) type RecvPostFn = unsafe extern "C" fn(
    *mut std::ffi::c_void,
    *mut sys::ibv_recv_wr,
    *mut *mut sys::ibv_recv_wr,
) -> i32;

/// Whose receive queue a handle posts to.
enum Owner {
    Qp(QueuePair),
    Srq(SharedReceiveQueue),
}

/// The exclusive posting handle of a receive queue
/// ([`QueuePair::recv_queue`], [`SharedReceiveQueue::recv_queue`]): every
/// post takes `&mut self` and no lock. One exists per queue at a time; a
/// queue pair's refuses moves to RESET while it lives. Share it across
/// threads in a `Mutex`.
///
/// A queue pair moved to ERR (by [`QueuePair::modify`] and its helpers)
/// refuses receives until it is reset: the move flushes the receives
/// outstanding then, and a receive posted later would never be flushed
/// (rxe, for one, holds it without a system call).
///
/// # References
/// `ibv_post_recv(3)`, `ibv_post_srq_recv(3)`
pub struct RecvQueue {
    ring: NonNull<Ring>,
    post_fn: RecvPostFn,
    target: *mut std::ffi::c_void,
    pd: *const (),
    /// A queue pair's own receive queue (checks the ERR flag; in order).
    qp_queue: bool,
    max_sge: u32,
    wr: sys::ibv_recv_wr,
    sge: sys::ibv_sge,
    scratch: RecvScratch,
    owner: Owner,
}

// SAFETY: the handle is the ring's only user (RingCell); the verbs are
// thread-safe.
unsafe impl Send for RecvQueue {}
// SAFETY: everything that touches the ring, the template or the scratch
// takes `&mut self`; `&self` reaches only the queue pair or SRQ (Sync).
unsafe impl Sync for RecvQueue {}

impl Drop for RecvQueue {
    fn drop(&mut self) {
        match &self.owner {
            Owner::Qp(qp) => {
                if let Some(r) = &qp.inner.recv_ring {
                    r.give_back();
                }
            }
            Owner::Srq(srq) => srq.ring_cell().give_back(),
        }
    }
}

impl std::fmt::Debug for RecvQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecvQueue")
            .field("srq", &!self.qp_queue)
            .finish()
    }
}

impl QueuePair {
    /// The receive queue's exclusive posting handle.
    ///
    /// # Errors
    /// [`Error::ReceivesThroughSrq`] for a queue pair that receives through
    /// an SRQ (or an XRC send queue pair); [`Error::QueueTaken`] while
    /// another handle has the queue.
    pub fn recv_queue(&self) -> Result<RecvQueue> {
        let Some(cell) = &self.inner.recv_ring else {
            return Err(Error::ReceivesThroughSrq);
        };
        let _control = self.inner.control.lock();
        let ring = cell.take().ok_or(Error::QueueTaken {
            queue: "receive queue",
        })?;
        // SAFETY: the same function type but for the queue's pointer type,
        // which the ABI does not see (pointers of any type pass alike).
        let post_fn = unsafe {
            std::mem::transmute::<super::PostRecvFn, RecvPostFn>(self.inner.post_recv_fn)
        };
        Ok(RecvQueue::new(
            ring,
            post_fn,
            self.as_ptr().cast(),
            self.pd(),
            self.inner.caps.max_recv_sge,
            cell.depth(),
            Owner::Qp(self.clone()),
        ))
    }
}

impl SharedReceiveQueue {
    /// The SRQ's exclusive posting handle.
    ///
    /// # Errors
    /// [`Error::QueueTaken`] while another handle has the queue.
    pub fn recv_queue(&self) -> Result<RecvQueue> {
        let cell = self.ring_cell();
        let ring = cell.take().ok_or(Error::QueueTaken {
            queue: "shared receive queue",
        })?;
        Ok(RecvQueue::new(
            ring,
            self.post_fn(),
            self.as_ptr().cast(),
            self.pd(),
            self.max_sge(),
            cell.depth(),
            Owner::Srq(self.clone()),
        ))
    }
}

impl RecvQueue {
    /// The handle of `owner`'s receive queue: its `ring` (taken from its
    /// cell), the provider's `post_fn` and the queue's C object `target`;
    /// the protection domain, SGEs per receive and depth of the queue.
    #[inline(always)]
    fn new(
        ring: NonNull<Ring>,
        post_fn: RecvPostFn,
        target: *mut std::ffi::c_void,
        pd: &ProtectionDomain,
        max_sge: u32,
        depth: u32,
        owner: Owner,
    ) -> RecvQueue {
        RecvQueue {
            ring,
            post_fn,
            target,
            pd: Arc::as_ptr(&pd.inner).cast(),
            qp_queue: matches!(owner, Owner::Qp(_)),
            max_sge,
            // One SGE, never empty (`recv`): set once.
            wr: sys::ibv_recv_wr {
                num_sge: 1,
                ..Default::default()
            },
            sge: sys::ibv_sge::default(),
            scratch: RecvScratch::new(depth, max_sge),
            owner,
        }
    }

    /// The queue pair whose receive queue this is (`None` for an SRQ's).
    pub fn qp(&self) -> Option<&QueuePair> {
        match &self.owner {
            Owner::Qp(qp) => Some(qp),
            Owner::Srq(_) => None,
        }
    }

    /// A receive into `buf`; its completion reports `wr_id`.
    ///
    /// # Errors
    /// As [`post_chain`](Self::post_chain), for one request; the buffer
    /// comes back in the [`Refused`].
    #[inline]
    pub fn recv(&mut self, buf: impl DeviceWritable, wr_id: u64) -> Posted {
        let buf: Buf = buf.into();
        let region = buf.region();
        let common = self.max_sge >= 1
            && std::ptr::eq(Arc::as_ptr(&region.mr.pd.inner).cast(), self.pd)
            // 1 ..= u32::MAX bytes in one compare: an empty buffer goes
            // without an SGE, through the general path.
            && region.len().wrapping_sub(1) < u32::MAX as usize
            && !matches!(buf, Buf::Frozen(_))
            && region.mr.access.contains(crate::types::AccessFlags::LOCAL_WRITE);
        if !common {
            return self
                .post(RecvRequest::new_buf(buf).wr_id(wr_id))
                .map_err(|r| r.map(one));
        }
        if self.qp_queue && self.refused_in_err() {
            return Err(Refused {
                error: Error::QueuePairInError {
                    verb: "ibv_post_recv",
                },
                buf,
            });
        }
        let Some((slot, ahead)) = self.reserve() else {
            let queue = self.queue();
            let error = no_room(self.ring(), queue);
            return Err(Refused { error, buf });
        };
        self.sge = region.sge_prechecked();
        self.wr.wr_id = slot.wr_id;
        self.wr.sg_list = &mut self.sge;
        let ring = self.ring();
        ring.fill(&slot, wr_id, Payload::bufs(SgList::One(buf), None), true);
        ring.publish(&slot);
        let mut bad = std::ptr::null_mut();
        // SAFETY: live queue (held); one request (`next` NULL), its SGE in a
        // buffer the slot now owns.
        let rc = unsafe { (self.post_fn)(self.target, &mut self.wr, &mut bad) };
        if rc != 0 {
            let payload = self.ring().unpublish(slot);
            return Err(Refused {
                error: self.verb_error(rc),
                buf: one(payload.into_sg()),
            });
        }
        self.ring().advance(ahead + 1);
        self.after_doorbell();
        Ok(())
    }

    /// A receive scattering over several buffers (none frozen).
    ///
    /// # Errors
    /// As [`recv`](Self::recv); the buffers come back.
    pub fn recv_sgl(&mut self, bufs: Vec<Buf>, wr_id: u64) -> Posted<Vec<Buf>> {
        self.post(RecvRequest::sgl(bufs).wr_id(wr_id))
            .map_err(|r| r.map(many))
    }

    /// A receive without a buffer (`num_sge` 0): what an RDMA write with
    /// immediate data consumes at the target (its bytes land in the memory
    /// the write names, the immediate in the completion), or a
    /// zero-length send. A message with a payload finds no room in it: the
    /// receive and the send complete with errors and both queue pairs
    /// move to ERR.
    ///
    /// # Errors
    /// As [`recv`](Self::recv).
    pub fn recv_empty(&mut self, wr_id: u64) -> Result<()> {
        self.post(RecvRequest::empty().wr_id(wr_id))
            .map_err(|r| r.error)
    }

    /// Posts a chain of receives with one doorbell: the ones the device
    /// took leave `wrs`, the rest stay with the error.
    ///
    /// # Errors
    /// Checked first: [`Error::TooManySges`],
    /// [`Error::ForeignProtectionDomain`], [`Error::FrozenBuffer`],
    /// [`Error::MissingAccess`] (a buffer without `LOCAL_WRITE`),
    /// [`Error::OutOfRange`] (a buffer longer than an SGE describes); then
    /// [`Error::QueuePairInError`], [`Error::QueueFull`] (or
    /// [`Error::QueueHeldAfterReset`] after a reset), or [`Error::Verb`]
    /// naming `ibv_post_recv` (`ibv_post_srq_recv`).
    pub fn post_chain(&mut self, wrs: &mut Vec<RecvRequest>) -> Result<()> {
        let (posted, result) = self.post_requests(wrs);
        wrs.drain(..posted);
        result
    }

    /// The SRQ whose queue this is (an SRQ's handle only).
    pub(super) fn srq(&self) -> &SharedReceiveQueue {
        match &self.owner {
            Owner::Srq(srq) => srq,
            Owner::Qp(_) => unreachable!("called on an SRQ's handle"),
        }
    }

    /// SGEs per receive.
    pub(super) fn max_sge(&self) -> u32 {
        self.max_sge
    }

    /// The ring's id.
    pub(super) fn ring_id(&self) -> u32 {
        match &self.owner {
            Owner::Qp(qp) => qp.inner.recv_ring.as_ref().map_or(0, super::RingCell::id),
            Owner::Srq(srq) => srq.ring_cell().id(),
        }
    }

    /// A slot for a prepared receive (after the ERR check).
    pub(super) fn reserve_prepared(&mut self) -> Result<(Reserved, u32)> {
        if self.qp_queue && self.refused_in_err() {
            return Err(Error::QueuePairInError {
                verb: "ibv_post_recv",
            });
        }
        match self.reserve() {
            Some(s) => Ok(s),
            None => {
                let queue = self.queue();
                Err(no_room(self.ring(), queue))
            }
        }
    }

    /// Rings the doorbell for one C request the caller built (its `wr_id`
    /// a slot's, published): the provider's code.
    #[inline(always)]
    pub(super) fn post_raw_one(&mut self, wr: &mut sys::ibv_recv_wr) -> i32 {
        let mut bad = std::ptr::null_mut();
        // SAFETY: live queue (held); the caller's request, one (`next`
        // NULL), its SGEs in buffers that outlive its completion.
        unsafe { (self.post_fn)(self.target, wr, &mut bad) }
    }

    /// [`verb_error`](Self::verb_error), for prepared receives.
    pub(super) fn verb_error_of(&self, rc: i32) -> Error {
        self.verb_error(rc)
    }

    /// [`after_doorbell`](Self::after_doorbell), for prepared receives.
    pub(super) fn after_doorbell_of(&self) {
        self.after_doorbell();
    }

    /// The ring (this handle has it).
    #[inline(always)]
    pub(super) fn ring(&mut self) -> &mut Ring {
        // SAFETY: the handle has the ring (RingCell::take) until dropped.
        unsafe { self.ring.as_mut() }
    }

    /// The queue's name in errors.
    fn queue(&self) -> &'static str {
        if self.qp_queue {
            "receive queue"
        } else {
            "shared receive queue"
        }
    }

    /// The queue pair is in ERR or going there (never for an SRQ).
    #[inline(always)]
    fn refused_in_err(&self) -> bool {
        match &self.owner {
            Owner::Qp(qp) => qp.recv_refused(),
            Owner::Srq(_) => false,
        }
    }

    /// After a doorbell of a queue pair's receive: if a move to ERR began
    /// meanwhile, its flush may have missed the receive, so the queue pair
    /// is moved to ERR once more (the fence pairs with the one after the
    /// move announced itself: either the check before the doorbell saw
    /// the flag, or this one does, or the flush saw the receive).
    #[inline(always)]
    fn after_doorbell(&self) {
        if let Owner::Qp(qp) = &self.owner {
            fence(Ordering::SeqCst);
            if qp.recv_refused() {
                qp.reflush_receives();
            }
        }
    }

    /// The provider's refusal, named by its verb.
    #[cold]
    fn verb_error(&self, rc: i32) -> Error {
        if !self.qp_queue {
            return crate::error::errno_error("ibv_post_srq_recv", rc);
        }
        let e = crate::error::errno_error("ibv_post_recv", rc);
        // Providers that check the state refuse receives in RESET (IBA
        // C10-97.2.1) with a bare EINVAL: say so.
        let reset = rc == libc::EINVAL
            && matches!(&self.owner, Owner::Qp(qp) if matches!(qp.state(), Ok(QpState::Reset)));
        e.with_hint(
            reset.then(|| "the queue pair is in RESET: receives need INIT or later".to_string()),
        )
    }

    /// The next free slot: the head of a queue pair's queue (it completes
    /// in order), or the first free one from there for an SRQ's (out of
    /// order); and how far past the head it is.
    #[inline(always)]
    fn reserve(&mut self) -> Option<(Reserved, u32)> {
        let qp_queue = self.qp_queue;
        let ring = self.ring();
        if qp_queue {
            return ring.reserve_head().map(|s| (s, 0));
        }
        (0..ring.depth()).find_map(|k| ring.reserve(k).map(|s| (s, k)))
    }

    /// Posts one receive built as a value ([`RecvRequest`]: a scatter
    /// list, a buffer of any kind, an owner's mark), checked as
    /// [`post_chain`](Self::post_chain) checks each. Takes no `Vec`, so it
    /// allocates nothing; [`recv`](Self::recv) is the same for one buffer.
    ///
    /// # Errors
    /// As [`post_chain`](Self::post_chain); the request's buffers come back
    /// in the [`Refused`](crate::qp::Refused).
    ///
    /// # References
    /// `ibv_post_recv(3)`
    #[doc(alias = "ibv_post_recv")]
    pub fn post(&mut self, r: RecvRequest) -> Posted<SgList> {
        let mut one = [r];
        match self.post_requests(&mut one) {
            (1, _) => Ok(()),
            (_, result) => {
                let [r] = one;
                Err(Refused {
                    error: result.err().unwrap_or(Error::Unsupported("refused")),
                    buf: r.into_buffers(),
                })
            }
        }
    }

    /// Posts `wrs` with one doorbell: how many the device took (from the
    /// front), and the error if not all.
    pub(crate) fn post_requests(&mut self, wrs: &mut [RecvRequest]) -> (usize, Result<()>) {
        let n = wrs.len();
        if n == 0 {
            return (0, Ok(()));
        }
        let pd = match &self.owner {
            Owner::Qp(qp) => qp.pd().clone(),
            Owner::Srq(srq) => srq.pd().clone(),
        };
        for r in wrs.iter() {
            if let Err(e) = check_bufs(&r.sg, &pd, true, self.max_sge, "receive") {
                return (0, Err(e));
            }
        }
        if self.qp_queue && self.refused_in_err() {
            return (
                0,
                Err(Error::QueuePairInError {
                    verb: "ibv_post_recv",
                }),
            );
        }
        let queue = self.queue();
        let qp_queue = self.qp_queue;
        let bufs = self.scratch.bufs();
        let slots = &mut bufs.slots;
        slots.clear();
        // SAFETY: the handle has the ring.
        let ring = unsafe { self.ring.as_mut() };
        if u32::try_from(n).map_or(true, |n| n > ring.depth()) {
            let error = Error::QueueFull {
                queue,
                depth: ring.depth(),
            };
            return (0, Err(error));
        }
        // A queue pair's: the next `n` positions. An SRQ's: the first `n`
        // free ones from the head (positions past the last one taken are
        // skipped for this lap).
        let mut k = 0;
        while slots.len() < n {
            match ring.reserve(k) {
                Some(s) => slots.push(s),
                None if qp_queue || k + 1 >= ring.depth() => {
                    slots.clear();
                    return (0, Err(no_room(ring, queue)));
                }
                None => {}
            }
            k += 1;
        }
        for (r, s) in wrs.iter_mut().zip(slots.iter()) {
            ring.fill(
                s,
                r.wr_id,
                Payload::bufs(std::mem::take(&mut r.sg), None),
                true,
            );
            if r.owner != 0 {
                ring.set_owner(s, r.owner);
            }
        }
        for s in slots.iter() {
            ring.publish(s);
        }
        let max_sge = bufs.max_sge;
        let base = bufs.wrs.as_mut_ptr();
        for (i, s) in slots.iter().enumerate() {
            let sges = &mut bufs.sges[i * max_sge..(i + 1) * max_sge];
            // SAFETY: filled above, not yet seen by the device.
            let num_sge = fill_sges(unsafe { s.sg() }, sges);
            bufs.wrs[i] = sys::ibv_recv_wr {
                wr_id: s.wr_id,
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
        // SAFETY: live queue; the chain lives in the scratch, its SGEs point
        // into buffers the slots own.
        let rc = unsafe { (self.post_fn)(self.target, base, &mut bad) };
        let posted = posted_count(rc, base, bad, n);
        let last = slots.get(posted.wrapping_sub(1)).map(|s| s.wr_id);
        for (r, s) in wrs.iter_mut().zip(slots.drain(..)).skip(posted) {
            r.sg = ring.unpublish(s).into_sg();
        }
        // The head moves past the last slot posted.
        if let Some(last) = last {
            let ahead = ring.ahead_of(last);
            ring.advance(ahead + 1);
        }
        let result = match rc {
            0 => Ok(()),
            rc => Err(self.verb_error(rc)),
        };
        if posted > 0 {
            self.after_doorbell();
        }
        (posted, result)
    }
}

/// The one buffer of a request that had one.
fn one(sg: SgList) -> Buf {
    match sg {
        SgList::One(b) => b,
        SgList::Many(mut v) if v.len() == 1 => v.pop().expect("one"),
        _ => unreachable!("a one-buffer request"),
    }
}

/// The buffers of a scatter/gather request.
fn many(sg: SgList) -> Vec<Buf> {
    match sg {
        SgList::Many(v) => v,
        SgList::One(b) => vec![b],
        SgList::Empty => Vec::new(),
    }
}
