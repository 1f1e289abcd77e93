//! Memory registration: access flags, owned storage, and the registered
//! region handle.
//!
//! Registration *consumes* the storage: from then on the memory is reachable
//! only through the buffer handles of [`crate::memory::buffer`], which is how the
//! crate guarantees that the device never touches freed, moved or aliased
//! memory.

use std::mem::ManuallyDrop;
use std::ptr::NonNull;
use std::sync::Arc;

use rdma_verbs_sys as sys;

use crate::error::{ret_ptr, Error, Result};
use crate::memory::buffer::{LocalBuffer, Region, RemoteKey, RemoteMemory, SharedBuffer};
use crate::memory::protection_domain::ProtectionDomain;
use crate::types::AccessFlags;

impl Default for AccessFlags {
    fn default() -> Self {
        AccessFlags::LOCAL_WRITE
    }
}

impl AccessFlags {
    /// Whether a peer may change the memory (remote write or atomic).
    pub fn remote_writable(self) -> bool {
        self.intersects(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC)
    }
}

/// How to register memory: the access rights and, optionally, the device
/// address (IOVA) of its first byte.
///
/// Every registration method takes `impl Into<RegisterOptions>`, so an
/// [`AccessFlags`] alone is the common case; add an IOVA with
/// [`RegisterOptions::iova`] (`ibv_reg_mr_iova2`).
///
/// # Example
/// ```no_run
/// # fn main() -> rdma_verbs::Result<()> {
/// use rdma_verbs::{AccessFlags, memory::RegisterOptions};
/// let ctx = rdma_verbs::open_device("rxe0")?;
/// let pd = ctx.alloc_pd()?;
/// let rights = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
/// // Peers address this memory as 0x1000_0000 .. 0x1000_1000.
/// let shared = pd.alloc_shared(4096, RegisterOptions::new(rights).iova(0x1000_0000))?;
/// assert_eq!(shared.remote().unwrap().addr, 0x1000_0000);
/// # Ok(()) }
/// ```
///
/// # References
/// `ibv_reg_mr(3)` (`ibv_reg_mr_iova2`)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RegisterOptions {
    access: AccessFlags,
    iova: Option<u64>,
}

impl RegisterOptions {
    /// Registration with `access` at the memory's own address.
    pub fn new(access: AccessFlags) -> Self {
        RegisterOptions { access, iova: None }
    }

    /// The device address of the first byte: local SGEs and peers'
    /// RDMA addresses name the memory as `iova .. iova + len` instead of
    /// its process address (`ibv_reg_mr_iova2`). For a dmabuf region
    /// ([`ProtectionDomain::register_dmabuf`]) it replaces the default
    /// (the offset).
    ///
    /// The kernel wants the IOVA to share the memory's offset within a
    /// page (page-aligned storage, such as [`AnonymousMemory`] or
    /// [`ProtectionDomain::alloc`], with a page-aligned IOVA): otherwise
    /// the registration fails with [`Error::Verb`] naming
    /// `ibv_reg_mr_iova2` (`EINVAL`). `iova + len` must be at most
    /// `u64::MAX` ([`Error::OutOfRange`]), so the region's end exists.
    #[doc(alias = "ibv_reg_mr_iova2")]
    pub fn iova(mut self, iova: u64) -> Self {
        self.iova = Some(iova);
        self
    }

    /// The access rights.
    pub fn access(&self) -> AccessFlags {
        self.access
    }

    /// The chosen IOVA, if any.
    pub fn chosen_iova(&self) -> Option<u64> {
        self.iova
    }
}

impl From<AccessFlags> for RegisterOptions {
    fn from(access: AccessFlags) -> Self {
        RegisterOptions::new(access)
    }
}

/// Memory that can be registered: it stays at one address for as long as the
/// value lives (even when the value is moved) and is only reached through it.
///
/// # Safety
/// Implementors guarantee that `as_mut_ptr()` returns a pointer valid for
/// reads and writes of `len()` bytes that does not change while the value
/// lives, and that dropping the value is the only thing that frees it.
pub unsafe trait Storage: Send + Sync + 'static {
    /// Start of the memory.
    fn as_mut_ptr(&mut self) -> *mut u8;
    /// Its length in bytes.
    fn len(&self) -> usize;
    /// Whether it is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Whether huge pages back it (reported by [`MemoryRegion::is_huge`]).
    fn is_huge(&self) -> bool {
        false
    }
}

// SAFETY: a Vec's heap buffer does not move when the Vec is moved, and the
// crate never grows it after registration (it is only held, never touched).
unsafe impl Storage for Vec<u8> {
    fn as_mut_ptr(&mut self) -> *mut u8 {
        self.as_mut_slice().as_mut_ptr()
    }
    fn len(&self) -> usize {
        Vec::len(self)
    }
}

