//! The credit and sequence accounting of one end of a
//! [`MessageChannel`](super::MessageChannel): pure arithmetic, no verbs, so
//! that the bound the channel rests on is tested here on its own. The
//! counting of credits, held and owed messages is the channels' shared
//! `CreditWindow` (`credit_window.rs`, with its own tests); this module
//! adds the wire format (sequence numbers, the control bit, the hello),
//! the threshold and the reserve.
//!
//! # Contract
//!
//! Each end posts `window + reserve(window)` receives of one slot each.
//! A *data* message may be sent only with a credit (`credits > 0`); the
//! peer's hello grants `window` of them, and every message carries, in its
//! immediate data, the credits its sender returns: data messages of the
//! other direction whose receives it has posted again. A *control* message
//! (the hello, a credit return) needs no credit: the receiver posts its
//! receive again as soon as it has processed it, and sends one only when
//! it returns at least `threshold(window)` credits (the hello returns
//! none, and it is the first message of its direction).
//!
//! # The bound: the receives never run out
//!
//! Take the direction A → B of data, credits flowing back B → A.
//!
//! * Data: A's credits + A's data messages not yet returned = `window`
//!   (the hello grants `window`; a send takes one, a return gives them
//!   back, and a return of more than is outstanding is refused as
//!   [`ChannelProblem::Credits`]). So at most `window` of A's data
//!   messages hold a receive at B (received, not yet posted again).
//! * Control: B's credit messages that A has not processed yet (whose
//!   receives A has not posted again) carry credits A has not counted; A
//!   has counted at least `S - window` of the `S` credits it used (its
//!   credits are never negative), and B never returns more than `S`, so
//!   those messages carry at most `window` credits in all, each at least
//!   `threshold`: there are at most `window / threshold` of them
//!   ([`reserve`]). B's hello is processed before any of them exists (A
//!   sends data, which B's credit messages return, only after it).
//!
//! So at most `window + reserve(window)` of A's receives are taken at any
//! time, however late either end polls: a message always finds a posted
//! receive (no RNR retry once both ends posted theirs) and a receive is
//! never written before its buffer came back to the channel.
//!
//! # Liveness
//!
//! A end with no credit gets one back unless the peer's user holds the
//! messages: the peer returns credits as soon as `threshold` are owed (with
//! its next message, or alone), so fewer than `threshold` stay owed, and
//! `threshold <= window`.

use crate::credit_window::CreditWindow;

/// Which message of a channel: bit 31 of the immediate data.
const CONTROL: u32 = 1 << 31;
/// The sequence number: bits 16..=30 of the immediate data.
const SEQ_SHIFT: u32 = 16;
/// Sequence numbers count modulo 2^15.
pub(super) const SEQ_MASK: u16 = 0x7fff;
/// The credits returned: bits 0..=15 of the immediate data.
const RETURNED_MASK: u32 = 0xffff;

/// The most receive slots a channel may have (its window): returns fit in
/// the 16 bits of the immediate data they travel in, with room to spare.
pub(crate) const MAX_WINDOW: u32 = 4096;
// Returns (at most a window) fit in their 16 bits.
const _: () = assert!(MAX_WINDOW <= RETURNED_MASK);

/// Bytes of a hello's payload.
pub(super) const HELLO_LEN: usize = 12;

/// The credits owed that make a channel return them alone: half the
/// window, rounded up.
pub(crate) fn threshold(window: u32) -> u32 {
    window.div_ceil(2).max(1)
}

/// The receives posted beyond the window for control messages:
/// `window / threshold(window)` (2 for an even window, 1 for an odd one),
/// at least 1 for the hello.
pub(crate) fn reserve(window: u32) -> u32 {
    (window / threshold(window)).max(1)
}

/// A broken protocol: what a message channel found in a peer's message,
/// with the numbers that decided. The channel is unusable afterwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ChannelProblem {
    /// A message out of order: RC delivers in order, so the peer skipped
    /// or repeated one (15-bit sequence numbers).
    Sequence {
        /// The number the message carries.
        got: u16,
        /// The number expected.
        expected: u16,
    },
    /// The peer returned more credits than this end had used.
    Credits {
        /// Credits in the message.
        returned: u32,
        /// Data messages sent and not yet returned.
        outstanding: u32,
    },
    /// The peer sent a data message without a credit for it.
    Overrun {
        /// The peer's data messages this end would hold, this one
        /// included.
        held: u32,
        /// The window.
        window: u32,
    },
    /// The peer's hello does not match this end's parameters (both ends
    /// must use the same slot count and size).
    Hello {
        /// The field (`"magic"`, `"version"`, `"slots"`, `"slot_size"`).
        field: &'static str,
        /// This end's value.
        ours: u64,
        /// The peer's.
        theirs: u64,
    },
    /// A message of a kind that cannot come here.
    Unexpected {
        /// What came (`"data before the hello"`, `"a control message
        /// with a payload"`, `"a message without immediate data"`,
        /// `"a second hello"`).
        what: &'static str,
    },
}

