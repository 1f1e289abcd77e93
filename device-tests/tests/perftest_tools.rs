//! Tests of the perftest-style example tools (their statistics are tested
//! beside `tools/src/perf/stats.rs`).
//!
//! Device tests (`#[ignore = "needs an RDMA device"]`, run by `cargo xtask
//!   test` inside the SoftRoCE VM): every tool as a server and a client
//!   process over localhost, each pair on its own TCP port, with a few
//!   iterations; the tables must have their header and one row per size,
//!   and both processes must exit 0. Also `devinfo`, `asyncwatch`, and the
//!   error paths (mismatched options, no peer).
//!
//! The tools are the example binaries next to this test's executable
//! (`target/<profile>/examples/`); build them first (`cargo build
//! --examples`, which `cargo xtask test` does). Every child process is
//! killed when its handle drops and every wait is bounded.

mod common;

use std::time::{Duration, Instant};

use common::example_bin;
use common::process::{self, Finished, Running};

// ---------------------------------------------------------------------------
// Running the example binaries.
// ---------------------------------------------------------------------------

/// Longest any tool process may run in these tests.
const PROCESS_BOUND: Duration = Duration::from_secs(180);

fn spawn(tool: &str, args: &[String]) -> Running {
    process::spawn(&example_bin(tool), args)
}

fn run(tool: &str, args: &[&str]) -> Finished {
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    spawn(tool, &args).finish(PROCESS_BOUND)
}

/// Device and GID options: the test device, and GID index 1 (the IPv4
/// RoCE v2 GID) inside the VM; elsewhere the tools pick the GID.
fn device_args() -> Vec<String> {
    let mut v = Vec::new();
    if let Ok(d) = std::env::var("IBVERBS_TEST_DEVICE") {
        v.extend(["-d".into(), d]);
    }
    if std::env::var("IBVERBS_TEST_EXPECT_GID1").is_ok() {
        v.extend(["-x".into(), "1".into()]);
    }
    v
}

/// Runs `tool` as server and client on TCP port `port` with `args`; both
/// must succeed. Returns (server, client).
fn pair(tool: &str, port: u16, args: &[&str]) -> (Finished, Finished) {
    let mut common: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    common.extend(device_args());
    common.extend([
        "-p".into(),
        port.to_string(),
        "--timeout".into(),
        "30".into(),
    ]);
    let server = spawn(tool, &common);
    let mut client_args = common.clone();
    client_args.push("localhost".into());
    // The client retries connecting until the server listens.
    let client = spawn(tool, &client_args).finish(PROCESS_BOUND);
    let server = server.finish(PROCESS_BOUND);
    assert!(
        server.success() && client.success(),
        "{tool} failed\n{}\n{}",
        server.describe(),
        client.describe()
    );
    (server, client)
}

/// The data rows of a table under `header`: (size, iterations, figures).
fn rows(out: &str, header: &str) -> Vec<(u64, u64, Vec<f64>)> {
    let mut lines = out.lines().skip_while(|l| !l.contains(header));
    assert!(
        lines.next().is_some(),
        "no table header {header:?} in\n{out}"
    );
    lines
        .map_while(|l| {
            let mut f = l.split_whitespace();
            let size = f.next()?.parse().ok()?;
            let iters = f.next()?.parse().ok()?;
            let figures = f.map(|x| x.parse().ok()).collect::<Option<Vec<f64>>>()?;
            Some((size, iters, figures))
        })
        .collect()
}

const LAT: &str = "t_typical[usec]";
const BW: &str = "BW average[MB/sec]";

/// Checks a table: one row per size in `sizes`, `iters` each, `figures`
/// finite non-negative numbers per row.
fn check_table(f: &Finished, header: &str, sizes: &[u64], iters: u64, figures: usize) {
    let rows = rows(&f.stdout, header);
    let got: Vec<u64> = rows.iter().map(|r| r.0).collect();
    assert_eq!(
        got,
        sizes,
        "sizes of the table of {}\n{}",
        f.label,
        f.describe()
    );
    for (size, n, v) in &rows {
        assert_eq!(*n, iters, "iterations in row {size} of {}", f.label);
        assert_eq!(v.len(), figures, "figures in row {size} of {}", f.label);
        assert!(
            v.iter().all(|x| x.is_finite() && *x >= 0.0),
            "bad figures in row {size} of {}\n{}",
            f.label,
            f.describe()
        );
    }
}

fn sweep(max: u64) -> Vec<u64> {
    rdma_verbs_tools::perf::stats::sizes(true, 2, max)
}

// ---------------------------------------------------------------------------
// Device tests: the tools.
// ---------------------------------------------------------------------------

