//! The Tokio integration (`rdma-verbs-tokio`): `AsyncQueuePair`
//! futures for every verb, many at once, cancellation (a dropped future
//! leaves its buffer with the queue pair until the completion arrives),
//! error completions, `EventStream`, and the `async_echo` example run as
//! server and client (device tests).
//!
//! The example binary is spawned from `target/<profile>/examples/` (build
//! it first with `cargo build --examples`; `cargo xtask test` does). Every
//! wait is bounded.

mod common;

use std::time::Duration;

use common::process::{self, device_args, Finished, Running};
use common::{channel_qp, connect_pair, device, pattern, remote_all, TestDevice};
use rdma_verbs::{
    device::AsyncEventType, AccessFlags, Completion, Error, ProtectionDomain, QpState, QpType,
    RecvRequest, SendRequest, WcOpcode, WcStatus, Wr,
};
use rdma_verbs_tokio::{AsyncQueuePair, CompletionFuture, EventStream};

/// Longest any single await may take here.
const BOUND: Duration = Duration::from_secs(10);

fn local() -> AccessFlags {
    AccessFlags::LOCAL_WRITE
}

/// Awaits `fut` for at most [`BOUND`], failing the test on expiry.
async fn within<T>(what: &str, fut: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(BOUND, fut)
        .await
        .unwrap_or_else(|_| panic!("{what}: no completion within {BOUND:?}"))
}

/// Awaits a completion that must succeed.
async fn ok(what: &str, fut: CompletionFuture) -> Completion {
    within(what, fut)
        .await
        .unwrap_or_else(|e| panic!("{what}: {e}"))
}

/// Two connected RC queue pairs of the test device, wrapped.
struct Pair {
    _dev: TestDevice,
    pd: ProtectionDomain,
    a: AsyncQueuePair,
    b: AsyncQueuePair,
}

fn pair(access: AccessFlags, depth: u32) -> Pair {
    let dev = device();
    let pd = dev.ctx.alloc_pd().unwrap();
    let a = channel_qp(&dev, &pd, depth);
    let b = channel_qp(&dev, &pd, depth);
    connect_pair(&dev, &a, &b, access);
    Pair {
        a: AsyncQueuePair::new(a).unwrap(),
        b: AsyncQueuePair::new(b).unwrap(),
        pd,
        _dev: dev,
    }
}

fn filled(pd: &ProtectionDomain, len: usize, seed: u8) -> rdma_verbs::LocalBuffer {
    let mut b = pd.alloc(len, local()).unwrap();
    b.copy_from_slice(&pattern(len, seed));
    b
}

#[tokio::test]
#[ignore = "needs an RDMA device"]
async fn async_send_recv_returns_both_buffers() {
    let p = pair(local(), 16);
    let incoming =
        p.b.post_recv(RecvRequest::new(p.pd.alloc(4096, local()).unwrap()))
            .unwrap();
    let sent =
        p.a.post_send(SendRequest::send(filled(&p.pd, 4096, 3)))
            .unwrap();
    let send_id = sent.wr_id();
    let mut s = ok("send", sent).await;
    assert_eq!((s.wr_id(), s.opcode()), (send_id, WcOpcode::Send));
    assert_eq!(&s.take_local().unwrap()[..], &pattern(4096, 3)[..]);
    let mut r = ok("recv", incoming).await;
    assert_eq!((r.opcode(), r.byte_len()), (WcOpcode::Recv, 4096));
    assert_eq!(&r.take_local().unwrap()[..], &pattern(4096, 3)[..]);
    // Immediate data through the general post_send; the request's own
    // wr_id is replaced by a unique one.
    let incoming =
        p.b.post_recv(RecvRequest::new(p.pd.alloc(64, local()).unwrap()))
            .unwrap();
    let sent =
        p.a.post_send(SendRequest::send(filled(&p.pd, 64, 4)).imm(0xfeed).wr_id(7))
            .unwrap();
    assert_ne!(sent.wr_id(), 7);
    ok("send with imm", sent).await;
    let r = ok("recv with imm", incoming).await;
    assert_eq!(r.imm_data(), Some(0xfeed));
    assert_eq!((p.a.outstanding(), p.b.outstanding()), (0, 0));
    assert_eq!(p.b.queue_pair().recv_outstanding(), 0);
}

