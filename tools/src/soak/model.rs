//! What the soak expects: the model of each queue pair's remote counter
//! (the atomics) and the end-of-session ledger check (nothing lost, no
//! phantom message, the counter where the model says). Pure functions,
//! tested beside them.

/// One atomic operation on a counter.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Atomic {
    FetchAdd(u64),
    CompareSwap { compare: u64, swap: u64 },
}

impl Atomic {
    /// The counter after the operation, from `old`.
    pub(crate) fn apply(self, old: u64) -> u64 {
        match self {
            Atomic::FetchAdd(d) => old.wrapping_add(d),
            Atomic::CompareSwap { compare, swap } if old == compare => swap,
            Atomic::CompareSwap { .. } => old,
        }
    }
}

/// One queue pair's counter as this side knows it.
#[derive(Clone, Debug, Default)]
pub(crate) struct Counter {
    /// The value after the last operation that completed successfully.
    pub confirmed: u64,
    /// The value after every posted operation, were they all to execute.
    pub predicted: u64,
    /// Posted operations not yet completed successfully, in order.
    pub unconfirmed: std::collections::VecDeque<Atomic>,
    /// The last operation completed and the value it found.
    last: Option<(Atomic, u64)>,
}

impl Counter {
    pub(crate) fn new(initial: u64) -> Counter {
        Counter {
            confirmed: initial,
            predicted: initial,
            unconfirmed: Default::default(),
            last: None,
        }
    }
    /// Records a posted operation; returns the original value its
    /// completion must return.
    pub(crate) fn post(&mut self, op: Atomic) -> u64 {
        let old = self.predicted;
        self.predicted = op.apply(old);
        self.unconfirmed.push_back(op);
        old
    }
    /// A successful completion of the oldest posted operation that
    /// returned `got`; an error when it is not the model's value.
    ///
    /// After a mismatch the model follows the counter (what it returned,
    /// then this operation), so one divergence is reported once.
    pub(crate) fn complete(&mut self, got: u64) -> Result<(), String> {
        let op = self
            .unconfirmed
            .pop_front()
            .ok_or("an atomic completion with none posted")?;
        let want = self.confirmed;
        let last = self.last.replace((op, want));
        if got == want {
            self.confirmed = op.apply(want);
            return Ok(());
        }
        self.confirmed = op.apply(got);
        self.predicted = self
            .unconfirmed
            .iter()
            .fold(self.confirmed, |v, o| o.apply(v));
        // The one explanation the values can prove: the operation before
        // this one took effect a second time.
        let twice = match last {
            Some((prev, _)) if prev.apply(want) == got => {
                format!(" = the previous {prev:?} applied a second time")
            }
            _ => format!(" (difference {:#x})", got.wrapping_sub(want)),
        };
        Err(format!(
            "{op:?} returned {got:#x}, the model says {want:#x}{twice}"
        ))
    }
    /// A successful completion of the oldest posted operation whose result
    /// buffer the device never wrote (still the client's poison): always an
    /// error. The model takes the operation as executed, as the success
    /// says; if it did not execute, the next result shows it.
    pub(crate) fn complete_unwritten(&mut self) -> Result<(), String> {
        let op = self
            .unconfirmed
            .pop_front()
            .ok_or("an atomic completion with none posted")?;
        let want = self.confirmed;
        self.last = Some((op, want));
        self.confirmed = op.apply(want);
        Err(format!(
            "{op:?} completed successfully with its result never written (the poison from \
             before posting still there), the model says {want:#x}"
        ))
    }
    /// The values the remote counter may hold now: the confirmed one, then
    /// each prefix of the unconfirmed operations applied (a responder
    /// executes in order, so if one ran, all before it did).
    pub(crate) fn possible(&self) -> Vec<u64> {
        let mut v = vec![self.confirmed];
        let mut x = self.confirmed;
        for op in &self.unconfirmed {
            x = op.apply(x);
            v.push(x);
        }
        v
    }
}

/// What the client says of one queue pair at a session's end.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub(crate) struct ClientQp {
    /// Receive-consuming messages (send, write with immediate) that
    /// completed successfully.
    pub delivered: u64,
    /// Receive-consuming messages posted.
    pub posted: u64,
    /// Whether any request of this queue pair ended in an error (or was
    /// flushed): then the peer may hold more than `delivered`.
    pub errored: bool,
}

