//! What to run: the tool pairs, their command lines, iteration counts and the ABBA schedule.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};

/// The device and GID index in the VM (rxe0 on eth0; GID 1 is `::ffff:10.0.2.15`).
pub const DEVICE: &str = "rxe0";
pub const GID_INDEX: &str = "1";
/// The client connects to the server in the same VM.
pub const SERVER_HOST: &str = "localhost";
/// The workloads' clients and ranks connect to this address (their examples take an IP).
pub const WORKLOAD_HOST: &str = "127.0.0.1";
/// Block size of the block store (fixed by the example) and of its C ceiling's messages.
pub const BLOCK_SIZE: u64 = 4096;
/// Blocks the block store serves in a bench run: small, so the client's full sweep is short.
pub const BENCH_BLOCKS: u64 = 256;
/// Ranks of the all-reduce bandwidth cell (all in the one VM).
pub const ALLREDUCE_RANKS: u64 = 3;
/// Floats of the all-reduce bandwidth cell's vector: a 64 KiB chunk per rank.
pub const ALLREDUCE_FLOATS: u64 = ALLREDUCE_RANKS * 16384;
/// Floats of the small all-reduce whose latency `--wait` and busy polling are compared.
pub const SMALL_ALLREDUCE_FLOATS: u64 = 1024;

/// Which implementation a run uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Impl {
    C,
    Rust,
}

impl Impl {
    pub fn name(self) -> &'static str {
        match self {
            Impl::C => "C",
            Impl::Rust => "Rust",
        }
    }

    fn file_tag(self) -> &'static str {
        match self {
            Impl::C => "c",
            Impl::Rust => "rust",
        }
    }

    fn other(self) -> Impl {
        match self {
            Impl::C => Impl::Rust,
            Impl::Rust => Impl::C,
        }
    }
}

/// What a tool measures and which number of its output we take.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Metric {
    /// perftest latency table: `t_typical[usec]`.
    Latency,
    /// `ibv_rc_pingpong`: `usec/iter` (one round trip).
    PingpongLatency,
    /// perftest bandwidth table: `BW average[MB/sec]`.
    Bandwidth,
    /// Operations per second: the block store's IOPS against perftest's `MsgRate[Mpps]` · 10⁶.
    Iops,
    /// MB/s (2²⁰ B): the all-reduce's bus bandwidth against perftest's `BW average[MB/sec]`.
    BusBandwidth,
    /// µs: the all-reduce's median iteration, `--wait` against busy polling (Rust vs Rust).
    AllreduceLatency,
}

impl Metric {
    pub fn is_latency(self) -> bool {
        matches!(
            self,
            Metric::Latency | Metric::PingpongLatency | Metric::AllreduceLatency
        )
    }

    /// Column heading in the report.
    pub fn label(self) -> &'static str {
        match self {
            Metric::Latency => "t_typical µs",
            Metric::PingpongLatency => "µs/iter",
            Metric::Bandwidth => "BW avg MB/s",
            Metric::Iops => "IOPS",
            Metric::BusBandwidth => "busbw MB/s",
            Metric::AllreduceLatency => "median µs",
        }
    }

    /// The target for Rust/C of the medians (issue #21 for the workloads: the block store at
    /// 0.95 of perftest's message rate, the all-reduce's bus bandwidth at 0.8 of `ib_write_bw`;
    /// `--wait` against busy polling has no target, it is reported).
    pub fn target(self) -> Target {
        match self {
            Metric::Iops => Target::AtLeast(0.95),
            Metric::BusBandwidth => Target::AtLeast(0.8),
            Metric::AllreduceLatency => Target::Report,
            m if m.is_latency() => Target::AtMost(1.03),
            _ => Target::AtLeast(0.97),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Target {
    AtMost(f64),
    AtLeast(f64),
    /// No target: the ratio is reported, never judged.
    Report,
}

impl Target {
    pub fn met(self, ratio: f64) -> bool {
        match self {
            Target::AtMost(t) => ratio <= t,
            Target::AtLeast(t) => ratio >= t,
            Target::Report => true,
        }
    }

    pub fn describe(self) -> String {
        match self {
            Target::AtMost(t) => format!("≤ {t:.2}"),
            Target::AtLeast(t) => format!("≥ {t:.2}"),
            Target::Report => "—".into(),
        }
    }
}

/// Command-line style of a tool pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Style {
    /// `ibv_rc_pingpong -d DEV -g GIDX -s SIZE -n ITERS -p PORT [host]`
    Pingpong,
    /// perftest: `-d DEV -x GIDX [-s SIZE] -n ITERS -p PORT [host]`
    Perftest,
    /// One of issue #21's workloads: each side's command line is its own (see [`Workload`]).
    Workload(Workload),
}

/// The workload cells of `cargo xtask bench` (issue #21), and the table each belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    /// `blockstore client --write-ratio 0` (its `random:` line) at queue depth `depth`
    /// against `ib_read_bw -s 4096 -t depth`.
    BlockRead { depth: u32 },
    /// `blockstore client --write-ratio 1` (its `mixed:` line) against `ib_write_bw`.
    BlockWrite { depth: u32 },
    /// 3-rank `allreduce` bus bandwidth against `ib_write_bw` of one chunk (vector / ranks).
    AllreduceBw,
    /// A small `allreduce` with twice as many ranks as the VM has vCPUs: busy polling
    /// (the "C" side of the cell) against `--wait` (the "Rust" side).
    AllreduceWait,
}

