//! A poll's completions, borrowed: each is claimed from the in-flight
//! store as the walk reaches it, and its buffers are taken straight out of
//! the request's slot (DESIGN.md, "Polling").

use rdma_verbs_sys as sys;

use crate::error::Result;
use crate::memory::buffer::{Buf, SgList};

use crate::cq::work_completion::WorkCompletion;
use crate::inflight::owner::Owner;
use crate::inflight::{self, Claim, Held};

use super::completion::{sg_take_one_if, source_gid_of, Completion};
use super::fix_rxe_inv_flag;
use crate::types::Gid;

/// The completions one poll returned, in order: an iterator of
/// [`CompletionRef`]s. Each is claimed when the walk reaches it; dropping
/// the batch claims what was not reached and drops it, buffers included.
///
/// Several threads may poll one CQ at once, each with its own
/// [`Completions`](crate::Completions): every completion reaches one of
/// them, and its buffers only that one.
pub struct Polled<'a> {
    wcs: std::slice::IterMut<'a, sys::ibv_wc>,
    /// Where a completion's timestamp is: what the walk never touches.
    stamps: Stamps<'a>,
    rxe: bool,
}

/// The batch's timestamps, one per entry, when the CQ reads them: a
/// [`CompletionRef`] finds its own from its entry's place in the batch, so
/// the walk moves nothing for them.
#[derive(Clone, Copy)]
struct Stamps<'a> {
    /// The batch's first entry.
    first: *const sys::ibv_wc,
    /// Its timestamp; null without timestamps.
    stamps: *const u64,
    _borrow: std::marker::PhantomData<&'a [u64]>,
}

impl Stamps<'_> {
    /// The timestamp of `wc`, an entry of the batch.
    fn of(&self, wc: &sys::ibv_wc) -> Option<u64> {
        if self.stamps.is_null() {
            return None;
        }
        // SAFETY: `wc` is an entry of the batch that starts at `first`,
        // and `stamps` has one timestamp per entry (`Polled::new`).
        unsafe {
            let i = std::ptr::from_ref(wc).offset_from(self.first);
            Some(*self.stamps.offset(i))
        }
    }
}

/// A [`CompletionRef`]'s owner when no request matched (an orphan).
const ORPHAN: u8 = u8::MAX;

impl<'a> Polled<'a> {
    pub(super) fn new(wcs: &'a mut [sys::ibv_wc], stamps: Option<&'a [u64]>, rxe: bool) -> Self {
        let stamps = match stamps {
            Some(s) => {
                // Both sliced to the same count by `lend`: never fails.
                assert!(s.len() >= wcs.len(), "a timestamp per entry");
                s.as_ptr()
            }
            None => std::ptr::null(),
        };
        Polled {
            rxe,
            stamps: Stamps {
                first: wcs.as_ptr(),
                stamps,
                _borrow: std::marker::PhantomData,
            },
            wcs: wcs.iter_mut(),
        }
    }

    /// Nothing polled.
    pub(super) fn none() -> Polled<'static> {
        Polled {
            wcs: [].iter_mut(),
            rxe: false,
            stamps: Stamps {
                first: std::ptr::null(),
                stamps: std::ptr::null(),
                _borrow: std::marker::PhantomData,
            },
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
        // The entry's own flag first: clear on every send completion.
        if wc.wc_flags & sys::ibv_wc_flags::IBV_WC_IP_CSUM_OK.0 != 0 && self.rxe {
            fix_rxe_inv_flag(wc);
        }
        let (claim, owner) = match inflight::claim(wc.wr_id) {
            None => (None, ORPHAN),
            Some(c) => {
                wc.wr_id = c.user();
                let owner = c.owner();
                // Nothing to take (a prepared posting, inline data): the
                // slot is free again at once, for a post in this walk.
                let c = if c.is_plain_empty() {
                    c.release_emptied();
                    None
                } else {
                    keep(c, wc.status)
                };
                (c, owner)
            }
        };
        Some(CompletionRef {
            wc: WorkCompletion::from_raw_ref(wc),
            claim,
            owner,
            stamps: self.stamps,
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
                stamps: self.stamps,
                rxe: self.rxe,
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

/// A claim that holds something or has something to settle: kept when
/// buffers are left to take, else dropped (which frees the slot).
#[inline(always)]
fn keep(mut c: Claim, status: u32) -> Option<Claim> {
    if c.has_extras() {
        c = settle(c, status);
    }
    if c.holds_nothing() {
        return None;
    }
    Some(c)
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
    stamps: Stamps<'a>,
}

// SAFETY: `Stamps` points into the batch's entries and timestamps, shared
// borrows of plain data (Sync) for 'a, read only.
unsafe impl Send for Stamps<'_> {}
// SAFETY: as above.
unsafe impl Sync for Stamps<'_> {}

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

    /// Whether its request was marked as `owner`'s
    /// ([`SendRequest::owner`](crate::SendRequest::owner)); never for an
    /// orphan.
    #[inline]
    pub fn is_owned_by(&self, owner: Owner) -> bool {
        self.owner == owner.tag()
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
        self.stamps.of(&self.wc.raw)
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
    pub fn take_local(&mut self) -> Option<crate::memory::buffer::LocalBuffer> {
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
    pub fn take_shared(&mut self) -> Option<crate::memory::buffer::SharedBuffer> {
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
fn take_local_other(sg: &mut SgList) -> Option<crate::memory::buffer::LocalBuffer> {
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
