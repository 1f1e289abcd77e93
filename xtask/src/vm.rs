//! Throwaway QEMU (TCG) VMs with SoftRoCE.
//!
//! Each VM boots the cached Debian kernel + busybox initramfs (see `kernel.rs`), mounts the
//! host's root read-only over 9p, the repository (and the target directory, when it lies
//! elsewhere) read-write at the same paths, and chroots into the host's root. Per-run scripts
//! and results live in a run directory under `<target>/xtask/run-<pid>/`, which the guest sees
//! at the same path: `vm<N>.setup.sh` (network + rxe, run first), `vm<N>.run.sh` (the command),
//! and the results `vm<N>.status`, `vm<N>.dmesg`, `vm<N>.console.log`.

use std::fs;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::guest;
use crate::kernel::{self, KernelImage};
use crate::util;
use crate::{step, VmOpts};

/// Network of the private link between the VMs of a pair (never leaves the two guests).
const PAIR_NET: [u8; 3] = [192, 168, 77];
/// Console silence after which we say that the VM is still running.
const SILENCE_NOTE: Duration = Duration::from_secs(60);
/// After one VM of a group failed, how long the others may still run.
const PEER_FAILED_GRACE: Duration = Duration::from_secs(30);

/// A point-to-point Ethernet link to another VM (QEMU `-netdev socket`), as eth1 + rxe1.
#[derive(Clone, Debug)]
pub struct Link {
    /// The first VM listens on 127.0.0.1:port, the second connects.
    pub listen: bool,
    pub port: u16,
    pub mac: String,
    pub addr: Ipv4Addr,
    pub peer_addr: Ipv4Addr,
    /// Index of the VM on the other end (for the start-up barrier).
    pub peer_index: usize,
}

/// One VM to boot and the command to run in it.
#[derive(Clone, Debug)]
pub struct VmConfig {
    pub index: usize,
    /// Shell command, run by `/bin/sh -c` in the repository root.
    pub command: String,
    /// Environment of the command (on top of PATH, HOME and the XTASK_* variables).
    pub env: Vec<(String, String)>,
    pub mem: String,
    pub smp: u32,
    pub link: Option<Link>,
    pub verbose: bool,
    /// Extra guest kernel arguments (`--kernel-arg`).
    pub kernel_args: Vec<String>,
}

impl VmConfig {
    /// A VM with eth0/rxe0; the environment passes through RUST_BACKTRACE, RUST_LOG, IBVERBS_*
    /// from ours, then `opts.env`.
    pub fn new(index: usize, command: &str, opts: &VmOpts) -> Self {
        let mut env: Vec<(String, String)> = std::env::vars()
            .filter(|(k, _)| k == "RUST_BACKTRACE" || k == "RUST_LOG" || k.starts_with("IBVERBS_"))
            .collect();
        env.sort();
        env.extend(opts.env.iter().cloned());
        VmConfig {
            index,
            command: command.to_string(),
            env,
            mem: opts.mem.clone(),
            smp: opts.smp,
            link: None,
            verbose: opts.verbose,
            kernel_args: opts.kernel_args.clone(),
        }
    }

    pub fn name(&self) -> String {
        format!("vm{}", self.index)
    }

    /// Address the command should use: eth1's with a link, else eth0's.
    pub fn local_addr(&self) -> Ipv4Addr {
        self.link.as_ref().map_or(guest::ETH0_ADDR, |l| l.addr)
    }
}

/// Two VMs (index 0 and 1) joined by a private link; vm0 runs `cmd0`, vm1 runs `cmd1`.
pub fn pair(cmd0: &str, cmd1: &str, opts: &VmOpts) -> Result<[VmConfig; 2]> {
    let port = free_port()?;
    let addr = |i: u8| Ipv4Addr::new(PAIR_NET[0], PAIR_NET[1], PAIR_NET[2], i + 1);
    let mk = |i: usize, cmd: &str| {
        let mut vm = VmConfig::new(i, cmd, opts);
        vm.link = Some(Link {
            listen: i == 0,
            port,
            mac: format!("52:54:00:77:00:{:02x}", i + 1),
            addr: addr(i as u8),
            peer_addr: addr(1 - i as u8),
            peer_index: 1 - i,
        });
        vm
    };
    Ok([mk(0, cmd0), mk(1, cmd1)])
}

