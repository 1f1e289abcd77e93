//! Posting work requests: the owned-buffer safe path and the raw path.

use std::sync::Arc;

use ibverbs_sys as sys;

use crate::buffer::{Buf, DeviceReadable, DeviceWritable, RemoteMemory};
use crate::error::{Error, Result};
use crate::memory_region::AccessFlags;
use crate::wq_table::{Payload, SgList};
use crate::{AddressHandle, QpNumber, QpType, QueuePair};

/// Scratch space for building a chain of C work requests (`W` is
/// `ibv_send_wr` or `ibv_recv_wr`) without allocating: one request and
/// `max_sge` SGEs per queue entry, allocated when the queue is created.
pub(crate) struct Scratch<W> {
    pub(super) wrs: Vec<W>,
    pub(super) sges: Vec<sys::ibv_sge>,
    pub(super) tags: Vec<u32>,
    pub(super) max_sge: usize,
}

// SAFETY: the raw pointers inside the C requests are rebuilt on every post
// and only used while the owning table's Mutex is held.
unsafe impl<W> Send for Scratch<W> {}

impl<W: Default + Clone> Scratch<W> {
    pub(crate) fn new(depth: u32, max_sge: u32) -> Scratch<W> {
        let (depth, max_sge) = (depth as usize, max_sge.max(1) as usize);
        Scratch {
            wrs: vec![W::default(); depth],
            sges: vec![sys::ibv_sge::default(); depth * max_sge],
            tags: vec![0; depth],
            max_sge,
        }
    }
}

/// Scratch space of a send queue.
pub(crate) type SendScratch = Scratch<sys::ibv_send_wr>;
/// Scratch space of a receive queue or SRQ.
pub(crate) type RecvScratch = Scratch<sys::ibv_recv_wr>;

#[derive(Debug, Clone, Copy)]
pub(super) enum Op {
    Send,
    Write(RemoteMemory),
    Read(RemoteMemory),
    CompareSwap {
        remote: RemoteMemory,
        compare: u64,
        swap: u64,
    },
    FetchAdd {
        remote: RemoteMemory,
        add: u64,
    },
    AtomicWrite {
        remote: RemoteMemory,
        value: [u8; 8],
    },
    #[cfg(ibverbs_flush)]
    Flush {
        remote: RemoteMemory,
        kind: u8,
        level: u8,
    },
}

impl Op {
    fn device_writes_local(&self) -> bool {
        matches!(
            self,
            Op::Read(_) | Op::CompareSwap { .. } | Op::FetchAdd { .. }
        )
    }
    pub(super) fn name(&self) -> &'static str {
        match self {
            Op::Send => "send",
            Op::Write(_) => "RDMA write",
            Op::Read(_) => "RDMA read",
            Op::CompareSwap { .. } => "atomic compare-and-swap",
            Op::FetchAdd { .. } => "atomic fetch-and-add",
            Op::AtomicWrite { .. } => "atomic write",
            #[cfg(ibverbs_flush)]
            Op::Flush { .. } => "flush",
        }
    }
}

/// Where a UD send goes.
#[derive(Debug, Clone)]
pub(super) struct UdDest {
    pub(super) ah: AddressHandle,
    pub(super) qpn: QpNumber,
    pub(super) qkey: u32,
}

/// A send-queue work request that owns its buffers.
///
/// Build it with one of the constructors, adjust with the setters, and post
/// it with [`QueuePair::post_send`]. The buffers come back in the
/// [`Completion`](crate::Completion). Requests are signaled by default.
///
/// # References
/// `ibv_post_send(3)`
#[derive(Debug)]
#[must_use = "a work request does nothing until posted"]
pub struct SendRequest<'a> {
    pub(super) wr_id: u64,
    pub(super) op: Op,
    pub(super) sg: SgList,
    pub(super) inline: Option<&'a [u8]>,
    pub(super) flags: u32,
    pub(super) imm: Option<u32>,
    pub(super) invalidate: Option<u32>,
    pub(super) ud: Option<UdDest>,
}

impl<'a> SendRequest<'a> {
    fn new(op: Op, sg: SgList) -> Self {
        SendRequest {
            wr_id: 0,
            op,
            sg,
            inline: None,
            flags: sys::ibv_send_flags::IBV_SEND_SIGNALED.0,
            imm: None,
            invalidate: None,
            ud: None,
        }
    }