#[tokio::test]
#[ignore = "needs an RDMA device"]
async fn async_separate_send_and_recv_cqs_on_two_channels() {
    let dev = device();
    let pd = dev.ctx.alloc_pd().unwrap();
    let (ch1, ch2) = (
        dev.ctx.create_comp_channel().unwrap(),
        dev.ctx.create_comp_channel().unwrap(),
    );
    let scq = dev.ctx.create_cq(256).channel(&ch1).build().unwrap();
    let rcq = dev.ctx.create_cq(256).channel(&ch2).build().unwrap();
    let a = pd.create_qp(QpType::Rc, &scq, &rcq).build().unwrap();
    let b = channel_qp(&dev, &pd, 8);
    connect_pair(&dev, &a, &b, local());
    let (a, b) = (
        AsyncQueuePair::new(a).unwrap(),
        AsyncQueuePair::new(b).unwrap(),
    );
    for round in 0..3u8 {
        let to_a = a
            .post_recv(RecvRequest::new(pd.alloc(128, local()).unwrap()))
            .unwrap();
        let to_b = b
            .post_recv(RecvRequest::new(pd.alloc(128, local()).unwrap()))
            .unwrap();
        let (s1, s2) = (
            a.post_send(SendRequest::send(filled(&pd, 128, round)))
                .unwrap(),
            b.post_send(SendRequest::send(filled(&pd, 128, round + 100)))
                .unwrap(),
        );
        let mut got_a = ok("recv on a", to_a).await;
        let mut got_b = ok("recv on b", to_b).await;
        ok("send a", s1).await;
        ok("send b", s2).await;
        assert_eq!(
            &got_a.take_local().unwrap()[..],
            &pattern(128, round + 100)[..]
        );
        assert_eq!(&got_b.take_local().unwrap()[..], &pattern(128, round)[..]);
    }
}

#[tokio::test]
#[ignore = "needs an RDMA device"]
async fn async_rdma_write_then_read() {
    let p = pair(remote_all(), 16);
    let target = p.pd.alloc_shared(4096, remote_all()).unwrap();
    let remote = target.remote().unwrap();
    let mut w = ok(
        "write",
        p.a.post_send(SendRequest::write(filled(&p.pd, 4096, 9), remote))
            .unwrap(),
    )
    .await;
    assert_eq!(w.opcode(), WcOpcode::RdmaWrite);
    assert!(w.take_local().is_some(), "the write buffer comes back");
    assert_eq!(target.to_vec(), pattern(4096, 9));
    let into = p.pd.alloc(1024, local()).unwrap();
    let part = remote.slice(1024, 1024).unwrap();
    let mut r = ok(
        "read",
        p.a.post_send(SendRequest::read(into, part)).unwrap(),
    )
    .await;
    assert_eq!(r.opcode(), WcOpcode::RdmaRead);
    assert_eq!(&r.take_local().unwrap()[..], &pattern(4096, 9)[1024..2048]);
    assert_eq!(p.a.outstanding(), 0);
}

