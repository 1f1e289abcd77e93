//! `target/instr/report.md` and `target/instr/scaling.png` from the measured configurations.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Result;
use plotters::prelude::*;

use super::{Config, Imp};
use crate::bench::plot::{register_font, FAMILY, PALETTE};

/// Per-operation counts of one configuration (instructions, marginal).
#[derive(Debug, Clone, Default)]
pub struct Measured {
    /// One post (`instr_post`), inclusive of the provider.
    pub post: f64,
    /// Polling per completion (`instr_poll` / completions, short polls' overhead removed).
    pub completion: f64,
    /// The event wait per completion (event mode only).
    pub wait: f64,
    /// One empty poll.
    pub empty: f64,
    /// rxe's post_send per post and poll_cq per completion.
    pub provider_post: Option<f64>,
    pub provider_completion: Option<f64>,
    /// Short polls of the two runs (timing showed through when they differ).
    pub short_polls: (f64, f64),
    pub setup_us: Option<f64>,
    pub teardown_us: Option<f64>,
    pub rss_qps_kib: Option<f64>,
    pub kernel_calls: Option<f64>,
    /// Marginal instructions per operation by function (its own, not its callees'), largest
    /// first: the whole process, loop and sleep included.
    pub breakdown: Vec<(String, f64)>,
    /// The program's own instructions per operation by source line (`lines.rs`), largest
    /// first; empty when the run kept no attribution.
    pub lines: Vec<super::lines::Line>,
}

impl Measured {
    /// Instructions per operation: post + completion (+ event wait).
    pub fn per_op(&self) -> f64 {
        self.post + self.completion + self.wait
    }
    fn provider(&self) -> Option<f64> {
        Some(self.provider_post? + self.provider_completion?)
    }
}

pub struct Row {
    pub cfg: Config,
    pub m: Measured,
}

pub struct PingpongRow {
    pub label: String,
    pub size: u64,
    pub c: Option<f64>,
    pub rust: Option<f64>,
    /// Per-function breakdown per iteration: C, ours.
    pub breakdown: [Vec<(String, f64)>; 2],
}

/// Targets (issue #36): per operation against C, and (16 QPs, polling) instructions added
/// over the provider, C adding 16.
fn target(imp: Imp, events: bool) -> Option<(f64, Option<f64>)> {
    match (imp, events) {
        (Imp::Request, false) => Some((1.25, Some(70.0))),
        (Imp::Prepared, false) => Some((1.12, Some(40.0))),
        (Imp::Raw, false) => Some((1.03, None)),
        (Imp::Request, true) => Some((1.12, None)),
        (Imp::Prepared, true) => Some((1.06, None)),
        _ => None,
    }
}

/// The implementations of a path table, in its order: C first, the floors last.
const SHOWN: [Imp; 6] = [
    Imp::C,
    Imp::Raw,
    Imp::Prepared,
    Imp::Request,
    Imp::FloorPrepared,
    Imp::FloorRequest,
];

fn find(rows: &[Row], imp: Imp, qps: u32, depth: u32, threads: u32, events: bool) -> Option<&Row> {
    rows.iter().find(|r| {
        r.cfg.imp == imp
            && r.cfg.qps == qps
            && r.cfg.depth == depth
            && r.cfg.threads == threads
            && r.cfg.events == events
    })
}

fn n(v: f64) -> String {
    format!("{v:.0}")
}

fn opt(v: Option<f64>, f: impl Fn(f64) -> String) -> String {
    v.map_or_else(|| "–".into(), f)
}

fn verdict(met: bool) -> &'static str {
    if met {
        "met"
    } else {
        "**missed**"
    }
}

/// How this run compares with the previous separate measurement.
fn reproducibility(s: &mut String, agreement: Option<&super::history::Agreement>) {
    let text = match agreement {
        Some(super::history::Agreement {
            compared,
            worst: Some((key, w)),
        }) if *compared > 0 => format!(
            "Reproducibility: {compared} configurations of this run were measured before in a \
             separate run; the largest difference is {:.2} % (`{key}`).",
            w * 100.0
        ),
        _ => "Reproducibility: no configuration of this run was measured before in a separate \
              run (`target/instr/history.json`)."
            .to_string(),
    };
    let _ = writeln!(s, "{text}\n");
}

