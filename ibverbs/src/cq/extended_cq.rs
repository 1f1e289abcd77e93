//! Extended completion queues: `ibv_create_cq_ex` and start/next/end
//! polling that reads only the fields asked for.
//!
//! The polling functions are function pointers in `struct ibv_cq_ex` that
//! providers fill only for the fields requested at creation; they are
//! resolved (and checked non-NULL) once, when the CQ is created, so
//! [`CompletionQueue::poll`] never calls a NULL provider op.
//!
//! **Provider quirk.** The rxe provider of rdma-core before 55 advances its
//! consumer index one entry too far in `ibv_end_poll` after `ibv_next_poll`
//! returned `ENOENT` (fixed upstream in rdma-core 55, commit b78b414e0), so
//! later polls see phantom or lost completions. On rxe devices `poll`
//! therefore never drives `ibv_next_poll` to `ENOENT`: it takes one
//! completion per `ibv_start_poll`/`ibv_end_poll` cycle (the library cannot
//! read the installed rdma-core version at run time, so this holds for every
//! rxe device). Other providers get whole batches per cycle.

use std::ptr::NonNull;

use rdma_verbs_sys as sys;

use crate::cq::completion_queue::{CompletionQueue, Completions};
use crate::device::context::Context;
use crate::error::{ret_ptr, Error, Result};

bitflags::bitflags! {
    /// Fields an extended CQ reports (`IBV_WC_EX_WITH_*`, the `wc_flags` of
    /// `ibv_create_cq_ex`). `wr_id`, status, opcode, vendor error and the
    /// completion flags are always read.
    ///
    /// # References
    /// `ibv_create_cq_ex(3)`
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub struct CompletionFields: u64 {
        /// Bytes transferred.
        const BYTE_LEN = sys::ibv_create_cq_wc_flags::IBV_WC_EX_WITH_BYTE_LEN.0 as u64;
        /// Immediate data and invalidated rkeys.
        const IMM = sys::ibv_create_cq_wc_flags::IBV_WC_EX_WITH_IMM.0 as u64;
        /// Local QP number.
        const QP_NUM = sys::ibv_create_cq_wc_flags::IBV_WC_EX_WITH_QP_NUM.0 as u64;
        /// Source QP number (UD).
        const SRC_QP = sys::ibv_create_cq_wc_flags::IBV_WC_EX_WITH_SRC_QP.0 as u64;
        /// Source LID.
        const SLID = sys::ibv_create_cq_wc_flags::IBV_WC_EX_WITH_SLID.0 as u64;
        /// Service level.
        const SL = sys::ibv_create_cq_wc_flags::IBV_WC_EX_WITH_SL.0 as u64;
        /// DLID path bits.
        const DLID_PATH_BITS = sys::ibv_create_cq_wc_flags::IBV_WC_EX_WITH_DLID_PATH_BITS.0 as u64;
        /// Completion timestamp in device clock units (see
        /// [`DeviceAttrEx::hca_core_clock`](crate::device::DeviceAttrEx::hca_core_clock)).
        const COMPLETION_TIMESTAMP =
            sys::ibv_create_cq_wc_flags::IBV_WC_EX_WITH_COMPLETION_TIMESTAMP.0 as u64;
        /// Completion timestamp converted to wall-clock nanoseconds.
        const COMPLETION_TIMESTAMP_WALLCLOCK =
            sys::ibv_create_cq_wc_flags::IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK.0 as u64;
    }
}

impl CompletionFields {
    /// What a classic `ibv_wc` carries (`IBV_WC_STANDARD_FLAGS`).
    pub fn standard() -> CompletionFields {
        CompletionFields::BYTE_LEN
            | CompletionFields::IMM
            | CompletionFields::QP_NUM
            | CompletionFields::SRC_QP
            | CompletionFields::SLID
            | CompletionFields::SL
            | CompletionFields::DLID_PATH_BITS
    }
}

type Read32 = unsafe extern "C" fn(*mut sys::ibv_cq_ex) -> u32;
type Read8 = unsafe extern "C" fn(*mut sys::ibv_cq_ex) -> u8;
type Read64 = unsafe extern "C" fn(*mut sys::ibv_cq_ex) -> u64;

