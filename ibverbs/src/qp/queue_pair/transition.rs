//! The IBA queue pair state machine: which attributes each transition
//! requires and allows, checked by [`QpState::check_transition`] before every
//! [`QueuePair::modify`](crate::QueuePair::modify).

use rdma_verbs_sys as sys;
use sys::ibv_qp_attr_mask as M;

use crate::error::{Error, Result, TransitionReason};
use crate::types::{QpState, QpType};

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
pub(crate) fn mask_names(mask: u32) -> String {
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

/// Names the mask bits (here, where their names are).
impl std::fmt::Display for TransitionReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TransitionReason::NoSuchTransition => {
                f.write_str("the IBA state table has no such transition")
            }
            TransitionReason::Missing(m) => write!(f, "missing {}", mask_names(m.0)),
            TransitionReason::NotAllowed(m) => write!(f, "{} not allowed here", mask_names(m.0)),
            TransitionReason::ClaimedState(s) => {
                write!(
                    f,
                    "cur_qp_state claims {s:?}, which is not the queue pair's state"
                )
            }
        }
    }
}

/// The row of the IBA QP state transition table (the kernel's
/// `qp_state_table`, `ib_modify_qp_is_ok`) for RC, UC and UD queue pairs:
/// `(required, optional)` attributes (`IBV_QP_STATE` is always allowed), or
/// `None` when the transition itself is illegal (the comments say why).
fn rule(t: QpType, from: QpState, to: QpState) -> Option<(u32, u32)> {
    use QpState as S;
    use QpType as T;
    if !matches!(t, T::Rc | T::Uc | T::Ud) {
        // Not in the state table.
        return None;
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
    Some(match (from, to) {
        (S::Unknown(_), _) | (_, S::Unknown(_)) => return None,
        (_, S::Reset) => (0, 0),
        // From RESET only INIT (or RESET) is allowed.
        (S::Reset, S::Err) => return None,
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
            // RC queue pairs have no SQE state (errors lead to ERR).
            T::Rc => return None,
            T::Uc => (0, CUR_STATE | ACCESS_FLAGS),
            _ => (0, CUR_STATE | QKEY),
        },
        _ => return None,
    })
}

impl QpState {
    /// Checks a modify of a `qp_type` queue pair from this state to state `to`
    /// with attribute mask `mask` against the IBA state transition table (as
    /// the kernel's `ib_modify_qp_is_ok` does): the transition must exist, every
    /// attribute it requires must be in `mask`, and nothing it does not allow.
    ///
    /// Pure: no device needed. [`QueuePair::modify`](crate::QueuePair::modify) calls it with the QP's
    /// current state.
    ///
    /// # Errors
    /// [`Error::InvalidTransition`] with its [`TransitionReason`]: no such
    /// transition, or the missing or forbidden `IBV_QP_*` attributes (the
    /// Display names them: `missing IBV_QP_DEST_QPN`);
    /// [`Error::Unsupported`] for QP types other than RC, UC and UD.
    ///
    /// # References
    /// `ibv_modify_qp(3)`; InfiniBand Architecture Specification vol. 1,
    /// "QP State Transition" tables.
    pub fn check_transition(
        self,
        to: QpState,
        qp_type: QpType,
        mask: sys::ibv_qp_attr_mask,
    ) -> Result<()> {
        let from = self;
        if !matches!(qp_type, QpType::Rc | QpType::Uc | QpType::Ud) {
            return Err(Error::Unsupported(
                "state checks for queue pair types other than RC, UC and UD",
            ));
        }
        let invalid = |reason| Error::InvalidTransition { from, to, reason };
        let (required, optional) =
            rule(qp_type, from, to).ok_or(invalid(TransitionReason::NoSuchTransition))?;
        let missing = required & !mask.0;
        if missing != 0 {
            return Err(invalid(TransitionReason::Missing(M(missing))));
        }
        let forbidden = mask.0 & !(required | optional | STATE);
        if forbidden != 0 {
            return Err(invalid(TransitionReason::NotAllowed(M(forbidden))));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use QpState as S;
    use QpType::{Rc as RC, Uc as UC, Ud as UD};

    fn check(t: QpType, from: QpState, to: QpState, mask: u32) -> Result<()> {
        from.check_transition(to, t, M(mask | STATE))
    }

    /// The reason of an `InvalidTransition` (`None` when the check passed).
    #[track_caller]
    fn reason(t: QpType, from: QpState, to: QpState, mask: u32) -> Option<TransitionReason> {
        match check(t, from, to, mask) {
            Ok(()) => None,
            Err(Error::InvalidTransition { reason, .. }) => Some(reason),
            Err(e) => panic!("expected InvalidTransition, got {e:?}"),
        }
    }

    fn missing(mask: u32) -> Option<TransitionReason> {
        Some(TransitionReason::Missing(M(mask)))
    }

    fn not_allowed(mask: u32) -> Option<TransitionReason> {
        Some(TransitionReason::NotAllowed(M(mask)))
    }

    const NO_SUCH: Option<TransitionReason> = Some(TransitionReason::NoSuchTransition);

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
            assert_eq!(reason(t, from, to, mask), None, "{t:?} {from:?} -> {to:?}");
        }
    }