fn free_port() -> Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0").context("cannot find a free TCP port")?;
    Ok(l.local_addr()?.port())
}

/// What happened in one VM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VmResult {
    /// The command ran and exited with this status.
    Exited(i32),
    /// The setup script (network, rxe) failed.
    SetupFailed(i32),
    /// The initramfs could not get as far as the setup script.
    InitFailed(String),
    /// No status came back (QEMU failed, the kernel panicked, or we killed it).
    NoStatus(String),
}

#[derive(Debug, Clone)]
pub struct VmOutcome {
    pub name: String,
    pub result: VmResult,
    pub console_log: PathBuf,
    /// The kernel crashed while booting, before the VM's init ran: nothing
    /// of the command ran (under TCG an early-boot oops, e.g. an `int3`
    /// hit while the kernel patches its own code, happens now and then).
    pub boot_crash: bool,
    /// The guest kernel crashed after init ran (no status came back): its
    /// oops from the console, first line first.
    pub panic: Option<Vec<String>>,
}

impl VmOutcome {
    pub fn success(&self) -> bool {
        self.result == VmResult::Exited(0)
    }

    /// Exit code to pass on: the command's, or 1 when it never ran.
    pub fn code(&self) -> i32 {
        match self.result {
            VmResult::Exited(c) => c,
            _ => 1,
        }
    }

    pub fn describe(&self) -> String {
        match &self.result {
            VmResult::Exited(c) => format!("{}: command exited with status {c}", self.name),
            VmResult::SetupFailed(c) => format!(
                "{}: VM setup (network/rxe) failed with status {c}; see the messages above",
                self.name
            ),
            VmResult::InitFailed(m) => format!("{}: VM init failed: {m}", self.name),
            VmResult::NoStatus(m) => match self.panic.as_ref().and_then(|p| p.first()) {
                Some(first) => format!(
                    "{}: the guest kernel crashed ({first}); console log: {}",
                    self.name,
                    self.console_log.display()
                ),
                None => format!(
                    "{}: no result from the VM ({m}); console log: {}",
                    self.name,
                    self.console_log.display()
                ),
            },
        }
    }
}

/// A kernel, the shared folders and a run directory: everything to boot VMs.
pub struct Session {
    kernel: KernelImage,
    repo: PathBuf,
    shares: Vec<PathBuf>,
    run_dir: PathBuf,
}

impl Session {
    /// Prepares the kernel (cached) and a fresh run directory in the target directory.
    pub fn new() -> Result<Session> {
        Session::with_shares(&[])
    }

    /// As [`Session::new`], also sharing `extra` directories read-write at their host paths
    /// (`cargo xtask vm --share DIR`).
    pub fn with_shares(extra: &[PathBuf]) -> Result<Session> {
        let repo = crate::repo_root()?;
        let target = util::target_dir()?;
        let mut shares = vec![repo.clone()];
        if !target.starts_with(&repo) {
            shares.push(target.clone());
        }
        for dir in extra {
            let dir = fs::canonicalize(dir)
                .with_context(|| format!("--share {}: no such directory", dir.display()))?;
            if !dir.is_dir() {
                bail!("--share {}: not a directory", dir.display());
            }
            if !shares.iter().any(|s| dir.starts_with(s)) {
                shares.push(dir);
            }
        }
        for s in &shares {
            check_cmdline_path(s)?;
        }
        let kernel = kernel::prepare(&target)?;
        prune_run_dirs(&target.join("xtask"));
        let run_dir = target
            .join("xtask")
            .join(format!("run-{}", std::process::id()));
        let _ = fs::remove_dir_all(&run_dir);
        fs::create_dir_all(&run_dir)
            .with_context(|| format!("cannot create {}", run_dir.display()))?;
        Ok(Session {
            kernel,
            repo,
            shares,
            run_dir,
        })
    }

    /// Shared with the guests at the same path: put inputs and outputs of commands here.
    pub fn run_dir(&self) -> &Path {
        &self.run_dir
    }

    /// Removes the run directory (call after success; keep it for debugging otherwise).
    pub fn cleanup(&self) {
        let _ = fs::remove_dir_all(&self.run_dir);
    }

