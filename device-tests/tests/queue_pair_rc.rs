//! RC queue pairs end to end: every verb of the safe data path, with
//! byte-for-byte checks (device tests).

mod common;

use common::{pair, pattern, remote_all, wait, wait_ok};
use rdma_verbs::{
    memory::{Buf, FrozenBuffer, SgList},
    AccessFlags, Completions, QpState, QpType, RecvRequest, SendRequest, WcOpcode, Wr,
};

fn local() -> AccessFlags {
    AccessFlags::LOCAL_WRITE
}

#[test]
#[ignore = "needs an RDMA device"]
fn send_recv_returns_both_buffers() {
    let p = pair(QpType::Rc, local(), |b| b);
    assert_eq!(p.a.state().unwrap(), QpState::Rts);
    let recv = p.pd.alloc(4096, local()).unwrap();
    let mut send = p.pd.alloc(4096, local()).unwrap();
    send.copy_from_slice(&pattern(4096, 1));
    let (mut sq, mut rq) = (p.a.send_queue().unwrap(), p.b.recv_queue().unwrap());
    rq.recv(recv, 11).unwrap();
    assert_eq!(p.b.recv_outstanding(), 1);
    sq.send(send, Wr::id(22)).unwrap();
    assert_eq!(p.a.send_outstanding(), 1);

    let mut s = wait_ok(&p.cq_a);
    assert_eq!((s.wr_id(), s.opcode()), (22, WcOpcode::Send));
    let sent = s.take_local().expect("send buffer handed back");
    let mut r = wait_ok(&p.cq_b);
    assert_eq!(
        (r.wr_id(), r.opcode(), r.byte_len()),
        (11, WcOpcode::Recv, 4096)
    );
    assert_eq!(r.imm_data(), None);
    assert_eq!(r.qp_num(), p.b.qp_num().0);
    let got = r.take_local().expect("receive buffer handed back");
    assert_eq!(&got[..], &sent[..]);
    assert_eq!(&got[..], &pattern(4096, 1)[..]);
    assert_eq!((p.a.send_outstanding(), p.b.recv_outstanding()), (0, 0));
}

#[test]
#[ignore = "needs an RDMA device"]
fn send_with_immediate_in_host_order() {
    let p = pair(QpType::Rc, local(), |b| b);
    let (mut sq, mut rq) = (p.a.send_queue().unwrap(), p.b.recv_queue().unwrap());
    rq.recv(p.pd.alloc(64, local()).unwrap(), 0).unwrap();
    let mut send = p.pd.alloc(64, local()).unwrap();
    send[..4].copy_from_slice(b"ping");
    sq.send(send, Wr::id(0).imm(0xdead_beef)).unwrap();
    wait_ok(&p.cq_a);
    let mut r = wait_ok(&p.cq_b);
    assert_eq!(r.imm_data(), Some(0xdead_beef));
    assert_eq!(&r.take_local().unwrap()[..4], b"ping");
}

#[test]
#[ignore = "needs an RDMA device"]
fn inline_data_is_copied_at_post_time() {
    let p = pair(QpType::Rc, local(), |b| b.max_inline_data(256));
    let cap = p.a.caps().max_inline_data;
    assert!(cap >= 256, "asked for 256 inline bytes, got {cap}");
    let (mut sq, mut rq) = (p.a.send_queue().unwrap(), p.b.recv_queue().unwrap());
    rq.recv(p.pd.alloc(256, local()).unwrap(), 0).unwrap();
    let mut data = pattern(200, 7);
    sq.send_inline(&data, Wr::id(5)).unwrap();
    data.fill(0); // the request copied it already
    let mut s = wait_ok(&p.cq_a);
    assert!(s.take_buf().is_none(), "inline sends carry no buffer");
    let mut r = wait_ok(&p.cq_b);
    assert_eq!(r.byte_len(), 200);
    assert_eq!(&r.take_local().unwrap()[..200], &pattern(200, 7)[..]);
    // A buffer sent with the INLINE flag is copied too and still returned.
    rq.recv(p.pd.alloc(256, local()).unwrap(), 0).unwrap();
    let mut small = p.pd.alloc(32, local()).unwrap();
    small.copy_from_slice(&pattern(32, 9));
    sq.send(small, Wr::id(0).inline()).unwrap();
    assert_eq!(wait_ok(&p.cq_a).take_local().unwrap().len(), 32);
    assert_eq!(
        &wait_ok(&p.cq_b).take_local().unwrap()[..32],
        &pattern(32, 9)[..]
    );
}

