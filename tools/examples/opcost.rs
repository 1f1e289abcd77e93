//! The per-operation cost probe of `cargo xtask instr`: N RC queue pairs,
//! each connected to itself, sharing one CQ per thread; every round posts
//! `depth` signaled RDMA writes of `size` bytes on every queue pair, sleeps
//! until the device has completed them, and polls them in batches of 16.
//! `xtask/c/opcost.c` is the same program on libibverbs in C.
//!
//! ```text
//! opcost --path request|prepared|raw|floor-prepared|floor-request [--qps N] [--depth D] [--threads T]
//!        [--rounds R] [--size BYTES] [--events] [--shared-cq] [--calibrate K]
//!        [-d DEV] [-i PORT] [-x GID]
//! ```
//!
//! With `--shared-cq` every thread's queue pairs report to one CQ: each
//! round, every thread posts, all wait until all have posted and slept,
//! then each polls as many completions as it posted (whoever's they are:
//! every poll comes back full), and all wait again before the next round
//! (a prepared request is re-posted only after its completion was claimed,
//! by any thread). For the paths whose completions need nothing of the
//! thread that posted: prepared, raw, floor-prepared.
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
//! [`PreparedSend`](rdma_verbs::qp::PreparedSend) on the handle; `raw` posts a reused
//! C work request through the unsafe raw path. `floor-prepared` and
//! `floor-request` measure what the guarantees of those two paths cost at
//! least: the same in-flight slot protocol, checks and buffer moves written
//! by hand on the raw path, as tightly as we could (module `floor`). One
//! line of `key=value` results goes to stdout (setup and teardown times,
//! RSS, counts).

use std::hint::black_box;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use rdma_verbs::{
    cq::{CompletionChannel, WorkCompletion},
    device::GidIndex,
    qp::PreparedSend,
    AccessFlags, CompletionQueue, Completions, ConnectOptions, Context, Endpoint, LocalBuffer,
    LocalPort, PortNumber, QpType, QueuePair, RemoteMemory, SendQueue, SendRequest, SharedBuffer,
    Wr,
};
use rdma_verbs_sys as sys;

type Error = Box<dyn std::error::Error + Send + Sync>;
type Result<T, E = Error> = std::result::Result<T, E>;

/// Completions taken per poll (perftest's batch).
const BATCH: usize = 16;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Path {
    Request,
    Prepared,
    Raw,
    FloorPrepared,
    FloorRequest,
}

impl Path {
    fn name(self) -> &'static str {
        match self {
            Path::Request => "request",
            Path::Prepared => "prepared",
            Path::Raw => "raw",
            Path::FloorPrepared => "floor-prepared",
            Path::FloorRequest => "floor-request",
        }
    }
}

struct Args {
    path: Path,
    qps: usize,
    depth: usize,
    threads: usize,
    rounds: u64,
    size: usize,
    events: bool,
    shared_cq: bool,
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
        shared_cq: false,
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
                    "floor-prepared" => Path::FloorPrepared,
                    "floor-request" => Path::FloorRequest,
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
            "--shared-cq" => a.shared_cq = true,
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
    if a.shared_cq
        && (a.events || !matches!(a.path, Path::Prepared | Path::Raw | Path::FloorPrepared))
    {
        return Err(
            "--shared-cq takes the prepared, raw and floor-prepared paths, no --events".into(),
        );
    }
    if a.shared_cq && (a.qps / a.threads * a.depth) % BATCH != 0 {
        // Each thread takes what it posted in full polls.
        return Err(
            "--shared-cq: each thread's requests per round must be a multiple of 16".into(),
        );
    }
    if a.events && matches!(a.path, Path::Raw) {
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
    /// The floor paths' queues, requests and slots.
    fqs: Vec<floor::Queue>,
    fprepared: Vec<floor::Prepared>,
    store: floor::Store,
    remote: RemoteMemory,
    comps: Completions,
    wcs: [WorkCompletion; BATCH],
    /// With a shared CQ: what the lanes share.
    sync: Option<std::sync::Arc<Shared>>,
    short_polls: u64,
    polls: u64,
}

/// What the lanes of a shared CQ share: a rendezvous, their number and
/// the completions all of them took so far.
struct Shared {
    cq: CompletionQueue,
    barrier: std::sync::Barrier,
    threads: usize,
    taken: std::sync::atomic::AtomicUsize,
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
            if wc.status() != rdma_verbs::WcStatus::Success {
                return Err(format!("write failed: {:?}", wc.status()).into());
            }
        }
        Ok(n)
    }
);

