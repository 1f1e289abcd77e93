//! Queue pair attributes ([`QpAttr`]), states, [`QueuePair::modify`]
//! (checked against the IBA state machine in `transition.rs`) and queries
//! ([`QueuePair::query`]).

use std::mem::MaybeUninit;

use rdma_verbs_sys as sys;
use sys::ibv_qp_attr_mask as M;

use super::transition::*;
use crate::address_handle::AddressVector;
use crate::device::port::Mtu;
use crate::error::{ret_errno, Error, Result, TransitionReason};
use crate::qp::queue_pair::{QpCaps, QueuePair};
use crate::types::{device_enum, AccessFlags, PortNumber, QpNumber, QpState, QpType, SendOp};

device_enum! {
    /// Path migration state (automatic path migration to the alternate path).
    PathMigState {
        /// Migrated: the alternate path (if any) is not armed.
        Migrated = sys::IBV_MIG_MIGRATED,
        /// Rearm: request to arm the alternate path.
        Rearm = sys::IBV_MIG_REARM,
        /// Armed: the alternate path is ready for migration.
        Armed = sys::IBV_MIG_ARMED,
    }
}

/// Attributes for [`QueuePair::modify`] (`struct ibv_qp_attr` and its mask):
/// every setter is named after the C field and sets its `IBV_QP_*` bit.
///
/// # Example
/// ```no_run
/// # fn demo(qp: &rdma_verbs::QueuePair, port: rdma_verbs::PortNumber) -> rdma_verbs::Result<()> {
/// use rdma_verbs::{AccessFlags, QpState, qp::QpAttr};
/// qp.modify(
///     &QpAttr::new()
///         .qp_state(QpState::Init)
///         .pkey_index(0)
///         .port_num(port)
///         .qp_access_flags(AccessFlags::LOCAL_WRITE),
/// )?;
/// # Ok(()) }
/// ```
///
/// # References
/// `ibv_modify_qp(3)`
#[derive(Clone, Copy)]
#[must_use]
pub struct QpAttr {
    raw: sys::ibv_qp_attr,
    mask: u32,
}

impl Default for QpAttr {
    fn default() -> Self {
        QpAttr::new()
    }
}

impl QpAttr {
    /// No attributes (an empty mask).
    pub fn new() -> QpAttr {
        QpAttr {
            raw: sys::ibv_qp_attr::default(),
            mask: 0,
        }
    }

    /// Attributes another library computed (`rdma_init_qp_attr`), validated
    /// like any other when passed to [`QueuePair::modify`].
    #[cfg_attr(not(feature = "rdmacm"), allow(dead_code))]
    pub(crate) fn from_raw(raw: sys::ibv_qp_attr, mask: u32) -> QpAttr {
        QpAttr { raw, mask }
    }

    fn set(mut self, bit: u32, f: impl FnOnce(&mut sys::ibv_qp_attr)) -> Self {
        f(&mut self.raw);
        self.mask |= bit;
        self
    }

