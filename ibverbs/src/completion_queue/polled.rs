//! A poll's completions, borrowed: each is claimed from the in-flight
//! store as the walk reaches it, and its buffers are taken straight out of
//! the request's slot (DESIGN.md, "Polling").

use ibverbs_sys as sys;

use crate::buffer::Buf;
use crate::error::Result;
use crate::inflight::{self, Claim, Held};
use crate::work_completion::WorkCompletion;
use crate::wq_table::SgList;

use super::fix_rxe_inv_flag;

/// The completions one poll returned, in order (an iterator of
/// [`Entry`] entries). Dropping it claims and drops what was not
/// reached, buffers included.
pub struct Batch<'a> {
    wcs: std::slice::IterMut<'a, sys::ibv_wc>,
    rxe: bool,
}

impl<'a> Batch<'a> {
    pub(super) fn new(wcs: &'a mut [sys::ibv_wc], rxe: bool) -> Batch<'a> {
        Batch {
            wcs: wcs.iter_mut(),
            rxe,
        }
    }

    /// Completions not yet reached.
    pub fn len(&self) -> usize {
        self.wcs.len()
    }

    /// Whether none is left.
    pub fn is_empty(&self) -> bool {
        self.wcs.len() == 0
    }
}

impl<'a> Iterator for Batch<'a> {
    type Item = Entry<'a>;

    #[inline(always)]
    fn next(&mut self) -> Option<Entry<'a>> {
        let wc = self.wcs.next()?;
        if self.rxe {
            fix_rxe_inv_flag(wc);
        }
        let mut claim = inflight::claim(wc.wr_id);
        if let Some(c) = &mut claim {
            wc.wr_id = c.user();
            if let Held::Window(_) = c.payload().held {
                settle_window(c, wc.status);
            }
        }
        Some(Entry {
            wc: WorkCompletion::from_raw_ref(wc),
            claim,
        })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.wcs.size_hint()
    }
}

impl Drop for Batch<'_> {
    fn drop(&mut self) {
        for _ in self.by_ref() {}
    }
}

/// One completion of a [`Batch`]: the entry, with the buffers of its
/// request still in the request's slot until taken. Dropping it drops
/// what was not taken and frees the slot.
pub struct Entry<'a> {
    wc: &'a WorkCompletion,
    claim: Option<Claim>,
}

impl std::ops::Deref for Entry<'_> {
    type Target = WorkCompletion;
    #[inline(always)]
    fn deref(&self) -> &WorkCompletion {
        self.wc
    }
}

impl Entry<'_> {
    /// Whether no request posted through the safe API matched (a raw
    /// request's, or a stale one of a destroyed or reset queue).
    pub fn is_orphan(&self) -> bool {
        self.claim.is_none()
    }

    /// The status as a `Result`.
    ///
    /// # Errors
    /// [`Error::WorkCompletion`](crate::Error::WorkCompletion) for any
    /// status but success.
    #[inline(always)]
    pub fn result(&self) -> Result<()> {
        self.wc.result()
    }

    /// The buffers, if any are left.
    #[inline(always)]
    fn sg(&mut self) -> Option<&mut SgList> {
        match &mut self.claim.as_mut()?.payload().held {
            Held::Sg(sg) => Some(sg),
            Held::Window(_) => None,
        }
    }

    /// The request's buffers (all of them, leaving none).
    pub fn take_buffers(&mut self) -> SgList {
        self.sg().map(std::mem::take).unwrap_or_default()
    }

    /// The request's only buffer as a [`LocalBuffer`](crate::LocalBuffer);
    /// `None` (and the buffers left in place) otherwise.
    #[inline(always)]
    pub fn take_local(&mut self) -> Option<crate::LocalBuffer> {
        let sg = self.sg()?;
        let SgList::One(Buf::Local(b)) = sg else {
            return None;
        };
        // SAFETY: `b` is read out once and its place overwritten at once
        // with a value that owns nothing (no drop of either).
        unsafe {
            let b = std::ptr::read(b);
            std::ptr::write(sg, SgList::Empty);
            Some(b)
        }
    }
}

/// A memory window's bind or invalidate completed: the window learns the
/// status (its regions are released only on success).
#[cold]
#[inline(never)]
fn settle_window(c: &mut Claim, status: u32) {
    if let Held::Window(op) = std::mem::take(&mut c.payload().held) {
        op.complete(status);
    }
}
