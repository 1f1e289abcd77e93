//! Prepared receive requests (`RecvQueue::prepare` on a queue pair's or a
//! shared receive queue's handle, `RecvQueue::post_prepared`): posted many
//! times, each message's bytes reachable only once no posting is
//! outstanding, refusals undone, flushes claimed (device tests).

mod common;

use common::{pair, pattern, wait, wait_ok};
use rdma_verbs::{
    cq::WorkCompletion, memory::SgList, AccessFlags, CompletionQueue, Completions, Error, QpType,
    RecvRequest, SendRequest, WcOpcode, WcStatus, Wr,
};

fn local() -> AccessFlags {
    AccessFlags::LOCAL_WRITE
}

/// Polls one completion with `poll_one`, copies its entry into `wc` and
/// checks it succeeded; returns its buffers.
fn poll_into_ok(cq: &CompletionQueue, wc: &mut WorkCompletion) -> SgList {
    let mut c = common::poll_until(|| cq.poll_one().unwrap());
    *wc = *c.wc();
    wc.result().unwrap_or_else(|e| panic!("{e}: {wc:?}"));
    c.take_buffers()
}

/// As [`poll_into_ok`], with a borrowed batch poll (exactly one
/// completion expected).
fn poll_batch_into_ok(
    cq: &CompletionQueue,
    batch: &mut Completions,
    wc: &mut WorkCompletion,
) -> SgList {
    common::poll_until(|| {
        let polled = cq.poll(batch).unwrap();
        assert!(polled.len() <= 1, "one completion at a time");
        let mut sg = None;
        for mut c in polled {
            *wc = *c.wc();
            c.result().unwrap_or_else(|e| panic!("{e}: {c:?}"));
            sg = Some(c.take_buffers());
        }
        sg
    })
}

#[test]
#[ignore = "needs an RDMA device"]
fn prepared_receives_repost_and_give_each_message_back() {
    let p = pair(QpType::Rc, local(), |b| b.max_recv_wr(4));
    let mut sq = p.a.send_queue().unwrap();
    let mut rq = p.b.recv_queue().unwrap();
    // Two receives, told apart by wr_id, as a ping-pong's buffers.
    let mut recvs: Vec<_> = (0..2u64)
        .map(|i| {
            rq.prepare(RecvRequest::new(p.pd.alloc(64, local()).unwrap()).wr_id(i))
                .unwrap()
        })
        .collect();
    for r in &mut recvs {
        assert!(!r.is_posted());
        rq.post_prepared(r).unwrap();
        assert!(r.is_posted());
        assert!(r.bytes(0).is_none(), "bytes reachable while posted");
        assert!(r.bytes_mut(0).is_none());
        assert!(r.buffers().is_none());
    }
    let mut send = sq
        .prepare(SendRequest::send(p.pd.alloc(64, local()).unwrap()))
        .unwrap();
    let mut wc = WorkCompletion::default();
    let mut batch = Completions::with_capacity(4);
    for round in 0..40u8 {
        send.bytes_mut(0)
            .unwrap()
            .copy_from_slice(&pattern(64, round));
        sq.post_prepared(&mut send).unwrap();
        drop(wait_ok(&p.cq_a));
        // Alternate the claim paths: poll_one (owned) and the batch poll
        // (borrowed).
        let sg = if round % 2 == 0 {
            poll_into_ok(&p.cq_b, &mut wc)
        } else {
            poll_batch_into_ok(&p.cq_b, &mut batch, &mut wc)
        };
        let (wr_id, len, opcode) = (wc.wr_id(), wc.byte_len(), wc.opcode());
        assert_eq!(
            (wr_id, len, opcode),
            (u64::from(round % 2), 64, WcOpcode::Recv),
            "round {round}: receives complete in the order posted"
        );
        assert!(
            matches!(sg, SgList::Empty),
            "a prepared receive's buffer stays with it"
        );
        let r = &mut recvs[wr_id as usize];
        assert!(!r.is_posted(), "round {round}: the completion kept a count");
        assert_eq!(r.bytes(0).unwrap(), &pattern(64, round)[..]);
        r.bytes_mut(0).unwrap().fill(0);
        rq.post_prepared(r).unwrap();
    }
    assert!(recvs.iter().all(|r| r.is_posted()));
}

#[test]
#[ignore = "needs an RDMA device"]
fn a_receive_posted_twice_shows_its_bytes_only_after_both_messages() {
    let p = pair(QpType::Rc, local(), |b| b.max_recv_wr(4));
    let mut sq = p.a.send_queue().unwrap();
    let mut rq = p.b.recv_queue().unwrap();
    let mut recv = rq
        .prepare(RecvRequest::new(p.pd.alloc(32, local()).unwrap()).wr_id(3))
        .unwrap();
    rq.post_prepared(&mut recv).unwrap();
    rq.post_prepared(&mut recv).unwrap();
    for seed in [1u8, 2] {
        let msg = p.pd.register(pattern(32, seed), local()).unwrap();
        sq.send(msg, Wr::id(0)).unwrap();
        drop(wait_ok(&p.cq_a));
        let c = wait_ok(&p.cq_b);
        assert_eq!(c.wr_id(), 3);
        if seed == 1 {
            // The second posting may still receive: Rust must not look.
            assert!(recv.is_posted());
            assert!(recv.bytes(0).is_none());
        }
    }
    assert!(!recv.is_posted());
    assert_eq!(recv.bytes(0).unwrap(), &pattern(32, 2)[..]);
    let back = match recv.into_buffers() {
        Ok(SgList::One(b)) => b.into_local().unwrap(),
        other => panic!("buffers not given back: {other:?}"),
    };
    assert_eq!(&back[..], &pattern(32, 2)[..]);
}

