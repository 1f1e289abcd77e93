//! The rest of the verbs surface (issue #22 item 8), device tests:
//! on-demand paging and `ibv_advise_mr`, `ibv_rereg_mr`, memory windows
//! over a region registered at an IOVA, and XRC. Where rxe lacks a
//! capability, the test checks that the device says so and that the
//! library refuses by name, before the verb.

mod common;

use common::{pair, pattern, remote_all, wait, wait_ok};
use rdma_verbs::{
    device::Feature,
    memory::{Advice, MwType, OdpGeneralCaps, RegisterOptions},
    AccessFlags, Error, QpType, WcOpcode, WcStatus, Wr,
};

/// The refusal every ODP path gives on a device without ODP.
fn assert_lacks(res: Result<impl std::fmt::Debug, Error>, verb: &str) {
    match res {
        Err(Error::DeviceLacks {
            verb: v,
            capability,
        }) => {
            assert_eq!(v, verb);
            assert!(
                capability.contains("IBV_ODP_SUPPORT"),
                "names the capability: {capability}"
            );
        }
        other => panic!("expected DeviceLacks naming {verb}, got {other:?}"),
    }
}

/// The device's ODP capability as `ibv_query_device_ex` reports it, and
/// each ODP path against it: explicit registration (`ibv_reg_mr`,
/// `ibv_reg_mr_iova2`), implicit registration and `ibv_advise_mr` are
/// refused by name on a device without ODP (rxe on Linux 6.1/6.12); on a
/// device with it, an explicit ODP region is prefetched and carries RC
/// write traffic.
#[test]
#[ignore = "needs an RDMA device"]
fn odp_capability_and_refusals() {
    let p = pair(QpType::Rc, remote_all(), |b| b);
    let attr = p.dev.ctx.query_device_ex().unwrap();
    let caps = attr.odp_caps();
    eprintln!("odp_caps: {caps:?}");
    assert_eq!(
        caps.general.contains(OdpGeneralCaps::SUPPORT),
        attr.supports(Feature::OnDemandPaging)
    );
    let odp = AccessFlags::LOCAL_WRITE | AccessFlags::ON_DEMAND;
    if !caps.general.contains(OdpGeneralCaps::SUPPORT) {
        assert!(caps.rc.is_empty() && caps.uc.is_empty() && caps.ud.is_empty());
        assert_lacks(p.pd.register(vec![0u8; 4096], odp), "ibv_reg_mr");
        assert_lacks(
            p.pd.alloc(4096, RegisterOptions::new(odp).iova(0x4000_0000)),
            "ibv_reg_mr_iova2",
        );
        assert_lacks(
            p.pd.alloc_shared(4096, remote_all() | AccessFlags::ON_DEMAND),
            "ibv_reg_mr",
        );
        // SAFETY: refused before the verb (asserted): no key exists.
        assert_lacks(
            unsafe { p.pd.register_implicit_odp(AccessFlags::LOCAL_WRITE) },
            "ibv_reg_mr",
        );
        let plain = p.pd.alloc(4096, AccessFlags::LOCAL_WRITE).unwrap();
        assert_lacks(
            plain
                .memory_region()
                .advise(Advice::Prefetch, true, &[(0, 4096)]),
            "ibv_advise_mr",
        );
        return;
    }
    assert!(
        !common::is_rxe(&p.dev)
            || caps
                .rc
                .contains(rdma_verbs::memory::OdpTransportCaps::WRITE),
        "an rxe with ODP writes over RC"
    );
    let target =
        p.pd.alloc_shared(8192, remote_all() | AccessFlags::ON_DEMAND)
            .unwrap();
    let mr = target.memory_region();
    assert!(mr.access().contains(AccessFlags::ON_DEMAND));
    mr.advise(Advice::PrefetchWrite, true, &[(0, 8192)])
        .unwrap();
    assert!(matches!(
        mr.advise(Advice::Prefetch, false, &[(8000, 193)]),
        Err(Error::OutOfRange { .. })
    ));
    let data = pattern(3000, 5);
    let mut src = p.pd.alloc(3000, odp).unwrap();
    src.copy_from_slice(&data);
    src.memory_region()
        .advise(Advice::Prefetch, true, &[(0, 3000)])
        .unwrap();
    p.a.send_queue()
        .unwrap()
        .write(
            src,
            target.remote().unwrap().slice(100, 3000).unwrap(),
            Wr::id(0),
        )
        .unwrap();
    wait_ok(&p.cq_a);
    let mut got = vec![0u8; 3000];
    target.copy_to_slice(100, &mut got).unwrap();
    assert_eq!(got, data);
}

