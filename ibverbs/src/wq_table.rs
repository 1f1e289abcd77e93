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
//! completes out of order and uses a slab.
//!
//! Steady-state posting and polling do not allocate: slots are allocated
//! once, and payloads move in and out.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, MutexGuard};

use crate::buffer::Buf;
use crate::error::{Error, Result};
use crate::memory_window::WindowOp;
use crate::AddressHandle;

pub(crate) const SAFE_BIT: u64 = 1 << 63;
/// With [`SAFE_BIT`]: the `wr_id` is a prepared request's posting.
pub(crate) const PREPARED_BIT: u64 = 1 << 62;
/// Table ids fit below [`PREPARED_BIT`].
const TABLE_ID_MASK: u32 = 0x3fff_ffff;

static NEXT_TABLE_ID: AtomicU32 = AtomicU32::new(1);

/// The buffers a work request owns until it completes.
#[derive(Debug, Default)]
pub enum SgList {
    /// No buffer (inline data, zero-length requests).
    #[default]
    Empty,
    /// One buffer.
    One(Buf),
    /// Several buffers (scatter/gather); the `Vec` comes back for reuse.
    Many(Vec<Buf>),
}

impl SgList {
    pub(crate) fn len(&self) -> usize {
        match self {
            SgList::Empty => 0,
            SgList::One(_) => 1,
            SgList::Many(v) => v.len(),
        }
    }
    pub(crate) fn iter(&self) -> impl Iterator<Item = &Buf> {
        let (one, many): (Option<&Buf>, &[Buf]) = match self {
            SgList::Empty => (None, &[]),
            SgList::One(b) => (Some(b), &[]),
            SgList::Many(v) => (None, v),
        };
        one.into_iter().chain(many.iter())
    }
    /// The buffer of a one-buffer list, if it is a
    /// [`LocalBuffer`](crate::LocalBuffer) (what a single-buffer request
    /// gives back on completion).
    #[inline]
    pub fn into_local(self) -> Option<crate::LocalBuffer> {
        match self {
            SgList::One(b) => b.into_local(),
            _ => None,
        }
    }
    /// Total bytes.
    pub fn total_len(&self) -> u64 {
        self.iter().map(|b| b.len() as u64).sum()
    }
    /// Whether every buffer is a [`FrozenBuffer`](crate::FrozenBuffer) (or
    /// there is none): such requests may be unsignaled.
    pub(crate) fn all_frozen(&self) -> bool {
        self.iter().all(|b| matches!(b, Buf::Frozen(_)))
    }
}

/// What a slot holds while its work request is outstanding.
#[derive(Debug, Default)]
pub(crate) struct Payload {
    pub(crate) sg: SgList,
    /// Held, never read: keeps a UD request's address handle alive until
    /// the request completed.
    #[allow(dead_code)]
    pub(crate) ah: Option<AddressHandle>,
    /// Objects a request needs alive until it completed.
    pub(crate) keep: Option<Keep>,
}

/// What a request keeps alive besides its buffers, told how the request
/// ended: released with the completion's status, or dropped without one
/// (which the object must treat as "it may or may not have run").
#[derive(Debug)]
pub(crate) enum Keep {
    /// A memory-window bind or invalidate: the window, which the status
    /// settles (its regions are released only on success).
    Window(WindowOp),
}

impl Keep {
    /// The request's completion arrived with `status`.
    fn release(self, status: u32) {
        match self {
            Keep::Window(op) => op.complete(status),
        }
    }
}

