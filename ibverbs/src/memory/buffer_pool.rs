//! A pool of equal registered buffers: one registration, many requests.
//!
//! [`ProtectionDomain::alloc_pool`] registers `count × size` bytes once
//! and hands them out as `size`-byte [`LocalBuffer`]s: [`BufferPool::get`]
//! wraps one in a [`PooledBuffer`], whose drop gives it back; posting it
//! turns it into the plain [`LocalBuffer`] a work request carries (nothing
//! new on the data path), and [`BufferPool::put`] takes that buffer back
//! from the completion after checking it is one of the pool's slots.
//! Who frees what is in `DESIGN.md` ("Runtime blocks: buffer pool").

use std::mem::ManuallyDrop;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::error::{Error, Result};
use crate::memory::buffer::{Buf, LocalBuffer};
use crate::memory::buffer::{DeviceReadable, DeviceWritable};
use crate::memory::memory_region::MemoryRegion;
use crate::memory::memory_region::Storage;
use crate::memory::protection_domain::ProtectionDomain;
use crate::types::AccessFlags;

/// What a pool shares with its handles and its buffers out of the pool.
struct PoolShared {
    /// The free slots: whole slots of `mr` (checked by [`slot_index`] on
    /// the way in), each the only handle to its range, so no two are the
    /// same and there are never more than `count`: the `Vec` was
    /// allocated with room for all of them and never grows (no allocation
    /// in `get`/`put`).
    ///
    /// A mutex, not a lock-free stack: the critical section is one
    /// `Vec::pop`/`push`, and parking_lot's uncontended lock and unlock are
    /// one compare-and-swap each (inline), against a Treiber stack's one;
    /// but a Treiber stack of slot indices needs a tag against ABA, and a
    /// tag that wraps while a thread is descheduled between its load and
    /// its compare-and-swap would hand one slot to two owners: two
    /// `&mut [u8]` to the same bytes, unsound, where the mutex is only
    /// slower under contention.
    free: Mutex<Vec<LocalBuffer>>,
    mr: MemoryRegion,
    /// Address of slot 0.
    base: u64,
    size: usize,
    count: usize,
}

impl PoolShared {
    /// `buf` back into the free list if it is a whole slot of this pool;
    /// otherwise the error and the buffer, untouched.
    #[inline]
    fn give_back(&self, buf: LocalBuffer) -> std::result::Result<(), (Error, LocalBuffer)> {
        let same = Arc::ptr_eq(&buf.region().mr, &self.mr.inner);
        if !same || slot_index(self.base, self.size, self.count, buf.addr(), buf.len()).is_none() {
            let error = Error::NotPoolSlot {
                addr: buf.addr(),
                len: buf.len(),
                size: self.size,
                same_registration: same,
            };
            return Err((error, buf));
        }
        let mut free = self.free.lock();
        // Never false (see `free`); if it were, the buffer is dropped
        // rather than the Vec grown: still no allocation, and dropping a
        // buffer frees nothing (the registration outlives it).
        if free.len() < free.capacity() {
            free.push(buf);
        }
        Ok(())
    }
}

/// The slot of a buffer at `addr`, `len` bytes long, in a pool of `count`
/// slots of `size` bytes from `base`: `None` unless it covers exactly one
/// whole slot.
#[inline]
fn slot_index(base: u64, size: usize, count: usize, addr: u64, len: usize) -> Option<usize> {
    let offset = usize::try_from(addr.checked_sub(base)?).ok()?;
    let index = offset / size;
    (len == size && offset % size == 0 && index < count).then_some(index)
}

