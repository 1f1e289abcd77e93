//! Queue pairs: creation ([`QueuePairBuilder`]), state changes
//! ([`QpAttr`], [`QueuePair::modify`], connect helpers) and the posting
//! handles of their queues ([`SendQueue`], [`RecvQueue`]).

use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;

use rdma_verbs_sys as sys;

use crate::cq::completion_queue::CompletionQueue;
use crate::device::event_routing::{AsyncEventReceiver, QpId};
use crate::device::event_routing::{Kind, Registration};
use crate::inflight::Ring;
use crate::memory::protection_domain::ProtectionDomain;
use crate::qp::shared_receive_queue::SharedReceiveQueue;
use crate::types::{QpNumber, QpType, SendOpFlags};

mod attr;
mod builder;
mod connect;
mod ece;
mod local_port;
mod multicast;
mod options;
mod post;
mod post_ex;
mod prepared;
mod raw;
mod recv_queue;
mod request;
mod ring_cell;
mod send_queue;
mod transition;
mod window;
pub(crate) use recv_queue::RecvPostFn;
pub(crate) use ring_cell::RingCell;

pub use attr::{PathMigState, QpAttr, QpAttrView};
pub use builder::QueuePairBuilder;
pub use connect::ConnectOptions;
pub use ece::Ece;
pub use local_port::LocalPort;

pub use post_ex::{FlushLevel, FlushType};
pub use prepared::{PreparedRecv, PreparedSend};
pub use recv_queue::RecvQueue;
pub use request::{RecvRequest, SendRequest, UdDest};
pub(crate) use send_queue::no_room as no_room_of;
pub use send_queue::{Posted, Refused, SendQueue, Wr};

/// The capacities a queue pair actually got (may exceed what was asked).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QpCaps {
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth (0 with an SRQ).
    pub max_recv_wr: u32,
    /// SGEs per send request.
    pub max_send_sge: u32,
    /// SGEs per receive request.
    pub max_recv_sge: u32,
    /// Largest inline send.
    pub max_inline_data: u32,
}

impl QpCaps {
    pub(crate) fn from_raw(c: &sys::ibv_qp_cap) -> QpCaps {
        QpCaps {
            max_send_wr: c.max_send_wr,
            max_recv_wr: c.max_recv_wr,
            max_send_sge: c.max_send_sge,
            max_recv_sge: c.max_recv_sge,
            max_inline_data: c.max_inline_data,
        }
    }
}

/// The provider's `post_send` (`ibv_context_ops::post_send`).
pub(crate) type PostSendFn = unsafe extern "C" fn(
    *mut sys::ibv_qp,
    *mut sys::ibv_send_wr,
    *mut *mut sys::ibv_send_wr,
) -> i32;
/// The provider's `post_recv` (`ibv_context_ops::post_recv`).
pub(crate) type PostRecvFn = unsafe extern "C" fn(
    *mut sys::ibv_qp,
    *mut sys::ibv_recv_wr,
    *mut *mut sys::ibv_recv_wr,
) -> i32;

/// What a context without a `post_send` gives (as `ibv_post_send` does).
unsafe extern "C" fn missing_post_send(
    _: *mut sys::ibv_qp,
    _: *mut sys::ibv_send_wr,
    _: *mut *mut sys::ibv_send_wr,
) -> i32 {
    libc::EOPNOTSUPP
}

/// What a context without a `post_recv` gives (as `ibv_post_recv` does).
unsafe extern "C" fn missing_post_recv(
    _: *mut sys::ibv_qp,
    _: *mut sys::ibv_recv_wr,
    _: *mut *mut sys::ibv_recv_wr,
) -> i32 {
    libc::EOPNOTSUPP
}

