//! rdma_cm identifiers: address and route resolution, listen, connect,
//! accept, reject, disconnect.
//!
//! The queue pair of a connection is an ordinary [`QueuePair`] created on
//! the id's [`Context`]: the library moves it through INIT, RTR and RTS with
//! the attributes `rdma_init_qp_attr` computes (checked against the IBA
//! state table by [`QueuePair::modify`], under the QP's send lock), so
//! librdmacm never modifies it behind the data path's back and the same safe
//! posting and completion path applies.

use std::net::SocketAddr;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use rdma_verbs_sys as sys;

use super::event_channel::EventChannel;
use crate::device::context::Context;
use crate::error::{Error, Result};
use crate::qp::queue_pair::QueuePair;
use crate::qp::queue_pair::{QpAttr, QpInner};
use crate::types::QpState;

/// How an adopted id receives its events.
pub(crate) enum IdMode {
    /// On event channels of ours (librdmacm's `id->channel` among them).
    Channels(Vec<EventChannel>),
    /// Synchronously (`sync_mode.rs`), with the listener a connect request
    /// came from.
    Sync { listener: Option<CmId> },
}

/// What keeps an rdma_cm id alive: destroyed (`rdma_destroy_id`) with the
/// last [`CmId`] handle and the last verbs object created on its context.
pub(crate) struct IdHandle {
    id: NonNull<sys::rdma_cm_id>,
    /// What the event path reaches through `id->context`, which holds one
    /// strong count of it (leaked by `adopt`, taken back by `Drop` once the
    /// id is destroyed). A separate allocation: the event path's `&IdShared`
    /// never overlaps the `&mut IdHandle` of `Drop`.
    shared: Arc<IdShared>,
}

/// The part of an id the event path uses while another thread may be
/// dropping the [`IdHandle`] (`rdma_destroy_id` waits for the event's ack).
pub(crate) struct IdShared {
    /// Unique in the process, never reused (unlike the id's address): what
    /// [`CmEvent::is_for`](super::CmEvent::is_for) compares.
    pub(crate) serial: u64,
    /// The QP of an active connect, until the connect response (weak: the
    /// QP's context keeps the id alive).
    pending: Mutex<Option<Weak<QpInner>>>,
    /// The multicast groups joined and not yet left (`multicast.rs`).
    pub(crate) mcast: Mutex<Vec<super::multicast::Join>>,
    /// Every event channel the id has been on (creation, each
    /// [`CmId::migrate`]): librdmacm's `id->channel`, which its calls on the
    /// id read (`rdma_destroy_id` included), is always one of them. Kept
    /// open until the id is destroyed (rdma_destroy_event_channel(3)): they
    /// drop with this `IdShared`, i.e. after `rdma_destroy_id` succeeded,
    /// or never. Empty for a synchronous id (librdmacm owns its channel).
    pub(crate) channels: Mutex<Vec<EventChannel>>,
    /// `Some` for a synchronous id (`sync_mode.rs`): held across every call
    /// that acknowledges or reads the event librdmacm keeps in `id->event`.
    pub(crate) sync: Option<Mutex<()>>,
    /// For a synchronous connect request's id: its listener, whose event
    /// (the request) librdmacm keeps on this id until it accepts or is
    /// destroyed; the listener's `rdma_destroy_id` waits for that ack, so
    /// it must not run first.
    #[allow(dead_code)] // held, never read: dropped after the destroy
    pub(crate) listener: Option<CmId>,
}

static NEXT_SERIAL: AtomicU64 = AtomicU64::new(1);

// SAFETY: librdmacm's id calls are thread-safe; the mutable state is
// behind a Mutex (in `IdShared`).
unsafe impl Send for IdHandle {}
// SAFETY: as above.
unsafe impl Sync for IdHandle {}

impl Drop for IdHandle {
    fn drop(&mut self) {
        // SAFETY: last reference. Events are acknowledged as soon as they
        // are read, so rdma_destroy_id does not wait for the application
        // (only for an event another thread is reading, until its ack).
        // Errors cannot be reported from Drop.
        let rc = unsafe { sys::rdma_destroy_id(self.id.as_ptr()) };
        if rc == 0 {
            // SAFETY: the count `adopt` leaked into `context`, taken back
            // once: the id is freed, no event can name it any more.
            drop(unsafe { Arc::from_raw(Arc::as_ptr(&self.shared)) });
        }
        // Otherwise the id may live on, pointing at `shared` (and through
        // it at its channels and listener): all leaked.
    }
}

