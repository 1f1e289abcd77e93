//! The crate's one error type and the helpers that turn C return conventions
//! into `Result`.

use std::fmt;
use std::io;

use crate::types::{
    AccessFlags, QpNumber, QpState, QpType, RequestOption, SendOp, SendOpFlags, WcStatus,
};
use crate::types::{Gid, GidIndex, GidSelector, PortNumber};

/// What can go wrong in this crate.
///
/// Every error from libibverbs names the verb that failed (`ibv_reg_mr`,
/// `ibv_modify_qp`, …) and carries the `errno` it reported
/// ([`Error::Verb`]). Everything the library refuses itself, before the
/// device sees it, is a variant of its own carrying the numbers that
/// decided: match on the variant and its fields, never on the text.
///
/// Each Display names the cause once: no variant has a
/// [`source`](std::error::Error::source) whose message its Display repeats
/// (a [`Verb`](Error::Verb) error prints its OS error itself and has no
/// source).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A verb failed; `io` is the errno it reported, with an explanation of
    /// the likely cause when the library knows one (both in the Display).
    #[error("{verb} failed: {io}")]
    Verb {
        /// The libibverbs function that failed.
        verb: &'static str,
        /// The OS error it reported ([`Error::raw_os_error`] reads its
        /// errno, also when an explanation is attached).
        io: io::Error,
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
    /// A queue pair state transition that the IBA state table forbids, or
    /// that lacks a required attribute.
    #[error("illegal queue pair transition {from:?} -> {to:?}: {reason}")]
    InvalidTransition {
        /// The current state.
        from: QpState,
        /// The requested state.
        to: QpState,
        /// What is wrong (the missing attributes, …).
        reason: TransitionReason,
    },
    /// The device, its provider or this library does not support the
    /// capability named.
    #[error("unsupported: {0}")]
    Unsupported(&'static str),
    /// A work queue has no room for more work requests.
    #[error("{queue} is full ({depth} work requests outstanding)")]
    QueueFull {
        /// Which queue (`send queue`, `receive queue`, `shared receive queue`).
        queue: &'static str,
        /// Its capacity.
        depth: u32,
    },
    /// No RDMA device matched.
    #[error("no RDMA device {}", device_named(.name))]
    NoDevice {
        /// The name looked for; `None` when any device with an active port
        /// would have done ([`open_active`](crate::device::open_active)).
        name: Option<String>,
    },
    /// The operation is not available on this queue pair type (a read or
    /// an atomic on UC, anything but a send on UD). Nothing was posted.
    #[error("{op} is not available on a {qp_type:?} queue pair")]
    OpNotAvailable {
        /// The request's operation.
        op: SendOp,
        /// The queue pair's transport.
        qp_type: QpType,
    },
    /// A send request carries an option its operation (or the queue pair's
    /// type) does not take; DESIGN.md's request-option table lists every
    /// cell. Checked before the provider sees the request: nothing was
    /// posted and the request (buffers included) is handed back.
    #[error("{option} is not allowed on {op} ({qp_type:?} queue pair)")]
    OptionNotAllowed {
        /// The offending option.
        option: RequestOption,
        /// The request's operation.
        op: SendOp,
        /// The queue pair's transport.
        qp_type: QpType,
    },
    /// A send request lacks an option its operation needs on this queue
    /// pair type (a UD send without its destination).
    #[error("{op} on a {qp_type:?} queue pair needs {option}")]
    OptionRequired {
        /// The missing option.
        option: RequestOption,
        /// The request's operation.
        op: SendOp,
        /// The queue pair's transport.
        qp_type: QpType,
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
    ///
    /// Completions that destroyed queues may have left queued (`owed`)
    /// count too until a poll finds the CQ empty: poll it empty first.
    #[error(
        "the completion queue holds {capacity} completions, but the queues reporting to it \
         were asked for {needed}{}: create it with at least {needed} entries",
        owed_text(*.owed)
    )]
    CqTooSmall {
        /// The CQ's capacity.
        capacity: u32,
        /// The sum of the depths asked for the queues that would report
        /// to it, and of `owed`.
        needed: u64,
        /// Of `needed`: completions that destroyed queues may have left
        /// queued, charged until a poll finds the CQ empty.
        owed: u64,
    },
    /// A state change refused while a posting handle of the queue pair
    /// lives: out of the states that send (to INIT or RTR) while the send
    /// queue's handle lives (it could post there), to RESET while either
    /// queue's does. Drop the handle first; nothing changed.
    #[error("moving the queue pair to {to:?} needs its {queue}'s posting handle dropped first")]
    HandleLive {
        /// The queue whose handle lives.
        queue: &'static str,
        /// The state asked for.
        to: QpState,
    },
    /// A prepared request posted through another queue's handle than the
    /// one it was prepared for. Nothing was posted.
    #[error("a {what} of another queue")]
    NotThisQueue {
        /// What was posted.
        what: &'static str,
    },
    /// A work queue's posting handle exists already (or a state change is
    /// using the queue): one at a time.
    #[error("{queue}: its posting handle is taken")]
    QueueTaken {
        /// Which queue.
        queue: &'static str,
    },
    /// A queue pair's work queue, moved to RESET with requests
    /// outstanding, holds one entry per such request until its completion
    /// queue is polled empty: the completions of those that had finished
    /// may still be queued there, and new requests beside them could
    /// overrun the CQ, losing completions and their buffers. Poll the CQ
    /// until a poll returns nothing, then post again. Nothing was posted.
    #[error(
        "{queue}: {held} of its {depth} entries are held until its completion queue is polled \
         empty (a move to RESET discarded requests whose completions may still be queued)"
    )]
    QueueHeldAfterReset {
        /// Which queue (`send queue`, `receive queue`).
        queue: &'static str,
        /// The entries held.
        held: u32,
        /// Its capacity.
        depth: u32,
    },
    /// A send (or window bind) posted to a queue pair that cannot send
    /// yet: RESET, INIT or RTR. Refused by the library, not handed to the
    /// provider (rxe would keep such a request and run it once the queue
    /// pair reaches RTS). Connect it first.
    #[error("the queue pair is in {state:?}: sends need RTS (connect it first)")]
    NotReadyToSend {
        /// The queue pair's state.
        state: QpState,
    },
    /// A request with more scatter/gather entries than its queue takes:
    /// `max` is the queue pair's `max_send_sge` or `max_recv_sge`
    /// ([`QueuePair::caps`](crate::QueuePair::caps)) or the shared receive
    /// queue's `max_sge`; it is 1 for an inlined buffer list on a queue
    /// pair created with [`SendOpFlags`].
    #[error("{got} scatter/gather entries, at most {max} allowed")]
    TooManySges {
        /// Entries in the request.
        got: usize,
        /// Entries allowed.
        max: u32,
    },
    /// A value wider than its field: a 24-bit PSN or QP number, a 3-bit
    /// retry count, a 4-bit service level, private data longer than the
    /// connection message holds, a buffer longer than a scatter/gather
    /// entry describes (4 GiB - 1).
    #[error("{what} {value} is out of range (at most {max})")]
    OutOfRange {
        /// The field (`"local PSN"`, `"rq_psn"`, `"service level"`, …).
        what: &'static str,
        /// The value given.
        value: u64,
        /// The largest value the field holds.
        max: u64,
    },
    /// A path MTU that is no `IBV_MTU_*` value ([`Mtu::Unknown`](crate::device::Mtu::Unknown)).
    #[error(
        "path_mtu {value} is not an IBV_MTU_* value (Mtu::from_bytes takes 256, 512, 1024, \
         2048 or 4096)"
    )]
    InvalidMtu {
        /// The raw value given.
        value: u32,
    },
    /// An address that needs aligning: the remote target of a
    /// compare-and-swap, fetch-and-add or atomic write, the local result
    /// buffer, the word of
    /// [`SharedBuffer::atomic_u64`](crate::SharedBuffer::atomic_u64), or a
    /// buffer viewed as a slice of a type
    /// ([`LocalBuffer::as_slice_of`](crate::LocalBuffer::as_slice_of)).
    #[error("address {addr:#x} is not {align}-byte aligned")]
    Misaligned {
        /// The address.
        addr: u64,
        /// The alignment needed.
        align: u64,
    },
    /// A range outside the memory it should lie in: bytes of a buffer, or
    /// the 8-byte word of an atomic operation in its remote range.
    #[error("{len} bytes at offset {offset} do not fit in {size}")]
    OutOfBounds {
        /// Where the range starts.
        offset: u64,
        /// Its length.
        len: u64,
        /// The size of the memory.
        size: u64,
    },
    /// A compare-and-swap or fetch-and-add without exactly one 8-byte
    /// buffer for the old value.
    #[error(
        "an atomic operation returns the old value into exactly one 8-byte buffer, \
         not {buffers} buffers of {len} bytes in all"
    )]
    AtomicResultBuffer {
        /// Buffers in the request.
        buffers: usize,
        /// Their total length.
        len: u64,
    },
    /// An object of another protection domain: a buffer, address handle,
    /// shared receive queue, memory window or region used with a queue
    /// pair (or each other) across protection domains.
    #[error("the {what} belongs to another protection domain")]
    ForeignProtectionDomain {
        /// The object (`"buffer"`, `"address handle"`, …).
        what: &'static str,
    },
    /// An object of another device context: a completion queue, a
    /// [`LocalPort`](crate::LocalPort), or a queue pair given to an rdma_cm
    /// id.
    #[error("the {what} belongs to another device context")]
    ForeignContext {
        /// The object (`"completion queue"`, `"LocalPort"`, …).
        what: &'static str,
    },
    /// The device would write a frozen (shared, read-only) buffer: a
    /// receive, an RDMA read or an atomic's result buffer.
    #[error("the device would write a frozen (shared read-only) buffer of this {op}")]
    FrozenBuffer {
        /// The request's operation (`"receive"`, `"RDMA read"`, …).
        op: &'static str,
    },
    /// Memory lacks an access right the operation needs: `LOCAL_WRITE` on
    /// a buffer the device writes or behind remote write rights, `MW_BIND`
    /// on a region a window binds.
    #[error("{what} must be registered with {}", FlagNames(.needed))]
    MissingAccess {
        /// The memory (`"a buffer the device writes"`, …).
        what: &'static str,
        /// The missing rights.
        needed: AccessFlags,
    },
    /// Rights that let a peer write the memory (`REMOTE_WRITE`,
    /// `REMOTE_ATOMIC`, through a registration or a memory window) on
    /// memory that is not a `SharedBuffer`: a peer could change it behind a
    /// Rust reference. Register it with `register_shared` (`alloc_shared`).
    #[error(
        "{what} lets a peer write the memory, so it must be a SharedBuffer \
         (register_shared, alloc_shared)"
    )]
    NeedsSharedBuffer {
        /// What grants the rights.
        what: &'static str,
    },
    /// Rights the object cannot grant: a memory window grants only
    /// `REMOTE_READ`, `REMOTE_WRITE`, `REMOTE_ATOMIC` and `ZERO_BASED`.
    #[error("{what} cannot grant {}", FlagNames(.flags))]
    AccessNotAllowed {
        /// The object (`"a memory window"`).
        what: &'static str,
        /// The rights it cannot grant.
        flags: AccessFlags,
    },
    /// A UD message longer than the active MTU of its address handle's
    /// port: a UD message is one packet, and the device would drop a
    /// longer one with a successful completion (IBA C10-93.1.1; rxe does).
    #[error(
        "a {len}-byte UD message exceeds the {mtu}-byte active MTU: the device would drop it \
         without an error (IBA C10-93.1.1)"
    )]
    UdMessageTooLong {
        /// The message length.
        len: u64,
        /// The port's active MTU in bytes.
        mtu: u32,
    },
    /// A receive posted (or prepared) on a queue pair created with a
    /// shared receive queue: post it to the SRQ.
    #[error("this queue pair receives through its shared receive queue: post receives there")]
    ReceivesThroughSrq,
    /// The call is not for this queue pair type: `connect` is for RC and
    /// UC (`activate_ud` for UD), `activate_ud` for UD, memory windows bind
    /// on RC and UC, rdma_cm connections (TCP port space) are RC.
    #[error("{what} is not available on a {qp_type:?} queue pair")]
    WrongQpType {
        /// The call (`"connect"`, `"activate_ud"`, …).
        what: &'static str,
        /// The queue pair's type.
        qp_type: QpType,
    },
    /// The local GID table slot to send from is empty (RoCE addressing
    /// needs a GID).
    #[error("GID index {} of port {port} is empty: nothing to send from", .index.0)]
    EmptyGid {
        /// The port.
        port: PortNumber,
        /// The empty slot.
        index: GidIndex,
    },
    /// The remote endpoint lacks the address its port's link layer routes
    /// by: a zero GID on RoCE, LID 0 on InfiniBand.
    #[error("port {port} addresses peers by {needed}, and the remote {needed} is zero")]
    MissingRemoteAddress {
        /// The local port.
        port: PortNumber,
        /// `"GID"` (RoCE) or `"LID"` (InfiniBand).
        needed: &'static str,
    },
    /// An unsignaled request given to `prepare_send` on a queue pair that
    /// does not signal every request: a prepared request's completion
    /// gives its buffers back.
    #[error("a prepared request must be signaled: its completion gives the buffers back")]
    PreparedUnsignaled,
    /// An operand setter of a prepared request of another operation
    /// (`set_compare_swap` on anything but a compare-and-swap, `set_add` on
    /// anything but a fetch-and-add).
    #[error("the prepared request is no {expected}")]
    WrongOperation {
        /// The operation the setter is for.
        expected: SendOp,
    },
    /// An operation the queue pair was not created for: atomic write and
    /// flush need a queue pair created with [`SendOpFlags`], and a queue pair
    /// created with `SendOpFlags` posts only the operations it names.
    #[error("{op} needs a queue pair created with send_ops including {}", FlagNames(.needed))]
    SendOpFlagsRequired {
        /// The request's operation.
        op: SendOp,
        /// The [`SendOpFlags`] flag it needs.
        needed: SendOpFlags,
    },
    /// Registering 0 bytes (`ibv_reg_mr` needs at least one): `alloc(0, ..)`
    /// gives a zero-length buffer without a registration of its own.
    #[error(
        "cannot register 0 bytes (ibv_reg_mr needs at least one); alloc(0, ..) gives a \
         zero-length buffer"
    )]
    EmptyRegistration,
    /// A [`Storage`](crate::memory::Storage) returned a NULL pointer.
    #[error("the storage to register returned a NULL pointer")]
    NullStorage,
    /// Invalidating a type 1 memory window that is not bound.
    #[error("this type 1 memory window is not bound: there is nothing to invalidate")]
    WindowNotBound,
    /// A completion queue without a completion channel where one is
    /// needed: under `rdma-verbs-tokio`'s `AsyncQueuePair`, or
    /// waited on with [`CompletionQueue::wait`](crate::CompletionQueue::wait).
    /// Create the CQ with a channel of its own
    /// ([`CompletionQueueBuilder::channel`](crate::cq::CompletionQueueBuilder::channel)).
    #[error("the {which} has no completion channel (create it with one)")]
    NoCompletionChannel {
        /// Which CQ: `"AsyncQueuePair's send CQ"`, `"AsyncQueuePair's
        /// receive CQ"` or `"CQ waited on"`.
        which: &'static str,
    },
    /// Two options that exclude each other
    /// (`CompletionFields::COMPLETION_TIMESTAMP` and
    /// `CompletionFields::COMPLETION_TIMESTAMP_WALLCLOCK`).
    #[error("{first} and {second} exclude each other: ask for one")]
    ConflictingOptions {
        /// One option.
        first: &'static str,
        /// The other.
        second: &'static str,
    },
    /// The queue pair of an rdma_cm connect was dropped before the peer
    /// answered: the connection is refused (reported as `ConnectError`).
    #[error("the queue pair of this rdma_cm connect was dropped before the peer answered")]
    QueuePairDropped,
    /// An rdma_cm event other than the one expected
    /// ([`CmEvent::expect`](crate::cm::CmEvent::expect)) that carries no
    /// errno.
    #[cfg(feature = "rdmacm")]
    #[error("expected rdma_cm event {expected:?}, got {got:?} (status {status})")]
    UnexpectedEvent {
        /// The event expected.
        expected: crate::types::CmEventType,
        /// The event that arrived.
        got: crate::types::CmEventType,
        /// Its status.
        status: i32,
    },
    /// No port of the device is ACTIVE.
    #[error("{device} has no active port")]
    NoActivePort {
        /// The device's name.
        device: String,
    },
    /// [`CompletionQueue::wait`](crate::CompletionQueue::wait) on a CQ
    /// whose completion channel other CQs report to as well. The kernel
    /// delivers each event once: an event the wait read for another CQ
    /// would be lost to whoever waits for that CQ, so a wait needs a
    /// channel of its own. Also returned when the wait read such an event
    /// (a CQ created on the channel during the wait): it was counted for
    /// acknowledgement, and that CQ's completions stay in it.
    #[error(
        "waiting on a completion queue needs a completion channel of its own, \
         but {cqs} completion queues report to this one"
    )]
    CompletionChannelShared {
        /// The completion queues reporting to the channel.
        cqs: usize,
    },
    /// Bytes that are not a wire message of this library: a peer's
    /// [`Endpoint`](crate::Endpoint) or
    /// [`RemoteMemory`](crate::RemoteMemory) of another version, cut short,
    /// padded, or with a value out of its field's range. Nothing was
    /// connected or addressed with them.
    #[error("malformed {what} message: {problem}")]
    BadWireFormat {
        /// The message (`"Endpoint"`, `"RemoteMemory"`).
        what: &'static str,
        /// What is wrong with it, with its numbers.
        problem: WireProblem,
    },
    /// [`QueuePair::connect`](crate::QueuePair::connect) was given a local
    /// [`Endpoint`](crate::Endpoint) of another queue pair: the PSN it
    /// carries is the one the peer expects from `endpoint`, not from this
    /// queue pair. Nothing was changed.
    #[error("the local endpoint names queue pair {endpoint}, this queue pair is {qp_num}")]
    NotThisQueuePair {
        /// This queue pair's number.
        qp_num: QpNumber,
        /// The QP number in the local endpoint given.
        endpoint: QpNumber,
    },
    /// A typed view or an equal split of a buffer whose length is not a
    /// multiple of the element size.
    #[error("{len} bytes are not a whole number of {size}-byte elements")]
    LengthNotMultiple {
        /// The buffer's length.
        len: usize,
        /// The element size (0 for a zero-sized type, which is refused).
        size: usize,
    },
    /// [`BufferPool::put`](crate::memory::BufferPool::put) was given a buffer that
    /// is not exactly one of the pool's buffers: one of another
    /// registration, a piece of one, or several joined. It comes back in
    /// the [`PutError`](crate::memory::PutError); the pool is unchanged.
    #[error(
        "the {len}-byte buffer at {addr:#x} is not one of this pool's {size}-byte buffers: {}",
        pool_slot_problem(*.same_registration)
    )]
    NotPoolSlot {
        /// The buffer's address.
        addr: u64,
        /// Its length.
        len: usize,
        /// The length of the pool's buffers.
        size: usize,
        /// Whether it is of the pool's registration (then it is a piece
        /// of a buffer, or buffers joined, or not at a buffer's start).
        same_registration: bool,
    },
    /// No entry of a port's GID table matches a
    /// [`GidSelector`] (from
    /// [`Context::select_gid`](crate::Context::select_gid),
    /// [`GidSelector::select`](crate::device::GidSelector::select) or
    /// [`Context::default_gid_index`](crate::Context::default_gid_index)):
    /// no entry holds the address, the network device has no GID on this
    /// port (or does not exist), or the table is empty. Empty entries are
    /// never chosen.
    #[error("port {port} has no {wanted}")]
    NoMatchingGid {
        /// The port whose table was searched.
        port: PortNumber,
        /// What was asked for.
        wanted: GidSelector,
    },
    /// [`fork_init`](crate::device::fork_init) came too late: fork support is off
    /// and can no longer be turned on, since memory may already be
    /// registered without `MADV_DONTFORK`. Call it first, or set
    /// `RDMAV_FORK_SAFE=1` in the environment.
    #[error(
        "{verb}: too late to enable fork support, {}; call it before anything else \
         or set RDMAV_FORK_SAFE=1",
        fork_too_late(*.refused_by_rdma_core)
    )]
    ForkInitTooLate {
        /// The verb not called, or refused (`ibv_fork_init`).
        verb: &'static str,
        /// `true`: rdma-core refused (`EINVAL`: memory was registered
        /// before, by code outside this library); `false`: this library
        /// refused without calling it, having already called into
        /// libibverbs or librdmacm.
        refused_by_rdma_core: bool,
    },
    /// [`CompletionQueue::resize`](crate::CompletionQueue::resize) to
    /// fewer entries than the queues reporting to the CQ were asked to
    /// hold (see [`CqTooSmall`](Error::CqTooSmall)): the CQ could overrun
    /// and lose completions with their buffers. Refused before the verb;
    /// the CQ is unchanged.
    #[error(
        "{verb}: {requested} entries asked, but the queues reporting to the completion queue \
         were asked for {registered}{}",
        owed_text(*.owed)
    )]
    CqResizeTooSmall {
        /// The verb not called (`ibv_resize_cq`).
        verb: &'static str,
        /// The size asked for.
        requested: u32,
        /// The sum of the depths asked for the queues reporting to it,
        /// and of `owed`.
        registered: u64,
        /// Of `registered`: completions that destroyed queues may have left
        /// queued, charged until a poll finds the CQ empty.
        owed: u64,
    },
    /// The device does not report the capability a verb needs (its
    /// attributes say so), so the verb was not called.
    #[error("{verb}: the device does not support {capability}")]
    DeviceLacks {
        /// The verb not called (`ibv_modify_cq`).
        verb: &'static str,
        /// What the device lacks, and the attribute that says so.
        capability: &'static str,
    },
    /// A verb newer than the loaded rdma-core, refused before any call: the
    /// library this process runs on is older than `needs`
    /// (`rdma_verbs_sys::rdma_core_release`), or its release is unknown.
    #[error(
        "{verb} needs rdma-core {needs} or newer; the loaded libibverbs is {}",
        release_found(*.found)
    )]
    LibraryTooOld {
        /// The verb or flag not used (`ibv_wr_flush`, `IBV_ACCESS_FLUSH_GLOBAL`).
        verb: &'static str,
        /// The rdma-core release that added it.
        needs: u32,
        /// The loaded release; `None` when it cannot be told.
        found: Option<u32>,
    },
    /// Reading the kernel's sysfs failed: a port's directory is missing
    /// ([`Context::port_counters`](crate::Context::port_counters) for a
    /// port the device does not have, or no sysfs mounted) or a counters
    /// directory could not be listed. No verb was involved.
    #[error("reading {} failed: {io}", .path.display())]
    Sysfs {
        /// The file or directory that could not be read.
        path: std::path::PathBuf,
        /// The error reading it.
        io: io::Error,
    },
    /// An address vector without a GRH for a port whose address handles
    /// need one (RoCE: every packet carries the peer's GID). Refused
    /// before `ibv_create_ah` (which the kernel would fail with `EINVAL`).
    #[error(
        "ibv_create_ah: port {port} needs a GRH (RoCE addresses by GID): use AddressVector::grh"
    )]
    GrhRequired {
        /// The address vector's port.
        port: PortNumber,
    },
    /// A multicast attach of a group the queue pair already attached
    /// (`attached: true`), or a detach of one it has not attached
    /// (`attached: false`: never, or already detached). Refused before the
    /// verb: providers accept a second attach silently (one detach would
    /// then undo both) and answer a stray detach with a bare `EINVAL`.
    #[error(
        "{verb}: the queue pair {} multicast group {gid} (LID {lid:#x})",
        if *.attached { "is already attached to" } else { "is not attached to" }
    )]
    MulticastMembership {
        /// The verb not called (`ibv_attach_mcast`, `ibv_detach_mcast`).
        verb: &'static str,
        /// The group's GID.
        gid: Gid,
        /// The group's LID (0 on RoCE).
        lid: u16,
        /// Whether the queue pair is attached to the group.
        attached: bool,
    },
    /// A re-registration (`ibv_rereg_mr`) of a region something else
    /// still holds: another buffer piece, a [`MemoryRegion`](crate::MemoryRegion)
    /// handle, a memory window, a posted request or a pool. Refused before
    /// the verb: only the sole holder of a registration may change it
    /// (DESIGN.md, "On-demand paging, XRC, re-registration").
    #[error("{verb}: the region is still held elsewhere (split pieces, MemoryRegion handles, windows or posted requests)")]
    RegionInUse {
        /// The verb not called (`ibv_rereg_mr`).
        verb: &'static str,
    },
    /// A library of rdma-core could not be loaded at run time (feature
    /// `dlopen`): the first call into it ([`devices`](crate::devices),
    /// [`open_device`](crate::open_device), [`fork_init`](crate::device::fork_init),
    /// `cm::EventChannel::new`) found it missing, so nothing was called.
    /// Install the package named (rdma-core's userspace library); without
    /// the feature the library is linked and this error does not occur.
    #[error(
        "cannot load {library}: rdma-core's userspace library is not installed \
         (Debian/Ubuntu: apt-get install {package}; other distributions: rdma-core)"
    )]
    LibraryNotFound {
        /// The file `dlopen` looked for (`libibverbs.so.1`, `librdmacm.so.1`).
        library: &'static str,
        /// The Debian/Ubuntu package that installs it (`libibverbs1`,
        /// `librdmacm1`).
        package: &'static str,
    },
}

