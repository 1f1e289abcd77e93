//! Shared receive queues.

use std::mem::MaybeUninit;
use std::ptr::NonNull;
use std::sync::Arc;

use rdma_verbs_sys as sys;

use crate::cq::completion_queue::CompletionQueue;
use crate::device::event_routing::{AsyncEventReceiver, Kind, Registration, SrqId};
#[cfg(doc)]
use crate::error::Error;
use crate::error::{ret_errno, ret_ptr, Result};
use crate::inflight::Ring;
use crate::memory::protection_domain::ProtectionDomain;
use crate::qp::queue_pair::{release_after_destroy, RingCell};
use crate::qp::xrc_domain::XrcDomain;

pub(crate) struct SrqInner {
    srq: NonNull<sys::ibv_srq>,
    pd: ProtectionDomain,
    /// Its slots in the in-flight store, and its posting handle's claim.
    ring: RingCell,
    /// The provider's `post_srq_recv`, read once at creation.
    post_fn: crate::qp::queue_pair::RecvPostFn,
    max_sge: u32,
    /// The depth asked for, which a CQ behind the SRQ must hold.
    asked_wr: u32,
    cqs: std::sync::Mutex<Vec<CompletionQueue>>,
    /// Its id for async events (event_routing.rs): registered at creation,
    /// leaves before the destroy.
    events: Registration,
    /// An XRC SRQ's domain (kept open until the SRQ is destroyed) and its
    /// SRQ number (`ibv_get_srq_num`), which senders name.
    xrc: Option<(XrcDomain, u32)>,
}

// SAFETY: SRQ verbs are thread-safe in libibverbs; the table is behind a Mutex.
unsafe impl Send for SrqInner {}
// SAFETY: as above.
unsafe impl Sync for SrqInner {}

impl Drop for SrqInner {
    fn drop(&mut self) {
        // Before the destroy: the address may be reused once it returns.
        self.events.leave();
        // SAFETY: last reference: every QP attached to the SRQ holds a clone,
        // so all of them are destroyed, and no handle exists (each holds
        // the SRQ). Errors cannot be reported from Drop.
        let rc = unsafe { sys::ibv_destroy_srq(self.srq.as_ptr()) };
        let cqs = std::mem::take(&mut *self.cqs.lock().unwrap_or_else(|p| p.into_inner()));
        let ring = self.ring.get_mut();
        let id = ring.id();
        let (payloads, queued) = ring.teardown(false);
        // Any of the outstanding receives may have completed into any of
        // the CQs: each is charged all of them until polled empty.
        for cq in cqs {
            cq.unregister(id, queued);
        }
        // Only once the SRQ is gone does the device no longer write its
        // buffers; if the destroy failed they are leaked, never freed, and
        // so are the ring's slots.
        release_after_destroy(rc == 0, payloads);
        if rc != 0 {
            self.ring.leak();
        }
    }
}

/// A shared receive queue (`struct ibv_srq`): one pool of receive buffers
/// for many queue pairs.
///
/// Receive completions of any attached QP hand back the SRQ's buffers.
/// Buffers still posted when the SRQ is destroyed are released after
/// `ibv_destroy_srq` succeeded, and leaked (kept allocated for good) if it
/// failed: the device may still own them then.
///
/// # References
/// `ibv_create_srq(3)`, `ibv_post_srq_recv(3)`
#[derive(Clone)]
pub struct SharedReceiveQueue {
    inner: Arc<SrqInner>,
}

/// Builder for a [`SharedReceiveQueue`], from [`ProtectionDomain::create_srq`].
#[derive(Debug)]
#[must_use]
pub struct SharedReceiveQueueBuilder<'a> {
    pd: &'a ProtectionDomain,
    max_wr: u32,
    max_sge: u32,
    srq_limit: u32,
    /// An XRC SRQ: its domain and the CQ its receive completions go to.
    xrc: Option<(&'a XrcDomain, &'a CompletionQueue)>,
}