/// What each guarantee costs, per path: the program's own instructions charged to the
/// guarantees their source lines serve (`guarantees.rs`), the floor they set (C plus them)
/// and what the path executes above it.
fn floors(s: &mut String, rows: &[Row]) {
    let Some(c) = find(rows, Imp::C, 16, 1, 1, false) else {
        return;
    };
    let c_op = c.m.per_op();
    let _ = writeln!(
        s,
        "### What each guarantee costs\n\n\
         Every instruction a path executes in its own code is charged to its source line \
         (the tables *by source line* at the end), and each line to the guarantee it serves \
         (`xtask/src/instr/guarantees.rs`); what no guarantee claims (loops, iterator and \
         `Result` plumbing, prologues, spills) is overhead. *C + guarantees* is C's count \
         plus what a path's guarantees cost in this build (a line charged to a guarantee \
         counts whole, its address arithmetic and spills included): what the path executes \
         above it is overhead a better build of the same code could remove. The floor \
         prototypes (*floor-prepared*, *floor-request*) are the same guarantees written by \
         hand: the least they were measured to cost, the floor each target is held against in \
         the verdicts above, and the second table below says how far each path is above its \
         floor.\n\n\
         | path | per op | guarantees | C + guarantees | ×C | target ×C | above it |\n\
         |---|---:|---:|---:|---:|---:|---:|"
    );
    let paths = &SHOWN[1..];
    for &imp in paths {
        let Some(r) = find(rows, imp, 16, 1, 1, false) else {
            continue;
        };
        let g: f64 = super::guarantees::charge(&r.m.lines)
            .iter()
            .map(|(_, n)| n)
            .sum();
        let floor = c_op + g;
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {:.2} | {} | {} |",
            imp.name(),
            n(r.m.per_op()),
            n(g),
            n(floor),
            floor / c_op,
            opt(target(imp, false).map(|t| t.0), |t| format!("{t:.2}")),
            n(r.m.per_op() - floor),
        );
    }
    s.push('\n');
    prototype_floors(s, rows, c);
    for &imp in paths {
        let Some(r) = find(rows, imp, 16, 1, 1, false) else {
            continue;
        };
        let _ = writeln!(s, "*{}*:\n", imp.name());
        for (g, count) in super::guarantees::charge(&r.m.lines) {
            let _ = writeln!(s, "- {count:.1}: {} ({})", g.what, g.key);
        }
        s.push('\n');
    }
}

/// Each safe path against its floor prototype: what the path executes above the least its
/// guarantees were measured to cost, post and poll apart.
fn prototype_floors(s: &mut String, rows: &[Row], c: &Row) {
    let pairs: Vec<(&Row, &Row)> = [Imp::Prepared, Imp::Request]
        .into_iter()
        .filter_map(|imp| {
            let r = find(rows, imp, 16, 1, 1, false)?;
            Some((r, find(rows, imp.floor()?, 16, 1, 1, false)?))
        })
        .collect();
    if pairs.is_empty() {
        return;
    }
    let _ = writeln!(
        s,
        "Each path against its floor prototype (the same guarantees by hand): what the \
         library executes above it, by side.\n\n\
         | path | per op | floor prototype | floor ×C | floor added over provider | above: post | \
         above: poll per completion | above: per op |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|"
    );
    for (r, f) in pairs {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {:.2} | {} | {} | {} | {} |",
            r.cfg.imp.name(),
            n(r.m.per_op()),
            n(f.m.per_op()),
            f.m.per_op() / c.m.per_op(),
            opt(f.m.provider().map(|p| f.m.per_op() - p), n),
            signed(r.m.post - f.m.post),
            signed(r.m.completion - f.m.completion),
            signed(r.m.per_op() - f.m.per_op()),
        );
    }
    s.push('\n');
}