    /// Boots all `vms` at once, streams their consoles and waits (at most
    /// `timeout`). When a kernel crashed while booting — before any VM's
    /// command could have run — all of them boot once more.
    pub fn run(&self, vms: &[VmConfig], timeout: Duration) -> Result<Vec<VmOutcome>> {
        let outcomes = self.run_once(vms, timeout)?;
        let crashed: Vec<&str> = outcomes
            .iter()
            .filter(|o| o.boot_crash)
            .map(|o| o.name.as_str())
            .collect();
        if crashed.is_empty() {
            return Ok(outcomes);
        }
        step!(
            "{}: the kernel crashed while booting, before init ran (an emulation fault, not a \
             result; console log kept); booting again, once",
            crashed.join(", ")
        );
        for o in &outcomes {
            let _ = fs::rename(
                &o.console_log,
                o.console_log.with_extension("boot-crash.log"),
            );
        }
        self.run_once(vms, timeout)
    }

    fn run_once(&self, vms: &[VmConfig], timeout: Duration) -> Result<Vec<VmOutcome>> {
        let prefixed = vms.len() > 1;
        for vm in vms {
            self.write_scripts(vm)?;
        }
        let start = Instant::now();
        let deadline = start + timeout;
        let mut running: Vec<Running> = Vec::new();
        for vm in vms {
            if let Some(link) = vm.link.as_ref().filter(|l| !l.listen) {
                wait_for_listener(link.port, &mut running, deadline)?;
            }
            step!(
                "{}: booting (kernel {}, {} RAM, {} vCPUs, TCG)",
                vm.name(),
                self.kernel.version,
                vm.mem,
                vm.smp
            );
            running.push(self.spawn(vm, prefixed)?);
        }
        let result = supervise(&mut running, deadline, timeout, &self.run_dir);
        for r in &mut running {
            if r.status.is_none() {
                let _ = r.child.kill();
                let _ = r.child.wait();
            }
        }
        let mut outcomes = Vec::new();
        for r in running {
            outcomes.push(r.finish(&self.run_dir));
        }
        result?;
        step!("VMs finished in {:.1}s", start.elapsed().as_secs_f64());
        Ok(outcomes)
    }

    fn write_scripts(&self, vm: &VmConfig) -> Result<()> {
        let name = vm.name();
        for suffix in ["status", "ready", "dmesg"] {
            let _ = fs::remove_file(self.run_dir.join(format!("{name}.{suffix}")));
        }
        let setup = guest::setup_script(vm, &self.run_dir);
        let run = guest::run_script(vm, &self.repo, &self.run_dir);
        fs::write(self.run_dir.join(format!("{name}.setup.sh")), setup)?;
        fs::write(self.run_dir.join(format!("{name}.run.sh")), run)?;
        Ok(())
    }

    fn qemu_command(&self, vm: &VmConfig) -> Command {
        let mut append = format!(
            "console=ttyS0 panic=-1 xtask.run={} xtask.vm={}",
            self.run_dir.display(),
            vm.index
        );
        append.push_str(if vm.verbose {
            " loglevel=7 xtask.verbose=1"
        } else {
            " quiet"
        });
        for s in &self.shares {
            append.push_str(&format!(" xtask.share={}", s.display()));
        }
        for a in &vm.kernel_args {
            append.push(' ');
            append.push_str(a);
        }
        let mut cmd = Command::new("qemu-system-x86_64");
        cmd.args(["-nodefaults", "-no-user-config", "-no-reboot"])
            .args(["-accel", "tcg,thread=multi", "-cpu", "max"])
            .args(["-m", &vm.mem, "-smp", &vm.smp.to_string()])
            .args(["-display", "none", "-serial", "stdio", "-monitor", "none"])
            .arg("-kernel")
            .arg(&self.kernel.vmlinuz)
            .arg("-initrd")
            .arg(&self.kernel.initrd)
            .args(["-append", &append])
            .args(["-netdev", "user,id=n0,restrict=on"])
            .args([
                "-device",
                &format!("virtio-net-pci,netdev=n0,mac={},romfile=", guest::ETH0_MAC),
            ])
            .args([
                "-virtfs",
                "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap",
            ]);
        for (i, s) in self.shares.iter().enumerate() {
            cmd.arg("-virtfs").arg(format!(
                "local,path={},mount_tag=share{i},security_model=none,multidevs=remap",
                s.display()
            ));
        }
        if let Some(link) = &vm.link {
            // The host pulls the link's "cable" through QMP when the guest
            // asks (see `serve_link_request`).
            cmd.arg("-qmp").arg(format!(
                "unix:{},server=on,wait=off",
                self.run_dir.join(format!("{}.qmp", vm.name())).display()
            ));
            let mode = if link.listen { "listen" } else { "connect" };
            cmd.args([
                "-netdev",
                &format!("socket,id=l1,{mode}=127.0.0.1:{}", link.port),
            ])
            .args([
                "-device",
                &format!("virtio-net-pci,netdev=l1,mac={},romfile=", link.mac),
            ]);
        }
        cmd
    }

