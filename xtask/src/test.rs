//! `cargo xtask test`: host tests, then the device tests (`#[ignore]`d on the host) in a VM.
//!
//! The device part builds the device tests' executables on the host, then runs
//! `xtask device-run --plan <file>` (a copy of this binary) inside the VM, which runs each
//! executable with `--ignored --test-threads=1`, checks the device first and the kernel's
//! resource counts (`rdma resource show`) before and after, and writes a JSON result file
//! into the shared run directory.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use crate::util::{self, quote};
use crate::vm::{self, VmConfig};
use crate::{step, VmOpts};

/// The package of the device tests (every test `#[ignore]`d on the host).
const DEVICE_TESTS_PACKAGE: &str = "rdma-verbs-device-tests";
/// Its directory in the repository (the tests are in its `tests/`).
const DEVICE_TESTS_DIR: &str = "device-tests";
/// The bindings' package, tested with feature `bindgen` against the headers.
const SYS_PACKAGE: &str = "rdma-verbs-sys";
/// Its directory.
#[cfg(test)]
const SYS_DIR: &str = "ibverbs-sys";
/// The packages whose examples the device tests run as child processes
/// (from `target/<profile>/examples/`, one folder for all), each with its
/// directory: the tools (ping-pongs, perftest-style tools, …) and the
/// teaching examples of the published crates (`device-tests/tests/examples.rs`).
const EXAMPLE_PACKAGES: [(&str, &str); 3] = [
    (util::TOOLS_DIR, util::TOOLS_PACKAGE),
    ("ibverbs", "rdma-verbs"),
    ("ibverbs-tokio", "rdma-verbs-tokio"),
];
/// The device the VM provides.
const VM_DEVICE: &str = "rxe0";
/// GID index 1 of rxe0 in the VM: eth0 is 10.0.2.15 (QEMU user networking).
const VM_GID1: &str = "::ffff:10.0.2.15";

pub struct TestOptions {
    pub no_vm: bool,
    pub device_only: bool,
    pub no_fuzz: bool,
    pub exe_timeout: Duration,
    /// `--features` for every cargo build of the tests and examples.
    pub features: Option<String>,
    pub vm: VmOpts,
    pub extra: Vec<String>,
}

impl TestOptions {
    /// The `--features` arguments for cargo (none without `--features`).
    fn feature_args(&self) -> Vec<String> {
        match &self.features {
            Some(f) => vec!["--features".into(), f.clone()],
            None => Vec::new(),
        }
    }

    /// Whether the suite is built with rdma-verbs' `dlopen` feature.
    fn dlopen(&self) -> bool {
        self.features.as_deref().is_some_and(|f| {
            f.split([',', ' '])
                .any(|x| x == "dlopen" || x.ends_with("/dlopen"))
        })
    }
}

/// Test counts from libtest's `test result:` lines.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    pub passed: u64,
    pub failed: u64,
    pub ignored: u64,
    /// How many `test result:` lines were seen.
    pub results: u64,
}

impl Counts {
    /// Adds the counts of `line` if it is a libtest summary line.
    pub fn add_line(&mut self, line: &str) -> bool {
        match parse_result_line(line) {
            Some(c) => {
                self.add(c);
                true
            }
            None => false,
        }
    }

    pub fn add(&mut self, c: Counts) {
        self.passed += c.passed;
        self.failed += c.failed;
        self.ignored += c.ignored;
        self.results += c.results;
    }
}

/// Parses `test result: ok. 3 passed; 1 failed; 2 ignored; 0 measured; 0 filtered out; …`.
pub fn parse_result_line(line: &str) -> Option<Counts> {
    let line = util::strip_ansi(line);
    let rest = line.trim().strip_prefix("test result: ")?;
    let (_, rest) = rest.split_once(". ")?;
    let mut c = Counts {
        results: 1,
        ..Counts::default()
    };
    for part in rest.split(';') {
        let mut words = part.split_whitespace();
        let (Some(n), Some(what)) = (words.next(), words.next()) else {
            continue;
        };
        let Ok(n) = n.parse::<u64>() else { continue };
        match what {
            "passed" => c.passed = n,
            "failed" => c.failed = n,
            "ignored" => c.ignored = n,
            _ => {}
        }
    }
    Some(c)
}

