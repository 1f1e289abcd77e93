//! `cargo xtask fuzz`: every cargo-fuzz target of `fuzz/` for a time budget each.
//!
//! cargo-fuzz drives libFuzzer with AddressSanitizer; its flags are nightly-only, so the runs
//! set `RUSTC_BOOTSTRAP=1` to let the stable toolchain take them (`fuzz/` is a workspace of
//! its own, so normal builds never see them). cargo-fuzz is installed when missing. New
//! inputs go to `target/xtask/fuzz/corpus/<target>` (kept between runs); the committed seeds
//! in `fuzz/corpus/<target>` are only read. A crash (panic, failed assertion, sanitizer
//! report, timeout) leaves its input in `fuzz/artifacts/<target>/` and fails the run. Each
//! target's libFuzzer output is in `target/xtask/fuzz/<target>.log`.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{bail, Context, Result};

use crate::step;
use crate::util;

/// Seconds per target when `cargo xtask test` runs the fuzzers.
pub const TEST_SECONDS: u64 = 5;

/// What one target's run came to.
struct Outcome {
    target: String,
    ok: bool,
    /// `123456 runs, cov 81, corpus 5` or what went wrong.
    summary: String,
}

/// `cargo xtask fuzz`: runs `targets` (all when empty) for `seconds` each; false if any
/// crashed or did not build.
pub fn cmd_fuzz(seconds: u64, targets: &[String]) -> Result<bool> {
    let outcomes = run_all(seconds, targets)?;
    let failed = outcomes.iter().filter(|o| !o.ok).count();
    println!();
    for o in &outcomes {
        let mark = if o.ok { "ok    " } else { "FAILED" };
        println!("fuzz: {mark} {:<16} {}", o.target, o.summary);
    }
    println!(
        "fuzz: {} targets, {} failed, {seconds} s each",
        outcomes.len(),
        failed
    );
    Ok(failed == 0)
}

/// For `cargo xtask test`, after the host tests: every target for [`TEST_SECONDS`]. Adds a
/// problem per failure (a target that crashed or did not build, or cargo-fuzz missing) and
/// returns how many there were.
pub fn after_host_tests(problems: &mut Vec<String>) -> u64 {
    step!("host: fuzzing, {TEST_SECONDS} s per target (skip with --no-fuzz)");
    match run_all(TEST_SECONDS, &[]) {
        Ok(outcomes) => {
            let mut failed = 0;
            for o in &outcomes {
                step!("fuzz: {}: {}", o.target, o.summary);
                if !o.ok {
                    failed += 1;
                    problems.push(format!("fuzz: {}: {}", o.target, o.summary));
                }
            }
            failed
        }
        Err(e) => {
            problems.push(format!("fuzz: {e:#} (skip with --no-fuzz)"));
            1
        }
    }
}

fn run_all(seconds: u64, only: &[String]) -> Result<Vec<Outcome>> {
    let root = crate::repo_root()?;
    let fuzz_dir = root.join("fuzz");
    if !fuzz_dir.join("Cargo.toml").is_file() {
        bail!("{} has no Cargo.toml", fuzz_dir.display());
    }
    ensure_cargo_fuzz()?;
    let all = list_targets()?;
    for t in only {
        if !all.contains(t) {
            bail!("no fuzz target `{t}` (targets: {})", all.join(", "));
        }
    }
    let targets: Vec<String> = all
        .into_iter()
        .filter(|t| only.is_empty() || only.contains(t))
        .collect();
    if targets.is_empty() {
        bail!(
            "`cargo fuzz list` found no targets in {}",
            fuzz_dir.display()
        );
    }
    let work = util::target_dir()?.join("xtask").join("fuzz");
    fs::create_dir_all(&work).with_context(|| format!("cannot create {}", work.display()))?;
    step!(
        "fuzz: {} targets, {seconds} s each: {}",
        targets.len(),
        targets.join(", ")
    );
    targets
        .iter()
        .map(|t| run_target(t, seconds, &fuzz_dir, &work))
        .collect()
}

/// `cargo fuzz …` from the repository root, with the nightly flags allowed on stable.
fn cargo_fuzz() -> Command {
    let mut cmd = util::cargo();
    cmd.arg("fuzz").env("RUSTC_BOOTSTRAP", "1");
    cmd
}

fn ensure_cargo_fuzz() -> Result<()> {
    let present = cargo_fuzz()
        .arg("--version")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !present {
        step!("fuzz: cargo-fuzz is missing; installing it");
        util::run_visible(util::cargo().args(["install", "cargo-fuzz", "--locked"]))
            .context("cannot install cargo-fuzz")?;
    }
    Ok(())
}

