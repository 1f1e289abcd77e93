//! `cargo xtask instr`: deterministic instruction counts per operation, ours against C, in one
//! SoftRoCE VM.
//!
//! Wall clock under TCG cannot decide a few-percent target (the C tools differ from themselves
//! by 11–17 % per cell); instructions executed in user space can. Every measurement is a pair
//! of callgrind runs of the same program that differ only in length, and the marginal count
//! (difference of the counts / difference of the operations) cancels start-up, set-up and
//! teardown:
//! - `opcost` (tools/examples/opcost.rs) and its C twin (xtask/c/opcost.c, built here with `cc`): N
//!   RC queue pairs connected to themselves on one CQ per thread, signaled 64-byte RDMA
//!   writes. Their never-inlined `instr_post` / `instr_poll` / `instr_empty` / `instr_wait`
//!   give the inclusive instructions of one post, one poll of up to 16 completions, one empty
//!   poll and one event wait; rxe's own `post_send` and `poll_cq` (the functions of librxe
//!   those call) give the provider's share. The program sleeps between posting and polling,
//!   so a poll finds all of a round's completions and the count does not depend on timing.
//!   Plain runs (no callgrind) of the same configurations record set-up and teardown time and
//!   RSS; `strace -c` runs count kernel calls.
//! - Ping-pongs in event mode (`-e`: neither side spins), client under callgrind, whole
//!   process: rdma-core's `ibv_rc_pingpong` against our `rc_pingpong`.
//!
//! Results: `target/instr/report.md`, `target/instr/scaling.png`, the raw outputs under
//! `target/instr/raw/`; `--reanalyze` rebuilds the report from them.

mod callgrind;
mod guarantees;
mod history;
mod lines;
mod report;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::util::{self, quote};
use crate::vm::{self, VmConfig};
use crate::{step, VmOpts};

pub use report::Row;

/// The GID index of rxe0's IPv4-mapped RoCE v2 GID in the VM (see ../shared/softroce.md).
const GID_INDEX: &str = "1";
const PORT: &str = "1";
/// Empty polls of the calibration, before the measured rounds.
const CALIBRATE: u64 = 64;

pub struct InstrOptions {
    pub quick: bool,
    /// Also write the report and plot to docs/results/instructions.md and instructions.png.
    pub publish: bool,
    pub only: Option<Vec<String>>,
    pub reanalyze: bool,
    pub vm: VmOpts,
}

/// An implementation measured by `opcost`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Imp {
    C,
    Request,
    Prepared,
    Raw,
    /// The prepared path's guarantees written by hand on the raw path (opcost's `floor`).
    FloorPrepared,
    /// The request path's, likewise.
    FloorRequest,
}

impl Imp {
    pub const ALL: [Imp; 6] = [
        Imp::C,
        Imp::Request,
        Imp::Prepared,
        Imp::Raw,
        Imp::FloorPrepared,
        Imp::FloorRequest,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Imp::C => "C",
            Imp::Request => "request",
            Imp::Prepared => "prepared",
            Imp::Raw => "raw",
            Imp::FloorPrepared => "floor-prepared",
            Imp::FloorRequest => "floor-request",
        }
    }

    /// The floor prototype of a safe path.
    pub fn floor(self) -> Option<Imp> {
        match self {
            Imp::Prepared => Some(Imp::FloorPrepared),
            Imp::Request => Some(Imp::FloorRequest),
            _ => None,
        }
    }
}

/// One `opcost` configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Config {
    pub imp: Imp,
    pub qps: u32,
    pub depth: u32,
    pub threads: u32,
    pub events: bool,
    /// Every thread's queue pairs on one CQ (opcost's `--shared-cq`).
    pub shared: bool,
}

impl Config {
    /// `request, 16 QPs, depth 1, 1 thread`.
    pub fn label(&self) -> String {
        format!(
            "{}, {} QPs, depth {}, {} thread{}{}",
            self.imp.name(),
            self.qps,
            self.depth,
            self.threads,
            if self.threads == 1 { "" } else { "s" },
            if self.events { ", events" } else { "" }
        ) + if self.shared { ", one CQ" } else { "" }
    }

