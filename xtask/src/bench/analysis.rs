//! From runs to results: each run is judged (exit statuses, then the number parsed from the
//! client's output), and the measured runs are grouped per (tool, size) and implementation.

use std::collections::BTreeMap;
use std::fs;
use std::path::PathBuf;

use anyhow::{bail, Result};

use super::parse::{self, Wanted};
use super::plan::{self, Group, Impl, Metric, Plan, RunSpec, Tool, Workload};
use super::runner::{Exit, RunRecord};
use super::stats::{self, Summary};

/// The number a tool's output gives for `metric`, checked against the size and iterations asked.
pub fn extract(metric: Metric, text: &str, size: u64, iters: u64) -> Result<f64> {
    match metric {
        Metric::PingpongLatency => {
            let p = parse::pingpong(text)?;
            if p.iters != iters {
                bail!("it reports {} iterations, {iters} were asked for", p.iters);
            }
            Ok(p.usec_per_iter)
        }
        Metric::Latency => parse::perftest_value(
            text,
            &Wanted {
                column: "t_typical",
                unit: "usec",
                size,
                iters: Some(iters),
            },
        ),
        Metric::Bandwidth => parse::bandwidth_mb_s(text, size, Some(iters)),
        Metric::Iops | Metric::BusBandwidth | Metric::AllreduceLatency => {
            bail!("a workload's number comes from `extract_workload`")
        }
    }
}

/// MB/s as perftest counts them (2²⁰ B) from GB/s as NCCL-tests count them (10⁹ B).
pub fn gb_s_to_mb_s(gb_s: f64) -> f64 {
    gb_s * 1e9 / (1u64 << 20) as f64
}

/// An all-reduce rank's bus bandwidth in MB/s (2²⁰ B), from its median iteration time.
///
/// The example prints busbw in GB/s with three decimals: under TCG that is 0.003 GB/s, a ±17 %
/// rounding step. Its median time (0.1 µs) is the same measurement, finer: algbw = bytes /
/// time, busbw = algbw · 2(N−1)/N (NCCL-tests). The printed busbw must agree with it to its
/// rounding, else the output is not what we think and gives no number.
pub fn busbw_mb_s(r: &parse::Allreduce) -> Result<f64> {
    if r.median_us <= 0.0 || r.ranks == 0 {
        bail!(
            "median {} us over {} ranks gives no bandwidth",
            r.median_us,
            r.ranks
        );
    }
    let bytes = r.floats as f64 * 4.0;
    let n = r.ranks as f64;
    let bus_gb_s = bytes / (r.median_us * 1e-6) * 2.0 * (n - 1.0) / n / 1e9;
    if (bus_gb_s - r.busbw_gb_s).abs() > 0.0005 + 1e-9 * bus_gb_s.max(1.0) {
        bail!(
            "busbw {} GB/s does not match the median ({bus_gb_s:.6} GB/s from {} us)",
            r.busbw_gb_s,
            r.median_us
        );
    }
    Ok(gb_s_to_mb_s(bus_gb_s))
}

/// The number of a workload run (issue #21): the C ceiling from perftest's table, ours from
/// the example's lines, which count only in outputs that say `VERIFIED` (every rank's, for an
/// all-reduce).
pub fn extract_workload(
    w: Workload,
    baseline_is_rust: bool,
    spec: &RunSpec,
    rec: &RunRecord,
) -> Result<f64> {
    let read = |p: &PathBuf| {
        fs::read_to_string(p).map_err(|e| anyhow::anyhow!("cannot read {}: {e}", p.display()))
    };
    let client = read(&rec.client_out)?;
    let c_side = spec.imp == Impl::C && !baseline_is_rust;
    match w {
        Workload::BlockRead { depth } | Workload::BlockWrite { depth } if c_side => {
            let _ = depth;
            parse::message_rate(&client, spec.size, Some(spec.iters))
        }
        Workload::BlockRead { depth } => {
            Ok(parse::blockstore_phase(&client, "random", spec.iters, depth.into())?.iops)
        }
        Workload::BlockWrite { depth } => {
            Ok(parse::blockstore_phase(&client, "mixed", spec.iters, depth.into())?.iops)
        }
        Workload::AllreduceBw if c_side => {
            parse::bandwidth_mb_s(&client, spec.size, Some(spec.iters))
        }
        Workload::AllreduceBw | Workload::AllreduceWait => {
            let ranks = spec.extra.len() as u64 + 2;
            let floats = if w == Workload::AllreduceBw {
                plan::ALLREDUCE_FLOATS
            } else {
                plan::SMALL_ALLREDUCE_FLOATS
            };
            let mut others = vec![&rec.server_out];
            others.extend(&rec.extra_outs);
            for (k, p) in others.into_iter().enumerate() {
                parse::allreduce(&read(p)?, ranks, floats, spec.iters)
                    .map_err(|e| anyhow::anyhow!("rank {k}: {e:#}"))?;
            }
            let last = parse::allreduce(&client, ranks, floats, spec.iters)
                .map_err(|e| anyhow::anyhow!("rank {}: {e:#}", ranks - 1))?;
            Ok(if w == Workload::AllreduceBw {
                busbw_mb_s(&last)?
            } else {
                last.median_us
            })
        }
    }
}

