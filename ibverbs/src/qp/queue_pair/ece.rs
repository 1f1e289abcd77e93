//! Enhanced Connection Establishment (`ibv_query_ece`/`ibv_set_ece`): the
//! vendor options a queue pair offers and accepts, exchanged out of band
//! (or by rdma_cm) so that both ends enable only what both support.

use rdma_verbs_sys as sys;

use super::QueuePair;
use crate::error::{errno_error, Result};

/// A queue pair's ECE options (`struct ibv_ece`): the vendor (its IEEE
/// OUI) and a vendor-defined bit mask of options.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Ece {
    /// The IEEE OUI of the provider's vendor; 0 names no vendor (refused
    /// by [`QueuePair::set_ece`]'s verb).
    pub vendor_id: u32,
    /// The vendor's option bits.
    pub options: u32,
}

impl Ece {
    fn to_raw(self) -> sys::ibv_ece {
        sys::ibv_ece {
            vendor_id: self.vendor_id,
            options: self.options,
            comp_mask: 0,
        }
    }

    fn from_raw(raw: &sys::ibv_ece) -> Ece {
        Ece {
            vendor_id: raw.vendor_id,
            options: raw.options,
        }
    }
}

impl QueuePair {
    /// The ECE options this queue pair offers (before it is connected) or
    /// uses (after), to send to the peer.
    ///
    /// No device attribute announces ECE: the provider's answer is the
    /// capability check (rxe and every provider but mlx5 in rdma-core 44
    /// answer `EOPNOTSUPP`).
    ///
    /// # Errors
    /// [`Error::Verb`](crate::Error::Verb) naming `ibv_query_ece`:
    /// `EOPNOTSUPP` when the provider has no ECE.
    ///
    /// # References
    /// `ibv_query_ece(3)`
    #[doc(alias = "ibv_query_ece")]
    pub fn query_ece(&self) -> Result<Ece> {
        let mut raw = sys::ibv_ece {
            vendor_id: 0,
            options: 0,
            comp_mask: 0,
        };
        // SAFETY: live QP; `raw` is valid for writes during the call.
        let rc = unsafe { sys::ibv_query_ece(self.as_ptr(), &mut raw) };
        if rc != 0 {
            return Err(errno_error("ibv_query_ece", rc));
        }
        Ok(Ece::from_raw(&raw))
    }

    /// Asks the queue pair to use `ece` (typically the options the peer
    /// sent, masked by what this side supports) in its following state
    /// changes, and returns the options the provider accepted. Call it
    /// before connecting (the RTR and RTS transitions use it).
    ///
    /// Runs with the send-queue lock held, which state changes hold too,
    /// so the options never change during a transition.
    ///
    /// # Errors
    /// [`Error::Verb`](crate::Error::Verb) naming `ibv_set_ece`:
    /// `EOPNOTSUPP` when the provider has no ECE, and also — libibverbs'
    /// own check — when `ece.vendor_id` is 0; `EINVAL` for options the
    /// provider rejects.
    ///
    /// # References
    /// `ibv_set_ece(3)`
    #[doc(alias = "ibv_set_ece")]
    pub fn set_ece(&self, ece: Ece) -> Result<Ece> {
        let mut raw = ece.to_raw();
        let rc = {
            let _control = self.inner.control.lock();
            // SAFETY: live QP; `raw` is valid for reads and writes (the
            // accepted options come back in it) during the call.
            unsafe { sys::ibv_set_ece(self.as_ptr(), &mut raw) }
        };
        if rc != 0 {
            return Err(errno_error("ibv_set_ece", rc));
        }
        Ok(Ece::from_raw(&raw))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ece_round_trips_through_the_c_struct_with_no_comp_mask() {
        let e = Ece {
            vendor_id: 0x02c9,
            options: 0b101,
        };
        let raw = e.to_raw();
        assert_eq!(
            (raw.vendor_id, raw.options, raw.comp_mask),
            (0x02c9, 0b101, 0)
        );
        assert_eq!(Ece::from_raw(&raw), e);
    }
}
