//! Bad input, everywhere (device tests): every wrong value a caller can
//! pass — a device, port or GID index that does not exist, an MTU that is
//! not one, sizes beyond the device's limits or beyond `ulimit -l`,
//! zero-length and maximum-length messages, requests on a queue pair that
//! is not ready, a revoked remote key, a UD datagram larger than the MTU —
//! ends in an error that names the problem (or in the documented result),
//! never in a panic, a hang, or the device touching memory it no longer
//! owns.

mod common;

use common::{device, pair, pattern, remote_all, wait, wait_ok, TestDevice};
use rdma_verbs::{
    device::{GidIndex, Mtu},
    qp::{AddressHandle, AddressVector, QpAttr, UdDest},
    sys, AccessFlags, CompletionQueue, ConnectOptions, Endpoint, Error, Gid, LocalBuffer,
    LocalPort, PortNumber, ProtectionDomain, QpState, QpType, QueuePair, SendRequest, WcOpcode,
    WcStatus, Wr,
};

fn local() -> AccessFlags {
    AccessFlags::LOCAL_WRITE
}

/// Asserts that `e` is an [`Error::Verb`] of `verb` whose message names
/// every one of `needles`.
#[track_caller]
fn assert_verb(e: &Error, verb: &str, needles: &[&str]) {
    assert!(
        matches!(e, Error::Verb { .. }) && e.verb() == Some(verb),
        "expected a {verb} error, got {e:?}"
    );
    let msg = e.to_string();
    assert!(msg.contains(verb), "{msg:?} does not name {verb}");
    for n in needles {
        assert!(msg.contains(n), "{msg:?} lacks {n:?}");
    }
}

fn filled(pd: &ProtectionDomain, bytes: &[u8]) -> LocalBuffer {
    let mut b = pd.alloc(bytes.len(), local()).unwrap();
    b.copy_from_slice(bytes);
    b
}

/// A fresh RC queue pair (in RESET) and its endpoint on the test port.
fn rc_qp(dev: &TestDevice, pd: &ProtectionDomain, cq: &CompletionQueue) -> (QueuePair, Endpoint) {
    let qp = pd.create_qp(QpType::Rc, cq, cq).build().unwrap();
    let me = common::endpoint(dev, &qp, 0x4242);
    (qp, me)
}

#[test]
#[ignore = "needs an RDMA device"]
fn unknown_device_name_is_no_device() {
    // The device list must work (this is a device test).
    let _ = device();
    for name in [
        "nope0",
        "",
        "rxe0 ",
        "RXE0",
        "a/b",
        "x".repeat(300).as_str(),
    ] {
        match rdma_verbs::open_device(name) {
            Err(e) if matches!(&e, Error::NoDevice { name: Some(n) } if n == name) => {
                let msg = e.to_string();
                assert!(msg.contains(&format!("{name:?}")), "{msg:?} lacks {name:?}");
            }
            other => panic!("open_device({name:?}): expected NoDevice, got {other:?}"),
        }
    }
}

#[test]
#[ignore = "needs an RDMA device"]
fn ports_that_do_not_exist_are_named() {
    let dev = device();
    let ctx = &dev.ctx;
    let last = ctx.query_device().unwrap().phys_port_cnt();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(1024).build().unwrap();
    let (_peer, me) = rc_qp(&dev, &pd, &cq);
    let mut bad = vec![0u8, 255];
    if last < 255 {
        bad.push(last + 1);
    }
    for port in bad {
        let p = PortNumber(port);
        let named = format!("has no port {port}");
        let named = [named.as_str()];
        assert_verb(&ctx.query_port(p).unwrap_err(), "ibv_query_port", &named);
        let e = ctx.query_gid(p, dev.gid_index).unwrap_err();
        assert_verb(&e, "ibv_query_gid", &named);
        let e = ctx.query_gid_entry(p, dev.gid_index).unwrap_err();
        assert_verb(&e, "ibv_query_gid_ex", &named);

        let qp = pd.create_qp(QpType::Rc, &cq, &cq).build().unwrap();
        for index in [Some(dev.gid_index), None] {
            let e = LocalPort::query(ctx, p, index).unwrap_err();
            assert_verb(&e, "ibv_query_port", &named);
        }
        // connect checks the port before the first step: the QP stays in RESET.
        let opts = ConnectOptions::new(p).gid_index(dev.gid_index);
        let own = Endpoint {
            qp_num: qp.qp_num(),
            ..me
        };
        let e = qp.connect(&own, &me, &opts).unwrap_err();
        assert_verb(&e, "ibv_query_port", &named);
        assert_eq!(qp.state().unwrap(), QpState::Reset);
        // The kernel refuses the port in RESET -> INIT.
        let e = qp.to_init(p, 0, local()).unwrap_err();
        assert_verb(&e, "ibv_modify_qp", &named);
        assert_eq!(qp.state().unwrap(), QpState::Reset);

        let e = pd
            .create_ah(&AddressVector::roce(p, me.gid, dev.gid_index))
            .unwrap_err();
        assert_verb(&e, "ibv_create_ah", &named);

        let ud = pd.create_qp(QpType::Ud, &cq, &cq).build().unwrap();
        let e = ud.activate_ud(p, 0x1111, 0).unwrap_err();
        assert_verb(&e, "ibv_modify_qp", &named);
        assert_eq!(ud.state().unwrap(), QpState::Reset);
    }
}

