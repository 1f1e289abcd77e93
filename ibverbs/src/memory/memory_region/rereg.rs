//! Re-registration (`ibv_rereg_mr`): the subset that is sound.
//!
//! `ibv_rereg_mr` can change a region's translation (its memory), its PD
//! and its access rights. Only an access change is offered, and only to
//! the sole holder of the registration (`&mut` over a buffer whose region
//! nothing else holds: no split piece, no `MemoryRegion` handle, no window,
//! no posted request), with rights that keep the buffer type's invariant.
//! Why the rest is not offered is in DESIGN.md, "On-demand paging, XRC,
//! re-registration".

use std::sync::Arc;

use rdma_verbs_sys as sys;

use crate::error::{Error, Result};
use crate::memory::buffer::Region;
use crate::memory::buffer::{LocalBuffer, SharedBuffer};
use crate::memory::protection_domain::ProtectionDomain;
use crate::types::AccessFlags;

/// Rights a re-registration may not change: they change how the region is
/// addressed or paged, which the buffers and their SGEs assume fixed.
const FIXED: AccessFlags = AccessFlags::ON_DEMAND
    .union(AccessFlags::ZERO_BASED)
    .union(AccessFlags::HUGETLB);

/// The checks made before the verb (pure, unit-tested): `peer_writes` says
/// whether the buffer type lets peers change its bytes ([`SharedBuffer`]).
fn check_access(old: AccessFlags, new: AccessFlags, peer_writes: bool) -> Result<()> {
    let changed = (old ^ new) & FIXED;
    if !changed.is_empty() {
        return Err(Error::AccessNotAllowed {
            what: "a re-registration (ON_DEMAND, ZERO_BASED and HUGETLB stay as registered)",
            flags: changed,
        });
    }
    if new.remote_writable() && !peer_writes {
        return Err(Error::NeedsSharedBuffer {
            what: "REMOTE_WRITE or REMOTE_ATOMIC granted by ibv_rereg_mr",
        });
    }
    ProtectionDomain::check_registration(new, 1, None)
}

/// What a failed `ibv_rereg_mr` means, from its return code and `errno`
/// (pure, unit-tested): the error, and whether the registration is surely
/// unchanged (`IBV_REREG_MR_ERR_INPUT`, or a refusal with `EOPNOTSUPP`);
/// otherwise it is in an unknown state (the old rights or the new ones, or
/// unusable).
fn failure(rc: i32, errno: i32) -> (Error, bool) {
    // libibverbs reports every provider failure as IBV_REREG_MR_ERR_CMD,
    // the provider's own refusal included (rxe, rdma-core 44: its stub sets
    // EOPNOTSUPP and changes nothing; the kernel, too, answers EOPNOTSUPP
    // before touching a region its driver cannot re-register). So
    // EOPNOTSUPP means "unchanged" whatever the code.
    let refused = matches!(errno, libc::EOPNOTSUPP | libc::ENOSYS);
    let unchanged = rc == sys::IBV_REREG_MR_ERR_INPUT || refused;
    let err = match errno {
        libc::EOPNOTSUPP | libc::ENOSYS => Error::DeviceLacks {
            verb: "ibv_rereg_mr",
            capability: "re-registration (the provider returned EOPNOTSUPP)",
        },
        0 => Error::Verb {
            verb: "ibv_rereg_mr",
            io: std::io::Error::other(format!("returned {rc} without setting errno")),
        },
        e => Error::from_errno("ibv_rereg_mr", e),
    };
    (err, unchanged)
}

/// Changes the rights of the registration behind `region`, which must be
/// its only holder.
fn rereg_access(region: &mut Region, access: AccessFlags, peer_writes: bool) -> Result<()> {
    check_access(region.mr.access, access, peer_writes)?;
    // The sole holder proves that no other buffer, window, handle or
    // posted request of the safe API uses the region's keys or rights.
    let inner = Arc::get_mut(&mut region.mr).ok_or(Error::RegionInUse {
        verb: "ibv_rereg_mr",
    })?;
    let mr = inner.mr.as_ptr();
    // SAFETY: live MR, not in use by any safe-API request (sole holder);
    // an access change touches neither the memory nor the PD.
    let rc = unsafe {
        sys::ibv_rereg_mr(
            mr,
            sys::ibv_rereg_mr_flags::IBV_REREG_MR_CHANGE_ACCESS.0 as i32,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
            access.bits() as i32,
        )
    };
    if rc == 0 {
        inner.access = access;
    } else {
        let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
        let (err, unchanged) = failure(rc, errno);
        if !unchanged {
            // The device may hold either set of rights (or none): record
            // both. Each keeps the buffer type's invariant (checked above).
            inner.access |= access;
        }
        // SAFETY: live MR; libibverbs updates the keys only on success.
        unsafe {
            inner.lkey = (*mr).lkey;
            inner.rkey = (*mr).rkey;
        }
        return Err(err);
    }
    // SAFETY: live MR; keys updated by the successful call (a provider may
    // issue new ones).
    unsafe {
        inner.lkey = (*mr).lkey;
        inner.rkey = (*mr).rkey;
    }
    Ok(())
}

