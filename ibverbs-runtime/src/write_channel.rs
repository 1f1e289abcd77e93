//! A channel of RDMA writes with immediate data into a ring of the peer's
//! slots, with credits: [`WriteChannel`] (its docs give the protocol),
//! [`Received`], and the pure accounting (`Window`: the shared credit
//! window and the writes' sequence numbers), unit-tested here.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::credit_window::CreditWindow;
use crate::error::{Error, Result};
use crate::ChannelProblem;
use rdma_verbs::{
    AccessFlags, Completion, CompletionQueue, Completions, LocalBuffer, ProtectionDomain, QpType,
    QueuePair, RecvQueue, RemoteMemory, SendQueue, SharedBuffer, WcOpcode, Wr,
};

/// `wr_id` of a credit return.
const CREDIT: u64 = 1 << 40;
/// `wr_id` of a write from send slot `i`: `WRITE | i`.
const WRITE: u64 = 2 << 40;
/// `wr_id` of every receive.
const RECV: u64 = 3 << 40;
const SLOT_MASK: u64 = (1 << 32) - 1;
/// The most slots a channel may have (as a message channel's window).
const MAX_SLOTS: u32 = 4096;

/// The credit and sequence accounting of one end, free of verbs: the
/// channels' credit window (granted from the start: both ends exist before
/// either writes) and the sequence numbers of the writes.
///
/// Writes of this end: `credits + outstanding == slots` (a write takes a
/// credit, a credit message of the peer gives some back: at least one,
/// never more than are outstanding). The peer's writes: at most `slots`
/// arrived and not yet handed out *or* handed out and not yet released
/// (`held`), since the peer writes only with a credit and a credit goes
/// back only when [`release`](Window::release) says so.
#[derive(Debug, Clone)]
struct Window {
    counts: CreditWindow,
    /// Sequence number (16 bits, wrapping) of this end's next write.
    tx_seq: u16,
    /// Sequence number of the peer's next write.
    rx_seq: u16,
}

impl Window {
    fn new(slots: u32) -> Window {
        let mut counts = CreditWindow::new(slots);
        counts.grant();
        Window {
            counts,
            tx_seq: 0,
            rx_seq: 0,
        }
    }

    /// Takes a credit for a write (the caller checked `credits > 0`); its
    /// immediate data.
    fn write(&mut self) -> u32 {
        self.counts.take();
        let seq = self.tx_seq;
        self.tx_seq = seq.wrapping_add(1);
        u32::from(seq)
    }

    /// Counts the peer's credit message returning `returned`.
    fn credit(&mut self, returned: u32) -> std::result::Result<(), ChannelProblem> {
        if returned == 0 {
            // A credit message always returns some.
            return Err(ChannelProblem::Credits {
                returned,
                outstanding: self.counts.outstanding(),
            });
        }
        self.counts.accept(returned, false)
    }

    /// Checks and counts a write of the peer with immediate data `imm`.
    fn arrived(&mut self, imm: u32) -> std::result::Result<(), ChannelProblem> {
        if imm != u32::from(self.rx_seq) {
            return Err(ChannelProblem::Sequence {
                got: imm as u16,
                expected: self.rx_seq,
            });
        }
        self.counts.accept(0, true)?;
        self.rx_seq = self.rx_seq.wrapping_add(1);
        Ok(())
    }

    /// A handed-out write was released (its slot copied out): its credit
    /// is owed to the peer.
    fn release(&mut self) {
        self.counts.release();
    }

    /// The owed credits, now returned (their message is being posted).
    fn take_owed(&mut self) -> u32 {
        self.counts.take_owed()
    }
}

