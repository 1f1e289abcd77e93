//! The VM side of `cargo xtask bench` (`xtask bench --run-plan FILE`): runs every server/client
//! pair of the plan in order, each with its own TCP port, and appends one JSON record per run to
//! the results file as it goes, so a VM that dies part-way still leaves what it measured.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::analysis;
use super::plan::{Plan, RunSpec};
use crate::step;

/// How long a server may take to listen on its TCP port (it opens the device first).
const LISTEN_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the server may take to exit after its client did.
const SERVER_GRACE: Duration = Duration::from_secs(20);
/// Why runs after the deadline are not run (see `Plan::deadline_secs`).
pub const NOT_RUN_TIME: &str =
    "not run: the VM's time limit was near (raise it with --timeout SECS)";

/// Poll interval while waiting; coarse so the waiting costs the measured tools nothing.
const POLL: Duration = Duration::from_millis(20);

/// How a process of a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Exit {
    NotStarted,
    Code(i32),
    Signal(i32),
    /// We killed it (timeout).
    Killed,
}

impl Exit {
    fn from_status(st: ExitStatus) -> Exit {
        match (st.code(), st.signal()) {
            (Some(c), _) => Exit::Code(c),
            (None, Some(s)) => Exit::Signal(s),
            (None, None) => Exit::Killed,
        }
    }

    pub fn describe(self) -> String {
        match self {
            Exit::NotStarted => "did not start".into(),
            Exit::Code(c) => format!("exited with status {c}"),
            Exit::Signal(s) => format!("was killed by signal {s}"),
            Exit::Killed => "timed out and was killed".into(),
        }
    }
}

/// What happened in one run (the numbers are parsed later from the raw files).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RunRecord {
    pub seq: usize,
    pub id: String,
    pub server_exit: Exit,
    pub client_exit: Exit,
    /// A problem of the run itself (timeouts, a server that never listened, …).
    pub problem: Option<String>,
    /// From starting the server to its port listening.
    pub listen_secs: f64,
    /// From starting the client to its exit.
    pub client_secs: f64,
    pub server_out: PathBuf,
    pub client_out: PathBuf,
    /// The background processes' (`RunSpec::extra`) exits and outputs, in order.
    #[serde(default)]
    pub extra_exits: Vec<Exit>,
    #[serde(default)]
    pub extra_outs: Vec<PathBuf>,
}

/// Raw output files of a run: `<raw>/<seq>-<id>.{server,client}.txt`.
pub fn raw_paths(raw_dir: &Path, spec: &RunSpec) -> (PathBuf, PathBuf) {
    let stem = format!("{:03}-{}", spec.seq, spec.id);
    (
        raw_dir.join(format!("{stem}.server.txt")),
        raw_dir.join(format!("{stem}.client.txt")),
    )
}

/// Raw output of the `k`-th background process of a run: `<raw>/<seq>-<id>.extra<k>.txt`.
pub fn extra_path(raw_dir: &Path, spec: &RunSpec, k: usize) -> PathBuf {
    raw_dir.join(format!("{:03}-{}.extra{k}.txt", spec.seq, spec.id))
}

/// `xtask bench --run-plan FILE`, inside the VM. True when every run succeeded.
pub fn run_plan(path: &Path) -> Result<bool> {
    let text =
        fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let plan: Plan = serde_json::from_str(&text).context("cannot parse the bench plan")?;
    fs::create_dir_all(&plan.raw_dir)
        .with_context(|| format!("cannot create {}", plan.raw_dir.display()))?;
    write_vm_env(&plan.vm_env);
    let mut results = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&plan.results)
        .with_context(|| format!("cannot open {}", plan.results.display()))?;
    let total = plan.runs.len();
    let mut failed = 0;
    let mut said_out_of_time = false;
    let start = Instant::now();
    for spec in &plan.runs {
        let out_of_time = plan
            .deadline_secs
            .is_some_and(|d| start.elapsed() >= Duration::from_secs(d));
        let rec = if out_of_time {
            not_run(spec, &plan, NOT_RUN_TIME)
        } else {
            run_one(spec, &plan)
        };
        writeln!(results, "{}", serde_json::to_string(&rec)?)?;
        results.flush()?;
        let t = super::plan::tool(&spec.tool);
        let tool = t.map_or(spec.tool.as_str(), |t| t.label);
        let side = match (t.map(|t| t.side_names()), spec.imp) {
            (Some((c, _)), super::plan::Impl::C) => c,
            (Some((_, r)), super::plan::Impl::Rust) => r,
            (None, imp) => imp.name(),
        };
        let what = format!(
            "[{}/{total}] {}{tool} {} B {side:<4}",
            spec.seq + 1,
            if spec.warmup { "warm-up " } else { "" },
            spec.size,
        );
        match analysis::judge(spec, Some(&rec)) {
            Ok(v) => step!("{what} {v:>10.2}  ({:.1} s)", rec.client_secs),
            Err(e) => {
                failed += 1;
                // say it once, not for every run left
                if !out_of_time || !said_out_of_time {
                    step!("{what} FAILED: {e}");
                }
                said_out_of_time |= out_of_time;
            }
        }
    }
    step!("bench: {} of {total} runs succeeded", total - failed);
    Ok(failed == 0)
}

