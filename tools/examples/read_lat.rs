//! RDMA read latency, like perftest's `ib_read_lat`.
//!
//! ```text
//! read_lat [options]            # server: offers a remote-readable buffer
//! read_lat [options] <host>     # client: reads it, one read at a time
//! ```
//! The client posts one RDMA read of `-s` bytes, waits for its completion,
//! and repeats; latency is the time between consecutive posts (a read is a
//! full round trip). The server prints the client's results.
//!
//! The read is prepared once ([`PreparedSend`](rdma_verbs::qp::PreparedSend)) and
//! posted again each iteration, as perftest reuses one `ibv_send_wr`.
//! `--per-request` builds and posts a new owned-buffer request each time
//! (`SendQueue::read`, the buffer back through the completion) instead.
//!
//! `--extended` uses the extended verbs (`ibv_wr_*`, `ibv_start_poll`) for the
//! legacy-vs-extended comparison of `cargo xtask bench`.
//!
//! `--raw` posts and polls through the library's `unsafe` raw path
//! (`post_send_raw`, `poll_raw`: no ownership bookkeeping, no checks) — a
//! control that isolates what the safe layer costs per operation.

use std::process::ExitCode;

use clap::Parser;
use rdma_verbs::{
    cq::WorkCompletion, memory::SgList, sys, AccessFlags, LocalBuffer, RemoteMemory, SendRequest,
    Wr,
};

use rdma_verbs_tools::{perf, Done};

use perf::args::{self, CommonArgs, Config};
use perf::{report, stats, QpSpec, Resources, Result, Table, Test};

/// RDMA read latency test (perftest's ib_read_lat).
#[derive(Parser, Debug)]
#[command(name = "read_lat")]
struct Cli {
    #[command(flatten)]
    common: CommonArgs,
    /// Post and poll through the unsafe raw path (a control measuring the
    /// safe layer's cost); busy polling only
    #[arg(long, conflicts_with = "extended")]
    raw: bool,
    /// Use the extended verbs: QP from ibv_create_qp_ex posted with the
    /// ibv_wr_* builders, CQ from ibv_create_cq_ex polled with start/next/end
    #[arg(long)]
    extended: bool,
    /// Build and post a new owned-buffer request every iteration (SendQueue::read)
    /// instead of re-posting a prepared one
    #[arg(long, conflicts_with = "raw")]
    per_request: bool,
}

/// The `--raw` loop: the C tool's loop (one request, built once), written
/// against the raw verbs.
fn raw_loop(
    res: &Resources,
    cfg: &Config,
    head: &LocalBuffer,
    from: RemoteMemory,
    base: perf::Clock,
    stamps: &mut Vec<u64>,
) -> Result<()> {
    let mut sge = sys::ibv_sge {
        addr: head.addr(),
        length: head.len() as u32,
        lkey: head.lkey(),
    };
    let mut wr = sys::ibv_send_wr {
        sg_list: &mut sge,
        num_sge: 1,
        opcode: sys::IBV_WR_RDMA_READ,
        send_flags: sys::ibv_send_flags::IBV_SEND_SIGNALED.0,
        ..Default::default()
    };
    wr.wr.rdma = sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 {
        remote_addr: from.addr,
        rkey: from.rkey.0,
    };
    let mut wc = [WorkCompletion::default(); 1];
    for i in 0..cfg.iters {
        wr.wr_id = i;
        stamps.push(base.stamp());
        // SAFETY: `head` is registered (its lkey), owned by the caller and
        // not touched until this read's completion is polled below; `wr_id`
        // has bit 63 clear; the chain is one NULL-terminated request.
        unsafe { res.qp.post_send_raw(&mut wr) }.map_err(|e| format!("posting read {i}: {e}"))?;
        // SAFETY: in --raw mode only raw requests are posted to `res.qp`,
        // the only queue pair reporting to `res.cq`.
        unsafe { perf::wait_raw(&res.cq, &mut wc, cfg.timeout, || format!("RDMA read {i}")) }?;
    }
    Ok(())
}

