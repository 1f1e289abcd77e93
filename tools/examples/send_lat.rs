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
//! Receives use a small pool of registered buffers, each with its
//! [`PreparedRecv`](rdma_verbs::qp::PreparedRecv) (perftest re-posts one
//! `ibv_recv_wr`), posted before the first message and re-posted from each
//! receive completion, after the answer is posted (with a pool of one
//! buffer, at once): claiming a receive costs one reference count, no
//! table. At the end the queue pair moves to ERR and the flushed receives
//! are polled, so the buffers come back. Sends carry a
//! `FrozenBuffer` (or inline data up to `-I`), so with `-t N` only every
//! N-th send needs a completion; with `-t 1` (the default) every send is
//! signaled and one prepared send ([`PreparedSend`](rdma_verbs::qp::PreparedSend))
//! is re-posted, as perftest reuses its `ibv_send_wr`.
//!
//! `--raw` posts sends and receives and polls through the library's
//! `unsafe` raw path (`post_send_raw`, `post_recv_raw`, `poll_raw`) — a
//! control isolating what the safe layer costs per operation.

use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;
use rdma_verbs::{
    cq::WorkCompletion, memory::FrozenBuffer, qp::PreparedRecv, sys, AccessFlags, LocalBuffer,
    QueuePair, RecvQueue, RecvRequest, SendRequest, Wr,
};

use rdma_verbs_tools::{perf, Done};

use perf::args::{self, CommonArgs, Config};
use perf::{report, stats, QpSpec, Resources, Result, Test};

/// Send latency test (perftest's ib_send_lat).
#[derive(Parser, Debug)]
#[command(name = "send_lat")]
struct Cli {
    #[command(flatten)]
    common: CommonArgs,
    /// Post and poll through the unsafe raw path (a control measuring the
    /// safe layer's cost); busy polling only
    #[arg(long)]
    raw: bool,
}

/// `wr_id` bit of receive requests.
const RECV: u64 = 1 << 62;

/// `wr_id` of the prepared send (every send signaled: one completion each).
const PREPARED_SEND: u64 = RECV - 1;

/// Progress of one size.
struct Progress {
    /// Receives completed.
    received: u64,
    /// Sends known complete (index of the last signaled completion + 1).
    sent: u64,
    /// The expected message size.
    size: u64,
    /// Receives (indices into the pool) back from their completions,
    /// re-posted after the next send is posted (off the path from a message
    /// to the answer); empty when re-posting at once (a pool of one buffer:
    /// the answer's answer could otherwise find no receive posted).
    repost: Vec<usize>,
    defer: bool,
}

impl Progress {
    fn handle(
        &mut self,
        rq: &mut RecvQueue,
        recvs: &mut [PreparedRecv],
        wc: &WorkCompletion,
    ) -> Result<()> {
        let wr_id = wc.wr_id();
        if wr_id & RECV != 0 {
            if u64::from(wc.byte_len()) != self.size {
                return Err(format!(
                    "received a {}-byte message, expected {} bytes",
                    wc.byte_len(),
                    self.size
                )
                .into());
            }
            self.received += 1;
            let k = (wr_id & !RECV) as usize;
            if k >= recvs.len() {
                return Err(format!("a receive completion with unknown wr_id {wr_id:#x}").into());
            }
            self.repost.push(k);
            if !self.defer {
                self.repost_all(rq, recvs)?;
            }
        } else if wr_id == PREPARED_SEND {
            self.sent += 1;
        } else {
            self.sent = wr_id + 1;
        }
        Ok(())
    }

    /// Re-posts the receives waiting for it.
    fn repost_all(&mut self, rq: &mut RecvQueue, recvs: &mut [PreparedRecv]) -> Result<()> {
        for k in self.repost.drain(..) {
            rq.post_prepared(&mut recvs[k])
                .map_err(|e| format!("reposting a receive: {e}"))?;
        }
        Ok(())
    }
}

