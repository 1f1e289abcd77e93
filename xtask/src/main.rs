//! Developer tasks for the rdma-verbs workspace.
//!
//! `cargo xtask deps`  – install the Debian packages the workspace and the VMs need.
//! `cargo xtask vm`    – run a command in a throwaway QEMU VM with SoftRoCE (rxe).
//! `cargo xtask test`  – host tests, then the device tests inside a VM.
//! `cargo xtask demo`  – build the examples and run the demo inside a VM.
//! `cargo xtask bench` – our example tools vs rdma-core's C tools, interleaved in one VM.
//! `cargo xtask instr` – instructions per operation (callgrind), ours vs C, and scaling curves.
//! `cargo xtask fuzz`  – every fuzz target of `fuzz/` for a few seconds (cargo-fuzz, libFuzzer).
//!
//! Everything prints its progress as `[xtask <elapsed>s] …`.

mod bench;
mod demo;
mod deps;
mod faults;
mod fuzz;
mod guest;
mod headers;
mod instr;
mod kernel;
mod package;
mod soak;
mod test;
mod util;
mod vm;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "cargo xtask",
    bin_name = "cargo xtask",
    about = "Developer tasks: dependencies, SoftRoCE VMs, device tests, demos"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Install (as root) or list (otherwise) the Debian packages that are needed.
    Deps,
    /// Boot a throwaway QEMU VM with SoftRoCE and run a shell command in it.
    ///
    /// The command runs via `/bin/sh -c` in a chroot into the host's root (read-only), with the
    /// repository mounted read-write at its host path and the working directory set to it.
    /// Devices: eth0 (10.0.2.15/24) with rxe0; with --pair also eth1 (192.168.77.{1,2}/24)
    /// with rxe1, linked between the two VMs. Exits with the command's exit status.
    Vm(VmArgs),
    /// Run the host tests, then the device tests (`--ignored`) inside a SoftRoCE VM.
    Test(TestArgs),
    /// Build the examples and run the demo (rc_pingpong, else loopback) inside a VM.
    Demo(DemoArgs),
    /// Benchmark our example tools against rdma-core's C tools in one SoftRoCE VM.
    ///
    /// Builds the examples (release), boots one VM and runs, on rxe0 with GID index 1, server
    /// and client in the VM: ibv_rc_pingpong vs rc_pingpong, ib_write_lat vs write_lat,
    /// ib_write_bw vs write_bw, ib_send_lat vs send_lat, ib_read_lat vs read_lat and
    /// ib_atomic_lat vs atomic_lat (CAS and FAA), with the same arguments and iterations, C and
    /// Rust adjacent in ABBA order over several rounds. Writes target/bench/report.md (medians,
    /// spread, Rust/C against the targets: latency ≤ 1.03, bandwidth ≥ 0.97),
    /// target/bench/latency_bandwidth.png, the raw outputs under target/bench/raw/ and
    /// target/bench/benchmarks.md (the generated docs/results/benchmarks.md; --publish copies it). Exits
    /// non-zero if any run failed (a missed target is a result, not a failure).
    Bench(BenchArgs),
    /// Instructions per operation, ours against C, counted by callgrind in one SoftRoCE VM.
    ///
    /// Deterministic where wall clock under TCG is not: per post, per completion and per event
    /// wait (request, prepared and raw paths against a C twin), the provider's share, scaling
    /// with queue pairs, depth and threads, and the event-mode ping-pongs against rdma-core's
    /// and perftest's tools. Writes target/instr/report.md and target/instr/scaling.png.
    Instr(InstrArgs),
    /// Fault injection between two VMs (loss, reordering, a killed peer, link
    /// down, RNR, CQ overrun); one row per scenario, fails if any fails.
    Faults(FaultsArgs),
    /// A long randomized run between two VMs: many queue pairs and threads, a random mix of
    /// sends, writes, reads and atomics (1 B – 1 MiB), faults switching every few seconds (loss,
    /// duplication, reordering, delay, corruption, link flaps, peer restarts), every byte
    /// checked and ledgers compared after every session. Writes target/soak/soak.md; fails on
    /// any lost or corrupted message, counter mismatch or leaked resource.
    Soak(SoakArgs),
    /// Run every cargo-fuzz target of `fuzz/` for a time budget each (installs cargo-fuzz
    /// when missing; `RUSTC_BOOTSTRAP=1` lets the stable toolchain build them). Fails if a
    /// target crashes (its input is saved under fuzz/artifacts/) or does not build.
    Fuzz(FuzzArgs),
    /// Package the published crates (`cargo package`), check each holds its README and
    /// both licenses, unpack them into a workspace of their own and run their host tests
    /// there with rdma-core's headers and libclang hidden (needs root: a mount
    /// namespace), then `cargo check` them with the minimum supported Rust version.
    Package(PackageArgs),
    /// Internal: run the device test executables of a plan (used inside the VM).
    #[command(hide = true)]
    DeviceRun {
        /// JSON plan written by `cargo xtask test`.
        #[arg(long)]
        plan: PathBuf,
    },
}

