//! Proofs that the runtime blocks keep the core's ownership model at
//! compile time (the core's own are `rdma_verbs::hazards`).
//!
//! Each section shows code the compiler **rejects** and its compiling twin.
//! The rejected code is a UI test, `ibverbs-runtime/tests/ui/NN_*.rs`,
//! shown here from that file; `ibverbs-runtime/tests/hazards.rs`
//! (trybuild) compiles each one and compares the compiler's whole output
//! with the `.stderr` file beside it. The numbers are those the sections
//! had among the core's proofs. The compiling twins are `no_run` doctests.
//!
//! # 20. Using a buffer after posting it through a request table
//!
//! [`RequestTable`](crate::RequestTable) posts the request as the send
//! queue does: the buffer moves into it and comes back only in the completion
//! handed out with the request's value.
//!
//! ```ignore
#![doc = include_str!("../tests/ui/20_use_buffer_after_table_post.rs")]
//! ```
//!
//! ```no_run
//! # use rdma_verbs::*;
//! # use rdma_verbs_runtime::{Message, MessageChannel, Reaped, Received, RequestTable, Result, WriteChannel};
//! # fn f(pd: &ProtectionDomain, qp: &QueuePair, cq: &CompletionQueue, remote: RemoteMemory) -> Result<()> {
//! let mut sq = qp.send_queue()?;
//! let mut table = RequestTable::new(cq, 16);
//! let buf = pd.alloc(64, AccessFlags::LOCAL_WRITE)?;
//! table.post_send(&mut sq, SendRequest::read(buf, remote), 7u32)?;
//! loop {
//!     if let Some(Reaped::Done(7, mut c)) = table.poll()? {
//!         c.result()?;
//!         let mut buf = c.take_local().unwrap();
//!         buf[0] = 1; // ours again
//!         break;
//!     }
//! }
//! # Ok(()) }
//! ```
//!
//! # 21. A table value that borrows the buffer it is posted with
//!
//! The value stays in the table while the request is outstanding, so it
//! cannot hold a borrow of the request's buffer: that would be a view of
//! bytes the device writes.
//!
//! ```ignore
#![doc = include_str!("../tests/ui/21_table_value_borrows_its_buffer.rs")]
//! ```
//!
//! ```no_run
//! # use rdma_verbs::*;
//! # use rdma_verbs_runtime::{Message, MessageChannel, Reaped, Received, RequestTable, Result, WriteChannel};
//! # fn f(pd: &ProtectionDomain, qp: &QueuePair, cq: &CompletionQueue, remote: RemoteMemory) -> Result<()> {
//! let mut sq = qp.send_queue()?;
//! let mut table = RequestTable::new(cq, 16);
//! let buf = pd.alloc(64, AccessFlags::LOCAL_WRITE)?;
//! let before = buf[0]; // a copy, not a borrow
//! table.post_send(&mut sq, SendRequest::read(buf, remote), before)?;
//! if let Some(Reaped::Done(before, mut c)) = table.poll()? {
//!     println!("{before} -> {}", c.take_local().unwrap()[0]);
//! }
//! # Ok(()) }
//! ```
//!
//! # 25. Reading a received message after releasing it
//!
//! A [`Message`](crate::Message) is the receive buffer the message landed
//! in; dropping it posts the buffer again, and from then on the peer's
//! next message may land there. Its bytes borrow it, so they cannot
//! outlive it.
//!
//! ```ignore
#![doc = include_str!("../tests/ui/25_read_message_after_release.rs")]
//! ```
//!
//! ```no_run
//! # use rdma_verbs::*;
//! # use rdma_verbs_runtime::{Message, MessageChannel, Reaped, Received, RequestTable, Result, WriteChannel};
//! # fn f(ch: &mut MessageChannel) -> Result<()> {
//! let msg = ch.recv(None)?.unwrap();
//! let first = msg.first().copied(); // copied out while the message lives
//! drop(msg);
//! println!("{first:?}");
//! # Ok(()) }
//! ```
//!
//! # 26. Holding a received message across the next receive
//!
//! A message borrows its channel: the next `recv` (which may post
//! buffers again and process what arrives) waits until it is released.
//!
//! ```ignore
#![doc = include_str!("../tests/ui/26_hold_message_across_recv.rs")]
//! ```
//!
//! ```no_run
//! # use rdma_verbs::*;
//! # use rdma_verbs_runtime::{Message, MessageChannel, Reaped, Received, RequestTable, Result, WriteChannel};
//! # fn f(ch: &mut MessageChannel) -> Result<()> {
//! let first_len = ch.recv(None)?.unwrap().len(); // dropped: released
//! let second = ch.recv(None)?.unwrap();
//! println!("{first_len} {}", second.len());
//! # Ok(()) }
//! ```
//!
//! # 27. Sending from a received message's buffer
//!
//! `send` copies its bytes into the channel's own send slot (or inline),
//! so no buffer of the caller is ever posted; and a message cannot be the
//! source while it borrows the channel. Copy it out, release it, then
//! send: the receive buffer goes back before the send takes a credit.
//!
//! ```ignore
#![doc = include_str!("../tests/ui/27_send_from_received_message.rs")]
//! ```
//!
//! ```no_run
//! # use rdma_verbs::*;
//! # use rdma_verbs_runtime::{Message, MessageChannel, Reaped, Received, RequestTable, Result, WriteChannel};
//! # fn f(ch: &mut MessageChannel) -> Result<()> {
//! let mut copy = [0u8; 64];
//! let len = {
//!     let msg = ch.recv(None)?.unwrap();
//!     let len = msg.len().min(copy.len());
//!     copy[..len].copy_from_slice(&msg[..len]);
//!     len
//! };
//! ch.send(&copy[..len], None)?;
//! # Ok(()) }
//! ```
//!
//! # 28. Two threads on one channel end
//!
//! A channel end's accounting (credits, sequence numbers, send slots) is
//! one thread's at a time, without a lock: `send` and `recv` take `&mut`,
//! so two threads cannot use it at once.
//!
//! ```ignore
#![doc = include_str!("../tests/ui/28_two_threads_one_channel_end.rs")]
//! ```
//!
//! ```no_run
//! # use rdma_verbs::*;
//! # use rdma_verbs_runtime::{Message, MessageChannel, Reaped, Received, RequestTable, Result, WriteChannel};
//! # fn f(mut ch: MessageChannel) -> Result<()> {
//! // One thread per end: move it there.
//! std::thread::spawn(move || ch.send(b"one", None)).join().unwrap()?;
//! # Ok(()) }
//! ```
//!
//! # 29. A reference into a write channel's inbox
//!
//! A [`WriteChannel`](crate::WriteChannel)'s inbox is written by the
//! peer with RDMA; the peer holds the key to all of it, so no Rust
//! reference to those bytes may exist. A received write
//! ([`Received`](crate::Received)) has no `Deref` and no index: its bytes
//! come out only through volatile copies.
//!
//! ```ignore
#![doc = include_str!("../tests/ui/29_reference_into_write_inbox.rs")]
//! ```
//!
//! ```no_run
//! # use rdma_verbs::*;
//! # use rdma_verbs_runtime::{Message, MessageChannel, Reaped, Received, RequestTable, Result, WriteChannel};
//! # fn f(ch: &mut WriteChannel) -> Result<()> {
//! let w = ch.recv(None)?.unwrap();
//! let mut floats = vec![0f32; w.len() / 4];
//! w.read_into(0, &mut floats)?; // volatile copy
//! # Ok(()) }
//! ```
//!
//! # 30. Reading a received write after its credit went back
//!
//! Dropping a [`Received`](crate::Received) returns its slot's credit:
//! from then on the peer may write the slot again. The guard borrows its
//! channel, so it cannot be kept (and read) across the next `recv` or
//! `send`, which process credits and completions.
//!
//! ```ignore
#![doc = include_str!("../tests/ui/30_read_write_after_credit_returned.rs")]
//! ```
//!
//! ```no_run
//! # use rdma_verbs::*;
//! # use rdma_verbs_runtime::{Message, MessageChannel, Reaped, Received, RequestTable, Result, WriteChannel};
//! # fn f(ch: &mut WriteChannel) -> Result<()> {
//! let mut b = [0u8; 4];
//! ch.recv(None)?.unwrap().copy_to_slice(0, &mut b)?; // copied, then released
//! ch.send(&b, None)?;
//! # Ok(()) }
//! ```
//!
