//! Verbs newer than rdma-core 44, whose headers the bindings come from, and
//! the release of the rdma-core a program runs on.
//!
//! Everything here compiles on every machine; what it needs of the library
//! is resolved at run time. Each item names the release that added it; use
//! one only when [`rdma_core_release`] is at least that release. Values are
//! rdma-core's (`verbs.h`); `tests/bindings.rs` (feature `bindgen`) checks
//! them against newer headers.

use crate::{
    ibv_access_flags, ibv_qp_create_send_ops_flags, ibv_qp_ex, ibv_wc_opcode, ibv_wr_opcode,
};
use core::sync::atomic::{AtomicU32, Ordering};

/// The rdma-core release that added flush (`ibv_wr_flush`, its opcodes and
/// access flags).
pub const FLUSH_RELEASE: u32 = 45;

/// Completion of a flush (rdma-core 45).
pub const IBV_WC_FLUSH: ibv_wc_opcode = 8;
/// Work request opcode of a flush (rdma-core 45).
pub const IBV_WR_FLUSH: ibv_wr_opcode = 14;

impl ibv_access_flags {
    /// Remote peers may flush this region for global visibility (rdma-core 45).
    pub const IBV_ACCESS_FLUSH_GLOBAL: ibv_access_flags = ibv_access_flags(1 << 8);
    /// Remote peers may flush this region for persistence (rdma-core 45).
    pub const IBV_ACCESS_FLUSH_PERSISTENT: ibv_access_flags = ibv_access_flags(1 << 9);
}

impl ibv_qp_create_send_ops_flags {
    /// The extended QP may post flushes (rdma-core 45).
    pub const IBV_QP_EX_WITH_FLUSH: ibv_qp_create_send_ops_flags =
        ibv_qp_create_send_ops_flags(1 << 11);
}

/// What a flush makes durable (`enum ibv_placement_type`, rdma-core 45).
pub type ibv_placement_type = core::ffi::c_uint;
/// Global visibility.
pub const IBV_FLUSH_GLOBAL: ibv_placement_type = 1 << 0;
/// Persistence.
pub const IBV_FLUSH_PERSISTENT: ibv_placement_type = 1 << 1;

/// How much a flush covers (`enum ibv_selectivity_level`, rdma-core 45).
pub type ibv_selectivity_level = core::ffi::c_uint;
/// The given range.
pub const IBV_FLUSH_RANGE: ibv_selectivity_level = 0;
/// The whole memory region of the key.
pub const IBV_FLUSH_MR: ibv_selectivity_level = 1;

/// `ibv_qp_ex::wr_flush`'s type.
pub type ibv_wr_flush_fn = unsafe extern "C" fn(
    qp: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    len: usize,
    type_: u8,
    level: u8,
);

/// rdma-core 45's `struct ibv_qp_ex`: rdma-core 44's with `wr_flush`
/// appended (rdma-core only appends to it).
#[repr(C)]
pub struct ibv_qp_ex_45 {
    /// The fields rdma-core 44 has.
    pub ex: ibv_qp_ex,
    /// Posts a flush (set by the provider when the QP was created with
    /// [`IBV_QP_EX_WITH_FLUSH`](ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_FLUSH)).
    pub wr_flush: Option<ibv_wr_flush_fn>,
}

/// Posts a flush of `[remote_addr, remote_addr + len)` of `rkey` (or of its
/// whole region, `level == IBV_FLUSH_MR`) on an extended QP inside
/// `ibv_wr_start`/`ibv_wr_complete` (rdma-core 45).
///
/// # Safety
/// - the loaded library is rdma-core 45 or newer ([`rdma_core_release`]):
///   an older one's `ibv_qp_ex` has no `wr_flush` field;
/// - `qp` was created with `IBV_QP_EX_WITH_FLUSH` in `send_ops_flags` and
///   is between `ibv_wr_start` and `ibv_wr_complete`/`ibv_wr_abort`, as
///   for every `ibv_wr_*` function (a provider leaves unrequested ops
///   unset; this calls it without a NULL check, as C does).
///
/// # References
/// `ibv_wr_post(3)`
#[inline]
pub unsafe fn ibv_wr_flush(
    qp: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    len: usize,
    type_: u8,
    level: u8,
) {
    // SAFETY: the caller's contract: a release-45 `ibv_qp_ex`, whose
    // provider set `wr_flush` (an unset one is a panic here, not a jump).
    unsafe {
        let f = (*qp.cast::<ibv_qp_ex_45>()).wr_flush;
        f.expect("ibv_wr_flush on a QP created without IBV_QP_EX_WITH_FLUSH")(
            qp,
            rkey,
            remote_addr,
            len,
            type_,
            level,
        )
    }
}

