//! The in-flight tables of the queues reporting to one CQ, by table id.
//!
//! Every completion polled through the safe API looks its table up here
//! (the id in bits 61..32 of its `wr_id`, see `wq_table.rs`), so a lookup
//! must cost the same with one queue reporting to the CQ as with
//! thousands: an open-addressed table with linear probing, indexed by a
//! Fibonacci (multiplicative) hash of the id, kept at most half full.
//! A lookup is one multiply, one shift and, almost always, one probe.
//! Insertions and removals are O(1) expected too (removal shifts the
//! entries of its probe run back: no tombstones, so lookups of absent ids
//! stop at the first empty slot however many queues came and went).
//!
//! It also keeps what the CQ is owed: completions that a queue moved to
//! RESET, or destroyed, may have left queued (DESIGN.md, "A CQ holds a
//! completion of every request"), charged until a poll finds the CQ empty.
//!
//! Why not `std::collections::HashMap` with a cheap hasher: its SIMD group
//! probe and control bytes cost more instructions per hit than one
//! multiply and a compare, and ids here are small integers handed out in
//! sequence, for which Fibonacci hashing is the textbook fit (consecutive
//! ids land far apart; ids in a stride, as when many CQs each get every
//! n-th queue, still spread, because the index comes from the product's
//! high bits, which every bit of the id reaches).

use crate::wq_table::{Retire, TableRef};

/// 2^64 / φ, odd: the Fibonacci hashing multiplier.
const FIB: u64 = 0x9e37_79b9_7f4a_7c15;
/// The smallest table allocated (slots).
const MIN_SLOTS: usize = 8;

struct Entry<T> {
    id: u32,
    /// The depth the queue asked for (what the CQ must hold for it).
    depth: u32,
    /// `None`: the slot is empty (`id` and `depth` mean nothing then).
    table: Option<T>,
}

impl<T> Entry<T> {
    const EMPTY: Entry<T> = Entry {
        id: 0,
        depth: 0,
        table: None,
    };
}

/// Completions a queue may have left in the CQ when it was reset or
/// destroyed: at most `n`, all queued before debt `gen` was recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Debt {
    gen: u64,
    /// `Some(id)`: a reset of the registered queue `id`, whose ring holds
    /// `n` slots until paid (its depth still covers them). `None`: a
    /// destroyed queue, charged to the CQ (`Registry::owed`).
    queue: Option<u32>,
    n: u32,
}

/// The tables of the queues reporting to one CQ (see the module docs),
/// the sum of their depths, and what reset or destroyed queues may have
/// left queued. Generic over the table type for the tests; a CQ's holds
/// [`TableRef`]s (static dispatch).
pub(crate) struct Registry<T = TableRef> {
    /// Empty, or a power of two of at least [`MIN_SLOTS`] slots, at most
    /// half of them taken: every probe run ends at an empty slot.
    slots: Box<[Entry<T>]>,
    /// `64 - log2(slots.len())`: the hash's top bits index the slots.
    shift: u32,
    len: usize,
    /// The sum of the depths registered: `CqTooSmall` compares it with
    /// the CQ's capacity without walking the entries.
    depth_sum: u64,
    /// Unpaid debts, oldest first (a handful at most: each is paid by
    /// the next poll that finds the CQ empty).
    debts: Vec<Debt>,
    /// The sum of the destroyed queues' debts: charged beside
    /// `depth_sum` until paid.
    owed: u64,
    /// The last debt's generation.
    gen: u64,
}

impl<T: Retire> Registry<T> {
    /// An empty registry; allocates nothing until the first insertion.
    pub(crate) fn new() -> Registry<T> {
        Registry {
            slots: Box::new([]),
            // Any index this gives is out of bounds of the empty slots.
            shift: 63,
            len: 0,
            depth_sum: 0,
            debts: Vec::new(),
            owed: 0,
            gen: 0,
        }
    }

    /// The slot where the probe for `id` starts.
    #[inline(always)]
    fn home(&self, id: u32) -> usize {
        (u64::from(id).wrapping_mul(FIB) >> self.shift) as usize
    }

    #[inline(always)]
    fn mask(&self) -> usize {
        self.slots.len().wrapping_sub(1)
    }

