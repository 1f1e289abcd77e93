//! XRC (eXtended Reliable Connected transport): domains, XRC receive
//! queue pairs (created or opened), and the capability check.
//!
//! An XRC domain groups XRC SRQs (built by [`XrcDomain::create_srq`], see
//! `shared_receive_queue.rs`) and XRC receive queue pairs. A sender's XRC
//! send queue pair (a [`QueuePair`](crate::QueuePair) of
//! [`QpType::XrcSend`](crate::QpType::XrcSend)) connects to a receive queue
//! pair and names, in each request, the SRQ whose buffers take the message
//! ([`SendRequest::xrc_srqn`](crate::SendRequest::xrc_srqn)). Receive
//! buffers live only in XRC SRQs, under the SRQ rules; an XRC receive
//! queue pair holds no memory at all. See DESIGN.md, "On-demand paging,
//! XRC, re-registration".

use std::os::fd::{AsRawFd, BorrowedFd};
use std::ptr::NonNull;
use std::sync::Arc;

use rdma_verbs_sys as sys;

use crate::cq::completion_queue::CompletionQueue;
use crate::device::capabilities::Feature;
use crate::device::context::Context;
use crate::error::{ret_errno, ret_ptr, Error, Result};
use crate::memory::protection_domain::ProtectionDomain;
use crate::qp::queue_pair::QpAttr;
use crate::types::QpNumber;

bitflags::bitflags! {
    /// How [`Context::open_xrcd`] treats the file it is given (`oflags`).
    ///
    /// # References
    /// `ibv_open_xrcd(3)`
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct XrcdOpenFlags: i32 {
        /// Create the domain if no process opened one for this file yet
        /// (`O_CREAT`); without it the domain must exist.
        const CREATE = libc::O_CREAT;
        /// With `CREATE`: fail if the domain exists (`O_EXCL`).
        const EXCLUSIVE = libc::O_EXCL;
    }
}

/// What [`Context::open_xrcd`] opens: a private domain (the default), or
/// the domain shared by every process that opens it through the same file
/// (`IBV_XRCD_INIT_ATTR_FD` / `_OFLAGS`). The fd is used during the call
/// only (the kernel keeps the file's inode, not the fd).
///
/// # References
/// `ibv_open_xrcd(3)`
#[derive(Debug, Clone, Copy, Default)]
pub struct XrcdOptions<'a> {
    file: Option<(BorrowedFd<'a>, XrcdOpenFlags)>,
}

impl<'a> XrcdOptions<'a> {
    /// A domain of this process only.
    pub fn new() -> Self {
        XrcdOptions { file: None }
    }
    /// The domain associated with `fd`'s file, opened with `flags`.
    pub fn file(mut self, fd: BorrowedFd<'a>, flags: XrcdOpenFlags) -> Self {
        self.file = Some((fd, flags));
        self
    }
    /// The C attributes (pure, unit-tested).
    fn raw(&self) -> sys::ibv_xrcd_init_attr {
        use sys::ibv_xrcd_init_attr_mask as M;
        match self.file {
            None => sys::ibv_xrcd_init_attr {
                comp_mask: (M::IBV_XRCD_INIT_ATTR_FD | M::IBV_XRCD_INIT_ATTR_OFLAGS).0,
                fd: -1,
                oflags: libc::O_CREAT,
            },
            Some((fd, flags)) => sys::ibv_xrcd_init_attr {
                comp_mask: (M::IBV_XRCD_INIT_ATTR_FD | M::IBV_XRCD_INIT_ATTR_OFLAGS).0,
                fd: fd.as_raw_fd(),
                oflags: flags.bits(),
            },
        }
    }
}

struct XrcdInner {
    xrcd: NonNull<sys::ibv_xrcd>,
    ctx: Context,
}

// SAFETY: XRCD verbs are thread-safe in libibverbs; the handle is only
// passed to them.
unsafe impl Send for XrcdInner {}
// SAFETY: as above.
unsafe impl Sync for XrcdInner {}