/// The per-path table of one setting (rows of each implementation), C first.
fn path_table(s: &mut String, rows: &[Row], qps: u32, depth: u32, threads: u32, events: bool) {
    let Some(c) = find(rows, Imp::C, qps, depth, threads, events) else {
        return;
    };
    let wait = if events { " | event wait" } else { "" };
    let _ = writeln!(
        s,
        "| path | post | poll per completion{wait} | per op | provider | added over provider | ×C | target | empty poll |"
    );
    let _ = writeln!(
        s,
        "|---|---:|---:|{}---:|---:|---:|---:|---|---:|",
        if events { "---:|" } else { "" }
    );
    for imp in SHOWN {
        let Some(r) = find(rows, imp, qps, depth, threads, events) else {
            continue;
        };
        let m = &r.m;
        let ratio = m.per_op() / c.m.per_op();
        let added = m.provider().map(|p| m.per_op() - p);
        let floor = imp
            .floor()
            .and_then(|f| find(rows, f, qps, depth, threads, events));
        let floor_misses = |t: f64, a: Option<f64>| {
            floor.map(|f| {
                let fr = f.m.per_op() / c.m.per_op();
                let fa = f.m.provider().map(|p| f.m.per_op() - p);
                fr > t + 0.005 || a.is_some_and(|a| fa.is_some_and(|x| x > a + 0.5))
            })
        };
        let verdict = |met: bool, t: f64, a: Option<f64>| -> String {
            match (met, floor_misses(t, a)) {
                (true, _) => verdict(true).into(),
                (false, Some(true)) => "**missed**, forced: its floor misses it too".into(),
                (false, Some(false)) => "**missed**; its floor meets it".into(),
                (false, None) => verdict(false).into(),
            }
        };
        let _ = writeln!(
            s,
            "| {} | {} ({}) | {} ({}) |{} {} | {} | {} | {:.2} | {} | {} |",
            imp.name(),
            n(m.post),
            opt(m.provider_post, n),
            n(m.completion),
            opt(m.provider_completion, n),
            if events {
                format!(" {} |", n(m.wait))
            } else {
                String::new()
            },
            n(m.per_op()),
            opt(m.provider(), n),
            opt(added, n),
            ratio,
            match target(imp, events) {
                None => "–".to_string(),
                Some((t, None)) => format!("≤ {t:.2}: {}", verdict(ratio <= t + 0.005, t, None)),
                Some((t, Some(a))) => format!(
                    "≤ {t:.2} and ≤ {a:.0} added: {}",
                    verdict(
                        ratio <= t + 0.005 && added.is_some_and(|x| x <= a + 0.5),
                        t,
                        Some(a)
                    )
                ),
            },
            n(m.empty),
        );
    }
}

