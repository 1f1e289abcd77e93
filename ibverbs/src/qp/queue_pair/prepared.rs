//! Prepared requests: checked and built once, posted many times
//! (DESIGN.md, "Prepared requests").
//!
//! A prepared request keeps its buffers for its whole life; each posting
//! takes a slot of its queue's ring with an empty payload, so its
//! completion is claimed like any other and hands back no buffer. The
//! bytes are reachable only when no posting is outstanding: the request
//! remembers the `wr_id` of its last posting, and a queue pair's queues
//! complete in order, so once that slot no longer holds that `wr_id` every
//! posting was claimed (an SRQ completes out of order: every outstanding
//! posting is remembered). One load per check, no read-modify-write.

use std::sync::atomic::{AtomicU64, Ordering};

use rdma_verbs_sys as sys;

use super::post::{c_send_wr, fill_sges};
use super::recv_queue::RecvQueue;
use super::request::{RecvRequest, SendRequest};
use super::send_queue::{Refused, SendQueue};
use crate::address_handle::AddressHandle;
use crate::error::{Error, Result};
use crate::inflight::Reserved;
use crate::memory::buffer::{Buf, SgList};
use crate::qp::queue_pair::QueuePair;
use crate::types::SendOp;

/// A posting of a prepared request: its slot's state and its `wr_id`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Posting {
    state: &'static AtomicU64,
    wr_id: u64,
}

impl Posting {
    fn of(r: &Reserved) -> Posting {
        Posting {
            state: r.state(),
            wr_id: r.wr_id,
        }
    }

    /// Whether its completion was not claimed yet.
    #[inline(always)]
    pub(crate) fn outstanding(&self) -> bool {
        self.state.load(Ordering::Acquire) == self.wr_id
    }
}

/// The postings of a prepared request that may be outstanding.
#[derive(Debug)]
struct Postings {
    /// The last one (queues that complete in order).
    last: Option<Posting>,
    /// An SRQ's: all of them (room reserved for the SRQ's depth).
    many: Vec<Posting>,
    in_order: bool,
}

impl Postings {
    fn new(in_order: bool, depth: u32) -> Postings {
        Postings {
            last: None,
            many: if in_order {
                Vec::new()
            } else {
                Vec::with_capacity(depth as usize)
            },
            in_order,
        }
    }

    #[inline(always)]
    fn record(&mut self, p: Posting) {
        if self.in_order {
            self.last = Some(p);
        } else {
            self.many.retain(Posting::outstanding);
            self.many.push(p);
        }
    }

    #[inline(always)]
    fn any_outstanding(&self) -> bool {
        match self.last {
            Some(p) => p.outstanding(),
            None => self.many.iter().any(Posting::outstanding),
        }
    }

    /// What is still outstanding, for a deferred release.
    fn outstanding(&self) -> Vec<Posting> {
        self.last
            .iter()
            .chain(self.many.iter())
            .filter(|p| p.outstanding())
            .copied()
            .collect()
    }
}

/// Buffers a prepared request dropped while postings were outstanding:
/// released once none is (checked when a handle of the queue is taken,
/// and after the queue is destroyed or reset).
pub(crate) struct Deferred {
    postings: Vec<Posting>,
    _sg: SgList,
    _ah: Option<AddressHandle>,
}

impl Deferred {
    /// Whether the device may still use the buffers.
    pub(crate) fn outstanding(&self) -> bool {
        self.postings.iter().any(Posting::outstanding)
    }
}

/// A send request checked and built once, posted again and again through
/// its queue pair's [`SendQueue::post_prepared`]: C's reused
/// `ibv_send_wr`. It keeps its buffers; each posting's completion reports
/// its `wr_id` and hands back none. Postings must be signaled.
///
/// Its buffers cannot be read while the device may be reading (or, for a
/// read or atomic, writing) them:
/// ```ignore
#[doc = include_str!("../../../tests/ui/prepared_send_bytes_across_post.rs")]
/// ```
pub struct PreparedSend {
    wr: Box<(sys::ibv_send_wr, Vec<sys::ibv_sge>, Vec<u8>)>,
    sg: SgList,
    ah: Option<AddressHandle>,
    wr_id: u64,
    ring_id: u32,
    postings: Postings,
    qp: QueuePair,
}

