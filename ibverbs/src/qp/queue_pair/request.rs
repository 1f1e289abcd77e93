//! Work requests that own their buffers, for chains
//! ([`SendQueue::post_chain`](crate::SendQueue::post_chain),
//! [`RecvQueue::post_chain`](crate::RecvQueue::post_chain)) and prepared
//! requests; single requests go through the handles' typed methods.

use rdma_verbs_sys as sys;

use crate::address_handle::AddressHandle;
use crate::inflight::owner::Owner;
use crate::memory::buffer::{Buf, DeviceReadable, DeviceWritable, RemoteMemory, SgList};
use crate::types::QpNumber;
use crate::types::SendOp;

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
    Flush {
        remote: RemoteMemory,
        kind: u8,
        level: u8,
    },
}

impl Op {
    /// The public name of the operation.
    pub(crate) fn kind(&self) -> SendOp {
        match self {
            Op::Send => SendOp::Send,
            Op::Write(_) => SendOp::RdmaWrite,
            Op::Read(_) => SendOp::RdmaRead,
            Op::CompareSwap { .. } => SendOp::CompareAndSwap,
            Op::FetchAdd { .. } => SendOp::FetchAndAdd,
            Op::AtomicWrite { .. } => SendOp::AtomicWrite,
            Op::Flush { .. } => SendOp::Flush,
        }
    }

    pub(super) fn device_writes_local(&self) -> bool {
        matches!(
            self,
            Op::Read(_) | Op::CompareSwap { .. } | Op::FetchAdd { .. }
        )
    }
    pub(super) fn name(&self) -> &'static str {
        self.kind().as_str()
    }
}

/// Where a request goes beyond its queue pair's connection: a UD
/// destination, or the SRQ an XRC send names. One field for both, so that
/// the data path's "no destination" test stays one compare.
#[derive(Debug, Clone)]
pub(super) enum Dest {
    /// A UD destination.
    Ud(UdDest),
    /// The remote XRC SRQ number (`remote_srqn`).
    Xrc(u32),
}

impl Dest {
    /// The address handle the request's slot keeps alive, if any.
    #[inline]
    pub(super) fn into_ah(self) -> Option<AddressHandle> {
        match self {
            Dest::Ud(u) => Some(u.ah),
            Dest::Xrc(_) => None,
        }
    }
}

/// Where a UD send goes: an address handle, the remote queue pair's
/// number and its Q_Key.
#[derive(Debug, Clone)]
pub struct UdDest {
    pub(super) ah: AddressHandle,
    pub(super) qpn: QpNumber,
    pub(super) qkey: u32,
}

impl UdDest {
    /// A destination (the handle is cloned: an `Arc`).
    pub fn new(ah: &AddressHandle, qpn: QpNumber, qkey: u32) -> UdDest {
        UdDest {
            ah: ah.clone(),
            qpn,
            qkey,
        }
    }
}

/// A send-queue work request that owns its buffers: an element of a chain
/// ([`SendQueue::post_chain`](crate::SendQueue::post_chain)) or a prepared
/// request ([`SendQueue::prepare`](crate::SendQueue::prepare)). A single
/// request goes through the handle's typed methods instead
/// ([`SendQueue::write`](crate::SendQueue::write), …), which build none.
///
/// Build it with one of the constructors and adjust it with the setters.
/// The buffers come back in the completion. Requests are signaled by
/// default.
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
    /// The destination: a UD address, or an XRC SRQ number.
    pub(super) ud: Option<Dest>,
    /// Its owner's tag ([`Owner`]), 0 for none.
    pub(crate) owner: u8,
}