    /// The state to move to (`IBV_QP_STATE`). Without it the QP stays in
    /// its state and only the other attributes change.
    pub fn qp_state(self, state: QpState) -> Self {
        self.set(STATE, |a| a.qp_state = state.as_raw())
    }
    /// The state the caller believes the QP is in (`IBV_QP_CUR_STATE`);
    /// allowed from RTR, RTS, SQD and SQE. [`QueuePair::modify`] then
    /// checks the transition from this state instead of querying.
    pub fn cur_qp_state(self, state: QpState) -> Self {
        self.set(CUR_STATE, |a| a.cur_qp_state = state.as_raw())
    }
    /// Ask for an asynchronous event when the send queue has drained
    /// (`IBV_QP_EN_SQD_ASYNC_NOTIFY`, RTS→SQD).
    pub fn en_sqd_async_notify(self, on: bool) -> Self {
        self.set(EN_SQD_ASYNC_NOTIFY, |a| {
            a.en_sqd_async_notify = u8::from(on)
        })
    }
    /// Remote access rights of incoming RDMA operations
    /// (`IBV_QP_ACCESS_FLAGS`; RC and UC).
    pub fn qp_access_flags(self, access: AccessFlags) -> Self {
        self.set(ACCESS_FLAGS, |a| a.qp_access_flags = access.bits())
    }
    /// Index into the port's P_Key table (`IBV_QP_PKEY_INDEX`).
    pub fn pkey_index(self, index: u16) -> Self {
        self.set(PKEY_INDEX, |a| a.pkey_index = index)
    }
    /// The physical port (`IBV_QP_PORT`).
    pub fn port_num(self, port: PortNumber) -> Self {
        self.set(PORT, |a| a.port_num = port.0)
    }
    /// The Q_Key (`IBV_QP_QKEY`; UD). Keys with the high bit set are
    /// privileged.
    pub fn qkey(self, qkey: u32) -> Self {
        self.set(QKEY, |a| a.qkey = qkey)
    }
    /// The primary path to the peer (`IBV_QP_AV`; RC and UC).
    pub fn ah_attr(self, av: AddressVector) -> Self {
        self.set(AV, |a| a.ah_attr = *av.as_raw())
    }
    /// The path MTU (`IBV_QP_PATH_MTU`).
    pub fn path_mtu(self, mtu: Mtu) -> Self {
        self.set(PATH_MTU, |a| a.path_mtu = mtu.as_raw())
    }
    /// Local ACK timeout, 4.096 µs × 2^`timeout` (`IBV_QP_TIMEOUT`; 5 bits,
    /// 0 = infinite; RC).
    pub fn timeout(self, timeout: u8) -> Self {
        self.set(TIMEOUT, |a| a.timeout = timeout)
    }
    /// Transport retries before an error (`IBV_QP_RETRY_CNT`; 0–7; RC).
    pub fn retry_cnt(self, n: u8) -> Self {
        self.set(RETRY_CNT, |a| a.retry_cnt = n)
    }
    /// RNR NAK retries before an error (`IBV_QP_RNR_RETRY`; 0–7, 7 =
    /// infinite; RC).
    pub fn rnr_retry(self, n: u8) -> Self {
        self.set(RNR_RETRY, |a| a.rnr_retry = n)
    }
    /// The first receive packet sequence number (`IBV_QP_RQ_PSN`; 24 bits):
    /// the peer's send PSN.
    pub fn rq_psn(self, psn: u32) -> Self {
        self.set(RQ_PSN, |a| a.rq_psn = psn)
    }
    /// Outstanding RDMA reads/atomics as initiator
    /// (`IBV_QP_MAX_QP_RD_ATOMIC`; RC).
    pub fn max_rd_atomic(self, n: u8) -> Self {
        self.set(MAX_QP_RD_ATOMIC, |a| a.max_rd_atomic = n)
    }
    /// The alternate path for automatic path migration (`IBV_QP_ALT_PATH`:
    /// `alt_ah_attr`, `alt_pkey_index`, `alt_port_num` from `av`, and
    /// `alt_timeout`).
    pub fn alt_path(self, av: AddressVector, alt_pkey_index: u16, alt_timeout: u8) -> Self {
        self.set(ALT_PATH, |a| {
            a.alt_ah_attr = *av.as_raw();
            a.alt_pkey_index = alt_pkey_index;
            a.alt_port_num = av.port().0;
            a.alt_timeout = alt_timeout;
        })
    }
    /// Minimum RNR NAK timer, encoded as in the IBA (`IBV_QP_MIN_RNR_TIMER`;
    /// 5 bits, 12 = 0.64 ms; RC).
    pub fn min_rnr_timer(self, timer: u8) -> Self {
        self.set(MIN_RNR_TIMER, |a| a.min_rnr_timer = timer)
    }
    /// The first send packet sequence number (`IBV_QP_SQ_PSN`; 24 bits).
    pub fn sq_psn(self, psn: u32) -> Self {
        self.set(SQ_PSN, |a| a.sq_psn = psn)
    }
    /// Outstanding RDMA reads/atomics accepted as target
    /// (`IBV_QP_MAX_DEST_RD_ATOMIC`; RC).
    pub fn max_dest_rd_atomic(self, n: u8) -> Self {
        self.set(MAX_DEST_RD_ATOMIC, |a| a.max_dest_rd_atomic = n)
    }
    /// Path migration state (`IBV_QP_PATH_MIG_STATE`).
    pub fn path_mig_state(self, state: PathMigState) -> Self {
        self.set(PATH_MIG_STATE, |a| a.path_mig_state = state.as_raw())
    }
    /// The remote QP number (`IBV_QP_DEST_QPN`; RC and UC).
    pub fn dest_qp_num(self, qpn: QpNumber) -> Self {
        self.set(DEST_QPN, |a| a.dest_qp_num = qpn.0)
    }

