//! Posting work requests: the owned-buffer safe path and the raw path.

use std::sync::Arc;

use rdma_verbs_sys as sys;

use super::options::{check_options, Asked};
use super::request::{Dest, Op, SendRequest};
use crate::error::{Error, Result};
use crate::inflight::Reserved;
use crate::memory::buffer::Buf;
use crate::memory::buffer::SgList;

use crate::qp::queue_pair::QueuePair;
use crate::types::QpType;
use crate::types::{AccessFlags, SendOp};

/// Scratch space for building a chain of C work requests (`W` is
/// `ibv_send_wr` or `ibv_recv_wr`) without allocating on the data path:
/// one request, `max_sge` SGEs and a reserved slot per queue entry.
/// Allocated by the handle's first chain (a list, a scatter/gather list,
/// an extended posting) and reused by every later one; a handle that only
/// ever posts single-buffer requests never allocates it.
pub(crate) struct Scratch<W> {
    bufs: Option<Box<ScratchBufs<W>>>,
    depth: u32,
    max_sge: u32,
}

/// The allocated part of [`Scratch`].
pub(crate) struct ScratchBufs<W> {
    pub(super) wrs: Box<[W]>,
    pub(super) sges: Box<[sys::ibv_sge]>,
    /// The slots of the chain being posted (empty between posts).
    pub(super) slots: Vec<Reserved>,
    pub(super) max_sge: usize,
}

// SAFETY: the raw pointers inside the C requests are rebuilt on every post
// and only used by the handle that owns the scratch.
unsafe impl<W> Send for Scratch<W> {}

impl<W: Default + Clone> Scratch<W> {
    /// Room for chains of up to `depth` requests (the ring's depth) of
    /// `max_sge` SGEs each, allocated on first use.
    pub(crate) fn new(depth: u32, max_sge: u32) -> Scratch<W> {
        Scratch {
            bufs: None,
            depth: depth.max(1),
            max_sge: max_sge.max(1),
        }
    }

    /// The space, allocated now if this is the handle's first chain.
    #[inline]
    pub(crate) fn bufs(&mut self) -> &mut ScratchBufs<W> {
        let (depth, max_sge) = (self.depth as usize, self.max_sge as usize);
        self.bufs.get_or_insert_with(|| {
            Box::new(ScratchBufs {
                wrs: vec![W::default(); depth].into_boxed_slice(),
                sges: vec![sys::ibv_sge::default(); depth * max_sge].into_boxed_slice(),
                slots: Vec::with_capacity(depth),
                max_sge,
            })
        })
    }
}

/// Scratch space of a send queue.
pub(crate) type SendScratch = Scratch<sys::ibv_send_wr>;
/// Scratch space of a receive queue or SRQ.
pub(crate) type RecvScratch = Scratch<sys::ibv_recv_wr>;

/// Checks a request's buffers: SGE count, protection domain, write access
/// where the device writes, and lengths an SGE can describe.
pub(crate) fn check_bufs(
    sg: &SgList,
    pd: &crate::memory::protection_domain::ProtectionDomain,
    device_writes: bool,
    max_sge: u32,
    what: &'static str,
) -> Result<()> {
    match sg {
        SgList::Empty => Ok(()),
        // The common case, without the list iterator.
        SgList::One(b) if max_sge >= 1 => check_buf(b, pd, device_writes, what),
        _ => {
            if sg.len() > max_sge as usize {
                return Err(Error::TooManySges {
                    got: sg.len(),
                    max: max_sge,
                });
            }
            sg.iter()
                .try_for_each(|b| check_buf(b, pd, device_writes, what))
        }
    }
}

/// One buffer of [`check_bufs`].
#[inline]
fn check_buf(
    b: &Buf,
    pd: &crate::memory::protection_domain::ProtectionDomain,
    device_writes: bool,
    what: &'static str,
) -> Result<()> {
    let region = b.region();
    if !Arc::ptr_eq(&region.mr.pd.inner, &pd.inner) {
        return Err(Error::ForeignProtectionDomain { what: "buffer" });
    }
    if device_writes {
        if matches!(b, Buf::Frozen(_)) {
            return Err(Error::FrozenBuffer { op: what });
        }
        if !region.mr.access.contains(AccessFlags::LOCAL_WRITE) {
            return Err(Error::MissingAccess {
                what: "a buffer the device writes",
                needed: AccessFlags::LOCAL_WRITE,
            });
        }
    }
    crate::memory::buffer::sge_length(region.len()).map(drop)
}