#[tokio::test]
#[ignore = "needs an RDMA device"]
async fn async_compare_and_swap_and_fetch_and_add() {
    let p = pair(remote_all(), 16);
    let target = p.pd.alloc_shared(64, remote_all()).unwrap();
    let word = target.remote().unwrap().slice(8, 8).unwrap();
    let old = |mut c: Completion| {
        let b = c.take_local().expect("result buffer");
        u64::from_ne_bytes(b[..8].try_into().unwrap())
    };
    let faa = p.a.post_send(SendRequest::fetch_and_add(
        p.pd.alloc(8, local()).unwrap(),
        word,
        5,
    ));
    let c = ok("fetch-and-add", faa.unwrap()).await;
    assert_eq!(c.opcode(), WcOpcode::FetchAdd);
    assert_eq!(old(c), 0);
    let cas = p.a.post_send(SendRequest::compare_and_swap(
        p.pd.alloc(8, local()).unwrap(),
        word,
        5,
        42,
    ));
    assert_eq!(old(ok("cas hit", cas.unwrap()).await), 5);
    let cas = p.a.post_send(SendRequest::compare_and_swap(
        p.pd.alloc(8, local()).unwrap(),
        word,
        5,
        7,
    ));
    assert_eq!(old(ok("cas miss", cas.unwrap()).await), 42, "compare fails");
    let faa = p.a.post_send(SendRequest::fetch_and_add(
        p.pd.alloc(8, local()).unwrap(),
        word,
        1,
    ));
    assert_eq!(old(ok("fetch-and-add", faa.unwrap()).await), 42);
    assert_eq!(
        target
            .atomic_u64(8)
            .unwrap()
            .load(std::sync::atomic::Ordering::SeqCst),
        43
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs an RDMA device"]
async fn async_many_concurrent_futures_across_tasks() {
    const N: u32 = 48;
    let p = pair(remote_all(), 128);
    let target = p.pd.alloc_shared(64 * N as usize, remote_all()).unwrap();
    let remote = target.remote().unwrap();
    let mut receivers = Vec::new();
    for _ in 0..N {
        let fut =
            p.b.post_recv(RecvRequest::new(p.pd.alloc(256, local()).unwrap()))
                .unwrap();
        receivers.push(tokio::spawn(fut));
    }
    let mut senders = Vec::new();
    for i in 0..N {
        let (a, pd) = (p.a.clone(), p.pd.clone());
        senders.push(tokio::spawn(async move {
            let msg = filled(&pd, 256, i as u8);
            let sent = a.post_send(SendRequest::send(msg).imm(i)).unwrap();
            let w = filled(&pd, 64, i as u8 + 1);
            let wrote = a
                .post_send(SendRequest::write(
                    w,
                    remote.slice(64 * u64::from(i), 64).unwrap(),
                ))
                .unwrap();
            // Awaited in reverse order of posting.
            within("write", wrote).await.unwrap();
            within("send", sent).await.unwrap();
        }));
    }
    for s in senders {
        within("sender task", s).await.unwrap();
    }
    let mut seen = vec![false; N as usize];
    for r in receivers {
        let mut c = within("receiver task", r).await.unwrap().unwrap();
        let i = c.imm_data().expect("imm") as usize;
        assert!(!seen[i], "message {i} twice");
        seen[i] = true;
        assert_eq!(&c.take_local().unwrap()[..], &pattern(256, i as u8)[..]);
    }
    assert!(seen.iter().all(|&s| s));
    let bytes = target.to_vec();
    for i in 0..N as usize {
        assert_eq!(
            &bytes[64 * i..64 * (i + 1)],
            &pattern(64, i as u8 + 1)[..],
            "write {i}"
        );
    }
    assert_eq!((p.a.outstanding(), p.b.outstanding()), (0, 0));
}

#[tokio::test]
#[ignore = "needs an RDMA device"]
async fn async_dropped_future_keeps_its_buffer_until_the_completion() {
    let p = pair(local(), 16);
    // A pending receive, polled (so it waits) and dropped.
    let mut abandoned =
        p.b.post_recv(RecvRequest::new(p.pd.alloc(64, local()).unwrap()))
            .unwrap();
    let poll = tokio::time::timeout(Duration::from_millis(50), &mut abandoned).await;
    assert!(poll.is_err(), "nothing was sent yet: {poll:?}");
    drop(abandoned);
    // The queue pair still owns the buffer; the dispatcher tracks the id.
    assert_eq!(p.b.queue_pair().recv_outstanding(), 1);
    assert_eq!(p.b.outstanding(), 1);
    // Its completion arrives now: the message lands in the abandoned buffer.
    ok(
        "first send",
        p.a.post_send(SendRequest::send(filled(&p.pd, 64, 1)))
            .unwrap(),
    )
    .await;
    assert_eq!(p.b.queue_pair().recv_outstanding(), 1, "not polled yet");
    // Later operations work, and the abandoned completion is dropped.
    let next =
        p.b.post_recv(RecvRequest::new(p.pd.alloc(64, local()).unwrap()))
            .unwrap();
    ok(
        "second send",
        p.a.post_send(SendRequest::send(filled(&p.pd, 64, 2)))
            .unwrap(),
    )
    .await;
    let mut c = ok("second recv", next).await;
    assert_eq!(&c.take_local().unwrap()[..], &pattern(64, 2)[..]);
    assert_eq!(
        (p.b.outstanding(), p.b.queue_pair().recv_outstanding()),
        (0, 0)
    );

    // A future whose completion was already filed, dropped uncollected.
    let r1 =
        p.b.post_recv(RecvRequest::new(p.pd.alloc(64, local()).unwrap()))
            .unwrap();
    let r2 =
        p.b.post_recv(RecvRequest::new(p.pd.alloc(64, local()).unwrap()))
            .unwrap();
    ok(
        "send 3",
        p.a.post_send(SendRequest::send(filled(&p.pd, 64, 3)))
            .unwrap(),
    )
    .await;
    ok(
        "send 4",
        p.a.post_send(SendRequest::send(filled(&p.pd, 64, 4)))
            .unwrap(),
    )
    .await;
    let mut c = ok("recv 4", r2).await;
    assert_eq!(&c.take_local().unwrap()[..], &pattern(64, 4)[..]);
    assert_eq!(p.b.outstanding(), 1, "r1's completion is filed");
    drop(r1);
    assert_eq!(p.b.outstanding(), 0);

    // A send dropped before it was ever polled; a later one collects it.
    let lost =
        p.a.post_send(SendRequest::send(filled(&p.pd, 64, 5)))
            .unwrap();
    drop(lost);
    let r =
        p.b.post_recv(RecvRequest::new(p.pd.alloc(64, local()).unwrap()))
            .unwrap();
    let r6 =
        p.b.post_recv(RecvRequest::new(p.pd.alloc(64, local()).unwrap()))
            .unwrap();
    ok(
        "send 6",
        p.a.post_send(SendRequest::send(filled(&p.pd, 64, 6)))
            .unwrap(),
    )
    .await;
    assert_eq!(
        p.a.outstanding(),
        0,
        "the dropped send's completion came first"
    );
    assert_eq!(p.a.queue_pair().send_outstanding(), 0);
    let mut c = ok("recv 5", r).await;
    assert_eq!(&c.take_local().unwrap()[..], &pattern(64, 5)[..]);
    ok("recv 6", r6).await;
    assert_eq!((p.a.outstanding(), p.b.outstanding()), (0, 0));
}

/// A queue pair wrapped again after its first wrapper was dropped with a
/// receive outstanding: that receive's completion carries the dispatcher's
/// mark and a `wr_id` the new wrapper could also give, and must not resolve
/// the new wrapper's future.
#[tokio::test]
#[ignore = "needs an RDMA device"]
async fn async_a_queue_pair_wrapped_again_never_resolves_with_the_first_wrappers_completion() {
    let dev = device();
    let pd = dev.ctx.alloc_pd().unwrap();
    let a = channel_qp(&dev, &pd, 16);
    let b = channel_qp(&dev, &pd, 16);
    connect_pair(&dev, &a, &b, local());
    let a = AsyncQueuePair::new(a).unwrap();
    let first = AsyncQueuePair::new(b.clone()).unwrap();
    let abandoned = first
        .post_recv(RecvRequest::new(pd.alloc(64, local()).unwrap()))
        .unwrap();
    let first_id = abandoned.wr_id();
    drop((abandoned, first));
    assert_eq!(b.recv_outstanding(), 1, "the store keeps its buffer");
    let again = AsyncQueuePair::new(b).unwrap();
    // 128 bytes: not the 64 of the first wrapper's receive.
    let mut next = again
        .post_recv(RecvRequest::new(pd.alloc(128, local()).unwrap()))
        .unwrap();
    assert_ne!(next.wr_id(), first_id);
    ok(
        "send 1",
        a.post_send(SendRequest::send(filled(&pd, 64, 1))).unwrap(),
    )
    .await;
    // The first wrapper's receive took send 1: `next` waits on.
    if let Ok(done) = tokio::time::timeout(Duration::from_millis(100), &mut next).await {
        panic!("resolved by the first wrapper's receive: {done:?}");
    }
    assert_eq!(again.queue_pair().recv_outstanding(), 1, "only next's");
    ok(
        "send 2",
        a.post_send(SendRequest::send(filled(&pd, 96, 2))).unwrap(),
    )
    .await;
    let mut c = ok("next", next).await;
    let buf = c.take_local().unwrap();
    assert_eq!((buf.len(), c.byte_len()), (128, 96), "its own buffer");
    assert_eq!(&buf[..96], &pattern(96, 2)[..]);
    assert_eq!(again.outstanding(), 0);
    assert_eq!(again.queue_pair().recv_outstanding(), 0);
}

#[tokio::test]
#[ignore = "needs an RDMA device"]
async fn async_error_completions_resolve_every_waiter() {
    let p = pair(local(), 16);
    let r1 =
        p.b.post_recv(RecvRequest::new(p.pd.alloc(64, local()).unwrap()))
            .unwrap();
    let r2 =
        p.b.post_recv(RecvRequest::new(p.pd.alloc(64, local()).unwrap()))
            .unwrap();
    let (t1, t2) = (tokio::spawn(r1), tokio::spawn(r2));
    tokio::time::sleep(Duration::from_millis(20)).await;
    p.b.queue_pair().to_err().unwrap();
    for t in [t1, t2] {
        match within("flushed recv", t).await.unwrap() {
            Err(rdma_verbs_tokio::Error::Verbs(Error::WorkCompletion { status, .. })) => {
                assert_eq!(status, WcStatus::WrFlushErr)
            }
            other => panic!("expected a flush error, got {other:?}"),
        }
    }
    assert_eq!(p.b.outstanding(), 0);
    // A write with a wrong remote key fails with a remote access error,
    // reported through the future.
    let q = pair(remote_all(), 16);
    let target = q.pd.alloc_shared(64, remote_all()).unwrap();
    let mut bad = target.remote().unwrap();
    bad.rkey.0 ^= 0x5a5a_0000;
    match within(
        "bad write",
        q.a.post_send(SendRequest::write(filled(&q.pd, 8, 0), bad))
            .unwrap(),
    )
    .await
    {
        Err(rdma_verbs_tokio::Error::Verbs(Error::WorkCompletion { status, wr_id, .. })) => {
            assert_eq!(status, WcStatus::RemAccessErr);
            assert_ne!(wr_id, 0);
        }
        other => panic!("expected a remote access error, got {other:?}"),
    }
    assert_eq!(q.a.outstanding(), 0);
}

#[test]
#[ignore = "needs an RDMA device"]
fn async_construction_errors() {
    let dev = device();
    let pd = dev.ctx.alloc_pd().unwrap();
    // Outside a runtime: an error, not a panic.
    let qp = channel_qp(&dev, &pd, 4);
    match AsyncQueuePair::new(qp.clone()) {
        Err(rdma_verbs_tokio::Error::NoRuntime {
            by: "AsyncQueuePair",
        }) => {}
        other => panic!("expected NoRuntime, got {other:?}"),
    }
    assert!(matches!(
        EventStream::new(&dev.ctx),
        Err(rdma_verbs_tokio::Error::NoRuntime { by: "EventStream" })
    ));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        // A CQ without a channel.
        let cq = dev.ctx.create_cq(256).build().unwrap();
        let plain = pd.create_qp(QpType::Rc, &cq, &cq).build().unwrap();
        match AsyncQueuePair::new(plain) {
            Err(rdma_verbs_tokio::Error::Verbs(Error::NoCompletionChannel {
                which: "AsyncQueuePair's send CQ",
            })) => {}
            other => panic!("expected NoCompletionChannel, got {other:?}"),
        }
        // One AsyncQueuePair per channel.
        let first = AsyncQueuePair::new(qp.clone()).unwrap();
        let second = AsyncQueuePair::new(qp.clone()).unwrap_err();
        assert!(
            matches!(
                second,
                rdma_verbs_tokio::Error::AlreadyDriven {
                    by: "AsyncQueuePair",
                    ..
                }
            ),
            "{second}"
        );
        // Posting on a queue pair in RESET is refused (its send queue's
        // handle is not handed out before RTS); nothing is tracked.
        let refused = first
            .post_send(SendRequest::send(pd.alloc(8, local()).unwrap()))
            .unwrap_err();
        assert!(
            matches!(
                refused.error,
                Error::NotReadyToSend {
                    state: QpState::Reset
                }
            ),
            "{refused}"
        );
        assert!(refused.buf.total_len() == 8);
        assert_eq!(first.outstanding(), 0);
    });
}

