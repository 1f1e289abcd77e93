//! Multicast over rdma_cm, compatible with rdma-core's `mckey`.
//!
//! ```text
//! mckey -m ADDR [-b BIND_ADDR] [-s] [-c CONNECTIONS] [-C COUNT] [-S SIZE] [-p PORT_SPACE] [-o] [-V]
//! ```
//! Each of `-c` ids (UDP port space unless `-p`) resolves the group's
//! address, creates a UD queue pair, joins the group (send-only with `-o`)
//! and prints the group's address from the join event; after a 3-second
//! pause (as mckey, for the fabric to settle) the sender (`-s`) sends `-C`
//! datagrams of `-S` bytes per id to the group, while a receiver waits for
//! `-C` datagrams per id. Then every id leaves the group. Prints what the
//! C tool prints, ending with `return status N`, and exits with N.
//!
//! Differences from the C tool: the sender's payload is a pattern (the C
//! tool sends an uninitialised buffer): message N of each id is
//! `rdma_verbs_tools::integrity`'s pattern for sequence number N (1-based),
//! with the sequence number and a checksum in its header; its sends are
//! signaled and waited for before leaving, and `-V` (ours) makes a receiver
//! check every byte of every message against the pattern for the next
//! sequence number of its sender (the completion's source QP): a lost,
//! repeated, reordered or corrupted datagram ends the run (`return status
//! 1`, the message, sequence number and first differing offset named; no
//! retry). (`IBVERBS_SUITE_CORRUPT=ITER[@OFFSET]`, test instrumentation,
//! makes the sender flip one byte of its message ITER.)
//! `-M` (an unmapped `AF_IB` address) and `-l` (no multicast loopback) are
//! refused. Needs the `rdmacm` feature and the rdma_cm kernel modules.

use std::net::{SocketAddr, ToSocketAddrs};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use rdma_verbs::cm::{CmEventType, CmId, EventChannel, JoinFlags, PortSpace};
use rdma_verbs::{
    qp::{AddressHandle, QpNumber, UdDest},
    AccessFlags, CompletionQueue, Completions, ProtectionDomain, QpType, QueuePair, Wr,
};
use rdma_verbs_tools::integrity;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// Bytes of the GRH area in front of every UD receive.
const GRH: usize = 40;
/// Every wait is bounded.
const TIMEOUT: Duration = Duration::from_secs(10);

/// Multicast join and UD traffic over rdma_cm (rdma-core's mckey).
#[derive(Parser, Debug)]
#[command(name = "mckey")]
struct Cli {
    /// Multicast address to join
    #[arg(short = 'm')]
    addr: Option<String>,
    /// Unmapped (AF_IB) multicast address: not supported here
    #[arg(short = 'M')]
    unmapped: Option<String>,
    /// Sender
    #[arg(short = 's')]
    sender: bool,
    /// Local address to bind to
    #[arg(short = 'b')]
    bind: Option<String>,
    /// Connections: ids (each with its queue pair) joining the group
    #[arg(short = 'c', default_value_t = 1)]
    connections: u32,
    /// Messages per connection
    #[arg(short = 'C', default_value_t = 10)]
    count: u32,
    /// Message size
    #[arg(short = 'S', default_value_t = 100)]
    size: usize,
    /// Port space: 0x111 for UDP (default), 0x2 for IPoIB
    #[arg(short = 'p', value_parser = parse_c_int, default_value = "0x111")]
    port_space: u32,
    /// Join as a send-only full member
    #[arg(short = 'o')]
    send_only: bool,
    /// Join without multicast loopback: not supported here
    #[arg(short = 'l')]
    no_loopback: bool,
    /// Check every received byte against the sender's pattern (ours)
    #[arg(short = 'V')]
    validate: bool,
}

/// A number as C's `strtol(s, NULL, 0)` reads it: `0x` hex, `0` octal.
fn parse_c_int(s: &str) -> Result<u32, String> {
    let r = if let Some(h) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        u32::from_str_radix(h, 16)
    } else if s.len() > 1 && s.starts_with('0') {
        u32::from_str_radix(&s[1..], 8)
    } else {
        s.parse()
    };
    r.map_err(|e| format!("{s}: {e}"))
}

fn addr_of(host: &str) -> Res<SocketAddr> {
    (host, 0).to_socket_addrs()?.next().ok_or_else(|| {
        format!("getaddrinfo failed - invalid hostname or IP address: {host}").into()
    })
}

/// One id and, once its address resolved, its queue pair.
struct Node {
    id: CmId,
    verbs: Option<Verbs>,
    /// The group's address handle, remote QPN and Q_Key, once joined.
    dest: Option<(AddressHandle, QpNumber, u32)>,
}

