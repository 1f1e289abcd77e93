//! The runtime blocks' errors: the core's ([`Error::Verbs`]) and their own.

use std::io;

use rdma_verbs::error::WireProblem;

use crate::ChannelProblem;

/// What the runtime blocks return.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// An error of a runtime block: a verb or argument error of the core, or
/// one of the block's own (its out-of-band stream, a peer's messages, a
/// full table, a channel's protocol).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A verb failed or the core refused an argument
    /// ([`rdma_verbs::Error`]).
    #[error(transparent)]
    Verbs(#[from] rdma_verbs::Error),
    /// The out-of-band stream of an endpoint exchange, a mesh connection
    /// or a barrier ([`exchange`](crate::exchange), [`Ranks`](crate::Ranks),
    /// [`Mesh::barrier`](crate::Mesh::barrier)) failed: an I/O error, or the
    /// deadline passed (`io.kind()` is [`TimedOut`](io::ErrorKind::TimedOut),
    /// the message says after how long). A peer that closes the stream
    /// mid-message is [`Error::BadWireFormat`] instead (its message was cut
    /// short).
    #[error("{during} failed: {io}")]
    OutOfBand {
        /// What was under way (`"endpoint exchange"`, `"mesh connect"`,
        /// `"mesh accept"`, `"barrier"`).
        during: &'static str,
        /// The stream's error.
        io: io::Error,
    },
    /// A peer's message that is not one of this crate's: an exchange
    /// frame, the endpoint inside it, a mesh hello or a barrier message of
    /// another version, cut short, or with a value out of its field's
    /// range. Nothing was connected with it.
    #[error("malformed {what} message: {problem}")]
    BadWireFormat {
        /// The message (`"endpoint exchange"`, `"Endpoint"`, `"mesh
        /// hello"`, `"barrier"`).
        what: &'static str,
        /// What is wrong with it, with its numbers.
        problem: WireProblem,
    },
    /// An error of one peer of a [`Mesh`](crate::Mesh): its stream or
    /// its messages ([`Error::OutOfBand`], [`Error::BadWireFormat`]), or
    /// connecting a queue pair to the endpoint it sent.
    #[error("peer rank {rank}: {error}")]
    Peer {
        /// The peer's rank.
        rank: usize,
        /// What went wrong with it.
        error: Box<Error>,
    },
    /// A message longer than a [`MessageChannel`](crate::MessageChannel)
    /// slot: refused, not split; nothing was sent and the channel stays
    /// usable.
    #[error("a message of {len} bytes does not fit in a {max}-byte slot")]
    MessageTooLarge {
        /// The message's length.
        len: usize,
        /// The slot size, the largest message.
        max: usize,
    },
    /// The peer of a channel broke its protocol: a message out of order,
    /// more credits returned than used, a message without a credit, a
    /// hello that does not match. The channel moved its queue pair to ERR.
    #[error("channel peer broke the protocol: {problem}")]
    ChannelProtocol {
        /// What was wrong, with its numbers.
        problem: ChannelProblem,
    },
    /// A blocking call waited its whole timeout: a
    /// [`MessageChannel::send`](crate::MessageChannel::send) that found no
    /// credit (the peer did not release its messages). Nothing was done;
    /// the call may be repeated.
    #[error("{op} timed out after {timeout:?}")]
    TimedOut {
        /// The call (`"MessageChannel::send"`).
        op: &'static str,
        /// The timeout it was given.
        timeout: std::time::Duration,
    },
    /// A [`RequestTable`](crate::RequestTable) has a value outstanding in
    /// each of its slots: poll it first. Refused before posting.
    #[error("the request table is full ({capacity} requests outstanding)")]
    RequestTableFull {
        /// The table's capacity.
        capacity: u32,
    },
    /// A queue posted to through a [`RequestTable`](crate::RequestTable)
    /// reports to another completion queue than the table polls: its
    /// completion (and the value) would never come back. Nothing posted.
    #[error(
        "the queue pair's {queue} reports to another completion queue than the request table's"
    )]
    CompletionQueueMismatch {
        /// Which queue (`send queue`, `receive queue`).
        queue: &'static str,
    },
    /// A [`SendStream`](crate::SendStream) posted through another
    /// [`RequestTable`](crate::RequestTable) than the one that made it.
    /// Nothing posted.
    #[error("the send stream belongs to another request table")]
    StreamOfAnotherTable,
}

