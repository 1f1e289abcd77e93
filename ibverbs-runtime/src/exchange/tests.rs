//! Host tests of the endpoint exchange (framing, malformed, truncated,
//! oversize, silent and hostile peers over localhost TCP) and of the
//! mesh's TCP connections, hellos and barrier.

use std::io::{Cursor, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use super::mesh::{barrier_on, neighbours, rounds, Topology};
use super::*;
use rdma_verbs::{qp::QpNumber, Gid};

/// Bytes to read and what was written, with no-op timeouts.
struct Script {
    input: Cursor<Vec<u8>>,
    output: Vec<u8>,
}

impl Script {
    fn new(input: Vec<u8>) -> Script {
        Script {
            input: Cursor::new(input),
            output: Vec::new(),
        }
    }
}

impl Read for Script {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        // A byte at a time: every prefix is checked.
        let n = buf.len().min(1);
        self.input.read(&mut buf[..n])
    }
}

impl Write for Script {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.output.write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl TimedStream for Script {
    fn timeouts(&self) -> io::Result<(Option<Duration>, Option<Duration>)> {
        Ok((None, None))
    }
    fn set_timeouts(&mut self, _: Option<Duration>, _: Option<Duration>) -> io::Result<()> {
        Ok(())
    }
}

fn ep(qp: u32) -> Endpoint {
    Endpoint {
        qp_num: QpNumber(qp),
        psn: 0x12_3456,
        lid: 7,
        gid: Gid([0xfe; 16]),
    }
}

const T: Duration = Duration::from_secs(5);

/// What `exchange` returns reading `input` (and that it wrote its own
/// message first).
fn against(input: Vec<u8>) -> Result<PeerInfo> {
    let mut s = Script::new(input);
    let r = exchange(&mut s, &ep(1), b"mine", T);
    assert_eq!(s.output, message(&ep(1), b"mine").unwrap());
    r
}

fn problem(r: Result<PeerInfo>) -> WireProblem {
    match r {
        Err(Error::BadWireFormat {
            what: "endpoint exchange",
            problem,
        }) => problem,
        other => panic!("{other:?}"),
    }
}

#[test]
fn message_layout() {
    let m = message(&ep(0x42), b"abc").unwrap();
    assert_eq!(&m[..4], b"IBVX");
    assert_eq!(m[4], 1);
    assert_eq!(&m[5..9], &[0, 0, 0, 3]);
    assert_eq!(&m[9..36], &ep(0x42).to_bytes());
    assert_eq!(&m[36..], b"abc");
    assert_eq!(HEADER_LEN, 36);
}

#[test]
fn round_trip_in_memory() {
    for private in [&b""[..], b"x", &[0xab; MAX_PRIVATE_LEN]] {
        let peer = against(message(&ep(9), private).unwrap()).unwrap();
        assert_eq!(peer.endpoint, ep(9));
        assert_eq!(peer.private, private);
    }
}

#[test]
fn nothing_past_the_message_is_read() {
    let mut input = message(&ep(9), b"p").unwrap();
    input.extend_from_slice(b"next");
    let mut s = Script::new(input);
    exchange(&mut s, &ep(1), b"", T).unwrap();
    let mut rest = Vec::new();
    s.input.read_to_end(&mut rest).unwrap();
    assert_eq!(rest, b"next");
}

#[test]
fn oversize_private_bytes_are_refused_before_sending() {
    let mut s = Script::new(Vec::new());
    let r = exchange(&mut s, &ep(1), &[0; MAX_PRIVATE_LEN + 1], T);
    assert!(
        matches!(
            r,
            Err(Error::Verbs(rdma_verbs::Error::OutOfRange {
                value: 4097,
                max: 4096,
                ..
            }))
        ),
        "{r:?}"
    );
    assert!(s.output.is_empty());
}

#[test]
fn oversize_peer_length_is_refused_before_allocating() {
    for len in [MAX_PRIVATE_LEN as u32 + 1, u32::MAX] {
        let mut m = message(&ep(9), b"").unwrap();
        m[5..9].copy_from_slice(&len.to_be_bytes());
        assert_eq!(
            problem(against(m)),
            WireProblem::OutOfRange {
                field: "private length",
                value: len.into(),
                max: 4096
            }
        );
    }
}

#[test]
fn wrong_magic_and_version() {
    let mut m = message(&ep(9), b"").unwrap();
    m[..4].copy_from_slice(b"GET ");
    assert_eq!(
        problem(against(m)),
        WireProblem::Mismatch {
            field: "magic",
            value: 0x4745_5420,
            expected: 0x4942_5658
        }
    );
    let mut m = message(&ep(9), b"").unwrap();
    m[4] = 2;
    assert_eq!(
        problem(against(m)),
        WireProblem::Version {
            version: 2,
            supported: 1
        }
    );
    // Refused as soon as the magic is in, before the rest arrives.
    assert!(matches!(
        problem(against(b"GET ".to_vec())),
        WireProblem::Mismatch { field: "magic", .. }
    ));
}

#[test]
fn malformed_endpoint() {
    let mut m = message(&ep(9), b"").unwrap();
    m[9] = 7; // the endpoint's own version byte
    let r = against(m);
    assert!(
        matches!(
            r,
            Err(Error::BadWireFormat {
                what: "Endpoint",
                problem: WireProblem::Version { version: 7, .. }
            })
        ),
        "{r:?}"
    );
    let mut m = message(&ep(9), b"").unwrap();
    m[10..14].copy_from_slice(&0x0100_0000u32.to_be_bytes()); // qp_num over 24 bits
    let r = against(m);
    assert!(
        matches!(
            r,
            Err(Error::BadWireFormat {
                what: "Endpoint",
                problem: WireProblem::OutOfRange {
                    field: "qp_num",
                    ..
                }
            })
        ),
        "{r:?}"
    );
}

#[test]
fn every_truncation_is_a_length_error() {
    let m = message(&ep(9), b"private").unwrap();
    for cut in 0..m.len() {
        let expected = if cut < HEADER_LEN {
            HEADER_LEN
        } else {
            m.len()
        };
        assert_eq!(
            problem(against(m[..cut].to_vec())),
            WireProblem::Length { len: cut, expected },
            "cut at {cut}"
        );
    }
}

#[test]
fn arbitrary_bytes_never_panic() {
    // A fixed-seed generator: prefixes of valid messages with one byte
    // changed, and random bytes.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let valid = message(&ep(9), b"0123456789").unwrap();
    for _ in 0..20_000 {
        let mut m = valid.clone();
        let r = next();
        match r % 3 {
            0 => {
                let at = (next() as usize) % m.len();
                m[at] = next() as u8;
            }
            1 => m.truncate((next() as usize) % (m.len() + 1)),
            _ => m = (0..(next() % 64)).map(|_| next() as u8).collect(),
        }
        match against(m.clone()) {
            // What is accepted is a message that writes back byte for
            // byte (a shorter private length leaves the rest unread).
            Ok(p) => assert!(m.starts_with(&message(&p.endpoint, &p.private).unwrap())),
            Err(Error::BadWireFormat { .. }) => assert_ne!(m, valid),
            Err(e) => panic!("{e:?}"),
        }
    }
}

/// A connected localhost TCP pair.
fn tcp_pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (b, _) = l.accept().unwrap();
    (a, b)
}