impl IdShared {
    /// The `IdShared` of an id this crate adopted, from its `context`;
    /// `None` for an id without one.
    ///
    /// # Safety
    /// The caller must pass an id that is alive for `'a` (e.g. named by an
    /// event not yet acknowledged: `rdma_destroy_id` waits for the ack) and
    /// whose `context`, when not NULL, was set by [`CmId::adopt`].
    pub(crate) unsafe fn of<'a>(id: *const sys::rdma_cm_id) -> Option<&'a IdShared> {
        // SAFETY: the caller's contract: the id is alive, and its `context`
        // holds a strong count of the `IdShared` until the id is destroyed.
        unsafe {
            id.as_ref()?
                .context
                .cast::<IdShared>()
                .cast_const()
                .as_ref()
        }
    }

    /// Active side, on the connect response of `id` (whose `IdShared` this
    /// is): RTR, RTS, `rdma_establish`.
    ///
    /// # Safety
    /// The caller must pass this `IdShared`'s id, alive during the call.
    pub(crate) unsafe fn finish_connect(&self, id: *mut sys::rdma_cm_id) -> Result<()> {
        let pending = self
            .pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        let qp = pending
            .and_then(|w| w.upgrade())
            .map(|inner| QueuePair { inner })
            .ok_or(Error::QueuePairDropped)?;
        // SAFETY: the caller's contract.
        unsafe { ready(id, &qp, None)? };
        // SAFETY: live id with a connect response pending.
        let rc = unsafe { sys::rdma_establish(id) };
        neg_errno("rdma_establish", rc)
    }
}

/// Moves `qp` to `state` with the attributes rdma_cm computes for `id`.
///
/// # Safety
/// The caller must pass a live id.
pub(super) unsafe fn move_qp(
    id: *mut sys::rdma_cm_id,
    qp: &QueuePair,
    state: QpState,
) -> Result<()> {
    // SAFETY: the caller's contract.
    unsafe { move_qp_capped(id, qp, state, None) }
}

/// INIT again (the access rights rdma_cm grants depend on the negotiated
/// responder resources, unknown before connecting), then RTR and RTS, as
/// librdmacm does for the QPs it manages. `caps` (passive side: what our
/// `ConnParam` offers) bounds the RDMA read/atomic depths.
///
/// # Safety
/// The caller must pass a live id.
unsafe fn ready(id: *mut sys::rdma_cm_id, qp: &QueuePair, caps: Option<(u8, u8)>) -> Result<()> {
    // SAFETY: the caller's contract, for all three.
    unsafe {
        move_qp(id, qp, QpState::Init)?;
        move_qp_capped(id, qp, QpState::Rtr, caps)?;
        move_qp_capped(id, qp, QpState::Rts, caps)
    }
}

/// # Safety
/// The caller must pass a live id.
unsafe fn move_qp_capped(
    id: *mut sys::rdma_cm_id,
    qp: &QueuePair,
    state: QpState,
    caps: Option<(u8, u8)>,
) -> Result<()> {
    let mut raw = sys::ibv_qp_attr {
        qp_state: state.as_raw(),
        ..Default::default()
    };
    let mut mask = 0i32;
    // SAFETY: live id (the caller's contract); `raw` and `mask` are valid
    // for writes.
    let rc = unsafe { sys::rdma_init_qp_attr(id, &mut raw, &mut mask) };
    if rc != 0 {
        return Err(Error::Verb {
            verb: "rdma_init_qp_attr",
            io: std::io::Error::last_os_error(),
        });
    }
    if let Some((responder, initiator)) = caps {
        raw.max_dest_rd_atomic = raw.max_dest_rd_atomic.min(responder);
        raw.max_rd_atomic = raw.max_rd_atomic.min(initiator);
    }
    qp.modify(&QpAttr::from_raw(raw, mask as u32))
}

/// librdmacm returns -1 and sets errno.
pub(super) fn neg_errno(verb: &'static str, rc: i32) -> Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(Error::Verb {
            verb,
            io: std::io::Error::last_os_error(),
        })
    }
}

