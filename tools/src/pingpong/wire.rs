//! The address message of rdma-core's `ibv_*_pingpong` tools, as bytes.
//!
//! Each side describes a queue pair as the C string
//! `"%04x:%06x:%06x:%s"` — LID, QP number, PSN and the GID as 32 hex
//! digits (its 16 bytes in order, rdma-core's `gid_to_wire_gid`) — and sends
//! it with its terminating NUL: always [`MSG_LEN`] = 52 bytes. After the
//! exchange the client writes `"done"` with its NUL ([`DONE`], 5 bytes).
//!
//! The peer is untrusted: [`decode`] accepts only what the C format can
//! produce (plus upper-case hex and unpadded numbers, which C's `sscanf`
//! also takes) and names what is wrong otherwise. Bytes after the NUL are
//! ignored, as rdma-core does.
//!
//! Pure and dependency-free (std only); its tests are beside it.

use std::fmt;

/// Size of one address message on the wire, NUL included
/// (`sizeof "0000:000000:000000:00000000000000000000000000000000"`).
pub const MSG_LEN: usize = 52;

/// What the client sends after the exchange: `"done"` and its NUL.
pub const DONE: [u8; 5] = *b"done\0";

/// Largest QP number or PSN (24 bits).
pub const MAX_24: u32 = 0xff_ffff;

/// One queue pair's address, as exchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Dest {
    /// The port's LID (0 on RoCE).
    pub lid: u16,
    /// The QP number (24 bits).
    pub qpn: u32,
    /// The first packet sequence number (24 bits).
    pub psn: u32,
    /// The GID, its 16 bytes in network order (all zero: none).
    pub gid: [u8; 16],
}

/// Why a message was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WireError {
    /// The message does not have [`MSG_LEN`] bytes.
    Length(usize),
    /// No NUL terminator within the message.
    NoNul,
    /// A byte before the NUL that is not visible ASCII (space, control, 8-bit).
    BadByte {
        /// Offset in the message.
        pos: usize,
        /// The byte.
        byte: u8,
    },
    /// Not four `:`-separated fields.
    FieldCount(usize),
    /// A field is empty.
    Empty(&'static str),
    /// A field holds a character that is not a hex digit.
    NotHex(&'static str, String),
    /// A number too large for its field.
    OutOfRange {
        /// The field.
        field: &'static str,
        /// Its text.
        text: String,
        /// The largest value allowed.
        max: u32,
    },
    /// The GID does not have 32 hex digits.
    GidLength(usize),
    /// The final message is not `"done"` with its NUL.
    NotDone(Vec<u8>),
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WireError::Length(n) => write!(f, "message has {n} bytes, expected {MSG_LEN}"),
            WireError::NoNul => write!(f, "no NUL terminator within {MSG_LEN} bytes"),
            WireError::BadByte { pos, byte } => {
                write!(
                    f,
                    "byte {pos} is {byte:#04x}, not a visible ASCII character"
                )
            }
            WireError::FieldCount(n) => write!(
                f,
                "expected 4 ':'-separated fields LID:QPN:PSN:GID, found {n}"
            ),
            WireError::Empty(field) => write!(f, "the {field} field is empty"),
            WireError::NotHex(field, text) => {
                write!(f, "the {field} field {text:?} is not hexadecimal")
            }
            WireError::OutOfRange { field, text, max } => {
                let bits = 32 - max.leading_zeros();
                write!(
                    f,
                    "{field} 0x{text} does not fit in {bits} bits (at most {max:#x})"
                )
            }
            WireError::GidLength(n) => write!(f, "the GID has {n} hex digits, expected 32"),
            WireError::NotDone(got) => write!(
                f,
                "expected \"done\" and its NUL, got {:?}",
                String::from_utf8_lossy(got)
            ),
        }
    }
}

impl std::error::Error for WireError {}

