//! The code the example programs share, as a library: the ping-pongs'
//! rdma-core-compatible exchange and loop ([`pingpong`]) and the
//! perftest-style tools' options, setup, streaming engine, statistics and
//! reports ([`perf`]), and the fault-injection data mover ([`fault`], the
//! `fault_peer` binary of `cargo xtask faults`), the soak's data mover
//! ([`soak`], the `soak_peer` binary of `cargo xtask soak`) and the
//! validation options' checks ([`integrity`]). Each program in this crate's `examples/` is a thin
//! `main` over it; the device tests and the fuzz targets use it too.

// The repository's front page compiles: its example is a `no_run` doctest
// here, in the workspace (the published crates' packages do not hold it).
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
struct ReadmeDoctests;

pub mod done;
pub mod fault;
pub mod integrity;
pub mod perf;
pub mod pingpong;
pub mod soak;

pub use done::Done;

use std::os::fd::RawFd;

/// Waits up to `timeout_ms` (-1: no limit) for `fd` to be readable:
/// `Ok(false)` on timeout or a signal. The library lends its event
/// descriptors only as raw fds (no `AsFd`: safe code must not read them),
/// and `poll(2)` only looks at readiness.
pub fn wait_readable(fd: RawFd, timeout_ms: i32) -> std::io::Result<bool> {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, alive for the call; poll reads no data.
    let n = unsafe { libc::poll(&mut pfd, 1, timeout_ms) };
    if n < 0 {
        let e = std::io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::EINTR) => Ok(false),
            _ => Err(e),
        };
    }
    Ok(n > 0)
}