struct Verbs {
    pd: ProtectionDomain,
    cq: CompletionQueue,
    qp: QueuePair,
}

fn init_node(cli: &Cli, node: &mut Node, dst: SocketAddr) -> Res<()> {
    let ctx = node
        .id
        .context()
        .ok_or("no device after address resolution")?;
    let port = ctx.query_port(node.id.port_num())?;
    let mtu = port.active_mtu().bytes() as usize;
    if cli.count > 0 && cli.size > mtu {
        return Err(format!(
            "mckey: message_size {} is larger than active mtu {mtu}",
            cli.size
        )
        .into());
    }
    let pd = ctx.alloc_pd()?;
    let depth = cli.count.max(1);
    let cq = ctx.create_cq(depth * 2).build()?;
    let qp = pd
        .create_qp(QpType::Ud, &cq, &cq)
        .max_send_wr(depth)
        .max_recv_wr(depth)
        .build()?;
    node.id.activate_ud(&qp)?;
    if !cli.sender {
        let mut rq = qp.recv_queue()?;
        for i in 0..cli.count {
            let buf = pd.alloc(cli.size + GRH, AccessFlags::LOCAL_WRITE)?;
            rq.recv(buf, i.into())?;
        }
    }
    let flags = if cli.send_only {
        JoinFlags::SendOnlyFullMember
    } else {
        JoinFlags::FullMember
    };
    node.id
        .join_multicast_ex(dst, Some(&qp), flags)
        .map_err(|e| format!("mckey: failure joining: {e}"))?;
    node.verbs = Some(Verbs { pd, cq, qp });
    Ok(())
}

/// Handles events until every node joined (or failed).
fn connect_events(cli: &Cli, ch: &EventChannel, nodes: &mut [Node], dst: SocketAddr) -> Res<()> {
    let mut left = nodes.len();
    while left > 0 {
        let ev = ch.get_event(Some(TIMEOUT))?;
        let Some(node) = nodes.iter_mut().find(|n| ev.is_for(&n.id)) else {
            continue;
        };
        match ev.kind() {
            CmEventType::AddrResolved => {
                if let Err(e) = init_node(cli, node, dst) {
                    println!("{e}");
                    return Err(e);
                }
            }
            CmEventType::MulticastJoin => {
                let ud = ev.ud_param().ok_or("a join without UD parameters")?;
                let (gid, mlid) = ud.group();
                println!(
                    "mckey: joined dgid: {gid} mlid {mlid:#x} sl {}",
                    ud.address.as_raw().sl
                );
                let v = node.verbs.as_ref().ok_or("joined before resolving")?;
                let ah = v.pd.create_ah(&ud.address).inspect_err(|_| {
                    println!("mckey: failure creating address handle");
                })?;
                node.dest = Some((ah, ud.qp_num, ud.qkey));
                left -= 1;
            }
            CmEventType::AddrError | CmEventType::RouteError | CmEventType::MulticastError => {
                println!("mckey: event: {:?}, error: {}", ev.kind(), ev.status());
                return Err(format!("{:?} (status {})", ev.kind(), ev.status()).into());
            }
            _ => {}
        }
    }
    Ok(())
}

fn send(cli: &Cli, nodes: &[Node]) -> Res<()> {
    let mut batch = Completions::with_capacity(16);
    let corrupt = integrity::Corrupt::from_env()?;
    for node in nodes {
        let (Some(v), Some((ah, qpn, qkey))) = (&node.verbs, &node.dest) else {
            continue;
        };
        if cli.count == 0 {
            continue;
        }
        // One buffer per message (the send queue holds them all anyway).
        let total = cli
            .size
            .checked_mul(cli.count as usize)
            .ok_or("-C times -S is too large")?;
        let mut area = v.pd.alloc(total, AccessFlags::LOCAL_WRITE)?;
        let mut sq = v.qp.send_queue()?;
        let dest = UdDest::new(ah, *qpn, *qkey);
        for i in 0..cli.count {
            let (mut buf, rest) = area.split_at(cli.size);
            area = rest;
            let seq = i + 1;
            integrity::fill(&mut buf, seq);
            if let Some(k) = &corrupt {
                k.apply("mckey", seq, &mut buf);
            }
            sq.send_to(buf, &dest, Wr::id(i.into()).imm(v.qp.qp_num().0))
                .map_err(|e| format!("failed to post sends: {}", e.error))?;
        }
        let deadline = Instant::now() + TIMEOUT;
        let mut done = 0;
        while done < cli.count {
            for c in v.cq.poll(&mut batch)? {
                c.result()?;
                done += 1;
            }
            if Instant::now() > deadline {
                return Err(format!("{done} of {} sends completed", cli.count).into());
            }
        }
    }
    Ok(())
}