impl From<rdma_verbs_sys::LoadError> for Error {
    fn from(e: rdma_verbs_sys::LoadError) -> Error {
        Error::LibraryNotFound {
            library: e.library,
            package: e.package,
        }
    }
}

/// Who refused [`Error::ForkInitTooLate`].
fn fork_too_late(refused_by_rdma_core: bool) -> &'static str {
    if refused_by_rdma_core {
        "rdma-core refused (EINVAL: memory was registered before)"
    } else {
        "this library already called into libibverbs"
    }
}

/// Why a buffer of [`Error::NotPoolSlot`] is not one of the pool's.
fn pool_slot_problem(same_registration: bool) -> &'static str {
    if same_registration {
        "a piece of one or several joined (split or join it back into whole ones)"
    } else {
        "it is of another registration"
    }
}

/// Why [`Error::InvalidTransition`] refused a state change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TransitionReason {
    /// The IBA state table has no such transition for this queue pair
    /// type (a skipped state, RESET to ERR, SQE on RC), or a state is
    /// unknown.
    NoSuchTransition,
    /// Attributes the transition requires are missing from the mask.
    Missing(rdma_verbs_sys::ibv_qp_attr_mask),
    /// Attributes the transition does not take (unknown mask bits
    /// included).
    NotAllowed(rdma_verbs_sys::ibv_qp_attr_mask),
    /// `cur_qp_state` claims this state, but the queue pair is in the
    /// transition's `from` state (the one the device reports).
    ClaimedState(QpState),
}

