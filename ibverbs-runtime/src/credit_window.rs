//! The credit window both channels count with
//! ([`MessageChannel`](crate::MessageChannel),
//! [`WriteChannel`](crate::WriteChannel)): pure counting, no verbs, no wire
//! format (each channel puts the numbers in its own immediate data), so the
//! two bounds below are tested here on their own.
//!
//! # Contract
//!
//! One end of a channel whose ends have `size` receive slots each.
//!
//! * **This end's data** (messages or writes into the peer's slots): each
//!   takes a credit ([`take`](CreditWindow::take), only with
//!   `credits() > 0`); [`grant`](CreditWindow::grant) gives the first
//!   `size`, and the peer's returns ([`accept`](CreditWindow::accept)) give
//!   them back. Once granted, `credits + outstanding == size`: a return of
//!   more than are outstanding is refused ([`ChannelProblem::Credits`]), so
//!   this end never has more than `size` data messages in the peer's slots.
//! * **The peer's data**: each is *held* from its arrival until its credit
//!   went back; an arrival with `size` held already is refused
//!   ([`ChannelProblem::Overrun`]), so at most `size` are held. A held one
//!   is *released* once its slot may be written again
//!   ([`release`](CreditWindow::release): never more than are held; it runs
//!   in drops, so it clamps instead of panicking); its credit is then
//!   *owed* until [`take_owed`](CreditWindow::take_owed) hands it to the
//!   message that returns it, which ends its hold.
//!
//! A refused message changes no count.

use crate::ChannelProblem;

/// The counts of one end (see the module docs for the contract).
#[derive(Debug, Clone)]
pub(crate) struct CreditWindow {
    /// Receive slots per end: the most data messages in flight either way.
    size: u32,
    /// Data messages this end may send now.
    credits: u32,
    /// This end's data messages whose credits did not come back yet.
    outstanding: u32,
    /// The peer's data messages arrived and not yet returned.
    held: u32,
    /// Of those, released and not yet returned (`owed <= held`).
    owed: u32,
}

impl CreditWindow {
    /// A window of `size` slots, before any grant: no credit yet.
    pub(crate) fn new(size: u32) -> CreditWindow {
        CreditWindow {
            size,
            credits: 0,
            outstanding: 0,
            held: 0,
            owed: 0,
        }
    }

    /// The peer's slots are ready: every credit is this end's.
    pub(crate) fn grant(&mut self) {
        self.credits = self.size;
    }

    /// Receive slots per end.
    pub(crate) fn size(&self) -> u32 {
        self.size
    }

    /// Data messages this end may send now.
    pub(crate) fn credits(&self) -> u32 {
        self.credits
    }

    /// This end's data messages whose credits did not come back yet.
    pub(crate) fn outstanding(&self) -> u32 {
        self.outstanding
    }

    /// Credits released and not yet returned.
    pub(crate) fn owed(&self) -> u32 {
        self.owed
    }

    /// The peer's data messages arrived and not yet returned.
    #[cfg(test)]
    pub(crate) fn held(&self) -> u32 {
        self.held
    }

    /// Takes a credit for a data message of this end (the caller checked
    /// [`credits`](Self::credits)).
    pub(crate) fn take(&mut self) {
        debug_assert!(self.credits > 0);
        self.credits -= 1;
        self.outstanding += 1;
    }

    /// Checks and counts a message of the peer returning `returned`
    /// credits, `data` if it is a data message (it is then held). Refused,
    /// counting nothing, when it returns more than are outstanding or is
    /// data beyond the window.
    pub(crate) fn accept(&mut self, returned: u32, data: bool) -> Result<(), ChannelProblem> {
        if returned > self.outstanding {
            return Err(ChannelProblem::Credits {
                returned,
                outstanding: self.outstanding,
            });
        }
        if data && self.held >= self.size {
            return Err(ChannelProblem::Overrun {
                held: self.held + 1,
                window: self.size,
            });
        }
        self.outstanding -= returned;
        self.credits += returned;
        if data {
            self.held += 1;
        }
        Ok(())
    }

    /// A held message's slot may be written again: its credit is owed.
    pub(crate) fn release(&mut self) {
        // Clamped, not asserted: runs in the drop of a received message.
        if self.held > self.owed {
            self.owed += 1;
        }
    }

    /// The owed credits, now being returned: how many.
    pub(crate) fn take_owed(&mut self) -> u32 {
        let owed = std::mem::take(&mut self.owed);
        self.held -= owed;
        owed
    }
}

#[cfg(test)]
mod tests {
    use super::CreditWindow;
    use crate::ChannelProblem;

    fn granted(size: u32) -> CreditWindow {
        let mut w = CreditWindow::new(size);
        w.grant();
        w
    }