// SAFETY: the C request's pointers point into the request's own boxed SGEs
// and inline bytes and into buffers it owns; used through `&mut self`.
unsafe impl Send for PreparedSend {}
// SAFETY: `&self` gives only reads of plain data.
unsafe impl Sync for PreparedSend {}

impl std::fmt::Debug for PreparedSend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PreparedSend")
            .field("wr_id", &self.wr_id)
            .field("posted", &self.is_posted())
            .finish()
    }
}

impl Drop for PreparedSend {
    fn drop(&mut self) {
        defer(
            &self.qp.inner.send_ring,
            &self.postings,
            &mut self.sg,
            &mut self.ah,
        );
    }
}

/// Hands buffers whose postings may be outstanding to the queue's ring,
/// which releases them once none is (DESIGN.md: when in doubt, keep).
fn defer(
    cell: &super::RingCell,
    postings: &Postings,
    sg: &mut SgList,
    ah: &mut Option<AddressHandle>,
) {
    let outstanding = postings.outstanding();
    if outstanding.is_empty() {
        return;
    }
    cell.defer(Deferred {
        postings: outstanding,
        _sg: std::mem::take(sg),
        _ah: ah.take(),
    });
}

impl SendQueue {
    /// Checks `wr` and builds its C request once, for
    /// [`post_prepared`](Self::post_prepared). The request must be
    /// signaled (an unsignaled posting would have no completion to end
    /// it).
    ///
    /// # Errors
    /// [`Error::PreparedUnsignaled`], or as
    /// [`post_chain`](Self::post_chain) (the checks; not the queue's room):
    /// the buffers come back.
    pub fn prepare(
        &mut self,
        mut wr: SendRequest<'_>,
    ) -> std::result::Result<PreparedSend, Refused<SgList>> {
        let qp = self.qp().clone();
        let checked = if !wr.is_signaled() && !qp.inner.sq_sig_all {
            Err(Error::PreparedUnsignaled)
        } else if qp.inner.qpx.is_some() {
            Err(Error::Unsupported(
                "prepared requests on a queue pair created with send_ops (post_chain them)",
            ))
        } else {
            qp.check_send(&wr, false)
        };
        if let Err(error) = checked {
            return Err(Refused {
                error,
                buf: wr.into_buffers(),
            });
        }
        let inline = wr.inline.map(<[u8]>::to_vec).unwrap_or_default();
        let mut c = c_send_wr(&wr);
        let sg = std::mem::take(&mut wr.sg);
        let sges = vec![sys::ibv_sge::default(); sg.len().max(1)];
        let mut boxed = Box::new((c, sges, inline));
        let (cw, sges, inline) = &mut *boxed;
        let num_sge = if wr.inline.is_some() {
            sges[0] = super::post::inline_sge(inline);
            usize::from(!inline.is_empty())
        } else {
            fill_sges(&sg, sges)
        };
        cw.sg_list = sges.as_mut_ptr();
        cw.num_sge = num_sge as i32;
        c = *cw;
        let _ = c;
        Ok(PreparedSend {
            wr: boxed,
            sg,
            ah: wr.ud.take().and_then(super::request::Dest::into_ah),
            wr_id: wr.wr_id,
            ring_id: qp.inner.send_ring.id(),
            postings: Postings::new(true, 0),
            qp,
        })
    }

