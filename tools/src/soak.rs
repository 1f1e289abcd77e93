//! The data mover of `cargo xtask soak` (the `soak_peer` binary is its
//! command line): many RC queue pairs, driven by several threads, each
//! thread's queue pairs on one shared completion queue, moving a random
//! mix of send/receive, RDMA write (with and without immediate), RDMA read,
//! fetch-and-add and compare-and-swap of random sizes (1 B – 1 MiB) while
//! the harness injects faults. Every byte is checked, and every atomic's
//! returned value against a model of the counter (see `model.rs`).
//!
//! The client runs *sessions*: connect every queue pair, move data until
//! the session's time is up or any request fails, drain, then compare
//! ledgers with the server (`END` / `LEDGER` lines over TCP: what completed
//! at the client was received and checked at the server, no more than was
//! posted, the counters where the model says). A request that fails (a
//! fault outlasted the retries, a killed server) ends the session; the next
//! one connects afresh. After each session both sides check that the
//! kernel's resource counts are back to what they were before it.
//!
//! How each kind of request is checked:
//! - send: the server checks the bytes, the order (a per-queue-pair
//!   sequence) and the length of each message it receives;
//! - write with immediate: the server checks the immediate (sequence and
//!   length); the client reads the bytes back;
//! - write: the client reads the bytes back (the read is posted after the
//!   write on the same queue pair, so it sees exactly that write: each
//!   queue pair owns its slots of the server's memory, and a slot is
//!   reused only after the read-back completed);
//! - read: the server's read-only region holds a known pattern;
//! - atomics: each returned original value against the model, and the
//!   counter's final value at the session's end.
//!
//! The buffers of reads, read-backs and atomics are filled with a poison
//! byte before they are posted (`pattern::POISON`): a wrong result that is
//! still poison is one the device completed successfully without writing,
//! and is reported as such.
//!
//! The client prints one `SESSION` line per session, `CORRUPT`/`LOST`
//! lines for any finding, and a final `SOAK` line with the totals (see
//! [`client`]); the server prints a `SERVER` line per session. Exit status 0
//! when the run reached its end, whatever it found: the harness judges.
//!
//! ```text
//! soak_peer server -d rxe1 -p 7000
//! soak_peer client 192.168.77.1 -d rxe1 -p 7000 --seconds 1800 --qps 16 --threads 4
//! ```

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::time::Duration;

use rdma_verbs::{
    memory::RemoteKey, qp::QpNumber, AccessFlags, ConnectOptions, Endpoint, Gid, QueuePair,
    RemoteMemory,
};

use crate::fault::Setup;

mod client;
mod model;
mod pattern;
mod server;
mod worker;

pub use client::{client, ClientArgs};
pub use server::server;

#[derive(clap::Args, Clone)]
/// Options both roles take.
pub struct Common {
    /// RDMA device (default: the first with an active port).
    #[arg(short = 'd', long)]
    pub device: Option<String>,
    /// Port of the device (default: its first active port).
    #[arg(short = 'i', long)]
    pub ib_port: Option<u8>,
    /// GID index (default: the port's default, as `fault_peer`).
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
}

/// Stream kinds (part of every message's seed).
const KIND_RECV: u8 = 1;
const KIND_WRITE: u8 = 2;

/// The immediate of a write with immediate: the low 11 bits of its
/// receive sequence and its length (< 2^21).
fn imm_of(seq: u64, len: usize) -> u32 {
    ((seq as u32 & 0x7ff) << 21) | len as u32
}

/// The server's regions as the client sees them.
#[derive(Clone, Copy, Debug)]
struct Regions {
    /// Written and read back by the client: `qps × slots` slots of `max`.
    write: RemoteMemory,
    /// Read-only, filled with stream `read_seed` from offset 0.
    read: RemoteMemory,
    read_seed: u64,
    /// One 8-byte counter per queue pair.
    atomic: RemoteMemory,
    /// Every counter's initial value.
    counter0: u64,
}

/// Size of the server's read-only region.
const READ_REGION: usize = 2 << 20;

