//! RDMA write latency, like perftest's `ib_write_lat`.
//!
//! ```text
//! write_lat [options]            # server
//! write_lat [options] <host>     # client
//! ```
//! Ping-pong of RDMA writes: each side writes `-s` bytes into the other's
//! buffer, the last byte carrying an iteration counter, and waits until the
//! peer's write of the same iteration has landed in its own buffer (polling
//! that last byte). Latency is half the time between consecutive posts.
//! Both sides print their own table.
//!
//! The buffer peers write is a `SharedBuffer`: it is read only through
//! volatile copies (`copy_to_slice`), never as a slice. The source is a
//! `LocalBuffer` whose counter byte is set before each post and which comes
//! back with the write's completion. With `-e` the write completions are
//! awaited on the completion channel; the peer's writes raise no completion
//! and are still detected by polling memory (as in perftest).
//!
//! `--raw` posts and polls through the library's `unsafe` raw path
//! (`post_send_raw`, `poll_raw`) — a control isolating what the safe layer
//! costs per operation, as `read_lat --raw`.

use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;
use rdma_verbs::{
    cq::WorkCompletion, sys, AccessFlags, LocalBuffer, RemoteMemory, SharedBuffer, Wr,
};

use rdma_verbs_tools::{perf, Done};

use perf::args::{self, CommonArgs, Config};
use perf::{report, stats, QpSpec, Resources, Result, Test};

/// RDMA write latency test (perftest's ib_write_lat).
#[derive(Parser, Debug)]
#[command(name = "write_lat")]
struct Cli {
    #[command(flatten)]
    common: CommonArgs,
    /// Post and poll through the unsafe raw path (a control measuring the
    /// safe layer's cost); busy polling only
    #[arg(long)]
    raw: bool,
}

/// Spins until byte `offset` of `buf` equals `value` (volatile reads).
fn wait_byte(buf: &SharedBuffer, offset: usize, value: u8, cfg: &Config, iter: u64) -> Result<()> {
    let mut b = [0u8; 1];
    let mut spins = 0u32;
    let mut start: Option<Instant> = None;
    loop {
        buf.copy_to_slice(offset, &mut b)?;
        if b[0] == value {
            return Ok(());
        }
        spins = spins.wrapping_add(1);
        if spins % 4096 == 0 && start.get_or_insert_with(Instant::now).elapsed() > cfg.timeout {
            return Err(format!(
                "the peer's write of iteration {iter} did not arrive within {:.1} s",
                cfg.timeout.as_secs_f64()
            )
            .into());
        }
        // No `spin_loop()` (PAUSE), as in perftest's loops: it delays
        // noticing the event, and under QEMU's TCG it leaves the
        // translated-code loop on every spin.
    }
}

/// What one size's loop needs.
struct Lap<'a> {
    cfg: &'a Config,
    inbox: &'a SharedBuffer,
    remote: RemoteMemory,
    inline: bool,
    server: bool,
    base: perf::Clock,
}

/// The `--raw` loop: the C tool's loop (one request, built once), written
/// against the raw verbs.
fn raw_loop(
    res: &Resources,
    lap: &Lap<'_>,
    head: &mut LocalBuffer,
    stamps: &mut Vec<u64>,
) -> Result<()> {
    let last = head.len() - 1;
    let mut sge = sys::ibv_sge {
        addr: head.addr(),
        length: head.len() as u32,
        lkey: head.lkey(),
    };
    let mut flags = sys::ibv_send_flags::IBV_SEND_SIGNALED.0;
    if lap.inline {
        flags |= sys::ibv_send_flags::IBV_SEND_INLINE.0;
    }
    let mut wr = sys::ibv_send_wr {
        sg_list: &mut sge,
        num_sge: 1,
        opcode: sys::IBV_WR_RDMA_WRITE,
        send_flags: flags,
        ..Default::default()
    };
    wr.wr.rdma = sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 {
        remote_addr: lap.remote.addr,
        rkey: lap.remote.rkey.0,
    };
    let mut wc = [WorkCompletion::default(); 1];
    for i in 0..lap.cfg.iters {
        let value = ((i + 1) % 256) as u8;
        if lap.server {
            wait_byte(lap.inbox, last, value, lap.cfg, i)?;
        }
        // The previous write's completion was polled: the device is done
        // reading `head`.
        head[last] = value;
        wr.wr_id = i;
        stamps.push(lap.base.stamp());
        // SAFETY: `head` is registered (its lkey), borrowed mutably by this
        // loop and not touched until this write's completion is polled
        // below; `wr_id` has bit 63 clear; the chain is one NULL-terminated
        // request.
        unsafe { res.qp.post_send_raw(&mut wr) }.map_err(|e| format!("posting write {i}: {e}"))?;
        if !lap.server {
            wait_byte(lap.inbox, last, value, lap.cfg, i)?;
        }
        // SAFETY: in --raw mode only raw requests are posted to `res.qp`,
        // the only queue pair reporting to `res.cq`.
        unsafe {
            perf::wait_raw(&res.cq, &mut wc, lap.cfg.timeout, || {
                format!("RDMA write {i}")
            })
        }?;
    }
    Ok(())
}