/// `ibv_rereg_mr` on rxe: the library's own refusals come first (another
/// holder of the registration, remote write rights on a `LocalBuffer`),
/// then the provider's (`EOPNOTSUPP`, a typed refusal naming the verb);
/// after each, the region is unchanged and still carries traffic. On a
/// device that re-registers, the new rights take effect.
#[test]
#[ignore = "needs an RDMA device"]
fn rereg_access_refused_by_name_and_region_still_usable() {
    let p = pair(QpType::Rc, remote_all(), |b| b);
    let mut buf = p.pd.alloc(4096, AccessFlags::LOCAL_WRITE).unwrap();
    let before = buf.memory_region();
    let (lkey, access) = (before.lkey(), before.access());

    // A MemoryRegion handle still holds the registration.
    assert!(matches!(
        buf.rereg_access(AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ),
        Err(Error::RegionInUse {
            verb: "ibv_rereg_mr"
        })
    ));
    drop(before);
    // A split piece holds it too.
    let (head, tail) = buf.split_at(1024);
    let mut head = head;
    assert!(matches!(
        head.rereg_access(AccessFlags::LOCAL_WRITE),
        Err(Error::RegionInUse { .. })
    ));
    let mut buf = head.unsplit(tail).unwrap();
    // Peer-write rights never come to a LocalBuffer.
    assert!(matches!(
        buf.rereg_access(AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE),
        Err(Error::NeedsSharedBuffer { .. })
    ));

    let want = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ;
    match buf.rereg_access(want) {
        Err(Error::DeviceLacks { verb, capability }) => {
            assert_eq!(verb, "ibv_rereg_mr");
            eprintln!("refused: {capability}");
            let mr = buf.memory_region();
            assert_eq!((mr.lkey(), mr.access()), (lkey, access), "unchanged");
        }
        Ok(()) => {
            assert!(
                !common::is_rxe(&p.dev),
                "rxe (rdma-core 44) has no rereg_mr"
            );
            assert_eq!(buf.memory_region().access(), want);
        }
        Err(e) => panic!("unexpected: {e}"),
    }

    // The region still works: a send out of it and an RDMA read into it.
    let data = pattern(4096, 9);
    buf.copy_from_slice(&data);
    let rbuf = p.pd.alloc(4096, AccessFlags::LOCAL_WRITE).unwrap();
    let mut sq = p.a.send_queue().unwrap();
    p.b.recv_queue().unwrap().recv(rbuf, 1).unwrap();
    sq.send(buf, Wr::id(2)).unwrap();
    let mut sent = wait_ok(&p.cq_a);
    let mut recvd = wait_ok(&p.cq_b);
    assert_eq!(&recvd.take_local().unwrap()[..], &data[..]);
    let buf = sent.take_local().unwrap();

    let mut peer = p.pd.alloc_shared(4096, remote_all()).unwrap();
    let other = pattern(4096, 33);
    peer.copy_from_slice(0, &other).unwrap();
    sq.read(buf, peer.remote().unwrap(), Wr::id(3)).unwrap();
    let mut c = wait_ok(&p.cq_a);
    assert_eq!(&c.take_local().unwrap()[..], &other[..]);
    // A SharedBuffer's path reaches the provider too.
    let res = peer.rereg_access(AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ);
    if common::is_rxe(&p.dev) {
        assert!(matches!(
            res,
            Err(Error::DeviceLacks {
                verb: "ibv_rereg_mr",
                ..
            })
        ));
    }
}

