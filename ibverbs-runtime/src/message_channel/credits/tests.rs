//! The credit accounting on its own: the checks one by one, then two ends
//! run against each other in random orders, counting each end's posted
//! receives: never zero when a message lands (the bound of the module
//! docs), never more control messages pending than the reserve, and every
//! message delivered (no deadlock).

use std::collections::VecDeque;

use super::*;

/// The immediate data of a data message numbered `seq` returning nothing,
/// as a peer that ignores its credits would send it.
fn data(seq: u16) -> u32 {
    u32::from(seq) << SEQ_SHIFT
}

/// The immediate data of a credit message numbered `seq` returning
/// `returned`, whatever the sender holds.
fn credit(seq: u16, returned: u32) -> u32 {
    (u32::from(seq) << SEQ_SHIFT) | CONTROL | returned
}

#[test]
fn threshold_and_reserve() {
    assert_eq!((threshold(1), reserve(1)), (1, 1));
    assert_eq!((threshold(2), reserve(2)), (1, 2));
    assert_eq!((threshold(3), reserve(3)), (2, 1));
    assert_eq!((threshold(4), reserve(4)), (2, 2));
    assert_eq!((threshold(5), reserve(5)), (3, 1));
    for w in 1..=MAX_WINDOW {
        let (t, r) = (threshold(w), reserve(w));
        assert!(t >= 1 && t <= w, "{w}");
        // Credit messages carry >= t each and <= w in all: <= w / t of them.
        assert_eq!(r, (w / t).max(1), "{w}");
        assert!(r <= 2);
    }
}

#[test]
fn hello_first_then_credits() {
    let mut a = Credits::new(4);
    let mut b = Credits::new(4);
    assert_eq!(a.credits(), 0);
    // B's hello reaches A.
    let imm = b.stamp(false);
    assert_eq!(a.receive(imm, HELLO_LEN), Ok(Incoming::Hello));
    a.hello();
    assert_eq!(a.credits(), 4);
    assert!(a.ready());
    // Data before A's hello reached B is refused at B.
    let first = a.stamp(true);
    assert_eq!(
        b.receive(first, 10),
        Err(ChannelProblem::Unexpected {
            what: "a message before the peer's hello"
        })
    );
}

#[test]
fn every_check_refuses_with_its_numbers() {
    let mut a = Credits::new(4);
    let mut b = Credits::new(4);
    let h = b.stamp(false);
    a.receive(h, HELLO_LEN).unwrap();
    a.hello();
    let h = a.stamp(false);
    b.receive(h, HELLO_LEN).unwrap();
    b.hello();
    // A sends two; B gets them.
    for _ in 0..2 {
        let m = a.stamp(true);
        assert_eq!(b.receive(m, 100), Ok(Incoming::Data));
    }
    assert_eq!(a.credits(), 2);
    // A sequence skipped.
    let mut skip = b.clone();
    let _lost = skip.stamp(true);
    let m = skip.stamp(true);
    assert_eq!(
        a.clone().receive(m, 1),
        Err(ChannelProblem::Sequence {
            got: 2,
            expected: 1
        })
    );
    // Too many credits back: B holds 2, says 3.
    let m = credit(b.tx_seq, 3);
    assert_eq!(
        a.clone().receive(m, 0),
        Err(ChannelProblem::Credits {
            returned: 3,
            outstanding: 2
        })
    );
    // An honest return of 2, once B released both.
    let mut honest = b.clone();
    honest.release();
    honest.release();
    let m = honest.stamp(false);
    assert_eq!(m & RETURNED_MASK, 2);
    let mut a2 = a.clone();
    assert_eq!(a2.receive(m, 0), Ok(Incoming::Credit));
    assert_eq!(a2.credits(), 4);
    // A control message with a payload, a second hello.
    let m = b.clone().stamp(false);
    assert!(matches!(
        a.clone().receive(m, 5),
        Err(ChannelProblem::Unexpected { .. })
    ));
    assert_eq!(
        a.clone().receive(m, HELLO_LEN),
        Err(ChannelProblem::Unexpected {
            what: "a second hello"
        })
    );
    // An overrun: A sends a fifth data message without a credit.
    let mut b2 = b.clone();
    let next = a.tx_seq;
    for k in 0..2 {
        b2.receive(data(next + k), 1).unwrap();
    }
    assert_eq!(
        b2.receive(data(next + 2), 1),
        Err(ChannelProblem::Overrun { held: 5, window: 4 })
    );
}