// SAFETY: a boxed slice's heap memory is fixed for its lifetime.
unsafe impl Storage for Box<[u8]> {
    fn as_mut_ptr(&mut self) -> *mut u8 {
        (**self).as_mut_ptr()
    }
    fn len(&self) -> usize {
        (**self).len()
    }
}

// SAFETY: a mapping stays at its address until it is unmapped on drop.
unsafe impl Storage for memmap2::MmapMut {
    fn as_mut_ptr(&mut self) -> *mut u8 {
        std::ops::DerefMut::deref_mut(self).as_mut_ptr()
    }
    fn len(&self) -> usize {
        std::ops::Deref::deref(self).len()
    }
}

/// Page-aligned anonymous memory, optionally backed by huge pages.
pub struct AnonymousMemory {
    map: memmap2::MmapMut,
    huge: bool,
}

impl AnonymousMemory {
    /// Maps `len` zeroed bytes, page-aligned.
    ///
    /// # Errors
    /// [`Error::Verb`] naming `mmap`.
    pub fn new(len: usize) -> Result<Self> {
        let map = memmap2::MmapOptions::new()
            .len(len.max(1))
            .map_anon()
            .map_err(|io| Error::Verb { verb: "mmap", io })?;
        Ok(AnonymousMemory { map, huge: false })
    }

    /// Maps `len` bytes backed by huge pages when the system has them
    /// reserved (`/proc/sys/vm/nr_hugepages`); otherwise falls back to
    /// normal pages. [`AnonymousMemory::is_huge`] says which happened.
    ///
    /// # Errors
    /// [`Error::OutOfRange`] when `len` rounded up to whole 2 MiB pages
    /// does not fit a `usize`; [`Error::Verb`] naming `mmap` when even the
    /// fallback fails.
    pub fn huge_or_normal(len: usize) -> Result<Self> {
        const HUGE: usize = 2 << 20;
        let huge_len = len
            .max(1)
            .checked_next_multiple_of(HUGE)
            .ok_or(Error::OutOfRange {
                what: "huge-page memory length (rounded up to 2 MiB pages)",
                value: len as u64,
                max: (usize::MAX - usize::MAX % HUGE) as u64,
            })?;
        match memmap2::MmapOptions::new()
            .len(huge_len)
            .huge(None)
            .map_anon()
        {
            Ok(map) => Ok(AnonymousMemory { map, huge: true }),
            Err(_) => Self::new(len),
        }
    }

    /// Whether huge pages back the memory.
    pub fn is_huge(&self) -> bool {
        self.huge
    }
}

// SAFETY: see `MmapMut`.
unsafe impl Storage for AnonymousMemory {
    fn as_mut_ptr(&mut self) -> *mut u8 {
        self.map.as_mut_ptr()
    }
    fn len(&self) -> usize {
        self.map.len()
    }
    fn is_huge(&self) -> bool {
        self.huge
    }
}

/// What a registration keeps alive until `ibv_dereg_mr` succeeds.
pub(crate) enum Backing {
    /// Process memory, reached through the buffer handles (held only to
    /// be dropped after deregistration).
    Memory { _storage: Box<dyn Storage> },
    /// A dmabuf the device reaches by fd; never handed out as bytes
    /// (DESIGN.md, "dmabuf regions and chosen IOVAs"); closed on drop.
    Dmabuf { _fd: std::os::fd::OwnedFd },
}

pub(crate) struct MrInner {
    pub(crate) mr: NonNull<sys::ibv_mr>,
    pub(crate) pd: ProtectionDomain,
    /// Start of the process memory. Dangling for a dmabuf region, which
    /// never builds a [`Region`] (the only reader of `ptr`).
    pub(crate) ptr: NonNull<u8>,
    pub(crate) len: usize,
    pub(crate) access: AccessFlags,
    pub(crate) lkey: u32,
    pub(crate) rkey: u32,
    /// The device address of the first byte (`ibv_mr.addr`): `ptr` unless
    /// registered at a chosen IOVA. SGEs and remote addresses use it.
    pub(crate) iova: u64,
    /// `iova - ptr` (wrapping): a byte at `p` has device address
    /// `p + iova_delta`; one add on the data path.
    pub(crate) iova_delta: u64,
    huge: bool,
    /// Freed in `Drop::drop` only after `ibv_dereg_mr` succeeded.
    backing: ManuallyDrop<Backing>,
}

