//! Creating queue pairs.

use std::sync::Arc;

use rdma_verbs_sys as sys;

use crate::error::{ret_ptr, Error, Result};

use crate::cq::completion_queue::CompletionQueue;
use crate::memory::protection_domain::ProtectionDomain;
use crate::qp::queue_pair::{QpCaps, QueuePair};
use crate::qp::shared_receive_queue::SharedReceiveQueue;
use crate::types::{QpType, SendOpFlags};

/// Builder for a [`QueuePair`]: required parts in [`ProtectionDomain::create_qp`],
/// optional ones as setters named after the `ibv_qp_init_attr` fields.
///
/// # References
/// `ibv_create_qp(3)`
#[derive(Debug)]
#[must_use]
pub struct QueuePairBuilder<'a> {
    pd: &'a ProtectionDomain,
    qp_type: QpType,
    send_cq: &'a CompletionQueue,
    recv_cq: &'a CompletionQueue,
    srq: Option<&'a SharedReceiveQueue>,
    cap: sys::ibv_qp_cap,
    sq_sig_all: bool,
    send_ops: SendOpFlags,
}

impl<'a> QueuePairBuilder<'a> {
    /// Send queue depth (default 64).
    pub fn max_send_wr(mut self, n: u32) -> Self {
        self.cap.max_send_wr = n;
        self
    }
    /// Receive queue depth (default 64; ignored with an SRQ).
    pub fn max_recv_wr(mut self, n: u32) -> Self {
        self.cap.max_recv_wr = n;
        self
    }
    /// Scatter/gather entries per send request (default 1).
    pub fn max_send_sge(mut self, n: u32) -> Self {
        self.cap.max_send_sge = n;
        self
    }
    /// Scatter/gather entries per receive request (default 1).
    pub fn max_recv_sge(mut self, n: u32) -> Self {
        self.cap.max_recv_sge = n;
        self
    }
    /// Largest inline send in bytes (default 0).
    pub fn max_inline_data(mut self, n: u32) -> Self {
        self.cap.max_inline_data = n;
        self
    }
    /// Receive through a shared receive queue.
    pub fn srq(mut self, srq: &'a SharedReceiveQueue) -> Self {
        self.srq = Some(srq);
        self
    }
    /// Signal every send request, whatever its own flag says.
    pub fn sq_sig_all(mut self, on: bool) -> Self {
        self.sq_sig_all = on;
        self
    }
    /// Creates the QP with `ibv_create_qp_ex` and these `ibv_wr_*`
    /// operations (`send_ops_flags`): its [`SendQueue`](crate::SendQueue) then posts
    /// through `ibv_wr_start` … `ibv_wr_complete` (the only way to atomic
    /// write and flush) and refuses operations not listed. Empty (the
    /// default) creates a classic QP, posted to with `ibv_post_send`.
    #[doc(alias = "ibv_create_qp_ex")]
    pub fn send_ops(mut self, ops: SendOpFlags) -> Self {
        self.send_ops = ops;
        self
    }

