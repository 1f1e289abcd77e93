//! A request table: the caller's value for each outstanding request, handed
//! back with its completion; and send streams that signal every Nth send.
//!
//! The table is bookkeeping of values only. The buffers of a request
//! travel as everywhere else (DESIGN.md, "Posting moves the buffer; the
//! completion gives it back"): into the queue's in-flight slot when
//! posted, back in the [`Completion`]. A value `T` is never given to the
//! device, so handing one back early or late could never expose memory;
//! the table still hands each value back exactly once, with the
//! completion of its own request.
//!
//! The slot travels in the caller's `wr_id` (which the library gives back
//! in each completion, whatever tag the device saw):
//!
//! ```text
//! bits 63..40 = table id (24 bits, never 0) | bits 39..24 = generation | bits 23..0 = slot index
//! ```
//!
//! A slot's generation advances each time it is freed, and table ids are
//! not reused before 2^24 - 1 more tables were created, so a completion
//! that is not the table's (posted elsewhere, an orphan, a copied `wr_id`
//! of a retired request) never matches a live slot by accident: it is
//! handed back as [`Reaped::Foreign`], never attributed to a value.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use std::collections::VecDeque;

use crate::error::{Error, Result};
use rdma_verbs::{
    Completion, CompletionQueue, Completions, QueuePair, RecvQueue, RecvRequest, SendQueue,
    SendRequest,
};

const IDX_BITS: u32 = 24;
const IDX_MASK: u64 = (1 << IDX_BITS) - 1;
const GEN_SHIFT: u32 = IDX_BITS;
const ID_SHIFT: u32 = 40;
const ID_MASK: u32 = (1 << 24) - 1;
/// No slot (end of a chain).
const NONE: u32 = u32::MAX;
/// The largest capacity: slot indices fit in 24 bits, below [`NONE`].
pub(crate) const MAX_CAPACITY: u32 = (1 << IDX_BITS) - 1;

static NEXT_TABLE_ID: AtomicU32 = AtomicU32::new(1);
/// Tables' serial numbers, never reused: what a [`SendStream`] checks its
/// table by (its chains name the table's slots).
static NEXT_SERIAL: AtomicU64 = AtomicU64::new(1);

/// A process-unique (until 2^24 - 1 more tables) nonzero table id.
fn next_table_id() -> u32 {
    loop {
        let id = NEXT_TABLE_ID.fetch_add(1, Ordering::Relaxed) & ID_MASK;
        if id != 0 {
            return id;
        }
    }
}

/// The `wr_id` of slot `idx` at generation `gen` of table `id`.
#[inline]
fn encode(id: u32, gen: u16, idx: u32) -> u64 {
    (u64::from(id) << ID_SHIFT) | (u64::from(gen) << GEN_SHIFT) | u64::from(idx)
}

/// (table id, generation, slot index) of a `wr_id`.
#[inline]
fn decode(wr_id: u64) -> (u32, u16, u32) {
    (
        (wr_id >> ID_SHIFT) as u32 & ID_MASK,
        (wr_id >> GEN_SHIFT) as u16,
        (wr_id & IDX_MASK) as u32,
    )
}

/// What a slot holds.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum State {
    Free,
    /// A request with a completion of its own: its value goes back with it.
    Signaled,
    /// An unsignaled stream request: its value goes back when the signaled
    /// request after it completes ([`Reaped::Covered`]), or with its own
    /// (error) completion.
    Unsignaled,
    /// An unsignaled request whose own error completion already gave its
    /// value back: the slot waits for the walk of its covering request
    /// (which frees it) so that chains stay intact.
    Reported,
}

struct Slot<T> {
    value: Option<T>,
    gen: u16,
    state: State,
    /// Signaled: the oldest unsignaled request it covers. Unsignaled or
    /// reported: the next (newer) one of the same chain. [`NONE`] if none.
    link: u32,
}

/// The unsignaled requests of one stream that no signaled request covers
/// yet, oldest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Chain {
    head: u32,
    tail: u32,
}

