//! Ping-pong over an unreliable datagram (UD) queue pair: rdma-core's
//! `ibv_ud_pingpong`, written with the safe API, and compatible with it.
//!
//! ```text
//! cargo run --example ud_pingpong -- [options]          # server
//! cargo run --example ud_pingpong -- [options] HOST     # client
//! ```
//! Same options, TCP exchange, Q_Key (0x11111111), buffer layout (40 bytes
//! for the GRH in front of every receive) and output as the C tool, so
//! either side can be `ibv_ud_pingpong`. A message must fit in the port's
//! active MTU.

use clap::Parser;

use rdma_verbs_tools::pingpong;

/// Ping-pong over UD: without HOST, start a server and wait for a connection; with HOST,
/// connect to the server there. Works with rdma-core's ibv_ud_pingpong on either side.
#[derive(Parser, Debug)]
#[command(name = "ud_pingpong")]
struct Args {
    #[command(flatten)]
    common: pingpong::Common,

    /// Size of message to exchange (at most the port's active MTU)
    #[arg(short = 's', long = "size", value_name = "SIZE", default_value = "1024",
          value_parser = pingpong::parse_positive, display_order = 4)]
    size: u32,
}

fn main() -> std::process::ExitCode {
    let a = Args::parse();
    pingpong::main(
        "ud_pingpong",
        pingpong::Config {
            transport: pingpong::Transport::Ud,
            common: a.common,
            size: a.size,
            mtu: 1024,
            num_qp: 1,
        },
    )
}