/// The resolved polling functions of an extended CQ.
pub(crate) struct ExCq {
    cq: NonNull<sys::ibv_cq_ex>,
    fields: CompletionFields,
    /// One completion per start/end cycle (see the module docs).
    one_per_cycle: bool,
    start: unsafe extern "C" fn(*mut sys::ibv_cq_ex, *mut sys::ibv_poll_cq_attr) -> i32,
    next: unsafe extern "C" fn(*mut sys::ibv_cq_ex) -> i32,
    end: unsafe extern "C" fn(*mut sys::ibv_cq_ex),
    opcode: unsafe extern "C" fn(*mut sys::ibv_cq_ex) -> sys::ibv_wc_opcode,
    vendor_err: Read32,
    wc_flags: Option<unsafe extern "C" fn(*mut sys::ibv_cq_ex) -> u32>,
    byte_len: Option<Read32>,
    imm: Option<Read32>,
    qp_num: Option<Read32>,
    src_qp: Option<Read32>,
    slid: Option<Read32>,
    sl: Option<Read8>,
    dlid_path_bits: Option<Read8>,
    pub(crate) ts: Option<Read64>,
}

/// Creates an extended CQ and resolves its polling functions.
pub(crate) fn create(
    ctx: &Context,
    cqe: u32,
    channel: *mut sys::ibv_comp_channel,
    comp_vector: i32,
    fields: CompletionFields,
    rxe: bool,
) -> Result<(NonNull<sys::ibv_cq>, ExCq)> {
    if fields.contains(
        CompletionFields::COMPLETION_TIMESTAMP | CompletionFields::COMPLETION_TIMESTAMP_WALLCLOCK,
    ) {
        return Err(Error::ConflictingOptions {
            first: "CompletionFields::COMPLETION_TIMESTAMP",
            second: "CompletionFields::COMPLETION_TIMESTAMP_WALLCLOCK",
        });
    }
    let mut attr = sys::ibv_cq_init_attr_ex {
        cqe,
        channel,
        comp_vector: comp_vector as u32,
        wc_flags: fields.bits(),
        ..Default::default()
    };
    // SAFETY: live context and channel; `attr` is valid; the CQ is destroyed
    // through its `ibv_cq` in CqInner's Drop (ibv_create_cq_ex(3)).
    let cq = unsafe { sys::ibv_create_cq_ex(ctx.as_ptr(), &mut attr) };
    let cq = ret_ptr("ibv_create_cq_ex", cq).map_err(|e| {
        let hint = crate::cq::completion_queue::create_hint(ctx, cqe, comp_vector).or_else(|| {
            matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP | libc::EINVAL))
                .then(|| format!("the provider may not offer the fields {fields:?}"))
        });
        e.with_hint(hint)
    })?;
    let c = cq.as_ptr();
    // SAFETY: valid extended CQ: reading the function pointers it set.
    let (start, next, end, opcode, vendor_err) = unsafe {
        (
            (*c).start_poll,
            (*c).next_poll,
            (*c).end_poll,
            (*c).read_opcode,
            (*c).read_vendor_err,
        )
    };
    let want = |f: CompletionFields| fields.contains(f);
    // SAFETY: as above.
    let ex = unsafe {
        ExCq {
            cq,
            fields,
            one_per_cycle: rxe,
            start: start.unwrap_or(missing_start),
            next: next.unwrap_or(missing_next),
            end: end.unwrap_or(missing_end),
            opcode: opcode.unwrap_or(missing_opcode),
            vendor_err: vendor_err.unwrap_or(zero32),
            wc_flags: (*c).read_wc_flags,
            byte_len: (*c)
                .read_byte_len
                .filter(|_| want(CompletionFields::BYTE_LEN)),
            imm: (*c).read_imm_data.filter(|_| want(CompletionFields::IMM)),
            qp_num: (*c).read_qp_num.filter(|_| want(CompletionFields::QP_NUM)),
            src_qp: (*c).read_src_qp.filter(|_| want(CompletionFields::SRC_QP)),
            slid: (*c).read_slid.filter(|_| want(CompletionFields::SLID)),
            sl: (*c).read_sl.filter(|_| want(CompletionFields::SL)),
            dlid_path_bits: (*c)
                .read_dlid_path_bits
                .filter(|_| want(CompletionFields::DLID_PATH_BITS)),
            ts: if want(CompletionFields::COMPLETION_TIMESTAMP) {
                (*c).read_completion_ts
            } else if want(CompletionFields::COMPLETION_TIMESTAMP_WALLCLOCK) {
                (*c).read_completion_wallclock_ns
            } else {
                None
            },
        }
    };
    // SAFETY: valid extended CQ.
    let base = unsafe { sys::ibv_cq_ex_to_cq(c) };
    let missing = [
        (
            start.is_none(),
            "an extended CQ without ibv_cq_ex::start_poll",
        ),
        (
            next.is_none(),
            "an extended CQ without ibv_cq_ex::next_poll",
        ),
        (end.is_none(), "an extended CQ without ibv_cq_ex::end_poll"),
        (
            opcode.is_none(),
            "an extended CQ without ibv_cq_ex::read_opcode",
        ),
        (
            ex.ts.is_none()
                && fields.intersects(
                    CompletionFields::COMPLETION_TIMESTAMP
                        | CompletionFields::COMPLETION_TIMESTAMP_WALLCLOCK,
                ),
            "an extended CQ without ibv_cq_ex::read_completion_ts",
        ),
    ];
    if let Some((_, what)) = missing.iter().find(|m| m.0) {
        // SAFETY: just created, never shared.
        unsafe { sys::ibv_destroy_cq(base) };
        return Err(Error::Unsupported(what));
    }
    let base = NonNull::new(base).ok_or(Error::Unsupported(
        "an extended CQ without its ibv_cq (ibv_cq_ex_to_cq returned NULL)",
    ))?;
    Ok((base, ex))
}