    fn spawn(&self, vm: &VmConfig, prefixed: bool) -> Result<Running> {
        let mut cmd = self.qemu_command(vm);
        let name = vm.name();
        let log_path = self.run_dir.join(format!("{name}.console.log"));
        let log = fs::File::create(&log_path)
            .with_context(|| format!("cannot create {}", log_path.display()))?;
        let log = Arc::new(Mutex::new(log));
        if vm.verbose {
            step!("$ {}", util::show(&cmd));
        }
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("cannot start qemu-system-x86_64 (run `cargo xtask deps`)")?;
        let last_output = Arc::new(Mutex::new(Instant::now()));
        let prefix = if prefixed {
            format!("[{name}] ")
        } else {
            String::new()
        };
        let console = {
            let stdout = child.stdout.take().context("QEMU has no stdout")?;
            let printer = ConsolePrinter {
                prefix: prefix.clone(),
                verbose: vm.verbose,
                log: Arc::clone(&log),
                last_output: Arc::clone(&last_output),
            };
            thread::spawn(move || printer.run(stdout))
        };
        let stderr = {
            let stderr = child.stderr.take().context("QEMU has no stderr")?;
            let log = Arc::clone(&log);
            let tag = format!("[{name} qemu] ");
            thread::spawn(move || {
                util::for_each_line(stderr, |line| {
                    println!("{tag}{line}");
                    if let Ok(mut f) = log.lock() {
                        let _ = writeln!(f, "{tag}{line}");
                    }
                })
            })
        };
        Ok(Running {
            name,
            child,
            console: Some(console),
            stderr: Some(stderr),
            last_output,
            last_note: Instant::now(),
            status: None,
            log_path,
            link_served: 0,
        })
    }
}

/// Removes the run directories of xtask processes that are gone (kept after failures).
fn prune_run_dirs(dir: &Path) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.strip_prefix("run-") else {
            continue;
        };
        if pid.parse::<u32>().is_ok() && !Path::new("/proc").join(pid).exists() {
            let _ = fs::remove_dir_all(e.path());
        }
    }
}

/// Refuses paths that cannot travel on the kernel command line unquoted.
fn check_cmdline_path(p: &Path) -> Result<()> {
    let s = p.to_string_lossy();
    let ok = s.starts_with('/')
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "/._-+,@%~".contains(c));
    if !ok {
        bail!(
            "the path {s} contains characters that cannot be passed to the VM (allowed: \
             letters, digits and /._-+,@%~); move the checkout or set CARGO_TARGET_DIR"
        );
    }
    Ok(())
}

struct Running {
    name: String,
    child: Child,
    console: Option<JoinHandle<Vec<String>>>,
    stderr: Option<JoinHandle<()>>,
    last_output: Arc<Mutex<Instant>>,
    last_note: Instant,
    status: Option<std::process::ExitStatus>,
    log_path: PathBuf,
    /// Sequence number of the last link request served for this VM.
    link_served: u64,
}

