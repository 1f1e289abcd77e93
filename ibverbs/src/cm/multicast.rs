//! rdma_cm multicast: joining and leaving groups (`rdma_join_multicast_ex`,
//! `rdma_leave_multicast`) on an id of the UDP (or IPoIB) port space, and
//! the group's UD parameters the join event carries.
//!
//! librdmacm attaches and detaches only a queue pair it created itself
//! (`rdma_create_qp`); the queue pairs of this crate are ordinary
//! [`QueuePair`]s it never sees. So a join names the queue pair to attach:
//! it is recorded with the join (weakly: the queue pair's context keeps the
//! id alive, not the other way round), attached with
//! [`QueuePair::attach_mcast`] when [`EventChannel::get_event`](super::EventChannel::get_event) reads the
//! `MulticastJoin` event (the group's GID and LID are known only then), and
//! detached by [`CmId::leave_multicast`] before the verb, as librdmacm does
//! for its own.

use std::net::SocketAddr;
use std::sync::{Arc, Weak};

use rdma_verbs_sys as sys;

use super::cm_id::{neg_errno, to_sockaddr, CmId, IdShared};
use crate::address_handle::AddressVector;
use crate::error::{Error, Result};
use crate::qp::queue_pair::QpInner;
use crate::qp::queue_pair::{QpAttr, QueuePair};
use crate::types::Gid;
use crate::types::{QpNumber, QpState, QpType};

/// How to join a multicast group (`enum rdma_cm_mc_join_flags`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum JoinFlags {
    /// Send and receive (the default, and `rdma_join_multicast`'s).
    #[default]
    FullMember,
    /// Send only: the group is not forwarded to this port, and no queue
    /// pair is attached (`RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER`).
    SendOnlyFullMember,
}

impl JoinFlags {
    fn as_raw(self) -> u32 {
        match self {
            JoinFlags::FullMember => sys::RDMA_MC_JOIN_FLAG_FULLMEMBER,
            JoinFlags::SendOnlyFullMember => sys::RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER,
        }
    }
}

/// One join of an id, until it is left.
pub(crate) struct Join {
    /// What the join's events carry back in `param.ud.private_data`: a
    /// number, never dereferenced (unique in the process).
    key: usize,
    addr: SocketAddr,
    flags: JoinFlags,
    qp: Option<Weak<QpInner>>,
    /// The group the queue pair was attached to, once the join completed.
    attached: Option<(Gid, u16)>,
}

static NEXT_KEY: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(1);

/// The UD parameters of a multicast group (`struct rdma_ud_param`), from a
/// [`MulticastJoin`](super::CmEventType::MulticastJoin) event: what a
/// sender needs to address the group.
///
/// # References
/// `rdma_join_multicast(3)`, `rdma_get_cm_event(3)`
#[derive(Debug, Clone)]
pub struct UdParam {
    /// The remote queue pair number: `0xFFFFFF` (the multicast QPN) for a
    /// group.
    pub qp_num: QpNumber,
    /// The group's Q_Key.
    pub qkey: u32,
    /// The address vector of the group (GRH with the group's GID as
    /// destination on RoCE): create an address handle from it with
    /// [`ProtectionDomain::create_ah`](crate::ProtectionDomain::create_ah).
    pub address: AddressVector,
}

impl UdParam {
    pub(super) fn from_raw(raw: &sys::rdma_ud_param) -> UdParam {
        UdParam {
            qp_num: QpNumber(raw.qp_num),
            qkey: raw.qkey,
            address: AddressVector::from_raw(raw.ah_attr),
        }
    }

    /// The group's GID and LID (`ah_attr.grh.dgid`, `ah_attr.dlid`): what
    /// [`QueuePair::attach_mcast`] takes.
    pub fn group(&self) -> (Gid, u16) {
        (self.address.dgid(), self.address.as_raw().dlid)
    }
}

