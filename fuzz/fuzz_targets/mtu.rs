//! `Mtu::from_bytes` (an MTU given in bytes on a command line or by a
//! peer) and `Mtu::from_raw` (a device-reported value): only the five IBA
//! MTUs parse, and they round-trip; unknown raw values are kept, never UB.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rdma_verbs::device::Mtu;

fuzz_target!(|v: (u32, u32)| {
    let (bytes, raw) = v;
    match Mtu::from_bytes(bytes) {
        Some(m) => {
            assert!(matches!(bytes, 256 | 512 | 1024 | 2048 | 4096), "{bytes}");
            assert_eq!(m.bytes(), bytes);
            assert_eq!(Mtu::from_raw(m.as_raw()), m);
            assert!(!matches!(m, Mtu::Unknown(_)));
        }
        None => assert!(!matches!(bytes, 256 | 512 | 1024 | 2048 | 4096), "{bytes}"),
    }
    let m = Mtu::from_raw(raw);
    assert_eq!(m.as_raw(), raw);
    match m {
        Mtu::Unknown(v) => {
            assert_eq!(v, raw);
            assert_eq!(m.bytes(), 0);
        }
        known => assert_eq!(Mtu::from_bytes(known.bytes()), Some(known)),
    }
});
