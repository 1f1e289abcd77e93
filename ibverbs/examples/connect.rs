//! Connect two RC queue pairs, as two hosts would, within one process.
//!
//! ```text
//! cargo run -p rdma-verbs --example connect [device]
//! ```
//! Each side describes its queue pair as an [`Endpoint`] (QP number, first
//! PSN, LID, GID), sends its bytes to the peer out of band (TCP, a file, …;
//! here the bytes just change hands), and connects to the peer's endpoint:
//! RESET → INIT → RTR → RTS. Both queue pairs are on one device, so the
//! traffic loops back through it. The device is the one named on the
//! command line, else `IBVERBS_TEST_DEVICE`, else the first device with an
//! active port.

use std::process::ExitCode;

use rdma_verbs::{
    devices, ConnectOptions, Context, Endpoint, Error, LocalPort, PortNumber, QpType, Result,
};

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("connect: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The device named by argv\[1\] or `IBVERBS_TEST_DEVICE`, else the first
/// device with an active port; and that port.
fn open() -> Result<(Context, PortNumber)> {
    let wanted = std::env::args()
        .nth(1)
        .or_else(|| std::env::var("IBVERBS_TEST_DEVICE").ok());
    let list = devices()?;
    for dev in list.iter() {
        if wanted.as_deref().is_some_and(|w| w != dev.name()) {
            continue;
        }
        let ctx = dev.open()?;
        match ctx.active_port() {
            Ok(port) => return Ok((ctx, port)),
            Err(e) if wanted.is_some() => return Err(e),
            Err(_) => {}
        }
    }
    Err(Error::NoDevice { name: wanted })
}

fn run() -> Result<()> {
    let (ctx, port) = open()?;
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
