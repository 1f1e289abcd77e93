//! In-flight bookkeeping for the safe data path.
//!
//! Every work queue posted to through the safe API (a QP's send queue, its
//! receive queue, or an SRQ) has a [`WqTable`]: preallocated slots that hold
//! the owned buffers (and address handles) of outstanding work requests. The
//! 64-bit `wr_id` given to the device names the table and the slot:
//!
//! ```text
//! bit 63 = 1 | bit 62 = 0 | bits 61..32 = table id | bits 31..0 = sequence (ring) or index+generation (slab)
//! ```
//!
//! (A `wr_id` with bits 63 and 62 set is a posting of a
//! [`PreparedSend`](crate::PreparedSend): see `queue_pair/prepared_send.rs`.)
//!
//! Table ids are not reused before 2^30 more queues were created, so a
//! stale completion (from a destroyed QP) does not release another table's
//! buffers. Send and receive queues
//! complete in order and use a ring (a completion retires every earlier
//! unsignaled request too, exactly as the hardware frees the slots); an SRQ
//! completes out of order and uses a slab. Completions are *claimed* in any
//! order (threads polling one CQ race for the table lock), so a ring slot of
//! a signaled request is released only by its own completion, and the ring's
//! tail advances over the released prefix.
//!
//! Steady-state posting and polling do not allocate: slots are allocated
//! once, and payloads move in and out.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, MutexGuard};

pub(crate) use crate::buffer::SgList;
use crate::error::{Error, Result};
use crate::memory_window::WindowOp;
use crate::AddressHandle;

pub(crate) const SAFE_BIT: u64 = 1 << 63;
/// With [`SAFE_BIT`]: the `wr_id` is a prepared request's posting.
pub(crate) const PREPARED_BIT: u64 = 1 << 62;
/// Table ids fit below [`PREPARED_BIT`].
const TABLE_ID_MASK: u32 = 0x3fff_ffff;

static NEXT_TABLE_ID: AtomicU32 = AtomicU32::new(1);

/// What a slot holds while its work request is outstanding (40 bytes: a
/// slot stays at 56, pinned by a test). Nothing here is boxed: posting
/// must not allocate, and the rare memory-window request shares the space
/// of the buffers it never has.
#[derive(Debug, Default)]
pub(crate) struct Payload {
    /// The request's buffers, or its memory window.
    pub(crate) held: Held,
    /// Held, never read: keeps a UD request's address handle alive until
    /// the request completed (an `Arc`: cloning it does not allocate).
    #[allow(dead_code)]
    pub(crate) ah: Option<AddressHandle>,
}

impl Payload {
    /// Nothing held (the common case after a claim took the buffers).
    #[inline(always)]
    pub(crate) fn is_empty(&self) -> bool {
        matches!(self.held, Held::Sg(SgList::Empty)) && self.ah.is_none()
    }

