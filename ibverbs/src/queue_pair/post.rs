//! Posting work requests: the owned-buffer safe path and the raw path.

use std::sync::Arc;

use ibverbs_sys as sys;

use super::options::{check_options, Asked};
use super::request::{Dest, Op, SendOp, SendRequest};
use super::work::{SendWork, Token};
use crate::buffer::Buf;
use crate::error::{Error, Result};
use crate::memory_region::AccessFlags;
use crate::wq_table::{Payload, SgList};
use crate::{QpType, QueuePair};

/// Scratch space for building a chain of C work requests (`W` is
/// `ibv_send_wr` or `ibv_recv_wr`) without allocating on the data path:
/// one request and `max_sge` SGEs per queue entry. Allocated by the
/// queue's first chain (a list, a scatter/gather list, an extended
/// posting) and reused by every later one; a queue that only ever posts
/// single-buffer requests (built on the stack) never allocates it.
pub(crate) struct Scratch<W> {
    bufs: Option<Box<ScratchBufs<W>>>,
    depth: u32,
    max_sge: u32,
}

/// The allocated part of [`Scratch`].
pub(crate) struct ScratchBufs<W> {
    pub(super) wrs: Box<[W]>,
    pub(super) sges: Box<[sys::ibv_sge]>,
    pub(super) tags: Box<[u32]>,
    pub(super) max_sge: usize,
}

// SAFETY: the raw pointers inside the C requests are rebuilt on every post
// and only used while the owning table's Mutex is held.
unsafe impl<W> Send for Scratch<W> {}

impl<W: Default + Clone> Scratch<W> {
    /// Room for chains of up to `depth` requests (the table's capacity,
    /// which `check_room` holds every chain to) of `max_sge` SGEs each,
    /// allocated on first use.
    pub(crate) fn new(depth: u32, max_sge: u32) -> Scratch<W> {
        Scratch {
            bufs: None,
            depth: depth.max(1),
            max_sge: max_sge.max(1),
        }
    }

    /// The space, allocated now if this is the queue's first chain.
    #[inline]
    pub(crate) fn bufs(&mut self) -> &mut ScratchBufs<W> {
        let (depth, max_sge) = (self.depth as usize, self.max_sge as usize);
        self.bufs.get_or_insert_with(|| {
            Box::new(ScratchBufs {
                wrs: vec![W::default(); depth].into_boxed_slice(),
                sges: vec![sys::ibv_sge::default(); depth * max_sge].into_boxed_slice(),
                tags: vec![0; depth].into_boxed_slice(),
                max_sge,
            })
        })
    }

    /// Heap bytes held (for the footprint tests).
    #[cfg(test)]
    pub(crate) fn heap_bytes(&self) -> usize {
        use std::mem::size_of_val;
        self.bufs.as_ref().map_or(0, |b| {
            std::mem::size_of::<ScratchBufs<W>>()
                + size_of_val(&*b.wrs)
                + size_of_val(&*b.sges)
                + size_of_val(&*b.tags)
        })
    }
}

/// Scratch space of a send queue.
pub(crate) type SendScratch = Scratch<sys::ibv_send_wr>;
/// Scratch space of a receive queue or SRQ.
pub(crate) type RecvScratch = Scratch<sys::ibv_recv_wr>;

// A send queue completes in order: its table is a ring.
impl crate::wq_table::Kind for SendScratch {
    const ALWAYS_RING: bool = true;
}

// An SRQ's table is a slab.
impl crate::wq_table::Kind for RecvScratch {
    const ALWAYS_RING: bool = false;
}

/// Checks a request's buffers: SGE count, protection domain, write access
/// where the device writes, and lengths an SGE can describe.
pub(crate) fn check_bufs(
    sg: &SgList,
    pd: &crate::ProtectionDomain,
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
    pd: &crate::ProtectionDomain,
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
    crate::buffer::sge_length(region.len()).map(drop)
}

