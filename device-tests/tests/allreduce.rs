//! The ring all-reduce workload (`tools/examples/allreduce.rs`), as N processes
//! of the example on the test device over 127.0.0.1 (device tests, run by
//! `cargo xtask test` inside the SoftRoCE VM): every rank must exit 0 and
//! print its figures and `VERIFIED` (the example checks every element of
//! every iteration against the exact sum). Vector sizes are not multiples
//! of N, so the last chunk is padded.
//!
//! The example binary lies next to this test's executable
//! (`target/<profile>/examples/`; `cargo xtask test` builds it). Every
//! child process is killed when its handle drops and every wait is bounded.

mod common;

use std::time::Duration;

use common::example_bin;
use common::process::{self, device_args, Finished};

/// Longest any rank may run.
const PROCESS_BOUND: Duration = Duration::from_secs(180);

/// Runs `n` ranks of the example on 127.0.0.1 (rank r on TCP port
/// `base_port + r`) all-reducing `floats` floats `iters` times; every rank
/// must succeed and print `VERIFIED`. Returns their outputs.
fn ring(n: usize, base_port: u16, floats: usize, iters: usize) -> Vec<Finished> {
    ring_with(n, base_port, floats, iters, &[])
}

/// [`ring`] with more arguments for every rank.
fn ring_with(
    n: usize,
    base_port: u16,
    floats: usize,
    iters: usize,
    extra: &[&str],
) -> Vec<Finished> {
    let hosts = vec!["127.0.0.1"; n].join(",");
    let running: Vec<_> = (0..n)
        .map(|rank| {
            let mut args: Vec<String> = [
                "--rank",
                &rank.to_string(),
                "--ranks",
                &n.to_string(),
                "--hosts",
                &hosts,
                "-p",
                &base_port.to_string(),
                "-s",
                &floats.to_string(),
                "-n",
                &iters.to_string(),
                "--timeout",
                "60",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            args.extend(extra.iter().map(|s| s.to_string()));
            args.extend(device_args());
            process::spawn(&example_bin("allreduce"), &args)
        })
        .collect();
    let done: Vec<Finished> = running
        .into_iter()
        .map(|r| r.finish(PROCESS_BOUND))
        .collect();
    let all = done
        .iter()
        .map(Finished::describe)
        .collect::<Vec<_>>()
        .join("\n");
    for f in &done {
        assert!(f.success(), "{} failed\n{all}", f.label);
        let last = f.stdout.lines().last().unwrap_or("");
        assert!(last.contains("VERIFIED"), "{}: no VERIFIED\n{all}", f.label);
        assert!(
            f.stdout.contains("algbw") && f.stdout.contains("busbw"),
            "{}: no bandwidth line\n{all}",
            f.label
        );
    }
    done
}

#[test]
#[ignore = "needs an RDMA device"]
fn allreduce_three_ranks() {
    // 100 000 = 3 · 33 334 − 2: the last chunk has two floats of padding.
    ring(3, 19300, 100_000, 10);
}

#[test]
#[ignore = "needs an RDMA device"]
fn allreduce_two_ranks() {
    // Left and right neighbour are one peer and one queue pair.
    ring(2, 19310, 100_001, 10);
}

#[test]
#[ignore = "needs an RDMA device"]
fn allreduce_tiny_vector() {
    // Chunks of one float, one of them all padding: many steps, little data.
    ring(3, 19320, 2, 50);
}

#[test]
#[ignore = "needs an RDMA device"]
fn allreduce_four_ranks_wait() {
    // More ranks than the VM has cores, sleeping on completion channels
    // (`--wait`) instead of spinning.
    let done = ring_with(4, 19330, 100_003, 10, &["--wait"]);
    for f in &done {
        assert!(f.stdout.contains("rank "), "{}", f.describe());
    }
}
