//! The plain types that name what the device and the verbs do: queue pair
//! types, states and numbers, send operations and options, completion
//! statuses, access rights, rdma_cm event types. A leaf of the crate: it
//! imports nothing of the crate, so errors
//! and every object module can name them without importing each other.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use rdma_verbs_sys as sys;

macro_rules! device_enum {
    (
        $(#[$meta:meta])* $name:ident { $( $(#[$vmeta:meta])* $variant:ident = $value:path ),* $(,)? }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        pub enum $name {
            $( $(#[$vmeta])* $variant, )*
            /// A value this version of the crate does not know.
            Unknown(u32),
        }

        impl $name {
            /// Maps the C value; unknown values are kept, never undefined behaviour.
            pub fn from_raw(raw: u32) -> Self {
                #[allow(non_upper_case_globals)]
                match raw {
                    $( x if x == $value as u32 => $name::$variant, )*
                    other => $name::Unknown(other),
                }
            }

            /// The C value.
            pub fn as_raw(self) -> u32 {
                match self {
                    $( $name::$variant => $value as u32, )*
                    $name::Unknown(v) => v,
                }
            }
        }
    };
}
pub(crate) use device_enum;

device_enum! {
    /// Transport service type of a queue pair.
    QpType {
        /// Reliable connected.
        Rc = sys::IBV_QPT_RC,
        /// Unreliable connected.
        Uc = sys::IBV_QPT_UC,
        /// Unreliable datagram.
        Ud = sys::IBV_QPT_UD,
        /// Raw packet.
        RawPacket = sys::IBV_QPT_RAW_PACKET,
        /// XRC send.
        XrcSend = sys::IBV_QPT_XRC_SEND,
        /// XRC receive.
        XrcRecv = sys::IBV_QPT_XRC_RECV,
        /// Driver-specific.
        Driver = sys::IBV_QPT_DRIVER,
    }
}

/// A queue pair number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct QpNumber(pub u32);

impl std::fmt::Display for QpNumber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:#08x}", self.0)
    }
}

device_enum! {
    /// Queue pair state.
    QpState {
        /// Reset.
        Reset = sys::IBV_QPS_RESET,
        /// Initialised.
        Init = sys::IBV_QPS_INIT,
        /// Ready to receive.
        Rtr = sys::IBV_QPS_RTR,
        /// Ready to send.
        Rts = sys::IBV_QPS_RTS,
        /// Send queue drained.
        Sqd = sys::IBV_QPS_SQD,
        /// Send queue error.
        Sqe = sys::IBV_QPS_SQE,
        /// Error.
        Err = sys::IBV_QPS_ERR,
    }
}

/// The operation of a send-queue request, as errors name it.
///
/// # References
/// `ibv_post_send(3)` (`IBV_WR_*`)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SendOp {
    /// `IBV_WR_SEND` (with immediate: `IBV_WR_SEND_WITH_IMM`, with
    /// invalidate: `IBV_WR_SEND_WITH_INV`).
    Send,
    /// `IBV_WR_RDMA_WRITE` (with immediate: `IBV_WR_RDMA_WRITE_WITH_IMM`).
    RdmaWrite,
    /// `IBV_WR_RDMA_READ`.
    RdmaRead,
    /// `IBV_WR_ATOMIC_CMP_AND_SWP`.
    CompareAndSwap,
    /// `IBV_WR_ATOMIC_FETCH_AND_ADD`.
    FetchAndAdd,
    /// `IBV_WR_ATOMIC_WRITE`.
    AtomicWrite,
    /// `IBV_WR_FLUSH`.
    Flush,
}

impl SendOp {
    /// The operation in words (`"RDMA read"`).
    pub fn as_str(self) -> &'static str {
        match self {
            SendOp::Send => "send",
            SendOp::RdmaWrite => "RDMA write",
            SendOp::RdmaRead => "RDMA read",
            SendOp::CompareAndSwap => "atomic compare-and-swap",
            SendOp::FetchAndAdd => "atomic fetch-and-add",
            SendOp::AtomicWrite => "atomic write",
            SendOp::Flush => "flush",
        }
    }
}

