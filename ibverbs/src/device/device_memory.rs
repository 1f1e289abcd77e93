//! Device memory (`ibv_alloc_dm`): memory on the adapter itself, reached
//! from the host only by copies (`ibv_memcpy_to_dm`/`ibv_memcpy_from_dm`).
//!
//! Only allocation and the two copies are offered. Registering device
//! memory as a region (`ibv_reg_dm_mr`) would let the device and peers
//! reach it through work requests, which needs a buffer type of its own
//! in the ownership model (DESIGN.md); it is not offered. So the only
//! ones touching this memory are the copies below, and no Rust reference
//! to it ever exists (the provider maps it; the copies are its code).

use std::ptr::NonNull;

use rdma_verbs_sys as sys;

use crate::device::context::Context;
use crate::error::{errno_error, ret_ptr, Error, Result};

/// An allocation of device memory (`struct ibv_dm`), freed on drop.
///
/// Not `Clone`: writing takes `&mut self`, so two writes (or a write and
/// a read) never overlap. Keeps its [`Context`] open.
///
/// # References
/// `ibv_alloc_dm(3)`
pub struct DeviceMemory {
    dm: NonNull<sys::ibv_dm>,
    len: usize,
    ctx: Context,
}

// SAFETY: libibverbs objects may be used from any thread; the copies are
// provider code on the provider's own mapping, serialised with writes by
// `&mut self`.
unsafe impl Send for DeviceMemory {}
// SAFETY: `&self` allows only `copy_to_slice`, a read of the device
// memory into the caller's slice; several at once read the same bytes.
unsafe impl Sync for DeviceMemory {}

impl Context {
    /// Allocates `len` bytes of device memory, aligned to `2^log_align`
    /// bytes on the device.
    ///
    /// The device's `max_dm_size` (extended attributes) is read first: a
    /// device without device memory (rxe: 0) is refused by name before
    /// the verb, and so is a length above it.
    ///
    /// # Errors
    /// * [`Error::DeviceLacks`] naming `ibv_alloc_dm` when `max_dm_size`
    ///   is 0.
    /// * [`Error::OutOfRange`] when `len` is 0 or exceeds `max_dm_size`.
    /// * [`Error::Verb`] naming `ibv_query_device_ex` or `ibv_alloc_dm`
    ///   (`ENOMEM` when the device's memory is used up, `EOPNOTSUPP`).
    ///
    /// # References
    /// `ibv_alloc_dm(3)`, `ibv_query_device_ex(3)`
    #[doc(alias = "ibv_alloc_dm")]
    pub fn alloc_dm(&self, len: usize, log_align: u32) -> Result<DeviceMemory> {
        let max = self.query_device_ex()?.max_dm_size();
        check_alloc(len, max)?;
        let mut attr = sys::ibv_alloc_dm_attr {
            length: len,
            log_align_req: log_align,
            comp_mask: 0,
        };
        // SAFETY: live context; `attr` valid for the call; the memory is
        // freed in Drop.
        let dm = unsafe { sys::ibv_alloc_dm(self.as_ptr(), &mut attr) };
        let dm = ret_ptr("ibv_alloc_dm", dm)?;
        Ok(DeviceMemory {
            dm,
            len,
            ctx: self.clone(),
        })
    }
}

/// The checks before `ibv_alloc_dm`: the device has device memory
/// (`max_dm_size` > 0) and `len` fits in it.
fn check_alloc(len: usize, max_dm_size: u64) -> Result<()> {
    if max_dm_size == 0 {
        return Err(Error::DeviceLacks {
            verb: "ibv_alloc_dm",
            capability: "device memory (max_dm_size is 0)",
        });
    }
    if len == 0 || len as u64 > max_dm_size {
        return Err(Error::OutOfRange {
            what: "device memory length",
            value: len as u64,
            max: max_dm_size,
        });
    }
    Ok(())
}

/// `offset..offset + len` lies within `size` bytes.
fn check_range(offset: u64, len: usize, size: usize) -> Result<()> {
    let fits = offset
        .checked_add(len as u64)
        .is_some_and(|end| end <= size as u64);
    if fits {
        Ok(())
    } else {
        Err(Error::OutOfBounds {
            offset,
            len: len as u64,
            size: size as u64,
        })
    }
}

impl DeviceMemory {
    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it is empty (never: allocation refuses 0 bytes).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Copies `src` into the device memory at `offset`.
    ///
    /// # Errors
    /// * [`Error::OutOfBounds`] when the range does not fit (checked
    ///   before the copy).
    /// * [`Error::Verb`] naming `ibv_memcpy_to_dm` (mlx5: `EINVAL` unless
    ///   `offset` and the length are multiples of 4).
    ///
    /// # References
    /// `ibv_memcpy_to_dm(3)` (in `ibv_alloc_dm(3)`)
    #[doc(alias = "ibv_memcpy_to_dm")]
    pub fn copy_from_slice(&mut self, offset: u64, src: &[u8]) -> Result<()> {
        check_range(offset, src.len(), self.len)?;
        // mlx5 copies in 4-byte words through `uint32_t *` host pointers:
        // an unaligned source goes through an aligned copy first.
        let bounce;
        let src_ptr = if (src.as_ptr() as usize) % 4 == 0 {
            src.as_ptr()
        } else {
            bounce = aligned_copy(src);
            bounce.as_ptr().cast::<u8>()
        };
        // SAFETY: live allocation; `src_ptr` is valid for reads of
        // `src.len()` bytes (the slice, or its aligned copy, alive until
        // the call returns); the range lies within the allocation.
        let rc =
            unsafe { sys::ibv_memcpy_to_dm(self.dm.as_ptr(), offset, src_ptr.cast(), src.len()) };
        if rc != 0 {
            return Err(errno_error("ibv_memcpy_to_dm", rc));
        }
        Ok(())
    }

