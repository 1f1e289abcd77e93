//! The ping-pong examples (`rc_pingpong`, `uc_pingpong`, `ud_pingpong`,
//! `srq_pingpong`) on a device against themselves, against rdma-core's C
//! tools in both directions, and against hostile peers. (Their wire format
//! and TCP exchange are tested on any host beside their code,
//! `tools/src/pingpong/wire.rs` and `exchange.rs`.)
//!
//! Device tests (`#[ignore = "needs an RDMA device"]`, run by
//!   `cargo xtask test` in the SoftRoCE VM) spawn the example binaries
//!   from `target/<profile>/examples/` (build them first with
//!   `cargo build --examples`; `cargo xtask test` does) and the C tools
//!   `ibv_*_pingpong` from `PATH`. Each run uses its own TCP port, every wait
//!   is bounded, and children are killed when a test fails.

use rdma_verbs_tools::pingpong::wire;

mod common;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU16, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::example_bin;
use wire::fixtures::{dest, msg, GID_HEX};
use wire::{Dest, MSG_LEN};

// ---------------------------------------------------------------------------
// Device tests: helpers.
// ---------------------------------------------------------------------------

/// A C tool from PATH.
fn c_tool(name: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!("{name} is not on PATH (Debian package ibverbs-utils; the VM has it)")
        })
}

static NEXT_PORT: AtomicU16 = AtomicU16::new(18600);

/// A TCP port no other run of this binary uses.
fn next_port() -> u16 {
    NEXT_PORT.fetch_add(1, Ordering::Relaxed)
}

/// A child process that is killed if the test ends before it does, with its
/// output collected by threads (so a full pipe never blocks it).
struct Proc {
    what: String,
    child: Option<Child>,
    out: Option<JoinHandle<Vec<u8>>>,
    err: Option<JoinHandle<Vec<u8>>>,
}

struct Output {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

impl Proc {
    fn spawn(prog: &PathBuf, args: &[String]) -> Proc {
        let what = format!(
            "{} {}",
            prog.file_name().unwrap().to_string_lossy(),
            args.join(" ")
        );
        let mut child = Command::new(prog)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
        let drain = |mut r: Box<dyn Read + Send>| {
            std::thread::spawn(move || {
                let mut v = Vec::new();
                let _ = r.read_to_end(&mut v);
                v
            })
        };
        let out = drain(Box::new(child.stdout.take().unwrap()));
        let err = drain(Box::new(child.stderr.take().unwrap()));
        Proc {
            what,
            child: Some(child),
            out: Some(out),
            err: Some(err),
        }
    }

    fn exited(&mut self) -> bool {
        matches!(self.child.as_mut().map(|c| c.try_wait()), Some(Ok(Some(_))))
    }