pub(crate) struct QpInner {
    pub(crate) qp: NonNull<sys::ibv_qp>,
    /// The provider's `post_send` and `post_recv`, read once from the
    /// context's ops when the QP was wrapped: the functions the
    /// `ibv_post_send`/`ibv_post_recv` inlines of `verbs.h` call on every
    /// post (libibverbs sets a context's ops before `ibv_open_device`
    /// returns, a stub for every op the provider lacks, and never changes
    /// them). The data path calls them without reading the context or
    /// testing for NULL each time.
    post_send_fn: PostSendFn,
    post_recv_fn: PostRecvFn,
    pub(crate) pd: ProtectionDomain,
    pub(crate) send_cq: CompletionQueue,
    pub(crate) recv_cq: CompletionQueue,
    pub(crate) srq: Option<SharedReceiveQueue>,
    pub(crate) qp_type: QpType,
    pub(crate) caps: QpCaps,
    pub(crate) sq_sig_all: bool,
    /// The send queue's slots in the in-flight store, and its posting
    /// handle's claim on them ([`QueuePair::send_queue`]).
    pub(crate) send_ring: RingCell,
    /// The receive queue's, unless it receives through an SRQ (or is an
    /// XRC send queue pair, which has none).
    pub(crate) recv_ring: Option<RingCell>,
    /// The extended QP and its `send_ops_flags` when created with
    /// `ibv_create_qp_ex` (the same object as `qp`).
    pub(crate) qpx: Option<(NonNull<sys::ibv_qp_ex>, SendOpFlags)>,
    /// Receives are refused: the QP is in ERR or going there (set before
    /// a move to ERR, cleared when a state change leaves it). `SeqCst`,
    /// with a fence on the receive path: a receive either sees it, or the
    /// flush of the move sees the receive (see `RecvQueue`).
    pub(crate) recv_err: AtomicBool,
    /// Held across every state change and the taking of a posting handle:
    /// the handles' rules (DESIGN.md, "Posting") are checked under it.
    pub(crate) control: parking_lot::Mutex<()>,
    /// The state this crate's last successful state change set
    /// (`IBV_QPS_*`; RESET at creation), written under `control`
    /// ([`QueuePair::note_state`]). [`QueuePair::modify`] checks
    /// transitions from it instead of asking the device each time: it is
    /// exact but for the moves a device makes on its own after errors (to
    /// ERR, or SQE for UC and UD), see `modify` for why that is enough.
    state: AtomicU32,
    /// The multicast groups (GID, LID) attached through this crate, behind
    /// their own lock, held across `ibv_attach_mcast`/`ibv_detach_mcast`
    /// (see `multicast.rs`). Never touched by the data path.
    pub(crate) mcast: parking_lot::Mutex<Vec<(crate::types::Gid, u16)>>,
    destroyed: bool,
    /// Its id for async events (event_routing.rs): registered at creation,
    /// leaves before the destroy.
    pub(crate) events: Registration,
}

/// The depth of a queue's ring: the depth `asked` for (at least one
/// slot), never more than the provider `granted` when it reports one. The
/// CQs are checked against it, as a C program sizes them: the safe path
/// keeps at most that many requests outstanding per queue (`QueueFull`
/// beyond), however much deeper the provider made the queue (rxe grants
/// 31 for 16).
fn ring_depth(asked: u32, granted: u32) -> u32 {
    let depth = asked.max(1);
    if granted == 0 {
        depth
    } else {
        depth.min(granted)
    }
}

/// Whether a queue pair in `state` (`ibv_qp::state`) may post sends:
/// anything but RESET, INIT and RTR (ERR flushes them).
#[inline]
pub(crate) fn state_sends(state: u32) -> bool {
    !(state == sys::IBV_QPS_RESET || state == sys::IBV_QPS_INIT || state == sys::IBV_QPS_RTR)
}

// SAFETY: QP verbs (post, modify, query, destroy) are thread-safe in
// libibverbs; each ring is used only by whoever holds its RingCell.
unsafe impl Send for QpInner {}
// SAFETY: as above.
unsafe impl Sync for QpInner {}

