//! What a poll hands back: a [`Completion`], the raw entry together with
//! the buffers its request owned.

use ibverbs_sys as sys;

use crate::buffer::Buf;
use crate::error::Result;
use crate::gid::Gid;
use crate::work_completion::WorkCompletion;
use crate::wq_table::{Claimed, SgList};

/// Decodes the source GID of a 40-byte GRH area (see [`Completion::source_gid`]).
pub(crate) fn grh_source_gid(grh: &[u8; 40]) -> Option<Gid> {
    if grh[0] >> 4 == 6 {
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&grh[8..24]);
        Some(Gid(gid))
    } else if grh[20] >> 4 == 4 {
        let v4: [u8; 4] = grh[32..36].try_into().ok()?;
        Some(Gid::from(std::net::Ipv4Addr::from(v4)))
    } else {
        None
    }
}

/// Takes the only buffer of `sg` if `want` accepts it, else leaves `sg`
/// as it was (see [`Completion::take_buf`]).
#[inline]
fn sg_take_one_if(sg: &mut SgList, want: impl FnOnce(&Buf) -> bool) -> Option<Buf> {
    let only = match &*sg {
        SgList::One(b) => b,
        SgList::Many(v) if v.len() == 1 => &v[0],
        _ => return None,
    };
    if !want(only) {
        return None;
    }
    match std::mem::take(sg) {
        SgList::One(b) => Some(b),
        SgList::Many(mut v) => v.pop(),
        SgList::Empty => None,
    }
}

/// A work completion together with the buffers its request owned.
///
/// Dereferences to [`WorkCompletion`] for status, opcode, byte length,
/// immediate data, source QP, …. For a safely posted request the raw
/// entry's `wr_id` ([`WorkCompletion::as_raw`]) is the caller's, as
/// [`wr_id`](Self::wr_id) reports it, not the library's slot tag.
///
/// Small enough (at most 128 bytes, checked by a test) to be moved around
/// without a `memcpy` call.
pub struct Completion {
    /// The raw entry, its `wr_id` replaced by the caller's once claimed.
    wc: WorkCompletion,
    /// The request's buffers (address handles and memory-window bindings
    /// it kept alive are released when it is claimed). Dropped by `Drop`
    /// only when not empty: the common empty case costs no call.
    sg: std::mem::ManuallyDrop<SgList>,
    /// The completion timestamp, when `stamped` (copied as it is either
    /// way: no branch when a batch's completions are taken).
    stamp: u64,
    origin: Origin,
    stamped: bool,
}

/// Who posted a completion's request, as its slot (or prepared posting)
/// said.
#[derive(Clone, Copy, PartialEq, Eq, Default)]
enum Origin {
    /// No posted request matched: an orphan.
    #[default]
    Orphan,
    /// Posted through the safe API.
    Caller,
    /// Posted by the async dispatcher (`Claimed::dispatched`).
    Dispatcher,
}

impl Drop for Completion {
    #[inline]
    fn drop(&mut self) {
        if !matches!(*self.sg, SgList::Empty) {
            // SAFETY: `sg` is taken only here, once, and never used after.
            drop_buffers(unsafe { std::mem::ManuallyDrop::take(&mut self.sg) });
        }
    }
}

/// The buffers a dropped [`Completion`] still held. Out of line, so that
/// dropping a completion whose buffers were taken (or that had none) is
/// one test where it is dropped.
#[inline(never)]
fn drop_buffers(sg: SgList) {
    drop(sg);
}

impl std::ops::Deref for Completion {
    type Target = WorkCompletion;
    fn deref(&self) -> &WorkCompletion {
        &self.wc
    }
}

impl Completion {
    /// The completion of raw entry `raw`; `claimed` is what its request
    /// left in its slot (the caller's `wr_id` and buffers), `None` for an
    /// orphan. Built whole: no field is assigned (and its old value
    /// dropped) afterwards.
    #[inline]
    pub(super) fn new(
        mut raw: sys::ibv_wc,
        timestamp: Option<u64>,
        claimed: Option<Claimed>,
    ) -> Self {
        // A match, not `unwrap_or`: no spare SgList to drop.
        let (sg, origin) = match claimed {
            Some(c) => {
                raw.wr_id = c.wr_id;
                let origin = if c.dispatched {
                    Origin::Dispatcher
                } else {
                    Origin::Caller
                };
                (c.sg, origin)
            }
            None => (SgList::Empty, Origin::Orphan),
        };
        Completion {
            wc: WorkCompletion { raw },
            sg: std::mem::ManuallyDrop::new(sg),
            stamp: timestamp.unwrap_or(0),
            origin,
            stamped: timestamp.is_some(),
        }
    }

