//! Prepared receive requests (`QueuePair::prepare_recv`,
//! `SharedReceiveQueue::prepare_recv`, `PreparedRecv::post`): posted many
//! times, each message's bytes reachable only once no posting is
//! outstanding, refusals undone, flushes claimed (device tests).

mod common;

use common::{pair, pattern, wait, wait_ok};
use ibverbs::{
    AccessFlags, CompletionQueue, Error, QpType, RecvRequest, SendRequest, SgList, WcOpcode,
    WcStatus, WorkCompletion,
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

#[test]
#[ignore = "needs an RDMA device"]
fn prepared_receives_repost_and_give_each_message_back() {
    let p = pair(QpType::Rc, local(), |b| b.max_recv_wr(4));
    // Two receives, told apart by wr_id, as a ping-pong's buffers.
    let mut recvs: Vec<_> = (0..2u64)
        .map(|i| {
            p.b.prepare_recv(RecvRequest::new(p.pd.alloc(64, local()).unwrap()).wr_id(i))
                .unwrap()
        })
        .collect();
    for r in &mut recvs {
        assert!(!r.is_posted());
        r.post().unwrap();
        assert!(r.is_posted());
        assert!(r.bytes(0).is_none(), "bytes reachable while posted");
        assert!(r.bytes_mut(0).is_none());
        assert!(r.buffers().is_none());
    }
    let mut send =
        p.a.prepare_send(SendRequest::send(p.pd.alloc(64, local()).unwrap()))
            .unwrap();
    let mut wc = WorkCompletion::default();
    for round in 0..40u8 {
        send.bytes_mut(0)
            .unwrap()
            .copy_from_slice(&pattern(64, round));
        send.post().unwrap();
        drop(wait_ok(&p.cq_a));
        // Alternate the claim paths: poll_one and the batch poll.
        let (wr_id, sg, len, opcode) = if round % 2 == 0 {
            let sg = poll_into_ok(&p.cq_b, &mut wc);
            (wc.wr_id(), sg, wc.byte_len(), wc.opcode())
        } else {
            let mut c = wait_ok(&p.cq_b);
            (c.wr_id(), c.take_buffers(), c.byte_len(), c.opcode())
        };
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
        r.post().unwrap();
    }
    assert!(recvs.iter().all(|r| r.is_posted()));
}

#[test]
#[ignore = "needs an RDMA device"]
fn a_receive_posted_twice_shows_its_bytes_only_after_both_messages() {
    let p = pair(QpType::Rc, local(), |b| b.max_recv_wr(4));
    let mut recv =
        p.b.prepare_recv(RecvRequest::new(p.pd.alloc(32, local()).unwrap()).wr_id(3))
            .unwrap();
    recv.post().unwrap();
    recv.post().unwrap();
    for seed in [1u8, 2] {
        let msg = p.pd.register(pattern(32, seed), local()).unwrap();
        p.a.post_send(SendRequest::send(msg)).unwrap();
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
    // A buffer of another protection domain.
    let other = p.dev.ctx.alloc_pd().unwrap();
    let e =
        p.b.prepare_recv(RecvRequest::new(other.alloc(8, local()).unwrap()))
            .unwrap_err();
    assert!(
        matches!(e.error, Error::ForeignProtectionDomain { what: "buffer" }),
        "{}",
        e.error
    );
    // A buffer the device may not write.
    let e =
        p.b.prepare_recv(RecvRequest::new(
            p.pd.alloc(8, AccessFlags::empty()).unwrap(),
        ))
        .unwrap_err();
    assert!(
        matches!(e.error, Error::MissingAccess { needed, .. } if needed == AccessFlags::LOCAL_WRITE),
        "{}",
        e.error
    );
    // A queue pair receiving through an SRQ: prepare there.
    let srq = p.pd.create_srq(4).build().unwrap();
    let on_srq =
        p.pd.create_qp(QpType::Rc, &p.cq_b, &p.cq_b)
            .srq(&srq)
            .build()
            .unwrap();
    let e = on_srq
        .prepare_recv(RecvRequest::new(p.pd.alloc(8, local()).unwrap()))
        .unwrap_err();
    assert!(matches!(e.error, Error::ReceivesThroughSrq), "{}", e.error);
    assert!(
        matches!(e.request.into_buffers(), SgList::One(_)),
        "the refused request keeps its buffer"
    );

    // A full receive queue: the provider refuses, and the refused posting
    // leaves no count behind.
    let mut recv =
        p.b.prepare_recv(RecvRequest::new(p.pd.alloc(8, local()).unwrap()).wr_id(6))
            .unwrap();
    let depth = p.b.caps().max_recv_wr as usize;
    let mut posted = 0;
    let refused = loop {
        match recv.post() {
            Ok(()) => posted += 1,
            Err(e) => break e,
        }
        assert!(posted <= depth, "posted {posted} into a queue of {depth}");
    };
    assert!(
        matches!(&refused, Error::Verb { verb, .. } if *verb == "ibv_post_recv"),
        "{refused}"
    );
    assert_eq!(posted, depth);
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
    let mut recv = srq
        .prepare_recv(RecvRequest::new(pd.alloc(48, local()).unwrap()).wr_id(11))
        .unwrap();
    for seed in 0..10u8 {
        recv.post().unwrap();
        let msg = pd.register(pattern(48, seed), local()).unwrap();
        client.post_send(SendRequest::send(msg)).unwrap();
        drop(wait_ok(&cq_c));
        let c = wait_ok(&cq_s);
        assert_eq!((c.wr_id(), c.qp_num()), (11, server.qp_num().0));
        assert_eq!(recv.bytes(0).unwrap(), &pattern(48, seed)[..]);
    }
    // Receives posted this way take no slot of the SRQ's table.
    assert_eq!(srq.outstanding(), 0);
}

#[test]
#[ignore = "needs an RDMA device"]
fn dropping_a_posted_receive_keeps_its_buffer_until_the_message() {
    let p = pair(QpType::Rc, local(), |b| b);
    let mut recv =
        p.b.prepare_recv(RecvRequest::new(p.pd.alloc(1 << 16, local()).unwrap()).wr_id(8))
            .unwrap();
    recv.post().unwrap();
    // The device may write the buffer whenever a message comes: the
    // posting owns it now.
    drop(recv);
    let msg = p.pd.register(pattern(1 << 16, 4), local()).unwrap();
    p.a.post_send(SendRequest::send(msg)).unwrap();
    drop(wait_ok(&p.cq_a));
    let mut c = wait_ok(&p.cq_b);
    assert_eq!((c.wr_id(), c.byte_len()), (8, 1 << 16));
    assert!(matches!(c.take_buffers(), SgList::Empty));
}
