//! End-to-end integrity checks the tools share (issue #24 item 2): the
//! ping-pongs' `-c` message pattern (a sequence number and a checksum in
//! every message, every byte a function of the sequence number), the
//! byte-by-byte comparison every validation option reports through (the
//! first differing offset, expected and received bytes), and the
//! test-only corruption knob ([`CORRUPT_ENV`]).
//!
//! The pattern keeps a zero at every multiple of [`ZERO_STRIDE`] bytes:
//! rdma-core v44's ping-pongs with `-c` check only that the byte at each
//! page start is 0 (`buf[i] = i / page_size % sizeof(char)`), so a C peer
//! accepts our messages, and any page size that is a multiple of 4096
//! finds its zeros. What each tool checks against which peer is in
//! docs/tools.md ("Validation options").

use std::fmt;

/// Environment variable read by the senders of the tools with a
/// validation option (test instrumentation, not an option): `ITER` or
/// `ITER@OFFSET`. The sender flips every bit of one byte (at `OFFSET`,
/// default the middle of the message) of its message `ITER` (1-based)
/// after the message's checksum was computed, so that the receiver's
/// check must fail loudly. The device tests set it; nobody else should.
pub const CORRUPT_ENV: &str = "IBVERBS_SUITE_CORRUPT";

/// Our pattern has a 0 at every multiple of this many bytes (where
/// rdma-core's `-c` expects one at every page start).
pub const ZERO_STRIDE: usize = 4096;

/// Where the sequence number (u32, little endian) sits in our pattern.
const SEQ_AT: usize = 1;
/// Where the checksum (u32, little endian) sits.
const SUM_AT: usize = 5;
/// A message shorter than this has no room for the header: every byte is
/// still a function of the sequence number (except the zero at offset 0).
pub const HEADER_END: usize = 9;

/// The filler byte at `offset` of message `seq` (before the header).
#[inline]
fn filler(seq: u32, offset: usize) -> u8 {
    if offset % ZERO_STRIDE == 0 {
        return 0;
    }
    let x =
        (offset as u32).wrapping_mul(0x9e37_79b1) ^ seq.wrapping_mul(0x85eb_ca77).rotate_left(13);
    let x = x ^ (x >> 15);
    (x ^ (x >> 24)) as u8
}

/// FNV-1a (32 bits) of `bytes`, continuing from `h`.
#[inline]
fn fnv(mut h: u32, bytes: impl IntoIterator<Item = u8>) -> u32 {
    for b in bytes {
        h = (h ^ u32::from(b)).wrapping_mul(0x0100_0193);
    }
    h
}
const FNV_START: u32 = 0x811c_9dc5;

/// The checksum of a message of ours: FNV-1a over every byte except the
/// checksum field itself (the sequence number included).
fn checksum_of(msg: &[u8]) -> u32 {
    let h = fnv(FNV_START, msg[..SUM_AT].iter().copied());
    fnv(h, msg[HEADER_END..].iter().copied())
}

/// The checksum message `seq` of `len` bytes carries, computed from the
/// pattern without materialising it.
fn expected_checksum(seq: u32, len: usize) -> u32 {
    let mut head = [0u8; SUM_AT];
    head[SEQ_AT..SUM_AT].copy_from_slice(&seq.to_le_bytes());
    let h = fnv(FNV_START, head);
    fnv(h, (HEADER_END..len).map(|i| filler(seq, i)))
}

/// Writes our message `seq` into `msg` (all of it): a 0 at every multiple
/// of [`ZERO_STRIDE`], the sequence number at offset 1 and the checksum at
/// offset 5 (when the message has [`HEADER_END`] bytes or more), and
/// elsewhere a byte that depends on the sequence number and the offset.
pub fn fill(msg: &mut [u8], seq: u32) {
    for (i, b) in msg.iter_mut().enumerate() {
        *b = filler(seq, i);
    }
    if msg.len() >= HEADER_END {
        msg[SEQ_AT..SUM_AT].copy_from_slice(&seq.to_le_bytes());
        let sum = checksum_of(msg);
        msg[SUM_AT..HEADER_END].copy_from_slice(&sum.to_le_bytes());
    }
}

/// The first byte where a message differs from what was expected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Difference {
    /// Offset in the message.
    pub offset: usize,
    /// The byte expected there.
    pub expected: u8,
    /// The byte received.
    pub got: u8,
}

impl fmt::Display for Difference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "first difference at offset {}: expected 0x{:02x}, got 0x{:02x}",
            self.offset, self.expected, self.got
        )
    }
}

