//! The in-flight store: what the device may touch for every request posted
//! through the safe API (buffers, address handle, memory window) lives in
//! one slot here from the post until its completion is claimed (DESIGN.md,
//! "The in-flight store").
//!
//! One store for the process, in segments that are allocated once and
//! never freed or moved: a completion names its slot by its `wr_id`
//! ([`wr_id`]) whatever CQ it comes from (an SRQ's completions come from
//! the CQs of all its queue pairs), and a stale `wr_id` of a queue long
//! destroyed still names live memory, whose state rejects it. Each work
//! queue owns a contiguous range of slots, one per entry of the depth it
//! asked for, and is their only producer (through its exclusive posting
//! handle); pollers only claim.
//!
//! A slot's state word says who owns the rest of it:
//! * [`FREE`]: the range's owner (it posts into it);
//! * a request's `wr_id`: the request, i.e. nobody may touch the payload
//!   until a compare-and-swap of that `wr_id` to [`CLAIMING`] succeeds —
//!   a poller with its completion, or the teardown after the device let go;
//! * [`CLAIMING`]: that poller, until it stores [`FREE`] (`Release`);
//! * held after a reset ([`wr_id::held`]): nobody, until the CQ's debt is
//!   paid ([`Ring::release_held`]).

pub(crate) mod owner;
pub(crate) mod wr_id;

use std::cell::UnsafeCell;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::address_handle::AddressHandle;
use crate::error::{Error, Result};
use crate::memory::buffer::SgList;
use crate::memory::memory_window::WindowOp;
use wr_id::{CLAIMING, FREE};

/// What a slot holds while its request is outstanding (40 bytes: a slot
/// stays one cache line, pinned by a test). Nothing here is boxed: posting
/// must not allocate, and the rare memory-window request shares the space
/// of the buffers it never has.
#[derive(Debug, Default)]
pub(crate) struct Payload {
    /// The request's buffers, or its memory window.
    pub(crate) held: Held,
    /// Held, never read: keeps a UD request's address handle alive until
    /// the request completed (an `Arc`: cloning it does not allocate).
    pub(crate) ah: Option<AddressHandle>,
}

impl Payload {
    /// A request's buffers and, for a UD send, its address handle.
    #[inline(always)]
    pub(crate) fn bufs(sg: SgList, ah: Option<AddressHandle>) -> Payload {
        Payload {
            held: Held::Sg(sg),
            ah,
        }
    }

    /// The buffers, taken out (none for a window).
    pub(crate) fn into_sg(self) -> SgList {
        match self.held {
            Held::Sg(sg) => sg,
            Held::Window(_) => SgList::Empty,
        }
    }
}

/// The buffers of a request, or what a request without buffers keeps
/// alive instead, told how it ended: released with the completion's
/// status, or dropped without one (which the object must treat as "it
/// may or may not have run"). One enum, so the window shares the buffers'
/// 32 bytes (it fits in the niche of [`SgList`]'s tag).
#[derive(Debug)]
pub(crate) enum Held {
    /// A request's buffers.
    Sg(SgList),
    /// A memory-window bind or invalidate (no buffers): the window, which
    /// the status settles (its regions are released only on success).
    Window(WindowOp),
}

impl Default for Held {
    fn default() -> Held {
        Held::Sg(SgList::Empty)
    }
}

/// The slots of segment 0; segment `k` has `FIRST << k`.
const FIRST: u32 = 64;
/// Segments: the largest has `FIRST << 21` = 2^27 slots, all the offset
/// field of a `wr_id` can name.
const SEGMENTS: usize = 22;
const _: () = assert!(SEGMENTS <= wr_id::SEGMENT_MASK as usize + 1);

/// Flag: the request asked for no completion.
pub(crate) const UNSIGNALED: u8 = 1;
/// Flag: the request posted just before this one on its ring was
/// unsignaled; this one's claim releases it (the device finished it first).
pub(crate) const AFTER_UNSIGNALED: u8 = 2;
/// Flag: the payload keeps an address handle alive.
const HAS_AH: u8 = 4;
/// Flag: the payload is a memory window's bind or invalidate.
const WINDOW: u8 = 8;
/// What a claim must settle before the buffers (see [`Claim::has_extras`]).
const EXTRAS: u8 = HAS_AH | WINDOW;
/// Flag: the payload may hold something; clear only while it holds
/// nothing (set by `fill` for a non-empty payload, cleared by the one take
/// that empties it), so a claim tests one byte, not the payload.
const HOLDS: u8 = 16;

