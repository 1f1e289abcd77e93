//! Unreliable datagram queue pairs and address handles (device tests).
//!
//! Two UD QPs of the test device talk through address handles pointing at
//! the device's own GID (rxe loopback). A UD receive buffer starts with the
//! 40-byte GRH, so every receive is `GRH + payload` bytes.

mod common;

use rdma_verbs::{
    device::LinkLayer,
    memory::RemoteKey,
    qp::{AddressHandle, AddressVector, RequestOption, UdDest},
    AccessFlags, CompletionQueue, Error, Gid, LocalBuffer, ProtectionDomain, QpType, QueuePair,
    RemoteMemory, SendRequest, WcOpcode, Wr,
};

/// Bytes of the global route header in front of every UD receive.
const GRH: usize = 40;
const QKEY: u32 = 0x1111_1111;
const WRONG_QKEY: u32 = 0x2222_2222;

/// Two activated UD queue pairs, each with its own CQ, and an address
/// handle to each.
struct Ud {
    dev: common::TestDevice,
    pd: ProtectionDomain,
    cq_a: CompletionQueue,
    cq_b: CompletionQueue,
    a: QueuePair,
    b: QueuePair,
    /// Where `a` sends to reach `b` (and the other way round).
    ah_to_b: AddressHandle,
    ah_to_a: AddressHandle,
    /// The GID both send from.
    gid: Gid,
}

fn ud_pair(max_inline: u32) -> Ud {
    let dev = common::device();
    let pd = dev.ctx.alloc_pd().unwrap();
    let cq_a = dev.ctx.create_cq(256).build().unwrap();
    let cq_b = dev.ctx.create_cq(256).build().unwrap();
    let build = |cq: &CompletionQueue| {
        let qp = pd
            .create_qp(QpType::Ud, cq, cq)
            .max_inline_data(max_inline)
            .build()
            .unwrap_or_else(|e| panic!("creating a UD QP (inline {max_inline}): {e}"));
        qp.activate_ud(dev.port, QKEY, 0x42)
            .unwrap_or_else(|e| panic!("activating a UD QP: {e}"));
        qp
    };
    let a = build(&cq_a);
    let b = build(&cq_b);
    let port_attr = dev.ctx.query_port(dev.port).unwrap();
    let ah_for = |qp: &QueuePair| {
        let ep = common::endpoint(&dev, qp, 0);
        let av = AddressVector::for_port(&port_attr, &ep, dev.gid_index).unwrap();
        pd.create_ah(&av)
            .unwrap_or_else(|e| panic!("creating an address handle for {av:?}: {e}"))
    };
    let ah_to_b = ah_for(&b);
    let ah_to_a = ah_for(&a);
    let gid = dev.ctx.query_gid(dev.port, dev.gid_index).unwrap();
    Ud {
        dev,
        pd,
        cq_a,
        cq_b,
        a,
        b,
        ah_to_b,
        ah_to_a,
        gid,
    }
}

fn filled(pd: &ProtectionDomain, bytes: &[u8]) -> LocalBuffer {
    let mut b = pd.alloc(bytes.len(), AccessFlags::LOCAL_WRITE).unwrap();
    b.copy_from_slice(bytes);
    b
}

fn recv_buf(pd: &ProtectionDomain, len: usize) -> LocalBuffer {
    let mut b = pd.alloc(len, AccessFlags::LOCAL_WRITE).unwrap();
    b.fill(0xEE);
    b
}

/// The sender's address as the GRH area of a UD receive carries it,
/// decoded as rdma-core's `ibv_init_ah_from_wc` does: an IPv6/IB GRH has
/// the source GID at bytes 8..24; RoCE v2 over IPv4 leaves bytes 0..20
/// zero and puts the 20-byte IPv4 header at bytes 20..40 (source address
/// at 32..36), which maps to the GID `::ffff:a.b.c.d`.
fn grh_source(grh: &[u8]) -> Gid {
    let ip6_version = grh[0] >> 4;
    let ip4 = &grh[20..40];
    if ip6_version != 6 && ip4[0] >> 4 == 4 {
        let src = std::net::Ipv4Addr::new(ip4[12], ip4[13], ip4[14], ip4[15]);
        Gid::from(src.to_ipv6_mapped())
    } else {
        Gid(grh[8..24].try_into().unwrap())
    }
}