#[test]
#[ignore = "needs an RDMA device"]
fn scatter_gather_send_and_receive() {
    let p = pair(QpType::Rc, local(), |b| b.max_send_sge(3).max_recv_sge(2));
    let whole = p.pd.alloc(300, local()).unwrap();
    let (r1, r2) = whole.split_at(100);
    let (mut sq, mut rq) = (p.a.send_queue().unwrap(), p.b.recv_queue().unwrap());
    rq.recv_sgl(vec![r1.into(), r2.into()], 0).unwrap();
    let parts: Vec<Buf> = [(50, 1u8), (70, 2), (80, 3)]
        .into_iter()
        .map(|(len, seed)| {
            let mut b = p.pd.alloc(len, local()).unwrap();
            b.copy_from_slice(&pattern(len, seed));
            b.into()
        })
        .collect();
    sq.send_sgl(parts, Wr::id(0)).unwrap();
    match wait_ok(&p.cq_a).take_buffers() {
        SgList::Many(v) => assert_eq!(v.len(), 3),
        other => panic!("expected the three send buffers back, got {other:?}"),
    }
    let mut r = wait_ok(&p.cq_b);
    assert_eq!(r.byte_len(), 200);
    let SgList::Many(mut v) = r.take_buffers() else {
        panic!("expected two receive buffers")
    };
    let second = v.pop().unwrap().into_local().unwrap();
    let first = v.pop().unwrap().into_local().unwrap();
    let joined = first.unsplit(second).unwrap();
    let expect: Vec<u8> = [pattern(50, 1), pattern(70, 2), pattern(80, 3)].concat();
    assert_eq!(&joined[..200], &expect[..]);
}

#[test]
#[ignore = "needs an RDMA device"]
fn rdma_write_and_write_with_immediate() {
    let p = pair(QpType::Rc, remote_all(), |b| b);
    let target = p.pd.alloc_shared(4096, remote_all()).unwrap();
    let remote = target.remote().unwrap();
    let (mut sq, mut rq) = (p.a.send_queue().unwrap(), p.b.recv_queue().unwrap());
    let mut src = p.pd.alloc(1000, local()).unwrap();
    src.copy_from_slice(&pattern(1000, 3));
    sq.write(src, remote.slice(100, 1000).unwrap(), Wr::id(0))
        .unwrap();
    wait_ok(&p.cq_a);
    let mut got = vec![0u8; 1000];
    target.copy_to_slice(100, &mut got).unwrap();
    assert_eq!(got, pattern(1000, 3));
    let mut head = [0xffu8; 100];
    target.copy_to_slice(0, &mut head).unwrap();
    assert_eq!(
        head, [0u8; 100],
        "bytes outside the written range untouched"
    );

    // With immediate: consumes a receive at the target, which gets the imm.
    rq.recv(p.pd.alloc(16, local()).unwrap(), 77).unwrap();
    let mut src = p.pd.alloc(8, local()).unwrap();
    src.copy_from_slice(b"imm-data");
    sq.write(src, remote.slice(2000, 8).unwrap(), Wr::id(0).imm(4242))
        .unwrap();
    wait_ok(&p.cq_a);
    let r = wait_ok(&p.cq_b);
    assert_eq!(
        (r.wr_id(), r.opcode(), r.imm_data()),
        (77, WcOpcode::RecvRdmaWithImm, Some(4242))
    );
    let mut got = [0u8; 8];
    target.copy_to_slice(2000, &mut got).unwrap();
    assert_eq!(&got, b"imm-data");
}

#[test]
#[ignore = "needs an RDMA device"]
fn rdma_read_into_local_buffer() {
    let p = pair(QpType::Rc, remote_all(), |b| b);
    let source =
        p.pd.register(
            pattern(8192, 5),
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ,
        )
        .unwrap();
    let remote = source.memory_region().remote().unwrap();
    let dst = p.pd.alloc(4096, local()).unwrap();
    let mut sq = p.a.send_queue().unwrap();
    sq.read(dst, remote.slice(4096, 4096).unwrap(), Wr::id(9))
        .unwrap();
    let mut c = wait_ok(&p.cq_a);
    assert_eq!((c.wr_id(), c.opcode()), (9, WcOpcode::RdmaRead));
    assert_eq!(&c.take_local().unwrap()[..], &pattern(8192, 5)[4096..]);
}

