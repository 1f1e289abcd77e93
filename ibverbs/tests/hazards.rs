//! The compile-time half of the ownership model: each file of `tests/ui/`
//! is code the compiler must reject, and its `.stderr` the exact diagnostic
//! (error code and line). A proof that starts failing for another reason (a
//! typo, a renamed method) no longer matches, and this test fails.
//!
//! After a toolchain change, `TRYBUILD=overwrite cargo test -p rdma-verbs --test
//! hazards` regenerates the `.stderr` files; read each one to confirm it is
//! still the intended error.

#[test]
fn hazards_do_not_compile() {
    trybuild::TestCases::new().compile_fail("tests/ui/*.rs");
}

/// The proofs about rdma_cm objects (the `rdmacm` feature).
#[cfg(feature = "rdmacm")]
#[test]
fn rdmacm_hazards_do_not_compile() {
    trybuild::TestCases::new().compile_fail("tests/ui-rdmacm/*.rs");
}