    /// The attribute mask.
    pub fn mask(&self) -> sys::ibv_qp_attr_mask {
        M(self.mask)
    }
    /// The C struct.
    pub fn as_raw(&self) -> &sys::ibv_qp_attr {
        &self.raw
    }

    /// The state the attributes move to, given the current one.
    fn target(&self, current: QpState) -> QpState {
        if self.mask & STATE != 0 {
            QpState::from_raw(self.raw.qp_state)
        } else {
            current
        }
    }

    /// Rejects values wider than their wire encoding.
    fn check_values(&self) -> Result<()> {
        let a = &self.raw;
        let bad = |what: &'static str, v: u32, bits: u32| {
            Err(Error::OutOfRange {
                what,
                value: v.into(),
                max: (1u64 << bits) - 1,
            })
        };
        let has = |bit: u32| self.mask & bit != 0;
        let checks: [(u32, &'static str, u32, u32); 7] = [
            (RQ_PSN, "rq_psn", a.rq_psn, 24),
            (SQ_PSN, "sq_psn", a.sq_psn, 24),
            (DEST_QPN, "dest_qp_num", a.dest_qp_num, 24),
            (TIMEOUT, "timeout", a.timeout.into(), 5),
            (RETRY_CNT, "retry_cnt", a.retry_cnt.into(), 3),
            (RNR_RETRY, "rnr_retry", a.rnr_retry.into(), 3),
            (MIN_RNR_TIMER, "min_rnr_timer", a.min_rnr_timer.into(), 5),
        ];
        for (bit, what, v, bits) in checks {
            if has(bit) && v >> bits != 0 {
                return bad(what, v, bits);
            }
        }
        if has(ALT_PATH) && a.alt_timeout >> 5 != 0 {
            return bad("alt_timeout", a.alt_timeout.into(), 5);
        }
        if has(PATH_MTU) && matches!(Mtu::from_raw(a.path_mtu), Mtu::Unknown(_)) {
            return Err(Error::InvalidMtu { value: a.path_mtu });
        }
        if has(AV) {
            AddressVector::from_raw(a.ah_attr).check()?;
        }
        if has(ALT_PATH) {
            AddressVector::from_raw(a.alt_ah_attr).check()?;
        }
        Ok(())
    }

    /// `Ok` unless `cur_qp_state` is set to something other than
    /// `current`, the state the device reports: the library validates
    /// against the state it knows, never against the caller's claim.
    fn check_claimed_state(&self, current: QpState) -> Result<()> {
        if self.mask & CUR_STATE == 0 {
            return Ok(());
        }
        let claimed = QpState::from_raw(self.raw.cur_qp_state);
        if claimed == current {
            return Ok(());
        }
        Err(Error::InvalidTransition {
            from: current,
            to: self.target(current),
            reason: TransitionReason::ClaimedState(claimed),
        })
    }

    /// Checks these attributes for a `qp_type` queue pair in state
    /// `current` (or in `cur_qp_state`, when set: [`QueuePair::modify`] first
    /// checks that claim against the state the device reports): field widths, then the
    /// state transition table ([`QpState::check_transition`]).
    ///
    /// # Errors
    /// [`Error::OutOfRange`] for a value wider than its field (PSNs and QP
    /// numbers are 24 bits, `timeout` 5, `retry_cnt` 3, the service level
    /// 4, the flow label 20), [`Error::InvalidMtu`] for a `path_mtu` that
    /// is no `IBV_MTU_*` value, otherwise as [`QpState::check_transition`].
    pub fn validate(&self, qp_type: QpType, current: QpState) -> Result<()> {
        self.check_values()?;
        let from = if self.mask & CUR_STATE != 0 {
            QpState::from_raw(self.raw.cur_qp_state)
        } else {
            current
        };
        from.check_transition(self.target(from), qp_type, self.mask())
    }
}

