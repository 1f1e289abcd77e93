//! One RC queue pair connected to itself: send one message, receive it.
//!
//! ```text
//! cargo run --example loopback -- [--device rxe0] [--port 1] [--gid-index N] [--size 4096]
//! ```
//! The smallest end-to-end use of the safe API: open a device, register
//! memory, create a CQ and a QP, connect the QP to its own endpoint, post a
//! receive and a send, and get both buffers back from their completions
//! (sleeping on the CQ's completion channel until they arrive).

use std::process::ExitCode;
use std::time::{Duration, Instant};

use rdma_verbs::{
    device::GidIndex, AccessFlags, Completions, ConnectOptions, Endpoint, LocalPort, PortNumber,
    QpType, Wr,
};

struct Args {
    device: Option<String>,
    port: Option<u8>,
    gid_index: Option<u8>,
    size: usize,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        device: None,
        port: None,
        gid_index: None,
        size: 4096,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "-d" | "--device" => args.device = Some(value()?),
            "-i" | "--port" => args.port = Some(value()?.parse().map_err(|e| format!("{e}"))?),
            "-g" | "--gid-index" => {
                args.gid_index = Some(value()?.parse().map_err(|e| format!("{e}"))?)
            }
            "-s" | "--size" => args.size = value()?.parse().map_err(|e| format!("{e}"))?,
            "-h" | "--help" => {
                return Err(
                    "usage: loopback [--device NAME] [--port N] [--gid-index N] [--size BYTES]"
                        .into(),
                )
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(args)
}

fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let list = rdma_verbs::devices()?;
    let dev = match &args.device {
        Some(name) => list.find(name).ok_or_else(|| rdma_verbs::Error::NoDevice {
            name: Some(name.clone()),
        })?,
        None => list
            .get(0)
            .ok_or(rdma_verbs::Error::NoDevice { name: None })?,
    };
    let ctx = dev.open()?;
    let port = match args.port {
        Some(p) => PortNumber(p),
        None => ctx.active_port()?,
    };
    let gid_index = match args.gid_index {
        Some(g) => GidIndex(g),
        None => ctx.default_gid_index(port)?,
    };
    let port_attr = ctx.query_port(port)?;
    println!(
        "device {} port {port}: {:?}, {:?}, active MTU {} bytes, GID[{}] {}",
        ctx.name(),
        port_attr.state(),
        port_attr.link_layer(),
        port_attr.active_mtu().bytes(),
        gid_index.0,
        ctx.query_gid(port, gid_index)?
    );

    let pd = ctx.alloc_pd()?;
    let channel = ctx.create_comp_channel()?;
    let cq = ctx.create_cq(8).channel(&channel).build()?;
    // One send and one receive outstanding: the CQ holds both.
    let qp = pd
        .create_qp(QpType::Rc, &cq, &cq)
        .max_send_wr(1)
        .max_recv_wr(1)
        .build()?;
    let local = LocalPort::query(&ctx, port, Some(gid_index))?;
    let me = local.endpoint(&qp, Endpoint::random_psn())?;
    qp.connect(&me, &me, &ConnectOptions::new(port).local_port(&local))?;
    println!(
        "QP {} connected to itself (PSN {:#08x})",
        qp.qp_num(),
        me.psn
    );

    // One registration, split into a receive half and a send half.
    let buf = pd.alloc(2 * args.size, AccessFlags::LOCAL_WRITE)?;
    let (recv_buf, mut send_buf) = buf.split_at(args.size);
    for (i, b) in send_buf.iter_mut().enumerate() {
        *b = (i % 251) as u8;
    }
    let message = b"hello over RDMA loopback";
    let n = message.len().min(args.size);
    send_buf[..n].copy_from_slice(&message[..n]);

    // The queues' posting handles (the send queue's once connected).
    let mut rq = qp.recv_queue()?;
    let mut sq = qp.send_queue()?;
    let start = Instant::now();
    rq.recv(recv_buf, 1)?;
    sq.send(send_buf, Wr::id(2))?;

    let mut done = Completions::with_capacity(4);
    let (mut recv_buf, mut send_buf) = (None, None);
    let deadline = start + Duration::from_secs(10);
    while recv_buf.is_none() || send_buf.is_none() {
        let left = deadline.saturating_duration_since(Instant::now());
        // The completions are lent from `done` for one walk; the buffers
        // taken out of them are ours.
        for mut c in cq.wait(&mut done, Some(left))? {
            c.result()?;
            match c.wr_id() {
                1 => {
                    println!(
                        "recv completion: {} bytes, opcode {:?}",
                        c.byte_len(),
                        c.opcode()
                    );
                    recv_buf = c.take_local();
                }
                _ => send_buf = c.take_local(),
            }
        }
        if (recv_buf.is_none() || send_buf.is_none()) && Instant::now() >= deadline {
            return Err("no completion within 10 s".into());
        }
    }
    let (recv_buf, send_buf) = (recv_buf.unwrap(), send_buf.unwrap());
    if recv_buf[..] != send_buf[..] {
        return Err("received bytes differ from the sent ones".into());
    }
    println!(
        "received {:?} ({} bytes verified) in {:.1} µs",
        String::from_utf8_lossy(&recv_buf[..n]),
        recv_buf.len(),
        start.elapsed().as_secs_f64() * 1e6
    );
    // Everything is destroyed in the right order when the handles drop.
    Ok(())
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("loopback: {e}");
            ExitCode::FAILURE
        }
    }
}
