//! `cargo xtask bench`: our example tools against rdma-core's C tools, side by side in one
//! SoftRoCE VM.
//!
//! On the host: build the tools' examples (release), write a plan (every run's exact
//! server and client command lines, in ABBA order) to `target/bench/plan.json`, boot one VM
//! and run `xtask bench --run-plan` (a copy of this binary) in it. In the VM ([`runner`]): for
//! each run start the server, wait until its TCP port listens, run the client to `localhost`,
//! capture both outputs under `target/bench/raw/`, kill stragglers, append a record to
//! `target/bench/results.jsonl`. Back on the host: parse the outputs ([`parse`]), summarize
//! per (tool, size) and side ([`stats`], [`analysis`]), write `target/bench/report.md`
//! ([`report`]) and `target/bench/latency_bandwidth.png` ([`plot`]), print the table, and
//! generate `target/bench/benchmarks.md` (method, the instruction tables quoted from
//! `docs/results/instructions.md`, this run's tables; `--publish` copies it to
//! `docs/results/benchmarks.md`).
//!
//! Issue #21's workloads are cells of the same schedule (`--tools blockstore,allreduce`): the
//! block store against perftest's message rate, the all-reduce against `ib_write_bw`, and
//! `--wait` against busy polling; an all-reduce run's middle ranks are background processes of
//! the run ([`plan::RunSpec::extra`]).

mod analysis;
mod parse;
mod plan;
pub(crate) mod plot;
mod report;
mod runner;
mod stats;

use std::collections::BTreeMap;
use std::fs;
use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use serde_json::Value;

pub use plan::parse_size;
pub use runner::run_plan;

use crate::util::{self, quote};
use crate::vm::{self, VmConfig};
use crate::{step, VmOpts};

/// Default message sizes (atomics always use 8 B).
pub const DEFAULT_SIZES: &[u64] = &[2, 64, 1024, 4096, 65536];
/// `--quick` sizes.
const QUICK_SIZES: &[u64] = &[2, 65536];

pub struct BenchOptions {
    pub rounds: Option<u32>,
    pub sizes: Option<Vec<u64>>,
    pub iters: Option<u64>,
    pub quick: bool,
    pub tools: Option<Vec<String>>,
    pub run_timeout: u64,
    pub port_base: u16,
    pub reanalyze: bool,
    /// Copy the generated `benchmarks.md` to `docs/results/benchmarks.md`.
    pub publish: bool,
    pub vm: VmOpts,
}

/// Files of a bench under `<target>/bench/`.
struct Out {
    dir: PathBuf,
}

impl Out {
    fn raw(&self) -> PathBuf {
        self.dir.join("raw")
    }
    fn plan(&self) -> PathBuf {
        self.dir.join("plan.json")
    }
    fn results(&self) -> PathBuf {
        self.dir.join("results.jsonl")
    }
    fn env(&self) -> PathBuf {
        self.dir.join("env.json")
    }
    fn vm_env(&self) -> PathBuf {
        self.dir.join("vm-env.json")
    }
    fn report(&self) -> PathBuf {
        self.dir.join("report.md")
    }
    fn document(&self) -> PathBuf {
        self.dir.join("benchmarks.md")
    }
    fn png(&self) -> PathBuf {
        self.dir.join("latency_bandwidth.png")
    }
}