impl std::fmt::Debug for QpAttr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("QpAttr");
        d.field("mask", &format_args!("{}", mask_names(self.mask)));
        if self.mask & STATE != 0 {
            d.field("qp_state", &QpState::from_raw(self.raw.qp_state));
        }
        if self.mask & AV != 0 {
            d.field("ah_attr", &AddressVector::from_raw(self.raw.ah_attr));
        }
        d.finish_non_exhaustive()
    }
}

/// The attributes of a queue pair as [`QueuePair::query`] reports them.
///
/// # References
/// `ibv_query_qp(3)`
#[derive(Clone, Copy)]
pub struct QpAttrView {
    raw: sys::ibv_qp_attr,
}

macro_rules! view_getters {
    ($( $(#[$m:meta])* $name:ident : $ty:ty ),* $(,)?) => {$(
        $(#[$m])*
        pub fn $name(&self) -> $ty { self.raw.$name }
    )*};
}

impl QpAttrView {
    /// The current state.
    pub fn qp_state(&self) -> QpState {
        QpState::from_raw(self.raw.qp_state)
    }
    /// The state the kernel reports as `cur_qp_state` (`ibv_query_qp`
    /// fills it beside `qp_state`; rxe reports the current state in both).
    /// [`qp_state`](Self::qp_state) is the one to act on.
    pub fn cur_qp_state(&self) -> QpState {
        QpState::from_raw(self.raw.cur_qp_state)
    }
    /// The path MTU.
    pub fn path_mtu(&self) -> Mtu {
        Mtu::from_raw(self.raw.path_mtu)
    }
    /// The path migration state.
    pub fn path_mig_state(&self) -> PathMigState {
        PathMigState::from_raw(self.raw.path_mig_state)
    }
    /// The remote QP number (RC, UC).
    pub fn dest_qp_num(&self) -> QpNumber {
        QpNumber(self.raw.dest_qp_num)
    }
    /// Remote access rights (unknown bits kept).
    pub fn qp_access_flags(&self) -> AccessFlags {
        AccessFlags::from_bits_retain(self.raw.qp_access_flags)
    }
    /// The primary path.
    pub fn ah_attr(&self) -> AddressVector {
        AddressVector::from_raw(self.raw.ah_attr)
    }
    /// The alternate path.
    pub fn alt_ah_attr(&self) -> AddressVector {
        AddressVector::from_raw(self.raw.alt_ah_attr)
    }
    /// The port.
    pub fn port_num(&self) -> PortNumber {
        PortNumber(self.raw.port_num)
    }
    /// The alternate path's port.
    pub fn alt_port_num(&self) -> PortNumber {
        PortNumber(self.raw.alt_port_num)
    }
    /// Whether the send queue is still draining (in SQD).
    pub fn sq_draining(&self) -> bool {
        self.raw.sq_draining != 0
    }
    /// Whether the SQ-drained event was requested.
    pub fn en_sqd_async_notify(&self) -> bool {
        self.raw.en_sqd_async_notify != 0
    }
    /// The capacities.
    pub fn cap(&self) -> QpCaps {
        QpCaps::from_raw(&self.raw.cap)
    }
    view_getters! {
        /// The Q_Key (UD).
        qkey: u32,
        /// The receive PSN.
        rq_psn: u32,
        /// The send PSN.
        sq_psn: u32,
        /// The P_Key index.
        pkey_index: u16,
        /// The alternate path's P_Key index.
        alt_pkey_index: u16,
        /// Outstanding RDMA reads/atomics as initiator.
        max_rd_atomic: u8,
        /// Outstanding RDMA reads/atomics as target.
        max_dest_rd_atomic: u8,
        /// The minimum RNR NAK timer (IBA encoding).
        min_rnr_timer: u8,
        /// The local ACK timeout exponent.
        timeout: u8,
        /// The transport retry count.
        retry_cnt: u8,
        /// The RNR retry count.
        rnr_retry: u8,
        /// The alternate path's ACK timeout exponent.
        alt_timeout: u8,
    }
    /// The C struct.
    pub fn as_raw(&self) -> &sys::ibv_qp_attr {
        &self.raw
    }
}

impl std::fmt::Debug for QpAttrView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QpAttrView")
            .field("qp_state", &self.qp_state())
            .field("path_mtu", &self.path_mtu())
            .field("dest_qp_num", &self.dest_qp_num())
            .field("rq_psn", &self.rq_psn())
            .field("sq_psn", &self.sq_psn())
            .field("port_num", &self.port_num())
            .field("ah_attr", &self.ah_attr())
            .finish_non_exhaustive()
    }
}

