//! `cargo xtask faults`: fault injection between two VMs.
//!
//! Two VMs joined by a `-netdev socket` link carry real RoCE v2 between two
//! kernels (`rxe1` on each `eth1`). vm0 runs the server side of every
//! scenario, vm1 the client side, both with `fault_peer` (src/bin, src/fault.rs); each
//! side's script applies its faults (netem on its own eth1, killing the
//! server, taking the link down) and records the peer's `RESULT` line and
//! `rdma resource show` into `target/faults/`. The host then checks every
//! scenario against its expectation and prints one row per scenario.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::test::{leaks, parse_resources, Resources};
use crate::util::quote;
use crate::{step, util, vm, VmOpts};

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
    pub vm: VmOpts,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Expect {
    /// Every byte arrives exactly once, in order, verified.
    Delivered,
    /// The client sees one of these error statuses, then every request flushed back.
    ClientError(&'static [&'static str]),
    /// The local run reports this status (`event:<async event>`, or
    /// `refused:<error>` for a setup the library refuses).
    Local(&'static str),
}

impl Expect {
    fn describe(self) -> String {
        match self {
            Expect::Delivered => "all data, in order, verified".into(),
            Expect::ClientError(s) => format!("{} + flush, all buffers back", s.join("|")),
            Expect::Local(e) => e.replace(':', " "),
        }
    }
}

#[derive(Clone)]
struct Scenario {
    name: String,
    netem: Option<String>,
    server_args: String,
    client_args: String,
    /// Seconds after which vm0 kills the server with SIGKILL.
    kill_server_after: Option<f64>,
    /// (after, for): vm1's link loses carrier after `after` s for `for` s
    /// (the host pulls the virtual cable with QEMU's `set_link`; rxe1's
    /// port goes DOWN, eth1 stays configured).
    link_down: Option<(f64, f64)>,
    /// (after, for): vm1 runs `ip link set eth1 down` after `after` s for
    /// `for` s (an administrator taking the interface down).
    if_down: Option<(f64, f64)>,
    /// (after, for): vm1 drops every packet on eth1 (netem loss 100 %)
    /// after `after` s for `for` s: a path outage with the port still up.
    blackhole: Option<(f64, f64)>,
    /// Runs `fault_peer cq-overrun` on vm0 only.
    local: bool,
    expect: Expect,
    /// Upper bound for the client's stall (last success → first error), s.
    stall_bound: Option<f64>,
}

impl Scenario {
    fn transfer(name: &str, op: &str, mib: u64, netem: Option<&str>) -> Scenario {
        Scenario {
            name: name.into(),
            netem: netem.map(str::to_string),
            server_args: String::new(),
            client_args: format!("--op {op} --total {}", mib << 20),
            kill_server_after: None,
            link_down: None,
            if_down: None,
            blackhole: None,
            local: false,
            expect: Expect::Delivered,
            stall_bound: None,
        }
    }
}

/// The budget implied by the QP's timeout/retry settings: each try waits
/// 4.096 µs · 2^timeout, and there are retry_cnt + 1 tries.
fn retry_budget(timeout: u32, retry_cnt: u32) -> f64 {
    4.096e-6 * f64::from(1u32 << timeout) * f64::from(retry_cnt + 1)
}

