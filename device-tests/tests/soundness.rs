//! Soundness regressions (device tests): programs that made the device
//! write where Rust held a reference, each asserting the safe outcome, and
//! DESIGN.md's request-option table cell by cell on a real device.
//!
//! The memory-window, completion-queue and event programs live beside this
//! file (`soundness_*.rs`); DESIGN.md's threat model names each.

mod common;

use common::{pair, remote_all, Pair};
use rdma_verbs::{
    error::TransitionReason,
    qp::{AddressVector, QpAttr, RequestOption, SendOp, SendOpFlags, UdDest},
    AccessFlags, Error, LocalBuffer, QpState, QpType, QueuePair, RemoteMemory, SendQueue,
    SendRequest, Wr,
};

/// An RDMA read's inline "data" as rxe reads it: one SGE
/// `{addr: u64, length: u32, lkey: u32}`, little-endian.
fn forged_sge(addr: u64, len: u32, lkey: u32) -> [u8; 16] {
    let mut sge = [0u8; 16];
    sge[..8].copy_from_slice(&addr.to_le_bytes());
    sge[8..12].copy_from_slice(&len.to_le_bytes());
    sge[12..].copy_from_slice(&lkey.to_le_bytes());
    sge
}

/// The program, up to the post: a source the peer may read, a
/// victim that is never posted (and which the caller borrows), and a
/// result buffer whose bytes are a scatter entry pointing at the victim.
struct InlineRead {
    remote: RemoteMemory,
    victim: LocalBuffer,
    evil: LocalBuffer,
    /// Keeps the source registered.
    _src: LocalBuffer,
}

fn inline_read(p: &Pair) -> InlineRead {
    let src =
        p.pd.register(
            vec![0xAB; 16],
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ,
        )
        .unwrap();
    let remote = src.memory_region().remote().unwrap();
    let victim =
        p.pd.register(vec![0u8; 16], AccessFlags::LOCAL_WRITE)
            .unwrap();
    let mut evil =
        p.pd.register(vec![0u8; 16], AccessFlags::LOCAL_WRITE)
            .unwrap();
    evil.copy_from_slice(&forged_sge(victim.addr(), 16, victim.lkey()));
    InlineRead {
        remote,
        victim,
        evil,
        _src: src,
    }
}

/// The refusal every path must give: inline on an RDMA read.
#[track_caller]
fn assert_inline_read_refused(e: &Error) {
    assert!(
        matches!(
            e,
            Error::OptionNotAllowed {
                option: RequestOption::Inline,
                op: SendOp::RdmaRead,
                qp_type: QpType::Rc
            }
        ),
        "an inline RDMA read must be refused as OptionNotAllowed, got {e}"
    );
}

/// After a refusal: the victim is untouched, the device saw nothing.
#[track_caller]
fn assert_untouched(p: &Pair, victim: &[u8]) {
    common::assert_quiet(&p.cq_a);
    assert_eq!(p.a.send_outstanding(), 0, "nothing was posted");
    assert!(
        victim.iter().all(|&b| b == 0),
        "the device wrote behind a &[u8]: {victim:02x?}"
    );
}

#[test]
#[ignore = "needs an RDMA device"]
fn soundness_inline_read_is_refused_on_every_classic_path() {
    let p = pair(QpType::Rc, remote_all(), |b| b.max_inline_data(64));
    let t = inline_read(&p);
    let view: &[u8] = &t.victim; // a live shared borrow throughout
    let mut sq = p.a.send_queue().unwrap();

    // The typed read: refused, the result buffer (with its forged bytes)
    // back.
    let e = sq.read(t.evil, t.remote, Wr::id(0).inline()).unwrap_err();
    assert_inline_read_refused(&e.error);
    let evil = e.buf.into_local().expect("buffer back");
    assert_untouched(&p, view);

    // post_chain: nothing posted, the request stays in the list.
    let mut list = vec![SendRequest::read(evil, t.remote).inline(true)];
    assert_inline_read_refused(&sq.post_chain(&mut list).unwrap_err());
    assert_eq!(list.len(), 1, "the refused request stays in the list");
    let evil = list.pop().unwrap().into_buffers().into_local().unwrap();
    assert_untouched(&p, view);

    // prepare: refused before anything is built.
    let e = sq
        .prepare(SendRequest::read(evil, t.remote).inline(true))
        .unwrap_err();
    assert_inline_read_refused(&e.error);
    let evil = e.buf.into_local().unwrap();
    assert_untouched(&p, view);

    // The same read without the flag is an ordinary read: the source's
    // bytes land in the result buffer, never in the victim.
    sq.read(evil, t.remote, Wr::id(5)).unwrap();
    let mut c = common::wait_ok(&p.cq_a);
    assert_eq!(c.wr_id(), 5);
    assert_eq!(&c.take_local().unwrap()[..], &[0xAB; 16]);
    assert_untouched(&p, view);
}

