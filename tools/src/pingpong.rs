//! What `rc_pingpong`, `uc_pingpong`, `ud_pingpong` and `srq_pingpong`
//! share: the rdma-core command line, device and queue-pair setup, the
//! address exchange ([`exchange`], [`wire`]) and the ping-pong loop.
//!
//! The programs behave like rdma-core v44's `ibv_*_pingpong` and talk to them:
//! same options, same TCP exchange, same QP attributes, same sizes on the
//! wire, same output lines. The differences:
//!
//! * `-i` defaults to the device's first ACTIVE port (rdma-core: port 1),
//!   and without `-g` a RoCE port uses its RoCE v2 GID with a non-link-local
//!   IPv4 address, else its first valid GID
//!   ([`GidSelector::Automatic`](rdma_verbs::device::GidSelector::Automatic);
//!   rdma-core sends no GID and fails on RoCE). An explicit `-g N` wins.
//! * Each posted receive owns its own slice of one registered region (the
//!   safe API's ownership model; the C tools point every receive at the
//!   same buffer). The bytes on the wire are the same.
//! * Every wait is bounded: the TCP exchange (`--exchange-timeout`), the
//!   server's wait for a client (`--accept-timeout`) and the ping-pong
//!   itself (`--stall-timeout`: no completion for that long ends the run;
//!   a watchdog thread, since the safe API has no timed wait for a
//!   completion event, and it keeps timers out of the data path).
//!   The client retries its TCP connect while the server is not up yet.
//! * `-c` checks every byte of every message both sides receive (v44's
//!   server checks only that the first byte of each page of its last
//!   message is 0, and exits 0 even when it is not): our messages carry a
//!   sequence number and a checksum ([`crate::integrity`]) and keep v44's
//!   zeros; our server echoes what it received, as the C server does. The
//!   first mismatch ends the run (non-zero exit, the iteration and the
//!   first differing offset named); nothing is retried. What is accepted
//!   from which peer: docs/tools.md, "Validation options".
//! * The peer is untrusted: malformed messages end the run with a message.

mod check;
pub mod exchange;
pub mod wire;

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdma_verbs::{
    cq::{CompletionChannel, WorkCompletion},
    device::{GidIndex, Mtu, PortAttr},
    memory::FrozenBuffer,
    qp::{AddressHandle, AddressVector, PreparedRecv, PreparedSend, QpNumber},
    AccessFlags, CompletionQueue, Completions, ConnectOptions, Endpoint, Gid, LocalBuffer,
    LocalPort, PortNumber, QpType, QueuePair, RecvQueue, RecvRequest, SendQueue, SendRequest,
};

use check::Checker;
use exchange::Limits;
use wire::Dest;

/// `wr_id` of receives (as in the C tools), in the low byte: the rest
/// holds the receive buffer's index.
const RECV_WRID: u64 = 1;
/// `wr_id` of sends.
const SEND_WRID: u64 = 2;
/// The low byte of a `wr_id`: `RECV_WRID` or `SEND_WRID`.
const WRID_KIND: u64 = 0xff;
/// Receive buffer `i`'s `wr_id`.
const fn recv_wr_id(i: usize) -> u64 {
    ((i as u64) << 8) | RECV_WRID
}
/// Q_Key of `ud_pingpong`.
pub const QKEY: u32 = 0x1111_1111;
/// Space for the GRH in front of every UD receive.
pub const GRH_LEN: usize = 40;
/// `srq_pingpong` always exchanges this many addresses (its `MAX_QP`).
pub const SRQ_MAX_QP: usize = 256;
/// Default `--exchange-timeout` unless `IBVERBS_PP_TIMEOUT_SECS` says otherwise.
const DEFAULT_EXCHANGE_TIMEOUT: u64 = 20;
/// Environment variable that sets the default `--exchange-timeout`.
pub const TIMEOUT_ENV: &str = "IBVERBS_PP_TIMEOUT_SECS";