fn scenarios(o: &FaultsOptions) -> Vec<Scenario> {
    let mib = o.total_mib;
    let mut v = Vec::new();
    let losses: &[&str] = if o.quick {
        &["2%"]
    } else {
        &["1%", "2%", "5%"]
    };
    for loss in losses {
        for op in ["send", "write", "read"] {
            v.push(Scenario::transfer(
                &format!("loss {loss} / {op}"),
                op,
                mib,
                Some(&format!("loss {loss}")),
            ));
        }
    }
    let shapes: &[(&str, &str)] = if o.quick {
        &[("reorder", "delay 2ms reorder 25% 50%")]
    } else {
        &[
            ("reorder", "delay 2ms reorder 25% 50%"),
            // A link is a FIFO: its delay varies, its order does not.
            // netem reorders jittered packets unless a rate is set (each
            // packet then leaves after the one before it); reordering has
            // its own row above.
            ("delay+jitter", "delay 3ms 2ms rate 1gbit"),
            ("duplicate", "duplicate 3%"),
        ]
    };
    for (label, netem) in shapes {
        for op in ["send", "write", "read"] {
            v.push(Scenario::transfer(
                &format!("{label} / {op}"),
                op,
                mib,
                Some(netem),
            ));
        }
    }
    // The failure scenarios move single-packet messages (1 KiB, the path
    // MTU): rxe in Linux 6.12 mishandles retransmitted multi-packet
    // messages under heavy emulation stalls (responder LOC_QP_OP_ERR),
    // which would mask the behaviour under test. ACK timeout 16 (268 ms)
    // with 6 retries: a budget of ~1.9 s. (rxe treats retry_cnt 7 as
    // "retry forever", like rnr_retry 7; IBA does not.)
    let small = " --msg-size 1024 --window 64 --timeout 16 --retry-cnt 6";
    let budget = retry_budget(16, 6);
    // Outages meant to be ridden out get ACK timeout 17 (537 ms): a budget
    // of ~3.8 s, well clear of the 0.5 s outage. rxe does not restart its
    // retry timer on every ACK (see rxe_comp.c: "some timeouts are
    // spurious"), so its effective budget is shorter than IBA's; with the
    // 1.9 s budget a 0.5 s path outage once ended in RETRY_EXC_ERR.
    let ride_out = " --msg-size 1024 --window 64 --timeout 17 --retry-cnt 6";
    // Peer killed mid-transfer.
    let mut kill = Scenario::transfer("peer killed / send", "send", 1024, None);
    kill.client_args.push_str(small);
    kill.client_args.push_str(" --deadline 120");
    kill.kill_server_after = Some(5.0);
    // The peer's QP vanishes: silence, so the retries run out. Or its
    // kernel still answers while it tears the dead process's QP down: a
    // NAK (remote operational error) ends the transfer at once. Both are
    // typed; seen on 6.1's rxe, once each way in consecutive runs.
    kill.expect = Expect::ClientError(&["RetryExcErr", "RemOpErr"]);
    kill.stall_bound = Some(4.0 * budget + 2.0);
    v.push(kill);
    // Path outage (every packet dropped, port up) shorter than the budget …
    let mut short = Scenario::transfer("path outage 0.5 s / send", "send", mib.max(32), None);
    short.client_args.push_str(ride_out);
    short.blackhole = Some((1.5, 0.5));
    v.push(short);
    // … and longer than it.
    let mut long = Scenario::transfer("path outage 12 s / send", "send", 1024, None);
    long.client_args.push_str(small);
    long.client_args.push_str(" --deadline 120");
    long.blackhole = Some((1.5, 12.0));
    long.expect = Expect::ClientError(&["RetryExcErr"]);
    long.stall_bound = Some(4.0 * budget + 2.0);
    v.push(long);
    // Link down (carrier lost, port DOWN) shorter and longer than the
    // budget: a pulled cable. Packets sent meanwhile are lost, so the
    // transport's retries decide, as for the path outage.
    let mut down_short = Scenario::transfer("link down 0.5 s / send", "send", mib.max(32), None);
    down_short.client_args.push_str(ride_out);
    down_short.link_down = Some((1.5, 0.5));
    v.push(down_short);
    let mut down_long = Scenario::transfer("link down 12 s / send", "send", 1024, None);
    down_long.client_args.push_str(small);
    down_long.client_args.push_str(" --deadline 120");
    down_long.link_down = Some((1.5, 12.0));
    down_long.expect = Expect::ClientError(&["RetryExcErr"]);
    // rxe takes longer to give up here than on the path outage (7.1 and
    // 9.5 s in our runs against 2.0 s; not root-caused — sends queue behind
    // the stopped transmit queue until the kernel's link watch drops them,
    // and rxe re-arms its retry timer only when a packet leaves). The
    // bound is the outage itself: typed errors while the link is still
    // down, never a hang until it returns.
    down_long.stall_bound = Some(12.0);
    v.push(down_long);
    // The interface taken down by an administrator (`ip link set down`):
    // rxe cannot route, fails the send it is transmitting as LOC_QP_OP_ERR
    // (6.1) or flushes the QP (6.12), or sometimes neither retries nor
    // fails (the send never left, so no retransmit timer runs). The
    // client's progress watchdog then moves the QP to ERR, as an
    // application would, and the requests flush with typed errors; the row
    // says when that happened.
    let mut ifdown = Scenario::transfer("interface down 12 s / send", "send", 1024, None);
    ifdown.client_args.push_str(small);
    ifdown.client_args.push_str(" --deadline 120");
    ifdown
        .client_args
        .push_str(&format!(" --stall-timeout {:.1}", 2.0 * budget + 1.0));
    ifdown.if_down = Some((1.5, 12.0));
    ifdown.expect = Expect::ClientError(&["RetryExcErr", "WrFlushErr", "LocQpOpErr"]);
    ifdown.stall_bound = Some(4.0 * budget + 2.0);
    v.push(ifdown);
    // Receiver late with its receives: infinite RNR retry recovers …
    let mut rnr_ok = Scenario::transfer("RNR, rnr_retry 7 (infinite)", "send", 1, None);
    rnr_ok.server_args = "--recv-delay-ms 3000".into();
    rnr_ok
        .client_args
        .push_str(" --msg-size 1024 --rnr-retry 7");
    v.push(rnr_ok);
    // … a finite one fails typed.
    let mut rnr_fail = Scenario::transfer("RNR, rnr_retry 1", "send", 1, None);
    rnr_fail.server_args = "--recv-delay-ms 3000".into();
    rnr_fail
        .client_args
        .push_str(" --msg-size 1024 --rnr-retry 1 --deadline 60");
    rnr_fail.expect = Expect::ClientError(&["RnrRetryExcErr"]);
    v.push(rnr_fail);
    // CQ overrun (one host).
    v.push(Scenario {
        name: "CQ overrun".into(),
        netem: None,
        server_args: String::new(),
        client_args: String::new(),
        kill_server_after: None,
        link_down: None,
        if_down: None,
        blackhole: None,
        local: true,
        expect: Expect::Local("refused:CqTooSmall"),
        stall_bound: None,
    });
    if let Some(only) = &o.only {
        v.retain(|s| s.name.contains(only.as_str()));
    }
    if o.repeat > 1 {
        v = v
            .iter()
            .flat_map(|s| {
                (1..=o.repeat).map(move |k| Scenario {
                    name: format!("{} #{k}", s.name),
                    ..s.clone()
                })
            })
            .collect();
    }
    v
}

