//! Shared helpers for the device tests.
//!
//! Device tests are `#[ignore = "needs an RDMA device"]`: on a host without
//! RDMA they are listed as ignored, never passed vacuously. `cargo xtask
//! test` runs them with `--ignored` inside the SoftRoCE VM (or on this host
//! with `--no-vm`), and there a missing device is a failure.
#![allow(dead_code)]

pub mod process;
pub mod traffic;

use rdma_verbs::{
    device::{GidIndex, PortState},
    Context, PortNumber,
};

/// The device under test.
pub struct TestDevice {
    pub ctx: Context,
    pub port: PortNumber,
    pub gid_index: GidIndex,
}

/// Opens the device named by `IBVERBS_TEST_DEVICE`, or the first device
/// with an active port. Panics (fails the test) when there is none.
pub fn device() -> TestDevice {
    let list = rdma_verbs::devices().unwrap_or_else(|e| panic!("no RDMA device list: {e}"));
    let wanted = std::env::var("IBVERBS_TEST_DEVICE").ok();
    for dev in list.iter() {
        if let Some(name) = &wanted {
            if dev.name() != name {
                continue;
            }
        }
        let ctx = dev
            .open()
            .unwrap_or_else(|e| panic!("opening {}: {e}", dev.name()));
        let Ok(port) = ctx.active_port() else {
            if wanted.is_some() {
                panic!("{} has no active port", dev.name());
            }
            continue;
        };
        assert_eq!(ctx.query_port(port).unwrap().state(), PortState::Active);
        let gid_index = ctx.default_gid_index(port).expect("GID table");
        return TestDevice {
            ctx,
            port,
            gid_index,
        };
    }
    panic!(
        "no usable RDMA device (IBVERBS_TEST_DEVICE={wanted:?}; found {:?}). \
         Device tests need a device: run them with `cargo xtask test`.",
        list.iter().map(|d| d.name().to_owned()).collect::<Vec<_>>()
    );
}

/// Reports a capability the device lacks, by name, and says whether to go on.
/// The message is printed so that a skipped check is visible in the log.
pub fn unsupported(what: &str, err: &rdma_verbs::Error) {
    eprintln!("UNSUPPORTED on this device: {what}: {err}");
}

use std::time::{Duration, Instant};

use rdma_verbs::{
    memory::SgList,
    qp::{QueuePairBuilder, Refused, SharedReceiveQueue},
    AccessFlags, Completion, CompletionQueue, Completions, ConnectOptions, Endpoint, LocalPort,
    ProtectionDomain, QpType, QueuePair, RecvRequest, SendRequest,
};

/// Two queue pairs of one device connected to each other (traffic takes
/// rxe's loopback through the device's own GID), each with its own CQ.
pub struct Pair {
    pub dev: TestDevice,
    pub pd: ProtectionDomain,
    pub cq_a: CompletionQueue,
    pub cq_b: CompletionQueue,
    pub a: QueuePair,
    pub b: QueuePair,
}

/// Connect options for the test device: its port and GID index, with
/// `access` remote rights.
pub fn options(dev: &TestDevice, access: AccessFlags) -> ConnectOptions {
    ConnectOptions::new(dev.port)
        .gid_index(dev.gid_index)
        .remote_access(access)
}

/// The endpoint of `qp` on the test port and GID (of `qp`'s own device
/// context, which may be another than `dev.ctx`), sending from `psn`.
pub fn endpoint(dev: &TestDevice, qp: &QueuePair, psn: u32) -> Endpoint {
    LocalPort::query(qp.pd().context(), dev.port, Some(dev.gid_index))
        .unwrap()
        .endpoint(qp, psn)
        .unwrap()
}

