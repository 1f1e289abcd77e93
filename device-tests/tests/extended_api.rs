//! The extended verbs (device tests): QPs from `ibv_create_qp_ex` posted
//! through `ibv_wr_*`, CQs from `ibv_create_cq_ex` polled with
//! start/next/end, atomic write — under the same ownership contract as the
//! legacy path.

mod common;

use std::time::{Duration, Instant};

use common::{ex_pair, remote_all};
use rdma_verbs::{
    cq::{CompletionFields, CompletionRef},
    device::Feature,
    qp::{SendOp, SendOpFlags},
    AccessFlags, Completion, CompletionQueue, Completions, Error, QpType, SendRequest, WcOpcode,
    Wr,
};

/// Polls (an extended CQ) until `n` completions arrived (10 s at most).
fn wait_ex(cq: &CompletionQueue, n: usize) -> Vec<Completion> {
    let mut out = Vec::new();
    let mut batch = Completions::with_capacity(16);
    let deadline = Instant::now() + Duration::from_secs(10);
    while out.len() < n {
        out.extend(cq.poll(&mut batch).unwrap().map(CompletionRef::into_owned));
        assert!(Instant::now() < deadline, "timed out: {out:?}");
    }
    out
}

fn ok_ex(cq: &CompletionQueue) -> Completion {
    let c = wait_ex(cq, 1).pop().unwrap();
    c.result().unwrap_or_else(|e| panic!("{e}: {c:?}"));
    c
}

fn quiet_ex(cq: &CompletionQueue) {
    std::thread::sleep(Duration::from_millis(50));
    let mut batch = Completions::with_capacity(8);
    let phantom = common::poll_owned(cq, &mut batch);
    assert!(phantom.is_empty(), "phantom: {phantom:?}");
    assert!(cq.poll_one().unwrap().is_none(), "phantom (poll_one)");
}

#[test]
#[ignore = "needs an RDMA device"]
fn poll_one_reads_an_extended_cq_and_hands_buffers_back() {
    let p = ex_pair(SendOpFlags::rc_data());
    let source = p.pd.alloc_shared(64, remote_all()).unwrap();
    let remote = source.remote().unwrap();
    let mut sq = p.a.send_queue().unwrap();
    for round in 0..8u64 {
        let dst = p.pd.alloc(32, AccessFlags::LOCAL_WRITE).unwrap();
        sq.read(dst, remote.slice(0, 32).unwrap(), Wr::id(round))
            .unwrap();
        let mut c = common::poll_until(|| p.cq_a.poll_one().unwrap());
        c.result().unwrap_or_else(|e| panic!("{e}: {c:?}"));
        assert_eq!((c.wr_id(), c.opcode()), (round, WcOpcode::RdmaRead));
        assert_eq!(c.take_local().map(|b| b.len()), Some(32), "buffer back");
    }
    quiet_ex(&p.cq_a);
}

