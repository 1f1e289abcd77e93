//! The extended posting API: `ibv_wr_start` … `ibv_wr_complete`.
//!
//! The same requests, the same checks and the same in-flight slots as
//! the classic path of [`SendQueue`](crate::SendQueue); only the way the
//! request reaches the provider differs. Every `ibv_wr_*` builder is a function pointer in
//! `struct ibv_qp_ex` that the provider fills only for the operations the QP
//! was created with: this module calls each pointer only after checking it
//! is set, and refuses the request by name otherwise (the C inline helpers
//! would jump to NULL).

use rdma_verbs_sys as sys;

use super::post::fill_sges;
use super::request::{Op, SendRequest};
use crate::error::{Error, Result};
use crate::inflight::Reserved;
use crate::qp::queue_pair::QueuePair;
use crate::types::SendOpFlags;

bitflags::bitflags! {
    /// What a flush guarantees (`IBV_FLUSH_GLOBAL`, `IBV_FLUSH_PERSISTENT`).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub struct FlushType: u8 {
        /// Global visibility.
        const GLOBAL = sys::IBV_FLUSH_GLOBAL as u8;
        /// Persistence.
        const PERSISTENT = sys::IBV_FLUSH_PERSISTENT as u8;
    }
}

/// How much a flush covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum FlushLevel {
    /// The given range (`IBV_FLUSH_RANGE`).
    Range = sys::IBV_FLUSH_RANGE as u8,
    /// The whole memory region of the key (`IBV_FLUSH_MR`).
    Region = sys::IBV_FLUSH_MR as u8,
}

impl SendOpFlags {
    /// The data-path operations of an RC queue pair: sends, writes, reads
    /// and atomics, with and without immediate data.
    pub fn rc_data() -> SendOpFlags {
        SendOpFlags::SEND
            | SendOpFlags::SEND_WITH_IMM
            | SendOpFlags::RDMA_WRITE
            | SendOpFlags::RDMA_WRITE_WITH_IMM
            | SendOpFlags::RDMA_READ
            | SendOpFlags::ATOMIC_CMP_AND_SWP
            | SendOpFlags::ATOMIC_FETCH_AND_ADD
    }
}

/// Which `send_ops_flags` bit a request needs.
fn needed(r: &SendRequest<'_>) -> SendOpFlags {
    match (&r.op, r.imm.is_some(), r.invalidate.is_some()) {
        (Op::Send, _, true) => SendOpFlags::SEND_WITH_INV,
        (Op::Send, true, _) => SendOpFlags::SEND_WITH_IMM,
        (Op::Send, false, _) => SendOpFlags::SEND,
        (Op::Write(_), true, _) => SendOpFlags::RDMA_WRITE_WITH_IMM,
        (Op::Write(_), false, _) => SendOpFlags::RDMA_WRITE,
        (Op::Read(_), ..) => SendOpFlags::RDMA_READ,
        (Op::CompareSwap { .. }, ..) => SendOpFlags::ATOMIC_CMP_AND_SWP,
        (Op::FetchAdd { .. }, ..) => SendOpFlags::ATOMIC_FETCH_AND_ADD,
        (Op::AtomicWrite { .. }, ..) => SendOpFlags::ATOMIC_WRITE,
        (Op::Flush { .. }, ..) => SendOpFlags::FLUSH,
    }
}

macro_rules! op {
    ($qpx:expr, $field:ident, $what:expr) => {
        // SAFETY: live extended QP; reading a function pointer field.
        unsafe { (*$qpx).$field }.ok_or_else(|| {
            Error::Unsupported(concat!(
                "the provider does not implement ",
                $what,
                " (ibv_qp_ex::",
                stringify!($field),
                " is NULL)"
            ))
        })?
    };
}

impl QueuePair {
    /// The operations this queue pair was created for with
    /// [`QueuePairBuilder::send_ops`](crate::qp::QueuePairBuilder::send_ops);
    /// `None` for a classic queue pair.
    pub fn send_ops(&self) -> Option<SendOpFlags> {
        self.inner.qpx.map(|(_, ops)| ops)
    }

