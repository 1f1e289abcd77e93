#!/bin/sh
# Regenerates the committed bindings (src/bindings/) from the installed
# rdma-core headers, which must be rdma-core 44, the oldest release the crate
# supports (Debian 12's libibverbs-dev and librdmacm-dev; or point
# IBVERBS_INCLUDE_DIR at them). Needs libclang. Run after changing wrapper.h,
# the bindgen options in build.rs or the bindgen version; the tests of
# `cargo test -p rdma-verbs-sys --features bindgen` fail while they are stale.
set -eu
cd "$(dirname "$0")/.."
export IBVERBS_SYS_UPDATE_BINDINGS=1
cargo build -p rdma-verbs-sys --features bindgen
cargo build -p rdma-verbs-sys --features bindgen,rdmacm
cargo test -p rdma-verbs-sys --test dlgen
git status --short ibverbs-sys/src/bindings
