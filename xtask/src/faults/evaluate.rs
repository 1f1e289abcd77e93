//! Reading what the peers left in `target/faults/` into one row per scenario.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs;
use std::path::Path;

use super::scenarios::{Expect, Scenario};
use crate::test::{leaks, parse_resources, Resources};

/// `key=value` fields of the last RESULT line of a file.
fn result_fields(path: &Path) -> Option<BTreeMap<String, String>> {
    line_fields(&fs::read_to_string(path).ok()?, "RESULT ")
}

/// `key=value` fields of the last line of `text` starting with `tag` (the
/// peers' `RESULT`, the soak's `SOAK`/`SERVER` lines).
pub(crate) fn line_fields(text: &str, tag: &str) -> Option<BTreeMap<String, String>> {
    let line = text.lines().rev().find(|l| l.starts_with(tag))?;
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

/// One row of the fault matrix.
#[derive(Clone)]
pub(super) struct Row {
    pub(super) name: String,
    pub(super) expected: String,
    pub(super) observed: String,
    pub(super) verified: String,
    pub(super) pass: bool,
    /// The row finished on both VMs (its resource snapshots exist); a run
    /// cut short (a timeout, a kernel crash, a kill) leaves the rest unrun.
    pub(super) ran: bool,
}

/// `rdma statistic show link` output as counter → value.
pub(crate) fn parse_counters(text: &str) -> BTreeMap<String, u64> {
    let words: Vec<&str> = text.split_whitespace().collect();
    words
        .windows(2)
        .filter_map(|w| Some((w[0].to_string(), w[1].parse().ok()?)))
        .collect()
}

/// What rxe counted during scenario `i` on both hosts (the nonzero ones of
/// interest), e.g. `client retries 3, server dup requests 120`. In a
/// workload row (`both`) each VM is requester and responder: every counter
/// of interest of each, named by its VM.
pub(super) fn counters(i: usize, dir: &Path, both: bool) -> Option<String> {
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
    if both {
        let keys = [
            ("completer_retry_err", "retries"),
            ("rcvd_seq_err", "seq NAKs"),
            ("rcvd_rnr_err", "RNR NAKs"),
            ("duplicate_request", "dup requests"),
            ("out_of_seq_request", "out-of-seq"),
            ("send_rnr_err", "RNR sent"),
            ("send_err", "xmit errors"),
        ];
        let parts: Vec<String> = [(&server, "vm0"), (&client, "vm1")]
            .iter()
            .flat_map(|(m, vm)| {
                keys.iter().filter_map(move |(k, label)| {
                    m.get(*k)
                        .filter(|v| **v > 0)
                        .map(|v| format!("{vm} {label} {v}"))
                })
            })
            .collect();
        return Some(if parts.is_empty() {
            "none".into()
        } else {
            parts.join(", ")
        });
    }
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

/// What one workload process's output says: its exit status (the
/// `exit=N` line the script appends) and its last line before that.
fn outcome(text: &str) -> (Option<i32>, Option<&str>) {
    let mut lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let exit = match lines.last().and_then(|l| l.strip_prefix("exit=")) {
        Some(code) => {
            let code = code.trim().parse().ok();
            lines.pop();
            code
        }
        None => None,
    };
    (exit, lines.last().map(|l| l.trim()))
}

/// A workload row: every process exited 0 with a final line containing
/// `proof` (`VERIFIED`, or a C tool's success line); anything else is a
/// problem. Returns the observed and the verified columns.
fn workload(
    i: usize,
    sc: &Scenario,
    proof: &str,
    dir: &Path,
    problems: &mut Vec<String>,
) -> (String, String) {
    let mut notes = Vec::new();
    let mut ok = 0;
    for p in &sc.procs {
        let text = fs::read_to_string(dir.join(p.out_file(i))).unwrap_or_default();
        match outcome(&text) {
            (Some(0), Some(last)) if last.contains(proof) => ok += 1,
            (exit, last) => {
                let exit = exit.map_or("no exit status".to_string(), |c| format!("exit {c}"));
                let mut last = last.unwrap_or("no output").to_string();
                if last.len() > 120 {
                    let cut = (0..=120)
                        .rev()
                        .find(|&n| last.is_char_boundary(n))
                        .unwrap_or(0);
                    last.truncate(cut);
                    last.push('…');
                }
                problems.push(format!("{}: {exit}, last line `{last}`", p.label));
            }
        }
        // The measurement the process printed (a client's last IOPS line,
        // a rank's median time, a multicast receiver's count), for the
        // reader; not checked.
        if let Some(m) = ["IOPS", "median", "busbw", "messages verified"]
            .iter()
            .find_map(|k| text.lines().rev().find(|l| l.contains(k)))
        {
            let m = m.split_whitespace().collect::<Vec<_>>().join(" ");
            // `rank 0 of 3: …` names itself already.
            notes.push(match m.starts_with(&p.label) {
                true => m,
                false => format!("{}: {m}", p.label),
            });
        }
    }
    let passed = if proof == "VERIFIED" {
        "VERIFIED"
    } else {
        "passed"
    };
    let mut obs = if ok == sc.procs.len() {
        format!("{ok} {passed}")
    } else {
        format!("{ok} of {} {passed}", sc.procs.len())
    };
    for n in notes {
        let _ = write!(obs, "; {n}");
    }
    if let Some(c) = counters(i, dir, true) {
        let _ = write!(obs, "; rxe: {c}");
    }
    let verified = format!("{ok}/{} processes", sc.procs.len());
    (obs, verified)
}

pub(super) fn evaluate(i: usize, sc: &Scenario, dir: &Path, baseline: &[Resources; 2]) -> Row {
    let get = |side: &str| result_fields(&dir.join(format!("{i}.{side}.out")));
    let mut problems = Vec::new();
    let (observed, verified) = match sc.expect {
        Expect::Verified | Expect::LastLine(_) => {
            let proof = sc.expect.proof().unwrap_or("VERIFIED");
            workload(i, sc, proof, dir, &mut problems)
        }
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
                            // What the client found wrong (an atomic's result).
                            let text = fs::read_to_string(dir.join(format!("{i}.client.out")))
                                .unwrap_or_default();
                            for l in text.lines().filter(|l| l.contains("client: fetch-and-add")) {
                                problems.push(l.trim().to_string());
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
                        Expect::Local(_) | Expect::Verified | Expect::LastLine(_) => {}
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
                    let obs = match counters(i, dir, false) {
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
        // vm1's process saw the port go down and come back: PORT_ERR,
        // then PORT_ACTIVE, as asynchronous events of its context.
        let events = fs::read_to_string(dir.join(format!("{i}.1.events"))).unwrap_or_default();
        if let Some(p) = port_events_problem(&events) {
            problems.push(p);
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
    let ran = (0..2).all(|role| dir.join(format!("{i}.{role}.res")).exists());
    if !ran {
        problems.insert(0, "did not finish (the VM run ended first)".into());
    }
    let pass = problems.is_empty();
    Row {
        ran,
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

pub(super) fn table(rows: &[Row]) -> String {
    let mut s = String::from(
        "| scenario | expected | observed | data verified | result |\n|---|---|---|---|---|\n",
    );
    // A `|` inside a cell (`RetryExcErr|RemOpErr`) would end it.
    let cell = |t: &str| t.replace('|', "\\|");
    for r in rows {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} |",
            cell(&r.name),
            cell(&r.expected),
            cell(&r.observed),
            cell(&r.verified),
            if r.pass { "pass" } else { "FAIL" }
        );
    }
    s
}

/// What is wrong with vm1's `asyncwatch` output of a link-down row: it must
/// hold `IBV_EVENT_PORT_ERR` and, after it, `IBV_EVENT_PORT_ACTIVE`.
pub(super) fn port_events_problem(events: &str) -> Option<String> {
    let err = events.find("IBV_EVENT_PORT_ERR");
    let active = err.and_then(|at| events[at..].find("IBV_EVENT_PORT_ACTIVE"));
    if err.is_some() && active.is_some() {
        return None;
    }
    let lines: Vec<&str> = events.lines().map(str::trim).collect();
    Some(format!(
        "port events: expected PORT_ERR then PORT_ACTIVE, saw: {}",
        if lines.is_empty() {
            "nothing".to_string()
        } else {
            lines.join(" / ")
        }
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

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
            counters(4, &dir, false).as_deref(),
            Some("client retries 3, server dup requests 30")
        );
        fs::write(dir.join("4.1.stat-post"), line(2, 0)).unwrap();
        fs::write(dir.join("4.0.stat-post"), line(0, 100)).unwrap();
        assert_eq!(counters(4, &dir, false).as_deref(), Some("none"));
        // A workload row: each VM is requester and responder, named by VM.
        fs::write(dir.join("4.1.stat-post"), line(5, 7)).unwrap();
        fs::write(dir.join("4.0.stat-post"), line(1, 130)).unwrap();
        assert_eq!(
            counters(4, &dir, true).as_deref(),
            Some("vm0 retries 1, vm0 dup requests 30, vm1 retries 3, vm1 dup requests 7")
        );
        assert_eq!(counters(5, &dir, false), None);
        let _ = fs::remove_dir_all(&dir);
    }

    /// A workload row passes only when every process exited 0 with a final
    /// `VERIFIED` line and nothing leaked; each way of missing that fails it.
    #[test]
    fn workload_rows_need_every_verified() {
        use super::super::scenarios::Proc;
        let dir = std::env::temp_dir().join(format!("xtask-workload-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let procs: Vec<Proc> = (0..3)
            .map(|r| Proc {
                role: r % 2,
                label: format!("rank {r}"),
                program: "allreduce",
                after: 0,
                args: String::new(),
            })
            .collect();
        let sc = Scenario::workload("allreduce / 3 ranks", None, procs);
        let res = "0: rxe1: pd 0 cq 0 qp 0 mr 0\n";
        let base = [parse_resources(res), parse_resources(res)];
        let verified =
            "rank 0 of 3: 65536 floats, median 9.5 us\nalgbw 0.001 GB/s  busbw 0.002 GB/s\n\
                        VERIFIED: every element of 10 iterations is the exact sum\nexit=0\n";
        let row = |outs: [&str; 3], res1: &str| {
            for (r, text) in outs.iter().enumerate() {
                fs::write(dir.join(format!("7.rank_{r}.out")), text).unwrap();
            }
            fs::write(dir.join("7.0.res"), res).unwrap();
            fs::write(dir.join("7.1.res"), res1).unwrap();
            evaluate(7, &sc, &dir, &base)
        };
        let ok = row([verified; 3], res);
        assert!(ok.pass, "{}", ok.observed);
        assert_eq!(ok.verified, "3/3 processes");
        assert!(ok.observed.starts_with(
            "3 VERIFIED; rank 0 of 3: 65536 floats, median 9.5 us; rank 1: rank 0 of 3"
        ));
        assert_eq!(ok.expected, "every process VERIFIED, exit 0");
        // Exit 0 without the VERIFIED line (a program that stopped checking).
        let quiet = "rank 2 of 3\nalgbw 0.001 GB/s  busbw 0.002 GB/s\nexit=0\n";
        let r = row([verified, verified, quiet], res);
        assert!(!r.pass);
        assert!(r.observed.contains("2 of 3 VERIFIED"));
        assert!(r
            .observed
            .contains("rank 2: exit 0, last line `algbw 0.001 GB/s  busbw"));
        // VERIFIED printed, then a failing exit; no exit status at all (killed VM).
        let late = verified.replace("exit=0", "exit=1");
        let r = row([verified, &late, "VERIFIED\n"], res);
        assert!(!r.pass);
        assert!(r.observed.contains("rank 1: exit 1"));
        assert!(r.observed.contains("rank 2: no exit status"));
        // VERIFIED everywhere, but vm1 kept a queue pair.
        let r = row([verified; 3], "0: rxe1: pd 0 cq 0 qp 1 mr 0\n");
        assert!(!r.pass);
        assert!(r.observed.contains("vm1 leaked: rxe1 qp 0 -> 1"));
        let _ = fs::remove_dir_all(&dir);
    }

    /// A C tool's row passes on its own success line: `return status 0`
    /// and exit 0 for every process; a failing status fails it.
    #[test]
    fn last_line_rows_need_every_status_0() {
        use super::super::scenarios::Proc;
        let dir = std::env::temp_dir().join(format!("xtask-lastline-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let procs: Vec<Proc> = ["receiver", "C sender"]
            .iter()
            .enumerate()
            .map(|(r, l)| Proc {
                role: 1 - r,
                label: l.to_string(),
                program: "mckey",
                after: 0,
                args: String::new(),
            })
            .collect();
        let sc = Scenario {
            expect: Expect::LastLine("return status 0"),
            ..Scenario::workload("multicast / C sender", None, procs)
        };
        let res = "0: rxe1: pd 0 cq 0 qp 0 mr 0\n";
        let base = [parse_resources(res), parse_resources(res)];
        fs::write(dir.join("3.0.res"), res).unwrap();
        fs::write(dir.join("3.1.res"), res).unwrap();
        let row = |recv: &str, send: &str| {
            fs::write(dir.join("3.receiver.out"), recv).unwrap();
            fs::write(dir.join("3.C_sender.out"), send).unwrap();
            evaluate(3, &sc, &dir, &base)
        };
        let good = "receiving data transfers\n20 messages verified\ndata transfers complete\ntest complete\nreturn status 0\nexit=0\n";
        let ok = row(good, "test complete\nreturn status 0\nexit=0\n");
        assert!(ok.pass, "{}", ok.observed);
        assert_eq!(ok.expected, "every process `return status 0`, exit 0");
        assert!(
            ok.observed
                .starts_with("2 passed; receiver: 20 messages verified"),
            "{}",
            ok.observed
        );
        let bad = row(
            good,
            "mckey: failed\ntest complete\nreturn status 1\nexit=1\n",
        );
        assert!(!bad.pass);
        assert!(bad.observed.contains("1 of 2 passed"), "{}", bad.observed);
        assert!(bad
            .observed
            .contains("C sender: exit 1, last line `return status 1`"));
        // Exit 0 without the success line (a tool that stopped short).
        let short = row(good, "initiating data transfers\nexit=0\n");
        assert!(!short.pass);
        assert!(short
            .observed
            .contains("C sender: exit 0, last line `initiating data transfers`"));
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn port_events_need_err_then_active() {
        let ok = "rxe1: async event FD 3\n  event_type IBV_EVENT_PORT_ERR (10), port 1\n  event_type IBV_EVENT_GID_CHANGE (18), port 1\n  event_type IBV_EVENT_PORT_ACTIVE (9), port 1\n";
        assert_eq!(port_events_problem(ok), None);
        let reversed = "  event_type IBV_EVENT_PORT_ACTIVE (9), port 1\n  event_type IBV_EVENT_PORT_ERR (10), port 1\n";
        assert!(port_events_problem(reversed).is_some());
        let none = port_events_problem("").unwrap();
        assert!(none.ends_with("saw: nothing"), "{none}");
    }
}
