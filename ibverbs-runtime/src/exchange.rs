//! Out-of-band endpoint exchange: this side's [`Endpoint`] and some private
//! bytes for the peer's, over a stream, within a deadline ([`exchange`]);
//! N ranks connected pairwise on top of it ([`Ranks`], [`Mesh`]). The
//! message itself is sans-IO ([`message`], [`Incoming`]), so that any
//! stream (Tokio's, a TLS one) can carry it.
//!
//! No memory is handed to the device here: the exchange carries bytes,
//! and the mesh creates queue pairs through the caller's closure and
//! connects them with [`QueuePair::connect`](rdma_verbs::QueuePair::connect).

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use rdma_verbs::{error::WireProblem, Endpoint};

use crate::error::{Error, Result};

mod mesh;

pub use mesh::{Mesh, Peer, Ranks};

/// The largest number of private bytes an exchange carries each way
/// ([`exchange`]): more is refused on either side.
pub const MAX_PRIVATE_LEN: usize = 4096;

/// The first four bytes of an exchange message.
const MAGIC: [u8; 4] = *b"IBVX";
/// The version of the exchange message this library writes and reads.
const FRAME_VERSION: u8 = 1;
/// Bytes before the private bytes: magic (4), version (1), private length
/// (4, big-endian), endpoint ([`Endpoint::WIRE_LEN`]).
const HEADER_LEN: usize = 9 + Endpoint::WIRE_LEN;
/// What [`Error::BadWireFormat`] and [`Error::OutOfBand`] name.
pub(crate) const WHAT: &str = "endpoint exchange";

/// What the peer sent in an exchange ([`exchange`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerInfo {
    /// The peer's endpoint, for [`QueuePair::connect`](rdma_verbs::QueuePair::connect).
    pub endpoint: Endpoint,
    /// The peer's private bytes (at most [`MAX_PRIVATE_LEN`]), for
    /// example a [`RemoteMemory`](rdma_verbs::RemoteMemory)'s wire form.
    pub private: Vec<u8>,
}

/// A blocking stream whose reads and writes can be bounded in time, as an
/// endpoint exchange needs ([`exchange`]).
///
/// Implemented for [`TcpStream`] and [`UnixStream`] (`SO_RCVTIMEO`,
/// `SO_SNDTIMEO`); a wrapper (a TLS stream, …) implements it by
/// forwarding to the socket underneath. A read or write that finds the
/// timeout passed must return an error of kind
/// [`WouldBlock`](io::ErrorKind::WouldBlock) or
/// [`TimedOut`](io::ErrorKind::TimedOut).
pub trait TimedStream: Read + Write {
    /// The read and write timeouts now in force (`None`: blocking).
    ///
    /// # Errors
    /// The stream's I/O error.
    fn timeouts(&self) -> io::Result<(Option<Duration>, Option<Duration>)>;
    /// Bounds each following read by `read` and each write by `write`
    /// (`None`: blocking; never a zero duration).
    ///
    /// # Errors
    /// The stream's I/O error.
    fn set_timeouts(&mut self, read: Option<Duration>, write: Option<Duration>) -> io::Result<()>;
}

impl TimedStream for TcpStream {
    fn timeouts(&self) -> io::Result<(Option<Duration>, Option<Duration>)> {
        Ok((self.read_timeout()?, self.write_timeout()?))
    }
    fn set_timeouts(&mut self, read: Option<Duration>, write: Option<Duration>) -> io::Result<()> {
        self.set_read_timeout(read)?;
        self.set_write_timeout(write)
    }
}

impl TimedStream for UnixStream {
    fn timeouts(&self) -> io::Result<(Option<Duration>, Option<Duration>)> {
        Ok((self.read_timeout()?, self.write_timeout()?))
    }
    fn set_timeouts(&mut self, read: Option<Duration>, write: Option<Duration>) -> io::Result<()> {
        self.set_read_timeout(read)?;
        self.set_write_timeout(write)
    }
}

