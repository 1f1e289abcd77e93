//! Completion queues and polling.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use rdma_verbs_sys as sys;

use crate::cq::completion_channel::CompletionChannel;
use crate::cq::extended_cq::ExCq;
use crate::cq::work_completion::WorkCompletion;
use crate::device::context::Context;
use crate::device::event_routing::{AsyncEventReceiver, CqId, Kind, Registration};
use crate::error::{ret_count, ret_errno, ret_ptr, Result};
use crate::inflight::HeldMark;

mod accounting;
mod completion;
mod control;
mod polled;
use accounting::Accounting;
pub use completion::{Completion, Completions};
pub use polled::{CompletionRef, Polled};

/// CQ events are acknowledged in batches of this size (acking takes a lock
/// in libibverbs); the rest are acknowledged before the CQ is destroyed.
const ACK_BATCH: u32 = 64;

/// The provider's `poll_cq` (`ibv_context_ops::poll_cq`).
type PollCqFn = unsafe extern "C" fn(*mut sys::ibv_cq, i32, *mut sys::ibv_wc) -> i32;

/// A CQ's `poll_cq` while debts are unpaid (DESIGN.md, "A CQ holds a
/// completion of every request"): the provider's, and when it finds the CQ
/// empty, the debts recorded before it began are paid. Installed instead
/// of the provider's, so polls without debts pay nothing for them.
///
/// # Safety
/// As the provider's `poll_cq`, and `cq` must be a [`CqInner`]'s, polled
/// through a handle of it (its `cq_context` is that `CqInner`, alive).
unsafe extern "C" fn poll_cq_paying(cq: *mut sys::ibv_cq, n: i32, wc: *mut sys::ibv_wc) -> i32 {
    // SAFETY: the caller's contract: `cq_context` was set to the CqInner
    // (`finish`), which the polling handle keeps alive.
    let inner = unsafe { &*((*cq).cq_context as *const CqInner) };
    // Before the provider's poll (the Acquire pairs with the recording's
    // Release, after the reset or destroy returned): every completion these
    // debts stand for was queued before this poll began.
    let gen = inner.unpaid.load(Ordering::Acquire);
    // SAFETY: the caller's contract.
    let rc = unsafe { (inner.provider_poll_cq)(cq, n, wc) };
    if rc == 0 && gen != 0 {
        inner.pay(gen);
    }
    rc
}

/// What a context without a `poll_cq` gives (as `ibv_poll_cq` does).
unsafe extern "C" fn missing_poll_cq(_: *mut sys::ibv_cq, _: i32, _: *mut sys::ibv_wc) -> i32 {
    -libc::EOPNOTSUPP
}

pub(crate) struct CqInner {
    pub(crate) cq: NonNull<sys::ibv_cq>,
    /// The function every poll calls: the provider's `poll_cq`, or, while
    /// debts are unpaid, [`poll_cq_paying`] around it (a `PollCqFn`; the
    /// swap costs the polls nothing: one load either way). Written under
    /// `accounting`'s lock.
    poll_cq_fn: AtomicPtr<()>,
    /// The provider's `poll_cq`, read once from the context's ops at
    /// creation: the function the `ibv_poll_cq` inline of `verbs.h` calls
    /// on every poll (libibverbs sets a context's ops, a stub for every op
    /// the provider lacks, before `ibv_open_device` returns and never
    /// changes them).
    provider_poll_cq: PollCqFn,
    ctx: Context,
    pub(crate) channel: Option<CompletionChannel>,
    /// The depths of the queues reporting here, whose sum (with what
    /// destroyed queues may have left queued) never exceeds `cqe`, so the
    /// CQ cannot overrun. Polls never take it: only creating, resetting
    /// and destroying queues, `resize`, and paying debts.
    accounting: Mutex<Accounting>,
    /// The generation of the newest debt in `tables` (completions a reset
    /// or destroyed queue may have left queued), 0 when none is unpaid
    /// (see [`poll_cq_paying`]). Written under `accounting`'s lock.
    unpaid: AtomicU64,
    unacked: AtomicU32,
    /// The `cq_context` of the C CQ, a `Weak` to this value leaked by
    /// [`Weak::into_raw`], which [`CompletionChannel::get_event`] upgrades
    /// (and [`poll_cq_paying`] reads). Reclaimed once `ibv_destroy_cq`
    /// succeeded (leaked for good if it failed); see
    /// [`CqInner::from_event`].
    event_ctx: *const CqInner,
    /// The capacity (`ibv_cq::cqe`), which the depths in `accounting` never
    /// exceed. Written only with `accounting` locked (creation aside),
    /// by [`CompletionQueue::resize`] once the verb succeeded; read under
    /// that lock by `register`, and without it by `capacity`.
    cqe: AtomicU32,
    /// rxe writes the kernel's `IB_WC_WITH_INVALIDATE` (bit 2) into its
    /// user-mapped CQEs, where libibverbs reads bit 2 as `IP_CSUM_OK` and
    /// expects `IBV_WC_WITH_INV` in bit 3: receive completions of an rxe CQ
    /// get the bit moved (see [`fix_rxe_inv_flag`]).
    rxe_inv_quirk: bool,
    /// The extended-CQ polling functions when created with `ibv_create_cq_ex`.
    pub(crate) ex: Option<ExCq>,
    /// Its id for async events (event_routing.rs): registered at creation,
    /// leaves before the destroy.
    pub(crate) events: Registration,
}