impl QpInner {
    fn teardown(&mut self) -> crate::error::Result<()> {
        // After ibv_destroy_qp returns the device no longer touches the
        // QP's work requests, so only then are their buffers released. No
        // move to ERR first: destroy alone stops the device, and the move
        // cost a system call and tripled rxe's teardown (DESIGN.md, hazard 4).
        // Before the destroy: the address may be reused once it returns.
        self.events.leave();
        // SAFETY: live QP, destroyed exactly once (callers guarantee it).
        let rc = unsafe { sys::ibv_destroy_qp(self.qp.as_ptr()) };
        let result = crate::error::ret_errno("ibv_destroy_qp", rc);
        // What the queues held may still be queued in the CQs, each charged
        // until a poll finds its CQ empty (DESIGN.md, "A CQ holds a
        // completion of every request"). No handle exists: each holds the
        // queue pair.
        let send = self.send_ring.get_mut();
        let id = send.id();
        let (payloads, queued) = send.teardown(false);
        self.send_cq.unregister(id, queued);
        release_after_destroy(rc == 0, payloads);
        if let Some(recv) = &mut self.recv_ring {
            let recv = recv.get_mut();
            let id = recv.id();
            let (payloads, queued) = recv.teardown(false);
            self.recv_cq.unregister(id, queued);
            release_after_destroy(rc == 0, payloads);
        }
        if rc != 0 {
            // The device may still use the slots: the rings are never
            // given back to the store.
            self.send_ring.leak();
            if let Some(recv) = &mut self.recv_ring {
                recv.leak();
            }
        }
        result
    }
}

/// Releases the payloads of a destroyed queue's outstanding requests: only
/// when the destroy verb succeeded (`destroyed`). Otherwise the queue may
/// still exist and the device may still read or write those buffers, so
/// they are leaked (`mem::forget`): their regions stay registered and their
/// memory allocated for good (DESIGN.md: when in doubt, leak).
pub(crate) fn release_after_destroy<T>(destroyed: bool, payloads: T) {
    if destroyed {
        drop(payloads);
    } else {
        std::mem::forget(payloads);
    }
}

impl Drop for QpInner {
    fn drop(&mut self) {
        // Errors cannot be reported from Drop; `QueuePair::close` reports them.
        if !self.destroyed {
            let _ = self.teardown();
        }
    }
}

/// A queue pair (`struct ibv_qp`) of type RC, UC or UD.
///
/// Cheap to clone. It keeps its PD, CQs and SRQ alive; work requests posted
/// through the safe API own their buffers until their completion is polled
/// (or until the QP is destroyed, after the device stopped using them).
///
/// # References
/// `ibv_create_qp(3)`, `ibv_modify_qp(3)`, `ibv_post_send(3)`, `ibv_post_recv(3)`
#[derive(Clone)]
pub struct QueuePair {
    pub(crate) inner: Arc<QpInner>,
}

impl QueuePair {
    /// Wraps a freshly created QP: sets up the in-flight tables and
    /// registers them with the CQs, whose capacity must hold every queue
    /// reporting to them (see [`CompletionQueue::register`]).
    ///
    /// # Errors
    /// [`Error::CqTooSmall`](crate::Error::CqTooSmall): the QP is destroyed
    /// (nothing was posted to it) and nothing stays registered.
    #[allow(clippy::too_many_arguments)] // one call site, in builder.rs
    pub(crate) fn from_created(
        qp: NonNull<sys::ibv_qp>,
        pd: ProtectionDomain,
        send_cq: CompletionQueue,
        recv_cq: CompletionQueue,
        srq: Option<SharedReceiveQueue>,
        qp_type: QpType,
        caps: QpCaps,
        asked: QpCaps,
        sq_sig_all: bool,
        qpx: Option<(NonNull<sys::ibv_qp_ex>, SendOpFlags)>,
    ) -> crate::error::Result<QueuePair> {
        // An XRC send queue pair has no receive queue: receives are refused
        // (`ReceivesThroughSrq`: they go to the receiver's XRC SRQ).
        let own_recv = srq.is_none() && qp_type != QpType::XrcSend;
        let rings = Ring::new(ring_depth(asked.max_send_wr, caps.max_send_wr)).and_then(|send| {
            let recv = match own_recv {
                true => Some(Ring::new(ring_depth(asked.max_recv_wr, caps.max_recv_wr))?),
                false => None,
            };
            Ok((send, recv))
        });
        let (send_ring, recv_ring) = match rings {
            Ok((s, r)) => (RingCell::new(s), r.map(RingCell::new)),
            Err(e) => {
                // SAFETY: just created, never shared: destroyed once, here.
                unsafe { sys::ibv_destroy_qp(qp.as_ptr()) };
                return Err(e);
            }
        };
        // SAFETY: a live QP (just created) points at its live context.
        let ops = unsafe { &(*(*qp.as_ptr()).context).ops };
        let post_send_fn = ops.post_send.unwrap_or(missing_post_send);
        let post_recv_fn = ops.post_recv.unwrap_or(missing_post_recv);
        // Owned from here: dropping it on an error below destroys the QP
        // (teardown), and unregisters what was registered.
        let qp = QueuePair {
            inner: Arc::new(QpInner {
                qp,
                post_send_fn,
                post_recv_fn,
                pd,
                send_cq,
                recv_cq,
                srq,
                qp_type,
                caps,
                sq_sig_all,
                qpx,
                send_ring,
                recv_ring,
                recv_err: AtomicBool::new(false),
                control: parking_lot::Mutex::new(()),
                // A new queue pair is in RESET.
                state: AtomicU32::new(sys::IBV_QPS_RESET),
                mcast: parking_lot::Mutex::new(Vec::new()),
                destroyed: false,
                events: Registration::new(Kind::Qp, qp.as_ptr()),
            }),
        };
        let inner = &qp.inner;
        // The CQs are checked against the depths asked for, as a C program
        // sizes them: providers may grant deeper queues (rxe about twice).
        let send = &inner.send_ring;
        inner.send_cq.register(send.id(), send.depth())?;
        if let Some(srq) = &inner.srq {
            srq.attach_cq(&inner.recv_cq)?;
        } else if let Some(recv) = &inner.recv_ring {
            inner.recv_cq.register(recv.id(), recv.depth())?;
        }
        Ok(qp)
    }

