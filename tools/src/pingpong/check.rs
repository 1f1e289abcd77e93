//! `-c`: what the ping-pongs write into every message and check in every
//! message they receive ([`crate::integrity`]'s pattern, or rdma-core's
//! buffer from a C client). What is accepted from which peer, precisely:
//! docs/tools.md, "Validation options".

use crate::integrity::{self, first_difference, Corrupt, Difference, Mismatch, HEADER_END};

use super::{c_fill, page_size, Config, Failure, Res, Transport};

/// `-c`'s state in a run: per QP, the sequence numbers received and sent.
pub(super) struct Checker {
    prog: String,
    server: bool,
    size: usize,
    /// Offset of the payload in a receive buffer (the GRH for UD).
    recv_offset: usize,
    /// rdma-core's buffer: its fill byte and page size (0 at page starts).
    c_fill: u8,
    page: usize,
    /// Server: what the client sends, decided by its first message
    /// (`true`: rdma-core's buffer, `false`: our pattern).
    peer_is_c: Option<bool>,
    /// Per QP: messages received and sent (the last sequence numbers).
    recv_seq: Vec<u32>,
    sent_seq: Vec<u32>,
    /// Client with several QPs (srq): per QP, the lowest sequence number any
    /// QP had sent when this one sent its last message. rdma-core's SRQ
    /// server receives every QP's messages into one buffer and echoes that
    /// buffer, so the reply on one QP is the latest message the server got
    /// on any QP: one sent no earlier than that.
    window_lo: Option<Vec<u32>>,
    corrupt: Option<Corrupt>,
}

impl Checker {
    pub(super) fn new(prog: &str, cfg: &Config, server: bool, recv_offset: usize) -> Res<Checker> {
        let n = cfg.num_qp as usize;
        Ok(Checker {
            prog: prog.to_string(),
            server,
            size: cfg.size as usize,
            recv_offset,
            c_fill: c_fill(cfg.transport),
            page: page_size(),
            peer_is_c: None,
            recv_seq: vec![0; n],
            sent_seq: vec![0; n],
            window_lo: (!server && cfg.transport == Transport::Srq && n > 1).then(|| vec![0; n]),
            corrupt: Corrupt::from_env()?,
        })
    }

    /// rdma-core's `-c` buffer: its fill, 0 at every page start.
    fn c_byte(&self, i: usize) -> u8 {
        if i % self.page == 0 {
            0
        } else {
            self.c_fill
        }
    }

    /// Checks the message that just arrived on QP `qp` (`len` bytes by its
    /// completion, in `buf`).
    ///
    /// # Errors
    /// The first mismatch, naming the iteration (the QP's sequence number),
    /// the QP when there are several, the first differing offset and its
    /// expected and received bytes.
    pub(super) fn received(&mut self, qp: usize, len: usize, buf: &[u8]) -> Res<()> {
        let seq = self.recv_seq[qp].wrapping_add(1);
        self.recv_seq[qp] = seq;
        let from = if self.server { "client" } else { "server" };
        let on = if self.recv_seq.len() > 1 {
            format!(" on QP [{qp}]")
        } else {
            String::new()
        };
        let fail = |what: String| {
            Failure(format!(
                "-c: iteration {seq}: the message from the {from}{on} {what}; stopping (no retry)"
            ))
        };
        if len != self.recv_offset + self.size {
            return Err(fail(format!(
                "has {} bytes, not {}",
                len.saturating_sub(self.recv_offset),
                self.size
            )));
        }
        let payload = &buf[self.recv_offset..self.recv_offset + self.size];
        if !self.server {
            // Ours and rdma-core's servers echo our message.
            return self
                .check_reply(qp, seq, payload)
                .map_err(|m| fail(format!("is {m}")));
        }
        let c = || first_difference(payload, |i| self.c_byte(i));
        let c_said = |d: Difference| format!("not rdma-core's -c buffer: {d}");
        match self.peer_is_c {
            Some(true) => match c() {
                None => Ok(()),
                Some(d) => Err(fail(format!("is {}", c_said(d)))),
            },
            Some(false) => integrity::check(payload, seq).map_err(|m| fail(format!("is {m}"))),
            None => match (integrity::check(payload, seq), c()) {
                (Ok(()), _) => {
                    self.peer_is_c = Some(false);
                    Ok(())
                }
                (Err(_), None) => {
                    self.peer_is_c = Some(true);
                    Ok(())
                }
                (Err(m), Some(d)) => Err(fail(format!("is {m}, and {}", c_said(d)))),
            },
        }
    }

    /// A reply is our message `seq`, or with rdma-core's SRQ server and
    /// several QPs, our message of any sequence number in the window.
    fn check_reply(&self, qp: usize, seq: u32, payload: &[u8]) -> Result<(), Mismatch> {
        let err = match integrity::check(payload, seq) {
            Ok(()) => return Ok(()),
            Err(m) => m,
        };
        let Some(lo) = self.window_lo.as_ref().map(|w| w[qp]) else {
            return Err(err);
        };
        let hi = self.sent_seq.iter().copied().max().unwrap_or(0);
        let fits = |s: u32| (lo..=hi).contains(&s) && integrity::check(payload, s).is_ok();
        let ok = if payload.len() >= HEADER_END {
            fits(integrity::carried(payload).0)
        } else {
            (lo..=hi).any(fits)
        };
        if ok {
            Ok(())
        } else {
            Err(err)
        }
    }

    /// Writes QP `qp`'s next message into `buf`: the client its next
    /// sequence number's pattern, the server what it just received (which
    /// it checked byte by byte), as rdma-core's server echoes.
    pub(super) fn write(&mut self, qp: usize, buf: &mut [u8]) {
        let seq = if self.server {
            self.recv_seq[qp]
        } else {
            self.sent_seq[qp].wrapping_add(1)
        };
        if self.server && self.peer_is_c == Some(true) {
            for (i, b) in buf.iter_mut().enumerate() {
                *b = self.c_byte(i);
            }
        } else {
            integrity::fill(buf, seq);
        }
        if let Some(k) = &self.corrupt {
            k.apply(&self.prog, seq, buf);
        }
        self.sent_seq[qp] = seq;
        if let Some(w) = &mut self.window_lo {
            w[qp] = self.sent_seq.iter().copied().min().unwrap_or(0);
        }
    }
}
