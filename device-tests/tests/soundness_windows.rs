//! Soundness of memory windows (device tests): a region a window was bound
//! to is never freed while the device may still reach it through the
//! window — not after a bind or invalidate that completed with an error,
//! not while a request of the window is outstanding on another queue pair,
//! not after a reset discarded a request without a completion.
//!
//! Each program drops the region's buffer, lets safe code allocate what the
//! heap hands out next (`victims`), and has the peer write through the old
//! key: the write may fail or land in the still-held region, but the
//! victims' bytes, reachable as `&[u8]`, must never change.

mod common;

use std::time::Duration;

use common::{connect_pair, pair, pattern, remote_all, wait, wait_ok, Pair};
use rdma_verbs::{
    device::Feature,
    memory::{MemoryWindow, MwType, RemoteKey},
    AccessFlags, CompletionQueue, Completions, Error, ProtectionDomain, QpType, QueuePair,
    RemoteMemory, SendQueue, SharedBuffer, WcOpcode, WcStatus, Wr,
};

const LEN: usize = 4096;

/// Skips (by name, visibly) when the device lacks `kind` windows.
fn require(p: &Pair, kind: MwType) -> bool {
    let feature = match kind {
        MwType::Type1 => Feature::MemoryWindowType1,
        MwType::Type2 => Feature::MemoryWindowType2,
    };
    if p.dev.ctx.query_device_ex().unwrap().supports(feature) {
        return true;
    }
    assert!(!common::is_rxe(&p.dev), "rxe supports {feature}");
    eprintln!("UNSUPPORTED on this device: {feature}");
    false
}

/// A region over heap memory (a `Vec`), which the allocator hands out
/// again once freed.
fn heap_region(pd: &ProtectionDomain) -> SharedBuffer {
    pd.register_shared(
        vec![0u8; LEN],
        AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND,
    )
    .unwrap()
}

/// What safe code allocates next: zeroed buffers of the freed region's size.
fn victims() -> Vec<Vec<u8>> {
    (0..4).map(|_| vec![0u8; LEN]).collect()
}

/// The victims were never written (whether or not one of them got the
/// address of the region dropped before, `freed`).
fn assert_untouched(victims: &[Vec<u8>], freed: u64) {
    let reused = victims.iter().any(|v| v.as_ptr() as u64 == freed);
    eprintln!("a victim got the dropped region's address: {reused}");
    for v in victims {
        assert!(
            v.iter().all(|&x| x == 0),
            "memory allocated after the region was dropped changed behind a &[u8] \
             (address reused: {reused})"
        );
    }
}

/// A send queue handle of `qp` for one request: these tests reset and
/// reconnect their queue pairs between requests, which a live handle
/// would refuse (`Error::HandleLive`), so none is kept.
fn sq(qp: &QueuePair) -> SendQueue {
    qp.send_queue().unwrap()
}

/// RDMA-writes `data` through `remote` from `qp` and returns the status.
fn write(
    pd: &ProtectionDomain,
    qp: &QueuePair,
    cq: &CompletionQueue,
    remote: RemoteMemory,
    data: &[u8],
) -> WcStatus {
    let mut src = pd.alloc(data.len(), AccessFlags::LOCAL_WRITE).unwrap();
    src.copy_from_slice(data);
    sq(qp).write(src, remote, Wr::id(77)).unwrap();
    let c = wait(cq, 1).pop().unwrap();
    assert_eq!(c.wr_id(), 77);
    c.status()
}

/// Fails QP `a` behind the library's back: an RDMA write with a key that
/// names nothing completes with a remote access error, which moves the
/// device's QP to ERR while libibverbs still records RTS.
fn fail_behind_the_back(p: &Pair) {
    let bogus = RemoteMemory {
        addr: 0x1000,
        len: 8,
        rkey: RemoteKey(0x00ab_cd00),
    };
    assert_eq!(
        write(&p.pd, &p.a, &p.cq_a, bogus, &[1; 8]),
        WcStatus::RemAccessErr
    );
}

/// Resets and reconnects two connected queue pairs (after an error).
fn fresh(p: &Pair, x: &QueuePair, y: &QueuePair) {
    x.reset().unwrap();
    y.reset().unwrap();
    connect_pair(&p.dev, x, y, remote_all());
}

/// A second connected RC pair in the same protection domain.
struct Second {
    cq_c: CompletionQueue,
    c: QueuePair,
    cq_d: CompletionQueue,
    d: QueuePair,
}

