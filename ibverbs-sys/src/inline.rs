//! Rust ports of the `static inline` functions of rdma-core's
//! `infiniband/verbs.h` (rdma-core 44), which C compiles into the caller.
//!
//! Each has the C function's name and signature and behaves as it does: the
//! same checks of the extended context (`verbs_get_ctx_op`), the same
//! `errno` and return values, the same routing to exported libibverbs
//! functions. Where C calls a provider function pointer without a check (the
//! `ibv_wr_*`, `ibv_wc_read_*` and poll ops, `ibv_dealloc_mw`,
//! `ibv_close_xrcd`, …) a NULL pointer is a broken contract; the port panics
//! there instead of calling through NULL.
//!
//! The data-path inlines (`ibv_post_send`, `ibv_poll_cq`, …) and the verbs
//! that `verbs.h` defines as macros (`ibv_query_port`, `ibv_reg_mr`,
//! `ibv_reg_mr_iova`) are in the crate root.
#![deny(unsafe_op_in_unsafe_fn)]

use core::ffi::{c_int, c_uint, c_void};
use core::mem::{offset_of, size_of};
use core::ptr;

use crate::*;

/// Exported libibverbs symbols that the bindings leave out because
/// `verbs.h` hides them behind macros of the same name (`ibv_query_port`,
/// `ibv_reg_mr`, `ibv_reg_mr_iova`): the inlines call these, not the macros
/// (declared in `bindings/extra.rs`; `dlsym` wrappers with `dlopen`).
mod exported {
    pub(super) use crate::{
        compat_ibv_query_port, exported_ibv_reg_mr as ibv_reg_mr,
        exported_ibv_reg_mr_iova as ibv_reg_mr_iova,
    };
}

/// `errno = value`.
#[inline]
fn set_errno(value: c_int) {
    // SAFETY: `__errno_location` returns the calling thread's errno, always
    // valid for writes.
    unsafe { *libc::__errno_location() = value };
}

/// Sets `errno` to `EOPNOTSUPP` and returns NULL: what the inlines do when
/// the provider lacks an op.
#[inline]
fn eopnotsupp_null<T>() -> *mut T {
    set_errno(libc::EOPNOTSUPP);
    ptr::null_mut()
}

/// A provider function pointer that C would call unchecked is NULL.
#[cold]
#[inline(never)]
#[track_caller]
fn null_op(op: &str) -> ! {
    panic!("the provider's `{op}` is NULL (C would call through it)")
}

/// `__VERBS_ABI_IS_EXTENDED`: `ibv_context::abi_compat` of a context that is
/// embedded in a `verbs_context`.
const VERBS_ABI_IS_EXTENDED: usize = usize::MAX;

/// The `verbs_context` that embeds `ctx`, or NULL when `ctx` is not an
/// extended context (`abi_compat != __VERBS_ABI_IS_EXTENDED`).
///
/// The result is computed by address arithmetic alone: a provider built
/// against an older `verbs.h` has a shorter `verbs_context` (fewer ops at
/// its start), so the pointer may lie before its allocation; only the
/// fields that its `sz` covers may be read through it.
///
/// # Safety
/// `ctx` must point to a live `ibv_context`.
#[inline]
pub unsafe fn verbs_get_ctx(ctx: *mut ibv_context) -> *mut verbs_context {
    // SAFETY: `ctx` is live (the caller's contract).
    if unsafe { (*ctx).abi_compat }.addr() != VERBS_ABI_IS_EXTENDED {
        return ptr::null_mut();
    }
    ctx.wrapping_byte_sub(offset_of!(verbs_context, context))
        .cast()
}

/// The address of field `$field` of the `verbs_context` at `$vctx`,
/// computed without an in-bounds projection (see [`verbs_get_ctx`]).
macro_rules! vctx_field {
    ($vctx:expr, $field:ident) => {
        field_ptr($vctx, offset_of!(verbs_context, $field), |v| {
            &raw const (*v).$field
        })
    };
}

/// `vctx + offset`, typed as the field that `_field` would project; the
/// closure only names that type and is never called.
#[inline]
fn field_ptr<T>(
    vctx: *const verbs_context,
    offset: usize,
    _field: impl FnOnce(*const verbs_context) -> *const T,
) -> *const T {
    vctx.wrapping_byte_add(offset).cast()
}

/// `verbs_get_ctx_op(ctx, op)` of `verbs.h`, yielding the op itself: `None`
/// when `ctx` is not extended, when the provider's `verbs_context` is too
/// short to hold `op` (`sz < sizeof(*vctx) - offsetof(op)`), or when `op`
/// is NULL. Must be used in an `unsafe` block, `ctx` a live context.
macro_rules! get_ctx_op {
    ($ctx:expr, $op:ident) => {{
        let vctx = verbs_get_ctx($ctx);
        // `sz` is the last field before the context, present in every
        // version; `op` is read only when `sz` covers it.
        if vctx.is_null()
            || vctx_field!(vctx, sz).read()
                < size_of::<verbs_context>() - offset_of!(verbs_context, $op)
        {
            None
        } else {
            vctx_field!(vctx, $op).read()
        }
    }};
}

