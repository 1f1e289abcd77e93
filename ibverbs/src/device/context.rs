//! An open device: queries (device, ports, GIDs), async events, and the
//! factory for every other verbs object.

use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, RawFd};
use std::ptr::NonNull;
use std::sync::Arc;

use rdma_verbs_sys as sys;

use crate::device::event_routing::{route, AsyncEvent};
use crate::device::gid::GidEntry;
use crate::device::port::{LinkLayer, PortAttr, PortState};
use crate::error::{ret_errno, Error, Result};
use crate::types::{Gid, GidIndex, GidSelector, PortNumber};

pub(crate) struct ContextInner {
    pub(crate) ctx: NonNull<sys::ibv_context>,
    name: String,
    /// For a context librdmacm opened (an rdma_cm id's `verbs`): what keeps
    /// it open. Such a context is not closed here.
    pub(crate) borrowed_from: Option<Arc<dyn std::any::Any + Send + Sync>>,
}

// SAFETY: libibverbs contexts may be used from any thread; every verb on a
// context is thread-safe (rdma-core's threading model, ibv_open_device(3)).
unsafe impl Send for ContextInner {}
// SAFETY: as above; shared use from several threads is allowed.
unsafe impl Sync for ContextInner {}

impl Drop for ContextInner {
    fn drop(&mut self) {
        if self.borrowed_from.is_some() {
            // librdmacm's context: it owns and closes it.
            return;
        }
        // SAFETY: last reference: every child object holds a `Context` clone,
        // so all of them are already destroyed. Errors cannot be reported
        // from Drop and the context is gone either way.
        unsafe { sys::ibv_close_device(self.ctx.as_ptr()) };
    }
}

/// An open RDMA device (`struct ibv_context`).
///
/// Cheap to clone (an `Arc`); every object created from it keeps it open, so
/// objects may be dropped in any order.
///
/// # References
/// `ibv_open_device(3)`
#[derive(Clone)]
pub struct Context {
    pub(crate) inner: Arc<ContextInner>,
}

impl Context {
    pub(crate) fn from_raw(ctx: NonNull<sys::ibv_context>, name: String) -> Context {
        Context {
            inner: Arc::new(ContextInner {
                ctx,
                name,
                borrowed_from: None,
            }),
        }
    }

    /// Wraps a context another library owns (librdmacm's `rdma_cm_id::verbs`),
    /// kept open by `owner` for as long as this handle or any object created
    /// from it lives; never closed here.
    #[cfg_attr(not(feature = "rdmacm"), allow(dead_code))]
    pub(crate) fn borrowed(
        ctx: NonNull<sys::ibv_context>,
        owner: Arc<dyn std::any::Any + Send + Sync>,
    ) -> Context {
        // SAFETY: valid context; its device outlives it.
        let name =
            unsafe { std::ffi::CStr::from_ptr(sys::ibv_get_device_name((*ctx.as_ptr()).device)) }
                .to_string_lossy()
                .into_owned();
        Context {
            inner: Arc::new(ContextInner {
                ctx,
                name,
                borrowed_from: Some(owner),
            }),
        }
    }

    /// Whether the device is SoftRoCE (rxe reports vendor id 0xffffff), for
    /// the provider quirks the library works around.
    pub(crate) fn is_rxe(&self) -> bool {
        self.query_device()
            .is_ok_and(|d| d.vendor_id() == 0x00ff_ffff)
    }

    /// The device name (`rxe0`).
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The raw context pointer, valid while `self` lives.
    pub fn as_ptr(&self) -> *mut sys::ibv_context {
        self.inner.ctx.as_ptr()
    }

