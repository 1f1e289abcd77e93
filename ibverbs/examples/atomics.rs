//! RDMA atomics on a peer's 64-bit counter: fetch-and-add and
//! compare-and-swap.
//!
//! ```text
//! cargo run -p rdma-verbs --example atomics [device]
//! ```
//! B shares an 8-byte aligned word with `REMOTE_ATOMIC` rights (its memory
//! region and its queue pair both grant them); A changes it atomically, and
//! each operation writes the word's previous value into a local 8-byte
//! result buffer. The device is the one named on the command line, else the
//! first with an active port (`device::open_active`).

use std::error::Error as StdError;
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use rdma_verbs::device::AtomicCap;
use rdma_verbs::*;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("atomics: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Waits (busy polling, at most 10 s) for the atomic just posted and
/// returns the value it found: the result buffer, in host byte order.
fn old_value(cq: &CompletionQueue) -> std::result::Result<(u64, LocalBuffer), Box<dyn StdError>> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Some(mut c) = cq.poll_one()? {
            c.result()?;
            let result = c.take_local().ok_or("no result buffer")?;
            return Ok((result.as_slice_of::<u64>()?[0], result));
        }
    }
    Err("no completion within 10 s".into())
}

fn run() -> std::result::Result<(), Box<dyn StdError>> {
    let (ctx, port) = device::open_active(std::env::args().nth(1).as_deref())?;
    if ctx.query_device()?.atomic_cap() == AtomicCap::None {
        return Err(format!("{} does not support atomics", ctx.name()).into());
    }
    let pd = ctx.alloc_pd()?;
    let (cq_a, cq_b) = (ctx.create_cq(128).build()?, ctx.create_cq(128).build()?);
    let a = pd.create_qp(QpType::Rc, &cq_a, &cq_a).build()?;
    let b = pd.create_qp(QpType::Rc, &cq_b, &cq_b).build()?;
    let rights = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_ATOMIC;
    let local = LocalPort::query(&ctx, port, None)?;
    let ea = local.endpoint(&a, Endpoint::random_psn())?;
    let eb = local.endpoint(&b, Endpoint::random_psn())?;
    let opts = ConnectOptions::new(port).local_port(&local);
    a.connect(&ea, &eb, &opts)?;
    b.connect(&eb, &ea, &opts.remote_access(rights))?;

    // B's counter, starting at 10. B's CPU sees it as an AtomicU64.
    let shared = pd.alloc_shared(8, rights)?;
    let counter = shared.atomic_u64(0)?;
    counter.store(10, Ordering::SeqCst);
    let word = shared.remote().ok_or("no remote rights")?; // sent to A out of band

    let mut sq = a.send_queue()?;
    let mut result = pd.alloc(8, AccessFlags::LOCAL_WRITE)?;
    let mut seen = Vec::new();
    for _ in 0..3 {
        sq.fetch_and_add(result, word, 5, Wr::id(1))?;
        let (old, buf) = old_value(&cq_a)?;
        println!("fetch-and-add 5: was {old}");
        seen.push(old);
        result = buf; // the buffer came back: reuse it for the next request
    }
    // Compare-and-swap: swaps only when the word holds `compare`.
    for compare in [7, 25] {
        sq.compare_and_swap(result, word, compare, 100, Wr::id(2))?;
        let (old, buf) = old_value(&cq_a)?;
        let swapped = if old == compare {
            "swapped"
        } else {
            "not swapped"
        };
        println!("compare-and-swap {compare} -> 100: was {old}, {swapped}");
        seen.push(old);
        result = buf;
    }

    let now = counter.load(Ordering::SeqCst);
    if seen != [10, 15, 20, 25, 25] || now != 100 {
        return Err(format!("unexpected values: {seen:?}, then {now}").into());
    }
    println!("counter is {now}: every atomic checked");
    Ok(())
}