impl Running {
    fn finish(mut self, run_dir: &Path) -> VmOutcome {
        let early = self
            .console
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default();
        if let Some(h) = self.stderr.take() {
            let _ = h.join();
        }
        let status_file = run_dir.join(format!("{}.status", self.name));
        let boot_crash = !status_file.exists()
            && early
                .iter()
                .any(|l| l.contains("Kernel panic") || l.contains("Oops:"));
        let result = match fs::read_to_string(&status_file) {
            Ok(s) => parse_status(s.trim()),
            Err(_) => {
                if !early.is_empty() {
                    println!(
                        "[{}] the VM stopped before its init ran; console:",
                        self.name
                    );
                    for l in &early {
                        println!("[{}]   {l}", self.name);
                    }
                }
                VmResult::NoStatus(match self.status {
                    Some(st) if st.success() => "the VM powered off without a status".into(),
                    Some(st) => format!("QEMU exited with {st}"),
                    None => "QEMU was killed".into(),
                })
            }
        };
        let kernel = command_kernel_messages(&run_dir.join(format!("{}.dmesg", self.name)));
        if !kernel.is_empty() {
            step!("{}: kernel messages while the command ran:", self.name);
            for l in &kernel {
                println!("[{} kernel] {l}", self.name);
            }
        }
        // A crash after init ran ends the VM without a status (`panic=-1`,
        // `-no-reboot`): say so, with the oops, instead of a bare "no result".
        let panic = match (&result, boot_crash) {
            (VmResult::NoStatus(_), false) => fs::read_to_string(&self.log_path)
                .ok()
                .and_then(|log| oops_excerpt(&log)),
            _ => None,
        };
        VmOutcome {
            name: std::mem::take(&mut self.name),
            result,
            console_log: std::mem::take(&mut self.log_path),
            boot_crash,
            panic,
        }
    }
}