    fn key(&self) -> String {
        format!(
            "op-{}-q{}-d{}-t{}{}{}",
            self.imp.name().to_lowercase(),
            self.qps,
            self.depth,
            self.threads,
            if self.events { "-ev" } else { "" },
            if self.shared { SHARED } else { "" }
        )
    }

    /// Rounds of the short run; the long run has three times as many. At least 64 operations
    /// and 2 rounds; in event mode 128 rounds, a multiple of the 64 events the library
    /// acknowledges at once, so the batched `ibv_ack_cq_events` is counted in proportion.
    fn rounds(&self) -> u64 {
        if self.events {
            return 128;
        }
        let per_round = u64::from(self.qps * self.depth);
        64u64.div_ceil(per_round).max(2)
    }

    fn args(&self, rounds: u64, calibrate: u64) -> Vec<String> {
        let mut a = vec![
            "--path".to_string(),
            match self.imp {
                Imp::C => "c",
                imp => imp.name(),
            }
            .into(),
        ];
        for (k, v) in [
            ("--qps", self.qps.to_string()),
            ("--depth", self.depth.to_string()),
            ("--threads", self.threads.to_string()),
            ("--rounds", rounds.to_string()),
            ("--calibrate", calibrate.to_string()),
            ("-i", PORT.into()),
            ("-x", GID_INDEX.into()),
        ] {
            a.push(k.into());
            a.push(v);
        }
        if self.events {
            a.push("--events".into());
        }
        if self.shared {
            a.push("--shared-cq".into());
        }
        a
    }
}

/// The key's suffix of a shared-CQ configuration (the plan keeps no other mark).
const SHARED: &str = "-shared";

/// A ping-pong pair measured whole-process in event mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pingpong {
    pub label: &'static str,
    pub c_program: &'static str,
    pub example: &'static str,
    /// `-g` (rdma-core's pingpongs) or `-x` (perftest).
    pub gid_flag: &'static str,
    pub size: u64,
    pub iters: (u64, u64),
}

const PINGPONGS: &[Pingpong] = &[
    Pingpong {
        label: "rc_pingpong -e",
        c_program: "ibv_rc_pingpong",
        example: "rc_pingpong",
        gid_flag: "-g",
        size: 64,
        iters: (200, 800),
    },
    Pingpong {
        label: "rc_pingpong -e",
        c_program: "ibv_rc_pingpong",
        example: "rc_pingpong",
        gid_flag: "-g",
        size: 4096,
        iters: (200, 800),
    },
    // perftest's `ib_send_lat -e` is left out: its 800-iteration client hung under callgrind
    // in both attempts (the 200-iteration one completes), so no marginal count.
];

/// The measurement sets (`--only` selects by name).
pub const SETS: &[&str] = &[
    "paths",
    "events",
    "qps",
    "depth",
    "threads",
    "threads-shared",
    "pingpong",
];

fn configs(set: &str, quick: bool) -> Vec<Config> {
    let c = |imp, qps, depth, threads, events| Config {
        imp,
        qps,
        depth,
        threads,
        events,
        shared: false,
    };
    let all = [Imp::C, Imp::Request, Imp::Prepared, Imp::Raw];
    let safe = [Imp::C, Imp::Request, Imp::Prepared];
    let floors = [Imp::FloorPrepared, Imp::FloorRequest];
    match set {
        "paths" => all
            .iter()
            .chain(&floors)
            .map(|&i| c(i, 16, 1, 1, false))
            .collect(),
        "events" => safe
            .iter()
            .chain(&floors)
            .map(|&i| c(i, 1, 1, 1, true))
            .collect(),
        "qps" => {
            let ns: &[u32] = if quick { &[1, 16] } else { &[1, 16, 256, 1024] };
            ns.iter()
                .flat_map(|&n| all.iter().map(move |&i| c(i, n, 1, 1, false)))
                .collect()
        }
        "depth" => {
            let ds: &[u32] = if quick { &[1, 16] } else { &[1, 16, 256] };
            ds.iter()
                .flat_map(|&d| safe.iter().map(move |&i| c(i, 16, d, 1, false)))
                .collect()
        }
        "threads" => {
            let ts: &[u32] = if quick { &[1, 2] } else { &[1, 2, 4] };
            ts.iter()
                .flat_map(|&t| safe.iter().map(move |&i| c(i, 4 * t, 16, t, false)))
                .collect()
        }
        // The paths whose completions any thread may take (opcost's `--shared-cq`).
        "threads-shared" => {
            let ts: &[u32] = if quick { &[1, 2] } else { &[1, 2, 4] };
            ts.iter()
                .flat_map(|&t| {
                    [Imp::Raw, Imp::Prepared].map(|i| Config {
                        shared: true,
                        ..c(i, 4 * t, 16, t, false)
                    })
                })
                .collect()
        }
        _ => Vec::new(),
    }
}

