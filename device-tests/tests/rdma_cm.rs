//! rdma_cm connection management (device tests, `rdmacm` feature): connect,
//! accept, reject, disconnect with the library's own QPs, and the `rping`
//! example against rdma-core's C `rping` in both directions.

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::Duration;

use common::{device_ipv4, example_bin, path_tool, run_bounded, wait_ok};
use rdma_verbs::cm::{CmEventType, CmId, CmOption, ConnParam, EventChannel};
use rdma_verbs::{AccessFlags, Error, QpType, Wr};

const T: Option<Duration> = Some(Duration::from_secs(10));
static PORT: AtomicU16 = AtomicU16::new(17200);

fn next_port() -> u16 {
    PORT.fetch_add(1, Ordering::Relaxed)
}

fn server_addr() -> SocketAddr {
    let dev = common::device();
    SocketAddr::from((device_ipv4(&dev), next_port()))
}

/// The passive side in a thread: accepts one connection, receives one
/// message, echoes it with an RDMA write into the client's advertised
/// memory, then waits for the disconnect.
fn serve_once(addr: SocketAddr, reject: bool) -> std::thread::JoinHandle<Result<Vec<u8>, Error>> {
    let ch = EventChannel::new().unwrap();
    let listener = CmId::new(&ch).unwrap();
    listener.bind_addr(addr).unwrap();
    listener.listen(1).unwrap();
    std::thread::spawn(move || {
        let mut req = ch.get_event(T)?.expect(CmEventType::ConnectRequest)?;
        assert!(req.is_for(&listener));
        assert_eq!(req.private_data().get(..5), Some(&b"hello"[..]));
        let id = req.take_id().expect("new id");
        if reject {
            id.reject(b"go away")?;
            return Ok(Vec::new());
        }
        let ctx = id.context().expect("request id has a device");
        let pd = ctx.alloc_pd()?;
        let cq = ctx.create_cq(256).build()?;
        let qp = pd.create_qp(QpType::Rc, &cq, &cq).build()?;
        id.init_qp(&qp)?;
        qp.recv_queue()?
            .recv(pd.alloc(64, AccessFlags::LOCAL_WRITE)?, 1)?;
        id.accept(&qp, &ConnParam::new())?;
        ch.get_event(T)?.expect(CmEventType::Established)?;
        let mut c = wait_ok(&cq);
        let got = c.take_local().unwrap()[..c.byte_len() as usize].to_vec();
        // The client's memory first (its wire form); echo the rest there.
        let n = rdma_verbs::RemoteMemory::WIRE_LEN;
        let remote = rdma_verbs::RemoteMemory::from_bytes(&got[..n])?;
        let mut src = pd.alloc(got.len() - n, AccessFlags::LOCAL_WRITE)?;
        src.copy_from_slice(&got[n..]);
        let mut sq = qp.send_queue()?;
        sq.write(
            src,
            remote.slice(0, (got.len() - n) as u64).unwrap(),
            Wr::id(0),
        )?;
        wait_ok(&cq);
        sq.send_inline(b"done", Wr::id(0))?;
        wait_ok(&cq);
        ch.get_event(T)?.expect(CmEventType::Disconnected)?;
        Ok(got)
    })
}

/// An active-side id with its address and route resolved to `addr`.
fn resolved(addr: SocketAddr) -> (EventChannel, CmId) {
    resolved_with(addr, &[])
}

/// [`resolved`] with `options` set on the new id first.
fn resolved_with(addr: SocketAddr, options: &[CmOption]) -> (EventChannel, CmId) {
    let ch = EventChannel::new().unwrap();
    let id = CmId::new(&ch).unwrap();
    for o in options {
        id.set_option(*o).unwrap();
    }
    assert!(id.context().is_none(), "no device before resolution");
    id.resolve_addr(None, addr, Duration::from_secs(2)).unwrap();
    ch.get_event(T)
        .unwrap()
        .expect(CmEventType::AddrResolved)
        .unwrap();
    id.resolve_route(Duration::from_secs(2)).unwrap();
    ch.get_event(T)
        .unwrap()
        .expect(CmEventType::RouteResolved)
        .unwrap();
    (ch, id)
}

/// The client's receive and send `wr_id`s, told apart on their shared CQ.
const RECV_ID: u64 = 1;
const SEND_ID: u64 = 2;

