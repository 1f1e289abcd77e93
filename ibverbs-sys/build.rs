//! Finds rdma-core's libibverbs (and librdmacm with the `rdmacm` feature),
//! generates bindings with bindgen and compiles a C shim that makes every
//! `static inline` verb of `verbs.h` callable.
//!
//! Lookup order, in the style of openssl-sys / libgit2-sys:
//! 1. `IBVERBS_INCLUDE_DIR` / `IBVERBS_LIB_DIR` (both, or the include dir alone
//!    when the library is on the default linker path);
//! 2. pkg-config (`libibverbs`, and `librdmacm` with the feature);
//! 3. otherwise a panic that says what to install.
//!
//! With `DOCS_RS` set nothing is probed or linked: the committed snapshot in
//! `src/snapshot/` is used so that documentation builds without rdma-core.
//! With `IBVERBS_SYS_UPDATE_SNAPSHOT` set the freshly generated bindings are
//! also written back into that snapshot (see `regenerate-snapshot.sh`).

#[path = "build/dlgen.rs"]
mod dlgen;

use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};

/// Reads an environment variable and tells cargo to rebuild when it changes.
fn env(name: &str) -> Option<OsString> {
    println!("cargo:rerun-if-env-changed={name}");
    std::env::var_os(name)
}

struct Found {
    include_paths: Vec<PathBuf>,
    link_paths: Vec<PathBuf>,
    version: Option<String>,
}

fn rdmacm_enabled() -> bool {
    std::env::var_os("CARGO_FEATURE_RDMACM").is_some()
}

fn dlopen_enabled() -> bool {
    std::env::var_os("CARGO_FEATURE_DLOPEN").is_some()
}

fn snapshot_name() -> &'static str {
    if rdmacm_enabled() {
        "verbs_rdmacm.rs"
    } else {
        "verbs.rs"
    }
}

fn main() {
    let manifest_dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap());
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").unwrap());
    println!("cargo:rerun-if-changed=wrapper.h");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=build/dlgen.rs");

    let snapshot = manifest_dir.join("src/snapshot").join(snapshot_name());
    // Lets this crate's tests compare the generated bindings with the snapshot.
    println!(
        "cargo:rustc-env=IBVERBS_SYS_SNAPSHOT_NAME={}",
        snapshot_name()
    );
    if env("DOCS_RS").is_some() {
        fs::copy(&snapshot, out_dir.join("bindings.rs"))
            .unwrap_or_else(|e| panic!("copying the bindings snapshot {snapshot:?}: {e}"));
        if dlopen_enabled() {
            generate_dlopen(&out_dir);
        }
        return;
    }

    let found = find_ibverbs();
    let generated = generate(&manifest_dir, &out_dir, &found);

    if env("IBVERBS_SYS_UPDATE_SNAPSHOT").is_some() {
        fs::create_dir_all(snapshot.parent().unwrap()).unwrap();
        fs::copy(&generated, &snapshot)
            .unwrap_or_else(|e| panic!("writing the bindings snapshot {snapshot:?}: {e}"));
    }
    if dlopen_enabled() {
        // Nothing of rdma-core is linked: the shim's calls into the
        // libraries go to the Rust forwarders (see build/dlgen.rs).
        let header = generate_dlopen(&out_dir);
        compile_static_fns(&manifest_dir, &out_dir, &found, Some(&header));
    } else {
        // The static-inline shim must precede libibverbs on the link line.
        compile_static_fns(&manifest_dir, &out_dir, &found, None);
        for dir in &found.link_paths {
            println!("cargo:rustc-link-search=native={}", dir.display());
        }
        println!("cargo:rustc-link-lib=ibverbs");
        if rdmacm_enabled() {
            println!("cargo:rustc-link-lib=rdmacm");
        }
    }

    // Metadata for dependents (`DEP_IBVERBS_INCLUDE`, `DEP_IBVERBS_VERSION`).
    let includes = std::env::join_paths(&found.include_paths).unwrap();
    println!("cargo:include={}", includes.to_string_lossy());
    if let Some(version) = &found.version {
        println!("cargo:version={version}");
    }
}