impl Drop for XrcdInner {
    fn drop(&mut self) {
        // SAFETY: last handle: every XRC SRQ and receive queue pair of the
        // domain holds a clone, so all of them are gone.
        let rc = unsafe { sys::ibv_close_xrcd(self.xrcd.as_ptr()) };
        if rc != 0 {
            // The domain lives on: keep the context it needs.
            std::mem::forget(self.ctx.clone());
        }
    }
}

/// An XRC domain (`struct ibv_xrcd`), from [`Context::open_xrcd`].
///
/// # References
/// `ibv_open_xrcd(3)`
#[derive(Clone)]
pub struct XrcDomain {
    inner: Arc<XrcdInner>,
}

impl std::fmt::Debug for XrcDomain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XrcDomain").finish_non_exhaustive()
    }
}

/// Why `verb` cannot run on a device whose attributes say `has_xrc`.
fn xrc_refusal(has_xrc: bool, verb: &'static str) -> Option<Error> {
    (!has_xrc).then_some(Error::DeviceLacks {
        verb,
        capability: "XRC (device_cap_flags lacks IBV_DEVICE_XRC)",
    })
}

/// `EOPNOTSUPP` from a provider without XRC is the same refusal.
fn provider_refusal(e: Error, verb: &'static str) -> Error {
    match e.raw_os_error() {
        Some(libc::EOPNOTSUPP | libc::ENOSYS) => Error::DeviceLacks {
            verb,
            capability: "XRC (the provider returned EOPNOTSUPP)",
        },
        _ => e,
    }
}

impl Context {
    /// Opens an XRC domain (`ibv_open_xrcd`): private by default, or shared
    /// through a file ([`XrcdOptions::file`]).
    ///
    /// # Errors
    /// - [`Error::DeviceLacks`] naming `ibv_open_xrcd` when the device
    ///   lacks XRC (`IBV_DEVICE_XRC`, checked before the verb; rxe lacks
    ///   it) or the provider answers `EOPNOTSUPP`;
    /// - [`Error::Verb`] naming `ibv_open_xrcd` (`ENOENT` for a file with no
    ///   domain yet and no `CREATE`, `EEXIST` with `EXCLUSIVE`) or
    ///   `ibv_query_device_ex`.
    ///
    /// # References
    /// `ibv_open_xrcd(3)`
    #[doc(alias = "ibv_open_xrcd")]
    pub fn open_xrcd(&self, options: XrcdOptions<'_>) -> Result<XrcDomain> {
        let has = self.query_device_ex()?.supports(Feature::Xrc);
        if let Some(e) = xrc_refusal(has, "ibv_open_xrcd") {
            return Err(e);
        }
        let mut attr = options.raw();
        // SAFETY: live context; `attr` valid for the call (the fd is
        // borrowed for it); closed in XrcdInner's Drop.
        let xrcd = unsafe { sys::ibv_open_xrcd(self.as_ptr(), &mut attr) };
        let xrcd =
            ret_ptr("ibv_open_xrcd", xrcd).map_err(|e| provider_refusal(e, "ibv_open_xrcd"))?;
        Ok(XrcDomain {
            inner: Arc::new(XrcdInner {
                xrcd,
                ctx: self.clone(),
            }),
        })
    }
}

/// Refuses an XRC SRQ whose PD or CQ belongs to another device than its
/// domain.
pub(crate) fn check_same_context(
    xrcd: &XrcDomain,
    pd: &ProtectionDomain,
    cq: &CompletionQueue,
) -> Result<()> {
    let ctx = &xrcd.inner.ctx.inner;
    if !Arc::ptr_eq(&pd.context().inner, ctx) {
        return Err(Error::ForeignContext {
            what: "protection domain",
        });
    }
    if !Arc::ptr_eq(&cq.context().inner, ctx) {
        return Err(Error::ForeignContext {
            what: "completion queue",
        });
    }
    Ok(())
}