/// One end of a channel of RDMA writes with immediate data over an RC
/// queue pair: each end exposes a ring of `slots` receive slots of
/// `slot_size` bytes (its *inbox*, a [`SharedBuffer`]) that the peer
/// writes into; credits make sure the peer never writes a slot before
/// this end has copied it out. Both directions work at once; a ring
/// all-reduce uses one direction per neighbour.
///
/// Beside [`MessageChannel`](crate::MessageChannel), which carries
/// messages by send/receive into buffers it owns (zero-copy, readable as
/// `&[u8]`, connected by itself): use this channel when the queue pair is
/// connected by someone else ([`Ranks::connect_ring`](crate::Ranks::connect_ring)
/// makes one per neighbour) or the data should land by RDMA write in a
/// ring the peer knows, as a collective's chunks do; the price is a
/// volatile copy out of every slot, since the peer may write it.
///
/// # Protocol
///
/// * [`send`](Self::send) copies the caller's bytes into one of the
///   channel's registered send slots and posts one
///   `RDMA_WRITE_WITH_IMM` of them into the peer's inbox slot
///   `k % slots` (`k`: this end's write count), the immediate data being
///   `k mod 2^16`. It takes a credit: an end starts with `slots` of them.
/// * The peer's write completes a receive (an empty one: the data is in
///   the inbox) with the immediate data and the length;
///   [`recv`](Self::recv) hands the next one out as a [`Received`] guard,
///   which copies the slot out with volatile reads
///   ([`Received::read_into`]) — a peer writes that memory, so no Rust
///   reference to it ever exists.
/// * Dropping the guard returns the slot's credit: a zero-length `SEND`
///   whose immediate data is the number of credits returned. So a
///   credit goes back only *after* the bytes were copied out (the guard
///   borrows the channel, so its reads all happen before the drop), and
///   the writer writes slot `k % slots` again only after `k` was
///   released: with `c` credits back it writes at most up to
///   `k = c + slots − 1`, and `c` credits mean writes `0..c` were
///   released, in order.
///
/// Receives: `2 × slots` are posted and each is posted again as soon as
/// its completion is polled; at most `slots` of the peer's writes (it
/// needs a credit for each) and `slots` credit messages (each returns at
/// least one of at most `slots` credits) are ever unpolled, so a message
/// always finds a receive (no RNR retry once both ends
/// [`start`](Self::start)ed). The send queue holds `2 × slots + 1`
/// requests: writes and credit messages wait for room (a credit that
/// finds no room goes at the next call).
///
/// A peer that breaks the protocol (a write out of sequence, without a
/// credit, longer than a slot; more credits than were used) is reported
/// as [`Error::ChannelProtocol`]. Soundness does not rest on the peer:
/// it can write the inbox at any time, and the inbox is only ever read
/// through volatile copies; a misbehaving peer garbles data, nothing
/// else.
///
/// # Waiting
///
/// Calls that wait ([`send`](Self::send) for a credit, [`recv`](Self::recv)
/// for a write, [`flush`](Self::flush)) spin on the completion queue by
/// default; [`blocking(true)`](Self::blocking) makes them sleep on its
/// completion channel ([`CompletionQueue::wait`]) when nothing completed,
/// which frees the core when there are more busy threads than cores.
///
/// # Errors and failure
///
/// An error completion, a protocol violation or a failed verb is returned
/// once; the channel moves its queue pair to ERR and every later call
/// returns [`rdma_verbs::Error::QueuePairInError`].
///
/// # Example
/// ```no_run
/// use std::time::Duration;
/// use rdma_verbs::*;
/// use rdma_verbs_runtime::{Result, WriteChannel};
/// # fn demo(pd: &ProtectionDomain, local: &LocalPort, port: PortNumber,
/// #         exchange: impl Fn(Endpoint, RemoteMemory) -> (Endpoint, RemoteMemory),
/// #         barrier: impl Fn()) -> Result<()> {
/// // 2 slots of 1 MiB; the peer creates its end with the same numbers.
/// let mut ch = WriteChannel::create(pd, 2, 1 << 20)?;
/// let me = local.endpoint(ch.queue_pair(), Endpoint::random_psn())?;
/// let (peer, inbox) = exchange(me, ch.inbox()); // out of band
/// let opts = ConnectOptions::new(port).local_port(local).remote_access(AccessFlags::REMOTE_WRITE);
/// ch.queue_pair().connect(&me, &peer, &opts)?;
/// ch.start(inbox)?; // posts the receives
/// barrier(); // both ends started: writes find their receives
///
/// let data = [1.0f32, 2.0, 3.0];
/// ch.send(rdma_verbs::bytemuck::cast_slice(&data), Some(Duration::from_secs(5)))?;
/// let mut got = [0f32; 3];
/// if let Some(slot) = ch.recv(Some(Duration::from_secs(5)))? {
///     slot.read_into(0, &mut got)?; // volatile copy out of the inbox
/// } // dropped: the slot's credit goes back to the peer
/// ch.flush(Some(Duration::from_secs(5)))?;
/// # Ok(()) }
/// ```
///
/// # References
/// `ibv_post_send(3)` (`IBV_WR_RDMA_WRITE_WITH_IMM`), `ibv_post_recv(3)`,
/// `ibv_poll_cq(3)`, `ibv_req_notify_cq(3)`; IBA 9.4.3 (RDMA write with
/// immediate consumes a receive).
pub struct WriteChannel {
    qp: QueuePair,
    cq: CompletionQueue,
    done: Completions,
    window: Window,
    slot_size: usize,
    /// The slots the peer writes.
    inbox: SharedBuffer,
    /// The peer's inbox, once started.
    peer: Option<RemoteMemory>,
    /// Send slots not posted (whole), and the unsent rest of posted ones.
    send_free: Vec<LocalBuffer>,
    send_tails: Vec<Option<LocalBuffer>>,
    send_base: u64,
    /// The inbox slot of this end's next write, and of the peer's next
    /// write to hand out.
    tx_slot: u32,
    rx_slot: u32,
    /// Lengths of the peer's writes polled, not handed out yet, in order.
    arrivals: VecDeque<usize>,
    /// Completions polled, not yet handled (room for a whole poll).
    polled: VecDeque<Completion>,
    /// The queue pair's posting handles, taken by `start`.
    sq: Option<SendQueue>,
    rq: Option<RecvQueue>,
    sq_used: u32,
    sq_depth: u32,
    rq_depth: u32,
    blocking: bool,
    failed: bool,
    /// An error met where it could not be returned (a guard's drop).
    pending: Option<Error>,
}