impl LocalBuffer {
    /// Changes the region's access rights in place (`ibv_rereg_mr` with
    /// `IBV_REREG_MR_CHANGE_ACCESS`), for the sole holder of the
    /// registration. The new rights keep a `LocalBuffer`'s promise (no
    /// peer changes its bytes): `REMOTE_READ` may come and go, remote write
    /// and atomic rights never come. Keys may change; read them again.
    ///
    /// Changing the memory (`IBV_REREG_MR_CHANGE_TRANSLATION`) or the PD
    /// (`IBV_REREG_MR_CHANGE_PD`) is deliberately not offered (DESIGN.md,
    /// "On-demand paging, XRC, re-registration"): register anew instead.
    ///
    /// Requests posted through the `unsafe` raw paths with this region's
    /// keys are the caller's to finish first (their contracts).
    ///
    /// # Errors
    /// - [`Error::RegionInUse`] when anything else holds the registration
    ///   (a split piece, a [`MemoryRegion`](crate::MemoryRegion) handle, a
    ///   window, a posted or prepared request, a pool);
    /// - [`Error::NeedsSharedBuffer`] for `REMOTE_WRITE` or
    ///   `REMOTE_ATOMIC`;
    /// - [`Error::AccessNotAllowed`] for a change of `ON_DEMAND`,
    ///   `ZERO_BASED` or `HUGETLB`;
    /// - [`Error::DeviceLacks`] naming `ibv_rereg_mr` when the provider
    ///   cannot re-register (`EOPNOTSUPP`, as rxe): the region is unchanged
    ///   and usable;
    /// - [`Error::Verb`] naming `ibv_rereg_mr` otherwise. If the kernel
    ///   command failed (`IBV_REREG_MR_ERR_CMD`), the registration may be
    ///   left with either rights or unusable (requests on it then end in
    ///   protection errors): drop the buffer. Memory safety holds either
    ///   way: both rights keep the invariant, and the memory is freed only
    ///   after `ibv_dereg_mr` succeeded.
    ///
    /// # References
    /// `ibv_rereg_mr(3)`
    #[doc(alias = "ibv_rereg_mr")]
    pub fn rereg_access(&mut self, access: AccessFlags) -> Result<()> {
        rereg_access(self.region_mut(), access, false)
    }
}

impl SharedBuffer {
    /// Changes the region's access rights in place (`ibv_rereg_mr` with
    /// `IBV_REREG_MR_CHANGE_ACCESS`), for the sole holder of the
    /// registration; any rights a registration may have (a
    /// `SharedBuffer`'s bytes are reached only by copies, so peers may
    /// gain or lose write rights). Keys may change; read them again (and
    /// give the peer the new [`SharedBuffer::remote`]).
    ///
    /// # Errors
    /// As [`LocalBuffer::rereg_access`], without the
    /// [`Error::NeedsSharedBuffer`] case; [`Error::MissingAccess`] for
    /// remote write or atomic rights without `LOCAL_WRITE`.
    ///
    /// # References
    /// `ibv_rereg_mr(3)`
    #[doc(alias = "ibv_rereg_mr")]
    pub fn rereg_access(&mut self, access: AccessFlags) -> Result<()> {
        rereg_access(self.region_mut(), access, true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LW: AccessFlags = AccessFlags::LOCAL_WRITE;

    #[test]
    fn local_buffers_never_gain_peer_write_rights() {
        assert!(check_access(LW, LW | AccessFlags::REMOTE_READ, false).is_ok());
        assert!(check_access(LW | AccessFlags::REMOTE_READ, LW, false).is_ok());
        assert!(check_access(LW, AccessFlags::empty(), false).is_ok());
        for grant in [AccessFlags::REMOTE_WRITE, AccessFlags::REMOTE_ATOMIC] {
            assert!(matches!(
                check_access(LW, LW | grant, false),
                Err(Error::NeedsSharedBuffer { .. })
            ));
            assert!(check_access(LW, LW | grant, true).is_ok());
        }
    }

    #[test]
    fn paging_and_addressing_stay_as_registered() {
        for fixed in [
            AccessFlags::ON_DEMAND,
            AccessFlags::ZERO_BASED,
            AccessFlags::HUGETLB,
        ] {
            assert!(matches!(
                check_access(LW, LW | fixed, true),
                Err(Error::AccessNotAllowed { flags, .. }) if flags == fixed
            ));
            assert!(matches!(
                check_access(LW | fixed, LW, true),
                Err(Error::AccessNotAllowed { .. })
            ));
            assert!(check_access(LW | fixed, LW | fixed | AccessFlags::REMOTE_READ, true).is_ok());
        }
    }

    #[test]
    fn remote_write_still_needs_local_write() {
        assert!(matches!(
            check_access(LW, AccessFlags::REMOTE_WRITE, true),
            Err(Error::MissingAccess { .. })
        ));
    }

    #[test]
    fn failures_say_whether_the_region_changed() {
        let (e, unchanged) = failure(sys::IBV_REREG_MR_ERR_INPUT, libc::EOPNOTSUPP);
        assert!(unchanged);
        assert!(matches!(
            e,
            Error::DeviceLacks {
                verb: "ibv_rereg_mr",
                ..
            }
        ));
        // What rxe's stub comes back as through libibverbs.
        let (e, unchanged) = failure(sys::IBV_REREG_MR_ERR_CMD, libc::EOPNOTSUPP);
        assert!(unchanged);
        assert!(matches!(e, Error::DeviceLacks { .. }));
        let (e, unchanged) = failure(sys::IBV_REREG_MR_ERR_CMD, libc::EINVAL);
        assert!(!unchanged);
        assert!(matches!(
            e,
            Error::Verb {
                verb: "ibv_rereg_mr",
                ..
            }
        ));
        let (e, _) = failure(sys::IBV_REREG_MR_ERR_CMD, 0);
        assert!(matches!(e, Error::Verb { .. }));
    }
}
