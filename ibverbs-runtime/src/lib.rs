//! Runtime building blocks on the [`rdma_verbs`] crate's public API: what a
//! storage service, an RPC system or a collective library builds first.
//!
//! * [`exchange`]: this side's [`Endpoint`](rdma_verbs::Endpoint) and some
//!   private bytes for the peer's, over a stream, within a deadline; the
//!   message is sans-IO ([`message`], [`Incoming`]) for any other stream.
//! * [`Ranks`] and [`Mesh`]: N ranks connected pairwise (all to all, or a
//!   ring), one RC queue pair per peer, and a barrier.
//! * [`RequestTable`]: a caller value per outstanding request, handed back
//!   with its completion; [`SendStream`] signals every Nth send.
//! * [`MessageChannel`]: eager messages with credit flow control, received
//!   in place; [`WriteChannel`]: RDMA writes into a peer's inbox.
//!
//! None of them adds an owner of memory: buffers move into the core's
//! queues and come back in its completions, as with any post (`DESIGN.md`
//! in the repository). [`hazards`] proves their compile-time guarantees.
//! Errors are this crate's [`Error`], which carries the core's
//! ([`Error::Verbs`]).
#![deny(unsafe_op_in_unsafe_fn)]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs, clippy::undocumented_unsafe_blocks)]

mod credit_window;
mod error;
mod exchange;
pub mod hazards;
mod message_channel;
mod request_table;
mod write_channel;

pub use error::{Error, Result};

// The README's example compiles (a `no_run` doctest).
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
pub use exchange::{
    exchange, message, Incoming, Mesh, Peer, PeerInfo, Ranks, TimedStream, MAX_PRIVATE_LEN,
};
pub use message_channel::{ChannelProblem, Message, MessageChannel};
pub use request_table::{Reaped, RequestTable, SendStream, TableRefused};
pub use write_channel::{Received, WriteChannel};