/// What is wrong with a wire message ([`Error::BadWireFormat`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum WireProblem {
    /// The message has `len` bytes; its version has `expected`.
    Length {
        /// Bytes received.
        len: usize,
        /// Bytes of the message's version.
        expected: usize,
    },
    /// The first byte names a version this library does not read.
    Version {
        /// The version byte received.
        version: u8,
        /// The version this library writes and reads.
        supported: u8,
    },
    /// A field holds a value beyond its range (a 24-bit QP number or PSN,
    /// a memory range passing the end of the address space).
    OutOfRange {
        /// The field (`"qp_num"`, `"psn"`, `"len"`).
        field: &'static str,
        /// The value received.
        value: u64,
        /// The largest value the field takes.
        max: u64,
    },
    /// A field that must hold one value holds another (a magic number,
    /// the number of ranks both sides were given, a barrier's sequence
    /// number).
    Mismatch {
        /// The field (`"magic"`, `"ranks"`, `"rank"`, `"barrier sequence"`).
        field: &'static str,
        /// The value received.
        value: u64,
        /// The value this side expected.
        expected: u64,
    },
    /// A field holds a value this side cannot take here (a rank that is
    /// not a peer that connects to this one, or one already connected).
    Unexpected {
        /// The field (`"rank"`).
        field: &'static str,
        /// The value received.
        value: u64,
    },
}

