//! Scenarios of rdma-core's own test suite (pyverbs, `tests/test_atomic.py`,
//! `test_qp.py`, `test_device.py`) as device tests of this library: remote
//! requests refused for want of a right (the queue pair's, the region's)
//! or for a wrong key, each ending in its error completion with every
//! buffer handed back; queue pair queries after creation and after each
//! state change; the P_Key table and the data-in-order query. The parity
//! table in docs/testing.md maps each pyverbs test to its counterpart here.

mod common;

use common::{device, pair, pattern, remote_all, wait, Pair};
use rdma_verbs::{
    memory::RemoteKey,
    qp::{Posted, QpAttr, QpCaps, SendOp, SendOpFlags},
    AccessFlags, Error, LocalBuffer, QpState, QpType, QueuePair, RemoteMemory, SendQueue, WcStatus,
    Wr,
};

fn local() -> AccessFlags {
    AccessFlags::LOCAL_WRITE
}

/// The requests of these tests: each reads or changes the 8-byte word
/// at the start of `remote` and needs one right of the peer.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Remote {
    CompareSwap,
    FetchAdd,
    Read,
    Write,
}

const ALL: [Remote; 4] = [
    Remote::CompareSwap,
    Remote::FetchAdd,
    Remote::Read,
    Remote::Write,
];

impl Remote {
    fn post(self, sq: &mut SendQueue, buf: LocalBuffer, remote: RemoteMemory, o: Wr) -> Posted {
        match self {
            // The word holds the pattern, not 0: the swap would not happen
            // anyway, but the request still needs the right.
            Remote::CompareSwap => sq.compare_and_swap(buf, remote, 0, 42, o),
            Remote::FetchAdd => sq.fetch_and_add(buf, remote, 1, o),
            Remote::Read => sq.read(buf, remote, o),
            Remote::Write => sq.write(buf, remote, o),
        }
    }
}

/// What one refused request left behind.
#[derive(Debug)]
struct Refusal {
    /// The requester's completion status.
    status: WcStatus,
    /// The responder's state once the error arrived (what the device did).
    responder: QpState,
}

/// Posts `op` from `p.a` to `remote` (the first 8 bytes of `target`,
/// which hold `pattern(64, 5)`), followed by a send that the failure must
/// flush, while `p.b` has a receive posted. Checks that the request fails,
/// that both of `a`'s buffers and `b`'s receive buffer come back (`b`
/// moved to ERR by hand, as a caller would to get its receives back),
/// that neither queue keeps anything outstanding, and that the target is
/// unchanged. Returns the status and the responder's state.
fn refuse(
    p: &Pair,
    op: Remote,
    remote: RemoteMemory,
    target: &rdma_verbs::SharedBuffer,
) -> Refusal {
    p.b.recv_queue()
        .unwrap()
        .recv(p.pd.alloc(64, local()).unwrap(), 30)
        .unwrap();
    let mut buf = p.pd.alloc(8, local()).unwrap();
    buf.copy_from_slice(&[0xEE; 8]);
    let mut sq = p.a.send_queue().unwrap();
    op.post(&mut sq, buf, remote, Wr::id(10)).unwrap();
    sq.send(p.pd.alloc(16, local()).unwrap(), Wr::id(11))
        .unwrap();
    drop(sq);
    let got = wait(&p.cq_a, 2);
    let (mut first, mut second) = {
        let mut it = got.into_iter();
        (it.next().unwrap(), it.next().unwrap())
    };
    assert_eq!((first.wr_id(), second.wr_id()), (10, 11), "{op:?}");
    let status = first.status();
    assert!(
        matches!(first.result(), Err(Error::WorkCompletion { status: s, wr_id: 10, .. }) if s == status),
        "{op:?}: {first:?}"
    );
    assert_eq!(second.status(), WcStatus::WrFlushErr, "{op:?}: {second:?}");
    let back = first.take_local().expect("the request's buffer comes back");
    assert_eq!(back.len(), 8, "{op:?}");
    // A failed read or atomic wrote nothing into it.
    assert_eq!(&back[..], &[0xEE; 8], "{op:?}");
    assert_eq!(second.take_local().map(|b| b.len()), Some(16), "{op:?}");
    assert_eq!(p.a.send_outstanding(), 0, "{op:?}");
    assert_eq!(p.a.state().unwrap(), QpState::Err, "{op:?}");

    // The responder's side: give the device a moment, then take the
    // receive back by moving the queue pair to ERR (ERR to ERR flushes too).
    std::thread::sleep(std::time::Duration::from_millis(100));
    let responder = p.b.state().unwrap();
    p.b.modify(&QpAttr::new().qp_state(QpState::Err)).unwrap();
    let mut r = wait(&p.cq_b, 1).pop().unwrap();
    assert_eq!(
        (r.wr_id(), r.status()),
        (30, WcStatus::WrFlushErr),
        "{op:?}: {r:?}"
    );
    assert_eq!(r.take_local().map(|b| b.len()), Some(64), "{op:?}");
    assert_eq!(p.b.recv_outstanding(), 0, "{op:?}");
    common::assert_quiet(&p.cq_a);
    common::assert_quiet(&p.cq_b);

    let mut now = vec![0u8; 64];
    target.copy_to_slice(0, &mut now).unwrap();
    assert_eq!(now, pattern(64, 5), "{op:?}: the target changed");
    Refusal { status, responder }
}

