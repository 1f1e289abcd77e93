//! [`AsyncQueuePair`]: a queue pair whose work requests are futures, and
//! the dispatcher its futures share (see the crate's documentation).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context as TaskContext, Poll, Wake, Waker};

use rdma_verbs::{
    cq::CompletionChannel,
    memory::SgList,
    qp::{Owner, Refused},
    Completion, CompletionQueue, Completions, QueuePair, RecvQueue, RecvRequest, SendQueue,
    SendRequest,
};

use crate::error::{Error, Result};
use crate::reactor::{lock, register, Registered};

mod requests;
use requests::{index, Requests, Slot, Wakers};

/// The owner tag the dispatchers put on their requests: private to this
/// crate, so a request posted any other way is never taken for one of the
/// dispatchers', whatever its `wr_id`.
static DISPATCHER: OnceLock<Owner> = OnceLock::new();

/// The dispatchers' owner tag, made by the first dispatcher.
fn dispatcher() -> rdma_verbs::Result<Owner> {
    if let Some(&owner) = DISPATCHER.get() {
        return Ok(owner);
    }
    let made = Owner::new()?;
    // Two first dispatchers at once may each make one: the first stored
    // is kept.
    Ok(*DISPATCHER.get_or_init(|| made))
}

/// Completions taken per `ibv_poll_cq` call.
const POLL_BATCH: usize = 32;

/// The dispatchers' tags (the high half of their `wr_id`s, see
/// [`requests`]). A completion is matched to a future only when its slot
/// says a dispatcher posted it (its owner tag, [`DISPATCHER`]) and its
/// `wr_id` carries this dispatcher's tag: a request posted directly on the
/// queue pair, or by an earlier dispatcher of it, never resolves a future.
static NEXT_TAG: AtomicU32 = AtomicU32::new(1);

/// A new dispatcher's tag: never 0 (wraps after 2^32 - 1 dispatchers).
fn next_tag() -> u32 {
    loop {
        let tag = NEXT_TAG.fetch_add(1, Ordering::Relaxed);
        if tag != 0 {
            return tag;
        }
    }
}

/// The wakers of the futures waiting on one queue pair, by slot (see
/// [`Wakers`]). As a [`Waker`] itself (given to the reactor) it wakes all
/// of them.
struct Waiters {
    wakers: Mutex<Wakers<Waker>>,
    /// Reused to wake outside the lock without allocating. Taken with
    /// `try_lock`: a waker that runs its task at once finds it busy and
    /// wakes from a new list.
    spare: Mutex<Vec<Waker>>,
}

impl Waiters {
    fn new() -> Self {
        Waiters {
            wakers: Mutex::new(Wakers::new()),
            spare: Mutex::new(Vec::new()),
        }
    }

    fn set(&self, slot: usize, waker: &Waker) {
        let old = lock(&self.wakers).set(slot, |w| w.will_wake(waker), || waker.clone());
        drop(old); // outside the lock: dropping a waker may run task code
    }

    /// Wakes the wakers `pick` copies out of the set, outside its lock.
    fn wake_picked(&self, pick: impl FnOnce(&Wakers<Waker>, &mut Vec<Waker>)) {
        let mut fresh = Vec::new();
        let mut spare = self.spare.try_lock().ok();
        let list = spare.as_deref_mut().unwrap_or(&mut fresh);
        pick(&lock(&self.wakers), list);
        list.drain(..).for_each(Waker::wake);
    }

    fn wake_ids(&self, ids: &[u64]) {
        if !ids.is_empty() {
            self.wake_picked(|set, list| {
                list.extend(ids.iter().filter_map(|&id| set.get(index(id)).cloned()))
            });
        }
    }

    fn wake_every(&self) {
        self.wake_picked(|set, list| list.extend(set.all().cloned()));
    }
}

impl Wake for Waiters {
    fn wake(self: Arc<Self>) {
        self.wake_every();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.wake_every();
    }
}

