//! Endpoint exchange and N-peer connection (device tests): ranks as
//! threads of one process connect a full mesh or a ring over 127.0.0.1
//! TCP with one RC queue pair per peer on the test device, and every pair
//! moves bytes both ways (a send each way, an RDMA write each way into the
//! memory the peer's private bytes named); hostile peers (garbage, early
//! close, silence, a bogus endpoint) end the connection with a typed error
//! within the deadline.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use common::{device, pattern, remote_all, wait};
use rdma_verbs::{
    error::WireProblem, AccessFlags, CompletionQueue, ConnectOptions, Endpoint, LocalPort,
    ProtectionDomain, QpType, RemoteMemory, SharedBuffer, WcOpcode, Wr,
};
use rdma_verbs_runtime::{Error, Mesh, PeerInfo, Ranks};

/// Bytes of each peer's slot in a rank's target memory.
const SLOT: usize = 512;
/// Bytes of each send.
const MSG: usize = 64;

/// `n` listeners on 127.0.0.1 ports and their addresses.
fn listeners(n: usize) -> (Vec<TcpListener>, Vec<SocketAddr>) {
    let ls: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    let addrs = ls.iter().map(|l| l.local_addr().unwrap()).collect();
    (ls, addrs)
}

/// What one rank owns besides its mesh.
struct Rank {
    pd: ProtectionDomain,
    cq: CompletionQueue,
    target: SharedBuffer,
    local: LocalPort,
    opts: ConnectOptions,
}

impl Rank {
    fn new(n: usize) -> Rank {
        let dev = device();
        let pd = dev.ctx.alloc_pd().unwrap();
        // One CQ shared by every peer's queue pair.
        let cq = dev.ctx.create_cq(64 * n as u32).build().unwrap();
        let target = pd.alloc_shared(n * SLOT, remote_all()).unwrap();
        let local = LocalPort::query(&dev.ctx, dev.port, Some(dev.gid_index)).unwrap();
        let opts = ConnectOptions::new(dev.port)
            .local_port(&local)
            .remote_access(AccessFlags::REMOTE_WRITE);
        Rank {
            pd,
            cq,
            target,
            local,
            opts,
        }
    }

    /// Connects as `rank` of `addrs`: a queue pair per peer on the shared
    /// CQ, the private bytes naming the peer's slot of `target`.
    fn connect(&self, addrs: &[SocketAddr], rank: usize, l: TcpListener, ring: bool) -> Mesh {
        let remote = self.target.remote().unwrap();
        let ranks = Ranks::new(addrs, rank)
            .listener(l)
            .timeout(Duration::from_secs(60));
        let make = |peer: usize| {
            let qp = self
                .pd
                .create_qp(QpType::Rc, &self.cq, &self.cq)
                .max_send_wr(8)
                .max_recv_wr(8)
                .build()?;
            let slot = remote.slice((peer * SLOT) as u64, SLOT as u64).unwrap();
            Ok((qp, slot.to_bytes().to_vec()))
        };
        let mesh = if ring {
            ranks.connect_ring(&self.local, &self.opts, make)
        } else {
            ranks.connect_mesh(&self.local, &self.opts, make)
        };
        mesh.unwrap_or_else(|e| panic!("rank {rank}: {e}"))
    }
}

/// The seed of what `from` sends to `to`.
fn seed(from: usize, to: usize, write: bool) -> u8 {
    (from * 16 + to * 4 + write as usize) as u8
}