#[test]
#[ignore = "needs an RDMA device"]
fn soundness_inline_atomics_are_refused() {
    let p = pair(QpType::Rc, remote_all(), |b| b.max_inline_data(64));
    let target = p.pd.alloc_shared(8, remote_all()).unwrap();
    let remote = target.remote().unwrap();
    let victim =
        p.pd.register(vec![0u8; 16], AccessFlags::LOCAL_WRITE)
            .unwrap();
    let view: &[u8] = &victim;
    let evil = || {
        let mut b =
            p.pd.register(vec![0u8; 8], AccessFlags::LOCAL_WRITE)
                .unwrap();
        // An 8-byte result buffer holding the start of a forged SGE.
        b.copy_from_slice(&victim.addr().to_le_bytes());
        b
    };
    let mut sq = p.a.send_queue().unwrap();
    for op in [SendOp::CompareAndSwap, SendOp::FetchAndAdd] {
        let inline = Wr::id(0).inline();
        let e = match op {
            SendOp::CompareAndSwap => sq.compare_and_swap(evil(), remote, 0, 1, inline),
            _ => sq.fetch_and_add(evil(), remote, 1, inline),
        }
        .unwrap_err();
        assert!(
            matches!(
                e.error,
                Error::OptionNotAllowed { option: RequestOption::Inline, op: o, .. } if o == op
            ),
            "inline {op}: {}",
            e.error
        );
        assert_eq!(e.buf.len(), 8);
    }
    assert_untouched(&p, view);
    // The peer's word is unchanged too: no atomic ran.
    let mut word = [0u8; 8];
    target.copy_to_slice(0, &mut word).unwrap();
    assert_eq!(word, [0; 8]);
}

#[test]
#[ignore = "needs an RDMA device"]
fn soundness_inline_read_is_refused_on_the_extended_path() {
    let p = common::ex_pair(SendOpFlags::rc_data());
    let t = inline_read(&p);
    let view: &[u8] = &t.victim;
    let mut sq = p.a.send_queue().unwrap();
    let e = sq.read(t.evil, t.remote, Wr::id(0).inline()).unwrap_err();
    assert_inline_read_refused(&e.error);
    let evil = e.buf.into_local().unwrap();
    let mut list = vec![SendRequest::read(evil, t.remote).inline(true)];
    assert_inline_read_refused(&sq.post_chain(&mut list).unwrap_err());
    assert_eq!(list.len(), 1);
    let e = sq
        .compare_and_swap(
            p.pd.alloc(8, AccessFlags::LOCAL_WRITE).unwrap(),
            t.remote,
            0,
            1,
            Wr::id(0).inline(),
        )
        .unwrap_err();
    assert!(
        matches!(
            e.error,
            Error::OptionNotAllowed {
                option: RequestOption::Inline,
                op: SendOp::CompareAndSwap,
                ..
            }
        ),
        "{}",
        e.error
    );
    assert_untouched(&p, view);
}

/// The operations a test can build a request for (flush needs rdma-core 45).
const OPS: [SendOp; 6] = [
    SendOp::Send,
    SendOp::RdmaWrite,
    SendOp::RdmaRead,
    SendOp::CompareAndSwap,
    SendOp::FetchAndAdd,
    SendOp::AtomicWrite,
];

/// DESIGN.md's request-option table, written out again: may `op` on a
/// `ty` queue pair carry `option` (alone)?
fn allowed(op: SendOp, ty: QpType, option: RequestOption) -> bool {
    use RequestOption as S;
    use SendOp as O;
    match option {
        S::Inline | S::Immediate => matches!(op, O::Send | O::RdmaWrite),
        S::Solicited => op == O::Send,
        S::Fence => true,
        S::Invalidate => op == O::Send && ty == QpType::Rc,
        S::UdDestination => ty == QpType::Ud,
        _ => unreachable!(),
    }
}