struct State {
    requests: Requests<Completion>,
    batch: Completions,
    /// Whether every CQ is armed since the last consumed event.
    armed: bool,
}

/// What a drive leaves to do once the state is unlocked, kept between
/// drives so that a steady state allocates nothing.
#[derive(Default)]
struct Scratch {
    /// The futures to wake, by id.
    wake: Vec<u64>,
    /// Completions to drop: of abandoned requests, or not this
    /// dispatcher's.
    dropped: Vec<Completion>,
}

struct Shared {
    qp: QueuePair,
    /// The distinct CQs of the queue pair (send, and recv if different).
    cqs: Vec<CompletionQueue>,
    /// The distinct completion channels of those CQs, claimed and
    /// registered.
    channels: Vec<Registered<CompletionChannel>>,
    state: Mutex<State>,
    /// Reused by each poll; taken with `try_lock` (a concurrent poll
    /// uses a new one).
    scratch: Mutex<Scratch>,
    /// The queue pair's posting handles, taken at the first post (the
    /// queue pair is connected by then); posts take them in turn.
    sq: Mutex<Option<SendQueue>>,
    rq: Mutex<Option<RecvQueue>>,
    waiters: Arc<Waiters>,
    /// Given to the reactor: wakes every waiting future.
    reactor_waker: Waker,
    /// The tag of the dispatchers' requests.
    owner: Owner,
}

impl Shared {
    /// Consumes channel events, re-arms, polls the CQs until empty and files
    /// each completion under its `wr_id`. Leaves in `scratch` the ids of
    /// the futures to wake and the completions to drop after the lock is
    /// released. Leaves the reactor waker registered.
    fn drive(&self, st: &mut State, scratch: &mut Scratch) -> Result<()> {
        let mut cx = TaskContext::from_waker(&self.reactor_waker);
        for Registered { fd, .. } in &self.channels {
            while let Poll::Ready(ready) = fd.poll_read_ready(&mut cx) {
                let mut guard = ready.map_err(|source| rdma_verbs::Error::Verb {
                    verb: "epoll_wait",
                    io: source,
                })?;
                loop {
                    match fd.get_ref().get_event() {
                        // Counted for a batched acknowledgement by the CQ.
                        Ok(_cq) => st.armed = false,
                        Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => {
                            guard.clear_ready();
                            break;
                        }
                        Err(e) => return Err(e.into()),
                    }
                }
            }
        }
        if !st.armed {
            for cq in &self.cqs {
                cq.req_notify(false)?;
            }
            st.armed = true;
        }
        // Armed first, then polled until empty: a completion after the last
        // poll raises an event.
        for cq in &self.cqs {
            loop {
                let polled = cq.poll(&mut st.batch)?;
                let n = polled.len();
                for c in polled {
                    let c = c.into_owned();
                    let id = c.wr_id();
                    if !c.is_owned_by(self.owner) {
                        // Not posted through an AsyncQueuePair, whatever
                        // its wr_id: never handed to a future.
                        scratch.dropped.push(c);
                        continue;
                    }
                    match st.requests.get_mut(id) {
                        Some(slot @ Slot::Waiting) => {
                            *slot = Slot::Done(c);
                            scratch.wake.push(id);
                        }
                        Some(Slot::Abandoned) => {
                            st.requests.remove(id);
                            scratch.dropped.push(c);
                        }
                        // A second completion for a filed one (the store
                        // hands each out once: never), or an earlier
                        // dispatcher's (its tag differs).
                        Some(Slot::Done(_)) | None => scratch.dropped.push(c),
                    }
                }
                if n < POLL_BATCH {
                    break;
                }
            }
        }
        Ok(())
    }
}

