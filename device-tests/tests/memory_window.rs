//! Memory windows and capability queries (device tests): bind type 1 and
//! type 2 windows, use them remotely, and revoke them by local and remote
//! invalidation — after which the peer's access fails.

mod common;

use common::{pair, remote_all, wait, wait_ok, Pair};
use rdma_verbs::{
    device::Feature,
    memory::{MemoryWindow, MwType},
    qp::SendOpFlags,
    AccessFlags, Error, QpType, RemoteMemory, SendQueue, SharedBuffer, WcOpcode, WcStatus, Wr,
};

/// Rights of the region windows are bound over: local write plus MW_BIND,
/// no remote rights of its own (a window alone grants them).
fn mw_region() -> AccessFlags {
    AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND
}

fn window_rights() -> AccessFlags {
    AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE
}

/// Skips (by name, visibly) when the device lacks `feature`.
fn require(p: &Pair, feature: Feature) -> bool {
    let attr = p.dev.ctx.query_device_ex().unwrap();
    if attr.supports(feature) {
        return true;
    }
    assert!(
        !common::is_rxe(&p.dev),
        "rxe supports {feature}; the capability query says it does not"
    );
    eprintln!("UNSUPPORTED on this device: {feature}");
    false
}

/// The send queues of `p`'s two queue pairs (`a`, `b`).
fn handles(p: &Pair) -> (SendQueue, SendQueue) {
    (p.a.send_queue().unwrap(), p.b.send_queue().unwrap())
}

/// Writes `data` through `remote` from QP `b` (its send queue `sq_b`) and
/// returns the status.
fn write_from_b(p: &Pair, sq_b: &mut SendQueue, remote: RemoteMemory, data: &[u8]) -> WcStatus {
    let mut src = p.pd.alloc(data.len(), AccessFlags::LOCAL_WRITE).unwrap();
    src.copy_from_slice(data);
    sq_b.write(src, remote, Wr::id(7)).unwrap();
    let c = wait(&p.cq_b, 1).pop().unwrap();
    c.status()
}

fn bind_and_use(kind: MwType) {
    let p = pair(QpType::Rc, remote_all(), |b| b);
    let feature = match kind {
        MwType::Type1 => Feature::MemoryWindowType1,
        MwType::Type2 => Feature::MemoryWindowType2,
    };
    if !require(&p, feature) {
        return;
    }
    let (mut sq_a, mut sq_b) = handles(&p);
    let target: SharedBuffer = p.pd.alloc_shared(4096, mw_region()).unwrap();
    assert_eq!(
        target.memory_region().rkey(),
        None,
        "the region itself grants nothing"
    );
    let mw = p.pd.alloc_mw(kind).unwrap();
    let before = mw.rkey();
    let remote = sq_a.bind_mw(&mw, &target, window_rights(), 11).unwrap();
    let c = wait_ok(&p.cq_a);
    assert_eq!((c.wr_id(), c.opcode()), (11, WcOpcode::BindMw));
    assert_ne!(remote.rkey, before, "a bind hands out a new key");
    assert_eq!(mw.remote(), Some(remote));
    assert_eq!((remote.addr, remote.len), (target.addr(), 4096));

    // The peer writes through the window.
    let data = common::pattern(256, 3);
    assert_eq!(
        write_from_b(&p, &mut sq_b, remote.slice(100, 256).unwrap(), &data),
        WcStatus::Success
    );
    let mut got = vec![0u8; 256];
    target.copy_to_slice(100, &mut got).unwrap();
    assert_eq!(got, data);

    // Revoke locally: the peer's next access fails.
    sq_a.invalidate_mw(&mw, 12).unwrap();
    let c = wait_ok(&p.cq_a);
    // Type 1 windows are unbound by a zero-length bind, type 2 by LOCAL_INV.
    let expect = match kind {
        MwType::Type1 => WcOpcode::BindMw,
        MwType::Type2 => WcOpcode::LocalInv,
    };
    assert_eq!((c.wr_id(), c.opcode()), (12, expect));
    assert_eq!(mw.remote(), None);
    let status = write_from_b(&p, &mut sq_b, remote.slice(0, 8).unwrap(), &[1; 8]);
    assert_eq!(
        status,
        WcStatus::RemAccessErr,
        "a write through an invalidated window must fail"
    );
    target.copy_to_slice(0, &mut got[..8]).unwrap();
    assert_eq!(&got[..8], &[0; 8], "and must not land");
}

