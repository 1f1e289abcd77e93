//! The scenarios of `cargo xtask faults`: what each row does and expects.

use super::{FaultsOptions, Peer};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Expect {
    /// Every byte arrives exactly once, in order, verified.
    Delivered,
    /// The client sees one of these error statuses, then every request flushed back.
    ClientError(&'static [&'static str]),
    /// The local run reports this status (`event:<async event>`, or
    /// `refused:<error>` for a setup the library refuses).
    Local(&'static str),
    /// Every process of a workload row exits 0 with a final line
    /// containing `VERIFIED` (its own check of every byte).
    Verified,
    /// Every process of a workload row exits 0 with a final line
    /// containing this (a tool whose output follows a C tool's, such as
    /// `mckey`'s `return status 0`).
    LastLine(&'static str),
}

impl Expect {
    pub(super) fn describe(self) -> String {
        match self {
            Expect::Delivered => "all data, in order, verified".into(),
            Expect::ClientError(s) => format!("{} + flush, all buffers back", s.join("|")),
            Expect::Local(e) => e.replace(':', " "),
            Expect::Verified => "every process VERIFIED, exit 0".into(),
            Expect::LastLine(l) => format!("every process `{l}`, exit 0"),
        }
    }

    /// What a workload process's last line must contain.
    pub(super) fn proof(self) -> Option<&'static str> {
        match self {
            Expect::Verified => Some("VERIFIED"),
            Expect::LastLine(l) => Some(l),
            _ => None,
        }
    }
}

/// One program of a workload row: an example run on one VM.
#[derive(Clone, Debug)]
pub(super) struct Proc {
    /// The VM it runs on (0 or 1).
    pub(super) role: usize,
    /// Its name in the row; its output goes to `{row}.{label}.out`.
    pub(super) label: String,
    /// The example (`target/release/examples/<program>`), or a tool of
    /// the guest's when it is an absolute path.
    pub(super) program: &'static str,
    /// Seconds to wait before starting it (a multicast sender after its
    /// receivers have joined).
    pub(super) after: u32,
    /// Its arguments: `{vm0}`/`{vm1}` stand for that VM's eth1 address,
    /// `{port}` for the row's first TCP port.
    pub(super) args: String,
}

impl Proc {
    /// Its output file in row `i` (a shell word: the label's spaces become `_`).
    pub(super) fn out_file(&self, i: usize) -> String {
        format!("{i}.{}.out", self.label.replace(' ', "_"))
    }
}

#[derive(Clone)]
pub(super) struct Scenario {
    pub(super) name: String,
    pub(super) netem: Option<String>,
    pub(super) server_args: String,
    pub(super) client_args: String,
    /// Seconds after which vm0 kills the server with SIGKILL.
    pub(super) kill_server_after: Option<f64>,
    /// (after, for): vm1's link loses carrier after `after` s for `for` s
    /// (the host pulls the virtual cable with QEMU's `set_link`; rxe1's
    /// port goes DOWN, eth1 stays configured).
    pub(super) link_down: Option<(f64, f64)>,
    /// (after, for): vm1 runs `ip link set eth1 down` after `after` s for
    /// `for` s (an administrator taking the interface down).
    pub(super) if_down: Option<(f64, f64)>,
    /// (after, for): vm1 drops every packet on eth1 (netem loss 100 %)
    /// after `after` s for `for` s: a path outage with the port still up.
    pub(super) blackhole: Option<(f64, f64)>,
    /// Runs `fault_peer cq-overrun` on vm0 only.
    pub(super) local: bool,
    /// The example programs of a workload row (empty for `fault_peer` rows).
    pub(super) procs: Vec<Proc>,
    pub(super) expect: Expect,
    /// Upper bound for the client's stall (last success → first error), s.
    pub(super) stall_bound: Option<f64>,
    /// Both sides run `fault_peer`'s C twin instead (`--peer c|both`).
    pub(super) c_twin: bool,
}

impl Scenario {
    fn transfer(name: &str, op: &str, mib: u64, netem: Option<&str>) -> Scenario {
        Scenario {
            name: name.into(),
            netem: netem.map(str::to_string),
            server_args: String::new(),
            client_args: format!("--op {op} --total {}", mib << 20),
            kill_server_after: None,
            link_down: None,
            if_down: None,
            blackhole: None,
            local: false,
            procs: Vec::new(),
            expect: Expect::Delivered,
            stall_bound: None,
            c_twin: false,
        }
    }
}

