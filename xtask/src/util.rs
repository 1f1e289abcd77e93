//! Small helpers: progress output with elapsed time, running commands, quoting, hashing.

use std::fmt;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::Instant;

use anyhow::{bail, Context, Result};

/// The package of the example programs, the C-compatible tools and the
/// harness's data movers (`fault_peer`, `soak_peer`). Its examples and
/// binaries land in the workspace's target directory.
pub const TOOLS_PACKAGE: &str = "rdma-verbs-tools";
/// Its directory in the repository (`tools/examples/`, `tools/src/`).
pub const TOOLS_DIR: &str = "tools";

static CLOCK: OnceLock<(Instant, &'static str)> = OnceLock::new();

/// Starts the progress clock. `inner` marks the copy of xtask that runs inside a VM.
pub fn init_clock(inner: bool) {
    let _ = CLOCK.set((Instant::now(), if inner { "xtask-in-vm" } else { "xtask" }));
}

fn clock() -> &'static (Instant, &'static str) {
    CLOCK.get_or_init(|| (Instant::now(), "xtask"))
}

pub fn elapsed_secs() -> f64 {
    clock().0.elapsed().as_secs_f64()
}

/// Prints one progress line: `[xtask 12.3s] message`.
pub fn progress(args: fmt::Arguments) {
    let (start, tag) = clock();
    println!("[{tag} {:.1}s] {args}", start.elapsed().as_secs_f64());
}

#[macro_export]
macro_rules! step {
    ($($arg:tt)*) => { $crate::util::progress(format_args!($($arg)*)) };
}

/// A shell-like rendering of a command, for messages.
pub fn show(cmd: &Command) -> String {
    let mut s = String::new();
    for (k, v) in cmd.get_envs() {
        if let Some(v) = v {
            s.push_str(&format!(
                "{}={} ",
                k.to_string_lossy(),
                quote(&v.to_string_lossy())
            ));
        }
    }
    s.push_str(&quote(&cmd.get_program().to_string_lossy()));
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&quote(&a.to_string_lossy()));
    }
    s
}

/// Quotes a string for POSIX sh (only when needed).
pub fn quote(s: &str) -> String {
    let plain = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "/._-+=:,@%".contains(c));
    if plain {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

fn spawn_error(cmd: &Command, err: std::io::Error) -> anyhow::Error {
    let prog = cmd.get_program().to_string_lossy().into_owned();
    if err.kind() == std::io::ErrorKind::NotFound {
        anyhow::anyhow!("`{prog}` was not found: run `cargo xtask deps` (or install it)")
    } else {
        anyhow::anyhow!("cannot start `{}`: {err}", show(cmd))
    }
}

/// Runs a command with its output visible; fails on a non-zero exit.
pub fn run_visible(cmd: &mut Command) -> Result<()> {
    crate::step!("$ {}", show(cmd));
    let status = cmd
        .stdin(Stdio::null())
        .status()
        .map_err(|e| spawn_error(cmd, e))?;
    check_status(cmd, status)
}

pub fn check_status(cmd: &Command, status: ExitStatus) -> Result<()> {
    if !status.success() {
        bail!("`{}` failed ({status})", show(cmd));
    }
    Ok(())
}

/// Runs a command and returns its stdout; stderr is included in the error on failure.
pub fn capture(cmd: &mut Command) -> Result<String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| spawn_error(cmd, e))?;
    if !out.status.success() {
        bail!(
            "`{}` failed ({}): {}",
            show(cmd),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    String::from_utf8(out.stdout).with_context(|| format!("`{}` printed non-UTF-8", show(cmd)))
}

/// Runs a command whose stdout is streamed line by line to `on_line` (stderr is inherited).
pub fn run_streaming(cmd: &mut Command, mut on_line: impl FnMut(&str)) -> Result<ExitStatus> {
    crate::step!("$ {}", show(cmd));
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| spawn_error(cmd, e))?;
    let stdout = child.stdout.take().context("child has no stdout")?;
    for_each_line(stdout, |l| on_line(l));
    child
        .wait()
        .with_context(|| format!("waiting for `{}`", show(cmd)))
}

