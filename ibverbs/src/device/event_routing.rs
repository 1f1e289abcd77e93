//! Asynchronous events routed to the queue pair, SRQ or CQ they concern.
//!
//! Every QP, SRQ and CQ this library creates gets an id ([`QpId`],
//! [`SrqId`], [`CqId`]) from one process-wide counter, never reused. The
//! id is found from the C object's address in a registry the object joins
//! right after it is created and leaves right before it is destroyed, so
//! an address the allocator reuses for a later object never maps to an
//! earlier one's id. [`Context::get_async_event`] looks the address up
//! before it acknowledges the event, while the object is still alive
//! (`ibv_destroy_*` waits for that acknowledgement), so the id it reads is
//! the one of the object the event names. An object being destroyed (no
//! longer registered) or created outside this library has no id.
//!
//! Owners subscribe with [`QueuePair::async_events`],
//! [`SharedReceiveQueue::async_events`] or [`CompletionQueue::async_events`]
//! and get an [`AsyncEventReceiver`]. Nothing reads events behind the
//! user's back: whoever reads the context's events routes them with
//! [`Context::route_async_event`] (or [`AsyncEvent::route`] for an event
//! read elsewhere, as `rdma-verbs-tokio`'s stream does), which hands each event to the live subscribers of
//! its object and returns the events nobody took (port and device events,
//! objects without a subscriber), so no event is lost silently. Events
//! were acknowledged when read (see [`Context::get_async_event`]): routing
//! holds plain copies and never delays a destroy.
//!
//! No lock or allocation is added to the data path: the registry is
//! written when an object is created or destroyed and read when an event
//! arrives.

use std::collections::HashMap;
use std::num::NonZeroU64;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Mutex, MutexGuard};
use std::time::Duration;

use rdma_verbs_sys as sys;

use crate::types::{device_enum, PortNumber};

macro_rules! object_id {
    ($(#[$m:meta])* $name:ident) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(NonZeroU64);

        impl $name {
            /// The id as a number (unique in the process, never reused).
            pub fn get(self) -> u64 {
                self.0.get()
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "{}", self.0)
            }
        }
    };
}

object_id! {
    /// The identity of a [`QueuePair`](crate::QueuePair) for routing its asynchronous events:
    /// unlike its QP number, never reused in the process.
    QpId
}
object_id! {
    /// The identity of a [`SharedReceiveQueue`](crate::qp::SharedReceiveQueue) for routing its
    /// asynchronous events (`SRQ_LIMIT_REACHED`, `SRQ_ERR`); never reused
    /// in the process.
    SrqId
}
object_id! {
    /// The identity of a [`CompletionQueue`](crate::CompletionQueue) for routing its asynchronous
    /// events (`CQ_ERR`); never reused in the process.
    CqId
}

/// Which kind of C object an address is (the key keeps kinds apart).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Kind {
    Qp,
    Srq,
    Cq,
}

/// One process-wide counter for every id: ids never repeat.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

fn next_id() -> NonZeroU64 {
    let n = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    // 2^64 creations cannot happen; should the counter ever wrap, its 0
    // would read as 1, and ids would repeat only after that.
    NonZeroU64::new(n).unwrap_or(NonZeroU64::MIN)
}

#[derive(Default)]
struct Routes {
    /// Live objects by (kind, address of the C object) → id.
    ids: HashMap<(Kind, usize), NonZeroU64>,
    /// Subscribers by id; each gets a copy of every event of its object.
    subs: HashMap<NonZeroU64, Vec<mpsc::Sender<AsyncEvent>>>,
}

static ROUTES: Mutex<Option<Routes>> = Mutex::new(None);

/// The registry, poison ignored: every update leaves it consistent.
fn routes() -> MutexGuard<'static, Option<Routes>> {
    ROUTES.lock().unwrap_or_else(|p| p.into_inner())
}