    /// How many completion vectors (interrupt vectors) the device offers:
    /// valid [`comp_vector`](crate::cq::CompletionQueueBuilder::comp_vector)
    /// values are `0..num_comp_vectors()`; the kernel refuses any other
    /// with `EINVAL`.
    ///
    /// # References
    /// `ibv_open_device(3)` (`struct ibv_context`), `ibv_create_cq(3)`
    #[doc(alias = "ibv_context")]
    pub fn num_comp_vectors(&self) -> u32 {
        // SAFETY: live context; libibverbs sets `num_comp_vectors` when the
        // context is opened and never changes it.
        let n = unsafe { (*self.as_ptr()).num_comp_vectors };
        u32::try_from(n).unwrap_or(0)
    }

    /// Device attributes.
    ///
    /// # Errors
    /// [`Error::Verb`] naming `ibv_query_device`.
    ///
    /// # References
    /// `ibv_query_device(3)`
    #[doc(alias = "ibv_query_device")]
    pub fn query_device(&self) -> Result<DeviceAttr> {
        let mut attr = MaybeUninit::<sys::ibv_device_attr>::zeroed();
        // SAFETY: live context; `attr` is valid for writes.
        let rc = unsafe { sys::ibv_query_device(self.as_ptr(), attr.as_mut_ptr()) };
        ret_errno("ibv_query_device", rc)?;
        // SAFETY: initialised by the successful call (and zeroed before).
        let raw = unsafe { attr.assume_init() };
        Ok(DeviceAttr { raw })
    }

    /// Port attributes (the real `ibv_query_port`, extended fields included).
    ///
    /// # Errors
    /// [`Error::Verb`] naming `ibv_query_port` (e.g. `EINVAL` for a port the
    /// device does not have; the message names the device's ports).
    ///
    /// # References
    /// `ibv_query_port(3)`
    #[doc(alias = "ibv_query_port")]
    pub fn query_port(&self, port: PortNumber) -> Result<PortAttr> {
        let mut attr = MaybeUninit::<sys::ibv_port_attr>::zeroed();
        // SAFETY: live context; `attr` is valid for writes.
        let rc = unsafe { sys::ibv_query_port(self.as_ptr(), port.0, attr.as_mut_ptr()) };
        ret_errno("ibv_query_port", rc).map_err(|e| e.with_hint(self.port_hint(port)))?;
        Ok(PortAttr {
            // SAFETY: zeroed then filled by the successful call.
            raw: unsafe { attr.assume_init() },
            port,
        })
    }

    /// The device's port numbers (`1..=phys_port_cnt`).
    ///
    /// # Errors
    /// As [`Context::query_device`].
    pub fn ports(&self) -> Result<impl Iterator<Item = PortNumber>> {
        let n = self.query_device()?.phys_port_cnt();
        Ok((1..=n).map(PortNumber))
    }

    /// The first port whose state is ACTIVE.
    ///
    /// # Errors
    /// [`Error::NoActivePort`] when no port is active; query errors otherwise.
    pub fn active_port(&self) -> Result<PortNumber> {
        for port in self.ports()? {
            if self.query_port(port)?.state() == PortState::Active {
                return Ok(port);
            }
        }
        Err(Error::NoActivePort {
            device: self.name().to_string(),
        })
    }

    /// One GID; [`Gid::ZERO`] for an empty slot of the table (as in C).
    ///
    /// # Errors
    /// [`Error::Verb`] naming `ibv_query_gid` (`EINVAL` for a port the
    /// device does not have, explained in the message).
    ///
    /// # References
    /// `ibv_query_gid(3)`
    #[doc(alias = "ibv_query_gid")]
    pub fn query_gid(&self, port: PortNumber, index: GidIndex) -> Result<Gid> {
        self.query_gid_unexplained(port, index)
            .map_err(|e| e.with_hint(self.gid_hint(port, index)))
    }

    fn query_gid_unexplained(&self, port: PortNumber, index: GidIndex) -> Result<Gid> {
        let mut gid = sys::ibv_gid { raw: [0; 16] };
        // SAFETY: live context; `gid` is valid for writes.
        let rc = unsafe { sys::ibv_query_gid(self.as_ptr(), port.0, index.0.into(), &mut gid) };
        ret_errno("ibv_query_gid", rc)?;
        Ok(Gid::from_raw(&gid))
    }