/// 64 bytes of `pattern(64, 5)` in a region granting `access`; its first
/// word as the peer names it.
fn target(p: &Pair, access: AccessFlags) -> (rdma_verbs::SharedBuffer, RemoteMemory) {
    let mut t = p.pd.alloc_shared(64, access).unwrap();
    t.copy_from_slice(0, &pattern(64, 5)).unwrap();
    let word = t.remote().unwrap().slice(0, 8).unwrap();
    (t, word)
}

/// pyverbs `test_atomic_invalid_qp_access` (and the same for reads and
/// writes): the responder's queue pair grants no remote right
/// (`ConnectOptions::remote_access` left at its default), its memory
/// every right.
#[test]
#[ignore = "needs an RDMA device"]
fn conformance_requests_to_a_queue_pair_without_remote_rights_fail() {
    for op in ALL {
        let p = pair(QpType::Rc, local(), |b| b);
        let (t, word) = target(&p, remote_all());
        let r = refuse(&p, op, word, &t);
        eprintln!("{op:?} to a queue pair without the right: {r:?}");
        if common::is_rxe(&p.dev) {
            // rxe answers with an invalid-request NAK (o9-10: the opcode
            // is not enabled) and moves the responder to ERR.
            assert_eq!(r.status, WcStatus::RemInvReqErr, "{op:?}");
            assert_eq!(r.responder, QpState::Err, "{op:?}");
        } else {
            assert!(
                matches!(r.status, WcStatus::RemInvReqErr | WcStatus::RemAccessErr),
                "{op:?}: {r:?}"
            );
        }
    }
}

/// pyverbs `test_atomic_invalid_mr_access` (and the same for reads and
/// writes): the queue pairs grant every right, the region all but the
/// one the request needs.
#[test]
#[ignore = "needs an RDMA device"]
fn conformance_requests_to_a_region_without_the_right_fail() {
    let all = remote_all();
    let cases = [
        (Remote::CompareSwap, all - AccessFlags::REMOTE_ATOMIC),
        (Remote::FetchAdd, all - AccessFlags::REMOTE_ATOMIC),
        (Remote::Read, all - AccessFlags::REMOTE_READ),
        (Remote::Write, all - AccessFlags::REMOTE_WRITE),
        // pyverbs' case: LOCAL_WRITE only, no remote right at all (the
        // region has no rkey of its own then; the peer is given the
        // region's key all the same, as a buggy or hostile caller would).
        (Remote::FetchAdd, local()),
    ];
    for (op, access) in cases {
        let p = pair(QpType::Rc, all, |b| b);
        let (t, word) = if access.intersects(all - local()) {
            target(&p, access)
        } else {
            let mut t = p.pd.alloc_shared(64, access).unwrap();
            t.copy_from_slice(0, &pattern(64, 5)).unwrap();
            let mr = t.memory_region();
            let word = RemoteMemory {
                addr: t.addr(),
                len: 8,
                rkey: RemoteKey(mr.lkey()),
            };
            (t, word)
        };
        let r = refuse(&p, op, word, &t);
        eprintln!("{op:?} to a region granting {access:?}: {r:?}");
        assert_eq!(r.status, WcStatus::RemAccessErr, "{op:?} on {access:?}");
        if common::is_rxe(&p.dev) {
            assert_eq!(r.responder, QpState::Err, "{op:?}");
        }
    }
}