/// A window of each type bound over a region registered at an IOVA
/// (`ibv_reg_mr_iova2`) grants the IOVA range, not the process address;
/// the peer's write and read through it reach the right bytes, and
/// unbinding (a type 1 zero-length bind, a type 2 local invalidate)
/// revokes it.
#[test]
#[ignore = "needs an RDMA device"]
fn mw_over_iova_region_reads_and_writes() {
    mw_over_iova(MwType::Type1, Feature::MemoryWindowType1);
    mw_over_iova(MwType::Type2, Feature::MemoryWindowType2);
}

fn mw_over_iova(kind: MwType, feature: Feature) {
    const IOVA: u64 = 0x5_0000_0000;
    let p = pair(QpType::Rc, remote_all(), |b| b);
    if !p.dev.ctx.query_device_ex().unwrap().supports(feature) {
        assert!(!common::is_rxe(&p.dev), "rxe binds {feature}");
        eprintln!("UNSUPPORTED on this device: {feature}");
        return;
    }
    let region = RegisterOptions::new(AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND).iova(IOVA);
    let mut target = p.pd.alloc_shared(8192, region).unwrap();
    assert_eq!(target.addr(), IOVA);
    let mw = p.pd.alloc_mw(kind).unwrap();
    let rights = AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE;
    let mut sq_a = p.a.send_queue().unwrap();
    let mut sq_b = p.b.send_queue().unwrap();
    let remote = sq_a.bind_mw(&mw, &target, rights, 1).unwrap();
    let c = wait_ok(&p.cq_a);
    assert_eq!(c.opcode(), WcOpcode::BindMw);
    assert_eq!(
        (remote.addr, remote.len),
        (IOVA, 8192),
        "{kind:?} grants the IOVA range"
    );

    // The peer writes at IOVA + 1000 ...
    let data = pattern(2000, kind as u8);
    let mut src = p.pd.alloc(2000, AccessFlags::LOCAL_WRITE).unwrap();
    src.copy_from_slice(&data);
    sq_b.write(src, remote.slice(1000, 2000).unwrap(), Wr::id(0))
        .unwrap();
    wait_ok(&p.cq_b);
    let mut got = vec![0u8; 8192];
    target.copy_to_slice(0, &mut got).unwrap();
    assert_eq!(
        &got[1000..3000],
        &data[..],
        "{kind:?}: written at iova + 1000"
    );
    assert!(got[..1000].iter().chain(&got[3000..]).all(|&b| b == 0));

    // ... and reads from IOVA + 5000.
    let second = pattern(1500, 77);
    target.copy_from_slice(5000, &second).unwrap();
    let dst = p.pd.alloc(1500, AccessFlags::LOCAL_WRITE).unwrap();
    sq_b.read(dst, remote.slice(5000, 1500).unwrap(), Wr::id(0))
        .unwrap();
    let mut c = wait_ok(&p.cq_b);
    assert_eq!(&c.take_local().unwrap()[..], &second[..], "{kind:?}: read");

    // Unbinding (a zero-length bind at the region's IOVA for type 1)
    // revokes the key.
    sq_a.invalidate_mw(&mw, 2).unwrap();
    wait_ok(&p.cq_a);
    assert_eq!(mw.remote(), None);
    let src = p.pd.alloc(8, AccessFlags::LOCAL_WRITE).unwrap();
    sq_b.write(src, remote.slice(0, 8).unwrap(), Wr::id(0))
        .unwrap();
    let c = wait(&p.cq_b, 1).pop().unwrap();
    assert_eq!(c.status(), WcStatus::RemAccessErr, "{kind:?}: revoked");
}

