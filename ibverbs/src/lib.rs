//! Safe, zero-overhead RDMA verbs over rdma-core's `libibverbs`.
//!
//! # The ownership model
//!
//! Registration consumes the memory it registers and returns the only
//! handle to it; posting a work request *moves* its buffers into the queue
//! pair; the completion hands them back. So the device never touches freed,
//! moved or aliased memory, and no Rust reference exists to bytes the device
//! or a peer may change:
//!
//! * [`LocalBuffer`]: exclusive, `&[u8]`/`&mut [u8]` while you hold it.
//! * [`SharedBuffer`]: memory peers may write (remote write/atomic rights):
//!   volatile copies and atomics only.
//! * [`FrozenBuffer`]: read-only and cloneable, for sends the device only
//!   reads (several at once, or unsignaled).
//!
//! Objects are `Arc` handles that keep their parents alive, so they can be
//! dropped in any order. [`hazards`] proves the type-level guarantees with
//! UI tests whose compiler output is checked (`ibverbs/tests/ui/`);
//! `DESIGN.md` in the repository explains the model in a page. The `unsafe` raw path ([`QueuePair::post_send_raw`],
//! [`CompletionQueue::poll_raw`]) skips all bookkeeping.
//!
//! # Every verb, by example
//!
//! Setup: device, protection domain, completion queue, queue pair, and a
//! connection (here a queue pair connected to itself; between hosts,
//! exchange [`Endpoint`]s out of band):
//!
//! ```no_run
//! use ibverbs::*;
//! # fn main() -> Result<()> {
//! let ctx = open_device("rxe0")?;                    // ibv_open_device
//! let port = ctx.active_port()?;                     // ibv_query_port
//! let gid_index = ctx.default_gid_index(port)?;      // ibv_query_gid_table
//! let pd = ctx.alloc_pd()?;                          // ibv_alloc_pd
//! let cq = ctx.create_cq(64).build()?;               // ibv_create_cq
//! let qp = pd.create_qp(QpType::Rc, &cq, &cq)        // ibv_create_qp
//!     .max_send_wr(16).max_recv_wr(16).max_inline_data(64)
//!     .build()?;
//! let local = LocalPort::query(&ctx, port, Some(gid_index))?; // ibv_query_port, _gid
//! let me = local.endpoint(&qp, Endpoint::random_psn())?; // to_bytes() for the peer
//! let remote_rights = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ
//!     | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC;
//! qp.connect(&me, &me,                               // ibv_modify_qp x3
//!     &ConnectOptions::new(port).local_port(&local).remote_access(remote_rights))?;
//! let mut done = Completions::with_capacity(16);
//!
//! // Posting handles, one per queue, exclusive: the send queue's once the
//! // queue pair can send (RTS); kept, every post takes them `&mut`.
//! let mut sq = qp.send_queue()?;
//! let mut rq = qp.recv_queue()?;
//!
//! // Send / receive (ibv_post_recv, ibv_post_send, ibv_poll_cq).
//! let recv = pd.register(vec![0u8; 4096], AccessFlags::LOCAL_WRITE)?;
//! let mut send = pd.alloc(4096, AccessFlags::LOCAL_WRITE)?;
//! send[..5].copy_from_slice(b"hello");
//! rq.recv(recv, 1)?;                                 // wr_id 1
//! sq.send(send, Wr::id(2).imm(7))?;
//! let mut seen = 0;
//! while seen < 2 {
//!     for mut c in cq.poll(&mut done)? {             // one walk, borrowed entries
//!         seen += 1;
//!         c.result()?;                               // typed WcStatus on error
//!         if c.opcode() == WcOpcode::Recv {
//!             assert_eq!(c.imm_data(), Some(7));
//!             assert_eq!(&c.take_local().unwrap()[..5], b"hello");
//!         }                                          // what is not taken is freed
//!     }
//! }
//!
//! // Inline send: the bytes are copied before send_inline returns.
//! sq.send_inline(b"tiny", Wr::id(3))?;
//!
//! // RDMA write and read: the peer shares memory and sends its RemoteMemory.
//! let target = pd.alloc_shared(4096, remote_rights)?;    // ibv_reg_mr
//! let remote = target.remote().unwrap();
//! sq.write(pd.alloc(64, AccessFlags::LOCAL_WRITE)?, remote, Wr::id(4))?;
//! sq.read(pd.alloc(64, AccessFlags::LOCAL_WRITE)?, remote, Wr::id(5))?;
//!
//! // Atomics on an 8-byte aligned word; the old value lands in `result`.
//! let word = remote.slice(0, 8).unwrap();
//! let result = pd.alloc(8, AccessFlags::LOCAL_WRITE)?;
//! sq.fetch_and_add(result, word, 1, Wr::id(6))?;
//! let result = pd.alloc(8, AccessFlags::LOCAL_WRITE)?;
//! sq.compare_and_swap(result, word, 1, 42, Wr::id(7))?;
//!
//! // Periodic signaling with a frozen (shared read-only) buffer, one post
//! // at a time or as a chain of requests with one doorbell.
//! let msg = pd.alloc(64, AccessFlags::LOCAL_WRITE)?.freeze();
//! for i in 0..8 {
//!     let o = if i == 7 { Wr::id(i) } else { Wr::id(i).unsignaled() };
//!     sq.write(msg.clone(), remote, o)?;
//! }
//! let mut chain: Vec<SendRequest> = (0..8)
//!     .map(|i| SendRequest::write(msg.clone(), remote).signaled(i == 7))
//!     .collect();
//! sq.post_chain(&mut chain)?;                           // posted ones leave `chain`
//!
//! // One request, many postings: checked and built once (as C code reuses
//! // one ibv_send_wr); the bytes are reachable when nothing is outstanding.
//! let mut read =
//!     sq.prepare(SendRequest::read(pd.alloc(64, AccessFlags::LOCAL_WRITE)?, remote).wr_id(9))?;
//! sq.post_prepared(&mut read)?;
//! let c = loop {
//!     match cq.poll_one()? { Some(c) if c.wr_id() == 9 => break c, _ => {} }
//! };
//! c.result()?;
//! let _fresh = read.bytes(0);                           // Some once completed
//!
//! // The same for receives: one buffer, re-posted after each message.
//! let mut recv =
//!     rq.prepare(RecvRequest::new(pd.alloc(256, AccessFlags::LOCAL_WRITE)?).wr_id(1))?;
//! rq.post_prepared(&mut recv)?;                         // bytes(0) is None until it completes
//!
//! // Completion events: sleep on a channel instead of spinning. `wait`
//! // polls, arms (ibv_req_notify_cq), polls again, sleeps on the channel's
//! // fd and reads the event (ibv_get_cq_event, acked in batches); an empty
//! // batch on timeout.
//! let channel = ctx.create_comp_channel()?;             // ibv_create_comp_channel
//! let cq2 = ctx.create_cq(16).channel(&channel).build()?;
//! let _n = cq2.wait(&mut done, Some(std::time::Duration::from_millis(10)))?.len();
//!
//! // Shared receive queue for many QPs: its own receive handle.
//! let srq = pd.create_srq(64).build()?;                 // ibv_create_srq
//! let qp2 = pd.create_qp(QpType::Rc, &cq, &cq).srq(&srq).build()?;
//! let mut srq_rq = srq.recv_queue()?;
//! srq_rq.recv(pd.alloc(256, AccessFlags::LOCAL_WRITE)?, 10)?;
//!
//! // UD: an address handle per destination.
//! let ud = pd.create_qp(QpType::Ud, &cq, &cq).build()?;
//! ud.activate_ud(port, 0x1111_1111, 0)?;
//! let ah = pd.create_ah(&AddressVector::roce(port, me.gid, gid_index))?; // ibv_create_ah
//! let mut ud_sq = ud.send_queue()?;
//! ud_sq.send_inline_to(b"dgram", &UdDest::new(&ah, ud.qp_num(), 0x1111_1111), Wr::id(11))?;
//! # drop((qp2, ah)); Ok(()) }
//! ```
//!
//! # Async (feature `tokio`)
//!
//! With the `tokio` feature, `AsyncQueuePair` wraps a queue pair whose CQs
//! report to a completion channel: every posting method returns a
//! `CompletionFuture` that resolves to the [`Completion`] (buffers included),
//! driven by the channel's descriptor registered with Tokio's reactor.
//! Dropping a pending future leaves the buffers with the queue pair until the
//! completion arrives. `AsyncEvents` is the context's async events as a
//! stream (`next().await`).
//!
//! # Features
//!
//! * `rdmacm`: connection management over librdmacm ([`cm`]).
//! * `tokio`: the async types above.
//! * `dlopen` (off by default): load libibverbs (and librdmacm) at run
//!   time instead of linking them (`ibverbs-sys/dlopen`). The program then
//!   has no `DT_NEEDED` on either library and starts on a machine without
//!   rdma-core; the first call into the library ([`devices`],
//!   [`open_device`], [`fork_init`], `cm::EventChannel::new`) returns
//!   [`Error::LibraryNotFound`] naming the file and the package to install
//!   instead of the loader refusing to start the program. Every other verb
//!   is reached through a [`Context`] (so the library is loaded); a verb
//!   that only a newer rdma-core exports fails alone, with `EOPNOTSUPP`.
//!   Posting and polling are the same code as without the feature (they
//!   call the provider through the context, never the library), so the
//!   data path costs nothing more. [`fork_status`] reports
//!   [`ForkStatus::Disabled`] while the library is missing.
//!
//! # Errors
//!
//! One [`Error`] enum: which verb failed and its errno
//! ([`Error::Verb`]), error completions ([`Error::WorkCompletion`]),
//! arguments refused before reaching the device, each a variant of its own
//! with the numbers that decided ([`Error::TooManySges`],
//! [`Error::OutOfRange`], [`Error::QueueFull`],
//! [`Error::InvalidTransition`], …), and [`Error::Unsupported`]. A refused
//! request's buffers come back in a [`Refused`], which `?` turns into an
//! [`Error`], an [`std::io::Error`] or a `Box<dyn std::error::Error>`.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs, clippy::undocumented_unsafe_blocks)]

