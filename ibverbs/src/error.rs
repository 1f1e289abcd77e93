//! The crate's one error type and the helpers that turn C return conventions
//! into `Result`.

use std::io;

use crate::queue_pair::{SendOp, SendOption};
use crate::work_completion::WcStatus;

/// What can go wrong in this crate.
///
/// Every error from libibverbs names the verb that failed (`ibv_reg_mr`,
/// `ibv_modify_qp`, …) and carries the `errno` it reported.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A verb failed; `source` is the errno it reported.
    #[error("{verb} failed: {source}")]
    Verb {
        /// The libibverbs function that failed.
        verb: &'static str,
        /// The OS error it reported.
        #[source]
        source: io::Error,
    },
    /// A work request completed with an error status.
    #[error("work request {wr_id} completed with {status} (vendor error {vendor_err:#x})")]
    WorkCompletion {
        /// The completion status.
        status: WcStatus,
        /// The work request id.
        wr_id: u64,
        /// The provider's vendor error syndrome.
        vendor_err: u32,
    },
    /// An argument was rejected before anything was passed to the device.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A queue pair state transition that the IBA state table forbids, or
    /// that lacks a required attribute.
    #[error("illegal queue pair transition {from:?} -> {to:?}: {reason}")]
    InvalidTransition {
        /// The current state.
        from: crate::QpState,
        /// The requested state.
        to: crate::QpState,
        /// What is wrong (e.g. the missing attribute).
        reason: String,
    },
    /// The device or provider does not support the capability.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// A work queue has no room for more work requests.
    #[error("{queue} is full ({depth} work requests outstanding)")]
    QueueFull {
        /// Which queue (`send queue`, `receive queue`, `shared receive queue`).
        queue: &'static str,
        /// Its capacity.
        depth: u32,
    },
    /// No RDMA device matched.
    #[error("no RDMA device found{0}")]
    NoDevice(String),
    /// The operation is not available on this queue pair type (a read or
    /// an atomic on UC, anything but a send on UD). Nothing was posted.
    #[error("{op} is not available on a {qp_type:?} queue pair")]
    OpNotAvailable {
        /// The request's operation.
        op: SendOp,
        /// The queue pair's transport.
        qp_type: crate::QpType,
    },
    /// A send request carries an option its operation (or the queue pair's
    /// type) does not take; DESIGN.md's request-option table lists every
    /// cell. Checked before the provider sees the request: nothing was
    /// posted and the request (buffers included) is handed back.
    #[error("{option} is not allowed on {op} ({qp_type:?} queue pair)")]
    OptionNotAllowed {
        /// The offending option.
        option: SendOption,
        /// The request's operation.
        op: SendOp,
        /// The queue pair's transport.
        qp_type: crate::QpType,
    },
    /// A send request lacks an option its operation needs on this queue
    /// pair type (a UD send without its destination).
    #[error("{op} on a {qp_type:?} queue pair needs {option}")]
    OptionRequired {
        /// The missing option.
        option: SendOption,
        /// The request's operation.
        op: SendOp,
        /// The queue pair's transport.
        qp_type: crate::QpType,
    },
    /// More inline bytes than the queue pair's `max_inline_data`.
    #[error("{len} bytes to send inline, the queue pair allows {max}")]
    InlineTooLarge {
        /// Bytes asked for.
        len: u64,
        /// The queue pair's `max_inline_data`.
        max: u32,
    },
    /// An unsignaled request carries a buffer that only its own
    /// completion could hand back (a `LocalBuffer` or `SharedBuffer`):
    /// unsignaled requests may carry only inline data or `FrozenBuffer`s.
    #[error(
        "an unsignaled {op} must not carry exclusive buffers (they could not be handed back): \
         use inline data or FrozenBuffer"
    )]
    UnsignaledExclusive {
        /// The request's operation.
        op: SendOp,
    },
    /// A bind or invalidate of this memory window is still outstanding:
    /// one window request at a time, so that its completion decides what
    /// the device holds (poll it first).
    #[error("a bind or invalidate of this memory window is still outstanding: poll its completion first")]
    WindowBusy,
    /// An earlier bind or invalidate of this memory window ended without a
    /// completion (its queue pair was reset or destroyed first): what the
    /// device holds is unknown, so the window refuses further binds; drop
    /// it (`ibv_dealloc_mw` revokes every binding).
    #[error(
        "an earlier bind or invalidate of this memory window ended without a completion: \
         its binding is unknown; deallocate the window"
    )]
    WindowIndeterminate,
    /// A receive posted to a queue pair in ERR: the device would hold it
    /// without ever flushing it (rxe flushes only on the move to ERR).
    /// Refused, buffers handed back; reset the queue pair to use it again.
    #[error("{verb}: the queue pair is in ERR, a receive posted now would never be flushed")]
    QueuePairInError {
        /// The verb that was not called.
        verb: &'static str,
    },
    /// A completion queue smaller than the work queues that report to it:
    /// the depths asked for the queue pairs' send and receive queues (and
    /// a shared receive queue's, once per CQ) add up to more than its
    /// capacity. An overrun loses completions, and with them the buffers of
    /// their requests (an SRQ's slot for the SRQ's whole life), so the queue
    /// pair is not created. Providers may grant deeper queues than asked
    /// ([`QueuePair::caps`](crate::QueuePair::caps)): keeping more than the
    /// asked depth outstanding can still overrun a CQ sized to the request.
    #[error(
        "the completion queue holds {capacity} completions, but the queues reporting to it \
         were asked for {needed}: create it with at least {needed} entries"
    )]
    CqTooSmall {
        /// The CQ's capacity.
        capacity: u32,
        /// The sum of the depths asked for the queues that would report
        /// to it.
        needed: u64,
    },
    /// A completion channel (or a context's async-event descriptor) is
    /// already driven by an [`AsyncQueuePair`](crate::AsyncQueuePair) (an
    /// `AsyncEvents`) in this process, on this or another Tokio runtime:
    /// two readers would steal each other's events and completions. Drop
    /// the first (all its clones) before wrapping again.
    #[error(
        "{by}: this {descriptor} is already driven by another {by} in this process \
         (one per completion channel or context, across runtimes)"
    )]
    AlreadyDriven {
        /// The wrapper refused (`AsyncQueuePair`, `AsyncEvents`).
        by: &'static str,
        /// What it wanted to drive (`completion channel`,
        /// `context's async events`).
        descriptor: &'static str,
    },
}