impl Chain {
    const EMPTY: Chain = Chain {
        head: NONE,
        tail: NONE,
    };
}

/// What the core makes of a completion (`C`: [`Completion`], or a
/// stand-in in unit tests).
#[derive(Debug, PartialEq, Eq)]
enum Event<T, C> {
    Done(T, C),
    Covered(T),
    Foreign(C),
}

/// The slot bookkeeping, free of verbs (unit-tested on the host).
struct Core<T, C> {
    id: u32,
    serial: u64,
    slots: Box<[Slot<T>]>,
    /// Free slot indices (a stack; allocated once at full capacity).
    free: Vec<u32>,
    /// A signaled request's completion held back while the values of the
    /// unsignaled requests it covers are handed out (in posting order).
    held: Option<(u32, C)>,
    /// The next covered slot to hand out.
    walk: u32,
}

impl<T, C> Core<T, C> {
    fn new(capacity: u32) -> Self {
        let capacity = capacity.clamp(1, MAX_CAPACITY);
        Core {
            id: next_table_id(),
            serial: NEXT_SERIAL.fetch_add(1, Ordering::Relaxed),
            slots: (0..capacity)
                .map(|_| Slot {
                    value: None,
                    gen: 0,
                    state: State::Free,
                    link: NONE,
                })
                .collect(),
            free: (0..capacity).rev().collect(),
            held: None,
            walk: NONE,
        }
    }

    fn capacity(&self) -> u32 {
        self.slots.len() as u32
    }

    fn outstanding(&self) -> u32 {
        self.capacity() - self.free.len() as u32
    }

    /// The slot the next [`fill`](Self::fill) takes, and its `wr_id`.
    #[inline]
    fn next(&self) -> Option<(u32, u64)> {
        let idx = *self.free.last()?;
        Some((idx, encode(self.id, self.slots[idx as usize].gen, idx)))
    }

    /// Fills the slot [`next`](Self::next) gave, once its request was
    /// posted: signaled, it covers the unsignaled requests of `chain`
    /// (emptied); unsignaled, it joins the chain.
    #[inline]
    fn fill(&mut self, idx: u32, value: T, signaled: bool, chain: &mut Chain) {
        debug_assert_eq!(self.free.last(), Some(&idx));
        self.free.pop();
        let slot = &mut self.slots[idx as usize];
        slot.value = Some(value);
        if signaled {
            slot.state = State::Signaled;
            slot.link = chain.head;
            *chain = Chain::EMPTY;
        } else {
            slot.state = State::Unsignaled;
            slot.link = NONE;
            if chain.tail == NONE {
                chain.head = idx;
            } else {
                self.slots[chain.tail as usize].link = idx;
            }
            chain.tail = idx;
        }
    }

    #[inline]
    fn release(&mut self, idx: u32) -> Option<T> {
        let slot = &mut self.slots[idx as usize];
        slot.state = State::Free;
        slot.gen = slot.gen.wrapping_add(1);
        slot.link = NONE;
        // Room for every index was allocated at creation: no allocation.
        self.free.push(idx);
        slot.value.take()
    }

    /// The next value of a walk in progress, or the held completion once
    /// the walk is done.
    fn advance(&mut self) -> Option<Event<T, C>> {
        while self.walk != NONE {
            let idx = self.walk;
            let slot = &self.slots[idx as usize];
            self.walk = slot.link;
            match slot.state {
                State::Unsignaled => {
                    if let Some(v) = self.release(idx) {
                        return Some(Event::Covered(v));
                    }
                }
                // Its value went back with its own completion.
                State::Reported => {
                    self.release(idx);
                }
                // Chains hold only unsignaled slots (see `fill`).
                State::Free | State::Signaled => {
                    debug_assert!(false, "slot {idx} in a chain is {:?}", slot.state);
                    self.walk = NONE;
                }
            }
        }
        let (idx, c) = self.held.take()?;
        match self.release(idx) {
            Some(v) => Some(Event::Done(v, c)),
            None => Some(Event::Foreign(c)),
        }
    }

