//! The queue pair's posting epoch: what the lock-free posting path of a
//! [`PreparedSend`](crate::PreparedSend) reads instead of taking the send
//! lock, and what a move to RESET waits out.
//!
//! One atomic word:
//!
//! ```text
//! bit 0       the last state change left a state that may post sends
//! bits 1..=29 lock-free postings (sends and receives) inside the
//!             provider's post_send/post_recv right now
//! bit 30      a move to RESET is under way: lock-free receives wait for it
//!             under the send lock
//! bit 31      the QP is in ERR, or a move there has started: receives are
//!             refused (rxe flushes only what its queue holds at the move)
//! bits 32..   a (wrapping) count of state changes
//! ```
//!
//! State changes write it with the send lock held. A lock-free posting
//! counts itself in ([`SendEpoch::enter`]) before it calls the provider and
//! out ([`SendEpoch::leave`]) after. A move to RESET, with the send lock
//! held, first clears bit 0 (postings that start later take the locked
//! path and wait for the lock) and then waits until no posting is in
//! flight ([`SendEpoch::close`]), so the provider's `modify_qp(RESET)`
//! never runs beside its `post_send`: mlx5 resets the send queue's indices
//! in `mlx5_modify_qp` without the send queue's lock that `post_send`
//! holds (see `prepared_send.rs` for the evidence). The same word in one
//! place: counting in and reading the state is one read-modify-write, and
//! the wait sees every posting that read "sends".

use std::sync::atomic::{AtomicU64, Ordering};

/// Bit 0: the last state change left a state that sends.
const SENDS: u64 = 1;
/// One lock-free posting in flight.
const POSTING: u64 = 1 << 1;
/// Bits 1..=29: the postings in flight. (A posting needs a thread inside
/// `PreparedSend::post` or `PreparedRecv::post`: far fewer than 2^29.)
const POSTINGS: u64 = ((1 << 29) - 1) << 1;
/// Bit 30: a move to RESET is under way ([`SendEpoch::close`] until the
/// next [`SendEpoch::note`]).
const CLOSED: u64 = 1 << 30;
/// Bit 31: in ERR or moving there.
const ERR: u64 = 1 << 31;
/// One state change.
const CHANGE: u64 = 1 << 32;

/// See the module documentation.
#[derive(Debug, Default)]
pub(crate) struct SendEpoch(AtomicU64);

/// What a lock-free posting saw when it counted itself in: compare it with
/// [`SendEpoch::unchanged_since`] to learn whether a state change
/// overlapped the posting.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Seen(u64);

impl SendEpoch {
    /// Counts a lock-free posting in, when the queue pair's last state
    /// change left a state that sends (`None`: not counted; take the send
    /// lock). The caller must [`leave`](Self::leave) once the provider's
    /// call returned, before it takes the send lock.
    #[inline(always)]
    pub(crate) fn enter(&self) -> Option<Seen> {
        // Acquire: the state change that enabled sending (released under
        // the send lock) happened before this posting.
        let e = self.0.fetch_add(POSTING, Ordering::AcqRel);
        if e & SENDS == 0 {
            self.leave();
            return None;
        }
        Some(Seen(e))
    }

    /// Counts a lock-free receive posting in, unless a move to RESET is
    /// under way (`false`: not counted; post under the send lock, which
    /// the move holds). The caller must [`leave`](Self::leave) once the
    /// provider's call returned. (Receives are legal in more states than
    /// sends, so they do not look at bit 0.)
    #[inline(always)]
    pub(crate) fn enter_recv(&self) -> bool {
        let e = self.0.fetch_add(POSTING, Ordering::AcqRel);
        if e & CLOSED != 0 {
            self.leave();
            return false;
        }
        true
    }

    /// Counts a lock-free posting out.
    #[inline(always)]
    pub(crate) fn leave(&self) {
        // Release: the provider's call happens before a RESET that waited
        // for this count (`close`, Acquire).
        self.0.fetch_sub(POSTING, Ordering::Release);
    }

    /// Whether no state change happened since `seen` (call with the send
    /// lock held, so none is in progress).
    #[inline]
    pub(crate) fn unchanged_since(&self, seen: Seen) -> bool {
        (self.0.load(Ordering::Acquire) ^ seen.0) & !POSTINGS == 0
    }

    /// Records a state change (or an attempt) whose outcome sends or not,
    /// and is ERR or not. Call with the send lock held, after
    /// `ibv_modify_qp`.
    pub(crate) fn note(&self, sends: bool, err: bool) {
        // A read-modify-write: postings in flight keep their counts.
        // SeqCst: a lock-free receive reads the ERR bit after its doorbell
        // (see `recv_refused`).
        let _ = self
            .0
            .fetch_update(Ordering::SeqCst, Ordering::Relaxed, |e| {
                let state = u64::from(sends) | if err { ERR } else { 0 };
                Some((e & !(SENDS | ERR | CLOSED)).wrapping_add(CHANGE) | state)
            });
    }

