//! The send queue's exclusive posting handle (DESIGN.md, "Posting").

use std::ptr::NonNull;
use std::sync::Arc;

use rdma_verbs_sys as sys;

use super::post::{fill_sges, inline_sge, write_send_wr, SendScratch};
use super::request::{Dest, Op, SendRequest, UdDest};
use super::PostSendFn;
use crate::error::{Error, Result};
use crate::inflight::{Payload, Reserved, Ring};
use crate::memory::buffer::RemoteKey;
use crate::memory::buffer::{Buf, DeviceReadable, DeviceWritable, RemoteMemory, SgList};
use crate::qp::queue_pair::QueuePair;
use crate::types::QpType;

/// The options of one request: the `wr_id` its completion reports, and
/// the flags and immediate data (or key to invalidate) it carries.
///
/// ```
/// # use rdma_verbs::Wr;
/// let o = Wr::id(7).imm(0x1234).fence();
/// # let _ = o;
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[must_use]
pub struct Wr {
    pub(super) wr_id: u64,
    /// Immediate data (host order) or the key to invalidate.
    pub(super) data: u32,
    /// `IBV_SEND_*` flags, `IBV_SEND_SIGNALED` *inverted* (so that
    /// `Wr::default()` is a signaled request), and the two bits below.
    pub(super) bits: u32,
}

/// `Wr::bits`: `data` is immediate data.
const HAS_IMM: u32 = 1 << 31;
/// `Wr::bits`: `data` is a key to invalidate.
const HAS_INV: u32 = 1 << 30;
/// `Wr::bits`: no completion asked for.
const UNSIGNALED: u32 = sys::ibv_send_flags::IBV_SEND_SIGNALED.0;
const FENCE: u32 = sys::ibv_send_flags::IBV_SEND_FENCE.0;
const SOLICITED: u32 = sys::ibv_send_flags::IBV_SEND_SOLICITED.0;
const INLINE: u32 = sys::ibv_send_flags::IBV_SEND_INLINE.0;

impl Wr {
    /// A signaled request whose completion reports `wr_id`.
    #[inline(always)]
    pub const fn id(wr_id: u64) -> Wr {
        Wr {
            wr_id,
            data: 0,
            bits: 0,
        }
    }
    /// With immediate data (send → `SEND_WITH_IMM`, RDMA write →
    /// `RDMA_WRITE_WITH_IMM`), in host order.
    #[inline(always)]
    pub const fn imm(mut self, imm: u32) -> Wr {
        self.data = imm;
        self.bits = (self.bits & !HAS_INV) | HAS_IMM;
        self
    }
    /// A send that also invalidates the peer's memory window (or region)
    /// with remote key `rkey` (`IBV_WR_SEND_WITH_INV`; RC sends only, not
    /// with immediate data).
    #[doc(alias = "IBV_WR_SEND_WITH_INV")]
    #[inline(always)]
    pub const fn invalidate(mut self, rkey: RemoteKey) -> Wr {
        self.data = rkey.0;
        self.bits = (self.bits & !HAS_IMM) | HAS_INV;
        self
    }
    /// No completion (`IBV_SEND_SIGNALED` clear): only for requests whose
    /// buffers the device only reads and nobody owns exclusively (inline
    /// data, frozen buffers); a later completion of the queue releases
    /// them.
    #[inline(always)]
    pub const fn unsignaled(mut self) -> Wr {
        self.bits |= UNSIGNALED;
        self
    }
    /// Whether a completion is asked for (the default).
    #[inline(always)]
    pub const fn is_signaled(self) -> bool {
        self.bits & UNSIGNALED == 0
    }
    /// `IBV_SEND_FENCE`: wait for earlier RDMA reads and atomics first.
    #[inline(always)]
    pub const fn fence(mut self) -> Wr {
        self.bits |= FENCE;
        self
    }
    /// `IBV_SEND_SOLICITED`: a solicited event at the receiver.
    #[inline(always)]
    pub const fn solicited(mut self) -> Wr {
        self.bits |= SOLICITED;
        self
    }
    /// `IBV_SEND_INLINE`: the buffer's bytes are copied into the request
    /// at post time (the request still keeps the buffer).
    #[inline(always)]
    pub const fn inline(mut self) -> Wr {
        self.bits |= INLINE;
        self
    }
    /// The `wr_id`.
    #[inline(always)]
    pub const fn wr_id(self) -> u64 {
        self.wr_id
    }

