//! Cross-checks the layout of the core structs and the values of core
//! constants against rdma-sys, an independently generated binding of the
//! same headers. A mismatch means one of the two bindings is wrong for this
//! rdma-core. A host test (it needs no device); here rather than in
//! rdma-verbs-sys because rdma-sys runs bindgen (libclang) when built.

use core::mem::{align_of, offset_of, size_of};

macro_rules! same_layout {
    ($ty:ident { $($field:ident),* $(,)? }) => {{
        assert_eq!(
            size_of::<rdma_verbs_sys::$ty>(), size_of::<rdma_sys::$ty>(),
            concat!("size of ", stringify!($ty))
        );
        assert_eq!(
            align_of::<rdma_verbs_sys::$ty>(), align_of::<rdma_sys::$ty>(),
            concat!("alignment of ", stringify!($ty))
        );
        $(
            assert_eq!(
                offset_of!(rdma_verbs_sys::$ty, $field), offset_of!(rdma_sys::$ty, $field),
                concat!("offset of ", stringify!($ty), ".", stringify!($field))
            );
        )*
    }};
}

#[test]
fn core_structs_match_rdma_sys() {
    same_layout!(ibv_sge { addr, length, lkey });
    same_layout!(ibv_wc {
        wr_id,
        status,
        opcode,
        vendor_err,
        byte_len,
        qp_num,
        src_qp,
        wc_flags,
        pkey_index,
        slid,
        sl,
        dlid_path_bits,
    });
    same_layout!(ibv_send_wr {
        wr_id,
        next,
        sg_list,
        num_sge,
        opcode,
        send_flags,
        wr,
        qp_type
    });
    same_layout!(ibv_recv_wr {
        wr_id,
        next,
        sg_list,
        num_sge
    });
    same_layout!(ibv_qp_attr {
        qp_state,
        cur_qp_state,
        path_mtu,
        path_mig_state,
        qkey,
        rq_psn,
        sq_psn,
        dest_qp_num,
        qp_access_flags,
        cap,
        ah_attr,
        alt_ah_attr,
        pkey_index,
        alt_pkey_index,
        en_sqd_async_notify,
        sq_draining,
        max_rd_atomic,
        max_dest_rd_atomic,
        min_rnr_timer,
        port_num,
        timeout,
        retry_cnt,
        rnr_retry,
        alt_port_num,
        alt_timeout,
        rate_limit,
    });
    same_layout!(ibv_qp_init_attr {
        qp_context,
        send_cq,
        recv_cq,
        srq,
        cap,
        qp_type,
        sq_sig_all
    });
    same_layout!(ibv_qp_cap {
        max_send_wr,
        max_recv_wr,
        max_send_sge,
        max_recv_sge,
        max_inline_data
    });
    same_layout!(ibv_ah_attr {
        grh,
        dlid,
        sl,
        src_path_bits,
        static_rate,
        is_global,
        port_num
    });
    same_layout!(ibv_global_route {
        dgid,
        flow_label,
        sgid_index,
        hop_limit,
        traffic_class
    });
    same_layout!(ibv_port_attr {
        state,
        max_mtu,
        active_mtu,
        gid_tbl_len,
        port_cap_flags,
        max_msg_sz,
        bad_pkey_cntr,
        qkey_viol_cntr,
        pkey_tbl_len,
        lid,
        sm_lid,
        lmc,
        max_vl_num,
        sm_sl,
        subnet_timeout,
        init_type_reply,
        active_width,
        active_speed,
        phys_state,
        link_layer,
        flags,
        port_cap_flags2,
    });
    same_layout!(ibv_device_attr {
        fw_ver,
        node_guid,
        sys_image_guid,
        max_mr_size,
        page_size_cap,
        vendor_id,
        vendor_part_id,
        hw_ver,
        max_qp,
        max_qp_wr,
        device_cap_flags,
        max_sge,
        max_sge_rd,
        max_cq,
        max_cqe,
        max_mr,
        max_pd,
        max_qp_rd_atom,
        max_ee_rd_atom,
        max_res_rd_atom,
        max_qp_init_rd_atom,
        max_ee_init_rd_atom,
        atomic_cap,
        max_ee,
        max_rdd,
        max_mw,
        max_raw_ipv6_qp,
        max_raw_ethy_qp,
        max_mcast_grp,
        max_mcast_qp_attach,
        max_total_mcast_qp_attach,
        max_ah,
        max_fmr,
        max_map_per_fmr,
        max_srq,
        max_srq_wr,
        max_srq_sge,
        max_pkeys,
        local_ca_ack_delay,
        phys_port_cnt,
    });
    same_layout!(ibv_mr {
        context,
        pd,
        addr,
        length,
        handle,
        lkey,
        rkey
    });
    same_layout!(ibv_cq {
        context,
        channel,
        cq_context,
        handle,
        cqe
    });
    same_layout!(ibv_qp {
        context,
        qp_context,
        pd,
        send_cq,
        recv_cq,
        srq,
        handle,
        qp_num,
        state,
        qp_type
    });
    same_layout!(ibv_gid_entry {
        gid,
        gid_index,
        port_num,
        gid_type,
        ndev_ifindex
    });
}