#[test]
#[ignore = "needs an RDMA device"]
fn gid_indexes_naming_no_gid_are_named() {
    let dev = device();
    let ctx = &dev.ctx;
    let port_attr = ctx.query_port(dev.port).unwrap();
    let len = port_attr.gid_table_len();
    // The first empty slot a GidIndex (u8) can name.
    let empty = (0..=255u8)
        .map(GidIndex)
        .find(|&i| {
            matches!(ctx.query_gid_entry(dev.port, i),
                     Err(ref e) if e.raw_os_error() == Some(libc::ENODATA))
        })
        .expect("a GID table with 256 valid entries");
    let i = empty.0;
    let named = format!("GID index {i} of {} port {}", ctx.name(), dev.port);
    let named = [named.as_str(), "empty"];
    let is_empty_gid = |e: &Error| matches!(e, Error::EmptyGid { port, index } if *port == dev.port && *index == empty);

    // As in C, an empty slot reads as the zero GID; the entry query says why.
    assert_eq!(ctx.query_gid(dev.port, empty).unwrap(), Gid::ZERO);
    let e = ctx.query_gid_entry(dev.port, empty).unwrap_err();
    assert_verb(&e, "ibv_query_gid_ex", &named);
    assert_eq!(e.raw_os_error(), Some(libc::ENODATA));

    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(256).build().unwrap();
    let (qp, me) = rc_qp(&dev, &pd, &cq);
    if port_attr.grh_required() {
        let e = LocalPort::query(ctx, dev.port, Some(empty)).unwrap_err();
        assert!(is_empty_gid(&e), "{e:?}");
        assert!(e.to_string().contains(&format!("GID index {i}")), "{e}");
        // connect checks the GID before the first step: the QP stays in RESET.
        let opts = ConnectOptions::new(dev.port).gid_index(empty);
        let e = qp.connect(&me, &me, &opts).unwrap_err();
        assert!(is_empty_gid(&e), "{e:?}");
        assert_eq!(qp.state().unwrap(), QpState::Reset);
    } else {
        eprintln!(
            "UNSUPPORTED on this device: GRH-less port {}: an empty GID slot only matters for GRH \
             addressing",
            dev.port
        );
    }
    let e = pd
        .create_ah(&AddressVector::roce(dev.port, me.gid, empty))
        .unwrap_err();
    assert_verb(&e, "ibv_create_ah", &named);

    // An index past the table: only reachable when the table is shorter
    // than what a GidIndex (u8) can name.
    if len <= 255 {
        let past = GidIndex(len as u8);
        let e = ctx.query_gid(dev.port, past).unwrap_err();
        assert_verb(&e, "ibv_query_gid", &["past the GID table"]);
        let e = ctx.query_gid_entry(dev.port, past).unwrap_err();
        assert_verb(&e, "ibv_query_gid_ex", &["past the GID table"]);
    } else {
        eprintln!(
            "UNSUPPORTED on this device: a GID index past the table: port {} has {len} entries, \
             more than a GidIndex (u8) can name; empty slot {i} tested instead",
            dev.port
        );
    }
}

#[test]
#[ignore = "needs an RDMA device"]
fn mtus_that_are_not_one_are_refused() {
    for bytes in [0, 1, 128, 255, 257, 1000, 1023, 1500, 8192, 9000, u32::MAX] {
        assert_eq!(Mtu::from_bytes(bytes), None, "{bytes}");
    }
    for bytes in [256, 512, 1024, 2048, 4096] {
        assert_eq!(Mtu::from_bytes(bytes).unwrap().bytes(), bytes);
    }
    assert_eq!(Mtu::Unknown(9).bytes(), 0);

    let dev = device();
    let port_attr = dev.ctx.query_port(dev.port).unwrap();
    let (active, max) = (port_attr.active_mtu(), port_attr.max_mtu());
    let pd = dev.ctx.alloc_pd().unwrap();
    let cq = dev.ctx.create_cq(256).build().unwrap();
    let opts = ConnectOptions::new(dev.port).gid_index(dev.gid_index);

    // Values that are no IBV_MTU_*: refused before the first step.
    for raw in [0, 6, 9, 255] {
        let (qp, me) = rc_qp(&dev, &pd, &cq);
        let e = qp
            .connect(&me, &me, &opts.clone().path_mtu(Mtu::Unknown(raw)))
            .unwrap_err();
        assert!(
            matches!(e, Error::InvalidMtu { value } if value == raw),
            "{e:?}"
        );
        assert_eq!(qp.state().unwrap(), QpState::Reset);
    }
    // The same through QpAttr: refused before ibv_modify_qp.
    let (qp, me) = rc_qp(&dev, &pd, &cq);
    qp.to_init(dev.port, 0, local()).unwrap();
    let rtr = |mtu: Mtu| {
        QpAttr::new()
            .qp_state(QpState::Rtr)
            .ah_attr(AddressVector::roce(dev.port, me.gid, dev.gid_index))
            .path_mtu(mtu)
            .dest_qp_num(me.qp_num)
            .rq_psn(me.psn)
            .max_dest_rd_atomic(1)
            .min_rnr_timer(12)
    };
    let e = qp.modify(&rtr(Mtu::Unknown(9))).unwrap_err();
    assert!(matches!(e, Error::InvalidMtu { value: 9 }), "{e:?}");
    assert_eq!(qp.state().unwrap(), QpState::Init);

    // Above the port's maximum: the kernel refuses it.
    match [
        Mtu::Mtu256,
        Mtu::Mtu512,
        Mtu::Mtu1024,
        Mtu::Mtu2048,
        Mtu::Mtu4096,
    ]
    .into_iter()
    .find(|m| m.as_raw() > max.as_raw())
    {
        Some(above) => {
            let e = qp.modify(&rtr(above)).unwrap_err();
            assert_verb(&e, "ibv_modify_qp", &[]);
            assert_eq!(qp.state().unwrap(), QpState::Init);
        }
        None => eprintln!(
            "UNSUPPORTED on this device: an MTU above port {}'s max_mtu ({} bytes): no such \
             IBV_MTU_* value exists",
            dev.port,
            max.bytes()
        ),
    }

    // Above the active MTU: connect caps it (documented), whatever was asked.
    let (qp, me) = rc_qp(&dev, &pd, &cq);
    qp.connect(&me, &me, &opts.clone().path_mtu(Mtu::Mtu4096))
        .unwrap();
    let (attr, _) = qp.query().unwrap();
    assert_eq!(attr.path_mtu(), active, "4096 capped at the active MTU");
}

