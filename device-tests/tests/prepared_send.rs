//! Prepared send requests (`SendQueue::prepare`, `SendQueue::post_prepared`):
//! posted many times, buffers reachable only when nothing is outstanding,
//! every refusal undone (device tests).

mod common;

use std::sync::atomic::Ordering;

use common::{pair, pattern, remote_all, wait, wait_ok};
use rdma_verbs::{
    memory::SgList, AccessFlags, Completions, Error, QpState, QpType, QueuePair, RecvRequest,
    SendRequest, WcOpcode,
};

fn local() -> AccessFlags {
    AccessFlags::LOCAL_WRITE
}

/// Polls one completion with `poll_one` (the path the latency tools use).
fn poll_one_ok(cq: &rdma_verbs::CompletionQueue) -> rdma_verbs::Completion {
    let c = common::poll_until(|| cq.poll_one().unwrap());
    c.result().unwrap_or_else(|e| panic!("{e}: {c:?}"));
    c
}

#[test]
#[ignore = "needs an RDMA device"]
fn prepared_read_reposts_and_gives_the_bytes_back_between_postings() {
    let p = pair(QpType::Rc, remote_all(), |b| b);
    let source =
        p.pd.register(
            pattern(4096, 3),
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ,
        )
        .unwrap();
    let remote = source.memory_region().remote().unwrap();
    let dst = p.pd.alloc(256, local()).unwrap();
    let mut sq = p.a.send_queue().unwrap();
    let mut read = sq
        .prepare(SendRequest::read(dst, remote.slice(1024, 256).unwrap()).wr_id(9))
        .unwrap();
    assert_eq!(read.wr_id(), 9);
    assert!(!read.is_posted());
    let mut batch = Completions::with_capacity(4);
    for round in 0..200 {
        read.bytes_mut(0).unwrap().fill(0);
        sq.post_prepared(&mut read).unwrap();
        assert!(read.is_posted(), "round {round}");
        assert!(read.bytes(0).is_none(), "bytes reachable while posted");
        assert!(read.buffers().is_none());
        // Alternate the two claim paths: poll_one (owned) and the batch
        // poll (borrowed).
        if round % 2 == 0 {
            let mut c = poll_one_ok(&p.cq_a);
            assert_eq!((c.wr_id(), c.opcode()), (9, WcOpcode::RdmaRead));
            assert!(!c.is_orphan());
            assert!(matches!(c.take_buffers(), SgList::Empty));
        } else {
            let seen = common::poll_until(|| {
                let mut seen = 0;
                for mut c in p.cq_a.poll(&mut batch).unwrap() {
                    c.result().unwrap_or_else(|e| panic!("{e}: {c:?}"));
                    assert_eq!((c.wr_id(), c.opcode()), (9, WcOpcode::RdmaRead));
                    assert!(!c.is_orphan());
                    assert!(matches!(c.take_buffers(), SgList::Empty));
                    seen += 1;
                }
                (seen > 0).then_some(seen)
            });
            assert_eq!(seen, 1, "round {round}: one completion");
        }
        assert!(
            !read.is_posted(),
            "round {round}: the completion kept a count"
        );
        assert_eq!(read.bytes(0).unwrap(), &pattern(4096, 3)[1024..1280]);
    }
    let back = match read.into_buffers() {
        Ok(SgList::One(b)) => b.into_local().unwrap(),
        other => panic!("buffers not given back: {other:?}"),
    };
    assert_eq!(&back[..], &pattern(4096, 3)[1024..1280]);
}

#[test]
#[ignore = "needs an RDMA device"]
fn prepared_send_carries_the_payload_changed_between_postings() {
    let p = pair(QpType::Rc, local(), |b| b.max_recv_wr(8));
    let msg = p.pd.alloc(64, local()).unwrap();
    let mut sq = p.a.send_queue().unwrap();
    let mut rq = p.b.recv_queue().unwrap();
    let mut send = sq.prepare(SendRequest::send(msg).wr_id(4)).unwrap();
    for round in 0..20u8 {
        rq.recv(p.pd.alloc(64, local()).unwrap(), 0).unwrap();
        send.bytes_mut(0)
            .unwrap()
            .copy_from_slice(&pattern(64, round));
        sq.post_prepared(&mut send).unwrap();
        let c = poll_one_ok(&p.cq_a);
        assert_eq!((c.wr_id(), c.opcode()), (4, WcOpcode::Send));
        let mut r = wait_ok(&p.cq_b);
        assert_eq!(&r.take_local().unwrap()[..], &pattern(64, round)[..]);
    }
}