/// Checks a UD receive of `payload` sent by `from` (whose GID is `gid`)
/// and returns its buffer.
fn check_ud_recv(
    c: &mut rdma_verbs::Completion,
    from: &QueuePair,
    gid: Gid,
    payload: &[u8],
) -> LocalBuffer {
    assert_eq!(c.opcode(), WcOpcode::Recv, "UD receive opcode: {c:?}");
    assert_eq!(
        c.byte_len() as usize,
        GRH + payload.len(),
        "UD byte_len counts the 40-byte GRH plus the payload: {c:?}"
    );
    assert_eq!(
        c.src_qp(),
        from.qp_num().0,
        "src_qp names the sending QP: {c:?}"
    );
    assert!(
        c.has_grh(),
        "a RoCE/GRH UD receive reports IBV_WC_GRH: {c:?}"
    );
    let buf = c.take_local().expect("receive buffer handed back");
    assert_eq!(
        &buf[GRH..GRH + payload.len()],
        payload,
        "UD payload bytes after the GRH"
    );
    assert!(
        buf[GRH + payload.len()..].iter().all(|&x| x == 0xEE),
        "bytes past the payload untouched"
    );
    assert_eq!(
        grh_source(&buf[..GRH]),
        gid,
        "the GRH area names the sender's GID: {:02x?}",
        &buf[..GRH]
    );
    buf
}

#[test]
#[ignore = "needs an RDMA device"]
fn ud_send_recv_with_grh_both_ways() {
    let t = ud_pair(0);
    let payload = common::pattern(256, 7);
    for (from, to, ah, cq_from, cq_to, wr) in [
        (&t.a, &t.b, &t.ah_to_b, &t.cq_a, &t.cq_b, 1u64),
        (&t.b, &t.a, &t.ah_to_a, &t.cq_b, &t.cq_a, 2u64),
    ] {
        to.recv_queue()
            .unwrap()
            .recv(recv_buf(&t.pd, GRH + payload.len()), 100 + wr)
            .unwrap();
        from.send_queue()
            .unwrap()
            .send_to(
                filled(&t.pd, &payload),
                &UdDest::new(ah, to.qp_num(), QKEY),
                Wr::id(wr),
            )
            .unwrap();
        let mut s = common::wait_ok(cq_from);
        assert_eq!(s.wr_id(), wr, "send completion wr_id");
        assert_eq!(s.opcode(), WcOpcode::Send, "send completion opcode: {s:?}");
        let sent = s.take_local().expect("send buffer handed back");
        assert_eq!(&sent[..], &payload[..], "send buffer unchanged");

        let mut r = common::wait_ok(cq_to);
        assert_eq!(r.wr_id(), 100 + wr, "receive completion wr_id");
        assert_eq!(
            r.qp_num(),
            to.qp_num().0,
            "receive completes on the receiver"
        );
        assert_eq!(r.imm_data(), None, "no immediate on a plain send");
        check_ud_recv(&mut r, from, t.gid, &payload);
    }
    common::assert_quiet(&t.cq_a);
    common::assert_quiet(&t.cq_b);
    assert_eq!((t.a.send_outstanding(), t.b.recv_outstanding()), (0, 0));
}

#[test]
#[ignore = "needs an RDMA device"]
fn address_handle_reports_its_vector() {
    let t = ud_pair(0);
    let av = t.ah_to_b.address_vector();
    assert_eq!(av.port(), t.dev.port, "AH port");
    let port_attr = t.dev.ctx.query_port(t.dev.port).unwrap();
    if port_attr.grh_required() {
        assert!(av.is_global(), "RoCE address handles carry a GRH: {av:?}");
        assert_eq!(av.dgid(), t.gid, "AH destination GID: {av:?}");
        assert_eq!(av.sgid_index(), t.dev.gid_index, "AH source GID index");
    }
    assert_eq!(
        t.ah_to_b.pd().as_ptr(),
        t.pd.as_ptr(),
        "AH belongs to its PD"
    );
    // The explicit RoCE constructor gives an equivalent, working handle.
    if port_attr.link_layer() == LinkLayer::Ethernet {
        let av = AddressVector::roce(t.dev.port, t.gid, t.dev.gid_index);
        let ah = t.pd.create_ah(&av).unwrap();
        let payload = common::pattern(64, 99);
        t.b.recv_queue()
            .unwrap()
            .recv(recv_buf(&t.pd, GRH + 64), 0)
            .unwrap();
        t.a.send_queue()
            .unwrap()
            .send_to(
                filled(&t.pd, &payload),
                &UdDest::new(&ah, t.b.qp_num(), QKEY),
                Wr::id(0),
            )
            .unwrap();
        common::wait_ok(&t.cq_a);
        let mut r = common::wait_ok(&t.cq_b);
        check_ud_recv(&mut r, &t.a, t.gid, &payload);
    } else {
        eprintln!(
            "not RoCE ({:?}): AddressVector::roce not exercised",
            port_attr.link_layer()
        );
    }
}

