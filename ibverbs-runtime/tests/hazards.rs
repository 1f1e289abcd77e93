//! The runtime blocks' compile-time proofs: each file of `tests/ui/` is
//! code the compiler must reject, and its `.stderr` the exact diagnostic.
//! After a toolchain change, `TRYBUILD=overwrite cargo test -p
//! rdma-verbs-runtime --test hazards` regenerates them; read each one.

#[test]
fn hazards_do_not_compile() {
    trybuild::TestCases::new().compile_fail("tests/ui/*.rs");
}