impl WriteChannel {
    /// Creates an unstarted channel end on `pd`: an inbox of `slots ×
    /// slot_size` bytes the peer may write (`REMOTE_WRITE`), as many send
    /// slots (`LOCAL_WRITE` only), an RC queue pair and its completion
    /// queue with a completion channel of its own. Connect the queue pair
    /// ([`queue_pair`](Self::queue_pair)) with `REMOTE_WRITE` access, then
    /// [`start`](Self::start) the channel.
    ///
    /// # Errors
    /// [`rdma_verbs::Error::OutOfRange`] for `slots` outside `1..=4096` or a zero
    /// `slot_size` or one above `u32::MAX`; [`rdma_verbs::Error::Verb`] naming the
    /// verb that failed (`ibv_create_comp_channel`, `ibv_create_cq`,
    /// `ibv_create_qp`, `ibv_reg_mr`).
    ///
    /// # References
    /// `ibv_create_qp(3)`, `ibv_create_cq(3)`, `ibv_reg_mr(3)`
    pub fn create(pd: &ProtectionDomain, slots: u32, slot_size: usize) -> Result<WriteChannel> {
        if !(1..=MAX_SLOTS).contains(&slots) {
            return Err(rdma_verbs::Error::OutOfRange {
                what: "write channel slots",
                value: u64::from(slots),
                max: u64::from(MAX_SLOTS),
            }
            .into());
        }
        if slot_size == 0 || u32::try_from(slot_size).is_err() {
            return Err(rdma_verbs::Error::OutOfRange {
                what: "write channel slot size",
                value: slot_size as u64,
                max: u64::from(u32::MAX),
            }
            .into());
        }
        let (sq_depth, rq_depth) = (2 * slots + 1, 2 * slots);
        let ctx = pd.context();
        let channel = ctx.create_comp_channel()?;
        let cq = ctx
            .create_cq(sq_depth + rq_depth)
            .channel(&channel)
            .build()?;
        let qp = pd
            .create_qp(QpType::Rc, &cq, &cq)
            .max_send_wr(sq_depth)
            .max_recv_wr(rq_depth)
            .build()?;
        let bytes = slots as usize * slot_size;
        let inbox = pd.alloc_shared(bytes, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)?;
        let send = pd.alloc(bytes, AccessFlags::LOCAL_WRITE)?;
        let send_base = send.addr();
        let (mut send_free, _) = send.chunks_exact(slot_size);
        send_free.reverse(); // popped from the end: slot 0 first
        Ok(WriteChannel {
            qp,
            cq,
            done: Completions::with_capacity((sq_depth + rq_depth) as usize),
            window: Window::new(slots),
            slot_size,
            inbox,
            peer: None,
            send_tails: (0..slots).map(|_| None).collect(),
            send_free,
            send_base,
            tx_slot: 0,
            rx_slot: 0,
            arrivals: VecDeque::with_capacity(slots as usize),
            polled: VecDeque::with_capacity((sq_depth + rq_depth) as usize),
            sq: None,
            rq: None,
            sq_used: 0,
            sq_depth,
            rq_depth,
            blocking: false,
            failed: false,
            pending: None,
        })
    }

