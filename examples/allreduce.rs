//! An MPI-style ring all-reduce (sum) of f32 vectors over RC.
//!
//! ```text
//! allreduce --rank R --ranks N --hosts H0,H1,… [-d DEV] [-g GIDX] [-p BASE_PORT] [-s FLOATS] [-n ITERS]
//! ```
//! Rank `R` listens on `BASE_PORT + R` of `H{R}`; [`Ranks::connect_ring`]
//! connects each rank to its left and right neighbours (one queue pair
//! each, the same one when N = 2) and hands each its neighbours' private
//! bytes: the [`RemoteMemory`] of their receive slots.
//!
//! The vector is cut into N chunks of `ceil(FLOATS / N)` floats (the last
//! one padded with zeros, which add nothing). Reduce-scatter: in step
//! `s` (0 ≤ s < N−1) rank `r` writes chunk `r − s` to its right neighbour
//! and adds chunk `r − s − 1`, received from its left one, into its own;
//! afterwards it holds chunk `r + 1` summed over all ranks. All-gather:
//! N−1 more steps pass the summed chunks around, received chunks replace
//! the rank's own. Every step is one RDMA write with immediate data (the
//! global step number, checked against the expected one) straight from the
//! rank's registered vector into one of the right neighbour's two receive
//! slots (`step % 2`), a [`SharedBuffer`] read with volatile copies
//! ([`SharedBuffer::read_into`]): a peer writes it, so no `&[f32]` to it
//! may exist.
//!
//! **Credits: why a writer never overwrites unread data.** A rank starts
//! with 2 credits, one per slot of its right neighbour, spends one per
//! write, and gets one back per zero-length send from that neighbour,
//! which sends it only after copying a step's slot out. The neighbour
//! consumes steps in order and RC delivers in order, so after `c` credits
//! came back, steps `0..c` are consumed; writing step `g` needs a credit,
//! `g < 2 + c`, so step `g − 2` — the last one that used slot `g % 2` —
//! was consumed before step `g` lands there. (Each receive side posts
//! more receives than can be outstanding: at most 2 data writes and 2
//! credits are ever unconsumed.)
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
use ibverbs::{
    AccessFlags, CompletionQueue, Completions, ConnectOptions, GidIndex, LocalBuffer, LocalPort,
    Mesh, QpType, Ranks, RecvRequest, RemoteMemory, SendRequest, SharedBuffer, WcOpcode,
};
use ibverbs_suite::perf::{main_with, stats, Result};

/// Receive slots per rank (credits a writer starts with).
const SLOTS: usize = 2;
/// Receives posted per queue pair and role, more than can be unconsumed.
const RECVS: u32 = 4;
/// Send queue depth of each queue pair, and the sends kept outstanding.
const SQ: u32 = 16;
/// `wr_id` of a credit send (writes carry their chunk index).
const CREDIT: u64 = u64::MAX;

/// One rank's state: its vector in chunks, the neighbours, the credits.
struct Ring {
    mesh: Mesh,
    cq: CompletionQueue,
    done: Completions,
    /// The chunks of this rank's vector; `None` while a write carries one.
    chunks: Vec<Option<LocalBuffer>>,
    /// The two slots the left neighbour writes.
    slots: SharedBuffer,
    /// The right neighbour's slots.
    right: RemoteMemory,
    /// Floats per chunk.
    len: usize,
    /// The left neighbour's chunk, copied out of its slot.
    incoming: Vec<f32>,
    credits: usize,
    /// Data writes arrived from the left neighbour (the next one's step).
    arrived: u64,
    /// Sends (writes and credits) not completed yet.
    sends: u32,
    timeout: Duration,
}

impl Ring {
    /// Claims the completions there are.
    fn pump(&mut self) -> Result<()> {
        self.cq.poll(&mut self.done)?;
        for mut c in self.done.drain() {
            c.result()?;
            let (left, right) = (self.mesh.left().unwrap(), self.mesh.right().unwrap());
            match c.opcode() {
                WcOpcode::RdmaWrite | WcOpcode::Send => self.sends -= 1,
                // In order (RC): the immediate names the step.
                WcOpcode::RecvRdmaWithImm if c.imm_data() == Some(self.arrived as u32) => {
                    self.arrived += 1;
                    left.qp().post_recv(RecvRequest::empty())?;
                }
                WcOpcode::Recv => {
                    self.credits += 1;
                    right.qp().post_recv(RecvRequest::empty())?;
                }
                op => {
                    return Err(
                        format!("{op:?} with {:?} at {}", c.imm_data(), self.arrived).into(),
                    )
                }
            }
            if let Some(chunk) = c.take_local() {
                self.chunks[c.wr_id() as usize] = Some(chunk); // a write's: home again
            }
        }
        Ok(())
    }

    /// Claims completions until `ready`, or fails after the timeout.
    fn until(&mut self, what: &str, ready: impl Fn(&Ring) -> bool) -> Result<()> {
        let start = Instant::now();
        while !ready(self) {
            if start.elapsed() > self.timeout {
                return Err(format!("timed out waiting for {what}").into());
            }
            self.pump()?;
        }
        Ok(())
    }