#[test]
#[ignore = "needs an RDMA device"]
fn every_rc_operation_through_wr_builders() {
    let p = ex_pair(SendOpFlags::rc_data());
    assert_eq!(p.a.send_ops(), Some(SendOpFlags::rc_data()));
    assert_eq!(p.cq_a.wc_fields(), Some(CompletionFields::standard()));
    let shared = p.pd.alloc_shared(4096, remote_all()).unwrap();
    let remote = shared.remote().unwrap();
    // The extended QP posts through the same handle as a classic one.
    let mut sq = p.a.send_queue().unwrap();

    // Send with immediate, received by a classic receive (the receive
    // queue has no extended path).
    let rbuf = p.pd.alloc(256, AccessFlags::LOCAL_WRITE).unwrap();
    p.b.recv_queue().unwrap().recv(rbuf, 1).unwrap();
    let mut msg = p.pd.alloc(100, AccessFlags::LOCAL_WRITE).unwrap();
    msg.copy_from_slice(&common::pattern(100, 1));
    sq.send(msg, Wr::id(2).imm(0xdead_beef)).unwrap();
    let c = ok_ex(&p.cq_a);
    assert_eq!((c.wr_id(), c.opcode()), (2, WcOpcode::Send));
    let mut r = ok_ex(&p.cq_b);
    assert_eq!(
        (r.wr_id(), r.byte_len(), r.imm_data()),
        (1, 100, Some(0xdead_beef))
    );
    assert_eq!(r.qp_num(), p.b.qp_num().0, "QP_NUM was asked for");
    assert_eq!(
        &r.take_local().unwrap()[..100],
        &common::pattern(100, 1)[..]
    );

    // RDMA write (inline) and read back.
    sq.write_inline(b"extended", remote, Wr::id(3)).unwrap();
    assert_eq!(ok_ex(&p.cq_a).opcode(), WcOpcode::RdmaWrite);
    let dst = p.pd.alloc(8, AccessFlags::LOCAL_WRITE).unwrap();
    sq.read(dst, remote.slice(0, 8).unwrap(), Wr::id(4))
        .unwrap();
    let mut c = ok_ex(&p.cq_a);
    assert_eq!((c.wr_id(), c.opcode()), (4, WcOpcode::RdmaRead));
    assert_eq!(&c.take_local().unwrap()[..], b"extended");

    // Atomics: CAS then FAA on an aligned word.
    let word = remote.slice(64, 8).unwrap();
    let res = p.pd.alloc(8, AccessFlags::LOCAL_WRITE).unwrap();
    sq.compare_and_swap(res, word, 0, 40, Wr::id(5)).unwrap();
    let mut c = ok_ex(&p.cq_a);
    assert_eq!(c.opcode(), WcOpcode::CompSwap);
    let res = c.take_local().unwrap();
    sq.fetch_and_add(res, word, 2, Wr::id(6)).unwrap();
    let mut c = ok_ex(&p.cq_a);
    assert_eq!(
        u64::from_ne_bytes(c.take_local().unwrap()[..8].try_into().unwrap()),
        40
    );
    assert_eq!(
        shared
            .atomic_u64(64)
            .unwrap()
            .load(std::sync::atomic::Ordering::Acquire),
        42
    );

    // A chain in one region, then a single request on the same QP.
    let mut list: Vec<SendRequest<'_>> = (0..4u64)
        .map(|i| {
            SendRequest::write_inline(b"xy", remote.slice(128 + 2 * i, 2).unwrap()).wr_id(10 + i)
        })
        .collect();
    sq.post_chain(&mut list).unwrap();
    assert!(list.is_empty());
    sq.write_inline(b"zz", remote.slice(136, 2).unwrap(), Wr::id(14))
        .unwrap();
    let ids: Vec<u64> = wait_ex(&p.cq_a, 5).iter().map(|c| c.wr_id()).collect();
    assert_eq!(ids, [10, 11, 12, 13, 14]);
    let mut got = [0u8; 10];
    shared.copy_to_slice(128, &mut got).unwrap();
    assert_eq!(&got, b"xyxyxyxyzz");
    quiet_ex(&p.cq_a);
    quiet_ex(&p.cq_b);
}

#[test]
#[ignore = "needs an RDMA device"]
fn atomic_write_lands_eight_bytes() {
    let p = ex_pair(SendOpFlags::ATOMIC_WRITE | SendOpFlags::RDMA_WRITE);
    let shared = p.pd.alloc_shared(64, remote_all()).unwrap();
    let word = shared.remote().unwrap().slice(8, 8).unwrap();
    let value = 0x0123_4567_89ab_cdefu64.to_le_bytes();
    let mut sq = p.a.send_queue().unwrap();
    match sq.atomic_write(word, value, Wr::id(1)) {
        Ok(()) => {}
        Err(e) => panic!("atomic write refused: {e}"),
    }
    let c = wait_ex(&p.cq_a, 1).pop().unwrap();
    if !c.is_success() && !common::is_rxe(&p.dev) {
        eprintln!("UNSUPPORTED on this device: atomic write: {c:?}");
        return;
    }
    c.result().unwrap();
    assert_eq!(c.opcode(), WcOpcode::AtomicWrite);
    let mut got = [0u8; 8];
    shared.copy_to_slice(8, &mut got).unwrap();
    assert_eq!(got, value);
    // Misaligned targets are refused before posting.
    let bad = shared.remote().unwrap().slice(4, 8).unwrap();
    let e = sq.atomic_write(bad, value, Wr::id(0)).unwrap_err();
    assert!(
        matches!(e, Error::Misaligned { addr, align: 8 } if addr == bad.addr),
        "{e}"
    );
}