/// `cargo xtask bench`. True when every run succeeded (missed targets are results, not errors).
pub fn cmd_bench(o: &BenchOptions) -> Result<bool> {
    let out = Out {
        dir: util::target_dir()?.join("bench"),
    };
    if o.reanalyze {
        return finish(&out, o.publish);
    }
    let rounds = o.rounds.unwrap_or(if o.quick { 1 } else { 3 });
    if rounds == 0 {
        bail!("--rounds must be at least 1");
    }
    let mut sizes = o.sizes.clone().unwrap_or_else(|| {
        if o.quick {
            QUICK_SIZES.to_vec()
        } else {
            DEFAULT_SIZES.to_vec()
        }
    });
    sizes.sort_unstable();
    sizes.dedup();
    if sizes.is_empty() {
        bail!("--sizes is empty");
    }
    if o.iters.is_some_and(|n| n < 5) {
        bail!("--iters must be at least 5 (perftest's minimum)");
    }
    let tools = plan::select_tools(o.tools.as_deref())?;

    let programs = Programs::find(&tools)?;
    let runs = plan::schedule(
        &plan::Settings {
            tools: &tools,
            sizes: &sizes,
            rounds,
            iters: o.iters,
            quick: o.quick,
            port_base: o.port_base,
            vm_cpus: o.vm.smp,
        },
        &programs,
    );
    let ports: usize = runs
        .iter()
        .filter_map(|r| plan::tool(&r.tool))
        .map(|t| usize::from(plan::ports_of(t, o.vm.smp)))
        .sum();
    if usize::from(o.port_base) + ports > usize::from(u16::MAX) {
        bail!(
            "--port-base {} leaves too few ports for {} runs",
            o.port_base,
            runs.len()
        );
    }
    fs::create_dir_all(&out.dir).with_context(|| format!("cannot create {}", out.dir.display()))?;
    let _ = fs::remove_dir_all(out.raw());
    for f in [
        out.results(),
        out.env(),
        out.vm_env(),
        out.report(),
        out.document(),
        out.png(),
    ] {
        let _ = fs::remove_file(f);
    }
    fs::create_dir_all(out.raw())?;
    let the_plan = plan::Plan {
        rounds,
        sizes,
        quick: o.quick,
        iters_override: o.iters,
        run_timeout_secs: o.run_timeout,
        // boot (~20 s), the longest possible run (listen + client + server exit) and a margin
        deadline_secs: Some(
            o.vm.timeout()
                .as_secs()
                .saturating_sub(o.run_timeout + 30 + 20 + 60),
        ),
        raw_dir: out.raw(),
        results: out.results(),
        vm_env: out.vm_env(),
        runs,
        vm_cpus: o.vm.smp,
    };
    fs::write(out.plan(), serde_json::to_string_pretty(&the_plan)?)
        .with_context(|| format!("cannot write {}", out.plan().display()))?;
    let measured = the_plan.runs.iter().filter(|r| !r.warmup).count();
    step!(
        "bench: {} runs ({} warm-up, {measured} measured: {} tools, {} round(s), sizes {}) in one VM",
        the_plan.runs.len(),
        the_plan.runs.len() - measured,
        tools.len(),
        rounds,
        {
            // the sizes the runs use (workloads and atomics fix theirs)
            let mut used: Vec<u64> = the_plan.runs.iter().map(|r| r.size).collect();
            used.sort_unstable();
            used.dedup();
            used.iter()
                .map(|s| s.to_string())
                .collect::<Vec<_>>()
                .join(",")
        }
    );

    let mut env = host_env(o);
    fs::write(out.env(), serde_json::to_string_pretty(&env)?)?;
    let session = vm::Session::new()?;
    // /proc/self/exe is this very binary even when cargo has meanwhile rebuilt (replaced) the
    // file, which happens when others run `cargo xtask` in the same checkout
    let inner = session.run_dir().join("xtask-bench");
    fs::copy("/proc/self/exe", &inner)
        .or_else(|_| fs::copy(std::env::current_exe()?, &inner))
        .with_context(|| format!("cannot copy this xtask executable to {}", inner.display()))?;
    let command = format!(
        "{} bench --run-plan {}",
        quote(&inner.to_string_lossy()),
        quote(&out.plan().to_string_lossy())
    );
    let started = Instant::now();
    let outcome = session.run(&[VmConfig::new(0, &command, &o.vm)], o.vm.timeout());
    env.vm_secs = started.elapsed().as_secs_f64();
    env.load_after = load_avg();
    env.other_vms_after = other_qemus();
    fs::write(out.env(), serde_json::to_string_pretty(&env)?)?;
    let vm_ok = match &outcome {
        Ok(v) => v.iter().all(|o| {
            step!("{}", o.describe());
            matches!(o.result, vm::VmResult::Exited(_))
        }),
        Err(e) => {
            step!("bench: the VM run failed: {e:#}; reporting what was recorded");
            false
        }
    };
    let all_ok = finish(&out, o.publish)?;
    if vm_ok {
        session.cleanup();
    } else {
        step!("run directory kept: {}", session.run_dir().display());
    }
    Ok(vm_ok && all_ok)
}