    /// The slot holding `id` and its table, if registered.
    #[inline(always)]
    fn probe(&self, id: u32) -> Option<(usize, &T)> {
        let mask = self.mask();
        let mut i = self.home(id);
        loop {
            // `get`: the empty registry has no slot at all (the only case
            // where `i` can be out of bounds) and gives `None` here.
            let e = self.slots.get(i)?;
            let t = e.table.as_ref()?;
            if e.id == id {
                return Some((i, t));
            }
            // Terminates: at most half the slots are taken.
            i = (i + 1) & mask;
        }
    }

    /// The table registered under `id`: `None` when no queue reporting to
    /// this CQ has that id (a raw `wr_id`, a destroyed queue's stale
    /// completion).
    #[inline(always)]
    pub(crate) fn get(&self, id: u32) -> Option<&T> {
        self.probe(id).map(|(_, t)| t)
    }

    /// Whether `id` is registered.
    pub(crate) fn contains(&self, id: u32) -> bool {
        self.probe(id).is_some()
    }

    /// The sum of the registered depths.
    pub(crate) fn depth_sum(&self) -> u64 {
        self.depth_sum
    }

    /// The completions destroyed queues may have left queued (charged
    /// beside [`depth_sum`](Self::depth_sum) until paid).
    pub(crate) fn owed(&self) -> u64 {
        self.owed
    }

    /// Records that up to `n` completions of queue `id` may be queued
    /// although its slots were released: by a reset (`destroyed` false:
    /// the queue's ring holds `n` slots meanwhile) or a destruction (the
    /// CQ is charged `n`). Returns the debt's generation, which
    /// [`pay`](Self::pay) takes once a poll that began after this call
    /// found the CQ empty; `None` when `n` is 0 (nothing owed).
    pub(crate) fn owe(&mut self, id: u32, n: u32, destroyed: bool) -> Option<u64> {
        if n == 0 {
            return None;
        }
        self.gen += 1;
        let queue = if destroyed {
            self.owed += u64::from(n);
            None
        } else {
            Some(id)
        };
        self.debts.push(Debt {
            gen: self.gen,
            queue,
            n,
        });
        Some(self.gen)
    }

    /// Pays every debt of generation `gen` or older: what they stood for
    /// is no longer queued. Calls `release(table, n)` for each reset
    /// queue still registered (its ring gives `n` slots back; call order:
    /// oldest first). Returns whether debts remain.
    pub(crate) fn pay(&mut self, gen: u64, mut release: impl FnMut(&T, u32)) -> bool {
        let paid = self.debts.iter().take_while(|d| d.gen <= gen).count();
        for i in 0..paid {
            let d = self.debts[i];
            match d.queue {
                None => self.owed -= u64::from(d.n),
                Some(id) => {
                    // A queue destroyed since carried its held slots into
                    // a debt of its own (later, so unpaid here).
                    if let Some((_, t)) = self.probe(id) {
                        release(t, d.n);
                    }
                }
            }
        }
        self.debts.drain(..paid);
        !self.debts.is_empty()
    }

    /// Registers `table` under its id with `depth`; `false` (and nothing
    /// changed) when the id is registered already.
    pub(crate) fn insert(&mut self, table: T, depth: u32) -> bool {
        let id = table.id();
        if self.contains(id) {
            return false;
        }
        if (self.len + 1) * 2 > self.slots.len() {
            self.resize((self.slots.len() * 2).max(MIN_SLOTS));
        }
        self.place(Entry {
            id,
            depth,
            table: Some(table),
        });
        self.len += 1;
        self.depth_sum += u64::from(depth);
        true
    }

    /// Puts `e` in the first empty slot of its probe run (there is room).
    fn place(&mut self, e: Entry<T>) {
        let mask = self.mask();
        let mut i = self.home(e.id);
        while self.slots[i].table.is_some() {
            i = (i + 1) & mask;
        }
        self.slots[i] = e;
    }

    /// Rehashes every entry into `n` slots (a power of two, more than
    /// twice the entries).
    fn resize(&mut self, n: usize) {
        debug_assert!(n.is_power_of_two() && n >= MIN_SLOTS && n > self.len * 2);
        let old = std::mem::replace(&mut self.slots, (0..n).map(|_| Entry::EMPTY).collect());
        self.shift = 64 - n.trailing_zeros();
        for e in Vec::from(old) {
            if e.table.is_some() {
                self.place(e);
            }
        }
    }

