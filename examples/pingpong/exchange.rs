//! The out-of-band TCP exchange of rdma-core's `ibv_*_pingpong` tools.
//!
//! * The client connects (retrying while the server is not listening yet),
//!   sends its address message(s), reads the server's, then writes `"done"`.
//! * The server accepts one connection, reads the client's message(s),
//!   connects its queue pair(s) (a callback), replies with its own, and
//!   reads `"done"`.
//!
//! Both sides send the same number of 52-byte messages ([`wire::MSG_LEN`]):
//! one for RC/UC/UD, 256 for `srq_pingpong` (its `MAX_QP`, unused entries
//! zero). Every step has a deadline, so a peer that hangs, trickles, hangs
//! up or sends garbage ends the exchange with an [`ExchangeError`] saying
//! what happened, never a hang or a panic.
//!
//! std only (uses [`super::wire`]), so `tests/pingpong_interop.rs` can
//! include it and test it on any host.

use std::fmt;
use std::io::{self, ErrorKind, Read, Write};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use super::wire::{self, Dest, DONE, MSG_LEN};

/// What went wrong during the exchange, in words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExchangeError(pub String);

impl fmt::Display for ExchangeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ExchangeError {}

fn err<T>(msg: impl Into<String>) -> Result<T, ExchangeError> {
    Err(ExchangeError(msg.into()))
}

/// How long each step may take.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Each read or write phase of the exchange (all its bytes).
    pub io: Duration,
    /// The server's wait for a client to connect.
    pub accept: Duration,
    /// The client's attempts to connect (retrying while refused).
    pub connect: Duration,
}

/// Binds the server's listening socket on every address (IPv6 and IPv4
/// where the host allows both, else IPv4), port `port` (0: any).
///
/// # Errors
/// When neither can be bound.
pub fn listen(port: u16) -> Result<TcpListener, ExchangeError> {
    // std sets SO_REUSEADDR on listeners, like the C tools.
    match TcpListener::bind((Ipv6Addr::UNSPECIFIED, port)) {
        Ok(l) => Ok(l),
        Err(e6) => TcpListener::bind((Ipv4Addr::UNSPECIFIED, port)).map_err(|e4| {
            ExchangeError(format!("Couldn't listen to port {port}: {e4} (IPv6: {e6})"))
        }),
    }
}

