//! Unreliable connected queue pairs (device tests): send/receive, RDMA
//! write (with and without immediate); RDMA read and atomics are RC-only
//! and refused before posting.
//!
//! UC has no acknowledgements: a sender's completion says the request left,
//! not that it landed, so data written remotely is awaited by polling the
//! target memory with a deadline.

mod common;

use std::time::{Duration, Instant};

use rdma_verbs::{
    memory::RemoteKey, qp::Posted, AccessFlags, Error, LocalBuffer, ProtectionDomain, QpType,
    RemoteMemory, SendQueue, SharedBuffer, WcOpcode, Wr,
};

/// Posts a request of one kind with a buffer of `pd` aimed at `remote`.
type PostRequest = fn(&mut SendQueue, &ProtectionDomain, RemoteMemory) -> Posted;

fn uc_pair() -> common::Pair {
    common::pair(
        QpType::Uc,
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        |b| b.max_inline_data(64),
    )
}

fn filled(pd: &ProtectionDomain, bytes: &[u8]) -> LocalBuffer {
    let mut b = pd.alloc(bytes.len(), AccessFlags::LOCAL_WRITE).unwrap();
    b.copy_from_slice(bytes);
    b
}

fn blank(pd: &ProtectionDomain, len: usize) -> LocalBuffer {
    let mut b = pd.alloc(len, AccessFlags::LOCAL_WRITE).unwrap();
    b.fill(0xEE);
    b
}