/// Sends `local` and `private` bytes to the peer over `stream` and
/// returns what the peer sent the same way, all within `timeout`.
///
/// Both sides call it: each writes its whole message, then reads the
/// peer's, so neither waits for the other to read first (a message is at
/// most 4 KiB and some, which any socket buffers). The deadline covers the
/// whole exchange, not each read: before every read and write the stream's
/// timeouts are set to the time left ([`TimedStream`]), so a peer that
/// trickles its bytes cannot stretch it. The stream's own timeouts are
/// restored before returning. Nothing past the peer's message is read.
///
/// The message ([`message`]): `IBVX`, a version byte (1), the length of
/// the private bytes (4 bytes, big-endian), the endpoint's
/// [wire form](Endpoint::to_bytes), the private bytes. The peer is not
/// trusted ([`Incoming`]): the length is checked before anything is
/// allocated, and a message is refused as soon as a byte of it is wrong.
///
/// # Errors
/// Before sending anything, [`Error::Verbs`] with
/// [`rdma_verbs::Error::OutOfRange`] when `private` is longer than
/// [`MAX_PRIVATE_LEN`]. Then the errors of [`Incoming::advance`] for the
/// peer's message, and [`Error::OutOfBand`] (`during: "endpoint
/// exchange"`) for an I/O error of the stream, or of kind
/// [`TimedOut`](io::ErrorKind::TimedOut) when `timeout` passed.
///
/// # Example
/// ```no_run
/// # fn demo(qp: &rdma_verbs::QueuePair, local: &rdma_verbs::LocalPort,
/// #         opts: &rdma_verbs::ConnectOptions, target: &rdma_verbs::SharedBuffer)
/// #         -> Result<(), Box<dyn std::error::Error>> {
/// use std::{net::TcpStream, time::Duration};
/// use rdma_verbs::{Endpoint, RemoteMemory};
/// let mut tcp = TcpStream::connect("server:18515")?;
/// let me = local.endpoint(qp, Endpoint::random_psn())?;
/// let mine = target.remote().unwrap().to_bytes();
/// let peer = rdma_verbs_runtime::exchange(&mut tcp, &me, &mine, Duration::from_secs(10))?;
/// qp.connect(&me, &peer.endpoint, opts)?;
/// let theirs = RemoteMemory::from_bytes(&peer.private)?; // for RDMA reads/writes
/// # drop(theirs); Ok(()) }
/// ```
///
/// # References
/// `ibv_rc_pingpong(1)` (the exchange it does with its own text format),
/// `setsockopt(2)` (`SO_RCVTIMEO`, `SO_SNDTIMEO`)
pub fn exchange<S: TimedStream>(
    stream: &mut S,
    local: &Endpoint,
    private: &[u8],
    timeout: Duration,
) -> Result<PeerInfo> {
    let message = message(local, private)?;
    let deadline = Deadline::after(timeout);
    let saved = stream.timeouts().map_err(|io| oob(WHAT, io))?;
    let result = write_message(stream, &message, &deadline, WHAT)
        .and_then(|()| read_message(stream, &deadline));
    let restored = stream.set_timeouts(saved.0, saved.1);
    let peer = result?;
    restored.map_err(|io| oob(WHAT, io))?;
    Ok(peer)
}

/// The exchange message that sends `local` and `private` bytes (what
/// [`exchange`] writes), for a stream [`exchange`] does not drive.
///
/// # Errors
/// [`Error::Verbs`] with [`rdma_verbs::Error::OutOfRange`] when `private` is
/// longer than [`MAX_PRIVATE_LEN`].
pub fn message(local: &Endpoint, private: &[u8]) -> Result<Vec<u8>> {
    if private.len() > MAX_PRIVATE_LEN {
        return Err(rdma_verbs::Error::OutOfRange {
            what: "private bytes of an endpoint exchange",
            value: private.len() as u64,
            max: MAX_PRIVATE_LEN as u64,
        }
        .into());
    }
    let mut m = Vec::with_capacity(HEADER_LEN + private.len());
    m.extend_from_slice(&MAGIC);
    m.push(FRAME_VERSION);
    m.extend_from_slice(&(private.len() as u32).to_be_bytes());
    m.extend_from_slice(&local.to_bytes());
    m.extend_from_slice(private);
    Ok(m)
}