    /// What completion `c`, whose `wr_id` is `wr_id` (`None`: an orphan),
    /// means. A walk in progress must have been finished first.
    fn complete(&mut self, wr_id: Option<u64>, c: C) -> Event<T, C> {
        debug_assert!(self.held.is_none() && self.walk == NONE);
        let Some((id, gen, idx)) = wr_id.map(decode) else {
            return Event::Foreign(c);
        };
        let Some(slot) = self.slots.get_mut(idx as usize) else {
            return Event::Foreign(c);
        };
        if id != self.id || slot.gen != gen {
            return Event::Foreign(c);
        }
        match slot.state {
            State::Free | State::Reported => Event::Foreign(c),
            State::Signaled if slot.link == NONE => match self.release(idx) {
                Some(v) => Event::Done(v, c),
                None => Event::Foreign(c),
            },
            State::Signaled => {
                self.walk = std::mem::replace(&mut slot.link, NONE);
                self.held = Some((idx, c));
                match self.advance() {
                    Some(e) => e,
                    // `held` was just set.
                    None => unreachable!("a held completion"),
                }
            }
            // Its own completion (an error, or every request signaled by
            // the queue pair): the value goes back now, the slot when its
            // covering request completes.
            State::Unsignaled => match slot.value.take() {
                Some(v) => {
                    slot.state = State::Reported;
                    Event::Done(v, c)
                }
                None => Event::Foreign(c),
            },
        }
    }

    fn busy(&self) -> bool {
        self.held.is_some() || self.walk != NONE
    }
}

/// What [`RequestTable::poll`] hands back.
#[derive(Debug)]
pub enum Reaped<T> {
    /// A request posted through the table completed, successfully or not
    /// (check [`Completion::result`]; flushes included): its value and
    /// its completion, which holds the request's buffers.
    Done(T, Completion),
    /// An unsignaled request of a [`SendStream`] completed without error:
    /// it has no completion of its own, the signaled request after it
    /// completed (this comes before that one's [`Done`](Self::Done), in
    /// posting order). Its buffers (inline data or
    /// [`FrozenBuffer`](rdma_verbs::memory::FrozenBuffer)s) were released by the queue
    /// pair, as for every unsignaled request.
    Covered(T),
    /// A completion of a request that was not posted through this table
    /// (another table, a plain `post_send`, a prepared request, an
    /// orphan), or whose `wr_id` names no outstanding request of it.
    Foreign(Completion),
}

/// A refused post: the reason, the request's buffers and the caller's
/// value; nothing was posted.
#[derive(Debug)]
pub struct TableRefused<T> {
    /// Why.
    pub error: Error,
    /// The request's buffers.
    pub buffers: rdma_verbs::memory::SgList,
    /// The value it was posted with.
    pub value: T,
}

impl<T> std::fmt::Display for TableRefused<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.error, f)
    }
}

impl<T: std::fmt::Debug> std::error::Error for TableRefused<T> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        std::error::Error::source(&self.error)
    }
}

impl<T> From<TableRefused<T>> for Error {
    fn from(e: TableRefused<T>) -> Error {
        e.error
    }
}

impl<T> From<TableRefused<T>> for std::io::Error {
    /// As `From<Error> for io::Error`; the buffers and the value are
    /// dropped.
    fn from(e: TableRefused<T>) -> std::io::Error {
        e.error.into()
    }
}

