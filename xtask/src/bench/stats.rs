//! Order statistics over the rounds of one (tool, size, implementation): every successful run
//! counts, none is dropped.

/// Median, quartiles and range of a sample.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    pub n: usize,
    pub median: f64,
    pub q1: f64,
    pub q3: f64,
    pub min: f64,
    pub max: f64,
}

/// The `p`-quantile (0 ≤ p ≤ 1) of sorted values, interpolating linearly between order
/// statistics (Hyndman & Fan type 7, as R's and NumPy's default).
pub fn quantile(sorted: &[f64], p: f64) -> f64 {
    assert!(!sorted.is_empty(), "quantile of an empty sample");
    let h = (sorted.len() - 1) as f64 * p.clamp(0.0, 1.0);
    let lo = h.floor() as usize;
    let hi = h.ceil() as usize;
    sorted[lo] + (h - lo as f64) * (sorted[hi] - sorted[lo])
}

/// Summary of `values` (NaNs are not expected: parsers return only finite numbers).
pub fn summarize(values: &[f64]) -> Option<Summary> {
    if values.is_empty() {
        return None;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    Some(Summary {
        n: v.len(),
        median: quantile(&v, 0.5),
        q1: quantile(&v, 0.25),
        q3: quantile(&v, 0.75),
        min: v[0],
        max: v[v.len() - 1],
    })
}

impl Summary {
    /// (max − min) / median, as a fraction: the run-to-run spread of this sample.
    pub fn rel_range(&self) -> f64 {
        if self.median == 0.0 {
            return f64::NAN;
        }
        (self.max - self.min) / self.median
    }
}

/// Rust / C of the medians.
pub fn ratio(rust: &Summary, c: &Summary) -> f64 {
    rust.median / c.median
}

/// Resamples behind [`ratio_interval`].
const RESAMPLES: usize = 4000;

/// A 95 % percentile-bootstrap interval of Rust/C (the ratio of medians): both sides resampled
/// with replacement, [`RESAMPLES`] times, by a fixed-seed generator, so a report rebuilt from
/// the same runs shows the same interval. It says how far the same binaries' run-to-run spread
/// alone could move the ratio: a cell whose interval straddles the target is not a result
/// either way. `None` with fewer than 3 runs on a side.
pub fn ratio_interval(rust: &[f64], c: &[f64]) -> Option<(f64, f64)> {
    if rust.len() < 3 || c.len() < 3 {
        return None;
    }
    // splitmix64: small, and good enough to pick indices.
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move |n: usize| {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) % n as u64) as usize
    };
    let mut scratch = Vec::with_capacity(rust.len().max(c.len()));
    let mut resampled_median = |values: &[f64], next: &mut dyn FnMut(usize) -> usize| {
        scratch.clear();
        scratch.extend((0..values.len()).map(|_| values[next(values.len())]));
        scratch.sort_by(f64::total_cmp);
        quantile(&scratch, 0.5)
    };
    let mut ratios: Vec<f64> = (0..RESAMPLES)
        .map(|_| {
            let r = resampled_median(rust, &mut next);
            r / resampled_median(c, &mut next)
        })
        .filter(|r| r.is_finite())
        .collect();
    if ratios.is_empty() {
        return None;
    }
    ratios.sort_by(f64::total_cmp);
    Some((quantile(&ratios, 0.025), quantile(&ratios, 0.975)))
}