/// One request's place (one cache line; see the module docs for who owns
/// the fields behind `state`). Whoever stores [`FREE`] leaves the payload
/// empty first.
#[repr(C, align(64))]
pub(crate) struct Slot {
    pub(crate) state: AtomicU64,
    /// The caller's `wr_id`.
    user: UnsafeCell<u64>,
    payload: UnsafeCell<Payload>,
    /// The offset (in this segment) of the request posted just before on
    /// the same ring, for the release of unsignaled requests.
    prev: UnsafeCell<u32>,
    flags: UnsafeCell<u8>,
    /// Who posted it: 0 the caller, others a runtime's mark (the async
    /// dispatcher's), which no public API sets.
    owner: UnsafeCell<u8>,
}

// SAFETY: the fields behind `state` are touched only by whoever the state
// word gives them to (module docs), with Acquire/Release on the word.
unsafe impl Sync for Slot {}
// SAFETY: as above.
unsafe impl Send for Slot {}

impl Slot {
    fn new() -> Slot {
        Slot {
            state: AtomicU64::new(FREE),
            user: UnsafeCell::new(0),
            payload: UnsafeCell::new(Payload::default()),
            prev: UnsafeCell::new(0),
            flags: UnsafeCell::new(0),
            owner: UnsafeCell::new(0),
        }
    }

    /// The slot at `offset` of `segment`; `None` where none is allocated.
    #[inline(always)]
    fn at(segment: u32, offset: u32) -> Option<&'static Slot> {
        // Every 5-bit segment number indexes the table (no bounds test).
        let base = STORE[segment as usize & (STORE.len() - 1)].load(Ordering::Acquire);
        if base.is_null() || offset >= FIRST << segment {
            return None;
        }
        // SAFETY: a segment, once published, is `FIRST << segment`
        // initialised slots that are never freed or moved.
        Some(unsafe { &*base.add(offset as usize) })
    }
}

/// The segments (null until allocated, then never changed), indexed by
/// every value of the `wr_id`'s segment field: those from [`SEGMENTS`] on
/// stay null.
static STORE: [AtomicPtr<Slot>; wr_id::SEGMENT_MASK as usize + 1] =
    [const { AtomicPtr::new(std::ptr::null_mut()) }; wr_id::SEGMENT_MASK as usize + 1];

/// The free ranges of the allocated segments (control path only).
static FREE_RANGES: Mutex<Vec<Span>> = Mutex::new(Vec::new());

/// Slots `start .. start + len` of `segment`, whose next generation is
/// `gen` (above every generation a `wr_id` of theirs ever had).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Span {
    segment: u32,
    start: u32,
    len: u32,
    gen: u32,
}

/// Takes `len` contiguous slots (`len` ≥ 1), allocating a segment when no
/// free range fits.
fn alloc_span(len: u32) -> Result<Span> {
    let mut free = FREE_RANGES.lock();
    loop {
        // Best fit: the shortest free range long enough.
        let best = free
            .iter()
            .enumerate()
            .filter(|(_, s)| s.len >= len)
            .min_by_key(|(_, s)| s.len)
            .map(|(i, _)| i);
        if let Some(i) = best {
            let s = free[i];
            if s.len == len {
                free.swap_remove(i);
            } else {
                free[i].start += len;
                free[i].len -= len;
            }
            return Ok(Span { len, ..s });
        }
        let segment = (0..SEGMENTS as u32)
            .find(|&k| FIRST << k >= len && STORE[k as usize].load(Ordering::Acquire).is_null())
            .ok_or(Error::OutOfRange {
                what: "work queue depth (the in-flight store has no room this long)",
                value: u64::from(len),
                max: u64::from(FIRST << (SEGMENTS - 1)),
            })?;
        let slots: Box<[Slot]> = (0..FIRST << segment).map(|_| Slot::new()).collect();
        // Never freed: a stale `wr_id` may name any slot at any time.
        let base = Box::leak(slots).as_mut_ptr();
        STORE[segment as usize].store(base, Ordering::Release);
        free.push(Span {
            segment,
            start: 0,
            len: FIRST << segment,
            gen: 0,
        });
    }
}

/// Gives `span` back; the next owner starts at generation `gen`.
fn free_span(span: Span) {
    let mut free = FREE_RANGES.lock();
    let mut span = span;
    // Merge with free neighbours in the same segment.
    while let Some(i) = free.iter().position(|s| {
        s.segment == span.segment
            && (s.start + s.len == span.start || span.start + span.len == s.start)
    }) {
        let s = free.swap_remove(i);
        span = Span {
            segment: span.segment,
            start: s.start.min(span.start),
            len: s.len + span.len,
            gen: s.gen.max(span.gen),
        };
    }
    free.push(span);
}