    /// Whether the async dispatcher posted the request: its
    /// [`wr_id`](Self::wr_id) is then one the dispatcher gave, which no
    /// other posting can claim.
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
    #[inline]
    pub(crate) fn is_dispatched(&self) -> bool {
        self.origin == Origin::Dispatcher
    }

    /// The `wr_id` given when posting.
    #[inline]
    pub fn wr_id(&self) -> u64 {
        self.wc.raw.wr_id
    }
    /// The raw work completion.
    #[inline]
    pub fn wc(&self) -> &WorkCompletion {
        &self.wc
    }
    /// The completion timestamp, when polled from a CQ created with
    /// [`WcFields::COMPLETION_TIMESTAMP`](crate::WcFields::COMPLETION_TIMESTAMP)
    /// (device clock units) or `COMPLETION_TIMESTAMP_WALLCLOCK` (ns).
    #[inline]
    pub fn timestamp(&self) -> Option<u64> {
        self.stamped.then_some(self.stamp)
    }
    /// Whether no posted request matched (raw-path requests, or a stale
    /// completion of a destroyed queue pair).
    #[inline]
    pub fn is_orphan(&self) -> bool {
        self.origin == Origin::Orphan
    }
    /// Takes the scatter/gather list back (every buffer of the request).
    #[inline]
    pub fn take_buffers(&mut self) -> SgList {
        std::mem::take(&mut *self.sg)
    }
    /// Takes the buffer back when the request had exactly one; `None`
    /// otherwise, the buffers left in the completion for
    /// [`take_buffers`](Self::take_buffers) (a scatter/gather request's
    /// are never split up here).
    #[inline]
    pub fn take_buf(&mut self) -> Option<Buf> {
        self.take_one_if(|_| true)
    }
    /// Takes the buffer back as a [`LocalBuffer`](crate::LocalBuffer): when
    /// the request had exactly one buffer and it is local. Otherwise
    /// `None`, and the buffers stay in the completion (for
    /// [`take_shared`](Self::take_shared) or
    /// [`take_buffers`](Self::take_buffers)).
    #[inline]
    pub fn take_local(&mut self) -> Option<crate::LocalBuffer> {
        // The common case (a one-buffer request's local buffer) inline:
        // anything else is put back as it was (the placeholder `Empty` is
        // forgotten, not dropped) and left to the general case.
        match std::mem::take(&mut *self.sg) {
            SgList::One(Buf::Local(b)) => Some(b),
            other => {
                std::mem::forget(std::mem::replace(&mut *self.sg, other));
                self.take_local_other()
            }
        }
    }
    /// [`take_local`](Self::take_local) but for a one-buffer request's
    /// local buffer (out of line: the data path's case is that one).
    #[inline(never)]
    fn take_local_other(&mut self) -> Option<crate::LocalBuffer> {
        self.take_one_if(|b| matches!(b, Buf::Local(_)))
            .and_then(Buf::into_local)
    }
    /// Takes the buffer back as a [`SharedBuffer`](crate::SharedBuffer):
    /// when the request had exactly one buffer and it is shared. Otherwise
    /// `None`, and the buffers stay in the completion.
    #[inline]
    pub fn take_shared(&mut self) -> Option<crate::SharedBuffer> {
        self.take_one_if(|b| matches!(b, Buf::Shared(_)))
            .and_then(Buf::into_shared)
    }
    /// Takes the request's only buffer if `want` accepts it; leaves the
    /// list untouched otherwise (nothing is dropped here).
    #[inline]
    fn take_one_if(&mut self, want: impl FnOnce(&Buf) -> bool) -> Option<Buf> {
        sg_take_one_if(&mut self.sg, want)
    }
    /// For a UD receive with a GRH: the sender's GID, decoded from the
    /// 40-byte GRH area at the start of the receive buffer. An IPv6/IB GRH
    /// (IP version 6 in the first nibble) carries the source GID in bytes
    /// 8..24; RoCE v2 over IPv4 leaves bytes 0..20 zero and puts the IPv4
    /// header in bytes 20..40, whose source address (bytes 32..36) becomes
    /// the IPv4-mapped GID. `None` without a GRH or for anything else.
    pub fn source_gid(&self) -> Option<Gid> {
        if !self.wc.has_grh() {
            return None;
        }
        let first = self.sg.iter().next()?;
        let mut grh = [0u8; 40];
        first.copy_to_slice(0, &mut grh).ok()?;
        grh_source_gid(&grh)
    }
    /// `Ok(())` on success, else [`Error::WorkCompletion`](crate::Error::WorkCompletion)
    /// with the caller's `wr_id`.
    ///
    /// # Errors
    /// [`Error::WorkCompletion`](crate::Error::WorkCompletion).
    #[inline]
    pub fn result(&self) -> Result<()> {
        self.wc.result().map_err(|e| match e {
            crate::Error::WorkCompletion {
                status, vendor_err, ..
            } => crate::Error::WorkCompletion {
                status,
                wr_id: self.wr_id(),
                vendor_err,
            },
            e => e,
        })
    }
}