/// `RLIMIT_MEMLOCK` lowered for the process (the soft limit, to at most
/// the hard one), restored on drop.
struct MemlockLimit {
    old: libc::rlimit,
    now: u64,
}

impl MemlockLimit {
    fn lower_to(bytes: u64) -> MemlockLimit {
        let mut old = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit/setrlimit read and write the structs given.
        unsafe {
            assert_eq!(libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut old), 0);
            let new = libc::rlimit {
                rlim_cur: bytes.min(old.rlim_max),
                rlim_max: old.rlim_max,
            };
            assert_eq!(libc::setrlimit(libc::RLIMIT_MEMLOCK, &new), 0);
            MemlockLimit {
                old,
                now: new.rlim_cur,
            }
        }
    }
}

impl Drop for MemlockLimit {
    fn drop(&mut self) {
        // SAFETY: restores the limits read before.
        unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &self.old) };
    }
}

/// `capget`/`capset` (`linux/capability.h`): the calling thread's
/// capabilities, version 3 (two 32-bit words per set).
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

const CAP_VERSION_3: u32 = 0x2008_0522;
const CAP_IPC_LOCK: u32 = 14;

/// CAP_IPC_LOCK removed from this thread's effective set (it exempts from
/// RLIMIT_MEMLOCK, and tests run as root in the VM); raised again on drop.
/// Capabilities are per thread, and libtest runs each test on its own.
struct WithoutIpcLock([CapData; 2]);

