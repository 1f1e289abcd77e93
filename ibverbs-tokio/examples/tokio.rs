//! Two-sided send/receive with async/await: the `send_recv` example of
//! `rdma-verbs` on rdma-verbs-tokio's `AsyncQueuePair`.
//!
//! ```text
//! cargo run -p rdma-verbs-tokio --example tokio [device]
//! ```
//! Posting happens at once, when `post_send`/`post_recv` return; each
//! returns a future of the request's completion, which hands the buffer
//! back. No task is spawned and nothing spins: the CQs' completion channels
//! are registered with Tokio's reactor (one channel per queue pair here).
//! Dropping a future cancels nothing on the device. The device is the one
//! named on the command line, else the first with an active port
//! (`device::open_active`).

use std::error::Error as StdError;
use std::process::ExitCode;
use std::time::Duration;

use rdma_verbs::device::open_active;
use rdma_verbs::{
    AccessFlags, ConnectOptions, Endpoint, LocalPort, QpType, RecvRequest, SendRequest,
};
use rdma_verbs_tokio::AsyncQueuePair;

const MESSAGES: u8 = 4;
const SIZE: usize = 4096;

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    match tokio::time::timeout(Duration::from_secs(10), run()).await {
        Ok(Ok(())) => ExitCode::SUCCESS,
        Ok(Err(e)) => {
            eprintln!("tokio: {e}");
            ExitCode::FAILURE
        }
        Err(_) => {
            eprintln!("tokio: not done within 10 s");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), Box<dyn StdError>> {
    let (ctx, port) = open_active(std::env::args().nth(1).as_deref())?;
    let pd = ctx.alloc_pd()?;
    let (channel_a, channel_b) = (ctx.create_comp_channel()?, ctx.create_comp_channel()?);
    let cq_a = ctx.create_cq(32).channel(&channel_a).build()?;
    let cq_b = ctx.create_cq(32).channel(&channel_b).build()?;
    let a = pd
        .create_qp(QpType::Rc, &cq_a, &cq_a)
        .max_send_wr(16)
        .max_recv_wr(16)
        .build()?;
    let b = pd
        .create_qp(QpType::Rc, &cq_b, &cq_b)
        .max_send_wr(16)
        .max_recv_wr(16)
        .build()?;
    let local = LocalPort::query(&ctx, port, None)?;
    let ea = local.endpoint(&a, Endpoint::random_psn())?;
    let eb = local.endpoint(&b, Endpoint::random_psn())?;
    let opts = ConnectOptions::new(port).local_port(&local);
    a.connect(&ea, &eb, &opts)?;
    b.connect(&eb, &ea, &opts)?;
    // Connected, then wrapped (inside the runtime).
    let (a, b) = (AsyncQueuePair::new(a)?, AsyncQueuePair::new(b)?);

    let mut receives = Vec::new();
    for _ in 0..MESSAGES {
        let buf = pd.alloc(SIZE, AccessFlags::LOCAL_WRITE)?;
        receives.push(b.post_recv(RecvRequest::new(buf))?);
    }
    let mut sends = Vec::new();
    for i in 0..MESSAGES {
        let mut msg = pd.alloc(SIZE, AccessFlags::LOCAL_WRITE)?;
        msg.fill(i);
        sends.push(a.post_send(SendRequest::send(msg))?);
    }

    for send in sends {
        send.await?; // an error status is an Err; the buffer is freed here
    }
    for (i, recv) in (0..MESSAGES).zip(receives) {
        let mut c = recv.await?;
        let buf = c.take_local().ok_or("no receive buffer")?;
        if c.byte_len() as usize != SIZE || buf.iter().any(|&x| x != i) {
            return Err(format!("message {i}: the received bytes differ").into());
        }
    }
    println!("sent and received {MESSAGES} messages of {SIZE} bytes with async/await, every byte checked");
    Ok(())
}