    /// One GID table entry with its type and network device.
    ///
    /// # Errors
    /// [`Error::Verb`] naming `ibv_query_gid_ex` (`ENODATA` for an empty
    /// slot, `EINVAL` for a port the device does not have; the message says
    /// which).
    ///
    /// # References
    /// `ibv_query_gid_ex(3)`
    #[doc(alias = "ibv_query_gid_ex")]
    pub fn query_gid_entry(&self, port: PortNumber, index: GidIndex) -> Result<GidEntry> {
        self.query_gid_entry_unexplained(port, index)
            .map_err(|e| e.with_hint(self.gid_hint(port, index)))
    }

    fn query_gid_entry_unexplained(&self, port: PortNumber, index: GidIndex) -> Result<GidEntry> {
        let mut entry = MaybeUninit::<sys::ibv_gid_entry>::zeroed();
        // SAFETY: live context; `entry` valid for writes of its size.
        let rc = unsafe {
            sys::ibv_query_gid_ex(
                self.as_ptr(),
                port.0.into(),
                index.0.into(),
                entry.as_mut_ptr(),
                0,
            )
        };
        ret_errno("ibv_query_gid_ex", rc)?;
        // SAFETY: zeroed, then filled by the successful call.
        Ok(GidEntry::from_raw(unsafe { &entry.assume_init() }))
    }

    /// Every valid (non-empty) GID table entry of every port, with its
    /// type and network device.
    ///
    /// Read with `ibv_query_gid_table`. Where that verb is missing (a
    /// kernel or provider that answers `EOPNOTSUPP`, `EPROTONOSUPPORT` or
    /// `ENOSYS`), the table is read entry by entry with `ibv_query_gid_ex`,
    /// empty entries skipped. The library reads no sysfs itself: on a
    /// kernel without the GID ioctls, rdma-core's `ibv_query_gid_ex` already
    /// reads `ports/P/gids/I` and `ports/P/gid_attrs/{types,ndevs}/I`, and
    /// a second reader could only disagree with it.
    ///
    /// # Errors
    /// [`Error::Verb`] naming `ibv_query_gid_table` (or `ibv_query_gid_ex`
    /// in the fallback), or `ibv_query_port` when sizing the table.
    ///
    /// # References
    /// `ibv_query_gid_table(3)`, `ibv_query_gid_ex(3)`
    #[doc(alias = "ibv_query_gid_table")]
    pub fn gid_table(&self) -> Result<Vec<GidEntry>> {
        let mut max = 0usize;
        for port in self.ports()? {
            max += self.query_port(port)?.gid_table_len() as usize;
        }
        let mut entries: Vec<sys::ibv_gid_entry> = vec![Default::default(); max.max(1)];
        // SAFETY: `entries` holds `len` writable entries of the size passed.
        let n = unsafe {
            sys::ibv_query_gid_table(self.as_ptr(), entries.as_mut_ptr(), entries.len(), 0)
        };
        if n < 0 {
            let errno = (-n) as i32;
            if table_verb_missing(errno) {
                return self.gid_table_by_index();
            }
            return Err(Error::from_errno("ibv_query_gid_table", errno));
        }
        Ok(entries[..n as usize]
            .iter()
            .map(GidEntry::from_raw)
            .collect())
    }

