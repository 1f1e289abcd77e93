//! The per-operation cost probe of `cargo xtask instr`: N RC queue pairs,
//! each connected to itself, sharing one CQ per thread; every round posts
//! `depth` signaled RDMA writes of `size` bytes on every queue pair, sleeps
//! until the device has completed them, and polls them in batches of 16.
//! `xtask/c/opcost.c` is the same program on libibverbs in C.
//!
//! ```text
//! opcost --path request|prepared|raw [--qps N] [--depth D] [--threads T]
//!        [--rounds R] [--size BYTES] [--events] [--calibrate K] [-d DEV] [-i PORT] [-x GID]
//! ```
//!
//! The work of one request happens in two functions that are never inlined,
//! `instr_post` (one request) and `instr_poll` (one poll of up to 16), so
//! that callgrind reports their inclusive instruction counts; `instr_empty`
//! polls an empty CQ `--calibrate` times through the same code, so the cost
//! of a poll that finds fewer completions than it could take is known.
//! `instr_wait` (with `--events`, one queue pair, depth 1) is the event
//! wait: get the event, re-arm, acknowledge. The sleep between posting and
//! polling keeps the count deterministic: a poll finds every completion
//! of the round (`short_polls` counts the exceptions).
//!
//! The paths: `request` moves an owned buffer into a typed post on the
//! queue pair's send queue handle (`sq.write(buf, remote, Wr::id(i))`) and
//! takes it back from its borrowed completion; `prepared` re-posts a
//! [`PreparedSend`](ibverbs::PreparedSend) on the handle; `raw` posts a reused
//! C work request through the unsafe raw path. One line of `key=value`
//! results goes to stdout (setup and teardown times, RSS, counts).

use std::hint::black_box;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use ibverbs::{
    AccessFlags, CompletionChannel, CompletionQueue, Completions, ConnectOptions, Context,
    Endpoint, GidIndex, LocalBuffer, LocalPort, PortNumber, PreparedSend, QpType, QueuePair,
    RemoteMemory, SendQueue, SendRequest, SharedBuffer, WorkCompletion, Wr,
};
use ibverbs_sys as sys;

type Error = Box<dyn std::error::Error + Send + Sync>;
type Result<T, E = Error> = std::result::Result<T, E>;

/// Completions taken per poll (perftest's batch).
const BATCH: usize = 16;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Path {
    Request,
    Prepared,
    Raw,
}

struct Args {
    path: Path,
    qps: usize,
    depth: usize,
    threads: usize,
    rounds: u64,
    size: usize,
    events: bool,
    calibrate: u64,
    device: Option<String>,
    port: Option<u8>,
    gid: Option<u8>,
}

fn parse_args() -> Result<Args> {
    let mut a = Args {
        path: Path::Request,
        qps: 1,
        depth: 1,
        threads: 1,
        rounds: 100,
        size: 64,
        events: false,
        calibrate: 0,
        device: None,
        port: None,
        gid: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--path" => {
                a.path = match value()?.as_str() {
                    "request" => Path::Request,
                    "prepared" => Path::Prepared,
                    "raw" => Path::Raw,
                    other => return Err(format!("unknown path {other:?}").into()),
                }
            }
            "--qps" => a.qps = value()?.parse()?,
            "--depth" => a.depth = value()?.parse()?,
            "--threads" => a.threads = value()?.parse()?,
            "--rounds" => a.rounds = value()?.parse()?,
            "--size" => a.size = value()?.parse()?,
            "--calibrate" => a.calibrate = value()?.parse()?,
            "--events" => a.events = true,
            "-d" => a.device = Some(value()?),
            "-i" => a.port = Some(value()?.parse()?),
            "-x" => a.gid = Some(value()?.parse()?),
            other => return Err(format!("unknown argument {other:?}").into()),
        }
    }
    if a.qps == 0 || a.depth == 0 || a.threads == 0 || a.qps % a.threads != 0 {
        return Err(
            "--qps, --depth, --threads must be positive, --qps a multiple of --threads".into(),
        );
    }
    if a.events && (a.qps != 1 || a.depth != 1 || a.threads != 1) {
        return Err("--events measures one queue pair at depth 1".into());
    }
    if a.events && a.path == Path::Raw {
        return Err("--events takes the safe paths".into());
    }
    Ok(a)
}

