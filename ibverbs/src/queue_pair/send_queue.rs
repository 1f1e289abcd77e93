//! The send queue's exclusive posting handle (DESIGN.md, "Posting").

use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use ibverbs_sys as sys;

use crate::buffer::{Buf, DeviceReadable, DeviceWritable, RemoteMemory};
use crate::error::{Error, Result};
use crate::inflight::{Payload, Ring};
use crate::wq_table::SgList;
use crate::{QpType, QueuePair};

use super::PostSendFn;

/// A work queue's ring and the flag that makes its posting handle
/// exclusive: whoever swaps `taken` to true (a handle, or a teardown
/// moving the queue pair to RESET) is the ring's only user until it
/// stores false.
pub(crate) struct RingCell {
    ring: std::cell::UnsafeCell<Ring>,
    taken: AtomicBool,
}

// SAFETY: the ring is reached only by whoever holds `taken`.
unsafe impl Sync for RingCell {}
// SAFETY: as above.
unsafe impl Send for RingCell {}

impl RingCell {
    pub(crate) fn new(ring: Ring) -> RingCell {
        RingCell {
            ring: std::cell::UnsafeCell::new(ring),
            taken: AtomicBool::new(false),
        }
    }

    /// The ring, exclusively, until [`give_back`](Self::give_back).
    pub(crate) fn take(&self) -> Option<NonNull<Ring>> {
        self.taken
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .ok()?;
        NonNull::new(self.ring.get())
    }

    /// Ends a [`take`](Self::take).
    pub(crate) fn give_back(&self) {
        self.taken.store(false, Ordering::Release);
    }

    /// The ring of a queue nothing else can reach any more (its queue
    /// pair is being destroyed: no handle, which holds the queue pair).
    pub(crate) fn get_mut(&mut self) -> &mut Ring {
        self.ring.get_mut()
    }
}

/// The options of one request: the `wr_id` its completion reports and
/// the flags and immediate data it carries.
///
/// ```
/// # use ibverbs::Wr;
/// let o = Wr::id(7).imm(0x1234).fence();
/// # let _ = o;
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[must_use]
pub struct Wr {
    pub(super) wr_id: u64,
    pub(super) imm: u32,
    /// `IBV_SEND_*` flags, with bit 31 for "immediate data" (no verb flag
    /// uses it) and `IBV_SEND_SIGNALED` *clear* for a signaled request, so
    /// that `Wr::default()` is the common case.
    pub(super) bits: u32,
}

const HAS_IMM: u32 = 1 << 31;
const UNSIGNALED: u32 = sys::ibv_send_flags::IBV_SEND_SIGNALED.0;

impl Wr {
    /// A signaled request whose completion reports `wr_id`.
    #[inline(always)]
    pub const fn id(wr_id: u64) -> Wr {
        Wr {
            wr_id,
            imm: 0,
            bits: 0,
        }
    }
    /// With immediate data (send → `SEND_WITH_IMM`, RDMA write →
    /// `RDMA_WRITE_WITH_IMM`), in host order.
    #[inline(always)]
    pub const fn imm(mut self, imm: u32) -> Wr {
        self.imm = imm;
        self.bits |= HAS_IMM;
        self
    }
    /// No completion (`IBV_SEND_SIGNALED` clear): only for requests whose
    /// buffers the device only reads and nobody owns exclusively (inline
    /// data, frozen buffers); a later completion releases them.
    #[inline(always)]
    pub const fn unsignaled(mut self) -> Wr {
        self.bits |= UNSIGNALED;
        self
    }
    /// `IBV_SEND_FENCE`.
    #[inline(always)]
    pub const fn fence(mut self) -> Wr {
        self.bits |= sys::ibv_send_flags::IBV_SEND_FENCE.0;
        self
    }
    /// `IBV_SEND_SOLICITED`.
    #[inline(always)]
    pub const fn solicited(mut self) -> Wr {
        self.bits |= sys::ibv_send_flags::IBV_SEND_SOLICITED.0;
        self
    }
    /// `IBV_SEND_INLINE`: the buffer's bytes are copied into the request.
    #[inline(always)]
    pub const fn inline(mut self) -> Wr {
        self.bits |= sys::ibv_send_flags::IBV_SEND_INLINE.0;
        self
    }
    /// The verb's `send_flags`.
    #[inline(always)]
    fn send_flags(self) -> u32 {
        (self.bits & !HAS_IMM) ^ UNSIGNALED
    }
}

/// A request the queue did not take, with its buffer.
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

/// The exclusive posting handle of a queue pair's send queue
/// ([`QueuePair::send_queue`]): posts take `&mut self` and no lock. One
/// exists at a time; moves to RESET, INIT or RTR are refused while it
/// lives. Share it across threads in a `Mutex`.
pub struct SendQueue {
    ring: NonNull<Ring>,
    post_fn: PostSendFn,
    qp_ptr: *mut sys::ibv_qp,
    /// The queue pair's protection domain, compared with each buffer's.
    pd: *const (),
    /// RC with an SGE: what the common case of the checks needs.
    rc_with_sge: bool,
    /// The C request, its unchanging fields written once.
    wr: sys::ibv_send_wr,
    sge: sys::ibv_sge,
    qp: QueuePair,
}

// SAFETY: the handle is the ring's only user (see RingCell) and the QP's
// verbs are thread-safe; it is not Sync (posting needs `&mut`).
unsafe impl Send for SendQueue {}

