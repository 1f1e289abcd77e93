//! rdma-core's pyverbs `tests/test_qpex.py` as device tests of this
//! library (issue #22, conformance item 5): queue pairs created with
//! `ibv_create_qp_ex` for exactly the one operation each test runs (as
//! pyverbs creates them) and posted through `ibv_wr_start` …
//! `ibv_wr_complete` — UD sends addressed with `ibv_wr_set_ud_addr`, with
//! and without immediate data and of zero bytes; RC send, send with
//! immediate, RDMA write (with immediate, of zero bytes), read (of zero
//! bytes), compare-and-swap, fetch-and-add and atomic write — 100
//! iterations each way with every byte checked (`common::traffic`, after
//! pyverbs' `traffic()`, `rdma_traffic()`, `atomic_traffic()`); and its
//! bad flows on an extended UD queue pair: receives and sends in RESET, a
//! full receive queue, a receive with more entries than `max_recv_sge`.
//! Every test also checks that the queue pair refuses, by name, an
//! operation it was not created for: the request went the `ibv_wr_*` way.
//! The parity table in docs/testing.md maps each pyverbs test here.

mod common;

use common::traffic::{players, Atomic, CqKind, Players, Rdma, Via, UD_QKEY};
use rdma_verbs::{
    qp::{SendOpFlags, UdDest},
    AccessFlags, Error, QpState, QpType, Wr,
};

/// pyverbs' iterations and message size.
const ITERS: usize = 100;
const SIZE: usize = 1024;
const IMM: u32 = 0x1234_abcd;

fn ex(qp_type: QpType, ops: SendOpFlags) -> Players {
    let p = players(qp_type, Some(ops), CqKind::Classic, AccessFlags::empty());
    refuses_what_it_was_not_created_for(&p, ops);
    p
}

/// A send (with immediate data when the queue pair was created for plain
/// sends) is refused with `SendOpFlagsRequired` naming the flag it lacks,
/// before anything is posted, and handed back.
fn refuses_what_it_was_not_created_for(p: &Players, ops: SendOpFlags) {
    let (buf, o, need) = if ops.contains(SendOpFlags::SEND) {
        (p.buf(b"imm"), Wr::id(0).imm(1), SendOpFlags::SEND_WITH_IMM)
    } else {
        (p.buf(b"plain"), Wr::id(0), SendOpFlags::SEND)
    };
    let len = buf.len();
    let mut sq = p.client.qp.send_queue().unwrap();
    let e = match &p.ah {
        Some(ah) => sq.send_to(buf, &UdDest::new(ah, p.server.qp.qp_num(), UD_QKEY), o),
        None => sq.send(buf, o),
    }
    .unwrap_err();
    assert!(
        matches!(e.error, Error::SendOpFlagsRequired { needed, .. } if needed == need),
        "{ops:?}: {}",
        e.error
    );
    assert!(
        matches!(&e.buf, rdma_verbs::memory::Buf::Local(b) if b.len() == len),
        "the buffer comes back"
    );
    assert_eq!(p.client.qp.send_outstanding(), 0);
}

/// pyverbs `test_qp_ex_ud_send`.
#[test]
#[ignore = "needs an RDMA device"]
fn conformance_qpex_ud_send() {
    ex(QpType::Ud, SendOpFlags::SEND).traffic(ITERS, SIZE, Via::Send);
}

/// pyverbs `test_qp_ex_ud_send_imm`.
#[test]
#[ignore = "needs an RDMA device"]
fn conformance_qpex_ud_send_imm() {
    ex(QpType::Ud, SendOpFlags::SEND_WITH_IMM).traffic(ITERS, SIZE, Via::SendImm(IMM));
}

/// pyverbs `test_qp_ex_ud_zero_size`: sends of no bytes (no SGE); each
/// receive gets the GRH alone.
#[test]
#[ignore = "needs an RDMA device"]
fn conformance_qpex_ud_zero_size() {
    ex(QpType::Ud, SendOpFlags::SEND).traffic(ITERS, 0, Via::Send);
}

/// pyverbs `test_qp_ex_rc_send`.
#[test]
#[ignore = "needs an RDMA device"]
fn conformance_qpex_rc_send() {
    ex(QpType::Rc, SendOpFlags::SEND).traffic(ITERS, SIZE, Via::Send);
}

/// pyverbs `test_qp_ex_rc_send_imm`.
#[test]
#[ignore = "needs an RDMA device"]
fn conformance_qpex_rc_send_imm() {
    ex(QpType::Rc, SendOpFlags::SEND_WITH_IMM).traffic(ITERS, SIZE, Via::SendImm(IMM));
}

