//! Prints RDMA devices and their ports, like rdma-core's `ibv_devinfo`.
//!
//! ```text
//! devinfo [-d DEV] [-i PORT] [-l] [-v]
//! ```
//! `-l` lists device names; `-v` adds the device limits, the port details
//! and the GID table. Same layout as `ibv_devinfo` (tab-aligned), from
//! `query_device`, `query_port` and `gid_table`. Not shown: the extended
//! attributes of `ibv_query_device_ex` (ODP, TSO, RSS, packet pacing, tag
//! matching, timestamps) and `num_comp_vectors`, which the safe API does not
//! expose.

use std::process::ExitCode;

use clap::Parser;
use rdma_verbs::sys;
use rdma_verbs::{
    device::{GidType, LinkLayer, Mtu, PortState},
    Device, PortNumber,
};

/// Print RDMA device attributes (ibv_devinfo).
#[derive(Parser, Debug)]
#[command(name = "devinfo")]
struct Cli {
    /// Only this device (default: all devices).
    #[arg(short = 'd', long = "ib-dev", value_name = "DEV")]
    device: Option<String>,
    /// Only this port (default: all ports).
    #[arg(short = 'i', long = "ib-port", value_name = "PORT", value_parser = clap::value_parser!(u8).range(1..))]
    port: Option<u8>,
    /// Print only the device names.
    #[arg(short = 'l', long = "list")]
    list: bool,
    /// Print all attributes, the port details and the GID table.
    #[arg(short = 'v', long = "verbose")]
    verbose: bool,
}

type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// `label` after `indent` tabs, then tabs up to column `col` (tab stops
/// every 8 columns, at least one tab): `ibv_devinfo`'s alignment.
fn field(out: &mut String, indent: usize, label: &str, col: usize, value: &str) {
    for _ in 0..indent {
        out.push('\t');
    }
    out.push_str(label);
    let mut c = indent * 8 + label.len();
    loop {
        out.push('\t');
        c = (c / 8 + 1) * 8;
        if c >= col {
            break;
        }
    }
    out.push_str(value);
    out.push('\n');
}

/// A device-level line (value at column 40).
fn dev_line(out: &mut String, label: &str, value: impl std::fmt::Display) {
    field(out, 1, &format!("{label}:"), 40, &value.to_string());
}

/// A port-level line (value at column 48).
fn port_line(out: &mut String, label: &str, value: impl std::fmt::Display) {
    field(out, 3, &format!("{label}:"), 48, &value.to_string());
}

/// A flag name under a flags line (column 40).
fn flag_line(out: &mut String, name: &str) {
    out.push_str("\t\t\t\t\t");
    out.push_str(name);
    out.push('\n');
}

/// `xxxx:xxxx:xxxx:xxxx` from a GUID in host order.
fn guid_str(guid: u64) -> String {
    format!(
        "{:04x}:{:04x}:{:04x}:{:04x}",
        (guid >> 48) & 0xffff,
        (guid >> 32) & 0xffff,
        (guid >> 16) & 0xffff,
        guid & 0xffff
    )
}

/// A sysfs attribute of the device (`node_type`, `board_id`), trimmed.
fn sysfs(dev: &Device<'_>, attr: &str) -> Option<String> {
    let path = std::path::Path::new(dev.ibdev_path()).join(attr);
    let s = std::fs::read_to_string(path).ok()?;
    let s = s.trim().to_owned();
    (!s.is_empty()).then_some(s)
}

/// The transport type libibverbs derives from the node type (the safe API
/// does not expose `ibv_device::transport_type`; both come from sysfs).
fn transport(dev: &Device<'_>) -> (&'static str, i32) {
    let node_type = sysfs(dev, "node_type").and_then(|s| {
        s.split(':')
            .next()
            .and_then(|n| n.trim().parse::<u32>().ok())
    });
    match node_type {
        Some(1..=3) => ("InfiniBand", sys::IBV_TRANSPORT_IB),
        Some(4) => ("iWARP", sys::IBV_TRANSPORT_IWARP),
        Some(5) => ("usNIC", sys::IBV_TRANSPORT_USNIC),
        Some(6) => ("usNIC UDP", sys::IBV_TRANSPORT_USNIC_UDP),
        _ => ("unspecified", sys::IBV_TRANSPORT_UNSPECIFIED),
    }
}

