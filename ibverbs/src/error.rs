//! The crate's one error type and the helpers that turn C return conventions
//! into `Result`.

use std::io;

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

    /// The OS error code, when this is a verb error.
    pub fn raw_os_error(&self) -> Option<i32> {
        match self {
            Error::Verb { source, .. } => source.raw_os_error(),
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
#[inline]
pub(crate) fn ret_errno(verb: &'static str, rc: i32) -> Result<()> {
    match rc {
        0 => Ok(()),
        -1 => Err(Error::last_os(verb)),
        e if e < 0 => Err(Error::from_errno(verb, -e)),
        e => Err(Error::from_errno(verb, e)),
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
#[inline]
pub(crate) fn ret_count(verb: &'static str, rc: i32) -> Result<usize> {
    if rc >= 0 {
        Ok(rc as usize)
    } else {
        let source = io::Error::last_os_error();
        let source = if source.raw_os_error().unwrap_or(0) == 0 {
            io::Error::other(format!("returned {rc}"))
        } else {
            source
        };
        Err(Error::Verb { verb, source })
    }
}
