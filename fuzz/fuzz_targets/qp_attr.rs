//! `QpAttr::validate` and `QpState::check_transition` with arbitrary attributes,
//! QP types and states (including values no C enum has): never a panic;
//! only the documented error variants; whatever `validate` accepts fits its
//! wire fields and passes the state table on its own.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use rdma_verbs::sys::ibv_qp_attr_mask as M;
use rdma_verbs::{
    device::{GidIndex, Mtu},
    qp::{AddressVector, PathMigState, QpAttr, QpNumber},
    AccessFlags, Error, Gid, PortNumber, QpState, QpType,
};

#[derive(Arbitrary, Debug)]
struct Av {
    roce: bool,
    port: u8,
    dgid: [u8; 16],
    sgid_index: u8,
    dlid: u16,
    sl: u8,
    flow_label: u32,
    hop_limit: u8,
    traffic_class: u8,
    static_rate: u8,
    src_path_bits: u8,
}

impl Av {
    fn build(&self) -> AddressVector {
        let av = if self.roce {
            AddressVector::roce(
                PortNumber(self.port),
                Gid(self.dgid),
                GidIndex(self.sgid_index),
            )
        } else {
            AddressVector::infiniband(PortNumber(self.port), self.dlid)
        };
        av.sl(self.sl)
            .flow_label(self.flow_label)
            .hop_limit(self.hop_limit)
            .traffic_class(self.traffic_class)
            .static_rate(self.static_rate)
            .src_path_bits(self.src_path_bits)
    }
}

#[derive(Arbitrary, Debug)]
enum Set {
    State(u32),
    CurState(u32),
    SqdNotify(bool),
    Access(u32),
    PkeyIndex(u16),
    Port(u8),
    Qkey(u32),
    Path(Av),
    PathMtu(u32),
    Timeout(u8),
    RetryCnt(u8),
    RnrRetry(u8),
    RqPsn(u32),
    MaxRdAtomic(u8),
    AltPath(Av, u16, u8),
    MinRnrTimer(u8),
    SqPsn(u32),
    MaxDestRdAtomic(u8),
    PathMig(u32),
    DestQpn(u32),
}

#[derive(Arbitrary, Debug)]
struct Input {
    qp_type: u32,
    current: u32,
    sets: Vec<Set>,
    from: u32,
    to: u32,
    mask: u32,
}

fn apply(a: QpAttr, s: &Set) -> QpAttr {
    match s {
        Set::State(v) => a.qp_state(QpState::from_raw(*v)),
        Set::CurState(v) => a.cur_qp_state(QpState::from_raw(*v)),
        Set::SqdNotify(on) => a.en_sqd_async_notify(*on),
        Set::Access(v) => a.qp_access_flags(AccessFlags::from_bits_retain(*v)),
        Set::PkeyIndex(v) => a.pkey_index(*v),
        Set::Port(v) => a.port_num(PortNumber(*v)),
        Set::Qkey(v) => a.qkey(*v),
        Set::Path(av) => a.ah_attr(av.build()),
        Set::PathMtu(v) => a.path_mtu(Mtu::from_raw(*v)),
        Set::Timeout(v) => a.timeout(*v),
        Set::RetryCnt(v) => a.retry_cnt(*v),
        Set::RnrRetry(v) => a.rnr_retry(*v),
        Set::RqPsn(v) => a.rq_psn(*v),
        Set::MaxRdAtomic(v) => a.max_rd_atomic(*v),
        Set::AltPath(av, pkey, timeout) => a.alt_path(av.build(), *pkey, *timeout),
        Set::MinRnrTimer(v) => a.min_rnr_timer(*v),
        Set::SqPsn(v) => a.sq_psn(*v),
        Set::MaxDestRdAtomic(v) => a.max_dest_rd_atomic(*v),
        Set::PathMig(v) => a.path_mig_state(PathMigState::from_raw(*v)),
        Set::DestQpn(v) => a.dest_qp_num(QpNumber(*v)),
    }
}

/// Only the variants `QpState::check_transition` and `validate` document.
fn check_error(e: &Error) {
    assert!(
        matches!(
            e,
            Error::OutOfRange { .. }
                | Error::InvalidMtu { .. }
                | Error::InvalidTransition { .. }
                | Error::Unsupported(_)
        ),
        "{e:?}"
    );
    assert!(!e.to_string().is_empty());
}

fuzz_target!(|i: Input| {
    let qp_type = QpType::from_raw(i.qp_type);
    let current = QpState::from_raw(i.current);
    let attr = i.sets.iter().fold(QpAttr::new(), apply);
    let _ = format!("{attr:?}");
    let mask = attr.mask().0;
    let raw = *attr.as_raw();
    let has = |bit: M| mask & bit.0 != 0;

    match attr.validate(qp_type, current) {
        Ok(()) => {
            assert!(matches!(qp_type, QpType::Rc | QpType::Uc | QpType::Ud));
            for (bit, v, bits) in [
                (M::IBV_QP_RQ_PSN, raw.rq_psn, 24),
                (M::IBV_QP_SQ_PSN, raw.sq_psn, 24),
                (M::IBV_QP_DEST_QPN, raw.dest_qp_num, 24),
                (M::IBV_QP_TIMEOUT, raw.timeout.into(), 5),
                (M::IBV_QP_RETRY_CNT, raw.retry_cnt.into(), 3),
                (M::IBV_QP_RNR_RETRY, raw.rnr_retry.into(), 3),
                (M::IBV_QP_MIN_RNR_TIMER, raw.min_rnr_timer.into(), 5),
            ] {
                assert!(!has(bit) || v >> bits == 0, "{bit:?} = {v:#x} accepted");
            }
            if has(M::IBV_QP_PATH_MTU) {
                assert!(!matches!(Mtu::from_raw(raw.path_mtu), Mtu::Unknown(_)));
            }
            if has(M::IBV_QP_AV) {
                assert!(raw.ah_attr.sl <= 15);
            }
            // The transition it checked passes the table on its own.
            let from = if has(M::IBV_QP_CUR_STATE) {
                QpState::from_raw(raw.cur_qp_state)
            } else {
                current
            };
            let to = if has(M::IBV_QP_STATE) {
                QpState::from_raw(raw.qp_state)
            } else {
                from
            };
            from.check_transition(to, qp_type, attr.mask())
                .unwrap_or_else(|e| panic!("validate passed, the table does not: {e}"));
        }
        Err(e) => check_error(&e),
    }

    // The table alone, with any states and mask bits.
    let (from, to) = (QpState::from_raw(i.from), QpState::from_raw(i.to));
    match from.check_transition(to, qp_type, M(i.mask)) {
        Ok(()) => {
            assert!(matches!(qp_type, QpType::Rc | QpType::Uc | QpType::Ud));
            assert!(!matches!(from, QpState::Unknown(_)) && !matches!(to, QpState::Unknown(_)));
            // IBV_QP_STATE is always allowed; an unknown bit never is.
            from.check_transition(to, qp_type, M(i.mask | M::IBV_QP_STATE.0))
                .unwrap();
            let unknown = from.check_transition(to, qp_type, M(i.mask | 1 << 31));
            assert!(
                matches!(unknown, Err(Error::InvalidTransition { .. })),
                "{unknown:?}"
            );
        }
        Err(e) => check_error(&e),
    }
});