impl SharedReceiveQueueBuilder<'_> {
    /// Scatter/gather entries per request (default 1).
    pub fn max_sge(mut self, n: u32) -> Self {
        self.max_sge = n;
        self
    }
    /// Limit that arms `IBV_EVENT_SRQ_LIMIT_REACHED` (default 0: off).
    pub fn srq_limit(mut self, n: u32) -> Self {
        self.srq_limit = n;
        self
    }
    /// Creates the SRQ.
    ///
    /// # Errors
    /// [`Error::Verb`] naming `ibv_create_srq` (`EINVAL` when a size
    /// exceeds the device's limits; the message names it); for an XRC SRQ
    /// ([`XrcDomain::create_srq`]): [`Error::ForeignContext`] for a PD or
    /// CQ of another device, [`Error::Verb`] naming `ibv_create_srq_ex` or
    /// `ibv_get_srq_num`, [`Error::CqTooSmall`] when its CQ cannot hold
    /// `max_wr` more completions.
    #[doc(alias = "ibv_create_srq")]
    #[doc(alias = "ibv_create_srq_ex")]
    pub fn build(self) -> Result<SharedReceiveQueue> {
        let mut attr = sys::ibv_srq_attr {
            max_wr: self.max_wr,
            max_sge: self.max_sge,
            srq_limit: self.srq_limit,
        };
        let (srq, verb) = match self.xrc {
            None => {
                let mut init = sys::ibv_srq_init_attr {
                    srq_context: std::ptr::null_mut(),
                    attr,
                };
                // SAFETY: live PD; `init` valid; destroyed in SrqInner's Drop.
                let srq = unsafe { sys::ibv_create_srq(self.pd.as_ptr(), &mut init) };
                attr = init.attr;
                (srq, "ibv_create_srq")
            }
            Some((xrcd, cq)) => {
                crate::qp::xrc_domain::check_same_context(xrcd, self.pd, cq)?;
                let mut init = sys::ibv_srq_init_attr_ex {
                    attr,
                    comp_mask: (sys::ibv_srq_init_attr_mask::IBV_SRQ_INIT_ATTR_TYPE
                        | sys::ibv_srq_init_attr_mask::IBV_SRQ_INIT_ATTR_PD
                        | sys::ibv_srq_init_attr_mask::IBV_SRQ_INIT_ATTR_XRCD
                        | sys::ibv_srq_init_attr_mask::IBV_SRQ_INIT_ATTR_CQ)
                        .0,
                    srq_type: sys::IBV_SRQT_XRC,
                    pd: self.pd.as_ptr(),
                    xrcd: xrcd.as_ptr(),
                    cq: cq.as_ptr(),
                    ..Default::default()
                };
                // SAFETY: live context, PD, XRCD and CQ (the SRQ keeps the
                // XRCD and, once attached, the CQ alive; the PD too);
                // `init` valid; destroyed in SrqInner's Drop.
                let srq = unsafe { sys::ibv_create_srq_ex(self.pd.context().as_ptr(), &mut init) };
                attr = init.attr;
                (srq, "ibv_create_srq_ex")
            }
        };
        let srq = ret_ptr(verb, srq).map_err(|e| {
            let hint = self.pd.context().query_device().ok().and_then(|d| {
                let over: Vec<String> = [
                    ("max_wr", self.max_wr, "max_srq_wr", d.max_srq_wr()),
                    ("max_sge", self.max_sge, "max_srq_sge", d.max_srq_sge()),
                ]
                .into_iter()
                .filter(|&(_, v, _, limit)| v > limit)
                .map(|(name, v, lname, limit)| {
                    format!("{name} {v} exceeds the device's {lname} {limit}")
                })
                .collect();
                (!over.is_empty()).then(|| over.join("; "))
            });
            e.with_hint(hint)
        })?;
        // `attr` now holds the actual sizes.
        let (max_wr, max_sge) = (attr.max_wr.max(1), attr.max_sge.max(1));
        let xrc = match self.xrc {
            None => None,
            Some((xrcd, _)) => {
                let mut num = 0u32;
                // SAFETY: a live XRC SRQ; `num` valid for writes.
                let rc = unsafe { sys::ibv_get_srq_num(srq.as_ptr(), &mut num) };
                if let Err(e) = ret_errno("ibv_get_srq_num", rc) {
                    // SAFETY: just created, nothing posted, never shared.
                    unsafe { sys::ibv_destroy_srq(srq.as_ptr()) };
                    return Err(e);
                }
                Some((xrcd.clone(), num))
            }
        };
        let ring = match Ring::new(max_wr) {
            Ok(r) => RingCell::new(r),
            Err(e) => {
                // SAFETY: just created, nothing posted, never shared.
                unsafe { sys::ibv_destroy_srq(srq.as_ptr()) };
                return Err(e);
            }
        };
        // SAFETY: a live SRQ points at its live context.
        let post_fn = unsafe { (*(*srq.as_ptr()).context).ops.post_srq_recv };
        // SAFETY: the same function type but for the queue's pointer type,
        // which the ABI does not see.
        let post_fn = unsafe {
            std::mem::transmute::<
                Option<
                    unsafe extern "C" fn(
                        *mut sys::ibv_srq,
                        *mut sys::ibv_recv_wr,
                        *mut *mut sys::ibv_recv_wr,
                    ) -> i32,
                >,
                Option<crate::qp::queue_pair::RecvPostFn>,
            >(post_fn)
        }
        .unwrap_or(missing_post_srq_recv);
        let built = SharedReceiveQueue {
            inner: Arc::new(SrqInner {
                srq,
                pd: self.pd.clone(),
                ring,
                post_fn,
                max_sge,
                asked_wr: self.max_wr.clamp(1, max_wr),
                cqs: std::sync::Mutex::new(Vec::new()),
                events: Registration::new(Kind::Srq, srq.as_ptr()),
                xrc,
            }),
        };
        if let Some((_, cq)) = self.xrc {
            // An XRC SRQ's completions go to its own CQ, whatever queue
            // pair the message came through: the table is found there.
            // On failure, dropping `built` destroys the SRQ (nothing posted).
            built.attach_cq(cq)?;
        }
        Ok(built)
    }
}

