//! RDMA read bandwidth, like perftest's `ib_read_bw`.
//!
//! ```text
//! read_bw [options]            # server: offers a remote-readable buffer
//! read_bw [options] <host>     # client: streams RDMA reads from it
//! ```
//! The client keeps up to `-t` reads outstanding (posted in lists of `-l`)
//! and prints peak and average bandwidth and the message rate per size; the
//! server prints the client's results.
//!
//! Every read needs its own exclusive destination buffer (the device writes
//! it), so the client splits one registration into a pool of buffers of the
//! current size, as many as the tx depth (within a 64 MiB budget), and takes
//! each back from its completion. For the same reason every read is
//! signaled: CQ moderation (`-Q`) cannot apply, as an unsignaled request may
//! only carry read-only (`FrozenBuffer`) or inline data.

use std::process::ExitCode;

use clap::Parser;
use rdma_verbs::{AccessFlags, Completion, LocalBuffer, RemoteMemory, SendRequest};

use rdma_verbs_tools::{perf, Done};

use perf::args::{self, BwArgs, CommonArgs, Config};
use perf::stream::{self, Params, Source, Timing};
use perf::{report, QpSpec, Resources, Result, Table, Test};

/// RDMA read bandwidth test (perftest's ib_read_bw).
#[derive(Parser, Debug)]
#[command(name = "read_bw")]
struct Cli {
    #[command(flatten)]
    common: CommonArgs,
    #[command(flatten)]
    bw: BwArgs,
}

/// Reads into a pool of exclusive buffers.
struct Reads {
    free: Vec<LocalBuffer>,
    remote: RemoteMemory,
}

impl Source<'static> for Reads {
    fn request(&mut self, index: u64) -> Result<SendRequest<'static>> {
        let buf = self
            .free
            .pop()
            .ok_or_else(|| format!("no free read buffer for read {index}"))?;
        Ok(SendRequest::read(buf, self.remote))
    }
    fn completed(&mut self, c: &mut Completion) -> Result<()> {
        let buf = c
            .take_local()
            .ok_or("a read completion did not return its buffer")?;
        self.free.push(buf);
        Ok(())
    }
}

fn run(cli: Cli) -> Result<()> {
    let mut cfg = Config::new(&cli.common, Some(&cli.bw), args::BW_1000)?;
    cfg.inline = 0;
    if cfg.cq_mod_requested && cfg.cq_mod > 1 {
        eprintln!("read_bw: every read is signaled (its buffer comes back with its completion); -Q ignored");
    }
    cfg.cq_mod = 1;
    let max = cfg.max_size();
    let spec = QpSpec {
        send_wr: cfg.tx_depth,
        recv_wr: 1,
    };
    let mut res = Resources::open(&cfg, spec)?;

    if cfg.is_server() {
        let rights = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ;
        let mut source = res.pd.alloc(max as usize, rights)?;
        for (i, b) in source.iter_mut().enumerate() {
            *b = i as u8;
        }
        let offer = source.memory_region().remote();
        let (mut peer, local, remote) =
            perf::handshake(&cfg, &mut res, Test::ReadBw, offer, rights, true)?;
        report::banner(Test::ReadBw, &cfg, &res, &local, &remote, &[]);
        perf::serve_passive(&cfg, &mut peer, Table::Bw)?;
        drop(source);
        return Ok(());
    }

    let want = u64::from(cfg.tx_depth).min(cfg.iters);
    let pool_bytes = perf::pool_count(max, want) * max;
    let mut region = Some(
        res.pd
            .alloc(pool_bytes as usize, AccessFlags::LOCAL_WRITE)?,
    );
    let (mut peer, local, remote) = perf::handshake(
        &cfg,
        &mut res,
        Test::ReadBw,
        None,
        AccessFlags::LOCAL_WRITE,
        true,
    )?;
    let source = perf::check_remote(&remote, max, 1)?;
    let extra = [
        (
            "Outstand reads",
            res.dev_attr.max_qp_init_rd_atom().clamp(1, 128).to_string(),
        ),
        ("Post List", cfg.post_list.to_string()),
    ];
    report::banner(Test::ReadBw, &cfg, &res, &local, &remote, &extra);
    report::bw_header();

    // The send queue's posting handle (the queue pair is connected).
    let mut sq = res.qp.send_queue()?;
    let mut done = Done::with_capacity(cfg.tx_depth as usize);
    let mut timing = Timing::with_capacity(cfg.iters);
    let mut reads = Reads {
        free: Vec::with_capacity(want as usize),
        remote: source,
    };
    for &size in &cfg.sizes {
        // Split the pool into buffers of this size (plus an unused tail).
        let count = (pool_bytes / size).min(want);
        let mut rest = region.take().ok_or("read buffers lost")?;
        for _ in 0..count {
            let (piece, tail) = rest.split_at(size as usize);
            reads.free.push(piece);
            rest = tail;
        }
        reads.remote = source.slice(0, size).ok_or("remote range")?;
        // Each outstanding read holds one buffer; post lists must fit.
        let depth = (count / u64::from(cfg.post_list)) * u64::from(cfg.post_list);
        if depth == 0 {
            return Err(format!(
                "{count} read buffers of {size} B cannot hold a post list of {}",
                cfg.post_list
            )
            .into());
        }
        let p = Params {
            n: cfg.iters,
            depth,
            post_list: u64::from(cfg.post_list),
            cq_mod: 1,
        };
        peer.barrier(cfg.timeout)?;
        stream::run(
            &mut sq,
            &mut res.waiter,
            &mut done,
            p,
            &mut reads,
            &mut timing,
        )?;
        let summary = timing.summary(size, &p).ok_or("no measurements")?;
        report::bw_row(size, cfg.iters, &summary);
        peer.send_report(&perf::net::Report {
            size,
            iters: cfg.iters,
            values: report::bw_values(&summary),
        })?;
        // Rejoin the pieces in address order.
        reads
            .free
            .sort_unstable_by_key(|b| std::cmp::Reverse(b.addr()));
        let mut whole = reads.free.pop().ok_or("read buffers lost")?;
        while let Some(next) = reads.free.pop() {
            whole = whole
                .unsplit(next)
                .map_err(|_| "cannot rejoin the read buffers")?;
        }
        region = Some(
            whole
                .unsplit(rest)
                .map_err(|_| "cannot rejoin the read buffers")?,
        );
    }
    println!("{}", report::LINE);
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    perf::main_with("read_bw", || run(cli))
}
