//! The ping-pong programs' command-line values (`tools/src/pingpong`):
//! `parse_c_number` agrees with C's `strtoul(s, &end, 0)` on every string
//! C would take whole (no sign, no leading space); the range parsers
//! return only values in range; and a whole argument vector through clap
//! never panics and yields options within their documented ranges.
//!
//! Input: the argument vector, arguments separated by NUL bytes.
#![no_main]

use rdma_verbs_tools::pingpong;

use std::ffi::CString;

use clap::Parser;
use libfuzzer_sys::fuzz_target;

#[derive(Parser, Debug)]
#[command(name = "pingpong")]
struct Cli {
    #[command(flatten)]
    common: pingpong::Common,
}

/// `strtoul(s, &end, 0)` when it consumes all of `s` without overflow.
fn strtoul_whole(s: &str) -> Option<u64> {
    let c = CString::new(s).ok()?;
    let mut end: *mut libc::c_char = std::ptr::null_mut();
    // SAFETY: `c` is NUL-terminated; errno is thread-local.
    let (v, errno, end_is_nul) = unsafe {
        *libc::__errno_location() = 0;
        let v = libc::strtoul(c.as_ptr(), &mut end, 0);
        (v, *libc::__errno_location(), *end == 0)
    };
    #[allow(clippy::unnecessary_cast)] // c_ulong is not u64 everywhere
    let v = v as u64;
    (!s.is_empty() && end_is_nul && errno == 0).then_some(v)
}

fn check_value(s: &str) {
    let parsed = pingpong::parse_c_number(s);
    // C skips leading white space and takes a sign; the parser refuses both.
    let plain = s
        .bytes()
        .next()
        .is_some_and(|b| !b.is_ascii_whitespace() && b != 0x0b && b != b'+' && b != b'-');
    if plain && !s.contains('\0') {
        assert_eq!(
            parsed.as_ref().ok().copied(),
            strtoul_whole(s),
            "{s:?}: {parsed:?}"
        );
    } else {
        assert!(parsed.is_err(), "{s:?}: {parsed:?}");
    }
    if let Ok(v) = pingpong::parse_mtu(s) {
        assert!(
            rdma_verbs::device::Mtu::from_bytes(v).is_some(),
            "{s:?} -> {v}"
        );
        assert_eq!(parsed, Ok(u64::from(v)));
    }
    if let Ok(v) = pingpong::parse_positive(s) {
        assert!(v >= 1 && parsed == Ok(u64::from(v)), "{s:?} -> {v}");
    }
    if let Ok(v) = pingpong::parse_num_qp(s) {
        assert!(
            (1..pingpong::SRQ_MAX_QP as u32).contains(&v),
            "{s:?} -> {v}"
        );
    }
}

fuzz_target!(|data: &[u8]| {
    let args: Vec<String> = data
        .split(|&b| b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    for a in &args {
        check_value(a);
    }
    let argv = std::iter::once("pingpong".to_string()).chain(args);
    match Cli::try_parse_from(argv) {
        Ok(cli) => {
            let c = &cli.common;
            assert!(
                c.port >= 1 && c.rx_depth >= 1 && c.iters >= 1 && c.sl <= 15,
                "{c:?}"
            );
            assert!(c.ib_port.is_none_or(|p| p >= 1), "{c:?}");
            for secs in [c.accept_timeout, c.stall_timeout]
                .into_iter()
                .chain(c.exchange_timeout)
            {
                assert!((1..=24 * 3600).contains(&secs), "{c:?}");
            }
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
});