impl CmId {
    /// Moves `qp` (UD, created on [`CmId::context`], in RESET) to RTS with
    /// the port, P_Key and Q_Key rdma_cm chose for this id (UDP or IPoIB
    /// port space), as `rdma_create_qp` does for the queue pairs librdmacm
    /// creates: INIT with `rdma_init_qp_attr`'s attributes, RTR, then RTS
    /// with send PSN 0.
    ///
    /// # Errors
    /// [`Error::ForeignContext`] for a queue pair of another context,
    /// [`Error::WrongQpType`] for one that is not UD; [`Error::Verb`] naming
    /// `rdma_init_qp_attr` or `ibv_modify_qp`.
    ///
    /// # References
    /// `rdma_init_qp_attr(3)`, `rdma_create_qp(3)`
    #[doc(alias = "rdma_init_qp_attr")]
    pub fn activate_ud(&self, qp: &QueuePair) -> Result<()> {
        self.check_qp_of(qp, QpType::Ud, "CmId::activate_ud")?;
        // SAFETY: live id (`self`).
        unsafe { super::cm_id::move_qp(self.id(), qp, QpState::Init)? };
        qp.modify(&QpAttr::new().qp_state(QpState::Rtr))?;
        qp.modify(&QpAttr::new().qp_state(QpState::Rts).sq_psn(0))
    }

    /// Joins the multicast group `addr` (an IPv4 or IPv6 multicast address)
    /// as a full member. See [`join_multicast_ex`](Self::join_multicast_ex).
    ///
    /// # Errors
    /// As [`join_multicast_ex`](Self::join_multicast_ex).
    ///
    /// # References
    /// `rdma_join_multicast(3)`
    #[doc(alias = "rdma_join_multicast")]
    pub fn join_multicast(&self, addr: SocketAddr, qp: Option<&QueuePair>) -> Result<()> {
        self.join_multicast_ex(addr, qp, JoinFlags::FullMember)
    }

    /// Joins the multicast group `addr` with `flags`; the id must be bound
    /// to a device first (resolve an address, as `mckey` resolves the group's,
    /// or bind to a local one). Completes with a
    /// [`MulticastJoin`](super::CmEventType::MulticastJoin) event carrying the
    /// group's [`UdParam`] ([`CmEvent::ud_param`](super::CmEvent::ud_param)),
    /// or `MulticastError`.
    ///
    /// `qp` (UD, created on [`CmId::context`], with the id's Q_Key: see
    /// [`activate_ud`](Self::activate_ud)) is attached to the group when
    /// that event is read, unless `flags` is
    /// [`JoinFlags::SendOnlyFullMember`]; [`leave_multicast`](Self::leave_multicast)
    /// detaches it. The join holds the queue pair weakly: one dropped before
    /// the event is not attached.
    ///
    /// # Errors
    /// [`Error::ForeignContext`] or [`Error::WrongQpType`] for `qp`;
    /// [`Error::Unsupported`] on a synchronous id ([`CmId::new_sync`]);
    /// [`Error::Verb`] naming `rdma_join_multicast_ex` (`EINVAL` for an id
    /// not bound to a device or an address that is not multicast).
    ///
    /// # References
    /// `rdma_join_multicast_ex(3)`
    #[doc(alias = "rdma_join_multicast_ex")]
    pub fn join_multicast_ex(
        &self,
        addr: SocketAddr,
        qp: Option<&QueuePair>,
        flags: JoinFlags,
    ) -> Result<()> {
        if self.is_sync() {
            // The join's event would stay in librdmacm's `id->event`, out
            // of the event path that attaches the queue pair.
            return Err(Error::Unsupported(
                "multicast joins on a synchronous rdma_cm id",
            ));
        }
        if let Some(qp) = qp {
            self.check_qp_of(qp, QpType::Ud, "CmId::join_multicast")?;
        }
        let key = NEXT_KEY.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (mut ss, _) = to_sockaddr(addr);
        let mut attr = sys::rdma_cm_join_mc_attr_ex {
            comp_mask: sys::RDMA_CM_JOIN_MC_ATTR_ADDRESS | sys::RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS,
            join_flags: flags.as_raw(),
            addr: (&mut ss as *mut libc::sockaddr_storage).cast(),
        };
        // Recorded before the call: the join's event may be read on another
        // thread as soon as the kernel has it.
        let shared = self.shared();
        lock(&shared.mcast).push(Join {
            key,
            addr,
            flags,
            qp: qp.map(|qp| Arc::downgrade(&qp.inner)),
            attached: None,
        });
        // SAFETY: live id; `attr` and the address it points to outlive the
        // call (librdmacm copies the address); the context is a number the
        // event path only compares.
        let rc = unsafe { sys::rdma_join_multicast_ex(self.id(), &mut attr, key as *mut _) };
        let result = neg_errno("rdma_join_multicast_ex", rc)
            .map_err(|e| e.with_hint(Some(format!("group {addr}"))));
        if result.is_err() {
            lock(&shared.mcast).retain(|j| j.key != key);
        }
        result
    }

