//! A poll's completions, borrowed: each is claimed from the in-flight
//! store as the walk reaches it, and its buffers are taken straight out of
//! the request's slot (DESIGN.md, "Polling").

use ibverbs_sys as sys;

use crate::buffer::{Buf, SgList};
use crate::error::Result;
use crate::gid::Gid;
use crate::inflight::{self, Claim, Held};
use crate::work_completion::WorkCompletion;

use super::completion::{sg_take_one_if, source_gid_of, Completion};
use super::fix_rxe_inv_flag;

/// The completions one poll returned, in order: an iterator of
/// [`CompletionRef`]s. Each is claimed when the walk reaches it; dropping
/// the batch claims what was not reached and drops it, buffers included.
///
/// Several threads may poll one CQ at once, each with its own
/// [`Completions`](crate::Completions): every completion reaches one of
/// them, and its buffers only that one.
pub struct Polled<'a> {
    wcs: std::slice::IterMut<'a, sys::ibv_wc>,
    /// The next entry's timestamp, when the CQ reads them (one per entry
    /// from here on); [`NO_STAMP`] when it does not.
    stamps: *const u64,
    /// 1 with timestamps, 0 without: the walk moves `stamps` without a
    /// branch.
    stride: usize,
    rxe: bool,
    _stamps: std::marker::PhantomData<&'a [u64]>,
}

/// Where a [`CompletionRef`] without a timestamp points.
static NO_STAMP: u64 = 0;

/// A [`CompletionRef`]'s owner when no request matched (an orphan).
const ORPHAN: u8 = u8::MAX;

// SAFETY: `stamps` is a shared borrow of `[u64]` (Sync) for 'a.
unsafe impl Send for Polled<'_> {}
// SAFETY: as above; `&Polled` reads nothing through it.
unsafe impl Sync for Polled<'_> {}

impl<'a> Polled<'a> {
    pub(super) fn new(wcs: &'a mut [sys::ibv_wc], stamps: Option<&'a [u64]>, rxe: bool) -> Self {
        let (stamps, stride) = match stamps {
            Some(s) => {
                // Both sliced to the same count by `lend`: never fails.
                assert!(s.len() >= wcs.len(), "a timestamp per entry");
                (s.as_ptr(), 1)
            }
            None => (&raw const NO_STAMP, 0),
        };
        Polled {
            wcs: wcs.iter_mut(),
            stamps,
            stride,
            rxe,
            _stamps: std::marker::PhantomData,
        }
    }

    /// Nothing polled.
    pub(super) fn none() -> Polled<'static> {
        Polled {
            wcs: [].iter_mut(),
            stamps: &raw const NO_STAMP,
            stride: 0,
            rxe: false,
            _stamps: std::marker::PhantomData,
        }
    }

    /// Completions not yet reached.
    #[inline]
    pub fn len(&self) -> usize {
        self.wcs.len()
    }

    /// Whether none is left.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.wcs.len() == 0
    }
}

impl<'a> Iterator for Polled<'a> {
    type Item = CompletionRef<'a>;

    #[inline(always)]
    fn next(&mut self) -> Option<CompletionRef<'a>> {
        let wc = self.wcs.next()?;
        // This entry's timestamp (one per entry, `new`), or NO_STAMP
        // (stride 0): inside the borrowed slice or the static.
        let stamp = self.stamps;
        self.stamps = self.stamps.wrapping_add(self.stride);
        if self.rxe {
            fix_rxe_inv_flag(wc);
        }
        let (claim, owner) = match inflight::claim(wc.wr_id) {
            None => (None, ORPHAN),
            Some(mut c) => {
                wc.wr_id = c.user();
                let owner = c.owner();
                if c.has_extras() {
                    c = settle(c, wc.status);
                }
                // Nothing to take (a prepared posting, inline data): the
                // slot is free again at once, for a post in this walk.
                (if c.holds_nothing() { None } else { Some(c) }, owner)
            }
        };
        Some(CompletionRef {
            wc: WorkCompletion::from_raw_ref(wc),
            claim,
            owner,
            stamp,
            _stamp: std::marker::PhantomData,
        })
    }

    #[inline]
    fn size_hint(&self) -> (usize, Option<usize>) {
        self.wcs.size_hint()
    }
}