/// pyverbs `test_qp_ex_rc_rdma_write`.
#[test]
#[ignore = "needs an RDMA device"]
fn conformance_qpex_rc_rdma_write() {
    ex(QpType::Rc, SendOpFlags::RDMA_WRITE).rdma_traffic(ITERS, SIZE, Rdma::Write);
}

/// pyverbs `test_qp_ex_rc_rdma_write_imm`: the write lands in the peer's
/// region and consumes one of its receives, which carries the immediate.
#[test]
#[ignore = "needs an RDMA device"]
fn conformance_qpex_rc_rdma_write_imm() {
    ex(QpType::Rc, SendOpFlags::RDMA_WRITE_WITH_IMM).traffic(ITERS, SIZE, Via::WriteImm(IMM));
}

/// pyverbs `test_qp_ex_rc_rdma_write_zero_length`: the region is unchanged.
#[test]
#[ignore = "needs an RDMA device"]
fn conformance_qpex_rc_rdma_write_zero_length() {
    ex(QpType::Rc, SendOpFlags::RDMA_WRITE).rdma_traffic(ITERS, 0, Rdma::Write);
}

/// pyverbs `test_qp_ex_rc_rdma_read`.
#[test]
#[ignore = "needs an RDMA device"]
fn conformance_qpex_rc_rdma_read() {
    ex(QpType::Rc, SendOpFlags::RDMA_READ).rdma_traffic(ITERS, SIZE, Rdma::Read);
}

/// pyverbs `test_qp_ex_rc_rdma_read_zero_size`.
#[test]
#[ignore = "needs an RDMA device"]
fn conformance_qpex_rc_rdma_read_zero_size() {
    ex(QpType::Rc, SendOpFlags::RDMA_READ).rdma_traffic(ITERS, 0, Rdma::Read);
}

/// pyverbs `test_qp_ex_rc_atomic_cmp_swp`.
#[test]
#[ignore = "needs an RDMA device"]
fn conformance_qpex_rc_atomic_cmp_swp() {
    ex(QpType::Rc, SendOpFlags::ATOMIC_CMP_AND_SWP).atomic_traffic(ITERS, Atomic::CompareSwap);
}

/// pyverbs `test_qp_ex_rc_atomic_fetch_add`.
#[test]
#[ignore = "needs an RDMA device"]
fn conformance_qpex_rc_atomic_fetch_add() {
    ex(QpType::Rc, SendOpFlags::ATOMIC_FETCH_AND_ADD).atomic_traffic(ITERS, Atomic::FetchAdd);
}

/// pyverbs `test_qp_ex_rc_atomic_write`: a queue pair created for atomic
/// write alone.
#[test]
#[ignore = "needs an RDMA device"]
fn conformance_qpex_rc_atomic_write() {
    ex(QpType::Rc, SendOpFlags::ATOMIC_WRITE).atomic_traffic(ITERS, Atomic::Write);
}

/// Issue #22 item 5: UC queue pairs created through the extended create
/// carry sends and RDMA writes with immediate data through `ibv_wr_*`.
#[test]
#[ignore = "needs an RDMA device"]
fn conformance_qpex_uc_send_and_write_imm() {
    let p = ex(
        QpType::Uc,
        SendOpFlags::SEND | SendOpFlags::RDMA_WRITE_WITH_IMM,
    );
    p.traffic(ITERS, SIZE, Via::Send);
    p.traffic(ITERS, SIZE, Via::WriteImm(IMM));
}

/// pyverbs `test_post_receive_qp_state_bad_flow`: an extended UD queue
/// pair moved from RTS to RESET refuses a receive (the provider's
/// `EINVAL`, named), and hands the request back.
#[test]
#[ignore = "needs an RDMA device"]
fn conformance_qpex_post_receive_in_reset_is_refused() {
    let p = ex(QpType::Ud, SendOpFlags::SEND);
    let qp = &p.server.qp;
    assert_eq!(qp.state().unwrap(), QpState::Rts);
    qp.reset().unwrap();
    let e = qp
        .recv_queue()
        .unwrap()
        .recv(p.buf(&[0; 64]), 1)
        .unwrap_err();
    eprintln!("receive in RESET: {}", e.error);
    assert_eq!(e.error.verb(), Some("ibv_post_recv"), "{:?}", e.error);
    assert_eq!(e.error.raw_os_error(), Some(libc::EINVAL), "{:?}", e.error);
    assert!(
        matches!(&e.buf, rdma_verbs::memory::Buf::Local(b) if b.len() == 64),
        "the buffer comes back"
    );
    assert_eq!(qp.recv_outstanding(), 0);
    p.quiet();
}

