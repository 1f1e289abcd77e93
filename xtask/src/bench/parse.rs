//! Parsers for the tools' text output: perftest-style result tables and `ibv_rc_pingpong`'s
//! summary lines. Pure functions over the captured text, so they are tested on real samples.
//!
//! Tables are found by their header (a line with a `#bytes` column) and columns by name, with
//! any spacing (perftest mixes runs of spaces and tabs, and its names contain single spaces:
//! `BW average[MB/sec]`, `99% percentile[usec]`), so our tools' tables parse the same way.

use anyhow::{bail, Result};

/// One result table: column names as printed, and the numeric rows below the header.
#[derive(Debug, Clone, PartialEq)]
pub struct Table {
    pub columns: Vec<String>,
    pub rows: Vec<Vec<f64>>,
    /// The rows as printed (for their precision).
    pub raw: Vec<Vec<String>>,
}

/// A column name reduced for matching: lower case, the unit (`[...]`) cut off, only letters,
/// digits and `#%.` kept. `t_typical[usec]` → `ttypical`, `BW average[MB/sec]` → `bwaverage`.
pub fn normalize(name: &str) -> String {
    let base = name.split('[').next().unwrap_or(name);
    base.chars()
        .filter(|c| c.is_ascii_alphanumeric() || "#%.".contains(*c))
        .map(|c| c.to_ascii_lowercase())
        .collect()
}

/// The unit of a column name (`t_avg[usec]` → `usec`), if it has one.
pub fn unit(name: &str) -> Option<&str> {
    let (_, rest) = name.split_once('[')?;
    rest.split(']').next().map(str::trim)
}

/// Splits a header into column names: a name ends at a word that ends with `]` (its unit) or
/// is a `#word` of its own; other words join the next one (`99%` + `percentile[usec]`).
fn split_header_by_units(line: &str) -> Vec<String> {
    let mut cols = Vec::new();
    let mut pending: Vec<&str> = Vec::new();
    for w in line.split_whitespace() {
        if w.starts_with('#') {
            cols.extend(pending.drain(..).map(str::to_string));
            cols.push(w.to_string());
        } else if w.ends_with(']') {
            pending.push(w);
            cols.push(pending.join(" "));
            pending.clear();
        } else {
            pending.push(w);
        }
    }
    cols.extend(pending.into_iter().map(str::to_string));
    cols
}

/// Splits a header at runs of two or more blanks (or any tab).
fn split_header_by_gaps(line: &str) -> Vec<String> {
    let mut cols = Vec::new();
    let mut cur = String::new();
    let mut blanks = 0;
    for c in line.chars() {
        if c == ' ' {
            blanks += 1;
            continue;
        }
        if c == '\t' {
            blanks += 2;
            continue;
        }
        if blanks >= 2 && !cur.is_empty() {
            cols.push(std::mem::take(&mut cur));
        } else if blanks == 1 && !cur.is_empty() {
            cur.push(' ');
        }
        blanks = 0;
        cur.push(c);
    }
    if !cur.is_empty() {
        cols.push(cur);
    }
    cols
}

fn is_header(line: &str) -> bool {
    line.split_whitespace()
        .next()
        .is_some_and(|w| normalize(w) == "#bytes")
}

/// The numbers of a data row and their text, or None when the line is not one.
fn data_row(line: &str) -> Option<(Vec<f64>, Vec<String>)> {
    let words: Vec<&str> = line.split_whitespace().collect();
    if words.is_empty() || words[0].parse::<u64>().is_err() {
        return None;
    }
    let values = words
        .iter()
        .map(|w| w.parse::<f64>().ok())
        .collect::<Option<Vec<f64>>>()?;
    Some((values, words.iter().map(|w| w.to_string()).collect()))
}

/// Every result table in `text`, in order.
pub fn tables(text: &str) -> Vec<Table> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        if !is_header(lines[i]) {
            i += 1;
            continue;
        }
        let header = lines[i];
        let mut rows = Vec::new();
        let mut raw = Vec::new();
        let mut j = i + 1;
        while j < lines.len() {
            match data_row(lines[j]) {
                Some((r, w)) => {
                    rows.push(r);
                    raw.push(w);
                }
                None if lines[j].trim().is_empty() && rows.is_empty() => {}
                None => break,
            }
            j += 1;
        }
        let width = rows.first().map_or(0, Vec::len);
        let by_units = split_header_by_units(header);
        let columns = if width == 0 || by_units.len() == width {
            by_units
        } else {
            let by_gaps = split_header_by_gaps(header);
            if by_gaps.len() == width {
                by_gaps
            } else {
                by_units
            }
        };
        out.push(Table { columns, rows, raw });
        i = j;
    }
    out
}