impl XrcDomain {
    /// The raw XRCD pointer, valid while `self` lives.
    pub fn as_ptr(&self) -> *mut sys::ibv_xrcd {
        self.inner.xrcd.as_ptr()
    }

    /// The device context.
    pub fn context(&self) -> &Context {
        &self.inner.ctx
    }

    /// Creates an XRC receive queue pair in this domain
    /// (`ibv_create_qp_ex` with `IBV_QPT_XRC_RECV`), in RESET. It has no
    /// queues of its own: messages it receives land in the XRC SRQ each
    /// names. Give its [`XrcRecvQueuePair::qp_num`] to the sender and
    /// move it to RTR with [`XrcRecvQueuePair::modify`].
    ///
    /// # Errors
    /// [`Error::Verb`] naming `ibv_create_qp_ex`.
    ///
    /// # References
    /// `ibv_create_qp_ex(3)`
    #[doc(alias = "ibv_create_qp_ex")]
    #[doc(alias = "IBV_QPT_XRC_RECV")]
    pub fn create_recv_qp(&self) -> Result<XrcRecvQueuePair> {
        let mut attr = sys::ibv_qp_init_attr_ex {
            qp_type: sys::IBV_QPT_XRC_RECV,
            comp_mask: sys::ibv_qp_init_attr_mask::IBV_QP_INIT_ATTR_XRCD.0,
            xrcd: self.as_ptr(),
            ..Default::default()
        };
        // SAFETY: live context and XRCD (kept open by the handle); `attr`
        // valid; destroyed in XrcQpInner's Drop.
        let qp = unsafe { sys::ibv_create_qp_ex(self.context().as_ptr(), &mut attr) };
        let qp =
            ret_ptr("ibv_create_qp_ex", qp).map_err(|e| provider_refusal(e, "ibv_create_qp_ex"))?;
        Ok(self.recv_qp(qp))
    }

    /// Opens the XRC receive queue pair `qp_num` that another process (or
    /// this one) created in this shared domain (`ibv_open_qp`).
    ///
    /// # Errors
    /// [`Error::Verb`] naming `ibv_open_qp` (`EINVAL` when no such queue
    /// pair is in the domain).
    ///
    /// # References
    /// `ibv_open_qp(3)`
    #[doc(alias = "ibv_open_qp")]
    pub fn open_qp(&self, qp_num: QpNumber) -> Result<XrcRecvQueuePair> {
        use sys::ibv_qp_open_attr_mask as M;
        let mut attr = sys::ibv_qp_open_attr {
            comp_mask: (M::IBV_QP_OPEN_ATTR_NUM
                | M::IBV_QP_OPEN_ATTR_XRCD
                | M::IBV_QP_OPEN_ATTR_TYPE)
                .0,
            qp_num: qp_num.0,
            xrcd: self.as_ptr(),
            qp_context: std::ptr::null_mut(),
            qp_type: sys::IBV_QPT_XRC_RECV,
        };
        // SAFETY: live context and XRCD; `attr` valid; released in
        // XrcQpInner's Drop (ibv_destroy_qp closes an opened QP).
        let qp = unsafe { sys::ibv_open_qp(self.context().as_ptr(), &mut attr) };
        let qp = ret_ptr("ibv_open_qp", qp).map_err(|e| provider_refusal(e, "ibv_open_qp"))?;
        Ok(self.recv_qp(qp))
    }

    fn recv_qp(&self, qp: NonNull<sys::ibv_qp>) -> XrcRecvQueuePair {
        XrcRecvQueuePair {
            inner: Arc::new(XrcQpInner {
                qp,
                _xrcd: self.clone(),
            }),
        }
    }
}

struct XrcQpInner {
    qp: NonNull<sys::ibv_qp>,
    _xrcd: XrcDomain,
}

// SAFETY: QP verbs are thread-safe in libibverbs; the QP has no queues
// and holds no memory.
unsafe impl Send for XrcQpInner {}
// SAFETY: as above.
unsafe impl Sync for XrcQpInner {}

