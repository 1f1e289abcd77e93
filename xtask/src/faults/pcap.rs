//! Reading the RoCE v2 packet traces `--capture` keeps (`N.pcap`, vm1's
//! eth1, 96 bytes of each packet): the base transport header of every
//! packet, the ACK extended header of acknowledgements, and what came just
//! before the first NAK that failed the queue pair. Enough to say what the
//! responder refused and what the wire carried at that moment.

use std::fmt::Write as _;
use std::path::Path;

/// One RoCE v2 packet.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Packet {
    /// Seconds since the trace's first packet.
    pub t: f64,
    /// Source IPv4 address's last byte (which side sent it).
    pub src: u8,
    pub opcode: u8,
    pub dest_qp: u32,
    pub psn: u32,
    /// The AETH syndrome of an acknowledgement (ACK, read responses
    /// first/last/only, atomic ACK).
    pub syndrome: Option<u8>,
    /// The payload's length (from the UDP length: the capture keeps only
    /// the first bytes).
    pub payload: usize,
    /// The first 16 payload bytes of a SEND_FIRST/SEND_ONLY: `fault_peer`'s
    /// message header (sequence number, checksum), which names the message.
    pub head: Option<[u8; 16]>,
}

/// RC opcode names (IBTA table 39, the RC block).
fn opcode_name(op: u8) -> &'static str {
    const N: [&str; 21] = [
        "SEND_FIRST",
        "SEND_MIDDLE",
        "SEND_LAST",
        "SEND_LAST_IMM",
        "SEND_ONLY",
        "SEND_ONLY_IMM",
        "WRITE_FIRST",
        "WRITE_MIDDLE",
        "WRITE_LAST",
        "WRITE_LAST_IMM",
        "WRITE_ONLY",
        "WRITE_ONLY_IMM",
        "READ_REQ",
        "READ_RESP_FIRST",
        "READ_RESP_MIDDLE",
        "READ_RESP_LAST",
        "READ_RESP_ONLY",
        "ACK",
        "ATOMIC_ACK",
        "CMP_SWAP",
        "FETCH_ADD",
    ];
    N.get(op as usize).copied().unwrap_or("OTHER")
}

/// The meaning of an AETH syndrome.
fn syndrome_name(s: u8) -> String {
    match s >> 5 {
        0 => "ACK".into(),
        1 => format!("RNR NAK (timer {})", s & 0x1f),
        3 => match s & 0x1f {
            0 => "NAK PSN sequence error".into(),
            1 => "NAK invalid request".into(),
            2 => "NAK remote access error".into(),
            3 => "NAK remote operational error".into(),
            4 => "NAK invalid RD request".into(),
            c => format!("NAK code {c}"),
        },
        _ => format!("reserved syndrome {s:#x}"),
    }
}

/// Whether a syndrome is a NAK that fails the requester's queue pair
/// (not a sequence error, which only makes it retransmit).
fn fatal(s: u8) -> bool {
    s >> 5 == 3 && s & 0x1f != 0
}