/// A fixed-capacity table of caller values for outstanding requests, the
/// synchronous counterpart of the async futures: post a request with a
/// value, get `(value, Completion)` back when its completion is polled.
///
/// One table serves any number of queue pairs whose completions go to its
/// completion queue. Its capacity bounds the requests outstanding through
/// it; a post beyond it is refused ([`Error::RequestTableFull`]) before
/// reaching the device. Posting and polling do not allocate: the slots
/// and a completion batch are allocated at creation. The table takes
/// `&mut self` (no lock); share it across threads behind your own.
///
/// The table sets each request's `wr_id` (see the module's encoding) and
/// signals every request [`post_send`](Self::post_send) takes; streams of
/// sends that signal every Nth go through a [`SendStream`].
///
/// A value whose request never completes stays in the table until the
/// table is dropped (with it): a queue pair reset or destroyed with
/// requests outstanding, or a stream's last requests that no signaled
/// one covers ([`SendStream::signal_next`]). Move a queue pair to ERR
/// ([`QueuePair::to_err`]) and poll to get every value and buffer back
/// with its flush status.
///
/// # Example
/// ```no_run
/// # fn demo(pd: &rdma_verbs::ProtectionDomain, sqs: &mut [rdma_verbs::SendQueue],
/// #         cq: &rdma_verbs::CompletionQueue, remote: rdma_verbs::RemoteMemory) -> rdma_verbs_runtime::Result<()> {
/// use rdma_verbs::{AccessFlags, SendRequest};
/// use rdma_verbs_runtime::{Reaped, RequestTable};
///
/// // Read block `i` through queue pair `i % sqs.len()`, 16 at a time.
/// let mut table = RequestTable::<usize>::new(cq, 16);
/// let (mut next, mut done) = (0, 0);
/// while done < 64 {
///     while next < 64 && !table.is_full() {
///         let buf = pd.alloc(4096, AccessFlags::LOCAL_WRITE)?;
///         let block = remote.slice(next as u64 * 4096, 4096).unwrap();
///         let n = sqs.len();
///         table.post_send(&mut sqs[next % n], SendRequest::read(buf, block), next)?;
///         next += 1;
///     }
///     if let Some(Reaped::Done(block, mut c)) = table.poll()? {
///         c.result()?;
///         let bytes = c.take_local().unwrap();
///         println!("block {block}: {:?}", &bytes[..8]);
///         done += 1;
///     }
/// }
/// # Ok(()) }
/// ```
///
/// # References
/// `ibv_post_send(3)`, `ibv_post_recv(3)`, `ibv_poll_cq(3)`
pub struct RequestTable<T> {
    core: Core<T, Completion>,
    cq: CompletionQueue,
    /// The storage polls write into.
    batch: Completions,
    /// Polled completions not handed out yet (room for twice the table's
    /// capacity, allocated once: a poll takes at most its capacity, and
    /// polls only while at most that many wait).
    polled: VecDeque<Completion>,
}

impl<T> RequestTable<T> {
    /// A table for up to `capacity` outstanding requests (clamped to
    /// 1..=2^24 - 1) whose completions go to `cq`.
    ///
    /// Allocates the slots and a completion batch of `capacity` entries.
    pub fn new(cq: &CompletionQueue, capacity: u32) -> RequestTable<T> {
        let core = Core::new(capacity);
        let n = core.capacity() as usize;
        RequestTable {
            core,
            cq: cq.clone(),
            batch: Completions::with_capacity(n),
            polled: VecDeque::with_capacity(2 * n),
        }
    }

    /// How many requests may be outstanding at once.
    pub fn capacity(&self) -> u32 {
        self.core.capacity()
    }

    /// Values not handed back yet (outstanding requests, and completions
    /// polled but not yet handed out).
    pub fn len(&self) -> u32 {
        self.core.outstanding()
    }

    /// Whether no value is outstanding.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether a post would be refused with [`Error::RequestTableFull`].
    pub fn is_full(&self) -> bool {
        self.core.free.is_empty()
    }

    /// The completion queue the table polls.
    pub fn cq(&self) -> &CompletionQueue {
        &self.cq
    }

    /// The free slot and its `wr_id`, or the typed refusal.
    #[inline]
    fn slot(&self) -> Result<(u32, u64)> {
        self.core.next().ok_or(Error::RequestTableFull {
            capacity: self.capacity(),
        })
    }

    /// Refuses a queue whose completions would not reach this table.
    #[inline]
    fn check_cq(&self, cq: &CompletionQueue, queue: &'static str) -> Result<()> {
        if cq.as_ptr() == self.cq.as_ptr() {
            Ok(())
        } else {
            Err(Error::CompletionQueueMismatch { queue })
        }
    }

