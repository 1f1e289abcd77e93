//! Error completions as typed statuses, arguments rejected before posting,
//! and the run-time half of the ownership model: flushes hand every buffer
//! back, dropped queue pairs release buffers only after destruction, stale
//! completions never match another queue's buffers (device tests).

mod common;

use common::{pair, remote_all, wait, wait_ok};
use rdma_verbs::{
    error::TransitionReason,
    memory::{RemoteKey, SgList},
    qp::SendOp,
    sys, AccessFlags, Error, QpState, QpType, RecvRequest, WcStatus, Wr,
};

fn local() -> AccessFlags {
    AccessFlags::LOCAL_WRITE
}

#[test]
#[ignore = "needs an RDMA device"]
fn wrong_rkey_is_a_remote_access_error() {
    let p = pair(QpType::Rc, remote_all(), |b| b);
    let target = p.pd.alloc_shared(64, remote_all()).unwrap();
    let mut remote = target.remote().unwrap();
    remote.rkey = RemoteKey(remote.rkey.0 ^ 0x5a5a_0000);
    let src = p.pd.alloc(8, local()).unwrap();
    let mut sq = p.a.send_queue().unwrap();
    sq.write(src, remote, Wr::id(3)).unwrap();
    let mut c = wait(&p.cq_a, 1).pop().unwrap();
    assert_eq!(c.status(), WcStatus::RemAccessErr, "{c:?}");
    assert!(matches!(
        c.result(),
        Err(Error::WorkCompletion {
            status: WcStatus::RemAccessErr,
            wr_id: 3,
            ..
        })
    ));
    assert!(
        c.take_local().is_some(),
        "the buffer comes back with the error"
    );
    assert_eq!(p.a.state().unwrap(), QpState::Err);
}

#[test]
#[ignore = "needs an RDMA device"]
fn out_of_range_remote_address_is_a_remote_access_error() {
    let p = pair(QpType::Rc, remote_all(), |b| b);
    let target = p.pd.alloc_shared(4096, remote_all()).unwrap();
    let mut remote = target.remote().unwrap();
    remote.addr += 4096; // one past the end of the region
    remote.len = 64;
    let dst = p.pd.alloc(64, local()).unwrap();
    let mut sq = p.a.send_queue().unwrap();
    sq.read(dst, remote, Wr::id(0)).unwrap();
    let c = wait(&p.cq_a, 1).pop().unwrap();
    assert_eq!(c.status(), WcStatus::RemAccessErr, "{c:?}");
}

#[test]
#[ignore = "needs an RDMA device"]
fn receive_too_small_is_a_local_error_completion() {
    let p = pair(QpType::Rc, local(), |b| b);
    let (mut sq, mut rq) = (p.a.send_queue().unwrap(), p.b.recv_queue().unwrap());
    rq.recv(p.pd.alloc(16, local()).unwrap(), 0).unwrap();
    sq.send(p.pd.alloc(64, local()).unwrap(), Wr::id(0))
        .unwrap();
    let mut r = wait(&p.cq_b, 1).pop().unwrap();
    // IBA and hardware (e.g. mlx5) report LOC_LEN_ERR; SoftRoCE in Linux
    // 6.12 reports LOC_QP_OP_ERR for the same event (observed).
    let expected = if common::is_rxe(&p.dev) {
        WcStatus::LocQpOpErr
    } else {
        WcStatus::LocLenErr
    };
    assert_eq!(r.status(), expected, "{r:?}");
    assert_eq!(r.take_local().unwrap().len(), 16);
    // The sender sees its request fail too (remote operation/invalid request).
    let s = wait(&p.cq_a, 1).pop().unwrap();
    assert!(!s.is_success(), "{s:?}");
}

