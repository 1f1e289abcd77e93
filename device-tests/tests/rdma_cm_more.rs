//! rdma_cm beyond connect/accept (device tests, `rdmacm` feature): moving
//! an id to another event channel, the `rdma_create_qp`-style
//! `CmId::create_qp`, resolution by host name (`rdma_getaddrinfo`),
//! synchronous ids (`rdma_create_ep`-like), UD over rdma_cm (SIDR), and
//! `rdma_establish` for a queue pair the caller created. Every test name
//! starts with `rdma_cm_` (`cargo xtask test --device-only -- rdma_cm_`).

mod common;

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::Duration;

use common::{device_ipv4, wait_ok};
use rdma_verbs::cm::{
    AddrInfo, AddrInfoHints, CmEventType, CmId, ConnParam, EventChannel, PortSpace,
};
use rdma_verbs::{
    device::GidSelector, qp::UdDest, AccessFlags, Completion, CompletionQueue, Error, LocalBuffer,
    ProtectionDomain, QpState, QueuePair, RemoteMemory, Wr,
};

const T: Option<Duration> = Some(Duration::from_secs(10));
const RESOLVE: Duration = Duration::from_secs(2);
/// Bytes of the global route header area in front of every UD receive.
const GRH: usize = 40;

fn next_port() -> u16 {
    // Apart from tests/rdma_cm.rs' (17200…) and the tools' ports.
    static PORT: AtomicU16 = AtomicU16::new(17600);
    PORT.fetch_add(1, Ordering::Relaxed)
}

fn server_addr() -> SocketAddr {
    SocketAddr::from((device_ipv4(&common::device()), next_port()))
}

/// One side of a connection: its id, PD, CQ and queue pair.
struct Side {
    id: CmId,
    pd: ProtectionDomain,
    cq: CompletionQueue,
    qp: QueuePair,
    /// Completions taken while waiting for another kind (a receive that
    /// landed before the send's own completion, or the reverse): the send
    /// and the receives share the CQ.
    stash: std::cell::RefCell<std::collections::VecDeque<Completion>>,
}

/// The send's `wr_id`; receives carry their index.
const SEND_ID: u64 = u64::MAX;

impl Side {
    /// PD and CQ on the id's context, and the queue pair by
    /// `CmId::create_qp` (RC in INIT, UD in RTS), with `recvs` receives of
    /// `len` bytes posted.
    fn new(id: CmId, recvs: usize, len: usize) -> Side {
        let ctx = id.context().expect("the id is bound to a device");
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(64).build().unwrap();
        let qp = id
            .create_qp(&pd, &cq, &cq, |b| b.max_send_wr(16).max_recv_wr(16))
            .unwrap();
        let mut rq = qp.recv_queue().unwrap();
        for i in 0..recvs {
            let b = pd.alloc(len, AccessFlags::LOCAL_WRITE).unwrap();
            rq.recv(b, i as u64).unwrap();
        }
        drop(rq);
        Side {
            id,
            pd,
            cq,
            qp,
            stash: Default::default(),
        }
    }

    /// The next successful completion that is (`send`) or is not the
    /// send's, keeping the others for later.
    fn next(&self, send: bool) -> Completion {
        let mut stash = self.stash.borrow_mut();
        if let Some(i) = stash.iter().position(|c| (c.wr_id() == SEND_ID) == send) {
            return stash.remove(i).unwrap();
        }
        loop {
            let c = wait_ok(&self.cq);
            if (c.wr_id() == SEND_ID) == send {
                return c;
            }
            stash.push_back(c);
        }
    }

    fn send(&self, data: &[u8]) {
        let mut b = self.pd.alloc(data.len(), AccessFlags::LOCAL_WRITE).unwrap();
        b.copy_from_slice(data);
        self.qp
            .send_queue()
            .unwrap()
            .send(b, Wr::id(SEND_ID))
            .unwrap();
        self.next(true);
    }

    fn recv(&self, skip: usize) -> Vec<u8> {
        let mut c = self.next(false);
        let n = c.byte_len() as usize;
        let b: LocalBuffer = c.take_local().expect("a receive buffer");
        b[skip..n].to_vec()
    }
}

