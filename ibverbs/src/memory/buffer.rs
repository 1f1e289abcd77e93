//! Owned handles on registered memory: what work requests carry.
//!
//! * [`LocalBuffer`]: exclusive ownership of a range of a region no peer may
//!   write. Reads and writes as `&[u8]`/`&mut [u8]` while you hold it;
//!   posting it in a work request *moves* it there, and the completion hands
//!   it back. While it is posted no reference to it can exist.
//! * [`SharedBuffer`]: exclusive handle on a range of a region a peer may
//!   write (remote write / atomic). Never a plain slice: copies, volatile and
//!   atomic accessors only (or an `unsafe` view with its contract).
//! * [`FrozenBuffer`]: a read-only, cloneable view of a former
//!   [`LocalBuffer`]; the device only reads it, so it may be posted in many
//!   send/write requests at once (e.g. unsignaled sends) and read meanwhile.
//! * [`RemoteMemory`]: a peer's address range and key (plain data).

mod volatile;

use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use rdma_verbs_sys as sys;

use crate::error::{Error, Result, WireProblem};
use crate::memory::memory_region::{MemoryRegion, MrInner};

/// A remote key (`rkey`): lets a peer access a memory region.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RemoteKey(pub u32);

/// A peer's memory: address, length and remote key, as exchanged out of band.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RemoteMemory {
    /// Start address in the peer's address space (its `ibv_mr` addr).
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// The peer's remote key.
    pub rkey: RemoteKey,
}

impl RemoteMemory {
    /// A sub-range, `None` when out of bounds (or when its address would
    /// pass the end of the 64-bit address space: the value may come from
    /// an untrusted peer).
    pub fn slice(&self, offset: u64, len: u64) -> Option<RemoteMemory> {
        (offset.checked_add(len)? <= self.len).then_some(RemoteMemory {
            addr: self.addr.checked_add(offset)?,
            len,
            rkey: self.rkey,
        })
    }

    /// Bytes of the wire form ([`RemoteMemory::to_bytes`]).
    pub const WIRE_LEN: usize = 21;

    /// The wire form, for sending to the peer out of band: a version byte
    /// (1), then addr (8 bytes), len (8) and rkey (4), big-endian (framed
    /// as [`Endpoint::to_bytes`](crate::Endpoint::to_bytes), with the same
    /// version byte).
    pub fn to_bytes(&self) -> [u8; Self::WIRE_LEN] {
        let mut b = [0; Self::WIRE_LEN];
        b[0] = crate::wire::WIRE_VERSION;
        b[1..9].copy_from_slice(&self.addr.to_be_bytes());
        b[9..17].copy_from_slice(&self.len.to_be_bytes());
        b[17..].copy_from_slice(&self.rkey.0.to_be_bytes());
        b
    }

    /// Parses [`RemoteMemory::to_bytes`] from a peer, which is not
    /// trusted: whatever it accepts is a range that does not pass the end
    /// of the 64-bit address space, and
    /// [`to_bytes`](Self::to_bytes) writes it back byte for byte.
    ///
    /// # Errors
    /// [`Error::BadWireFormat`] with [`WireProblem::Version`] for a first
    /// byte other than 1, [`WireProblem::Length`] for a message that is
    /// not [`WIRE_LEN`](Self::WIRE_LEN) bytes long, and
    /// [`WireProblem::OutOfRange`] (field `len`) for a range that wraps.
    pub fn from_bytes(b: &[u8]) -> Result<RemoteMemory> {
        const WHAT: &str = "RemoteMemory";
        crate::wire::check_wire(WHAT, b, Self::WIRE_LEN)?;
        let mut be = [[0; 8]; 2];
        be[0].copy_from_slice(&b[1..9]);
        be[1].copy_from_slice(&b[9..17]);
        let (addr, len) = (u64::from_be_bytes(be[0]), u64::from_be_bytes(be[1]));
        if addr.checked_add(len).is_none() {
            return Err(Error::BadWireFormat {
                what: WHAT,
                problem: WireProblem::OutOfRange {
                    field: "len",
                    value: len,
                    max: u64::MAX - addr,
                },
            });
        }
        Ok(RemoteMemory {
            addr,
            len,
            rkey: RemoteKey(u32::from_be_bytes([b[17], b[18], b[19], b[20]])),
        })
    }
}

