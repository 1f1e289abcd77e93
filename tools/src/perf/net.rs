//! The out-of-band TCP exchange between the two tools: a greeting that
//! checks both run the same test with the same options, the connection
//! data (QP number, PSN, LID, GID, MTU, remote memory), barriers between
//! sizes and the client's results for the passive server.
//!
//! Every message has a fixed size and a tag; every read is bounded by a
//! timeout; anything unexpected is an error naming what was expected. The
//! peer is not trusted: values are validated before use.

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use rdma_verbs::{Endpoint, RemoteMemory};

use super::args::Config;
use super::Result;

const MAGIC: [u8; 8] = *b"IBVRSPT1";

/// What both sides must agree on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    /// Test identifier.
    pub test: u8,
    /// Iterations per size.
    pub iters: u64,
    /// Number of sizes.
    pub count: u32,
    /// Smallest size.
    pub first: u64,
    /// Largest size.
    pub last: u64,
}

impl Hello {
    /// The greeting for `test` with `cfg`'s options.
    pub fn new(test: u8, cfg: &Config) -> Hello {
        Hello {
            test,
            iters: cfg.iters,
            count: cfg.sizes.len() as u32,
            first: cfg.sizes.first().copied().unwrap_or(0),
            last: cfg.sizes.last().copied().unwrap_or(0),
        }
    }

    fn encode(&self) -> [u8; 40] {
        let mut b = [0u8; 40];
        b[..8].copy_from_slice(&MAGIC);
        b[8] = self.test;
        b[12..16].copy_from_slice(&self.count.to_be_bytes());
        b[16..24].copy_from_slice(&self.iters.to_be_bytes());
        b[24..32].copy_from_slice(&self.first.to_be_bytes());
        b[32..40].copy_from_slice(&self.last.to_be_bytes());
        b
    }

    fn decode(b: &[u8; 40]) -> Result<Hello> {
        if b[..8] != MAGIC {
            return Err("the peer is not one of these perftest-style tools (bad greeting)".into());
        }
        Ok(Hello {
            test: b[8],
            count: u32::from_be_bytes(b[12..16].try_into().unwrap()),
            iters: u64::from_be_bytes(b[16..24].try_into().unwrap()),
            first: u64::from_be_bytes(b[24..32].try_into().unwrap()),
            last: u64::from_be_bytes(b[32..40].try_into().unwrap()),
        })
    }
}

/// What a side needs to connect its QP to the other and to reach its memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnInfo {
    /// The queue pair's endpoint (QP number, first PSN, LID, GID).
    pub ep: Endpoint,
    /// Active MTU of its port, bytes.
    pub mtu: u32,
    /// Memory the other side may access (`len` 0 when none).
    pub mem: RemoteMemory,
}

/// Bytes of the connection data: a tag, the endpoint's and the memory's
/// wire forms, the MTU.
const CONN_LEN: usize = 4 + Endpoint::WIRE_LEN + 4 + RemoteMemory::WIRE_LEN;

impl ConnInfo {
    fn encode(&self) -> [u8; CONN_LEN] {
        const EP: usize = 4 + Endpoint::WIRE_LEN;
        let mut b = [0u8; CONN_LEN];
        b[..4].copy_from_slice(b"CONN");
        b[4..EP].copy_from_slice(&self.ep.to_bytes());
        b[EP..EP + 4].copy_from_slice(&self.mtu.to_be_bytes());
        b[EP + 4..].copy_from_slice(&self.mem.to_bytes());
        b
    }

    fn decode(b: &[u8; CONN_LEN]) -> Result<ConnInfo> {
        const EP: usize = 4 + Endpoint::WIRE_LEN;
        if &b[..4] != b"CONN" {
            return Err("malformed connection data from the peer".into());
        }
        // The library checks the versions, the 24-bit QP number and PSN,
        // and that the memory range does not wrap.
        let info = ConnInfo {
            ep: Endpoint::from_bytes(&b[4..EP])
                .map_err(|e| format!("the peer's connection data: {e}"))?,
            mtu: u32::from_be_bytes(b[EP..EP + 4].try_into().unwrap()),
            mem: RemoteMemory::from_bytes(&b[EP + 4..])
                .map_err(|e| format!("the peer's connection data: {e}"))?,
        };
        if !matches!(info.mtu, 256 | 512 | 1024 | 2048 | 4096) {
            return Err(format!("the peer sent an invalid MTU {}", info.mtu).into());
        }
        Ok(info)
    }
}