    /// A request's buffers and, for a UD send, its address handle.
    #[inline]
    pub(crate) fn bufs(sg: SgList, ah: Option<AddressHandle>) -> Payload {
        Payload {
            held: Held::Sg(sg),
            ah,
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

#[derive(Default)]
struct Slot {
    tag: u32,
    occupied: bool,
    /// Posted by the async dispatcher ([`TableState::dispatch`]).
    dispatched: bool,
    /// Whether the request asked for a completion (ring only; receives and
    /// SRQ entries always do). An unsignaled slot is released by the next
    /// completion of its queue; a signaled one only by its own.
    signaled: bool,
    user_wr_id: u64,
    payload: Payload,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Mode {
    Ring,
    Slab,
}

/// What a table's scratch type says of the table: a send queue's is
/// always a ring, so its data path's mode tests fold away.
pub(crate) trait Kind {
    /// Every table of this type is a [`Mode::Ring`].
    const ALWAYS_RING: bool;
}

impl Kind for () {
    const ALWAYS_RING: bool = false;
}

pub(crate) struct TableState<S> {
    slots: Vec<Slot>,
    head: u32,
    tail: u32,
    /// Ring: how many requests may be outstanding, the capacity less the
    /// entries held for completions a reset may have left in the CQ
    /// ([`reset`](Self::reset)); one field, so that checking room costs
    /// no more with them.
    limit: u32,
    free: Vec<u32>,
    /// Per-queue scratch space for building C work requests (no allocation
    /// on the data path).
    pub(crate) scratch: S,
}

pub(crate) struct WqTable<S> {
    pub(crate) id: u32,
    mode: Mode,
    capacity: u32,
    /// Ring: slot index = sequence & mask. The slot count is a power of two
    /// (at least `capacity`), so indices stay distinct across the wrap of
    /// the 32-bit sequence; `capacity` alone (say 3) would not divide 2^32
    /// and the sequence after 2^32 - 1 would land on a live slot.
    mask: u32,
    pub(crate) queue: &'static str,
    state: Mutex<TableState<S>>,
}

/// The result of retiring a completion's slot (the table's unit tests
/// look at it; a CQ claims into its batch, see [`Retire::claim_into`]).
#[cfg(test)]
pub(crate) struct Retired {
    pub(crate) user_wr_id: u64,
    pub(crate) dispatched: bool,
    pub(crate) payload: Payload,
}

/// What a completion gets from its request's slot.
pub(crate) struct Claimed {
    /// The caller's `wr_id`.
    pub(crate) wr_id: u64,
    /// Whether the async dispatcher posted the request: only it can set
    /// this (no public API reaches [`TableState::dispatch`]), so a request
    /// posted any other way, whatever its `wr_id`, is never taken for one
    /// of the dispatcher's.
    pub(crate) dispatched: bool,
    /// The request's buffers.
    pub(crate) sg: SgList,
}

impl<S> WqTable<S> {
    pub(crate) fn new(mode: Mode, capacity: u32, queue: &'static str, scratch: S) -> Arc<Self> {
        let id = NEXT_TABLE_ID.fetch_add(1, Ordering::Relaxed) & TABLE_ID_MASK;
        let capacity = capacity.clamp(1, 1 << 24);
        let count = match mode {
            Mode::Ring => capacity.next_power_of_two(),
            Mode::Slab => capacity,
        };
        let mut slots = Vec::with_capacity(count as usize);
        slots.resize_with(count as usize, Slot::default);
        let free = match mode {
            Mode::Ring => Vec::new(),
            Mode::Slab => (0..capacity).rev().collect(),
        };
        Arc::new(WqTable {
            id,
            mode,
            capacity,
            mask: count - 1,
            queue,
            state: Mutex::new(TableState {
                slots,
                head: 0,
                tail: 0,
                limit: capacity,
                free,
                scratch,
            }),
        })
    }

    pub(crate) fn capacity(&self) -> u32 {
        self.capacity
    }

    /// parking_lot's lock: its uncontended path is inline (no call on the
    /// data path) and it does not poison (the slots stay consistent if a
    /// thread panicked holding it: every mutation is a single move).
    #[inline]
    pub(crate) fn lock(&self) -> MutexGuard<'_, TableState<S>> {
        self.state.lock()
    }

    pub(crate) fn encode(&self, tag: u32) -> u64 {
        SAFE_BIT | (u64::from(self.id) << 32) | u64::from(tag)
    }

    /// Decodes a device `wr_id` into (table id, tag) when it came from a
    /// table (the safe path, not a prepared request).
    #[inline]
    pub(crate) fn decode(wr_id: u64) -> Option<(u32, u32)> {
        (wr_id & (SAFE_BIT | PREPARED_BIT) == SAFE_BIT)
            .then_some((((wr_id >> 32) as u32) & TABLE_ID_MASK, wr_id as u32))
    }
}

impl<S: Kind> TableState<S> {
    /// Free slots (a ring's less those [held](Self::reset)).
    pub(crate) fn available(&self, mode: Mode) -> u32 {
        match mode {
            Mode::Ring => self.limit - self.head.wrapping_sub(self.tail),
            Mode::Slab => self.free.len() as u32,
        }
    }

    /// The tag the next [`reserve`](Self::reserve) returns (the caller
    /// checked `available`): a single request can be posted under the lock
    /// first and its slot filled after the doorbell.
    #[inline]
    pub(crate) fn next_tag(&self, table: &WqTable<S>) -> u32 {
        match table.mode() {
            Mode::Ring => self.head,
            Mode::Slab => {
                let idx = *self.free.last().expect("caller checked available()");
                // A slab slot's last tag carries its generation (bits
                // 31..24): the next one is one more.
                let generation = (self.slots[idx as usize].tag >> 24).wrapping_add(1) & 0xff;
                (generation << 24) | idx
            }
        }
    }

    /// Reserves a slot for a signaled request and returns its tag (the one
    /// [`next_tag`](Self::next_tag) gave); the caller checked `available`.
    #[inline]
    pub(crate) fn reserve(&mut self, table: &WqTable<S>, user_wr_id: u64, payload: Payload) -> u32 {
        self.reserve_as(table, user_wr_id, payload, true)
    }

    /// [`reserve`](Self::reserve) for a request that is `signaled` or not
    /// (an unsignaled one may carry only what the device cannot write and
    /// the user does not own exclusively: frozen buffers, inline data,
    /// address handles, since the next completion of the queue releases it).
    #[inline]
    pub(crate) fn reserve_as(
        &mut self,
        table: &WqTable<S>,
        user_wr_id: u64,
        payload: Payload,
        signaled: bool,
    ) -> u32 {
        self.reserve_with(table, user_wr_id, payload, signaled, false)
    }

    /// [`reserve_as`](Self::reserve_as), the slot marked as the async
    /// dispatcher's when `dispatched` (see [`dispatch`](Self::dispatch)).
    #[inline(always)]
    pub(crate) fn reserve_with(
        &mut self,
        table: &WqTable<S>,
        user_wr_id: u64,
        payload: Payload,
        signaled: bool,
        dispatched: bool,
    ) -> u32 {
        let tag = self.next_tag(table);
        let idx = match table.mode() {
            Mode::Ring => {
                self.head = self.head.wrapping_add(1);
                (tag & table.mask) as usize
            }
            Mode::Slab => {
                let idx = self.free.pop().expect("caller checked available()");
                idx as usize
            }
        };
        let slot = &mut self.slots[idx];
        debug_assert!(!slot.occupied);
        slot.tag = tag;
        slot.occupied = true;
        slot.dispatched = dispatched;
        slot.signaled = signaled || table.mode() == Mode::Slab;
        slot.user_wr_id = user_wr_id;
        // A free slot's payload is empty (retire, unreserve and take_all
        // take it out): overwrite it without running its drop glue.
        std::mem::forget(std::mem::replace(&mut slot.payload, payload));
        tag
    }

    /// Marks reserved slot `tag` as the async dispatcher's (see
    /// [`Claimed::dispatched`]). Called under the same lock as `reserve`,
    /// so no completion can claim the slot before.
    pub(crate) fn dispatch(&mut self, table: &WqTable<S>, tag: u32) {
        let idx = match table.mode() {
            Mode::Ring => (tag & table.mask) as usize,
            Mode::Slab => (tag & 0xff_ffff) as usize,
        };
        let slot = &mut self.slots[idx];
        debug_assert!(slot.occupied && slot.tag == tag);
        slot.dispatched = true;
    }

    /// Moves the payload into a reserved slot once the device took the request.
    pub(crate) fn store(&mut self, table: &WqTable<S>, tag: u32, payload: Payload) {
        let idx = match table.mode() {
            Mode::Ring => (tag & table.mask) as usize,
            Mode::Slab => (tag & 0xff_ffff) as usize,
        };
        let slot = &mut self.slots[idx];
        debug_assert!(slot.occupied && slot.tag == tag);
        slot.payload = payload;
    }

    /// Undoes the most recent reservations (ring) / a reservation (slab) of
    /// requests the device refused, giving their payloads back.
    pub(crate) fn unreserve(&mut self, table: &WqTable<S>, tag: u32) -> Option<Payload> {
        let idx = match table.mode() {
            Mode::Ring => {
                // Only the newest reservation can be undone.
                if self.head.wrapping_sub(1) != tag {
                    return None;
                }
                self.head = tag;
                (tag & table.mask) as usize
            }
            Mode::Slab => {
                let idx = tag & 0xff_ffff;
                self.free.push(idx);
                idx as usize
            }
        };
        let slot = &mut self.slots[idx];
        slot.occupied = false;
        Some(std::mem::take(&mut slot.payload))
    }

    /// [`retire_slot`](Self::retire_slot), the payload taken out (what
    /// the unit tests look at).
    #[cfg(test)]
    pub(crate) fn retire(&mut self, table: &WqTable<S>, tag: u32) -> Option<Retired> {
        self.retire_slot(table, tag, |slot| Retired {
            user_wr_id: slot.user_wr_id,
            dispatched: slot.dispatched,
            payload: std::mem::take(&mut slot.payload),
        })
    }

    /// Retires the slot named by `tag`: `take` gets the (now free) slot
    /// to take the payload out of, before the ring's bookkeeping. For a
    /// ring, the earlier outstanding *unsignaled* requests (which
    /// never complete on their own) are retired too and their payloads
    /// dropped: the device finished them before this completion, and only
    /// frozen buffers, inline data and address handles may ride on
    /// unsignaled requests, so nothing the user owns exclusively is lost.
    /// Earlier *signaled* requests keep their slots: their completions
    /// were polled but may not be claimed yet (another thread polling the
    /// same CQ), and their buffers go back only with them. The tail then
    /// advances over the released prefix. Stale, unknown or already
    /// retired tags give `None`.
    #[inline(always)]
    fn retire_slot<R>(
        &mut self,
        table: &WqTable<S>,
        tag: u32,
        take: impl FnOnce(&mut Slot) -> R,
    ) -> Option<R> {
        match table.mode() {
            Mode::Ring => {
                let outstanding = self.head.wrapping_sub(self.tail);
                let pos = tag.wrapping_sub(self.tail);
                if pos >= outstanding {
                    return None;
                }
                let idx = (tag & table.mask) as usize;
                let slot = &mut self.slots[idx];
                if !slot.occupied || slot.tag != tag {
                    // Released already: an unsignaled request whose own
                    // (error) completion is claimed after a later one's.
                    return None;
                }
                slot.occupied = false;
                let taken = take(slot);
                // In order, with every request signaled, `tag` is the
                // tail: nothing before it to release.
                if tag != self.tail {
                    self.release_unsignaled_before(table, tag);
                }
                while self.tail != self.head
                    && !self.slots[(self.tail & table.mask) as usize].occupied
                {
                    self.tail = self.tail.wrapping_add(1);
                }
                Some(taken)
            }
            Mode::Slab => {
                let idx = (tag & 0xff_ffff) as usize;
                let slot = self.slots.get_mut(idx)?;
                if !slot.occupied || slot.tag != tag {
                    return None;
                }
                slot.occupied = false;
                let taken = take(slot);
                self.free.push(idx as u32);
                Some(taken)
            }
        }
    }

    /// Releases the outstanding unsignaled requests of a ring before the
    /// one `tag` names (whose completion retires them: the device finished
    /// them first). Invariant: every retire releases the unsignaled
    /// requests before its own, so walking back from `tag` may stop at the
    /// first free slot (everything before it was settled when it was
    /// retired).
    #[inline(never)]
    fn release_unsignaled_before(&mut self, table: &WqTable<S>, tag: u32) {
        let mut seq = tag;
        while seq != self.tail {
            seq = seq.wrapping_sub(1);
            let slot = &mut self.slots[(seq & table.mask) as usize];
            if !slot.occupied {
                break;
            }
            if !slot.signaled {
                slot.occupied = false;
                drop(std::mem::take(&mut slot.payload));
            }
        }
    }

    /// Number of outstanding requests (held entries are none).
    pub(crate) fn outstanding(&self, mode: Mode, capacity: u32) -> u32 {
        match mode {
            Mode::Ring => self.head.wrapping_sub(self.tail),
            Mode::Slab => capacity - self.free.len() as u32,
        }
    }

    /// Takes every outstanding payload (after the queue was destroyed),
    /// and how many completions the CQ may still hold for the queue: one
    /// per outstanding request, and one per entry [held](Self::reset).
    pub(crate) fn take_all(&mut self, table: &WqTable<S>) -> (Vec<(u64, Payload)>, u32) {
        let mut out = Vec::new();
        for slot in &mut self.slots {
            if slot.occupied {
                slot.occupied = false;
                out.push((slot.user_wr_id, std::mem::take(&mut slot.payload)));
            }
        }
        self.tail = self.head;
        let queued = out.len() as u32 + self.held(table);
        self.limit = table.capacity;
        (out, queued)
    }

    /// Ring entries held by [`reset`](Self::reset).
    pub(crate) fn held(&self, table: &WqTable<S>) -> u32 {
        match table.mode {
            Mode::Ring => table.capacity - self.limit,
            Mode::Slab => 0,
        }
    }

    /// After a move to RESET (ring only): takes every outstanding payload,
    /// as [`take_all`](Self::take_all), but holds one entry of the ring per
    /// request it took until the CQ was found empty
    /// ([`release_held`](Self::release_held)). The device forgot the
    /// requests, but the completions of those that had finished may still
    /// be queued; more requests beside them could overrun the CQ. Their
    /// tags stay behind the tail, so those completions claim nothing.
    /// Returns the payloads and how many entries it newly holds.
    pub(crate) fn reset(&mut self, table: &WqTable<S>) -> (Vec<(u64, Payload)>, u32) {
        let before = self.held(table);
        let (out, queued) = self.take_all(table);
        self.limit = table.capacity - queued;
        (out, queued - before)
    }

    /// Gives back up to `n` [held](Self::reset) entries: the CQ was found
    /// empty, so the completions they stood for are gone.
    pub(crate) fn release_held(&mut self, table: &WqTable<S>, n: u32) {
        self.limit = self.limit.saturating_add(n).min(table.capacity);
    }
}

#[cfg(test)]
impl<S: Kind> TableState<S> {
    /// Heap bytes of the slots and the slab's free list (footprint tests).
    pub(crate) fn slot_heap_bytes(&self) -> usize {
        use std::mem::size_of;
        self.slots.capacity() * size_of::<Slot>() + self.free.capacity() * size_of::<u32>()
    }
}

impl<S: Kind> WqTable<S> {
    /// The table's mode (a constant for send queues: see [`Kind`]).
    #[inline(always)]
    pub(crate) fn mode(&self) -> Mode {
        if S::ALWAYS_RING {
            debug_assert_eq!(self.mode, Mode::Ring);
            Mode::Ring
        } else {
            self.mode
        }
    }

    pub(crate) fn check_room(&self, st: &TableState<S>, n: usize) -> Result<()> {
        if (st.available(self.mode()) as usize) < n {
            return Err(self.no_room(st));
        }
        Ok(())
    }

    /// Why [`check_room`](Self::check_room) refused: slots held after a
    /// reset, or a full queue.
    #[cold]
    fn no_room(&self, st: &TableState<S>) -> Error {
        let held = st.held(self);
        if held > 0 {
            Error::QueueHeldAfterReset {
                queue: self.queue,
                held,
                depth: self.capacity,
            }
        } else {
            Error::QueueFull {
                queue: self.queue,
                depth: self.capacity,
            }
        }
    }
}

/// What a completion queue's registry holds per queue: tables of send
/// queues, receive queues and SRQs alike.
pub(crate) trait Retire: Send + Sync {
    fn id(&self) -> u32;
    /// Retires slot `tag`, whose completion has `status`: moves the
    /// request's buffers into `sg` (which must be [`SgList::Empty`]: it is
    /// overwritten, not dropped) and returns the caller's `wr_id` and
    /// whether the async dispatcher posted the request (see
    /// [`Claimed::dispatched`]); `None` for a stale or unknown tag. What
    /// else the request kept alive (address handle, memory window) is
    /// released here, after the table's lock, and a window learns the
    /// status.
    fn claim_into(&self, tag: u32, status: u32, sg: &mut SgList) -> Option<(u64, bool)>;

    /// [`claim_into`](Self::claim_into) as a [`Claimed`].
    #[inline(always)]
    fn claim(&self, tag: u32, status: u32) -> Option<Claimed> {
        let mut sg = SgList::Empty;
        let (wr_id, dispatched) = self.claim_into(tag, status, &mut sg)?;
        Some(Claimed {
            wr_id,
            dispatched,
            sg,
        })
    }
}

/// A queue's in-flight table as a CQ's registry holds it. An enum, not a
/// `dyn Retire`: the claim is inlined into the poll loop (no indirect call,
/// and the claimed buffers go straight into the caller's entry).
#[derive(Clone)]
pub(crate) enum TableRef {
    /// A send queue's.
    Send(Arc<WqTable<crate::queue_pair::SendScratch>>),
    /// A receive queue's or an SRQ's.
    Recv(Arc<WqTable<crate::queue_pair::RecvScratch>>),
}

impl Retire for TableRef {
    #[inline]
    fn id(&self) -> u32 {
        match self {
            TableRef::Send(t) => t.id,
            TableRef::Recv(t) => t.id,
        }
    }
    #[inline(always)]
    fn claim_into(&self, tag: u32, status: u32, sg: &mut SgList) -> Option<(u64, bool)> {
        match self {
            TableRef::Send(t) => t.claim_into(tag, status, sg),
            TableRef::Recv(t) => t.claim_into(tag, status, sg),
        }
    }
}

impl<S: Send + Kind> WqTable<S> {
    /// [`Retire::claim_into`] of this table.
    #[inline(always)]
    fn claim_into(&self, tag: u32, status: u32, sg: &mut SgList) -> Option<(u64, bool)> {
        // What the request kept alive besides its buffers: the address
        // handle is dropped and a window told the status after the lock.
        let mut ah = None;
        let mut window = None;
        let mut st = self.lock();
        let ids = st.retire_slot(
            self,
            tag,
            #[inline(always)]
            |slot| {
                // The buffers go straight into `sg` (which is empty: nothing
                // to drop); the slot's payload is left empty. (`ah` and
                // `window` are `None` here: their old values are forgotten,
                // which spares a drop test.)
                std::mem::forget(std::mem::replace(&mut ah, slot.payload.ah.take()));
                if let Held::Sg(held) = &mut slot.payload.held {
                    std::mem::forget(std::mem::replace(sg, std::mem::take(held)));
                } else if let Held::Window(op) = std::mem::take(&mut slot.payload.held) {
                    std::mem::forget(window.replace(op));
                }
                (slot.user_wr_id, slot.dispatched)
            },
        );
        drop(st);
        if ah.is_some() {
            drop(ah);
        } else {
            // Forgetting a `None` leaks nothing and skips its (outlined)
            // drop glue on the common path.
            std::mem::forget(ah);
        }
        if let Some(op) = window {
            op.complete(status);
        }
        ids
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tagged(st: &TableState<()>, table: &WqTable<()>, tag: u32) -> u64 {
        let idx = (tag & table.mask) as usize;
        assert!(st.slots[idx].occupied && st.slots[idx].tag == tag);
        st.slots[idx].user_wr_id
    }

    /// A slot is the tag and flags (8 bytes), the caller's `wr_id` (8) and
    /// the payload (40): the buffers (an `SgList`, 32, whose tag's niche
    /// also holds a memory window, which never comes with buffers) and a
    /// UD request's address handle (8, an `Arc`). It was 72 bytes with
    /// the window beside the buffers.
    #[test]
    fn slots_stay_small() {
        use std::mem::size_of;
        assert_eq!(size_of::<SgList>(), 32);
        assert_eq!(
            size_of::<Held>(),
            size_of::<SgList>(),
            "window in the niche"
        );
        assert_eq!(size_of::<Payload>(), 40);
        assert_eq!(size_of::<Slot>(), 56);
    }

    #[test]
    fn table_ids_stay_clear_of_the_prepared_bit() {
        let table = WqTable::new(Mode::Ring, 1, "send queue", ());
        for id in [0, 1, TABLE_ID_MASK] {
            let wr_id = SAFE_BIT | (u64::from(id) << 32) | 7;
            assert_eq!(wr_id & PREPARED_BIT, 0);
            assert_eq!(WqTable::<()>::decode(wr_id), Some((id, 7)));
        }
        assert_eq!(table.encode(5) & PREPARED_BIT, 0);
        assert_eq!(WqTable::<()>::decode(table.encode(5)), Some((table.id, 5)));
        assert_eq!(WqTable::<()>::decode(SAFE_BIT | PREPARED_BIT | 8), None);
        assert_eq!(WqTable::<()>::decode(42), None);
    }

    #[test]
    fn ring_sequence_wraps_onto_distinct_slots() {
        // Depth 3 does not divide 2^32: the slots must still be distinct
        // for every outstanding sequence number across the wrap.
        let table = WqTable::new(Mode::Ring, 3, "send queue", ());
        let mut st = table.lock();
        st.head = u32::MAX - 1;
        st.tail = u32::MAX - 1;
        let a = st.reserve(&table, 10, Payload::default());
        let b = st.reserve_as(&table, 11, Payload::default(), false);
        let c = st.reserve_as(&table, 12, Payload::default(), false);
        assert_eq!((a, b, c), (u32::MAX - 1, u32::MAX, 0));
        assert_eq!(st.available(Mode::Ring), 0);
        assert_eq!(
            [a, b, c].map(|t| tagged(&st, &table, t)),
            [10, 11, 12],
            "a wrapped sequence overwrote a live slot"
        );
        assert_eq!(st.retire(&table, a).map(|r| r.user_wr_id), Some(10));
        let d = st.reserve(&table, 13, Payload::default());
        assert_eq!([b, c, d].map(|t| tagged(&st, &table, t)), [11, 12, 13]);
        // Retiring the newest retires the unsignaled ones before it.
        assert_eq!(st.retire(&table, d).map(|r| r.user_wr_id), Some(13));
        assert_eq!(st.outstanding(Mode::Ring, table.capacity()), 0);
        assert!(st.retire(&table, b).is_none(), "a retired tag came back");
    }

    #[test]
    fn ring_unreserve_only_the_newest() {
        let table = WqTable::new(Mode::Ring, 5, "send queue", ());
        let mut st = table.lock();
        let a = st.reserve(&table, 1, Payload::default());
        let b = st.reserve(&table, 2, Payload::default());
        assert!(st.unreserve(&table, a).is_none());
        assert!(st.unreserve(&table, b).is_some());
        assert_eq!(st.outstanding(Mode::Ring, table.capacity()), 1);
        assert_eq!(st.retire(&table, a).map(|r| r.user_wr_id), Some(1));
    }

    #[test]
    fn next_tag_is_the_tag_reserve_gives() {
        // The single-request posts send under next_tag and reserve after
        // the doorbell: the two must agree in both modes, across the ring's
        // wrap and a slab slot's reuse.
        for mode in [Mode::Ring, Mode::Slab] {
            let table = WqTable::new(mode, 3, "queue", ());
            let mut st = table.lock();
            if mode == Mode::Ring {
                st.head = u32::MAX;
                st.tail = u32::MAX;
            }
            for round in 0..5u64 {
                let expect = st.next_tag(&table);
                let tag = st.reserve(&table, round, Payload::default());
                assert_eq!(tag, expect, "{mode:?} round {round}");
                assert_eq!(st.retire(&table, tag).map(|r| r.user_wr_id), Some(round));
            }
        }
    }

    #[test]
    fn only_a_dispatched_slot_says_so_and_reuse_clears_it() {
        for mode in [Mode::Ring, Mode::Slab] {
            let table = WqTable::new(mode, 1, "queue", ());
            let mut st = table.lock();
            let tag = st.reserve(&table, 7, Payload::default());
            st.dispatch(&table, tag);
            let r = st.retire(&table, tag).unwrap();
            assert_eq!((r.user_wr_id, r.dispatched), (7, true), "{mode:?}");
            // The same slot, reserved again by a direct post with the same
            // wr_id: not the dispatcher's.
            let tag = st.reserve(&table, 7, Payload::default());
            let r = st.retire(&table, tag).unwrap();
            assert_eq!((r.user_wr_id, r.dispatched), (7, false), "{mode:?}");
        }
    }

    #[test]
    fn slab_reuse_gets_a_fresh_tag() {
        // One slot, reused: every reservation must get a tag no earlier one
        // had (the generation advances), or a stale completion of a retired
        // request would retire the live one.
        let table = WqTable::new(Mode::Slab, 1, "srq", ());
        let mut st = table.lock();
        let mut seen = Vec::new();
        for round in 0..300u64 {
            let tag = st.reserve(&table, round, Payload::default());
            if let Some(&stale) = seen.last() {
                assert!(
                    st.retire(&table, stale).is_none(),
                    "stale tag {stale:#x} matched"
                );
            }
            assert_ne!(seen.last(), Some(&tag), "round {round} reused the last tag");
            assert_eq!(st.retire(&table, tag).map(|r| r.user_wr_id), Some(round));
            seen.push(tag);
        }
    }

    /// A payload told apart by its (empty) list's capacity: no device
    /// needed to see which request's payload came back.
    fn marked(n: usize) -> Payload {
        Payload::bufs(SgList::Many(Vec::with_capacity(n)), None)
    }

    fn mark(r: Option<Retired>) -> Option<(u64, usize)> {
        r.map(|r| match r.payload.held {
            Held::Sg(SgList::Many(v)) => (r.user_wr_id, v.capacity()),
            _ => (r.user_wr_id, 0),
        })
    }

    #[test]
    fn ring_out_of_order_claims_keep_each_signaled_payload() {
        // Thread B claims completion n+1 before thread A claims n: A's
        // buffers must still come back with A's completion.
        let table = WqTable::new(Mode::Ring, 4, "send queue", ());
        let mut st = table.lock();
        let a = st.reserve(&table, 1, marked(11));
        let b = st.reserve(&table, 2, marked(12));
        assert_eq!(mark(st.retire(&table, b)), Some((2, 12)));
        assert_eq!(
            st.outstanding(Mode::Ring, table.capacity()),
            2,
            "tail held by a"
        );
        assert_eq!(mark(st.retire(&table, a)), Some((1, 11)));
        assert_eq!(st.outstanding(Mode::Ring, table.capacity()), 0);
        assert!(st.retire(&table, a).is_none() && st.retire(&table, b).is_none());
    }

    #[test]
    fn ring_a_completion_retires_only_earlier_unsignaled_requests() {
        // u0 s1 u2 s3 u4 s5: s5 claimed first releases u4, u2 and u0, not
        // s1 or s3; s3 then releases nothing more; s1 frees the prefix.
        let table = WqTable::new(Mode::Ring, 8, "send queue", ());
        let mut st = table.lock();
        let sig = [false, true, false, true, false, true];
        let tags: Vec<u32> = (0..6)
            .map(|i| st.reserve_as(&table, i as u64, marked(10 + i), sig[i]))
            .collect();
        assert_eq!(mark(st.retire(&table, tags[5])), Some((5, 15)));
        for u in [0, 2, 4] {
            assert!(st.retire(&table, tags[u]).is_none(), "u{u} was released");
        }
        // u0 went, so the tail moved up to s1.
        assert_eq!(st.outstanding(Mode::Ring, table.capacity()), 5);
        assert_eq!(mark(st.retire(&table, tags[3])), Some((3, 13)));
        assert_eq!(mark(st.retire(&table, tags[1])), Some((1, 11)));
        assert_eq!(st.outstanding(Mode::Ring, table.capacity()), 0);
        // The ring is usable again, across its end.
        for round in 0..20u64 {
            let t = st.reserve(&table, round, marked(1));
            assert_eq!(mark(st.retire(&table, t)), Some((round, 1)));
        }
    }

    #[test]
    fn ring_an_unsignaled_requests_own_completion_is_claimed_once() {
        // Errors complete unsignaled requests too (flushes): claimed before
        // the later completion it gives its payload; claimed after, nothing.
        let table = WqTable::new(Mode::Ring, 4, "send queue", ());
        let mut st = table.lock();
        let u = st.reserve_as(&table, 7, marked(7), false);
        let s = st.reserve(&table, 8, marked(8));
        assert_eq!(mark(st.retire(&table, u)), Some((7, 7)));
        assert_eq!(mark(st.retire(&table, s)), Some((8, 8)));
        let u = st.reserve_as(&table, 9, marked(9), false);
        let s = st.reserve(&table, 10, marked(10));
        assert_eq!(mark(st.retire(&table, s)), Some((10, 10)));
        assert!(st.retire(&table, u).is_none());
        assert_eq!(st.outstanding(Mode::Ring, table.capacity()), 0);
    }

    #[test]
    fn ring_random_claim_order_hands_every_signaled_payload_back_once() {
        // Many rounds of a full ring with random signaling, claimed in a
        // random order (a small LCG: deterministic, no dependency).
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            rng = rng.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            (rng >> 33) as usize
        };
        let table = WqTable::new(Mode::Ring, 13, "send queue", ());
        let mut st = table.lock();
        st.head = u32::MAX - 40;
        st.tail = u32::MAX - 40;
        let mut id = 0u64;
        for _ in 0..200 {
            let n = 1 + next() % 13;
            let mut signaled = Vec::new();
            for i in 0..n {
                // The last one is signaled: an unsignaled tail would wait
                // for the next round's completion.
                let sig = i + 1 == n || next() % 3 == 0;
                let tag = st.reserve_as(&table, id, marked(id as usize % 64), sig);
                if sig {
                    signaled.push((tag, id));
                }
                id += 1;
            }
            while !signaled.is_empty() {
                let (tag, wr_id) = signaled.swap_remove(next() % signaled.len());
                assert_eq!(
                    mark(st.retire(&table, tag)),
                    Some((wr_id, wr_id as usize % 64)),
                    "signaled request {wr_id} lost its payload"
                );
                assert!(st.retire(&table, tag).is_none(), "{wr_id} claimed twice");
            }
            assert_eq!(st.outstanding(Mode::Ring, table.capacity()), 0);
        }
    }

    #[test]
    fn a_reset_holds_a_slot_per_outstanding_request_until_released() {
        // Capacity 4, three outstanding (one claimed out of order): the
        // reset takes the payloads of the three and holds three slots.
        let table = WqTable::new(Mode::Ring, 4, "send queue", ());
        let mut st = table.lock();
        let old: Vec<u32> = (0..4).map(|i| st.reserve(&table, i, marked(1))).collect();
        assert!(st.retire(&table, old[1]).is_some());
        let (taken, held) = st.reset(&table);
        assert_eq!((taken.len(), held), (3, 3));
        assert_eq!(st.available(Mode::Ring), 1, "three slots held");
        let e = table.check_room(&st, 2).unwrap_err();
        assert!(
            matches!(
                e,
                Error::QueueHeldAfterReset {
                    held: 3,
                    depth: 4,
                    ..
                }
            ),
            "{e}"
        );
        // The stale completions of the reset requests claim nothing.
        for &t in &old {
            assert!(st.retire(&table, t).is_none(), "stale tag {t} claimed");
        }
        // A new request goes behind the held slots and completes normally.
        let new = st.reserve(&table, 9, marked(9));
        assert_eq!(mark(st.retire(&table, new)), Some((9, 9)));
        assert_eq!(st.available(Mode::Ring), 1, "still held");
        // A second reset with one more outstanding holds it too.
        let more = st.reserve(&table, 10, marked(10));
        let (taken, newly) = st.reset(&table);
        assert_eq!((taken.len(), newly), (1, 1));
        assert!(st.retire(&table, more).is_none());
        assert_eq!(st.available(Mode::Ring), 0);
        assert!(table.check_room(&st, 1).is_err());
        // Paid in two debts (the CQ found empty): all slots back.
        st.release_held(&table, 3);
        assert_eq!(st.available(Mode::Ring), 3);
        st.release_held(&table, 1);
        assert_eq!(st.available(Mode::Ring), 4);
        assert_eq!(st.outstanding(Mode::Ring, 4), 0);
        // Past the ring's end, as usual.
        for round in 0..10u64 {
            let t = st.reserve(&table, round, marked(1));
            assert_eq!(mark(st.retire(&table, t)), Some((round, 1)));
        }
        // Held slots count in take_all (a destroy charges them to the CQ).
        let _ = st.reserve(&table, 1, marked(1));
        let (_, held) = st.reset(&table);
        assert_eq!(held, 1);
        let _ = st.reserve(&table, 2, marked(1));
        let (taken, queued) = st.take_all(&table);
        assert_eq!((taken.len(), queued), (1, 2), "one held, one outstanding");
        assert_eq!(st.available(Mode::Ring), 4);
    }

    #[test]
    fn releasing_more_than_held_releases_what_is_held() {
        let table = WqTable::new(Mode::Ring, 2, "receive queue", ());
        let mut st = table.lock();
        let _ = st.reserve(&table, 1, marked(1));
        let (_, held) = st.reset(&table);
        assert_eq!(held, 1);
        let t = st.reserve(&table, 2, marked(2));
        st.release_held(&table, 5);
        assert_eq!(st.available(Mode::Ring), 1, "the new request stays");
        assert_eq!(mark(st.retire(&table, t)), Some((2, 2)));
        assert_eq!(st.available(Mode::Ring), 2);
    }
}