/// The last non-empty line of a file, to say why a tool failed.
fn last_line(path: &PathBuf) -> Option<String> {
    let text = fs::read_to_string(path).ok()?;
    text.lines()
        .rev()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .map(str::to_string)
}

/// The measured value of a run, or why there is none.
pub fn judge(spec: &RunSpec, rec: Option<&RunRecord>) -> std::result::Result<f64, String> {
    let Some(rec) = rec else {
        return Err("did not run (the VM stopped before it)".into());
    };
    if let Some(p) = &rec.problem {
        return Err(p.clone());
    }
    let with_output = |who: &str, exit: Exit, path: &PathBuf| {
        let mut s = format!("the {who} {}", exit.describe());
        if let Some(l) = last_line(path) {
            s.push_str(&format!(": `{l}`"));
        }
        s
    };
    if rec.client_exit != Exit::Code(0) {
        return Err(with_output("client", rec.client_exit, &rec.client_out));
    }
    if rec.server_exit != Exit::Code(0) {
        return Err(with_output("server", rec.server_exit, &rec.server_out));
    }
    for (k, exit) in rec.extra_exits.iter().enumerate() {
        if *exit != Exit::Code(0) {
            let out = rec.extra_outs.get(k).cloned().unwrap_or_default();
            return Err(with_output(&format!("background process {k}"), *exit, &out));
        }
    }
    if rec.extra_exits.len() != spec.extra.len() {
        return Err("the record lacks background processes of the plan".into());
    }
    let Some(tool) = plan::tool(&spec.tool) else {
        return Err(format!("unknown tool `{}`", spec.tool));
    };
    if let Some(w) = tool.workload() {
        return extract_workload(w, tool.baseline_is_rust(), spec, rec)
            .map_err(|e| format!("output: {e:#}"));
    }
    let text = fs::read_to_string(&rec.client_out)
        .map_err(|e| format!("cannot read {}: {e}", rec.client_out.display()))?;
    extract(tool.metric, &text, spec.size, spec.iters).map_err(|e| format!("client output: {e:#}"))
}

/// A run that gave no number.
#[derive(Debug, Clone)]
pub struct Failure {
    pub spec: RunSpec,
    pub reason: String,
}

/// One implementation's runs of a cell.
#[derive(Debug, Clone, Default)]
pub struct Side {
    /// In round order.
    pub values: Vec<f64>,
    pub failures: Vec<Failure>,
    pub summary: Option<Summary>,
}

impl Side {
    pub fn planned(&self) -> usize {
        self.values.len() + self.failures.len()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Pass,
    Miss,
    /// One side has no successful run.
    NoData,
    /// A cell without a target (`Target::Report`): its ratio is the result.
    Reported,
}

/// One (tool, size): both implementations.
#[derive(Debug, Clone)]
pub struct Cell {
    pub tool: &'static Tool,
    pub size: u64,
    pub iters: u64,
    pub c: Side,
    pub rust: Side,
}

impl Cell {
    pub fn ratio(&self) -> Option<f64> {
        Some(stats::ratio(
            self.rust.summary.as_ref()?,
            self.c.summary.as_ref()?,
        ))
    }

    /// The 95 % bootstrap interval of [`ratio`](Self::ratio) (see `stats::ratio_interval`).
    pub fn interval(&self) -> Option<(f64, f64)> {
        stats::ratio_interval(&self.rust.values, &self.c.values)
    }

