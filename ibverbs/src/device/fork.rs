//! Fork safety: `ibv_fork_init` and `ibv_is_fork_initialized`.
//!
//! Registered memory is pinned: the device reads and writes its physical
//! pages. A `fork()` used to make those pages copy-on-write in both
//! processes, so the first write by the *parent* moved the parent to a
//! fresh page while the device kept using the old one (now the child's):
//! the parent's data path silently broke (received bytes never seen, sent
//! bytes stale). There are two cures:
//!
//! * **The kernel** (Linux 5.13 and later, commit "mm: do early cow for
//!   pinned pages during fork()" and its netlink attribute
//!   `RDMA_NLDEV_SYS_ATTR_COPY_ON_FORK`) copies pinned pages into the
//!   child at fork time, so the parent keeps its pages. rdma-core reports
//!   this as [`ForkStatus::Unneeded`], whatever else was done.
//! * **rdma-core** (`ibv_fork_init`, or the environment variable
//!   `RDMAV_FORK_SAFE` / `IBV_FORK_SAFE` read by the first
//!   `ibv_get_device_list`) marks every registered range
//!   `madvise(MADV_DONTFORK)`: the child gets no mapping of it at all
//!   (touching one there is a segfault). That costs a system call per
//!   registration and, since `madvise` works on whole pages, also hides
//!   whatever else shares those pages from the child. It only works when
//!   enabled before the first registration: rdma-core remembers that a
//!   range was registered unmarked and then refuses with `EINVAL`.
//!
//! What each rdma-core version does on a kernel that copies pinned pages:
//! rdma-core 44 (Debian 12) still builds its range tree and marks ranges
//! when `ibv_fork_init` runs, and still returns `EINVAL` when called late;
//! since rdma-core 52 (commit 5a11b68ca, "ignore IBV_FORK_SAFE et.al. when
//! kernel has fork support") `ibv_fork_init` returns 0 and does nothing
//! there. [`fork_init`] behaves like the newer versions on every version:
//! when the kernel copies pinned pages it returns
//! [`ForkStatus::Unneeded`] without calling `ibv_fork_init`.
//!
//! Neither matters to the ownership model (DESIGN.md, "Fork"): without fork
//! safety the parent loses data, but the device only ever touches pages
//! that stay pinned by their registration, never freed memory.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use rdma_verbs_sys as sys;

use crate::error::{Error, Result};

/// Whether fork support is on, as `ibv_is_fork_initialized` reports it
/// (`enum ibv_fork_status`).
///
/// # References
/// `ibv_is_fork_initialized(3)`
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ForkStatus {
    /// `IBV_FORK_DISABLED`: nothing protects the parent's registered
    /// memory across a `fork()`.
    Disabled,
    /// `IBV_FORK_ENABLED`: rdma-core marks registered ranges
    /// `MADV_DONTFORK` (`ibv_fork_init` ran, or `RDMAV_FORK_SAFE` was set).
    Enabled,
    /// `IBV_FORK_UNNEEDED`: the kernel copies pinned pages into the child
    /// at fork time; takes precedence over the other two.
    Unneeded,
    /// A value this library does not know (a later rdma-core).
    Unknown(u32),
}

impl ForkStatus {
    fn from_raw(raw: sys::ibv_fork_status) -> ForkStatus {
        match raw {
            sys::IBV_FORK_DISABLED => ForkStatus::Disabled,
            sys::IBV_FORK_ENABLED => ForkStatus::Enabled,
            sys::IBV_FORK_UNNEEDED => ForkStatus::Unneeded,
            other => ForkStatus::Unknown(other),
        }
    }

    /// Whether a `fork()` now leaves the parent's registered memory
    /// working: [`Enabled`](Self::Enabled) or [`Unneeded`](Self::Unneeded).
    pub fn is_fork_safe(self) -> bool {
        matches!(self, ForkStatus::Enabled | ForkStatus::Unneeded)
    }
}

/// Set (under [`GATE`]) before this library's first call into
/// libibverbs or librdmacm; never cleared.
static STARTED: AtomicBool = AtomicBool::new(false);
/// Serialises [`fork_init`] with the first verbs call: `ibv_fork_init`
/// writes rdma-core's range tree root without a lock, which every
/// registration reads, so it may only run while no verbs call of this
/// library can be running.
static GATE: Mutex<()> = Mutex::new(());