impl Drop for Running {
    /// Never leaves a QEMU behind, whatever error path we take.
    fn drop(&mut self) {
        if self.status.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The lines of a saved `dmesg` after init's "command started" marker.
fn command_kernel_messages(dmesg: &Path) -> Vec<String> {
    let text = fs::read_to_string(dmesg).unwrap_or_default();
    let mut lines = text.lines();
    if !lines.any(|l| l.ends_with("xtask: command started")) {
        return Vec::new();
    }
    lines.map(str::to_string).collect()
}

fn parse_status(s: &str) -> VmResult {
    if let Some(code) = s.strip_prefix("exit ") {
        if let Ok(c) = code.trim().parse() {
            return VmResult::Exited(c);
        }
    }
    if let Some(code) = s.strip_prefix("setup-failed ") {
        return VmResult::SetupFailed(code.trim().parse().unwrap_or(1));
    }
    if let Some(msg) = s.strip_prefix("init-failed:") {
        return VmResult::InitFailed(msg.trim().to_string());
    }
    VmResult::NoStatus(format!("unreadable status `{s}`"))
}

/// Waits for all QEMUs, with the deadline, silence notes and the peer-failed grace period.
fn supervise(
    running: &mut [Running],
    deadline: Instant,
    timeout: Duration,
    run_dir: &Path,
) -> Result<()> {
    let mut grace: Option<Instant> = None;
    loop {
        let mut all_done = true;
        for r in running.iter_mut() {
            if r.status.is_some() {
                continue;
            }
            match r.child.try_wait() {
                Ok(Some(st)) => {
                    r.status = Some(st);
                    let failed = !st.success() || !status_file_says_ok(r);
                    if failed && grace.is_none() {
                        grace = Some(Instant::now() + PEER_FAILED_GRACE);
                    }
                }
                Ok(None) => all_done = false,
                Err(e) => bail!("cannot wait for QEMU ({}): {e}", r.name),
            }
        }
        if all_done {
            return Ok(());
        }
        let now = Instant::now();
        if now >= deadline {
            let names: Vec<String> = running
                .iter()
                .filter(|r| r.status.is_none())
                .map(|r| r.name.clone())
                .collect();
            for r in running.iter_mut().filter(|r| r.status.is_none()) {
                let _ = r.child.kill();
            }
            bail!(
                "timed out after {} s; killed QEMU of {} (raise the limit with --timeout SECS; \
                 console logs: {})",
                timeout.as_secs(),
                names.join(", "),
                run_dir.display()
            );
        }
        if grace.is_some_and(|g| now >= g) {
            for r in running.iter_mut().filter(|r| r.status.is_none()) {
                step!(
                    "{}: stopping it, another VM failed {} s ago",
                    r.name,
                    PEER_FAILED_GRACE.as_secs()
                );
                let _ = r.child.kill();
            }
            grace = None;
        }
        for r in running.iter_mut().filter(|r| r.status.is_none()) {
            let quiet_for = r
                .last_output
                .lock()
                .map(|t| t.elapsed())
                .unwrap_or_default();
            if quiet_for >= SILENCE_NOTE && r.last_note.elapsed() >= SILENCE_NOTE {
                step!(
                    "{}: still running, no console output for {} s",
                    r.name,
                    quiet_for.as_secs()
                );
                r.last_note = Instant::now();
            }
        }
        for r in running.iter_mut().filter(|r| r.status.is_none()) {
            serve_link_request(r, run_dir);
        }
        thread::sleep(Duration::from_millis(100));
    }
}

/// Carries out a guest's request to take its link's carrier down or up.
///
/// The guest writes `SEQ down|up` to `<run>/<vm>.link` (`XTASK_LINK_REQUEST`)
/// and waits until `<run>/<vm>.link.done` holds `SEQ ok` (or `SEQ error …`).
/// The host answers with QMP's `set_link`: the virtual NIC loses carrier,
/// as when a cable is pulled — the guest's port goes DOWN while its
/// interface stays configured, unlike `ip link set down`.
fn serve_link_request(r: &mut Running, run_dir: &Path) {
    let req = link_request_path(run_dir, &r.name);
    let Ok(text) = fs::read_to_string(&req) else {
        return;
    };
    let mut f = text.split_whitespace();
    let (Some(Ok(seq)), Some(state)) = (f.next().map(str::parse::<u64>), f.next()) else {
        return;
    };
    if seq <= r.link_served {
        return;
    }
    r.link_served = seq;
    let answer = match state {
        "down" | "up" => {
            let qmp = run_dir.join(format!("{}.qmp", r.name));
            let cmd = format!(
                r#"{{"execute": "set_link", "arguments": {{"name": "l1", "up": {}}}}}"#,
                state == "up"
            );
            match qmp_command(&qmp, &cmd) {
                Ok(()) => format!("{seq} ok\n"),
                Err(e) => format!("{seq} error {e}\n"),
            }
        }
        other => format!("{seq} error unknown link state {other:?}\n"),
    };
    let mut done = req.into_os_string();
    done.push(".done");
    let _ = fs::write(done, answer);
}

/// Where the guest of VM `name` asks for link changes (its
/// `XTASK_LINK_REQUEST`); the host answers in the same path + `.done`.
pub fn link_request_path(run_dir: &Path, name: &str) -> PathBuf {
    run_dir.join(format!("{name}.link"))
}

/// Runs one QMP command (`{"execute": …}`) on a QEMU QMP socket; an error
/// naming QEMU's answer unless it returns successfully.
fn qmp_command(socket: &Path, command: &str) -> Result<()> {
    use std::io::{BufRead, BufReader, Write};
    use std::os::unix::net::UnixStream;
    let s = UnixStream::connect(socket)
        .with_context(|| format!("connecting to QEMU's QMP socket {}", socket.display()))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut w = s.try_clone()?;
    let mut lines = BufReader::new(s).lines();
    // Every answer is one JSON object per line; events may come between.
    let mut answer = || -> Result<String> {
        loop {
            let line = lines.next().context("QEMU closed its QMP socket")??;
            if !line.starts_with("{\"event\"") {
                return Ok(line);
            }
        }
    };
    let greeting = answer()?;
    if !greeting.starts_with("{\"QMP\"") {
        bail!("unexpected QMP greeting: {greeting}");
    }
    for cmd in [r#"{"execute": "qmp_capabilities"}"#, command] {
        writeln!(w, "{cmd}")?;
        let reply = answer()?;
        if !reply.starts_with("{\"return\"") {
            bail!("QEMU answered {cmd} with {reply}");
        }
    }
    Ok(())
}

fn status_file_says_ok(r: &Running) -> bool {
    let Some(dir) = r.log_path.parent() else {
        return false;
    };
    fs::read_to_string(dir.join(format!("{}.status", r.name)))
        .map(|s| parse_status(s.trim()) == VmResult::Exited(0))
        .unwrap_or(false)
}

/// Waits until a listener (the first VM's QEMU) is on 127.0.0.1:port.
fn wait_for_listener(port: u16, running: &mut [Running], deadline: Instant) -> Result<()> {
    let want = format!("0100007F:{port:04X}");
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let tcp = fs::read_to_string("/proc/net/tcp").unwrap_or_default();
        let listening = tcp.lines().skip(1).any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() > 3 && f[1] == want && f[3] == "0A"
        });
        if listening {
            return Ok(());
        }
        for r in running.iter_mut() {
            if let Ok(Some(st)) = r.child.try_wait() {
                r.status = Some(st);
                bail!("{} (QEMU) exited ({st}) before the link was up", r.name);
            }
        }
        let now = Instant::now();
        if now >= until || now >= deadline {
            bail!("nothing listens on 127.0.0.1:{port} for the VM link after 30 s");
        }
        thread::sleep(Duration::from_millis(50));
    }
}