/// A registered object: created with [`Registration::new`] right after the
/// C object, and [`Registration::leave`] called right before it is
/// destroyed (dropped without `leave`, the entry would stay, mapping a
/// dead address to an id until a later object at that address replaces
/// it: a misrouted event at worst, never a memory error, since the
/// registry holds numbers, not pointers it follows).
pub(crate) struct Registration {
    kind: Kind,
    addr: usize,
    id: NonZeroU64,
}

impl Registration {
    /// Registers the C object at `addr` (of `kind`) under a new id.
    pub(crate) fn new<T>(kind: Kind, ptr: *mut T) -> Registration {
        let reg = Registration {
            kind,
            addr: ptr as usize,
            id: next_id(),
        };
        routes()
            .get_or_insert_with(Routes::default)
            .ids
            .insert((kind, reg.addr), reg.id);
        reg
    }

    /// Leaves the registry: call before the C object is destroyed. Its
    /// events read from now on carry no id, and its subscribers' queues
    /// get nothing more (they keep what they hold, then report the end).
    pub(crate) fn leave(&self) {
        let mut g = routes();
        let Some(r) = g.as_mut() else { return };
        // Only this object's own entry: never one a later object at the
        // same address made (impossible before the destroy, but cheap).
        if r.ids.get(&(self.kind, self.addr)) == Some(&self.id) {
            r.ids.remove(&(self.kind, self.addr));
        }
        r.subs.remove(&self.id);
    }

    pub(crate) fn id(&self) -> NonZeroU64 {
        self.id
    }

    pub(crate) fn subscribe(&self) -> AsyncEventReceiver {
        let (tx, rx) = mpsc::channel();
        let mut g = routes();
        let r = g.get_or_insert_with(Routes::default);
        // A subscriber of an object that already left its registry would
        // never be told anything: its queue reports the end at once.
        if r.ids.get(&(self.kind, self.addr)) == Some(&self.id) {
            r.subs.entry(self.id).or_default().push(tx);
        }
        AsyncEventReceiver { rx }
    }
}

/// The id of the live object of `kind` at `ptr`, if this library created
/// it and it has not begun its destruction. Called by
/// [`Context::get_async_event`] before the event is acknowledged; reads
/// only the address, never the object.
pub(crate) fn lookup<T>(kind: Kind, ptr: *mut T) -> Option<NonZeroU64> {
    if ptr.is_null() {
        return None;
    }
    routes()
        .as_ref()
        .and_then(|r| r.ids.get(&(kind, ptr as usize)).copied())
}

pub(crate) fn qp_id(id: NonZeroU64) -> QpId {
    QpId(id)
}
pub(crate) fn srq_id(id: NonZeroU64) -> SrqId {
    SrqId(id)
}
pub(crate) fn cq_id(id: NonZeroU64) -> CqId {
    CqId(id)
}

/// Hands `event` to the subscribers of its object; gives it back when no
/// live subscriber took it (subscribers whose receiver is gone are
/// forgotten here).
pub(crate) fn route(event: AsyncEvent) -> Option<AsyncEvent> {
    let id = match event.element() {
        AsyncElement::Srq(Some(id)) => id.0,
        AsyncElement::Cq(Some(id)) => id.0,
        _ => match event.qp_id() {
            Some(id) => id.0,
            None => return Some(event),
        },
    };
    let mut g = routes();
    let Some(subs) = g.as_mut().and_then(|r| r.subs.get_mut(&id)) else {
        return Some(event);
    };
    subs.retain(|tx| tx.send(event).is_ok());
    if subs.is_empty() {
        if let Some(r) = g.as_mut() {
            r.subs.remove(&id);
        }
        return Some(event);
    }
    None
}