    /// The request of the general path: `op` over `sg`, with these options.
    pub(super) fn request(self, op: Op, sg: SgList) -> SendRequest<'static> {
        let mut r = SendRequest::of(op, sg).wr_id(self.wr_id);
        r.flags = (self.bits & (FENCE | SOLICITED | INLINE | UNSIGNALED)) ^ UNSIGNALED;
        if self.bits & HAS_IMM != 0 {
            r.imm = Some(self.data);
        }
        if self.bits & HAS_INV != 0 {
            r.invalidate = Some(self.data);
        }
        r
    }
}

/// A request the queue did not take, with what it carried: nothing was
/// posted. `?` turns it into an [`Error`] (dropping the buffers) or, keeping
/// them, into a `Box<dyn std::error::Error>`.
#[derive(Debug)]
pub struct Refused<B> {
    /// Why.
    pub error: Error,
    /// What it carried, back.
    pub buf: B,
}

impl<B> std::fmt::Display for Refused<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.error, f)
    }
}

impl<B: std::fmt::Debug> std::error::Error for Refused<B> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        std::error::Error::source(&self.error)
    }
}

impl<B> From<Refused<B>> for Error {
    fn from(r: Refused<B>) -> Error {
        r.error
    }
}

impl<B> From<Refused<B>> for std::io::Error {
    fn from(r: Refused<B>) -> std::io::Error {
        r.error.into()
    }
}

/// A post's result: on refusal the request's buffer comes back.
pub type Posted<B = Buf> = std::result::Result<(), Refused<B>>;

/// The exclusive posting handle of a queue pair's send queue
/// ([`QueuePair::send_queue`]): every post takes `&mut self`, no lock and
/// no atomic read-modify-write. One exists at a time, only while the queue
/// pair is in a state that sends (RTS, SQD, SQE or ERR, which flushes);
/// moves to RESET, INIT or RTR are refused while it lives. Share it across
/// threads in a `Mutex`.
///
/// Each post takes the request's buffer (it moves into the request's slot
/// in the in-flight store) until its completion hands it back, and a
/// [`Wr`] naming the `wr_id` and options.
///
/// # References
/// `ibv_post_send(3)`, `ibv_wr_post(3)`
pub struct SendQueue {
    ring: NonNull<Ring>,
    /// The ring's id (a prepared request names the ring it was built for).
    pub(super) ring_id: u32,
    post_fn: PostSendFn,
    qp_ptr: *mut sys::ibv_qp,
    /// The queue pair's protection domain, compared with each buffer's.
    pd: *const (),
    /// RC with an SGE and classic posting: what the common case needs.
    fast: bool,
    /// The C request of the common case, its unchanging fields written once.
    wr: sys::ibv_send_wr,
    sge: sys::ibv_sge,
    /// Chains, allocated by the first.
    scratch: SendScratch,
    qp: QueuePair,
}

// SAFETY: the handle is the ring's only user (RingCell) and the QP's verbs
// are thread-safe.
unsafe impl Send for SendQueue {}
// SAFETY: everything that touches the ring, the template or the scratch
// takes `&mut self`; `&self` reaches only the queue pair (Sync).
unsafe impl Sync for SendQueue {}

impl Drop for SendQueue {
    fn drop(&mut self) {
        self.qp.inner.send_ring.give_back();
    }
}

impl std::fmt::Debug for SendQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendQueue")
            .field("qp_num", &self.qp.qp_num())
            .finish()
    }
}

