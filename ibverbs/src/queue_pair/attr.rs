//! Queue pair attributes ([`QpAttr`]), the IBA state machine that
//! [`QueuePair::modify`] enforces, and queries ([`QueuePair::query`]).

use std::mem::MaybeUninit;

use ibverbs_sys as sys;
use sys::ibv_qp_attr_mask as M;

use crate::error::{ret_errno, Error, Result};
use crate::port::{device_enum, Mtu, PortNumber};
use crate::{AccessFlags, AddressVector, QpCaps, QpNumber, QpType, QueuePair};

device_enum! {
    /// Queue pair state.
    QpState {
        /// Reset.
        Reset = sys::IBV_QPS_RESET,
        /// Initialised.
        Init = sys::IBV_QPS_INIT,
        /// Ready to receive.
        Rtr = sys::IBV_QPS_RTR,
        /// Ready to send.
        Rts = sys::IBV_QPS_RTS,
        /// Send queue drained.
        Sqd = sys::IBV_QPS_SQD,
        /// Send queue error.
        Sqe = sys::IBV_QPS_SQE,
        /// Error.
        Err = sys::IBV_QPS_ERR,
    }
}

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

/// Defines a `u32` constant per `IBV_QP_*` mask bit, and `MASK_NAMES`
/// mapping each bit to its C name (for error messages and `Debug`).
macro_rules! mask_bits {
    ($($name:ident = $c:ident),* $(,)?) => {
        $( const $name: u32 = M::$c.0; )*
        const MASK_NAMES: &[(u32, &str)] = &[$( ($name, stringify!($c)) ),*];
    };
}

mask_bits! {
    STATE = IBV_QP_STATE,
    CUR_STATE = IBV_QP_CUR_STATE,
    EN_SQD_ASYNC_NOTIFY = IBV_QP_EN_SQD_ASYNC_NOTIFY,
    ACCESS_FLAGS = IBV_QP_ACCESS_FLAGS,
    PKEY_INDEX = IBV_QP_PKEY_INDEX,
    PORT = IBV_QP_PORT,
    QKEY = IBV_QP_QKEY,
    AV = IBV_QP_AV,
    PATH_MTU = IBV_QP_PATH_MTU,
    TIMEOUT = IBV_QP_TIMEOUT,
    RETRY_CNT = IBV_QP_RETRY_CNT,
    RNR_RETRY = IBV_QP_RNR_RETRY,
    RQ_PSN = IBV_QP_RQ_PSN,
    MAX_QP_RD_ATOMIC = IBV_QP_MAX_QP_RD_ATOMIC,
    ALT_PATH = IBV_QP_ALT_PATH,
    MIN_RNR_TIMER = IBV_QP_MIN_RNR_TIMER,
    SQ_PSN = IBV_QP_SQ_PSN,
    MAX_DEST_RD_ATOMIC = IBV_QP_MAX_DEST_RD_ATOMIC,
    PATH_MIG_STATE = IBV_QP_PATH_MIG_STATE,
    CAP = IBV_QP_CAP,
    DEST_QPN = IBV_QP_DEST_QPN,
    RATE_LIMIT = IBV_QP_RATE_LIMIT,
}

/// Every mask bit this crate knows.
const KNOWN_BITS: u32 = {
    let mut all = 0;
    let mut i = 0;
    while i < MASK_NAMES.len() {
        all |= MASK_NAMES[i].0;
        i += 1;
    }
    all
};

/// `IBV_QP_A, IBV_QP_B` (unknown bits in hex).
fn mask_names(mask: u32) -> String {
    let mut names: Vec<String> = MASK_NAMES
        .iter()
        .filter(|(bit, _)| mask & bit != 0)
        .map(|(_, name)| (*name).to_string())
        .collect();
    if mask & !KNOWN_BITS != 0 {
        names.push(format!("{:#x}", mask & !KNOWN_BITS));
    }
    names.join(", ")
}