/// What the server says of one queue pair at a session's end.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub(crate) struct ServerQp {
    /// Messages received, in order, each checked.
    pub verified: u64,
    /// The counter's value in the server's memory.
    pub counter: u64,
    /// Messages that failed their check.
    pub corrupt: u64,
}

/// The verdict on one queue pair at a session's end.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Finding {
    /// Completed successfully at the client, never received.
    Lost(u64),
    /// Received more than was posted.
    Phantom(u64),
    /// The counter is none of the model's possible values.
    CounterMismatch { got: u64, possible: Vec<u64> },
    /// The server found messages wrong.
    Corrupt(u64),
}

/// Checks one queue pair's end: `client` and `counter` from this side,
/// `server` from the peer.
pub(crate) fn check_qp(client: &ClientQp, counter: &Counter, server: &ServerQp) -> Vec<Finding> {
    let mut f = Vec::new();
    if server.verified < client.delivered {
        f.push(Finding::Lost(client.delivered - server.verified));
    }
    let limit = match client.errored {
        true => client.posted,
        false => client.delivered,
    };
    if server.verified > limit {
        f.push(Finding::Phantom(server.verified - limit));
    }
    let possible = match client.errored {
        true => counter.possible(),
        false => vec![counter.confirmed],
    };
    if !possible.contains(&server.counter) {
        f.push(Finding::CounterMismatch {
            got: server.counter,
            possible,
        });
    }
    if server.corrupt > 0 {
        f.push(Finding::Corrupt(server.corrupt));
    }
    f
}

/// The client's `END` line: `END q:delivered,posted,errored …`.
pub(crate) fn end_line(qps: &[ClientQp]) -> String {
    let mut s = "END".to_string();
    for q in qps {
        s.push_str(&format!(
            " {},{},{}",
            q.delivered,
            q.posted,
            u8::from(q.errored)
        ));
    }
    s.push('\n');
    s
}

/// The server's `LEDGER` line: `LEDGER verified,counter,corrupt …`.
pub(crate) fn ledger_line(qps: &[ServerQp]) -> String {
    let mut s = "LEDGER".to_string();
    for q in qps {
        s.push_str(&format!(" {},{},{}", q.verified, q.counter, q.corrupt));
    }
    s.push('\n');
    s
}

fn fields<const N: usize>(line: &str, tag: &str, n: usize) -> Result<Vec<[u64; N]>, String> {
    let mut it = line.split_whitespace();
    if it.next() != Some(tag) {
        return Err(format!("expected {tag}, got {line:?}"));
    }
    let rows: Vec<[u64; N]> = it
        .map(|item| {
            let v: Vec<u64> = item
                .split(',')
                .map(|x| x.parse().map_err(|e| format!("{tag} {item:?}: {e}")))
                .collect::<Result<_, _>>()?;
            v.try_into()
                .map_err(|_| format!("{tag} {item:?}: not {N} numbers"))
        })
        .collect::<Result<_, String>>()?;
    match rows.len() == n {
        true => Ok(rows),
        false => Err(format!(
            "{tag} has {} queue pairs, expected {n}",
            rows.len()
        )),
    }
}

pub(crate) fn parse_end(line: &str, n: usize) -> Result<Vec<ClientQp>, String> {
    Ok(fields::<3>(line, "END", n)?
        .into_iter()
        .map(|[delivered, posted, e]| ClientQp {
            delivered,
            posted,
            errored: e != 0,
        })
        .collect())
}