/// A range of a registered region, owned by exactly one handle.
pub(crate) struct Region {
    pub(crate) mr: Arc<MrInner>,
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the range is exclusively owned by its handle (or shared read-only
// by FrozenBuffer); MrInner is Send + Sync.
unsafe impl Send for Region {}
// SAFETY: as above; `&Region` allows only reads of plain data.
unsafe impl Sync for Region {}

impl Region {
    pub(crate) fn whole(mr: Arc<MrInner>) -> Region {
        let (ptr, len) = (mr.ptr, mr.len);
        Region { mr, ptr, len }
    }

    fn split_at(self, mid: usize) -> (Region, Region) {
        assert!(
            mid <= self.len,
            "split point {mid} beyond length {}",
            self.len
        );
        // SAFETY: `mid <= len`, so the pointer stays inside (or one past) the range.
        let tail = unsafe { NonNull::new_unchecked(self.ptr.as_ptr().add(mid)) };
        (
            Region {
                mr: self.mr.clone(),
                ptr: self.ptr,
                len: mid,
            },
            Region {
                mr: self.mr,
                ptr: tail,
                len: self.len - mid,
            },
        )
    }

    /// Whether `next` starts where `self` ends, in the same region.
    /// (Registration keeps `iova + len` within a u64, so the end exists;
    /// checked all the same, since a wrong `true` would join two handles.)
    fn precedes(&self, next: &Region) -> bool {
        Arc::ptr_eq(&self.mr, &next.mr)
            && self.addr().checked_add(self.len as u64) == Some(next.addr())
    }

    /// `[0, size)`, `[size, 2 size)`, … and the remainder (shorter than
    /// `size`, maybe empty), each exclusively owned.
    fn chunks_exact(self, size: usize) -> (Vec<Region>, Region) {
        assert!(size != 0, "chunk size must be non-zero");
        let mut chunks = Vec::with_capacity(self.len / size);
        let mut rest = self;
        while rest.len >= size {
            let (chunk, tail) = rest.split_at(size);
            chunks.push(chunk);
            rest = tail;
        }
        (chunks, rest)
    }

    /// The union of the regions `of(piece)` when each
    /// [`precedes`](Self::precedes) the next; `None` otherwise or when
    /// there are none. Sound only if the caller consumes the pieces: each
    /// was the only handle to its range, and the union is the only handle
    /// to them all.
    fn join<P>(pieces: &[P], of: impl Fn(&P) -> &Region) -> Option<Region> {
        let first = of(pieces.first()?);
        if !pieces.windows(2).all(|w| of(&w[0]).precedes(of(&w[1]))) {
            return None;
        }
        Some(Region {
            mr: first.mr.clone(),
            ptr: first.ptr,
            // Adjacent ranges of one registration: the sum is within it.
            len: pieces.iter().map(|p| of(p).len).sum(),
        })
    }

    fn unsplit(self, next: Region) -> std::result::Result<Region, (Region, Region)> {
        if self.precedes(&next) {
            Ok(Region {
                mr: self.mr,
                ptr: self.ptr,
                len: self.len + next.len,
            })
        } else {
            Err((self, next))
        }
    }

    /// Device address of the first byte: the process address shifted
    /// by the registration's IOVA (zero shift for a plain `ibv_reg_mr`).
    #[inline]
    pub(crate) fn addr(&self) -> u64 {
        (self.ptr.as_ptr() as u64).wrapping_add(self.mr.iova_delta)
    }

    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The SGE of a region whose length [`sge_length`] already accepted
    /// (posting validates every request before building any C request).
    #[inline]
    pub(crate) fn sge_prechecked(&self) -> sys::ibv_sge {
        debug_assert!(u32::try_from(self.len).is_ok());
        sys::ibv_sge {
            addr: self.addr(),
            length: self.len as u32,
            lkey: self.mr.lkey,
        }
    }
}

/// The `ibv_sge::length` for a buffer: refused, never truncated, past
/// `u32::MAX`.
pub(crate) fn sge_length(len: usize) -> Result<u32> {
    u32::try_from(len).map_err(|_| Error::OutOfRange {
        what: "scatter/gather entry length",
        value: len as u64,
        max: u32::MAX.into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sge_lengths_beyond_u32_are_refused_not_truncated() {
        assert_eq!(sge_length(0).unwrap(), 0);
        assert_eq!(sge_length(u32::MAX as usize).unwrap(), u32::MAX);
        for len in [1usize << 32, (1 << 32) + 4096, usize::MAX] {
            let e = sge_length(len).unwrap_err();
            assert!(
                matches!(e, Error::OutOfRange { value, max, .. }
                    if value == len as u64 && max == u64::from(u32::MAX)),
                "{e}"
            );
        }
    }

    #[test]
    fn remote_memory_slices_and_wire_form() {
        let m = RemoteMemory {
            addr: 0x1_0000_0000,
            len: 6 << 30,
            rkey: RemoteKey(7),
        };
        let s = m.slice(5 << 30, 1 << 30).unwrap();
        assert_eq!(s.addr, 0x1_0000_0000 + (5 << 30));
        assert!(m.slice(5 << 30, (1 << 30) + 1).is_none());
        assert!(m.slice(u64::MAX, 2).is_none());
        // A peer's nonsense (a range wrapping the address space) is refused,
        // never an overflow.
        let wild = RemoteMemory {
            addr: u64::MAX,
            len: u64::MAX,
            rkey: RemoteKey(!0),
        };
        assert!(wild.slice(1, 0).is_none());
        assert_eq!(wild.slice(0, 8).map(|s| s.addr), Some(u64::MAX));
        assert_eq!(RemoteMemory::from_bytes(&m.to_bytes()).unwrap(), m);
    }

    fn wire_problem(r: Result<RemoteMemory>) -> WireProblem {
        match r {
            Err(Error::BadWireFormat {
                what: "RemoteMemory",
                problem,
            }) => problem,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn remote_memory_wire_form_is_versioned_and_checked() {
        let m = RemoteMemory {
            addr: 0x0102_0304_0506_0708,
            len: 0x1000,
            rkey: RemoteKey(0xa1b2_c3d4),
        };
        let b = m.to_bytes();
        assert_eq!(
            b,
            [1, 1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0, 0, 0, 0, 0x10, 0, 0xa1, 0xb2, 0xc3, 0xd4]
        );
        assert_eq!(
            wire_problem(RemoteMemory::from_bytes(&b[..20])),
            WireProblem::Length {
                len: 20,
                expected: 21
            }
        );
        assert_eq!(
            wire_problem(RemoteMemory::from_bytes(&[])),
            WireProblem::Length {
                len: 0,
                expected: 21
            }
        );
        let mut longer = b.to_vec();
        longer.push(0);
        assert!(matches!(
            wire_problem(RemoteMemory::from_bytes(&longer)),
            WireProblem::Length { len: 22, .. }
        ));
        let mut v2 = b;
        v2[0] = 2;
        assert_eq!(
            wire_problem(RemoteMemory::from_bytes(&v2)),
            WireProblem::Version {
                version: 2,
                supported: 1
            }
        );
        // The last byte of the address space is a range; one more wraps.
        let top = RemoteMemory {
            addr: u64::MAX - 7,
            len: 7,
            rkey: RemoteKey(1),
        };
        assert_eq!(RemoteMemory::from_bytes(&top.to_bytes()).unwrap(), top);
        let wraps = RemoteMemory { len: 8, ..top };
        assert_eq!(
            wire_problem(RemoteMemory::from_bytes(&wraps.to_bytes())),
            WireProblem::OutOfRange {
                field: "len",
                value: 8,
                max: 7
            }
        );
    }
}

macro_rules! region_common {
    ($ty:ident) => {
        impl $ty {
            pub(crate) fn from_region(region: Region) -> Self {
                $ty { region }
            }
            #[inline]
            pub(crate) fn region(&self) -> &Region {
                &self.region
            }
            /// The region, mutably: for re-registration, which changes it
            /// only when this handle is its sole holder.
            pub(crate) fn region_mut(&mut self) -> &mut Region {
                &mut self.region
            }
            /// Length in bytes.
            #[inline]
            pub fn len(&self) -> usize {
                self.region.len
            }
            /// Whether the buffer is empty.
            #[inline]
            pub fn is_empty(&self) -> bool {
                self.region.len == 0
            }
            /// Device address of the first byte.
            #[inline]
            pub fn addr(&self) -> u64 {
                self.region.addr()
            }
            /// Local key of its region.
            #[inline]
            pub fn lkey(&self) -> u32 {
                self.region.mr.lkey
            }
            /// The memory region it belongs to (keys only).
            pub fn memory_region(&self) -> MemoryRegion {
                MemoryRegion {
                    inner: self.region.mr.clone(),
                }
            }
            /// Splits into `[0, mid)` and `[mid, len)`, each exclusively owned.
            ///
            /// # Panics
            /// When `mid > len` (like `slice::split_at`).
            pub fn split_at(self, mid: usize) -> (Self, Self) {
                let (a, b) = self.region.split_at(mid);
                ($ty { region: a }, $ty { region: b })
            }
            /// Joins two adjacent pieces of the same region (`self` first);
            /// gives both back when they are not adjacent.
            pub fn unsplit(self, next: Self) -> std::result::Result<Self, (Self, Self)> {
                match self.region.unsplit(next.region) {
                    Ok(r) => Ok($ty { region: r }),
                    Err((a, b)) => Err(($ty { region: a }, $ty { region: b })),
                }
            }
            /// Carves the buffer into buffers of `size` bytes — `[0, size)`,
            /// `[size, 2 size)`, … — each exclusively owned, to be posted
            /// independently (one registration, many requests). The bytes
            /// that do not make a whole chunk come back as the second
            /// value, shorter than `size` and empty when `size` divides the
            /// length; [`join`](Self::join) undoes it. Allocates the `Vec`;
            /// no system call.
            ///
            /// # Panics
            /// When `size` is 0 (like `slice::chunks_exact`).
            pub fn chunks_exact(self, size: usize) -> (Vec<Self>, Self) {
                let (chunks, rest) = self.region.chunks_exact(size);
                let chunks = chunks.into_iter().map(|region| $ty { region }).collect();
                (chunks, $ty { region: rest })
            }
            /// Joins `pieces`, each starting where the one before ends in
            /// the same registration (as [`chunks_exact`](Self::chunks_exact)
            /// and [`split_at`](Self::split_at) make them; a remainder may
            /// come last), into one buffer: [`unsplit`](Self::unsplit) for
            /// any number of pieces. Gives `pieces` back, untouched, when
            /// they are not in that order or there are none.
            pub fn join(pieces: Vec<Self>) -> std::result::Result<Self, Vec<Self>> {
                match Region::join(&pieces, |p| &p.region) {
                    // The pieces, now covered by `region`, are dropped.
                    Some(region) => Ok($ty { region }),
                    None => Err(pieces),
                }
            }
            pub(crate) fn truncate_to(&mut self, len: usize) {
                self.region.len = self.region.len.min(len);
            }
        }
    };
}

/// Exclusive ownership of registered memory that no peer may write.
///
/// Dereferences to `[u8]`. To use it in a work request, move it in; the
/// completion returns it (see `DESIGN.md` and [`crate::hazards`]).
pub struct LocalBuffer {
    region: Region,
}
region_common!(LocalBuffer);

impl Deref for LocalBuffer {
    type Target = [u8];
    #[inline]
    fn deref(&self) -> &[u8] {
        // SAFETY: this handle exclusively owns the range (posting moves it
        // away, so the device is not writing it now) and no peer may write
        // the region (register() refuses remote write/atomic rights).
        unsafe { std::slice::from_raw_parts(self.region.ptr.as_ptr(), self.region.len) }
    }
}

impl DerefMut for LocalBuffer {
    #[inline]
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`, and `&mut self` makes the access unique.
        unsafe { std::slice::from_raw_parts_mut(self.region.ptr.as_ptr(), self.region.len) }
    }
}

/// The error of a failed [`bytemuck`] cast of the `len` bytes at `addr`
/// to `[T]`: the address is not aligned for `T`, or the length is not a
/// whole number of `T` (a zero-sized `T` never is).
fn cast_error<T>(addr: *const u8, len: usize, e: bytemuck::PodCastError) -> Error {
    match e {
        bytemuck::PodCastError::TargetAlignmentGreaterAndInputNotAligned => Error::Misaligned {
            addr: addr as u64,
            align: std::mem::align_of::<T>() as u64,
        },
        _ => Error::LengthNotMultiple {
            len,
            size: std::mem::size_of::<T>(),
        },
    }
}

/// `bytes` as `[T]` (see [`LocalBuffer::as_slice_of`]).
fn view_of<T: bytemuck::Pod>(bytes: &[u8]) -> Result<&[T]> {
    bytemuck::try_cast_slice(bytes).map_err(|e| cast_error::<T>(bytes.as_ptr(), bytes.len(), e))
}

impl LocalBuffer {
    /// The bytes as a slice of `T`, a plain-old-data type (any bytes are a
    /// valid `T`: `u32`, `f32`, `[u64; 2]`, a `#[repr(C)]` struct deriving
    /// [`bytemuck::Pod`], …), in host byte order. No copy. The slice
    /// borrows the buffer, so it cannot live across posting it (see
    /// [`crate::hazards`]).
    ///
    /// # Errors
    /// [`Error::Misaligned`] when the buffer's address is not aligned for
    /// `T`; [`Error::LengthNotMultiple`] when its length is not a whole
    /// number of `T` (a zero-sized `T` views only an empty buffer).
    /// [`split_at`](Self::split_at) and
    /// [`chunks_exact`](Self::chunks_exact) at multiples of the size keep
    /// a page-aligned registration aligned.
    pub fn as_slice_of<T: bytemuck::Pod>(&self) -> Result<&[T]> {
        view_of(self)
    }

    /// The bytes as a mutable slice of `T` (see
    /// [`as_slice_of`](Self::as_slice_of)).
    ///
    /// # Errors
    /// As [`as_slice_of`](Self::as_slice_of).
    pub fn as_mut_slice_of<T: bytemuck::Pod>(&mut self) -> Result<&mut [T]> {
        let bytes: &mut [u8] = self;
        let (addr, len) = (bytes.as_ptr(), bytes.len());
        bytemuck::try_cast_slice_mut(bytes).map_err(|e| cast_error::<T>(addr, len, e))
    }

    /// Makes the buffer read-only and cloneable, so it can be posted in many
    /// send/RDMA-write requests at once.
    pub fn freeze(self) -> FrozenBuffer {
        FrozenBuffer {
            region: Arc::new(self.region),
        }
    }
}

impl std::fmt::Debug for LocalBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalBuffer")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len())
            .finish()
    }
}

/// A read-only, cloneable registered buffer (see [`LocalBuffer::freeze`]).
///
/// Only the device *reads* it (send, RDMA write source), so any number of
/// clones may be posted and read through `&[u8]` at the same time.
#[derive(Clone)]
pub struct FrozenBuffer {
    region: Arc<Region>,
}

impl FrozenBuffer {
    /// Length in bytes.
    #[inline]
    pub fn len(&self) -> usize {
        self.region.len
    }
    /// Whether it is empty.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.region.len == 0
    }
    /// Device address.
    #[inline]
    pub fn addr(&self) -> u64 {
        self.region.addr()
    }
    /// Local key.
    #[inline]
    pub fn lkey(&self) -> u32 {
        self.region.mr.lkey
    }
    #[inline]
    pub(crate) fn region(&self) -> &Region {
        &self.region
    }
    /// The bytes as a slice of `T` (see
    /// [`LocalBuffer::as_slice_of`]); the device only reads a frozen
    /// buffer, so the view may live while clones are posted.
    ///
    /// # Errors
    /// As [`LocalBuffer::as_slice_of`].
    pub fn as_slice_of<T: bytemuck::Pod>(&self) -> Result<&[T]> {
        view_of(self)
    }
    /// Gets the writable buffer back when no other clone exists — in
    /// particular when no posted work request still holds one.
    pub fn try_unfreeze(self) -> std::result::Result<LocalBuffer, FrozenBuffer> {
        Arc::try_unwrap(self.region)
            .map(|region| LocalBuffer { region })
            .map_err(|region| FrozenBuffer { region })
    }
}

impl Deref for FrozenBuffer {
    type Target = [u8];
    #[inline]
    fn deref(&self) -> &[u8] {
        // SAFETY: nothing writes a frozen range: no `&mut` exists (the
        // LocalBuffer was consumed), it may only be posted where the device
        // reads (send, RDMA write source), and no peer may write its region.
        unsafe { std::slice::from_raw_parts(self.region.ptr.as_ptr(), self.region.len) }
    }
}

impl std::fmt::Debug for FrozenBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FrozenBuffer")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len())
            .finish()
    }
}

/// Exclusive handle on registered memory that peers may write.
///
/// Never exposes `&[u8]`: a peer's RDMA write could change the bytes behind
/// a Rust reference. Use [`SharedBuffer::copy_to_slice`],
/// [`SharedBuffer::copy_from_slice`] (volatile copies),
/// [`SharedBuffer::atomic_u64`], or the `unsafe` [`SharedBuffer::as_slice`].
pub struct SharedBuffer {
    region: Region,
}
region_common!(SharedBuffer);

impl SharedBuffer {
    /// What a peer needs to access this range (`None` if the region has no
    /// remote rights).
    pub fn remote(&self) -> Option<RemoteMemory> {
        Some(RemoteMemory {
            addr: self.addr(),
            len: self.len() as u64,
            rkey: self.memory_region().rkey()?,
        })
    }