fn available(op: SendOp, ty: QpType) -> bool {
    match ty {
        QpType::Rc => true,
        QpType::Uc => matches!(op, SendOp::Send | SendOp::RdmaWrite),
        _ => op == SendOp::Send,
    }
}

/// Posts `op` through the send queue's typed method with `option` (its
/// [`Wr`]) to `dest`, if any: the refusal's error and how many bytes came
/// back with it. `None` when no typed method can express the request (a
/// UD destination on anything but a send, on a queue pair whose type
/// allows the operation): the typed API rules the cell out by its
/// signatures.
fn post_typed(
    sq: &mut SendQueue,
    p: &Pair,
    op: SendOp,
    option: Option<RequestOption>,
    dest: Option<&UdDest>,
    remote: RemoteMemory,
) -> Option<Result<(), (Error, u64)>> {
    let o = Wr::id(0);
    let o = match option {
        Some(RequestOption::Inline) => o.inline(),
        Some(RequestOption::Immediate) => o.imm(7),
        Some(RequestOption::Solicited) => o.solicited(),
        Some(RequestOption::Fence) => o.fence(),
        Some(RequestOption::Invalidate) => o.invalidate(remote.rkey),
        _ => o,
    };
    let buf = |n| p.pd.alloc(n, AccessFlags::LOCAL_WRITE).unwrap();
    let back = |e: rdma_verbs::qp::Refused<rdma_verbs::memory::Buf>| (e.error, e.buf.len() as u64);
    let ty = sq.qp().qp_type();
    if op != SendOp::Send && dest.is_some() && available(op, ty) {
        return None;
    }
    // Beyond a send, the typed methods carry no destination: on a UD
    // queue pair, where only sends are available, the operation is refused
    // as unavailable with or without one.
    Some(match (op, dest) {
        (SendOp::Send, Some(d)) => sq.send_to(buf(16), d, o).map_err(back),
        (SendOp::Send, None) => sq.send(buf(16), o).map_err(back),
        (SendOp::RdmaWrite, _) => sq.write(buf(16), remote, o).map_err(back),
        (SendOp::RdmaRead, _) => sq.read(buf(16), remote, o).map_err(back),
        (SendOp::CompareAndSwap, _) => sq.compare_and_swap(buf(8), remote, 0, 1, o).map_err(back),
        (SendOp::FetchAndAdd, _) => sq.fetch_and_add(buf(8), remote, 1, o).map_err(back),
        (SendOp::AtomicWrite, _) => sq.atomic_write(remote, [1; 8], o).map_err(|e| (e, 0)),
        _ => unreachable!(),
    })
}

