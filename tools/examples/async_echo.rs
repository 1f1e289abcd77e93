//! An echo over an RC queue pair with `rdma-verbs-tokio`'s futures
//! (`AsyncQueuePair`): the client sends N messages, the server sends each
//! one back, the client checks every byte.
//!
//! ```text
//! server$ async_echo [-d DEV] [-i PORT] [-g GID_IDX] [-p TCP_PORT] [-n ITERS] [-s SIZE]
//! client$ async_echo [same options] SERVER_HOST
//! ```
//! The queue pairs' endpoints (QP number, PSN, LID, GID) are exchanged over
//! Tokio TCP, with the size and count (both sides must agree). Every wait is
//! bounded by `--timeout` seconds; any failure is reported on stderr with a
//! non-zero exit status.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use rdma_verbs::{
    device::GidIndex, AccessFlags, ConnectOptions, Context, Endpoint, LocalBuffer, LocalPort,
    PortNumber, ProtectionDomain, QpType, RecvRequest, SendRequest,
};
use rdma_verbs_tokio::AsyncQueuePair;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::timeout;

/// Echo messages over RDMA (RC send/receive) with async/await.
#[derive(Parser, Debug)]
#[command(name = "async_echo")]
struct Cli {
    /// Server to connect to (none: be the server).
    host: Option<String>,
    /// RDMA device (default: the first one).
    #[arg(short = 'd', long = "ib-dev", value_name = "DEV")]
    device: Option<String>,
    /// Device port (default: the first active one).
    #[arg(short = 'i', long = "ib-port", value_name = "PORT")]
    ib_port: Option<u8>,
    /// GID index (default: on RoCE the port's RoCE v2 GID with a non-link-local IPv4 address, else its first valid GID; 0 on InfiniBand).
    #[arg(short = 'g', long = "gid-idx", value_name = "INDEX")]
    gid_index: Option<u8>,
    /// TCP port of the endpoint exchange.
    #[arg(short = 'p', long = "port", default_value_t = 18520)]
    tcp_port: u16,
    /// Messages to echo.
    #[arg(short = 'n', long = "iters", default_value_t = 1000)]
    iters: u32,
    /// Message size in bytes.
    #[arg(short = 's', long = "size", default_value_t = 4096)]
    size: u32,
    /// Bound on every wait (connecting, each exchange step, each echo), seconds.
    #[arg(short = 't', long = "timeout", default_value_t = 30)]
    timeout: u64,
}

type Error = Box<dyn std::error::Error + Send + Sync>;
type Result<T, E = Error> = std::result::Result<T, E>;

/// Exchange header: magic, message size, iterations, then the endpoint's
/// wire form.
const MAGIC: &[u8; 8] = b"AECHO\0v2";
const HELLO_LEN: usize = 8 + 4 + 4 + Endpoint::WIRE_LEN;
const READY: u8 = b'R';
const DONE: u8 = b'D';

fn encode(size: u32, iters: u32, ep: &Endpoint) -> [u8; HELLO_LEN] {
    let mut m = [0u8; HELLO_LEN];
    m[..8].copy_from_slice(MAGIC);
    m[8..12].copy_from_slice(&size.to_be_bytes());
    m[12..16].copy_from_slice(&iters.to_be_bytes());
    m[16..].copy_from_slice(&ep.to_bytes());
    m
}

fn decode(m: &[u8; HELLO_LEN]) -> Result<(u32, u32, Endpoint)> {
    if &m[..8] != MAGIC {
        return Err("the peer is not async_echo (bad greeting)".into());
    }
    let u32_at = |i: usize| u32::from_be_bytes([m[i], m[i + 1], m[i + 2], m[i + 3]]);
    let ep = Endpoint::from_bytes(&m[16..])?;
    Ok((u32_at(8), u32_at(12), ep))
}

/// Byte `j` of message `i`.
fn pattern(i: u32, len: usize) -> impl Iterator<Item = u8> {
    (0..len).map(move |j| (j as u32).wrapping_mul(31).wrapping_add(i.wrapping_mul(7)) as u8)
}

/// Runs `fut` with the bound, naming `what` when it expires.
async fn bounded<T, E: Into<Error>>(
    limit: Duration,
    what: &str,
    fut: impl std::future::Future<Output = std::result::Result<T, E>>,
) -> Result<T> {
    match timeout(limit, fut).await {
        Ok(r) => r.map_err(|e| format!("{what}: {}", e.into()).into()),
        Err(_) => Err(format!("{what}: timed out after {} s", limit.as_secs()).into()),
    }
}