/// The VM wall-clock limit of commands without a longer default of their own.
pub const DEFAULT_VM_TIMEOUT_SECS: u64 = 1800;

/// Options shared by everything that boots a VM.
#[derive(Args, Clone, Debug)]
pub struct VmOpts {
    /// Guest memory per VM (QEMU `-m` syntax).
    #[arg(long, default_value = "2G")]
    pub mem: String,
    /// Virtual CPUs per VM.
    #[arg(long, default_value_t = 2)]
    pub smp: u32,
    /// Wall-clock limit in seconds; QEMU is killed when it is reached. Default: 1800,
    /// except `faults` (3600: its full profile takes ~30 min under TCG on an idle host,
    /// more on a slower one) and `instr` (3 h).
    #[arg(long)]
    pub timeout: Option<u64>,
    /// Extra environment for the command inside the VM (repeatable).
    #[arg(long = "env", value_name = "K=V", value_parser = parse_env)]
    pub env: Vec<(String, String)>,
    /// Show the whole serial console: firmware, kernel messages and all.
    #[arg(long)]
    pub verbose: bool,
    /// Extra guest kernel command-line argument (repeatable), e.g. `idle=poll`: idle
    /// vCPUs spin instead of halting, so waking one costs no host thread wake-up.
    #[arg(long = "kernel-arg", value_name = "ARG", value_parser = parse_kernel_arg)]
    pub kernel_args: Vec<String>,
}

impl VmOpts {
    /// The limit given with `--timeout`, else the command's own default.
    pub fn timeout_or(&self, default_secs: u64) -> Duration {
        Duration::from_secs(self.timeout.unwrap_or(default_secs))
    }

    /// The limit for commands without a longer default of their own.
    pub fn timeout(&self) -> Duration {
        self.timeout_or(DEFAULT_VM_TIMEOUT_SECS)
    }
}

#[derive(Args)]
struct VmArgs {
    /// Boot two VMs linked by a private Ethernet (eth1/rxe1) and run the command in both.
    #[arg(long)]
    pair: bool,
    /// Also share this host directory read-write at its own path (repeatable); the
    /// repository and the target directory always are, and the guest's /tmp is its own.
    #[arg(long = "share", value_name = "DIR")]
    share: Vec<std::path::PathBuf>,
    #[command(flatten)]
    opts: VmOpts,
    /// The command, run by `/bin/sh -c`: one argument as a command line
    /// (`-- 'cd x && make'`), several as words quoted as given (`-- sh -c 'cd x && make'`).
    #[arg(last = true, required = true, value_name = "COMMAND")]
    command: Vec<String>,
}

#[derive(Args)]
struct TestArgs {
    /// Run the device tests on this host instead of in a VM (needs a real or rxe device).
    #[arg(long)]
    no_vm: bool,
    /// Skip the host tests and run only the device tests.
    #[arg(long)]
    device_only: bool,
    /// Skip the fuzzing that follows the host tests.
    #[arg(long)]
    no_fuzz: bool,
    /// Per test executable limit in seconds for the device tests.
    #[arg(long, default_value_t = 900)]
    exe_timeout: u64,
    /// Features of the suite for every build of the tests and examples
    /// (`--features dlopen`: rdma-verbs loads rdma-core at run time).
    #[arg(long, value_name = "FEATURES")]
    features: Option<String>,
    #[command(flatten)]
    opts: VmOpts,
    /// Extra arguments for every libtest executable (after `--`).
    #[arg(last = true, value_name = "LIBTEST-ARGS")]
    extra: Vec<String>,
}

