//! On-demand paging (ODP): the device's capability, explicit ODP
//! registrations (`AccessFlags::ON_DEMAND` through the ordinary
//! registration methods), implicit ODP (the whole address space) and
//! `ibv_advise_mr` (prefetch).
//!
//! An explicit ODP region is ordinary owned storage the kernel does not pin:
//! the device faults its pages in as it touches them. Ownership is the same
//! as for a pinned region (the storage is freed only after `ibv_dereg_mr`),
//! so the buffer types' rules carry over unchanged. Implicit ODP names every
//! byte of the process: see [`ProtectionDomain::register_implicit_odp`] and
//! DESIGN.md, "On-demand paging, XRC, re-registration".

use std::ptr::NonNull;
use std::sync::Arc;

use rdma_verbs_sys as sys;

use crate::device::capabilities::DeviceAttrEx;
use crate::error::{ret_errno, ret_ptr, Error, Result};
use crate::memory::buffer::RemoteKey;
use crate::memory::memory_region::MemoryRegion;
use crate::memory::protection_domain::ProtectionDomain;
use crate::types::AccessFlags;

bitflags::bitflags! {
    /// Device-wide ODP capabilities (`ibv_odp_caps::general_caps`).
    ///
    /// # References
    /// `ibv_query_device_ex(3)`
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct OdpGeneralCaps: u64 {
        /// Explicit ODP registrations (`IBV_ODP_SUPPORT`).
        const SUPPORT = sys::IBV_ODP_SUPPORT as u64;
        /// Implicit ODP, the whole address space (`IBV_ODP_SUPPORT_IMPLICIT`).
        const SUPPORT_IMPLICIT = sys::IBV_ODP_SUPPORT_IMPLICIT as u64;
    }
}

bitflags::bitflags! {
    /// Operations one transport may run on ODP memory
    /// (`IBV_ODP_SUPPORT_*` of `per_transport_caps`).
    ///
    /// # References
    /// `ibv_query_device_ex(3)`
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct OdpTransportCaps: u32 {
        /// Sends from ODP memory.
        const SEND = sys::IBV_ODP_SUPPORT_SEND;
        /// Receives into ODP memory.
        const RECV = sys::IBV_ODP_SUPPORT_RECV;
        /// RDMA writes.
        const WRITE = sys::IBV_ODP_SUPPORT_WRITE;
        /// RDMA reads.
        const READ = sys::IBV_ODP_SUPPORT_READ;
        /// Atomics.
        const ATOMIC = sys::IBV_ODP_SUPPORT_ATOMIC;
        /// Receives through a shared receive queue.
        const SRQ_RECV = sys::IBV_ODP_SUPPORT_SRQ_RECV;
    }
}

/// A device's ODP capabilities (`struct ibv_odp_caps`).
///
/// # References
/// `ibv_query_device_ex(3)`
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct OdpCaps {
    /// Device-wide capabilities.
    pub general: OdpGeneralCaps,
    /// What RC queue pairs may do with ODP memory.
    pub rc: OdpTransportCaps,
    /// What UC queue pairs may do with ODP memory.
    pub uc: OdpTransportCaps,
    /// What UD queue pairs may do with ODP memory.
    pub ud: OdpTransportCaps,
}

impl DeviceAttrEx {
    /// The device's on-demand paging capabilities (`odp_caps`).
    ///
    /// # References
    /// `ibv_query_device_ex(3)`
    #[doc(alias = "ibv_odp_caps")]
    pub fn odp_caps(&self) -> OdpCaps {
        let raw = self.as_raw().odp_caps;
        OdpCaps {
            general: OdpGeneralCaps::from_bits_retain(raw.general_caps),
            rc: OdpTransportCaps::from_bits_retain(raw.per_transport_caps.rc_odp_caps),
            uc: OdpTransportCaps::from_bits_retain(raw.per_transport_caps.uc_odp_caps),
            ud: OdpTransportCaps::from_bits_retain(raw.per_transport_caps.ud_odp_caps),
        }
    }
}

/// Why a device cannot do what ODP `needed` asks, or `None` (pure logic,
/// unit-tested).
fn odp_refusal(caps: OdpGeneralCaps, needed: OdpGeneralCaps, verb: &'static str) -> Option<Error> {
    if !caps.contains(OdpGeneralCaps::SUPPORT) {
        return Some(Error::DeviceLacks {
            verb,
            capability: "on-demand paging (odp_caps.general_caps lacks IBV_ODP_SUPPORT)",
        });
    }
    if needed.contains(OdpGeneralCaps::SUPPORT_IMPLICIT)
        && !caps.contains(OdpGeneralCaps::SUPPORT_IMPLICIT)
    {
        return Some(Error::DeviceLacks {
            verb,
            capability: "implicit on-demand paging (odp_caps.general_caps lacks \
                         IBV_ODP_SUPPORT_IMPLICIT)",
        });
    }
    None
}