/// One rank's traffic: a receive per peer, a barrier, a send and an RDMA
/// write to every peer, every completion checked, a barrier, then every
/// peer's write checked in this rank's memory.
fn traffic(r: &Rank, mesh: &mut Mesh) {
    let me = mesh.rank();
    for p in mesh.peers() {
        let buf = r.pd.alloc(MSG, AccessFlags::LOCAL_WRITE).unwrap();
        p.qp()
            .recv_queue()
            .unwrap()
            .recv(buf, p.rank() as u64)
            .unwrap();
    }
    mesh.barrier(Duration::from_secs(30)).unwrap();
    for p in mesh.peers() {
        let mut msg = r.pd.alloc(MSG, AccessFlags::LOCAL_WRITE).unwrap();
        msg.copy_from_slice(&pattern(MSG, seed(me, p.rank(), false)));
        let mut sq = p.qp().send_queue().unwrap();
        sq.send(msg, Wr::id(1000 + p.rank() as u64)).unwrap();
        let theirs = RemoteMemory::from_bytes(p.private()).unwrap();
        assert_eq!(theirs.len, SLOT as u64);
        let mut data = r.pd.alloc(SLOT, AccessFlags::LOCAL_WRITE).unwrap();
        data.copy_from_slice(&pattern(SLOT, seed(me, p.rank(), true)));
        sq.write(data, theirs, Wr::id(2000 + p.rank() as u64))
            .unwrap();
    }
    let peers = mesh.peers().len();
    let mut recvs = 0;
    for mut c in wait(&r.cq, 3 * peers) {
        c.result()
            .unwrap_or_else(|e| panic!("rank {me}: {e}: {c:?}"));
        if c.opcode() == WcOpcode::Recv {
            let from = c.wr_id() as usize;
            let buf = c.take_local().unwrap();
            assert_eq!(
                &buf[..],
                &pattern(MSG, seed(from, me, false))[..],
                "{from}->{me}"
            );
            recvs += 1;
        }
    }
    assert_eq!(recvs, peers);
    // Every write completed at its sender: the bytes are in place.
    mesh.barrier(Duration::from_secs(30)).unwrap();
    for p in mesh.peers() {
        let mut got = vec![0u8; SLOT];
        r.target.copy_to_slice(p.rank() * SLOT, &mut got).unwrap();
        assert_eq!(
            got,
            pattern(SLOT, seed(p.rank(), me, true)),
            "write {}->{me}",
            p.rank()
        );
    }
}

