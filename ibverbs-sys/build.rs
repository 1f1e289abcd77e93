//! Links rdma-core's libibverbs (and librdmacm with the `rdmacm` feature).
//! The bindings are committed (`src/bindings/`, generated from rdma-core
//! 44's headers) and the `static inline` verbs are Rust (`src/inline.rs`),
//! so a build needs neither headers, libclang nor a C compiler: only the
//! runtime library, or nothing with the `dlopen` feature.
//!
//! Where the library is looked for, in order:
//! 1. `IBVERBS_LIB_DIR` (a directory holding `libibverbs.so.1`);
//! 2. pkg-config (`libibverbs`, present with the development package);
//! 3. the usual library directories and the loader's cache (`ldconfig -p`).
//!
//! Nothing is linked with `dlopen` or with `DOCS_RS` set. A missing library
//! is one `cargo::error` line naming the package to install.
//!
//! Feature `bindgen` (maintainers): also runs bindgen over the installed
//! headers (`IBVERBS_INCLUDE_DIR`, else pkg-config) into `OUT_DIR`, for the
//! tests that compare it with the committed bindings, and compiles the
//! headers' inline verbs from C (bindgen's `wrap_static_fns`, suffix `__c`)
//! for the tests that compare them with the Rust ones. With
//! `IBVERBS_SYS_UPDATE_BINDINGS` set it writes the committed bindings
//! (`regenerate-bindings.sh`).

use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// Reads an environment variable and tells cargo to rebuild when it changes.
fn env(name: &str) -> Option<OsString> {
    println!("cargo:rerun-if-env-changed={name}");
    std::env::var_os(name)
}

fn feature(name: &str) -> bool {
    std::env::var_os(format!("CARGO_FEATURE_{name}")).is_some()
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    #[cfg(feature = "bindgen")]
    maintainer::generate();
    if env("DOCS_RS").is_some() || feature("DLOPEN") {
        return;
    }
    link("ibverbs", "libibverbs1", "libibverbs");
    if feature("RDMACM") {
        link("rdmacm", "librdmacm1", "librdmacm");
    }
}

/// Links `lib<name>`: by its runtime file `lib<name>.so.1` when that is all
/// there is (the runtime package has no `lib<name>.so`), else by `-l<name>`.
fn link(name: &str, debian: &str, rpm: &str) {
    let so = format!("lib{name}.so");
    let so1 = format!("lib{name}.so.1");
    let cross = std::env::var("TARGET").ok() != std::env::var("HOST").ok();
    let found = match env("IBVERBS_LIB_DIR") {
        Some(dir) => {
            let dir = PathBuf::from(dir);
            if !dir.join(&so).exists() && !dir.join(&so1).exists() {
                println!(
                    "cargo::error=IBVERBS_LIB_DIR={} holds neither {so} nor {so1}",
                    dir.display()
                );
                return;
            }
            Some((dir, true))
        }
        None => pkg_config_dir(name)
            .map(|d| (d, true))
            .or_else(|| system_dir(&so1).map(|d| (d, false))),
    };
    let Some((dir, search)) = found else {
        if cross {
            // The target's libraries are not on this host: leave it to the
            // linker (set IBVERBS_LIB_DIR to check).
            println!("cargo:rustc-link-lib=dylib={name}");
            return;
        }
        println!(
            "cargo::error={so1} (rdma-core) was not found: install it \
             (Debian/Ubuntu: apt-get install {debian}; Fedora/RHEL: dnf install {rpm}), \
             set IBVERBS_LIB_DIR to its directory, or enable the `dlopen` feature"
        );
        return;
    };
    if search {
        println!("cargo:rustc-link-search=native={}", dir.display());
    }
    if dir.join(&so).exists() {
        println!("cargo:rustc-link-lib=dylib={name}");
    } else {
        println!("cargo:rustc-link-lib=dylib:+verbatim={so1}");
    }
}

/// The library directory pkg-config names (`lib<name>.pc`), if it names
/// one: for a system directory it names none, and [`system_dir`] finds it.
fn pkg_config_dir(name: &str) -> Option<PathBuf> {
    let lib = pkg_config::Config::new()
        .cargo_metadata(false)
        .print_system_libs(false)
        .probe(&format!("lib{name}"))
        .ok()?;
    lib.link_paths.into_iter().next()
}