/// A work queue's slots, one per entry, used in order (a ring): the
/// producer side, owned by the queue and used only through its exclusive
/// posting handle (or by its teardown when no handle exists).
pub(crate) struct Ring {
    /// The slot of position 0.
    base: NonNull<Slot>,
    /// The `wr_id` of position 0 in the ring's current generation (its
    /// lap, bits 62..32): position `p`'s is `lap + p`.
    lap: u64,
    span: Span,
    /// The next position to post into.
    head: u32,
    /// Whether the last request posted was unsignaled.
    after_unsignaled: bool,
}

// SAFETY: the slots are 'static and shared through their state words; the
// ring's own fields are used by one thread at a time (the handle is
// exclusive, teardown runs without one).
unsafe impl Send for Ring {}

/// A slot of a ring taken for a request, not yet published.
pub(crate) struct Reserved {
    slot: &'static Slot,
    pub(crate) wr_id: u64,
}

impl Reserved {
    /// The slot's state word (a prepared request watches it).
    pub(crate) fn state(&self) -> &'static AtomicU64 {
        &self.slot.state
    }

    /// The buffers [`Ring::fill`] wrote, for building the request's SGEs
    /// before the doorbell.
    ///
    /// # Safety
    /// The caller must ensure that the slot was filled and its `wr_id` has
    /// not reached the device yet (no poller can claim it meanwhile).
    pub(crate) unsafe fn sg(&self) -> &SgList {
        // SAFETY: the caller's contract: the slot is still the producer's.
        match unsafe { &(*self.slot.payload.get()).held } {
            Held::Sg(sg) => sg,
            Held::Window(_) => &SgList::Empty,
        }
    }
}

impl Ring {
    /// A ring of `depth` slots (at least 1).
    pub(crate) fn new(depth: u32) -> Result<Ring> {
        let span = alloc_span(depth.max(1))?;
        let base = Slot::at(span.segment, span.start).expect("allocated above");
        Ok(Ring {
            base: NonNull::from(base),
            lap: wr_id::encode(span.gen, span.segment, span.start),
            span,
            head: 0,
            after_unsignaled: false,
        })
    }

    /// The ring's generation.
    fn gen(&self) -> u32 {
        wr_id::generation(self.lap)
    }

    /// `lap` one generation on (wrapping within the generation's bits).
    #[inline(always)]
    fn next_lap(lap: u64) -> u64 {
        lap.wrapping_add(1 << 32) | wr_id::OURS
    }

    /// Entries.
    pub(crate) fn depth(&self) -> u32 {
        self.span.len
    }

    /// The queue's id in its CQs' accounting (unique among live rings).
    pub(crate) fn id(&self) -> u32 {
        self.geometry().id()
    }

    /// What never changes of the ring.
    pub(crate) fn geometry(&self) -> Geometry {
        Geometry {
            base: self.base,
            span: self.span,
        }
    }

