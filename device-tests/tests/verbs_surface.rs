//! The rest of the verbs surface (issue #22, item 8, part): port and
//! hardware counters read from sysfs, flow counters, ECE, device memory,
//! thread and parent domains. rxe has only the sysfs counters; for the
//! rest these tests check the capability and the library's refusal by
//! name (and, on a device that has the capability, that it works).

mod common;

use std::time::{Duration, Instant};

use common::{connect_pair, device, is_rxe, pair, remote_all, wait_ok, TestDevice};
use rdma_verbs::{
    device::{CounterDescription, CounterSource, PortCounters},
    qp::Ece,
    AccessFlags, Error, PortNumber, QpType, WcOpcode, Wr,
};

/// Reads the port's counters until `moved` holds for the change since
/// `before` (rxe caches `hw_counters/` for `lifespan` ms), 5 s at most.
fn counters_until(
    dev: &TestDevice,
    before: &PortCounters,
    moved: impl Fn(&PortCounters) -> bool,
) -> PortCounters {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let delta = dev.ctx.port_counters(dev.port).unwrap().delta(before);
        if moved(&delta) || Instant::now() > deadline {
            return delta;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The refusal of a verb the provider lacks: `Error::Verb` naming it with
/// `EOPNOTSUPP` (what libibverbs' stub for a missing op answers).
fn assert_refused_by_name<T: std::fmt::Debug>(result: rdma_verbs::Result<T>, verb: &str) {
    let e = result.expect_err("rxe has no such verb");
    assert_eq!(e.verb(), Some(verb), "{e:?}");
    assert_eq!(e.raw_os_error(), Some(libc::EOPNOTSUPP), "{e}");
    assert!(e.to_string().starts_with(verb), "{e}");
}

#[test]
#[ignore = "needs an RDMA device"]
fn surface_port_counters_move_with_traffic() {
    let p = pair(QpType::Rc, remote_all(), |b| b);
    let dev = &p.dev;
    let before = dev.ctx.port_counters(dev.port).unwrap();
    assert_eq!(before.port(), dev.port);
    assert!(!before.is_empty(), "no counters at all: {before:?}");
    for (source, name, value) in before.iter() {
        eprintln!("{source:?} {name} = {value}");
    }
    if is_rxe(dev) {
        // rxe publishes hw_counters/ only (no performance-management agent).
        assert_eq!(
            before.get_from(CounterSource::Standard, "port_xmit_packets"),
            None
        );
        for name in [
            "sent_pkts",
            "rcvd_pkts",
            "rcvd_rnr_err",
            "send_rnr_err",
            "rcvd_seq_err",
            "retry_exceeded_err",
            "completer_retry_err",
            "duplicate_request",
            "out_of_seq_request",
        ] {
            assert!(
                before.get_from(CounterSource::Hardware, name).is_some(),
                "{name} missing: {before:?}"
            );
        }
        assert_eq!(before.get("lifespan"), None, "a setting, not a counter");
    }
    assert!(before.packets_sent().is_some() && before.packets_received().is_some());

    // 8 writes of 64 KiB: at least 16 packets each at any MTU (≤ 4096),
    // each sent and received by this device (loopback).
    const LEN: usize = 64 * 1024;
    const WRITES: u64 = 8;
    let target = p.pd.alloc_shared(LEN, remote_all()).unwrap();
    let remote = target.remote().unwrap();
    let mut sq = p.a.send_queue().unwrap();
    for i in 0..WRITES {
        let src = p.pd.alloc(LEN, AccessFlags::LOCAL_WRITE).unwrap();
        sq.write(src, remote, Wr::id(i)).unwrap();
        let c = wait_ok(&p.cq_a);
        assert_eq!(c.opcode(), WcOpcode::RdmaWrite);
    }
    let least = WRITES * (LEN as u64).div_ceil(4096);
    let delta = counters_until(dev, &before, |d| {
        d.packets_sent().unwrap_or(0) >= least && d.packets_received().unwrap_or(0) >= least
    });
    eprintln!(
        "moved: {:?} packets sent, {:?} received, {:?} bytes sent",
        delta.packets_sent(),
        delta.packets_received(),
        delta.bytes_sent()
    );
    assert!(delta.packets_sent().unwrap() >= least, "{delta:?}");
    assert!(delta.packets_received().unwrap() >= least, "{delta:?}");
    if let Some(bytes) = delta.bytes_sent() {
        assert!(bytes >= WRITES * LEN as u64, "{delta:?}");
    }
    // Clean traffic on loopback: no retries, no sequence NAKs of ours
    // (other tests of this binary may run meanwhile, so nothing stricter).
    assert_eq!(delta.len(), before.len());
}

#[test]
#[ignore = "needs an RDMA device"]
fn surface_port_counters_count_rnr_naks() {
    // A send with no receive posted: the responder answers RNR NAK
    // (rnr_retry 7 retries for ever), the requester waits and resends;
    // the receive posted later lets it complete.
    let dev = device();
    let pd = dev.ctx.alloc_pd().unwrap();
    let cq_a = dev.ctx.create_cq(256).build().unwrap();
    let cq_b = dev.ctx.create_cq(256).build().unwrap();
    let a = pd.create_qp(QpType::Rc, &cq_a, &cq_a).build().unwrap();
    let b = pd.create_qp(QpType::Rc, &cq_b, &cq_b).build().unwrap();
    connect_pair(&dev, &a, &b, AccessFlags::LOCAL_WRITE);
    let before = dev.ctx.port_counters(dev.port).unwrap();
    a.send_queue()
        .unwrap()
        .send_inline(b"late receive", Wr::id(0))
        .unwrap();
    let delta = counters_until(&dev, &before, |d| {
        d.rnr_naks_sent().unwrap_or(0) >= 1 && d.rnr_naks_received().unwrap_or(0) >= 1
    });
    b.recv_queue()
        .unwrap()
        .recv(pd.alloc(64, AccessFlags::LOCAL_WRITE).unwrap(), 0)
        .unwrap();
    let mut got = wait_ok(&cq_b);
    assert_eq!(&got.take_local().unwrap()[..12], b"late receive");
    wait_ok(&cq_a);
    if is_rxe(&dev) {
        assert!(delta.rnr_naks_sent().unwrap() >= 1, "{delta:?}");
        assert!(delta.rnr_naks_received().unwrap() >= 1, "{delta:?}");
        assert_eq!(delta.retries_exceeded(), Some(0), "{delta:?}");
    } else {
        eprintln!("RNR counters on {}: {delta:?}", dev.ctx.name());
    }
}

#[test]
#[ignore = "needs an RDMA device"]
fn surface_port_counters_refuse_a_missing_port() {
    let dev = device();
    let ports = dev.ctx.query_device().unwrap().phys_port_cnt();
    let e = dev.ctx.port_counters(PortNumber(ports + 1)).unwrap_err();
    match &e {
        Error::Sysfs { path, io } => {
            assert!(
                path.ends_with(format!("{}/ports/{}", dev.ctx.name(), ports + 1)),
                "{path:?}"
            );
            assert_eq!(io.kind(), std::io::ErrorKind::NotFound);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
#[ignore = "needs an RDMA device"]
fn surface_flow_counters_refused_or_read() {
    let dev = device();
    match dev.ctx.create_counters() {
        Ok(mut counters) => {
            // A device with flow counters: define, read zeros (no flow).
            counters.define(0, CounterDescription::Packets).unwrap();
            counters.define(1, CounterDescription::Bytes).unwrap();
            let mut values = [u64::MAX; 2];
            counters.read(&mut values, false).unwrap();
            assert_eq!(values, [0, 0]);
        }
        Err(e) => {
            assert!(!is_rxe(&dev) || e.raw_os_error() == Some(libc::EOPNOTSUPP));
            assert_refused_by_name(Err::<(), _>(e), "ibv_create_counters");
        }
    }
}

#[test]
#[ignore = "needs an RDMA device"]
fn surface_ece_refused_by_name() {
    let p = pair(QpType::Rc, AccessFlags::LOCAL_WRITE, |b| b);
    if !is_rxe(&p.dev) {
        eprintln!("ECE on {}: {:?}", p.dev.ctx.name(), p.a.query_ece());
        return;
    }
    assert_refused_by_name(p.a.query_ece(), "ibv_query_ece");
    let ece = Ece {
        vendor_id: 0x00ff_ffff,
        options: 1,
    };
    assert_refused_by_name(p.a.set_ece(ece), "ibv_set_ece");
    // libibverbs itself refuses vendor 0, before the provider.
    assert_refused_by_name(p.a.set_ece(Ece::default()), "ibv_set_ece");
    // The queue pair is unharmed.
    p.b.recv_queue()
        .unwrap()
        .recv(p.pd.alloc(16, AccessFlags::LOCAL_WRITE).unwrap(), 0)
        .unwrap();
    p.a.send_queue()
        .unwrap()
        .send_inline(b"after ece", Wr::id(0))
        .unwrap();
    wait_ok(&p.cq_a);
    wait_ok(&p.cq_b);
}

#[test]
#[ignore = "needs an RDMA device"]
fn surface_device_memory_capability_checked() {
    let dev = device();
    let max = dev.ctx.query_device_ex().unwrap().max_dm_size();
    let supported = dev
        .ctx
        .query_device_ex()
        .unwrap()
        .supports(rdma_verbs::device::Feature::DeviceMemory);
    assert_eq!(supported, max > 0);
    if is_rxe(&dev) {
        assert_eq!(max, 0, "rxe has no device memory");
    }
    if max == 0 {
        match dev.ctx.alloc_dm(64, 0) {
            Err(Error::DeviceLacks { verb, capability }) => {
                assert_eq!(verb, "ibv_alloc_dm");
                assert!(capability.contains("max_dm_size"), "{capability}");
            }
            other => panic!("{other:?}"),
        }
        return;
    }
    let mut dm = dev.ctx.alloc_dm(64, 0).unwrap();
    let data: Vec<u8> = (0..64).collect();
    dm.copy_from_slice(0, &data).unwrap();
    let mut back = vec![0u8; 64];
    dm.copy_to_slice(0, &mut back).unwrap();
    assert_eq!(back, data);
    assert!(matches!(
        dm.copy_from_slice(8, &data),
        Err(Error::OutOfBounds {
            offset: 8,
            len: 64,
            size: 64
        })
    ));
}

#[test]
#[ignore = "needs an RDMA device"]
fn surface_thread_and_parent_domains_refused_or_allocated() {
    let dev = device();
    let pd = dev.ctx.alloc_pd().unwrap();
    match dev.ctx.alloc_td() {
        Ok(td) => {
            let parent = pd.alloc_parent_domain(Some(&td)).unwrap();
            assert!(parent.thread_domain().is_some());
            drop(td); // the parent domain keeps it
            drop(parent);
        }
        Err(e) => {
            assert_refused_by_name(Err::<(), _>(e), "ibv_alloc_td");
        }
    }
    let parent = pd.alloc_parent_domain(None);
    if is_rxe(&dev) {
        assert_refused_by_name(parent, "ibv_alloc_parent_domain");
    } else {
        eprintln!("parent domain on {}: {parent:?}", dev.ctx.name());
    }
    // The PD is unharmed.
    pd.alloc(64, AccessFlags::LOCAL_WRITE).unwrap();
}
