//! Raw FFI bindings to `libibverbs` from [rdma-core] (and `librdmacm`
//! with the `rdmacm` feature).
//!
//! This crate is bindings only. For a safe API see the `rdma-verbs` crate.
//!
//! # What is bound
//! - Every exported `ibv_*` function, struct, union and constant of
//!   rdma-core 44, the oldest release supported: bindgen's output, committed
//!   in `src/bindings/`, so a build needs neither rdma-core's headers nor
//!   libclang nor a C compiler.
//! - Every `static inline` function of `verbs.h` (`ibv_post_send`,
//!   `ibv_poll_cq`, `ibv_start_poll`, the `ibv_wr_*` and `ibv_wc_read_*`
//!   families, `ibv_query_device_ex`, `ibv_create_qp_ex`, …) and of
//!   `rdma_verbs.h`, written in Rust with the same names, `#[inline]`: each
//!   behaves as in C, including the checks that return `EOPNOTSUPP`/`ENOSYS`
//!   (or NULL with `errno`) when a provider lacks an op, and a post or a poll
//!   costs one call into the provider as in C. A test compares each with the
//!   headers' own C (feature `bindgen`). The `ibv_wr_*` and `ibv_wc_read_*`
//!   functions call provider function pointers without a NULL check, as in
//!   C; the provider fills only the ops requested in
//!   `send_ops_flags`/`wc_flags`, so calling one that was not requested is
//!   undefined behaviour here as it is in C.
//! - The verbs that `verbs.h` defines as macros: [`ibv_query_port`] (the real
//!   one, not the compat symbol that leaves extended fields zero),
//!   [`ibv_reg_mr`] and [`ibv_reg_mr_iova`] (routing
//!   `IBV_ACCESS_OPTIONAL_RANGE` to `ibv_reg_mr_iova2` as the C macros do).
//! - Verbs newer than rdma-core 44, in [`newer`] and re-exported here:
//!   flush (rdma-core 45: [`ibv_wr_flush`], `IBV_WR_FLUSH`, …). A program
//!   built with them runs on any release: [`rdma_core_release`] says which
//!   one is loaded, and each such item's docs name the release it needs.
//!
//! # Conventions
//! Enumerations whose values come from the device (`ibv_wc_status`,
//! `ibv_wc_opcode`, `ibv_qp_state`, `ibv_port_state`, …) are integer type
//! aliases with associated constants, never Rust `enum`s: an unknown value
//! from a newer kernel or provider stays a plain number. Flag enumerations
//! (`ibv_access_flags`, `ibv_send_flags`, `ibv_qp_attr_mask`, …) are newtypes
//! with bit operators; use `.0` where a C field is a plain integer.
//!
//! # Build
//! Linking needs rdma-core's runtime library (`libibverbs.so.1`; Debian/Ubuntu
//! `libibverbs1`, Fedora/RHEL `libibverbs`), looked for in
//! `IBVERBS_LIB_DIR`, then by pkg-config, then in the usual library
//! directories; without it the build stops with one line naming the package.
//! With `DOCS_RS` set nothing is linked. Feature `bindgen` is for
//! maintainers: it runs bindgen over the installed headers
//! (`IBVERBS_INCLUDE_DIR`, else pkg-config; needs libclang) so that tests
//! compare the committed bindings with them (equal on rdma-core 44, a
//! compatible subset on newer releases) and the Rust inline verbs with the
//! headers' C; `regenerate-bindings.sh` rewrites the committed bindings.
//!
//! # Feature `dlopen`: loading rdma-core at run time
//! Off by default. With it, nothing of rdma-core is linked (no `DT_NEEDED`
//! on `libibverbs.so.1` or `librdmacm.so.1`): a program builds and starts on
//! a machine without rdma-core, and [`load`] (and [`load_rdmacm`] with
//! `rdmacm`) reports the missing library as a [`LoadError`] naming the
//! package to install. The bindings are the same: each exported function
//! is a Rust function of the same name and signature that opens the library
//! on first use (`dlopen("libibverbs.so.1")`) and looks the symbol up once
//! (`dlsym`, kept in an atomic); they are committed too
//! (`src/bindings/*_dlopen.rs`, checked by `tests/dlgen.rs`). The inline
//! verbs are unchanged: they call the provider through `ibv_context`, or
//! these functions.
//!
//! When the library or one symbol is missing (a symbol that only a newer
//! rdma-core exports), a function does not abort: it sets `errno` to
//! `EOPNOTSUPP` and returns its verb's failure value: NULL for pointers;
//! for `int` verbs `-1` where the verb reports failure as `-1` with `errno`
//! (every `rdma_*` verb, `ibv_get_cq_event`, `ibv_get_async_event`,
//! `ibv_query_gid`, `ibv_query_pkey`, …), else `EOPNOTSUPP` (the verbs that
//! return an errno value), 0 for `ibv_query_qp_data_in_order`; a static
//! `"unknown"` for the `*_str` functions; zero otherwise (a GUID,
//! `ibv_is_fork_initialized`: `IBV_FORK_DISABLED`). Call [`load`] before
//! the first verb to tell a missing library from a failing verb.
//!
//! [rdma-core]: https://github.com/linux-rdma/rdma-core
#![no_std]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![allow(non_camel_case_types, non_snake_case, non_upper_case_globals)]
#![allow(clippy::all)]
#![allow(rustdoc::all)]

