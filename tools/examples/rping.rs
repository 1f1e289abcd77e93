//! RDMA ping over rdma_cm, compatible with rdma-core's `rping`.
//!
//! ```text
//! rping -s [-vVd] [-S size] [-C count] [-a addr] [-p port]          # server
//! rping -c [-vVd] [-S size] [-C count] [-I addr] -a addr [-p port]  # client
//! ```
//! Each ping: the client fills its start buffer with `rdma-ping-N: ` and a
//! rotating alphabet, advertises it (address, rkey, size: 16 bytes, big
//! endian); the server RDMA-reads it and answers with a go-ahead send; the
//! client advertises its sink buffer; the server RDMA-writes the data there
//! and sends another go-ahead; with `-V` the client compares both buffers,
//! every byte (the ping number is in the text, so a stale ping differs); the
//! first difference ends the run naming the ping and the offset, no retry.
//! (`IBVERBS_SUITE_CORRUPT=ITER[@OFFSET]`, test instrumentation, makes our
//! server flip one byte of ping ITER's data, 1-based, before writing it back.)
//! Works against rdma-core's C `rping` in both directions. Needs the
//! `rdmacm` feature (and the rdma_cm kernel modules).

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use rdma_verbs::cm::{CmEvent, CmEventType, CmId, ConnParam, EventChannel};
use rdma_verbs::{
    cq::CompletionChannel, memory::RemoteKey, qp::Posted, AccessFlags, Completion, CompletionQueue,
    LocalBuffer, ProtectionDomain, QpType, QueuePair, RecvQueue, RemoteMemory, SendQueue,
    SharedBuffer, WcOpcode, Wr,
};
use rdma_verbs_tools::{integrity, Done};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// `sizeof("2147483647") + sizeof("rdma-ping-%d: ")`, as rping computes it.
const MIN_SIZE: usize = 11 + 15;
/// rping's buffer limit (64 KiB - 1).
const MAX_SIZE: usize = 64 * 1024 - 1;
/// The advertisement: buf (8), rkey (4), size (4), big endian.
const INFO_LEN: usize = 16;
/// Every wait is bounded.
const TIMEOUT: Duration = Duration::from_secs(10);

/// RDMA ping-pong over rdma_cm (rdma-core's rping).
#[derive(Parser, Debug)]
#[command(name = "rping")]
struct Cli {
    /// Server side (to bind to any IPv6 address use -a ::0)
    #[arg(short = 's', conflicts_with = "client")]
    server: bool,
    /// Client side
    #[arg(short = 'c')]
    client: bool,
    /// Address (server: bind address, default any; client: the server)
    #[arg(short = 'a')]
    addr: Option<String>,
    /// Source address to bind to (client)
    #[arg(short = 'I')]
    source: Option<String>,
    /// Port
    #[arg(short = 'p', default_value_t = 7174)]
    port: u16,
    /// Ping count (0: forever)
    #[arg(short = 'C', default_value_t = 0)]
    count: u32,
    /// Ping data size
    #[arg(short = 'S', default_value_t = 64)]
    size: usize,
    /// Display ping data to stdout
    #[arg(short = 'v')]
    verbose: bool,
    /// Validate ping data
    #[arg(short = 'V')]
    validate: bool,
    /// Debug printfs
    #[arg(short = 'd')]
    debug: bool,
    /// Use a self-created, self-modified QP (always the case here)
    #[arg(short = 'q')]
    self_qp: bool,
}

fn resolve(host: &str, port: u16) -> Res<SocketAddr> {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, port));
    }
    (host, port)
        .to_socket_addrs()
        .map_err(|e| format!("getaddrinfo failed ({e}) - invalid hostname or IP address"))?
        .next()
        .ok_or_else(|| format!("no address for {host}").into())
}

/// The connection's verbs objects and buffers.
struct Conn {
    id: CmId,
    ch: EventChannel,
    cq: CompletionQueue,
    cq_ch: CompletionChannel,
    qp: QueuePair,
    /// The posting handles, taken at the first post of each queue (the
    /// send queue's once the connection is established).
    sq: Option<SendQueue>,
    rq: Option<RecvQueue>,
    done: Done,
    recv: Option<LocalBuffer>,
    send: Option<LocalBuffer>,
    /// A receive completed and was not consumed yet.
    recv_ready: bool,
    /// The buffer of the last RDMA read/write, back from its completion.
    rdma: Option<LocalBuffer>,
    debug: bool,
}

enum Next {
    Wc(Completion),
    Cm(CmEvent),
}

