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

use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;
use ibverbs::{AccessFlags, Completions, SendRequest, SharedBuffer};

#[path = "perf/mod.rs"]
mod perf;

use perf::args::{self, CommonArgs, Config};
use perf::{ns_since, report, stats, QpSpec, Resources, Result, Test};

/// RDMA write latency test (perftest's ib_write_lat).
#[derive(Parser, Debug)]
#[command(name = "write_lat")]
struct Cli {
    #[command(flatten)]
    common: CommonArgs,
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
        std::hint::spin_loop();
    }
}

fn run(cli: Cli) -> Result<()> {
    let cfg = Config::new(&cli.common, None, args::LAT)?;
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
    let mut done = Completions::with_capacity(4);
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
        let base = Instant::now();
        for i in 0..cfg.iters {
            let value = ((i + 1) % 256) as u8;
            if server {
                wait_byte(&inbox, last, value, &cfg, i)?;
            }
            head[last] = value;
            stamps.push(ns_since(base));
            res.qp
                .post_send(SendRequest::write(head, remote).inline(inline).wr_id(i))
                .map_err(|e| format!("posting write {i}: {}", e.error))?;
            if !server {
                wait_byte(&inbox, last, value, &cfg, i)?;
            }
            // Get the source back from the write's completion.
            head = perf::wait_local(&mut res.waiter, &mut done, "an RDMA write")?;
        }
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