/// Moves rxe's invalidate bit where libibverbs expects it (receive
/// completions only; rxe offers no checksum offload, so bit 2 on them is
/// never `IP_CSUM_OK`).
#[inline]
pub(crate) fn fix_rxe_inv_flag(wc: &mut sys::ibv_wc) {
    let csum = sys::ibv_wc_flags::IBV_WC_IP_CSUM_OK.0;
    if wc.wc_flags & csum != 0 && wc.opcode & sys::IBV_WC_RECV != 0 {
        wc.wc_flags = (wc.wc_flags & !csum) | sys::ibv_wc_flags::IBV_WC_WITH_INV.0;
    }
}

/// [`fix_rxe_inv_flag`] over a polled batch: one OR per entry finds
/// whether any has the bit (a receive with an invalidated key, on rxe),
/// and only then are the entries fixed.
#[inline(always)]
pub(crate) fn fix_rxe_inv_flags(wcs: &mut [sys::ibv_wc]) {
    let csum = sys::ibv_wc_flags::IBV_WC_IP_CSUM_OK.0;
    if wcs.iter().fold(0, |any, wc| any | wc.wc_flags) & csum != 0 {
        fix_rxe_inv_flags_found(wcs);
    }
}

/// [`fix_rxe_inv_flags`] once an entry has the bit.
#[cold]
#[inline(never)]
fn fix_rxe_inv_flags_found(wcs: &mut [sys::ibv_wc]) {
    wcs.iter_mut().for_each(fix_rxe_inv_flag);
}

// SAFETY: CQ verbs are thread-safe in libibverbs (polling is serialised by
// the provider's CQ lock); the accounting is behind a lock;
// `event_ctx` is only passed to `Weak::from_raw` (an atomic count).
unsafe impl Send for CqInner {}
// SAFETY: as above.
unsafe impl Sync for CqInner {}

impl CqInner {
    /// The CQ of a completion event: upgrades the `Weak` that
    /// [`CompletionQueueBuilder::build`] leaked into the C CQ's
    /// `cq_context`. `None` when the last handle is gone: the CQ is being
    /// destroyed, and its `ibv_destroy_cq` waits for this event's
    /// acknowledgement, which the caller must then give (with the `ibv_cq`
    /// pointer of the event, not through this value).
    ///
    /// Why the pointer is valid here (DESIGN.md, "Objects keep their
    /// parents alive"): the leaked `Weak` keeps the allocation, and it is
    /// reclaimed only in `Drop` after `ibv_destroy_cq` returned success.
    /// That call returns only once every event the kernel reported for the
    /// CQ (every one read from the channel, this one included) was
    /// acknowledged (`ibv_destroy_cq(3)`; libibverbs waits for
    /// `comp_events_completed` to reach the kernel's count), and unread
    /// events die with the CQ: no event read before the acknowledgement
    /// can name a freed `CqInner`.
    ///
    /// # Safety
    /// The caller must ensure that:
    /// * `cq_context` was returned by `ibv_get_cq_event` on a channel whose
    ///   CQs were all created by [`CompletionQueueBuilder`] (the
    ///   `cq_context` of each is such a `Weak`, or null without a channel);
    /// * that event is not yet acknowledged (nor counted by
    ///   [`add_unacked`](Self::add_unacked)).
    #[inline]
    pub(crate) unsafe fn from_event(cq_context: *mut std::ffi::c_void) -> Option<Arc<CqInner>> {
        if cq_context.is_null() {
            return None;
        }
        let ctx = cq_context as *const CqInner;
        // Not `from_raw` alone: `ManuallyDrop` leaves the leaked count with
        // the C CQ.
        // SAFETY: by the caller's contract `ctx` came from `Weak::into_raw`
        // of a `Weak<CqInner>` whose count is still leaked (reclaimed only
        // after ibv_destroy_cq, which waits for this event's ack).
        let weak = std::mem::ManuallyDrop::new(unsafe { Weak::from_raw(ctx) });
        weak.upgrade()
    }

    /// Debt `gen` was recorded (call with `accounting` locked): polls
    /// go through [`poll_cq_paying`] until it is paid.
    fn owe(&self, gen: u64) {
        self.unpaid.store(gen, Ordering::Release);
        self.poll_cq_fn
            .store(poll_cq_paying as PollCqFn as *mut (), Ordering::Release);
    }