fn port_state_str(s: PortState) -> &'static str {
    match s {
        PortState::Down => "PORT_DOWN",
        PortState::Init => "PORT_INIT",
        PortState::Armed => "PORT_ARMED",
        PortState::Active => "PORT_ACTIVE",
        _ => "invalid state",
    }
}

fn mtu_str(m: Mtu) -> String {
    match m {
        Mtu::Unknown(_) => "invalid MTU".into(),
        m => m.bytes().to_string(),
    }
}

fn link_layer_str(l: LinkLayer) -> &'static str {
    match l {
        LinkLayer::Unspecified => "Unspecified",
        LinkLayer::InfiniBand => "InfiniBand",
        LinkLayer::Ethernet => "Ethernet",
        _ => "Unknown",
    }
}

fn width_str(w: u8) -> &'static str {
    match w {
        1 => "1",
        2 => "4",
        4 => "8",
        8 => "12",
        16 => "2",
        _ => "invalid width",
    }
}

fn speed_str(s: u8) -> &'static str {
    match s {
        1 => "2.5 Gbps",
        2 => "5.0 Gbps",
        4 | 8 => "10.0 Gbps",
        16 => "14.0 Gbps",
        32 => "25.0 Gbps",
        64 => "50.0 Gbps",
        128 => "100.0 Gbps",
        _ => "invalid speed",
    }
}

fn vl_str(v: u8) -> &'static str {
    match v {
        1 => "1",
        2 => "2",
        3 => "4",
        4 => "8",
        5 => "15",
        _ => "invalid value",
    }
}

fn phys_state_str(p: u8) -> &'static str {
    match p {
        1 => "SLEEP",
        2 => "POLLING",
        3 => "DISABLED",
        4 => "PORT_CONFIGURATION TRAINNING",
        5 => "LINK_UP",
        6 => "LINK_ERROR_RECOVERY",
        7 => "PHY TEST",
        _ => "invalid physical state",
    }
}

fn atomic_str(a: rdma_verbs::device::AtomicCap) -> &'static str {
    match a {
        rdma_verbs::device::AtomicCap::None => "ATOMIC_NONE",
        rdma_verbs::device::AtomicCap::Hca => "ATOMIC_HCA",
        rdma_verbs::device::AtomicCap::Glob => "ATOMIC_GLOB",
        _ => "invalid atomic capability",
    }
}