/// Every invalid cell of the table (one option at a time), on connected
/// RC and UC pairs and an active UD queue pair: refused with the typed
/// error naming the cell, through the send queue's typed methods (where
/// their signatures can express the cell), `post_chain` and `prepare`,
/// the request handed back whole and nothing posted.
#[test]
#[ignore = "needs an RDMA device"]
fn soundness_every_invalid_option_cell_is_refused() {
    let mut cells = 0;
    let mut typed_cells = 0;
    for ty in [QpType::Rc, QpType::Uc, QpType::Ud] {
        let (p, ah) = match ty {
            QpType::Ud => {
                let p = ud_pair();
                let ep = common::endpoint(&p.dev, &p.b, 0);
                let port = p.dev.ctx.query_port(p.dev.port).unwrap();
                let av = AddressVector::for_port(&port, &ep, p.dev.gid_index).unwrap();
                let ah = p.pd.create_ah(&av).unwrap();
                (p, Some(ah))
            }
            _ => (pair(ty, remote_all(), |b| b.max_inline_data(64)), None),
        };
        let mut sq = p.a.send_queue().unwrap();
        // An address handle to `p.b` for the UD-destination cells of the
        // connected pairs.
        let other_ah = ah.is_none().then(|| ud_ah(&p));
        let remote =
            p.pd.alloc_shared(64, remote_all())
                .unwrap()
                .remote()
                .unwrap();
        let make = |op: SendOp| -> (SendRequest<'static>, u64) {
            let buf = |n| p.pd.alloc(n, AccessFlags::LOCAL_WRITE).unwrap();
            match op {
                SendOp::Send => (SendRequest::send(buf(16)), 16),
                SendOp::RdmaWrite => (SendRequest::write(buf(16), remote), 16),
                SendOp::RdmaRead => (SendRequest::read(buf(16), remote), 16),
                SendOp::CompareAndSwap => (SendRequest::compare_and_swap(buf(8), remote, 0, 1), 8),
                SendOp::FetchAndAdd => (SendRequest::fetch_and_add(buf(8), remote, 1), 8),
                SendOp::AtomicWrite => (SendRequest::atomic_write(remote, [1; 8]), 0),
                _ => unreachable!(),
            }
        };
        for op in OPS {
            for option in [
                RequestOption::Inline,
                RequestOption::Immediate,
                RequestOption::Solicited,
                RequestOption::Invalidate,
                RequestOption::UdDestination,
                RequestOption::Fence,
                // None: the operation alone (a UD queue pair needs its destination).
            ]
            .map(Some)
            .into_iter()
            .chain([None])
            {
                let with = |r: SendRequest<'static>| -> SendRequest<'static> {
                    // On UD every request carries its destination unless
                    // the cell is about the destination itself.
                    let r = match (&ah, option) {
                        (Some(ah), Some(o)) if o != RequestOption::UdDestination => {
                            r.ud(ah, p.b.qp_num(), 0x1111)
                        }
                        _ => r,
                    };
                    match option {
                        Some(RequestOption::Inline) => r.inline(true),
                        Some(RequestOption::Immediate) => r.imm(7),
                        Some(RequestOption::Solicited) => r.solicited(true),
                        Some(RequestOption::Fence) => r.fence(true),
                        Some(RequestOption::Invalidate) => r.invalidate(remote.rkey),
                        Some(RequestOption::UdDestination) => match &other_ah {
                            // UD without it: the "required" cell.
                            None => r,
                            Some(other) => r.ud(other, p.b.qp_num(), 0x1111),
                        },
                        _ => r,
                    }
                };
                let expect: Option<Error> = if !available(op, ty) {
                    Some(Error::OpNotAvailable { op, qp_type: ty })
                } else {
                    match option {
                        Some(RequestOption::UdDestination) if ty == QpType::Ud => {
                            Some(Error::OptionRequired {
                                option: RequestOption::UdDestination,
                                op,
                                qp_type: ty,
                            })
                        }
                        Some(o) if !allowed(op, ty, o) => Some(Error::OptionNotAllowed {
                            option: o,
                            op,
                            qp_type: ty,
                        }),
                        _ => None,
                    }
                };
                let Some(expect) = expect else { continue };
                cells += 1;
                let same = |e: &Error| e.to_string() == expect.to_string();
                let what = format!("{op} on {ty:?} with {option:?}");
                // The typed method (the destination as `with` gives it).
                let dest = match (option, &ah, &other_ah) {
                    (Some(RequestOption::UdDestination), None, Some(other)) => {
                        Some(UdDest::new(other, p.b.qp_num(), 0x1111))
                    }
                    (Some(o), Some(ah), _) if o != RequestOption::UdDestination => {
                        Some(UdDest::new(ah, p.b.qp_num(), 0x1111))
                    }
                    _ => None,
                };
                if let Some(posted) = post_typed(&mut sq, &p, op, option, dest.as_ref(), remote) {
                    typed_cells += 1;
                    let (e, back) = posted.unwrap_err();
                    assert!(same(&e), "{what}: {e} (expected {expect})");
                    assert_eq!(back, make(op).1, "{what}");
                }
                // post_chain
                let (r, _) = make(op);
                let mut list = vec![with(r)];
                let e = sq.post_chain(&mut list).unwrap_err();
                assert!(same(&e), "{what} (list): {e}");
                assert_eq!(list.len(), 1, "{what} (list)");
                // prepare
                let (r, len) = make(op);
                let e = sq.prepare(with(r)).unwrap_err();
                assert!(
                    same(&e.error) || matches!(e.error, Error::Unsupported(_)),
                    "{what} (prepared): {}",
                    e.error
                );
                assert_eq!(e.buf.total_len(), len, "{what}");
            }
        }
        assert_eq!(p.a.send_outstanding(), 0, "{ty:?}: nothing was posted");
        common::assert_quiet(&p.cq_a);
        common::assert_quiet(&p.cq_b);
    }
    assert!(cells >= 40, "only {cells} invalid cells were tried");
    assert!(
        typed_cells >= 40,
        "only {typed_cells} invalid cells were tried through the typed methods"
    );
}

