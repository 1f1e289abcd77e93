//! An eager message channel over RC: [`MessageChannel`] (its docs give
//! the protocol), [`Message`], and the credit accounting (`credits`).

use std::collections::VecDeque;
use std::mem::ManuallyDrop;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use rdma_verbs::{
    AccessFlags, CompletionQueue, Completions, ConnectOptions, Endpoint, LocalBuffer,
    ProtectionDomain, QpType, QueuePair, RecvQueue, SendQueue, Wr,
};

mod credits;

pub use credits::ChannelProblem;
use credits::{Credits, Incoming, HELLO_LEN};

/// `wr_id` of every receive.
const RECV: u64 = 1 << 40;
/// `wr_id` of an inline send.
const SEND_INLINE: u64 = 2 << 40;
/// `wr_id` of a send from send slot `i`: `SEND_SLOT | i`.
const SEND_SLOT: u64 = 3 << 40;
const SLOT_MASK: u64 = (1 << 32) - 1;
/// The inline size asked of the queue pair.
const INLINE: u32 = 64;
/// The hello's magic and version.
const MAGIC: [u8; 3] = *b"IMC";
const VERSION: u8 = 1;

/// An eager message channel over one RC queue pair: ordered messages with
/// credit flow control, so that a sender never overruns its receiver.
/// [`send`](Self::send) copies a message into a registered slot (or
/// inline) and posts it, blocking while the peer has no room;
/// [`recv`](Self::recv) hands out the next message in the buffer it
/// landed in.
///
///
/// # Protocol
///
/// *Send/receive into posted buffers*, not RDMA write with immediate into
/// a ring: each end posts `slots + reserve` receives of one slot each (one
/// registration carved with [`LocalBuffer::chunks_exact`]), and every
/// message is one `SEND_WITH_IMM`. The device writes only into receives
/// this end posted, so a message arrives in a buffer the channel owns
/// again once its completion is polled: [`recv`](MessageChannel::recv)
/// hands it out as a [`Message`] that dereferences to `&[u8]`, no copy
/// and no `unsafe`. No memory of this end is remotely writable (its
/// buffers are registered `LOCAL_WRITE` only), so a hostile peer can only
/// send messages, never change bytes behind a reference. A ring written
/// with RDMA would need `SharedBuffer` memory and a volatile copy out of
/// every slot, and a way to tell a complete slot from one being written.
///
/// The 32 bits of immediate data carry, from the top: a control bit, a
/// 15-bit sequence number (per direction, all messages), and 16 bits of
/// *credits returned*: messages of the other direction whose receives
/// this end has posted again.
///
/// * The first message of each end is a **hello** (control, 12 bytes:
///   `b"IMC"`, version 1, slot count and slot size, big-endian u32s). It
///   grants the peer `slots` credits; both ends must have the same slot
///   count and size ([`ChannelProblem::Hello`] otherwise).
/// * A **data** message takes one credit and returns every credit owed.
/// * A **credit** message (control, no payload) returns owed credits when
///   at least half the window is owed and this end sends nothing: from
///   [`Message`]'s drop, or at the next call when the send queue was full.
///
/// Control messages take no credit: they land in the `reserve` receives
/// posted beyond the window (`slots / ceil(slots / 2)`: 2 for an even
/// window, 1 for an odd one), which the
/// receiver posts again as soon as it has polled them. Why that many
/// always suffice is proven in the module `credits` (and tested there
/// against every interleaving a random scheduler finds): at most `slots`
/// data and `reserve` control messages hold a receive at any time, however
/// late either end polls. So a message always finds a posted receive (no
/// RNR retry once both ends posted theirs, which
/// [`connect`](MessageChannel::connect) does before its hello goes out),
/// and a receive buffer is never written while its [`Message`]
/// lives.
///
/// A message larger than a slot is refused ([`Error::MessageTooLarge`]),
/// not split: splitting would need reassembly state and hand out messages
/// no slot holds, losing the zero-copy receive.
///
/// # Completions
///
/// The channel creates its queue pair, and a completion queue with a
/// completion channel of its own that nothing else reports to, so it
/// never swallows another queue's completions and can sleep in
/// [`CompletionQueue::wait`]. [`queue_pair`](MessageChannel::queue_pair)
/// is for making its [`Endpoint`]; posting on it directly breaks the
/// protocol (such completions are reported as
/// [`ChannelProblem::Unexpected`]).
///
/// # Errors and failure
///
/// An error completion (a peer that went away shows as
/// [`WcStatus::RetryExcErr`](rdma_verbs::WcStatus::RetryExcErr) on this end's
/// next send), a message that breaks the protocol
/// ([`Error::ChannelProtocol`]) or a failed verb is returned once; the
/// channel moves its queue pair to ERR, and every later call returns
/// [`rdma_verbs::Error::QueuePairInError`]. Messages that arrived before are still
/// handed out by [`recv`](MessageChannel::recv), in order, before the error.
/// A receiver learns that its peer is gone only by sending (RC has no
/// keep-alive): a pure receiver sees its [`recv`](MessageChannel::recv)
/// time out. A sender sees its credits stop coming back
/// ([`Error::TimedOut`]) and its messages fail once the device gives up
/// retrying (`retry_cnt` ACK timeouts; `rnr_retry` 7 retries RNR for
/// ever, and since the channel never makes its peer answer RNR once both
/// ends are connected, a finite `rnr_retry` is safe). SoftRoCE's loopback
/// was seen to leave a send to a destroyed queue pair without any
/// completion: there the loss shows only as the timeouts of
/// [`send`](MessageChannel::send) and [`flush`](MessageChannel::flush).
///
/// # Deadlock
///
/// Credits come back only when the receiving user drops the [`Message`]s:
/// two ends that only send, both blocked in
/// [`send`](MessageChannel::send), wait for each other (as two TCP
/// peers that only write). A protocol that sends both ways interleaves
/// sends with receives, using a timeout of zero to try.
///
/// # Example
/// ```no_run
/// use std::time::Duration;
/// use rdma_verbs::*;
/// use rdma_verbs_runtime::{MessageChannel, Result};
/// # fn demo(pd: &ProtectionDomain, local: &LocalPort, port: PortNumber,
/// #         exchange: impl Fn(Endpoint) -> Endpoint) -> Result<()> {
/// // 8 slots of 4 KiB; the peer creates its end with the same numbers.
/// let mut ch = MessageChannel::create(pd, 8, 4096)?;
/// let me = local.endpoint(ch.queue_pair(), Endpoint::random_psn())?;
/// let peer = exchange(me); // out of band
/// ch.connect(&me, &peer, &ConnectOptions::new(port).local_port(local))?;
///
/// ch.send(b"ping", Some(Duration::from_secs(5)))?;
/// if let Some(msg) = ch.recv(Some(Duration::from_secs(5)))? {
///     println!("{} bytes: {:?}", msg.len(), &msg[..]);
/// } // dropping `msg` posts its buffer again and returns its credit
/// # Ok(()) }
/// ```
///
/// # References
/// `ibv_post_send(3)` (`IBV_WR_SEND_WITH_IMM`), `ibv_post_recv(3)`,
/// `ibv_poll_cq(3)`, `ibv_req_notify_cq(3)`; IBA 9.7.5.2.8 (RNR NAK),
/// 17.3 (receive queue processing).
pub struct MessageChannel {
    qp: QueuePair,
    cq: CompletionQueue,
    credits: Credits,
    slots: u32,
    slot_size: usize,
    /// Messages up to this long are sent inline.
    inline_max: usize,
    /// Send slots not posted (whole).
    send_free: Vec<LocalBuffer>,
    /// The unsent rest of each posted send slot, by slot index.
    send_tails: Vec<Option<LocalBuffer>>,
    /// Address of send slot 0, and the slot stride.
    send_base: u64,
    send_stride: u64,
    /// Receive slots to post at `connect`.
    unposted: Vec<LocalBuffer>,
    /// Data messages polled, not yet handed out (at most `slots`).
    stash: VecDeque<(LocalBuffer, usize)>,
    done: Completions,
    /// Completions polled, not yet handled (room for a whole poll).
    polled: VecDeque<rdma_verbs::Completion>,
    /// The queue pair's posting handles, taken once it is connected.
    sq: Option<SendQueue>,
    rq: Option<RecvQueue>,
    sq_used: u32,
    sq_depth: u32,
    connected: bool,
    failed: bool,
    /// An error met where it could not be returned (a [`Message`]'s drop).
    pending: Option<Error>,
}