impl ExactSizeIterator for Polled<'_> {}

impl std::fmt::Debug for Polled<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Polled").field("left", &self.len()).finish()
    }
}

impl Drop for Polled<'_> {
    #[inline]
    fn drop(&mut self) {
        // Fully walked (the common case): one comparison.
        if self.wcs.len() != 0 {
            // By value: the batch's address never escapes, so a walk
            // keeps it in registers.
            drop_rest(Polled {
                wcs: std::mem::take(&mut self.wcs),
                ..*self
            });
        }
    }
}

/// What the walk did not reach: claimed and dropped.
#[cold]
#[inline(never)]
fn drop_rest(mut rest: Polled<'_>) {
    for _ in rest.by_ref() {}
}

/// What a claimed request kept alive besides its buffers: its address
/// handle goes, and a memory window learns how its bind or invalidate
/// ended (its regions are released only on success).
#[cold]
#[inline(never)]
fn settle(mut c: Claim, status: u32) -> Claim {
    let p = c.payload();
    drop(p.ah.take());
    if let Held::Window(_) = p.held {
        if let Held::Window(op) = std::mem::take(&mut p.held) {
            op.complete(status);
        }
    }
    c.extras_settled();
    c
}

/// One completion of a [`Polled`] batch: the entry (its `wr_id` the
/// caller's), with the buffers of its request still in the request's slot
/// until taken. The slot is free again as soon as nothing is left in it
/// (at once for a request without buffers; when they are taken
/// otherwise), so the next post of a queue as deep as its outstanding
/// requests may come inside the walk. Dropping it drops what was not taken
/// and frees the slot; [`into_owned`](Self::into_owned) keeps it as a
/// [`Completion`].
pub struct CompletionRef<'a> {
    wc: &'a WorkCompletion,
    /// The request's slot, while it still holds buffers.
    claim: Option<Claim>,
    /// Who posted it; [`ORPHAN`] when nobody did.
    owner: u8,
    /// Its timestamp, or [`NO_STAMP`].
    stamp: *const u64,
    _stamp: std::marker::PhantomData<&'a u64>,
}

// SAFETY: `stamp` is a shared borrow of a `u64` (Sync) for 'a.
unsafe impl Send for CompletionRef<'_> {}
// SAFETY: as above.
unsafe impl Sync for CompletionRef<'_> {}

impl std::ops::Deref for CompletionRef<'_> {
    type Target = WorkCompletion;
    #[inline(always)]
    fn deref(&self) -> &WorkCompletion {
        self.wc
    }
}