/// Calls `f` for every line of `r` (lossy UTF-8, without the line end and `\r`).
pub fn for_each_line(r: impl Read, mut f: impl FnMut(&str)) {
    let mut r = BufReader::new(r);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match r.read_until(b'\n', &mut buf) {
            Ok(0) | Err(_) => break,
            Ok(_) => {
                while matches!(buf.last(), Some(b'\n' | b'\r')) {
                    buf.pop();
                }
                f(&String::from_utf8_lossy(&buf));
            }
        }
    }
}

/// Removes ANSI escape sequences and other control characters (but keeps tabs).
pub fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            match chars.peek() {
                Some('[') => {
                    chars.next();
                    // CSI: parameters and intermediates, then one final byte in @..~
                    for c2 in chars.by_ref() {
                        if ('@'..='~').contains(&c2) {
                            break;
                        }
                    }
                }
                Some(_) => {
                    chars.next();
                }
                None => {}
            }
        } else if c == '\t' || !c.is_control() {
            out.push(c);
        }
    }
    out
}

/// 64-bit FNV-1a: a stable hash for cache keys.
pub fn fnv1a64(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for &b in *p {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        // separator so that ("ab","c") and ("a","bc") differ
        h ^= 0xff;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

pub fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .stdin(Stdio::null())
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

/// The `cargo` that runs us (cargo sets `CARGO`), else `cargo` from PATH.
pub fn cargo() -> Command {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    if let Ok(root) = crate::repo_root() {
        cmd.current_dir(root);
    }
    cmd
}

/// The workspace's target directory (honours CARGO_TARGET_DIR and config), canonicalized.
pub fn target_dir() -> Result<PathBuf> {
    let out = capture(
        cargo()
            .args(["metadata", "--format-version", "1", "--no-deps"])
            .stderr(Stdio::piped()),
    )?;
    let v: serde_json::Value =
        serde_json::from_str(&out).context("cannot parse `cargo metadata` output")?;
    let dir = v["target_directory"]
        .as_str()
        .context("`cargo metadata` gave no target_directory")?;
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {dir}"))?;
    Path::new(dir)
        .canonicalize()
        .with_context(|| format!("cannot resolve {dir}"))
}

/// Builds examples of [`TOOLS_PACKAGE`] (`what`: `--examples` or
/// `--example NAME`) and returns each example's executable by name.
pub fn build_examples(
    release: bool,
    what: &[&str],
) -> anyhow::Result<std::collections::BTreeMap<String, std::path::PathBuf>> {
    let manifest = crate::repo_root()?.join(TOOLS_DIR).join("Cargo.toml");
    let mut cmd = cargo();
    cmd.args(["build", "-p", TOOLS_PACKAGE]).args(what);
    if release {
        cmd.arg("--release");
    }
    cmd.arg("--message-format=json-render-diagnostics");
    let mut out = std::collections::BTreeMap::new();
    let status = run_streaming(&mut cmd, |l| {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(l) else {
            println!("{l}");
            return;
        };
        if v["reason"] != "compiler-artifact"
            || v["manifest_path"].as_str() != Some(&*manifest.to_string_lossy())
        {
            return;
        }
        let is_example = v["target"]["kind"]
            .as_array()
            .is_some_and(|k| k.iter().any(|k| k == "example"));
        if let (true, Some(name), Some(exe)) = (
            is_example,
            v["target"]["name"].as_str(),
            v["executable"].as_str(),
        ) {
            out.insert(name.to_string(), std::path::PathBuf::from(exe));
        }
    })?;
    check_status(&cmd, status)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting() {
        assert_eq!(quote("abc/d-e.f"), "abc/d-e.f");
        assert_eq!(quote("a b"), "'a b'");
        assert_eq!(quote("it's"), r"'it'\''s'");
        assert_eq!(quote(""), "''");
    }

    #[test]
    fn ansi() {
        assert_eq!(strip_ansi("\u{1b}[32mok\u{1b}[0m."), "ok.");
        assert_eq!(strip_ansi("\u{1b}c\u{1b}[?7lSeaBIOS"), "SeaBIOS");
        assert_eq!(strip_ansi("a\tb\r"), "a\tb");
    }

    #[test]
    fn fnv_is_stable() {
        assert_eq!(fnv1a64(&[b"ab", b"c"]), fnv1a64(&[b"ab", b"c"]));
        assert_ne!(fnv1a64(&[b"ab", b"c"]), fnv1a64(&[b"a", b"bc"]));
    }
}
