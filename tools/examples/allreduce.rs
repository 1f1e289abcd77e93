//! An MPI-style ring all-reduce (sum) of f32 vectors over RC.
//!
//! ```text
//! allreduce --rank R --ranks N --hosts H0,H1,… [-d DEV] [-g GIDX] [-p BASE_PORT] [-s FLOATS] [-n ITERS] [--wait]
//! ```
//! Rank `R` listens on `BASE_PORT + R` of `H{R}`; [`Ranks::connect_ring`]
//! connects each rank to its left and right neighbours (one queue pair
//! each, the same one when N = 2), each queue pair the one of a
//! [`WriteChannel`], and hands each rank its neighbours' private bytes:
//! the [`RemoteMemory`] of their channel's inbox.
//!
//! The vector is cut into N chunks of `ceil(FLOATS / N)` floats (the last
//! one padded with zeros, which add nothing). Reduce-scatter: in step
//! `s` (0 ≤ s < N−1) rank `r` writes chunk `r − s` to its right neighbour
//! and adds chunk `r − s − 1`, received from its left one, into its own;
//! afterwards it holds chunk `r + 1` summed over all ranks. All-gather:
//! N−1 more steps pass the summed chunks around, received chunks replace
//! the rank's own. Every step is one RDMA write with immediate data into
//! the next of the right neighbour's two inbox slots; the channel does
//! the credits (a slot is written again only after its reader copied it
//! out and dropped its [`Received`] guard), the sequence check and the
//! completions, spinning or (`--wait`) sleeping on a completion channel.
//!
//! Values are small integers (`(31 i + 17 r + 7 iteration) mod 1024`),
//! so every sum is exact in f32 and checked for equality after every
//! iteration. Prints the median time of an iteration, the algorithm
//! bandwidth (bytes / time) and the bus bandwidth (algbw · 2(N−1)/N), as
//! NCCL's tests define them, and a final `VERIFIED` line; exits non-zero
//! on any mismatch or error.

use std::net::{SocketAddr, ToSocketAddrs};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use rdma_verbs::bytemuck::cast_slice;
use rdma_verbs::{device::GidIndex, AccessFlags, ConnectOptions, LocalPort, RemoteMemory};
use rdma_verbs_runtime::{Ranks, Received, WriteChannel};
use rdma_verbs_tools::perf::{main_with, stats, Result};

/// Inbox slots per channel: a writer may be two steps ahead.
const SLOTS: u32 = 2;

/// One step: writes chunk `send` of the vector `v` to the right
/// neighbour's channel, then adds (`add`) or copies the chunk arriving
/// from the left one into chunk `send − 1` (through `inc`). `chans` are
/// this rank's channels by peer rank, `(l, r)` the neighbours' indices
/// (the same channel when N = 2).
fn step(
    chans: &mut [(usize, WriteChannel)],
    (l, r): (usize, usize),
    v: &mut [f32],
    inc: &mut [f32],
    send: usize,
    add: bool,
    t: Option<Duration>,
) -> Result<()> {
    let (len, n) = (inc.len(), v.len() / inc.len());
    chans[r].1.send(cast_slice(&v[send * len..][..len]), t)?;
    let got: Received = chans[l].1.recv(t)?.ok_or("no chunk came")?;
    got.read_into(0, inc)?;
    drop(got); // copied out: only now its credit goes back to the writer
    let recv = (send + n - 1) % n;
    for (m, x) in v[recv * len..][..len].iter_mut().zip(inc.iter()) {
        *m = if add { *m + x } else { *x };
    }
    Ok(())
}