#[test]
#[ignore = "needs an RDMA device"]
fn type1_window_bind_use_invalidate() {
    bind_and_use(MwType::Type1);
}

#[test]
#[ignore = "needs an RDMA device"]
fn type2_window_bind_use_invalidate() {
    bind_and_use(MwType::Type2);
}

#[test]
#[ignore = "needs an RDMA device"]
fn type2_window_remote_invalidate_revokes() {
    let p = pair(QpType::Rc, remote_all(), |b| b);
    if !require(&p, Feature::MemoryWindowType2) {
        return;
    }
    let (mut sq_a, mut sq_b) = handles(&p);
    let target = p.pd.alloc_shared(1024, mw_region()).unwrap();
    let mw = p.pd.alloc_mw(MwType::Type2).unwrap();
    let remote = sq_a.bind_mw(&mw, &target, window_rights(), 1).unwrap();
    wait_ok(&p.cq_a);
    assert_eq!(
        write_from_b(&p, &mut sq_b, remote, &[5; 1024]),
        WcStatus::Success
    );

    // The peer sends with invalidate: A's receive reports the key.
    let rbuf = p.pd.alloc(64, AccessFlags::LOCAL_WRITE).unwrap();
    p.a.recv_queue().unwrap().recv(rbuf, 2).unwrap();
    let mut msg = p.pd.alloc(64, AccessFlags::LOCAL_WRITE).unwrap();
    msg.fill(9);
    sq_b.send(msg, Wr::id(3).invalidate(remote.rkey)).unwrap();
    wait_ok(&p.cq_b);
    let c = wait_ok(&p.cq_a);
    assert_eq!(c.wr_id(), 2);
    assert_eq!(
        c.wc().invalidated_rkey(),
        Some(remote.rkey.0),
        "wc_flags {:#x}, raw {:?}",
        c.wc().wc_flags(),
        c.wc().as_raw()
    );
    // A type 2 window binds only when invalid (o10-37.2.40): this bind
    // succeeding shows the remote invalidation took effect.
    let again = sq_a.bind_mw(&mw, &target, window_rights(), 4).unwrap();
    wait_ok(&p.cq_a);
    assert_ne!(again.rkey, remote.rkey);
    // The old key is revoked: the peer's write fails (the access error
    // moves both QPs to ERR) and the memory is unchanged.
    assert_eq!(
        write_from_b(&p, &mut sq_b, remote.slice(0, 16).unwrap(), &[6; 16]),
        WcStatus::RemAccessErr
    );
    let mut got = [0u8; 16];
    target.copy_to_slice(0, &mut got).unwrap();
    assert_eq!(got, [5; 16]);
}

