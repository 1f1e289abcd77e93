//! N ranks connected pairwise, one RC queue pair per peer: the TCP
//! connections (the lower rank listens, the higher connects), a hello
//! that says who is who, the endpoint exchange, `connect`, and a barrier.

use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use super::{oob, read_some, write_message, Deadline, PeerInfo, WHAT};
use crate::error::{Error, Result};
use rdma_verbs::error::WireProblem;
use rdma_verbs::{ConnectOptions, Endpoint, LocalPort, QueuePair};

/// The first four bytes of a hello.
const HELLO_MAGIC: [u8; 4] = *b"IBVM";
/// The version of the hello this library writes and reads.
const HELLO_VERSION: u8 = 1;
/// Magic (4), version (1), topology (1), ranks (4), rank (4).
const HELLO_LEN: usize = 14;
/// How long the default deadline of a whole [`Ranks`] connection is.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// Who connects to whom.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Topology {
    /// Every rank to every other.
    Full = 0,
    /// Every rank to its left and right neighbours.
    Ring = 1,
}

/// The ranks of a job and which one this process is: connects them with
/// one queue pair per peer ([`connect_mesh`](Ranks::connect_mesh),
/// [`connect_ring`](Ranks::connect_ring)).
///
/// Rank `r` listens on `addrs[r]` (or on [`listener`](Ranks::listener));
/// of each pair of connected ranks the higher one connects to the lower,
/// retrying until the lower one listens, so the ranks may start in any
/// order, within [`timeout`](Ranks::timeout) (default 30 s), which bounds
/// the whole connection: TCP connections, the exchange, `connect` and the
/// barrier. A connection is kept per peer for [`Mesh::barrier`].
///
/// One rank alone (`addrs.len() == 1`) has no peers: its mesh or ring is
/// empty, and its barrier returns at once.
///
/// The ranks trust each other's addresses, not their bytes: a stranger
/// that connects to the listener, a peer with another number of ranks or
/// topology, a malformed message or a silent peer ends the connection
/// with a typed error (below) within the deadline. A stranger is not
/// skipped: the listener belongs to the job.
#[derive(Debug)]
#[must_use]
pub struct Ranks<'a> {
    addrs: &'a [SocketAddr],
    rank: usize,
    timeout: Duration,
    listener: Option<TcpListener>,
}

/// One peer of a [`Mesh`]: the queue pair connected to it and what it
/// sent.
#[derive(Debug)]
pub struct Peer {
    rank: usize,
    qp: QueuePair,
    local: Endpoint,
    remote: PeerInfo,
    stream: TcpStream,
}

impl Peer {
    /// The peer's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }
    /// This side's queue pair connected to the peer (in RTS).
    pub fn qp(&self) -> &QueuePair {
        &self.qp
    }
    /// The endpoint this side sent for [`qp`](Self::qp).
    pub fn local_endpoint(&self) -> &Endpoint {
        &self.local
    }
    /// The peer's endpoint.
    pub fn endpoint(&self) -> &Endpoint {
        &self.remote.endpoint
    }
    /// The private bytes the peer sent for this side.
    pub fn private(&self) -> &[u8] {
        &self.remote.private
    }
}

/// The connected peers of one rank ([`Ranks`]): a queue pair per peer,
/// each in RTS, and a TCP connection per peer for [`barrier`](Self::barrier).
#[derive(Debug)]
pub struct Mesh {
    rank: usize,
    ranks: usize,
    /// Barrier rounds: the topology's diameter.
    rounds: usize,
    /// The sequence byte of the next barrier round.
    sequence: u8,
    /// Ascending by rank.
    peers: Vec<Peer>,
}