impl MessageChannel {
    /// Creates an unconnected channel end on `pd`: `slots` receive slots
    /// of `slot_size` bytes for the peer's messages (the window), as many
    /// send slots, an RC queue pair and its completion queue with a
    /// completion channel of its own. Connect it with
    /// [`connect`](Self::connect).
    ///
    /// Memory: at most `(2 slots + 2) × max(slot_size, 12)` registered
    /// bytes, in two registrations.
    ///
    /// # Errors
    /// [`rdma_verbs::Error::OutOfRange`] for `slots` outside `1..=4096` or a
    /// `slot_size` above `u32::MAX`; [`rdma_verbs::Error::Verb`] naming the verb
    /// that failed (`ibv_create_comp_channel`, `ibv_create_cq`,
    /// `ibv_create_qp`, `ibv_reg_mr`).
    ///
    /// # References
    /// `ibv_create_qp(3)`, `ibv_create_cq(3)`, `ibv_reg_mr(3)`
    pub fn create(pd: &ProtectionDomain, slots: u32, slot_size: usize) -> Result<MessageChannel> {
        if !(1..=credits::MAX_WINDOW).contains(&slots) {
            return Err(rdma_verbs::Error::OutOfRange {
                what: "message channel slots",
                value: u64::from(slots),
                max: u64::from(credits::MAX_WINDOW),
            }
            .into());
        }
        if u32::try_from(slot_size).is_err() {
            return Err(rdma_verbs::Error::OutOfRange {
                what: "message channel slot size",
                value: slot_size as u64,
                max: u64::from(u32::MAX),
            }
            .into());
        }
        let reserve = credits::reserve(slots);
        // Data sends (at most `slots`) plus control messages (the hello,
        // credit returns): see `return_credits` for why this is room
        // enough and what happens when it is not.
        let sq_depth = slots + reserve + 1;
        let rq_depth = slots + reserve;
        let ctx = pd.context();
        let channel = ctx.create_comp_channel()?;
        let cq = ctx
            .create_cq(sq_depth + rq_depth)
            .channel(&channel)
            .build()?;
        let build = |inline| {
            pd.create_qp(QpType::Rc, &cq, &cq)
                .max_send_wr(sq_depth)
                .max_recv_wr(rq_depth)
                .max_inline_data(inline)
                .build()
        };
        // A device without inline sends copies every message into a slot.
        let qp = build(INLINE).or_else(|_| build(0))?;
        let inline_max = qp.caps().max_inline_data.min(INLINE) as usize;
        let size = slot_size.max(HELLO_LEN);
        let recv = pd.alloc(rq_depth as usize * size, AccessFlags::LOCAL_WRITE)?;
        let (unposted, _) = recv.chunks_exact(size);
        let send = pd.alloc(slots as usize * size, AccessFlags::LOCAL_WRITE)?;
        let send_base = send.addr();
        let (send_free, _) = send.chunks_exact(size);
        Ok(MessageChannel {
            qp,
            cq,
            credits: Credits::new(slots),
            slots,
            slot_size,
            inline_max,
            send_tails: (0..slots).map(|_| None).collect(),
            send_free,
            send_base,
            send_stride: size as u64,
            unposted,
            stash: VecDeque::with_capacity(slots as usize),
            done: Completions::with_capacity((sq_depth + rq_depth) as usize),
            polled: VecDeque::with_capacity((sq_depth + rq_depth) as usize),
            sq: None,
            rq: None,
            sq_used: 0,
            sq_depth,
            connected: false,
            failed: false,
            pending: None,
        })
    }