impl std::fmt::Debug for Completion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Completion")
            .field("wr_id", &self.wr_id())
            .field("status", &self.wc.status())
            .field("opcode", &self.wc.opcode())
            .field("byte_len", &self.wc.byte_len())
            .field("imm_data", &self.wc.imm_data())
            .field("buffers", &(!self.is_orphan()).then(|| self.sg.len()))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::{grh_source_gid, Completion, Completions, SgList};

    /// Entries as a poll leaves them: written at the free tail, held as
    /// orphans.
    fn hold(out: &mut Completions, wr_ids: &[u64]) {
        let start = out.free_start();
        let (raw, claims) = out.fresh(start, wr_ids.len());
        for ((wc, claim), &w) in raw.iter_mut().zip(claims).zip(wr_ids) {
            wc.wr_id = w;
            claim.hold(wc, None, false);
        }
        out.held(wr_ids.len());
    }

    #[test]
    fn completions_stay_in_place_and_keep_their_order() {
        let mut out = Completions::with_capacity(4);
        hold(&mut out, &[1, 2, 3]);
        assert_eq!(out.pop().map(|c| c.wr_id()), Some(1));
        // 2 and 3 held at [1, 3): new entries go after them.
        assert_eq!(out.free_start(), 3);
        hold(&mut out, &[4]);
        assert_eq!(out.pop().map(|c| c.wr_id()), Some(2));
        // 3 and 4 end at the last entry: they move to the front.
        assert_eq!(out.free_start(), 2);
        hold(&mut out, &[5, 6]);
        assert_eq!(
            out.iter().map(|w| w.wr_id()).collect::<Vec<_>>(),
            [3, 4, 5, 6]
        );
        let order: Vec<u64> = out.drain().map(|c| c.wr_id()).collect();
        assert_eq!(order, [3, 4, 5, 6]);
        assert!(out.is_empty());
        assert_eq!(out.free_start(), 0);
        // A drain dropped early drops the rest, buffers and all: their
        // entries are free (`Empty`) for the next poll to fill.
        hold(&mut out, &[7, 8, 9]);
        for claim in &mut out.claims[..3] {
            *claim.sg_mut() = SgList::Many(Vec::new());
        }
        assert_eq!(out.drain().next().map(|c| c.wr_id()), Some(7));
        assert!(out.is_empty());
        assert!(out.claims[1..3]
            .iter()
            .all(|c| matches!(c.sg, SgList::Empty)));
        // Nothing held: an empty drain.
        assert_eq!(out.drain().count(), 0);
    }

    #[test]
    fn completion_moves_without_memcpy() {
        // Above 128 bytes a move becomes a `memcpy` call, and a completion
        // is moved on every poll (out of the CQ, out of `poll_one`).
        assert!(std::mem::size_of::<Completion>() <= 128);
        assert!(std::mem::size_of::<Option<Completion>>() <= 128);
    }

    #[test]
    fn grh_ipv6_and_roce_v2_ipv4() {
        let mut v6 = [0u8; 40];
        v6[0] = 0x60;
        v6[8..24].copy_from_slice(&"fe80::1".parse::<std::net::Ipv6Addr>().unwrap().octets());
        assert_eq!(grh_source_gid(&v6).unwrap().to_string(), "fe80::1");
        let mut v4 = [0u8; 40];
        v4[20] = 0x45;
        v4[32..36].copy_from_slice(&[10, 0, 2, 15]);
        assert_eq!(grh_source_gid(&v4).unwrap().to_string(), "::ffff:10.0.2.15");
        assert_eq!(grh_source_gid(&[0u8; 40]), None);
    }
}