fn open(cli: &Cli) -> Result<(Context, PortNumber, GidIndex)> {
    let list = rdma_verbs::devices().map_err(|e| format!("listing RDMA devices: {e}"))?;
    let dev = match &cli.device {
        Some(name) => list
            .find(name)
            .ok_or_else(|| format!("no RDMA device named {name:?}"))?,
        None => list.get(0).ok_or("no RDMA device found")?,
    };
    let ctx = dev
        .open()
        .map_err(|e| format!("opening {}: {e}", dev.name()))?;
    let port = match cli.ib_port {
        Some(p) => PortNumber(p),
        None => ctx.active_port()?,
    };
    let gid = match cli.gid_index {
        Some(g) => GidIndex(g),
        None => ctx.default_gid_index(port)?,
    };
    Ok((ctx, port, gid))
}

/// Exchanges hellos over `tcp`, then connects `qp` to the peer.
async fn handshake(
    cli: &Cli,
    tcp: &mut TcpStream,
    qp: &AsyncQueuePair,
    port: PortNumber,
    gid: GidIndex,
) -> Result<()> {
    let limit = Duration::from_secs(cli.timeout);
    let local = LocalPort::query(qp.queue_pair().pd().context(), port, Some(gid))?;
    let me = local.endpoint(qp.queue_pair(), Endpoint::random_psn())?;
    let hello = encode(cli.size, cli.iters, &me);
    bounded(limit, "sending the endpoint", tcp.write_all(&hello)).await?;
    let mut buf = [0u8; HELLO_LEN];
    bounded(
        limit,
        "reading the peer's endpoint",
        tcp.read_exact(&mut buf),
    )
    .await?;
    let (size, iters, peer) = decode(&buf)?;
    if (size, iters) != (cli.size, cli.iters) {
        return Err(format!(
            "the peer uses -s {size} -n {iters}, this side -s {} -n {}: give both the same",
            cli.size, cli.iters
        )
        .into());
    }
    println!(
        "  local address:  LID {:#06x}, QPN {}, PSN {:#08x}, GID {}",
        me.lid, me.qp_num, me.psn, me.gid
    );
    println!(
        "  remote address: LID {:#06x}, QPN {}, PSN {:#08x}, GID {}",
        peer.lid, peer.qp_num, peer.psn, peer.gid
    );
    qp.queue_pair()
        .connect(&me, &peer, &ConnectOptions::new(port).local_port(&local))
        .map_err(|e| format!("connecting the queue pair: {e}"))?;
    Ok(())
}

async fn read_byte(tcp: &mut TcpStream, want: u8, limit: Duration, what: &str) -> Result<()> {
    let got = bounded(limit, what, tcp.read_u8()).await?;
    if got != want {
        return Err(format!("{what}: expected {:?}, got byte {got:#04x}", want as char).into());
    }
    Ok(())
}

async fn server(
    cli: &Cli,
    qp: AsyncQueuePair,
    pd: &ProtectionDomain,
    port: PortNumber,
    gid: GidIndex,
) -> Result<()> {
    let limit = Duration::from_secs(cli.timeout);
    let listener = TcpListener::bind(("0.0.0.0", cli.tcp_port))
        .await
        .map_err(|e| format!("listening on TCP port {}: {e}", cli.tcp_port))?;
    println!(
        "async_echo: waiting for a client on TCP port {}",
        cli.tcp_port
    );
    let (mut tcp, from) = bounded(limit, "waiting for a client", listener.accept()).await?;
    println!("async_echo: client {from}");
    handshake(cli, &mut tcp, &qp, port, gid).await?;
    let size = cli.size as usize;
    let mut spare = Some(pd.alloc(size, AccessFlags::LOCAL_WRITE)?);
    let mut incoming = match cli.iters {
        0 => None,
        _ => Some(qp.post_recv(RecvRequest::new(pd.alloc(size, AccessFlags::LOCAL_WRITE)?))?),
    };
    bounded(limit, "telling the client to start", tcp.write_u8(READY)).await?;
    for i in 0..cli.iters {
        let Some(pending) = incoming.take() else {
            break;
        };
        let mut c = bounded(limit, &format!("receiving message {i}"), pending).await?;
        if c.byte_len() as usize != size {
            return Err(format!("message {i}: {} bytes, expected {size}", c.byte_len()).into());
        }
        let msg = c
            .take_local()
            .ok_or("a receive completion without its buffer")?;
        // The next receive is posted before the echo goes out.
        if i + 1 < cli.iters {
            let buf = spare.take().ok_or("no spare receive buffer")?;
            incoming = Some(qp.post_recv(RecvRequest::new(buf))?);
        }
        let mut sent = bounded(
            limit,
            &format!("echoing message {i}"),
            qp.post_send(SendRequest::send(msg))?,
        )
        .await?;
        spare = Some(
            sent.take_local()
                .ok_or("a send completion without its buffer")?,
        );
    }
    bounded(limit, "telling the client we are done", tcp.write_u8(DONE)).await?;
    println!("async_echo: echoed {} messages of {size} bytes", cli.iters);
    Ok(())
}