/// Results the active side sends to the passive one: size, iterations and
/// up to seven figures (latency summary or bandwidth).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Report {
    /// Message size.
    pub size: u64,
    /// Iterations.
    pub iters: u64,
    /// The figures, in table order.
    pub values: [f64; 7],
}

/// The TCP connection to the peer.
pub struct Peer {
    stream: TcpStream,
    timeout: Duration,
    seq: u64,
}

fn io_err(e: std::io::Error, what: &str, timeout: Duration) -> super::Error {
    match e.kind() {
        ErrorKind::WouldBlock | ErrorKind::TimedOut => format!(
            "timed out after {:.1} s waiting for {what} from the peer",
            timeout.as_secs_f64()
        )
        .into(),
        ErrorKind::UnexpectedEof | ErrorKind::ConnectionReset | ErrorKind::BrokenPipe => format!(
            "the peer closed the connection while we waited for {what} (see its output for why)"
        )
        .into(),
        _ => format!("TCP error while waiting for {what}: {e}").into(),
    }
}

impl Peer {
    /// Server: listens on the TCP port and accepts one client; client:
    /// connects to `host`, retrying until the server is up. Both bounded by
    /// the configured timeout.
    pub fn establish(cfg: &Config) -> Result<Peer> {
        let deadline = Instant::now() + cfg.timeout;
        let stream = match &cfg.host {
            None => {
                let listener = TcpListener::bind(("0.0.0.0", cfg.tcp_port))
                    .map_err(|e| format!("cannot listen on TCP port {}: {e}", cfg.tcp_port))?;
                listener.set_nonblocking(true)?;
                println!();
                println!("************************************");
                println!("* Waiting for client to connect... *");
                println!("************************************");
                loop {
                    match listener.accept() {
                        Ok((s, _)) => break s,
                        Err(e) if e.kind() == ErrorKind::WouldBlock => {
                            if Instant::now() >= deadline {
                                return Err(format!(
                                    "no client connected to TCP port {} within {:.1} s",
                                    cfg.tcp_port,
                                    cfg.timeout.as_secs_f64()
                                )
                                .into());
                            }
                            std::thread::sleep(Duration::from_millis(20));
                        }
                        Err(e) => return Err(format!("accept failed: {e}").into()),
                    }
                }
            }
            Some(host) => {
                let addrs: Vec<_> = (host.as_str(), cfg.tcp_port)
                    .to_socket_addrs()
                    .map_err(|e| format!("cannot resolve {host:?}: {e}"))?
                    .collect();
                if addrs.is_empty() {
                    return Err(format!("{host:?} has no address").into());
                }
                let mut last_err = None;
                'retry: loop {
                    for a in &addrs {
                        let left = deadline.saturating_duration_since(Instant::now());
                        if left.is_zero() {
                            break 'retry None;
                        }
                        match TcpStream::connect_timeout(a, left.min(Duration::from_secs(2))) {
                            Ok(s) => break 'retry Some(s),
                            Err(e) => last_err = Some(e),
                        }
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
                .ok_or_else(|| {
                    format!(
                        "cannot connect to {host}:{} within {:.1} s: {}",
                        cfg.tcp_port,
                        cfg.timeout.as_secs_f64(),
                        last_err.map_or("timed out".into(), |e| e.to_string())
                    )
                })?
            }
        };
        stream.set_nonblocking(false)?;
        stream.set_nodelay(true)?;
        stream.set_write_timeout(Some(cfg.timeout))?;
        Ok(Peer {
            stream,
            timeout: cfg.timeout,
            seq: 0,
        })
    }

    fn send(&mut self, b: &[u8], what: &str) -> Result<()> {
        self.stream
            .write_all(b)
            .map_err(|e| io_err(e, what, self.timeout))
    }

    fn recv(&mut self, b: &mut [u8], timeout: Duration, what: &str) -> Result<()> {
        self.stream.set_read_timeout(Some(timeout))?;
        self.stream
            .read_exact(b)
            .map_err(|e| io_err(e, what, timeout))
    }

    /// Exchanges greetings and checks that both sides run `ours`'s test
    /// with the same iterations and sizes.
    pub fn hello(&mut self, ours: &Hello, names: impl Fn(u8) -> &'static str) -> Result<()> {
        self.send(&ours.encode(), "the greeting")?;
        let mut b = [0u8; 40];
        self.recv(&mut b, self.timeout, "the greeting")?;
        let theirs = Hello::decode(&b)?;
        if theirs.test != ours.test {
            return Err(format!(
                "the peer runs {} but this is {}",
                names(theirs.test),
                names(ours.test)
            )
            .into());
        }
        if theirs != *ours {
            return Err(format!(
                "the peer's options differ: it runs {} iterations of {} sizes {}..={} B, \
                 we run {} iterations of {} sizes {}..={} B (give both sides the same -n, -s, \
                 -a and --max-size)",
                theirs.iters,
                theirs.count,
                theirs.first,
                theirs.last,
                ours.iters,
                ours.count,
                ours.first,
                ours.last
            )
            .into());
        }
        Ok(())
    }

    /// Sends our connection data and returns the peer's (validated).
    pub fn exchange(&mut self, ours: &ConnInfo) -> Result<ConnInfo> {
        self.send(&ours.encode(), "the connection data")?;
        let mut b = [0u8; CONN_LEN];
        self.recv(&mut b, self.timeout, "the connection data")?;
        ConnInfo::decode(&b)
    }

    /// Waits until the peer reached the same point (bounded by `timeout`).
    pub fn barrier(&mut self, timeout: Duration) -> Result<()> {
        self.seq += 1;
        let mut m = [0u8; 16];
        m[..4].copy_from_slice(b"SYNC");
        m[8..].copy_from_slice(&self.seq.to_be_bytes());
        self.send(&m, "synchronisation")?;
        let mut b = [0u8; 16];
        self.recv(&mut b, timeout, "synchronisation")?;
        if &b[..4] != b"SYNC" || b[8..] != self.seq.to_be_bytes() {
            return Err("the peer is out of step (unexpected synchronisation message)".into());
        }
        Ok(())
    }

    /// Sends the results of one size.
    pub fn send_report(&mut self, r: &Report) -> Result<()> {
        let mut m = [0u8; 80];
        m[..4].copy_from_slice(b"RSLT");
        m[8..16].copy_from_slice(&r.size.to_be_bytes());
        m[16..24].copy_from_slice(&r.iters.to_be_bytes());
        for (i, v) in r.values.iter().enumerate() {
            m[24 + 8 * i..32 + 8 * i].copy_from_slice(&v.to_bits().to_be_bytes());
        }
        self.send(&m, "results")
    }

    /// Receives the results of one size, checking they are for `size`.
    pub fn recv_report(&mut self, size: u64, iters: u64, timeout: Duration) -> Result<Report> {
        let mut b = [0u8; 80];
        self.recv(&mut b, timeout, "the results")?;
        if &b[..4] != b"RSLT" {
            return Err("malformed results from the peer".into());
        }
        let mut r = Report {
            size: u64::from_be_bytes(b[8..16].try_into().unwrap()),
            iters: u64::from_be_bytes(b[16..24].try_into().unwrap()),
            values: [0.0; 7],
        };
        for (i, v) in r.values.iter_mut().enumerate() {
            *v = f64::from_bits(u64::from_be_bytes(
                b[24 + 8 * i..32 + 8 * i].try_into().unwrap(),
            ));
        }
        if r.size != size || r.iters != iters {
            return Err(format!(
                "the peer reported results for {} B x {}, expected {size} B x {iters}",
                r.size, r.iters
            )
            .into());
        }
        Ok(r)
    }
}