    /// A send of `buf` (`IBV_WR_SEND`).
    pub fn send(buf: impl DeviceReadable) -> Self {
        Self::new(Op::Send, SgList::One(buf.into()))
    }

    /// A send gathering several buffers in order.
    pub fn send_sgl(bufs: Vec<Buf>) -> Self {
        Self::new(Op::Send, SgList::Many(bufs))
    }

    /// A send of `data` copied inline into the work request
    /// (`IBV_SEND_INLINE`): the bytes are copied before `post_send` returns,
    /// so `data` needs no registration and is free again right after.
    pub fn send_inline(data: &'a [u8]) -> Self {
        let mut r = Self::new(Op::Send, SgList::Empty);
        r.inline = Some(data);
        r
    }

    /// An RDMA write of `buf` to the peer's `remote` memory.
    pub fn write(buf: impl DeviceReadable, remote: RemoteMemory) -> Self {
        Self::new(Op::Write(remote), SgList::One(buf.into()))
    }

    /// An RDMA write gathering several buffers.
    pub fn write_sgl(bufs: Vec<Buf>, remote: RemoteMemory) -> Self {
        Self::new(Op::Write(remote), SgList::Many(bufs))
    }

    /// An RDMA write of inline `data` (copied at post time).
    pub fn write_inline(data: &'a [u8], remote: RemoteMemory) -> Self {
        let mut r = Self::new(Op::Write(remote), SgList::Empty);
        r.inline = Some(data);
        r
    }

    /// An RDMA read of the peer's `remote` memory into `buf`.
    pub fn read(buf: impl DeviceWritable, remote: RemoteMemory) -> Self {
        Self::new(Op::Read(remote), SgList::One(buf.into()))
    }

    /// Atomic compare-and-swap on the 8 bytes at `remote.addr` (8-byte
    /// aligned); the original value lands in `result` (8 bytes, aligned).
    pub fn compare_and_swap(
        result: impl DeviceWritable,
        remote: RemoteMemory,
        compare: u64,
        swap: u64,
    ) -> Self {
        Self::new(
            Op::CompareSwap {
                remote,
                compare,
                swap,
            },
            SgList::One(result.into()),
        )
    }

    /// Atomic fetch-and-add on the 8 bytes at `remote.addr`; the original
    /// value lands in `result`.
    pub fn fetch_and_add(result: impl DeviceWritable, remote: RemoteMemory, add: u64) -> Self {
        Self::new(Op::FetchAdd { remote, add }, SgList::One(result.into()))
    }

    /// Atomic write (`IBV_WR_ATOMIC_WRITE`): `value` lands in the 8 bytes
    /// at `remote.addr` (8-byte aligned) as one atomic unit, byte for byte
    /// (use `to_le_bytes`/`to_be_bytes` for the peer's byte order). Posted
    /// only with [`QueuePair::post_send_ex`] on a queue pair created with
    /// [`SendOps::ATOMIC_WRITE`](crate::SendOps::ATOMIC_WRITE); the value is
    /// copied at post time, so the request carries no buffer.
    #[doc(alias = "ibv_wr_atomic_write")]
    pub fn atomic_write(remote: RemoteMemory, value: [u8; 8]) -> Self {
        Self::new(Op::AtomicWrite { remote, value }, SgList::Empty)
    }

    /// Flush (`ibv_wr_flush`): makes the peer's earlier writes to `remote`
    /// (or, with [`FlushLevel::Region`](crate::FlushLevel::Region), to its
    /// whole memory region) globally visible or persistent. Posted with
    /// [`QueuePair::post_send_ex`] on a queue pair created with
    /// `SendOps::FLUSH`; the peer's region needs the matching
    /// `AccessFlags::FLUSH_*` right. Compiled in when the installed
    /// rdma-core is 45 or newer (`ibverbs_flush` cfg).
    #[cfg(ibverbs_flush)]
    #[doc(alias = "ibv_wr_flush")]
    pub fn flush(remote: RemoteMemory, kind: crate::FlushType, level: crate::FlushLevel) -> Self {
        Self::new(
            Op::Flush {
                remote,
                kind: kind.bits(),
                level: level as u8,
            },
            SgList::Empty,
        )
    }

