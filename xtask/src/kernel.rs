//! The guest kernel and initramfs: a Debian 6.12 kernel package, unpacked (never installed),
//! and a busybox initramfs with the SoftRoCE / 9p / virtio-net modules.
//!
//! Cache layout under `<target>/xtask/vm/<kernel-version>/`:
//! `vmlinuz`, `modules/<name>.ko` + `modules/order` (load order), `initramfs-<hash>.cpio.gz`
//! where the hash covers the init script (which embeds the module order).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};

use crate::step;
use crate::util;

/// Modules to load, in this order (dependencies found by `modinfo` are added before them).
pub const MODULES: &[&str] = &[
    "netfs",
    "9pnet",
    "9pnet_virtio",
    "9p",
    "failover",
    "net_failover",
    "virtio_net",
    "veth",
    "sch_netem",
    "crc32_generic",
    "ib_core",
    "ib_uverbs",
    "udp_tunnel",
    "ip6_udp_tunnel",
    "rdma_rxe",
    "configfs",
    "ib_cm",
    "iw_cm",
    "rdma_cm",
    "rdma_ucm",
];

/// Loaded first when the kernel has them as modules (built in on Debian's 6.12, not on 6.1).
pub const OPTIONAL_MODULES: &[&str] = &["virtio_pci"];

/// Which kernel package to use when `XTASK_KERNEL_PACKAGE` is not set.
const KERNEL_SEARCH: &str = r"^linux-image-6\.12\.[0-9]+\+deb[0-9]+-amd64(-unsigned)?$";

/// The version in a Debian kernel package's name
/// (`linux-image-6.12.117+deb12-amd64` → `6.12.117`, `linux-image-6.1.0-56-amd64`
/// → `6.1.0-56`), to tell apart the reports of runs on different kernels.
pub fn package_version(package: &str) -> Option<&str> {
    let v = package.trim().strip_prefix("linux-image-")?;
    let v = v.strip_suffix("-unsigned").unwrap_or(v);
    let v = v.strip_suffix("-amd64").unwrap_or(v);
    let v = &v[..v.find('+').unwrap_or(v.len())];
    let numeric = v.starts_with(|c: char| c.is_ascii_digit())
        && v.bytes()
            .all(|b| b.is_ascii_digit() || b == b'.' || b == b'-');
    numeric.then_some(v)
}

pub struct KernelImage {
    pub version: String,
    pub vmlinuz: PathBuf,
    pub initrd: PathBuf,
}

/// Returns a kernel + initramfs, downloading and building what is not cached.
pub fn prepare(target_dir: &Path) -> Result<KernelImage> {
    let cache_root = target_dir.join("xtask").join("vm");
    fs::create_dir_all(&cache_root)
        .with_context(|| format!("cannot create {}", cache_root.display()))?;
    remove_stale_downloads(&cache_root);
    let (package, dir) = match std::env::var("XTASK_KERNEL_PACKAGE") {
        Ok(p) if !p.trim().is_empty() => {
            let p = p.trim().to_string();
            step!("kernel: using XTASK_KERNEL_PACKAGE={p}");
            let dir = cache_root.join(cache_name(&p));
            (p, dir)
        }
        _ => match resolve_package()? {
            Some(p) => {
                let dir = cache_root.join(cache_name(&p));
                (p, dir)
            }
            None => match newest_cached(&cache_root) {
                Some(dir) => {
                    step!(
                        "kernel: apt knows no 6.12 kernel; using the cached {}",
                        dir.display()
                    );
                    (String::new(), dir)
                }
                None => bail!(
                    "apt-cache found no package matching `{KERNEL_SEARCH}`; run `apt-get update` \
                     (as root) or set XTASK_KERNEL_PACKAGE to a linux-image package name"
                ),
            },
        },
    };
    let order = if let Some(order) = cached_modules(&dir) {
        order
    } else {
        if package.is_empty() {
            bail!("the cached kernel in {} is incomplete", dir.display());
        }
        download(&package, &dir)?
    };
    let script = init_script(&order);
    let hash = util::fnv1a64(&[script.as_bytes()]);
    let initrd = dir.join(format!("initramfs-{hash:016x}.cpio.gz"));
    if initrd.is_file() {
        step!("kernel: cached {}", dir.display());
    } else {
        build_initramfs(&dir, &order, &script, &initrd)?;
    }
    let version = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    Ok(KernelImage {
        version,
        vmlinuz: dir.join("vmlinuz"),
        initrd,
    })
}