    /// [`Context::gid_table`] one `ibv_query_gid_ex` per index, for where
    /// `ibv_query_gid_table` is missing.
    fn gid_table_by_index(&self) -> Result<Vec<GidEntry>> {
        let mut table = Vec::new();
        for port in self.ports()? {
            let len = self.query_port(port)?.gid_table_len();
            // GidIndex is a u8: indexes past 255 cannot be named anyway.
            for i in 0..len.min(256) {
                // Empty slots are expected here: no explanation is built.
                match self.query_gid_entry_unexplained(port, GidIndex(i as u8)) {
                    Ok(e) if !e.gid.is_zero() => table.push(e),
                    Ok(_) => {}
                    Err(e) if e.raw_os_error() == Some(libc::ENODATA) => {}
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(table)
    }

    /// The entry of `port`'s GID table that `selector` names: by IP
    /// address, by network device, or the routable RoCE v2 IPv4 entry
    /// (see [`GidSelector`] for the rules).
    ///
    /// # Errors
    /// [`Error::NoMatchingGid`] (with `port` and `selector`) when no entry
    /// matches; as [`Context::gid_table`] otherwise.
    ///
    /// # References
    /// `ibv_query_gid_table(3)`
    #[doc(alias = "ibv_query_gid_table")]
    #[doc(alias = "ibv_query_gid_ex")]
    pub fn select_gid(&self, port: PortNumber, selector: &GidSelector) -> Result<GidEntry> {
        let table = self.gid_table()?;
        selector.select(&table, port).cloned()
    }

    /// The GID index to use on `port` when none was given: on Ethernet
    /// (RoCE) [`GidSelector::Automatic`], the first RoCE v2 entry with a
    /// non-link-local IPv4-mapped address (what `-g`/`-x` usually select
    /// by hand), else the first non-empty entry; on InfiniBand index 0.
    ///
    /// # Errors
    /// [`Error::NoMatchingGid`] when a RoCE port's table has no non-empty
    /// entry; as [`Context::gid_table`] otherwise.
    ///
    /// # References
    /// `ibv_query_gid_table(3)`
    pub fn default_gid_index(&self, port: PortNumber) -> Result<GidIndex> {
        if self.query_port(port)?.link_layer() != LinkLayer::Ethernet {
            return Ok(GidIndex(0));
        }
        Ok(self.select_gid(port, &GidSelector::Automatic)?.index)
    }

    /// Waits for the next asynchronous event (port changes, QP/CQ/SRQ
    /// errors, last-WQE-reached …). Blocks unless the async fd was set
    /// non-blocking.
    ///
    /// The event is acknowledged (`ibv_ack_async_event`) before this
    /// returns: what it concerns is copied out first, so the value is plain
    /// data that may be held, sent or forgotten. (`ibv_destroy_qp`,
    /// `ibv_destroy_srq` and `ibv_destroy_cq` wait until every event
    /// reported for their object was acknowledged: an event acknowledged
    /// only when its value was dropped would block the teardown of its
    /// object for as long as it was held, forever if it was forgotten.)
    ///
    /// # Errors
    /// [`Error::Verb`] naming `ibv_get_async_event` (`EAGAIN` when non-blocking
    /// and nothing is pending).
    ///
    /// # References
    /// `ibv_get_async_event(3)`, `ibv_ack_async_event(3)`
    #[doc(alias = "ibv_get_async_event")]
    #[doc(alias = "ibv_ack_async_event")]
    pub fn get_async_event(&self) -> Result<AsyncEvent> {
        let mut ev = MaybeUninit::<sys::ibv_async_event>::zeroed();
        // SAFETY: live context; `ev` valid for writes.
        let rc = unsafe { sys::ibv_get_async_event(self.as_ptr(), ev.as_mut_ptr()) };
        ret_errno("ibv_get_async_event", rc)?;
        // SAFETY: filled by the successful call.
        let mut raw = unsafe { ev.assume_init() };
        // Everything is read before the ack: the object the event names
        // may be destroyed as soon as it is acknowledged.
        // SAFETY: an event just reported and not yet acknowledged, so the
        // object in its union is alive.
        let event = unsafe { AsyncEvent::copy_out(&raw) };
        // SAFETY: acknowledges the event obtained above, exactly once; the
        // context is alive (`self`).
        unsafe { sys::ibv_ack_async_event(&mut raw) };
        Ok(event)
    }

    /// Why `port` is wrong when the device has no such port, for the
    /// message of a verb that failed. Error paths only: queries the device.
    pub(crate) fn port_hint(&self, port: PortNumber) -> Option<String> {
        // SAFETY: `device` and its `node_type` are immutable fields of the
        // live context.
        let switch = unsafe { (*(*self.as_ptr()).device).node_type } == sys::IBV_NODE_SWITCH;
        let first = u8::from(!switch); // switches have a port 0, HCAs start at 1
        let last = self.query_device().ok()?.phys_port_cnt();
        (port.0 < first || port.0 > last).then(|| {
            format!(
                "{} has no port {port} (its ports are {first}..={last})",
                self.name()
            )
        })
    }

    /// Why `(port, index)` names no GID (a bad port, an index past the
    /// table, an empty slot), for the message of a verb that failed. Error
    /// paths only.
    pub(crate) fn gid_hint(&self, port: PortNumber, index: GidIndex) -> Option<String> {
        if let Some(hint) = self.port_hint(port) {
            return Some(hint);
        }
        let len = self.query_port(port).ok()?.gid_table_len();
        let i = index.0;
        if u32::from(i) >= len {
            return Some(format!(
                "GID index {i} is past the GID table of {} port {port} ({len} entries)",
                self.name()
            ));
        }
        match self.query_gid_unexplained(port, index) {
            Ok(gid) if gid.is_zero() => Some(format!(
                "GID index {i} of {} port {port} is empty",
                self.name()
            )),
            _ => None,
        }
    }

    /// Makes [`Context::get_async_event`] non-blocking (or blocking again).
    ///
    /// # Errors
    /// [`Error::Verb`] naming `fcntl`.
    pub fn set_async_nonblocking(&self, nonblocking: bool) -> Result<()> {
        set_nonblocking(self.as_raw_fd(), nonblocking)
    }
}

pub(crate) fn set_nonblocking(fd: RawFd, nonblocking: bool) -> Result<()> {
    // SAFETY: fcntl on an fd owned by a live verbs object.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(Error::last_os("fcntl"));
    }
    let flags = if nonblocking {
        flags | libc::O_NONBLOCK
    } else {
        flags & !libc::O_NONBLOCK
    };
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, flags) } < 0 {
        return Err(Error::last_os("fcntl"));
    }
    Ok(())
}