macro_rules! same_consts {
    ($($module:ident :: $name:ident),* $(,)?) => {$(
        assert_eq!(
            rdma_verbs_sys::$name as u64, rdma_sys::$module::$name as u64,
            concat!("value of ", stringify!($name))
        );
    )*};
}

macro_rules! same_flags {
    ($($ty:ident :: $name:ident),* $(,)?) => {$(
        assert_eq!(
            rdma_verbs_sys::$ty::$name.0 as u64, rdma_sys::$ty::$name.0 as u64,
            concat!("value of ", stringify!($name))
        );
    )*};
}

#[test]
fn core_constants_match_rdma_sys() {
    same_consts!(
        ibv_wc_status::IBV_WC_SUCCESS,
        ibv_wc_status::IBV_WC_LOC_LEN_ERR,
        ibv_wc_status::IBV_WC_WR_FLUSH_ERR,
        ibv_wc_status::IBV_WC_REM_ACCESS_ERR,
        ibv_wc_status::IBV_WC_RETRY_EXC_ERR,
        ibv_wc_status::IBV_WC_GENERAL_ERR,
        ibv_wc_opcode::IBV_WC_SEND,
        ibv_wc_opcode::IBV_WC_RDMA_WRITE,
        ibv_wc_opcode::IBV_WC_RDMA_READ,
        ibv_wc_opcode::IBV_WC_COMP_SWAP,
        ibv_wc_opcode::IBV_WC_FETCH_ADD,
        ibv_wc_opcode::IBV_WC_RECV,
        ibv_wc_opcode::IBV_WC_RECV_RDMA_WITH_IMM,
        ibv_wr_opcode::IBV_WR_RDMA_WRITE,
        ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM,
        ibv_wr_opcode::IBV_WR_SEND,
        ibv_wr_opcode::IBV_WR_SEND_WITH_IMM,
        ibv_wr_opcode::IBV_WR_RDMA_READ,
        ibv_wr_opcode::IBV_WR_ATOMIC_CMP_AND_SWP,
        ibv_wr_opcode::IBV_WR_ATOMIC_FETCH_AND_ADD,
        ibv_qp_state::IBV_QPS_RESET,
        ibv_qp_state::IBV_QPS_INIT,
        ibv_qp_state::IBV_QPS_RTR,
        ibv_qp_state::IBV_QPS_RTS,
        ibv_qp_state::IBV_QPS_ERR,
        ibv_qp_type::IBV_QPT_RC,
        ibv_qp_type::IBV_QPT_UC,
        ibv_qp_type::IBV_QPT_UD,
        ibv_mtu::IBV_MTU_256,
        ibv_mtu::IBV_MTU_4096,
        ibv_port_state::IBV_PORT_ACTIVE,
        ibv_port_state::IBV_PORT_DOWN,
    );
    same_flags!(
        ibv_access_flags::IBV_ACCESS_LOCAL_WRITE,
        ibv_access_flags::IBV_ACCESS_REMOTE_WRITE,
        ibv_access_flags::IBV_ACCESS_REMOTE_READ,
        ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC,
        ibv_access_flags::IBV_ACCESS_RELAXED_ORDERING,
        ibv_send_flags::IBV_SEND_SIGNALED,
        ibv_send_flags::IBV_SEND_INLINE,
        ibv_send_flags::IBV_SEND_SOLICITED,
        ibv_send_flags::IBV_SEND_FENCE,
        ibv_wc_flags::IBV_WC_WITH_IMM,
        ibv_wc_flags::IBV_WC_GRH,
        ibv_qp_attr_mask::IBV_QP_STATE,
        ibv_qp_attr_mask::IBV_QP_AV,
        ibv_qp_attr_mask::IBV_QP_DEST_QPN,
        ibv_qp_attr_mask::IBV_QP_MAX_DEST_RD_ATOMIC,
    );
}