/// The active side of [`serve_once`]'s exchange on a resolved `id`:
/// connects, sends its memory and a message, checks the echo, disconnects.
/// Returns the connected QP's attributes.
fn echo_client(ch: &EventChannel, id: &CmId, addr: SocketAddr) -> rdma_verbs::qp::QpAttrView {
    let ctx = id.context().expect("a device after resolution");
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(256).build().unwrap();
    let qp = pd.create_qp(QpType::Rc, &cq, &cq).build().unwrap();
    let sink = pd
        .alloc_shared(64, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .unwrap();
    id.init_qp(&qp).unwrap();
    qp.recv_queue()
        .unwrap()
        .recv(pd.alloc(16, AccessFlags::LOCAL_WRITE).unwrap(), RECV_ID)
        .unwrap();
    id.connect(&qp, &ConnParam::new().private_data(b"hello"))
        .unwrap();
    ch.get_event(T)
        .unwrap()
        .expect(CmEventType::Established)
        .unwrap();
    assert_eq!(id.peer_addr(), Some(addr));
    assert_eq!(qp.state().unwrap(), rdma_verbs::QpState::Rts);
    let attr = qp.query().unwrap().0;

    let n = rdma_verbs::RemoteMemory::WIRE_LEN;
    let mut msg = pd.alloc(n + 11, AccessFlags::LOCAL_WRITE).unwrap();
    msg[..n].copy_from_slice(&sink.remote().unwrap().to_bytes());
    msg[n..].copy_from_slice(b"echo via cm");
    qp.send_queue().unwrap().send(msg, Wr::id(SEND_ID)).unwrap();
    // Our send's completion and the receive of the server's "done" (sent
    // after its write) share the CQ, in either order: rxe may deliver the
    // peer's next message before the ACK that completes our send.
    let (a, b) = (wait_ok(&cq), wait_ok(&cq));
    let c = if a.wr_id() == RECV_ID { a } else { b };
    assert_eq!(c.wr_id(), RECV_ID);
    assert_eq!(c.byte_len(), 4);
    let mut got = [0u8; 11];
    sink.copy_to_slice(0, &mut got).unwrap();
    assert_eq!(&got, b"echo via cm");

    id.disconnect().unwrap();
    ch.get_event(T)
        .unwrap()
        .expect(CmEventType::Disconnected)
        .unwrap();
    attr
}

#[test]
#[ignore = "needs an RDMA device"]
fn connect_accept_data_disconnect() {
    let addr = server_addr();
    let server = serve_once(addr, false);
    let (ch, id) = resolved(addr);
    echo_client(&ch, &id, addr);
    let seen = server.join().unwrap().unwrap();
    assert_eq!(&seen[rdma_verbs::RemoteMemory::WIRE_LEN..], b"echo via cm");
}

#[test]
#[ignore = "needs an RDMA device"]
fn tos_and_ack_timeout_options_reach_the_queue_pair() {
    let addr = server_addr();
    let server = serve_once(addr, false);
    // Values no default has: rdma_cm derives the ACK timeout from the
    // path's packet lifetime (17 on rxe), its TOS is 0.
    let (ch, id) = resolved_with(addr, &[CmOption::Tos(0x28), CmOption::AckTimeout(19)]);
    let attr = echo_client(&ch, &id, addr);
    assert_eq!(attr.timeout(), 19, "RDMA_OPTION_ID_ACK_TIMEOUT");
    assert_eq!(
        attr.ah_attr().as_raw().grh.traffic_class,
        0x28,
        "RDMA_OPTION_ID_TOS"
    );
    server.join().unwrap().unwrap();
}

#[test]
#[ignore = "needs an RDMA device"]
fn reuseaddr_and_afonly_options_change_what_binds() {
    let ch = EventChannel::new().unwrap();
    let addr = server_addr();
    // Without REUSEADDR a second id cannot bind the same address and port.
    let first = CmId::new(&ch).unwrap();
    first.set_option(CmOption::ReuseAddr(true)).unwrap();
    first.bind_addr(addr).unwrap();
    let plain = CmId::new(&ch).unwrap();
    let err = plain.bind_addr(addr).unwrap_err();
    assert_eq!(err.verb(), Some("rdma_bind_addr"), "{err}");
    assert_eq!(err.raw_os_error(), Some(libc::EADDRINUSE), "{err}");
    // With it on both (neither listening), it can.
    let second = CmId::new(&ch).unwrap();
    second.set_option(CmOption::ReuseAddr(true)).unwrap();
    second.bind_addr(addr).unwrap();
    drop((first, plain, second));

    // The IPv6 wildcard with AFONLY leaves the port free for IPv4; without
    // it, it takes the port for both families.
    let port = next_port();
    let v6 = SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, port));
    let v4 = SocketAddr::from((addr.ip(), port));
    let only6 = CmId::new(&ch).unwrap();
    only6.set_option(CmOption::AfOnly(true)).unwrap();
    only6.bind_addr(v6).unwrap();
    CmId::new(&ch).unwrap().bind_addr(v4).unwrap();
    drop(only6);
    let port = next_port();
    let v6 = SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, port));
    let v4 = SocketAddr::from((addr.ip(), port));
    let both = CmId::new(&ch).unwrap();
    both.set_option(CmOption::AfOnly(false)).unwrap();
    both.bind_addr(v6).unwrap();
    let err = CmId::new(&ch).unwrap().bind_addr(v4).unwrap_err();
    // The kernel's rdma_cm reports this clash (a wildcard of the other
    // family) as EADDRNOTAVAIL, the same-address one above as EADDRINUSE.
    assert_eq!(err.raw_os_error(), Some(libc::EADDRNOTAVAIL), "{err}");
}