    /// Records a state change, or an attempt, for the handles' rules and
    /// [`modify`](Self::modify)'s checks: `set` is the state a successful
    /// `ibv_modify_qp` moved to, `None` when it failed (the state is as it
    /// was). Call with `control` held, after `ibv_modify_qp`.
    pub(crate) fn note_state(&self, set: Option<u32>) {
        let state = match set {
            Some(state) => {
                self.inner.state.store(state, Ordering::Relaxed);
                state
            }
            None => self.inner.state.load(Ordering::Relaxed),
        };
        self.inner
            .recv_err
            .store(state == sys::IBV_QPS_ERR, Ordering::SeqCst);
    }

    /// The state this crate's last successful state change set (see
    /// `QpInner::state`); no system call.
    #[inline]
    pub(crate) fn tracked_state(&self) -> u32 {
        self.inner.state.load(Ordering::Relaxed)
    }

    /// Announces a move to ERR before `ibv_modify_qp` runs: receives are
    /// refused from now on. Call with `control` held. A receive posting
    /// reads the flag again after its doorbell (both sides `SeqCst`):
    /// either it sees the flag, or the flush the move starts sees its
    /// request (see `RecvQueue`).
    pub(crate) fn note_err_pending(&self) {
        self.inner.recv_err.store(true, Ordering::SeqCst);
        std::sync::atomic::fence(Ordering::SeqCst);
    }

    /// A receive was posted while a move to ERR may have been under way
    /// (its posting saw the ERR bit after the doorbell): the flush that
    /// move started may have missed it. If the QP is in ERR, it is moved
    /// to ERR again, which flushes what its receive queue holds now. A
    /// failed re-issue leaves the receive unflushed: its buffers stay
    /// allocated for good (a leak, never a use after free).
    #[cold]
    #[inline(never)]
    pub(crate) fn reflush_receives(&self) {
        let _control = self.inner.control.lock();
        // `control`, held by every modify of this crate, keeps the state
        // from changing meanwhile.
        if self.tracked_state() != sys::IBV_QPS_ERR {
            // The move failed, or the QP was reset since: the receive is
            // either live or discarded with the queue.
            return;
        }
        let mut attr = sys::ibv_qp_attr {
            qp_state: sys::IBV_QPS_ERR,
            ..Default::default()
        };
        // SAFETY: live QP; `attr` outlives the call; ERR to ERR is a legal
        // transition (IBA 10.3.1: any state may move to ERR).
        let rc = unsafe {
            sys::ibv_modify_qp(
                self.as_ptr(),
                &mut attr,
                sys::ibv_qp_attr_mask::IBV_QP_STATE.0 as i32,
            )
        };
        self.note_state((rc == 0).then_some(sys::IBV_QPS_ERR));
    }

    /// Whether receives are refused: the QP is in ERR or going there (as
    /// this crate's modifies left it; a move to ERR the device made on its
    /// own is not seen here).
    #[inline(always)]
    pub(crate) fn recv_refused(&self) -> bool {
        self.inner.recv_err.load(Ordering::SeqCst)
    }