    #[inline]
    fn check(&self, offset: usize, len: usize) -> Result<*mut u8> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len() => {
                // SAFETY: `offset <= len`, inside the owned range.
                Ok(unsafe { self.region.ptr.as_ptr().add(offset) })
            }
            _ => Err(Error::OutOfBounds {
                offset: offset as u64,
                len: len as u64,
                size: self.len() as u64,
            }),
        }
    }

    /// Copies `dst.len()` bytes starting at `offset` out, with volatile
    /// reads (a peer may be writing concurrently; the copy is not atomic).
    ///
    /// # Errors
    /// [`Error::OutOfBounds`] when the range is out of bounds.
    #[inline]
    pub fn copy_to_slice(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        let src = self.check(offset, dst.len())?;
        // SAFETY: in bounds (checked); no reference to a shared buffer's
        // bytes exists (the device or a peer may write them at any time).
        unsafe { volatile::copy_out(src, dst) };
        Ok(())
    }

    /// Copies `src` in at `offset` with volatile writes.
    ///
    /// # Errors
    /// [`Error::OutOfBounds`] when the range is out of bounds.
    #[inline]
    pub fn copy_from_slice(&mut self, offset: usize, src: &[u8]) -> Result<()> {
        let dst = self.check(offset, src.len())?;
        // SAFETY: in bounds (checked); `&mut self` means no local work
        // request holds this range; no reference to it exists, as above.
        unsafe { volatile::copy_in(dst, src) };
        Ok(())
    }

    /// Copies the bytes at `offset` out into `dst`, a slice of
    /// plain-old-data `T` (see [`LocalBuffer::as_slice_of`]), in host byte
    /// order: [`copy_to_slice`](Self::copy_to_slice) into `dst`'s bytes,
    /// so `offset` needs no alignment and no reference to the buffer's
    /// bytes is made (a peer may be writing them; a `T` it is writing may
    /// come out torn).
    ///
    /// # Errors
    /// As [`copy_to_slice`](Self::copy_to_slice) when the range is out of
    /// bounds.
    pub fn read_into<T: bytemuck::Pod>(&self, offset: usize, dst: &mut [T]) -> Result<()> {
        // Never panics: any `[T]` is a whole number of bytes, aligned for u8.
        self.copy_to_slice(offset, bytemuck::cast_slice_mut(dst))
    }

    /// Copies `src`, a slice of plain-old-data `T`, in at `offset` (the
    /// counterpart of [`read_into`](Self::read_into), through
    /// [`copy_from_slice`](Self::copy_from_slice)).
    ///
    /// # Errors
    /// As [`read_into`](Self::read_into).
    pub fn write_from<T: bytemuck::Pod>(&mut self, offset: usize, src: &[T]) -> Result<()> {
        // Never panics, as in `read_into`.
        self.copy_from_slice(offset, bytemuck::cast_slice(src))
    }

    /// The 8 bytes at `offset` as an `AtomicU64` (what RDMA atomics operate
    /// on; a peer's CAS/FAA are atomic with respect to the CPU only when the
    /// device reports `AtomicCap::Glob`).
    ///
    /// # Errors
    /// [`Error::OutOfBounds`] unless the 8 bytes at `offset` are in bounds,
    /// [`Error::Misaligned`] unless their address is 8-byte aligned.
    pub fn atomic_u64(&self, offset: usize) -> Result<&AtomicU64> {
        let p = self.check(offset, 8)?;
        if p as usize % 8 != 0 {
            return Err(Error::Misaligned {
                addr: p as u64,
                align: 8,
            });
        }
        // SAFETY: in bounds, aligned, and AtomicU64 is an UnsafeCell, so
        // concurrent writes by the device do not violate aliasing rules.
        Ok(unsafe { &*(p as *const AtomicU64) })
    }

    /// A plain slice of the memory.
    ///
    /// # Safety
    /// The caller must ensure that, for as long as the slice lives:
    /// * no peer writes the range (e.g. the application protocol guarantees
    ///   that peers have finished and will not write until told to), and
    /// * no local work request writes it (it cannot: this handle is not posted).
    pub unsafe fn as_slice(&self) -> &[u8] {
        // SAFETY: forwarded to the caller's contract.
        unsafe { std::slice::from_raw_parts(self.region.ptr.as_ptr(), self.region.len) }
    }

    /// A mutable slice of the memory.
    ///
    /// # Safety
    /// As [`SharedBuffer::as_slice`]: no peer may read or write the range
    /// while the slice lives.
    pub unsafe fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: forwarded to the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.region.ptr.as_ptr(), self.region.len) }
    }

    /// Copies the whole buffer into a new `Vec`.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0; self.len()];
        self.copy_to_slice(0, &mut v).expect("in bounds");
        v
    }
}