/// A queue pair whose work requests are futures.
///
/// Wraps a connected (or to-be-connected) [`QueuePair`], typically RC,
/// whose send and receive CQs report to a [`CompletionChannel`]. Each
/// posting method posts at once (so receives are posted before the peer
/// sends, and requests can be pipelined) and returns a [`CompletionFuture`]
/// that resolves to the request's [`Completion`], buffers included. Cheap
/// to clone; the clones share one dispatcher.
///
/// The CQs and their channels must be dedicated to this queue pair and
/// polled only through it: completions of requests posted in other ways are
/// dropped (their buffers released), and another reader of the channel
/// would steal its events. A future resolves only with the completion of
/// the request it posted: completions are matched by a mark in the
/// request's slot that only the dispatcher sets, so a request posted on
/// [`queue_pair`](Self::queue_pair) directly with the same `wr_id` is not
/// mistaken for it. Each channel is driven by one `AsyncQueuePair` in the
/// process (all its clones), whatever the runtime: a second one is
/// refused ([`Error::AlreadyDriven`]) until the first is dropped.
///
/// # Example
/// ```no_run
/// use rdma_verbs::*;
/// use rdma_verbs_tokio::{AsyncQueuePair, Result};
/// async fn demo(pd: &ProtectionDomain, remote: RemoteMemory) -> Result<()> {
///     let ctx = pd.context();
///     let channel = ctx.create_comp_channel()?;
///     let cq = ctx.create_cq(64).channel(&channel).build()?;
///     let qp = pd.create_qp(QpType::Rc, &cq, &cq).max_send_wr(16).max_recv_wr(16).build()?;
///     // ... connect `qp` (Endpoint, QueuePair::connect) ...
///     let qp = AsyncQueuePair::new(qp)?; // inside a Tokio runtime
///     let incoming = qp.post_recv(RecvRequest::new(pd.alloc(4096, AccessFlags::LOCAL_WRITE)?))?;
///     let mut msg = pd.alloc(5, AccessFlags::LOCAL_WRITE)?;
///     msg.copy_from_slice(b"hello");
///     let sent = qp.post_send(SendRequest::send(msg))?.await?; // the send buffer comes back
///     let mut got = incoming.await?;            // the peer's message
///     println!("{} bytes: {:?}", got.byte_len(), &got.take_local().unwrap()[..5]);
///     let result = pd.alloc(8, AccessFlags::LOCAL_WRITE)?;
///     let old = qp.post_send(SendRequest::fetch_and_add(result, remote, 1))?.await?;
///     # drop((sent, old));
///     Ok(())
/// }
/// ```
///
/// # References
/// `ibv_get_cq_event(3)`, `ibv_req_notify_cq(3)`, `ibv_poll_cq(3)`,
/// `ibv_post_send(3)`, `ibv_post_recv(3)`
#[derive(Clone)]
pub struct AsyncQueuePair {
    shared: Arc<Shared>,
}