    /// A poll that began after debt `gen` was recorded found the CQ empty:
    /// the completions every debt up to `gen` stood for (queued before it
    /// was recorded) have been polled, so they are paid. Reset queues get
    /// their held slots back; with no debt left, polls call the provider
    /// directly again.
    #[cold]
    #[inline(never)]
    fn pay(&self, gen: u64) {
        let mut accounting = self.accounting.lock();
        if !accounting.pay(gen) {
            self.unpaid.store(0, Ordering::Release);
            self.poll_cq_fn
                .store(self.provider_poll_cq as *mut (), Ordering::Release);
        }
    }

    pub(crate) fn add_unacked(&self) {
        let n = self.unacked.fetch_add(1, Ordering::AcqRel) + 1;
        if n >= ACK_BATCH {
            let n = self.unacked.swap(0, Ordering::AcqRel);
            if n > 0 {
                // SAFETY: live CQ; `n` events were received and not yet acked.
                unsafe { sys::ibv_ack_cq_events(self.cq.as_ptr(), n) };
            }
        }
    }
}

impl Drop for CqInner {
    fn drop(&mut self) {
        let n = self.unacked.swap(0, Ordering::AcqRel);
        if n > 0 {
            // SAFETY: every received event must be acked before destroy
            // (ibv_destroy_cq(3) would block forever otherwise).
            unsafe { sys::ibv_ack_cq_events(self.cq.as_ptr(), n) };
        }
        // Before the destroy: the address may be reused once it returns.
        self.events.leave();
        // SAFETY: last reference: every QP using this CQ holds a clone, so
        // all are destroyed. Errors cannot be reported from Drop.
        let rc = unsafe { sys::ibv_destroy_cq(self.cq.as_ptr()) };
        if let (0, Some(ch)) = (rc, &self.channel) {
            ch.detach_cq();
        }
        if rc == 0 {
            // The CQ is gone and with it every event that could name it
            // (see `from_event`): the count leaked into `cq_context` comes
            // back. If the destroy failed, the CQ and its `cq_context`
            // stay, and so does the count (a leak of this allocation).
            // SAFETY: `event_ctx` came from `Weak::into_raw` in `finish`
            // and is reclaimed only here, once.
            drop(unsafe { Weak::from_raw(self.event_ctx) });
        }
        let _ = &self.ctx;
    }
}

/// A completion queue (`struct ibv_cq`).
///
/// Cheap to clone. [`CompletionQueue::poll`] returns [`Completion`]s that
/// hand back the buffers of the completed work requests.
///
/// # References
/// `ibv_create_cq(3)`, `ibv_poll_cq(3)`
#[derive(Clone)]
pub struct CompletionQueue {
    pub(crate) inner: Arc<CqInner>,
}

/// Builder for a [`CompletionQueue`], from [`Context::create_cq`].
#[derive(Debug)]
#[must_use]
pub struct CompletionQueueBuilder<'a> {
    ctx: &'a Context,
    cqe: u32,
    channel: Option<&'a CompletionChannel>,
    comp_vector: i32,
    pub(crate) wc_fields: Option<crate::cq::extended_cq::CompletionFields>,
}

impl<'a> CompletionQueueBuilder<'a> {
    /// Delivers completion events to `channel` (see [`CompletionQueue::req_notify`]).
    pub fn channel(mut self, channel: &'a CompletionChannel) -> Self {
        self.channel = Some(channel);
        self
    }
    /// Completion vector (interrupt) to use; 0 by default. Valid values
    /// are `0..`[`Context::num_comp_vectors`]; `build` fails with `EINVAL`
    /// for others (the kernel checks; the message says why).
    pub fn comp_vector(mut self, v: i32) -> Self {
        self.comp_vector = v;
        self
    }
    /// Creates the CQ.
    ///
    /// # Errors
    /// [`Error::Verb`](crate::Error::Verb) naming `ibv_create_cq` (or
    /// `ibv_create_cq_ex` with [`wc_fields`](Self::wc_fields)), e.g.
    /// `EINVAL` when `cqe` exceeds the device's `max_cqe` or the
    /// completion vector is not below [`Context::num_comp_vectors`]; the
    /// message says which.
    ///
    /// # References
    /// `ibv_create_cq(3)`
    #[doc(alias = "ibv_create_cq")]
    pub fn build(self) -> Result<CompletionQueue> {
        let ch = self.channel.map_or(std::ptr::null_mut(), |c| c.as_ptr());
        // rxe's provider quirks (see CqInner::rxe) are decided once, here.
        let rxe = self.ctx.is_rxe();
        if let Some(fields) = self.wc_fields {
            let (cq, ex) = crate::cq::extended_cq::create(
                self.ctx,
                self.cqe,
                ch,
                self.comp_vector,
                fields,
                rxe,
            )?;
            return Ok(self.finish(cq, Some(ex), rxe));
        }
        // SAFETY: live context and channel; the CQ is destroyed in CqInner's Drop.
        let cq = unsafe {
            sys::ibv_create_cq(
                self.ctx.as_ptr(),
                self.cqe as i32,
                std::ptr::null_mut(),
                ch,
                self.comp_vector,
            )
        };
        let cq = ret_ptr("ibv_create_cq", cq)
            .map_err(|e| e.with_hint(create_hint(self.ctx, self.cqe, self.comp_vector)))?;
        Ok(self.finish(cq, None, rxe))
    }