    /// The id reported in the completion.
    pub fn wr_id(mut self, wr_id: u64) -> Self {
        self.wr_id = wr_id;
        self
    }

    /// Adds immediate data (send → `SEND_WITH_IMM`, RDMA write →
    /// `RDMA_WRITE_WITH_IMM`); given in host order.
    pub fn imm(mut self, imm: u32) -> Self {
        self.imm = Some(imm);
        self
    }

    /// Makes a send also invalidate the peer's memory window (or region)
    /// with remote key `rkey` (`IBV_WR_SEND_WITH_INV`): the receiver's
    /// completion reports it ([`WorkCompletion::invalidated_rkey`](crate::WorkCompletion::invalidated_rkey)).
    #[doc(alias = "IBV_WR_SEND_WITH_INV")]
    pub fn invalidate(mut self, rkey: crate::RemoteKey) -> Self {
        self.invalidate = Some(rkey.0);
        self
    }

    fn flag(mut self, flag: sys::ibv_send_flags, on: bool) -> Self {
        if on {
            self.flags |= flag.0;
        } else {
            self.flags &= !flag.0;
        }
        self
    }

    /// Whether a completion is generated (default true). Unsignaled
    /// requests may only carry inline data or
    /// [`FrozenBuffer`](crate::FrozenBuffer)s: their buffers are released
    /// when a later signaled request completes, not handed back.
    pub fn signaled(self, on: bool) -> Self {
        self.flag(sys::ibv_send_flags::IBV_SEND_SIGNALED, on)
    }

    /// Solicited event at the receiver.
    pub fn solicited(self, on: bool) -> Self {
        self.flag(sys::ibv_send_flags::IBV_SEND_SOLICITED, on)
    }

    /// Wait for earlier RDMA reads/atomics before starting (fence).
    pub fn fence(self, on: bool) -> Self {
        self.flag(sys::ibv_send_flags::IBV_SEND_FENCE, on)
    }

    /// Send the buffer's bytes inline (copied at post time).
    pub fn inline(self, on: bool) -> Self {
        self.flag(sys::ibv_send_flags::IBV_SEND_INLINE, on)
    }

    /// Destination of a UD send: address handle, remote QP and Q_Key.
    pub fn ud(mut self, ah: &AddressHandle, qpn: QpNumber, qkey: u32) -> Self {
        self.ud = Some(UdDest {
            ah: ah.clone(),
            qpn,
            qkey,
        });
        self
    }

    /// Takes the buffers back out of an unposted request.
    pub fn into_buffers(self) -> SgList {
        self.sg
    }

    pub(super) fn is_signaled(&self) -> bool {
        self.flags & sys::ibv_send_flags::IBV_SEND_SIGNALED.0 != 0
    }
}

/// A receive work request that owns its buffers.
///
/// # References
/// `ibv_post_recv(3)`
#[derive(Debug)]
#[must_use = "a work request does nothing until posted"]
pub struct RecvRequest {
    pub(super) wr_id: u64,
    pub(super) sg: SgList,
}

impl RecvRequest {
    pub(crate) fn sg(&self) -> &SgList {
        &self.sg
    }

    /// Receive into `buf`.
    pub fn new(buf: impl DeviceWritable) -> Self {
        RecvRequest {
            wr_id: 0,
            sg: SgList::One(buf.into()),
        }
    }
    /// Receive scattering over several buffers (none may be frozen).
    pub fn sgl(bufs: Vec<Buf>) -> Self {
        RecvRequest {
            wr_id: 0,
            sg: SgList::Many(bufs),
        }
    }
    /// The id reported in the completion.
    pub fn wr_id(mut self, wr_id: u64) -> Self {
        self.wr_id = wr_id;
        self
    }
    /// Takes the buffers back out of an unposted request.
    pub fn into_buffers(self) -> SgList {
        self.sg
    }
}

/// A request the device did not take, handed back with the reason.
#[derive(Debug, thiserror::Error)]
#[error("{error}")]
pub struct PostError<R> {
    /// Why.
    #[source]
    pub error: Error,
    /// The request, buffers included.
    pub request: R,
}