/// Splits `region` into `count` pieces of `size` bytes and prepares and
/// posts one receive per piece, piece `k` with `wr_id` `RECV | k`.
fn post_prepared_recvs(
    rq: &mut RecvQueue,
    region: LocalBuffer,
    count: u32,
    size: u64,
) -> Result<Vec<PreparedRecv>> {
    let mut recvs = Vec::with_capacity(count as usize);
    for (k, piece) in (0u64..).zip(perf::split_pool(region, count, size)) {
        let mut recv = rq
            .prepare(RecvRequest::new(piece).wr_id(RECV | k))
            .map_err(|e| format!("preparing a receive: {}", e.error))?;
        rq.post_prepared(&mut recv)
            .map_err(|e| format!("posting a receive: {e}"))?;
        recvs.push(recv);
    }
    Ok(recvs)
}

/// Gets the prepared receives' buffers back, as a long-running program
/// must (a posting never completed keeps them for good): the queue pair
/// moves to ERR, which flushes them, and the flushes are polled, for
/// `timeout` at most. Failures here only leave buffers allocated.
fn reclaim_recvs(
    qp: &QueuePair,
    cq: &rdma_verbs::CompletionQueue,
    recvs: &[PreparedRecv],
    cfg: &Config,
) {
    if !recvs.iter().any(PreparedRecv::is_posted) || qp.to_err().is_err() {
        return;
    }
    let start = Instant::now();
    while recvs.iter().any(PreparedRecv::is_posted) && start.elapsed() < cfg.timeout {
        if cq.poll_one().is_err() {
            return;
        }
    }
}

/// Receive buffers posted through the raw path: `count` pieces of `size`
/// bytes of one registered region, piece `k` posted with `wr_id`
/// `RECV | k`.
///
/// Dropping it moves the QP to ERR and polls until every posted receive
/// has flushed, so the region outlives the device's use of it (the raw
/// path's contract); if they do not all flush within the timeout the
/// region is leaked rather than freed under the device.
struct RawRecvs<'a> {
    qp: &'a QueuePair,
    cq: &'a rdma_verbs::CompletionQueue,
    region: Option<LocalBuffer>,
    size: u64,
    posted: u32,
    timeout: std::time::Duration,
}

impl<'a> RawRecvs<'a> {
    fn post_all(
        qp: &'a QueuePair,
        cq: &'a rdma_verbs::CompletionQueue,
        region: LocalBuffer,
        count: u32,
        size: u64,
        cfg: &Config,
    ) -> Result<Self> {
        let mut r = RawRecvs {
            qp,
            cq,
            region: Some(region),
            size,
            posted: 0,
            timeout: cfg.timeout,
        };
        for k in 0..u64::from(count) {
            r.post(k)?;
        }
        Ok(r)
    }

    /// Posts piece `k` again.
    fn post(&mut self, k: u64) -> Result<()> {
        let region = self.region.as_ref().ok_or("receive region lost")?;
        let mut sge = sys::ibv_sge {
            addr: region.addr() + k * self.size,
            length: self.size as u32,
            lkey: region.lkey(),
        };
        let mut wr = sys::ibv_recv_wr {
            wr_id: RECV | k,
            sg_list: &mut sge,
            num_sge: 1,
            ..Default::default()
        };
        // Piece `k` lies inside the registered region, which this value
        // keeps alive until every posted receive has completed or flushed
        // (see Drop); nothing reads the region while receives are posted
        // (messages are checked by length only).
        // SAFETY: registered, kept alive and unread (above); bit 63 of
        // `wr_id` clear; one NULL-terminated request.
        unsafe { self.qp.post_recv_raw(&mut wr) }.map_err(|e| format!("posting a receive: {e}"))?;
        self.posted += 1;
        Ok(())
    }
}

impl Drop for RawRecvs<'_> {
    fn drop(&mut self) {
        let _ = self.qp.to_err();
        let mut wc = [WorkCompletion::default(); 16];
        let start = Instant::now();
        while self.posted > 0 && start.elapsed() < self.timeout {
            // SAFETY: only raw requests are posted to this queue pair (the
            // --raw loop), the only one reporting to `cq`.
            match unsafe { self.cq.poll_raw(&mut wc) } {
                Ok(n) => {
                    let recvs = wc[..n].iter().filter(|c| c.wr_id() & RECV != 0).count();
                    self.posted = self.posted.saturating_sub(recvs as u32);
                }
                Err(_) => break,
            }
        }
        if self.posted > 0 {
            std::mem::forget(self.region.take());
        }
    }
}