/// The async event descriptor, lent for readiness only (poll it for
/// readability before [`Context::get_async_event`]; `poll(2)`, epoll,
/// Tokio's `AsyncFd`). There is deliberately no `AsFd`: a `BorrowedFd`
/// would let safe code `read(2)` an async event past libibverbs, which
/// then never acknowledges it, and `ibv_destroy_qp`/`_srq`/`_cq` wait for
/// that acknowledgement forever. Reading, writing or closing the raw
/// descriptor is the caller's `unsafe` (DESIGN.md, threat model:
/// descriptors lent out).
impl AsRawFd for Context {
    /// The async event fd.
    fn as_raw_fd(&self) -> RawFd {
        // SAFETY: `async_fd` is an immutable field of the live context.
        unsafe { (*self.as_ptr()).async_fd }
    }
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("name", &self.name())
            .finish()
    }
}

/// Device attributes.
///
/// # References
/// `ibv_query_device(3)`
#[derive(Clone, Copy)]
pub struct DeviceAttr {
    pub(crate) raw: sys::ibv_device_attr,
}

macro_rules! attr_getters {
    ($( $(#[$m:meta])* $name:ident : $ty:ty ),* $(,)?) => {$(
        $(#[$m])*
        pub fn $name(&self) -> $ty { self.raw.$name as $ty }
    )*};
}

impl DeviceAttr {
    attr_getters! {
        /// Largest memory region.
        max_mr_size: u64,
        /// Supported page sizes.
        page_size_cap: u64,
        /// IEEE vendor id.
        vendor_id: u32,
        /// Vendor part id.
        vendor_part_id: u32,
        /// Hardware version.
        hw_ver: u32,
        /// Max queue pairs.
        max_qp: u32,
        /// Max work requests per queue.
        max_qp_wr: u32,
        /// Capability flags (`IBV_DEVICE_*`).
        device_cap_flags: u32,
        /// Max scatter/gather entries per send/recv WR.
        max_sge: u32,
        /// Max scatter/gather entries per RDMA read WR.
        max_sge_rd: u32,
        /// Max completion queues.
        max_cq: u32,
        /// Max entries per completion queue.
        max_cqe: u32,
        /// Max memory regions.
        max_mr: u32,
        /// Max protection domains.
        max_pd: u32,
        /// Max outstanding RDMA reads/atomics per QP as target.
        max_qp_rd_atom: u32,
        /// Max outstanding RDMA reads/atomics per QP as initiator.
        max_qp_init_rd_atom: u32,
        /// Max memory windows.
        max_mw: u32,
        /// Max address handles.
        max_ah: u32,
        /// Max shared receive queues.
        max_srq: u32,
        /// Max work requests per SRQ.
        max_srq_wr: u32,
        /// Max SGEs per SRQ work request.
        max_srq_sge: u32,
        /// Max P_Keys.
        max_pkeys: u16,
        /// Local CA ack delay.
        local_ca_ack_delay: u8,
        /// Number of physical ports.
        phys_port_cnt: u8,
    }

    /// Node GUID, in host byte order (like [`Device::guid`](crate::Device::guid)).
    pub fn node_guid(&self) -> u64 {
        u64::from_be(self.raw.node_guid)
    }

    /// System image GUID, in host byte order.
    pub fn sys_image_guid(&self) -> u64 {
        u64::from_be(self.raw.sys_image_guid)
    }

    /// The firmware version string.
    pub fn fw_ver(&self) -> String {
        let bytes: Vec<u8> = self
            .raw
            .fw_ver
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as u8)
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// Atomic operation support.
    pub fn atomic_cap(&self) -> AtomicCap {
        AtomicCap::from_raw(self.raw.atomic_cap)
    }

    /// The raw C struct.
    pub fn as_raw(&self) -> &sys::ibv_device_attr {
        &self.raw
    }
}

impl std::fmt::Debug for DeviceAttr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceAttr")
            .field("fw_ver", &self.fw_ver())
            .field("vendor_id", &format_args!("{:#x}", self.vendor_id()))
            .field("max_qp", &self.max_qp())
            .field("max_qp_wr", &self.max_qp_wr())
            .field("max_sge", &self.max_sge())
            .field("max_cqe", &self.max_cqe())
            .field("atomic_cap", &self.atomic_cap())
            .field("phys_port_cnt", &self.phys_port_cnt())
            .finish_non_exhaustive()
    }
}

