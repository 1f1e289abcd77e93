//! Differential test of the Rust ports of the static inline verbs
//! (`rdma_verbs_sys::inline`, `inline_cm`) against the C functions that
//! rdma-core's headers compile (module `c` below).
//!
//! Both sides run on the same fake objects: a `verbs_context` whose ops,
//! and an `ibv_qp_ex`/`ibv_cq_ex`/`ibv_wq`/`ibv_dm` whose function
//! pointers, are recording `extern "C"` functions (name and arguments into
//! a thread-local log, a fixed or scripted return value). The exported
//! libibverbs functions the inlines fall back to (`ibv_query_device`, the
//! compat `ibv_query_port`, `ibv_create_srq`, `ibv_create_qp`,
//! `ibv_reg_mr*`, `_ibv_query_gid_*`, `ibv_dereg_mr`, `ibv_get_cq_event`,
//! `ibv_ack_cq_events`) are faked the same way: this executable defines
//! those symbols, and a definition in the executable takes precedence over
//! libibverbs' for every reference linked into it (the C shim's and the
//! crate's alike). Each comparison covers the return value, `errno` (set
//! to a sentinel before each call) and the log of calls.
//!
//! Not compared, because the C side crashes or aborts there: a NULL
//! function pointer that C calls unchecked (the port panics instead: this
//! test checks that), a non-extended context in `ibv_close_xrcd`, and a
//! failing `assert` of `rdma_verbs.h` (the port panics: checked too).
//!
//! Needs the headers' C (feature `bindgen`). With the `dlopen` feature both
//! sides reach libibverbs through `dlsym`, which these fakes cannot
//! interpose: the test is compiled out.
#![cfg(all(feature = "bindgen", not(feature = "dlopen")))]

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::ffi::{c_int, c_uint, c_void};
use std::fmt::Debug;
use std::mem::{offset_of, size_of};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;

use rdma_verbs_sys::*;

/// The C side: the headers' own inline functions, compiled by the build
/// script (feature `bindgen`) under `<name>__c` and declared here under
/// their C names.
mod c {
    #![allow(dead_code, non_camel_case_types, clippy::all)]
    use rdma_verbs_sys::*;
    include!(concat!(env!("OUT_DIR"), "/c_inlines.rs"));
}

/// The Rust side: the crate's ports.
mod rs {
    pub use rdma_verbs_sys::*;
}

// ---------------------------------------------------------------------------
// The log of calls, scripted return values, errno.

#[derive(Debug, Clone, PartialEq, Eq)]
struct Call {
    name: &'static str,
    args: Vec<u64>,
}

thread_local! {
    static CALLS: RefCell<Vec<Call>> = const { RefCell::new(Vec::new()) };
    /// Return values a fake hands out in turn, by name (then its default).
    static SCRIPT: RefCell<HashMap<&'static str, VecDeque<i64>>> = RefCell::new(HashMap::new());
    /// What the fake `ibv_get_cq_event` reports: the CQ and its context.
    static EVENT: Cell<(*mut ibv_cq, *mut c_void)> =
        const { Cell::new((ptr::null_mut(), ptr::null_mut())) };
}

fn record(name: &'static str, args: Vec<u64>) {
    CALLS.with(|calls| calls.borrow_mut().push(Call { name, args }));
}

fn script(name: &'static str, values: &[i64]) {
    SCRIPT.with(|s| {
        s.borrow_mut()
            .insert(name, values.iter().copied().collect())
    });
}

fn next_scripted(name: &'static str) -> Option<i64> {
    SCRIPT.with(|s| s.borrow_mut().get_mut(name).and_then(VecDeque::pop_front))
}

const ERRNO_SENTINEL: c_int = 4242;

fn errno() -> c_int {
    // SAFETY: the calling thread's errno.
    unsafe { *libc::__errno_location() }
}

fn set_errno(value: c_int) {
    // SAFETY: the calling thread's errno.
    unsafe { *libc::__errno_location() = value };
}

/// An argument as the log stores it.
trait Arg {
    fn arg(self) -> u64;
}
macro_rules! int_arg {
    ($($t:ty),*) => { $(impl Arg for $t { fn arg(self) -> u64 { self as u64 } })* };
}
int_arg!(u8, u16, u32, u64, usize, i32);
impl<T> Arg for *mut T {
    fn arg(self) -> u64 {
        self.addr() as u64
    }
}
impl<T> Arg for *const T {
    fn arg(self) -> u64 {
        self.addr() as u64
    }
}