path!(
    /// The prepared path's guarantees, by hand (module `floor`).
    floor_prepared,
    reqs(lane) -> (floor::Queue, floor::Prepared) { (&mut lane.fqs, &mut lane.fprepared) },
    post(q, p) {
        q.post_prepared(p)
    },
    poll(lane) {
        // SAFETY: only the floor's requests are posted to this lane's
        // queue pairs, the only ones reporting to its CQ.
        let n = unsafe { lane.cq.poll_raw(&mut lane.wcs) }?;
        for wc in floor::raw_wcs(&mut lane.wcs[..n]) {
            if let Some(slot) = lane.store.claim(wc) {
                slot.free();
            }
            if wc.status != sys::IBV_WC_SUCCESS {
                return Err(format!("write failed: {}", wc.status).into());
            }
        }
        Ok(n)
    }
);

path!(
    /// The request path's guarantees, by hand (module `floor`).
    floor_request,
    reqs(lane) -> (floor::Queue, Owned) { (&mut lane.fqs, &mut lane.owned) },
    post(q, r) {
        let buf = r.buf.take().ok_or("buffer not back")?;
        q.write(buf, r.remote, r.wr_id)
    },
    poll(lane) {
        // SAFETY: as in `floor_prepared`.
        let n = unsafe { lane.cq.poll_raw(&mut lane.wcs) }?;
        let owned = &mut lane.owned;
        for wc in floor::raw_wcs(&mut lane.wcs[..n]) {
            let back = lane.store.claim(wc).and_then(floor::Slot::take_and_free);
            if wc.status != sys::IBV_WC_SUCCESS {
                return Err(format!("write failed: {}", wc.status).into());
            }
            let r = owned.get_mut(wc.wr_id as usize).ok_or("unknown wr_id")?;
            r.buf = back;
        }
        Ok(n)
    }
);

/// The floor: what the prepared and request paths guarantee, written by
/// hand on the unsafe raw path as tightly as we could, to measure what the
/// guarantees cost at least (`cargo xtask instr` reports it beside the
/// paths). Not the library's code and not a design to copy: one flat store
/// per lane, signaled requests only (no flag for unsignaled requests,
/// address handles or windows), no teardown protocol. What it keeps of
/// DESIGN.md's in-flight store: a slot per outstanding request whose state
/// is the request's `wr_id` (bit 63, a generation, the slot's index),
/// filled and published before the doorbell, taken back when the provider
/// refuses; one compare-and-swap of the completion's `wr_id` claims it
/// (stale, duplicate and foreign ids fail, an index outside the store is
/// refused before any access), the caller's `wr_id` restored, the buffer
/// taken out, the slot freed. The request path adds the checks a safe post
/// owes (the buffer's registration, its length), the C request's
/// per-operation fields, and the buffer moved into the slot and back out.
mod floor {
    use std::cell::UnsafeCell;
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;

    const OURS: u64 = 1 << 63;
    const FREE: u64 = 0;
    const CLAIMING: u64 = 1;

    /// One request's place (one cache line).
    #[repr(C, align(64))]
    #[derive(Default)]
    pub struct Slot {
        state: AtomicU64,
        user: UnsafeCell<u64>,
        buf: UnsafeCell<Option<LocalBuffer>>,
    }

    /// The lane's slots; a queue owns `depth` of them from `first` on.
    /// Never freed (as the library's store): a queue's slots outlive it.
    #[derive(Default)]
    pub struct Store {
        slots: &'static [Slot],
    }

    impl Store {
        pub fn new(n: usize) -> Store {
            Store {
                slots: Box::leak((0..n).map(|_| Slot::default()).collect()),
            }
        }

