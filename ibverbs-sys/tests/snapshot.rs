//! The committed snapshot (used for docs.rs builds, where rdma-core is not
//! installed) must equal what bindgen generates from this machine's headers.
//! If this fails, run `ibverbs-sys/regenerate-snapshot.sh` and commit.

#[test]
fn committed_snapshot_is_current() {
    let generated = include_str!(concat!(env!("OUT_DIR"), "/bindings.rs"));
    let name = env!("IBVERBS_SYS_SNAPSHOT_NAME");
    let path = format!("{}/src/snapshot/{name}", env!("CARGO_MANIFEST_DIR"));
    let committed = std::fs::read_to_string(&path).expect("reading the snapshot");
    assert!(
        generated == committed,
        "{path} is stale: run ibverbs-sys/regenerate-snapshot.sh and commit the result"
    );
}