impl std::fmt::Display for SendOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An option of a send-queue request, as errors name it (see DESIGN.md's
/// request-option table for which operation takes which).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RequestOption {
    /// `IBV_SEND_INLINE`: the bytes are copied into the work request.
    Inline,
    /// Immediate data (`*_WITH_IMM`).
    Immediate,
    /// `IBV_SEND_SOLICITED`.
    Solicited,
    /// `IBV_SEND_FENCE`.
    Fence,
    /// A remote key to invalidate (`IBV_WR_SEND_WITH_INV`).
    Invalidate,
    /// A UD destination (address handle, QP number, Q_Key).
    UdDestination,
    /// The remote SRQ of an XRC send (`SendRequest::xrc_srqn`).
    XrcSrq,
}

impl std::fmt::Display for RequestOption {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RequestOption::Inline => "IBV_SEND_INLINE",
            RequestOption::Immediate => "immediate data",
            RequestOption::Solicited => "IBV_SEND_SOLICITED",
            RequestOption::Fence => "IBV_SEND_FENCE",
            RequestOption::Invalidate => "a remote key to invalidate (IBV_WR_SEND_WITH_INV)",
            RequestOption::UdDestination => {
                "a UD destination (SendQueue::send_to, SendRequest::ud)"
            }
            RequestOption::XrcSrq => "a remote XRC SRQ (SendRequest::xrc_srqn)",
        })
    }
}

bitflags::bitflags! {
    /// Operations an extended queue pair is created for
    /// (`IBV_QP_EX_WITH_*`, `send_ops_flags` of `ibv_create_qp_ex`).
    ///
    /// # References
    /// `ibv_create_qp_ex(3)`, `ibv_wr_post(3)`
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub struct SendOpFlags: u64 {
        /// RDMA write.
        const RDMA_WRITE = sys::ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_RDMA_WRITE.0 as u64;
        /// RDMA write with immediate.
        const RDMA_WRITE_WITH_IMM =
            sys::ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM.0 as u64;
        /// Send.
        const SEND = sys::ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_SEND.0 as u64;
        /// Send with immediate.
        const SEND_WITH_IMM =
            sys::ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_SEND_WITH_IMM.0 as u64;
        /// RDMA read.
        const RDMA_READ = sys::ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_RDMA_READ.0 as u64;
        /// Atomic compare-and-swap.
        const ATOMIC_CMP_AND_SWP =
            sys::ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP.0 as u64;
        /// Atomic fetch-and-add.
        const ATOMIC_FETCH_AND_ADD =
            sys::ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD.0 as u64;
        /// Local invalidate.
        const LOCAL_INV = sys::ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_LOCAL_INV.0 as u64;
        /// Memory window bind.
        const BIND_MW = sys::ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_BIND_MW.0 as u64;
        /// Send with invalidate.
        const SEND_WITH_INV =
            sys::ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_SEND_WITH_INV.0 as u64;
        /// Atomic write (`ibv_wr_atomic_write`; rdma-core 44 and later).
        const ATOMIC_WRITE =
            sys::ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_ATOMIC_WRITE.0 as u64;
        /// Flush (`ibv_wr_flush`). Needs rdma-core 45 or newer at run time:
        /// on an older library creating the queue pair fails with
        /// [`Error::LibraryTooOld`](crate::Error::LibraryTooOld).
        const FLUSH = sys::ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_FLUSH.0 as u64;
    }
}

