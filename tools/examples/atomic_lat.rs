//! Atomic latency, like perftest's `ib_atomic_lat`.
//!
//! ```text
//! atomic_lat [-A CAS|FAA] [options]            # server: offers an 8-byte word
//! atomic_lat [-A CAS|FAA] [options] <host>     # client: operates on it
//! ```
//! The client posts one atomic at a time on the server's word and waits for
//! its completion; latency is the time between consecutive posts. Every
//! operation is checked: fetch-and-add adds 1, compare-and-swap replaces
//! `i` by `i + 1`, so the old value returned by operation `i` must be `i`,
//! and the server checks that the word ends at `-n`. The server prints the
//! client's results. Operations alternate between two 8-byte result
//! slots, and the old value of operation `i` is checked once operation
//! `i + 1` is posted: the check runs while the device works, not between a
//! completion and the next post, the window the latency measures (perftest
//! checks nothing there). For the same reason the compare-and-swap
//! operands of operation `i + 1` are set once `i` is posted.
//!
//! One operation per slot is prepared once
//! ([`PreparedSend`](rdma_verbs::qp::PreparedSend)) and posted again with its new
//! operands, as perftest reuses one `ibv_send_wr`; `--per-request` builds and posts a new
//! owned-buffer request each time (`SendQueue::compare_and_swap`,
//! `fetch_and_add`) instead, and `--raw` goes
//! through the library's `unsafe` raw path (`post_send_raw`, `poll_raw`),
//! a control measuring the safe layer's cost.

use std::process::ExitCode;
use std::sync::atomic::Ordering;

use clap::{Parser, ValueEnum};
use rdma_verbs::{
    cq::WorkCompletion, device::AtomicCap, qp::PreparedSend, sys, AccessFlags, LocalBuffer,
    RemoteMemory, SendRequest, Wr,
};

use rdma_verbs_tools::{perf, Done};

use perf::args::{self, CommonArgs, Config};
use perf::{report, stats, QpSpec, Resources, Result, Table, Test};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Op {
    /// Compare and swap.
    #[value(name = "CAS", alias = "cas")]
    Cas,
    /// Fetch and add.
    #[value(name = "FAA", alias = "faa")]
    Faa,
}

/// Atomic latency test (perftest's ib_atomic_lat).
#[derive(Parser, Debug)]
#[command(name = "atomic_lat")]
struct Cli {
    #[command(flatten)]
    common: CommonArgs,
    /// Atomic operation.
    #[arg(short = 'A', long = "atomic_type", value_enum, default_value = "FAA")]
    op: Op,
    /// Build and post a new owned-buffer request every iteration (SendQueue's
    /// compare_and_swap / fetch_and_add)
    /// instead of re-posting a prepared one
    #[arg(long, conflicts_with = "raw")]
    per_request: bool,
    /// Post and poll through the unsafe raw path (a control measuring the
    /// safe layer's cost); busy polling only
    #[arg(long)]
    raw: bool,
}

