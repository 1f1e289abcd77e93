//! Changing a CQ after creation: its size (`ibv_resize_cq`) and its event
//! moderation (`ibv_modify_cq`).
//!
//! Resizing keeps the CQ's invariant (DESIGN.md, "CQ resize"): the depths
//! asked of the queues reporting to it never add up to more than the
//! capacity recorded, and the capacity recorded never exceeds the CQ's real
//! one. Both the check and the update run with the registry write-locked,
//! as `register` does, so no queue pair is created against a capacity
//! that is changing.

use std::sync::atomic::Ordering;

use rdma_verbs_sys as sys;

use super::CompletionQueue;
use crate::error::{errno_error, Error, Result};

impl CompletionQueue {
    /// Resizes the CQ to hold at least `cqe` completions and returns its
    /// new capacity (also [`capacity`](Self::capacity) from now on), which
    /// the provider may round up (rxe: to a power of two, minus one) or,
    /// when shrinking, leave as it was (`ibv_resize_cq(3)`).
    ///
    /// Completions already in the CQ stay there and are polled as before
    /// (providers copy them into the new queue). The check is against the
    /// depths asked of the queues, not against the completions queued
    /// now: rxe refuses a size below the latter only, and queues a send's
    /// completion some time after `ibv_post_send` returned (a kernel work
    /// item), so a shrink right after posting can be accepted there and
    /// the late completions overrun the CQ (what rdma-core's pyverbs
    /// `test_resize_cq` trips over on rxe). Polling from other
    /// threads may go on meanwhile: the provider serialises the two, and
    /// creating or destroying a queue pair on this CQ waits for the resize.
    ///
    /// # Errors
    /// * [`Error::CqResizeTooSmall`] when `cqe` is below the depths asked
    ///   of the queues reporting here (queue pairs' send and receive
    ///   queues, an SRQ once): the CQ could overrun and lose completions,
    ///   and with them buffers. Checked before the verb; nothing changed.
    /// * [`Error::OutOfRange`] when `cqe` exceeds `i32::MAX`.
    /// * [`Error::Verb`] naming `ibv_resize_cq`: `EINVAL` when `cqe`
    ///   exceeds the device's `max_cqe` or is below the completions in the
    ///   CQ now (rxe checks both), `EOPNOTSUPP` when the provider cannot
    ///   resize. After a failure the recorded capacity is the smaller of
    ///   the old one and what the CQ reports.
    ///
    /// # References
    /// `ibv_resize_cq(3)`
    ///
    /// # Example
    /// ```no_run
    /// # fn demo(ctx: &rdma_verbs::Context) -> rdma_verbs::Result<()> {
    /// let cq = ctx.create_cq(16).build()?;
    /// let got = cq.resize(100)?; // at least 100 (127 on rxe)
    /// assert!(got >= 100 && got == cq.capacity());
    /// # Ok(()) }
    /// ```
    #[doc(alias = "ibv_resize_cq")]
    pub fn resize(&self, cqe: u32) -> Result<u32> {
        let asked = i32::try_from(cqe).map_err(|_| Error::OutOfRange {
            what: "cqe",
            value: u64::from(cqe),
            max: i32::MAX as u64,
        })?;
        // Held until the new capacity is recorded: no queue registers
        // against the old one meanwhile.
        let accounting = self.inner.accounting.lock();
        check_resize(cqe, accounting.depth_sum(), accounting.owed())?;
        let old = self.inner.cqe.load(Ordering::Relaxed);
        // SAFETY: live CQ; the provider serialises this with polling.
        let rc = unsafe { sys::ibv_resize_cq(self.as_ptr(), asked) };
        // SAFETY: live CQ; libibverbs wrote `cqe` during the call (the
        // size the kernel granted), and only resizes, which all hold
        // `accounting`'s lock, write it.
        let reported = unsafe { (*self.as_ptr()).cqe };
        let (capacity, result) = after_resize(old, reported, rc);
        self.inner.cqe.store(capacity, Ordering::Relaxed);
        drop(accounting);
        result.map_err(|e| {
            let max = self
                .context()
                .query_device()
                .map_or(u32::MAX, |d| d.max_cqe());
            e.with_hint(resize_hint(cqe, max, old))
        })
    }

    /// Sets the CQ's event moderation: a completion event is raised after
    /// `count` completions or `period_us` microseconds, whichever comes
    /// first (`ibv_modify_cq` with `IBV_CQ_ATTR_MODERATE`). Moderation only
    /// delays events; completions are polled as before.
    ///
    /// The device's limits (`ibv_device_attr_ex::cq_mod_caps`) are read
    /// first: a device reporting none (rxe, which has no `modify_cq`) is
    /// refused by name before the verb.
    ///
    /// # Errors
    /// * [`Error::DeviceLacks`] naming `ibv_modify_cq` when the device
    ///   reports no CQ moderation (both limits 0).
    /// * [`Error::OutOfRange`] when `count` or `period_us` exceeds the
    ///   device's `max_cq_count` or `max_cq_period`.
    /// * [`Error::Verb`] naming `ibv_query_device_ex` or `ibv_modify_cq`.
    ///
    /// # References
    /// `ibv_modify_cq(3)`, `ibv_query_device_ex(3)`
    #[doc(alias = "ibv_modify_cq")]
    pub fn set_moderation(&self, count: u16, period_us: u16) -> Result<()> {
        let caps = self.context().query_device_ex()?.as_raw().cq_mod_caps;
        check_moderation(caps, count, period_us)?;
        let mut attr = sys::ibv_modify_cq_attr {
            attr_mask: sys::ibv_cq_attr_mask::IBV_CQ_ATTR_MODERATE.0,
            moderate: sys::ibv_moderate_cq {
                cq_count: count,
                cq_period: period_us,
            },
        };
        // SAFETY: live CQ; `attr` is valid for the call.
        let rc = unsafe { sys::ibv_modify_cq(self.as_ptr(), &mut attr) };
        if rc == 0 {
            Ok(())
        } else {
            Err(errno_error("ibv_modify_cq", rc))
        }
    }
}

