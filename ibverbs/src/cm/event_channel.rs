//! The rdma_cm event channel and its events.

use std::os::fd::{AsRawFd, RawFd};
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Duration;

use rdma_verbs_sys as sys;

use super::cm_id::{CmId, IdMode, IdShared};
use crate::error::{ret_ptr, Error, Result};
use crate::types::CmEventType;

pub(crate) struct ChannelInner {
    pub(crate) ch: NonNull<sys::rdma_event_channel>,
}

// SAFETY: librdmacm's event channel calls are thread-safe (the channel is a
// file descriptor; events are handed out under librdmacm's locks).
unsafe impl Send for ChannelInner {}
// SAFETY: as above.
unsafe impl Sync for ChannelInner {}

impl Drop for ChannelInner {
    fn drop(&mut self) {
        // SAFETY: last reference: every id on the channel holds a clone, so
        // all are destroyed (rdma_destroy_event_channel(3) requires it).
        unsafe { sys::rdma_destroy_event_channel(self.ch.as_ptr()) };
    }
}

/// An rdma_cm event channel (`struct rdma_event_channel`): delivers the
/// connection events of the [`CmId`]s created on it. Its file descriptor
/// ([`AsRawFd`]) can be watched with poll/epoll. Cheap to clone.
///
/// # References
/// `rdma_create_event_channel(3)`, `rdma_get_cm_event(3)`
#[derive(Clone)]
pub struct EventChannel {
    pub(crate) inner: Arc<ChannelInner>,
}

impl std::fmt::Debug for EventChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventChannel")
            .field("fd", &self.as_raw_fd())
            .finish()
    }
}

/// The descriptor, lent for readiness only (`poll(2)`, epoll, Tokio's
/// `AsyncFd`). There is deliberately no `AsFd`: rdma_ucm's `write(2)`
/// commands carry user pointers the kernel writes responses to, so a
/// `BorrowedFd` would let safe code make the kernel write anywhere, and
/// a `read(2)` would take an event librdmacm never acknowledges. Any I/O
/// on the raw descriptor is the caller's `unsafe` (DESIGN.md, threat
/// model: descriptors lent out).
impl AsRawFd for EventChannel {
    fn as_raw_fd(&self) -> RawFd {
        // SAFETY: live channel; `fd` is immutable.
        unsafe { (*self.inner.ch.as_ptr()).fd }
    }
}

/// One rdma_cm event, already acknowledged (its data copied out).
///
/// # References
/// `rdma_get_cm_event(3)`
#[derive(Debug)]
pub struct CmEvent {
    kind: CmEventType,
    status: i32,
    /// The serial of the id the event names (for a connect request, the
    /// new id's): serials are never reused, addresses are.
    id: Option<u64>,
    /// For a connect request: the listening id's serial.
    listen_id: Option<u64>,
    /// For `ConnectRequest`: the id of the new connection.
    new_id: Option<CmId>,
    private_data: Vec<u8>,
    responder_resources: u8,
    initiator_depth: u8,
    /// For multicast events: the group's UD parameters.
    ud: Option<super::UdParam>,
}

impl CmEvent {
    /// The event type.
    pub fn kind(&self) -> CmEventType {
        self.kind
    }
    /// The event's status (0, or a negative errno / reject reason).
    pub fn status(&self) -> i32 {
        self.status
    }
    /// Whether the event concerns `id` (for a connect request: whether `id`
    /// is the listening id it arrived on).
    ///
    /// Compares the ids' serial numbers, which are never reused: an event
    /// for an id that was destroyed is not taken for a new id that got its
    /// address.
    pub fn is_for(&self, id: &CmId) -> bool {
        let serial = Some(id.serial());
        self.id == serial || (self.new_id.is_some() && self.listen_id == serial)
    }
    /// For a connect request: takes the new connection's id (accept or
    /// reject it).
    pub fn take_id(&mut self) -> Option<CmId> {
        self.new_id.take()
    }
    /// The peer's private data (connect request, response, reject).
    pub fn private_data(&self) -> &[u8] {
        &self.private_data
    }
    /// Responder resources the peer offers (connect request/response).
    pub fn responder_resources(&self) -> u8 {
        self.responder_resources
    }
    /// Initiator depth the peer asks for (connect request/response).
    pub fn initiator_depth(&self) -> u8 {
        self.initiator_depth
    }
    /// For `MulticastJoin` (and `MulticastError`): the group's UD
    /// parameters — remote QPN `0xFFFFFF`, Q_Key and address vector — from
    /// which a sender builds its address handle. For `Established` on a UD
    /// id (UDP port space, after [`CmId::connect`]): the peer's queue pair
    /// number and Q_Key and the address vector to it (SIDR reply). For a
    /// UD `ConnectRequest`: what the request carries (no queue pair number:
    /// a SIDR request has none; the requester's QPN arrives with its first
    /// datagram, [`WorkCompletion::src_qp`](crate::cq::WorkCompletion::src_qp)).
    pub fn ud_param(&self) -> Option<&super::UdParam> {
        self.ud.as_ref()
    }
    /// `Ok(self)` for `expected`, else an error naming what arrived.
    ///
    /// # Errors
    /// [`Error::Verb`] naming `rdma_get_cm_event` with the event's status
    /// when it is an error event, otherwise [`Error::UnexpectedEvent`].
    pub fn expect(self, expected: CmEventType) -> Result<CmEvent> {
        if self.kind == expected {
            return Ok(self);
        }
        let errno = (-self.status).max(0);
        if errno > 0 && errno < 4096 {
            let what = format!(
                "expected {expected:?}, got {:?} (status {})",
                self.kind, self.status
            );
            Err(Error::from_errno("rdma_get_cm_event", errno).with_hint(Some(what)))
        } else {
            Err(Error::UnexpectedEvent {
                expected,
                got: self.kind,
                status: self.status,
            })
        }
    }
}