impl<'a> SendRequest<'a> {
    #[inline]
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
            owner: 0,
        }
    }

    /// A request of `op` over `sg` (the typed methods' general path).
    #[inline]
    pub(super) fn of(op: Op, sg: SgList) -> Self {
        Self::new(op, sg)
    }

    /// A send of `buf` (`IBV_WR_SEND`).
    #[inline]
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
    #[inline]
    pub fn send_inline(data: &'a [u8]) -> Self {
        let mut r = Self::new(Op::Send, SgList::Empty);
        r.inline = Some(data);
        r
    }

    /// An RDMA write of `buf` to the peer's `remote` memory.
    #[inline]
    pub fn write(buf: impl DeviceReadable, remote: RemoteMemory) -> Self {
        Self::new(Op::Write(remote), SgList::One(buf.into()))
    }

    /// An RDMA write gathering several buffers.
    pub fn write_sgl(bufs: Vec<Buf>, remote: RemoteMemory) -> Self {
        Self::new(Op::Write(remote), SgList::Many(bufs))
    }

    /// An RDMA write of inline `data` (copied at post time).
    #[inline]
    pub fn write_inline(data: &'a [u8], remote: RemoteMemory) -> Self {
        let mut r = Self::new(Op::Write(remote), SgList::Empty);
        r.inline = Some(data);
        r
    }

    /// An RDMA read of the peer's `remote` memory into `buf`.
    #[inline]
    pub fn read(buf: impl DeviceWritable, remote: RemoteMemory) -> Self {
        Self::new(Op::Read(remote), SgList::One(buf.into()))
    }

    /// Atomic compare-and-swap on the 8 bytes at `remote.addr` (8-byte
    /// aligned); the original value lands in `result` (8 bytes, aligned).
    #[inline]
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
    #[inline]
    pub fn fetch_and_add(result: impl DeviceWritable, remote: RemoteMemory, add: u64) -> Self {
        Self::new(Op::FetchAdd { remote, add }, SgList::One(result.into()))
    }

    /// Atomic write (`IBV_WR_ATOMIC_WRITE`): `value` lands in the 8 bytes
    /// at `remote.addr` (8-byte aligned) as one atomic unit, byte for byte
    /// (use `to_le_bytes`/`to_be_bytes` for the peer's byte order). Posted
    /// only to a queue pair created with
    /// [`SendOpFlags::ATOMIC_WRITE`](crate::qp::SendOpFlags::ATOMIC_WRITE); the value is
    /// copied at post time, so the request carries no buffer.
    #[doc(alias = "ibv_wr_atomic_write")]
    pub fn atomic_write(remote: RemoteMemory, value: [u8; 8]) -> Self {
        Self::new(Op::AtomicWrite { remote, value }, SgList::Empty)
    }

    /// Flush (`ibv_wr_flush`): makes the peer's earlier writes to `remote`
    /// (or, with [`FlushLevel::Region`](crate::qp::FlushLevel::Region), to its
    /// whole memory region) globally visible or persistent. Posted to
    /// a queue pair created with
    /// `SendOpFlags::FLUSH`; the peer's region needs the matching
    /// `AccessFlags::FLUSH_*` right. Both need rdma-core 45 or newer at run
    /// time (an older library refuses the queue pair and the registration
    /// with [`Error::LibraryTooOld`](crate::Error::LibraryTooOld)).
    #[doc(alias = "ibv_wr_flush")]
    pub fn flush(
        remote: RemoteMemory,
        kind: crate::qp::queue_pair::FlushType,
        level: crate::qp::queue_pair::FlushLevel,
    ) -> Self {
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
    #[inline]
    pub fn wr_id(mut self, wr_id: u64) -> Self {
        self.wr_id = wr_id;
        self
    }

    /// Marks the request as `owner`'s: its completion then says so
    /// ([`Completion::is_owned_by`](crate::Completion::is_owned_by)). A
    /// refused request comes back unmarked.
    #[inline]
    pub fn owner(mut self, owner: Owner) -> Self {
        self.owner = owner.tag();
        self
    }

    /// Adds immediate data (send → `SEND_WITH_IMM`, RDMA write →
    /// `RDMA_WRITE_WITH_IMM`); given in host order.
    #[inline]
    pub fn imm(mut self, imm: u32) -> Self {
        self.imm = Some(imm);
        self
    }

    /// Makes a send also invalidate the peer's memory window (or region)
    /// with remote key `rkey` (`IBV_WR_SEND_WITH_INV`): the receiver's
    /// completion reports it ([`WorkCompletion::invalidated_rkey`](crate::cq::WorkCompletion::invalidated_rkey)).
    #[doc(alias = "IBV_WR_SEND_WITH_INV")]
    #[inline]
    pub fn invalidate(mut self, rkey: crate::memory::buffer::RemoteKey) -> Self {
        self.invalidate = Some(rkey.0);
        self
    }

    #[inline]
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
    /// [`FrozenBuffer`](crate::memory::FrozenBuffer)s: their buffers are released
    /// when a later signaled request completes, not handed back.
    #[inline]
    pub fn signaled(self, on: bool) -> Self {
        self.flag(sys::ibv_send_flags::IBV_SEND_SIGNALED, on)
    }

    /// Solicited event at the receiver.
    #[inline]
    pub fn solicited(self, on: bool) -> Self {
        self.flag(sys::ibv_send_flags::IBV_SEND_SOLICITED, on)
    }

    /// Wait for earlier RDMA reads/atomics before starting (fence).
    #[inline]
    pub fn fence(self, on: bool) -> Self {
        self.flag(sys::ibv_send_flags::IBV_SEND_FENCE, on)
    }

    /// Send the buffer's bytes inline (copied at post time).
    #[inline]
    pub fn inline(self, on: bool) -> Self {
        self.flag(sys::ibv_send_flags::IBV_SEND_INLINE, on)
    }

    /// Destination of a UD send: address handle, remote QP and Q_Key.
    pub fn ud(mut self, ah: &AddressHandle, qpn: QpNumber, qkey: u32) -> Self {
        self.ud = Some(Dest::Ud(UdDest {
            ah: ah.clone(),
            qpn,
            qkey,
        }));
        self
    }

    /// The XRC SRQ that takes the message at the receiving end, by its
    /// number ([`SharedReceiveQueue::xrc_srq_num`](crate::qp::SharedReceiveQueue::xrc_srq_num)
    /// there): required on an XRC send queue pair
    /// ([`QpType::XrcSend`](crate::QpType::XrcSend)), refused on any other
    /// (`remote_srqn`, `ibv_wr_set_xrc_srqn` on the extended path).
    ///
    /// # References
    /// `ibv_post_send(3)`, `ibv_wr_post(3)`
    #[doc(alias = "remote_srqn")]
    #[doc(alias = "ibv_wr_set_xrc_srqn")]
    pub fn xrc_srqn(mut self, srq_num: u32) -> Self {
        self.ud = Some(Dest::Xrc(srq_num));
        self
    }

    /// Takes the buffers back out of an unposted request.
    #[inline]
    pub fn into_buffers(self) -> SgList {
        self.sg
    }

    /// Whether the request may be posted unsignaled: every buffer frozen
    /// (or none: inline data) and nothing the device writes (DESIGN.md's
    /// request-option table). Posting the others unsignaled is refused
    /// ([`Error::UnsignaledExclusive`](crate::Error::UnsignaledExclusive)).
    #[inline]
    pub fn may_be_unsignaled(&self) -> bool {
        !self.op.device_writes_local() && self.sg.all_frozen()
    }

    #[inline]
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
    /// Its owner's tag ([`Owner`]), 0 for none.
    pub(crate) owner: u8,
}