/// Refuses a resize to `cqe` entries below the `registered` depths.
fn check_resize(cqe: u32, depths: u64, owed: u64) -> Result<()> {
    let registered = depths + owed;
    if u64::from(cqe) < registered {
        return Err(Error::CqResizeTooSmall {
            verb: "ibv_resize_cq",
            requested: cqe,
            registered,
            owed,
        });
    }
    Ok(())
}

/// The capacity to record after `ibv_resize_cq` returned `rc` on a CQ of
/// `old` entries that now reports `reported`, and the call's result (the
/// new capacity). After a success the CQ holds `reported`; after a
/// failure it may hold either (rxe's provider fails after the kernel
/// resized when it cannot map the new queue), so the smaller is recorded:
/// the recorded capacity must never exceed the real one.
fn after_resize(old: u32, reported: i32, rc: i32) -> (u32, Result<u32>) {
    let reported = u32::try_from(reported).unwrap_or(0);
    if rc == 0 {
        (reported, Ok(reported))
    } else {
        (old.min(reported), Err(errno_error("ibv_resize_cq", rc)))
    }
}

/// The likely cause of a failed resize to `cqe` entries.
fn resize_hint(cqe: u32, max_cqe: u32, old: u32) -> Option<String> {
    Some(if cqe > max_cqe {
        format!("cqe {cqe} exceeds the device's max_cqe {max_cqe}")
    } else if cqe < old {
        format!("the CQ may hold more than {cqe} completions now: poll them first")
    } else {
        return None;
    })
}

/// Refuses moderation the device's `caps` do not allow.
fn check_moderation(caps: sys::ibv_cq_moderation_caps, count: u16, period: u16) -> Result<()> {
    if caps.max_cq_count == 0 && caps.max_cq_period == 0 {
        return Err(Error::DeviceLacks {
            verb: "ibv_modify_cq",
            capability: "CQ moderation (cq_mod_caps.max_cq_count and max_cq_period are 0)",
        });
    }
    for (what, value, max) in [
        ("cq_count", count, caps.max_cq_count),
        ("cq_period", period, caps.max_cq_period),
    ] {
        if value > max {
            return Err(Error::OutOfRange {
                what,
                value: value.into(),
                max: max.into(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resize_keeps_room_for_every_registered_depth() {
        check_resize(16, 16, 0).unwrap();
        check_resize(u32::MAX, 16, 0).unwrap();
        check_resize(0, 0, 0).unwrap();
        let e = check_resize(15, 16, 0).unwrap_err();
        assert!(matches!(
            e,
            Error::CqResizeTooSmall {
                verb: "ibv_resize_cq",
                requested: 15,
                registered: 16,
                owed: 0,
            }
        ));
        // Registered depths beyond u32 (many queues) never wrap.
        assert!(check_resize(u32::MAX, u64::from(u32::MAX) + 1, 0).is_err());
        // What destroyed queues may have left queued counts until paid.
        check_resize(16, 10, 6).unwrap();
        let e = check_resize(15, 10, 6).unwrap_err();
        assert!(matches!(
            e,
            Error::CqResizeTooSmall {
                registered: 16,
                owed: 6,
                ..
            }
        ));
        assert!(
            e.to_string().contains("including 6 that destroyed queues"),
            "{e}"
        );
    }

    #[test]
    fn the_recorded_capacity_never_exceeds_the_real_one() {
        assert_eq!(after_resize(15, 127, 0).0, 127);
        assert_eq!(after_resize(127, 15, 0).0, 15);
        assert_eq!(after_resize(127, 31, 0).1.unwrap(), 31);
        // A failure: the smaller of old and reported.
        let (cap, r) = after_resize(63, 255, libc::ENOMEM);
        assert_eq!(cap, 63);
        assert_eq!(r.unwrap_err().verb(), Some("ibv_resize_cq"));
        assert_eq!(after_resize(63, 31, libc::EINVAL).0, 31);
        assert_eq!(after_resize(63, -1, libc::EINVAL).0, 0);
    }

    #[test]
    fn resize_hints_name_the_limit() {
        assert!(resize_hint(1 << 20, 1 << 16, 15)
            .unwrap()
            .contains("max_cqe"));
        assert!(resize_hint(3, 1 << 16, 15).unwrap().contains("poll"));
        assert_eq!(resize_hint(31, 1 << 16, 15), None);
    }

    #[test]
    fn moderation_is_checked_against_the_device_limits() {
        let none = sys::ibv_cq_moderation_caps::default();
        let e = check_moderation(none, 1, 1).unwrap_err();
        assert!(matches!(
            e,
            Error::DeviceLacks {
                verb: "ibv_modify_cq",
                ..
            }
        ));
        assert!(e.to_string().starts_with("ibv_modify_cq"), "{e}");
        let caps = sys::ibv_cq_moderation_caps {
            max_cq_count: 64,
            max_cq_period: 100,
        };
        check_moderation(caps, 64, 100).unwrap();
        check_moderation(caps, 0, 0).unwrap();
        assert!(matches!(
            check_moderation(caps, 65, 1),
            Err(Error::OutOfRange {
                what: "cq_count",
                value: 65,
                max: 64
            })
        ));
        assert!(matches!(
            check_moderation(caps, 1, 101),
            Err(Error::OutOfRange {
                what: "cq_period",
                ..
            })
        ));
    }
}