/// A resolved active-side id (address and route) on a new channel.
fn resolved(ps: PortSpace, dst: SocketAddr, src: Option<SocketAddr>) -> (EventChannel, CmId) {
    let ch = EventChannel::new().unwrap();
    let id = CmId::with_port_space(&ch, ps).unwrap();
    id.resolve_addr(src, dst, RESOLVE).unwrap();
    ch.get_event(T)
        .unwrap()
        .expect(CmEventType::AddrResolved)
        .unwrap();
    id.resolve_route(RESOLVE).unwrap();
    ch.get_event(T)
        .unwrap()
        .expect(CmEventType::RouteResolved)
        .unwrap();
    (ch, id)
}

/// A listener on `addr` with its channel.
fn listening(ps: PortSpace, addr: SocketAddr) -> (EventChannel, CmId) {
    let ch = EventChannel::new().unwrap();
    let id = CmId::with_port_space(&ch, ps).unwrap();
    id.bind_addr(addr).unwrap();
    id.listen(4).unwrap();
    (ch, id)
}

/// An RC connection in one thread: (client channel, client, server
/// channel, listener, server). Both queue pairs by `CmId::create_qp`, with
/// `recvs` receives of 64 bytes posted before connecting.
fn rc_connected(
    dst: SocketAddr,
    listen: SocketAddr,
    recvs: usize,
) -> (EventChannel, Side, EventChannel, CmId, Side) {
    let (sch, listener) = listening(PortSpace::Tcp, listen);
    let (cch, cid) = resolved(PortSpace::Tcp, dst, None);
    let client = Side::new(cid, recvs, 64);
    assert_eq!(
        client.qp.state().unwrap(),
        QpState::Init,
        "create_qp readies RC for INIT"
    );
    client.id.connect(&client.qp, &ConnParam::new()).unwrap();
    let mut req = sch
        .get_event(T)
        .unwrap()
        .expect(CmEventType::ConnectRequest)
        .unwrap();
    assert!(req.is_for(&listener));
    let server = Side::new(req.take_id().unwrap(), recvs, 64);
    server.id.accept(&server.qp, &ConnParam::new()).unwrap();
    cch.get_event(T)
        .unwrap()
        .expect(CmEventType::Established)
        .unwrap();
    let ev = sch
        .get_event(T)
        .unwrap()
        .expect(CmEventType::Established)
        .unwrap();
    assert!(ev.is_for(&server.id));
    assert_eq!(client.qp.state().unwrap(), QpState::Rts);
    assert_eq!(server.qp.state().unwrap(), QpState::Rts);
    (cch, client, sch, listener, server)
}

/// A send each way, every byte checked.
fn ping_pong(client: &Side, server: &Side, round: u8) {
    let ping = common::pattern(48, round);
    client.send(&ping);
    assert_eq!(server.recv(0), ping);
    let pong = common::pattern(40, round.wrapping_add(100));
    server.send(&pong);
    assert_eq!(client.recv(0), pong);
}

#[test]
#[ignore = "needs an RDMA device"]
fn rdma_cm_migrate_moves_the_server_ids_events_to_a_second_channel() {
    let addr = server_addr();
    let (cch, client, sch, _listener, server) = rc_connected(addr, addr, 2);
    ping_pong(&client, &server, 1);

    let second = EventChannel::new().unwrap();
    server.id.migrate(&second).unwrap();
    // Migrating to the channel it is on already changes nothing.
    server.id.migrate(&second).unwrap();
    // Traffic is untouched by the move.
    ping_pong(&client, &server, 2);

    client.id.disconnect().unwrap();
    let ev = second.get_event(T).unwrap();
    assert_eq!(ev.kind(), CmEventType::Disconnected, "{ev:?}");
    assert!(ev.is_for(&server.id));
    // Nothing for the server id on the first channel any more.
    let e = sch.get_event(Some(Duration::from_millis(300))).unwrap_err();
    assert!(e.to_string().contains("no rdma_cm event"), "{e}");
    // The server's answer (DREP) ends the client's disconnect.
    server.id.disconnect().unwrap();
    cch.get_event(T)
        .unwrap()
        .expect(CmEventType::Disconnected)
        .unwrap();
    // The id keeps its channels open: drop every handle of ours to them
    // first, the id last (its destroy reads its channel's fd).
    drop((second, sch, cch));
    drop(server);
}

