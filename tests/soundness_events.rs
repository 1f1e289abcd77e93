//! Device tests of the event paths' soundness: asynchronous events never
//! hold up the teardown of their object, however long they are kept.
//!
//! Run in the SoftRoCE VM: `cargo xtask test --device-only --no-fuzz -- soundness_ev_`.

mod common;

use std::sync::mpsc;
use std::time::{Duration, Instant};

use ibverbs::{
    AccessFlags, AsyncElement, AsyncEvent, AsyncEventType, Context, QpAttr, QpState, QpType,
    RecvRequest, SendRequest,
};

/// Runs `f` on another thread and fails the test if it does not return
/// within `limit` (a teardown blocked in the kernel cannot be interrupted:
/// the thread is left behind, the test fails).
fn bounded(what: &str, limit: Duration, f: impl FnOnce() + Send + 'static) {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        f();
        let _ = tx.send(());
    });
    match rx.recv_timeout(limit) {
        Ok(()) => {}
        Err(mpsc::RecvTimeoutError::Timeout) => {
            panic!("{what} did not return within {limit:?}: blocked on an unacknowledged event?")
        }
        Err(mpsc::RecvTimeoutError::Disconnected) => panic!("{what} panicked"),
    }
}

/// The next async event of `ctx` accepted by `want`, polling the
/// non-blocking fd for at most 5 s; other events are printed and skipped.
fn next_event(ctx: &Context, want: impl Fn(&AsyncEvent) -> bool) -> Option<AsyncEvent> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match ctx.get_async_event() {
            Ok(e) if want(&e) => return Some(e),
            Ok(e) => eprintln!("other async event: {e:?}"),
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => {}
            Err(e) => panic!("get_async_event: {e}"),
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// An SRQ event (SRQ_LIMIT_REACHED) and a QP event of a QP attached to it
/// (LAST_WQE_REACHED, after the QP went to ERR), both kept and then
/// forgotten: the QP and the SRQ are still destroyed at once.
/// (`ibv_destroy_qp`/`ibv_destroy_srq` wait for every reported event of
/// their object to be acknowledged; an event acknowledged only by its
/// destructor blocked them forever once forgotten.)
#[test]
#[ignore = "needs an RDMA device"]
fn soundness_ev_forgotten_events_do_not_block_teardown() {
    let t = common::device();
    let ctx = t.ctx.clone();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64).build().unwrap();
    let srq = pd.create_srq(16).build().unwrap();
    let sender = pd.create_qp(QpType::Rc, &cq, &cq).build().unwrap();
    let receiver = pd
        .create_qp(QpType::Rc, &cq, &cq)
        .srq(&srq)
        .build()
        .unwrap();
    common::connect_pair(&t, &sender, &receiver, AccessFlags::LOCAL_WRITE);
    for _ in 0..8 {
        srq.post_recv(RecvRequest::new(
            pd.alloc(64, AccessFlags::LOCAL_WRITE).unwrap(),
        ))
        .unwrap();
    }
    srq.set_limit(4).unwrap();
    ctx.set_async_nonblocking(true).unwrap();
    for i in 0..6u8 {
        sender.post_send(SendRequest::send_inline(&[i])).unwrap();
    }
    for c in common::wait(&cq, 12) {
        c.result().unwrap();
    }
    let limit = next_event(&ctx, |e| e.event_type() == AsyncEventType::SrqLimitReached)
        .expect("no SRQ_LIMIT_REACHED within 5 s");
    assert_eq!(limit.element(), AsyncElement::Srq);
    // A QP event for the receiver: to ERR with an SRQ gives LAST_WQE_REACHED
    // (where the provider reports it).
    let qpn = receiver.qp_num().0;
    receiver
        .modify(&QpAttr::new().qp_state(QpState::Err))
        .unwrap();
    let last = next_event(&ctx, |e| e.qp_num() == Some(qpn));
    match &last {
        Some(e) => assert_eq!(e.element(), AsyncElement::Qp(qpn), "{e:?}"),
        None => eprintln!("no QP event for {qpn:#x} within 5 s: only the SRQ's is checked"),
    }
    // Held across the teardown and never dropped: no destructor of theirs
    // ever runs (as with `mem::forget`).
    let kept = std::mem::ManuallyDrop::new((limit, last));
    bounded("dropping the QPs and the SRQ", Duration::from_secs(20), move || {
        drop(receiver);
        drop(sender);
        drop(srq);
        drop(cq);
        drop(pd);
    });
    assert_eq!(kept.0.event_type(), AsyncEventType::SrqLimitReached);
    ctx.set_async_nonblocking(false).unwrap();
}
