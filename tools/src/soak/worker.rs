//! One thread of a soak session: its queue pairs on one completion
//! queue, a random mix of requests in each queue pair's window, every
//! completion matched to its request and checked (see the parent module).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdma_verbs::{
    memory::Buf, qp::Posted, Completions, LocalBuffer, QueuePair, RemoteMemory, SendQueue,
    WcStatus, Wr,
};

use super::client::{merge, Totals, FAILED, RUN, TIME_UP};
use super::model::{Atomic, ClientQp, Counter};
use super::pattern::{check, fill, mix, poisoned, seed, POISON};
use super::{uptime, Regions, KIND_RECV, KIND_WRITE, READ_REGION};

/// What a worker hands back: each queue pair's ledger and counter model.
pub(super) struct WorkerEnd {
    pub(super) qps: Vec<(usize, ClientQp, Counter)>,
    pub(super) first_error: Option<String>,
    pub(super) stuck: bool,
    /// Kept alive until the ledger is settled (and leaked if stuck).
    pub(super) _keep: Option<(
        rdma_verbs::CompletionQueue,
        Vec<QueuePair>,
        Vec<LocalBuffer>,
    )>,
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

pub(super) struct QpState {
    q: usize,
    qp: QueuePair,
    sq: SendQueue,
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
    pub(super) fn new(
        q: usize,
        qp: QueuePair,
        sq: SendQueue,
        r: &Regions,
        slots: usize,
    ) -> QpState {
        QpState {
            q,
            qp,
            sq,
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

pub(super) struct Worker {
    pub(super) id: u64,
    pub(super) cq: rdma_verbs::CompletionQueue,
    pub(super) qps: Vec<QpState>,
    pub(super) pool: Vec<LocalBuffer>,
    pub(super) regions: Regions,
    pub(super) max: usize,
    pub(super) window: usize,
    pub(super) slots: usize,
    pub(super) rng: u64,
    pub(super) next_wr: u64,
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

    pub(super) fn run(
        mut self,
        until: Instant,
        stop: &AtomicU8,
        shared: &Mutex<Totals>,
    ) -> WorkerEnd {
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
            let polled = match self.cq.poll(&mut batch) {
                Ok(polled) => Some(polled),
                Err(e) => {
                    first_error.get_or_insert(format!("poll:{e}").replace(' ', "_"));
                    stop.store(FAILED, Ordering::Release);
                    None
                }
            };
            let got = polled.as_ref().is_some_and(|p| !p.is_empty());
            for mut comp in polled.into_iter().flatten() {
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
        let (o, sq) = (Wr::id(wr_id), &mut self.qps[i].sq);
        let posted = match (kind, remote) {
            (Kind::Send, _) => {
                fill(&mut head, sd, 0);
                sq.send(head, o)
            }
            (Kind::Write { imm: with }, Some(r)) => {
                fill(&mut head, sd, 0);
                match with {
                    true => sq.write(head, r, o.imm(imm)),
                    false => sq.write(head, r, o),
                }
            }
            (Kind::ReadBack { .. } | Kind::Read { .. }, Some(r)) => {
                head.fill(POISON);
                sq.read(head, r, o)
            }
            _ => unreachable!("every remote kind has its region"),
        };
        self.submit(i, posted, kind, len, tail)
    }

    fn post_atomic(&mut self, i: usize, op: Atomic, remote: RemoteMemory) -> Result<(), String> {
        let (mut head, tail) = self.take(8);
        head.fill(POISON);
        let wr_id = self.next_wr;
        self.next_wr += 1;
        let (o, sq) = (Wr::id(wr_id), &mut self.qps[i].sq);
        let posted = match op {
            Atomic::FetchAdd(d) => sq.fetch_and_add(head, remote, d, o),
            Atomic::CompareSwap { compare, swap } => {
                sq.compare_and_swap(head, remote, compare, swap, o)
            }
        };
        let cas = matches!(op, Atomic::CompareSwap { .. });
        self.submit(i, posted, Kind::Atomic { cas }, 8, tail)
    }

    fn submit(
        &mut self,
        i: usize,
        posted: Posted,
        kind: Kind,
        len: usize,
        tail: LocalBuffer,
    ) -> Result<(), String> {
        let wr_id = self.next_wr - 1;
        match posted {
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
                if let Buf::Local(b) = e.buf {
                    if let Ok(b) = b.unsplit(tail) {
                        self.pool.push(b);
                    }
                }
                Err(msg)
            }
        }
    }
}

/// How a result the device completed without writing is described (the
/// report counts these apart: `xtask/src/soak/report.rs`).
const NEVER_WRITTEN: &str = "never written (the poison from before posting still there)";

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
                    // Our buffer never written, the slot's previous write
                    // still there, or zeros (the slot never written)?
                    let part = &head[at..p.len.min(at + 1024)];
                    let what = match before {
                        _ if poisoned(part) => NEVER_WRITTEN,
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
            Some((at, bad)) => {
                let what = match poisoned(&head[at..p.len.min(at + 1024)]) {
                    true => NEVER_WRITTEN,
                    false => "other bytes there",
                };
                Err(format!(
                    "read of {} B at {offset}: {bad} bytes differ, the first at {at}: {what}",
                    p.len
                ))
            }
        },
        Kind::Atomic { .. } => match &head[..8] {
            h if poisoned(h) => s.counter.complete_unwritten(),
            h => s
                .counter
                .complete(u64::from_ne_bytes(h.try_into().expect("8 bytes"))),
        },
    };
    *t.ops.entry(name).or_default() += 1;
    t.bytes += p.len as u64;
    result
}
