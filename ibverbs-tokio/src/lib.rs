//! Tokio integration of the [`rdma_verbs`] crate, on its public API: work
//! requests as futures ([`AsyncQueuePair`], [`CompletionFuture`]), a
//! context's asynchronous events as a stream ([`EventStream`]), and the
//! endpoint exchange of `rdma-verbs-runtime` over Tokio streams
//! ([`exchange`]).
//!
//! The completion channel's descriptor is registered with the runtime's
//! reactor (`AsyncFd`). There is no background task: the futures of a
//! queue pair share one dispatcher (a mutex-protected state) and whichever
//! of them is polled drives it. Driving means: consume the channel's events
//! (non-blocking `ibv_get_cq_event`; acknowledged in batches by the CQ),
//! re-arm the CQs (`ibv_req_notify_cq`), then poll them until empty, so that
//! a completion arriving after the last poll always raises a new event. Each
//! completion is handed to the future that posted its `wr_id` and that
//! future is woken. The reactor's waker wakes every waiting future of the
//! queue pair, so one of them always drives the dispatcher, whichever was
//! last to register with the reactor and whether or not it is still alive.
//!
//! Dropping a pending future cancels nothing on the device: the queue
//! pair's in-flight store keeps the buffers until the completion arrives,
//! which is then dropped. Errors are this crate's [`Error`], which carries
//! the core's ([`Error::Verbs`]).
#![deny(unsafe_op_in_unsafe_fn)]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs, clippy::undocumented_unsafe_blocks)]

mod error;
mod events;
mod exchange;
mod queue_pair;
mod reactor;

pub use error::{Error, Result};

// The README's example compiles (a `no_run` doctest).
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
pub use events::EventStream;
pub use exchange::exchange;
pub use queue_pair::{AsyncQueuePair, CompletionFuture};

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync<T: Send + Sync>() {}
    fn assert_send<T: Send>() {}

    #[test]
    fn futures_and_handles_cross_threads() {
        assert_send_sync::<AsyncQueuePair>();
        assert_send_sync::<CompletionFuture>();
        assert_send::<EventStream>();
    }
}