#[test]
#[ignore = "needs an RDMA device"]
fn window_rights_follow_the_ownership_model() {
    let p = pair(QpType::Rc, remote_all(), |b| b);
    if !require(&p, Feature::MemoryWindowType2) {
        return;
    }
    let (mut sq_a, mut sq_b) = handles(&p);
    let mw = p.pd.alloc_mw(MwType::Type2).unwrap();
    // Remote write over exclusively owned memory: refused.
    let local = p.pd.alloc(256, mw_region()).unwrap();
    let e = sq_a
        .bind_mw(&mw, &local, AccessFlags::REMOTE_WRITE, 1)
        .unwrap_err();
    assert!(matches!(e, Error::NeedsSharedBuffer { .. }), "{e}");
    assert!(e.to_string().contains("SharedBuffer"), "{e}");
    // Remote read of it is fine.
    let remote = sq_a
        .bind_mw(&mw, &local, AccessFlags::REMOTE_READ, 2)
        .unwrap();
    wait_ok(&p.cq_a);
    // A region without MW_BIND: refused, naming the flag.
    let plain = p.pd.alloc_shared(256, AccessFlags::LOCAL_WRITE).unwrap();
    let mw2 = p.pd.alloc_mw(MwType::Type2).unwrap();
    let e = sq_a
        .bind_mw(&mw2, &plain, AccessFlags::REMOTE_READ, 3)
        .unwrap_err();
    assert!(
        matches!(e, Error::MissingAccess { needed, .. } if needed == AccessFlags::MW_BIND),
        "{e}"
    );
    assert!(e.to_string().contains("MW_BIND"), "{e}");
    // Rights a window cannot grant.
    let e = sq_a
        .bind_mw(&mw2, &local, AccessFlags::LOCAL_WRITE, 4)
        .unwrap_err();
    assert!(
        matches!(e, Error::AccessNotAllowed { flags, .. } if flags == AccessFlags::LOCAL_WRITE),
        "{e}"
    );
    // A window of another protection domain.
    let other = p
        .dev
        .ctx
        .alloc_pd()
        .unwrap()
        .alloc_mw(MwType::Type2)
        .unwrap();
    let e = sq_a
        .bind_mw(&other, &local, AccessFlags::REMOTE_READ, 5)
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::ForeignProtectionDomain {
                what: "memory window"
            }
        ),
        "{e}"
    );
    // Dropping the buffer and the region handle while the window is bound
    // keeps the memory registered: the peer's read still works.
    drop(local);
    let mut dst = p.pd.alloc(256, AccessFlags::LOCAL_WRITE).unwrap();
    dst.fill(1);
    sq_b.read(dst, remote, Wr::id(6)).unwrap();
    let mut c = wait_ok(&p.cq_b);
    assert!(c.take_local().unwrap().iter().all(|&x| x == 0));
    drop(mw);
}

/// A read-only window over exclusively owned memory must stay read-only on
/// the device: rxe checks window accesses against the region's bounds rather
/// than the window's (docs/providers.md), so the rights check is the one
/// that keeps a peer from writing memory Rust holds as `&mut`.
#[test]
#[ignore = "needs an RDMA device"]
fn a_read_window_refuses_a_peers_write() {
    let p = pair(QpType::Rc, remote_all(), |b| b);
    if !require(&p, Feature::MemoryWindowType2) {
        return;
    }
    let (mut sq_a, mut sq_b) = handles(&p);
    let mw = p.pd.alloc_mw(MwType::Type2).unwrap();
    let mut local = p.pd.alloc(256, mw_region()).unwrap();
    local.fill(7);
    let remote = sq_a
        .bind_mw(&mw, &local, AccessFlags::REMOTE_READ, 1)
        .unwrap();
    wait_ok(&p.cq_a);
    assert_eq!(
        write_from_b(&p, &mut sq_b, remote, &[0xAA; 64]),
        WcStatus::RemAccessErr
    );
    assert!(
        local.iter().all(|&x| x == 7),
        "a peer wrote through a read-only window"
    );
}

#[test]
#[ignore = "needs an RDMA device"]
fn windows_are_released_with_their_last_handle() {
    let p = pair(QpType::Rc, remote_all(), |b| b);
    if !require(&p, Feature::MemoryWindowType1) {
        return;
    }
    let (mut sq_a, mut sq_b) = handles(&p);
    let target = p.pd.alloc_shared(512, mw_region()).unwrap();
    let windows: Vec<MemoryWindow> = (0..4)
        .map(|_| p.pd.alloc_mw(MwType::Type1).unwrap())
        .collect();
    for (i, mw) in windows.iter().enumerate() {
        sq_a.bind_mw(mw, &target, window_rights(), i as u64)
            .unwrap();
    }
    assert_eq!(
        wait(&p.cq_a, 4).iter().filter(|c| c.is_success()).count(),
        4
    );
    let remote = windows[0].remote().unwrap();
    // Deallocating a bound window revokes its key.
    drop(windows);
    assert_eq!(
        write_from_b(&p, &mut sq_b, remote.slice(0, 8).unwrap(), &[1; 8]),
        WcStatus::RemAccessErr
    );
}