/// A pool of `count` registered buffers of `size` bytes each, carved from
/// one registration (see [`ProtectionDomain::alloc_pool`]).
///
/// Cheap to clone (an `Arc`); `Send` and `Sync`: any thread may
/// [`get`](Self::get) and [`put`](Self::put), and a [`PooledBuffer`]
/// dropped on any thread goes back. Neither allocates nor makes a system
/// call; they take the pool's mutex for one `Vec` push or pop.
///
/// Every buffer of the pool keeps the registration alive: the memory is
/// deregistered and freed only once the pool's handles and every one of
/// its buffers — free, in use, posted, or in a completion — are gone.
///
/// A slot comes back to the pool when its [`PooledBuffer`] is dropped or
/// its [`LocalBuffer`] is [`put`](Self::put); a [`LocalBuffer`] of the
/// pool that is dropped instead (a completion dropped without
/// [`take_local`](crate::Completion::take_local), a queue pair destroyed
/// with it posted) is lost to the pool: its bytes stay allocated with the
/// registration and [`get`](Self::get) never hands them out again. Take
/// every pooled buffer back from its completion, error completions
/// included.
///
/// Remote access: `access` may include [`AccessFlags::REMOTE_READ`] (one
/// key then lets a peer read *every* slot, whoever uses it) but not remote
/// write or atomic rights ([`Error::NeedsSharedBuffer`]): the pool hands
/// out `&mut [u8]`, and one key for the whole registration would let a
/// peer write a slot another user holds. Remote-writable memory is a
/// [`SharedBuffer`](crate::SharedBuffer) of its own (or a memory window
/// per slot).
///
/// # Example
/// ```no_run
/// # use rdma_verbs::*;
/// # fn f(pd: &ProtectionDomain, qp: &QueuePair, cq: &CompletionQueue, remote: RemoteMemory) -> Result<()> {
/// let pool = pd.alloc_pool(64, 4096, AccessFlags::LOCAL_WRITE).build()?;
/// let mut buf = pool.get().expect("64 free buffers");
/// buf[..5].copy_from_slice(b"hello");
/// let mut sq = qp.send_queue()?;
/// sq.write(buf, remote, Wr::id(1))?; // the QP owns it now
/// let mut done = Completions::with_capacity(16);
/// loop {
///     if let Some(mut c) = cq.poll(&mut done)?.next() {
///         pool.put(c.take_local().unwrap())?; // back in the pool, whatever the status
///         c.result()?;
///         break;
///     }
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct BufferPool {
    shared: Arc<PoolShared>,
}

impl BufferPool {
    /// A free buffer, `None` when all [`count`](Self::count) are in use
    /// (poll completions and [`put`](Self::put) their buffers back). The
    /// buffer holds the bytes its last user left (zeros at first).
    #[inline]
    pub fn get(&self) -> Option<PooledBuffer> {
        let buf = self.shared.free.lock().pop()?;
        Some(PooledBuffer {
            buf: ManuallyDrop::new(buf),
            pool: ManuallyDrop::new(self.shared.clone()),
        })
    }

    /// Gives `buf` back to the pool: a buffer that a completion (or a
    /// refused post, or [`PooledBuffer::into_local`]) handed back as a
    /// [`LocalBuffer`].
    ///
    /// # Errors
    /// [`Error::NotPoolSlot`] when `buf` is not exactly one slot of this
    /// pool: another registration (another pool's buffer, `pd.alloc`'s), a
    /// piece of a slot, or slots joined together (join or split them back
    /// into whole slots first). The buffer comes back in the
    /// [`PutError`]; the pool is unchanged.
    #[inline]
    pub fn put(&self, buf: LocalBuffer) -> std::result::Result<(), PutError> {
        self.shared
            .give_back(buf)
            .map_err(|(error, buffer)| PutError { error, buffer })
    }

    /// How many buffers are free now (a snapshot: other threads may
    /// change it at once).
    pub fn available(&self) -> usize {
        self.shared.free.lock().len()
    }

    /// How many buffers the pool has.
    pub fn count(&self) -> usize {
        self.shared.count
    }

    /// The length of each buffer.
    pub fn size(&self) -> usize {
        self.shared.size
    }

    /// The registration the buffers share (keys only).
    pub fn memory_region(&self) -> &MemoryRegion {
        &self.shared.mr
    }
}

impl std::fmt::Debug for BufferPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BufferPool")
            .field("count", &self.count())
            .field("size", &self.size())
            .field("addr", &format_args!("{:#x}", self.shared.base))
            .field("huge", &self.shared.mr.is_huge())
            .finish()
    }
}

/// [`BufferPool::put`] refused a buffer: the error, and the buffer back.
#[derive(Debug)]
pub struct PutError {
    /// Why ([`Error::NotPoolSlot`]).
    pub error: Error,
    /// The buffer, untouched.
    pub buffer: LocalBuffer,
}

