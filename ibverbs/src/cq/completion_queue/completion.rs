//! What a poll hands back to keep: a [`Completion`], the raw entry together
//! with the buffers its request owned; and the storage a poll writes into
//! ([`Completions`]).

use rdma_verbs_sys as sys;

use crate::error::Result;
use crate::memory::buffer::{Buf, SgList};

use crate::cq::work_completion::WorkCompletion;
use crate::inflight::owner::Owner;
use crate::types::Gid;

/// Decodes the source GID of a 40-byte GRH area (see [`Completion::source_gid`]).
pub(crate) fn grh_source_gid(grh: &[u8; 40]) -> Option<Gid> {
    if grh[0] >> 4 == 6 {
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&grh[8..24]);
        Some(Gid(gid))
    } else if grh[20] >> 4 == 4 {
        let v4: [u8; 4] = grh[32..36].try_into().ok()?;
        Some(Gid::from(std::net::Ipv4Addr::from(v4)))
    } else {
        None
    }
}

/// Takes the only buffer of `sg` if `want` accepts it, else leaves `sg`
/// as it was.
#[inline]
pub(crate) fn sg_take_one_if(sg: &mut SgList, want: impl FnOnce(&Buf) -> bool) -> Option<Buf> {
    let only = match &*sg {
        SgList::One(b) => b,
        SgList::Many(v) if v.len() == 1 => &v[0],
        _ => return None,
    };
    if !want(only) {
        return None;
    }
    match std::mem::take(sg) {
        SgList::One(b) => Some(b),
        SgList::Many(mut v) => v.pop(),
        SgList::Empty => None,
    }
}

/// The sender's GID of a UD receive with a GRH, from the first buffer of
/// `sg` (see [`Completion::source_gid`]).
pub(crate) fn source_gid_of(wc: &WorkCompletion, sg: &SgList) -> Option<Gid> {
    if !wc.has_grh() {
        return None;
    }
    let first = sg.iter().next()?;
    let mut grh = [0u8; 40];
    first.copy_to_slice(0, &mut grh).ok()?;
    grh_source_gid(&grh)
}

/// A work completion together with the buffers its request owned, kept
/// beyond the poll ([`CompletionRef::into_owned`](crate::cq::CompletionRef::into_owned),
/// [`CompletionQueue::poll_one`](crate::CompletionQueue::poll_one)).
///
/// Dereferences to [`WorkCompletion`] for status, opcode, byte length,
/// immediate data, source QP, …; its `wr_id` is the caller's. Small enough
/// (at most 128 bytes, checked by a test) to be moved without a `memcpy`
/// call.
pub struct Completion {
    /// The raw entry, its `wr_id` the caller's.
    wc: WorkCompletion,
    /// The request's buffers (address handles and window bindings it kept
    /// alive were released when it was claimed). Dropped by `Drop` only
    /// when not empty: the common empty case costs no call.
    sg: std::mem::ManuallyDrop<SgList>,
    /// The completion timestamp (0 unless `stamped`).
    stamp: u64,
    /// Who posted the request (`None`: an orphan; 0: the caller).
    owner: Option<u8>,
    stamped: bool,
}

impl Drop for Completion {
    #[inline]
    fn drop(&mut self) {
        if !matches!(*self.sg, SgList::Empty) {
            // SAFETY: `sg` is taken only here, once, and never used after.
            drop_buffers(unsafe { std::mem::ManuallyDrop::take(&mut self.sg) });
        }
    }
}

/// The buffers a dropped [`Completion`] still held (out of line).
#[inline(never)]
fn drop_buffers(sg: SgList) {
    drop(sg);
}

impl std::ops::Deref for Completion {
    type Target = WorkCompletion;
    fn deref(&self) -> &WorkCompletion {
        &self.wc
    }
}

impl Completion {
    /// A completion of entry `raw` (its `wr_id` the caller's already) with
    /// the buffers its request left; `owner` `None` for an orphan.
    #[inline(always)]
    pub(crate) fn new(raw: sys::ibv_wc, sg: SgList, stamp: Option<u64>, owner: Option<u8>) -> Self {
        Completion {
            wc: WorkCompletion { raw },
            sg: std::mem::ManuallyDrop::new(sg),
            stamp: stamp.unwrap_or(0),
            owner,
            stamped: stamp.is_some(),
        }
    }

    /// Sets the timestamp (an extended CQ's `poll_one`).
    pub(crate) fn set_timestamp(&mut self, t: u64) {
        self.stamp = t;
        self.stamped = true;
    }

    /// Whether its request was marked as `owner`'s
    /// ([`SendRequest::owner`](crate::SendRequest::owner)); never for an
    /// orphan.
    #[inline]
    pub fn is_owned_by(&self, owner: Owner) -> bool {
        self.owner == Some(owner.tag())
    }

