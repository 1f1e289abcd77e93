//! Reading the soak's packet trace (`--capture`: vm1's eth1, headers
//! only): for each queue pair with a finding, the plain acknowledgements
//! the client received carrying the PSN of one of its atomics or of a
//! packet of one of its reads' responses. A requester must complete a read
//! only with its response packets and an atomic only with an atomic
//! acknowledgement (which carries the original value); a plain ACK at such
//! a PSN that the requester takes as completing the request completes it
//! without its data. The client's `QPS` lines name each session's queue
//! pair numbers (the trace knows no indexes).

use std::collections::{BTreeMap, BTreeSet};

use crate::faults::pcap::Packet;

/// RC opcodes (IBTA table 39).
const READ_REQ: u8 = 12;
const ACK: u8 = 17;
const CMP_SWAP: u8 = 19;
const FETCH_ADD: u8 = 20;

/// What the trace shows of one queue pair.
#[derive(Debug, Default, PartialEq)]
pub(super) struct QpTrace {
    /// Distinct PSNs of its atomics and of its reads' responses.
    pub atomics: usize,
    pub reads: usize,
    /// Plain (non-NAK) ACKs received at an atomic's PSN, or inside a
    /// read's response PSNs: their PSNs, each once.
    pub ack_at_atomic: Vec<u32>,
    pub ack_at_read: Vec<u32>,
}

/// The trace of queue pair `qpn` (the client's and the server's numbers
/// are the trace's `dest_qp` of responses and of requests). A read at PSN
/// `p` owns the PSNs up to the next request's first PSN (its responses
/// have no request packets of their own).
pub(super) fn qp_trace(packets: &[Packet], client_qpn: u32, server_qpn: u32) -> QpTrace {
    let requests: Vec<&Packet> = packets
        .iter()
        .filter(|p| {
            p.dest_qp == server_qpn && p.syndrome.is_none() && !(13..=18).contains(&p.opcode)
        })
        .collect();
    let starts: BTreeSet<u32> = requests.iter().map(|p| p.psn).collect();
    let atomics: BTreeSet<u32> = requests
        .iter()
        .filter(|p| matches!(p.opcode, CMP_SWAP | FETCH_ADD))
        .map(|p| p.psn)
        .collect();
    // Each read's PSNs: from its own to just before the next request's.
    let mut reads: BTreeMap<u32, u32> = BTreeMap::new();
    for p in requests.iter().filter(|p| p.opcode == READ_REQ) {
        let end = starts
            .range(p.psn + 1..)
            .next()
            .copied()
            .unwrap_or(p.psn + 1);
        reads.insert(p.psn, end);
    }
    let in_read = |psn: u32| {
        reads
            .range(..=psn)
            .next_back()
            .is_some_and(|(_, &end)| psn < end)
    };
    let mut t = QpTrace {
        atomics: atomics.len(),
        reads: reads.len(),
        ..QpTrace::default()
    };
    let acks: BTreeSet<u32> = packets
        .iter()
        .filter(|p| p.dest_qp == client_qpn && p.opcode == ACK)
        .filter(|p| p.syndrome.is_some_and(|s| s >> 5 == 0))
        .map(|p| p.psn)
        .collect();
    for psn in acks {
        if atomics.contains(&psn) {
            t.ack_at_atomic.push(psn);
        } else if in_read(psn) {
            t.ack_at_read.push(psn);
        }
    }
    t
}

/// The client's `QPS session=<id> <q>:<client qpn>:<server qpn> …` lines:
/// (session, queue pair index) → (client QPN, server QPN).
pub(super) fn qp_numbers(client_out: &str) -> BTreeMap<(String, usize), (u32, u32)> {
    let mut m = BTreeMap::new();
    for l in client_out.lines().filter(|l| l.starts_with("QPS ")) {
        let mut w = l.split_whitespace().skip(1);
        let Some(session) = w.next().and_then(|s| s.strip_prefix("session=")) else {
            continue;
        };
        for x in w {
            let v: Vec<u32> = x.split(':').filter_map(|n| n.parse().ok()).collect();
            if let [q, c, s] = v[..] {
                m.insert((session.to_string(), q as usize), (c, s));
            }
        }
    }
    m
}

/// The (session, queue pair) a `CORRUPT`/`FINDING` line names.
pub(super) fn finding_qp(line: &str) -> Option<(String, usize)> {
    let field = |k: &str| {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(k))
            .map(str::to_string)
    };
    Some((field("session=")?, field("qp=")?.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pkt(opcode: u8, dest_qp: u32, psn: u32, syndrome: Option<u8>) -> Packet {
        Packet {
            t: 0.0,
            src: 1,
            opcode,
            dest_qp,
            psn,
            syndrome,
            payload: 0,
            head: None,
        }
    }

    /// Built as in the traces of the soak's findings: the responder
    /// answered a retransmitted send with a plain ACK carrying the PSN of
    /// the fetch-and-add behind it; a read of three packets took PSNs
    /// 20..23 and an ACK at 21 falls inside it.
    #[test]
    fn plain_acks_at_atomic_and_read_psns_are_found() {
        let (c, s) = (7, 9);
        let packets = [
            pkt(4, s, 10, None),         // SEND_ONLY
            pkt(FETCH_ADD, s, 11, None), // the atomic
            pkt(ACK, c, 10, Some(0)),
            pkt(4, s, 10, None),      // the send again
            pkt(ACK, c, 11, Some(0)), // a plain ACK at the atomic's PSN
            pkt(18, c, 11, Some(0)),  // its ATOMIC_ACK, too late
            pkt(READ_REQ, s, 20, None),
            pkt(4, s, 23, None),
            pkt(ACK, c, 21, Some(0)),    // inside the read's PSNs
            pkt(ACK, c, 23, Some(0)),    // the send after it: fine
            pkt(ACK, c, 11, Some(0x60)), // a NAK: not an ACK
            pkt(ACK, 99, 11, Some(0)),   // another queue pair's
        ];
        let t = qp_trace(&packets, c, s);
        assert_eq!(
            t,
            QpTrace {
                atomics: 1,
                reads: 1,
                ack_at_atomic: vec![11],
                ack_at_read: vec![21],
            }
        );
        // Broken on purpose: without the ACK at 11, nothing at the atomic.
        let clean: Vec<Packet> = packets
            .into_iter()
            .filter(|p| {
                !(p.opcode == ACK && p.psn == 11 && p.dest_qp == c && p.syndrome == Some(0))
            })
            .collect();
        assert!(qp_trace(&clean, c, s).ack_at_atomic.is_empty());
    }

    #[test]
    fn queue_pair_numbers_and_findings_are_read_from_the_lines() {
        let m = qp_numbers("SESSION 1 end=ok\nQPS session=42 0:17:18 1:19:20\n");
        assert_eq!(m.get(&("42".into(), 1)), Some(&(19, 20)));
        assert_eq!(m.len(), 2);
        assert_eq!(
            finding_qp("CORRUPT at=1.0 side=client session=42 qp=1 FetchAdd(1) completed"),
            Some(("42".into(), 1))
        );
        assert_eq!(
            finding_qp("CORRUPT at=1.0 a buffer came back in pieces"),
            None
        );
    }
}