impl std::fmt::Display for PutError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.error, f)
    }
}

impl std::error::Error for PutError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        std::error::Error::source(&self.error)
    }
}

impl From<PutError> for Error {
    /// The error; the buffer is dropped (lost to the pool, not freed
    /// before its registration).
    fn from(e: PutError) -> Error {
        e.error
    }
}

/// A buffer of a [`BufferPool`], back in the pool when dropped.
///
/// Dereferences to its [`LocalBuffer`] (and through it to `[u8]`).
/// Posting it (`SendRequest::write(buf, remote)`, `RecvRequest::new(buf)`,
/// any request taking a [`DeviceReadable`] or [`DeviceWritable`]) moves
/// the plain [`LocalBuffer`] into the request: the queue pair owns it, not
/// the pool, and the completion hands it back for [`BufferPool::put`].
/// Whatever sits behind the handle when it is dropped goes back only if it
/// is a whole slot of the pool (a buffer swapped in through `&mut` is
/// dropped instead; the slot swapped out is the caller's, for `put`).
pub struct PooledBuffer {
    /// Both fields are taken exactly once: by `Drop`, or by `into_local`
    /// (which skips `Drop`).
    buf: ManuallyDrop<LocalBuffer>,
    pool: ManuallyDrop<Arc<PoolShared>>,
}

impl PooledBuffer {
    /// The plain buffer, no longer tied to the pool: give it back with
    /// [`BufferPool::put`] (to split it, say, and post a prefix). Posting
    /// a `PooledBuffer` does this itself.
    #[inline]
    pub fn into_local(self) -> LocalBuffer {
        let mut me = ManuallyDrop::new(self);
        // SAFETY: `me` is never dropped, so each field is taken once, here.
        let (buf, pool) = unsafe {
            (
                ManuallyDrop::take(&mut me.buf),
                ManuallyDrop::take(&mut me.pool),
            )
        };
        drop(pool);
        buf
    }
}

impl Drop for PooledBuffer {
    fn drop(&mut self) {
        // SAFETY: `drop` runs once and nothing uses the fields after it.
        let (buf, pool) = unsafe {
            (
                ManuallyDrop::take(&mut self.buf),
                ManuallyDrop::take(&mut self.pool),
            )
        };
        // Not a whole slot (swapped through `&mut`): dropped, as any
        // buffer; the registration outlives it.
        let _ = pool.give_back(buf);
    }
}

impl Deref for PooledBuffer {
    type Target = LocalBuffer;
    #[inline]
    fn deref(&self) -> &LocalBuffer {
        &self.buf
    }
}

impl DerefMut for PooledBuffer {
    #[inline]
    fn deref_mut(&mut self) -> &mut LocalBuffer {
        &mut self.buf
    }
}

impl std::fmt::Debug for PooledBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PooledBuffer")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len())
            .finish()
    }
}

impl From<PooledBuffer> for Buf {
    /// The plain [`LocalBuffer`]: a posted buffer belongs to the request.
    #[inline]
    fn from(b: PooledBuffer) -> Buf {
        Buf::Local(b.into_local())
    }
}

impl crate::memory::buffer::sealed::Sealed for PooledBuffer {}
impl DeviceWritable for PooledBuffer {}
impl DeviceReadable for PooledBuffer {}

/// Anonymous memory on huge pages, `len` a whole number of them (what
/// `munmap` needs).
struct HugePages(memmap2::MmapMut);

// SAFETY: a mapping stays at its address until it is unmapped on drop.
unsafe impl Storage for HugePages {
    fn as_mut_ptr(&mut self) -> *mut u8 {
        self.0.as_mut_ptr()
    }
    fn len(&self) -> usize {
        self.0.len()
    }
    fn is_huge(&self) -> bool {
        true
    }
}