    /// Posts `request` (signaled, its `wr_id` set by the table) through
    /// `sq` with `value`, handed back with its completion.
    ///
    /// # Errors
    /// Every error comes with the request's buffers and the value, in a
    /// [`TableRefused`]; nothing was posted. [`Error::RequestTableFull`]
    /// (poll first); [`Error::CompletionQueueMismatch`] when the send queue
    /// reports to another CQ than the table's; every refusal of
    /// [`SendQueue::post_chain`] (its [`rdma_verbs::Error::QueueFull`] when the send
    /// queue is full).
    ///
    /// # References
    /// `ibv_post_send(3)`
    pub fn post_send(
        &mut self,
        sq: &mut SendQueue,
        request: SendRequest<'_>,
        value: T,
    ) -> Result<(), TableRefused<T>> {
        let mut chain = Chain::EMPTY;
        self.post_send_as(sq, request, value, true, &mut chain)
    }

    /// Posts a send signaled or not; a signaled one covers `chain`.
    fn post_send_as(
        &mut self,
        sq: &mut SendQueue,
        request: SendRequest<'_>,
        value: T,
        signaled: bool,
        chain: &mut Chain,
    ) -> Result<(), TableRefused<T>> {
        let (idx, wr_id) = match self
            .check_cq(sq.qp().send_cq(), "send queue")
            .and_then(|()| self.slot())
        {
            Ok(s) => s,
            Err(error) => {
                return Err(TableRefused {
                    error,
                    buffers: request.into_buffers(),
                    value,
                })
            }
        };
        match sq.post(request.wr_id(wr_id).signaled(signaled)) {
            Ok(()) => {
                self.core.fill(idx, value, signaled, chain);
                Ok(())
            }
            Err(r) => Err(TableRefused {
                error: r.error.into(),
                buffers: r.buf,
                value,
            }),
        }
    }

    /// Posts a receive (its `wr_id` set by the table) through `rq` with
    /// `value`, handed back with its completion.
    ///
    /// # Errors
    /// As [`post_send`](Self::post_send), for [`RecvQueue::post_chain`];
    /// [`Error::CompletionQueueMismatch`] for a queue pair's receive queue
    /// reporting elsewhere.
    ///
    /// # References
    /// `ibv_post_recv(3)`
    pub fn post_recv(
        &mut self,
        rq: &mut RecvQueue,
        request: RecvRequest,
        value: T,
    ) -> Result<(), TableRefused<T>> {
        let checked = match rq.qp() {
            Some(qp) => self.check_cq(qp.recv_cq(), "receive queue"),
            None => Ok(()),
        };
        let (idx, wr_id) = match checked.and_then(|()| self.slot()) {
            Ok(s) => s,
            Err(error) => {
                return Err(TableRefused {
                    error,
                    buffers: request.into_buffers(),
                    value,
                })
            }
        };
        match rq.post(request.wr_id(wr_id)) {
            Ok(()) => {
                let mut none = Chain::EMPTY;
                self.core.fill(idx, value, true, &mut none);
                Ok(())
            }
            Err(r) => Err(TableRefused {
                error: r.error.into(),
                buffers: r.buf,
                value,
            }),
        }
    }

    /// A stream of sends through `sq` that asks for a completion only
    /// every `every`th one (clamped to the send queue's depth).
    ///
    /// # Errors
    /// [`Error::CompletionQueueMismatch`] when the send queue reports to
    /// another CQ than the table's.
    pub fn send_stream(&self, sq: SendQueue, every: u32) -> Result<SendStream> {
        self.check_cq(sq.qp().send_cq(), "send queue")?;
        let depth = sq.qp().send_capacity().max(1);
        Ok(SendStream {
            sq,
            table: self.core.serial,
            every: every.clamp(1, depth),
            run: 0,
            signal_next: false,
            chain: Chain::EMPTY,
        })
    }