    /// Posts `wrs` in one `ibv_wr_start` … `ibv_wr_complete` region, all
    /// or nothing, each under the `wr_id` of its (filled, published)
    /// slot: the request's buffers are already there, and the SGEs come
    /// from them. The caller holds the send queue's handle (the region is
    /// the QP's posting critical section) and takes the slots back on
    /// error.
    pub(super) fn post_send_ex(
        &self,
        wrs: &[SendRequest<'_>],
        slots: &[Reserved],
        sges: &mut [sys::ibv_sge],
        max_sge: usize,
    ) -> Result<()> {
        let Some((qpx, ops)) = self.inner.qpx else {
            return Err(Error::Unsupported(
                "the ibv_wr_* path on a queue pair created without send_ops",
            ));
        };
        let qpx = qpx.as_ptr();
        for (r, s) in wrs.iter().zip(slots) {
            // SAFETY: filled by the caller, not yet seen by the device.
            let sg = unsafe { s.sg() };
            if r.inline.is_none()
                && r.flags & sys::ibv_send_flags::IBV_SEND_INLINE.0 != 0
                && sg.len() > 1
            {
                // Inlined buffers go through ibv_wr_set_inline_data: one
                // per request (or use inline data).
                return Err(Error::TooManySges {
                    got: sg.len(),
                    max: 1,
                });
            }
            let need = needed(r);
            if !ops.contains(need) {
                return Err(Error::SendOpFlagsRequired {
                    op: r.op.kind(),
                    needed: need,
                });
            }
        }
        let start = op!(qpx, wr_start, "ibv_wr_start");
        let complete = op!(qpx, wr_complete, "ibv_wr_complete");
        let abort = op!(qpx, wr_abort, "ibv_wr_abort");
        // SAFETY: live extended QP; the caller's handle makes this the QP's
        // only posting critical section (ibv_wr_post(3), CONCURRENCY).
        unsafe { start(qpx) };
        match self.build_ex(qpx, wrs, slots, sges, max_sge) {
            Ok(()) => {
                // The SGEs point into buffers the slots own; inline data
                // and atomic-write values are copied by the builders. On
                // failure ibv_wr_complete(3) aborts the whole region.
                // SAFETY: inside the region opened above, buffers held.
                let rc = unsafe { complete(qpx) };
                crate::error::ret_errno("ibv_wr_complete", rc)
            }
            Err(e) => {
                // SAFETY: inside the region opened above; discards it.
                unsafe { abort(qpx) };
                Err(e)
            }
        }
    }

    /// Calls the builders of every request (inside an open region).
    fn build_ex(
        &self,
        qpx: *mut sys::ibv_qp_ex,
        wrs: &[SendRequest<'_>],
        slots: &[Reserved],
        sges_all: &mut [sys::ibv_sge],
        max_sge: usize,
    ) -> Result<()> {
        for (i, (r, s)) in wrs.iter().zip(slots).enumerate() {
            // ibv_wr_post(3) says inline setters need no IBV_SEND_INLINE,
            // but rxe (rdma-core 44) decides inline-ness from the flag alone
            // and fails an inline write without it; other providers ignore
            // it in `wr_flags`, so it is always set with inline data.
            let mut flags = r.flags;
            if r.inline.is_some() {
                flags |= sys::ibv_send_flags::IBV_SEND_INLINE.0;
            }
            if self.inner.sq_sig_all {
                flags |= sys::ibv_send_flags::IBV_SEND_SIGNALED.0;
            }
            // SAFETY: live extended QP inside an open region: `wr_id` and
            // `wr_flags` are the inputs of the next builder call.
            unsafe {
                (*qpx).wr_id = s.wr_id;
                (*qpx).wr_flags = flags;
            }
            let imm = r.imm.map(u32::to_be).unwrap_or(0);
            // SAFETY (every call below): live extended QP inside an open
            // region; each pointer was checked non-NULL by `op!`.
            match (r.op, r.imm.is_some(), r.invalidate) {
                (Op::Send, _, Some(rkey)) => {
                    let f = op!(qpx, wr_send_inv, "send with invalidate");
                    // SAFETY: live QP inside the open region; `f` was checked non-NULL.
                    unsafe { f(qpx, rkey) }
                }
                (Op::Send, true, None) => {
                    let f = op!(qpx, wr_send_imm, "send with immediate");
                    // SAFETY: live QP inside the open region; `f` was checked non-NULL.
                    unsafe { f(qpx, imm) }
                }
                (Op::Send, false, None) => {
                    let f = op!(qpx, wr_send, "send");
                    // SAFETY: live QP inside the open region; `f` was checked non-NULL.
                    unsafe { f(qpx) }
                }
                (Op::Write(m), true, _) => {
                    let f = op!(qpx, wr_rdma_write_imm, "RDMA write with immediate");
                    // SAFETY: live QP inside the open region; `f` was checked non-NULL.
                    unsafe { f(qpx, m.rkey.0, m.addr, imm) }
                }
                (Op::Write(m), false, _) => {
                    let f = op!(qpx, wr_rdma_write, "RDMA write");
                    // SAFETY: live QP inside the open region; `f` was checked non-NULL.
                    unsafe { f(qpx, m.rkey.0, m.addr) }
                }
                (Op::Read(m), ..) => {
                    let f = op!(qpx, wr_rdma_read, "RDMA read");
                    // SAFETY: live QP inside the open region; `f` was checked non-NULL.
                    unsafe { f(qpx, m.rkey.0, m.addr) }
                }
                (
                    Op::CompareSwap {
                        remote,
                        compare,
                        swap,
                    },
                    ..,
                ) => {
                    let f = op!(qpx, wr_atomic_cmp_swp, "atomic compare-and-swap");
                    // SAFETY: live QP inside the open region; `f` was checked non-NULL.
                    unsafe { f(qpx, remote.rkey.0, remote.addr, compare, swap) }
                }
                (Op::FetchAdd { remote, add }, ..) => {
                    let f = op!(qpx, wr_atomic_fetch_add, "atomic fetch-and-add");
                    // SAFETY: live QP inside the open region; `f` was checked non-NULL.
                    unsafe { f(qpx, remote.rkey.0, remote.addr, add) }
                }
                (
                    Op::Flush {
                        remote,
                        kind,
                        level,
                    },
                    ..,
                ) => {
                    // The QP has SendOpFlags::FLUSH (checked above), which
                    // QueuePairBuilder grants only on rdma-core 45 or newer,
                    // whose `ibv_qp_ex` ends with `wr_flush`.
                    let qpx45 = qpx.cast::<sys::ibv_qp_ex_45>();
                    let f = op!(qpx45, wr_flush, "flush");
                    // SAFETY: live QP inside the open region; `f` was checked non-NULL.
                    unsafe {
                        f(
                            qpx,
                            remote.rkey.0,
                            remote.addr,
                            remote.len as usize,
                            kind,
                            level,
                        )
                    };
                    continue;
                }
                (Op::AtomicWrite { remote, value }, ..) => {
                    let f = op!(qpx, wr_atomic_write, "atomic write");
                    // SAFETY: live QP inside the open region; `f` was checked
                    // non-NULL; it copies the 8 bytes of `value` during the call.
                    unsafe { f(qpx, remote.rkey.0, remote.addr, value.as_ptr().cast()) };
                    continue;
                }
            }
            match &r.ud {
                None => {}
                Some(super::request::Dest::Ud(ud)) => {
                    let f = op!(qpx, wr_set_ud_addr, "UD addressing");
                    // SAFETY: as above; the address handle is kept alive by
                    // the slot until the request completed.
                    unsafe { f(qpx, ud.ah.as_ptr(), ud.qpn.0, ud.qkey) };
                }
                Some(super::request::Dest::Xrc(srqn)) => {
                    let f = op!(qpx, wr_set_xrc_srqn, "XRC addressing");
                    // SAFETY: as above; a number, no memory.
                    unsafe { f(qpx, *srqn) };
                }
            }
            if let Some(data) = r.inline {
                let f = op!(qpx, wr_set_inline_data, "inline data");
                // SAFETY: as above; the provider copies `data` now.
                unsafe { f(qpx, data.as_ptr() as *mut _, data.len()) };
            } else {
                let sges = &mut sges_all[i * max_sge..(i + 1) * max_sge];
                // SAFETY: filled by the caller, not yet seen by the device.
                let num = fill_sges(unsafe { s.sg() }, sges);
                if r.flags & sys::ibv_send_flags::IBV_SEND_INLINE.0 != 0 && num == 1 {
                    // Inline the buffer's bytes (the request keeps the buffer).
                    let f = op!(qpx, wr_set_inline_data, "inline data");
                    // SAFETY: as above; the bytes are copied now.
                    unsafe { f(qpx, sges[0].addr as *mut _, sges[0].length as usize) };
                } else {
                    let f = op!(qpx, wr_set_sge_list, "scatter/gather list");
                    // SAFETY: as above; `num` SGEs are initialised, pointing
                    // into buffers that stay owned by the slot.
                    unsafe { f(qpx, num, sges.as_ptr()) };
                }
            }
        }
        Ok(())
    }
}

/// A memory-window request of the `ibv_wr_*` path.
pub(crate) enum WindowWr<'a> {
    /// `ibv_wr_bind_mw(mw, rkey, info)`.
    Bind {
        mw: *mut sys::ibv_mw,
        rkey: u32,
        info: &'a sys::ibv_mw_bind_info,
    },
    /// `ibv_wr_local_inv(rkey)`.
    LocalInv { rkey: u32 },
}

impl QueuePair {
    /// Posts one signaled memory-window request in its own `ibv_wr_start`
    /// … `ibv_wr_complete` region when this queue pair was created with its
    /// [`SendOpFlags`] flag (`BIND_MW`, `LOCAL_INV`); `None` otherwise (the
    /// caller posts it with `ibv_post_send`, which ibv_wr_post(3) lets
    /// interleave with the regions). The caller holds the send lock (the
    /// region is the QP's posting critical section) and keeps the window and
    /// its regions alive in the request's slot.
    pub(crate) fn post_window_ex(&self, wr_id: u64, wr: WindowWr<'_>) -> Option<Result<()>> {
        let (qpx, ops) = self.inner.qpx?;
        let need = match wr {
            WindowWr::Bind { .. } => SendOpFlags::BIND_MW,
            WindowWr::LocalInv { .. } => SendOpFlags::LOCAL_INV,
        };
        if !ops.contains(need) {
            return None;
        }
        let qpx = qpx.as_ptr();
        Some((|| {
            let start = op!(qpx, wr_start, "ibv_wr_start");
            let complete = op!(qpx, wr_complete, "ibv_wr_complete");
            let (bind_call, inv_call);
            // Every builder pointer is checked before the region opens.
            let build: &dyn Fn() = match wr {
                WindowWr::Bind { mw, rkey, info } => {
                    let f = op!(qpx, wr_bind_mw, "memory window bind");
                    bind_call = move || {
                        // SAFETY: called inside the region opened below;
                        // `f` is non-NULL; the window and the region `info`
                        // names are held by the request's slot; `info` is
                        // read during the call.
                        unsafe { f(qpx, mw, rkey, info) }
                    };
                    &bind_call
                }
                WindowWr::LocalInv { rkey } => {
                    let f = op!(qpx, wr_local_inv, "local invalidate");
                    inv_call = move || {
                        // SAFETY: called inside the region opened below;
                        // `f` is non-NULL.
                        unsafe { f(qpx, rkey) }
                    };
                    &inv_call
                }
            };
            // SAFETY: live extended QP; the send lock (held by the caller)
            // makes this the QP's only posting critical section; `wr_id`
            // and `wr_flags` are the inputs of the next builder call.
            unsafe {
                start(qpx);
                (*qpx).wr_id = wr_id;
                (*qpx).wr_flags = sys::ibv_send_flags::IBV_SEND_SIGNALED.0;
            }
            build();
            // SAFETY: inside the region opened above; on failure the
            // provider discards the region (ibv_wr_complete(3)).
            let rc = unsafe { complete(qpx) };
            crate::error::ret_errno("ibv_wr_complete", rc)
        })())
    }
}