impl SharedReceiveQueue {
    /// Lets the SRQ's completions (through a queue pair using `cq` as its
    /// receive CQ) find their buffers; the depth asked for counts once per
    /// CQ.
    ///
    /// # Errors
    /// [`Error::CqTooSmall`]: nothing attached.
    pub(crate) fn attach_cq(&self, cq: &CompletionQueue) -> Result<()> {
        cq.register(self.inner.ring.id(), self.inner.asked_wr)?;
        let mut cqs = self.inner.cqs.lock().unwrap_or_else(|p| p.into_inner());
        if !cqs.iter().any(|c| Arc::ptr_eq(&c.inner, &cq.inner)) {
            cqs.push(cq.clone());
        }
        Ok(())
    }

    pub(crate) fn events(&self) -> &Registration {
        &self.inner.events
    }

    /// The SRQ number senders name to reach an XRC SRQ
    /// ([`SendRequest::xrc_srqn`](crate::SendRequest::xrc_srqn)), from
    /// `ibv_get_srq_num` at creation; `None` for an ordinary SRQ.
    ///
    /// # References
    /// `ibv_get_srq_num(3)`
    #[doc(alias = "ibv_get_srq_num")]
    pub fn xrc_srq_num(&self) -> Option<u32> {
        self.inner.xrc.as_ref().map(|(_, n)| *n)
    }

    /// The XRC domain of an XRC SRQ.
    pub fn xrc_domain(&self) -> Option<&XrcDomain> {
        self.inner.xrc.as_ref().map(|(d, _)| d)
    }

    /// The raw SRQ pointer, valid while `self` lives.
    pub fn as_ptr(&self) -> *mut sys::ibv_srq {
        self.inner.srq.as_ptr()
    }

    /// The protection domain.
    pub fn pd(&self) -> &ProtectionDomain {
        &self.inner.pd
    }

    /// The scatter/gather entries a receive may have.
    pub(crate) fn max_sge(&self) -> u32 {
        self.inner.max_sge
    }

    /// Capacity (actual).
    pub fn capacity(&self) -> u32 {
        self.inner.ring.depth()
    }

    /// Posted receive requests whose completions were not claimed yet (a
    /// snapshot).
    pub fn outstanding(&self) -> u32 {
        self.inner.ring.outstanding()
    }

    /// The ring and its handle's claim.
    pub(crate) fn ring_cell(&self) -> &RingCell {
        &self.inner.ring
    }

    /// The provider's `post_srq_recv`.
    pub(crate) fn post_fn(&self) -> crate::qp::queue_pair::RecvPostFn {
        self.inner.post_fn
    }

    /// Current attributes (`max_wr`, `max_sge`, `srq_limit`).
    ///
    /// # Errors
    /// [`Error::Verb`] naming `ibv_query_srq`.
    #[doc(alias = "ibv_query_srq")]
    pub fn query(&self) -> Result<sys::ibv_srq_attr> {
        let mut attr = MaybeUninit::<sys::ibv_srq_attr>::zeroed();
        // SAFETY: live SRQ; `attr` valid for writes.
        let rc = unsafe { sys::ibv_query_srq(self.as_ptr(), attr.as_mut_ptr()) };
        ret_errno("ibv_query_srq", rc)?;
        // SAFETY: zeroed then filled.
        Ok(unsafe { attr.assume_init() })
    }