    fn finish(self, cq: NonNull<sys::ibv_cq>, ex: Option<ExCq>, rxe: bool) -> CompletionQueue {
        // SAFETY: valid CQ; `cqe` is the actual size the provider chose.
        let cqe = unsafe { (*cq.as_ptr()).cqe } as u32;
        // SAFETY: a live CQ points at its live context.
        let provider_poll_cq =
            unsafe { (*(*cq.as_ptr()).context).ops.poll_cq }.unwrap_or(missing_poll_cq);
        let inner = Arc::new_cyclic(|weak| {
            let event_ctx = Weak::into_raw(weak.clone());
            // Written before the handle exists: no event or poll can name
            // the CQ before.
            // SAFETY: valid CQ, not yet shared; libibverbs only hands
            // `cq_context` back from ibv_get_cq_event.
            unsafe { (*cq.as_ptr()).cq_context = event_ctx as *mut std::ffi::c_void };
            CqInner {
                cq,
                poll_cq_fn: AtomicPtr::new(provider_poll_cq as *mut ()),
                provider_poll_cq,
                ctx: self.ctx.clone(),
                channel: self.channel.map(CompletionChannel::attach_cq),
                accounting: Mutex::new(Accounting::default()),
                unpaid: AtomicU64::new(0),
                unacked: AtomicU32::new(0),
                event_ctx,
                cqe: AtomicU32::new(cqe),
                rxe_inv_quirk: rxe,
                ex,
                events: Registration::new(Kind::Cq, cq.as_ptr()),
            }
        });
        CompletionQueue { inner }
    }
}

/// Why `ibv_create_cq`/`ibv_create_cq_ex` may have refused (`EINVAL`): a
/// size past `max_cqe` or a completion vector past `num_comp_vectors`.
/// Only read after a failure, so never on a path that succeeds.
pub(crate) fn create_hint(ctx: &Context, cqe: u32, comp_vector: i32) -> Option<String> {
    let max = ctx.query_device().map_or(u32::MAX, |d| d.max_cqe());
    if cqe > max {
        return Some(format!("cqe {cqe} exceeds the device's max_cqe {max}"));
    }
    let vectors = ctx.num_comp_vectors();
    (u32::try_from(comp_vector).map_or(true, |v| v >= vectors)).then(|| {
        format!("comp_vector {comp_vector} is not below the device's num_comp_vectors {vectors}")
    })
}

impl CompletionQueue {
    /// Actual capacity (may exceed the requested size); changed by
    /// [`resize`](Self::resize).
    pub fn capacity(&self) -> u32 {
        self.inner.cqe.load(Ordering::Relaxed)
    }

    /// The raw CQ pointer, valid while `self` lives. Its `cq_context`
    /// belongs to the library (with a channel,
    /// [`CompletionChannel::get_event`] reads it as its own): code that
    /// writes through the pointer must leave it unchanged.
    pub fn as_ptr(&self) -> *mut sys::ibv_cq {
        self.inner.cq.as_ptr()
    }

    /// `ibv_poll_cq(cq, n, wc)` through the provider's `poll_cq` resolved
    /// at creation (see `CqInner::poll_cq_fn`).
    ///
    /// # Safety
    /// As `ibv_poll_cq(3)`: the caller must ensure that `wc` is valid for
    /// `n` writes.
    #[inline(always)]
    unsafe fn provider_poll(&self, n: i32, wc: *mut sys::ibv_wc) -> i32 {
        let f = self.inner.poll_cq_fn.load(Ordering::Relaxed);
        // SAFETY: `poll_cq_fn` only ever holds a `PollCqFn`.
        let f: PollCqFn = unsafe { std::mem::transmute::<*mut (), PollCqFn>(f) };
        // SAFETY: live CQ; the rest is the caller's contract (and
        // `poll_cq_paying`'s: called here, with a handle held).
        unsafe { f(self.as_ptr(), n, wc) }
    }

    /// The channel it reports events to.
    pub fn channel(&self) -> Option<&CompletionChannel> {
        self.inner.channel.as_ref()
    }