/// Options every ping-pong has (rdma-core's names; `-s`, `-m` and `-q` are
/// declared by the examples that have them).
#[derive(clap::Args, Debug, Clone)]
pub struct Common {
    /// Listen on/connect to TCP port PORT
    #[arg(short = 'p', long = "port", value_name = "PORT", default_value = "18515",
          value_parser = parse_tcp_port, display_order = 1)]
    pub port: u16,

    /// Use IB device DEV [default: the first device found]
    #[arg(short = 'd', long = "ib-dev", value_name = "DEV", display_order = 2)]
    pub ib_dev: Option<String>,

    /// Use port PORT of the device [default: its first ACTIVE port; rdma-core's tools use port 1]
    #[arg(short = 'i', long = "ib-port", value_name = "PORT", value_parser = parse_ib_port,
          display_order = 3)]
    pub ib_port: Option<u8>,

    /// Number of receives to post at a time
    #[arg(short = 'r', long = "rx-depth", value_name = "DEPTH", default_value = "500",
          value_parser = parse_positive, display_order = 7)]
    pub rx_depth: u32,

    /// Number of exchanges
    #[arg(short = 'n', long = "iters", value_name = "ITERS", default_value = "1000",
          value_parser = parse_positive, display_order = 8)]
    pub iters: u32,

    /// Service level value
    #[arg(short = 'l', long = "sl", value_name = "SL", default_value = "0",
          value_parser = parse_sl, display_order = 9)]
    pub sl: u8,

    /// Sleep on CQ events (default poll)
    #[arg(short = 'e', long = "events", display_order = 10)]
    pub events: bool,

    /// Local port GID index [default: on RoCE the port's RoCE v2 GID with a non-link-local IPv4
    /// address, else its first valid GID; on InfiniBand none (LID addressing)]
    #[arg(short = 'g', long = "gid-idx", value_name = "INDEX", value_parser = parse_gid_idx,
          display_order = 11)]
    pub gid_idx: Option<u8>,

    /// Validate every received message, every byte (sequence number and checksum; the first mismatch exits non-zero)
    #[arg(short = 'c', long = "chk", display_order = 12)]
    pub chk: bool,

    /// Connect to the server at HOST; without it, start a server and wait for a connection
    #[arg(value_name = "HOST")]
    pub servername: Option<String>,

    /// Limit for each step of the TCP address exchange; also how long the client retries
    /// connecting [default: 20, or $IBVERBS_PP_TIMEOUT_SECS]
    #[arg(long, value_name = "SECS", value_parser = parse_secs,
          help_heading = "Safety limits (not in rdma-core)", display_order = 20)]
    pub exchange_timeout: Option<u64>,

    /// How long the server waits for a client
    #[arg(long, value_name = "SECS", default_value = "300", value_parser = parse_secs,
          help_heading = "Safety limits (not in rdma-core)", display_order = 21)]
    pub accept_timeout: u64,

    /// Give up when no completion arrives for this long
    #[arg(long, value_name = "SECS", default_value = "30", value_parser = parse_secs,
          help_heading = "Safety limits (not in rdma-core)", display_order = 22)]
    pub stall_timeout: u64,
}

/// Parses a number like C's `strtoul(s, NULL, 0)`: `0x` hex, leading-`0`
/// octal, else decimal; but the whole string must be a number.
pub fn parse_c_number(s: &str) -> Result<u64, String> {
    let (digits, radix) = if let Some(h) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        (h, 16)
    } else if s.len() > 1 && s.starts_with('0') {
        (&s[1..], 8)
    } else {
        (s, 10)
    };
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return Err(format!("{s:?} is not a number"));
    }
    u64::from_str_radix(digits, radix).map_err(|e| format!("{s:?}: {e}"))
}

fn in_range(s: &str, lo: u64, hi: u64) -> Result<u64, String> {
    let v = parse_c_number(s)?;
    if v < lo || v > hi {
        return Err(format!("{v} is not in {lo}..={hi}"));
    }
    Ok(v)
}

fn parse_tcp_port(s: &str) -> Result<u16, String> {
    in_range(s, 1, 65535).map(|v| v as u16)
}
fn parse_ib_port(s: &str) -> Result<u8, String> {
    in_range(s, 1, 255).map(|v| v as u8)
}
/// A count of at least 1 (size, rx depth, iterations).
pub fn parse_positive(s: &str) -> Result<u32, String> {
    in_range(s, 1, u64::from(u32::MAX)).map(|v| v as u32)
}
fn parse_sl(s: &str) -> Result<u8, String> {
    in_range(s, 0, 15).map(|v| v as u8)
}
fn parse_gid_idx(s: &str) -> Result<u8, String> {
    in_range(s, 0, 255).map(|v| v as u8)
}
fn parse_secs(s: &str) -> Result<u64, String> {
    in_range(s, 1, 24 * 3600)
}
/// `-m`: 256, 512, 1024, 2048 or 4096.
pub fn parse_mtu(s: &str) -> Result<u32, String> {
    let v = parse_c_number(s)?;
    u32::try_from(v)
        .ok()
        .and_then(Mtu::from_bytes)
        .map(|_| v as u32)
        .ok_or_else(|| format!("{v} is not an MTU (256, 512, 1024, 2048 or 4096)"))
}
/// `-q`: 1 to 255 queue pairs (rdma-core: fewer than its `MAX_QP` = 256).
pub fn parse_num_qp(s: &str) -> Result<u32, String> {
    in_range(s, 1, SRQ_MAX_QP as u64 - 1).map(|v| v as u32)
}

/// Which tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// `rc_pingpong`.
    Rc,
    /// `uc_pingpong`.
    Uc,
    /// `ud_pingpong`.
    Ud,
    /// `srq_pingpong` (RC queue pairs sharing one receive queue).
    Srq,
}