fn run(cli: Cli) -> Result<()> {
    let cfg = Config::new(&cli.common, None, args::LAT)?;
    if cli.raw && cfg.events {
        return Err("--raw polls the CQ; it cannot be combined with -e".into());
    }
    let max = cfg.max_size() as usize;
    let spec = QpSpec {
        send_wr: cfg.tx_depth,
        recv_wr: 1,
    };
    let mut res = Resources::open(&cfg, spec)?;
    let rights = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let mut inbox = res.pd.alloc_shared(max, rights)?;
    let mut src = Some(res.pd.alloc(max, AccessFlags::LOCAL_WRITE)?);
    let (mut peer, local, remote) = perf::handshake(
        &cfg,
        &mut res,
        Test::WriteLat,
        inbox.remote(),
        rights,
        false,
    )?;
    let target = perf::check_remote(&remote, max as u64, 1)?;
    report::banner(Test::WriteLat, &cfg, &res, &local, &remote, &[]);
    report::lat_header();

    let server = cfg.is_server();
    // The send queue's posting handle (the queue pair is connected); the
    // raw loop posts around it.
    let mut sq = res.qp.send_queue()?;
    let mut done = Done::with_capacity(4);
    let mut stamps: Vec<u64> = Vec::with_capacity(cfg.iters as usize);
    let mut samples: Vec<f64> = Vec::with_capacity(cfg.iters as usize);
    for &size in &cfg.sizes {
        let last = size as usize - 1;
        // The peer writes this size only after the barrier.
        inbox.copy_from_slice(last, &[0])?;
        let (mut head, tail) = src
            .take()
            .ok_or("source buffer lost")?
            .split_at(size as usize);
        let remote = target.slice(0, size).ok_or("remote range")?;
        let inline = size <= u64::from(cfg.inline);
        stamps.clear();
        peer.barrier(cfg.timeout)?;
        let base = perf::Clock::start();
        if cli.raw {
            let lap = Lap {
                cfg: &cfg,
                inbox: &inbox,
                remote,
                inline,
                server,
                base,
            };
            raw_loop(&res, &lap, &mut head, &mut stamps)?;
        } else {
            for i in 0..cfg.iters {
                let value = ((i + 1) % 256) as u8;
                if server {
                    wait_byte(&inbox, last, value, &cfg, i)?;
                }
                head[last] = value;
                stamps.push(base.stamp());
                let o = if inline {
                    Wr::id(i).inline()
                } else {
                    Wr::id(i)
                };
                sq.write(head, remote, o)
                    .map_err(|e| format!("posting write {i}: {}", e.error))?;
                if !server {
                    wait_byte(&inbox, last, value, &cfg, i)?;
                }
                // Get the source back from the write's completion.
                head = perf::wait_local(&mut res.waiter, &mut done, "an RDMA write")?;
            }
        }
        base.convert(&mut stamps);
        stats::deltas_us(&stamps, 2.0, &mut samples);
        let summary = stats::summarize(&mut samples).ok_or("no samples")?;
        report::lat_row(size, cfg.iters, &summary);
        src = Some(
            head.unsplit(tail)
                .map_err(|_| "cannot rejoin the source buffer")?,
        );
    }
    println!("{}", report::LINE);
    // Neither side tears down while the other may still be writing.
    peer.barrier(cfg.timeout)?;
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    perf::main_with("write_lat", || run(cli))
}
