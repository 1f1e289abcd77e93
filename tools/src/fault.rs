//! The data mover of `cargo xtask faults` (the `fault_peer` binary is its
//! command line): moves data over an RC queue
//! pair (send/recv, RDMA write with immediate, RDMA read, fetch-and-add,
//! or reads or writes and fetch-and-adds in turn) with a sequence number and
//! checksum in every message and a known result for every atomic, while
//! the harness injects faults (loss, reordering, a killed peer, a link
//! down, missing receives). `server.rs` and `client.rs` are the two roles;
//! its C twin, `xtask/c/fault_peer.c`, does the same on libibverbs alone.
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

use std::io::{BufRead, BufReader, Read};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use clap::ValueEnum;
use rdma_verbs::{
    device::{AsyncEventType, GidIndex},
    memory::RemoteKey,
    qp::QpNumber,
    AccessFlags, ConnectOptions, Context, Endpoint, Gid, LocalPort, PortNumber, QpType, QueuePair,
    RemoteMemory, Wr,
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
    /// RDMA writes (without immediate) and fetch-and-adds in turn on one
    /// queue pair, as `Mixed` with writes for reads: write `k` carries
    /// message `k` to slot `k`, and the server checks every slot once the
    /// client is done. Multi-packet writes ahead of atomics on one send
    /// queue, as in the soak.
    MixedWrite,
}

impl Op {
    /// Whether odd requests are fetch-and-adds (request `2k + 1` adds
    /// `k + 1` to a counter after the message region).
    pub fn interleaves_atomics(self) -> bool {
        matches!(self, Op::Mixed | Op::MixedWrite)
    }
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

/// What the client writes into a fetch-and-add's 8-byte result before
/// posting it (as the C twin): a result still equal to it was never
/// written by the device. No fetch-and-add of a run finds it (the counter
/// would have to reach 0xa5a5… by sums of 1 + 2 + …).
pub const POISON: u64 = 0xa5a5_a5a5_a5a5_a5a5;

/// Says what a wrong fetch-and-add result means: never written (still
/// [`POISON`]), or the difference from the expected value and the request
/// whose addend it is (executed twice).
pub fn atomic_explain(i: u64, got: u64) -> String {
    let want = atomic_expected(i);
    if got == POISON {
        return format!(
            "fetch-and-add {i} completed successfully with its result never written \
             (still the poison from before posting), expected {want}"
        );
    }
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

mod client;
mod message;
mod server;

pub use client::client;
pub use server::server;

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
    fn error(&mut self, status: rdma_verbs::WcStatus) {
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
    let list = rdma_verbs::devices()?;
    let ctx = match device {
        Some(name) => list
            .find(name)
            .ok_or_else(|| rdma_verbs::Error::NoDevice {
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
pub(crate) fn endpoint(s: &Setup, qp: &QueuePair, psn: u32) -> rdma_verbs::Result<Endpoint> {
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
) -> rdma_verbs::Result<()> {
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
        Err(rdma_verbs::Error::CqTooSmall {
            capacity, needed, ..
        }) => {
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
    let mut rq = qp.recv_queue().map_err(|e| e.to_string())?;
    let mut sq = qp.send_queue().map_err(|e| e.to_string())?;
    for _ in 0..n {
        let b = pd
            .alloc(16, AccessFlags::LOCAL_WRITE)
            .map_err(|e| e.to_string())?;
        rq.recv(b, 0).map_err(|e| e.error.to_string())?;
        st.posted += 1;
    }
    s.ctx
        .set_async_nonblocking(true)
        .map_err(|e| e.to_string())?;
    for i in 0..n as u64 {
        // The receive CQ (capacity `cap`) is never polled: it overflows.
        let _ = sq.send_inline(&i.to_le_bytes(), Wr::id(0));
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
        assert!(atomic_explain(4, POISON).contains("never written"));
        // No result of a run is the poison (checked over a long run's
        // requests, and at the far end of u64 ones).
        assert!((0..1 << 20).all(|i| atomic_expected(i) != POISON));
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