/// The peer's exchange message, read from any stream: read into
/// [`buf`](Self::buf), tell [`advance`](Self::advance) how many bytes
/// came, until it returns the [`PeerInfo`]. It never asks for a byte past
/// the message, checks each field as soon as it is complete (a stranger's
/// bytes are refused at once), and allocates the private bytes only once
/// their length was checked.
#[derive(Debug)]
pub struct Incoming {
    header: [u8; HEADER_LEN],
    got: usize,
    /// The private bytes, once the header is complete.
    body: Option<(Endpoint, Vec<u8>)>,
}

impl Default for Incoming {
    fn default() -> Self {
        Incoming {
            header: [0; HEADER_LEN],
            got: 0,
            body: None,
        }
    }
}

impl Incoming {
    /// Nothing received yet.
    pub fn new() -> Incoming {
        Incoming::default()
    }

    /// Where the next bytes go: the rest of the message, never empty
    /// while it is incomplete.
    pub fn buf(&mut self) -> &mut [u8] {
        match &mut self.body {
            None => &mut self.header[self.got..],
            Some((_, private)) => &mut private[self.got - HEADER_LEN..],
        }
    }

    /// Accounts for `n` bytes read into [`buf`](Self::buf) (0: the stream
    /// ended; never more than `buf` held). Returns the peer's message once complete.
    ///
    /// # Errors
    /// [`Error::BadWireFormat`] (`what: "endpoint exchange"`) for a message
    /// with another magic ([`WireProblem::Mismatch`]), version
    /// ([`WireProblem::Version`]), a private length over
    /// [`MAX_PRIVATE_LEN`] ([`WireProblem::OutOfRange`]), or cut short by
    /// the end of the stream ([`WireProblem::Length`]: bytes received,
    /// bytes the message has); `what: "Endpoint"` for a malformed endpoint
    /// (as [`Endpoint::from_bytes`]).
    pub fn advance(&mut self, n: usize) -> Result<Option<PeerInfo>> {
        // A stream never reports more than it was given room for.
        let n = n.min(self.buf().len());
        if n == 0 {
            let expected = match &self.body {
                None => HEADER_LEN,
                Some((_, private)) => HEADER_LEN + private.len(),
            };
            return Err(bad(WireProblem::Length {
                len: self.got,
                expected,
            }));
        }
        self.got += n;
        if self.body.is_none() {
            let Some(len) = check_header(&self.header, self.got)? else {
                return Ok(None);
            };
            let endpoint = Endpoint::from_bytes(&self.header[9..]).map_err(wire)?;
            // `len` was checked against MAX_PRIVATE_LEN before this allocation.
            self.body = Some((endpoint, vec![0u8; len]));
        }
        match &mut self.body {
            Some((_, private)) if self.got == HEADER_LEN + private.len() => {
                let (endpoint, private) = self.body.take().expect("matched above");
                Ok(Some(PeerInfo { endpoint, private }))
            }
            _ => Ok(None),
        }
    }
}

/// A core wire-format error as the runtime's (an endpoint inside a
/// runtime message); any other as it is.
fn wire(e: rdma_verbs::Error) -> Error {
    match e {
        rdma_verbs::Error::BadWireFormat { what, problem } => {
            Error::BadWireFormat { what, problem }
        }
        e => Error::Verbs(e),
    }
}

/// An [`Error::BadWireFormat`] of an exchange message.
fn bad(problem: WireProblem) -> Error {
    Error::BadWireFormat {
        what: WHAT,
        problem,
    }
}

/// An [`Error::OutOfBand`] during `during`.
pub(crate) fn oob(during: &'static str, io: io::Error) -> Error {
    Error::OutOfBand { during, io }
}