// SAFETY: the MR is only passed to thread-safe verbs; the storage is Send +
// Sync and reached only through buffer handles that enforce exclusivity.
unsafe impl Send for MrInner {}
// SAFETY: as above.
unsafe impl Sync for MrInner {}

impl Drop for MrInner {
    fn drop(&mut self) {
        // SAFETY: last reference: buffers, posted requests and every memory
        // window that may reach the region hold the Arc.
        let rc = unsafe { sys::ibv_dereg_mr(self.mr.as_ptr()) };
        if rc == 0 {
            // SAFETY: the registration is gone, so the device can no longer
            // reach the storage (or the dmabuf, whose fd closes here);
            // dropped once, never used again.
            unsafe { ManuallyDrop::drop(&mut self.backing) };
        } else {
            // The registration lives on (rxe refuses to deregister a region
            // a window is still bound to, whatever the reason), and with it
            // a key a peer may use: never free or reuse the pages. The
            // storage and the PD the registration needs are leaked.
            std::mem::forget(self.pd.clone());
        }
    }
}

/// A registered memory region (`struct ibv_mr`): keys and addresses only.
///
/// The memory itself is reached through the buffer that registration
/// returned ([`LocalBuffer`] or [`SharedBuffer`]). This handle is cheap to
/// clone and keeps the registration alive.
///
/// # References
/// `ibv_reg_mr(3)`
#[derive(Clone)]
pub struct MemoryRegion {
    pub(crate) inner: Arc<MrInner>,
}

impl MemoryRegion {
    /// Local key (`lkey`).
    pub fn lkey(&self) -> u32 {
        self.inner.lkey
    }
    /// Remote key, when the region allows any remote access.
    pub fn rkey(&self) -> Option<RemoteKey> {
        self.inner
            .access
            .intersects(
                AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC,
            )
            .then_some(RemoteKey(self.inner.rkey))
    }
    /// Device address of the region's first byte (`ibv_mr.addr`): the
    /// memory's address, or the IOVA chosen with
    /// [`RegisterOptions::iova`] (or a dmabuf region's IOVA). Local SGEs
    /// and peers' remote addresses are in this address space.
    pub fn addr(&self) -> u64 {
        self.inner.iova
    }
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.inner.len
    }
    /// Whether the region is empty.
    pub fn is_empty(&self) -> bool {
        self.inner.len == 0
    }
    /// Access rights it was registered with.
    pub fn access(&self) -> AccessFlags {
        self.inner.access
    }
    /// Whether huge pages back the memory.
    pub fn is_huge(&self) -> bool {
        self.inner.huge
    }
    /// The protection domain.
    pub fn pd(&self) -> &ProtectionDomain {
        &self.inner.pd
    }
    /// What a peer needs to access the whole region (send it out of band).
    /// `None` without remote access rights.
    pub fn remote(&self) -> Option<RemoteMemory> {
        Some(RemoteMemory {
            addr: self.addr(),
            len: self.len() as u64,
            rkey: self.rkey()?,
        })
    }
    /// The raw MR pointer, valid while `self` lives.
    pub fn as_ptr(&self) -> *mut sys::ibv_mr {
        self.inner.mr.as_ptr()
    }
}

impl std::fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len())
            .field("lkey", &format_args!("{:#x}", self.lkey()))
            .field("access", &self.access())
            .finish()
    }
}

/// For `ibv_reg_mr` failing with `ENOMEM` or `EPERM`: registration pins
/// the pages, and the kernel refuses to pin more than `RLIMIT_MEMLOCK`
/// (`ulimit -l`) unless the process has `CAP_IPC_LOCK`. Names the limit.
fn memlock_hint(err: &Error, len: usize) -> Option<String> {
    if !matches!(err.raw_os_error(), Some(libc::ENOMEM | libc::EPERM)) {
        return None;
    }
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) } != 0 {
        return None;
    }
    if lim.rlim_cur == libc::RLIM_INFINITY {
        return None;
    }
    let show = |v: libc::rlim_t| {
        if v == libc::RLIM_INFINITY {
            "unlimited".to_string()
        } else {
            format!("{v} bytes")
        }
    };
    Some(format!(
        "registering {len} bytes pins them, and RLIMIT_MEMLOCK (`ulimit -l`) allows \
         {} (hard limit {}) for all of this process's registrations: raise it \
         (`ulimit -l`, limits.conf, systemd LimitMEMLOCK=) or grant CAP_IPC_LOCK",
        show(lim.rlim_cur),
        show(lim.rlim_max)
    ))
}

