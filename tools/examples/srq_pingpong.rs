//! Ping-pong over several RC queue pairs sharing one receive queue (SRQ):
//! rdma-core's `ibv_srq_pingpong`, written with the safe API, and compatible
//! with it.
//!
//! ```text
//! cargo run --example srq_pingpong -- [options]          # server
//! cargo run --example srq_pingpong -- [options] HOST     # client
//! ```
//! Same options, TCP exchange (always 256 addresses each way, the C tool's
//! `MAX_QP`, unused ones zero), queue pair attributes and output as the C
//! tool, so either side can be `ibv_srq_pingpong`. Give both sides the same
//! `-q`. As in the C tool, `-n` counts exchanges over all queue pairs.

use clap::Parser;

use rdma_verbs_tools::pingpong;

/// Ping-pong over RC queue pairs sharing a receive queue: without HOST, start a server and wait
/// for a connection; with HOST, connect to the server there. Works with rdma-core's
/// ibv_srq_pingpong on either side.
#[derive(Parser, Debug)]
#[command(name = "srq_pingpong")]
struct Args {
    #[command(flatten)]
    common: pingpong::Common,

    /// Size of message to exchange
    #[arg(short = 's', long = "size", value_name = "SIZE", default_value = "4096",
          value_parser = pingpong::parse_positive, display_order = 4)]
    size: u32,

    /// Path MTU
    #[arg(short = 'm', long = "mtu", value_name = "SIZE", default_value = "1024",
          value_parser = pingpong::parse_mtu, display_order = 5)]
    mtu: u32,

    /// Number of QPs to use (1 to 255; both sides must agree)
    #[arg(short = 'q', long = "num-qp", value_name = "NUM", default_value = "16",
          value_parser = pingpong::parse_num_qp, display_order = 6)]
    num_qp: u32,
}

fn main() -> std::process::ExitCode {
    let a = Args::parse();
    pingpong::main(
        "srq_pingpong",
        pingpong::Config {
            transport: pingpong::Transport::Srq,
            common: a.common,
            size: a.size,
            mtu: a.mtu,
            num_qp: a.num_qp,
        },
    )
}