    /// Lets queue `id`, `depth` requests deep, report here. An overrun CQ
    /// loses completions, and with them buffers, so the depths of the
    /// queues reporting here (and what destroyed ones may have left
    /// queued) may not add up to more than the capacity. A queue already
    /// reporting here (an SRQ shared by several queue pairs) counts once.
    ///
    /// # Errors
    /// [`Error::CqTooSmall`](crate::Error::CqTooSmall); nothing registered.
    pub(crate) fn register(&self, id: u32, depth: u32) -> Result<()> {
        let mut accounting = self.inner.accounting.lock();
        if accounting.contains(id) {
            return Ok(());
        }
        let owed = accounting.owed();
        let needed = cq_needed(accounting.depth_sum() + owed, depth);
        // Under the lock: `resize` cannot change it meanwhile.
        let capacity = self.inner.cqe.load(Ordering::Relaxed);
        if needed > u64::from(capacity) {
            return Err(crate::error::Error::CqTooSmall {
                capacity,
                needed,
                owed,
            });
        }
        accounting.insert(id, depth);
        Ok(())
    }

    /// Stops queue `id` from reporting here: its completions still in the
    /// CQ become orphans, and up to `queued` of them are charged to the CQ
    /// until a poll finds it empty.
    pub(crate) fn unregister(&self, id: u32, queued: u32) {
        let mut accounting = self.inner.accounting.lock();
        accounting.remove(id);
        if let Some(gen) = accounting.owe(None, queued) {
            self.inner.owe(gen);
        }
    }

    /// Records that a reset ring holds `held` slots (`mark`) for
    /// completions the reset may have left here, until a poll finds the CQ
    /// empty.
    pub(crate) fn owe_after_reset(&self, mark: HeldMark, held: u32) {
        let mut accounting = self.inner.accounting.lock();
        if let Some(gen) = accounting.owe(Some(mark), held) {
            self.inner.owe(gen);
        }
    }

    /// The debts a poll may pay if it finds the CQ empty: those recorded
    /// before it began (the `Acquire` pairs with the recording's
    /// `Release`, which follows the reset or destroy that returned); 0 for
    /// none.
    #[inline(always)]
    pub(crate) fn debts_before_poll(&self) -> u64 {
        self.inner.unpaid.load(Ordering::Acquire)
    }

    /// See [`CqInner::pay`].
    #[cold]
    pub(crate) fn pay(&self, gen: u64) {
        if gen != 0 {
            self.inner.pay(gen);
        }
    }