/// XRC on a device without it (rxe): `IBV_DEVICE_XRC` reads false, and
/// opening a domain (private or through a file) and creating an XRC send
/// queue pair are refused by name before the verb. On a device with XRC:
/// a domain, an XRC SRQ with its number, a receive queue pair, and the
/// same queue pair opened by number.
#[test]
#[ignore = "needs an RDMA device"]
fn xrc_domain_capability_and_refusals() {
    use rdma_verbs::qp::{XrcdOpenFlags, XrcdOptions};
    let dev = common::device();
    let attr = dev.ctx.query_device_ex().unwrap();
    let flag = rdma_verbs::sys::ibv_device_cap_flags::IBV_DEVICE_XRC.0;
    let has = attr.as_raw().orig_attr.device_cap_flags & flag != 0;
    assert_eq!(has, attr.supports(Feature::Xrc));
    assert!(!(has && common::is_rxe(&dev)), "rxe has no XRC");
    let file = std::fs::File::create(std::env::temp_dir().join("ibverbs-xrcd-test")).unwrap();
    let shared = || {
        use std::os::fd::AsFd;
        XrcdOptions::new().file(file.as_fd(), XrcdOpenFlags::CREATE)
    };
    let pd = dev.ctx.alloc_pd().unwrap();
    let cq = dev.ctx.create_cq(64).build().unwrap();
    if !has {
        for res in [
            dev.ctx.open_xrcd(XrcdOptions::new()),
            dev.ctx.open_xrcd(shared()),
        ] {
            match res {
                Err(Error::DeviceLacks { verb, capability }) => {
                    assert_eq!(verb, "ibv_open_xrcd");
                    assert!(capability.contains("IBV_DEVICE_XRC"), "{capability}");
                }
                other => panic!("expected DeviceLacks naming ibv_open_xrcd: {other:?}"),
            }
        }
        match pd.create_qp(QpType::XrcSend, &cq, &cq).build() {
            Err(Error::DeviceLacks { verb, .. }) => assert_eq!(verb, "ibv_create_qp"),
            other => panic!("expected DeviceLacks naming ibv_create_qp: {other:?}"),
        }
        return;
    }
    let xrcd = dev.ctx.open_xrcd(shared()).unwrap();
    let srq = xrcd.create_srq(&pd, &cq, 16).build().unwrap();
    let num = srq.xrc_srq_num().expect("an XRC SRQ has a number");
    eprintln!("XRC SRQ number {num}");
    let rqp = xrcd.create_recv_qp().unwrap();
    let opened = xrcd.open_qp(rqp.qp_num()).unwrap();
    assert_eq!(opened.qp_num(), rqp.qp_num());
    let sqp = pd.create_qp(QpType::XrcSend, &cq, &cq).build().unwrap();
    assert_eq!(sqp.qp_type(), QpType::XrcSend);
    // An XRC send queue pair receives nothing (it has no receive queue
    // handle); an XRC SRQ serves no ordinary queue pair.
    assert!(matches!(sqp.recv_queue(), Err(Error::ReceivesThroughSrq)));
    assert!(matches!(
        pd.create_qp(QpType::Rc, &cq, &cq).srq(&srq).build(),
        Err(Error::WrongQpType { .. })
    ));
}

/// pyverbs' `test_reg_mw_wrong_type`: `MwType` has the two valid types
/// only, so the library cannot even name another; the device itself
/// refuses a type 3 window (through the raw verb, as pyverbs asks).
#[test]
#[ignore = "needs an RDMA device"]
fn mw_wrong_type_is_refused_by_the_device() {
    let dev = common::device();
    let pd = dev.ctx.alloc_pd().unwrap();
    for kind in [MwType::Type1, MwType::Type2] {
        // Exhaustive: a third variant would not compile here.
        match kind {
            MwType::Type1 | MwType::Type2 => {}
        }
    }
    // SAFETY: live PD; a window it might return is deallocated at once.
    let mw = unsafe { rdma_verbs::sys::ibv_alloc_mw(pd.as_ptr(), 3) };
    let err = std::io::Error::last_os_error();
    if !mw.is_null() {
        // SAFETY: just allocated, never bound.
        unsafe { rdma_verbs::sys::ibv_dealloc_mw(mw) };
        panic!("the device allocated a memory window of type 3");
    }
    eprintln!("type 3 refused: {err}");
}