/// Removes `<name>.download-<pid>` folders of xtask processes that died while downloading.
fn remove_stale_downloads(cache_root: &Path) {
    for e in fs::read_dir(cache_root).into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if let Some((_, pid)) = name.rsplit_once(".download-") {
            if !Path::new("/proc").join(pid).exists() {
                let _ = fs::remove_dir_all(e.path());
            }
        }
    }
}

/// `linux-image-6.12.117+deb12-amd64-unsigned` → `6.12.117+deb12-amd64`.
fn cache_name(package: &str) -> String {
    let s = package.strip_prefix("linux-image-").unwrap_or(package);
    let s = s.strip_suffix("-unsigned").unwrap_or(s);
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "+-._".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect()
}

fn apt_search() -> Result<Vec<String>> {
    let out = util::capture(
        Command::new("apt-cache")
            .args(["search", "--names-only", KERNEL_SEARCH])
            .stderr(Stdio::piped()),
    )?;
    Ok(out
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect())
}

fn resolve_package() -> Result<Option<String>> {
    let mut names = apt_search()?;
    if names.is_empty() && util::is_root() {
        step!("kernel: apt-cache knows no 6.12 kernel; running apt-get update");
        util::run_visible(Command::new("apt-get").arg("update"))?;
        names = apt_search()?;
    }
    let best = pick_newest(&names);
    if let Some(b) = &best {
        step!("kernel: newest Debian 6.12 kernel package is {b}");
    }
    Ok(best)
}

/// Highest 6.12.N; at equal N the signed (plain) package is preferred over `-unsigned`.
fn pick_newest(names: &[String]) -> Option<String> {
    names
        .iter()
        .filter_map(|n| {
            let rest = n.strip_prefix("linux-image-6.12.")?;
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            let patch: u64 = digits.parse().ok()?;
            Some(((patch, !n.ends_with("-unsigned")), n.clone()))
        })
        .max_by(|a, b| a.0.cmp(&b.0))
        .map(|(_, n)| n)
}

fn newest_cached(cache_root: &Path) -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = fs::read_dir(cache_root)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| cached_modules(p).is_some())
        .collect();
    dirs.sort();
    dirs.pop()
}

/// The module load order of a complete cache directory.
fn cached_modules(dir: &Path) -> Option<Vec<String>> {
    if !dir.join("vmlinuz").is_file() {
        return None;
    }
    let roots = fs::read_to_string(dir.join("modules").join("roots")).ok()?;
    if roots.trim() != MODULES.join(" ") {
        return None;
    }
    let order = fs::read_to_string(dir.join("modules").join("order")).ok()?;
    let order: Vec<String> = order.split_whitespace().map(str::to_string).collect();
    let all_there = order
        .iter()
        .all(|m| dir.join("modules").join(format!("{m}.ko")).is_file());
    all_there.then_some(order)
}

/// Downloads and unpacks the kernel package into `dir`; returns the module load order.
fn download(package: &str, dir: &Path) -> Result<Vec<String>> {
    let name = dir.file_name().unwrap_or_default().to_string_lossy();
    let scratch = dir.with_file_name(format!("{name}.download-{}", std::process::id()));
    let _ = fs::remove_dir_all(&scratch);
    fs::create_dir_all(&scratch).with_context(|| format!("cannot create {}", scratch.display()))?;
    let result = download_into(package, dir, &scratch);
    let _ = fs::remove_dir_all(&scratch);
    result
}