impl std::fmt::Debug for SharedBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedBuffer")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len())
            .finish()
    }
}

/// Any owned buffer a work request can carry.
#[derive(Debug)]
#[non_exhaustive]
pub enum Buf {
    /// A [`LocalBuffer`].
    Local(LocalBuffer),
    /// A [`SharedBuffer`].
    Shared(SharedBuffer),
    /// A [`FrozenBuffer`] (only where the device reads).
    Frozen(FrozenBuffer),
}

impl Buf {
    #[inline]
    pub(crate) fn region(&self) -> &Region {
        match self {
            Buf::Local(b) => b.region(),
            Buf::Shared(b) => b.region(),
            Buf::Frozen(b) => b.region(),
        }
    }
    /// Length in bytes.
    #[inline]
    pub fn len(&self) -> usize {
        self.region().len
    }
    /// Whether it is empty.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The local buffer, if it is one.
    #[inline]
    pub fn into_local(self) -> Option<LocalBuffer> {
        match self {
            Buf::Local(b) => Some(b),
            _ => None,
        }
    }
    /// The shared buffer, if it is one.
    #[inline]
    pub fn into_shared(self) -> Option<SharedBuffer> {
        match self {
            Buf::Shared(b) => Some(b),
            _ => None,
        }
    }
    /// The frozen buffer, if it is one.
    #[inline]
    pub fn into_frozen(self) -> Option<FrozenBuffer> {
        match self {
            Buf::Frozen(b) => Some(b),
            _ => None,
        }
    }
    /// Copies `dst.len()` bytes from `offset` (volatile for shared memory).
    ///
    /// # Errors
    /// [`Error::OutOfBounds`] when out of bounds.
    #[inline]
    pub fn copy_to_slice(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        let bytes: &[u8] = match self {
            Buf::Local(b) => b,
            Buf::Frozen(b) => b,
            Buf::Shared(b) => return b.copy_to_slice(offset, dst),
        };
        let src = offset
            .checked_add(dst.len())
            .and_then(|end| bytes.get(offset..end))
            .ok_or(Error::OutOfBounds {
                offset: offset as u64,
                len: dst.len() as u64,
                size: bytes.len() as u64,
            })?;
        dst.copy_from_slice(src);
        Ok(())
    }
}

