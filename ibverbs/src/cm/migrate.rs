//! Moving an rdma_cm id to another event channel (`rdma_migrate_id`).
//!
//! librdmacm's calls on an id read `id->channel` (its fd), the destroy
//! included, so the channel an id is on must stay open as long as the id.
//! The id keeps every channel it has been on (`IdShared::channels`), the
//! new one added *before* the verb: whatever librdmacm's `id->channel` is
//! at any moment — during the move too — the id holds it. They close when
//! the id is destroyed (or never, if that fails). A channel the id left
//! is therefore only closed with the id: a bounded cost (one per distinct
//! channel) for never having to know when librdmacm stopped using it.
//!
//! `rdma_migrate_id` moves the id's unread events to the new channel and
//! waits until every event of the id already read from the old one was
//! acknowledged. This crate acknowledges an event before
//! [`EventChannel::get_event`] returns it and never calls back into the
//! application in between, so the wait is bounded by the event being
//! handled on another thread, never by the application.

use std::sync::Arc;

use rdma_verbs_sys as sys;

use super::cm_id::{neg_errno, CmId};
use super::EventChannel;
use crate::error::{Error, Result};

impl CmId {
    /// Moves the id to `channel`: its events, including those not yet read
    /// from its current channel, arrive on `channel` from now on (and a
    /// listening id's connect requests, whose new ids start there). Returns
    /// once every event of the id already read from the old channel was
    /// handled (this crate acknowledges events as it reads them).
    ///
    /// The id keeps `channel` open, and keeps the channels it was on before
    /// open too, until it is destroyed (see the module source: librdmacm may
    /// still read them).
    ///
    /// # Errors
    /// [`Error::Unsupported`] for a synchronous id ([`CmId::new_sync`]);
    /// [`Error::Verb`] naming `rdma_migrate_id`.
    ///
    /// # References
    /// `rdma_migrate_id(3)`
    #[doc(alias = "rdma_migrate_id")]
    pub fn migrate(&self, channel: &EventChannel) -> Result<()> {
        if self.is_sync() {
            return Err(Error::Unsupported(
                "rdma_migrate_id of a synchronous rdma_cm id",
            ));
        }
        {
            let mut kept = self
                .shared()
                .channels
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            if !kept.iter().any(|c| Arc::ptr_eq(&c.inner, &channel.inner)) {
                kept.push(channel.clone());
            }
        }
        // SAFETY: live id; `channel` is open and now kept by the id for as
        // long as the id lives (above).
        let rc = unsafe { sys::rdma_migrate_id(self.id(), channel.inner.ch.as_ptr()) };
        neg_errno("rdma_migrate_id", rc)
    }
}