#[cfg(test)]
extern crate std;

// The committed bindings (rdma-core 44), see the crate docs.
#[cfg(all(not(feature = "dlopen"), not(feature = "rdmacm")))]
include!("bindings/verbs.rs");
#[cfg(all(not(feature = "dlopen"), feature = "rdmacm"))]
include!("bindings/verbs_rdmacm.rs");
#[cfg(not(feature = "dlopen"))]
include!("bindings/extra.rs");
#[cfg(all(feature = "dlopen", not(feature = "rdmacm")))]
include!("bindings/verbs_dlopen.rs");
#[cfg(all(feature = "dlopen", feature = "rdmacm"))]
include!("bindings/verbs_rdmacm_dlopen.rs");

#[cfg(feature = "dlopen")]
mod dl;
mod inline;
pub use inline::*;
#[cfg(feature = "rdmacm")]
mod inline_cm;
#[cfg(feature = "rdmacm")]
pub use inline_cm::*;
pub mod newer;
pub use newer::*;

// The README's example compiles (a `no_run` doctest).
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

/// A library of rdma-core could not be loaded (feature `dlopen`): it is
/// not installed, or not for this architecture.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoadError {
    /// The file `dlopen` was asked for (`libibverbs.so.1`, `librdmacm.so.1`).
    pub library: &'static str,
    /// The Debian/Ubuntu package that installs it (`libibverbs1`, `librdmacm1`).
    pub package: &'static str,
}

impl core::fmt::Display for LoadError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "cannot load {}: install rdma-core's userspace library (Debian/Ubuntu package {})",
            self.library, self.package
        )
    }
}

/// Loads libibverbs (feature `dlopen`); without the feature it is linked,
/// and this returns `Ok` (inlined to nothing).
///
/// Idempotent and thread-safe; after `Ok`, every function of this crate
/// reaches the library (a symbol the installed rdma-core lacks still
/// fails alone, see the crate docs).
///
/// # Errors
/// [`LoadError`] naming `libibverbs.so.1` when `dlopen` fails.
#[inline]
pub fn load() -> Result<(), LoadError> {
    #[cfg(feature = "dlopen")]
    dl::LIBIBVERBS.handle()?;
    Ok(())
}

/// Loads librdmacm and the libibverbs it needs (feature `dlopen`); without
/// the feature it returns `Ok`.
///
/// # Errors
/// [`LoadError`] naming the library that could not be loaded
/// (`libibverbs.so.1` first).
#[cfg(feature = "rdmacm")]
#[inline]
pub fn load_rdmacm() -> Result<(), LoadError> {
    #[cfg(feature = "dlopen")]
    dl::LIBRDMACM.handle()?;
    Ok(())
}

// `verbs_api.h` macros that alias kernel ABI enumerators.
/// Address handles on this port need a GRH (`ibv_port_attr::flags`).
pub const IBV_QPF_GRH_REQUIRED: u32 = IB_UVERBS_QPF_GRH_REQUIRED;
/// Access flags optional for the device to honour (routes `ibv_reg_mr` to `ibv_reg_mr_iova2`).
pub const IBV_ACCESS_OPTIONAL_RANGE: u32 = IB_UVERBS_ACCESS_OPTIONAL_RANGE;
/// `ibv_advise_mr` advice: prefetch for reading.
pub const IBV_ADVISE_MR_ADVICE_PREFETCH: u32 = IB_UVERBS_ADVISE_MR_ADVICE_PREFETCH;
/// `ibv_advise_mr` advice: prefetch for writing.
pub const IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE: u32 = IB_UVERBS_ADVISE_MR_ADVICE_PREFETCH_WRITE;
/// `ibv_advise_mr` advice: prefetch without faulting.
pub const IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT: u32 =
    IB_UVERBS_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT;
/// `ibv_advise_mr` flag: flush.
pub const IBV_ADVISE_MR_FLAG_FLUSH: u32 = IB_UVERBS_ADVISE_MR_FLAG_FLUSH;

/// Queries a port's attributes, including the extended fields
/// (`active_speed_ex`, `flags`, `port_cap_flags2`, …).
///
/// This is the `ibv_query_port` macro of `verbs.h` (`___ibv_query_port`),
/// not the exported compat symbol of the same name.
///
/// # Safety
/// `context` must be an open device context, `port_attr` valid for writes.
#[doc(alias = "___ibv_query_port")]
#[inline]
pub unsafe fn ibv_query_port(
    context: *mut ibv_context,
    port_num: u8,
    port_attr: *mut ibv_port_attr,
) -> core::ffi::c_int {
    // SAFETY: forwarded contract of the C macro.
    unsafe { ___ibv_query_port(context, port_num, port_attr) }
}