mod address_handle;
#[cfg(feature = "tokio")]
mod async_io;
mod buffer;
mod buffer_pool;
mod capabilities;
#[cfg(feature = "rdmacm")]
pub mod cm;
mod completion_channel;
mod completion_queue;
mod context;
mod device;
mod device_memory;
mod error;
mod event_routing;
mod exchange;
mod extended_cq;
mod flow_counters;
mod fork;
mod gid;
mod inflight;
mod library;
mod memory_region;
mod memory_window;
mod message_channel;
mod port;
mod port_counters;
mod protection_domain;
mod queue_pair;
mod request_table;
mod shared_receive_queue;
mod thread_domain;
mod work_completion;
mod write_channel;
mod xrc_domain;

pub mod hazards;

// The README's example compiles (it is a `no_run` doctest here).
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
struct ReadmeDoctests;

/// The plain-old-data traits of the typed buffer views ([`LocalBuffer::as_slice_of`],
/// [`SharedBuffer::read_into`], …), re-exported so that callers name the same version.
pub use bytemuck;
pub use ibverbs_sys as sys;

pub use address_handle::{AddressHandle, AddressVector, DEFAULT_HOP_LIMIT};
#[cfg(feature = "tokio")]
pub use async_io::{AsyncEvents, AsyncQueuePair, CompletionFuture};
pub use buffer::{
    Buf, DeviceReadable, DeviceWritable, FrozenBuffer, LocalBuffer, RemoteKey, RemoteMemory,
    SgList, SharedBuffer,
};
pub use buffer_pool::{BufferPool, BufferPoolBuilder, PooledBuffer, PutError};
pub use capabilities::{DeviceAttrEx, Feature};
pub use completion_channel::CompletionChannel;
pub use completion_queue::{
    Completion, CompletionQueue, CompletionQueueBuilder, CompletionRef, Completions, Polled,
};
pub use context::{AsyncElement, AsyncEvent, AsyncEventType, AtomicCap, Context, DeviceAttr};
pub use device::{devices, open_device, Device, DeviceList};
pub use device_memory::DeviceMemory;
pub use error::{Error, Result, TransitionReason, WireProblem};
pub use event_routing::{AsyncEventReceiver, CqId, QpId, SrqId};
pub use exchange::{Mesh, Peer, PeerInfo, Ranks, TimedStream, MAX_PRIVATE_LEN};
pub use extended_cq::WcFields;
pub use flow_counters::{CounterDescription, FlowCounters};
pub use fork::{fork_init, fork_status, ForkStatus};
pub use gid::{Gid, GidEntry, GidIndex, GidSelector, GidType};
pub use memory_region::{
    AccessFlags, AnonymousMemory, DmabufRegion, MemoryRegion, RegisterOptions, Storage,
};
pub use memory_region::{Advice, ImplicitOdpRegion, OdpCaps, OdpGeneralCaps, OdpTransportCaps};
pub use memory_window::{BindTarget, MemoryWindow, MwType};
pub use message_channel::{ChannelProblem, Message, MessageChannel};
pub use port::{LinkLayer, Mtu, PortAttr, PortNumber, PortState};
pub use port_counters::{CounterSource, PortCounters};
pub use protection_domain::ProtectionDomain;
pub use queue_pair::{
    ConnectOptions, Ece, Endpoint, LocalPort, PathMigState, Posted, PreparedRecv, PreparedSend,
    QpAttr, QpAttrView, QpCaps, QpNumber, QpState, QpType, QueuePair, QueuePairBuilder, RecvQueue,
    RecvRequest, Refused, SendOp, SendOps, SendOption, SendQueue, SendRequest, UdDest, Wr,
};
#[cfg(ibverbs_flush)]
pub use queue_pair::{FlushLevel, FlushType};
pub use request_table::{Reaped, RequestTable, SendStream, TableRefused};
pub use shared_receive_queue::{SharedReceiveQueue, SharedReceiveQueueBuilder};
pub use thread_domain::{ParentDomain, ThreadDomain};
pub use work_completion::{WcOpcode, WcStatus, WorkCompletion};
pub use write_channel::{Received, WriteChannel};
pub use xrc_domain::{XrcDomain, XrcRecvQueuePair, XrcdOpenFlags, XrcdOptions};
