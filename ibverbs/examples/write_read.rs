//! One-sided RDMA: A writes into B's memory, then reads it back, and B's
//! CPU takes no part in either.
//!
//! ```text
//! cargo run -p rdma-verbs --example write_read [device]
//! ```
//! B registers memory that peers may write and read (a `SharedBuffer`, which
//! never lends out `&[u8]`: a peer may change the bytes at any time) and
//! sends A its address, length and rkey (`RemoteMemory`) out of band. B's
//! queue pair must allow the same rights: the device checks both. The device
//! is the one named on the command line, else the first with an active port
//! (`device::open_active`).

use std::error::Error as StdError;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use rdma_verbs::*;

const SIZE: usize = 4096;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("write_read: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Busy-polls `cq` for the next completion (at most 10 s), checks its
/// status and takes the request's buffer back.
fn buffer_back(cq: &CompletionQueue) -> std::result::Result<LocalBuffer, Box<dyn StdError>> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Some(mut c) = cq.poll_one()? {
            c.result()?;
            return Ok(c.take_local().ok_or("no buffer in the completion")?);
        }
    }
    Err("no completion within 10 s".into())
}

fn run() -> std::result::Result<(), Box<dyn StdError>> {
    let (ctx, port) = device::open_active(std::env::args().nth(1).as_deref())?;
    let pd = ctx.alloc_pd()?;
    let (cq_a, cq_b) = (ctx.create_cq(128).build()?, ctx.create_cq(128).build()?);
    let a = pd.create_qp(QpType::Rc, &cq_a, &cq_a).build()?;
    let b = pd.create_qp(QpType::Rc, &cq_b, &cq_b).build()?;

    // B lets its peer write and read through its queue pair; A grants nothing.
    let rights = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let local = LocalPort::query(&ctx, port, None)?;
    let ea = local.endpoint(&a, Endpoint::random_psn())?;
    let eb = local.endpoint(&b, Endpoint::random_psn())?;
    let opts = ConnectOptions::new(port).local_port(&local);
    a.connect(&ea, &eb, &opts)?;
    b.connect(&eb, &ea, &opts.remote_access(rights))?;

    // B's memory, and what A learns of it: address, length, rkey.
    let mut target = pd.alloc_shared(SIZE, rights)?;
    let wire = target
        .remote()
        .ok_or("the region has no remote rights")?
        .to_bytes();
    let remote = RemoteMemory::from_bytes(&wire)?;
    println!(
        "B shares {} bytes at {:#x}, rkey {:#x}",
        remote.len, remote.addr, remote.rkey.0
    );

    // RDMA write: A's buffer goes to the send queue and comes back with
    // the completion, which also means the bytes are in B's memory.
    let mut sq = a.send_queue()?;
    let mut src = pd.alloc(SIZE, AccessFlags::LOCAL_WRITE)?;
    src.iter_mut()
        .enumerate()
        .for_each(|(i, x)| *x = (i % 251) as u8);
    sq.write(src, remote, Wr::id(1))?;
    let src = buffer_back(&cq_a)?;
    if target.to_vec() != src[..] {
        return Err("B's memory differs from what A wrote".into());
    }
    println!("RDMA write: {SIZE} bytes landed in B's memory");

    // B's CPU changes its memory; A's RDMA read sees the change.
    target.copy_from_slice(0, b"changed by B")?;
    sq.read(pd.alloc(SIZE, AccessFlags::LOCAL_WRITE)?, remote, Wr::id(2))?;
    let got = buffer_back(&cq_a)?;
    if got[..12] != b"changed by B"[..] || got[12..] != src[12..] {
        return Err("the bytes read differ from B's memory".into());
    }
    println!("RDMA read: {SIZE} bytes read back, every byte checked");
    Ok(())
}