    /// Sleep on the completion channel instead of spinning when a call
    /// waits and nothing completed (default: spin).
    pub fn blocking(mut self, yes: bool) -> Self {
        self.blocking = yes;
        self
    }

    /// The channel's queue pair, to connect (with `REMOTE_WRITE` access)
    /// before [`start`](Self::start). Post nothing on it: the channel
    /// takes every completion of its queue for its own.
    pub fn queue_pair(&self) -> &QueuePair {
        &self.qp
    }

    /// What the peer needs to write this end's inbox (its wire form,
    /// [`RemoteMemory::to_bytes`], fits in the private bytes of
    /// [`Ranks`](crate::Ranks)).
    pub fn inbox(&self) -> RemoteMemory {
        // The inbox was registered with REMOTE_WRITE: it has a key.
        self.inbox.remote().unwrap_or(RemoteMemory {
            addr: self.inbox.addr(),
            len: self.inbox.len() as u64,
            rkey: rdma_verbs::memory::RemoteKey(0),
        })
    }

    /// The largest write: the slot size.
    pub fn slot_size(&self) -> usize {
        self.slot_size
    }

    /// Writes this end may post now without waiting.
    pub fn credits(&self) -> u32 {
        self.window.counts.credits()
    }

    /// Starts the channel once its queue pair is connected: `peer` is the
    /// peer's [`inbox`](Self::inbox). Posts this end's receives; the
    /// peer's first write must not arrive before (start both ends, then
    /// a barrier such as [`Mesh::barrier`](crate::Mesh::barrier); or
    /// rely on [`ConnectOptions::rnr_retry`](rdma_verbs::ConnectOptions::rnr_retry)).
    ///
    /// # Errors
    /// [`Error::ChannelProtocol`] ([`ChannelProblem::Hello`], field
    /// `"inbox"`) when `peer` is not exactly `slots × slot_size` bytes
    /// (the ends differ); [`rdma_verbs::Error::QueueFull`] when started already
    /// (its receives are posted); [`rdma_verbs::Error::Verb`] naming `ibv_post_recv`.
    pub fn start(&mut self, peer: RemoteMemory) -> Result<()> {
        let ours = self.inbox.len() as u64;
        if peer.len != ours {
            return Err(Error::ChannelProtocol {
                problem: ChannelProblem::Hello {
                    field: "inbox",
                    ours,
                    theirs: peer.len,
                },
            });
        }
        if self.peer.is_some() {
            return Err(rdma_verbs::Error::QueueFull {
                queue: "write channel receives (started already)",
                depth: self.rq_depth,
            }
            .into());
        }
        self.sq = Some(self.qp.send_queue()?);
        self.rq = Some(self.qp.recv_queue()?);
        for _ in 0..self.rq_depth {
            self.repost()?;
        }
        self.peer = Some(peer);
        Ok(())
    }

    /// Writes `data` into the peer's next inbox slot: copies it into a
    /// send slot and posts it. Waits while the peer has no free slot (no
    /// credit) or the send queue is full, at most `timeout` (`None`: no
    /// limit; zero: do not wait). Returns once the write is posted; the
    /// peer sees it in order.
    ///
    /// # Errors
    /// * [`Error::MessageTooLarge`] when `data` is longer than a slot,
    ///   [`Error::TimedOut`] when no credit came within `timeout`
    ///   (nothing sent; the channel stays usable);
    /// * [`rdma_verbs::Error::NotReadyToSend`] before [`start`](Self::start);
    /// * [`rdma_verbs::Error::WorkCompletion`], [`Error::ChannelProtocol`],
    ///   [`rdma_verbs::Error::Verb`]: the channel is broken, later calls return
    ///   [`rdma_verbs::Error::QueuePairInError`].
    pub fn send(&mut self, data: &[u8], timeout: Option<Duration>) -> Result<()> {
        if data.len() > self.slot_size {
            return Err(Error::MessageTooLarge {
                len: data.len(),
                max: self.slot_size,
            });
        }
        self.usable("WriteChannel::send")?;
        let deadline = deadline(timeout);
        while self.window.counts.credits() == 0
            || self.sq_used >= self.sq_depth
            || self.send_free.is_empty()
        {
            if !self.turn(deadline)? {
                return Err(timed_out("WriteChannel::send", timeout));
            }
        }
        // The peer's inbox is `slots × slot_size` (checked by `start`):
        // the slice is in it.
        let at = u64::from(self.tx_slot) * self.slot_size as u64;
        let to = self.peer.and_then(|p| p.slice(at, data.len() as u64));
        let (Some(slot), Some(to)) = (self.send_free.pop(), to) else {
            return Err(self.fail(unexpected("no send slot or inbox slice")));
        };
        let i = ((slot.addr() - self.send_base) / self.slot_size as u64) as usize;
        let (mut head, tail) = slot.split_at(data.len());
        head.copy_from_slice(data);
        self.send_tails[i] = Some(tail);
        let imm = self.window.write();
        let posted = match self.sq.as_mut() {
            Some(sq) => sq
                .write(head, to, Wr::id(WRITE | i as u64).imm(imm))
                .map_err(Error::from),
            None => Err(unexpected("no send queue handle")),
        };
        if let Err(e) = posted {
            return Err(self.fail(e));
        }
        self.sq_used += 1;
        self.tx_slot = (self.tx_slot + 1) % self.window.counts.size();
        Ok(())
    }