#[test]
#[ignore = "needs an RDMA device"]
fn prepared_receives_are_checked_once_and_refusals_are_undone() {
    let p = pair(QpType::Rc, local(), |b| b.max_recv_wr(2));
    let mut rq = p.b.recv_queue().unwrap();
    // A buffer of another protection domain.
    let other = p.dev.ctx.alloc_pd().unwrap();
    let e = rq
        .prepare(RecvRequest::new(other.alloc(8, local()).unwrap()))
        .unwrap_err();
    assert!(
        matches!(e.error, Error::ForeignProtectionDomain { what: "buffer" }),
        "{}",
        e.error
    );
    assert!(
        matches!(e.buf, SgList::One(_)),
        "the refused request keeps its buffer"
    );
    // A buffer the device may not write.
    let e = rq
        .prepare(RecvRequest::new(
            p.pd.alloc(8, AccessFlags::empty()).unwrap(),
        ))
        .unwrap_err();
    assert!(
        matches!(e.error, Error::MissingAccess { needed, .. } if needed == AccessFlags::LOCAL_WRITE),
        "{}",
        e.error
    );
    // A queue pair receiving through an SRQ has no receive queue handle
    // to prepare on: prepare on the SRQ's.
    let srq = p.pd.create_srq(4).build().unwrap();
    let on_srq =
        p.pd.create_qp(QpType::Rc, &p.cq_b, &p.cq_b)
            .srq(&srq)
            .build()
            .unwrap();
    let e = on_srq.recv_queue().unwrap_err();
    assert!(matches!(e, Error::ReceivesThroughSrq), "{e}");

    // A full receive queue: refused (by the library, at the queue pair's
    // receive capacity, before the provider), and the refused posting
    // leaves no count behind.
    let mut recv = rq
        .prepare(RecvRequest::new(p.pd.alloc(8, local()).unwrap()).wr_id(6))
        .unwrap();
    let depth = p.b.recv_capacity() as usize;
    let mut posted = 0;
    let refused = loop {
        match rq.post_prepared(&mut recv) {
            Ok(()) => posted += 1,
            Err(e) => break e,
        }
        assert!(posted <= depth, "posted {posted} into a queue of {depth}");
    };
    assert!(
        matches!(&refused, Error::QueueFull { queue: "receive queue", depth: d } if *d as usize == depth),
        "{refused}"
    );
    assert_eq!(posted, depth);
    assert_eq!(
        p.b.recv_outstanding() as usize,
        posted,
        "the refusal took no entry"
    );
    // Outstanding receives come back as flushes once the queue pair
    // fails: each flush gives its count back.
    p.b.to_err().unwrap();
    let flushed = wait(&p.cq_b, posted);
    for c in &flushed {
        assert_eq!((c.wr_id(), c.status()), (6, WcStatus::WrFlushErr));
    }
    assert!(
        !recv.is_posted(),
        "a refused or flushed posting kept its count"
    );
    assert!(recv.into_buffers().is_ok());
}

#[test]
#[ignore = "needs an RDMA device"]
fn a_prepared_receive_on_a_shared_receive_queue_serves_its_queue_pairs() {
    let dev = common::device();
    let pd = dev.ctx.alloc_pd().unwrap();
    let srq = pd.create_srq(8).build().unwrap();
    let cq_s = dev.ctx.create_cq(256).build().unwrap();
    let cq_c = dev.ctx.create_cq(256).build().unwrap();
    let server = pd
        .create_qp(QpType::Rc, &cq_s, &cq_s)
        .srq(&srq)
        .build()
        .unwrap();
    let client = pd.create_qp(QpType::Rc, &cq_c, &cq_c).build().unwrap();
    common::connect_pair(&dev, &server, &client, local());
    let mut rq = srq.recv_queue().unwrap();
    let mut sq = client.send_queue().unwrap();
    let mut recv = rq
        .prepare(RecvRequest::new(pd.alloc(48, local()).unwrap()).wr_id(11))
        .unwrap();
    for seed in 0..10u8 {
        rq.post_prepared(&mut recv).unwrap();
        // Each posting takes an entry of the SRQ until it is claimed.
        assert_eq!(srq.outstanding(), 1);
        let msg = pd.register(pattern(48, seed), local()).unwrap();
        sq.send(msg, Wr::id(0)).unwrap();
        drop(wait_ok(&cq_c));
        let c = wait_ok(&cq_s);
        assert_eq!((c.wr_id(), c.qp_num()), (11, server.qp_num().0));
        assert_eq!(recv.bytes(0).unwrap(), &pattern(48, seed)[..]);
    }
    // Every posting was claimed: nothing is left outstanding.
    assert_eq!(srq.outstanding(), 0);
}

#[test]
#[ignore = "needs an RDMA device"]
fn dropping_a_posted_receive_keeps_its_buffer_until_the_message() {
    let p = pair(QpType::Rc, local(), |b| b);
    let mut rq = p.b.recv_queue().unwrap();
    let mut recv = rq
        .prepare(RecvRequest::new(p.pd.alloc(1 << 16, local()).unwrap()).wr_id(8))
        .unwrap();
    rq.post_prepared(&mut recv).unwrap();
    // The device may write the buffer whenever a message comes: the
    // posting owns it now.
    drop(recv);
    let msg = p.pd.register(pattern(1 << 16, 4), local()).unwrap();
    p.a.send_queue().unwrap().send(msg, Wr::id(0)).unwrap();
    drop(wait_ok(&p.cq_a));
    let mut c = wait_ok(&p.cq_b);
    assert_eq!((c.wr_id(), c.byte_len()), (8, 1 << 16));
    assert!(matches!(c.take_buffers(), SgList::Empty));
}