#[test]
fn round_trip_over_tcp_restores_the_timeouts() {
    let (mut a, mut b) = tcp_pair();
    a.set_read_timeout(Some(Duration::from_secs(77))).unwrap();
    let t = thread::spawn(move || exchange(&mut b, &ep(2), &[5; 4096], T).unwrap());
    let got = exchange(&mut a, &ep(1), b"from a", T).unwrap();
    let other = t.join().unwrap();
    assert_eq!((got.endpoint, &got.private[..]), (ep(2), &[5u8; 4096][..]));
    assert_eq!(
        (other.endpoint, &other.private[..]),
        (ep(1), &b"from a"[..])
    );
    assert_eq!(a.timeouts().unwrap(), (Some(Duration::from_secs(77)), None));
}

/// Asserts a timeout of about `timeout`.
fn assert_timed_out(r: Result<PeerInfo>, start: Instant, timeout: Duration) {
    let took = start.elapsed();
    match r {
        Err(Error::OutOfBand {
            during: "endpoint exchange",
            io,
        }) => assert_eq!(io.kind(), io::ErrorKind::TimedOut, "{io}"),
        other => panic!("{other:?}"),
    }
    assert!(took >= timeout, "{took:?}");
    assert!(took < timeout + Duration::from_secs(2), "{took:?}");
}