fn download_into(package: &str, dir: &Path, scratch: &Path) -> Result<Vec<String>> {
    step!("kernel: downloading {package} (about 100 MB)");
    let mut apt = Command::new("apt-get");
    apt.current_dir(scratch).args(["download", "-q"]);
    if util::is_root() {
        // root's download lands in a folder the sandbox user `_apt` cannot write
        apt.args(["-o", "APT::Sandbox::User=root"]);
    }
    util::run_visible(apt.arg(package))
        .context("downloading the kernel package failed (is `apt-get update` needed?)")?;
    let deb = fs::read_dir(scratch)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|e| e == "deb"))
        .context("apt-get download produced no .deb")?;
    step!("kernel: unpacking {}", deb.display());
    let root = scratch.join("root");
    util::run_visible(Command::new("dpkg").arg("-x").arg(&deb).arg(&root))?;
    fs::remove_file(&deb).ok();

    let vmlinuz = fs::read_dir(root.join("boot"))
        .context("the package has no boot/ folder")?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("vmlinuz-"))
        })
        .context("the package has no boot/vmlinuz-*")?;
    let moddir = fs::read_dir(root.join("lib").join("modules"))
        .context("the package has no lib/modules/")?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.join("kernel").is_dir())
        .context("the package has no lib/modules/<version>/kernel/")?;
    let mut files = BTreeMap::new();
    index_modules(&moddir.join("kernel"), &mut files)?;

    let roots: Vec<&str> = OPTIONAL_MODULES
        .iter()
        .copied()
        .filter(|m| files.contains_key(&normalize(m)))
        .chain(MODULES.iter().copied())
        .collect();
    let order = resolve_order(&roots, |m| {
        let path = files.get(m).with_context(|| {
            format!(
                "kernel module `{m}` is not in {} (wrong kernel package?)",
                moddir.display()
            )
        })?;
        let deps = util::capture(Command::new("modinfo").args(["-F", "depends"]).arg(path))?;
        Ok(deps
            .trim()
            .split(',')
            .filter(|d| !d.is_empty())
            .map(normalize)
            .collect())
    })?;
    step!("kernel: module load order: {}", order.join(" "));

    let staging = scratch.join("cache");
    let mods = staging.join("modules");
    fs::create_dir_all(&mods)?;
    for m in &order {
        let src = &files[m];
        let dst = mods.join(format!("{m}.ko"));
        if src.extension().is_some_and(|e| e == "xz") {
            let out = fs::File::create(&dst)?;
            let status = Command::new("xz")
                .arg("-dc")
                .arg(src)
                .stdin(Stdio::null())
                .stdout(out)
                .status()
                .context("cannot run xz (install xz-utils)")?;
            if !status.success() {
                bail!("xz -dc {} failed ({status})", src.display());
            }
        } else {
            fs::copy(src, &dst)?;
        }
    }
    fs::write(mods.join("order"), order.join("\n") + "\n")?;
    fs::write(mods.join("roots"), MODULES.join(" ") + "\n")?;
    fs::copy(&vmlinuz, staging.join("vmlinuz"))?;
    fs::write(staging.join("package"), format!("{package}\n"))?;
    if dir.exists() {
        fs::remove_dir_all(dir).with_context(|| format!("cannot remove {}", dir.display()))?;
    }
    fs::rename(&staging, dir).with_context(|| format!("cannot create {}", dir.display()))?;
    Ok(order)
}

fn normalize(name: &str) -> String {
    name.trim().replace('-', "_")
}

/// Maps module name → file for every `*.ko` / `*.ko.xz` below `dir`.
fn index_modules(dir: &Path, out: &mut BTreeMap<String, PathBuf>) -> Result<()> {
    for e in fs::read_dir(dir).with_context(|| format!("cannot read {}", dir.display()))? {
        let path = e?.path();
        if path.is_dir() {
            index_modules(&path, out)?;
            continue;
        }
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        let stem = name
            .strip_suffix(".ko.xz")
            .or_else(|| name.strip_suffix(".ko"));
        if let Some(stem) = stem {
            out.insert(normalize(stem), path.clone());
        }
    }
    Ok(())
}

/// Orders `roots` so every module comes after its dependencies (depth first, roots' order kept).
fn resolve_order(
    roots: &[&str],
    mut deps_of: impl FnMut(&str) -> Result<Vec<String>>,
) -> Result<Vec<String>> {
    fn visit(
        m: &str,
        deps_of: &mut dyn FnMut(&str) -> Result<Vec<String>>,
        done: &mut BTreeSet<String>,
        active: &mut Vec<String>,
        order: &mut Vec<String>,
    ) -> Result<()> {
        if done.contains(m) {
            return Ok(());
        }
        if active.iter().any(|a| a == m) {
            bail!("module dependency cycle: {} -> {m}", active.join(" -> "));
        }
        active.push(m.to_string());
        for d in deps_of(m)? {
            visit(&d, deps_of, done, active, order)?;
        }
        active.pop();
        done.insert(m.to_string());
        order.push(m.to_string());
        Ok(())
    }
    let mut done = BTreeSet::new();
    let mut order = Vec::new();
    for r in roots {
        visit(
            &normalize(r),
            &mut deps_of,
            &mut done,
            &mut Vec::new(),
            &mut order,
        )?;
    }
    Ok(order)
}

/// The initramfs `/init`. Per-run parameters come from the kernel command line:
/// `xtask.run=<dir>` (run directory, a host path inside a share), `xtask.vm=<index>`,
/// `xtask.share=<host path>` (repeated; mounted read-write at the same path, in order
/// share0, share1, …), `xtask.verbose=1`.
/// The run directory holds `vm<N>.setup.sh` and `vm<N>.run.sh`, executed in the chroot;
/// the outcome is written to `vm<N>.status` as `exit <code>`, `setup-failed <code>` or
/// `init-failed: <reason>`.
pub fn init_script(modules: &[String]) -> String {
    INIT_TEMPLATE.replace("@MODULES@", &modules.join(" "))
}