pub fn markdown(
    rows: &[Row],
    pps: &[PingpongRow],
    agreement: Option<&super::history::Agreement>,
) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# Instructions per operation: ours against C\n\n\
         Generated by `cargo xtask instr`. Method: user-space instructions counted by callgrind \
         (`--vgdb=no`) inside the SoftRoCE VM; every number is the difference between a short and \
         a long run of the same program divided by the difference in operations, so start-up, \
         set-up and teardown cancel. `opcost` (tools/examples/opcost.rs) and its C twin \
         (xtask/c/opcost.c, perftest's style: one `ibv_send_wr` per request, built once) post \
         signaled 64-byte RDMA writes on RC queue pairs connected to themselves, sleep until they \
         completed (so the count does not depend on timing), and poll in batches of 16. \
         *post* is one post call, *poll per completion* the polling divided by the completions it \
         returned (an empty poll's cost is calibrated and removed for the rare short polls), both \
         inclusive of the provider; in parentheses rxe's own `post_send`/`poll_cq`. *added over \
         provider* is what the program and library execute beyond rxe. Paths: *request* moves an \
         owned buffer into a typed post on the queue pair's send queue handle \
         (`sq.write(buf, remote, Wr::id(i))`) and takes it back from the borrowed completion \
         (`cq.poll`, `take_local`); *prepared* re-posts a `PreparedSend` on the handle; *raw* is \
         the unsafe raw path. *floor-prepared* and *floor-request* are the floors of those two \
         paths, measured: their guarantees written by hand on the raw path as tightly as we \
         could (tools/examples/opcost.rs, module `floor`: one flat slot store per lane, signaled \
         requests only, no teardown protocol), not the library's code. A target below a \
         path's floor cannot be met by a better build of the same guarantees; the verdict \
         says when that is why it is missed. \
         Wall-clock numbers (set-up, teardown) come from plain runs and are noisy under TCG: \
         trends only.\n"
    );
    if find(rows, Imp::C, 16, 1, 1, false).is_some() {
        let _ = writeln!(s, "## Per operation, 16 queue pairs on one CQ, depth 1\n");
        path_table(&mut s, rows, 16, 1, 1, false);
        s.push('\n');
        reproducibility(&mut s, agreement);
        floors(&mut s, rows);
    }
    if find(rows, Imp::C, 1, 1, 1, true).is_some() {
        let _ = writeln!(
            s,
            "## Event wait, one queue pair: post, `get_event` + re-arm + ack, poll\n"
        );
        path_table(&mut s, rows, 1, 1, 1, true);
        s.push('\n');
        event_why(&mut s, rows);
    }
    if !pps.is_empty() {
        let _ = writeln!(
            s,
            "## Ping-pongs in event mode, whole client process per iteration\n\n\
             Not deterministic like the tables above: how many completions one event carries \
             depends on timing, and every extra event costs a read, an acknowledgement and a \
             re-arm. Two runs of the same C binary differed by 15 % here; compare the ratio, \
             and take the event wait row above (one completion per event by construction) as \
             the measure of the event path.\n\n\
             | tool | size | C | ours | ×C |\n|---|---:|---:|---:|---:|"
        );
        for p in pps {
            let ratio = match (p.c, p.rust) {
                (Some(c), Some(r)) => format!("{:.2}", r / c),
                _ => "–".into(),
            };
            let _ = writeln!(
                s,
                "| {} | {} B | {} | {} | {ratio} |",
                p.label,
                p.size,
                opt(p.c, n),
                opt(p.rust, n)
            );
        }
        s.push('\n');
        for p in pps.iter().filter(|p| !p.breakdown[1].is_empty()).take(1) {
            for (side, name) in [(0, "C"), (1, "ours")] {
                let _ = writeln!(
                    s,
                    "<details><summary>{} {} B, {name}: instructions per iteration by function</summary>\n\n\
                     | instructions | function |\n|---:|---|",
                    p.label, p.size
                );
                for (f, v) in p.breakdown[side].iter().take(25) {
                    let _ = writeln!(s, "| {v:.1} | {f} |");
                }
                let _ = writeln!(s, "\n</details>\n");
            }
        }
    }
    scaling(
        &mut s,
        rows,
        "QPs",
        "queue pairs on one CQ (depth 1)",
        16,
        |r| (r.cfg.depth == 1 && r.cfg.threads == 1 && !r.cfg.events).then_some(r.cfg.qps),
    );
    if find(rows, Imp::C, 1, 1, 1, false).is_some() {
        let _ = writeln!(
            s,
            "With one queue pair at depth 1 each poll returns one completion, so what a \
             non-empty poll costs once is paid per operation, in C as in ours (from 16 queue \
             pairs on, a poll takes up to 16): the same effect as in the event runs above, whose \
             tables by source line show it.\n"
        );
    }
    scaling(
        &mut s,
        rows,
        "depth",
        "outstanding requests per queue pair (16 QPs)",
        1,
        |r| (r.cfg.qps == 16 && r.cfg.threads == 1 && !r.cfg.events).then_some(r.cfg.depth),
    );
    scaling(
        &mut s,
        rows,
        "threads",
        "threads, each with its own CQ and 4 QPs (depth 16)",
        1,
        |r| {
            (r.cfg.qps == 4 * r.cfg.threads && r.cfg.depth == 16 && !r.cfg.events && !r.cfg.shared)
                .then_some(r.cfg.threads)
        },
    );
    scaling(
        &mut s,
        rows,
        "threads",
        "threads, each with 4 QPs (depth 16), all on one CQ: each thread takes whichever \
         completions it polls (the paths whose completions need nothing of the thread that \
         posted)",
        1,
        |r| {
            (r.cfg.qps == 4 * r.cfg.threads && r.cfg.depth == 16 && r.cfg.shared)
                .then_some(r.cfg.threads)
        },
    );
    if rows
        .iter()
        .any(|r| r.cfg.depth == 1 && r.cfg.threads == 1 && !r.cfg.events && r.cfg.qps > 16)
    {
        let _ = writeln!(
            s,
            "![instructions per operation against queue pairs](scaling.png)\n"
        );
    }
    setup_table(&mut s, rows);
    breakdown(&mut s, rows);
    by_line(&mut s, rows);
    let unsteady: Vec<String> = rows
        .iter()
        .filter(|r| r.m.short_polls.0 != r.m.short_polls.1)
        .map(|r| {
            format!(
                "{} ({} / {})",
                r.cfg.label(),
                r.m.short_polls.0,
                r.m.short_polls.1
            )
        })
        .collect();
    if !unsteady.is_empty() {
        let _ = writeln!(
            s,
            "Short polls differed between the short and the long run (their overhead was \
             removed with the calibrated empty-poll cost): {}.\n",
            unsteady.join(", ")
        );
    }
    s
}

