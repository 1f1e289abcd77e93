//! `RemoteMemory::from_bytes` (a peer's address, length and rkey off the
//! wire) and `RemoteMemory::slice` on any range: what `from_bytes` accepts
//! is 21 bytes of version 1 naming a range that does not wrap, and
//! `to_bytes` writes it back byte for byte; a slice is either inside the
//! range, with an address that does not wrap, or `None` — never a panic
//! or overflow.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use rdma_verbs::{error::WireProblem, memory::RemoteKey, Error, RemoteMemory};

#[derive(Arbitrary, Debug)]
struct Input {
    /// A range: addr (8 bytes), len (8), rkey (4), big-endian (the layout
    /// of the seeds in fuzz/corpus/remote_memory).
    range: [u8; 20],
    offset: u64,
    slice_len: u64,
    /// Bytes for `from_bytes` (the rest of the input).
    wire: Vec<u8>,
}

fn check_wire(data: &[u8]) {
    match RemoteMemory::from_bytes(data) {
        Ok(m) => {
            assert_eq!((data.len(), data[0]), (RemoteMemory::WIRE_LEN, 1));
            assert!(m.addr.checked_add(m.len).is_some(), "{m:?}");
            assert_eq!(&m.to_bytes()[..], data);
        }
        Err(Error::BadWireFormat {
            what: "RemoteMemory",
            problem,
        }) => match problem {
            WireProblem::Version { version, .. } => {
                assert_eq!(Some(&version), data.first());
                assert_ne!(version, 1);
            }
            WireProblem::Length { len, expected } => {
                assert_eq!((len, expected), (data.len(), RemoteMemory::WIRE_LEN));
            }
            WireProblem::OutOfRange { field, value, max } => {
                assert_eq!(field, "len");
                assert!(value > max);
            }
            other => panic!("unexpected {other:?}"),
        },
        Err(e) => panic!("unexpected error {e:?}"),
    }
}

fuzz_target!(|i: Input| {
    check_wire(&i.wire);
    let r = &i.range;
    let m = RemoteMemory {
        addr: u64::from_be_bytes(r[..8].try_into().unwrap()),
        len: u64::from_be_bytes(r[8..16].try_into().unwrap()),
        rkey: RemoteKey(u32::from_be_bytes(r[16..].try_into().unwrap())),
    };
    // Every range's wire form is version 1 with these numbers; it parses
    // back exactly when the range does not wrap.
    let wire = m.to_bytes();
    check_wire(&wire);
    assert_eq!(
        RemoteMemory::from_bytes(&wire).ok(),
        m.addr.checked_add(m.len).map(|_| m)
    );
    let (offset, len) = (i.offset, i.slice_len);
    let inside = offset.checked_add(len).is_some_and(|end| end <= m.len);
    let addr = m.addr.checked_add(offset);
    match m.slice(offset, len) {
        Some(s) => {
            assert!(inside, "{m:?}.slice({offset}, {len}) = {s:?}");
            assert_eq!(Some(s.addr), addr);
            assert_eq!((s.len, s.rkey), (len, m.rkey));
            assert_eq!(s.slice(0, s.len), Some(s));
        }
        None => assert!(!inside || addr.is_none(), "{m:?}.slice({offset}, {len})"),
    }
    // The whole range and an empty range at its start are always slices
    // (unless the address space would wrap).
    assert_eq!(m.slice(0, m.len), Some(m));
    assert_eq!(m.slice(0, 0).map(|s| s.addr), Some(m.addr));
});