    /// The peer's next write, waiting for it at most `timeout` (`None`:
    /// no limit; zero: do not wait); `Ok(None)` when none came in time.
    /// The [`Received`] guard borrows the channel; dropping it returns
    /// the slot's credit to the peer.
    ///
    /// # Errors
    /// As [`send`](Self::send) but for the size and the timeout; writes
    /// that arrived before an error are handed out first.
    pub fn recv(&mut self, timeout: Option<Duration>) -> Result<Option<Received<'_>>> {
        let deadline = deadline(timeout);
        loop {
            if let Some(len) = self.arrivals.pop_front() {
                let offset = self.rx_slot as usize * self.slot_size;
                self.rx_slot = (self.rx_slot + 1) % self.window.counts.size();
                return Ok(Some(Received {
                    chan: self,
                    offset,
                    len,
                }));
            }
            self.usable("WriteChannel::recv")?;
            match self.turn(deadline) {
                Ok(true) => {}
                Ok(false) => return Ok(None),
                Err(e) if !self.arrivals.is_empty() => {
                    self.pending.get_or_insert(e);
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Waits until every write and credit posted so far was acknowledged
    /// by the peer, at most `timeout` (`None`: no limit). Dropping the
    /// channel flushes requests still in flight: flush first.
    ///
    /// # Errors
    /// [`Error::TimedOut`]; otherwise as [`send`](Self::send).
    pub fn flush(&mut self, timeout: Option<Duration>) -> Result<()> {
        self.usable("WriteChannel::flush")?;
        let deadline = deadline(timeout);
        while self.sq_used > 0 || self.window.counts.owed() > 0 {
            if !self.turn(deadline)? {
                return Err(timed_out("WriteChannel::flush", timeout));
            }
        }
        Ok(())
    }

    fn usable(&mut self, op: &'static str) -> Result<()> {
        if let Some(e) = self.pending.take() {
            return Err(e);
        }
        if self.failed {
            return Err(rdma_verbs::Error::QueuePairInError { verb: op }.into());
        }
        if self.peer.is_none() {
            return Err(rdma_verbs::Error::NotReadyToSend {
                state: rdma_verbs::QpState::Reset,
            }
            .into());
        }
        Ok(())
    }

    /// Returns owed credits when the send queue has room.
    fn return_credits(&mut self) -> Result<()> {
        if self.window.counts.owed() == 0 || self.sq_used >= self.sq_depth || self.failed {
            return Ok(());
        }
        let n = self.window.take_owed();
        let posted = match self.sq.as_mut() {
            Some(sq) => sq
                .send_inline(&[], Wr::id(CREDIT).imm(n))
                .map_err(Error::from),
            None => Err(unexpected("no send queue handle")),
        };
        match posted {
            Ok(()) => {
                self.sq_used += 1;
                Ok(())
            }
            Err(e) => Err(self.fail(e)),
        }
    }

    /// One round: returns owed credits, polls (spinning, or sleeping when
    /// blocking, until `deadline`) and processes what came.
    /// `Ok(false)`: nothing came in time.
    fn turn(&mut self, deadline: Option<Instant>) -> Result<bool> {
        self.return_credits()?;
        let mut n = self.poll_in(None);
        if matches!(n, Ok(0)) {
            let left = match deadline {
                None => None,
                Some(d) => match d.checked_duration_since(Instant::now()) {
                    Some(left) if !left.is_zero() => Some(left),
                    _ => return Ok(false),
                },
            };
            if self.blocking {
                n = self.poll_in(Some(left));
            } else {
                std::hint::spin_loop();
            }
        }
        match n {
            Ok(0) => Ok(deadline.is_none_or(|d| Instant::now() < d)),
            Ok(_) => {
                let mut first = None;
                while let Some(c) = self.polled.pop_front() {
                    if let Err(e) = self.handle(c) {
                        first.get_or_insert(e);
                    }
                }
                first.map_or(Ok(true), |e| Err(self.fail(e)))
            }
            Err(e) => Err(self.fail(e)),
        }
    }

    /// Polls (`wait`: sleeping up to that long, `None` inside: no limit)
    /// into `polled`: how many came.
    fn poll_in(&mut self, wait: Option<Option<Duration>>) -> Result<usize> {
        let before = self.polled.len();
        let polled = match wait {
            None => self.cq.poll(&mut self.done)?,
            Some(left) => self.cq.wait(&mut self.done, left)?,
        };
        self.polled
            .extend(polled.map(rdma_verbs::cq::CompletionRef::into_owned));
        Ok(self.polled.len() - before)
    }

    /// Handles one completion (the channel's queue pair is its CQ's only
    /// one).
    fn handle(&mut self, mut c: Completion) -> Result<()> {
        c.result()?; // buffers dropped with `c`: the device is done
        let wr_id = c.wr_id();
        if wr_id == CREDIT || wr_id & !SLOT_MASK == WRITE {
            self.sq_used = self.sq_used.saturating_sub(1);
            if wr_id == CREDIT {
                return Ok(());
            }
            let i = (wr_id & SLOT_MASK) as usize;
            let joined = match (c.take_local(), self.send_tails.get_mut(i)) {
                (Some(head), Some(tail)) => tail.take().map(|t| head.unsplit(t)),
                _ => None,
            };
            let Some(Ok(slot)) = joined else {
                return Err(unexpected("a send slot that is not the channel's"));
            };
            self.send_free.push(slot);
            return Ok(());
        }
        if wr_id != RECV {
            return Err(unexpected("a completion the channel did not post"));
        }
        if !self.failed {
            self.repost()?;
        }
        let imm = c
            .imm_data()
            .ok_or(unexpected("a message without immediate data"))?;
        let problem = match c.opcode() {
            WcOpcode::RecvRdmaWithImm if c.byte_len() as usize > self.slot_size => {
                return Err(unexpected("a write longer than a slot"))
            }
            WcOpcode::RecvRdmaWithImm => self.window.arrived(imm).map(|()| {
                self.arrivals.push_back(c.byte_len() as usize);
            }),
            WcOpcode::Recv if c.byte_len() == 0 => self.window.credit(imm),
            _ => return Err(unexpected("a send with a payload")),
        };
        problem.map_err(|problem| Error::ChannelProtocol { problem })
    }

    fn repost(&mut self) -> Result<()> {
        let posted = match self.rq.as_mut() {
            Some(rq) => rq.recv_empty(RECV).map_err(Error::from),
            None => Err(unexpected("no receive queue handle")),
        };
        posted.map_err(|e| self.fail(e))
    }

    /// A handed-out write's slot was copied out: its credit is owed, and
    /// returned now if the send queue has room. Errors wait for the next
    /// call.
    fn release(&mut self) {
        self.window.release();
        if let Err(e) = self.return_credits() {
            self.pending.get_or_insert(e);
        }
    }

    /// Marks the channel broken (its queue pair to ERR) and gives `e`
    /// back to be returned.
    fn fail(&mut self, e: Error) -> Error {
        if !self.failed {
            self.failed = true;
            // Best effort: the channel refuses everything from now on.
            let _ = self.qp.to_err();
        }
        e
    }
}

impl std::fmt::Debug for WriteChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteChannel")
            .field("qp_num", &self.qp.qp_num())
            .field("slots", &self.window.counts.size())
            .field("slot_size", &self.slot_size)
            .field("credits", &self.window.counts.credits())
            .field("arrived", &self.arrivals.len())
            .field("failed", &self.failed)
            .finish()
    }
}

fn unexpected(what: &'static str) -> Error {
    Error::ChannelProtocol {
        problem: ChannelProblem::Unexpected { what },
    }
}

fn timed_out(op: &'static str, timeout: Option<Duration>) -> Error {
    Error::TimedOut {
        op,
        timeout: timeout.unwrap_or_default(),
    }
}

/// The deadline `timeout` from now (`None`: none).
fn deadline(timeout: Option<Duration>) -> Option<Instant> {
    timeout.and_then(|t| Instant::now().checked_add(t))
}

/// A write of the peer handed out by [`WriteChannel::recv`]: its slot of
/// the inbox, borrowed from the channel until dropped. The bytes are
/// reachable only through volatile copies ([`read_into`](Self::read_into),
/// [`copy_to_slice`](Self::copy_to_slice)): the peer can write the inbox
/// (a well-behaved one does not write this slot while the guard lives).
///
/// Dropping it returns the slot's credit, after which the peer may write
/// the slot again; forgetting it (`mem::forget`) keeps that credit for
/// good: the peer's window shrinks by one.
pub struct Received<'a> {
    chan: &'a mut WriteChannel,
    offset: usize,
    len: usize,
}