/// Everything a run needs.
#[derive(Debug, Clone)]
pub struct Config {
    /// The tool.
    pub transport: Transport,
    /// The common options.
    pub common: Common,
    /// `-s`.
    pub size: u32,
    /// `-m` in bytes (ignored by UD).
    pub mtu: u32,
    /// `-q` (1 unless SRQ).
    pub num_qp: u32,
}

/// Runs a tool and turns its outcome into the exit status (the error,
/// prefixed with the program name, on stderr).
pub fn main(prog: &str, cfg: Config) -> ExitCode {
    match run(prog, &cfg) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{prog}: {e}");
            ExitCode::FAILURE
        }
    }
}

/// An error message.
#[derive(Debug)]
pub struct Failure(pub String);

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<String> for Failure {
    fn from(s: String) -> Failure {
        Failure(s)
    }
}
impl From<&str> for Failure {
    fn from(s: &str) -> Failure {
        Failure(s.to_string())
    }
}
impl From<exchange::ExchangeError> for Failure {
    fn from(e: exchange::ExchangeError) -> Failure {
        Failure(e.0)
    }
}

type Res<T> = Result<T, Failure>;

/// Adds what was being done to an error.
trait Ctx<T> {
    fn ctx(self, what: &str) -> Res<T>;
}
impl<T, E: std::fmt::Display> Ctx<T> for Result<T, E> {
    fn ctx(self, what: &str) -> Res<T> {
        self.map_err(|e| Failure(format!("{what}: {e}")))
    }
}

/// What rdma-core v44's tool fills its buffer with: 0x7b, 0 for srq.
fn c_fill(t: Transport) -> u8 {
    if t == Transport::Srq {
        0
    } else {
        0x7b
    }
}

/// The page size (for `-c`), from the aux vector; 4096 if unreadable.
fn page_size() -> usize {
    const AT_PAGESZ: u64 = 6;
    let word = std::mem::size_of::<usize>();
    if let Ok(aux) = std::fs::read("/proc/self/auxv") {
        for pair in aux.chunks_exact(2 * word) {
            let get = |b: &[u8]| -> u64 {
                let mut v = [0u8; 8];
                v[..word].copy_from_slice(b);
                u64::from_ne_bytes(v)
            };
            let (key, value) = (get(&pair[..word]), get(&pair[word..]));
            if key == AT_PAGESZ && value.is_power_of_two() {
                return value as usize;
            }
        }
    }
    4096
}

/// Watches the ping-pong from a thread: if neither counter moves for the
/// stall timeout, it reports and ends the process. So a lost message (UC,
/// UD), a peer that died, or a completion event that never comes cannot
/// hang the program, without any timer in the data path: the loop only
/// stores two counters.
struct Watchdog {
    state: Arc<WatchState>,
}

struct WatchState {
    armed: AtomicBool,
    stop: AtomicBool,
    sent: AtomicU32,
    received: AtomicU32,
}

impl Watchdog {
    fn start(prog: &str, timeout: Duration, iters: u32) -> Res<Watchdog> {
        let state = Arc::new(WatchState {
            armed: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            sent: AtomicU32::new(0),
            received: AtomicU32::new(0),
        });
        let s = state.clone();
        let prog = prog.to_string();
        let tick = (timeout / 20).clamp(Duration::from_millis(10), Duration::from_millis(250));
        std::thread::Builder::new()
            .name("watchdog".into())
            .spawn(move || {
                let mut last = (0, 0);
                let mut since = Instant::now();
                while !s.stop.load(Relaxed) {
                    std::thread::sleep(tick);
                    let now = (s.sent.load(Relaxed), s.received.load(Relaxed));
                    if !s.armed.load(Relaxed) || now != last {
                        last = now;
                        since = Instant::now();
                    } else if since.elapsed() >= timeout {
                        eprintln!(
                            "{prog}: no completion for {} s (sent {}/{iters}, received {}/{iters}); \
                             giving up (did the peer exit or lose a message?)",
                            timeout.as_secs(),
                            now.0,
                            now.1
                        );
                        std::process::exit(1);
                    }
                }
            })
            .ctx("Couldn't start the watchdog thread")?;
        Ok(Watchdog { state })
    }

    fn arm(&self) {
        self.state.armed.store(true, Relaxed);
    }

    #[inline]
    fn progress(&self, sent: u32, received: u32) {
        self.state.sent.store(sent, Relaxed);
        self.state.received.store(received, Relaxed);
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.state.stop.store(true, Relaxed);
    }
}

