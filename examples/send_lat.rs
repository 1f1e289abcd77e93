//! Send/receive latency, like perftest's `ib_send_lat`.
//!
//! ```text
//! send_lat [options]            # server
//! send_lat [options] <host>     # client
//! ```
//! Ping-pong of sends: the client sends `-s` bytes, the server answers when
//! its receive completes, and so on. Latency is half the time between
//! consecutive posts; both sides print their own table.
//!
//! Receives use a small pool of registered buffers posted before the first
//! message and reposted from each receive completion. Sends carry a
//! `FrozenBuffer` (or inline data up to `-I`), so with `-t N` only every
//! N-th send needs a completion.

use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;
use ibverbs::{AccessFlags, Completion, Completions, QueuePair, RecvRequest, SendRequest};

#[path = "perf/mod.rs"]
mod perf;

use perf::args::{self, CommonArgs, Config};
use perf::{ns_since, report, stats, QpSpec, Resources, Result, Test};

/// Send latency test (perftest's ib_send_lat).
#[derive(Parser, Debug)]
#[command(name = "send_lat")]
struct Cli {
    #[command(flatten)]
    common: CommonArgs,
}

/// `wr_id` bit of receive requests.
const RECV: u64 = 1 << 62;

/// Progress of one size.
struct Progress {
    /// Receives completed.
    received: u64,
    /// Sends known complete (index of the last signaled completion + 1).
    sent: u64,
    /// The expected message size.
    size: u64,
}

impl Progress {
    fn handle(&mut self, qp: &QueuePair, c: &mut Completion) -> Result<()> {
        c.result()?;
        if c.wr_id() & RECV != 0 {
            if u64::from(c.byte_len()) != self.size {
                return Err(format!(
                    "received a {}-byte message, expected {} bytes",
                    c.byte_len(),
                    self.size
                )
                .into());
            }
            self.received += 1;
            let buf = c
                .take_local()
                .ok_or("a receive completion without its buffer")?;
            qp.post_recv(RecvRequest::new(buf).wr_id(RECV))
                .map_err(|e| format!("reposting a receive: {}", e.error))?;
        } else {
            self.sent = c.wr_id() + 1;
        }
        Ok(())
    }
}

fn run(cli: Cli) -> Result<()> {
    let cfg = Config::new(&cli.common, None, args::LAT)?;
    let max = cfg.max_size();
    let pool = perf::pool_count(max, 16) as u32;
    let spec = QpSpec {
        send_wr: cfg.tx_depth,
        recv_wr: pool,
    };
    let mut res = Resources::open(&cfg, spec)?;

    // Receive buffers: one registration split into `pool` pieces, posted
    // once the QP is connected (before the first barrier, so before the
    // peer's first send).
    let recv_region = res
        .pd
        .alloc((max * u64::from(pool)) as usize, AccessFlags::LOCAL_WRITE)?;

    let mut src = res.pd.alloc(max as usize, AccessFlags::LOCAL_WRITE)?;
    for (i, b) in src.iter_mut().enumerate() {
        *b = i as u8;
    }
    let mut src = Some(src);
    let (mut peer, local, remote) = perf::handshake(
        &cfg,
        &mut res,
        Test::SendLat,
        None,
        AccessFlags::LOCAL_WRITE,
        false,
    )?;
    perf::post_recv_pool(&res.qp, recv_region, pool, max, RECV)?;
    report::banner(Test::SendLat, &cfg, &res, &local, &remote, &[]);
    report::lat_header();

    let server = cfg.is_server();
    let depth = u64::from(cfg.tx_depth);
    let mut done = Completions::with_capacity((depth + u64::from(pool)) as usize);
    let mut stamps: Vec<u64> = Vec::with_capacity(cfg.iters as usize);
    let mut samples: Vec<f64> = Vec::with_capacity(cfg.iters as usize);
    for &size in &cfg.sizes {
        let (head, tail) = src
            .take()
            .ok_or("source buffer lost")?
            .split_at(size as usize);
        let frozen = head.freeze();
        let inline = size <= u64::from(cfg.inline);
        let mut p = Progress {
            received: 0,
            sent: 0,
            size,
        };
        stamps.clear();
        peer.barrier(cfg.timeout)?;
        let base = Instant::now();
        for i in 0..cfg.iters {
            // The server answers message i; the client waits for it below.
            while server && p.received <= i {
                res.waiter.wait(&mut done, "a receive")?;
                for mut c in done.drain() {
                    p.handle(&res.qp, &mut c)?;
                }
            }
            while i - p.sent >= depth {
                res.waiter.wait(&mut done, "a send")?;
                for mut c in done.drain() {
                    p.handle(&res.qp, &mut c)?;
                }
            }
            let req = if inline {
                SendRequest::send_inline(&frozen)
            } else {
                SendRequest::send(frozen.clone())
            };
            let signaled = (i + 1) % depth == 0 || i + 1 == cfg.iters;
            stamps.push(ns_since(base));
            res.qp
                .post_send(req.wr_id(i).signaled(signaled))
                .map_err(|e| format!("posting send {i}: {}", e.error))?;
            while !server && p.received <= i {
                res.waiter.wait(&mut done, "a receive")?;
                for mut c in done.drain() {
                    p.handle(&res.qp, &mut c)?;
                }
            }
        }
        while p.sent < cfg.iters {
            res.waiter.wait(&mut done, "a send")?;
            for mut c in done.drain() {
                p.handle(&res.qp, &mut c)?;
            }
        }
        stats::deltas_us(&stamps, 2.0, &mut samples);
        let summary = stats::summarize(&mut samples).ok_or("no samples")?;
        report::lat_row(size, cfg.iters, &summary);
        let head = frozen
            .try_unfreeze()
            .map_err(|_| "a completed send still holds the source buffer")?;
        src = Some(
            head.unsplit(tail)
                .map_err(|_| "cannot rejoin the source buffer")?,
        );
    }
    println!("{}", report::LINE);
    peer.barrier(cfg.timeout)?;
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    perf::main_with("send_lat", || run(cli))
}