// Placeholders for pointers found NULL: `create` refuses the CQ before any
// of them could be called.
unsafe extern "C" fn missing_start(_: *mut sys::ibv_cq_ex, _: *mut sys::ibv_poll_cq_attr) -> i32 {
    libc::EOPNOTSUPP
}
unsafe extern "C" fn missing_next(_: *mut sys::ibv_cq_ex) -> i32 {
    libc::EOPNOTSUPP
}
unsafe extern "C" fn missing_end(_: *mut sys::ibv_cq_ex) {}
unsafe extern "C" fn missing_opcode(_: *mut sys::ibv_cq_ex) -> sys::ibv_wc_opcode {
    0
}
unsafe extern "C" fn zero32(_: *mut sys::ibv_cq_ex) -> u32 {
    0
}

impl ExCq {
    /// Reads the current completion into `wc` (and its timestamp).
    ///
    /// # Safety
    /// Between a successful start/next poll and the end of the cycle.
    unsafe fn read(&self, wc: &mut sys::ibv_wc, ts: &mut u64) {
        let c = self.cq.as_ptr();
        // SAFETY: the caller's contract; every pointer is set (checked at
        // creation, optional ones only called when present).
        unsafe {
            wc.wr_id = (*c).wr_id;
            wc.status = (*c).status;
            wc.opcode = (self.opcode)(c);
            wc.vendor_err = (self.vendor_err)(c);
            wc.wc_flags = self.wc_flags.map_or(0, |f| f(c));
            wc.byte_len = self.byte_len.map_or(0, |f| f(c));
            // imm_data and invalidated_rkey share the field; providers return
            // whichever the completion carries through read_imm_data.
            wc.__bindgen_anon_1.imm_data = self.imm.map_or(0, |f| f(c));
            wc.qp_num = self.qp_num.map_or(0, |f| f(c));
            wc.src_qp = self.src_qp.map_or(0, |f| f(c));
            wc.slid = self.slid.map_or(0, |f| f(c)) as u16;
            wc.sl = self.sl.map_or(0, |f| f(c));
            wc.dlid_path_bits = self.dlid_path_bits.map_or(0, |f| f(c));
            *ts = self.ts.map_or(0, |f| f(c));
        }
    }
}

impl crate::cq::completion_queue::CompletionQueueBuilder<'_> {
    /// Creates the CQ with `ibv_create_cq_ex`, reporting `fields`:
    /// [`CompletionQueue::poll`] then reads only these (and the completion
    /// timestamp when asked for).
    #[doc(alias = "ibv_create_cq_ex")]
    pub fn wc_fields(mut self, fields: CompletionFields) -> Self {
        self.wc_fields = Some(fields);
        self
    }
}