impl RecvRequest {
    /// Receive into a buffer already converted (the handle's general path).
    #[inline]
    pub(super) fn new_buf(buf: Buf) -> Self {
        RecvRequest {
            wr_id: 0,
            sg: SgList::One(buf),
            owner: 0,
        }
    }

    /// Receive into `buf`.
    #[inline]
    pub fn new(buf: impl DeviceWritable) -> Self {
        RecvRequest {
            wr_id: 0,
            sg: SgList::One(buf.into()),
            owner: 0,
        }
    }
    /// A receive without a buffer (`num_sge` 0): what an RDMA write with
    /// immediate data consumes at the target (its bytes land in the
    /// memory the write names, the immediate in the completion), or a
    /// zero-length send. A message with a payload finds no room in it:
    /// the receive and the send complete with errors (rxe reports
    /// [`LocQpOpErr`](crate::WcStatus::LocQpOpErr) at the receiver,
    /// [`RemOpErr`](crate::WcStatus::RemOpErr) at the sender) and both
    /// queue pairs move to ERR.
    #[inline]
    pub fn empty() -> Self {
        RecvRequest {
            wr_id: 0,
            sg: SgList::Empty,
            owner: 0,
        }
    }
    /// Receive scattering over several buffers (none may be frozen).
    pub fn sgl(bufs: Vec<Buf>) -> Self {
        RecvRequest {
            wr_id: 0,
            sg: SgList::Many(bufs),
            owner: 0,
        }
    }
    /// The id reported in the completion.
    #[inline]
    pub fn wr_id(mut self, wr_id: u64) -> Self {
        self.wr_id = wr_id;
        self
    }

    /// Marks the request as `owner`'s: its completion then says so
    /// ([`Completion::is_owned_by`](crate::Completion::is_owned_by)). A
    /// refused request comes back unmarked.
    #[inline]
    pub fn owner(mut self, owner: Owner) -> Self {
        self.owner = owner.tag();
        self
    }
    /// Takes the buffers back out of an unposted request.
    #[inline]
    pub fn into_buffers(self) -> SgList {
        self.sg
    }
}