struct Out {
    dir: PathBuf,
}

impl Out {
    fn raw(&self) -> PathBuf {
        self.dir.join("raw")
    }
    fn script(&self) -> PathBuf {
        self.dir.join("run.sh")
    }
    fn plan(&self) -> PathBuf {
        self.dir.join("plan.json")
    }
    fn report(&self) -> PathBuf {
        self.dir.join("report.md")
    }
    fn png(&self) -> PathBuf {
        self.dir.join("scaling.png")
    }
    fn history(&self) -> PathBuf {
        self.dir.join("history.json")
    }
}

/// Records this run's counts in the history and compares them with the
/// previous separate measurement of each configuration (see `history.rs`).
fn agree(out: &Out, raw: &Path, rows: &[Row]) -> Option<history::Agreement> {
    let mut hist: history::History = fs::read_to_string(out.history())
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_default();
    let now: Vec<(String, u64, f64)> = rows
        .iter()
        .filter_map(|r| {
            let key = r.cfg.key();
            let stamp = fs::metadata(raw.join(format!("{key}.b.cg")))
                .and_then(|m| m.modified())
                .ok()?
                .duration_since(std::time::UNIX_EPOCH)
                .ok()?
                .as_secs();
            Some((key, stamp, r.m.per_op()))
        })
        .collect();
    let a = history::record(&mut hist, &now);
    if let Err(e) = serde_json::to_string(&hist)
        .map_err(anyhow::Error::from)
        .and_then(|t| fs::write(out.history(), t).map_err(Into::into))
    {
        step!("instr: history not saved: {e:#}");
    }
    Some(a)
}

/// What the host wrote down for the analysis: the configurations and ping-pongs run.
#[derive(serde::Serialize, serde::Deserialize, Default)]
struct Plan {
    /// (key, implementation name, qps, depth, threads, events).
    configs: Vec<(String, String, u32, u32, u32, bool)>,
    /// (label, index into PINGPONGS).
    pingpongs: Vec<(String, usize)>,
}