#[test]
#[ignore = "needs an RDMA device"]
fn operations_not_created_for_are_refused_by_name() {
    let p = ex_pair(SendOpFlags::SEND);
    let shared = p.pd.alloc_shared(64, remote_all()).unwrap();
    let remote = shared.remote().unwrap();
    let mut sq = p.a.send_queue().unwrap();
    let e = sq.write_inline(b"no", remote, Wr::id(0)).unwrap_err();
    assert!(
        matches!(e, Error::SendOpFlagsRequired { op: SendOp::RdmaWrite, needed }
            if needed == SendOpFlags::RDMA_WRITE),
        "{e}"
    );
    assert!(e.to_string().contains("RDMA_WRITE"), "{e}");
    // Atomic write only exists on the extended path.
    let e = sq
        .atomic_write(remote.slice(0, 8).unwrap(), [0; 8], Wr::id(0))
        .unwrap_err();
    assert!(
        matches!(e, Error::SendOpFlagsRequired { op: SendOp::AtomicWrite, needed }
            if needed == SendOpFlags::ATOMIC_WRITE),
        "{e}"
    );
    // A classic QP says what it lacks for an operation only the ibv_wr_*
    // path has; a classic CQ polls classically.
    let dev = &p.dev;
    let cq = dev.ctx.create_cq(256).build().unwrap();
    let qp = p.pd.create_qp(QpType::Rc, &cq, &cq).build().unwrap();
    assert_eq!(qp.send_ops(), None);
    // Connected (to itself): a send queue handle needs RTS.
    common::connect_self(dev, &qp, remote_all());
    let e = qp
        .send_queue()
        .unwrap()
        .atomic_write(remote.slice(0, 8).unwrap(), [0; 8], Wr::id(0))
        .unwrap_err();
    assert!(
        matches!(e, Error::SendOpFlagsRequired { op: SendOp::AtomicWrite, needed }
            if needed == SendOpFlags::ATOMIC_WRITE),
        "{e}"
    );
    assert!(e.to_string().contains("send_ops"), "{e}");
    assert_eq!(cq.wc_fields(), None);
    assert_eq!(
        cq.poll(&mut Completions::with_capacity(1)).unwrap().len(),
        0
    );
    // The refused request comes back with its buffer.
    let buf = p.pd.alloc(4, AccessFlags::LOCAL_WRITE).unwrap();
    let e = sq
        .write(buf, remote.slice(0, 4).unwrap(), Wr::id(0))
        .unwrap_err();
    assert!(
        matches!(e.error, Error::SendOpFlagsRequired { .. }),
        "{}",
        e.error
    );
    assert!(e.buf.into_local().is_some(), "the buffer came back");
}

#[test]
#[ignore = "needs an RDMA device"]
fn batches_poll_exactly_once_no_phantoms() {
    // The rxe provider of rdma-core < 55 corrupts its consumer index when
    // next_poll hits ENOENT; poll must deliver every completion exactly
    // once anyway (many batches, partially filled ones included).
    let p = ex_pair(SendOpFlags::SEND | SendOpFlags::RDMA_WRITE);
    let shared = p.pd.alloc_shared(64, remote_all()).unwrap();
    let remote = shared.remote().unwrap().slice(0, 1).unwrap();
    let mut seen = Vec::new();
    let mut sq = p.a.send_queue().unwrap();
    for round in 0..20u64 {
        let k = 1 + round % 7;
        for i in 0..k {
            sq.write_inline(b"w", remote, Wr::id(round * 100 + i))
                .unwrap();
        }
        std::thread::sleep(Duration::from_millis(5));
        let got = wait_ex(&p.cq_a, k as usize);
        assert!(got.iter().all(|c| c.is_success()), "{got:?}");
        seen.extend(got.iter().map(|c| c.wr_id()));
        quiet_ex(&p.cq_a);
    }
    let want: Vec<u64> = (0..20u64)
        .flat_map(|r| (0..1 + r % 7).map(move |i| r * 100 + i))
        .collect();
    assert_eq!(seen, want, "every completion exactly once, in order");
}

#[test]
#[ignore = "needs an RDMA device"]
fn timestamps_when_the_device_has_them() {
    let t = common::device();
    let attr = t.ctx.query_device_ex().unwrap();
    let r = t
        .ctx
        .create_cq(256)
        .wc_fields(CompletionFields::BYTE_LEN | CompletionFields::COMPLETION_TIMESTAMP)
        .build();
    if !attr.supports(Feature::CompletionTimestamps) {
        eprintln!(
            "UNSUPPORTED on {}: {} ({})",
            t.ctx.name(),
            Feature::CompletionTimestamps,
            r.err().map_or("created anyway".into(), |e| e.to_string())
        );
        return;
    }
    let cq = r.unwrap();
    assert!(cq
        .wc_fields()
        .unwrap()
        .contains(CompletionFields::COMPLETION_TIMESTAMP));
}

