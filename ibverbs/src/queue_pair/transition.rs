//! The IBA queue pair state machine: which attributes each transition
//! requires and allows, checked by [`check_qp_transition`] before every
//! [`QueuePair::modify`](crate::QueuePair::modify).

use ibverbs_sys as sys;
use sys::ibv_qp_attr_mask as M;

use crate::error::{Error, Result};
use crate::{QpState, QpType};

/// Defines a `u32` constant per `IBV_QP_*` mask bit, and `MASK_NAMES`
/// mapping each bit to its C name (for error messages and `Debug`).
macro_rules! mask_bits {
    ($($name:ident = $c:ident),* $(,)?) => {
        $( pub(super) const $name: u32 = M::$c.0; )*
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
pub(super) const KNOWN_BITS: u32 = {
    let mut all = 0;
    let mut i = 0;
    while i < MASK_NAMES.len() {
        all |= MASK_NAMES[i].0;
        i += 1;
    }
    all
};

/// `IBV_QP_A, IBV_QP_B` (unknown bits in hex).
pub(super) fn mask_names(mask: u32) -> String {
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
/// Pure: no device needed. [`QueuePair::modify`](crate::QueuePair::modify) calls it with the QP's
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