    /// Leaves the multicast group `addr` joined on this id: detaches the
    /// queue pair the join attached (if any), then `rdma_leave_multicast`,
    /// which returns once every event of the join was read (this crate
    /// acknowledges events as it reads them).
    ///
    /// # Errors
    /// [`Error::Verb`] naming `rdma_leave_multicast` (`EADDRNOTAVAIL` for a
    /// group this id has not joined) or `ibv_detach_mcast`.
    ///
    /// # References
    /// `rdma_leave_multicast(3)`
    #[doc(alias = "rdma_leave_multicast")]
    pub fn leave_multicast(&self, addr: SocketAddr) -> Result<()> {
        let join = {
            let mut joins = lock(&self.shared().mcast);
            joins
                .iter()
                .position(|j| j.addr == addr)
                .map(|at| joins.remove(at))
        };
        let mut detached = Ok(());
        if let Some(Join {
            qp: Some(qp),
            attached: Some((gid, lid)),
            ..
        }) = join
        {
            if let Some(inner) = qp.upgrade() {
                detached = match (QueuePair { inner }).detach_mcast(&gid, lid) {
                    // Detached already, by the caller: nothing left to undo.
                    Err(Error::MulticastMembership {
                        attached: false, ..
                    }) => Ok(()),
                    other => other,
                };
            }
        }
        let (mut ss, _) = to_sockaddr(addr);
        // SAFETY: live id; a valid sockaddr of its family.
        let rc = unsafe {
            sys::rdma_leave_multicast(self.id(), (&mut ss as *mut libc::sockaddr_storage).cast())
        };
        neg_errno("rdma_leave_multicast", rc)
            .map_err(|e| e.with_hint(Some(format!("group {addr}"))))?;
        detached
    }
}

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The event path's part of a `MulticastJoin` event for the id whose
/// `IdShared` is `shared`: attaches the queue pair the join named to the
/// group. Returns the error that turns the event into `MulticastError`.
pub(super) fn on_join(shared: &IdShared, context: usize, ud: &UdParam) -> Result<()> {
    let (gid, lid) = ud.group();
    // The list's lock is held across the attach, so a leave of this join
    // (which takes the join out under the same lock first) either runs
    // before — nothing is attached — or after, and detaches it.
    let mut joins = lock(&shared.mcast);
    let Some(join) = joins.iter_mut().find(|j| j.key == context) else {
        // Left already (its events are still read), or not ours.
        return Ok(());
    };
    if join.flags == JoinFlags::SendOnlyFullMember {
        return Ok(());
    }
    let Some(inner) = join.qp.as_ref().and_then(Weak::upgrade) else {
        return Ok(());
    };
    (QueuePair { inner }).attach_mcast(&gid, lid)?;
    join.attached = Some((gid, lid));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn join_flags_are_librdmacms() {
        assert_eq!(JoinFlags::default(), JoinFlags::FullMember);
        assert_eq!(JoinFlags::FullMember.as_raw(), 0);
        assert_eq!(JoinFlags::SendOnlyFullMember.as_raw(), 1);
    }

    #[test]
    fn ud_param_names_the_group_of_its_address_vector() {
        let group = Gid::from(std::net::Ipv4Addr::new(239, 1, 1, 1));
        let mut raw = sys::rdma_ud_param {
            private_data: std::ptr::null(),
            private_data_len: 0,
            ah_attr: *AddressVector::roce(
                crate::types::PortNumber(1),
                group,
                crate::types::GidIndex(1),
            )
            .as_raw(),
            qp_num: 0x00ff_ffff,
            qkey: 0x0123_4567,
        };
        raw.ah_attr.dlid = 0xc001;
        let ud = UdParam::from_raw(&raw);
        assert_eq!(ud.qp_num, QpNumber(0x00ff_ffff));
        assert_eq!(ud.qkey, 0x0123_4567);
        assert_eq!(ud.group(), (group, 0xc001));
        assert_eq!(ud.address.sgid_index(), crate::types::GidIndex(1));
    }

    #[test]
    fn port_spaces_round_trip() {
        use super::super::PortSpace;
        for ps in [
            PortSpace::Tcp,
            PortSpace::Udp,
            PortSpace::Ipoib,
            PortSpace::Ib,
        ] {
            assert_eq!(PortSpace::from_raw(ps.as_raw()), ps);
        }
        assert_eq!(PortSpace::Udp.as_raw(), 0x111);
        assert_eq!(PortSpace::from_raw(0x999), PortSpace::Unknown(0x999));
    }
}