/// Connection parameters (`struct rdma_conn_param`). Defaults as rping's:
/// one outstanding RDMA read/atomic each way, retry and RNR retry 7.
#[derive(Debug, Clone)]
#[must_use]
pub struct ConnParam {
    responder_resources: u8,
    initiator_depth: u8,
    retry_count: u8,
    rnr_retry_count: u8,
    private_data: Vec<u8>,
}

impl Default for ConnParam {
    fn default() -> Self {
        ConnParam {
            responder_resources: 1,
            initiator_depth: 1,
            retry_count: 7,
            rnr_retry_count: 7,
            private_data: Vec::new(),
        }
    }
}

impl ConnParam {
    /// Default parameters.
    pub fn new() -> ConnParam {
        ConnParam::default()
    }
    /// Outstanding RDMA reads/atomics the peer may direct at us.
    pub fn responder_resources(mut self, n: u8) -> Self {
        self.responder_resources = n;
        self
    }
    /// Outstanding RDMA reads/atomics we may direct at the peer.
    pub fn initiator_depth(mut self, n: u8) -> Self {
        self.initiator_depth = n;
        self
    }
    /// Transport retries (0–7).
    pub fn retry_count(mut self, n: u8) -> Self {
        self.retry_count = n;
        self
    }
    /// RNR retries (0–7, 7 = infinite).
    pub fn rnr_retry_count(mut self, n: u8) -> Self {
        self.rnr_retry_count = n;
        self
    }
    /// Private data carried to the peer (at most 56 bytes on connect, 196
    /// on accept, for the TCP port space).
    pub fn private_data(mut self, data: &[u8]) -> Self {
        self.private_data = data.to_vec();
        self
    }

    pub(super) fn raw(&self, qp_num: u32, max_private: usize) -> Result<sys::rdma_conn_param> {
        if self.private_data.len() > max_private {
            return Err(Error::OutOfRange {
                what: "private data length",
                value: self.private_data.len() as u64,
                max: max_private as u64,
            });
        }
        for (what, v) in [
            ("retry_count", self.retry_count),
            ("rnr_retry_count", self.rnr_retry_count),
        ] {
            if v > 7 {
                return Err(Error::OutOfRange {
                    what,
                    value: v.into(),
                    max: 7,
                });
            }
        }
        Ok(sys::rdma_conn_param {
            private_data: if self.private_data.is_empty() {
                std::ptr::null()
            } else {
                self.private_data.as_ptr().cast()
            },
            private_data_len: self.private_data.len() as u8,
            responder_resources: self.responder_resources,
            initiator_depth: self.initiator_depth,
            flow_control: 1,
            retry_count: self.retry_count,
            rnr_retry_count: self.rnr_retry_count,
            srq: 0,
            qp_num,
        })
    }
}

crate::types::device_enum! {
    /// The port space of an rdma_cm id (`enum rdma_port_space`): which
    /// queue pairs it manages and which kernel port numbers it binds.
    PortSpace {
        /// Reliable connections (RC queue pairs); [`CmId::new`]'s.
        Tcp = sys::RDMA_PS_TCP,
        /// Unreliable datagrams (UD queue pairs) and multicast.
        Udp = sys::RDMA_PS_UDP,
        /// IPoIB's space (UD; multicast groups shared with IPoIB).
        Ipoib = sys::RDMA_PS_IPOIB,
        /// InfiniBand native addressing (`AF_IB`).
        Ib = sys::RDMA_PS_IB,
    }
}

/// An rdma_cm identifier (`struct rdma_cm_id`; port space TCP, reliable
/// connections, unless created with [`CmId::with_port_space`]). Cheap to
/// clone.
///
/// # References
/// `rdma_create_id(3)`, `rdma_cm(7)`
#[derive(Clone)]
pub struct CmId {
    handle: Arc<IdHandle>,
}

impl std::fmt::Debug for CmId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CmId")
            .field("local", &self.local_addr())
            .field("peer", &self.peer_addr())
            .finish()
    }
}

pub(super) fn to_sockaddr(addr: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: all-zero is a valid sockaddr_storage.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than sockaddr_in and aligned for it.
            unsafe { std::ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin) };
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: as above, for sockaddr_in6.
            unsafe { std::ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin6) };
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (ss, len as libc::socklen_t)
}