pub fn cmd_test(o: &TestOptions) -> Result<bool> {
    let mut problems: Vec<String> = Vec::new();
    let mut host = Counts::default();
    if !o.device_only {
        let workspace: Vec<String> = ["--workspace".to_string()]
            .into_iter()
            .chain(o.feature_args())
            .collect();
        let sys = |features: &str| -> Vec<String> {
            ["-p", SYS_PACKAGE, "--features", features, "--all-targets"]
                .map(String::from)
                .to_vec()
        };
        const NEWER: &str = "bindings against rdma-core 56's headers";
        let sys_newer = |features: &str| -> Vec<String> {
            [
                "-p",
                SYS_PACKAGE,
                "--features",
                features,
                "--test",
                "bindings",
            ]
            .map(String::from)
            .to_vec()
        };
        for (what, args) in [
            (
                "unit, integration and example tests",
                [&workspace[..], &["--all-targets".to_string()]].concat(),
            ),
            (
                "doc tests",
                [&workspace[..], &["--doc".to_string()]].concat(),
            ),
            // The committed bindings and the Rust inline verbs against the
            // installed headers (rdma-core 44 on CI: the bindings' own).
            ("bindings against the headers", sys("bindgen")),
            (
                "bindings against the headers (rdmacm)",
                sys("bindgen,rdmacm"),
            ),
            // ... and against a newer release's (a compatible subset; the
            // items of src/newer.rs as that release defines them).
            (NEWER, sys_newer("bindgen")),
            (NEWER, sys_newer("bindgen,rdmacm")),
        ] {
            step!("host: {what}");
            let mut cmd = util::cargo();
            if what == NEWER {
                match crate::headers::newer_include_dir() {
                    Ok(dir) => {
                        cmd.env("IBVERBS_INCLUDE_DIR", dir)
                            .env("IBVERBS_RELEASE", crate::headers::NEWER_RELEASE);
                    }
                    Err(e) => {
                        problems.push(format!("host: {what}: {e:#}"));
                        host.failed += 1;
                        continue;
                    }
                }
            }
            cmd.args(["test", "--no-fail-fast"]).args(&args);
            if !o.extra.is_empty() {
                cmd.arg("--").args(&o.extra);
            }
            let failed_before = host.failed;
            let status = util::run_streaming(&mut cmd, |l| {
                println!("{l}");
                host.add_line(l);
            })?;
            if !status.success() {
                problems.push(format!("host: `{}` failed ({status})", util::show(&cmd)));
                if host.failed == failed_before {
                    // a build failure or crash: no test counted it
                    host.failed += 1;
                }
            }
        }
        if !o.no_fuzz {
            host.failed += crate::fuzz::after_host_tests(&mut problems);
        }
    }

    let device_label = if o.no_vm {
        format!(
            "device on this host ({})",
            std::env::var("IBVERBS_TEST_DEVICE").unwrap_or_else(|_| "first active port".into())
        )
    } else {
        format!("vm ({VM_DEVICE})")
    };
    // Every problem counts as a failure, so the closing line agrees with the exit status.
    let device = match device_part(o) {
        Ok(r) => {
            problems.extend(r.problems.iter().map(|p| format!("{device_label}: {p}")));
            let mut counts = r.counts;
            if !r.active.is_empty() && counts.passed + counts.failed == 0 {
                problems.push(format!("{device_label}: ran zero tests"));
                counts.failed += 1;
            }
            counts
        }
        Err(e) => {
            problems.push(format!("{device_label}: {e:#}"));
            Counts {
                failed: 1,
                ..Counts::default()
            }
        }
    };

    println!();
    for p in &problems {
        println!("problem: {p}");
    }
    if !o.device_only {
        println!(
            "host: {} passed, {} failed, {} ignored",
            host.passed, host.failed, host.ignored
        );
    }
    println!(
        "{device_label}: {} passed, {} failed",
        device.passed, device.failed
    );
    let passed = host.passed + device.passed;
    let failed = host.failed + device.failed;
    println!("summary: {passed} passed, {failed} failed");
    Ok(problems.is_empty() && failed == 0)
}