/// Caller-provided storage for polled completions (allocated once, reused).
///
/// The provider writes its entries here and they stay in place:
/// [`pop`](Self::pop) and [`drain`](Self::drain) build each [`Completion`]
/// from its entry as it is taken, so nothing is copied in between.
pub struct Completions {
    /// The entries: `[head, head + len)` are held (claimed: `wr_id` is the
    /// caller's); the provider writes new ones after them.
    pub(crate) raw: Box<[sys::ibv_wc]>,
    /// What each held entry's request left (its buffers, who posted it)
    /// and its timestamp, by entry (as long as `raw`). A free entry's
    /// buffers are always [`SgList::Empty`] (taking a completion takes
    /// them), so holding an entry writes its claim without dropping.
    claims: Box<[Claim]>,
    head: usize,
    len: usize,
}

/// What a poll claimed for one entry of a [`Completions`].
#[derive(Default)]
pub(crate) struct Claim {
    sg: SgList,
    /// The completion timestamp read from an extended CQ.
    stamp: u64,
    origin: Origin,
    /// Whether `stamp` was read (extended CQ).
    stamped: bool,
}

impl Claim {
    /// The buffers of this (free) claim, for a table to move a request's
    /// into: they are [`SgList::Empty`], and are overwritten, not dropped.
    #[inline(always)]
    pub(crate) fn sg_mut(&mut self) -> &mut SgList {
        &mut self.sg
    }

    /// Holds the entry `wc`, whose request's buffers a table already moved
    /// into this claim ([`sg_mut`](Self::sg_mut)): `ids` is the caller's
    /// `wr_id` (it goes into the entry) and whether the dispatcher posted
    /// the request (`None`: an orphan).
    #[inline(always)]
    pub(crate) fn hold(&mut self, wc: &mut sys::ibv_wc, ids: Option<(u64, bool)>, stamped: bool) {
        self.stamped = stamped;
        match ids {
            Some((wr_id, dispatched)) => {
                wc.wr_id = wr_id;
                self.origin = if dispatched {
                    Origin::Dispatcher
                } else {
                    Origin::Caller
                };
            }
            None => self.origin = Origin::Orphan,
        }
    }

    /// [`hold`](Self::hold) for a prepared posting, whose entry already
    /// has the caller's `wr_id`: no buffers.
    #[inline(always)]
    pub(crate) fn hold_prepared(&mut self, stamped: bool) {
        self.stamped = stamped;
        self.origin = Origin::Caller;
    }

    /// The [`Completion`] of entry `wc`, held with this claim; the claim's
    /// buffers go with it (the entry is free again).
    #[inline(always)]
    fn take(&mut self, wc: &sys::ibv_wc) -> Completion {
        // The claim first: the entry is then read straight into place.
        // A prepared posting's claim has no buffers: nothing to move.
        let sg = if matches!(self.sg, SgList::Empty) {
            SgList::Empty
        } else {
            std::mem::take(&mut self.sg)
        };
        Completion {
            wc: WorkCompletion { raw: *wc },
            sg: std::mem::ManuallyDrop::new(sg),
            stamp: self.stamp,
            origin: self.origin,
            stamped: self.stamped,
        }
    }
}

impl Completions {
    /// Room for `capacity` completions (at least 1).
    pub fn with_capacity(capacity: usize) -> Completions {
        let capacity = capacity.max(1);
        Completions {
            raw: vec![sys::ibv_wc::default(); capacity].into_boxed_slice(),
            claims: (0..capacity).map(|_| Claim::default()).collect(),
            head: 0,
            len: 0,
        }
    }

    /// Entries `start..start + n` (the free tail a poll just wrote, see
    /// [`free_start`](Self::free_start)) and their claims, for the poll to
    /// claim in place; [`held`](Self::held) counts them afterwards.
    #[inline(always)]
    pub(crate) fn fresh(&mut self, start: usize, n: usize) -> (&mut [sys::ibv_wc], &mut [Claim]) {
        debug_assert_eq!(start, self.head + self.len);
        let range = start..start + n;
        (&mut self.raw[range.clone()], &mut self.claims[range])
    }