/// Which table of the report a tool's cells go to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Group {
    /// Our example tools against rdma-core's.
    Tools,
    Blockstore,
    AllreduceBw,
    AllreduceWait,
}

/// One pair of tools: rdma-core's C program and our example with the same options.
#[derive(Debug, Clone, Copy)]
pub struct Tool {
    /// File-safe key, also what `--tools` selects (`atomic_lat` selects both atomics).
    pub key: &'static str,
    /// Shown in the report.
    pub label: &'static str,
    pub c_program: &'static str,
    pub example: &'static str,
    pub metric: Metric,
    style: Style,
    /// Extra arguments of each side (perftest spells the atomic types out, our tool abbreviates).
    c_args: &'static [&'static str],
    rust_args: &'static [&'static str],
    /// Message size fixed by the operation (atomics: 8 B); no `-s` is passed then.
    pub fixed_size: Option<u64>,
    /// Part of the default selection.
    default: bool,
}

pub const TOOLS: &[Tool] = &[
    Tool {
        key: "rc_pingpong",
        label: "rc_pingpong",
        c_program: "ibv_rc_pingpong",
        example: "rc_pingpong",
        metric: Metric::PingpongLatency,
        style: Style::Pingpong,
        c_args: &[],
        rust_args: &[],
        fixed_size: None,
        default: true,
    },
    perftest(
        "write_lat",
        "write_lat",
        "ib_write_lat",
        Metric::Latency,
        true,
    ),
    perftest(
        "write_bw",
        "write_bw",
        "ib_write_bw",
        Metric::Bandwidth,
        true,
    ),
    perftest("send_lat", "send_lat", "ib_send_lat", Metric::Latency, true),
    raw_control(
        "write_lat-raw",
        "write_lat raw",
        "write_lat",
        "ib_write_lat",
    ),
    raw_control("send_lat-raw", "send_lat raw", "send_lat", "ib_send_lat"),
    perftest("read_lat", "read_lat", "ib_read_lat", Metric::Latency, true),
    raw_control("read_lat-raw", "read_lat raw", "read_lat", "ib_read_lat"),
    // read_lat re-posts a prepared request (PreparedSend); this twin posts
    // a new owned-buffer request each iteration (post_send).
    Tool {
        key: "read_lat-req",
        label: "read_lat req",
        rust_args: &["--per-request"],
        ..perftest("", "read_lat", "ib_read_lat", Metric::Latency, true)
    },
    // Legacy vs extended verbs: the same tool through ibv_create_qp_ex /
    // ibv_wr_* and ibv_create_cq_ex / start-next-end polling.
    Tool {
        key: "read_lat-ext",
        label: "read_lat ext",
        rust_args: &["--extended"],
        ..perftest("", "read_lat", "ib_read_lat", Metric::Latency, true)
    },
    Tool {
        key: "atomic_lat-cas",
        label: "atomic_lat CAS",
        c_args: &["-A", "CMP_AND_SWAP"],
        rust_args: &["-A", "CAS"],
        fixed_size: Some(8),
        ..perftest("", "atomic_lat", "ib_atomic_lat", Metric::Latency, true)
    },
    Tool {
        key: "atomic_lat-faa",
        label: "atomic_lat FAA",
        c_args: &["-A", "FETCH_AND_ADD"],
        rust_args: &["-A", "FAA"],
        fixed_size: Some(8),
        ..perftest("", "atomic_lat", "ib_atomic_lat", Metric::Latency, true)
    },
    // The atomics through the unsafe raw path: controls, as the raw rows above.
    Tool {
        key: "atomic_lat-cas-raw",
        label: "atomic CAS raw",
        c_args: &["-A", "CMP_AND_SWAP"],
        rust_args: &["-A", "CAS", "--raw"],
        fixed_size: Some(8),
        ..perftest("", "atomic_lat", "ib_atomic_lat", Metric::Latency, true)
    },
    Tool {
        key: "atomic_lat-faa-raw",
        label: "atomic FAA raw",
        c_args: &["-A", "FETCH_AND_ADD"],
        rust_args: &["-A", "FAA", "--raw"],
        fixed_size: Some(8),
        ..perftest("", "atomic_lat", "ib_atomic_lat", Metric::Latency, true)
    },
    perftest("send_bw", "send_bw", "ib_send_bw", Metric::Bandwidth, false),
    perftest("read_bw", "read_bw", "ib_read_bw", Metric::Bandwidth, false),
    workload(
        "blockstore-read-q1",
        "blockstore read q1",
        "ib_read_bw",
        "blockstore",
        Workload::BlockRead { depth: 1 },
    ),
    workload(
        "blockstore-read-q16",
        "blockstore read q16",
        "ib_read_bw",
        "blockstore",
        Workload::BlockRead { depth: 16 },
    ),
    workload(
        "blockstore-write-q1",
        "blockstore write q1",
        "ib_write_bw",
        "blockstore",
        Workload::BlockWrite { depth: 1 },
    ),
    workload(
        "blockstore-write-q16",
        "blockstore write q16",
        "ib_write_bw",
        "blockstore",
        Workload::BlockWrite { depth: 16 },
    ),
    workload(
        "allreduce-busbw",
        "allreduce busbw",
        "ib_write_bw",
        "allreduce",
        Workload::AllreduceBw,
    ),
    // both sides are the Rust example: no C program
    workload(
        "allreduce-wait",
        "allreduce wait/busy",
        "",
        "allreduce",
        Workload::AllreduceWait,
    ),
];