fn target(pd: &ProtectionDomain, len: usize) -> SharedBuffer {
    let mut s = pd
        .alloc_shared(len, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .unwrap();
    s.copy_from_slice(0, &vec![0xEE; len]).unwrap();
    s
}

/// Waits (5 s at most) until `s[offset..]` holds `want`; panics with `what`.
fn wait_bytes(s: &SharedBuffer, offset: usize, want: &[u8], what: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut got = vec![0u8; want.len()];
    loop {
        s.copy_to_slice(offset, &mut got).unwrap();
        if got == want {
            return;
        }
        if Instant::now() > deadline {
            let first = got.iter().zip(want).position(|(a, b)| a != b).unwrap();
            panic!(
                "{what}: target bytes differ from byte {first} on ({:02x?} != {:02x?})",
                &got[first..(first + 16).min(got.len())],
                &want[first..(first + 16).min(want.len())]
            );
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
#[ignore = "needs an RDMA device"]
fn uc_send_recv() {
    let p = uc_pair();
    let mut sq = p.a.send_queue().unwrap();
    let mut rq = p.b.recv_queue().unwrap();
    // One packet, and a message spanning several MTU-sized packets.
    for (i, len) in [(1u64, 200usize), (2, 3000)] {
        let payload = common::pattern(len, i as u8);
        rq.recv(blank(&p.pd, 4096), 10 + i).unwrap();
        sq.send(filled(&p.pd, &payload), Wr::id(i)).unwrap();
        let mut s = common::wait_ok(&p.cq_a);
        assert_eq!(
            (s.wr_id(), s.opcode()),
            (i, WcOpcode::Send),
            "send completion"
        );
        assert_eq!(&s.take_local().expect("send buffer back")[..], &payload[..]);
        let mut r = common::wait_ok(&p.cq_b);
        assert_eq!(r.wr_id(), 10 + i, "receive wr_id");
        assert_eq!(r.opcode(), WcOpcode::Recv, "receive opcode: {r:?}");
        assert_eq!(r.byte_len() as usize, len, "receive byte_len: {r:?}");
        assert_eq!(r.qp_num(), p.b.qp_num().0, "completes on the receiver");
        assert_eq!(r.imm_data(), None);
        let buf = r.take_local().expect("receive buffer back");
        assert_eq!(&buf[..len], &payload[..], "{len}-byte UC message");
        assert!(
            buf[len..].iter().all(|&x| x == 0xEE),
            "bytes past the message untouched"
        );
    }
    // Inline and with immediate.
    let payload = common::pattern(50, 77);
    rq.recv(blank(&p.pd, 64), 0).unwrap();
    sq.send_inline(&payload, Wr::id(0).imm(0x0102_0304))
        .unwrap();
    common::wait_ok(&p.cq_a);
    let mut r = common::wait_ok(&p.cq_b);
    assert_eq!(
        r.imm_data(),
        Some(0x0102_0304),
        "send with immediate: {r:?}"
    );
    assert_eq!(r.byte_len(), 50);
    assert_eq!(&r.take_local().unwrap()[..50], &payload[..]);
    common::assert_quiet(&p.cq_a);
    common::assert_quiet(&p.cq_b);
}

#[test]
#[ignore = "needs an RDMA device"]
fn uc_rdma_write() {
    let p = uc_pair();
    let t = target(&p.pd, 8192);
    let remote = t.remote().expect("REMOTE_WRITE region has an rkey");
    let mut sq = p.a.send_queue().unwrap();
    // A posted receive proves that a plain write consumes none.
    p.b.recv_queue()
        .unwrap()
        .recv(blank(&p.pd, 16), 99)
        .unwrap();
    let payload = common::pattern(5000, 21);
    sq.write(
        filled(&p.pd, &payload),
        remote.slice(1000, 5000).unwrap(),
        Wr::id(1),
    )
    .unwrap();
    let mut s = common::wait_ok(&p.cq_a);
    assert_eq!(s.opcode(), WcOpcode::RdmaWrite, "write completion: {s:?}");
    assert_eq!(
        &s.take_local().unwrap()[..],
        &payload[..],
        "source unchanged"
    );
    wait_bytes(&t, 1000, &payload, "UC RDMA write");
    let mut edges = [0u8; 2];
    t.copy_to_slice(999, &mut edges[..1]).unwrap();
    t.copy_to_slice(6000, &mut edges[1..]).unwrap();
    assert_eq!(
        edges,
        [0xEE, 0xEE],
        "bytes around the written range untouched"
    );
    // Inline write.
    sq.write_inline(b"inline-uc", remote.slice(7000, 9).unwrap(), Wr::id(0))
        .unwrap();
    common::wait_ok(&p.cq_a);
    wait_bytes(&t, 7000, b"inline-uc", "UC inline RDMA write");
    common::assert_quiet(&p.cq_b);
    assert_eq!(
        p.b.recv_outstanding(),
        1,
        "a write without immediate consumes no receive"
    );
}

#[test]
#[ignore = "needs an RDMA device"]
fn uc_rdma_write_with_immediate_consumes_a_receive() {
    let p = uc_pair();
    let t = target(&p.pd, 4096);
    let remote = t.remote().unwrap();
    p.b.recv_queue().unwrap().recv(blank(&p.pd, 32), 7).unwrap();
    let payload = common::pattern(3000, 5);
    p.a.send_queue()
        .unwrap()
        .write(
            filled(&p.pd, &payload),
            remote.slice(512, 3000).unwrap(),
            Wr::id(3).imm(0xCAFE_F00D),
        )
        .unwrap();
    let s = common::wait_ok(&p.cq_a);
    assert_eq!((s.wr_id(), s.opcode()), (3, WcOpcode::RdmaWrite), "{s:?}");
    let mut r = common::wait_ok(&p.cq_b);
    assert_eq!(r.wr_id(), 7, "the posted receive is consumed");
    assert_eq!(
        r.opcode(),
        WcOpcode::RecvRdmaWithImm,
        "receive completion of a write with immediate: {r:?}"
    );
    assert_eq!(r.imm_data(), Some(0xCAFE_F00D), "immediate in host order");
    assert_eq!(r.byte_len(), 3000, "byte_len is the written length: {r:?}");
    let rb = r.take_local().expect("receive buffer handed back");
    assert!(
        rb.iter().all(|&x| x == 0xEE),
        "the receive buffer itself is not written"
    );
    // The receive completion comes after the data landed.
    let mut got = vec![0u8; 3000];
    t.copy_to_slice(512, &mut got).unwrap();
    assert_eq!(got, payload, "data written before the immediate completed");
    assert_eq!(p.b.recv_outstanding(), 0);
    common::assert_quiet(&p.cq_b);
}

#[test]
#[ignore = "needs an RDMA device"]
fn uc_read_and_atomics_are_rejected_before_posting() {
    let p = uc_pair();
    let remote = RemoteMemory {
        addr: 0x10000,
        len: 64,
        rkey: RemoteKey(0x77),
    };
    let cases: [(&str, PostRequest, usize); 3] = [
        (
            "RDMA read",
            |sq, pd, r| sq.read(blank(pd, 64), r, Wr::id(1)),
            64,
        ),
        (
            "compare-and-swap",
            |sq, pd, r| sq.compare_and_swap(blank(pd, 8), r, 1, 2, Wr::id(2)),
            8,
        ),
        (
            "fetch-and-add",
            |sq, pd, r| sq.fetch_and_add(blank(pd, 8), r, 5, Wr::id(3)),
            8,
        ),
    ];
    let mut sq = p.a.send_queue().unwrap();
    for (what, post, len) in cases {
        let err = post(&mut sq, &p.pd, remote).unwrap_err();
        assert!(
            matches!(
                err.error,
                Error::OpNotAvailable {
                    qp_type: QpType::Uc,
                    ..
                }
            ),
            "UC {what} must be OpNotAvailable naming the QP type, got {}",
            err.error
        );
        assert_eq!(
            err.buf.len(),
            len,
            "UC {what}: the refused request hands its buffer back"
        );
    }
    assert_eq!(p.a.send_outstanding(), 0, "nothing was posted");
    common::assert_quiet(&p.cq_a);
    common::assert_quiet(&p.cq_b);
}
