//! The dispatcher's requests: a slab addressed by the `wr_id` it gives
//! each request. It holds no buffers of an outstanding request (the
//! in-flight store does); it parks a completion until its future collects
//! it.
//!
//! ```text
//! bits 63..32 the dispatcher's tag: given once per dispatcher, never 0
//! bits 31..0  the slot's index
//! ```
//!
//! The tag keeps a completion of a dropped dispatcher's request (its queue
//! pair wrapped again) from resolving a future of the new one: the owner
//! mark alone cannot tell them apart. Finding a slot is an index and a
//! compare; a freed slot goes to the head of an intrusive free list, so a
//! steady state allocates nothing. A slot is freed only once its completion
//! arrived (or its post was refused), so no later completion carries the id
//! of a reused slot.

/// One request's state.
pub(super) enum Slot<T> {
    /// Posted; its future is alive and has not collected the completion.
    Waiting,
    /// Completed; the future has not collected it yet.
    Done(T),
    /// Its future was dropped: the completion is dropped when it arrives
    /// (the in-flight store owns the buffers until then).
    Abandoned,
}

enum Entry<T> {
    Used(Slot<T>),
    /// Free; the index of the next free slot ([`NONE`]: none).
    Free(u32),
}

/// The requests of one dispatcher.
pub(super) struct Requests<T> {
    tag: u32,
    entries: Vec<Entry<T>>,
    /// The first free slot ([`NONE`]: none).
    free: u32,
    used: usize,
}

const NONE: u32 = u32::MAX;

/// The id of slot `index` of the dispatcher tagged `tag`.
#[inline]
const fn id(tag: u32, index: u32) -> u64 {
    (tag as u64) << 32 | index as u64
}

/// The slot an id names.
#[inline]
pub(super) const fn index(id: u64) -> usize {
    id as u32 as usize
}

impl<T> Requests<T> {
    /// The requests of a dispatcher tagged `tag` (not 0).
    pub(super) const fn new(tag: u32) -> Self {
        Requests {
            tag,
            entries: Vec::new(),
            free: NONE,
            used: 0,
        }
    }

    /// Requests tracked: waiting, done or abandoned.
    pub(super) fn len(&self) -> usize {
        self.used
    }

    /// Tracks a new waiting request and returns its id; `None` when
    /// 2^32 - 1 slots are in use.
    pub(super) fn insert(&mut self) -> Option<u64> {
        let index = if self.free != NONE {
            let index = self.free;
            let entry = &mut self.entries[index as usize];
            let Entry::Free(next) = *entry else {
                unreachable!("the free list holds free slots only")
            };
            self.free = next;
            *entry = Entry::Used(Slot::Waiting);
            index
        } else {
            let index = u32::try_from(self.entries.len())
                .ok()
                .filter(|&i| i != NONE)?;
            self.entries.push(Entry::Used(Slot::Waiting));
            index
        };
        self.used += 1;
        Some(id(self.tag, index))
    }

    /// The slot `id` names, while a request holds it.
    pub(super) fn get_mut(&mut self, id: u64) -> Option<&mut Slot<T>> {
        if (id >> 32) as u32 != self.tag {
            return None;
        }
        match self.entries.get_mut(index(id)) {
            Some(Entry::Used(slot)) => Some(slot),
            _ => None,
        }
    }

    /// Stops tracking `id`'s request and returns its last state; `None`
    /// when `id` names no tracked request.
    pub(super) fn remove(&mut self, id: u64) -> Option<Slot<T>> {
        self.get_mut(id)?;
        let i = index(id);
        let Entry::Used(slot) = std::mem::replace(&mut self.entries[i], Entry::Free(self.free))
        else {
            unreachable!("found used above")
        };
        self.free = i as u32;
        self.used -= 1;
        Some(slot)
    }