/// Resident set size in KiB (`/proc/self/statm`).
fn rss_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = s
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    pages * 4
}

/// One thread's share: a CQ, its queue pairs, the requests of its path
/// (request `i` is `qps[i / depth]`'s; `wr_id` `i`). Posting request `i`
/// passes its queue and its record, as the C twin's
/// `ibv_post_send(r->qp, &r->wr, ..)` does.
struct Lane {
    cq: CompletionQueue,
    channel: Option<CompletionChannel>,
    qps: Vec<QueuePair>,
    /// The send queue handles of `qps` (request and prepared paths).
    sqs: Vec<SendQueue>,
    depth: usize,
    /// The request path's requests (the buffers move out and back).
    owned: Vec<Owned>,
    prepared: Vec<PreparedSend>,
    raw: Vec<Raw>,
    /// The raw path's buffers (its requests point into them).
    bufs: Vec<LocalBuffer>,
    remote: RemoteMemory,
    comps: Completions,
    wcs: [WorkCompletion; BATCH],
    short_polls: u64,
    polls: u64,
}

/// A request of the request path: `buf` written by a typed post.
struct Owned {
    /// `None` while posted.
    buf: Option<LocalBuffer>,
    remote: RemoteMemory,
    wr_id: u64,
}

/// A request of the raw path: a C work request built once.
struct Raw {
    wr: sys::ibv_send_wr,
    /// Held: `wr.sg_list` points at it.
    _sge: Box<sys::ibv_sge>,
}

// SAFETY: the raw work requests point into their own boxed SGEs and the
// lane's buffers only; a lane is used by one thread at a time.
unsafe impl Send for Lane {}

/// The three paths, each its own copy of the measured functions (so that
/// none pays for the others' stack frame or dispatch), all named
/// `instr_post` / `instr_poll` / `instr_empty` for callgrind.
trait Ops {
    /// What a request is posted on.
    type Queue;
    /// One request's record.
    type Req;
    fn reqs(lane: &mut Lane) -> (&mut [Self::Queue], &mut [Self::Req]);
    fn post(q: &mut Self::Queue, req: &mut Self::Req) -> Result<()>;
    fn poll(lane: &mut Lane) -> Result<usize>;
    fn empty(lane: &mut Lane) -> Result<bool>;
}