impl ProtectionDomain {
    /// Refuses, before `verb`, what the device's ODP capabilities do not
    /// cover (one `ibv_query_device_ex`: control path only).
    pub(crate) fn check_odp(&self, needed: OdpGeneralCaps, verb: &'static str) -> Result<()> {
        let caps = self.context().query_device_ex()?.odp_caps().general;
        match odp_refusal(caps, needed, verb) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Registers the whole address space for on-demand paging: one key
    /// that names every byte of the process, present or future
    /// (`ibv_reg_mr(pd, NULL, SIZE_MAX, access | IBV_ACCESS_ON_DEMAND)`).
    ///
    /// The region hands out no buffer: its keys go into the caller's raw
    /// SGEs ([`QueuePair::post_send_raw`](crate::QueuePair::post_send_raw)) and, with remote
    /// rights, to peers. `ON_DEMAND` is added to `access`.
    ///
    /// # Safety
    /// The region's keys reach memory the library does not own, so the
    /// caller must:
    /// - treat [`ImplicitOdpRegion::lkey`] as naming all process memory: every
    ///   request that carries it is posted through an `unsafe` raw path, and
    ///   that path's contract (no Rust reference to bytes the device writes,
    ///   memory alive until the completion) holds for every address used;
    /// - with `REMOTE_WRITE` or `REMOTE_ATOMIC`, give the remote key only to
    ///   peers that write solely memory the caller set aside for them
    ///   (alive, never covered by a Rust reference while they may write it):
    ///   the key lets a peer write any mapped byte of the process, which the
    ///   library cannot police;
    /// - with `REMOTE_READ`, accept that a peer holding the key may read any
    ///   mapped byte of the process (secrets included).
    ///
    /// # Errors
    /// - [`Error::DeviceLacks`] naming `ibv_reg_mr` when the device lacks
    ///   ODP or implicit ODP (checked with `ibv_query_device_ex` before the
    ///   verb; rxe on Linux 6.1/6.12 lacks both);
    /// - [`Error::MissingAccess`] for remote write/atomic without
    ///   `LOCAL_WRITE`;
    /// - [`Error::Verb`] naming `ibv_reg_mr` or `ibv_query_device_ex`.
    ///
    /// # References
    /// `ibv_reg_mr(3)` ("implicit on-demand paging"), `ibv_query_device_ex(3)`
    #[doc(alias = "ibv_reg_mr")]
    #[doc(alias = "IBV_ODP_SUPPORT_IMPLICIT")]
    pub unsafe fn register_implicit_odp(&self, access: AccessFlags) -> Result<ImplicitOdpRegion> {
        let access = access | AccessFlags::ON_DEMAND;
        // An implicit region has no length to check; the rights rule is
        // the one every registration follows.
        Self::check_registration(access, 1, None)?;
        self.check_odp(
            OdpGeneralCaps::SUPPORT | OdpGeneralCaps::SUPPORT_IMPLICIT,
            "ibv_reg_mr",
        )?;
        // SAFETY: live PD; NULL/SIZE_MAX is the documented implicit-ODP
        // form: the kernel pins nothing, and what the keys may reach is the
        // caller's contract above.
        let mr = unsafe {
            sys::ibv_reg_mr(
                self.as_ptr(),
                std::ptr::null_mut(),
                usize::MAX,
                access.bits() as i32,
            )
        };
        let mr = ret_ptr("ibv_reg_mr", mr)?;
        Ok(ImplicitOdpRegion {
            inner: Arc::new(ImplicitInner {
                mr,
                pd: self.clone(),
                access,
            }),
        })
    }
}

struct ImplicitInner {
    mr: NonNull<sys::ibv_mr>,
    pd: ProtectionDomain,
    access: AccessFlags,
}

// SAFETY: the MR is only passed to thread-safe verbs and read for its
// immutable keys.
unsafe impl Send for ImplicitInner {}
// SAFETY: as above.
unsafe impl Sync for ImplicitInner {}

impl Drop for ImplicitInner {
    fn drop(&mut self) {
        // SAFETY: last handle; the registration owns no memory, so a
        // failure only leaks the registration (and the PD it needs).
        let rc = unsafe { sys::ibv_dereg_mr(self.mr.as_ptr()) };
        if rc != 0 {
            std::mem::forget(self.pd.clone());
        }
    }
}

/// An implicit on-demand-paging registration: keys covering the whole
/// address space, no memory of its own (see
/// [`ProtectionDomain::register_implicit_odp`]).
///
/// # References
/// `ibv_reg_mr(3)`
#[derive(Clone)]
pub struct ImplicitOdpRegion {
    inner: Arc<ImplicitInner>,
}

impl std::fmt::Debug for ImplicitOdpRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImplicitOdpRegion")
            .field("lkey", &format_args!("{:#x}", self.lkey()))
            .field("access", &self.inner.access)
            .finish()
    }
}