        /// Claims the slot `wc`'s `wr_id` names and restores the caller's
        /// `wr_id`; `None` (the entry left as it is, an orphan) for an id of
        /// no outstanding request.
        #[inline(always)]
        pub fn claim(&self, wc: &mut sys::ibv_wc) -> Option<&'static Slot> {
            let id = wc.wr_id;
            if id & OURS == 0 {
                return None;
            }
            let slot = self.slots.get(id as u32 as usize)?;
            slot.state
                .compare_exchange(id, CLAIMING, Ordering::Acquire, Ordering::Relaxed)
                .ok()?;
            // SAFETY: the swap gave this poller the slot until FREE.
            wc.wr_id = unsafe { *slot.user.get() };
            Some(slot)
        }
    }

    impl Slot {
        /// Frees a claimed slot (its buffer taken or never there).
        #[inline(always)]
        pub fn free(&self) {
            self.state.store(FREE, Ordering::Release);
        }

        /// Takes a claimed slot's buffer out and frees it.
        #[inline(always)]
        pub fn take_and_free(&self) -> Option<LocalBuffer> {
            // SAFETY: claimed: ours until FREE; the read leaves `None`
            // behind, so the buffer is not owned twice.
            let b = unsafe { std::ptr::replace(self.buf.get(), None) };
            self.free();
            b
        }
    }

    // SAFETY: a slot's fields are touched only by whoever its state word
    // gives them to (the owning queue while FREE, the claimer while
    // CLAIMING), with Acquire/Release on the word.
    unsafe impl Sync for Slot {}

    /// A queue pair's send side: its ring of slots and its C request.
    pub struct Queue {
        qp: QueuePair,
        /// The slot of position 0.
        base: *const Slot,
        depth: u32,
        head: u32,
        /// The `wr_id` of position 0 in the current lap.
        lap: u64,
        /// Which queue this is (a prepared request names its own).
        id: u32,
        /// Stands for the protection domain: the lkey of the lane's
        /// registration.
        lkey: u32,
        wr: sys::ibv_send_wr,
        sge: sys::ibv_sge,
    }

    // SAFETY: the slots are the lane's, used by one thread at a time.
    unsafe impl Send for Queue {}

    impl Queue {
        pub fn new(
            qp: &QueuePair,
            store: &Store,
            first: usize,
            depth: usize,
            lkey: u32,
            remote: RemoteMemory,
        ) -> Queue {
            let mut wr = sys::ibv_send_wr {
                opcode: sys::IBV_WR_RDMA_WRITE,
                num_sge: 1,
                send_flags: sys::ibv_send_flags::IBV_SEND_SIGNALED.0,
                ..Default::default()
            };
            wr.wr.rdma = sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 {
                remote_addr: remote.addr,
                rkey: remote.rkey.0,
            };
            Queue {
                qp: qp.clone(),
                base: &store.slots[first],
                depth: depth as u32,
                head: 0,
                lap: OURS | first as u64,
                id: first as u32,
                lkey,
                wr,
                sge: sys::ibv_sge::default(),
            }
        }

        /// The head's slot, if free, and its `wr_id`.
        #[inline(always)]
        fn reserve(&self) -> Option<(&'static Slot, u64)> {
            // SAFETY: `head` < `depth`: inside the queue's share of the
            // store, which is never freed.
            let slot = unsafe { &*self.base.add(self.head as usize) };
            if slot.state.load(Ordering::Acquire) != FREE {
                return None;
            }
            Some((slot, self.lap + u64::from(self.head)))
        }

        #[inline(always)]
        fn advance(&mut self) {
            self.head += 1;
            if self.head == self.depth {
                self.head = 0;
                self.lap = self.lap.wrapping_add(1 << 32) | OURS;
            }
        }

        #[inline(always)]
        pub fn post_prepared(&mut self, p: &mut Prepared) -> Result<()> {
            if p.queue != self.id {
                return Err(refused("a prepared request of another queue"));
            }
            let Some((slot, id)) = self.reserve() else {
                return Err(refused("queue full"));
            };
            // SAFETY: a FREE slot of this ring is ours until published.
            unsafe { *slot.user.get() = p.user };
            slot.state.store(id, Ordering::Release);
            p.wr.wr_id = id;
            // SAFETY: one request; its SGE names a registered buffer the
            // prepared request keeps until `last` completed.
            if let Err(e) = unsafe { self.qp.post_send_raw(&mut p.wr) } {
                slot.state.store(FREE, Ordering::Release);
                return Err(e.into());
            }
            p.last = id;
            self.advance();
            Ok(())
        }

        #[inline(always)]
        pub fn write(&mut self, buf: LocalBuffer, remote: RemoteMemory, user: u64) -> Result<()> {
            if buf.lkey() != self.lkey || buf.len() > u32::MAX as usize {
                return Err(refused("not this protection domain, or too long"));
            }
            let Some((slot, id)) = self.reserve() else {
                return Err(refused("queue full"));
            };
            self.sge = sys::ibv_sge {
                addr: buf.addr(),
                length: buf.len() as u32,
                lkey: buf.lkey(),
            };
            self.wr.wr_id = id;
            self.wr.sg_list = &mut self.sge;
            self.wr.opcode = sys::IBV_WR_RDMA_WRITE;
            self.wr.send_flags = sys::ibv_send_flags::IBV_SEND_SIGNALED.0;
            self.wr.wr.rdma = sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 {
                remote_addr: remote.addr,
                rkey: remote.rkey.0,
            };
            // SAFETY: a FREE slot of this ring is ours until published;
            // its buffer is `None`.
            unsafe {
                *slot.user.get() = user;
                std::ptr::write(slot.buf.get(), Some(buf));
            }
            slot.state.store(id, Ordering::Release);
            // SAFETY: one request; its SGE names the buffer the slot owns.
            if let Err(e) = unsafe { self.qp.post_send_raw(&mut self.wr) } {
                // SAFETY: never reached the device: still ours.
                drop(unsafe { (*slot.buf.get()).take() });
                slot.state.store(FREE, Ordering::Release);
                return Err(e.into());
            }
            self.advance();
            Ok(())
        }
    }

    #[cold]
    #[inline(never)]
    fn refused(why: &str) -> Error {
        why.into()
    }

    /// A request built once and re-posted: its buffer stays in it.
    pub struct Prepared {
        wr: sys::ibv_send_wr,
        user: u64,
        queue: u32,
        /// The `wr_id` of its last posting (it may be dropped once that
        /// one completed).
        last: u64,
        _sge: Box<sys::ibv_sge>,
        _buf: LocalBuffer,
    }

    impl Prepared {
        pub fn new(q: &Queue, buf: LocalBuffer, remote: RemoteMemory, user: u64) -> Prepared {
            let mut sge = Box::new(sys::ibv_sge {
                addr: buf.addr(),
                length: buf.len() as u32,
                lkey: buf.lkey(),
            });
            let mut wr = q.wr;
            wr.sg_list = &mut *sge;
            wr.wr.rdma = sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 {
                remote_addr: remote.addr,
                rkey: remote.rkey.0,
            };
            Prepared {
                wr,
                user,
                queue: q.id,
                last: 0,
                _sge: sge,
                _buf: buf,
            }
        }
    }

    /// The entries as the C structs they are.
    pub fn raw_wcs(wcs: &mut [WorkCompletion]) -> &mut [sys::ibv_wc] {
        // SAFETY: WorkCompletion is repr(transparent) over ibv_wc.
        unsafe { std::slice::from_raw_parts_mut(wcs.as_mut_ptr().cast(), wcs.len()) }
    }
}

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
        Path::FloorPrepared => run_path::<floor_prepared::P>(lane, rounds, calibrate, events),
        Path::FloorRequest => run_path::<floor_request::P>(lane, rounds, calibrate, events),
    }
}