device_enum! {
    /// The status of a work completion.
    ///
    /// # References
    /// `ibv_poll_cq(3)`, `ibv_wc_status_str(3)`
    WcStatus {
        /// Success.
        Success = sys::IBV_WC_SUCCESS,
        /// Local length error (e.g. receive buffer too small).
        LocLenErr = sys::IBV_WC_LOC_LEN_ERR,
        /// Local QP operation error.
        LocQpOpErr = sys::IBV_WC_LOC_QP_OP_ERR,
        /// Local EE context operation error.
        LocEecOpErr = sys::IBV_WC_LOC_EEC_OP_ERR,
        /// Local protection error (bad lkey or access).
        LocProtErr = sys::IBV_WC_LOC_PROT_ERR,
        /// Flushed because the QP is in the error state.
        WrFlushErr = sys::IBV_WC_WR_FLUSH_ERR,
        /// Memory window bind error.
        MwBindErr = sys::IBV_WC_MW_BIND_ERR,
        /// Bad response.
        BadRespErr = sys::IBV_WC_BAD_RESP_ERR,
        /// Local access error.
        LocAccessErr = sys::IBV_WC_LOC_ACCESS_ERR,
        /// Remote invalid request: the peer's queue pair refused the
        /// request as one it does not take. The common cause of an RDMA
        /// write, read or atomic failing so is a peer queue pair created
        /// or connected without the remote access flag the operation needs
        /// (`REMOTE_WRITE`, `REMOTE_READ`, `REMOTE_ATOMIC` in its
        /// [`ConnectOptions::remote_access`](crate::ConnectOptions::remote_access)
        /// or `qp_access_flags`): rxe reports this status then, whatever
        /// its memory grants (`device-tests/tests/connect.rs`; other devices may report
        /// [`RemAccessErr`](Self::RemAccessErr)). Both queue pairs end in
        /// ERR.
        RemInvReqErr = sys::IBV_WC_REM_INV_REQ_ERR,
        /// Remote access error: the peer's memory refused the access — an
        /// rkey that is wrong, revoked or invalidated, a range outside its
        /// region or window, or a region or window without the right the
        /// operation needs (`REMOTE_WRITE`, `REMOTE_READ`,
        /// `REMOTE_ATOMIC`). Some devices also report it for a peer queue
        /// pair without the matching remote access flag (rxe reports
        /// [`RemInvReqErr`](Self::RemInvReqErr) for that).
        RemAccessErr = sys::IBV_WC_REM_ACCESS_ERR,
        /// Remote operation error: the peer could not complete the
        /// request (e.g. on rxe, a message with a payload sent into a
        /// receive with no buffer, [`RecvRequest::empty`](crate::RecvRequest::empty)).
        RemOpErr = sys::IBV_WC_REM_OP_ERR,
        /// Transport retry counter exceeded.
        RetryExcErr = sys::IBV_WC_RETRY_EXC_ERR,
        /// RNR retry counter exceeded.
        RnrRetryExcErr = sys::IBV_WC_RNR_RETRY_EXC_ERR,
        /// Local RDD violation.
        LocRddViolErr = sys::IBV_WC_LOC_RDD_VIOL_ERR,
        /// Remote invalid RD request.
        RemInvRdReqErr = sys::IBV_WC_REM_INV_RD_REQ_ERR,
        /// Remote aborted.
        RemAbortErr = sys::IBV_WC_REM_ABORT_ERR,
        /// Invalid EE context number.
        InvEecnErr = sys::IBV_WC_INV_EECN_ERR,
        /// Invalid EE context state.
        InvEecStateErr = sys::IBV_WC_INV_EEC_STATE_ERR,
        /// Fatal error.
        FatalErr = sys::IBV_WC_FATAL_ERR,
        /// Response timeout.
        RespTimeoutErr = sys::IBV_WC_RESP_TIMEOUT_ERR,
        /// General error.
        GeneralErr = sys::IBV_WC_GENERAL_ERR,
        /// Tag matching error.
        TmErr = sys::IBV_WC_TM_ERR,
        /// Tag matching rendezvous incomplete.
        TmRndvIncomplete = sys::IBV_WC_TM_RNDV_INCOMPLETE,
    }
}

impl std::fmt::Display for WcStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // SAFETY: ibv_wc_status_str returns a static string for any value.
        let s = unsafe { std::ffi::CStr::from_ptr(sys::ibv_wc_status_str(self.as_raw())) };
        write!(f, "{} ({:?})", s.to_string_lossy(), self)
    }
}

bitflags::bitflags! {
    /// Memory access rights (`IBV_ACCESS_*`).
    ///
    /// The default is least privilege: [`AccessFlags::LOCAL_WRITE`] only.
    /// Remote read, write and atomic access are explicit opt-ins.
    ///
    /// # References
    /// `ibv_reg_mr(3)`
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub struct AccessFlags: u32 {
        /// The local device may write (receives, RDMA read results, atomics).
        const LOCAL_WRITE = sys::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0;
        /// Peers may RDMA-write (requires `LOCAL_WRITE`).
        const REMOTE_WRITE = sys::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;
        /// Peers may RDMA-read.
        const REMOTE_READ = sys::ibv_access_flags::IBV_ACCESS_REMOTE_READ.0;
        /// Peers may perform atomics (requires `LOCAL_WRITE`).
        const REMOTE_ATOMIC = sys::ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC.0;
        /// Memory windows may be bound.
        const MW_BIND = sys::ibv_access_flags::IBV_ACCESS_MW_BIND.0;
        /// Zero-based virtual addresses.
        const ZERO_BASED = sys::ibv_access_flags::IBV_ACCESS_ZERO_BASED.0;
        /// On-demand paging.
        const ON_DEMAND = sys::ibv_access_flags::IBV_ACCESS_ON_DEMAND.0;
        /// Huge-page hint.
        const HUGETLB = sys::ibv_access_flags::IBV_ACCESS_HUGETLB.0;
        /// Relaxed ordering (`IBV_ACCESS_RELAXED_ORDERING`): the device may
        /// reorder its PCIe writes to the region. An optional flag:
        /// libibverbs strips it where the kernel or device lacks it, so
        /// registration still succeeds (as on rxe). Completion semantics
        /// are unchanged: a completion still follows the data it reports.
        const RELAXED_ORDERING = sys::ibv_access_flags::IBV_ACCESS_RELAXED_ORDERING.0;
        /// Peers may flush for global visibility. Needs rdma-core 45 or newer
        /// at run time: on an older library registering fails with
        /// [`Error::LibraryTooOld`](crate::Error::LibraryTooOld).
        const FLUSH_GLOBAL = sys::ibv_access_flags::IBV_ACCESS_FLUSH_GLOBAL.0;
        /// Peers may flush for persistence (rdma-core 45 or newer, as
        /// `FLUSH_GLOBAL`).
        const FLUSH_PERSISTENT = sys::ibv_access_flags::IBV_ACCESS_FLUSH_PERSISTENT.0;
    }
}

