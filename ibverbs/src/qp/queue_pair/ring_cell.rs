//! A work queue's ring and the claim its exclusive posting handle holds
//! on it.

use std::cell::UnsafeCell;
use std::mem::ManuallyDrop;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};

use super::prepared::Deferred;
use crate::inflight::{Geometry, Ring};

/// A work queue's ring and the flag that makes its posting handle
/// exclusive: whoever swaps `taken` to true (a handle, or a move to RESET
/// tearing the ring down) is the ring's only user until it stores false.
pub(crate) struct RingCell {
    ring: UnsafeCell<ManuallyDrop<Ring>>,
    /// What never changes of the ring (readable without the claim).
    geometry: Geometry,
    taken: AtomicBool,
    /// The ring's slots may still be used by the device (a destroy that
    /// failed): never given back to the store.
    leaked: bool,
    /// Buffers of prepared requests dropped with postings outstanding.
    deferred: parking_lot::Mutex<Vec<Deferred>>,
}

// SAFETY: the ring is reached only by whoever holds `taken` (or through
// `&mut self`); `geometry` is immutable.
unsafe impl Sync for RingCell {}
// SAFETY: as above.
unsafe impl Send for RingCell {}

impl RingCell {
    pub(crate) fn new(ring: Ring) -> RingCell {
        RingCell {
            geometry: ring.geometry(),
            ring: UnsafeCell::new(ManuallyDrop::new(ring)),
            taken: AtomicBool::new(false),
            leaked: false,
            deferred: parking_lot::Mutex::new(Vec::new()),
        }
    }

    /// The ring, exclusively, until [`give_back`](Self::give_back); `None`
    /// while someone else has it.
    pub(crate) fn take(&self) -> Option<NonNull<Ring>> {
        self.taken
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .ok()?;
        self.sweep();
        NonNull::new(self.ring.get().cast::<Ring>())
    }

    /// Keeps a dropped prepared request's buffers until no posting of it
    /// is outstanding.
    pub(crate) fn defer(&self, d: Deferred) {
        self.deferred.lock().push(d);
    }

    /// Releases the deferred buffers no posting uses any more.
    fn sweep(&self) {
        let done: Vec<Deferred> = {
            let mut deferred = self.deferred.lock();
            if deferred.is_empty() {
                return;
            }
            let (live, done) = std::mem::take(&mut *deferred)
                .into_iter()
                .partition(Deferred::outstanding);
            *deferred = live;
            done
        };
        drop(done);
    }

    /// After the queue was destroyed or reset: every deferred buffer goes
    /// (the device no longer touches them), unless `keep` (a failed
    /// destroy: they stay for good).
    pub(crate) fn release_deferred(&mut self, keep: bool) {
        let deferred = std::mem::take(self.deferred.get_mut());
        if keep {
            std::mem::forget(deferred);
        }
    }

    /// Ends a [`take`](Self::take).
    pub(crate) fn give_back(&self) {
        self.taken.store(false, Ordering::Release);
    }

    /// Whether a handle (or a teardown) has the ring now.
    pub(crate) fn is_taken(&self) -> bool {
        self.taken.load(Ordering::Acquire)
    }

    /// The ring of a queue nothing else can reach any more (its queue
    /// pair is being destroyed: no handle, since each holds the queue
    /// pair).
    pub(crate) fn get_mut(&mut self) -> &mut Ring {
        self.ring.get_mut()
    }

    /// Keeps the ring's slots from the store for good (see `leaked`), and
    /// the deferred buffers.
    pub(crate) fn leak(&mut self) {
        self.leaked = true;
        self.release_deferred(true);
    }

    /// The queue's id in its CQs' accounting.
    pub(crate) fn id(&self) -> u32 {
        self.geometry.id()
    }

    /// Entries.
    pub(crate) fn depth(&self) -> u32 {
        self.geometry.depth()
    }

    /// Requests outstanding (a snapshot).
    pub(crate) fn outstanding(&self) -> u32 {
        self.geometry.outstanding()
    }
}

impl Drop for RingCell {
    fn drop(&mut self) {
        if !self.leaked {
            // SAFETY: dropped once, here, never used after.
            unsafe { ManuallyDrop::drop(self.ring.get_mut()) };
        }
    }
}