/// The `--raw` loop for one size: the C tool's loop, written against the
/// raw verbs.
fn raw_loop(
    cfg: &Config,
    recvs: &mut RawRecvs<'_>,
    src: &FrozenBuffer,
    server: bool,
    base: perf::Clock,
    stamps: &mut Vec<u64>,
) -> Result<()> {
    let (qp, cq) = (recvs.qp, recvs.cq);
    let size = src.len() as u64;
    let depth = u64::from(cfg.tx_depth);
    let inline = size <= u64::from(cfg.inline);
    let mut sge = sys::ibv_sge {
        addr: src.addr(),
        length: size as u32,
        lkey: src.lkey(),
    };
    let mut wc = [WorkCompletion::default(); 16];
    let (mut received, mut sent) = (0u64, 0u64);
    // Polls once; handles what came.
    let mut progress = |recvs: &mut RawRecvs<'_>,
                        received: &mut u64,
                        sent: &mut u64|
     -> Result<()> {
        // SAFETY: in --raw mode only raw requests are posted to `qp`,
        // the only queue pair reporting to `cq`.
        let n = unsafe { cq.poll_raw(&mut wc) }?;
        for c in &wc[..n] {
            if !c.is_success() {
                return Err(format!("completion {:#x} failed: {}", c.wr_id(), c.status()).into());
            }
            if c.wr_id() & RECV != 0 {
                recvs.posted -= 1;
                if u64::from(c.byte_len()) != size {
                    return Err(format!(
                        "received a {}-byte message, expected {size} bytes",
                        c.byte_len()
                    )
                    .into());
                }
                *received += 1;
                recvs.post(c.wr_id() & !RECV)?;
            } else {
                *sent = c.wr_id() + 1;
            }
        }
        Ok(())
    };
    let deadline = |start: &mut Option<Instant>, what: &str, i: u64| -> Result<()> {
        if start.get_or_insert_with(Instant::now).elapsed() > cfg.timeout {
            return Err(format!("no completion for {what} {i} within the timeout").into());
        }
        Ok(())
    };
    for i in 0..cfg.iters {
        let mut start = None;
        while server && received <= i {
            progress(recvs, &mut received, &mut sent)?;
            deadline(&mut start, "receive", i)?;
        }
        while i - sent >= depth {
            progress(recvs, &mut received, &mut sent)?;
            deadline(&mut start, "send", i)?;
        }
        let mut flags = 0;
        if (i + 1) % depth == 0 || i + 1 == cfg.iters {
            flags |= sys::ibv_send_flags::IBV_SEND_SIGNALED.0;
        }
        if inline {
            flags |= sys::ibv_send_flags::IBV_SEND_INLINE.0;
        }
        let mut wr = sys::ibv_send_wr {
            wr_id: i,
            sg_list: &mut sge,
            num_sge: 1,
            opcode: sys::IBV_WR_SEND,
            send_flags: flags,
            ..Default::default()
        };
        stamps.push(base.stamp());
        // SAFETY: `src` is registered (its lkey) and frozen (no Rust
        // writes); the caller keeps it alive until this loop has polled the
        // completion of the last (signaled) send; `wr_id` has bit 63 clear.
        unsafe { qp.post_send_raw(&mut wr) }.map_err(|e| format!("posting send {i}: {e}"))?;
        while !server && received <= i {
            progress(recvs, &mut received, &mut sent)?;
            deadline(&mut start, "receive", i)?;
        }
    }
    let mut start = None;
    while sent < cfg.iters {
        progress(recvs, &mut received, &mut sent)?;
        deadline(&mut start, "send", cfg.iters - 1)?;
    }
    Ok(())
}