#[test]
fn sequence_numbers_wrap() {
    let mut a = Credits::new(1);
    let mut b = Credits::new(1);
    let h = b.stamp(false);
    a.receive(h, HELLO_LEN).unwrap();
    a.hello();
    // A's hello is not modelled here: B counts from A's first data message.
    b.hello_seen = true;
    for _ in 0..(3 * u32::from(SEQ_MASK)) {
        let m = a.stamp(true);
        assert_eq!(b.receive(m, 0), Ok(Incoming::Data));
        b.release();
        let back = b.stamp(false);
        assert_eq!(a.receive(back, 0), Ok(Incoming::Credit));
    }
}

/// A tiny deterministic generator (xorshift).
struct Rng(u64);
impl Rng {
    fn below(&mut self, n: u32) -> u32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % u64::from(n)) as u32
    }
}

/// One end: its accounting and a model of its queues.
struct End {
    credits: Credits,
    /// Receives posted and not consumed.
    posted: u32,
    /// Messages landed, not yet polled (imm, len).
    cq: VecDeque<(u32, usize)>,
    /// Data messages handed to the user, not yet released.
    user: u32,
    to_send: u32,
    received: u32,
}

impl End {
    fn new(window: u32, to_send: u32) -> End {
        End {
            credits: Credits::new(window),
            posted: window + reserve(window),
            cq: VecDeque::new(),
            user: 0,
            to_send,
            received: 0,
        }
    }
    fn control_pending(&self) -> usize {
        self.cq
            .iter()
            .filter(|(imm, len)| imm & CONTROL != 0 && *len == 0)
            .count()
    }
}

/// Runs two ends of a `window` against each other, each sending `n`
/// data messages, in an order `seed` picks; returns the most control
/// messages either end ever had pending.
fn run(window: u32, n: u32, seed: u64) -> usize {
    let mut rng = Rng(seed | 1);
    let mut ends = [End::new(window, n), End::new(window, n)];
    // wire[i]: messages from end i to end 1 - i, in flight.
    let mut wire: [VecDeque<(u32, usize)>; 2] = [VecDeque::new(), VecDeque::new()];
    for (i, w) in wire.iter_mut().enumerate() {
        w.push_back((ends[i].credits.stamp(false), HELLO_LEN));
    }
    let mut most_pending = 0;
    let mut idle = 0;
    loop {
        let i = rng.below(2) as usize;
        let (me, peer) = if i == 0 {
            let (a, b) = ends.split_at_mut(1);
            (&mut a[0], &mut b[0])
        } else {
            let (a, b) = ends.split_at_mut(1);
            (&mut b[0], &mut a[0])
        };
        let acted = match rng.below(5) {
            // Send data, returning what is owed.
            0 if me.to_send > 0 && me.credits.ready() && me.credits.credits() > 0 => {
                wire[i].push_back((me.credits.stamp(true), 1));
                me.to_send -= 1;
                true
            }
            // A message lands at the peer: it needs a posted receive.
            1 if !wire[i].is_empty() => {
                assert!(peer.posted > 0, "RNR: no receive posted (window {window})");
                peer.posted -= 1;
                peer.cq.push_back(wire[i].pop_front().unwrap());
                most_pending = most_pending.max(peer.control_pending());
                true
            }
            // Poll one completion.
            2 if !me.cq.is_empty() => {
                let (imm, len) = me.cq.pop_front().unwrap();
                match me.credits.receive(imm, len).unwrap() {
                    Incoming::Hello => {
                        me.credits.hello();
                        me.posted += 1;
                    }
                    Incoming::Credit => me.posted += 1,
                    Incoming::Data => {
                        me.user += 1;
                        me.received += 1;
                    }
                }
                true
            }
            // The user releases a message: posted again, owed.
            3 if me.user > 0 => {
                me.user -= 1;
                me.posted += 1;
                me.credits.release();
                true
            }
            // Credits alone when enough are owed.
            4 if me.credits.should_return() => {
                wire[i].push_back((me.credits.stamp(false), 0));
                true
            }
            _ => false,
        };
        if ends.iter().all(|e| e.received == n && e.to_send == 0) {
            return most_pending;
        }
        idle = if acted { 0 } else { idle + 1 };
        assert!(
            idle < 10_000,
            "deadlock (window {window}, seed {seed}): {:?}",
            ends.iter()
                .map(|e| (
                    e.to_send,
                    e.received,
                    e.credits.credits(),
                    e.credits.window.owed(),
                    e.user
                ))
                .collect::<Vec<_>>()
        );
    }
}

#[test]
fn two_ends_never_run_out_of_receives_and_never_deadlock() {
    for window in [1, 2, 3, 4, 5, 8, 16] {
        for seed in 1..40u64 {
            let most = run(window, 300, seed * 7919 + u64::from(window));
            assert!(
                most <= reserve(window) as usize,
                "window {window}: {most} control messages pending, reserve {}",
                reserve(window)
            );
        }
    }
}