    #[inline(always)]
    fn slot(&self, pos: u32) -> &'static Slot {
        debug_assert!(pos < self.span.len);
        // SAFETY: `pos` is inside the span, whose slots are 'static.
        unsafe { &*self.base.as_ptr().add(pos as usize) }
    }

    /// The head's slot, if free: the caller fills it
    /// ([`fill`](Self::fill)) and publishes it before the doorbell.
    #[inline(always)]
    pub(crate) fn reserve_head(&self) -> Option<Reserved> {
        let slot = self.slot(self.head);
        if slot.state.load(Ordering::Acquire) != FREE {
            return None;
        }
        Some(Reserved {
            slot,
            wr_id: self.lap + u64::from(self.head),
        })
    }

    /// The slot `ahead` positions after the head, if free (a chain's
    /// later requests; an SRQ's scan for a free slot).
    #[inline]
    pub(crate) fn reserve(&self, ahead: u32) -> Option<Reserved> {
        let mut pos = self.head + ahead;
        let mut lap = self.lap;
        if pos >= self.span.len {
            pos -= self.span.len;
            lap = Self::next_lap(lap);
        }
        let slot = self.slot(pos);
        if slot.state.load(Ordering::Acquire) != FREE {
            return None;
        }
        Some(Reserved {
            slot,
            wr_id: lap + u64::from(pos),
        })
    }

    /// Whether the head's slot is held after a reset (why a post found no
    /// room).
    pub(crate) fn head_held(&self) -> bool {
        is_held(self.slot(self.head).state.load(Ordering::Relaxed))
    }

    /// Slots held after resets (a snapshot, for errors).
    pub(crate) fn held(&self) -> u32 {
        (0..self.span.len)
            .filter(|&pos| is_held(self.slot(pos).state.load(Ordering::Relaxed)))
            .count() as u32
    }

    /// Writes a reserved slot's request; `signaled` says whether it asked
    /// for a completion.
    #[inline(always)]
    pub(crate) fn fill(&mut self, r: &Reserved, user: u64, payload: Payload, signaled: bool) {
        let mut flags = if signaled { 0 } else { UNSIGNALED };
        if payload.ah.is_some() {
            flags |= HAS_AH;
        }
        if let Held::Window(_) = payload.held {
            flags |= WINDOW;
        }
        if !matches!(payload.held, Held::Sg(SgList::Empty)) {
            flags |= HOLDS;
        }
        if self.after_unsignaled {
            flags |= AFTER_UNSIGNALED;
            self.note_prev(r);
            self.after_unsignaled = !signaled;
        } else if !signaled {
            self.after_unsignaled = true;
        }
        let Payload { held, ah } = payload;
        // SAFETY: the slot is FREE and this ring its only producer: the
        // fields are ours until the state is published.
        unsafe {
            *r.slot.user.get() = user;
            // A free slot's payload is empty (no address handle either):
            // overwrite without a drop.
            let p = r.slot.payload.get();
            std::ptr::write(&raw mut (*p).held, held);
            if ah.is_some() {
                std::ptr::write(&raw mut (*p).ah, ah);
            }
            *r.slot.flags.get() = flags;
            *r.slot.owner.get() = 0;
        }
    }

    /// [`fill`](Self::fill) for a signaled request without buffers (a
    /// prepared request's posting): a free slot's payload is empty already.
    #[inline(always)]
    pub(crate) fn fill_empty(&mut self, r: &Reserved, user: u64) {
        let mut flags = 0;
        if self.after_unsignaled {
            flags |= AFTER_UNSIGNALED;
            self.note_prev(r);
            self.after_unsignaled = false;
        }
        // SAFETY: as in `fill`.
        unsafe {
            debug_assert!(matches!(
                &*r.slot.payload.get(),
                Payload {
                    held: Held::Sg(SgList::Empty),
                    ah: None
                }
            ));
            *r.slot.user.get() = user;
            *r.slot.flags.get() = flags;
            *r.slot.owner.get() = 0;
        }
    }

    /// Writes where the request before `r` on the ring is, for the claim
    /// that releases it (only after an unsignaled request).
    #[cold]
    fn note_prev(&self, r: &Reserved) {
        let offset = (r.wr_id & wr_id::OFFSET_MASK) as u32;
        let prev = if offset == self.span.start {
            self.span.start + self.span.len - 1
        } else {
            offset - 1
        };
        // SAFETY: as in `fill`.
        unsafe { *r.slot.prev.get() = prev };
    }

    /// Marks a filled slot as posted by a runtime (`owner` ≠ 0; `u8::MAX`
    /// is a polled completion's orphan mark).
    pub(crate) fn set_owner(&mut self, r: &Reserved, owner: u8) {
        debug_assert!(owner != 0 && owner != u8::MAX);
        // SAFETY: as in `fill`: not yet published.
        unsafe { *r.slot.owner.get() = owner };
    }

    /// Publishes a filled slot: from here a completion with its `wr_id`
    /// may claim it, so this comes before the doorbell.
    #[inline(always)]
    pub(crate) fn publish(&self, r: &Reserved) {
        r.slot.state.store(r.wr_id, Ordering::Release);
    }

    /// Moves the head past the published slots: `n` requests were posted.
    #[inline(always)]
    pub(crate) fn advance(&mut self, n: u32) {
        self.head += n;
        if self.head >= self.span.len {
            self.head -= self.span.len;
            self.lap = Self::next_lap(self.lap);
        }
    }

    /// How far past the head the slot of `wr_id` (one of this ring's) is.
    pub(crate) fn ahead_of(&self, wr_id: u64) -> u32 {
        let pos = (wr_id & wr_id::OFFSET_MASK) as u32 - self.span.start;
        (pos + self.span.len - self.head) % self.span.len
    }

    /// [`advance`](Self::advance) by one.
    #[inline(always)]
    pub(crate) fn advance_one(&mut self) {
        self.head += 1;
        if self.head == self.span.len {
            self.head = 0;
            self.lap = Self::next_lap(self.lap);
        }
    }

    /// Takes back a published slot whose request the provider refused
    /// (so no completion can name it): its payload, and the slot is free.
    pub(crate) fn unpublish(&mut self, r: Reserved) -> Payload {
        // SAFETY: the device never got the `wr_id`, so no poller can claim
        // the slot: it is still ours.
        let payload = unsafe { std::ptr::replace(r.slot.payload.get(), Payload::default()) };
        r.slot.state.store(FREE, Ordering::Release);
        payload
    }

    /// After the device let go of every request (a destroy or a move to
    /// RESET returned): takes the payloads of the outstanding ones (a
    /// poller may claim one first: it keeps it) and returns how many
    /// completions the CQ may still hold for the ring — one per request
    /// taken, and one per slot still held. With `hold`, each taken slot is
    /// held ([`wr_id::held`]) until [`release_held`](Self::release_held),
    /// and the ring starts a new generation at position 0.
    pub(crate) fn teardown(&mut self, hold: bool) -> (Vec<(u64, Payload)>, u32) {
        let held = wr_id::held(self.gen());
        let mut out = Vec::new();
        let mut queued = 0;
        for pos in 0..self.span.len {
            let slot = self.slot(pos);
            let s = slot.state.load(Ordering::Acquire);
            if wr_id::is_outstanding(s) {
                let to = if hold { held } else { CLAIMING };
                if slot
                    .state
                    .compare_exchange(s, to, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
                {
                    // SAFETY: the swap gave us the slot.
                    let payload =
                        unsafe { std::ptr::replace(slot.payload.get(), Payload::default()) };
                    // SAFETY: as above.
                    out.push((unsafe { *slot.user.get() }, payload));
                    if !hold {
                        slot.state.store(FREE, Ordering::Release);
                    }
                    queued += 1;
                }
            } else if is_held(s) {
                // Held by an earlier reset: still owed.
                queued += 1;
                if !hold {
                    slot.state.store(FREE, Ordering::Release);
                }
            }
        }
        self.head = 0;
        self.lap = Self::next_lap(self.lap);
        self.after_unsignaled = false;
        (out, queued)
    }

    /// Where a CQ pays a reset's debt: the ring's slots and the state of
    /// the ones it held.
    pub(crate) fn held_mark(&self) -> HeldMark {
        HeldMark {
            base: self.base,
            len: self.span.len,
            state: wr_id::held(self.gen().wrapping_sub(1)),
        }
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // The owner tore the ring down first (a destroy that failed leaks
        // the ring, with its payloads, by forgetting it). Slots a poller
        // still claims are free again once it is done; the next owner
        // waits for FREE.
        free_span(Span {
            gen: self.gen().wrapping_add(1),
            ..self.span
        });
    }
}