impl ImplicitOdpRegion {
    /// Local key: names any address of the process.
    pub fn lkey(&self) -> u32 {
        // SAFETY: live MR; keys are immutable.
        unsafe { (*self.inner.mr.as_ptr()).lkey }
    }
    /// Remote key, when registered with remote rights.
    pub fn rkey(&self) -> Option<RemoteKey> {
        let remote =
            AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC;
        // SAFETY: as in `lkey`.
        let rkey = unsafe { (*self.inner.mr.as_ptr()).rkey };
        self.inner
            .access
            .intersects(remote)
            .then_some(RemoteKey(rkey))
    }
    /// The rights it was registered with (`ON_DEMAND` included).
    pub fn access(&self) -> AccessFlags {
        self.inner.access
    }
    /// The protection domain.
    pub fn pd(&self) -> &ProtectionDomain {
        &self.inner.pd
    }
    /// The raw MR pointer, valid while `self` lives.
    pub fn as_ptr(&self) -> *mut sys::ibv_mr {
        self.inner.mr.as_ptr()
    }

    /// Asks the device to fault in the pages behind `ranges`, slices of
    /// this process's memory (`ibv_advise_mr` with this region's key).
    /// Advice changes only the device's page tables, never a byte.
    ///
    /// # Errors
    /// As [`MemoryRegion::advise`].
    ///
    /// # References
    /// `ibv_advise_mr(3)`
    #[doc(alias = "ibv_advise_mr")]
    pub fn advise(&self, advice: Advice, flush: bool, ranges: &[&[u8]]) -> Result<()> {
        let lkey = self.lkey();
        let sges = ranges
            .iter()
            .map(|r| sge(r.as_ptr() as u64, r.len(), lkey))
            .collect::<Result<Vec<_>>>()?;
        advise_mr(&self.inner.pd, advice, flush, sges)
    }
}

/// What [`MemoryRegion::advise`] asks of the device
/// (`IB_UVERBS_ADVISE_MR_ADVICE_*`).
///
/// # References
/// `ibv_advise_mr(3)`
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Advice {
    /// Fault the pages in for reading (`IBV_ADVISE_MR_ADVICE_PREFETCH`).
    Prefetch,
    /// Fault the pages in for writing
    /// (`IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE`).
    PrefetchWrite,
    /// Map only pages already present, without faulting
    /// (`IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT`).
    PrefetchNoFault,
}

impl Advice {
    fn raw(self) -> sys::ib_uverbs_advise_mr_advice {
        match self {
            Advice::Prefetch => sys::IB_UVERBS_ADVISE_MR_ADVICE_PREFETCH,
            Advice::PrefetchWrite => sys::IB_UVERBS_ADVISE_MR_ADVICE_PREFETCH_WRITE,
            Advice::PrefetchNoFault => sys::IB_UVERBS_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT,
        }
    }
}

fn sge(addr: u64, len: usize, lkey: u32) -> Result<sys::ibv_sge> {
    let length = u32::try_from(len).map_err(|_| Error::OutOfRange {
        what: "an ibv_advise_mr range (one SGE)",
        value: len as u64,
        max: u64::from(u32::MAX),
    })?;
    Ok(sys::ibv_sge { addr, length, lkey })
}

/// Checks `[start, start + len)` against a region of `region_len` bytes.
fn check_range(start: usize, len: usize, region_len: usize) -> Result<()> {
    match start.checked_add(len) {
        Some(end) if end <= region_len => Ok(()),
        _ => Err(Error::OutOfRange {
            what: "an ibv_advise_mr range (offset + length past the region)",
            value: start.saturating_add(len) as u64,
            max: region_len as u64,
        }),
    }
}

fn advise_mr(
    pd: &ProtectionDomain,
    advice: Advice,
    flush: bool,
    mut sges: Vec<sys::ibv_sge>,
) -> Result<()> {
    if sges.is_empty() {
        return Ok(());
    }
    let num = u32::try_from(sges.len()).map_err(|_| Error::OutOfRange {
        what: "ibv_advise_mr ranges",
        value: sges.len() as u64,
        max: u64::from(u32::MAX),
    })?;
    let flags = if flush {
        sys::IB_UVERBS_ADVISE_MR_FLAG_FLUSH
    } else {
        0
    };
    // SAFETY: live PD; `sges` is valid for `num` entries for the call and
    // names memory of a registration the caller holds; advice only changes
    // the device's page tables.
    let rc =
        unsafe { sys::ibv_advise_mr(pd.as_ptr(), advice.raw(), flags, sges.as_mut_ptr(), num) };
    ret_errno("ibv_advise_mr", rc).map_err(|e| match e.raw_os_error() {
        Some(libc::EOPNOTSUPP | libc::ENOSYS) => Error::DeviceLacks {
            verb: "ibv_advise_mr",
            capability: "memory advice (the provider returned EOPNOTSUPP)",
        },
        _ => e,
    })
}