crate::types::device_enum! {
    /// Which atomic operations the device supports, and how atomically.
    AtomicCap {
        /// No atomics.
        None = sys::IBV_ATOMIC_NONE,
        /// Atomic among this device's operations only.
        Hca = sys::IBV_ATOMIC_HCA,
        /// Atomic also with respect to the CPU and other devices.
        Glob = sys::IBV_ATOMIC_GLOB,
    }
}

/// Whether `ibv_query_gid_table` failed with `errno` because the verb is
/// missing (old kernel or provider), not because the query failed: then
/// [`Context::gid_table`] reads the table entry by entry.
fn table_verb_missing(errno: i32) -> bool {
    matches!(
        errno,
        libc::EOPNOTSUPP | libc::EPROTONOSUPPORT | libc::ENOSYS
    )
}

impl Context {
    /// Entry `index` of `port`'s P_Key table, in host order (`0xffff`, the
    /// full-membership default partition, at index 0 on RoCE and on an
    /// unpartitioned InfiniBand subnet). [`PortAttr::pkey_table_len`] is the
    /// table's length; a queue pair names its partition by index
    /// ([`ConnectOptions::pkey_index`](crate::ConnectOptions::pkey_index)).
    ///
    /// # Errors
    /// [`Error::Verb`](crate::Error::Verb) naming `ibv_query_pkey` (libibverbs reads
    /// the entry from sysfs: `ENOENT` for a port or an index the device
    /// does not have, explained in the message).
    ///
    /// # References
    /// `ibv_query_pkey(3)`
    #[doc(alias = "ibv_query_pkey")]
    pub fn query_pkey(&self, port: PortNumber, index: u16) -> crate::error::Result<u16> {
        let mut pkey: sys::__be16 = 0;
        // SAFETY: live context; `pkey` is valid for writes of a __be16.
        let rc = unsafe { sys::ibv_query_pkey(self.as_ptr(), port.0, index.into(), &mut pkey) };
        if rc != 0 {
            let io = std::io::Error::last_os_error();
            // libibverbs returns -1 without errno when the sysfs entry does
            // not parse.
            let io = if rc == -1 && io.raw_os_error().is_some_and(|e| e != 0) {
                io
            } else {
                std::io::Error::other(format!("returned {rc}"))
            };
            let e = crate::error::Error::Verb {
                verb: "ibv_query_pkey",
                io,
            };
            return Err(e.with_hint(self.pkey_hint(port, index)));
        }
        Ok(u16::from_be(pkey))
    }

