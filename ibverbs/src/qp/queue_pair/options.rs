//! Which send-request options each operation takes on each queue pair
//! type: DESIGN.md's request-option table, as one pure function.
//!
//! Every posting path (the typed posts of [`SendQueue`](crate::SendQueue),
//! chains, [`PreparedSend`](crate::qp::PreparedSend), the extended `ibv_wr_*`
//! path) runs it through `check_send` before the provider sees a request.
//! The table matters for memory safety, not only for tidiness: an inline
//! RDMA read or atomic makes rxe treat the *contents* of the result buffer
//! as its scatter list, so the read response lands wherever those bytes
//! point (the first entry of DESIGN.md's threat model).

use crate::error::{Error, Result};
use crate::types::{QpType, RequestOption, SendOp};

/// The options a request asks for, besides its operation and buffers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Asked {
    /// `IBV_SEND_INLINE`, or inline data.
    pub(super) inline: bool,
    /// Immediate data.
    pub(super) imm: bool,
    /// `IBV_SEND_SOLICITED`.
    pub(super) solicited: bool,
    /// `IBV_SEND_FENCE`.
    pub(super) fence: bool,
    /// A remote key to invalidate.
    pub(super) invalidate: bool,
    /// A UD destination.
    pub(super) ud: bool,
    /// A remote XRC SRQ number.
    pub(super) xrc: bool,
}

/// Whether `op` exists on a `ty` queue pair: RC (and an XRC send queue
/// pair, XRC's initiator) has every operation, UC sends and RDMA writes,
/// UD sends (IBA 9.8.3, table 38's opcodes).
pub(super) fn op_available(op: SendOp, ty: QpType) -> bool {
    match ty {
        QpType::Rc | QpType::XrcSend => true,
        QpType::Uc => matches!(op, SendOp::Send | SendOp::RdmaWrite),
        QpType::Ud => op == SendOp::Send,
        _ => false,
    }
}