/// The oops in a console log: from the first line that reports a kernel
/// crash (`BUG:`, `Oops:`, `general protection fault`, `Kernel panic`)
/// through the `Kernel panic` line, at most 40 lines, without ANSI codes.
pub fn oops_excerpt(console: &str) -> Option<Vec<String>> {
    let crash = |l: &str| {
        [
            "BUG: ",
            "Oops: ",
            "general protection fault",
            "Kernel panic",
        ]
        .iter()
        .any(|k| l.contains(k))
    };
    let lines: Vec<String> = console.lines().map(util::strip_ansi).collect();
    let start = lines.iter().position(|l| crash(l))?;
    let mut out = Vec::new();
    for l in &lines[start..] {
        let l = l.trim_end();
        if l.is_empty() {
            continue;
        }
        out.push(l.to_string());
        if l.contains("Kernel panic") || out.len() == 40 {
            break;
        }
    }
    Some(out)
}

/// Streams one VM's serial console: raw into the log, cleaned up onto our stdout.
struct ConsolePrinter {
    prefix: String,
    verbose: bool,
    log: Arc<Mutex<fs::File>>,
    last_output: Arc<Mutex<Instant>>,
}

impl ConsolePrinter {
    /// Returns the lines before init started when init never started (they explain why).
    fn run(self, stdout: impl Read) -> Vec<String> {
        let mut early: Vec<String> = Vec::new();
        let mut in_init = self.verbose;
        util::for_each_line(stdout, |raw| {
            if let Ok(mut t) = self.last_output.lock() {
                *t = Instant::now();
            }
            if let Ok(mut f) = self.log.lock() {
                let _ = writeln!(f, "{raw}");
            }
            let line = util::strip_ansi(raw);
            if !in_init {
                if line.starts_with("[init ") {
                    in_init = true;
                    early.clear();
                } else {
                    // firmware and early kernel output: keep quiet unless boot fails
                    if early.len() < 400 && !line.trim().is_empty() {
                        early.push(line);
                    }
                    return;
                }
            }
            if !self.verbose && is_poweroff_noise(&line) {
                return;
            }
            println!("{}{line}", self.prefix);
        });
        if in_init {
            Vec::new()
        } else {
            early
        }
    }
}

/// The kernel's own lines about the power-off that ends every run.
fn is_poweroff_noise(line: &str) -> bool {
    let Some(rest) = line.strip_prefix('[') else {
        return false;
    };
    let Some((stamp, msg)) = rest.split_once(']') else {
        return false;
    };
    let is_stamp = stamp.trim().chars().all(|c| c.is_ascii_digit() || c == '.');
    let msg = msg.trim_start();
    is_stamp && (msg.starts_with("sysrq: ") || msg.starts_with("reboot: "))
}

/// The shell command line of `cargo xtask vm -- ARGS`: one argument is a command line
/// as written (`-- 'cd x && make'`); several are words, each quoted so that the shell
/// sees them as given (`-- sh -c 'cd x && make'`).
pub fn command_line(args: &[String]) -> String {
    match args {
        [one] => one.clone(),
        words => words
            .iter()
            .map(|w| util::quote(w))
            .collect::<Vec<_>>()
            .join(" "),
    }
}

