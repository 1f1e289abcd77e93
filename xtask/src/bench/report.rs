//! The bench's outputs: the table printed at the end and `target/bench/report.md`.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use super::analysis::{Analysis, Cell, Side, Verdict};
use super::plan::{self, Group, Metric, Plan, Target, Workload};
use super::stats::{self, Summary};

/// Where and how the bench ran (host side; the VM's own facts come from `vm-env.json`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Env {
    pub date: String,
    pub git: String,
    pub host_kernel: String,
    pub host_cpu: String,
    pub host_cpus: usize,
    pub rdma_core: String,
    pub perftest: String,
    pub qemu: String,
    pub vm_mem: String,
    pub vm_smp: u32,
    /// Extra guest kernel arguments (`--kernel-arg`), e.g. `idle=poll`.
    #[serde(default)]
    pub vm_kernel_args: Vec<String>,
    pub load_before: String,
    pub load_after: String,
    /// QEMU processes on the host that are not ours, before and after (other engineers' VMs).
    pub other_vms_before: usize,
    pub other_vms_after: usize,
    /// Wall-clock time of the VM (boot to power-off), seconds.
    pub vm_secs: f64,
    pub command: String,
    pub vm_kernel: String,
    pub vm_cpus: usize,
    pub vm_gid1: String,
}

impl Env {
    /// A warning when the host was busy: other VMs or a load above its core count.
    pub fn noise_warning(&self) -> Option<String> {
        let load = |s: &str| {
            s.split_whitespace()
                .next()
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        let peak = load(&self.load_before).max(load(&self.load_after));
        let others = self.other_vms_before.max(self.other_vms_after);
        if others == 0 && (self.host_cpus == 0 || peak <= self.host_cpus as f64) {
            return None;
        }
        Some(format!(
            "the host was busy ({others} other QEMU VM(s), 1-min load up to {peak:.1} on {} \
             cores): the VM's vCPUs competed with them for the cores, so expect noise far above \
             ±3 %; rerun on an idle host before drawing conclusions",
            self.host_cpus
        ))
    }
}

/// A number with as many digits as its size deserves.
pub fn num(v: f64) -> String {
    let a = v.abs();
    if !v.is_finite() {
        "—".into()
    } else if a >= 1000.0 {
        format!("{v:.0}")
    } else if a >= 100.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.4}")
    }
}

pub fn size(bytes: u64) -> String {
    if bytes >= 1024 && bytes % 1024 == 0 {
        format!("{} KiB", bytes / 1024)
    } else {
        format!("{bytes} B")
    }
}

fn median(s: &Side) -> String {
    s.summary.as_ref().map_or("—".into(), |m| num(m.median))
}

fn range(s: &Side) -> String {
    s.summary
        .as_ref()
        .map_or("—".into(), |m| format!("{}–{}", num(m.min), num(m.max)))
}

fn rel_range(s: &Side) -> String {
    s.summary.as_ref().map_or("—".into(), |m: &Summary| {
        if m.n < 2 {
            "n=1".into()
        } else {
            format!("{:.1}%", 100.0 * m.rel_range())
        }
    })
}

fn ok_count(s: &Side) -> String {
    format!("{}/{}", s.values.len(), s.planned())
}

pub fn verdict(c: &Cell) -> String {
    let base = match c.verdict() {
        Verdict::Pass => "pass",
        Verdict::Miss => "MISS",
        Verdict::NoData => "no data",
        Verdict::Reported => "reported",
    };
    match c.failures() {
        0 => base.to_string(),
        n => format!("{base} ({n} failed)"),
    }
}

fn ratio(c: &Cell) -> String {
    c.ratio().map_or("—".into(), |r| format!("{r:.3}"))
}

/// The ratio's 95 % bootstrap interval.
fn interval(c: &Cell) -> String {
    c.interval()
        .map_or("—".into(), |(lo, hi)| format!("{lo:.2}–{hi:.2}"))
}

/// The table printed at the end of `cargo xtask bench`.
pub fn terminal_table(a: &Analysis) -> String {
    let head = [
        "tool", "size", "metric", "C med", "Rust med", "Rust/C", "95% CI", "C rng", "Rust rng",
        "ok C", "ok R", "target", "result",
    ];
    let mut rows: Vec<Vec<String>> = vec![head.iter().map(|s| s.to_string()).collect()];
    for c in &a.cells {
        rows.push(vec![
            c.tool.label.to_string(),
            size(c.size),
            c.tool.metric.label().to_string(),
            median(&c.c),
            median(&c.rust),
            ratio(c),
            interval(c),
            rel_range(&c.c),
            rel_range(&c.rust),
            ok_count(&c.c),
            ok_count(&c.rust),
            c.tool.metric.target().describe(),
            verdict(c),
        ]);
    }
    let widths: Vec<usize> = (0..head.len())
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for (k, r) in rows.iter().enumerate() {
        let mut line = String::new();
        for (i, cell) in r.iter().enumerate() {
            let pad = widths[i] - cell.chars().count();
            // text columns left, numbers right
            if !(3..11).contains(&i) {
                line.push_str(cell);
                line.push_str(&" ".repeat(pad));
            } else {
                line.push_str(&" ".repeat(pad));
                line.push_str(cell);
            }
            line.push_str("  ");
        }
        out.push_str(line.trim_end());
        out.push('\n');
        if k == 0 {
            let total: usize = widths.iter().sum::<usize>() + 2 * (widths.len() - 1);
            out.push_str(&"-".repeat(total));
            out.push('\n');
        }
    }
    out
}

