//! RDMA write bandwidth, like perftest's `ib_write_bw`.
//!
//! ```text
//! write_bw [options]            # server: offers a remote-writable buffer
//! write_bw [options] <host>     # client: streams RDMA writes into it
//! ```
//! The client keeps `-t` writes outstanding, posts them in lists of `-l`,
//! signals every `-Q`-th, and prints peak and average bandwidth and the
//! message rate per size (`-s`, or `-a` for 2 B … `--max-size`); the server
//! prints the client's results. Both sides need the same `-n`/`-s`/`-a`.
//!
//! The source is one registered buffer, frozen per size (a `FrozenBuffer`
//! may ride on any number of outstanding and unsignaled writes); messages
//! up to `-I` bytes go inline.

use std::process::ExitCode;

use clap::Parser;
use rdma_verbs::{memory::FrozenBuffer, AccessFlags, Completion, RemoteMemory, SendRequest};

use rdma_verbs_tools::{perf, Done};

use perf::args::{self, BwArgs, CommonArgs, Config};
use perf::stream::{self, Params, Source, Timing};
use perf::{report, QpSpec, Resources, Result, Table, Test};

/// RDMA write bandwidth test (perftest's ib_write_bw).
#[derive(Parser, Debug)]
#[command(name = "write_bw")]
struct Cli {
    #[command(flatten)]
    common: CommonArgs,
    #[command(flatten)]
    bw: BwArgs,
}

struct Writes<'a> {
    buf: &'a FrozenBuffer,
    remote: RemoteMemory,
    inline: bool,
}

impl<'a> Source<'a> for Writes<'a> {
    fn request(&mut self, _index: u64) -> Result<SendRequest<'a>> {
        Ok(if self.inline {
            SendRequest::write_inline(self.buf, self.remote)
        } else {
            SendRequest::write(self.buf.clone(), self.remote)
        })
    }
    fn completed(&mut self, _c: &mut Completion) -> Result<()> {
        Ok(())
    }
}

fn run(cli: Cli) -> Result<()> {
    let cfg = Config::new(&cli.common, Some(&cli.bw), args::BW)?;
    let max = cfg.max_size();
    let spec = QpSpec {
        send_wr: cfg.tx_depth,
        recv_wr: 1,
    };
    let mut res = Resources::open(&cfg, spec)?;
    let rights = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;

    if cfg.is_server() {
        let target = res.pd.alloc_shared(max as usize, rights)?;
        let (mut peer, local, remote) = perf::handshake(
            &cfg,
            &mut res,
            Test::WriteBw,
            target.remote(),
            rights,
            false,
        )?;
        report::banner(Test::WriteBw, &cfg, &res, &local, &remote, &[]);
        perf::serve_passive(&cfg, &mut peer, Table::Bw)?;
        drop(target);
        return Ok(());
    }

    let mut src = res.pd.alloc(max as usize, AccessFlags::LOCAL_WRITE)?;
    for (i, b) in src.iter_mut().enumerate() {
        *b = i as u8;
    }
    let mut src = Some(src);
    let (mut peer, local, remote) = perf::handshake(
        &cfg,
        &mut res,
        Test::WriteBw,
        None,
        AccessFlags::LOCAL_WRITE,
        false,
    )?;
    let target = perf::check_remote(&remote, max, 1)?;
    let extra = [
        ("CQ Moderation", cfg.cq_mod.to_string()),
        ("Post List", cfg.post_list.to_string()),
    ];
    report::banner(Test::WriteBw, &cfg, &res, &local, &remote, &extra);
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
        let mut writes = Writes {
            buf: &frozen,
            remote: target.slice(0, size).ok_or("remote range")?,
            inline: size <= u64::from(cfg.inline),
        };
        peer.barrier(cfg.timeout)?;
        stream::run(
            &mut sq,
            &mut res.waiter,
            &mut done,
            p,
            &mut writes,
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
            .map_err(|_| "a completed write still holds the source buffer")?;
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
    perf::main_with("write_bw", || run(cli))
}