#[test]
#[ignore = "needs an RDMA device"]
fn ud_send_with_immediate() {
    let t = ud_pair(0);
    let payload = common::pattern(100, 3);
    t.b.recv_queue()
        .unwrap()
        .recv(recv_buf(&t.pd, GRH + 100), 5)
        .unwrap();
    t.a.send_queue()
        .unwrap()
        .send_to(
            filled(&t.pd, &payload),
            &UdDest::new(&t.ah_to_b, t.b.qp_num(), QKEY),
            Wr::id(0).imm(0xDEAD_BEEF),
        )
        .unwrap();
    common::wait_ok(&t.cq_a);
    let mut r = common::wait_ok(&t.cq_b);
    assert_eq!(
        r.imm_data(),
        Some(0xDEAD_BEEF),
        "immediate data in host order: {r:?}"
    );
    check_ud_recv(&mut r, &t.a, t.gid, &payload);
}

#[test]
#[ignore = "needs an RDMA device"]
fn ud_inline_sends() {
    let t = ud_pair(128);
    assert!(
        t.a.caps().max_inline_data >= 128,
        "asked for 128 inline bytes, got {:?}",
        t.a.caps()
    );
    let mut sq = t.a.send_queue().unwrap();
    let mut rq = t.b.recv_queue().unwrap();
    let to_b = UdDest::new(&t.ah_to_b, t.b.qp_num(), QKEY);
    // Inline data from a plain slice: no registration, free right after posting.
    let payload = common::pattern(120, 11);
    rq.recv(recv_buf(&t.pd, GRH + 120), 0).unwrap();
    {
        let scratch = payload.clone();
        sq.send_inline_to(&scratch, &to_b, Wr::id(9)).unwrap();
        drop(scratch); // copied at post time
    }
    let mut s = common::wait_ok(&t.cq_a);
    assert_eq!(s.wr_id(), 9);
    assert!(s.take_buf().is_none(), "an inline send owns no buffer");
    let mut r = common::wait_ok(&t.cq_b);
    check_ud_recv(&mut r, &t.a, t.gid, &payload);

    // A registered buffer sent with the inline flag.
    let payload = common::pattern(64, 12);
    rq.recv(recv_buf(&t.pd, GRH + 64), 0).unwrap();
    sq.send_to(filled(&t.pd, &payload), &to_b, Wr::id(0).inline())
        .unwrap();
    let mut s = common::wait_ok(&t.cq_a);
    assert_eq!(&s.take_local().expect("buffer back")[..], &payload[..]);
    let mut r = common::wait_ok(&t.cq_b);
    check_ud_recv(&mut r, &t.a, t.gid, &payload);

    // More than the QP's inline capacity is refused before posting.
    let cap = t.a.caps().max_inline_data as usize;
    let big = vec![0u8; cap + 1];
    let err = sq.send_inline_to(&big, &to_b, Wr::id(0)).unwrap_err();
    assert!(
        matches!(err, Error::InlineTooLarge { len, max } if len == cap as u64 + 1 && max as usize == cap),
        "oversized inline UD send: {err}"
    );
    common::assert_quiet(&t.cq_a);
    common::assert_quiet(&t.cq_b);
}