#[derive(Default)]
struct Slot {
    tag: u32,
    occupied: bool,
    /// Posted by the async dispatcher ([`TableState::dispatch`]).
    dispatched: bool,
    user_wr_id: u64,
    payload: Payload,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Mode {
    Ring,
    Slab,
}

pub(crate) struct TableState<S> {
    slots: Vec<Slot>,
    head: u32,
    tail: u32,
    free: Vec<u32>,
    gens: Vec<u8>,
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

/// The result of retiring a completion's slot.
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
        let (free, gens) = match mode {
            Mode::Ring => (Vec::new(), Vec::new()),
            Mode::Slab => ((0..capacity).rev().collect(), vec![0; capacity as usize]),
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
                free,
                gens,
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

impl<S> TableState<S> {
    /// Free slots.
    pub(crate) fn available(&self, mode: Mode, capacity: u32) -> u32 {
        match mode {
            Mode::Ring => capacity - self.head.wrapping_sub(self.tail),
            Mode::Slab => self.free.len() as u32,
        }
    }

    /// The tag the next [`reserve`](Self::reserve) returns (the caller
    /// checked `available`): a single request can be posted under the lock
    /// first and its slot filled after the doorbell.
    #[inline]
    pub(crate) fn next_tag(&self, table: &WqTable<S>) -> u32 {
        match table.mode {
            Mode::Ring => self.head,
            Mode::Slab => {
                let idx = *self.free.last().expect("caller checked available()");
                (u32::from(self.gens[idx as usize].wrapping_add(1)) << 24) | idx
            }
        }
    }

    /// Reserves a slot and returns its tag (the one [`next_tag`](Self::next_tag)
    /// gave); the caller checked `available`.
    pub(crate) fn reserve(&mut self, table: &WqTable<S>, user_wr_id: u64, payload: Payload) -> u32 {
        let tag = self.next_tag(table);
        let idx = match table.mode {
            Mode::Ring => {
                self.head = self.head.wrapping_add(1);
                (tag & table.mask) as usize
            }
            Mode::Slab => {
                let idx = self.free.pop().expect("caller checked available()");
                self.gens[idx as usize] = (tag >> 24) as u8;
                idx as usize
            }
        };
        let slot = &mut self.slots[idx];
        debug_assert!(!slot.occupied);
        slot.tag = tag;
        slot.occupied = true;
        slot.dispatched = false;
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
        let idx = match table.mode {
            Mode::Ring => (tag & table.mask) as usize,
            Mode::Slab => (tag & 0xff_ffff) as usize,
        };
        let slot = &mut self.slots[idx];
        debug_assert!(slot.occupied && slot.tag == tag);
        slot.dispatched = true;
    }

    /// Moves the payload into a reserved slot once the device took the request.
    pub(crate) fn store(&mut self, table: &WqTable<S>, tag: u32, payload: Payload) {
        let idx = match table.mode {
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
        let idx = match table.mode {
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

    /// Retires the slot named by `tag`. For a ring, earlier outstanding
    /// requests (unsignaled ones, which never complete on their own) are
    /// retired too and their payloads dropped: only frozen buffers and
    /// address handles may ride on unsignaled requests, so nothing the user
    /// owns exclusively is lost. Stale or unknown tags give `None`.
    pub(crate) fn retire(&mut self, table: &WqTable<S>, tag: u32) -> Option<Retired> {
        match table.mode {
            Mode::Ring => {
                let outstanding = self.head.wrapping_sub(self.tail);
                let pos = tag.wrapping_sub(self.tail);
                if pos >= outstanding {
                    return None;
                }
                while self.tail != tag {
                    let idx = (self.tail & table.mask) as usize;
                    let slot = &mut self.slots[idx];
                    slot.occupied = false;
                    drop(std::mem::take(&mut slot.payload));
                    self.tail = self.tail.wrapping_add(1);
                }
                let idx = (tag & table.mask) as usize;
                self.tail = self.tail.wrapping_add(1);
                let slot = &mut self.slots[idx];
                slot.occupied = false;
                Some(Retired {
                    user_wr_id: slot.user_wr_id,
                    dispatched: slot.dispatched,
                    payload: std::mem::take(&mut slot.payload),
                })
            }
            Mode::Slab => {
                let idx = (tag & 0xff_ffff) as usize;
                let slot = self.slots.get_mut(idx)?;
                if !slot.occupied || slot.tag != tag {
                    return None;
                }
                slot.occupied = false;
                self.free.push(idx as u32);
                Some(Retired {
                    user_wr_id: slot.user_wr_id,
                    dispatched: slot.dispatched,
                    payload: std::mem::take(&mut slot.payload),
                })
            }
        }
    }

    /// Number of outstanding requests.
    pub(crate) fn outstanding(&self, mode: Mode, capacity: u32) -> u32 {
        capacity - self.available(mode, capacity)
    }

    /// Takes every outstanding payload (after the queue was destroyed).
    pub(crate) fn take_all(&mut self) -> Vec<(u64, Payload)> {
        let mut out = Vec::new();
        for slot in &mut self.slots {
            if slot.occupied {
                slot.occupied = false;
                out.push((slot.user_wr_id, std::mem::take(&mut slot.payload)));
            }
        }
        self.tail = self.head;
        out
    }
}

impl<S> WqTable<S> {
    pub(crate) fn mode(&self) -> Mode {
        self.mode
    }

    pub(crate) fn check_room(&self, st: &TableState<S>, n: usize) -> Result<()> {
        if (st.available(self.mode, self.capacity) as usize) < n {
            return Err(Error::QueueFull {
                queue: self.queue,
                depth: self.capacity,
            });
        }
        Ok(())
    }
}

/// Type-erased access for completion queues, which see tables of send
/// queues, receive queues and SRQs alike.
pub(crate) trait Retire: Send + Sync {
    fn id(&self) -> u32;
    /// Retires slot `tag`, whose completion has `status`: the caller's
    /// `wr_id` and the request's buffers. What else it kept alive (address
    /// handle, memory window) is released here, after the table's lock,
    /// and a window learns the status.
    fn retire(&self, tag: u32, status: u32) -> Option<Claimed>;
}

impl<S: Send> Retire for WqTable<S> {
    fn id(&self) -> u32 {
        self.id
    }
    fn retire(&self, tag: u32, status: u32) -> Option<Claimed> {
        let r = self.lock().retire(self, tag)?;
        // The lock is released (the guard was a temporary): the address
        // handle and memory window the request kept alive go here.
        let Payload { sg, ah, keep } = r.payload;
        if ah.is_none() && keep.is_none() {
            // Nothing to release: forgetting two `None`s leaks nothing and
            // skips their (outlined) drop glue on the common path.
            std::mem::forget((ah, keep));
        } else {
            drop(ah);
            if let Some(keep) = keep {
                keep.release(status);
            }
        }
        Some(Claimed {
            wr_id: r.user_wr_id,
            dispatched: r.dispatched,
            sg,
        })
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
        let b = st.reserve(&table, 11, Payload::default());
        let c = st.reserve(&table, 12, Payload::default());
        assert_eq!((a, b, c), (u32::MAX - 1, u32::MAX, 0));
        assert_eq!(st.available(Mode::Ring, table.capacity()), 0);
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
}