/// The `--raw` loop: the C tool's loop (one request, built once), written
/// against the raw verbs. Operation `i` writes its old value to
/// `slots[i % 2]`.
fn raw_loop(
    res: &Resources,
    cfg: &Config,
    op: Op,
    slots: &[LocalBuffer; 2],
    word: RemoteMemory,
    base: perf::Clock,
    stamps: &mut Vec<u64>,
) -> Result<()> {
    let mut sges = slots.each_ref().map(|slot| sys::ibv_sge {
        addr: slot.addr(),
        length: 8,
        lkey: slot.lkey(),
    });
    let sges = sges.as_mut_ptr();
    let mut wr = sys::ibv_send_wr {
        sg_list: sges,
        num_sge: 1,
        opcode: match op {
            Op::Cas => sys::IBV_WR_ATOMIC_CMP_AND_SWP,
            Op::Faa => sys::IBV_WR_ATOMIC_FETCH_AND_ADD,
        },
        send_flags: sys::ibv_send_flags::IBV_SEND_SIGNALED.0,
        ..Default::default()
    };
    wr.wr.atomic = sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_2 {
        remote_addr: word.addr,
        compare_add: 1,
        swap: 0,
        rkey: word.rkey.0,
    };
    // One request per slot, as the safe loop prepares one per slot; the
    // next operation's request is set while this one is in flight.
    let mut wrs = [wr, wr];
    wrs[1].sg_list = sges.wrapping_add(1);
    let set = |wr: &mut sys::ibv_send_wr, i: u64| {
        wr.wr_id = i;
        if op == Op::Cas {
            wr.wr.atomic.compare_add = i;
            wr.wr.atomic.swap = i + 1;
        }
    };
    set(&mut wrs[0], 0);
    let mut wc = [WorkCompletion::default(); 1];
    for i in 0..cfg.iters {
        let wr = &mut wrs[slot_of(i)];
        stamps.push(base.stamp());
        // The check below reads the other slot, never this one.
        // SAFETY: `sg_list`'s slot is registered (its lkey), 8-byte aligned,
        // caller-owned and unread until its completion is polled below;
        // `wr_id` has bit 63 clear; one NULL-terminated request.
        unsafe { res.qp.post_send_raw(wr) }.map_err(|e| format!("posting atomic {i}: {e}"))?;
        // Operation i - 1 completed: its request is free for i + 1.
        set(&mut wrs[slot_of(i + 1)], i + 1);
        if let Some(prev) = i.checked_sub(1) {
            check_old(prev, &slots[slot_of(prev)])?;
        }
        // SAFETY: in --raw mode only raw requests are posted to `res.qp`,
        // the only queue pair reporting to `res.cq`.
        unsafe { perf::wait_raw(&res.cq, &mut wc, cfg.timeout, || format!("atomic {i}")) }?;
    }
    match cfg.iters.checked_sub(1) {
        Some(last) => check_old(last, &slots[slot_of(last)]),
        None => Ok(()),
    }
}

/// The result slot (0 or 1) of operation `i`.
fn slot_of(i: u64) -> usize {
    (i % 2) as usize
}

/// Checks the old value prepared operation `i` returned (its completion
/// polled).
fn check_prepared(op: &PreparedSend, i: u64) -> Result<()> {
    check_old(i, op.bytes(0).ok_or("the result buffer is still posted")?)
}

/// Checks the old value atomic operation `i` returned.
fn check_old(i: u64, result: &[u8]) -> Result<()> {
    let old = u64::from_ne_bytes(result[..8].try_into().map_err(|_| "result size")?);
    // Devices return the old value in host order; accept big-endian too.
    if old != i && old.swap_bytes() != i {
        return Err(format!(
            "atomic operation {i} returned old value {old}, expected {i} (did someone \
             else touch the word?)"
        )
        .into());
    }
    Ok(())
}