fn run(cli: Cli) -> Result<()> {
    let cfg = Config::new(&cli.common, None, args::LAT)?;
    if cli.raw && cfg.events {
        return Err("--raw polls the CQ; it cannot be combined with -e".into());
    }
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
    // The posting handles (the queue pair is connected); the raw loop
    // posts around them.
    let mut sq = res.qp.send_queue()?;
    let mut rq = res.qp.recv_queue()?;
    let mut recvs: Vec<PreparedRecv> = Vec::new();
    let mut raw_recvs = if cli.raw {
        Some(RawRecvs::post_all(
            &res.qp,
            &res.cq,
            recv_region,
            pool,
            max,
            &cfg,
        )?)
    } else {
        recvs = post_prepared_recvs(&mut rq, recv_region, pool, max)?;
        None
    };
    report::banner(Test::SendLat, &cfg, &res, &local, &remote, &[]);
    report::lat_header();

    let server = cfg.is_server();
    let depth = u64::from(cfg.tx_depth);
    let mut done = Done::with_capacity((depth + u64::from(pool)) as usize);
    let mut wc = WorkCompletion::default();
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
            repost: Vec::with_capacity(pool as usize),
            defer: pool >= 2,
        };
        // With every send signaled (depth 1, perftest's default) the send is
        // prepared once and re-posted, as perftest reuses its ibv_send_wr.
        let request = || {
            if inline {
                SendRequest::send_inline(&frozen)
            } else {
                SendRequest::send(frozen.clone())
            }
        };
        let mut prepared = if depth == 1 && raw_recvs.is_none() {
            Some(
                sq.prepare(request().wr_id(PREPARED_SEND))
                    .map_err(|e| format!("preparing the send: {}", e.error))?,
            )
        } else {
            None
        };
        stamps.clear();
        peer.barrier(cfg.timeout)?;
        let base = perf::Clock::start();
        if let Some(recvs) = raw_recvs.as_mut() {
            raw_loop(&cfg, recvs, &frozen, server, base, &mut stamps)?;
        } else {
            for i in 0..cfg.iters {
                // The server answers message i; the client waits for it below.
                while server && p.received <= i {
                    res.waiter.wait_wc(&mut done, &mut wc, "a receive")?;
                    p.handle(&mut rq, &mut recvs, &wc)?;
                }
                while i - p.sent >= depth {
                    res.waiter.wait_wc(&mut done, &mut wc, "a send")?;
                    p.handle(&mut rq, &mut recvs, &wc)?;
                }
                if let Some(send) = prepared.as_mut() {
                    stamps.push(base.stamp());
                    sq.post_prepared(send)
                        .map_err(|e| format!("posting send {i}: {e}"))?;
                } else {
                    let signaled = (i + 1) % depth == 0 || i + 1 == cfg.iters;
                    let o = if signaled {
                        Wr::id(i)
                    } else {
                        Wr::id(i).unsignaled()
                    };
                    // The request's buffer (a clone) is made before the stamp.
                    let buf = (!inline).then(|| frozen.clone());
                    stamps.push(base.stamp());
                    let posted = match buf {
                        None => sq.send_inline(&frozen, o),
                        Some(buf) => sq.send(buf, o).map_err(|e| e.error),
                    };
                    posted.map_err(|e| format!("posting send {i}: {e}"))?;
                }
                p.repost_all(&mut rq, &mut recvs)?;
                while !server && p.received <= i {
                    res.waiter.wait_wc(&mut done, &mut wc, "a receive")?;
                    p.handle(&mut rq, &mut recvs, &wc)?;
                }
            }
            while p.sent < cfg.iters {
                res.waiter.wait_wc(&mut done, &mut wc, "a send")?;
                p.handle(&mut rq, &mut recvs, &wc)?;
            }
            p.repost_all(&mut rq, &mut recvs)?;
        }
        // Every send completed: the prepared one holds no posting and gives
        // its clone of the source buffer back when dropped.
        drop(prepared);
        base.convert(&mut stamps);
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
    reclaim_recvs(&res.qp, &res.cq, &recvs, &cfg);
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    perf::main_with("send_lat", || run(cli))
}
