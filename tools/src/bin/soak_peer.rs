//! `soak_peer`: the peer program of `cargo xtask soak` (see
//! `rdma_verbs_tools::soak` for what it does and the lines it prints).

use clap::{Parser, Subcommand};
use rdma_verbs_tools::soak::{client, server, ClientArgs, Common};

#[derive(Parser)]
#[command(about = "Long-running randomized RDMA traffic with every byte checked")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Accept sessions one after another until killed.
    Server {
        #[command(flatten)]
        c: Common,
    },
    /// Run sessions against a server for `--seconds`.
    Client(ClientArgs),
}

fn main() -> std::process::ExitCode {
    let r = match Cli::parse().cmd {
        Cmd::Server { c } => server(c),
        Cmd::Client(a) => client(a),
    };
    match r {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("soak_peer: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