fn run_path<P: Ops>(lane: &mut Lane, rounds: u64, calibrate: u64, events: bool) -> Result<()> {
    for _ in 0..calibrate {
        if !P::empty(lane)? {
            return Err("calibration found a completion".into());
        }
    }
    // Nobody posts on a shared CQ before every lane calibrated.
    if let Some(sh) = &lane.sync {
        sh.barrier.wait();
    }
    let per_round = P::reqs(lane).1.len();
    let depth = lane.depth;
    // Settling time per outstanding request; doubled when a poll comes
    // back short (counted), so the counts stay deterministic.
    let mut settle = Duration::from_micros(40);
    for round in 0..rounds as usize {
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
        if let Some(sh) = lane.sync.clone() {
            run_shared::<P>(lane, &sh, round, per_round, settle)?;
            continue;
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

/// The rest of a round on a shared CQ, after the lane posted: all lanes
/// wait for each other and sleep, then poll until all the round's
/// completions were taken (by whichever lane), and wait for each other
/// again so that nothing is re-posted before it was claimed. A poll that
/// another lane left short is counted short. A lane that fails ends the
/// process: the others would wait for it forever.
fn run_shared<P: Ops>(
    lane: &mut Lane,
    sh: &Shared,
    round: usize,
    per_round: usize,
    settle: Duration,
) -> Result<()> {
    use std::sync::atomic::Ordering::Relaxed;
    let fail = |e: Error| -> ! {
        eprintln!("opcost: {e}");
        std::process::exit(1)
    };
    sh.barrier.wait();
    std::thread::sleep(settle * (per_round * sh.threads) as u32);
    sh.barrier.wait();
    let goal = (round + 1) * per_round * sh.threads;
    let started = Instant::now();
    loop {
        let got = sh.taken.load(Relaxed);
        if got >= goal {
            break;
        }
        let want = BATCH.min(goal - got);
        let n = P::poll(lane).unwrap_or_else(|e| fail(e));
        lane.polls += 1;
        sh.taken.fetch_add(n, Relaxed);
        if n < want {
            lane.short_polls += 1;
            std::thread::sleep(Duration::from_micros(100));
            if started.elapsed() > Duration::from_secs(30) {
                fail(format!("only {got} of {goal} completions in 30 s").into());
            }
        }
    }
    sh.barrier.wait();
    Ok(())
}

fn build_lane(
    ctx: &Context,
    pd: &rdma_verbs::ProtectionDomain,
    a: &Args,
    port: PortNumber,
    gid: GidIndex,
    remote: RemoteMemory,
    shared: Option<&std::sync::Arc<Shared>>,
) -> Result<Lane> {
    let per = a.qps / a.threads;
    let channel = if a.events {
        Some(ctx.create_comp_channel()?)
    } else {
        None
    };
    // The receive queue (one entry, never used) counts too.
    let cqe = (per * (a.depth + 1)) as u32;
    let cq = match (&channel, shared) {
        (_, Some(sh)) => sh.cq.clone(),
        (Some(ch), None) => ctx.create_cq(cqe).channel(ch).build()?,
        (None, None) => ctx.create_cq(cqe).build()?,
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
        fqs: Vec::new(),
        fprepared: Vec::new(),
        store: floor::Store::default(),
        remote,
        comps: Completions::with_capacity(BATCH),
        wcs: [WorkCompletion::default(); BATCH],
        sync: shared.cloned(),
        short_polls: 0,
        polls: 0,
    })
}

/// Registers the lane's request buffers and builds the requests of its path.
fn fill_lane(lane: &mut Lane, pd: &rdma_verbs::ProtectionDomain, a: &Args) -> Result<()> {
    let n = lane.qps.len() * a.depth;
    let mut rest = pd.alloc(n * a.size, AccessFlags::LOCAL_WRITE)?;
    let mut bufs = Vec::with_capacity(n);
    for _ in 0..n {
        let (head, tail) = rest.split_at(a.size);
        bufs.push(head);
        rest = tail;
    }
    match a.path {
        Path::Request | Path::Prepared => {
            for qp in &lane.qps {
                lane.sqs.push(qp.send_queue()?);
            }
        }
        Path::FloorPrepared | Path::FloorRequest => {
            lane.store = floor::Store::new(n);
            let lkey = bufs.first().map_or(0, LocalBuffer::lkey);
            for (i, qp) in lane.qps.iter().enumerate() {
                let q = floor::Queue::new(qp, &lane.store, i * a.depth, a.depth, lkey, lane.remote);
                lane.fqs.push(q);
            }
        }
        Path::Raw => {}
    }
    for (i, buf) in bufs.into_iter().enumerate() {
        match a.path {
            Path::Request | Path::FloorRequest => lane.owned.push(Owned {
                buf: Some(buf),
                remote: lane.remote,
                wr_id: i as u64,
            }),
            Path::Prepared => {
                let sq = &mut lane.sqs[i / a.depth];
                let p = sq.prepare(SendRequest::write(buf, lane.remote).wr_id(i as u64))?;
                lane.prepared.push(p);
            }
            Path::FloorPrepared => {
                let p = floor::Prepared::new(&lane.fqs[i / a.depth], buf, lane.remote, i as u64);
                lane.fprepared.push(p);
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
    let list = rdma_verbs::devices()?;
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
    // One CQ for every lane, as deep as all their queues.
    let shared = if a.shared_cq {
        let cqe = (a.qps * (a.depth + 1)) as u32;
        Some(std::sync::Arc::new(Shared {
            cq: ctx.create_cq(cqe).build()?,
            barrier: std::sync::Barrier::new(a.threads),
            threads: a.threads,
            taken: std::sync::atomic::AtomicUsize::new(0),
        }))
    } else {
        None
    };
    let mut lanes = (0..a.threads)
        .map(|_| build_lane(&ctx, &pd, &a, port, gid, remote, shared.as_ref()))
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
            .map(|lane| {
                s.spawn(move || {
                    let shared = lane.sync.is_some();
                    let r = run_lane(lane, path, rounds, calibrate, events);
                    if let (true, Err(e)) = (shared, &r) {
                        // The other lanes would wait for this one forever.
                        eprintln!("opcost: {e}");
                        std::process::exit(1);
                    }
                    r
                })
            })
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
        lane.fprepared.clear();
        lane.fqs.clear();
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
        a.path.name(),
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