/// Builds the suite's test executables and runs them (in a VM unless `--no-vm`).
fn device_part(o: &TestOptions) -> Result<DeviceResults> {
    let exes = build_device_tests(o.device_only, &o.feature_args())?;
    let env = build_dlopen_contrast(o)?;
    if o.no_vm {
        let plan = Plan {
            exes,
            env,
            device: std::env::var("IBVERBS_TEST_DEVICE")
                .ok()
                .filter(|d| !d.is_empty()),
            extra: o.extra.clone(),
            exe_timeout: o.exe_timeout,
            results: None,
            expect_gid1: std::env::var("IBVERBS_TEST_EXPECT_GID1").ok(),
        };
        return Ok(device_run(&plan));
    }
    let session = vm::Session::new()?;
    let run = session.run_dir().to_path_buf();
    let me = std::env::current_exe().context("cannot locate the xtask executable")?;
    let inner = run.join("xtask-device-run");
    fs::copy(&me, &inner)
        .with_context(|| format!("cannot copy {} to {}", me.display(), inner.display()))?;
    let plan = Plan {
        exes,
        env,
        device: Some(VM_DEVICE.to_string()),
        extra: o.extra.clone(),
        exe_timeout: o.exe_timeout,
        results: Some(run.join("device-results.json")),
        expect_gid1: Some(VM_GID1.to_string()),
    };
    let plan_path = run.join("device-plan.json");
    fs::write(&plan_path, serde_json::to_string_pretty(&plan.to_json())?)?;
    let command = format!(
        "{} device-run --plan {}",
        quote(&inner.to_string_lossy()),
        quote(&plan_path.to_string_lossy())
    );
    let vm = VmConfig::new(0, &command, &o.vm);
    let outcome = session
        .run(&[vm], o.vm.timeout())?
        .pop()
        .context("no VM outcome")?;
    step!("{}", outcome.describe());
    let results_path = run.join("device-results.json");
    let text = fs::read_to_string(&results_path).with_context(|| {
        format!(
            "the device run wrote no results ({}); run directory kept: {}",
            outcome.describe(),
            run.display()
        )
    })?;
    let results = DeviceResults::from_json(&serde_json::from_str(&text)?);
    if results.ok() && outcome.success() {
        session.cleanup();
    } else {
        step!("run directory kept: {}", run.display());
    }
    Ok(results)
}

/// The examples `device-tests/tests/dlopen.rs` runs in both builds.
const DLOPEN_CONTRAST: [&str; 2] = ["devinfo", "rping"];

/// `device-tests/tests/dlopen.rs` runs [`DLOPEN_CONTRAST`] built both with rdma-verbs'
/// `dlopen` feature and without: the suite's own copies are one of them,
/// this builds the other into a target directory of its own (features
/// differ, so the suite's copies would otherwise be rebuilt over). Returns
/// the environment that names both (`IBVERBS_TEST_DEVINFO_DLOPEN`,
/// `IBVERBS_TEST_DEVINFO_LINKED`, same for `RPING`).
fn build_dlopen_contrast(o: &TestOptions) -> Result<Vec<(String, String)>> {
    let target = util::target_dir()?;
    let contrast_dir = target.join("dlopen-contrast");
    step!(
        "device: building {} {} rdma-verbs' dlopen feature into {}",
        DLOPEN_CONTRAST.join(", "),
        if o.dlopen() { "without" } else { "with" },
        contrast_dir.display()
    );
    let mut cmd = util::cargo();
    cmd.args(["build", "-p", util::TOOLS_PACKAGE]);
    for ex in DLOPEN_CONTRAST {
        cmd.args(["--example", ex]);
    }
    cmd.arg("--target-dir").arg(&contrast_dir);
    if !o.dlopen() {
        cmd.args(["--features", "dlopen"]);
    }
    let st = cmd
        .status()
        .with_context(|| "cannot run cargo build --example".to_string())?;
    util::check_status(&cmd, st)?;
    let mut env = Vec::new();
    for ex in DLOPEN_CONTRAST {
        let suite = target.join("debug/examples").join(ex);
        let contrast = contrast_dir.join("debug/examples").join(ex);
        let (dlopen, linked) = if o.dlopen() {
            (suite, contrast)
        } else {
            (contrast, suite)
        };
        let up = ex.to_uppercase();
        env.push((
            format!("IBVERBS_TEST_{up}_DLOPEN"),
            dlopen.to_string_lossy().into_owned(),
        ));
        env.push((
            format!("IBVERBS_TEST_{up}_LINKED"),
            linked.to_string_lossy().into_owned(),
        ));
    }
    Ok(env)
}

