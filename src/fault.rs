//! The data mover of `cargo xtask faults` (the `fault_peer` binary is its
//! command line): moves data over an RC queue
//! pair (send/recv, RDMA write with immediate, RDMA read) with a sequence
//! number and checksum in every message, while the harness injects faults
//! (loss, reordering, a killed peer, a link down, missing receives).
//!
//! It ends with one line the harness parses:
//! `RESULT role=client op=send status=ok msgs=1024 bytes=67108864 verified=1024 posted=1024 returned=1024 first_error=- secs=4.2`
//! `status` is `ok`, `error:<WcStatus>` (a typed error completion was
//! observed and every outstanding request was then flushed back),
//! `event:<AsyncEventType>`, `corrupt` (a checksum or order violation) or
//! `timeout`. Exit status 0 whenever the run reached a definite outcome.
//!
//! ```text
//! fault_peer server --tcp-port 7000 [--device rxe1]
//! fault_peer client 192.168.77.1 --tcp-port 7000 --op write --msg-size 65536 --total 67108864
//! fault_peer cq-overrun [--device rxe0]
//! ```

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use clap::ValueEnum;
use ibverbs::{
    AccessFlags, AsyncEventType, Buf, Completions, ConnectOptions, Context, Endpoint, Gid,
    GidIndex, LocalBuffer, LocalPort, PortNumber, QpNumber, QpType, QueuePair, RecvRequest,
    RemoteKey, RemoteMemory, SendRequest, SgList,
};

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum, Debug)]
/// The operation that moves the data.
pub enum Op {
    /// Send/receive.
    Send,
    /// RDMA write with immediate.
    Write,
    /// RDMA read.
    Read,
    /// Fetch-and-add on one 8-byte counter: request `i` adds `i + 1`, so
    /// it must find `i (i + 1) / 2` (`--msg-size 8`).
    Atomic,
    /// RDMA reads and fetch-and-adds in turn on one queue pair: read `k`,
    /// then fetch-and-add `k` (adding `k + 1`) on a counter after the
    /// read region, and so on: multi-packet reads and atomics share the
    /// responder's resources for reads and atomics.
    Mixed,
}

/// What fetch-and-add `i` of an atomic run must find: the sum of the
/// addends before it (`1 + 2 + … + i`, wrapping).
pub fn atomic_expected(i: u64) -> u64 {
    // i (i + 1) / 2 without overflowing before the division.
    match i % 2 {
        0 => (i / 2).wrapping_mul(i.wrapping_add(1)),
        _ => i.wrapping_mul(i.wrapping_add(1) / 2),
    }
}

/// Says what a wrong fetch-and-add result means: the difference from the
/// expected value, and the request whose addend it is (executed twice).
pub fn atomic_explain(i: u64, got: u64) -> String {
    let want = atomic_expected(i);
    let diff = got.wrapping_sub(want);
    let twice = match diff {
        1..=1_000_000_000 if diff <= i => format!(
            " = the addend of request {}: it took effect twice",
            diff - 1
        ),
        _ => String::new(),
    };
    format!("fetch-and-add {i} found {got}, expected {want} (difference {diff}{twice})")
}

#[derive(clap::Args, Clone)]
/// Options both roles take.
pub struct Common {
    /// RDMA device (default: the first with an active port).
    #[arg(short = 'd', long)]
    pub device: Option<String>,
    /// Port of the device (default: its first active port).
    #[arg(short = 'i', long)]
    pub ib_port: Option<u8>,
    /// GID index (default: on RoCE the port's RoCE v2 GID with a non-link-local IPv4 address, else its first valid GID; 0 on InfiniBand).
    #[arg(short = 'g', long)]
    pub gid_index: Option<u8>,
    /// TCP port of the out-of-band exchange.
    #[arg(short = 'p', long, default_value_t = 7000)]
    pub tcp_port: u16,
    /// QP local ACK timeout exponent (4.096 µs · 2^timeout).
    #[arg(long, default_value_t = 14)]
    pub timeout: u8,
    /// Transport retries before RETRY_EXC_ERR.
    #[arg(long, default_value_t = 7)]
    pub retry_cnt: u8,
    /// RNR retries (7 = infinite).
    #[arg(long, default_value_t = 7)]
    pub rnr_retry: u8,
    /// Give up after this many seconds (status=timeout).
    #[arg(long, default_value_t = 300)]
    pub deadline: u64,
}

mod message;

use message::{check, fill};

const RX_DEPTH: usize = 64;