    /// Step `g` (global): writes chunk `send` to the right neighbour, then
    /// adds (`add`) or copies the chunk arriving from the left into `recv`.
    fn step(&mut self, g: u64, send: usize, recv: usize, add: bool) -> Result<()> {
        let (bytes, slot) = (self.len * 4, g as usize % SLOTS);
        self.until("a credit", |r| {
            r.credits > 0 && r.sends < SQ && r.chunks[send].is_some()
        })?;
        let buf = self.chunks[send].take().unwrap();
        let to = self
            .right
            .slice((slot * bytes) as u64, bytes as u64)
            .unwrap();
        let qp = self.mesh.right().unwrap().qp();
        qp.post_send(SendRequest::write(buf, to).imm(g as u32).wr_id(send as u64))?;
        (self.credits, self.sends) = (self.credits - 1, self.sends + 1);
        self.until("a chunk", |r| r.arrived > g && r.chunks[recv].is_some())?;
        self.slots.read_into(slot * bytes, &mut self.incoming)?;
        // The slot is copied out: hand its credit back to the writer.
        self.until("send room", |r| r.sends < SQ)?;
        let left = self.mesh.left().unwrap().qp();
        left.post_send(SendRequest::send_inline(&[]).wr_id(CREDIT))?;
        self.sends += 1;
        let mine = self.chunks[recv]
            .as_mut()
            .unwrap()
            .as_mut_slice_of::<f32>()?;
        for (m, x) in mine.iter_mut().zip(&self.incoming) {
            *m = if add { *m + x } else { *x };
        }
        Ok(())
    }

    /// One all-reduce of the vector, from step `base` on.
    fn allreduce(&mut self, base: u64) -> Result<()> {
        let (r, n) = (self.mesh.rank(), self.mesh.ranks());
        for s in 0..n - 1 {
            let g = base + s as u64;
            self.step(g, (r + n - s) % n, (r + 2 * n - s - 1) % n, true)?;
        }
        for s in 0..n - 1 {
            let g = base + (n - 1 + s) as u64;
            self.step(g, (r + 1 + n - s) % n, (r + n - s) % n, false)?;
        }
        self.until("the last write", |r| r.chunks.iter().all(Option::is_some))
    }

    /// Fills this rank's vector of `floats` floats for iteration `it`
    /// (`fill`), or checks that it holds the sum over all ranks.
    fn each(&mut self, floats: usize, it: usize, fill: bool) -> Result<()> {
        let (r, n) = (self.mesh.rank(), self.mesh.ranks());
        // Small integers (0 in the padding): every sum is exact in f32.
        let value = |q: usize, i: usize| match i < floats {
            true => ((31 * i + 17 * q + 7 * it) % 1024) as f32,
            false => 0.0,
        };
        for (c, chunk) in self.chunks.iter_mut().enumerate() {
            for (k, x) in chunk
                .as_mut()
                .unwrap()
                .as_mut_slice_of::<f32>()?
                .iter_mut()
                .enumerate()
            {
                let (i, sum) = (
                    c * self.len + k,
                    (0..n).map(|q| value(q, c * self.len + k)).sum(),
                );
                if fill {
                    *x = value(r, i);
                } else if *x != sum {
                    return Err(format!("iteration {it}: element {i} is {x}, not {sum}").into());
                }
            }
        }
        Ok(())
    }
}

fn run(cli: Cli) -> Result<()> {
    let (addrs, n) = (cli.addrs()?, cli.ranks);
    let list = ibverbs::devices()?;
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
    let cq = ctx.create_cq(2 * (SQ + 2 * RECVS)).build()?;
    let rights = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let slots = pd.alloc_shared(SLOTS * len * 4, rights)?;
    let mine = slots.remote().ok_or("no remote key")?.to_bytes().to_vec();
    let mesh = Ranks::new(&addrs, cli.rank)
        .timeout(cli.timeout())
        .connect_ring(&local, &opts, |_| {
            let qp = pd.create_qp(QpType::Rc, &cq, &cq);
            let qp = qp.max_send_wr(SQ).max_recv_wr(2 * RECVS);
            Ok((qp.build()?, mine.clone()))
        })?;
    let right = RemoteMemory::from_bytes(mesh.right().ok_or("one rank alone")?.private())?;
    let right = right
        .slice(0, (SLOTS * len * 4) as u64)
        .ok_or("peer's slots too small")?;
    for _ in 0..RECVS {
        mesh.left().unwrap().qp().post_recv(RecvRequest::empty())?;
        mesh.right().unwrap().qp().post_recv(RecvRequest::empty())?;
    }
    let (chunks, _) = pd
        .alloc(n * len * 4, AccessFlags::LOCAL_WRITE)?
        .chunks_exact(len * 4);
    let mut ring = Ring {
        mesh,
        cq,
        done: Completions::with_capacity(32),
        chunks: chunks.into_iter().map(Some).collect(),
        slots,
        right,
        len,
        incoming: vec![0.0; len],
        credits: SLOTS,
        arrived: 0,
        sends: 0,
        timeout: cli.timeout(),
    };
    ring.mesh.barrier(cli.timeout())?; // every rank's receives are posted
    let mut times = Vec::with_capacity(cli.iters);
    for it in 0..cli.iters {
        ring.each(cli.floats, it, true)?;
        let start = Instant::now();
        ring.allreduce((it * 2 * (n - 1)) as u64)?;
        times.push(start.elapsed().as_secs_f64());
        ring.each(cli.floats, it, false)?;
    }
    times.sort_by(f64::total_cmp);
    let t = stats::median(&times).ok_or("no iterations")?;
    let algbw = (cli.floats * 4) as f64 / t / 1e9;
    let busbw = algbw * 2.0 * (n - 1) as f64 / n as f64;
    let (r, s, i, us) = (cli.rank, cli.floats, cli.iters, t * 1e6);
    println!("rank {r} of {n}: {s} floats, {i} iterations, median {us:.1} us");
    println!("algbw {algbw:.3} GB/s  busbw {busbw:.3} GB/s");
    // Every send acknowledged (so delivered), then no rank leaves before
    // its neighbours are done with it.
    ring.until("the last sends", |r| r.sends == 0)?;
    ring.mesh.barrier(cli.timeout())?;
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
    /// GID index (default: the port's IPv4 RoCE v2 GID on Ethernet).
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