    /// Posts `request` on `stream` with `value`: signaled every `every`th,
    /// when the queue would otherwise fill up with requests no completion
    /// covers, when the request may not go unsignaled (it carries a buffer
    /// the device writes or the caller owns exclusively), and after
    /// [`SendStream::signal_next`]. When the send queue is full it polls the
    /// table's CQ (claiming a covering completion frees the entries before
    /// it) and keeps what it polled for [`poll`](Self::poll).
    ///
    /// # Errors
    /// As [`post_send`](Self::post_send); [`Error::StreamOfAnotherTable`].
    pub fn post_stream(
        &mut self,
        stream: &mut SendStream,
        request: SendRequest<'_>,
        value: T,
    ) -> Result<(), TableRefused<T>> {
        let refuse = |error, request: SendRequest<'_>, value| {
            Err(TableRefused {
                error,
                buffers: request.into_buffers(),
                value,
            })
        };
        if stream.table != self.core.serial {
            return refuse(Error::StreamOfAnotherTable, request, value);
        }
        if self.is_full() {
            let capacity = self.capacity();
            return refuse(Error::RequestTableFull { capacity }, request, value);
        }
        let last_free = match self.make_room(&mut stream.sq) {
            Ok(last) => last,
            Err(error) => return refuse(error, request, value),
        };
        let signaled = stream.signal_next
            || stream.run + 1 >= stream.every
            || last_free
            || !request.may_be_unsignaled();
        self.post_send_as(&mut stream.sq, request, value, signaled, &mut stream.chain)?;
        if signaled {
            stream.run = 0;
            stream.signal_next = false;
        } else {
            stream.run += 1;
        }
        Ok(())
    }

    /// Polls until the stream's send queue has a free entry; whether it is
    /// the last one (a request taking it must be signaled, or the queue
    /// could fill up with requests nothing covers).
    fn make_room(&mut self, sq: &mut SendQueue) -> Result<bool> {
        loop {
            if sq.has_room(0) {
                return Ok(!sq.has_room(1));
            }
            if self.polled.len() > self.batch.capacity() {
                return Err(rdma_verbs::Error::QueueFull {
                    queue: "send queue",
                    depth: sq.qp().send_capacity(),
                }
                .into());
            }
            // Claiming the covering completion (inside `poll`) frees the
            // unsignaled requests before it.
            if self.poll_more()? == 0 {
                std::hint::spin_loop();
            }
        }
    }

    /// Polls the CQ once into `polled` (which has room: see its field):
    /// how many.
    fn poll_more(&mut self) -> Result<usize> {
        let mut n = 0;
        for c in self.cq.poll(&mut self.batch)? {
            self.polled.push_back(c.into_owned());
            n += 1;
        }
        Ok(n)
    }

    /// The next event: a value with its completion, a covered value, or a
    /// foreign completion; `None` when the CQ had nothing.
    ///
    /// # Errors
    /// As [`CompletionQueue::poll`].
    #[inline]
    pub fn poll(&mut self) -> Result<Option<Reaped<T>>> {
        if let Some(p) = self.ready() {
            return Ok(Some(p));
        }
        if self.poll_more()? == 0 {
            return Ok(None);
        }
        Ok(self.ready())
    }

    /// As [`poll`](Self::poll), sleeping until the CQ has completions or
    /// `timeout` passed (see [`CompletionQueue::wait`]).
    ///
    /// # Errors
    /// As [`CompletionQueue::wait`].
    pub fn wait(&mut self, timeout: Option<Duration>) -> Result<Option<Reaped<T>>> {
        if let Some(p) = self.ready() {
            return Ok(Some(p));
        }
        for c in self.cq.wait(&mut self.batch, timeout)? {
            self.polled.push_back(c.into_owned());
        }
        Ok(self.ready())
    }

    #[inline]
    fn ready(&mut self) -> Option<Reaped<T>> {
        let event = if self.core.busy() {
            self.core.advance()?
        } else {
            let c = self.polled.pop_front()?;
            let wr_id = (!c.is_orphan()).then(|| c.wr_id());
            self.core.complete(wr_id, c)
        };
        Some(match event {
            Event::Done(v, c) => Reaped::Done(v, c),
            Event::Covered(v) => Reaped::Covered(v),
            Event::Foreign(c) => Reaped::Foreign(c),
        })
    }
}