/// A workload cell (issue #21), in the default selection (alone: `--tools
/// blockstore,allreduce` or the keys).
const fn workload(
    key: &'static str,
    label: &'static str,
    c_program: &'static str,
    example: &'static str,
    w: Workload,
) -> Tool {
    let (metric, size) = match w {
        Workload::BlockRead { .. } | Workload::BlockWrite { .. } => (Metric::Iops, BLOCK_SIZE),
        Workload::AllreduceBw => (Metric::BusBandwidth, ALLREDUCE_FLOATS * 4 / ALLREDUCE_RANKS),
        Workload::AllreduceWait => (Metric::AllreduceLatency, SMALL_ALLREDUCE_FLOATS * 4),
    };
    Tool {
        key,
        label,
        c_program,
        example,
        metric,
        style: Style::Workload(w),
        c_args: &[],
        rust_args: &[],
        fixed_size: Some(size),
        default: true,
    }
}

/// A control: the latency tool `example` through the unsafe raw path
/// (`--raw`). Safe ≈ raw means a gap to C is not the safe layer's
/// per-operation cost.
const fn raw_control(
    key: &'static str,
    label: &'static str,
    example: &'static str,
    c_program: &'static str,
) -> Tool {
    Tool {
        key,
        label,
        rust_args: &["--raw"],
        ..perftest("", example, c_program, Metric::Latency, true)
    }
}

const fn perftest(
    key: &'static str,
    example: &'static str,
    c_program: &'static str,
    metric: Metric,
    default: bool,
) -> Tool {
    Tool {
        key,
        label: key,
        c_program,
        example,
        metric,
        style: Style::Perftest,
        c_args: &[],
        rust_args: &[],
        fixed_size: None,
        default,
    }
}

pub fn tool(key: &str) -> Option<&'static Tool> {
    TOOLS.iter().find(|t| t.key == key)
}

impl Tool {
    pub fn workload(&self) -> Option<Workload> {
        match self.style {
            Style::Workload(w) => Some(w),
            _ => None,
        }
    }

    pub fn group(&self) -> Group {
        match self.workload() {
            None => Group::Tools,
            Some(Workload::BlockRead { .. } | Workload::BlockWrite { .. }) => Group::Blockstore,
            Some(Workload::AllreduceBw) => Group::AllreduceBw,
            Some(Workload::AllreduceWait) => Group::AllreduceWait,
        }
    }

    /// The program of the "C" side: the C tool, or for a Rust-vs-Rust cell our example.
    pub fn baseline_is_rust(&self) -> bool {
        self.c_program.is_empty()
    }

    /// How the two sides are called in reports.
    pub fn side_names(&self) -> (&'static str, &'static str) {
        match self.workload() {
            Some(Workload::AllreduceWait) => ("busy poll", "--wait"),
            _ => ("C", "Rust"),
        }
    }
}

/// Ranks of the `--wait` cell: twice the VM's vCPUs, so ranks outnumber cores.
pub fn wait_ranks(vm_cpus: u32) -> u64 {
    2 * u64::from(vm_cpus.max(1))
}