impl Conn {
    fn new(id: CmId, ch: EventChannel, debug: bool) -> Res<(Conn, ProtectionDomain)> {
        let ctx = id.context().ok_or("the rdma_cm id has no device")?;
        let pd = ctx.alloc_pd()?;
        let cq_ch = ctx.create_comp_channel()?;
        let cq = ctx.create_cq(32).channel(&cq_ch).build()?;
        cq.req_notify(false)?;
        let qp = pd
            .create_qp(QpType::Rc, &cq, &cq)
            .max_send_wr(16)
            .max_recv_wr(2)
            .build()?;
        let recv = pd.alloc(INFO_LEN, AccessFlags::LOCAL_WRITE)?;
        let send = pd.alloc(INFO_LEN, AccessFlags::LOCAL_WRITE)?;
        Ok((
            Conn {
                id,
                ch,
                cq,
                cq_ch,
                qp,
                sq: None,
                rq: None,
                done: Done::with_capacity(8),
                recv: Some(recv),
                send: Some(send),
                recv_ready: false,
                rdma: None,
                debug,
            },
            pd,
        ))
    }

    fn post_recv(&mut self) -> Res<()> {
        let buf = self.recv.take().ok_or("receive buffer lost")?;
        let rq = match &mut self.rq {
            Some(rq) => rq,
            rq => rq.insert(self.qp.recv_queue()?),
        };
        rq.recv(buf, 1)
            .map_err(|e| format!("ibv_post_recv failed: {}", e.error))?;
        Ok(())
    }

    /// The send queue's handle (taken at the first send, once connected).
    fn sq(&mut self) -> Res<&mut SendQueue> {
        Ok(match &mut self.sq {
            Some(sq) => sq,
            sq => sq.insert(self.qp.send_queue()?),
        })
    }