/// What a run did, printed as the `RESULT` line the harness parses.
pub struct Stats {
    role: &'static str,
    op: Op,
    status: String,
    msgs: u64,
    bytes: u64,
    verified: u64,
    posted: u64,
    returned: u64,
    first_error: String,
    start: Instant,
    last_ok: Option<Instant>,
    stall: Option<Duration>,
    /// The progress watchdog moved the QP to ERR.
    watchdog: bool,
}

impl Stats {
    fn new(role: &'static str, op: Op) -> Stats {
        Stats {
            role,
            op,
            status: "ok".into(),
            msgs: 0,
            bytes: 0,
            verified: 0,
            posted: 0,
            returned: 0,
            first_error: "-".into(),
            start: Instant::now(),
            last_ok: None,
            stall: None,
            watchdog: false,
        }
    }
    fn fail(&mut self, status: String) {
        if self.status == "ok" {
            self.status = status;
        }
    }
    /// Records an error completion (the first one's status and how long
    /// after the last good completion it came).
    fn error(&mut self, status: ibverbs::WcStatus) {
        if self.first_error == "-" {
            self.first_error = format!("{status:?}");
            let since = self.last_ok.unwrap_or(self.start);
            self.stall = Some(since.elapsed());
        }
        self.fail(format!("error:{status:?}"));
    }
    /// Prints the `RESULT` line.
    pub fn print(&self) {
        println!(
            "RESULT role={} op={:?} status={} msgs={} bytes={} verified={} posted={} returned={} first_error={} stall_secs={:.2} watchdog={} secs={:.1}",
            self.role,
            self.op,
            self.status,
            self.msgs,
            self.bytes,
            self.verified,
            self.posted,
            self.returned,
            self.first_error,
            self.stall.map_or(0.0, |d| d.as_secs_f64()),
            u8::from(self.watchdog),
            self.start.elapsed().as_secs_f64()
        );
    }
}

pub(crate) struct Setup {
    pub(crate) ctx: Context,
    pub(crate) port: PortNumber,
    pub(crate) gid_index: GidIndex,
}

pub(crate) fn open(
    device: &Option<String>,
    ib_port: Option<u8>,
    gid: Option<u8>,
) -> Result<Setup, Box<dyn std::error::Error>> {
    let list = ibverbs::devices()?;
    let ctx = match device {
        Some(name) => list
            .find(name)
            .ok_or_else(|| ibverbs::Error::NoDevice {
                name: Some(name.clone()),
            })?
            .open()?,
        None => {
            let mut found = None;
            for d in list.iter() {
                let ctx = d.open()?;
                if ctx.active_port().is_ok() {
                    found = Some(ctx);
                    break;
                }
            }
            found.ok_or("no RDMA device with an active port")?
        }
    };
    let port = match ib_port {
        Some(p) => PortNumber(p),
        None => ctx.active_port()?,
    };
    let gid_index = match gid {
        Some(g) => GidIndex(g),
        None => ctx.default_gid_index(port)?,
    };
    Ok(Setup {
        ctx,
        port,
        gid_index,
    })
}

/// The endpoint of `qp` on the setup's port and GID, sending from `psn`.
pub(crate) fn endpoint(s: &Setup, qp: &QueuePair, psn: u32) -> ibverbs::Result<Endpoint> {
    LocalPort::query(&s.ctx, s.port, Some(s.gid_index))?.endpoint(qp, psn)
}

/// The out-of-band hello: one text line each way.
fn hello(ep: &Endpoint, mem: Option<RemoteMemory>, extra: &str) -> String {
    let (addr, len, rkey) = mem.map_or((0, 0, 0), |m| (m.addr, m.len, m.rkey.0));
    format!(
        "FP1 qpn={} psn={} lid={} gid={} addr={addr} len={len} rkey={rkey} {extra}\n",
        ep.qp_num.0, ep.psn, ep.lid, ep.gid
    )
}

#[derive(Debug)]
struct Hello {
    ep: Endpoint,
    mem: RemoteMemory,
    fields: Vec<(String, String)>,
}

fn parse_hello(line: &str) -> Result<Hello, String> {
    let mut it = line.split_whitespace();
    if it.next() != Some("FP1") {
        return Err(format!("bad hello {line:?}"));
    }
    let fields: Vec<(String, String)> = it
        .filter_map(|kv| {
            kv.split_once('=')
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
        })
        .collect();
    let get = |k: &str| -> Result<&str, String> {
        fields
            .iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.as_str())
            .ok_or(format!("hello lacks {k}"))
    };
    let num = |k: &str| -> Result<u64, String> {
        get(k)?.parse().map_err(|e| format!("hello field {k}: {e}"))
    };
    let ep = Endpoint {
        qp_num: QpNumber(num("qpn")? as u32),
        psn: num("psn")? as u32 & 0xff_ffff,
        lid: num("lid")? as u16,
        gid: get("gid")?
            .parse::<Gid>()
            .map_err(|e| format!("gid: {e}"))?,
    };
    let mem = RemoteMemory {
        addr: num("addr")?,
        len: num("len")?,
        rkey: RemoteKey(num("rkey")? as u32),
    };
    Ok(Hello { ep, mem, fields })
}