impl<R> From<PostError<R>> for Error {
    fn from(e: PostError<R>) -> Error {
        e.error
    }
}

pub(crate) fn check_bufs(
    sg: &SgList,
    pd: &crate::ProtectionDomain,
    device_writes: bool,
    max_sge: u32,
    what: &str,
) -> Result<()> {
    if sg.len() > max_sge as usize {
        return Err(Error::InvalidArgument(format!(
            "{what} has {} scatter/gather entries, the queue allows {max_sge}",
            sg.len()
        )));
    }
    for b in sg.iter() {
        let region = b.region();
        if !Arc::ptr_eq(&region.mr.pd.inner, &pd.inner) {
            return Err(Error::InvalidArgument(format!(
                "{what}: buffer registered in another protection domain"
            )));
        }
        if device_writes {
            if matches!(b, Buf::Frozen(_)) {
                return Err(Error::InvalidArgument(format!(
                    "{what}: the device would write a frozen (shared read-only) buffer"
                )));
            }
            if !region.mr.access.contains(AccessFlags::LOCAL_WRITE) {
                return Err(Error::InvalidArgument(format!(
                    "{what}: the device would write a buffer registered without LOCAL_WRITE"
                )));
            }
        }
        region.sge()?;
    }
    Ok(())
}

/// Writes the SGEs of a request `check_bufs` accepted (count and lengths).
/// How many requests of the `n`-long chain at `base` the provider took:
/// all on success, none without a `bad` pointer, else those before `bad`.
/// Address arithmetic only, so a provider's out-of-chain `bad` cannot make
/// it undefined: it counts as nothing posted or all of the chain.
pub(super) fn posted_count<T>(rc: i32, base: *const T, bad: *const T, n: usize) -> usize {
    if rc == 0 {
        return n;
    }
    (bad as usize)
        .checked_sub(base as usize)
        .map_or(0, |d| d / std::mem::size_of::<T>().max(1))
        .min(n)
}

pub(super) fn fill_sges(sg: &SgList, out: &mut [sys::ibv_sge]) -> usize {
    let mut n = 0;
    for (slot, b) in out.iter_mut().zip(sg.iter()) {
        *slot = b.region().sge_prechecked();
        n += 1;
    }
    n
}

