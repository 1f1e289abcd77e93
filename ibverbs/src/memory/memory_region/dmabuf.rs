//! dmabuf registration (`ibv_reg_dmabuf_mr`): memory another driver
//! exports (a GPU, `udmabuf`, a DMA heap) that the device reaches by fd.
//!
//! Such memory is not process memory the crate can reference, so a
//! [`DmabufRegion`] hands out no buffer: it is a target for peers
//! ([`DmabufRegion::remote`]) and for the caller's raw SGEs (its
//! [`MemoryRegion`] keys). DESIGN.md, "dmabuf regions and chosen IOVAs".

use std::os::fd::{AsRawFd, OwnedFd};
use std::ptr::NonNull;

use rdma_verbs_sys as sys;

use super::{Backing, MemoryRegion, RegisterOptions};
use crate::error::{ret_ptr, Error, Result};
use crate::memory::buffer::RemoteMemory;
use crate::memory::protection_domain::ProtectionDomain;

/// A registered dmabuf (`ibv_reg_dmabuf_mr`): keys and device addresses of
/// memory that another driver exports, with the dmabuf's fd kept open until
/// `ibv_dereg_mr` succeeds.
///
/// No local buffer comes out of it: the bytes belong to the exporter and
/// may not be CPU-addressable at all. Peers reach them through
/// [`DmabufRegion::remote`]; local requests through the raw posting path
/// with [`MemoryRegion::lkey`] and addresses in
/// `[addr, addr + len)` of [`DmabufRegion::region`].
///
/// # References
/// `ibv_reg_mr(3)` (`ibv_reg_dmabuf_mr`)
#[derive(Clone, Debug)]
pub struct DmabufRegion {
    mr: MemoryRegion,
    offset: u64,
}

impl DmabufRegion {
    /// The registration: keys, device address (the IOVA), length, access.
    pub fn region(&self) -> &MemoryRegion {
        &self.mr
    }

    /// What a peer needs to access the whole region (send it out of band);
    /// `None` without remote access rights.
    pub fn remote(&self) -> Option<RemoteMemory> {
        self.mr.remote()
    }

    /// The offset into the dmabuf where the region starts.
    pub fn offset(&self) -> u64 {
        self.offset
    }
}