impl Received<'_> {
    /// The length of the write.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the write was empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Copies the write's bytes from `offset` into `dst` with volatile
    /// reads.
    ///
    /// # Errors
    /// [`rdma_verbs::Error::OutOfBounds`] unless `offset + dst.len() <= len()`.
    pub fn copy_to_slice(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        match offset.checked_add(dst.len()) {
            Some(end) if end <= self.len => {
                (self.chan.inbox.copy_to_slice(self.offset + offset, dst)).map_err(Error::from)
            }
            _ => Err(rdma_verbs::Error::OutOfBounds {
                offset: offset as u64,
                len: dst.len() as u64,
                size: self.len as u64,
            }
            .into()),
        }
    }

    /// Copies the write's bytes from `offset` into `dst`, a slice of
    /// plain-old-data `T`, in host byte order
    /// ([`SharedBuffer::read_into`]).
    ///
    /// # Errors
    /// As [`copy_to_slice`](Self::copy_to_slice).
    pub fn read_into<T: rdma_verbs::bytemuck::Pod>(
        &self,
        offset: usize,
        dst: &mut [T],
    ) -> Result<()> {
        self.copy_to_slice(offset, rdma_verbs::bytemuck::cast_slice_mut(dst))
    }
}

impl Drop for Received<'_> {
    fn drop(&mut self) {
        self.chan.release();
    }
}