// Refused requests come back by value, as from `QueuePair::post_send`.
#[allow(clippy::result_large_err)]
impl AsyncQueuePair {
    /// Wraps `qp`: claims its CQs' completion channels for this dispatcher
    /// (process-wide, until the last clone is dropped), makes them
    /// non-blocking and registers them with the current Tokio runtime.
    ///
    /// # Errors
    /// [`rdma_verbs::Error::NoCompletionChannel`] when a CQ of `qp` has no completion
    /// channel, [`Error::NoRuntime`] when called outside a Tokio runtime;
    /// [`Error::AlreadyDriven`] when a channel is already driven by another
    /// `AsyncQueuePair` (on this runtime or another); [`rdma_verbs::Error::Verb`]
    /// naming `fcntl`, or `epoll_ctl` when the channel cannot be registered.
    ///
    /// # Panics
    /// Tokio panics when the current runtime was built without IO
    /// (`Builder::enable_io`).
    ///
    /// # References
    /// `ibv_create_comp_channel(3)`, `fcntl(2)`, `epoll_ctl(2)`
    pub fn new(qp: QueuePair) -> Result<AsyncQueuePair> {
        let owner = dispatcher()?;
        let mut cqs: Vec<CompletionQueue> = Vec::with_capacity(2);
        for cq in [qp.send_cq(), qp.recv_cq()] {
            if !cqs.iter().any(|c| c.as_ptr() == cq.as_ptr()) {
                cqs.push(cq.clone());
            }
        }
        let mut found: Vec<CompletionChannel> = Vec::with_capacity(2);
        for (cq, which) in [
            (qp.send_cq(), "AsyncQueuePair's send CQ"),
            (qp.recv_cq(), "AsyncQueuePair's receive CQ"),
        ] {
            let ch = cq
                .channel()
                .ok_or(rdma_verbs::Error::NoCompletionChannel { which })?;
            if !found.iter().any(|c| c.as_ptr() == ch.as_ptr()) {
                found.push(ch.clone());
            }
        }
        let mut channels = Vec::with_capacity(found.len());
        for ch in found {
            ch.set_nonblocking(true)?;
            channels.push(register(ch, "AsyncQueuePair")?);
        }
        let waiters = Arc::new(Waiters::new());
        Ok(AsyncQueuePair {
            shared: Arc::new(Shared {
                qp,
                cqs,
                channels,
                state: Mutex::new(State {
                    requests: Requests::new(next_tag()),
                    batch: Completions::with_capacity(POLL_BATCH),
                    armed: false,
                }),
                scratch: Mutex::new(Scratch::default()),
                sq: Mutex::new(None),
                rq: Mutex::new(None),
                reactor_waker: Waker::from(Arc::clone(&waiters)),
                waiters,
                owner,
            }),
        })
    }

    /// The wrapped queue pair (to connect it, query it, …). Requests posted
    /// on it directly are not tracked: their completions are dropped, and
    /// never resolve a future, whatever their `wr_id`.
    pub fn queue_pair(&self) -> &QueuePair {
        &self.shared.qp
    }

    /// Requests posted through this wrapper (all clones) whose completion
    /// has not been collected yet, abandoned ones included.
    pub fn outstanding(&self) -> usize {
        lock(&self.shared.state).requests.len()
    }

    fn track(&self) -> rdma_verbs::Result<u64> {
        lock(&self.shared.state)
            .requests
            .insert()
            .ok_or(rdma_verbs::Error::QueueFull {
                queue: "AsyncQueuePair's requests",
                depth: u32::MAX - 1,
            })
    }

    fn untrack(&self, id: u64) {
        lock(&self.shared.state).requests.remove(id);
    }

    fn future(&self, id: u64) -> CompletionFuture {
        CompletionFuture {
            shared: Arc::clone(&self.shared),
            id,
            finished: false,
        }
    }

    /// Posts a send-queue request now and returns the future of its
    /// completion. The request gets the dispatcher's `wr_id` (replacing its
    /// own: [`CompletionFuture::wr_id`]) and is made signaled. The first
    /// post takes the queue pair's send queue handle
    /// ([`QueuePair::send_queue`]) for the wrapper's life.
    ///
    /// # Errors
    /// As [`SendQueue::post_chain`]: the request's buffers are handed back
    /// in the [`Refused`]; [`rdma_verbs::Error::QueueFull`] when 2^32 - 1
    /// requests of the wrapper are uncollected. The future resolves to an
    /// error as described on [`CompletionFuture`].
    ///
    /// # References
    /// `ibv_post_send(3)`
    #[doc(alias = "ibv_post_send")]
    pub fn post_send(&self, wr: SendRequest<'_>) -> Result<CompletionFuture, Refused<SgList>> {
        let owner = self.shared.owner;
        self.post_through(
            &self.shared.sq,
            QueuePair::send_queue,
            wr,
            SendRequest::into_buffers,
            |sq, wr, id| sq.post(wr.wr_id(id).signaled(true).owner(owner)),
        )
    }