impl std::fmt::Display for ChannelProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ChannelProblem::Sequence { got, expected } => {
                write!(f, "message number {got} where {expected} was due")
            }
            ChannelProblem::Credits {
                returned,
                outstanding,
            } => write!(
                f,
                "{returned} credits returned, only {outstanding} were in use"
            ),
            ChannelProblem::Overrun { held, window } => {
                write!(f, "{held} data messages held, the window is {window}")
            }
            ChannelProblem::Hello {
                field,
                ours,
                theirs,
            } => write!(f, "hello: {field} {theirs}, this end has {ours}"),
            ChannelProblem::Unexpected { what } => f.write_str(what),
        }
    }
}

/// What a received message is, once checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Incoming {
    /// The peer's hello: its payload is checked by the caller, which then
    /// calls [`Credits::hello`].
    Hello,
    /// A credit return (already counted).
    Credit,
    /// A data message (counted as held).
    Data,
}

/// The accounting of one end (see the module docs for the contract): the
/// credit window, and the sequence numbers and hello of the wire format.
#[derive(Debug, Clone)]
pub(super) struct Credits {
    window: CreditWindow,
    tx_seq: u16,
    rx_seq: u16,
    hello_seen: bool,
}

impl Credits {
    /// An end of a channel of `window` slots (1..=[`MAX_WINDOW`]), before
    /// the peer's hello: no credit yet.
    pub(super) fn new(window: u32) -> Credits {
        debug_assert!((1..=MAX_WINDOW).contains(&window));
        Credits {
            window: CreditWindow::new(window),
            tx_seq: 0,
            rx_seq: 0,
            hello_seen: false,
        }
    }

    /// Data messages this end may send now.
    pub(super) fn credits(&self) -> u32 {
        self.window.credits()
    }

    /// A data message handed out was released (its receive posted again):
    /// its credit is owed to the peer.
    pub(super) fn release(&mut self) {
        self.window.release();
    }

    /// Whether the credits owed are worth a control message of their own.
    pub(super) fn should_return(&self) -> bool {
        self.window.owed() >= threshold(self.window.size())
    }

    /// The immediate data of the next message, returning every credit
    /// owed: a data message takes a credit (the caller checked
    /// [`credits`](Self::credits)).
    pub(super) fn stamp(&mut self, data: bool) -> u32 {
        let owed = self.window.take_owed();
        let mut imm = (u32::from(self.tx_seq) << SEQ_SHIFT) | owed;
        if data {
            self.window.take();
        } else {
            imm |= CONTROL;
        }
        self.tx_seq = self.tx_seq.wrapping_add(1) & SEQ_MASK;
        imm
    }

    /// Checks and counts a message received with immediate data `imm` and
    /// `len` payload bytes.
    pub(super) fn receive(&mut self, imm: u32, len: usize) -> Result<Incoming, ChannelProblem> {
        let seq = ((imm >> SEQ_SHIFT) as u16) & SEQ_MASK;
        if seq != self.rx_seq {
            return Err(ChannelProblem::Sequence {
                got: seq,
                expected: self.rx_seq,
            });
        }
        let control = imm & CONTROL != 0;
        let returned = imm & RETURNED_MASK;
        let kind = match (self.hello_seen, control) {
            (false, true) if len == HELLO_LEN && returned == 0 => Incoming::Hello,
            (false, _) => {
                return Err(ChannelProblem::Unexpected {
                    what: "a message before the peer's hello",
                })
            }
            (true, true) if len == 0 => Incoming::Credit,
            (true, true) if len == HELLO_LEN && returned == 0 => {
                return Err(ChannelProblem::Unexpected {
                    what: "a second hello",
                })
            }
            (true, true) => {
                return Err(ChannelProblem::Unexpected {
                    what: "a control message with a payload",
                })
            }
            (true, false) => Incoming::Data,
        };
        self.window.accept(returned, kind == Incoming::Data)?;
        self.rx_seq = self.rx_seq.wrapping_add(1) & SEQ_MASK;
        Ok(kind)
    }

    /// The peer's hello was checked: the window's credits are granted.
    pub(super) fn hello(&mut self) {
        self.hello_seen = true;
        self.window.grant();
    }

    /// Whether the peer's hello came.
    #[cfg(test)]
    pub(super) fn ready(&self) -> bool {
        self.hello_seen
    }
}

#[cfg(test)]
mod tests;