    /// Waits for the next completion or rdma_cm event.
    fn next(&mut self) -> Res<Next> {
        let deadline = Instant::now() + TIMEOUT;
        loop {
            if let Some(c) = self.done.pop() {
                return Ok(Next::Wc(c));
            }
            if self.done.poll(&self.cq)? > 0 {
                continue;
            }
            let mut fds = [
                libc::pollfd {
                    fd: self.cq_ch.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: self.ch.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err("timed out waiting for the peer".into());
            }
            // SAFETY: two valid pollfds.
            let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, left.as_millis().max(1) as i32) };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(format!("poll: {e}").into());
            }
            if fds[1].revents != 0 {
                // Completions that arrived before the event come first: a
                // peer that disconnects has usually acknowledged our last
                // send, and that completion may still be on its way.
                if self.done.poll(&self.cq)? > 0 {
                    continue;
                }
                let ev = self.ch.get_event(Some(TIMEOUT))?;
                if self.debug {
                    eprintln!("cma_event type {:?} status {}", ev.kind(), ev.status());
                }
                return Ok(Next::Cm(ev));
            }
            if fds[0].revents != 0 {
                self.cq_ch.get_event()?;
                self.cq.req_notify(false)?;
            }
        }
    }

    /// Handles the next completion or event; `false` on a disconnect.
    fn pump(&mut self) -> Res<bool> {
        match self.next()? {
            Next::Cm(ev) if ev.kind() == CmEventType::Disconnected => Ok(false),
            Next::Cm(ev) => Err(format!("unexpected rdma_cm event {:?}", ev.kind()).into()),
            Next::Wc(mut c) => {
                if !c.is_success() {
                    return Err(format!(
                        "cq completion failed status {} ({})",
                        c.status().as_raw(),
                        c.status()
                    )
                    .into());
                }
                match c.opcode() {
                    WcOpcode::Send => self.send = c.take_local(),
                    WcOpcode::Recv => {
                        if c.byte_len() as usize != INFO_LEN {
                            return Err(
                                format!("Received bogus data, size {}", c.byte_len()).into()
                            );
                        }
                        self.recv = c.take_local();
                        self.recv_ready = true;
                    }
                    WcOpcode::RdmaRead | WcOpcode::RdmaWrite => self.rdma = c.take_local(),
                    other => return Err(format!("unexpected completion {other:?}").into()),
                }
                Ok(true)
            }
        }
    }

    /// Sends a 16-byte advertisement (or go-ahead) and waits until its
    /// buffer is back; `false` if the peer disconnected first (its buffer
    /// then stays with the queue pair until it is flushed).
    fn send_info(&mut self, info: [u8; INFO_LEN]) -> Res<bool> {
        let mut buf = self.send.take().ok_or("send buffer lost")?;
        buf.copy_from_slice(&info);
        self.sq()?
            .send(buf, Wr::id(2))
            .map_err(|e| format!("post send error {}", e.error))?;
        while self.send.is_none() {
            if !self.pump()? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Waits for the peer's next 16-byte message; `None` on disconnect.
    fn recv_info(&mut self) -> Res<Option<RemoteMemory>> {
        while !self.recv_ready {
            if !self.pump()? {
                return Ok(None);
            }
        }
        self.recv_ready = false;
        let buf = self.recv.as_ref().ok_or("receive buffer lost")?;
        let info = RemoteMemory {
            addr: u64::from_be_bytes(buf[..8].try_into()?),
            rkey: RemoteKey(u32::from_be_bytes(buf[8..12].try_into()?)),
            len: u64::from(u32::from_be_bytes(buf[12..16].try_into()?)),
        };
        if self.debug {
            eprintln!(
                "Received rkey {:x} addr {:x} len {} from peer",
                info.rkey.0, info.addr, info.len
            );
        }
        self.post_recv()?;
        Ok(Some(info))
    }

    /// Posts an RDMA read or write (`post` on the send queue) and waits for
    /// its buffer; `None` on a disconnect.
    fn rdma(&mut self, post: impl FnOnce(&mut SendQueue) -> Posted) -> Res<Option<LocalBuffer>> {
        post(self.sq()?).map_err(|e| format!("post send error {}", e.error))?;
        while self.rdma.is_none() {
            if !self.pump()? {
                return Ok(None);
            }
        }
        Ok(self.rdma.take())
    }
}

fn advert(addr: u64, rkey: RemoteKey, size: usize) -> [u8; INFO_LEN] {
    let mut m = [0u8; INFO_LEN];
    m[..8].copy_from_slice(&addr.to_be_bytes());
    m[8..12].copy_from_slice(&rkey.0.to_be_bytes());
    m[12..].copy_from_slice(&(size as u32).to_be_bytes());
    m
}

fn c_string(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

fn expect(ch: &EventChannel, want: CmEventType, debug: bool) -> Res<CmEvent> {
    let ev = ch.get_event(Some(TIMEOUT))?;
    if debug {
        eprintln!("cma_event type {:?} status {}", ev.kind(), ev.status());
    }
    Ok(ev.expect(want)?)
}

fn client(cli: &Cli) -> Res<()> {
    let host = cli.addr.as_deref().ok_or("the client needs -a addr")?;
    let dst = resolve(host, cli.port)?;
    let src = cli.source.as_deref().map(|s| resolve(s, 0)).transpose()?;
    let ch = EventChannel::new()?;
    let id = CmId::new(&ch)?;
    id.resolve_addr(src, dst, Duration::from_millis(2000))?;
    expect(&ch, CmEventType::AddrResolved, cli.debug)?;
    id.resolve_route(Duration::from_millis(2000))?;
    expect(&ch, CmEventType::RouteResolved, cli.debug)?;
    let (mut conn, pd) = Conn::new(id, ch.clone(), cli.debug)?;
    let rights = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE;
    let sink: SharedBuffer = pd.alloc_shared(cli.size, rights)?;
    let mut start = Some(pd.alloc(
        cli.size,
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ,
    )?);
    conn.id.init_qp(&conn.qp)?;
    conn.post_recv()?;
    conn.id.connect(&conn.qp, &ConnParam::new())?;
    expect(&ch, CmEventType::Established, cli.debug)?;

    let mut letter = b'A';
    let mut ping: u32 = 0;
    while cli.count == 0 || ping < cli.count {
        let mut buf = start.take().ok_or("start buffer lost")?;
        let prefix = format!("rdma-ping-{ping}: ");
        let n = prefix.len().min(cli.size - 1);
        buf[..n].copy_from_slice(&prefix.as_bytes()[..n]);
        let mut c = letter;
        for b in &mut buf[n..] {
            *b = c;
            c = if c >= b'z' { b'A' } else { c + 1 };
        }
        letter = if letter >= b'z' { b'A' } else { letter + 1 };
        let last = cli.size - 1;
        buf[last] = 0;
        let addr = buf.addr();
        let rkey = buf.memory_region().rkey().ok_or("no rkey")?;
        start = Some(buf);
        // Advertise the start buffer; the server reads it and answers.
        if !conn.send_info(advert(addr, rkey, cli.size))? {
            return Err("the server disconnected".into());
        }
        conn.recv_info()?.ok_or("the server disconnected")?;
        // Advertise the sink; the server writes it and answers.
        let sink_key = sink.memory_region().rkey().ok_or("no rkey")?;
        if !conn.send_info(advert(sink.addr(), sink_key, cli.size))? {
            return Err("the server disconnected".into());
        }
        conn.recv_info()?.ok_or("the server disconnected")?;
        let mut got = vec![0u8; cli.size];
        sink.copy_to_slice(0, &mut got)?;
        let sent = start.as_ref().ok_or("start buffer lost")?;
        if cli.validate {
            if let Some(d) = integrity::first_difference_in(&got, sent) {
                return Err(format!(
                    "data mismatch! -V: ping {ping} (iteration {}): the data written back \
                     is not the ping sent: {d}; stopping (no retry)",
                    ping + 1
                )
                .into());
            }
        }
        if cli.verbose {
            println!("ping data: {}", c_string(&got));
        }
        ping += 1;
    }
    conn.id.disconnect()?;
    // Wait for the disconnect (or time out quietly: the peer may be gone).
    let _ = expect(&ch, CmEventType::Disconnected, cli.debug);
    Ok(())
}

fn server(cli: &Cli) -> Res<()> {
    let bind = match cli.addr.as_deref() {
        Some(a) => resolve(a, cli.port)?,
        None => SocketAddr::from(([0, 0, 0, 0], cli.port)),
    };
    let ch = EventChannel::new()?;
    let listener = CmId::new(&ch)?;
    listener.bind_addr(bind)?;
    listener.listen(3)?;
    let mut req = ch.get_event(None)?.expect(CmEventType::ConnectRequest)?;
    let child = req.take_id().ok_or("connect request without an id")?;
    let (mut conn, pd) = Conn::new(child, ch.clone(), cli.debug)?;
    let mut data = Some(pd.alloc(cli.size, AccessFlags::LOCAL_WRITE)?);
    conn.id.init_qp(&conn.qp)?;
    conn.post_recv()?;
    conn.id.accept(&conn.qp, &ConnParam::new())?;
    expect(&ch, CmEventType::Established, cli.debug)?;

    let corrupt = integrity::Corrupt::from_env()?;
    let mut iteration = 0u32;
    while let Some(src) = conn.recv_info()? {
        iteration = iteration.wrapping_add(1);
        if src.len as usize > cli.size || src.len == 0 {
            return Err(format!(
                "the client advertises {} bytes, this server's buffer has {} (-S)",
                src.len, cli.size
            )
            .into());
        }
        let (head, tail) = data.take().ok_or("buffer lost")?.split_at(src.len as usize);
        let Some(head) = conn.rdma(|sq| sq.read(head, src, Wr::id(3)))? else {
            break;
        };
        let mut buf = head.unsplit(tail).map_err(|_| "cannot rejoin the buffer")?;
        let text = c_string(&buf);
        if let Some(k) = &corrupt {
            // Within the text (its NUL excluded), which is what goes back.
            let n = text.len().min(buf.len());
            k.apply("rping", iteration, &mut buf[..n]);
        }
        if cli.verbose {
            println!("server ping data: {text}");
        }
        data = Some(buf);
        if !conn.send_info([0; INFO_LEN])? {
            return Err("the client disconnected before its sink advertisement".into());
        }
        let Some(dst) = conn.recv_info()? else {
            break;
        };
        let len = (text.len() + 1).min(cli.size) as u64;
        let to = dst.slice(0, len).ok_or_else(|| {
            format!(
                "the client's sink has {} bytes, the ping has {len}",
                dst.len
            )
        })?;
        let (head, tail) = data.take().ok_or("buffer lost")?.split_at(len as usize);
        let Some(head) = conn.rdma(|sq| sq.write(head, to, Wr::id(4)))? else {
            break;
        };
        data = Some(head.unsplit(tail).map_err(|_| "cannot rejoin the buffer")?);
        // The client may take this go-ahead and disconnect before our
        // send completion is polled: that is the normal end (C rping's
        // server does not wait for it at all).
        if !conn.send_info([0; INFO_LEN])? {
            break;
        }
    }
    let _ = conn.id.disconnect();
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if !cli.server && !cli.client {
        eprintln!("must be either client (-c) or server (-s)");
        return ExitCode::FAILURE;
    }
    if !(MIN_SIZE..=MAX_SIZE).contains(&cli.size) {
        eprintln!(
            "Invalid size {} (valid range is {MIN_SIZE} to {MAX_SIZE})",
            cli.size
        );
        return ExitCode::FAILURE;
    }
    let _ = cli.self_qp;
    let r = if cli.server {
        server(&cli)
    } else {
        client(&cli)
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rping: {e}");
            ExitCode::FAILURE
        }
    }
}