fn second_pair(p: &Pair) -> Second {
    let cq_c = p.dev.ctx.create_cq(256).build().unwrap();
    let cq_d = p.dev.ctx.create_cq(256).build().unwrap();
    let c = p.pd.create_qp(QpType::Rc, &cq_c, &cq_c).build().unwrap();
    let d = p.pd.create_qp(QpType::Rc, &cq_d, &cq_d).build().unwrap();
    connect_pair(&p.dev, &c, &d, remote_all());
    Second { cq_c, c, cq_d, d }
}

/// Polls whatever is left on `cq` (completions of requests a reset
/// discarded): each must be an orphan, never matched to a live slot.
fn drain_orphans(cq: &CompletionQueue) {
    std::thread::sleep(Duration::from_millis(50));
    let mut batch = Completions::with_capacity(16);
    loop {
        let polled = cq.poll(&mut batch).unwrap();
        if polled.is_empty() {
            break;
        }
        for c in polled {
            assert!(c.is_orphan(), "a discarded request matched a slot: {c:?}");
        }
    }
}

fn rights() -> AccessFlags {
    AccessFlags::REMOTE_WRITE
}

/// Type 1: a rebind that completes with `WR_FLUSH_ERR` (the QP failed
/// behind the library's back) must leave the window bound to region A as
/// far as the library knows, and keep A's storage; a second pair of the
/// same PD writes through the original key.
#[test]
#[ignore = "needs an RDMA device"]
fn soundness_mw_type1_failed_rebind_keeps_the_old_region() {
    let p = pair(QpType::Rc, remote_all(), |b| b);
    if !require(&p, MwType::Type1) {
        return;
    }
    let mem_a = heap_region(&p.pd);
    let a_addr = mem_a.addr();
    let mem_b = heap_region(&p.pd);
    let mw = p.pd.alloc_mw(MwType::Type1).unwrap();
    let grant = sq(&p.a).bind_mw(&mw, &mem_a, rights(), 1).unwrap();
    wait_ok(&p.cq_a);

    fail_behind_the_back(&p);
    sq(&p.a).bind_mw(&mw, &mem_b, rights(), 2).unwrap();
    let c = wait(&p.cq_a, 1).pop().unwrap();
    assert_eq!((c.wr_id(), c.status()), (2, WcStatus::WrFlushErr));
    assert_eq!(mw.rkey(), grant.rkey, "a failed bind changes no key");
    assert_eq!(mw.remote(), Some(grant), "nor the binding");

    drop(mem_a);
    let victims = victims();
    let s = second_pair(&p);
    let data = pattern(64, 9);
    let status = write(&p.pd, &s.d, &s.cq_d, grant.slice(0, 64).unwrap(), &data);
    eprintln!("the peer's write through the original key: {status}");
    assert_untouched(&victims, a_addr);

    // The window's key is still the device's: a rebind from a healthy
    // queue pair succeeds, and then the original key is revoked.
    fresh(&p, &s.c, &s.d);
    let again = sq(&s.c).bind_mw(&mw, &mem_b, rights(), 3).unwrap();
    let c = wait_ok(&s.cq_c);
    assert_eq!((c.wr_id(), c.opcode()), (3, WcOpcode::BindMw));
    assert_eq!(mw.remote(), Some(again));
    assert_eq!(
        write(&p.pd, &s.d, &s.cq_d, grant.slice(0, 64).unwrap(), &data),
        WcStatus::RemAccessErr
    );
    assert_untouched(&victims, a_addr);
}

/// Type 2: binding a bound window again completes with `MW_BIND_ERR`; the
/// original key stays the device's and the window's, region A stays held,
/// and an invalidate still revokes the original key.
#[test]
#[ignore = "needs an RDMA device"]
fn soundness_mw_type2_failed_bind_keeps_the_old_region() {
    failed_type2_bind(pair(QpType::Rc, remote_all(), |b| b));
}

/// The same through the extended path (`ibv_wr_bind_mw`,
/// `ibv_wr_local_inv`): the window's state changes on the completion
/// alone, whichever verb posted the request.
#[test]
#[ignore = "needs an RDMA device"]
fn soundness_mw_type2_failed_bind_keeps_the_old_region_wr_path() {
    let p = common::ex_pair(
        rdma_verbs::qp::SendOpFlags::rc_data()
            | rdma_verbs::qp::SendOpFlags::BIND_MW
            | rdma_verbs::qp::SendOpFlags::LOCAL_INV,
    );
    failed_type2_bind(p);
}

