//! `cargo xtask demo`: build the tools' examples and run the demo inside a VM.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{bail, Result};

use crate::util::{self, quote};
use crate::vm::{self, VmConfig};
use crate::{step, VmOpts};

/// The shell command of the demo, given the built examples (name → executable).
///
/// With `rc_pingpong`: a server in the background, then a client to `localhost` (traffic takes
/// rxe's loopback); fails if either side fails. Otherwise the one-QP `loopback` example.
pub fn demo_command(examples: &BTreeMap<String, PathBuf>) -> Result<String> {
    if let Some(pp) = examples.get("rc_pingpong") {
        let pp = quote(&pp.to_string_lossy());
        return Ok(format!(
            "echo '--- rc_pingpong server (background) and client'; \
             {pp} -d rxe0 -g 1 & server=$!; sleep 1; \
             {pp} -d rxe0 -g 1 localhost; client=$?; \
             wait $server; server_rc=$?; \
             echo \"--- client exited with $client, server with $server_rc\"; \
             [ $client -eq 0 ] && [ $server_rc -eq 0 ]"
        ));
    }
    if let Some(lb) = examples.get("loopback") {
        return Ok(format!("{} --device rxe0", quote(&lb.to_string_lossy())));
    }
    let built: Vec<&str> = examples.keys().map(String::as_str).collect();
    bail!(
        "neither the `rc_pingpong` nor the `loopback` example exists yet (built examples: {}); \
         add tools/examples/loopback.rs or tools/examples/rc_pingpong.rs",
        if built.is_empty() {
            "none".to_string()
        } else {
            built.join(", ")
        }
    )
}

/// Builds the examples of the tools' package; returns name → executable.
pub fn cmd_demo(release: bool, opts: &VmOpts) -> Result<i32> {
    step!(
        "demo: building the examples ({})",
        if release { "release" } else { "debug" }
    );
    let examples = util::build_examples(release, &["--examples"])?;
    let command = demo_command(&examples)?;
    let session = vm::Session::new()?;
    let outcome = session
        .run(&[VmConfig::new(0, &command, opts)], opts.timeout())?
        .pop()
        .ok_or_else(|| anyhow::anyhow!("no VM outcome"))?;
    step!("{}", outcome.describe());
    match outcome.result {
        vm::VmResult::Exited(0) => {
            session.cleanup();
            Ok(0)
        }
        vm::VmResult::Exited(c) => {
            step!("run directory kept: {}", session.run_dir().display());
            Ok(c)
        }
        _ => bail!(
            "the demo did not run; run directory kept: {}",
            session.run_dir().display()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefers_rc_pingpong() {
        let mut ex = BTreeMap::new();
        assert!(demo_command(&ex).is_err());
        ex.insert(
            "loopback".to_string(),
            PathBuf::from("/t/debug/examples/loopback"),
        );
        assert_eq!(
            demo_command(&ex).unwrap(),
            "/t/debug/examples/loopback --device rxe0"
        );
        ex.insert(
            "rc_pingpong".to_string(),
            PathBuf::from("/t/debug/examples/rc_pingpong"),
        );
        let cmd = demo_command(&ex).unwrap();
        assert!(cmd.contains("/t/debug/examples/rc_pingpong -d rxe0 -g 1 localhost"));
    }
}