#[test]
#[ignore = "needs an RDMA device"]
fn write_lat_sweep() {
    let (s, c) = pair("write_lat", 19001, &["-n", "10", "-a", "--max-size", "256"]);
    // Both sides measure a ping-pong.
    check_table(&s, LAT, &sweep(256), 10, 7);
    check_table(&c, LAT, &sweep(256), 10, 7);
    assert!(c.stdout.contains("RDMA_Write Latency Test"));
}

#[test]
#[ignore = "needs an RDMA device"]
fn write_lat_events_inline() {
    let (s, c) = pair(
        "write_lat",
        19002,
        &["-n", "10", "-s", "64", "-I", "64", "-e"],
    );
    check_table(&s, LAT, &[64], 10, 7);
    check_table(&c, LAT, &[64], 10, 7);
}

#[test]
#[ignore = "needs an RDMA device"]
fn send_lat_sweep() {
    let (s, c) = pair("send_lat", 19003, &["-n", "10", "-a", "--max-size", "256"]);
    check_table(&s, LAT, &sweep(256), 10, 7);
    check_table(&c, LAT, &sweep(256), 10, 7);
}

#[test]
#[ignore = "needs an RDMA device"]
fn send_lat_events_inline_depth() {
    let args = ["-n", "12", "-s", "32", "-I", "32", "-e", "-t", "4"];
    let (s, c) = pair("send_lat", 19004, &args);
    check_table(&s, LAT, &[32], 12, 7);
    check_table(&c, LAT, &[32], 12, 7);
}

#[test]
#[ignore = "needs an RDMA device"]
fn read_lat_sweep() {
    let (s, c) = pair("read_lat", 19005, &["-n", "10", "-a", "--max-size", "256"]);
    // The client measures; the server prints the client's results.
    check_table(&c, LAT, &sweep(256), 10, 7);
    check_table(&s, LAT, &sweep(256), 10, 7);
    assert_eq!(rows(&s.stdout, LAT), rows(&c.stdout, LAT));
}

#[test]
#[ignore = "needs an RDMA device"]
fn read_lat_raw_control() {
    let (s, c) = pair("read_lat", 19017, &["-n", "10", "-s", "64", "--raw"]);
    check_table(&c, LAT, &[64], 10, 7);
    check_table(&s, LAT, &[64], 10, 7);
}

#[test]
#[ignore = "needs an RDMA device"]
fn write_lat_raw_control() {
    // Both sizes: one inline (-I default), one not.
    let (s, c) = pair(
        "write_lat",
        19019,
        &["-n", "10", "-a", "--max-size", "1K", "--raw"],
    );
    check_table(&c, LAT, &sweep(1 << 10), 10, 7);
    check_table(&s, LAT, &sweep(1 << 10), 10, 7);
}

#[test]
#[ignore = "needs an RDMA device"]
fn send_lat_raw_control() {
    // More iterations than the send queue (-t 4): unsignaled sends and
    // reposted raw receives.
    let (s, c) = pair(
        "send_lat",
        19020,
        &["-n", "40", "-a", "--max-size", "1K", "-t", "4", "--raw"],
    );
    check_table(&c, LAT, &sweep(1 << 10), 40, 7);
    check_table(&s, LAT, &sweep(1 << 10), 40, 7);
}

#[test]
#[ignore = "needs an RDMA device"]
fn read_lat_per_request_posts() {
    let (s, c) = pair(
        "read_lat",
        19021,
        &["-n", "10", "-a", "--max-size", "256", "--per-request"],
    );
    check_table(&c, LAT, &sweep(256), 10, 7);
    check_table(&s, LAT, &sweep(256), 10, 7);
}

/// Both atomics through one of atomic_lat's other loops (`flag`), on
/// ports `first` and `first + 1`: every old value checked by the client,
/// the final word by the server.
fn atomic_lat_loop(flag: &str, first: u16) {
    for (op, port) in [("CAS", first), ("FAA", first + 1)] {
        let (s, c) = pair("atomic_lat", port, &["-A", op, "-n", "20", flag]);
        check_table(&c, LAT, &[8], 20, 7);
        assert!(
            s.stdout.contains("target word: 20 after 20 operations"),
            "{op} {flag}: {}",
            s.describe()
        );
    }
}

#[test]
#[ignore = "needs an RDMA device"]
fn atomic_lat_per_request_posts() {
    atomic_lat_loop("--per-request", 19022);
}

#[test]
#[ignore = "needs an RDMA device"]
fn atomic_lat_raw_control() {
    atomic_lat_loop("--raw", 19024);
}

#[test]
#[ignore = "needs an RDMA device"]
fn read_lat_extended_verbs() {
    let (s, c) = pair(
        "read_lat",
        19018,
        &["-n", "10", "-a", "--max-size", "256", "--extended"],
    );
    check_table(&c, LAT, &sweep(256), 10, 7);
    check_table(&s, LAT, &sweep(256), 10, 7);
}