/// The same-binary check: in every cell with at least 4 C runs, the median of the C tool's
/// runs in one half of the rounds against the other (alternate pairs of rounds; an A/A
/// comparison at half the rounds, see `stats::split_half_ratio`). It
/// calibrates the verdicts: a target margin far below these differences cannot be shown met,
/// or missed, by this run.
pub fn self_noise_line(a: &Analysis) -> Option<String> {
    let mut devs = Vec::new();
    let (mut lat_cells, mut lat_beyond) = (0, 0);
    for c in a.group(Group::Tools) {
        let Some(r) = c.c_self_ratio() else {
            continue;
        };
        devs.push((r - 1.0).abs());
        if let Target::AtMost(t) = c.tool.metric.target() {
            lat_cells += 1;
            if r > t || r < 1.0 / t {
                lat_beyond += 1;
            }
        }
    }
    if devs.is_empty() {
        return None;
    }
    devs.sort_by(f64::total_cmp);
    let mut line = format!(
        "same-binary check: the C tool against itself (half the rounds against the other half, \
         cell by cell) differs by {:.1} % (median over {} cells; up to {:.1} %)",
        100.0 * stats::quantile(&devs, 0.5),
        devs.len(),
        100.0 * devs[devs.len() - 1],
    );
    if lat_cells > 0 {
        line.push_str(&format!(
            "; in {lat_beyond} of {lat_cells} latency cells C differs from itself by more than \
             the latency target's margin"
        ));
    }
    Some(line)
}

/// One line per target: how many cells meet it, and which miss.
pub fn target_lines(a: &Analysis) -> Vec<String> {
    let mut out = Vec::new();
    let tools = a.group(Group::Tools);
    let categories: [(&str, Vec<&Cell>); 4] = [
        (
            "latency",
            tools
                .iter()
                .copied()
                .filter(|c| c.tool.metric.is_latency())
                .collect(),
        ),
        (
            "bandwidth",
            tools
                .iter()
                .copied()
                .filter(|c| !c.tool.metric.is_latency())
                .collect(),
        ),
        ("block store IOPS", a.group(Group::Blockstore)),
        ("all-reduce bus bandwidth", a.group(Group::AllreduceBw)),
    ];
    for (what, cells) in categories {
        if cells.is_empty() {
            continue;
        }
        let target = cells[0].tool.metric.target().describe();
        let pass = cells
            .iter()
            .filter(|c| c.verdict() == Verdict::Pass)
            .count();
        let misses: Vec<String> = cells
            .iter()
            .filter(|c| c.verdict() != Verdict::Pass)
            .filter(|c| c.verdict() != Verdict::Reported)
            .map(|c| format!("{} {} ({})", c.tool.label, size(c.size), ratio(c)))
            .collect();
        let mut line = format!(
            "{what}: Rust/C {target} in every cell — {pass} of {} cells pass",
            cells.len()
        );
        if !misses.is_empty() {
            line.push_str(&format!("; not met: {}", misses.join(", ")));
            let clear: Vec<String> = cells
                .iter()
                .filter(|c| c.clear_miss())
                .map(|c| format!("{} {}", c.tool.label, size(c.size)))
                .collect();
            line.push_str(&format!(
                ". Misses whose 95 % interval lies wholly beyond the target (the runs' spread \
                 cannot explain them): {}",
                if clear.is_empty() {
                    "none".to_string()
                } else {
                    clear.join(", ")
                }
            ));
        }
        out.push(line);
    }
    out
}