#[test]
#[ignore = "needs an RDMA device"]
fn reject_is_a_typed_event_with_private_data() {
    let addr = server_addr();
    let server = serve_once(addr, true);
    let (ch, id) = resolved(addr);
    let ctx = id.context().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(256).build().unwrap();
    let qp = pd.create_qp(QpType::Rc, &cq, &cq).build().unwrap();
    id.connect(&qp, &ConnParam::new().private_data(b"hello"))
        .unwrap();
    let ev = ch.get_event(T).unwrap();
    assert_eq!(ev.kind(), CmEventType::Rejected, "{ev:?}");
    assert_eq!(ev.private_data().get(..7), Some(&b"go away"[..]));
    let e = ev.expect(CmEventType::Established).unwrap_err();
    // A reject reason (positive status) is no errno: a typed mismatch; a
    // negative errno status would be a verb error naming it.
    assert!(
        matches!(
            e,
            Error::UnexpectedEvent {
                expected: CmEventType::Established,
                got: CmEventType::Rejected,
                ..
            } | Error::Verb { .. }
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains("Rejected"), "{e}");
    server.join().unwrap().unwrap();
}

#[test]
#[ignore = "needs an RDMA device"]
fn nobody_listening_and_bad_arguments_are_errors() {
    let addr = server_addr();
    let (ch, id) = resolved(addr);
    let ctx = id.context().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(256).build().unwrap();
    // UD is not a connection of the TCP port space; too much private data.
    let ud = pd.create_qp(QpType::Ud, &cq, &cq).build().unwrap();
    assert!(matches!(
        id.connect(&ud, &ConnParam::new()),
        Err(Error::WrongQpType {
            qp_type: QpType::Ud,
            ..
        })
    ));
    let qp = pd.create_qp(QpType::Rc, &cq, &cq).build().unwrap();
    let e = id
        .connect(&qp, &ConnParam::new().private_data(&[0; 57]))
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::OutOfRange {
                value: 57,
                max: 56,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("private data"), "{e}");
    // A QP of another device context is refused.
    let other = common::device();
    let opd = other.ctx.alloc_pd().unwrap();
    let ocq = other.ctx.create_cq(256).build().unwrap();
    let oqp = opd.create_qp(QpType::Rc, &ocq, &ocq).build().unwrap();
    assert!(matches!(
        id.connect(&oqp, &ConnParam::new()),
        Err(Error::ForeignContext { what: "queue pair" })
    ));
    // Nobody listens: the connect is rejected (a typed event, no hang).
    id.connect(&qp, &ConnParam::new()).unwrap();
    let ev = ch.get_event(T).unwrap();
    assert!(
        matches!(ev.kind(), CmEventType::Rejected | CmEventType::Unreachable),
        "{ev:?}"
    );
    // No event pending: a bounded wait times out with an error.
    let e = ch.get_event(Some(Duration::from_millis(200))).unwrap_err();
    assert!(e.to_string().contains("no rdma_cm event"), "{e}");
}

/// Waits (10 s at most) until an rdma_cm id listens on `port`: the C
/// client does not retry a connect that finds nobody listening.
fn wait_listening(port: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while std::time::Instant::now() < deadline {
        let out = std::process::Command::new("rdma")
            .args(["resource", "show", "cm_id"])
            .output()
            .expect("the rdma tool (iproute2)");
        let text = String::from_utf8_lossy(&out.stdout);
        if text
            .lines()
            .any(|l| l.contains("LISTEN") && l.contains(&format!(":{port} ")))
        {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("no rdma_cm id listens on port {port} after 10 s");
}

/// Runs an rping server and client; returns (client stdout, server stdout).
fn rping(server: &std::path::Path, client: &std::path::Path, extra: &[&str]) -> (String, String) {
    let dev = common::device();
    let ip = device_ipv4(&dev).to_string();
    let port = next_port().to_string();
    let mut sargs = vec!["-s", "-a", &ip, "-p", &port, "-v"];
    sargs.extend_from_slice(extra);
    let s = run_bounded(server, &sargs, Duration::from_secs(60));
    wait_listening(&port);
    let mut cargs = vec!["-c", "-a", &ip, "-p", &port, "-v", "-V", "-C", "5"];
    cargs.extend_from_slice(extra);
    let c = run_bounded(client, &cargs, Duration::from_secs(60));
    let (cok, cout, cerr) = c.join().unwrap();
    let (sok, sout, serr) = s.join().unwrap();
    assert!(
        cok,
        "client failed:\n{cout}\n{cerr}\nserver:\n{sout}\n{serr}"
    );
    assert!(sok, "server failed:\n{sout}\n{serr}");
    (cout, sout)
}

fn check(cout: &str, sout: &str, size: usize) {
    let pings: Vec<&str> = cout
        .lines()
        .filter(|l| l.starts_with("ping data: "))
        .collect();
    assert_eq!(pings.len(), 5, "{cout}");
    for (i, l) in pings.iter().enumerate() {
        let data = &l["ping data: ".len()..];
        assert!(data.starts_with(&format!("rdma-ping-{i}: ")), "{l}");
        assert_eq!(data.len(), size - 1, "{l}");
    }
    let served = sout
        .lines()
        .filter(|l| l.starts_with("server ping data: "))
        .count();
    assert_eq!(served, 5, "{sout}");
}

#[test]
#[ignore = "needs an RDMA device"]
fn rping_rust_to_rust() {
    let r = example_bin("rping");
    let (c, s) = rping(&r, &r, &[]);
    check(&c, &s, 64);
    let (c, s) = rping(&r, &r, &["-S", "4000"]);
    check(&c, &s, 4000);
}

#[test]
#[ignore = "needs an RDMA device"]
fn rping_rust_client_c_server() {
    let (c, s) = rping(&path_tool("rping"), &example_bin("rping"), &["-S", "1000"]);
    check(&c, &s, 1000);
}

#[test]
#[ignore = "needs an RDMA device"]
fn rping_c_client_rust_server() {
    let (c, s) = rping(&example_bin("rping"), &path_tool("rping"), &["-S", "26"]);
    check(&c, &s, 26);
}

#[test]
#[ignore = "needs an RDMA device"]
fn rping_refuses_bad_arguments() {
    let r = example_bin("rping");
    for args in [&["-c", "-S", "10", "-a", "127.0.0.1"][..], &["-c"], &["-v"]] {
        let (ok, _, err) = run_bounded(&r, args, Duration::from_secs(20))
            .join()
            .unwrap();
        assert!(!ok, "{args:?} should fail: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}

/// `-V` fails loudly on corrupted ping data: our server flips byte 20 of
/// ping 3's data before writing it back (`IBVERBS_SUITE_CORRUPT`, test
/// instrumentation); our client and rdma-core's both stop there with a
/// non-zero exit, ours naming the ping and the offset.
#[test]
#[ignore = "needs an RDMA device"]
fn rping_validation_fails_loudly_on_corrupted_data() {
    let dev = common::device();
    let ip = device_ipv4(&dev).to_string();
    let ours = example_bin("rping");
    let knob = format!("{}=3@20", rdma_verbs_tools::integrity::CORRUPT_ENV);
    for client in [ours.clone(), path_tool("rping")] {
        let port = next_port().to_string();
        let server = ours.to_string_lossy().into_owned();
        let sargs = [&knob[..], &server, "-s", "-a", &ip, "-p", &port];
        let s = run_bounded(
            std::path::Path::new("/usr/bin/env"),
            &sargs,
            Duration::from_secs(60),
        );
        wait_listening(&port);
        let cargs = ["-c", "-a", &ip, "-p", &port, "-v", "-V", "-C", "10"];
        let (cok, cout, cerr) = run_bounded(&client, &cargs, Duration::from_secs(60))
            .join()
            .unwrap();
        let (_, sout, serr) = s.join().unwrap();
        let show = format!("client:\n{cout}{cerr}\nserver:\n{sout}{serr}");
        assert!(!cok, "the client must fail: {show}");
        assert!(cerr.contains("data mismatch!"), "{show}");
        // Pings 0 and 1 went through; ping 2 (the third) did not.
        assert!(cout.contains("ping data: rdma-ping-1: "), "{show}");
        assert!(!cout.contains("ping data: rdma-ping-2: "), "{show}");
        if client == ours {
            assert!(
                cerr.contains("rping: data mismatch! -V: ping 2 (iteration 3)")
                    && cerr.contains("first difference at offset 20:")
                    && cerr.contains("no retry"),
                "{show}"
            );
        }
        assert!(serr.contains("flipped byte 20 of message 3"), "{show}");
    }
}
