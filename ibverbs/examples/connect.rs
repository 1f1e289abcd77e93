//! Connect two RC queue pairs, as two hosts would, within one process.
//!
//! ```text
//! cargo run -p rdma-verbs --example connect [device]
//! ```
//! Each side describes its queue pair as an [`Endpoint`] (QP number, first
//! PSN, LID, GID), sends its bytes to the peer out of band (TCP, a file, …;
//! here the bytes just change hands), and connects to the peer's endpoint:
//! RESET → INIT → RTR → RTS. Both queue pairs are on one device, so the
//! traffic loops back through it. The device is the one named on the command
//! line, else the first with an active port (`device::open_active`).

use std::process::ExitCode;

use rdma_verbs::device::open_active;
use rdma_verbs::{ConnectOptions, Endpoint, LocalPort, QpType, Result};

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("connect: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<()> {
    let (ctx, port) = open_active(std::env::args().nth(1).as_deref())?;
    let pd = ctx.alloc_pd()?;
    // One CQ for both: it must hold what all four queues may complete.
    let cq = ctx.create_cq(16).build()?;
    let qp = || {
        pd.create_qp(QpType::Rc, &cq, &cq)
            .max_send_wr(4)
            .max_recv_wr(4)
            .build()
    };
    let (a, b) = (qp()?, qp()?);
    println!(
        "{} port {port}: created QPs {} and {}",
        ctx.name(),
        a.qp_num(),
        b.qp_num()
    );
    println!(
        "  states before connecting: {:?}, {:?}",
        a.state()?,
        b.state()?
    );

    // The port's attributes and GID, queried once for every queue pair on it.
    let local = LocalPort::query(&ctx, port, None)?;
    let ea = local.endpoint(&a, Endpoint::random_psn())?;
    let eb = local.endpoint(&b, Endpoint::random_psn())?;

    // Out of band: each side sends `to_bytes()` and parses the peer's.
    let (wire_a, wire_b) = (ea.to_bytes(), eb.to_bytes());
    let peer_of_a = Endpoint::from_bytes(&wire_b)?;
    let peer_of_b = Endpoint::from_bytes(&wire_a)?;
    println!(
        "  endpoint of A: QPN {}, PSN {:#08x}, LID {:#06x}, GID {} ({} bytes on the wire)",
        ea.qp_num,
        ea.psn,
        ea.lid,
        ea.gid,
        wire_a.len()
    );

    // Each side connects its own queue pair to the peer's endpoint.
    let opts = ConnectOptions::new(port).local_port(&local);
    a.connect(&ea, &peer_of_a, &opts)?;
    b.connect(&eb, &peer_of_b, &opts)?;

    let (sa, sb) = (a.state()?, b.state()?); // ibv_query_qp
    println!("  states after connecting: {sa:?}, {sb:?}");
    println!("QP {} <-> QP {} connected", a.qp_num(), b.qp_num());
    Ok(())
}