    /// Counts the `n` entries [`fresh`](Self::fresh) gave as held.
    #[inline(always)]
    pub(crate) fn held(&mut self, n: usize) {
        self.len += n;
    }

    /// Entry `i` and its timestamp, for an extended CQ's poll to write.
    #[inline]
    pub(crate) fn entry_mut(&mut self, i: usize) -> (&mut sys::ibv_wc, &mut u64) {
        (&mut self.raw[i], &mut self.claims[i].stamp)
    }

    /// Where the provider may write: the index after the held entries,
    /// every entry from there on free. Moves the held entries to the front
    /// when they end at the last entry (only when a caller polls again
    /// before taking all).
    #[inline(always)]
    pub(crate) fn free_start(&mut self) -> usize {
        if self.len == 0 {
            // The common case: everything was taken.
            self.head = 0;
            return 0;
        }
        self.compact()
    }

    /// [`free_start`](Self::free_start) with entries held.
    #[cold]
    #[inline(never)]
    fn compact(&mut self) -> usize {
        if self.head > 0 && self.head + self.len == self.raw.len() {
            let held = self.head..self.head + self.len;
            self.raw.copy_within(held, 0);
            for i in 0..self.len {
                self.claims.swap(i, self.head + i);
            }
            self.head = 0;
        }
        self.head + self.len
    }

    /// Completions held.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether none is held.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Takes the oldest completion.
    #[inline]
    pub fn pop(&mut self) -> Option<Completion> {
        if self.len == 0 {
            return None;
        }
        let i = self.head;
        self.head += 1;
        self.len -= 1;
        Some(self.claims[i].take(&self.raw[i]))
    }
    /// Takes all held completions, oldest first (those the iterator is
    /// dropped before reaching are dropped with it, buffers included; a
    /// drain that is forgotten instead leaks them).
    #[inline]
    pub fn drain(&mut self) -> CompletionsDrain<'_> {
        if self.len == 0 {
            // What a busy-polling loop mostly drains: no slicing.
            return CompletionsDrain {
                rest: [].iter().zip([].iter_mut()),
            };
        }
        let held = self.head..self.head + self.len;
        // All taken from here on: the drain walks them (no per-entry
        // bookkeeping here), and `mem::forget` of it leaks what it did not
        // reach, never hands it out twice (as `Vec::drain`).
        self.head = 0;
        self.len = 0;
        CompletionsDrain {
            rest: self.raw[held.clone()]
                .iter()
                .zip(self.claims[held].iter_mut()),
        }
    }
    /// Looks at the held completions' entries (`wr_id` the caller's).
    pub fn iter(&self) -> impl Iterator<Item = &WorkCompletion> {
        self.raw[self.head..self.head + self.len]
            .iter()
            .map(WorkCompletion::from_raw_ref)
    }
}

/// The iterator of [`Completions::drain`].
pub struct CompletionsDrain<'a> {
    /// The held entries not yet taken, with their claims.
    rest: std::iter::Zip<std::slice::Iter<'a, sys::ibv_wc>, std::slice::IterMut<'a, Claim>>,
}

impl Iterator for CompletionsDrain<'_> {
    type Item = Completion;
    #[inline]
    fn next(&mut self) -> Option<Completion> {
        let (wc, claim) = self.rest.next()?;
        Some(claim.take(wc))
    }
    #[inline]
    fn size_hint(&self) -> (usize, Option<usize>) {
        self.rest.size_hint()
    }
}

impl ExactSizeIterator for CompletionsDrain<'_> {}

impl Drop for CompletionsDrain<'_> {
    #[inline]
    fn drop(&mut self) {
        // Fully drained (the common case): one comparison.
        if self.rest.len() != 0 {
            self.drop_rest();
        }
    }
}

impl CompletionsDrain<'_> {
    /// As `VecDeque::drain(..)`: what was not taken goes, buffers and all
    /// (to their owners' drop), and the entries are free again (their
    /// buffers `Empty`).
    #[cold]
    #[inline(never)]
    fn drop_rest(&mut self) {
        for (_, claim) in self.rest.by_ref() {
            drop(std::mem::take(&mut claim.sg));
        }
    }
}

impl std::fmt::Debug for Completions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}