#[test]
#[ignore = "needs an RDMA device"]
fn atomics_compare_and_swap_and_fetch_and_add() {
    let p = pair(QpType::Rc, remote_all(), |b| b);
    let attr = p.dev.ctx.query_device().unwrap();
    if attr.atomic_cap() == rdma_verbs::device::AtomicCap::None {
        eprintln!("UNSUPPORTED on this device: atomics (atomic_cap NONE)");
        return;
    }
    let target = p.pd.alloc_shared(64, remote_all()).unwrap();
    let word = target.atomic_u64(8).unwrap();
    word.store(100, std::sync::atomic::Ordering::SeqCst);
    let remote = target.remote().unwrap().slice(8, 8).unwrap();

    let result = p.pd.alloc(8, local()).unwrap();
    let mut sq = p.a.send_queue().unwrap();
    sq.fetch_and_add(result, remote, 5, Wr::id(0)).unwrap();
    let mut c = wait_ok(&p.cq_a);
    assert_eq!(c.opcode(), WcOpcode::FetchAdd);
    let old = c.take_local().unwrap();
    assert_eq!(u64::from_ne_bytes(old[..].try_into().unwrap()), 100);
    assert_eq!(word.load(std::sync::atomic::Ordering::SeqCst), 105);

    // CAS that fails (compare mismatch) leaves the value, returns it.
    sq.compare_and_swap(old, remote, 1, 7, Wr::id(0)).unwrap();
    let old = wait_ok(&p.cq_a).take_local().unwrap();
    assert_eq!(u64::from_ne_bytes(old[..].try_into().unwrap()), 105);
    assert_eq!(word.load(std::sync::atomic::Ordering::SeqCst), 105);
    // CAS that succeeds.
    sq.compare_and_swap(old, remote, 105, 7, Wr::id(0)).unwrap();
    let mut c = wait_ok(&p.cq_a);
    assert_eq!(c.opcode(), WcOpcode::CompSwap);
    let old = c.take_local().unwrap();
    assert_eq!(u64::from_ne_bytes(old[..].try_into().unwrap()), 105);
    assert_eq!(word.load(std::sync::atomic::Ordering::SeqCst), 7);
}

#[test]
#[ignore = "needs an RDMA device"]
fn chains_post_with_one_call_and_complete_in_order() {
    let p = pair(QpType::Rc, local(), |b| b.max_send_wr(16).max_recv_wr(16));
    let mut recvs: Vec<RecvRequest> = (0..8)
        .map(|i| RecvRequest::new(p.pd.alloc(32, local()).unwrap()).wr_id(100 + i))
        .collect();
    let (mut sq, mut rq) = (p.a.send_queue().unwrap(), p.b.recv_queue().unwrap());
    rq.post_chain(&mut recvs).unwrap();
    assert!(recvs.is_empty());
    assert_eq!(p.b.recv_outstanding(), 8);
    let mut sends: Vec<SendRequest> = (0..8u8)
        .map(|i| {
            let mut b = p.pd.alloc(32, local()).unwrap();
            b.copy_from_slice(&pattern(32, i));
            SendRequest::send(b).wr_id(u64::from(i))
        })
        .collect();
    sq.post_chain(&mut sends).unwrap();
    assert!(sends.is_empty());
    let s = wait(&p.cq_a, 8);
    assert_eq!(
        s.iter().map(|c| c.wr_id()).collect::<Vec<_>>(),
        (0..8).collect::<Vec<_>>()
    );
    let r = wait(&p.cq_b, 8);
    for (i, mut c) in r.into_iter().enumerate() {
        c.result().unwrap();
        assert_eq!(c.wr_id(), 100 + i as u64);
        assert_eq!(&c.take_local().unwrap()[..], &pattern(32, i as u8)[..]);
    }
}