fn failed_type2_bind(p: Pair) {
    if !require(&p, MwType::Type2) {
        return;
    }
    let mem_a = heap_region(&p.pd);
    let a_addr = mem_a.addr();
    let mem_b = heap_region(&p.pd);
    let mw = p.pd.alloc_mw(MwType::Type2).unwrap();
    let grant = sq(&p.a).bind_mw(&mw, &mem_a, rights(), 1).unwrap();
    wait_ok(&p.cq_a);

    // A type 2 window binds only when invalid (o10-37.2.30). The status is
    // MW_BIND_ERR per IBA; rxe (Linux 6.12) moves the QP to ERR and
    // reports the failed bind itself as WR_FLUSH_ERR.
    sq(&p.a).bind_mw(&mw, &mem_b, rights(), 2).unwrap();
    let c = wait(&p.cq_a, 1).pop().unwrap();
    assert_eq!(c.wr_id(), 2);
    assert!(
        matches!(c.status(), WcStatus::MwBindErr | WcStatus::WrFlushErr),
        "{c:?}"
    );
    assert_eq!(mw.rkey(), grant.rkey);
    assert_eq!(mw.remote(), Some(grant));

    drop(mem_a);
    let victims = victims();
    fresh(&p, &p.a, &p.b);
    let data = pattern(64, 5);
    let status = write(&p.pd, &p.b, &p.cq_b, grant.slice(0, 64).unwrap(), &data);
    eprintln!("the peer's write through the original key: {status}");
    assert_untouched(&victims, a_addr);

    // The invalidate names the key the device holds, so it revokes it.
    fresh(&p, &p.a, &p.b);
    sq(&p.a).invalidate_mw(&mw, 3).unwrap();
    let c = wait_ok(&p.cq_a);
    assert_eq!((c.wr_id(), c.opcode()), (3, WcOpcode::LocalInv));
    assert_eq!(mw.remote(), None);
    assert_eq!(
        write(&p.pd, &p.b, &p.cq_b, grant.slice(0, 64).unwrap(), &data),
        WcStatus::RemAccessErr,
        "the original key must be revoked"
    );
    assert_untouched(&victims, a_addr);
    drop(mem_b);
}

/// An invalidate that completes with an error leaves the window bound and
/// its region held; a later invalidate revokes the key.
fn failed_invalidate(kind: MwType) {
    let p = pair(QpType::Rc, remote_all(), |b| b);
    if !require(&p, kind) {
        return;
    }
    let mem_a = heap_region(&p.pd);
    let a_addr = mem_a.addr();
    let mw = p.pd.alloc_mw(kind).unwrap();
    let grant = sq(&p.a).bind_mw(&mw, &mem_a, rights(), 1).unwrap();
    wait_ok(&p.cq_a);

    fail_behind_the_back(&p);
    sq(&p.a).invalidate_mw(&mw, 2).unwrap();
    let c = wait(&p.cq_a, 1).pop().unwrap();
    assert_eq!((c.wr_id(), c.status()), (2, WcStatus::WrFlushErr));
    assert_eq!(
        mw.remote(),
        Some(grant),
        "a failed invalidate unbinds nothing"
    );
    assert_eq!(mw.rkey(), grant.rkey);

    drop(mem_a);
    let victims = victims();
    fresh(&p, &p.a, &p.b);
    let data = pattern(64, 7);
    let status = write(&p.pd, &p.b, &p.cq_b, grant.slice(0, 64).unwrap(), &data);
    eprintln!("the peer's write through the still-bound key: {status}");
    assert_untouched(&victims, a_addr);

    fresh(&p, &p.a, &p.b);
    sq(&p.a).invalidate_mw(&mw, 3).unwrap();
    wait_ok(&p.cq_a);
    assert_eq!(mw.remote(), None);
    assert_eq!(
        write(&p.pd, &p.b, &p.cq_b, grant.slice(0, 64).unwrap(), &data),
        WcStatus::RemAccessErr
    );
    assert_untouched(&victims, a_addr);
}

#[test]
#[ignore = "needs an RDMA device"]
fn soundness_mw_type1_failed_invalidate_keeps_the_region() {
    failed_invalidate(MwType::Type1);
}

#[test]
#[ignore = "needs an RDMA device"]
fn soundness_mw_type2_failed_invalidate_keeps_the_region() {
    failed_invalidate(MwType::Type2);
}