    /// The channel's queue pair, for its [`Endpoint`]
    /// ([`LocalPort::endpoint`](rdma_verbs::LocalPort::endpoint)). Connect it
    /// with [`connect`](Self::connect), and post nothing on it: the
    /// channel takes every completion of its queue for its own.
    pub fn queue_pair(&self) -> &QueuePair {
        &self.qp
    }

    /// The largest message: the slot size.
    pub fn max_message(&self) -> usize {
        self.slot_size
    }

    /// Data messages this end may send now without waiting (0 until the
    /// peer's hello was polled).
    pub fn credits(&self) -> u32 {
        self.credits.credits()
    }

    /// Connects the queue pair ([`QueuePair::connect`]), posts every
    /// receive slot and sends the hello; [`send`](Self::send) and
    /// [`recv`](Self::recv) wait for the peer's. Connect the peer
    /// promptly: a message to a queue pair not connected yet is dropped,
    /// and retried `retry_cnt` times an ACK timeout apart (about half a
    /// second with the defaults of [`ConnectOptions`]; raise
    /// [`ConnectOptions::timeout`] for more) before the hello fails with
    /// [`WcStatus::RetryExcErr`](rdma_verbs::WcStatus::RetryExcErr), reported
    /// by the next call. (Sending the hello at the first call instead
    /// would make a peer that waits for this end before its own first
    /// call wait for ever.)
    ///
    /// # Errors
    /// As [`QueuePair::connect`]; [`rdma_verbs::Error::Verb`] naming `ibv_post_recv`
    /// or `ibv_post_send`. A channel connected once is refused with
    /// [`rdma_verbs::Error::InvalidTransition`] by the queue pair.
    pub fn connect(
        &mut self,
        local: &Endpoint,
        remote: &Endpoint,
        opts: &ConnectOptions,
    ) -> Result<()> {
        self.qp.connect(local, remote, opts)?;
        self.sq = Some(self.qp.send_queue()?);
        self.rq = Some(self.qp.recv_queue()?);
        while let Some(buf) = self.unposted.pop() {
            if let Err(e) = self.repost(buf) {
                return Err(self.fail(e));
            }
        }
        self.connected = true;
        let mut hello = [0u8; HELLO_LEN];
        hello[..3].copy_from_slice(&MAGIC);
        hello[3] = VERSION;
        hello[4..8].copy_from_slice(&self.slots.to_be_bytes());
        hello[8..].copy_from_slice(&(self.slot_size as u32).to_be_bytes());
        self.post(&hello, false)
    }

