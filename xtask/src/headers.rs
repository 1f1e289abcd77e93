//! A newer rdma-core's headers, for checking the committed bindings (from
//! rdma-core 44) against a later release: Debian's development packages of
//! rdma-core 56.1 (trixie), pinned by SHA-256, unpacked under the target
//! directory once.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::step;
use crate::util;

/// The rdma-core release of [`PACKAGES`].
pub const NEWER_RELEASE: &str = "56";

/// Debian's packages (file in the pool, SHA-256).
const PACKAGES: &[(&str, &str)] = &[
    (
        "libibverbs-dev_56.1-1_amd64.deb",
        "3833759895e1435663a0bc2f9d9d82feb467f8cf8f19afb57c75b5c1f6bb1f1a",
    ),
    (
        "librdmacm-dev_56.1-1_amd64.deb",
        "5a45116bb33cc529a8ca15093906c5604db3ae7f555995d0e9decfd24c6663ee",
    ),
];

/// Where each package is looked for, in order: the archive's pool, then the
/// snapshot archive (which keeps every file Debian ever published).
const MIRRORS: &[&str] = &[
    "http://deb.debian.org/debian/pool/main/r/rdma-core/",
    "https://snapshot.debian.org/archive/debian/20250901T000000Z/pool/main/r/rdma-core/",
];

/// The include directory of rdma-core [`NEWER_RELEASE`] (holding
/// `infiniband/verbs.h` and `rdma/rdma_cma.h`), downloading it if needed.
pub fn newer_include_dir() -> Result<PathBuf> {
    let dir = util::target_dir()?.join("xtask").join("rdma-core-56.1");
    let include = dir.join("usr").join("include");
    if include.join("infiniband/verbs.h").is_file() && include.join("rdma/rdma_cma.h").is_file() {
        return Ok(include);
    }
    step!("headers: rdma-core 56.1 (Debian's development packages)");
    let scratch = dir.with_extension(format!("download-{}", std::process::id()));
    let _ = fs::remove_dir_all(&scratch);
    fs::create_dir_all(&scratch)?;
    let result = fetch_into(&scratch, &dir);
    let _ = fs::remove_dir_all(&scratch);
    result?;
    Ok(include)
}

fn fetch_into(scratch: &Path, dir: &Path) -> Result<()> {
    let root = scratch.join("root");
    for (file, sha256) in PACKAGES {
        let deb = scratch.join(file);
        let got = MIRRORS.iter().any(|m| {
            Command::new("curl")
                .args(["-sSfL", "--retry", "2", "-o"])
                .arg(&deb)
                .arg(format!("{m}{file}"))
                .status()
                .is_ok_and(|s| s.success())
        });
        if !got {
            bail!("cannot download {file} from {MIRRORS:?}");
        }
        let sum = util::capture(Command::new("sha256sum").arg(&deb))?;
        if sum.split_whitespace().next() != Some(*sha256) {
            bail!("{file}: SHA-256 {sum} is not the pinned {sha256}");
        }
        util::run_visible(Command::new("dpkg").arg("-x").arg(&deb).arg(&root))?;
    }
    let _ = fs::remove_dir_all(dir);
    fs::rename(&root, dir).with_context(|| format!("cannot move the headers to {}", dir.display()))
}