/// Compares every byte of `got` with `expected(offset)`; the first that
/// differs, if any.
#[inline]
pub fn first_difference(got: &[u8], expected: impl Fn(usize) -> u8) -> Option<Difference> {
    got.iter().enumerate().find_map(|(offset, &g)| {
        let e = expected(offset);
        (g != e).then_some(Difference {
            offset,
            expected: e,
            got: g,
        })
    })
}

/// [`first_difference`] against a slice (a length difference counts at
/// the shorter one's end, as the byte 0x00 the shorter one lacks).
pub fn first_difference_in(got: &[u8], expected: &[u8]) -> Option<Difference> {
    let n = got.len().min(expected.len());
    first_difference(&got[..n], |i| expected[i]).or_else(|| {
        (got.len() != expected.len()).then(|| Difference {
            offset: n,
            expected: expected.get(n).copied().unwrap_or(0),
            got: got.get(n).copied().unwrap_or(0),
        })
    })
}

/// A message that is not our message for the expected sequence number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mismatch {
    /// The sequence number expected.
    pub seq: u32,
    /// The first differing byte.
    pub diff: Difference,
    /// The sequence number the message carries, and whether its checksum
    /// matches its own bytes (`None` for a message without a header).
    pub carried: Option<(u32, bool)>,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "not the pattern of sequence number {}: {}",
            self.seq, self.diff
        )?;
        if let Some((seq, sum_ok)) = self.carried {
            write!(
                f,
                " (the message carries sequence number {seq}, and its checksum {} its bytes)",
                if sum_ok { "matches" } else { "does not match" }
            )?;
        }
        Ok(())
    }
}

/// Checks that `got` is exactly our message `seq` ([`fill`]): every byte,
/// the sequence number and checksum included.
pub fn check(got: &[u8], seq: u32) -> Result<(), Mismatch> {
    let header = got.len() >= HEADER_END;
    let sum = if header {
        expected_checksum(seq, got.len()).to_le_bytes()
    } else {
        [0; 4]
    };
    let seq_bytes = seq.to_le_bytes();
    let expected = |i: usize| match i {
        SEQ_AT..SUM_AT if header => seq_bytes[i - SEQ_AT],
        SUM_AT..HEADER_END if header => sum[i - SUM_AT],
        _ => filler(seq, i),
    };
    match first_difference(got, expected) {
        None => Ok(()),
        Some(diff) => Err(Mismatch {
            seq,
            diff,
            carried: header.then(|| carried(got)),
        }),
    }
}

/// The sequence number a message of ours (at least [`HEADER_END`] bytes)
/// carries, and whether its checksum matches its bytes.
pub fn carried(got: &[u8]) -> (u32, bool) {
    let word = |at: usize| u32::from_le_bytes([got[at], got[at + 1], got[at + 2], got[at + 3]]);
    (word(SEQ_AT), word(SUM_AT) == checksum_of(got))
}

/// The sender's side of [`CORRUPT_ENV`]: which message to corrupt, where.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Corrupt {
    /// The 1-based message (iteration) to corrupt.
    pub iter: u32,
    /// The offset to flip; `None`: the middle of the message.
    pub offset: Option<usize>,
}

impl Corrupt {
    /// Reads [`CORRUPT_ENV`] (once, at start-up: not on the data path).
    ///
    /// # Errors
    /// A value that is not `ITER` or `ITER@OFFSET`.
    pub fn from_env() -> Result<Option<Corrupt>, String> {
        match std::env::var(CORRUPT_ENV) {
            Ok(v) => Corrupt::parse(&v)
                .map(Some)
                .ok_or_else(|| format!("{CORRUPT_ENV}={v:?}: expected ITER or ITER@OFFSET")),
            Err(_) => Ok(None),
        }
    }

    /// Parses `ITER` or `ITER@OFFSET`.
    pub fn parse(s: &str) -> Option<Corrupt> {
        let (iter, offset) = match s.split_once('@') {
            Some((i, o)) => (i, Some(o.parse().ok()?)),
            None => (s, None),
        };
        Some(Corrupt {
            iter: iter.parse().ok().filter(|&i| i > 0)?,
            offset,
        })
    }

    /// Flips every bit of one byte of `msg` if it is message `iter`;
    /// returns the offset flipped. Says so on stderr: a run with the knob
    /// set is a test's.
    pub fn apply(&self, prog: &str, iter: u32, msg: &mut [u8]) -> Option<usize> {
        if iter != self.iter || msg.is_empty() {
            return None;
        }
        let at = self.offset.unwrap_or(msg.len() / 2).min(msg.len() - 1);
        msg[at] ^= 0xff;
        eprintln!(
            "{prog}: {CORRUPT_ENV}: flipped byte {at} of message {iter} (test instrumentation)"
        );
        Some(at)
    }
}

#[cfg(test)]
mod tests;