impl CompletionRef<'_> {
    /// The `wr_id` given when posting.
    #[inline(always)]
    pub fn wr_id(&self) -> u64 {
        self.wc.raw.wr_id
    }

    /// The raw work completion.
    #[inline]
    pub fn wc(&self) -> &WorkCompletion {
        self.wc
    }

    /// Whether no request posted through the safe API matched (a raw
    /// request's, or a stale one of a destroyed or reset queue).
    #[inline]
    pub fn is_orphan(&self) -> bool {
        self.owner == ORPHAN
    }

    /// Who posted the request (0: the caller); `None` for an orphan.
    #[inline]
    pub(crate) fn owner(&self) -> Option<u8> {
        (self.owner != ORPHAN).then_some(self.owner)
    }

    /// Frees the slot once nothing is left in it.
    #[inline(always)]
    fn release_if_empty(&mut self) {
        if self.claim.as_mut().is_some_and(Claim::is_empty) {
            self.claim = None;
        }
    }

    /// The completion timestamp, when the CQ reads it (see
    /// [`Completion::timestamp`]).
    #[inline]
    pub fn timestamp(&self) -> Option<u64> {
        // SAFETY: `stamp` borrows the batch's timestamp or the static.
        (!std::ptr::eq(self.stamp, &raw const NO_STAMP)).then(|| unsafe { *self.stamp })
    }

    /// `Ok(())` on success, else
    /// [`Error::WorkCompletion`](crate::Error::WorkCompletion) with the
    /// caller's `wr_id`.
    ///
    /// # Errors
    /// [`Error::WorkCompletion`](crate::Error::WorkCompletion).
    #[inline(always)]
    pub fn result(&self) -> Result<()> {
        self.wc.result()
    }

    /// The buffers still in the slot.
    #[inline(always)]
    fn sg(&mut self) -> Option<&mut SgList> {
        match &mut self.claim.as_mut()?.payload().held {
            Held::Sg(sg) => Some(sg),
            Held::Window(_) => None,
        }
    }

    /// Takes the request's buffers (all of them).
    pub fn take_buffers(&mut self) -> SgList {
        let sg = self.sg().map(std::mem::take).unwrap_or_default();
        self.release_if_empty();
        sg
    }

    /// Takes the buffer back when the request had exactly one; `None`
    /// otherwise, the buffers left for [`take_buffers`](Self::take_buffers).
    pub fn take_buf(&mut self) -> Option<Buf> {
        let b = sg_take_one_if(self.sg()?, |_| true);
        self.release_if_empty();
        b
    }

    /// Takes the buffer back as a [`LocalBuffer`](crate::LocalBuffer) when
    /// the request had exactly one and it is local; `None` otherwise (the
    /// buffers left in place).
    #[inline(always)]
    pub fn take_local(&mut self) -> Option<crate::LocalBuffer> {
        let sg = self.sg()?;
        let SgList::One(Buf::Local(b)) = sg else {
            let b = take_local_other(sg);
            self.release_if_empty();
            return b;
        };
        // SAFETY: `b` is read out once and its place overwritten at once
        // with a value that owns nothing: neither is dropped twice.
        let b = unsafe {
            let b = std::ptr::read(b);
            std::ptr::write(sg, SgList::Empty);
            b
        };
        // Empty now: the slot is free again.
        if let Some(c) = self.claim.take() {
            c.release_emptied();
        }
        Some(b)
    }

    /// Takes the buffer back as a [`SharedBuffer`](crate::SharedBuffer)
    /// when the request had exactly one and it is shared.
    pub fn take_shared(&mut self) -> Option<crate::SharedBuffer> {
        let b = sg_take_one_if(self.sg()?, |b| matches!(b, Buf::Shared(_)));
        self.release_if_empty();
        b.and_then(Buf::into_shared)
    }

    /// For a UD receive with a GRH: the sender's GID (see
    /// [`Completion::source_gid`]).
    pub fn source_gid(&mut self) -> Option<Gid> {
        let wc = self.wc;
        source_gid_of(wc, self.sg()?)
    }

    /// Keeps the completion beyond the batch: the entry and the buffers,
    /// moved out of the slot (which is free again).
    pub fn into_owned(mut self) -> Completion {
        let sg = self.take_buffers();
        let owner = self.owner();
        Completion::new(self.wc.raw, sg, self.timestamp(), owner)
    }
}

/// [`CompletionRef::take_local`] past its common case: a scatter list of
/// one local buffer.
#[inline(never)]
fn take_local_other(sg: &mut SgList) -> Option<crate::LocalBuffer> {
    sg_take_one_if(sg, |b| matches!(b, Buf::Local(_))).and_then(Buf::into_local)
}

impl std::fmt::Debug for CompletionRef<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompletionRef")
            .field("wr_id", &self.wr_id())
            .field("status", &self.wc.status())
            .field("opcode", &self.wc.opcode())
            .field("byte_len", &self.wc.byte_len())
            .field("orphan", &self.is_orphan())
            .finish()
    }
}