/// The tools `--tools` names (keys or example names), or the default set; in table order.
pub fn select_tools(names: Option<&[String]>) -> Result<Vec<&'static Tool>> {
    let Some(names) = names else {
        return Ok(TOOLS.iter().filter(|t| t.default).collect());
    };
    for n in names {
        if !TOOLS.iter().any(|t| t.key == n || t.example == n) {
            let known: Vec<&str> = TOOLS.iter().map(|t| t.key).collect();
            bail!("unknown tool `{n}` (known: {})", known.join(", "));
        }
    }
    Ok(TOOLS
        .iter()
        .filter(|t| names.iter().any(|n| t.key == n || t.example == n))
        .collect())
}

/// Iterations per run when `--iters` is not given: about a second per run under TCG on an idle
/// host (pingpong ~0.2 ms/iter at small sizes, ~4 ms at 64 KiB; write_bw ~35 MB/s at 64 KiB),
/// so process start-up (~2 s a run) dominates and the whole bench stays near 15 min. A loaded
/// host stretches the latency runs most: their mean goes to milliseconds with vCPU stalls.
pub fn default_iters(metric: Metric, size: u64, quick: bool) -> u64 {
    // the workloads: a block-store run also sweeps its blocks and an all-reduce iteration
    // moves 2·(N−1) chunks per rank, so fewer operations give about the same run time
    match metric {
        Metric::Iops => return if quick { 200 } else { 1000 },
        Metric::BusBandwidth => return if quick { 10 } else { 50 },
        // busy-polling ranks that outnumber the vCPUs took ~170 ms an iteration in the VM
        Metric::AllreduceLatency => return if quick { 10 } else { 30 },
        _ => {}
    }
    if quick {
        return 200;
    }
    match (metric, size >= 16384) {
        (Metric::Bandwidth, false) => 2000,
        (Metric::Bandwidth, true) => 500,
        (_, false) => 1000,
        (_, true) => 200,
    }
}

/// One run of one tool pair's side: a server, then a client to it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RunSpec {
    /// Position in the schedule (0-based); also names the raw files.
    pub seq: usize,
    /// e.g. `r2-write_lat-4096-rust`; `w-…` for warm-ups.
    pub id: String,
    pub tool: String,
    pub imp: Impl,
    pub size: u64,
    pub iters: u64,
    /// 0 for the warm-up, else 1..=rounds.
    pub round: u32,
    pub warmup: bool,
    pub port: u16,
    /// Started first; the run waits until it listens on `port`.
    pub server: Vec<String>,
    /// Started after the server listens, before the client, all in the background (the
    /// middle ranks of an all-reduce); each must exit 0 like the server.
    #[serde(default)]
    pub extra: Vec<Vec<String>>,
    /// Started last; the run waits for it (`--run-timeout`), then for the others.
    pub client: Vec<String>,
    /// Why the run cannot happen (e.g. the example is not built); recorded as a failure.
    pub missing: Option<String>,
}

/// Everything the VM side needs, written as JSON to `target/bench/plan.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Plan {
    pub rounds: u32,
    pub sizes: Vec<u64>,
    pub quick: bool,
    pub iters_override: Option<u64>,
    pub run_timeout_secs: u64,
    /// Seconds after the runner starts when it stops starting runs (the VM's limit less a run
    /// and a margin); the rest are recorded as not run. None: no limit.
    #[serde(default)]
    pub deadline_secs: Option<u64>,
    pub raw_dir: PathBuf,
    pub results: PathBuf,
    pub vm_env: PathBuf,
    pub runs: Vec<RunSpec>,
    /// vCPUs of the VM (`--smp`).
    #[serde(default)]
    pub vm_cpus: u32,
}

/// Where each side's program is: C tools by absolute path, examples by their built path.
#[derive(Default)]
pub struct Programs {
    pub c: BTreeMap<String, PathBuf>,
    pub rust: BTreeMap<String, PathBuf>,
    /// Why an example is not in `rust` (e.g. it did not compile), by example name.
    pub rust_problems: BTreeMap<String, String>,
}

pub struct Settings<'a> {
    pub tools: &'a [&'static Tool],
    pub sizes: &'a [u64],
    pub rounds: u32,
    pub iters: Option<u64>,
    pub quick: bool,
    pub port_base: u16,
    /// vCPUs of the VM (the `--wait` cell runs twice as many ranks).
    pub vm_cpus: u32,
}

/// Sizes a tool runs at.
pub fn sizes_for(tool: &Tool, sizes: &[u64]) -> Vec<u64> {
    match tool.fixed_size {
        Some(s) => vec![s],
        None => sizes.to_vec(),
    }
}

/// Which side goes first in a pair. Pairs alternate within a round and a cell's order flips
/// each round, so the whole sequence reads C R | R C | C R | R C … (ABBA) and every cell sees
/// both orders.
pub fn first_of_pair(round: u32, cell: usize) -> Impl {
    if (round as usize + cell) % 2 == 1 {
        Impl::C
    } else {
        Impl::Rust
    }
}