/// The opcode `ibv_query_qp_data_in_order` is asked about: send, RDMA
/// write and RDMA read only (`ibv_query_qp_data_in_order(3)`).
pub(crate) fn in_order_opcode(op: SendOp) -> Result<sys::ibv_wr_opcode> {
    match op {
        SendOp::Send => Ok(sys::IBV_WR_SEND),
        SendOp::RdmaWrite => Ok(sys::IBV_WR_RDMA_WRITE),
        SendOp::RdmaRead => Ok(sys::IBV_WR_RDMA_READ),
        _ => Err(Error::Unsupported(
            "ibv_query_qp_data_in_order answers for send, RDMA write and RDMA read only",
        )),
    }
}

/// Every attribute `ibv_query_qp` can report.
const QUERY_ALL: u32 = KNOWN_BITS & !RATE_LIMIT;

impl QueuePair {
    fn query_raw(&self, mask: u32) -> Result<(sys::ibv_qp_attr, sys::ibv_qp_init_attr)> {
        let mut attr = MaybeUninit::<sys::ibv_qp_attr>::zeroed();
        let mut init = MaybeUninit::<sys::ibv_qp_init_attr>::zeroed();
        // SAFETY: live QP; both out-structs are valid for writes of their
        // size and outlive the call.
        let rc = unsafe {
            sys::ibv_query_qp(
                self.as_ptr(),
                attr.as_mut_ptr(),
                mask as i32,
                init.as_mut_ptr(),
            )
        };
        ret_errno("ibv_query_qp", rc)?;
        // SAFETY: zeroed (all-zero is a valid value of both plain C structs:
        // integers, unions of byte arrays and nullable pointers), then
        // partly filled by the successful call.
        Ok(unsafe { (attr.assume_init(), init.assume_init()) })
    }

    /// Queries the queue pair's attributes and the capacities it was
    /// created with.
    ///
    /// # Errors
    /// [`Error::Verb`] naming `ibv_query_qp`.
    ///
    /// # References
    /// `ibv_query_qp(3)`
    #[doc(alias = "ibv_query_qp")]
    pub fn query(&self) -> Result<(QpAttrView, QpCaps)> {
        let (raw, init) = self.query_raw(QUERY_ALL)?;
        Ok((QpAttrView { raw }, QpCaps::from_raw(&init.cap)))
    }

