//! Statistics for the perftest-style tools: latency summaries and
//! bandwidth figures. Pure functions on plain numbers.

/// Summary of latency samples, in the samples' unit (the tools use µs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LatencySummary {
    /// Smallest sample.
    pub min: f64,
    /// Largest sample.
    pub max: f64,
    /// Median ("t_typical").
    pub median: f64,
    /// Arithmetic mean.
    pub avg: f64,
    /// Population standard deviation.
    pub stdev: f64,
    /// 99th percentile (nearest rank).
    pub p99: f64,
    /// 99.9th percentile (nearest rank).
    pub p999: f64,
}

/// Median of sorted samples: the middle one, or the mean of the two middle
/// ones for an even count. `None` when empty.
pub fn median(sorted: &[f64]) -> Option<f64> {
    let n = sorted.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(sorted[n / 2]),
        _ => Some((sorted[n / 2 - 1] + sorted[n / 2]) / 2.0),
    }
}

/// Nearest-rank percentile of sorted samples (`p` in 0..=100): the smallest
/// sample such that at least `p` % of all samples are ≤ it. `None` when
/// empty.
pub fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    let n = sorted.len();
    if n == 0 {
        return None;
    }
    // p·n/100, less a rounding error (99.9 % of 1000 must be rank 999, not
    // 999.0000000000001 rounded up).
    let x = p * n as f64 / 100.0;
    let rank = (x - 1e-9 * x.max(1.0)).ceil() as usize;
    Some(sorted[rank.clamp(1, n) - 1])
}

/// Mean and population standard deviation. `None` when empty.
pub fn mean_stdev(samples: &[f64]) -> Option<(f64, f64)> {
    if samples.is_empty() {
        return None;
    }
    let n = samples.len() as f64;
    let mean = samples.iter().sum::<f64>() / n;
    let var = samples.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n;
    Some((mean, var.sqrt()))
}

/// Sorts `samples` in place (NaNs last) and summarises them. `None` when
/// empty.
pub fn summarize(samples: &mut [f64]) -> Option<LatencySummary> {
    samples.sort_by(|a, b| a.total_cmp(b));
    let (avg, stdev) = mean_stdev(samples)?;
    Some(LatencySummary {
        min: samples[0],
        max: samples[samples.len() - 1],
        median: median(samples)?,
        avg,
        stdev,
        p99: percentile(samples, 99.0)?,
        p999: percentile(samples, 99.9)?,
    })
}

/// Latency samples from consecutive post times (perftest's method): sample
/// `i` is `(t[i+1] - t[i]) / divisor` converted from nanoseconds to µs.
/// Ping-pong tools divide by 2 (a round trip is two one-way latencies);
/// RDMA read and atomics by 1. Clears `out` and fills it (reuses its
/// capacity).
pub fn deltas_us(timestamps_ns: &[u64], divisor: f64, out: &mut Vec<f64>) {
    out.clear();
    out.extend(
        timestamps_ns
            .windows(2)
            .map(|w| w[1].saturating_sub(w[0]) as f64 / 1000.0 / divisor),
    );
}

/// Bandwidth results for one message size.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BwSummary {
    /// Best rate over any window of consecutive requests, MB/s (2^20 bytes).
    pub peak_mbps: f64,
    /// Bytes over the whole run, MB/s (2^20 bytes).
    pub avg_mbps: f64,
    /// Messages per second over the whole run, in millions.
    pub msg_rate_mpps: f64,
}

/// One MB as perftest counts it (MiB).
pub const MB: f64 = 1_048_576.0;

/// Bandwidth figures from per-request post and completion times (ns since
/// a common origin; `completed[j]` is when request `j` was known complete,
/// i.e. the time its own or a later signaled completion was polled).
///
/// * average: `n * size` bytes over `completed[n-1] - posted[0]`;
/// * peak: like perftest, the shortest time per message over every window
///   that starts at a post-list boundary (`posted[i]`, `i` a multiple of
///   `post_list`) and ends at a signaled completion (`completed[j]`, `j+1` a
///   multiple of `cq_mod`, or the last request): `(completed[j] -
///   posted[i]) / (j - i + 1)`.
///
/// `None` when the inputs are empty or of different lengths.
pub fn bandwidth(
    size: u64,
    posted: &[u64],
    completed: &[u64],
    post_list: usize,
    cq_mod: usize,
) -> Option<BwSummary> {
    let n = posted.len();
    if n == 0 || completed.len() != n {
        return None;
    }
    let (post_list, cq_mod) = (post_list.max(1), cq_mod.max(1));
    let total_ns = completed[n - 1].saturating_sub(posted[0]).max(1) as f64;
    let avg_mbps = (size as f64 * n as f64) / MB / (total_ns / 1e9);
    let msg_rate_mpps = n as f64 / (total_ns / 1e9) / 1e6;

    let mut best_ns_per_msg = total_ns / n as f64;
    let mut consider = |i: usize, j: usize| {
        let t = completed[j].saturating_sub(posted[i]) as f64 / (j - i + 1) as f64;
        if t > 0.0 && t < best_ns_per_msg {
            best_ns_per_msg = t;
        }
    };
    for i in (0..n).step_by(post_list) {
        // First signaled index at or after i.
        let mut j = (i + 1).div_ceil(cq_mod) * cq_mod - 1;
        while j < n {
            consider(i, j);
            j += cq_mod;
        }
        if n % cq_mod != 0 {
            consider(i, n - 1);
        }
    }
    let peak_mbps = size as f64 / MB / (best_ns_per_msg / 1e9);
    Some(BwSummary {
        peak_mbps,
        avg_mbps,
        msg_rate_mpps,
    })
}