/// Two active UD queue pairs, as a `Pair`.
fn ud_pair() -> Pair {
    let dev = common::device();
    let pd = dev.ctx.alloc_pd().unwrap();
    let cq_a = dev.ctx.create_cq(256).build().unwrap();
    let cq_b = dev.ctx.create_cq(256).build().unwrap();
    let qp = |cq: &rdma_verbs::CompletionQueue| {
        let qp: QueuePair = pd
            .create_qp(QpType::Ud, cq, cq)
            .max_inline_data(64)
            .build()
            .unwrap();
        qp.activate_ud(dev.port, 0x1111, 0x42).unwrap();
        qp
    };
    let (a, b) = (qp(&cq_a), qp(&cq_b));
    Pair {
        dev,
        pd,
        cq_a,
        cq_b,
        a,
        b,
    }
}

/// An address handle to `p.b` (for a UD destination on a connected pair).
fn ud_ah(p: &Pair) -> rdma_verbs::qp::AddressHandle {
    let ep = common::endpoint(&p.dev, &p.b, 0);
    let port = p.dev.ctx.query_port(p.dev.port).unwrap();
    let av = AddressVector::for_port(&port, &ep, p.dev.gid_index).unwrap();
    p.pd.create_ah(&av).unwrap()
}

/// Zero-length buffers never reach the provider as SGEs (some devices read
/// a byte count of 0 as 2 GiB), yet ride with their request and come back.
#[test]
#[ignore = "needs an RDMA device"]
fn soundness_empty_buffers_are_left_out_of_the_scatter_list() {
    let p = pair(QpType::Rc, remote_all(), |b| {
        b.max_send_sge(4).max_recv_sge(4)
    });
    let local = AccessFlags::LOCAL_WRITE;
    // A receive scattering over [empty, 16 bytes, empty]: the message lands
    // in the 16 bytes.
    let (empty_a, rest) = p.pd.alloc(16, local).unwrap().split_at(0);
    let (mid, empty_b) = rest.split_at(16);
    assert!(empty_a.is_empty() && empty_b.is_empty() && mid.len() == 16);
    let mut sq = p.a.send_queue().unwrap();
    let mut rq = p.b.recv_queue().unwrap();
    rq.recv_sgl(vec![empty_a.into(), mid.into(), empty_b.into()], 1)
        .unwrap();
    let mut msg = p.pd.alloc(16, local).unwrap();
    msg.copy_from_slice(&[0x5A; 16]);
    sq.send(msg, Wr::id(2)).unwrap();
    common::wait_ok(&p.cq_a);
    let mut r = common::wait_ok(&p.cq_b);
    assert_eq!(r.byte_len(), 16);
    let rdma_verbs::memory::SgList::Many(bufs) = r.take_buffers() else {
        panic!("the scatter list comes back whole");
    };
    let lens: Vec<usize> = bufs.iter().map(|b| b.len()).collect();
    assert_eq!(lens, [0, 16, 0], "every buffer comes back, in order");

    // A single empty receive buffer takes a zero-length message.
    let (empty, _) = p.pd.alloc(8, local).unwrap().split_at(0);
    rq.recv(empty, 3).unwrap();
    sq.send_inline(&[], Wr::id(4)).unwrap();
    common::wait_ok(&p.cq_a);
    let mut r = common::wait_ok(&p.cq_b);
    assert_eq!((r.wr_id(), r.byte_len()), (3, 0));
    assert_eq!(r.take_local().map(|b| b.len()), Some(0));
}