    /// Takes `id`'s completion when it is done, and stops tracking it.
    pub(super) fn take_done(&mut self, id: u64) -> Option<T> {
        match self.get_mut(id)? {
            Slot::Done(_) => match self.remove(id) {
                Some(Slot::Done(c)) => Some(c),
                _ => unreachable!("found done above"),
            },
            _ => None,
        }
    }
}

/// The wakers of the futures waiting on one dispatcher, by slot. A
/// future's waker is removed in the same critical section (of the
/// dispatcher's state) that frees or abandons its slot, so it never
/// removes the waker of a request that reused the slot.
pub(super) struct Wakers<W> {
    slots: Vec<Option<W>>,
}

impl<W> Wakers<W> {
    pub(super) const fn new() -> Self {
        Wakers { slots: Vec::new() }
    }

    /// Sets slot `index`'s waker to `make()` unless `same` says the one
    /// set will do; returns the one replaced (to drop outside any lock).
    pub(super) fn set(
        &mut self,
        index: usize,
        same: impl FnOnce(&W) -> bool,
        make: impl FnOnce() -> W,
    ) -> Option<W> {
        if self.slots.len() <= index {
            self.slots.resize_with(index + 1, || None);
        }
        let slot = &mut self.slots[index];
        match slot {
            Some(old) if same(old) => None,
            _ => slot.replace(make()),
        }
    }

    /// Removes slot `index`'s waker.
    pub(super) fn remove(&mut self, index: usize) -> Option<W> {
        self.slots.get_mut(index)?.take()
    }

    /// Slot `index`'s waker, if set.
    pub(super) fn get(&self, index: usize) -> Option<&W> {
        self.slots.get(index)?.as_ref()
    }

    /// Every waker set.
    pub(super) fn all(&self) -> impl Iterator<Item = &W> {
        self.slots.iter().flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_freed_slot_is_reused_and_an_id_is_the_slot_and_the_tag() {
        let mut r: Requests<&str> = Requests::new(5);
        let a = r.insert().unwrap();
        let b = r.insert().unwrap();
        assert_eq!((a, b, r.len()), (5 << 32, 5 << 32 | 1, 2));
        assert_eq!((index(a), index(b)), (0, 1));
        *r.get_mut(a).unwrap() = Slot::Done("a");
        assert_eq!(r.take_done(b), None, "b is waiting");
        assert_eq!(r.take_done(a), Some("a"));
        assert_eq!(r.len(), 1);
        assert!(
            r.get_mut(a).is_none() && r.remove(a).is_none(),
            "a is freed"
        );
        let c = r.insert().unwrap();
        assert_eq!(c, a, "slot 0 again");
        assert!(r.get_mut(6 << 32).is_none(), "another dispatcher's");
        assert!(r.get_mut(5 << 32 | 7).is_none(), "never given");
        assert!(matches!(r.remove(b), Some(Slot::Waiting)));
        *r.get_mut(c).unwrap() = Slot::Abandoned;
        assert!(matches!(r.remove(c), Some(Slot::Abandoned)));
        assert_eq!(r.len(), 0);
        // Freed last-in first-out.
        assert_eq!((r.insert(), r.insert()), (Some(a), Some(b)));
        assert_eq!(r.insert(), Some(5 << 32 | 2));
    }

    #[test]
    fn a_waker_is_replaced_only_when_it_is_not_the_same() {
        let mut w: Wakers<u8> = Wakers::new();
        assert_eq!(w.set(3, |_| false, || 1), None);
        assert_eq!(w.set(3, |&k| k == 1, || 2), None, "kept");
        assert_eq!(w.get(3), Some(&1));
        assert_eq!(w.set(3, |_| false, || 3), Some(1));
        assert_eq!(w.set(0, |_| false, || 4), None);
        assert_eq!(w.all().copied().collect::<Vec<_>>(), [4, 3]);
        assert_eq!(w.remove(3), Some(3));
        assert_eq!(w.get(3), None);
        assert_eq!((w.remove(3), w.remove(9)), (None, None));
    }
}