/// The remote word of an atomic operation: 8 bytes, 8-byte aligned.
fn check_atomic_target(remote: &crate::memory::buffer::RemoteMemory) -> Result<()> {
    if remote.addr % 8 != 0 {
        return Err(Error::Misaligned {
            addr: remote.addr,
            align: 8,
        });
    }
    if remote.len < 8 {
        return Err(Error::OutOfBounds {
            offset: 0,
            len: 8,
            size: remote.len,
        });
    }
    Ok(())
}

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

/// Writes the SGEs of a request `check_bufs` accepted (count and lengths)
/// and returns how many. Empty buffers are left out: no SGE of length 0
/// reaches the provider, since some devices read a data segment's byte
/// count 0 as 2 GiB (mlx4/mlx5; rdma-core's mlx4 receive path passes it
/// through), which would let a message run past the buffer. The request
/// keeps the empty buffers all the same, and hands them back.
pub(super) fn fill_sges(sg: &SgList, out: &mut [sys::ibv_sge]) -> usize {
    let mut n = 0;
    for b in sg.iter().filter(|b| !b.is_empty()) {
        // `n` < the list's length <= `out.len()` (check_bufs: SGE count).
        if let Some(slot) = out.get_mut(n) {
            *slot = b.region().sge_prechecked();
            n += 1;
        }
    }
    n
}

/// The inline rule of DESIGN.md's request-option table: a request may ask
/// the provider to copy at most `max` bytes (the queue pair's
/// `max_inline_data`) into its work request. What it asks to copy is its
/// inline data (`inline`), else, with `IBV_SEND_INLINE` (`flag`), its
/// buffers' bytes (`buffers_len`, measured only then); without either it
/// inlines nothing. `Some(len)`: the `len` bytes asked are too many.
/// Which operations may inline at all is [`check_options`]' rule.
#[inline(always)]
fn inline_excess(
    inline: Option<&[u8]>,
    flag: bool,
    buffers_len: impl FnOnce() -> u64,
    max: u32,
) -> Option<u64> {
    let len = match inline {
        Some(data) => data.len() as u64,
        None if flag => buffers_len(),
        None => return None,
    };
    (len > u64::from(max)).then_some(len)
}

impl QueuePair {
    /// Checks a request before posting: DESIGN.md's request-option table
    /// ([`check_options`]), then the queue pair's limits and the buffers.
    /// `extended` says whether it goes through the `ibv_wr_*` path (the
    /// only one for atomic write and flush).
    pub(super) fn check_send(&self, r: &SendRequest<'_>, extended: bool) -> Result<()> {
        use sys::ibv_send_flags as F;
        let caps = &self.inner.caps;
        let ty = self.inner.qp_type;
        let inline_flag = r.flags & F::IBV_SEND_INLINE.0 != 0;
        let solicited = r.flags & F::IBV_SEND_SOLICITED.0 != 0;
        // The data path's common case: a signaled send, RDMA write or read of
        // an RC queue pair whose options the table allows for certain (no
        // immediate data, invalidation or UD destination; solicited only on
        // a send; inline only on a send or write) needs only the checks
        // named here.
        if ty == QpType::Rc
            && r.imm.is_none()
            && r.invalidate.is_none()
            && r.ud.is_none()
            && (!solicited || matches!(r.op, Op::Send))
        {
            match (r.inline, &r.op, &r.sg) {
                // Inline bytes: only their length can be wrong, and they
                // carry no buffer, so the request may be unsignaled too.
                (Some(data), Op::Send | Op::Write(_), SgList::Empty)
                    if inline_excess(Some(data), false, || 0, caps.max_inline_data).is_none() =>
                {
                    return Ok(());
                }
                (None, Op::Send | Op::Write(_), _)
                    if r.is_signaled()
                        && inline_excess(
                            None,
                            inline_flag,
                            || r.sg.total_len(),
                            caps.max_inline_data,
                        )
                        .is_none() =>
                {
                    return check_bufs(
                        &r.sg,
                        &self.inner.pd,
                        false,
                        caps.max_send_sge,
                        r.op.name(),
                    );
                }
                // Never inline: the device writes a read's buffer.
                (None, Op::Read(_), _) if r.is_signaled() && !inline_flag => {
                    return check_bufs(&r.sg, &self.inner.pd, true, caps.max_send_sge, r.op.name());
                }
                _ => {}
            }
        }
        let op = r.op.kind();
        check_options(
            op,
            ty,
            Asked {
                inline: inline_flag || r.inline.is_some(),
                imm: r.imm.is_some(),
                solicited,
                fence: r.flags & F::IBV_SEND_FENCE.0 != 0,
                invalidate: r.invalidate.is_some(),
                ud: matches!(r.ud, Some(Dest::Ud(_))),
                xrc: matches!(r.ud, Some(Dest::Xrc(_))),
            },
        )?;
        let what = r.op.name();
        if let Op::Flush { .. } = &r.op {
            if !extended {
                return Err(Error::SendOpFlagsRequired {
                    op: SendOp::Flush,
                    needed: crate::types::SendOpFlags::FLUSH,
                });
            }
        }
        if let Op::AtomicWrite { remote, .. } = &r.op {
            if !extended {
                return Err(Error::SendOpFlagsRequired {
                    op: SendOp::AtomicWrite,
                    needed: crate::types::SendOpFlags::ATOMIC_WRITE,
                });
            }
            check_atomic_target(remote)?;
        }
        if let Some(Dest::Ud(ud)) = &r.ud {
            if !Arc::ptr_eq(&ud.ah.pd().inner, &self.inner.pd.inner) {
                return Err(Error::ForeignProtectionDomain {
                    what: "address handle",
                });
            }
            // A UD message is one packet: a longer one is silently dropped
            // with a successful completion (IBA C10-93.1.1; rxe does so).
            let len = r
                .inline
                .map_or_else(|| r.sg.total_len(), |d| d.len() as u64);
            let mtu = ud.ah.port_mtu();
            if mtu != 0 && len > u64::from(mtu) {
                return Err(Error::UdMessageTooLong { len, mtu });
            }
        }
        if let Some(len) = inline_excess(
            r.inline,
            inline_flag,
            || r.sg.total_len(),
            caps.max_inline_data,
        ) {
            return Err(Error::InlineTooLarge {
                len,
                max: caps.max_inline_data,
            });
        }
        if !r.is_signaled() && !self.inner.sq_sig_all && !r.sg.all_frozen() {
            return Err(Error::UnsignaledExclusive { op });
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
            match (bufs.next(), bufs.next()) {
                (Some(b), None) if b.len() == 8 => {
                    let addr = b.region().addr();
                    if addr % 8 != 0 {
                        return Err(Error::Misaligned { addr, align: 8 });
                    }
                }
                _ => {
                    return Err(Error::AtomicResultBuffer {
                        buffers: r.sg.len(),
                        len: r.sg.total_len(),
                    })
                }
            }
            check_atomic_target(remote)?;
        }
        Ok(())
    }
}