/// The device side of a run, set up and waiting for the peer's address.
struct Setup {
    port: PortNumber,
    port_attr: PortAttr,
    gid_index: Option<GidIndex>,
    channel: Option<CompletionChannel>,
    pd: rdma_verbs::ProtectionDomain,
    cq: CompletionQueue,
    qps: Vec<QueuePair>,
    /// One prepared receive per buffer, posted (the loop takes them).
    recvs: Vec<PreparedRecv>,
    /// The receive queue they post to (the SRQ's, or the QP's).
    rq: Option<RecvQueue>,
    /// Without `-c`: the one send buffer every QP's send shares.
    send_buf: Option<FrozenBuffer>,
    /// With `-c`: one send buffer per QP, rewritten before each send.
    chk_send: Vec<LocalBuffer>,
    inline: bool,
    /// Offset of the payload in a receive buffer (the GRH for UD).
    recv_offset: usize,
    local: Vec<Endpoint>,
    opts: ConnectOptions,
    sl: u8,
}

fn open(cfg: &Config) -> Res<Setup> {
    let c = &cfg.common;
    let size = cfg.size as usize;
    let single_qp = cfg.transport != Transport::Srq;
    if cfg.num_qp > c.rx_depth {
        return Err(format!(
            "rx_depth {} is too small for {} QPs -- must have at least one receive per QP.",
            c.rx_depth, cfg.num_qp
        )
        .into());
    }

    let list = rdma_verbs::devices().ctx("Failed to get IB devices list")?;
    let dev = match &c.ib_dev {
        Some(name) => list
            .find(name)
            .ok_or_else(|| format!("IB device {name} not found"))?,
        None => list.get(0).ok_or("No IB devices found")?,
    };
    let ctx = dev
        .open()
        .ctx(&format!("Couldn't get context for {}", dev.name()))?;
    let port = match c.ib_port {
        Some(p) => PortNumber(p),
        None => ctx.active_port().ctx(&format!(
            "No ACTIVE port on {} (choose one with -i)",
            ctx.name()
        ))?,
    };
    let port_attr = ctx
        .query_port(port)
        .ctx(&format!("Couldn't get port info for port {port}"))?;
    if cfg.transport == Transport::Ud {
        let mtu = port_attr.active_mtu().bytes();
        if cfg.size > mtu {
            return Err(format!("Requested size larger than port MTU ({mtu})").into());
        }
    }
    // C: a GID only with -g. Here RoCE, which cannot work without one,
    // gets the port's usual RoCE v2 GID.
    let gid_index = match c.gid_idx {
        Some(g) => Some(GidIndex(g)),
        None if port_attr.grh_required() => Some(
            ctx.default_gid_index(port)
                .ctx("Couldn't read the GID table")?,
        ),
        None => None,
    };

    let channel = if c.events {
        Some(
            ctx.create_comp_channel()
                .ctx("Couldn't create completion channel")?,
        )
    } else {
        None
    };
    let pd = ctx.alloc_pd().ctx("Couldn't allocate PD")?;

    // One registration: the receive buffers, then the send buffer.
    let (recv_len, recv_offset) = if cfg.transport == Transport::Ud {
        (size + GRH_LEN, GRH_LEN)
    } else {
        (size, 0)
    };
    // As the C tools, every receive lands in one buffer: its prepared
    // receive is posted `-r` times, and Rust can read it only once no
    // posting is outstanding. `-c` reads every message as its receive
    // completes, so it keeps one buffer per receive, and one send buffer
    // per QP (rewritten before each send: not inline).
    let (recv_bufs, send_bufs) = if c.chk {
        (c.rx_depth as usize, cfg.num_qp as usize)
    } else {
        (1, 1)
    };
    let total = recv_bufs
        .checked_mul(recv_len)
        .and_then(|n| n.checked_add(send_bufs.checked_mul(size)?))
        .ok_or("-r times -s is too large")?;

    let cqe = c.rx_depth.saturating_add(cfg.num_qp);
    let cq = match &channel {
        Some(ch) => ctx.create_cq(cqe).channel(ch),
        None => ctx.create_cq(cqe),
    }
    .build()
    .ctx("Couldn't create CQ")?;

    let (qp_type, srq) = match cfg.transport {
        Transport::Rc => (QpType::Rc, None),
        Transport::Uc => (QpType::Uc, None),
        Transport::Ud => (QpType::Ud, None),
        Transport::Srq => (
            QpType::Rc,
            Some(
                pd.create_srq(c.rx_depth)
                    .max_sge(1)
                    .build()
                    .ctx("Couldn't create SRQ")?,
            ),
        ),
    };
    let mut qps = Vec::with_capacity(cfg.num_qp as usize);
    for i in 0..cfg.num_qp {
        let mut b = pd
            .create_qp(qp_type, &cq, &cq)
            .max_send_wr(1)
            .max_send_sge(1)
            .max_recv_wr(c.rx_depth)
            .max_recv_sge(1);
        if let Some(srq) = &srq {
            b = b.srq(srq);
        }
        let qp = b.build().map_err(|e| {
            let which = if single_qp {
                String::new()
            } else {
                format!("[{i}]")
            };
            Failure(format!("Couldn't create QP{which}: {e}"))
        })?;
        qps.push(qp);
    }
    // As the C tools: inline when the QP can take the whole message inline,
    // as ibv_query_qp reports it (and as the library, which checks inline
    // sends against what ibv_create_qp granted, allows).
    let mut inline = !c.chk;
    for qp in &qps {
        let (_, queried) = qp.query().ctx("Couldn't query QP")?;
        let max = queried.max_inline_data.min(qp.caps().max_inline_data);
        inline &= max as usize >= size;
    }

    for (i, qp) in qps.iter().enumerate() {
        match cfg.transport {
            Transport::Ud => qp.to_init_ud(port, 0, QKEY),
            _ => qp.to_init(port, 0, AccessFlags::empty()),
        }
        .map_err(|e| {
            let which = if single_qp {
                String::new()
            } else {
                format!("[{i}]")
            };
            Failure(format!("Failed to modify QP{which} to INIT: {e}"))
        })?;
    }

    // After the queues, so that a depth the device refuses fails before
    // this (possibly large) registration.
    let mem = pd.alloc(total, AccessFlags::LOCAL_WRITE).ctx(&format!(
        "Couldn't register MR ({total} bytes: {recv_bufs} receive buffer(s) and \
         {send_bufs} send buffer(s))"
    ))?;
    let (mut recv_area, mut send_area) = mem.split_at(recv_bufs * recv_len);
    let (send_buf, chk_send) = if c.chk {
        // Written before each send (PingPong::post_send).
        let mut bufs = Vec::with_capacity(send_bufs);
        for _ in 1..send_bufs {
            let (b, rest) = send_area.split_at(size);
            bufs.push(b);
            send_area = rest;
        }
        bufs.push(send_area);
        (None, bufs)
    } else {
        // rc/uc/ud fill their buffer with 0x7b, srq with 0.
        send_area.fill(c_fill(cfg.transport));
        (Some(send_area.freeze()), Vec::new())
    };
    // Not rdma-core's pattern nor ours: a buffer no message reached must
    // fail `-c`.
    recv_area.fill(0x7b);

    // One prepared receive per buffer, re-posted as its messages are
    // consumed: a completion is claimed without the receive queue's table.
    let mut rq = match &srq {
        Some(srq) => srq.recv_queue(),
        None => qps[0].recv_queue(),
    }
    .map_err(|e| Failure(format!("Couldn't post receive: {e}")))?;
    let mut recvs: Vec<PreparedRecv> = Vec::with_capacity(recv_bufs);
    for i in 0..recv_bufs {
        let (buf, rest) = recv_area.split_at(recv_len);
        recv_area = rest;
        let wr = RecvRequest::new(buf).wr_id(recv_wr_id(i));
        let recv = rq
            .prepare(wr)
            .map_err(|e| Failure(format!("Couldn't post receive: {}", e.error)))?;
        recvs.push(recv);
    }
    for i in 0..c.rx_depth as usize {
        rq.post_prepared(&mut recvs[i % recv_bufs])
            .map_err(|e| Failure(format!("Couldn't post receive: {e}")))?;
    }
    if c.events {
        cq.req_notify(false)
            .ctx("Couldn't request CQ notification")?;
    }

    if port_attr.link_layer() != rdma_verbs::device::LinkLayer::Ethernet && port_attr.lid() == 0 {
        return Err("Couldn't get local LID".into());
    }
    let local_port =
        LocalPort::query(&ctx, port, gid_index).ctx("Couldn't get the local address")?;
    let mut local = Vec::with_capacity(qps.len());
    for qp in &qps {
        let me = local_port
            .endpoint(qp, Endpoint::random_psn())
            .ctx("Couldn't get the local address")?;
        local.push(me);
    }

    let opts = ConnectOptions::new(port)
        .local_port(&local_port)
        .path_mtu(Mtu::from_bytes(cfg.mtu).unwrap_or(Mtu::Mtu1024))
        .sl(c.sl)
        .pkey_index(0)
        .hop_limit(1)
        .timeout(14)
        .retry_cnt(7)
        .rnr_retry(7)
        .min_rnr_timer(12)
        .rd_atomic(1)
        .remote_access(AccessFlags::empty());

    Ok(Setup {
        port,
        port_attr,
        gid_index,
        channel,
        pd,
        cq,
        qps,
        recvs,
        rq: Some(rq),
        send_buf,
        chk_send,
        inline,
        recv_offset,
        local,
        opts,
        sl: c.sl,
    })
}

