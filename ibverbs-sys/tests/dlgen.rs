//! The `dlopen` feature's bindings: the committed `src/bindings/*_dlopen.rs`
//! are what the generator (`dlgen/generator.rs`) makes of the committed
//! bindings (with `IBVERBS_SYS_UPDATE_BINDINGS` set this writes them), and
//! the generator on small inputs in bindgen's shape: which declarations
//! become `dlsym` wrappers, and what a wrapper returns when its symbol is
//! missing. Runs with and without the feature (pure logic).

#[path = "dlgen/generator.rs"]
mod generator;

use generator::{transform, Lib};

const SAMPLE: &str = r#"
pub type ibv_fork_status = ::core::ffi::c_uint;
unsafe extern "C" {
    #[doc = " ibv_get_device_list - Get list of IB devices currently available"]
    pub fn ibv_get_device_list(num_devices: *mut ::core::ffi::c_int) -> *mut *mut ibv_device;
}
unsafe extern "C" {
    pub fn ibv_free_device_list(list: *mut *mut ibv_device);
}
unsafe extern "C" {
    pub fn ibv_wc_status_str(status: ibv_wc_status) -> *const ::core::ffi::c_char;
}
unsafe extern "C" {
    pub fn ibv_get_cq_event(
        channel: *mut ibv_comp_channel,
        cq: *mut *mut ibv_cq,
        cq_context: *mut *mut ::core::ffi::c_void,
    ) -> ::core::ffi::c_int;
}
unsafe extern "C" {
    pub fn ibv_set_ece(qp: *mut ibv_qp, ece: *mut ibv_ece) -> ::core::ffi::c_int;
}
unsafe extern "C" {
    pub fn ibv_is_fork_initialized() -> ibv_fork_status;
}
unsafe extern "C" {
    pub fn _ibv_query_gid_table(
        context: *mut ibv_context,
        entries: *mut ibv_gid_entry,
        max_entries: usize,
        flags: u32,
        entry_size: usize,
    ) -> isize;
}
unsafe extern "C" {
    pub fn rdma_create_id(
        channel: *mut rdma_event_channel,
        id: *mut *mut rdma_cm_id,
        context: *mut ::core::ffi::c_void,
        ps: rdma_port_space,
    ) -> ::core::ffi::c_int;
}
"#;

const EXTRA: &str = include_str!("../src/bindings/extra.rs");

fn sample() -> generator::Generated {
    transform(SAMPLE, EXTRA).expect("transform")
}

#[test]
fn exported_functions_get_wrappers() {
    let g = sample();
    let names: Vec<&str> = g.symbols.iter().map(|s| s.symbol.as_str()).collect();
    assert_eq!(
        names,
        [
            "ibv_get_device_list",
            "ibv_free_device_list",
            "ibv_wc_status_str",
            "ibv_get_cq_event",
            "ibv_set_ece",
            "ibv_is_fork_initialized",
            "_ibv_query_gid_table",
            "rdma_create_id",
            "ibv_query_port",
            "ibv_reg_mr",
            "ibv_reg_mr_iova",
        ]
    );
    // A wrapper: same name and signature, its symbol looked up by name in
    // its library.
    let compact: String = g.rust.split_whitespace().collect();
    assert!(compact.contains(
        "pubunsafeextern\"C\"fnibv_get_device_list(num_devices:*mut::core::ffi::c_int)->*mut*mutibv_device{"
    ));
    assert!(compact.contains("SLOT.get(&crate::dl::LIBIBVERBS,c\"ibv_get_device_list\")"));
    assert!(compact.contains("SLOT.get(&crate::dl::LIBRDMACM,c\"rdma_create_id\")"));
    // bindgen's docs are kept.
    assert!(g
        .rust
        .contains("Get list of IB devices currently available"));
    // The blocklisted exported functions get private Rust names.
    let port = g
        .symbols
        .iter()
        .find(|s| s.symbol == "ibv_query_port")
        .unwrap();
    assert_eq!(port.rust_name, "compat_ibv_query_port");
    assert!(compact.contains("pub(crate)unsafeextern\"C\"fncompat_ibv_query_port("));
    // The generated code parses as Rust.
    syn::parse_file(&g.rust).expect("generated code parses");
}

#[test]
fn missing_symbols_fail_by_each_verbs_convention() {
    let g = sample();
    let missing = |name: &str| {
        g.symbols
            .iter()
            .find(|s| s.symbol == name)
            .unwrap_or_else(|| panic!("{name}"))
            .missing
            .clone()
    };
    assert_eq!(missing("ibv_get_device_list"), "::core::ptr::null_mut()");
    assert_eq!(missing("ibv_free_device_list"), "()");
    assert_eq!(
        missing("ibv_wc_status_str"),
        "b\"unknown\\0\".as_ptr() as _"
    );
    // -1 with errno
    assert_eq!(missing("ibv_get_cq_event"), "-1");
    assert_eq!(missing("rdma_create_id"), "-1");
    // an errno value
    assert_eq!(missing("ibv_set_ece"), "::libc::EOPNOTSUPP");
    // a negative errno
    assert_eq!(
        missing("_ibv_query_gid_table"),
        "-(::libc::EOPNOTSUPP as isize) as _"
    );
    // IBV_FORK_DISABLED
    assert_eq!(
        missing("ibv_is_fork_initialized"),
        "unsafe { ::core::mem::zeroed() }"
    );
    assert_eq!(Lib::of("rdma_create_id"), Lib::Rdmacm);
    assert_eq!(Lib::of("_ibv_query_gid_ex"), Lib::Ibverbs);
}

#[test]
fn variadic_functions_are_refused() {
    let src = r#"unsafe extern "C" { pub fn ibv_printf(fmt: *const u8, ...) -> i32; }"#;
    let err = transform(src, "").err().expect("refused");
    assert!(err.contains("ibv_printf is variadic"), "{err}");
}

/// The generated file for `input`: a header, the wrappers, the symbol list.
fn dlopen_bindings(input: &str) -> String {
    let g = transform(input, EXTRA).expect("transform");
    let file = syn3::parse_file(&g.rust).expect("generated code parses");
    let mut out = String::from(
        "// Generated by tests/dlgen.rs from the bindings beside this file and\n\
         // extra.rs (feature `dlopen`): IBVERBS_SYS_UPDATE_BINDINGS=1 cargo test\n\
         // -p rdma-verbs-sys --test dlgen rewrites it. Do not edit.\n\n",
    );
    out.push_str(&prettyplease::unparse(&file));
    out.push_str("\n/// The wrapped symbols, for the crate's tests.\n#[doc(hidden)]\npub const DLOPEN_SYMBOLS: &[&str] = &[\n");
    for s in &g.symbols {
        out.push_str(&format!("    {:?},\n", s.symbol));
    }
    out.push_str("];\n");
    out
}

#[test]
fn committed_dlopen_bindings_are_current() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/src/bindings");
    let update = std::env::var_os("IBVERBS_SYS_UPDATE_BINDINGS").is_some();
    for (input, output) in [
        ("verbs.rs", "verbs_dlopen.rs"),
        ("verbs_rdmacm.rs", "verbs_rdmacm_dlopen.rs"),
    ] {
        let input = std::fs::read_to_string(format!("{dir}/{input}")).expect("bindings");
        let generated = dlopen_bindings(&input);
        let path = format!("{dir}/{output}");
        if update {
            std::fs::write(&path, &generated).expect("writing");
            continue;
        }
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            generated == committed,
            "{path} is stale: run ibverbs-sys/regenerate-bindings.sh and commit the result"
        );
    }
}
