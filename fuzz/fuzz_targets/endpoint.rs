//! `Endpoint::from_bytes` (a peer's QP number, PSN, LID and GID off the
//! wire): never a panic; what it accepts is 27 bytes of version 1 with
//! 24-bit QP number and PSN, and `to_bytes` writes it back byte for byte;
//! what it refuses is refused for a reason these bytes have.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rdma_verbs::{error::WireProblem, Endpoint, Error};

fuzz_target!(|data: &[u8]| {
    match Endpoint::from_bytes(data) {
        Ok(ep) => {
            assert_eq!(data.len(), Endpoint::WIRE_LEN);
            assert_eq!(data[0], 1);
            assert!(ep.qp_num.0 <= 0xff_ffff && ep.psn <= 0xff_ffff, "{ep:?}");
            assert_eq!(&ep.to_bytes()[..], data);
            assert_eq!(Endpoint::from_bytes(&ep.to_bytes()).ok(), Some(ep));
        }
        Err(Error::BadWireFormat {
            what: "Endpoint",
            problem,
        }) => match problem {
            WireProblem::Version { version, supported } => {
                assert_eq!((Some(&version), supported), (data.first(), 1));
                assert_ne!(version, 1);
            }
            WireProblem::Length { len, expected } => {
                assert_eq!((len, expected), (data.len(), Endpoint::WIRE_LEN));
                assert!(data.first().is_none_or(|&v| v == 1));
            }
            WireProblem::OutOfRange { field, value, max } => {
                assert_eq!(data.len(), Endpoint::WIRE_LEN);
                assert!(matches!(field, "qp_num" | "psn"), "{field}");
                assert!(value > max && max == 0xff_ffff);
            }
            other => panic!("unexpected {other:?}"),
        },
        Err(e) => panic!("unexpected error {e:?}"),
    }
});