impl std::fmt::Display for WireProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WireProblem::Length { len, expected } => {
                write!(f, "{len} bytes, expected {expected}")
            }
            WireProblem::Version { version, supported } => {
                write!(
                    f,
                    "version {version}, this library reads version {supported}"
                )
            }
            WireProblem::OutOfRange { field, value, max } => {
                write!(f, "{field} {value:#x} exceeds {max:#x}")
            }
            WireProblem::Mismatch {
                field,
                value,
                expected,
            } => {
                write!(f, "{field} {value:#x}, expected {expected:#x}")
            }
            WireProblem::Unexpected { field, value } => {
                write!(f, "unexpected {field} {value}")
            }
        }
    }
}

/// `named "x"` or `found`, for [`Error::NoDevice`].
/// The part of a CQ-size message about completions destroyed queues may
/// have left queued.
fn owed_text(owed: u64) -> String {
    if owed == 0 {
        String::new()
    } else {
        format!(
            " (including {owed} that destroyed queues may have left queued, until a poll finds \
             it empty)"
        )
    }
}

fn device_named(name: &Option<String>) -> String {
    match name {
        Some(n) => format!("named {n:?}"),
        None => "with an active port".to_string(),
    }
}

/// Flag names as `A | B`, without the type name `Debug` adds.
struct FlagNames<'a, F>(&'a F);