fn list_targets() -> Result<Vec<String>> {
    let out = util::capture(cargo_fuzz().arg("list").stderr(Stdio::piped()))?;
    Ok(out
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect())
}

fn run_target(target: &str, seconds: u64, fuzz_dir: &Path, work: &Path) -> Result<Outcome> {
    let corpus = work.join("corpus").join(target);
    fs::create_dir_all(&corpus).with_context(|| format!("cannot create {}", corpus.display()))?;
    let seeds = fuzz_dir.join("corpus").join(target);
    let log_path = work.join(format!("{target}.log"));
    let log =
        File::create(&log_path).with_context(|| format!("cannot create {}", log_path.display()))?;
    let mut cmd = cargo_fuzz();
    cmd.args(["run", target]).arg(&corpus);
    if seeds.is_dir() {
        cmd.arg(&seeds);
    }
    cmd.args([
        "--".to_string(),
        format!("-max_total_time={seconds}"),
        "-timeout=10".to_string(),
        "-rss_limit_mb=2048".to_string(),
    ])
    .stdin(Stdio::null())
    .stdout(log.try_clone()?)
    .stderr(log);
    step!("fuzz: {target} (build, then {seconds} s)");
    let start = Instant::now();
    let status = cmd
        .status()
        .with_context(|| format!("cannot start `{}`", util::show(&cmd)))?;
    let text = fs::read_to_string(&log_path).unwrap_or_default();
    let secs = start.elapsed().as_secs_f64();
    if status.success() {
        return Ok(Outcome {
            target: target.to_string(),
            ok: true,
            summary: format!("{} ({secs:.0} s with the build)", stats(&text)),
        });
    }
    // Show the report: from the panic or sanitizer error on, else the end of the log (a
    // compile error).
    eprintln!("---- {} ----", log_path.display());
    let lines: Vec<&str> = text.lines().collect();
    let from = lines
        .iter()
        .position(|l| l.contains("panicked at") || l.contains("==ERROR:"))
        .unwrap_or(lines.len().saturating_sub(40));
    for l in lines.iter().skip(from).take(40) {
        eprintln!("{l}");
    }
    eprintln!("----");
    let summary = match artifact(&text) {
        Some(input) => format!(
            "crashed ({status}); input saved as {}; reproduce: \
             RUSTC_BOOTSTRAP=1 cargo fuzz run {target} {}",
            input.display(),
            input.display()
        ),
        None if text.contains("error: could not compile") || text.contains("error[E") => {
            format!("does not build; see {}", log_path.display())
        }
        None => format!("failed ({status}); see {}", log_path.display()),
    };
    Ok(Outcome {
        target: target.to_string(),
        ok: false,
        summary,
    })
}

/// `Done 935472 runs in 11 second(s)` and the last `cov: … corp: …` status of a libFuzzer log,
/// as `935472 runs, cov 109, corpus 27`.
fn stats(log: &str) -> String {
    let runs = log
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("Done ")?.split_whitespace().next())
        .unwrap_or("?");
    let last = log
        .lines()
        .rev()
        .find(|l| l.contains(" cov: "))
        .unwrap_or("");
    let field = |name: &str| {
        let mut words = last.split_whitespace();
        words.find(|w| *w == name)?;
        words
            .next()
            .map(|v| v.split('/').next().unwrap_or(v).to_string())
    };
    format!(
        "{runs} runs, cov {}, corpus {}",
        field("cov:").unwrap_or_else(|| "?".into()),
        field("corp:").unwrap_or_else(|| "?".into())
    )
}

/// The crashing input libFuzzer saved (`Test unit written to <path>`).
fn artifact(log: &str) -> Option<PathBuf> {
    log.lines()
        .find_map(|l| l.split_once("Test unit written to ").map(|(_, p)| p.trim()))
        .map(PathBuf::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libfuzzer_logs() {
        let log = "INFO: Seed: 1\n\
            #262144\tpulse  cov: 109 ft: 190 corp: 27/390b lim: 2551 exec/s: 87381 rss: 185Mb\n\
            #935472\tDONE   cov: 110 ft: 190 corp: 28/390b lim: 4096 exec/s: 85042 rss: 517Mb\n\
            Done 935472 runs in 11 second(s)\n";
        assert_eq!(stats(log), "935472 runs, cov 110, corpus 28");
        assert_eq!(stats(""), "? runs, cov ?, corpus ?");
        let crash = "==1== ERROR: libFuzzer: deadly signal\n\
            artifact_prefix='/r/fuzz/artifacts/x/'; Test unit written to /r/fuzz/artifacts/x/crash-33ea\n";
        assert_eq!(
            artifact(crash),
            Some(PathBuf::from("/r/fuzz/artifacts/x/crash-33ea"))
        );
        assert_eq!(artifact(log), None);
    }
}