#[test]
#[ignore = "needs an RDMA device"]
fn prepared_inline_send_owns_a_copy_of_its_bytes() {
    let p = pair(QpType::Rc, local(), |b| {
        b.max_inline_data(64).max_recv_wr(4)
    });
    let mut data = pattern(32, 9);
    let mut sq = p.a.send_queue().unwrap();
    let mut rq = p.b.recv_queue().unwrap();
    let mut send = sq
        .prepare(SendRequest::send_inline(&data).wr_id(2))
        .unwrap();
    // The request copied the bytes: changing (or dropping) the source
    // does not change what is sent.
    data.fill(0);
    drop(data);
    for _ in 0..3 {
        rq.recv(p.pd.alloc(32, local()).unwrap(), 0).unwrap();
        sq.post_prepared(&mut send).unwrap();
        assert_eq!(poll_one_ok(&p.cq_a).wr_id(), 2);
        let mut r = wait_ok(&p.cq_b);
        assert_eq!(&r.take_local().unwrap()[..], &pattern(32, 9)[..]);
    }
    assert!(matches!(send.into_buffers(), Ok(SgList::Empty)));
}

#[test]
#[ignore = "needs an RDMA device"]
fn prepared_atomic_may_be_posted_again_before_it_completed() {
    let p = pair(QpType::Rc, remote_all(), |b| b.max_send_wr(8));
    let attr = p.dev.ctx.query_device().unwrap();
    if attr.atomic_cap() == rdma_verbs::device::AtomicCap::None {
        eprintln!("UNSUPPORTED on this device: atomics (atomic_cap NONE)");
        return;
    }
    let target = p.pd.alloc_shared(8, remote_all()).unwrap();
    let word = target.atomic_u64(0).unwrap();
    word.store(10, Ordering::SeqCst);
    let remote = target.remote().unwrap();
    let result = p.pd.alloc(8, local()).unwrap();
    let mut sq = p.a.send_queue().unwrap();
    let mut faa = sq
        .prepare(SendRequest::fetch_and_add(result, remote, 3).wr_id(77))
        .unwrap();
    for _ in 0..6 {
        sq.post_prepared(&mut faa).unwrap();
    }
    assert!(faa.is_posted());
    let done = wait(&p.cq_a, 6);
    assert!(done
        .iter()
        .all(|c| c.wr_id() == 77 && c.opcode() == WcOpcode::FetchAdd && c.is_success()));
    drop(done);
    assert!(!faa.is_posted(), "six completions, six counts back");
    assert_eq!(word.load(Ordering::SeqCst), 10 + 6 * 3);
    // The result buffer holds one of the old values (the device wrote it
    // six times; Rust reads it only now).
    let old = u64::from_ne_bytes(faa.bytes(0).unwrap().try_into().unwrap());
    assert!(
        (10..10 + 6 * 3).contains(&old) && (old - 10) % 3 == 0,
        "{old}"
    );
}

#[test]
#[ignore = "needs an RDMA device"]
fn prepared_requests_are_checked_once_and_refusals_are_undone() {
    let p = pair(QpType::Rc, remote_all(), |b| b.max_send_wr(2));
    let mut sq = p.a.send_queue().unwrap();
    // Unsignaled: its completion would never give the buffers back.
    let buf = p.pd.alloc(8, local()).unwrap();
    let e = sq
        .prepare(SendRequest::send(buf).signaled(false))
        .unwrap_err();
    assert!(matches!(e.error, Error::PreparedUnsignaled), "{}", e.error);
    assert_eq!(e.buf.total_len(), 8, "the buffer comes back");
    // A buffer of another protection domain.
    let other = p.dev.ctx.alloc_pd().unwrap();
    let foreign = other.alloc(8, local()).unwrap();
    let e = sq.prepare(SendRequest::send(foreign)).unwrap_err();
    assert!(
        matches!(e.error, Error::ForeignProtectionDomain { what: "buffer" }),
        "{}",
        e.error
    );

    // A queue pair that is not ready to send gives no send queue handle,
    // so nothing (prepared or not) can be posted to it before the
    // provider sees it.
    let cq = p.dev.ctx.create_cq(256).build().unwrap();
    let idle: QueuePair = p.pd.create_qp(QpType::Rc, &cq, &cq).build().unwrap();
    let e = idle.send_queue().unwrap_err();
    assert!(
        matches!(
            e,
            Error::NotReadyToSend {
                state: QpState::Reset
            }
        ),
        "{e}"
    );
    assert_eq!(idle.send_outstanding(), 0);

    // A full send queue: refused (by the library, at the queue pair's
    // send capacity, before the provider), nothing stays outstanding.
    // The writes are large (milliseconds each under SoftRoCE), so the
    // device cannot retire one while the next few are posted (with 8-byte
    // writes it sometimes did, and the queue never filled).
    const LEN: usize = 1 << 20;
    let target = p.pd.alloc_shared(LEN, remote_all()).unwrap();
    let mut write = sq
        .prepare(SendRequest::write(
            p.pd.alloc(LEN, local()).unwrap(),
            target.remote().unwrap(),
        ))
        .unwrap();
    let depth = p.a.send_capacity() as usize;
    let mut posted = 0;
    let refused = loop {
        match sq.post_prepared(&mut write) {
            Ok(()) => posted += 1,
            Err(e) => break e,
        }
        assert!(posted <= depth, "posted {posted} into a queue of {depth}");
    };
    assert!(
        matches!(refused, Error::QueueFull { queue: "send queue", depth: d } if d as usize == depth),
        "{refused}"
    );
    assert_eq!(posted, depth);
    assert_eq!(
        p.a.send_outstanding() as usize,
        posted,
        "the refusal took no entry"
    );
    drop(wait(&p.cq_a, posted));
    assert!(!write.is_posted());
    assert!(write.into_buffers().is_ok());
}

