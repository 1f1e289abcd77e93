//! `fault_peer`: the peer program of `cargo xtask faults` (see
//! `rdma_verbs_tools::fault` for what it does and the line it ends with).

use clap::{Parser, Subcommand};
use rdma_verbs_tools::fault::{client, cq_overrun, server, Common, Op};

#[derive(Parser)]
#[command(about = "Data mover for RDMA fault-injection scenarios")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Wait for a client; receive (send op), expose memory (write/read).
    Server {
        #[command(flatten)]
        c: Common,
        /// Do not post receives for this long after connecting (RNR).
        #[arg(long, default_value_t = 0)]
        recv_delay_ms: u64,
    },
    /// Connect to a server and move the data.
    Client {
        host: String,
        #[command(flatten)]
        c: Common,
        #[arg(long, value_enum, default_value_t = Op::Send)]
        op: Op,
        #[arg(long, default_value_t = 65536)]
        msg_size: usize,
        #[arg(long, default_value_t = 64 << 20)]
        total: u64,
        /// Requests in flight.
        #[arg(long, default_value_t = 16)]
        window: usize,
        /// Progress watchdog: with requests outstanding and no completion
        /// for this many seconds, move the QP to ERR (its requests then
        /// flush with typed errors). 0 = off.
        #[arg(long, default_value_t = 0.0)]
        stall_timeout: f64,
    },
    /// Try to overrun a small CQ on one host: the library refuses the
    /// queue pair (`CqTooSmall`); a device that got that far would raise
    /// the CQ error event.
    CqOverrun {
        #[arg(short = 'd', long)]
        device: Option<String>,
    },
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Server { c, recv_delay_ms } => server(c, recv_delay_ms),
        Cmd::Client {
            host,
            c,
            op,
            msg_size,
            total,
            window,
            stall_timeout,
        } => client(
            host,
            c,
            op,
            msg_size,
            total,
            window.clamp(1, 512),
            stall_timeout,
        ),
        Cmd::CqOverrun { device } => cq_overrun(device),
    };
    match r {
        Ok(st) => {
            st.print();
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("fault_peer: {e}");
            println!("RESULT status=failed reason={}", e.replace(' ', "_"));
            std::process::ExitCode::from(2)
        }
    }
}
