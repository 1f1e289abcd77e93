//! `rdma_create_qp`-style convenience: one call creates the queue pair of
//! an id's connection (or UD exchange) and makes it ready for
//! [`CmId::connect`]/[`CmId::accept`]. The queue pair is an ordinary
//! [`QueuePair`] the caller owns; librdmacm never learns of it (see
//! `cm_id.rs`), so no ownership moves to librdmacm and the safe data path
//! applies unchanged.

use super::cm_id::CmId;
use crate::cq::completion_queue::CompletionQueue;
use crate::error::{Error, Result};
use crate::memory::protection_domain::ProtectionDomain;
use crate::qp::queue_pair::{QueuePair, QueuePairBuilder};
use crate::types::QpType;

impl CmId {
    /// Creates the queue pair for this id on `pd` (of the id's
    /// [`context`](Self::context)) with `send_cq` and `recv_cq`, of the
    /// type the id's port space calls for — RC for TCP, UD for UDP and
    /// IPoIB — sized by `configure` (the builder's depths, SGEs, inline
    /// size, SRQ: `|b| b` for the defaults), and readies it: an RC queue
    /// pair is moved to INIT with rdma_cm's port, P_Key and access rights
    /// (as [`init_qp`](Self::init_qp)), a UD one on to RTS with the id's
    /// Q_Key (as [`activate_ud`](Self::activate_ud)). Receives can be
    /// posted at once; [`connect`](Self::connect) or
    /// [`accept`](Self::accept) does the rest.
    ///
    /// # Errors
    /// [`Error::Unsupported`] for an id not bound to a device yet (resolve
    /// or bind first); [`Error::ForeignContext`] for a `pd` or CQ of
    /// another context; as [`QueuePairBuilder::build`]; [`Error::Verb`]
    /// naming `rdma_init_qp_attr` or `ibv_modify_qp`.
    ///
    /// # References
    /// `rdma_create_qp(3)`
    #[doc(alias = "rdma_create_qp")]
    pub fn create_qp<'a>(
        &self,
        pd: &'a ProtectionDomain,
        send_cq: &'a CompletionQueue,
        recv_cq: &'a CompletionQueue,
        configure: impl FnOnce(QueuePairBuilder<'a>) -> QueuePairBuilder<'a>,
    ) -> Result<QueuePair> {
        let ctx = self.context().ok_or(Error::Unsupported(
            "CmId::create_qp before the id is bound to a device (resolve or bind first)",
        ))?;
        if pd.context().as_ptr() != ctx.as_ptr() {
            return Err(Error::ForeignContext {
                what: "protection domain",
            });
        }
        let qp_type = if self.is_ud() { QpType::Ud } else { QpType::Rc };
        let qp = configure(pd.create_qp(qp_type, send_cq, recv_cq)).build()?;
        if qp_type == QpType::Ud {
            self.ready_ud(&qp)?;
        } else {
            self.init_qp(&qp)?;
        }
        Ok(qp)
    }
}
