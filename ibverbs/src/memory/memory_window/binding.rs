//! What a memory window may reference: the pure state logic behind
//! [`MemoryWindow`](crate::memory::MemoryWindow) (see DESIGN.md, "Memory windows").
//!
//! The device changes a window's binding only when a bind or invalidate
//! *runs*, and the library learns that only from the request's completion.
//! So the committed binding (region and key) moves only on a successful
//! completion; until then, and after anything else, every region the device
//! may still reach through the window stays held here.

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::memory::buffer::RemoteMemory;

/// A binding: the region it covers and what it grants.
pub(crate) type Bound<R> = (Arc<R>, RemoteMemory);

/// How a window's bind or invalidate ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// It completed successfully: the device's binding is its target.
    Success,
    /// It completed with an error. Usually it did not run, but not always:
    /// rxe flushes (`WR_FLUSH_ERR`) a bind it already ran when the queue
    /// pair fails before the completion is written.
    Failed,
    /// Its slot was dropped without a completion (the queue pair was reset
    /// or destroyed, or a later completion retired it): it may or may not
    /// have run, and nothing will tell.
    Unknown,
}

/// The request in flight: what the window becomes if it succeeds.
struct Pending<R> {
    /// The new binding (`None` for an invalidate).
    target: Option<Bound<R>>,
    /// The window's key after it.
    rkey: u32,
}

/// A window's bindings. Invariant: every region the device may reach
/// through the window is held in `bound`, `doubt` or `pending`.
pub(crate) struct Binding<R> {
    /// The key of the last binding known to have taken effect (the one
    /// libibverbs' `ibv_mw::rkey` must name: providers pass it to the
    /// kernel, which refuses any other).
    rkey: u32,
    /// The last binding known to have taken effect.
    bound: Option<Bound<R>>,
    /// Targets of requests that failed or ended unseen, which the device
    /// may nevertheless have bound: released by the next success.
    doubt: Vec<Arc<R>>,
    /// The one outstanding bind or invalidate.
    pending: Option<Pending<R>>,
    /// A request ended without a completion: the device's binding and key
    /// are unknown, so no further request is posted.
    indeterminate: bool,
}

/// Regions a settled request released, dropped by the caller after
/// unlocking (the last reference deregisters the region).
pub(crate) struct Released<R> {
    _old: Option<Arc<R>>,
    _doubt: Vec<Arc<R>>,
}

impl<R> Binding<R> {
    pub(crate) fn new(rkey: u32) -> Self {
        Binding {
            rkey,
            bound: None,
            doubt: Vec::new(),
            pending: None,
            indeterminate: false,
        }
    }

    /// The key of the last binding known to have taken effect.
    pub(crate) fn rkey(&self) -> u32 {
        self.rkey
    }

    /// The last binding known to have taken effect.
    pub(crate) fn bound(&self) -> Option<&Bound<R>> {
        self.bound.as_ref()
    }

    /// A region the device may reach through the window (the bound one
    /// first), `None` when it surely reaches none.
    pub(crate) fn any_region(&self) -> Option<&Arc<R>> {
        self.bound.as_ref().map(|b| &b.0).or(self.doubt.last())
    }

    /// Whether a new request may be posted: one at a time per window (on
    /// any queue pair), never after an unknown outcome.
    pub(crate) fn check_idle(&self) -> Result<()> {
        if self.indeterminate {
            return Err(Error::WindowIndeterminate);
        }
        if self.pending.is_some() {
            return Err(Error::WindowBusy);
        }
        Ok(())
    }

    /// Records the request just posted (the caller checked
    /// [`check_idle`](Self::check_idle)).
    pub(crate) fn begin(&mut self, target: Option<Bound<R>>, rkey: u32) {
        debug_assert!(self.pending.is_none() && !self.indeterminate);
        self.pending = Some(Pending { target, rkey });
    }

    /// Settles the outstanding request. On success its target becomes the
    /// binding and every other region is released; otherwise the committed
    /// binding and key stay and the target joins the doubtful regions
    /// (allocating only on this error path, and only for a region not
    /// already held).
    pub(crate) fn finish(&mut self, outcome: Outcome) -> Released<R> {
        let mut released = Released {
            _old: None,
            _doubt: Vec::new(),
        };
        let Some(p) = self.pending.take() else {
            return released;
        };
        match outcome {
            Outcome::Success => {
                released._old = std::mem::replace(&mut self.bound, p.target).map(|b| b.0);
                released._doubt = std::mem::take(&mut self.doubt);
                self.rkey = p.rkey;
            }
            Outcome::Failed | Outcome::Unknown => {
                if let Some((region, _)) = p.target {
                    self.hold(region);
                }
                self.indeterminate |= outcome == Outcome::Unknown;
            }
        }
        released
    }

    fn hold(&mut self, region: Arc<R>) {
        let mut held = self.bound.iter().map(|b| &b.0).chain(self.doubt.iter());
        if !held.any(|r| Arc::ptr_eq(r, &region)) {
            self.doubt.push(region);
        }
    }