impl ProtectionDomain {
    /// Registers `len` bytes of the dmabuf `fd` from `offset`, with the
    /// rights of `options` and its IOVA (default: `offset`), so the device
    /// and peers can reach memory another driver exports (GPU memory,
    /// `udmabuf`, DMA heaps).
    ///
    /// The region owns `fd` and closes it after `ibv_dereg_mr`; on an
    /// error `fd` is closed before returning (keep a `try_clone` to retry).
    ///
    /// # Safety
    /// The crate cannot see what the exporter does with the memory, nor
    /// other mappings of it; the caller must ensure that:
    /// * `[offset, offset + len)` of the dmabuf stays memory that the
    ///   caller owns for this purpose for as long as the region lives (any
    ///   clone of it or of its [`MemoryRegion`], and any request posted
    ///   with its keys): the exporter does not give those bytes to another
    ///   user while registered;
    /// * while the device may write the bytes (`LOCAL_WRITE` with local
    ///   requests, `REMOTE_WRITE` or `REMOTE_ATOMIC` with a peer holding
    ///   the key), no Rust reference (`&[u8]`, `&mut [u8]`, `&T`) to them
    ///   exists through any other mapping of the same memory (for example
    ///   the memfd under a `udmabuf`, or an `mmap` of the dmabuf): read
    ///   such a mapping only with volatile or raw-pointer copies, as
    ///   [`SharedBuffer`](crate::SharedBuffer) does for process memory;
    /// * requests the caller posts with the region's keys (raw path) follow
    ///   the raw path's own contract.
    ///
    /// # Errors
    /// [`Error::MissingAccess`] for remote write/atomic without
    /// `LOCAL_WRITE`, [`Error::EmptyRegistration`] for `len` 0,
    /// [`Error::OutOfRange`] when `iova + len` wraps;
    /// [`Error::DeviceLacks`] naming `ibv_reg_dmabuf_mr` when the provider
    /// or kernel driver does not register dmabufs (`EOPNOTSUPP`, as rxe);
    /// [`Error::Verb`] naming `ibv_reg_dmabuf_mr` otherwise (`EINVAL`/
    /// `EBADF` for an fd that is no dmabuf or a range past its end).
    ///
    /// # References
    /// `ibv_reg_mr(3)` (`ibv_reg_dmabuf_mr`), the kernel's
    /// `Documentation/driver-api/dma-buf.rst`
    #[doc(alias = "ibv_reg_dmabuf_mr")]
    pub unsafe fn register_dmabuf(
        &self,
        fd: OwnedFd,
        offset: u64,
        len: usize,
        options: impl Into<RegisterOptions>,
    ) -> Result<DmabufRegion> {
        let RegisterOptions { access, iova } = options.into();
        let iova = iova.unwrap_or(offset);
        Self::check_registration(access, len, Some(iova))?;
        // SAFETY: live PD; the fd is open (owned here) for the call and,
        // on success, kept open by the returned region until after
        // deregistration. What the device may touch is the caller's
        // contract above.
        let mr = unsafe {
            sys::ibv_reg_dmabuf_mr(
                self.as_ptr(),
                offset,
                len,
                iova,
                fd.as_raw_fd(),
                access.bits() as i32,
            )
        };
        let mr = ret_ptr("ibv_reg_dmabuf_mr", mr).map_err(refusal)?;
        // No process pointer: `ptr` is never read for a dmabuf region
        // (no Region is built from it).
        let inner = self.mr_inner(
            mr,
            NonNull::dangling(),
            len,
            iova,
            access,
            false,
            Backing::Dmabuf { _fd: fd },
        );
        Ok(DmabufRegion {
            mr: MemoryRegion { inner },
            offset,
        })
    }
}

/// `EOPNOTSUPP` (also as `ENOTSUP`/`ENOSYS` from older providers) means
/// the device cannot register dmabufs at all: a typed refusal.
fn refusal(e: Error) -> Error {
    match e.raw_os_error() {
        Some(libc::EOPNOTSUPP | libc::ENOSYS) => Error::DeviceLacks {
            verb: "ibv_reg_dmabuf_mr",
            capability: "dmabuf registration (the provider or its kernel driver returned \
                         EOPNOTSUPP)",
        },
        _ => e,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eopnotsupp_is_a_typed_refusal_naming_the_verb() {
        let e = refusal(Error::Verb {
            verb: "ibv_reg_dmabuf_mr",
            io: std::io::Error::from_raw_os_error(libc::EOPNOTSUPP),
        });
        assert!(matches!(
            e,
            Error::DeviceLacks {
                verb: "ibv_reg_dmabuf_mr",
                ..
            }
        ));
        let e = refusal(Error::Verb {
            verb: "ibv_reg_dmabuf_mr",
            io: std::io::Error::from_raw_os_error(libc::EBADF),
        });
        assert_eq!(e.raw_os_error(), Some(libc::EBADF));
    }

    #[test]
    fn registration_checks_come_first() {
        let lw = super::super::AccessFlags::LOCAL_WRITE;
        assert!(matches!(
            ProtectionDomain::check_registration(lw, 0, None),
            Err(Error::EmptyRegistration)
        ));
        // `iova + len` must be a u64: the region's end, `RemoteMemory` and
        // joining pieces compute it. 2^64 - 16 + 16 = 2^64 is not one.
        for iova in [u64::MAX - 14, u64::MAX - 15] {
            assert!(matches!(
                ProtectionDomain::check_registration(lw, 16, Some(iova)),
                Err(Error::OutOfRange { max, .. }) if max == u64::MAX - 16
            ));
        }
        assert!(ProtectionDomain::check_registration(lw, 16, Some(u64::MAX - 16)).is_ok());
        assert!(matches!(
            ProtectionDomain::check_registration(super::super::AccessFlags::REMOTE_WRITE, 16, None),
            Err(Error::MissingAccess { .. })
        ));
    }
}