/// `cargo xtask instr`. True when every run succeeded.
pub fn cmd_instr(o: &InstrOptions) -> Result<bool> {
    let out = Out {
        dir: util::target_dir()?.join("instr"),
    };
    if o.reanalyze {
        return finish(&out, o.publish);
    }
    let sets: Vec<&str> = match &o.only {
        Some(v) => {
            for s in v {
                if !SETS.contains(&s.as_str()) {
                    bail!("--only: unknown set {s:?} (sets: {})", SETS.join(", "));
                }
            }
            SETS.iter()
                .copied()
                .filter(|s| v.iter().any(|x| x == s))
                .collect()
        }
        None => SETS.to_vec(),
    };
    // Line tables (no other debug information) so that `lines.rs` can name each
    // instruction's source line; they do not change the code.
    let examples = util::build_examples(
        true,
        &[
            "--example",
            "opcost",
            "--example",
            "rc_pingpong",
            "--config",
            "profile.release.debug=\"line-tables-only\"",
        ],
    )?;
    let opcost = examples
        .get("opcost")
        .context("opcost was not built")?
        .clone();
    fs::create_dir_all(out.raw())?;
    // With --only, the other sets' results of the last run stay (and its plan keeps them);
    // a full run starts afresh.
    let mut plan = match (&o.only, fs::read_to_string(out.plan())) {
        (Some(_), Ok(text)) => serde_json::from_str(&text).unwrap_or_default(),
        _ => {
            for e in fs::read_dir(out.raw())? {
                let _ = fs::remove_file(e?.path());
            }
            Plan::default()
        }
    };
    let c_twin = out.dir.join("opcost_c");
    let src = crate::repo_root()?.join("xtask/c/opcost.c");
    let status = Command::new("cc")
        .args(["-O2", "-g", "-Wall", "-Wextra", "-o"])
        .arg(&c_twin)
        .arg(&src)
        .args(["-libverbs", "-lpthread"])
        .status()
        .context("cannot run cc (install gcc)")?;
    if !status.success() {
        bail!("cc failed to build {}", src.display());
    }

    let mut sh = String::from(
        "#!/bin/sh\n# Written by `cargo xtask instr`; runs inside the VM.\nulimit -l unlimited\n",
    );
    let raw = out.raw();
    // Every configuration once, in set order; those of the `qps` set also get an strace run.
    let mut todo: Vec<(Config, bool)> = Vec::new();
    for set in &sets {
        for cfg in configs(set, o.quick) {
            match todo.iter_mut().find(|t| t.0 == cfg) {
                Some(t) => t.1 |= *set == "qps",
                None => todo.push((cfg, *set == "qps")),
            }
        }
    }
    let mut attributed = Vec::new();
    for (cfg, straced) in todo {
        {
            let key = cfg.key();
            plan.configs.retain(|c| c.0 != key);
            plan.configs.push((
                key.clone(),
                cfg.imp.name().into(),
                cfg.qps,
                cfg.depth,
                cfg.threads,
                cfg.events,
            ));
            let prog = match cfg.imp {
                Imp::C => &c_twin,
                _ => &opcost,
            };
            attributed.push((key.clone(), prog.clone()));
            let r = cfg.rounds();
            // The same calibration in both runs, so that it cancels from the marginal counts
            // (and from the per-function breakdown); the empty-poll cost is the long run's
            // `instr_empty` divided by its polls.
            for (tag, rounds, cal) in [("a", r, CALIBRATE), ("b", 3 * r, CALIBRATE)] {
                let cg = raw.join(format!("{key}.{tag}.cg"));
                let _ = writeln!(
                    sh,
                    "echo {key}.{tag}; timeout 900 valgrind --tool=callgrind --vgdb=no --dump-instr=yes --callgrind-out-file={} {} {} >{} 2>{}",
                    quote(&cg.to_string_lossy()),
                    quote(&prog.to_string_lossy()),
                    cfg.args(rounds, cal).iter().map(|a| quote(a)).collect::<Vec<_>>().join(" "),
                    quote(&raw.join(format!("{key}.{tag}.out")).to_string_lossy()),
                    quote(&raw.join(format!("{key}.{tag}.err")).to_string_lossy()),
                );
            }
            // Plain runs: wall-clock set-up/teardown and RSS, the median of PLAIN_RUNS.
            let _ = writeln!(
                sh,
                "echo {key}.plain; for i in $(seq {PLAIN_RUNS}); do timeout 600 {} {}; done >{} 2>&1",
                quote(&prog.to_string_lossy()),
                cfg.args(r, 0)
                    .iter()
                    .map(|a| quote(a))
                    .collect::<Vec<_>>()
                    .join(" "),
                quote(&raw.join(format!("{key}.plain.out")).to_string_lossy()),
            );
            if straced {
                let _ = writeln!(
                    sh,
                    "echo {key}.strace; timeout 600 strace -f -c -o {} {} {} >/dev/null 2>&1",
                    quote(&raw.join(format!("{key}.strace")).to_string_lossy()),
                    quote(&prog.to_string_lossy()),
                    cfg.args(1, 0)
                        .iter()
                        .map(|a| quote(a))
                        .collect::<Vec<_>>()
                        .join(" "),
                );
            }
        }
    }
    for set in &sets {
        if *set == "pingpong" {
            for (i, pp) in PINGPONGS.iter().enumerate() {
                let example = examples
                    .get(pp.example)
                    .with_context(|| format!("{} was not built", pp.example))?;
                let c_prog = which(pp.c_program)
                    .with_context(|| format!("{} not found (cargo xtask deps)", pp.c_program))?;
                for (imp, prog) in [("c", c_prog), ("rust", example.clone())] {
                    for (tag, n) in [("a", pp.iters.0), ("b", pp.iters.1)] {
                        let key = format!("pp{i}-{imp}.{tag}");
                        let port = 21000
                            + i * 10
                            + usize::from(imp == "rust") * 2
                            + usize::from(tag == "b");
                        let common = format!(
                            "{} {GID_INDEX} -s {} -n {n} -p {port} -e",
                            pp.gid_flag, pp.size
                        );
                        let p = quote(&prog.to_string_lossy());
                        let _ = writeln!(
                            sh,
                            "echo {key}; timeout 300 {p} {common} >{} 2>&1 &\n\
                             i=0; while [ $i -lt 100 ] && ! grep -qi ':{port:04X} 00000000:0000 0A' /proc/net/tcp /proc/net/tcp6; do sleep 0.2; i=$((i+1)); done\n\
                             timeout 300 valgrind --tool=callgrind --vgdb=no --callgrind-out-file={} {p} {common} localhost >{} 2>&1\n\
                             wait",
                            quote(&raw.join(format!("{key}.server")).to_string_lossy()),
                            quote(&raw.join(format!("{key}.cg")).to_string_lossy()),
                            quote(&raw.join(format!("{key}.out")).to_string_lossy()),
                        );
                    }
                }
                plan.pingpongs.retain(|p| p.1 != i);
                plan.pingpongs.push((pp.label.to_string(), i));
            }
        }
    }
    sh.push_str("echo instr-done\n");
    fs::write(out.script(), &sh)?;
    fs::write(out.plan(), serde_json::to_string_pretty(&plan)?)?;

    let session = vm::Session::new()?;
    let command = format!("sh {}", quote(&out.script().to_string_lossy()));
    step!(
        "instr: {} opcost configurations, {} ping-pongs, in one VM",
        plan.configs.len(),
        plan.pingpongs.len()
    );
    // Every callgrind run boots valgrind under TCG (10–30 s) before it counts: a full run
    // takes about 45 minutes on an idle host, far beyond the VM's default limit.
    let limit = o.vm.timeout_or(3 * 3600);
    let outcome = session.run(&[VmConfig::new(0, &command, &o.vm)], limit)?;
    let vm_ok = outcome.iter().all(|o| {
        step!("{}", o.describe());
        o.success()
    });
    // Line-by-line attribution needs the binaries just measured, so it is done now and kept
    // beside the profiles (`{key}.lines.tsv`) for `--reanalyze`.
    let repo = crate::repo_root()?;
    for (key, prog) in &attributed {
        let tsv = raw.join(format!("{key}.lines.tsv"));
        let _ = fs::remove_file(&tsv);
        let attributed = (|| -> Result<Vec<lines::Line>> {
            let (pa, pb) = (
                profile(&raw.join(format!("{key}.a.cg")))?,
                profile(&raw.join(format!("{key}.b.cg")))?,
            );
            let (la, lb) = (
                opcost_line(&raw.join(format!("{key}.a.out")))?,
                opcost_line(&raw.join(format!("{key}.b.out")))?,
            );
            let ops = num(&lb, "posts")? - num(&la, "posts")?;
            lines::attribute(prog, &pa, &pb, ops, &repo)
        })();
        match attributed {
            Ok(v) => fs::write(&tsv, lines::to_tsv(&v))?,
            Err(e) => step!("instr: {key}: no line attribution: {e:#}"),
        }
    }
    let ok = finish(&out, o.publish)?;
    if vm_ok {
        session.cleanup();
    } else {
        step!("run directory kept: {}", session.run_dir().display());
    }
    Ok(vm_ok && ok)
}

