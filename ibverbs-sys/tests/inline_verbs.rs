//! Every `static inline` verb of `verbs.h` is bound: each name below must
//! resolve to a Rust function of the crate (src/inline.rs, and lib.rs for
//! the data-path verbs and the three verbs that `verbs.h` defines as
//! macros). A missing one does not compile, so building this test is the
//! check; tests/inline_diff.rs compares each with the headers' C.

macro_rules! linked {
    ($($name:ident),* $(,)?) => {{
        let addrs: &[*const ()] = &[$(rdma_verbs_sys::$name as *const ()),*];
        addrs.len()
    }};
}

#[test]
fn every_static_inline_verb_is_linked() {
    let count = linked!(
        ___ibv_query_port,
        __ibv_reg_mr,
        __ibv_reg_mr_iova,
        ibv_advise_mr,
        ibv_alloc_dm,
        ibv_alloc_mw,
        ibv_alloc_null_mr,
        ibv_alloc_parent_domain,
        ibv_alloc_td,
        ibv_attach_counters_point_flow,
        ibv_bind_mw,
        ibv_close_xrcd,
        ibv_cq_ex_to_cq,
        ibv_create_counters,
        ibv_create_cq_ex,
        ibv_create_flow,
        ibv_create_flow_action_esp,
        ibv_create_qp_ex,
        ibv_create_rwq_ind_table,
        ibv_create_srq_ex,
        ibv_create_wq,
        ibv_dealloc_mw,
        ibv_dealloc_td,
        ibv_destroy_counters,
        ibv_destroy_flow,
        ibv_destroy_flow_action,
        ibv_destroy_rwq_ind_table,
        ibv_destroy_wq,
        ibv_end_poll,
        ibv_flow_label_to_udp_sport,
        ibv_free_dm,
        ibv_get_srq_num,
        ibv_inc_rkey,
        ibv_is_qpt_supported,
        ibv_memcpy_from_dm,
        ibv_memcpy_to_dm,
        ibv_modify_cq,
        ibv_modify_flow_action_esp,
        ibv_modify_qp_rate_limit,
        ibv_modify_wq,
        ibv_next_poll,
        ibv_open_qp,
        ibv_open_xrcd,
        ibv_poll_cq,
        ibv_post_recv,
        ibv_post_send,
        ibv_post_srq_ops,
        ibv_post_srq_recv,
        ibv_post_wq_recv,
        ibv_query_device_ex,
        ibv_query_gid_ex,
        ibv_query_gid_table,
        ibv_query_rt_values_ex,
        ibv_read_counters,
        ibv_reg_dm_mr,
        ibv_req_notify_cq,
        ibv_start_poll,
        ibv_wc_read_byte_len,
        ibv_wc_read_completion_ts,
        ibv_wc_read_completion_wallclock_ns,
        ibv_wc_read_cvlan,
        ibv_wc_read_dlid_path_bits,
        ibv_wc_read_flow_tag,
        ibv_wc_read_invalidated_rkey,
        ibv_wc_read_opcode,
        ibv_wc_read_qp_num,
        ibv_wc_read_sl,
        ibv_wc_read_slid,
        ibv_wc_read_src_qp,
        ibv_wc_read_tm_info,
        ibv_wc_read_vendor_err,
        ibv_wc_read_wc_flags,
        ibv_wr_abort,
        ibv_wr_atomic_cmp_swp,
        ibv_wr_atomic_fetch_add,
        ibv_wr_atomic_write,
        ibv_wr_bind_mw,
        ibv_wr_complete,
        ibv_wr_local_inv,
        ibv_wr_rdma_read,
        ibv_wr_rdma_write,
        ibv_wr_rdma_write_imm,
        ibv_wr_send,
        ibv_wr_send_imm,
        ibv_wr_send_inv,
        ibv_wr_send_tso,
        ibv_wr_set_inline_data,
        ibv_wr_set_inline_data_list,
        ibv_wr_set_sge,
        ibv_wr_set_sge_list,
        ibv_wr_set_ud_addr,
        ibv_wr_set_xrc_srqn,
        ibv_wr_start,
        ibv_wc_read_imm_data,
    );
    // verbs.h of rdma-core 44 defines 95 static inline functions; all but
    // `__ibv_get_device_list` (compiled only with RDMA_STATIC_PROVIDERS, where
    // it merely registers static providers before the exported
    // `ibv_get_device_list`) are bound. Newer headers add more.
    assert!(count >= 94, "only {count} inline verbs bound");
    let macros = linked!(ibv_query_port, ibv_reg_mr, ibv_reg_mr_iova);
    assert_eq!(macros, 3);
}