/// The SGE of inline data (the provider copies the bytes; no key).
pub(super) fn inline_sge(data: &[u8]) -> sys::ibv_sge {
    sys::ibv_sge {
        addr: data.as_ptr() as u64,
        length: data.len() as u32,
        lkey: 0,
    }
}

/// The C request for a checked `r`: opcode, flags, immediate or key to
/// invalidate, and the remote, atomic or UD fields, every other field
/// zero. The caller sets `wr_id`, `next` and the SGEs.
#[inline]
pub(super) fn c_send_wr(r: &SendRequest<'_>) -> sys::ibv_send_wr {
    let mut wr = sys::ibv_send_wr::default();
    // SAFETY: `wr` is valid for writes.
    unsafe { write_send_wr(&mut wr, r, 0, std::ptr::null_mut(), 0) };
    wr
}

/// Writes the C request for a checked `r` into `wr`: `wr_id`, `next`
/// (NULL), the SGEs, the opcode, flags, immediate data or key to
/// invalidate, the member of the `wr` union its operation has (remote,
/// atomic or UD fields) and `qp_type` (zero). Those are the fields a
/// provider reads for these opcodes and queue pair types
/// (`ibv_post_send(3)`); the rest (the other union members, `bind_mw`,
/// `tso`) is left as it was, uninitialised in a request built on the
/// stack, which is only ever handed to the provider.
///
/// # Safety
/// `wr` must be valid for writes of an `ibv_send_wr`.
#[inline(always)]
pub(super) unsafe fn write_send_wr(
    wr: *mut sys::ibv_send_wr,
    r: &SendRequest<'_>,
    wr_id: u64,
    sg_list: *mut sys::ibv_sge,
    num_sge: i32,
) {
    use std::ptr::addr_of_mut;
    let mut flags = r.flags;
    if r.inline.is_some() {
        flags |= sys::ibv_send_flags::IBV_SEND_INLINE.0;
    }
    let opcode = match (&r.op, r.imm.is_some()) {
        (Op::Send, false) if r.invalidate.is_some() => sys::IBV_WR_SEND_WITH_INV,
        (Op::Send, false) => sys::IBV_WR_SEND,
        (Op::Send, true) => sys::IBV_WR_SEND_WITH_IMM,
        (Op::Write(_), false) => sys::IBV_WR_RDMA_WRITE,
        (Op::Write(_), true) => sys::IBV_WR_RDMA_WRITE_WITH_IMM,
        (Op::Read(_), _) => sys::IBV_WR_RDMA_READ,
        (Op::CompareSwap { .. }, _) => sys::IBV_WR_ATOMIC_CMP_AND_SWP,
        (Op::FetchAdd { .. }, _) => sys::IBV_WR_ATOMIC_FETCH_AND_ADD,
        // Refused by check_send(.., false): the value has no field in
        // `ibv_send_wr`.
        (Op::AtomicWrite { .. }, _) => sys::IBV_WR_ATOMIC_WRITE,
        (Op::Flush { .. }, _) => sys::IBV_WR_FLUSH,
    };
    // SAFETY: for every write below, `wr` is valid for writes (the caller's
    // contract); fields and union members are written, never read.
    unsafe {
        addr_of_mut!((*wr).wr_id).write(wr_id);
        addr_of_mut!((*wr).next).write(std::ptr::null_mut());
        addr_of_mut!((*wr).sg_list).write(sg_list);
        addr_of_mut!((*wr).num_sge).write(num_sge);
        addr_of_mut!((*wr).opcode).write(opcode);
        addr_of_mut!((*wr).send_flags).write(flags);
        match r.invalidate {
            Some(rkey) => addr_of_mut!((*wr).__bindgen_anon_1.invalidate_rkey).write(rkey),
            None => addr_of_mut!((*wr).__bindgen_anon_1.imm_data)
                .write(r.imm.map(u32::to_be).unwrap_or(0)),
        }
        match r.op {
            Op::Send | Op::AtomicWrite { .. } => {}
            Op::Flush { .. } => {}
            Op::Write(m) | Op::Read(m) => {
                addr_of_mut!((*wr).wr.rdma).write(sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 {
                    remote_addr: m.addr,
                    rkey: m.rkey.0,
                });
            }
            Op::CompareSwap {
                remote,
                compare,
                swap,
            } => {
                addr_of_mut!((*wr).wr.atomic).write(sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_2 {
                    remote_addr: remote.addr,
                    compare_add: compare,
                    swap,
                    rkey: remote.rkey.0,
                });
            }
            Op::FetchAdd { remote, add } => {
                addr_of_mut!((*wr).wr.atomic).write(sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_2 {
                    remote_addr: remote.addr,
                    compare_add: add,
                    swap: 0,
                    rkey: remote.rkey.0,
                });
            }
        }
        let srqn = match &r.ud {
            None => 0,
            Some(Dest::Ud(ud)) => {
                addr_of_mut!((*wr).wr.ud).write(sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_3 {
                    ah: ud.ah.as_ptr(),
                    remote_qpn: ud.qpn.0,
                    remote_qkey: ud.qkey,
                });
                0
            }
            Some(Dest::Xrc(srqn)) => *srqn,
        };
        addr_of_mut!((*wr).qp_type.xrc.remote_srqn).write(srqn);
    }
}

