//! The teaching examples of the published crates (`ibverbs/examples/` of
//! `rdma-verbs`, `ibverbs-tokio/examples/` of `rdma-verbs-tokio`) run
//! against the device: each must exit 0 and print the line that says its
//! checks passed; each must refuse a device that does not exist with a
//! message and exit status 1, without a panic.
//!
//! Device tests (`#[ignore = "needs an RDMA device"]`): they spawn the
//! example binaries from `target/<profile>/examples/`, which `cargo xtask
//! test` builds first (`cargo build -p rdma-verbs -p rdma-verbs-tokio
//! --examples` by hand). The device is `IBVERBS_TEST_DEVICE`, passed as
//! the examples' argument; without it they pick the first active port.

mod common;

use std::time::Duration;

use common::{example_bin, process};

/// Every teaching example and a line it prints only once its checks passed.
const EXAMPLES: [(&str, &str); 7] = [
    ("open_device", "default GID index for port"),
    ("connect", "states after connecting: Rts, Rts"),
    (
        "send_recv",
        "sent 4 and received 4 messages of 4096 bytes, every byte checked",
    ),
    (
        "write_read",
        "RDMA read: 4096 bytes read back, every byte checked",
    ),
    ("atomics", "counter is 100: every atomic checked"),
    ("event_loop", "B: 8 messages received and checked"),
    (
        "tokio",
        "sent and received 4 messages of 4096 bytes with async/await, every byte checked",
    ),
];

fn run(name: &str, args: &[String]) -> process::Finished {
    process::spawn(&example_bin(name), args).finish(Duration::from_secs(60))
}

fn runs_and_checks(name: &str) {
    let (_, line) = EXAMPLES.iter().find(|(n, _)| *n == name).unwrap();
    let _dev = common::device(); // fails the test without a device
    let args: Vec<String> = std::env::var("IBVERBS_TEST_DEVICE").into_iter().collect();
    let out = run(name, &args);
    eprintln!("{}", out.describe()); // shown with --nocapture
    out.assert_success();
    assert!(
        out.stdout.contains(line),
        "{name}: expected {line:?} in stdout\n{}",
        out.describe()
    );
    assert!(!out.stderr.contains("panicked"), "{}", out.describe());
}

#[test]
#[ignore = "needs an RDMA device"]
fn examples_open_device() {
    runs_and_checks("open_device");
}

#[test]
#[ignore = "needs an RDMA device"]
fn examples_connect() {
    runs_and_checks("connect");
}

#[test]
#[ignore = "needs an RDMA device"]
fn examples_send_recv() {
    runs_and_checks("send_recv");
}

#[test]
#[ignore = "needs an RDMA device"]
fn examples_write_read() {
    runs_and_checks("write_read");
}

#[test]
#[ignore = "needs an RDMA device"]
fn examples_atomics() {
    runs_and_checks("atomics");
}

#[test]
#[ignore = "needs an RDMA device"]
fn examples_event_loop() {
    runs_and_checks("event_loop");
}

#[test]
#[ignore = "needs an RDMA device"]
fn examples_tokio() {
    runs_and_checks("tokio");
}

#[test]
#[ignore = "needs an RDMA device"]
fn examples_refuse_an_unknown_device_with_a_message() {
    for (name, _) in EXAMPLES {
        let out = run(name, &["no_such_rdma_device".to_string()]);
        out.assert_failure(&format!(
            "{name}: no RDMA device named \"no_such_rdma_device\""
        ));
        assert_eq!(
            out.status.and_then(|s| s.code()),
            Some(1),
            "{}",
            out.describe()
        );
        assert!(!out.stderr.contains("panicked"), "{}", out.describe());
    }
}