impl Table {
    /// Index of the column whose normalized name is `key` (see [`normalize`]).
    pub fn column(&self, key: &str) -> Option<usize> {
        let key = normalize(key);
        self.columns.iter().position(|c| normalize(c) == key)
    }
}

/// What to read from a perftest-style table.
#[derive(Debug, Clone, Copy)]
pub struct Wanted<'a> {
    /// Column name, e.g. `t_typical` or `BW average`.
    pub column: &'a str,
    /// Unit the column must have if it names one, e.g. `usec`, `MB/sec`.
    pub unit: &'a str,
    /// The message size of the row.
    pub size: u64,
    /// The iteration count the row must report (when the table has `#iterations`).
    pub iters: Option<u64>,
}

/// One value found in a table, with its row.
#[derive(Debug, Clone, PartialEq)]
pub struct Found {
    pub value: f64,
    /// The value as printed.
    pub text: String,
    pub columns: Vec<String>,
    pub row: Vec<f64>,
    pub row_text: Vec<String>,
}

impl Found {
    /// The value and text of another column of the same row.
    pub fn other(&self, key: &str) -> Option<(f64, &str)> {
        let key = normalize(key);
        let i = self.columns.iter().position(|c| normalize(c) == key)?;
        Some((*self.row.get(i)?, self.row_text.get(i)?.as_str()))
    }
}

/// The value of `want.column` in the row for `want.size` of the last table that has it.
pub fn perftest_cell(text: &str, want: &Wanted) -> Result<Found> {
    let all = tables(text);
    if all.is_empty() {
        bail!("no result table (no line starting with `#bytes`)");
    }
    let Some(t) = all.iter().rev().find(|t| t.column(want.column).is_some()) else {
        bail!(
            "no `{}` column in the result table (columns: {})",
            want.column,
            all[all.len() - 1].columns.join(" | ")
        );
    };
    let col = t.column(want.column).unwrap_or_default();
    if let Some(u) = unit(&t.columns[col]) {
        if !u.eq_ignore_ascii_case(want.unit) {
            bail!(
                "column `{}` is in {u}, expected {}",
                t.columns[col],
                want.unit
            );
        }
    }
    let bytes = t.column("#bytes").unwrap_or(0);
    let Some(r) = t
        .rows
        .iter()
        .rposition(|r| r.get(bytes).is_some_and(|b| *b == want.size as f64))
    else {
        bail!("the result table has no row for {} bytes", want.size);
    };
    let row = &t.rows[r];
    if let (Some(n), Some(ic)) = (want.iters, t.column("#iterations")) {
        if let Some(&got) = row.get(ic) {
            if got != n as f64 {
                bail!("the row reports {got} iterations, {n} were asked for");
            }
        }
    }
    match row.get(col) {
        Some(v) if v.is_finite() => Ok(Found {
            value: *v,
            text: t.raw[r][col].clone(),
            columns: t.columns.clone(),
            row: row.clone(),
            row_text: t.raw[r].clone(),
        }),
        _ => bail!(
            "the row for {} bytes has no `{}` value",
            want.size,
            t.columns[col]
        ),
    }
}

/// The value of `want.column` in the row for `want.size` (see [`perftest_cell`]).
pub fn perftest_value(text: &str, want: &Wanted) -> Result<f64> {
    Ok(perftest_cell(text, want)?.value)
}

/// Half a unit in the last printed place: the rounding error of a printed number.
pub fn half_ulp(printed: &str) -> f64 {
    let decimals = printed.split_once('.').map_or(0, |(_, f)| {
        f.chars().take_while(char::is_ascii_digit).count()
    });
    0.5 * 10f64.powi(-(decimals as i32))
}