#[test]
#[ignore = "needs an RDMA device"]
fn wrong_qkey_is_not_delivered() {
    let t = ud_pair(0);
    let payload = common::pattern(32, 1);
    let mut sq = t.a.send_queue().unwrap();
    t.b.recv_queue()
        .unwrap()
        .recv(recv_buf(&t.pd, GRH + 32), 77)
        .unwrap();
    sq.send_to(
        filled(&t.pd, &common::pattern(32, 200)),
        &UdDest::new(&t.ah_to_b, t.b.qp_num(), WRONG_QKEY),
        Wr::id(1),
    )
    .unwrap();
    // UD has no acknowledgements: the send completes locally either way.
    let s = common::wait_ok(&t.cq_a);
    assert_eq!(s.wr_id(), 1);
    common::assert_quiet(&t.cq_b);
    assert_eq!(
        t.b.recv_outstanding(),
        1,
        "a datagram with the wrong Q_Key must not consume the receive"
    );
    // The right Q_Key lands in that same receive.
    sq.send_to(
        filled(&t.pd, &payload),
        &UdDest::new(&t.ah_to_b, t.b.qp_num(), QKEY),
        Wr::id(2),
    )
    .unwrap();
    common::wait_ok(&t.cq_a);
    let mut r = common::wait_ok(&t.cq_b);
    assert_eq!(r.wr_id(), 77, "the pending receive takes the good datagram");
    check_ud_recv(&mut r, &t.a, t.gid, &payload);
    common::assert_quiet(&t.cq_b);
}

#[test]
#[ignore = "needs an RDMA device"]
fn address_handle_outlives_its_handle_while_posted() {
    let t = ud_pair(0);
    let payload = common::pattern(48, 5);
    let port_attr = t.dev.ctx.query_port(t.dev.port).unwrap();
    let ep = common::endpoint(&t.dev, &t.b, 0);
    let ah =
        t.pd.create_ah(&AddressVector::for_port(&port_attr, &ep, t.dev.gid_index).unwrap())
            .unwrap();
    t.b.recv_queue()
        .unwrap()
        .recv(recv_buf(&t.pd, GRH + 48), 0)
        .unwrap();
    t.a.send_queue()
        .unwrap()
        .send_to(
            filled(&t.pd, &payload),
            &UdDest::new(&ah, t.b.qp_num(), QKEY),
            Wr::id(0),
        )
        .unwrap();
    drop(ah); // the posted request keeps the address handle alive
    common::wait_ok(&t.cq_a);
    let mut r = common::wait_ok(&t.cq_b);
    check_ud_recv(&mut r, &t.a, t.gid, &payload);
}

fn fake_remote() -> RemoteMemory {
    RemoteMemory {
        addr: 0x1000,
        len: 4096,
        rkey: RemoteKey(0x1234),
    }
}

#[test]
#[ignore = "needs an RDMA device"]
fn ud_rdma_and_atomics_are_rejected_before_posting() {
    let t = ud_pair(0);
    let remote = fake_remote();
    let make = |what: &str| -> SendRequest<'static> {
        match what {
            "RDMA write" => SendRequest::write(filled(&t.pd, &[1; 16]), remote),
            "RDMA write with immediate" => {
                SendRequest::write(filled(&t.pd, &[1; 16]), remote).imm(1)
            }
            "RDMA read" => SendRequest::read(recv_buf(&t.pd, 16), remote),
            "compare-and-swap" => SendRequest::compare_and_swap(recv_buf(&t.pd, 8), remote, 0, 1),
            "fetch-and-add" => SendRequest::fetch_and_add(recv_buf(&t.pd, 8), remote, 1),
            _ => unreachable!(),
        }
    };
    for what in [
        "RDMA write",
        "RDMA write with immediate",
        "RDMA read",
        "compare-and-swap",
        "fetch-and-add",
    ] {
        for with_dest in [true, false] {
            let req = make(what);
            let len = req_len(what);
            let req = if with_dest {
                req.ud(&t.ah_to_b, t.b.qp_num(), QKEY)
            } else {
                req
            };
            // A request with a UD destination exists only as a chain's
            // `SendRequest` (the typed RDMA methods take none).
            let err = common::post_send(&t.a, req).unwrap_err();
            assert!(
                matches!(
                    err.error,
                    Error::OpNotAvailable {
                        qp_type: QpType::Ud,
                        ..
                    }
                ),
                "UD {what} (destination given: {with_dest}) must be OpNotAvailable, got {}",
                err.error
            );
            assert_eq!(
                err.buf.total_len(),
                len,
                "UD {what}: the refused request hands its buffer back"
            );
        }
    }
    assert_eq!(t.a.send_outstanding(), 0, "nothing was posted");
    common::assert_quiet(&t.cq_a);
    common::assert_quiet(&t.cq_b);
}