    /// Whether the data of an `op` this queue pair receives (or, for
    /// [`SendOp::RdmaRead`], the data of its own reads) is written to
    /// memory in order within each request, so that a reader may poll the
    /// last byte instead of waiting for the completion
    /// (`ibv_query_qp_data_in_order` with `flags` 0). `false` is the safe
    /// answer and what a provider without the query says (rxe in rdma-core
    /// 44; libibverbs also answers `false` on every non-x86 machine). Says
    /// nothing about the order between requests, and holds only for memory
    /// read by the CPU, not registered with `RELAXED_ORDERING`.
    ///
    /// A `true` answer is no licence to read a [`SharedBuffer`] through a
    /// reference while a peer writes it: the ownership model stays as it
    /// is (DESIGN.md); it only says a volatile poll of the last byte sees
    /// the rest of the message written.
    ///
    /// # Errors
    /// [`Error::Unsupported`] for operations other than send, RDMA write
    /// and RDMA read (the man page defines the answer for those only);
    /// [`Error::Verb`] naming `ibv_query_qp_data_in_order` for a result
    /// other than 0 or 1.
    ///
    /// # References
    /// `ibv_query_qp_data_in_order(3)`
    ///
    /// [`SharedBuffer`]: crate::SharedBuffer
    #[doc(alias = "ibv_query_qp_data_in_order")]
    pub fn data_in_order(&self, op: SendOp) -> Result<bool> {
        let raw = in_order_opcode(op)?;
        // SAFETY: live QP; `flags` 0 is the only value rdma-core 44 defines.
        let rc = unsafe { sys::ibv_query_qp_data_in_order(self.as_ptr(), raw, 0) };
        match rc {
            0 => Ok(false),
            1 => Ok(true),
            rc => Err(Error::Verb {
                verb: "ibv_query_qp_data_in_order",
                io: std::io::Error::other(format!("returned {rc}, neither 0 nor 1")),
            }),
        }
    }

    /// The current state, as the device reports it (it moves a QP to ERR
    /// or SQE on its own after errors).
    ///
    /// # Errors
    /// [`Error::Verb`] naming `ibv_query_qp`.
    ///
    /// # References
    /// `ibv_query_qp(3)`
    #[doc(alias = "ibv_query_qp")]
    pub fn state(&self) -> Result<QpState> {
        let (raw, _) = self.query_raw(STATE)?;
        Ok(QpState::from_raw(raw.qp_state))
    }

    /// Modifies the queue pair after checking `attr` against the IBA state
    /// transition table for its type ([`QpAttr::validate`]) from its
    /// current state. A `cur_qp_state` must name the state the device
    /// reports (`ibv_query_qp`, asked only then): the kernel believes the
    /// claim, so a false one would let an INIT queue pair skip RTR's
    /// attributes.
    ///
    /// Without `cur_qp_state` no query is made: the check starts from the
    /// state this crate's last state change set, as `ibv_rc_pingpong`
    /// knows its queue pair's state. That state is exact but for the moves
    /// a device makes on its own after errors (to ERR, or SQE for UC and
    /// UD), and the kernel checks every transition again from the state it
    /// knows (`ib_modify_qp_is_ok`, the same table). So a stale start never
    /// lets anything through that the device state forbids: when either
    /// check refuses, the state is queried and the refusal is reported as
    /// a check from it, as if it had been queried first.
    ///
    /// A move to RESET discards the requests still outstanding on the QP's
    /// own queues, as the device does: their buffers are dropped.
    ///
    /// # Errors
    /// [`Error::InvalidTransition`] (illegal transition, missing or
    /// forbidden attribute, a `cur_qp_state` that is not the state),
    /// [`Error::OutOfRange`] (a value wider than its field) and
    /// [`Error::InvalidMtu`] before
    /// anything reaches the device, or once the device refused from a
    /// state it had moved to on its own;
    /// [`Error::Verb`] naming `ibv_query_qp` or `ibv_modify_qp` (the kernel
    /// checks again: the device may have moved the QP meanwhile).
    ///
    /// # References
    /// `ibv_modify_qp(3)`
    #[doc(alias = "ibv_modify_qp")]
    pub fn modify(&self, attr: &QpAttr) -> Result<()> {
        let ty = self.qp_type();
        if attr.mask & CUR_STATE != 0 {
            let current = self.state()?;
            attr.check_claimed_state(current)?;
            attr.validate(ty, current)?;
            return self.modify_raw(attr);
        }
        let tracked = QpState::from_raw(self.tracked_state());
        if let Err(e) = attr.validate(ty, tracked) {
            // Stale? Only a state the device moved to can make a
            // difference: go on if the transition is legal from there.
            match self.state_if_moved(tracked) {
                Some(current) => attr.validate(ty, current)?,
                None => return Err(e),
            }
        }
        self.modify_raw(attr).map_err(|e| {
            // The kernel refused from the state it knows: if the device
            // moved the QP, say which check that state fails.
            if e.raw_os_error() != Some(libc::EINVAL) {
                return e;
            }
            match self.state_if_moved(tracked) {
                Some(current) => attr.validate(ty, current).err().unwrap_or(e),
                None => e,
            }
        })
    }