impl EventChannel {
    /// Opens an event channel.
    ///
    /// # Errors
    /// [`Error::Verb`] naming `rdma_create_event_channel` (`ENODEV`/`ENOENT`
    /// when the rdma_cm kernel modules are not loaded:
    /// `/dev/infiniband/rdma_cm` is missing); [`Error::LibraryNotFound`]
    /// (feature `dlopen`) when librdmacm or libibverbs is not installed.
    ///
    /// # References
    /// `rdma_create_event_channel(3)`
    #[doc(alias = "rdma_create_event_channel")]
    pub fn new() -> Result<EventChannel> {
        // librdmacm lists and opens devices itself (see `fork.rs`).
        crate::device::library::ensure_rdmacm_loaded()?;
        crate::device::fork::note_verbs_start();
        // SAFETY: no preconditions; the channel is destroyed in ChannelInner's Drop.
        let ch = unsafe { sys::rdma_create_event_channel() };
        let ch = ret_ptr("rdma_create_event_channel", ch).map_err(|e| {
            let hint = matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENODEV))
                .then(|| "is /dev/infiniband/rdma_cm there (modules rdma_cm, rdma_ucm)?".into());
            e.with_hint(hint)
        })?;
        Ok(EventChannel {
            inner: Arc::new(ChannelInner { ch }),
        })
    }

    /// Waits for the next event, at most `timeout` (`None`: forever). The
    /// event is acknowledged before it is returned.
    ///
    /// # Errors
    /// [`Error::Verb`] naming `poll` (`ETIMEDOUT` after the timeout) or
    /// `rdma_get_cm_event`; for a connect response, the QP transitions the
    /// library makes (`rdma_init_qp_attr`, `ibv_modify_qp`,
    /// `rdma_establish`).
    ///
    /// # References
    /// `rdma_get_cm_event(3)`, `rdma_ack_cm_event(3)`
    #[doc(alias = "rdma_get_cm_event")]
    pub fn get_event(&self, timeout: Option<Duration>) -> Result<CmEvent> {
        if let Some(t) = timeout {
            super::sync_mode::wait_readable(self.as_raw_fd(), t, "rdma_cm event")?;
        }
        let mut ev: *mut sys::rdma_cm_event = std::ptr::null_mut();
        // SAFETY: live channel; `ev` receives an event we acknowledge below.
        let rc = unsafe { sys::rdma_get_cm_event(self.inner.ch.as_ptr(), &mut ev) };
        if rc != 0 {
            return Err(Error::Verb {
                verb: "rdma_get_cm_event",
                io: std::io::Error::last_os_error(),
            });
        }
        // SAFETY: a valid event until acknowledged; copied out here.
        let raw = unsafe { *ev };
        let kind = CmEventType::from_raw(raw.event);
        // The event's ids are alive until its ack (rdma_destroy_id waits
        // for it), and every id on our channels was adopted (`context` set
        // by CmId::adopt) — except a connect request's new id, whose
        // `context` still is the listening id's until adopted below: its
        // serial is read after.
        // SAFETY: (both calls) as just said.
        let (id, listen_id) = unsafe {
            (
                IdShared::of(raw.id).map(|s| s.serial),
                IdShared::of(raw.listen_id).map(|s| s.serial),
            )
        };
        let mut event = CmEvent {
            kind,
            status: raw.status,
            id,
            listen_id,
            new_id: None,
            private_data: Vec::new(),
            responder_resources: 0,
            initiator_depth: 0,
            ud: None,
        };
        // UD ids (UDP and IPoIB port spaces) get `param.ud` with their
        // connect request and the SIDR reply (Established), as librdmacm
        // copies it for them (`ucma_is_ud_qp`).
        // SAFETY: the event's id is alive until the ack; `qp_type` is set
        // at creation and never changes.
        let ud_id = !raw.id.is_null()
            && unsafe { (*raw.id).qp_type } == sys::IBV_QPT_UD
            && matches!(
                event.kind,
                CmEventType::ConnectRequest | CmEventType::Established
            );
        if ud_id {
            // SAFETY: UD connection events carry `param.ud`.
            let ud = unsafe { raw.param.ud };
            if !ud.private_data.is_null() && ud.private_data_len > 0 {
                // SAFETY: librdmacm's buffer of `private_data_len` bytes,
                // valid until the ack below.
                event.private_data = unsafe {
                    std::slice::from_raw_parts(
                        ud.private_data.cast::<u8>(),
                        ud.private_data_len as usize,
                    )
                }
                .to_vec();
            }
            event.ud = Some(super::UdParam::from_raw(&ud));
        } else if matches!(
            event.kind,
            CmEventType::ConnectRequest
                | CmEventType::ConnectResponse
                | CmEventType::Rejected
                | CmEventType::Established
        ) {
            // SAFETY: connection events carry `param.conn`.
            let conn = unsafe { raw.param.conn };
            if !conn.private_data.is_null() && conn.private_data_len > 0 {
                // SAFETY: librdmacm's buffer of `private_data_len` bytes,
                // valid until the ack below.
                event.private_data = unsafe {
                    std::slice::from_raw_parts(
                        conn.private_data.cast::<u8>(),
                        conn.private_data_len as usize,
                    )
                }
                .to_vec();
            }
            event.responder_resources = conn.responder_resources;
            event.initiator_depth = conn.initiator_depth;
        }
        if event.kind == CmEventType::ConnectRequest {
            if let Some(id) = NonNull::new(raw.id) {
                // librdmacm put the new id on its listener's channel as it
                // was when the request was read: this one, or — while the
                // listener migrates — another the listener keeps. The new
                // id keeps them all (see `IdShared::channels`).
                let mut channels = vec![self.clone()];
                // SAFETY: the listening id is alive until the ack; its
                // `context` is ours (`IdShared::of`'s contract).
                if let Some(l) = unsafe { IdShared::of(raw.listen_id) } {
                    for c in l.channels.lock().unwrap_or_else(|p| p.into_inner()).iter() {
                        if !channels.iter().any(|k| Arc::ptr_eq(&k.inner, &c.inner)) {
                            channels.push(c.clone());
                        }
                    }
                }
                // SAFETY: librdmacm hands the new id to the application;
                // from here on it is owned by the returned CmId; its
                // channel is among `channels` (above).
                let new_id = unsafe { CmId::adopt(id, IdMode::Channels(channels)) };
                event.id = Some(new_id.serial());
                event.new_id = Some(new_id);
            }
        }
        let mut result = Ok(());
        if event.kind == CmEventType::ConnectResponse {
            // The event's id is alive at least until the ack (its
            // destruction waits for it); its `context` holds a count of its
            // IdShared until it is destroyed (CmId::adopt). Only `&IdShared`
            // is formed: a concurrent IdHandle::drop holds `&mut` of the
            // handle, a separate allocation.
            // SAFETY: as just said.
            let shared = unsafe { IdShared::of(raw.id) };
            result = match shared {
                // SAFETY: `raw.id` is this IdShared's id, alive until the ack.
                Some(s) => unsafe { s.finish_connect(raw.id) },
                None => Err(Error::Unsupported("a connect response for an unknown id")),
            };
            event.kind = if result.is_ok() {
                CmEventType::Established
            } else {
                CmEventType::ConnectError
            };
        }
        if matches!(
            event.kind,
            CmEventType::MulticastJoin | CmEventType::MulticastError
        ) {
            // SAFETY: multicast events carry `param.ud` (librdmacm sets its
            // `private_data` to the join's context: a number of ours).
            let ud = unsafe { raw.param.ud };
            let param = super::UdParam::from_raw(&ud);
            if event.kind == CmEventType::MulticastJoin {
                // SAFETY: as for the connect response below: the id is alive
                // until the ack, and its `context` is ours.
                if let Some(s) = unsafe { IdShared::of(raw.id) } {
                    if let Err(e) = super::multicast::on_join(s, ud.private_data as usize, &param) {
                        event.kind = CmEventType::MulticastError;
                        result = Err(e);
                    }
                }
            }
            event.ud = Some(param);
        }
        // SAFETY: acknowledges the event obtained above, exactly once.
        unsafe { sys::rdma_ack_cm_event(ev) };
        result.map(|()| event)
    }
}
