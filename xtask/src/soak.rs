//! `cargo xtask soak`: a long randomized run between two VMs with faults
//! switching every few seconds, every byte checked.
//!
//! vm0 runs `soak_peer server` in a restart loop, vm1 `soak_peer client`
//! (tools/src/soak.rs: many queue pairs and threads on shared CQs, a random mix
//! of send/receive, writes with and without immediate, reads and atomics
//! of 1 B – 1 MiB, checked end to end, ledgers compared after every
//! session). Both VMs follow one fault timeline drawn from the seed
//! ([`timeline`]): netem on each VM's eth1 (loss, duplication, reordering,
//! delay, corruption), link flaps (the host drops the carrier) and peer
//! restarts (vm0 kills the server; the loop starts it again). The host then
//! reads the outputs into the report (`report.rs`): operations, bytes,
//! faults applied, rxe's retries, errors by status, sessions, and the
//! verdict: zero lost, phantom or corrupt messages, counters as the model
//! says, kernel resources back to their baseline.
//!
//! `--capture` also keeps vm1's RoCE headers (`soak.pcap`) and reads, for
//! every queue pair, the plain ACKs the client received at the PSN of one
//! of its atomics or reads (`trace.rs`), beside that queue pair's findings.
//! Headers only, to the guest's RAM: a few minutes' run, not thirty.

mod report;
mod trace;

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::util::quote;
use crate::{step, util, vm, VmOpts};

/// Options of `cargo xtask soak`.
pub struct SoakOptions {
    /// Length of the traffic.
    pub minutes: f64,
    /// Queue pairs and client threads.
    pub qps: usize,
    pub threads: usize,
    /// Seed of the fault timeline and of the client's choices.
    pub seed: u64,
    /// No faults: the same traffic on a clean link.
    pub no_faults: bool,
    /// Keep a trace of vm1's RoCE packets (headers only) in
    /// target/soak/soak.pcap, and read each finding's queue pair in it.
    pub capture: bool,
    /// Copy the generated report to docs/results/soak.md (with `capture`, to
    /// docs/results/soak-trace.md).
    pub publish: bool,
    /// Evaluate the last run's outputs (target/soak/) again, with the same
    /// options, without building or booting anything.
    pub reanalyze: bool,
    pub vm: VmOpts,
}

/// One state of the link, held until the next event.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Fault {
    /// No qdisc.
    Clean,
    /// `tc qdisc replace dev eth1 root netem <args>` on both VMs.
    Netem(&'static str, String),
    /// The host drops vm1's carrier for this many seconds.
    LinkFlap(f64),
    /// vm0 kills the server (SIGKILL); its loop starts a new one.
    PeerRestart,
}

impl Fault {
    /// The kind's name in the report.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Fault::Clean => "clean",
            Fault::Netem(k, _) => k,
            Fault::LinkFlap(_) => "link flap",
            Fault::PeerRestart => "peer restart",
        }
    }
}

/// An event: at `at` seconds after the client's first connection, the
/// link becomes `fault`.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Event {
    pub at: f64,
    pub fault: Fault,
}

fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The fault timeline of a `secs`-second run: an event every 3–8 s, its
/// kind and parameters drawn from `seed` (the same seed, the same run).
/// Weights: clean 20 %, loss 18 %, duplication 15 %, reordering 12 %,
/// delay 10 %, corruption 10 %, link flap 8 %, peer restart 7 %.
pub(crate) fn timeline(seed: u64, secs: f64) -> Vec<Event> {
    let mut r = mix(seed ^ 0x7e57);
    let mut next = || {
        r = mix(r);
        r
    };
    let mut out = Vec::new();
    let mut at = 3.0;
    while at < secs {
        let pick = next() % 100;
        let p = next();
        let fault = match pick {
            0..=19 => Fault::Clean,
            20..=37 => Fault::Netem("loss", format!("loss {}%", [1, 2, 5][(p % 3) as usize])),
            38..=52 => Fault::Netem(
                "duplication",
                format!("duplicate {}%", [5, 10, 20][(p % 3) as usize]),
            ),
            53..=64 => Fault::Netem(
                "reordering",
                format!("delay {}ms reorder 25% 50%", [2, 5, 10][(p % 3) as usize]),
            ),
            65..=74 => Fault::Netem(
                "delay",
                format!("delay {}ms {}ms", [10, 20, 50][(p % 3) as usize], 5),
            ),
            75..=84 => Fault::Netem(
                "corruption",
                format!("corrupt {}%", [1, 2][(p % 2) as usize]),
            ),
            85..=92 => Fault::LinkFlap([1.0, 2.0, 3.0][(p % 3) as usize]),
            _ => Fault::PeerRestart,
        };
        out.push(Event { at, fault });
        at += 3.0 + (next() % 5000) as f64 / 1000.0;
    }
    out
}