fn run(cli: Cli) -> Result<()> {
    let mut cfg = Config::new(&cli.common, None, args::ATOMIC)?;
    if cli.raw && cfg.events {
        return Err("--raw polls the CQ; it cannot be combined with -e".into());
    }
    cfg.inline = 0;
    let test = match cli.op {
        Op::Cas => Test::AtomicCas,
        Op::Faa => Test::AtomicFaa,
    };
    let spec = QpSpec {
        send_wr: cfg.tx_depth,
        recv_wr: 1,
    };
    let mut res = Resources::open(&cfg, spec)?;
    if res.dev_attr.atomic_cap() == AtomicCap::None {
        return Err(format!("{} does not support atomic operations", res.ctx.name()).into());
    }

    if cfg.is_server() {
        let rights = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_ATOMIC;
        let word = res.pd.alloc_shared(8, rights)?;
        word.atomic_u64(0)?.store(0, Ordering::SeqCst);
        let (mut peer, local, remote) =
            perf::handshake(&cfg, &mut res, test, word.remote(), rights, true)?;
        report::banner(test, &cfg, &res, &local, &remote, &[]);
        perf::serve_passive(&cfg, &mut peer, Table::Lat)?;
        // The client reported after its last completion: every operation
        // has been applied.
        let value = word.atomic_u64(0)?.load(Ordering::SeqCst);
        if value != cfg.iters && value.swap_bytes() != cfg.iters {
            return Err(format!(
                "the target word ends at {value}, expected {} after {} operations",
                cfg.iters, cfg.iters
            )
            .into());
        }
        println!(
            " target word: {value} after {} operations (correct)",
            cfg.iters
        );
        return Ok(());
    }

    let (a, b) = res.pd.alloc(16, AccessFlags::LOCAL_WRITE)?.split_at(8);
    let slots = [a, b];
    let (mut peer, local, remote) =
        perf::handshake(&cfg, &mut res, test, None, AccessFlags::LOCAL_WRITE, true)?;
    let word = perf::check_remote(&remote, 8, 8)?
        .slice(0, 8)
        .ok_or("remote word")?;
    report::banner(
        test,
        &cfg,
        &res,
        &local,
        &remote,
        &[("Atomic cap", format!("{:?}", res.dev_attr.atomic_cap()))],
    );
    report::lat_header();

    // The send queue's posting handle (the queue pair is connected); the
    // raw loop posts around it.
    let mut sq = res.qp.send_queue()?;
    let mut done = Done::with_capacity(4);
    let mut stamps: Vec<u64> = Vec::with_capacity(cfg.iters as usize);
    let mut samples: Vec<f64> = Vec::with_capacity(cfg.iters as usize);
    let size = 8;
    let request = |buf, i: u64| match cli.op {
        Op::Cas => SendRequest::compare_and_swap(buf, word, i, i + 1),
        Op::Faa => SendRequest::fetch_and_add(buf, word, 1),
    };
    peer.barrier(cfg.timeout)?;
    let base = perf::Clock::start();
    if cli.raw {
        raw_loop(&res, &cfg, cli.op, &slots, word, base, &mut stamps)?;
    } else if cli.per_request {
        // Operation `i` owns slot `i % 2` until its completion gives it
        // back; the other slot is checked while `i` is in flight.
        let mut slots = slots.map(Some);
        for i in 0..cfg.iters {
            let buf = slots[slot_of(i)].take().ok_or("result slot lost")?;
            stamps.push(base.stamp());
            let posted = match cli.op {
                Op::Cas => sq.compare_and_swap(buf, word, i, i + 1, Wr::id(i)),
                Op::Faa => sq.fetch_and_add(buf, word, 1, Wr::id(i)),
            };
            posted.map_err(|e| format!("posting atomic {i}: {}", e.error))?;
            if let Some(prev) = i.checked_sub(1) {
                check_old(prev, slots[slot_of(prev)].as_deref().ok_or("slot lost")?)?;
            }
            slots[slot_of(i)] = Some(perf::wait_local(
                &mut res.waiter,
                &mut done,
                "an atomic operation",
            )?);
        }
        if let Some(last) = cfg.iters.checked_sub(1) {
            check_old(last, slots[slot_of(last)].as_deref().ok_or("slot lost")?)?;
        }
    } else {
        // One prepared request per slot, posted alternately (perftest
        // re-posts one `ibv_send_wr`).
        let [a, b] = slots;
        let mut prepare = |buf| {
            sq.prepare(request(buf, 0))
                .map_err(|e| format!("preparing the atomic operation: {}", e.error))
        };
        let mut ops = [prepare(a)?, prepare(b)?];
        // The operands of operation i + 1 are set while i is in flight
        // (the request posted before it completed: the provider copied it).
        let set = |op: &mut PreparedSend, i: u64| match cli.op {
            Op::Cas => op.set_compare_swap(i, i + 1),
            Op::Faa => Ok(()),
        };
        set(&mut ops[0], 0)?;
        let mut wc = WorkCompletion::default();
        for i in 0..cfg.iters {
            stamps.push(base.stamp());
            sq.post_prepared(&mut ops[slot_of(i)])
                .map_err(|e| format!("posting atomic {i}: {e}"))?;
            set(&mut ops[slot_of(i + 1)], i + 1)?;
            if let Some(prev) = i.checked_sub(1) {
                check_prepared(&ops[slot_of(prev)], prev)?;
            }
            res.waiter
                .wait_wc(&mut done, &mut wc, "an atomic operation")?;
        }
        if let Some(last) = cfg.iters.checked_sub(1) {
            check_prepared(&ops[slot_of(last)], last)?;
        }
    }
    base.convert(&mut stamps);
    stats::deltas_us(&stamps, 1.0, &mut samples);
    let summary = stats::summarize(&mut samples).ok_or("no samples")?;
    report::lat_row(size, cfg.iters, &summary);
    peer.send_report(&perf::net::Report {
        size,
        iters: cfg.iters,
        values: report::lat_values(&summary),
    })?;
    println!("{}", report::LINE);
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    perf::main_with("atomic_lat", || run(cli))
}