/// pyverbs `test_atomic_invalid_rkey` (the key plus one, as there) and
/// the same for every request: the key names no region.
#[test]
#[ignore = "needs an RDMA device"]
fn conformance_requests_with_a_wrong_rkey_fail() {
    for op in ALL {
        let p = pair(QpType::Rc, remote_all(), |b| b);
        let (t, mut word) = target(&p, remote_all());
        word.rkey = RemoteKey(word.rkey.0.wrapping_add(1));
        let r = refuse(&p, op, word, &t);
        eprintln!("{op:?} with a wrong rkey: {r:?}");
        assert_eq!(r.status, WcStatus::RemAccessErr, "{op:?}");
        if common::is_rxe(&p.dev) {
            assert_eq!(r.responder, QpState::Err, "{op:?}");
        }
    }
}

/// The same pair, connected with every right: each request succeeds (the
/// refusals above are the rights', not the requests').
#[test]
#[ignore = "needs an RDMA device"]
fn conformance_requests_with_every_right_succeed() {
    for op in ALL {
        let p = pair(QpType::Rc, remote_all(), |b| b);
        let (_t, word) = target(&p, remote_all());
        let mut sq = p.a.send_queue().unwrap();
        op.post(&mut sq, p.pd.alloc(8, local()).unwrap(), word, Wr::id(1))
            .unwrap();
        let mut c = common::wait_ok(&p.cq_a);
        assert_eq!(c.take_local().map(|b| b.len()), Some(8), "{op:?}");
    }
}

/// What the tests create: 16 deep both ways, 2 SGEs each way, 64 bytes
/// inline.
fn requested() -> QpCaps {
    QpCaps {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 2,
        max_recv_sge: 2,
        max_inline_data: 64,
    }
}

fn create(
    p: &rdma_verbs::ProtectionDomain,
    cq: &rdma_verbs::CompletionQueue,
    ty: QpType,
    ops: Option<SendOpFlags>,
) -> QueuePair {
    let want = requested();
    let b = p
        .create_qp(ty, cq, cq)
        .max_send_wr(want.max_send_wr)
        .max_recv_wr(want.max_recv_wr)
        .max_send_sge(want.max_send_sge)
        .max_recv_sge(want.max_recv_sge)
        .max_inline_data(want.max_inline_data);
    match ops {
        Some(ops) => b.send_ops(ops),
        None => b,
    }
    .build()
    .unwrap_or_else(|e| panic!("{ty:?} {ops:?}: {e}"))
}

fn at_least(got: QpCaps, want: QpCaps, what: &str) {
    assert!(got.max_send_wr >= want.max_send_wr, "{what}: {got:?}");
    assert!(got.max_recv_wr >= want.max_recv_wr, "{what}: {got:?}");
    assert!(got.max_send_sge >= want.max_send_sge, "{what}: {got:?}");
    assert!(got.max_recv_sge >= want.max_recv_sge, "{what}: {got:?}");
    assert!(
        got.max_inline_data >= want.max_inline_data,
        "{what}: {got:?}"
    );
}

/// The send operations each type's extended queue pair is created with.
fn ex_ops(ty: QpType) -> SendOpFlags {
    match ty {
        QpType::Rc => SendOpFlags::rc_data(),
        QpType::Uc => SendOpFlags::SEND | SendOpFlags::SEND_WITH_IMM | SendOpFlags::RDMA_WRITE,
        _ => SendOpFlags::SEND | SendOpFlags::SEND_WITH_IMM,
    }
}

