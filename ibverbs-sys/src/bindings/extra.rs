// Exported libibverbs functions that the bindings do not declare under
// their own names (lib.rs defines Rust functions of those names, as
// verbs.h defines macros), but that the inline verbs call: declared under
// a private name with the symbol in `link_name`. Hand-written; with the
// `dlopen` feature they become `dlsym` wrappers like every declaration.
unsafe extern "C" {
    /// The compat `ibv_query_port`: leaves the extended port fields zero.
    #[link_name = "ibv_query_port"]
    pub(crate) fn compat_ibv_query_port(
        context: *mut ibv_context,
        port_num: u8,
        port_attr: *mut _compat_ibv_port_attr,
    ) -> ::core::ffi::c_int;
    /// The exported `ibv_reg_mr` (verbs.h's macro of that name routes
    /// `IBV_ACCESS_OPTIONAL_RANGE` first).
    #[link_name = "ibv_reg_mr"]
    pub(crate) fn exported_ibv_reg_mr(
        pd: *mut ibv_pd,
        addr: *mut ::core::ffi::c_void,
        length: usize,
        access: ::core::ffi::c_int,
    ) -> *mut ibv_mr;
    /// The exported `ibv_reg_mr_iova`.
    #[link_name = "ibv_reg_mr_iova"]
    pub(crate) fn exported_ibv_reg_mr_iova(
        pd: *mut ibv_pd,
        addr: *mut ::core::ffi::c_void,
        length: usize,
        iova: u64,
        access: ::core::ffi::c_int,
    ) -> *mut ibv_mr;
}