fn read_line(stream: &TcpStream) -> Result<String, String> {
    let mut line = String::new();
    BufReader::new(stream.try_clone().map_err(|e| e.to_string())?)
        .take(4096)
        .read_line(&mut line)
        .map_err(|e| format!("exchange: {e}"))?;
    if line.is_empty() {
        return Err("peer closed the exchange".into());
    }
    Ok(line)
}

fn connect_qp(
    s: &Setup,
    c: &Common,
    qp: &QueuePair,
    me: &Endpoint,
    remote: &Endpoint,
) -> ibverbs::Result<()> {
    let opts = ConnectOptions::new(s.port)
        .gid_index(s.gid_index)
        .timeout(c.timeout)
        .retry_cnt(c.retry_cnt)
        .rnr_retry(c.rnr_retry)
        .min_rnr_timer(12)
        .rd_atomic(16)
        .remote_access(
            AccessFlags::LOCAL_WRITE
                | AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_ATOMIC,
        );
    qp.connect(me, remote, &opts)
}

/// See the module docs.
pub fn server(c: Common, recv_delay_ms: u64) -> Result<Stats, String> {
    let s = open(&c.device, c.ib_port, c.gid_index).map_err(|e| e.to_string())?;
    let listener = TcpListener::bind(("0.0.0.0", c.tcp_port)).map_err(|e| e.to_string())?;
    eprintln!("fault_peer server: listening on {}", c.tcp_port);
    // Accept with a deadline: a client that never comes must not hang us.
    listener.set_nonblocking(true).map_err(|e| e.to_string())?;
    let accept_by = Instant::now() + Duration::from_secs(c.deadline);
    let stream = loop {
        match listener.accept() {
            Ok((s, _)) => break s,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && Instant::now() < accept_by => {
                std::thread::sleep(Duration::from_millis(50))
            }
            Err(e) => return Err(format!("accept: {e}")),
        }
    };
    stream.set_nonblocking(false).map_err(|e| e.to_string())?;
    stream
        .set_read_timeout(Some(Duration::from_secs(c.deadline)))
        .ok();
    let client = parse_hello(&read_line(&stream)?)?;
    let field = |k: &str| {
        client
            .fields
            .iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.clone())
    };
    let op = match field("op").as_deref() {
        Some("send") => Op::Send,
        Some("write") => Op::Write,
        Some("read") => Op::Read,
        Some("atomic") => Op::Atomic,
        Some("mixed") => Op::Mixed,
        other => return Err(format!("unknown op {other:?}")),
    };
    let msg_size: usize = field("size")
        .and_then(|v| v.parse().ok())
        .ok_or("no size")?;
    let msgs: u64 = field("msgs")
        .and_then(|v| v.parse().ok())
        .ok_or("no msgs")?;
    let min = if op == Op::Atomic { 8 } else { 16 };
    if !(min..=(1 << 24)).contains(&msg_size) || msgs == 0 || msgs > (1 << 20) {
        return Err(format!("refusing size {msg_size} × {msgs}"));
    }
    let mut st = Stats::new("server", op);
    let pd = s.ctx.alloc_pd().map_err(|e| e.to_string())?;
    let cq = s
        .ctx
        .create_cq(RX_DEPTH as u32 * 2)
        .build()
        .map_err(|e| e.to_string())?;
    let qp = pd
        .create_qp(QpType::Rc, &cq, &cq)
        .max_recv_wr(RX_DEPTH as u32)
        .max_send_wr(4)
        .build()
        .map_err(|e| e.to_string())?;
    let me = endpoint(&s, &qp, Endpoint::random_psn()).map_err(|e| e.to_string())?;
    let total = msg_size as u64 * msgs;
    let rights = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    // write: peers write here; read: we fill it and peers read it (both
    // stay alive until this function returns).
    let mut shared = None;
    let mut read_src = None;
    let exposed = match op {
        Op::Send => None,
        Op::Write => {
            let m = pd
                .alloc_shared(total as usize, rights)
                .map_err(|e| e.to_string())?;
            let r = m.remote();
            shared = Some(m);
            r
        }
        Op::Read => {
            let mut m = pd
                .alloc(
                    total as usize,
                    AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ,
                )
                .map_err(|e| e.to_string())?;
            for (i, chunk) in m.chunks_mut(msg_size).enumerate() {
                fill(chunk, i as u64);
            }
            let r = m.memory_region().remote();
            read_src = Some(m);
            r
        }
        Op::Mixed => {
            // The messages to read, then the counter.
            let mut m = pd
                .alloc_shared(
                    total as usize + 8,
                    AccessFlags::LOCAL_WRITE
                        | AccessFlags::REMOTE_READ
                        | AccessFlags::REMOTE_ATOMIC,
                )
                .map_err(|e| e.to_string())?;
            let mut msg = vec![0u8; msg_size];
            for i in 0..msgs {
                fill(&mut msg, i);
                m.copy_from_slice(i as usize * msg_size, &msg)
                    .map_err(|e| e.to_string())?;
            }
            let r = m.remote();
            shared = Some(m);
            r
        }
        Op::Atomic => {
            let m = pd
                .alloc_shared(8, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_ATOMIC)
                .map_err(|e| e.to_string())?;
            let r = m.remote();
            shared = Some(m);
            r
        }
    };
    connect_qp(&s, &c, &qp, &me, &client.ep).map_err(|e| e.to_string())?;
    // Receive buffers (send op) or zero-length receives (write with imm).
    let recv_len = if op == Op::Send { msg_size } else { 0 };
    let mut pool: Vec<LocalBuffer> = Vec::new();
    if recv_len > 0 {
        (pool, _) = pd
            .alloc(recv_len * RX_DEPTH, AccessFlags::LOCAL_WRITE)
            .map_err(|e| e.to_string())?
            .chunks_exact(recv_len);
    }
    let post = |qp: &QueuePair, buf: Option<LocalBuffer>| -> Result<(), String> {
        let wr = match buf {
            Some(b) => RecvRequest::new(b),
            None => RecvRequest::empty(),
        };
        qp.post_recv(wr).map_err(|e| e.error.to_string())
    };
    let initial = RX_DEPTH.min(msgs as usize) as u64;
    let post_initial = |pool: &mut Vec<LocalBuffer>, st: &mut Stats| {
        for _ in 0..initial {
            post(&qp, pool.pop())?;
            st.posted += 1;
        }
        Ok::<(), String>(())
    };
    // A responder posts its receives before it lets the peer send (as
    // rc_pingpong and perftest do): a client that starts first meets an
    // empty receive queue (RNR NAKs). The RNR scenario posts them late on
    // purpose (--recv-delay-ms), after the hello.
    let one_sided = matches!(op, Op::Read | Op::Atomic | Op::Mixed);
    if !one_sided && recv_delay_ms == 0 {
        post_initial(&mut pool, &mut st)?;
    }
    // The harness times its faults from this line.
    eprintln!("fault_peer server: connected");
    (&stream)
        .write_all(hello(&me, exposed, "").as_bytes())
        .map_err(|e| e.to_string())?;
    let deadline = Instant::now() + Duration::from_secs(c.deadline);
    if one_sided {
        // The client verifies; wait for its verdict line.
        let line = read_line(&stream).unwrap_or_default();
        st.msgs = msgs;
        st.bytes = total;
        if !line.starts_with("DONE") {
            st.fail(format!("peer:{}", line.trim().replace(' ', "_")));
        }
        drop((read_src, shared));
        return Ok(st);
    }
    if recv_delay_ms > 0 {
        std::thread::sleep(Duration::from_millis(recv_delay_ms));
        post_initial(&mut pool, &mut st)?;
    }
    let mut outstanding = initial;
    let mut batch = Completions::with_capacity(32);
    let mut scratch = vec![0u8; msg_size];
    let mut next_post = initial;
    // The client reports its end over TCP; a client that gave up (error)
    // means no more data will come: then flush our receives back.
    stream.set_nonblocking(true).map_err(|e| e.to_string())?;
    let mut peer_line = String::new();
    let mut peer_done: Option<(String, Instant)> = None;
    let mut last_check = Instant::now();
    while (st.msgs < msgs && st.status == "ok") || outstanding > 0 {
        if Instant::now() > deadline && st.status == "ok" {
            st.fail("timeout".into());
            let _ = qp.to_err();
        }
        if Instant::now() > deadline + Duration::from_secs(30) {
            break; // the device did not even flush: report what we have
        }
        if last_check.elapsed() > Duration::from_millis(100) && st.status == "ok" {
            last_check = Instant::now();
            let mut buf = [0u8; 256];
            match (&stream).read(&mut buf) {
                Ok(0) => peer_line.push_str("DONE closed"),
                Ok(n) => peer_line.push_str(&String::from_utf8_lossy(&buf[..n])),
                Err(_) => {}
            }
            if let (None, Some(rest)) = (&peer_done, peer_line.strip_prefix("DONE ")) {
                let status = rest.split_whitespace().next().unwrap_or("?").to_owned();
                peer_done = Some((status, Instant::now()));
            }
        }
        // The client's "DONE ok" can overtake our last completions (it
        // follows the ACK, and the ACK our last poll): give them a moment to
        // arrive before calling the transfer short.
        if let Some((status, at)) = &peer_done {
            let short = st.msgs < msgs && at.elapsed() > Duration::from_secs(2);
            if st.status == "ok" && (status != "ok" || short) {
                st.fail(format!("peer:{status}"));
                let _ = qp.to_err();
            }
        }
        cq.poll(&mut batch).map_err(|e| e.to_string())?;
        for mut comp in batch.drain() {
            outstanding -= 1;
            st.returned += 1;
            let buf = comp.take_local();
            if !comp.is_success() {
                st.error(comp.status());
                continue;
            }
            st.last_ok = Some(Instant::now());
            if st.status != "ok" {
                continue;
            }
            let seq = st.msgs;
            let verdict = match op {
                Op::Send => check(&buf.as_ref().unwrap()[..], seq),
                _ => {
                    let imm = comp.imm_data().map(u64::from);
                    if imm != Some(seq) {
                        Err(format!("write {seq}: immediate {imm:?}"))
                    } else {
                        let sh = shared.as_ref().unwrap();
                        sh.copy_to_slice(seq as usize * msg_size, &mut scratch)
                            .map_err(|e| e.to_string())
                            .and_then(|()| check(&scratch, seq))
                    }
                }
            };
            match verdict {
                Ok(()) => st.verified += 1,
                Err(e) => {
                    eprintln!("fault_peer server: {e}");
                    st.fail("corrupt".into());
                }
            }
            st.msgs += 1;
            st.bytes += msg_size as u64;
            if next_post < msgs && st.status == "ok" {
                post(&qp, buf)?;
                outstanding += 1;
                next_post += 1;
                st.posted += 1;
            }
        }
        if st.status != "ok" && outstanding > 0 {
            // Get every receive back: error state flushes them.
            let _ = qp.to_err();
        }
    }
    stream.set_nonblocking(false).map_err(|e| e.to_string())?;
    let _ = (&stream).write_all(format!("DONE {} {}\n", st.status, st.verified).as_bytes());
    // Keep the QP (the responder) until the client is done: if the ACK of
    // its last message was lost, its retransmission needs us to answer.
    // Returning now would destroy the QP, and the client (rxe retries
    // forever with retry_cnt 7) would wait for its deadline.
    if !peer_line.contains("DONE") {
        let left = (deadline + Duration::from_secs(30)).saturating_duration_since(Instant::now());
        stream
            .set_read_timeout(Some(left.max(Duration::from_secs(1))))
            .ok();
        let _ = read_line(&stream);
    }
    Ok(st)
}

