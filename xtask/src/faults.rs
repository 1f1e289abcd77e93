//! `cargo xtask faults`: fault injection between two VMs.
//!
//! Two VMs joined by a `-netdev socket` link carry real RoCE v2 between two
//! kernels (`rxe1` on each `eth1`). vm0 runs the server side of every
//! scenario, vm1 the client side, both with `fault_peer` (tools/src/bin, tools/src/fault.rs); each
//! side's script applies its faults (netem on its own eth1, killing the
//! server, taking the link down) and records the peer's `RESULT` line and
//! `rdma resource show` into `target/faults/`. Workload rows run the
//! examples of issue #21 (block store, ring all-reduce) split over both VMs
//! instead (see `scenarios::workloads`). The host then checks every
//! scenario against its expectation, prints one row per scenario and writes
//! the generated report `target/faults/reliability.md` (`report.rs`), which
//! `--publish` copies to docs/results/reliability.md.

pub(crate) mod evaluate;
pub(crate) mod pcap;
mod report;
mod scenarios;

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::test::parse_resources;
use crate::util::quote;
use crate::{step, util, vm, VmOpts};
use evaluate::{evaluate, table, Row};
use scenarios::{scenarios, Proc, Scenario};

/// Options of `cargo xtask faults`.
pub struct FaultsOptions {
    /// Bytes moved by each transfer scenario.
    pub total_mib: u64,
    /// The reduced profile: fewer loss rates, smaller transfers.
    pub quick: bool,
    /// Only scenarios whose name contains this.
    pub only: Option<String>,
    /// Each selected scenario runs this many times.
    pub repeat: u32,
    /// The data mover of the transfer rows.
    pub peer: Peer,
    /// Also copy the generated report to docs/ (reliability.md, or for a
    /// selection `reliability-<selection>.md`).
    pub publish: bool,
    /// Evaluate the outputs of the last run again (same selection), without
    /// building or booting anything.
    pub reanalyze: bool,
    /// Keep a packet trace (vm1's eth1) of every failing transfer row.
    pub capture: bool,
    pub vm: VmOpts,
}

/// The data mover of a transfer row: `fault_peer` or its C twin.
#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
pub enum Peer {
    /// `fault_peer` (tools/src/fault.rs), on this library.
    Rust,
    /// `fault_peer_c` (xtask/c/fault_peer.c), on libibverbs alone.
    C,
    /// Each transfer row twice in a row: `fault_peer`, then the C twin.
    Both,
}