impl<'a> Ranks<'a> {
    /// The job's ranks, `addrs[r]` the address rank `r` listens on, and
    /// this process's `rank`. Every rank must be given the same
    /// addresses in the same order (from `host:port` strings:
    /// [`ToSocketAddrs`](std::net::ToSocketAddrs)).
    pub fn new(addrs: &'a [SocketAddr], rank: usize) -> Ranks<'a> {
        Ranks {
            addrs,
            rank,
            timeout: DEFAULT_TIMEOUT,
            listener: None,
        }
    }

    /// The deadline of the whole connection, from the call of
    /// [`connect_mesh`](Self::connect_mesh) or
    /// [`connect_ring`](Self::connect_ring) (default 30 s).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Listens on `listener` instead of binding `addrs[rank]` (to listen
    /// on another interface, or on a port bound beforehand).
    pub fn listener(mut self, listener: TcpListener) -> Self {
        self.listener = Some(listener);
        self
    }

    /// Connects this rank to every other one: one queue pair per peer.
    ///
    /// For each peer, in ascending rank order, `make(peer_rank)` returns a
    /// new RC queue pair in RESET (on the CQs the caller chooses: one per
    /// peer, or shared) and private bytes for that peer (at most
    /// [`MAX_PRIVATE_LEN`](crate::MAX_PRIVATE_LEN), e.g. a
    /// [`RemoteMemory`](rdma_verbs::RemoteMemory)'s wire form). The queue
    /// pair's endpoint on `local` (a random PSN) and the bytes are
    /// exchanged with the peer ([`exchange`](crate::exchange)'s message), the
    /// queue pair is connected with `opts` (give it
    /// [`local_port(local)`](ConnectOptions::local_port)), and a barrier
    /// waits until every rank has connected all its queue pairs: once
    /// this returns, every peer's queue pair is at least in RTR, so a
    /// send reaches a queue pair that accepts it (post receives and call
    /// [`Mesh::barrier`] before sends that need them, or rely on
    /// [`ConnectOptions::rnr_retry`]).
    ///
    /// No rank waits for another in a cycle: the listener is bound first,
    /// connecting needs only the peer's listener, every message is
    /// written before any is read and fits in a socket buffer.
    ///
    /// # Errors
    /// [`rdma_verbs::Error::OutOfRange`] for a rank not below `addrs.len()` or
    /// private bytes longer than [`MAX_PRIVATE_LEN`](crate::MAX_PRIVATE_LEN);
    /// [`Error::OutOfBand`] (`during: "mesh listen"`) when `addrs[rank]`
    /// cannot be bound; whatever `make` returns, unchanged;
    /// [`rdma_verbs::Error::ForeignContext`] for a queue pair of another device
    /// context than `local`'s ([`LocalPort::endpoint`]). Errors of
    /// one peer are [`Error::Peer`] with its rank around
    /// [`Error::OutOfBand`] (`"mesh connect"`, `"mesh accept"`,
    /// [`"endpoint exchange"`](crate::exchange), `"barrier"`: I/O
    /// errors, or of kind [`TimedOut`](io::ErrorKind::TimedOut) when the
    /// deadline passed), [`Error::BadWireFormat`] (`what: "mesh hello"`:
    /// another magic, version, topology (`"topology"`), number of ranks
    /// (`"ranks"`) or rank than the address dialled (`"rank"`); `what:
    /// "endpoint exchange"`, `"Endpoint"` or `"barrier"`), or the error of
    /// [`QueuePair::connect`] with its endpoint. A hello from a stranger
    /// on the listener is [`Error::BadWireFormat`] not wrapped (its rank
    /// is unknown), or with [`WireProblem::Unexpected`] for a rank that
    /// should not connect here or already did.
    ///
    /// # Example
    /// ```no_run
    /// # fn demo(ctx: &rdma_verbs::Context, port: rdma_verbs::PortNumber, my_rank: usize)
    /// #         -> rdma_verbs_runtime::Result<()> {
    /// use std::{net::SocketAddr, time::Duration};
    /// use rdma_verbs::{AccessFlags, ConnectOptions, LocalPort, QpType};
    /// use rdma_verbs_runtime::Ranks;
    /// let addrs: Vec<SocketAddr> =
    ///     ["10.0.0.1:7000", "10.0.0.2:7000", "10.0.0.3:7000"].map(|a| a.parse().unwrap()).into();
    /// let pd = ctx.alloc_pd()?;
    /// let cq = ctx.create_cq(3 * 32).build()?; // one CQ for every peer
    /// let target = pd.alloc_shared(3 * 4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)?;
    /// let local = LocalPort::query(ctx, port, None)?;
    /// let opts = ConnectOptions::new(port).local_port(&local)
    ///     .remote_access(AccessFlags::REMOTE_WRITE);
    /// let mut mesh = Ranks::new(&addrs, my_rank)
    ///     .timeout(Duration::from_secs(60))
    ///     .connect_mesh(&local, &opts, |peer| {
    ///         let qp = pd.create_qp(QpType::Rc, &cq, &cq).max_send_wr(16).max_recv_wr(16).build()?;
    ///         // The peer may write its 4 KiB slice of `target`.
    ///         let slice = target.remote().unwrap().slice(peer as u64 * 4096, 4096).unwrap();
    ///         Ok((qp, slice.to_bytes().to_vec()))
    ///     })?;
    /// for peer in mesh.peers() {
    ///     let _theirs = rdma_verbs::RemoteMemory::from_bytes(peer.private())?;
    ///     // peer.qp().post_send(…): RDMA writes into the peer's slice for us
    /// }
    /// mesh.barrier(Duration::from_secs(10))?;
    /// # Ok(()) }
    /// ```
    ///
    /// # References
    /// `ibv_modify_qp(3)`, `listen(2)`, `connect(2)`
    pub fn connect_mesh<F>(self, local: &LocalPort, opts: &ConnectOptions, make: F) -> Result<Mesh>
    where
        F: FnMut(usize) -> Result<(QueuePair, Vec<u8>)>,
    {
        self.connect(Topology::Full, local, opts, make)
    }

    /// Connects this rank to its neighbours in a ring only: rank
    /// `(rank + N - 1) % N` ([`Mesh::left`]) and `(rank + 1) % N`
    /// ([`Mesh::right`]), the same peer when N = 2. Otherwise as
    /// [`connect_mesh`](Self::connect_mesh); its barrier takes N / 2
    /// rounds of messages to the neighbours.
    ///
    /// # Errors
    /// As [`connect_mesh`](Self::connect_mesh).
    pub fn connect_ring<F>(self, local: &LocalPort, opts: &ConnectOptions, make: F) -> Result<Mesh>
    where
        F: FnMut(usize) -> Result<(QueuePair, Vec<u8>)>,
    {
        self.connect(Topology::Ring, local, opts, make)
    }

    fn connect<F>(
        self,
        topology: Topology,
        local: &LocalPort,
        opts: &ConnectOptions,
        mut make: F,
    ) -> Result<Mesh>
    where
        F: FnMut(usize) -> Result<(QueuePair, Vec<u8>)>,
    {
        let deadline = Deadline::after(self.timeout);
        let (rank, ranks) = (self.rank, self.addrs.len());
        let streams = self.streams(topology, &deadline)?;
        // Every message is written before any is read.
        let mut pending = Vec::with_capacity(streams.len());
        for (peer, mut stream) in streams {
            let (qp, private) = make(peer)?;
            let me = local.endpoint(&qp, Endpoint::random_psn())?;
            let message = super::message(&me, &private)?;
            write_message(&mut stream, &message, &deadline, WHAT).map_err(at(peer))?;
            pending.push((peer, stream, qp, me));
        }
        let mut peers = Vec::with_capacity(pending.len());
        for (peer, mut stream, qp, me) in pending {
            let remote = super::read_message(&mut stream, &deadline).map_err(at(peer))?;
            peers.push(Peer {
                rank: peer,
                qp,
                local: me,
                remote,
                stream,
            });
        }
        for p in &peers {
            p.qp.connect(&p.local, &p.remote.endpoint, opts)
                .map_err(|e| at(p.rank)(e.into()))?;
        }
        let rounds = rounds(topology, ranks);
        let mut mesh = Mesh {
            rank,
            ranks,
            rounds,
            sequence: 0,
            peers,
        };
        mesh.barrier_until(&deadline)?;
        Ok(mesh)
    }

    /// The connected and greeted TCP stream of every peer, ascending.
    pub(super) fn streams(
        self,
        topology: Topology,
        deadline: &Deadline,
    ) -> Result<Vec<(usize, TcpStream)>> {
        let (rank, ranks) = (self.rank, self.addrs.len());
        if rank >= ranks || u32::try_from(ranks).is_err() {
            return Err(rdma_verbs::Error::OutOfRange {
                what: if ranks == 0 {
                    "rank (of an empty address list)"
                } else {
                    "rank"
                },
                value: rank as u64,
                max: ranks.saturating_sub(1) as u64,
            }
            .into());
        }
        let peers = neighbours(topology, rank, ranks);
        let higher: Vec<usize> = peers.iter().copied().filter(|&p| p > rank).collect();
        let listener = match (self.listener, higher.is_empty()) {
            (_, true) => None,
            (Some(l), false) => Some(l),
            (None, false) => {
                Some(TcpListener::bind(self.addrs[rank]).map_err(|io| oob("mesh listen", io))?)
            }
        };
        let hello = hello(topology, ranks, rank);
        let mut out: Vec<(usize, TcpStream)> = Vec::with_capacity(peers.len());
        for &peer in peers.iter().filter(|&&p| p < rank) {
            let mut s = dial(self.addrs[peer], deadline).map_err(at(peer))?;
            write_message(&mut s, &hello, deadline, "mesh connect").map_err(at(peer))?;
            out.push((peer, s));
        }
        if let Some(listener) = listener {
            accept_all(
                &listener, &higher, &hello, topology, ranks, deadline, &mut out,
            )?;
        }
        for (peer, s) in out.iter_mut().filter(|(p, _)| *p < rank) {
            let h = read_hello(s, deadline, "mesh connect").map_err(at(*peer))?;
            check_hello(&h, topology, ranks)
                .and_then(|r| expect(r, *peer))
                .map_err(at(*peer))?;
        }
        out.sort_by_key(|(p, _)| *p);
        Ok(out)
    }
}

impl Mesh {
    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }
    /// The number of ranks.
    pub fn ranks(&self) -> usize {
        self.ranks
    }
    /// The connected peers, ascending by rank.
    pub fn peers(&self) -> &[Peer] {
        &self.peers
    }
    /// The peer of rank `rank`, if connected to this one.
    pub fn peer(&self, rank: usize) -> Option<&Peer> {
        self.peers.iter().find(|p| p.rank == rank)
    }
    /// The peer of rank `(rank + N - 1) % N` (`None` alone).
    pub fn left(&self) -> Option<&Peer> {
        self.peer((self.rank + self.ranks - 1) % self.ranks)
    }
    /// The peer of rank `(rank + 1) % N` (`None` alone).
    pub fn right(&self) -> Option<&Peer> {
        self.peer((self.rank + 1) % self.ranks)
    }