impl QueuePair {
    /// The send queue's exclusive posting handle.
    ///
    /// # Errors
    /// [`Error::QueueTaken`] while another handle has the queue;
    /// [`Error::NotReadyToSend`] in RESET, INIT or RTR (rxe would queue a
    /// send there and run it later, after its buffer came back).
    ///
    /// # Example
    /// ```no_run
    /// # fn demo(qp: &rdma_verbs::QueuePair, buf: rdma_verbs::LocalBuffer,
    /// #         remote: rdma_verbs::RemoteMemory) -> rdma_verbs::Result<()> {
    /// use rdma_verbs::Wr;
    /// let mut sq = qp.send_queue()?;
    /// sq.write(buf, remote, Wr::id(1))?;
    /// # Ok(()) }
    /// ```
    pub fn send_queue(&self) -> Result<SendQueue> {
        let _control = self.inner.control.lock();
        let state = self.tracked_state();
        if !super::state_sends(state) {
            return Err(Error::NotReadyToSend {
                state: crate::types::QpState::from_raw(state),
            });
        }
        let ring = self.inner.send_ring.take().ok_or(Error::QueueTaken {
            queue: "send queue",
        })?;
        let caps = &self.inner.caps;
        Ok(SendQueue {
            ring,
            ring_id: self.inner.send_ring.id(),
            post_fn: self.inner.post_send_fn,
            qp_ptr: self.as_ptr(),
            pd: Arc::as_ptr(&self.inner.pd.inner).cast(),
            fast: self.inner.qp_type == QpType::Rc
                && caps.max_send_sge >= 1
                && self.inner.qpx.is_none()
                && !self.inner.sq_sig_all,
            // One SGE, never empty (`post_buf`): set once.
            wr: sys::ibv_send_wr {
                num_sge: 1,
                ..Default::default()
            },
            sge: sys::ibv_sge::default(),
            scratch: SendScratch::new(self.send_capacity(), caps.max_send_sge),
            qp: self.clone(),
        })
    }
}

impl SendQueue {
    /// The queue pair.
    pub fn qp(&self) -> &QueuePair {
        &self.qp
    }

    /// A send of `buf` (`IBV_WR_SEND`; with [`Wr::imm`] `SEND_WITH_IMM`,
    /// with [`Wr::invalidate`] `SEND_WITH_INV`).
    ///
    /// # Errors
    /// As [`post_chain`](Self::post_chain), for one request; the buffer
    /// comes back in the [`Refused`].
    #[inline]
    pub fn send(&mut self, buf: impl DeviceReadable, o: Wr) -> Posted {
        self.post_buf(Op::Send, buf.into(), o, false)
    }

    /// A send gathering several buffers in order.
    ///
    /// # Errors
    /// As [`send`](Self::send); the buffers come back.
    pub fn send_sgl(&mut self, bufs: Vec<Buf>, o: Wr) -> Posted<Vec<Buf>> {
        self.post_sgl(Op::Send, bufs, None, o)
    }

    /// A send of `data` copied into the request (`IBV_SEND_INLINE`): the
    /// bytes are copied before this returns, so they need no registration.
    ///
    /// # Errors
    /// As [`send`](Self::send); [`Error::InlineTooLarge`] beyond the queue
    /// pair's `max_inline_data`.
    pub fn send_inline(&mut self, data: &[u8], o: Wr) -> Result<()> {
        self.post_inline(Op::Send, data, None, o)
    }

    /// A UD send of `buf` to `dest` (address handle, queue pair, Q_Key).
    ///
    /// # Errors
    /// As [`send`](Self::send); [`Error::UdMessageTooLong`] beyond the
    /// port's MTU (the device would drop it with a *successful*
    /// completion).
    pub fn send_to(&mut self, buf: impl DeviceReadable, dest: &UdDest, o: Wr) -> Posted {
        let mut r = o.request(Op::Send, SgList::One(buf.into()));
        r.ud = Some(Dest::Ud(dest.clone()));
        self.post(r).map_err(|r| r.map(one))
    }