/// Not yet looked up.
const UNKNOWN: u32 = 0;
/// Looked up, not found.
const NONE: u32 = u32::MAX;
static RELEASE: AtomicU32 = AtomicU32::new(UNKNOWN);

/// The rdma-core release of the libibverbs this process runs on (`45` for
/// rdma-core 45.0), or `None` when it cannot tell: the library is not
/// loaded (feature `dlopen` before [`crate::load`]), is linked statically,
/// or its file does not carry rdma-core's version
/// (`libibverbs.so.1.<abi>.<release>.<patch>`, as rdma-core installs it).
///
/// Looked up once (`dladdr` and `realpath` of the library's file), then
/// an atomic load. With `None`, treat every item of this module as
/// unavailable.
pub fn rdma_core_release() -> Option<u32> {
    match RELEASE.load(Ordering::Relaxed) {
        UNKNOWN => {}
        NONE => return None,
        r => return Some(r),
    }
    let found = library_file_release();
    // Not cached while the library is not loaded yet (feature `dlopen`).
    if found.is_some() || library_symbol().is_some() {
        RELEASE.store(found.unwrap_or(NONE), Ordering::Relaxed);
    }
    found
}

/// An address inside libibverbs' own code.
fn library_symbol() -> Option<*const core::ffi::c_void> {
    #[cfg(not(feature = "dlopen"))]
    {
        Some(crate::ibv_get_device_list as *const core::ffi::c_void)
    }
    #[cfg(feature = "dlopen")]
    {
        crate::dl::LIBIBVERBS
            .loaded_symbol(c"ibv_get_device_list")
            .map(|p| p as *const core::ffi::c_void)
    }
}

fn library_file_release() -> Option<u32> {
    let addr = library_symbol()?;
    // SAFETY: all-zero is a valid `Dl_info` (NULL pointers).
    let mut info: libc::Dl_info = unsafe { core::mem::zeroed() };
    // SAFETY: `addr` is an address, `info` valid for writes.
    if unsafe { libc::dladdr(addr, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    let mut buf = [0 as core::ffi::c_char; libc::PATH_MAX as usize];
    // SAFETY: `dli_fname` is a NUL-terminated path owned by the loader;
    // `buf` holds PATH_MAX bytes, as realpath requires.
    let real = unsafe { libc::realpath(info.dli_fname, buf.as_mut_ptr()) };
    if real.is_null() {
        return None;
    }
    // SAFETY: realpath wrote a NUL-terminated path into `buf`.
    let path = unsafe { core::ffi::CStr::from_ptr(buf.as_ptr()) };
    release_of_file(path.to_bytes())
}

/// The release in a library path's file name:
/// `…/libibverbs.so.1.14.45.0` → 45.
pub(crate) fn release_of_file(path: &[u8]) -> Option<u32> {
    let name = path.rsplit(|&b| b == b'/').next()?;
    let rest = name.strip_prefix(b"libibverbs.so.")?;
    let mut parts = rest.split(|&b| b == b'.');
    let (_abi_major, _abi_minor) = (parts.next()?, parts.next()?);
    let release = core::str::from_utf8(parts.next()?).ok()?;
    match release.parse() {
        Ok(r) if r != UNKNOWN && r != NONE => Some(r),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn release_is_read_from_rdma_cores_file_name() {
        assert_eq!(
            release_of_file(b"/usr/lib/x86_64-linux-gnu/libibverbs.so.1.14.44.0"),
            Some(44)
        );
        assert_eq!(release_of_file(b"libibverbs.so.1.14.45.0"), Some(45));
        assert_eq!(
            release_of_file(b"/opt/rc/lib/libibverbs.so.1.15.60.1"),
            Some(60)
        );
        // Not rdma-core's naming, or not the library at all.
        assert_eq!(release_of_file(b"/usr/lib/libibverbs.so.1"), None);
        assert_eq!(release_of_file(b"/usr/lib/libibverbs.so"), None);
        assert_eq!(release_of_file(b"/usr/bin/server"), None);
        assert_eq!(release_of_file(b"/usr/lib/libibverbs.so.1.14.x.0"), None);
        assert_eq!(release_of_file(b"/usr/lib/libmlx5.so.1.24.44.0"), None);
        assert_eq!(release_of_file(b"/x/libibverbs.so.1.14.0.0"), None);
    }

    #[test]
    fn wr_flush_is_the_field_after_rdma_core_44s_last() {
        assert_eq!(
            core::mem::offset_of!(ibv_qp_ex_45, wr_flush),
            core::mem::size_of::<ibv_qp_ex>()
        );
        assert_eq!(
            core::mem::offset_of!(ibv_qp_ex, wr_atomic_write) + core::mem::size_of::<usize>(),
            core::mem::size_of::<ibv_qp_ex>()
        );
    }
}