impl CompletionQueue {
    /// The fields of an extended CQ; `None` for a classic one.
    pub fn wc_fields(&self) -> Option<CompletionFields> {
        self.inner.ex.as_ref().map(|e| e.fields)
    }

    /// [`CompletionQueue::poll`] of an extended CQ: `ibv_start_poll`,
    /// `ibv_next_poll`, `ibv_end_poll`, reading the fields it was created
    /// with into `out` (and the timestamps into `out.stamps`): how many.
    /// An error after some entries were read returns those (they were
    /// taken from the CQ: their requests' buffers must come back); the
    /// next poll meets the error again.
    pub(crate) fn poll_extended(&self, ex: &ExCq, out: &mut Completions) -> Result<usize> {
        // As `poll_cq_paying`: the debts recorded before this poll began
        // are paid if it finds the CQ empty.
        let gen = self.debts_before_poll();
        let n = self.poll_extended_cycles(ex, out)?;
        if n == 0 {
            self.pay(gen);
        }
        Ok(n)
    }

    /// [`poll_extended`](Self::poll_extended) without the debts.
    fn poll_extended_cycles(&self, ex: &ExCq, out: &mut Completions) -> Result<usize> {
        let room = out.raw.len();
        if ex.ts.is_some() && out.stamps.len() < room {
            out.stamps.resize(room, 0);
        }
        let c = ex.cq.as_ptr();
        let mut n = 0;
        while n < room {
            let mut attr = sys::ibv_poll_cq_attr::default();
            // SAFETY: live extended CQ; `start` checked non-NULL at creation.
            let rc = unsafe { (ex.start)(c, &mut attr) };
            if rc == libc::ENOENT {
                break;
            }
            if rc != 0 {
                return if n > 0 {
                    Ok(n)
                } else {
                    Err(Error::from_errno("ibv_start_poll", rc))
                };
            }
            let mut failed = 0;
            loop {
                let mut stamp = 0;
                // SAFETY: a completion is current (start/next returned 0).
                unsafe { ex.read(&mut out.raw[n], &mut stamp) };
                if let Some(s) = out.stamps.get_mut(n) {
                    *s = stamp;
                }
                n += 1;
                if n == room || ex.one_per_cycle {
                    break;
                }
                // SAFETY: inside the cycle opened above.
                let rc = unsafe { (ex.next)(c) };
                if rc != 0 {
                    if rc != libc::ENOENT {
                        failed = rc;
                    }
                    break;
                }
            }
            // SAFETY: closes the cycle opened by a successful start_poll.
            unsafe { (ex.end)(c) };
            if failed != 0 {
                // `n` > 0: the cycle read at least one.
                return Ok(n);
            }
            if !ex.one_per_cycle {
                break;
            }
        }
        Ok(n)
    }

    /// [`CompletionQueue::poll_one`] of an extended CQ: one poll cycle,
    /// one completion.
    pub(crate) fn poll_one_extended(
        &self,
        ex: &ExCq,
    ) -> Result<Option<crate::cq::completion_queue::Completion>> {
        // As in `poll_extended`.
        let gen = self.debts_before_poll();
        let got = self.poll_one_extended_cycle(ex)?;
        if got.is_none() {
            self.pay(gen);
        }
        Ok(got)
    }

    /// [`poll_one_extended`](Self::poll_one_extended) without the debts.
    fn poll_one_extended_cycle(
        &self,
        ex: &ExCq,
    ) -> Result<Option<crate::cq::completion_queue::Completion>> {
        let c = ex.cq.as_ptr();
        let mut attr = sys::ibv_poll_cq_attr::default();
        // SAFETY: live extended CQ; `start` checked non-NULL at creation.
        let rc = unsafe { (ex.start)(c, &mut attr) };
        if rc == libc::ENOENT {
            return Ok(None);
        }
        if rc != 0 {
            return Err(Error::from_errno("ibv_start_poll", rc));
        }
        let mut wc = sys::ibv_wc::default();
        let mut ts = 0;
        // SAFETY: a completion is current (start_poll returned 0).
        unsafe { ex.read(&mut wc, &mut ts) };
        // SAFETY: closes the cycle opened by the successful start_poll.
        unsafe { (ex.end)(c) };
        Ok(Some(
            self.complete_one(&mut wc, ex.ts.is_some().then_some(ts)),
        ))
    }
}