/// See the module docs.
pub fn client(
    host: String,
    c: Common,
    op: Op,
    msg_size: usize,
    total: u64,
    window: usize,
    stall_timeout: f64,
) -> Result<Stats, String> {
    if op == Op::Atomic && msg_size != 8 {
        return Err("--op atomic moves 8 bytes per request: --msg-size 8".into());
    }
    if op != Op::Atomic && msg_size < 16 {
        return Err("--msg-size must be at least 16".into());
    }
    let msgs = total.div_ceil(msg_size as u64);
    let s = open(&c.device, c.ib_port, c.gid_index).map_err(|e| e.to_string())?;
    let mut st = Stats::new("client", op);
    let pd = s.ctx.alloc_pd().map_err(|e| e.to_string())?;
    let cq = s
        .ctx
        .create_cq(window as u32 * 2 + 4)
        .build()
        .map_err(|e| e.to_string())?;
    let qp = pd
        .create_qp(QpType::Rc, &cq, &cq)
        // Mixed has a message and a fetch-and-add in flight per slot.
        .max_send_wr(if op == Op::Mixed { 2 * window } else { window } as u32)
        .max_recv_wr(4)
        .build()
        .map_err(|e| e.to_string())?;
    let me = endpoint(&s, &qp, Endpoint::random_psn()).map_err(|e| e.to_string())?;
    // Connect (the server may start later).
    let t0 = Instant::now();
    let stream = loop {
        match TcpStream::connect((host.as_str(), c.tcp_port)) {
            Ok(st) => break st,
            Err(e) if t0.elapsed() < Duration::from_secs(300) => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(e) => return Err(format!("connect {host}:{}: {e}", c.tcp_port)),
        }
    };
    stream
        .set_read_timeout(Some(Duration::from_secs(c.deadline)))
        .ok();
    let op_name = format!("{op:?}").to_lowercase();
    (&stream)
        .write_all(
            hello(
                &me,
                None,
                &format!("op={op_name} size={msg_size} msgs={msgs}"),
            )
            .as_bytes(),
        )
        .map_err(|e| e.to_string())?;
    let server = parse_hello(&read_line(&stream)?)?;
    connect_qp(&s, &c, &qp, &me, &server.ep).map_err(|e| e.to_string())?;
    // The harness times its faults from this line.
    eprintln!("fault_peer client: connected");
    st.start = Instant::now();
    let (mut pool, _) = pd
        .alloc(msg_size * window, AccessFlags::LOCAL_WRITE)
        .map_err(|e| e.to_string())?
        .chunks_exact(msg_size);
    // Mixed: the fetch-and-adds' 8-byte results, apart from the messages.
    let (mut results, _) = pd
        .alloc(8 * window, AccessFlags::LOCAL_WRITE)
        .map_err(|e| e.to_string())?
        .chunks_exact(8);
    let requests = match op {
        Op::Mixed => 2 * msgs,
        _ => msgs,
    };
    let deadline = Instant::now() + Duration::from_secs(c.deadline);
    let mut last_progress = Instant::now();
    // The server's verdict line can come before the end: a server that found
    // a message wrong stops (its QP in ERR), and a client that kept sending
    // into it would only retry until its deadline. Read it as it comes.
    stream.set_nonblocking(true).map_err(|e| e.to_string())?;
    let mut verdict = String::new();
    let mut last_check = Instant::now();
    let mut batch = Completions::with_capacity(32);
    let mut next = 0u64;
    let mut outstanding = 0u64;
    let mut done = 0u64; // completed in order
    while (next < requests && st.status == "ok") || outstanding > 0 {
        while next < requests && st.status == "ok" {
            if op == Op::Mixed && next % 2 == 1 {
                let Some(r) = results.pop() else { break };
                let counter = server
                    .mem
                    .slice(msgs * msg_size as u64, 8)
                    .ok_or("server region too small")?;
                let wr = SendRequest::fetch_and_add(r, counter, next / 2 + 1);
                match qp.post_send(wr.wr_id(next)) {
                    Ok(()) => {
                        next += 1;
                        outstanding += 1;
                        st.posted += 1;
                    }
                    Err(e) => {
                        st.fail(format!("post:{}", e.error).replace(' ', "_"));
                        if let SgList::One(Buf::Local(b)) = e.request.into_buffers() {
                            results.push(b);
                        }
                    }
                }
                continue;
            }
            let Some(mut buf) = pool.pop() else { break };
            let wr = match op {
                Op::Send => {
                    fill(&mut buf, next);
                    SendRequest::send(buf)
                }
                Op::Mixed => {
                    let remote = server
                        .mem
                        .slice(next / 2 * msg_size as u64, msg_size as u64)
                        .ok_or("server region too small")?;
                    SendRequest::read(buf, remote)
                }
                Op::Write => {
                    fill(&mut buf, next);
                    let remote = server
                        .mem
                        .slice(next * msg_size as u64, msg_size as u64)
                        .ok_or("server region too small")?;
                    SendRequest::write(buf, remote).imm(next as u32)
                }
                Op::Read => {
                    let remote = server
                        .mem
                        .slice(next * msg_size as u64, msg_size as u64)
                        .ok_or("server region too small")?;
                    SendRequest::read(buf, remote)
                }
                Op::Atomic => SendRequest::fetch_and_add(buf, server.mem, next.wrapping_add(1)),
            };
            match qp.post_send(wr.wr_id(next)) {
                Ok(()) => {
                    next += 1;
                    outstanding += 1;
                    st.posted += 1;
                }
                Err(e) => {
                    st.fail(format!("post:{}", e.error).replace(' ', "_"));
                    if let SgList::One(Buf::Local(b)) = e.request.into_buffers() {
                        pool.push(b);
                    }
                }
            }
        }
        if Instant::now() > deadline && st.status == "ok" {
            // Give up, but get every buffer back: the error state flushes.
            st.fail("timeout".into());
            let _ = qp.to_err();
        }
        if stall_timeout > 0.0
            && outstanding > 0
            && st.status == "ok"
            && !st.watchdog
            && last_progress.elapsed().as_secs_f64() > stall_timeout
        {
            // The device neither completes nor fails the outstanding
            // requests (rxe can stall without retrying while its netdev is
            // down): end it as an application would, with typed flushes.
            eprintln!(
                "fault_peer client: no completion for {stall_timeout:.1} s with {outstanding} \
                 outstanding: moving the QP to ERR (progress watchdog)"
            );
            st.watchdog = true;
            let _ = qp.to_err();
        }
        if Instant::now() > deadline + Duration::from_secs(30) {
            break; // the device did not even flush: report what we have
        }
        if !verdict.contains('\n') && last_check.elapsed() > Duration::from_millis(100) {
            last_check = Instant::now();
            let mut buf = [0u8; 256];
            if let Ok(n @ 1..) = (&stream).read(&mut buf) {
                verdict.push_str(&String::from_utf8_lossy(&buf[..n]));
            }
            // A closed exchange is no verdict: a killed server is the
            // transport's to report (RETRY_EXC_ERR, REM_OP_ERR).
            if let Some(status) = verdict_status(&verdict) {
                if status != "ok" && st.status == "ok" {
                    st.fail(format!("peer:{status}"));
                    let _ = qp.to_err();
                }
            }
        }
        cq.poll(&mut batch).map_err(|e| e.to_string())?;
        for mut comp in batch.drain() {
            last_progress = Instant::now();
            outstanding -= 1;
            st.returned += 1;
            let buf = comp.take_local();
            if !comp.is_success() {
                st.error(comp.status());
            } else if st.status == "ok" {
                st.last_ok = Some(Instant::now());
                if comp.wr_id() != done {
                    eprintln!(
                        "fault_peer client: completion {} out of order (expected {done})",
                        comp.wr_id()
                    );
                    st.fail("corrupt".into());
                }
                let read = match op {
                    Op::Read => Some(comp.wr_id()),
                    Op::Mixed if comp.wr_id() % 2 == 0 => Some(comp.wr_id() / 2),
                    _ => None,
                };
                if let Some(k) = read {
                    match check(&buf.as_ref().unwrap()[..], k) {
                        Ok(()) => st.verified += 1,
                        Err(e) => {
                            eprintln!("fault_peer client: {e}");
                            st.fail("corrupt".into());
                        }
                    }
                }
                // The fetch-and-adds: request i of Atomic, i / 2 of Mixed.
                let atomic = match op {
                    Op::Atomic => Some(comp.wr_id()),
                    Op::Mixed if comp.wr_id() % 2 == 1 => Some(comp.wr_id() / 2),
                    _ => None,
                };
                if let Some(k) = atomic {
                    let b = buf.as_ref().unwrap();
                    let got = u64::from_ne_bytes(b[..8].try_into().unwrap());
                    match got == atomic_expected(k) {
                        true if op == Op::Atomic => st.verified += 1,
                        true => {}
                        false => {
                            eprintln!("fault_peer client: {}", atomic_explain(k, got));
                            st.fail("corrupt".into());
                        }
                    }
                }
                done += 1;
                // Mixed counts its messages (the reads, each checked).
                if !(op == Op::Mixed && comp.wr_id() % 2 == 1) {
                    st.msgs += 1;
                    st.bytes += msg_size as u64;
                }
            }
            match buf {
                Some(b) if op == Op::Mixed && b.len() == 8 => results.push(b),
                Some(b) => pool.push(b),
                None => {}
            }
        }
    }
    // Tell the server, and (send/write) learn its verdict.
    stream.set_nonblocking(false).map_err(|e| e.to_string())?;
    let _ = (&stream).write_all(format!("DONE {}\n", st.status).as_bytes());
    if !matches!(op, Op::Read | Op::Atomic | Op::Mixed) && st.status == "ok" {
        let line = match verdict.contains('\n') {
            true => Ok(verdict),
            false => read_line(&stream).map(|l| verdict + &l),
        };
        match line {
            Ok(line) => {
                let mut f = line.split_whitespace().skip(1);
                let status = f.next().unwrap_or("?").to_owned();
                st.verified = f.next().and_then(|v| v.parse().ok()).unwrap_or(0);
                if status != "ok" {
                    st.fail(format!("peer:{status}"));
                }
            }
            Err(e) => st.fail(format!("peer:{}", e.replace(' ', "_"))),
        }
    }
    Ok(st)
}