/// Where a ring's slots are: what never changes of it, readable without
/// its claim.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Geometry {
    base: NonNull<Slot>,
    span: Span,
}

// SAFETY: points at 'static slots, read only through their state words.
unsafe impl Send for Geometry {}
// SAFETY: as above.
unsafe impl Sync for Geometry {}

impl Geometry {
    /// Unique among live rings: the span's place in the store.
    pub(crate) fn id(&self) -> u32 {
        self.span.segment << wr_id::OFFSET_BITS | self.span.start
    }

    /// Entries.
    pub(crate) fn depth(&self) -> u32 {
        self.span.len
    }

    /// Slots holding an outstanding request (a snapshot).
    pub(crate) fn outstanding(&self) -> u32 {
        (0..self.span.len)
            .filter(|&pos| {
                // SAFETY: inside the span, 'static.
                let slot = unsafe { &*self.base.as_ptr().add(pos as usize) };
                wr_id::is_outstanding(slot.state.load(Ordering::Acquire))
            })
            .count() as u32
    }
}

/// The slots a reset held, for the CQ to release once paid.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HeldMark {
    base: NonNull<Slot>,
    len: u32,
    state: u64,
}

// SAFETY: points at 'static slots, touched only through their state words.
unsafe impl Send for HeldMark {}
// SAFETY: as above.
unsafe impl Sync for HeldMark {}

impl HeldMark {
    /// The CQ was found empty: the slots held in this state are free
    /// again (a later owner's are in other states: untouched).
    pub(crate) fn release(&self) {
        for pos in 0..self.len {
            // SAFETY: inside the ring's span, 'static.
            let slot = unsafe { &*self.base.as_ptr().add(pos as usize) };
            let _ =
                slot.state
                    .compare_exchange(self.state, FREE, Ordering::Release, Ordering::Relaxed);
        }
    }
}

/// Whether a slot state is one a reset held.
fn is_held(state: u64) -> bool {
    state != FREE && state != CLAIMING && !wr_id::is_outstanding(state)
}

/// A slot claimed by its completion: the claimer owns its payload until
/// this is dropped, which frees the slot (and releases the unsignaled
/// requests before it).
pub(crate) struct Claim {
    slot: &'static Slot,
    wr_id: u64,
}