    /// Returns once every rank has called it, or an error at `timeout`.
    ///
    /// Rounds of one byte to every connected peer, then one byte from
    /// each: one round in a full mesh, N / 2 in a ring (a rank learns one
    /// neighbour further per round). The byte is a sequence number, so
    /// ranks out of step are told apart from a slow one. After an error
    /// the ranks are out of step: later barriers fail.
    ///
    /// # Errors
    /// [`Error::Peer`] around [`Error::OutOfBand`] (`during: "barrier"`,
    /// of kind [`TimedOut`](io::ErrorKind::TimedOut) at the deadline) or
    /// [`Error::BadWireFormat`] (`what: "barrier"`:
    /// [`WireProblem::Mismatch`] for another sequence number,
    /// [`WireProblem::Length`] when the peer closed its connection).
    pub fn barrier(&mut self, timeout: Duration) -> Result<()> {
        self.barrier_until(&Deadline::after(timeout))
    }

    fn barrier_until(&mut self, deadline: &Deadline) -> Result<()> {
        barrier_on(
            &mut self.peers,
            |p| (p.rank, &mut p.stream),
            self.rounds,
            &mut self.sequence,
            deadline,
        )
    }
}

/// `rounds` barrier rounds over the streams of `peers`, numbered from
/// `sequence` on.
pub(super) fn barrier_on<T>(
    peers: &mut [T],
    stream: impl Fn(&mut T) -> (usize, &mut TcpStream),
    rounds: usize,
    sequence: &mut u8,
    deadline: &Deadline,
) -> Result<()> {
    const DURING: &str = "barrier";
    for _ in 0..rounds {
        let seq = *sequence;
        *sequence = seq.wrapping_add(1);
        for p in peers.iter_mut() {
            let (rank, s) = stream(p);
            write_message(s, &[seq], deadline, DURING).map_err(at(rank))?;
        }
        for p in peers.iter_mut() {
            let (rank, s) = stream(p);
            let mut b = [0u8];
            let n = read_some(s, &mut b, deadline, DURING).map_err(at(rank))?;
            let problem = match (n, b[0]) {
                (0, _) => WireProblem::Length {
                    len: 0,
                    expected: 1,
                },
                (_, got) if got != seq => WireProblem::Mismatch {
                    field: "barrier sequence",
                    value: got.into(),
                    expected: seq.into(),
                },
                _ => continue,
            };
            return Err(at(rank)(Error::BadWireFormat {
                what: DURING,
                problem,
            }));
        }
    }
    Ok(())
}

