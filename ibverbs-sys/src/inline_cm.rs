//! Rust ports of the `static inline` functions of rdma-core's
//! `rdma/rdma_cma.h` and `rdma/rdma_verbs.h` (rdma-core 44; feature
//! `rdmacm`).
//!
//! Each has the C function's name and signature and behaves as it does:
//! `rdma_verbs.h` reports failures as `-1` with `errno` (`rdma_seterrno`),
//! and its `assert`s (active in the C shim) are `assert!`s here. The verbs
//! they call are this crate's: the data-path inlines of the crate root
//! (`ibv_post_send`, `ibv_poll_cq`, …), the Rust port of `__ibv_reg_mr`,
//! and the exported libibverbs functions.
#![deny(unsafe_op_in_unsafe_fn)]

use core::ffi::{c_int, c_uint, c_void};
use core::ptr;

use crate::*;

/// The source address of `id`'s route (`&id->route.addr.src_addr`).
///
/// # Safety
/// `id` must point to a live `rdma_cm_id`.
#[inline]
pub unsafe fn rdma_get_local_addr(id: *mut rdma_cm_id) -> *mut sockaddr {
    // SAFETY: `id` is live (the caller's contract); only an address is taken.
    unsafe { &raw mut (*id).route.addr.__bindgen_anon_1.src_addr }
}

/// The destination address of `id`'s route (`&id->route.addr.dst_addr`).
///
/// # Safety
/// `id` must point to a live `rdma_cm_id`.
#[inline]
pub unsafe fn rdma_get_peer_addr(id: *mut rdma_cm_id) -> *mut sockaddr {
    // SAFETY: `id` is live (the caller's contract); only an address is taken.
    unsafe { &raw mut (*id).route.addr.__bindgen_anon_2.dst_addr }
}

/// Turns an errno-value result into librdmacm's convention: a nonzero
/// `ret` is stored in `errno` and becomes `-1`; 0 stays 0.
///
/// # Safety
/// None: it only sets `errno`. `unsafe` keeps the C binding's signature.
#[inline]
pub unsafe fn rdma_seterrno(ret: c_int) -> c_int {
    if ret != 0 {
        // SAFETY: `__errno_location` returns the calling thread's errno,
        // always valid for writes.
        unsafe { *libc::__errno_location() = ret };
        -1
    } else {
        ret
    }
}

/// `ibv_reg_mr(id->pd, addr, length, access)` with constant flags, as the
/// C macro expands it in `rdma_verbs.h`.
///
/// # Safety
/// As `rdma_reg_msgs(3)`.
#[inline]
unsafe fn reg_mr(
    id: *mut rdma_cm_id,
    addr: *mut c_void,
    length: usize,
    access: c_uint,
) -> *mut ibv_mr {
    // SAFETY: `id` is live (the caller's contract); the flags are constant
    // without `IBV_ACCESS_OPTIONAL_RANGE`, which the C macro passes as
    // `is_access_const = 1`.
    unsafe { crate::inline::__ibv_reg_mr((*id).pd, addr, length, access, 1) }
}

/// Registers `[addr, addr + length)` on `id`'s PD for sends and receives
/// (`IBV_ACCESS_LOCAL_WRITE`): NULL with `errno` on failure.
///
/// # Safety
/// As `rdma_reg_msgs(3)`: `id` a live id with a PD, the memory kept valid
/// while registered.
#[inline]
pub unsafe fn rdma_reg_msgs(id: *mut rdma_cm_id, addr: *mut c_void, length: usize) -> *mut ibv_mr {
    let access = ibv_access_flags::IBV_ACCESS_LOCAL_WRITE;
    // SAFETY: forwarded contract.
    unsafe { reg_mr(id, addr, length, access.0) }
}