    /// Polls up to `out`'s capacity of completions and lends them out: a
    /// [`Polled`] batch, walked in order, each [`CompletionRef`] claimed
    /// from the in-flight store as the walk reaches it, its request's
    /// buffers taken straight out of the request's slot. Does not allocate.
    ///
    /// Several threads may poll one CQ at once, each into its own
    /// `Completions`. A CQ created with
    /// [`wc_fields`](crate::cq::CompletionQueueBuilder::wc_fields) is polled
    /// through `ibv_start_poll` … `ibv_end_poll`, reading only the fields it
    /// was created with (the others read as 0) and the completion timestamp
    /// when asked for; any other through `ibv_poll_cq`. On rxe an extended
    /// CQ yields one completion per poll cycle (see the provider quirk in
    /// `extended_cq`'s module docs).
    ///
    /// # Errors
    /// [`Error::Verb`](crate::Error::Verb) naming `ibv_poll_cq`,
    /// `ibv_start_poll` or `ibv_next_poll`.
    ///
    /// # References
    /// `ibv_poll_cq(3)`, `ibv_create_cq_ex(3)`
    ///
    /// # Example
    /// ```no_run
    /// # fn demo(cq: &rdma_verbs::CompletionQueue) -> rdma_verbs::Result<()> {
    /// let mut done = rdma_verbs::Completions::with_capacity(16);
    /// for mut c in cq.poll(&mut done)? {
    ///     c.result()?;
    ///     let _buf = c.take_local();
    /// }
    /// # Ok(()) }
    /// ```
    #[doc(alias = "ibv_poll_cq")]
    #[doc(alias = "ibv_start_poll")]
    #[doc(alias = "ibv_next_poll")]
    #[doc(alias = "ibv_end_poll")]
    #[inline(always)]
    pub fn poll<'a>(&self, out: &'a mut Completions) -> Result<Polled<'a>> {
        let n = self.fill(out)?;
        Ok(self.lend(out, n))
    }

    /// The provider's entries written into `out` (none claimed yet): how
    /// many.
    #[inline(always)]
    fn fill(&self, out: &mut Completions) -> Result<usize> {
        if let Some(ex) = &self.inner.ex {
            return self.poll_extended(ex, out);
        }
        let len = out.raw.len().min(i32::MAX as usize);
        // SAFETY: live CQ; `out.raw` has at least `len` writable entries.
        let n = unsafe { self.provider_poll(len as i32, out.raw.as_mut_ptr()) };
        if n >= 0 {
            return Ok(n as usize);
        }
        ret_count("ibv_poll_cq", n)
    }

    /// The first `n` entries of `out`, lent out to be claimed.
    #[inline(always)]
    fn lend<'a>(&self, out: &'a mut Completions, n: usize) -> Polled<'a> {
        let stamps = match &self.inner.ex {
            Some(ex) if ex.ts.is_some() => Some(&out.stamps[..n]),
            _ => None,
        };
        Polled::new(&mut out.raw[..n], stamps, self.inner.rxe_inv_quirk)
    }

    /// Polls at most one completion and returns it, owned: the lean form
    /// of [`poll`](Self::poll) for loops that wait for one request at a
    /// time. An empty classic CQ costs one `ibv_poll_cq` call.
    ///
    /// # Errors
    /// As [`poll`](Self::poll).
    ///
    /// # References
    /// `ibv_poll_cq(3)`
    ///
    /// # Example
    /// ```no_run
    /// # fn demo(cq: &rdma_verbs::CompletionQueue) -> rdma_verbs::Result<()> {
    /// let c = loop {
    ///     if let Some(c) = cq.poll_one()? {
    ///         break c;
    ///     }
    /// };
    /// c.result()?;
    /// # Ok(()) }
    /// ```
    #[doc(alias = "ibv_poll_cq")]
    #[inline]
    pub fn poll_one(&self) -> Result<Option<Completion>> {
        if let Some(ex) = &self.inner.ex {
            return self.poll_one_extended(ex);
        }
        let mut wc = std::mem::MaybeUninit::<sys::ibv_wc>::uninit();
        // SAFETY: live CQ; `wc` has room for the one entry asked for.
        let n = unsafe { self.provider_poll(1, wc.as_mut_ptr()) };
        if n == 0 {
            return Ok(None);
        }
        ret_count("ibv_poll_cq", n)?;
        // SAFETY: the provider reported one entry, so it wrote `wc` whole.
        let mut wc = unsafe { wc.assume_init() };
        Ok(Some(self.complete_one(&mut wc, None)))
    }

    /// The owned [`Completion`] of one raw entry just polled.
    #[inline]
    pub(crate) fn complete_one(&self, wc: &mut sys::ibv_wc, stamp: Option<u64>) -> Completion {
        let one = std::slice::from_mut(wc);
        let c = Polled::new(one, None, self.inner.rxe_inv_quirk)
            .next()
            .expect("one entry");
        let mut c = c.into_owned();
        if let Some(t) = stamp {
            c.set_timestamp(t);
        }
        c
    }

    /// Polls raw work completions, bypassing the buffer bookkeeping: the
    /// polling half of the raw path
    /// ([`QueuePair::post_send_raw`](crate::QueuePair::post_send_raw),
    /// [`post_recv_raw`](crate::QueuePair::post_recv_raw)). No checks, no
    /// lookup: each entry is the provider's (with rxe's invalidate flag
    /// fixed), `wr_id` included.
    ///
    /// # Safety
    /// The caller must ensure that:
    /// * no request posted through the safe API (a posting handle, a
    ///   prepared request, a memory-window bind, an async future) can
    ///   complete on this CQ while it is polled here — in practice, every
    ///   queue reporting to it is posted to only through the raw path —
    ///   since a safe request's completion consumed here is never claimed:
    ///   its buffers stay in its slot until its queue is destroyed or
    ///   reset, and the slot stays taken (the queue fills up);
    /// * every completion returned is treated as the completion of the raw
    ///   request its `wr_id` names (the buffers of that request are the
    ///   caller's again only from here, per the raw posting contract).
    ///
    /// # Errors
    /// [`Error::Verb`](crate::Error::Verb) naming `ibv_poll_cq`.
    ///
    /// # References
    /// `ibv_poll_cq(3)`
    #[doc(alias = "ibv_poll_cq")]
    #[inline]
    pub unsafe fn poll_raw(&self, out: &mut [WorkCompletion]) -> Result<usize> {
        // SAFETY: live CQ; WorkCompletion is repr(transparent) over ibv_wc
        // and `out` has `len` writable entries.
        let n = unsafe {
            self.provider_poll(
                out.len().min(i32::MAX as usize) as i32,
                out.as_mut_ptr().cast(),
            )
        };
        let n = ret_count("ibv_poll_cq", n)?;
        if self.inner.rxe_inv_quirk {
            fix_rxe_inv_flags(WorkCompletion::raw_slice_mut(&mut out[..n]));
        }
        Ok(n)
    }

    /// Requests a completion event on the CQ's channel for the next
    /// completion (or, with `solicited_only`, the next solicited or error
    /// completion). Re-arm after every event.
    ///
    /// # Errors
    /// [`Error::Verb`](crate::Error::Verb) naming `ibv_req_notify_cq`.
    ///
    /// # References
    /// `ibv_req_notify_cq(3)`
    #[doc(alias = "ibv_req_notify_cq")]
    pub fn req_notify(&self, solicited_only: bool) -> Result<()> {
        // SAFETY: live CQ.
        let rc = unsafe { sys::ibv_req_notify_cq(self.as_ptr(), i32::from(solicited_only)) };
        ret_errno("ibv_req_notify_cq", rc)
    }

    /// Waits until the CQ has completions and polls them (as
    /// [`poll`](Self::poll) does); an empty batch when `timeout` passed
    /// first (`None`: no limit).
    ///
    /// With completions waiting this is one poll. Otherwise the CQ is
    /// armed (`ibv_req_notify_cq`) and polled again — a completion that
    /// arrived between the first poll and the arming raises no event; the
    /// second poll finds it — and the thread sleeps in `ppoll(2)` on the
    /// channel's descriptor until an event or the deadline. It reads the
    /// event (counted: events are acknowledged in batches, and all of them
    /// before the CQ is destroyed) and starts over: re-arm, poll, sleep.
    /// So it returns before the deadline only with completions, whoever
    /// else polls the CQ, and never spins: each round sleeps, or reads an
    /// event that one arming raised. One thread sleeps per channel at a
    /// time; other waiters queue behind it (until their own deadline, then
    /// poll once more) and poll when it returns, so completions its batch
    /// had no room for are not left behind waiting for an event that
    /// already came.
    ///
    /// The CQ needs a completion channel of its own
    /// ([`CompletionQueueBuilder::channel`]): the kernel delivers each
    /// event once, and an event read here for another CQ would be lost to
    /// whoever waits for that one. The first wait makes the channel
    /// non-blocking, so that reading an event cannot block past the
    /// deadline ([`CompletionChannel::get_event`] on it then returns
    /// `EAGAIN` instead of blocking). Its events are the wait's: one read
    /// elsewhere (`get_event`, `rdma-verbs-tokio`'s `AsyncQueuePair` on the channel, the C
    /// API) may leave a wait asleep until its deadline, never past it. The
    /// CQ is left armed; the next wait reads the event that raises.
    ///
    /// # Errors
    /// [`Error::NoCompletionChannel`](crate::Error::NoCompletionChannel)
    /// for a CQ created without a channel;
    /// [`Error::CompletionChannelShared`](crate::Error::CompletionChannelShared)
    /// when other CQs report to its channel (checked before sleeping, and
    /// when it reads an event for another CQ); [`Error::Verb`](crate::Error::Verb)
    /// naming `ibv_poll_cq`, `ibv_req_notify_cq`, `ibv_get_cq_event`,
    /// `fcntl` or `ppoll`.
    ///
    /// # References
    /// `ibv_req_notify_cq(3)`, `ibv_get_cq_event(3)`, `ibv_ack_cq_events(3)`,
    /// `poll(2)`
    ///
    /// # Example
    /// ```no_run
    /// # fn demo(ctx: &rdma_verbs::Context) -> rdma_verbs::Result<()> {
    /// use std::time::Duration;
    ///
    /// let channel = ctx.create_comp_channel()?;
    /// let cq = ctx.create_cq(64).channel(&channel).build()?;
    /// let mut completions = rdma_verbs::Completions::with_capacity(16);
    /// // ... post work requests on queue pairs reporting to `cq` ...
    /// let done = cq.wait(&mut completions, Some(Duration::from_secs(1)))?;
    /// if done.is_empty() {
    ///     println!("nothing completed within a second");
    /// }
    /// for c in done {
    ///     c.result()?;
    /// }
    /// # Ok(()) }
    /// ```
    pub fn wait<'a>(
        &self,
        out: &'a mut Completions,
        timeout: Option<std::time::Duration>,
    ) -> Result<Polled<'a>> {
        let n = self.fill(out)?;
        if n > 0 {
            return Ok(self.lend(out, n));
        }
        let ch = self
            .channel()
            .ok_or(crate::error::Error::NoCompletionChannel {
                which: "CQ waited on",
            })?;
        let cqs = ch.cq_count();
        if cqs > 1 {
            return Err(crate::error::Error::CompletionChannelShared { cqs });
        }
        // A deadline past what `Instant` holds is as good as none.
        let deadline = timeout.and_then(|t| std::time::Instant::now().checked_add(t));
        let _sleeper = match deadline {
            None => ch.sleeper().lock(),
            Some(d) => match ch.sleeper().try_lock_until(d) {
                Some(guard) => guard,
                // The sleeper armed and polled after this thread's poll
                // and is still asleep, or about to return what woke it.
                None => return self.poll(out),
            },
        };
        ch.ensure_nonblocking()?;
        loop {
            self.req_notify(false)?;
            // After arming: whatever completes from here on raises an
            // event, whatever completed before is found now.
            let n = self.fill(out)?;
            if n > 0 {
                return Ok(self.lend(out, n));
            }
            let left = match deadline {
                None => None,
                Some(d) => match d.checked_duration_since(std::time::Instant::now()) {
                    Some(left) if !left.is_zero() => Some(left),
                    _ => return Ok(Polled::none()),
                },
            };
            if !ch.sleep(left)? {
                continue;
            }
            // One event per wake-up: every arming raises at most one, so
            // events left by earlier arming are used up as well.
            match ch.get_event() {
                Ok(Some(cq)) if Arc::ptr_eq(&cq.inner, &self.inner) => {}
                Ok(Some(_)) => {
                    return Err(crate::error::Error::CompletionChannelShared { cqs: ch.cq_count() })
                }
                // An event of a CQ being destroyed (acknowledged), or one
                // read elsewhere first.
                Ok(None) => {}
                Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// The context.
    pub fn context(&self) -> &Context {
        &self.inner.ctx
    }
}

impl Context {
    /// Starts building a completion queue with room for at least `cqe`
    /// completions: options are the builder's setters, and
    /// [`build`](CompletionQueueBuilder::build) creates it.
    ///
    /// # Example
    /// ```no_run
    /// # fn demo(ctx: &rdma_verbs::Context) -> rdma_verbs::Result<()> {
    /// let channel = ctx.create_comp_channel()?;
    /// let cq = ctx.create_cq(256).channel(&channel).build()?;
    /// # Ok(()) }
    /// ```
    ///
    /// # References
    /// `ibv_create_cq(3)`
    pub fn create_cq(&self, cqe: u32) -> CompletionQueueBuilder<'_> {
        CompletionQueueBuilder {
            ctx: self,
            cqe,
            channel: None,
            comp_vector: 0,
            wc_fields: None,
        }
    }
}

