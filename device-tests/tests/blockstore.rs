//! The block store workload (`tools/examples/blockstore.rs`) as processes on the
//! test device over 127.0.0.1 (device tests, run by `cargo xtask test`
//! inside the SoftRoCE VM): honest clients print their three phase lines
//! and `VERIFIED`, the server re-checks every block and prints `VERIFIED`.
//! Hostile clients, written here with the library, send garbage instead of
//! an endpoint, leave early, and read and write outside what they were
//! granted: every such access must fail on the device, the server must go
//! on serving and its final check of the whole store must pass.
//!
//! The example binary lies next to this test's executable
//! (`target/<profile>/examples/`; `cargo xtask test` builds it). Every
//! child process is killed when its handle drops and every wait is bounded.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::example_bin;
use common::process::{self, device_args, Finished, Running};
use rdma_verbs::{
    AccessFlags, CompletionQueue, ConnectOptions, Endpoint, LocalPort, ProtectionDomain, QpType,
    QueuePair, RemoteMemory, WcStatus, Wr,
};

/// Longest any process may run.
const PROCESS_BOUND: Duration = Duration::from_secs(240);
const BLOCK: u64 = 4096;

fn args(list: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = list.iter().map(|s| s.to_string()).collect();
    v.extend(device_args());
    v
}

fn server(port: u16, blocks: usize, clients: usize) -> Running {
    let (p, b, c) = (port.to_string(), blocks.to_string(), clients.to_string());
    let a = args(&["server", "-p", &p, "--blocks", &b, "--clients", &c]);
    process::spawn(&example_bin("blockstore"), &a)
}

fn client(port: u16, depth: usize, ops: usize, ratio: &str) -> Running {
    let (p, q, n) = (port.to_string(), depth.to_string(), ops.to_string());
    let a = args(&[
        "client",
        "127.0.0.1",
        "-p",
        &p,
        "-q",
        &q,
        "-n",
        &n,
        "--write-ratio",
        ratio,
    ]);
    process::spawn(&example_bin("blockstore"), &a)
}

/// Every process succeeded, ended with `VERIFIED`; clients printed the
/// three phase lines of the output contract.
fn check_all(done: &[Finished]) {
    let all = done
        .iter()
        .map(Finished::describe)
        .collect::<Vec<_>>()
        .join("\n");
    for f in done {
        println!("--- {}\n{}", f.label, f.stdout); // shown with --show-output
        assert!(f.success(), "{} failed\n{all}", f.label);
        let last = f.stdout.lines().last().unwrap_or("");
        assert!(
            last.starts_with("VERIFIED"),
            "{}: no final VERIFIED\n{all}",
            f.label
        );
        if f.label.contains(" client ") {
            for phase in ["random", "mixed", "sweep"] {
                let line = f
                    .stdout
                    .lines()
                    .find(|l| l.starts_with(&format!("{phase}: ")))
                    .unwrap_or_else(|| panic!("{}: no {phase} line\n{all}", f.label));
                let w: Vec<&str> = line.split_whitespace().collect();
                assert_eq!(
                    (w[1], w[3], w[5], w[7], w[9], w[11], w[12], w[14]),
                    ("ops", "depth", "IOPS", "MiB/s", "p50", "us", "p99", "us"),
                    "{line}"
                );
                for i in [2, 4, 6, 8, 10, 13] {
                    assert!(w[i].parse::<f64>().is_ok(), "{line}: {:?}", w[i]);
                }
            }
        }
    }
}

#[test]
#[ignore = "needs an RDMA device"]
fn blockstore_server_and_two_clients() {
    let port = 19400;
    let s = server(port, 512, 2);
    let a = client(port, 16, 3000, "0.5");
    let b = client(port, 1, 1000, "1");
    let done = [
        a.finish(PROCESS_BOUND),
        b.finish(PROCESS_BOUND),
        s.finish(PROCESS_BOUND),
    ];
    check_all(&done);
}

#[test]
#[ignore = "needs an RDMA device"]
fn blockstore_read_only_mix() {
    // --write-ratio 0: the mixed phase reads blocks nobody wrote yet.
    let port = 19410;
    let s = server(port, 64, 1);
    let a = client(port, 4, 500, "0");
    check_all(&[a.finish(PROCESS_BOUND), s.finish(PROCESS_BOUND)]);
}

// ---------------------------------------------------------------------------
// Hostile clients, with the library.
// ---------------------------------------------------------------------------

/// A client that got through the exchange and holds a range.
struct Intruder {
    qp: QueuePair,
    cq: CompletionQueue,
    pd: ProtectionDomain,
    tcp: TcpStream,
    /// The whole store (read key) and the granted range (window key).
    store: RemoteMemory,
    own: RemoteMemory,
}

/// Connects like an honest client: exchange, connect, the window's key.
/// Retries while the server has no free range yet (the previous intruder's
/// may not be back yet) and until the server listens.
fn intrude(port: u16) -> Intruder {
    let dev = common::device();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        assert!(Instant::now() < deadline, "no grant from the server");
        let Ok(mut tcp) = TcpStream::connect(("127.0.0.1", port)) else {
            std::thread::sleep(Duration::from_millis(100));
            continue;
        };
        let pd = dev.ctx.alloc_pd().unwrap();
        let cq = dev.ctx.create_cq(16).build().unwrap();
        let qp = pd
            .create_qp(QpType::Rc, &cq, &cq)
            .max_send_wr(8)
            .max_recv_wr(1)
            .build()
            .unwrap();
        let local = LocalPort::query(&dev.ctx, dev.port, Some(dev.gid_index)).unwrap();
        let opts = ConnectOptions::new(dev.port)
            .local_port(&local)
            .rd_atomic(16);
        let me = local.endpoint(&qp, Endpoint::random_psn()).unwrap();
        let peer =
            rdma_verbs_runtime::exchange(&mut tcp, &me, &[], Duration::from_secs(10)).unwrap();
        qp.connect(&me, &peer.endpoint, &opts).unwrap();
        let store = RemoteMemory::from_bytes(&peer.private[..RemoteMemory::WIRE_LEN]).unwrap();
        let mut grant = [0u8; RemoteMemory::WIRE_LEN];
        tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        if tcp.read_exact(&mut grant).is_err() {
            // No free range: the server hung up. Try again.
            std::thread::sleep(Duration::from_millis(200));
            continue;
        }
        let own = RemoteMemory::from_bytes(&grant).unwrap();
        return Intruder {
            qp,
            cq,
            pd,
            tcp,
            store,
            own,
        };
    }
}