    /// Creates the queue pair (in the RESET state).
    ///
    /// Each completion queue must have room for a completion of every
    /// request the queues reporting to it can hold at once: the send CQ for
    /// the send queue depth, the receive CQ for the receive queue depth (or
    /// the SRQ's, counted once per CQ however many queue pairs share it),
    /// plus the depths of the queues of existing queue pairs (and SRQs)
    /// reporting there — the depths asked for, as a C program sizes its
    /// CQs. The device may grant deeper queues ([`QueuePair::caps`]); the
    /// safe posting path keeps at most the asked depths outstanding
    /// ([`QueuePair::send_capacity`]), but prepared requests can fill the
    /// granted depth and so overrun a CQ sized to the request. An overrun
    /// CQ loses completions, and with them the buffers of their requests.
    ///
    /// # Errors
    /// [`Error::ForeignContext`] when a CQ belongs to another device,
    /// [`Error::ForeignProtectionDomain`] when the SRQ belongs to another
    /// PD; [`Error::Unsupported`] for transport types this API
    /// does not drive (an XRC send queue pair, [`QpType::XrcSend`], is
    /// driven: it has no receive queue, and each request names the remote
    /// XRC SRQ, [`SendRequest::xrc_srqn`](crate::SendRequest::xrc_srqn));
    /// [`Error::WrongQpType`] for an XRC SRQ, or any SRQ on an XRC send
    /// queue pair; [`Error::DeviceLacks`] naming the create verb for an XRC
    /// send queue pair on a device without XRC (checked before the verb); [`Error::Verb`] naming `ibv_create_qp` (e.g. `EINVAL`
    /// when a capacity exceeds the device's limits; the message names it);
    /// [`Error::CqTooSmall`] when a CQ cannot hold the queues reporting to
    /// it (the queue pair just created is destroyed again).
    #[doc(alias = "ibv_create_qp")]
    pub fn build(self) -> Result<QueuePair> {
        if !matches!(
            self.qp_type,
            QpType::Rc | QpType::Uc | QpType::Ud | QpType::XrcSend
        ) {
            return Err(Error::Unsupported(
                "queue pair types other than RC, UC, UD and XRC send (an XRC receive \
                 queue pair is XrcDomain::create_recv_qp)",
            ));
        }
        if self.send_ops.contains(SendOpFlags::FLUSH) {
            crate::error::require_release("ibv_wr_flush", sys::FLUSH_RELEASE)?;
        }
        let xrc_send = self.qp_type == QpType::XrcSend;
        if xrc_send
            && !self
                .pd
                .context()
                .query_device_ex()?
                .supports(crate::device::capabilities::Feature::Xrc)
        {
            return Err(Error::DeviceLacks {
                verb: if self.send_ops.is_empty() {
                    "ibv_create_qp"
                } else {
                    "ibv_create_qp_ex"
                },
                capability: "XRC (device_cap_flags lacks IBV_DEVICE_XRC)",
            });
        }
        if let Some(srq) = self.srq {
            // An XRC SRQ serves the XRC receive queue pairs of its domain
            // only; an XRC send queue pair receives nothing at all.
            if xrc_send || srq.xrc_srq_num().is_some() {
                return Err(Error::WrongQpType {
                    what: "a shared receive queue (XRC SRQs serve XRC receive queue pairs; \
                           XRC send queue pairs receive nothing)",
                    qp_type: self.qp_type,
                });
            }
        }
        let ctx = &self.pd.inner.ctx.inner;
        for cq in [self.send_cq, self.recv_cq] {
            if !Arc::ptr_eq(&cq.context().inner, ctx) {
                return Err(Error::ForeignContext {
                    what: "completion queue",
                });
            }
        }
        if let Some(srq) = self.srq {
            if !Arc::ptr_eq(&srq.pd().inner, &self.pd.inner) {
                return Err(Error::ForeignProtectionDomain {
                    what: "shared receive queue",
                });
            }
        }
        let mut cap = self.cap;
        if self.srq.is_some() || xrc_send {
            cap.max_recv_wr = 0;
            cap.max_recv_sge = 0;
        }
        let (qp, qpx, granted) = if self.send_ops.is_empty() {
            let mut attr = sys::ibv_qp_init_attr {
                qp_context: std::ptr::null_mut(),
                send_cq: self.send_cq.as_ptr(),
                recv_cq: self.recv_cq.as_ptr(),
                srq: self.srq.map_or(std::ptr::null_mut(), |s| s.as_ptr()),
                cap,
                qp_type: self.qp_type.as_raw(),
                sq_sig_all: i32::from(self.sq_sig_all),
            };
            // SAFETY: live PD, CQs and SRQ (kept alive by the QueuePair);
            // `attr` is valid; the QP is destroyed by QpInner.
            let qp = unsafe { sys::ibv_create_qp(self.pd.as_ptr(), &mut attr) };
            let qp = ret_ptr("ibv_create_qp", qp).map_err(|e| e.with_hint(self.caps_hint(&cap)))?;
            (qp, None, attr.cap)
        } else {
            let mut attr = sys::ibv_qp_init_attr_ex {
                send_cq: self.send_cq.as_ptr(),
                recv_cq: self.recv_cq.as_ptr(),
                srq: self.srq.map_or(std::ptr::null_mut(), |s| s.as_ptr()),
                cap,
                qp_type: self.qp_type.as_raw(),
                sq_sig_all: i32::from(self.sq_sig_all),
                comp_mask: (sys::ibv_qp_init_attr_mask::IBV_QP_INIT_ATTR_PD
                    | sys::ibv_qp_init_attr_mask::IBV_QP_INIT_ATTR_SEND_OPS_FLAGS)
                    .0,
                pd: self.pd.as_ptr(),
                send_ops_flags: self.send_ops.bits(),
                ..Default::default()
            };
            // SAFETY: live context, PD, CQs and SRQ (kept alive by the
            // QueuePair); `attr` is valid; the QP is destroyed by QpInner.
            let qp = unsafe { sys::ibv_create_qp_ex(self.pd.context().as_ptr(), &mut attr) };
            let qp = ret_ptr("ibv_create_qp_ex", qp).map_err(|e| {
                let hint = if e.raw_os_error() == Some(libc::EOPNOTSUPP) {
                    Some(format!(
                        "the provider does not offer send_ops {:?} on {:?} queue pairs",
                        self.send_ops, self.qp_type
                    ))
                } else {
                    self.caps_hint(&cap)
                };
                e.with_hint(hint)
            })?;
            // SAFETY: created with IBV_QP_INIT_ATTR_SEND_OPS_FLAGS, so the
            // QP is embedded in an `ibv_qp_ex` (ibv_create_qp_ex(3)).
            let qpx = std::ptr::NonNull::new(unsafe { sys::ibv_qp_to_qp_ex(qp.as_ptr()) });
            if qpx.is_none() {
                // SAFETY: just created, never shared.
                unsafe { sys::ibv_destroy_qp(qp.as_ptr()) };
                return Err(Error::Unsupported(
                    "an extended queue pair without its ibv_qp_ex (ibv_qp_to_qp_ex returned NULL)",
                ));
            }
            (qp, qpx.map(|q| (q, self.send_ops)), attr.cap)
        };
        // The create verbs write the actual capacities back into `cap`.
        let mut caps = QpCaps::from_raw(&granted);
        // Never account for more than was granted, nor less than asked
        // when the provider reports 0 for an unchanged field.
        caps.max_send_wr = caps.max_send_wr.max(cap.max_send_wr.min(1));
        QueuePair::from_created(
            qp,
            self.pd.clone(),
            self.send_cq.clone(),
            self.recv_cq.clone(),
            self.srq.cloned(),
            self.qp_type,
            caps,
            QpCaps::from_raw(&cap),
            self.sq_sig_all,
            qpx,
        )
    }
}