impl std::fmt::Debug for CompletionQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompletionQueue")
            .field("capacity", &self.capacity())
            .finish()
    }
}

/// The completions a CQ must hold for queues whose depths add up to
/// `registered` and one more of `depth`.
fn cq_needed(registered: u64, depth: u32) -> u64 {
    registered + u64::from(depth)
}

impl CompletionQueue {
    /// This CQ's identity in its asynchronous events ([`AsyncElement::Cq`](crate::device::AsyncElement::Cq)).
    pub fn id(&self) -> CqId {
        crate::device::event_routing::cq_id(self.inner.events.id())
    }

    /// Subscribes to this CQ's asynchronous events (`CQ_ERR`: an overrun
    /// or a device error), as routed by [`Context::route_async_event`].
    ///
    /// # References
    /// `ibv_get_async_event(3)`
    pub fn async_events(&self) -> AsyncEventReceiver {
        self.inner.events.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::cq_needed;

    #[test]
    fn cq_needs_the_sum_of_the_depths_reporting_to_it() {
        assert_eq!(cq_needed(0, 127), 127);
        assert_eq!(cq_needed(127 + 127, 63), 317);
        // No overflow with the largest depths.
        assert_eq!(
            cq_needed(2 * u64::from(u32::MAX), u32::MAX),
            3 * u64::from(u32::MAX)
        );
    }
}

#[cfg(test)]
mod quirk_tests {
    use super::*;