fn receive(cli: &Cli, nodes: &[Node]) -> Res<()> {
    let mut batch = Completions::with_capacity(8);
    let mut verified = 0u64;
    for node in nodes {
        let (Some(v), Some(_)) = (&node.verbs, &node.dest) else {
            continue;
        };
        // Per sender (source QP number): the last sequence number this
        // receiving QP got (each QP in the group gets every datagram).
        let mut senders: Vec<(u32, u32)> = Vec::new();
        let mut done = 0;
        // No time limit, as mckey: a receiver waits for its sender.
        while done < cli.count {
            for mut c in v.cq.poll(&mut batch)? {
                c.result()
                    .map_err(|e| format!("mckey: failed polling CQ: {e}"))?;
                done += 1;
                if cli.validate {
                    let buf = c.take_local().ok_or("a receive without its buffer")?;
                    let len = c.byte_len() as usize;
                    let src = c.src_qp();
                    let seq = match senders.iter_mut().find(|(q, _)| *q == src) {
                        Some((_, last)) => {
                            *last = last.wrapping_add(1);
                            *last
                        }
                        None => {
                            senders.push((src, 1));
                            1
                        }
                    };
                    let what =
                        format!("-V: message {done} (sequence number {seq} from QPN 0x{src:06x})");
                    if len != GRH + cli.size {
                        return Err(format!(
                            "{what}: {} bytes, not {}; stopping (no retry)",
                            len.saturating_sub(GRH),
                            cli.size
                        )
                        .into());
                    }
                    integrity::check(&buf[GRH..len], seq)
                        .map_err(|m| format!("{what}: {m}; stopping (no retry)"))?;
                    verified += 1;
                }
            }
        }
    }
    if cli.validate {
        println!("{verified} messages verified");
    }
    Ok(())
}

fn run(cli: &Cli, ch: &EventChannel, nodes: &mut [Node]) -> Res<()> {
    println!(
        "mckey: starting {}",
        if cli.sender { "client" } else { "server" }
    );
    let src = cli.bind.as_deref().map(addr_of).transpose()?;
    let dst = addr_of(cli.addr.as_deref().ok_or("-m is required")?)?;
    println!("mckey: joining");
    for node in nodes.iter() {
        if let Some(src) = src {
            node.id
                .bind_addr(src)
                .map_err(|e| format!("mckey: addr bind failure: {e}"))?;
        }
        node.id
            .resolve_addr(src, dst, Duration::from_millis(2000))
            .map_err(|e| format!("mckey: resolve addr failure: {e}"))?;
    }
    let mut result = connect_events(cli, ch, nodes, dst);
    if result.is_ok() {
        // As mckey: give the fabric (an SM, switches) time to set up the group.
        std::thread::sleep(Duration::from_secs(3));
        if cli.count > 0 {
            result = if cli.sender {
                println!("initiating data transfers");
                send(cli, nodes)
            } else {
                println!("receiving data transfers");
                receive(cli, nodes)
            };
            if result.is_ok() {
                println!("data transfers complete");
            }
        }
    }
    for node in nodes.iter() {
        if let Err(e) = node.id.leave_multicast(dst) {
            println!("mckey: failure leaving: {e}");
        }
    }
    result
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if cli.unmapped.is_some() {
        eprintln!("mckey: -M (unmapped AF_IB addresses) is not supported");
        return ExitCode::FAILURE;
    }
    if cli.no_loopback {
        eprintln!("mckey: -l (IBV_QP_CREATE_BLOCK_SELF_MCAST_LB) is not supported");
        return ExitCode::FAILURE;
    }
    let mut cli = cli;
    if cli.size == 0 {
        cli.count = 0;
    }
    let status = match setup_and_run(&cli) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("mckey: {e}");
            1
        }
    };
    println!("test complete");
    println!("return status {status}");
    ExitCode::from(status)
}

fn setup_and_run(cli: &Cli) -> Res<()> {
    let ch = EventChannel::new()?;
    let ps = PortSpace::from_raw(cli.port_space);
    let mut nodes = (0..cli.connections)
        .map(|_| {
            Ok(Node {
                id: CmId::with_port_space(&ch, ps)?,
                verbs: None,
                dest: None,
            })
        })
        .collect::<Res<Vec<_>>>()?;
    let r = run(cli, &ch, &mut nodes);
    // Address handles and queue pairs before their ids (as mckey's
    // destroy_node); the library's handles keep the order anyway.
    drop(nodes);
    r
}