    /// A missed target whose whole interval lies beyond it: a miss the runs' spread cannot
    /// explain.
    pub fn clear_miss(&self) -> bool {
        self.verdict() == Verdict::Miss
            && self.interval().is_some_and(|(lo, hi)| {
                let t = self.tool.metric.target();
                !t.met(lo) && !t.met(hi)
            })
    }

    pub fn verdict(&self) -> Verdict {
        if self.tool.metric.target() == plan::Target::Report {
            return if self.ratio().is_some() {
                Verdict::Reported
            } else {
                Verdict::NoData
            };
        }
        match self.ratio() {
            Some(r) if self.tool.metric.target().met(r) => Verdict::Pass,
            Some(_) => Verdict::Miss,
            None => Verdict::NoData,
        }
    }

    pub fn failures(&self) -> usize {
        self.c.failures.len() + self.rust.failures.len()
    }

    /// The C tool against itself in this cell (see `stats::split_half_ratio`).
    pub fn c_self_ratio(&self) -> Option<f64> {
        stats::split_half_ratio(&self.c.values)
    }
}

/// All cells, in tool-table and size order, plus the runs outside them.
#[derive(Debug, Clone, Default)]
pub struct Analysis {
    pub cells: Vec<Cell>,
    pub warmup_failures: Vec<Failure>,
    pub runs_planned: usize,
    pub runs_recorded: usize,
    /// Sum of the clients' run times, seconds.
    pub client_secs: f64,
}

impl Analysis {
    /// The cells of one table of the report.
    pub fn group(&self, g: Group) -> Vec<&Cell> {
        self.cells.iter().filter(|c| c.tool.group() == g).collect()
    }

    /// Only the tool pairs' cells (what the plot draws).
    pub fn tools_only(&self) -> Analysis {
        Analysis {
            cells: self
                .cells
                .iter()
                .filter(|c| c.tool.group() == Group::Tools)
                .cloned()
                .collect(),
            ..self.clone()
        }
    }

    pub fn all_failures(&self) -> Vec<&Failure> {
        let mut v: Vec<&Failure> = self.warmup_failures.iter().collect();
        for c in &self.cells {
            v.extend(c.c.failures.iter().chain(&c.rust.failures));
        }
        v.sort_by_key(|f| f.spec.seq);
        v
    }
}

/// Failures in schedule order, consecutive ones with the same reason merged (a VM that stopped
/// early leaves many runs with one reason): (first, last, count, reason).
pub fn grouped_failures(a: &Analysis) -> Vec<(&Failure, &Failure, usize, &str)> {
    let mut out: Vec<(&Failure, &Failure, usize, &str)> = Vec::new();
    for f in a.all_failures() {
        match out.last_mut() {
            Some((_, last, n, reason))
                if *reason == f.reason && last.spec.seq + 1 == f.spec.seq =>
            {
                *last = f;
                *n += 1;
            }
            _ => out.push((f, f, 1, f.reason.as_str())),
        }
    }
    out
}

pub fn analyze(plan: &Plan, records: &[RunRecord]) -> Analysis {
    let by_seq: BTreeMap<usize, &RunRecord> = records.iter().map(|r| (r.seq, r)).collect();
    let mut cells: BTreeMap<(usize, u64), Cell> = BTreeMap::new();
    let mut a = Analysis {
        runs_planned: plan.runs.len(),
        runs_recorded: by_seq.len(),
        client_secs: records.iter().map(|r| r.client_secs).sum(),
        ..Analysis::default()
    };
    for spec in &plan.runs {
        let rec = by_seq.get(&spec.seq).copied();
        let result = judge(spec, rec);
        if spec.warmup {
            if let Err(reason) = result {
                a.warmup_failures.push(Failure {
                    spec: spec.clone(),
                    reason,
                });
            }
            continue;
        }
        let Some((order, tool)) = plan::TOOLS
            .iter()
            .enumerate()
            .find(|(_, t)| t.key == spec.tool)
        else {
            continue;
        };
        let cell = cells.entry((order, spec.size)).or_insert_with(|| Cell {
            tool,
            size: spec.size,
            iters: spec.iters,
            c: Side::default(),
            rust: Side::default(),
        });
        let side = match spec.imp {
            Impl::C => &mut cell.c,
            Impl::Rust => &mut cell.rust,
        };
        match result {
            Ok(v) => side.values.push(v),
            Err(reason) => side.failures.push(Failure {
                spec: spec.clone(),
                reason,
            }),
        }
    }
    for cell in cells.values_mut() {
        cell.c.summary = stats::summarize(&cell.c.values);
        cell.rust.summary = stats::summarize(&cell.rust.values);
    }
    a.cells = cells.into_values().collect();
    a
}

#[cfg(test)]
mod tests {
    use super::super::parse::samples::*;
    use super::super::plan::{schedule, select_tools, Programs, Settings};
    use super::super::runner::raw_paths;
    use super::*;