/// Registers memory as the target of remote reads
/// (`IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ`): NULL with `errno`
/// on failure.
///
/// # Safety
/// As [`rdma_reg_msgs`].
#[inline]
pub unsafe fn rdma_reg_read(id: *mut rdma_cm_id, addr: *mut c_void, length: usize) -> *mut ibv_mr {
    let access =
        ibv_access_flags::IBV_ACCESS_LOCAL_WRITE | ibv_access_flags::IBV_ACCESS_REMOTE_READ;
    // SAFETY: forwarded contract.
    unsafe { reg_mr(id, addr, length, access.0) }
}

/// Registers memory as the target of remote writes
/// (`IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE`): NULL with `errno`
/// on failure.
///
/// # Safety
/// As [`rdma_reg_msgs`].
#[inline]
pub unsafe fn rdma_reg_write(id: *mut rdma_cm_id, addr: *mut c_void, length: usize) -> *mut ibv_mr {
    let access =
        ibv_access_flags::IBV_ACCESS_LOCAL_WRITE | ibv_access_flags::IBV_ACCESS_REMOTE_WRITE;
    // SAFETY: forwarded contract.
    unsafe { reg_mr(id, addr, length, access.0) }
}

/// Deregisters a memory region (`ibv_dereg_mr`): 0, or `-1` with `errno`.
///
/// # Safety
/// As `rdma_dereg_mr(3)`: `mr` a live MR, not used afterwards.
#[inline]
pub unsafe fn rdma_dereg_mr(mr: *mut ibv_mr) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { rdma_seterrno(crate::ibv_dereg_mr(mr)) }
}

/// Posts one receive WR (`wr_id = context`) with the SGEs `sgl[..nsge]` to
/// `id`'s SRQ if it has one, else to its QP: 0, or `-1` with `errno`.
///
/// # Safety
/// As `rdma_post_recvv(3)`: `id` a live id with a QP or SRQ, `sgl` valid
/// for `nsge` reads, the buffers registered and kept valid until the
/// completion.
#[inline]
pub unsafe fn rdma_post_recvv(
    id: *mut rdma_cm_id,
    context: *mut c_void,
    sgl: *mut ibv_sge,
    nsge: c_int,
) -> c_int {
    let mut wr = ibv_recv_wr {
        wr_id: context.addr() as u64,
        next: ptr::null_mut(),
        sg_list: sgl,
        num_sge: nsge,
    };
    let mut bad = ptr::null_mut();
    // SAFETY: `id` is live (the caller's contract).
    let (srq, qp) = unsafe { ((*id).srq, (*id).qp) };
    // SAFETY: the caller's objects and a WR that lives across the call.
    let ret = unsafe {
        if srq.is_null() {
            crate::ibv_post_recv(qp, &mut wr, &mut bad)
        } else {
            crate::ibv_post_srq_recv(srq, &mut wr, &mut bad)
        }
    };
    // SAFETY: only sets errno.
    unsafe { rdma_seterrno(ret) }
}

/// Posts one send WR to `id`'s QP and returns `rdma_seterrno` of the result.
///
/// # Safety
/// `id` live with a QP; `wr` valid, its buffers as `ibv_post_send(3)`.
#[inline]
unsafe fn post_send(id: *mut rdma_cm_id, wr: &mut ibv_send_wr) -> c_int {
    let mut bad = ptr::null_mut();
    // SAFETY: forwarded contract.
    unsafe { rdma_seterrno(crate::ibv_post_send((*id).qp, wr, &mut bad)) }
}

/// A send WR with the fields every `rdma_post_*` send sets; the others are
/// zero (C leaves them uninitialised, and providers ignore them).
#[inline]
fn send_wr(
    context: *mut c_void,
    sgl: *mut ibv_sge,
    nsge: c_int,
    opcode: ibv_wr_opcode,
    flags: c_int,
) -> ibv_send_wr {
    ibv_send_wr {
        wr_id: context.addr() as u64,
        next: ptr::null_mut(),
        sg_list: sgl,
        num_sge: nsge,
        opcode,
        send_flags: flags as c_uint,
        ..Default::default()
    }
}