/// Barrier rounds of `ranks` connected as `topology`: its diameter.
pub(super) fn rounds(topology: Topology, ranks: usize) -> usize {
    match topology {
        _ if ranks < 2 => 0,
        Topology::Full => 1,
        Topology::Ring => ranks / 2,
    }
}

/// Wraps an error of peer `rank`.
fn at(rank: usize) -> impl FnOnce(Error) -> Error {
    move |error| Error::Peer {
        rank,
        error: Box::new(error),
    }
}

/// The ranks `rank` connects to, ascending, without itself.
pub(super) fn neighbours(topology: Topology, rank: usize, ranks: usize) -> Vec<usize> {
    let mut v: Vec<usize> = match topology {
        Topology::Full => (0..ranks).collect(),
        Topology::Ring => vec![(rank + ranks - 1) % ranks, (rank + 1) % ranks],
    };
    v.retain(|&p| p != rank);
    v.sort_unstable();
    v.dedup();
    v
}

fn hello(topology: Topology, ranks: usize, rank: usize) -> [u8; HELLO_LEN] {
    let mut h = [0u8; HELLO_LEN];
    h[..4].copy_from_slice(&HELLO_MAGIC);
    h[4] = HELLO_VERSION;
    h[5] = topology as u8;
    h[6..10].copy_from_slice(&(ranks as u32).to_be_bytes());
    h[10..14].copy_from_slice(&(rank as u32).to_be_bytes());
    h
}