/// The asynchronous events of one queue pair, SRQ or CQ, as routed by
/// [`Context::route_async_event`](crate::Context::route_async_event): from [`QueuePair::async_events`](crate::QueuePair::async_events),
/// [`SharedReceiveQueue::async_events`](crate::qp::SharedReceiveQueue::async_events), [`CompletionQueue::async_events`](crate::CompletionQueue::async_events).
///
/// Events wait here, in order, until taken; the queue is unbounded (async
/// events are rare, and an object raises few before it is destroyed).
/// Receiving never reads the context's events itself: some thread or task
/// must route them. Once the object is destroyed, the receiver gives what
/// it holds, then `recv_timeout` returns `None` at once.
///
/// # References
/// `ibv_get_async_event(3)`
#[derive(Debug)]
pub struct AsyncEventReceiver {
    rx: mpsc::Receiver<AsyncEvent>,
}

impl AsyncEventReceiver {
    /// The next event routed here, if one is waiting.
    pub fn try_recv(&self) -> Option<AsyncEvent> {
        self.rx.try_recv().ok()
    }

    /// The next event routed here, waiting up to `timeout` for one;
    /// `None` on timeout or once the object is gone and every event was
    /// taken.
    pub fn recv_timeout(&self, timeout: Duration) -> Option<AsyncEvent> {
        self.rx.recv_timeout(timeout).ok()
    }

    /// Every event waiting now, in order.
    pub fn drain(&self) -> Vec<AsyncEvent> {
        self.rx.try_iter().collect()
    }
}

impl AsyncEvent {
    /// Routes an event read elsewhere (an async stream of the context's
    /// events, a loop of the application's) as
    /// [`Context::route_async_event`](crate::Context::route_async_event) does: the subscribers of the QP, SRQ
    /// or CQ it names get a copy each, and `None` says it was delivered.
    /// `Some(event)` is an event nobody took: a port or device event, or
    /// one of an object without a live subscriber (or being destroyed).
    pub fn route(self) -> Option<AsyncEvent> {
        route(self)
    }
}

device_enum! {
    /// The kind of an asynchronous event.
    AsyncEventType {
        /// CQ overrun or error.
        CqErr = sys::IBV_EVENT_CQ_ERR,
        /// QP fatal error.
        QpFatal = sys::IBV_EVENT_QP_FATAL,
        /// Invalid request on a QP.
        QpReqErr = sys::IBV_EVENT_QP_REQ_ERR,
        /// Local access violation on a QP.
        QpAccessErr = sys::IBV_EVENT_QP_ACCESS_ERR,
        /// Communication established on a QP.
        CommEst = sys::IBV_EVENT_COMM_EST,
        /// Send queue drained.
        SqDrained = sys::IBV_EVENT_SQ_DRAINED,
        /// Path migrated.
        PathMig = sys::IBV_EVENT_PATH_MIG,
        /// Path migration failed.
        PathMigErr = sys::IBV_EVENT_PATH_MIG_ERR,
        /// Device fatal error.
        DeviceFatal = sys::IBV_EVENT_DEVICE_FATAL,
        /// Port became active.
        PortActive = sys::IBV_EVENT_PORT_ACTIVE,
        /// Port went down.
        PortErr = sys::IBV_EVENT_PORT_ERR,
        /// LID changed.
        LidChange = sys::IBV_EVENT_LID_CHANGE,
        /// P_Key table changed.
        PkeyChange = sys::IBV_EVENT_PKEY_CHANGE,
        /// SM changed.
        SmChange = sys::IBV_EVENT_SM_CHANGE,
        /// SRQ error.
        SrqErr = sys::IBV_EVENT_SRQ_ERR,
        /// SRQ fill below its limit.
        SrqLimitReached = sys::IBV_EVENT_SRQ_LIMIT_REACHED,
        /// Last WQE reached on a QP attached to an SRQ.
        QpLastWqeReached = sys::IBV_EVENT_QP_LAST_WQE_REACHED,
        /// Client re-register request.
        ClientReregister = sys::IBV_EVENT_CLIENT_REREGISTER,
        /// GID table changed.
        GidChange = sys::IBV_EVENT_GID_CHANGE,
        /// WQ fatal error.
        WqFatal = sys::IBV_EVENT_WQ_FATAL,
    }
}