    #[test]
    fn no_credit_before_the_grant() {
        let mut w = CreditWindow::new(3);
        assert_eq!((w.size(), w.credits(), w.outstanding()), (3, 0, 0));
        // Nothing is outstanding: any return is a lie.
        assert_eq!(
            w.accept(1, false),
            Err(ChannelProblem::Credits {
                returned: 1,
                outstanding: 0
            })
        );
        w.grant();
        assert_eq!(w.credits(), 3);
    }

    #[test]
    fn credits_plus_outstanding_is_the_window() {
        let mut w = granted(2);
        w.take();
        w.take();
        assert_eq!((w.credits(), w.outstanding()), (0, 2));
        assert_eq!(
            w.accept(3, false),
            Err(ChannelProblem::Credits {
                returned: 3,
                outstanding: 2
            })
        );
        // Refused: nothing counted.
        assert_eq!((w.credits(), w.outstanding()), (0, 2));
        w.accept(1, false).unwrap();
        assert_eq!((w.credits(), w.outstanding()), (1, 1));
        w.accept(0, false).unwrap();
        w.accept(1, false).unwrap();
        assert_eq!((w.credits(), w.outstanding()), (2, 0));
        // A data message may return credits too.
        w.take();
        w.accept(1, true).unwrap();
        assert_eq!((w.credits(), w.outstanding(), w.held()), (2, 0, 1));
    }

    #[test]
    fn at_most_the_window_held() {
        let mut w = granted(2);
        w.accept(0, true).unwrap();
        w.accept(0, true).unwrap();
        assert_eq!(
            w.accept(0, true),
            Err(ChannelProblem::Overrun { held: 3, window: 2 })
        );
        assert_eq!(w.held(), 2);
        // A credit back is held only until it is returned.
        w.release();
        assert_eq!((w.owed(), w.held()), (1, 2));
        assert_eq!(w.take_owed(), 1);
        assert_eq!((w.owed(), w.held()), (0, 1));
        w.accept(0, true).unwrap();
        assert_eq!(w.held(), 2);
        // A control message (not data) is never held.
        w.accept(0, false).unwrap();
        assert_eq!(w.held(), 2);
    }

    #[test]
    fn releases_clamp_to_what_is_held() {
        let mut w = granted(4);
        w.release(); // nothing held: nothing owed
        assert_eq!(w.take_owed(), 0);
        w.accept(0, true).unwrap();
        w.accept(0, true).unwrap();
        for _ in 0..5 {
            w.release();
        }
        assert_eq!(w.owed(), 2);
        assert_eq!((w.take_owed(), w.held(), w.take_owed()), (2, 0, 0));
    }

    #[test]
    fn the_counts_hold_for_every_interleaving_of_a_small_run() {
        // Two ends of window 3 exchanging data, every order of their steps
        // up to a depth (a step: one end sends, receives, releases or
        // returns), checking the invariants after each.
        #[derive(Clone)]
        struct Pair {
            w: [CreditWindow; 2],
            /// Data in flight to end i, and credits in flight to end i.
            data_to: [u32; 2],
            credits_to: [u32; 2],
        }
        fn step(p: &Pair, i: usize, kind: u8) -> Option<Pair> {
            let mut q = p.clone();
            let o = 1 - i;
            match kind {
                0 if q.w[i].credits() > 0 => {
                    q.w[i].take();
                    q.data_to[o] += 1;
                }
                1 if q.data_to[i] > 0 => {
                    q.data_to[i] -= 1;
                    q.w[i].accept(0, true).expect("a credited message fits");
                }
                2 if q.w[i].held() > q.w[i].owed() => q.w[i].release(),
                3 if q.w[i].owed() > 0 => {
                    let n = q.w[i].take_owed();
                    q.credits_to[o] += n;
                }
                4 if q.credits_to[i] > 0 => {
                    let n = std::mem::take(&mut q.credits_to[i]);
                    q.w[i].accept(n, false).expect("an honest return");
                }
                _ => return None,
            }
            Some(q)
        }
        fn walk(p: &Pair, depth: u32, seen: &mut u64) {
            *seen += 1;
            for i in 0..2 {
                let (w, o) = (&p.w[i], &p.w[1 - i]);
                assert_eq!(w.credits() + w.outstanding(), w.size());
                // What this end sent and has not had back: in flight, held
                // by the peer, or returned and in flight back.
                assert_eq!(
                    w.outstanding(),
                    p.data_to[1 - i] + o.held() + p.credits_to[i]
                );
                assert!(o.held() <= o.size() && o.owed() <= o.held());
            }
            if depth == 0 {
                return;
            }
            for i in 0..2 {
                for kind in 0..5 {
                    if let Some(q) = step(p, i, kind) {
                        walk(&q, depth - 1, seen);
                    }
                }
            }
        }
        let start = Pair {
            w: [granted(3), granted(3)],
            data_to: [0; 2],
            credits_to: [0; 2],
        };
        let mut seen = 0;
        walk(&start, 9, &mut seen);
        assert!(seen > 10_000, "{seen}");
    }
}