/// The wire form of `d`: exactly what rdma-core's
/// `sprintf(msg, "%04x:%06x:%06x:%s", …)` puts in its 52-byte buffer.
///
/// # Errors
/// [`WireError::OutOfRange`] when the QP number or PSN exceeds 24 bits
/// (the C tool would overflow its buffer).
pub fn encode(d: &Dest) -> Result<[u8; MSG_LEN], WireError> {
    for (field, v) in [("QPN", d.qpn), ("PSN", d.psn)] {
        if v > MAX_24 {
            return Err(WireError::OutOfRange {
                field,
                text: format!("{v:x}"),
                max: MAX_24,
            });
        }
    }
    let mut text = format!("{:04x}:{:06x}:{:06x}:", d.lid, d.qpn, d.psn);
    for b in d.gid {
        text.push_str(&format!("{b:02x}"));
    }
    let mut msg = [0u8; MSG_LEN];
    // 4 + 1 + 6 + 1 + 6 + 1 + 32 = 51 characters, then the NUL.
    debug_assert_eq!(text.len(), MSG_LEN - 1);
    msg[..text.len()].copy_from_slice(text.as_bytes());
    Ok(msg)
}

/// Parses a peer's 52-byte message.
///
/// # Errors
/// A [`WireError`] naming the first problem found.
pub fn decode(msg: &[u8]) -> Result<Dest, WireError> {
    if msg.len() != MSG_LEN {
        return Err(WireError::Length(msg.len()));
    }
    let end = msg.iter().position(|&b| b == 0).ok_or(WireError::NoNul)?;
    let text = &msg[..end];
    if let Some(pos) = text.iter().position(|b| !b.is_ascii_graphic()) {
        return Err(WireError::BadByte {
            pos,
            byte: text[pos],
        });
    }
    // Printable ASCII, so valid UTF-8.
    let text = std::str::from_utf8(text).map_err(|_| WireError::BadByte { pos: 0, byte: 0 })?;
    let fields: Vec<&str> = text.split(':').collect();
    let [lid, qpn, psn, gid] = fields[..] else {
        return Err(WireError::FieldCount(fields.len()));
    };
    let lid = number("LID", lid, u32::from(u16::MAX))? as u16;
    let qpn = number("QPN", qpn, MAX_24)?;
    let psn = number("PSN", psn, MAX_24)?;
    Ok(Dest {
        lid,
        qpn,
        psn,
        gid: parse_gid(gid)?,
    })
}

/// A hex field (digits only: no sign, no `0x`, no spaces) of at most `max`.
fn number(field: &'static str, text: &str, max: u32) -> Result<u32, WireError> {
    if text.is_empty() {
        return Err(WireError::Empty(field));
    }
    let mut value: u64 = 0;
    for c in text.chars() {
        let digit = c
            .to_digit(16)
            .ok_or_else(|| WireError::NotHex(field, text.to_string()))?;
        value = (value << 4 | u64::from(digit)).min(u64::from(u32::MAX) + 1);
    }
    if value > u64::from(max) {
        return Err(WireError::OutOfRange {
            field,
            text: text.to_string(),
            max,
        });
    }
    Ok(value as u32)
}

/// 32 hex digits → 16 bytes (rdma-core's `wire_gid_to_gid`).
fn parse_gid(text: &str) -> Result<[u8; 16], WireError> {
    if text.is_empty() {
        return Err(WireError::Empty("GID"));
    }
    if !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(WireError::NotHex("GID", text.to_string()));
    }
    if text.len() != 32 {
        return Err(WireError::GidLength(text.len()));
    }
    let mut gid = [0u8; 16];
    for (i, b) in gid.iter_mut().enumerate() {
        // Checked above: ASCII hex digits only.
        *b = u8::from_str_radix(&text[2 * i..2 * i + 2], 16)
            .map_err(|_| WireError::NotHex("GID", text.to_string()))?;
    }
    Ok(gid)
}

/// Checks the client's final message (`"done"` and its NUL).
///
/// # Errors
/// [`WireError::NotDone`] with what arrived instead.
pub fn check_done(msg: &[u8]) -> Result<(), WireError> {
    if msg == DONE {
        Ok(())
    } else {
        Err(WireError::NotDone(msg.to_vec()))
    }
}