    #[test]
    fn extraction_checks_iterations() {
        assert_eq!(
            extract(Metric::PingpongLatency, IBV_RC_PINGPONG, 64, 200).unwrap(),
            189.65
        );
        assert!(extract(Metric::PingpongLatency, IBV_RC_PINGPONG, 64, 2000).is_err());
        assert_eq!(
            extract(Metric::Bandwidth, IB_WRITE_BW, 65536, 200).unwrap(),
            32.96
        );
        assert!(extract(Metric::Bandwidth, IB_WRITE_LAT, 2, 1000).is_err());
        assert_eq!(
            extract(Metric::Latency, IB_WRITE_LAT, 2, 1000).unwrap(),
            48.73
        );
    }

    /// A 3-rank all-reduce run judged from its files: the value is the last rank's bus
    /// bandwidth, and a middle rank that did not say VERIFIED fails the run.
    #[test]
    fn workload_runs_need_every_rank_verified() {
        let dir = std::env::temp_dir().join(format!("xtask-wl-test-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let tools = select_tools(Some(&["allreduce-busbw".into()])).unwrap();
        let mut progs = Programs::default();
        progs.rust.insert("allreduce".into(), "/x/allreduce".into());
        let runs = schedule(
            &Settings {
                tools: &tools,
                sizes: &[2],
                rounds: 1,
                iters: Some(50),
                quick: false,
                port_base: 20000,
                vm_cpus: 2,
            },
            &progs,
        );
        let spec = runs
            .iter()
            .find(|r| !r.warmup && r.imp == Impl::Rust)
            .unwrap();
        let (s, c) = raw_paths(&dir, spec);
        let mid = super::super::runner::extra_path(&dir, spec, 0);
        let rank = |r: u64| ALLREDUCE_RANK.replace("rank 2 of 3", &format!("rank {r} of 3"));
        fs::write(&s, rank(0)).unwrap();
        fs::write(&mid, rank(1)).unwrap();
        fs::write(&c, rank(2)).unwrap();
        let rec = RunRecord {
            seq: spec.seq,
            id: spec.id.clone(),
            server_exit: Exit::Code(0),
            client_exit: Exit::Code(0),
            problem: None,
            listen_secs: 0.1,
            client_secs: 1.0,
            server_out: s,
            client_out: c,
            extra_exits: vec![Exit::Code(0)],
            extra_outs: vec![mid.clone()],
        };
        // 196608 B in 10480.3 µs, · 4/3: 0.02501 GB/s (printed 0.025)
        let v = judge(spec, Some(&rec)).unwrap();
        let want = gb_s_to_mb_s(196608.0 / 10480.3e-6 * 4.0 / 3.0 / 1e9);
        assert!((v - want).abs() < 1e-9, "{v} {want}");
        // a printed busbw the median does not give: no number
        fs::write(
            &rec.client_out,
            rank(2).replace("busbw 0.025", "busbw 0.050"),
        )
        .unwrap();
        let e = judge(spec, Some(&rec)).unwrap_err();
        assert!(e.contains("does not match the median"), "{e}");
        fs::write(&rec.client_out, rank(2)).unwrap();
        // the middle rank found a wrong sum: no VERIFIED, no number
        fs::write(&mid, rank(1).replace("VERIFIED", "WRONG")).unwrap();
        let e = judge(spec, Some(&rec)).unwrap_err();
        assert!(e.contains("rank 1") && e.contains("VERIFIED"), "{e}");
        // the middle rank exited non-zero
        fs::write(&mid, rank(1)).unwrap();
        let mut bad = rec.clone();
        bad.extra_exits = vec![Exit::Code(1)];
        let e = judge(spec, Some(&bad)).unwrap_err();
        assert!(
            e.contains("background process 0 exited with status 1"),
            "{e}"
        );
        // the C ceiling of a block-store cell is perftest's message rate
        let tools = select_tools(Some(&["blockstore-read-q16".into()])).unwrap();
        let mut progs = Programs::default();
        progs
            .c
            .insert("ib_read_bw".into(), "/usr/bin/ib_read_bw".into());
        let runs = schedule(
            &Settings {
                tools: &tools,
                sizes: &[2],
                rounds: 1,
                iters: Some(1000),
                quick: false,
                port_base: 20000,
                vm_cpus: 2,
            },
            &progs,
        );
        let spec = runs.iter().find(|r| !r.warmup && r.imp == Impl::C).unwrap();
        let (s, c) = raw_paths(&dir, spec);
        fs::write(&s, "").unwrap();
        fs::write(&c, IB_READ_BW_4K).unwrap();
        let rec = RunRecord {
            server_out: s,
            client_out: c,
            extra_exits: Vec::new(),
            extra_outs: Vec::new(),
            ..rec
        };
        assert!((judge(spec, Some(&rec)).unwrap() - 8553.0).abs() < 1e-6);
        fs::remove_dir_all(&dir).unwrap();
    }

    /// A whole plan judged from files: values, failures and a run the VM never reached.
    #[test]
    fn analysis_of_a_small_plan() {
        let dir = std::env::temp_dir().join(format!("xtask-bench-test-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let tools = select_tools(Some(&["rc_pingpong".into()])).unwrap();
        let mut progs = Programs::default();
        progs
            .c
            .insert("ibv_rc_pingpong".into(), "/usr/bin/ibv_rc_pingpong".into());
        progs
            .rust
            .insert("rc_pingpong".into(), "/x/rc_pingpong".into());
        let runs = schedule(
            &Settings {
                tools: &tools,
                sizes: &[64],
                rounds: 2,
                iters: Some(200),
                quick: false,
                port_base: 20000,
                vm_cpus: 2,
            },
            &progs,
        );
        let plan = Plan {
            rounds: 2,
            sizes: vec![64],
            quick: false,
            iters_override: Some(200),
            run_timeout_secs: 60,
            deadline_secs: None,
            raw_dir: dir.clone(),
            results: dir.join("results.jsonl"),
            vm_env: dir.join("vm-env.json"),
            runs,
            vm_cpus: 2,
        };
        let ok = |us: f64| format!("ITERS iters in 0.04 seconds = {us:.2} usec/iter\n");
        let mut records = Vec::new();
        // warm-ups and round 1 (C, Rust), then round 2's first run (Rust) fails; the last never ran
        let outputs = [
            Some(ok(100.0)),
            Some(ok(100.0)),
            Some(ok(190.0)),
            Some(ok(200.0)),
            Some("IB device rxe0 not found\n".to_string()),
        ];
        for (spec, out) in plan.runs.iter().zip(outputs) {
            let Some(out) = out else { continue };
            let (s, c) = raw_paths(&dir, spec);
            fs::write(&s, "").unwrap();
            fs::write(&c, out.replace("ITERS", &spec.iters.to_string())).unwrap();
            let failed = out.contains("not found");
            records.push(RunRecord {
                seq: spec.seq,
                id: spec.id.clone(),
                server_exit: Exit::Code(0),
                client_exit: Exit::Code(if failed { 1 } else { 0 }),
                problem: None,
                listen_secs: 0.1,
                client_secs: 1.0,
                server_out: s,
                client_out: c,
                extra_exits: Vec::new(),
                extra_outs: Vec::new(),
            });
        }
        let a = analyze(&plan, &records);
        assert_eq!(a.runs_planned, 6);
        assert_eq!(a.runs_recorded, 5);
        assert_eq!(a.cells.len(), 1);
        let cell = &a.cells[0];
        assert_eq!(cell.c.values, [190.0]);
        assert_eq!(cell.rust.values, [200.0]);
        assert_eq!(cell.failures(), 2);
        let reasons: Vec<&str> = a.all_failures().iter().map(|f| f.reason.as_str()).collect();
        assert_eq!(
            reasons,
            [
                "the client exited with status 1: `IB device rxe0 not found`",
                "did not run (the VM stopped before it)"
            ]
        );
        assert!((cell.ratio().unwrap() - 200.0 / 190.0).abs() < 1e-12);
        assert_eq!(grouped_failures(&a).len(), 2);
        assert_eq!(cell.verdict(), Verdict::Miss);
        fs::remove_dir_all(&dir).unwrap();
    }
}
