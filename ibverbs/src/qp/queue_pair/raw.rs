//! The raw posting path: C work requests, no checks, no bookkeeping.

use rdma_verbs_sys as sys;

use crate::error::Result;
use crate::qp::queue_pair::QueuePair;

impl QueuePair {
    /// Posts C send requests directly: no checks, no bookkeeping.
    ///
    /// # Safety
    /// The caller must ensure that:
    /// * every SGE's memory is registered (its lkey valid) and stays valid,
    ///   unmoved and unaliased by Rust references the device may violate,
    ///   until the request's completion has been polled (for unsignaled
    ///   requests: until a later signaled request of this QP completed);
    /// * memory the device writes (receives, RDMA read, atomic results) is
    ///   not read or written through Rust references meanwhile;
    /// * every `wr_id` has bit 63 clear (set bits belong to the safe path,
    ///   whose [`CompletionQueue::poll`](crate::CompletionQueue::poll) would
    ///   otherwise hand out another request's buffers);
    /// * address handles referenced by UD requests outlive the requests;
    /// * the chain (`next` pointers) is valid and NULL-terminated.
    ///
    /// # Errors
    /// [`Error::Verb`](crate::Error::Verb) naming `ibv_post_send`; `bad_wr` is not reported.
    ///
    /// # References
    /// `ibv_post_send(3)`
    #[doc(alias = "ibv_post_send")]
    #[inline]
    pub unsafe fn post_send_raw(&self, wr: *mut sys::ibv_send_wr) -> Result<()> {
        // Written by a provider that refuses a request, never read here.
        let mut bad = std::mem::MaybeUninit::uninit();
        // SAFETY: forwarded to the caller's contract.
        let rc = unsafe { self.provider_post_send(wr, bad.as_mut_ptr()) };
        crate::error::ret_errno("ibv_post_send", rc)
    }

    /// Posts C receive requests directly.
    ///
    /// # Safety
    /// As [`QueuePair::post_send_raw`]: the buffers must stay valid and free
    /// of Rust references until the completion is polled, and `wr_id`s must
    /// have bit 63 clear.
    ///
    /// # Errors
    /// [`Error::Verb`](crate::Error::Verb) naming `ibv_post_recv`.
    #[doc(alias = "ibv_post_recv")]
    #[inline]
    pub unsafe fn post_recv_raw(&self, wr: *mut sys::ibv_recv_wr) -> Result<()> {
        // Written by a provider that refuses a request, never read here.
        let mut bad = std::mem::MaybeUninit::uninit();
        // SAFETY: forwarded to the caller's contract.
        let rc = unsafe { self.provider_post_recv(wr, bad.as_mut_ptr()) };
        crate::error::ret_errno("ibv_post_recv", rc)
    }
}