#[test]
#[ignore = "needs an RDMA device"]
fn unsignaled_sends_with_periodic_signaling() {
    let p = pair(QpType::Rc, local(), |b| b.max_send_wr(32).max_recv_wr(64));
    let mut msg = p.pd.alloc(64, local()).unwrap();
    msg.copy_from_slice(&pattern(64, 4));
    let frozen: FrozenBuffer = msg.freeze();
    let mut recvs: Vec<RecvRequest> = (0..64)
        .map(|_| RecvRequest::new(p.pd.alloc(64, local()).unwrap()))
        .collect();
    let (mut sq, mut rq) = (p.a.send_queue().unwrap(), p.b.recv_queue().unwrap());
    rq.post_chain(&mut recvs).unwrap();
    let every = 8;
    let mut signaled = 0;
    for i in 0..64u64 {
        let signal = i % every == every - 1;
        let o = if signal {
            Wr::id(i)
        } else {
            Wr::id(i).unsignaled()
        };
        sq.send(frozen.clone(), o).unwrap();
        if signal {
            let c = wait_ok(&p.cq_a);
            assert_eq!(c.wr_id(), i);
            signaled += 1;
        }
        // The frozen bytes stay readable while clones are posted.
        assert_eq!(frozen[0], pattern(64, 4)[0]);
    }
    assert_eq!(signaled, 64 / every);
    common::assert_quiet(&p.cq_a);
    assert_eq!(
        p.a.send_outstanding(),
        0,
        "signaled completions retire the unsignaled ones"
    );
    for mut c in wait(&p.cq_b, 64) {
        c.result().unwrap();
        assert_eq!(&c.take_local().unwrap()[..], &pattern(64, 4)[..]);
    }
    // Every clone was released: the buffer can be written again.
    let mut back = frozen
        .try_unfreeze()
        .expect("no posted request holds it any more");
    back[0] = 0;
}

/// The unsignaled requests before a signaled one are released when its
/// completion is claimed, however its buffer comes back: here taken from
/// the borrowed completion with `take_local`, for many times the queue's
/// depth (a slot not released would fill the ring).
#[test]
#[ignore = "needs an RDMA device"]
fn unsignaled_sends_released_when_the_next_buffer_is_taken_back() {
    let p = pair(QpType::Rc, local(), |b| b.max_send_wr(8).max_recv_wr(64));
    let mut msg = p.pd.alloc(16, local()).unwrap();
    msg.copy_from_slice(&pattern(16, 7));
    let frozen: FrozenBuffer = msg.freeze();
    let (mut sq, mut rq) = (p.a.send_queue().unwrap(), p.b.recv_queue().unwrap());
    let mut own = p.pd.alloc(16, local()).unwrap();
    let mut comps = Completions::with_capacity(4);
    for round in 0..24u64 {
        for k in 0..3 {
            rq.recv(p.pd.alloc(16, local()).unwrap(), round * 3 + k)
                .unwrap();
        }
        sq.send(frozen.clone(), Wr::id(1000 + round).unsignaled())
            .unwrap();
        sq.send(frozen.clone(), Wr::id(2000 + round).unsignaled())
            .unwrap();
        sq.send(own, Wr::id(round)).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        own = loop {
            let mut back = None;
            for mut c in p.cq_a.poll(&mut comps).unwrap() {
                c.result().unwrap();
                assert_eq!(c.wr_id(), round, "only the signaled send completes");
                back = c.take_local();
            }
            if let Some(b) = back {
                break b;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "round {round}: no completion"
            );
        };
        for c in wait(&p.cq_b, 3) {
            c.result().unwrap();
        }
    }
    common::assert_quiet(&p.cq_a);
    assert_eq!(
        p.a.send_outstanding(),
        0,
        "each signaled completion released the unsignaled sends before it"
    );
    frozen
        .try_unfreeze()
        .expect("no posted request holds the frozen buffer any more");
}

#[test]
#[ignore = "needs an RDMA device"]
fn batch_polling_into_small_caller_storage() {
    let p = pair(QpType::Rc, local(), |b| b.max_send_wr(32).max_recv_wr(32));
    let n = 20;
    let mut recvs: Vec<_> = (0..n)
        .map(|i| RecvRequest::new(p.pd.alloc(8, local()).unwrap()).wr_id(i))
        .collect();
    let (mut sq, mut rq) = (p.a.send_queue().unwrap(), p.b.recv_queue().unwrap());
    rq.post_chain(&mut recvs).unwrap();
    for i in 0..n {
        sq.send_inline(&i.to_le_bytes(), Wr::id(i)).unwrap();
    }
    // Let everything complete, then poll in batches of 3.
    let mut batch = Completions::with_capacity(3);
    let mut seen = Vec::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while seen.len() < n as usize {
        let got = p.cq_b.poll(&mut batch).unwrap();
        assert!(got.len() <= 3);
        // The storage cannot be polled into again while the batch borrows
        // it (a compile error: ibverbs/tests/ui/35a_completion_across_next_poll.rs).
        for mut c in got {
            c.result().unwrap();
            let b = c.take_local().unwrap();
            assert_eq!(u64::from_le_bytes(b[..].try_into().unwrap()), c.wr_id());
            seen.push(c.wr_id());
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timed out at {seen:?}"
        );
    }
    assert_eq!(seen, (0..n).collect::<Vec<_>>());
    wait(&p.cq_a, n as usize);
}