/// `BW average[MB/sec]` of the row for `size`.
///
/// perftest prints it with two decimals, which at small messages (~0.01 MB/s at 2 B under
/// TCG) would make ratios meaningless. `MsgRate[Mpps]` is the same measurement with six
/// decimals (perftest: BW = MsgRate · size · 10⁶ / 2²⁰), so when it is the more precise of the
/// two and agrees with the printed BW to their rounding, BW is recomputed from it. Otherwise
/// (or without a MsgRate column) the printed BW average is used.
pub fn bandwidth_mb_s(text: &str, size: u64, iters: Option<u64>) -> Result<f64> {
    let f = perftest_cell(
        text,
        &Wanted {
            column: "BW average",
            unit: "MB/sec",
            size,
            iters,
        },
    )?;
    let Some((mpps, mpps_text)) = f.other("MsgRate") else {
        return Ok(f.value);
    };
    let scale = size as f64 * 1e6 / (1u64 << 20) as f64;
    let derived = mpps * scale;
    let derived_err = half_ulp(mpps_text) * scale;
    let printed_err = half_ulp(&f.text);
    if derived_err < printed_err && (derived - f.value).abs() <= printed_err + derived_err + 1e-12 {
        Ok(derived)
    } else {
        Ok(f.value)
    }
}

/// `ibv_rc_pingpong`'s summary: `B bytes in S seconds = M Mbit/sec` and
/// `N iters in S seconds = U usec/iter`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pingpong {
    pub iters: u64,
    pub usec_per_iter: f64,
    pub mbit_per_sec: Option<f64>,
}

/// Parses the last `… iters in … seconds = … usec/iter` line (and the bytes line if present).
pub fn pingpong(text: &str) -> Result<Pingpong> {
    let mut found = None;
    let mut mbit = None;
    for line in text.lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        if let Some(p) = w.iter().position(|t| *t == "usec/iter") {
            let usec = p.checked_sub(1).and_then(|i| w[i].parse::<f64>().ok());
            let iters = match (w.first(), w.get(1)) {
                (Some(n), Some(&"iters")) => n.parse::<u64>().ok(),
                _ => None,
            };
            if let (Some(u), Some(n)) = (usec, iters) {
                found = Some((n, u));
            }
        }
        if let Some(p) = w.iter().position(|t| *t == "Mbit/sec") {
            if w.get(1) == Some(&"bytes") {
                mbit = p.checked_sub(1).and_then(|i| w[i].parse::<f64>().ok());
            }
        }
    }
    match found {
        Some((iters, usec_per_iter)) if usec_per_iter.is_finite() => Ok(Pingpong {
            iters,
            usec_per_iter,
            mbit_per_sec: mbit,
        }),
        _ => bail!("no `N iters in S seconds = U usec/iter` line"),
    }
}

/// Whether a workload's output has its `VERIFIED` line (a line that starts with it): the
/// examples print it last, and only when every byte checked out. Without it a run is a failure,
/// whatever numbers it printed.
pub fn verified(text: &str) -> bool {
    text.lines().any(|l| l.trim_start().starts_with("VERIFIED"))
}

fn require_verified(text: &str) -> Result<()> {
    if !verified(text) {
        bail!("no `VERIFIED` line (the data was not verified; its numbers do not count)");
    }
    Ok(())
}

/// One phase line of `blockstore client`:
/// `random: ops <N> depth <D> IOPS <f> MiB/s <f> p50 <f> us p99 <f> us`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BlockPhase {
    pub ops: u64,
    pub depth: u64,
    pub iops: f64,
    pub mib_s: f64,
    pub p50_us: f64,
    pub p99_us: f64,
}

/// The last `{phase}:` line of a block-store client's output, checked against the operations
/// and depth asked, in an output that says `VERIFIED`.
pub fn blockstore_phase(text: &str, phase: &str, ops: u64, depth: u64) -> Result<BlockPhase> {
    require_verified(text)?;
    let prefix = format!("{phase}:");
    let Some(line) = text
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| l.starts_with(&prefix))
    else {
        bail!("no `{prefix}` line");
    };
    let w: Vec<&str> = line[prefix.len()..].split_whitespace().collect();
    let after = |key: &str| -> Result<f64> {
        let i = w
            .iter()
            .position(|t| *t == key)
            .ok_or_else(|| anyhow::anyhow!("`{prefix}` line has no `{key}`: `{line}`"))?;
        match w.get(i + 1).and_then(|v| v.parse::<f64>().ok()) {
            Some(v) if v.is_finite() => Ok(v),
            _ => bail!("`{prefix}` line: `{key}` has no number: `{line}`"),
        }
    };
    let p = BlockPhase {
        ops: after("ops")? as u64,
        depth: after("depth")? as u64,
        iops: after("IOPS")?,
        mib_s: after("MiB/s")?,
        p50_us: after("p50")?,
        p99_us: after("p99")?,
    };
    if p.ops != ops {
        bail!("it reports {} operations, {ops} were asked for", p.ops);
    }
    if p.depth != depth {
        bail!("it reports queue depth {}, {depth} was asked for", p.depth);
    }
    Ok(p)
}