/// `cargo test --tests --no-run` for the device tests' package; returns its test executables.
fn build_device_tests(only_suite: bool, features: &[String]) -> Result<Vec<PathBuf>> {
    let repo = crate::repo_root()?;
    let manifest = repo.join(DEVICE_TESTS_DIR).join("Cargo.toml");
    step!("device: building the test executables of {DEVICE_TESTS_PACKAGE}");
    let mut cmd = util::cargo();
    cmd.arg("test");
    if only_suite {
        cmd.args(["-p", DEVICE_TESTS_PACKAGE]);
    } else {
        // same feature resolution as the host run: nothing is rebuilt
        cmd.arg("--workspace");
    }
    cmd.args([
        "--tests",
        "--no-run",
        "--message-format=json-render-diagnostics",
    ])
    .args(features);
    // The device tests run the example programs (ping-pongs, perftest-style
    // tools, the teaching examples) as child processes: build them first,
    // same profile. A feature (`dlopen`) goes to the packages that have it.
    let packages: Vec<&str> = EXAMPLE_PACKAGES.iter().map(|(_, p)| *p).collect();
    step!("device: building the examples of {}", packages.join(", "));
    let mut ex = util::cargo();
    ex.arg("build");
    for p in &packages {
        ex.args(["-p", p]);
    }
    ex.arg("--examples").args(features);
    let st = ex
        .status()
        .with_context(|| "cannot run cargo build --examples".to_string())?;
    util::check_status(&ex, st)?;
    let mut exes = Vec::new();
    let status = util::run_streaming(&mut cmd, |l| {
        let Ok(v) = serde_json::from_str::<Value>(l) else {
            println!("{l}");
            return;
        };
        if v["reason"] != "compiler-artifact" || v["profile"]["test"] != true {
            return;
        }
        let ours = v["manifest_path"]
            .as_str()
            .is_some_and(|m| Path::new(m) == manifest);
        if let (true, Some(exe)) = (ours, v["executable"].as_str()) {
            exes.push(PathBuf::from(exe));
        }
    })?;
    util::check_status(&cmd, status)?;
    exes.sort();
    exes.dedup();
    if exes.is_empty() {
        bail!("{DEVICE_TESTS_PACKAGE} has no test executables ({DEVICE_TESTS_DIR}/tests/*.rs)");
    }
    for e in &exes {
        step!("device: test executable {}", e.display());
    }
    Ok(exes)
}

/// What `device-run` does: which executables, which device, where the results go.
struct Plan {
    exes: Vec<PathBuf>,
    /// Extra environment for every test executable.
    env: Vec<(String, String)>,
    device: Option<String>,
    extra: Vec<String>,
    exe_timeout: Duration,
    results: Option<PathBuf>,
    /// What GID index 1 of the device must be (the VM promises rxe0 on
    /// eth0 = 10.0.2.15); passed to the tests as `IBVERBS_TEST_EXPECT_GID1`.
    expect_gid1: Option<String>,
}

impl Plan {
    fn to_json(&self) -> Value {
        json!({
            "exes": self.exes,
            "env": self.env.iter().cloned().collect::<BTreeMap<_, _>>(),
            "device": self.device,
            "extra": self.extra,
            "exe_timeout_secs": self.exe_timeout.as_secs(),
            "results": self.results,
            "expect_gid1": self.expect_gid1,
        })
    }