#[derive(Args)]
struct PackageArgs {
    /// Package uncommitted changes too (`cargo package --allow-dirty`).
    #[arg(long)]
    allow_dirty: bool,
    /// Skip the minimum-supported-Rust-version check.
    #[arg(long)]
    no_msrv: bool,
}

#[derive(Args)]
struct FuzzArgs {
    /// Seconds of fuzzing per target.
    #[arg(long, default_value_t = 8)]
    seconds: u64,
    /// Only these targets (default: all of `cargo fuzz list`).
    #[arg(value_name = "TARGET")]
    targets: Vec<String>,
}

#[derive(Args)]
struct FaultsArgs {
    /// MiB moved by each transfer scenario (the full profile uses 64).
    #[arg(long, default_value_t = 64)]
    total_mib: u64,
    /// Reduced profile: one loss rate and one reordering shape.
    #[arg(long)]
    quick: bool,
    /// Only the scenarios whose name contains this text.
    #[arg(long)]
    only: Option<String>,
    /// Run each selected scenario this many times (one VM boot), to catch
    /// intermittent failures.
    #[arg(long, default_value_t = 1)]
    repeat: u32,
    /// Which data mover the transfer rows run: `rust` (fault_peer, on
    /// this library), `c` (its C twin on libibverbs alone,
    /// xtask/c/fault_peer.c), or `both`, each row once with each, in turn
    /// (the comparison of issue #24).
    #[arg(long, value_enum, default_value_t = faults::Peer::Rust)]
    peer: faults::Peer,
    /// Also copy the generated report (target/faults/reliability.md) to
    /// docs/results/reliability.md; with `--only`, to `docs/results/reliability-<selection>.md`
    /// (an experiment never replaces the whole matrix).
    #[arg(long)]
    publish: bool,
    /// Record every transfer row's RoCE packets on vm1's eth1 (`tcpdump`,
    /// headers only) and keep the trace of each row whose client did not
    /// end `ok`, as target/faults/N.pcap.
    #[arg(long)]
    capture: bool,
    /// Evaluate the last run's outputs (target/faults/) again, with the
    /// same selection options, without building or booting anything.
    #[arg(long)]
    reanalyze: bool,
    #[command(flatten)]
    opts: VmOpts,
}

#[derive(Args)]
struct SoakArgs {
    /// Length of the traffic in minutes (fractions allowed).
    #[arg(long, default_value_t = 5.0)]
    minutes: f64,
    /// RC queue pairs per session.
    #[arg(long, default_value_t = 16)]
    qps: usize,
    /// Client threads (each drives its share of the queue pairs on one CQ).
    #[arg(long, default_value_t = 4)]
    threads: usize,
    /// Seed of the fault timeline and of every random choice of the client.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// The same traffic on a clean link (a baseline).
    #[arg(long)]
    no_faults: bool,
    /// Keep a trace of the client VM's RoCE packets (headers only) in
    /// target/soak/soak.pcap and read each finding's queue pair in it.
    #[arg(long)]
    capture: bool,
    /// Also copy the generated report (target/soak/soak.md) to docs/results/soak.md
    /// (with --capture, to docs/results/soak-trace.md).
    #[arg(long)]
    publish: bool,
    /// Evaluate the last run's outputs (target/soak/) again, with the same
    /// options, without building or booting anything.
    #[arg(long)]
    reanalyze: bool,
    #[command(flatten)]
    opts: VmOpts,
}

#[derive(Args)]
struct DemoArgs {
    /// Build and run the examples in release mode.
    #[arg(long)]
    release: bool,
    #[command(flatten)]
    opts: VmOpts,
}

