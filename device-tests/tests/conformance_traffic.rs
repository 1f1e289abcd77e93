//! rdma-core's pyverbs traffic tests that run plain send/receive over a
//! particular CQ or memory setup, as device tests of this library
//! (`common::traffic`, after pyverbs' `traffic()`: 100 messages of 1024
//! bytes each way, every byte, opcode and length checked):
//! `test_cq_events.py` (every completion taken only after its completion
//! event and a re-arm), `test_cqex.py`'s RC traffic (classic queue pairs
//! on extended CQs) and `test_relaxed_ordering.py` (buffers registered
//! with `RELAXED_ORDERING`). The parity table in docs/testing.md maps
//! each pyverbs test here.

mod common;

use common::traffic::{players, CqKind, Via};
use rdma_verbs::{AccessFlags, QpType};

const ITERS: usize = 100;
const SIZE: usize = 1024;

/// pyverbs `test_cq_events.CqEventsTestCase.test_cq_events_rc`: each CQ
/// on a completion channel of its own, armed at creation; each of the
/// 400 completions is polled only after its event was read (naming its
/// CQ) and the CQ re-armed, and no event is left over.
#[test]
#[ignore = "needs an RDMA device"]
fn conformance_cq_events_rc_traffic() {
    players(QpType::Rc, None, CqKind::Events, AccessFlags::empty()).traffic(ITERS, SIZE, Via::Send);
}

/// pyverbs `test_cq_events.CqEventsTestCase.test_cq_events_ud`: as the
/// RC test, over UD.
#[test]
#[ignore = "needs an RDMA device"]
fn conformance_cq_events_ud_traffic() {
    players(QpType::Ud, None, CqKind::Events, AccessFlags::empty()).traffic(ITERS, SIZE, Via::Send);
}

/// pyverbs `test_cqex.CqExTestCase.test_rc_traffic_cq_ex`: classic RC
/// queue pairs reporting to extended CQs (`ibv_create_cq_ex`, standard
/// fields), polled with `ibv_start_poll`/`ibv_next_poll`.
#[test]
#[ignore = "needs an RDMA device"]
fn conformance_cq_ex_rc_traffic() {
    let p = players(QpType::Rc, None, CqKind::Extended, AccessFlags::empty());
    assert!(p.client.cq.wc_fields().is_some(), "an extended CQ");
    p.traffic(ITERS, SIZE, Via::Send);
}

/// pyverbs `test_relaxed_ordering.RoTestCase.test_ro_rc_traffic`: RC
/// send/receive between buffers registered with `RELAXED_ORDERING`.
#[test]
#[ignore = "needs an RDMA device"]
fn conformance_relaxed_ordering_rc_traffic() {
    let ro = AccessFlags::RELAXED_ORDERING;
    let p = players(QpType::Rc, None, CqKind::Classic, ro);
    assert!(p.buf(b"x").memory_region().access().contains(ro));
    p.traffic(ITERS, SIZE, Via::Send);
}

/// pyverbs `test_relaxed_ordering.RoTestCase.test_ro_ud_traffic`: as the
/// RC test, over UD.
#[test]
#[ignore = "needs an RDMA device"]
fn conformance_relaxed_ordering_ud_traffic() {
    let ro = AccessFlags::RELAXED_ORDERING;
    let p = players(QpType::Ud, None, CqKind::Classic, ro);
    assert!(p.buf(b"x").memory_region().access().contains(ro));
    p.traffic(ITERS, SIZE, Via::Send);
}