/// Defines a data-path inline of `verbs.h`: `obj->context->ops.$op(obj,
/// args…)`, or `$null` when the op is NULL.
macro_rules! provider_op {
    ($(#[$doc:meta])* fn $name:ident($obj:ident: $obj_ty:ty $(, $arg:ident: $arg_ty:ty)*)
        => $op:ident, $null:expr) => {
        $(#[$doc])*
        #[inline]
        pub unsafe fn $name($obj: $obj_ty $(, $arg: $arg_ty)*) -> core::ffi::c_int {
            // SAFETY: `$obj` is live (the caller's contract), so is the
            // context it points to.
            match unsafe { (*(*$obj).context).ops.$op } {
                // SAFETY: the provider's op with the caller's arguments, as
                // the C inline calls it.
                Some(op) => unsafe { op($obj $(, $arg)*) },
                None => $null,
            }
        }
    };
}

provider_op! {
    /// Posts a list of send work requests (`qp->context->ops.post_send`).
    ///
    /// # Safety
    /// As `ibv_post_send(3)`: `qp` a live QP, `wr` a valid NULL-terminated
    /// chain whose buffers stay valid until their completions, `bad_wr`
    /// valid for writes.
    fn ibv_post_send(qp: *mut ibv_qp, wr: *mut ibv_send_wr, bad_wr: *mut *mut ibv_send_wr)
        => post_send, libc::EOPNOTSUPP
}

provider_op! {
    /// Posts a list of receive work requests (`qp->context->ops.post_recv`).
    ///
    /// # Safety
    /// As `ibv_post_recv(3)`, see [`ibv_post_send`].
    fn ibv_post_recv(qp: *mut ibv_qp, wr: *mut ibv_recv_wr, bad_wr: *mut *mut ibv_recv_wr)
        => post_recv, libc::EOPNOTSUPP
}

provider_op! {
    /// Posts a list of receive work requests to a shared receive queue
    /// (`srq->context->ops.post_srq_recv`).
    ///
    /// # Safety
    /// As `ibv_post_srq_recv(3)`: `srq` a live SRQ, the rest as
    /// [`ibv_post_recv`].
    fn ibv_post_srq_recv(srq: *mut ibv_srq, wr: *mut ibv_recv_wr, bad_wr: *mut *mut ibv_recv_wr)
        => post_srq_recv, libc::EOPNOTSUPP
}

provider_op! {
    /// Polls up to `num_entries` work completions into `wc`
    /// (`cq->context->ops.poll_cq`): their number, or a negative value on
    /// failure.
    ///
    /// # Safety
    /// As `ibv_poll_cq(3)`: `cq` a live CQ, `wc` valid for `num_entries`
    /// writes.
    fn ibv_poll_cq(cq: *mut ibv_cq, num_entries: core::ffi::c_int, wc: *mut ibv_wc)
        => poll_cq, -libc::EOPNOTSUPP
}

provider_op! {
    /// Requests a completion event for the next (solicited) entry of `cq`
    /// (`cq->context->ops.req_notify_cq`).
    ///
    /// # Safety
    /// As `ibv_req_notify_cq(3)`: `cq` a live CQ.
    fn ibv_req_notify_cq(cq: *mut ibv_cq, solicited_only: core::ffi::c_int)
        => req_notify_cq, libc::EOPNOTSUPP
}

/// Registers a memory region; like the `ibv_reg_mr` macro of `verbs.h`,
/// access flags in `IBV_ACCESS_OPTIONAL_RANGE` route the call to
/// `ibv_reg_mr_iova2` (with `iova == addr`).
///
/// # Safety
/// As `ibv_reg_mr(3)`: `pd` must be a live protection domain and
/// `[addr, addr + length)` memory the caller keeps valid while registered.
#[inline]
pub unsafe fn ibv_reg_mr(
    pd: *mut ibv_pd,
    addr: *mut core::ffi::c_void,
    length: usize,
    access: core::ffi::c_int,
) -> *mut ibv_mr {
    // SAFETY: forwarded contract; `is_access_const = 1` makes the inline
    // choose by the flags' value exactly as the C macro does for constants.
    unsafe { __ibv_reg_mr(pd, addr, length, access as core::ffi::c_uint, 1) }
}

/// Registers a memory region whose device address is `iova`; routes
/// `IBV_ACCESS_OPTIONAL_RANGE` to `ibv_reg_mr_iova2` like the C macro.
///
/// # Safety
/// As [`ibv_reg_mr`].
#[inline]
pub unsafe fn ibv_reg_mr_iova(
    pd: *mut ibv_pd,
    addr: *mut core::ffi::c_void,
    length: usize,
    iova: u64,
    access: core::ffi::c_int,
) -> *mut ibv_mr {
    // SAFETY: forwarded contract, as in `ibv_reg_mr`.
    unsafe { __ibv_reg_mr_iova(pd, addr, length, iova, access as core::ffi::c_uint, 1) }
}