async fn client(
    cli: &Cli,
    host: &str,
    qp: AsyncQueuePair,
    pd: &ProtectionDomain,
    port: PortNumber,
    gid: GidIndex,
) -> Result<()> {
    let limit = Duration::from_secs(cli.timeout);
    let deadline = Instant::now() + limit;
    // Retry while the server is not listening yet.
    let mut tcp = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let attempt = match timeout(left, TcpStream::connect((host, cli.tcp_port))).await {
            Ok(attempt) => attempt,
            Err(_) => Err(std::io::ErrorKind::TimedOut.into()),
        };
        match attempt {
            Ok(s) => break s,
            Err(e) if Instant::now() < deadline => {
                if e.kind() != std::io::ErrorKind::ConnectionRefused {
                    return Err(format!("connecting to {host}:{}: {e}", cli.tcp_port).into());
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => {
                return Err(format!(
                    "connecting to {host}:{}: {e} (for {} s)",
                    cli.tcp_port, cli.timeout
                )
                .into())
            }
        }
    };
    handshake(cli, &mut tcp, &qp, port, gid).await?;
    read_byte(&mut tcp, READY, limit, "waiting for the server's receive").await?;
    let size = cli.size as usize;
    let mut out: LocalBuffer = pd.alloc(size, AccessFlags::LOCAL_WRITE)?;
    let mut back: LocalBuffer = pd.alloc(size, AccessFlags::LOCAL_WRITE)?;
    let start = Instant::now();
    for i in 0..cli.iters {
        for (b, p) in out.iter_mut().zip(pattern(i, size)) {
            *b = p;
        }
        back.fill(0);
        let echo = qp.post_recv(RecvRequest::new(back))?;
        let sent = qp.post_send(SendRequest::send(out))?;
        let (mut s, mut r) = bounded(limit, &format!("message {i}"), async {
            let s = sent.await?;
            let r = echo.await?;
            Ok::<_, rdma_verbs_tokio::Error>((s, r))
        })
        .await?;
        out = s
            .take_local()
            .ok_or("a send completion without its buffer")?;
        if r.byte_len() as usize != size {
            return Err(format!("echo {i}: {} bytes, expected {size}", r.byte_len()).into());
        }
        back = r
            .take_local()
            .ok_or("a receive completion without its buffer")?;
        if let Some(j) = back.iter().zip(pattern(i, size)).position(|(b, p)| *b != p) {
            return Err(format!(
                "echo {i}: byte {j} is {:#04x}, sent something else",
                back[j]
            )
            .into());
        }
    }
    let secs = start.elapsed().as_secs_f64();
    read_byte(&mut tcp, DONE, limit, "waiting for the server to finish").await?;
    println!(
        "async_echo: {} messages of {size} bytes echoed and verified in {secs:.3} s ({:.2} usec/iter)",
        cli.iters,
        secs * 1e6 / f64::from(cli.iters.max(1))
    );
    Ok(())
}

async fn run(cli: Cli) -> Result<()> {
    if cli.size == 0 {
        return Err("-s must be at least 1".into());
    }
    let (ctx, port, gid) = open(&cli)?;
    let pd = ctx.alloc_pd()?;
    let channel = ctx.create_comp_channel()?;
    let cq = ctx.create_cq(16).channel(&channel).build()?;
    let qp = pd
        .create_qp(QpType::Rc, &cq, &cq)
        .max_send_wr(4)
        .max_recv_wr(4)
        .build()?;
    let qp = AsyncQueuePair::new(qp)?;
    match cli.host.clone() {
        Some(host) => client(&cli, &host, qp, &pd, port, gid).await,
        None => server(&cli, qp, &pd, port, gid).await,
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("async_echo: error: cannot start the Tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("async_echo: error: {e}");
            ExitCode::FAILURE
        }
    }
}
