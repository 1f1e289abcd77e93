//! Capability queries: what a device supports, by name.
//!
//! [`Context::query_device_ex`] returns the extended attributes
//! (`ibv_query_device_ex`); [`DeviceAttrEx::supports`] answers per
//! [`Feature`], so callers and tests can say *which* capability is missing
//! instead of failing obscurely or passing silently.

use std::mem::MaybeUninit;

use rdma_verbs_sys as sys;

use crate::device::context::{AtomicCap, Context, DeviceAttr};
use crate::error::{ret_errno, Result};

/// A device capability that [`DeviceAttrEx::supports`] can answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Feature {
    /// Memory windows of type 1 (`IBV_DEVICE_MEM_WINDOW`).
    MemoryWindowType1,
    /// Memory windows of type 2 (`IBV_DEVICE_MEM_WINDOW_TYPE_2A` or `_2B`).
    MemoryWindowType2,
    /// Atomic compare-and-swap and fetch-and-add (`atomic_cap` not `NONE`).
    Atomics,
    /// Shared receive queues (`max_srq > 0`).
    SharedReceiveQueue,
    /// XRC transport (`IBV_DEVICE_XRC`).
    Xrc,
    /// On-demand paging (`IBV_ODP_SUPPORT`).
    OnDemandPaging,
    /// Completion timestamps (`completion_timestamp_mask != 0`).
    CompletionTimestamps,
    /// Device memory (`max_dm_size > 0`).
    DeviceMemory,
}

impl Feature {
    /// Every feature, for reports.
    pub const ALL: &'static [Feature] = &[
        Feature::MemoryWindowType1,
        Feature::MemoryWindowType2,
        Feature::Atomics,
        Feature::SharedReceiveQueue,
        Feature::Xrc,
        Feature::OnDemandPaging,
        Feature::CompletionTimestamps,
        Feature::DeviceMemory,
    ];
}

impl std::fmt::Display for Feature {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Feature::MemoryWindowType1 => "memory windows type 1",
            Feature::MemoryWindowType2 => "memory windows type 2",
            Feature::Atomics => "atomics",
            Feature::SharedReceiveQueue => "shared receive queues",
            Feature::Xrc => "XRC",
            Feature::OnDemandPaging => "on-demand paging",
            Feature::CompletionTimestamps => "completion timestamps",
            Feature::DeviceMemory => "device memory",
        })
    }
}

/// Extended device attributes (`struct ibv_device_attr_ex`).
///
/// # References
/// `ibv_query_device_ex(3)`
#[derive(Clone, Copy)]
pub struct DeviceAttrEx {
    raw: sys::ibv_device_attr_ex,
}

impl std::fmt::Debug for DeviceAttrEx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("DeviceAttrEx");
        for feat in Feature::ALL {
            d.field(&feat.to_string(), &self.supports(*feat));
        }
        d.finish()
    }
}

impl DeviceAttrEx {
    /// The classic attributes (`orig_attr`).
    pub fn base(&self) -> DeviceAttr {
        DeviceAttr {
            raw: self.raw.orig_attr,
        }
    }
    /// Extended capability flags (`IBV_DEVICE_*`, 64 bits).
    pub fn device_cap_flags_ex(&self) -> u64 {
        self.raw.device_cap_flags_ex
    }
    /// Valid bits of completion timestamps (0: none).
    pub fn completion_timestamp_mask(&self) -> u64 {
        self.raw.completion_timestamp_mask
    }
    /// Frequency of the timestamp clock in kHz (0: unknown).
    pub fn hca_core_clock(&self) -> u64 {
        self.raw.hca_core_clock
    }
    /// Number of physical ports, not capped at 255 (`ibv_query_device_ex(3)`) (the classic
    /// [`DeviceAttr::phys_port_cnt`] is a `u8`, and reports 255 when there
    /// are more).
    pub fn phys_port_cnt_ex(&self) -> u32 {
        self.raw.phys_port_cnt_ex
    }
    /// Largest device-memory allocation in bytes.
    pub fn max_dm_size(&self) -> u64 {
        self.raw.max_dm_size
    }
    /// The raw C struct.
    pub fn as_raw(&self) -> &sys::ibv_device_attr_ex {
        &self.raw
    }

    /// Whether the device reports `feature`.
    pub fn supports(&self, feature: Feature) -> bool {
        let flags = u64::from(self.raw.orig_attr.device_cap_flags) | self.raw.device_cap_flags_ex;
        let has = |f: sys::ibv_device_cap_flags| flags & u64::from(f.0) != 0;
        match feature {
            Feature::MemoryWindowType1 => has(sys::ibv_device_cap_flags::IBV_DEVICE_MEM_WINDOW),
            Feature::MemoryWindowType2 => {
                has(sys::ibv_device_cap_flags::IBV_DEVICE_MEM_WINDOW_TYPE_2A)
                    || has(sys::ibv_device_cap_flags::IBV_DEVICE_MEM_WINDOW_TYPE_2B)
            }
            Feature::Atomics => self.base().atomic_cap() != AtomicCap::None,
            Feature::SharedReceiveQueue => self.raw.orig_attr.max_srq > 0,
            Feature::Xrc => has(sys::ibv_device_cap_flags::IBV_DEVICE_XRC),
            Feature::OnDemandPaging => {
                self.raw.odp_caps.general_caps & u64::from(sys::IBV_ODP_SUPPORT) != 0
            }
            Feature::CompletionTimestamps => self.raw.completion_timestamp_mask != 0,
            Feature::DeviceMemory => self.raw.max_dm_size > 0,
        }
    }

    /// The features the device lacks, by name (for reports and skips).
    pub fn missing(&self) -> impl Iterator<Item = Feature> + '_ {
        Feature::ALL.iter().copied().filter(|f| !self.supports(*f))
    }
}

impl Context {
    /// Extended device attributes and per-feature capability answers.
    ///
    /// # Errors
    /// [`Error::Verb`](crate::Error::Verb) naming `ibv_query_device_ex`.
    ///
    /// # References
    /// `ibv_query_device_ex(3)`
    ///
    /// # Example
    /// ```no_run
    /// # fn main() -> rdma_verbs::Result<()> {
    /// use rdma_verbs::device::Feature;
    /// let ctx = rdma_verbs::open_device("rxe0")?;
    /// let attr = ctx.query_device_ex()?;
    /// if !attr.supports(Feature::MemoryWindowType2) {
    ///     eprintln!("{} lacks {}", ctx.name(), Feature::MemoryWindowType2);
    /// }
    /// # Ok(()) }
    /// ```
    #[doc(alias = "ibv_query_device_ex")]
    pub fn query_device_ex(&self) -> Result<DeviceAttrEx> {
        let mut attr = MaybeUninit::<sys::ibv_device_attr_ex>::zeroed();
        // SAFETY: live context; `attr` is valid for writes of the size
        // passed; a NULL input asks for the default (all) attributes.
        let rc =
            unsafe { sys::ibv_query_device_ex(self.as_ptr(), std::ptr::null(), attr.as_mut_ptr()) };
        ret_errno("ibv_query_device_ex", rc)?;
        // SAFETY: initialised by the successful call (and zeroed before).
        let raw = unsafe { attr.assume_init() };
        Ok(DeviceAttrEx { raw })
    }
}