/// The row of the IBA QP state transition table (the kernel's
/// `qp_state_table`, `ib_modify_qp_is_ok`) for RC, UC and UD queue pairs:
/// `(required, optional)` attributes (`IBV_QP_STATE` is always allowed), or
/// why the transition itself is illegal.
fn rule(t: QpType, from: QpState, to: QpState) -> std::result::Result<(u32, u32), String> {
    use QpState as S;
    use QpType as T;
    if !matches!(t, T::Rc | T::Uc | T::Ud) {
        return Err(format!("{t:?} queue pairs are not in the state table"));
    }
    // Optional attributes of RTR->RTS, RTS->RTS and SQD->RTS.
    let to_rts = match t {
        T::Rc => CUR_STATE | ACCESS_FLAGS | ALT_PATH | PATH_MIG_STATE | MIN_RNR_TIMER,
        T::Uc => CUR_STATE | ACCESS_FLAGS | ALT_PATH | PATH_MIG_STATE,
        _ => CUR_STATE | QKEY,
    };
    // What RESET->INIT requires and INIT->INIT allows.
    let init = match t {
        T::Ud => PKEY_INDEX | PORT | QKEY,
        _ => PKEY_INDEX | PORT | ACCESS_FLAGS,
    };
    // What SQD->SQD allows an RC queue pair to change.
    let rc_sqd_path = PORT | AV | ALT_PATH | PKEY_INDEX | ACCESS_FLAGS | PATH_MIG_STATE;
    let rc_sqd_transport = TIMEOUT | RETRY_CNT | RNR_RETRY | MIN_RNR_TIMER;
    let rc_sqd_rd = MAX_QP_RD_ATOMIC | MAX_DEST_RD_ATOMIC;
    Ok(match (from, to) {
        (S::Unknown(v), _) => return Err(format!("the current state ({v}) is unknown")),
        (_, S::Unknown(v)) => return Err(format!("the target state ({v}) is unknown")),
        (_, S::Reset) => (0, 0),
        (S::Reset, S::Err) => return Err("from RESET only INIT (or RESET) is allowed".into()),
        (_, S::Err) => (0, 0),
        (S::Reset, S::Init) => (init, 0),
        (S::Init, S::Init) => (0, init),
        (S::Init, S::Rtr) => match t {
            T::Rc => (
                AV | PATH_MTU | DEST_QPN | RQ_PSN | MAX_DEST_RD_ATOMIC | MIN_RNR_TIMER,
                ALT_PATH | ACCESS_FLAGS | PKEY_INDEX,
            ),
            T::Uc => (
                AV | PATH_MTU | DEST_QPN | RQ_PSN,
                ALT_PATH | ACCESS_FLAGS | PKEY_INDEX,
            ),
            _ => (0, PKEY_INDEX | QKEY),
        },
        (S::Rtr, S::Rts) => match t {
            T::Rc => (
                SQ_PSN | TIMEOUT | RETRY_CNT | RNR_RETRY | MAX_QP_RD_ATOMIC,
                to_rts,
            ),
            _ => (SQ_PSN, to_rts),
        },
        (S::Rts, S::Rts) | (S::Sqd, S::Rts) => (0, to_rts),
        (S::Rts, S::Sqd) => (0, EN_SQD_ASYNC_NOTIFY),
        (S::Sqd, S::Sqd) => match t {
            T::Rc => (0, rc_sqd_path | rc_sqd_transport | rc_sqd_rd),
            T::Uc => (
                0,
                AV | ALT_PATH | ACCESS_FLAGS | PKEY_INDEX | PATH_MIG_STATE,
            ),
            _ => (0, PKEY_INDEX | QKEY),
        },
        (S::Sqe, S::Rts) => match t {
            T::Rc => return Err("RC queue pairs have no SQE state (errors lead to ERR)".into()),
            T::Uc => (0, CUR_STATE | ACCESS_FLAGS),
            _ => (0, CUR_STATE | QKEY),
        },
        _ => return Err("the IBA state table has no such transition".into()),
    })
}

