//! UD over rdma_cm (UDP and IPoIB port spaces): connect and accept are a
//! SIDR lookup. The active side's `connect` asks the passive side's id for
//! its queue pair number and Q_Key; `accept` answers with them, and the
//! active side's `Established` event carries them with the address vector
//! to the peer ([`CmEvent::ud_param`](super::CmEvent::ud_param)). No
//! connection exists afterwards: the queue pairs stay ordinary UD queue
//! pairs in RTS, and nothing here gives the device memory.

use rdma_verbs_sys as sys;

use super::cm_id::{move_qp, neg_errno, CmId, ConnParam};
use crate::error::{Error, Result};
use crate::qp::queue_pair::{QpAttr, QueuePair};
use crate::types::QpState;

/// SIDR request private data (`rdma_connect(3)`, UDP port space).
const UD_CONNECT_PRIVATE: usize = 180;
/// SIDR reply private data (`rdma_accept(3)`, UDP port space).
const UD_ACCEPT_PRIVATE: usize = 136;

impl CmId {
    /// Moves the UD `qp` on to RTS, from wherever it is on the way: INIT
    /// with the port, P_Key and Q_Key rdma_cm chose for this id, RTR, RTS
    /// with send PSN 0 (what `rdma_create_qp` does for librdmacm's UD QPs).
    pub(super) fn ready_ud(&self, qp: &QueuePair) -> Result<()> {
        let mut state = qp.state()?;
        if state == QpState::Reset {
            // SAFETY: live id (`self`).
            unsafe { move_qp(self.id(), qp, QpState::Init)? };
            state = QpState::Init;
        }
        if state == QpState::Init {
            qp.modify(&QpAttr::new().qp_state(QpState::Rtr))?;
            state = QpState::Rtr;
        }
        if state == QpState::Rtr {
            qp.modify(&QpAttr::new().qp_state(QpState::Rts).sq_psn(0))?;
        }
        Ok(())
    }

    /// [`CmId::connect`] on a UD id (`sync`: a synchronous one, refused).
    pub(super) fn connect_ud(&self, qp: &QueuePair, param: &ConnParam, sync: bool) -> Result<()> {
        if sync {
            return Err(Error::Unsupported(
                "a UD connect on a synchronous rdma_cm id (the peer's UdParam comes only with an event)",
            ));
        }
        let mut raw = param.raw(qp.qp_num().0, UD_CONNECT_PRIVATE)?;
        self.ready_ud(qp)?;
        // SAFETY: live id with a resolved route; `raw` (and the private data
        // it points to) outlive the call.
        let rc = unsafe { sys::rdma_connect(self.id(), &mut raw) };
        neg_errno("rdma_connect", rc)
    }

    /// [`CmId::accept`] on a UD id.
    pub(super) fn accept_ud(&self, qp: &QueuePair, param: &ConnParam) -> Result<()> {
        let mut raw = param.raw(qp.qp_num().0, UD_ACCEPT_PRIVATE)?;
        self.ready_ud(qp)?;
        // SAFETY: live request id; `raw` outlives the call.
        let rc = unsafe { sys::rdma_accept(self.id(), &mut raw) };
        neg_errno("rdma_accept", rc)
    }
}
