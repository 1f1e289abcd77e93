//! The ping-pong address message from the peer (`tools/src/pingpong/wire.rs`,
//! rdma-core's `"%04x:%06x:%06x:%s"` format): `decode` never panics and what
//! it accepts re-encodes to a message that decodes to the same address;
//! `encode` output always decodes; `format_gid` writes exactly what glibc's
//! `inet_ntop` writes, and std parses it back to the same bytes.
#![no_main]

use rdma_verbs_tools::pingpong::wire;

use std::ffi::CStr;
use std::net::Ipv6Addr;

use libfuzzer_sys::fuzz_target;
use wire::{Dest, MAX_24, MSG_LEN};

fn check_decoded(msg: &[u8]) {
    match wire::decode(msg) {
        Ok(d) => {
            assert_eq!(msg.len(), MSG_LEN);
            assert!(msg.contains(&0), "accepted without a NUL");
            assert!(d.qpn <= MAX_24 && d.psn <= MAX_24, "{d:?}");
            let again = wire::encode(&d).expect("a decoded address encodes");
            assert_eq!(wire::decode(&again), Ok(d));
        }
        Err(e) => assert!(!e.to_string().is_empty()),
    }
}

extern "C" {
    /// `arpa/inet.h` (not in the libc crate).
    fn inet_ntop(
        af: libc::c_int,
        src: *const libc::c_void,
        dst: *mut libc::c_char,
        size: libc::socklen_t,
    ) -> *const libc::c_char;
}

fn glibc_ntop(gid: &[u8; 16]) -> String {
    let mut buf = [0 as libc::c_char; 64];
    // SAFETY: `gid` is a 16-byte in6_addr; `buf` has room for
    // INET6_ADDRSTRLEN (46) bytes.
    let p = unsafe {
        inet_ntop(
            libc::AF_INET6,
            gid.as_ptr().cast(),
            buf.as_mut_ptr(),
            buf.len() as libc::socklen_t,
        )
    };
    assert!(!p.is_null());
    // SAFETY: inet_ntop wrote a NUL-terminated string into `buf`.
    unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

fuzz_target!(|data: &[u8]| {
    check_decoded(data);
    // The same bytes as one message (cut or NUL-padded to 52 bytes), so
    // that every input reaches the field parsers.
    let mut msg = [0u8; MSG_LEN];
    let n = data.len().min(MSG_LEN);
    msg[..n].copy_from_slice(&data[..n]);
    check_decoded(&msg);

    assert_eq!(wire::check_done(data).is_ok(), data == wire::DONE);

    if data.len() >= 26 {
        let d = Dest {
            lid: u16::from_le_bytes([data[0], data[1]]),
            qpn: u32::from_le_bytes(data[2..6].try_into().unwrap()),
            psn: u32::from_le_bytes(data[6..10].try_into().unwrap()),
            gid: data[10..26].try_into().unwrap(),
        };
        match wire::encode(&d) {
            Ok(m) => {
                assert!(d.qpn <= MAX_24 && d.psn <= MAX_24);
                assert_eq!(m[MSG_LEN - 1], 0);
                assert_eq!(wire::decode(&m), Ok(d));
            }
            Err(e) => {
                assert!(d.qpn > MAX_24 || d.psn > MAX_24, "{d:?}: {e}");
            }
        }
        let text = wire::format_gid(&d.gid);
        assert_eq!(text, glibc_ntop(&d.gid), "{:02x?}", d.gid);
        assert_eq!(text.parse::<Ipv6Addr>().map(|a| a.octets()), Ok(d.gid));
    }
});