/// The shell script one VM runs: every scenario from row `from` on, in order.
fn script(
    role: usize,
    list: &[Scenario],
    from: usize,
    bins: &Bins,
    out: &Path,
    capture: bool,
) -> String {
    let f = quote(&bins.peer.to_string_lossy());
    let fc = quote(&bins.c_twin.to_string_lossy());
    let x = quote(&bins.examples.to_string_lossy());
    let d = quote(&out.to_string_lossy());
    let mut s = String::new();
    let _ = writeln!(
        s,
        "set -u; F={f}; FC={fc}; X={x}; D={d}; ME=\"$XTASK_LOCAL_ADDR\"; PEER=\"$XTASK_PEER_ADDR\"; PORT=/sys/class/infiniband/rxe1/ports/1/state"
    );
    let _ = writeln!(s, "ulimit -l unlimited");
    let _ = writeln!(s, "rdma resource show > $D/base.{role}.res");
    // `link down|up`: ask the host to drop or restore eth1's carrier and
    // wait (10 s at most) for its answer; prints `SEQ ok` or the error.
    let _ = writeln!(
        s,
        "L=0; link() {{ L=$((L+1)); echo \"$L $1\" > \"$XTASK_LINK_REQUEST\"; \
         for n in $(seq 100); do grep -q \"^$L \" \"$XTASK_LINK_REQUEST.done\" 2>/dev/null && break; sleep 0.1; done; \
         grep \"^$L \" \"$XTASK_LINK_REQUEST.done\" 2>/dev/null || echo \"$L timeout (no answer from the host)\"; }}"
    );
    for (i, sc) in list.iter().enumerate().skip(from) {
        let port = 7000 + i;
        let f = if sc.c_twin { "$FC" } else { "$F" };
        let side = if role == 0 { "server" } else { "client" };
        let _ = writeln!(s, "echo \"[faults] {i}: {}\"", sc.name.replace('"', ""));
        // Anything that went wrong applying the fault: the row fails.
        let _ = writeln!(s, "E=$D/{i}.{role}.fault-errors; : > $E");
        if sc.local {
            if role == 0 {
                let _ = writeln!(s, "timeout 60 $F cq-overrun -d rxe1 > $D/{i}.local.out 2>&1; echo exit=$? >> $D/{i}.local.out");
            }
        } else {
            // rxe's own counters around the scenario (retries, NAKs, RNR):
            // what the device did about the fault.
            let _ = writeln!(
                s,
                "rdma statistic show link rxe1/1 > $D/{i}.{role}.stat-pre 2>&1"
            );
            if let Some(n) = &sc.netem {
                let _ = writeln!(s, "tc qdisc add dev eth1 root netem {n} 2>>$E || echo 'tc netem {n} failed' >> $E");
            }
            if sc.procs.is_empty() {
                if role == 0 {
                    let _ = writeln!(
                        s,
                        "timeout 600 {f} server -d rxe1 -p {port} --deadline 500 {} > $D/{i}.server.out 2>&1 & pid=$!",
                        sc.server_args
                    );
                    if let Some(t) = sc.kill_server_after {
                        wait_connected(&mut s, &format!("$D/{i}.server.out"));
                        // SIGKILL the peer itself (not the `timeout` wrapper).
                        let _ = writeln!(
                            s,
                            "sleep {t}; pkill -9 -f -- '-p {port} --deadline' || echo 'kill: no such process' >> $E"
                        );
                    }
                } else {
                    if sc.blackhole.is_some() {
                        // The outage is a `tc qdisc change` of a netem that is
                        // already in place: adding a root qdisc mid-transfer
                        // swaps the queue, and a packet refused meanwhile is a
                        // local transmit error (6.12's rxe then fails the QP
                        // with LOC_QP_OP_ERR), not a silent path.
                        let _ = writeln!(
                            s,
                            "tc qdisc add dev eth1 root netem loss 0% 2>>$E || echo 'tc netem loss 0% failed' >> $E"
                        );
                    }
                    if sc.link_down.is_some() {
                        // The port's asynchronous events across the outage,
                        // through the library (`asyncwatch`): PORT_ERR, then
                        // PORT_ACTIVE once the carrier is back. Started and
                        // listening (its first line) before the transfer, so
                        // a slow start cannot miss the outage.
                        let _ = writeln!(
                            s,
                            "timeout 600 $X/asyncwatch -d rxe1 > $D/{i}.1.events 2>&1 & wpid=$!; \
                             for n in $(seq 100); do grep -q 'async event FD' $D/{i}.1.events && break; sleep 0.1; done"
                        );
                    }
                    if capture {
                        // RoCE v2 headers (BTH, RETH/AETH, the first payload
                        // bytes) of both directions, from before the
                        // connection; kept only if the row fails (below).
                        // A 256 MiB buffer: with the default 2 MiB, tcpdump
                        // under emulation dropped half of a row's packets.
                        // Written to the guest's own /tmp (writing over 9p
                        // fell behind: three quarters of the packets were
                        // still in the buffer when it was stopped), drained
                        // for 3 s, then moved out if the row failed.
                        let _ = writeln!(
                            s,
                            "tcpdump -i eth1 -s 96 -B 262144 -w /tmp/{i}.pcap udp port 4791 2>$D/{i}.tcpdump.err & cap=$!; \
                             for n in $(seq 50); do grep -q listening $D/{i}.tcpdump.err && break; sleep 0.1; done"
                        );
                    }
                    let _ = writeln!(
                        s,
                        "timeout 600 {f} client \"$PEER\" -d rxe1 -p {port} {} > $D/{i}.client.out 2>&1 & pid=$!",
                        sc.client_args
                    );
                    if sc.link_down.is_some() || sc.if_down.is_some() || sc.blackhole.is_some() {
                        wait_connected(&mut s, &format!("$D/{i}.client.out"));
                    }
                    if let Some((after, dur)) = sc.link_down {
                        let _ = writeln!(
                            s,
                            "sleep {after}; link down >> $D/{i}.link; sleep {dur}; echo \"port before up: $(cat $PORT)\" >> $D/{i}.link; link up >> $D/{i}.link"
                        );
                    }
                    if let Some((after, dur)) = sc.if_down {
                        let _ = writeln!(
                            s,
                            "sleep {after}; ip link set eth1 down 2>>$E || echo 'ip link set down failed' >> $E; sleep {dur}; ip link set eth1 up 2>>$E || echo 'ip link set up failed' >> $E"
                        );
                    }
                    if sc.link_down.is_some() || sc.if_down.is_some() {
                        // Let rxe1 come back (port ACTIVE, GIDs re-added).
                        let _ = writeln!(
                            s,
                            "for n in $(seq 100); do grep -q ACTIVE $PORT && break; sleep 0.1; done"
                        );
                    }
                    if sc.link_down.is_some() {
                        // PORT_ACTIVE follows the port's state at once; 5 s
                        // at most, then the watcher ends either way.
                        let _ = writeln!(
                            s,
                            "for n in $(seq 50); do grep -q PORT_ACTIVE $D/{i}.1.events && break; sleep 0.1; done; kill $wpid 2>/dev/null; wait $wpid 2>/dev/null"
                        );
                    }
                    if let Some((after, dur)) = sc.blackhole {
                        let _ = writeln!(
                            s,
                            "sleep {after}; tc qdisc change dev eth1 root netem loss 100% 2>>$E || echo 'tc netem loss 100% failed' >> $E; sleep {dur}; tc qdisc change dev eth1 root netem loss 0% 2>>$E || echo 'tc netem loss 0% failed' >> $E"
                        );
                    }
                }
                let _ = writeln!(s, "wait $pid; echo exit=$? >> $D/{i}.{side}.out");
                if capture && role == 1 {
                    let _ = writeln!(
                        s,
                        "sleep 3; kill -INT $cap; wait $cap 2>/dev/null; grep -q 'RESULT.*status=ok ' $D/{i}.client.out && rm -f /tmp/{i}.pcap; [ -e /tmp/{i}.pcap ] && mv /tmp/{i}.pcap $D/{i}.pcap"
                    );
                }
            } else {
                workload(&mut s, i, role, sc);
            }
            let _ = writeln!(
                s,
                "rdma statistic show link rxe1/1 > $D/{i}.{role}.stat-post 2>&1"
            );
            if sc.netem.is_some() || (role == 1 && sc.blackhole.is_some()) {
                let _ = writeln!(
                    s,
                    "tc qdisc del dev eth1 root 2>>$E || echo 'tc qdisc del failed' >> $E"
                );
            }
        }
        // The kernel releases a dead process's objects asynchronously.
        let _ = writeln!(s, "sleep 1; rdma resource show > $D/{i}.{role}.res");
    }
    let _ = writeln!(s, "echo \"[faults] done\"");
    s
}

