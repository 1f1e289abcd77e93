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
//! Pure and dependency-free (std only), so that `tests/pingpong_interop.rs`
//! can include it with `#[path]` and test it on any host.

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