fn write_vm_env(path: &Path) {
    let read = |p: &str| fs::read_to_string(p).unwrap_or_default().trim().to_string();
    let mem = read("/proc/meminfo")
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .map(|l| l.trim_start_matches("MemTotal:").trim().to_string())
        .unwrap_or_default();
    let v = json!({
        "kernel": read("/proc/sys/kernel/osrelease"),
        "cpus": thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "mem": mem,
        "gid1": read("/sys/class/infiniband/rxe0/ports/1/gids/1"),
    });
    if let Err(e) = fs::write(path, serde_json::to_string_pretty(&v).unwrap_or_default()) {
        eprintln!("cannot write {}: {e}", path.display());
    }
}

fn spawn(argv: &[String], out: &Path) -> Result<Child> {
    let f = File::create(out).with_context(|| format!("cannot create {}", out.display()))?;
    let e = f.try_clone()?;
    let (prog, args) = argv.split_first().context("empty command")?;
    Command::new(prog)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::from(f))
        .stderr(Stdio::from(e))
        .spawn()
        .with_context(|| format!("cannot start {prog}"))
}

/// Waits for `child` at most `limit`; None when it is still running.
fn wait_at_most(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let until = Instant::now() + limit;
    loop {
        match child.try_wait() {
            Ok(Some(st)) => return Some(st),
            Ok(None) if Instant::now() < until => thread::sleep(POLL),
            _ => return None,
        }
    }
}

fn kill(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

enum Listen {
    Yes,
    Exited(ExitStatus),
    Timeout,
}

/// Polls /proc/net/tcp{,6} until something listens on `port` (probing with a connection would
/// use up the server's one accept), or the server exits, or the time is up.
fn wait_listening(port: u16, server: &mut Child, limit: Duration) -> Listen {
    let until = Instant::now() + limit;
    loop {
        let tables =
            ["/proc/net/tcp", "/proc/net/tcp6"].map(|p| fs::read_to_string(p).unwrap_or_default());
        if tables.iter().any(|t| listening(t, port)) {
            return Listen::Yes;
        }
        if let Ok(Some(st)) = server.try_wait() {
            return Listen::Exited(st);
        }
        if Instant::now() >= until {
            return Listen::Timeout;
        }
        thread::sleep(POLL);
    }
}

/// Whether a /proc/net/tcp or tcp6 table has a socket in LISTEN state (0A) on `port`.
pub fn listening(table: &str, port: u16) -> bool {
    let want = format!(":{port:04X}");
    table.lines().skip(1).any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.len() > 3 && f[1].ends_with(&want) && f[3] == "0A"
    })
}

/// The record of a run that is not started, with the reason.
fn not_run(spec: &RunSpec, plan: &Plan, why: &str) -> RunRecord {
    let (server_out, client_out) = raw_paths(&plan.raw_dir, spec);
    RunRecord {
        seq: spec.seq,
        id: spec.id.clone(),
        server_exit: Exit::NotStarted,
        client_exit: Exit::NotStarted,
        problem: Some(why.to_string()),
        listen_secs: 0.0,
        client_secs: 0.0,
        server_out,
        client_out,
        extra_exits: vec![Exit::NotStarted; spec.extra.len()],
        extra_outs: (0..spec.extra.len())
            .map(|k| extra_path(&plan.raw_dir, spec, k))
            .collect(),
    }
}