impl<F> fmt::Display for FlagNames<'_, F>
where
    F: bitflags::Flags,
    F::Bits: bitflags::parser::WriteHex,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        bitflags::parser::to_writer(self.0, f)
    }
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
            io: io::Error::last_os_error(),
        }
    }

    /// A verb error from an explicit errno value (verbs that return it).
    pub(crate) fn from_errno(verb: &'static str, errno: i32) -> Self {
        Error::Verb {
            verb,
            io: io::Error::from_raw_os_error(errno),
        }
    }

    /// A verb error from an errno value with an explanation of the likely
    /// cause (the bad argument, the limit that was hit), keeping the verb
    /// and the errno ([`Error::raw_os_error`] still reports it).
    pub(crate) fn with_hint(self, hint: Option<String>) -> Self {
        let Some(hint) = hint else { return self };
        match self {
            Error::Verb { verb, io: source } => {
                let errno = source.raw_os_error().or_else(|| hinted_errno(&source));
                Error::Verb {
                    verb,
                    io: io::Error::new(
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
            Error::Verb { io, .. } => io.raw_os_error().or_else(|| hinted_errno(io)),
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

impl From<Error> for io::Error {
    /// A [`Verb`](Error::Verb) error becomes the OS error it carries
    /// (errno and explanation kept; the verb's name is dropped). Every
    /// other error becomes the inner error of an `io::Error` of the
    /// closest kind: `InvalidInput` for arguments the library refused,
    /// `Unsupported`, `NotFound` for a missing device or active port,
    /// `NotConnected` for a queue pair that cannot send yet, `BrokenPipe`
    /// for one in ERR, `ResourceBusy` for a full queue, a busy window or a
    /// descriptor already driven, `Other` for error completions and the
    /// rest.
    fn from(e: Error) -> io::Error {
        match e {
            Error::Verb { io, .. } => io,
            e => io::Error::new(e.io_kind(), e),
        }
    }
}

fn release_found(found: Option<u32>) -> String {
    match found {
        Some(r) => format!("rdma-core {r}"),
        None => "of an unknown release".into(),
    }
}

/// `Ok` when the loaded rdma-core is at least `needs` for `verb`.
pub(crate) fn require_release(verb: &'static str, needs: u32) -> Result<()> {
    check_release(verb, needs, rdma_verbs_sys::rdma_core_release())
}

/// [`require_release`] for a given loaded release (a pure function).
pub(crate) fn check_release(verb: &'static str, needs: u32, found: Option<u32>) -> Result<()> {
    match found {
        Some(r) if r >= needs => Ok(()),
        _ => Err(Error::LibraryTooOld { verb, needs, found }),
    }
}

impl Error {
    /// The kind of the [`io::Error`] this error converts to (see the
    /// `From` conversion), without converting it.
    pub fn io_kind(&self) -> io::ErrorKind {
        use io::ErrorKind as K;
        match self {
            Error::Verb { io, .. } => io.kind(),
            Error::Unsupported(_)
            | Error::OpNotAvailable { .. }
            | Error::SendOpFlagsRequired { .. }
            | Error::DeviceLacks { .. }
            | Error::LibraryTooOld { .. } => K::Unsupported,
            Error::NoDevice { .. }
            | Error::NoActivePort { .. }
            | Error::NoMatchingGid { .. }
            | Error::LibraryNotFound { .. } => K::NotFound,
            Error::NotReadyToSend { .. } => K::NotConnected,
            Error::QueuePairInError { .. } => K::BrokenPipe,
            Error::QueueFull { .. }
            | Error::QueueHeldAfterReset { .. }
            | Error::QueueTaken { .. }
            | Error::HandleLive { .. }
            | Error::WindowBusy
            | Error::RegionInUse { .. } => K::ResourceBusy,
            Error::WorkCompletion { .. } | Error::WindowIndeterminate | Error::QueuePairDropped => {
                K::Other
            }
            #[cfg(feature = "rdmacm")]
            Error::UnexpectedEvent { .. } => K::Other,
            Error::InvalidTransition { .. }
            | Error::OptionNotAllowed { .. }
            | Error::OptionRequired { .. }
            | Error::InlineTooLarge { .. }
            | Error::UnsignaledExclusive { .. }
            | Error::CqTooSmall { .. }
            | Error::TooManySges { .. }
            | Error::OutOfRange { .. }
            | Error::InvalidMtu { .. }
            | Error::Misaligned { .. }
            | Error::OutOfBounds { .. }
            | Error::AtomicResultBuffer { .. }
            | Error::ForeignProtectionDomain { .. }
            | Error::ForeignContext { .. }
            | Error::FrozenBuffer { .. }
            | Error::MissingAccess { .. }
            | Error::NeedsSharedBuffer { .. }
            | Error::AccessNotAllowed { .. }
            | Error::UdMessageTooLong { .. }
            | Error::ReceivesThroughSrq
            | Error::WrongQpType { .. }
            | Error::EmptyGid { .. }
            | Error::MissingRemoteAddress { .. }
            | Error::PreparedUnsignaled
            | Error::WrongOperation { .. }
            | Error::EmptyRegistration
            | Error::NullStorage
            | Error::WindowNotBound
            | Error::NoCompletionChannel { .. }
            | Error::CompletionChannelShared { .. }
            | Error::NotThisQueuePair { .. }
            | Error::NotThisQueue { .. }
            | Error::LengthNotMultiple { .. }
            | Error::ConflictingOptions { .. }
            | Error::NotPoolSlot { .. }
            | Error::CqResizeTooSmall { .. }
            | Error::GrhRequired { .. }
            | Error::MulticastMembership { .. } => K::InvalidInput,
            Error::ForkInitTooLate { .. } => K::Other,
            Error::BadWireFormat { .. } => K::InvalidData,
            Error::Sysfs { io, .. } => io.kind(),
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
        Error::Verb { verb, io: source }
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
    Error::Verb { verb, io: source }
}

#[cfg(test)]
mod tests;