/// What `/proc/meminfo` says about huge pages: (page size in bytes, free
/// pages, total pages); `None` for fields it lacks.
fn huge_page_info(meminfo: &str) -> (Option<usize>, Option<usize>, Option<usize>) {
    let field = |name: &str| {
        meminfo.lines().find_map(|l| {
            let rest = l.strip_prefix(name)?.strip_prefix(':')?;
            let mut words = rest.split_whitespace();
            let n: usize = words.next()?.parse().ok()?;
            match words.next() {
                Some("kB") => n.checked_mul(1024),
                None => Some(n),
                Some(_) => None,
            }
        })
    };
    (
        field("Hugepagesize"),
        field("HugePages_Free"),
        field("HugePages_Total"),
    )
}

impl HugePages {
    /// `len` bytes (rounded up to whole huge pages of the default size)
    /// with `MAP_HUGETLB`, which reserves the pages at once: an error, not
    /// a fallback, when too few are free.
    fn map(len: usize) -> Result<HugePages> {
        let info = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let (page, free, total) = huge_page_info(&info);
        let page = page.unwrap_or(2 << 20);
        let len = len
            .checked_next_multiple_of(page)
            .ok_or(Error::OutOfRange {
                what: "buffer pool bytes rounded to huge pages",
                value: len as u64,
                max: (usize::MAX - usize::MAX % page) as u64,
            })?;
        memmap2::MmapOptions::new()
            .len(len)
            .huge(None)
            .map_anon()
            .map(HugePages)
            .map_err(|io| {
                let hint = format!(
                    "MAP_HUGETLB needs {} free huge pages of {page} bytes; /proc/meminfo has \
                     {} free of {} (reserve them in /proc/sys/vm/nr_hugepages, or build the \
                     pool without huge_pages)",
                    len / page,
                    free.map_or("?".into(), |n| n.to_string()),
                    total.map_or("?".into(), |n| n.to_string()),
                );
                Error::Verb { verb: "mmap", io }.with_hint(Some(hint))
            })
    }
}

/// Options of a [`BufferPool`] (from [`ProtectionDomain::alloc_pool`]).
#[derive(Debug)]
#[must_use = "build() creates the pool"]
pub struct BufferPoolBuilder<'a> {
    pd: &'a ProtectionDomain,
    count: usize,
    size: usize,
    access: AccessFlags,
    huge_pages: bool,
}

impl BufferPoolBuilder<'_> {
    /// Back the pool with huge pages of the system's default size
    /// (`Hugepagesize` in `/proc/meminfo`; the registration is rounded up
    /// to whole pages): an error, never a silent fallback, when the
    /// system has too few free (default `false`: normal pages).
    pub fn huge_pages(mut self, huge_pages: bool) -> Self {
        self.huge_pages = huge_pages;
        self
    }

    /// Maps and registers the memory (one `ibv_reg_mr`) and carves it
    /// into the pool's buffers, all free. Allocates the free list once.
    ///
    /// # Errors
    /// [`Error::EmptyRegistration`] for a `count` or `size` of 0;
    /// [`Error::OutOfRange`] when `count × size` overflows `usize`;
    /// [`Error::NeedsSharedBuffer`] for remote write or atomic rights;
    /// [`Error::Verb`] naming `mmap` when the memory cannot be mapped
    /// (with huge pages: too few free, the message says how many are),
    /// or naming `ibv_reg_mr` (as [`ProtectionDomain::register`]).
    ///
    /// # References
    /// `ibv_reg_mr(3)`, `mmap(2)` (`MAP_HUGETLB`)
    pub fn build(self) -> Result<BufferPool> {
        let BufferPoolBuilder {
            pd,
            count,
            size,
            access,
            huge_pages,
        } = self;
        if count == 0 || size == 0 {
            return Err(Error::EmptyRegistration);
        }
        let total = count.checked_mul(size).ok_or(Error::OutOfRange {
            what: "buffer pool count for this size",
            value: count as u64,
            max: (usize::MAX / size) as u64,
        })?;
        let mut whole = if huge_pages {
            pd.register(HugePages::map(total)?, access)?
        } else {
            pd.alloc(total, access)?
        };
        whole.truncate_to(total);
        let base = whole.addr();
        let mr = whole.memory_region();
        let (mut free, rest) = whole.chunks_exact(size);
        debug_assert!(rest.is_empty() && free.len() == count);
        drop(rest);
        // `get` pops from the end: hand slot 0 out first.
        free.reverse();
        free.reserve_exact(count - free.len());
        Ok(BufferPool {
            shared: Arc::new(PoolShared {
                free: Mutex::new(free),
                mr,
                base,
                size,
                count,
            }),
        })
    }
}