/// Device capability flag names (`IBV_DEVICE_*`), in rdma-core's order.
fn cap_flags() -> [(u32, &'static str); 24] {
    use sys::ibv_device_cap_flags as F;
    [
        (F::IBV_DEVICE_RESIZE_MAX_WR.0, "RESIZE_MAX_WR"),
        (F::IBV_DEVICE_BAD_PKEY_CNTR.0, "BAD_PKEY_CNTR"),
        (F::IBV_DEVICE_BAD_QKEY_CNTR.0, "BAD_QKEY_CNTR"),
        (F::IBV_DEVICE_RAW_MULTI.0, "RAW_MULTI"),
        (F::IBV_DEVICE_AUTO_PATH_MIG.0, "AUTO_PATH_MIG"),
        (F::IBV_DEVICE_CHANGE_PHY_PORT.0, "CHANGE_PHY_PORT"),
        (F::IBV_DEVICE_UD_AV_PORT_ENFORCE.0, "UD_AV_PORT_ENFORCE"),
        (F::IBV_DEVICE_CURR_QP_STATE_MOD.0, "CURR_QP_STATE_MOD"),
        (F::IBV_DEVICE_SHUTDOWN_PORT.0, "SHUTDOWN_PORT"),
        (F::IBV_DEVICE_INIT_TYPE.0, "INIT_TYPE"),
        (F::IBV_DEVICE_PORT_ACTIVE_EVENT.0, "PORT_ACTIVE_EVENT"),
        (F::IBV_DEVICE_SYS_IMAGE_GUID.0, "SYS_IMAGE_GUID"),
        (F::IBV_DEVICE_RC_RNR_NAK_GEN.0, "RC_RNR_NAK_GEN"),
        (F::IBV_DEVICE_SRQ_RESIZE.0, "SRQ_RESIZE"),
        (F::IBV_DEVICE_N_NOTIFY_CQ.0, "N_NOTIFY_CQ"),
        (F::IBV_DEVICE_MEM_WINDOW.0, "MEM_WINDOW"),
        (F::IBV_DEVICE_UD_IP_CSUM.0, "UD_IP_CSUM"),
        (F::IBV_DEVICE_XRC.0, "XRC"),
        (F::IBV_DEVICE_MEM_MGT_EXTENSIONS.0, "MEM_MGT_EXTENSIONS"),
        (F::IBV_DEVICE_MEM_WINDOW_TYPE_2A.0, "MEM_WINDOW_TYPE_2A"),
        (F::IBV_DEVICE_MEM_WINDOW_TYPE_2B.0, "MEM_WINDOW_TYPE_2B"),
        (F::IBV_DEVICE_RC_IP_CSUM.0, "RC_IP_CSUM"),
        (F::IBV_DEVICE_RAW_IP_CSUM.0, "RAW_IP_CSUM"),
        (
            F::IBV_DEVICE_MANAGED_FLOW_STEERING.0,
            "MANAGED_FLOW_STEERING",
        ),
    ]
}

/// A GID as `ibv_devinfo` prints it: RoCE v2 as an IPv6 address, others as
/// eight groups of hex; on Ethernet with the GID type.
fn gid_line(out: &mut String, e: &rdma_verbs::device::GidEntry, ethernet: bool) {
    let text = match e.gid_type {
        GidType::RoceV2 => e.gid.to_ipv6().to_string(),
        _ => e
            .gid
            .0
            .chunks(2)
            .map(|c| format!("{:02x}{:02x}", c[0], c[1]))
            .collect::<Vec<_>>()
            .join(":"),
    };
    let kind = match (ethernet, e.gid_type) {
        (false, _) => String::new(),
        (true, GidType::RoceV1) => ", RoCE v1".into(),
        (true, GidType::RoceV2) => ", RoCE v2".into(),
        (true, _) => ", Invalid gid type".into(),
    };
    field(
        out,
        3,
        &format!("GID[{:>3}]:", e.index.0),
        48,
        &format!("{text}{kind}"),
    );
}

fn print_device(dev: &Device<'_>, only_port: Option<u8>, verbose: bool) -> Result<()> {
    let ctx = dev
        .open()
        .map_err(|e| format!("failed to open {}: {e}", dev.name()))?;
    let attr = ctx
        .query_device()
        .map_err(|e| format!("failed to query {}: {e}", dev.name()))?;
    let raw = attr.as_raw();
    if let Some(p) = only_port {
        if p > attr.phys_port_cnt() {
            return Err(format!("invalid port {p} requested for {}", dev.name()).into());
        }
    }
    let mut out = String::new();
    out.push_str(&format!("hca_id:\t{}\n", dev.name()));
    let (tname, tnum) = transport(dev);
    dev_line(&mut out, "transport", format!("{tname} ({tnum})"));
    let fw = attr.fw_ver();
    if !fw.is_empty() {
        dev_line(&mut out, "fw_ver", fw);
    }
    dev_line(&mut out, "node_guid", guid_str(attr.node_guid()));
    dev_line(&mut out, "sys_image_guid", guid_str(attr.sys_image_guid()));
    dev_line(&mut out, "vendor_id", format!("{:#06x}", attr.vendor_id()));
    dev_line(&mut out, "vendor_part_id", attr.vendor_part_id());
    dev_line(&mut out, "hw_ver", format!("0x{:X}", attr.hw_ver()));
    if let Some(board) = sysfs(dev, "board_id") {
        dev_line(&mut out, "board_id", board);
    }
    dev_line(&mut out, "phys_port_cnt", attr.phys_port_cnt());

    if verbose {
        dev_line(
            &mut out,
            "max_mr_size",
            format!("{:#x}", attr.max_mr_size()),
        );
        dev_line(
            &mut out,
            "page_size_cap",
            format!("{:#x}", attr.page_size_cap()),
        );
        dev_line(&mut out, "max_qp", raw.max_qp);
        dev_line(&mut out, "max_qp_wr", raw.max_qp_wr);
        let flags = attr.device_cap_flags();
        dev_line(&mut out, "device_cap_flags", format!("0x{flags:08x}"));
        let mut known = 0u32;
        for (bit, name) in cap_flags() {
            known |= bit;
            if flags & bit != 0 {
                flag_line(&mut out, name);
            }
        }
        if flags & !known != 0 {
            flag_line(&mut out, &format!("Unknown flags: 0x{:X}", flags & !known));
        }
        dev_line(&mut out, "max_sge", raw.max_sge);
        dev_line(&mut out, "max_sge_rd", raw.max_sge_rd);
        dev_line(&mut out, "max_cq", raw.max_cq);
        dev_line(&mut out, "max_cqe", raw.max_cqe);
        dev_line(&mut out, "max_mr", raw.max_mr);
        dev_line(&mut out, "max_pd", raw.max_pd);
        dev_line(&mut out, "max_qp_rd_atom", raw.max_qp_rd_atom);
        dev_line(&mut out, "max_ee_rd_atom", raw.max_ee_rd_atom);
        dev_line(&mut out, "max_res_rd_atom", raw.max_res_rd_atom);
        dev_line(&mut out, "max_qp_init_rd_atom", raw.max_qp_init_rd_atom);
        dev_line(&mut out, "max_ee_init_rd_atom", raw.max_ee_init_rd_atom);
        let cap = attr.atomic_cap();
        dev_line(
            &mut out,
            "atomic_cap",
            format!("{} ({})", atomic_str(cap), cap.as_raw()),
        );
        dev_line(&mut out, "max_ee", raw.max_ee);
        dev_line(&mut out, "max_rdd", raw.max_rdd);
        dev_line(&mut out, "max_mw", raw.max_mw);
        dev_line(&mut out, "max_raw_ipv6_qp", raw.max_raw_ipv6_qp);
        dev_line(&mut out, "max_raw_ethy_qp", raw.max_raw_ethy_qp);
        dev_line(&mut out, "max_mcast_grp", raw.max_mcast_grp);
        dev_line(&mut out, "max_mcast_qp_attach", raw.max_mcast_qp_attach);
        dev_line(
            &mut out,
            "max_total_mcast_qp_attach",
            raw.max_total_mcast_qp_attach,
        );
        dev_line(&mut out, "max_ah", raw.max_ah);
        dev_line(&mut out, "max_fmr", raw.max_fmr);
        if raw.max_fmr != 0 {
            dev_line(&mut out, "max_map_per_fmr", raw.max_map_per_fmr);
        }
        dev_line(&mut out, "max_srq", raw.max_srq);
        if raw.max_srq != 0 {
            dev_line(&mut out, "max_srq_wr", raw.max_srq_wr);
            dev_line(&mut out, "max_srq_sge", raw.max_srq_sge);
        }
        dev_line(&mut out, "max_pkeys", raw.max_pkeys);
        dev_line(&mut out, "local_ca_ack_delay", raw.local_ca_ack_delay);
    }

    let gids = if verbose {
        ctx.gid_table()?
    } else {
        Vec::new()
    };
    for p in 1..=attr.phys_port_cnt() {
        if only_port.is_some_and(|o| o != p) {
            continue;
        }
        let port = PortNumber(p);
        let pa = ctx
            .query_port(port)
            .map_err(|e| format!("failed to query port {p} of {}: {e}", dev.name()))?;
        let r = pa.as_raw();
        field(&mut out, 2, "port:", 24, &p.to_string());
        let state = pa.state();
        port_line(
            &mut out,
            "state",
            format!("{} ({})", port_state_str(state), state.as_raw()),
        );
        port_line(
            &mut out,
            "max_mtu",
            format!("{} ({})", mtu_str(pa.max_mtu()), pa.max_mtu().as_raw()),
        );
        port_line(
            &mut out,
            "active_mtu",
            format!(
                "{} ({})",
                mtu_str(pa.active_mtu()),
                pa.active_mtu().as_raw()
            ),
        );
        port_line(&mut out, "sm_lid", pa.sm_lid());
        port_line(&mut out, "port_lid", pa.lid());
        port_line(&mut out, "port_lmc", format!("0x{:02x}", r.lmc));
        port_line(&mut out, "link_layer", link_layer_str(pa.link_layer()));
        if verbose {
            port_line(&mut out, "max_msg_sz", format!("{:#x}", pa.max_msg_size()));
            port_line(
                &mut out,
                "port_cap_flags",
                format!("0x{:08x}", pa.port_cap_flags()),
            );
            port_line(
                &mut out,
                "port_cap_flags2",
                format!("0x{:04x}", r.port_cap_flags2),
            );
            port_line(
                &mut out,
                "max_vl_num",
                format!("{} ({})", vl_str(r.max_vl_num), r.max_vl_num),
            );
            port_line(&mut out, "bad_pkey_cntr", format!("{:#x}", r.bad_pkey_cntr));
            port_line(
                &mut out,
                "qkey_viol_cntr",
                format!("{:#x}", r.qkey_viol_cntr),
            );
            port_line(&mut out, "sm_sl", r.sm_sl);
            port_line(&mut out, "pkey_tbl_len", pa.pkey_table_len());
            port_line(&mut out, "gid_tbl_len", pa.gid_table_len());
            port_line(&mut out, "subnet_timeout", r.subnet_timeout);
            port_line(&mut out, "init_type_reply", r.init_type_reply);
            port_line(
                &mut out,
                "active_width",
                format!("{}X ({})", width_str(pa.active_width()), pa.active_width()),
            );
            port_line(
                &mut out,
                "active_speed",
                format!("{} ({})", speed_str(pa.active_speed()), pa.active_speed()),
            );
            if transport(dev).1 == sys::IBV_TRANSPORT_IB {
                port_line(
                    &mut out,
                    "phys_state",
                    format!("{} ({})", phys_state_str(pa.phys_state()), pa.phys_state()),
                );
            }
            let ethernet = pa.link_layer() == LinkLayer::Ethernet;
            let mut mine: Vec<_> = gids.iter().filter(|e| e.port == port).collect();
            mine.sort_by_key(|e| e.index);
            for e in mine {
                gid_line(&mut out, e, ethernet);
            }
        }
        out.push('\n');
    }
    print!("{out}");
    Ok(())
}

fn run(cli: Cli) -> Result<()> {
    let list = rdma_verbs::devices().map_err(|e| format!("failed to get IB devices list: {e}"))?;
    if cli.list {
        let n = list.len();
        println!("{n} HCA{} found:", if n == 1 { "" } else { "s" });
        for d in list.iter() {
            println!("\t{}", d.name());
        }
        println!();
        return Ok(());
    }
    match &cli.device {
        Some(name) => {
            let dev = list
                .find(name)
                .ok_or_else(|| format!("IB device '{name}' wasn't found"))?;
            print_device(&dev, cli.port, cli.verbose)
        }
        None => {
            if list.is_empty() {
                return Err("No IB devices found".into());
            }
            let mut failed = 0;
            for dev in list.iter() {
                if let Err(e) = print_device(&dev, cli.port, cli.verbose) {
                    eprintln!("devinfo: {e}");
                    failed += 1;
                }
            }
            match failed {
                0 => Ok(()),
                n => Err(format!("{n} of {} devices could not be shown", list.len()).into()),
            }
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("devinfo: {e}");
            ExitCode::FAILURE
        }
    }
}