#[test]
fn a_silent_peer_times_out() {
    let (mut a, b) = tcp_pair();
    let timeout = Duration::from_millis(300);
    let start = Instant::now();
    let r = exchange(&mut a, &ep(1), b"", timeout);
    assert_timed_out(r, start, timeout);
    drop(b);
}

#[test]
fn a_trickling_peer_cannot_stretch_the_deadline() {
    let (mut a, mut b) = tcp_pair();
    let t = thread::spawn(move || {
        for byte in message(&ep(2), b"").unwrap() {
            if b.write_all(&[byte]).is_err() {
                break;
            }
            thread::sleep(Duration::from_millis(40));
        }
    });
    let timeout = Duration::from_millis(400);
    let start = Instant::now();
    let r = exchange(&mut a, &ep(1), b"", timeout);
    assert_timed_out(r, start, timeout);
    drop(a);
    t.join().unwrap();
}

#[test]
fn a_peer_that_closes_early() {
    let (mut a, mut b) = tcp_pair();
    b.write_all(&message(&ep(2), b"").unwrap()[..10]).unwrap();
    drop(b);
    let r = exchange(&mut a, &ep(1), b"", T);
    assert_eq!(
        problem(r),
        WireProblem::Length {
            len: 10,
            expected: 36
        }
    );
    // Closed before a byte.
    let (mut a, b) = tcp_pair();
    drop(b);
    let r = exchange(&mut a, &ep(1), b"", T);
    assert!(
        matches!(
            r,
            Err(Error::BadWireFormat {
                problem: WireProblem::Length { len: 0, .. },
                ..
            }) | Err(Error::OutOfBand { .. })
        ),
        "{r:?}"
    );
}

#[test]
fn a_stranger_is_refused_without_waiting() {
    let (mut a, mut b) = tcp_pair();
    b.write_all(b"GET / HTTP/1.0\r\n").unwrap(); // and then silence
    let start = Instant::now();
    let r = exchange(&mut a, &ep(1), b"", Duration::from_secs(30));
    assert!(matches!(
        problem(r),
        WireProblem::Mismatch { field: "magic", .. }
    ));
    assert!(start.elapsed() < Duration::from_secs(5));
}

#[test]
fn neighbours_and_rounds() {
    assert_eq!(neighbours(Topology::Full, 1, 4), [0, 2, 3]);
    assert_eq!(neighbours(Topology::Ring, 0, 4), [1, 3]);
    assert_eq!(neighbours(Topology::Ring, 1, 2), [0]);
    assert!(neighbours(Topology::Ring, 0, 1).is_empty());
    assert!(neighbours(Topology::Full, 0, 1).is_empty());
    assert_eq!(rounds(Topology::Ring, 1), 0);
    assert_eq!(rounds(Topology::Ring, 5), 2);
    assert_eq!(rounds(Topology::Full, 5), 1);
}

/// `n` listeners on localhost ports and their addresses.
fn listeners(n: usize) -> (Vec<TcpListener>, Vec<SocketAddr>) {
    let ls: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    let addrs = ls.iter().map(|l| l.local_addr().unwrap()).collect();
    (ls, addrs)
}

/// Every rank's streams, each rank a thread started `stagger` after the
/// previous one (in reverse order: the connecting side first).
fn all_streams(topology: Topology, n: usize) -> Vec<Vec<(usize, TcpStream)>> {
    let (ls, addrs) = listeners(n);
    let threads: Vec<_> = ls
        .into_iter()
        .enumerate()
        .rev()
        .map(|(rank, l)| {
            let addrs = addrs.clone();
            thread::sleep(Duration::from_millis(30));
            thread::spawn(move || {
                Ranks::new(&addrs, rank)
                    .listener(l)
                    .streams(topology, &Deadline::after(T))
                    .unwrap()
            })
        })
        .collect();
    let mut out: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    out.reverse();
    out
}