fn run_one(spec: &RunSpec, plan: &Plan) -> RunRecord {
    let (server_out, client_out) = raw_paths(&plan.raw_dir, spec);
    let mut rec = RunRecord {
        seq: spec.seq,
        id: spec.id.clone(),
        server_exit: Exit::NotStarted,
        client_exit: Exit::NotStarted,
        problem: None,
        listen_secs: 0.0,
        client_secs: 0.0,
        server_out: server_out.clone(),
        client_out: client_out.clone(),
        extra_exits: vec![Exit::NotStarted; spec.extra.len()],
        extra_outs: (0..spec.extra.len())
            .map(|k| extra_path(&plan.raw_dir, spec, k))
            .collect(),
    };
    if let Some(m) = &spec.missing {
        rec.problem = Some(m.clone());
        return rec;
    }
    let t0 = Instant::now();
    let mut server = match spawn(&spec.server, &server_out) {
        Ok(c) => c,
        Err(e) => {
            rec.problem = Some(format!("server: {e:#}"));
            return rec;
        }
    };
    match wait_listening(spec.port, &mut server, LISTEN_TIMEOUT) {
        Listen::Yes => {}
        Listen::Exited(st) => {
            rec.server_exit = Exit::from_status(st);
            rec.problem = Some(format!(
                "the server {} before listening on TCP port {}",
                rec.server_exit.describe(),
                spec.port
            ));
            return rec;
        }
        Listen::Timeout => {
            kill(&mut server);
            rec.server_exit = Exit::Killed;
            rec.problem = Some(format!(
                "the server did not listen on TCP port {} within {} s",
                spec.port,
                LISTEN_TIMEOUT.as_secs()
            ));
            return rec;
        }
    }
    rec.listen_secs = t0.elapsed().as_secs_f64();
    // the background processes (they connect on their own, in any order)
    let mut extras: Vec<Child> = Vec::new();
    for (k, argv) in spec.extra.iter().enumerate() {
        match spawn(argv, &rec.extra_outs[k]) {
            Ok(c) => extras.push(c),
            Err(e) => {
                for (j, c) in extras.iter_mut().enumerate() {
                    kill(c);
                    rec.extra_exits[j] = Exit::Killed;
                }
                kill(&mut server);
                rec.server_exit = Exit::Killed;
                rec.problem = Some(format!("background process {k}: {e:#}"));
                return rec;
            }
        }
    }
    let t1 = Instant::now();
    let mut client = match spawn(&spec.client, &client_out) {
        Ok(c) => c,
        Err(e) => {
            for (j, c) in extras.iter_mut().enumerate() {
                kill(c);
                rec.extra_exits[j] = Exit::Killed;
            }
            kill(&mut server);
            rec.server_exit = Exit::Killed;
            rec.problem = Some(format!("client: {e:#}"));
            return rec;
        }
    };
    let mut problems = Vec::new();
    rec.client_exit = match wait_at_most(&mut client, Duration::from_secs(plan.run_timeout_secs)) {
        Some(st) => Exit::from_status(st),
        None => {
            kill(&mut client);
            problems.push(format!(
                "the client did not finish within {} s (--run-timeout)",
                plan.run_timeout_secs
            ));
            Exit::Killed
        }
    };
    rec.client_secs = t1.elapsed().as_secs_f64();
    let grace = if rec.client_exit == Exit::Code(0) {
        SERVER_GRACE
    } else {
        Duration::from_secs(3)
    };
    rec.server_exit = match wait_at_most(&mut server, grace) {
        Some(st) => Exit::from_status(st),
        None => {
            kill(&mut server);
            problems.push(format!(
                "the server did not exit within {} s after the client",
                grace.as_secs()
            ));
            Exit::Killed
        }
    };
    for (k, c) in extras.iter_mut().enumerate() {
        rec.extra_exits[k] = match wait_at_most(c, grace) {
            Some(st) => Exit::from_status(st),
            None => {
                kill(c);
                problems.push(format!(
                    "background process {k} did not exit within {} s after the client",
                    grace.as_secs()
                ));
                Exit::Killed
            }
        };
    }
    if !problems.is_empty() {
        rec.problem = Some(problems.join("; "));
    }
    rec
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_detection() {
        let tcp = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n   0: 00000000:4E20 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1234 1 0000000000000000 100 0 0 10 0\n   1: 0100007F:4E21 0100007F:9C40 01 00000000:00000000 00:00000000 00000000     0        0 1235 1 0000000000000000 20 4 30 10 -1\n";
        assert!(listening(tcp, 20000));
        assert!(
            !listening(tcp, 20001),
            "an established socket is not a listener"
        );
        assert!(!listening(tcp, 2));
        let tcp6 = "  sl  local_address                         remote_address                        st\n   0: 00000000000000000000000000000000:4E22 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 99 1\n";
        assert!(listening(tcp6, 20002));
    }

    fn plan_in(dir: &Path, run_timeout_secs: u64) -> Plan {
        Plan {
            rounds: 1,
            sizes: vec![2],
            quick: true,
            iters_override: None,
            run_timeout_secs,
            deadline_secs: None,
            raw_dir: dir.to_path_buf(),
            results: dir.join("results.jsonl"),
            vm_env: dir.join("vm-env.json"),
            runs: Vec::new(),
            vm_cpus: 2,
        }
    }

    fn spec(seq: usize, port: u16, server: &str, client: &str) -> RunSpec {
        let sh = |c: &str| vec!["/bin/sh".to_string(), "-c".to_string(), c.to_string()];
        RunSpec {
            seq,
            id: format!("t{seq}"),
            tool: "rc_pingpong".into(),
            imp: super::super::plan::Impl::C,
            size: 2,
            iters: 200,
            round: 1,
            warmup: false,
            port,
            server: sh(server),
            extra: Vec::new(),
            client: sh(client),
            missing: None,
        }
    }

    /// The process handling with stand-ins: a listener held by the test plays the server's
    /// socket, shell commands play the programs.
    #[test]
    fn runs_record_what_happened() {
        let dir = std::env::temp_dir().join(format!("xtask-runner-test-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let plan = plan_in(&dir, 1);
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();

        // success: the server listens (the test's socket), the client prints, both exit 0
        let ok = run_one(
            &spec(
                0,
                port,
                "sleep 0.2",
                "echo '200 iters in 0.04 seconds = 1.50 usec/iter'",
            ),
            &plan,
        );
        assert_eq!(
            (ok.server_exit, ok.client_exit),
            (Exit::Code(0), Exit::Code(0))
        );
        assert_eq!(ok.problem, None);
        assert!(fs::read_to_string(&ok.client_out)
            .unwrap()
            .contains("1.50 usec/iter"));
        assert_eq!(analysis::judge(&spec(0, port, "", ""), Some(&ok)), Ok(1.5));

        // a server that dies before listening: no client is started
        drop(l);
        let early = run_one(
            &spec(1, port, "echo 'no device' >&2; exit 3", "true"),
            &plan,
        );
        assert_eq!(early.server_exit, Exit::Code(3));
        assert_eq!(early.client_exit, Exit::NotStarted);
        assert!(early.problem.unwrap().contains("before listening"));
        assert!(fs::read_to_string(&early.server_out)
            .unwrap()
            .contains("no device"));

        // a client that hangs is killed at --run-timeout, its server after it
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let t = Instant::now();
        let hung = run_one(&spec(2, port, "sleep 30", "sleep 30"), &plan);
        assert_eq!(
            (hung.client_exit, hung.server_exit),
            (Exit::Killed, Exit::Killed)
        );
        let p = hung.problem.unwrap();
        assert!(p.contains("did not finish within 1 s"), "{p}");
        assert!(p.contains("server did not exit"), "{p}");
        assert!(t.elapsed() < Duration::from_secs(10));
        fs::remove_dir_all(&dir).unwrap();
    }

    /// Past the deadline nothing starts; every run left is recorded as not run.
    #[test]
    fn deadline_records_the_rest_as_not_run() {
        let dir = std::env::temp_dir().join(format!("xtask-deadline-test-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let mut plan = plan_in(&dir, 1);
        plan.deadline_secs = Some(0);
        plan.runs = vec![
            spec(0, 1, "exit 9", "exit 9"),
            spec(1, 2, "exit 9", "exit 9"),
        ];
        let path = dir.join("plan.json");
        fs::write(&path, serde_json::to_string(&plan).unwrap()).unwrap();
        assert!(!run_plan(&path).unwrap());
        let recs: Vec<RunRecord> = fs::read_to_string(&plan.results)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(recs.len(), 2);
        for r in &recs {
            assert_eq!(r.problem.as_deref(), Some(NOT_RUN_TIME));
            assert_eq!(r.server_exit, Exit::NotStarted);
        }
        assert!(!recs[0].server_out.exists(), "nothing was started");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn exits() {
        assert_eq!(Exit::from_status(ExitStatus::from_raw(0)), Exit::Code(0));
        assert_eq!(
            Exit::from_status(ExitStatus::from_raw(1 << 8)),
            Exit::Code(1)
        );
        assert_eq!(Exit::from_status(ExitStatus::from_raw(9)), Exit::Signal(9));
    }
}