#[test]
#[ignore = "needs an RDMA device"]
fn qp_in_error_flushes_and_returns_every_buffer() {
    let p = pair(QpType::Rc, local(), |b| b.max_recv_wr(16));
    let mut recvs: Vec<_> = (0..10)
        .map(|i| RecvRequest::new(p.pd.alloc(128, local()).unwrap()).wr_id(i))
        .collect();
    let (mut sq, mut rq) = (p.a.send_queue().unwrap(), p.b.recv_queue().unwrap());
    rq.post_chain(&mut recvs).unwrap();
    p.b.to_err().unwrap();
    assert_eq!(p.b.state().unwrap(), QpState::Err);
    let flushed = wait(&p.cq_b, 10);
    let mut ids = Vec::new();
    for mut c in flushed {
        assert_eq!(c.status(), WcStatus::WrFlushErr, "{c:?}");
        assert_eq!(c.take_local().unwrap().len(), 128);
        ids.push(c.wr_id());
    }
    ids.sort();
    assert_eq!(ids, (0..10).collect::<Vec<_>>());
    assert_eq!(p.b.recv_outstanding(), 0);
    // Sends posted before the error are flushed on the other side too.
    p.a.to_err().unwrap();
    sq.send(p.pd.alloc(8, local()).unwrap(), Wr::id(99))
        .unwrap();
    let mut c = wait(&p.cq_a, 1).pop().unwrap();
    assert_eq!((c.wr_id(), c.status()), (99, WcStatus::WrFlushErr));
    assert!(c.take_local().is_some());
}

#[test]
#[ignore = "needs an RDMA device"]
fn invalid_arguments_are_rejected_before_posting() {
    let p = pair(QpType::Rc, remote_all(), |b| {
        b.max_send_wr(4).max_recv_wr(4).max_inline_data(64)
    });
    let remote =
        p.pd.alloc_shared(64, remote_all())
            .unwrap()
            .remote()
            .unwrap();
    let mut sq = p.a.send_queue().unwrap();
    let (mut rq_a, mut rq_b) = (p.a.recv_queue().unwrap(), p.b.recv_queue().unwrap());
    // Misaligned atomics: the local result buffer and the remote target.
    let (_, odd) = p.pd.alloc(16, local()).unwrap().split_at(4);
    let (odd8, _) = odd.split_at(8);
    let odd_addr = odd8.addr();
    let e = sq.fetch_and_add(odd8, remote, 1, Wr::id(0)).unwrap_err();
    assert!(
        matches!(e.error, Error::Misaligned { addr, align: 8 } if addr == odd_addr),
        "{}",
        e.error
    );
    let mut misaligned = remote;
    misaligned.addr += 4;
    let e = sq
        .compare_and_swap(p.pd.alloc(8, local()).unwrap(), misaligned, 0, 1, Wr::id(0))
        .unwrap_err();
    assert!(
        matches!(e.error, Error::Misaligned { addr, align: 8 } if addr == misaligned.addr),
        "{}",
        e.error
    );
    // The refused request comes back with its buffer.
    assert_eq!(e.buf.len(), 8);

    // Inline data larger than the QP's cap.
    let cap = p.a.caps().max_inline_data as usize;
    let big = vec![0u8; cap + 1];
    let e = sq.send_inline(&big, Wr::id(0)).unwrap_err();
    assert!(
        matches!(e, Error::InlineTooLarge { len, max } if len as usize == cap + 1 && max as usize == cap),
        "{e}"
    );
    // More SGEs than the QP allows.
    let max_sge = p.a.caps().max_send_sge;
    let sges = (0..max_sge + 1)
        .map(|_| p.pd.alloc(8, local()).unwrap().into())
        .collect();
    let e = sq.send_sgl(sges, Wr::id(0)).unwrap_err();
    assert!(
        matches!(e.error, Error::TooManySges { got, max } if got == max_sge as usize + 1 && max == max_sge),
        "{}",
        e.error
    );
    // Unsignaled request with an exclusive buffer.
    let e = sq
        .send(p.pd.alloc(8, local()).unwrap(), Wr::id(0).unsignaled())
        .unwrap_err();
    assert!(
        matches!(e.error, Error::UnsignaledExclusive { op: SendOp::Send }),
        "{}",
        e.error
    );
    assert_eq!(e.buf.len(), 8);
    // A buffer of another protection domain.
    let other_pd = p.dev.ctx.alloc_pd().unwrap();
    let e = rq_a
        .recv(other_pd.alloc(8, local()).unwrap(), 0)
        .unwrap_err();
    assert!(
        matches!(e.error, Error::ForeignProtectionDomain { what: "buffer" }),
        "{}",
        e.error
    );
    // A device write into memory registered without LOCAL_WRITE.
    let ro =
        p.pd.register(vec![0u8; 8], AccessFlags::REMOTE_READ)
            .unwrap();
    let e = rq_a.recv(ro, 0).unwrap_err();
    assert!(
        matches!(e.error, Error::MissingAccess { needed, .. } if needed == AccessFlags::LOCAL_WRITE),
        "{}",
        e.error
    );
    // A remote range outside its region cannot even be described.
    assert!(remote.slice(60, 8).is_none());

    // More requests than the queue holds: the depth asked for (4 above),
    // however deep the device made the queue.
    let depth = p.b.recv_capacity() as usize;
    assert_eq!(depth, 4, "the safe path holds the depth asked for");
    assert!(p.b.caps().max_recv_wr as usize >= depth);
    let mut many: Vec<_> = (0..depth + 1)
        .map(|_| RecvRequest::new(p.pd.alloc(8, local()).unwrap()))
        .collect();
    match rq_b.post_chain(&mut many) {
        Err(Error::QueueFull { queue, depth: d }) => {
            assert_eq!(queue, "receive queue");
            assert_eq!(d as usize, depth);
        }
        other => panic!("expected QueueFull, got {other:?}"),
    }
    assert_eq!(
        many.len(),
        depth + 1,
        "nothing posted, every request handed back"
    );
    assert_eq!(p.b.recv_outstanding(), 0);
    // Nothing above reached the device.
    common::assert_quiet(&p.cq_a);
    common::assert_quiet(&p.cq_b);

    // One at a time: the table refuses the request past its last slot,
    // although the device's deeper queue would take it, and hands it back.
    let last = many.pop().unwrap();
    for r in many {
        rq_b.post_chain(&mut vec![r]).unwrap();
    }
    let mut last = vec![last];
    let refused = rq_b.post_chain(&mut last).unwrap_err();
    assert!(
        matches!(refused, Error::QueueFull { depth: d, .. } if d as usize == depth),
        "{refused}"
    );
    assert!(
        matches!(
            last.pop()
                .expect("the refused request stays")
                .into_buffers(),
            SgList::One(_)
        ),
        "the refused request keeps its buffer"
    );
    assert_eq!(p.b.recv_outstanding() as usize, depth);
    p.b.to_err().unwrap();
    assert_eq!(wait(&p.cq_b, depth).len(), depth, "every receive flushed");
    assert_eq!(p.b.recv_outstanding(), 0);
}