/// Records that the library is about to call into libibverbs or
/// librdmacm for the first time (a device list, an rdma_cm event
/// channel): from here on [`fork_init`] no longer calls `ibv_fork_init`.
/// One atomic load once started.
pub(crate) fn note_verbs_start() {
    if STARTED.load(Ordering::Acquire) {
        return;
    }
    // Waits for a running fork_init; a poisoned gate guards nothing but
    // this flag.
    let _gate = GATE.lock().unwrap_or_else(|p| p.into_inner());
    STARTED.store(true, Ordering::Release);
}

/// Whether fork support is on: `ibv_is_fork_initialized`, which asks the
/// kernel (over netlink, on every call) whether it copies pinned pages at
/// fork, and otherwise reports whether `ibv_fork_init` ran.
///
/// # References
/// `ibv_is_fork_initialized(3)`, `ibv_fork_init(3)`
#[doc(alias = "ibv_is_fork_initialized")]
pub fn fork_status() -> ForkStatus {
    // SAFETY: no arguments; reads rdma-core's range tree root, which is
    // null until ibv_fork_init and never null again after it (rotations
    // under rdma-core's own lock only replace one node with another).
    ForkStatus::from_raw(unsafe { sys::ibv_is_fork_initialized() })
}

/// Makes the parent's registered memory survive `fork()` (and `system()`,
/// and `std::process::Command` when it forks), and returns how.
///
/// Call it first, before anything else of this library (or set
/// `RDMAV_FORK_SAFE=1` in the environment, which rdma-core reads at its
/// first device list). Then:
///
/// * when the kernel copies pinned pages at fork, it returns
///   [`ForkStatus::Unneeded`] and changes nothing (as rdma-core 52 and
///   later do; rdma-core 44 would still mark every registration
///   `MADV_DONTFORK`, a system call each, for no benefit);
/// * otherwise it calls `ibv_fork_init` and returns
///   [`ForkStatus::Enabled`]: rdma-core marks every later registration
///   `MADV_DONTFORK`, so a child has no mapping of registered memory (nor
///   of anything else on those pages: the child should `exec` or `_exit`
///   without touching the parent's heap).
///
/// Calling it again is harmless and returns the same status. The gate
/// covers this library's own calls only: C code (or another crate)
/// calling libibverbs on another thread while `fork_init` runs is the
/// caller's to rule out, as for `ibv_fork_init` itself.
///
/// # Errors
/// * [`Error::LibraryNotFound`] (feature `dlopen`) when libibverbs is not
///   installed: nothing was called.
/// * [`Error::ForkInitTooLate`] naming `ibv_fork_init` when fork support
///   is off and it is too late to turn it on: this library already called
///   into libibverbs or librdmacm (`ibv_fork_init` would race with its
///   registrations, so it is not called), or rdma-core refused with
///   `EINVAL` because memory was registered before (by C code in the
///   process). Not an error when the kernel makes it unneeded.
/// * [`Error::Verb`] naming `ibv_fork_init` for its other failures
///   (`ENOSYS` when the kernel lacks `MADV_DONTFORK`, `ENOMEM`).
///
/// # References
/// `ibv_fork_init(3)`, `ibv_is_fork_initialized(3)`, `fork(2)`,
/// `madvise(2)` (`MADV_DONTFORK`)
///
/// # Example
/// ```no_run
/// fn main() -> rdma_verbs::Result<()> {
///     // First, before any device is listed or opened.
///     let status = rdma_verbs::device::fork_init()?;
///     assert!(status.is_fork_safe());
///     let ctx = rdma_verbs::open_device("rxe0")?;
///     // ... registrations, traffic, and child processes ...
///     # drop(ctx);
///     Ok(())
/// }
/// ```
#[doc(alias = "ibv_fork_init")]
#[doc(alias = "RDMAV_FORK_SAFE")]
#[doc(alias = "IBV_FORK_SAFE")]
pub fn fork_init() -> Result<ForkStatus> {
    crate::device::library::ensure_loaded()?;
    let _gate = GATE.lock().unwrap_or_else(|p| p.into_inner());
    let before = fork_status();
    match plan(before, STARTED.load(Ordering::Acquire)) {
        Plan::Report => Ok(before),
        Plan::Refuse => Err(too_late(false)),
        Plan::Call => {
            // SAFETY: no arguments; under the gate with STARTED clear, so
            // no verbs call of this library runs (or has run) beside it.
            let rc = unsafe { sys::ibv_fork_init() };
            called(rc, fork_status)
        }
    }
}