impl Scenario {
    /// A workload row: the examples of issue #21 across the two VMs, each
    /// process checking every byte itself (`Expect::Verified`).
    pub(super) fn workload(name: &str, netem: Option<&str>, procs: Vec<Proc>) -> Scenario {
        Scenario {
            procs,
            expect: Expect::Verified,
            ..Scenario::transfer(name, "send", 0, netem)
        }
    }
}

/// The two workloads of issue #21 over the link, on RoCE v2 (`rxe1`, the
/// port's default GID: its IPv4 RoCE v2 one, as `fault_peer` uses; never a
/// fixed index). Block store: the server on vm0, both clients on vm1, so
/// every client's traffic crosses the link (and a fault on it). All-reduce:
/// ranks 0 and 2 on vm0, rank 1 on vm1, so two of the ring's three edges
/// cross the link. Then the block store once more under 1 % loss (both
/// VMs' eth1) when the profile is full.
fn workloads(quick: bool) -> Vec<Scenario> {
    let proc = |role: usize, label: &str, program: &'static str, args: String| Proc {
        role,
        label: label.into(),
        program,
        after: 0,
        args,
    };
    let blockstore = |args: &str| {
        let common = format!("-d rxe1 -p {{port}} --blocks {BLOCKS}");
        let client = format!("{common} -q 16 -n {OPS} {args}");
        vec![
            proc(
                0,
                "server",
                "blockstore",
                format!("server {common} --clients 2"),
            ),
            proc(
                1,
                "client A",
                "blockstore",
                format!("client {{vm0}} {client}"),
            ),
            proc(
                1,
                "client B",
                "blockstore",
                format!("client {{vm0}} {client}"),
            ),
        ]
    };
    const BLOCKS: u32 = 1024;
    const OPS: u32 = 2000;
    let allreduce = || {
        (0..3)
            .map(|r| {
                proc(
                    if r == 1 { 1 } else { 0 },
                    &format!("rank {r}"),
                    "allreduce",
                    format!(
                        "--rank {r} --ranks 3 --hosts {{vm0}},{{vm1}},{{vm0}} -d rxe1 -p {{port}} \
                         -s {FLOATS} -n 10"
                    ),
                )
            })
            .collect()
    };
    const FLOATS: u32 = 1 << 16;
    let mut v = vec![
        Scenario::workload(
            "blockstore / 2 clients",
            None,
            blockstore("--write-ratio 0.5"),
        ),
        Scenario::workload("allreduce / 3 ranks", None, allreduce()),
        // Under a fault: every write of the ring (~85 packets) and every
        // block request crosses a lossy link; rxe retransmits, the bytes
        // must still verify.
        Scenario::workload("loss 1% / allreduce", Some("loss 1%"), allreduce()),
    ];
    v.extend(multicast());
    if !quick {
        v.push(Scenario::workload(
            "loss 1% / blockstore",
            Some("loss 1%"),
            blockstore("--write-ratio 0.5"),
        ));
    }
    v
}