/// pyverbs `test_query_rc_qp`, `test_query_uc_qp`, `test_query_ud_qp`:
/// right after creation (classic and extended), a query reports RESET
/// and capacities at least those asked for.
#[test]
#[ignore = "needs an RDMA device"]
fn conformance_query_after_create_reports_the_caps_asked_for() {
    let dev = device();
    let pd = dev.ctx.alloc_pd().unwrap();
    let cq = dev.ctx.create_cq(512).build().unwrap();
    for ty in [QpType::Rc, QpType::Uc, QpType::Ud] {
        for ops in [None, Some(ex_ops(ty))] {
            let what = format!(
                "{ty:?} {}",
                if ops.is_some() { "extended" } else { "classic" }
            );
            let qp = create(&pd, &cq, ty, ops);
            assert_eq!(qp.send_ops(), ops, "{what}");
            let (attr, init_caps) = qp.query().unwrap();
            eprintln!(
                "{what}: state {:?}, cur_qp_state {:?}, caps {init_caps:?}, attr caps {:?}, \
                 granted {:?}",
                attr.qp_state(),
                attr.cur_qp_state(),
                attr.cap(),
                qp.caps()
            );
            assert_eq!(attr.qp_state(), QpState::Reset, "{what}");
            at_least(init_caps, requested(), &what);
            at_least(attr.cap(), requested(), &what);
            at_least(qp.caps(), requested(), &what);
        }
    }
}

/// pyverbs `test_modify_ud_qp` (classic and extended): the Q_Key set on
/// INIT and the send PSN set on RTS read back; RTS→RESET with the state
/// alone; `cur_qp_state` follows on rxe.
#[test]
#[ignore = "needs an RDMA device"]
fn conformance_query_after_modify_reads_back_qkey_psn_and_reset() {
    let dev = device();
    let rxe = common::is_rxe(&dev);
    let pd = dev.ctx.alloc_pd().unwrap();
    let cq = dev.ctx.create_cq(512).build().unwrap();
    for ops in [None, Some(ex_ops(QpType::Ud))] {
        let qp = create(&pd, &cq, QpType::Ud, ops);
        // rxe reports the current state in both fields at every step.
        let cur = |qp: &QueuePair| {
            let (a, _) = qp.query().unwrap();
            let both = (a.qp_state(), a.cur_qp_state());
            if rxe {
                assert_eq!(both.0, both.1, "{ops:?}");
            }
            both
        };
        qp.modify(
            &QpAttr::new()
                .qp_state(QpState::Init)
                .pkey_index(0)
                .port_num(dev.port)
                .qkey(0x123),
        )
        .unwrap();
        let (a, _) = qp.query().unwrap();
        assert_eq!((a.qp_state(), a.qkey()), (QpState::Init, 0x123), "{ops:?}");
        eprintln!("{ops:?}: INIT: {:?}", cur(&qp));
        qp.modify(&QpAttr::new().qp_state(QpState::Rtr)).unwrap();
        eprintln!("{ops:?}: RTR: {:?}", cur(&qp));
        qp.modify(&QpAttr::new().qp_state(QpState::Rts).sq_psn(0x45))
            .unwrap();
        let (a, _) = qp.query().unwrap();
        assert_eq!((a.qp_state(), a.sq_psn()), (QpState::Rts, 0x45), "{ops:?}");
        assert_eq!(a.qkey(), 0x123, "{ops:?}: the Q_Key stays");
        eprintln!("{ops:?}: RTS: {:?}", cur(&qp));
        // RTS → RESET names nothing but the state.
        qp.modify(&QpAttr::new().qp_state(QpState::Reset)).unwrap();
        assert_eq!(qp.state().unwrap(), QpState::Reset, "{ops:?}");
        eprintln!("{ops:?}: RESET: {:?}", cur(&qp));
        // And the queue pair is usable again from RESET.
        qp.activate_ud(dev.port, 0x456, 7).unwrap();
        let (a, _) = qp.query().unwrap();
        assert_eq!(
            (a.qp_state(), a.qkey(), a.sq_psn()),
            (QpState::Rts, 0x456, 7)
        );
    }
}