impl Drop for XrcQpInner {
    fn drop(&mut self) {
        // SAFETY: last handle. The QP owns no buffers (they are the XRC
        // SRQs'), so a failure only leaks it, with its domain.
        let rc = unsafe { sys::ibv_destroy_qp(self.qp.as_ptr()) };
        if rc != 0 {
            std::mem::forget(self._xrcd.clone());
        }
    }
}

/// An XRC receive queue pair, created ([`XrcDomain::create_recv_qp`]) or
/// opened ([`XrcDomain::open_qp`]). It has no send or receive queue, so
/// nothing is posted to it and it holds no memory: what it receives lands
/// in XRC SRQs' buffers.
///
/// # References
/// `ibv_create_qp_ex(3)`, `ibv_open_qp(3)`
#[derive(Clone)]
pub struct XrcRecvQueuePair {
    inner: Arc<XrcQpInner>,
}

impl std::fmt::Debug for XrcRecvQueuePair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XrcRecvQueuePair")
            .field("qp_num", &self.qp_num())
            .finish()
    }
}

impl XrcRecvQueuePair {
    /// Its queue pair number: the sender's XRC send queue pair connects
    /// to it.
    pub fn qp_num(&self) -> QpNumber {
        // SAFETY: live QP; the number is immutable.
        QpNumber(unsafe { (*self.inner.qp.as_ptr()).qp_num })
    }

    /// The raw QP pointer, valid while `self` lives.
    pub fn as_ptr(&self) -> *mut sys::ibv_qp {
        self.inner.qp.as_ptr()
    }

    /// Modifies the queue pair (`ibv_modify_qp`): RESET → INIT → RTR, as a
    /// responder. Sound with any attributes: the queue pair holds no
    /// memory (the device checks the transitions).
    ///
    /// # Errors
    /// [`Error::Verb`] naming `ibv_modify_qp`.
    ///
    /// # References
    /// `ibv_modify_qp(3)`
    #[doc(alias = "ibv_modify_qp")]
    pub fn modify(&self, attr: &QpAttr) -> Result<()> {
        let mut raw = *attr.as_raw();
        // SAFETY: live QP; `raw` valid for the call.
        let rc = unsafe { sys::ibv_modify_qp(self.as_ptr(), &mut raw, attr.mask().0 as i32) };
        ret_errno("ibv_modify_qp", rc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusal_names_the_verb_and_the_capability() {
        match xrc_refusal(false, "ibv_open_xrcd") {
            Some(Error::DeviceLacks { verb, capability }) => {
                assert_eq!(verb, "ibv_open_xrcd");
                assert!(capability.contains("IBV_DEVICE_XRC"));
            }
            other => panic!("{other:?}"),
        }
        assert!(xrc_refusal(true, "ibv_open_xrcd").is_none());
        let e = provider_refusal(
            Error::Verb {
                verb: "ibv_open_xrcd",
                io: std::io::Error::from_raw_os_error(libc::EOPNOTSUPP),
            },
            "ibv_open_xrcd",
        );
        assert!(matches!(
            e,
            Error::DeviceLacks {
                verb: "ibv_open_xrcd",
                ..
            }
        ));
    }

    #[test]
    fn options_say_private_or_file() {
        let private = XrcdOptions::new().raw();
        assert_eq!((private.fd, private.oflags), (-1, libc::O_CREAT));
        let f = std::fs::File::open("/").unwrap();
        use std::os::fd::AsFd;
        let shared = XrcdOptions::new()
            .file(f.as_fd(), XrcdOpenFlags::CREATE | XrcdOpenFlags::EXCLUSIVE)
            .raw();
        assert_eq!(shared.fd, f.as_raw_fd());
        assert_eq!(shared.oflags, libc::O_CREAT | libc::O_EXCL);
        assert_ne!(shared.comp_mask, 0);
    }
}
