//! Ping-pong over an unreliable connected (UC) queue pair: rdma-core's
//! `ibv_uc_pingpong`, written with the safe API, and compatible with it.
//!
//! ```text
//! cargo run --example uc_pingpong -- [options]          # server
//! cargo run --example uc_pingpong -- [options] HOST     # client
//! ```
//! Same options, TCP exchange, queue pair attributes and output as the C
//! tool, so either side can be `ibv_uc_pingpong`. See `--help` and
//! `src/pingpong.rs` for the few differences (default port: the
//! first ACTIVE one; bounded waits everywhere).

use clap::Parser;

use rdma_verbs_tools::pingpong;

/// Ping-pong over UC: without HOST, start a server and wait for a connection; with HOST,
/// connect to the server there. Works with rdma-core's ibv_uc_pingpong on either side.
#[derive(Parser, Debug)]
#[command(name = "uc_pingpong")]
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
}

fn main() -> std::process::ExitCode {
    let a = Args::parse();
    pingpong::main(
        "uc_pingpong",
        pingpong::Config {
            transport: pingpong::Transport::Uc,
            common: a.common,
            size: a.size,
            mtu: a.mtu,
            num_qp: 1,
        },
    )
}