/// Posts one send WR (`IBV_WR_SEND`, `wr_id = context`) with the SGEs
/// `sgl[..nsge]`: 0, or `-1` with `errno`.
///
/// # Safety
/// As `rdma_post_sendv(3)`: `id` a live id with a QP, `sgl` valid for
/// `nsge` reads, the buffers registered (or inline) and kept valid until
/// the completion.
#[inline]
pub unsafe fn rdma_post_sendv(
    id: *mut rdma_cm_id,
    context: *mut c_void,
    sgl: *mut ibv_sge,
    nsge: c_int,
    flags: c_int,
) -> c_int {
    let mut wr = send_wr(context, sgl, nsge, IBV_WR_SEND, flags);
    // SAFETY: forwarded contract.
    unsafe { post_send(id, &mut wr) }
}

/// Posts one RDMA read WR into the SGEs `sgl[..nsge]` from `remote_addr`
/// under `rkey`: 0, or `-1` with `errno`.
///
/// # Safety
/// As `rdma_post_readv(3)`, see [`rdma_post_sendv`].
#[inline]
pub unsafe fn rdma_post_readv(
    id: *mut rdma_cm_id,
    context: *mut c_void,
    sgl: *mut ibv_sge,
    nsge: c_int,
    flags: c_int,
    remote_addr: u64,
    rkey: u32,
) -> c_int {
    let mut wr = send_wr(context, sgl, nsge, IBV_WR_RDMA_READ, flags);
    wr.wr.rdma = ibv_send_wr__bindgen_ty_2__bindgen_ty_1 { remote_addr, rkey };
    // SAFETY: forwarded contract.
    unsafe { post_send(id, &mut wr) }
}

/// Posts one RDMA write WR from the SGEs `sgl[..nsge]` to `remote_addr`
/// under `rkey`: 0, or `-1` with `errno`.
///
/// # Safety
/// As `rdma_post_writev(3)`, see [`rdma_post_sendv`].
#[inline]
pub unsafe fn rdma_post_writev(
    id: *mut rdma_cm_id,
    context: *mut c_void,
    sgl: *mut ibv_sge,
    nsge: c_int,
    flags: c_int,
    remote_addr: u64,
    rkey: u32,
) -> c_int {
    let mut wr = send_wr(context, sgl, nsge, IBV_WR_RDMA_WRITE, flags);
    wr.wr.rdma = ibv_send_wr__bindgen_ty_2__bindgen_ty_1 { remote_addr, rkey };
    // SAFETY: forwarded contract.
    unsafe { post_send(id, &mut wr) }
}

/// One SGE over `[addr, addr + length)` with `lkey` (the length truncated
/// to 32 bits, as C casts it).
#[inline]
fn sge(addr: *mut c_void, length: usize, lkey: u32) -> ibv_sge {
    ibv_sge {
        addr: addr.addr() as u64,
        length: length as u32,
        lkey,
    }
}

/// `mr ? mr->lkey : 0`.
///
/// # Safety
/// `mr` NULL or a live MR.
#[inline]
unsafe fn lkey_or_zero(mr: *mut ibv_mr) -> u32 {
    if mr.is_null() {
        0
    } else {
        // SAFETY: a non-NULL `mr` is live (the caller's contract).
        unsafe { (*mr).lkey }
    }
}

/// Posts a receive of `[addr, addr + length)` registered under `mr`:
/// 0, or `-1` with `errno`.
///
/// # Panics
/// When the buffer is not inside `mr` (C `assert`s it).
///
/// # Safety
/// As `rdma_post_recv(3)`: `id` a live id with a QP or SRQ, `mr` a live MR
/// (not NULL), the buffer kept valid until the completion.
#[inline]
pub unsafe fn rdma_post_recv(
    id: *mut rdma_cm_id,
    context: *mut c_void,
    addr: *mut c_void,
    length: usize,
    mr: *mut ibv_mr,
) -> c_int {
    // SAFETY: `mr` is live (the caller's contract).
    let (mr_addr, mr_length, lkey) = unsafe { ((*mr).addr, (*mr).length, (*mr).lkey) };
    let (start, mr_start) = (addr.addr(), mr_addr.addr());
    assert!(
        start >= mr_start && start.wrapping_add(length) <= mr_start.wrapping_add(mr_length),
        "rdma_post_recv: the buffer is not inside the MR"
    );
    let mut sge = sge(addr, length, lkey);
    // SAFETY: forwarded contract; `sge` lives across the call.
    unsafe { rdma_post_recvv(id, context, &mut sge, 1) }
}