/// Defines an inline of the shape `vctx = verbs_get_ctx_op(<context>, op);
/// if (!vctx) <fallback>; return vctx->op(args…);`.
macro_rules! ext_op {
    ($(#[$attr:meta])*
     fn $name:ident($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty;
     context: $ctx:expr, op: $op:ident, else: $fallback:expr) => {
        $(#[$attr])*
        #[inline]
        pub unsafe fn $name($($arg: $ty),*) -> $ret {
            // SAFETY: the object whose context is read is live (the
            // caller's contract), so is that context.
            match unsafe { get_ctx_op!($ctx, $op) } {
                // SAFETY: the provider's op with the caller's arguments, as
                // the C inline calls it.
                Some(op) => unsafe { op($($arg),*) },
                None => $fallback,
            }
        }
    };
}

/// Defines an inline of the shape `return obj->op(obj, args…);` (no NULL
/// check in C: a NULL op panics here).
macro_rules! obj_op {
    ($(#[$attr:meta])*
     fn $name:ident($obj:ident: $obj_ty:ty $(, $arg:ident: $ty:ty)* $(,)?) $(-> $ret:ty)?
     => $op:ident) => {
        $(#[$attr])*
        #[inline]
        pub unsafe fn $name($obj: $obj_ty $(, $arg: $ty)*) $(-> $ret)? {
            // SAFETY: `$obj` is live (the caller's contract).
            let Some(op) = (unsafe { (*$obj).$op }) else {
                null_op(stringify!($op))
            };
            // SAFETY: the provider's op with the caller's arguments, as the
            // C inline calls it.
            unsafe { op($obj $(, $arg)*) }
        }
    };
}

// ---------------------------------------------------------------------------
// Extended QP work-request builders (`qp->wr_*`).

obj_op! {
    /// Adds an atomic compare-and-swap WR (`qp->wr_atomic_cmp_swp`).
    ///
    /// # Safety
    /// As `ibv_wr_post(3)`: `qp` a live `ibv_qp_ex` inside `ibv_wr_start`,
    /// created with `IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP` in `send_ops_flags`.
    fn ibv_wr_atomic_cmp_swp(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64, compare: u64,
        swap: u64)
        => wr_atomic_cmp_swp
}

obj_op! {
    /// Adds an atomic fetch-and-add WR (`qp->wr_atomic_fetch_add`).
    ///
    /// # Safety
    /// As [`ibv_wr_atomic_cmp_swp`], with `IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD`.
    fn ibv_wr_atomic_fetch_add(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64, add: u64)
        => wr_atomic_fetch_add
}

obj_op! {
    /// Adds a memory-window bind WR (`qp->wr_bind_mw`).
    ///
    /// # Safety
    /// As [`ibv_wr_atomic_cmp_swp`], with `IBV_QP_EX_WITH_BIND_MW`;
    /// `mw` a live type-2 MW, `bind_info` valid for reads.
    fn ibv_wr_bind_mw(qp: *mut ibv_qp_ex, mw: *mut ibv_mw, rkey: u32,
        bind_info: *const ibv_mw_bind_info)
        => wr_bind_mw
}

obj_op! {
    /// Adds a local-invalidate WR (`qp->wr_local_inv`).
    ///
    /// # Safety
    /// As [`ibv_wr_atomic_cmp_swp`], with `IBV_QP_EX_WITH_LOCAL_INV`.
    fn ibv_wr_local_inv(qp: *mut ibv_qp_ex, invalidate_rkey: u32) => wr_local_inv
}

obj_op! {
    /// Adds an RDMA read WR (`qp->wr_rdma_read`).
    ///
    /// # Safety
    /// As [`ibv_wr_atomic_cmp_swp`], with `IBV_QP_EX_WITH_RDMA_READ`.
    fn ibv_wr_rdma_read(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64) => wr_rdma_read
}

obj_op! {
    /// Adds an RDMA write WR (`qp->wr_rdma_write`).
    ///
    /// # Safety
    /// As [`ibv_wr_atomic_cmp_swp`], with `IBV_QP_EX_WITH_RDMA_WRITE`.
    fn ibv_wr_rdma_write(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64) => wr_rdma_write
}

obj_op! {
    /// Adds an RDMA write-with-immediate WR (`qp->wr_rdma_write_imm`).
    ///
    /// # Safety
    /// As [`ibv_wr_atomic_cmp_swp`], with `IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM`.
    fn ibv_wr_rdma_write_imm(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64, imm_data: __be32)
        => wr_rdma_write_imm
}

obj_op! {
    /// Adds a send WR (`qp->wr_send`).
    ///
    /// # Safety
    /// As [`ibv_wr_atomic_cmp_swp`], with `IBV_QP_EX_WITH_SEND`.
    fn ibv_wr_send(qp: *mut ibv_qp_ex) => wr_send
}

obj_op! {
    /// Adds a send-with-immediate WR (`qp->wr_send_imm`).
    ///
    /// # Safety
    /// As [`ibv_wr_atomic_cmp_swp`], with `IBV_QP_EX_WITH_SEND_WITH_IMM`.
    fn ibv_wr_send_imm(qp: *mut ibv_qp_ex, imm_data: __be32) => wr_send_imm
}

obj_op! {
    /// Adds a send-with-invalidate WR (`qp->wr_send_inv`).
    ///
    /// # Safety
    /// As [`ibv_wr_atomic_cmp_swp`], with `IBV_QP_EX_WITH_SEND_WITH_INV`.
    fn ibv_wr_send_inv(qp: *mut ibv_qp_ex, invalidate_rkey: u32) => wr_send_inv
}

obj_op! {
    /// Adds a TSO send WR (`qp->wr_send_tso`).
    ///
    /// # Safety
    /// As [`ibv_wr_atomic_cmp_swp`], with `IBV_QP_EX_WITH_TSO`; `hdr` valid
    /// for `hdr_sz` reads.
    fn ibv_wr_send_tso(qp: *mut ibv_qp_ex, hdr: *mut c_void, hdr_sz: u16, mss: u16) => wr_send_tso
}

obj_op! {
    /// Sets the UD destination of the current WR (`qp->wr_set_ud_addr`).
    ///
    /// # Safety
    /// `qp` a live UD `ibv_qp_ex` inside `ibv_wr_start` with a WR begun;
    /// `ah` a live address handle.
    fn ibv_wr_set_ud_addr(qp: *mut ibv_qp_ex, ah: *mut ibv_ah, remote_qpn: u32, remote_qkey: u32)
        => wr_set_ud_addr
}

obj_op! {
    /// Sets the remote XRC SRQ number of the current WR
    /// (`qp->wr_set_xrc_srqn`).
    ///
    /// # Safety
    /// `qp` a live XRC send `ibv_qp_ex` inside `ibv_wr_start` with a WR begun.
    fn ibv_wr_set_xrc_srqn(qp: *mut ibv_qp_ex, remote_srqn: u32) => wr_set_xrc_srqn
}

obj_op! {
    /// Sets the current WR's data as inline bytes (`qp->wr_set_inline_data`).
    ///
    /// # Safety
    /// `qp` a live `ibv_qp_ex` inside `ibv_wr_start` with a WR begun; `addr`
    /// valid for `length` reads.
    fn ibv_wr_set_inline_data(qp: *mut ibv_qp_ex, addr: *mut c_void, length: usize)
        => wr_set_inline_data
}

obj_op! {
    /// Sets the current WR's data as a list of inline buffers
    /// (`qp->wr_set_inline_data_list`).
    ///
    /// # Safety
    /// As [`ibv_wr_set_inline_data`]; `buf_list` valid for `num_buf` reads,
    /// each buffer for its length.
    fn ibv_wr_set_inline_data_list(qp: *mut ibv_qp_ex, num_buf: usize,
        buf_list: *const ibv_data_buf)
        => wr_set_inline_data_list
}

obj_op! {
    /// Sets the current WR's data as one SGE (`qp->wr_set_sge`).
    ///
    /// # Safety
    /// `qp` a live `ibv_qp_ex` inside `ibv_wr_start` with a WR begun; the
    /// memory registered under `lkey` until the WR completes.
    fn ibv_wr_set_sge(qp: *mut ibv_qp_ex, lkey: u32, addr: u64, length: u32) => wr_set_sge
}

obj_op! {
    /// Sets the current WR's data as an SGE list (`qp->wr_set_sge_list`).
    ///
    /// # Safety
    /// As [`ibv_wr_set_sge`]; `sg_list` valid for `num_sge` reads.
    fn ibv_wr_set_sge_list(qp: *mut ibv_qp_ex, num_sge: usize, sg_list: *const ibv_sge)
        => wr_set_sge_list
}

obj_op! {
    /// Begins a batch of WRs (`qp->wr_start`).
    ///
    /// # Safety
    /// `qp` a live `ibv_qp_ex` created with `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`,
    /// not already inside `ibv_wr_start`.
    fn ibv_wr_start(qp: *mut ibv_qp_ex) => wr_start
}

obj_op! {
    /// Posts the batch begun by `ibv_wr_start` (`qp->wr_complete`): 0 or an
    /// errno value.
    ///
    /// # Safety
    /// `qp` a live `ibv_qp_ex` inside `ibv_wr_start`.
    fn ibv_wr_complete(qp: *mut ibv_qp_ex) -> c_int => wr_complete
}

obj_op! {
    /// Discards the batch begun by `ibv_wr_start` (`qp->wr_abort`).
    ///
    /// # Safety
    /// `qp` a live `ibv_qp_ex` inside `ibv_wr_start`.
    fn ibv_wr_abort(qp: *mut ibv_qp_ex) => wr_abort
}

obj_op! {
    /// Adds an atomic write WR (`qp->wr_atomic_write`).
    ///
    /// # Safety
    /// As [`ibv_wr_atomic_cmp_swp`], with `IBV_QP_EX_WITH_ATOMIC_WRITE`;
    /// `atomic_wr` valid for 8 reads.
    fn ibv_wr_atomic_write(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64,
        atomic_wr: *const c_void)
        => wr_atomic_write
}

// ---------------------------------------------------------------------------
// Extended CQ polling (`cq->start_poll`, `cq->read_*`, …).

/// The `ibv_cq` at the start of an `ibv_cq_ex` (a cast).
///
/// # Safety
/// None: the pointer is only converted. `unsafe` keeps the C binding's
/// signature.
#[inline]
pub unsafe fn ibv_cq_ex_to_cq(cq: *mut ibv_cq_ex) -> *mut ibv_cq {
    cq.cast()
}

obj_op! {
    /// Starts polling: reads the first completion into `cq`'s fields
    /// (`cq->start_poll`): 0, `ENOENT` when empty, or an errno value.
    ///
    /// # Safety
    /// As `ibv_create_cq_ex(3)`: `cq` a live extended CQ not being polled,
    /// `attr` valid for reads.
    fn ibv_start_poll(cq: *mut ibv_cq_ex, attr: *mut ibv_poll_cq_attr) -> c_int => start_poll
}

obj_op! {
    /// Moves to the next completion (`cq->next_poll`): 0, `ENOENT`, or an
    /// errno value.
    ///
    /// # Safety
    /// `cq` a live extended CQ whose `ibv_start_poll` returned 0.
    fn ibv_next_poll(cq: *mut ibv_cq_ex) -> c_int => next_poll
}

obj_op! {
    /// Ends polling (`cq->end_poll`).
    ///
    /// # Safety
    /// `cq` a live extended CQ whose `ibv_start_poll` returned 0.
    fn ibv_end_poll(cq: *mut ibv_cq_ex) => end_poll
}

obj_op! {
    /// The current completion's opcode (`cq->read_opcode`).
    ///
    /// # Safety
    /// `cq` a live extended CQ positioned on a completion.
    fn ibv_wc_read_opcode(cq: *mut ibv_cq_ex) -> ibv_wc_opcode => read_opcode
}

obj_op! {
    /// The current completion's vendor error (`cq->read_vendor_err`).
    ///
    /// # Safety
    /// As [`ibv_wc_read_opcode`].
    fn ibv_wc_read_vendor_err(cq: *mut ibv_cq_ex) -> u32 => read_vendor_err
}

obj_op! {
    /// The current completion's byte count (`cq->read_byte_len`).
    ///
    /// # Safety
    /// As [`ibv_wc_read_opcode`].
    fn ibv_wc_read_byte_len(cq: *mut ibv_cq_ex) -> u32 => read_byte_len
}

obj_op! {
    /// The current completion's immediate data, big-endian
    /// (`cq->read_imm_data`).
    ///
    /// # Safety
    /// As [`ibv_wc_read_opcode`].
    fn ibv_wc_read_imm_data(cq: *mut ibv_cq_ex) -> __be32 => read_imm_data
}

obj_op! {
    /// The rkey a send-with-invalidate invalidated: the immediate-data field
    /// read as a CPU-order number (`cq->read_imm_data`).
    ///
    /// # Safety
    /// As [`ibv_wc_read_opcode`].
    fn ibv_wc_read_invalidated_rkey(cq: *mut ibv_cq_ex) -> u32 => read_imm_data
}

obj_op! {
    /// The current completion's local QP number (`cq->read_qp_num`).
    ///
    /// # Safety
    /// As [`ibv_wc_read_opcode`].
    fn ibv_wc_read_qp_num(cq: *mut ibv_cq_ex) -> u32 => read_qp_num
}

obj_op! {
    /// The current completion's source QP number (`cq->read_src_qp`).
    ///
    /// # Safety
    /// As [`ibv_wc_read_opcode`].
    fn ibv_wc_read_src_qp(cq: *mut ibv_cq_ex) -> u32 => read_src_qp
}

obj_op! {
    /// The current completion's `ibv_wc_flags` (`cq->read_wc_flags`).
    ///
    /// # Safety
    /// As [`ibv_wc_read_opcode`].
    fn ibv_wc_read_wc_flags(cq: *mut ibv_cq_ex) -> c_uint => read_wc_flags
}

obj_op! {
    /// The current completion's source LID (`cq->read_slid`).
    ///
    /// # Safety
    /// As [`ibv_wc_read_opcode`].
    fn ibv_wc_read_slid(cq: *mut ibv_cq_ex) -> u32 => read_slid
}

obj_op! {
    /// The current completion's service level (`cq->read_sl`).
    ///
    /// # Safety
    /// As [`ibv_wc_read_opcode`].
    fn ibv_wc_read_sl(cq: *mut ibv_cq_ex) -> u8 => read_sl
}

obj_op! {
    /// The current completion's DLID path bits (`cq->read_dlid_path_bits`).
    ///
    /// # Safety
    /// As [`ibv_wc_read_opcode`].
    fn ibv_wc_read_dlid_path_bits(cq: *mut ibv_cq_ex) -> u8 => read_dlid_path_bits
}

obj_op! {
    /// The current completion's device timestamp (`cq->read_completion_ts`).
    ///
    /// # Safety
    /// As [`ibv_wc_read_opcode`].
    fn ibv_wc_read_completion_ts(cq: *mut ibv_cq_ex) -> u64 => read_completion_ts
}

obj_op! {
    /// The current completion's timestamp in wall-clock nanoseconds
    /// (`cq->read_completion_wallclock_ns`).
    ///
    /// # Safety
    /// As [`ibv_wc_read_opcode`].
    fn ibv_wc_read_completion_wallclock_ns(cq: *mut ibv_cq_ex) -> u64
        => read_completion_wallclock_ns
}

obj_op! {
    /// The current completion's customer VLAN (`cq->read_cvlan`).
    ///
    /// # Safety
    /// As [`ibv_wc_read_opcode`].
    fn ibv_wc_read_cvlan(cq: *mut ibv_cq_ex) -> u16 => read_cvlan
}

obj_op! {
    /// The current completion's flow tag (`cq->read_flow_tag`).
    ///
    /// # Safety
    /// As [`ibv_wc_read_opcode`].
    fn ibv_wc_read_flow_tag(cq: *mut ibv_cq_ex) -> u32 => read_flow_tag
}

obj_op! {
    /// Writes the current completion's tag-matching info to `tm_info`
    /// (`cq->read_tm_info`).
    ///
    /// # Safety
    /// As [`ibv_wc_read_opcode`]; `tm_info` valid for writes.
    fn ibv_wc_read_tm_info(cq: *mut ibv_cq_ex, tm_info: *mut ibv_wc_tm_info) => read_tm_info
}

obj_op! {
    /// Posts a list of receive WRs to a work queue (`wq->post_recv`).
    ///
    /// # Safety
    /// As `ibv_post_wq_recv(3)`: `wq` a live WQ, `recv_wr` a valid
    /// NULL-terminated chain whose buffers stay valid until completion,
    /// `bad_recv_wr` valid for writes.
    fn ibv_post_wq_recv(wq: *mut ibv_wq, recv_wr: *mut ibv_recv_wr,
        bad_recv_wr: *mut *mut ibv_recv_wr)
        -> c_int => post_recv
}

// ---------------------------------------------------------------------------
// Device and port queries.

/// Queries a port's attributes, extended fields included
/// (`vctx->query_port`); without that op, zeroes `port_attr` and calls the
/// exported compat `ibv_query_port`. The `ibv_query_port` macro's target.
///
/// # Safety
/// As `ibv_query_port(3)`: `context` an open device context, `port_attr`
/// valid for writes.
#[inline]
pub unsafe fn ___ibv_query_port(
    context: *mut ibv_context,
    port_num: u8,
    port_attr: *mut ibv_port_attr,
) -> c_int {
    // SAFETY: `context` is live (the caller's contract).
    match unsafe { get_ctx_op!(context, query_port) } {
        // SAFETY: the provider's op; `port_attr` is valid for
        // `sizeof(*port_attr)` writes (the caller's contract).
        Some(op) => unsafe { op(context, port_num, port_attr, size_of::<ibv_port_attr>()) },
        None => {
            // SAFETY: `port_attr` is valid for writes (the caller's
            // contract); the compat entry fills its legacy prefix.
            unsafe {
                ptr::write_bytes(port_attr, 0, 1);
                exported::compat_ibv_query_port(context, port_num, port_attr.cast())
            }
        }
    }
}

/// Queries one GID table entry (`_ibv_query_gid_ex` with
/// `sizeof(struct ibv_gid_entry)`): 0 or an errno value.
///
/// # Safety
/// As `ibv_query_gid_ex(3)`: `context` an open device context, `entry`
/// valid for writes.
#[inline]
pub unsafe fn ibv_query_gid_ex(
    context: *mut ibv_context,
    port_num: u32,
    gid_index: u32,
    entry: *mut ibv_gid_entry,
    flags: u32,
) -> c_int {
    // SAFETY: the exported function with the caller's arguments and the
    // entry size this crate's `ibv_gid_entry` has.
    unsafe {
        crate::_ibv_query_gid_ex(
            context,
            port_num,
            gid_index,
            entry,
            flags,
            size_of::<ibv_gid_entry>(),
        )
    }
}

/// Queries the whole GID table into `entries` (`_ibv_query_gid_table` with
/// `sizeof(struct ibv_gid_entry)`): the number of entries, or a negative
/// errno value.
///
/// # Safety
/// As `ibv_query_gid_table(3)`: `context` an open device context, `entries`
/// valid for `max_entries` writes.
#[inline]
pub unsafe fn ibv_query_gid_table(
    context: *mut ibv_context,
    entries: *mut ibv_gid_entry,
    max_entries: usize,
    flags: u32,
) -> isize {
    // SAFETY: the exported function with the caller's arguments and the
    // entry size this crate's `ibv_gid_entry` has.
    unsafe {
        crate::_ibv_query_gid_table(
            context,
            entries,
            max_entries,
            flags,
            size_of::<ibv_gid_entry>(),
        )
    }
}

/// Queries the device's extended attributes (`vctx->query_device_ex`):
/// `EINVAL` if `input` has a nonzero `comp_mask`; without the op, or when
/// it returns `EOPNOTSUPP`/`ENOSYS`, zeroes `attr` and fills `orig_attr`
/// with the exported `ibv_query_device`.
///
/// # Safety
/// As `ibv_query_device_ex(3)`: `context` an open device context, `input`
/// NULL or valid for reads, `attr` valid for writes.
#[inline]
pub unsafe fn ibv_query_device_ex(
    context: *mut ibv_context,
    input: *const ibv_query_device_ex_input,
    attr: *mut ibv_device_attr_ex,
) -> c_int {
    // SAFETY: `input` is NULL or valid for reads (the caller's contract).
    if !input.is_null() && unsafe { (*input).comp_mask } != 0 {
        return libc::EINVAL;
    }
    // SAFETY: `context` is live (the caller's contract).
    if let Some(op) = unsafe { get_ctx_op!(context, query_device_ex) } {
        // SAFETY: the provider's op; `attr` is valid for
        // `sizeof(*attr)` writes (the caller's contract).
        let ret = unsafe { op(context, input, attr, size_of::<ibv_device_attr_ex>()) };
        if ret != libc::EOPNOTSUPP && ret != libc::ENOSYS {
            return ret;
        }
    }
    // SAFETY: `attr` is valid for writes (the caller's contract).
    unsafe {
        ptr::write_bytes(attr, 0, 1);
        crate::ibv_query_device(context, &raw mut (*attr).orig_attr)
    }
}

ext_op! {
    /// Reads the device's real-time values, e.g. its clock
    /// (`vctx->query_rt_values`): 0 or an errno value, `EOPNOTSUPP` without
    /// the op.
    ///
    /// # Safety
    /// As `ibv_query_rt_values_ex(3)`: `context` an open device context,
    /// `values` valid for reads and writes.
    fn ibv_query_rt_values_ex(context: *mut ibv_context, values: *mut ibv_values_ex) -> c_int;
    context: context, op: query_rt_values, else: libc::EOPNOTSUPP
}

/// Whether bit `qpt` of the capability mask `caps` is set (1 or 0).
///
/// # Safety
/// None: pure arithmetic. `unsafe` keeps the C binding's signature.
#[inline]
pub unsafe fn ibv_is_qpt_supported(caps: u32, qpt: ibv_qp_type) -> c_int {
    // C shifts an `int` 1 by `qpt` (undefined from 31 on); the hardware
    // masks the count, as `wrapping_shl` does.
    c_int::from(caps & 1u32.wrapping_shl(qpt) != 0)
}

// ---------------------------------------------------------------------------
// Flow steering.

ext_op! {
    /// Attaches a flow-steering rule to `qp` (`vctx->ibv_create_flow`):
    /// NULL with `errno` on failure, `EOPNOTSUPP` without the op.
    ///
    /// # Safety
    /// As `ibv_create_flow(3)`: `qp` a live QP, `flow` a valid flow
    /// attribute followed by its specs.
    fn ibv_create_flow(qp: *mut ibv_qp, flow: *mut ibv_flow_attr) -> *mut ibv_flow;
    context: (*qp).context, op: ibv_create_flow, else: eopnotsupp_null()
}

ext_op! {
    /// Destroys a flow-steering rule (`vctx->ibv_destroy_flow`): 0 or an
    /// errno value, `EOPNOTSUPP` without the op.
    ///
    /// # Safety
    /// As `ibv_destroy_flow(3)`: `flow_id` a live flow, not used afterwards.
    fn ibv_destroy_flow(flow_id: *mut ibv_flow) -> c_int;
    context: (*flow_id).context, op: ibv_destroy_flow, else: libc::EOPNOTSUPP
}

ext_op! {
    /// Creates an ESP flow action (`vctx->create_flow_action_esp`): NULL
    /// with `errno` on failure, `EOPNOTSUPP` without the op.
    ///
    /// # Safety
    /// As `ibv_create_flow_action_esp(3)`: `ctx` an open device context,
    /// `esp` valid for reads.
    fn ibv_create_flow_action_esp(ctx: *mut ibv_context, esp: *mut ibv_flow_action_esp_attr)
        -> *mut ibv_flow_action;
    context: ctx, op: create_flow_action_esp, else: eopnotsupp_null()
}

ext_op! {
    /// Modifies an ESP flow action (`vctx->modify_flow_action_esp`): 0 or
    /// an errno value, `EOPNOTSUPP` without the op.
    ///
    /// # Safety
    /// As `ibv_modify_flow_action_esp(3)`: `action` a live flow action,
    /// `esp` valid for reads.
    fn ibv_modify_flow_action_esp(action: *mut ibv_flow_action, esp: *mut ibv_flow_action_esp_attr)
        -> c_int;
    context: (*action).context, op: modify_flow_action_esp, else: libc::EOPNOTSUPP
}

ext_op! {
    /// Destroys a flow action (`vctx->destroy_flow_action`): 0 or an errno
    /// value, `EOPNOTSUPP` without the op.
    ///
    /// # Safety
    /// As `ibv_destroy_flow_action(3)`: `action` a live flow action, not
    /// used afterwards.
    fn ibv_destroy_flow_action(action: *mut ibv_flow_action) -> c_int;
    context: (*action).context, op: destroy_flow_action, else: libc::EOPNOTSUPP
}

/// The RoCE v2 UDP source port for a GRH flow label: the label's low 14
/// bits XOR its next 6, within `0xC000..=0xFFFF`.
///
/// # Safety
/// None: pure arithmetic. `unsafe` keeps the C binding's signature.
#[inline]
pub unsafe fn ibv_flow_label_to_udp_sport(fl: u32) -> u16 {
    let fl_high = fl & 0xFC000;
    let fl_low = (fl & 0x03FFF) ^ (fl_high >> 14);
    (fl_low | 0xC000) as u16
}

// ---------------------------------------------------------------------------
// XRC domains.

ext_op! {
    /// Opens or creates an XRC domain (`vctx->open_xrcd`): NULL with `errno`
    /// on failure, `EOPNOTSUPP` without the op.
    ///
    /// # Safety
    /// As `ibv_open_xrcd(3)`: `context` an open device context,
    /// `xrcd_init_attr` valid for reads.
    fn ibv_open_xrcd(context: *mut ibv_context, xrcd_init_attr: *mut ibv_xrcd_init_attr)
        -> *mut ibv_xrcd;
    context: context, op: open_xrcd, else: eopnotsupp_null()
}

/// Closes an XRC domain (`vctx->close_xrcd`): 0 or an errno value.
///
/// C checks neither the context's kind, its size nor the op (an XRCD only
/// exists where `open_xrcd` did); a non-extended context or a NULL op
/// panics here.
///
/// # Safety
/// As `ibv_close_xrcd(3)`: `xrcd` a live XRC domain from
/// [`ibv_open_xrcd`], not used afterwards.
#[inline]
pub unsafe fn ibv_close_xrcd(xrcd: *mut ibv_xrcd) -> c_int {
    // SAFETY: `xrcd` is live (the caller's contract), so is its context.
    let vctx = unsafe { verbs_get_ctx((*xrcd).context) };
    if vctx.is_null() {
        null_op("close_xrcd");
    }
    // SAFETY: an XRCD's context is extended and holds `close_xrcd` (it
    // held `open_xrcd`, which comes before it).
    let Some(op) = (unsafe { vctx_field!(vctx, close_xrcd).read() }) else {
        null_op("close_xrcd")
    };
    // SAFETY: the provider's op with the caller's argument.
    unsafe { op(xrcd) }
}

// ---------------------------------------------------------------------------
// Memory regions and windows.

/// Registers a memory region: the exported `ibv_reg_mr` when
/// `is_access_const` is nonzero and `access` has no
/// `IBV_ACCESS_OPTIONAL_RANGE` bit, else `ibv_reg_mr_iova2` with
/// `iova == addr`. The `ibv_reg_mr` macro's target (C passes whether the
/// flags are a compile-time constant).
///
/// # Safety
/// As `ibv_reg_mr(3)`: `pd` a live protection domain, `[addr, addr +
/// length)` memory the caller keeps valid while registered.
#[inline]
pub unsafe fn __ibv_reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_uint,
    is_access_const: c_int,
) -> *mut ibv_mr {
    if is_access_const != 0 && access & crate::IBV_ACCESS_OPTIONAL_RANGE == 0 {
        // SAFETY: the exported function with the caller's arguments.
        unsafe { exported::ibv_reg_mr(pd, addr, length, access as c_int) }
    } else {
        // SAFETY: the exported function with the caller's arguments.
        unsafe { crate::ibv_reg_mr_iova2(pd, addr, length, addr.addr() as u64, access) }
    }
}

/// Registers a memory region whose device address is `iova`: the exported
/// `ibv_reg_mr_iova` when `is_access_const` is nonzero and `access` has no
/// `IBV_ACCESS_OPTIONAL_RANGE` bit, else `ibv_reg_mr_iova2`. The
/// `ibv_reg_mr_iova` macro's target.
///
/// # Safety
/// As [`__ibv_reg_mr`].
#[inline]
pub unsafe fn __ibv_reg_mr_iova(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_uint,
    is_access_const: c_int,
) -> *mut ibv_mr {
    if is_access_const != 0 && access & crate::IBV_ACCESS_OPTIONAL_RANGE == 0 {
        // SAFETY: the exported function with the caller's arguments.
        unsafe { exported::ibv_reg_mr_iova(pd, addr, length, iova, access as c_int) }
    } else {
        // SAFETY: the exported function with the caller's arguments.
        unsafe { crate::ibv_reg_mr_iova2(pd, addr, length, iova, access) }
    }
}

/// Allocates a memory window (`context->ops.alloc_mw`): NULL with `errno`
/// on failure, `EOPNOTSUPP` without the op.
///
/// # Safety
/// As `ibv_alloc_mw(3)`: `pd` a live protection domain.
#[inline]
pub unsafe fn ibv_alloc_mw(pd: *mut ibv_pd, type_: ibv_mw_type) -> *mut ibv_mw {
    // SAFETY: `pd` is live (the caller's contract), so is its context.
    match unsafe { (*(*pd).context).ops.alloc_mw } {
        // SAFETY: the provider's op with the caller's arguments.
        Some(op) => unsafe { op(pd, type_) },
        None => eopnotsupp_null(),
    }
}

/// Deallocates a memory window (`context->ops.dealloc_mw`, which C calls
/// unchecked: a NULL op panics here).
///
/// # Safety
/// As `ibv_dealloc_mw(3)`: `mw` a live memory window, not used afterwards.
#[inline]
pub unsafe fn ibv_dealloc_mw(mw: *mut ibv_mw) -> c_int {
    // SAFETY: `mw` is live (the caller's contract), so is its context.
    let Some(op) = (unsafe { (*(*mw).context).ops.dealloc_mw }) else {
        null_op("dealloc_mw")
    };
    // SAFETY: the provider's op with the caller's argument.
    unsafe { op(mw) }
}

/// The next rkey for a memory window: `rkey` with its low byte (the tag)
/// incremented modulo 256.
///
/// # Safety
/// None: pure arithmetic. `unsafe` keeps the C binding's signature.
#[inline]
pub unsafe fn ibv_inc_rkey(rkey: u32) -> u32 {
    const MASK: u32 = 0x0000_00ff;
    (rkey & !MASK) | (rkey.wrapping_add(1) & MASK)
}

/// Binds a type-1 memory window (`context->ops.bind_mw`): `EINVAL` for
/// another type or for an address range without an MR, `EPERM` when the
/// MR's PD is not the window's; else the op's result (called unchecked in
/// C: a NULL op panics here).
///
/// # Safety
/// As `ibv_bind_mw(3)`: `qp`, `mw` live, `mw_bind` valid for reads with
/// `bind_info.mr` NULL or live.
#[inline]
pub unsafe fn ibv_bind_mw(qp: *mut ibv_qp, mw: *mut ibv_mw, mw_bind: *mut ibv_mw_bind) -> c_int {
    // SAFETY: `mw` and `mw_bind` are valid for reads (the caller's contract).
    let (mw_type, mw_pd, info) = unsafe { ((*mw).type_, (*mw).pd, (*mw_bind).bind_info) };
    if mw_type != IBV_MW_TYPE_1 {
        return libc::EINVAL;
    }
    if info.mr.is_null() && (info.addr != 0 || info.length != 0) {
        return libc::EINVAL;
    }
    // SAFETY: a non-NULL `bind_info.mr` is live (the caller's contract).
    if !info.mr.is_null() && mw_pd != unsafe { (*info.mr).pd } {
        return libc::EPERM;
    }
    // SAFETY: `mw` is live, so is its context.
    let Some(op) = (unsafe { (*(*mw).context).ops.bind_mw }) else {
        null_op("bind_mw")
    };
    // SAFETY: the provider's op with the caller's arguments.
    unsafe { op(qp, mw, mw_bind) }
}

ext_op! {
    /// Gives the device advice about a range of an ODP memory region
    /// (`vctx->advise_mr`): 0 or an errno value, `EOPNOTSUPP` without the op.
    ///
    /// # Safety
    /// As `ibv_advise_mr(3)`: `pd` a live protection domain, `sg_list` valid
    /// for `num_sge` reads.
    fn ibv_advise_mr(pd: *mut ibv_pd, advice: ib_uverbs_advise_mr_advice, flags: u32,
        sg_list: *mut ibv_sge, num_sge: u32) -> c_int;
    context: (*pd).context, op: advise_mr, else: libc::EOPNOTSUPP
}

ext_op! {
    /// Allocates an MR that discards writes and reads zeroes
    /// (`vctx->alloc_null_mr`): NULL with `errno` on failure, `EOPNOTSUPP`
    /// without the op.
    ///
    /// # Safety
    /// As `ibv_alloc_null_mr(3)`: `pd` a live protection domain.
    fn ibv_alloc_null_mr(pd: *mut ibv_pd) -> *mut ibv_mr;
    context: (*pd).context, op: alloc_null_mr, else: eopnotsupp_null()
}

// ---------------------------------------------------------------------------
// Device memory.

ext_op! {
    /// Allocates device memory (`vctx->alloc_dm`): NULL with `errno` on
    /// failure, `EOPNOTSUPP` without the op.
    ///
    /// # Safety
    /// As `ibv_alloc_dm(3)`: `context` an open device context, `attr` valid
    /// for reads.
    fn ibv_alloc_dm(context: *mut ibv_context, attr: *mut ibv_alloc_dm_attr) -> *mut ibv_dm;
    context: context, op: alloc_dm, else: eopnotsupp_null()
}

ext_op! {
    /// Frees device memory (`vctx->free_dm`): 0 or an errno value,
    /// `EOPNOTSUPP` without the op.
    ///
    /// # Safety
    /// As `ibv_free_dm(3)`: `dm` live, with no MR left on it, not used
    /// afterwards.
    fn ibv_free_dm(dm: *mut ibv_dm) -> c_int;
    context: (*dm).context, op: free_dm, else: libc::EOPNOTSUPP
}

obj_op! {
    /// Copies `length` bytes from host memory into device memory at
    /// `dm_offset` (`dm->memcpy_to_dm`): 0 or an errno value.
    ///
    /// # Safety
    /// As `ibv_memcpy_to_dm(3)`: `dm` live, `host_addr` valid for `length`
    /// reads.
    fn ibv_memcpy_to_dm(dm: *mut ibv_dm, dm_offset: u64, host_addr: *const c_void, length: usize)
        -> c_int => memcpy_to_dm
}

/// Copies `length` bytes from device memory at `dm_offset` into host
/// memory (`dm->memcpy_from_dm`, called unchecked in C: a NULL op panics
/// here): 0 or an errno value.
///
/// # Safety
/// As `ibv_memcpy_from_dm(3)`: `dm` live, `host_addr` valid for `length`
/// writes.
#[inline]
pub unsafe fn ibv_memcpy_from_dm(
    host_addr: *mut c_void,
    dm: *mut ibv_dm,
    dm_offset: u64,
    length: usize,
) -> c_int {
    // SAFETY: `dm` is live (the caller's contract).
    let Some(op) = (unsafe { (*dm).memcpy_from_dm }) else {
        null_op("memcpy_from_dm")
    };
    // SAFETY: the provider's op with the caller's arguments.
    unsafe { op(host_addr, dm, dm_offset, length) }
}

ext_op! {
    /// Registers device memory as an MR (`vctx->reg_dm_mr`): NULL with
    /// `errno` on failure, `EOPNOTSUPP` without the op.
    ///
    /// # Safety
    /// As `ibv_reg_dm_mr(3)`: `pd` a live protection domain, `dm` live
    /// device memory of the same context.
    fn ibv_reg_dm_mr(pd: *mut ibv_pd, dm: *mut ibv_dm, dm_offset: u64, length: usize,
        access: c_uint) -> *mut ibv_mr;
    context: (*pd).context, op: reg_dm_mr, else: eopnotsupp_null()
}

// ---------------------------------------------------------------------------
// Completion queues, shared receive queues, queue pairs.

ext_op! {
    /// Creates an extended CQ (`vctx->create_cq_ex`): NULL with `errno` on
    /// failure, `EOPNOTSUPP` without the op.
    ///
    /// # Safety
    /// As `ibv_create_cq_ex(3)`: `context` an open device context, `cq_attr`
    /// valid for reads and writes.
    fn ibv_create_cq_ex(context: *mut ibv_context, cq_attr: *mut ibv_cq_init_attr_ex)
        -> *mut ibv_cq_ex;
    context: context, op: create_cq_ex, else: eopnotsupp_null()
}

ext_op! {
    /// Modifies a CQ's moderation (`vctx->modify_cq`): 0 or an errno value,
    /// `EOPNOTSUPP` without the op.
    ///
    /// # Safety
    /// As `ibv_modify_cq(3)`: `cq` a live CQ, `attr` valid for reads.
    fn ibv_modify_cq(cq: *mut ibv_cq, attr: *mut ibv_modify_cq_attr) -> c_int;
    context: (*cq).context, op: modify_cq, else: libc::EOPNOTSUPP
}

/// Creates an SRQ with extended attributes: the exported `ibv_create_srq`
/// when `comp_mask` holds `IBV_SRQ_INIT_ATTR_PD`, nothing but it and
/// `IBV_SRQ_INIT_ATTR_TYPE`, and the type (if given) is `IBV_SRQT_BASIC`;
/// else `vctx->create_srq_ex` (NULL with `errno` `EOPNOTSUPP` without it).
///
/// # Safety
/// As `ibv_create_srq_ex(3)`: `context` an open device context,
/// `srq_init_attr_ex` valid for reads and writes, its objects live.
#[inline]
pub unsafe fn ibv_create_srq_ex(
    context: *mut ibv_context,
    srq_init_attr_ex: *mut ibv_srq_init_attr_ex,
) -> *mut ibv_srq {
    let (pd_bit, type_bit) = (
        ibv_srq_init_attr_mask::IBV_SRQ_INIT_ATTR_PD.0,
        ibv_srq_init_attr_mask::IBV_SRQ_INIT_ATTR_TYPE.0,
    );
    // SAFETY: `srq_init_attr_ex` is valid for reads (the caller's contract).
    let (mask, srq_type, pd) = unsafe {
        let attr = &*srq_init_attr_ex;
        (attr.comp_mask, attr.srq_type, attr.pd)
    };
    if mask & !(pd_bit | type_bit) == 0
        && mask & pd_bit != 0
        && (mask & type_bit == 0 || srq_type == IBV_SRQT_BASIC)
    {
        // SAFETY: `ibv_srq_init_attr` is the prefix of
        // `ibv_srq_init_attr_ex` (as C casts it).
        return unsafe { crate::ibv_create_srq(pd, srq_init_attr_ex.cast()) };
    }
    // SAFETY: `context` is live (the caller's contract).
    match unsafe { get_ctx_op!(context, create_srq_ex) } {
        // SAFETY: the provider's op with the caller's arguments.
        Some(op) => unsafe { op(context, srq_init_attr_ex) },
        None => eopnotsupp_null(),
    }
}

ext_op! {
    /// The SRQ number of an XRC SRQ (`vctx->get_srq_num`): 0 or an errno
    /// value, `EOPNOTSUPP` without the op.
    ///
    /// # Safety
    /// As `ibv_get_srq_num(3)`: `srq` a live SRQ, `srq_num` valid for writes.
    fn ibv_get_srq_num(srq: *mut ibv_srq, srq_num: *mut u32) -> c_int;
    context: (*srq).context, op: get_srq_num, else: libc::EOPNOTSUPP
}

/// Posts tag-matching operations to an SRQ (`vctx->post_srq_ops`); without
/// the op, sets `*bad_op = op` and returns `EOPNOTSUPP`.
///
/// # Safety
/// As `ibv_post_srq_ops(3)`: `srq` a live tag-matching SRQ, `op` a valid
/// chain, `bad_op` valid for writes.
#[inline]
pub unsafe fn ibv_post_srq_ops(
    srq: *mut ibv_srq,
    op: *mut ibv_ops_wr,
    bad_op: *mut *mut ibv_ops_wr,
) -> c_int {
    // SAFETY: `srq` is live (the caller's contract), so is its context.
    match unsafe { get_ctx_op!((*srq).context, post_srq_ops) } {
        // SAFETY: the provider's op with the caller's arguments.
        Some(post) => unsafe { post(srq, op, bad_op) },
        None => {
            // SAFETY: `bad_op` is valid for writes (the caller's contract).
            unsafe { *bad_op = op };
            libc::EOPNOTSUPP
        }
    }
}

/// Creates a QP with extended attributes: the exported `ibv_create_qp`
/// when `comp_mask` is exactly `IBV_QP_INIT_ATTR_PD`, else
/// `vctx->create_qp_ex` (NULL with `errno` `EOPNOTSUPP` without it).
///
/// # Safety
/// As `ibv_create_qp_ex(3)`: `context` an open device context,
/// `qp_init_attr_ex` valid for reads and writes, its objects live.
#[inline]
pub unsafe fn ibv_create_qp_ex(
    context: *mut ibv_context,
    qp_init_attr_ex: *mut ibv_qp_init_attr_ex,
) -> *mut ibv_qp {
    // SAFETY: `qp_init_attr_ex` is valid for reads (the caller's contract).
    let (mask, pd) = unsafe { ((*qp_init_attr_ex).comp_mask, (*qp_init_attr_ex).pd) };
    if mask == ibv_qp_init_attr_mask::IBV_QP_INIT_ATTR_PD.0 {
        // SAFETY: `ibv_qp_init_attr` is the prefix of `ibv_qp_init_attr_ex`
        // (as C casts it).
        return unsafe { crate::ibv_create_qp(pd, qp_init_attr_ex.cast()) };
    }
    // SAFETY: `context` is live (the caller's contract).
    match unsafe { get_ctx_op!(context, create_qp_ex) } {
        // SAFETY: the provider's op with the caller's arguments.
        Some(op) => unsafe { op(context, qp_init_attr_ex) },
        None => eopnotsupp_null(),
    }
}

ext_op! {
    /// Opens a shareable XRC target QP (`vctx->open_qp`): NULL with `errno`
    /// on failure, `EOPNOTSUPP` without the op.
    ///
    /// # Safety
    /// As `ibv_open_qp(3)`: `context` an open device context, `qp_open_attr`
    /// valid for reads.
    fn ibv_open_qp(context: *mut ibv_context, qp_open_attr: *mut ibv_qp_open_attr) -> *mut ibv_qp;
    context: context, op: open_qp, else: eopnotsupp_null()
}

ext_op! {
    /// Sets a QP's send rate limit (`vctx->modify_qp_rate_limit`): 0 or an
    /// errno value, `EOPNOTSUPP` without the op.
    ///
    /// # Safety
    /// As `ibv_modify_qp_rate_limit(3)`: `qp` a live QP, `attr` valid for
    /// reads.
    fn ibv_modify_qp_rate_limit(qp: *mut ibv_qp, attr: *mut ibv_qp_rate_limit_attr) -> c_int;
    context: (*qp).context, op: modify_qp_rate_limit, else: libc::EOPNOTSUPP
}

// ---------------------------------------------------------------------------
// Thread and parent domains.

ext_op! {
    /// Allocates a thread domain (`vctx->alloc_td`): NULL with `errno` on
    /// failure, `EOPNOTSUPP` without the op.
    ///
    /// # Safety
    /// As `ibv_alloc_td(3)`: `context` an open device context, `init_attr`
    /// valid for reads.
    fn ibv_alloc_td(context: *mut ibv_context, init_attr: *mut ibv_td_init_attr) -> *mut ibv_td;
    context: context, op: alloc_td, else: eopnotsupp_null()
}

ext_op! {
    /// Deallocates a thread domain (`vctx->dealloc_td`): 0 or an errno
    /// value, `EOPNOTSUPP` without the op.
    ///
    /// # Safety
    /// As `ibv_dealloc_td(3)`: `td` a live thread domain, not used afterwards.
    fn ibv_dealloc_td(td: *mut ibv_td) -> c_int;
    context: (*td).context, op: dealloc_td, else: libc::EOPNOTSUPP
}

ext_op! {
    /// Allocates a parent domain (`vctx->alloc_parent_domain`): NULL with
    /// `errno` on failure, `EOPNOTSUPP` without the op.
    ///
    /// # Safety
    /// As `ibv_alloc_parent_domain(3)`: `context` an open device context,
    /// `attr` valid for reads, its objects live.
    fn ibv_alloc_parent_domain(context: *mut ibv_context, attr: *mut ibv_parent_domain_init_attr)
        -> *mut ibv_pd;
    context: context, op: alloc_parent_domain, else: eopnotsupp_null()
}

// ---------------------------------------------------------------------------
// Work queues and RSS indirection tables.

/// Creates a work queue (`vctx->create_wq`; NULL with `errno` `EOPNOTSUPP`
/// without it); on success sets its `wq_context` from the attributes,
/// `events_completed` to 0, and initialises its mutex and condition
/// variable.
///
/// # Safety
/// As `ibv_create_wq(3)`: `context` an open device context, `wq_init_attr`
/// valid for reads and writes, its objects live.
#[inline]
pub unsafe fn ibv_create_wq(
    context: *mut ibv_context,
    wq_init_attr: *mut ibv_wq_init_attr,
) -> *mut ibv_wq {
    // SAFETY: `context` is live (the caller's contract).
    let Some(op) = (unsafe { get_ctx_op!(context, create_wq) }) else {
        return eopnotsupp_null();
    };
    // SAFETY: the provider's op with the caller's arguments.
    let wq = unsafe { op(context, wq_init_attr) };
    if !wq.is_null() {
        // SAFETY: the provider returned a live WQ that nothing else uses
        // yet; `wq_init_attr` is valid for reads. The crate's pthread types
        // are libc's (same layout, from the same headers).
        unsafe {
            (*wq).wq_context = (*wq_init_attr).wq_context;
            (*wq).events_completed = 0;
            libc::pthread_mutex_init((&raw mut (*wq).mutex).cast(), ptr::null());
            libc::pthread_cond_init((&raw mut (*wq).cond).cast(), ptr::null());
        }
    }
    wq
}

ext_op! {
    /// Modifies a work queue (`vctx->modify_wq`): 0 or an errno value,
    /// `EOPNOTSUPP` without the op.
    ///
    /// # Safety
    /// As `ibv_modify_wq(3)`: `wq` a live WQ, `wq_attr` valid for reads.
    fn ibv_modify_wq(wq: *mut ibv_wq, wq_attr: *mut ibv_wq_attr) -> c_int;
    context: (*wq).context, op: modify_wq, else: libc::EOPNOTSUPP
}

ext_op! {
    /// Destroys a work queue (`vctx->destroy_wq`): 0 or an errno value,
    /// `EOPNOTSUPP` without the op.
    ///
    /// # Safety
    /// As `ibv_destroy_wq(3)`: `wq` a live WQ, not used afterwards.
    fn ibv_destroy_wq(wq: *mut ibv_wq) -> c_int;
    context: (*wq).context, op: destroy_wq, else: libc::EOPNOTSUPP
}

ext_op! {
    /// Creates an RSS indirection table (`vctx->create_rwq_ind_table`):
    /// NULL with `errno` on failure, `EOPNOTSUPP` without the op.
    ///
    /// # Safety
    /// As `ibv_create_rwq_ind_table(3)`: `context` an open device context,
    /// `init_attr` valid for reads, its WQs live.
    fn ibv_create_rwq_ind_table(context: *mut ibv_context,
        init_attr: *mut ibv_rwq_ind_table_init_attr) -> *mut ibv_rwq_ind_table;
    context: context, op: create_rwq_ind_table, else: eopnotsupp_null()
}

ext_op! {
    /// Destroys an RSS indirection table (`vctx->destroy_rwq_ind_table`): 0
    /// or an errno value, `EOPNOTSUPP` without the op.
    ///
    /// # Safety
    /// As `ibv_destroy_rwq_ind_table(3)`: `rwq_ind_table` live, not used
    /// afterwards.
    fn ibv_destroy_rwq_ind_table(rwq_ind_table: *mut ibv_rwq_ind_table) -> c_int;
    context: (*rwq_ind_table).context, op: destroy_rwq_ind_table, else: libc::EOPNOTSUPP
}

// ---------------------------------------------------------------------------
// Counters.

ext_op! {
    /// Creates a counters object (`vctx->create_counters`): NULL with
    /// `errno` on failure, `EOPNOTSUPP` without the op.
    ///
    /// # Safety
    /// As `ibv_create_counters(3)`: `context` an open device context,
    /// `init_attr` valid for reads.
    fn ibv_create_counters(context: *mut ibv_context, init_attr: *mut ibv_counters_init_attr)
        -> *mut ibv_counters;
    context: context, op: create_counters, else: eopnotsupp_null()
}

ext_op! {
    /// Destroys a counters object (`vctx->destroy_counters`): 0 or an errno
    /// value, `EOPNOTSUPP` without the op.
    ///
    /// # Safety
    /// As `ibv_destroy_counters(3)`: `counters` live, not used afterwards.
    fn ibv_destroy_counters(counters: *mut ibv_counters) -> c_int;
    context: (*counters).context, op: destroy_counters, else: libc::EOPNOTSUPP
}

ext_op! {
    /// Attaches a counter point to a flow (`vctx->attach_counters_point_flow`):
    /// 0 or an errno value, `EOPNOTSUPP` without the op.
    ///
    /// # Safety
    /// As `ibv_attach_counters_point_flow(3)`: `counters` live, `attr` valid
    /// for reads, `flow` NULL or live.
    fn ibv_attach_counters_point_flow(counters: *mut ibv_counters,
        attr: *mut ibv_counter_attach_attr, flow: *mut ibv_flow) -> c_int;
    context: (*counters).context, op: attach_counters_point_flow, else: libc::EOPNOTSUPP
}

ext_op! {
    /// Reads counter values (`vctx->read_counters`): 0 or an errno value,
    /// `EOPNOTSUPP` without the op.
    ///
    /// # Safety
    /// As `ibv_read_counters(3)`: `counters` live, `counters_value` valid for
    /// `ncounters` writes.
    fn ibv_read_counters(counters: *mut ibv_counters, counters_value: *mut u64, ncounters: u32,
        flags: u32) -> c_int;
    context: (*counters).context, op: read_counters, else: libc::EOPNOTSUPP
}