impl QueuePair {
    /// Checks a request before posting; `extended` says whether it goes
    /// through the `ibv_wr_*` path (the only one for atomic write).
    pub(super) fn check_send(&self, r: &SendRequest<'_>, extended: bool) -> Result<()> {
        let caps = &self.inner.caps;
        let ty = self.inner.qp_type;
        let what = r.op.name();
        #[cfg(ibverbs_flush)]
        if let Op::Flush { .. } = &r.op {
            if !extended {
                return Err(Error::Unsupported(
                    "flush is posted with post_send_ex on a queue pair created with \
                     SendOps::FLUSH (ibv_wr_flush)"
                        .into(),
                ));
            }
            if ty != QpType::Rc {
                return Err(Error::InvalidArgument(format!(
                    "flush needs an RC queue pair, not {ty:?}"
                )));
            }
        }
        if let Op::AtomicWrite { remote, .. } = &r.op {
            if !extended {
                return Err(Error::Unsupported(
                    "atomic write is posted with post_send_ex on a queue pair created with \
                     SendOps::ATOMIC_WRITE (ibv_wr_atomic_write)"
                        .into(),
                ));
            }
            if ty != QpType::Rc {
                return Err(Error::InvalidArgument(format!(
                    "atomic write needs an RC queue pair, not {ty:?}"
                )));
            }
            if remote.addr % 8 != 0 || remote.len < 8 {
                return Err(Error::InvalidArgument(format!(
                    "atomic write target {:#x} (len {}) is not an 8-byte-aligned 8-byte word",
                    remote.addr, remote.len
                )));
            }
        }
        match (ty, &r.op) {
            (QpType::Ud, Op::Send) if r.ud.is_some() => {}
            (QpType::Ud, Op::Send) => {
                return Err(Error::InvalidArgument(
                    "a UD send needs a destination: SendRequest::ud(ah, qpn, qkey)".into(),
                ))
            }
            (QpType::Ud, _)
            | (QpType::Uc, Op::Read(_))
            | (QpType::Uc, Op::CompareSwap { .. })
            | (QpType::Uc, Op::FetchAdd { .. }) => {
                return Err(Error::InvalidArgument(format!(
                    "{what} is not available on a {ty:?} queue pair"
                )))
            }
            _ => {}
        }
        if r.invalidate.is_some() && (!matches!(r.op, Op::Send) || r.imm.is_some()) {
            return Err(Error::InvalidArgument(format!(
                "only a send without immediate data can invalidate a remote key, not {what}{}",
                if r.imm.is_some() {
                    " with immediate data"
                } else {
                    ""
                }
            )));
        }
        if r.invalidate.is_some() && ty == QpType::Ud {
            return Err(Error::InvalidArgument(
                "send with invalidate needs a connected queue pair, not UD".into(),
            ));
        }
        if r.imm.is_some() && !matches!(r.op, Op::Send | Op::Write(_)) {
            return Err(Error::InvalidArgument(format!(
                "immediate data is only for send and RDMA write, not {what}"
            )));
        }
        if let Some(ud) = &r.ud {
            if ty != QpType::Ud {
                return Err(Error::InvalidArgument(
                    "a UD destination on a connected queue pair".into(),
                ));
            }
            if !Arc::ptr_eq(&ud.ah.pd().inner, &self.inner.pd.inner) {
                return Err(Error::InvalidArgument(
                    "address handle from another protection domain".into(),
                ));
            }
            // A UD message is one packet: a longer one is silently dropped
            // with a successful completion (IBA C10-93.1.1; rxe does so).
            let len = r
                .inline
                .map_or_else(|| r.sg.total_len(), |d| d.len() as u64);
            let mtu = ud.ah.port_mtu();
            if mtu != 0 && len > u64::from(mtu) {
                return Err(Error::InvalidArgument(format!(
                    "a {len}-byte UD message exceeds the {mtu}-byte active MTU of port {}: \
                     the device would drop it without an error (IBA C10-93.1.1)",
                    ud.ah.address_vector().port()
                )));
            }
        }
        if let Some(data) = r.inline {
            if data.len() > caps.max_inline_data as usize {
                return Err(Error::InvalidArgument(format!(
                    "{} bytes of inline data, the queue pair allows {}",
                    data.len(),
                    caps.max_inline_data
                )));
            }
        } else if r.flags & sys::ibv_send_flags::IBV_SEND_INLINE.0 != 0 {
            let total = r.sg.total_len();
            if total > u64::from(caps.max_inline_data) {
                return Err(Error::InvalidArgument(format!(
                    "{total} bytes to send inline, the queue pair allows {}",
                    caps.max_inline_data
                )));
            }
        }
        if !r.is_signaled() && !self.inner.sq_sig_all && !r.sg.all_frozen() {
            return Err(Error::InvalidArgument(format!(
                "an unsignaled {what} must not carry exclusive buffers (they could not be \
                 handed back): use inline data or FrozenBuffer"
            )));
        }
        check_bufs(
            &r.sg,
            &self.inner.pd,
            r.op.device_writes_local(),
            caps.max_send_sge,
            what,
        )?;
        if let Op::CompareSwap { remote, .. } | Op::FetchAdd { remote, .. } = &r.op {
            let mut bufs = r.sg.iter();
            let ok = match (bufs.next(), bufs.next()) {
                (Some(b), None) => b.len() == 8 && b.region().addr() % 8 == 0,
                _ => false,
            };
            if !ok {
                return Err(Error::InvalidArgument(format!(
                    "{what} needs exactly one 8-byte, 8-byte-aligned result buffer"
                )));
            }
            if remote.addr % 8 != 0 || remote.len < 8 {
                return Err(Error::InvalidArgument(format!(
                    "{what} target {:#x} (len {}) is not an 8-byte-aligned 8-byte word",
                    remote.addr, remote.len
                )));
            }
        }
        Ok(())
    }