/// Posts a send of `[addr, addr + length)` registered under `mr` (NULL:
/// lkey 0, for inline sends): 0, or `-1` with `errno`.
///
/// # Safety
/// As `rdma_post_send(3)`: `id` a live id with a QP, `mr` NULL or live,
/// the buffer kept valid until the completion (or the call, if inline).
#[inline]
pub unsafe fn rdma_post_send(
    id: *mut rdma_cm_id,
    context: *mut c_void,
    addr: *mut c_void,
    length: usize,
    mr: *mut ibv_mr,
    flags: c_int,
) -> c_int {
    // SAFETY: `mr` is NULL or live (the caller's contract).
    let mut sge = sge(addr, length, unsafe { lkey_or_zero(mr) });
    // SAFETY: forwarded contract; `sge` lives across the call.
    unsafe { rdma_post_sendv(id, context, &mut sge, 1, flags) }
}

/// Posts an RDMA read into `[addr, addr + length)` registered under `mr`
/// from `remote_addr` under `rkey`: 0, or `-1` with `errno`.
///
/// # Safety
/// As `rdma_post_read(3)`: `id` a live id with a QP, `mr` a live MR (not
/// NULL), the buffer kept valid until the completion.
#[inline]
pub unsafe fn rdma_post_read(
    id: *mut rdma_cm_id,
    context: *mut c_void,
    addr: *mut c_void,
    length: usize,
    mr: *mut ibv_mr,
    flags: c_int,
    remote_addr: u64,
    rkey: u32,
) -> c_int {
    // SAFETY: `mr` is live (the caller's contract).
    let mut sge = sge(addr, length, unsafe { (*mr).lkey });
    // SAFETY: forwarded contract; `sge` lives across the call.
    unsafe { rdma_post_readv(id, context, &mut sge, 1, flags, remote_addr, rkey) }
}

/// Posts an RDMA write from `[addr, addr + length)` registered under `mr`
/// (NULL: lkey 0, for inline data) to `remote_addr` under `rkey`: 0, or
/// `-1` with `errno`.
///
/// # Safety
/// As `rdma_post_write(3)`, see [`rdma_post_send`].
#[inline]
pub unsafe fn rdma_post_write(
    id: *mut rdma_cm_id,
    context: *mut c_void,
    addr: *mut c_void,
    length: usize,
    mr: *mut ibv_mr,
    flags: c_int,
    remote_addr: u64,
    rkey: u32,
) -> c_int {
    // SAFETY: `mr` is NULL or live (the caller's contract).
    let mut sge = sge(addr, length, unsafe { lkey_or_zero(mr) });
    // SAFETY: forwarded contract; `sge` lives across the call.
    unsafe { rdma_post_writev(id, context, &mut sge, 1, flags, remote_addr, rkey) }
}

/// Posts a UD send of `[addr, addr + length)` (`mr` NULL: lkey 0) to
/// `remote_qpn` through `ah`, with the qkey `RDMA_UDP_QKEY`: 0, or `-1`
/// with `errno`.
///
/// # Safety
/// As `rdma_post_ud_send(3)`: `id` a live UD id with a QP, `ah` live, `mr`
/// NULL or live, the buffer kept valid until the completion.
#[inline]
pub unsafe fn rdma_post_ud_send(
    id: *mut rdma_cm_id,
    context: *mut c_void,
    addr: *mut c_void,
    length: usize,
    mr: *mut ibv_mr,
    flags: c_int,
    ah: *mut ibv_ah,
    remote_qpn: u32,
) -> c_int {
    // SAFETY: `mr` is NULL or live (the caller's contract).
    let mut sge = sge(addr, length, unsafe { lkey_or_zero(mr) });
    let mut wr = send_wr(context, &mut sge, 1, IBV_WR_SEND, flags);
    wr.wr.ud = ibv_send_wr__bindgen_ty_2__bindgen_ty_3 {
        ah,
        remote_qpn,
        remote_qkey: RDMA_UDP_QKEY,
    };
    // SAFETY: forwarded contract; `sge` and `wr` live across the call.
    unsafe { post_send(id, &mut wr) }
}

