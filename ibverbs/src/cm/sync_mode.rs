//! Synchronous rdma_cm ids (`rdma_create_id` without an event channel, as
//! `rdma_create_ep` makes them): resolve, connect, accept and disconnect
//! block until their event arrived, and a listener hands out connect
//! requests with [`CmId::get_request`].
//!
//! librdmacm reads a synchronous id's events from a channel of its own and
//! keeps the last one in `id->event` until the next blocking call (or the
//! destroy) acknowledges it, without a lock. So every call that may
//! acknowledge it holds the id's `IdShared::sync` lock: two threads never
//! acknowledge one event twice. A connect request's id keeps the listener's
//! request event (`rdma_get_request`), which the listener's
//! `rdma_destroy_id` waits for: such an id holds its listener
//! (`IdShared::listener`) until it is destroyed, so the listener is never
//! destroyed first (which would block forever).

use std::os::fd::RawFd;
use std::ptr::NonNull;
use std::sync::MutexGuard;
use std::time::Duration;

use rdma_verbs_sys as sys;

use super::cm_id::{neg_errno, CmId, IdMode, PortSpace};
use crate::error::{Error, Result};

impl CmId {
    /// Creates a synchronous id in the port space `ps`: no event channel;
    /// [`resolve_addr`](Self::resolve_addr), [`resolve_route`](Self::resolve_route),
    /// [`connect`](Self::connect), [`accept`](Self::accept) and
    /// [`disconnect`](Self::disconnect) block until rdma_cm answered (each
    /// bounded by its timeout or the kernel's CM timeouts), and a listener
    /// takes connect requests with [`get_request`](Self::get_request).
    ///
    /// Calls on one synchronous id are serialised (a lock of the id held
    /// across the blocking call): librdmacm keeps the id's last event
    /// unacknowledged until its next blocking call. [`migrate`](Self::migrate)
    /// and multicast joins are refused on it, and so is a UD connect (the
    /// peer's parameters come with an event).
    ///
    /// # Errors
    /// [`Error::Verb`] naming `rdma_create_id` (`ENODEV`/`ENOENT` without the
    /// rdma_cm kernel modules).
    ///
    /// # References
    /// `rdma_create_id(3)` (a NULL channel), `rdma_create_ep(3)`
    ///
    /// # Example
    /// ```no_run
    /// # fn main() -> rdma_verbs::Result<()> {
    /// use std::time::Duration;
    /// use rdma_verbs::cm::{CmId, ConnParam, PortSpace};
    /// let id = CmId::new_sync(PortSpace::Tcp)?;
    /// id.resolve_addr(None, "10.0.2.15:7174".parse().unwrap(), Duration::from_secs(2))?;
    /// id.resolve_route(Duration::from_secs(2))?;
    /// let pd = id.context().expect("resolved").alloc_pd()?;
    /// let cq = pd.context().create_cq(16).build()?;
    /// let qp = id.create_qp(&pd, &cq, &cq, |b| b)?;
    /// id.connect(&qp, &ConnParam::new())?; // returns connected
    /// # Ok(()) }
    /// ```
    #[doc(alias = "rdma_create_ep")]
    #[doc(alias = "rdma_create_id")]
    pub fn new_sync(ps: PortSpace) -> Result<CmId> {
        // librdmacm opens the devices and a channel of its own (`fork.rs`).
        crate::device::fork::note_verbs_start();
        let mut id = std::ptr::null_mut();
        // SAFETY: a NULL channel asks for a synchronous id; `id` receives
        // the new id (owned below).
        let rc = unsafe {
            sys::rdma_create_id(
                std::ptr::null_mut(),
                &mut id,
                std::ptr::null_mut(),
                ps.as_raw(),
            )
        };
        neg_errno("rdma_create_id", rc)?;
        let id =
            NonNull::new(id).ok_or_else(|| Error::from_errno("rdma_create_id", libc::ENOMEM))?;
        // SAFETY: a fresh synchronous id owned by nobody else.
        Ok(unsafe { CmId::adopt(id, IdMode::Sync { listener: None }) })
    }

    /// Whether the id is synchronous ([`CmId::new_sync`], or a connect
    /// request taken with [`get_request`](Self::get_request)).
    pub fn is_sync(&self) -> bool {
        self.shared().sync.is_some()
    }

    /// The lock of a synchronous id (`None` for one with a channel).
    pub(super) fn sync_lock(&self) -> Option<MutexGuard<'_, ()>> {
        self.shared()
            .sync
            .as_ref()
            .map(|m| m.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Waits for the next connect request on this synchronous, listening
    /// id, at most `timeout` (`None`: until one arrives), and returns the
    /// new connection's id (synchronous too): [`accept`](Self::accept) or
    /// [`reject`](Self::reject) it. The new id holds this listener until it
    /// is dropped (its destroy acknowledges the request, which the
    /// listener's destroy waits for).
    ///
    /// # Errors
    /// [`Error::Unsupported`] on an id with an event channel (read its
    /// `ConnectRequest` events instead); [`Error::Verb`] naming `poll`
    /// (`ETIMEDOUT` after the timeout) or `rdma_get_request` (`EINVAL` when
    /// the next event is not a request, e.g. on an id that does not
    /// listen).
    ///
    /// # References
    /// `rdma_get_request(3)`
    #[doc(alias = "rdma_get_request")]
    pub fn get_request(&self, timeout: Option<Duration>) -> Result<CmId> {
        let Some(_sync) = self.sync_lock() else {
            return Err(Error::Unsupported(
                "rdma_get_request on an rdma_cm id with an event channel (read its ConnectRequest events)",
            ));
        };
        if let Some(t) = timeout {
            // SAFETY: live synchronous id: librdmacm's own channel stays
            // open until the id is destroyed.
            let fd = unsafe { (*(*self.id()).channel).fd };
            wait_readable(fd, t, "connect request")?;
        }
        let mut new = std::ptr::null_mut();
        // SAFETY: live synchronous listener (the lock held: nobody else
        // acknowledges its event); `new` receives the request's id.
        let rc = unsafe { sys::rdma_get_request(self.id(), &mut new) };
        neg_errno("rdma_get_request", rc)?;
        let new =
            NonNull::new(new).ok_or_else(|| Error::from_errno("rdma_get_request", libc::EINVAL))?;
        // SAFETY: librdmacm hands the request's id to the caller; it is
        // synchronous (librdmacm migrated it to a channel of its own) and
        // keeps our listener's event until it accepts or is destroyed.
        Ok(unsafe {
            CmId::adopt(
                new,
                IdMode::Sync {
                    listener: Some(self.clone()),
                },
            )
        })
    }
}

/// Waits until `fd` is readable, at most `t`; a timeout says what did not
/// arrive (`what`: "connect request", "rdma_cm event").
pub(super) fn wait_readable(fd: RawFd, t: Duration, what: &str) -> Result<()> {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = t.as_millis().min(i32::MAX as u128) as i32;
    loop {
        // SAFETY: one valid pollfd.
        let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
        if rc > 0 {
            return Ok(());
        }
        if rc == 0 {
            return Err(Error::from_errno("poll", libc::ETIMEDOUT)
                .with_hint(Some(format!("no {what} within {:.1} s", t.as_secs_f64()))));
        }
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EINTR) {
            return Err(Error::Verb {
                verb: "poll",
                io: err,
            });
        }
    }
}