impl QueuePairBuilder<'_> {
    /// Which capacities exceed the device's limits, for the message of a
    /// failed `ibv_create_qp`. Error paths only: queries the device.
    fn caps_hint(&self, cap: &sys::ibv_qp_cap) -> Option<String> {
        let d = self.pd.context().query_device().ok()?;
        let mut over: Vec<String> = [
            ("max_send_wr", cap.max_send_wr, "max_qp_wr", d.max_qp_wr()),
            ("max_recv_wr", cap.max_recv_wr, "max_qp_wr", d.max_qp_wr()),
            ("max_send_sge", cap.max_send_sge, "max_sge", d.max_sge()),
            ("max_recv_sge", cap.max_recv_sge, "max_sge", d.max_sge()),
        ]
        .into_iter()
        .filter(|&(_, v, _, limit)| v > limit)
        .map(|(name, v, lname, limit)| format!("{name} {v} exceeds the device's {lname} {limit}"))
        .collect();
        if over.is_empty() && cap.max_inline_data > 0 {
            over.push(format!(
                "max_inline_data {} may exceed the device's inline limit (which \
                 ibv_query_device does not report)",
                cap.max_inline_data
            ));
        }
        (!over.is_empty()).then(|| over.join("; "))
    }
}

impl ProtectionDomain {
    /// Starts building a queue pair of `qp_type` on this PD with its send
    /// and receive completion queues (which may be the same): options are
    /// the builder's setters, and [`build`](QueuePairBuilder::build)
    /// creates it.
    ///
    /// # References
    /// `ibv_create_qp(3)`
    pub fn create_qp<'a>(
        &'a self,
        qp_type: QpType,
        send_cq: &'a CompletionQueue,
        recv_cq: &'a CompletionQueue,
    ) -> QueuePairBuilder<'a> {
        QueuePairBuilder {
            pd: self,
            qp_type,
            send_cq,
            recv_cq,
            srq: None,
            cap: sys::ibv_qp_cap {
                max_send_wr: 64,
                max_recv_wr: 64,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            sq_sig_all: false,
            send_ops: SendOpFlags::empty(),
        }
    }
}