/// Checks the `got` bytes of a message header received so far: each field
/// as soon as it is complete. Returns the private length once the header
/// is complete.
fn check_header(h: &[u8; HEADER_LEN], got: usize) -> Result<Option<usize>> {
    if got >= 4 && h[..4] != MAGIC {
        return Err(bad(WireProblem::Mismatch {
            field: "magic",
            value: u32::from_be_bytes([h[0], h[1], h[2], h[3]]).into(),
            expected: u32::from_be_bytes(MAGIC).into(),
        }));
    }
    if got >= 5 && h[4] != FRAME_VERSION {
        return Err(bad(WireProblem::Version {
            version: h[4],
            supported: FRAME_VERSION,
        }));
    }
    if got < 9 {
        return Ok(None);
    }
    let len = u32::from_be_bytes([h[5], h[6], h[7], h[8]]);
    if len as usize > MAX_PRIVATE_LEN {
        return Err(bad(WireProblem::OutOfRange {
            field: "private length",
            value: len.into(),
            max: MAX_PRIVATE_LEN as u64,
        }));
    }
    Ok((got == HEADER_LEN).then_some(len as usize))
}

/// Reads the peer's message from `stream` before `deadline`.
fn read_message<S: TimedStream>(stream: &mut S, deadline: &Deadline) -> Result<PeerInfo> {
    let mut incoming = Incoming::new();
    loop {
        let n = read_some(stream, incoming.buf(), deadline, WHAT)?;
        if let Some(peer) = incoming.advance(n)? {
            return Ok(peer);
        }
    }
}

/// A point in time that bounds a whole conversation.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Deadline {
    at: Instant,
    timeout: Duration,
}

impl Deadline {
    pub(crate) fn after(timeout: Duration) -> Deadline {
        let now = Instant::now();
        Deadline {
            at: now
                .checked_add(timeout)
                .unwrap_or(now + Duration::from_secs(1 << 32)),
            timeout,
        }
    }

    /// The time left, or the timeout error of `during` when none is.
    pub(crate) fn left(&self, during: &'static str) -> Result<Duration> {
        match self.at.checked_duration_since(Instant::now()) {
            Some(d) if !d.is_zero() => Ok(d),
            _ => Err(self.expired(during)),
        }
    }

    /// The [`Error::OutOfBand`] of kind `TimedOut` of `during`.
    pub(crate) fn expired(&self, during: &'static str) -> Error {
        oob(
            during,
            io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the peer did not answer within {:?}", self.timeout),
            ),
        )
    }
}

/// One read of at most `buf.len()` bytes, bounded by the time left; 0 at
/// the end of the stream. An interrupted read is retried.
pub(crate) fn read_some<S: TimedStream>(
    stream: &mut S,
    buf: &mut [u8],
    deadline: &Deadline,
    during: &'static str,
) -> Result<usize> {
    loop {
        let left = deadline.left(during)?;
        stream
            .set_timeouts(Some(left), Some(left))
            .map_err(|io| oob(during, io))?;
        match stream.read(buf) {
            Ok(n) => return Ok(n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if is_timeout(&e) => return Err(deadline.expired(during)),
            Err(e) => return Err(oob(during, e)),
        }
    }
}

/// Writes all of `bytes`, bounded by the time left.
pub(crate) fn write_message<S: TimedStream>(
    stream: &mut S,
    mut bytes: &[u8],
    deadline: &Deadline,
    during: &'static str,
) -> Result<()> {
    while !bytes.is_empty() {
        let left = deadline.left(during)?;
        stream
            .set_timeouts(Some(left), Some(left))
            .map_err(|io| oob(during, io))?;
        match stream.write(bytes) {
            Ok(0) => {
                return Err(oob(
                    during,
                    io::Error::new(io::ErrorKind::WriteZero, "the stream took no bytes"),
                ))
            }
            Ok(n) => bytes = &bytes[n..],
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if is_timeout(&e) => return Err(deadline.expired(during)),
            Err(e) => return Err(oob(during, e)),
        }
    }
    stream.flush().map_err(|io| oob(during, io))
}

/// A socket timeout: `EAGAIN` (`SO_RCVTIMEO` on Linux) or `ETIMEDOUT`.
fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

#[cfg(test)]
mod tests;
