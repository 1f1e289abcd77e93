//! The soak's client: sessions of many queue pairs, each thread driving
//! its share of them on one completion queue, a random mix of requests,
//! every result checked (see the parent module).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::TcpStream;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ibverbs::{
    AccessFlags, Buf, Completions, Endpoint, LocalBuffer, QpType, QueuePair, RemoteMemory,
    SendRequest, SgList, WcStatus,
};

use super::model::{check_qp, end_line, parse_ledger, Atomic, ClientQp, Counter, Finding};
use super::pattern::{check, fill, mix, seed};
use super::server::hello_line;
use super::{
    back_to_baseline, connect_qp, ep_line, parse_ep, parse_regions, resources, uptime, Common,
    Conn, Regions, KIND_RECV, KIND_WRITE, READ_REGION,
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
struct Totals {
    sessions: u64,
    ends: BTreeMap<String, u64>,
    ops: BTreeMap<&'static str, u64>,
    bytes: u64,
    /// Error completions by status, flushes apart.
    errors: BTreeMap<String, u64>,
    flushed: u64,
    lost: u64,
    phantom: u64,
    corrupt: u64,
    counter_mismatch: u64,
    /// Receive-consuming messages of sessions whose server vanished
    /// (killed): neither confirmed nor refuted.
    unconfirmed: u64,
    leaks: u64,
    stuck: u64,
    watchdog: u64,
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
const RUN: u8 = 0;
const TIME_UP: u8 = 1;
const FAILED: u8 = 2;

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
        let e = |e: ibverbs::Error| e.to_string();
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
        let mut i = 0;
        for (_, qps, _) in &workers {
            for (_, qp) in qps {
                connect_qp(s, &a.c, qp, &mine[i], &theirs[i]).map_err(e)?;
                i += 1;
            }
        }
        Ok((pd, workers, regions))
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
                        .map(|(q, qp)| QpState::new(q, qp, &regions, slots(a.window)))
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

/// What a worker hands back: each queue pair's ledger and counter model.
struct WorkerEnd {
    qps: Vec<(usize, ClientQp, Counter)>,
    first_error: Option<String>,
    stuck: bool,
    /// Kept alive until the ledger is settled (and leaked if stuck).
    _keep: Option<(ibverbs::CompletionQueue, Vec<QueuePair>, Vec<LocalBuffer>)>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Send,
    Write { imm: bool },
    ReadBack { seed: u64, slot: usize },
    Read { offset: u64 },
    Atomic { cas: bool },
}

struct Pending {
    wr_id: u64,
    kind: Kind,
    len: usize,
    /// The rest of the request's buffer, joined back on completion.
    tail: LocalBuffer,
}

struct QpState {
    q: usize,
    qp: QueuePair,
    pending: VecDeque<Pending>,
    free_slots: Vec<usize>,
    counter: Counter,
    ledger: ClientQp,
    recv_seq: u64,
    write_seq: u64,
    /// The seed of each write slot's last checked write.
    slot_seed: Vec<Option<u64>>,
}

impl QpState {
    fn new(q: usize, qp: QueuePair, r: &Regions, slots: usize) -> QpState {
        QpState {
            q,
            qp,
            pending: VecDeque::new(),
            free_slots: (0..slots).collect(),
            counter: Counter::new(r.counter0),
            ledger: ClientQp::default(),
            recv_seq: 0,
            write_seq: 0,
            slot_seed: vec![None; slots],
        }
    }
}

struct Worker {
    id: u64,
    cq: ibverbs::CompletionQueue,
    qps: Vec<QpState>,
    pool: Vec<LocalBuffer>,
    regions: Regions,
    max: usize,
    window: usize,
    slots: usize,
    rng: u64,
    next_wr: u64,
}

impl Worker {
    fn rand(&mut self) -> u64 {
        self.rng = mix(self.rng);
        self.rng
    }
    /// A log-uniform size in 1 ..= max.
    fn size(&mut self) -> usize {
        let k = self.rand() % 21;
        let len = 1 + self.rand() % (1u64 << k);
        (len as usize).min(self.max)
    }

    fn run(mut self, until: Instant, stop: &AtomicU8, shared: &Mutex<Totals>) -> WorkerEnd {
        let mut t = Totals::default();
        let mut batch = Completions::with_capacity(64);
        let mut first_error = None;
        let mut errored_at: Option<Instant> = None;
        let mut last_progress = Instant::now();
        let mut watchdog = false;
        let mut stuck = false;
        let index: HashMap<u32, usize> = self
            .qps
            .iter()
            .enumerate()
            .map(|(i, s)| (s.qp.qp_num().0, i))
            .collect();
        loop {
            if Instant::now() >= until {
                let _ = stop.compare_exchange(RUN, TIME_UP, Ordering::AcqRel, Ordering::Acquire);
            }
            let state = stop.load(Ordering::Acquire);
            if state == FAILED && errored_at.is_none() {
                errored_at = Some(Instant::now());
                for s in &self.qps {
                    let _ = s.qp.to_err();
                }
            }
            let mut posted = false;
            if state == RUN {
                for i in 0..self.qps.len() {
                    match self.post_one(i) {
                        Ok(p) => posted |= p,
                        Err(e) => {
                            first_error.get_or_insert(e);
                            stop.store(FAILED, Ordering::Release);
                            break;
                        }
                    }
                }
            }
            let outstanding: usize = self.qps.iter().map(|s| s.pending.len()).sum();
            if state != RUN && outstanding == 0 {
                break;
            }
            if let Err(e) = self.cq.poll(&mut batch) {
                first_error.get_or_insert(format!("poll:{e}").replace(' ', "_"));
                stop.store(FAILED, Ordering::Release);
            }
            let got = !batch.is_empty();
            for mut comp in batch.drain() {
                last_progress = Instant::now();
                let Some(&i) = index.get(&comp.qp_num()) else {
                    continue;
                };
                let s = &mut self.qps[i];
                let Some(p) = s.pending.pop_front() else {
                    println!(
                        "CORRUPT at={:.2} side=client session={} qp={} a completion with nothing posted",
                        uptime(),
                        self.id,
                        s.q
                    );
                    t.corrupt += 1;
                    continue;
                };
                let head = comp.take_local();
                if comp.wr_id() != p.wr_id {
                    println!(
                        "CORRUPT at={:.2} side=client session={} qp={} completion {} out of order (expected {})",
                        uptime(),
                        self.id,
                        s.q,
                        comp.wr_id(),
                        p.wr_id
                    );
                    t.corrupt += 1;
                }
                let status = comp.status();
                if status != WcStatus::Success {
                    s.ledger.errored = true;
                    match status {
                        WcStatus::WrFlushErr => t.flushed += 1,
                        other => *t.errors.entry(format!("{other:?}")).or_default() += 1,
                    }
                    if first_error.is_none() && status != WcStatus::WrFlushErr {
                        first_error = Some(format!("{status:?}"));
                    }
                    stop.store(FAILED, Ordering::Release);
                } else if let Some(h) = &head {
                    let verdict = self_check(s, &p, h, &self.regions, &mut t);
                    if let Err(e) = verdict {
                        println!(
                            "CORRUPT at={:.2} side=client session={} qp={} {e}",
                            uptime(),
                            self.id,
                            s.q
                        );
                        t.corrupt += 1;
                    }
                }
                // The buffer, whole again, back to the pool.
                match head {
                    Some(h) => match h.unsplit(p.tail) {
                        Ok(b) => self.pool.push(b),
                        Err(_) => {
                            println!(
                                "CORRUPT at={:.2} side=client session={} a buffer came back in pieces",
                                uptime(),
                                self.id
                            );
                            t.corrupt += 1;
                        }
                    },
                    None => {
                        println!(
                            "CORRUPT at={:.2} side=client session={} a completion without its buffer",
                            uptime(),
                            self.id
                        );
                        t.corrupt += 1;
                    }
                }
            }
            let outstanding: usize = self.qps.iter().map(|s| s.pending.len()).sum();
            if outstanding > 0 && last_progress.elapsed() > Duration::from_secs(30) {
                if !watchdog {
                    // The device neither completes nor fails: end the
                    // session as an application would (typed flushes).
                    eprintln!("soak_peer client: no completion for 30 s with {outstanding} outstanding: QPs to ERR");
                    watchdog = true;
                    t.watchdog += 1;
                    first_error.get_or_insert("watchdog".into());
                    stop.store(FAILED, Ordering::Release);
                    last_progress = Instant::now();
                } else {
                    stuck = true;
                    break;
                }
            }
            if !got && !posted {
                std::thread::sleep(Duration::from_micros(100));
            }
        }
        let qps = self
            .qps
            .iter()
            // Atomics that never completed successfully stay unconfirmed
            // (the model's `possible` values).
            .map(|s| (s.q, s.ledger.clone(), s.counter.clone()))
            .collect();
        {
            let mut g = shared.lock().unwrap_or_else(|p| p.into_inner());
            merge(&mut g, t);
        }
        let Worker {
            cq,
            qps: states,
            pool,
            ..
        } = self;
        WorkerEnd {
            qps,
            first_error,
            stuck,
            _keep: Some((cq, states.into_iter().map(|s| s.qp).collect(), pool)),
        }
    }

    /// Posts one operation on queue pair `i` if its window, the pool and
    /// (writes) a slot allow; `Ok(true)` when it did.
    fn post_one(&mut self, i: usize) -> Result<bool, String> {
        let room = self.window - self.qps[i].pending.len();
        let pick = self.rand() % 100;
        // send 30 %, write 20 %, write with immediate 15 %, read 20 %,
        // fetch-and-add 8 %, compare-and-swap 7 %.
        let needs_two = (30..65).contains(&pick);
        let need = if needs_two { 2 } else { 1 };
        if room < need || self.pool.len() < need {
            return Ok(false);
        }
        if needs_two && self.qps[i].free_slots.is_empty() {
            return Ok(false);
        }
        let len = match pick {
            80.. => 8,
            _ => self.size(),
        };
        let q = self.qps[i].q;
        match pick {
            0..=29 => {
                let s = &mut self.qps[i];
                let sd = seed(self.id, q, KIND_RECV, s.recv_seq);
                s.recv_seq += 1;
                s.ledger.posted += 1;
                self.post(i, Kind::Send, len, sd, None, 0)?;
            }
            30..=64 => {
                let imm = pick >= 50;
                let s = &mut self.qps[i];
                let slot = s.free_slots.pop().expect("checked above");
                let sd = seed(self.id, q, KIND_WRITE, s.write_seq);
                s.write_seq += 1;
                let at = ((q * self.slots + slot) * self.max) as u64;
                let remote = self
                    .regions
                    .write
                    .slice(at, len as u64)
                    .ok_or("write slot outside the region")?;
                let imm_value = match imm {
                    true => {
                        let v = super::imm_of(s.recv_seq, len);
                        s.recv_seq += 1;
                        s.ledger.posted += 1;
                        Some(v)
                    }
                    false => None,
                };
                self.post(
                    i,
                    Kind::Write { imm },
                    len,
                    sd,
                    Some(remote),
                    imm_value.unwrap_or(0),
                )?;
                self.post(
                    i,
                    Kind::ReadBack { seed: sd, slot },
                    len,
                    sd,
                    Some(remote),
                    0,
                )?;
            }
            65..=79 => {
                let offset = self.rand() % (READ_REGION - len + 1) as u64;
                let remote = self
                    .regions
                    .read
                    .slice(offset, len as u64)
                    .ok_or("read outside the region")?;
                self.post(i, Kind::Read { offset }, len, 0, Some(remote), 0)?;
            }
            _ => {
                let add = self.rand();
                let s = &mut self.qps[i];
                let op = match pick {
                    80..=87 => Atomic::FetchAdd(add),
                    // Mostly a compare that matches, sometimes one that
                    // does not (the counter must then stay).
                    _ => Atomic::CompareSwap {
                        compare: match add % 4 {
                            0 => s.counter.predicted ^ 1,
                            _ => s.counter.predicted,
                        },
                        swap: add.rotate_left(17),
                    },
                };
                s.counter.post(op);
                let remote = self
                    .regions
                    .atomic
                    .slice(8 * q as u64, 8)
                    .ok_or("counter outside the region")?;
                self.post_atomic(i, op, remote)?;
            }
        }
        Ok(true)
    }

    fn take(&mut self, len: usize) -> (LocalBuffer, LocalBuffer) {
        self.pool
            .pop()
            .expect("checked by the caller")
            .split_at(len)
    }

    fn post(
        &mut self,
        i: usize,
        kind: Kind,
        len: usize,
        sd: u64,
        remote: Option<RemoteMemory>,
        imm: u32,
    ) -> Result<(), String> {
        let (mut head, tail) = self.take(len);
        let wr_id = self.next_wr;
        self.next_wr += 1;
        let wr = match (kind, remote) {
            (Kind::Send, _) => {
                fill(&mut head, sd, 0);
                SendRequest::send(head)
            }
            (Kind::Write { imm: with }, Some(r)) => {
                fill(&mut head, sd, 0);
                match with {
                    true => SendRequest::write(head, r).imm(imm),
                    false => SendRequest::write(head, r),
                }
            }
            (Kind::ReadBack { .. } | Kind::Read { .. }, Some(r)) => {
                head.fill(0);
                SendRequest::read(head, r)
            }
            _ => unreachable!("every remote kind has its region"),
        };
        self.submit(i, wr.wr_id(wr_id).signaled(true), kind, len, tail)
    }

    fn post_atomic(&mut self, i: usize, op: Atomic, remote: RemoteMemory) -> Result<(), String> {
        let (head, tail) = self.take(8);
        let wr_id = self.next_wr;
        self.next_wr += 1;
        let wr = match op {
            Atomic::FetchAdd(d) => SendRequest::fetch_and_add(head, remote, d),
            Atomic::CompareSwap { compare, swap } => {
                SendRequest::compare_and_swap(head, remote, compare, swap)
            }
        };
        let cas = matches!(op, Atomic::CompareSwap { .. });
        self.submit(
            i,
            wr.wr_id(wr_id).signaled(true),
            Kind::Atomic { cas },
            8,
            tail,
        )
    }

    fn submit(
        &mut self,
        i: usize,
        wr: SendRequest<'static>,
        kind: Kind,
        len: usize,
        tail: LocalBuffer,
    ) -> Result<(), String> {
        let wr_id = self.next_wr - 1;
        match self.qps[i].qp.post_send(wr) {
            Ok(()) => {
                self.qps[i].pending.push_back(Pending {
                    wr_id,
                    kind,
                    len,
                    tail,
                });
                Ok(())
            }
            Err(e) => {
                let msg = format!("post:{}", e.error).replace(' ', "_");
                if let SgList::One(Buf::Local(b)) = e.request.into_buffers() {
                    if let Ok(b) = b.unsplit(tail) {
                        self.pool.push(b);
                    }
                }
                Err(msg)
            }
        }
    }
}

/// Checks a successful completion's result and counts it.
fn self_check(
    s: &mut QpState,
    p: &Pending,
    head: &LocalBuffer,
    r: &Regions,
    t: &mut Totals,
) -> Result<(), String> {
    let name = match p.kind {
        Kind::Send => "send",
        Kind::Write { imm: true } => "write_imm",
        Kind::Write { imm: false } => "write",
        Kind::ReadBack { .. } => "read_back",
        Kind::Read { .. } => "read",
        Kind::Atomic { cas: false } => "fetch_add",
        Kind::Atomic { cas: true } => "compare_swap",
    };
    let result = match p.kind {
        Kind::Send | Kind::Write { imm: true } => {
            s.ledger.delivered += 1;
            Ok(())
        }
        Kind::Write { imm: false } => Ok(()),
        Kind::ReadBack { seed, slot } => {
            s.free_slots.push(slot);
            let before = s.slot_seed[slot].replace(seed);
            match check(&head[..p.len], seed, 0) {
                None => Ok(()),
                Some((at, bad)) => {
                    // The slot's previous write still there, or zeros?
                    let part = &head[at..p.len.min(at + 1024)];
                    let what = match before {
                        _ if part.iter().all(|&b| b == 0) => "zeros there",
                        Some(b) if check(part, b, at as u64).is_none() => {
                            "from there the slot's previous write"
                        }
                        _ => "bytes of neither this nor the slot's previous write",
                    };
                    Err(format!(
                        "read-back of a {} B write: {bad} bytes differ, the first at {at}: {what}",
                        p.len
                    ))
                }
            }
        }
        Kind::Read { offset } => match check(&head[..p.len], r.read_seed, offset) {
            None => Ok(()),
            Some((at, bad)) => Err(format!(
                "read of {} B at {offset}: {bad} bytes differ, the first at {at}",
                p.len
            )),
        },
        Kind::Atomic { .. } => {
            let got = u64::from_ne_bytes(head[..8].try_into().expect("8 bytes"));
            s.counter.complete(got)
        }
    };
    *t.ops.entry(name).or_default() += 1;
    t.bytes += p.len as u64;
    result
}

fn merge(into: &mut Totals, from: Totals) {
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