    /// A UD send of inline `data` to `dest`.
    ///
    /// # Errors
    /// As [`send_to`](Self::send_to) and [`send_inline`](Self::send_inline).
    pub fn send_inline_to(&mut self, data: &[u8], dest: &UdDest, o: Wr) -> Result<()> {
        self.post_inline(Op::Send, data, Some(Dest::Ud(dest.clone())), o)
    }

    /// A UD send gathering several buffers to `dest`.
    ///
    /// # Errors
    /// As [`send_to`](Self::send_to); the buffers come back.
    pub fn send_sgl_to(&mut self, bufs: Vec<Buf>, dest: &UdDest, o: Wr) -> Posted<Vec<Buf>> {
        self.post_sgl(Op::Send, bufs, Some(Dest::Ud(dest.clone())), o)
    }

    /// An RDMA write of `buf` to the peer's `remote` memory (with
    /// [`Wr::imm`] `RDMA_WRITE_WITH_IMM`).
    ///
    /// # Errors
    /// As [`send`](Self::send).
    #[inline]
    pub fn write(&mut self, buf: impl DeviceReadable, remote: RemoteMemory, o: Wr) -> Posted {
        self.post_buf(Op::Write(remote), buf.into(), o, false)
    }

    /// An RDMA write gathering several buffers.
    ///
    /// # Errors
    /// As [`send`](Self::send); the buffers come back.
    pub fn write_sgl(&mut self, bufs: Vec<Buf>, remote: RemoteMemory, o: Wr) -> Posted<Vec<Buf>> {
        self.post_sgl(Op::Write(remote), bufs, None, o)
    }

    /// An RDMA write of inline `data` (copied at post time).
    ///
    /// # Errors
    /// As [`send_inline`](Self::send_inline).
    pub fn write_inline(&mut self, data: &[u8], remote: RemoteMemory, o: Wr) -> Result<()> {
        self.post_inline(Op::Write(remote), data, None, o)
    }

    /// An RDMA read of the peer's `remote` memory into `buf`.
    ///
    /// # Errors
    /// As [`send`](Self::send); a buffer without `LOCAL_WRITE`
    /// ([`Error::MissingAccess`]).
    #[inline]
    pub fn read(&mut self, buf: impl DeviceWritable, remote: RemoteMemory, o: Wr) -> Posted {
        self.post_buf(Op::Read(remote), buf.into(), o, true)
    }

    /// An RDMA read scattering into several buffers (none frozen).
    ///
    /// # Errors
    /// As [`read`](Self::read); the buffers come back.
    pub fn read_sgl(&mut self, bufs: Vec<Buf>, remote: RemoteMemory, o: Wr) -> Posted<Vec<Buf>> {
        self.post_sgl(Op::Read(remote), bufs, None, o)
    }

    /// Atomic compare-and-swap on the 8 bytes at `remote.addr` (8-byte
    /// aligned); the original value lands in `result` (8 bytes, aligned).
    ///
    /// # Errors
    /// As [`read`](Self::read); [`Error::Misaligned`],
    /// [`Error::AtomicResultBuffer`], [`Error::OutOfBounds`].
    pub fn compare_and_swap(
        &mut self,
        result: impl DeviceWritable,
        remote: RemoteMemory,
        compare: u64,
        swap: u64,
        o: Wr,
    ) -> Posted {
        let op = Op::CompareSwap {
            remote,
            compare,
            swap,
        };
        let r = o.request(op, SgList::One(result.into()));
        self.post(r).map_err(|r| r.map(one))
    }