fn bad_hello(problem: WireProblem) -> Error {
    Error::BadWireFormat {
        what: "mesh hello",
        problem,
    }
}

/// Reads a hello, refusing a wrong magic or version as soon as it
/// arrives.
pub(super) fn read_hello(
    s: &mut TcpStream,
    deadline: &Deadline,
    during: &'static str,
) -> Result<[u8; HELLO_LEN]> {
    let mut h = [0u8; HELLO_LEN];
    let mut got = 0;
    while got < HELLO_LEN {
        let n = read_some(s, &mut h[got..], deadline, during)?;
        if n == 0 {
            return Err(bad_hello(WireProblem::Length {
                len: got,
                expected: HELLO_LEN,
            }));
        }
        got += n;
        if got >= 4 && h[..4] != HELLO_MAGIC {
            return Err(bad_hello(WireProblem::Mismatch {
                field: "magic",
                value: u32::from_be_bytes([h[0], h[1], h[2], h[3]]).into(),
                expected: u32::from_be_bytes(HELLO_MAGIC).into(),
            }));
        }
        if got >= 5 && h[4] != HELLO_VERSION {
            return Err(bad_hello(WireProblem::Version {
                version: h[4],
                supported: HELLO_VERSION,
            }));
        }
    }
    Ok(h)
}