    fn from_json(v: &Value) -> Result<Plan> {
        let strings = |key: &str| -> Vec<String> {
            v[key]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|s| s.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default()
        };
        let exes: Vec<PathBuf> = strings("exes").into_iter().map(PathBuf::from).collect();
        if exes.is_empty() {
            bail!("the plan lists no executables");
        }
        let env = v["env"]
            .as_object()
            .map(|m| {
                m.iter()
                    .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                    .collect()
            })
            .unwrap_or_default();
        Ok(Plan {
            exes,
            env,
            device: v["device"].as_str().map(str::to_string),
            extra: strings("extra"),
            exe_timeout: Duration::from_secs(v["exe_timeout_secs"].as_u64().unwrap_or(900)),
            results: v["results"].as_str().map(PathBuf::from),
            expect_gid1: v["expect_gid1"].as_str().map(str::to_string),
        })
    }
}

/// Outcome of the device tests.
#[derive(Debug, Default)]
struct DeviceResults {
    counts: Counts,
    /// Active ports seen before the tests, as `device/port`.
    active: Vec<String>,
    problems: Vec<String>,
}

impl DeviceResults {
    fn ok(&self) -> bool {
        self.problems.is_empty()
            && !self.active.is_empty()
            && self.counts.failed == 0
            && self.counts.passed > 0
    }

    fn to_json(&self) -> Value {
        json!({
            "passed": self.counts.passed,
            "failed": self.counts.failed,
            "ignored": self.counts.ignored,
            "results": self.counts.results,
            "active": self.active,
            "problems": self.problems,
        })
    }

    fn from_json(v: &Value) -> DeviceResults {
        let strings = |key: &str| -> Vec<String> {
            v[key]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|s| s.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default()
        };
        let n = |key: &str| v[key].as_u64().unwrap_or(0);
        DeviceResults {
            counts: Counts {
                passed: n("passed"),
                failed: n("failed"),
                ignored: n("ignored"),
                results: n("results"),
            },
            active: strings("active"),
            problems: strings("problems"),
        }
    }
}

/// `xtask device-run --plan FILE` (inside the VM).
pub fn device_run_from_plan(path: &Path) -> Result<bool> {
    let text =
        fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let plan = Plan::from_json(&serde_json::from_str(&text)?)?;
    let results = device_run(&plan);
    Ok(results.ok())
}

fn device_run(plan: &Plan) -> DeviceResults {
    let mut r = DeviceResults {
        active: active_ports(plan.device.as_deref()),
        ..DeviceResults::default()
    };
    let want = plan.device.as_deref().unwrap_or("any device");
    if r.active.is_empty() {
        r.counts.failed += 1;
        r.problems.push(format!(
            "no ACTIVE port on {want} (/sys/class/infiniband: {})",
            list_devices()
        ));
    } else {
        step!("device: active ports: {}", r.active.join(", "));
        run_all(plan, &mut r);
    }
    step!(
        "device: {} passed, {} failed, {} ignored",
        r.counts.passed,
        r.counts.failed,
        r.counts.ignored
    );
    for p in &r.problems {
        step!("device: problem: {p}");
    }
    if let Some(out) = &plan.results {
        let text = serde_json::to_string_pretty(&r.to_json()).unwrap_or_default();
        if let Err(e) = fs::write(out, text) {
            eprintln!("cannot write {}: {e}", out.display());
        }
    }
    r
}

fn run_all(plan: &Plan, r: &mut DeviceResults) {
    let before = match resources() {
        Ok(b) => Some(b),
        Err(e) => {
            r.counts.failed += 1;
            r.problems.push(format!("{e:#}"));
            None
        }
    };
    for exe in &plan.exes {
        let name = exe.file_name().unwrap_or_default().to_string_lossy();
        let mut cmd = Command::new(exe);
        cmd.args(["--ignored", "--test-threads=1"])
            .args(&plan.extra)
            .env("IBVERBS_REQUIRE_DEVICE", "1")
            .envs(plan.env.iter().map(|(k, v)| (k, v)));
        if let Some(d) = &plan.device {
            cmd.env("IBVERBS_TEST_DEVICE", d);
        }
        if let Some(g) = &plan.expect_gid1 {
            cmd.env("IBVERBS_TEST_EXPECT_GID1", g);
        }
        if std::env::var_os("RUST_BACKTRACE").is_none() {
            cmd.env("RUST_BACKTRACE", "1");
        }
        match run_test_exe(&mut cmd, plan.exe_timeout) {
            Ok((counts, failed_tests, problem)) => {
                r.counts.add(counts);
                for t in failed_tests {
                    r.problems.push(format!("{name}: test `{t}` failed"));
                }
                if let Some(p) = problem {
                    r.counts.failed += 1;
                    r.problems.push(format!("{name}: {p}"));
                }
            }
            Err(e) => {
                r.counts.failed += 1;
                r.problems.push(format!("{name}: {e:#}"));
            }
        }
    }
    if let Some(before) = before {
        leak_check(&before, plan.device.as_deref(), r);
    }
}

