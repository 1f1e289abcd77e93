//! Device tests of asynchronous events routed to their object: each test
//! makes two objects of a kind on one context, provokes an event on one,
//! and checks that only that one's subscriber receives it
//! (`Context::route_async_event`, `qp/srq/cq.async_events()`), with the
//! ids the library hands out.
//!
//! Run in the SoftRoCE VM: `cargo xtask test --device-only --no-fuzz -- async_route_`.

mod common;

use std::time::{Duration, Instant};

use common::{connect_pair, endpoint, options, TestDevice};
use rdma_verbs::{
    device::{AsyncElement, AsyncEvent, AsyncEventReceiver, AsyncEventType},
    qp::SharedReceiveQueue,
    sys, AccessFlags, Context, Error, ProtectionDomain, QpType, QueuePair, RecvRequest, SendQueue,
    Wr,
};

fn local() -> AccessFlags {
    AccessFlags::LOCAL_WRITE
}

/// Routes the context's events (non-blocking) until `done` says so or
/// `limit` passed; returns the events nobody subscribed to.
fn pump(ctx: &Context, limit: Duration, mut done: impl FnMut() -> bool) -> Vec<AsyncEvent> {
    ctx.set_async_nonblocking(true).unwrap();
    let deadline = Instant::now() + limit;
    let mut unrouted = Vec::new();
    while !done() && Instant::now() < deadline {
        match ctx.route_async_event() {
            Ok(Some(e)) => {
                eprintln!("unrouted async event: {e:?}");
                unrouted.push(e);
            }
            Ok(None) => {}
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => {
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(e) => panic!("route_async_event: {e}"),
        }
    }
    ctx.set_async_nonblocking(false).unwrap();
    unrouted
}

/// Waits (routing) up to 5 s for an event in `rx`, then routes 200 ms more
/// so that a misrouted copy would have arrived too.
fn routed_event(ctx: &Context, rx: &AsyncEventReceiver) -> (Option<AsyncEvent>, Vec<AsyncEvent>) {
    let mut got = None;
    let mut unrouted = pump(ctx, Duration::from_secs(5), || {
        got = got.or_else(|| rx.try_recv());
        got.is_some()
    });
    unrouted.extend(pump(ctx, Duration::from_millis(200), || false));
    eprintln!("routed to the subscriber: {got:?}");
    (got, unrouted)
}

/// An SRQ with a receiver QP attached and a sender connected to it (`sq`:
/// the sender's send queue), `n` receives of 64 bytes posted, its limit
/// armed at `limit`.
struct SrqSide {
    srq: SharedReceiveQueue,
    sender: QueuePair,
    sq: SendQueue,
    receiver: QueuePair,
    cq: rdma_verbs::CompletionQueue,
}

fn srq_side(dev: &TestDevice, pd: &ProtectionDomain, n: u32, limit: u32) -> SrqSide {
    let cq = dev.ctx.create_cq(256).build().unwrap();
    let srq = pd.create_srq(32).build().unwrap();
    let sender = pd.create_qp(QpType::Rc, &cq, &cq).build().unwrap();
    let receiver = pd
        .create_qp(QpType::Rc, &cq, &cq)
        .srq(&srq)
        .build()
        .unwrap();
    connect_pair(dev, &sender, &receiver, local());
    let mut rq = srq.recv_queue().unwrap();
    for _ in 0..n {
        rq.recv(pd.alloc(64, local()).unwrap(), 0).unwrap();
    }
    srq.arm_limit(limit).unwrap();
    let sq = sender.send_queue().unwrap();
    SrqSide {
        srq,
        sender,
        sq,
        receiver,
        cq,
    }
}

/// Two SRQs with their limit armed at 4 over 8 receives; traffic drains
/// only the first below its limit: SRQ_LIMIT_REACHED reaches the first
/// SRQ's subscriber, with its id, and nothing reaches the second's.
#[test]
#[ignore = "needs an RDMA device"]
fn async_route_srq_limit_to_its_srq() {
    let dev = common::device();
    let pd = dev.ctx.alloc_pd().unwrap();
    let mut a = srq_side(&dev, &pd, 8, 4);
    let b = srq_side(&dev, &pd, 8, 4);
    assert_ne!(a.srq.id(), b.srq.id());
    let (rx_a, rx_b) = (a.srq.async_events(), b.srq.async_events());
    // 3 sends: 5 left, still above the limit: no event yet.
    for i in 0..3u8 {
        a.sq.send_inline(&[i], Wr::id(0)).unwrap();
    }
    for c in common::wait(&a.cq, 6) {
        c.result().unwrap();
    }
    let early = pump(&dev.ctx, Duration::from_millis(300), || false);
    assert_eq!(rx_a.try_recv(), None, "event above the limit");
    assert!(early.is_empty(), "{early:?}");
    // 2 more: 3 left < 4.
    for i in 3..5u8 {
        a.sq.send_inline(&[i], Wr::id(0)).unwrap();
    }
    for c in common::wait(&a.cq, 4) {
        c.result().unwrap();
    }
    assert_eq!(a.srq.outstanding(), 3);
    let (ev, unrouted) = routed_event(&dev.ctx, &rx_a);
    let ev = ev.expect("no SRQ_LIMIT_REACHED routed to the drained SRQ within 5 s");
    assert_eq!(ev.event_type(), AsyncEventType::SrqLimitReached, "{ev:?}");
    assert_eq!(ev.element(), AsyncElement::Srq(Some(a.srq.id())));
    assert_eq!(ev.srq_id(), Some(a.srq.id()));
    assert_eq!(rx_a.drain(), vec![], "one event");
    assert_eq!(rx_b.drain(), vec![], "the other SRQ got an event");
    assert!(unrouted.is_empty(), "unrouted: {unrouted:?}");
    // The event disarmed the first SRQ's limit; the second's stays armed.
    assert_eq!(a.srq.query().unwrap().srq_limit, 0);
    assert_eq!(b.srq.query().unwrap().srq_limit, 4);
    // Re-armed below what is left: fires again at once on the next receive.
    a.srq.arm_limit(3).unwrap();
    a.sq.send_inline(&[9], Wr::id(0)).unwrap();
    for c in common::wait(&a.cq, 2) {
        c.result().unwrap();
    }
    let (again, _) = routed_event(&dev.ctx, &rx_a);
    assert_eq!(
        again.map(|e| e.element()),
        Some(AsyncElement::Srq(Some(a.srq.id())))
    );
    assert_eq!(rx_b.drain(), vec![]);
    let _ = (&a.sender, &a.receiver, &b.receiver, &b.sender, &b.sq);
}

/// Events of an object nobody subscribed to are given back by the router,
/// with the object's id (not lost); a subscriber dropped counts as none.
#[test]
#[ignore = "needs an RDMA device"]
fn async_route_unsubscribed_events_come_back() {
    let dev = common::device();
    let pd = dev.ctx.alloc_pd().unwrap();
    let mut a = srq_side(&dev, &pd, 8, 4);
    drop(a.srq.async_events());
    for i in 0..5u8 {
        a.sq.send_inline(&[i], Wr::id(0)).unwrap();
    }
    for c in common::wait(&a.cq, 10) {
        c.result().unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut seen = Vec::new();
    while seen.is_empty() && Instant::now() < deadline {
        seen = pump(&dev.ctx, Duration::from_millis(100), || false);
    }
    let ev = seen.first().copied().expect("no event within 5 s");
    assert_eq!(ev.event_type(), AsyncEventType::SrqLimitReached, "{ev:?}");
    assert_eq!(ev.srq_id(), Some(a.srq.id()));
}

/// A queue pair receiving through an SRQ, moved to ERR, raises
/// QP_LAST_WQE_REACHED (where the provider does): routed to that QP's
/// subscriber, with its id, and not to the other QP on the same SRQ.
#[test]
#[ignore = "needs an RDMA device"]
fn async_route_last_wqe_to_its_qp() {
    let dev = common::device();
    let pd = dev.ctx.alloc_pd().unwrap();
    let cq = dev.ctx.create_cq(256).build().unwrap();
    let srq = pd.create_srq(32).build().unwrap();
    let qp = || {
        pd.create_qp(QpType::Rc, &cq, &cq)
            .srq(&srq)
            .build()
            .unwrap()
    };
    let (r1, r2) = (qp(), qp());
    let (s1, s2) = (
        pd.create_qp(QpType::Rc, &cq, &cq).build().unwrap(),
        pd.create_qp(QpType::Rc, &cq, &cq).build().unwrap(),
    );
    connect_pair(&dev, &s1, &r1, local());
    connect_pair(&dev, &s2, &r2, local());
    assert_ne!(r1.id(), r2.id());
    let (rx1, rx2) = (r1.async_events(), r2.async_events());
    r1.to_err().unwrap();
    let (ev, unrouted) = routed_event(&dev.ctx, &rx1);
    match ev {
        Some(ev) => {
            assert_eq!(ev.event_type(), AsyncEventType::QpLastWqeReached, "{ev:?}");
            assert_eq!(ev.qp_id(), Some(r1.id()));
            assert_eq!(ev.element(), AsyncElement::Qp(r1.qp_num().0));
        }
        None if common::is_rxe(&dev) => panic!("rxe raises LAST_WQE_REACHED: none routed"),
        None => common::unsupported(
            "IBV_EVENT_QP_LAST_WQE_REACHED",
            &rdma_verbs::Error::Unsupported("a LAST_WQE_REACHED event within 5 s"),
        ),
    }
    assert_eq!(rx2.drain(), vec![], "the other QP got an event");
    assert!(unrouted.is_empty(), "unrouted: {unrouted:?}");
}

/// A queue pair in RTR that receives its first message raises COMM_EST
/// (where the provider does): routed to it, not to its peer. rxe (6.12)
/// raises none: the message is received and nothing is misrouted.
#[test]
#[ignore = "needs an RDMA device"]
fn async_route_comm_est_to_its_qp() {
    let dev = common::device();
    let pd = dev.ctx.alloc_pd().unwrap();
    let cq = dev.ctx.create_cq(256).build().unwrap();
    let a = pd.create_qp(QpType::Rc, &cq, &cq).build().unwrap();
    let b = pd.create_qp(QpType::Rc, &cq, &cq).build().unwrap();
    let opts = options(&dev, local());
    let (ea, eb) = (endpoint(&dev, &a, 0x1000), endpoint(&dev, &b, 0x2000));
    a.connect(&ea, &eb, &opts).unwrap();
    // `b` stops in RTR: it receives but has not been told the connection
    // is established.
    b.to_init(dev.port, 0, local()).unwrap();
    b.to_rtr(&ea, &opts).unwrap();
    b.recv_queue()
        .unwrap()
        .recv(pd.alloc(64, local()).unwrap(), 0)
        .unwrap();
    let (rx_a, rx_b) = (a.async_events(), b.async_events());
    a.send_queue()
        .unwrap()
        .send_inline(&[7], Wr::id(0))
        .unwrap();
    for c in common::wait(&cq, 2) {
        c.result().unwrap();
    }
    let (ev, unrouted) = routed_event(&dev.ctx, &rx_b);
    match ev {
        Some(ev) => {
            assert_eq!(ev.event_type(), AsyncEventType::CommEst, "{ev:?}");
            assert_eq!(ev.qp_id(), Some(b.id()));
        }
        None => common::unsupported(
            "IBV_EVENT_COMM_EST",
            &rdma_verbs::Error::Unsupported("a COMM_EST event within 5 s"),
        ),
    }
    assert_eq!(rx_a.drain(), vec![], "the sender got an event");
    assert!(unrouted.is_empty(), "unrouted: {unrouted:?}");
}

/// A receive CQ overrun (the safe path holds at most as many unclaimed
/// receives as the CQ has room for: the one receive too many goes through
/// the raw path) raises CQ_ERR on rxe: routed to that CQ, not to the other
/// CQ of the context. Events the queue pairs raise meanwhile (QP_FATAL,
/// where the provider raises one; rxe 6.12 raised none in our runs) go to
/// their subscribers.
#[test]
#[ignore = "needs an RDMA device"]
fn async_route_cq_err_to_its_cq() {
    let dev = common::device();
    let pd = dev.ctx.alloc_pd().unwrap();
    let big = dev.ctx.create_cq(256).build().unwrap();
    let small = dev.ctx.create_cq(4).build().unwrap();
    let cap = small.capacity();
    let receiver = pd
        .create_qp(QpType::Rc, &big, &small)
        .max_recv_wr(cap)
        .build()
        .unwrap();
    let sender = pd
        .create_qp(QpType::Rc, &big, &big)
        .max_send_wr(64)
        .build()
        .unwrap();
    connect_pair(&dev, &sender, &receiver, local());
    let (rx_small, rx_big) = (small.async_events(), big.async_events());
    let (rx_recv, rx_send) = (receiver.async_events(), sender.async_events());
    let mut rq = receiver.recv_queue().unwrap();
    let mut prepared = rq
        .prepare(RecvRequest::new(pd.alloc(64, local()).unwrap()))
        .unwrap();
    // The receive queue holds as many receives as the CQ: fill both, let
    // the messages land (the CQ stays full, unpolled), then one more
    // receive and one more message overrun the CQ. The safe path keeps a
    // receive's slot until its completion is polled, so it refuses the
    // receive too many (QueueFull): that one is posted raw.
    let mut posted = 0u32;
    let stop = loop {
        match rq.post_prepared(&mut prepared) {
            Ok(()) => posted += 1,
            Err(e) => break e,
        }
        assert!(posted <= 4 * cap, "the receive queue never fills");
    };
    assert!(matches!(stop, Error::QueueFull { .. }), "{stop}");
    assert!(posted >= cap, "{posted} receives for a CQ of {cap}");
    let mut sq = sender.send_queue().unwrap();
    let mut send = |i: u32| sq.send_inline(&i.to_le_bytes(), Wr::id(0)).unwrap();
    (0..posted).for_each(&mut send);
    for c in common::wait(&big, posted as usize) {
        c.result().unwrap();
    }
    assert!(
        matches!(
            rq.post_prepared(&mut prepared),
            Err(Error::QueueFull { .. })
        ),
        "the unpolled completions keep their slots"
    );
    let extra = pd.alloc(64, local()).unwrap();
    let mut sge = sys::ibv_sge {
        addr: extra.addr(),
        length: extra.len() as u32,
        lkey: extra.lkey(),
    };
    let mut wr = sys::ibv_recv_wr {
        wr_id: 0x0bad,
        sg_list: &mut sge,
        num_sge: 1,
        ..Default::default()
    };
    // SAFETY: `extra` is registered in the QP's PD and forgotten below
    // (never read, written or freed: its completion is the one the
    // overrun loses); wr_id bit 63 is clear; one request.
    unsafe { receiver.post_recv_raw(&mut wr) }.unwrap();
    std::mem::forget(extra);
    send(posted);
    let (ev, unrouted) = routed_event(&dev.ctx, &rx_small);
    match ev {
        Some(ev) => {
            assert_eq!(ev.event_type(), AsyncEventType::CqErr, "{ev:?}");
            assert_eq!(ev.element(), AsyncElement::Cq(Some(small.id())));
        }
        None if common::is_rxe(&dev) => panic!("rxe raises CQ_ERR on an overrun: none routed"),
        None => common::unsupported(
            "IBV_EVENT_CQ_ERR",
            &rdma_verbs::Error::Unsupported("a CQ_ERR event within 5 s of an overrun"),
        ),
    }
    assert_eq!(rx_big.drain(), vec![], "the other CQ got an event");
    for (name, rx, qp) in [
        ("receiver", &rx_recv, &receiver),
        ("sender", &rx_send, &sender),
    ] {
        for e in rx.drain() {
            eprintln!("{name} QP event: {e:?}");
            assert_eq!(e.qp_id(), Some(qp.id()), "{e:?}");
        }
    }
    assert!(unrouted.is_empty(), "unrouted: {unrouted:?}");
    // The postings whose completions the overrun lost keep their buffer
    // for good (a leak, never a use after free): `prepared` is forgotten
    // (as is the raw receive's buffer above).
    std::mem::forget(prepared);
}

/// Ids are never reused: an SRQ created after another was destroyed gets
/// a new id even when the allocator gives it the same address, and a
/// destroyed object's receiver reports the end.
#[test]
#[ignore = "needs an RDMA device"]
fn async_route_ids_are_not_reused() {
    let dev = common::device();
    let pd = dev.ctx.alloc_pd().unwrap();
    let mut seen = std::collections::HashSet::new();
    let mut same_address = 0;
    let mut last_ptr = std::ptr::null_mut();
    for _ in 0..16 {
        let srq = pd.create_srq(4).build().unwrap();
        assert!(seen.insert(srq.id()), "id {} reused", srq.id());
        if srq.as_ptr() == last_ptr {
            same_address += 1;
        }
        last_ptr = srq.as_ptr();
        let rx = srq.async_events();
        drop(srq);
        assert_eq!(rx.recv_timeout(Duration::from_millis(1)), None);
    }
    eprintln!("{same_address} of 16 SRQs reused the previous one's address");
}

/// With Tokio, `EventStream::next_unrouted` routes what it reads: the
/// SRQ's subscriber gets SRQ_LIMIT_REACHED, and `next_unrouted` itself
/// keeps waiting (nothing unrouted came).
#[tokio::test]
#[ignore = "needs an RDMA device"]
async fn async_route_tokio_next_unrouted_routes() {
    let dev = common::device();
    let pd = dev.ctx.alloc_pd().unwrap();
    let mut a = srq_side(&dev, &pd, 8, 4);
    let rx = a.srq.async_events();
    let mut events = rdma_verbs_tokio::EventStream::new(&dev.ctx).unwrap();
    for i in 0..5u8 {
        a.sq.send_inline(&[i], Wr::id(0)).unwrap();
    }
    for c in common::wait(&a.cq, 10) {
        c.result().unwrap();
    }
    let waited = tokio::time::timeout(Duration::from_secs(3), events.next_unrouted()).await;
    assert!(waited.is_err(), "an event came back unrouted: {waited:?}");
    let ev = rx
        .try_recv()
        .expect("SRQ_LIMIT_REACHED not routed within 3 s");
    assert_eq!(ev.event_type(), AsyncEventType::SrqLimitReached, "{ev:?}");
    assert_eq!(ev.srq_id(), Some(a.srq.id()));
    drop(events);
    dev.ctx.set_async_nonblocking(false).unwrap();
}