/// # Safety
/// `sa` is NULL or points to a valid sockaddr of its family.
pub(super) unsafe fn from_sockaddr(sa: *const sys::sockaddr) -> Option<SocketAddr> {
    // SAFETY: the caller's contract; the family says which struct it is.
    unsafe {
        let sa = sa.cast::<libc::sockaddr>().as_ref()?;
        match i32::from(sa.sa_family) {
            libc::AF_INET => {
                let sin = &*(sa as *const libc::sockaddr).cast::<libc::sockaddr_in>();
                Some(SocketAddr::from((
                    sin.sin_addr.s_addr.to_ne_bytes(),
                    u16::from_be(sin.sin_port),
                )))
            }
            libc::AF_INET6 => {
                let sin6 = &*(sa as *const libc::sockaddr).cast::<libc::sockaddr_in6>();
                Some(SocketAddr::V6(std::net::SocketAddrV6::new(
                    sin6.sin6_addr.s6_addr.into(),
                    u16::from_be(sin6.sin6_port),
                    sin6.sin6_flowinfo,
                    sin6.sin6_scope_id,
                )))
            }
            _ => None,
        }
    }
}

fn ms(timeout: Duration) -> i32 {
    timeout.as_millis().clamp(1, i32::MAX as u128) as i32
}

impl CmId {
    /// Creates an id on `channel` in the TCP port space (RC connections).
    ///
    /// # Errors
    /// [`Error::Verb`] naming `rdma_create_id`.
    ///
    /// # References
    /// `rdma_create_id(3)`
    #[doc(alias = "rdma_create_id")]
    pub fn new(channel: &EventChannel) -> Result<CmId> {
        CmId::with_port_space(channel, PortSpace::Tcp)
    }

    /// Creates an id on `channel` in the port space `ps`:
    /// [`PortSpace::Udp`] for UD queue pairs and multicast
    /// ([`CmId::join_multicast`]).
    ///
    /// # Errors
    /// [`Error::Verb`] naming `rdma_create_id`.
    ///
    /// # References
    /// `rdma_create_id(3)`
    #[doc(alias = "rdma_create_id")]
    pub fn with_port_space(channel: &EventChannel, ps: PortSpace) -> Result<CmId> {
        let mut id = std::ptr::null_mut();
        // SAFETY: live channel; `id` receives the new id (owned below).
        let rc = unsafe {
            sys::rdma_create_id(
                channel.inner.ch.as_ptr(),
                &mut id,
                std::ptr::null_mut(),
                ps.as_raw(),
            )
        };
        neg_errno("rdma_create_id", rc)?;
        let id = NonNull::new(id).ok_or_else(|| Error::Verb {
            verb: "rdma_create_id",
            io: std::io::Error::from_raw_os_error(libc::ENOMEM),
        })?;
        // SAFETY: a fresh id owned by nobody else, on `channel`.
        Ok(unsafe { CmId::adopt(id, IdMode::Channels(vec![channel.clone()])) })
    }

    /// Takes ownership of an id librdmacm created (connect requests).
    ///
    /// # Safety
    /// `id` is valid and owned by no other handle; for
    /// [`IdMode::Channels`], librdmacm's `id->channel` is one of them; for
    /// [`IdMode::Sync`], the id is synchronous (librdmacm's own channel).
    pub(crate) unsafe fn adopt(id: NonNull<sys::rdma_cm_id>, mode: IdMode) -> CmId {
        let (channels, sync, listener) = match mode {
            IdMode::Channels(c) => (c, None, None),
            IdMode::Sync { listener } => (Vec::new(), Some(Mutex::new(())), listener),
        };
        let shared = Arc::new(IdShared {
            serial: NEXT_SERIAL.fetch_add(1, Ordering::Relaxed),
            pending: Mutex::new(None),
            mcast: Mutex::new(Vec::new()),
            channels: Mutex::new(channels),
            sync,
            listener,
        });
        // SAFETY: the caller's contract; `context` is ours to set (for a
        // connect request's id librdmacm copied the listening id's there:
        // not a count of ours, overwritten). It holds one strong count,
        // taken back when the id is destroyed (IdHandle's Drop).
        unsafe { (*id.as_ptr()).context = Arc::into_raw(Arc::clone(&shared)).cast_mut().cast() };
        CmId {
            handle: Arc::new(IdHandle { id, shared }),
        }
    }

    /// The id's serial number (see `IdShared::serial`).
    pub(crate) fn serial(&self) -> u64 {
        self.handle.shared.serial
    }

    /// The part of the id the event path shares.
    pub(super) fn shared(&self) -> &IdShared {
        &self.handle.shared
    }