fn to_wire(e: &Endpoint) -> Dest {
    Dest {
        lid: e.lid,
        qpn: e.qp_num.0,
        psn: e.psn,
        gid: e.gid.0,
    }
}

fn from_wire(d: &Dest) -> Endpoint {
    Endpoint {
        qp_num: QpNumber(d.qpn),
        psn: d.psn,
        lid: d.lid,
        gid: Gid(d.gid),
    }
}

/// The `  local address:` / `  remote address:` line of the C tools.
fn address_line(which: &str, d: &Dest, ud_quirk: bool) -> String {
    // ud_pingpong's local line has ": GID" where the others have ", GID".
    let sep = if ud_quirk { ':' } else { ',' };
    format!(
        "  {which} LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}{sep} GID {}",
        d.lid,
        d.qpn,
        d.psn,
        wire::format_gid(&d.gid)
    )
}

/// A UD destination: address handle and remote QP number.
struct UdDest {
    ah: AddressHandle,
    qpn: QpNumber,
}

impl Setup {
    /// Connects the queue pairs to the peer's addresses (INIT → RTR → RTS,
    /// or for UD the state changes and an address handle).
    fn connect(&self, transport: Transport, remote: &[Dest]) -> Result<Option<UdDest>, String> {
        let many = self.qps.len() > 1;
        for (i, d) in remote.iter().take(self.qps.len()).enumerate() {
            let which = if many {
                format!(" [{i}]")
            } else {
                String::new()
            };
            if d.qpn == 0 {
                return Err(format!(
                    "the remote address{which} has QPN 0{}",
                    if many {
                        " (does the peer use fewer queue pairs? give both sides the same -q)"
                    } else {
                        ""
                    }
                ));
            }
            if self.port_attr.grh_required() && d.gid == [0; 16] {
                return Err(format!(
                    "the remote address{which} has no GID, but port {} (RoCE) needs one: \
                     give the peer -g <gid index>",
                    self.port
                ));
            }
        }
        if transport == Transport::Ud {
            let qp = &self.qps[0];
            let remote = from_wire(&remote[0]);
            // For UD these change only the state (and the send PSN).
            qp.to_rtr(&remote, &self.opts)
                .map_err(|e| format!("Failed to modify QP to RTR: {e}"))?;
            qp.to_rts(self.local[0].psn, &self.opts)
                .map_err(|e| format!("Failed to modify QP to RTS: {e}"))?;
            let sgid = self.gid_index.unwrap_or(GidIndex(0));
            let av = AddressVector::for_port(&self.port_attr, &remote, sgid)
                .map_err(|e| format!("Failed to create AH: {e}"))?
                .sl(self.sl)
                .hop_limit(1);
            let ah = self
                .pd
                .create_ah(&av)
                .map_err(|e| format!("Failed to create AH: {e}"))?;
            return Ok(Some(UdDest {
                ah,
                qpn: remote.qp_num,
            }));
        }
        for (i, (qp, d)) in self.qps.iter().zip(remote).enumerate() {
            let which = if many {
                format!("[{i}]")
            } else {
                String::new()
            };
            qp.to_rtr(&from_wire(d), &self.opts)
                .map_err(|e| format!("Failed to modify QP{which} to RTR: {e}"))?;
            qp.to_rts(self.local[i].psn, &self.opts)
                .map_err(|e| format!("Failed to modify QP{which} to RTS: {e}"))?;
        }
        Ok(None)
    }
}