/// `cargo xtask vm`: returns the exit code to use.
pub fn cmd_vm(command: &str, pair_mode: bool, shares: &[PathBuf], opts: &VmOpts) -> Result<i32> {
    let session = Session::with_shares(shares)?;
    let vms: Vec<VmConfig> = if pair_mode {
        pair(command, command, opts)?.to_vec()
    } else {
        vec![VmConfig::new(0, command, opts)]
    };
    let outcomes = session.run(&vms, opts.timeout())?;
    let mut code = 0;
    let mut broken = Vec::new();
    for o in &outcomes {
        step!("{}", o.describe());
        if !matches!(o.result, VmResult::Exited(_)) {
            broken.push(o.name.clone());
        } else if code == 0 {
            code = o.code();
        }
    }
    if !broken.is_empty() {
        bail!(
            "the command did not run in {} (run directory kept: {})",
            broken.join(", "),
            session.run_dir().display()
        );
    }
    if code == 0 {
        session.cleanup();
    } else {
        step!("run directory kept: {}", session.run_dir().display());
    }
    Ok(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A crash after init is reported with its oops (issue #24: a guest
    /// kernel panic is reported as such, and does not hang the run).
    #[test]
    fn oops_excerpt_starts_at_the_crash_and_ends_at_the_panic() {
        let log = "[init 12.0s] running the command\n[faults] 3: loss 2% / send\n\
                   [  301.2] BUG: kernel NULL pointer dereference, address: 0000000000000008\n\
                   [  301.2] #PF: supervisor read access in kernel mode\n\n\
                   [  301.2] RIP: 0010:rxe_init_packet+0x44/0x1d0 [rdma_rxe]\n\
                   [  301.3] Kernel panic - not syncing: Fatal exception in interrupt\n\
                   [  301.3] ---[ end Kernel panic ]---\n";
        let oops = oops_excerpt(log).unwrap();
        assert!(oops[0].contains("BUG: kernel NULL pointer dereference"));
        assert_eq!(oops.len(), 4, "{oops:?}");
        assert!(oops[3].contains("Kernel panic - not syncing"));
        assert_eq!(oops_excerpt("[init 1.0s] running\nall good\n"), None);
        // The run's outcome says so instead of "no result".
        let out = VmOutcome {
            name: "vm1".into(),
            result: VmResult::NoStatus("the VM powered off without a status".into()),
            console_log: "/r/vm1.console.log".into(),
            boot_crash: false,
            panic: Some(oops),
        };
        assert!(out
            .describe()
            .starts_with("vm1: the guest kernel crashed ([  301.2] BUG: kernel NULL pointer"));
    }

    fn opts() -> VmOpts {
        VmOpts {
            mem: "2G".into(),
            smp: 2,
            timeout: Some(10),
            env: vec![("A".into(), "b c".into())],
            verbose: false,
            kernel_args: vec![],
        }
    }

    #[test]
    fn status_parsing() {
        assert_eq!(parse_status("exit 0"), VmResult::Exited(0));
        assert_eq!(parse_status("exit 127"), VmResult::Exited(127));
        assert_eq!(parse_status("setup-failed 1"), VmResult::SetupFailed(1));
        assert_eq!(
            parse_status("init-failed: insmod x failed"),
            VmResult::InitFailed("insmod x failed".into())
        );
        assert!(matches!(parse_status("junk"), VmResult::NoStatus(_)));
    }

    #[test]
    fn pair_addresses() {
        let [a, b] = pair("x", "y", &opts()).unwrap();
        let (la, lb) = (a.link.unwrap(), b.link.unwrap());
        assert!(la.listen && !lb.listen);
        assert_eq!(la.port, lb.port);
        assert_eq!(la.peer_addr, lb.addr);
        assert_eq!(lb.peer_addr, la.addr);
        assert_ne!(la.mac, lb.mac);
    }

    #[test]
    fn poweroff_noise() {
        assert!(is_poweroff_noise("[    5.408158] sysrq: Power Off"));
        assert!(is_poweroff_noise("[    5.413150] reboot: Power down"));
        assert!(!is_poweroff_noise(
            "[init 5.40s] command exited with status 0"
        ));
        assert!(!is_poweroff_noise("reboot: not a kernel line"));
    }

    #[test]
    fn cmdline_paths() {
        assert!(check_cmdline_path(Path::new("/work/main")).is_ok());
        assert!(check_cmdline_path(Path::new("/a b")).is_err());
        assert!(check_cmdline_path(Path::new("rel")).is_err());
    }
}

#[cfg(test)]
mod command_line_tests {
    use super::command_line;

    fn words(w: &[&str]) -> Vec<String> {
        w.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn one_argument_is_a_command_line() {
        assert_eq!(command_line(&words(&["cd x && make"])), "cd x && make");
    }

    #[test]
    fn several_arguments_keep_their_quoting() {
        assert_eq!(
            command_line(&words(&["sh", "-c", "cd x && y 'z'"])),
            r"sh -c 'cd x && y '\''z'\'''"
        );
        assert_eq!(command_line(&words(&["ls", "-l", "/tmp"])), "ls -l /tmp");
    }
}