/// A path's module: `reqs` are its queues and its requests' records,
/// `post` posts one on its queue, `poll` polls once and hands back what
/// completed (their number).
macro_rules! path {
    ($(#[$doc:meta])* $name:ident,
     reqs($rl:ident) -> ($queue:ty, $req:ty) { $reqs:expr },
     post($q:ident, $r:ident) $post:block,
     poll($ql:ident) $poll:block) => {
        $(#[$doc])*
        mod $name {
            use super::*;
            pub struct P;
            #[inline(never)]
            fn instr_post($q: &mut $queue, $r: &mut $req) -> Result<()> $post
            #[inline(always)]
            fn body($ql: &mut Lane) -> Result<usize> $poll
            #[inline(never)]
            fn instr_poll(lane: &mut Lane) -> Result<usize> {
                body(lane)
            }
            /// Not the signature of `instr_poll`: identical functions would
            /// be merged into one symbol.
            #[inline(never)]
            fn instr_empty(lane: &mut Lane) -> Result<bool> {
                Ok(body(lane)? == 0)
            }
            impl Ops for P {
                type Queue = $queue;
                type Req = $req;
                fn reqs($rl: &mut Lane) -> (&mut [$queue], &mut [$req]) {
                    $reqs
                }
                fn post(q: &mut $queue, req: &mut $req) -> Result<()> {
                    instr_post(q, req)
                }
                fn poll(lane: &mut Lane) -> Result<usize> {
                    instr_poll(lane)
                }
                fn empty(lane: &mut Lane) -> Result<bool> {
                    instr_empty(lane)
                }
            }
        }
    };
}

path!(
    /// A new owned-buffer request per operation; the buffer comes back from
    /// the completion.
    request,
    reqs(lane) -> (SendQueue, Owned) { (&mut lane.sqs, &mut lane.owned) },
    post(sq, r) {
        let buf = r.buf.take().ok_or("buffer not back")?;
        sq.write(buf, r.remote, Wr::id(r.wr_id))?;
        Ok(())
    },
    poll(lane) {
        let batch = lane.cq.poll(&mut lane.comps)?;
        let n = batch.len();
        for mut c in batch {
            c.result()?;
            let r = lane.owned.get_mut(c.wr_id() as usize).ok_or("unknown wr_id")?;
            r.buf = c.take_local();
        }
        Ok(n)
    }
);

path!(
    /// A [`PreparedSend`] re-posted.
    prepared,
    reqs(lane) -> (SendQueue, PreparedSend) { (&mut lane.sqs, &mut lane.prepared) },
    post(sq, p) {
        sq.post_prepared(p)?;
        Ok(())
    },
    poll(lane) {
        let batch = lane.cq.poll(&mut lane.comps)?;
        let n = batch.len();
        for c in batch {
            c.result()?;
        }
        Ok(n)
    }
);

path!(
    /// A reused C work request through the unsafe raw path.
    raw,
    reqs(lane) -> (QueuePair, Raw) { (&mut lane.qps, &mut lane.raw) },
    post(qp, r) {
        // SAFETY: the request's buffer lives in `lane.bufs` (registered, not
        // touched until its completion is polled); its wr_id has bit 63
        // clear; one request, NULL-terminated.
        unsafe { qp.post_send_raw(&mut r.wr) }?;
        Ok(())
    },
    poll(lane) {
        // SAFETY: only raw requests are posted to this lane's queue pairs,
        // the only ones reporting to its CQ.
        let n = unsafe { lane.cq.poll_raw(&mut lane.wcs) }?;
        for wc in &lane.wcs[..n] {
            if wc.status() != ibverbs::WcStatus::Success {
                return Err(format!("write failed: {:?}", wc.status()).into());
            }
        }
        Ok(n)
    }
);

/// Waits for the lane's completion event and re-arms.
#[inline(never)]
fn instr_wait(lane: &mut Lane) -> Result<()> {
    let ch = lane.channel.as_ref().ok_or("no channel")?;
    let cq = ch.get_event()?.ok_or("event of a destroyed CQ")?;
    cq.req_notify(false)?;
    Ok(())
}

fn run_lane(lane: &mut Lane, path: Path, rounds: u64, calibrate: u64, events: bool) -> Result<()> {
    match path {
        Path::Request => run_path::<request::P>(lane, rounds, calibrate, events),
        Path::Prepared => run_path::<prepared::P>(lane, rounds, calibrate, events),
        Path::Raw => run_path::<raw::P>(lane, rounds, calibrate, events),
    }
}

fn run_path<P: Ops>(lane: &mut Lane, rounds: u64, calibrate: u64, events: bool) -> Result<()> {
    for _ in 0..calibrate {
        if !P::empty(lane)? {
            return Err("calibration found a completion".into());
        }
    }
    let per_round = P::reqs(lane).1.len();
    let depth = lane.depth;
    // Settling time per outstanding request; doubled when a poll comes
    // back short (counted), so the counts stay deterministic.
    let mut settle = Duration::from_micros(40);
    for _ in 0..rounds {
        // Request `i` is queue `i / depth`'s (one pass, no division).
        let (queues, reqs) = P::reqs(lane);
        let (mut q, mut left) = (0, depth);
        for r in reqs {
            P::post(&mut queues[q], r)?;
            left -= 1;
            if left == 0 {
                q += 1;
                left = depth;
            }
        }
        if events {
            instr_wait(lane)?;
        } else {
            std::thread::sleep(settle * per_round as u32);
        }
        let mut got = 0;
        let started = Instant::now();
        while got < per_round {
            let want = BATCH.min(per_round - got);
            let n = P::poll(lane)?;
            lane.polls += 1;
            got += n;
            if n < want {
                lane.short_polls += 1;
                settle *= 2;
                std::thread::sleep(settle);
                if started.elapsed() > Duration::from_secs(30) {
                    return Err(format!("only {got} of {per_round} completions in 30 s").into());
                }
            }
        }
    }
    Ok(())
}

fn build_lane(
    ctx: &Context,
    pd: &ibverbs::ProtectionDomain,
    a: &Args,
    port: PortNumber,
    gid: GidIndex,
    remote: RemoteMemory,
) -> Result<Lane> {
    let per = a.qps / a.threads;
    let channel = if a.events {
        Some(ctx.create_comp_channel()?)
    } else {
        None
    };
    // The receive queue (one entry, never used) counts too.
    let cqe = (per * (a.depth + 1)) as u32;
    let cq = match &channel {
        Some(ch) => ctx.create_cq(cqe).channel(ch).build()?,
        None => ctx.create_cq(cqe).build()?,
    };
    if a.events {
        cq.req_notify(false)?;
    }
    let mut qps = Vec::with_capacity(per);
    // The port and GID queried once, as C does.
    let local = LocalPort::query(ctx, port, Some(gid))?;
    let opts = ConnectOptions::new(port)
        .gid_index(gid)
        .local_port(&local)
        .remote_access(AccessFlags::REMOTE_WRITE);
    for _ in 0..per {
        let qp = pd
            .create_qp(QpType::Rc, &cq, &cq)
            .max_send_wr(a.depth as u32)
            .max_recv_wr(1)
            .build()?;
        let me = local.endpoint(&qp, Endpoint::random_psn())?;
        qp.connect(&me, &me, &opts)?;
        qps.push(qp);
    }
    Ok(Lane {
        cq,
        channel,
        qps,
        sqs: Vec::new(),
        depth: a.depth,
        owned: Vec::new(),
        prepared: Vec::new(),
        raw: Vec::new(),
        bufs: Vec::new(),
        remote,
        comps: Completions::with_capacity(BATCH),
        wcs: [WorkCompletion::default(); BATCH],
        short_polls: 0,
        polls: 0,
    })
}

/// Registers the lane's request buffers and builds the requests of its path.
fn fill_lane(lane: &mut Lane, pd: &ibverbs::ProtectionDomain, a: &Args) -> Result<()> {
    let n = lane.qps.len() * a.depth;
    let mut rest = pd.alloc(n * a.size, AccessFlags::LOCAL_WRITE)?;
    let mut bufs = Vec::with_capacity(n);
    for _ in 0..n {
        let (head, tail) = rest.split_at(a.size);
        bufs.push(head);
        rest = tail;
    }
    if a.path != Path::Raw {
        for qp in &lane.qps {
            lane.sqs.push(qp.send_queue()?);
        }
    }
    for (i, buf) in bufs.into_iter().enumerate() {
        match a.path {
            Path::Request => lane.owned.push(Owned {
                buf: Some(buf),
                remote: lane.remote,
                wr_id: i as u64,
            }),
            Path::Prepared => {
                let sq = &mut lane.sqs[i / a.depth];
                let p = sq.prepare(SendRequest::write(buf, lane.remote).wr_id(i as u64))?;
                lane.prepared.push(p);
            }
            Path::Raw => {
                let mut sge = Box::new(sys::ibv_sge {
                    addr: buf.addr(),
                    length: buf.len() as u32,
                    lkey: buf.lkey(),
                });
                let mut wr = sys::ibv_send_wr {
                    wr_id: i as u64,
                    sg_list: &mut *sge,
                    num_sge: 1,
                    opcode: sys::IBV_WR_RDMA_WRITE,
                    send_flags: sys::ibv_send_flags::IBV_SEND_SIGNALED.0,
                    ..Default::default()
                };
                wr.wr.rdma = sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 {
                    remote_addr: lane.remote.addr,
                    rkey: lane.remote.rkey.0,
                };
                lane.raw.push(Raw { wr, _sge: sge });
                lane.bufs.push(buf);
            }
        }
    }
    Ok(())
}

fn run(a: Args) -> Result<()> {
    let list = ibverbs::devices()?;
    let dev = match &a.device {
        Some(name) => list.find(name).ok_or(format!("no device {name:?}"))?,
        None => list.get(0).ok_or("no RDMA device")?,
    };
    let ctx = dev.open()?;
    let port = match a.port {
        Some(p) => PortNumber(p),
        None => ctx.active_port()?,
    };
    let gid = match a.gid {
        Some(g) => GidIndex(g),
        None => ctx.default_gid_index(port)?,
    };
    let pd = ctx.alloc_pd()?;
    let target: SharedBuffer = pd.alloc_shared(
        a.size.max(8),
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
    )?;
    let remote = target.remote().ok_or("target has no rkey")?;
    let rss_base = rss_kib();

    let t = Instant::now();
    let mut lanes = (0..a.threads)
        .map(|_| build_lane(&ctx, &pd, &a, port, gid, remote))
        .collect::<Result<Vec<_>>>()?;
    let setup = t.elapsed();
    let rss_qps = rss_kib();
    for lane in &mut lanes {
        fill_lane(lane, &pd, &a)?;
    }
    let rss_bufs = rss_kib();

    let t = Instant::now();
    let (path, rounds, calibrate, events) = (a.path, a.rounds, a.calibrate, a.events);
    std::thread::scope(|s| -> Result<()> {
        let handles: Vec<_> = lanes
            .iter_mut()
            .map(|lane| s.spawn(move || run_lane(lane, path, rounds, calibrate, events)))
            .collect();
        for h in handles {
            h.join().map_err(|_| "a lane panicked")??;
        }
        Ok(())
    })?;
    let ran = t.elapsed();

    let (polls, short) = lanes
        .iter()
        .fold((0, 0), |acc, l| (acc.0 + l.polls, acc.1 + l.short_polls));
    let t = Instant::now();
    for lane in lanes.iter_mut() {
        lane.owned.clear();
        lane.prepared.clear();
        lane.raw.clear();
        lane.sqs.clear();
        lane.qps.clear();
    }
    let qp_teardown = t.elapsed();
    drop(black_box(lanes));
    let ops = a.rounds * a.qps as u64 * a.depth as u64;
    println!(
        "opcost impl=rust path={} qps={} depth={} threads={} rounds={} size={} events={} \
         posts={ops} completions={ops} polls={polls} short_polls={short} calibrate={} \
         setup_us={} teardown_us={} run_us={} rss_base_kib={rss_base} rss_qps_kib={rss_qps} \
         rss_bufs_kib={rss_bufs}",
        match a.path {
            Path::Request => "request",
            Path::Prepared => "prepared",
            Path::Raw => "raw",
        },
        a.qps,
        a.depth,
        a.threads,
        a.rounds,
        a.size,
        u8::from(a.events),
        a.calibrate * a.threads as u64,
        setup.as_micros(),
        qp_teardown.as_micros(),
        ran.as_micros(),
    );
    drop(target);
    Ok(())
}

fn main() -> ExitCode {
    match parse_args().and_then(run) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("opcost: {e}");
            ExitCode::FAILURE
        }
    }
}