/// Instructions per operation against one variable.
/// `base`: the setting the others are held to (issue #19: 1024 QPs against 16; depth and
/// threads against the first).
fn scaling(
    s: &mut String,
    rows: &[Row],
    head: &str,
    what: &str,
    base: u32,
    x: impl Fn(&Row) -> Option<u32>,
) {
    let mut xs: Vec<u32> = rows.iter().filter_map(&x).collect();
    xs.sort_unstable();
    xs.dedup();
    if xs.len() < 2 {
        return;
    }
    let imps = [Imp::C, Imp::Request, Imp::Prepared, Imp::Raw];
    let _ = writeln!(s, "## Instructions per operation against {what}\n");
    let _ = writeln!(s, "| {head} | C | request | prepared | raw |");
    let _ = writeln!(s, "|---:|---:|---:|---:|---:|");
    for &v in &xs {
        let cell = |imp: Imp| {
            rows.iter()
                .find(|r| r.cfg.imp == imp && x(r) == Some(v))
                .map_or("–".to_string(), |r| n(r.m.per_op()))
        };
        let _ = writeln!(
            s,
            "| {v} | {} | {} | {} | {} |",
            cell(Imp::C),
            cell(Imp::Request),
            cell(Imp::Prepared),
            cell(Imp::Raw)
        );
    }
    let base = if xs.contains(&base) { base } else { xs[0] };
    let top = *xs.last().unwrap_or(&base);
    let mut notes = Vec::new();
    for imp in imps {
        let get = |v| {
            rows.iter()
                .find(|r| r.cfg.imp == imp && x(r) == Some(v))
                .map(|r| r.m.per_op())
        };
        if let (Some(a), Some(b)) = (get(base), get(top)) {
            notes.push(format!(
                "{} {:+.1} %{}",
                imp.name(),
                (b / a - 1.0) * 100.0,
                if b / a <= 1.05 { "" } else { " (**not flat**)" }
            ));
        }
    }
    let _ = writeln!(
        s,
        "\n{top} against {base}: {} (flat: within 5 %).\n",
        notes.join(", ")
    );
}

/// Per-function breakdown of the 16-QP paths (and of the largest QP count measured), so that
/// a miss says where its instructions go.
fn breakdown(s: &mut String, rows: &[Row]) {
    let top_qps = rows
        .iter()
        .filter(|r| r.cfg.depth == 1 && r.cfg.threads == 1 && !r.cfg.events)
        .map(|r| r.cfg.qps)
        .max()
        .unwrap_or(16);
    let mut wanted: Vec<u32> = vec![16];
    if top_qps != 16 {
        wanted.push(top_qps);
    }
    for qps in wanted {
        let picked: Vec<&Row> = [Imp::C, Imp::Raw, Imp::Prepared, Imp::Request]
            .into_iter()
            .filter_map(|i| find(rows, i, qps, 1, 1, false))
            .filter(|r| !r.m.breakdown.is_empty())
            .collect();
        if picked.is_empty() {
            continue;
        }
        let _ = writeln!(
            s,
            "## Where the instructions go, {qps} queue pairs (per operation, by function)\n\n\
             Each function's own instructions (not its callees'), whole process, marginal per \
             operation; functions under 1 instruction left out. `0x…` in `librxe` are rxe's \
             static functions (post_send, poll_cq), `write` and the cancel hooks its doorbell \
             system call.\n"
        );
        for r in picked {
            let _ = writeln!(
                s,
                "<details><summary>{}: {:.0} per operation</summary>\n",
                r.cfg.imp.name(),
                r.m.per_op()
            );
            let _ = writeln!(s, "| instructions | function |\n|---:|---|");
            for (name, v) in r.m.breakdown.iter().take(25) {
                let _ = writeln!(s, "| {v:.1} | {name} |");
            }
            let _ = writeln!(s, "\n</details>\n");
        }
    }
}