#[test]
#[ignore = "needs an RDMA device"]
fn write_bw_sweep() {
    let args = ["-n", "32", "-a", "--max-size", "16K", "-t", "16", "-Q", "4"];
    let (s, c) = pair("write_bw", 19006, &args);
    check_table(&c, BW, &sweep(16 << 10), 32, 3);
    check_table(&s, BW, &sweep(16 << 10), 32, 3);
    assert_eq!(rows(&s.stdout, BW), rows(&c.stdout, BW));
}

#[test]
#[ignore = "needs an RDMA device"]
fn write_bw_post_list_inline_events() {
    let args = [
        "-n", "32", "-s", "128", "-I", "128", "-l", "4", "-t", "8", "-e",
    ];
    let (s, c) = pair("write_bw", 19007, &args);
    check_table(&c, BW, &[128], 32, 3);
    check_table(&s, BW, &[128], 32, 3);
}

#[test]
#[ignore = "needs an RDMA device"]
fn send_bw_sweep() {
    let args = ["-n", "32", "-a", "--max-size", "16K", "-t", "16", "-Q", "4"];
    let (s, c) = pair("send_bw", 19008, &args);
    check_table(&c, BW, &sweep(16 << 10), 32, 3);
    check_table(&s, BW, &sweep(16 << 10), 32, 3);
}

#[test]
#[ignore = "needs an RDMA device"]
fn send_bw_post_list_events() {
    let args = [
        "-n", "32", "-s", "4096", "-l", "4", "-Q", "2", "-t", "8", "-e",
    ];
    let (s, c) = pair("send_bw", 19009, &args);
    check_table(&c, BW, &[4096], 32, 3);
    check_table(&s, BW, &[4096], 32, 3);
}

#[test]
#[ignore = "needs an RDMA device"]
fn read_bw_sweep() {
    let args = ["-n", "32", "-a", "--max-size", "16K", "-t", "8"];
    let (s, c) = pair("read_bw", 19010, &args);
    check_table(&c, BW, &sweep(16 << 10), 32, 3);
    check_table(&s, BW, &sweep(16 << 10), 32, 3);
}

#[test]
#[ignore = "needs an RDMA device"]
fn read_bw_post_list_events() {
    let args = ["-n", "32", "-s", "1024", "-l", "2", "-t", "4", "-e"];
    let (s, c) = pair("read_bw", 19011, &args);
    check_table(&c, BW, &[1024], 32, 3);
    check_table(&s, BW, &[1024], 32, 3);
}

#[test]
#[ignore = "needs an RDMA device"]
fn atomic_lat_compare_and_swap() {
    let (s, c) = pair("atomic_lat", 19012, &["-A", "CAS", "-n", "20"]);
    check_table(&c, LAT, &[8], 20, 7);
    check_table(&s, LAT, &[8], 20, 7);
    assert!(c.stdout.contains("Atomic COMPARE_AND_SWAP Latency Test"));
    // Every CAS succeeded: the word counted to 20.
    assert!(
        s.stdout.contains("target word: 20 after 20 operations"),
        "{}",
        s.describe()
    );
}

#[test]
#[ignore = "needs an RDMA device"]
fn atomic_lat_fetch_and_add() {
    let (s, c) = pair("atomic_lat", 19013, &["-A", "FAA", "-n", "20", "-e"]);
    check_table(&c, LAT, &[8], 20, 7);
    check_table(&s, LAT, &[8], 20, 7);
    assert!(c.stdout.contains("Atomic FETCH_AND_ADD Latency Test"));
    assert!(
        s.stdout.contains("target word: 20 after 20 operations"),
        "{}",
        s.describe()
    );
}

// ---------------------------------------------------------------------------
// Device tests: error paths.
// ---------------------------------------------------------------------------

#[test]
#[ignore = "needs an RDMA device"]
fn mismatched_options_fail_cleanly() {
    let mut server: Vec<String> = ["-n", "20", "-p", "19014", "--timeout", "20"]
        .map(String::from)
        .to_vec();
    server.extend(device_args());
    let mut client = server.clone();
    client[1] = "10".into();
    client.push("localhost".into());
    let s = spawn("write_bw", &server);
    let c = spawn("write_bw", &client).finish(PROCESS_BOUND);
    let s = s.finish(PROCESS_BOUND);
    c.assert_failure("the peer's options differ");
    s.assert_failure("the peer's options differ");
}