/// Waits up to `within` for one client.
///
/// # Errors
/// When nobody connects in time or `accept` fails.
pub fn accept(listener: &TcpListener, within: Duration) -> Result<TcpStream, ExchangeError> {
    let deadline = Instant::now() + within;
    let io = |e: io::Error| ExchangeError(format!("accept() failed: {e}"));
    listener.set_nonblocking(true).map_err(io)?;
    loop {
        match listener.accept() {
            Ok((stream, _)) => {
                stream.set_nonblocking(false).map_err(io)?;
                return Ok(stream);
            }
            // Nobody yet, or a client that connected and reset before we
            // accepted it: keep waiting, within the deadline.
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::WouldBlock | ErrorKind::Interrupted | ErrorKind::ConnectionAborted
                ) =>
            {
                if Instant::now() >= deadline {
                    return err(format!(
                        "no client connected within {} s",
                        within.as_secs_f64()
                    ));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(io(e)),
        }
    }
}

/// Connects to `host:port`, retrying for up to `within` while the server
/// is not listening yet.
///
/// # Errors
/// When the name does not resolve or no address accepts in time.
pub fn connect(host: &str, port: u16, within: Duration) -> Result<TcpStream, ExchangeError> {
    let deadline = Instant::now() + within;
    let addrs: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|e| ExchangeError(format!("{e} for {host}:{port}")))?
        .collect();
    if addrs.is_empty() {
        return err(format!("no address for {host}:{port}"));
    }
    loop {
        let mut last = None;
        for a in &addrs {
            let left = deadline.saturating_duration_since(Instant::now());
            let attempt = left.clamp(Duration::from_millis(100), Duration::from_secs(5));
            match TcpStream::connect_timeout(a, attempt) {
                Ok(s) => return Ok(s),
                Err(e) => last = Some(e),
            }
        }
        if Instant::now() + Duration::from_millis(100) >= deadline {
            let last = last.map_or_else(String::new, |e| format!(": {e}"));
            return err(format!(
                "Couldn't connect to {host}:{port} within {} s{last}",
                within.as_secs_f64()
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Reads exactly `buf.len()` bytes before `deadline`.
fn read_all(
    stream: &mut TcpStream,
    buf: &mut [u8],
    within: Duration,
    what: &str,
) -> Result<(), ExchangeError> {
    let deadline = Instant::now() + within;
    let len = buf.len();
    let mut got = 0;
    while got < len {
        let left = deadline.saturating_duration_since(Instant::now());
        let timed_out = |got: usize| {
            ExchangeError(format!(
                "Couldn't read {what}: timed out after {} s ({got} of {len} bytes received)",
                within.as_secs_f64(),
            ))
        };
        if left.is_zero() {
            return Err(timed_out(got));
        }
        stream
            .set_read_timeout(Some(left))
            .map_err(|e| ExchangeError(format!("Couldn't read {what}: {e}")))?;
        match stream.read(&mut buf[got..]) {
            Ok(0) => {
                return err(format!(
                    "Couldn't read {what}: the peer closed the connection after {got} of {} bytes",
                    buf.len()
                ))
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if e.kind() == ErrorKind::ConnectionReset => {
                return err(format!(
                    "Couldn't read {what}: the peer reset the connection after {got} of {len} bytes"
                ))
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return Err(timed_out(got))
            }
            Err(e) => {
                return err(format!(
                    "Couldn't read {what}: {e} ({got} of {} bytes received)",
                    buf.len()
                ))
            }
        }
    }
    Ok(())
}

/// Writes all of `buf` before the deadline.
fn write_all(
    stream: &mut TcpStream,
    buf: &[u8],
    within: Duration,
    what: &str,
) -> Result<(), ExchangeError> {
    stream
        .set_write_timeout(Some(within))
        .and_then(|()| stream.write_all(buf))
        .map_err(|e| ExchangeError(format!("Couldn't send {what}: {e}")))
}

/// Fails when the peer already sent more than the protocol allows.
fn nothing_more(stream: &mut TcpStream, after: &str) -> Result<(), ExchangeError> {
    let mut byte = [0u8; 1];
    let r = stream
        .set_nonblocking(true)
        .and_then(|()| stream.read(&mut byte));
    let _ = stream.set_nonblocking(false);
    match r {
        Ok(n) if n > 0 => err(format!(
            "the peer sent more than expected after {after} (protocol mismatch: \
             same tool and options on both sides?)"
        )),
        // Nothing pending, end of stream, or an error the next step reports.
        _ => Ok(()),
    }
}

fn encode_all(local: &[Dest]) -> Result<Vec<u8>, ExchangeError> {
    let mut out = Vec::with_capacity(local.len() * MSG_LEN);
    for d in local {
        let msg = wire::encode(d)
            .map_err(|e| ExchangeError(format!("Couldn't encode local address: {e}")))?;
        out.extend_from_slice(&msg);
    }
    Ok(out)
}

fn decode_all(bytes: &[u8]) -> Result<Vec<Dest>, ExchangeError> {
    let n = bytes.len() / MSG_LEN;
    bytes
        .chunks(MSG_LEN)
        .enumerate()
        .map(|(i, msg)| {
            wire::decode(msg).map_err(|e| {
                let which = if n > 1 {
                    format!(" [{i}]")
                } else {
                    String::new()
                };
                ExchangeError(format!("invalid remote address{which}: {e}"))
            })
        })
        .collect()
}

/// The server's side on an accepted connection: reads `local.len()`
/// messages, calls `connect` with them (the QPs must be ready before the
/// client is told to start), replies with `local`, and reads `"done"`.
///
/// # Errors
/// Any I/O problem, malformed message, or `connect` failure, in words.
pub fn serve(
    stream: &mut TcpStream,
    local: &[Dest],
    limits: &Limits,
    connect: impl FnOnce(&[Dest]) -> Result<(), String>,
) -> Result<Vec<Dest>, ExchangeError> {
    let mut buf = vec![0u8; local.len() * MSG_LEN];
    read_all(stream, &mut buf, limits.io, "remote address")?;
    let remote = decode_all(&buf)?;
    nothing_more(stream, "the address message(s)")?;
    connect(&remote).map_err(|e| ExchangeError(format!("Couldn't connect to remote QP: {e}")))?;
    write_all(stream, &encode_all(local)?, limits.io, "local address")?;
    let mut done = [0u8; DONE.len()];
    read_all(stream, &mut done, limits.io, "\"done\" from the client")?;
    wire::check_done(&done).map_err(|e| ExchangeError(format!("bad final message: {e}")))?;
    nothing_more(stream, "\"done\"")?;
    Ok(remote)
}

/// The whole server side: accept (bounded by `limits.accept`), then [`serve`].
///
/// # Errors
/// As [`accept`] and [`serve`].
pub fn server_exchange(
    listener: &TcpListener,
    local: &[Dest],
    limits: &Limits,
    connect: impl FnOnce(&[Dest]) -> Result<(), String>,
) -> Result<Vec<Dest>, ExchangeError> {
    let mut stream = accept(listener, limits.accept)?;
    serve(&mut stream, local, limits, connect)
}

/// The client side: connect (retrying), send `local`, read as many
/// messages back, send `"done"`.
///
/// # Errors
/// Any I/O problem or malformed message, in words.
pub fn client_exchange(
    host: &str,
    port: u16,
    local: &[Dest],
    limits: &Limits,
) -> Result<Vec<Dest>, ExchangeError> {
    let mut stream = connect(host, port, limits.connect)?;
    write_all(&mut stream, &encode_all(local)?, limits.io, "local address")?;
    let mut buf = vec![0u8; local.len() * MSG_LEN];
    read_all(&mut stream, &mut buf, limits.io, "remote address")?;
    let remote = decode_all(&buf)?;
    nothing_more(&mut stream, "the address message(s)")?;
    write_all(&mut stream, &DONE, limits.io, "\"done\"")?;
    Ok(remote)
}