#[test]
#[ignore = "needs an RDMA device"]
fn large_transfers_up_to_one_mebibyte() {
    let p = pair(QpType::Rc, remote_all(), |b| b);
    let (mut sq, mut rq) = (p.a.send_queue().unwrap(), p.b.recv_queue().unwrap());
    for len in [1usize, 4095, 4096, 65537, 1 << 20] {
        let recv = p.pd.alloc(len, local()).unwrap();
        let mut send = p.pd.alloc(len, local()).unwrap();
        send.copy_from_slice(&pattern(len, len as u8));
        rq.recv(recv, 0).unwrap();
        sq.send(send, Wr::id(0)).unwrap();
        wait_ok(&p.cq_a);
        let mut r = wait_ok(&p.cq_b);
        assert_eq!(r.byte_len() as usize, len);
        assert!(
            r.take_local().unwrap()[..] == pattern(len, len as u8)[..],
            "{len} bytes"
        );
    }
}

/// Polls `cq` with `poll_one` until a completion arrives (10 s at most).
fn poll_one_within(cq: &rdma_verbs::CompletionQueue) -> rdma_verbs::Completion {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        if let Some(c) = cq.poll_one().unwrap() {
            return c;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no completion in 10 s"
        );
    }
}

#[test]
#[ignore = "needs an RDMA device"]
fn poll_one_hands_back_buffers_and_callers_wr_ids() {
    let p = pair(QpType::Rc, remote_all(), |b| b);
    assert!(p.cq_a.poll_one().unwrap().is_none(), "empty CQ");
    let target = p.pd.alloc_shared(64, remote_all()).unwrap();
    let remote = target.remote().unwrap();

    // A safe write, a safe send into a posted receive, then a raw write.
    let mut src = p.pd.alloc(16, local()).unwrap();
    src.copy_from_slice(&pattern(16, 9));
    let (mut sq, mut rq) = (p.a.send_queue().unwrap(), p.b.recv_queue().unwrap());
    rq.recv(p.pd.alloc(32, local()).unwrap(), 9).unwrap();
    sq.write(src, remote.slice(0, 16).unwrap(), Wr::id(7))
        .unwrap();
    sq.send_inline(b"hello", Wr::id(8)).unwrap();
    let raw_src = p.pd.alloc(8, local()).unwrap();
    let mut sge = rdma_verbs::sys::ibv_sge {
        addr: raw_src.addr(),
        length: 8,
        lkey: raw_src.lkey(),
    };
    let mut wr = rdma_verbs::sys::ibv_send_wr {
        wr_id: 5,
        sg_list: &mut sge,
        num_sge: 1,
        opcode: rdma_verbs::sys::IBV_WR_RDMA_WRITE,
        send_flags: rdma_verbs::sys::ibv_send_flags::IBV_SEND_SIGNALED.0,
        ..Default::default()
    };
    wr.wr.rdma = rdma_verbs::sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 {
        remote_addr: remote.addr + 32,
        rkey: remote.rkey.0,
    };
    // SAFETY: `raw_src` is registered and lives (unread, unwritten) until
    // the write's completion is polled below; bit 63 of wr_id is clear.
    unsafe { p.a.post_send_raw(&mut wr) }.unwrap();

    let mut w = poll_one_within(&p.cq_a);
    w.result().unwrap();
    assert_eq!((w.wr_id(), w.opcode()), (7, WcOpcode::RdmaWrite));
    assert_eq!(
        w.wc().as_raw().wr_id,
        7,
        "the raw entry carries the caller's wr_id"
    );
    assert!(!w.is_orphan());
    assert_eq!(
        &w.take_local().expect("the write's source")[..],
        &pattern(16, 9)[..]
    );
    let s = poll_one_within(&p.cq_a);
    assert_eq!(
        (s.wr_id(), s.opcode(), s.is_success()),
        (8, WcOpcode::Send, true)
    );
    let mut r = poll_one_within(&p.cq_a);
    assert_eq!((r.wr_id(), r.is_success()), (5, true));
    assert!(
        r.is_orphan(),
        "a raw request's completion carries no buffer"
    );
    assert!(r.take_local().is_none());
    assert_eq!(p.a.send_outstanding(), 0);
    assert!(p.cq_a.poll_one().unwrap().is_none());

    let mut got = poll_one_within(&p.cq_b);
    assert_eq!((got.wr_id(), got.byte_len()), (9, 5));
    assert_eq!(
        &got.take_local().expect("the receive buffer")[..5],
        b"hello"
    );
    let mut written = [0u8; 16];
    target.copy_to_slice(0, &mut written).unwrap();
    assert_eq!(written[..], pattern(16, 9)[..]);

    // A failed request: the error names the caller's wr_id and the buffer
    // still comes back.
    let bad = rdma_verbs::RemoteMemory {
        rkey: rdma_verbs::memory::RemoteKey(remote.rkey.0 ^ 0x5a5a_0000),
        ..remote
    };
    let src = p.pd.alloc(8, local()).unwrap();
    sq.write(src, bad.slice(0, 8).unwrap(), Wr::id(42)).unwrap();
    let mut e = poll_one_within(&p.cq_a);
    match e.result() {
        Err(rdma_verbs::Error::WorkCompletion { wr_id, .. }) => assert_eq!(wr_id, 42),
        other => panic!("expected a failed write, got {other:?}"),
    }
    assert_eq!(e.take_local().map(|b| b.len()), Some(8));
}