impl Intruder {
    /// One 4 KiB write of 0xEE bytes (or a read) at `addr` with `key`'s
    /// rkey; the completion's status.
    fn access(&self, write: bool, key: RemoteMemory, addr: u64) -> WcStatus {
        let to = RemoteMemory {
            addr,
            len: BLOCK,
            rkey: key.rkey,
        };
        let mut buf = self
            .pd
            .alloc(BLOCK as usize, AccessFlags::LOCAL_WRITE)
            .unwrap();
        buf.fill(0xEE);
        let mut sq = self.qp.send_queue().unwrap();
        match write {
            true => sq.write(buf, to, Wr::id(1)).unwrap(),
            false => sq.read(buf, to, Wr::id(1)).unwrap(),
        }
        drop(sq);
        common::wait(&self.cq, 1).pop().unwrap().status()
    }
}

/// A hostile client's access outside what it was granted: must fail on the
/// device (a remote access error ends its queue pair; the next attack
/// connects again).
fn refused(port: u16, what: &str, write: bool, pick: impl Fn(&Intruder) -> (RemoteMemory, u64)) {
    let i = intrude(port);
    let (key, addr) = pick(&i);
    let status = i.access(write, key, addr);
    assert_ne!(
        status,
        WcStatus::Success,
        "{what}: the device let a client {} at {addr:#x} (store {:#x}+{:#x}, own {:#x}+{:#x})",
        if write { "write" } else { "read" },
        i.store.addr,
        i.store.len,
        i.own.addr,
        i.own.len
    );
    eprintln!("{what}: refused with {status:?}");
}

#[test]
#[ignore = "needs an RDMA device"]
fn blockstore_survives_hostile_clients() {
    let port = 19420;
    let s = server(port, 256, 2);
    // An honest client works through all of it.
    let a = client(port, 8, 4000, "0.5");

    // Garbage instead of an endpoint exchange: a stranger's bytes, then a
    // message with the right magic and an absurd private length.
    for garbage in [
        b"GET / HTTP/1.1\r\nHost: blockstore\r\n\r\n".to_vec(),
        [&b"IBVX\x01"[..], &[0xff; 4], &[0u8; 64]].concat(),
    ] {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut tcp = loop {
            match TcpStream::connect(("127.0.0.1", port)) {
                Ok(t) => break t,
                Err(e) => assert!(Instant::now() < deadline, "server not listening: {e}"),
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        tcp.write_all(&garbage).unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        // The server sends its own message, then hangs up on ours.
        let mut rest = Vec::new();
        let _ = tcp.read_to_end(&mut rest);
    }

    // Leaves right after the exchange, before any I/O.
    drop(intrude(port));
    // Leaves with reads in flight.
    {
        let i = intrude(port);
        let mut sq = i.qp.send_queue().unwrap();
        for b in 0..4 {
            let buf =
                i.pd.alloc(BLOCK as usize, AccessFlags::LOCAL_WRITE)
                    .unwrap();
            let from = i.store.slice(b * BLOCK, BLOCK).unwrap();
            sq.read(buf, from, Wr::id(0)).unwrap();
        }
        drop(sq);
        drop(i);
    }
    // Leaves without saying it finished (TCP shut down, queue pair alive).
    {
        let i = intrude(port);
        assert_eq!(i.access(false, i.store, i.store.addr), WcStatus::Success);
        i.tcp.shutdown(std::net::Shutdown::Both).unwrap();
        std::thread::sleep(Duration::from_millis(200));
    }

    // Out of range: past its own range, before it (another client's
    // blocks or the read-only ones), the read-only blocks with either key,
    // past the end of the store.
    refused(port, "write past own range", true, |i| {
        (i.own, i.own.addr + i.own.len)
    });
    refused(port, "write before own range", true, |i| {
        (i.own, i.own.addr - BLOCK)
    });
    refused(port, "write read-only block, window key", true, |i| {
        (i.own, i.store.addr)
    });
    refused(port, "write read-only block, store key", true, |i| {
        (i.store, i.store.addr)
    });
    refused(port, "write own range, store key", true, |i| {
        (i.store, i.own.addr)
    });
    refused(port, "read past the store", false, |i| {
        (i.store, i.store.addr + i.store.len)
    });
    refused(port, "read before the store", false, |i| {
        (i.store, i.store.addr - BLOCK)
    });

    // A second honest client after all that; then the server checks the
    // whole store.
    let b = client(port, 16, 2000, "0.7");
    let done = [
        a.finish(PROCESS_BOUND),
        b.finish(PROCESS_BOUND),
        s.finish(PROCESS_BOUND),
    ];
    check_all(&done);
    let server_log = &done[2].stderr;
    assert!(
        server_log.contains("refused"),
        "the server reported no refused client\n{server_log}"
    );
}