/// What one rank of `allreduce` prints.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Allreduce {
    pub rank: u64,
    pub ranks: u64,
    pub floats: u64,
    pub iters: u64,
    pub median_us: f64,
    /// NCCL-tests definitions, GB/s (10⁹ B/s).
    pub algbw_gb_s: f64,
    pub busbw_gb_s: f64,
}

/// One rank's `rank R of N: S floats, I iterations, median U us` and
/// `algbw X GB/s  busbw Y GB/s` lines, checked against the ranks, floats and iterations asked,
/// in an output that says `VERIFIED`.
pub fn allreduce(text: &str, ranks: u64, floats: u64, iters: u64) -> Result<Allreduce> {
    require_verified(text)?;
    let mut head = None;
    let mut bw = None;
    for line in text.lines().map(str::trim) {
        let w: Vec<&str> = line
            .split(|c: char| c.is_whitespace() || c == ':' || c == ',')
            .filter(|t| !t.is_empty())
            .collect();
        let num = |i: usize| w.get(i).and_then(|t| t.parse::<f64>().ok());
        // rank R of N S floats I iterations median U us
        if w.len() >= 11
            && (w[0], w[2], w[5], w[7], w[8], w[10])
                == ("rank", "of", "floats", "iterations", "median", "us")
        {
            if let (Some(r), Some(n), Some(s), Some(i), Some(u)) =
                (num(1), num(3), num(4), num(6), num(9))
            {
                head = Some((r as u64, n as u64, s as u64, i as u64, u));
            }
        }
        if w.len() >= 6 && w[0] == "algbw" && w[3] == "busbw" {
            if let (Some(a), Some(b)) = (num(1), num(4)) {
                bw = Some((a, b));
            }
        }
    }
    let Some((rank, n, s, i, median_us)) = head else {
        bail!("no `rank R of N: S floats, I iterations, median U us` line");
    };
    let Some((algbw_gb_s, busbw_gb_s)) = bw else {
        bail!("no `algbw X GB/s  busbw Y GB/s` line");
    };
    if n != ranks {
        bail!("it reports {n} ranks, {ranks} were asked for");
    }
    if s != floats {
        bail!("it reports {s} floats, {floats} were asked for");
    }
    if i != iters {
        bail!("it reports {i} iterations, {iters} were asked for");
    }
    if !(median_us.is_finite() && algbw_gb_s.is_finite() && busbw_gb_s.is_finite()) {
        bail!("a number is not finite");
    }
    Ok(Allreduce {
        rank,
        ranks: n,
        floats: s,
        iters: i,
        median_us,
        algbw_gb_s,
        busbw_gb_s,
    })
}

/// perftest's message rate for `size` in operations per second (`MsgRate[Mpps]` · 10⁶).
pub fn message_rate(text: &str, size: u64, iters: Option<u64>) -> Result<f64> {
    Ok(perftest_cell(
        text,
        &Wanted {
            column: "MsgRate",
            unit: "Mpps",
            size,
            iters,
        },
    )?
    .value
        * 1e6)
}

#[cfg(test)]
pub(crate) mod samples {
    //! Real outputs of rdma-core 44 / perftest 4.5 in the SoftRoCE VM (client side, trimmed of
    //! the parameter block only where noted).

    pub const IBV_RC_PINGPONG: &str =
        "  local address:  LID 0x0000, QPN 0x000012, PSN 0xe4dbf5, GID ::ffff:10.0.2.15
  remote address: LID 0x0000, QPN 0x000011, PSN 0xcae1de, GID ::ffff:10.0.2.15
25600 bytes in 0.04 seconds = 5.40 Mbit/sec
200 iters in 0.04 seconds = 189.65 usec/iter
";