impl WithoutIpcLock {
    fn new() -> std::io::Result<WithoutIpcLock> {
        let mut hdr = CapHeader {
            version: CAP_VERSION_3,
            pid: 0,
        };
        let mut data = [CapData::default(); 2];
        // SAFETY: the kernel fills the header-sized version-3 data array.
        if unsafe { libc::syscall(libc::SYS_capget, &mut hdr, data.as_mut_ptr()) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let saved = data;
        data[0].effective &= !(1 << CAP_IPC_LOCK);
        // SAFETY: as above; lowering the effective set is always allowed.
        if unsafe { libc::syscall(libc::SYS_capset, &mut hdr, data.as_ptr()) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(WithoutIpcLock(saved))
    }
}

impl Drop for WithoutIpcLock {
    fn drop(&mut self) {
        let mut hdr = CapHeader {
            version: CAP_VERSION_3,
            pid: 0,
        };
        // SAFETY: restores the sets read before (still within `permitted`).
        unsafe { libc::syscall(libc::SYS_capset, &mut hdr, self.0.as_ptr()) };
    }
}

#[test]
#[ignore = "needs an RDMA device"]
fn registering_past_the_memlock_limit_names_the_limit() {
    // The device tests run one at a time (`--test-threads=1`), so lowering
    // the process-wide limit affects no other test.
    let dev = device();
    let pd = dev.ctx.alloc_pd().unwrap();
    let before = {
        let limit = MemlockLimit::lower_to(1 << 20);
        let _cap = WithoutIpcLock::new().expect("capset: dropping CAP_IPC_LOCK");
        let now = limit.now as usize;
        // Below the limit, registration works.
        let small = pd.alloc((now / 16).max(1), local()).unwrap();
        let big = 2 * now;
        let (limit_text, big_text) = (
            format!("allows {now} bytes"),
            format!("registering {big} bytes"),
        );
        let needles = ["RLIMIT_MEMLOCK", "ulimit -l", &limit_text, &big_text];
        let e = pd.alloc(big, local()).unwrap_err();
        assert_verb(&e, "ibv_reg_mr", &needles);
        assert_eq!(e.raw_os_error(), Some(libc::ENOMEM), "{e}");
        let e = pd.register(vec![0u8; big], local()).unwrap_err();
        assert_verb(&e, "ibv_reg_mr", &needles);
        let e = pd.alloc_shared(big, remote_all()).unwrap_err();
        assert_verb(&e, "ibv_reg_mr", &needles);
        drop(small);
        (limit.old.rlim_cur, big)
    };
    // Limit and capability restored: the same registration works (when
    // the original limit allows it).
    let (old_limit, big) = before;
    if old_limit == libc::RLIM_INFINITY || old_limit >= 2 * big as u64 {
        assert_eq!(pd.alloc(big, local()).unwrap().len(), big);
    }
    // Empty storage cannot be registered at all (ibv_reg_mr: EFAULT);
    // a zero-length buffer comes from alloc(0).
    let e = pd.register(Vec::new(), local()).unwrap_err();
    assert!(matches!(e, Error::EmptyRegistration), "{e:?}");
    assert_eq!(pd.alloc(0, local()).unwrap().len(), 0);
}

#[test]
#[ignore = "needs an RDMA device"]
fn zero_length_operations_complete() {
    let p = pair(QpType::Rc, remote_all(), |b| b.max_inline_data(64));
    let (mut a, mut b) = (p.a.send_queue().unwrap(), p.b.recv_queue().unwrap());
    // A zero-length send from a zero-length buffer into a zero-length receive.
    b.recv(p.pd.alloc(0, local()).unwrap(), 1).unwrap();
    a.send(p.pd.alloc(0, local()).unwrap(), Wr::id(2)).unwrap();
    let mut r = wait_ok(&p.cq_b);
    assert_eq!(
        (r.wr_id(), r.opcode(), r.byte_len()),
        (1, WcOpcode::Recv, 0)
    );
    assert_eq!(r.take_local().unwrap().len(), 0);
    let mut s = wait_ok(&p.cq_a);
    assert_eq!((s.wr_id(), s.opcode()), (2, WcOpcode::Send));
    assert_eq!(s.take_local().unwrap().len(), 0);

    // Sends without any scatter/gather entry (empty list, empty inline,
    // with immediate data) into a non-empty receive: 0 bytes, buffer
    // untouched.
    for i in 0..3 {
        b.recv(filled(&p.pd, &[0xAB; 16]), 10 + i as u64).unwrap();
        match i {
            0 => a.send_sgl(Vec::new(), Wr::id(3)).map_err(Error::from),
            1 => a.send_inline(b"", Wr::id(4)),
            _ => a.send_inline(b"", Wr::id(5).imm(0xfeed)),
        }
        .unwrap();
        let mut r = wait_ok(&p.cq_b);
        assert_eq!((r.wr_id(), r.byte_len()), (10 + i as u64, 0), "{r:?}");
        assert_eq!(r.imm_data(), (i == 2).then_some(0xfeed));
        assert_eq!(&r.take_local().unwrap()[..], &[0xAB; 16]);
        assert_eq!(wait_ok(&p.cq_a).wr_id(), 3 + i as u64);
    }

    // Zero-length RDMA write and read on an empty slice of the peer's
    // memory: complete, change nothing.
    let mut target = p.pd.alloc_shared(64, remote_all()).unwrap();
    target.copy_from_slice(0, &[0x5A; 64]).unwrap();
    let empty = target.remote().unwrap().slice(0, 0).unwrap();
    a.write(p.pd.alloc(0, local()).unwrap(), empty, Wr::id(20))
        .unwrap();
    let w = wait_ok(&p.cq_a);
    assert_eq!((w.wr_id(), w.opcode()), (20, WcOpcode::RdmaWrite));
    a.read(p.pd.alloc(0, local()).unwrap(), empty, Wr::id(21))
        .unwrap();
    let mut rd = wait_ok(&p.cq_a);
    assert_eq!((rd.wr_id(), rd.opcode()), (21, WcOpcode::RdmaRead));
    assert_eq!(rd.take_local().unwrap().len(), 0);
    // A zero-length RDMA write with immediate consumes a receive.
    b.recv(p.pd.alloc(8, local()).unwrap(), 30).unwrap();
    a.write(p.pd.alloc(0, local()).unwrap(), empty, Wr::id(22).imm(7))
        .unwrap();
    let r = wait_ok(&p.cq_b);
    assert_eq!(
        (r.wr_id(), r.opcode(), r.byte_len(), r.imm_data()),
        (30, WcOpcode::RecvRdmaWithImm, 0, Some(7))
    );
    assert_eq!(wait_ok(&p.cq_a).wr_id(), 22);
    assert_eq!(
        target.to_vec(),
        vec![0x5A; 64],
        "zero-length ops wrote nothing"
    );
    common::assert_quiet(&p.cq_a);
    common::assert_quiet(&p.cq_b);
}

#[test]
#[ignore = "needs an RDMA device"]
fn maximum_length_operations_complete() {
    const MEMORY_BOUND: usize = 16 << 20;
    let p = pair(QpType::Rc, remote_all(), |b| b);
    let max = p.dev.ctx.query_port(p.dev.port).unwrap().max_msg_size() as usize;
    let len = max.min(MEMORY_BOUND);
    if len < max {
        eprintln!(
            "UNSUPPORTED in this test VM: a message of max_msg_sz ({max} bytes, memory-bound): \
             {len} bytes sent, written and read instead"
        );
    }
    let data = pattern(len, 77);

    // Send/receive.
    let (mut sq, mut rq) = (p.a.send_queue().unwrap(), p.b.recv_queue().unwrap());
    rq.recv(p.pd.alloc(len, local()).unwrap(), 1).unwrap();
    sq.send(filled(&p.pd, &data), Wr::id(2)).unwrap();
    let mut r = wait_ok(&p.cq_b);
    assert_eq!(r.byte_len() as usize, len);
    assert!(
        r.take_local().unwrap()[..] == data[..],
        "received bytes differ"
    );
    assert_eq!(wait_ok(&p.cq_a).wr_id(), 2);

    // RDMA write into the peer's memory, then read it back.
    let target = p.pd.alloc_shared(len, remote_all()).unwrap();
    let remote = target.remote().unwrap();
    sq.write(filled(&p.pd, &data), remote, Wr::id(3)).unwrap();
    assert_eq!(wait_ok(&p.cq_a).wr_id(), 3);
    assert!(target.to_vec() == data, "written bytes differ");
    sq.read(p.pd.alloc(len, local()).unwrap(), remote, Wr::id(4))
        .unwrap();
    let mut rd = wait_ok(&p.cq_a);
    assert_eq!((rd.wr_id(), rd.byte_len() as usize), (4, len));
    assert!(
        rd.take_local().unwrap()[..] == data[..],
        "read bytes differ"
    );
    if len == max {
        eprintln!("max_msg_sz {max}: a larger message needs a region of more than that");
    }
}

#[test]
#[ignore = "needs an RDMA device"]
fn sizes_beyond_the_device_caps_name_the_cap() {
    let dev = device();
    let ctx = &dev.ctx;
    let d = ctx.query_device().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(256).build().unwrap();
    let above = |v: u32, what: &str| {
        v.checked_add(1).unwrap_or_else(|| {
            panic!("{what} is u32::MAX: no larger value to test");
        })
    };

    for cqe in [above(d.max_cqe(), "max_cqe"), u32::MAX] {
        let e = ctx.create_cq(cqe).build().unwrap_err();
        assert_verb(&e, "ibv_create_cq", &[&format!("cqe {cqe}"), "max_cqe"]);
    }

    let wr = above(d.max_qp_wr(), "max_qp_wr");
    let sge = above(d.max_sge(), "max_sge");
    type Tune =
        fn(rdma_verbs::qp::QueuePairBuilder<'_>, u32) -> rdma_verbs::qp::QueuePairBuilder<'_>;
    let cases: [(&str, u32, &str, Tune); 4] = [
        ("max_send_wr", wr, "max_qp_wr", |b, v| b.max_send_wr(v)),
        ("max_recv_wr", wr, "max_qp_wr", |b, v| b.max_recv_wr(v)),
        ("max_send_sge", sge, "max_sge", |b, v| b.max_send_sge(v)),
        ("max_recv_sge", sge, "max_sge", |b, v| b.max_recv_sge(v)),
    ];
    for (field, v, cap, tune) in cases {
        for t in [QpType::Rc, QpType::Ud] {
            let e = tune(pd.create_qp(t, &cq, &cq), v).build().unwrap_err();
            assert_verb(&e, "ibv_create_qp", &[&format!("{field} {v}"), cap]);
        }
    }

    // The inline limit is not reported by ibv_query_device: find it.
    let inline_ok = |n: u32| {
        pd.create_qp(QpType::Rc, &cq, &cq)
            .max_inline_data(n)
            .build()
            .is_ok()
    };
    assert!(inline_ok(0));
    let (mut lo, mut hi) = (0u32, 1 << 20);
    assert!(!inline_ok(hi), "a device accepting 1 MiB of inline data");
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if inline_ok(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    eprintln!("{}: largest max_inline_data accepted: {lo}", ctx.name());
    for n in [hi, u32::MAX] {
        let e = pd
            .create_qp(QpType::Rc, &cq, &cq)
            .max_inline_data(n)
            .build()
            .unwrap_err();
        assert_verb(&e, "ibv_create_qp", &[&format!("max_inline_data {n}")]);
    }

    let srq_wr = above(d.max_srq_wr(), "max_srq_wr");
    let e = pd.create_srq(srq_wr).build().unwrap_err();
    assert_verb(
        &e,
        "ibv_create_srq",
        &[&format!("max_wr {srq_wr}"), "max_srq_wr"],
    );
    let srq_sge = above(d.max_srq_sge(), "max_srq_sge");
    let e = pd.create_srq(16).max_sge(srq_sge).build().unwrap_err();
    assert_verb(
        &e,
        "ibv_create_srq",
        &[&format!("max_sge {srq_sge}"), "max_srq_sge"],
    );
}

#[test]
#[ignore = "needs an RDMA device"]
fn out_of_range_connect_values_are_refused_before_any_step() {
    let dev = device();
    let pd = dev.ctx.alloc_pd().unwrap();
    let cq = dev.ctx.create_cq(256).build().unwrap();
    let opts = || ConnectOptions::new(dev.port).gid_index(dev.gid_index);
    let (qp, me) = rc_qp(&dev, &pd, &cq);
    let wide_qpn = Endpoint {
        qp_num: rdma_verbs::qp::QpNumber(1 << 24),
        ..me
    };
    let wide_psn = Endpoint { psn: 1 << 24, ..me };
    // (field, value given, largest value it holds)
    type Case<'a> = (
        &'a str,
        u64,
        u64,
        &'a Endpoint,
        &'a Endpoint,
        ConnectOptions,
    );
    let cases: [Case; 8] = [
        ("local PSN", 1 << 24, 0xFF_FFFF, &wide_psn, &me, opts()),
        ("remote PSN", 1 << 24, 0xFF_FFFF, &me, &wide_psn, opts()),
        (
            "remote QP number",
            1 << 24,
            0xFF_FFFF,
            &me,
            &wide_qpn,
            opts(),
        ),
        ("timeout", 32, 31, &me, &me, opts().timeout(32)),
        ("retry_cnt", 8, 7, &me, &me, opts().retry_cnt(8)),
        ("rnr_retry", 8, 7, &me, &me, opts().rnr_retry(8)),
        ("min_rnr_timer", 32, 31, &me, &me, opts().min_rnr_timer(32)),
        ("service level", 16, 15, &me, &me, opts().sl(16)),
    ];
    for (what, value, max, local, remote, o) in cases {
        let e = qp.connect(local, remote, &o).unwrap_err();
        assert!(
            matches!(e, Error::OutOfRange { what: w, value: v, max: m }
                if w == what && v == value && m == max),
            "{what}: {e:?}"
        );
        assert_eq!(qp.state().unwrap(), QpState::Reset, "{what}");
    }
    // The local endpoint must be this queue pair's (its PSN is what the
    // peer expects from it).
    let (other, theirs) = rc_qp(&dev, &pd, &cq);
    match qp.connect(&theirs, &me, &opts()) {
        Err(Error::NotThisQueuePair { qp_num, endpoint }) => {
            assert_eq!((qp_num, endpoint), (qp.qp_num(), other.qp_num()))
        }
        other => panic!("expected NotThisQueuePair, got {other:?}"),
    }
    assert_eq!(qp.state().unwrap(), QpState::Reset);
    // A UD queue pair cannot be connected, an RC one not activated as UD.
    let ud = pd.create_qp(QpType::Ud, &cq, &cq).build().unwrap();
    let e = ud.connect(&me, &me, &opts()).unwrap_err();
    assert!(
        matches!(
            e,
            Error::WrongQpType {
                what: "connect",
                qp_type: QpType::Ud
            }
        ),
        "{e:?}"
    );
    let e = qp.activate_ud(dev.port, 1, 0).unwrap_err();
    assert!(
        matches!(
            e,
            Error::WrongQpType {
                what: "activate_ud",
                qp_type: QpType::Rc
            }
        ),
        "{e:?}"
    );
    let e = ud.activate_ud(dev.port, 1, 1 << 24).unwrap_err();
    assert!(
        matches!(
            e,
            Error::OutOfRange {
                what: "PSN",
                value: 0x100_0000,
                ..
            }
        ),
        "{e:?}"
    );
    // Everything refused, nothing changed: the QP still connects.
    qp.connect(&me, &me, &opts()).unwrap();
    assert_eq!(qp.state().unwrap(), QpState::Rts);
}

/// Asserts that a send on `qp` in `state` is refused (the send queue's
/// handle is not handed out before RTS), handing the request back, and
/// that no slot stays taken.
#[track_caller]
fn send_refused(qp: &QueuePair, pd: &ProtectionDomain, state: QpState) {
    let e = qp.send_queue().unwrap_err();
    assert!(
        matches!(e, Error::NotReadyToSend { state: s } if s == state),
        "in {state:?}: {e:?}"
    );
    assert!(e.to_string().contains("RTS"), "{e}");
    // A post (through a handle taken for it) is refused the same way, its
    // buffer back.
    let e =
        common::post_send(qp, SendRequest::send(filled(pd, b"refused!")).wr_id(666)).unwrap_err();
    assert!(
        matches!(e.error, Error::NotReadyToSend { state: s } if s == state),
        "in {state:?}: {:?}",
        e.error
    );
    assert_eq!(e.buf.total_len(), 8);
    let e = common::post_send(qp, SendRequest::send_inline(b"inline!!").wr_id(667)).unwrap_err();
    assert!(
        matches!(e.error, Error::NotReadyToSend { state: s } if s == state),
        "in {state:?}: {:?}",
        e.error
    );
    assert_eq!(qp.send_outstanding(), 0);
}

#[test]
#[ignore = "needs an RDMA device"]
fn sends_before_rts_are_refused_and_never_run_later() {
    let dev = device();
    let pd = dev.ctx.alloc_pd().unwrap();
    let cq = dev.ctx.create_cq(256).build().unwrap();
    let qp = pd
        .create_qp(QpType::Rc, &cq, &cq)
        .max_send_wr(8)
        .max_inline_data(16)
        .build()
        .unwrap();

    // RESET: no sends; receives are refused too (IBA C10-97.2.1; rxe
    // checks it, some providers accept them).
    send_refused(&qp, &pd, QpState::Reset);
    // (The receive queue's handle, taken for this one post, is gone before
    // the reset below: a live one would refuse it.)
    let posted = qp
        .recv_queue()
        .unwrap()
        .recv(pd.alloc(8, local()).unwrap(), 0);
    match posted {
        Err(e) => {
            assert_verb(&e.error, "ibv_post_recv", &["RESET", "INIT"]);
            assert_eq!(e.error.raw_os_error(), Some(libc::EINVAL));
            assert_eq!(e.buf.len(), 8);
            assert_eq!(qp.recv_outstanding(), 0);
        }
        Ok(()) if !common::is_rxe(&dev) => {
            eprintln!("this provider accepts receives in RESET (out of spec)");
            qp.reset().unwrap(); // discards it
        }
        Ok(()) => panic!("rxe accepted a receive in RESET"),
    }

    // INIT: receives are legal (IBA), sends are not.
    qp.to_init(dev.port, 0, local()).unwrap();
    send_refused(&qp, &pd, QpState::Init);
    let mut rq = qp.recv_queue().unwrap();
    rq.recv(pd.alloc(16, local()).unwrap(), 10).unwrap();
    assert_eq!(qp.recv_outstanding(), 1);

    // RTR: still no sends.
    let me = common::endpoint(&dev, &qp, 0x77);
    let opts = ConnectOptions::new(dev.port).gid_index(dev.gid_index);
    qp.to_rtr(&me, &opts).unwrap();
    send_refused(&qp, &pd, QpState::Rtr);

    // RTS: the first send lands in the receive posted in INIT, and none of
    // the refused sends ever runs (exactly two completions).
    qp.to_rts(0x77, &opts).unwrap();
    let mut sq = qp.send_queue().unwrap();
    sq.send_inline(b"fresh", Wr::id(20)).unwrap();
    let mut got = wait(&cq, 2);
    got.sort_by_key(|c| c.wr_id());
    for c in &got {
        c.result().unwrap_or_else(|e| panic!("{e}: {c:?}"));
    }
    assert_eq!(got[0].wr_id(), 10);
    assert_eq!(got[0].byte_len(), 5);
    assert_eq!(&got[0].take_local().unwrap()[..5], b"fresh");
    assert_eq!((got[1].wr_id(), got[1].opcode()), (20, WcOpcode::Send));
    common::assert_quiet(&cq);
}

#[test]
#[ignore = "needs an RDMA device"]
fn rxe_runs_a_send_it_refused_once_the_qp_is_ready() {
    // Why the library refuses sends before RTS itself: rxe writes the
    // request into its send queue, then fails the doorbell (EINVAL), and
    // runs the request when the QP can send. Shown with the raw path and
    // inline data, so no buffer is at stake.
    let dev = device();
    if !common::is_rxe(&dev) {
        eprintln!("UNSUPPORTED on this device: rxe-specific check");
        return;
    }
    let pd = dev.ctx.alloc_pd().unwrap();
    let cq = dev.ctx.create_cq(256).build().unwrap();
    let qp = pd
        .create_qp(QpType::Rc, &cq, &cq)
        .max_inline_data(16)
        .build()
        .unwrap();
    qp.to_init(dev.port, 0, local()).unwrap();
    let data = *b"stale!!!";
    let mut sge = sys::ibv_sge {
        addr: data.as_ptr() as u64,
        length: data.len() as u32,
        lkey: 0,
    };
    let mut wr = sys::ibv_send_wr {
        wr_id: 0x1234,
        sg_list: &mut sge,
        num_sge: 1,
        opcode: sys::IBV_WR_SEND,
        send_flags: sys::ibv_send_flags::IBV_SEND_INLINE.0
            | sys::ibv_send_flags::IBV_SEND_SIGNALED.0,
        ..Default::default()
    };
    // SAFETY: inline data is copied during the call; wr_id bit 63 clear;
    // the chain is one request.
    let e = unsafe { qp.post_send_raw(&mut wr) }.unwrap_err();
    assert_verb(&e, "ibv_post_send", &[]);
    let me = common::endpoint(&dev, &qp, 0x99);
    let opts = ConnectOptions::new(dev.port).gid_index(dev.gid_index);
    qp.to_rtr(&me, &opts).unwrap();
    qp.to_rts(0x99, &opts).unwrap();
    let (mut sq, mut rq) = (qp.send_queue().unwrap(), qp.recv_queue().unwrap());
    for i in 0..2 {
        rq.recv(pd.alloc(16, local()).unwrap(), i).unwrap();
    }
    sq.send_inline(b"fresh", Wr::id(7)).unwrap();
    let mut got = wait(&cq, 4);
    let stale = got.iter().position(|c| c.is_orphan()).unwrap_or_else(|| {
        panic!("the refused raw send did not run after all: {got:?}");
    });
    assert_eq!(got[stale].wr_id(), 0x1234);
    assert!(got[stale].is_success(), "{:?}", got[stale]);
    let first = got
        .iter_mut()
        .find(|c| c.wr_id() == 0)
        .expect("the first receive");
    assert_eq!(&first.take_local().unwrap()[..8], b"stale!!!");
    common::assert_quiet(&cq);
}

#[test]
#[ignore = "needs an RDMA device"]
fn revoked_rkey_is_a_remote_access_error() {
    let p = pair(QpType::Rc, remote_all(), |b| b);
    let target = p.pd.alloc_shared(64, remote_all()).unwrap();
    let remote = target.remote().unwrap();
    // Any handle keeps the region registered: the key still works.
    let mr = target.memory_region();
    drop(target);
    let mut sq = p.a.send_queue().unwrap();
    sq.write(filled(&p.pd, &[1; 8]), remote, Wr::id(1)).unwrap();
    assert_eq!(wait_ok(&p.cq_a).wr_id(), 1);
    // The last handle gone, the region is deregistered and its rkey revoked.
    drop(mr);
    sq.write(filled(&p.pd, &[2; 8]), remote, Wr::id(2)).unwrap();
    let mut c = wait(&p.cq_a, 1).pop().unwrap();
    assert_eq!(
        (c.wr_id(), c.status()),
        (2, WcStatus::RemAccessErr),
        "{c:?}"
    );
    let e = c.result().unwrap_err();
    assert!(
        matches!(
            e,
            Error::WorkCompletion {
                status: WcStatus::RemAccessErr,
                wr_id: 2,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("remote access error"), "{e}");
    assert_eq!(
        &c.take_local().unwrap()[..],
        &[2; 8],
        "the buffer comes back"
    );
    assert_eq!(p.a.state().unwrap(), QpState::Err);
}

const GRH: usize = 40;
const QKEY: u32 = 0x0bad_cafe;

#[test]
#[ignore = "needs an RDMA device"]
fn ud_messages_longer_than_the_mtu_are_refused() {
    let dev = device();
    let pd = dev.ctx.alloc_pd().unwrap();
    let cq_a = dev.ctx.create_cq(256).build().unwrap();
    let cq_b = dev.ctx.create_cq(256).build().unwrap();
    let a = pd
        .create_qp(QpType::Ud, &cq_a, &cq_a)
        .max_send_sge(2)
        .build()
        .unwrap();
    let b = pd.create_qp(QpType::Ud, &cq_b, &cq_b).build().unwrap();
    a.activate_ud(dev.port, QKEY, 1).unwrap();
    b.activate_ud(dev.port, QKEY, 2).unwrap();
    let port_attr = dev.ctx.query_port(dev.port).unwrap();
    let mtu = port_attr.active_mtu().bytes() as usize;
    let to_b = common::endpoint(&dev, &b, 0);
    let ah: AddressHandle = pd
        .create_ah(&AddressVector::for_port(&port_attr, &to_b, dev.gid_index).unwrap())
        .unwrap();
    assert_eq!(ah.port_mtu() as usize, mtu);
    let (mut sq, mut rq) = (a.send_queue().unwrap(), b.recv_queue().unwrap());
    let dest = UdDest::new(&ah, b.qp_num(), QKEY);

    // Exactly the MTU: delivered.
    let data = pattern(mtu, 3);
    rq.recv(pd.alloc(GRH + 2 * mtu, local()).unwrap(), 1)
        .unwrap();
    sq.send_to(filled(&pd, &data), &dest, Wr::id(0)).unwrap();
    let mut r = wait_ok(&cq_b);
    assert_eq!(r.byte_len() as usize, GRH + mtu);
    assert!(r.take_local().unwrap()[GRH..GRH + mtu] == data[..]);
    wait_ok(&cq_a);

    // One byte more, in one buffer or gathered: refused before posting.
    let too_long = |e: &Error| {
        matches!(e, Error::UdMessageTooLong { len, mtu: m }
            if *len as usize == mtu + 1 && *m as usize == mtu)
    };
    let e = sq
        .send_to(filled(&pd, &pattern(mtu + 1, 4)), &dest, Wr::id(0))
        .unwrap_err();
    assert!(too_long(&e.error), "{:?}", e.error);
    assert_eq!(e.buf.len(), mtu + 1);
    let sgl = vec![
        filled(&pd, &pattern(mtu, 5)).into(),
        filled(&pd, &[9]).into(),
    ];
    let e = sq.send_sgl_to(sgl, &dest, Wr::id(0)).unwrap_err();
    assert!(too_long(&e.error), "{:?}", e.error);
    assert_eq!(e.buf.len(), 2, "both buffers back");
    assert_eq!(a.send_outstanding(), 0);
    common::assert_quiet(&cq_a);

    // What the device does with such a datagram (raw path, which skips the
    // check): per IBA C10-93.1.1 it sends nothing and reports success, so
    // the receiver never learns of it.
    let big = filled(&pd, &pattern(mtu + 1, 6));
    let mut sge = sys::ibv_sge {
        addr: big.addr(),
        length: big.len() as u32,
        lkey: big.lkey(),
    };
    let mut wr = sys::ibv_send_wr {
        wr_id: 0x5150,
        sg_list: &mut sge,
        num_sge: 1,
        opcode: sys::IBV_WR_SEND,
        send_flags: sys::ibv_send_flags::IBV_SEND_SIGNALED.0,
        ..Default::default()
    };
    wr.wr.ud = sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_3 {
        ah: ah.as_ptr(),
        remote_qpn: b.qp_num().0,
        remote_qkey: QKEY,
    };
    rq.recv(pd.alloc(GRH + 2 * mtu, local()).unwrap(), 2)
        .unwrap();
    // SAFETY: `big` is registered in the QP's PD and neither read, written
    // nor dropped until the completion below; `ah` outlives the request;
    // wr_id bit 63 is clear; one request.
    unsafe { a.post_send_raw(&mut wr) }.unwrap();
    let c = wait(&cq_a, 1).pop().unwrap();
    assert_eq!(c.wr_id(), 0x5150);
    drop(big);
    if common::is_rxe(&dev) {
        assert!(c.is_success(), "rxe: {c:?}");
        common::assert_quiet(&cq_b);
        assert_eq!(b.recv_outstanding(), 1, "nothing was delivered");
    } else {
        eprintln!("a UD send longer than the MTU completed with {c:?} on this device");
    }
}