impl MemoryRegion {
    /// Asks the device to fault in the pages of `ranges` (`(offset,
    /// length)` pairs of bytes in this region) ahead of use (`ibv_advise_mr`): `Prefetch`
    /// for reading, `PrefetchWrite` for writing, `PrefetchNoFault` to map
    /// only pages already present; `flush` waits until the device acted
    /// (`IBV_ADVISE_MR_FLAG_FLUSH`). Only for regions registered with
    /// [`AccessFlags::ON_DEMAND`]; advice changes the device's page tables,
    /// never a byte, so it is safe over memory a buffer holds.
    ///
    /// # Errors
    /// - [`Error::DeviceLacks`] naming `ibv_advise_mr` when the device
    ///   lacks ODP (checked before the verb) or its provider has no advice;
    /// - [`Error::MissingAccess`] for a region without `ON_DEMAND` on a
    ///   device with ODP;
    /// - [`Error::OutOfRange`] for a range past the region or longer than
    ///   `u32::MAX`;
    /// - [`Error::Verb`] naming `ibv_advise_mr` or `ibv_query_device_ex`.
    ///
    /// # References
    /// `ibv_advise_mr(3)`
    #[doc(alias = "ibv_advise_mr")]
    pub fn advise(&self, advice: Advice, flush: bool, ranges: &[(usize, usize)]) -> Result<()> {
        if !self.access().contains(AccessFlags::ON_DEMAND) {
            // A device without ODP is the clearer answer; on one with it,
            // the region is what lacks it.
            self.pd()
                .check_odp(OdpGeneralCaps::SUPPORT, "ibv_advise_mr")?;
            return Err(Error::MissingAccess {
                what: "a region given memory advice (ibv_advise_mr(3))",
                needed: AccessFlags::ON_DEMAND,
            });
        }
        let sges = ranges
            .iter()
            .map(|&(offset, len)| {
                check_range(offset, len, self.len())?;
                sge(self.addr().wrapping_add(offset as u64), len, self.lkey())
            })
            .collect::<Result<Vec<_>>>()?;
        advise_mr(self.pd(), advice, flush, sges)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusal_names_the_missing_capability() {
        let none = OdpGeneralCaps::empty();
        let explicit = OdpGeneralCaps::SUPPORT;
        let both = OdpGeneralCaps::SUPPORT | OdpGeneralCaps::SUPPORT_IMPLICIT;
        match odp_refusal(none, explicit, "ibv_reg_mr") {
            Some(Error::DeviceLacks { verb, capability }) => {
                assert_eq!(verb, "ibv_reg_mr");
                assert!(capability.contains("IBV_ODP_SUPPORT"));
            }
            other => panic!("{other:?}"),
        }
        assert!(odp_refusal(explicit, explicit, "ibv_reg_mr").is_none());
        match odp_refusal(explicit, both, "ibv_reg_mr") {
            Some(Error::DeviceLacks { capability, .. }) => {
                assert!(capability.contains("IBV_ODP_SUPPORT_IMPLICIT"))
            }
            other => panic!("{other:?}"),
        }
        assert!(odp_refusal(both, both, "ibv_reg_mr").is_none());
    }

    #[test]
    fn ranges_are_bounded_by_the_region_and_one_sge() {
        assert!(check_range(0, 4096, 4096).is_ok());
        assert!(check_range(4000, 96, 4096).is_ok());
        assert!(matches!(
            check_range(4000, 97, 4096),
            Err(Error::OutOfRange { .. })
        ));
        assert!(matches!(
            check_range(usize::MAX, 2, 4096),
            Err(Error::OutOfRange { .. })
        ));
        assert!(sge(0, u32::MAX as usize, 1).is_ok());
        #[cfg(target_pointer_width = "64")]
        assert!(matches!(
            sge(0, u32::MAX as usize + 1, 1),
            Err(Error::OutOfRange { .. })
        ));
    }

    #[test]
    fn advice_maps_to_the_uapi_values() {
        assert_eq!(Advice::Prefetch.raw(), 0);
        assert_eq!(Advice::PrefetchWrite.raw(), 1);
        assert_eq!(Advice::PrefetchNoFault.raw(), 2);
    }
}