    pub const IB_WRITE_LAT: &str = "---------------------------------------------------------------------------------------
                    RDMA_Write Latency Test
 Dual-port       : OFF\t\tDevice         : rxe0
 Number of qps   : 1\t\tTransport type : IB
 Connection type : RC\t\tUsing SRQ      : OFF
 PCIe relax order: OFF
 ibv_wr* API     : OFF
 TX depth        : 1
 Mtu             : 1024[B]
 Link type       : Ethernet
 GID index       : 1
 Max inline data : 0[B]
 rdma_cm QPs\t : OFF
 Data ex. method : Ethernet
---------------------------------------------------------------------------------------
 local address: LID 0000 QPN 0x0014 PSN 0x1a847d RKey 0x0005aa VAddr 0x0055d9776e7000
 GID: 00:00:00:00:00:00:00:00:00:00:255:255:10:00:02:15
 remote address: LID 0000 QPN 0x0013 PSN 0xbe5008 RKey 0x000427 VAddr 0x005608c6380000
 GID: 00:00:00:00:00:00:00:00:00:00:255:255:10:00:02:15
---------------------------------------------------------------------------------------
 #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] 
 2       1000          37.89          2130.75      48.73    \t       94.93       \t206.58 \t\t1505.40 \t\t2130.75
---------------------------------------------------------------------------------------
";

    pub const IB_WRITE_BW: &str =
        "---------------------------------------------------------------------------------------
                    RDMA_Write BW Test
 Dual-port       : OFF\t\tDevice         : rxe0
 TX depth        : 128
 CQ Moderation   : 1
 Mtu             : 1024[B]
---------------------------------------------------------------------------------------
 local address: LID 0000 QPN 0x0015 PSN 0xbd27d8 RKey 0x0006b9 VAddr 0x00558206f27000
 GID: 00:00:00:00:00:00:00:00:00:00:255:255:10:00:02:15
---------------------------------------------------------------------------------------
 #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]
 65536      200              36.08              32.96  \t\t   0.000527
---------------------------------------------------------------------------------------
";

    /// `ib_read_lat` (stderr line included, as in the captured file).
    pub const IB_READ_LAT: &str = "Device not recognized to implement inline feature. Disabling it
---------------------------------------------------------------------------------------
---------------------------------------------------------------------------------------
                    RDMA_Read Latency Test
 Outstand reads  : 128
---------------------------------------------------------------------------------------
---------------------------------------------------------------------------------------
 #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] 
 1024    500          22.19          7713.32      53.48    \t       97.73       \t390.42 \t\t4244.71 \t\t7713.32
---------------------------------------------------------------------------------------
";

    pub const IB_ATOMIC_LAT_FAA: &str = "---------------------------------------------------------------------------------------
                    Atomic FETCH_AND_ADD Latency Test
 Outstand reads  : 128
---------------------------------------------------------------------------------------
 #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] 
 8       500          18.22          9285.62      69.98    \t       2375.72     \t3143.38\t\t8168.93 \t\t9285.62
---------------------------------------------------------------------------------------
";

    /// `ib_write_bw -a -n 50` (several rows).
    pub const IB_WRITE_BW_ALL: &str =
        " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]
 2          50               0.02               0.01   \t\t   0.004524
 1024       50               14.77              14.15  \t\t   0.014491
 65536      50               35.29              34.52  \t\t   0.000552
---------------------------------------------------------------------------------------
";

    /// Our `tools/examples/write_bw.rs` (same table, its own spacing).
    pub const RUST_WRITE_BW: &str =
        "---------------------------------------------------------------------------------------
                    RDMA_Write BW Test
 Device          : rxe0             Port           : 1
 Connection type : RC               Role           : client
 TX depth        : 128
 CQ Moderation   : 100
 Data ex. method : TCP port 20024
---------------------------------------------------------------------------------------
 local address: LID 0x0000 QPN 0x0042 PSN 0x899174
 GID: ::ffff:10.0.2.15
---------------------------------------------------------------------------------------
 #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]
 2                      200               0.05                  0.02        0.011788
---------------------------------------------------------------------------------------
";

    /// Our `tools/examples/read_lat.rs`.
    pub const RUST_READ_LAT: &str = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec]
 2              200          60.15        6577.46            76.27         967.23          1395.48                6036.99                  6577.46
---------------------------------------------------------------------------------------
";

    /// `blockstore client … -q 16 -n 1000 --write-ratio 0`, as its output contract says.
    pub const BLOCKSTORE_READ: &str = "connected to 127.0.0.1:20001: 256 blocks of 4096 B
random: ops 1000 depth 16 IOPS 8123.4 MiB/s 31.73 p50 1850.2 us p99 4012.9 us
sweep: ops 256 depth 16 IOPS 7990.1 MiB/s 31.21 p50 1901.0 us p99 3999.0 us
VERIFIED: every byte of 1256 blocks read checked out
";

    /// `ib_read_bw -s 4096 -t 16 -n 1000` (table only).
    pub const IB_READ_BW_4K: &str =
        " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]
 4096       1000             35.10              33.41  		   0.008553
