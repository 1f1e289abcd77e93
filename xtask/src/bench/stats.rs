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

#[cfg(test)]
mod tests {
    use super::*;

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