    /// Sends `data` as one message: copies it inline or into a free send
    /// slot and posts it. Waits (polling, then sleeping on the completion
    /// channel) while the peer has no free slot for it or no send slot is
    /// free, at most `timeout` (`None`: no limit; zero: do not wait).
    /// Returns once the message is posted; it is delivered in order.
    ///
    /// # Errors
    /// * [`Error::MessageTooLarge`] when `data` is longer than a slot
    ///   (nothing sent; the channel stays usable);
    /// * [`Error::TimedOut`] when no credit (or send slot) came within
    ///   `timeout` (nothing sent; the channel stays usable);
    /// * [`rdma_verbs::Error::NotReadyToSend`] before [`connect`](Self::connect);
    /// * [`rdma_verbs::Error::WorkCompletion`] for an error completion (a peer that
    ///   went away: `RetryExcErr`), [`Error::ChannelProtocol`] for a peer
    ///   that broke the protocol, [`rdma_verbs::Error::Verb`] for a verb that failed:
    ///   then the channel is broken, and later calls return
    ///   [`rdma_verbs::Error::QueuePairInError`].
    pub fn send(&mut self, data: &[u8], timeout: Option<Duration>) -> Result<()> {
        if data.len() > self.slot_size {
            return Err(Error::MessageTooLarge {
                len: data.len(),
                max: self.slot_size,
            });
        }
        self.usable("MessageChannel::send")?;
        let deadline = deadline(timeout);
        loop {
            if self.credits.credits() > 0
                && self.sq_used < self.slots
                && (data.len() <= self.inline_max || !self.send_free.is_empty())
            {
                return self.post(data, true);
            }
            if !self.turn(deadline)? {
                return Err(Error::TimedOut {
                    op: "MessageChannel::send",
                    timeout: timeout.unwrap_or_default(),
                });
            }
        }
    }