#[cfg(feature = "rdmacm")]
device_enum! {
    /// The type of an rdma_cm event (`RDMA_CM_EVENT_*`).
    CmEventType {
        /// `rdma_resolve_addr` finished.
        AddrResolved = sys::RDMA_CM_EVENT_ADDR_RESOLVED,
        /// `rdma_resolve_addr` failed.
        AddrError = sys::RDMA_CM_EVENT_ADDR_ERROR,
        /// `rdma_resolve_route` finished.
        RouteResolved = sys::RDMA_CM_EVENT_ROUTE_RESOLVED,
        /// `rdma_resolve_route` failed.
        RouteError = sys::RDMA_CM_EVENT_ROUTE_ERROR,
        /// A peer asks to connect (the event carries the new id).
        ConnectRequest = sys::RDMA_CM_EVENT_CONNECT_REQUEST,
        /// The peer answered (handled by the library, reported as `Established`).
        ConnectResponse = sys::RDMA_CM_EVENT_CONNECT_RESPONSE,
        /// Connecting failed.
        ConnectError = sys::RDMA_CM_EVENT_CONNECT_ERROR,
        /// The peer is unreachable.
        Unreachable = sys::RDMA_CM_EVENT_UNREACHABLE,
        /// The peer rejected the connection (or nobody listens).
        Rejected = sys::RDMA_CM_EVENT_REJECTED,
        /// The connection is up.
        Established = sys::RDMA_CM_EVENT_ESTABLISHED,
        /// The connection is down.
        Disconnected = sys::RDMA_CM_EVENT_DISCONNECTED,
        /// The device went away.
        DeviceRemoval = sys::RDMA_CM_EVENT_DEVICE_REMOVAL,
        /// Multicast join finished.
        MulticastJoin = sys::RDMA_CM_EVENT_MULTICAST_JOIN,
        /// Multicast error.
        MulticastError = sys::RDMA_CM_EVENT_MULTICAST_ERROR,
        /// The local address changed.
        AddrChange = sys::RDMA_CM_EVENT_ADDR_CHANGE,
        /// The id left the timewait state.
        TimewaitExit = sys::RDMA_CM_EVENT_TIMEWAIT_EXIT,
    }
}

/// A port number of a device (1-based on HCAs; switches have port 0).
///
/// Never assume port 1: take it from the user or from
/// [`Context::active_port`](crate::Context::active_port).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PortNumber(pub u8);

