//! Two-sided messaging: queue pair A sends, queue pair B receives.
//!
//! ```text
//! cargo run -p rdma-verbs --example send_recv [device]
//! ```
//! Shows the ownership model: registering memory gives back the only handle
//! to it, posting a request moves the buffer into the queue pair, and the
//! completion hands it back. B posts its receive buffers first (a send finds
//! no buffer otherwise), A sends, and both completion queues are polled
//! until every buffer is back; then the received bytes are checked. The
//! device is the one named on the command line, else the first with an
//! active port (`device::open_active`).

use std::error::Error as StdError;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use rdma_verbs::*;

const MESSAGES: u64 = 4;
const SIZE: usize = 4096;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("send_recv: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Message `i`: its number, then a pattern.
fn message(i: u64) -> Vec<u8> {
    let mut m: Vec<u8> = (0..SIZE).map(|j| (j as u64 * 7 + i) as u8).collect();
    m[..8].copy_from_slice(&i.to_le_bytes());
    m
}

fn run() -> std::result::Result<(), Box<dyn StdError>> {
    let (ctx, port) = device::open_active(std::env::args().nth(1).as_deref())?;
    let pd = ctx.alloc_pd()?;
    // A CQ must hold every completion its queues may owe: by default a
    // queue pair has 64 sends and 64 receives outstanding at most.
    let (cq_a, cq_b) = (ctx.create_cq(128).build()?, ctx.create_cq(128).build()?);
    let a = pd.create_qp(QpType::Rc, &cq_a, &cq_a).build()?;
    let b = pd.create_qp(QpType::Rc, &cq_b, &cq_b).build()?;
    // Connect A and B (the `connect` example shows the endpoint exchange).
    let local = LocalPort::query(&ctx, port, None)?;
    let ea = local.endpoint(&a, Endpoint::random_psn())?;
    let eb = local.endpoint(&b, Endpoint::random_psn())?;
    let opts = ConnectOptions::new(port).local_port(&local);
    a.connect(&ea, &eb, &opts)?;
    b.connect(&eb, &ea, &opts)?;

    // Each queue has one posting handle; posts take it `&mut`.
    let (mut sq, mut rq) = (a.send_queue()?, b.recv_queue()?);
    for i in 0..MESSAGES {
        rq.recv(pd.alloc(SIZE, AccessFlags::LOCAL_WRITE)?, i)?; // wr_id i
    }
    for i in 0..MESSAGES {
        // `register` takes ownership of the Vec; the buffer moves into the QP.
        let buf = pd.register(message(i), AccessFlags::LOCAL_WRITE)?;
        sq.send(buf, Wr::id(i))?;
    }

    // Poll both CQs until every request completed. The entries are lent
    // for one walk; what `take_local` takes out is ours again.
    let mut done = Completions::with_capacity(16);
    let (mut sent, mut received) = (0, 0);
    let deadline = Instant::now() + Duration::from_secs(10);
    while sent < MESSAGES || received < MESSAGES {
        for c in cq_a.poll(&mut done)? {
            c.result()?; // an error status becomes Error::WorkCompletion
            sent += 1; // the send buffer is dropped with the entry: freed
        }
        for mut c in cq_b.poll(&mut done)? {
            c.result()?;
            let buf = c
                .take_local()
                .ok_or("a receive came back without its buffer")?;
            let i = c.wr_id();
            if c.byte_len() as usize != SIZE || buf[..] != message(i)[..] {
                return Err(format!("message {i}: the received bytes differ").into());
            }
            received += 1;
        }
        if Instant::now() > deadline {
            return Err(format!("{sent} sends, {received} receives completed in 10 s").into());
        }
    }
    println!("sent {sent} and received {received} messages of {SIZE} bytes, every byte checked");
    Ok(())
}