#[test]
#[ignore = "needs an RDMA device"]
fn rdma_cm_migrate_a_listener_hands_new_requests_to_the_new_channel() {
    let addr = server_addr();
    let (first, listener) = listening(PortSpace::Tcp, addr);
    let second = EventChannel::new().unwrap();
    listener.migrate(&second).unwrap();
    let (cch, cid) = resolved(PortSpace::Tcp, addr, None);
    let client = Side::new(cid, 1, 64);
    client.id.connect(&client.qp, &ConnParam::new()).unwrap();
    let mut req = second
        .get_event(T)
        .unwrap()
        .expect(CmEventType::ConnectRequest)
        .unwrap();
    assert!(req.is_for(&listener));
    let server = Side::new(req.take_id().unwrap(), 1, 64);
    server.id.accept(&server.qp, &ConnParam::new()).unwrap();
    cch.get_event(T)
        .unwrap()
        .expect(CmEventType::Established)
        .unwrap();
    // The new connection's id starts on the listener's (new) channel.
    second
        .get_event(T)
        .unwrap()
        .expect(CmEventType::Established)
        .unwrap();
    assert!(first.get_event(Some(Duration::from_millis(200))).is_err());
    ping_pong(&client, &server, 3);
    drop((first, second));
    drop(listener);
    drop(server);
}

#[test]
#[ignore = "needs an RDMA device"]
fn rdma_cm_create_qp_on_both_sides_carries_sends_writes_and_reads() {
    let addr = server_addr();
    let (_cch, client, _sch, _listener, server) = rc_connected(addr, addr, 4);
    ping_pong(&client, &server, 7);
    // The server's memory, advertised to the client (pyverbs'
    // test_rdmacm_async_write/_read: the active side writes and reads the
    // passive side's region).
    let len = 1024;
    let mut target = server
        .pd
        .alloc_shared(
            len,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
        )
        .unwrap();
    target.copy_from_slice(0, &vec![b's'; len]).unwrap();
    server.send(&target.remote().unwrap().to_bytes());
    let remote = RemoteMemory::from_bytes(&client.recv(0)).unwrap();
    let mut sq = client.qp.send_queue().unwrap();
    for round in 0..10u8 {
        // Read what the server has, then overwrite it.
        let dst = client.pd.alloc(len, AccessFlags::LOCAL_WRITE).unwrap();
        sq.read(dst, remote, Wr::id(0)).unwrap();
        let mut c = wait_ok(&client.cq);
        let got: LocalBuffer = c.take_local().unwrap();
        let want = if round == 0 {
            vec![b's'; len]
        } else {
            common::pattern(len, round - 1)
        };
        assert_eq!(&got[..], &want[..], "read, round {round}");
        let mut src = client.pd.alloc(len, AccessFlags::LOCAL_WRITE).unwrap();
        src.copy_from_slice(&common::pattern(len, round));
        sq.write(src, remote, Wr::id(0)).unwrap();
        wait_ok(&client.cq);
        let mut seen = vec![0; len];
        target.copy_to_slice(0, &mut seen).unwrap();
        assert_eq!(seen, common::pattern(len, round), "write, round {round}");
    }
    // A UD id's create_qp makes a UD queue pair in RTS.
    let (_ch, ud) = resolved(PortSpace::Udp, addr, None);
    let side = Side::new(ud, 0, 64);
    assert_eq!(side.qp.qp_type(), rdma_verbs::QpType::Ud);
    assert_eq!(side.qp.state().unwrap(), QpState::Rts);
}

