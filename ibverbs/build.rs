//! Feature detection from the version `rdma-verbs-sys` found (its `links`
//! metadata, `DEP_IBVERBS_VERSION`): verbs newer than the oldest supported
//! rdma-core are compiled in only when the installed headers have them.

fn main() {
    println!("cargo:rustc-check-cfg=cfg(ibverbs_flush)");
    println!("cargo:rerun-if-env-changed=DEP_IBVERBS_VERSION");
    let version = std::env::var("DEP_IBVERBS_VERSION").unwrap_or_default();
    // `ibv_wr_flush` and IBV_ACCESS_FLUSH_* appeared in rdma-core 45.
    if rdma_core_release(&version).is_some_and(|r| r >= 45) {
        println!("cargo:rustc-cfg=ibverbs_flush");
    }
}

/// The rdma-core release of a libibverbs version: pkg-config reports
/// `1.14.44.0` (ABI 1.14, rdma-core 44.0); an override may say `44.0`.
fn rdma_core_release(version: &str) -> Option<u32> {
    let parts: Vec<&str> = version.trim().split('.').collect();
    let idx = if parts.len() >= 3 && parts[0] == "1" {
        2
    } else {
        0
    };
    parts.get(idx)?.parse().ok()
}