#[tokio::test]
#[ignore = "needs an RDMA device"]
async fn async_events_stream() {
    let t = device();
    let ctx = &t.ctx;
    let mut events = EventStream::new(ctx).unwrap();
    assert_eq!(events.context().name(), ctx.name());
    let twice = EventStream::new(ctx).unwrap_err();
    assert!(
        matches!(
            twice,
            rdma_verbs_tokio::Error::AlreadyDriven {
                by: "EventStream",
                ..
            }
        ),
        "{twice}"
    );
    // Nothing pending: `next` waits (without blocking the runtime).
    let quiet = tokio::time::timeout(Duration::from_millis(100), events.next()).await;
    assert!(quiet.is_err(), "unexpected event: {quiet:?}");
    // An SRQ below its armed limit raises IBV_EVENT_SRQ_LIMIT_REACHED.
    // Kept whole: dropping a part (the receiver, the SRQ) would end the test.
    let setup = common::srq_with_limit(&t);
    let cq = &setup.cq;
    let mut sender = setup.sender.send_queue().unwrap();
    for i in 0..6u8 {
        sender.send_inline(&[i], Wr::id(0)).unwrap();
    }
    common::wait(cq, 12);
    let ev = within("async event", events.next()).await.unwrap();
    assert_eq!(ev.event_type(), AsyncEventType::SrqLimitReached, "{ev:?}");
    assert_eq!(
        ev.element(),
        rdma_verbs::device::AsyncElement::Srq(Some(setup.srq.id())),
        "{ev:?}"
    );
    ctx.set_async_nonblocking(false).unwrap();
}