    /// The device's state of the queue pair when it differs from `tracked`
    /// (error paths only: queries the device; `None` if the query fails).
    #[cold]
    fn state_if_moved(&self, tracked: QpState) -> Option<QpState> {
        self.state().ok().filter(|s| *s != tracked)
    }

    /// Modifies the queue pair without checking the state table here; the
    /// kernel and provider still validate (an `EINVAL` then says less than
    /// [`QueuePair::modify`] would).
    ///
    /// # References
    /// `ibv_modify_qp(3)`
    ///
    /// A `cur_qp_state` is still checked against the state the device
    /// reports (the kernel believes the caller's claim, so a false one
    /// would let an INIT queue pair skip RTR's attributes).
    ///
    /// # Errors
    /// [`Error::InvalidTransition`] when `cur_qp_state` is not the queue
    /// pair's state; [`Error::Verb`] naming `ibv_query_qp` (only with
    /// `cur_qp_state`) or `ibv_modify_qp`.
    #[doc(alias = "ibv_modify_qp")]
    pub fn modify_unchecked(&self, attr: &QpAttr) -> Result<()> {
        if attr.mask & CUR_STATE != 0 {
            attr.check_claimed_state(self.state()?)?;
        }
        self.modify_raw(attr)
    }

    /// `ibv_modify_qp` under `control`, with the posting handles' rules
    /// (DESIGN.md, "Posting"): no move out of the states that send while
    /// the send queue's handle lives, no move to RESET while either
    /// handle does; no check of `attr` otherwise.
    fn modify_raw(&self, attr: &QpAttr) -> Result<()> {
        let mut raw = attr.raw;
        let _control = self.inner.control.lock();
        if attr.mask & STATE == 0 {
            // SAFETY: live QP; `raw` is an initialised ibv_qp_attr that
            // outlives the call; the mask names only fields set through
            // QpAttr (the rest are zero).
            let rc = unsafe { sys::ibv_modify_qp(self.as_ptr(), &mut raw, attr.mask as i32) };
            return ret_errno("ibv_modify_qp", rc).map_err(|e| e.with_hint(self.modify_hint(attr)));
        }
        let to = raw.qp_state;
        if to == sys::IBV_QPS_RESET {
            return self.reset_raw(attr, raw);
        }
        // Out of RTS/SQD/SQE/ERR into INIT or RTR (only through RESET, which
        // the state table checks): a live send handle could post there.
        if !super::state_sends(to) && self.inner.send_ring.is_taken() {
            return Err(handle_live("send queue", to));
        }
        // A move to ERR flushes the receive queue once; rxe takes a receive
        // posted later into its queue (no system call) and never flushes
        // it. So receives are refused from before the move (the flag, set
        // here and fenced) until the QP leaves ERR; a receive that raced
        // the move re-issues it (`RecvQueue`).
        if to == sys::IBV_QPS_ERR {
            self.note_err_pending();
        }
        // SAFETY: as above.
        let rc = unsafe { sys::ibv_modify_qp(self.as_ptr(), &mut raw, attr.mask as i32) };
        self.note_state((rc == 0).then_some(to));
        ret_errno("ibv_modify_qp", rc).map_err(|e| e.with_hint(self.modify_hint(attr)))
    }