/// Message sizes for a run: `2, 4, …` up to `max` (powers of two) for a
/// sweep, else just `size`.
pub fn sizes(sweep: bool, size: u64, max: u64) -> Vec<u64> {
    if !sweep {
        return vec![size];
    }
    let mut v = Vec::new();
    let mut s = 2u64;
    while s <= max {
        v.push(s);
        s *= 2;
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9 * a.abs().max(b.abs()).max(1.0)
    }

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[7.0]), Some(7.0));
        assert_eq!(median(&[1.0, 2.0, 10.0]), Some(2.0));
        assert_eq!(median(&[1.0, 2.0, 4.0, 10.0]), Some(3.0));
    }

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 99.0), Some(99.0));
        assert_eq!(percentile(&v, 99.9), Some(100.0));
        assert_eq!(percentile(&v, 50.0), Some(50.0));
        assert_eq!(percentile(&v, 100.0), Some(100.0));
        assert_eq!(percentile(&v, 0.0), Some(1.0));
        let w: Vec<f64> = (1..=1000).map(f64::from).collect();
        assert_eq!(percentile(&w, 99.0), Some(990.0));
        assert_eq!(percentile(&w, 99.9), Some(999.0));
        assert_eq!(percentile(&[5.0], 99.9), Some(5.0));
        assert_eq!(percentile(&[], 99.0), None);
    }

    #[test]
    fn mean_and_population_stdev() {
        let (m, s) = mean_stdev(&[2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]).unwrap();
        assert!(close(m, 5.0) && close(s, 2.0), "{m} {s}");
        let (m, s) = mean_stdev(&[3.0]).unwrap();
        assert!(close(m, 3.0) && close(s, 0.0));
        assert_eq!(mean_stdev(&[]), None);
    }

    #[test]
    fn summary_sorts_and_summarises() {
        let mut v = vec![9.0, 1.0, 5.0, 3.0, 7.0];
        let s = summarize(&mut v).unwrap();
        assert_eq!(v, [1.0, 3.0, 5.0, 7.0, 9.0]);
        assert_eq!((s.min, s.max, s.median), (1.0, 9.0, 5.0));
        assert!(close(s.avg, 5.0));
        assert!(close(s.stdev, 8.0f64.sqrt()));
        assert_eq!((s.p99, s.p999), (9.0, 9.0));
        assert_eq!(summarize(&mut []), None);
    }

    #[test]
    fn latency_samples_from_post_times() {
        // Posts at 0, 10 µs, 30 µs, 60 µs.
        let t = [0u64, 10_000, 30_000, 60_000];
        let mut out = Vec::with_capacity(8);
        deltas_us(&t, 2.0, &mut out);
        assert_eq!(out, [5.0, 10.0, 15.0]);
        deltas_us(&t, 1.0, &mut out);
        assert_eq!(out, [10.0, 20.0, 30.0]);
        deltas_us(&t[..1], 1.0, &mut out);
        assert!(out.is_empty());
    }

    #[test]
    fn bandwidth_average_and_peak() {
        // 4 messages of 1 MiB, posted at once, completing 1 ms apart: 4 MiB in
        // 4 ms = 1000 MiB/s on average; the best window is the first message
        // alone (1 MiB in 1 ms), also 1000 MiB/s.
        let mib = 1 << 20;
        let posted = [0u64; 4];
        let completed = [1_000_000u64, 2_000_000, 3_000_000, 4_000_000];
        let b = bandwidth(mib, &posted, &completed, 1, 1).unwrap();
        assert!(close(b.avg_mbps, 1000.0), "{b:?}");
        assert!(close(b.peak_mbps, 1000.0), "{b:?}");
        assert!(close(b.msg_rate_mpps, 0.001), "{b:?}");

        // A slow start: messages 2 and 3 posted late and done quickly. The peak
        // is the window starting at the second post list (message 2): 2 MiB in
        // 1.5 ms = 1333 MiB/s; the average 4 MiB in 5.5 ms.
        let posted = [0u64, 0, 4_000_000, 4_000_000];
        let completed = [4_000_000u64, 4_000_000, 5_000_000, 5_500_000];
        let b = bandwidth(mib, &posted, &completed, 2, 1).unwrap();
        assert!(close(b.avg_mbps, 4.0 / 5.5e-3), "{b:?}");
        assert!(close(b.peak_mbps, 2.0 / 1.5e-3), "{b:?}");

        // CQ moderation 2: only completions 1 and 3 (0-based) end a window.
        let posted = [0u64, 0, 0, 0];
        let completed = [2_000_000u64, 2_000_000, 4_000_000, 4_000_000];
        let b = bandwidth(mib, &posted, &completed, 1, 2).unwrap();
        assert!(close(b.peak_mbps, 1000.0), "{b:?}");

        assert_eq!(bandwidth(1, &[], &[], 1, 1), None);
        assert_eq!(bandwidth(1, &[0], &[1, 2], 1, 1), None);
    }

    #[test]
    fn size_sweep() {
        assert_eq!(sizes(false, 100, 1 << 23), [100]);
        assert_eq!(sizes(true, 100, 64), [2, 4, 8, 16, 32, 64]);
        assert_eq!(sizes(true, 1, 100), [2, 4, 8, 16, 32, 64]);
        assert_eq!(sizes(true, 1, 1 << 23).len(), 23);
    }
}
