//! Prints a device's asynchronous events as they arrive, like rdma-core's
//! `ibv_asyncwatch`.
//!
//! ```text
//! asyncwatch [-d DEV] [--count N] [--timeout SECS]
//! ```
//! Port events (`PORT_ACTIVE`, `PORT_ERR`, `GID_CHANGE`, …) reach every
//! process that has the device open; QP, CQ and SRQ events only the process
//! that owns the object. `--count` exits after N events, `--timeout` after
//! SECS seconds (status 0 either way); without them it runs until killed.

use std::os::fd::AsRawFd;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use rdma_verbs::{
    device::{AsyncElement, AsyncEvent, AsyncEventType},
    Context,
};

/// Watch a device's asynchronous events (ibv_asyncwatch).
#[derive(Parser, Debug)]
#[command(name = "asyncwatch")]
struct Cli {
    /// RDMA device (default: the first device found).
    #[arg(short = 'd', long = "ib-dev", value_name = "DEV")]
    device: Option<String>,
    /// Exit after this many events.
    #[arg(short = 'c', long = "count", value_name = "N")]
    count: Option<u64>,
    /// Exit after this many seconds.
    #[arg(short = 't', long = "timeout", value_name = "SECS")]
    timeout: Option<f64>,
}

type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

fn event_name(t: AsyncEventType) -> &'static str {
    use AsyncEventType::*;
    match t {
        CqErr => "IBV_EVENT_CQ_ERR",
        QpFatal => "IBV_EVENT_QP_FATAL",
        QpReqErr => "IBV_EVENT_QP_REQ_ERR",
        QpAccessErr => "IBV_EVENT_QP_ACCESS_ERR",
        CommEst => "IBV_EVENT_COMM_EST",
        SqDrained => "IBV_EVENT_SQ_DRAINED",
        PathMig => "IBV_EVENT_PATH_MIG",
        PathMigErr => "IBV_EVENT_PATH_MIG_ERR",
        DeviceFatal => "IBV_EVENT_DEVICE_FATAL",
        PortActive => "IBV_EVENT_PORT_ACTIVE",
        PortErr => "IBV_EVENT_PORT_ERR",
        LidChange => "IBV_EVENT_LID_CHANGE",
        PkeyChange => "IBV_EVENT_PKEY_CHANGE",
        SmChange => "IBV_EVENT_SM_CHANGE",
        SrqErr => "IBV_EVENT_SRQ_ERR",
        SrqLimitReached => "IBV_EVENT_SRQ_LIMIT_REACHED",
        QpLastWqeReached => "IBV_EVENT_QP_LAST_WQE_REACHED",
        ClientReregister => "IBV_EVENT_CLIENT_REREGISTER",
        GidChange => "IBV_EVENT_GID_CHANGE",
        WqFatal => "IBV_EVENT_WQ_FATAL",
        _ => "unknown event",
    }
}

/// One line per event: type name and number, then what it concerns.
fn describe(ev: &AsyncEvent) -> String {
    let t = ev.event_type();
    let mut line = format!("  event_type {} ({})", event_name(t), t.as_raw());
    match ev.element() {
        AsyncElement::Port(port) => line.push_str(&format!(", port {port}")),
        AsyncElement::Qp(qpn) => line.push_str(&format!(", QP number {qpn:#08x}")),
        AsyncElement::Wq(wqn) => line.push_str(&format!(", WQ number {wqn:#08x}")),
        AsyncElement::Cq(Some(id)) => line.push_str(&format!(", on CQ {id}")),
        AsyncElement::Cq(None) => line.push_str(", on a CQ"),
        AsyncElement::Srq(Some(id)) => line.push_str(&format!(", on SRQ {id}")),
        AsyncElement::Srq(None) => line.push_str(", on an SRQ"),
        _ => {}
    }
    line
}

fn open(name: Option<&str>) -> Result<Context> {
    let list = rdma_verbs::devices()?;
    let dev = match name {
        Some(n) => list
            .find(n)
            .ok_or_else(|| format!("IB device {n} not found"))?,
        None => list.get(0).ok_or("no RDMA device found")?,
    };
    Ok(dev.open()?)
}

fn run(cli: Cli) -> Result<()> {
    if let Some(t) = cli.timeout {
        if !(0.0..=1e9).contains(&t) {
            return Err("--timeout must be a non-negative number of seconds".into());
        }
    }
    let ctx = open(cli.device.as_deref())?;
    println!("{}: async event FD {}", ctx.name(), ctx.as_raw_fd());
    let deadline = cli
        .timeout
        .map(|t| Instant::now() + Duration::from_secs_f64(t));
    let mut seen = 0u64;
    loop {
        if cli.count.is_some_and(|c| seen >= c) {
            return Ok(());
        }
        // Wait for the async fd (bounded by the deadline), then read the
        // event: the blocking read then returns at once.
        let ms = match deadline {
            None => -1,
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Ok(());
                }
                left.as_millis().clamp(1, i32::MAX as u128) as i32
            }
        };
        match rdma_verbs_tools::wait_readable(ctx.as_raw_fd(), ms) {
            Ok(false) => continue,
            Ok(true) => {}
            Err(e) => return Err(format!("poll on the async event fd: {e}").into()),
        }
        // Acknowledged inside get_async_event: `ev` is plain data.
        let ev = ctx.get_async_event()?;
        println!("{}", describe(&ev));
        seen += 1;
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("asyncwatch: {e}");
            ExitCode::FAILURE
        }
    }
}
