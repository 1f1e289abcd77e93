//! perftest-style output: the banner with both sides' addresses and the
//! result tables.

use super::args::Config;
use super::net::ConnInfo;
use super::stats::{BwSummary, LatencySummary};
use super::{Resources, Test};

/// The dashed separator line.
pub const LINE: &str =
    "---------------------------------------------------------------------------------------";

/// Header of the latency table.
pub const LAT_HEADER: &str = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec]";

/// Header of the bandwidth table.
pub const BW_HEADER: &str =
    " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]";

fn address(label: &str, c: &ConnInfo) {
    if c.mem.len > 0 {
        println!(
            " {label} address: LID {:#06x} QPN {:#06x} PSN {:#08x} RKey {:#08x} VAddr {:#016x}",
            c.ep.lid, c.ep.qp_num.0, c.ep.psn, c.mem.rkey.0, c.mem.addr
        );
    } else {
        println!(
            " {label} address: LID {:#06x} QPN {:#06x} PSN {:#08x}",
            c.ep.lid, c.ep.qp_num.0, c.ep.psn
        );
    }
    println!(" GID: {}", c.ep.gid);
}

/// Prints the banner: test, device, settings, both addresses. `extra` adds
/// tool-specific ` key : value` lines.
pub fn banner(
    test: Test,
    cfg: &Config,
    res: &Resources,
    local: &ConnInfo,
    remote: &ConnInfo,
    extra: &[(&str, String)],
) {
    println!("{LINE}");
    println!("                    {}", test.title());
    println!(
        " Device          : {:<16} Port           : {}",
        res.ctx.name(),
        res.port
    );
    println!(
        " Connection type : RC               Role           : {}",
        if cfg.is_server() { "server" } else { "client" }
    );
    println!(" TX depth        : {}", cfg.tx_depth);
    for (k, v) in extra {
        println!(" {k:<15} : {v}");
    }
    println!(" Mtu             : {}[B]", res.mtu.bytes());
    println!(" Link type       : {:?}", res.port_attr.link_layer());
    println!(" GID index       : {}", res.gid_index.0);
    println!(" Max inline data : {}[B]", cfg.inline);
    println!(
        " Completions     : {}",
        if cfg.events { "events" } else { "polling" }
    );
    println!(" Data ex. method : TCP port {}", cfg.tcp_port);
    println!("{LINE}");
    address("local", local);
    address("remote", remote);
    println!("{LINE}");
}

/// The latency table header.
pub fn lat_header() {
    println!("{LAT_HEADER}");
}

/// One latency row.
pub fn lat_row(size: u64, iters: u64, s: &LatencySummary) {
    println!("{}", lat_line(size, iters, s));
}

/// One latency row as text (columns right-aligned under the header).
pub fn lat_line(size: u64, iters: u64, s: &LatencySummary) -> String {
    format!(
        " {size:<6} {iters:>11} {:>14.2} {:>14.2} {:>16.2} {:>14.2} {:>16.2} {:>22.2} {:>24.2}",
        s.min, s.max, s.median, s.avg, s.stdev, s.p99, s.p999
    )
}

/// The bandwidth table header.
pub fn bw_header() {
    println!("{BW_HEADER}");
}

/// One bandwidth row.
pub fn bw_row(size: u64, iters: u64, b: &BwSummary) {
    println!("{}", bw_line(size, iters, b));
}

/// One bandwidth row as text.
pub fn bw_line(size: u64, iters: u64, b: &BwSummary) -> String {
    format!(
        " {size:<10} {iters:>15} {:>18.2} {:>21.2} {:>15.6}",
        b.peak_mbps, b.avg_mbps, b.msg_rate_mpps
    )
}

/// A latency summary as the seven figures of a [`super::net::Report`].
pub fn lat_values(s: &LatencySummary) -> [f64; 7] {
    [s.min, s.max, s.median, s.avg, s.stdev, s.p99, s.p999]
}

/// The inverse of [`lat_values`].
pub fn lat_from(v: &[f64; 7]) -> LatencySummary {
    LatencySummary {
        min: v[0],
        max: v[1],
        median: v[2],
        avg: v[3],
        stdev: v[4],
        p99: v[5],
        p999: v[6],
    }
}

/// A bandwidth summary as figures of a [`super::net::Report`].
pub fn bw_values(b: &BwSummary) -> [f64; 7] {
    [b.peak_mbps, b.avg_mbps, b.msg_rate_mpps, 0.0, 0.0, 0.0, 0.0]
}

/// The inverse of [`bw_values`].
pub fn bw_from(v: &[f64; 7]) -> BwSummary {
    BwSummary {
        peak_mbps: v[0],
        avg_mbps: v[1],
        msg_rate_mpps: v[2],
    }
}
