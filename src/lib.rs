//! The code the example programs share, as a library: the ping-pongs'
//! rdma-core-compatible exchange and loop ([`pingpong`]) and the
//! perftest-style tools' options, setup, streaming engine, statistics and
//! reports ([`perf`]). Each program in `examples/` is a thin `main` over it;
//! the device tests in `tests/` and the fuzz targets use it too.

pub mod perf;
pub mod pingpong;