/// A GID as text, exactly as glibc's `inet_ntop(AF_INET6, …)` writes it
/// (what the C tools print): the longest run of two or more zero groups
/// (the first on a tie) becomes `::`, and `::a.b.c.d` / `::ffff:a.b.c.d`
/// end in dotted IPv4.
pub fn format_gid(gid: &[u8; 16]) -> String {
    let words: [u16; 8] = std::array::from_fn(|i| u16::from_be_bytes([gid[2 * i], gid[2 * i + 1]]));
    // Longest run of zero words (first one wins a tie), if at least 2 long.
    let (mut best, mut cur): ((usize, usize), Option<(usize, usize)>) = ((0, 0), None);
    for (i, &w) in words.iter().enumerate() {
        if w == 0 {
            let run = cur.map_or((i, 1), |(base, len)| (base, len + 1));
            cur = Some(run);
            if run.1 > best.1 {
                best = run;
            }
        } else {
            cur = None;
        }
    }
    let best = (best.1 >= 2).then_some(best);
    let mut out = String::with_capacity(46);
    for (i, &w) in words.iter().enumerate() {
        if let Some((base, len)) = best {
            if i >= base && i < base + len {
                if i == base {
                    out.push(':');
                }
                continue;
            }
        }
        if i != 0 {
            out.push(':');
        }
        let embedded_v4 =
            matches!(best, Some((0, 6))) || (matches!(best, Some((0, 5))) && words[5] == 0xffff);
        if i == 6 && embedded_v4 {
            out.push_str(&format!("{}.{}.{}.{}", gid[12], gid[13], gid[14], gid[15]));
            return out;
        }
        out.push_str(&format!("{w:x}"));
    }
    if let Some((base, len)) = best {
        if base + len == 8 {
            out.push(':');
        }
    }
    out
}

/// Sample addresses and messages: the tests of this module, of the exchange
/// and of the ping-pong programs (`device-tests/tests/pingpong_interop.rs`) share them.
pub mod fixtures {
    use super::{Dest, MSG_LEN};