    /// Atomic fetch-and-add on the 8 bytes at `remote.addr`; the original
    /// value lands in `result`.
    ///
    /// # Errors
    /// As [`compare_and_swap`](Self::compare_and_swap).
    pub fn fetch_and_add(
        &mut self,
        result: impl DeviceWritable,
        remote: RemoteMemory,
        add: u64,
        o: Wr,
    ) -> Posted {
        let r = o.request(Op::FetchAdd { remote, add }, SgList::One(result.into()));
        self.post(r).map_err(|r| r.map(one))
    }

    /// Atomic write (`IBV_WR_ATOMIC_WRITE`): `value` lands in the 8 bytes at
    /// `remote.addr` (8-byte aligned) as one atomic unit, byte for byte.
    /// Only on a queue pair created with
    /// [`SendOpFlags::ATOMIC_WRITE`](crate::qp::SendOpFlags::ATOMIC_WRITE); the value is
    /// copied at post time.
    ///
    /// # Errors
    /// [`Error::SendOpFlagsRequired`], [`Error::Misaligned`], as
    /// [`send`](Self::send) otherwise.
    #[doc(alias = "ibv_wr_atomic_write")]
    pub fn atomic_write(&mut self, remote: RemoteMemory, value: [u8; 8], o: Wr) -> Result<()> {
        let r = o.request(Op::AtomicWrite { remote, value }, SgList::Empty);
        self.post(r).map_err(|r| r.error)
    }

    /// Flush (`ibv_wr_flush`): makes the peer's earlier writes to `remote`
    /// (or, with [`FlushLevel::Region`](crate::qp::FlushLevel::Region), to its
    /// whole memory region) globally visible or persistent. Only on a
    /// queue pair created with `SendOpFlags::FLUSH`.
    ///
    /// # Errors
    /// As [`atomic_write`](Self::atomic_write).
    #[doc(alias = "ibv_wr_flush")]
    pub fn flush(
        &mut self,
        remote: RemoteMemory,
        kind: crate::qp::queue_pair::FlushType,
        level: crate::qp::queue_pair::FlushLevel,
        o: Wr,
    ) -> Result<()> {
        let op = Op::Flush {
            remote,
            kind: kind.bits(),
            level: level as u8,
        };
        self.post(o.request(op, SgList::Empty)).map_err(|r| r.error)
    }

    /// Posts a chain of requests with one doorbell: the first `n` the
    /// device took leave `wrs` (their buffers are in their slots), the
    /// rest stay there with the error. On a queue pair created with
    /// [`SendOpFlags`](crate::qp::SendOpFlags) the chain goes in one `ibv_wr_start` …
    /// `ibv_wr_complete` region: all or nothing.
    ///
    /// # Errors
    /// Checked before anything is posted (DESIGN.md's request-option
    /// table): [`Error::OpNotAvailable`], [`Error::OptionNotAllowed`],
    /// [`Error::OptionRequired`], [`Error::InlineTooLarge`],
    /// [`Error::UnsignaledExclusive`], [`Error::UdMessageTooLong`],
    /// [`Error::SendOpFlagsRequired`], [`Error::TooManySges`],
    /// [`Error::ForeignProtectionDomain`], [`Error::FrozenBuffer`],
    /// [`Error::MissingAccess`], [`Error::OutOfRange`] (a buffer longer than
    /// an SGE describes), [`Error::Misaligned`], [`Error::AtomicResultBuffer`];
    /// then [`Error::QueueFull`] (or [`Error::QueueHeldAfterReset`] after a
    /// reset); the provider's refusal is [`Error::Verb`] naming
    /// `ibv_post_send` or `ibv_wr_complete`.
    pub fn post_chain(&mut self, wrs: &mut Vec<SendRequest<'_>>) -> Result<()> {
        let (posted, result) = self.post_requests(wrs);
        wrs.drain(..posted);
        result
    }

    /// Rings the doorbell for one C request the caller built (its
    /// `wr_id` a slot's, published): the provider's code.
    #[inline(always)]
    pub(crate) fn post_raw_one(&mut self, wr: &mut sys::ibv_send_wr) -> i32 {
        let mut bad = std::ptr::null_mut();
        // SAFETY: live QP (held); the caller's request, one (`next` NULL),
        // its SGEs in buffers that outlive its completion.
        unsafe { (self.post_fn)(self.qp_ptr, wr, &mut bad) }
    }