impl<T> std::fmt::Debug for RequestTable<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestTable")
            .field("capacity", &self.capacity())
            .field("outstanding", &self.len())
            .finish_non_exhaustive()
    }
}

/// A stream of sends on one queue pair that asks for a completion only
/// every Nth request, with the send queue's entries accounted for: made
/// by [`RequestTable::send_stream`], posted to with
/// [`RequestTable::post_stream`].
///
/// Unsignaled requests may carry only inline data or
/// [`FrozenBuffer`](rdma_verbs::memory::FrozenBuffer)s (DESIGN.md: the queue pair
/// releases them when a later completion retires them); the stream
/// signals any other request itself. Finish a stream with a signaled
/// request ([`signal_next`](Self::signal_next) before the last post):
/// the values of unsignaled requests no signaled one covers stay in the
/// table.
///
/// A table at least as deep as the send queue, polled until empty after
/// each post, never refuses a stream: its values are then the queue's
/// outstanding requests.
///
/// # Example
/// ```no_run
/// # fn demo(qp: &rdma_verbs::QueuePair, cq: &rdma_verbs::CompletionQueue,
/// #         remote: rdma_verbs::RemoteMemory) -> rdma_verbs_runtime::Result<()> {
/// use rdma_verbs::SendRequest;
/// use rdma_verbs_runtime::{Reaped, RequestTable};
///
/// let mut table = RequestTable::<u64>::new(cq, qp.send_capacity());
/// // The stream keeps the send queue's handle: a completion every 8th write.
/// let mut stream = table.send_stream(qp.send_queue()?, 8)?;
/// for i in 0..10_000u64 {
///     if i == 9_999 {
///         stream.signal_next(); // the last one covers the rest
///     }
///     let bytes = i.to_le_bytes();
///     table.post_stream(&mut stream, SendRequest::write_inline(&bytes, remote), i)?;
///     while let Some(polled) = table.poll()? {
///         match polled {
///             Reaped::Done(_, c) => c.result()?, // every 8th, or one that failed
///             Reaped::Covered(_) => {}           // done, no completion of its own
///             Reaped::Foreign(_) => {}
///         }
///     }
/// }
/// # Ok(()) }
/// ```
///
/// # References
/// `ibv_post_send(3)` (`IBV_SEND_SIGNALED`), `ibv_create_qp(3)` (`sq_sig_all`)
#[derive(Debug)]
pub struct SendStream {
    sq: SendQueue,
    table: u64,
    every: u32,
    run: u32,
    signal_next: bool,
    chain: Chain,
}

impl SendStream {
    /// Asks for a completion of the next request posted (the last of a
    /// burst, so that every value comes back).
    pub fn signal_next(&mut self) {
        self.signal_next = true;
    }

    /// The queue pair.
    pub fn qp(&self) -> &QueuePair {
        self.sq.qp()
    }

    /// The stream's send queue, for requests posted beside the stream
    /// (through [`RequestTable::post_send`] or directly). A signaled one
    /// retires the stream's uncovered requests in the queue pair; their
    /// values still come back, as [`Reaped::Covered`], when the stream's
    /// next signaled request completes.
    pub fn send_queue(&mut self) -> &mut SendQueue {
        &mut self.sq
    }

    /// Ends the stream, giving its send queue back. The values of
    /// requests no signaled one covered stay in the table
    /// ([`signal_next`](Self::signal_next) before the last post).
    pub fn into_send_queue(self) -> SendQueue {
        self.sq
    }

    /// A completion is asked for every this many requests.
    pub fn every(&self) -> u32 {
        self.every
    }

    /// Unsignaled requests no signaled one covers yet.
    pub fn uncovered(&self) -> u32 {
        self.run
    }
}

#[cfg(test)]
mod tests;