/// The packets of a pcap file (Ethernet, IPv4, UDP port 4791; anything
/// else is skipped).
pub(crate) fn parse(bytes: &[u8]) -> Result<Vec<Packet>, String> {
    if bytes.len() < 24 {
        return Err("not a pcap file (too short)".into());
    }
    let magic = u32::from_le_bytes(bytes[0..4].try_into().unwrap());
    let (le, nanos) = match magic {
        0xa1b2_c3d4 => (true, false),
        0xa1b2_3c4d => (true, true),
        0xd4c3_b2a1 => (false, false),
        0x4d3c_b2a1 => (false, true),
        m => return Err(format!("not a pcap file (magic {m:#x})")),
    };
    let u32_at = |b: &[u8], i: usize| {
        let a: [u8; 4] = b[i..i + 4].try_into().unwrap();
        match le {
            true => u32::from_le_bytes(a),
            false => u32::from_be_bytes(a),
        }
    };
    let mut out = Vec::new();
    let mut at = 24;
    let mut t0 = None;
    while at + 16 <= bytes.len() {
        let sec = u32_at(bytes, at) as f64;
        let frac = u32_at(bytes, at + 4) as f64;
        let incl = u32_at(bytes, at + 8) as usize;
        let data = bytes
            .get(at + 16..at + 16 + incl)
            .ok_or("a truncated record")?;
        at += 16 + incl;
        let t = sec + frac / if nanos { 1e9 } else { 1e6 };
        let t = t - *t0.get_or_insert(t);
        // Ethernet (IPv4), IPv4 (UDP), UDP to 4791, then the BTH.
        if data.len() < 14 + 20 || data[12..14] != [0x08, 0x00] {
            continue;
        }
        let ip = &data[14..];
        let ihl = usize::from(ip[0] & 0x0f) * 4;
        if ip[9] != 17 || ip.len() < ihl + 8 + 12 {
            continue;
        }
        let udp = &ip[ihl..];
        if u16::from_be_bytes([udp[2], udp[3]]) != 4791 {
            continue;
        }
        let bth = &udp[8..];
        let opcode = bth[0];
        let dest_qp = u32::from_be_bytes([0, bth[5], bth[6], bth[7]]);
        let psn = u32::from_be_bytes([0, bth[9], bth[10], bth[11]]);
        let has_aeth = matches!(opcode, 13 | 15 | 16 | 17 | 18);
        let syndrome = match has_aeth {
            true => bth.get(12).copied(),
            false => None,
        };
        // UDP, BTH and ICRC; an AETH, the immediate or a RETH come out of
        // the payload too.
        let extra = match opcode {
            13 | 15 | 16 | 17 => 4,
            18 => 12,
            3 | 5 | 9 => 4,
            6 | 10 | 12 | 19 | 20 => 16,
            11 => 20,
            _ => 0,
        };
        let udp_len = usize::from(u16::from_be_bytes([udp[4], udp[5]]));
        let payload = udp_len.saturating_sub(8 + 12 + 4 + extra);
        let head = match opcode {
            0 | 4 | 5 => bth.get(12..28).and_then(|h| h.try_into().ok()),
            _ => None,
        };
        out.push(Packet {
            t,
            src: ip[15],
            opcode,
            dest_qp,
            psn,
            syndrome,
            payload,
            head,
        });
    }
    Ok(out)
}

/// What the trace says: packet counts, the first fatal NAK (if any) and
/// the packets before it; `lines` of them.
pub(super) fn describe(packets: &[Packet], lines: usize) -> String {
    let mut s = String::new();
    let acks = packets.iter().filter(|p| p.syndrome.is_some()).count();
    let _ = writeln!(
        s,
        "{} RoCE packets ({} requests, {acks} acknowledgements or responses)",
        packets.len(),
        packets.len() - acks
    );
    // A message (named by its header) sent again from another PSN than
    // the first time: the requester renumbered its packets.
    let mut first: std::collections::HashMap<[u8; 16], u32> = Default::default();
    let mut moved = Vec::new();
    for p in packets {
        let Some(h) = p.head else { continue };
        match first.get(&h) {
            Some(&psn) if psn != p.psn => moved.push((p, psn)),
            Some(_) => {}
            None => {
                first.insert(h, p.psn);
            }
        }
    }
    for (p, was) in moved.iter().take(3) {
        let seq = u64::from_le_bytes(
            p.head.unwrap_or_default()[..8]
                .try_into()
                .unwrap_or_default(),
        );
        let _ = writeln!(
            s,
            "message {seq} (by its header) first sent from PSN {was:#08x}, sent again from PSN {:#08x} at {:.6} s",
            p.psn, p.t
        );
    }
    if moved.len() > 3 {
        let _ = writeln!(s, "… {} such messages in all", moved.len());
    }
    let empty: Vec<&Packet> = packets
        .iter()
        .filter(|p| p.opcode == 4 && p.payload == 0)
        .collect();
    if let Some(p) = empty.first() {
        let _ = writeln!(
            s,
            "{} zero-length SEND_ONLY packet(s), the first at {:.6} s, PSN {:#08x}",
            empty.len(),
            p.t,
            p.psn
        );
    }
    let Some(k) = packets.iter().position(|p| p.syndrome.is_some_and(fatal)) else {
        let _ = writeln!(s, "no NAK that fails a queue pair");
        return s;
    };
    let nak = &packets[k];
    let copies = packets[..k]
        .iter()
        .filter(|p| p.syndrome.is_none() && p.psn == nak.psn)
        .count();
    let _ = writeln!(
        s,
        "first fatal NAK: {} for PSN {:#08x} at {:.6} s; PSN {:#08x} was sent {copies} times before it",
        syndrome_name(nak.syndrome.unwrap_or(0)),
        nak.psn,
        nak.t,
        nak.psn
    );
    for p in &packets[k.saturating_sub(lines)..=k] {
        let _ = writeln!(
            s,
            "  {:>10.6}  from .{:<3} {:<16} qp {:#06x} psn {:#08x}{}",
            p.t,
            p.src,
            opcode_name(p.opcode),
            p.dest_qp,
            p.psn,
            p.syndrome
                .map_or(String::new(), |y| format!("  {}", syndrome_name(y)))
        );
    }
    s
}