    /// Announces a move to ERR before `ibv_modify_qp` runs: receives are
    /// refused from now on. Call with the send lock and the receive
    /// table's lock held. A lock-free receive posting reads the word again
    /// after its doorbell (both sides `SeqCst`, then a fence here): either
    /// it sees this bit, or the flush the move starts sees its request.
    pub(crate) fn note_err_pending(&self) {
        let _ = self
            .0
            .fetch_update(Ordering::SeqCst, Ordering::Relaxed, |e| {
                Some((e | ERR).wrapping_add(CHANGE))
            });
        std::sync::atomic::fence(Ordering::SeqCst);
    }

    /// Whether receives are refused: the QP is in ERR or going there (as
    /// this crate's modifies left it).
    #[inline]
    pub(crate) fn recv_refused(&self) -> bool {
        self.0.load(Ordering::SeqCst) & ERR != 0
    }

    /// Closes the lock-free paths and waits until no lock-free posting is
    /// in the provider: afterwards, until the next [`note`](Self::note),
    /// every posting, send or receive, takes the send lock (which the
    /// caller holds). Call before a move to RESET. Waits only for calls
    /// already inside the provider's `post_send`/`post_recv`, which do not
    /// block.
    pub(crate) fn close(&self) {
        let _ = self
            .0
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |e| {
                Some(((e & !SENDS) | CLOSED).wrapping_add(CHANGE))
            });
        let mut spins = 0u32;
        while self.0.load(Ordering::Acquire) & POSTINGS != 0 {
            if spins < 128 {
                spins += 1;
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn a_new_queue_pair_posts_under_the_lock() {
        let e = SendEpoch::default();
        assert!(e.enter().is_none());
        e.note(true, false);
        let seen = e.enter().expect("sends after a change to a sending state");
        e.leave();
        assert!(e.unchanged_since(seen));
        e.note(false, false);
        assert!(!e.unchanged_since(seen));
        assert!(e.enter().is_none());
        assert_eq!(e.0.load(Ordering::Relaxed) & POSTINGS, 0);
    }

    #[test]
    fn the_err_bit_follows_moves_to_err_and_out() {
        let e = SendEpoch::default();
        e.note(true, false);
        assert!(!e.recv_refused());
        let seen = e.enter().unwrap();
        e.note_err_pending();
        assert!(e.recv_refused(), "refused from the start of the move");
        assert!(!e.unchanged_since(seen), "announcing ERR is a change");
        e.leave();
        e.note(true, true);
        assert!(e.recv_refused() && e.enter().map(|_| e.leave()).is_some());
        e.close();
        e.note(false, false);
        assert!(!e.recv_refused(), "RESET leaves ERR");
        assert_eq!(e.0.load(Ordering::Relaxed) & POSTINGS, 0);
    }

    #[test]
    fn receives_are_closed_out_during_a_reset_only() {
        let e = SendEpoch::default();
        // Receives need no sending state (INIT, RTR accept them).
        assert!(e.enter_recv());
        e.leave();
        e.note(false, false);
        assert!(e.enter_recv());
        e.leave();
        e.close();
        assert!(!e.enter_recv(), "closed while a RESET is under way");
        assert_eq!(e.0.load(Ordering::Relaxed) & POSTINGS, 0, "not counted");
        e.note(false, false);
        assert!(e.enter_recv(), "open again after the move");
        e.leave();
    }

    #[test]
    fn in_flight_postings_do_not_count_as_a_change() {
        let e = SendEpoch::default();
        e.note(true, false);
        let seen = e.enter().unwrap();
        let other = e.enter().unwrap();
        assert!(e.unchanged_since(seen) && e.unchanged_since(other));
        e.leave();
        e.leave();
        assert!(e.unchanged_since(seen));
    }

    #[test]
    fn close_waits_out_a_posting_in_flight_and_refuses_new_ones() {
        let e = Arc::new(SendEpoch::default());
        e.note(true, false);
        let seen = e.enter().expect("sends");
        let closed = Arc::new(AtomicBool::new(false));
        let closer = {
            let (e, closed) = (Arc::clone(&e), Arc::clone(&closed));
            std::thread::spawn(move || {
                e.close();
                closed.store(true, Ordering::SeqCst);
            })
        };
        // The closer cleared "sends" but must wait for the posting.
        let t0 = std::time::Instant::now();
        while e.0.load(Ordering::SeqCst) & SENDS != 0 {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "close never started"
            );
            std::thread::yield_now();
        }
        assert!(e.enter().is_none(), "a posting started after close began");
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            !closed.load(Ordering::SeqCst),
            "close returned while a posting was in the provider"
        );
        e.leave();
        closer.join().unwrap();
        assert!(closed.load(Ordering::SeqCst));
        assert!(!e.unchanged_since(seen), "close is a state change");
        assert!(e.enter().is_none(), "closed until the next note");
        e.note(false, false);
        assert!(e.enter().is_none());
        e.note(true, false);
        assert!(e.enter().is_some());
    }
}