/// Checks a modify of a `qp_type` queue pair from state `from` to state `to`
/// with attribute mask `mask` against the IBA state transition table (as
/// the kernel's `ib_modify_qp_is_ok` does): the transition must exist, every
/// attribute it requires must be in `mask`, and nothing it does not allow.
///
/// Pure: no device needed. [`QueuePair::modify`] calls it with the QP's
/// current state.
///
/// # Errors
/// [`Error::InvalidTransition`] naming the illegal transition, or the
/// missing or forbidden attributes by their C names (`missing
/// IBV_QP_DEST_QPN`); [`Error::Unsupported`] for QP types other than RC,
/// UC and UD.
///
/// # References
/// `ibv_modify_qp(3)`; InfiniBand Architecture Specification vol. 1,
/// "QP State Transition" tables.
pub fn check_qp_transition(
    qp_type: QpType,
    from: QpState,
    to: QpState,
    mask: sys::ibv_qp_attr_mask,
) -> Result<()> {
    if !matches!(qp_type, QpType::Rc | QpType::Uc | QpType::Ud) {
        return Err(Error::Unsupported(format!(
            "state checks for {qp_type:?} queue pairs (RC, UC and UD are covered)"
        )));
    }
    let invalid = |reason: String| Error::InvalidTransition { from, to, reason };
    let (required, optional) = rule(qp_type, from, to).map_err(invalid)?;
    let missing = required & !mask.0;
    if missing != 0 {
        let names = mask_names(missing);
        return Err(invalid(format!("missing {names} for {qp_type:?}")));
    }
    let forbidden = mask.0 & !(required | optional | STATE);
    if forbidden != 0 {
        let names = mask_names(forbidden);
        return Err(invalid(format!("{names} not allowed here for {qp_type:?}")));
    }
    Ok(())
}

