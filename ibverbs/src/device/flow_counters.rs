//! Flow counters (`ibv_create_counters`): a device object that counts the
//! packets and bytes of the flows it is bound to.
//!
//! Counting needs a flow-steering rule (`ibv_create_flow` with an
//! `IBV_FLOW_SPEC_ACTION_COUNT` spec naming the counters' handle), which
//! this library does not wrap: the counters are defined here (static
//! attach, no flow yet) and read here; binding them to a flow goes
//! through [`FlowCounters::as_ptr`] and the raw `ibv_create_flow`. No
//! device memory of the caller's is involved: reading copies the values
//! into a slice the call borrows.

use std::ptr::NonNull;

use rdma_verbs_sys as sys;

use crate::device::context::Context;
use crate::error::{errno_error, ret_ptr, Error, Result};

/// What one index of a [`FlowCounters`] counts
/// (`enum ibv_counter_description`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CounterDescription {
    /// Packets (`IBV_COUNTER_PACKETS`).
    Packets,
    /// Bytes (`IBV_COUNTER_BYTES`).
    Bytes,
}

impl CounterDescription {
    fn raw(self) -> sys::ibv_counter_description {
        match self {
            CounterDescription::Packets => sys::IBV_COUNTER_PACKETS,
            CounterDescription::Bytes => sys::IBV_COUNTER_BYTES,
        }
    }
}

/// A counters object (`struct ibv_counters`), destroyed on drop.
///
/// Not `Clone`: defining indexes takes `&mut self`. Keeps its
/// [`Context`] open.
///
/// # References
/// `ibv_create_counters(3)`, `ibv_attach_counters_point_flow(3)`,
/// `ibv_read_counters(3)`
pub struct FlowCounters {
    counters: NonNull<sys::ibv_counters>,
    /// Indexes defined so far (one past the highest), for reads.
    defined: u32,
    ctx: Context,
}

// SAFETY: libibverbs objects may be used from any thread; `read` and
// `attach` are provider calls on the object, serialised by `&mut self`
// where they change it.
unsafe impl Send for FlowCounters {}
// SAFETY: `&self` methods only read the counters (`ibv_read_counters`),
// which providers allow from several threads.
unsafe impl Sync for FlowCounters {}

impl Context {
    /// Creates a counters object for flow counting.
    ///
    /// No device attribute announces flow counters: the provider's answer
    /// is the capability check. Where it has none (rxe, and every
    /// provider but mlx5 in rdma-core 44), libibverbs answers
    /// `EOPNOTSUPP`.
    ///
    /// # Errors
    /// [`Error::Verb`] naming `ibv_create_counters`: `EOPNOTSUPP` when the
    /// device has no flow counters, `ENOMEM`.
    ///
    /// # References
    /// `ibv_create_counters(3)`
    #[doc(alias = "ibv_create_counters")]
    pub fn create_counters(&self) -> Result<FlowCounters> {
        let mut attr = sys::ibv_counters_init_attr { comp_mask: 0 };
        // SAFETY: live context; `attr` valid for the call; the object is
        // destroyed in Drop.
        let raw = unsafe { sys::ibv_create_counters(self.as_ptr(), &mut attr) };
        let counters = ret_ptr("ibv_create_counters", raw)?;
        Ok(FlowCounters {
            counters,
            defined: 0,
            ctx: self.clone(),
        })
    }
}

impl FlowCounters {
    /// Defines what index `index` counts, before the counters are bound to
    /// a flow (a static attach: `ibv_attach_counters_point_flow` with no
    /// flow). Defining an index twice adds both descriptions into it.
    ///
    /// # Errors
    /// [`Error::Verb`] naming `ibv_attach_counters_point_flow`: `ENOTSUP`
    /// (or `EOPNOTSUPP`) for a description the device cannot count,
    /// `EBUSY` once the counters are bound to a flow, `EINVAL`.
    ///
    /// # References
    /// `ibv_attach_counters_point_flow(3)`
    #[doc(alias = "ibv_attach_counters_point_flow")]
    pub fn define(&mut self, index: u32, what: CounterDescription) -> Result<()> {
        let mut attr = sys::ibv_counter_attach_attr {
            counter_desc: what.raw(),
            index,
            comp_mask: 0,
        };
        // SAFETY: live counters; `attr` valid for the call; a NULL flow
        // asks for a static attach (the man page's contract).
        let rc = unsafe {
            sys::ibv_attach_counters_point_flow(
                self.counters.as_ptr(),
                &mut attr,
                std::ptr::null_mut(),
            )
        };
        if rc != 0 {
            return Err(errno_error("ibv_attach_counters_point_flow", rc));
        }
        self.defined = self.defined.max(index.saturating_add(1));
        Ok(())
    }

    /// How many indexes [`read`](Self::read) fills: one past the highest
    /// defined.
    pub fn len(&self) -> u32 {
        self.defined
    }

    /// Whether no index was defined yet.
    pub fn is_empty(&self) -> bool {
        self.defined == 0
    }

    /// Reads the current values into `values` (index `i` into
    /// `values[i]`); `prefer_cached` lets the provider answer from a cache
    /// (`IBV_READ_COUNTERS_ATTR_PREFER_CACHED`) instead of asking the
    /// device. Values only grow; they start at 0 when the counters are
    /// created.
    ///
    /// # Errors
    /// * [`Error::OutOfRange`] when `values` holds more than `u32::MAX`
    ///   entries.
    /// * [`Error::Verb`] naming `ibv_read_counters` (`EINVAL` for a count
    ///   the provider refuses, `EOPNOTSUPP`).
    ///
    /// # References
    /// `ibv_read_counters(3)`
    #[doc(alias = "ibv_read_counters")]
    pub fn read(&self, values: &mut [u64], prefer_cached: bool) -> Result<()> {
        let n = u32::try_from(values.len()).map_err(|_| Error::OutOfRange {
            what: "counter values",
            value: values.len() as u64,
            max: u64::from(u32::MAX),
        })?;
        let flags = if prefer_cached {
            sys::ibv_read_counters_flags::IBV_READ_COUNTERS_ATTR_PREFER_CACHED.0
        } else {
            0
        };
        // SAFETY: live counters; `values` is valid for writes of `n` u64s,
        // the count passed; the provider writes no more.
        let rc = unsafe {
            sys::ibv_read_counters(self.counters.as_ptr(), values.as_mut_ptr(), n, flags)
        };
        if rc != 0 {
            return Err(errno_error("ibv_read_counters", rc));
        }
        Ok(())
    }

    /// The context the counters belong to.
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// The raw counters pointer (for `ibv_create_flow`'s
    /// `IBV_FLOW_SPEC_ACTION_COUNT`), valid while `self` lives. A flow
    /// bound to it must be destroyed before `self` is dropped: the
    /// provider refuses to destroy counters still bound (the drop then
    /// leaks them).
    pub fn as_ptr(&self) -> *mut sys::ibv_counters {
        self.counters.as_ptr()
    }
}

impl Drop for FlowCounters {
    fn drop(&mut self) {
        // SAFETY: sole owner; no reference outlives `self` (reads borrow
        // it). A failure (counters still bound to a flow) leaves the
        // object allocated in the provider: a leak, never a free of
        // something in use; Drop must not panic, so it is ignored.
        unsafe { sys::ibv_destroy_counters(self.counters.as_ptr()) };
    }
}

impl std::fmt::Debug for FlowCounters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FlowCounters")
            .field("defined", &self.defined)
            .finish()
    }
}