fn run(cli: Cli) -> Result<()> {
    let mut cfg = Config::new(&cli.common, None, args::LAT)?;
    if cli.raw && cfg.events {
        return Err("--raw polls the CQ; it cannot be combined with -e".into());
    }
    // Reads carry no inline data (perftest disables -I for reads too).
    cfg.inline = 0;
    let max = cfg.max_size();
    let spec = QpSpec {
        send_wr: cfg.tx_depth,
        recv_wr: 1,
    };
    let mut res = Resources::open_ex(&cfg, spec, cli.extended)?;

    if cfg.is_server() {
        let rights = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ;
        let mut source = res.pd.alloc(max as usize, rights)?;
        for (i, b) in source.iter_mut().enumerate() {
            *b = i as u8;
        }
        let offer = source.memory_region().remote();
        let (mut peer, local, remote) =
            perf::handshake(&cfg, &mut res, Test::ReadLat, offer, rights, true)?;
        report::banner(Test::ReadLat, &cfg, &res, &local, &remote, &[]);
        perf::serve_passive(&cfg, &mut peer, Table::Lat)?;
        drop(source);
        return Ok(());
    }

    let mut dst = Some(res.pd.alloc(max as usize, AccessFlags::LOCAL_WRITE)?);
    let (mut peer, local, remote) = perf::handshake(
        &cfg,
        &mut res,
        Test::ReadLat,
        None,
        AccessFlags::LOCAL_WRITE,
        true,
    )?;
    let source = perf::check_remote(&remote, max, 1)?;
    report::banner(Test::ReadLat, &cfg, &res, &local, &remote, &[]);
    report::lat_header();

    // The send queue's posting handle (the queue pair is connected); the
    // raw loop posts around it.
    let mut sq = res.qp.send_queue()?;
    let mut done = Done::with_capacity(4);
    let mut stamps: Vec<u64> = Vec::with_capacity(cfg.iters as usize);
    let mut samples: Vec<f64> = Vec::with_capacity(cfg.iters as usize);
    for &size in &cfg.sizes {
        let (mut head, tail) = dst
            .take()
            .ok_or("read buffer lost")?
            .split_at(size as usize);
        let from = source.slice(0, size).ok_or("remote range")?;
        stamps.clear();
        peer.barrier(cfg.timeout)?;
        let base = perf::Clock::start();
        if cli.raw {
            raw_loop(&res, &cfg, &head, from, base, &mut stamps)?;
        } else if !cli.extended && !cli.per_request {
            let mut read = sq
                .prepare(SendRequest::read(head, from))
                .map_err(|e| format!("preparing the read: {}", e.error))?;
            let mut wc = WorkCompletion::default();
            for i in 0..cfg.iters {
                stamps.push(base.stamp());
                sq.post_prepared(&mut read)
                    .map_err(|e| format!("posting read {i}: {e}"))?;
                res.waiter.wait_wc(&mut done, &mut wc, "an RDMA read")?;
            }
            head = read
                .into_buffers()
                .ok()
                .and_then(SgList::into_local)
                .ok_or("the prepared read did not give its buffer back")?;
        } else {
            for i in 0..cfg.iters {
                stamps.push(base.stamp());
                sq.read(head, from, Wr::id(i))
                    .map_err(|e| format!("posting read {i}: {}", e.error))?;
                head = perf::wait_local(&mut res.waiter, &mut done, "an RDMA read")?;
            }
        }
        base.convert(&mut stamps);
        stats::deltas_us(&stamps, 1.0, &mut samples);
        let summary = stats::summarize(&mut samples).ok_or("no samples")?;
        report::lat_row(size, cfg.iters, &summary);
        peer.send_report(&perf::net::Report {
            size,
            iters: cfg.iters,
            values: report::lat_values(&summary),
        })?;
        dst = Some(
            head.unsplit(tail)
                .map_err(|_| "cannot rejoin the read buffer")?,
        );
    }
    println!("{}", report::LINE);
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    perf::main_with("read_lat", || run(cli))
}
