//! List the RDMA devices, open one, and print what it can do: the device's
//! limits, each port's state and link, and its GID table.
//!
//! ```text
//! cargo run -p rdma-verbs --example open_device [device]
//! ```
//! The device is the one named on the command line, else the one in
//! `IBVERBS_TEST_DEVICE`, else the first one. No RDMA hardware? SoftRoCE
//! will do: `rdma link add rxe0 type rxe netdev eth0`.

use std::process::ExitCode;

use rdma_verbs::{devices, Error, Result};

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("open_device: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<()> {
    // ibv_get_device_list: every device of this host, none opened yet.
    let list = devices()?;
    println!("{} RDMA device(s)", list.len());
    for dev in list.iter() {
        println!("  {:<12} node GUID {:#018x}", dev.name(), dev.guid());
    }

    let wanted = std::env::args()
        .nth(1)
        .or_else(|| std::env::var("IBVERBS_TEST_DEVICE").ok());
    let dev = match &wanted {
        Some(name) => list.find(name),
        None => list.get(0),
    };
    let ctx = dev.ok_or(Error::NoDevice { name: wanted })?.open()?; // ibv_open_device

    // ibv_query_device: the limits every later object is checked against.
    let attr = ctx.query_device()?;
    println!("opened {}: firmware {:?}", ctx.name(), attr.fw_ver());
    println!(
        "  vendor {:#x}, part {}, hardware version {}",
        attr.vendor_id(),
        attr.vendor_part_id(),
        attr.hw_ver()
    );
    println!(
        "  max: {} QPs of {} WRs and {} SGEs, {} CQs of {} entries, {} MRs, {} PDs",
        attr.max_qp(),
        attr.max_qp_wr(),
        attr.max_sge(),
        attr.max_cq(),
        attr.max_cqe(),
        attr.max_mr(),
        attr.max_pd()
    );
    println!(
        "  atomics: {:?}, RDMA reads/atomics in flight per QP: {}",
        attr.atomic_cap(),
        attr.max_qp_rd_atom()
    );

    // ibv_query_port for each port, and the GID table (ibv_query_gid_table).
    let gids = ctx.gid_table()?;
    for port in ctx.ports()? {
        let p = ctx.query_port(port)?;
        println!(
            "  port {port}: {:?}, link layer {:?}, active MTU {}, LID {:#06x}",
            p.state(),
            p.link_layer(),
            p.active_mtu().bytes(),
            p.lid()
        );
        for g in gids.iter().filter(|g| g.port == port) {
            println!("    GID[{}] {} ({:?})", g.index.0, g.gid, g.gid_type);
        }
    }
    if let Ok(port) = ctx.active_port() {
        println!(
            "default GID index for port {port}: {}",
            ctx.default_gid_index(port)?.0
        );
    }
    Ok(())
}
