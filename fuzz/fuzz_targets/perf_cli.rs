//! The perftest-style tools' command line (`tools/src/perf/args.rs`):
//! `parse_size` round-trips what it accepts, and an argument vector through
//! clap and `Config::new` never panics and yields a configuration within
//! its documented bounds, for every tool's defaults.
//!
//! Input: the argument vector, arguments separated by NUL bytes.
#![no_main]

use rdma_verbs_tools::perf::args;

use args::{BwArgs, CommonArgs, Config, Defaults};
use clap::Parser;
use libfuzzer_sys::fuzz_target;

#[derive(Parser, Debug)]
#[command(name = "perf")]
struct Cli {
    #[command(flatten)]
    common: CommonArgs,
    #[command(flatten)]
    bw: BwArgs,
}

fn check_size(s: &str) {
    let Ok(n) = args::parse_size(s) else { return };
    assert_eq!(args::parse_size(&n.to_string()), Ok(n), "{s:?}");
    let mult = match s.trim().chars().last() {
        Some('k' | 'K') => 1 << 10,
        Some('m' | 'M') => 1 << 20,
        Some('g' | 'G') => 1 << 30,
        _ => 1,
    };
    assert_eq!(n % mult, 0, "{s:?} -> {n}");
}

fn check_config(cfg: &Config, bw: bool, d: Defaults) {
    assert!(!cfg.sizes.is_empty(), "{cfg:?}");
    assert!(cfg.sizes.windows(2).all(|w| w[0] < w[1]), "{cfg:?}");
    assert!(
        cfg.sizes
            .iter()
            .all(|&s| (1..=args::MAX_MESSAGE).contains(&s)),
        "{cfg:?}"
    );
    if !d.sweep {
        assert_eq!(cfg.sizes, [d.size]);
    }
    assert!(cfg.iters >= 2);
    assert!((1..=1 << 16).contains(&cfg.tx_depth), "{cfg:?}");
    assert!(
        cfg.post_list >= 1 && cfg.post_list <= cfg.tx_depth,
        "{cfg:?}"
    );
    assert!(cfg.cq_mod >= 1 && cfg.cq_mod <= cfg.tx_depth, "{cfg:?}");
    assert_eq!(cfg.iters % u64::from(cfg.post_list), 0, "{cfg:?}");
    if !bw {
        assert_eq!((cfg.cq_mod, cfg.post_list), (1, 1));
    }
    assert!(cfg.timeout > std::time::Duration::ZERO);
    assert!(cfg
        .mtu
        .is_none_or(|m| rdma_verbs::device::Mtu::from_bytes(m).is_some()));
    assert_eq!(cfg.max_size(), *cfg.sizes.last().unwrap());
    for &s in &cfg.sizes {
        assert!(cfg.run_bound(s) >= cfg.timeout);
    }
}

fuzz_target!(|data: &[u8]| {
    let args: Vec<String> = data
        .split(|&b| b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    for a in &args {
        check_size(a);
    }
    let argv = std::iter::once("perf".to_string()).chain(args);
    let Ok(cli) = Cli::try_parse_from(argv) else {
        return;
    };
    for d in [args::LAT, args::BW, args::ATOMIC] {
        for bw in [None, Some(&cli.bw)] {
            if let Ok(cfg) = Config::new(&cli.common, bw, d) {
                check_config(&cfg, bw.is_some(), d);
            }
        }
    }
});
