//! What each queue pair costs as their number grows: resident memory and
//! the time to create and connect them (issue #19).
//!
//! ```text
//! cargo run --release --example qp_scale -- [--device rxe0] [--port 1] [--gid-index N]
//!     [--qps 1024] [--depth 16]
//! ```
//! Creates `--qps` RC queue pairs, `--depth` deep both ways with one SGE,
//! on as few CQs as the device allows (one if `max_cqe` holds every
//! queue), and connects them in loopback pairs (2k with 2k+1). The port and
//! GID are queried once (a `LocalPort`), as a C program does. Prints the
//! resident memory the queue pairs added, per queue pair, and the time
//! creating and connecting took. `examples/c/qp_scale.c` is the same
//! program on libibverbs, with the same output. `--per-qp-queries` uses
//! `Endpoint::local` and `ConnectOptions::new` instead, which query the
//! port and GID for every queue pair.

use std::process::ExitCode;
use std::time::Instant;

use ibverbs::{ConnectOptions, Endpoint, GidIndex, LocalPort, PortNumber, QpType};

struct Args {
    device: Option<String>,
    port: Option<u8>,
    gid_index: Option<u8>,
    qps: u32,
    depth: u32,
    per_qp_queries: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        device: None,
        port: None,
        gid_index: None,
        qps: 1024,
        depth: 16,
        per_qp_queries: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        let number = |v: String| v.parse::<u32>().map_err(|e| format!("{flag}: {e}"));
        match flag.as_str() {
            "-d" | "--device" => args.device = Some(value()?),
            "-i" | "--port" => args.port = Some(number(value()?)? as u8),
            "-g" | "--gid-index" => args.gid_index = Some(number(value()?)? as u8),
            "-n" | "--qps" => args.qps = number(value()?)?.max(2) & !1,
            "-w" | "--depth" => args.depth = number(value()?)?.max(1),
            "--per-qp-queries" => args.per_qp_queries = true,
            "-h" | "--help" => {
                return Err(
                    "usage: qp_scale [--device NAME] [--port N] [--gid-index N] \
                            [--qps N] [--depth N] [--per-qp-queries]"
                        .into(),
                )
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(args)
}

/// Resident set size in bytes (`VmRSS` of /proc/self/status).
fn rss() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

fn run(args: Args) -> ibverbs::Result<()> {
    let list = ibverbs::devices()?;
    let dev = match &args.device {
        Some(name) => list
            .find(name)
            .ok_or_else(|| ibverbs::Error::NoDevice(format!(" named {name:?}")))?,
        None => list
            .get(0)
            .ok_or_else(|| ibverbs::Error::NoDevice(String::new()))?,
    };
    let ctx = dev.open()?;
    let port = match args.port {
        Some(p) => PortNumber(p),
        None => ctx.active_port()?,
    };
    let gid_index = args.gid_index.map(GidIndex);
    let local = LocalPort::query(&ctx, port, gid_index)?;
    let opts = if args.per_qp_queries {
        match gid_index {
            Some(g) => ConnectOptions::new(port).gid_index(g),
            None => ConnectOptions::new(port),
        }
    } else {
        ConnectOptions::new(port).local_port(&local)
    };
    let endpoint = |qp, psn| {
        if args.per_qp_queries {
            Endpoint::local(qp, port, gid_index, psn)
        } else {
            local.endpoint(qp, psn)
        }
    };
    let pd = ctx.alloc_pd()?;
    // One CQ holds every queue if the device allows; else as few as do.
    let max_cqe = ctx.query_device()?.max_cqe().max(1);
    let per_qp = 2 * args.depth;
    let qps_per_cq = (max_cqe / per_qp).max(1);
    let ncq = args.qps.div_ceil(qps_per_cq);
    let cqs = (0..ncq)
        .map(|i| {
            let n = qps_per_cq.min(args.qps - i * qps_per_cq);
            ctx.create_cq(n * per_qp).build()
        })
        .collect::<ibverbs::Result<Vec<_>>>()?;

    let before = rss();
    let start = Instant::now();
    let qps = (0..args.qps)
        .map(|i| {
            let cq = &cqs[(i / qps_per_cq) as usize];
            pd.create_qp(QpType::Rc, cq, cq)
                .max_send_wr(args.depth)
                .max_recv_wr(args.depth)
                .build()
        })
        .collect::<ibverbs::Result<Vec<_>>>()?;
    let created = start.elapsed();
    for pair in qps.chunks_exact(2) {
        let (a, b) = (&pair[0], &pair[1]);
        let ea = endpoint(a, 0x1000)?;
        let eb = endpoint(b, 0x2000)?;
        a.connect(ea.psn, &eb, &opts)?;
        b.connect(eb.psn, &ea, &opts)?;
    }
    let total = start.elapsed();
    let added = rss().saturating_sub(before);
    println!(
        "qps {} depth {} cqs {ncq} rss_per_qp_bytes {} create_ms {:.1} connect_ms {:.1} total_ms {:.1}",
        args.qps,
        args.depth,
        added / u64::from(args.qps),
        created.as_secs_f64() * 1e3,
        (total - created).as_secs_f64() * 1e3,
        total.as_secs_f64() * 1e3,
    );
    drop(qps);
    Ok(())
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("qp_scale: {e}");
            ExitCode::FAILURE
        }
    }
}