#[test]
#[ignore = "needs an RDMA device"]
fn illegal_state_transitions_are_named() {
    let dev = common::device();
    let pd = dev.ctx.alloc_pd().unwrap();
    let cq = dev.ctx.create_cq(256).build().unwrap();
    let qp = pd.create_qp(QpType::Rc, &cq, &cq).build().unwrap();
    assert_eq!(qp.state().unwrap(), QpState::Reset);
    // RESET -> RTR skips INIT.
    let e = qp
        .modify(&rdma_verbs::qp::QpAttr::new().qp_state(QpState::Rtr))
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::InvalidTransition {
                from: QpState::Reset,
                to: QpState::Rtr,
                ..
            }
        ),
        "{e}"
    );
    // RESET -> INIT without the port.
    let e = qp
        .modify(
            &rdma_verbs::qp::QpAttr::new()
                .qp_state(QpState::Init)
                .pkey_index(0)
                .qp_access_flags(AccessFlags::LOCAL_WRITE),
        )
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::InvalidTransition {
                reason: TransitionReason::Missing(m),
                ..
            } if m == sys::ibv_qp_attr_mask::IBV_QP_PORT
        ),
        "{e}"
    );
    assert!(e.to_string().contains("IBV_QP_PORT"), "{e}");
    qp.to_init(dev.port, 0, AccessFlags::LOCAL_WRITE).unwrap();
    assert_eq!(qp.state().unwrap(), QpState::Init);
    // Posting a send before RTS is refused before the provider sees it:
    // the send queue's handle is not handed out in INIT.
    let err = qp.send_queue().unwrap_err();
    assert!(
        matches!(
            err,
            Error::NotReadyToSend {
                state: QpState::Init
            }
        ),
        "{err}"
    );
    assert_eq!(
        qp.send_outstanding(),
        0,
        "the refused request left no slot behind"
    );
    qp.reset().unwrap();
    assert_eq!(qp.state().unwrap(), QpState::Reset);
}