#[test]
#[ignore = "needs an RDMA device"]
fn rdma_cm_create_qp_refusals_are_typed() {
    let ch = EventChannel::new().unwrap();
    let id = CmId::new(&ch).unwrap();
    let dev = common::device();
    let pd = dev.ctx.alloc_pd().unwrap();
    let cq = dev.ctx.create_cq(16).build().unwrap();
    // Not bound to a device yet.
    let e = id.create_qp(&pd, &cq, &cq, |b| b).unwrap_err();
    assert!(
        matches!(e, Error::Unsupported(m) if m.contains("create_qp")),
        "{e}"
    );
    // A PD of another context (the test's own open of the device).
    let (_c, id) = resolved(PortSpace::Tcp, server_addr(), None);
    let e = id.create_qp(&pd, &cq, &cq, |b| b).unwrap_err();
    assert!(matches!(e, Error::ForeignContext { .. }), "{e}");
    // Caps the device refuses come back from ibv_create_qp.
    let ctx = id.context().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16).build().unwrap();
    let e = id
        .create_qp(&pd, &cq, &cq, |b| b.max_send_sge(100_000))
        .unwrap_err();
    assert_eq!(e.verb(), Some("ibv_create_qp"), "{e}");
}

#[test]
#[ignore = "needs an RDMA device"]
fn rdma_cm_establish_for_a_queue_pair_the_caller_created() {
    // pyverbs' test_rdmacm_async_traffic_external_qp: the QP is the
    // caller's (created on the PD, in RESET), rdma_cm computes its
    // attributes, and the active side's `rdma_establish` completes the
    // handshake after the library moved it to RTR and RTS.
    let addr = server_addr();
    let (sch, _listener) = listening(PortSpace::Tcp, addr);
    let (cch, cid) = resolved(PortSpace::Tcp, addr, None);
    let ctx = cid.context().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(256).build().unwrap();
    let qp = pd
        .create_qp(rdma_verbs::QpType::Rc, &cq, &cq)
        .build()
        .unwrap();
    assert_eq!(qp.state().unwrap(), QpState::Reset);
    cid.connect(&qp, &ConnParam::new()).unwrap();
    assert_eq!(
        qp.state().unwrap(),
        QpState::Init,
        "INIT before the response"
    );
    let mut req = sch
        .get_event(T)
        .unwrap()
        .expect(CmEventType::ConnectRequest)
        .unwrap();
    let sid = req.take_id().unwrap();
    let sctx = sid.context().unwrap();
    let spd = sctx.alloc_pd().unwrap();
    let scq = sctx.create_cq(256).build().unwrap();
    let sqp = spd
        .create_qp(rdma_verbs::QpType::Rc, &scq, &scq)
        .build()
        .unwrap();
    sid.init_qp(&sqp).unwrap();
    sqp.recv_queue()
        .unwrap()
        .recv(spd.alloc(64, AccessFlags::LOCAL_WRITE).unwrap(), 0)
        .unwrap();
    sid.accept(&sqp, &ConnParam::new()).unwrap();
    // The response: RTR, RTS, rdma_establish, reported as Established.
    cch.get_event(T)
        .unwrap()
        .expect(CmEventType::Established)
        .unwrap();
    assert_eq!(qp.state().unwrap(), QpState::Rts);
    sch.get_event(T)
        .unwrap()
        .expect(CmEventType::Established)
        .unwrap();
    qp.send_queue()
        .unwrap()
        .send_inline(b"established", Wr::id(0))
        .unwrap();
    wait_ok(&cq);
    let mut c = wait_ok(&scq);
    let b = c.take_local().unwrap();
    assert_eq!(&b[..c.byte_len() as usize], b"established");
}

/// Set in the copy of the test process that runs with its own host name.
const HOSTS_NS: &str = "IBVERBS_TEST_CM_HOST_NAME";
/// The host name that copy gets (its own UTS namespace) and that its
/// `/etc/hosts` (bind-mounted in its own mount namespace) maps to the
/// device's address.
const HOST_NAME: &str = "ibverbs-cm-host";

/// Looks `name` up (active side, TCP) and connects to it through a
/// listener bound to the wildcard address `bind`, with a send each way.
fn connect_by_name(name: &str, hints: &AddrInfoHints, port: u16, bind: SocketAddr) -> SocketAddr {
    let found = AddrInfo::lookup(Some(name), Some(&port.to_string()), hints).unwrap();
    let ai = found
        .iter()
        .find(|a| a.dst().is_some_and(|d| d.is_ipv4()))
        .unwrap_or_else(|| panic!("{name}: no IPv4 result in {found:?}"));
    assert_eq!(ai.port_space(), PortSpace::Tcp);
    let dst = ai.dst().unwrap();
    assert_eq!(dst.port(), port);
    eprintln!("{name} -> {dst}");
    let (_cch, client, _sch, _l, server) = rc_connected(dst, bind, 1);
    ping_pong(&client, &server, port as u8);
    dst
}