/// UD multicast across the link (issue #22): `mckey` senders on vm0,
/// receivers on vm1, joined through rdma_cm on rxe1 with each VM's eth1
/// address. Ours to ours (one receiving process with two queue pairs in
/// the group, each checking every byte with `-V`), then ours against
/// rdma-core's C `mckey` both ways, and C to C as the control. A sender
/// starts 2 s after the receivers (it sends 3 s after its own join, as
/// mckey), so the receivers are in the group before the first datagram. The C sender
/// posts unsignaled sends and destroys its queue pairs without waiting,
/// so rxe may drop its last ones: it sends 40 per id for the receiver's
/// 10 (as device-tests/tests/multicast.rs).
fn multicast() -> Vec<Scenario> {
    const C_MCKEY: &str = "/usr/bin/mckey";
    // (label, program, arguments beyond the group and the bind address)
    type Side = (&'static str, &'static str, &'static str);
    let row = |name: &str, group: &str, recv: Side, send: Side| {
        let mckey = |role: usize, (label, program, extra): Side| Proc {
            role,
            label: label.into(),
            program,
            after: if role == 0 { 2 } else { 0 },
            args: format!("-m {group} -b {{vm{role}}} {extra}"),
        };
        Scenario {
            expect: Expect::LastLine("return status 0"),
            ..Scenario::workload(name, None, vec![mckey(1, recv), mckey(0, send)])
        }
    };
    vec![
        row(
            "multicast / 2 receivers",
            "239.2.0.1",
            ("receiver", "mckey", "-c 2 -C 20 -S 1024 -V"),
            ("sender", "mckey", "-s -C 20 -S 1024"),
        ),
        row(
            "multicast / C receiver",
            "239.2.0.2",
            ("C receiver", C_MCKEY, "-C 10"),
            ("sender", "mckey", "-s -C 10"),
        ),
        row(
            "multicast / C sender",
            "239.2.0.3",
            ("receiver", "mckey", "-C 10"),
            ("C sender", C_MCKEY, "-s -C 40"),
        ),
        // The control of the row above: rdma-core on both sides, so a
        // failure of that row can be told ours or the kernel's.
        row(
            "multicast / C to C",
            "239.2.0.4",
            ("C receiver", C_MCKEY, "-C 10"),
            ("C sender", C_MCKEY, "-s -C 40"),
        ),
    ]
}

/// The budget implied by the QP's timeout/retry settings: each try waits
/// 4.096 µs · 2^timeout, and there are retry_cnt + 1 tries.
pub(super) fn retry_budget(timeout: u32, retry_cnt: u32) -> f64 {
    4.096e-6 * f64::from(1u32 << timeout) * f64::from(retry_cnt + 1)
}

pub(super) fn scenarios(o: &FaultsOptions) -> Vec<Scenario> {
    let mib = o.total_mib;
    let mut v = Vec::new();
    let losses: &[&str] = if o.quick {
        &["2%"]
    } else {
        &["1%", "2%", "5%"]
    };
    for loss in losses {
        for op in ["send", "write", "read"] {
            v.push(Scenario::transfer(
                &format!("loss {loss} / {op}"),
                op,
                mib,
                Some(&format!("loss {loss}")),
            ));
        }
    }
    let shapes: &[(&str, &str)] = if o.quick {
        &[("reorder", "delay 2ms reorder 25% 50%")]
    } else {
        &[
            ("reorder", "delay 2ms reorder 25% 50%"),
            // A link is a FIFO: its delay varies, its order does not.
            // netem reorders jittered packets unless a rate is set (each
            // packet then leaves after the one before it); reordering has
            // its own row above.
            ("delay+jitter", "delay 3ms 2ms rate 1gbit"),
            ("duplicate", "duplicate 3%"),
        ]
    };
    for (label, netem) in shapes {
        for op in ["send", "write", "read"] {
            v.push(Scenario::transfer(
                &format!("{label} / {op}"),
                op,
                mib,
                Some(netem),
            ));
        }
    }
    // The failure scenarios move single-packet messages (1 KiB, the path
    // MTU): rxe in Linux 6.12 mishandles retransmitted multi-packet
    // messages under heavy emulation stalls (responder LOC_QP_OP_ERR),
    // which would mask the behaviour under test. ACK timeout 16 (268 ms)
    // with 6 retries: a budget of ~1.9 s. (rxe treats retry_cnt 7 as
    // "retry forever", like rnr_retry 7; IBA does not.)
    let small = " --msg-size 1024 --window 64 --timeout 16 --retry-cnt 6";
    let budget = retry_budget(16, 6);
    // Outages meant to be ridden out get ACK timeout 17 (537 ms): a budget
    // of ~3.8 s, well clear of the 0.5 s outage. rxe does not restart its
    // retry timer on every ACK (see rxe_comp.c: "some timeouts are
    // spurious"), so its effective budget is shorter than IBA's; with the
    // 1.9 s budget a 0.5 s path outage once ended in RETRY_EXC_ERR.
    let ride_out = " --msg-size 1024 --window 64 --timeout 17 --retry-cnt 6";
    // Peer killed mid-transfer.
    let mut kill = Scenario::transfer("peer killed / send", "send", 1024, None);
    kill.client_args.push_str(small);
    kill.client_args.push_str(" --deadline 120");
    kill.kill_server_after = Some(5.0);
    // The peer's QP vanishes: silence, so the retries run out. Or its
    // kernel still answers while it tears the dead process's QP down: a
    // NAK (remote operational error) ends the transfer at once. Both are
    // typed; seen on 6.1's rxe, once each way in consecutive runs.
    kill.expect = Expect::ClientError(&["RetryExcErr", "RemOpErr"]);
    kill.stall_bound = Some(4.0 * budget + 2.0);
    v.push(kill);
    // Path outage (every packet dropped, port up) shorter than the budget …
    let mut short = Scenario::transfer("path outage 0.5 s / send", "send", mib.max(32), None);
    short.client_args.push_str(ride_out);
    short.blackhole = Some((1.5, 0.5));
    v.push(short);
    // … and longer than it.
    let mut long = Scenario::transfer("path outage 12 s / send", "send", 1024, None);
    long.client_args.push_str(small);
    long.client_args.push_str(" --deadline 120");
    long.blackhole = Some((1.5, 12.0));
    long.expect = Expect::ClientError(&["RetryExcErr"]);
    long.stall_bound = Some(4.0 * budget + 2.0);
    v.push(long);
    // Link down (carrier lost, port DOWN) shorter and longer than the
    // budget: a pulled cable. Packets sent meanwhile are lost, so the
    // transport's retries decide, as for the path outage.
    let mut down_short = Scenario::transfer("link down 0.5 s / send", "send", mib.max(32), None);
    down_short.client_args.push_str(ride_out);
    down_short.link_down = Some((1.5, 0.5));
    v.push(down_short);
    let mut down_long = Scenario::transfer("link down 12 s / send", "send", 1024, None);
    down_long.client_args.push_str(small);
    down_long.client_args.push_str(" --deadline 120");
    down_long.link_down = Some((1.5, 12.0));
    down_long.expect = Expect::ClientError(&["RetryExcErr"]);
    // rxe takes longer to give up here than on the path outage (7.1 and
    // 9.5 s in our runs against 2.0 s; not root-caused — sends queue behind
    // the stopped transmit queue until the kernel's link watch drops them,
    // and rxe re-arms its retry timer only when a packet leaves). The
    // bound is the outage itself: typed errors while the link is still
    // down, never a hang until it returns.
    down_long.stall_bound = Some(12.0);
    v.push(down_long);
    // The interface taken down by an administrator (`ip link set down`):
    // rxe cannot route, fails the send it is transmitting as LOC_QP_OP_ERR
    // (6.1) or flushes the QP (6.12), or sometimes neither retries nor
    // fails (the send never left, so no retransmit timer runs). The
    // client's progress watchdog then moves the QP to ERR, as an
    // application would, and the requests flush with typed errors; the row
    // says when that happened.
    let mut ifdown = Scenario::transfer("interface down 12 s / send", "send", 1024, None);
    ifdown.client_args.push_str(small);
    ifdown.client_args.push_str(" --deadline 120");
    ifdown
        .client_args
        .push_str(&format!(" --stall-timeout {:.1}", 2.0 * budget + 1.0));
    ifdown.if_down = Some((1.5, 12.0));
    ifdown.expect = Expect::ClientError(&["RetryExcErr", "WrFlushErr", "LocQpOpErr"]);
    ifdown.stall_bound = Some(4.0 * budget + 2.0);
    v.push(ifdown);
    // Receiver late with its receives: infinite RNR retry recovers …
    let mut rnr_ok = Scenario::transfer("RNR, rnr_retry 7 (infinite)", "send", 1, None);
    rnr_ok.server_args = "--recv-delay-ms 3000".into();
    rnr_ok
        .client_args
        .push_str(" --msg-size 1024 --rnr-retry 7");
    v.push(rnr_ok);
    // … a finite one fails typed.
    let mut rnr_fail = Scenario::transfer("RNR, rnr_retry 1", "send", 1, None);
    rnr_fail.server_args = "--recv-delay-ms 3000".into();
    rnr_fail
        .client_args
        .push_str(" --msg-size 1024 --rnr-retry 1 --deadline 60");
    rnr_fail.expect = Expect::ClientError(&["RnrRetryExcErr"]);
    v.push(rnr_fail);
    v.extend(workloads(o.quick));
    // CQ overrun (one host).
    v.push(Scenario {
        name: "CQ overrun".into(),
        netem: None,
        server_args: String::new(),
        client_args: String::new(),
        kill_server_after: None,
        link_down: None,
        if_down: None,
        blackhole: None,
        local: true,
        procs: Vec::new(),
        expect: Expect::Local("refused:CqTooSmall"),
        stall_bound: None,
        c_twin: false,
    });
    // Atomics under duplication, reordering and loss: an experiment (issue
    // #24: the soak's fetch-and-add and compare-and-swap results went
    // wrong under these faults), run when selected (`--only atomic`), not
    // part of the matrix. 20000 fetch-and-adds of 8 bytes each; request i
    // adds i + 1, so every result is known (`fault.rs`'s
    // `atomic_expected`).
    //
    // Mixed: 64 KiB reads and fetch-and-adds in turn on one queue pair
    // (rxe's responder keeps reads and atomics in one resource table), 1024
    // of each (`--only mixed`). Mixed-write: the same with 64 KiB writes
    // (the server checks every slot at the end) for the reads, as the soak
    // puts multi-packet writes ahead of atomics (`--only mixed-write`).
    let only = o.only.as_deref().unwrap_or_default();
    for (label, netem) in [
        ("duplicate", "duplicate 3%"),
        ("reorder", "delay 2ms reorder 25% 50%"),
        ("loss 2%", "loss 2%"),
    ] {
        if only.contains("atomic") {
            let mut a = Scenario::transfer(&format!("{label} / atomic"), "atomic", 0, Some(netem));
            a.client_args = format!("--op atomic --msg-size 8 --total {}", 8 * 20000);
            v.push(a);
        }
        if only.contains("mixed") && !only.contains("mixed-write") {
            v.push(Scenario::transfer(
                &format!("{label} / mixed"),
                "mixed",
                64,
                Some(netem),
            ));
        }
        if only.contains("mixed-write") {
            v.push(Scenario::transfer(
                &format!("{label} / mixed-write"),
                "mixed-write",
                64,
                Some(netem),
            ));
        }
    }
    // The soak's atomics that completed without their result: the
    // responder answers a duplicate write with a plain ACK at its newest
    // PSN, an atomic's when the atomic came last. One 512 B write and one
    // fetch-and-add at a time, so the atomic is always the newest, and 10 %
    // loss both ways, so acknowledgements are lost and requests retried.
    if only.contains("mixed-write") {
        let mut a = Scenario::transfer(
            "loss 10% / mixed-write, 512 B pairs one at a time",
            "mixed-write",
            0,
            Some("loss 10%"),
        );
        a.client_args = format!(
            "--op mixed-write --msg-size 512 --window 1 --total {}",
            512 * 2000
        );
        v.push(a);
    }
    if let Some(only) = &o.only {
        v.retain(|s| s.name.contains(only.as_str()));
    }
    if o.repeat > 1 {
        v = v
            .iter()
            .flat_map(|s| {
                (1..=o.repeat).map(move |k| Scenario {
                    name: format!("{} #{k}", s.name),
                    ..s.clone()
                })
            })
            .collect();
    }
    with_peer(v, o.peer)
}

/// The transfer rows (both sides `fault_peer`) as `peer` asks: unchanged,
/// on the C twin instead (named `… (C twin)`), or each followed at once by
/// its C twin run, so that both see the same boot and the same load.
/// Workload and local rows run as they are.
pub(super) fn with_peer(v: Vec<Scenario>, peer: Peer) -> Vec<Scenario> {
    let twin = |s: &Scenario| Scenario {
        name: format!("{} (C twin)", s.name),
        c_twin: true,
        ..s.clone()
    };
    let transfer = |s: &Scenario| s.procs.is_empty() && !s.local;
    match peer {
        Peer::Rust => v,
        Peer::C => v
            .iter()
            .map(|s| if transfer(s) { twin(s) } else { s.clone() })
            .collect(),
        Peer::Both => v
            .iter()
            .flat_map(|s| match transfer(s) {
                true => vec![s.clone(), twin(s)],
                false => vec![s.clone()],
            })
            .collect(),
    }
}
