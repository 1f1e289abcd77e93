//! The Debian packages the workspace, its tests and the SoftRoCE VMs need.

use std::collections::BTreeSet;
use std::process::{Command, Stdio};

use anyhow::{bail, Result};

use crate::step;
use crate::util;

/// Everything `cargo xtask vm/test/demo` needs on a Debian 12 host.
pub const PACKAGES: &[&str] = &[
    "qemu-system-x86",
    "busybox-static",
    "cpio",
    "kmod",
    "xz-utils",
    "rdma-core",
    "ibverbs-providers",
    "ibverbs-utils",
    "libibverbs-dev",
    "librdmacm-dev",
    "libclang-dev",
    "perftest",
    "rdmacm-utils",
    "iproute2",
    "pkg-config",
    // the TrueType font `cargo xtask bench` draws its plot's text with
    "fonts-dejavu-core",
    // `cargo xtask instr`: callgrind counts instructions, strace kernel calls, gcc builds the
    // C twin of the opcost probe
    "valgrind",
    "strace",
    "gcc",
    // `cargo xtask faults --capture`: packet traces of failing rows
    "tcpdump",
    // `cargo xtask test`: a newer rdma-core's headers for the bindings check
    "curl",
    "ca-certificates",
];

/// Which of `packages` are not installed, per `dpkg-query`.
pub fn missing(packages: &[&str]) -> Result<Vec<String>> {
    let out = Command::new("dpkg-query")
        .arg("-W")
        .arg("-f=${Package} ${Status}\n")
        .args(packages)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output();
    let out = match out {
        Ok(o) => o,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => bail!(
            "`dpkg-query` was not found: xtask supports Debian/Ubuntu hosts only; install these \
             packages by other means: {}",
            packages.join(" ")
        ),
        Err(e) => bail!("cannot run dpkg-query: {e}"),
    };
    // dpkg-query exits 1 when some package is unknown; its stdout still lists the known ones.
    let installed: BTreeSet<&str> = std::str::from_utf8(&out.stdout)
        .unwrap_or("")
        .lines()
        .filter(|l| l.ends_with(" install ok installed"))
        .filter_map(|l| l.split_whitespace().next())
        .map(|name| name.split(':').next().unwrap_or(name))
        .collect();
    Ok(packages
        .iter()
        .filter(|p| !installed.contains(**p))
        .map(|p| p.to_string())
        .collect())
}

/// Checks the packages and installs the missing ones when running as root.
pub fn ensure() -> Result<()> {
    let missing = missing(PACKAGES)?;
    if missing.is_empty() {
        step!("deps: all {} Debian packages are installed", PACKAGES.len());
        return Ok(());
    }
    step!("deps: missing Debian packages: {}", missing.join(" "));
    if !util::is_root() {
        println!("sudo apt-get install -y {}", missing.join(" "));
        bail!("missing Debian packages; install them with the command above, then retry");
    }
    util::run_visible(Command::new("apt-get").arg("update"))?;
    util::run_visible(
        Command::new("apt-get")
            .env("DEBIAN_FRONTEND", "noninteractive")
            .args(["install", "-y", "--no-install-recommends"])
            .args(&missing),
    )?;
    let still = self::missing(PACKAGES)?;
    if !still.is_empty() {
        bail!(
            "apt-get finished but these packages are still not installed: {}",
            still.join(" ")
        );
    }
    step!("deps: installed {}", missing.join(" "));
    Ok(())
}