const INIT_TEMPLATE: &str = r#"#!/bin/busybox sh
# xtask SoftRoCE VM init
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null
RUN=; VM=0; SHARES=; VERBOSE=
for w in $(cat /proc/cmdline); do
  case "$w" in
    xtask.run=*) RUN="${w#xtask.run=}" ;;
    xtask.vm=*) VM="${w#xtask.vm=}" ;;
    xtask.share=*) SHARES="$SHARES ${w#xtask.share=}" ;;
    xtask.verbose=1) VERBOSE=1 ;;
  esac
done
say() { echo "[init $(cut -d' ' -f1 /proc/uptime)s] $*"; }
off() { sync; echo o > /proc/sysrq-trigger; sleep 60; }
status() { [ -n "$RUN" ] && [ -d "/mnt$RUN" ] && echo "$*" > "/mnt$RUN/vm$VM.status"; sync; }
fail() { say "FATAL: $*"; status "init-failed: $*"; off; }
[ -n "$VERBOSE" ] || dmesg -n 1
say "loading kernel modules"
for m in @MODULES@; do
  insmod "/lib/modules/$m.ko" || fail "insmod $m failed"
done
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000,ro hostroot /mnt \
  || fail "cannot mount the host root over 9p"
mount -t tmpfs -o mode=1777 tmpfs /mnt/tmp || fail "cannot mount /tmp"
mount -t tmpfs -o mode=755 tmpfs /mnt/run || fail "cannot mount /run"
mount -t proc proc /mnt/proc || fail "cannot mount /proc"
mount -t sysfs sysfs /mnt/sys || fail "cannot mount /sys"
mount -t devtmpfs devtmpfs /mnt/dev || fail "cannot mount /dev"
mkdir -p /mnt/dev/pts /mnt/dev/shm
mount -t devpts -o ptmxmode=0666 devpts /mnt/dev/pts || fail "cannot mount /dev/pts"
mount -t tmpfs -o mode=1777 tmpfs /mnt/dev/shm || fail "cannot mount /dev/shm"
i=0
for s in $SHARES; do
  mkdir -p "/mnt$s" 2>/dev/null
  mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 "share$i" "/mnt$s" \
    || fail "cannot mount share$i at $s"
  i=$((i+1))
done
[ -n "$RUN" ] && [ -f "/mnt$RUN/vm$VM.setup.sh" ] || fail "no setup script vm$VM.setup.sh in '$RUN'"
say "setting up network and rxe"
if chroot /mnt /bin/sh "$RUN/vm$VM.setup.sh" </dev/null; then
  say "running the command"
  echo "xtask: command started" > /dev/kmsg
  chroot /mnt /bin/sh "$RUN/vm$VM.run.sh" </dev/null
  rc=$?
  say "command exited with status $rc"
  status "exit $rc"
else
  rc=$?
  say "setup failed with status $rc"
  status "setup-failed $rc"
fi
dmesg > "/mnt$RUN/vm$VM.dmesg" 2>/dev/null
off
"#;