    /// Whether the slot `ahead` positions past the head is free (0: the
    /// next post has room).
    pub fn has_room(&mut self, ahead: u32) -> bool {
        ahead < self.ring().depth() && self.ring().reserve(ahead).is_some()
    }

    /// The ring (this handle has it).
    #[inline(always)]
    pub(crate) fn ring(&mut self) -> &mut Ring {
        // SAFETY: the handle has the ring (RingCell::take) until dropped.
        unsafe { self.ring.as_mut() }
    }

    /// One buffer: the common case inline, the rest through the general
    /// path.
    #[inline(always)]
    fn post_buf(&mut self, op: Op, buf: Buf, o: Wr, device_writes: bool) -> Posted {
        let region = buf.region();
        // The common case: every cell of DESIGN.md's option table allows a
        // send, write or read of one buffer of this PD on RC with a fence,
        // immediate data on a send or write, or no completion for a frozen
        // buffer the device only reads.
        let common = self.fast
            && o.bits & !(FENCE | HAS_IMM | UNSIGNALED) == 0
            && std::ptr::eq(Arc::as_ptr(&region.mr.pd.inner).cast(), self.pd)
            // 1 ..= u32::MAX bytes in one compare: an empty buffer goes
            // without an SGE, through the general path (see fill_sges).
            && region.len().wrapping_sub(1) < u32::MAX as usize
            && if device_writes {
                o.bits & (HAS_IMM | UNSIGNALED) == 0
                    && !matches!(buf, Buf::Frozen(_))
                    && region.mr.access.contains(crate::types::AccessFlags::LOCAL_WRITE)
            } else {
                o.bits & UNSIGNALED == 0 || matches!(buf, Buf::Frozen(_))
            };
        if !common {
            return self
                .post(o.request(op, SgList::One(buf)))
                .map_err(|r| r.map(one));
        }
        let Some(slot) = self.ring().reserve_head() else {
            return Err(self.no_room(buf));
        };
        let (opcode, remote) = match op {
            Op::Send if o.bits & HAS_IMM != 0 => (sys::IBV_WR_SEND_WITH_IMM, None),
            Op::Send => (sys::IBV_WR_SEND, None),
            Op::Write(m) if o.bits & HAS_IMM != 0 => (sys::IBV_WR_RDMA_WRITE_WITH_IMM, Some(m)),
            Op::Write(m) => (sys::IBV_WR_RDMA_WRITE, Some(m)),
            Op::Read(m) => (sys::IBV_WR_RDMA_READ, Some(m)),
            _ => unreachable!("post_buf takes sends, writes and reads"),
        };
        self.sge = region.sge_prechecked();
        self.wr.wr_id = slot.wr_id;
        self.wr.sg_list = &mut self.sge;
        self.wr.opcode = opcode;
        self.wr.send_flags = (o.bits & (FENCE | UNSIGNALED)) ^ UNSIGNALED;
        self.wr.__bindgen_anon_1.imm_data = o.data.to_be();
        if let Some(m) = remote {
            self.wr.wr.rdma = sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 {
                remote_addr: m.addr,
                rkey: m.rkey.0,
            };
        }
        let signaled = o.bits & UNSIGNALED == 0;
        let ring = self.ring();
        ring.fill(
            &slot,
            o.wr_id,
            Payload::bufs(SgList::One(buf), None),
            signaled,
        );
        ring.publish(&slot);
        let mut bad = std::ptr::null_mut();
        // SAFETY: live QP (held); `wr` is one request (`next` NULL, set
        // once) with every field its opcode reads; its SGE names a buffer
        // the slot now owns (its memory does not move).
        let rc = unsafe { (self.post_fn)(self.qp_ptr, &mut self.wr, &mut bad) };
        if rc != 0 {
            return Err(self.refused_one(slot, rc));
        }
        self.ring().advance_one();
        Ok(())
    }