#[test]
fn mesh_and_ring_streams_then_barriers() {
    for (topology, n) in [
        (Topology::Full, 1),
        (Topology::Full, 4),
        (Topology::Ring, 2),
        (Topology::Ring, 5),
    ] {
        let all = all_streams(topology, n);
        for (rank, streams) in all.iter().enumerate() {
            let ranks: Vec<usize> = streams.iter().map(|(r, _)| *r).collect();
            assert_eq!(
                ranks,
                neighbours(topology, rank, n),
                "{topology:?} rank {rank}"
            );
        }
        // Barriers: everyone returns, several times over.
        let threads: Vec<_> = all
            .into_iter()
            .map(|mut streams| {
                thread::spawn(move || {
                    let mut seq = 0;
                    for _ in 0..3 {
                        barrier_on(
                            &mut streams,
                            |(r, s)| (*r, s),
                            rounds(topology, n),
                            &mut seq,
                            &Deadline::after(T),
                        )
                        .unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
    }
}

#[test]
fn a_barrier_waits_for_the_last_rank_of_a_ring() {
    // Ring of 5: rank 0 enters late; ranks 2 and 3 (two hops away) must
    // not leave before it entered.
    let n = 5;
    let all = all_streams(Topology::Ring, n);
    let late = Duration::from_millis(300);
    let start = Instant::now();
    let threads: Vec<_> = all
        .into_iter()
        .enumerate()
        .map(|(rank, mut streams)| {
            thread::spawn(move || {
                if rank == 0 {
                    thread::sleep(late);
                }
                let mut seq = 0;
                barrier_on(
                    &mut streams,
                    |(r, s)| (*r, s),
                    rounds(Topology::Ring, n),
                    &mut seq,
                    &Deadline::after(T),
                )
                .unwrap();
                start.elapsed()
            })
        })
        .collect();
    for t in threads {
        assert!(t.join().unwrap() >= late);
    }
}

#[test]
fn a_barrier_peer_that_leaves_or_lags() {
    let mut all = all_streams(Topology::Full, 2);
    let (_, mut b) = all.pop().unwrap().pop().unwrap();
    let mut a = all.pop().unwrap();
    // Out of step: the peer sends sequence 5.
    b.write_all(&[5]).unwrap();
    let mut seq = 0;
    let r = barrier_on(&mut a, |(r, s)| (*r, s), 1, &mut seq, &Deadline::after(T));
    match r {
        Err(Error::Peer { rank: 1, error }) => assert!(
            matches!(
                *error,
                Error::BadWireFormat {
                    what: "barrier",
                    problem: WireProblem::Mismatch {
                        value: 5,
                        expected: 0,
                        ..
                    }
                }
            ),
            "{error:?}"
        ),
        other => panic!("{other:?}"),
    }
    // Silent: a timeout.
    let timeout = Duration::from_millis(200);
    let r = barrier_on(
        &mut a,
        |(r, s)| (*r, s),
        1,
        &mut seq,
        &Deadline::after(timeout),
    );
    match r {
        Err(Error::Peer { rank: 1, error }) => assert!(
            matches!(&*error, Error::OutOfBand { during: "barrier", io } if io.kind() == io::ErrorKind::TimedOut),
            "{error:?}"
        ),
        other => panic!("{other:?}"),
    }
    // Gone: the end of the stream.
    drop(b);
    let r = barrier_on(&mut a, |(r, s)| (*r, s), 1, &mut seq, &Deadline::after(T));
    assert!(matches!(r, Err(Error::Peer { rank: 1, .. })), "{r:?}");
}

/// Rank 0 of 2 accepting one connection that sends `bytes` and then
/// stays open until the result is in (or closes at once: `close`).
fn accept_from_stranger(bytes: &[u8], close: bool) -> Result<Vec<(usize, TcpStream)>> {
    let (mut ls, addrs) = listeners(2);
    drop(ls.pop());
    let l = ls.pop().unwrap();
    let mut s = TcpStream::connect(addrs[0]).unwrap();
    s.write_all(bytes).unwrap();
    if close {
        s.shutdown(std::net::Shutdown::Write).unwrap();
    }
    let r = Ranks::new(&addrs, 0)
        .listener(l)
        .streams(Topology::Full, &Deadline::after(Duration::from_millis(500)));
    drop(s);
    r
}

fn hello_problem(r: Result<Vec<(usize, TcpStream)>>) -> WireProblem {
    match r {
        Err(Error::BadWireFormat {
            what: "mesh hello",
            problem,
        }) => problem,
        other => panic!("{other:?}"),
    }
}

#[test]
fn strangers_on_the_listener() {
    let good = |topology: u8, ranks: u32, rank: u32| {
        let mut h = b"IBVM\x01".to_vec();
        h.push(topology);
        h.extend_from_slice(&ranks.to_be_bytes());
        h.extend_from_slice(&rank.to_be_bytes());
        h
    };
    assert!(matches!(
        hello_problem(accept_from_stranger(b"GET / HTTP/1.0\r\n", false)),
        WireProblem::Mismatch { field: "magic", .. }
    ));
    assert!(matches!(
        hello_problem(accept_from_stranger(b"IBVM\x09", false)),
        WireProblem::Version { version: 9, .. }
    ));
    assert_eq!(
        hello_problem(accept_from_stranger(&good(1, 2, 1), false)),
        WireProblem::Mismatch {
            field: "topology",
            value: 1,
            expected: 0
        }
    );
    assert_eq!(
        hello_problem(accept_from_stranger(&good(0, 3, 1), false)),
        WireProblem::Mismatch {
            field: "ranks",
            value: 3,
            expected: 2
        }
    );
    assert_eq!(
        hello_problem(accept_from_stranger(&good(0, 2, 0), false)),
        WireProblem::Unexpected {
            field: "rank",
            value: 0
        }
    );
    assert_eq!(
        hello_problem(accept_from_stranger(&good(0, 2, 1)[..9], true)),
        WireProblem::Length {
            len: 9,
            expected: 14
        }
    );
    // Half a hello, then silence: the deadline.
    let r = {
        let (mut ls, addrs) = listeners(2);
        drop(ls.pop());
        let l = ls.pop().unwrap();
        let mut s = TcpStream::connect(addrs[0]).unwrap();
        s.write_all(&good(0, 2, 1)[..9]).unwrap();
        let start = Instant::now();
        let r = Ranks::new(&addrs, 0)
            .listener(l)
            .streams(Topology::Full, &Deadline::after(Duration::from_millis(300)));
        assert!(start.elapsed() < Duration::from_secs(3));
        r
    };
    assert!(
        matches!(&r, Err(Error::OutOfBand { during: "mesh accept", io }) if io.kind() == io::ErrorKind::TimedOut),
        "{r:?}"
    );
}

#[test]
fn nobody_listening_or_connecting_times_out() {
    // Rank 1 of 2 dials rank 0, which never listens.
    let (mut ls, addrs) = listeners(2);
    drop(ls.remove(0));
    let timeout = Duration::from_millis(300);
    let start = Instant::now();
    let r = Ranks::new(&addrs, 1)
        .listener(ls.pop().unwrap())
        .streams(Topology::Full, &Deadline::after(timeout));
    assert!(start.elapsed() < timeout + Duration::from_secs(2));
    match r {
        Err(Error::Peer { rank: 0, error }) => assert!(
            matches!(&*error, Error::OutOfBand { during: "mesh connect", io } if io.kind() == io::ErrorKind::TimedOut),
            "{error:?}"
        ),
        other => panic!("{other:?}"),
    }
    // Rank 0 of 2 waits for rank 1, which never comes.
    let (mut ls, addrs) = listeners(2);
    drop(ls.pop());
    let r = Ranks::new(&addrs, 0)
        .listener(ls.pop().unwrap())
        .streams(Topology::Full, &Deadline::after(timeout));
    assert!(
        matches!(&r, Err(Error::Peer { rank: 1, error }) if matches!(&**error, Error::OutOfBand { during: "mesh accept", .. })),
        "{r:?}"
    );
}

#[test]
fn rank_out_of_range() {
    let (_ls, addrs) = listeners(2);
    let r = Ranks::new(&addrs, 2).streams(Topology::Full, &Deadline::after(T));
    assert!(
        matches!(
            r,
            Err(Error::Verbs(rdma_verbs::Error::OutOfRange {
                what: "rank",
                value: 2,
                max: 1
            }))
        ),
        "{r:?}"
    );
    let r = Ranks::new(&[], 0).streams(Topology::Ring, &Deadline::after(T));
    assert!(
        matches!(r, Err(Error::Verbs(rdma_verbs::Error::OutOfRange { .. }))),
        "{r:?}"
    );
}