impl std::fmt::Display for PortNumber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// A 128-bit Global Identifier: an IPv6 address on RoCE v2, subnet prefix +
/// port GUID on InfiniBand.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// The all-zero GID (an empty table slot).
    pub const ZERO: Gid = Gid([0; 16]);

    /// Whether every byte is zero.
    pub fn is_zero(&self) -> bool {
        self.0 == [0; 16]
    }

    /// The GID as an IPv6 address.
    pub fn to_ipv6(&self) -> Ipv6Addr {
        Ipv6Addr::from(self.0)
    }

    /// The IPv4 address of an IPv4-mapped GID (`::ffff:a.b.c.d`).
    pub fn to_ipv4_mapped(&self) -> Option<Ipv4Addr> {
        self.to_ipv6().to_ipv4_mapped()
    }

    /// Whether the GID is a link-local address: IPv6 `fe80::/10`, or an
    /// IPv4-mapped address in `169.254.0.0/16`. Such a GID reaches only its
    /// own link (RoCE v2 does not route it), and the first one on a RoCE
    /// port (`fe80::` from the netdev's MAC) exists before any IP address
    /// is configured: what [`GidSelector::RoceV2Ipv4`] skips.
    pub fn is_link_local(&self) -> bool {
        match self.to_ipv4_mapped() {
            Some(v4) => v4.is_link_local(),
            None => self.0[0] == 0xfe && self.0[1] & 0xc0 == 0x80,
        }
    }

    /// Subnet prefix (upper 64 bits, host order).
    pub fn subnet_prefix(&self) -> u64 {
        u64::from_be_bytes(self.0[..8].try_into().unwrap())
    }

    /// Interface id (lower 64 bits, host order).
    pub fn interface_id(&self) -> u64 {
        u64::from_be_bytes(self.0[8..].try_into().unwrap())
    }

    pub(crate) fn from_raw(raw: &sys::ibv_gid) -> Gid {
        // SAFETY: every bit pattern of the 16-byte union is a valid `raw` array.
        Gid(unsafe { raw.raw })
    }

    pub(crate) fn to_raw(self) -> sys::ibv_gid {
        sys::ibv_gid { raw: self.0 }
    }
}

impl From<Ipv6Addr> for Gid {
    fn from(a: Ipv6Addr) -> Gid {
        Gid(a.octets())
    }
}

impl From<Ipv4Addr> for Gid {
    /// The IPv4-mapped GID used by RoCE v2 for IPv4 addresses.
    fn from(a: Ipv4Addr) -> Gid {
        Gid(a.to_ipv6_mapped().octets())
    }
}

impl std::fmt::Display for Gid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.to_ipv6().fmt(f)
    }
}

impl std::fmt::Debug for Gid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Gid({})", self.to_ipv6())
    }
}

impl std::str::FromStr for Gid {
    type Err = std::net::AddrParseError;
    /// Parses IPv6 text (`fe80::1`, `::ffff:10.0.2.15`) or a bare IPv4 address.
    fn from_str(s: &str) -> Result<Gid, Self::Err> {
        match s.parse::<Ipv4Addr>() {
            Ok(v4) => Ok(v4.into()),
            Err(_) => s.parse::<Ipv6Addr>().map(Gid::from),
        }
    }
}

/// An index into a port's GID table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GidIndex(pub u8);

/// Which GID table entry to use: by address, by network device, or the
/// RoCE v2 IPv4 entry every RDMA runtime looks for by hand. Applied with
/// [`Context::select_gid`](crate::Context::select_gid) (reads the table)
/// or [`GidSelector::select`] (over a table already read).
///
/// Only non-empty entries of the port asked for are considered. Where the
/// table holds the same address twice (RoCE v1 and RoCE v2 entries, as
/// mlx5 ports do), the RoCE v2 one is chosen.
///
/// # References
/// `ibv_query_gid_table(3)`; the sysfs files `ports/P/gid_attrs/types/I` and
/// `ports/P/gid_attrs/ndevs/I` that back it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum GidSelector {
    /// The first RoCE v2 entry whose GID is an IPv4-mapped address that is
    /// not link-local (`169.254.0.0/16`): routable RoCE v2 over IPv4, what
    /// `-g`/`-x` usually name by hand.
    RoceV2Ipv4,
    /// [`RoceV2Ipv4`](GidSelector::RoceV2Ipv4) when the port has such an
    /// entry, else its first non-empty entry. What
    /// [`Context::default_gid_index`](crate::Context::default_gid_index)
    /// and the tools use on RoCE when no `-g` is given.
    Automatic,
    /// The entry holding this address: an IPv4 address as its IPv4-mapped
    /// GID (`::ffff:a.b.c.d`), an IPv6 address as itself.
    Address(IpAddr),
    /// [`Automatic`](GidSelector::Automatic) among the entries of this
    /// network device (`eth0`). A name that is no network device matches
    /// nothing.
    Netdev(String),
}

impl std::fmt::Display for GidSelector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GidSelector::RoceV2Ipv4 => {
                f.write_str("RoCE v2 GID with a non-link-local IPv4 address")
            }
            GidSelector::Automatic => f.write_str("non-empty GID"),
            GidSelector::Address(a) => write!(f, "GID with address {a}"),
            GidSelector::Netdev(n) => write!(f, "GID of network device {n:?}"),
        }
    }
}