/// Sets up, exchanges addresses, ping-pongs, prints the results.
fn run(prog: &str, cfg: &Config) -> Res<()> {
    let c = &cfg.common;
    // Declared first so that it outlives (and so bounds) the teardown too.
    let watchdog = Watchdog::start(prog, Duration::from_secs(c.stall_timeout), c.iters)?;
    let exchange_secs = match c.exchange_timeout {
        Some(s) => s,
        None => match std::env::var(TIMEOUT_ENV) {
            Ok(v) => parse_secs(&v).map_err(|e| format!("{TIMEOUT_ENV}: {e}"))?,
            Err(_) => DEFAULT_EXCHANGE_TIMEOUT,
        },
    };
    let limits = Limits {
        io: Duration::from_secs(exchange_secs),
        accept: Duration::from_secs(c.accept_timeout),
        connect: Duration::from_secs(exchange_secs),
    };

    let mut setup = open(cfg)?;
    let ud = cfg.transport == Transport::Ud;
    let count = if cfg.transport == Transport::Srq {
        SRQ_MAX_QP
    } else {
        1
    };
    let mut local: Vec<Dest> = setup.local.iter().map(to_wire).collect();
    for d in &local {
        println!("{}", address_line("local address: ", d, ud));
    }
    local.resize(count, Dest::default());

    // As the C tools: the server connects before it replies (so its QPs are
    // ready when the client starts), the client once it has the reply.
    let mut ud_dest = None;
    match &c.servername {
        Some(host) => {
            let remote = exchange::client_exchange(host, c.port, &local, &limits)?;
            for d in remote.iter().take(setup.qps.len()) {
                println!("{}", address_line("remote address:", d, false));
            }
            ud_dest = setup.connect(cfg.transport, &remote)?;
        }
        None => {
            let listener = exchange::listen(c.port)?;
            let remote = exchange::server_exchange(&listener, &local, &limits, |remote| {
                ud_dest = setup.connect(cfg.transport, remote)?;
                Ok(())
            })?;
            for d in remote.iter().take(setup.qps.len()) {
                println!("{}", address_line("remote address:", d, false));
            }
        }
    }

    // The send is prepared once per QP and posted again each iteration,
    // as the C tools reuse one ibv_send_wr.
    let mut chk_send = std::mem::take(&mut setup.chk_send).into_iter();
    let sends = setup
        .qps
        .iter()
        .map(|qp| {
            let mut wr = match (chk_send.next(), &setup.send_buf) {
                (Some(own), _) => SendRequest::send(own),
                (None, Some(shared)) if setup.inline => SendRequest::send_inline(shared),
                (None, Some(shared)) => SendRequest::send(shared.clone()),
                (None, None) => return Err(Failure("no send buffer".into())),
            }
            .wr_id(SEND_WRID);
            if let Some(ud) = &ud_dest {
                wr = wr.ud(&ud.ah, ud.qpn, QKEY);
            }
            let mut sq = qp
                .send_queue()
                .map_err(|e| Failure(format!("Couldn't prepare the send: {e}")))?;
            let send = sq
                .prepare(wr)
                .map_err(|e| Failure(format!("Couldn't prepare the send: {}", e.error)))?;
            Ok((sq, send))
        })
        .collect::<Result<Vec<_>, Failure>>()?;
    let (sqs, sends): (Vec<SendQueue>, Vec<PreparedSend>) = sends.into_iter().unzip();
    let recvs = std::mem::take(&mut setup.recvs);
    let rq = setup.rq.take().ok_or("no receive queue")?;
    let batch = if cfg.transport == Transport::Srq {
        c.rx_depth as usize + cfg.num_qp as usize
    } else {
        2
    };
    let mut pp = PingPong {
        setup: &setup,
        sqs,
        sends,
        rq,
        recvs,
        iters: c.iters,
        qpns: setup.qps.iter().map(|q| q.qp_num().0).collect(),
        pending: vec![RECV_WRID; setup.qps.len()],
        sent: 0,
        received: 0,
        batch,
        chk: if c.chk {
            Some(Checker::new(
                prog,
                cfg,
                c.servername.is_none(),
                setup.recv_offset,
            )?)
        } else {
            None
        },
        routs: c.rx_depth,
        refill_at: cfg.num_qp,
        free: Vec::with_capacity(c.rx_depth as usize),
        watchdog: &watchdog,
    };
    watchdog.arm();
    let elapsed = pp.run(c.servername.is_some())?;

    let usec = elapsed.as_secs_f64() * 1e6;
    let bytes = i64::from(cfg.size) * i64::from(c.iters) * 2;
    println!(
        "{bytes} bytes in {:.2} seconds = {:.2} Mbit/sec",
        usec / 1e6,
        bytes as f64 * 8.0 / usec
    );
    println!(
        "{} iters in {:.2} seconds = {:.2} usec/iter",
        c.iters,
        usec / 1e6,
        usec / f64::from(c.iters)
    );

    // The outstanding receives come back (their buffers with them).
    pp.reclaim_receives();
    drop(pp);
    drop(setup);
    drop(watchdog);
    Ok(())
}