/// What a fake returns: the next scripted value, else a fixed one.
trait FakeRet {
    fn fake(name: &'static str) -> Self;
}
macro_rules! int_ret {
    ($($t:ty = $default:expr),*) => {
        $(impl FakeRet for $t {
            fn fake(name: &'static str) -> Self {
                next_scripted(name).map_or($default, |v| v as $t)
            }
        })*
    };
}
int_ret!(
    i32 = 7,
    u32 = 0x1234_5678,
    u16 = 0x4321,
    u8 = 0x5a,
    u64 = 0x0123_4567_89ab_cdef,
    isize = 9
);
/// The pointer every object-returning fake returns (never dereferenced).
const SENTINEL: usize = 0x5e00;
impl<T> FakeRet for *mut T {
    fn fake(_: &'static str) -> Self {
        ptr::without_provenance_mut(SENTINEL)
    }
}
impl FakeRet for () {
    fn fake(_: &'static str) -> Self {}
}

/// Defines a recording fake: logs its name and arguments, returns
/// `FakeRet::fake`.
macro_rules! rec {
    ($(#[$attr:meta])* $vis:vis $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)?) => {
        $(#[$attr])*
        $vis unsafe extern "C" fn $name($($arg: $ty),*) $(-> $ret)? {
            record(stringify!($name), vec![$(Arg::arg($arg)),*]);
            FakeRet::fake(stringify!($name))
        }
    };
}

/// The observable effects of one call.
#[derive(Debug, PartialEq)]
struct Outcome {
    ret: String,
    errno: c_int,
    calls: Vec<Call>,
    /// Scripted values left unconsumed.
    script_left: Vec<(&'static str, Vec<i64>)>,
}

impl Outcome {
    fn called(&self, name: &str) -> bool {
        self.calls.iter().any(|c| c.name == name)
    }
}

#[track_caller]
fn observe<R: Debug>(setup: &dyn Fn(), f: impl FnOnce() -> R) -> Outcome {
    CALLS.with(|calls| calls.borrow_mut().clear());
    SCRIPT.with(|s| s.borrow_mut().clear());
    setup();
    set_errno(ERRNO_SENTINEL);
    let ret = f();
    let errno = errno();
    let mut script_left: Vec<_> = SCRIPT.with(|s| {
        s.borrow()
            .iter()
            .filter(|(_, v)| !v.is_empty())
            .map(|(k, v)| (*k, v.iter().copied().collect()))
            .collect()
    });
    script_left.sort();
    Outcome {
        ret: format!("{ret:?}"),
        errno,
        calls: CALLS.with(|calls| calls.take()),
        script_left,
    }
}

/// Runs `setup` then the C side, `setup` then the Rust side, and asserts
/// the same outcome; returns it.
#[track_caller]
fn same<R: Debug>(
    what: &str,
    setup: &dyn Fn(),
    c_side: impl FnOnce() -> R,
    rust_side: impl FnOnce() -> R,
) -> Outcome {
    let c = observe(setup, c_side);
    let rust = observe(setup, rust_side);
    assert_eq!(
        rust, c,
        "{what}: the Rust port (left) differs from C (right)"
    );
    c
}

/// `diff!([setup =>] f(args…))`: [`same`] for `c::f` and `rs::f`. The
/// arguments are evaluated for each side: pass values, not allocations.
macro_rules! diff {
    ($setup:expr => $f:ident($($arg:expr),* $(,)?)) => {
        // SAFETY: both sides get the same live fake objects.
        same(
            concat!(stringify!($f), "(", stringify!($($arg),*), ")"),
            &$setup,
            || unsafe { c::$f($($arg),*) },
            || unsafe { rs::$f($($arg),*) },
        )
    };
    ($f:ident($($arg:expr),* $(,)?)) => { diff!(|| () => $f($($arg),*)) };
}

/// Asserts that the Rust side panics (where C would call through NULL or
/// abort).
macro_rules! rust_panics {
    ($f:ident($($arg:expr),* $(,)?)) => {{
        // SAFETY: the fake objects are live; the port panics before any
        // call through NULL.
        let result = catch_unwind(AssertUnwindSafe(|| unsafe { rs::$f($($arg),*) }));
        assert!(result.is_err(), concat!(stringify!($f), " did not panic"));
    }};
}

// ---------------------------------------------------------------------------
// Recording fakes of the provider's function pointers.

rec!(vctx_query_port(
    context: *mut ibv_context,
    port_num: u8,
    port_attr: *mut ibv_port_attr,
    port_attr_len: usize,
) -> c_int);
rec!(vctx_advise_mr(
    pd: *mut ibv_pd,
    advice: ib_uverbs_advise_mr_advice,
    flags: u32,
    sg_list: *mut ibv_sge,
    num_sges: u32,
) -> c_int);
rec!(vctx_alloc_null_mr(pd: *mut ibv_pd) -> *mut ibv_mr);
rec!(vctx_read_counters(
    counters: *mut ibv_counters,
    counters_value: *mut u64,
    ncounters: u32,
    flags: u32,
) -> c_int);
rec!(vctx_attach_counters_point_flow(
    counters: *mut ibv_counters,
    attr: *mut ibv_counter_attach_attr,
    flow: *mut ibv_flow,
) -> c_int);
rec!(vctx_create_counters(
    context: *mut ibv_context,
    init_attr: *mut ibv_counters_init_attr,
) -> *mut ibv_counters);
rec!(vctx_destroy_counters(counters: *mut ibv_counters) -> c_int);
rec!(vctx_reg_dm_mr(
    pd: *mut ibv_pd,
    dm: *mut ibv_dm,
    dm_offset: u64,
    length: usize,
    access: c_uint,
) -> *mut ibv_mr);
rec!(vctx_alloc_dm(context: *mut ibv_context, attr: *mut ibv_alloc_dm_attr) -> *mut ibv_dm);
rec!(vctx_free_dm(dm: *mut ibv_dm) -> c_int);
rec!(vctx_modify_flow_action_esp(
    action: *mut ibv_flow_action,
    attr: *mut ibv_flow_action_esp_attr,
) -> c_int);
rec!(vctx_destroy_flow_action(action: *mut ibv_flow_action) -> c_int);
rec!(vctx_create_flow_action_esp(
    context: *mut ibv_context,
    attr: *mut ibv_flow_action_esp_attr,
) -> *mut ibv_flow_action);
rec!(vctx_modify_qp_rate_limit(qp: *mut ibv_qp, attr: *mut ibv_qp_rate_limit_attr) -> c_int);
rec!(vctx_alloc_parent_domain(
    context: *mut ibv_context,
    attr: *mut ibv_parent_domain_init_attr,
) -> *mut ibv_pd);
rec!(vctx_dealloc_td(td: *mut ibv_td) -> c_int);
rec!(vctx_alloc_td(context: *mut ibv_context, init_attr: *mut ibv_td_init_attr) -> *mut ibv_td);
rec!(vctx_modify_cq(cq: *mut ibv_cq, attr: *mut ibv_modify_cq_attr) -> c_int);
rec!(vctx_post_srq_ops(
    srq: *mut ibv_srq,
    op: *mut ibv_ops_wr,
    bad_op: *mut *mut ibv_ops_wr,
) -> c_int);
rec!(vctx_destroy_rwq_ind_table(rwq_ind_table: *mut ibv_rwq_ind_table) -> c_int);
rec!(vctx_create_rwq_ind_table(
    context: *mut ibv_context,
    init_attr: *mut ibv_rwq_ind_table_init_attr,
) -> *mut ibv_rwq_ind_table);
rec!(vctx_destroy_wq(wq: *mut ibv_wq) -> c_int);
rec!(vctx_modify_wq(wq: *mut ibv_wq, wq_attr: *mut ibv_wq_attr) -> c_int);
rec!(vctx_query_rt_values(context: *mut ibv_context, values: *mut ibv_values_ex) -> c_int);
rec!(vctx_create_cq_ex(
    context: *mut ibv_context,
    init_attr: *mut ibv_cq_init_attr_ex,
) -> *mut ibv_cq_ex);
rec!(vctx_query_device_ex(
    context: *mut ibv_context,
    input: *const ibv_query_device_ex_input,
    attr: *mut ibv_device_attr_ex,
    attr_size: usize,
) -> c_int);
rec!(vctx_ibv_destroy_flow(flow: *mut ibv_flow) -> c_int);
rec!(vctx_ibv_create_flow(qp: *mut ibv_qp, flow_attr: *mut ibv_flow_attr) -> *mut ibv_flow);
rec!(vctx_open_qp(context: *mut ibv_context, attr: *mut ibv_qp_open_attr) -> *mut ibv_qp);
rec!(vctx_create_qp_ex(
    context: *mut ibv_context,
    qp_init_attr_ex: *mut ibv_qp_init_attr_ex,
) -> *mut ibv_qp);
rec!(vctx_get_srq_num(srq: *mut ibv_srq, srq_num: *mut u32) -> c_int);
rec!(vctx_create_srq_ex(
    context: *mut ibv_context,
    srq_init_attr_ex: *mut ibv_srq_init_attr_ex,
) -> *mut ibv_srq);
rec!(vctx_open_xrcd(
    context: *mut ibv_context,
    xrcd_init_attr: *mut ibv_xrcd_init_attr,
) -> *mut ibv_xrcd);
rec!(vctx_close_xrcd(xrcd: *mut ibv_xrcd) -> c_int);

thread_local! {
    /// The WQ the fake `create_wq` returns, refilled with 0xAA each time
    /// so that what `ibv_create_wq` initialises shows.
    static WQ: *mut ibv_wq = Box::into_raw(Box::default());
}

fn fake_wq() -> *mut ibv_wq {
    WQ.with(|wq| *wq)
}

/// The fake WQ's bytes.
fn wq_bytes() -> Vec<u8> {
    // SAFETY: the thread's fake WQ, a live allocation of that size.
    unsafe { std::slice::from_raw_parts(fake_wq().cast::<u8>(), size_of::<ibv_wq>()).to_vec() }
}

unsafe extern "C" fn vctx_create_wq(
    context: *mut ibv_context,
    wq_init_attr: *mut ibv_wq_init_attr,
) -> *mut ibv_wq {
    record("vctx_create_wq", vec![context.arg(), wq_init_attr.arg()]);
    if next_scripted("vctx_create_wq") == Some(0) {
        return ptr::null_mut();
    }
    let wq = fake_wq();
    // SAFETY: the thread's fake WQ.
    unsafe { ptr::write_bytes(wq, 0xAA, 1) };
    wq
}

rec!(qpx_wr_atomic_cmp_swp(
    qp: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    compare: u64,
    swap: u64,
));
rec!(qpx_wr_atomic_fetch_add(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64, add: u64));
rec!(qpx_wr_bind_mw(
    qp: *mut ibv_qp_ex,
    mw: *mut ibv_mw,
    rkey: u32,
    bind_info: *const ibv_mw_bind_info,
));
rec!(qpx_wr_local_inv(qp: *mut ibv_qp_ex, invalidate_rkey: u32));
rec!(qpx_wr_rdma_read(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64));
rec!(qpx_wr_rdma_write(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64));
rec!(qpx_wr_rdma_write_imm(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64, imm_data: __be32));
rec!(qpx_wr_send(qp: *mut ibv_qp_ex));
rec!(qpx_wr_send_imm(qp: *mut ibv_qp_ex, imm_data: __be32));
rec!(qpx_wr_send_inv(qp: *mut ibv_qp_ex, invalidate_rkey: u32));
rec!(qpx_wr_send_tso(qp: *mut ibv_qp_ex, hdr: *mut c_void, hdr_sz: u16, mss: u16));
rec!(qpx_wr_set_ud_addr(qp: *mut ibv_qp_ex, ah: *mut ibv_ah, remote_qpn: u32, remote_qkey: u32));
rec!(qpx_wr_set_xrc_srqn(qp: *mut ibv_qp_ex, remote_srqn: u32));
rec!(qpx_wr_set_inline_data(qp: *mut ibv_qp_ex, addr: *mut c_void, length: usize));
rec!(qpx_wr_set_inline_data_list(
    qp: *mut ibv_qp_ex,
    num_buf: usize,
    buf_list: *const ibv_data_buf,
));
rec!(qpx_wr_set_sge(qp: *mut ibv_qp_ex, lkey: u32, addr: u64, length: u32));
rec!(qpx_wr_set_sge_list(qp: *mut ibv_qp_ex, num_sge: usize, sg_list: *const ibv_sge));
rec!(qpx_wr_start(qp: *mut ibv_qp_ex));
rec!(qpx_wr_complete(qp: *mut ibv_qp_ex) -> c_int);
rec!(qpx_wr_abort(qp: *mut ibv_qp_ex));
rec!(qpx_wr_atomic_write(
    qp: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    atomic_wr: *const c_void,
));

rec!(cqx_start_poll(current: *mut ibv_cq_ex, attr: *mut ibv_poll_cq_attr) -> c_int);
rec!(cqx_next_poll(current: *mut ibv_cq_ex) -> c_int);
rec!(cqx_end_poll(current: *mut ibv_cq_ex));
rec!(cqx_read_opcode(current: *mut ibv_cq_ex) -> ibv_wc_opcode);
rec!(cqx_read_vendor_err(current: *mut ibv_cq_ex) -> u32);
rec!(cqx_read_byte_len(current: *mut ibv_cq_ex) -> u32);
rec!(cqx_read_imm_data(current: *mut ibv_cq_ex) -> __be32);
rec!(cqx_read_qp_num(current: *mut ibv_cq_ex) -> u32);
rec!(cqx_read_src_qp(current: *mut ibv_cq_ex) -> u32);
rec!(cqx_read_wc_flags(current: *mut ibv_cq_ex) -> c_uint);
rec!(cqx_read_slid(current: *mut ibv_cq_ex) -> u32);
rec!(cqx_read_sl(current: *mut ibv_cq_ex) -> u8);
rec!(cqx_read_dlid_path_bits(current: *mut ibv_cq_ex) -> u8);
rec!(cqx_read_completion_ts(current: *mut ibv_cq_ex) -> u64);
rec!(cqx_read_cvlan(current: *mut ibv_cq_ex) -> u16);
rec!(cqx_read_flow_tag(current: *mut ibv_cq_ex) -> u32);
rec!(cqx_read_tm_info(current: *mut ibv_cq_ex, tm_info: *mut ibv_wc_tm_info));
rec!(cqx_read_completion_wallclock_ns(current: *mut ibv_cq_ex) -> u64);

rec!(ops_alloc_mw(pd: *mut ibv_pd, type_: ibv_mw_type) -> *mut ibv_mw);
rec!(ops_bind_mw(qp: *mut ibv_qp, mw: *mut ibv_mw, mw_bind: *mut ibv_mw_bind) -> c_int);
rec!(ops_dealloc_mw(mw: *mut ibv_mw) -> c_int);
rec!(ops_poll_cq(cq: *mut ibv_cq, num_entries: c_int, wc: *mut ibv_wc) -> c_int);
rec!(ops_req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int);

/// The fields of a receive WR chain that C sets, with its SGEs' contents
/// (an SGE on the inline's stack has no comparable address).
///
/// # Safety
/// `wr` a valid chain of valid SGE lists.
unsafe fn recv_wr_args(mut wr: *const ibv_recv_wr, args: &mut Vec<u64>) {
    while !wr.is_null() {
        // SAFETY: a valid WR (the caller's contract).
        let w = unsafe { &*wr };
        args.extend([w.wr_id, w.num_sge as u64]);
        // SAFETY: as above.
        unsafe { sge_args(w.sg_list, w.num_sge, args) };
        wr = w.next;
    }
}

/// # Safety
/// `sg_list` valid for `num_sge` reads.
unsafe fn sge_args(sg_list: *const ibv_sge, num_sge: c_int, args: &mut Vec<u64>) {
    for i in 0..num_sge.max(0) as usize {
        // SAFETY: the caller's contract.
        let sge = unsafe { *sg_list.add(i) };
        args.extend([sge.addr, sge.length.into(), sge.lkey.into()]);
    }
}

unsafe extern "C" fn ops_post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    _bad: *mut *mut ibv_recv_wr,
) -> c_int {
    let mut args = vec![qp.arg()];
    // SAFETY: the inline's WR.
    unsafe { recv_wr_args(wr, &mut args) };
    record("ops_post_recv", args);
    FakeRet::fake("ops_post_recv")
}

unsafe extern "C" fn ops_post_srq_recv(
    srq: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    _bad: *mut *mut ibv_recv_wr,
) -> c_int {
    let mut args = vec![srq.arg()];
    // SAFETY: the inline's WR.
    unsafe { recv_wr_args(wr, &mut args) };
    record("ops_post_srq_recv", args);
    FakeRet::fake("ops_post_srq_recv")
}

/// Logs the fields of the send WR that C sets: the common ones, the RDMA
/// target for RDMA opcodes, the UD address on a UD QP (C leaves the rest
/// uninitialised).
unsafe extern "C" fn ops_post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    _bad: *mut *mut ibv_send_wr,
) -> c_int {
    let mut args = vec![qp.arg()];
    let mut wr = wr.cast_const();
    while !wr.is_null() {
        // SAFETY: the inline's WR.
        let w = unsafe { &*wr };
        args.extend([
            w.wr_id,
            w.num_sge as u64,
            w.opcode.into(),
            w.send_flags.into(),
        ]);
        // SAFETY: its SGE list.
        unsafe { sge_args(w.sg_list, w.num_sge, &mut args) };
        if w.opcode == IBV_WR_RDMA_READ || w.opcode == IBV_WR_RDMA_WRITE {
            // SAFETY: C sets this union member for these opcodes.
            let rdma = unsafe { w.wr.rdma };
            args.extend([rdma.remote_addr, rdma.rkey.into()]);
        }
        // SAFETY: `qp` is the test's fake QP.
        if unsafe { (*qp).qp_type } == IBV_QPT_UD {
            // SAFETY: C sets this union member on UD sends.
            let ud = unsafe { w.wr.ud };
            args.extend([ud.ah.arg(), ud.remote_qpn.into(), ud.remote_qkey.into()]);
        }
        wr = w.next;
    }
    record("ops_post_send", args);
    FakeRet::fake("ops_post_send")
}

rec!(dm_memcpy_to_dm(
    dm: *mut ibv_dm,
    dm_offset: u64,
    host_addr: *const c_void,
    length: usize,
) -> c_int);
rec!(dm_memcpy_from_dm(
    host_addr: *mut c_void,
    dm: *mut ibv_dm,
    dm_offset: u64,
    length: usize,
) -> c_int);
rec!(wq_post_recv(
    current: *mut ibv_wq,
    recv_wr: *mut ibv_recv_wr,
    bad_recv_wr: *mut *mut ibv_recv_wr,
) -> c_int);

// ---------------------------------------------------------------------------
// Fakes of the exported libibverbs functions the inlines call.

/// Whether `len` bytes at `p` are all zero (an inline zeroes the attrs
/// before some fallbacks).
///
/// # Safety
/// `p` valid for `len` reads.
unsafe fn all_zero(p: *const c_void, len: usize) -> u64 {
    // SAFETY: the caller's contract.
    let bytes = unsafe { std::slice::from_raw_parts(p.cast::<u8>(), len) };
    bytes.iter().all(|&b| b == 0).into()
}

/// The compat `ibv_query_port` (the `ibv_query_port` macro's fallback).
#[no_mangle]
unsafe extern "C" fn ibv_query_port(
    context: *mut ibv_context,
    port_num: u8,
    port_attr: *mut c_void,
) -> c_int {
    // SAFETY: the inline passes a whole `ibv_port_attr`.
    let zeroed = unsafe { all_zero(port_attr, size_of::<ibv_port_attr>()) };
    record(
        "ibv_query_port",
        vec![context.arg(), port_num.into(), port_attr.arg(), zeroed],
    );
    FakeRet::fake("ibv_query_port")
}

/// `ibv_query_device_ex`'s fallback.
#[no_mangle]
unsafe extern "C" fn ibv_query_device(
    context: *mut ibv_context,
    device_attr: *mut ibv_device_attr,
) -> c_int {
    // SAFETY: the inline passes `&attr->orig_attr`, at offset 0 of a whole
    // `ibv_device_attr_ex`.
    let zeroed = unsafe { all_zero(device_attr.cast(), size_of::<ibv_device_attr_ex>()) };
    record(
        "ibv_query_device",
        vec![context.arg(), device_attr.arg(), zeroed],
    );
    FakeRet::fake("ibv_query_device")
}

rec!(#[no_mangle] _ibv_query_gid_ex(
    context: *mut ibv_context,
    port_num: u32,
    gid_index: u32,
    entry: *mut ibv_gid_entry,
    flags: u32,
    entry_size: usize,
) -> c_int);
rec!(#[no_mangle] _ibv_query_gid_table(
    context: *mut ibv_context,
    entries: *mut ibv_gid_entry,
    max_entries: usize,
    flags: u32,
    entry_size: usize,
) -> isize);
rec!(#[no_mangle] ibv_create_srq(
    pd: *mut ibv_pd,
    srq_init_attr: *mut ibv_srq_init_attr,
) -> *mut ibv_srq);
rec!(#[no_mangle] ibv_create_qp(
    pd: *mut ibv_pd,
    qp_init_attr: *mut ibv_qp_init_attr,
) -> *mut ibv_qp);
rec!(#[no_mangle] ibv_reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> *mut ibv_mr);
rec!(#[no_mangle] ibv_reg_mr_iova(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_int,
) -> *mut ibv_mr);
rec!(#[no_mangle] ibv_reg_mr_iova2(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_uint,
) -> *mut ibv_mr);
rec!(#[no_mangle] ibv_dereg_mr(mr: *mut ibv_mr) -> c_int);
rec!(#[no_mangle] ibv_ack_cq_events(cq: *mut ibv_cq, nevents: c_uint));

/// Reports the event set in `EVENT`, or fails with a scripted value.
#[no_mangle]
unsafe extern "C" fn ibv_get_cq_event(
    channel: *mut ibv_comp_channel,
    cq: *mut *mut ibv_cq,
    cq_context: *mut *mut c_void,
) -> c_int {
    record("ibv_get_cq_event", vec![channel.arg()]);
    let ret: c_int = next_scripted("ibv_get_cq_event").map_or(0, |v| v as c_int);
    if ret == 0 {
        let (event_cq, event_context) = EVENT.with(Cell::get);
        // SAFETY: the inline's out-pointers.
        unsafe { (cq.write(event_cq), cq_context.write(event_context)) };
    } else {
        set_errno(libc::EAGAIN);
    }
    ret
}

// ---------------------------------------------------------------------------
// The fake objects.

fn leak<T>(value: T) -> *mut T {
    Box::into_raw(Box::new(value))
}

/// A fake extended context with every op a recorder, and one object of
/// each kind on it. Leaked: the tests are short.
struct World {
    vctx: *mut verbs_context,
    ctx: *mut ibv_context,
    pd: *mut ibv_pd,
    qp: *mut ibv_qp,
    cq: *mut ibv_cq,
    srq: *mut ibv_srq,
    wq: *mut ibv_wq,
    mw: *mut ibv_mw,
    dm: *mut ibv_dm,
    flow: *mut ibv_flow,
    action: *mut ibv_flow_action,
    xrcd: *mut ibv_xrcd,
    td: *mut ibv_td,
    rwq_ind_table: *mut ibv_rwq_ind_table,
    counters: *mut ibv_counters,
    qpx: *mut ibv_qp_ex,
    cqx: *mut ibv_cq_ex,
    /// Zeroed memory passed as any attribute struct the inline does not read.
    scratch: *mut [u64; 512],
}

impl World {
    fn new() -> World {
        let vctx = leak(verbs_context {
            query_port: Some(vctx_query_port),
            advise_mr: Some(vctx_advise_mr),
            alloc_null_mr: Some(vctx_alloc_null_mr),
            read_counters: Some(vctx_read_counters),
            attach_counters_point_flow: Some(vctx_attach_counters_point_flow),
            create_counters: Some(vctx_create_counters),
            destroy_counters: Some(vctx_destroy_counters),
            reg_dm_mr: Some(vctx_reg_dm_mr),
            alloc_dm: Some(vctx_alloc_dm),
            free_dm: Some(vctx_free_dm),
            modify_flow_action_esp: Some(vctx_modify_flow_action_esp),
            destroy_flow_action: Some(vctx_destroy_flow_action),
            create_flow_action_esp: Some(vctx_create_flow_action_esp),
            modify_qp_rate_limit: Some(vctx_modify_qp_rate_limit),
            alloc_parent_domain: Some(vctx_alloc_parent_domain),
            dealloc_td: Some(vctx_dealloc_td),
            alloc_td: Some(vctx_alloc_td),
            modify_cq: Some(vctx_modify_cq),
            post_srq_ops: Some(vctx_post_srq_ops),
            destroy_rwq_ind_table: Some(vctx_destroy_rwq_ind_table),
            create_rwq_ind_table: Some(vctx_create_rwq_ind_table),
            destroy_wq: Some(vctx_destroy_wq),
            modify_wq: Some(vctx_modify_wq),
            create_wq: Some(vctx_create_wq),
            query_rt_values: Some(vctx_query_rt_values),
            create_cq_ex: Some(vctx_create_cq_ex),
            query_device_ex: Some(vctx_query_device_ex),
            ibv_destroy_flow: Some(vctx_ibv_destroy_flow),
            ibv_create_flow: Some(vctx_ibv_create_flow),
            open_qp: Some(vctx_open_qp),
            create_qp_ex: Some(vctx_create_qp_ex),
            get_srq_num: Some(vctx_get_srq_num),
            create_srq_ex: Some(vctx_create_srq_ex),
            open_xrcd: Some(vctx_open_xrcd),
            close_xrcd: Some(vctx_close_xrcd),
            sz: size_of::<verbs_context>(),
            ..Default::default()
        });
        // SAFETY: `vctx` is live; the context keeps the whole struct's
        // provenance.
        let ctx = unsafe { &raw mut (*vctx).context };
        // SAFETY: as above.
        unsafe {
            (*ctx).abi_compat = ptr::without_provenance_mut(usize::MAX);
            let ops = &mut (*ctx).ops;
            ops.alloc_mw = Some(ops_alloc_mw);
            ops.bind_mw = Some(ops_bind_mw);
            ops.dealloc_mw = Some(ops_dealloc_mw);
            ops.poll_cq = Some(ops_poll_cq);
            ops.req_notify_cq = Some(ops_req_notify_cq);
            ops.post_srq_recv = Some(ops_post_srq_recv);
            ops.post_send = Some(ops_post_send);
            ops.post_recv = Some(ops_post_recv);
        }
        let pd = leak(ibv_pd {
            context: ctx,
            ..Default::default()
        });
        World {
            vctx,
            ctx,
            pd,
            qp: leak(ibv_qp {
                context: ctx,
                pd,
                ..Default::default()
            }),
            cq: leak(ibv_cq {
                context: ctx,
                ..Default::default()
            }),
            srq: leak(ibv_srq {
                context: ctx,
                pd,
                ..Default::default()
            }),
            wq: leak(ibv_wq {
                context: ctx,
                post_recv: Some(wq_post_recv),
                ..Default::default()
            }),
            mw: leak(ibv_mw {
                context: ctx,
                pd,
                type_: IBV_MW_TYPE_1,
                ..Default::default()
            }),
            dm: leak(ibv_dm {
                context: ctx,
                memcpy_to_dm: Some(dm_memcpy_to_dm),
                memcpy_from_dm: Some(dm_memcpy_from_dm),
                ..Default::default()
            }),
            flow: leak(ibv_flow {
                context: ctx,
                ..Default::default()
            }),
            action: leak(ibv_flow_action { context: ctx }),
            xrcd: leak(ibv_xrcd { context: ctx }),
            td: leak(ibv_td { context: ctx }),
            rwq_ind_table: leak(ibv_rwq_ind_table {
                context: ctx,
                ..Default::default()
            }),
            counters: leak(ibv_counters { context: ctx }),
            qpx: leak(ibv_qp_ex {
                qp_base: ibv_qp {
                    context: ctx,
                    pd,
                    ..Default::default()
                },
                wr_atomic_cmp_swp: Some(qpx_wr_atomic_cmp_swp),
                wr_atomic_fetch_add: Some(qpx_wr_atomic_fetch_add),
                wr_bind_mw: Some(qpx_wr_bind_mw),
                wr_local_inv: Some(qpx_wr_local_inv),
                wr_rdma_read: Some(qpx_wr_rdma_read),
                wr_rdma_write: Some(qpx_wr_rdma_write),
                wr_rdma_write_imm: Some(qpx_wr_rdma_write_imm),
                wr_send: Some(qpx_wr_send),
                wr_send_imm: Some(qpx_wr_send_imm),
                wr_send_inv: Some(qpx_wr_send_inv),
                wr_send_tso: Some(qpx_wr_send_tso),
                wr_set_ud_addr: Some(qpx_wr_set_ud_addr),
                wr_set_xrc_srqn: Some(qpx_wr_set_xrc_srqn),
                wr_set_inline_data: Some(qpx_wr_set_inline_data),
                wr_set_inline_data_list: Some(qpx_wr_set_inline_data_list),
                wr_set_sge: Some(qpx_wr_set_sge),
                wr_set_sge_list: Some(qpx_wr_set_sge_list),
                wr_start: Some(qpx_wr_start),
                wr_complete: Some(qpx_wr_complete),
                wr_abort: Some(qpx_wr_abort),
                wr_atomic_write: Some(qpx_wr_atomic_write),
                ..Default::default()
            }),
            cqx: leak(ibv_cq_ex {
                context: ctx,
                start_poll: Some(cqx_start_poll),
                next_poll: Some(cqx_next_poll),
                end_poll: Some(cqx_end_poll),
                read_opcode: Some(cqx_read_opcode),
                read_vendor_err: Some(cqx_read_vendor_err),
                read_byte_len: Some(cqx_read_byte_len),
                read_imm_data: Some(cqx_read_imm_data),
                read_qp_num: Some(cqx_read_qp_num),
                read_src_qp: Some(cqx_read_src_qp),
                read_wc_flags: Some(cqx_read_wc_flags),
                read_slid: Some(cqx_read_slid),
                read_sl: Some(cqx_read_sl),
                read_dlid_path_bits: Some(cqx_read_dlid_path_bits),
                read_completion_ts: Some(cqx_read_completion_ts),
                read_cvlan: Some(cqx_read_cvlan),
                read_flow_tag: Some(cqx_read_flow_tag),
                read_tm_info: Some(cqx_read_tm_info),
                read_completion_wallclock_ns: Some(cqx_read_completion_wallclock_ns),
                ..Default::default()
            }),
            scratch: leak([0; 512]),
        }
    }

    /// The zeroed scratch memory as a `T` (at most 4 KiB).
    fn any<T>(&self) -> *mut T {
        assert!(size_of::<T>() <= size_of::<[u64; 512]>());
        self.scratch.cast()
    }

    fn set_sz(&self, sz: usize) {
        // SAFETY: the world's live context.
        unsafe { (*self.vctx).sz = sz };
    }

    fn set_not_extended(&self) {
        // SAFETY: the world's live context.
        unsafe { (*self.ctx).abi_compat = ptr::null_mut() };
    }
}

/// How a test spoils the context before an extended verb.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Ctx {
    /// Extended, full size, every op set.
    Full,
    /// The verb's op is NULL.
    OpNull,
    /// `abi_compat` is not `__VERBS_ABI_IS_EXTENDED`.
    NotExtended,
    /// `sz` one byte short of covering the op.
    TooSmall,
    /// `sz` just covers the op.
    JustBigEnough,
}

impl Ctx {
    const ALL: [Ctx; 5] = [
        Ctx::Full,
        Ctx::OpNull,
        Ctx::NotExtended,
        Ctx::TooSmall,
        Ctx::JustBigEnough,
    ];

    /// Whether `verbs_get_ctx_op` yields the op.
    fn op_usable(self) -> bool {
        matches!(self, Ctx::Full | Ctx::JustBigEnough)
    }

    fn apply(self, w: &World, op_offset: usize, clear_op: impl FnOnce(*mut verbs_context)) {
        let covering = size_of::<verbs_context>() - op_offset;
        match self {
            Ctx::Full => {}
            Ctx::OpNull => clear_op(w.vctx),
            Ctx::NotExtended => w.set_not_extended(),
            Ctx::TooSmall => w.set_sz(covering - 1),
            Ctx::JustBigEnough => w.set_sz(covering),
        }
    }
}

/// `ext!(w => f(args…) via op)`: for each [`Ctx`], a fresh world `w`
/// spoiled that way, C and Rust compared, and the op called exactly when
/// `verbs_get_ctx_op` allows it.
macro_rules! ext {
    ($w:ident => $f:ident($($arg:expr),* $(,)?) via $op:ident) => {
        for how in Ctx::ALL {
            let $w = World::new();
            // SAFETY: the world's live context.
            how.apply(&$w, offset_of!(verbs_context, $op), |v| unsafe { (*v).$op = None });
            let out = diff!($f($($arg),*));
            assert_eq!(
                out.called(concat!("vctx_", stringify!($op))),
                how.op_usable(),
                "{}: {how:?}: {out:?}",
                stringify!($f)
            );
        }
    };
}

// ---------------------------------------------------------------------------
// verbs.h

#[test]
fn verbs_get_ctx_finds_the_embedding_context() {
    let w = World::new();
    // SAFETY: the world's live context.
    assert_eq!(unsafe { rs::verbs_get_ctx(w.ctx) }, w.vctx);
    w.set_not_extended();
    // SAFETY: as above.
    assert!(unsafe { rs::verbs_get_ctx(w.ctx) }.is_null());
}

#[test]
fn extended_verbs_check_the_context_like_c() {
    ext!(w => ibv_create_flow(w.qp, w.any()) via ibv_create_flow);
    ext!(w => ibv_destroy_flow(w.flow) via ibv_destroy_flow);
    ext!(w => ibv_create_flow_action_esp(w.ctx, w.any()) via create_flow_action_esp);
    ext!(w => ibv_modify_flow_action_esp(w.action, w.any()) via modify_flow_action_esp);
    ext!(w => ibv_destroy_flow_action(w.action) via destroy_flow_action);
    ext!(w => ibv_open_xrcd(w.ctx, w.any()) via open_xrcd);
    let prefetch = IB_UVERBS_ADVISE_MR_ADVICE_PREFETCH_WRITE;
    ext!(w => ibv_advise_mr(w.pd, prefetch, 3, w.any(), 2) via advise_mr);
    ext!(w => ibv_alloc_dm(w.ctx, w.any()) via alloc_dm);
    ext!(w => ibv_free_dm(w.dm) via free_dm);
    ext!(w => ibv_alloc_null_mr(w.pd) via alloc_null_mr);
    ext!(w => ibv_reg_dm_mr(w.pd, w.dm, 0x40, 4096, 0x7) via reg_dm_mr);
    ext!(w => ibv_create_cq_ex(w.ctx, w.any()) via create_cq_ex);
    ext!(w => ibv_modify_cq(w.cq, w.any()) via modify_cq);
    ext!(w => ibv_get_srq_num(w.srq, w.any()) via get_srq_num);
    ext!(w => ibv_alloc_td(w.ctx, w.any()) via alloc_td);
    ext!(w => ibv_dealloc_td(w.td) via dealloc_td);
    ext!(w => ibv_alloc_parent_domain(w.ctx, w.any()) via alloc_parent_domain);
    ext!(w => ibv_query_rt_values_ex(w.ctx, w.any()) via query_rt_values);
    ext!(w => ibv_open_qp(w.ctx, w.any()) via open_qp);
    ext!(w => ibv_modify_qp_rate_limit(w.qp, w.any()) via modify_qp_rate_limit);
    ext!(w => ibv_modify_wq(w.wq, w.any()) via modify_wq);
    ext!(w => ibv_destroy_wq(w.wq) via destroy_wq);
    ext!(w => ibv_create_rwq_ind_table(w.ctx, w.any()) via create_rwq_ind_table);
    ext!(w => ibv_destroy_rwq_ind_table(w.rwq_ind_table) via destroy_rwq_ind_table);
    ext!(w => ibv_create_counters(w.ctx, w.any()) via create_counters);
    ext!(w => ibv_destroy_counters(w.counters) via destroy_counters);
    ext!(w => ibv_attach_counters_point_flow(w.counters, w.any(), w.flow)
        via attach_counters_point_flow);
    ext!(w => ibv_read_counters(w.counters, w.any(), 4, 1) via read_counters);
    // Zeroed attributes: comp_mask 0 takes the extended path.
    ext!(w => ibv_create_srq_ex(w.ctx, w.any()) via create_srq_ex);
    ext!(w => ibv_create_qp_ex(w.ctx, w.any()) via create_qp_ex);
    // The fallbacks call the fake compat `ibv_query_port` and
    // `ibv_query_device` (the scratch memory is the attrs).
    ext!(w => ___ibv_query_port(w.ctx, 2, w.any()) via query_port);
    ext!(w => ibv_query_device_ex(w.ctx, ptr::null(), w.any()) via query_device_ex);
    ext!(w => ibv_query_device_ex(w.ctx, w.any(), w.any()) via query_device_ex);
    ext!(w => ibv_post_srq_ops(w.srq, w.any(), w.any()) via post_srq_ops);
    ext!(w => ibv_create_wq(w.ctx, w.any()) via create_wq);
}

/// `___ibv_query_port` and `ibv_query_device_ex` zero the attributes
/// before their fallbacks (the fakes log whether they were).
#[test]
fn query_fallbacks_zero_the_attributes() {
    let w = World::new();
    let port_attr = leak(ibv_port_attr::default());
    // SAFETY: a live attr.
    let dirty_port = || unsafe { ptr::write_bytes(port_attr, 0xff, 1) };
    let out = diff!(dirty_port => ___ibv_query_port(w.ctx, 1, port_attr));
    assert!(out.called("vctx_query_port"));
    w.set_not_extended();
    let out = diff!(dirty_port => ___ibv_query_port(w.ctx, 1, port_attr));
    assert_eq!(out.calls[0].args[3], 1, "not zeroed: {out:?}");

    let w = World::new();
    let attr = leak(ibv_device_attr_ex::default());
    // SAFETY: a live attr.
    let dirty = || unsafe { ptr::write_bytes(attr, 0xff, 1) };
    let input = leak(ibv_query_device_ex_input { comp_mask: 0 });
    // The op's result decides: EOPNOTSUPP and ENOSYS fall back, others not.
    for ret in [0, 7, libc::EINVAL, libc::EOPNOTSUPP, libc::ENOSYS, -1] {
        let setup = || {
            dirty();
            script("vctx_query_device_ex", &[ret.into()]);
        };
        let out = diff!(setup => ibv_query_device_ex(w.ctx, input, attr));
        let fell_back = ret == libc::EOPNOTSUPP || ret == libc::ENOSYS;
        assert_eq!(out.called("ibv_query_device"), fell_back, "{ret}: {out:?}");
        if fell_back {
            assert_eq!(out.calls[1].args[2], 1, "not zeroed: {out:?}");
        }
    }
    // A nonzero input comp_mask is EINVAL before anything else.
    // SAFETY: a live input.
    unsafe { (*input).comp_mask = 1 };
    let out = diff!(dirty => ibv_query_device_ex(w.ctx, input, attr));
    assert_eq!((out.ret.as_str(), out.calls.len()), ("22", 0));
}

#[test]
fn post_srq_ops_reports_the_bad_op_without_the_op() {
    for how in [Ctx::Full, Ctx::OpNull] {
        let w = World::new();
        // SAFETY: the world's live context.
        how.apply(&w, offset_of!(verbs_context, post_srq_ops), |v| unsafe {
            (*v).post_srq_ops = None
        });
        let op: *mut ibv_ops_wr = w.any();
        let bad = leak(ptr::null_mut::<ibv_ops_wr>());
        // SAFETY: a live out-pointer.
        let reset = || unsafe { *bad = ptr::null_mut() };
        // SAFETY: both sides get the world's live objects.
        let out = same(
            "ibv_post_srq_ops",
            &reset,
            || unsafe { (c::ibv_post_srq_ops(w.srq, op, bad), *bad) },
            || unsafe { (rs::ibv_post_srq_ops(w.srq, op, bad), *bad) },
        );
        assert_eq!(out.called("vctx_post_srq_ops"), how == Ctx::Full);
    }
}

/// `ibv_create_wq` initialises the new WQ's context, event count, mutex
/// and condition variable (compared byte for byte).
#[test]
fn create_wq_initialises_the_wq() {
    let w = World::new();
    let attr = leak(ibv_wq_init_attr {
        wq_context: ptr::without_provenance_mut(0x77),
        ..Default::default()
    });
    for script_ret in [None, Some(0)] {
        let setup = || {
            if let Some(v) = script_ret {
                script("vctx_create_wq", &[v]);
            }
        };
        // SAFETY: both sides get the world's live objects.
        let out = same(
            "ibv_create_wq",
            &setup,
            || unsafe { (c::ibv_create_wq(w.ctx, attr), wq_bytes()) },
            || unsafe { (rs::ibv_create_wq(w.ctx, attr), wq_bytes()) },
        );
        assert!(out.called("vctx_create_wq"));
    }
    // The fields themselves. SAFETY: the fake `create_wq` returns the
    // thread's live fake WQ.
    unsafe {
        let wq = rs::ibv_create_wq(w.ctx, attr);
        assert_eq!((*wq).wq_context, (*attr).wq_context);
        assert_eq!((*wq).events_completed, 0);
    }
}

#[test]
fn srq_ex_and_qp_ex_take_the_legacy_verb_for_legacy_attributes() {
    let w = World::new();
    let pd_bit = ibv_srq_init_attr_mask::IBV_SRQ_INIT_ATTR_PD.0;
    let type_bit = ibv_srq_init_attr_mask::IBV_SRQ_INIT_ATTR_TYPE.0;
    let cases = [
        (pd_bit, IBV_SRQT_BASIC, true),
        (pd_bit | type_bit, IBV_SRQT_BASIC, true),
        (pd_bit, IBV_SRQT_XRC, true),
        (pd_bit | type_bit, IBV_SRQT_XRC, false),
        (type_bit, IBV_SRQT_BASIC, false),
        (0, IBV_SRQT_BASIC, false),
        (pd_bit | 4, IBV_SRQT_BASIC, false),
        (pd_bit | 0x8000_0000, IBV_SRQT_BASIC, false),
    ];
    for (comp_mask, srq_type, legacy) in cases {
        let attr = leak(ibv_srq_init_attr_ex {
            comp_mask,
            srq_type,
            pd: w.pd,
            ..Default::default()
        });
        let out = diff!(ibv_create_srq_ex(w.ctx, attr));
        assert_eq!(
            out.called("ibv_create_srq"),
            legacy,
            "{comp_mask:#x}: {out:?}"
        );
        assert_eq!(
            out.called("vctx_create_srq_ex"),
            !legacy,
            "{comp_mask:#x}: {out:?}"
        );
    }
    let pd_bit = ibv_qp_init_attr_mask::IBV_QP_INIT_ATTR_PD.0;
    for (comp_mask, legacy) in [(pd_bit, true), (0, false), (pd_bit | 2, false), (2, false)] {
        let attr = leak(ibv_qp_init_attr_ex {
            comp_mask,
            pd: w.pd,
            ..Default::default()
        });
        let out = diff!(ibv_create_qp_ex(w.ctx, attr));
        assert_eq!(
            out.called("ibv_create_qp"),
            legacy,
            "{comp_mask:#x}: {out:?}"
        );
        assert_eq!(
            out.called("vctx_create_qp_ex"),
            !legacy,
            "{comp_mask:#x}: {out:?}"
        );
    }
}

#[test]
fn close_xrcd_does_not_check_the_size() {
    for how in [Ctx::Full, Ctx::TooSmall, Ctx::JustBigEnough] {
        let w = World::new();
        how.apply(&w, offset_of!(verbs_context, close_xrcd), |_| ());
        let out = diff!(ibv_close_xrcd(w.xrcd));
        assert!(out.called("vctx_close_xrcd"), "{how:?}");
    }
    // C calls through NULL here; the port panics.
    for how in [Ctx::OpNull, Ctx::NotExtended] {
        let w = World::new();
        // SAFETY: the world's live context.
        how.apply(&w, offset_of!(verbs_context, close_xrcd), |v| unsafe {
            (*v).close_xrcd = None
        });
        rust_panics!(ibv_close_xrcd(w.xrcd));
    }
}

#[test]
fn reg_mr_routes_optional_access_flags_to_iova2() {
    let w = World::new();
    let addr: *mut c_void = ptr::without_provenance_mut(0x10_0000);
    let optional = IBV_ACCESS_OPTIONAL_RANGE;
    let relaxed = ibv_access_flags::IBV_ACCESS_RELAXED_ORDERING.0;
    for access in [
        0,
        1,
        0x7,
        relaxed,
        relaxed | 1,
        optional,
        1 << 29,
        0x8000_0000,
    ] {
        for is_const in [0, 1, 2] {
            let out = diff!(__ibv_reg_mr(w.pd, addr, 8192, access, is_const));
            let plain = is_const != 0 && access & optional == 0;
            assert_eq!(out.called("ibv_reg_mr"), plain, "{access:#x} {is_const}");
            let out = diff!(__ibv_reg_mr_iova(
                w.pd,
                addr,
                8192,
                0xfeed_0000,
                access,
                is_const
            ));
            assert_eq!(
                out.called("ibv_reg_mr_iova"),
                plain,
                "{access:#x} {is_const}"
            );
        }
    }
}

#[test]
fn gid_queries_pass_the_entry_size() {
    let w = World::new();
    let out = diff!(ibv_query_gid_ex(w.ctx, 1, 3, w.any(), 0));
    assert_eq!(out.calls[0].args[5], size_of::<ibv_gid_entry>() as u64);
    diff!(ibv_query_gid_table(w.ctx, w.any(), 16, 0));
}

#[test]
fn memory_windows() {
    let w = World::new();
    diff!(ibv_alloc_mw(w.pd, IBV_MW_TYPE_2));
    diff!(ibv_dealloc_mw(w.mw));
    // SAFETY: the world's live context.
    unsafe { (*w.ctx).ops.alloc_mw = None };
    let out = diff!(ibv_alloc_mw(w.pd, IBV_MW_TYPE_1));
    assert_eq!((out.errno, out.calls.len()), (libc::EOPNOTSUPP, 0));
    // SAFETY: as above.
    unsafe { (*w.ctx).ops.dealloc_mw = None };
    rust_panics!(ibv_dealloc_mw(w.mw));

    // ibv_bind_mw's checks, in C's order.
    let w = World::new();
    let other_pd = leak(ibv_pd {
        context: w.ctx,
        ..Default::default()
    });
    let mr_same = leak(ibv_mr {
        context: w.ctx,
        pd: w.pd,
        ..Default::default()
    });
    let mr_other = leak(ibv_mr {
        context: w.ctx,
        pd: other_pd,
        ..Default::default()
    });
    let cases: [(ibv_mw_type, *mut ibv_mr, u64, u64, bool); 8] = [
        (IBV_MW_TYPE_2, mr_same, 0, 0, false),
        (IBV_MW_TYPE_1, ptr::null_mut(), 0x1000, 0, false),
        (IBV_MW_TYPE_1, ptr::null_mut(), 0, 64, false),
        (IBV_MW_TYPE_1, ptr::null_mut(), 0, 0, true),
        (IBV_MW_TYPE_1, mr_other, 0x1000, 64, false),
        (IBV_MW_TYPE_1, mr_same, 0x1000, 64, true),
        (IBV_MW_TYPE_2, ptr::null_mut(), 1, 1, false),
        (IBV_MW_TYPE_1, mr_same, 0, 0, true),
    ];
    for (mw_type, mr, addr, length, reaches_op) in cases {
        let mw = leak(ibv_mw {
            context: w.ctx,
            pd: w.pd,
            type_: mw_type,
            ..Default::default()
        });
        let bind = leak(ibv_mw_bind {
            bind_info: ibv_mw_bind_info {
                mr,
                addr,
                length,
                mw_access_flags: 0,
            },
            ..Default::default()
        });
        let out = diff!(ibv_bind_mw(w.qp, mw, bind));
        assert_eq!(out.called("ops_bind_mw"), reaches_op, "{out:?}");
    }
    // SAFETY: the world's live context.
    unsafe { (*w.ctx).ops.bind_mw = None };
    let bind = leak(ibv_mw_bind::default());
    rust_panics!(ibv_bind_mw(w.qp, w.mw, bind));
}

#[test]
fn pure_functions() {
    for rkey in [
        0,
        1,
        0xfe,
        0xff,
        0x100,
        0x1ff,
        0xdead_beff,
        0xffff_ff00,
        u32::MAX,
    ] {
        diff!(ibv_inc_rkey(rkey));
    }
    for rkey in (0..u32::MAX).step_by(65_521) {
        diff!(ibv_inc_rkey(rkey));
    }
    // Every 20-bit flow label, and some with higher bits set.
    for fl in (0..=0xF_FFFF).chain([0x10_0000, 0xFFF0_0001, u32::MAX]) {
        // SAFETY: pure functions.
        let (c, rust) = unsafe {
            (
                c::ibv_flow_label_to_udp_sport(fl),
                rs::ibv_flow_label_to_udp_sport(fl),
            )
        };
        assert_eq!(rust, c, "{fl:#x}");
    }
    // Bits 0..=31 (C's `1 << qpt` is undefined from 32 on).
    for caps in [0, 1, 0x14, 0x8000_0000, 0xffff_ffff, 0x5555_5555] {
        for qpt in 0..32 {
            diff!(ibv_is_qpt_supported(caps, qpt));
        }
    }
    let w = World::new();
    diff!(ibv_cq_ex_to_cq(w.cqx));
}

#[test]
fn extended_qp_builders_call_their_op() {
    let w = World::new();
    let q = w.qpx;
    let p: *mut c_void = ptr::without_provenance_mut(0xabc0);
    let mw = w.mw;
    let ah: *mut ibv_ah = ptr::without_provenance_mut(0xa400);
    let out = diff!(ibv_wr_atomic_cmp_swp(q, 0x11, 0x2222, 0x3333, 0x4444));
    assert!(out.called("qpx_wr_atomic_cmp_swp"));
    diff!(ibv_wr_atomic_fetch_add(q, 0x11, 0x2222, 0x3333));
    diff!(ibv_wr_bind_mw(q, mw, 0x55, p.cast()));
    diff!(ibv_wr_local_inv(q, 0x66));
    diff!(ibv_wr_rdma_read(q, 0x77, 0x8888));
    diff!(ibv_wr_rdma_write(q, 0x99, 0xaaaa));
    diff!(ibv_wr_rdma_write_imm(q, 0xbb, 0xcccc, 0xdd00_00ee));
    diff!(ibv_wr_send(q));
    diff!(ibv_wr_send_imm(q, 0x0102_0304));
    diff!(ibv_wr_send_inv(q, 0x0506));
    diff!(ibv_wr_send_tso(q, p, 60, 1400));
    diff!(ibv_wr_set_ud_addr(q, ah, 0x12_3456, 0x1111_2222));
    diff!(ibv_wr_set_xrc_srqn(q, 0x77));
    diff!(ibv_wr_set_inline_data(q, p, 48));
    diff!(ibv_wr_set_inline_data_list(q, 3, p.cast()));
    diff!(ibv_wr_set_sge(q, 0x1234, 0xdead_0000, 4096));
    diff!(ibv_wr_set_sge_list(q, 2, p.cast()));
    diff!(ibv_wr_start(q));
    let out = diff!(|| script("qpx_wr_complete", &[libc::ENOMEM.into()]) => ibv_wr_complete(q));
    assert_eq!(out.ret, libc::ENOMEM.to_string());
    diff!(ibv_wr_abort(q));
    diff!(ibv_wr_atomic_write(q, 0x42, 0x4242, p));

    // A NULL builder: C calls through it, the port panics.
    let q = World::new().qpx;
    // SAFETY: a live fake QP.
    unsafe {
        *q = ibv_qp_ex {
            qp_base: (*q).qp_base,
            ..Default::default()
        }
    };
    rust_panics!(ibv_wr_atomic_cmp_swp(q, 0, 0, 0, 0));
    rust_panics!(ibv_wr_atomic_fetch_add(q, 0, 0, 0));
    rust_panics!(ibv_wr_bind_mw(q, mw, 0, ptr::null()));
    rust_panics!(ibv_wr_local_inv(q, 0));
    rust_panics!(ibv_wr_rdma_read(q, 0, 0));
    rust_panics!(ibv_wr_rdma_write(q, 0, 0));
    rust_panics!(ibv_wr_rdma_write_imm(q, 0, 0, 0));
    rust_panics!(ibv_wr_send(q));
    rust_panics!(ibv_wr_send_imm(q, 0));
    rust_panics!(ibv_wr_send_inv(q, 0));
    rust_panics!(ibv_wr_send_tso(q, p, 0, 0));
    rust_panics!(ibv_wr_set_ud_addr(q, ah, 0, 0));
    rust_panics!(ibv_wr_set_xrc_srqn(q, 0));
    rust_panics!(ibv_wr_set_inline_data(q, p, 0));
    rust_panics!(ibv_wr_set_inline_data_list(q, 0, ptr::null()));
    rust_panics!(ibv_wr_set_sge(q, 0, 0, 0));
    rust_panics!(ibv_wr_set_sge_list(q, 0, ptr::null()));
    rust_panics!(ibv_wr_start(q));
    rust_panics!(ibv_wr_complete(q));
    rust_panics!(ibv_wr_abort(q));
    rust_panics!(ibv_wr_atomic_write(q, 0, 0, p));
}

#[test]
fn extended_cq_readers_call_their_op() {
    let w = World::new();
    let cq = w.cqx;
    let attr: *mut ibv_poll_cq_attr = w.any();
    let tm: *mut ibv_wc_tm_info = w.any();
    let out =
        diff!(|| script("cqx_start_poll", &[libc::ENOENT.into()]) => ibv_start_poll(cq, attr));
    assert_eq!(out.ret, libc::ENOENT.to_string());
    diff!(ibv_start_poll(cq, attr));
    diff!(ibv_next_poll(cq));
    diff!(ibv_end_poll(cq));
    diff!(ibv_wc_read_opcode(cq));
    diff!(ibv_wc_read_vendor_err(cq));
    diff!(ibv_wc_read_byte_len(cq));
    diff!(ibv_wc_read_imm_data(cq));
    let out = diff!(ibv_wc_read_invalidated_rkey(cq));
    assert!(out.called("cqx_read_imm_data"));
    diff!(ibv_wc_read_qp_num(cq));
    diff!(ibv_wc_read_src_qp(cq));
    diff!(ibv_wc_read_wc_flags(cq));
    diff!(ibv_wc_read_slid(cq));
    diff!(ibv_wc_read_sl(cq));
    diff!(ibv_wc_read_dlid_path_bits(cq));
    diff!(ibv_wc_read_completion_ts(cq));
    diff!(ibv_wc_read_completion_wallclock_ns(cq));
    diff!(ibv_wc_read_cvlan(cq));
    diff!(ibv_wc_read_flow_tag(cq));
    diff!(ibv_wc_read_tm_info(cq, tm));

    let cq = World::new().cqx;
    // SAFETY: a live fake CQ.
    unsafe {
        *cq = ibv_cq_ex {
            context: (*cq).context,
            ..Default::default()
        }
    };
    rust_panics!(ibv_start_poll(cq, attr));
    rust_panics!(ibv_next_poll(cq));
    rust_panics!(ibv_end_poll(cq));
    rust_panics!(ibv_wc_read_opcode(cq));
    rust_panics!(ibv_wc_read_vendor_err(cq));
    rust_panics!(ibv_wc_read_byte_len(cq));
    rust_panics!(ibv_wc_read_imm_data(cq));
    rust_panics!(ibv_wc_read_invalidated_rkey(cq));
    rust_panics!(ibv_wc_read_qp_num(cq));
    rust_panics!(ibv_wc_read_src_qp(cq));
    rust_panics!(ibv_wc_read_wc_flags(cq));
    rust_panics!(ibv_wc_read_slid(cq));
    rust_panics!(ibv_wc_read_sl(cq));
    rust_panics!(ibv_wc_read_dlid_path_bits(cq));
    rust_panics!(ibv_wc_read_completion_ts(cq));
    rust_panics!(ibv_wc_read_completion_wallclock_ns(cq));
    rust_panics!(ibv_wc_read_cvlan(cq));
    rust_panics!(ibv_wc_read_flow_tag(cq));
    rust_panics!(ibv_wc_read_tm_info(cq, tm));
}

#[test]
fn work_queue_and_device_memory_ops() {
    let w = World::new();
    let host: *mut c_void = ptr::without_provenance_mut(0x7000);
    let out = diff!(ibv_post_wq_recv(w.wq, w.any(), w.any()));
    assert!(out.called("wq_post_recv"));
    diff!(ibv_memcpy_to_dm(w.dm, 0x100, host, 64));
    diff!(ibv_memcpy_from_dm(host, w.dm, 0x200, 32));
    // SAFETY: live fakes.
    unsafe {
        (*w.wq).post_recv = None;
        (*w.dm).memcpy_to_dm = None;
        (*w.dm).memcpy_from_dm = None;
    }
    rust_panics!(ibv_post_wq_recv(w.wq, w.any(), w.any()));
    rust_panics!(ibv_memcpy_to_dm(w.dm, 0, host, 0));
    rust_panics!(ibv_memcpy_from_dm(host, w.dm, 0, 0));
}

// ---------------------------------------------------------------------------
// rdma_cma.h / rdma_verbs.h

#[cfg(feature = "rdmacm")]
mod cm {
    use super::*;

    /// An id on the world's objects; `srq` decides where receives go.
    fn id(w: &World, srq: bool) -> *mut rdma_cm_id {
        let recv_cq = leak(ibv_cq {
            context: w.ctx,
            ..Default::default()
        });
        leak(rdma_cm_id {
            verbs: w.ctx,
            qp: w.qp,
            pd: w.pd,
            srq: if srq { w.srq } else { ptr::null_mut() },
            send_cq: w.cq,
            recv_cq,
            send_cq_channel: ptr::without_provenance_mut(0xc4a0),
            recv_cq_channel: ptr::without_provenance_mut(0xc4a1),
            ..Default::default()
        })
    }

    #[test]
    fn addresses_and_seterrno() {
        let w = World::new();
        let id = id(&w, false);
        diff!(rdma_get_local_addr(id));
        diff!(rdma_get_peer_addr(id));
        for ret in [0, 1, libc::EINVAL, -1, -5, c_int::MAX] {
            diff!(rdma_seterrno(ret));
        }
    }

    #[test]
    fn registration() {
        let w = World::new();
        let id = id(&w, false);
        let addr: *mut c_void = ptr::without_provenance_mut(0x20_0000);
        for out in [
            diff!(rdma_reg_msgs(id, addr, 4096)),
            diff!(rdma_reg_read(id, addr, 4096)),
            diff!(rdma_reg_write(id, addr, 4096)),
        ] {
            assert!(out.called("ibv_reg_mr"), "{out:?}");
        }
        let mr: *mut ibv_mr = ptr::without_provenance_mut(0x3300);
        diff!(rdma_dereg_mr(mr));
        let out = diff!(|| script("ibv_dereg_mr", &[libc::EBUSY.into()]) => rdma_dereg_mr(mr));
        assert_eq!((out.ret.as_str(), out.errno), ("-1", libc::EBUSY));
    }

    #[test]
    fn posts_build_the_same_work_requests() {
        let w = World::new();
        let sgl = leak([
            ibv_sge {
                addr: 0x1000,
                length: 64,
                lkey: 0x11,
            },
            ibv_sge {
                addr: 0x2000,
                length: 128,
                lkey: 0x22,
            },
        ])
        .cast::<ibv_sge>();
        let ctx: *mut c_void = ptr::without_provenance_mut(0xc0de);
        let mr = leak(ibv_mr {
            addr: ptr::without_provenance_mut(0x40_0000),
            length: 0x1_0000,
            lkey: 0x4444,
            ..Default::default()
        });
        let buf: *mut c_void = ptr::without_provenance_mut(0x40_0100);
        let ah: *mut ibv_ah = ptr::without_provenance_mut(0xa400);
        let fail = || script("ops_post_send", &[libc::ENOMEM.into()]);
        for srq in [false, true] {
            let id = id(&w, srq);
            let out = diff!(rdma_post_recvv(id, ctx, sgl, 2));
            assert!(out.called(if srq {
                "ops_post_srq_recv"
            } else {
                "ops_post_recv"
            }));
            diff!(rdma_post_recv(id, ctx, buf, 256, mr));
            // The whole MR.
            diff!(rdma_post_recv(id, ctx, (*mr).addr, 0x1_0000, mr));
            diff!(|| script("ops_post_recv", &[5]) => rdma_post_recvv(id, ctx, sgl, 1));
        }
        let id = id(&w, false);
        for flags in [0, 2, 0xf] {
            diff!(rdma_post_sendv(id, ctx, sgl, 2, flags));
            diff!(rdma_post_readv(id, ctx, sgl, 2, flags, 0xfeed_0000, 0x99));
            diff!(rdma_post_writev(id, ctx, sgl, 1, flags, 0xfeed_1000, 0x98));
            for mr in [mr, ptr::null_mut()] {
                diff!(rdma_post_send(id, ctx, buf, 300, mr, flags));
                diff!(rdma_post_write(
                    id,
                    ctx,
                    buf,
                    300,
                    mr,
                    flags,
                    0xbeef_0000,
                    0x97
                ));
            }
            diff!(rdma_post_read(
                id,
                ctx,
                buf,
                300,
                mr,
                flags,
                0xbeef_1000,
                0x96
            ));
        }
        // A length over 32 bits is truncated in the SGE.
        diff!(rdma_post_send(id, ctx, buf, 0x1_0000_0040, mr, 0));
        let out = diff!(fail => rdma_post_sendv(id, ctx, sgl, 2, 0));
        assert_eq!((out.ret.as_str(), out.errno), ("-1", libc::ENOMEM));
        diff!(fail => rdma_post_read(id, ctx, buf, 8, mr, 0, 1, 2));

        // UD sends log the address fields too.
        // SAFETY: the world's live QP.
        unsafe { (*w.qp).qp_type = IBV_QPT_UD };
        for mr in [mr, ptr::null_mut()] {
            let out = diff!(rdma_post_ud_send(id, ctx, buf, 100, mr, 2, ah, 0x42));
            assert_eq!(*out.calls[0].args.last().unwrap(), u64::from(RDMA_UDP_QKEY));
        }
        diff!(fail => rdma_post_ud_send(id, ctx, buf, 100, mr, 2, ah, 0x42));

        // A buffer outside the MR: C's assert aborts, the port panics.
        rust_panics!(rdma_post_recv(
            id,
            ctx,
            (*mr).addr.wrapping_byte_add(0xff00),
            0x200,
            mr
        ));
        rust_panics!(rdma_post_recv(
            id,
            ctx,
            (*mr).addr.wrapping_byte_sub(1),
            8,
            mr
        ));
    }

    #[test]
    fn completion_waits() {
        let w = World::new();
        let id = id(&w, false);
        let wc: *mut ibv_wc = w.any();
        // SAFETY: the id is live.
        let (send_cq, recv_cq) = unsafe { ((*id).send_cq, (*id).recv_cq) };
        type Script = &'static [(&'static str, &'static [i64])];
        let scripts: [Script; 7] = [
            // A completion at once.
            &[("ops_poll_cq", &[1])],
            // A poll error: errno gets the negative count, as in C.
            &[("ops_poll_cq", &[-3])],
            // Arming fails.
            &[
                ("ops_poll_cq", &[0]),
                ("ops_req_notify_cq", &[libc::EIO as i64]),
            ],
            // A completion that raced the arming.
            &[("ops_poll_cq", &[0, 1]), ("ops_req_notify_cq", &[0])],
            // Waiting fails: its -1 and errno pass through.
            &[
                ("ops_poll_cq", &[0, 0]),
                ("ops_req_notify_cq", &[0]),
                ("ibv_get_cq_event", &[-1]),
            ],
            // One event, then a completion.
            &[
                ("ops_poll_cq", &[0, 0, 1]),
                ("ops_req_notify_cq", &[0]),
                ("ibv_get_cq_event", &[0]),
            ],
            // Two rounds.
            &[
                ("ops_poll_cq", &[0, 0, 0, 0, 2]),
                ("ops_req_notify_cq", &[0, 0]),
                ("ibv_get_cq_event", &[0, 0]),
            ],
        ];
        for (cq, recv) in [(send_cq, false), (recv_cq, true)] {
            for s in scripts {
                let setup = || {
                    for (name, values) in s {
                        script(name, values);
                    }
                    EVENT.with(|e| e.set((cq, id.cast())));
                };
                let out = if recv {
                    diff!(setup => rdma_get_recv_comp(id, wc))
                } else {
                    diff!(setup => rdma_get_send_comp(id, wc))
                };
                assert!(out.script_left.is_empty(), "{out:?}");
                assert!(out
                    .calls
                    .iter()
                    .all(|c| !c.name.starts_with("ops_") || c.args[0] == cq.arg()));
            }
            // An event for another CQ: C's assert aborts, the port panics.
            script("ops_poll_cq", &[0, 0]);
            script("ops_req_notify_cq", &[0]);
            EVENT.with(|e| e.set((w.cq.wrapping_add(1), id.cast())));
            if recv {
                rust_panics!(rdma_get_recv_comp(id, wc));
            } else {
                rust_panics!(rdma_get_send_comp(id, wc));
            }
        }
    }
}
