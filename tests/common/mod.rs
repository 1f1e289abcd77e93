//! Shared helpers for the device tests.
//!
//! Device tests are `#[ignore = "needs an RDMA device"]`: on a host without
//! RDMA they are listed as ignored, never passed vacuously. `cargo xtask
//! test` runs them with `--ignored` inside the SoftRoCE VM (or on this host
//! with `--no-vm`), and there a missing device is a failure.
#![allow(dead_code)]

use ibverbs::{Context, GidIndex, PortNumber, PortState};

/// The device under test.
pub struct TestDevice {
    pub ctx: Context,
    pub port: PortNumber,
    pub gid_index: GidIndex,
}

/// Opens the device named by `IBVERBS_TEST_DEVICE`, or the first device
/// with an active port. Panics (fails the test) when there is none.
pub fn device() -> TestDevice {
    let list = ibverbs::devices().unwrap_or_else(|e| panic!("no RDMA device list: {e}"));
    let wanted = std::env::var("IBVERBS_TEST_DEVICE").ok();
    for dev in list.iter() {
        if let Some(name) = &wanted {
            if dev.name() != name {
                continue;
            }
        }
        let ctx = dev
            .open()
            .unwrap_or_else(|e| panic!("opening {}: {e}", dev.name()));
        let Ok(port) = ctx.active_port() else {
            if wanted.is_some() {
                panic!("{} has no active port", dev.name());
            }
            continue;
        };
        assert_eq!(ctx.query_port(port).unwrap().state(), PortState::Active);
        let gid_index = ctx.default_gid_index(port).expect("GID table");
        return TestDevice {
            ctx,
            port,
            gid_index,
        };
    }
    panic!(
        "no usable RDMA device (IBVERBS_TEST_DEVICE={wanted:?}; found {:?}). \
         Device tests need a device: run them with `cargo xtask test`.",
        list.iter().map(|d| d.name().to_owned()).collect::<Vec<_>>()
    );
}

/// Reports a capability the device lacks, by name, and says whether to go on.
/// The message is printed so that a skipped check is visible in the log.
pub fn unsupported(what: &str, err: &ibverbs::Error) {
    eprintln!("UNSUPPORTED on this device: {what}: {err}");
}