    /// Posts a receive request now and returns the future of its
    /// completion (the request's `wr_id` is replaced by the dispatcher's).
    /// The first post takes the receive queue's handle
    /// ([`QueuePair::recv_queue`]) for the wrapper's life.
    ///
    /// # Errors
    /// As [`RecvQueue::post_chain`], with the buffers handed back;
    /// [`rdma_verbs::Error::QueueFull`] when 2^32 - 1 requests of the wrapper
    /// are uncollected.
    ///
    /// # References
    /// `ibv_post_recv(3)`
    #[doc(alias = "ibv_post_recv")]
    pub fn post_recv(&self, wr: RecvRequest) -> Result<CompletionFuture, Refused<SgList>> {
        let owner = self.shared.owner;
        self.post_through(
            &self.shared.rq,
            QueuePair::recv_queue,
            wr,
            RecvRequest::into_buffers,
            |rq, wr, id| rq.post(wr.wr_id(id).owner(owner)),
        )
    }

    /// Posts `wr` through the handle in `handle` (opened by `open` at the
    /// first post) under a new id of the dispatcher; refused, the id is
    /// released and the buffers (`unpost`) come back.
    fn post_through<H, W>(
        &self,
        handle: &Mutex<Option<H>>,
        open: impl FnOnce(&QueuePair) -> rdma_verbs::Result<H>,
        wr: W,
        unpost: impl FnOnce(W) -> SgList,
        post: impl FnOnce(&mut H, W, u64) -> Result<(), Refused<SgList>>,
    ) -> Result<CompletionFuture, Refused<SgList>> {
        let mut handle = lock(handle);
        if handle.is_none() {
            match open(&self.shared.qp) {
                Ok(h) => *handle = Some(h),
                Err(error) => {
                    return Err(Refused {
                        error,
                        buf: unpost(wr),
                    })
                }
            }
        }
        let h = handle.as_mut().expect("opened above");
        let id = match self.track() {
            Ok(id) => id,
            Err(error) => {
                return Err(Refused {
                    error,
                    buf: unpost(wr),
                })
            }
        };
        match post(h, wr, id) {
            Ok(()) => Ok(self.future(id)),
            Err(refused) => {
                self.untrack(id);
                Err(refused)
            }
        }
    }
}

impl std::fmt::Debug for AsyncQueuePair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncQueuePair")
            .field("qp", &self.shared.qp)
            .field("outstanding", &self.outstanding())
            .finish()
    }
}

/// The completion of one request posted through an [`AsyncQueuePair`].
///
/// Resolves to the [`Completion`] (take the buffers back with
/// [`Completion::take_local`] and friends). Dropping it before it resolved
/// cancels nothing on the device: the request stays posted, the queue pair
/// keeps its buffers until its completion arrives, and the dispatcher then
/// drops that completion (releasing the buffers). An abandoned receive
/// still consumes the next incoming message.
///
/// # Example
/// ```no_run
/// # async fn demo(qp: &rdma_verbs_tokio::AsyncQueuePair, buf: rdma_verbs::LocalBuffer) -> rdma_verbs_tokio::Result<()> {
/// let pending = qp.post_recv(rdma_verbs::RecvRequest::new(buf))?; // posted here
/// let mut c = pending.await?;    // completed successfully
/// let buf = c.take_local().expect("the receive buffer");
/// # drop(buf); Ok(()) }
/// ```
///
/// # Errors
/// [`rdma_verbs::Error::WorkCompletion`] when the request completed with an error
/// status (its buffers are released); [`rdma_verbs::Error::Verb`] naming
/// `ibv_get_cq_event`, `ibv_req_notify_cq`, `ibv_poll_cq` or `epoll_wait`
/// when the dispatcher fails (the request is then abandoned);
/// [`Error::PolledAfterCompletion`] when polled again after it resolved.
///
/// # References
/// `ibv_poll_cq(3)`
#[must_use = "dropping the future abandons the completion (the request stays posted)"]
pub struct CompletionFuture {
    shared: Arc<Shared>,
    id: u64,
    finished: bool,
}