// ---------------------------------------------------------------------------
// The async_echo example, as server and client.
// ---------------------------------------------------------------------------

fn spawn(args: &[String]) -> Running {
    process::spawn(&common::example_bin("async_echo"), args)
}

#[test]
#[ignore = "needs an RDMA device"]
fn async_echo_example_server_and_client() {
    let _dev = device(); // fails the test without a device
    let mut args: Vec<String> = ["-p", "19150", "-n", "25", "-s", "1000", "-t", "20"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.extend(device_args());
    let server = spawn(&args);
    let mut client_args = args.clone();
    client_args.push("127.0.0.1".into());
    let client = spawn(&client_args).finish(Duration::from_secs(60));
    let server = server.finish(Duration::from_secs(30));
    let ok = |f: &Finished| f.status.is_some_and(|s| s.success());
    assert!(
        ok(&server) && ok(&client),
        "{}\n{}",
        server.describe(),
        client.describe()
    );
    assert!(
        client
            .describe()
            .contains("25 messages of 1000 bytes echoed and verified"),
        "{}",
        client.describe()
    );
    assert!(
        server.describe().contains("echoed 25 messages"),
        "{}",
        server.describe()
    );

    // Mismatched sizes: both sides fail with a message, never hang.
    let mut server_args = args.clone();
    server_args[1] = "19151".into();
    let server = spawn(&server_args);
    let mut client_args = server_args.clone();
    client_args[5] = "999".into();
    client_args.push("127.0.0.1".into());
    let client = spawn(&client_args).finish(Duration::from_secs(60));
    let server = server.finish(Duration::from_secs(30));
    for f in [&server, &client] {
        assert!(f.status.is_some_and(|s| !s.success()), "{}", f.describe());
        assert!(
            f.describe().contains("give both the same"),
            "{}",
            f.describe()
        );
    }
}
