//! Prepared requests: checked and built once, posted many times
//! ([`PreparedSend`]).
//!
//! A posting does not go through the queue's in-flight table: its `wr_id`
//! carries a pointer to the request's shared buffers, with bits 63 and 62
//! set ([`SAFE_BIT`], [`PREPARED_BIT`]; table `wr_id`s keep bit 62 clear,
//! raw-path `wr_id`s bit 63). Each posting owns one strong count of that
//! `Arc`, leaked into the `wr_id` before the provider sees the request and
//! taken back by whoever polls the completion ([`claim_prepared`]). A
//! completion is polled once, so each count is taken back once; one that
//! never comes back (a completion consumed by `poll_raw`, a queue pair
//! destroyed or reset with postings outstanding) leaks the buffers, which
//! is safe. Claiming is one atomic decrement, without locks: the claim sits
//! between a completion and the next doorbell of a latency loop.

use std::sync::Arc;

use crate::buffer::Buf;
use crate::wq_table::{SgList, PREPARED_BIT, SAFE_BIT};
use crate::AddressHandle;

mod send;

pub use send::PreparedSend;

/// What a prepared request's postings share: its buffers (and a UD
/// destination's address handle). Every outstanding posting holds a strong
/// count, so the bytes are reachable from Rust only when the handle's is
/// the last one.
#[derive(Debug)]
struct Shared {
    sg: SgList,
    /// Held, never read: the C request points at it.
    #[allow(dead_code)]
    ah: Option<AddressHandle>,
    /// The `wr_id` the completions report.
    wr_id: u64,
}

// The pointer is stored shifted right by 3 bits below the two tag bits.
const _: () = assert!(std::mem::align_of::<Shared>() >= 8);
// Completions may be claimed (the count dropped) on any thread, and
// PreparedSend's `unsafe impl Send` relies on its `Arc<Shared>` being Send.
const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<Shared>()
};
const PTR_MASK: u64 = (1 << 61) - 1;

impl Shared {
    fn new(sg: SgList, ah: Option<AddressHandle>, wr_id: u64) -> Arc<Shared> {
        Arc::new(Shared { sg, ah, wr_id })
    }

    #[inline]
    fn is_posted(this: &Arc<Shared>) -> bool {
        Arc::strong_count(this) > 1
    }

    /// Buffer `index` when no posting is outstanding (`get_mut` acquires
    /// the completions' releases of their counts).
    #[inline]
    fn buf(this: &mut Arc<Shared>, index: usize) -> Option<&mut Buf> {
        match &mut Arc::get_mut(this)?.sg {
            SgList::One(b) if index == 0 => Some(b),
            SgList::Many(v) => v.get_mut(index),
            _ => None,
        }
    }

    #[inline]
    fn bytes(this: &mut Arc<Shared>, index: usize) -> Option<&[u8]> {
        match Shared::buf(this, index)? {
            Buf::Local(b) => Some(b),
            Buf::Frozen(b) => Some(b),
            _ => None,
        }
    }

    #[inline]
    fn bytes_mut(this: &mut Arc<Shared>, index: usize) -> Option<&mut [u8]> {
        match Shared::buf(this, index)? {
            Buf::Local(b) => Some(b),
            _ => None,
        }
    }

    fn buffers(this: &mut Arc<Shared>) -> Option<&SgList> {
        Some(&Arc::get_mut(this)?.sg)
    }

    /// The buffers, or the `Arc` back while a posting is outstanding.
    fn into_buffers(this: Arc<Shared>) -> Result<SgList, Arc<Shared>> {
        Arc::try_unwrap(this).map(|s| s.sg)
    }
}

/// One posting's strong count, leaked into its `wr_id` until the
/// completion is claimed.
struct Posting(*const Shared);

impl Posting {
    #[inline]
    fn new(shared: &Arc<Shared>) -> Posting {
        Posting(Arc::into_raw(Arc::clone(shared)))
    }

    #[inline]
    fn wr_id(&self) -> u64 {
        SAFE_BIT | PREPARED_BIT | ((self.0 as usize as u64) >> 3)
    }

    /// The provider refused the request: no completion will carry the
    /// count, so it is taken back here.
    #[cold]
    fn refused(self) {
        // SAFETY: the count `new` leaked, not handed to any completion
        // (the request was refused); taken back once, here.
        drop(unsafe { Arc::from_raw(self.0) });
    }
}

/// Whether a completion's `wr_id` is a prepared request's posting.
#[inline]
pub(crate) fn is_prepared(wr_id: u64) -> bool {
    wr_id & (SAFE_BIT | PREPARED_BIT) == SAFE_BIT | PREPARED_BIT
}

/// Takes back the strong count a posting leaked into `wr_id` and returns
/// the request's `wr_id`.
///
/// # Safety
/// `wr_id` is [`is_prepared`] and comes from a polled work completion, each
/// completion claimed at most once. (Only [`Posting`] makes such `wr_id`s:
/// tables keep bit 62 clear, the raw path's contract bit 63.)
#[inline]
pub(crate) unsafe fn claim_prepared(wr_id: u64) -> u64 {
    let ptr = ((wr_id & PTR_MASK) << 3) as usize as *const Shared;
    // SAFETY: `ptr` is what Posting::new leaked with `Arc::into_raw` for
    // this posting (caller's contract); the count is released here once.
    let shared = unsafe { Arc::from_raw(ptr) };
    shared.wr_id
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wq_table::WqTable;

    #[test]
    fn a_postings_wr_id_carries_its_count_and_nothing_else_claims_it() {
        let shared = Shared::new(SgList::Empty, None, 42);
        let wr_id = Posting::new(&shared).wr_id();
        assert!(is_prepared(wr_id));
        // Neither a table slot nor a raw-path id.
        assert_eq!(WqTable::<()>::decode(wr_id), None);
        assert!(!is_prepared(wr_id & !SAFE_BIT));
        assert!(!is_prepared(SAFE_BIT | (5 << 32) | 9));
        assert_eq!(Arc::strong_count(&shared), 2);
        assert!(Shared::is_posted(&shared));
        // SAFETY: `wr_id` holds the count leaked above, claimed once.
        assert_eq!(unsafe { claim_prepared(wr_id) }, 42);
        assert_eq!(Arc::strong_count(&shared), 1);
        assert!(!Shared::is_posted(&shared));
    }

    #[test]
    fn a_refused_posting_gives_its_count_back() {
        let shared = Shared::new(SgList::Empty, None, 1);
        Posting::new(&shared).refused();
        assert_eq!(Arc::strong_count(&shared), 1);
        assert!(Shared::into_buffers(shared).is_ok());
    }
}