#[derive(Args)]
struct BenchArgs {
    /// Rounds over every (tool, size) [default: 3; 1 with --quick].
    #[arg(long, value_name = "N")]
    rounds: Option<u32>,
    /// Message sizes, comma-separated, e.g. 2,64,1K,4K,64K [default: 2,64,1024,4096,65536;
    /// 2,65536 with --quick]. Atomics always use 8 B.
    #[arg(long, value_name = "LIST", value_delimiter = ',', value_parser = bench::parse_size)]
    sizes: Option<Vec<u64>>,
    /// Iterations of every run, both sides [default: per tool and size, about a second per run
    /// under TCG: latency and pingpong 1000 (200 from 16 KiB), bandwidth 2000 (500); 200 with
    /// --quick]. A full default bench takes about 15 min on an idle host; on a busy one raise
    /// the VM limit (--timeout), else the runs left at the limit are reported as not run.
    #[arg(long, value_name = "N")]
    iters: Option<u64>,
    /// Smoke run: 1 round, sizes 2 and 64K, 200 iterations.
    #[arg(long)]
    quick: bool,
    /// Only these tools, comma-separated: rc_pingpong, write_lat, write_bw, send_lat,
    /// read_lat (= read_lat, re-posting a prepared request, + read_lat-raw, the same tool through
    /// the unsafe raw path as a control, + read_lat-req, a new post_send each iteration, +
    /// read_lat-ext, on the extended verbs), atomic_lat (= atomic_lat-cas + atomic_lat-faa, and
    /// both through the raw path), send_bw, read_bw, and issue #21's workloads: blockstore
    /// (= blockstore-{read,write}-q{1,16} against ib_{read,write}_bw's message rate), allreduce
    /// (= allreduce-busbw against ib_write_bw, allreduce-wait: --wait against busy polling with
    /// 2 × --smp ranks) [default: all but send_bw, read_bw and the workloads].
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    tools: Option<Vec<String>>,
    /// Per-run limit in seconds: a client still running then is killed and the run recorded
    /// as failed.
    #[arg(long, value_name = "SECS", default_value_t = 60)]
    run_timeout: u64,
    /// TCP port of the first run; run N uses this + N.
    #[arg(long, value_name = "PORT", default_value_t = 20000)]
    port_base: u16,
    /// Rebuild the report, plot and table from the last bench's files; run nothing.
    #[arg(long)]
    reanalyze: bool,
    /// Copy the generated target/bench/benchmarks.md to docs/results/benchmarks.md (with --reanalyze:
    /// from the last bench's files).
    #[arg(long)]
    publish: bool,
    /// Internal: run the plan (inside the VM).
    #[arg(long, hide = true, value_name = "FILE")]
    run_plan: Option<PathBuf>,
    #[command(flatten)]
    opts: VmOpts,
}

#[derive(Args)]
struct InstrArgs {
    /// Fewer configurations (1 and 16 QPs, depth 1 and 16, 1 and 2 threads): about a third of
    /// the full run's time.
    #[arg(long)]
    quick: bool,
    /// Only these sets, comma-separated: paths, events, qps, depth, threads, pingpong.
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    only: Option<Vec<String>>,
    /// Rebuild the report from the last run's files; run nothing.
    #[arg(long)]
    reanalyze: bool,
    /// Also write the report and plot to docs/results/instructions.md and instructions.png.
    #[arg(long)]
    publish: bool,
    #[command(flatten)]
    opts: VmOpts,
}

fn parse_env(s: &str) -> std::result::Result<(String, String), String> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| format!("expected K=V, got `{s}`"))?;
    if k.is_empty() || !k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(format!("`{k}` is not a valid environment variable name"));
    }
    Ok((k.to_string(), v.to_string()))
}

