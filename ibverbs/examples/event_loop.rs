//! Completion events instead of busy polling: sleep on a completion
//! channel until the completion queue has something.
//!
//! ```text
//! cargo run -p rdma-verbs --example event_loop [device]
//! ```
//! A sends a message every 20 ms from a thread of its own. B's receive loop
//! is written out as in C: arm the CQ (`ibv_req_notify_cq`), poll it, and
//! when it is empty sleep on the channel (`ibv_get_cq_event`, no timeout);
//! re-arm after every event, before polling again, or a completion landing
//! in between raises no event. A collects its send completions with
//! `CompletionQueue::wait`: that loop in one call, with a timeout. Each CQ
//! has a channel of its own. The device is the one named on the command line, else the first with an
//! active port (`device::open_active`).

use std::error::Error as StdError;
use std::process::ExitCode;
use std::time::Duration;

use rdma_verbs::*;

const MESSAGES: u64 = 8;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("event_loop: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> std::result::Result<(), Box<dyn StdError>> {
    let (ctx, port) = device::open_active(std::env::args().nth(1).as_deref())?;
    let pd = ctx.alloc_pd()?;
    let (channel_a, channel_b) = (ctx.create_comp_channel()?, ctx.create_comp_channel()?);
    let cq_a = ctx.create_cq(128).channel(&channel_a).build()?;
    let cq_b = ctx.create_cq(128).channel(&channel_b).build()?;
    let a = pd
        .create_qp(QpType::Rc, &cq_a, &cq_a)
        .max_inline_data(64) // A sends small messages inline
        .build()?;
    let b = pd.create_qp(QpType::Rc, &cq_b, &cq_b).build()?;
    let local = LocalPort::query(&ctx, port, None)?;
    let ea = local.endpoint(&a, Endpoint::random_psn())?;
    let eb = local.endpoint(&b, Endpoint::random_psn())?;
    let opts = ConnectOptions::new(port).local_port(&local);
    a.connect(&ea, &eb, &opts)?;
    b.connect(&eb, &ea, &opts)?;

    let mut rq = b.recv_queue()?;
    for i in 0..MESSAGES {
        rq.recv(pd.alloc(64, AccessFlags::LOCAL_WRITE)?, i)?;
    }
    cq_b.req_notify(false)?; // arm: the next completion raises an event

    // A: a message every 20 ms; `wait` sleeps until its completion (or 10 s).
    let mut sq = a.send_queue()?;
    let sender = std::thread::spawn(move || -> Result<u64> {
        let (mut done, mut completed) = (Completions::with_capacity(16), 0);
        for i in 0..MESSAGES {
            std::thread::sleep(Duration::from_millis(20));
            sq.send_inline(format!("message {i}").as_bytes(), Wr::id(i))?;
            for c in cq_a.wait(&mut done, Some(Duration::from_secs(10)))? {
                c.result()?;
                completed += 1;
            }
        }
        Ok(completed)
    });

    // B: poll, sleep until an event, re-arm, poll again.
    let (mut done, mut received, mut events) = (Completions::with_capacity(16), 0, 0);
    loop {
        for mut c in cq_b.poll(&mut done)? {
            c.result()?;
            let buf = c.take_local().ok_or("no receive buffer")?;
            let text = &buf[..c.byte_len() as usize];
            if text != format!("message {}", c.wr_id()).as_bytes() {
                return Err(format!("receive {} got {text:?}", c.wr_id()).into());
            }
            received += 1;
        }
        if received == MESSAGES {
            break;
        }
        channel_b.get_event()?; // sleeps until cq_b raises an event (acked by the CQ)
        events += 1;
        cq_b.req_notify(false)?; // re-arm before polling again
    }
    let sent = sender.join().map_err(|_| "the sending thread panicked")??;
    if sent != MESSAGES {
        return Err(format!("A: {sent} of {MESSAGES} sends completed").into());
    }
    println!("A: {sent} messages sent, their completions collected with wait");
    println!("B: {received} messages received and checked, woken by {events} event(s)");
    Ok(())
}