    /// Posts a prepared request once more.
    ///
    /// # Errors
    /// [`Error::NotThisQueue`] for a request prepared on another queue
    /// pair; [`Error::QueueFull`] (or [`Error::QueueHeldAfterReset`]);
    /// [`Error::Verb`] naming `ibv_post_send`. Nothing was posted then.
    #[inline]
    pub fn post_prepared(&mut self, p: &mut PreparedSend) -> Result<()> {
        // Ring ids are unique among live rings, and `p` keeps its own
        // queue pair's alive.
        if p.ring_id != self.ring_id {
            return Err(Error::NotThisQueue {
                what: "prepared request",
            });
        }
        let wr_id = p.wr_id;
        let ring = self.ring();
        let Some(slot) = ring.reserve_head() else {
            return Err(super::send_queue::no_room(ring, "send queue"));
        };
        ring.fill_empty(&slot, wr_id);
        ring.publish(&slot);
        p.wr.0.wr_id = slot.wr_id;
        let rc = self.post_raw_one(&mut p.wr.0);
        let ring = self.ring();
        if rc != 0 {
            ring.unpublish(slot);
            return Err(crate::error::errno_error("ibv_post_send", rc));
        }
        // A send queue completes in order: the last posting is enough.
        p.postings.last = Some(Posting::of(&slot));
        ring.advance_one();
        Ok(())
    }
}

impl PreparedSend {
    /// Sets the operands of a prepared compare-and-swap for the postings
    /// that follow.
    ///
    /// # Errors
    /// [`Error::WrongOperation`] when the request is not a
    /// compare-and-swap.
    #[inline]
    pub fn set_compare_swap(&mut self, compare: u64, swap: u64) -> Result<()> {
        if self.wr.0.opcode != sys::IBV_WR_ATOMIC_CMP_AND_SWP {
            return Err(Error::WrongOperation {
                expected: SendOp::CompareAndSwap,
            });
        }
        self.wr.0.wr.atomic.compare_add = compare;
        self.wr.0.wr.atomic.swap = swap;
        Ok(())
    }

    /// Sets the addend of a prepared fetch-and-add for the postings that
    /// follow.
    ///
    /// # Errors
    /// [`Error::WrongOperation`] when the request is not a fetch-and-add.
    #[inline]
    pub fn set_add(&mut self, add: u64) -> Result<()> {
        if self.wr.0.opcode != sys::IBV_WR_ATOMIC_FETCH_AND_ADD {
            return Err(Error::WrongOperation {
                expected: SendOp::FetchAndAdd,
            });
        }
        self.wr.0.wr.atomic.compare_add = add;
        Ok(())
    }

    /// Whether a posting may still be outstanding (its completion not yet
    /// claimed).
    #[inline]
    pub fn is_posted(&self) -> bool {
        self.postings.any_outstanding()
    }

    /// The `wr_id` each posting's completion reports.
    #[inline]
    pub fn wr_id(&self) -> u64 {
        self.wr_id
    }

    /// The queue pair the request posts to.
    pub fn queue_pair(&self) -> &QueuePair {
        &self.qp
    }

    /// The buffers, or `None` while a posting is outstanding.
    pub fn buffers(&mut self) -> Option<&SgList> {
        (!self.is_posted()).then_some(&self.sg)
    }

    /// The bytes of buffer `index`, or `None` while a posting is
    /// outstanding (or for a [`SharedBuffer`](crate::SharedBuffer), whose
    /// bytes peers may change). One load, no read-modify-write.
    #[inline]
    pub fn bytes(&self, index: usize) -> Option<&[u8]> {
        bytes_of(&self.postings, &self.sg, index)
    }

    /// The bytes of buffer `index` to change before the next posting, or
    /// `None` while a posting is outstanding (or for a frozen or shared
    /// buffer).
    #[inline]
    pub fn bytes_mut(&mut self, index: usize) -> Option<&mut [u8]> {
        bytes_mut_of(&self.postings, &mut self.sg, index)
    }