#[test]
#[ignore = "needs an RDMA device"]
fn capabilities_are_reported_by_name() {
    let t = common::device();
    let attr = t.ctx.query_device_ex().unwrap();
    assert_eq!(
        attr.base().max_qp(),
        t.ctx.query_device().unwrap().max_qp(),
        "the classic attributes inside the extended ones"
    );
    for f in Feature::ALL {
        eprintln!("{}: {f}: {}", t.ctx.name(), attr.supports(*f));
    }
    let missing: Vec<String> = attr.missing().map(|f| f.to_string()).collect();
    eprintln!("UNSUPPORTED on {}: {}", t.ctx.name(), missing.join(", "));
    if common::is_rxe(&t) {
        // What rxe is known to support and to lack (softroce facts).
        for f in [
            Feature::MemoryWindowType1,
            Feature::MemoryWindowType2,
            Feature::Atomics,
            Feature::SharedReceiveQueue,
        ] {
            assert!(attr.supports(f), "rxe supports {f}");
        }
        for f in [Feature::Xrc, Feature::OnDemandPaging, Feature::DeviceMemory] {
            assert!(!attr.supports(f), "rxe lacks {f}");
        }
    }
}

/// pyverbs `test_mw_type2_invalidate_dealloc`: dropping the last handle
/// of a bound type 2 window deallocates it (`ibv_dealloc_mw`), which
/// revokes its key: the peer's next write fails and does not land, and
/// the region (which the window held) is released only after.
#[test]
#[ignore = "needs an RDMA device"]
fn type2_window_dealloc_revokes_its_key() {
    let p = pair(QpType::Rc, remote_all(), |b| b);
    if !require(&p, Feature::MemoryWindowType2) {
        return;
    }
    let (mut sq_a, mut sq_b) = handles(&p);
    let target = p.pd.alloc_shared(1024, mw_region()).unwrap();
    let mw = p.pd.alloc_mw(MwType::Type2).unwrap();
    let remote = sq_a.bind_mw(&mw, &target, window_rights(), 1).unwrap();
    wait_ok(&p.cq_a);
    assert_eq!(
        write_from_b(&p, &mut sq_b, remote.slice(0, 8).unwrap(), &[3; 8]),
        WcStatus::Success
    );
    drop(mw);
    assert_eq!(
        write_from_b(&p, &mut sq_b, remote.slice(8, 8).unwrap(), &[4; 8]),
        WcStatus::RemAccessErr,
        "a write through a deallocated window must fail"
    );
    let mut got = [0u8; 16];
    target.copy_to_slice(0, &mut got).unwrap();
    assert_eq!(got, [3, 3, 3, 3, 3, 3, 3, 3, 0, 0, 0, 0, 0, 0, 0, 0]);
}

/// A pair of extended queue pairs (`ibv_create_qp_ex`) that bind and
/// invalidate windows through `ibv_wr_bind_mw` / `ibv_wr_local_inv`.
fn wr_window_pair() -> Pair {
    common::ex_pair(SendOpFlags::rc_data() | SendOpFlags::BIND_MW | SendOpFlags::LOCAL_INV)
}

