//! Feature `dlopen` (issue #22, item 9): a program built with it has no
//! `DT_NEEDED` on libibverbs or librdmacm, starts where they are missing
//! and reports `Error::LibraryNotFound` (naming the package) from its
//! first call, and works as usual where they are present; the same program
//! linked normally does not even start without them.
//!
//! "Missing" is made inside a private mount namespace (`unshare --mount`,
//! root in the VM): `/dev/null` is bind-mounted over the library file the
//! loader would find, so `dlopen` (or the loader) fails on it. Nothing
//! outside that namespace changes.
//!
//! `cargo xtask test` builds `devinfo` and `rping` both with and without
//! the feature and names them in `IBVERBS_TEST_{DEVINFO,RPING}_{DLOPEN,LINKED}`
//! (see `xtask/src/test.rs`, `build_dlopen_contrast`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The example `name` built with (`dlopen == true`) or without the feature.
fn example(name: &str, dlopen: bool) -> PathBuf {
    let var = format!(
        "IBVERBS_TEST_{}_{}",
        name.to_uppercase(),
        if dlopen { "DLOPEN" } else { "LINKED" }
    );
    let path = PathBuf::from(
        std::env::var_os(&var)
            .unwrap_or_else(|| panic!("{var} is not set: run through `cargo xtask test`")),
    );
    assert!(path.is_file(), "{var}={} is missing", path.display());
    path
}

/// The file the dynamic loader resolves `soname` to (`ldconfig -p`).
fn library_file(soname: &str) -> PathBuf {
    let out = ["ldconfig", "/sbin/ldconfig", "/usr/sbin/ldconfig"]
        .iter()
        .find_map(|p| Command::new(p).arg("-p").output().ok())
        .expect("ldconfig -p");
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with(&format!("{soname} (")))
        .unwrap_or_else(|| panic!("{soname} is not in ldconfig's cache:\n{text}"));
    let path = line.rsplit("=> ").next().unwrap().trim();
    Path::new(path)
        .canonicalize()
        .unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Runs `bin args` with `hidden` (library sonames) replaced by `/dev/null`
/// in a private mount namespace.
fn run_hiding(hidden: &[&str], bin: &Path, args: &[&str]) -> Output {
    let mut script = String::new();
    for (i, _) in hidden.iter().enumerate() {
        script.push_str(&format!("mount --bind /dev/null \"${}\" && ", i + 1));
    }
    script.push_str(&format!("shift {} && exec \"$@\"", hidden.len()));
    let mut cmd = Command::new("unshare");
    cmd.args(["--mount", "sh", "-c", &script, "sh"]);
    for soname in hidden {
        cmd.arg(library_file(soname));
    }
    cmd.arg(bin).args(args);
    cmd.output()
        .unwrap_or_else(|e| panic!("cannot run unshare: {e}"))
}

fn describe(out: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The `DT_NEEDED` entries of an ELF file (`readelf -d`).
fn needed(bin: &Path) -> Vec<String> {
    let out = Command::new("readelf")
        .arg("-d")
        .arg(bin)
        .output()
        .expect("readelf");
    assert!(out.status.success(), "readelf -d {}", bin.display());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains("(NEEDED)"))
        .filter_map(|l| Some(l.split('[').nth(1)?.trim_end_matches(']').to_string()))
        .collect()
}

/// Asserts a failure of ours: exit status 1 (not a panic's 101, not a
/// signal, not the loader's 127), no panic message, and `wants` in stderr.
fn assert_reported(out: &Output, wants: &[&str]) {
    let all = describe(out);
    assert_eq!(out.status.code(), Some(1), "{all}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{all}");
    for w in wants {
        assert!(err.contains(w), "stderr lacks {w:?}: {all}");
    }
}

/// Asserts the dynamic loader refused to start the program for `soname`.
fn assert_loader_refused(out: &Output, soname: &str) {
    let all = describe(out);
    assert_eq!(out.status.code(), Some(127), "{all}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("error while loading shared libraries") && err.contains(soname),
        "{all}"
    );
}

#[test]
#[ignore = "needs an RDMA device"]
fn dlopen_builds_do_not_link_rdma_core() {
    for name in ["devinfo", "rping"] {
        let dl = needed(&example(name, true));
        assert!(
            !dl.iter()
                .any(|n| n.starts_with("libibverbs") || n.starts_with("librdmacm")),
            "{name} built with dlopen needs {dl:?}"
        );
        let linked = needed(&example(name, false));
        assert!(
            linked.iter().any(|n| n == "libibverbs.so.1"),
            "{name} built without dlopen needs {linked:?}"
        );
    }
    let linked = needed(&example("rping", false));
    assert!(linked.iter().any(|n| n == "librdmacm.so.1"), "{linked:?}");
}

#[test]
#[ignore = "needs an RDMA device"]
fn dlopen_build_lists_the_devices() {
    let out = Command::new(example("devinfo", true))
        .arg("-l")
        .output()
        .expect("devinfo");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", describe(&out));
    let devices: Vec<String> = std::fs::read_dir("/sys/class/infiniband")
        .expect("/sys/class/infiniband")
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(!devices.is_empty());
    for d in &devices {
        assert!(
            text.contains(d.as_str()),
            "{d} not listed: {}",
            describe(&out)
        );
    }
}

#[test]
#[ignore = "needs an RDMA device"]
fn dlopen_build_without_libibverbs_names_the_package() {
    let out = run_hiding(&["libibverbs.so.1"], &example("devinfo", true), &["-l"]);
    assert_reported(
        &out,
        &["cannot load libibverbs.so.1", "libibverbs1", "rdma-core"],
    );
}

#[test]
#[ignore = "needs an RDMA device"]
fn dlopen_contrast_linked_build_does_not_start_without_libibverbs() {
    let out = run_hiding(&["libibverbs.so.1"], &example("devinfo", false), &["-l"]);
    assert_loader_refused(&out, "libibverbs.so.1");
}

#[test]
#[ignore = "needs an RDMA device"]
fn dlopen_build_without_librdmacm_names_the_package() {
    let args = ["-c", "-a", "127.0.0.1", "-C", "1"];
    let out = run_hiding(&["librdmacm.so.1"], &example("rping", true), &args);
    assert_reported(
        &out,
        &["cannot load librdmacm.so.1", "librdmacm1", "rdma-core"],
    );
    // librdmacm needs libibverbs: with both missing, libibverbs is named.
    let out = run_hiding(
        &["libibverbs.so.1", "librdmacm.so.1"],
        &example("rping", true),
        &args,
    );
    assert_reported(&out, &["cannot load libibverbs.so.1", "libibverbs1"]);
    let out = run_hiding(&["librdmacm.so.1"], &example("rping", false), &args);
    assert_loader_refused(&out, "librdmacm.so.1");
}