/// `cur_qp_state` given to `modify` (allowed from RTR, RTS, SQD, SQE) is
/// checked against the device's state, and the query reports it.
#[test]
#[ignore = "needs an RDMA device"]
fn conformance_cur_qp_state_names_the_state() {
    let p = pair(QpType::Rc, remote_all(), |b| b);
    p.a.modify(
        &QpAttr::new()
            .qp_state(QpState::Rts)
            .cur_qp_state(QpState::Rts)
            .min_rnr_timer(14),
    )
    .unwrap();
    let (a, _) = p.a.query().unwrap();
    eprintln!(
        "after RTS->RTS naming RTS: {:?} / {:?}",
        a.qp_state(),
        a.cur_qp_state()
    );
    assert_eq!((a.qp_state(), a.min_rnr_timer()), (QpState::Rts, 14));
    if common::is_rxe(&p.dev) {
        assert_eq!(a.cur_qp_state(), QpState::Rts);
    }
    let e =
        p.a.modify(
            &QpAttr::new()
                .qp_state(QpState::Rts)
                .cur_qp_state(QpState::Sqd),
        )
        .unwrap_err();
    assert!(matches!(e, Error::InvalidTransition { .. }), "{e}");
}

/// pyverbs `test_query_pkey`: entry 0 of the P_Key table; on rxe the
/// default partition 0xffff. An index past the table and a port the
/// device lacks are refused by the verb, with the reason.
#[test]
#[ignore = "needs an RDMA device"]
fn conformance_query_pkey() {
    let dev = device();
    let len = dev.ctx.query_port(dev.port).unwrap().pkey_table_len();
    assert!(len >= 1, "P_Key table of {len} entries");
    let pkey = dev.ctx.query_pkey(dev.port, 0).unwrap();
    eprintln!(
        "{} port {}: {len} P_Keys, [0] = {pkey:#06x}",
        dev.ctx.name(),
        dev.port
    );
    if common::is_rxe(&dev) {
        assert_eq!(pkey, 0xffff);
    }
    assert_ne!(pkey & 0x7fff, 0, "entry 0 is a valid partition");
    let e = dev.ctx.query_pkey(dev.port, len).unwrap_err();
    eprintln!("index {len}: {e}");
    assert!(
        matches!(
            e,
            Error::Verb {
                verb: "ibv_query_pkey",
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("past the P_Key table"), "{e}");
    let e = dev
        .ctx
        .query_pkey(rdma_verbs::PortNumber(200), 0)
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::Verb {
                verb: "ibv_query_pkey",
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("has no port 200"), "{e}");
}

/// pyverbs `test_query_data_in_order`: a UD queue pair in RTS answers 0 or
/// 1 (here `false` or `true`); rxe implements no answer of its own, so
/// libibverbs says `false`. Atomics are refused by name.
#[test]
#[ignore = "needs an RDMA device"]
fn conformance_query_data_in_order() {
    let dev = device();
    let pd = dev.ctx.alloc_pd().unwrap();
    let cq = dev.ctx.create_cq(256).build().unwrap();
    let ud = pd.create_qp(QpType::Ud, &cq, &cq).build().unwrap();
    ud.activate_ud(dev.port, 0x1111, 0).unwrap();
    let p = pair(QpType::Rc, remote_all(), |b| b);
    for (qp, ops) in [
        (&ud, &[SendOp::Send][..]),
        (
            &p.a,
            &[SendOp::Send, SendOp::RdmaWrite, SendOp::RdmaRead][..],
        ),
    ] {
        for &op in ops {
            let in_order = qp.data_in_order(op).unwrap();
            eprintln!("{:?} {op:?}: data in order: {in_order}", qp.qp_type());
            if common::is_rxe(&dev) {
                assert!(!in_order, "rxe has no data-in-order answer of its own");
            }
        }
    }
    let e = p.a.data_in_order(SendOp::FetchAndAdd).unwrap_err();
    assert!(matches!(e, Error::Unsupported(_)), "{e}");
    assert!(e.to_string().contains("ibv_query_qp_data_in_order"), "{e}");
}

/// A receive scattering over more entries than the queue pair's granted
/// `max_recv_sge` is refused by the library before posting
/// (`Error::TooManySges`, the request and every buffer handed back,
/// nothing outstanding), where pyverbs' raw-packet
/// `test_create_raw_qp_ex_with_illegal_caps_max_recv_sge` asks the
/// device. A queue pair asking for more than the device's `max_sge` is
/// refused by `ibv_create_qp` with the reason. `max_recv_sge` entries
/// are accepted and scatter a send over them.
#[test]
#[ignore = "needs an RDMA device"]
fn conformance_recv_with_more_sges_than_max_recv_sge_is_refused() {
    let p = pair(QpType::Rc, remote_all(), |b| b.max_recv_sge(2));
    let max = p.b.caps().max_recv_sge;
    assert!(max >= 2, "granted {max}");
    let bufs = |n: u32| {
        (0..n)
            .map(|_| rdma_verbs::memory::Buf::Local(p.pd.alloc(8, local()).unwrap()))
            .collect::<Vec<_>>()
    };
    let mut rq = p.b.recv_queue().unwrap();
    let e = rq.recv_sgl(bufs(max + 1), 1).unwrap_err();
    eprintln!("{} entries, max_recv_sge {max}: {}", max + 1, e.error);
    assert!(
        matches!(e.error, Error::TooManySges { got, max: m } if got == max as usize + 1 && m == max),
        "{:?}",
        e.error
    );
    assert_eq!(e.buf.len(), max as usize + 1, "every buffer comes back");
    assert_eq!(p.b.recv_outstanding(), 0);

    // Exactly max_recv_sge: accepted, and a send scatters over them.
    rq.recv_sgl(bufs(max), 2).unwrap();
    let total = 8 * max as usize;
    let mut src = p.pd.alloc(total, local()).unwrap();
    src.copy_from_slice(&pattern(total, 9));
    p.a.send_queue().unwrap().send(src, Wr::id(3)).unwrap();
    common::wait_ok(&p.cq_a);
    let mut c = common::wait_ok(&p.cq_b);
    assert_eq!((c.wr_id(), c.wc().byte_len() as usize), (2, total));
    let mut got = Vec::new();
    match c.take_buffers() {
        rdma_verbs::memory::SgList::Many(v) => {
            assert_eq!(v.len(), max as usize);
            for b in v {
                match b {
                    rdma_verbs::memory::Buf::Local(b) => got.extend_from_slice(&b[..]),
                    other => panic!("{other:?}"),
                }
            }
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(got, pattern(total, 9));

    // Creating with more than the device's max_sge: the verb refuses.
    let max_sge = p.dev.ctx.query_device().unwrap().max_sge();
    let e =
        p.pd.create_qp(QpType::Rc, &p.cq_a, &p.cq_a)
            .max_recv_sge(max_sge + 1)
            .build()
            .unwrap_err();
    eprintln!("max_recv_sge {}: {e}", max_sge + 1);
    assert!(
        matches!(
            e,
            Error::Verb {
                verb: "ibv_create_qp",
                ..
            }
        ),
        "{e:?}"
    );
    assert!(
        e.to_string().contains("exceeds the device's max_sge"),
        "{e}"
    );
}

/// pyverbs `test_addr.AHTest.test_create_ah_roce`: on a RoCE port an
/// address vector without a GRH is refused, by the library before the
/// verb (`Error::GrhRequired`); the verb itself (called raw here) refuses
/// it too, which is what the library spares the caller.
#[test]
#[ignore = "needs an RDMA device"]
fn conformance_ah_without_grh_on_roce_is_refused() {
    let dev = device();
    let port = dev.ctx.query_port(dev.port).unwrap();
    assert!(
        port.link_layer() == rdma_verbs::device::LinkLayer::Ethernet || !common::is_rxe(&dev),
        "rxe is RoCE"
    );
    if port.link_layer() != rdma_verbs::device::LinkLayer::Ethernet {
        eprintln!("UNSUPPORTED on this device: not a RoCE port, nothing to refuse");
        return;
    }
    assert!(port.grh_required());
    let pd = dev.ctx.alloc_pd().unwrap();
    let av = rdma_verbs::qp::AddressVector::infiniband(dev.port, 0);
    assert!(!av.is_global());
    let e = pd.create_ah(&av).unwrap_err();
    eprintln!("library: {e}");
    assert!(
        matches!(e, Error::GrhRequired { port } if port == dev.port),
        "{e:?}"
    );
    assert!(e.to_string().contains("ibv_create_ah"), "{e}");

    let mut raw = *av.as_raw();
    // SAFETY: live PD; `raw` is a valid ibv_ah_attr outliving the call; an
    // AH it might return is destroyed below, once.
    let ah = unsafe { rdma_verbs::sys::ibv_create_ah(pd.as_ptr(), &mut raw) };
    let errno = std::io::Error::last_os_error();
    if !ah.is_null() {
        // SAFETY: just created, never shared.
        unsafe { rdma_verbs::sys::ibv_destroy_ah(ah) };
        panic!("the verb accepted an AH without a GRH on a RoCE port");
    }
    eprintln!("the verb itself: {errno}");

    // With the GRH the same port is fine.
    let gid = dev.ctx.query_gid(dev.port, dev.gid_index).unwrap();
    pd.create_ah(&rdma_verbs::qp::AddressVector::roce(
        dev.port,
        gid,
        dev.gid_index,
    ))
    .unwrap();
}

/// `REMOTE_WRITE` or `REMOTE_ATOMIC` without `LOCAL_WRITE` (ibv_reg_mr(3):
/// "if REMOTE_WRITE or REMOTE_ATOMIC is set, then LOCAL_WRITE must be
/// set too") is refused by the library before `ibv_reg_mr`
/// (`Error::MissingAccess` naming `LOCAL_WRITE`); the verb itself
/// (called raw here) refuses it with `EINVAL`. `REMOTE_READ` alone needs
/// no `LOCAL_WRITE` and is accepted.
#[test]
#[ignore = "needs an RDMA device"]
fn conformance_remote_write_or_atomic_without_local_write_is_refused() {
    let dev = device();
    let pd = dev.ctx.alloc_pd().unwrap();
    let mut mem = vec![0u8; 4096];
    for access in [
        AccessFlags::REMOTE_WRITE,
        AccessFlags::REMOTE_ATOMIC,
        AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC,
        AccessFlags::REMOTE_ATOMIC | AccessFlags::REMOTE_READ,
    ] {
        for e in [
            pd.alloc_shared(64, access).unwrap_err(),
            pd.register_shared(vec![0u8; 64], access).unwrap_err(),
        ] {
            eprintln!("{access:?}: {e}");
            assert!(
                matches!(e, Error::MissingAccess { needed, .. } if needed == AccessFlags::LOCAL_WRITE),
                "{access:?}: {e:?}"
            );
        }
        // SAFETY: live PD; `mem` outlives the call; a region it might
        // return is deregistered below, before `mem` is dropped.
        let mr = unsafe {
            rdma_verbs::sys::ibv_reg_mr(
                pd.as_ptr(),
                mem.as_mut_ptr().cast(),
                mem.len(),
                access.bits() as i32,
            )
        };
        let errno = std::io::Error::last_os_error();
        if !mr.is_null() {
            // SAFETY: just registered, never used.
            unsafe { rdma_verbs::sys::ibv_dereg_mr(mr) };
            panic!("the verb accepted {access:?} without LOCAL_WRITE");
        }
        eprintln!("{access:?}: the verb itself: {errno}");
        assert_eq!(errno.raw_os_error(), Some(libc::EINVAL), "{access:?}");
    }
    let b = pd.alloc_shared(64, AccessFlags::REMOTE_READ).unwrap();
    assert!(b.remote().is_some());
}
