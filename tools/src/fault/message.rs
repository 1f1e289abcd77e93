//! The messages `fault_peer` moves: a sequence number and a checksum in
//! every one, and, for one that fails its check, where its bytes came from.

/// Message layout: seq (8 bytes LE), FNV-1a of the rest (8 bytes), payload.
pub(crate) fn fill(msg: &mut [u8], seq: u64) {
    let mut x = seq.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    for b in msg[16..].iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    let h = fnv(&msg[16..]);
    msg[..8].copy_from_slice(&seq.to_le_bytes());
    msg[8..16].copy_from_slice(&h.to_le_bytes());
}

fn fnv(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h = (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
    }
    h
}

/// Checks a message: its sequence number and checksum.
pub(crate) fn check(msg: &[u8], expect_seq: u64) -> Result<(), String> {
    let seq = u64::from_le_bytes(msg[..8].try_into().unwrap());
    let h = u64::from_le_bytes(msg[8..16].try_into().unwrap());
    if seq != expect_seq {
        return Err(format!("message {expect_seq}: carries sequence {seq}"));
    }
    if fnv(&msg[16..]) != h {
        return Err(format!(
            "message {seq}: checksum mismatch ({})",
            explain(msg, seq)
        ));
    }
    Ok(())
}

/// Says where a message that fails its checksum differs from what was sent
/// and, for each differing range, whose bytes it holds instead: another
/// message's (a buffer written by the wrong transfer, or a packet that never
/// landed and left the buffer's previous message), zeros, or unknown.
fn explain(msg: &[u8], seq: u64) -> String {
    let mut want = vec![0u8; msg.len()];
    fill(&mut want, seq);
    let mut ranges: Vec<(usize, usize)> = Vec::new();
    for (i, (a, b)) in msg.iter().zip(&want).enumerate() {
        if a != b {
            match ranges.last_mut() {
                // Bytes that happen to agree inside a bad range do not split it.
                Some((_, end)) if i - *end < 64 => *end = i + 1,
                _ => ranges.push((i, i + 1)),
            }
        }
    }
    let mut other = vec![0u8; msg.len()];
    let mut out = format!("{} range(s) differ", ranges.len());
    for &(start, end) in ranges.iter().take(4) {
        let got = &msg[start..end];
        // Bytes 0..16 are the header (sequence, checksum): a range there
        // is no other message's payload.
        let from = start.max(16);
        let source = if got.iter().all(|&b| b == 0) {
            "zeros".to_string()
        } else if from >= end {
            "a corrupted header".to_string()
        } else {
            (seq.saturating_sub(256)..seq + 64)
                .find(|&s| {
                    fill(&mut other, s);
                    other[from..end] == msg[from..end]
                })
                .map_or("unknown bytes".to_string(), |s| {
                    format!("message {s}'s bytes")
                })
        };
        out.push_str(&format!("; [{start}, {end}) holds {source}"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_filled_message_checks_out() {
        for len in [16, 17, 64, 4096] {
            let mut m = vec![0u8; len];
            fill(&mut m, 42);
            assert_eq!(check(&m, 42), Ok(()));
        }
    }

    #[test]
    fn a_wrong_sequence_or_byte_fails_loudly() {
        let mut m = vec![0u8; 256];
        fill(&mut m, 7);
        let e = check(&m, 8).unwrap_err();
        assert!(e.contains("carries sequence 7"), "{e}");
        m[100] ^= 1;
        let e = check(&m, 7).unwrap_err();
        assert!(e.contains("checksum mismatch"), "{e}");
        assert!(e.contains("1 range(s) differ"), "{e}");
    }

    #[test]
    fn explain_names_zeros_and_another_messages_bytes() {
        let mut m = vec![0u8; 1024];
        fill(&mut m, 300);
        m[200..300].fill(0);
        assert!(explain(&m, 300).contains("[200, 300) holds zeros"));
        let mut stale = vec![0u8; 1024];
        fill(&mut stale, 299);
        fill(&mut m, 300);
        m[512..].copy_from_slice(&stale[512..]);
        let e = explain(&m, 300);
        assert!(e.contains("message 299's bytes"), "{e}");
    }
}