/// Checks a complete hello's topology and number of ranks; returns its
/// rank.
pub(super) fn check_hello(h: &[u8; HELLO_LEN], topology: Topology, ranks: usize) -> Result<usize> {
    let be32 = |at: usize| u32::from_be_bytes([h[at], h[at + 1], h[at + 2], h[at + 3]]);
    let mismatch = |field, value: u64, expected: u64| {
        Err(bad_hello(WireProblem::Mismatch {
            field,
            value,
            expected,
        }))
    };
    if h[5] != topology as u8 {
        return mismatch("topology", h[5].into(), topology as u64);
    }
    if be32(6) as usize != ranks {
        return mismatch("ranks", be32(6).into(), ranks as u64);
    }
    Ok(be32(10) as usize)
}

/// The rank in a hello must be `peer`'s.
fn expect(got: usize, peer: usize) -> Result<()> {
    if got == peer {
        return Ok(());
    }
    Err(bad_hello(WireProblem::Mismatch {
        field: "rank",
        value: got as u64,
        expected: peer as u64,
    }))
}

/// Connects to `addr`, retrying until it listens or the deadline passes.
fn dial(addr: SocketAddr, deadline: &Deadline) -> Result<TcpStream> {
    const DURING: &str = "mesh connect";
    let mut pause = Duration::from_millis(5);
    loop {
        let left = deadline.left(DURING)?;
        match TcpStream::connect_timeout(&addr, left.min(Duration::from_secs(1))) {
            Ok(s) => {
                s.set_nodelay(true).map_err(|io| oob(DURING, io))?;
                return Ok(s);
            }
            // Not listening yet (or not reachable yet): try again.
            Err(_) => {
                std::thread::sleep(pause.min(deadline.left(DURING)?));
                pause = (pause * 2).min(Duration::from_millis(100));
            }
        }
    }
}

/// Accepts the connection of every rank of `higher`, checks its hello and
/// answers with this rank's `hello`.
#[allow(clippy::too_many_arguments)]
fn accept_all(
    listener: &TcpListener,
    higher: &[usize],
    hello: &[u8; HELLO_LEN],
    topology: Topology,
    ranks: usize,
    deadline: &Deadline,
    out: &mut Vec<(usize, TcpStream)>,
) -> Result<()> {
    const DURING: &str = "mesh accept";
    listener
        .set_nonblocking(true)
        .map_err(|io| oob(DURING, io))?;
    let mut waiting: Vec<usize> = higher.to_vec();
    while let Some(&first) = waiting.first() {
        let (mut s, _) = match listener.accept() {
            Ok(a) => a,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                let left = deadline.left(DURING).map_err(at(first))?;
                std::thread::sleep(left.min(Duration::from_millis(2)));
                continue;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(oob(DURING, e)),
        };
        let setup = s.set_nonblocking(false).and_then(|()| s.set_nodelay(true));
        setup.map_err(|io| oob(DURING, io))?;
        let h = read_hello(&mut s, deadline, DURING)?;
        let peer = check_hello(&h, topology, ranks)?;
        let Some(i) = waiting.iter().position(|&p| p == peer) else {
            return Err(bad_hello(WireProblem::Unexpected {
                field: "rank",
                value: peer as u64,
            }));
        };
        waiting.remove(i);
        write_message(&mut s, hello, deadline, DURING).map_err(at(peer))?;
        out.push((peer, s));
    }
    Ok(())
}
