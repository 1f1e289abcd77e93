//! UD multicast: attaching a queue pair to a multicast group
//! (`ibv_attach_mcast`/`ibv_detach_mcast`) so it receives the datagrams
//! sent to the group.
//!
//! The queue pair remembers the groups it attached (a short list behind its
//! own lock, touched only by attach, detach and [`QueuePair::mcast_groups`],
//! never by the data path), for two reasons:
//!
//! * a detach of a group this queue pair never attached is refused with
//!   [`Error::MulticastMembership`] before the verb (providers answer with a
//!   bare `EINVAL`, or nothing at all), and a second attach of an attached
//!   group too (rxe accepts it silently, so one detach would undo both);
//! * [`CmId::leave_multicast`](crate::cm::CmId::leave_multicast) detaches
//!   the queue pair a join attached through the same record.
//!
//! A dropped queue pair does *not* detach its groups one by one: the kernel
//! does it before destroying a user queue pair (`uverbs_free_qp` detaches
//! every group attached through the QP's uverbs object, on every device),
//! so `ibv_destroy_qp` alone leaves no membership behind, and a drop costs
//! no extra system call per group. Nothing here gives the device memory to
//! write: a multicast datagram lands only in receive buffers posted the
//! ordinary way (DESIGN.md, "Posting moves the buffer").

use rdma_verbs_sys as sys;

use super::QueuePair;
use crate::error::{ret_errno, Error, Result};
use crate::types::{Gid, QpType};

impl QueuePair {
    /// Attaches this UD queue pair to the multicast group `gid` (and `lid`:
    /// the group's LID on InfiniBand, 0 on RoCE), so datagrams sent to the
    /// group are delivered to its receive queue too. On RoCE the GID is the
    /// group's IP address: `::ffff:239.1.1.1` for IPv4 (`Gid::from(Ipv4Addr)`),
    /// or an `ff00::/8` IPv6 address. The fabric side (IGMP/MLD on RoCE, a
    /// subnet administrator join on InfiniBand) is not done here: rdma_cm's
    /// [`join_multicast`](crate::cm::CmId::join_multicast) does both.
    ///
    /// Datagrams carry a 40-byte GRH in front of the payload, as every UD
    /// receive; the group's Q_Key must match the queue pair's.
    ///
    /// # Errors
    /// [`Error::WrongQpType`] (naming `ibv_attach_mcast`) for a queue pair
    /// that is not UD, refused before the verb (IBA: only UD queue pairs
    /// join multicast groups); [`Error::MulticastMembership`] when this
    /// queue pair already attached the group; [`Error::Verb`] naming
    /// `ibv_attach_mcast` (`EINVAL` for a GID that is not a multicast
    /// address, `ENOMEM` past the device's `max_mcast_qp_attach`).
    ///
    /// # References
    /// `ibv_attach_mcast(3)`
    #[doc(alias = "ibv_attach_mcast")]
    pub fn attach_mcast(&self, gid: &Gid, lid: u16) -> Result<()> {
        const VERB: &str = "ibv_attach_mcast";
        self.check_ud(VERB)?;
        let mut groups = self.inner.mcast.lock();
        if groups.contains(&(*gid, lid)) {
            return Err(Error::MulticastMembership {
                verb: VERB,
                gid: *gid,
                lid,
                attached: true,
            });
        }
        let raw = gid.to_raw();
        // The list's lock is held across the verb: attach and detach of one
        // queue pair run one at a time, so the list is what the device has.
        // SAFETY: live QP; `raw` is valid for reads during the call.
        let rc = unsafe { sys::ibv_attach_mcast(self.as_ptr(), &raw, lid) };
        ret_errno(VERB, rc).map_err(|e| e.with_hint(Some(format!("group {gid}, LID {lid:#x}"))))?;
        groups.push((*gid, lid));
        Ok(())
    }

    /// Detaches this queue pair from a multicast group it attached with
    /// [`attach_mcast`](Self::attach_mcast) (same `gid` and `lid`). Datagrams
    /// already delivered to its receive queue stay there.
    ///
    /// # Errors
    /// [`Error::WrongQpType`] (naming `ibv_detach_mcast`) for a queue pair
    /// that is not UD; [`Error::MulticastMembership`] for a group this queue
    /// pair has not attached (never, or already detached), refused before
    /// the verb; [`Error::Verb`] naming `ibv_detach_mcast`.
    ///
    /// # References
    /// `ibv_detach_mcast(3)`
    #[doc(alias = "ibv_detach_mcast")]
    pub fn detach_mcast(&self, gid: &Gid, lid: u16) -> Result<()> {
        const VERB: &str = "ibv_detach_mcast";
        self.check_ud(VERB)?;
        let mut groups = self.inner.mcast.lock();
        let Some(at) = groups.iter().position(|g| *g == (*gid, lid)) else {
            return Err(Error::MulticastMembership {
                verb: VERB,
                gid: *gid,
                lid,
                attached: false,
            });
        };
        let raw = gid.to_raw();
        // SAFETY: live QP; `raw` is valid for reads during the call.
        let rc = unsafe { sys::ibv_detach_mcast(self.as_ptr(), &raw, lid) };
        ret_errno(VERB, rc).map_err(|e| e.with_hint(Some(format!("group {gid}, LID {lid:#x}"))))?;
        groups.swap_remove(at);
        Ok(())
    }

    /// The multicast groups (GID, LID) this queue pair is attached to
    /// through [`attach_mcast`](Self::attach_mcast) or an rdma_cm join, in
    /// no particular order. Attaches made with the raw pointer are not seen.
    pub fn mcast_groups(&self) -> Vec<(Gid, u16)> {
        self.inner.mcast.lock().clone()
    }

    fn check_ud(&self, verb: &'static str) -> Result<()> {
        if self.qp_type() == QpType::Ud {
            Ok(())
        } else {
            Err(Error::WrongQpType {
                what: verb,
                qp_type: self.qp_type(),
            })
        }
    }
}