/// The programs the scripts run.
struct Bins {
    /// `fault_peer`.
    peer: PathBuf,
    /// Its C twin, `fault_peer_c`.
    c_twin: PathBuf,
    /// The directory of the release examples (the workload rows).
    examples: PathBuf,
}

/// Builds `fault_peer`'s C twin with `cc` (as `instr` builds opcost's).
fn build_c_twin(src: &Path, out: &Path) -> Result<()> {
    step!("faults: building {} (cc)", out.display());
    let status = std::process::Command::new("cc")
        .args(["-O2", "-g", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(out)
        .arg(src)
        .arg("-libverbs")
        .status()
        .context("cannot run cc (install gcc)")?;
    anyhow::ensure!(status.success(), "cc failed to build {}", src.display());
    Ok(())
}

/// The first TCP port of workload row `i` (the all-reduce's ranks listen
/// on it and the next two): apart from `fault_peer`'s 7000 + i.
fn workload_port(i: usize) -> usize {
    20000 + 10 * i
}

/// Script lines of workload row `i` on VM `role`: wait for the other VM to
/// reach the row (both VMs run their lists independently, and a previous
/// row may take longer on one), start this VM's processes, wait for each
/// and append its exit status to its output.
fn workload(s: &mut String, i: usize, role: usize, sc: &Scenario) {
    let _ = writeln!(
        s,
        "touch $D/{i}.{role}.ready; for n in $(seq 3000); do [ -e $D/{i}.{}.ready ] && break; sleep 0.1; done",
        1 - role
    );
    let mine: Vec<(usize, &Proc)> = sc
        .procs
        .iter()
        .enumerate()
        .filter(|(_, p)| p.role == role)
        .collect();
    for (k, p) in &mine {
        let args = p
            .args
            .replace("{port}", &workload_port(i).to_string())
            .replace(&format!("{{vm{role}}}"), "\"$ME\"")
            .replace(&format!("{{vm{}}}", 1 - role), "\"$PEER\"");
        let program = match p.program.starts_with('/') {
            true => p.program.to_string(),
            false => format!("$X/{}", p.program),
        };
        let after = match p.after {
            0 => String::new(),
            t => format!("sleep {t}; "),
        };
        let _ = writeln!(
            s,
            "({after}exec timeout 300 {program} {args}) > $D/{} 2>&1 & p{k}=$!",
            p.out_file(i)
        );
    }
    for (k, p) in &mine {
        let _ = writeln!(s, "wait $p{k}; echo exit=$? >> $D/{}", p.out_file(i));
    }
}

/// Script lines waiting (at most 300 s) until the peer writing `out` has
/// connected its QP: faults are timed from the transfer's start, not from
/// the process start (a peer VM that boots later would otherwise see the
/// whole fault before connecting).
fn wait_connected(s: &mut String, out: &str) {
    let _ = writeln!(
        s,
        "for n in $(seq 3000); do grep -q 'connected$' {out} 2>/dev/null && break; sleep 0.1; done"
    );
}

/// The kernel `faults` and `soak` boot: the one `XTASK_KERNEL_PACKAGE`
/// chose, else Debian's newest 6.1 (see [`newest_61_kernel`] for why). Returns
/// the chosen kernel's version (`6.12.117`), which names the published
/// reports so that they never replace the default kernel's.
pub(crate) fn choose_kernel(cmd: &str) -> Option<String> {
    if let Some(p) = std::env::var_os("XTASK_KERNEL_PACKAGE") {
        return crate::kernel::package_version(&p.to_string_lossy()).map(String::from);
    }
    match newest_61_kernel() {
        Some(p) => {
            step!("{cmd}: using {p} (rxe in 6.12 is unstable under netem; see faults.rs)");
            std::env::set_var("XTASK_KERNEL_PACKAGE", p);
        }
        None => step!("{cmd}: no Debian 6.1 kernel package found; using the default kernel"),
    }
    None
}

/// The newest Debian 6.1 kernel package (`linux-image-6.1.0-N-amd64`).
///
/// The fault suite boots 6.1, not 6.12: rdma_rxe in Debian's 6.12 kernel
/// panicked under netem packet loss in our runs (a fault in
/// `rxe_receiver → send_common_ack → rxe_init_packet`, and a double fault
/// in interrupt context), and delivered corrupted multi-packet messages
/// before that; 6.1's rxe ran the same scenarios cleanly. On 2026-11-23
/// 6.12.117 ran the whole profile once without a fault of its own, then
/// panicked in the next run's first row (`net_rx_action`, a NULL pointer,
/// in the softirq that rxe's ACK transmit let run).
fn newest_61_kernel() -> Option<String> {
    let out = std::process::Command::new("apt-cache")
        .args([
            "search",
            "--names-only",
            r"^linux-image-6\.1\.0-[0-9]+-amd64$",
        ])
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter_map(|n| {
            let abi: u32 = n
                .strip_prefix("linux-image-6.1.0-")?
                .strip_suffix("-amd64")?
                .parse()
                .ok()?;
            Some((abi, n.to_string()))
        })
        .max()
        .map(|(_, n)| n)
}

/// What the VM runs of a `faults` command ended with.
#[derive(Default)]
struct VmRuns {
    /// A VM ended its script with a status other than 0.
    failed: bool,
    /// Each guest kernel crash, a sentence naming the row it was in.
    crashes: Vec<String>,
}

/// The row a guest was in when its console log ends (the script's last
/// `[faults] N: name` line), or `None` if it crashed before the first.
fn crashed_row(console: &str) -> Option<(usize, String)> {
    console.lines().rev().find_map(|l| {
        let (_, rest) = l.split_once("[faults] ")?;
        let (n, _) = rest.split_once(": ")?;
        Some((n.trim().parse().ok()?, rest.trim().to_string()))
    })
}

/// Builds the programs of `list`, writes both VMs' scripts into `dir` and
/// runs them: the outputs land in `dir`. A guest kernel crash is reported
/// with its oops, and both VMs boot again to go on from the row after it,
/// so one crash does not cost the rest of the matrix.
fn run_vms(o: &FaultsOptions, list: &[Scenario], repo: &Path, dir: &Path) -> Result<VmRuns> {
    // fault_peer, and the examples the selected workload rows run.
    let mut programs: Vec<&str> = list
        .iter()
        .flat_map(|sc| sc.procs.iter().map(|p| p.program))
        .filter(|p| !p.starts_with('/'))
        .collect();
    // The link-down rows watch the port's events with `asyncwatch`.
    if list.iter().any(|sc| sc.link_down.is_some()) {
        programs.push("asyncwatch");
    }
    programs.sort_unstable();
    programs.dedup();
    step!(
        "faults: building fault_peer {} (release)",
        programs.join(" ")
    );
    let mut b = util::cargo();
    b.args([
        "build",
        "--release",
        "-p",
        util::TOOLS_PACKAGE,
        "--bin",
        "fault_peer",
    ]);
    for p in &programs {
        b.args(["--example", p]);
    }
    util::run_visible(&mut b)?;
    let bins = Bins {
        peer: repo.join("target/release/fault_peer"),
        c_twin: repo.join("target/release/fault_peer_c"),
        examples: repo.join("target/release/examples"),
    };
    if list.iter().any(|sc| sc.c_twin) {
        build_c_twin(&repo.join("xtask/c/fault_peer.c"), &bins.c_twin)?;
    }
    let _ = fs::remove_dir_all(dir);
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    step!(
        "faults: {} scenarios, {} MiB per transfer{}",
        list.len(),
        o.total_mib,
        if o.quick { " (quick profile)" } else { "" }
    );
    let cmd = |i: usize| {
        format!(
            "sh {}",
            quote(&dir.join(format!("vm{i}.sh")).to_string_lossy())
        )
    };
    let vms = vm::pair(&cmd(0), &cmd(1), &o.vm)?;
    let session = vm::Session::new()?;
    let mut runs = VmRuns::default();
    let mut from = 0;
    loop {
        for role in [0, 1] {
            let s = script(role, list, from, &bins, dir, o.capture);
            fs::write(dir.join(format!("vm{role}.sh")), s)?;
        }
        // The full profile takes ~30 min under TCG on an idle host, and CI's host
        // was slower (1800 s was reached in scenario 30 of 31): twice the expected
        // time, per boot.
        let outcomes = session.run(&vms, o.vm.timeout_or(3600))?;
        // The row after the last one a crashed guest reached.
        let mut next = None;
        for out in &outcomes {
            if !out.success() {
                runs.failed = true;
                step!("faults: {}", out.describe());
            }
            let Some(oops) = &out.panic else { continue };
            let log = fs::read_to_string(&out.console_log).unwrap_or_default();
            let row = crashed_row(&log);
            let at = row.as_ref().map_or("start-up", |(_, name)| name.as_str());
            // The next boot writes the same console log: keep this one.
            let kept = dir.join(format!(
                "{}.crash-{}.console.log",
                out.name,
                row.as_ref().map_or("start".into(), |(i, _)| i.to_string())
            ));
            let _ = fs::copy(&out.console_log, &kept);
            step!("faults: {}'s guest kernel crashed during {at}:", out.name);
            for l in oops {
                println!("    {l}");
            }
            let went_on = match &row {
                Some((i, _)) if i + 1 < list.len() => {
                    next = next.max(Some(i + 1));
                    "both VMs booted again to go on from the next row"
                }
                _ => "the rows after it did not run",
            };
            runs.crashes.push(format!(
                "{}'s guest kernel crashed during {at} (`{}`; console log {}); {went_on}",
                out.name,
                oops.first().map_or("", String::as_str),
                kept.file_name().unwrap_or_default().to_string_lossy()
            ));
        }
        match next {
            Some(i) => {
                step!("faults: booting both VMs again, from row {i}");
                from = i;
            }
            None => return Ok(runs),
        }
    }
}

/// Runs the fault-injection scenarios; `Ok(true)` when all pass.
pub fn cmd_faults(o: &FaultsOptions) -> Result<bool> {
    let repo = crate::repo_root()?;
    let chosen = choose_kernel("faults");
    let list = scenarios(o);
    let dir: PathBuf = repo.join("target/faults");
    let started = std::time::Instant::now();
    let runs = match o.reanalyze {
        true => {
            step!("faults: evaluating the outputs in {} again", dir.display());
            VmRuns::default()
        }
        false => run_vms(o, &list, &repo, &dir)?,
    };
    let baseline = [0, 1].map(|r| {
        fs::read_to_string(dir.join(format!("base.{r}.res")))
            .map(|t| parse_resources(&t))
            .unwrap_or_default()
    });
    let rows: Vec<Row> = list
        .iter()
        .enumerate()
        .map(|(i, sc)| evaluate(i, sc, &dir, &baseline))
        .collect();
    let t = table(&rows);
    let failed = rows.iter().filter(|r| !r.pass).count();
    // The packet trace of each failing row that kept one (`--capture`).
    let mut traces = Vec::new();
    for (i, row) in rows.iter().enumerate().filter(|(_, r)| !r.pass) {
        let path = dir.join(format!("{i}.pcap"));
        if !path.exists() {
            continue;
        }
        let text = pcap::analyze(&path, 12).unwrap_or_else(|e| format!("unreadable: {e}\n"));
        let _ = fs::write(dir.join(format!("{i}.trace.txt")), &text);
        step!(
            "faults: {}: {}",
            row.name,
            text.lines().nth(1).unwrap_or("").trim()
        );
        traces.push((row.name.clone(), text));
    }
    let run = report::Run {
        traces,
        crashes: runs.crashes,
        quick: o.quick,
        total_mib: o.total_mib,
        only: o.only.clone(),
        repeat: o.repeat,
        kernel: std::env::var("XTASK_KERNEL_PACKAGE").ok(),
        minutes: match o.reanalyze {
            true => fs::read_to_string(dir.join("minutes"))
                .ok()
                .and_then(|m| m.trim().parse().ok()),
            false => {
                let m = started.elapsed().as_secs_f64() / 60.0;
                let _ = fs::write(dir.join("minutes"), format!("{m}"));
                Some(m)
            }
        },
    };
    let md = report::markdown(&run, &rows);
    let generated = dir.join("reliability.md");
    fs::write(&generated, &md)?;
    step!("faults: report in {}", generated.display());
    if o.publish {
        let docs = crate::results_dir()?
            .join(report::published_name(o.only.as_deref(), chosen.as_deref()));
        fs::write(&docs, &md)?;
        step!("faults: published to {}", docs.display());
    }
    // What the peers printed in a failed row (CI keeps the log's tail).
    for (i, (row, sc)) in rows
        .iter()
        .zip(&list)
        .enumerate()
        .filter(|(_, (r, _))| !r.pass)
    {
        let mut files: Vec<String> = ["client", "server", "local"]
            .iter()
            .map(|side| format!("{i}.{side}.out"))
            .collect();
        files.extend(sc.procs.iter().map(|p| p.out_file(i)));
        for file in files {
            let Ok(text) = fs::read_to_string(dir.join(&file)) else {
                continue;
            };
            let lines: Vec<&str> = text.lines().collect();
            println!("--- {} (last lines of {file})", row.name);
            for l in &lines[lines.len().saturating_sub(8)..] {
                println!("    {l}");
            }
        }
    }
    println!("\n{t}");
    println!("faults: {} passed, {failed} failed", rows.len() - failed);
    Ok(failed == 0 && !runs.failed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use scenarios::retry_budget;

    /// The quick profile, 8 MiB, `fault_peer` only, one run each.
    fn options() -> FaultsOptions {
        FaultsOptions {
            total_mib: 8,
            quick: true,
            only: None,
            repeat: 1,
            peer: Peer::Rust,
            publish: false,
            reanalyze: false,
            capture: false,
            vm: VmOpts {
                mem: "2G".into(),
                smp: 1,
                timeout: None,
                env: vec![],
                verbose: false,
                kernel_args: vec![],
            },
        }
    }

    /// `--peer both` runs every transfer row with `fault_peer` and then at
    /// once with the C twin (same boot, same load); other rows once.
    #[test]
    fn both_peers_alternate_on_transfer_rows() {
        let list = scenarios(&FaultsOptions {
            repeat: 2,
            ..options()
        });
        let both = scenarios::with_peer(list.clone(), Peer::Both);
        let names: Vec<&str> = both.iter().map(|s| s.name.as_str()).collect();
        let i = names
            .iter()
            .position(|n| *n == "loss 2% / send #1")
            .unwrap();
        assert_eq!(
            &names[i..i + 4],
            &[
                "loss 2% / send #1",
                "loss 2% / send #1 (C twin)",
                "loss 2% / send #2",
                "loss 2% / send #2 (C twin)"
            ]
        );
        assert!(!names
            .iter()
            .any(|n| n.contains("CQ overrun") && n.contains("twin")));
        assert!(!names
            .iter()
            .any(|n| n.contains("allreduce") && n.contains("twin")));
        let only_c = scenarios::with_peer(list.clone(), Peer::C);
        assert_eq!(only_c.len(), list.len());
        let bins = Bins {
            peer: "/r/fp".into(),
            c_twin: "/r/fpc".into(),
            examples: "/r/ex".into(),
        };
        let s = script(1, &both, 0, &bins, Path::new("/r/out"), true);
        let client = |k: usize| format!("timeout 600 $FC client \"$PEER\" -d rxe1 -p {}", 7000 + k);
        assert!(s.contains(&client(i + 1)), "{s}");
        assert!(!s.contains(&client(i)));
        assert!(s.contains("FC=/r/fpc;"));
        // --capture: a trace of each transfer row, kept only when it failed.
        assert!(s.contains(&format!(
            "tcpdump -i eth1 -s 96 -B 262144 -w /tmp/{i}.pcap udp port 4791"
        )));
        assert!(s.contains(&format!(
            "grep -q 'RESULT.*status=ok ' $D/{i}.client.out && rm -f /tmp/{i}.pcap"
        )));
    }

    #[test]
    fn budget_and_scripts() {
        assert!((retry_budget(14, 7) - 0.537).abs() < 0.01);
        let o = FaultsOptions {
            vm: VmOpts {
                timeout: Some(10),
                ..options().vm
            },
            ..options()
        };
        let list = scenarios(&o);
        let bins = Bins {
            peer: "/r/fp".into(),
            c_twin: "/r/fpc".into(),
            examples: "/r/ex".into(),
        };
        assert!(list.iter().any(|s| s.name.starts_with("peer killed")));
        let s = script(1, &list, 0, &bins, Path::new("/r/out"), false);
        assert!(s.contains("ip link set eth1 down"));
        assert!(s.contains("link down >>") && s.contains("link up >>"));
        assert!(s.contains("$X/asyncwatch -d rxe1 > $D/") && s.contains("grep -q PORT_ACTIVE"));
        assert!(s.contains("tc qdisc add dev eth1 root netem loss 2%"));
        assert!(s.contains("rdma statistic show link rxe1/1 > $D/0.1.stat-pre"));
        // After a guest kernel crash in row 3, the next boot's script goes on
        // from row 4, with the rows' own numbers, ports and files.
        let rest = script(1, &list, 4, &bins, Path::new("/r/out"), false);
        assert!(!rest.contains("[faults] 3: ") && rest.contains("[faults] 4: "));
        assert!(rest.contains("$D/4.1.stat-pre") && !rest.contains("$D/0.1.stat-pre"));
        assert!(rest.contains("-p 7004 ") && rest.contains("[faults] done"));
        let console = "[vm0] [faults] 2: loss 1% / read\n[vm0] [faults] 3: loss 2% / send\n\
                       [  175.1] Kernel panic - not syncing: Fatal exception in interrupt\n";
        assert_eq!(crashed_row(console), Some((3, "3: loss 2% / send".into())));
        assert_eq!(crashed_row("[    1.0] Kernel panic\n"), None);
        // A path outage changes a netem the client installed before its
        // transfer (never adds a root qdisc mid-transfer) and removes it
        // after; the server side touches no qdisc for it.
        let outage: Vec<Scenario> = list
            .iter()
            .filter(|s| s.blackhole.is_some())
            .cloned()
            .collect();
        assert!(!outage.is_empty());
        let c = script(1, &outage, 0, &bins, Path::new("/r/out"), false);
        let add = c.find("tc qdisc add dev eth1 root netem loss 0%").unwrap();
        let start = c.find("$F client").unwrap();
        let cut = c
            .find("tc qdisc change dev eth1 root netem loss 100%")
            .unwrap();
        let del = c.find("tc qdisc del dev eth1 root").unwrap();
        assert!(add < start && start < cut && cut < del);
        assert!(!c.contains("tc qdisc add dev eth1 root netem loss 100%"));
        let srv = script(0, &outage, 0, &bins, Path::new("/r/out"), false);
        assert!(!srv.contains("tc qdisc"));
        let o = FaultsOptions {
            only: Some("loss 2% / send".into()),
            repeat: 3,
            ..o
        };
        let names: Vec<String> = scenarios(&o).into_iter().map(|s| s.name).collect();
        assert_eq!(
            names,
            [
                "loss 2% / send #1",
                "loss 2% / send #2",
                "loss 2% / send #3"
            ]
        );
    }

    /// The atomic rows are an experiment: only when selected, with both
    /// programs, 20000 fetch-and-adds of 8 bytes.
    #[test]
    fn atomic_rows_only_when_selected() {
        let o = |only: Option<&str>| FaultsOptions {
            quick: false,
            only: only.map(str::to_string),
            peer: Peer::Both,
            ..options()
        };
        assert!(!scenarios(&o(None))
            .iter()
            .any(|s| s.name.contains("atomic")));
        let list = scenarios(&o(Some("duplicate / atomic")));
        let names: Vec<&str> = list.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["duplicate / atomic", "duplicate / atomic (C twin)"]);
        assert_eq!(
            list[0].client_args,
            "--op atomic --msg-size 8 --total 160000"
        );
        assert_eq!(list[0].netem.as_deref(), Some("duplicate 3%"));
        let mixed = scenarios(&o(Some("reorder / mixed")));
        assert_eq!(mixed.len(), 2);
        assert_eq!(
            mixed[1].client_args,
            format!("--op mixed --total {}", 64u64 << 20)
        );
        // `--only mixed` keeps to the reads; `mixed-write` is its own.
        assert!(scenarios(&o(Some("mixed")))
            .iter()
            .all(|s| !s.name.contains("mixed-write")));
        let writes = scenarios(&o(Some("mixed-write")));
        assert_eq!(writes.len(), 8);
        // The reproducer: one single-packet write and one atomic at a time.
        assert!(writes[6].client_args.contains("--msg-size 512 --window 1"));
        assert_eq!(writes[6].netem.as_deref(), Some("loss 10%"));
        assert_eq!(
            writes[0].client_args,
            format!("--op mixed-write --total {}", 64u64 << 20)
        );
    }

    /// The workload rows: both VMs meet before starting, each runs its own
    /// processes with the addresses in terms of its own and its peer's
    /// eth1, and waits for every one of them.
    #[test]
    fn workload_scripts() {
        let o = FaultsOptions {
            only: Some("allreduce / 3".into()),
            vm: VmOpts {
                timeout: Some(10),
                ..options().vm
            },
            ..options()
        };
        let list = scenarios(&o);
        assert_eq!(list.len(), 1);
        let bins = Bins {
            peer: "/r/fp".into(),
            c_twin: "/r/fpc".into(),
            examples: "/r/ex".into(),
        };
        let vm0 = script(0, &list, 0, &bins, Path::new("/r/out"), false);
        let vm1 = script(1, &list, 0, &bins, Path::new("/r/out"), false);
        for (role, s) in [(0, &vm0), (1, &vm1)] {
            assert!(s.contains(&format!("touch $D/0.{role}.ready;")));
            assert!(s.contains(&format!("[ -e $D/0.{}.ready ]", 1 - role)));
            assert!(!s.contains("$F server") && !s.contains("$F client"));
            assert!(!s.contains("{vm") && !s.contains("{port}"));
        }
        assert!(vm0.contains(
            "timeout 300 $X/allreduce --rank 0 --ranks 3 --hosts \"$ME\",\"$PEER\",\"$ME\" -d rxe1 -p 20000"
        ));
        assert!(vm0.contains("--rank 2 ") && !vm0.contains("--rank 1 "));
        assert!(vm1.contains(
            "timeout 300 $X/allreduce --rank 1 --ranks 3 --hosts \"$PEER\",\"$ME\",\"$PEER\" -d rxe1 -p 20000"
        ));
        assert!(vm1.contains("> $D/0.rank_1.out 2>&1 & p1=$!"));
        assert!(vm1.contains("wait $p1; echo exit=$? >> $D/0.rank_1.out"));
        assert!(vm0.contains("wait $p0;") && vm0.contains("wait $p2;"));
        // The device is rxe1 on the link, its GID the port's default
        // (IPv4 RoCE v2): no fixed GID index.
        assert!(!vm0.contains(" -g ") && !vm1.contains(" -g "));
        // The block store: the server on vm0, both clients on vm1 towards it.
        let o = FaultsOptions {
            only: Some("blockstore".into()),
            ..o
        };
        let list = scenarios(&o);
        let vm0 = script(0, &list, 0, &bins, Path::new("/r/out"), false);
        let vm1 = script(1, &list, 0, &bins, Path::new("/r/out"), false);
        assert!(vm0.contains("$X/blockstore server -d rxe1") && !vm0.contains("blockstore client"));
        assert_eq!(
            vm1.matches("$X/blockstore client \"$PEER\" -d rxe1")
                .count(),
            2 * list.len()
        );
    }
}