    /// Gives up every region for good (never dropped): for a window the
    /// device could not deallocate.
    pub(crate) fn leak(&mut self) {
        std::mem::forget(self.bound.take());
        std::mem::forget(std::mem::take(&mut self.doubt));
        std::mem::forget(self.pending.take().map(|p| p.target));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::buffer::RemoteKey;

    fn grant(rkey: u32) -> RemoteMemory {
        RemoteMemory {
            addr: 0x1000,
            len: 64,
            rkey: RemoteKey(rkey),
        }
    }

    /// A window bound to `a` with key 1, as after a successful bind.
    fn bound_to(a: &Arc<u8>) -> Binding<u8> {
        let mut w = Binding::new(0);
        w.begin(Some((a.clone(), grant(1))), 1);
        drop(w.finish(Outcome::Success));
        assert_eq!(w.rkey(), 1);
        w
    }

    #[test]
    fn one_request_at_a_time() {
        let a = Arc::new(1u8);
        let mut w = bound_to(&a);
        w.check_idle().unwrap();
        w.begin(None, 1);
        assert!(matches!(w.check_idle(), Err(Error::WindowBusy)));
        drop(w.finish(Outcome::Failed));
        w.check_idle().unwrap();
    }

    #[test]
    fn success_commits_the_target_and_releases_the_rest() {
        let (a, b) = (Arc::new(1u8), Arc::new(2u8));
        let mut w = bound_to(&a);
        w.begin(Some((b.clone(), grant(2))), 2);
        // Until the completion, the old binding is what the device holds.
        assert!(Arc::ptr_eq(&w.bound().unwrap().0, &a));
        assert_eq!(w.rkey(), 1);
        let released = w.finish(Outcome::Success);
        assert_eq!(Arc::strong_count(&a), 2, "released, not yet dropped");
        drop(released);
        assert_eq!(Arc::strong_count(&a), 1);
        assert!(Arc::ptr_eq(&w.bound().unwrap().0, &b));
        assert_eq!((w.rkey(), w.bound().unwrap().1.rkey.0), (2, 2));
    }

    #[test]
    fn a_failed_rebind_keeps_both_regions_and_the_old_key() {
        let (a, b) = (Arc::new(1u8), Arc::new(2u8));
        let mut w = bound_to(&a);
        w.begin(Some((b.clone(), grant(2))), 2);
        drop(w.finish(Outcome::Failed));
        assert_eq!(w.rkey(), 1, "the key rolls back");
        assert!(Arc::ptr_eq(&w.bound().unwrap().0, &a));
        assert_eq!(
            (Arc::strong_count(&a), Arc::strong_count(&b)),
            (2, 2),
            "both held: the failed bind may have run"
        );
        // The same target failing again is held once.
        w.begin(Some((b.clone(), grant(2))), 2);
        drop(w.finish(Outcome::Failed));
        assert_eq!(Arc::strong_count(&b), 2);
        // A later success (here: an invalidate) releases both.
        w.begin(None, 1);
        drop(w.finish(Outcome::Success));
        assert_eq!((Arc::strong_count(&a), Arc::strong_count(&b)), (1, 1));
        assert!(w.bound().is_none() && w.any_region().is_none());
    }

    #[test]
    fn a_failed_invalidate_keeps_the_binding() {
        let a = Arc::new(1u8);
        let mut w = bound_to(&a);
        w.begin(None, 1);
        drop(w.finish(Outcome::Failed));
        assert!(Arc::ptr_eq(&w.bound().unwrap().0, &a));
        assert_eq!(Arc::strong_count(&a), 2);
    }

    #[test]
    fn an_unknown_outcome_holds_everything_and_refuses_more() {
        let (a, b) = (Arc::new(1u8), Arc::new(2u8));
        let mut w = bound_to(&a);
        w.begin(Some((b.clone(), grant(2))), 2);
        drop(w.finish(Outcome::Unknown));
        assert!(matches!(w.check_idle(), Err(Error::WindowIndeterminate)));
        assert_eq!((Arc::strong_count(&a), Arc::strong_count(&b)), (2, 2));
        assert!(w.any_region().is_some());
        // Only deallocation ends it; a window that cannot be deallocated
        // keeps its regions for good.
        w.leak();
        assert_eq!((Arc::strong_count(&a), Arc::strong_count(&b)), (2, 2));
    }

    #[test]
    fn unbound_window_reaches_a_doubtful_region() {
        let b = Arc::new(2u8);
        let mut w = Binding::new(0);
        w.begin(Some((b.clone(), grant(1))), 1);
        drop(w.finish(Outcome::Failed));
        assert!(w.bound().is_none());
        assert!(Arc::ptr_eq(w.any_region().unwrap(), &b));
        assert_eq!(w.rkey(), 0);
    }

    #[test]
    fn settling_without_a_request_changes_nothing() {
        let a = Arc::new(1u8);
        let mut w = bound_to(&a);
        drop(w.finish(Outcome::Unknown));
        w.check_idle().unwrap();
        assert_eq!(Arc::strong_count(&a), 2);
    }
}
