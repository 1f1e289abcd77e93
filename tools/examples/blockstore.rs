//! A storage-style block service: one-sided RDMA READ and WRITE of 4 KiB
//! blocks over RC.
//!
//! ```text
//! blockstore server [-d DEV] [-i PORT] [-g GIDX] [-p TCP_PORT] [--blocks N] [--clients K]
//! blockstore client HOST [same flags] [-q DEPTH] [-n OPS] [--write-ratio R]
//! ```
//! Every block holds its index, a generation and a checksum in its first
//! three 64-bit words (little-endian), the rest a pattern derived from
//! index and generation ([`block`]); a block checks out when all 4096
//! bytes are exactly what its index and generation give.
//!
//! **The store.** The first `N − K·W` blocks (`W = N / 2K`) are
//! read-only: one registration with `REMOTE_READ` only (no peer can write
//! it, so Rust may read it as `&[u64]`), whose key every client gets in
//! the exchange. The other blocks are K *ranges* of W blocks, each a
//! registration of its own, a [`SharedBuffer`] (peers write it: Rust only
//! makes volatile copies, never a reference into it) with `MW_BIND` and
//! no remote rights of its own. A client connects over TCP
//! ([`Endpoint::exchange`], one RC queue pair each), borrows a free range
//! and gets a **type 2 memory window** over it with `REMOTE_READ` and
//! `REMOTE_WRITE`. The device enforces both limits: a type 2 window's key
//! works only on the queue pair it was bound through, so no other client
//! can use it even if it learnt it; and accesses are checked against the
//! bounds of the window's region. One registration per range, not one
//! window per range of one big registration, because rxe (Linux 6.12)
//! checks an access through a window against its *region's* bounds only:
//! the device test caught a write through a window landing in the block
//! before the window. Any other access fails on the device with a remote
//! access error, which ends that client's queue pair only. When a client
//! leaves (finished or not), its queue pair goes to ERR and its window is
//! deallocated, and its range goes to the next client. Once K clients
//! finished, every queue pair still open goes to ERR and the server checks
//! every block (any generation, exact content) and prints `VERIFIED`.
//!
//! **No torn reads.** RDMA gives no atomicity across a 4 KiB block: a read
//! racing a write of the same block may return half of each. So clients
//! only read blocks nobody writes concurrently: the read-only blocks
//! (random reads: generation 0) and their own range, where they never keep
//! two requests on one block in flight. The `sweep` reads every block the
//! client can verify exactly: the read-only ones and its own range (other
//! clients' ranges are not readable by it; the server verifies them).
//!
//! **Client phases** at queue depth DEPTH (buffers from one registered
//! [`BufferPool`], requests tracked by a [`RequestTable`], completions
//! busy-polled, as perftest measures): `random` (OPS reads of read-only
//! blocks), `mixed` (OPS operations on its own range, a fraction R of them
//! writes of a new random generation; reads must show the generation the
//! client last wrote there, or any valid one for a block it has not
//! written yet), `sweep`. One line per phase
//! (`NAME: ops N depth D IOPS x MiB/s x p50 x us p99 x us`), then
//! `VERIFIED`; a mismatch or an error completion exits non-zero.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::ExitCode;
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use clap::{Args, Parser, Subcommand};
use rdma_verbs::{
    device::GidIndex,
    memory::{BufferPool, MwType},
    AccessFlags, Completion, Completions, ConnectOptions, Context, Endpoint, LocalPort, PortNumber,
    ProtectionDomain, QpType, QueuePair, RemoteMemory, SendQueue, SendRequest, SharedBuffer,
};
use rdma_verbs_runtime::{Reaped, RequestTable};
use rdma_verbs_tools::perf::{main_with, stats, Result};

/// Bytes per block.
const BLOCK: usize = 4096;
/// RDMA reads in flight per queue pair, both ways.
const RD_ATOMIC: u8 = 16;