    /// Waits up to `within`; kills it and fails the test on timeout.
    fn wait(self, within: Duration) -> Output {
        self.try_wait(within).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Waits up to `within`; kills it on timeout and says so, with what it
    /// printed.
    fn try_wait(mut self, within: Duration) -> Result<Output, String> {
        let deadline = Instant::now() + within;
        let mut child = self.child.take().unwrap();
        let status = loop {
            if let Some(st) = child.try_wait().expect("try_wait") {
                break Some(st);
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let stdout = String::from_utf8_lossy(&self.out.take().unwrap().join().unwrap()).into();
        let stderr = String::from_utf8_lossy(&self.err.take().unwrap().join().unwrap()).into();
        match status {
            Some(status) => Ok(Output {
                status,
                stdout,
                stderr,
            }),
            None => Err(format!(
                "`{}` did not finish within {within:?}; killed.\nstdout:\n{stdout}\nstderr:\n{stderr}",
                self.what
            )),
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Whether something listens on TCP `port` (any address), from /proc.
fn listening(port: u16) -> bool {
    let want = format!(":{port:04X}");
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|f| {
        std::fs::read_to_string(f).is_ok_and(|t| {
            t.lines().skip(1).any(|l| {
                let cols: Vec<&str> = l.split_whitespace().collect();
                cols.len() > 3 && cols[1].ends_with(&want) && cols[3] == "0A"
            })
        })
    })
}

/// Waits until `server` listens on `port` (without connecting: the C
/// servers accept exactly one connection). Fails if it exits first.
fn wait_listening(server: &mut Proc, port: u16) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !listening(port) {
        if server.exited() {
            let what = server.what.clone();
            let out = std::mem::replace(
                server,
                Proc {
                    what: String::new(),
                    child: None,
                    out: None,
                    err: None,
                },
            );
            let o = out.wait(Duration::from_secs(5));
            panic!(
                "server `{what}` exited ({}) before listening\nstdout:\n{}\nstderr:\n{}",
                o.status, o.stdout, o.stderr
            );
        }
        assert!(
            Instant::now() < deadline,
            "server `{}` not listening on {port} after 60 s",
            server.what
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The device under test, as options: `-d NAME -i PORT -g INDEX`.
struct Dev {
    name: String,
    port: u8,
    gid_index: u8,
}

fn dev() -> Dev {
    let d = common::device();
    Dev {
        name: d.ctx.name().to_string(),
        port: d.port.0,
        gid_index: d.gid_index.0,
    }
}

impl Dev {
    /// Everything explicit (what the C tools need).
    fn full(&self) -> Vec<String> {
        vec![
            "-d".into(),
            self.name.clone(),
            "-i".into(),
            self.port.to_string(),
            "-g".into(),
            self.gid_index.to_string(),
        ]
    }
    /// Only the device: our tools find the active port and GID themselves.
    fn name_only(&self) -> Vec<String> {
        vec!["-d".into(), self.name.clone()]
    }
}

fn args(s: &str) -> Vec<String> {
    s.split_whitespace().map(String::from).collect()
}

/// One side of a ping-pong run.
struct Side {
    prog: PathBuf,
    args: Vec<String>,
}

fn rust(tool: &str, dev: &Dev, opts: &str) -> Side {
    let mut a = dev.name_only();
    a.extend(args(opts));
    Side {
        prog: example_bin(&format!("{tool}_pingpong")),
        args: a,
    }
}

fn rust_full(tool: &str, dev: &Dev, opts: &str) -> Side {
    let mut a = dev.full();
    a.extend(args(opts));
    Side {
        prog: example_bin(&format!("{tool}_pingpong")),
        args: a,
    }
}

fn c(tool: &str, dev: &Dev, opts: &str) -> Side {
    let mut a = dev.full();
    a.extend(args(opts));
    Side {
        prog: c_tool(&format!("ibv_{tool}_pingpong")),
        args: a,
    }
}

/// What one side printed.
#[derive(Debug)]
struct Report {
    local: Vec<String>,
    remote: Vec<String>,
    bytes: u64,
    iters: u64,
    usec_per_iter: f64,
}

/// Parses the C tools' output format (checking it line by line).
fn report(who: &str, o: &Output) -> Report {
    let mut r = Report {
        local: vec![],
        remote: vec![],
        bytes: 0,
        iters: 0,
        usec_per_iter: 0.0,
    };
    for l in o.stdout.lines() {
        if let Some(a) = l.strip_prefix("  local address:  ") {
            // ud_pingpong's local line says "PSN 0x…: GID" (a C quirk we keep).
            r.local.push(a.replacen(": GID", ", GID", 1));
        } else if let Some(a) = l.strip_prefix("  remote address: ") {
            r.remote.push(a.to_string());
        } else if l.contains(" bytes in ") {
            // "%lld bytes in %.2f seconds = %.2f Mbit/sec"
            let w: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(w.len(), 8, "{who}: {l:?}");
            assert_eq!(
                (w[1], w[2], w[4], w[5], w[7]),
                ("bytes", "in", "seconds", "=", "Mbit/sec")
            );
            r.bytes = w[0].parse().unwrap();
        } else if l.contains(" iters in ") {
            // "%d iters in %.2f seconds = %.2f usec/iter"
            let w: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(w.len(), 8, "{who}: {l:?}");
            assert_eq!(
                (w[1], w[2], w[4], w[5], w[7]),
                ("iters", "in", "seconds", "=", "usec/iter")
            );
            r.iters = w[0].parse().unwrap();
            r.usec_per_iter = w[6].parse().unwrap();
        } else if l.starts_with("invalid data") {
            panic!("{who}: {l}\n{}", o.stdout);
        }
    }
    for a in r.local.iter().chain(&r.remote) {
        // "LID 0x%04x, QPN 0x%06x, PSN 0x%06x, GID %s"
        let f: Vec<&str> = a.split(", ").collect();
        assert_eq!(f.len(), 4, "{who}: {a:?}");
        for (field, (name, digits)) in f[..3].iter().zip([("LID", 4), ("QPN", 6), ("PSN", 6)]) {
            let hex = field
                .strip_prefix(&format!("{name} 0x"))
                .unwrap_or_else(|| panic!("{who}: {a:?}"));
            assert!(
                hex.len() == digits && hex.bytes().all(|b| b.is_ascii_hexdigit()),
                "{who}: {a:?}"
            );
        }
        assert!(f[3].starts_with("GID "), "{who}: {a:?}");
    }
    r
}

/// Runs `server`, waits until it listens, runs `client` against it;
/// checks that both succeed and agree. Returns (server, client) reports.
fn pingpong(server: Side, client: Side) -> (Report, Report) {
    let port = next_port().to_string();
    let mut sargs = server.args.clone();
    sargs.extend(["-p".to_string(), port.clone()]);
    let mut s = Proc::spawn(&server.prog, &sargs);
    wait_listening(&mut s, port.parse().unwrap());
    let mut cargs = client.args.clone();
    cargs.extend(["-p".to_string(), port, "localhost".to_string()]);
    let c = Proc::spawn(&client.prog, &cargs);
    let (cwhat, swhat) = (c.what.clone(), s.what.clone());
    let co = c.wait(Duration::from_secs(180));
    // A server that hangs after its client ended: say what the client said.
    let so = s.try_wait(Duration::from_secs(60)).unwrap_or_else(|e| {
        panic!(
            "{e}\nits client `{cwhat}` ended with {}:\nstdout:\n{}\nstderr:\n{}",
            co.status, co.stdout, co.stderr
        )
    });
    let dump = format!(
        "server `{swhat}`: {}\n{}{}\nclient `{cwhat}`: {}\n{}{}",
        so.status, so.stdout, so.stderr, co.status, co.stdout, co.stderr
    );
    assert!(so.status.success() && co.status.success(), "{dump}");
    for o in [&so, &co] {
        assert!(!o.stderr.contains("panicked"), "{dump}");
    }
    let (sr, cr) = (report("server", &so), report("client", &co));
    // Each side printed the other's address as the other printed it.
    assert!(!sr.local.is_empty(), "{dump}");
    assert_eq!(sr.local, cr.remote, "{dump}");
    assert_eq!(cr.local, sr.remote, "{dump}");
    assert_eq!((sr.bytes, sr.iters), (cr.bytes, cr.iters), "{dump}");
    assert!(sr.iters > 0 && sr.bytes > 0, "{dump}");
    eprintln!(
        "  {:<60} {:>9.2} usec/iter (server)  {:>9.2} usec/iter (client)",
        format!("{} <- {}", short(&swhat), short(&cwhat)),
        sr.usec_per_iter,
        cr.usec_per_iter
    );
    (sr, cr)
}

fn short(what: &str) -> String {
    what.split(" -p ")
        .next()
        .unwrap_or(what)
        .replace(" -d rxe0", "")
}

fn check_sizes(r: &Report, size: u64, iters: u64) {
    assert_eq!(r.iters, iters);
    assert_eq!(r.bytes, size * iters * 2);
}

// ---------------------------------------------------------------------------
// Device tests: ours against ours.
// ---------------------------------------------------------------------------

#[test]
#[ignore = "needs an RDMA device"]
fn rc_rust_with_rust() {
    let d = dev();
    for (opts, size) in [
        ("-n 200 -s 1 -c", 1),
        ("-n 100 -s 4096 -e -c", 4096),
        ("-n 50 -s 65536 -r 8 -c", 65536),
        ("-n 100 -s 100 -e -r 1", 100),
    ] {
        let (s, c) = pingpong(rust("rc", &d, opts), rust("rc", &d, opts));
        check_sizes(&s, size, s.iters);
        check_sizes(&c, size, c.iters);
    }
}

#[test]
#[ignore = "needs an RDMA device"]
fn uc_rust_with_rust() {
    let d = dev();
    for opts in [
        "-n 200 -s 64 -c",
        "-n 100 -s 4096 -e -c",
        "-n 50 -s 16384 -r 4 -e",
    ] {
        pingpong(rust("uc", &d, opts), rust("uc", &d, opts));
    }
}

#[test]
#[ignore = "needs an RDMA device"]
fn ud_rust_with_rust() {
    let d = dev();
    for opts in [
        "-n 200 -s 64 -c",
        "-n 100 -s 512 -e -c",
        "-n 100 -s 1024 -c",
    ] {
        pingpong(rust("ud", &d, opts), rust("ud", &d, opts));
    }
}

#[test]
#[ignore = "needs an RDMA device"]
fn srq_rust_with_rust() {
    let d = dev();
    for opts in [
        "-n 200 -q 4 -c",
        "-n 100 -q 16 -s 1024 -e -c",
        "-n 60 -q 1 -s 64 -r 2",
        "-n 100 -q 32 -r 64 -e",
    ] {
        pingpong(rust("srq", &d, opts), rust("srq", &d, opts));
    }
}

/// All options spelled out, long names included, as rdma-core spells them.
#[test]
#[ignore = "needs an RDMA device"]
fn long_option_names() {
    let d = dev();
    let port = d.port.to_string();
    let gid = d.gid_index.to_string();
    let long = |extra: &str| {
        format!(
            "--ib-dev {} --ib-port {port} --gid-idx {gid} --size 256 --rx-depth 16 --iters 50 \
             --sl 0 --events --chk {extra}",
            d.name
        )
    };
    for (tool, extra) in [
        ("rc", "--mtu 1024"),
        ("uc", "--mtu 512"),
        ("ud", ""),
        ("srq", "--mtu 1024 --num-qp 3"),
    ] {
        let side = || Side {
            prog: example_bin(&format!("{tool}_pingpong")),
            args: args(&long(extra)),
        };
        let (s, _) = pingpong(side(), side());
        check_sizes(&s, 256, 50);
    }
}

// ---------------------------------------------------------------------------
// Device tests: ours against rdma-core's C tools, both directions.
// ---------------------------------------------------------------------------

fn interop(tool: &str, opts: &str) {
    let d = dev();
    // Our server, C client; then C server, our client.
    pingpong(rust(tool, &d, opts), c(tool, &d, opts));
    pingpong(c(tool, &d, opts), rust(tool, &d, opts));
    // Explicit port and GID index on our side too, the other way round.
    pingpong(c(tool, &d, opts), rust_full(tool, &d, opts));
    // The C tool against itself in the same VM, for comparison.
    pingpong(c(tool, &d, opts), c(tool, &d, opts));
}

/// Without `-g` our tool picks the port's RoCE v2 IPv4 GID (the C client,
/// given `-g` explicitly, must reach it there), not the link-local entry
/// before it.
#[test]
#[ignore = "needs an RDMA device"]
fn rc_without_gid_flag_uses_the_default_gid() {
    let d = dev();
    let t = common::device();
    if t.ctx.query_port(t.port).unwrap().link_layer() != rdma_verbs::device::LinkLayer::Ethernet {
        eprintln!("not RoCE: LID addressing, no GID to choose");
        return;
    }
    let want = t
        .ctx
        .select_gid(t.port, &rdma_verbs::device::GidSelector::Automatic)
        .unwrap();
    let (s, _) = pingpong(rust("rc", &d, "-n 50 -c"), c("rc", &d, "-n 50 -c"));
    assert!(
        s.local[0].ends_with(&format!(", GID {}", want.gid)),
        "{:?} does not use {want:?}",
        s.local
    );
    if let Ok(gid1) = std::env::var("IBVERBS_TEST_EXPECT_GID1") {
        assert_eq!(want.index, rdma_verbs::device::GidIndex(1));
        assert!(s.local[0].ends_with(&gid1), "{:?}", s.local);
    }
}

#[test]
#[ignore = "needs an RDMA device"]
fn rc_interop_with_c() {
    interop("rc", "-n 200 -c");
    interop("rc", "-n 100 -s 64 -e -c");
}

#[test]
#[ignore = "needs an RDMA device"]
fn uc_interop_with_c() {
    interop("uc", "-n 200 -c");
    interop("uc", "-n 100 -s 64 -e");
}

#[test]
#[ignore = "needs an RDMA device"]
fn ud_interop_with_c() {
    // The C tool needs the message plus its 40-byte GRH within the MTU.
    interop("ud", "-n 200 -s 512 -c");
    interop("ud", "-n 100 -s 64 -e -c");
}

#[test]
#[ignore = "needs an RDMA device"]
fn srq_interop_with_c() {
    interop("srq", "-n 200 -c");
    interop("srq", "-n 100 -q 4 -s 256 -e -c");
}

// ---------------------------------------------------------------------------
// Device tests: hostile peers against our server (and one against our client).
// ---------------------------------------------------------------------------

/// Starts our `tool` server with a 2 s exchange timeout, lets `peer` talk to
/// it, and returns the server's stderr after checking it failed cleanly and
/// quickly.
fn hostile(tool: &str, peer: impl FnOnce(TcpStream) + Send, expected: &str) -> String {
    let d = dev();
    let port = next_port();
    let mut a = d.name_only();
    a.extend(args(&format!(
        "-p {port} -n 10 --exchange-timeout 2 --accept-timeout 60"
    )));
    let mut s = Proc::spawn(&example_bin(&format!("{tool}_pingpong")), &a);
    wait_listening(&mut s, port);
    let stream = TcpStream::connect(("localhost", port)).expect("connect to the server");
    let t = Instant::now();
    let what = s.what.clone();
    // The peer runs on its own thread so that a server that does not exit
    // in time still fails the test.
    let peer = std::thread::scope(|sc| {
        let h = sc.spawn(move || peer(stream));
        let o = s.wait(Duration::from_secs(30));
        let _ = h.join();
        o
    });
    let took = t.elapsed();
    let dump = format!(
        "`{what}`: {} after {took:?}\nstdout:\n{}\nstderr:\n{}",
        peer.status, peer.stdout, peer.stderr
    );
    assert!(!peer.status.success(), "must fail: {dump}");
    assert_eq!(peer.status.code(), Some(1), "{dump}");
    assert!(!peer.stderr.contains("panicked"), "{dump}");
    assert!(
        peer.stderr.starts_with(&format!("{tool}_pingpong: ")),
        "{dump}"
    );
    assert!(
        peer.stderr.contains(expected),
        "expected {expected:?}: {dump}"
    );
    assert!(took < Duration::from_secs(20), "{dump}");
    peer.stderr
}

fn send_then_wait(bytes: Vec<u8>) -> impl FnOnce(TcpStream) + Send {
    move |mut s: TcpStream| {
        let _ = s.write_all(&bytes);
        let _ = s.set_read_timeout(Some(Duration::from_secs(25)));
        let _ = s.read_to_end(&mut Vec::new());
    }
}

fn send_then_close(bytes: Vec<u8>) -> impl FnOnce(TcpStream) + Send {
    move |mut s: TcpStream| {
        let _ = s.write_all(&bytes);
    }
}

#[test]
#[ignore = "needs an RDMA device"]
fn server_refuses_garbage() {
    hostile(
        "rc",
        send_then_wait(msg("GET / HTTP/1.1 Host: x")),
        "byte 3 is 0x20",
    );
    hostile(
        "rc",
        send_then_wait(msg("hello-world:")),
        "expected 4 ':'-separated fields",
    );
    hostile(
        "rc",
        send_then_wait(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03".repeat(5)),
        "byte 0 is 0x16, not a visible ASCII character",
    );
}

#[test]
#[ignore = "needs an RDMA device"]
fn server_refuses_short_message_then_close() {
    hostile(
        "rc",
        send_then_close(b"0000:000011:00".to_vec()),
        "closed the connection after 14 of 52 bytes",
    );
}

#[test]
#[ignore = "needs an RDMA device"]
fn server_refuses_oversized_message() {
    hostile("uc", send_then_wait(vec![b'f'; 4096]), "no NUL terminator");
    let mut m = wire::encode(&dest(0x11)).unwrap().to_vec();
    m.extend_from_slice(&[b'A'; 100]);
    hostile("rc", send_then_wait(m), "more than expected");
}

#[test]
#[ignore = "needs an RDMA device"]
fn server_refuses_message_without_nul() {
    let mut m = wire::encode(&dest(0x11)).unwrap();
    m[51] = b'0';
    hostile("rc", send_then_wait(m.to_vec()), "no NUL terminator");
}

#[test]
#[ignore = "needs an RDMA device"]
fn server_refuses_out_of_range_fields() {
    let g = GID_HEX;
    hostile(
        "rc",
        send_then_wait(msg(&format!("0000:1000000:00000:{g}"))),
        "QPN 0x1000000 does not fit in 24 bits",
    );
    hostile(
        "ud",
        send_then_wait(msg(&format!("10000:00011:000000:{g}"))),
        "LID 0x10000 does not fit in 16 bits",
    );
    hostile(
        "rc",
        send_then_wait(msg(&format!("0000:000000:000000:{g}"))),
        "has QPN 0",
    );
    // RoCE needs the peer's GID: a C client without -g sends none.
    hostile(
        "rc",
        send_then_wait(msg("0000:000011:000000:00000000000000000000000000000000")),
        "give the peer -g",
    );
}

#[test]
#[ignore = "needs an RDMA device"]
fn server_refuses_peer_that_hangs_up() {
    hostile(
        "rc",
        send_then_close(Vec::new()),
        "closed the connection after 0 of 52 bytes",
    );
}

#[test]
#[ignore = "needs an RDMA device"]
fn server_times_out_on_silent_peer() {
    let e = hostile(
        "rc",
        send_then_wait(Vec::new()),
        "timed out after 2 s (0 of 52 bytes received)",
    );
    assert!(e.contains("Couldn't read remote address"), "{e}");
}

#[test]
#[ignore = "needs an RDMA device"]
fn server_refuses_bad_done() {
    // A valid address (of a QP that does not exist: connecting still works),
    // the server's reply in the C format, then something else than "done".
    let gid = common::device()
        .ctx
        .query_gid(common::device().port, common::device().gid_index)
        .unwrap();
    let me = Dest {
        lid: 0,
        qpn: 0xabc,
        psn: 0x123,
        gid: gid.0,
    };
    hostile(
        "rc",
        move |mut s: TcpStream| {
            s.write_all(&wire::encode(&me).unwrap()).unwrap();
            let mut reply = [0u8; MSG_LEN];
            s.read_exact(&mut reply).unwrap();
            let server = wire::decode(&reply).expect("the server's reply is in the C format");
            assert!(server.qpn != 0 && server.gid == me.gid);
            s.write_all(b"DONE!").unwrap();
            let _ = s.read_to_end(&mut Vec::new());
        },
        "expected \"done\" and its NUL",
    );
}

#[test]
#[ignore = "needs an RDMA device"]
fn srq_server_needs_all_256_messages() {
    let m = wire::encode(&dest(0x11)).unwrap().to_vec();
    hostile(
        "srq",
        send_then_close(m.repeat(3)),
        "closed the connection after 156 of 13312 bytes",
    );
}

#[test]
#[ignore = "needs an RDMA device"]
fn client_refuses_garbage_from_server() {
    let d = dev();
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut m = [0u8; MSG_LEN];
        s.read_exact(&mut m).unwrap();
        let client = wire::decode(&m).expect("the client's address is in the C format");
        assert!(client.qpn != 0);
        s.write_all(&msg("0000:000011:zzzzzz:0")).unwrap();
        let _ = s.read_to_end(&mut Vec::new());
    });
    let mut a = d.name_only();
    a.extend(args(&format!(
        "-p {port} -n 10 --exchange-timeout 5 127.0.0.1"
    )));
    let o = Proc::spawn(&example_bin("rc_pingpong"), &a).wait(Duration::from_secs(30));
    server.join().unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", o.stderr);
    assert!(
        o.stderr
            .contains("invalid remote address: the PSN field \"zzzzzz\""),
        "{}",
        o.stderr
    );
    assert!(!o.stderr.contains("panicked"));
}

/// The command line of rdma-core, plus our defaults, in `--help`.
#[test]
#[ignore = "needs an RDMA device"]
fn help_lists_rdma_core_options() {
    for (tool, extra) in [
        ("rc", &["--mtu"][..]),
        ("uc", &["--mtu"]),
        ("ud", &[]),
        ("srq", &["--mtu", "--num-qp"]),
    ] {
        let o = Proc::spawn(
            &example_bin(&format!("{tool}_pingpong")),
            &["--help".into()],
        )
        .wait(Duration::from_secs(30));
        assert!(o.status.success());
        for opt in [
            "-p, --port",
            "-d, --ib-dev",
            "-i, --ib-port",
            "-s, --size",
            "-r, --rx-depth",
            "-n, --iters",
            "-l, --sl",
            "-e, --events",
            "-g, --gid-idx",
            "-c, --chk",
        ]
        .iter()
        .chain(extra)
        {
            assert!(
                o.stdout.contains(opt),
                "{tool}: {opt} missing:\n{}",
                o.stdout
            );
        }
        assert!(o.stdout.contains("first ACTIVE port"), "{}", o.stdout);
        // Bad values are refused before touching the device.
        let o = Proc::spawn(&example_bin(&format!("{tool}_pingpong")), &args("-l 16"))
            .wait(Duration::from_secs(30));
        assert_eq!(o.status.code(), Some(2), "{}", o.stderr);
    }
}

// ---------------------------------------------------------------------------
// Device tests: a peer that dies mid-run never hangs our side.
// ---------------------------------------------------------------------------

/// Runs our `tool` on both sides with a 3 s stall timeout and more
/// iterations than it will ever do, kills `victim` ("server" or "client")
/// once the ping-pong runs, and checks the survivor exits non-zero soon,
/// with `expected` in its stderr.
fn peer_dies(tool: &str, opts: &str, victim: &str, expected: &[&str]) {
    let d = dev();
    let port = next_port().to_string();
    let prog = example_bin(&format!("{tool}_pingpong"));
    let mut base = d.name_only();
    base.extend(args(&format!(
        "-n 100000000 --stall-timeout 3 -p {port} {opts}"
    )));
    let mut s = Proc::spawn(&prog, &base);
    wait_listening(&mut s, port.parse().unwrap());
    let mut cargs = base.clone();
    cargs.push("localhost".into());
    let mut c = Proc::spawn(&prog, &cargs);
    // The exchange is over once the server stops listening; then let the
    // ping-pong run a moment.
    let deadline = Instant::now() + Duration::from_secs(60);
    while listening(port.parse().unwrap()) {
        assert!(Instant::now() < deadline, "the exchange did not finish");
        assert!(!c.exited() && !s.exited(), "a side exited early");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(1500));
    assert!(!c.exited() && !s.exited(), "a side exited early");
    let (dead, survivor) = if victim == "server" { (s, c) } else { (c, s) };
    let t = Instant::now();
    drop(dead); // SIGKILL
    let what = survivor.what.clone();
    let o = survivor.wait(Duration::from_secs(40));
    let took = t.elapsed();
    let dump = format!(
        "`{what}`: {} after {took:?}\n{}{}",
        o.status, o.stdout, o.stderr
    );
    assert_eq!(o.status.code(), Some(1), "{dump}");
    assert!(!o.stderr.contains("panicked"), "{dump}");
    assert!(
        expected.iter().any(|e| o.stderr.contains(e)),
        "expected one of {expected:?}: {dump}"
    );
    assert!(took < Duration::from_secs(30), "{dump}");
    eprintln!(
        "  {victim} of `{}` killed: {}",
        short(&what),
        o.stderr.trim()
    );
}

const STALLED: &str = "no completion for 3 s";

#[test]
#[ignore = "needs an RDMA device"]
fn uc_peer_killed_while_sleeping_on_events() {
    // UC loses the message silently and -e blocks in ibv_get_cq_event: only
    // the watchdog can end this.
    peer_dies("uc", "-e -s 64", "client", &[STALLED]);
}

#[test]
#[ignore = "needs an RDMA device"]
fn ud_peer_killed_while_polling() {
    peer_dies("ud", "-s 64", "server", &[STALLED]);
}

#[test]
#[ignore = "needs an RDMA device"]
fn rc_peer_killed() {
    // RC: the send's retries run out (an error completion), or nothing
    // comes back at all; either way a clean exit.
    peer_dies("rc", "-s 64", "server", &[STALLED, "Failed status"]);
    peer_dies("srq", "-q 4 -e", "client", &[STALLED, "Failed status"]);
}