    #[test]
    fn rxe_invalidate_bit_moves_on_receives_only() {
        let csum = sys::ibv_wc_flags::IBV_WC_IP_CSUM_OK.0;
        let inv = sys::ibv_wc_flags::IBV_WC_WITH_INV.0;
        let grh = sys::ibv_wc_flags::IBV_WC_GRH.0;
        let mut wc = sys::ibv_wc {
            opcode: sys::IBV_WC_RECV,
            wc_flags: csum | grh,
            ..Default::default()
        };
        fix_rxe_inv_flag(&mut wc);
        assert_eq!(wc.wc_flags, inv | grh);
        let mut send = sys::ibv_wc {
            opcode: sys::IBV_WC_SEND,
            wc_flags: csum,
            ..Default::default()
        };
        fix_rxe_inv_flag(&mut send);
        assert_eq!(send.wc_flags, csum, "send completions are left alone");
    }

    #[test]
    fn a_batch_is_fixed_as_each_entry_would_be() {
        let csum = sys::ibv_wc_flags::IBV_WC_IP_CSUM_OK.0;
        let grh = sys::ibv_wc_flags::IBV_WC_GRH.0;
        let entry = |opcode, wc_flags| sys::ibv_wc {
            opcode,
            wc_flags,
            ..Default::default()
        };
        let mut batch = [
            entry(sys::IBV_WC_SEND, 0),
            entry(sys::IBV_WC_RECV, grh),
            entry(sys::IBV_WC_RECV, csum),
            entry(sys::IBV_WC_SEND, csum),
            entry(sys::IBV_WC_RECV_RDMA_WITH_IMM, csum | grh),
        ];
        let mut one_by_one = batch;
        one_by_one.iter_mut().for_each(fix_rxe_inv_flag);
        fix_rxe_inv_flags(&mut batch);
        let flags = |b: &[sys::ibv_wc]| b.iter().map(|w| w.wc_flags).collect::<Vec<_>>();
        assert_eq!(flags(&batch), flags(&one_by_one));
        assert_ne!(batch[2].wc_flags, csum, "the receive was fixed");
        // Nothing to fix: nothing changes.
        let mut clean = [entry(sys::IBV_WC_RECV, grh), entry(sys::IBV_WC_SEND, 0)];
        fix_rxe_inv_flags(&mut clean);
        assert_eq!(flags(&clean), [grh, 0]);
    }
}