/// Splitmix64's finaliser: the pattern's and the random numbers' mixer.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Word `k` of the pattern of the block whose seed is `seed`: one multiply
/// a word (verification must not cost more than the I/O it checks; the seed
/// already differs per block and generation).
fn word(seed: u64, k: usize) -> u64 {
    seed ^ (k as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// The checksum's step (FNV-1a's multiply over words).
fn sum(h: u64, x: &u64) -> u64 {
    (h ^ x).wrapping_mul(0x100_0000_01b3)
}

/// Block `index` at generation `gen`: index, generation, checksum (of
/// everything else), then the pattern.
fn block(index: u64, gen: u64) -> [u64; BLOCK / 8] {
    let mut w = [0u64; BLOCK / 8];
    let seed = mix(index ^ mix(gen));
    (w[0], w[1]) = (index, gen);
    for (k, x) in w.iter_mut().enumerate().skip(3) {
        *x = word(seed, k);
    }
    w[2] = w[3..].iter().fold(sum(index, &gen), sum);
    w
}

/// Checks that `w` is block `index` at generation `want` (any when
/// `None`): every word against the pattern and the checksum, in one pass;
/// returns the generation.
fn check(w: &[u64], index: u64, want: Option<u64>) -> Result<u64> {
    let gen = want.unwrap_or(w[1]);
    let seed = mix(index ^ mix(gen));
    let (mut h, mut same) = (
        sum(index, &gen),
        w.len() == BLOCK / 8 && w[..2] == [index, gen],
    );
    for (k, x) in w.iter().enumerate().skip(3) {
        same &= *x == word(seed, k);
        h = sum(h, x);
    }
    if !same || w[2] != h {
        let (i, g, want) = (w[0], w[1], want.map_or("any".into(), |g| g.to_string()));
        return Err(format!("MISMATCH: block {index} (header: index {i} generation {g}; expected generation {want})").into());
    }
    Ok(gen)
}

/// Device, port, local port and connect options from the common flags.
fn open(c: &Common) -> Result<(Context, LocalPort, ConnectOptions)> {
    let list = rdma_verbs::devices()?;
    let dev = c.device.as_ref().map_or(list.get(0), |d| list.find(d));
    let ctx = dev.ok_or("no such RDMA device")?.open()?;
    let port = c
        .ib_port
        .map_or_else(|| ctx.active_port(), |p| Ok(PortNumber(p)))?;
    let gid = c
        .gid
        .map_or_else(|| ctx.default_gid_index(port), |g| Ok(GidIndex(g)))?;
    let local = LocalPort::query(&ctx, port, Some(gid))?;
    let opts = ConnectOptions::new(port)
        .local_port(&local)
        .rd_atomic(RD_ATOMIC);
    Ok((ctx, local, opts))
}

/// What every session of the server shares.
struct Server {
    ctx: Context,
    pd: ProtectionDomain,
    local: LocalPort,
    opts: ConnectOptions,
    /// The read key of the read-only blocks, for the exchange.
    private: Vec<u8>,
    /// The ranges, each a registration of its own, and the first one's
    /// block number.
    ranges: Vec<SharedBuffer>,
    first: usize,
    /// Free ranges, lent one per client (waiting while none is free).
    free: (mpsc::Sender<usize>, Mutex<mpsc::Receiver<usize>>),
    /// Every queue pair made, to end them all before the final check.
    live: Mutex<Vec<QueuePair>>,
    timeout: Duration,
}

impl Server {
    /// One client: connect, lend a range through a window, wait for its
    /// `D`one; revoke. `Ok(true)` if it finished.
    fn session(&self, mut tcp: TcpStream) -> Result<bool> {
        let channel = self.ctx.create_comp_channel()?;
        let cq = self.ctx.create_cq(4).channel(&channel).build()?;
        let qp = self
            .pd
            .create_qp(QpType::Rc, &cq, &cq)
            .max_send_wr(2)
            .max_recv_wr(1)
            .build()?;
        self.live.lock().unwrap().push(qp.clone());
        let me = self.local.endpoint(&qp, Endpoint::random_psn())?;
        let peer = rdma_verbs_runtime::exchange(&mut tcp, &me, &self.private, self.timeout)?;
        qp.connect(&me, &peer.endpoint, &self.opts)?;
        let mw = self.pd.alloc_mw(MwType::Type2)?;
        let free = self.free.1.lock().unwrap().recv_timeout(self.timeout);
        let r = free.map_err(|_| "no block range became free")?;
        let result = (|| -> Result<bool> {
            let rights = AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE;
            // The send queue's handle, for the bind (it goes with this closure).
            let mut sq = qp.send_queue()?;
            let grant = sq.bind_mw(&mw, &self.ranges[r], rights, 0)?;
            let mut done = Completions::with_capacity(1);
            cq.wait(&mut done, Some(self.timeout))?
                .next()
                .ok_or("no bind completion")?
                .result()?;
            let block = self.first + r * self.ranges[r].len() / BLOCK;
            tcp.write_all(&[&grant.to_bytes()[..], &(block as u64).to_le_bytes()].concat())?;
            let mut byte = [0u8];
            Ok(matches!(tcp.read(&mut byte), Ok(1) if byte == *b"D"))
        })();
        // The window's key works only on this queue pair (type 2): once it
        // is in ERR nothing reaches the range through it; the window is
        // deallocated when its bind's slot is released too.
        if qp.to_err().is_ok() {
            let _ = self.free.0.send(r);
        }
        drop(mw);
        result
    }
}

fn server(c: Common) -> Result<()> {
    let (ctx, local, opts) = open(&c)?;
    let (n, k) = (c.blocks, c.clients);
    let per = n / (2 * k.max(1));
    if per == 0 {
        return Err("need --clients 1 or more and --blocks at least 2 × clients".into());
    }
    let (pd, first) = (ctx.alloc_pd()?, n - k * per);
    let blocks = |from: usize, count: usize| (from..from + count).flat_map(|b| block(b as u64, 0));
    let bytes: Vec<u64> = blocks(0, first).collect();
    let ro = pd.register(
        rdma_verbs::bytemuck::cast_slice(&bytes).to_vec(),
        AccessFlags::REMOTE_READ,
    )?;
    let key = ro.memory_region().rkey().ok_or("no read key")?;
    let private = RemoteMemory {
        addr: ro.addr(),
        len: ro.len() as u64,
        rkey: key,
    }
    .to_bytes()
    .to_vec();
    let ranges = (0..k).map(|r| {
        let mut range =
            pd.alloc_shared(per * BLOCK, AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND)?;
        range.write_from(0, &blocks(first + r * per, per).collect::<Vec<u64>>())?;
        Ok(range)
    });
    let ranges = ranges.collect::<Result<Vec<_>>>()?;
    let opts = opts.remote_access(AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE);
    let (tx_free, rx_free) = mpsc::channel();
    (0..k).for_each(|r| tx_free.send(r).unwrap());
    let s = Arc::new(Server {
        ctx,
        pd,
        local,
        opts,
        private,
        ranges,
        first,
        free: (tx_free, Mutex::new(rx_free)),
        live: Mutex::new(Vec::new()),
        timeout: c.timeout(),
    });
    let listener = TcpListener::bind(("0.0.0.0", c.tcp_port))?;
    println!(
        "serving {n} blocks: {first} read-only, {k} ranges of {per}, TCP port {}",
        c.tcp_port
    );
    let (tx, rx) = mpsc::channel();
    let s2 = s.clone();
    std::thread::spawn(move || {
        for tcp in listener.incoming().flatten() {
            let (s, tx) = (s2.clone(), tx.clone());
            std::thread::spawn(move || tx.send((tcp.peer_addr().ok(), s.session(tcp))));
        }
    });
    let mut finished = 0;
    while finished < k {
        match rx.recv()? {
            (who, Ok(true)) => {
                finished += 1;
                eprintln!("client {who:?} finished");
            }
            (who, Ok(false)) => eprintln!("client {who:?} left before finishing"),
            (who, Err(e)) => eprintln!("client {who:?} refused: {e}"),
        }
    }
    for qp in s.live.lock().unwrap().iter() {
        let _ = qp.to_err(); // no peer reaches the store any more (RESET ones never did)
    }
    let mut w = ro.as_slice_of::<u64>()?.to_vec(); // nobody writes the read-only blocks
    for range in &s.ranges {
        let at = w.len();
        w.resize(at + range.len() / 8, 0);
        range.read_into(0, &mut w[at..])?; // volatile copies: no reference into a range
    }
    for (b, words) in w.chunks(BLOCK / 8).enumerate() {
        check(words, b as u64, None)?;
    }
    let b = w.len() / (BLOCK / 8);
    println!("VERIFIED: all {b} blocks of the store check out after {k} clients");
    Ok(())
}

/// A request in flight: which block, the generation it should carry, whether
/// it is a write, when it was posted.
struct Op {
    block: u64,
    gen: Option<u64>,
    write: bool,
    start: Instant,
}

struct Client {
    /// The queue pair's send queue.
    sq: SendQueue,
    table: RequestTable<Op>,
    pool: BufferPool,
    /// The whole store (read key) and this client's range (window key).
    store: RemoteMemory,
    own: RemoteMemory,
    /// Read-only blocks `0..ro`; own blocks `first..first + gens.len()`.
    ro: u64,
    first: u64,
    gens: Vec<Option<u64>>,
    busy: Vec<bool>,
    rng: u64,
}

impl Client {
    fn random(&mut self) -> u64 {
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix(self.rng)
    }

    /// The own-range slot of `block`, if it is in the range.
    fn own(&self, block: u64) -> Option<usize> {
        let o = block.checked_sub(self.first)? as usize;
        (o < self.gens.len()).then_some(o)
    }

    fn post(&mut self, index: u64, write: bool) -> Result<()> {
        let mut buf = self.pool.get().ok_or("no free buffer")?;
        let own = self.own(index);
        let (gen, req) = if write {
            let gen = self.random();
            buf.as_mut_slice_of::<u64>()?
                .copy_from_slice(&block(index, gen));
            let to = self
                .own
                .slice((index - self.first) * BLOCK as u64, BLOCK as u64);
            (
                Some(gen),
                SendRequest::write(buf, to.ok_or("outside the window")?),
            )
        } else {
            let (key, at) = own.map_or((self.store, index), |o| (self.own, o as u64));
            let from = key.slice(at * BLOCK as u64, BLOCK as u64);
            let gen = own.map_or(Some(0), |o| self.gens[o]);
            (
                gen,
                SendRequest::read(buf, from.ok_or("outside the store")?),
            )
        };
        let op = Op {
            block: index,
            gen,
            write,
            start: Instant::now(),
        };
        self.table
            .post_send(&mut self.sq, req, op)
            .map_err(|e| e.error)?;
        if let Some(o) = own {
            self.busy[o] = true;
        }
        Ok(())
    }

    /// Checks a completed request; its latency in µs.
    fn complete(&mut self, op: Op, mut c: Completion) -> Result<f64> {
        let us = op.start.elapsed().as_secs_f64() * 1e6;
        let buf = c.take_local().ok_or("a completion without its buffer")?;
        c.result().map_err(|e| format!("block {}: {e}", op.block))?;
        let own = self.own(op.block);
        let gen = match op.write {
            true => op.gen,
            false => Some(check(buf.as_slice_of::<u64>()?, op.block, op.gen)?),
        };
        if let Some(o) = own {
            (self.busy[o], self.gens[o]) = (false, gen);
        }
        self.pool.put(buf)?;
        Ok(us)
    }

    /// Runs `ops` requests, `depth` in flight, each chosen by `pick`
    /// (block, write?), and prints the phase's line.
    fn phase(
        &mut self,
        name: &str,
        ops: usize,
        depth: usize,
        mut pick: impl FnMut(&mut Client, usize) -> (u64, bool),
    ) -> Result<()> {
        let (mut lat, mut posted, start) = (Vec::with_capacity(ops), 0, Instant::now());
        while lat.len() < ops {
            while posted < ops && (self.table.len() as usize) < depth {
                let (b, write) = pick(self, posted);
                self.post(b, write)?;
                posted += 1;
            }
            match self.table.poll()? {
                Some(Reaped::Done(op, c)) => lat.push(self.complete(op, c)?),
                Some(_) => return Err("a completion that is not ours".into()),
                None => {}
            }
        }
        let secs = start.elapsed().as_secs_f64();
        lat.sort_by(f64::total_cmp);
        let (p50, p99) = (
            stats::percentile(&lat, 50.0).unwrap_or(0.0),
            stats::percentile(&lat, 99.0).unwrap_or(0.0),
        );
        let iops = ops as f64 / secs;
        let mibs = iops * BLOCK as f64 / (1 << 20) as f64;
        println!("{name}: ops {ops} depth {depth} IOPS {iops:.1} MiB/s {mibs:.2} p50 {p50:.2} us p99 {p99:.2} us");
        Ok(())
    }
}

fn client(c: Common, host: &str, depth: usize, ops: usize, ratio: f64) -> Result<()> {
    let (ctx, local, opts) = open(&c)?;
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(depth as u32 + 1).build()?;
    let qp = pd
        .create_qp(QpType::Rc, &cq, &cq)
        .max_send_wr(depth as u32)
        .max_recv_wr(1)
        .build()?;
    let start = Instant::now();
    let mut tcp = loop {
        match TcpStream::connect((host, c.tcp_port)) {
            Ok(tcp) => break tcp,
            Err(e) if start.elapsed() > c.timeout() => return Err(e.into()),
            Err(_) => std::thread::sleep(Duration::from_millis(100)), // the server is starting
        }
    };
    let me = local.endpoint(&qp, Endpoint::random_psn())?;
    let peer = rdma_verbs_runtime::exchange(&mut tcp, &me, &[], c.timeout())?;
    qp.connect(&me, &peer.endpoint, &opts)?;
    let w = RemoteMemory::WIRE_LEN;
    let store = RemoteMemory::from_bytes(peer.private.get(..w).ok_or("short private bytes")?)?;
    let mut grant = vec![0u8; w + 8];
    tcp.set_read_timeout(Some(c.timeout()))?;
    tcp.read_exact(&mut grant)?;
    let own = RemoteMemory::from_bytes(&grant[..w])?;
    let first = u64::from_le_bytes(grant[w..].try_into()?);
    let (ro, n) = (store.len / BLOCK as u64, own.len / BLOCK as u64);
    let mut cl = Client {
        table: RequestTable::new(&cq, depth as u32),
        pool: pd
            .alloc_pool(depth, BLOCK, AccessFlags::LOCAL_WRITE)
            .build()?,
        sq: qp.send_queue()?,
        store,
        own,
        ro,
        first,
        gens: vec![None; n as usize],
        busy: vec![false; n as usize],
        rng: mix(std::process::id() as u64 ^ std::time::UNIX_EPOCH.elapsed()?.as_nanos() as u64),
    };
    cl.phase("random", ops, depth, |cl, _| (cl.random() % cl.ro, false))?;
    cl.phase("mixed", ops, depth.min(n as usize), |cl, _| {
        let write = ((cl.random() >> 11) as f64 / (1u64 << 53) as f64) < ratio;
        loop {
            let b = cl.first + cl.random() % n;
            if !cl.busy[(b - cl.first) as usize] {
                return (b, write);
            }
        }
    })?;
    let sweep = ro as usize + n as usize;
    cl.phase("sweep", sweep, depth, |cl, i| match (i as u64) < cl.ro {
        true => (i as u64, false),
        false => (cl.first + i as u64 - cl.ro, false),
    })?;
    tcp.write_all(b"D")?;
    println!(
        "VERIFIED: every byte read matched ({ro} read-only blocks, own blocks {first}..{})",
        first + n
    );
    Ok(())
}

// ---------------------------------------------------------------------------
// Argument parsing.
// ---------------------------------------------------------------------------

/// A block service over one-sided RDMA READ and WRITE of 4 KiB blocks.
#[derive(Parser, Debug)]
#[command(name = "blockstore")]
struct Cli {
    #[command(subcommand)]
    role: Role,
}

#[derive(Subcommand, Debug)]
enum Role {
    /// Serve the store until K clients finished, then verify it.
    Server {
        #[command(flatten)]
        common: Common,
    },
    /// Run the random, mixed and sweep phases against a server.
    Client {
        /// The server's host name or address.
        host: String,
        #[command(flatten)]
        common: Common,
        /// Requests in flight.
        #[arg(short = 'q', long = "depth", default_value_t = 16)]
        depth: usize,
        /// Requests of the random and the mixed phase each.
        #[arg(short = 'n', long = "ops", default_value_t = 10_000)]
        ops: usize,
        /// Fraction of writes in the mixed phase (0: reads only, 1: writes only).
        #[arg(long = "write-ratio", default_value_t = 0.5)]
        write_ratio: f64,
    },
}

#[derive(Args, Debug)]
struct Common {
    /// RDMA device (default: the first one found).
    #[arg(short = 'd', long = "ib-dev")]
    device: Option<String>,
    /// Port of the RDMA device (default: the first active one).
    #[arg(short = 'i', long = "ib-port")]
    ib_port: Option<u8>,
    /// GID index (default: on RoCE the port's RoCE v2 GID with a non-link-local IPv4 address, else its first valid GID; 0 on InfiniBand).
    #[arg(short = 'g', long = "gid-index")]
    gid: Option<u8>,
    /// TCP port of the server.
    #[arg(short = 'p', long = "port", default_value_t = 18700)]
    tcp_port: u16,
    /// Blocks in the store (server; a client learns the layout from it).
    #[arg(long, default_value_t = 1024)]
    blocks: usize,
    /// Clients that must finish before the server verifies and exits
    /// (server; also the number of write ranges).
    #[arg(long, default_value_t = 1)]
    clients: usize,
    /// Longest wait, in seconds, for an exchange or a completion.
    #[arg(long = "timeout", default_value_t = 30.0)]
    timeout_secs: f64,
}

impl Common {
    fn timeout(&self) -> Duration {
        Duration::from_secs_f64(self.timeout_secs)
    }
}

fn main() -> ExitCode {
    match Cli::parse().role {
        Role::Server { common } => main_with("blockstore server", || server(common)),
        Role::Client {
            host,
            common,
            depth,
            ops,
            write_ratio,
        } => {
            if depth == 0 || !(0.0..=1.0).contains(&write_ratio) {
                eprintln!("blockstore client: need -q 1 or more and --write-ratio in 0..=1");
                return ExitCode::FAILURE;
            }
            main_with("blockstore client", || {
                client(common, &host, depth, ops, write_ratio)
            })
        }
    }
}