/// The timeline as the shell lines VM `role` runs (from the start file
/// on; each step returns at once after the run is done).
fn timeline_script(role: usize, events: &[Event]) -> String {
    let mut s = String::new();
    let mut now = 0.0;
    for e in events {
        let wait = e.at - now;
        now = e.at;
        let kind = e.fault.kind();
        let action = match (&e.fault, role) {
            (Fault::Clean, _) => "tc qdisc del dev eth1 root 2>/dev/null; log clean".to_string(),
            (Fault::Netem(_, args), _) => format!(
                "tc qdisc replace dev eth1 root netem {args} 2>>$D/faults.{role}.err && log {kind} {args} || log FAILED {kind} {args}"
            ),
            (Fault::LinkFlap(d), 1) => format!(
                "tc qdisc del dev eth1 root 2>/dev/null; log link-flap {d}; link down >> $D/link.1; sleep {d}; link up >> $D/link.1"
            ),
            (Fault::PeerRestart, 0) => "tc qdisc del dev eth1 root 2>/dev/null; \
                 pkill -9 -f 'soak_peer server' && log peer-restart || log FAILED peer-restart"
                .to_string(),
            // The other VM's event: back to a clean link here too.
            _ => "tc qdisc del dev eth1 root 2>/dev/null".to_string(),
        };
        let _ = writeln!(s, "step {wait:.3} && {{ {action}; }}");
    }
    s
}

/// The queue pairs' ACK timeout and retry count. Up to 16 queue pairs × 4
/// requests of up to 1 MiB are in flight, tens of MiB, and under TCG the
/// link moves them at tens of MB/s: an ACK can take a second. With rxe's
/// and perftest's usual 67 ms (`--timeout 14`) nearly every large request
/// timed out and was sent again on a clean link (9017 retries and 623131
/// duplicate requests in two minutes), so the retransmissions would be the
/// emulator's, not the faults'. 2.1 s (19) covers the queue; 6 retries
/// (rxe takes 7 as "forever") give a lost path ~15 s before
/// `RETRY_EXC_ERR`.
const QP_TIMERS: &str = "--timeout 19 --retry-cnt 6";

/// The script of VM `role`.
fn script(role: usize, o: &SoakOptions, peer: &Path, dir: &Path, events: &[Event]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "set -u; S={}; D={}; PEER=\"${{XTASK_PEER_ADDR:-}}\"",
        quote(&peer.to_string_lossy()),
        quote(&dir.to_string_lossy())
    );
    let _ = writeln!(s, "ulimit -l unlimited");
    let _ = writeln!(
        s,
        "log() {{ echo \"$(cut -d' ' -f1 /proc/uptime) $*\" >> $D/faults.{role}; }}; \
         step() {{ [ -e $D/done ] && return 1; sleep $1; [ ! -e $D/done ]; }}"
    );
    // `link down|up`: as in `cargo xtask faults` (the host answers).
    let _ = writeln!(
        s,
        "L=0; link() {{ L=$((L+1)); echo \"$L $1\" > \"$XTASK_LINK_REQUEST\"; \
         for n in $(seq 100); do grep -q \"^$L \" \"$XTASK_LINK_REQUEST.done\" 2>/dev/null && break; sleep 0.1; done; \
         grep \"^$L \" \"$XTASK_LINK_REQUEST.done\" 2>/dev/null || echo \"$L timeout\"; }}"
    );
    let _ = writeln!(
        s,
        "rdma resource show > $D/base.{role}.res; rdma statistic show link rxe1/1 > $D/stat-pre.{role} 2>&1"
    );
    let secs = (o.minutes * 60.0).round() as u64;
    let timeline = match o.no_faults {
        true => String::new(),
        false => timeline_script(role, events),
    };
    if role == 0 {
        let _ = writeln!(
            s,
            "(while [ ! -e $D/done ]; do $S server -d rxe1 -p 7000 {QP_TIMERS} >> $D/server.out 2>> $D/server.err; \
             echo \"EXIT $? $(cut -d' ' -f1 /proc/uptime)\" >> $D/server.out; sleep 0.5; done) & loop=$!"
        );
        let _ = writeln!(
            s,
            "for n in $(seq 6000); do [ -e $D/start ] && break; [ -e $D/done ] && break; sleep 0.1; done"
        );
        s.push_str(&timeline);
        let _ = writeln!(
            s,
            "while [ ! -e $D/done ]; do sleep 0.5; done; tc qdisc del dev eth1 root 2>/dev/null; \
             pkill -f 'soak_peer server'; wait $loop"
        );
    } else {
        if o.capture {
            // Headers only (BTH, AETH: 58 bytes), to the guest's own /tmp
            // with a 256 MiB buffer, as `cargo xtask faults --capture`.
            let _ = writeln!(
                s,
                "tcpdump -i eth1 -s 64 -B 262144 -w /tmp/soak.pcap udp port 4791 2>$D/tcpdump.err & cap=$!; \
                 for n in $(seq 50); do grep -q listening $D/tcpdump.err && break; sleep 0.1; done"
            );
        }
        let _ = writeln!(
            s,
            "$S client \"$PEER\" -d rxe1 -p 7000 {QP_TIMERS} --seconds {secs} --qps {} --threads {} --seed {} > $D/client.out 2> $D/client.err & pid=$!",
            o.qps, o.threads, o.seed
        );
        let _ = writeln!(
            s,
            "for n in $(seq 3000); do grep -q 'connected$' $D/client.err && break; kill -0 $pid 2>/dev/null || break; sleep 0.1; done; touch $D/start"
        );
        let _ = writeln!(s, "( :\n{timeline}) & tl=$!");
        let _ = writeln!(
            s,
            "wait $pid; echo \"exit=$?\" >> $D/client.out; touch $D/done; wait $tl; tc qdisc del dev eth1 root 2>/dev/null"
        );
        if o.capture {
            let _ = writeln!(
                s,
                "sleep 3; kill -INT $cap; wait $cap; mv /tmp/soak.pcap $D/soak.pcap"
            );
        }
    }
    // The kernel releases a dead process's objects asynchronously.
    let _ = writeln!(
        s,
        "sleep 2; rdma resource show > $D/end.{role}.res; rdma statistic show link rxe1/1 > $D/stat-post.{role} 2>&1; echo '[soak] done'"
    );
    s
}