/// A `LocalPort` queried once connects any number of queue pairs, with the
/// same result as a fresh query and `connect`'s own queries; a queue pair
/// of another device context is refused.
#[test]
#[ignore = "needs an RDMA device"]
fn a_local_port_queried_once_connects_queue_pairs() {
    use rdma_verbs::{ConnectOptions, Endpoint, Error, LocalPort};
    let dev = common::device();
    let pd = dev.ctx.alloc_pd().unwrap();
    let cq = dev.ctx.create_cq(64).build().unwrap();
    let local = LocalPort::query(&dev.ctx, dev.port, Some(dev.gid_index)).unwrap();
    assert_eq!(local.port(), dev.port);
    assert_eq!(local.gid_index(), Some(dev.gid_index));
    let opts = ConnectOptions::new(dev.port).local_port(&local);
    let qps: Vec<_> = (0..4)
        .map(|_| {
            pd.create_qp(QpType::Rc, &cq, &cq)
                .max_send_wr(4)
                .max_recv_wr(4)
                .build()
                .unwrap()
        })
        .collect();
    for (i, pair) in qps.chunks(2).enumerate() {
        let (a, b) = (&pair[0], &pair[1]);
        let ea = local.endpoint(a, 0x100 + i as u32).unwrap();
        let eb = local.endpoint(b, 0x200 + i as u32).unwrap();
        assert_eq!(
            ea,
            common::endpoint(&dev, a, ea.psn),
            "the snapshot and a fresh query agree"
        );
        a.connect(&ea, &eb, &opts).unwrap();
        b.connect(&eb, &ea, &opts).unwrap();
        b.recv_queue().unwrap().recv(p_alloc(&pd), 7).unwrap();
        a.send_queue()
            .unwrap()
            .send(p_alloc(&pd), Wr::id(8))
            .unwrap();
        let got = wait(&cq, 2);
        assert!(got.iter().all(|c| c.is_success()), "{got:?}");
    }
    // Another context's queue pair: refused before anything is queried.
    let other = common::device();
    let pd2 = other.ctx.alloc_pd().unwrap();
    let cq2 = other.ctx.create_cq(8).build().unwrap();
    let stranger = pd2
        .create_qp(QpType::Rc, &cq2, &cq2)
        .max_send_wr(1)
        .max_recv_wr(1)
        .build()
        .unwrap();
    let e = local.endpoint(&stranger, 1).unwrap_err();
    assert!(
        matches!(e, Error::ForeignContext { what: "LocalPort" }),
        "{e}"
    );
    let ea = local.endpoint(&qps[0], 1).unwrap();
    let own = Endpoint {
        qp_num: stranger.qp_num(),
        ..ea
    };
    let e = stranger.connect(&own, &ea, &opts).unwrap_err();
    assert!(
        matches!(e, Error::ForeignContext { what: "LocalPort" }),
        "{e}"
    );
    assert_eq!(stranger.state().unwrap(), QpState::Reset);
}

fn p_alloc(pd: &rdma_verbs::ProtectionDomain) -> rdma_verbs::LocalBuffer {
    pd.alloc(64, local()).unwrap()
}