    #[test]
    fn missing_attributes_are_named() {
        let r = reason(RC, S::Init, S::Rtr, RTR_RC & !DEST_QPN);
        assert_eq!(r, missing(DEST_QPN));
        assert_eq!(r.unwrap().to_string(), "missing IBV_QP_DEST_QPN");
        let r = reason(RC, S::Reset, S::Init, PORT);
        assert_eq!(r, missing(ACCESS_FLAGS | PKEY_INDEX));
        assert_eq!(
            r.unwrap().to_string(),
            "missing IBV_QP_ACCESS_FLAGS, IBV_QP_PKEY_INDEX"
        );
        // UD's RESET -> INIT needs the Q_Key and takes no access flags.
        assert_eq!(reason(UD, S::Reset, S::Init, INIT_RC), missing(QKEY));
        let r = reason(RC, S::Rtr, S::Rts, SQ_PSN);
        assert_eq!(
            r,
            missing(TIMEOUT | RETRY_CNT | RNR_RETRY | MAX_QP_RD_ATOMIC)
        );
        assert_eq!(reason(UC, S::Rtr, S::Rts, 0), missing(SQ_PSN));
        assert_eq!(reason(UD, S::Rtr, S::Rts, 0), missing(SQ_PSN));
    }

    #[test]
    fn forbidden_attributes_are_named() {
        // UC has no RDMA-read resources, UD no path, RC no Q_Key.
        let r = reason(UC, S::Init, S::Rtr, RTR_UC | MAX_DEST_RD_ATOMIC);
        assert_eq!(r, not_allowed(MAX_DEST_RD_ATOMIC));
        assert_eq!(
            r.unwrap().to_string(),
            "IBV_QP_MAX_DEST_RD_ATOMIC not allowed here"
        );
        assert_eq!(reason(UD, S::Init, S::Rtr, AV), not_allowed(AV));
        let r = reason(UD, S::Reset, S::Init, INIT_UD | ACCESS_FLAGS);
        assert_eq!(r, not_allowed(ACCESS_FLAGS));
        let r = reason(RC, S::Reset, S::Init, INIT_RC | QKEY);
        assert_eq!(r, not_allowed(QKEY));
        // CUR_STATE only from RTR, RTS, SQD, SQE; nothing extra on ERR.
        assert!(check(RC, S::Init, S::Init, CUR_STATE).is_err());
        assert!(check(RC, S::Rts, S::Err, TIMEOUT).is_err());
        // Unknown mask bits are named in hex.
        let r = reason(RC, S::Rts, S::Rts, 1 << 30);
        assert_eq!(r, not_allowed(1 << 30));
        assert_eq!(r.unwrap().to_string(), "0x40000000 not allowed here");
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
                let legal = rule(t, from, to).is_some();
                assert_eq!(legal, expected, "{t:?} {from:?} -> {to:?}");
            }
        }
        assert_eq!(reason(RC, S::Reset, S::Rts, RTS_RC), NO_SUCH);
        assert_eq!(reason(RC, S::Sqe, S::Rts, 0), NO_SUCH);
        assert_eq!(reason(RC, S::Unknown(9), S::Reset, 0), NO_SUCH);
        assert_eq!(reason(UD, S::Reset, S::Err, 0), NO_SUCH);
        let raw = check(QpType::RawPacket, S::Reset, S::Init, PORT);
        assert!(matches!(raw, Err(Error::Unsupported(_))));
    }
}
