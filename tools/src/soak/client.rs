//! The soak's client: sessions of many queue pairs, each thread driving
//! its share of them on one completion queue, a random mix of requests,
//! every result checked (see the parent module).

use std::collections::BTreeMap;
use std::net::TcpStream;
use std::sync::atomic::AtomicU8;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdma_verbs::{AccessFlags, Endpoint, QpType};

use super::model::{check_qp, end_line, parse_ledger, ClientQp, Counter, Finding};
use super::pattern::mix;
use super::server::hello_line;
use super::worker::{QpState, Worker, WorkerEnd};
use super::{
    back_to_baseline, connect_qp, ep_line, parse_ep, parse_regions, resources, uptime, Common, Conn,
};
use crate::fault::{endpoint, open, Setup};

#[derive(clap::Args, Clone)]
/// The client's options.
pub struct ClientArgs {
    /// The server's address.
    pub host: String,
    #[command(flatten)]
    pub c: Common,
    /// Length of the whole run.
    #[arg(long, default_value_t = 60)]
    pub seconds: u64,
    /// Mean length of a session (each is 0.5–1.5 times this).
    #[arg(long, default_value_t = 30)]
    pub session_secs: u64,
    /// Queue pairs per session.
    #[arg(long, default_value_t = 16)]
    pub qps: usize,
    /// Threads, each driving `qps / threads` queue pairs on one CQ.
    #[arg(long, default_value_t = 4)]
    pub threads: usize,
    /// Requests in flight per queue pair.
    #[arg(long, default_value_t = 4)]
    pub window: usize,
    /// Largest message (sizes are log-uniform in 1 ..= this).
    #[arg(long, default_value_t = 1 << 20)]
    pub max_msg: usize,
    /// Seed of every random choice (sessions, sizes, operations).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

/// Slots of the server's write region per queue pair: a write and its
/// read-back hold one until the read-back completes.
fn slots(window: usize) -> usize {
    (window / 2).max(1)
}

/// The run's totals (all sessions).
#[derive(Default)]
pub(super) struct Totals {
    pub(super) sessions: u64,
    pub(super) ends: BTreeMap<String, u64>,
    pub(super) ops: BTreeMap<&'static str, u64>,
    pub(super) bytes: u64,
    /// Error completions by status, flushes apart.
    pub(super) errors: BTreeMap<String, u64>,
    pub(super) flushed: u64,
    pub(super) lost: u64,
    pub(super) phantom: u64,
    pub(super) corrupt: u64,
    pub(super) counter_mismatch: u64,
    /// Receive-consuming messages of sessions whose server vanished
    /// (killed): neither confirmed nor refuted.
    pub(super) unconfirmed: u64,
    pub(super) leaks: u64,
    pub(super) stuck: u64,
    pub(super) watchdog: u64,
}

/// See the module docs.
pub fn client(a: ClientArgs) -> Result<(), String> {
    if a.qps == 0 || a.threads == 0 || a.window < 2 || !(8..=1 << 20).contains(&a.max_msg) {
        return Err("need --qps ≥ 1, --threads ≥ 1, --window ≥ 2, --max-msg in 8 ..= 1 MiB".into());
    }
    let threads = a.threads.min(a.qps);
    let s = open(&a.c.device, a.c.ib_port, a.c.gid_index).map_err(|e| e.to_string())?;
    let dev = s.ctx.name().to_string();
    let baseline = resources(&dev);
    let start = Instant::now();
    let end = start + Duration::from_secs(a.seconds);
    let mut t = Totals::default();
    let mut rng = mix(a.seed);
    let mut announced = false;
    while Instant::now() < end {
        t.sessions += 1;
        let id = mix(a.seed ^ t.sessions.rotate_left(32));
        rng = mix(rng);
        let len = a.session_secs as f64 * (0.5 + (rng % 1000) as f64 / 1000.0);
        let until = (Instant::now() + Duration::from_secs_f64(len)).min(end);
        let started = Instant::now();
        let before = snapshot(&t);
        let outcome = session(&s, &a, threads, id, until, end, &mut t, &mut announced);
        let leak = match back_to_baseline(&dev, &baseline) {
            Ok(()) => "-".to_string(),
            Err(e) => {
                t.leaks += 1;
                e.replace(' ', "_")
            }
        };
        *t.ends
            .entry(outcome.split(':').next().unwrap_or("?").into())
            .or_default() += 1;
        let after = snapshot(&t);
        println!(
            "SESSION {} end={outcome} secs={:.1} ops={} bytes={} lost={} phantom={} corrupt={} counter_mismatch={} leak={leak}",
            t.sessions,
            started.elapsed().as_secs_f64(),
            after[0] - before[0],
            after[1] - before[1],
            after[2] - before[2],
            after[3] - before[3],
            after[4] - before[4],
            after[5] - before[5],
        );
        if outcome.starts_with("stuck") {
            break;
        }
        if outcome.starts_with("setup") {
            // A link that is down or a server restarting: not a busy loop.
            std::thread::sleep(Duration::from_secs(1));
        }
    }
    let join = |m: &BTreeMap<String, u64>| match m.is_empty() {
        true => "-".to_string(),
        false => m
            .iter()
            .map(|(k, v)| format!("{k}:{v}"))
            .collect::<Vec<_>>()
            .join(","),
    };
    let ops: u64 = t.ops.values().sum();
    let kinds: String = [
        "send",
        "write",
        "write_imm",
        "read_back",
        "read",
        "fetch_add",
        "compare_swap",
    ]
    .iter()
    .map(|k| format!(" {k}={}", t.ops.get(k).copied().unwrap_or(0)))
    .collect();
    println!(
        "SOAK secs={:.0} sessions={} ends={} ops={ops} bytes={}{kinds} errors={} flushed={} lost={} phantom={} corrupt={} counter_mismatch={} unconfirmed={} leaks={} stuck={} watchdog={}",
        start.elapsed().as_secs_f64(),
        t.sessions,
        join(&t.ends),
        t.bytes,
        join(&t.errors),
        t.flushed,
        t.lost,
        t.phantom,
        t.corrupt,
        t.counter_mismatch,
        t.unconfirmed,
        t.leaks,
        t.stuck,
        t.watchdog,
    );
    Ok(())
}

fn snapshot(t: &Totals) -> [u64; 6] {
    [
        t.ops.values().sum(),
        t.bytes,
        t.lost,
        t.phantom,
        t.corrupt,
        t.counter_mismatch,
    ]
}

/// Connects to the server, retrying (a restarted server takes a moment)
/// until `end`.
fn connect(a: &ClientArgs, end: Instant) -> Result<TcpStream, String> {
    loop {
        match TcpStream::connect((a.host.as_str(), a.c.tcp_port)) {
            Ok(s) => return Ok(s),
            Err(e) if Instant::now() + Duration::from_millis(200) < end => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(e) => return Err(format!("connect {}:{}: {e}", a.host, a.c.tcp_port)),
        }
    }
}

/// Session stop flag values.
pub(super) const RUN: u8 = 0;
pub(super) const TIME_UP: u8 = 1;
pub(super) const FAILED: u8 = 2;

/// One session; returns how it ended (`ok`, `error:<status>`,
/// `peer-gone:<why>`, `setup:<why>`, `stuck`).
#[allow(clippy::too_many_arguments)]
fn session(
    s: &Setup,
    a: &ClientArgs,
    threads: usize,
    id: u64,
    until: Instant,
    end: Instant,
    t: &mut Totals,
    announced: &mut bool,
) -> String {
    let stream = match connect(a, end) {
        Ok(st) => st,
        Err(e) => return format!("setup:{}", e.replace(' ', "_")),
    };
    let mut conn = match Conn::new(stream) {
        Ok(c) => c,
        Err(e) => return format!("setup:{}", e.replace(' ', "_")),
    };
    let setup = (|| -> Result<_, String> {
        let e = |e: rdma_verbs::Error| e.to_string();
        let pd = s.ctx.alloc_pd().map_err(e)?;
        let per = a.qps.div_ceil(threads);
        let mut workers = Vec::new();
        let mut hello = hello_line(id, a.qps, a.max_msg, slots(a.window));
        let mut mine = Vec::new();
        for th in 0..threads {
            let qps_here: Vec<usize> = (th * per..((th + 1) * per).min(a.qps)).collect();
            if qps_here.is_empty() {
                continue;
            }
            let depth = (qps_here.len() * a.window) as u32;
            let cq = s.ctx.create_cq(depth + 4).build().map_err(e)?;
            let mut qps = Vec::new();
            for &q in &qps_here {
                let qp = pd
                    .create_qp(QpType::Rc, &cq, &cq)
                    .max_send_wr(a.window as u32)
                    .max_recv_wr(1)
                    .build()
                    .map_err(e)?;
                let ep = endpoint(s, &qp, Endpoint::random_psn()).map_err(e)?;
                hello.push_str(&ep_line(&ep));
                mine.push(ep);
                qps.push((q, qp));
            }
            // Every request of this thread's window has a buffer of the
            // largest size (a request uses the head of one).
            let (pool, _) = pd
                .alloc(qps.len() * a.window * a.max_msg, AccessFlags::LOCAL_WRITE)
                .map_err(e)?
                .chunks_exact(a.max_msg);
            workers.push((cq, qps, pool));
        }
        conn.send(&hello)?;
        let mut theirs = Vec::new();
        for _ in 0..a.qps {
            theirs.push(parse_ep(&conn.line(Duration::from_secs(60))?)?);
        }
        let regions = parse_regions(&conn.line(Duration::from_secs(60))?)?;
        // Which queue pair numbers carry which index: a packet trace
        // (`cargo xtask soak --capture`) names queue pairs by number.
        let qpns: Vec<String> = mine
            .iter()
            .zip(&theirs)
            .enumerate()
            .map(|(q, (m, t))| format!("{q}:{}:{}", m.qp_num.0, t.qp_num.0))
            .collect();
        println!("QPS session={id} {}", qpns.join(" "));
        let mut i = 0;
        let mut ready = Vec::with_capacity(workers.len());
        for (cq, qps, pool) in workers {
            let mut with_sq = Vec::with_capacity(qps.len());
            for (q, qp) in qps {
                connect_qp(s, &a.c, &qp, &mine[i], &theirs[i]).map_err(e)?;
                let sq = qp.send_queue().map_err(e)?;
                with_sq.push((q, qp, sq));
                i += 1;
            }
            ready.push((cq, with_sq, pool));
        }
        Ok((pd, ready, regions))
    })();
    let (pd, workers, regions) = match setup {
        Ok(x) => x,
        Err(e) => return format!("setup:{}", e.replace(' ', "_")),
    };
    if !*announced {
        // The harness starts its faults from this line.
        eprintln!("soak_peer client: connected");
        *announced = true;
    }
    let stop = AtomicU8::new(RUN);
    let shared = Mutex::new(std::mem::take(t));
    let results: Vec<WorkerEnd> = std::thread::scope(|sc| {
        let handles: Vec<_> = workers
            .into_iter()
            .enumerate()
            .map(|(th, (cq, qps, pool))| {
                let w = Worker {
                    id,
                    cq,
                    qps: qps
                        .into_iter()
                        .map(|(q, qp, sq)| QpState::new(q, qp, sq, &regions, slots(a.window)))
                        .collect(),
                    pool,
                    regions,
                    max: a.max_msg,
                    window: a.window,
                    slots: slots(a.window),
                    rng: mix(id ^ th as u64 ^ 0xabcd),
                    next_wr: 0,
                };
                let (stop, shared) = (&stop, &shared);
                sc.spawn(move || w.run(until, stop, shared))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a soak worker panicked"))
            .collect()
    });
    *t = shared.into_inner().unwrap_or_else(|p| p.into_inner());
    let first_error = results.iter().find_map(|r| r.first_error.clone());
    if results.iter().any(|r| r.stuck) {
        t.stuck += 1;
        // The device still holds requests: leak the session (its QPs,
        // CQs and buffers) rather than free memory it may write.
        std::mem::forget(results);
        std::mem::forget(pd);
        return "stuck".into();
    }
    let mut client_qps = vec![ClientQp::default(); a.qps];
    let mut counters = vec![Counter::default(); a.qps];
    for r in &results {
        for (q, c, k) in &r.qps {
            client_qps[*q] = c.clone();
            counters[*q] = k.clone();
        }
    }
    let outcome = match &first_error {
        Some(e) => format!("error:{e}"),
        None => "ok".into(),
    };
    let ledger = conn
        .send(&end_line(&client_qps))
        .and_then(|()| conn.line(Duration::from_secs(60)))
        .and_then(|l| parse_ledger(&l, a.qps));
    let ledger = match ledger {
        Ok(l) => l,
        Err(e) => {
            t.unconfirmed += client_qps.iter().map(|c| c.posted).sum::<u64>();
            return format!("peer-gone:{}", e.replace(' ', "_"));
        }
    };
    for (q, ((c, k), srv)) in client_qps.iter().zip(&counters).zip(&ledger).enumerate() {
        for f in check_qp(c, k, srv) {
            println!("FINDING at={:.2} session={id} qp={q} {f:?}", uptime());
            match f {
                Finding::Lost(n) => t.lost += n,
                Finding::Phantom(n) => t.phantom += n,
                Finding::CounterMismatch { .. } => t.counter_mismatch += 1,
                Finding::Corrupt(n) => t.corrupt += n,
            }
        }
    }
    drop(results);
    drop(pd);
    outcome
}

pub(super) fn merge(into: &mut Totals, from: Totals) {
    for (k, v) in from.ops {
        *into.ops.entry(k).or_default() += v;
    }
    for (k, v) in from.errors {
        *into.errors.entry(k).or_default() += v;
    }
    into.bytes += from.bytes;
    into.flushed += from.flushed;
    into.corrupt += from.corrupt;
    into.watchdog += from.watchdog;
}