/// Runs the soak (or, `--reanalyze`, evaluates its last outputs again);
/// `Ok(true)` when it found nothing wrong.
pub fn cmd_soak(o: &SoakOptions) -> Result<bool> {
    let repo = crate::repo_root()?;
    let chosen = crate::faults::choose_kernel("soak");
    let dir: PathBuf = repo.join("target/soak");
    let events = match o.no_faults {
        true => Vec::new(),
        false => timeline(o.seed, o.minutes * 60.0),
    };
    let (wall_minutes, problems) = match o.reanalyze {
        true => {
            step!("soak: evaluating the outputs in {} again", dir.display());
            let m = fs::read_to_string(dir.join("minutes"))
                .ok()
                .and_then(|m| m.trim().parse().ok());
            (m, Vec::new())
        }
        false => run_vms(o, &repo, &dir, &events)?,
    };
    let run = report::Run {
        minutes: o.minutes,
        wall_minutes,
        qps: o.qps,
        threads: o.threads,
        seed: o.seed,
        no_faults: o.no_faults,
        capture: o.capture,
        kernel: std::env::var("XTASK_KERNEL_PACKAGE").ok(),
        planned: events,
        problems,
    };
    let r = report::evaluate(&run, &dir);
    let md = report::markdown(&run, &r);
    let generated = dir.join("soak.md");
    fs::write(&generated, &md)?;
    step!("soak: report in {}", generated.display());
    if o.publish {
        // A traced run is an experiment beside the soak's own report.
        let mut name = String::from(match o.capture {
            true => "soak-trace",
            false => "soak",
        });
        if let Some(v) = &chosen {
            name = format!("{name}-{v}");
        }
        let docs = crate::results_dir()?.join(name + ".md");
        fs::write(&docs, &md)?;
        step!("soak: published to {}", docs.display());
    }
    for line in &r.summary {
        println!("{line}");
    }
    for p in &r.failures {
        println!("soak: FAILED: {p}");
    }
    println!(
        "soak: {}",
        match r.failures.is_empty() {
            true => "passed",
            false => "failed",
        }
    );
    Ok(r.failures.is_empty())
}