    /// The next message, waiting for it at most `timeout` (`None`: no
    /// limit; zero: do not wait); `Ok(None)` when none came in time.
    ///
    /// The [`Message`] is the receive buffer the message landed in; while
    /// it lives the channel is borrowed, and dropping it posts the buffer
    /// again and returns its credit to the peer.
    ///
    /// # Errors
    /// As [`send`](Self::send) but for the size and the timeout. Messages
    /// that arrived before an error are handed out first.
    pub fn recv(&mut self, timeout: Option<Duration>) -> Result<Option<Message<'_>>> {
        let deadline = deadline(timeout);
        loop {
            if let Some((buf, len)) = self.stash.pop_front() {
                return Ok(Some(Message {
                    buf: ManuallyDrop::new(buf),
                    len,
                    chan: self,
                }));
            }
            self.usable("MessageChannel::recv")?;
            match self.turn(deadline) {
                Ok(true) => {}
                Ok(false) => return Ok(None),
                // Hand out what came before the error first.
                Err(e) if !self.stash.is_empty() => {
                    self.pending.get_or_insert(e);
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Waits until every message posted so far was acknowledged by the
    /// peer's device (it is in one of the peer's receives), at most
    /// `timeout` (`None`: no limit). Dropping the channel discards
    /// messages still in flight (its queue pair is destroyed): flush
    /// first to hand the last ones over.
    ///
    /// # Errors
    /// [`Error::TimedOut`] when some are still in flight after `timeout`;
    /// otherwise as [`send`](Self::send) but for the size.
    pub fn flush(&mut self, timeout: Option<Duration>) -> Result<()> {
        self.usable("MessageChannel::flush")?;
        let deadline = deadline(timeout);
        while self.sq_used > 0 {
            if !self.turn(deadline)? {
                return Err(Error::TimedOut {
                    op: "MessageChannel::flush",
                    timeout: timeout.unwrap_or_default(),
                });
            }
        }
        Ok(())
    }

    /// Checks that the channel may be used: connected, not broken, no
    /// error waiting to be reported.
    fn usable(&mut self, op: &'static str) -> Result<()> {
        if let Some(e) = self.pending.take() {
            return Err(e);
        }
        if self.failed {
            return Err(rdma_verbs::Error::QueuePairInError { verb: op }.into());
        }
        if !self.connected {
            return Err(rdma_verbs::Error::NotReadyToSend {
                state: rdma_verbs::QpState::Reset,
            }
            .into());
        }
        Ok(())
    }

    /// Posts one message (the caller checked the credit, the send queue
    /// and the send slot for data; `connect` for the hello).
    fn post(&mut self, data: &[u8], is_data: bool) -> Result<()> {
        let imm = self.credits.stamp(is_data);
        let Some(sq) = self.sq.as_mut() else {
            return Err(rdma_verbs::Error::NotReadyToSend {
                state: rdma_verbs::QpState::Reset,
            }
            .into());
        };
        let posted = if data.len() <= self.inline_max {
            sq.send_inline(data, Wr::id(SEND_INLINE).imm(imm))
                .map_err(Error::from)
        } else {
            // Never empty here: a data send checked it; the hello is the
            // first send and a slot holds it.
            let Some(slot) = self.send_free.pop() else {
                return Err(self.fail(
                    rdma_verbs::Error::QueueFull {
                        queue: "message channel send slots",
                        depth: self.slots,
                    }
                    .into(),
                ));
            };
            let i = ((slot.addr() - self.send_base) / self.send_stride) as usize;
            let (mut head, tail) = slot.split_at(data.len());
            head.copy_from_slice(data);
            self.send_tails[i] = Some(tail);
            sq.send(head, Wr::id(SEND_SLOT | i as u64).imm(imm))
                .map_err(Error::from)
        };
        match posted {
            Ok(()) => {
                self.sq_used += 1;
                Ok(())
            }
            Err(e) => Err(self.fail(e)),
        }
    }

    /// Returns owed credits in a control message when enough are owed and
    /// the send queue has room. The queue holds `slots` data sends and
    /// `reserve + 1` more; control sends whose completions were not
    /// polled yet can take those, and then the return waits for the next
    /// call (every call polls, and the completions it waits for arrive).
    fn return_credits(&mut self) -> Result<()> {
        if self.credits.should_return() && self.sq_used < self.sq_depth && !self.failed {
            self.post(&[], false)?;
        }
        Ok(())
    }

    /// One round: returns due credits, polls (sleeping on the completion
    /// channel until `deadline` when nothing is there) and processes what
    /// came. `Ok(false)`: nothing came in time.
    fn turn(&mut self, deadline: Option<Instant>) -> Result<bool> {
        self.return_credits()?;
        let n = match self.poll_in(None) {
            Ok(0) => {
                let left = match deadline {
                    None => None,
                    Some(d) => match d.checked_duration_since(Instant::now()) {
                        Some(left) if !left.is_zero() => Some(left),
                        _ => return Ok(false),
                    },
                };
                self.poll_in(Some(left))
            }
            other => other,
        };
        match n {
            Ok(0) => Ok(false),
            Ok(_) => self.process().map(|()| true),
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

    /// Handles every polled completion: counts sends back, checks and
    /// counts messages, posts control messages' receives again. On the
    /// first error the channel fails (its queue pair moves to ERR) and
    /// what completed before is taken in all the same: messages that
    /// landed are still handed out, in order.
    fn process(&mut self) -> Result<()> {
        let mut first_error = None;
        while let Some(c) = self.polled.pop_front() {
            if let Some(e) = self.handle(c) {
                first_error.get_or_insert(e);
            }
        }
        let Some(e) = first_error else {
            return Ok(());
        };
        if self.failed {
            return Err(e);
        }
        let e = self.fail(e);
        // After the move to ERR nothing more succeeds: the successful
        // completions still queued came before it.
        while matches!(self.poll_in(None), Ok(n) if n > 0) {
            while let Some(c) = self.polled.pop_front() {
                let _ = self.handle(c);
            }
        }
        Err(e)
    }

    /// Handles one completion; its error, if any. Once the channel failed,
    /// only messages are taken in (nothing is posted again).
    fn handle(&mut self, mut c: rdma_verbs::Completion) -> Option<Error> {
        if let Err(e) = c.result() {
            return Some(e.into()); // buffers dropped with `c`: the device is done
        }
        let wr_id = c.wr_id();
        if wr_id == SEND_INLINE || wr_id & !SLOT_MASK == SEND_SLOT {
            self.sq_used = self.sq_used.saturating_sub(1);
            if wr_id != SEND_INLINE {
                let i = (wr_id & SLOT_MASK) as usize;
                let joined = match (c.take_local(), self.send_tails.get_mut(i)) {
                    (Some(head), Some(tail)) => tail.take().map(|t| head.unsplit(t)),
                    _ => None,
                };
                match joined {
                    Some(Ok(slot)) => self.send_free.push(slot),
                    _ => return Some(unexpected("a send slot that is not the channel's")),
                }
            }
            return None;
        }
        let (Some(buf), true) = (c.take_local(), wr_id == RECV) else {
            return Some(unexpected("a completion the channel did not post"));
        };
        let Some(imm) = c.imm_data() else {
            return Some(unexpected("a message without immediate data"));
        };
        let len = c.byte_len() as usize;
        match self.credits.receive(imm, len) {
            // At most `slots` held (checked): the stash never grows.
            Ok(Incoming::Data) => self.stash.push_back((buf, len)),
            Ok(Incoming::Credit) if !self.failed => return self.repost(buf).err(),
            Ok(Incoming::Hello) => match self.check_hello(&buf) {
                Ok(()) => {
                    self.credits.hello();
                    if !self.failed {
                        return self.repost(buf).err();
                    }
                }
                Err(problem) => return Some(Error::ChannelProtocol { problem }),
            },
            Ok(Incoming::Credit) => {}
            Err(problem) => return Some(Error::ChannelProtocol { problem }),
        }
        None
    }

    /// Checks the peer's hello against this end's parameters.
    fn check_hello(&self, buf: &[u8]) -> std::result::Result<(), ChannelProblem> {
        let word = |at: usize| u32::from_be_bytes([buf[at], buf[at + 1], buf[at + 2], buf[at + 3]]);
        let mismatch = |field, ours: u64, theirs: u64| {
            (ours != theirs).then_some(ChannelProblem::Hello {
                field,
                ours,
                theirs,
            })
        };
        let magic = |b: &[u8]| u64::from(u32::from_be_bytes([0, b[0], b[1], b[2]]));
        let problem = mismatch("magic", magic(&MAGIC), magic(&buf[..3]))
            .or_else(|| mismatch("version", VERSION.into(), buf[3].into()))
            .or_else(|| mismatch("slots", self.slots.into(), word(4).into()))
            .or_else(|| mismatch("slot_size", self.slot_size as u64, word(8).into()));
        problem.map_or(Ok(()), Err)
    }

    /// Posts a receive again (a control message's, at once).
    fn repost(&mut self, buf: LocalBuffer) -> Result<()> {
        let Some(rq) = self.rq.as_mut() else {
            return Err(rdma_verbs::Error::NotReadyToSend {
                state: rdma_verbs::QpState::Reset,
            }
            .into());
        };
        rq.recv(buf, RECV).map_err(Error::from)
    }

    /// A released message's buffer: posted again, its credit owed (and
    /// returned now if enough are owed). Errors wait for the next call.
    fn release(&mut self, buf: LocalBuffer) {
        if self.failed {
            return; // the queue pair is in ERR: the buffer is dropped
        }
        let result = match self.repost(buf) {
            Ok(()) => {
                self.credits.release();
                self.return_credits()
            }
            Err(e) => Err(self.fail(e)),
        };
        if let Err(e) = result {
            self.pending.get_or_insert(e);
        }
    }

    /// Marks the channel broken (its queue pair to ERR, so the peer's
    /// sends fail too) and gives `e` back to be returned.
    fn fail(&mut self, e: Error) -> Error {
        if !self.failed {
            self.failed = true;
            // Best effort: the channel refuses everything from now on.
            let _ = self.qp.to_err();
        }
        e
    }
}

impl std::fmt::Debug for MessageChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MessageChannel")
            .field("qp_num", &self.qp.qp_num())
            .field("slots", &self.slots)
            .field("slot_size", &self.slot_size)
            .field("credits", &self.credits.credits())
            .field("queued", &self.stash.len())
            .field("failed", &self.failed)
            .finish()
    }
}

fn unexpected(what: &'static str) -> Error {
    Error::ChannelProtocol {
        problem: ChannelProblem::Unexpected { what },
    }
}

/// The deadline `timeout` from now (`None`: none; one past what `Instant`
/// holds is as good as none).
fn deadline(timeout: Option<Duration>) -> Option<Instant> {
    timeout.and_then(|t| Instant::now().checked_add(t))
}

/// A received message: the receive buffer it landed in, borrowed from its
/// [`MessageChannel`] until dropped. Dereferences to its bytes.
///
/// Dropping it posts the buffer again (the peer may write it from then
/// on, which is why the bytes cannot outlive it: see
/// [`crate::hazards`]) and returns its credit, in a message of its own
/// once half the window is owed. Forgetting it (`mem::forget`) leaks the
/// buffer and the peer's credit for good: the window shrinks by one.
pub struct Message<'a> {
    chan: &'a mut MessageChannel,
    buf: ManuallyDrop<LocalBuffer>,
    len: usize,
}

impl std::ops::Deref for Message<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl Drop for Message<'_> {
    fn drop(&mut self) {
        // SAFETY: `buf` is taken only here, once; `self` is not used after.
        let buf = unsafe { ManuallyDrop::take(&mut self.buf) };
        self.chan.release(buf);
    }
}

impl std::fmt::Debug for Message<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Message").field("len", &self.len).finish()
    }
}