/// Runs one libtest executable with a time limit; returns its counts and a problem, if any,
/// that its counts do not show (crash, timeout, no summary line).
/// Also returns the names of the failed tests.
fn run_test_exe(
    cmd: &mut Command,
    limit: Duration,
) -> Result<(Counts, Vec<String>, Option<String>)> {
    step!("device: $ {}", util::show(cmd));
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot start {}", util::show(cmd)))?;
    let stdout = child.stdout.take().context("no stdout")?;
    let last = Arc::new(Mutex::new(String::new()));
    let reader = {
        let last = Arc::clone(&last);
        thread::spawn(move || {
            let mut counts = Counts::default();
            let mut failed_tests = Vec::new();
            util::for_each_line(stdout, |l| {
                println!("{l}");
                counts.add_line(l);
                if let Some(name) = failed_test_name(l) {
                    failed_tests.push(name);
                }
                if let Ok(mut s) = last.lock() {
                    *s = l.to_string();
                }
            });
            (counts, failed_tests)
        })
    };
    let start = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait()? {
            break Some(st);
        }
        if start.elapsed() >= limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        thread::sleep(Duration::from_millis(100));
    };
    let (counts, failed_tests) = reader.join().unwrap_or_default();
    let problem = match status {
        None => Some(format!(
            "timed out after {} s and was killed; last output: `{}`",
            limit.as_secs(),
            last.lock().map(|s| s.clone()).unwrap_or_default()
        )),
        Some(st) if counts.results == 0 => Some(format!(
            "exited ({st}) without a `test result:` line (crashed?)"
        )),
        Some(st) if !st.success() && counts.failed == 0 => {
            Some(format!("exited ({st}) although no test failed"))
        }
        Some(_) => None,
    };
    Ok((counts, failed_tests, problem))
}

/// `test some::name ... FAILED` → `some::name`.
fn failed_test_name(line: &str) -> Option<String> {
    let line = util::strip_ansi(line);
    let name = line.strip_prefix("test ")?.strip_suffix(" ... FAILED")?;
    Some(name.to_string())
}

/// `device/port` for every ACTIVE port (of `device` only, if given).
fn active_ports(device: Option<&str>) -> Vec<String> {
    let mut out = Vec::new();
    let Ok(devs) = fs::read_dir("/sys/class/infiniband") else {
        return out;
    };
    let mut devs: Vec<String> = devs
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|d| device.is_none_or(|w| w == d))
        .collect();
    devs.sort();
    for d in devs {
        let ports = Path::new("/sys/class/infiniband").join(&d).join("ports");
        let Ok(ports) = fs::read_dir(&ports) else {
            continue;
        };
        for p in ports.flatten() {
            let state = fs::read_to_string(p.path().join("state")).unwrap_or_default();
            if state.contains("ACTIVE") {
                out.push(format!("{d}/{}", p.file_name().to_string_lossy()));
            }
        }
    }
    out
}

fn list_devices() -> String {
    match fs::read_dir("/sys/class/infiniband") {
        Ok(d) => {
            let mut v: Vec<String> = d
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect();
            v.sort();
            if v.is_empty() {
                "no devices".into()
            } else {
                v.join(", ")
            }
        }
        Err(_) => "missing: no kernel RDMA support".into(),
    }
}

pub(crate) type Resources = BTreeMap<String, BTreeMap<String, u64>>;