/// The wildcard address to bind for `port`, by a passive lookup.
fn passive_wildcard(port: u16) -> SocketAddr {
    let passive = AddrInfo::lookup(
        None,
        Some(&port.to_string()),
        &AddrInfoHints::new().passive(true),
    )
    .unwrap();
    let bind = passive
        .iter()
        .find_map(|a| a.src().filter(|s| s.is_ipv4()))
        .expect("an IPv4 wildcard");
    assert!(bind.ip().is_unspecified() && bind.port() == port, "{bind}");
    bind
}

fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: a buffer of its length.
    assert_eq!(
        unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) },
        0
    );
    let n = buf.iter().position(|&b| b == 0).unwrap();
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

#[test]
#[ignore = "needs an RDMA device"]
fn rdma_cm_addrinfo_resolves_host_names_to_connections() {
    let ip = device_ipv4(&common::device());
    if let Ok(port) = std::env::var(HOSTS_NS) {
        // The copy with its own host name (below): the name resolves
        // through /etc/hosts to the device's address.
        let port: u16 = port.parse().unwrap();
        assert_eq!(host_name(), HOST_NAME);
        let dst = connect_by_name(
            HOST_NAME,
            &AddrInfoHints::new(),
            port,
            passive_wildcard(port),
        );
        assert_eq!(dst.ip(), IpAddr::V4(ip));
        return;
    }
    // The numeric address, without a resolver.
    let port = next_port();
    let dst = connect_by_name(
        &ip.to_string(),
        &AddrInfoHints::new().numeric_host(true),
        port,
        passive_wildcard(port),
    );
    assert_eq!(dst.ip(), IpAddr::V4(ip));
    // "localhost" resolves (127.0.0.1), but rdma_cm has no route to a
    // loopback address over RoCE: the refusal names the verb.
    let port = next_port();
    let found = AddrInfo::lookup(
        Some("localhost"),
        Some(&port.to_string()),
        &AddrInfoHints::new(),
    )
    .unwrap();
    let lo = found
        .iter()
        .find_map(|a| a.dst().filter(|d| d.is_ipv4()))
        .unwrap();
    assert!(lo.ip().is_loopback(), "{lo}");
    let ch = EventChannel::new().unwrap();
    let id = CmId::new(&ch).unwrap();
    id.resolve_addr(None, lo, RESOLVE).unwrap();
    ch.get_event(T)
        .unwrap()
        .expect(CmEventType::AddrResolved)
        .unwrap();
    let e = id.resolve_route(RESOLVE).unwrap_err();
    assert_eq!(e.verb(), Some("rdma_resolve_route"), "{e}");
    assert_eq!(e.raw_os_error(), Some(libc::ENODEV), "{e}");
    // An unknown name: the resolver's reason, naming the verb.
    let e = AddrInfo::lookup(
        Some("no-such-host.invalid"),
        Some("7471"),
        &AddrInfoHints::new(),
    )
    .unwrap_err();
    assert_eq!(e.verb(), Some("rdma_getaddrinfo"), "{e}");
    assert!(e.to_string().contains("no-such-host.invalid"), "{e}");
    assert!(e.to_string().contains("getaddrinfo code"), "{e}");

    // The VM's own host name: it is unset there ("(none)") and its
    // /etc/hosts (the host's) maps every name to 127.0.0.1, which RoCE
    // cannot route (above). So a copy of this test runs with a host name of
    // its own (a UTS namespace) that its /etc/hosts (bind-mounted in a
    // mount namespace: the VM's files stay untouched) maps to the device's
    // address.
    let hosts = std::env::temp_dir().join(format!("ibverbs-cm-hosts-{}", std::process::id()));
    std::fs::write(&hosts, format!("127.0.0.1 localhost\n{ip} {HOST_NAME}\n")).unwrap();
    let src = std::ffi::CString::new(hosts.to_str().unwrap()).unwrap();
    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--ignored",
        "--exact",
        "--nocapture",
        "--test-threads=1",
        "rdma_cm_addrinfo_resolves_host_names_to_connections",
    ])
    .env(HOSTS_NS, next_port().to_string());
    // SAFETY: between fork and exec the closure makes raw system calls only
    // (no allocation, no locks), on memory prepared before the fork.
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(move || {
            let rc = |r: libc::c_int| {
                if r == 0 {
                    Ok(())
                } else {
                    Err(std::io::Error::last_os_error())
                }
            };
            rc(libc::unshare(libc::CLONE_NEWNS | libc::CLONE_NEWUTS))?;
            rc(libc::mount(
                std::ptr::null(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ))?;
            rc(libc::mount(
                src.as_ptr(),
                c"/etc/hosts".as_ptr(),
                std::ptr::null(),
                libc::MS_BIND,
                std::ptr::null(),
            ))?;
            rc(libc::sethostname(
                HOST_NAME.as_ptr().cast(),
                HOST_NAME.len(),
            ))
        });
    }
    let out = cmd.output().unwrap();
    let _ = std::fs::remove_file(&hosts);
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "the copy with a host name failed:\n{text}"
    );
    assert!(text.contains("1 passed"), "{text}");
    assert!(text.contains(&format!("{HOST_NAME} -> {ip}:")), "{text}");
}

