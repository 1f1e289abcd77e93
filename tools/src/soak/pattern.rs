//! The bytes the soak moves: every byte a function of a stream seed and
//! its offset, so any receiver can regenerate and check any range without
//! a header (messages go down to 1 byte).

/// SplitMix64: a fast, well-mixed 64-bit hash of `x`.
pub(crate) fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The seed of one message: session, queue pair, stream kind, sequence.
pub(crate) fn seed(session: u64, qp: usize, kind: u8, seq: u64) -> u64 {
    mix(mix(mix(session) ^ qp as u64) ^ u64::from(kind) ^ seq.rotate_left(8))
}

/// Byte `offset` of stream `seed`: byte `offset % 8` of the hash of its
/// 8-byte block (one hash per block, not per byte).
#[inline]
fn block(seed: u64, offset: u64) -> u64 {
    mix(seed ^ (offset / 8))
}

/// What the client writes into a read's or an atomic's buffer before it
/// posts it: bytes still equal to it after a successful completion are
/// bytes the device never wrote. A stream byte equals it one time in 256,
/// eight in a row one time in 2^64.
pub(crate) const POISON: u8 = 0xa5;

/// Whether every byte of `buf` (non-empty) is still [`POISON`].
pub(crate) fn poisoned(buf: &[u8]) -> bool {
    !buf.is_empty() && buf.iter().all(|&b| b == POISON)
}

/// Fills `buf` with stream `seed` from `offset` on.
pub(crate) fn fill(buf: &mut [u8], seed: u64, offset: u64) {
    let mut w = block(seed, offset);
    for (i, b) in buf.iter_mut().enumerate() {
        let o = offset + i as u64;
        if o % 8 == 0 {
            w = block(seed, o);
        }
        *b = (w >> (8 * (o % 8))) as u8;
    }
}

/// The first offset (relative to `buf`) where `buf` differs from stream
/// `seed` starting at `offset`, and how many bytes differ.
pub(crate) fn check(buf: &[u8], seed: u64, offset: u64) -> Option<(usize, usize)> {
    let mut first = None;
    let mut bad = 0;
    let mut w = block(seed, offset);
    for (i, &b) in buf.iter().enumerate() {
        let o = offset + i as u64;
        if o % 8 == 0 {
            w = block(seed, o);
        }
        if b != (w >> (8 * (o % 8))) as u8 {
            first.get_or_insert(i);
            bad += 1;
        }
    }
    first.map(|f| (f, bad))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_filled_range_checks_and_a_flipped_byte_is_found() {
        for len in [1usize, 7, 8, 9, 4096] {
            let mut b = vec![0u8; len];
            fill(&mut b, 42, 3);
            assert_eq!(check(&b, 42, 3), None);
            b[len / 2] ^= 0x10;
            assert_eq!(check(&b, 42, 3), Some((len / 2, 1)));
        }
        // A range of a stream is that stream at its offset.
        let mut whole = vec![0u8; 64];
        fill(&mut whole, 9, 0);
        assert_eq!(check(&whole[13..40], 9, 13), None);
        assert!(check(&whole[13..40], 9, 14).is_some());
    }

    #[test]
    fn poison_is_told_from_a_stream() {
        let mut b = vec![POISON; 64];
        assert!(poisoned(&b));
        assert!(!poisoned(&[]));
        fill(&mut b[8..], 5, 0);
        assert!(poisoned(&b[..8]) && !poisoned(&b));
        assert!(!poisoned(&b[8..16]));
    }

    #[test]
    fn seeds_differ_by_every_component() {
        let s = seed(1, 2, 3, 4);
        assert_ne!(s, seed(2, 2, 3, 4));
        assert_ne!(s, seed(1, 3, 3, 4));
        assert_ne!(s, seed(1, 2, 4, 4));
        assert_ne!(s, seed(1, 2, 3, 5));
    }
}