    /// The QP number.
    pub fn qp_num(&self) -> QpNumber {
        // SAFETY: `qp_num` is an immutable field of the live QP.
        QpNumber(unsafe { (*self.as_ptr()).qp_num })
    }

    /// The transport type.
    pub fn qp_type(&self) -> QpType {
        self.inner.qp_type
    }

    /// The capacities the QP got. The device may grant deeper queues than
    /// asked; the safe posting path holds at most the depths asked for
    /// ([`send_capacity`](Self::send_capacity),
    /// [`recv_capacity`](Self::recv_capacity)), the depths the CQs were
    /// checked against.
    pub fn caps(&self) -> QpCaps {
        self.inner.caps
    }

    /// The protection domain.
    pub fn pd(&self) -> &ProtectionDomain {
        &self.inner.pd
    }

    /// The send completion queue.
    pub fn send_cq(&self) -> &CompletionQueue {
        &self.inner.send_cq
    }

    /// The receive completion queue.
    pub fn recv_cq(&self) -> &CompletionQueue {
        &self.inner.recv_cq
    }

    /// The shared receive queue, if any.
    pub fn srq(&self) -> Option<&SharedReceiveQueue> {
        self.inner.srq.as_ref()
    }

    /// Requests posted through the send queue's handle whose completions
    /// were not claimed yet (a snapshot; prepared postings included).
    pub fn send_outstanding(&self) -> u32 {
        self.inner.send_ring.outstanding()
    }

    /// How many requests the safe path keeps outstanding on the send queue
    /// at once: the depth asked for at creation (a request beyond it is
    /// refused with [`Error::QueueFull`](crate::Error::QueueFull)), even
    /// when the device granted a deeper queue ([`caps`](Self::caps)).
    pub fn send_capacity(&self) -> u32 {
        self.inner.send_ring.depth()
    }

    /// As [`send_capacity`](Self::send_capacity), for the receive queue (0
    /// with an SRQ: see [`SharedReceiveQueue::capacity`]).
    pub fn recv_capacity(&self) -> u32 {
        self.inner.recv_ring.as_ref().map_or(0, RingCell::depth)
    }

    /// As [`send_outstanding`](Self::send_outstanding), for the receive
    /// queue (0 with an SRQ).
    pub fn recv_outstanding(&self) -> u32 {
        self.inner
            .recv_ring
            .as_ref()
            .map_or(0, RingCell::outstanding)
    }

    /// The raw QP pointer, valid while `self` lives.
    pub fn as_ptr(&self) -> *mut sys::ibv_qp {
        self.inner.qp.as_ptr()
    }

    /// `ibv_post_send(qp, wr, bad)`: the provider's `post_send`, resolved
    /// when the QP was created (see `QpInner::post_send_fn`).
    ///
    /// # Safety
    /// As `ibv_post_send(3)`: the caller must ensure that `wr` is a valid
    /// NULL-terminated chain whose memory stays valid as the verb requires,
    /// and that `bad` is valid for writes.
    #[inline(always)]
    pub(crate) unsafe fn provider_post_send(
        &self,
        wr: *mut sys::ibv_send_wr,
        bad: *mut *mut sys::ibv_send_wr,
    ) -> i32 {
        // SAFETY: live QP; the rest is the caller's contract.
        unsafe { (self.inner.post_send_fn)(self.as_ptr(), wr, bad) }
    }

    /// `ibv_post_recv(qp, wr, bad)`, as [`provider_post_send`](Self::provider_post_send).
    ///
    /// # Safety
    /// As `ibv_post_recv(3)`: the caller must ensure that `wr` is a valid
    /// NULL-terminated chain whose buffers stay valid as the verb requires,
    /// and that `bad` is valid for writes.
    #[inline(always)]
    pub(crate) unsafe fn provider_post_recv(
        &self,
        wr: *mut sys::ibv_recv_wr,
        bad: *mut *mut sys::ibv_recv_wr,
    ) -> i32 {
        // SAFETY: live QP; the rest is the caller's contract.
        unsafe { (self.inner.post_recv_fn)(self.as_ptr(), wr, bad) }
    }