    /// No room for one request: the buffer back with the reason.
    #[cold]
    #[inline(never)]
    fn no_room(&mut self, buf: Buf) -> Refused<Buf> {
        Refused {
            error: no_room(self.ring(), "send queue"),
            buf,
        }
    }

    /// The provider refused the request in `slot`: its buffer back.
    #[cold]
    #[inline(never)]
    fn refused_one(&mut self, slot: Reserved, rc: i32) -> Refused<Buf> {
        let payload = self.ring().unpublish(slot);
        Refused {
            error: crate::error::errno_error("ibv_post_send", rc),
            buf: one(payload.into_sg()),
        }
    }

    /// Several buffers, through the general path.
    fn post_sgl(&mut self, op: Op, bufs: Vec<Buf>, dest: Option<Dest>, o: Wr) -> Posted<Vec<Buf>> {
        let mut r = o.request(op, SgList::Many(bufs));
        r.ud = dest;
        self.post(r).map_err(|r| r.map(many))
    }

    /// Inline data, through the general path.
    fn post_inline(&mut self, op: Op, data: &[u8], dest: Option<Dest>, o: Wr) -> Result<()> {
        let mut r = o.request(op, SgList::Empty);
        r.inline = Some(data);
        r.ud = dest;
        self.post(r).map_err(|r| r.error)
    }

    /// Posts one request built as a value ([`SendRequest`]): checked as
    /// [`post_chain`](Self::post_chain) checks each, then posted alone.
    /// For a caller that holds requests as values (a runtime's table,
    /// a queue of requests); the typed methods ([`send`](Self::send),
    /// [`write`](Self::write), …) are cheaper when the operation is known
    /// where it is posted, and `post_chain` rings one doorbell for many.
    /// Unlike `post_chain` it takes no `Vec`, so it allocates nothing.
    ///
    /// # Errors
    /// As [`post_chain`](Self::post_chain); the request's buffers come back
    /// in the [`Refused`].
    ///
    /// # References
    /// `ibv_post_send(3)`
    #[doc(alias = "ibv_post_send")]
    pub fn post(&mut self, r: SendRequest<'_>) -> std::result::Result<(), Refused<SgList>> {
        let mut one = [r];
        match self.post_requests(&mut one) {
            (1, _) => Ok(()),
            (_, result) => {
                let [r] = one;
                Err(Refused {
                    error: result.err().unwrap_or(Error::Unsupported("refused")),
                    buf: r.into_buffers(),
                })
            }
        }
    }