/// The ping-pong loop's state.
struct PingPong<'a> {
    setup: &'a Setup,
    /// Per QP: its send queue's handle and its send, prepared once.
    sqs: Vec<SendQueue>,
    sends: Vec<PreparedSend>,
    /// The receive queue's handle, and per receive buffer its receive,
    /// prepared once (`wr_id` >> 8 is the index).
    rq: RecvQueue,
    recvs: Vec<PreparedRecv>,
    iters: u32,
    /// Completions polled at a time (as the C tools).
    batch: usize,
    qpns: Vec<u32>,
    /// Per QP: what must complete before its next send (RECV_WRID | SEND_WRID).
    pending: Vec<u64>,
    sent: u32,
    received: u32,
    /// `-c`: every message checked, every send written.
    chk: Option<Checker>,
    /// Receives outstanding.
    routs: u32,
    /// As the C tools, receives are reposted in one batch once only this
    /// many are outstanding (1, or the number of QPs sharing the SRQ).
    refill_at: u32,
    /// Receives back from their completions, waiting for the refill
    /// (indices; capacity reused: no allocation).
    free: Vec<usize>,
    watchdog: &'a Watchdog,
}

impl PingPong<'_> {
    /// Runs until `iters` sends and receives completed; returns the time
    /// from the first send.
    fn run(&mut self, client: bool) -> Res<Duration> {
        let s = self.setup;
        if client {
            for i in 0..s.qps.len() {
                self.post_send(i)?;
                self.pending[i] = RECV_WRID | SEND_WRID;
            }
        }
        let mut done = Completions::with_capacity(self.batch);
        let start = Instant::now();
        while self.received < self.iters || self.sent < self.iters {
            if let Some(ch) = &s.channel {
                // Blocks until the CQ has a completion; the watchdog bounds it.
                match ch.get_event().ctx("Failed to get cq_event")? {
                    Some(cq) if cq.as_ptr() == s.cq.as_ptr() => {}
                    _ => return Err("CQ event for unknown CQ".into()),
                }
                s.cq.req_notify(false)
                    .ctx("Couldn't request CQ notification")?;
            }
            loop {
                // One poll of up to a batch, as the C tools (a prepared
                // request's completion carries no buffers).
                let polled = s.cq.poll(&mut done).ctx("poll CQ failed")?;
                let n = polled.len();
                for c in polled {
                    self.complete(&c)?;
                }
                // Polling mode: back to the loop condition. Event mode:
                // empty the CQ before sleeping again (a batch that was not
                // full did empty it; what comes later raises an event).
                if n < self.batch || s.channel.is_none() {
                    break;
                }
            }
        }
        Ok(start.elapsed())
    }

    fn complete(&mut self, c: &WorkCompletion) -> Res<()> {
        let wr_id = c.wr_id();
        if !c.is_success() {
            return Err(format!(
                "Failed status {} ({}) for wr_id {wr_id}",
                c.status(),
                c.status().as_raw(),
            )
            .into());
        }
        let qpn = c.qp_num();
        let i = self
            .qpns
            .iter()
            .position(|&q| q == qpn)
            .ok_or_else(|| format!("Couldn't find QPN {qpn:06x}"))?;
        let kind = wr_id & WRID_KIND;
        match kind {
            SEND_WRID if wr_id == SEND_WRID => self.sent += 1,
            RECV_WRID if ((wr_id >> 8) as usize) < self.recvs.len() => {
                let buf = (wr_id >> 8) as usize;
                self.routs = self.routs.saturating_sub(1);
                self.received += 1;
                if let Some(k) = &mut self.chk {
                    // One buffer per receive with `-c`: this one's posting
                    // just completed, so its bytes are readable.
                    let bytes = self.recvs[buf]
                        .bytes(0)
                        .ok_or("-c: a completed receive's buffer is still posted")?;
                    k.received(i, c.byte_len() as usize, bytes)?;
                }
                self.free.push(buf);
            }
            _ => return Err(format!("Completion for unknown wr_id {wr_id}").into()),
        }
        self.pending[i] &= !kind;
        if self.sent < self.iters && self.pending[i] == 0 {
            self.post_send(i)?;
            self.pending[i] = RECV_WRID | SEND_WRID;
        }
        // Bookkeeping after the answer went out, as the library rings the
        // doorbell before its own. The refill can wait until then: at most
        // one message per QP is in flight and `refill_at` receives (one
        // per QP) are still posted.
        if kind == RECV_WRID && self.routs <= self.refill_at {
            self.refill_receives()?;
        }
        self.watchdog.progress(self.sent, self.received);
        Ok(())
    }

    /// Gets the outstanding receives' buffers back before the teardown, as
    /// a long-running program must (a posting never completed keeps its
    /// buffers, and with them their memory region, for good): the queue
    /// pairs move to ERR, which flushes their receives, and the flushes are
    /// polled, for a second at most. A shared receive queue's receives are
    /// not flushed by a queue pair's error; they stay with the SRQ until the
    /// process exits. Failures here only leave buffers allocated.
    fn reclaim_receives(&mut self) {
        let s = self.setup;
        if s.qps.iter().any(|qp| qp.srq().is_some()) {
            return;
        }
        for qp in &s.qps {
            let _ = qp.to_err();
        }
        let deadline = Instant::now() + Duration::from_secs(1);
        while self.routs > 0 && Instant::now() < deadline {
            match s.cq.poll_one() {
                Ok(Some(c)) if c.wr_id() & WRID_KIND == RECV_WRID => self.routs -= 1,
                Ok(_) => {}
                Err(_) => return,
            }
        }
    }

    /// Re-posts every consumed receive (one `ibv_post_recv` each, as the
    /// C tools' refill).
    fn refill_receives(&mut self) -> Res<()> {
        for &i in &self.free {
            self.rq
                .post_prepared(&mut self.recvs[i])
                .map_err(|e| Failure(format!("Couldn't post receive: {e}")))?;
            self.routs += 1;
        }
        self.free.clear();
        Ok(())
    }

    fn post_send(&mut self, i: usize) -> Res<()> {
        if let Some(k) = &mut self.chk {
            let buf = self.sends[i]
                .bytes_mut(0)
                .ok_or("-c: the send buffer is still posted")?;
            k.write(i, buf);
        }
        self.sqs[i]
            .post_prepared(&mut self.sends[i])
            .map_err(|e| Failure(format!("Couldn't post send: {e}")))
    }
}
