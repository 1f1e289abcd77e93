//! Developer tasks for the ibverbs workspace.
//!
//! `cargo xtask deps`  – install the Debian packages the workspace and the VMs need.
//! `cargo xtask vm`    – run a command in a throwaway QEMU VM with SoftRoCE (rxe).
//! `cargo xtask test`  – host tests, then the device tests inside a VM.
//! `cargo xtask demo`  – build the examples and run the demo inside a VM.
//!
//! Everything prints its progress as `[xtask <elapsed>s] …`.

mod demo;
mod deps;
mod guest;
mod kernel;
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
    /// Internal: run the device test executables of a plan (used inside the VM).
    #[command(hide = true)]
    DeviceRun {
        /// JSON plan written by `cargo xtask test`.
        #[arg(long)]
        plan: PathBuf,
    },
}

/// Options shared by everything that boots a VM.
#[derive(Args, Clone, Debug)]
pub struct VmOpts {
    /// Guest memory per VM (QEMU `-m` syntax).
    #[arg(long, default_value = "2G")]
    pub mem: String,
    /// Virtual CPUs per VM.
    #[arg(long, default_value_t = 2)]
    pub smp: u32,
    /// Wall-clock limit in seconds; QEMU is killed when it is reached.
    #[arg(long, default_value_t = 1800)]
    pub timeout: u64,
    /// Extra environment for the command inside the VM (repeatable).
    #[arg(long = "env", value_name = "K=V", value_parser = parse_env)]
    pub env: Vec<(String, String)>,
    /// Show the whole serial console: firmware, kernel messages and all.
    #[arg(long)]
    pub verbose: bool,
}

impl VmOpts {
    pub fn timeout(&self) -> Duration {
        Duration::from_secs(self.timeout)
    }
}

#[derive(Args)]
struct VmArgs {
    /// Boot two VMs linked by a private Ethernet (eth1/rxe1) and run the command in both.
    #[arg(long)]
    pair: bool,
    #[command(flatten)]
    opts: VmOpts,
    /// The command (joined with spaces and run by `/bin/sh -c`).
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
    /// Per test executable limit in seconds for the device tests.
    #[arg(long, default_value_t = 900)]
    exe_timeout: u64,
    #[command(flatten)]
    opts: VmOpts,
    /// Extra arguments for every libtest executable (after `--`).
    #[arg(last = true, value_name = "LIBTEST-ARGS")]
    extra: Vec<String>,
}

#[derive(Args)]
struct DemoArgs {
    /// Build and run the examples in release mode.
    #[arg(long)]
    release: bool,
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

fn main() -> ExitCode {
    let cli = Cli::parse();
    util::init_clock(matches!(cli.command, Cmd::DeviceRun { .. }));
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
            let code = vm::cmd_vm(&args.command.join(" "), args.pair, &args.opts)?;
            Ok(exit_code(code))
        }
        Cmd::Test(args) => {
            deps::ensure()?;
            let ok = test::cmd_test(&test::TestOptions {
                no_vm: args.no_vm,
                device_only: args.device_only,
                exe_timeout: Duration::from_secs(args.exe_timeout),
                vm: args.opts,
                extra: args.extra,
            })?;
            Ok(if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Cmd::Demo(args) => {
            deps::ensure()?;
            let code = demo::cmd_demo(args.release, &args.opts)?;
            Ok(exit_code(code))
        }
        Cmd::DeviceRun { plan } => {
            let ok = test::device_run_from_plan(&plan)?;
            Ok(if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
    }
}

fn exit_code(code: i32) -> ExitCode {
    match u8::try_from(code) {
        Ok(c) => ExitCode::from(c),
        Err(_) => ExitCode::FAILURE,
    }
}

/// Workspace root: the parent of this crate's manifest directory, canonicalized.
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