/// `describe` of the trace at `path`.
pub(super) fn analyze(path: &Path, lines: usize) -> Result<String, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(describe(&parse(&bytes)?, lines))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pcap of `(opcode, psn, syndrome)` packets from .1 (requests) and
    /// .2 (acknowledgements).
    fn pcap(packets: &[(u8, u32, Option<u8>)]) -> Vec<u8> {
        let mut b = Vec::new();
        for v in [0xa1b2_c3d4u32, 0x0004_0002, 0, 0, 96, 1] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.truncate(24);
        for (i, &(op, psn, syn)) in packets.iter().enumerate() {
            let mut d = vec![0u8; 14];
            d[12..14].copy_from_slice(&[0x08, 0x00]);
            let mut ip = vec![0u8; 20];
            ip[0] = 0x45;
            ip[9] = 17;
            ip[15] = if syn.is_some() { 2 } else { 1 };
            d.extend_from_slice(&ip);
            let p = psn.to_be_bytes();
            let mut bth = vec![op, 0, 0xff, 0xff, 0, 0, 0, 0x11, 0x80, p[1], p[2], p[3]];
            if let Some(y) = syn {
                bth.extend_from_slice(&[y, 0, 0, 1]);
            }
            // A send's payload: 1 KiB whose first 8 bytes name it (its
            // PSN's low byte, shifted back for the renumbered one below);
            // op 4 with PSN 99 is a zero-length SEND_ONLY.
            let len = match (op, psn) {
                (4, 99) => 0,
                (0..=4, _) => 1024,
                _ => 0,
            };
            if op == 0 || (op == 4 && len > 0) {
                let name = if psn == 13 { 10u8 } else { psn as u8 };
                bth.extend_from_slice(&[name, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8]);
            }
            let udp_len = (8 + 12 + 4 + len + if syn.is_some() { 4 } else { 0 }) as u16;
            let u = udp_len.to_be_bytes();
            d.extend_from_slice(&[0x12, 0x34, 0x12, 0xb7, u[0], u[1], 0, 0]);
            d.extend_from_slice(&bth);
            for v in [i as u32, 0, d.len() as u32, d.len() as u32] {
                b.extend_from_slice(&v.to_le_bytes());
            }
            b.extend_from_slice(&d);
        }
        b
    }

    #[test]
    fn a_trace_names_the_fatal_nak_and_what_came_before() {
        let b = pcap(&[
            (0, 10, None),
            (1, 11, None),
            (1, 11, None),
            (17, 10, Some(0x60)), // a sequence NAK: the requester retransmits
            (2, 12, None),
            (17, 12, Some(0x61)), // invalid request: fatal
        ]);
        let p = parse(&b).unwrap();
        assert_eq!(p.len(), 6);
        assert_eq!((p[1].opcode, p[1].psn, p[1].src), (1, 11, 1));
        assert_eq!(p[5].syndrome, Some(0x61));
        let d = describe(&p, 3);
        assert!(
            d.contains("6 RoCE packets (4 requests, 2 acknowledgements"),
            "{d}"
        );
        assert!(
            d.contains("first fatal NAK: NAK invalid request for PSN 0x00000c"),
            "{d}"
        );
        assert!(d.contains("PSN 0x00000c was sent 1 times"), "{d}");
        assert!(
            d.contains("SEND_MIDDLE") && d.contains("NAK PSN sequence error"),
            "{d}"
        );
        // The requester renumbered a message (first sent from PSN 10,
        // again from 13) after a zero-length SEND_ONLY.
        let b = pcap(&[(0, 10, None), (2, 11, None), (4, 99, None), (0, 13, None)]);
        let p = parse(&b).unwrap();
        assert_eq!((p[0].payload, p[2].payload), (1024, 0));
        let d = describe(&p, 3);
        assert!(
            d.contains("message 10 (by its header) first sent from PSN 0x00000a, sent again from PSN 0x00000d"),
            "{d}"
        );
        assert!(d.contains("1 zero-length SEND_ONLY packet(s)"), "{d}");
        let clean = describe(&parse(&pcap(&[(4, 1, None), (17, 1, Some(0))])).unwrap(), 3);
        assert!(clean.contains("no NAK that fails"), "{clean}");
        assert!(parse(&[0u8; 30]).is_err());
    }
}