/// Claims the slot a completion's `wr_id` names: `None` for a `wr_id`
/// not of the safe path, stale, duplicate or foreign.
#[inline(always)]
pub(crate) fn claim(wr_id: u64) -> Option<Claim> {
    let (segment, offset) = wr_id::place(wr_id)?;
    let slot = Slot::at(segment, offset)?;
    slot.state
        .compare_exchange(wr_id, CLAIMING, Ordering::Acquire, Ordering::Relaxed)
        .ok()?;
    Some(Claim { slot, wr_id })
}

impl Claim {
    /// The caller's `wr_id`.
    #[inline(always)]
    pub(crate) fn user(&self) -> u64 {
        // SAFETY: claimed: ours until dropped.
        unsafe { *self.slot.user.get() }
    }

    /// Who posted the request (0: the caller).
    #[inline(always)]
    pub(crate) fn owner(&self) -> u8 {
        // SAFETY: as in `user`.
        unsafe { *self.slot.owner.get() }
    }

    /// The request's payload, in place.
    #[inline(always)]
    pub(crate) fn payload(&mut self) -> &mut Payload {
        // SAFETY: as in `user`; `&mut self` keeps it unique.
        unsafe { &mut *self.slot.payload.get() }
    }

    /// Whether the payload keeps an address handle or is a window's: what
    /// the claimer settles before the buffers are taken.
    #[inline(always)]
    pub(crate) fn has_extras(&self) -> bool {
        // SAFETY: as in `user`.
        unsafe { *self.slot.flags.get() & EXTRAS != 0 }
    }

    /// Whether the slot was filled with nothing to take (no buffers, no
    /// window, as a prepared posting's): dropping the claim then frees it.
    #[inline(always)]
    pub(crate) fn holds_nothing(&self) -> bool {
        // SAFETY: as in `user`.
        unsafe { *self.slot.flags.get() & HOLDS == 0 }
    }

    /// Whether the slot holds nothing, has nothing to settle and releases
    /// nothing before it (a prepared posting's): one test of the flags,
    /// after which [`release_emptied`](Self::release_emptied) frees it.
    #[inline(always)]
    pub(crate) fn is_plain_empty(&self) -> bool {
        // SAFETY: as in `user`.
        unsafe { *self.slot.flags.get() & (AFTER_UNSIGNALED | EXTRAS | HOLDS) == 0 }
    }

    /// Whether nothing is left in the payload (after takes).
    #[inline]
    pub(crate) fn is_empty(&mut self) -> bool {
        matches!(self.payload().held, Held::Sg(SgList::Empty))
    }

    /// Frees the slot whose payload's only buffer was taken out (its place
    /// left empty): the payload is not looked at again.
    #[inline(always)]
    pub(crate) fn release_emptied(mut self) {
        debug_assert!(self.is_empty());
        // SAFETY: as in `user`.
        let flags = unsafe { *self.slot.flags.get() } & !HOLDS;
        let (slot, wr_id) = (self.slot, self.wr_id);
        std::mem::forget(self);
        if flags & (AFTER_UNSIGNALED | EXTRAS) != 0 {
            return release_rest(slot, wr_id, flags);
        }
        slot.state.store(FREE, Ordering::Release);
    }

    /// The address handle and window are settled (taken out).
    pub(crate) fn extras_settled(&mut self) {
        let clear = if self.is_empty() {
            EXTRAS | HOLDS
        } else {
            EXTRAS
        };
        // SAFETY: as in `user`.
        unsafe { *self.slot.flags.get() &= !clear };
    }
}

impl Drop for Claim {
    #[inline(always)]
    fn drop(&mut self) {
        // SAFETY: claimed: ours until the FREE store below.
        let flags = unsafe { *self.slot.flags.get() };
        // HOLDS clear: the payload is empty (see `HOLDS`).
        if flags & (AFTER_UNSIGNALED | EXTRAS | HOLDS) != 0 {
            // By value: the claim's address never escapes, so a poll walk
            // keeps it in registers.
            return release_rest(self.slot, self.wr_id, flags);
        }
        self.slot.state.store(FREE, Ordering::Release);
    }
}

/// [`Drop`] of a claim (of `slot`, by `wr_id`) that still holds something,
/// or releases the unsignaled requests before it.
#[cold]
#[inline(never)]
fn release_rest(slot: &'static Slot, wr_id: u64, flags: u8) {
    if flags & AFTER_UNSIGNALED != 0 {
        release_unsignaled_before(slot, wr_id);
    }
    // SAFETY: claimed by the dropped claim: ours until the FREE store below.
    let left = std::mem::take(unsafe { &mut *slot.payload.get() });
    slot.state.store(FREE, Ordering::Release);
    drop(left);
}