#[test]
#[ignore = "needs an RDMA device"]
fn wait_sleeps_on_an_extended_cq() {
    let dev = common::device();
    let pd = dev.ctx.alloc_pd().unwrap();
    let channel = dev.ctx.create_comp_channel().unwrap();
    let cq = dev
        .ctx
        .create_cq(256)
        .channel(&channel)
        .wc_fields(CompletionFields::standard())
        .build()
        .unwrap();
    let qp = pd
        .create_qp(QpType::Rc, &cq, &cq)
        .send_ops(SendOpFlags::rc_data())
        .build()
        .unwrap();
    // The peer reports elsewhere: the channel serves `cq` alone.
    let peer_cq = dev.ctx.create_cq(256).build().unwrap();
    let peer = pd
        .create_qp(QpType::Rc, &peer_cq, &peer_cq)
        .build()
        .unwrap();
    common::connect_pair(&dev, &qp, &peer, remote_all());
    let shared = pd.alloc_shared(64, remote_all()).unwrap();
    let remote = shared.remote().unwrap();
    let mut out = Completions::with_capacity(4);
    // Nothing outstanding: the wait sleeps until its deadline.
    let t = Instant::now();
    assert_eq!(
        cq.wait(&mut out, Some(Duration::from_millis(200)))
            .unwrap()
            .len(),
        0
    );
    assert!(t.elapsed() >= Duration::from_millis(200));
    // A read posted 100 ms into the wait wakes it, its buffer handed back
    // by the borrowed entry.
    let mut sq = qp.send_queue().unwrap();
    std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(100));
            let dst = pd.alloc(16, AccessFlags::LOCAL_WRITE).unwrap();
            sq.read(dst, remote.slice(0, 16).unwrap(), Wr::id(7))
                .unwrap();
        });
        let mut polled = cq.wait(&mut out, Some(Duration::from_secs(10))).unwrap();
        assert_eq!(polled.len(), 1);
        let mut c = polled.next().unwrap();
        c.result().unwrap();
        assert_eq!((c.wr_id(), c.opcode()), (7, WcOpcode::RdmaRead));
        assert_eq!(c.take_local().map(|b| b.len()), Some(16));
    });
}

/// Flush is in the API whatever rdma-core the program was built on; what the
/// loaded library is decides. On an older one than 45 (rdma-core 44 in the
/// VM and on CI) both the queue pair and the registration are refused, by
/// name and release, before any verb.
#[test]
#[ignore = "needs an RDMA device"]
fn flush_follows_the_loaded_rdma_core_release() {
    let release = rdma_verbs::sys::rdma_core_release();
    eprintln!("loaded rdma-core release: {release:?}");
    // The library this test runs on is rdma-core's own file.
    assert!(release.is_some(), "rdma_core_release() cannot tell");
    let dev = common::device();
    let pd = dev.ctx.alloc_pd().unwrap();
    let cq = dev
        .ctx
        .create_cq(16)
        .wc_fields(CompletionFields::standard())
        .build()
        .unwrap();
    let qp = pd
        .create_qp(QpType::Rc, &cq, &cq)
        .send_ops(SendOpFlags::rc_data() | SendOpFlags::FLUSH)
        .build();
    let mr = pd.register(
        vec![0u8; 64],
        AccessFlags::LOCAL_WRITE | AccessFlags::FLUSH_GLOBAL,
    );
    match release {
        Some(r) if r >= 45 => {
            // The provider decides (rxe has flush from rdma-core 45 on).
            if let Err(e) = &qp {
                assert!(!matches!(e, Error::LibraryTooOld { .. }), "{e}");
            }
            if let Err(e) = &mr {
                assert!(!matches!(e, Error::LibraryTooOld { .. }), "{e}");
            }
        }
        found => {
            let e = qp.map(|_| ()).unwrap_err();
            assert!(
                matches!(e, Error::LibraryTooOld { verb: "ibv_wr_flush", needs: 45, found: f } if f == found),
                "{e:?}"
            );
            assert!(e.to_string().contains("rdma-core 45"), "{e}");
            let e = mr.map(|_| ()).unwrap_err();
            assert!(
                matches!(
                    e,
                    Error::LibraryTooOld {
                        verb: "IBV_ACCESS_FLUSH_GLOBAL",
                        needs: 45,
                        ..
                    }
                ),
                "{e:?}"
            );
        }
    }
}