/// What an asynchronous event concerns, copied out of the C event before
/// it was acknowledged.
///
/// SRQ and CQ events carry the object's id (`None` for an object this
/// library did not create, or one whose destruction has begun), which
/// [`SharedReceiveQueue::id`](crate::qp::SharedReceiveQueue::id) and
/// [`CompletionQueue::id`](crate::CompletionQueue::id) give; a QP event's
/// id is [`AsyncEvent::qp_id`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AsyncElement {
    /// A port (port events).
    Port(PortNumber),
    /// A queue pair, by number (QP events). QP numbers are reused once the
    /// QP is destroyed; [`AsyncEvent::qp_id`] is not.
    Qp(u32),
    /// A work queue, by number (`WQ_FATAL`).
    Wq(u32),
    /// A shared receive queue (SRQ events), by id.
    Srq(Option<SrqId>),
    /// A completion queue (`CQ_ERR`), by id.
    Cq(Option<CqId>),
    /// The device (`DEVICE_FATAL`, and events this crate does not know).
    Device,
}

/// An asynchronous event, already acknowledged (`ibv_ack_async_event`):
/// plain data, see [`Context::get_async_event`](crate::Context::get_async_event). Route it to its object
/// with [`Context::route_async_event`](crate::Context::route_async_event).
///
/// # References
/// `ibv_get_async_event(3)`
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AsyncEvent {
    event_type: AsyncEventType,
    element: AsyncElement,
    /// For QP events: the id of the queue pair, read with its number.
    qp_id: Option<QpId>,
}

impl AsyncEvent {
    /// Copies out what `raw` concerns.
    ///
    /// # Safety
    /// The caller must pass an event reported by `ibv_get_async_event` and
    /// not yet acknowledged (so the QP or WQ its union names is alive).
    pub(crate) unsafe fn copy_out(raw: &sys::ibv_async_event) -> AsyncEvent {
        use AsyncEventType::*;
        let event_type = AsyncEventType::from_raw(raw.event_type);
        let mut qp_id = None;
        let element = match event_type {
            PortActive | PortErr | LidChange | PkeyChange | SmChange | ClientReregister
            | GidChange => {
                // SAFETY: for port events the union holds `port_num`.
                AsyncElement::Port(PortNumber(unsafe { raw.element.port_num } as u8))
            }
            QpFatal | QpReqErr | QpAccessErr | CommEst | SqDrained | PathMig | PathMigErr
            | QpLastWqeReached => {
                // SAFETY: for QP events the union holds the QP, alive until
                // the event is acknowledged (the caller's contract).
                let qp = unsafe { raw.element.qp };
                if qp.is_null() {
                    AsyncElement::Device
                } else {
                    qp_id = lookup(Kind::Qp, qp).map(QpId);
                    // SAFETY: as above; `qp_num` is immutable.
                    AsyncElement::Qp(unsafe { (*qp).qp_num })
                }
            }
            WqFatal => {
                // SAFETY: for WQ events the union holds the WQ, alive until
                // the event is acknowledged.
                let wq = unsafe { raw.element.wq };
                if wq.is_null() {
                    AsyncElement::Device
                } else {
                    // SAFETY: as above; `wq_num` is immutable.
                    AsyncElement::Wq(unsafe { (*wq).wq_num })
                }
            }
            // The addresses only are read (never followed): the registry
            // maps a live object's address to its id (event_routing.rs).
            SrqErr | SrqLimitReached => {
                // SAFETY: for SRQ events the union holds the SRQ pointer.
                let srq = unsafe { raw.element.srq };
                AsyncElement::Srq(lookup(Kind::Srq, srq).map(srq_id))
            }
            CqErr => {
                // SAFETY: for CQ events the union holds the CQ pointer.
                let cq = unsafe { raw.element.cq };
                AsyncElement::Cq(lookup(Kind::Cq, cq).map(cq_id))
            }
            _ => AsyncElement::Device,
        };
        AsyncEvent {
            event_type,
            element,
            qp_id,
        }
    }

