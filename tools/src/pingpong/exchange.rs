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
//! std only (uses [`super::wire`]), so `device-tests/tests/pingpong_interop.rs` can
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

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::{Ipv4Addr, TcpListener, TcpStream};
    use std::time::{Duration, Instant};

    use super::super::wire::fixtures::{dest, msg, GID_HEX, VM_GID};
    use super::super::wire::{self, Dest, DONE, MSG_LEN};
    use super::*;

    fn limits(io_ms: u64) -> Limits {
        Limits {
            io: Duration::from_millis(io_ms),
            accept: Duration::from_secs(10),
            connect: Duration::from_secs(5),
        }
    }

    fn local_listener() -> (TcpListener, u16) {
        let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let port = l.local_addr().unwrap().port();
        (l, port)
    }

    fn many(n: usize, base: u32) -> Vec<Dest> {
        (0..n as u32)
            .map(|i| Dest {
                lid: i as u16,
                qpn: base + i,
                psn: 0x10_0000 + i,
                gid: VM_GID,
            })
            .collect()
    }

    #[test]
    fn exchange_roundtrip() {
        for n in [1, 256] {
            let (listener, port) = local_listener();
            let server_local = many(n, 0x100);
            let client_local = many(n, 0x200);
            let seen = client_local.clone();
            let server = std::thread::spawn(move || {
                let mut connected = None;
                let r = server_exchange(&listener, &server_local, &limits(5000), |remote| {
                    connected = Some(remote.to_vec());
                    Ok(())
                });
                (r, connected)
            });
            let from_server =
                client_exchange("localhost", port, &client_local, &limits(5000)).unwrap();
            let (r, connected) = server.join().unwrap();
            assert_eq!(r.unwrap(), seen);
            assert_eq!(
                connected.unwrap(),
                seen,
                "the server connects before replying"
            );
            assert_eq!(from_server, many(n, 0x100));
        }
    }

    /// Runs the server side against a scripted client; returns its error and
    /// how long it took.
    fn server_against(
        count: usize,
        io_ms: u64,
        client: impl FnOnce(TcpStream) + Send + 'static,
    ) -> (ExchangeError, Duration) {
        let (listener, port) = local_listener();
        let c = std::thread::spawn(move || {
            let s = TcpStream::connect((Ipv4Addr::LOCALHOST, port)).unwrap();
            client(s);
        });
        let t = Instant::now();
        let r = server_exchange(&listener, &many(count, 0x100), &limits(io_ms), |_| Ok(()));
        let took = t.elapsed();
        c.join().unwrap();
        (r.expect_err("the hostile client must be refused"), took)
    }

    fn valid_msg() -> Vec<u8> {
        wire::encode(&dest(0x11)).unwrap().to_vec()
    }

    #[test]
    fn exchange_server_refuses_hostile_clients() {
        type Script = Box<dyn FnOnce(TcpStream) + Send>;
        let send_close = |bytes: Vec<u8>| -> Script {
            Box::new(move |mut s: TcpStream| {
                s.write_all(&bytes).unwrap();
            })
        };
        // Sends, then waits until the server closes (so EOF is not the reason).
        let send_wait = |bytes: Vec<u8>| -> Script {
            Box::new(move |mut s: TcpStream| {
                s.write_all(&bytes).unwrap();
                let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
                let _ = s.read_to_end(&mut Vec::new());
            })
        };
        let mut too_much = valid_msg();
        too_much.extend_from_slice(&[b'x'; 48]);
        let mut bad_done = valid_msg();
        bad_done.extend_from_slice(b"DONE\0");
        let cases: Vec<(&str, Script, &str)> = vec![
            (
                "garbage",
                send_wait(msg("GET / HTTP/1.0")),
                "byte 3 is 0x20, not a visible ASCII character",
            ),
            (
                "words",
                send_wait(msg("hello,world")),
                "expected 4 ':'-separated fields",
            ),
            (
                "short, then close",
                send_close(b"0000:0000".to_vec()),
                "closed the connection after 9 of 52 bytes",
            ),
            ("oversized", send_wait(vec![b'7'; 300]), "no NUL terminator"),
            ("too much", send_wait(too_much), "more than expected"),
            (
                "QPN > 24 bits",
                send_wait(msg(&format!("0000:1000000:00000:{GID_HEX}"))),
                "does not fit in 24 bits",
            ),
            (
                "hang up",
                send_close(Vec::new()),
                "closed the connection after 0 of 52 bytes",
            ),
            (
                "silent",
                send_wait(Vec::new()),
                "timed out after 0.5 s (0 of 52 bytes received)",
            ),
            (
                "trickle",
                Box::new(|mut s: TcpStream| {
                    for b in valid_msg().into_iter().take(40) {
                        if s.write_all(&[b]).is_err() {
                            return;
                        }
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    let _ = s.read_to_end(&mut Vec::new());
                }),
                "timed out after 0.5 s",
            ),
            (
                "no done",
                Box::new(|mut s: TcpStream| {
                    s.write_all(&valid_msg()).unwrap();
                    let mut reply = [0u8; MSG_LEN];
                    s.read_exact(&mut reply).unwrap();
                }),
                "closed the connection after 0 of 5 bytes",
            ),
            (
                "bad done",
                Box::new(move |mut s: TcpStream| {
                    s.write_all(&bad_done[..MSG_LEN]).unwrap();
                    let mut reply = [0u8; MSG_LEN];
                    s.read_exact(&mut reply).unwrap();
                    s.write_all(&bad_done[MSG_LEN..]).unwrap();
                    let _ = s.read_to_end(&mut Vec::new());
                }),
                "expected \"done\"",
            ),
        ];
        for (what, script, expected) in cases {
            let (e, took) = server_against(1, 500, script);
            assert!(
                e.0.contains(expected),
                "{what}: {:?} lacks {expected:?}",
                e.0
            );
            assert!(took < Duration::from_secs(5), "{what}: took {took:?}");
        }
    }

    #[test]
    fn exchange_srq_framing() {
        // srq_pingpong exchanges 256 messages: one alone is not enough.
        let (e, _) = server_against(256, 500, |mut s| {
            s.write_all(&valid_msg()).unwrap();
            let _ = s.read_to_end(&mut Vec::new());
        });
        assert!(e.0.contains("(52 of 13312 bytes received)"), "{}", e.0);
        // A bad entry is named by its index.
        let (e, _) = server_against(256, 2000, |mut s| {
            let mut all = Vec::new();
            for i in 0..256 {
                if i == 7 {
                    all.extend_from_slice(&msg("junk"));
                } else {
                    all.extend_from_slice(&valid_msg());
                }
            }
            s.write_all(&all).unwrap();
            let _ = s.read_to_end(&mut Vec::new());
        });
        assert!(e.0.contains("invalid remote address [7]"), "{}", e.0);
    }

    #[test]
    fn exchange_server_reports_connect_failure() {
        let (listener, port) = local_listener();
        let server = std::thread::spawn(move || {
            server_exchange(&listener, &many(1, 1), &limits(2000), |_| {
                Err("Failed to modify QP to RTR: EINVAL".into())
            })
        });
        let c = client_exchange("127.0.0.1", port, &many(1, 2), &limits(2000));
        let s = server.join().unwrap().unwrap_err();
        assert!(
            s.0.contains("Couldn't connect to remote QP: Failed to modify QP to RTR"),
            "{s}"
        );
        // The client learns it from the closed connection.
        let c = c.unwrap_err();
        assert!(
            c.0.contains("closed the connection after 0 of 52 bytes"),
            "{c}"
        );
    }

    #[test]
    fn exchange_accept_is_bounded() {
        let (listener, _) = local_listener();
        let l = Limits {
            accept: Duration::from_millis(300),
            ..limits(1000)
        };
        let t = Instant::now();
        let e = server_exchange(&listener, &many(1, 1), &l, |_| Ok(())).unwrap_err();
        assert!(e.0.contains("no client connected within 0.3 s"), "{e}");
        assert!(t.elapsed() < Duration::from_secs(3));
    }

    /// Runs the client side against a scripted server; returns its result.
    fn client_against(
        io_ms: u64,
        server: impl FnOnce(TcpStream) + Send + 'static,
    ) -> Result<Vec<Dest>, ExchangeError> {
        let (listener, port) = local_listener();
        let s = std::thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            server(stream);
        });
        let r = client_exchange("localhost", port, &many(1, 5), &limits(io_ms));
        s.join().unwrap();
        r
    }

    #[test]
    fn exchange_client_refuses_hostile_servers() {
        let read_msg = |s: &mut TcpStream| {
            let mut m = [0u8; MSG_LEN];
            s.read_exact(&mut m).unwrap();
            m
        };
        // Closing without reading the client's message resets the connection
        // (or closes it, depending on timing).
        let e = client_against(500, |_| {}).unwrap_err();
        assert!(e.0.contains("the connection after 0 of 52"), "{e}");
        let e = client_against(500, move |mut s| {
            read_msg(&mut s);
        })
        .unwrap_err();
        assert!(e.0.contains("closed the connection after 0 of 52"), "{e}");
        let e = client_against(500, move |mut s| {
            read_msg(&mut s);
            s.write_all(&msg("0000:000011:000000:xyz")).unwrap();
            let _ = s.read_to_end(&mut Vec::new());
        })
        .unwrap_err();
        assert!(e.0.contains("invalid remote address: the GID field"), "{e}");
        let t = Instant::now();
        let e = client_against(500, move |mut s| {
            read_msg(&mut s);
            let _ = s.read_to_end(&mut Vec::new());
        })
        .unwrap_err();
        assert!(
            e.0.contains("timed out after 0.5 s (0 of 52 bytes received)"),
            "{e}"
        );
        assert!(t.elapsed() < Duration::from_secs(5));
        let e = client_against(500, move |mut s| {
            read_msg(&mut s);
            let mut reply = valid_msg();
            reply.extend_from_slice(b"surprise");
            s.write_all(&reply).unwrap();
            let _ = s.read_to_end(&mut Vec::new());
        })
        .unwrap_err();
        assert!(e.0.contains("more than expected"), "{e}");
        // And a well-behaved server gets "done".
        let r = client_against(500, move |mut s| {
            read_msg(&mut s);
            s.write_all(&valid_msg()).unwrap();
            let mut done = [0u8; 5];
            s.read_exact(&mut done).unwrap();
            assert_eq!(done, DONE);
        });
        assert_eq!(r.unwrap(), vec![dest(0x11)]);
    }

    #[test]
    fn exchange_client_retries_until_the_server_listens() {
        // Find a free port, then listen on it only after a while.
        let (l, port) = local_listener();
        drop(l);
        let server = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(700));
            let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, port)).unwrap();
            server_exchange(&listener, &many(1, 1), &limits(5000), |_| Ok(()))
        });
        let r = client_exchange("127.0.0.1", port, &many(1, 2), &limits(5000));
        assert_eq!(r.unwrap(), many(1, 1));
        assert_eq!(server.join().unwrap().unwrap(), many(1, 2));
    }

    #[test]
    fn exchange_client_connect_is_bounded() {
        let (l, port) = local_listener();
        drop(l);
        let l = Limits {
            connect: Duration::from_millis(800),
            ..limits(1000)
        };
        let t = Instant::now();
        let e = client_exchange("127.0.0.1", port, &many(1, 2), &l).unwrap_err();
        assert!(
            e.0.contains(&format!(
                "Couldn't connect to 127.0.0.1:{port} within 0.8 s"
            )),
            "{e}"
        );
        assert!(t.elapsed() < Duration::from_secs(4));
        let e = client_exchange("no-such-host.invalid", port, &many(1, 2), &l).unwrap_err();
        assert!(e.0.contains("no-such-host.invalid"), "{e}");
    }
}