/// The schedule: one warm-up pair per tool (smallest size, few iterations, not counted), then
/// `rounds` rounds over every (tool, size) cell with the two sides adjacent in ABBA order.
pub fn schedule(s: &Settings, programs: &Programs) -> Vec<RunSpec> {
    let mut runs = Vec::new();
    let mut next_port = s.port_base;
    let mut push = |tool: &Tool, imp: Impl, size: u64, iters: u64, round: u32| {
        let seq = runs.len();
        let port = next_port;
        next_port = next_port.wrapping_add(ports_of(tool, s.vm_cpus));
        let warmup = round == 0;
        let id = format!(
            "{}-{}-{}-{}",
            if warmup {
                "w".to_string()
            } else {
                format!("r{round}")
            },
            tool.key,
            size,
            imp.file_tag()
        );
        let (program, missing) = match imp {
            Impl::C if !tool.baseline_is_rust() => match programs.c.get(tool.c_program) {
                Some(p) => (p.to_string_lossy().into_owned(), None),
                None => (
                    tool.c_program.to_string(),
                    Some(format!("`{}` is not installed", tool.c_program)),
                ),
            },
            Impl::C | Impl::Rust => match programs.rust.get(tool.example) {
                Some(p) => (p.to_string_lossy().into_owned(), None),
                None => (
                    tool.example.to_string(),
                    Some(
                        programs
                            .rust_problems
                            .get(tool.example)
                            .cloned()
                            .unwrap_or_else(|| {
                                format!("the example `{}` does not exist", tool.example)
                            }),
                    ),
                ),
            },
        };
        let (server, extra, client) = match tool.workload() {
            Some(w) => workload_commands(w, imp, &program, iters, port, s.vm_cpus),
            None => (
                command(tool, imp, &program, size, iters, port, None),
                Vec::new(),
                command(tool, imp, &program, size, iters, port, Some(SERVER_HOST)),
            ),
        };
        runs.push(RunSpec {
            seq,
            id,
            tool: tool.key.to_string(),
            imp,
            size,
            iters,
            round,
            warmup,
            port,
            server,
            extra,
            client,
            missing,
        });
    };
    let mut warmed: Vec<(&str, &str)> = Vec::new();
    for tool in s.tools {
        // one warm-up per workload's pair of programs (its cells differ only in arguments)
        if tool.workload().is_some() {
            if warmed.contains(&(tool.c_program, tool.example)) {
                continue;
            }
            warmed.push((tool.c_program, tool.example));
        }
        let size = sizes_for(tool, s.sizes)[0];
        let iters = s
            .iters
            .unwrap_or(100)
            .min(default_iters(tool.metric, size, true).min(100));
        push(tool, Impl::C, size, iters, 0);
        push(tool, Impl::Rust, size, iters, 0);
    }
    let cells: Vec<(&Tool, u64)> = s
        .tools
        .iter()
        .flat_map(|t| sizes_for(t, s.sizes).into_iter().map(move |z| (*t, z)))
        .collect();
    for round in 1..=s.rounds {
        for (i, (tool, size)) in cells.iter().enumerate() {
            let iters = s
                .iters
                .unwrap_or_else(|| default_iters(tool.metric, *size, s.quick));
            let first = first_of_pair(round, i);
            push(tool, first, *size, iters, round);
            push(tool, first.other(), *size, iters, round);
        }
    }
    runs
}

/// TCP ports a run of `tool` uses from its `port` on (an all-reduce: one per rank).
pub fn ports_of(tool: &Tool, vm_cpus: u32) -> u16 {
    match tool.workload() {
        Some(Workload::AllreduceBw) => ALLREDUCE_RANKS as u16,
        Some(Workload::AllreduceWait) => wait_ranks(vm_cpus) as u16,
        _ => 1,
    }
}