/// Attributes for [`QueuePair::modify`] (`struct ibv_qp_attr` and its mask):
/// every setter is named after the C field and sets its `IBV_QP_*` bit.
///
/// # Example
/// ```no_run
/// # fn demo(qp: &ibverbs::QueuePair, port: ibverbs::PortNumber) -> ibverbs::Result<()> {
/// use ibverbs::{AccessFlags, QpAttr, QpState};
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
        let bad = |what: &str, v: u32, bits: u32| {
            Err(Error::InvalidArgument(format!(
                "{what} {v:#x} does not fit in {bits} bits"
            )))
        };
        let has = |bit: u32| self.mask & bit != 0;
        let checks: [(u32, &str, u32, u32); 7] = [
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
            return Err(Error::InvalidArgument(format!(
                "path_mtu {} is not an IBV_MTU_* value",
                a.path_mtu
            )));
        }
        if has(AV) {
            AddressVector::from_raw(a.ah_attr).check()?;
        }
        if has(ALT_PATH) {
            AddressVector::from_raw(a.alt_ah_attr).check()?;
        }
        Ok(())
    }

    /// Checks these attributes for a `qp_type` queue pair in state
    /// `current` (or in `cur_qp_state`, when set): field widths, then the
    /// state transition table ([`check_qp_transition`]).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a value wider than its field (PSNs
    /// and QP numbers are 24 bits, `timeout` 5, `retry_cnt` 3 …), otherwise
    /// as [`check_qp_transition`].
    pub fn validate(&self, qp_type: QpType, current: QpState) -> Result<()> {
        self.check_values()?;
        let from = if self.mask & CUR_STATE != 0 {
            QpState::from_raw(self.raw.cur_qp_state)
        } else {
            current
        };
        check_qp_transition(qp_type, from, self.target(from), self.mask())
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
    /// transition table for its type ([`QpAttr::validate`]), from its
    /// current state (queried, or `cur_qp_state` when set).
    ///
    /// A move to RESET discards the requests still outstanding on the QP's
    /// own queues, as the device does: their buffers are dropped.
    ///
    /// # Errors
    /// [`Error::InvalidTransition`] (illegal transition, missing or
    /// forbidden attribute) and [`Error::InvalidArgument`] (a value wider
    /// than its field) before anything reaches the device;
    /// [`Error::Verb`] naming `ibv_query_qp` or `ibv_modify_qp` (the kernel
    /// checks again: the device may have moved the QP meanwhile).
    ///
    /// # References
    /// `ibv_modify_qp(3)`
    #[doc(alias = "ibv_modify_qp")]
    pub fn modify(&self, attr: &QpAttr) -> Result<()> {
        let current = if attr.mask & CUR_STATE != 0 {
            QpState::from_raw(attr.raw.cur_qp_state)
        } else {
            self.state()?
        };
        attr.validate(self.qp_type(), current)?;
        self.modify_unchecked(attr)
    }

    /// Modifies the queue pair without checking the state table here; the
    /// kernel and provider still validate (an `EINVAL` then says less than
    /// [`QueuePair::modify`] would).
    ///
    /// # Errors
    /// [`Error::Verb`] naming `ibv_modify_qp`.
    ///
    /// # References
    /// `ibv_modify_qp(3)`
    #[doc(alias = "ibv_modify_qp")]
    pub fn modify_unchecked(&self, attr: &QpAttr) -> Result<()> {
        let mut raw = attr.raw;
        let to_reset = attr.mask & STATE != 0 && raw.qp_state == sys::IBV_QPS_RESET;
        if !to_reset {
            // A state change holds the send queue's lock, so that posting
            // (which holds it too) sees the state libibverbs records in
            // `ibv_qp::state` before or after the change, never during it.
            let _send = (attr.mask & STATE != 0).then(|| self.inner.send.lock());
            // SAFETY: live QP; `raw` is an initialised ibv_qp_attr that
            // outlives the call; the mask names only fields set through
            // QpAttr (the rest are zero).
            let rc = unsafe { sys::ibv_modify_qp(self.as_ptr(), &mut raw, attr.mask as i32) };
            return ret_errno("ibv_modify_qp", rc).map_err(|e| e.with_hint(self.modify_hint(attr)));
        }
        // RESET empties the QP's work queues: the device forgets every
        // posted request (no completion) and never touches its buffers
        // again, as after destruction. Their slots are released so that the
        // queue can be used again. The table locks are held across the
        // modify, so no request posted concurrently (posting holds them
        // too) can be mistaken for a discarded one.
        let send = &self.inner.send;
        let mut send_st = send.lock();
        let mut recv_st = self.inner.recv.as_ref().map(|t| t.lock());
        // Only a real transition discards: what was posted while already in
        // RESET (out of spec, but some providers accept it) stays owned.
        let leaving_other_state = matches!(self.state(), Ok(s) if s != QpState::Reset);
        // SAFETY: as above.
        let rc = unsafe { sys::ibv_modify_qp(self.as_ptr(), &mut raw, attr.mask as i32) };
        ret_errno("ibv_modify_qp", rc).map_err(|e| e.with_hint(self.modify_hint(attr)))?;
        if leaving_other_state {
            let dropped_send = send_st.take_all();
            let dropped_recv = recv_st.as_mut().map(|st| st.take_all());
            // Release the buffers (which may deregister memory or destroy
            // address handles) after the locks.
            drop(send_st);
            drop(recv_st);
            drop(dropped_send);
            drop(dropped_recv);
        }
        Ok(())
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
    use QpState as S;
    use QpType::{Rc as RC, Uc as UC, Ud as UD};

    fn check(t: QpType, from: QpState, to: QpState, mask: u32) -> Result<()> {
        check_qp_transition(t, from, to, M(mask | STATE))
    }

    /// The reason of an `InvalidTransition` (empty when the check passed).
    fn reason(t: QpType, from: QpState, to: QpState, mask: u32) -> String {
        match check(t, from, to, mask) {
            Ok(()) => String::new(),
            Err(Error::InvalidTransition { reason, .. }) => reason,
            Err(e) => e.to_string(),
        }
    }

    const INIT_RC: u32 = PKEY_INDEX | PORT | ACCESS_FLAGS;
    const INIT_UD: u32 = PKEY_INDEX | PORT | QKEY;
    const RTR_UC: u32 = AV | PATH_MTU | DEST_QPN | RQ_PSN;
    const RTR_RC: u32 = RTR_UC | MAX_DEST_RD_ATOMIC | MIN_RNR_TIMER;
    const RTS_RC: u32 = SQ_PSN | TIMEOUT | RETRY_CNT | RNR_RETRY | MAX_QP_RD_ATOMIC;

    #[test]
    fn legal_sequences() {
        let ok: [(QpType, QpState, QpState, u32); 16] = [
            (RC, S::Reset, S::Init, INIT_RC),
            (UC, S::Reset, S::Init, INIT_RC),
            (UD, S::Reset, S::Init, INIT_UD),
            (RC, S::Init, S::Init, PORT),
            (UD, S::Init, S::Init, 0),
            (RC, S::Init, S::Rtr, RTR_RC | ACCESS_FLAGS),
            (UC, S::Init, S::Rtr, RTR_UC),
            (UD, S::Init, S::Rtr, 0),
            (RC, S::Rtr, S::Rts, RTS_RC | MIN_RNR_TIMER),
            (UC, S::Rtr, S::Rts, SQ_PSN),
            (UD, S::Rtr, S::Rts, SQ_PSN | QKEY),
            (RC, S::Rts, S::Rts, CUR_STATE | MIN_RNR_TIMER),
            (RC, S::Rts, S::Sqd, EN_SQD_ASYNC_NOTIFY),
            (RC, S::Sqd, S::Sqd, AV | TIMEOUT | MAX_DEST_RD_ATOMIC),
            (UD, S::Sqe, S::Rts, CUR_STATE),
            (UC, S::Sqd, S::Err, 0),
        ];
        for (t, from, to, mask) in ok {
            assert_eq!(reason(t, from, to, mask), "", "{t:?} {from:?} -> {to:?}");
        }
    }

    #[test]
    fn missing_attributes_are_named() {
        let r = reason(RC, S::Init, S::Rtr, RTR_RC & !DEST_QPN);
        assert_eq!(r, "missing IBV_QP_DEST_QPN for Rc");
        let r = reason(RC, S::Reset, S::Init, PORT);
        assert_eq!(r, "missing IBV_QP_ACCESS_FLAGS, IBV_QP_PKEY_INDEX for Rc");
        assert!(reason(UD, S::Reset, S::Init, INIT_RC).contains("missing IBV_QP_QKEY"));
        let r = reason(RC, S::Rtr, S::Rts, SQ_PSN);
        assert!(r.contains("IBV_QP_TIMEOUT") && r.contains("IBV_QP_MAX_QP_RD_ATOMIC"));
        assert_eq!(
            reason(UC, S::Rtr, S::Rts, 0),
            "missing IBV_QP_SQ_PSN for Uc"
        );
        assert_eq!(
            reason(UD, S::Rtr, S::Rts, 0),
            "missing IBV_QP_SQ_PSN for Ud"
        );
    }

    #[test]
    fn forbidden_attributes_are_named() {
        // UC has no RDMA-read resources, UD no path, RC no Q_Key.
        let r = reason(UC, S::Init, S::Rtr, RTR_UC | MAX_DEST_RD_ATOMIC);
        assert_eq!(r, "IBV_QP_MAX_DEST_RD_ATOMIC not allowed here for Uc");
        assert!(reason(UD, S::Init, S::Rtr, AV).contains("IBV_QP_AV not allowed"));
        let r = reason(UD, S::Reset, S::Init, INIT_UD | ACCESS_FLAGS);
        assert!(r.contains("IBV_QP_ACCESS_FLAGS not allowed"));
        assert!(reason(RC, S::Reset, S::Init, INIT_RC | QKEY).contains("IBV_QP_QKEY"));
        // CUR_STATE only from RTR, RTS, SQD, SQE; nothing extra on ERR.
        assert!(check(RC, S::Init, S::Init, CUR_STATE).is_err());
        assert!(check(RC, S::Rts, S::Err, TIMEOUT).is_err());
        // Unknown mask bits are named in hex.
        assert!(reason(RC, S::Rts, S::Rts, 1 << 30).contains("0x40000000"));
    }

    #[test]
    fn transition_table() {
        let all = [S::Reset, S::Init, S::Rtr, S::Rts, S::Sqd, S::Sqe, S::Err];
        for t in [RC, UC, UD] {
            for (from, to) in all.into_iter().flat_map(|f| all.map(|t| (f, t))) {
                let expected = match (from, to) {
                    (S::Reset, S::Err) => false,
                    (_, S::Reset | S::Err) => true,
                    (S::Reset, S::Init) | (S::Init, S::Init | S::Rtr) => true,
                    (S::Rtr | S::Rts | S::Sqd, S::Rts) | (S::Rts | S::Sqd, S::Sqd) => true,
                    (S::Sqe, S::Rts) => t != RC,
                    _ => false,
                };
                let legal = rule(t, from, to).is_ok();
                assert_eq!(legal, expected, "{t:?} {from:?} -> {to:?}");
            }
        }
        assert!(reason(RC, S::Reset, S::Rts, RTS_RC).contains("no such transition"));
        assert!(reason(RC, S::Sqe, S::Rts, 0).contains("no SQE state"));
        assert!(reason(RC, S::Unknown(9), S::Reset, 0).contains("unknown"));
        assert!(reason(UD, S::Reset, S::Err, 0).contains("from RESET"));
        let raw = check(QpType::RawPacket, S::Reset, S::Init, PORT);
        assert!(matches!(raw, Err(Error::Unsupported(_))));
    }
}