/// An RC (or UC) pair; `tune` adjusts both QPs' builders.
pub fn pair(
    qp_type: QpType,
    access: AccessFlags,
    tune: impl Fn(QueuePairBuilder<'_>) -> QueuePairBuilder<'_>,
) -> Pair {
    let dev = device();
    let pd = dev.ctx.alloc_pd().unwrap();
    let cq_a = dev.ctx.create_cq(256).build().unwrap();
    let cq_b = dev.ctx.create_cq(256).build().unwrap();
    let a = tune(pd.create_qp(qp_type, &cq_a, &cq_a)).build().unwrap();
    let b = tune(pd.create_qp(qp_type, &cq_b, &cq_b)).build().unwrap();
    connect_pair(&dev, &a, &b, access);
    Pair {
        dev,
        pd,
        cq_a,
        cq_b,
        a,
        b,
    }
}

/// An RC pair created through `ibv_create_qp_ex` with `ops` (inline up
/// to 64 bytes), each on its own extended CQ (`CompletionFields::standard`).
pub fn ex_pair(ops: rdma_verbs::qp::SendOpFlags) -> Pair {
    let dev = device();
    let pd = dev.ctx.alloc_pd().unwrap();
    let cq = || {
        dev.ctx
            .create_cq(256)
            .wc_fields(rdma_verbs::cq::CompletionFields::standard())
            .build()
            .unwrap()
    };
    let (cq_a, cq_b) = (cq(), cq());
    let qp = |cq: &CompletionQueue| {
        pd.create_qp(QpType::Rc, cq, cq)
            .max_inline_data(64)
            .send_ops(ops)
            .build()
            .unwrap()
    };
    let (a, b) = (qp(&cq_a), qp(&cq_b));
    connect_pair(&dev, &a, &b, remote_all());
    Pair {
        dev,
        pd,
        cq_a,
        cq_b,
        a,
        b,
    }
}

/// An RC queue pair `depth` deep both ways whose CQ reports to its own
/// completion channel (for `AsyncQueuePair`).
pub fn channel_qp(dev: &TestDevice, pd: &ProtectionDomain, depth: u32) -> QueuePair {
    let channel = dev.ctx.create_comp_channel().unwrap();
    let cq = dev
        .ctx
        .create_cq(2 * depth)
        .channel(&channel)
        .build()
        .unwrap();
    pd.create_qp(QpType::Rc, &cq, &cq)
        .max_send_wr(depth)
        .max_recv_wr(depth)
        .build()
        .unwrap()
}

/// An RC queue pair `depth` deep both ways on its own CQ (no channel).
pub fn plain_qp(dev: &TestDevice, pd: &ProtectionDomain, depth: u32) -> QueuePair {
    let cq = dev.ctx.create_cq(2 * depth).build().unwrap();
    pd.create_qp(QpType::Rc, &cq, &cq)
        .max_send_wr(depth)
        .max_recv_wr(depth)
        .build()
        .unwrap()
}

/// A sender connected to a receiver that takes its messages from an SRQ
/// holding 8 receives of 64 bytes, its limit armed at 4: six sends from
/// `sender` make the SRQ raise `IBV_EVENT_SRQ_LIMIT_REACHED`.
pub struct SrqWithLimit {
    pub pd: ProtectionDomain,
    pub cq: CompletionQueue,
    pub srq: rdma_verbs::qp::SharedReceiveQueue,
    pub sender: QueuePair,
    pub receiver: QueuePair,
}

/// Builds [`SrqWithLimit`] on `dev` (one CQ of 256 for everything).
pub fn srq_with_limit(dev: &TestDevice) -> SrqWithLimit {
    let pd = dev.ctx.alloc_pd().unwrap();
    let cq = dev.ctx.create_cq(256).build().unwrap();
    let srq = pd.create_srq(16).build().unwrap();
    let sender = pd.create_qp(QpType::Rc, &cq, &cq).build().unwrap();
    let receiver = pd
        .create_qp(QpType::Rc, &cq, &cq)
        .srq(&srq)
        .build()
        .unwrap();
    connect_pair(dev, &sender, &receiver, AccessFlags::LOCAL_WRITE);
    for _ in 0..8 {
        let buf = pd.alloc(64, AccessFlags::LOCAL_WRITE).unwrap();
        srq.recv_queue().unwrap().recv(buf, 0).unwrap();
    }
    srq.arm_limit(4).unwrap();
    SrqWithLimit {
        pd,
        cq,
        srq,
        sender,
        receiver,
    }
}

/// Connects two RC/UC queue pairs of `dev` to each other.
pub fn connect_pair(dev: &TestDevice, a: &QueuePair, b: &QueuePair, access: AccessFlags) {
    let opts = options(dev, access);
    let ea = endpoint(dev, a, 0x1000);
    let eb = endpoint(dev, b, 0x2000);
    a.connect(&ea, &eb, &opts).unwrap();
    b.connect(&eb, &ea, &opts).unwrap();
}

/// Polls `cq` until `n` completions arrived (10 s at most: then the test
/// fails). Takes exactly `n`, one at a time: a batch could take more, and
/// the ones beyond `n` (a send's completion behind a receive's) would be
/// lost to the caller's next wait.
pub fn wait(cq: &CompletionQueue, n: usize) -> Vec<Completion> {
    let mut out = Vec::with_capacity(n);
    let deadline = Instant::now() + Duration::from_secs(10);
    while out.len() < n {
        match cq.poll_one().unwrap() {
            Some(c) => out.push(c),
            None if Instant::now() > deadline => {
                panic!("timed out: {} of {n} completions: {out:?}", out.len())
            }
            None => {}
        }
    }
    out
}

/// Calls `poll` until it gives something (at most 10 s).
pub fn poll_until<T>(mut poll: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(got) = poll() {
            return got;
        }
        assert!(Instant::now() < deadline, "no completion");
    }
}

/// Polls `cq` until one completion arrived and checks its success.
pub fn wait_ok(cq: &CompletionQueue) -> Completion {
    let c = wait(cq, 1).pop().unwrap();
    c.result().unwrap_or_else(|e| panic!("{e}: {c:?}"));
    c
}

/// Asserts that nothing more arrives on `cq` for a short while.
pub fn assert_quiet(cq: &CompletionQueue) {
    std::thread::sleep(Duration::from_millis(50));
    let mut batch = Completions::with_capacity(4);
    let got: Vec<Completion> = cq
        .poll(&mut batch)
        .unwrap()
        .map(rdma_verbs::cq::CompletionRef::into_owned)
        .collect();
    assert!(got.is_empty(), "unexpected: {got:?}");
}

