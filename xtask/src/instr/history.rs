//! Reproducibility: every measured configuration's count per operation is
//! kept in `target/instr/history.json` with the time its profile was written,
//! so a run can be compared with the last *separate* measurement of the same
//! configuration (a `--reanalyze` of the same profiles is not a second
//! measurement: same time stamp, not compared).

use std::collections::BTreeMap;

/// Per configuration key: (profile time stamp in seconds, count per operation),
/// oldest first, at most one entry per time stamp.
pub type History = BTreeMap<String, Vec<(u64, f64)>>;

/// How far this run's counts are from the previous measurement of each.
#[derive(Debug, PartialEq)]
pub struct Agreement {
    /// Configurations that had an earlier, separate measurement.
    pub compared: usize,
    /// The largest relative difference and its configuration.
    pub worst: Option<(String, f64)>,
}

/// Records `now` (key, time stamp, per op) in `history` and compares each
/// with the latest earlier entry of a different time stamp.
pub fn record(history: &mut History, now: &[(String, u64, f64)]) -> Agreement {
    let mut compared = 0;
    let mut worst: Option<(String, f64)> = None;
    for (key, stamp, per_op) in now {
        let entries = history.entry(key.clone()).or_default();
        if let Some(&(_, before)) = entries.iter().rev().find(|(s, _)| s != stamp) {
            compared += 1;
            let diff = if before == 0.0 {
                0.0
            } else {
                (per_op - before).abs() / before
            };
            if worst.as_ref().is_none_or(|(_, w)| diff > *w) {
                worst = Some((key.clone(), diff));
            }
        }
        entries.retain(|(s, _)| s != stamp);
        entries.push((*stamp, *per_op));
        // The latest few are enough to compare against.
        let excess = entries.len().saturating_sub(4);
        entries.drain(..excess);
    }
    Agreement { compared, worst }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compares_separate_measurements_only() {
        let mut h = History::new();
        let a = record(&mut h, &[("c".into(), 10, 288.0)]);
        assert_eq!(
            a,
            Agreement {
                compared: 0,
                worst: None
            }
        );
        // The same profiles analysed again: nothing to compare with.
        let a = record(&mut h, &[("c".into(), 10, 288.0)]);
        assert_eq!(a.compared, 0);
        // A new measurement is compared with the previous one.
        let a = record(&mut h, &[("c".into(), 20, 291.0), ("r".into(), 20, 300.0)]);
        assert_eq!(a.compared, 1);
        let (key, w) = a.worst.unwrap();
        assert_eq!(key, "c");
        assert!((w - 3.0 / 288.0).abs() < 1e-12);
        // Re-analysing the newest compares with the one before it.
        let a = record(&mut h, &[("c".into(), 20, 291.0)]);
        assert_eq!(a.compared, 1);
        assert_eq!(h["c"].len(), 2);
    }

    #[test]
    fn keeps_a_bounded_history() {
        let mut h = History::new();
        for s in 0..10 {
            record(&mut h, &[("k".into(), s, 1.0)]);
        }
        assert_eq!(h["k"].len(), 4);
        assert_eq!(h["k"][3].0, 9);
    }
}