fn req_len(what: &str) -> u64 {
    if what.contains("swap") || what.contains("add") {
        8
    } else {
        16
    }
}

#[test]
#[ignore = "needs an RDMA device"]
fn ud_send_without_destination_is_rejected() {
    let t = ud_pair(16);
    let mut sq = t.a.send_queue().unwrap();
    let payload = common::pattern(16, 4);
    let err = sq.send(filled(&t.pd, &payload), Wr::id(3)).unwrap_err();
    assert!(
        matches!(
            err.error,
            Error::OptionRequired {
                option: RequestOption::UdDestination,
                ..
            }
        ) && err.error.to_string().contains("SendRequest::ud"),
        "a UD send without SendRequest::ud must be OptionRequired naming ud(..), got {}",
        err.error
    );
    let buf = err.buf.into_local().expect("the refused buffer").len();
    assert_eq!(buf, 16, "the refused request hands its buffer back");
    let err = sq.send_inline(&payload, Wr::id(0)).unwrap_err();
    assert!(
        matches!(err, Error::OptionRequired { .. }),
        "an inline UD send without destination: {err}"
    );
    // A multi-buffer send (gather list) without destination as well.
    let err = sq
        .send_sgl(vec![filled(&t.pd, &payload).into()], Wr::id(0))
        .unwrap_err();
    assert!(
        matches!(err.error, Error::OptionRequired { .. }),
        "{}",
        err.error
    );
    assert_eq!(err.buf.len(), 1, "the refused gather list comes back");
    // A request built without `ud(..)` and posted in a chain as well.
    drop(sq);
    let err = common::post_send(&t.a, SendRequest::send(filled(&t.pd, &payload))).unwrap_err();
    assert!(
        matches!(
            err.error,
            Error::OptionRequired {
                option: RequestOption::UdDestination,
                ..
            }
        ),
        "a chained UD send without destination: {}",
        err.error
    );
    assert_eq!(err.buf.total_len(), 16, "its buffer comes back");
    assert_eq!(t.a.send_outstanding(), 0);
    common::assert_quiet(&t.cq_a);
}

#[test]
#[ignore = "needs an RDMA device"]
fn address_handle_from_another_pd_is_rejected() {
    let t = ud_pair(0);
    let other = t.dev.ctx.alloc_pd().unwrap();
    let port_attr = t.dev.ctx.query_port(t.dev.port).unwrap();
    let ep = common::endpoint(&t.dev, &t.b, 0);
    let av = AddressVector::for_port(&port_attr, &ep, t.dev.gid_index).unwrap();
    let foreign = other.create_ah(&av).unwrap();
    let err =
        t.a.send_queue()
            .unwrap()
            .send_to(
                filled(&t.pd, &[0; 8]),
                &UdDest::new(&foreign, t.b.qp_num(), QKEY),
                Wr::id(0),
            )
            .unwrap_err();
    assert!(
        matches!(
            err.error,
            Error::ForeignProtectionDomain {
                what: "address handle"
            }
        ),
        "an AH of another PD: {}",
        err.error
    );
    assert_eq!(t.a.send_outstanding(), 0);
}

#[test]
#[ignore = "needs an RDMA device"]
fn completion_source_gid_is_the_senders() {
    let t = ud_pair(0);
    let payload = common::pattern(24, 8);
    t.b.recv_queue()
        .unwrap()
        .recv(recv_buf(&t.pd, GRH + 24), 0)
        .unwrap();
    t.a.send_queue()
        .unwrap()
        .send_to(
            filled(&t.pd, &payload),
            &UdDest::new(&t.ah_to_b, t.b.qp_num(), QKEY),
            Wr::id(0),
        )
        .unwrap();
    common::wait_ok(&t.cq_a);
    let mut r = common::wait_ok(&t.cq_b);
    // Read it while the completion still holds the buffer.
    let got = r.source_gid();
    let buf = check_ud_recv(&mut r, &t.a, t.gid, &payload);
    assert_eq!(
        got,
        Some(t.gid),
        "Completion::source_gid() must be the sender's GID {} (GRH area: {:02x?})",
        t.gid.to_ipv6(),
        &buf[..GRH]
    );
    // Once the buffer was taken there is nothing to read it from.
    assert_eq!(r.source_gid(), None, "no buffer, no source GID");
}