/// pyverbs `test_post_send_qp_state_bad_flow`: an extended UD queue pair
/// moved from RTS to RESET refuses a send. pyverbs gets the provider's
/// `EINVAL`; the library refuses before the provider: no send-queue
/// handle outside RTS (`NotReadyToSend`), because rxe queues a send it
/// refuses before RTS and runs it later (DESIGN.md, "Posting moves the
/// buffer"). The buffer never left the caller.
#[test]
#[ignore = "needs an RDMA device"]
fn conformance_qpex_post_send_in_reset_is_refused() {
    let p = ex(QpType::Ud, SendOpFlags::SEND);
    let qp = &p.client.qp;
    qp.reset().unwrap();
    let buf = p.buf(&[7; 64]);
    let e = qp.send_queue().unwrap_err();
    eprintln!("send in RESET: {e}");
    assert!(
        matches!(
            e,
            Error::NotReadyToSend {
                state: QpState::Reset
            }
        ),
        "{e:?}"
    );
    assert_eq!(buf.len(), 64, "the buffer stays the caller's");
    assert_eq!(qp.send_outstanding(), 0);
    p.quiet();
}

/// pyverbs `test_full_rq_bad_flow`: once the receive queue holds as many
/// receives as it was created for, one more is refused (`QueueFull`,
/// before the provider: the library keeps at most the depth asked for,
/// which the CQ was sized to; rxe grants at least that) and handed back.
#[test]
#[ignore = "needs an RDMA device"]
fn conformance_qpex_full_receive_queue_refuses_one_more() {
    let p = ex(QpType::Ud, SendOpFlags::SEND);
    let qp = &p.server.qp;
    let depth = qp.recv_capacity();
    assert!(qp.caps().max_recv_wr >= depth, "{:?}", qp.caps());
    let mut rq = qp.recv_queue().unwrap();
    for i in 0..depth {
        rq.recv(p.buf(&[0; 64]), u64::from(i)).unwrap();
    }
    let e = rq.recv(p.buf(&[0; 64]), 999).unwrap_err();
    eprintln!("receive {} of {depth}: {}", depth + 1, e.error);
    assert!(
        matches!(e.error, Error::QueueFull { depth: d, .. } if d == depth),
        "{:?}",
        e.error
    );
    assert!(
        matches!(&e.buf, rdma_verbs::memory::Buf::Local(b) if b.len() == 64),
        "the buffer comes back"
    );
    assert_eq!(qp.recv_outstanding(), depth);
    // The queue still works: one datagram lands in the first receive.
    p.client
        .qp
        .send_queue()
        .unwrap()
        .send_to(
            p.buf(&[5; 16]),
            &UdDest::new(p.ah.as_ref().unwrap(), qp.qp_num(), UD_QKEY),
            Wr::id(0),
        )
        .unwrap();
    p.next_ok(&p.client.cq);
    let mut r = p.next_ok(&p.server.cq);
    assert_eq!((r.wr_id(), r.byte_len()), (0, 40 + 16));
    assert_eq!(&r.take_local().unwrap()[40..56], &[5; 16]);
}

/// pyverbs `test_rq_with_larger_sgl_bad_flow`: on an extended UD queue
/// pair, a receive scattering over one entry more than the granted
/// `max_recv_sge` is refused before posting (`TooManySges`; pyverbs gets
/// the provider's `EINVAL`) with every buffer handed back.
#[test]
#[ignore = "needs an RDMA device"]
fn conformance_qpex_receive_with_more_sges_than_max_recv_sge_is_refused() {
    let p = ex(QpType::Ud, SendOpFlags::SEND);
    let qp = &p.server.qp;
    let max = qp.caps().max_recv_sge;
    let bufs = (0..=max)
        .map(|_| rdma_verbs::memory::Buf::Local(p.buf(&[0; 64])))
        .collect();
    let e = qp.recv_queue().unwrap().recv_sgl(bufs, 0).unwrap_err();
    eprintln!("{} entries, max_recv_sge {max}: {}", max + 1, e.error);
    assert!(
        matches!(e.error, Error::TooManySges { got, max: m } if got == max as usize + 1 && m == max),
        "{:?}",
        e.error
    );
    assert_eq!(e.buf.len(), max as usize + 1, "every buffer comes back");
    assert_eq!(qp.recv_outstanding(), 0);
}