    #[cfg(test)]
    pub(crate) fn for_test(event_type: AsyncEventType, element: AsyncElement) -> AsyncEvent {
        AsyncEvent {
            event_type,
            element,
            qp_id: None,
        }
    }

    /// The event type.
    pub fn event_type(&self) -> AsyncEventType {
        self.event_type
    }

    /// What the event concerns.
    pub fn element(&self) -> AsyncElement {
        self.element
    }

    /// The port, for port events.
    pub fn port(&self) -> Option<PortNumber> {
        match self.element {
            AsyncElement::Port(p) => Some(p),
            _ => None,
        }
    }

    /// The QP number, for QP events.
    pub fn qp_num(&self) -> Option<u32> {
        match self.element {
            AsyncElement::Qp(n) => Some(n),
            _ => None,
        }
    }

    /// The id of the queue pair, for QP events of a queue pair this
    /// library created ([`QueuePair::id`](crate::QueuePair::id)); `None`
    /// for other events, and for a queue pair whose destruction had begun.
    pub fn qp_id(&self) -> Option<QpId> {
        self.qp_id
    }

    /// The id of the SRQ, for SRQ events ([`AsyncElement::Srq`]).
    pub fn srq_id(&self) -> Option<SrqId> {
        match self.element {
            AsyncElement::Srq(id) => id,
            _ => None,
        }
    }

    /// The id of the CQ, for `CQ_ERR` ([`AsyncElement::Cq`]).
    pub fn cq_id(&self) -> Option<CqId> {
        match self.element {
            AsyncElement::Cq(id) => id,
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unique_and_leave_removes_only_its_own_entry() {
        let addr = 0x1000usize as *mut u8;
        let a = Registration::new(Kind::Srq, addr);
        assert_eq!(lookup(Kind::Srq, addr), Some(a.id()));
        // Another kind at the same address is another key.
        assert_eq!(lookup(Kind::Cq, addr), None);
        let rx = a.subscribe();
        a.leave();
        assert_eq!(lookup(Kind::Srq, addr), None);
        // The address reused by a later object: a new id, and the old
        // registration leaving again does not remove it.
        let b = Registration::new(Kind::Srq, addr);
        assert_ne!(a.id(), b.id());
        a.leave();
        assert_eq!(lookup(Kind::Srq, addr), Some(b.id()));
        b.leave();
        // The old subscriber's queue reports the end.
        assert!(rx.recv_timeout(Duration::from_millis(1)).is_none());
        assert_eq!(lookup(Kind::Srq, std::ptr::null_mut::<u8>()), None);
    }

    #[test]
    fn routes_to_subscribers_and_returns_the_rest() {
        let addr = 0x2000usize as *mut u8;
        let reg = Registration::new(Kind::Cq, addr);
        let other = Registration::new(Kind::Cq, 0x3000usize as *mut u8);
        let ev = AsyncEvent::for_test(
            crate::device::event_routing::AsyncEventType::CqErr,
            AsyncElement::Cq(Some(cq_id(reg.id()))),
        );
        // No subscriber: given back.
        assert_eq!(route(ev), Some(ev));
        let rx1 = reg.subscribe();
        let rx2 = reg.subscribe();
        let rx_other = other.subscribe();
        assert_eq!(route(ev), None);
        assert_eq!(rx1.drain(), vec![ev]);
        assert_eq!(rx2.try_recv(), Some(ev));
        assert_eq!(rx_other.try_recv(), None);
        // A dropped receiver is forgotten; the last one gone, given back.
        drop(rx1);
        assert_eq!(route(ev), None);
        assert_eq!(rx2.try_recv(), Some(ev));
        drop(rx2);
        assert_eq!(route(ev), Some(ev));
        // Port events are never routed.
        let port = AsyncEvent::for_test(
            crate::device::event_routing::AsyncEventType::PortErr,
            AsyncElement::Port(crate::types::PortNumber(1)),
        );
        assert_eq!(route(port), Some(port));
        reg.leave();
        other.leave();
    }
}