fn which(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(program))
            .find(|p| p.is_file())
    })
}

/// The `key=value` line an opcost program printed.
fn opcost_line(path: &Path) -> Result<BTreeMap<String, String>> {
    opcost_lines(path)?
        .into_iter()
        .next()
        .with_context(|| format!("{}: no result line (run failed?)", path.display()))
}

/// Every result line of `path` (one per run), as key/value maps.
fn opcost_lines(path: &Path) -> Result<Vec<BTreeMap<String, String>>> {
    let text = fs::read_to_string(path).with_context(|| format!("no {}", path.display()))?;
    Ok(text
        .lines()
        .filter(|l| l.starts_with("opcost "))
        .map(|line| {
            line.split_whitespace()
                .skip(1)
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        })
        .collect())
}

/// How many times each configuration runs without callgrind, for its wall-clock set-up and
/// teardown: under TCG one program's teardown of 1024 QPs took 0.85 to 1.55 s in four runs.
const PLAIN_RUNS: usize = 3;

/// The median of `v` (the mean of the middle two for an even count); `None` when empty.
fn median(mut v: Vec<f64>) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(v[n / 2]),
        _ => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

fn num(m: &BTreeMap<String, String>, k: &str) -> Result<f64> {
    m.get(k)
        .with_context(|| format!("result line has no {k}"))?
        .parse()
        .with_context(|| format!("{k} is not a number"))
}