/// Waits for one completion on `cq` (one of `id`'s), blocking on `channel`
/// when the CQ is empty: the loop of `rdma_get_send_comp` and
/// `rdma_get_recv_comp`.
///
/// # Safety
/// `id`, `cq`, `channel` live; `wc` valid for writes; `cq` reports its
/// events on `channel` with `id` as its context.
#[inline]
unsafe fn get_comp(
    id: *mut rdma_cm_id,
    cq: *mut ibv_cq,
    channel: *mut ibv_comp_channel,
    wc: *mut ibv_wc,
) -> c_int {
    let ret = loop {
        // SAFETY: `cq` is live and `wc` valid for one write (the caller's
        // contract).
        let ret = unsafe { crate::ibv_poll_cq(cq, 1, wc) };
        if ret != 0 {
            break ret;
        }
        // SAFETY: as above.
        let ret = unsafe { crate::ibv_req_notify_cq(cq, 0) };
        if ret != 0 {
            // SAFETY: only sets errno.
            return unsafe { rdma_seterrno(ret) };
        }
        // SAFETY: as above.
        let ret = unsafe { crate::ibv_poll_cq(cq, 1, wc) };
        if ret != 0 {
            break ret;
        }
        let mut event_cq = ptr::null_mut();
        let mut event_context = ptr::null_mut();
        // SAFETY: `channel` is live; both out-pointers are valid.
        let ret = unsafe { crate::ibv_get_cq_event(channel, &mut event_cq, &mut event_context) };
        if ret != 0 {
            return ret;
        }
        assert!(
            event_cq == cq && event_context == id.cast(),
            "rdma_get_*_comp: the event is not for this id's CQ"
        );
        // SAFETY: acknowledges the one event just taken from `cq`.
        unsafe { crate::ibv_ack_cq_events(cq, 1) };
    };
    if ret < 0 {
        // SAFETY: only sets errno (to the negative count, as C does).
        unsafe { rdma_seterrno(ret) }
    } else {
        ret
    }
}

/// Waits for one completion on `id`'s send CQ into `wc`: the number of
/// completions (1), or `-1` with `errno`.
///
/// # Panics
/// When the CQ event is not for `id->send_cq` with context `id` (C
/// `assert`s it).
///
/// # Safety
/// As `rdma_get_send_comp(3)`: `id` a live id whose send CQ and channel
/// librdmacm created, `wc` valid for writes.
#[inline]
pub unsafe fn rdma_get_send_comp(id: *mut rdma_cm_id, wc: *mut ibv_wc) -> c_int {
    // SAFETY: `id` is live (the caller's contract); forwarded contract.
    unsafe { get_comp(id, (*id).send_cq, (*id).send_cq_channel, wc) }
}

/// Waits for one completion on `id`'s receive CQ into `wc`: the number of
/// completions (1), or `-1` with `errno`.
///
/// # Panics
/// When the CQ event is not for `id->recv_cq` with context `id` (C
/// `assert`s it).
///
/// # Safety
/// As `rdma_get_recv_comp(3)`: `id` a live id whose receive CQ and channel
/// librdmacm created, `wc` valid for writes.
#[inline]
pub unsafe fn rdma_get_recv_comp(id: *mut rdma_cm_id, wc: *mut ibv_wc) -> c_int {
    // SAFETY: `id` is live (the caller's contract); forwarded contract.
    unsafe { get_comp(id, (*id).recv_cq, (*id).recv_cq_channel, wc) }
}
