//! The code the example programs share, as a library: the ping-pongs'
//! rdma-core-compatible exchange and loop ([`pingpong`]) and the
//! perftest-style tools' options, setup, streaming engine, statistics and
//! reports ([`perf`]), and the fault-injection data mover ([`fault`], the
//! `fault_peer` binary of `cargo xtask faults`), the soak's data mover
//! ([`soak`], the `soak_peer` binary of `cargo xtask soak`) and the
//! validation options' checks ([`integrity`]). Each program in `examples/` is a thin `main` over it;
//! the device tests in `tests/` and the fuzz targets use it too.

pub mod fault;
pub mod integrity;
pub mod perf;
pub mod pingpong;
pub mod soak;
