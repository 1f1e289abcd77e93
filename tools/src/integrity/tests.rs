use super::*;

const SIZES: [usize; 9] = [1, 2, 8, 9, 10, 64, 4096, 4097, 3 * 4096 + 5];

#[test]
fn a_filled_message_checks_out_for_its_sequence_number_only() {
    for len in SIZES {
        let mut m = vec![0x7b; len];
        fill(&mut m, 42);
        assert_eq!(check(&m, 42), Ok(()), "len {len}");
        if len > 1 {
            let e = check(&m, 43).unwrap_err();
            assert_eq!(e.seq, 43);
            assert_ne!(e.diff.expected, e.diff.got);
        }
    }
}

#[test]
fn zeros_at_every_page_start_as_rdma_core_checks() {
    let mut m = vec![0x7b; 5 * ZERO_STRIDE + 1];
    for seq in [0, 1, 7, u32::MAX] {
        fill(&mut m, seq);
        for i in (0..m.len()).step_by(ZERO_STRIDE) {
            assert_eq!(m[i], 0, "seq {seq} offset {i}");
        }
    }
}

#[test]
fn header_holds_sequence_number_and_a_checksum_of_the_rest() {
    let mut m = vec![0; 100];
    fill(&mut m, 0x0102_0304);
    assert_eq!(&m[1..5], &[4, 3, 2, 1]);
    assert_eq!(carried(&m), (0x0102_0304, true));
    // The expected checksum (computed without the message) is the one filled in.
    assert_eq!(
        expected_checksum(0x0102_0304, 100).to_le_bytes(),
        [m[5], m[6], m[7], m[8]]
    );
    m[50] ^= 1;
    assert_eq!(carried(&m), (0x0102_0304, false));
}

#[test]
fn every_byte_is_checked() {
    // Flipping any single byte of any size is caught, at that offset.
    for len in SIZES {
        let mut m = vec![0; len];
        fill(&mut m, 9);
        for at in 0..len {
            m[at] ^= 0x5a;
            let e = check(&m, 9).unwrap_err();
            assert_eq!(e.diff.offset, at, "len {len}");
            assert_eq!(e.diff.got, e.diff.expected ^ 0x5a);
            m[at] ^= 0x5a;
        }
    }
}

#[test]
fn neighbouring_sequence_numbers_differ_in_many_bytes() {
    // A stale message (the previous one left in a buffer) must not pass.
    let (mut a, mut b) = (vec![0; 4096], vec![0; 4096]);
    for seq in [1, 2, 255, 256, 65535] {
        fill(&mut a, seq);
        fill(&mut b, seq + 1);
        let same = a.iter().zip(&b).filter(|(x, y)| x == y).count();
        assert!(same < 4096 / 16, "seq {seq}: {same} equal bytes");
    }
    // Two-byte messages: the one byte not at offset 0 still varies.
    let seen: std::collections::HashSet<u8> = (0..64)
        .map(|s| {
            let mut m = [0u8; 2];
            fill(&mut m, s);
            m[1]
        })
        .collect();
    assert!(seen.len() > 16, "{seen:?}");
}

#[test]
fn mismatch_names_carried_sequence_and_checksum() {
    let mut m = vec![0; 64];
    fill(&mut m, 5);
    let e = check(&m, 6).unwrap_err();
    assert_eq!(e.carried, Some((5, true)));
    assert_eq!(e.diff.offset, 1);
    let s = e.to_string();
    assert!(s.contains("sequence number 6"), "{s}");
    assert!(s.contains("offset 1"), "{s}");
    assert!(s.contains("carries sequence number 5"), "{s}");
    m[20] ^= 0xff;
    let e = check(&m, 5).unwrap_err();
    assert_eq!(e.carried, Some((5, false)));
    assert_eq!(e.diff.offset, 20);
    assert!(e.to_string().contains("does not match"), "{e}");
    // Too short for a header: no claim about one.
    assert_eq!(check(&[1], 5).unwrap_err().carried, None);
}

#[test]
fn first_difference_in_counts_lengths() {
    assert_eq!(first_difference_in(b"abc", b"abc"), None);
    let d = first_difference_in(b"abd", b"abc").unwrap();
    assert_eq!((d.offset, d.expected, d.got), (2, b'c', b'd'));
    assert_eq!(first_difference_in(b"ab", b"abc").unwrap().offset, 2);
    assert_eq!(first_difference_in(b"abcd", b"abc").unwrap().offset, 3);
}

#[test]
fn corrupt_knob_parses_and_flips_one_byte_of_one_message() {
    assert_eq!(
        Corrupt::parse("3"),
        Some(Corrupt {
            iter: 3,
            offset: None
        })
    );
    assert_eq!(
        Corrupt::parse("3@17"),
        Some(Corrupt {
            iter: 3,
            offset: Some(17)
        })
    );
    for bad in ["", "0", "x", "3@", "3@x", "-1"] {
        assert_eq!(Corrupt::parse(bad), None, "{bad:?}");
    }
    let k = Corrupt::parse("2").unwrap();
    let mut m = vec![0; 10];
    fill(&mut m, 2);
    assert_eq!(k.apply("t", 1, &mut m), None);
    assert_eq!(check(&m, 2), Ok(()));
    assert_eq!(k.apply("t", 2, &mut m), Some(5));
    assert_eq!(check(&m, 2).unwrap_err().diff.offset, 5);
    // An offset past the end flips the last byte.
    let k = Corrupt::parse("1@99").unwrap();
    assert_eq!(k.apply("t", 1, &mut m), Some(9));
}