    /// The move to RESET (`control` held). It empties the QP's work
    /// queues: the device forgets every posted request (no completion) and
    /// never touches its buffers again, as after destruction. Both rings
    /// are taken for the move (refused while a handle has one), their
    /// outstanding requests' payloads released after it, and each ring
    /// holds a slot per request for completions of those that had finished,
    /// which may still be queued in the CQ (DESIGN.md, "A CQ holds a
    /// completion of every request").
    fn reset_raw(&self, attr: &QpAttr, mut raw: sys::ibv_qp_attr) -> Result<()> {
        let inner = &self.inner;
        let Some(mut send) = inner.send_ring.take() else {
            return Err(handle_live("send queue", sys::IBV_QPS_RESET));
        };
        let recv = match &inner.recv_ring {
            None => None,
            Some(cell) => match cell.take() {
                Some(r) => Some((cell, r)),
                None => {
                    inner.send_ring.give_back();
                    return Err(handle_live("receive queue", sys::IBV_QPS_RESET));
                }
            },
        };
        // Only a real transition discards: what was posted while already in
        // RESET (out of spec, but some providers accept it) stays owned.
        let leaving_other_state = self.tracked_state() != sys::IBV_QPS_RESET;
        // SAFETY: live QP; `raw` is an initialised ibv_qp_attr that outlives
        // the call; the mask names only fields set through QpAttr.
        let rc = unsafe { sys::ibv_modify_qp(self.as_ptr(), &mut raw, attr.mask as i32) };
        self.note_state((rc == 0).then_some(sys::IBV_QPS_RESET));
        let mut dropped = Vec::new();
        if rc == 0 && leaving_other_state {
            // SAFETY: taken above: ours until given back.
            let ring = unsafe { send.as_mut() };
            let (payloads, held) = ring.teardown(true);
            dropped.push(payloads);
            inner.send_cq.owe_after_reset(ring.held_mark(), held);
            if let Some((_, mut r)) = recv {
                // SAFETY: as above.
                let ring = unsafe { r.as_mut() };
                let (payloads, held) = ring.teardown(true);
                dropped.push(payloads);
                inner.recv_cq.owe_after_reset(ring.held_mark(), held);
            }
        }
        inner.send_ring.give_back();
        if let Some((cell, _)) = recv {
            cell.give_back();
        }
        // The buffers (which may deregister memory or destroy address
        // handles) go after the rings are back.
        drop(dropped);
        ret_errno("ibv_modify_qp", rc).map_err(|e| e.with_hint(self.modify_hint(attr)))
    }
}

/// A move refused while a posting handle lives.
fn handle_live(queue: &'static str, to: u32) -> Error {
    Error::HandleLive {
        queue,
        to: QpState::from_raw(to),
    }
}

impl QueuePair {
    /// Why `ibv_modify_qp` refused `attr`, when a port or GID index it
    /// names does not exist. Error paths only: queries the device.
    fn modify_hint(&self, attr: &QpAttr) -> Option<String> {
        let ctx = self.pd().context();
        if attr.mask & PORT != 0 {
            if let Some(hint) = ctx.port_hint(PortNumber(attr.raw.port_num)) {
                return Some(hint);
            }
        }
        for (bit, raw) in [(AV, &attr.raw.ah_attr), (ALT_PATH, &attr.raw.alt_ah_attr)] {
            if attr.mask & bit == 0 {
                continue;
            }
            let av = AddressVector::from_raw(*raw);
            if let Some(hint) = ctx.port_hint(av.port()) {
                return Some(hint);
            }
            if av.is_global() {
                if let Some(hint) = ctx.gid_hint(av.port(), av.sgid_index()) {
                    return Some(hint);
                }
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_in_order_is_asked_for_send_write_and_read_only() {
        assert_eq!(in_order_opcode(SendOp::Send).unwrap(), sys::IBV_WR_SEND);
        assert_eq!(
            in_order_opcode(SendOp::RdmaWrite).unwrap(),
            sys::IBV_WR_RDMA_WRITE
        );
        assert_eq!(
            in_order_opcode(SendOp::RdmaRead).unwrap(),
            sys::IBV_WR_RDMA_READ
        );
        for op in [
            SendOp::CompareAndSwap,
            SendOp::FetchAndAdd,
            SendOp::AtomicWrite,
            SendOp::Flush,
        ] {
            let e = in_order_opcode(op).unwrap_err();
            assert!(matches!(e, Error::Unsupported(_)), "{op:?}: {e}");
            assert!(e.to_string().contains("ibv_query_qp_data_in_order"), "{e}");
        }
    }
}