/// Server, background processes and client of a workload run.
fn workload_commands(
    w: Workload,
    imp: Impl,
    program: &str,
    iters: u64,
    port: u16,
    vm_cpus: u32,
) -> (Vec<String>, Vec<Vec<String>>, Vec<String>) {
    let v = |a: &[&str]| -> Vec<String> { a.iter().map(|s| s.to_string()).collect() };
    let (n, port_s) = (iters.to_string(), port.to_string());
    // perftest with the block store's message size and queue depth (-t: send queue depth)
    let perftest = |depth: Option<u32>, size: u64| {
        let mut a = v(&[program, "-d", DEVICE, "-x", GID_INDEX]);
        a.extend(v(&["-s", &size.to_string()]));
        if let Some(d) = depth {
            a.extend(v(&["-t", &d.to_string()]));
        }
        a.extend(v(&["-n", &n, "-p", &port_s]));
        let mut c = a.clone();
        c.push(SERVER_HOST.into());
        (a, Vec::new(), c)
    };
    let blockstore = |depth: u32, ratio: &str| {
        let server = v(&[
            program,
            "server",
            "-d",
            DEVICE,
            "-g",
            GID_INDEX,
            "-p",
            &port_s,
            "--blocks",
            &BENCH_BLOCKS.to_string(),
            "--clients",
            "1",
        ]);
        let client = v(&[
            program,
            "client",
            WORKLOAD_HOST,
            "-d",
            DEVICE,
            "-g",
            GID_INDEX,
            "-p",
            &port_s,
            "-q",
            &depth.to_string(),
            "-n",
            &n,
            "--write-ratio",
            ratio,
        ]);
        (server, Vec::new(), client)
    };
    let allreduce = |ranks: u64, floats: u64, wait: bool| {
        let hosts = vec![WORKLOAD_HOST; ranks as usize].join(",");
        let mut all: Vec<Vec<String>> = (0..ranks)
            .map(|r| {
                let mut a = v(&[
                    program,
                    "--rank",
                    &r.to_string(),
                    "--ranks",
                    &ranks.to_string(),
                    "--hosts",
                    &hosts,
                    "-p",
                    &port_s,
                    "-s",
                    &floats.to_string(),
                    "-n",
                    &n,
                    "-d",
                    DEVICE,
                    "-g",
                    GID_INDEX,
                ]);
                if wait {
                    a.push("--wait".into());
                }
                a
            })
            .collect();
        // rank 0 listens on `port` first; the last rank is waited for as the client
        let client = all.pop().unwrap_or_default();
        let server = all.remove(0);
        (server, all, client)
    };
    match (w, imp) {
        (Workload::BlockRead { depth }, Impl::C) | (Workload::BlockWrite { depth }, Impl::C) => {
            perftest(Some(depth), BLOCK_SIZE)
        }
        (Workload::BlockRead { depth }, Impl::Rust) => blockstore(depth, "0"),
        (Workload::BlockWrite { depth }, Impl::Rust) => blockstore(depth, "1"),
        (Workload::AllreduceBw, Impl::C) => perftest(None, ALLREDUCE_FLOATS * 4 / ALLREDUCE_RANKS),
        // ranks that outnumber the VM's cores sleep rather than spin (as the example's
        // docs advise): a spinning rank takes the core rxe's kernel work needs
        (Workload::AllreduceBw, Impl::Rust) => allreduce(
            ALLREDUCE_RANKS,
            ALLREDUCE_FLOATS,
            ALLREDUCE_RANKS > u64::from(vm_cpus),
        ),
        (Workload::AllreduceWait, imp) => allreduce(
            wait_ranks(vm_cpus),
            SMALL_ALLREDUCE_FLOATS,
            imp == Impl::Rust,
        ),
    }
}

/// The argv of one side; `host` is None for the server.
fn command(
    tool: &Tool,
    imp: Impl,
    program: &str,
    size: u64,
    iters: u64,
    port: u16,
    host: Option<&str>,
) -> Vec<String> {
    let mut a: Vec<String> = vec![program.to_string(), "-d".into(), DEVICE.into()];
    match tool.style {
        Style::Pingpong => a.extend(["-g".into(), GID_INDEX.into()]),
        // workloads build their own (`workload_commands`)
        Style::Perftest | Style::Workload(_) => a.extend(["-x".into(), GID_INDEX.into()]),
    }
    if tool.fixed_size.is_none() {
        a.extend(["-s".into(), size.to_string()]);
    }
    a.extend([
        "-n".into(),
        iters.to_string(),
        "-p".into(),
        port.to_string(),
    ]);
    let extra = match imp {
        Impl::C => tool.c_args,
        Impl::Rust => tool.rust_args,
    };
    a.extend(extra.iter().map(|s| s.to_string()));
    if let Some(h) = host {
        a.push(h.to_string());
    }
    a
}