/// The state of the investigation of missed latency targets (issue #4),
/// printed with every report that misses one. Findings, not tuning: the
/// numbers above are what the code does.
const WHAT_REMAINS: &str = "Under TCG, latency has a cliff that magnifies sub-microsecond \
differences: adding a busy wait after each completion to the raw-path read_lat loop (2 B) moved \
its t_min from 18.0 µs to 19.8 µs at +0.5 µs and to 25.0 µs at +1 µs, and ten calls of an empty \
non-inlined function there moved its median from ~19 µs to ~30 µs (every return is an indirect \
jump TCG must look up). The mechanism is rxe's per-QP task (rxe_task.c): a doorbell arriving \
while the task that wrote the completion is still running marks it ARMED and is served in the \
same pass; a later one queues work on the unbound rxe_wq and waits for a kworker to be \
scheduled. It is not halted vCPUs: a full bench with the guest booted idle=poll \
(--kernel-arg idle=poll) gave the same ratios. The atomics' raw control used to be as slow as \
the safe path: atomic_lat read each old value between the completion and the next post (perftest \
checks nothing) and rebuilt its ibv_send_wr each iteration; with the check moved to while the \
next operation is in flight and the request built once, the raw controls of reads and atomics \
match perftest. The safe paths (read_lat, atomic_lat re-post a PreparedSend) moved when they \
stopped building and returning a 104-byte Completion in that window: CompletionQueue::poll_one_into \
polls into the caller's WorkCompletion and returns only the buffers (an 8-round probe of the \
prepared read_lat: past the cliff in 6 of 8 runs with poll_one, 2 of 8 with poll_one_into, C 2 \
of 8). What they still add there is three atomic read-modify-writes (the claim's decrement, the \
send lock, the posting's increment; out-of-line helpers under TCG): three such operations added to \
the raw loop moved it past the cliff in 2 of 8 runs, yet a probe build that skipped the \
posting's count entirely made no measurable difference (prepared read_lat fast in 5 of 8 runs \
without it, 7 of 8 with it; C 6 of 8). atomic_lat still had work in the window: a \
read-modify-write on the prepared request's Arc to read each old value (PreparedSend::bytes now \
loads the count) and, for CAS, setting the next operands (now set while the operation before is \
in flight); with both gone the safe atomics went from 1.54-1.64x to 1.06-1.14x. In 9- and \
7-round runs the prepared reads and atomics pass in one run and miss in the other (within the \
cliff's flip); rc_pingpong and the per-request path (read_lat req, about a dozen calls in the \
window) missed at every small size in every run up to then. A ping-pong's window held a receive \
claim through the receive queue's table (lock and slot) where C only reads wr_id; the ping-pongs \
now re-post a PreparedRecv per buffer (one atomic decrement per claim), and an A/B probe in one \
boot (rc_pingpong 2 B, 23 paired rounds) put the new binary at 0.97x the old and 0.99x C; a \
16-round rc_pingpong bench then gave a pooled per-round ratio of 1.04 over all sizes (0.98 at \
2 B, up to 1.12 at 64 B), every cell's interval straddling 1.03: level at 2 B, a few per cent \
above elsewhere, not shown met. The ping-pongs now also receive into one buffer posted -r times, \
as the C tools (was one buffer per receive: 500x the memory at -s 65536). Four A/B probes in \
single boots (64 B, 3 000 iterations per run, 68 paired rounds, ABBA order) put the safe \
rc_pingpong at 1.040x ibv_rc_pingpong (95 % interval 1.006-1.074) and a build of the same loop on \
the raw path (post_send_raw, post_recv_raw, poll_raw; experiment only) at 1.003x (0.967-1.039, \
52 rounds); safe/raw 0.968-1.002 the other way round, i.e. the safe path costs about 3 % there, \
and a build without the watchdog thread changed nothing (1.03x C). What the safe loop added in its \
window was the prepared send's lock, its state check, the posting's count and the receive claim's \
count. PreparedSend::post now takes no lock: it reads the queue pair's state from one \
atomic word that every state change writes under the send lock, a refusal on that path gives \
its count back only if no state change overlapped it (re-checked under the lock; rxe queues a \
request it refuses before RTS), and each posting's count is taken ahead, after the previous \
posting's doorbell. The window now holds one atomic read-modify-write C does not have, the receive claim's \
decrement. An A/B probe in one boot (64 B, 3 000 iterations, 90 rounds of C, previous build, new \
build in rotated order) put it at 0.984x ibv_rc_pingpong (0.933-1.039) and 0.963x the previous \
build (0.904-1.027; previous/C 1.021); a 16-round rc_pingpong bench right after, on a host where \
C's own runs spread over 68-157 % of their median, read 1.14, 1.08, 1.30, 1.11 and 0.99 from 2 B \
to 64 KiB, every interval straddling 1.03 (0.83-1.86), while C against itself (half the rounds \
against the other half) differed by 11 % (median over the sizes, up to 25 %): within the runs' \
spread at every size, not shown met. The \
per-request and extended read_lat variants claim through the table and build their request in \
the window by design: they are the controls showing what the prepared path saves. Where a \
cell's 95 % interval straddles the target, its ratio is within the runs' spread. Also done: the data-path inlines of verbs.h are Rust (one \
call into the provider per post or poll, as in C), poll_one and PreparedSend::post are inlined, \
the doorbell rung before the slot bookkeeping, a Completion small enough to move without \
memcpy, TSC stamps as perftest's get_cycles, no PAUSE in the tools' busy loops. On real \
hardware compare the raw-path rows with the safe rows: that difference is the library's cost.";

/// The raw-path controls: for every tool with a `-raw` twin (`read_lat`,
/// `write_lat`, `send_lat`, the two atomics) and every size measured both through the safe
/// API and the unsafe raw path, the Rust safe/raw ratio. Near 1 means a
/// gap to C is not the safe layer's cost. `read_lat` also gets its
/// per-request (`post_send` each iteration, not a prepared request) and
/// extended-verbs twins.
pub fn control_lines(a: &Analysis) -> Vec<String> {
    let mut out = Vec::new();
    for tool in [
        "send_lat",
        "write_lat",
        "read_lat",
        "atomic_lat-cas",
        "atomic_lat-faa",
    ] {
        let twin = |safe: &Cell, suffix: &str| {
            let key = format!("{tool}-{suffix}");
            a.cells
                .iter()
                .find(|c| c.tool.key == key && c.size == safe.size)
        };
        for safe in a.cells.iter().filter(|c| c.tool.key == tool) {
            let Some(raw) = twin(safe, "raw") else {
                continue;
            };
            let (Some(s), Some(r)) = (safe.rust.summary.as_ref(), raw.rust.summary.as_ref()) else {
                continue;
            };
            let ext = twin(safe, "ext")
                .and_then(|c| c.rust.summary.as_ref())
                .map_or(String::new(), |e| {
                    format!(
                        "; extended verbs {:.2} µs, extended/legacy {:.3}",
                        e.median,
                        e.median / s.median
                    )
                });
            let req = twin(safe, "req")
                .and_then(|c| c.rust.summary.as_ref())
                .map_or(String::new(), |e| {
                    format!(
                        "; per-request posts {:.2} µs, per-request/prepared {:.3}",
                        e.median,
                        e.median / s.median
                    )
                });
            out.push(format!(
                "{tool} {}: Rust safe {:.2} µs, Rust raw {:.2} µs, safe/raw {:.3}; safe/C {}, raw/C {}{req}{ext}",
                size(safe.size),
                s.median,
                r.median,
                s.median / r.median,
                ratio(safe),
                ratio(raw)
            ));
        }
    }
    out
}