    /// The `wr_id` given when posting.
    #[inline]
    pub fn wr_id(&self) -> u64 {
        self.wc.raw.wr_id
    }
    /// The raw work completion.
    #[inline]
    pub fn wc(&self) -> &WorkCompletion {
        &self.wc
    }
    /// The completion timestamp, when polled from a CQ created with
    /// [`CompletionFields::COMPLETION_TIMESTAMP`](crate::cq::CompletionFields::COMPLETION_TIMESTAMP)
    /// (device clock units) or `COMPLETION_TIMESTAMP_WALLCLOCK` (ns).
    #[inline]
    pub fn timestamp(&self) -> Option<u64> {
        self.stamped.then_some(self.stamp)
    }
    /// Whether no posted request matched (raw-path requests, or a stale
    /// completion of a destroyed or reset queue).
    #[inline]
    pub fn is_orphan(&self) -> bool {
        self.owner.is_none()
    }
    /// Takes the scatter/gather list back (every buffer of the request).
    #[inline]
    pub fn take_buffers(&mut self) -> SgList {
        std::mem::take(&mut *self.sg)
    }
    /// Takes the buffer back when the request had exactly one; `None`
    /// otherwise, the buffers left in the completion for
    /// [`take_buffers`](Self::take_buffers).
    #[inline]
    pub fn take_buf(&mut self) -> Option<Buf> {
        sg_take_one_if(&mut self.sg, |_| true)
    }
    /// Takes the buffer back as a [`LocalBuffer`](crate::LocalBuffer): when
    /// the request had exactly one buffer and it is local. Otherwise
    /// `None`, and the buffers stay in the completion.
    #[inline]
    pub fn take_local(&mut self) -> Option<crate::memory::buffer::LocalBuffer> {
        sg_take_one_if(&mut self.sg, |b| matches!(b, Buf::Local(_))).and_then(Buf::into_local)
    }
    /// Takes the buffer back as a [`SharedBuffer`](crate::SharedBuffer):
    /// when the request had exactly one buffer and it is shared. Otherwise
    /// `None`, and the buffers stay in the completion.
    #[inline]
    pub fn take_shared(&mut self) -> Option<crate::memory::buffer::SharedBuffer> {
        sg_take_one_if(&mut self.sg, |b| matches!(b, Buf::Shared(_))).and_then(Buf::into_shared)
    }
    /// For a UD receive with a GRH: the sender's GID, decoded from the
    /// 40-byte GRH area at the start of the receive buffer. An IPv6/IB GRH
    /// (IP version 6 in the first nibble) carries the source GID in bytes
    /// 8..24; RoCE v2 over IPv4 leaves bytes 0..20 zero and puts the IPv4
    /// header in bytes 20..40, whose source address (bytes 32..36) becomes
    /// the IPv4-mapped GID. `None` without a GRH or for anything else.
    pub fn source_gid(&self) -> Option<Gid> {
        source_gid_of(&self.wc, &self.sg)
    }
    /// `Ok(())` on success, else [`Error::WorkCompletion`](crate::Error::WorkCompletion)
    /// with the caller's `wr_id`.
    ///
    /// # Errors
    /// [`Error::WorkCompletion`](crate::Error::WorkCompletion).
    #[inline]
    pub fn result(&self) -> Result<()> {
        self.wc.result()
    }
}

impl std::fmt::Debug for Completion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Completion")
            .field("wr_id", &self.wr_id())
            .field("status", &self.wc.status())
            .field("opcode", &self.wc.opcode())
            .field("byte_len", &self.wc.byte_len())
            .field("imm_data", &self.wc.imm_data())
            .field("buffers", &(!self.is_orphan()).then(|| self.sg.len()))
            .finish()
    }
}

/// Caller-provided storage a poll writes the provider's entries into
/// (allocated once, reused): [`CompletionQueue::poll`](crate::CompletionQueue::poll)
/// takes up to its capacity and lends them out as a
/// [`Polled`](crate::cq::Polled) batch.
pub struct Completions {
    pub(crate) raw: Box<[sys::ibv_wc]>,
    /// Timestamps read from an extended CQ, by entry (allocated by the
    /// first such poll).
    pub(crate) stamps: Vec<u64>,
}

impl Completions {
    /// Room for `capacity` completions (at least 1).
    pub fn with_capacity(capacity: usize) -> Completions {
        Completions {
            raw: vec![sys::ibv_wc::default(); capacity.max(1)].into_boxed_slice(),
            stamps: Vec::new(),
        }
    }

    /// How many completions one poll can take.
    pub fn capacity(&self) -> usize {
        self.raw.len()
    }
}

impl std::fmt::Debug for Completions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Completions")
            .field("capacity", &self.capacity())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::{grh_source_gid, Completion};

    #[test]
    fn completion_moves_without_memcpy() {
        // Above 128 bytes a move becomes a `memcpy` call.
        assert!(std::mem::size_of::<Completion>() <= 128);
        assert!(std::mem::size_of::<Option<Completion>>() <= 128);
    }

    #[test]
    fn grh_ipv6_and_roce_v2_ipv4() {
        let mut v6 = [0u8; 40];
        v6[0] = 0x60;
        v6[8..24].copy_from_slice(&"fe80::1".parse::<std::net::Ipv6Addr>().unwrap().octets());
        assert_eq!(grh_source_gid(&v6).unwrap().to_string(), "fe80::1");
        let mut v4 = [0u8; 40];
        v4[20] = 0x45;
        v4[32..36].copy_from_slice(&[10, 0, 2, 15]);
        assert_eq!(grh_source_gid(&v4).unwrap().to_string(), "::ffff:10.0.2.15");
        assert_eq!(grh_source_gid(&[0u8; 40]), None);
    }
}