impl CompletionFuture {
    /// The `wr_id` the request was posted with (what [`Completion::wr_id`]
    /// reports): unique among the wrapper's uncollected requests, and never
    /// another wrapper's.
    pub fn wr_id(&self) -> u64 {
        self.id
    }
}

impl Future for CompletionFuture {
    type Output = Result<Completion>;

    fn poll(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Result<Completion>> {
        let this = self.get_mut();
        if this.finished {
            return Poll::Ready(Err(Error::PolledAfterCompletion));
        }
        let shared = &*this.shared;
        let slot = index(this.id);
        // Registered before driving: a wake-up between driving and
        // returning Pending is not lost.
        shared.waiters.set(slot, cx.waker());
        let mut fresh = Scratch::default();
        let mut spare = shared.scratch.try_lock().ok();
        let scratch = spare.as_deref_mut().unwrap_or(&mut fresh);
        let mut st = lock(&shared.state);
        let mut done = st.requests.take_done(this.id);
        let mut failed = None;
        if done.is_none() {
            match shared.drive(&mut st, scratch) {
                Ok(()) => done = st.requests.take_done(this.id),
                Err(e) => {
                    // Not collected here any more: a later completion is dropped.
                    if let Some(s) = st.requests.get_mut(this.id) {
                        *s = Slot::Abandoned;
                    }
                    failed = Some(e);
                }
            }
        }
        this.finished = done.is_some() || failed.is_some();
        // Removed in the critical section that frees or abandons the slot
        // (see `Wakers`).
        let own = match this.finished {
            true => lock(&shared.waiters.wakers).remove(slot),
            false => None,
        };
        drop(st);
        drop(own);
        scratch.dropped.clear();
        scratch.wake.retain(|&id| id != this.id);
        shared.waiters.wake_ids(&scratch.wake);
        scratch.wake.clear();
        if let Some(e) = failed {
            // Every waiting future drives in turn and reports the failure.
            shared.waiters.wake_every();
            return Poll::Ready(Err(e));
        }
        match done {
            Some(c) => Poll::Ready(c.result().map(|()| c).map_err(Error::from)),
            None => Poll::Pending,
        }
    }
}

impl Drop for CompletionFuture {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        let (leftover, waker) = {
            let mut st = lock(&self.shared.state);
            let leftover = match st.requests.get_mut(self.id) {
                Some(slot @ Slot::Waiting) => {
                    *slot = Slot::Abandoned;
                    None
                }
                Some(Slot::Done(_)) => st.requests.remove(self.id),
                _ => None,
            };
            // With the slot's change (see `Wakers`).
            let waker = lock(&self.shared.waiters.wakers).remove(index(self.id));
            (leftover, waker)
        };
        drop((leftover, waker));
    }
}

impl std::fmt::Debug for CompletionFuture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompletionFuture")
            .field("wr_id", &self.id)
            .field("finished", &self.finished)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reactor_waker_wakes_every_waiter() {
        struct Count(std::sync::atomic::AtomicUsize);
        impl Wake for Count {
            fn wake(self: Arc<Self>) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let count = Arc::new(Count(0.into()));
        let waiters = Arc::new(Waiters::new());
        let w = Waker::from(Arc::clone(&count));
        waiters.set(1, &w);
        waiters.set(2, &w);
        waiters.set(2, &w); // same waker: kept
        Waker::from(Arc::clone(&waiters)).wake_by_ref();
        assert_eq!(count.0.load(Ordering::SeqCst), 2);
        waiters.wake_ids(&[2, 3]);
        assert_eq!(count.0.load(Ordering::SeqCst), 3);
        lock(&waiters.wakers).remove(1);
        lock(&waiters.wakers).remove(2);
        Waker::from(Arc::clone(&waiters)).wake();
        assert_eq!(count.0.load(Ordering::SeqCst), 3);
    }
}