#[test]
#[ignore = "needs an RDMA device"]
fn rdma_cm_sync_ids_connect_accept_and_carry_traffic() {
    // pyverbs' test_rdmacm_sync_traffic: no event channel; each call
    // blocks until rdma_cm answered.
    let addr = server_addr();
    let listener = CmId::new_sync(PortSpace::Tcp).unwrap();
    assert!(listener.is_sync());
    listener.bind_addr(addr).unwrap();
    listener.listen(1).unwrap();
    // No request yet: a bounded wait times out.
    let e = listener
        .get_request(Some(Duration::from_millis(100)))
        .unwrap_err();
    assert!(e.to_string().contains("no connect request"), "{e}");
    let server = std::thread::spawn(move || -> Result<Vec<u8>, Error> {
        let id = listener.get_request(T)?;
        assert!(id.is_sync());
        let side = Side::new(id, 2, 64);
        side.id.accept(&side.qp, &ConnParam::new())?; // returns established
        assert_eq!(side.qp.state()?, QpState::Rts);
        let got = side.recv(0);
        side.send(b"sync pong");
        // Blocks until Disconnected (the client disconnects first or
        // this sends the DREQ).
        side.id.disconnect()?;
        drop(side);
        drop(listener);
        Ok(got)
    });
    let id = CmId::new_sync(PortSpace::Tcp).unwrap();
    id.resolve_addr(None, addr, RESOLVE).unwrap(); // returns resolved
    assert!(id.context().is_some());
    id.resolve_route(RESOLVE).unwrap();
    let client = Side::new(id, 2, 64);
    client.id.connect(&client.qp, &ConnParam::new()).unwrap(); // returns connected
    assert_eq!(client.qp.state().unwrap(), QpState::Rts);
    client.send(b"sync ping");
    assert_eq!(client.recv(0), b"sync pong");
    client.id.disconnect().unwrap();
    assert_eq!(server.join().unwrap().unwrap(), b"sync ping");

    // What a synchronous id refuses, by type.
    let sync = CmId::new_sync(PortSpace::Udp).unwrap();
    let ch = EventChannel::new().unwrap();
    assert!(matches!(sync.migrate(&ch), Err(Error::Unsupported(_))));
    let e = sync
        .join_multicast("239.7.8.9:0".parse().unwrap(), None)
        .unwrap_err();
    assert!(matches!(e, Error::Unsupported(_)), "{e}");
    let async_id = CmId::new(&ch).unwrap();
    assert!(!async_id.is_sync());
    let e = async_id.get_request(None).unwrap_err();
    assert!(
        matches!(e, Error::Unsupported(m) if m.contains("rdma_get_request")),
        "{e}"
    );
}