    /// Copies device memory at `offset` into `dst`.
    ///
    /// # Errors
    /// * [`Error::OutOfBounds`] when the range does not fit (checked
    ///   before the copy).
    /// * [`Error::Verb`] naming `ibv_memcpy_from_dm` (mlx5: `EINVAL`
    ///   unless `offset` and the length are multiples of 4).
    ///
    /// # References
    /// `ibv_memcpy_from_dm(3)` (in `ibv_alloc_dm(3)`)
    #[doc(alias = "ibv_memcpy_from_dm")]
    pub fn copy_to_slice(&self, offset: u64, dst: &mut [u8]) -> Result<()> {
        check_range(offset, dst.len(), self.len)?;
        let aligned = (dst.as_ptr() as usize) % 4 == 0;
        let mut bounce = if aligned {
            Vec::new()
        } else {
            vec![0u32; dst.len().div_ceil(4)]
        };
        let dst_ptr = if aligned {
            dst.as_mut_ptr()
        } else {
            bounce.as_mut_ptr().cast::<u8>()
        };
        let (dm, len) = (self.dm.as_ptr(), dst.len());
        // SAFETY: live allocation; `dst_ptr` is valid for writes of
        // `dst.len()` bytes (the exclusive slice, or the aligned copy of
        // at least that size) and nothing else refers to it; the range
        // lies within the allocation.
        let rc = unsafe { sys::ibv_memcpy_from_dm(dst_ptr.cast(), dm, offset, len) };
        if rc != 0 {
            return Err(errno_error("ibv_memcpy_from_dm", rc));
        }
        if !aligned {
            dst.copy_from_slice(&bytemuck::cast_slice::<u32, u8>(&bounce)[..dst.len()]);
        }
        Ok(())
    }

    /// The context the memory belongs to.
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// The raw `ibv_dm` pointer, valid while `self` lives.
    pub fn as_ptr(&self) -> *mut sys::ibv_dm {
        self.dm.as_ptr()
    }
}

/// `src` copied into 4-byte-aligned storage (the tail zero-padded).
fn aligned_copy(src: &[u8]) -> Vec<u32> {
    let mut words = vec![0u32; src.len().div_ceil(4)];
    bytemuck::cast_slice_mut::<u32, u8>(&mut words)[..src.len()].copy_from_slice(src);
    words
}

impl Drop for DeviceMemory {
    fn drop(&mut self) {
        // SAFETY: sole owner; no region was registered over it (this
        // library offers none), so nothing else refers to it. A failure
        // leaves it allocated (a leak); Drop must not panic.
        unsafe { sys::ibv_free_dm(self.dm.as_ptr()) };
    }
}

impl std::fmt::Debug for DeviceMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceMemory")
            .field("len", &self.len)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_without_device_memory_is_refused_by_name() {
        match check_alloc(64, 0) {
            Err(Error::DeviceLacks { verb, capability }) => {
                assert_eq!(verb, "ibv_alloc_dm");
                assert!(capability.contains("max_dm_size"), "{capability}");
            }
            other => panic!("{other:?}"),
        }
        assert!(check_alloc(64, 64).is_ok());
        assert!(matches!(
            check_alloc(65, 64),
            Err(Error::OutOfRange {
                value: 65,
                max: 64,
                ..
            })
        ));
        assert!(matches!(
            check_alloc(0, 64),
            Err(Error::OutOfRange { value: 0, .. })
        ));
    }

    #[test]
    fn copies_stay_within_the_allocation() {
        assert!(check_range(0, 64, 64).is_ok());
        assert!(check_range(60, 4, 64).is_ok());
        assert!(check_range(64, 0, 64).is_ok());
        assert!(matches!(
            check_range(61, 4, 64),
            Err(Error::OutOfBounds {
                offset: 61,
                len: 4,
                size: 64
            })
        ));
        assert!(check_range(65, 0, 64).is_err());
        assert!(check_range(u64::MAX, 2, 64).is_err(), "no overflow");
    }

    #[test]
    fn an_unaligned_source_is_copied_whole() {
        let bytes = [1u8, 2, 3, 4, 5, 6, 7];
        let words = aligned_copy(&bytes[1..]);
        assert_eq!(words.len(), 2);
        assert_eq!(&bytemuck::cast_slice::<u32, u8>(&words)[..6], &bytes[1..]);
        assert_eq!(bytemuck::cast_slice::<u32, u8>(&words)[6..], [0, 0]);
    }
}