    /// Gives the buffers back, or the request itself while a posting is
    /// outstanding.
    ///
    /// # Errors
    /// `self`, unchanged, while [`is_posted`](Self::is_posted).
    #[allow(clippy::result_large_err)]
    pub fn into_buffers(mut self) -> std::result::Result<SgList, PreparedSend> {
        if self.is_posted() {
            return Err(self);
        }
        Ok(std::mem::take(&mut self.sg))
    }
}

/// A receive request checked and built once, posted again and again
/// through its queue's [`RecvQueue::post_prepared`]; its buffers are the
/// request's, reachable only once every posting was claimed:
/// ```ignore
#[doc = include_str!("../../../tests/ui/prepared_recv_bytes_across_post.rs")]
/// ```
pub struct PreparedRecv {
    wr: Box<(sys::ibv_recv_wr, Vec<sys::ibv_sge>)>,
    sg: SgList,
    wr_id: u64,
    /// The queue it posts to: its ring's id, and the cell to defer to.
    ring_id: u32,
    owner: RecvOwner,
    postings: Postings,
}

/// The queue a prepared receive belongs to.
enum RecvOwner {
    Qp(QueuePair),
    Srq(crate::qp::shared_receive_queue::SharedReceiveQueue),
}

impl RecvOwner {
    fn cell(&self) -> &super::RingCell {
        match self {
            RecvOwner::Qp(qp) => qp.inner.recv_ring.as_ref().expect("a receive queue"),
            RecvOwner::Srq(srq) => srq.ring_cell(),
        }
    }
}

// SAFETY: as PreparedSend's.
unsafe impl Send for PreparedRecv {}
// SAFETY: as PreparedSend's.
unsafe impl Sync for PreparedRecv {}

impl std::fmt::Debug for PreparedRecv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PreparedRecv")
            .field("wr_id", &self.wr_id)
            .field("posted", &self.is_posted())
            .finish()
    }
}

impl Drop for PreparedRecv {
    fn drop(&mut self) {
        defer(self.owner.cell(), &self.postings, &mut self.sg, &mut None);
    }
}

impl RecvQueue {
    /// Checks `wr` and builds its C request once, for
    /// [`post_prepared`](Self::post_prepared).
    ///
    /// # Errors
    /// As [`post_chain`](Self::post_chain)'s checks: the buffers come back.
    pub fn prepare(
        &mut self,
        mut wr: RecvRequest,
    ) -> std::result::Result<PreparedRecv, Refused<SgList>> {
        let (pd, owner, cell_depth) = match self.qp() {
            Some(qp) => (
                qp.pd().clone(),
                RecvOwner::Qp(qp.clone()),
                qp.recv_capacity(),
            ),
            None => {
                let srq = self.srq().clone();
                (
                    srq.pd().clone(),
                    RecvOwner::Srq(srq.clone()),
                    srq.capacity(),
                )
            }
        };
        if let Err(error) = super::post::check_bufs(&wr.sg, &pd, true, self.max_sge(), "receive") {
            return Err(Refused {
                error,
                buf: wr.into_buffers(),
            });
        }
        let sg = std::mem::take(&mut wr.sg);
        let mut boxed = Box::new((
            sys::ibv_recv_wr::default(),
            vec![sys::ibv_sge::default(); sg.len().max(1)],
        ));
        let (cw, sges) = &mut *boxed;
        let num_sge = fill_sges(&sg, sges);
        cw.sg_list = sges.as_mut_ptr();
        cw.num_sge = num_sge as i32;
        let in_order = matches!(owner, RecvOwner::Qp(_));
        Ok(PreparedRecv {
            wr: boxed,
            sg,
            wr_id: wr.wr_id,
            ring_id: owner.cell().id(),
            postings: Postings::new(in_order, cell_depth),
            owner,
        })
    }