    /// Destroys the QP now if this is the last handle, reporting a teardown
    /// error (`Ok(false)` when other handles still exist). Outstanding
    /// requests end with the QP, without completions, and their buffers are
    /// released after `ibv_destroy_qp` returned (the device stopped using
    /// them); to get them back with a flush status instead, move the QP to
    /// ERR ([`QueuePair::to_err`]) and poll before closing. If
    /// `ibv_destroy_qp` fails the device may still own them: they are leaked
    /// (kept allocated and registered for good), never freed.
    ///
    /// # Errors
    /// [`Error::Verb`](crate::Error::Verb) naming `ibv_destroy_qp`.
    #[doc(alias = "ibv_destroy_qp")]
    pub fn close(self) -> crate::error::Result<bool> {
        match Arc::try_unwrap(self.inner) {
            Ok(mut inner) => {
                let r = inner.teardown();
                inner.destroyed = true;
                r.map(|()| true)
            }
            Err(_) => Ok(false),
        }
    }
}

impl std::fmt::Debug for QueuePair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueuePair")
            .field("qp_num", &self.qp_num())
            .field("qp_type", &self.qp_type())
            .field("caps", &self.caps())
            .finish()
    }
}

impl QueuePair {
    /// This queue pair's identity in its asynchronous events
    /// ([`AsyncEvent::qp_id`](crate::device::AsyncEvent::qp_id)); unlike [`QueuePair::qp_num`], never reused.
    pub fn id(&self) -> QpId {
        crate::device::event_routing::qp_id(self.inner.events.id())
    }

    /// Subscribes to this queue pair's asynchronous events (`QP_FATAL`,
    /// `QP_REQ_ERR`, `QP_ACCESS_ERR`, `COMM_EST`, `SQ_DRAINED`,
    /// `QP_LAST_WQE_REACHED`, path migration), as routed by
    /// [`Context::route_async_event`](crate::Context::route_async_event). Each subscriber gets every event
    /// routed after it subscribed.
    ///
    /// # References
    /// `ibv_get_async_event(3)`
    pub fn async_events(&self) -> AsyncEventReceiver {
        self.inner.events.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use std::mem::size_of;
    use std::rc::Rc;

    use super::{ring_depth, QpInner};

    #[test]
    fn rings_hold_the_depth_asked_for() {
        assert_eq!(ring_depth(16, 31), 16);
        assert_eq!(ring_depth(0, 31), 1);
        // A provider reporting 0 for a field it left as asked.
        assert_eq!(ring_depth(16, 0), 16);
        // Never more slots than the device queue has.
        assert_eq!(ring_depth(16, 8), 8);
    }

    /// What the safe layer adds to a queue pair, besides libibverbs' own:
    /// the measured case of issue #19 (RC, 16 deep both ways). Its struct
    /// and, in the in-flight store, one 64-byte slot per entry asked for
    /// (a cache line: the state word, the caller's `wr_id`, the payload).
    /// Issue #19 measured 11 368 bytes before, 2 272 with 56-byte table
    /// slots and a 480-byte struct; data path 2.0 (#36) gives each slot a
    /// cache line of its own (no false sharing between a producer and a
    /// poller on neighbouring slots) and the struct shrank.
    #[test]
    fn a_queue_pair_costs_its_asked_depth() {
        let arc = 2 * size_of::<usize>();
        let slot = size_of::<crate::inflight::Slot>();
        let fixed = size_of::<QpInner>() + arc;
        let total = fixed + 2 * 16 * slot;
        eprintln!("per queue pair: {fixed} bytes of struct + 2 x 16 x {slot} of slots = {total}");
        assert_eq!(slot, 64);
        assert!(fixed <= 480, "{fixed} bytes of struct");
        assert!(total <= 480 + 2 * 16 * 64, "{total} bytes per queue pair");
    }

    #[test]
    fn payloads_are_released_only_after_a_successful_destroy() {
        let payload = Rc::new(());
        super::release_after_destroy(true, vec![payload.clone()]);
        assert_eq!(Rc::strong_count(&payload), 1, "kept after a destroy");
        // A failed destroy: the device may still own the buffers.
        super::release_after_destroy(false, vec![payload.clone()]);
        assert_eq!(
            Rc::strong_count(&payload),
            2,
            "freed after a failed destroy"
        );
    }
}