    /// Posts `wrs` with one doorbell: how many the device took (from the
    /// front of `wrs`, their buffers now in their slots), and the error if
    /// not all.
    pub(crate) fn post_requests(&mut self, wrs: &mut [SendRequest<'_>]) -> (usize, Result<()>) {
        let n = wrs.len();
        if n == 0 {
            return (0, Ok(()));
        }
        let extended = self.qp.inner.qpx.is_some();
        for r in wrs.iter() {
            if let Err(e) = self.qp.check_send(r, extended) {
                return (0, Err(e));
            }
        }
        // The slots, in ring order from the head, all free.
        if u32::try_from(n).map_or(true, |n| n > self.ring().depth()) {
            let error = Error::QueueFull {
                queue: "send queue",
                depth: self.ring().depth(),
            };
            return (0, Err(error));
        }
        let bufs = self.scratch.bufs();
        let slots = &mut bufs.slots;
        slots.clear();
        // SAFETY: the handle has the ring.
        let ring = unsafe { self.ring.as_mut() };
        for k in 0..n as u32 {
            match ring.reserve(k) {
                Some(s) => slots.push(s),
                None => return (0, Err(no_room(ring, "send queue"))),
            }
        }
        let sig_all = self.qp.inner.sq_sig_all;
        for (r, s) in wrs.iter_mut().zip(slots.iter()) {
            let signaled = r.is_signaled() || sig_all;
            let payload = Payload::bufs(
                std::mem::take(&mut r.sg),
                r.ud.clone().and_then(Dest::into_ah),
            );
            ring.fill(s, r.wr_id, payload, signaled);
            if r.owner != 0 {
                ring.set_owner(s, r.owner);
            }
        }
        for s in slots.iter() {
            ring.publish(s);
        }
        let posted = if extended {
            match self
                .qp
                .post_send_ex(wrs, slots, &mut bufs.sges, bufs.max_sge)
            {
                Ok(()) => (n, Ok(())),
                Err(e) => (0, Err(e)),
            }
        } else {
            let wr_base = bufs.wrs.as_mut_ptr();
            let max_sge = bufs.max_sge;
            for (i, (r, s)) in wrs.iter().zip(slots.iter()).enumerate() {
                let sges = &mut bufs.sges[i * max_sge..(i + 1) * max_sge];
                // The buffers are in the slot now: the SGEs come from there.
                // SAFETY: filled above, published, and not claimable before
                // the doorbell (the device has not seen the `wr_id`).
                let sg = unsafe { s.sg() };
                let num_sge = match r.inline {
                    Some(data) => {
                        sges[0] = inline_sge(data);
                        usize::from(!data.is_empty())
                    }
                    None => fill_sges(sg, sges),
                };
                let next = if i + 1 < n {
                    // SAFETY: `i + 1 < n <= depth`, inside the scratch.
                    unsafe { wr_base.add(i + 1) }
                } else {
                    std::ptr::null_mut()
                };
                // SAFETY: inside the scratch (one request per entry).
                unsafe {
                    let wr = wr_base.add(i);
                    write_send_wr(wr, r, s.wr_id, sges.as_mut_ptr(), num_sge as i32);
                    std::ptr::addr_of_mut!((*wr).next).write(next);
                }
            }
            let mut bad: *mut sys::ibv_send_wr = std::ptr::null_mut();
            // SAFETY: live QP; the chain lives in the scratch, its SGEs point
            // into buffers the slots own or inline data the provider copies
            // during the call.
            let rc = unsafe { (self.post_fn)(self.qp_ptr, wr_base, &mut bad) };
            let posted = super::post::posted_count(rc, wr_base, bad, n);
            (posted, crate::error::ret_errno("ibv_post_send", rc))
        };
        // The refused ones: their buffers back into their requests.
        for (r, s) in wrs.iter_mut().zip(slots.drain(..)).skip(posted.0) {
            r.sg = ring.unpublish(s).into_sg();
        }
        ring.advance(posted.0 as u32);
        posted
    }
}

/// Why a ring had no room: entries held after a reset, or all taken.
#[cold]
pub(crate) fn no_room(ring: &Ring, queue: &'static str) -> Error {
    if ring.head_held() {
        Error::QueueHeldAfterReset {
            queue,
            held: ring.held(),
            depth: ring.depth(),
        }
    } else {
        Error::QueueFull {
            queue,
            depth: ring.depth(),
        }
    }
}

/// The one buffer of a request that had one.
fn one(sg: SgList) -> Buf {
    match sg {
        SgList::One(b) => b,
        SgList::Many(mut v) if v.len() == 1 => v.pop().expect("one"),
        _ => unreachable!("a one-buffer request"),
    }
}

/// The buffers of a scatter/gather request.
fn many(sg: SgList) -> Vec<Buf> {
    match sg {
        SgList::Many(v) => v,
        SgList::One(b) => vec![b],
        SgList::Empty => Vec::new(),
    }
}

impl<B> Refused<B> {
    /// The same refusal carrying `f(buf)`.
    pub(super) fn map<C>(self, f: impl FnOnce(B) -> C) -> Refused<C> {
        Refused {
            error: self.error,
            buf: f(self.buf),
        }
    }
}