#[test]
fn device_list_smoke() {
    let mut num = -1;
    // SAFETY: `num` is a valid out-pointer; the list is freed below.
    let list = unsafe { rdma_verbs_sys::ibv_get_device_list(&mut num) };
    if list.is_null() {
        // No RDMA subsystem at all: libibverbs reports it through errno.
        let err = std::io::Error::last_os_error();
        eprintln!("ibv_get_device_list: no list ({err})");
        return;
    }
    assert!(num >= 0);
    for i in 0..num as usize {
        // SAFETY: the list holds `num` valid device pointers.
        let dev = unsafe { *list.add(i) };
        assert!(!dev.is_null());
        // SAFETY: `dev` is a valid device from the live list.
        let name = unsafe { std::ffi::CStr::from_ptr(rdma_verbs_sys::ibv_get_device_name(dev)) };
        eprintln!("device {i}: {}", name.to_string_lossy());
    }
    // SAFETY: the list is a live result of `ibv_get_device_list`.
    unsafe { assert!((*list.add(num as usize)).is_null()) };
    // SAFETY: freed exactly once.
    unsafe { rdma_verbs_sys::ibv_free_device_list(list) };
}

/// The Rust data-path inlines call the context's op, and return
/// `EOPNOTSUPP` (negative for `ibv_poll_cq`) instead of calling a NULL one.
#[test]
fn data_path_inlines_call_the_op_and_never_a_null_one() {
    use rdma_verbs_sys::*;
    unsafe extern "C" fn poll(
        _: *mut ibv_cq,
        n: core::ffi::c_int,
        _: *mut ibv_wc,
    ) -> core::ffi::c_int {
        n + 40
    }
    unsafe extern "C" fn post(
        _: *mut ibv_qp,
        _: *mut ibv_send_wr,
        _: *mut *mut ibv_send_wr,
    ) -> core::ffi::c_int {
        7
    }
    // SAFETY: all-zero is a valid value of these plain C structs (NULL
    // pointers, `None` ops, zero numbers).
    let mut ctx_storage: ibv_context = unsafe { std::mem::zeroed() };
    // Every access below goes through this pointer (the objects hold it).
    let ctx: *mut ibv_context = &mut ctx_storage;
    // SAFETY: as above.
    let mut cq: ibv_cq = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let mut qp: ibv_qp = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let mut srq: ibv_srq = unsafe { std::mem::zeroed() };
    cq.context = ctx;
    qp.context = ctx;
    srq.context = ctx;
    let null: *mut core::ffi::c_void = std::ptr::null_mut();
    let mut bad_send: *mut ibv_send_wr = null.cast();
    let mut bad_recv: *mut ibv_recv_wr = null.cast();
    let eopnotsupp = libc::EOPNOTSUPP;
    // SAFETY: the objects above are live; no op is set, so none is called.
    unsafe {
        assert_eq!(
            ibv_post_send(&mut qp, null.cast(), &mut bad_send),
            eopnotsupp
        );
        assert_eq!(
            ibv_post_recv(&mut qp, null.cast(), &mut bad_recv),
            eopnotsupp
        );
        assert_eq!(
            ibv_post_srq_recv(&mut srq, null.cast(), &mut bad_recv),
            eopnotsupp
        );
        assert_eq!(ibv_poll_cq(&mut cq, 1, null.cast()), -eopnotsupp);
        assert_eq!(ibv_req_notify_cq(&mut cq, 0), eopnotsupp);
    }
    // SAFETY: the ops set here ignore their pointers.
    unsafe {
        (*ctx).ops.poll_cq = Some(poll);
        (*ctx).ops.post_send = Some(post);
        assert_eq!(ibv_poll_cq(&mut cq, 2, null.cast()), 42);
        assert_eq!(ibv_post_send(&mut qp, null.cast(), &mut bad_send), 7);
    }
}
