//! Example programs as child processes: bounded, killed and reaped on drop,
//! their output collected for the failure message.

use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Device and GID options for an example program: the test device, and GID
/// index 1 (the IPv4 RoCE v2 GID) inside the VM; elsewhere the program picks.
pub fn device_args() -> Vec<String> {
    let mut v = Vec::new();
    if let Ok(d) = std::env::var("IBVERBS_TEST_DEVICE") {
        v.extend(["-d".into(), d]);
    }
    if std::env::var("IBVERBS_TEST_EXPECT_GID1").is_ok() {
        v.extend(["-g".into(), "1".into()]);
    }
    v
}

/// A running program; killed (and reaped) on drop unless it finished.
pub struct Running {
    label: String,
    child: Option<Child>,
    out: Option<JoinHandle<Vec<u8>>>,
    err: Option<JoinHandle<Vec<u8>>>,
}

/// A finished program.
pub struct Finished {
    pub label: String,
    /// `None`: killed after the time bound.
    pub status: Option<ExitStatus>,
    pub stdout: String,
    pub stderr: String,
}

fn drain(mut r: impl Read + Send + 'static) -> JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = r.read_to_end(&mut v);
        v
    })
}

/// Starts `prog` with `args`, stdin closed, stdout and stderr collected.
pub fn spawn(prog: &Path, args: &[String]) -> Running {
    spawn_command(Command::new(prog), prog, args)
}

/// [`spawn`] through a real `fork()`: the standard library starts a
/// program with `posix_spawn` (a `vfork`-style clone sharing the parent's
/// memory, so no page becomes copy-on-write) unless a `pre_exec` hook is
/// set; this sets an empty one, so the parent's whole address space is
/// copied-on-write until the child's `exec` (the fork-safety tests).
pub fn spawn_forked(prog: &Path, args: &[String]) -> Running {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(prog);
    // SAFETY: the hook does nothing (so nothing that is unsafe between
    // fork and exec).
    unsafe { cmd.pre_exec(|| Ok(())) };
    spawn_command(cmd, prog, args)
}

fn spawn_command(mut cmd: Command, prog: &Path, args: &[String]) -> Running {
    let name = prog.file_name().map_or_else(
        || prog.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    let label = format!("{name} {}", args.join(" "));
    let mut child = cmd
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {label}: {e}"));
    let out = drain(child.stdout.take().unwrap());
    let err = drain(child.stderr.take().unwrap());
    Running {
        label,
        child: Some(child),
        out: Some(out),
        err: Some(err),
    }
}

impl Running {
    /// Waits up to `bound` (then kills the process) and collects its output.
    pub fn finish(mut self, bound: Duration) -> Finished {
        let mut child = self.child.take().unwrap();
        let deadline = Instant::now() + bound;
        let status = loop {
            match child.try_wait() {
                Ok(Some(s)) => break Some(s),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    break None;
                }
            }
        };
        let text = |h: Option<JoinHandle<Vec<u8>>>| {
            String::from_utf8_lossy(&h.unwrap().join().unwrap_or_default()).into_owned()
        };
        Finished {
            label: std::mem::take(&mut self.label),
            status,
            stdout: text(self.out.take()),
            stderr: text(self.err.take()),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Finished {
    /// Label, exit status and both outputs, for an assertion message.
    pub fn describe(&self) -> String {
        format!(
            "--- {} ({}) stdout:\n{}\n--- stderr:\n{}",
            self.label,
            self.status
                .map_or("killed after the time bound".into(), |s| s.to_string()),
            self.stdout,
            self.stderr
        )
    }

    pub fn success(&self) -> bool {
        self.status.is_some_and(|s| s.success())
    }

    pub fn assert_success(&self) {
        assert!(self.success(), "{} failed\n{}", self.label, self.describe());
    }

    /// Exited non-zero with `message` in its stderr.
    pub fn assert_failure(&self, message: &str) {
        assert!(
            self.status.is_some_and(|s| !s.success()),
            "{} should have failed\n{}",
            self.label,
            self.describe()
        );
        assert!(
            self.stderr.contains(message),
            "{}: expected {message:?} in stderr\n{}",
            self.label,
            self.describe()
        );
    }
}