/// An OS error with an explanation: `Invalid argument (os error 22); rxe0
/// has no port 0 (its ports are 1..=1)`.
#[derive(Debug)]
struct Hinted {
    errno: Option<i32>,
    error: String,
    hint: String,
}

impl std::fmt::Display for Hinted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}; {}", self.error, self.hint)
    }
}

impl std::error::Error for Hinted {}

fn hinted_errno(source: &io::Error) -> Option<i32> {
    source.get_ref()?.downcast_ref::<Hinted>()?.errno
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// A verb error from the current `errno`.
    pub(crate) fn last_os(verb: &'static str) -> Self {
        Error::Verb {
            verb,
            source: io::Error::last_os_error(),
        }
    }

    /// A verb error from an explicit errno value (verbs that return it).
    pub(crate) fn from_errno(verb: &'static str, errno: i32) -> Self {
        Error::Verb {
            verb,
            source: io::Error::from_raw_os_error(errno),
        }
    }

    /// A verb error from an errno value with an explanation of the likely
    /// cause (the bad argument, the limit that was hit), keeping the verb
    /// and the errno ([`Error::raw_os_error`] still reports it).
    pub(crate) fn with_hint(self, hint: Option<String>) -> Self {
        let Some(hint) = hint else { return self };
        match self {
            Error::Verb { verb, source } => {
                let errno = source.raw_os_error().or_else(|| hinted_errno(&source));
                Error::Verb {
                    verb,
                    source: io::Error::new(
                        source.kind(),
                        Hinted {
                            errno,
                            error: source.to_string(),
                            hint,
                        },
                    ),
                }
            }
            other => other,
        }
    }

    /// The OS error code, when this is a verb error.
    pub fn raw_os_error(&self) -> Option<i32> {
        match self {
            Error::Verb { source, .. } => source.raw_os_error().or_else(|| hinted_errno(source)),
            _ => None,
        }
    }

    /// The verb that failed, when this is a verb error.
    pub fn verb(&self) -> Option<&'static str> {
        match self {
            Error::Verb { verb, .. } => Some(verb),
            _ => None,
        }
    }
}