/// `modify` checks transitions from the state this crate set, without
/// asking the device; a queue pair the device moved to ERR on its own (a
/// remote access error) is still judged from its real state: a transition
/// the real state forbids is refused as from ERR, a `cur_qp_state` of the
/// old state is refused, and what ERR allows goes through.
#[test]
#[ignore = "needs an RDMA device"]
fn soundness_a_state_the_device_changed_is_checked_from_the_real_state() {
    let p = pair(QpType::Rc, remote_all(), |b| b);
    let target = p.pd.alloc_shared(64, remote_all()).unwrap();
    let mut remote = target.remote().unwrap();
    remote.rkey = rdma_verbs::memory::RemoteKey(remote.rkey.0 ^ 0x5a5a_0000);
    let src = p.pd.alloc(8, AccessFlags::LOCAL_WRITE).unwrap();
    // Through a handle taken for the one post (none lives at the reset
    // below).
    common::post_send(&p.a, SendRequest::write(src, remote)).unwrap();
    let c = common::wait(&p.cq_a, 1).pop().unwrap();
    assert_eq!(c.status(), rdma_verbs::WcStatus::RemAccessErr, "{c:?}");
    // RTS -> SQD and RTS -> RTS are legal from the state this crate set,
    // not from ERR.
    let sqd = QpAttr::new().qp_state(QpState::Sqd);
    let rts = QpAttr::new().qp_state(QpState::Rts).min_rnr_timer(12);
    for (attr, to) in [(&sqd, QpState::Sqd), (&rts, QpState::Rts)] {
        let e = p.a.modify(attr).unwrap_err();
        assert!(
            matches!(e, Error::InvalidTransition { from: QpState::Err, to: t, .. } if t == to),
            "{e}"
        );
    }
    let lie = QpAttr::new()
        .qp_state(QpState::Rts)
        .cur_qp_state(QpState::Rts)
        .min_rnr_timer(12);
    for e in [
        p.a.modify(&lie).unwrap_err(),
        p.a.modify_unchecked(&lie).unwrap_err(),
    ] {
        assert!(
            matches!(
                &e,
                Error::InvalidTransition {
                    from: QpState::Err,
                    reason: TransitionReason::ClaimedState(QpState::Rts),
                    ..
                }
            ),
            "{e}"
        );
    }
    assert_eq!(p.a.state().unwrap(), QpState::Err);
    // What ERR allows: to ERR again, to RESET, and connecting anew.
    p.a.to_err().unwrap();
    p.a.reset().unwrap();
    assert_eq!(p.a.state().unwrap(), QpState::Reset);
    p.a.to_init(p.dev.port, 0, AccessFlags::LOCAL_WRITE)
        .unwrap();
    assert_eq!(p.a.state().unwrap(), QpState::Init);
}

/// `cur_qp_state` is checked against the state the device reports: an
/// INIT queue pair cannot claim RTR to skip RTR's attributes.
#[test]
#[ignore = "needs an RDMA device"]
fn soundness_cur_qp_state_must_be_the_real_state() {
    let dev = common::device();
    let pd = dev.ctx.alloc_pd().unwrap();
    let cq = dev.ctx.create_cq(256).build().unwrap();
    let qp = pd.create_qp(QpType::Rc, &cq, &cq).build().unwrap();
    qp.modify(
        &QpAttr::new()
            .qp_state(QpState::Init)
            .pkey_index(0)
            .port_num(dev.port)
            .qp_access_flags(AccessFlags::empty()),
    )
    .unwrap();
    let lie = QpAttr::new()
        .qp_state(QpState::Rts)
        .cur_qp_state(QpState::Rtr)
        .sq_psn(0)
        .timeout(14)
        .retry_cnt(7)
        .rnr_retry(7)
        .max_rd_atomic(1);
    for e in [
        qp.modify(&lie).unwrap_err(),
        qp.modify_unchecked(&lie).unwrap_err(),
    ] {
        assert!(
            matches!(
                e,
                Error::InvalidTransition {
                    from: QpState::Init,
                    ..
                }
            ),
            "{e}"
        );
    }
    assert_eq!(qp.state().unwrap(), QpState::Init);
    // The truth is accepted (RTS -> RTS names the current state).
    let p = pair(QpType::Rc, remote_all(), |b| b);
    p.a.modify(
        &QpAttr::new()
            .qp_state(QpState::Rts)
            .cur_qp_state(QpState::Rts),
    )
    .unwrap();
}