/// Parses what the last bench recorded; writes the report and plot; prints the table.
fn finish(out: &Out, publish: bool) -> Result<bool> {
    let text = fs::read_to_string(out.plan()).with_context(|| {
        format!(
            "cannot read {} (run `cargo xtask bench` first)",
            out.plan().display()
        )
    })?;
    let the_plan: plan::Plan = serde_json::from_str(&text).context("cannot parse plan.json")?;
    let mut records = Vec::new();
    for (i, line) in fs::read_to_string(out.results())
        .unwrap_or_default()
        .lines()
        .enumerate()
    {
        match serde_json::from_str::<runner::RunRecord>(line) {
            Ok(r) => records.push(r),
            Err(e) => step!(
                "bench: results.jsonl line {}: unreadable ({e}), ignored",
                i + 1
            ),
        }
    }
    let mut env: report::Env = fs::read_to_string(out.env())
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_default();
    if let Some(v) = fs::read_to_string(out.vm_env())
        .ok()
        .and_then(|t| serde_json::from_str::<Value>(&t).ok())
    {
        let s = |k: &str| v[k].as_str().unwrap_or_default().to_string();
        env.vm_kernel = s("kernel");
        env.vm_gid1 = s("gid1");
        env.vm_cpus = v["cpus"].as_u64().unwrap_or(0) as usize;
    }
    let a = analysis::analyze(&the_plan, &records);
    let subtitle = format!(
        "One QEMU TCG VM, rxe0 loopback: absolute numbers mean little, compare ratios. {} round(s), \
         whiskers = min–max. {} · VM kernel {} · rdma-core {}",
        the_plan.rounds, env.date, env.vm_kernel, env.rdma_core
    );
    let png = match plot::draw(&a.tools_only(), &subtitle, &out.png()) {
        Ok(()) => Some(out.png()),
        Err(e) => {
            step!("bench: no plot: {e:#}");
            None
        }
    };
    let md = report::markdown(
        &the_plan,
        &a,
        &env,
        png.as_ref().map(|_| "latency_bandwidth.png"),
    );
    fs::write(out.report(), md)
        .with_context(|| format!("cannot write {}", out.report().display()))?;
    let docs = crate::results_dir()?;
    let instructions = fs::read_to_string(docs.join("instructions.md")).ok();
    if instructions
        .as_deref()
        .and_then(report::instruction_tables)
        .is_none()
    {
        step!(
            "bench: docs/results/instructions.md has no summary table (run `cargo xtask instr \
             --publish`); benchmarks.md says so"
        );
    }
    let doc = report::document(&the_plan, &a, &env, instructions.as_deref());
    fs::write(out.document(), &doc)
        .with_context(|| format!("cannot write {}", out.document().display()))?;
    if publish {
        let to = docs.join("benchmarks.md");
        fs::write(&to, &doc).with_context(|| format!("cannot write {}", to.display()))?;
        step!("bench: published to {}", to.display());
    }

    println!();
    print!("{}", report::terminal_table(&a));
    println!();
    for l in report::target_lines(&a) {
        println!("target {l}");
    }
    if let Some(l) = report::self_noise_line(&a) {
        println!("{l}");
    }
    for l in report::control_lines(&a) {
        println!("control {l}");
    }
    let failures = a.all_failures();
    for (first, last, n, reason) in analysis::grouped_failures(&a) {
        if n == 1 {
            println!(
                "failed run {} ({}): {reason}",
                first.spec.seq, first.spec.id
            );
        } else {
            println!(
                "failed runs {}–{} ({n} runs, {} … {}): {reason}",
                first.spec.seq, last.spec.seq, first.spec.id, last.spec.id
            );
        }
    }
    if a.runs_recorded < a.runs_planned {
        println!(
            "only {} of {} runs were recorded (the VM stopped early)",
            a.runs_recorded, a.runs_planned
        );
    }
    if let Some(w) = env.noise_warning() {
        println!("warning: {w}");
    }
    println!(
        "(medians of {} round(s); absolute numbers from an emulated VM mean little — compare \
         ratios; the same-binary check above says how far noise alone moves them)",
        the_plan.rounds
    );
    step!("bench: report {}", out.report().display());
    step!("bench: document {}", out.document().display());
    if let Some(p) = &png {
        step!("bench: plot {}", p.display());
    }
    step!("bench: raw outputs {}", the_plan.raw_dir.display());
    Ok(failures.is_empty() && a.runs_recorded == a.runs_planned)
}

use plan::Programs;