/// The shell script one VM runs: every scenario in order.
fn script(role: usize, list: &[Scenario], peer: &Path, out: &Path) -> String {
    let f = quote(&peer.to_string_lossy());
    let d = quote(&out.to_string_lossy());
    let mut s = String::new();
    let _ = writeln!(
        s,
        "set -u; F={f}; D={d}; PEER=\"$XTASK_PEER_ADDR\"; PORT=/sys/class/infiniband/rxe1/ports/1/state"
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
    for (i, sc) in list.iter().enumerate() {
        let port = 7000 + i;
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
            if role == 0 {
                let _ = writeln!(
                    s,
                    "timeout 600 $F server -d rxe1 -p {port} --deadline 500 {} > $D/{i}.server.out 2>&1 & pid=$!",
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
                let _ = writeln!(
                    s,
                    "timeout 600 $F client \"$PEER\" -d rxe1 -p {port} {} > $D/{i}.client.out 2>&1 & pid=$!",
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
                if let Some((after, dur)) = sc.blackhole {
                    let _ = writeln!(
                        s,
                        "sleep {after}; tc qdisc change dev eth1 root netem loss 100% 2>>$E || echo 'tc netem loss 100% failed' >> $E; sleep {dur}; tc qdisc change dev eth1 root netem loss 0% 2>>$E || echo 'tc netem loss 0% failed' >> $E"
                    );
                }
            }
            let _ = writeln!(s, "wait $pid; echo exit=$? >> $D/{i}.{side}.out");
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

/// `key=value` fields of the last RESULT line of a file.
fn result_fields(path: &Path) -> Option<BTreeMap<String, String>> {
    let text = fs::read_to_string(path).ok()?;
    let line = text.lines().rev().find(|l| l.starts_with("RESULT "))?;
    Some(
        line.split_whitespace()
            .skip(1)
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    )
}

fn num(f: &BTreeMap<String, String>, k: &str) -> u64 {
    f.get(k).and_then(|v| v.parse().ok()).unwrap_or(0)
}

struct Row {
    name: String,
    expected: String,
    observed: String,
    verified: String,
    pass: bool,
}

/// `rdma statistic show link` output as counter → value.
fn parse_counters(text: &str) -> BTreeMap<String, u64> {
    let words: Vec<&str> = text.split_whitespace().collect();
    words
        .windows(2)
        .filter_map(|w| Some((w[0].to_string(), w[1].parse().ok()?)))
        .collect()
}

/// What rxe counted during scenario `i` on both hosts (the nonzero ones of
/// interest), e.g. `client retries 3, server dup requests 120`.
fn counters(i: usize, dir: &Path) -> Option<String> {
    let delta = |role: usize| -> Option<BTreeMap<String, u64>> {
        let read = |k: &str| {
            fs::read_to_string(dir.join(format!("{i}.{role}.stat-{k}")))
                .ok()
                .map(|t| parse_counters(&t))
        };
        let (pre, post) = (read("pre")?, read("post")?);
        Some(
            post.iter()
                .map(|(k, v)| (k.clone(), v.saturating_sub(*pre.get(k).unwrap_or(&0))))
                .collect(),
        )
    };
    let (server, client) = (delta(0)?, delta(1)?);
    let pick = [
        (&client, "completer_retry_err", "client retries"),
        (&client, "rcvd_seq_err", "client seq NAKs"),
        (&client, "rcvd_rnr_err", "client RNR NAKs"),
        (&server, "duplicate_request", "server dup requests"),
        (&server, "out_of_seq_request", "server out-of-seq"),
        (&server, "send_rnr_err", "server RNR sent"),
        // rxe_xmit_packet failures (the qdisc refused a packet): 6.12's
        // requester then fails the QP (LOC_QP_OP_ERR); 6.1's rolls the
        // packet back and sends it again.
        (&client, "send_err", "client xmit errors"),
        (&server, "send_err", "server xmit errors"),
    ];
    let parts: Vec<String> = pick
        .iter()
        .filter_map(|(m, k, label)| {
            m.get(*k)
                .filter(|v| **v > 0)
                .map(|v| format!("{label} {v}"))
        })
        .collect();
    Some(if parts.is_empty() {
        "none".into()
    } else {
        parts.join(", ")
    })
}

fn evaluate(i: usize, sc: &Scenario, dir: &Path, baseline: &[Resources; 2]) -> Row {
    let get = |side: &str| result_fields(&dir.join(format!("{i}.{side}.out")));
    let mut problems = Vec::new();
    let (observed, verified) = match sc.expect {
        Expect::Local(want) => match get("local") {
            Some(f) => {
                let st = f.get("status").cloned().unwrap_or_default();
                if st != want {
                    problems.push(format!("status {st}"));
                }
                (st, "-".to_string())
            }
            None => {
                problems.push("no RESULT".into());
                ("no result".into(), "-".into())
            }
        },
        _ => {
            let client = get("client");
            let server = get("server");
            match &client {
                None => {
                    problems.push("client printed no RESULT".into());
                    ("no result".into(), "-".into())
                }
                Some(c) => {
                    let st = c.get("status").cloned().unwrap_or_default();
                    let (posted, returned) = (num(c, "posted"), num(c, "returned"));
                    if posted != returned {
                        problems.push(format!("{returned} of {posted} buffers returned"));
                    }
                    let verified = num(c, "verified");
                    let msgs = num(c, "msgs");
                    match sc.expect {
                        Expect::Delivered => {
                            if st != "ok" {
                                problems.push(format!("client {st}"));
                            }
                            if verified != msgs || msgs == 0 {
                                problems.push(format!("{verified}/{msgs} verified"));
                            }
                            if let Some(s) = &server {
                                let sst = s.get("status").cloned().unwrap_or_default();
                                if sst != "ok" {
                                    problems.push(format!("server {sst}"));
                                }
                                // What the server found wrong with the data.
                                let text = fs::read_to_string(dir.join(format!("{i}.server.out")))
                                    .unwrap_or_default();
                                for l in text.lines().filter(|l| l.contains(": message ")) {
                                    problems.push(l.trim().to_string());
                                }
                            } else {
                                problems.push("server printed no RESULT".into());
                            }
                        }
                        Expect::ClientError(allowed) => {
                            let first = c.get("first_error").cloned().unwrap_or_default();
                            if !allowed.contains(&first.as_str()) || st != format!("error:{first}")
                            {
                                problems.push(format!("status {st}, first error {first}"));
                            }
                            if let Some(bound) = sc.stall_bound {
                                let stall: f64 = c
                                    .get("stall_secs")
                                    .and_then(|v| v.parse().ok())
                                    .unwrap_or(f64::MAX);
                                if stall > bound {
                                    problems
                                        .push(format!("error after {stall:.1} s > {bound:.1} s"));
                                }
                            }
                        }
                        Expect::Local(_) => {}
                    }
                    let obs = format!(
                        "{st}, first {} after {} s{}, {returned}/{posted} back, {:.1} s",
                        c.get("first_error").map_or("-", String::as_str),
                        c.get("stall_secs").map_or("-", String::as_str),
                        if c.get("watchdog").is_some_and(|w| w == "1") {
                            " (app progress watchdog)"
                        } else {
                            ""
                        },
                        c.get("secs")
                            .and_then(|v| v.parse::<f64>().ok())
                            .unwrap_or(0.0)
                    );
                    let obs = match counters(i, dir) {
                        Some(c) => format!("{obs}; rxe: {c}"),
                        None => obs,
                    };
                    (
                        obs,
                        format!("{verified}/{msgs} msgs, {} MiB", num(c, "bytes") >> 20),
                    )
                }
            }
        }
    };
    // Every fault was applied as scripted.
    for role in 0..2 {
        let errs =
            fs::read_to_string(dir.join(format!("{i}.{role}.fault-errors"))).unwrap_or_default();
        if !errs.trim().is_empty() {
            problems.push(format!(
                "vm{role}: {}",
                errs.lines().collect::<Vec<_>>().join(" / ")
            ));
        }
    }
    // The carrier really went down and up (the host's answers).
    if sc.link_down.is_some() {
        let log = fs::read_to_string(dir.join(format!("{i}.link"))).unwrap_or_default();
        let answers = log.lines().filter(|l| l.ends_with(" ok")).count();
        if answers != 2 || !log.contains("port before up: 1: DOWN") {
            problems.push(format!(
                "link control: {}",
                log.lines().collect::<Vec<_>>().join(" / ")
            ));
        }
    }
    // No leaked objects on either host after the scenario.
    for (role, base) in baseline.iter().enumerate() {
        match fs::read_to_string(dir.join(format!("{i}.{role}.res"))) {
            Ok(text) => {
                let l = leaks(base, &parse_resources(&text), None);
                if !l.is_empty() {
                    problems.push(format!("vm{role} leaked: {}", l.join(", ")));
                }
            }
            Err(_) => problems.push(format!("vm{role}: no resource snapshot")),
        }
    }
    let pass = problems.is_empty();
    Row {
        name: sc.name.clone(),
        expected: sc.expect.describe(),
        observed: if pass {
            observed
        } else {
            format!("{observed} — {}", problems.join("; "))
        },
        verified,
        pass,
    }
}

fn table(rows: &[Row]) -> String {
    let mut s = String::from(
        "| scenario | expected | observed | data verified | result |\n|---|---|---|---|---|\n",
    );
    for r in rows {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} |",
            r.name,
            r.expected,
            r.observed,
            r.verified,
            if r.pass { "pass" } else { "FAIL" }
        );
    }
    s
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

/// Runs the fault-injection scenarios; `Ok(true)` when all pass.
pub fn cmd_faults(o: &FaultsOptions) -> Result<bool> {
    let repo = crate::repo_root()?;
    if std::env::var_os("XTASK_KERNEL_PACKAGE").is_none() {
        match newest_61_kernel() {
            Some(p) => {
                step!("faults: using {p} (rxe in 6.12 is unstable under netem; see faults.rs)");
                std::env::set_var("XTASK_KERNEL_PACKAGE", p);
            }
            None => step!("faults: no Debian 6.1 kernel package found; using the default kernel"),
        }
    }
    step!("faults: building fault_peer (release)");
    let mut b = util::cargo();
    b.args([
        "build",
        "--release",
        "-p",
        "ibverbs-suite",
        "--bin",
        "fault_peer",
    ]);
    util::run_visible(&mut b)?;
    let peer = repo.join("target/release/fault_peer");
    let dir: PathBuf = repo.join("target/faults");
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let list = scenarios(o);
    step!(
        "faults: {} scenarios, {} MiB per transfer{}",
        list.len(),
        o.total_mib,
        if o.quick { " (quick profile)" } else { "" }
    );
    let s0 = script(0, &list, &peer, &dir);
    let s1 = script(1, &list, &peer, &dir);
    fs::write(dir.join("vm0.sh"), &s0)?;
    fs::write(dir.join("vm1.sh"), &s1)?;
    let cmd = |i: usize| {
        format!(
            "sh {}",
            quote(&dir.join(format!("vm{i}.sh")).to_string_lossy())
        )
    };
    let vms = vm::pair(&cmd(0), &cmd(1), &o.vm)?;
    let session = vm::Session::new()?;
    let outcomes = session.run(&vms, o.vm.timeout())?;
    for out in &outcomes {
        if !out.success() {
            step!("faults: {}", out.describe());
        }
    }
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
    let report = format!(
        "# Fault injection (`cargo xtask faults`)\n\nTwo SoftRoCE VMs, RoCE v2 over a \
         virtual link (rxe1 on eth1); {} MiB per transfer; raw outputs in `target/faults/`.\n\n{t}\n{} passed, {failed} failed\n",
        o.total_mib,
        rows.len() - failed
    );
    fs::write(dir.join("report.md"), &report)?;
    // What the peers printed in a failed row (CI keeps the log's tail).
    for (i, row) in rows.iter().enumerate().filter(|(_, r)| !r.pass) {
        for side in ["client", "server", "local"] {
            let Ok(text) = fs::read_to_string(dir.join(format!("{i}.{side}.out"))) else {
                continue;
            };
            let lines: Vec<&str> = text.lines().collect();
            println!("--- {} ({side}, last lines of {i}.{side}.out)", row.name);
            for l in &lines[lines.len().saturating_sub(8)..] {
                println!("    {l}");
            }
        }
    }
    println!("\n{t}");
    println!("faults: {} passed, {failed} failed", rows.len() - failed);
    Ok(failed == 0 && outcomes.iter().all(|o| o.success()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_and_scripts() {
        assert!((retry_budget(14, 7) - 0.537).abs() < 0.01);
        let o = FaultsOptions {
            total_mib: 8,
            quick: true,
            only: None,
            repeat: 1,
            vm: VmOpts {
                mem: "2G".into(),
                smp: 1,
                timeout: 10,
                env: vec![],
                verbose: false,
                kernel_args: vec![],
            },
        };
        let list = scenarios(&o);
        assert!(list.iter().any(|s| s.name.starts_with("peer killed")));
        let s = script(1, &list, Path::new("/r/fp"), Path::new("/r/out"));
        assert!(s.contains("ip link set eth1 down"));
        assert!(s.contains("link down >>") && s.contains("link up >>"));
        assert!(s.contains("tc qdisc add dev eth1 root netem loss 2%"));
        assert!(s.contains("rdma statistic show link rxe1/1 > $D/0.1.stat-pre"));
        // A path outage changes a netem the client installed before its
        // transfer (never adds a root qdisc mid-transfer) and removes it
        // after; the server side touches no qdisc for it.
        let outage: Vec<Scenario> = list
            .iter()
            .filter(|s| s.blackhole.is_some())
            .cloned()
            .collect();
        assert!(!outage.is_empty());
        let c = script(1, &outage, Path::new("/r/fp"), Path::new("/r/out"));
        let add = c.find("tc qdisc add dev eth1 root netem loss 0%").unwrap();
        let start = c.find("$F client").unwrap();
        let cut = c
            .find("tc qdisc change dev eth1 root netem loss 100%")
            .unwrap();
        let del = c.find("tc qdisc del dev eth1 root").unwrap();
        assert!(add < start && start < cut && cut < del);
        assert!(!c.contains("tc qdisc add dev eth1 root netem loss 100%"));
        let srv = script(0, &outage, Path::new("/r/fp"), Path::new("/r/out"));
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

    #[test]
    fn rxe_counters_are_reported_as_deltas() {
        let dir = std::env::temp_dir().join(format!("xtask-counters-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let line = |retry: u64, dup: u64| {
            format!(
                "link rxe1/1 sent_pkts 10 duplicate_request {dup} completer_retry_err {retry} \
                 rcvd_seq_err 0\n"
            )
        };
        fs::write(dir.join("4.0.stat-pre"), line(0, 100)).unwrap();
        fs::write(dir.join("4.0.stat-post"), line(0, 130)).unwrap();
        fs::write(dir.join("4.1.stat-pre"), line(2, 0)).unwrap();
        fs::write(dir.join("4.1.stat-post"), line(5, 0)).unwrap();
        assert_eq!(
            counters(4, &dir).as_deref(),
            Some("client retries 3, server dup requests 30")
        );
        fs::write(dir.join("4.1.stat-post"), line(2, 0)).unwrap();
        fs::write(dir.join("4.0.stat-post"), line(0, 100)).unwrap();
        assert_eq!(counters(4, &dir).as_deref(), Some("none"));
        assert_eq!(counters(5, &dir), None);
        let _ = fs::remove_dir_all(&dir);
    }
}