/// Where the event path's difference from C lies: the wait against the poll, and the poll
/// of one completion against the same poll sharing a batch of 16.
fn event_why(s: &mut String, rows: &[Row]) {
    let Some(c) = find(rows, Imp::C, 1, 1, 1, true) else {
        return;
    };
    let c16 = find(rows, Imp::C, 16, 1, 1, false);
    for imp in [Imp::Prepared, Imp::Request] {
        let Some(r) = find(rows, imp, 1, 1, 1, true) else {
            continue;
        };
        let batch = match (find(rows, imp, 16, 1, 1, false), c16) {
            (Some(b), Some(cb)) => format!(
                " (in batches of 16: {} against {})",
                n(b.m.completion),
                n(cb.m.completion)
            ),
            _ => String::new(),
        };
        let _ = writeln!(
            s,
            "*{}*: {} instructions per operation over C's; the event wait {} ({} against {}), \
             the post {} and the poll {}: {} per completion against {}{batch}. One completion \
             per poll pays alone what a non-empty poll costs once (the poll's call and the \
             batch's walk set up, in C as in ours): the tables by source line for one queue \
             pair in event mode, at the end, name each instruction.\n",
            imp.name(),
            n(r.m.per_op() - c.m.per_op()),
            signed(r.m.wait - c.m.wait),
            n(r.m.wait),
            n(c.m.wait),
            signed(r.m.post - c.m.post),
            signed(r.m.completion - c.m.completion),
            n(r.m.completion),
            n(c.m.completion),
        );
    }
}

/// `v` with its sign, rounded: "+12", "-26".
fn signed(v: f64) -> String {
    format!("{v:+.0}")
}

/// The program's own instructions by source line, of the 16-QP paths and of the event
/// runs (one queue pair), so that every instruction above a floor, and every one the event
/// path adds over C, can be found in the code.
fn by_line(s: &mut String, rows: &[Row]) {
    let pick = |qps: u32, events: bool| -> Vec<&Row> {
        SHOWN
            .into_iter()
            .filter_map(|i| find(rows, i, qps, 1, 1, events))
            .filter(|r| !r.m.lines.is_empty())
            .collect()
    };
    line_tables(s, "16 queue pairs", &pick(16, false));
    line_tables(s, "one queue pair in event mode", &pick(1, true));
}

/// [`by_line`]'s tables of `picked`, under a heading naming `what` was measured.
fn line_tables(s: &mut String, what: &str, picked: &[&Row]) {
    if picked.is_empty() {
        return;
    }
    let _ = writeln!(
        s,
        "## Where the program's own instructions go, {what} (per operation, by source line)\n\n\
         Every instruction the program executes in its own binary (not in libibverbs, rxe or \
         libc), marginal per operation, charged to the innermost line of this repository it \
         belongs to: std and crate code inlined into a line counts for that line (`addr2line \
         -i` on the measured binary, built with line tables). Loop and sleep of the measuring \
         program included; lines under half an instruction left out.\n"
    );
    for r in picked.iter().copied() {
        let total: f64 = r.m.lines.iter().map(|l| l.per_op).sum();
        let _ = writeln!(
            s,
            "<details><summary>{}: {:.0} instructions per operation in its own code</summary>\n",
            r.cfg.imp.name(),
            total
        );
        let _ = writeln!(s, "| instructions | line | code |\n|---:|---|---|");
        const SHOWN: usize = 40;
        for l in r.m.lines.iter().take(SHOWN) {
            let _ = writeln!(
                s,
                "| {:.1} | `{}` | `{}` |",
                l.per_op,
                l.location,
                l.source.replace('|', "\\|").replace('`', "'")
            );
        }
        if r.m.lines.len() > SHOWN {
            let rest: f64 = r.m.lines[SHOWN..].iter().map(|l| l.per_op).sum();
            let _ = writeln!(
                s,
                "| {rest:.1} | {} more lines | |",
                r.m.lines.len() - SHOWN
            );
        }
        let _ = writeln!(s, "\n</details>\n");
    }
}