/// Writes the initramfs: busybox, /init, the modules and /dev/console, as gzip'ed newc cpio.
fn build_initramfs(dir: &Path, order: &[String], script: &str, out: &Path) -> Result<()> {
    step!("kernel: building {}", out.display());
    let busybox = Path::new("/bin/busybox");
    let busybox = fs::read(busybox).context("cannot read /bin/busybox (install busybox-static)")?;
    let mut cpio = Cpio::default();
    for d in [
        "bin",
        "dev",
        "proc",
        "sys",
        "mnt",
        "tmp",
        "lib",
        "lib/modules",
    ] {
        cpio.dir(d);
    }
    cpio.char_dev("dev/console", 5, 1);
    cpio.file("bin/busybox", 0o755, &busybox);
    cpio.file("init", 0o755, script.as_bytes());
    for m in order {
        let path = dir.join("modules").join(format!("{m}.ko"));
        let data = fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
        cpio.file(&format!("lib/modules/{m}.ko"), 0o644, &data);
    }
    let bytes = cpio.finish();
    let tmp = out.with_extension(format!("tmp-{}", std::process::id()));
    let file =
        fs::File::create(&tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
    let mut gzip = Command::new("gzip")
        .args(["-6", "-n", "-c"])
        .stdin(Stdio::piped())
        .stdout(file)
        .spawn()
        .context("cannot run gzip")?;
    gzip.stdin
        .take()
        .context("gzip has no stdin")?
        .write_all(&bytes)
        .context("writing to gzip")?;
    let status = gzip.wait()?;
    if !status.success() {
        bail!("gzip failed ({status})");
    }
    fs::rename(&tmp, out)?;
    // older initramfs images of this kernel are stale now
    for e in fs::read_dir(dir)?.flatten() {
        let p = e.path();
        let name = p.file_name().unwrap_or_default().to_string_lossy();
        if name.starts_with("initramfs-") && p != out {
            fs::remove_file(&p).ok();
        }
    }
    step!(
        "kernel: initramfs is {} KiB ({} KiB unpacked)",
        fs::metadata(out)?.len() / 1024,
        bytes.len() / 1024
    );
    Ok(())
}

/// A minimal writer of the "newc" cpio format (no privileges needed for device nodes).
#[derive(Default)]
struct Cpio {
    buf: Vec<u8>,
    ino: u32,
}

impl Cpio {
    fn entry(&mut self, name: &str, mode: u32, rdev: (u32, u32), data: &[u8]) {
        self.ino += 1;
        let nlink = if mode & 0o170000 == 0o040000 { 2 } else { 1 };
        let fields = [
            self.ino,
            mode,
            0, // uid
            0, // gid
            nlink,
            0, // mtime: reproducible
            u32::try_from(data.len()).expect("initramfs member larger than 4 GiB"),
            0, // devmajor
            0, // devminor
            rdev.0,
            rdev.1,
            u32::try_from(name.len() + 1).expect("name too long"),
            0, // check
        ];
        self.buf.extend_from_slice(b"070701");
        for f in fields {
            self.buf.extend_from_slice(format!("{f:08x}").as_bytes());
        }
        self.buf.extend_from_slice(name.as_bytes());
        self.buf.push(0);
        self.pad();
        self.buf.extend_from_slice(data);
        self.pad();
    }

    fn pad(&mut self) {
        while self.buf.len() % 4 != 0 {
            self.buf.push(0);
        }
    }

    fn dir(&mut self, name: &str) {
        self.entry(name, 0o040755, (0, 0), &[]);
    }

    fn file(&mut self, name: &str, perm: u32, data: &[u8]) {
        self.entry(name, 0o100000 | perm, (0, 0), data);
    }

    fn char_dev(&mut self, name: &str, major: u32, minor: u32) {
        self.entry(name, 0o020600, (major, minor), &[]);
    }

    fn finish(mut self) -> Vec<u8> {
        self.entry("TRAILER!!!", 0, (0, 0), &[]);
        self.buf
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn package_versions() {
        let v = package_version;
        assert_eq!(v("linux-image-6.12.117+deb12-amd64"), Some("6.12.117"));
        assert_eq!(v("linux-image-6.1.0-56-amd64"), Some("6.1.0-56"));
        assert_eq!(
            v("linux-image-6.12.117+deb12-amd64-unsigned"),
            Some("6.12.117")
        );
        assert_eq!(v("linux-image-amd64"), None);
        assert_eq!(v("vmlinuz"), None);
    }

    #[test]
    fn newest_kernel_package() {
        let names: Vec<String> = [
            "linux-image-6.12.99+deb12-amd64",
            "linux-image-6.12.117+deb12-amd64-unsigned",
            "linux-image-6.12.117+deb12-amd64",
            "linux-image-6.12.113+deb12-amd64",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(
            pick_newest(&names).as_deref(),
            Some("linux-image-6.12.117+deb12-amd64")
        );
        assert_eq!(
            cache_name("linux-image-6.12.117+deb12-amd64-unsigned"),
            "6.12.117+deb12-amd64"
        );
        assert_eq!(pick_newest(&[]), None);
    }

    #[test]
    fn module_order_puts_dependencies_first() {
        let deps = |m: &str| -> Result<Vec<String>> {
            Ok(match m {
                "rdma_rxe" => vec!["ib_uverbs".into(), "udp_tunnel".into()],
                "ib_uverbs" => vec!["ib_core".into()],
                _ => vec![],
            })
        };
        let order = resolve_order(&["udp_tunnel", "rdma_rxe", "ib_core"], deps).unwrap();
        assert_eq!(order, ["udp_tunnel", "ib_core", "ib_uverbs", "rdma_rxe"]);
    }

    #[test]
    fn cpio_is_aligned_and_terminated() {
        let mut c = Cpio::default();
        c.dir("bin");
        c.file("init", 0o755, b"#!/bin/sh\n");
        let bytes = c.finish();
        assert_eq!(bytes.len() % 4, 0);
        assert!(bytes.starts_with(b"070701"));
        let tail = String::from_utf8_lossy(&bytes[bytes.len() - 16..]).into_owned();
        assert!(tail.contains("TRAILER!!!"));
    }
}