fn md_escape(s: &str) -> String {
    s.replace('|', "\\|")
}

/// `target/bench/report.md`: this run's results, its environment, every value.
pub fn markdown(plan: &Plan, a: &Analysis, env: &Env, png: Option<&str>) -> String {
    let mut m = String::new();
    let _ = writeln!(
        m,
        "# Benchmark: our Rust examples vs rdma-core's C tools (SoftRoCE, one VM)\n"
    );
    m.push_str(&body(plan, a, env, png, false));
    m
}

/// The top of the generated `docs/results/benchmarks.md`.
pub const GENERATED_NOTE: &str = "<!-- Generated by `cargo xtask bench` (written to \
target/bench/benchmarks.md; `cargo xtask bench --publish` copies it here). Do not edit: change \
the generator, xtask/src/bench/report.rs. -->";

/// The method: what is true of every run (the run's own facts are in the tables below it).
const METHOD: &str = "The deciding measurement is the deterministic instruction count of \
`cargo xtask instr` ([instructions.md](instructions.md)), quoted below. Wall clock inside a TCG \
VM varies between runs of the *same* C binary by far more than the targets' margins (the \
same-binary check under *Targets* says by how much in this run), so the wall-clock tables show \
trends, never verdicts; CI never gates on them. They are kept because latency and bandwidth are \
what users feel, and because a trend that survives this noise is real.

`cargo xtask bench` runs rdma-core's C tools and ours in one VM, adjacent, in alternating ABBA \
order over several rounds (`ibv_rc_pingpong`, `ib_write_lat`, `ib_write_bw`, `ib_send_lat`, \
`ib_read_lat`, `ib_atomic_lat` against `rc_pingpong`, `write_lat`, `write_bw`, `send_lat`, \
`read_lat`, `atomic_lat`), judges the Rust/C ratio of the medians against the targets \
(latency ≤ 1.03, bandwidth ≥ 0.97) with a percentile-bootstrap interval, and ends its targets \
with a same-binary check: in each cell the C tool's runs in half the rounds against those in \
the other half (alternate pairs of rounds, so both ABBA positions are in each half) — what \
run-to-run noise alone does to a ratio of medians in that run, the yardstick for every Rust/C \
verdict. Absolute numbers inside an emulated VM mean little; the ratios are the result.

The `raw` rows run the same binaries through `post_send_raw` / `post_recv_raw` / `poll_raw` \
(no ownership bookkeeping, the C tool's loop); `read_lat` and `atomic_lat` re-post one \
`PreparedSend` (as perftest reuses one `ibv_send_wr`); `read_lat req` builds and posts an \
owned-buffer `SendRequest` each iteration (`--per-request`), `read_lat ext` uses the extended \
verbs (`ibv_wr_*` / `ibv_start_poll`).

The workloads of issue #21 run in the same VM, each cell's two sides adjacent in the same ABBA \
order (`--tools blockstore,allreduce` selects only them): `blockstore` (server and one client, \
4 KiB blocks) at queue depth 1 and 16 against perftest's message rate with the same message \
size and send-queue depth (`ib_read_bw` / `ib_write_bw -s 4096 -t DEPTH`; reads are the \
client's `random:` phase with `--write-ratio 0`, writes its `mixed:` phase with \
`--write-ratio 1`; target ≥ 0.95); the ring `allreduce` of 3 ranks, its bus bandwidth \
(NCCL-tests definition) against `ib_write_bw` of one chunk (vector / ranks; target ≥ 0.8; \
with more ranks than vCPUs the ranks run with `--wait`, since a spinning rank takes the core \
rxe's kernel work needs); and \
a small all-reduce with twice as many ranks as the VM has vCPUs, blocking on completion events \
(`--wait`) against busy polling (Rust against Rust, no target). A workload run whose output \
lacks its `VERIFIED` line (every rank's, for the all-reduce) or that exits non-zero is a failed \
run, never a number.

Latency under TCG has a cliff that magnifies sub-microsecond differences. Its mechanism is \
rxe's per-QP task (`drivers/infiniband/sw/rxe/rxe_task.c`): a doorbell that arrives while the \
QP's task is still running is served in the same pass; one that arrives after the task went \
idle queues work on the unbound `rxe_wq` and waits for a kworker to be scheduled, many \
microseconds under TCG. A NIC has no such task; on hardware the instruction counts are the \
measure of the library's cost.";

/// The summary tables of `docs/results/instructions.md` (its first table under each `## ` heading that
/// starts with "Per operation" or "Event wait"), with their headings; None when it has none.
pub fn instruction_tables(instructions_md: &str) -> Option<String> {
    let mut out = String::new();
    let mut heading: Option<&str> = None;
    let mut taken = false;
    let mut in_table = false;
    for line in instructions_md.lines() {
        if let Some(h) = line.strip_prefix("## ") {
            heading = (h.starts_with("Per operation") || h.starts_with("Event wait")).then_some(h);
            taken = false;
            in_table = false;
            continue;
        }
        let Some(h) = heading else { continue };
        if taken && !in_table {
            continue;
        }
        if line.starts_with('|') {
            if !in_table {
                let _ = writeln!(out, "### {h}\n");
                in_table = true;
                taken = true;
            }
            let _ = writeln!(out, "{line}");
        } else if in_table {
            out.push('\n');
            in_table = false;
        }
    }
    if in_table {
        out.push('\n');
    }
    (!out.is_empty()).then_some(out)
}