pub(crate) fn parse_ledger(line: &str, n: usize) -> Result<Vec<ServerQp>, String> {
    Ok(fields::<3>(line, "LEDGER", n)?
        .into_iter()
        .map(|[verified, counter, corrupt]| ServerQp {
            verified,
            counter,
            corrupt,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_model_checks_every_returned_value() {
        let mut c = Counter::new(10);
        assert_eq!(c.post(Atomic::FetchAdd(5)), 10);
        assert_eq!(
            c.post(Atomic::CompareSwap {
                compare: 15,
                swap: 100
            }),
            15
        );
        // A compare that fails leaves the counter.
        assert_eq!(
            c.post(Atomic::CompareSwap {
                compare: 1,
                swap: 7
            }),
            100
        );
        assert_eq!(c.complete(10), Ok(()));
        // An atomic executed twice (a duplicate not answered from the
        // responder's cache) returns the wrong original value.
        // (10 + 5 = 15 is what it should find: 20 is the fetch-and-add of 5
        // applied a second time.)
        let e = c.complete(20).unwrap_err();
        assert!(
            e.contains("the model says 0xf = the previous FetchAdd(5) applied a second time"),
            "{e}"
        );
        // The model follows the counter: 20 did not match 15, so no swap.
        assert_eq!((c.confirmed, c.predicted), (20, 20));
        let e = c.complete(100).unwrap_err();
        assert!(e.contains("(difference"), "{e}");
        assert!(c.complete(100).is_err());
    }

    #[test]
    fn a_result_never_written_is_an_error_and_the_model_keeps_its_course() {
        let mut c = Counter::new(1);
        c.post(Atomic::CompareSwap {
            compare: 1,
            swap: 50,
        });
        c.post(Atomic::FetchAdd(2));
        let e = c.complete_unwritten().unwrap_err();
        assert!(
            e.contains("never written") && e.contains("model says 0x1"),
            "{e}"
        );
        // Taken as executed (the swap): the next one must find 50.
        assert_eq!(c.complete(50), Ok(()));
        assert_eq!((c.confirmed, c.predicted), (52, 52));
        assert!(c.complete_unwritten().is_err(), "none posted");
    }

    #[test]
    fn after_an_error_any_executed_prefix_is_possible() {
        let mut c = Counter::new(1);
        c.post(Atomic::FetchAdd(1));
        c.post(Atomic::FetchAdd(10));
        c.complete(1).unwrap();
        c.post(Atomic::FetchAdd(100));
        assert_eq!(c.possible(), vec![2, 12, 112]);
    }

    #[test]
    fn the_ledger_finds_lost_phantom_and_counter_errors() {
        let mut c = Counter::new(0);
        c.post(Atomic::FetchAdd(3));
        c.complete(0).unwrap();
        let clean = ClientQp {
            delivered: 5,
            posted: 5,
            errored: false,
        };
        let s = |verified, counter| ServerQp {
            verified,
            counter,
            corrupt: 0,
        };
        assert!(check_qp(&clean, &c, &s(5, 3)).is_empty());
        assert_eq!(check_qp(&clean, &c, &s(4, 3)), vec![Finding::Lost(1)]);
        assert_eq!(check_qp(&clean, &c, &s(6, 3)), vec![Finding::Phantom(1)]);
        assert!(matches!(
            check_qp(&clean, &c, &s(5, 6))[..],
            [Finding::CounterMismatch { got: 6, .. }]
        ));
        // With an error, anything between delivered and posted was maybe
        // received; fewer than delivered is still lost.
        let err = ClientQp {
            delivered: 5,
            posted: 8,
            errored: true,
        };
        c.post(Atomic::FetchAdd(1));
        assert!(check_qp(&err, &c, &s(8, 4)).is_empty());
        assert!(check_qp(&err, &c, &s(5, 3)).is_empty());
        assert_eq!(check_qp(&err, &c, &s(9, 4)), vec![Finding::Phantom(1)]);
        assert_eq!(check_qp(&err, &c, &s(4, 4)), vec![Finding::Lost(1)]);
        let bad = ServerQp {
            verified: 5,
            counter: 3,
            corrupt: 2,
        };
        assert_eq!(
            check_qp(&clean, &Counter::new(3), &bad),
            vec![Finding::Corrupt(2)]
        );
    }

    #[test]
    fn end_and_ledger_lines_round_trip_and_refuse_garbage() {
        let qps = vec![
            ClientQp {
                delivered: 1,
                posted: 2,
                errored: true,
            },
            ClientQp::default(),
        ];
        assert_eq!(parse_end(&end_line(&qps), 2).unwrap(), qps);
        let l = vec![ServerQp {
            verified: 7,
            counter: u64::MAX,
            corrupt: 0,
        }];
        assert_eq!(parse_ledger(&ledger_line(&l), 1).unwrap(), l);
        assert!(parse_end("END 1,2", 1)
            .unwrap_err()
            .contains("not 3 numbers"));
        assert!(parse_end("END 1,2,0", 2)
            .unwrap_err()
            .contains("expected 2"));
        assert!(parse_ledger("END 1,2,0", 1).is_err());
        assert!(parse_ledger("LEDGER x,1,2", 1).is_err());
    }
}