/// The remote word of an atomic operation: 8 bytes, 8-byte aligned.
fn check_atomic_target(remote: &crate::RemoteMemory) -> Result<()> {
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

impl QueuePair {
    /// The data path's common case of [`check_send`](Self::check_send),
    /// decided inline: a signaled send, RDMA write or RDMA read of one
    /// buffer of this queue pair's PD, on an RC queue pair that takes an
    /// SGE, with no option but a fence. Every cell of DESIGN.md's
    /// request-option table allows it, so `true` means every check passed;
    /// `false` only that `check_send` must decide (and name the error).
    #[inline(always)]
    fn send_passes_fast(&self, r: &SendRequest<'_>) -> bool {
        use sys::ibv_send_flags as F;
        let SgList::One(b) = &r.sg else {
            return false;
        };
        if !(self.inner.rc_with_sge
            && r.flags & !F::IBV_SEND_FENCE.0 == F::IBV_SEND_SIGNALED.0
            && r.inline.is_none()
            && r.imm.is_none()
            && r.invalidate.is_none()
            && r.ud.is_none())
        {
            return false;
        }
        let device_writes = match r.op {
            Op::Send | Op::Write(_) => false,
            Op::Read(_) => true,
            _ => return false,
        };
        let region = b.region();
        Arc::ptr_eq(&region.mr.pd.inner, &self.inner.pd.inner)
            && u32::try_from(region.len()).is_ok()
            && (!device_writes
                || (!matches!(b, Buf::Frozen(_))
                    && region.mr.access.contains(AccessFlags::LOCAL_WRITE)))
    }

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
                    if data.len() <= caps.max_inline_data as usize =>
                {
                    return Ok(());
                }
                (None, Op::Send | Op::Write(_), _)
                    if r.is_signaled()
                        && (!inline_flag
                            || r.sg.total_len() <= u64::from(caps.max_inline_data)) =>
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
        #[cfg(ibverbs_flush)]
        if let Op::Flush { .. } = &r.op {
            if !extended {
                return Err(Error::SendOpsRequired {
                    op: SendOp::Flush,
                    needed: crate::SendOps::FLUSH,
                });
            }
        }
        if let Op::AtomicWrite { remote, .. } = &r.op {
            if !extended {
                return Err(Error::SendOpsRequired {
                    op: SendOp::AtomicWrite,
                    needed: crate::SendOps::ATOMIC_WRITE,
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
        let inline_len = match r.inline {
            Some(data) => Some(data.len() as u64),
            None => inline_flag.then(|| r.sg.total_len()),
        };
        if let Some(len) = inline_len {
            if len > u64::from(caps.max_inline_data) {
                return Err(Error::InlineTooLarge {
                    len,
                    max: caps.max_inline_data,
                });
            }
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

    /// Posts send-queue work: one [`SendRequest`], or a chain of them in a
    /// `&mut Vec` rung with one doorbell ([`SendWork`]). The buffers stay
    /// owned by the queue pair until the completion hands them back.
    ///
    /// A queue pair created with [`SendOps`](crate::SendOps) is posted to
    /// through the `ibv_wr_start` … `ibv_wr_complete` region (the only way
    /// to atomic write and flush; a chain is then all or nothing); any
    /// other through `ibv_post_send`. A request with at most one buffer (or
    /// inline data) to a classic queue pair builds its C request and SGE on
    /// the stack and costs little more than the raw
    /// [`post_send_raw`](Self::post_send_raw).
    ///
    /// # Errors
    /// A refused [`SendRequest`] comes back whole in a [`PostError`](crate::PostError); a
    /// chain keeps the requests not posted in its `Vec` and returns the
    /// [`Error`]. Checked before anything is posted (a failed check posts
    /// nothing): QP type and request options ([`Error::OpNotAvailable`],
    /// [`Error::OptionNotAllowed`], [`Error::OptionRequired`]),
    /// [`Error::TooManySges`], [`Error::InlineTooLarge`], atomic operands
    /// ([`Error::Misaligned`], [`Error::OutOfBounds`] for a remote range
    /// shorter than the 8-byte word, [`Error::AtomicResultBuffer`]), a
    /// buffer or address handle of another PD
    /// ([`Error::ForeignProtectionDomain`]), a buffer the device would
    /// write that is frozen ([`Error::FrozenBuffer`]) or lacks
    /// `LOCAL_WRITE` ([`Error::MissingAccess`]),
    /// [`Error::UnsignaledExclusive`], [`Error::UdMessageTooLong`], an
    /// operation the queue pair was not created for
    /// ([`Error::SendOpsRequired`]), a buffer longer than an SGE describes
    /// ([`Error::OutOfRange`]), [`Error::QueueFull`] (or
    /// [`Error::QueueHeldAfterReset`] after a reset), a queue pair in
    /// RESET, INIT or RTR ([`Error::NotReadyToSend`], refused before
    /// reaching the provider). The provider's refusal is
    /// [`Error::Verb`] naming `ibv_post_send` or `ibv_wr_complete`.
    ///
    /// # References
    /// `ibv_post_send(3)`, `ibv_wr_post(3)`
    ///
    /// # Example
    /// ```no_run
    /// # fn demo(
    /// #     qp: &ibverbs::QueuePair,
    /// #     a: ibverbs::LocalBuffer,
    /// #     b: ibverbs::LocalBuffer,
    /// #     c: ibverbs::LocalBuffer,
    /// # ) -> ibverbs::Result<()> {
    /// use ibverbs::SendRequest;
    /// qp.post_send(SendRequest::send(a).wr_id(1))?;
    /// // Two requests, one doorbell:
    /// let mut chain = vec![SendRequest::send(b).wr_id(2), SendRequest::send(c).wr_id(3)];
    /// qp.post_send(&mut chain)?;
    /// # Ok(()) }
    /// ```
    #[doc(alias = "ibv_post_send")]
    #[doc(alias = "ibv_wr_start")]
    #[doc(alias = "ibv_wr_complete")]
    #[inline]
    pub fn post_send<W: SendWork>(&self, work: W) -> Result<(), W::Error> {
        work.post_to(self, Token(()))
    }

    /// Posts one request through the queue pair's verb. On success its
    /// buffers and address handle are in their slot (`r` keeps nothing
    /// that needs dropping: the caller may forget it), on error `r` is
    /// unchanged.
    #[inline]
    pub(super) fn post_request(&self, r: &mut SendRequest<'_>) -> Result<()> {
        if self.inner.qpx.is_some() {
            return self.post_send_ex_slice(std::slice::from_mut(r));
        }
        if let (None, SgList::Many(_)) = (r.inline, &r.sg) {
            return self.post_send_slice(std::slice::from_mut(r)).1;
        }
        self.post_single(r)
    }

    /// Posts a chain through the queue pair's verb: how many requests the
    /// device took (from the front of `wrs`), and the error if not all.
    pub(super) fn post_chain(&self, wrs: &mut [SendRequest<'_>]) -> (usize, Result<()>) {
        if self.inner.qpx.is_some() {
            return match self.post_send_ex_slice(wrs) {
                Ok(()) => (wrs.len(), Ok(())),
                Err(e) => (0, Err(e)),
            };
        }
        self.post_send_slice(wrs)
    }

    /// Posts one request of at most one buffer (or inline data) to a
    /// classic queue pair, its C request and SGE built on the stack; as
    /// [`post_request`](Self::post_request).
    #[inline]
    fn post_single(&self, r: &mut SendRequest<'_>) -> Result<()> {
        // Before the SGE is built: the checks refuse a region an SGE
        // cannot describe (`sge_prechecked` only debug-asserts it).
        if self.send_passes_fast(r) {
            debug_assert!(self.check_send(r, false).is_ok());
            // Its own copy: where the request was just built, its options
            // are known and the C request's fields are written directly.
            return self.post_checked(r);
        }
        self.check_send(r, false)?;
        self.post_checked_other(r)
    }

    /// [`post_checked`](Self::post_checked) for requests off the common
    /// case (out of line).
    #[inline(never)]
    fn post_checked_other(&self, r: &mut SendRequest<'_>) -> Result<()> {
        self.post_checked(r)
    }

    /// [`post_single`](Self::post_single) of a checked request.
    #[inline(always)]
    fn post_checked(&self, r: &mut SendRequest<'_>) -> Result<()> {
        let (mut sge, num_sge) = match (r.inline, &r.sg) {
            (Some(data), _) => (inline_sge(data), i32::from(!data.is_empty())),
            // An empty buffer goes as no SGE (see fill_sges).
            (None, SgList::One(b)) => (b.region().sge_prechecked(), i32::from(!b.is_empty())),
            // No buffer (a scatter list went the chain path).
            _ => (sys::ibv_sge::default(), 0),
        };
        // Built before the lock (its `wr_id` under it, below).
        let mut wr = std::mem::MaybeUninit::<sys::ibv_send_wr>::uninit();
        // SAFETY: `wr` is valid for writes.
        unsafe { write_send_wr(wr.as_mut_ptr(), r, 0, &mut sge, num_sge) };
        let table = &self.inner.send;
        let mut st = table.lock();
        // Refused here, not by the provider: see post_send_slice.
        self.check_sendable()?;
        table.check_room(&st, 1)?;
        // Doorbell first, bookkeeping after: the request goes out under
        // the slot's future tag and its buffers move into the slot once the
        // provider took it. The lock is held throughout, so a completion
        // (even one polled by another thread before this returns) can only
        // be claimed after the slot holds them; a refused request leaves
        // nothing to undo.
        // SAFETY: `wr` is valid for writes.
        unsafe {
            std::ptr::addr_of_mut!((*wr.as_mut_ptr()).wr_id).write(table.encode(st.next_tag(table)))
        };
        // Written by a provider that refuses the request, never read here.
        let mut bad = std::mem::MaybeUninit::<*mut sys::ibv_send_wr>::uninit();
        // The SGE points into the buffer `r` still owns: it moves into the
        // slot below without its memory moving and stays there until the
        // completion is claimed (inline data is copied during the call).
        // SAFETY: live QP; `wr` is one request (`next` NULL) with every
        // field its opcode has (write_send_wr), SGE as above.
        let rc = unsafe { self.provider_post_send(wr.as_mut_ptr(), bad.as_mut_ptr()) };
        if rc != 0 {
            return Err(crate::error::errno_error("ibv_post_send", rc));
        }
        let signaled = r.is_signaled() || self.inner.sq_sig_all;
        // The buffers and the address handle move into the slot.
        let payload = Payload::bufs(
            std::mem::take(&mut r.sg),
            r.ud.take().and_then(Dest::into_ah),
        );
        // Under the same lock: the tag `next_tag` gave.
        st.reserve_with(table, r.wr_id, payload, signaled, r.dispatched);
        Ok(())
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
        if let Err(e) = self.check_sendable() {
            return (0, Err(e));
        }
        if let Err(e) = table.check_room(&st, wrs.len()) {
            return (0, Err(e));
        }
        let n = wrs.len();
        // Reserve slots (payloads are moved in only once the device took them).
        let sig_all = self.inner.sq_sig_all;
        for (i, r) in wrs.iter().enumerate() {
            let signaled = r.is_signaled() || sig_all;
            let tag = st.reserve_as(table, r.wr_id, Payload::default(), signaled);
            if r.dispatched {
                st.dispatch(table, tag);
            }
            st.scratch.bufs().tags[i] = tag;
        }
        let scratch = st.scratch.bufs();
        let max_sge = scratch.max_sge;
        let wr_base = scratch.wrs.as_mut_ptr();
        for (i, r) in wrs.iter().enumerate() {
            let sges = &mut scratch.sges[i * max_sge..(i + 1) * max_sge];
            let num_sge = if let Some(data) = r.inline {
                sges[0] = inline_sge(data);
                usize::from(!data.is_empty())
            } else {
                fill_sges(&r.sg, sges)
            };
            let mut wr = c_send_wr(r);
            wr.wr_id = table.encode(scratch.tags[i]);
            wr.next = if i + 1 < n {
                // SAFETY: `i + 1 < n <= wrs.len()` (depth checked by check_room).
                unsafe { wr_base.add(i + 1) }
            } else {
                std::ptr::null_mut()
            };
            wr.sg_list = sges.as_mut_ptr();
            wr.num_sge = num_sge as i32;
            scratch.wrs[i] = wr;
        }
        let mut bad: *mut sys::ibv_send_wr = std::ptr::null_mut();
        // SAFETY: live QP; the chain lives in `scratch` (locked), its SGEs
        // point into buffers owned by `wrs` (moved into the slots below
        // before the lock is released, so no completion can be retired
        // first) or into inline data the provider copies during the call.
        let rc = unsafe { self.provider_post_send(wr_base, &mut bad) };
        let posted = posted_count(rc, wr_base, bad, n);
        for (i, r) in wrs.iter_mut().enumerate().take(posted) {
            let tag = st.scratch.bufs().tags[i];
            let payload = Payload::bufs(
                std::mem::take(&mut r.sg),
                r.ud.take().and_then(Dest::into_ah),
            );
            st.store(table, tag, payload);
        }
        for i in (posted..n).rev() {
            let tag = st.scratch.bufs().tags[i];
            st.unreserve(table, tag);
        }
        (posted, crate::error::ret_errno("ibv_post_send", rc))
    }
}

/// The SGE of inline data (the provider copies the bytes; no key).
fn inline_sge(data: &[u8]) -> sys::ibv_sge {
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
        #[cfg(ibverbs_flush)]
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
            #[cfg(ibverbs_flush)]
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