    /// Posts a prepared receive once more.
    ///
    /// # Errors
    /// [`Error::NotThisQueue`] for a request prepared on another queue;
    /// [`Error::QueuePairInError`], [`Error::QueueFull`] (or
    /// [`Error::QueueHeldAfterReset`]), [`Error::Verb`] naming
    /// `ibv_post_recv` (`ibv_post_srq_recv`). Nothing was posted then.
    #[inline]
    pub fn post_prepared(&mut self, p: &mut PreparedRecv) -> Result<()> {
        if p.ring_id != self.ring_id() {
            return Err(Error::NotThisQueue {
                what: "prepared receive",
            });
        }
        let wr_id = p.wr_id;
        let slot = self.reserve_prepared()?;
        let ring = self.ring();
        ring.fill_empty(&slot.0, wr_id);
        ring.publish(&slot.0);
        p.wr.0.wr_id = slot.0.wr_id;
        let rc = self.post_raw_one(&mut p.wr.0);
        if rc != 0 {
            self.ring().unpublish(slot.0);
            return Err(self.verb_error_of(rc));
        }
        p.postings.record(Posting::of(&slot.0));
        self.ring().advance(slot.1 + 1);
        self.after_doorbell_of();
        Ok(())
    }
}

// The same accessors as PreparedSend's, each type documenting its own; the
// rule they rest on (no bytes while a posting may be outstanding) is written
// once, in `bytes_of` and `bytes_mut_of`.
impl PreparedRecv {
    /// Whether a posting may still be outstanding (its completion not yet
    /// claimed).
    #[inline]
    pub fn is_posted(&self) -> bool {
        self.postings.any_outstanding()
    }

    /// The `wr_id` each posting's completion reports.
    #[inline]
    pub fn wr_id(&self) -> u64 {
        self.wr_id
    }

    /// The buffers, or `None` while a posting is outstanding.
    pub fn buffers(&mut self) -> Option<&SgList> {
        (!self.is_posted()).then_some(&self.sg)
    }

    /// The bytes of buffer `index` (what the last message wrote there), or
    /// `None` while a posting is outstanding. One load, no
    /// read-modify-write.
    #[inline]
    pub fn bytes(&self, index: usize) -> Option<&[u8]> {
        bytes_of(&self.postings, &self.sg, index)
    }

    /// The bytes of buffer `index`, writable, or `None` while a posting is
    /// outstanding.
    #[inline]
    pub fn bytes_mut(&mut self, index: usize) -> Option<&mut [u8]> {
        bytes_mut_of(&self.postings, &mut self.sg, index)
    }

    /// Gives the buffers back, or the request itself while a posting is
    /// outstanding.
    ///
    /// # Errors
    /// `self`, unchanged, while [`is_posted`](Self::is_posted).
    #[allow(clippy::result_large_err)]
    pub fn into_buffers(mut self) -> std::result::Result<SgList, PreparedRecv> {
        if self.is_posted() {
            return Err(self);
        }
        Ok(std::mem::take(&mut self.sg))
    }
}

/// The bytes of buffer `index` of a prepared request's `sg`: none while
/// one of its `postings` may be outstanding (the device may be reading or
/// writing them), nor of a shared buffer (its peers may change them).
#[inline(always)]
fn bytes_of<'a>(postings: &Postings, sg: &'a SgList, index: usize) -> Option<&'a [u8]> {
    if postings.any_outstanding() {
        return None;
    }
    match sg.iter().nth(index)? {
        Buf::Local(b) => Some(b),
        Buf::Frozen(b) => Some(b),
        Buf::Shared(_) => None,
    }
}

/// The bytes of buffer `index` of a prepared request's `sg`, writable: as
/// [`bytes_of`], and of a local buffer only (a frozen buffer's bytes never
/// change).
#[inline(always)]
fn bytes_mut_of<'a>(postings: &Postings, sg: &'a mut SgList, index: usize) -> Option<&'a mut [u8]> {
    if postings.any_outstanding() {
        return None;
    }
    let b = match sg {
        SgList::One(b) if index == 0 => b,
        SgList::Many(v) => v.get_mut(index)?,
        _ => return None,
    };
    match b {
        Buf::Local(b) => Some(b),
        _ => None,
    }
}