/// A deterministic test pattern.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// All remote rights.
pub fn remote_all() -> AccessFlags {
    AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_ATOMIC
}

/// Connects an RC/UC queue pair to itself (rxe loopback).
pub fn connect_self(dev: &TestDevice, qp: &QueuePair, access: AccessFlags) {
    let me = endpoint(dev, qp, 0x3000);
    qp.connect(&me, &me, &options(dev, access)).unwrap();
}

/// Whether the device is SoftRoCE (rxe reports vendor id 0xffffff).
pub fn is_rxe(dev: &TestDevice) -> bool {
    dev.ctx.query_device().unwrap().vendor_id() == 0x00ff_ffff
}

/// An example binary next to the running test executable
/// (`target/<profile>/examples/`; `cargo xtask test` builds them).
pub fn example_bin(name: &str) -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("test executable in target/<profile>/deps");
    let path = profile_dir.join("examples").join(name);
    assert!(
        path.is_file(),
        "{} is missing: build the examples first (`cargo build --examples`)",
        path.display()
    );
    path
}

/// A program from PATH (the C tools of rdma-core in the VM).
pub fn path_tool(name: &str) -> std::path::PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{name} is not on PATH"))
}

/// Runs `prog args` to completion within `limit` (killed after it), with
/// stdout and stderr captured: (success, stdout, stderr).
pub fn run_bounded(
    prog: &std::path::Path,
    args: &[&str],
    limit: Duration,
) -> std::thread::JoinHandle<(bool, String, String)> {
    let mut child = std::process::Command::new(prog)
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", prog.display()));
    std::thread::spawn(move || {
        use std::io::Read;
        let mut out = child.stdout.take().unwrap();
        let mut err = child.stderr.take().unwrap();
        let o = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = out.read_to_string(&mut s);
            s
        });
        let e = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = err.read_to_string(&mut s);
            s
        });
        let deadline = Instant::now() + limit;
        let status = loop {
            if let Some(st) = child.try_wait().unwrap() {
                break Some(st);
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let (o, mut e) = (o.join().unwrap(), e.join().unwrap());
        if status.is_none() {
            e.push_str("\n[killed: time limit]");
        }
        (status.is_some_and(|s| s.success()), o, e)
    })
}

/// The IPv4 address of the test device's port (its IPv4-mapped GID), for
/// rdma_cm tests.
pub fn device_ipv4(dev: &TestDevice) -> std::net::Ipv4Addr {
    let table = dev.ctx.gid_table().unwrap();
    table
        .iter()
        .filter(|e| e.port == dev.port)
        .find_map(|e| e.gid.to_ipv4_mapped())
        .unwrap_or_else(|| {
            panic!(
                "{} has no IPv4-mapped GID (RoCE v2 over IPv4)",
                dev.ctx.name()
            )
        })
}

/// Posts one send-queue request through a handle of `qp` taken for it
/// (`post_chain` of one): the refused request's buffers come back.
pub fn post_send(qp: &QueuePair, r: SendRequest<'_>) -> Result<(), Refused<SgList>> {
    let mut sq = match qp.send_queue() {
        Ok(sq) => sq,
        Err(error) => {
            return Err(Refused {
                error,
                buf: r.into_buffers(),
            })
        }
    };
    let mut one = vec![r];
    sq.post_chain(&mut one).map_err(|error| Refused {
        error,
        buf: one.pop().map(SendRequest::into_buffers).unwrap_or_default(),
    })
}

/// Posts one receive through a handle of `qp`'s receive queue taken for
/// it: the refused request's buffers come back.
pub fn post_recv(qp: &QueuePair, r: RecvRequest) -> Result<(), Refused<SgList>> {
    match qp.recv_queue() {
        Ok(mut rq) => post_recv_on(&mut rq, r),
        Err(error) => Err(Refused {
            error,
            buf: r.into_buffers(),
        }),
    }
}

/// Posts one receive to `srq` through a handle taken for it.
pub fn post_srq(srq: &SharedReceiveQueue, r: RecvRequest) -> Result<(), Refused<SgList>> {
    match srq.recv_queue() {
        Ok(mut rq) => post_recv_on(&mut rq, r),
        Err(error) => Err(Refused {
            error,
            buf: r.into_buffers(),
        }),
    }
}

fn post_recv_on(rq: &mut rdma_verbs::RecvQueue, r: RecvRequest) -> Result<(), Refused<SgList>> {
    let mut one = vec![r];
    rq.post_chain(&mut one).map_err(|error| Refused {
        error,
        buf: one.pop().map(RecvRequest::into_buffers).unwrap_or_default(),
    })
}

/// Polls `cq` once into `batch` and keeps what came, owned.
pub fn poll_owned(cq: &CompletionQueue, batch: &mut Completions) -> Vec<Completion> {
    cq.poll(batch)
        .unwrap()
        .map(rdma_verbs::cq::CompletionRef::into_owned)
        .collect()
}