fn run(cli: Cli) -> Result<()> {
    let (addrs, n, r, t) = (cli.addrs()?, cli.ranks, cli.rank, Some(cli.timeout()));
    let list = rdma_verbs::devices()?;
    let dev = cli.device.as_ref().map_or(list.get(0), |d| list.find(d));
    let ctx = dev.ok_or("no such RDMA device")?.open()?;
    let port = ctx.active_port()?;
    let gid = cli
        .gid
        .map_or_else(|| ctx.default_gid_index(port), |g| Ok(GidIndex(g)))?;
    let local = LocalPort::query(&ctx, port, Some(gid))?;
    let opts = ConnectOptions::new(port)
        .local_port(&local)
        .remote_access(AccessFlags::REMOTE_WRITE);
    let (pd, len) = (ctx.alloc_pd()?, cli.floats.div_ceil(n).max(1));
    let mut chans = Vec::new();
    let mut mesh =
        Ranks::new(&addrs, r)
            .timeout(cli.timeout())
            .connect_ring(&local, &opts, |peer| {
                let ch = WriteChannel::create(&pd, SLOTS, len * 4)?.blocking(cli.wait);
                let made = (ch.queue_pair().clone(), ch.inbox().to_bytes().to_vec());
                chans.push((peer, ch));
                Ok(made)
            })?;
    for (peer, ch) in &mut chans {
        let info = mesh.peer(*peer).ok_or("a peer without a queue pair")?;
        ch.start(RemoteMemory::from_bytes(info.private())?)?;
    }
    mesh.barrier(cli.timeout())?; // every rank's receives are posted
    let at = |x| chans.iter().position(|c| c.0 == x).ok_or("no neighbour");
    let lr = (at((r + n - 1) % n)?, at((r + 1) % n)?);
    let (mut v, mut inc) = (vec![0.0; n * len], vec![0.0; len]);
    let mut times = Vec::with_capacity(cli.iters);
    for it in 0..cli.iters {
        // Small integers (0 in the padding): every sum is exact in f32.
        let value = |q: usize, i: usize| match i < cli.floats {
            true => ((31 * i + 17 * q + 7 * it) % 1024) as f32,
            false => 0.0,
        };
        v.iter_mut().enumerate().for_each(|(i, x)| *x = value(r, i));
        let start = Instant::now();
        // Reduce-scatter (adding), then all-gather: step s sends chunk r − s.
        for s in 0..2 * (n - 1) {
            step(
                &mut chans,
                lr,
                &mut v,
                &mut inc,
                (r + 2 * n - s) % n,
                s < n - 1,
                t,
            )?;
        }
        times.push(start.elapsed().as_secs_f64());
        for (i, x) in v.iter().enumerate() {
            let sum: f32 = (0..n).map(|q| value(q, i)).sum();
            if *x != sum {
                return Err(format!("iteration {it}: element {i} is {x}, not {sum}").into());
            }
        }
    }
    times.sort_by(f64::total_cmp);
    let t_med = stats::median(&times).ok_or("no iterations")?;
    let algbw = (cli.floats * 4) as f64 / t_med / 1e9;
    let busbw = algbw * 2.0 * (n - 1) as f64 / n as f64;
    let (s, i, us) = (cli.floats, cli.iters, t_med * 1e6);
    println!("rank {r} of {n}: {s} floats, {i} iterations, median {us:.1} us");
    println!("algbw {algbw:.3} GB/s  busbw {busbw:.3} GB/s");
    // Every write and credit acknowledged (so delivered), then no rank
    // leaves before its neighbours are done with it.
    for (_, ch) in &mut chans {
        ch.flush(t)?;
    }
    mesh.barrier(cli.timeout())?;
    println!("VERIFIED: every element of {i} iterations is the exact sum");
    Ok(())
}

// ---------------------------------------------------------------------------
// Argument parsing.
// ---------------------------------------------------------------------------

/// Ring all-reduce (sum) of f32 vectors over RDMA write with immediate.
#[derive(Parser, Debug)]
#[command(name = "allreduce")]
struct Cli {
    /// This process's rank, 0 ≤ R < N.
    #[arg(long)]
    rank: usize,
    /// The number of ranks N (at least 2).
    #[arg(long)]
    ranks: usize,
    /// The ranks' hosts, H0,H1,… (rank R listens on BASE_PORT + R of HR).
    #[arg(long, value_delimiter = ',', required = true)]
    hosts: Vec<String>,
    /// RDMA device (default: the first one found).
    #[arg(short = 'd', long = "ib-dev")]
    device: Option<String>,
    /// GID index (default: on RoCE the port's RoCE v2 GID with a non-link-local IPv4 address, else its first valid GID; 0 on InfiniBand).
    #[arg(short = 'g', long = "gid-index")]
    gid: Option<u8>,
    /// TCP port of rank 0; rank R listens on BASE_PORT + R.
    #[arg(short = 'p', long = "port", default_value_t = 18600)]
    base_port: u16,
    /// Floats in the vector.
    #[arg(short = 's', long = "size", default_value_t = 1 << 20)]
    floats: usize,
    /// Iterations (the median time is reported).
    #[arg(short = 'n', long = "iters", default_value_t = 20)]
    iters: usize,
    /// Longest wait, in seconds, for connecting and for each step.
    #[arg(long = "timeout", default_value_t = 30.0)]
    timeout_secs: f64,
    /// Sleep on a completion channel while waiting instead of spinning
    /// (for more ranks than cores).
    #[arg(long)]
    wait: bool,
}

impl Cli {
    /// Each rank's address: its host and BASE_PORT + rank.
    fn addrs(&self) -> Result<Vec<SocketAddr>> {
        if self.ranks < 2 || self.iters == 0 {
            return Err("need --ranks 2 or more and --iters 1 or more".into());
        }
        if self.hosts.len() != self.ranks || self.rank >= self.ranks {
            return Err(format!(
                "--hosts names {} hosts and --rank is {}: need --ranks {} hosts and a rank below",
                self.hosts.len(),
                self.rank,
                self.ranks
            )
            .into());
        }
        self.hosts
            .iter()
            .enumerate()
            .map(|(r, h)| {
                let port = u16::try_from(usize::from(self.base_port) + r)?;
                let addr = (h.as_str(), port).to_socket_addrs()?.next();
                Ok(addr.ok_or_else(|| format!("{h} has no address"))?)
            })
            .collect()
    }

    fn timeout(&self) -> Duration {
        Duration::from_secs_f64(self.timeout_secs)
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    main_with("allreduce", || run(cli))
}