#[cfg(test)]
mod tests {
    use super::{inline_excess, posted_count};

    #[test]
    fn inline_excess_counts_only_what_is_inlined() {
        let unmeasured = || -> u64 { panic!("buffers measured without IBV_SEND_INLINE") };
        // Nothing inlined: no limit, the buffers are not measured.
        assert_eq!(inline_excess(None, false, unmeasured, 0), None);
        // Inline data, up to the limit.
        assert_eq!(inline_excess(Some(&[7; 64]), false, unmeasured, 64), None);
        assert_eq!(
            inline_excess(Some(&[7; 65]), false, unmeasured, 64),
            Some(65)
        );
        assert_eq!(inline_excess(Some(&[]), false, unmeasured, 0), None);
        // Inline data is what is copied, flag or not: not the buffers.
        assert_eq!(inline_excess(Some(&[7; 8]), true, unmeasured, 8), None);
        assert_eq!(inline_excess(Some(&[7; 9]), true, unmeasured, 8), Some(9));
        // IBV_SEND_INLINE on buffers: their bytes.
        assert_eq!(inline_excess(None, true, || 64, 64), None);
        assert_eq!(inline_excess(None, true, || 65, 64), Some(65));
        assert_eq!(inline_excess(None, true, || 0, 0), None);
        assert_eq!(
            inline_excess(None, true, || u64::MAX, u32::MAX),
            Some(u64::MAX)
        );
    }

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