impl Error {
    fn io_kind(&self) -> io::ErrorKind {
        use io::ErrorKind as K;
        match self {
            Error::Verbs(e) => e.io_kind(),
            Error::OutOfBand { io, .. } => io.kind(),
            Error::BadWireFormat { .. } | Error::ChannelProtocol { .. } => K::InvalidData,
            Error::Peer { error, .. } => error.io_kind(),
            Error::MessageTooLarge { .. }
            | Error::CompletionQueueMismatch { .. }
            | Error::StreamOfAnotherTable => K::InvalidInput,
            Error::TimedOut { .. } => K::TimedOut,
            Error::RequestTableFull { .. } => K::ResourceBusy,
        }
    }
}

impl From<Error> for io::Error {
    /// The core's errors as [`rdma_verbs::Error`] converts them; the
    /// runtime's own as the inner error of an `io::Error` of the closest
    /// kind: the stream's own kind for [`Error::OutOfBand`],
    /// `InvalidData` for a peer's malformed messages, `InvalidInput` for
    /// refused arguments, `TimedOut`, `ResourceBusy` for a full table.
    fn from(e: Error) -> io::Error {
        match e {
            Error::Verbs(e) => io::Error::from(e),
            e => io::Error::new(e.io_kind(), e),
        }
    }
}

impl<B> From<rdma_verbs::qp::Refused<B>> for Error {
    /// A refused request's error (its buffers are dropped: take them out
    /// of the [`Refused`](rdma_verbs::qp::Refused) first to keep them).
    fn from(r: rdma_verbs::qp::Refused<B>) -> Error {
        Error::Verbs(r.error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One value of every variant; the match has no wildcard, so a new
    /// variant does not compile until it is listed here.
    fn every_variant() -> Vec<Error> {
        let all = vec![
            Error::Verbs(rdma_verbs::Error::QueueFull {
                queue: "send queue",
                depth: 16,
            }),
            Error::OutOfBand {
                during: "endpoint exchange",
                io: io::Error::new(io::ErrorKind::TimedOut, "no answer within 5s"),
            },
            Error::BadWireFormat {
                what: "mesh hello",
                problem: WireProblem::Version {
                    version: 9,
                    supported: 1,
                },
            },
            Error::Peer {
                rank: 2,
                error: Box::new(Error::BadWireFormat {
                    what: "endpoint exchange",
                    problem: WireProblem::Mismatch {
                        field: "magic",
                        value: 0x4745_5420,
                        expected: 0x4942_5658,
                    },
                }),
            },
            Error::MessageTooLarge {
                len: 4097,
                max: 4096,
            },
            Error::ChannelProtocol {
                problem: ChannelProblem::Credits {
                    returned: 5,
                    outstanding: 3,
                },
            },
            Error::TimedOut {
                op: "MessageChannel::send",
                timeout: std::time::Duration::from_millis(250),
            },
            Error::RequestTableFull { capacity: 16 },
            Error::CompletionQueueMismatch {
                queue: "send queue",
            },
            Error::StreamOfAnotherTable,
        ];
        for e in &all {
            match e {
                Error::Verbs(_)
                | Error::OutOfBand { .. }
                | Error::BadWireFormat { .. }
                | Error::Peer { .. }
                | Error::MessageTooLarge { .. }
                | Error::ChannelProtocol { .. }
                | Error::TimedOut { .. }
                | Error::RequestTableFull { .. }
                | Error::CompletionQueueMismatch { .. }
                | Error::StreamOfAnotherTable => {}
            }
        }
        all
    }

    #[test]
    fn every_variant_displays_its_numbers_and_keeps_its_kind_as_io_error() {
        for e in every_variant() {
            let text = e.to_string();
            assert!(!text.trim().is_empty() && !text.contains('{'), "{e:?}");
            let kind = e.io_kind();
            let io: io::Error = e.into();
            assert_eq!(io.kind(), kind, "{text}");
        }
        let e = Error::Peer {
            rank: 2,
            error: Box::new(Error::TimedOut {
                op: "barrier",
                timeout: std::time::Duration::from_secs(1),
            }),
        };
        assert_eq!(e.to_string(), "peer rank 2: barrier timed out after 1s");
        assert_eq!(e.io_kind(), io::ErrorKind::TimedOut);
        let core = Error::from(rdma_verbs::Error::QueueFull {
            queue: "send queue",
            depth: 16,
        });
        assert!(matches!(
            core,
            Error::Verbs(rdma_verbs::Error::QueueFull { .. })
        ));
        assert_eq!(io::Error::from(core).kind(), io::ErrorKind::ResourceBusy);
    }
}