    /// Why `(port, index)` names no P_Key. Error paths only.
    fn pkey_hint(&self, port: PortNumber, index: u16) -> Option<String> {
        if let Some(hint) = self.port_hint(port) {
            return Some(hint);
        }
        let len = self.query_port(port).ok()?.pkey_table_len();
        (index >= len).then(|| {
            format!(
                "P_Key index {index} is past the P_Key table of {} port {port} ({len} entries)",
                self.name()
            )
        })
    }
}

impl Context {
    /// Reads the next asynchronous event (as [`Context::get_async_event`]:
    /// blocking unless the async fd is non-blocking, acknowledged before
    /// this returns) and routes it: the subscribers of the QP, SRQ or CQ
    /// it names get a copy each, and `Ok(None)` says it was delivered.
    /// `Ok(Some(event))` is an event nobody took: a port or device event,
    /// or one of an object without a live subscriber (or being destroyed).
    ///
    /// Routing needs no thread of its own: call this wherever the context's
    /// events are read (a loop in a thread of the application's choosing,
    /// or after polling [`AsRawFd`](std::os::fd::AsRawFd) for readability).
    ///
    /// # Example
    /// ```no_run
    /// # fn demo(ctx: &rdma_verbs::Context, srq: &rdma_verbs::qp::SharedReceiveQueue) -> rdma_verbs::Result<()> {
    /// let low = srq.async_events(); // this SRQ's events only
    /// srq.arm_limit(16)?;
    /// // Wherever the context's events are read: here, a thread of our own.
    /// let router = ctx.clone();
    /// std::thread::spawn(move || loop {
    ///     match router.route_async_event() {
    ///         Ok(None) => {}                                     // delivered
    ///         Ok(Some(other)) => eprintln!("unrouted: {other:?}"), // port, device, …
    ///         Err(e) => break eprintln!("{e}"),
    ///     }
    /// });
    /// if let Some(ev) = low.recv_timeout(std::time::Duration::from_secs(1)) {
    ///     assert_eq!(ev.srq_id(), Some(srq.id())); // SRQ_LIMIT_REACHED
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`Context::get_async_event`]: [`Error::Verb`](crate::Error::Verb)
    /// naming `ibv_get_async_event` (`EAGAIN` when non-blocking and nothing
    /// is pending).
    ///
    /// # References
    /// `ibv_get_async_event(3)`, `ibv_ack_async_event(3)`
    #[doc(alias = "ibv_get_async_event")]
    pub fn route_async_event(&self) -> Result<Option<AsyncEvent>> {
        Ok(route(self.get_async_event()?))
    }
}