#[test]
#[ignore = "needs an RDMA device"]
fn dropping_a_qp_with_outstanding_requests_releases_them_after_destroy() {
    let dev = common::device();
    let pd = dev.ctx.alloc_pd().unwrap();
    let cq = dev.ctx.create_cq(256).build().unwrap();
    let qp = pd.create_qp(QpType::Rc, &cq, &cq).build().unwrap();
    common::connect_self(&dev, &qp, AccessFlags::LOCAL_WRITE);
    let mut rq = qp.recv_queue().unwrap();
    for _ in 0..4 {
        rq.recv(pd.alloc(64, AccessFlags::LOCAL_WRITE).unwrap(), 0)
            .unwrap();
    }
    // The handle keeps the queue pair alive: it goes first.
    drop(rq);
    drop(qp);
    drop(cq);
    // The buffers (and so their MRs) were released with the QP: the PD is
    // the last user and deallocates cleanly.
    assert!(pd.close().unwrap(), "PD still referenced: buffers leaked");
}

#[test]
#[ignore = "needs an RDMA device"]
fn stale_completions_of_a_destroyed_qp_are_orphans() {
    let dev = common::device();
    let pd = dev.ctx.alloc_pd().unwrap();
    let cq = dev.ctx.create_cq(256).build().unwrap();
    let old = pd.create_qp(QpType::Rc, &cq, &cq).build().unwrap();
    common::connect_self(&dev, &old, AccessFlags::LOCAL_WRITE);
    let (mut sq, mut rq) = (old.send_queue().unwrap(), old.recv_queue().unwrap());
    for i in 0..3u64 {
        rq.recv(pd.alloc(8, AccessFlags::LOCAL_WRITE).unwrap(), 0)
            .unwrap();
        sq.send_inline(&i.to_le_bytes(), Wr::id(0)).unwrap();
    }
    // Let the traffic complete into the CQ, unpolled, then destroy the QP
    // (its handles keep it alive: they go first).
    std::thread::sleep(std::time::Duration::from_millis(200));
    drop((sq, rq));
    assert!(old.close().unwrap());
    // A new QP on the same CQ, with requests in flight of its own.
    let new = pd.create_qp(QpType::Rc, &cq, &cq).build().unwrap();
    common::connect_self(&dev, &new, AccessFlags::LOCAL_WRITE);
    let (mut sq, mut rq) = (new.send_queue().unwrap(), new.recv_queue().unwrap());
    rq.recv(pd.alloc(8, AccessFlags::LOCAL_WRITE).unwrap(), 500)
        .unwrap();
    let stale = wait(&cq, 6);
    assert!(stale.iter().all(|c| c.is_orphan()), "{stale:?}");
    assert_eq!(
        new.recv_outstanding(),
        1,
        "the new QP's request is untouched"
    );
    sq.send_inline(b"fresh!!!", Wr::id(0)).unwrap();
    let mut got = wait(&cq, 2);
    got.sort_by_key(|c| c.wr_id());
    let mut r = got.pop().unwrap();
    assert_eq!(r.wr_id(), 500);
    assert_eq!(&r.take_local().unwrap()[..], b"fresh!!!");
    wait_ok_all(got);
}

fn wait_ok_all(cs: Vec<rdma_verbs::Completion>) {
    for c in cs {
        c.result().unwrap();
    }
}

#[test]
#[ignore = "needs an RDMA device"]
fn forgetting_a_buffer_or_request_is_harmless() {
    let p = pair(QpType::Rc, local(), |b| b);
    // Forgetting an unposted buffer leaks it; nothing else is affected.
    std::mem::forget(p.pd.alloc(64, local()).unwrap());
    let (mut sq, mut rq) = (p.a.send_queue().unwrap(), p.b.recv_queue().unwrap());
    // Forgetting a completion's buffer: the device is already done with it.
    rq.recv(p.pd.alloc(64, local()).unwrap(), 0).unwrap();
    sq.send_inline(b"x", Wr::id(0)).unwrap();
    let mut r = wait_ok(&p.cq_b);
    std::mem::forget(r.take_local());
    wait_ok(&p.cq_a);
    // The queue pair keeps working.
    rq.recv(p.pd.alloc(64, local()).unwrap(), 0).unwrap();
    sq.send_inline(b"y", Wr::id(0)).unwrap();
    wait_ok(&p.cq_b);
    wait_ok(&p.cq_a);
}