impl ProtectionDomain {
    /// The checks every registration makes before calling the verb.
    pub(crate) fn check_registration(
        access: AccessFlags,
        len: usize,
        iova: Option<u64>,
    ) -> Result<()> {
        if access.remote_writable() && !access.contains(AccessFlags::LOCAL_WRITE) {
            return Err(Error::MissingAccess {
                what: "memory with REMOTE_WRITE or REMOTE_ATOMIC (ibv_reg_mr(3))",
                needed: AccessFlags::LOCAL_WRITE,
            });
        }
        if len == 0 {
            return Err(Error::EmptyRegistration);
        }
        for (flag, name) in [
            (AccessFlags::FLUSH_GLOBAL, "IBV_ACCESS_FLUSH_GLOBAL"),
            (AccessFlags::FLUSH_PERSISTENT, "IBV_ACCESS_FLUSH_PERSISTENT"),
        ] {
            if access.contains(flag) {
                crate::error::require_release(name, sys::FLUSH_RELEASE)?;
            }
        }
        if let Some(iova) = iova {
            // `iova + len` must be a u64: the region's end is computed
            // (`RemoteMemory::from_bytes` checks it, joining pieces adds
            // it), so its last byte may be at most `u64::MAX - 1`.
            let max = u64::MAX - len as u64;
            if iova > max {
                return Err(Error::OutOfRange {
                    what: "iova (iova + length must not pass 2^64 - 1)",
                    value: iova,
                    max,
                });
            }
        }
        Ok(())
    }

