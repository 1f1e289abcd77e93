//! Volatile copies in and out of memory the device or a peer may write at
//! any time (`SharedBuffer`): no reference to those bytes is ever made. A
//! word at a time where the memory is 8-byte aligned, a byte at a time at
//! the ends; the copy as a whole is not atomic (a word a peer is writing
//! may come out torn), as documented on `SharedBuffer::copy_to_slice`.

const WORD: usize = std::mem::size_of::<u64>();

/// Copies `dst.len()` bytes from `src` into `dst` with volatile reads.
///
/// # Safety
/// - `src..src + dst.len()` must be valid for reads;
/// - no Rust reference may exist to those bytes (they are read only
///   through raw pointers here).
#[inline]
pub(crate) unsafe fn copy_out(src: *const u8, dst: &mut [u8]) {
    let len = dst.len();
    let head = src.align_offset(WORD).min(len);
    let words = (len - head) / WORD;
    for (i, d) in dst[..head].iter_mut().enumerate() {
        // SAFETY: `i < len`, inside the caller's readable range.
        *d = unsafe { src.add(i).read_volatile() };
    }
    for (w, d) in dst[head..head + words * WORD]
        .chunks_exact_mut(WORD)
        .enumerate()
    {
        // SAFETY: `head + w·8 + 8 <= len`, inside the range, and 8-byte
        // aligned (`head` aligned `src`).
        let v = unsafe { src.add(head + w * WORD).cast::<u64>().read_volatile() };
        d.copy_from_slice(&v.to_ne_bytes());
    }
    let tail = head + words * WORD;
    for (i, d) in dst[tail..].iter_mut().enumerate() {
        // SAFETY: `tail + i < len`, inside the range.
        *d = unsafe { src.add(tail + i).read_volatile() };
    }
}

/// Copies `src` to `dst` with volatile writes.
///
/// # Safety
/// - `dst..dst + src.len()` must be valid for writes;
/// - no Rust reference may exist to those bytes.
#[inline]
pub(crate) unsafe fn copy_in(dst: *mut u8, src: &[u8]) {
    let len = src.len();
    let head = dst.align_offset(WORD).min(len);
    let words = (len - head) / WORD;
    for (i, s) in src[..head].iter().enumerate() {
        // SAFETY: `i < len`, inside the caller's writable range.
        unsafe { dst.add(i).write_volatile(*s) };
    }
    for (w, s) in src[head..head + words * WORD]
        .chunks_exact(WORD)
        .enumerate()
    {
        let mut b = [0u8; WORD];
        b.copy_from_slice(s);
        // SAFETY: in range and 8-byte aligned, as in `copy_out`.
        unsafe {
            dst.add(head + w * WORD)
                .cast::<u64>()
                .write_volatile(u64::from_ne_bytes(b))
        };
    }
    let tail = head + words * WORD;
    for (i, s) in src[tail..].iter().enumerate() {
        // SAFETY: `tail + i < len`, inside the range.
        unsafe { dst.add(tail + i).write_volatile(*s) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every start offset and length over a buffer of a few words: the
    /// copies move exactly the asked bytes, nothing around them.
    #[test]
    fn copies_every_offset_and_length_exactly() {
        let mut mem = [0u64; 8];
        let bytes = 64;
        for off in 0..24 {
            for len in 0..=(bytes - off).min(40) {
                let base = mem.as_mut_ptr().cast::<u8>();
                for i in 0..bytes {
                    // SAFETY: inside `mem`.
                    unsafe { base.add(i).write(i as u8) };
                }
                let mut out = vec![0xee; len];
                // SAFETY: `off + len <= 64`, inside `mem`; no reference to it.
                unsafe { copy_out(base.add(off), &mut out) };
                let want: Vec<u8> = (off..off + len).map(|i| i as u8).collect();
                assert_eq!(out, want, "copy_out at {off}, {len} bytes");

                let src: Vec<u8> = (0..len).map(|i| 0x80 | i as u8).collect();
                // SAFETY: as above.
                unsafe { copy_in(base.add(off), &src) };
                for i in 0..bytes {
                    // SAFETY: inside `mem`.
                    let got = unsafe { base.add(i).read() };
                    let want = if (off..off + len).contains(&i) {
                        0x80 | (i - off) as u8
                    } else {
                        i as u8
                    };
                    assert_eq!(got, want, "copy_in at {off}, {len} bytes: byte {i}");
                }
            }
        }
    }
}