/// Type 1 windows belong to the PD: while a bind posted on one queue pair
/// is outstanding, binds and invalidates of the window on any queue pair
/// are refused, so a rebind elsewhere cannot overtake it; once the rebind
/// completed, the old key is revoked.
#[test]
#[ignore = "needs an RDMA device"]
fn soundness_mw_type1_cross_qp_rebind_waits_for_the_first() {
    let p = pair(QpType::Rc, remote_all(), |b| b);
    if !require(&p, MwType::Type1) {
        return;
    }
    let s = second_pair(&p);
    let mem_a = heap_region(&p.pd);
    let a_addr = mem_a.addr();
    let mem_b = heap_region(&p.pd);
    let mw = p.pd.alloc_mw(MwType::Type1).unwrap();
    let grant = sq(&p.a).bind_mw(&mw, &mem_a, rights(), 1).unwrap();
    // Outstanding until its completion is polled, on every queue pair.
    // One statement each: a handle lives to the end of its statement.
    let bind_c = sq(&s.c).bind_mw(&mw, &mem_b, rights(), 2).unwrap_err();
    let invalidate_c = sq(&s.c).invalidate_mw(&mw, 3).unwrap_err();
    let bind_a = sq(&p.a).bind_mw(&mw, &mem_b, rights(), 4).unwrap_err();
    for e in [bind_c, invalidate_c, bind_a] {
        assert!(matches!(e, Error::WindowBusy), "{e}");
    }
    assert_eq!(mw.remote(), None, "not bound before its completion");
    let c = wait_ok(&p.cq_a);
    assert_eq!(c.wr_id(), 1, "the refused requests left no completion");
    assert_eq!(mw.remote(), Some(grant));

    // Rebind on the other QP; A stays held until that completion is polled.
    let again = sq(&s.c).bind_mw(&mw, &mem_b, rights(), 5).unwrap();
    assert!(matches!(
        sq(&p.a).invalidate_mw(&mw, 6).unwrap_err(),
        Error::WindowBusy
    ));
    drop(mem_a);
    let victims = victims();
    let data = pattern(64, 11);
    let status = write(&p.pd, &p.b, &p.cq_b, grant.slice(0, 64).unwrap(), &data);
    eprintln!("the peer's write through the old key during the rebind: {status}");
    assert_untouched(&victims, a_addr);
    let c = wait_ok(&s.cq_c);
    assert_eq!(c.wr_id(), 5);
    assert_eq!(mw.remote(), Some(again));

    // The new key reaches B, the old one nothing.
    fresh(&p, &p.a, &p.b);
    assert_eq!(
        write(&p.pd, &s.d, &s.cq_d, again.slice(0, 64).unwrap(), &data),
        WcStatus::Success
    );
    let mut got = vec![0u8; 64];
    mem_b.copy_to_slice(0, &mut got).unwrap();
    assert_eq!(got, data);
    assert_eq!(
        write(&p.pd, &p.b, &p.cq_b, grant.slice(0, 64).unwrap(), &data),
        WcStatus::RemAccessErr
    );
    assert_untouched(&victims, a_addr);
}

/// A reset discards a bind without a completion: nobody can tell whether
/// it ran. The window keeps the region, refuses further binds and
/// invalidates, and releases the region only when deallocated.
fn reset_with_bind_outstanding(kind: MwType) {
    let p = pair(QpType::Rc, remote_all(), |b| b);
    if !require(&p, kind) {
        return;
    }
    let mem_a = heap_region(&p.pd);
    let a_addr = mem_a.addr();
    let mem_b = heap_region(&p.pd);
    let mw: MemoryWindow = p.pd.alloc_mw(kind).unwrap();
    let grant = sq(&p.a).bind_mw(&mw, &mem_a, rights(), 1).unwrap();
    p.a.reset().unwrap();
    drain_orphans(&p.cq_a);
    fresh(&p, &p.a, &p.b);
    // One statement each: a handle lives to the end of its statement.
    let bind = sq(&p.a).bind_mw(&mw, &mem_b, rights(), 2).unwrap_err();
    let invalidate = sq(&p.a).invalidate_mw(&mw, 3).unwrap_err();
    for e in [bind, invalidate] {
        assert!(matches!(e, Error::WindowIndeterminate), "{e}");
    }

    drop(mem_a);
    let victims = victims();
    let data = pattern(64, 13);
    let status = write(&p.pd, &p.b, &p.cq_b, grant.slice(0, 64).unwrap(), &data);
    eprintln!("the peer's write through the discarded bind's key: {status}");
    assert_untouched(&victims, a_addr);

    // Deallocation revokes whatever the device holds; only then is A freed.
    drop(mw);
    fresh(&p, &p.a, &p.b);
    assert_eq!(
        write(&p.pd, &p.b, &p.cq_b, grant.slice(0, 64).unwrap(), &data),
        WcStatus::RemAccessErr
    );
    assert_untouched(&victims, a_addr);
    drop(mem_b);
}

#[test]
#[ignore = "needs an RDMA device"]
fn soundness_mw_type1_reset_with_bind_outstanding() {
    reset_with_bind_outstanding(MwType::Type1);
}

#[test]
#[ignore = "needs an RDMA device"]
fn soundness_mw_type2_reset_with_bind_outstanding() {
    reset_with_bind_outstanding(MwType::Type2);
}