/// `docs/results/benchmarks.md` (written to `target/bench/benchmarks.md`): a note that it is generated,
/// the method, the instruction tables quoted from `docs/results/instructions.md` (`instructions`: its
/// text, not re-measured) and this run's wall-clock tables, workloads included.
pub fn document(plan: &Plan, a: &Analysis, env: &Env, instructions: Option<&str>) -> String {
    let mut m = String::new();
    let _ = writeln!(m, "{GENERATED_NOTE}\n");
    let _ = writeln!(m, "# Benchmarks\n");
    let _ = writeln!(
        m,
        "*This file is generated by `cargo xtask bench` from its last run (`--publish` copies \
         it to docs/results/); the instruction tables are quoted from \
         [instructions.md](instructions.md), which `cargo xtask instr --publish` generates.*\n"
    );
    let _ = writeln!(m, "## Method\n\n{METHOD}\n");
    let _ = writeln!(m, "## Instructions per operation (deterministic)\n");
    match instructions.and_then(instruction_tables) {
        Some(t) => {
            let _ = writeln!(
                m,
                "Quoted from [instructions.md](instructions.md#instructions-per-operation-ours-against-c), \
                 where the method, the floors and where the instructions go are; not \
                 re-measured by the wall-clock run.\n"
            );
            m.push_str(&t);
        }
        None => {
            let _ = writeln!(
                m,
                "docs/results/instructions.md has no summary table when this was generated: run \
                 `cargo xtask instr --publish`, then `cargo xtask bench --reanalyze --publish`.\n"
            );
        }
    }
    let _ = writeln!(m, "# Wall clock (this run)\n");
    m.push_str(&body(plan, a, env, None, true));
    m
}

