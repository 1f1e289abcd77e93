//! What a CQ must be able to hold: the depths asked of the queues
//! reporting to it, and what reset or destroyed queues may have left
//! queued (DESIGN.md, "A CQ holds a completion of every request").
//! Control path only (creating, resetting, destroying queues, `resize`,
//! paying debts), behind the CQ's lock.

use crate::inflight::HeldMark;

/// Completions a queue may have left in the CQ when it was reset or
/// destroyed: at most `n`, all queued before debt `gen` was recorded.
#[derive(Debug, Clone, Copy)]
struct Debt {
    gen: u64,
    /// A reset: the slots its ring holds until paid (its depth still
    /// counts them). `None`: a destroyed queue, charged to the CQ.
    held: Option<HeldMark>,
    n: u32,
}

/// The queues reporting to one CQ and what they may have left queued.
#[derive(Debug, Default)]
pub(crate) struct Accounting {
    /// (queue id, depth asked) of each queue reporting here; an SRQ
    /// shared by several queue pairs counts once.
    queues: Vec<(u32, u32)>,
    depth_sum: u64,
    /// Unpaid debts, oldest first (a handful at most: each is paid by the
    /// next poll that finds the CQ empty).
    debts: Vec<Debt>,
    /// The sum of the destroyed queues' debts, charged beside `depth_sum`.
    owed: u64,
    /// The last debt's generation.
    gen: u64,
}

impl Accounting {
    /// The sum of the registered depths.
    pub(crate) fn depth_sum(&self) -> u64 {
        self.depth_sum
    }

    /// The completions destroyed queues may have left queued (charged
    /// beside [`depth_sum`](Self::depth_sum) until paid).
    pub(crate) fn owed(&self) -> u64 {
        self.owed
    }

    /// Whether queue `id` reports here.
    pub(crate) fn contains(&self, id: u32) -> bool {
        self.queues.iter().any(|&(q, _)| q == id)
    }

    /// Registers queue `id` with `depth`; `false` (nothing changed) when it
    /// is registered already.
    pub(crate) fn insert(&mut self, id: u32, depth: u32) -> bool {
        if self.contains(id) {
            return false;
        }
        self.queues.push((id, depth));
        self.depth_sum += u64::from(depth);
        true
    }

    /// Unregisters queue `id`; whether it was registered.
    pub(crate) fn remove(&mut self, id: u32) -> bool {
        let Some(i) = self.queues.iter().position(|&(q, _)| q == id) else {
            return false;
        };
        let (_, depth) = self.queues.swap_remove(i);
        self.depth_sum -= u64::from(depth);
        true
    }

    /// Records that up to `n` completions of a queue may be queued though
    /// its slots were released: by a reset (`held`: the slots its ring
    /// holds meanwhile) or a destruction (`None`: the CQ is charged `n`).
    /// Returns the debt's generation, which [`pay`](Self::pay) takes once
    /// a poll that began after this call found the CQ empty; `None` when
    /// `n` is 0.
    pub(crate) fn owe(&mut self, held: Option<HeldMark>, n: u32) -> Option<u64> {
        if n == 0 {
            return None;
        }
        self.gen += 1;
        if held.is_none() {
            self.owed += u64::from(n);
        }
        self.debts.push(Debt {
            gen: self.gen,
            held,
            n,
        });
        Some(self.gen)
    }

    /// Pays every debt of generation `gen` or older: what they stood for
    /// is no longer queued; reset rings get their held slots back. Returns
    /// whether debts remain.
    pub(crate) fn pay(&mut self, gen: u64) -> bool {
        let paid = self.debts.iter().take_while(|d| d.gen <= gen).count();
        for d in self.debts.drain(..paid) {
            match d.held {
                None => self.owed -= u64::from(d.n),
                // Only slots still held in that reset's state: a later
                // owner's are in others.
                Some(mark) => mark.release(),
            }
        }
        !self.debts.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depths_count_once_per_queue() {
        let mut a = Accounting::default();
        assert!(a.insert(5, 10));
        assert!(a.insert(6, 20));
        assert!(!a.insert(5, 99), "a second registration of one queue");
        assert_eq!(a.depth_sum(), 30);
        assert!(a.remove(5));
        assert!(!a.remove(5));
        assert_eq!(a.depth_sum(), 20);
    }

    #[test]
    fn debts_are_paid_in_order_and_destroyed_ones_charge_the_cq() {
        let mut a = Accounting::default();
        assert_eq!(a.owe(None, 0), None, "nothing owed, no debt");
        let g1 = a.owe(None, 3).unwrap();
        let g2 = a.owe(None, 5).unwrap();
        assert!(g1 < g2);
        assert_eq!(a.owed(), 8);
        assert!(a.pay(g1), "g2 unpaid");
        assert_eq!(a.owed(), 5);
        assert!(!a.pay(g2));
        assert_eq!(a.owed(), 0);
        assert!(!a.pay(g2), "paid twice: nothing");
    }
}