/// Checks `asked` against `op` on a `ty` queue pair. The rules:
/// * inline data and immediate data only on sends and RDMA writes (the
///   operations that carry data *to* the peer); never on reads or atomics,
///   whose local buffer the device writes;
/// * `IBV_SEND_SOLICITED` only where the peer gets a receive completion: a
///   send, or an RDMA write with immediate data;
/// * a remote key to invalidate only on an RC send without immediate data
///   (IBA has no UC or UD send-with-invalidate opcode, and no opcode with
///   both);
/// * a remote XRC SRQ exactly on XRC send queue pairs;
/// * a UD destination exactly on UD queue pairs;
/// * `IBV_SEND_FENCE` on anything (it only orders the request after
///   earlier reads and atomics).
///
/// # Errors
/// [`Error::OpNotAvailable`], [`Error::OptionNotAllowed`] or
/// [`Error::OptionRequired`], naming the first offending option in the
/// order above.
pub(super) fn check_options(op: SendOp, ty: QpType, asked: Asked) -> Result<()> {
    if !op_available(op, ty) {
        return Err(Error::OpNotAvailable { op, qp_type: ty });
    }
    let not_allowed = |option| {
        Err(Error::OptionNotAllowed {
            option,
            op,
            qp_type: ty,
        })
    };
    let carries_data = matches!(op, SendOp::Send | SendOp::RdmaWrite);
    if asked.inline && !carries_data {
        return not_allowed(RequestOption::Inline);
    }
    if asked.imm && !carries_data {
        return not_allowed(RequestOption::Immediate);
    }
    let peer_completes = op == SendOp::Send || (op == SendOp::RdmaWrite && asked.imm);
    if asked.solicited && !peer_completes {
        return not_allowed(RequestOption::Solicited);
    }
    if asked.invalidate && (op != SendOp::Send || ty != QpType::Rc) {
        return not_allowed(RequestOption::Invalidate);
    }
    if asked.invalidate && asked.imm {
        // A send with immediate data has no invalidating twin.
        return not_allowed(RequestOption::Immediate);
    }
    match (asked.xrc, ty == QpType::XrcSend) {
        (true, false) => return not_allowed(RequestOption::XrcSrq),
        (false, true) => {
            return Err(Error::OptionRequired {
                option: RequestOption::XrcSrq,
                op,
                qp_type: ty,
            })
        }
        _ => {}
    }
    match (asked.ud, ty == QpType::Ud) {
        (true, false) => not_allowed(RequestOption::UdDestination),
        (false, true) => Err(Error::OptionRequired {
            option: RequestOption::UdDestination,
            op,
            qp_type: ty,
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OPS: [SendOp; 7] = [
        SendOp::Send,
        SendOp::RdmaWrite,
        SendOp::RdmaRead,
        SendOp::CompareAndSwap,
        SendOp::FetchAndAdd,
        SendOp::AtomicWrite,
        SendOp::Flush,
    ];
    const TYPES: [QpType; 4] = [QpType::Rc, QpType::Uc, QpType::Ud, QpType::XrcSend];

    fn asked(bits: u8) -> Asked {
        Asked {
            inline: bits & 1 != 0,
            imm: bits & 2 != 0,
            solicited: bits & 4 != 0,
            fence: bits & 8 != 0,
            invalidate: bits & 16 != 0,
            ud: bits & 32 != 0,
            xrc: bits & 64 != 0,
        }
    }

    /// The table written out cell by cell, independently of `check_options`:
    /// whether `op` on `ty` may carry `option` (assuming the rest is valid).
    fn allowed(op: SendOp, ty: QpType, option: RequestOption, imm: bool) -> bool {
        use RequestOption as S;
        use SendOp as O;
        match option {
            S::Inline | S::Immediate => matches!(op, O::Send | O::RdmaWrite),
            S::Solicited => op == O::Send || (op == O::RdmaWrite && imm),
            S::Fence => true,
            S::Invalidate => op == O::Send && ty == QpType::Rc && !imm,
            S::UdDestination => ty == QpType::Ud,
            S::XrcSrq => ty == QpType::XrcSend,
        }
    }

    #[test]
    fn every_cell_of_the_table() {
        // Every operation × QP type × combination of the seven options.
        let mut refused = 0;
        for op in OPS {
            for ty in TYPES {
                for bits in 0..128u8 {
                    let a = asked(bits);
                    let got = check_options(op, ty, a);
                    let expect_ok = op_available(op, ty)
                        && (!a.inline || allowed(op, ty, RequestOption::Inline, a.imm))
                        && (!a.imm || allowed(op, ty, RequestOption::Immediate, a.imm))
                        && (!a.solicited || allowed(op, ty, RequestOption::Solicited, a.imm))
                        && (!a.invalidate || allowed(op, ty, RequestOption::Invalidate, a.imm))
                        && a.ud == (ty == QpType::Ud)
                        && a.xrc == (ty == QpType::XrcSend);
                    assert_eq!(
                        got.is_ok(),
                        expect_ok,
                        "{op:?} on {ty:?} with {a:?}: {got:?}"
                    );
                    if let Err(e) = got {
                        refused += 1;
                        match e {
                            Error::OpNotAvailable { op: o, qp_type } => {
                                assert_eq!((o, qp_type), (op, ty));
                                assert!(!op_available(op, ty));
                            }
                            Error::OptionNotAllowed {
                                option,
                                op: o,
                                qp_type,
                            } => {
                                assert_eq!((o, qp_type), (op, ty));
                                let set = match option {
                                    RequestOption::Inline => a.inline,
                                    RequestOption::Immediate => a.imm,
                                    RequestOption::Solicited => a.solicited,
                                    RequestOption::Fence => a.fence,
                                    RequestOption::Invalidate => a.invalidate,
                                    RequestOption::UdDestination => a.ud,
                                    RequestOption::XrcSrq => a.xrc,
                                };
                                assert!(set, "{option:?} blamed but not asked: {a:?}");
                            }
                            Error::OptionRequired { option, .. } => match option {
                                RequestOption::UdDestination => assert!(ty == QpType::Ud && !a.ud),
                                RequestOption::XrcSrq => assert!(ty == QpType::XrcSend && !a.xrc),
                                o => panic!("{o:?} required"),
                            },
                            e => panic!("unexpected {e:?}"),
                        }
                    }
                }
            }
        }
        assert!(refused > 0);
    }

    #[test]
    fn the_reported_holes() {
        // The critical finding: inline on an RDMA read or an atomic.
        for op in [
            SendOp::RdmaRead,
            SendOp::CompareAndSwap,
            SendOp::FetchAndAdd,
            SendOp::AtomicWrite,
            SendOp::Flush,
        ] {
            let inline = Asked {
                inline: true,
                ..Asked::default()
            };
            assert!(matches!(
                check_options(op, QpType::Rc, inline),
                Err(Error::OptionNotAllowed {
                    option: RequestOption::Inline,
                    ..
                })
            ));
        }
        let plain = Asked::default();
        assert!(check_options(SendOp::RdmaRead, QpType::Rc, plain).is_ok());
        assert!(check_options(SendOp::RdmaRead, QpType::Uc, plain).is_err());
        let msg = check_options(
            SendOp::RdmaRead,
            QpType::Rc,
            Asked {
                inline: true,
                ..plain
            },
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            msg,
            "IBV_SEND_INLINE is not allowed on RDMA read (Rc queue pair)"
        );
    }
}