/// The run's sections, shared by the report and the document (`for_docs`: without the git
/// commit and the investigation notes, which are the report's).
fn body(plan: &Plan, a: &Analysis, env: &Env, png: Option<&str>, for_docs: bool) -> String {
    let mut m = String::new();
    let _ = writeln!(
        m,
        "> **Read the ratios, not the numbers.** Everything ran in one QEMU VM under TCG \
         (an emulated CPU, no KVM) on the software RoCE device rxe0, server and client in the \
         same VM over rxe's loopback. Absolute latencies and bandwidths here say little about \
         real hardware; what is meaningful is Rust/C measured side by side on the same emulated \
         machine. How much the same C binary varies between rounds of this run is measured \
         under *Targets* (same-binary check): a target margin far below it can be shown neither \
         met nor missed by this run.\n"
    );
    if let Some(w) = env.noise_warning() {
        let _ = writeln!(m, "> **Warning:** {w}.\n");
    }
    if png.is_some() {
        let _ = writeln!(m, "![latency and bandwidth](latency_bandwidth.png)\n");
    }
    if !a.group(Group::Tools).is_empty() {
        let _ = writeln!(m, "## Results\n");
        let _ = writeln!(
            m,
            "Median over {} round(s) for each implementation; Rust/C is the ratio of the medians; \
             95 % CI is its percentile-bootstrap interval (both sides resampled, fixed seed): where it \
             straddles the target, the runs' spread alone could put the cell on either side. \
             Spread is min–max over the rounds (with the range as a percentage of the median). \
             Latency is perftest's `t_typical` (µs) or `ibv_rc_pingpong`'s `usec/iter`; bandwidth is \
             perftest's `BW average` (MB/s).\n",
            plan.rounds
        );
        let _ = writeln!(
            m,
            "| tool | size | metric | iters | C median | Rust median | Rust/C | 95 % CI | C min–max | Rust min–max | runs ok (C · Rust) | target | result |"
        );
        let _ = writeln!(
            m,
            "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"
        );
        for c in a.group(Group::Tools) {
            let res = match c.verdict() {
                Verdict::Pass => verdict(c),
                _ => format!("**{}**", verdict(c)),
            };
            let _ = writeln!(
                m,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} ({}) | {} ({}) | {} · {} | {} | {} |",
                c.tool.label,
                size(c.size),
                c.tool.metric.label(),
                c.iters,
                median(&c.c),
                median(&c.rust),
                ratio(c),
                interval(c),
                range(&c.c),
                rel_range(&c.c),
                range(&c.rust),
                rel_range(&c.rust),
                ok_count(&c.c),
                ok_count(&c.rust),
                c.tool.metric.target().describe(),
                res
            );
        }
    }
    workload_tables(&mut m, plan, a);
    let _ = writeln!(m, "\n## Targets\n");
    for l in target_lines(a) {
        let _ = writeln!(m, "- {l}");
    }
    if let Some(l) = self_noise_line(a) {
        let _ = writeln!(m, "- {l}");
    }
    let failures = a.all_failures();
    let _ = writeln!(
        m,
        "- runs: {} planned, {} recorded, {} failed{}",
        a.runs_planned,
        a.runs_recorded,
        failures.len(),
        if failures.is_empty() {
            ""
        } else {
            " (listed below; a failed run is not in any median)"
        }
    );
    let misses = a
        .cells
        .iter()
        .filter(|c| matches!(c.verdict(), Verdict::Miss | Verdict::NoData))
        .count();
    let _ = writeln!(
        m,
        "\n{}\n",
        if misses == 0 && failures.is_empty() {
            "**All targets met, no failed runs.**".to_string()
        } else {
            format!(
                "**{misses} of {} cells do not meet their target; {} run(s) failed.** \
                 Nothing was tuned to these numbers and no run was dropped: every successful \
                 measured run is in the medians.",
                a.cells.len(),
                failures.len()
            )
        }
    );
    let control = control_lines(a);
    if !control.is_empty() {
        let _ = writeln!(m, "## Safe layer vs raw path, legacy vs extended verbs\n");
        let _ = writeln!(
            m,
            "`read_lat raw` is the same Rust binary posting with `post_send_raw` and polling \
             with `poll_raw` (no ownership bookkeeping, no checks), the loop of the C tool. \
             A safe/raw ratio near 1 while raw/C stays high means the gap to C is not spent in \
             the library's safe layer. `read_lat ext` is the same tool on the extended verbs \
             (`ibv_create_qp_ex` + `ibv_wr_*` posting, `ibv_create_cq_ex` + start/next/end \
             polling; on rxe one completion per poll cycle, see the provider quirk).\n"
        );
        for l in control {
            let _ = writeln!(m, "- {l}");
        }
        let _ = writeln!(m);
    }
    if misses > 0 && !for_docs {
        let _ = writeln!(
            m,
            "## What remains, and why
"
        );
        let _ = writeln!(m, "{WHAT_REMAINS}\n");
    }
    if !failures.is_empty() {
        let _ = writeln!(m, "## Failed runs\n");
        let _ = writeln!(m, "| # | run | what happened | raw output |");
        let _ = writeln!(m, "|---:|---|---|---|");
        for (first, last, n, reason) in super::analysis::grouped_failures(a) {
            let raw = |f: &super::analysis::Failure| {
                let (s, c) = super::runner::raw_paths(std::path::Path::new("raw"), &f.spec);
                format!("`{}`, `{}`", c.display(), s.display())
            };
            let warm = |f: &super::analysis::Failure| if f.spec.warmup { " (warm-up)" } else { "" };
            if n == 1 {
                let _ = writeln!(
                    m,
                    "| {} | {}{} | {} | {} |",
                    first.spec.seq,
                    first.spec.id,
                    warm(first),
                    md_escape(reason),
                    raw(first)
                );
            } else {
                let _ = writeln!(
                    m,
                    "| {}–{} | {n} runs: {} … {} | {} | — |",
                    first.spec.seq,
                    last.spec.seq,
                    first.spec.id,
                    last.spec.id,
                    md_escape(reason)
                );
            }
        }
        let _ = writeln!(m);
    }
    let _ = writeln!(m, "## How it ran\n");
    let _ = writeln!(
        m,
        "- One VM, device rxe0, GID index 1 (`-g 1` / `-x 1`), server and client in the VM, the \
         client pointed at `localhost`; each run has its own TCP port and the client starts once \
         the server's port listens.\n\
         - Order: first one short warm-up pair per tool (not counted), then {} round(s) over \
         every (tool, size). In each cell the C and Rust runs are adjacent, and their order \
         alternates from cell to cell and flips every round, so the sequence reads C R · R C · \
         C R · … (ABBA) and slow drift of the host affects both sides alike.\n\
         - The same arguments and iteration counts for both sides (perftest spells atomic types \
         `CMP_AND_SWAP`/`FETCH_AND_ADD`, our `atomic_lat` `CAS`/`FAA`). Iterations: {}.\n\
         - Bandwidth: where perftest's `MsgRate[Mpps]` (6 decimals) is finer than its \
         2-decimal `BW average` and agrees with it, BW is recomputed from it (same measurement, \
         BW = MsgRate · size · 10⁶ / 2²⁰), so small-message ratios are not rounding noise.\n\
         - Per-run limit {} s (`--run-timeout`); stragglers are killed and the run is recorded as \
         failed.",
        plan.rounds,
        iters_summary(plan),
        plan.run_timeout_secs
    );
    let _ = writeln!(m, "\n## Environment\n");
    let rows: Vec<(&str, String)> = vec![
        ("date", env.date.clone()),
        ("command", format!("`{}`", env.command)),
        ("git", env.git.clone()),
        ("VM kernel", env.vm_kernel.clone()),
        (
            "VM",
            format!(
                "QEMU {} (TCG), {} vCPUs, {} RAM; rxe0 GID[1] {}; extra kernel arguments: {}",
                env.qemu,
                env.vm_smp,
                env.vm_mem,
                env.vm_gid1,
                if env.vm_kernel_args.is_empty() {
                    "none (idle vCPUs halt)".to_string()
                } else {
                    format!("`{}`", env.vm_kernel_args.join(" "))
                }
            ),
        ),
        ("rdma-core", env.rdma_core.clone()),
        ("perftest", env.perftest.clone()),
        ("host kernel", env.host_kernel.clone()),
        ("host CPU", format!("{} × {}", env.host_cpus, env.host_cpu)),
        (
            "host load (1/5/15 min)",
            format!("before {} · after {}", env.load_before, env.load_after),
        ),
        (
            "other QEMU VMs on the host",
            format!(
                "{} before, {} after (they compete for the same cores: expect more noise)",
                env.other_vms_before, env.other_vms_after
            ),
        ),
        ("rounds", plan.rounds.to_string()),
        (
            "sizes",
            plan.sizes
                .iter()
                .map(|s| size(*s))
                .collect::<Vec<_>>()
                .join(", "),
        ),
        (
            "time",
            format!(
                "VM {:.0} s wall (clients ran {:.0} s in total)",
                env.vm_secs, a.client_secs
            ),
        ),
    ];
    let _ = writeln!(m, "| | |\n|---|---|");
    for (k, v) in rows {
        if for_docs && k == "git" {
            continue;
        }
        let _ = writeln!(m, "| {k} | {} |", md_escape(&v));
    }
    let _ = writeln!(m, "\n## Every measured value (round order)\n");
    let _ = writeln!(m, "| tool | size | C | Rust |\n|---|---:|---|---|");
    for c in &a.cells {
        let list = |s: &Side| {
            let mut v: Vec<String> = s.values.iter().map(|x| num(*x)).collect();
            v.extend(std::iter::repeat_n("failed".to_string(), s.failures.len()));
            v.join(", ")
        };
        let _ = writeln!(
            m,
            "| {} | {} | {} | {} |",
            c.tool.label,
            size(c.size),
            list(&c.c),
            list(&c.rust)
        );
    }
    let _ = writeln!(
        m,
        "\nRaw outputs of every run (server and client): `target/bench/raw/`; the plan with the \
         exact command lines: `target/bench/plan.json`; per-run exit statuses and timings: \
         `target/bench/results.jsonl`. `cargo xtask bench --reanalyze` rebuilds this report \
         from them."
    );
    m
}

