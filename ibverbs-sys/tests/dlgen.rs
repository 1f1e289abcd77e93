//! The `dlopen` feature's generator (`build/dlgen.rs`), on small inputs
//! in bindgen's shape: which declarations become `dlsym` wrappers, what a
//! wrapper returns when its symbol is missing, and the shim's redirect
//! header. Runs with and without the feature (pure logic).

#[path = "../build/dlgen.rs"]
#[allow(dead_code)]
mod dlgen;

use dlgen::{transform, Lib};

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
unsafe extern "C" {
    #[link_name = "ibv_query_device_ex__extern"]
    pub fn ibv_query_device_ex(
        context: *mut ibv_context,
        input: *const ibv_query_device_ex_input,
        attr: *mut ibv_device_attr_ex,
    ) -> ::core::ffi::c_int;
}
"#;

fn sample() -> dlgen::Generated {
    transform(SAMPLE, dlgen::EXTRA_DECLS).expect("transform")
}

#[test]
fn exported_functions_get_wrappers_and_shim_functions_stay_extern() {
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
    // The shim's wrapper is still declared, linked statically.
    assert!(g.rust.contains("\"ibv_query_device_ex__extern\""));
    assert!(!names.contains(&"ibv_query_device_ex"));
    // A wrapper: same name, exported under the forwarder's name, its
    // symbol looked up by name in its library.
    let compact: String = g.rust.split_whitespace().collect();
    assert!(compact.contains(
        "#[export_name=\"rdmaverbs_sys_dl_ibv_get_device_list\"]pubunsafeextern\"C\"fnibv_get_device_list(num_devices:*mut::core::ffi::c_int)->*mut*mutibv_device{"
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
    assert_eq!(port.rust_name, "dl_compat_ibv_query_port");
    assert!(compact.contains(
        "#[export_name=\"rdmaverbs_sys_dl_ibv_query_port\"]pub(crate)unsafeextern\"C\"fndl_compat_ibv_query_port("
    ));
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
fn the_shim_header_renames_every_exported_function() {
    let g = sample();
    let h = &g.header;
    assert!(h.contains("#define ibv_set_ece rdmaverbs_sys_dl_ibv_set_ece\n"));
    assert!(h.contains("#define rdma_create_id rdmaverbs_sys_dl_rdma_create_id\n"));
    assert!(h.contains("#define _ibv_query_gid_table rdmaverbs_sys_dl__ibv_query_gid_table\n"));
    // verbs.h defines these as function-like macros too: asm labels, never
    // a #define (verbs.h would redefine it).
    for name in [
        "ibv_get_device_list",
        "ibv_query_port",
        "ibv_reg_mr",
        "ibv_reg_mr_iova",
    ] {
        assert!(!h.contains(&format!("#define {name} ")), "{name}");
        assert!(
            h.contains(&format!("{name}("))
                && h.contains(&format!("__asm__(\"rdmaverbs_sys_dl_{name}\")")),
            "{name}"
        );
    }
    // The shim's own wrappers are not renamed.
    assert!(!h.contains("ibv_query_device_ex"));
}

#[test]
fn variadic_functions_are_refused() {
    let src = r#"unsafe extern "C" { pub fn ibv_printf(fmt: *const u8, ...) -> i32; }"#;
    let err = transform(src, "").err().expect("refused");
    assert!(err.contains("ibv_printf is variadic"), "{err}");
}