/// A guest kernel argument: one word of printable ASCII; `xtask.*` is ours.
fn parse_kernel_arg(s: &str) -> std::result::Result<String, String> {
    if s.is_empty() || !s.chars().all(|c| c.is_ascii_graphic()) {
        return Err(format!("`{s}` is not one word of printable ASCII"));
    }
    if s.starts_with("xtask.") {
        return Err(format!("`{s}`: xtask.* arguments are set by xtask itself"));
    }
    Ok(s.to_string())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let inner = match &cli.command {
        Cmd::DeviceRun { .. } => true,
        Cmd::Bench(b) => b.run_plan.is_some(),
        _ => false,
    };
    util::init_clock(inner);
    match run(cli) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("[xtask {:.1}s] error: {err:#}", util::elapsed_secs());
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Cmd::Deps => {
            deps::ensure()?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Vm(args) => {
            deps::ensure()?;
            let code = vm::cmd_vm(
                &vm::command_line(&args.command),
                args.pair,
                &args.share,
                &args.opts,
            )?;
            Ok(exit_code(code))
        }
        Cmd::Test(args) => {
            deps::ensure()?;
            let ok = test::cmd_test(&test::TestOptions {
                no_vm: args.no_vm,
                device_only: args.device_only,
                no_fuzz: args.no_fuzz,
                exe_timeout: Duration::from_secs(args.exe_timeout),
                features: args.features,
                vm: args.opts,
                extra: args.extra,
            })?;
            Ok(status(ok))
        }
        Cmd::Demo(args) => {
            deps::ensure()?;
            let code = demo::cmd_demo(args.release, &args.opts)?;
            Ok(exit_code(code))
        }
        Cmd::Faults(args) => {
            deps::ensure()?;
            let ok = faults::cmd_faults(&faults::FaultsOptions {
                total_mib: args.total_mib,
                quick: args.quick,
                only: args.only,
                repeat: args.repeat,
                peer: args.peer,
                publish: args.publish,
                reanalyze: args.reanalyze,
                capture: args.capture,
                vm: args.opts,
            })?;
            Ok(status(ok))
        }
        Cmd::Soak(args) => {
            if !args.reanalyze {
                deps::ensure()?;
            }
            let ok = soak::cmd_soak(&soak::SoakOptions {
                minutes: args.minutes,
                qps: args.qps,
                threads: args.threads,
                seed: args.seed,
                no_faults: args.no_faults,
                capture: args.capture,
                publish: args.publish,
                reanalyze: args.reanalyze,
                vm: args.opts,
            })?;
            Ok(status(ok))
        }
        Cmd::Bench(args) => {
            if let Some(plan) = &args.run_plan {
                let ok = bench::run_plan(plan)?;
                return Ok(status(ok));
            }
            if !args.reanalyze {
                deps::ensure()?;
            }
            let ok = bench::cmd_bench(&bench::BenchOptions {
                rounds: args.rounds,
                sizes: args.sizes,
                iters: args.iters,
                quick: args.quick,
                tools: args.tools,
                run_timeout: args.run_timeout,
                port_base: args.port_base,
                reanalyze: args.reanalyze,
                publish: args.publish,
                vm: args.opts,
            })?;
            Ok(status(ok))
        }
        Cmd::Instr(args) => {
            if !args.reanalyze {
                deps::ensure()?;
            }
            let ok = instr::cmd_instr(&instr::InstrOptions {
                quick: args.quick,
                publish: args.publish,
                only: args.only,
                reanalyze: args.reanalyze,
                vm: args.opts,
            })?;
            Ok(status(ok))
        }
        Cmd::Fuzz(args) => {
            let ok = fuzz::cmd_fuzz(args.seconds, &args.targets)?;
            Ok(status(ok))
        }
        Cmd::Package(args) => {
            let ok = package::cmd_package(&package::PackageOptions {
                allow_dirty: args.allow_dirty,
                no_msrv: args.no_msrv,
            })?;
            Ok(status(ok))
        }
        Cmd::DeviceRun { plan } => {
            let ok = test::device_run_from_plan(&plan)?;
            Ok(status(ok))
        }
    }
}

/// Success or failure.
fn status(ok: bool) -> ExitCode {
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn exit_code(code: i32) -> ExitCode {
    match u8::try_from(code) {
        Ok(c) => ExitCode::from(c),
        Err(_) => ExitCode::FAILURE,
    }
}

/// Workspace root: the parent of this crate's manifest directory, canonicalized.
/// Where published run reports go (`docs/results/`, indexed by its README).
pub fn results_dir() -> Result<PathBuf> {
    Ok(repo_root()?.join("docs").join("results"))
}

pub fn repo_root() -> Result<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let root = dir
        .parent()
        .context("xtask's manifest directory has no parent")?;
    let root = root
        .canonicalize()
        .with_context(|| format!("cannot resolve the repository path {}", root.display()))?;
    if !root.join("Cargo.toml").is_file() {
        bail!("{} does not look like the workspace root", root.display());
    }
    Ok(root)
}

#[cfg(test)]
mod tests {
    use super::parse_kernel_arg;

    #[test]
    fn kernel_args_are_single_words_not_ours() {
        assert_eq!(parse_kernel_arg("idle=poll").unwrap(), "idle=poll");
        assert!(parse_kernel_arg("").is_err());
        assert!(parse_kernel_arg("idle=poll quiet").is_err());
        assert!(parse_kernel_arg("xtask.run=/tmp").is_err());
    }
}