/// A directory the linker searches by default that holds `file`, or one the
/// loader's cache names.
fn system_dir(file: &str) -> Option<PathBuf> {
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let multiarch = format!("{arch}-linux-gnu");
    let dirs = [
        format!("/usr/lib/{multiarch}"),
        format!("/lib/{multiarch}"),
        "/usr/lib64".into(),
        "/lib64".into(),
        "/usr/lib".into(),
        "/lib".into(),
        "/usr/local/lib64".into(),
        "/usr/local/lib".into(),
    ];
    if let Some(d) = dirs.iter().map(Path::new).find(|d| d.join(file).exists()) {
        return Some(d.to_path_buf());
    }
    let out = std::process::Command::new("ldconfig")
        .arg("-p")
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout).lines().find_map(|l| {
        let (lhs, path) = l.split_once(" => ")?;
        let path = Path::new(path.trim());
        (lhs.split_whitespace().next()? == file && path.exists())
            .then(|| path.parent().map(Path::to_path_buf))?
    })
}

#[cfg(feature = "bindgen")]
mod maintainer {
    use super::{env, feature};
    use std::fs;
    use std::path::{Path, PathBuf};

    /// The committed bindings' file for the enabled features.
    pub fn bindings_name() -> &'static str {
        if feature("RDMACM") {
            "verbs_rdmacm.rs"
        } else {
            "verbs.rs"
        }
    }

    /// Headers to read: `IBVERBS_INCLUDE_DIR`, else pkg-config's; and the
    /// rdma-core release they belong to, when known.
    fn headers() -> (Vec<PathBuf>, Option<String>) {
        if let Some(dir) = env("IBVERBS_INCLUDE_DIR") {
            let dir = PathBuf::from(dir);
            assert!(
                dir.join("infiniband/verbs.h").exists(),
                "IBVERBS_INCLUDE_DIR={} has no infiniband/verbs.h",
                dir.display()
            );
            let release = env("IBVERBS_RELEASE").map(|v| v.to_string_lossy().into_owned());
            return (vec![dir], release);
        }
        let mut config = pkg_config::Config::new();
        config.cargo_metadata(false).print_system_libs(false);
        let verbs = config.probe("libibverbs").unwrap_or_else(|e| {
            panic!("feature `bindgen` needs rdma-core's headers (libibverbs-dev): {e}")
        });
        let mut paths = verbs.include_paths;
        if feature("RDMACM") {
            let cm = config.probe("librdmacm").unwrap_or_else(|e| {
                panic!("features `bindgen` and `rdmacm` need librdmacm-dev: {e}")
            });
            paths.extend(cm.include_paths);
        }
        // pkg-config says `1.14.44.0`: ABI 1.14 of rdma-core 44.0.
        let release = verbs.version.split('.').nth(2).map(str::to_string);
        (paths, release)
    }

    fn builder(manifest_dir: &Path, includes: &[PathBuf]) -> bindgen::Builder {
        let mut builder = bindgen::Builder::default()
            .header(manifest_dir.join("wrapper.h").to_string_lossy())
            .clang_args(includes.iter().map(|p| format!("-I{}", p.display())))
            .allowlist_function("_{0,3}ibv_.*")
            .allowlist_type("_{0,3}ibv_.*")
            .allowlist_var("IBV_.*")
            // The extended context behind `ibv_context` (`verbs_get_ctx`): the
            // static inline verbs reach its ops through it.
            .allowlist_type("verbs_context")
            // verbs_api.h defines some IBV_* macros as aliases of these kernel
            // ABI enumerators (bindgen cannot evaluate such macros; lib.rs
            // re-defines them).
            .allowlist_var("IB_UVERBS_.*")
            .allowlist_type(
                "ib_uverbs_(access_flags|query_port_flags|advise_mr_advice|advise_mr_flag)",
            )
            // `ibv_query_port` is a macro over the static inline
            // `___ibv_query_port`; the exported symbol of that name is the
            // compat entry that leaves the extended port fields zero.
            // `ibv_reg_mr{,_iova}` are macros that route
            // IBV_ACCESS_OPTIONAL_RANGE to `ibv_reg_mr_iova2`. lib.rs defines
            // all three over the inlines so Rust sees what C sees, and
            // src/bindings/extra.rs declares the exported symbols.
            .blocklist_function("ibv_query_port")
            .blocklist_function("ibv_reg_mr")
            .blocklist_function("ibv_reg_mr_iova")
            // Values the device returns are plain integer constants, never
            // Rust enums (an unknown value in a Rust enum is undefined
            // behaviour).
            .default_enum_style(bindgen::EnumVariation::Consts)
            // Flag sets become newtypes with bit operators.
            .bitfield_enum("ibv_.*_flags")
            .bitfield_enum("ibv_.*_mask")
            .bitfield_enum("ibv_access_flags")
            .use_core()
            .prepend_enum_name(false)
            .derive_default(true)
            .derive_debug(true)
            .impl_debug(true)
            .generate_comments(true)
            .layout_tests(true);
        if feature("RDMACM") {
            builder = builder
                .clang_arg("-DIBVERBS_SYS_RDMACM")
                .allowlist_function("rdma_.*")
                .allowlist_type("rdma_.*")
                .allowlist_var("RDMA_.*");
        }
        builder
    }

    pub fn generate() {
        let manifest_dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap());
        let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").unwrap());
        println!("cargo:rerun-if-changed=wrapper.h");
        let (includes, release) = headers();
        println!(
            "cargo:rustc-env=RDMA_VERBS_SYS_BINDINGS={}",
            bindings_name()
        );
        println!(
            "cargo:rustc-env=RDMA_VERBS_SYS_HEADERS_RELEASE={}",
            release.as_deref().unwrap_or("unknown")
        );

        // What bindgen makes of these headers today (tests/bindings.rs).
        let generated = builder(&manifest_dir, &includes)
            .generate()
            .unwrap_or_else(|e| panic!("bindgen could not read infiniband/verbs.h: {e}"));
        let path = out_dir.join("generated.rs");
        generated.write_to_file(&path).unwrap();
        if env("IBVERBS_SYS_UPDATE_BINDINGS").is_some() {
            let committed = manifest_dir.join("src/bindings").join(bindings_name());
            fs::copy(&path, &committed)
                .unwrap_or_else(|e| panic!("writing the bindings {committed:?}: {e}"));
        }

        // The headers' own inline verbs, compiled from C under `<name>__c`
        // (tests/inline_diff.rs). With `dlopen` nothing of rdma-core may be
        // linked, so they are left out.
        if feature("DLOPEN") {
            return;
        }
        let shim = builder(&manifest_dir, &includes)
            .wrap_static_fns(true)
            .wrap_static_fns_suffix("__c")
            .wrap_static_fns_path(out_dir.join("c_inlines"))
            .generate()
            .unwrap_or_else(|e| panic!("bindgen (inline verbs): {e}"));
        fs::write(
            out_dir.join("c_inlines.rs"),
            extern_blocks_with(&shim.to_string(), "__c\""),
        )
        .unwrap();
        let mut cc = cc::Build::new();
        cc.file(out_dir.join("c_inlines.c"))
            .include(&manifest_dir)
            .includes(&includes)
            .warnings(false);
        if feature("RDMACM") {
            cc.define("IBVERBS_SYS_RDMACM", None);
        }
        cc.compile("rdma_verbs_sys_c_inlines");
    }

    /// The `extern "C" { … }` blocks of bindgen's output that contain
    /// `needle` (bindgen writes one block per function).
    fn extern_blocks_with(bindings: &str, needle: &str) -> String {
        let opener = "extern \"C\" {";
        let mut out = String::new();
        let mut rest = bindings;
        while let Some(start) = rest.find(opener) {
            let body = &rest[start + opener.len()..];
            let mut depth = 1;
            let mut end = body.len();
            for (i, c) in body.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            end = i;
                            break;
                        }
                    }
                    _ => {}
                }
            }
            let block = &body[..end];
            if block.contains(needle) {
                out.push_str("unsafe extern \"C\" {");
                out.push_str(block);
                out.push_str("}\n");
            }
            rest = &body[end..];
        }
        out
    }
}