/// How a workload cell is described in its table.
fn workload_cell(plan: &Plan, c: &Cell) -> String {
    match c.tool.workload() {
        Some(Workload::BlockRead { depth }) => format!("read, depth {depth}"),
        Some(Workload::BlockWrite { depth }) => format!("write, depth {depth}"),
        Some(Workload::AllreduceBw) => format!(
            "{} ranks, {} floats ({}), chunk {}",
            plan::ALLREDUCE_RANKS,
            plan::ALLREDUCE_FLOATS,
            size(plan::ALLREDUCE_FLOATS * 4),
            size(c.size)
        ),
        Some(Workload::AllreduceWait) => format!(
            "{} ranks on {} vCPUs, {} floats",
            plan::wait_ranks(plan.vm_cpus),
            plan.vm_cpus,
            c.size / 4
        ),
        None => c.tool.label.to_string(),
    }
}

/// The workload tables (issue #21): block store against perftest's message rate, all-reduce
/// bus bandwidth against `ib_write_bw`, `--wait` against busy polling.
fn workload_tables(m: &mut String, plan: &Plan, a: &Analysis) {
    let tables = [
        (
            Group::Blockstore,
            "Block store: IOPS against perftest's message rate",
            "`blockstore` IOPS (one server, one client, 4 KiB blocks) against the message rate \
             of `ib_read_bw` (reads) / `ib_write_bw` (writes) with `-s 4096 -t DEPTH` and the \
             same number of operations; medians over the rounds.",
            "C ceiling (IOPS)",
            "blockstore (IOPS)",
        ),
        (
            Group::AllreduceBw,
            "All-reduce: bus bandwidth against ib_write_bw of one chunk",
            "The ring all-reduce's bus bandwidth (NCCL-tests: algbw · 2(N−1)/N), converted to \
             perftest's MB/s (2²⁰ B), against `ib_write_bw`'s `BW average` at the chunk size.",
            "ib_write_bw (MB/s)",
            "busbw (MB/s)",
        ),
        (
            Group::AllreduceWait,
            "All-reduce latency: `--wait` against busy polling, ranks outnumbering cores",
            "Median iteration of a small all-reduce; the ratio is wait/busy (below 1: blocking \
             on completion events is faster when every busy rank steals a core another needs). \
             Rust against Rust: no C ceiling and no target.",
            "busy poll (µs)",
            "--wait (µs)",
        ),
    ];
    let any = tables.iter().any(|t| !a.group(t.0).is_empty());
    if !any {
        return;
    }
    let _ = writeln!(m, "\n## Workloads (issue #21)\n");
    for (group, title, what, base, ours) in tables {
        let cells = a.group(group);
        if cells.is_empty() {
            continue;
        }
        let _ = writeln!(m, "### {title}\n\n{what}\n");
        let _ = writeln!(
            m,
            "| cell | iters | {base} | {ours} | ratio | 95 % CI | {base} min–max | {ours} min–max | runs ok | target | result |"
        );
        let _ = writeln!(m, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|");
        for c in cells {
            let res = match c.verdict() {
                Verdict::Pass | Verdict::Reported => verdict(c),
                _ => format!("**{}**", verdict(c)),
            };
            let _ = writeln!(
                m,
                "| {} | {} | {} | {} | {} | {} | {} ({}) | {} ({}) | {} · {} | {} | {} |",
                workload_cell(plan, c),
                c.iters,
                median(&c.c),
                median(&c.rust),
                ratio(c),
                interval(c),
                range(&c.c),
                rel_range(&c.c),
                range(&c.rust),
                rel_range(&c.rust),
                ok_count(&c.c),
                ok_count(&c.rust),
                c.tool.metric.target().describe(),
                res
            );
        }
        let _ = writeln!(m);
    }
}

fn iters_summary(plan: &Plan) -> String {
    if let Some(n) = plan.iters_override {
        return format!("{n} per run (`--iters`)");
    }
    let mut seen: Vec<(String, u64, u64)> = Vec::new();
    for r in plan.runs.iter().filter(|r| !r.warmup) {
        let key = r.tool.clone();
        if !seen.iter().any(|(k, s, _)| *k == key && *s == r.size) {
            seen.push((key, r.size, r.iters));
        }
    }
    let mut parts: Vec<String> = Vec::new();
    for metric in [
        Metric::PingpongLatency,
        Metric::Latency,
        Metric::Bandwidth,
        Metric::Iops,
        Metric::BusBandwidth,
        Metric::AllreduceLatency,
    ] {
        let mut small = None;
        let mut large = None;
        for (k, s, n) in &seen {
            if super::plan::tool(k).map(|t| t.metric) != Some(metric) {
                continue;
            }
            if *s >= 16384 {
                large = Some(*n);
            } else {
                small = Some(*n);
            }
        }
        let name = match metric {
            Metric::PingpongLatency => "pingpong",
            Metric::Latency => "latency tools",
            Metric::Bandwidth => "bandwidth tools",
            Metric::Iops => "block store (operations)",
            Metric::BusBandwidth => "all-reduce bandwidth",
            Metric::AllreduceLatency => "all-reduce latency",
        };
        match (small, large) {
            (Some(a), Some(b)) if a != b => {
                parts.push(format!("{name} {a} (< 16 KiB) / {b} (≥ 16 KiB)"))
            }
            (Some(a), _) | (None, Some(a)) => parts.push(format!("{name} {a}")),
            _ => {}
        }
    }
    parts.join("; ")
}

#[cfg(test)]
mod tests {
    use super::super::analysis::analyze;
    use super::super::plan::{schedule, select_tools, Programs, Settings};
    use super::*;

    const INSTR: &str = "# Instructions per operation: ours against C

Generated by `cargo xtask instr`. Method: …

## Per operation, 16 queue pairs on one CQ, depth 1

| path | post | per op |
|---|---:|---:|
| C | 257 | 289 |
| raw | 262 | 298 |

Reproducibility: …

### Why the targets are missed

| path | per op | floor |
|---|---:|---:|
| raw | 298 | 296 |

## Event wait, one queue pair: post, `get_event` + re-arm + ack, poll

| path | event wait |
|---|---:|
| C | 900 |

## Per queue pair: create + connect, teardown

| what | C |
|---|---:|
| create | 1 |
";

    #[test]
    fn instruction_summary_tables_are_quoted() {
        let t = instruction_tables(INSTR).unwrap();
        assert!(t.starts_with("### Per operation, 16 queue pairs on one CQ, depth 1\n\n| path |"));
        assert!(t.contains("| raw | 262 | 298 |"));
        assert!(t.contains("### Event wait, one queue pair"));
        assert!(t.contains("| C | 900 |"));
        // only the first table of a summary section, and no other section
        assert!(!t.contains("floor"), "{t}");
        assert!(!t.contains("create"), "{t}");
        assert_eq!(instruction_tables("# nothing\n\n| a |\n"), None);
    }

    /// The generated document: marked generated at its top, the method, the instruction
    /// tables, the workload tables (all cells planned, none run here), no commit hash.
    #[test]
    fn generated_document() {
        let tools = select_tools(Some(&[
            "write_bw".into(),
            "blockstore".into(),
            "allreduce".into(),
        ]))
        .unwrap();
        let runs = schedule(
            &Settings {
                tools: &tools,
                sizes: &[4096],
                rounds: 2,
                iters: None,
                quick: false,
                port_base: 20000,
                vm_cpus: 2,
            },
            &Programs::default(),
        );
        let plan = Plan {
            rounds: 2,
            sizes: vec![4096],
            quick: false,
            iters_override: None,
            run_timeout_secs: 60,
            deadline_secs: None,
            raw_dir: "raw".into(),
            results: "results.jsonl".into(),
            vm_env: "vm-env.json".into(),
            runs,
            vm_cpus: 2,
        };
        let a = analyze(&plan, &[]);
        let env = Env {
            git: "abc1234 + uncommitted changes".into(),
            ..Env::default()
        };
        let d = document(&plan, &a, &env, Some(INSTR));
        assert!(d.starts_with(GENERATED_NOTE), "{}", &d[..200]);
        assert!(d.contains("## Method\n\nThe deciding measurement"));
        assert!(d.contains("| raw | 262 | 298 |"));
        assert!(d.contains("## Workloads (issue #21)"));
        assert!(d.contains("| read, depth 1 | 1000 |"));
        assert!(d.contains("| write, depth 16 | 1000 |"));
        assert!(d.contains("| 3 ranks, 49152 floats (192 KiB), chunk 64 KiB | 50 |"));
        assert!(d.contains("| 4 ranks on 2 vCPUs, 1024 floats | 30 |"));
        assert!(d.contains("| write_bw | 4 KiB |"));
        assert!(!d.contains("abc1234"), "no commit in the document");
        assert!(markdown(&plan, &a, &env, None).contains("abc1234"));
        // without instructions.md's tables it says how to get them
        let d = document(&plan, &a, &env, None);
        assert!(d.contains("run `cargo xtask instr --publish`"));
        // a cell without a target is reported, never a miss
        let wait = a
            .cells
            .iter()
            .find(|c| c.tool.key == "allreduce-wait")
            .unwrap();
        assert_eq!(wait.tool.metric.target().describe(), "—");
    }
}
