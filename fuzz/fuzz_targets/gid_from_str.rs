//! `Gid::from_str` (GIDs typed by users or sent by peers as text): it
//! accepts exactly what std's IPv6 or IPv4 parsers accept; whatever it
//! parses formats back to text that parses to the same GID; the text of any
//! 16 bytes parses back to them.
#![no_main]

use std::net::{Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use libfuzzer_sys::fuzz_target;
use rdma_verbs::Gid;

fuzz_target!(|data: &[u8]| {
    if let Some(bytes) = data.get(..16) {
        let g = Gid(bytes.try_into().unwrap());
        let text = g.to_string();
        assert_eq!(Gid::from_str(&text), Ok(g), "{text}");
        assert_eq!(format!("{g:?}"), format!("Gid({text})"));
        let mut back = [0u8; 16];
        back[..8].copy_from_slice(&g.subnet_prefix().to_be_bytes());
        back[8..].copy_from_slice(&g.interface_id().to_be_bytes());
        assert_eq!(back, g.0);
        assert_eq!(g.is_zero(), g == Gid::ZERO);
        if let Some(v4) = g.to_ipv4_mapped() {
            assert_eq!(Gid::from(v4), g);
        }
    }
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    let std_says = s
        .parse::<Ipv4Addr>()
        .map(Gid::from)
        .or_else(|_| s.parse::<Ipv6Addr>().map(Gid::from));
    match Gid::from_str(s) {
        Ok(g) => {
            assert_eq!(std_says, Ok(g), "{s:?}");
            let text = g.to_string();
            assert_eq!(Gid::from_str(&text), Ok(g), "{s:?} -> {text:?}");
        }
        Err(e) => {
            assert!(std_says.is_err(), "{s:?} refused ({e}) but std parses it");
            assert!(!e.to_string().is_empty());
        }
    }
});