/// One line-oriented TCP exchange (a persistent reader: lines the peer
/// sent together are never lost between calls).
struct Conn {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl Conn {
    fn new(stream: TcpStream) -> Result<Conn, String> {
        let writer = stream.try_clone().map_err(|e| e.to_string())?;
        Ok(Conn {
            reader: BufReader::new(stream),
            writer,
        })
    }
    /// The next line, waiting at most `t`.
    fn line(&mut self, t: Duration) -> Result<String, String> {
        self.reader
            .get_ref()
            .set_read_timeout(Some(t))
            .map_err(|e| e.to_string())?;
        let mut s = String::new();
        match self.reader.read_line(&mut s) {
            Ok(0) => Err("peer closed the exchange".into()),
            Ok(_) if s.ends_with('\n') => Ok(s),
            Ok(_) => Err("peer closed the exchange mid-line".into()),
            Err(e) => Err(format!("exchange: {e}")),
        }
    }
    fn send(&mut self, s: &str) -> Result<(), String> {
        self.writer
            .write_all(s.as_bytes())
            .map_err(|e| format!("exchange: {e}"))
    }
}

fn ep_line(ep: &Endpoint) -> String {
    format!("EP {} {} {} {}\n", ep.qp_num.0, ep.psn, ep.lid, ep.gid)
}

fn parse_ep(line: &str) -> Result<Endpoint, String> {
    let f: Vec<&str> = line.split_whitespace().collect();
    let [tag, qpn, psn, lid, gid] = f[..] else {
        return Err(format!("bad endpoint line {line:?}"));
    };
    if tag != "EP" {
        return Err(format!("bad endpoint line {line:?}"));
    }
    let num = |s: &str| s.parse::<u32>().map_err(|e| format!("{line:?}: {e}"));
    Ok(Endpoint {
        qp_num: QpNumber(num(qpn)?),
        psn: num(psn)? & 0xff_ffff,
        lid: num(lid)? as u16,
        gid: gid.parse::<Gid>().map_err(|e| format!("{line:?}: {e}"))?,
    })
}

fn mem_field(m: &RemoteMemory) -> String {
    format!("{},{},{}", m.addr, m.len, m.rkey.0)
}

fn regions_line(r: &Regions) -> String {
    format!(
        "MEM {} {} {} {} {}\n",
        mem_field(&r.write),
        mem_field(&r.read),
        r.read_seed,
        mem_field(&r.atomic),
        r.counter0
    )
}

fn parse_regions(line: &str) -> Result<Regions, String> {
    let f: Vec<&str> = line.split_whitespace().collect();
    let ["MEM", w, r, seed, a, c0] = f[..] else {
        return Err(format!("bad regions line {line:?}"));
    };
    let mem = |s: &str| -> Result<RemoteMemory, String> {
        let v: Vec<u64> = s
            .split(',')
            .map(|x| x.parse().map_err(|e| format!("{line:?}: {e}")))
            .collect::<Result<_, _>>()?;
        let [addr, len, rkey] = v[..] else {
            return Err(format!("bad region {s:?}"));
        };
        Ok(RemoteMemory {
            addr,
            len,
            rkey: RemoteKey(rkey as u32),
        })
    };
    let num = |s: &str| s.parse::<u64>().map_err(|e| format!("{line:?}: {e}"));
    Ok(Regions {
        write: mem(w)?,
        read: mem(r)?,
        read_seed: num(seed)?,
        atomic: mem(a)?,
        counter0: num(c0)?,
    })
}

/// Connects `qp` to `remote` for everything the soak does (atomics too).
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
        .rnr_retry(7)
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

/// Seconds since the machine booted (`/proc/uptime`): the clock of the
/// harness's fault log on the same VM, so a finding can be matched with
/// the fault in force when it was seen.
fn uptime() -> f64 {
    std::fs::read_to_string("/proc/uptime")
        .ok()
        .and_then(|t| t.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0)
}

/// The kernel's count of RDMA objects on `device` (`rdma resource show`'s
/// line for it, without the index), or `None` when it cannot be read.
fn resources(device: &str) -> Option<String> {
    let out = std::process::Command::new("rdma")
        .args(["resource", "show"])
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout).lines().find_map(|l| {
        let (_, rest) = l.split_once(": ")?;
        let rest = rest.strip_prefix(device)?.strip_prefix(": ")?;
        Some(rest.trim().to_string())
    })
}

/// Waits (2 s at most: the kernel releases some objects asynchronously)
/// until `device`'s resource counts are `baseline` again; the difference
/// otherwise.
fn back_to_baseline(device: &str, baseline: &Option<String>) -> Result<(), String> {
    let Some(base) = baseline else {
        return Ok(());
    };
    let mut now = None;
    for _ in 0..20 {
        now = resources(device);
        if now.as_ref() == Some(base) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Err(format!(
        "resources: {} (before: {base})",
        now.unwrap_or_else(|| "unreadable".into())
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_and_region_lines_round_trip() {
        let ep = Endpoint {
            qp_num: QpNumber(0x11),
            psn: 0x12_3456,
            lid: 0,
            gid: "::ffff:192.168.77.1".parse().unwrap(),
        };
        let back = parse_ep(&ep_line(&ep)).unwrap();
        assert_eq!(
            (back.qp_num, back.psn, back.gid),
            (ep.qp_num, ep.psn, ep.gid)
        );
        assert!(parse_ep("EP 1 2 3").is_err());
        let m = |addr| RemoteMemory {
            addr,
            len: 4096,
            rkey: RemoteKey(9),
        };
        let r = Regions {
            write: m(1),
            read: m(2),
            read_seed: 77,
            atomic: m(3),
            counter0: u64::MAX - 1,
        };
        let back = parse_regions(&regions_line(&r)).unwrap();
        assert_eq!(
            (
                back.write.addr,
                back.read.addr,
                back.atomic.addr,
                back.read_seed,
                back.counter0
            ),
            (1, 2, 3, 77, u64::MAX - 1)
        );
        assert!(parse_regions("MEM 1,2 3").is_err());
    }

    #[test]
    fn the_immediate_carries_sequence_and_length() {
        assert_eq!(imm_of(0, 1 << 20), 1 << 20);
        assert_eq!(imm_of(0x801, 5) >> 21, 1);
        assert_eq!(imm_of(3, 5) & 0x1f_ffff, 5);
    }
}
