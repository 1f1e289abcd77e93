//! Work completions: typed status and opcode, byte counts, immediates.

use rdma_verbs_sys as sys;

use crate::error::Error;

use crate::types::device_enum;
use crate::types::WcStatus;

device_enum! {
    /// What a completed work request did.
    WcOpcode {
        /// Send.
        Send = sys::IBV_WC_SEND,
        /// RDMA write.
        RdmaWrite = sys::IBV_WC_RDMA_WRITE,
        /// RDMA read.
        RdmaRead = sys::IBV_WC_RDMA_READ,
        /// Atomic compare-and-swap.
        CompSwap = sys::IBV_WC_COMP_SWAP,
        /// Atomic fetch-and-add.
        FetchAdd = sys::IBV_WC_FETCH_ADD,
        /// Memory window bind.
        BindMw = sys::IBV_WC_BIND_MW,
        /// Local invalidate.
        LocalInv = sys::IBV_WC_LOCAL_INV,
        /// TCP segmentation offload send.
        Tso = sys::IBV_WC_TSO,
        /// Flush (rdma-core 45 or newer).
        Flush = sys::IBV_WC_FLUSH,
        /// Atomic write.
        AtomicWrite = sys::IBV_WC_ATOMIC_WRITE,
        /// Receive.
        Recv = sys::IBV_WC_RECV,
        /// Receive of an RDMA write with immediate.
        RecvRdmaWithImm = sys::IBV_WC_RECV_RDMA_WITH_IMM,
    }
}

/// A work completion (`struct ibv_wc`): plain data, cheap to copy.
#[derive(Clone, Copy, Default)]
#[repr(transparent)]
pub struct WorkCompletion {
    pub(crate) raw: sys::ibv_wc,
}

impl WorkCompletion {
    /// Views a raw entry.
    #[inline]
    pub(crate) fn from_raw_ref(raw: &sys::ibv_wc) -> &WorkCompletion {
        // SAFETY: WorkCompletion is repr(transparent) over ibv_wc.
        unsafe { &*(raw as *const sys::ibv_wc).cast::<WorkCompletion>() }
    }

    /// The raw entries of `wcs`.
    #[inline]
    pub(crate) fn raw_slice_mut(wcs: &mut [WorkCompletion]) -> &mut [sys::ibv_wc] {
        // SAFETY: WorkCompletion is repr(transparent) over ibv_wc, so the
        // slices have the same layout; the borrow is carried over.
        unsafe { std::slice::from_raw_parts_mut(wcs.as_mut_ptr().cast(), wcs.len()) }
    }

    /// The work request id: the one the request was posted with (the
    /// safe polls give each entry its caller's `wr_id` back; an entry from
    /// [`poll_raw`](crate::CompletionQueue::poll_raw) carries what the raw
    /// request was posted with).
    #[inline]
    pub fn wr_id(&self) -> u64 {
        self.raw.wr_id
    }
    /// Status.
    #[inline]
    pub fn status(&self) -> WcStatus {
        WcStatus::from_raw(self.raw.status)
    }
    /// Whether the status is success.
    #[inline]
    pub fn is_success(&self) -> bool {
        self.raw.status == sys::IBV_WC_SUCCESS
    }
    /// The opcode (only meaningful on success, as in C).
    #[inline]
    pub fn opcode(&self) -> WcOpcode {
        WcOpcode::from_raw(self.raw.opcode)
    }
    /// Vendor error syndrome.
    #[inline]
    pub fn vendor_err(&self) -> u32 {
        self.raw.vendor_err
    }
    /// Bytes received or transferred.
    #[inline]
    pub fn byte_len(&self) -> u32 {
        self.raw.byte_len
    }
    /// Immediate data in host byte order, when the completion carries it.
    #[inline]
    pub fn imm_data(&self) -> Option<u32> {
        if self.raw.wc_flags & sys::ibv_wc_flags::IBV_WC_WITH_IMM.0 == 0 {
            return None;
        }
        // SAFETY: with IBV_WC_WITH_IMM the union holds `imm_data` (network order).
        Some(u32::from_be(unsafe { self.raw.__bindgen_anon_1.imm_data }))
    }
    /// Invalidated rkey, when the completion carries one.
    #[inline]
    pub fn invalidated_rkey(&self) -> Option<u32> {
        if self.raw.wc_flags & sys::ibv_wc_flags::IBV_WC_WITH_INV.0 == 0 {
            return None;
        }
        // SAFETY: with IBV_WC_WITH_INV the union holds `invalidated_rkey`.
        Some(unsafe { self.raw.__bindgen_anon_1.invalidated_rkey })
    }
    /// Local QP number the completion belongs to.
    #[inline]
    pub fn qp_num(&self) -> u32 {
        self.raw.qp_num
    }
    /// Source QP number (UD receives).
    #[inline]
    pub fn src_qp(&self) -> u32 {
        self.raw.src_qp
    }
    /// Whether a GRH precedes the payload (UD receives: the first 40 bytes
    /// of the receive buffer).
    #[inline]
    pub fn has_grh(&self) -> bool {
        self.raw.wc_flags & sys::ibv_wc_flags::IBV_WC_GRH.0 != 0
    }
    /// Source LID (InfiniBand).
    #[inline]
    pub fn slid(&self) -> u16 {
        self.raw.slid
    }
    /// Service level.
    #[inline]
    pub fn sl(&self) -> u8 {
        self.raw.sl
    }
    /// P_Key index (GSI QPs).
    #[inline]
    pub fn pkey_index(&self) -> u16 {
        self.raw.pkey_index
    }
    /// Raw `wc_flags`.
    #[inline]
    pub fn wc_flags(&self) -> u32 {
        self.raw.wc_flags
    }
    /// `Ok(())` on success, else [`Error::WorkCompletion`].
    ///
    /// # Errors
    /// [`Error::WorkCompletion`] with the status.
    #[inline]
    pub fn result(&self) -> Result<(), Error> {
        if self.is_success() {
            Ok(())
        } else {
            Err(Error::WorkCompletion {
                status: self.status(),
                wr_id: self.raw.wr_id,
                vendor_err: self.raw.vendor_err,
            })
        }
    }
    /// The raw C struct.
    #[inline]
    pub fn as_raw(&self) -> &sys::ibv_wc {
        &self.raw
    }
}

impl std::fmt::Debug for WorkCompletion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkCompletion")
            .field("wr_id", &self.raw.wr_id)
            .field("status", &self.status())
            .field("opcode", &self.opcode())
            .field("byte_len", &self.byte_len())
            .field("imm_data", &self.imm_data())
            .field("qp_num", &self.qp_num())
            .finish()
    }
}