impl Programs {
    /// C programs from PATH; our examples built in release mode.
    fn find(tools: &[&'static plan::Tool]) -> Result<Programs> {
        let mut p = Programs::default();
        for t in tools.iter().filter(|t| !t.baseline_is_rust()) {
            if let Some(path) = which(t.c_program) {
                p.c.insert(t.c_program.to_string(), path);
            } else {
                step!(
                    "bench: `{}` is not installed (Debian package perftest or ibverbs-utils); \
                     its runs will be recorded as failed",
                    t.c_program
                );
            }
        }
        let wanted: Vec<&str> = tools.iter().map(|t| t.example).collect();
        let (built, problems) = build_examples(&wanted)?;
        for name in wanted {
            if let Some(exe) = built.get(name) {
                p.rust.insert(name.to_string(), exe.clone());
            } else if !p.rust_problems.contains_key(name) {
                let why = problems
                    .get(name)
                    .cloned()
                    .unwrap_or_else(|| format!("the example `{name}` does not exist"));
                step!("bench: {why}; its runs will be recorded as failed");
                p.rust_problems.insert(name.to_string(), why);
            }
        }
        Ok(p)
    }
}

fn which(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

/// `cargo build --release -p rdma-verbs-tools --examples`; if that fails (an example being written
/// does not compile yet), each wanted example on its own, so the others are still measured.
/// Returns name → executable, and name → why not.
fn build_examples(
    wanted: &[&str],
) -> Result<(BTreeMap<String, PathBuf>, BTreeMap<String, String>)> {
    step!(
        "bench: building the examples of {} (release)",
        util::TOOLS_PACKAGE
    );
    let mut problems = BTreeMap::new();
    match util::build_examples(true, &["--examples"]) {
        Ok(all) => return Ok((all, problems)),
        Err(e) => step!("bench: {e:#}; building the benchmarked examples one by one"),
    }
    let mut built = BTreeMap::new();
    let mut names: Vec<&str> = wanted.to_vec();
    names.sort_unstable();
    names.dedup();
    let examples = crate::repo_root()?.join(util::TOOLS_DIR).join("examples");
    for name in names {
        if !examples.join(format!("{name}.rs")).is_file()
            && !examples.join(name).join("main.rs").is_file()
        {
            continue;
        }
        match util::build_examples(true, &["--example", name]) {
            Ok(m) => built.extend(m),
            Err(_) => {
                problems.insert(
                    name.to_string(),
                    format!("the example `{name}` does not compile"),
                );
            }
        }
    }
    Ok((built, problems))
}

fn first_line(cmd: &mut Command) -> String {
    util::capture(cmd.stderr(std::process::Stdio::null()))
        .ok()
        .and_then(|s| s.lines().next().map(|l| l.trim().to_string()))
        .unwrap_or_default()
}

fn deb_version(package: &str) -> String {
    let v = first_line(Command::new("dpkg-query").args(["-W", "-f=${Version}", package]));
    if v.is_empty() {
        "unknown".into()
    } else {
        v
    }
}

fn load_avg() -> String {
    fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// QEMU processes now running on the host (ours is not running when this is called).
fn other_qemus() -> usize {
    let Ok(dir) = fs::read_dir("/proc") else {
        return 0;
    };
    dir.flatten()
        .filter(|e| {
            fs::read_to_string(e.path().join("comm"))
                .is_ok_and(|c| c.trim_end().starts_with("qemu-system"))
        })
        .count()
}

fn host_env(o: &BenchOptions) -> report::Env {
    let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let host_cpu = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
        .unwrap_or_default();
    let git = match crate::repo_root() {
        Ok(root) => {
            let head = first_line(Command::new("git").arg("-C").arg(&root).args([
                "rev-parse",
                "--short",
                "HEAD",
            ]));
            let dirty = util::capture(Command::new("git").arg("-C").arg(&root).args([
                "status",
                "--porcelain",
                "--untracked-files=no",
            ]))
            .map(|s| !s.trim().is_empty())
            .unwrap_or(false);
            format!(
                "{head}{}",
                if dirty { " + uncommitted changes" } else { "" }
            )
        }
        Err(_) => String::new(),
    };
    let qemu = first_line(Command::new("qemu-system-x86_64").arg("--version"));
    let qemu = qemu
        .split_whitespace()
        .skip_while(|w| *w != "version")
        .nth(1)
        .unwrap_or(&qemu)
        .to_string();
    let args: Vec<String> = std::env::args().skip(1).collect();
    report::Env {
        date: first_line(Command::new("date").args(["-u", "+%Y-%m-%d %H:%M UTC"])),
        git,
        host_kernel: fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
            .to_string(),
        host_cpu,
        host_cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
        rdma_core: deb_version("rdma-core"),
        perftest: deb_version("perftest"),
        qemu,
        vm_mem: o.vm.mem.clone(),
        vm_smp: o.vm.smp,
        vm_kernel_args: o.vm.kernel_args.clone(),
        load_before: load_avg(),
        other_vms_before: other_qemus(),
        command: format!("cargo xtask {}", args.join(" ")),
        ..report::Env::default()
    }
}
