//! The Tokio integration's errors: the core's ([`Error::Verbs`]) and its
//! own.

use std::io;

/// What the Tokio integration returns.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// An error of the Tokio integration: a verb or argument error of the
/// core, or one of its own (no runtime, a descriptor already driven, a
/// future polled again).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A verb failed (`ibv_get_cq_event`, `ibv_req_notify_cq`,
    /// `ibv_poll_cq`, `epoll_wait` of the reactor, …), a request completed
    /// with an error status, or the core refused an argument
    /// ([`rdma_verbs::Error`]).
    #[error(transparent)]
    Verbs(#[from] rdma_verbs::Error),
    /// A wrapper created outside a Tokio runtime (or one without IO
    /// enabled).
    #[error("{by} needs a Tokio runtime: create it from within one (with IO enabled)")]
    NoRuntime {
        /// The wrapper (`"AsyncQueuePair"`, `"EventStream"`).
        by: &'static str,
    },
    /// A completion channel, or a context's async events, already driven
    /// by another wrapper in this process (on this runtime or another):
    /// two would consume each other's events.
    #[error(
        "{by}: this {descriptor} is already driven by another {by} in this process \
         (one per completion channel or context, across runtimes)"
    )]
    AlreadyDriven {
        /// The wrapper refused (`AsyncQueuePair`, `EventStream`).
        by: &'static str,
        /// What it wanted to drive (`completion channel`,
        /// `context's async events`).
        descriptor: &'static str,
    },
    /// A `CompletionFuture` polled again after it resolved.
    #[error("CompletionFuture polled after it resolved")]
    PolledAfterCompletion,
}

impl<B> From<rdma_verbs::qp::Refused<B>> for Error {
    /// A refused request's error (its buffers are dropped: take them out
    /// of the [`Refused`](rdma_verbs::qp::Refused) first to keep them).
    fn from(r: rdma_verbs::qp::Refused<B>) -> Error {
        Error::Verbs(r.error)
    }
}

impl From<Error> for io::Error {
    /// The core's errors as [`rdma_verbs::Error`] converts them; the others
    /// as the inner error of an `io::Error`: `ResourceBusy` for a
    /// descriptor already driven, `Other` for the rest.
    fn from(e: Error) -> io::Error {
        match e {
            Error::Verbs(e) => io::Error::from(e),
            e @ Error::AlreadyDriven { .. } => io::Error::new(io::ErrorKind::ResourceBusy, e),
            e => io::Error::other(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_variant_displays_and_converts() {
        let all = [
            Error::Verbs(rdma_verbs::Error::QueueFull {
                queue: "send queue",
                depth: 16,
            }),
            Error::NoRuntime { by: "EventStream" },
            Error::AlreadyDriven {
                by: "AsyncQueuePair",
                descriptor: "completion channel",
            },
            Error::PolledAfterCompletion,
        ];
        let kinds = [
            io::ErrorKind::ResourceBusy,
            io::ErrorKind::Other,
            io::ErrorKind::ResourceBusy,
            io::ErrorKind::Other,
        ];
        for (e, kind) in all.into_iter().zip(kinds) {
            match &e {
                Error::Verbs(_)
                | Error::NoRuntime { .. }
                | Error::AlreadyDriven { .. }
                | Error::PolledAfterCompletion => {}
            }
            let text = e.to_string();
            assert!(!text.trim().is_empty() && !text.contains('{'), "{e:?}");
            assert_eq!(io::Error::from(e).kind(), kind, "{text}");
        }
    }
}