/// What [`fork_init`] does, given the status before and whether this
/// library's verbs calls have started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Plan {
    /// Already safe: report it.
    Report,
    /// Call `ibv_fork_init`.
    Call,
    /// Too late to call it.
    Refuse,
}

fn plan(before: ForkStatus, started: bool) -> Plan {
    match before {
        ForkStatus::Unneeded | ForkStatus::Enabled => Plan::Report,
        _ if started => Plan::Refuse,
        _ => Plan::Call,
    }
}

/// The result of a call of `ibv_fork_init` that returned `rc` (an errno
/// value); `status` reads the status after a success.
fn called(rc: i32, status: impl FnOnce() -> ForkStatus) -> Result<ForkStatus> {
    match rc {
        0 => Ok(status()),
        libc::EINVAL => Err(too_late(true)),
        rc => Err(crate::error::errno_error("ibv_fork_init", rc)),
    }
}

fn too_late(refused_by_rdma_core: bool) -> Error {
    Error::ForkInitTooLate {
        verb: "ibv_fork_init",
        refused_by_rdma_core,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_statuses_map_to_variants() {
        assert_eq!(ForkStatus::from_raw(0), ForkStatus::Disabled);
        assert_eq!(ForkStatus::from_raw(1), ForkStatus::Enabled);
        assert_eq!(ForkStatus::from_raw(2), ForkStatus::Unneeded);
        assert_eq!(ForkStatus::from_raw(7), ForkStatus::Unknown(7));
        assert!(!ForkStatus::Disabled.is_fork_safe());
        assert!(ForkStatus::Enabled.is_fork_safe());
        assert!(ForkStatus::Unneeded.is_fork_safe());
        assert!(!ForkStatus::Unknown(7).is_fork_safe());
    }

    #[test]
    fn the_kernel_or_an_earlier_init_makes_the_call_unneeded() {
        for started in [false, true] {
            assert_eq!(plan(ForkStatus::Unneeded, started), Plan::Report);
            assert_eq!(plan(ForkStatus::Enabled, started), Plan::Report);
        }
    }

    #[test]
    fn only_a_first_call_reaches_rdma_core() {
        assert_eq!(plan(ForkStatus::Disabled, false), Plan::Call);
        assert_eq!(plan(ForkStatus::Unknown(9), false), Plan::Call);
        assert_eq!(plan(ForkStatus::Disabled, true), Plan::Refuse);
        assert_eq!(plan(ForkStatus::Unknown(9), true), Plan::Refuse);
        assert_eq!(
            called(0, || ForkStatus::Enabled).unwrap(),
            ForkStatus::Enabled
        );
    }

    #[test]
    fn late_calls_are_refused_by_name() {
        let ours = too_late(false);
        assert!(matches!(
            ours,
            Error::ForkInitTooLate {
                verb: "ibv_fork_init",
                refused_by_rdma_core: false
            }
        ));
        // rdma-core's own refusal: memory was registered before.
        let theirs = called(libc::EINVAL, || unreachable!()).unwrap_err();
        assert!(matches!(
            theirs,
            Error::ForkInitTooLate {
                verb: "ibv_fork_init",
                refused_by_rdma_core: true
            }
        ));
        for e in [ours, theirs] {
            assert!(e.to_string().starts_with("ibv_fork_init"), "{e}");
        }
    }

    #[test]
    fn other_failures_are_verb_errors() {
        let e = called(libc::ENOSYS, || unreachable!()).unwrap_err();
        assert_eq!(e.verb(), Some("ibv_fork_init"));
        assert_eq!(e.raw_os_error(), Some(libc::ENOSYS));
    }
}