---------------------------------------------------------------------------------------
";

    /// One rank of `allreduce --ranks 3 -s 49152 -n 50`, as its output contract says.
    pub const ALLREDUCE_RANK: &str = "rank 2 of 3: 49152 floats, 50 iterations, median 10480.3 us
algbw 0.019 GB/s  busbw 0.025 GB/s
VERIFIED: every element of 50 iterations is the exact sum
";

    /// `ib_atomic_lat -A CAS`: refused (perftest wants CMP_AND_SWAP).
    pub const IB_ATOMIC_LAT_BAD_ARG: &str =
        " Invalid Atomic type! please choose from {CMP_AND_SWAP,FETCH_AND_ADD}\n";
}

#[cfg(test)]
mod tests {
    use super::samples::*;
    use super::*;

    fn lat(size: u64, iters: u64) -> Wanted<'static> {
        Wanted {
            column: "t_typical",
            unit: "usec",
            size,
            iters: Some(iters),
        }
    }

    fn bw(size: u64, iters: u64) -> Wanted<'static> {
        Wanted {
            column: "BW average",
            unit: "MB/sec",
            size,
            iters: Some(iters),
        }
    }

    #[test]
    fn perftest_latency_header_has_nine_named_columns() {
        let t = tables(IB_WRITE_LAT);
        assert_eq!(t.len(), 1);
        assert_eq!(
            t[0].columns,
            [
                "#bytes",
                "#iterations",
                "t_min[usec]",
                "t_max[usec]",
                "t_typical[usec]",
                "t_avg[usec]",
                "t_stdev[usec]",
                "99% percentile[usec]",
                "99.9% percentile[usec]"
            ]
        );
        assert_eq!(t[0].rows.len(), 1);
        assert_eq!(t[0].column("99.9% percentile"), Some(8));
        assert_eq!(t[0].rows[0][8], 2130.75);
    }

    #[test]
    fn perftest_latencies() {
        assert_eq!(perftest_value(IB_WRITE_LAT, &lat(2, 1000)).unwrap(), 48.73);
        assert_eq!(perftest_value(IB_READ_LAT, &lat(1024, 500)).unwrap(), 53.48);
        assert_eq!(
            perftest_value(IB_ATOMIC_LAT_FAA, &lat(8, 500)).unwrap(),
            69.98
        );
    }

    #[test]
    fn perftest_bandwidth() {
        let t = tables(IB_WRITE_BW);
        assert_eq!(
            t[0].columns,
            [
                "#bytes",
                "#iterations",
                "BW peak[MB/sec]",
                "BW average[MB/sec]",
                "MsgRate[Mpps]"
            ]
        );
        assert_eq!(perftest_value(IB_WRITE_BW, &bw(65536, 200)).unwrap(), 32.96);
        assert_eq!(
            perftest_value(IB_WRITE_BW_ALL, &bw(1024, 50)).unwrap(),
            14.15
        );
        assert_eq!(perftest_value(IB_WRITE_BW_ALL, &bw(2, 50)).unwrap(), 0.01);
    }

    #[test]
    fn small_message_bandwidth_comes_from_the_message_rate() {
        // 0.004524 Mpps · 2 B = 0.008628 MB/s, printed as 0.01
        let v = bandwidth_mb_s(IB_WRITE_BW_ALL, 2, Some(50)).unwrap();
        assert!((v - 0.004524 * 2.0 * 1e6 / 1048576.0).abs() < 1e-12, "{v}");
        // 1024 B: 0.014491 Mpps → 14.1514, printed 14.15: MsgRate is still the finer one
        let v = bandwidth_mb_s(IB_WRITE_BW_ALL, 1024, Some(50)).unwrap();
        assert!((v - 14.15).abs() < 0.005 && v != 14.15, "{v}");
        // 64 KiB: MsgRate has 3 significant digits only, the printed BW is finer
        assert_eq!(
            bandwidth_mb_s(IB_WRITE_BW, 65536, Some(200)).unwrap(),
            32.96
        );
        // a MsgRate that disagrees with the BW (other units) is not used
        let odd = " #bytes #iterations BW peak[MB/sec] BW average[MB/sec] MsgRate[Mpps]\n 2 100 0.50 0.40 0.900000\n";
        assert_eq!(bandwidth_mb_s(odd, 2, Some(100)).unwrap(), 0.40);
        // no MsgRate column: the printed BW
        let bare = "#bytes #iterations BW average[MB/sec]\n2 100 0.40\n";
        assert_eq!(bandwidth_mb_s(bare, 2, Some(100)).unwrap(), 0.40);
    }

    #[test]
    fn our_tools_tables_parse_like_perftests() {
        assert_eq!(perftest_value(RUST_READ_LAT, &lat(2, 200)).unwrap(), 76.27);
        let t = tables(RUST_WRITE_BW);
        assert_eq!(t[0].columns, tables(IB_WRITE_BW)[0].columns);
        let v = bandwidth_mb_s(RUST_WRITE_BW, 2, Some(200)).unwrap();
        assert!((v - 0.011788 * 2.0 * 1e6 / 1048576.0).abs() < 1e-12, "{v}");
    }

    #[test]
    fn rounding_of_printed_numbers() {
        assert_eq!(half_ulp("0.01"), 0.005);
        assert_eq!(half_ulp("0.004524"), 0.0000005);
        assert_eq!(half_ulp("12"), 0.5);
    }

    #[test]
    fn mismatches_are_errors_not_guesses() {
        let e = perftest_value(IB_WRITE_LAT, &lat(64, 1000)).unwrap_err();
        assert!(e.to_string().contains("no row for 64 bytes"), "{e}");
        let e = perftest_value(IB_WRITE_LAT, &lat(2, 500)).unwrap_err();
        assert!(e.to_string().contains("1000 iterations"), "{e}");
        let e = perftest_value(IB_WRITE_BW, &lat(65536, 200)).unwrap_err();
        assert!(e.to_string().contains("no `t_typical` column"), "{e}");
        let e = perftest_value(IB_ATOMIC_LAT_BAD_ARG, &lat(8, 500)).unwrap_err();
        assert!(e.to_string().contains("no result table"), "{e}");
        let gbit = " #bytes #iterations BW peak[Gb/sec] BW average[Gb/sec] MsgRate[Mpps]\n 4096 10 1.0 0.5 0.01\n";
        let e = perftest_value(gbit, &bw(4096, 10)).unwrap_err();
        assert!(e.to_string().contains("expected MB/sec"), "{e}");
    }

    #[test]
    fn other_spacings_parse_the_same() {
        // single spaces everywhere: the units delimit the names
        let single = "#bytes #iterations t_min[usec] t_max[usec] t_typical[usec] t_avg[usec] t_stdev[usec] 99% percentile[usec] 99.9% percentile[usec]\n64 1000 1.0 9.0 2.5 3.0 0.5 8.0 9.0\n";
        assert_eq!(perftest_value(single, &lat(64, 1000)).unwrap(), 2.5);
        // no units, names with spaces: split at the wide gaps
        let gaps = " #bytes   #iterations   t_min   t_max   t_typical   t_avg   t_stdev   99% percentile   99.9% percentile\n 64   1000   1.0   9.0   2.5   3.0   0.5   8.0   9.0\n";
        let t = tables(gaps);
        assert_eq!(t[0].columns[7], "99% percentile");
        assert_eq!(perftest_value(gaps, &lat(64, 1000)).unwrap(), 2.5);
        // tabs only, a blank line before the row, and a second table: the last one counts
        let tabs = "#bytes\t#iterations\tBW peak[MB/sec]\tBW average[MB/sec]\tMsgRate[Mpps]\n\n2\t5000\t0.5\t0.4\t0.2\n--\n#bytes\t#iterations\tBW peak[MB/sec]\tBW average[MB/sec]\tMsgRate[Mpps]\n2\t5000\t0.7\t0.6\t0.3\n";
        assert_eq!(tables(tabs).len(), 2);
        assert_eq!(perftest_value(tabs, &bw(2, 5000)).unwrap(), 0.6);
        // perftest prints `-nan` for t_stdev sometimes (seen at 64 KiB under load)
        let nan = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] \n 65536   500          950.44         401360.95      4188.82  \t       13671.09     \t-nan   \t\t216256.13 \t\t401360.95\n";
        assert_eq!(perftest_value(nan, &lat(65536, 500)).unwrap(), 4188.82);
    }

    #[test]
    fn normalized_names() {
        assert_eq!(normalize("t_typical[usec]"), "ttypical");
        assert_eq!(normalize("BW average[MB/sec]"), "bwaverage");
        assert_eq!(normalize("99.9% percentile[usec]"), "99.9%percentile");
        assert_eq!(unit("BW average[MB/sec]"), Some("MB/sec"));
        assert_eq!(unit("#bytes"), None);
    }

    #[test]
    fn blockstore_lines() {
        let p = blockstore_phase(BLOCKSTORE_READ, "random", 1000, 16).unwrap();
        assert_eq!(p.iops, 8123.4);
        assert_eq!((p.mib_s, p.p50_us, p.p99_us), (31.73, 1850.2, 4012.9));
        assert_eq!(
            blockstore_phase(BLOCKSTORE_READ, "sweep", 256, 16)
                .unwrap()
                .iops,
            7990.1
        );
        let e = blockstore_phase(BLOCKSTORE_READ, "mixed", 1000, 16).unwrap_err();
        assert!(e.to_string().contains("no `mixed:` line"), "{e}");
        let e = blockstore_phase(BLOCKSTORE_READ, "random", 500, 16).unwrap_err();
        assert!(e.to_string().contains("1000 operations"), "{e}");
        let e = blockstore_phase(BLOCKSTORE_READ, "random", 1000, 1).unwrap_err();
        assert!(e.to_string().contains("queue depth 16"), "{e}");
        let garbled = BLOCKSTORE_READ.replace("IOPS 8123.4", "IOPS nan?");
        assert!(blockstore_phase(&garbled, "random", 1000, 16).is_err());
    }

    /// A run that does not say VERIFIED is a failure, never a number: the client printed its
    /// phase lines, then found a bad byte.
    #[test]
    fn unverified_outputs_give_no_number() {
        let bad = BLOCKSTORE_READ.replace(
            "VERIFIED: every byte of 1256 blocks read checked out",
            "MISMATCH: block 17 holds generation 3, expected 4",
        );
        let e = blockstore_phase(&bad, "random", 1000, 16).unwrap_err();
        assert!(e.to_string().contains("no `VERIFIED` line"), "{e}");
        let bad = ALLREDUCE_RANK.replace("VERIFIED: every", "element 7 is 5, expected 6; every");
        let e = allreduce(&bad, 3, 49152, 50).unwrap_err();
        assert!(e.to_string().contains("no `VERIFIED` line"), "{e}");
        // a word containing it elsewhere is not the line
        assert!(!verified("NOT VERIFIED\n"));
        assert!(verified("x\n  VERIFIED\n"));
    }

    #[test]
    fn allreduce_lines() {
        let a = allreduce(ALLREDUCE_RANK, 3, 49152, 50).unwrap();
        assert_eq!((a.rank, a.ranks, a.floats, a.iters), (2, 3, 49152, 50));
        assert_eq!(
            (a.median_us, a.algbw_gb_s, a.busbw_gb_s),
            (10480.3, 0.019, 0.025)
        );
        for (r, s, i, what) in [
            (4, 49152, 50, "3 ranks"),
            (3, 1024, 50, "49152 floats"),
            (3, 49152, 20, "50 iterations"),
        ] {
            let e = allreduce(ALLREDUCE_RANK, r, s, i).unwrap_err();
            assert!(e.to_string().contains(what), "{e}");
        }
        let no_bw = "rank 0 of 3: 49152 floats, 50 iterations, median 1.0 us\nVERIFIED\n";
        assert!(allreduce(no_bw, 3, 49152, 50)
            .unwrap_err()
            .to_string()
            .contains("algbw"));
    }

    #[test]
    fn perftest_message_rate() {
        let v = message_rate(IB_READ_BW_4K, 4096, Some(1000)).unwrap();
        assert!((v - 8553.0).abs() < 1e-6, "{v}");
        assert!(message_rate(IB_READ_BW_4K, 4096, Some(999)).is_err());
        assert!(message_rate(IB_WRITE_LAT, 2, Some(1000)).is_err());
    }

    #[test]
    fn pingpong_summary() {
        let p = pingpong(IBV_RC_PINGPONG).unwrap();
        assert_eq!(p.iters, 200);
        assert_eq!(p.usec_per_iter, 189.65);
        assert_eq!(p.mbit_per_sec, Some(5.40));
        assert!(pingpong("IB device nosuchdev not found\n").is_err());
        assert!(pingpong("").is_err());
    }
}