/// pyverbs `test_qp_ex_rc_bind_mw`: a type 2 window bound through the
/// extended path (`ibv_wr_bind_mw`) with read rights only; the peer's read
/// through it works, its write fails with a remote access error and does
/// not land.
#[test]
#[ignore = "needs an RDMA device"]
fn type2_window_bound_through_wr_bind_mw_refuses_a_write() {
    let p = wr_window_pair();
    if !require(&p, Feature::MemoryWindowType2) {
        return;
    }
    let (mut sq_a, mut sq_b) = handles(&p);
    assert!(p.a.send_ops().unwrap().contains(SendOpFlags::BIND_MW));
    let mut mem = p.pd.alloc_shared(256, mw_region()).unwrap();
    mem.copy_from_slice(0, &[7; 256]).unwrap();
    let mw = p.pd.alloc_mw(MwType::Type2).unwrap();
    let before = mw.rkey();
    let remote = sq_a
        .bind_mw(&mw, &mem, AccessFlags::REMOTE_READ, 0x123)
        .unwrap();
    let c = wait_ok(&p.cq_a);
    assert_eq!((c.wr_id(), c.opcode()), (0x123, WcOpcode::BindMw));
    assert_ne!(remote.rkey, before, "a bind hands out a new key");
    assert_eq!(mw.rkey(), remote.rkey);
    // The peer reads through the window.
    let dst = p.pd.alloc(16, AccessFlags::LOCAL_WRITE).unwrap();
    sq_b.read(dst, remote.slice(0, 16).unwrap(), Wr::id(5))
        .unwrap();
    let mut c = wait_ok(&p.cq_b);
    assert_eq!(&c.take_local().unwrap()[..], &[7; 16]);
    // Its write is refused.
    assert_eq!(
        write_from_b(&p, &mut sq_b, remote.slice(0, 8).unwrap(), &[9; 8]),
        WcStatus::RemAccessErr
    );
    let mut got = [0u8; 8];
    mem.copy_to_slice(0, &mut got).unwrap();
    assert_eq!(got, [7; 8], "a peer wrote through a read-only window");
}

/// The extended path's invalidate (`ibv_wr_local_inv`) revokes a window
/// bound through `ibv_wr_bind_mw`, and the window binds again afterwards
/// (a type 2 window binds only when invalid).
#[test]
#[ignore = "needs an RDMA device"]
fn type2_window_invalidated_through_wr_local_inv() {
    let p = wr_window_pair();
    if !require(&p, Feature::MemoryWindowType2) {
        return;
    }
    let (mut sq_a, mut sq_b) = handles(&p);
    let mem = p.pd.alloc_shared(256, mw_region()).unwrap();
    let mw = p.pd.alloc_mw(MwType::Type2).unwrap();
    let first = sq_a.bind_mw(&mw, &mem, window_rights(), 1).unwrap();
    wait_ok(&p.cq_a);
    assert_eq!(
        write_from_b(&p, &mut sq_b, first.slice(0, 8).unwrap(), &[1; 8]),
        WcStatus::Success
    );
    sq_a.invalidate_mw(&mw, 2).unwrap();
    let c = wait_ok(&p.cq_a);
    assert_eq!((c.wr_id(), c.opcode()), (2, WcOpcode::LocalInv));
    assert_eq!(mw.remote(), None);
    let second = sq_a.bind_mw(&mw, &mem, window_rights(), 3).unwrap();
    wait_ok(&p.cq_a);
    assert_ne!(second.rkey, first.rkey);
    assert_eq!(
        write_from_b(&p, &mut sq_b, second.slice(8, 8).unwrap(), &[2; 8]),
        WcStatus::Success
    );
    // The first key is revoked.
    assert_eq!(
        write_from_b(&p, &mut sq_b, first.slice(16, 8).unwrap(), &[3; 8]),
        WcStatus::RemAccessErr
    );
    let mut got = [0u8; 24];
    mem.copy_to_slice(0, &mut got).unwrap();
    assert_eq!(
        &got[..16],
        &[1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2]
    );
    assert_eq!(&got[16..], &[0; 8], "the revoked key's write must not land");
}