/// `n` ranks as threads, connected as a mesh or a ring, each moving data;
/// returns each rank's peers.
fn run(n: usize, ring: bool) -> Vec<Vec<usize>> {
    let (ls, addrs) = listeners(n);
    let threads: Vec<_> = ls
        .into_iter()
        .enumerate()
        .map(|(rank, l)| {
            let addrs = addrs.clone();
            // Start in a scattered order: the ranks wait for each other.
            thread::sleep(Duration::from_millis(20 * ((rank * 7) % 3) as u64));
            thread::spawn(move || {
                let r = Rank::new(n);
                let mut mesh = r.connect(&addrs, rank, l, ring);
                assert_eq!((mesh.rank(), mesh.ranks()), (rank, n));
                for p in mesh.peers() {
                    assert_eq!(p.qp().qp_num(), p.local_endpoint().qp_num);
                }
                traffic(&r, &mut mesh);
                mesh.peers().iter().map(|p| p.rank()).collect::<Vec<_>>()
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

#[test]
#[ignore = "needs an RDMA device"]
fn exchange_mesh_of_three_moves_data_both_ways() {
    assert_eq!(run(3, false), [vec![1, 2], vec![0, 2], vec![0, 1]]);
}

#[test]
#[ignore = "needs an RDMA device"]
fn exchange_rings_of_two_three_and_four_move_data_both_ways() {
    assert_eq!(run(2, true), [vec![1], vec![0]]);
    assert_eq!(run(3, true), [vec![1, 2], vec![0, 2], vec![0, 1]]);
    // Rank 0's neighbours are 3 and 1, not 2.
    assert_eq!(
        run(4, true),
        [vec![1, 3], vec![0, 2], vec![1, 3], vec![0, 2]]
    );
}

#[test]
#[ignore = "needs an RDMA device"]
fn exchange_rank_alone_has_no_peers() {
    let (mut ls, addrs) = listeners(1);
    let r = Rank::new(1);
    let mut mesh = r.connect(&addrs, 0, ls.pop().unwrap(), true);
    assert!(mesh.peers().is_empty() && mesh.left().is_none());
    mesh.barrier(Duration::from_millis(1)).unwrap();
}

/// On return, every peer's queue pair to this rank is connected (RTS),
/// even when a peer is slow between its exchange and its `connect`: rank
/// 2 creates its queue pair for rank 1 half a second after writing its
/// message to rank 0, so rank 0 has both messages long before rank 2 has
/// connected; only the barrier keeps rank 0 from returning early.
#[test]
#[ignore = "needs an RDMA device"]
fn exchange_returns_only_when_every_peer_is_connected() {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};
    let n = 3;
    let (ls, addrs) = listeners(n);
    let all: Arc<Mutex<HashMap<(usize, usize), rdma_verbs::QueuePair>>> = Arc::default();
    let threads: Vec<_> = ls
        .into_iter()
        .enumerate()
        .map(|(rank, l)| {
            let (addrs, all) = (addrs.clone(), all.clone());
            thread::spawn(move || {
                let r = Rank::new(n);
                let mesh = Ranks::new(&addrs, rank)
                    .listener(l)
                    .timeout(Duration::from_secs(60))
                    .connect_mesh(&r.local, &r.opts, |peer| {
                        if (rank, peer) == (2, 1) {
                            thread::sleep(Duration::from_millis(500));
                        }
                        let qp =
                            r.pd.create_qp(QpType::Rc, &r.cq, &r.cq)
                                .max_send_wr(8)
                                .max_recv_wr(8)
                                .build()?;
                        all.lock().unwrap().insert((rank, peer), qp.clone());
                        Ok((qp, Vec::new()))
                    })
                    .unwrap();
                for p in mesh.peers() {
                    let theirs = all.lock().unwrap().get(&(p.rank(), rank)).cloned();
                    let state = theirs.map(|qp| qp.state().unwrap());
                    assert_eq!(
                        state,
                        Some(rdma_verbs::QpState::Rts),
                        "rank {rank} returned before rank {}'s queue pair to it was connected",
                        p.rank()
                    );
                }
                mesh
            })
        })
        .collect();
    for t in threads {
        drop(t.join().unwrap());
    }
}

/// Two queue pairs of one process exchange endpoints over a TCP pair with
/// [`Endpoint::exchange`] and connect; a send crosses.
#[test]
#[ignore = "needs an RDMA device"]
fn exchange_connects_two_queue_pairs() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let mut sa = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (mut sb, _) = l.accept().unwrap();
    let r = Rank::new(1);
    let qp = || {
        r.pd.create_qp(QpType::Rc, &r.cq, &r.cq)
            .max_send_wr(8)
            .max_recv_wr(8)
            .build()
            .unwrap()
    };
    let (a, b) = (qp(), qp());
    let (ea, eb) = (
        r.local.endpoint(&a, Endpoint::random_psn()).unwrap(),
        r.local.endpoint(&b, Endpoint::random_psn()).unwrap(),
    );
    let t = thread::spawn(move || {
        rdma_verbs_runtime::exchange(&mut sb, &eb, b"b", Duration::from_secs(10))
    });
    let pa = rdma_verbs_runtime::exchange(&mut sa, &ea, b"a", Duration::from_secs(10)).unwrap();
    let pb: PeerInfo = t.join().unwrap().unwrap();
    assert_eq!((pa.endpoint, &pa.private[..]), (eb, &b"b"[..]));
    assert_eq!((pb.endpoint, &pb.private[..]), (ea, &b"a"[..]));
    a.connect(&ea, &pa.endpoint, &r.opts).unwrap();
    b.connect(&eb, &pb.endpoint, &r.opts).unwrap();
    b.recv_queue()
        .unwrap()
        .recv(r.pd.alloc(8, AccessFlags::LOCAL_WRITE).unwrap(), 0)
        .unwrap();
    a.send_queue()
        .unwrap()
        .send_inline(b"crossed!", Wr::id(0))
        .unwrap();
    let mut got = None;
    for mut c in wait(&r.cq, 2) {
        c.result().unwrap();
        if c.opcode() == WcOpcode::Recv {
            got = Some(c.take_local().unwrap().to_vec());
        }
    }
    assert_eq!(got.as_deref(), Some(&b"crossed!"[..]));
}

/// A hello of `rank` of `ranks` in a full mesh, as a peer sends it.
fn hello(ranks: u32, rank: u32) -> Vec<u8> {
    let mut h = b"IBVM\x01\x00".to_vec();
    h.extend_from_slice(&ranks.to_be_bytes());
    h.extend_from_slice(&rank.to_be_bytes());
    h
}

/// Rank 0 of 2 (real, with queue pairs) against a fake rank 1 that
/// connects, says hello, reads the answer and then does `fake`; returns
/// rank 0's error and how long it took.
fn against_fake(
    timeout: Duration,
    fake: impl FnOnce(&mut TcpStream) + Send + 'static,
) -> (Error, Duration) {
    let (mut ls, addrs) = listeners(2);
    drop(ls.pop());
    let l = ls.pop().unwrap();
    let addr = addrs[0];
    let t = thread::spawn(move || {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(&hello(2, 1)).unwrap();
        let mut answer = [0u8; 14];
        s.read_exact(&mut answer).unwrap();
        assert_eq!(&answer[..], &hello(2, 0)[..]);
        fake(&mut s);
        s
    });
    let r = Rank::new(2);
    let start = Instant::now();
    let made = std::cell::Cell::new(0);
    let result = Ranks::new(&addrs, 0)
        .listener(l)
        .timeout(timeout)
        .connect_mesh(&r.local, &r.opts, |_| {
            made.set(made.get() + 1);
            let qp =
                r.pd.create_qp(QpType::Rc, &r.cq, &r.cq)
                    .max_send_wr(8)
                    .max_recv_wr(8)
                    .build()?;
            Ok((qp, b"secret".to_vec()))
        });
    let took = start.elapsed();
    drop(t.join().unwrap());
    assert_eq!(made.get(), 1);
    (result.expect_err("a hostile peer was accepted"), took)
}

/// The error inside `Error::Peer { rank: 1, .. }`.
fn of_rank_1(e: Error) -> Error {
    match e {
        Error::Peer { rank: 1, error } => *error,
        other => panic!("not an error of rank 1: {other:?}"),
    }
}

#[test]
#[ignore = "needs an RDMA device"]
fn exchange_hostile_peers_get_typed_errors_and_nothing_hangs() {
    let long = Duration::from_secs(20);
    let quick = Duration::from_secs(5);

    // Garbage instead of the exchange message.
    let (e, took) = against_fake(long, |s| {
        s.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
    });
    assert!(matches!(
        of_rank_1(e),
        Error::BadWireFormat {
            what: "endpoint exchange",
            problem: WireProblem::Mismatch { field: "magic", .. }
        }
    ),);
    assert!(took < quick, "{took:?}");

    // Half a message, then the connection closes.
    let (e, took) = against_fake(long, |s| {
        let me = Endpoint {
            qp_num: rdma_verbs::qp::QpNumber(5),
            psn: 1,
            lid: 0,
            gid: rdma_verbs::Gid([1; 16]),
        };
        let mut m = b"IBVX\x01\x00\x00\x00\x00".to_vec();
        m.extend_from_slice(&me.to_bytes());
        s.write_all(&m[..20]).unwrap();
        s.shutdown(std::net::Shutdown::Both).unwrap();
    });
    let e = of_rank_1(e);
    assert!(
        matches!(
            e,
            Error::BadWireFormat {
                what: "endpoint exchange",
                problem: WireProblem::Length {
                    len: 20,
                    expected: 36
                }
            }
        ) || matches!(&e, Error::OutOfBand { io, .. } if io.kind() != std::io::ErrorKind::TimedOut),
        "{e:?}"
    );
    assert!(took < quick, "{took:?}");

    // A well-formed message with an endpoint RoCE cannot reach (no GID):
    // the queue pair is not connected.
    let (e, _) = against_fake(long, |s| {
        let bogus = Endpoint {
            qp_num: rdma_verbs::qp::QpNumber(5),
            psn: 1,
            lid: 0,
            gid: rdma_verbs::Gid::ZERO,
        };
        let mut m = b"IBVX\x01\x00\x00\x00\x00".to_vec();
        m.extend_from_slice(&bogus.to_bytes());
        s.write_all(&m).unwrap();
        // Rank 0's message: its private bytes arrive intact.
        let mut theirs = vec![0u8; 36 + 6];
        s.read_exact(&mut theirs).unwrap();
        assert_eq!(&theirs[..9], b"IBVX\x01\x00\x00\x00\x06");
        assert_eq!(&theirs[36..], b"secret");
    });
    assert!(
        matches!(
            of_rank_1(e),
            Error::Verbs(rdma_verbs::Error::MissingRemoteAddress { needed: "GID", .. })
        ),
        "a zero GID was connected"
    );

    // Silence after the hello: the deadline, not longer.
    let timeout = Duration::from_millis(800);
    let (e, took) = against_fake(timeout, |s| {
        thread::sleep(Duration::from_millis(1500));
        let _ = s.write_all(b"late");
    });
    assert!(
        matches!(of_rank_1(e), Error::OutOfBand { during: "endpoint exchange", io } if io.kind() == std::io::ErrorKind::TimedOut)
    );
    assert!(took >= timeout && took < timeout + quick, "{took:?}");
}

#[test]
#[ignore = "needs an RDMA device"]
fn exchange_fake_lower_rank_and_strangers() {
    // Rank 1 (real) dials a fake rank 0 that answers garbage.
    let (mut ls, addrs) = listeners(2);
    let fake = ls.remove(0);
    let t = thread::spawn(move || {
        let (mut s, _) = fake.accept().unwrap();
        let mut h = [0u8; 14];
        s.read_exact(&mut h).unwrap();
        s.write_all(&[0xff; 14]).unwrap();
        s
    });
    let r = Rank::new(2);
    let start = Instant::now();
    let e = Ranks::new(&addrs, 1)
        .timeout(Duration::from_secs(20))
        .connect_mesh(&r.local, &r.opts, |_| {
            unreachable!("no queue pair before the hellos")
        })
        .unwrap_err();
    drop(t.join().unwrap());
    assert!(start.elapsed() < Duration::from_secs(5));
    match e {
        Error::Peer { rank: 0, error } => assert!(
            matches!(
                *error,
                Error::BadWireFormat {
                    what: "mesh hello",
                    problem: WireProblem::Mismatch { field: "magic", .. }
                }
            ),
            "{error:?}"
        ),
        other => panic!("{other:?}"),
    }

    // A stranger on rank 0's listener claiming a rank of another job.
    let (mut ls, addrs) = listeners(3);
    let l = ls.remove(0);
    let to = addrs[0];
    let t = thread::spawn(move || {
        let mut s = TcpStream::connect(to).unwrap();
        s.write_all(&hello(7, 1)).unwrap();
        thread::sleep(Duration::from_millis(500));
    });
    let e = Ranks::new(&addrs, 0)
        .listener(l)
        .timeout(Duration::from_secs(20))
        .connect_mesh(&r.local, &r.opts, |_| unreachable!())
        .unwrap_err();
    t.join().unwrap();
    assert!(
        matches!(
            e,
            Error::BadWireFormat {
                what: "mesh hello",
                problem: WireProblem::Mismatch {
                    field: "ranks",
                    value: 7,
                    expected: 3
                }
            }
        ),
        "{e:?}"
    );
}