#[test]
#[ignore = "needs an RDMA device"]
fn rdma_cm_udp_connect_accept_gives_ud_params_and_carries_datagrams() {
    // pyverbs' test_rdmacm_async_udp_traffic: UDP port space ids, a SIDR
    // lookup by connect/accept, the server's QPN and Q_Key from the
    // client's Established event, datagrams both ways.
    let addr = server_addr();
    let (sch, listener) = listening(PortSpace::Udp, addr);
    let (cch, cid) = resolved(PortSpace::Udp, addr, None);
    let client = Side::new(cid, 8, GRH + 1024);
    client
        .id
        .connect(&client.qp, &ConnParam::new().private_data(b"ud hello"))
        .unwrap();
    let mut req = sch
        .get_event(T)
        .unwrap()
        .expect(CmEventType::ConnectRequest)
        .unwrap();
    assert!(req.is_for(&listener));
    assert_eq!(req.private_data().get(..8), Some(&b"ud hello"[..]));
    let server = Side::new(req.take_id().unwrap(), 8, GRH + 1024);
    server.id.accept(&server.qp, &ConnParam::new()).unwrap();
    let ev = cch
        .get_event(T)
        .unwrap()
        .expect(CmEventType::Established)
        .unwrap();
    let ud = ev
        .ud_param()
        .expect("a UD id's Established carries UdParam")
        .clone();
    assert_eq!(
        ud.qp_num,
        server.qp.qp_num(),
        "SIDR reply: the server's QPN"
    );
    let qkey = server.qp.query().unwrap().0.qkey();
    assert_eq!(ud.qkey, qkey, "SIDR reply: the id's Q_Key");
    assert_eq!(client.qp.query().unwrap().0.qkey(), qkey);
    let to_server = client.pd.create_ah(&ud.address).unwrap();

    // The reply's address: the client's GID (same host here), the server's
    // own GID index for that address.
    let peer = client.id.local_addr().unwrap().ip();
    let sctx = server.id.context().unwrap();
    let gid = sctx
        .select_gid(server.id.port_num(), &GidSelector::Address(peer))
        .unwrap();
    let to_client = server
        .pd
        .create_ah(&rdma_verbs::qp::AddressVector::roce(
            server.id.port_num(),
            gid.gid,
            gid.index,
        ))
        .unwrap();
    for (i, len) in [1usize, 64, 512, 1024].into_iter().enumerate() {
        let data = common::pattern(len, i as u8);
        let mut b = client.pd.alloc(len, AccessFlags::LOCAL_WRITE).unwrap();
        b.copy_from_slice(&data);
        client
            .qp
            .send_queue()
            .unwrap()
            .send_to(b, &UdDest::new(&to_server, ud.qp_num, ud.qkey), Wr::id(0))
            .unwrap();
        wait_ok(&client.cq);
        let mut c = wait_ok(&server.cq);
        assert_eq!(c.src_qp(), client.qp.qp_num().0, "the requester's QPN");
        let n = c.byte_len() as usize;
        let got: LocalBuffer = c.take_local().unwrap();
        assert_eq!(&got[GRH..n], &data[..], "datagram {i}");
        // Echo it back to the QPN it came from.
        let mut b = server.pd.alloc(len, AccessFlags::LOCAL_WRITE).unwrap();
        b.copy_from_slice(&data);
        let back = UdDest::new(&to_client, rdma_verbs::qp::QpNumber(c.src_qp()), qkey);
        server
            .qp
            .send_queue()
            .unwrap()
            .send_to(b, &back, Wr::id(0))
            .unwrap();
        wait_ok(&server.cq);
        assert_eq!(client.recv(GRH), data, "echo {i}");
    }
    // A connected type on a UD id is refused by type.
    let rc_cq = client.pd.context().create_cq(256).build().unwrap();
    let rc = client
        .pd
        .create_qp(rdma_verbs::QpType::Rc, &rc_cq, &rc_cq)
        .build()
        .unwrap();
    assert!(matches!(
        client.id.connect(&rc, &ConnParam::new()),
        Err(Error::WrongQpType { .. })
    ));
    // Too much private data for a SIDR request.
    let e = client
        .id
        .connect(&client.qp, &ConnParam::new().private_data(&[0; 181]))
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::OutOfRange {
                value: 181,
                max: 180,
                ..
            }
        ),
        "{e}"
    );
}