/// Releases the unsignaled requests posted on `slot`'s ring just before
/// it (whose completion was claimed: the device finished them first),
/// walking back while each had one before it too. A request already
/// claimed (its own error completion) or a slot reused since stops it.
#[inline(never)]
fn release_unsignaled_before(slot: &'static Slot, wr_id: u64) {
    // SAFETY: `slot` is claimed by the caller.
    let mut prev = unsafe { *slot.prev.get() };
    let mut id = wr_id;
    loop {
        let Some((segment, offset)) = wr_id::place(id) else {
            return;
        };
        // Position 0's predecessor is the ring's last, a generation back
        // (a ring of one slot is its own predecessor).
        let gen = wr_id::generation(id).wrapping_sub(u32::from(prev >= offset));
        let prev_id = wr_id::encode(gen, segment, prev);
        let Some(p) = Slot::at(segment, prev) else {
            return;
        };
        if p.state
            .compare_exchange(prev_id, CLAIMING, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            return;
        }
        // SAFETY: the swap gave us `p`. An unsignaled request carries only
        // what nobody owns exclusively (frozen buffers, inline data, an
        // address handle): dropped here.
        let (next, flags, payload) = unsafe {
            (
                *p.prev.get(),
                *p.flags.get(),
                std::ptr::replace(p.payload.get(), Payload::default()),
            )
        };
        p.state.store(FREE, Ordering::Release);
        drop(payload);
        if flags & AFTER_UNSIGNALED == 0 {
            return;
        }
        prev = next;
        id = prev_id;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A payload told apart by its (empty) list's capacity.
    fn marked(n: usize) -> Payload {
        Payload::bufs(SgList::Many(Vec::with_capacity(n)), None)
    }

    fn mark(p: &Payload) -> usize {
        match &p.held {
            Held::Sg(SgList::Many(v)) => v.capacity(),
            _ => 0,
        }
    }

    /// Posts `mark` as `user` into the ring's next slot (signaled or not)
    /// and returns its `wr_id`.
    fn post(ring: &mut Ring, user: u64, mark: usize, signaled: bool) -> Option<u64> {
        let r = ring.reserve_head()?;
        ring.fill(&r, user, marked(mark), signaled);
        ring.publish(&r);
        ring.advance_one();
        Some(r.wr_id)
    }

    /// Claims `wr_id` and returns (user, mark) of its payload.
    fn take(wr_id: u64) -> Option<(u64, usize)> {
        let mut c = claim(wr_id)?;
        let m = mark(c.payload());
        let user = c.user();
        drop(std::mem::take(c.payload()));
        Some((user, m))
    }

    #[test]
    fn slots_are_one_cache_line() {
        assert_eq!(std::mem::size_of::<Payload>(), 40);
        assert_eq!(std::mem::size_of::<Slot>(), 64);
        assert_eq!(std::mem::align_of::<Slot>(), 64);
    }

    #[test]
    fn each_completion_claims_its_own_slot_once() {
        let mut ring = Ring::new(4).unwrap();
        let ids: Vec<u64> = (0..4)
            .map(|i| post(&mut ring, i, 10 + i as usize, true).unwrap())
            .collect();
        assert!(
            ring.reserve(0).is_none(),
            "four outstanding fill four slots"
        );
        // Out of order, as threads sharing a CQ claim.
        for &i in &[2usize, 0, 3, 1] {
            assert_eq!(take(ids[i]), Some((i as u64, 10 + i)));
            assert!(claim(ids[i]).is_none(), "claimed twice");
        }
        // The next lap's ids differ: the old ones are stale.
        let again = post(&mut ring, 9, 19, true).unwrap();
        assert_ne!(again, ids[0]);
        assert!(claim(ids[0]).is_none());
        assert_eq!(take(again), Some((9, 19)));
    }

    #[test]
    fn foreign_ids_claim_nothing() {
        let mut ring = Ring::new(2).unwrap();
        let id = post(&mut ring, 1, 1, true).unwrap();
        for bogus in [
            0,
            42,
            id & !wr_id::OURS,
            id ^ (1 << 40),
            wr_id::encode(0, 21, 5),
        ] {
            assert!(claim(bogus).is_none(), "{bogus:#x}");
        }
        assert_eq!(take(id), Some((1, 1)));
    }

    #[test]
    fn a_completion_releases_the_unsignaled_requests_before_it() {
        // u0 s1 u2 u3 s4: s4's claim releases u3 and u2, not s1 (and so
        // not u0 either: s1's claim does).
        let mut ring = Ring::new(8).unwrap();
        let sig = [false, true, false, false, true];
        let ids: Vec<u64> = (0..5)
            .map(|i| post(&mut ring, i as u64, i, sig[i]).unwrap())
            .collect();
        assert_eq!(take(ids[4]), Some((4, 4)));
        for u in [2, 3] {
            assert!(claim(ids[u]).is_none(), "u{u} not released");
        }
        assert!(
            ring.slot(1).state.load(Ordering::Relaxed) == ids[1],
            "s1 untouched"
        );
        assert_eq!(take(ids[1]), Some((1, 1)));
        assert!(claim(ids[0]).is_none(), "u0 released by s1");
        // Its own (error) completion claimed first, an unsignaled request
        // stops the walk of a later one.
        let u = post(&mut ring, 7, 7, false).unwrap();
        let s = post(&mut ring, 8, 8, true).unwrap();
        assert_eq!(take(u), Some((7, 7)));
        assert_eq!(take(s), Some((8, 8)));
    }

    #[test]
    fn the_walk_crosses_the_ring_start_into_the_last_lap() {
        let mut ring = Ring::new(3).unwrap();
        let a = post(&mut ring, 0, 0, true).unwrap();
        take(a).unwrap();
        let b = post(&mut ring, 1, 1, true).unwrap();
        take(b).unwrap();
        // Position 2 unsignaled, then position 0 of the next lap signaled.
        let u = post(&mut ring, 2, 2, false).unwrap();
        let s = post(&mut ring, 3, 3, true).unwrap();
        assert_ne!(wr_id::generation(u), wr_id::generation(s));
        assert_eq!(take(s), Some((3, 3)));
        assert!(claim(u).is_none(), "released across the wrap");
        // A ring of one slot precedes itself.
        let mut one = Ring::new(1).unwrap();
        let u = post(&mut one, 0, 0, false).unwrap();
        assert!(one.reserve(0).is_none());
        take(u).unwrap(); // its own completion (an error, say)
        let s = post(&mut one, 1, 1, true).unwrap();
        assert_eq!(take(s), Some((1, 1)));
    }

    #[test]
    fn a_refused_post_gives_the_payload_back() {
        let mut ring = Ring::new(2).unwrap();
        let r = ring.reserve(0).unwrap();
        let id = r.wr_id;
        ring.fill(&r, 5, marked(5), true);
        ring.publish(&r);
        assert_eq!(mark(&ring.unpublish(r)), 5);
        assert!(claim(id).is_none());
        assert_eq!(ring.reserve(0).unwrap().wr_id, id, "the same slot again");
    }

    #[test]
    fn teardown_takes_what_is_outstanding_and_holds_after_a_reset() {
        let mut ring = Ring::new(4).unwrap();
        let ids: Vec<u64> = (0..3)
            .map(|i| post(&mut ring, i, i as usize, true).unwrap())
            .collect();
        take(ids[1]).unwrap();
        let (out, queued) = ring.teardown(true);
        assert_eq!((out.len(), queued), (2, 2));
        for &id in &ids {
            assert!(claim(id).is_none(), "stale after the reset");
        }
        let mark_ = ring.held_mark();
        // Position 0 is held: no room there until the debt is paid.
        assert!(ring.reserve(0).is_none());
        assert!(ring.head_held());
        mark_.release();
        let new = post(&mut ring, 9, 9, true).unwrap();
        assert_eq!(take(new), Some((9, 9)));
        // A destroy takes the rest and counts held slots as queued.
        let x = post(&mut ring, 1, 1, true).unwrap();
        let (_, _) = ring.teardown(true);
        let (out, queued) = ring.teardown(false);
        assert_eq!((out.len(), queued), (0, 1), "the held slot");
        assert!(claim(x).is_none());
        assert!(ring.reserve(0).is_some());
    }

    #[test]
    fn a_reused_span_starts_above_every_generation_it_had() {
        // A depth no other test asks for: best fit hands this span back.
        let mut ring = Ring::new(37).unwrap();
        let mut last = 0;
        for i in 0..80 {
            last = post(&mut ring, i, 0, true).unwrap();
            take(last).unwrap();
        }
        let span = ring.span;
        drop(ring);
        // Best fit hands the same span back first.
        let mut again = Ring::new(37).unwrap();
        assert_eq!(
            (again.span.segment, again.span.start),
            (span.segment, span.start)
        );
        let first = post(&mut again, 0, 0, true).unwrap();
        assert!(wr_id::generation(first) > wr_id::generation(last));
        assert!(claim(last).is_none());
        take(first).unwrap();
    }
}