/// Builds `soak_peer`, writes both VMs' scripts into `dir` and runs them
/// (the outputs land in `dir`); the run's wall-clock minutes and what went
/// wrong at the VM level (a VM that failed, a kernel crash).
fn run_vms(
    o: &SoakOptions,
    repo: &Path,
    dir: &Path,
    events: &[Event],
) -> Result<(Option<f64>, Vec<String>)> {
    step!("soak: building soak_peer (release)");
    let mut b = util::cargo();
    b.args([
        "build",
        "--release",
        "-p",
        util::TOOLS_PACKAGE,
        "--bin",
        "soak_peer",
    ]);
    util::run_visible(&mut b)?;
    let peer = repo.join("target/release/soak_peer");
    let _ = fs::remove_dir_all(dir);
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    step!(
        "soak: {:.1} min, {} queue pairs, {} threads, seed {}, {} fault events",
        o.minutes,
        o.qps,
        o.threads,
        o.seed,
        events.len()
    );
    for role in 0..2 {
        fs::write(
            dir.join(format!("vm{role}.sh")),
            script(role, o, &peer, dir, events),
        )?;
    }
    let cmd = |i: usize| {
        format!(
            "sh {}",
            quote(&dir.join(format!("vm{i}.sh")).to_string_lossy())
        )
    };
    let vms = vm::pair(&cmd(0), &cmd(1), &o.vm)?;
    let session = vm::Session::new()?;
    let started = std::time::Instant::now();
    // The traffic, the last session's drain and ledger, boots and teardown.
    let limit = (o.minutes * 60.0) as u64 + 900;
    let outcomes = session.run(&vms, o.vm.timeout_or(limit))?;
    let mut problems = Vec::new();
    for out in &outcomes {
        if !out.success() {
            step!("soak: {}", out.describe());
            problems.push(out.describe());
        }
        if let Some(oops) = &out.panic {
            problems.push(format!(
                "{}'s guest kernel crashed: {}",
                out.name,
                oops.first().map_or("", String::as_str)
            ));
        }
    }
    let m = started.elapsed().as_secs_f64() / 60.0;
    let _ = fs::write(dir.join("minutes"), format!("{m}"));
    Ok((Some(m), problems))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_timeline_is_the_seeds_and_has_every_kind() {
        let a = timeline(7, 1800.0);
        assert_eq!(a, timeline(7, 1800.0));
        assert_ne!(a, timeline(8, 1800.0));
        for w in a.windows(2) {
            let gap = w[1].at - w[0].at;
            assert!((3.0..8.0).contains(&gap), "{gap}");
        }
        for kind in [
            "clean",
            "loss",
            "duplication",
            "reordering",
            "delay",
            "corruption",
            "link flap",
            "peer restart",
        ] {
            assert!(a.iter().any(|e| e.fault.kind() == kind), "{kind}");
        }
        assert!(timeline(7, 2.0).is_empty());
    }

    #[test]
    fn each_vm_runs_its_part_of_the_timeline() {
        let events = vec![
            Event {
                at: 3.0,
                fault: Fault::Netem("loss", "loss 2%".into()),
            },
            Event {
                at: 7.5,
                fault: Fault::LinkFlap(2.0),
            },
            Event {
                at: 11.0,
                fault: Fault::PeerRestart,
            },
        ];
        let t0 = timeline_script(0, &events);
        let t1 = timeline_script(1, &events);
        for t in [&t0, &t1] {
            assert!(t.contains("step 3.000 && { tc qdisc replace dev eth1 root netem loss 2%"));
            assert!(t.contains("step 4.500 && {"));
        }
        assert!(t1.contains("link down") && !t0.contains("link down"));
        assert!(t0.contains("pkill -9 -f 'soak_peer server'") && !t1.contains("pkill"));
        let o = SoakOptions {
            minutes: 0.5,
            qps: 8,
            threads: 2,
            seed: 3,
            no_faults: false,
            capture: false,
            publish: false,
            reanalyze: false,
            vm: VmOpts {
                mem: "2G".into(),
                smp: 2,
                timeout: None,
                env: vec![],
                verbose: false,
                kernel_args: vec![],
            },
        };
        let s1 = script(1, &o, Path::new("/r/sp"), Path::new("/r/out"), &events);
        assert!(s1.contains(
            "$S client \"$PEER\" -d rxe1 -p 7000 --timeout 19 --retry-cnt 6 --seconds 30 --qps 8 --threads 2 --seed 3"
        ));
        assert!(s1.contains("touch $D/start") && s1.contains("touch $D/done"));
        let s0 = script(0, &o, Path::new("/r/sp"), Path::new("/r/out"), &events);
        assert!(s0.contains("while [ ! -e $D/done ]; do $S server -d rxe1 -p 7000"));
        assert!(!s1.contains("tcpdump"));
        let traced = SoakOptions {
            capture: true,
            vm: o.vm.clone(),
            ..o
        };
        let s1 = script(1, &traced, Path::new("/r/sp"), Path::new("/r/out"), &events);
        let (start, client, stop) = (
            s1.find("tcpdump -i eth1 -s 64").expect("a capture"),
            s1.find("$S client").unwrap(),
            s1.find("mv /tmp/soak.pcap $D/soak.pcap")
                .expect("the trace kept"),
        );
        assert!(start < client && client < stop, "{s1}");
        let quiet = SoakOptions {
            no_faults: true,
            ..o
        };
        assert!(
            !script(1, &quiet, Path::new("/r/sp"), Path::new("/r/out"), &events)
                .contains("netem loss")
        );
    }
}