fn profile(path: &Path) -> Result<callgrind::Profile> {
    let text = fs::read_to_string(path).with_context(|| format!("no {}", path.display()))?;
    callgrind::parse(&text).with_context(|| format!("parsing {}", path.display()))
}

/// The provider's post and poll functions: the functions in librxe that the C twin's
/// `instr_post` and `instr_empty` call (rxe's are static, so callgrind names them by address;
/// the same library gives the same names in every process).
fn provider_functions(c: &callgrind::Profile) -> Result<(callgrind::Func, callgrind::Func)> {
    let one = |name: &str| -> Result<callgrind::Func> {
        let f = c
            .named(name)
            .into_iter()
            .next()
            .with_context(|| format!("the C profile has no {name}"))?;
        let v = c.callees_in(&f, "librxe");
        match v.as_slice() {
            [x] => Ok(x.clone()),
            _ => bail!("{name} calls {} functions of librxe, expected one", v.len()),
        }
    };
    Ok((one("instr_post")?, one("instr_empty")?))
}

/// Measures one configuration from its two runs.
fn measure(
    raw: &Path,
    key: &str,
    provider: Option<&(callgrind::Func, callgrind::Func, f64)>,
) -> Result<report::Measured> {
    let (la, lb) = (
        opcost_line(&raw.join(format!("{key}.a.out")))?,
        opcost_line(&raw.join(format!("{key}.b.out")))?,
    );
    let (pa, pb) = (
        profile(&raw.join(format!("{key}.a.cg")))?,
        profile(&raw.join(format!("{key}.b.cg")))?,
    );
    let d = |k: &str| -> Result<f64> { Ok(num(&lb, k)? - num(&la, k)?) };
    let (dposts, dcomps, dshort, dcal) = (
        d("posts")?,
        d("completions")?,
        d("short_polls")?,
        d("calibrate")?,
    );
    if dposts <= 0.0 {
        bail!("{key}: the long run did not do more work");
    }
    let di = |name: &str| pb.inclusive_named(name) as f64 - pa.inclusive_named(name) as f64;
    let empty = if dcal > 0.0 {
        di("instr_empty") / dcal
    } else {
        pb.inclusive_named("instr_empty") as f64 / num(&lb, "calibrate")?.max(1.0)
    };
    let post = di("instr_post") / dposts;
    // A short poll costs about what an empty one does beyond the completions it takes.
    let completion = (di("instr_poll") - empty * dshort) / dcomps;
    let wait = di("instr_wait") / dcomps;
    let (provider_post, provider_completion) = match provider {
        Some((fpost, fpoll, empty_p)) => {
            let dp = |f: &callgrind::Func| pb.calls_into(f).1 as f64 - pa.calls_into(f).1 as f64;
            (
                Some(dp(fpost) / dposts),
                Some((dp(fpoll) - empty_p * (dcal + dshort)) / dcomps),
            )
        }
        None => (None, None),
    };
    let plain = opcost_lines(&raw.join(format!("{key}.plain.out"))).unwrap_or_default();
    let plain_median = |f: &dyn Fn(&BTreeMap<String, String>) -> Option<f64>| {
        median(plain.iter().filter_map(f).collect())
    };
    let breakdown = breakdown(&pa, &pb, dposts);
    let lines = fs::read_to_string(raw.join(format!("{key}.lines.tsv")))
        .map(|t| lines::from_tsv(&t))
        .unwrap_or_default();
    Ok(report::Measured {
        breakdown,
        lines,
        post,
        completion,
        wait,
        empty,
        provider_post,
        provider_completion,
        short_polls: (num(&la, "short_polls")?, num(&lb, "short_polls")?),
        setup_us: plain_median(&|m| num(m, "setup_us").ok()),
        teardown_us: plain_median(&|m| num(m, "teardown_us").ok()),
        rss_qps_kib: plain_median(&|m| {
            Some(num(m, "rss_qps_kib").ok()? - num(m, "rss_base_kib").ok()?)
        }),
        kernel_calls: None,
    })
}