/// Parses a message size: `4096`, `4K`, `4k`, `4KiB`, `1M`.
pub fn parse_size(s: &str) -> std::result::Result<u64, String> {
    let t = s.trim();
    let lower = t.to_ascii_lowercase();
    let (num, mult) = if let Some(n) = lower
        .strip_suffix("kib")
        .or_else(|| lower.strip_suffix('k'))
    {
        (n, 1024)
    } else if let Some(n) = lower
        .strip_suffix("mib")
        .or_else(|| lower.strip_suffix('m'))
    {
        (n, 1024 * 1024)
    } else {
        (lower.as_str(), 1)
    };
    let n: u64 = num
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a size (e.g. 64, 4K, 64KiB)"))?;
    let v = n * mult;
    if !(1..=8 * 1024 * 1024).contains(&v) {
        return Err(format!("size {v} is outside 1 B … 8 MiB"));
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn programs(with_rust: bool) -> Programs {
        let mut c = BTreeMap::new();
        let mut rust = BTreeMap::new();
        for t in TOOLS {
            c.insert(
                t.c_program.to_string(),
                PathBuf::from(format!("/usr/bin/{}", t.c_program)),
            );
            if with_rust {
                rust.insert(
                    t.example.to_string(),
                    PathBuf::from(format!("/r/examples/{}", t.example)),
                );
            }
        }
        Programs {
            c,
            rust,
            ..Programs::default()
        }
    }

    #[test]
    fn abba_order() {
        let tools = select_tools(Some(&["write_bw".to_string()])).unwrap();
        let s = Settings {
            tools: &tools,
            sizes: &[2, 64],
            rounds: 3,
            iters: None,
            quick: false,
            port_base: 20000,
            vm_cpus: 2,
        };
        let runs = schedule(&s, &programs(true));
        let measured: Vec<(u32, u64, Impl)> = runs
            .iter()
            .filter(|r| !r.warmup)
            .map(|r| (r.round, r.size, r.imp))
            .collect();
        use Impl::{Rust as R, C};
        assert_eq!(
            measured,
            [
                (1, 2, C),
                (1, 2, R),
                (1, 64, R),
                (1, 64, C),
                (2, 2, R),
                (2, 2, C),
                (2, 64, C),
                (2, 64, R),
                (3, 2, C),
                (3, 2, R),
                (3, 64, R),
                (3, 64, C),
            ]
        );
        // warm-ups first, ports all distinct
        assert!(runs[0].warmup && runs[1].warmup && !runs[2].warmup);
        let mut ports: Vec<u16> = runs.iter().map(|r| r.port).collect();
        ports.dedup();
        assert_eq!(ports.len(), runs.len());
        // each cell has both orders across rounds
        for (i, _) in [2u64, 64].iter().enumerate() {
            assert_ne!(first_of_pair(1, i), first_of_pair(2, i));
        }
    }

    #[test]
    fn command_lines() {
        let tools = select_tools(Some(&["rc_pingpong".into(), "atomic_lat".into()])).unwrap();
        assert_eq!(tools.len(), 5);
        let s = Settings {
            tools: &tools,
            sizes: &[4096],
            rounds: 1,
            iters: Some(300),
            quick: false,
            port_base: 30000,
            vm_cpus: 2,
        };
        let runs = schedule(&s, &programs(false));
        let r = runs
            .iter()
            .find(|r| !r.warmup && r.tool == "rc_pingpong" && r.imp == Impl::C)
            .unwrap();
        assert_eq!(
            r.client.join(" "),
            format!(
                "/usr/bin/ibv_rc_pingpong -d rxe0 -g 1 -s 4096 -n 300 -p {} localhost",
                r.port
            )
        );
        assert_eq!(r.server.last().unwrap(), &r.port.to_string());
        let cas_c = runs
            .iter()
            .find(|r| !r.warmup && r.tool == "atomic_lat-cas" && r.imp == Impl::C)
            .unwrap();
        assert_eq!(cas_c.size, 8);
        assert!(!cas_c.client.contains(&"-s".to_string()));
        assert!(cas_c.client.join(" ").contains("-A CMP_AND_SWAP localhost"));
        let cas_r = runs
            .iter()
            .find(|r| !r.warmup && r.tool == "atomic_lat-cas" && r.imp == Impl::Rust)
            .unwrap();
        assert!(cas_r.server.join(" ").ends_with("-A CAS"));
        assert_eq!(
            cas_r.missing.as_deref(),
            Some("the example `atomic_lat` does not exist")
        );
        // warm-ups never run more than 100 iterations, measured runs all use --iters
        assert!(runs.iter().filter(|r| r.warmup).all(|r| r.iters == 100));
        assert!(runs.iter().filter(|r| !r.warmup).all(|r| r.iters == 300));
    }

    #[test]
    fn workload_command_lines() {
        let tools = select_tools(Some(&["blockstore".into(), "allreduce".into()])).unwrap();
        assert_eq!(tools.len(), 6);
        let mut progs = programs(true);
        progs
            .rust
            .insert("blockstore".into(), "/r/blockstore".into());
        progs.rust.insert("allreduce".into(), "/r/allreduce".into());
        let s = Settings {
            tools: &tools,
            sizes: &[2],
            rounds: 1,
            iters: None,
            quick: false,
            port_base: 20000,
            vm_cpus: 2,
        };
        let runs = schedule(&s, &progs);
        // one warm-up pair per workload's pair of programs: blockstore with ib_read_bw and with
        // ib_write_bw, allreduce with ib_write_bw and with itself
        assert_eq!(runs.iter().filter(|r| r.warmup).count(), 8);
        let find = |tool: &str, imp: Impl| {
            runs.iter()
                .find(|r| !r.warmup && r.tool == tool && r.imp == imp)
                .unwrap()
        };
        let r = find("blockstore-read-q16", Impl::Rust);
        let p = r.port;
        assert_eq!(
            r.server.join(" "),
            format!("/r/blockstore server -d rxe0 -g 1 -p {p} --blocks 256 --clients 1")
        );
        assert_eq!(
            r.client.join(" "),
            format!(
                "/r/blockstore client 127.0.0.1 -d rxe0 -g 1 -p {p} -q 16 -n 1000 --write-ratio 0"
            )
        );
        let c = find("blockstore-write-q1", Impl::C);
        assert_eq!(
            c.client.join(" "),
            format!(
                "/usr/bin/ib_write_bw -d rxe0 -x 1 -s 4096 -t 1 -n 1000 -p {} localhost",
                c.port
            )
        );
        assert!(find("blockstore-write-q1", Impl::Rust)
            .client
            .ends_with(&["--write-ratio".into(), "1".into()]));
        // 3 ranks: rank 0 the server, rank 1 in the background, rank 2 the client
        let a = find("allreduce-busbw", Impl::Rust);
        assert_eq!(a.size, 65536);
        assert_eq!(a.extra.len(), 1);
        assert!(a.server.join(" ").starts_with(&format!(
            "/r/allreduce --rank 0 --ranks 3 --hosts 127.0.0.1,127.0.0.1,127.0.0.1 -p {} -s 49152 -n 50",
            a.port
        )));
        assert!(a.extra[0].join(" ").contains("--rank 1 "));
        assert!(a.client.join(" ").contains("--rank 2 "));
        // 3 ranks on 2 vCPUs: they sleep rather than spin
        assert!(a.client.contains(&"--wait".to_string()));
        let c = find("allreduce-busbw", Impl::C);
        assert!(c
            .client
            .join(" ")
            .contains("ib_write_bw -d rxe0 -x 1 -s 65536 -n 50"));
        // --wait against busy polling: both sides our example, 2 × vCPUs ranks
        let busy = find("allreduce-wait", Impl::C);
        let wait = find("allreduce-wait", Impl::Rust);
        assert_eq!(busy.missing, None);
        assert_eq!((busy.extra.len(), wait.extra.len()), (2, 2));
        assert!(busy.client[0] == "/r/allreduce" && !busy.client.contains(&"--wait".into()));
        assert!(
            wait.client.contains(&"--wait".to_string()) && wait.server.contains(&"--wait".into())
        );
        assert!(wait.client.join(" ").contains("--ranks 4 "));
        // every rank of every run has its own port: port ranges do not overlap
        let mut used: Vec<u16> = Vec::new();
        for r in &runs {
            let t = tool(&r.tool).unwrap();
            for k in 0..ports_of(t, 2) {
                used.push(r.port + k);
            }
        }
        let n = used.len();
        used.sort_unstable();
        used.dedup();
        assert_eq!(used.len(), n);
    }

    #[test]
    fn tool_selection() {
        let d = select_tools(None).unwrap();
        let keys: Vec<&str> = d.iter().map(|t| t.key).collect();
        assert_eq!(
            keys,
            [
                "rc_pingpong",
                "write_lat",
                "write_bw",
                "send_lat",
                "write_lat-raw",
                "send_lat-raw",
                "read_lat",
                "read_lat-raw",
                "read_lat-req",
                "read_lat-ext",
                "atomic_lat-cas",
                "atomic_lat-faa",
                "atomic_lat-cas-raw",
                "atomic_lat-faa-raw",
                "blockstore-read-q1",
                "blockstore-read-q16",
                "blockstore-write-q1",
                "blockstore-write-q16",
                "allreduce-busbw",
                "allreduce-wait"
            ]
        );
        assert!(select_tools(Some(&["nope".into()])).is_err());
        assert_eq!(select_tools(Some(&["send_bw".into()])).unwrap().len(), 1);
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("64"), Ok(64));
        assert_eq!(parse_size("4K"), Ok(4096));
        assert_eq!(parse_size("64KiB"), Ok(65536));
        assert_eq!(parse_size("1m"), Ok(1 << 20));
        assert!(parse_size("0").is_err());
        assert!(parse_size("x").is_err());
    }

    #[test]
    fn targets() {
        assert!(Metric::Latency.target().met(1.03));
        assert!(!Metric::PingpongLatency.target().met(1.031));
        assert!(Metric::Bandwidth.target().met(0.97));
        assert!(!Metric::Bandwidth.target().met(0.969));
    }
}
