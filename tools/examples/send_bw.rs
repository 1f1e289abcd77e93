//! Send/receive bandwidth, like perftest's `ib_send_bw`.
//!
//! ```text
//! send_bw [options]            # server: receives
//! send_bw [options] <host>     # client: streams sends
//! ```
//! The server keeps a pool of receive buffers posted (as many as the
//! iterations, at most 512, within a 64 MiB budget), reposting each from
//! its completion and checking every message's length. The client keeps
//! `-t` sends outstanding, posted in lists of `-l`, signaling every `-Q`-th;
//! its source is one registered buffer frozen per size (inline up to `-I`).
//! The client prints peak and average bandwidth and the message rate; the
//! server prints the client's results.

use std::process::ExitCode;

use clap::Parser;
use rdma_verbs::{memory::FrozenBuffer, AccessFlags, Completion, SendRequest};

use rdma_verbs_tools::{perf, Done};

use perf::args::{self, BwArgs, CommonArgs, Config};
use perf::stream::{self, Params, Source, Timing};
use perf::{report, QpSpec, Resources, Result, Test};

/// Send bandwidth test (perftest's ib_send_bw).
#[derive(Parser, Debug)]
#[command(name = "send_bw")]
struct Cli {
    #[command(flatten)]
    common: CommonArgs,
    #[command(flatten)]
    bw: BwArgs,
}

struct Sends<'a> {
    buf: &'a FrozenBuffer,
    inline: bool,
}

impl<'a> Source<'a> for Sends<'a> {
    fn request(&mut self, _index: u64) -> Result<SendRequest<'a>> {
        Ok(if self.inline {
            SendRequest::send_inline(self.buf)
        } else {
            SendRequest::send(self.buf.clone())
        })
    }
    fn completed(&mut self, _c: &mut Completion) -> Result<()> {
        Ok(())
    }
}

/// The receiving side.
fn serve(cfg: &Config) -> Result<()> {
    let max = cfg.max_size();
    let pool = perf::pool_count(max, cfg.iters.min(512)) as u32;
    let spec = QpSpec {
        send_wr: 1,
        recv_wr: pool,
    };
    let mut res = Resources::open(cfg, spec)?;
    let recv_region = res
        .pd
        .alloc((max * u64::from(pool)) as usize, AccessFlags::LOCAL_WRITE)?;
    let (mut peer, local, remote) = perf::handshake(
        cfg,
        &mut res,
        Test::SendBw,
        None,
        AccessFlags::LOCAL_WRITE,
        false,
    )?;
    // The receive queue's posting handle, kept for the reposts.
    let mut rq = res.qp.recv_queue()?;
    perf::post_recv_pool(&mut rq, recv_region, pool, max, 0)?;
    report::banner(
        Test::SendBw,
        cfg,
        &res,
        &local,
        &remote,
        &[("RX depth", pool.to_string())],
    );
    report::bw_header();
    let mut done = Done::with_capacity(pool as usize);
    for &size in &cfg.sizes {
        peer.barrier(cfg.timeout)?;
        let mut received = 0;
        while received < cfg.iters {
            res.waiter.wait(&mut done, "a receive")?;
            for mut c in done.drain() {
                c.result()?;
                if u64::from(c.byte_len()) != size {
                    return Err(format!(
                        "received a {}-byte message, expected {size} bytes",
                        c.byte_len()
                    )
                    .into());
                }
                received += 1;
                let buf = c
                    .take_local()
                    .ok_or("a receive completion did not return its buffer")?;
                rq.recv(buf, 0)
                    .map_err(|e| format!("reposting a receive: {}", e.error))?;
            }
        }
        let r = peer.recv_report(size, cfg.iters, cfg.timeout)?;
        report::bw_row(size, r.iters, &report::bw_from(&r.values));
    }
    println!("{}", report::LINE);
    Ok(())
}

fn run(cli: Cli) -> Result<()> {
    let cfg = Config::new(&cli.common, Some(&cli.bw), args::BW_1000)?;
    if cfg.is_server() {
        return serve(&cfg);
    }
    let max = cfg.max_size();
    let spec = QpSpec {
        send_wr: cfg.tx_depth,
        recv_wr: 1,
    };
    let mut res = Resources::open(&cfg, spec)?;
    let mut src = res.pd.alloc(max as usize, AccessFlags::LOCAL_WRITE)?;
    for (i, b) in src.iter_mut().enumerate() {
        *b = i as u8;
    }
    let mut src = Some(src);
    let (mut peer, local, remote) = perf::handshake(
        &cfg,
        &mut res,
        Test::SendBw,
        None,
        AccessFlags::LOCAL_WRITE,
        false,
    )?;
    let extra = [
        ("CQ Moderation", cfg.cq_mod.to_string()),
        ("Post List", cfg.post_list.to_string()),
    ];
    report::banner(Test::SendBw, &cfg, &res, &local, &remote, &extra);
    report::bw_header();

    // The send queue's posting handle (the queue pair is connected).
    let mut sq = res.qp.send_queue()?;
    let mut done = Done::with_capacity(cfg.tx_depth as usize);
    let mut timing = Timing::with_capacity(cfg.iters);
    for &size in &cfg.sizes {
        let (head, tail) = src
            .take()
            .ok_or("source buffer lost")?
            .split_at(size as usize);
        let frozen = head.freeze();
        let p = Params {
            n: cfg.iters,
            depth: u64::from(cfg.tx_depth),
            post_list: u64::from(cfg.post_list),
            cq_mod: u64::from(cfg.cq_mod),
        };
        let mut sends = Sends {
            buf: &frozen,
            inline: size <= u64::from(cfg.inline),
        };
        peer.barrier(cfg.timeout)?;
        stream::run(
            &mut sq,
            &mut res.waiter,
            &mut done,
            p,
            &mut sends,
            &mut timing,
        )?;
        let summary = timing.summary(size, &p).ok_or("no measurements")?;
        report::bw_row(size, cfg.iters, &summary);
        peer.send_report(&perf::net::Report {
            size,
            iters: cfg.iters,
            values: report::bw_values(&summary),
        })?;
        let head = frozen
            .try_unfreeze()
            .map_err(|_| "a completed send still holds the source buffer")?;
        src = Some(
            head.unsplit(tail)
                .map_err(|_| "cannot rejoin the source buffer")?,
        );
    }
    println!("{}", report::LINE);
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    perf::main_with("send_bw", || run(cli))
}