/// The buffers a work request owns until it completes.
#[derive(Debug, Default)]
pub enum SgList {
    /// No buffer (inline data, zero-length requests).
    #[default]
    Empty,
    /// One buffer.
    One(Buf),
    /// Several buffers (scatter/gather); the `Vec` comes back for reuse.
    Many(Vec<Buf>),
}

impl SgList {
    pub(crate) fn len(&self) -> usize {
        match self {
            SgList::Empty => 0,
            SgList::One(_) => 1,
            SgList::Many(v) => v.len(),
        }
    }
    pub(crate) fn iter(&self) -> impl Iterator<Item = &Buf> {
        let (one, many): (Option<&Buf>, &[Buf]) = match self {
            SgList::Empty => (None, &[]),
            SgList::One(b) => (Some(b), &[]),
            SgList::Many(v) => (None, v),
        };
        one.into_iter().chain(many.iter())
    }
    /// The buffer of a one-buffer list, if it is a
    /// [`LocalBuffer`](crate::LocalBuffer) (what a single-buffer request
    /// gives back on completion).
    #[inline]
    pub fn into_local(self) -> Option<crate::memory::buffer::LocalBuffer> {
        match self {
            SgList::One(b) => b.into_local(),
            _ => None,
        }
    }
    /// Total bytes.
    pub fn total_len(&self) -> u64 {
        self.iter().map(|b| b.len() as u64).sum()
    }
    /// Whether every buffer is a [`FrozenBuffer`](crate::memory::FrozenBuffer) (or
    /// there is none): such requests may be unsignaled.
    pub(crate) fn all_frozen(&self) -> bool {
        self.iter().all(|b| matches!(b, Buf::Frozen(_)))
    }
}