    /// Arms the limit event: once fewer than `limit` receives are left
    /// posted, the device raises `IBV_EVENT_SRQ_LIMIT_REACHED` for this SRQ
    /// (routed to [`SharedReceiveQueue::async_events`] by
    /// [`Context::route_async_event`](crate::Context::route_async_event),
    /// with [`SharedReceiveQueue::id`]) and disarms the limit (it reads 0
    /// again); arm it again to hear of the next shortage. 0 disarms.
    ///
    /// # Errors
    /// [`Error::Verb`] naming `ibv_modify_srq` (`EINVAL` for a limit above
    /// the SRQ's capacity, or a device without SRQ limits).
    ///
    /// # References
    /// `ibv_modify_srq(3)`, `ibv_get_async_event(3)`
    #[doc(alias = "ibv_modify_srq")]
    #[doc(alias = "set_limit")]
    pub fn arm_limit(&self, limit: u32) -> Result<()> {
        let mut attr = sys::ibv_srq_attr {
            srq_limit: limit,
            ..Default::default()
        };
        // SAFETY: live SRQ; `attr` valid.
        let rc = unsafe {
            sys::ibv_modify_srq(
                self.as_ptr(),
                &mut attr,
                sys::ibv_srq_attr_mask::IBV_SRQ_LIMIT.0 as i32,
            )
        };
        ret_errno("ibv_modify_srq", rc)
    }
}

impl ProtectionDomain {
    /// Starts building a shared receive queue with room for `max_wr`
    /// receive requests: options are the builder's setters, and
    /// [`build`](SharedReceiveQueueBuilder::build) creates it.
    ///
    /// # References
    /// `ibv_create_srq(3)`
    pub fn create_srq(&self, max_wr: u32) -> SharedReceiveQueueBuilder<'_> {
        SharedReceiveQueueBuilder {
            pd: self,
            max_wr,
            max_sge: 1,
            srq_limit: 0,
            xrc: None,
        }
    }
}

impl XrcDomain {
    /// Starts building an XRC shared receive queue in this domain
    /// (`ibv_create_srq_ex` with `IBV_SRQT_XRC`): receives posted to it
    /// serve every XRC receive queue pair of the domain, and their
    /// completions go to `cq`. Posting, prepared receives, limits and
    /// teardown are those of every [`SharedReceiveQueue`] (DESIGN.md,
    /// "On-demand paging, XRC, re-registration").
    ///
    /// # References
    /// `ibv_create_srq_ex(3)`, `ibv_get_srq_num(3)`
    #[doc(alias = "ibv_create_srq_ex")]
    #[doc(alias = "IBV_SRQT_XRC")]
    pub fn create_srq<'a>(
        &'a self,
        pd: &'a ProtectionDomain,
        cq: &'a CompletionQueue,
        max_wr: u32,
    ) -> SharedReceiveQueueBuilder<'a> {
        SharedReceiveQueueBuilder {
            xrc: Some((self, cq)),
            ..pd.create_srq(max_wr)
        }
    }
}

impl std::fmt::Debug for SharedReceiveQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedReceiveQueue")
            .field("capacity", &self.capacity())
            .field("outstanding", &self.outstanding())
            .finish()
    }
}

/// What an SRQ's context without `post_srq_recv` gives (as
/// `ibv_post_srq_recv` does).
unsafe extern "C" fn missing_post_srq_recv(
    _: *mut std::ffi::c_void,
    _: *mut sys::ibv_recv_wr,
    _: *mut *mut sys::ibv_recv_wr,
) -> i32 {
    libc::EOPNOTSUPP
}

impl SharedReceiveQueue {
    /// This SRQ's identity in its asynchronous events
    /// ([`AsyncElement::Srq`](crate::device::AsyncElement::Srq)).
    pub fn id(&self) -> SrqId {
        crate::device::event_routing::srq_id(self.events().id())
    }

    /// Subscribes to this SRQ's asynchronous events (`SRQ_LIMIT_REACHED`,
    /// `SRQ_ERR`), as routed by [`Context::route_async_event`](crate::Context::route_async_event).
    ///
    /// # References
    /// `ibv_get_async_event(3)`, `ibv_modify_srq(3)`
    pub fn async_events(&self) -> AsyncEventReceiver {
        self.events().subscribe()
    }
}