/// The same binary against itself: the median of its runs in rounds 2, 3, 6, 7, 10, 11 … over
/// the median of those in rounds 0, 1, 4, 5, 8, 9 … (an A/A comparison at half the rounds each;
/// pairs of rounds, so that each half holds both ABBA positions and an order effect cancels as
/// in Rust/C). How far this lies from 1 is what run-to-run noise alone does to a ratio of
/// medians in this run. `None` with fewer than 4 runs.
pub fn split_half_ratio(values: &[f64]) -> Option<f64> {
    if values.len() < 4 {
        return None;
    }
    let half = |which: usize| {
        let v: Vec<f64> = values
            .iter()
            .enumerate()
            .filter(|(i, _)| (i / 2) % 2 == which)
            .map(|(_, &x)| x)
            .collect();
        summarize(&v).map(|s| s.median)
    };
    let r = half(1)? / half(0)?;
    r.is_finite().then_some(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_half_ratio_compares_pairs_of_rounds() {
        assert_eq!(split_half_ratio(&[1.0, 2.0, 3.0]), None);
        // Rounds 0, 1, 4, 5: 100, 100, 100, 100; rounds 2, 3, 6, 7: 110, 120, 90, 115
        // (median 112.5).
        let r = split_half_ratio(&[100.0, 100.0, 110.0, 120.0, 100.0, 100.0, 90.0, 115.0]).unwrap();
        assert!((r - 1.125).abs() < 1e-12, "{r}");
        // An order effect (every second run 10 % slower) cancels.
        let r = split_half_ratio(&[100.0, 110.0, 100.0, 110.0, 100.0, 110.0, 100.0, 110.0]);
        assert_eq!(r, Some(1.0));
        assert_eq!(split_half_ratio(&[5.0; 8]), Some(1.0));
    }

    #[test]
    fn the_interval_holds_the_ratio_and_narrows_with_agreeing_runs() {
        let c = [100.0, 102.0, 98.0, 101.0, 99.0];
        let (lo, hi) = ratio_interval(&[110.0, 111.0, 109.0, 110.0, 110.5], &c).unwrap();
        assert!(lo <= 1.10 && 1.10 <= hi && hi - lo < 0.06, "{lo}..{hi}");
        let noisy = [80.0, 140.0, 100.0, 120.0, 90.0];
        let (nlo, nhi) = ratio_interval(&noisy, &c).unwrap();
        assert!(nhi - nlo > hi - lo, "noisy runs give a wider interval");
        // Deterministic: the same runs, the same interval.
        assert_eq!(ratio_interval(&noisy, &c), Some((nlo, nhi)));
        assert_eq!(ratio_interval(&[1.0, 2.0], &c), None);
    }

    #[test]
    fn odd_and_even_medians() {
        let s = summarize(&[3.0, 1.0, 2.0]).unwrap();
        assert_eq!((s.n, s.median, s.min, s.max), (3, 2.0, 1.0, 3.0));
        assert_eq!((s.q1, s.q3), (1.5, 2.5));
        let s = summarize(&[4.0, 1.0, 3.0, 2.0]).unwrap();
        assert_eq!(s.median, 2.5);
        assert_eq!((s.q1, s.q3), (1.75, 3.25));
    }

    #[test]
    fn one_value_and_none() {
        let s = summarize(&[7.5]).unwrap();
        assert_eq!(
            (s.median, s.q1, s.q3, s.min, s.max),
            (7.5, 7.5, 7.5, 7.5, 7.5)
        );
        assert_eq!(s.rel_range(), 0.0);
        assert!(summarize(&[]).is_none());
    }

    #[test]
    fn outliers_are_kept_but_do_not_move_the_median() {
        let s = summarize(&[10.0, 10.2, 9.9, 10.1, 500.0]).unwrap();
        assert_eq!(s.median, 10.1);
        assert_eq!(s.max, 500.0);
        assert_eq!(s.n, 5);
    }

    #[test]
    fn ratio_and_range() {
        let c = summarize(&[100.0, 98.0, 102.0]).unwrap();
        let r = summarize(&[103.0, 101.0, 105.0]).unwrap();
        assert!((ratio(&r, &c) - 1.03).abs() < 1e-12);
        assert!((c.rel_range() - 0.04).abs() < 1e-12);
    }

    #[test]
    fn quantile_ends() {
        let v = [1.0, 2.0, 4.0];
        assert_eq!(quantile(&v, 0.0), 1.0);
        assert_eq!(quantile(&v, 1.0), 4.0);
        assert_eq!(quantile(&v, 0.75), 3.0);
    }
}
