#!/bin/sh
# Regenerates the committed bindings snapshot (src/snapshot/) that docs.rs
# builds use (DOCS_RS=1, no rdma-core installed). Run after changing
# wrapper.h, build.rs, the bindgen version or the rdma-core the project
# targets; `cargo test -p rdma-verbs-sys` fails while the snapshot is stale.
set -eu
cd "$(dirname "$0")/.."
IBVERBS_SYS_UPDATE_SNAPSHOT=1 cargo build -p rdma-verbs-sys
IBVERBS_SYS_UPDATE_SNAPSHOT=1 cargo build -p rdma-verbs-sys --features rdmacm
git status --short ibverbs-sys/src/snapshot
