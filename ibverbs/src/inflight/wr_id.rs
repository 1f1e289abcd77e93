//! The one `wr_id` layout the device sees for a request posted through
//! the safe API, and the states of a store slot.
//!
//! ```text
//! bit 63     1: the library's (the raw path's contract keeps it clear)
//! bits 62..32 generation: the lap of the queue's ring (wraps at 2^31)
//! bits 31..27 segment of the store
//! bits 26..0  offset in the segment
//! ```
//!
//! While its request is outstanding a slot's state *is* this `wr_id`, so
//! one compare-and-swap of the completion's `wr_id` claims the slot and
//! rejects a stale (another generation), duplicate (claimed already) or
//! foreign one. Every other state has bit 63 clear.

/// Bit 63: a `wr_id` of the safe path.
pub(crate) const OURS: u64 = 1 << 63;
/// Bits of the offset in a segment.
pub(crate) const OFFSET_BITS: u32 = 27;
/// The offset's mask.
pub(crate) const OFFSET_MASK: u64 = (1 << OFFSET_BITS) - 1;
/// The segment's mask (after shifting by [`OFFSET_BITS`]).
pub(crate) const SEGMENT_MASK: u64 = 0x1f;
/// The generation's mask (after shifting by 32).
pub(crate) const GEN_MASK: u32 = 0x7fff_ffff;

/// A slot no request holds: its owner may post into it.
pub(crate) const FREE: u64 = 0;
/// A slot whose completion a poller claimed: the poller owns it until it
/// stores [`FREE`].
pub(crate) const CLAIMING: u64 = 1;
/// Bit 1 marks a slot held after a move to RESET (bits 62..32: the ring's
/// generation then): the CQ may still hold the completion of the request
/// it had, so it is not posted into until the CQ was found empty.
const HELD_BIT: u64 = 2;

/// The `wr_id` of offset `offset` of segment `segment` in generation `gen`.
#[inline(always)]
pub(crate) const fn encode(gen: u32, segment: u32, offset: u32) -> u64 {
    OURS | ((gen & GEN_MASK) as u64) << 32
        | (segment as u64) << OFFSET_BITS
        | offset as u64 & OFFSET_MASK
}

/// A `wr_id` of the safe path's segment and offset; `None` for any other.
#[inline(always)]
pub(crate) const fn place(wr_id: u64) -> Option<(u32, u32)> {
    if wr_id & OURS == 0 {
        return None;
    }
    Some((
        ((wr_id >> OFFSET_BITS) & SEGMENT_MASK) as u32,
        (wr_id & OFFSET_MASK) as u32,
    ))
}

/// The generation of a safe path's `wr_id`.
#[inline(always)]
pub(crate) const fn generation(wr_id: u64) -> u32 {
    (wr_id >> 32) as u32 & GEN_MASK
}

/// The state of a slot held after a reset of a ring in generation `gen`.
#[inline]
pub(crate) const fn held(gen: u32) -> u64 {
    ((gen & GEN_MASK) as u64) << 32 | HELD_BIT
}

/// Whether `state` is an outstanding request's `wr_id`.
#[inline(always)]
pub(crate) const fn is_outstanding(state: u64) -> bool {
    state & OURS != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_field_round_trips_and_states_stay_apart() {
        for (gen, seg, off) in [(0, 0, 0), (1, 3, 17), (GEN_MASK, 21, (1 << 27) - 1)] {
            let id = encode(gen, seg, off);
            assert!(is_outstanding(id));
            assert_eq!(place(id), Some((seg, off)));
            assert_eq!(generation(id), gen);
        }
        // The generation wraps within its bits, never into bit 63's.
        assert_eq!(generation(encode(GEN_MASK + 1, 0, 0)), 0);
        for state in [FREE, CLAIMING, held(0), held(GEN_MASK)] {
            assert!(!is_outstanding(state));
            assert_eq!(place(state), None);
        }
        assert_ne!(held(1), held(2));
        assert_eq!(place(42), None, "a raw path's wr_id");
    }
}