    pub const VM_GID: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 2, 15];

    pub fn dest(qpn: u32) -> Dest {
        Dest {
            lid: 0x12,
            qpn,
            psn: 0xab_cdef,
            gid: VM_GID,
        }
    }

    /// A 52-byte message from text (NUL-padded; the text must be shorter).
    pub const GID_HEX: &str = "00000000000000000000ffff0a00020f";

    pub fn msg(text: &str) -> Vec<u8> {
        assert!(text.len() < MSG_LEN);
        let mut m = text.as_bytes().to_vec();
        m.resize(MSG_LEN, 0);
        m
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::{dest, msg, GID_HEX};
    use super::*;

    #[test]
    fn wire_encode_matches_the_c_format() {
        let m = encode(&dest(0x1234)).unwrap();
        let expected = format!("0012:001234:abcdef:{GID_HEX}\0");
        assert_eq!(m.len(), MSG_LEN);
        assert_eq!(&m[..], expected.as_bytes());
        // Widest values still fit the 51 characters + NUL.
        let max = Dest {
            lid: 0xffff,
            qpn: 0xff_ffff,
            psn: 0xff_ffff,
            gid: [0xff; 16],
        };
        let m = encode(&max).unwrap();
        assert_eq!(&m[..19], b"ffff:ffffff:ffffff:");
        assert_eq!(m[51], 0);
        assert_eq!(decode(&m).unwrap(), max);
    }

    #[test]
    fn wire_encode_refuses_wide_fields() {
        for d in [
            Dest {
                qpn: 1 << 24,
                ..dest(1)
            },
            Dest {
                psn: u32::MAX,
                ..dest(1)
            },
        ] {
            assert!(matches!(encode(&d), Err(WireError::OutOfRange { .. })));
        }
    }

    #[test]
    fn wire_roundtrip() {
        for d in [
            Dest::default(),
            dest(0x11),
            Dest {
                lid: 7,
                qpn: 0xff_ffff,
                psn: 0,
                gid: [
                    0xfe, 0x80, 0, 0, 0, 0, 0, 0, 2, 0x0c, 0x29, 0xff, 0xfe, 0x1a, 0x2b, 0x3c,
                ],
            },
        ] {
            assert_eq!(decode(&encode(&d).unwrap()).unwrap(), d);
        }
    }

    #[test]
    fn wire_decode_accepts_what_sscanf_would() {
        // Upper case, unpadded numbers, and junk after the NUL (ignored, as C does).
        let mut m = msg(&format!("12:1234:ABCDEF:{}", GID_HEX.to_uppercase()));
        m[MSG_LEN - 1] = b'x';
        assert_eq!(decode(&m).unwrap(), dest(0x1234));
    }

    #[test]
    fn wire_decode_refuses_malformed_messages() {
        let gid = GID_HEX;
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (b"0000:000011".to_vec(), "has 11 bytes, expected 52"),
            (vec![b'a'; 100], "has 100 bytes"),
            (vec![b'0'; MSG_LEN], "no NUL terminator"),
            (
                {
                    let mut m = encode(&dest(0x11)).unwrap().to_vec();
                    m[51] = b'0';
                    m
                },
                "no NUL terminator",
            ),
            (vec![0; MSG_LEN], "found 1"),
            (msg("hello,world"), "found 1"),
            (msg(&format!("0000-000011-000000-{gid}")), "found 1"),
            (msg(&format!("0000:000011:000000{gid}")), "found 3"),
            (msg(&format!("0:11:0:{gid}:")), "found 5"),
            (
                msg(&format!("zzzz:000011:000000:{gid}")),
                "LID field \"zzzz\"",
            ),
            (
                msg(&format!("0000:0x0011:000000:{gid}")),
                "QPN field \"0x0011\"",
            ),
            (msg(&format!("0000:-00011:000000:{gid}")), "not hexadecimal"),
            (msg(&format!("0000:000011:+00000:{gid}")), "PSN field"),
            (msg(&format!("0000::000000:{gid}")), "QPN field is empty"),
            (msg("0000:000011:000000:"), "GID field is empty"),
            (
                msg(&format!("0000:1000000:00000:{gid}")),
                "QPN 0x1000000 does not fit in 24 bits",
            ),
            (
                msg(&format!("0000:ffffffffff:0:{gid}")),
                "QPN 0xffffffffff does not fit",
            ),
            (
                msg(&format!("0000:000011:1000000:{}", &gid[1..])),
                "PSN 0x1000000",
            ),
            (
                msg(&format!("10000:000011:00000:{gid}")),
                "LID 0x10000 does not fit in 16 bits",
            ),
            (
                msg(&format!("0000:000011:000000:{}", &gid[..30])),
                "30 hex digits, expected 32",
            ),
            (
                msg("0000:000011:000000:0123456789abcdef0123456789abcdeg"),
                "GID field",
            ),
            (
                msg(&format!("0000:000011:000000: {}", &gid[1..])),
                "byte 19 is 0x20",
            ),
            (
                {
                    let mut m = msg(&format!("0000:000011:000000:{gid}"));
                    m[3] = 0xc3;
                    m
                },
                "byte 3 is 0xc3",
            ),
        ];
        for (m, expected) in cases {
            let e = decode(&m).expect_err(&format!("{:?}", String::from_utf8_lossy(&m)));
            let text = e.to_string();
            assert!(
                text.contains(expected),
                "{:?}: {text:?} lacks {expected:?}",
                String::from_utf8_lossy(&m)
            );
        }
    }

    #[test]
    fn wire_done() {
        assert_eq!(DONE.len(), 5);
        check_done(b"done\0").unwrap();
        for bad in [&b"done"[..], b"DONE\0", b"done\0\0", b"", b"nope!"] {
            assert!(check_done(bad).is_err(), "{bad:?}");
        }
    }

    /// Expected values are glibc's `inet_ntop(AF_INET6, …)` (what the C tools print).
    #[test]
    fn gid_text_matches_inet_ntop() {
        let cases = [
            ("00000000000000000000000000000000", "::"),
            ("00000000000000000000000000000001", "::1"),
            ("00000000000000000000ffff0a00020f", "::ffff:10.0.2.15"),
            ("fe800000000000000000000000000001", "fe80::1"),
            ("0000000000000000000000000a00020f", "::10.0.2.15"),
            ("00000000000000000000000000000102", "::102"),
            ("00010000000000000000000000000000", "1::"),
            ("00010000000000010000000000000001", "1:0:0:1::1"),
            (
                "fe80000000000000020c29fffe1a2b3c",
                "fe80::20c:29ff:fe1a:2b3c",
            ),
            ("00000000000000000000fffe0a00020f", "::fffe:a00:20f"),
            ("20010db8000000010000000000000001", "2001:db8:0:1::1"),
            ("00010002000300040005000600070008", "1:2:3:4:5:6:7:8"),
            ("0000000000000000000000010a00020f", "::1:a00:20f"),
            ("00000000000000000000ffff00000000", "::ffff:0.0.0.0"),
            ("00010000000100000000000000010001", "1:0:1::1:1"),
            ("00010000000000010000000000010000", "1::1:0:0:1:0"),
        ];
        for (hex, text) in cases {
            let gid: [u8; 16] =
                std::array::from_fn(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap());
            assert_eq!(format_gid(&gid), text, "{hex}");
        }
    }
}