/// Set-up, teardown, kernel calls and memory per queue pair, C against the request path.
fn setup_table(s: &mut String, rows: &[Row]) {
    let mut qs: Vec<&Row> = rows
        .iter()
        .filter(|r| {
            r.cfg.depth == 1 && r.cfg.threads == 1 && !r.cfg.events && r.m.setup_us.is_some()
        })
        .filter(|r| matches!(r.cfg.imp, Imp::C | Imp::Request))
        .collect();
    if qs.is_empty() {
        return;
    }
    qs.sort_by_key(|r| (r.cfg.qps, r.cfg.imp));
    let _ = writeln!(
        s,
        "## Per queue pair: create + connect, teardown, kernel calls, memory\n\n\
         Wall clock (the median of three plain runs; still noisy under TCG), kernel calls of a \
         whole one-round run (`strace -f -c`) and RSS growth while creating and connecting the \
         queue pairs (median of the same runs), each divided by the number of queue pairs.\n\n\
         | QPs | impl | create+connect µs/QP | teardown µs/QP | kernel calls/QP | RSS KiB/QP |\n\
         |---:|---|---:|---:|---:|---:|"
    );
    for r in qs {
        let q = f64::from(r.cfg.qps);
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} |",
            r.cfg.qps,
            if r.cfg.imp == Imp::C { "C" } else { "ours" },
            opt(r.m.setup_us, |v| format!("{:.0}", v / q)),
            opt(r.m.teardown_us, |v| format!("{:.0}", v / q)),
            opt(r.m.kernel_calls, |v| format!("{:.1}", v / q)),
            opt(r.m.rss_qps_kib, |v| format!("{:.1}", v / q)),
        );
    }
    s.push('\n');
}

/// Instructions per operation against the number of queue pairs, per implementation.
pub fn plot(rows: &[Row], path: &Path) -> Result<()> {
    let pts = |imp: Imp| -> Vec<(f64, f64)> {
        let mut v: Vec<(f64, f64)> = rows
            .iter()
            .filter(|r| r.cfg.imp == imp && r.cfg.depth == 1 && r.cfg.threads == 1 && !r.cfg.events)
            .map(|r| (f64::from(r.cfg.qps), r.m.per_op()))
            .collect();
        v.sort_by(|a, b| a.0.total_cmp(&b.0));
        v
    };
    let series: Vec<(Imp, Vec<(f64, f64)>)> = [Imp::C, Imp::Raw, Imp::Prepared, Imp::Request]
        .into_iter()
        .map(|i| (i, pts(i)))
        .filter(|(_, v)| v.len() >= 2)
        .collect();
    if series.is_empty() {
        anyhow::bail!("fewer than two queue-pair counts measured");
    }
    register_font()?;
    let ymax = series
        .iter()
        .flat_map(|(_, v)| v.iter().map(|p| p.1))
        .fold(0.0, f64::max)
        * 1.15;
    let xmax = series
        .iter()
        .flat_map(|(_, v)| v.iter().map(|p| p.0))
        .fold(1.0, f64::max)
        * 1.5;
    let root = BitMapBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Instructions per signaled 64 B RDMA write (post + poll), N QPs on one CQ",
            (FAMILY, 20),
        )
        .margin(14)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d((0.8f64..xmax).log_scale(), 0f64..ymax)?;
    chart
        .configure_mesh()
        .x_desc("queue pairs sharing the CQ")
        .y_desc("instructions per operation")
        .x_label_formatter(&|v| format!("{v:.0}"))
        .label_style((FAMILY, 14))
        .draw()?;
    for (k, (imp, v)) in series.iter().enumerate() {
        let colour = PALETTE[k % PALETTE.len()];
        chart
            .draw_series(LineSeries::new(v.iter().copied(), colour.stroke_width(2)))?
            .label(imp.name())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(2))
            });
        chart.draw_series(v.iter().map(|&p| Circle::new(p, 4, colour.filled())))?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .label_font((FAMILY, 14))
        .position(SeriesLabelPosition::UpperLeft)
        .draw()?;
    root.present()?;
    Ok(())
}