impl std::fmt::Debug for Received<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Received")
            .field("offset", &self.offset)
            .field("len", &self.len)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::Window;
    use crate::ChannelProblem;

    #[test]
    fn credits_bound_writes() {
        let mut w = Window::new(2);
        assert_eq!((w.write(), w.write()), (0, 1));
        assert_eq!(w.counts.credits(), 0);
        assert_eq!(
            w.credit(3),
            Err(ChannelProblem::Credits {
                returned: 3,
                outstanding: 2
            })
        );
        assert!(w.credit(0).is_err());
        w.credit(1).unwrap();
        assert_eq!(
            (w.counts.credits(), w.counts.outstanding(), w.write()),
            (1, 1, 2)
        );
    }

    #[test]
    fn arrivals_in_order_within_the_window() {
        let mut w = Window::new(2);
        assert_eq!(
            w.arrived(1),
            Err(ChannelProblem::Sequence {
                got: 1,
                expected: 0
            })
        );
        w.arrived(0).unwrap();
        w.arrived(1).unwrap();
        assert_eq!(
            w.arrived(2),
            Err(ChannelProblem::Overrun { held: 3, window: 2 })
        );
        // A credit is owed only once a slot is released, and only once.
        assert_eq!(w.take_owed(), 0);
        w.release();
        assert_eq!(w.take_owed(), 1);
        w.arrived(2).unwrap();
        w.release();
        w.release();
        w.release(); // more releases than writes held: clamped
        assert_eq!((w.take_owed(), w.counts.held()), (2, 0));
    }

    #[test]
    fn sequence_numbers_wrap() {
        let mut w = Window::new(1);
        for k in 0..70_000u32 {
            assert_eq!(w.write(), k & 0xffff);
            w.credit(1).unwrap();
            w.arrived(k & 0xffff).unwrap();
            w.release();
            assert_eq!(w.take_owed(), 1);
        }
    }
}