impl ProtectionDomain {
    /// A pool of `count` buffers of `size` bytes, one registration of
    /// `count × size` bytes with `access`: set options on the builder,
    /// then [`build`](BufferPoolBuilder::build) it. Buffer `i` starts
    /// `i × size` bytes after a page-aligned start, so a `size` that is a
    /// multiple of `T`'s alignment keeps every buffer's typed view
    /// ([`LocalBuffer::as_slice_of`]) aligned.
    ///
    /// # Example
    /// ```no_run
    /// # fn main() -> rdma_verbs::Result<()> {
    /// let ctx = rdma_verbs::open_device("rxe0")?;
    /// let pd = ctx.alloc_pd()?;
    /// let pool = pd
    ///     .alloc_pool(512, 4096, rdma_verbs::AccessFlags::LOCAL_WRITE)
    ///     .huge_pages(true) // 2 MiB on one huge page, or an error
    ///     .build()?;
    /// assert!(pool.memory_region().is_huge());
    /// # Ok(()) }
    /// ```
    ///
    /// # References
    /// `ibv_reg_mr(3)`
    pub fn alloc_pool(
        &self,
        count: usize,
        size: usize,
        access: AccessFlags,
    ) -> BufferPoolBuilder<'_> {
        BufferPoolBuilder {
            pd: self,
            count,
            size,
            access,
            huge_pages: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_whole_slots_have_an_index() {
        let (base, size, count) = (0x10_000u64, 4096usize, 4usize);
        for i in 0..count {
            assert_eq!(
                slot_index(base, size, count, base + (i * size) as u64, size),
                Some(i)
            );
        }
        // A piece, two slots, a shifted slot, past the end, before the start.
        assert_eq!(slot_index(base, size, count, base, size / 2), None);
        assert_eq!(slot_index(base, size, count, base + 2048, size / 2), None);
        assert_eq!(slot_index(base, size, count, base, 2 * size), None);
        assert_eq!(slot_index(base, size, count, base + 1, size), None);
        assert_eq!(slot_index(base, size, count, base + 4 * 4096, size), None);
        assert_eq!(slot_index(base, size, count, base - 4096, size), None);
        assert_eq!(slot_index(base, size, count, 0, size), None);
        // Offsets beyond usize (a 32-bit target) or the top of the space.
        assert_eq!(slot_index(0, size, count, u64::MAX, size), None);
        assert_eq!(slot_index(base, size, count, u64::MAX - 4095, size), None);
        // Odd slot sizes.
        assert_eq!(slot_index(base, 3, 5, base + 12, 3), Some(4));
        assert_eq!(slot_index(base, 3, 5, base + 15, 3), None);
        assert_eq!(slot_index(base, 3, 5, base + 13, 3), None);
    }

    #[test]
    fn huge_page_fields_are_read_from_meminfo() {
        let info = "MemTotal:        4000000 kB\nHugePages_Total:      16\n\
                    HugePages_Free:       14\nHugePages_Rsvd:        0\n\
                    Hugepagesize:       2048 kB\nHugetlb:           32768 kB\n";
        assert_eq!(huge_page_info(info), (Some(2 << 20), Some(14), Some(16)));
        assert_eq!(
            huge_page_info("Hugepagesize:    1048576 kB\n"),
            (Some(1 << 30), None, None)
        );
        assert_eq!(huge_page_info(""), (None, None, None));
        // A prefix of another field's name is not the field.
        assert_eq!(huge_page_info("HugePages_FreeX: 3\n"), (None, None, None));
        assert_eq!(huge_page_info("Hugepagesize: 2048 MB\n").0, None);
    }

    #[test]
    fn pooled_buffers_cross_threads_and_post() {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<BufferPool>();
        send_sync::<PooledBuffer>();
        send_sync::<PutError>();
        fn postable<T: DeviceReadable + DeviceWritable>() {}
        postable::<PooledBuffer>();
    }
}