    /// Unregisters `id`: its table, which the caller should drop after
    /// releasing the lock around the registry (it may be the last
    /// reference); `None` when not registered.
    pub(crate) fn remove(&mut self, id: u32) -> Option<T> {
        let (mut hole, _) = self.probe(id)?;
        let gone = std::mem::replace(&mut self.slots[hole], Entry::EMPTY);
        self.len -= 1;
        self.depth_sum -= u64::from(gone.depth);
        // Backward shift: an entry later in the run moves into the hole
        // when its home is not cyclically within (hole, j], i.e. its probe
        // passed the hole; the run then has no gap a lookup would stop at.
        let mask = self.mask();
        let mut j = hole;
        loop {
            j = (j + 1) & mask;
            let e = &self.slots[j];
            if e.table.is_none() {
                break;
            }
            let from_home = j.wrapping_sub(self.home(e.id)) & mask;
            let from_hole = j.wrapping_sub(hole) & mask;
            if from_home >= from_hole {
                self.slots.swap(hole, j);
                hole = j;
            }
        }
        if self.slots.len() > MIN_SLOTS && self.len * 8 <= self.slots.len() {
            self.resize(self.slots.len() / 2);
        }
        gone.table
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::sync::Arc;

    /// A table that answers every tag with its own id as the `wr_id`.
    struct Fake(u32);

    impl Retire for Arc<Fake> {
        fn id(&self) -> u32 {
            self.0
        }
        fn claim_into(&self, tag: u32, _: u32, _: &mut crate::SgList) -> Option<(u64, bool)> {
            Some(((u64::from(self.0) << 32) | u64::from(tag), false))
        }
    }

    fn fake(id: u32) -> Arc<Fake> {
        Arc::new(Fake(id))
    }

    type Registry = super::Registry<Arc<Fake>>;

    /// Which table `id` finds (its own id), `None` for none.
    fn found(r: &Registry, id: u32) -> Option<u32> {
        r.get(id).map(|t| t.id())
    }

    #[test]
    fn empty_registry_finds_nothing() {
        let r = Registry::new();
        for id in [0, 1, 7, u32::MAX] {
            assert_eq!(found(&r, id), None);
        }
        assert_eq!(r.depth_sum(), 0);
    }

    #[test]
    fn insert_lookup_remove() {
        let mut r = Registry::new();
        assert!(r.insert(fake(5), 10));
        assert!(r.insert(fake(6), 20));
        assert!(!r.insert(fake(5), 99), "a second registration of one id");
        assert_eq!(r.depth_sum(), 30, "the duplicate's depth was not counted");
        assert_eq!(
            (found(&r, 5), found(&r, 6), found(&r, 7)),
            (Some(5), Some(6), None)
        );
        let t = r.get(6).unwrap().claim(3, 0).unwrap();
        assert_eq!(t.wr_id, (6 << 32) | 3);
        assert_eq!(r.remove(5).map(|t| t.id()), Some(5));
        assert_eq!(found(&r, 5), None, "a removed id still found a table");
        assert!(r.remove(5).is_none());
        assert_eq!((found(&r, 6), r.depth_sum()), (Some(6), 20));
        assert_eq!(r.remove(6).map(|t| t.id()), Some(6));
        assert_eq!((found(&r, 6), r.depth_sum()), (None, 0));
    }

    /// Ids whose probes start at the same slot of an 8-slot table.
    fn colliding(n: usize) -> Vec<u32> {
        let r = Registry {
            shift: 61,
            ..Registry::new()
        };
        let home = r.home(1);
        (1..).filter(|&id| r.home(id) == home).take(n).collect()
    }

    #[test]
    fn colliding_ids_are_told_apart_and_removal_keeps_the_run() {
        let ids = colliding(3);
        assert_eq!(ids.len(), 3);
        // Three colliding ids fit the 8 slots (at most half full): one run.
        for remove_at in 0..3 {
            let mut r = Registry::new();
            for &id in &ids {
                assert!(r.insert(fake(id), 1));
            }
            assert_eq!(r.slots.len(), MIN_SLOTS, "the test needs one 8-slot table");
            for &id in &ids {
                assert_eq!(found(&r, id), Some(id));
            }
            let gone = ids[remove_at];
            assert_eq!(r.remove(gone).map(|t| t.id()), Some(gone));
            assert_eq!(found(&r, gone), None);
            for &id in ids.iter().filter(|&&id| id != gone) {
                assert_eq!(found(&r, id), Some(id), "removing {gone} lost {id}");
            }
        }
    }

    #[test]
    fn wrapping_runs_survive_removal() {
        // Ids whose home is the last slot: their run wraps to slot 0.
        let r8 = Registry {
            shift: 61,
            ..Registry::new()
        };
        let last: Vec<u32> = (1..).filter(|&id| r8.home(id) == 7).take(3).collect();
        let first = (1..).find(|&id| r8.home(id) == 0).unwrap();
        let mut r = Registry::new();
        for &id in &last {
            r.insert(fake(id), 1);
        }
        // Slots 7, 0, 1 taken by `last`; `first` (home 0) goes to slot 2.
        assert!(r.insert(fake(first), 1));
        assert_eq!(r.slots.len(), MIN_SLOTS);
        assert_eq!(r.remove(last[0]).map(|t| t.id()), Some(last[0]));
        for &id in last[1..].iter().chain([&first]) {
            assert_eq!(found(&r, id), Some(id), "{id} lost across the wrap");
        }
        assert_eq!(found(&r, last[0]), None);
    }

    #[test]
    fn matches_a_reference_map_through_growth_and_shrinking() {
        // Random inserts and removals (a small LCG, deterministic) against
        // std's HashMap; ids in a stride too, as with many CQs.
        let mut rng = 0x853c_49e6_748f_ea9bu64;
        let mut next = move || {
            rng = rng.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            (rng >> 33) as u32
        };
        for stride in [1u32, 2, 1024, 0x10_0000] {
            let mut r = Registry::new();
            let mut model: HashMap<u32, u32> = HashMap::new();
            for step in 0..20_000u32 {
                let id = (next() % 3000).wrapping_mul(stride) & 0x3fff_ffff;
                // Mostly inserting first, then mostly removing.
                let insert = (next() % 3 != 0) == (step < 10_000);
                if insert {
                    let depth = next() % 1000;
                    let fresh = !model.contains_key(&id);
                    assert_eq!(r.insert(fake(id), depth), fresh);
                    model.entry(id).or_insert(depth);
                } else {
                    assert_eq!(r.remove(id).map(|t| t.id()), model.remove(&id).map(|_| id));
                }
                if step % 997 == 0 {
                    for probe in 0..3000u32 {
                        let id = probe.wrapping_mul(stride) & 0x3fff_ffff;
                        let want = model.contains_key(&id).then_some(id);
                        assert_eq!(found(&r, id), want, "stride {stride} step {step}");
                    }
                }
                assert_eq!(r.len, model.len());
                assert_eq!(
                    r.depth_sum(),
                    model.values().map(|&d| u64::from(d)).sum::<u64>()
                );
                assert!(r.len * 2 <= r.slots.len() || r.slots.is_empty());
            }
            for id in model.keys().copied().collect::<Vec<_>>() {
                assert!(r.remove(id).is_some());
            }
            assert_eq!((r.len, r.depth_sum(), r.slots.len()), (0, 0, MIN_SLOTS));
        }
    }

    #[test]
    fn debts_are_paid_in_order_and_destroyed_ones_charge_the_cq() {
        let mut r = Registry::new();
        assert!(r.insert(fake(1), 8));
        assert!(r.insert(fake(2), 8));
        assert_eq!(r.owe(1, 0, false), None, "nothing owed, no debt");
        let g1 = r.owe(1, 3, false).unwrap();
        let g2 = r.owe(2, 5, true).unwrap();
        r.remove(2);
        let g3 = r.owe(1, 2, false).unwrap();
        assert!(g1 < g2 && g2 < g3);
        // Only the destroyed queue's debt is charged beside the depths.
        assert_eq!((r.depth_sum(), r.owed()), (8, 5));
        let mut released = Vec::new();
        assert!(r.pay(g2, |t, n| released.push((t.id(), n))), "g3 unpaid");
        assert_eq!(released, vec![(1, 3)]);
        assert_eq!(r.owed(), 0);
        released.clear();
        assert!(!r.pay(g3, |t, n| released.push((t.id(), n))));
        assert_eq!(released, vec![(1, 2)]);
        // Paying again, or a reset queue gone since, releases nothing.
        let g4 = r.owe(1, 1, false).unwrap();
        r.remove(1);
        assert!(!r.pay(g4, |_, _| panic!("queue 1 is gone")));
        assert!(!r.pay(g4, |_, _| panic!("paid twice")));
    }
}