fn find_ibverbs() -> Found {
    let include_dir = env("IBVERBS_INCLUDE_DIR").map(PathBuf::from);
    let lib_dir = env("IBVERBS_LIB_DIR").map(PathBuf::from);
    if include_dir.is_some() || lib_dir.is_some() {
        let include_dir = include_dir.unwrap_or_else(|| {
            panic!("IBVERBS_LIB_DIR is set but IBVERBS_INCLUDE_DIR is not: set both")
        });
        if !include_dir.join("infiniband/verbs.h").exists() {
            panic!(
                "IBVERBS_INCLUDE_DIR={} has no infiniband/verbs.h",
                include_dir.display()
            );
        }
        return Found {
            include_paths: vec![include_dir],
            link_paths: lib_dir.into_iter().collect(),
            // The headers' rdma-core version (e.g. `50.0`), which pkg-config
            // would otherwise report: dependents enable newer verbs by it.
            version: env("IBVERBS_VERSION").map(|v| v.to_string_lossy().into_owned()),
        };
    }

    let mut config = pkg_config::Config::new();
    // Link lines are emitted by hand so that they follow the C shim.
    config.cargo_metadata(false).print_system_libs(false);
    let verbs = match config.probe("libibverbs") {
        Ok(lib) => lib,
        Err(err) => panic!(
            "\n\nlibibverbs (rdma-core) was not found.\n\
             Install its development files, e.g. on Debian/Ubuntu:\n    \
             apt-get install libibverbs-dev{}\n\
             or point IBVERBS_INCLUDE_DIR (and IBVERBS_LIB_DIR) at an rdma-core build.\n\
             pkg-config said: {err}\n\n",
            if rdmacm_enabled() {
                " librdmacm-dev"
            } else {
                ""
            }
        ),
    };
    let mut found = Found {
        include_paths: verbs.include_paths,
        link_paths: verbs.link_paths,
        version: Some(verbs.version),
    };
    if rdmacm_enabled() {
        match config.probe("librdmacm") {
            Ok(cm) => {
                found.include_paths.extend(cm.include_paths);
                found.link_paths.extend(cm.link_paths);
            }
            Err(err) => panic!(
                "\n\nthe `rdmacm` feature needs librdmacm: apt-get install librdmacm-dev\n\
                 pkg-config said: {err}\n\n"
            ),
        }
    }
    found
}

fn generate(manifest_dir: &Path, out_dir: &Path, found: &Found) -> PathBuf {
    let mut builder = bindgen::Builder::default()
        .header(manifest_dir.join("wrapper.h").to_string_lossy())
        .clang_args(
            found
                .include_paths
                .iter()
                .map(|p| format!("-I{}", p.display())),
        )
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
        .allowlist_type("ib_uverbs_(access_flags|query_port_flags|advise_mr_advice|advise_mr_flag)")
        // `ibv_query_port` is a macro over the static inline `___ibv_query_port`;
        // the exported symbol of that name is the compat entry that leaves the
        // extended port fields zero. `ibv_reg_mr{,_iova}` are macros that route
        // IBV_ACCESS_OPTIONAL_RANGE to `ibv_reg_mr_iova2`. lib.rs defines all
        // three over the inlines so Rust sees what C sees.
        .blocklist_function("ibv_query_port")
        .blocklist_function("ibv_reg_mr")
        .blocklist_function("ibv_reg_mr_iova")
        // The data-path inlines (one provider call each) are Rust in lib.rs,
        // inlined into the caller as C inlines them: through the shim every
        // post and poll would pay a second call and return.
        .blocklist_function("ibv_post_send")
        .blocklist_function("ibv_post_recv")
        .blocklist_function("ibv_post_srq_recv")
        .blocklist_function("ibv_poll_cq")
        .blocklist_function("ibv_req_notify_cq")
        // Values the device returns are plain integer constants, never Rust
        // enums (an unknown value in a Rust enum is undefined behaviour).
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
        .layout_tests(true)
        .wrap_static_fns(true)
        .wrap_static_fns_path(out_dir.join("static_fns"))
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()));
    if rdmacm_enabled() {
        builder = builder
            .clang_arg("-DIBVERBS_SYS_RDMACM")
            .allowlist_function("rdma_.*")
            .allowlist_type("rdma_.*")
            .allowlist_var("RDMA_.*");
    }
    let bindings = builder
        .generate()
        .unwrap_or_else(|e| panic!("bindgen could not read infiniband/verbs.h: {e}"));
    let path = out_dir.join("bindings.rs");
    bindings
        .write_to_file(&path)
        .unwrap_or_else(|e| panic!("writing {path:?}: {e}"));
    path
}

/// Feature `dlopen`: writes `bindings_dlopen.rs` (the bindings with
/// `dlsym` wrappers for the exported functions) and the shim's redirect
/// header next to `bindings.rs`; returns the header's path.
fn generate_dlopen(out_dir: &Path) -> PathBuf {
    let bindings = fs::read_to_string(out_dir.join("bindings.rs")).unwrap();
    let generated = dlgen::transform(&bindings, dlgen::EXTRA_DECLS)
        .unwrap_or_else(|e| panic!("generating the dlopen wrappers: {e}"));
    let mut rust = generated.rust;
    // The wrapped symbols, for the crate's tests.
    rust.push_str("\n#[doc(hidden)]\npub const DLOPEN_SYMBOLS: &[&str] = &[");
    for s in &generated.symbols {
        rust.push_str(&format!("{:?},", s.symbol));
    }
    rust.push_str("];\n");
    fs::write(out_dir.join("bindings_dlopen.rs"), rust).unwrap();
    let header = out_dir.join("dlopen_redirect.h");
    fs::write(&header, generated.header).unwrap();
    header
}

fn compile_static_fns(manifest_dir: &Path, out_dir: &Path, found: &Found, redirect: Option<&Path>) {
    let mut build = cc::Build::new();
    if let Some(header) = redirect {
        build
            .flag("-include")
            .flag(header.to_string_lossy().as_ref());
    }
    build
        .file(out_dir.join("static_fns.c"))
        .include(manifest_dir)
        .includes(&found.include_paths)
        .warnings(false);
    if rdmacm_enabled() {
        build.define("IBVERBS_SYS_RDMACM", None);
    }
    build.compile("rdma_verbs_sys_static_fns");
}