    /// Posts one send-queue work request. Its buffers stay owned by the
    /// queue pair until the completion is polled.
    ///
    /// # Errors
    /// The request is handed back in a [`PostError`] with
    /// [`Error::InvalidArgument`] (checked before posting: QP type, SGE
    /// count, inline size, atomic alignment, PD, unsignaled exclusive
    /// buffers, a UD message longer than the port's active MTU),
    /// [`Error::QueueFull`], or [`Error::Verb`] naming `ibv_post_send`
    /// (`EINVAL` for a queue pair in RESET, INIT or RTR, refused before
    /// reaching the provider).
    ///
    /// # References
    /// `ibv_post_send(3)`
    ///
    /// # Example
    /// ```no_run
    /// # fn demo(qp: &ibverbs::QueuePair, buf: ibverbs::LocalBuffer) -> ibverbs::Result<()> {
    /// qp.post_send(ibverbs::SendRequest::send(buf).wr_id(1))?;
    /// # Ok(()) }
    /// ```
    #[doc(alias = "ibv_post_send")]
    // The refused request comes back by value: boxing it would allocate.
    #[allow(clippy::result_large_err)]
    pub fn post_send<'a>(&self, wr: SendRequest<'a>) -> Result<(), PostError<SendRequest<'a>>> {
        let mut one = [wr];
        match self.post_send_slice(&mut one).1 {
            Ok(()) => Ok(()),
            Err(error) => {
                let [request] = one;
                Err(PostError { error, request })
            }
        }
    }

    /// Posts a chain of requests with one doorbell. Posted requests are
    /// drained from `wrs` (its capacity is kept for reuse); on error the
    /// requests that were not posted stay in `wrs`, buffers included.
    ///
    /// # Errors
    /// As [`QueuePair::post_send`]; validation errors post nothing.
    #[doc(alias = "ibv_post_send")]
    pub fn post_send_list(&self, wrs: &mut Vec<SendRequest<'_>>) -> Result<()> {
        let (posted, result) = self.post_send_slice(wrs);
        wrs.drain(..posted);
        result
    }

    /// Returns how many requests the device took, and the error if not all.
    fn post_send_slice(&self, wrs: &mut [SendRequest<'_>]) -> (usize, Result<()>) {
        if wrs.is_empty() {
            return (0, Ok(()));
        }
        for r in wrs.iter() {
            if let Err(e) = self.check_send(r, false) {
                return (0, Err(e));
            }
        }
        let table = &self.inner.send;
        let mut st = table.lock();
        // Refused here, not by the provider: rxe (and others) write the
        // request into the send queue before finding the QP not ready, then
        // execute it once the QP reaches RTS, long after its buffers were
        // handed back with this error.
        if let Err(e) = self.check_sendable("ibv_post_send") {
            return (0, Err(e));
        }
        if let Err(e) = table.check_room(&st, wrs.len()) {
            return (0, Err(e));
        }
        let n = wrs.len();
        // Reserve slots (payloads are moved in only once the device took them).
        for (i, r) in wrs.iter().enumerate() {
            let tag = st.reserve(table, r.wr_id, Payload::default());
            st.scratch.tags[i] = tag;
        }
        let max_sge = st.scratch.max_sge;
        let scratch = &mut st.scratch;
        let wr_base = scratch.wrs.as_mut_ptr();
        for (i, r) in wrs.iter().enumerate() {
            let sges = &mut scratch.sges[i * max_sge..(i + 1) * max_sge];
            let num_sge = if let Some(data) = r.inline {
                sges[0] = sys::ibv_sge {
                    addr: data.as_ptr() as u64,
                    length: data.len() as u32,
                    lkey: 0,
                };
                usize::from(!data.is_empty())
            } else {
                fill_sges(&r.sg, sges)
            };
            let mut flags = r.flags;
            if r.inline.is_some() {
                flags |= sys::ibv_send_flags::IBV_SEND_INLINE.0;
            }
            let mut wr = sys::ibv_send_wr {
                wr_id: table.encode(scratch.tags[i]),
                next: if i + 1 < n {
                    // SAFETY: `i + 1 < n <= wrs.len()` (depth checked by check_room).
                    unsafe { wr_base.add(i + 1) }
                } else {
                    std::ptr::null_mut()
                },
                sg_list: sges.as_mut_ptr(),
                num_sge: num_sge as i32,
                send_flags: flags,
                ..Default::default()
            };
            if let Some(rkey) = r.invalidate {
                wr.__bindgen_anon_1.invalidate_rkey = rkey;
            } else {
                wr.__bindgen_anon_1.imm_data = r.imm.map(u32::to_be).unwrap_or(0);
            }
            wr.opcode = match (&r.op, r.imm.is_some()) {
                (Op::Send, false) if r.invalidate.is_some() => sys::IBV_WR_SEND_WITH_INV,
                (Op::Send, false) => sys::IBV_WR_SEND,
                (Op::Send, true) => sys::IBV_WR_SEND_WITH_IMM,
                (Op::Write(_), false) => sys::IBV_WR_RDMA_WRITE,
                (Op::Write(_), true) => sys::IBV_WR_RDMA_WRITE_WITH_IMM,
                (Op::Read(_), _) => sys::IBV_WR_RDMA_READ,
                (Op::CompareSwap { .. }, _) => sys::IBV_WR_ATOMIC_CMP_AND_SWP,
                (Op::FetchAdd { .. }, _) => sys::IBV_WR_ATOMIC_FETCH_AND_ADD,
                // Refused by check_send(.., false): the value has no field
                // in `ibv_send_wr`.
                (Op::AtomicWrite { .. }, _) => sys::IBV_WR_ATOMIC_WRITE,
                #[cfg(ibverbs_flush)]
                (Op::Flush { .. }, _) => sys::IBV_WR_FLUSH,
            };
            match r.op {
                Op::Send | Op::AtomicWrite { .. } => {}
                #[cfg(ibverbs_flush)]
                Op::Flush { .. } => {}
                Op::Write(m) | Op::Read(m) => {
                    wr.wr.rdma = sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 {
                        remote_addr: m.addr,
                        rkey: m.rkey.0,
                    };
                }
                Op::CompareSwap {
                    remote,
                    compare,
                    swap,
                } => {
                    wr.wr.atomic = sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_2 {
                        remote_addr: remote.addr,
                        compare_add: compare,
                        swap,
                        rkey: remote.rkey.0,
                    };
                }
                Op::FetchAdd { remote, add } => {
                    wr.wr.atomic = sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_2 {
                        remote_addr: remote.addr,
                        compare_add: add,
                        swap: 0,
                        rkey: remote.rkey.0,
                    };
                }
            }
            if let Some(ud) = &r.ud {
                wr.wr.ud = sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_3 {
                    ah: ud.ah.as_ptr(),
                    remote_qpn: ud.qpn.0,
                    remote_qkey: ud.qkey,
                };
            }
            scratch.wrs[i] = wr;
        }
        let mut bad: *mut sys::ibv_send_wr = std::ptr::null_mut();
        // SAFETY: live QP; the chain lives in `scratch` (locked), its SGEs
        // point into buffers owned by `wrs` (moved into the slots below
        // before the lock is released, so no completion can be retired
        // first) or into inline data the provider copies during the call.
        let rc = unsafe { sys::ibv_post_send(self.as_ptr(), wr_base, &mut bad) };
        let posted = posted_count(rc, wr_base, bad, n);
        for (i, r) in wrs.iter_mut().enumerate().take(posted) {
            let tag = st.scratch.tags[i];
            let payload = Payload {
                sg: std::mem::take(&mut r.sg),
                ah: r.ud.as_ref().map(|u| u.ah.clone()),
                keep: None,
            };
            st.store(table, tag, payload);
        }
        for i in (posted..n).rev() {
            let tag = st.scratch.tags[i];
            st.unreserve(table, tag);
        }
        (posted, crate::error::ret_errno("ibv_post_send", rc))
    }
}

#[cfg(test)]
mod tests {
    use super::posted_count;

    #[test]
    fn posted_count_from_bad_pointer() {
        let chain = [0u64; 4];
        let base = chain.as_ptr();
        assert_eq!(posted_count(0, base, std::ptr::null(), 4), 4);
        assert_eq!(posted_count(22, base, std::ptr::null(), 4), 0);
        assert_eq!(posted_count(22, base, base, 4), 0);
        assert_eq!(posted_count(12, base, base.wrapping_add(2), 4), 2);
        // A pointer outside the chain never counts more than the chain.
        assert_eq!(posted_count(12, base, base.wrapping_add(9), 4), 4);
        assert_eq!(posted_count(12, base, base.wrapping_sub(1), 4), 0);
    }
}