impl From<LocalBuffer> for Buf {
    fn from(b: LocalBuffer) -> Buf {
        Buf::Local(b)
    }
}
impl From<SharedBuffer> for Buf {
    fn from(b: SharedBuffer) -> Buf {
        Buf::Shared(b)
    }
}
impl From<FrozenBuffer> for Buf {
    fn from(b: FrozenBuffer) -> Buf {
        Buf::Frozen(b)
    }
}

pub(crate) mod sealed {
    pub trait Sealed {}
    impl Sealed for super::LocalBuffer {}
    impl Sealed for super::SharedBuffer {}
    impl Sealed for super::FrozenBuffer {}
}

/// Buffers the device may *write*: receive buffers, RDMA read and atomic
/// result buffers. Exclusive ones only ([`LocalBuffer`], [`SharedBuffer`]);
/// a [`FrozenBuffer`] is not, because clones of it may be read meanwhile.
pub trait DeviceWritable: Into<Buf> + sealed::Sealed {}
impl DeviceWritable for LocalBuffer {}
impl DeviceWritable for SharedBuffer {}

/// Buffers the device may *read*: send and RDMA write sources.
pub trait DeviceReadable: Into<Buf> + sealed::Sealed {}
impl DeviceReadable for LocalBuffer {}
impl DeviceReadable for SharedBuffer {}
impl DeviceReadable for FrozenBuffer {}