#[test]
#[ignore = "needs an RDMA device"]
fn different_tools_fail_cleanly() {
    let mut args: Vec<String> = ["-n", "20", "-p", "19015", "--timeout", "20"]
        .map(String::from)
        .to_vec();
    args.extend(device_args());
    let mut client = args.clone();
    client.push("localhost".into());
    let s = spawn("write_bw", &args);
    let c = spawn("read_bw", &client).finish(PROCESS_BOUND);
    let s = s.finish(PROCESS_BOUND);
    c.assert_failure("the peer runs write_bw but this is read_bw");
    s.assert_failure("the peer runs read_bw but this is write_bw");
}

#[test]
#[ignore = "needs an RDMA device"]
fn no_peer_times_out() {
    let mut args: Vec<String> = ["-p", "19016", "--timeout", "1"].map(String::from).to_vec();
    args.extend(device_args());
    let s = spawn("write_lat", &args).finish(PROCESS_BOUND);
    s.assert_failure("no client connected to TCP port 19016");
    args.push("localhost".into());
    let c = spawn("write_lat", &args).finish(PROCESS_BOUND);
    c.assert_failure("cannot connect to localhost:19016");
}

// ---------------------------------------------------------------------------
// Device tests: devinfo and asyncwatch.
// ---------------------------------------------------------------------------

fn test_device() -> Option<String> {
    std::env::var("IBVERBS_TEST_DEVICE").ok()
}

#[test]
#[ignore = "needs an RDMA device"]
fn devinfo_lists_and_describes() {
    let list = run("devinfo", &["-l"]);
    list.assert_success();
    assert!(list.stdout.contains("found:"), "{}", list.describe());
    if let Some(d) = test_device() {
        assert!(
            list.stdout.contains(&format!("\t{d}\n")),
            "{}",
            list.describe()
        );
    }

    let mut args = vec!["-i", "1"];
    let dev = test_device();
    if let Some(d) = &dev {
        args.extend(["-d", d.as_str()]);
    }
    let plain = run("devinfo", &args);
    plain.assert_success();
    let out = &plain.stdout;
    if let Some(d) = &dev {
        assert!(
            out.starts_with(&format!("hca_id:\t{d}\n")),
            "{}",
            plain.describe()
        );
    }
    for key in [
        "transport:",
        "node_guid:",
        "vendor_id:",
        "phys_port_cnt:",
        "port:\t1",
    ] {
        assert!(out.contains(key), "{key} missing\n{}", plain.describe());
    }
    assert!(
        out.contains("state:\t\t\tPORT_ACTIVE (4)"),
        "{}",
        plain.describe()
    );
    assert!(
        !out.contains("max_qp:"),
        "limits only with -v\n{}",
        plain.describe()
    );
    assert!(
        !out.contains("GID["),
        "GIDs only with -v\n{}",
        plain.describe()
    );

    args.push("-v");
    let verbose = run("devinfo", &args);
    verbose.assert_success();
    let out = &verbose.stdout;
    for key in [
        "max_qp:",
        "max_qp_wr:",
        "max_sge:",
        "max_cq:",
        "max_cqe:",
        "max_mr:",
        "max_pd:",
        "atomic_cap:",
        "gid_tbl_len:",
        "GID[",
    ] {
        assert!(out.contains(key), "{key} missing\n{}", verbose.describe());
    }
    if let Ok(gid1) = std::env::var("IBVERBS_TEST_EXPECT_GID1") {
        // The SoftRoCE VM: rxe0 on eth0, Ethernet, an IPv4 RoCE v2 GID at 1.
        assert!(
            out.contains("link_layer:\t\tEthernet"),
            "{}",
            verbose.describe()
        );
        assert!(
            out.contains(&format!("GID[  1]:\t\t{gid1}, RoCE v2")),
            "{}",
            verbose.describe()
        );
    }
}

#[test]
#[ignore = "needs an RDMA device"]
fn devinfo_rejects_a_missing_device_and_port() {
    let f = run("devinfo", &["-d", "no_such_device0"]);
    f.assert_failure("wasn't found");
    let mut args = vec!["-i", "200"];
    let dev = test_device();
    if let Some(d) = &dev {
        args.extend(["-d", d.as_str()]);
    }
    run("devinfo", &args).assert_failure("invalid port 200");
}

#[test]
#[ignore = "needs an RDMA device"]
fn asyncwatch_times_out_quietly() {
    let mut args = vec!["--timeout", "1"];
    let dev = test_device();
    if let Some(d) = &dev {
        args.extend(["-d", d.as_str()]);
    }
    let start = Instant::now();
    let f = run("asyncwatch", &args);
    f.assert_success();
    assert!(
        start.elapsed() >= Duration::from_millis(900),
        "returned too early"
    );
    assert!(f.stdout.contains("async event FD"), "{}", f.describe());
    assert!(
        !f.stdout.contains("event_type"),
        "no events expected\n{}",
        f.describe()
    );
}