/// The status of a complete `DONE <status> …` line, if `text` holds one.
fn verdict_status(text: &str) -> Option<&str> {
    let line = text
        .split_inclusive('\n')
        .next()
        .filter(|l| l.ends_with('\n'))?;
    line.strip_prefix("DONE ")?.split_whitespace().next()
}

/// See the module docs.
pub fn cq_overrun(device: Option<String>) -> Result<Stats, String> {
    let s = open(&device, None, None).map_err(|e| e.to_string())?;
    let mut st = Stats::new("local", Op::Send);
    let pd = s.ctx.alloc_pd().map_err(|e| e.to_string())?;
    let send_cq = s.ctx.create_cq(64).build().map_err(|e| e.to_string())?;
    let small = s.ctx.create_cq(1).build().map_err(|e| e.to_string())?;
    let cap = small.capacity() as usize;
    let n = cap + 8;
    // The library refuses a receive queue deeper than its CQ: the overrun
    // that would lose completions (and their buffers) cannot be set up.
    let qp = match pd
        .create_qp(QpType::Rc, &send_cq, &small)
        .max_recv_wr(n as u32)
        .max_send_wr(n as u32)
        .max_inline_data(16)
        .build()
    {
        Err(ibverbs::Error::CqTooSmall { capacity, needed }) => {
            eprintln!("fault_peer: CQ of {capacity} for queues asked {needed} deep: refused");
            st.status = "refused:CqTooSmall".into();
            return Ok(st);
        }
        qp => qp.map_err(|e| e.to_string())?,
    };
    let me = endpoint(&s, &qp, 1).map_err(|e| e.to_string())?;
    let c = Common {
        device: None,
        ib_port: None,
        gid_index: None,
        tcp_port: 0,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        deadline: 30,
    };
    connect_qp(&s, &c, &qp, &me, &me).map_err(|e| e.to_string())?;
    for _ in 0..n {
        let b = pd
            .alloc(16, AccessFlags::LOCAL_WRITE)
            .map_err(|e| e.to_string())?;
        qp.post_recv(RecvRequest::new(b))
            .map_err(|e| e.error.to_string())?;
        st.posted += 1;
    }
    s.ctx
        .set_async_nonblocking(true)
        .map_err(|e| e.to_string())?;
    for i in 0..n as u64 {
        // The receive CQ (capacity `cap`) is never polled: it overflows.
        let _ = qp.post_send(SendRequest::send_inline(&i.to_le_bytes()).signaled(true));
        st.msgs += 1;
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match s.ctx.get_async_event() {
            Ok(ev) => {
                eprintln!("fault_peer: async event {ev:?}");
                if ev.event_type() == AsyncEventType::CqErr {
                    st.status = format!("event:{:?}", ev.event_type());
                    break;
                }
            }
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Err(_) => {
                st.status = "timeout".into();
                break;
            }
        }
    }
    eprintln!("fault_peer: CQ capacity {cap}, {n} completions aimed at it");
    Ok(st)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_results_name_a_request_that_took_effect_twice() {
        assert_eq!(
            (0..5).map(atomic_expected).collect::<Vec<_>>(),
            [0, 1, 3, 6, 10]
        );
        assert_eq!(atomic_expected(u64::MAX), atomic_expected(u64::MAX));
        // Request 2 (adding 3) executed twice: request 4 finds 10 + 3.
        let e = atomic_explain(4, 13);
        assert!(
            e.contains(
                "expected 10 (difference 3 = the addend of request 2: it took effect twice)"
            ),
            "{e}"
        );
        assert!(!atomic_explain(4, 9).contains("twice"));
    }

    #[test]
    fn a_verdict_counts_once_its_line_is_complete() {
        assert_eq!(verdict_status("DONE corrupt 598\n"), Some("corrupt"));
        assert_eq!(verdict_status("DONE ok 1024\n"), Some("ok"));
        assert_eq!(verdict_status("DONE corr"), None);
        assert_eq!(verdict_status(""), None);
        assert_eq!(verdict_status("HELLO\n"), None);
    }

    #[test]
    fn hello_round_trips_and_refuses_garbage() {
        let ep = Endpoint {
            qp_num: QpNumber(0x11),
            psn: 0x12_3456,
            lid: 3,
            gid: "::ffff:10.0.2.15".parse().unwrap(),
        };
        let mem = RemoteMemory {
            addr: 0x1000,
            len: 4096,
            rkey: RemoteKey(77),
        };
        let h = parse_hello(&hello(&ep, Some(mem), "op=write")).unwrap();
        assert_eq!(
            (h.ep.qp_num, h.ep.psn, h.ep.lid, h.ep.gid),
            (ep.qp_num, ep.psn, ep.lid, ep.gid)
        );
        assert_eq!(
            (h.mem.addr, h.mem.len, h.mem.rkey),
            (mem.addr, mem.len, mem.rkey)
        );
        assert!(h.fields.iter().any(|(k, v)| k == "op" && v == "write"));
        assert!(parse_hello("HELLO qpn=1").is_err());
        assert!(parse_hello("FP1 qpn=1 psn=2")
            .unwrap_err()
            .contains("lacks lid"));
        assert!(parse_hello("FP1 qpn=x").unwrap_err().contains("qpn"));
    }
}
