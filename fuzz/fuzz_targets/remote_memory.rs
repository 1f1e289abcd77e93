//! `RemoteMemory::from_bytes` (a peer's address, length and rkey off the
//! wire) and `RemoteMemory::slice` on whatever it yields: the wire form
//! round-trips, and a slice is either inside the range, with an address
//! that does not wrap, or `None` — never a panic or overflow.
#![no_main]

use arbitrary::Arbitrary;
use ibverbs::RemoteMemory;
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
struct Input {
    wire: [u8; 20],
    offset: u64,
    len: u64,
}

fuzz_target!(|i: Input| {
    let m = RemoteMemory::from_bytes(&i.wire);
    assert_eq!(m.to_bytes(), i.wire);
    assert_eq!(RemoteMemory::from_bytes(&m.to_bytes()), m);
    let inside = i.offset.checked_add(i.len).is_some_and(|end| end <= m.len);
    let addr = m.addr.checked_add(i.offset);
    match m.slice(i.offset, i.len) {
        Some(s) => {
            assert!(inside, "{m:?}.slice({}, {}) = {s:?}", i.offset, i.len);
            assert_eq!(Some(s.addr), addr);
            assert_eq!((s.len, s.rkey), (i.len, m.rkey));
            assert_eq!(s.slice(0, s.len), Some(s));
            assert_eq!(RemoteMemory::from_bytes(&s.to_bytes()), s);
        }
        None => assert!(
            !inside || addr.is_none(),
            "{m:?}.slice({}, {})",
            i.offset,
            i.len
        ),
    }
    // The whole range and an empty range at its start are always slices
    // (unless the address space would wrap).
    assert_eq!(m.slice(0, m.len), Some(m));
    assert_eq!(m.slice(0, 0).map(|s| s.addr), Some(m.addr));
});