/// A prepared send follows its queue pair through state changes: no send
/// queue handle (so no posting) in RESET or INIT, a reset refused while a
/// handle lives, the same prepared requests posted again once the queue
/// pair is connected again, and in ERR postings are taken (and flushed);
/// a refusal keeps nothing outstanding.
#[test]
#[ignore = "needs an RDMA device"]
fn a_prepared_send_follows_the_queue_pairs_state_changes() {
    let dev = common::device();
    let pd = dev.ctx.alloc_pd().unwrap();
    let cq = dev.ctx.create_cq(256).build().unwrap();
    let qp = pd.create_qp(QpType::Rc, &cq, &cq).build().unwrap();
    let refused = |qp: &QueuePair, state: QpState, when: &str| {
        match qp.send_queue() {
            // Refused by the library, before the provider (rxe queues a
            // request it then refuses, and runs it after the next connect).
            Err(Error::NotReadyToSend { state: s }) if s == state => {}
            Err(e) => panic!("in {when}: expected NotReadyToSend, got {e:?}"),
            Ok(_) => panic!("a send queue handle in {when} was given"),
        }
    };
    refused(&qp, QpState::Reset, "RESET");
    common::connect_self(&dev, &qp, AccessFlags::empty());
    let (mut sq, mut rq) = (qp.send_queue().unwrap(), qp.recv_queue().unwrap());
    let mut send = sq
        .prepare(SendRequest::send(pd.alloc(16, local()).unwrap()).wr_id(1))
        .unwrap();
    let mut recv = rq
        .prepare(RecvRequest::new(pd.alloc(16, local()).unwrap()).wr_id(2))
        .unwrap();
    let mut handles = Some((sq, rq));
    for round in 0..3u8 {
        let (mut sq, mut rq) = match handles.take() {
            Some(h) => h,
            None => {
                // Connected again: the same prepared requests post again.
                common::connect_self(&dev, &qp, AccessFlags::empty());
                (qp.send_queue().unwrap(), qp.recv_queue().unwrap())
            }
        };
        send.bytes_mut(0).unwrap().fill(round);
        rq.post_prepared(&mut recv).unwrap();
        sq.post_prepared(&mut send).unwrap();
        for c in wait(&cq, 2) {
            c.result()
                .unwrap_or_else(|e| panic!("round {round}: {e}: {c:?}"));
        }
        assert!(!send.is_posted() && !recv.is_posted());
        assert_eq!(recv.bytes(0).unwrap(), &[round; 16][..]);
        // A reset waits for the handles to go.
        let e = qp.reset().unwrap_err();
        assert!(matches!(e, Error::HandleLive { .. }), "round {round}: {e}");
        drop((sq, rq));
        qp.reset().unwrap();
        refused(&qp, QpState::Reset, "RESET after RTS");
        assert!(!send.is_posted(), "a refusal kept a count");
        assert_eq!(qp.send_outstanding(), 0);
    }
    qp.to_init(dev.port, 0, AccessFlags::empty()).unwrap();
    refused(&qp, QpState::Init, "INIT");
    // An error state still takes postings (and flushes them).
    qp.to_err().unwrap();
    let mut sq = qp.send_queue().unwrap();
    sq.post_prepared(&mut send).unwrap();
    let c = wait(&cq, 1).pop().unwrap();
    assert_eq!(c.wr_id(), 1);
    assert!(c.result().is_err(), "{c:?}");
    assert!(send.into_buffers().is_ok());
    assert!(recv.into_buffers().is_ok());
}

#[test]
#[ignore = "needs an RDMA device"]
fn dropping_a_posted_request_keeps_its_buffers_until_the_completion() {
    let p = pair(QpType::Rc, remote_all(), |b| b);
    let source =
        p.pd.register(
            pattern(1 << 16, 1),
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ,
        )
        .unwrap();
    let dst = p.pd.alloc(1 << 16, local()).unwrap();
    let mut sq = p.a.send_queue().unwrap();
    let mut read = sq
        .prepare(SendRequest::read(dst, source.memory_region().remote().unwrap()).wr_id(5))
        .unwrap();
    sq.post_prepared(&mut read).unwrap();
    // The device may still be writing `dst`: the posting owns it now.
    drop(read);
    let mut c = poll_one_ok(&p.cq_a);
    assert_eq!(c.wr_id(), 5);
    assert!(matches!(c.take_buffers(), SgList::Empty));
}