/// Verbs that return 0 on success and an errno value on failure
/// (`ibv_modify_qp`, `ibv_post_send`, `ibv_dealloc_pd`, …).
///
/// Some providers return -1 and set `errno` instead; both are handled.
/// The success test is inlined (every post ends with it); building the
/// error is not.
#[inline(always)]
pub(crate) fn ret_errno(verb: &'static str, rc: i32) -> Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(errno_error(verb, rc))
    }
}

/// The error of a nonzero return code `rc` (see [`ret_errno`]).
#[cold]
#[inline(never)]
pub(crate) fn errno_error(verb: &'static str, rc: i32) -> Error {
    match rc {
        -1 => Error::last_os(verb),
        e if e < 0 => Error::from_errno(verb, -e),
        e => Error::from_errno(verb, e),
    }
}

/// Verbs that return a pointer, NULL with `errno` set on failure.
#[inline]
pub(crate) fn ret_ptr<T>(verb: &'static str, ptr: *mut T) -> Result<std::ptr::NonNull<T>> {
    std::ptr::NonNull::new(ptr).ok_or_else(|| {
        let err = io::Error::last_os_error();
        // A provider that returns NULL without setting errno still failed.
        let source = if err.raw_os_error() == Some(0) {
            io::Error::other("returned NULL without setting errno")
        } else {
            err
        };
        Error::Verb { verb, source }
    })
}

/// Verbs that return a non-negative count, or negative on failure
/// (`ibv_poll_cq` returns a negative value; `errno` is not reliable there).
/// The success test is inlined (a busy-polling loop calls it on every
/// empty poll); building the error is not.
#[inline]
pub(crate) fn ret_count(verb: &'static str, rc: i32) -> Result<usize> {
    if rc >= 0 {
        Ok(rc as usize)
    } else {
        Err(count_error(verb, rc))
    }
}

/// The error of a negative count `rc` (see [`ret_count`]).
#[cold]
#[inline(never)]
fn count_error(verb: &'static str, rc: i32) -> Error {
    let source = io::Error::last_os_error();
    let source = if source.raw_os_error().unwrap_or(0) == 0 {
        io::Error::other(format!("returned {rc}"))
    } else {
        source
    };
    Error::Verb { verb, source }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hints_keep_the_verb_and_the_errno() {
        let e = Error::from_errno("ibv_query_port", libc::EINVAL)
            .with_hint(Some("rxe0 has no port 0".into()));
        assert_eq!(e.verb(), Some("ibv_query_port"));
        assert_eq!(e.raw_os_error(), Some(libc::EINVAL));
        let text = e.to_string();
        assert!(
            text.starts_with("ibv_query_port failed: Invalid argument"),
            "{text}"
        );
        assert!(text.ends_with("; rxe0 has no port 0"), "{text}");
        // A second hint keeps the errno too; no hint changes nothing.
        let e = e.with_hint(Some("more".into()));
        assert_eq!(e.raw_os_error(), Some(libc::EINVAL));
        let e = Error::from_errno("ibv_reg_mr", libc::ENOMEM).with_hint(None);
        assert!(
            matches!(&e, Error::Verb { source, .. } if source.raw_os_error() == Some(libc::ENOMEM))
        );
        // Other variants are left alone.
        let e = Error::InvalidArgument("x".into()).with_hint(Some("y".into()));
        assert_eq!(e.to_string(), "invalid argument: x");
    }
}