    /// The raw id, valid while `self` lives.
    pub fn as_ptr(&self) -> *mut sys::rdma_cm_id {
        self.handle.id.as_ptr()
    }

    pub(super) fn id(&self) -> *mut sys::rdma_cm_id {
        self.as_ptr()
    }

    /// The device context the id is bound to (after address resolution,
    /// binding to a device address, or for a connect request's id); `None`
    /// before. Create the PD, CQs and QP of the connection on it.
    pub fn context(&self) -> Option<Context> {
        // SAFETY: live id; `verbs` is set by librdmacm and then stable.
        let verbs = NonNull::new(unsafe { (*self.id()).verbs })?;
        Some(Context::borrowed(verbs, self.handle.clone()))
    }

    /// The local port number (`port_num`) of the bound device.
    pub fn port_num(&self) -> crate::types::PortNumber {
        // SAFETY: live id.
        crate::types::PortNumber(unsafe { (*self.id()).port_num })
    }

    /// The local address.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        // SAFETY: live id; librdmacm returns its stored address.
        unsafe { from_sockaddr(sys::rdma_get_local_addr(self.id())) }
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        // SAFETY: as above.
        unsafe { from_sockaddr(sys::rdma_get_peer_addr(self.id())) }
    }

    /// Binds to a local address (port 0 picks one).
    ///
    /// # Errors
    /// [`Error::Verb`] naming `rdma_bind_addr` (`EADDRINUSE`,
    /// `EADDRNOTAVAIL` for an address no RDMA device has).
    ///
    /// # References
    /// `rdma_bind_addr(3)`
    #[doc(alias = "rdma_bind_addr")]
    pub fn bind_addr(&self, addr: SocketAddr) -> Result<()> {
        let (mut ss, _) = to_sockaddr(addr);
        // SAFETY: live id; a valid sockaddr of its family.
        let rc = unsafe {
            sys::rdma_bind_addr(self.id(), (&mut ss as *mut libc::sockaddr_storage).cast())
        };
        neg_errno("rdma_bind_addr", rc).map_err(|e| e.with_hint(Some(format!("address {addr}"))))
    }

    /// Listens for connect requests (delivered as
    /// [`CmEventType::ConnectRequest`](super::CmEventType::ConnectRequest)).
    ///
    /// # Errors
    /// [`Error::Verb`] naming `rdma_listen`.
    ///
    /// # References
    /// `rdma_listen(3)`
    #[doc(alias = "rdma_listen")]
    pub fn listen(&self, backlog: i32) -> Result<()> {
        // SAFETY: live, bound id.
        neg_errno("rdma_listen", unsafe {
            sys::rdma_listen(self.id(), backlog)
        })
    }

    /// Starts resolving `dst` (and the local device) within `timeout`;
    /// completes with an `AddrResolved` or `AddrError` event.
    ///
    /// # Errors
    /// [`Error::Verb`] naming `rdma_resolve_addr`.
    ///
    /// # References
    /// `rdma_resolve_addr(3)`
    #[doc(alias = "rdma_resolve_addr")]
    pub fn resolve_addr(
        &self,
        src: Option<SocketAddr>,
        dst: SocketAddr,
        timeout: Duration,
    ) -> Result<()> {
        let (mut d, _) = to_sockaddr(dst);
        let mut s = src.map(|a| to_sockaddr(a).0);
        let sp = s.as_mut().map_or(std::ptr::null_mut(), |s| {
            (s as *mut libc::sockaddr_storage).cast()
        });
        // A synchronous id blocks here until the address is resolved.
        let _sync = self.sync_lock();
        // SAFETY: live id; valid sockaddrs (or NULL source).
        let rc = unsafe {
            sys::rdma_resolve_addr(
                self.id(),
                sp,
                (&mut d as *mut libc::sockaddr_storage).cast(),
                ms(timeout),
            )
        };
        neg_errno("rdma_resolve_addr", rc)
            .map_err(|e| e.with_hint(Some(format!("destination {dst}"))))
    }

    /// Starts resolving the route to the resolved address; completes with
    /// a `RouteResolved` or `RouteError` event.
    ///
    /// # Errors
    /// [`Error::Verb`] naming `rdma_resolve_route`.
    ///
    /// # References
    /// `rdma_resolve_route(3)`
    #[doc(alias = "rdma_resolve_route")]
    pub fn resolve_route(&self, timeout: Duration) -> Result<()> {
        let _sync = self.sync_lock();
        // SAFETY: live id with a resolved address.
        neg_errno("rdma_resolve_route", unsafe {
            sys::rdma_resolve_route(self.id(), ms(timeout))
        })
    }

    /// The id's port space.
    pub fn port_space(&self) -> PortSpace {
        // SAFETY: live id; `ps` is set at creation and never changes.
        PortSpace::from_raw(unsafe { (*self.id()).ps })
    }

    fn check_qp(&self, qp: &QueuePair) -> Result<()> {
        if self.is_ud() {
            self.check_qp_of(
                qp,
                crate::types::QpType::Ud,
                "an rdma_cm UD exchange (UDP port space)",
            )
        } else {
            self.check_qp_of(
                qp,
                crate::types::QpType::Rc,
                "an rdma_cm connection (TCP port space)",
            )
        }
    }

    /// Whether the id manages UD queue pairs (UDP and IPoIB port spaces),
    /// as librdmacm decides it (`qp_type`, set at creation).
    pub(super) fn is_ud(&self) -> bool {
        // SAFETY: live id; `qp_type` never changes.
        unsafe { (*self.id()).qp_type == sys::IBV_QPT_UD }
    }

    /// `qp` was created on this id's context and is of type `want`.
    pub(super) fn check_qp_of(
        &self,
        qp: &QueuePair,
        want: crate::types::QpType,
        what: &'static str,
    ) -> Result<()> {
        // SAFETY: live id.
        let verbs = unsafe { (*self.id()).verbs };
        if verbs.is_null() || qp.pd().context().as_ptr() != verbs {
            return Err(Error::ForeignContext { what: "queue pair" });
        }
        if qp.qp_type() != want {
            return Err(Error::WrongQpType {
                what,
                qp_type: qp.qp_type(),
            });
        }
        Ok(())
    }

    /// Moves `qp` (RC, created on [`CmId::context`]) from RESET to INIT
    /// with the port, P_Key and access rights rdma_cm chose, so receives can
    /// be posted before [`CmId::connect`] or [`CmId::accept`] (which do this
    /// themselves for a QP still in RESET).
    ///
    /// # Errors
    /// As [`CmId::connect`].
    ///
    /// # References
    /// `rdma_init_qp_attr(3)`
    #[doc(alias = "rdma_init_qp_attr")]
    pub fn init_qp(&self, qp: &QueuePair) -> Result<()> {
        self.check_qp(qp)?;
        // SAFETY: live id (`self`).
        unsafe { move_qp(self.id(), qp, QpState::Init) }
    }

    fn init_if_reset(&self, qp: &QueuePair) -> Result<()> {
        if qp.state()? == QpState::Reset {
            // SAFETY: live id (`self`).
            unsafe { move_qp(self.id(), qp, QpState::Init)? };
        }
        Ok(())
    }

    /// Connects `qp` (RC, created on [`CmId::context`], in RESET or INIT)
    /// to the resolved peer: moves it to INIT, sends the request, and — when the
    /// peer accepts — [`EventChannel::get_event`] moves it to RTR and RTS,
    /// establishes the connection and reports `Established`.
    ///
    /// On a synchronous id ([`CmId::new_sync`]) the call blocks until the
    /// peer answered and returns with the connection established
    /// (`rdma_establish`); no event follows.
    ///
    /// On a UD id (UDP port space) `qp` is a UD queue pair (RESET, INIT or
    /// RTS: moved to RTS with the id's Q_Key first) and the request is a
    /// SIDR lookup: `Established` carries the peer's queue pair number,
    /// Q_Key and address vector ([`CmEvent::ud_param`](super::CmEvent::ud_param)).
    ///
    /// # Errors
    /// [`Error::ForeignContext`] for a QP of another context,
    /// [`Error::WrongQpType`] for one that is not RC (UD on a UD id),
    /// [`Error::OutOfRange`] for private data over 56 bytes (180 on a UD
    /// id) or a retry count over 7; [`Error::Unsupported`] for a UD connect
    /// on a synchronous id (the peer's parameters come only with an
    /// event); [`Error::Verb`] naming `rdma_init_qp_attr`, `ibv_modify_qp`,
    /// `rdma_connect` (on a synchronous id `ECONNREFUSED` when rejected) or
    /// `rdma_establish`.
    ///
    /// # References
    /// `rdma_connect(3)`
    #[doc(alias = "rdma_connect")]
    pub fn connect(&self, qp: &QueuePair, param: &ConnParam) -> Result<()> {
        self.check_qp(qp)?;
        let sync = self.sync_lock();
        if self.is_ud() {
            return self.connect_ud(qp, param, sync.is_some());
        }
        let mut raw = param.raw(qp.qp_num().0, 56)?;
        self.init_if_reset(qp)?;
        if sync.is_some() {
            // SAFETY: live id; `raw` outlives the call, which returns once
            // the peer answered (the response stays in `id->event`, which
            // the held lock keeps anyone else from acknowledging).
            let rc = unsafe { sys::rdma_connect(self.id(), &mut raw) };
            neg_errno("rdma_connect", rc)?;
            // SAFETY: live id with a connect response.
            unsafe { ready(self.id(), qp, None)? };
            // SAFETY: as above.
            return neg_errno("rdma_establish", unsafe { sys::rdma_establish(self.id()) });
        }
        *self
            .handle
            .shared
            .pending
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(Arc::downgrade(&qp.inner));
        // SAFETY: live id with a resolved route; `raw` (and the private data
        // it points to) outlive the call.
        let rc = unsafe { sys::rdma_connect(self.id(), &mut raw) };
        neg_errno("rdma_connect", rc)
    }

    /// Accepts a connect request on this (request) id with `qp` (RC,
    /// created on [`CmId::context`], in RESET or INIT), which is moved
    /// through INIT, RTR and RTS first; `Established` follows on the channel
    /// (a synchronous id's accept blocks until then instead). On a UD id,
    /// `qp` is a UD queue pair moved to RTS first, and the SIDR reply
    /// carries its number and the id's Q_Key; no event follows.
    ///
    /// # Errors
    /// As [`CmId::connect`], naming `rdma_accept` (136 bytes of private data
    /// on a UD id, 196 otherwise).
    ///
    /// # References
    /// `rdma_accept(3)`
    #[doc(alias = "rdma_accept")]
    pub fn accept(&self, qp: &QueuePair, param: &ConnParam) -> Result<()> {
        self.check_qp(qp)?;
        // A synchronous id blocks in rdma_accept until Established.
        let _sync = self.sync_lock();
        if self.is_ud() {
            return self.accept_ud(qp, param);
        }
        let mut raw = param.raw(qp.qp_num().0, 196)?;
        self.init_if_reset(qp)?;
        let caps = Some((param.responder_resources, param.initiator_depth));
        // SAFETY: live id (`self`).
        unsafe { ready(self.id(), qp, caps)? };
        // SAFETY: live request id; `raw` outlives the call.
        let rc = unsafe { sys::rdma_accept(self.id(), &mut raw) };
        neg_errno("rdma_accept", rc)
    }

    /// Rejects a connect request, with optional private data.
    ///
    /// # Errors
    /// [`Error::OutOfRange`] for more than 148 bytes;
    /// [`Error::Verb`] naming `rdma_reject`.
    ///
    /// # References
    /// `rdma_reject(3)`
    #[doc(alias = "rdma_reject")]
    pub fn reject(&self, private_data: &[u8]) -> Result<()> {
        if private_data.len() > 148 {
            return Err(Error::OutOfRange {
                what: "reject private data length",
                value: private_data.len() as u64,
                max: 148,
            });
        }
        // SAFETY: live request id; the data outlives the call.
        let rc = unsafe {
            sys::rdma_reject(
                self.id(),
                private_data.as_ptr().cast(),
                private_data.len() as u8,
            )
        };
        neg_errno("rdma_reject", rc)
    }

    /// Disconnects; both sides then see `Disconnected`. Move the QP to ERR
    /// and poll to get its outstanding requests back as flushed.
    ///
    /// # Errors
    /// [`Error::Verb`] naming `rdma_disconnect`.
    ///
    /// # References
    /// `rdma_disconnect(3)`
    #[doc(alias = "rdma_disconnect")]
    pub fn disconnect(&self) -> Result<()> {
        // A synchronous id blocks until Disconnected.
        let _sync = self.sync_lock();
        // SAFETY: live id (librdmacm ignores the QP: the id has none).
        neg_errno("rdma_disconnect", unsafe {
            sys::rdma_disconnect(self.id())
        })
    }
}