impl Drop for SendQueue {
    fn drop(&mut self) {
        self.qp.inner.send_ring.give_back();
    }
}

impl QueuePair {
    /// The send queue's posting handle.
    ///
    /// # Errors
    /// [`Error::QueueTaken`] while another handle (or a move to RESET)
    /// has it.
    pub fn send_queue(&self) -> Result<SendQueue> {
        let ring = self.inner.send_ring.take().ok_or(Error::QueueTaken {
            queue: "send queue",
        })?;
        let wr = sys::ibv_send_wr {
            num_sge: 1,
            ..Default::default()
        };
        Ok(SendQueue {
            ring,
            post_fn: self.inner.post_send_fn,
            qp_ptr: self.as_ptr(),
            pd: Arc::as_ptr(&self.inner.pd.inner).cast(),
            rc_with_sge: self.inner.qp_type == QpType::Rc && self.inner.caps.max_send_sge >= 1,
            wr,
            sge: sys::ibv_sge::default(),
            qp: self.clone(),
        })
    }
}

impl SendQueue {
    /// The queue pair.
    pub fn qp(&self) -> &QueuePair {
        &self.qp
    }

    /// An RDMA write of `buf` to the peer's `remote` memory.
    #[inline]
    pub fn write(
        &mut self,
        buf: impl DeviceReadable,
        remote: RemoteMemory,
        o: Wr,
    ) -> std::result::Result<(), Refused<Buf>> {
        let opcode = if o.bits & HAS_IMM != 0 {
            sys::IBV_WR_RDMA_WRITE_WITH_IMM
        } else {
            sys::IBV_WR_RDMA_WRITE
        };
        self.post_one(buf.into(), opcode, Some(remote), o, false)
    }

    /// A send of `buf`.
    #[inline]
    pub fn send(
        &mut self,
        buf: impl DeviceReadable,
        o: Wr,
    ) -> std::result::Result<(), Refused<Buf>> {
        let opcode = if o.bits & HAS_IMM != 0 {
            sys::IBV_WR_SEND_WITH_IMM
        } else {
            sys::IBV_WR_SEND
        };
        self.post_one(buf.into(), opcode, None, o, false)
    }

    /// An RDMA read of the peer's `remote` memory into `buf`.
    #[inline]
    pub fn read(
        &mut self,
        buf: impl DeviceWritable,
        remote: RemoteMemory,
        o: Wr,
    ) -> std::result::Result<(), Refused<Buf>> {
        self.post_one(buf.into(), sys::IBV_WR_RDMA_READ, Some(remote), o, true)
    }

    /// One request of one buffer.
    #[inline(always)]
    fn post_one(
        &mut self,
        buf: Buf,
        opcode: u32,
        remote: Option<RemoteMemory>,
        o: Wr,
        device_writes: bool,
    ) -> std::result::Result<(), Refused<Buf>> {
        let region = buf.region();
        // The common case's checks (DESIGN.md's option table allows a
        // signaled send, write or read on RC with any of these).
        let fast = self.rc_with_sge
            && o.bits & !sys::ibv_send_flags::IBV_SEND_FENCE.0 == 0
            && std::ptr::eq(Arc::as_ptr(&region.mr.pd.inner).cast(), self.pd)
            && region.len() <= u32::MAX as usize
            && (!device_writes || region.mr.access.contains(crate::AccessFlags::LOCAL_WRITE));
        if !fast {
            return Err(Refused {
                error: Error::Unsupported("prototype: only the common case"),
                buf,
            });
        }
        // SAFETY: the handle has the ring (RingCell::take).
        let ring = unsafe { self.ring.as_mut() };
        let Some(slot) = ring.reserve_head() else {
            let error = no_room(ring);
            return Err(Refused { error, buf });
        };
        self.sge = region.sge_prechecked();
        self.wr.wr_id = slot.wr_id;
        self.wr.sg_list = &mut self.sge;
        self.wr.num_sge = i32::from(region.len() != 0);
        self.wr.opcode = opcode;
        self.wr.send_flags = o.send_flags();
        self.wr.__bindgen_anon_1.imm_data = o.imm.to_be();
        if let Some(r) = remote {
            self.wr.wr.rdma = sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 {
                remote_addr: r.addr,
                rkey: r.rkey.0,
            };
        }
        ring.fill(&slot, o.wr_id, Payload::bufs(SgList::One(buf), None), true);
        ring.publish(&slot);
        let mut bad = std::ptr::null_mut();
        // SAFETY: live QP (held); `wr` is one request (`next` NULL) with
        // every field its opcode reads, its SGE in a buffer the slot now
        // owns (its memory does not move).
        let rc = unsafe { (self.post_fn)(self.qp_ptr, &mut self.wr, &mut bad) };
        if rc != 0 {
            let payload = ring.unpublish(slot);
            let buf = match payload.held {
                crate::wq_table::Held::Sg(SgList::One(b)) => b,
                _ => unreachable!("the payload filled above"),
            };
            return Err(Refused {
                error: crate::error::errno_error("ibv_post_send", rc),
                buf,
            });
        }
        ring.advance_one();
        Ok(())
    }
}

/// Why a ring had no room: entries held after a reset, or all taken.
#[cold]
fn no_room(ring: &Ring) -> Error {
    if ring.head_held() {
        Error::QueueHeldAfterReset {
            queue: "send queue",
            held: 0,
            depth: ring.depth(),
        }
    } else {
        Error::QueueFull {
            queue: "send queue",
            depth: ring.depth(),
        }
    }
}