/// Where the instructions of one operation go: each function's marginal self cost between
/// the short run `pa` and the long run `pb`, per operation (`ops` more in the long run);
/// functions under one instruction left out, largest first.
fn breakdown(pa: &callgrind::Profile, pb: &callgrind::Profile, ops: f64) -> Vec<(String, f64)> {
    let mut v: Vec<(String, f64)> = pb
        .self_cost
        .iter()
        .map(|(f, &cb)| {
            let ca = pa.self_cost.get(f).copied().unwrap_or(0);
            let object = Path::new(&f.object)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            (
                format!("`{}` ({object})", f.name),
                (cb as f64 - ca as f64) / ops,
            )
        })
        .filter(|(_, v)| *v >= 1.0)
        .collect();
    v.sort_by(|a, b| b.1.total_cmp(&a.1));
    v
}

/// Total calls in an `strace -c` summary.
fn strace_calls(path: &Path) -> Option<f64> {
    let text = fs::read_to_string(path).ok()?;
    let total = text.lines().find(|l| l.trim_end().ends_with("total"))?;
    // % time, seconds, usecs/call, calls, [errors], total
    let fields: Vec<&str> = total.split_whitespace().collect();
    fields.get(3)?.parse().ok()
}

fn finish(out: &Out, publish: bool) -> Result<bool> {
    let plan: Plan = serde_json::from_str(
        &fs::read_to_string(out.plan()).context("no plan: run `cargo xtask instr` first")?,
    )?;
    let raw = out.raw();
    let mut ok = true;
    // The provider's functions and its empty-poll cost, from a C profile.
    let provider = plan
        .configs
        .iter()
        .find(|c| c.1 == "C" && !c.5)
        .and_then(|c| {
            let pa = profile(&raw.join(format!("{}.a.cg", c.0))).ok()?;
            let pb = profile(&raw.join(format!("{}.b.cg", c.0))).ok()?;
            let (fpost, fpoll) = provider_functions(&pa).ok()?;
            let la = opcost_line(&raw.join(format!("{}.a.out", c.0))).ok()?;
            let lb = opcost_line(&raw.join(format!("{}.b.out", c.0))).ok()?;
            let dcal = num(&lb, "calibrate").ok()? - num(&la, "calibrate").ok()?;
            let cal_b = num(&lb, "calibrate").ok()?.max(1.0);
            let e = |p: &callgrind::Profile| -> f64 {
                p.named("instr_empty")
                    .first()
                    .map(|f| p.calls.get(&(f.clone(), fpoll.clone())).map_or(0, |x| x.1))
                    .unwrap_or(0) as f64
            };
            let empty = if dcal > 0.0 {
                (e(&pb) - e(&pa)) / dcal
            } else {
                e(&pb) / cal_b
            };
            Some((fpost, fpoll, empty))
        });
    if provider.is_none() {
        step!("instr: no C profile to find rxe's post/poll functions in; provider shares left out");
    }
    let mut rows = Vec::new();
    for (key, imp, qps, depth, threads, events) in &plan.configs {
        let Some(imp) = Imp::ALL.into_iter().find(|i| i.name() == imp) else {
            bail!("instr: plan names an unknown path {imp:?}");
        };
        let cfg = Config {
            imp,
            qps: *qps,
            depth: *depth,
            threads: *threads,
            events: *events,
            shared: key.ends_with(SHARED),
        };
        match measure(&raw, key, provider.as_ref()) {
            Ok(mut m) => {
                // Every strace run of the configuration counts, also one of an earlier
                // run that a later --only left in place.
                m.kernel_calls = strace_calls(&raw.join(format!("{key}.strace")));
                rows.push(Row { cfg, m });
            }
            Err(e) => {
                ok = false;
                step!("instr: {key}: {e:#}");
            }
        }
    }
    let mut pps = Vec::new();
    for (label, i) in &plan.pingpongs {
        // A plan from before a ping-pong was dropped from the table.
        let Some(&pp) = PINGPONGS.get(*i) else {
            continue;
        };
        let mut per = Vec::new();
        let mut parts = Vec::new();
        for imp in ["c", "rust"] {
            let get = |tag: &str| -> Result<callgrind::Profile> {
                // The client's own report proves the run completed (a killed one leaves a
                // partial profile).
                let out = raw.join(format!("pp{i}-{imp}.{tag}.out"));
                let text = fs::read_to_string(&out).unwrap_or_default();
                if !text.contains("iters in") && !text.contains("t_typical") {
                    bail!("{} has no result: the run did not complete", out.display());
                }
                profile(&raw.join(format!("pp{i}-{imp}.{tag}.cg")))
            };
            match (get("a"), get("b")) {
                (Ok(a), Ok(b)) => {
                    let iters = (pp.iters.1 - pp.iters.0) as f64;
                    per.push(Some((b.total as f64 - a.total as f64) / iters));
                    parts.push(breakdown(&a, &b, iters));
                }
                (a, b) => {
                    ok = false;
                    let e = a
                        .err()
                        .or(b.err())
                        .map(|e| format!("{e:#}"))
                        .unwrap_or_default();
                    step!("instr: ping-pong {label} {} B {imp}: {e}", pp.size);
                    per.push(None);
                    parts.push(Vec::new());
                }
            }
        }
        pps.push(report::PingpongRow {
            label: label.clone(),
            size: pp.size,
            c: per[0],
            rust: per[1],
            breakdown: [std::mem::take(&mut parts[0]), std::mem::take(&mut parts[1])],
        });
    }
    let agreement = agree(out, &raw, &rows);
    let md = report::markdown(&rows, &pps, agreement.as_ref());
    fs::write(out.report(), &md)?;
    if let Err(e) = report::plot(&rows, &out.png()) {
        step!("instr: no plot: {e:#}");
    }
    println!("{md}");
    step!("instr: report in {}", out.report().display());
    if publish {
        let docs = crate::results_dir()?;
        fs::write(
            docs.join("instructions.md"),
            md.replace("scaling.png", "instructions.png"),
        )?;
        if out.png().is_file() {
            fs::copy(out.png(), docs.join("instructions.png"))?;
        }
        step!(
            "instr: published to {}",
            docs.join("instructions.md").display()
        );
    }
    Ok(ok)
}

#[cfg(test)]
mod tests {
    use super::median;

    #[test]
    fn median_of_odd_even_and_none() {
        assert_eq!(median(vec![]), None);
        assert_eq!(median(vec![5.0]), Some(5.0));
        assert_eq!(median(vec![900.0, 3.0, 7.0]), Some(7.0));
        assert_eq!(median(vec![4.0, 1.0, 3.0, 100.0]), Some(3.5));
    }
}