    /// Builds the handle of a registration that succeeded.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn mr_inner(
        &self,
        mr: NonNull<sys::ibv_mr>,
        ptr: NonNull<u8>,
        len: usize,
        iova: u64,
        access: AccessFlags,
        huge: bool,
        backing: Backing,
    ) -> Arc<MrInner> {
        // SAFETY: the MR is valid; its keys are immutable. (Its `addr` is
        // the process address even after ibv_reg_mr_iova2, hence `iova`.)
        let (lkey, rkey) = unsafe { ((*mr.as_ptr()).lkey, (*mr.as_ptr()).rkey) };
        Arc::new(MrInner {
            mr,
            pd: self.clone(),
            ptr,
            len,
            access,
            lkey,
            rkey,
            iova,
            iova_delta: iova.wrapping_sub(ptr.as_ptr() as u64),
            huge,
            backing: ManuallyDrop::new(backing),
        })
    }

    fn reg_mr(
        &self,
        mut storage: Box<dyn Storage>,
        options: RegisterOptions,
    ) -> Result<Arc<MrInner>> {
        let RegisterOptions { access, iova } = options;
        let len = storage.len();
        let verb = if iova.is_some() {
            "ibv_reg_mr_iova2"
        } else {
            "ibv_reg_mr"
        };
        Self::check_registration(access, len, iova)?;
        if access.contains(AccessFlags::ON_DEMAND) {
            self.check_odp(odp::OdpGeneralCaps::SUPPORT, verb)?;
        }
        let huge = storage.is_huge();
        let ptr = NonNull::new(storage.as_mut_ptr()).ok_or(Error::NullStorage)?;
        // SAFETY: live PD; `[ptr, ptr+len)` is owned by `storage`, kept alive
        // (and unmoved) by the returned MrInner until after deregistration.
        // The IOVA only names the bytes for the device.
        let mr = unsafe {
            match iova {
                None => sys::ibv_reg_mr(
                    self.as_ptr(),
                    ptr.as_ptr().cast(),
                    len,
                    access.bits() as i32,
                ),
                Some(iova) => sys::ibv_reg_mr_iova2(
                    self.as_ptr(),
                    ptr.as_ptr().cast(),
                    len,
                    iova,
                    access.bits(),
                ),
            }
        };
        let mr = ret_ptr(verb, mr).map_err(|e| {
            let hint = memlock_hint(&e, len);
            e.with_hint(hint)
        })?;
        let iova = iova.unwrap_or(ptr.as_ptr() as u64);
        Ok(self.mr_inner(
            mr,
            ptr,
            len,
            iova,
            access,
            huge,
            Backing::Memory { _storage: storage },
        ))
    }

    /// Registers `storage` for local use and returns exclusive ownership of
    /// its memory as a [`LocalBuffer`].
    ///
    /// `access` may include `REMOTE_READ` but not `REMOTE_WRITE` or
    /// `REMOTE_ATOMIC`: memory a peer may change is never handed out as a
    /// slice; use [`ProtectionDomain::register_shared`] for it.
    ///
    /// # Errors
    /// [`Error::NeedsSharedBuffer`] for remote write/atomic rights,
    /// [`Error::DeviceLacks`] naming the verb for
    /// [`AccessFlags::ON_DEMAND`] on a device without on-demand paging
    /// (`odp_caps`, checked before the verb),
    /// [`Error::EmptyRegistration`] for empty storage,
    /// [`Error::NullStorage`] for storage without an address;
    /// [`Error::OutOfRange`] for an IOVA where `iova + len` wraps;
    /// [`Error::Verb`] naming `ibv_reg_mr` (`ibv_reg_mr_iova2` with an
    /// IOVA; `ENOMEM` past `RLIMIT_MEMLOCK`, whose value the message then
    /// names; `EINVAL` for an IOVA whose offset within a page differs from
    /// the memory's).
    ///
    /// # References
    /// `ibv_reg_mr(3)` (`ibv_reg_mr_iova2` with [`RegisterOptions::iova`])
    ///
    /// # Example
    /// ```no_run
    /// # fn main() -> rdma_verbs::Result<()> {
    /// let ctx = rdma_verbs::open_device("rxe0")?;
    /// let pd = ctx.alloc_pd()?;
    /// let mut buf = pd.register(vec![0u8; 4096], rdma_verbs::AccessFlags::LOCAL_WRITE)?;
    /// buf[..5].copy_from_slice(b"hello");
    /// # Ok(()) }
    /// ```
    #[doc(alias = "ibv_reg_mr", alias = "ibv_reg_mr_iova2")]
    pub fn register<S: Storage>(
        &self,
        storage: S,
        options: impl Into<RegisterOptions>,
    ) -> Result<LocalBuffer> {
        let options = options.into();
        if options.access.remote_writable() {
            return Err(Error::NeedsSharedBuffer {
                what: "REMOTE_WRITE or REMOTE_ATOMIC access",
            });
        }
        let mr = self.reg_mr(Box::new(storage), options)?;
        Ok(LocalBuffer::from_region(Region::whole(mr)))
    }

    /// Registers `storage` for access by peers (any `access`), returning a
    /// [`SharedBuffer`]: memory that is read and written only by copies,
    /// volatile or atomic accessors, never through `&[u8]`.
    ///
    /// # Errors
    /// [`Error::MissingAccess`] for remote write/atomic without
    /// `LOCAL_WRITE`, [`Error::EmptyRegistration`] for empty storage,
    /// [`Error::NullStorage`] for storage without an address;
    /// [`Error::Verb`] naming `ibv_reg_mr`
    /// (as [`ProtectionDomain::register`]).
    ///
    /// # References
    /// `ibv_reg_mr(3)`
    #[doc(alias = "ibv_reg_mr", alias = "ibv_reg_mr_iova2")]
    pub fn register_shared<S: Storage>(
        &self,
        storage: S,
        options: impl Into<RegisterOptions>,
    ) -> Result<SharedBuffer> {
        let mr = self.reg_mr(Box::new(storage), options.into())?;
        Ok(SharedBuffer::from_region(Region::whole(mr)))
    }

    /// Allocates `len` zeroed, page-aligned bytes and registers them for
    /// local use.
    ///
    /// # Errors
    /// As [`ProtectionDomain::register`] and [`AnonymousMemory::new`].
    pub fn alloc(&self, len: usize, options: impl Into<RegisterOptions>) -> Result<LocalBuffer> {
        let mem = AnonymousMemory::new(len)?;
        let mut buf = self.register(mem, options)?;
        buf.truncate_to(len);
        Ok(buf)
    }

    /// Like [`ProtectionDomain::alloc`], for memory peers may access.
    ///
    /// # Errors
    /// As [`ProtectionDomain::register_shared`].
    pub fn alloc_shared(
        &self,
        len: usize,
        options: impl Into<RegisterOptions>,
    ) -> Result<SharedBuffer> {
        let mem = AnonymousMemory::new(len)?;
        let mut buf = self.register_shared(mem, options)?;
        buf.truncate_to(len);
        Ok(buf)
    }

    /// Allocates `len` bytes on huge pages when available (else normal
    /// pages; see [`MemoryRegion::is_huge`]) and registers them.
    ///
    /// # Errors
    /// As [`AnonymousMemory::huge_or_normal`] and
    /// [`ProtectionDomain::register`].
    pub fn alloc_huge(
        &self,
        len: usize,
        options: impl Into<RegisterOptions>,
    ) -> Result<LocalBuffer> {
        let mem = AnonymousMemory::huge_or_normal(len)?;
        let mut buf = self.register(mem, options)?;
        buf.truncate_to(len);
        Ok(buf)
    }
}

mod dmabuf;
mod odp;
mod rereg;
pub use dmabuf::DmabufRegion;
pub use odp::{Advice, ImplicitOdpRegion, OdpCaps, OdpGeneralCaps, OdpTransportCaps};