/// Per device resource counts from `rdma resource show`.
fn resources() -> Result<Resources> {
    let out = util::capture(
        Command::new("rdma")
            .args(["resource", "show"])
            .stderr(Stdio::piped()),
    )
    .context("`rdma resource show` failed (needed for the leak check)")?;
    Ok(parse_resources(&out))
}

/// Parses lines like `0: rxe0: pd 1 cq 2 qp 1 cm_id 0 mr 0 ctx 0 srq 0`.
pub(crate) fn parse_resources(text: &str) -> Resources {
    let mut out = Resources::new();
    for line in text.lines() {
        let t: Vec<&str> = line.split_whitespace().collect();
        if t.len() < 2 || !t[0].ends_with(':') || !t[1].ends_with(':') {
            continue;
        }
        let dev = t[1].trim_end_matches(':').to_string();
        let counts = out.entry(dev).or_default();
        for pair in t[2..].chunks(2) {
            if let [k, v] = pair {
                if let Ok(n) = v.parse() {
                    counts.insert((*k).to_string(), n);
                }
            }
        }
    }
    out
}

fn show_resources(r: &Resources) -> String {
    r.iter()
        .map(|(d, c)| {
            let kv: Vec<String> = c.iter().map(|(k, v)| format!("{k} {v}")).collect();
            format!("{d}: {}", kv.join(" "))
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Higher counts after than before, as `dev kind before -> after`.
pub(crate) fn leaks(before: &Resources, after: &Resources, device: Option<&str>) -> Vec<String> {
    let mut out = Vec::new();
    for (dev, counts) in after {
        if device.is_some_and(|d| d != dev) {
            continue;
        }
        for (kind, &n) in counts {
            let was = before
                .get(dev)
                .and_then(|c| c.get(kind))
                .copied()
                .unwrap_or(0);
            if n > was {
                out.push(format!("{dev} {kind} {was} -> {n}"));
            }
        }
    }
    out
}

fn leak_check(before: &Resources, device: Option<&str>, r: &mut DeviceResults) {
    // The kernel may release objects of a process that just exited a little later.
    let mut after = Resources::new();
    let mut found = Vec::new();
    for attempt in 0..10 {
        if attempt > 0 {
            thread::sleep(Duration::from_millis(500));
        }
        match resources() {
            Ok(a) => after = a,
            Err(e) => {
                r.counts.failed += 1;
                r.problems.push(format!("{e:#}"));
                return;
            }
        }
        found = leaks(before, &after, device);
        if found.is_empty() {
            break;
        }
    }
    step!("device: resources before: {}", show_resources(before));
    step!("device: resources after:  {}", show_resources(&after));
    if !found.is_empty() {
        r.counts.failed += 1;
        r.problems.push(format!(
            "kernel objects leaked (rdma resource show): {}",
            found.join(", ")
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn result_lines() {
        let c = parse_result_line(
            "test result: ok. 12 passed; 0 failed; 3 ignored; 0 measured; 0 filtered out; \
             finished in 0.01s",
        )
        .unwrap();
        assert_eq!((c.passed, c.failed, c.ignored, c.results), (12, 0, 3, 1));
        let c = parse_result_line(
            "\u{1b}[31mtest result: FAILED\u{1b}[0m. 1 passed; 2 failed; 0 ignored; 0 measured",
        );
        assert_eq!(c.map(|c| (c.passed, c.failed)), Some((1, 2)));
        assert!(parse_result_line("test foo ... ok").is_none());
        assert_eq!(
            failed_test_name("test a::b ... FAILED").as_deref(),
            Some("a::b")
        );
        assert_eq!(failed_test_name("test a::b ... ok"), None);
        let mut total = Counts::default();
        assert!(total.add_line("test result: ok. 1 passed; 0 failed; 0 ignored"));
        assert!(!total.add_line("running 1 test"));
        assert_eq!(total.passed, 1);
    }

    #[test]
    fn resources_and_leaks() {
        let before = parse_resources(
            "0: rxe0: pd 1 cq 0 qp 1 cm_id 0 mr 0 ctx 0 srq 0\n1: rxe1: pd 0 qp 1\n",
        );
        assert_eq!(before["rxe0"]["qp"], 1);
        let after = parse_resources("0: rxe0: pd 1 cq 0 qp 1 cm_id 0 mr 2 ctx 0 srq 0\n");
        assert_eq!(leaks(&before, &after, Some("rxe0")), ["rxe0 mr 0 -> 2"]);
        assert!(leaks(&before, &after, Some("rxe1")).is_empty());
        assert!(leaks(&after, &before, Some("rxe0")).is_empty());
    }

    #[test]
    fn plan_round_trip() {
        let p = Plan {
            exes: vec!["/r/target/debug/deps/a-1".into()],
            env: vec![("IBVERBS_TEST_DEVINFO_DLOPEN".into(), "/r/x/devinfo".into())],
            device: Some("rxe0".into()),
            extra: vec!["--exact".into()],
            exe_timeout: Duration::from_secs(5),
            results: Some("/r/out.json".into()),
            expect_gid1: Some("::ffff:10.0.2.15".into()),
        };
        let q = Plan::from_json(&p.to_json()).unwrap();
        assert_eq!(q.expect_gid1, p.expect_gid1);
        assert_eq!(q.exes, p.exes);
        assert_eq!(q.device, p.device);
        assert_eq!(q.extra, p.extra);
        assert_eq!(q.exe_timeout, p.exe_timeout);
        assert_eq!(q.results, p.results);
        assert_eq!(q.env, p.env);
    }

    #[test]
    fn dlopen_feature_is_recognised() {
        let o = |f: Option<&str>| TestOptions {
            no_vm: false,
            device_only: false,
            no_fuzz: false,
            exe_timeout: Duration::from_secs(1),
            features: f.map(str::to_string),
            vm: crate::VmOpts {
                mem: "2G".into(),
                smp: 2,
                timeout: None,
                env: Vec::new(),
                verbose: false,
                kernel_args: Vec::new(),
            },
            extra: Vec::new(),
        };
        assert!(!o(None).dlopen());
        assert!(o(Some("dlopen")).dlopen());
        assert!(o(Some("tokio,rdma-verbs/dlopen")).dlopen());
        assert!(!o(Some("dlopenx")).dlopen());
        assert_eq!(o(Some("dlopen")).feature_args(), ["--features", "dlopen"]);
        assert!(o(None).feature_args().is_empty());
    }

    /// The packages the harness builds by name are the ones in the directories it
    /// reads (device tests, examples): a rename on one side only fails here, not
    /// in the VM.
    #[test]
    fn the_packages_built_are_the_ones_in_their_directories() {
        let root = crate::repo_root().unwrap();
        let mut packages = EXAMPLE_PACKAGES.to_vec();
        packages.push((DEVICE_TESTS_DIR, DEVICE_TESTS_PACKAGE));
        packages.push((SYS_DIR, SYS_PACKAGE));
        for (dir, package) in packages {
            let manifest = fs::read_to_string(root.join(dir).join("Cargo.toml")).unwrap();
            let want = format!("name = \"{package}\"");
            assert!(
                manifest.lines().any(|l| l.trim() == want),
                "{dir}/Cargo.toml does not name the package {package}"
            );
        }
        let tests = root.join(DEVICE_TESTS_DIR).join("tests");
        assert!(tests.join("dlopen.rs").is_file());
        assert!(tests.join("pingpong_interop.rs").is_file());
        assert!(tests.join("examples.rs").is_file());
        // The examples of all these packages land in one folder: no two may
        // share a name (cargo would build one over the other).
        let mut seen = BTreeMap::new();
        for (dir, _) in EXAMPLE_PACKAGES {
            let examples = fs::read_dir(root.join(dir).join("examples"))
                .unwrap_or_else(|e| panic!("{dir}/examples: {e}"));
            for e in examples.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if let Some(name) = name.strip_suffix(".rs") {
                    if let Some(other) = seen.insert(name.to_string(), dir) {
                        panic!("example {name} is in {other}/examples and {dir}/examples");
                    }
                }
            }
        }
        for ex in DLOPEN_CONTRAST {
            let src = root.join(util::TOOLS_DIR).join("examples");
            assert!(src.join(format!("{ex}.rs")).is_file(), "no example {ex}");
        }
    }
}
