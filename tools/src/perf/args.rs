//! Command-line options shared by the tools (perftest's names where they
//! exist) and their validation into a [`Config`].

use std::time::Duration;

use clap::Args;

use super::{stats, Result};

/// Options every tool takes.
#[derive(Args, Debug, Clone)]
pub struct CommonArgs {
    /// Server to connect to. Without it this process is the server and
    /// waits for a client.
    pub host: Option<String>,
    /// RDMA device (default: the first device found).
    #[arg(short = 'd', long = "ib-dev", value_name = "DEV")]
    pub device: Option<String>,
    /// Port of the device (default: its first active port).
    #[arg(short = 'i', long = "ib-port", value_name = "PORT")]
    pub ib_port: Option<u8>,
    /// GID index (default: on RoCE the port's RoCE v2 GID with a non-link-local IPv4 address, else its first valid GID; 0 on InfiniBand).
    #[arg(short = 'x', long = "gid-index", value_name = "INDEX")]
    pub gid_index: Option<u8>,
    /// Message size in bytes (suffixes K, M accepted).
    #[arg(short = 's', long = "size", value_parser = parse_size, value_name = "BYTES")]
    pub size: Option<u64>,
    /// Number of iterations (exchanges or messages) per size.
    #[arg(short = 'n', long = "iters", value_name = "N")]
    pub iters: Option<u64>,
    /// Sweep all sizes 2 B, 4 B, … up to --max-size (default 8 MiB).
    #[arg(short = 'a', long = "all")]
    pub all: bool,
    /// Largest size of the -a sweep.
    #[arg(long = "max-size", value_parser = parse_size, default_value = "8M", value_name = "BYTES")]
    pub max_size: u64,
    /// Send messages up to this size inline (copied into the work request).
    #[arg(short = 'I', long = "inline_size", value_parser = parse_size, value_name = "BYTES")]
    pub inline: Option<u64>,
    /// Send queue depth: requests outstanding at once.
    #[arg(short = 't', long = "tx-depth", value_name = "N")]
    pub tx_depth: Option<u32>,
    /// Sleep on a completion channel instead of busy-polling the CQ.
    #[arg(short = 'e', long = "events")]
    pub events: bool,
    /// TCP port for the out-of-band exchange.
    #[arg(
        short = 'p',
        long = "port",
        default_value_t = 18515,
        value_name = "PORT"
    )]
    pub tcp_port: u16,
    /// Path MTU in bytes (default: the port's active MTU; the smaller of
    /// both sides' is used).
    #[arg(short = 'm', long = "mtu", value_name = "BYTES")]
    pub mtu: Option<u32>,
    /// Longest wait, in seconds, for anything the peer should do promptly
    /// (connecting, each handshake step, each completion or remote write).
    #[arg(long = "timeout", default_value_t = 30.0, value_name = "SECS")]
    pub timeout: f64,
}

/// Options of the bandwidth tools.
#[derive(Args, Debug, Clone)]
pub struct BwArgs {
    /// CQ moderation: request a completion every N-th work request (default
    /// 100; the post-list size with -l; 1 for a single size above 8 KiB; at
    /// most the tx depth).
    #[arg(short = 'Q', long = "cq-mod", value_name = "N")]
    pub cq_mod: Option<u32>,
    /// Post lists of N work requests with one doorbell (iterations must be a
    /// multiple of N).
    #[arg(short = 'l', long = "post_list", default_value_t = 1, value_name = "N")]
    pub post_list: u32,
}

/// Parses `4096`, `64K`, `8M`, `1G` (binary multiples).
pub fn parse_size(s: &str) -> std::result::Result<u64, String> {
    let s = s.trim();
    let (digits, mult) = match s.char_indices().last() {
        Some((i, 'k' | 'K')) => (&s[..i], 1u64 << 10),
        Some((i, 'm' | 'M')) => (&s[..i], 1 << 20),
        Some((i, 'g' | 'G')) => (&s[..i], 1 << 30),
        _ => (s, 1),
    };
    let n: u64 = digits
        .parse()
        .map_err(|e| format!("{s:?} is not a size: {e}"))?;
    n.checked_mul(mult)
        .ok_or_else(|| format!("{s:?} is too large"))
}

/// Per-tool defaults (perftest's).
#[derive(Debug, Clone, Copy)]
pub struct Defaults {
    /// Message size.
    pub size: u64,
    /// Iterations.
    pub iters: u64,
    /// Send queue depth.
    pub tx_depth: u32,
    /// Whether -a is allowed (not for atomics).
    pub sweep: bool,
}

/// Latency tools: 2 B, 1000 iterations, depth 1.
pub const LAT: Defaults = Defaults {
    size: 2,
    iters: 1000,
    tx_depth: 1,
    sweep: true,
};

/// `write_bw`: 64 KiB, 5000 iterations, depth 128.
pub const BW: Defaults = Defaults {
    size: 65536,
    iters: 5000,
    tx_depth: 128,
    sweep: true,
};

/// `read_bw`, `send_bw`: as [`BW`] with 1000 iterations.
pub const BW_1000: Defaults = Defaults { iters: 1000, ..BW };

/// Atomics: 8 B, 1000 iterations, depth 1.
pub const ATOMIC: Defaults = Defaults {
    size: 8,
    iters: 1000,
    tx_depth: 1,
    sweep: false,
};

/// Default CQ moderation of the bandwidth tools.
pub const DEFAULT_CQ_MOD: u32 = 100;

/// Above this size a single-size run signals every request unless -Q is
/// given (perftest's rule).
pub const CQ_MOD_SIZE_LIMIT: u64 = 8192;

/// Largest message (rxe's and most HCAs' `max_msg_sz` is 2 GiB; the sweep
/// stops at 8 MiB as perftest's).
pub const MAX_MESSAGE: u64 = 1 << 31;

/// Validated settings of a run.
#[derive(Debug, Clone)]
pub struct Config {
    /// Server address (client role) or `None` (server role).
    pub host: Option<String>,
    /// Device name.
    pub device: Option<String>,
    /// Device port.
    pub ib_port: Option<u8>,
    /// GID index.
    pub gid_index: Option<u8>,
    /// Message sizes, ascending.
    pub sizes: Vec<u64>,
    /// Iterations per size.
    pub iters: u64,
    /// Inline threshold (0: never).
    pub inline: u32,
    /// Send queue depth.
    pub tx_depth: u32,
    /// CQ moderation (1 for the latency tools).
    pub cq_mod: u32,
    /// Post list size (1 for the latency tools).
    pub post_list: u32,
    /// Completion events instead of busy polling.
    pub events: bool,
    /// TCP port.
    pub tcp_port: u16,
    /// Path MTU in bytes.
    pub mtu: Option<u32>,
    /// Bound on every prompt wait.
    pub timeout: Duration,
    /// Whether the user gave -Q.
    pub cq_mod_requested: bool,
}

impl Config {
    /// Validates the options with the tool's defaults.
    pub fn new(c: &CommonArgs, bw: Option<&BwArgs>, d: Defaults) -> Result<Config> {
        let iters = c.iters.unwrap_or(d.iters);
        if iters < 2 {
            return Err("-n/--iters must be at least 2".into());
        }
        let size = c.size.unwrap_or(d.size);
        if !d.sweep {
            if c.all || c.size.is_some_and(|s| s != d.size) {
                return Err(
                    format!("the message size of this test is fixed at {} bytes", d.size).into(),
                );
            }
        } else if c.all {
            if c.max_size < 2 || c.max_size > MAX_MESSAGE {
                return Err(format!("--max-size must be in 2..={MAX_MESSAGE}").into());
            }
        } else if size == 0 || size > MAX_MESSAGE {
            return Err(format!("-s/--size must be in 1..={MAX_MESSAGE}").into());
        }
        let sizes = stats::sizes(c.all && d.sweep, size, c.max_size);
        let tx_depth = c.tx_depth.unwrap_or(d.tx_depth);
        if tx_depth == 0 || tx_depth > 1 << 16 {
            return Err("-t/--tx-depth must be in 1..=65536".into());
        }
        let inline = c.inline.unwrap_or(0);
        let inline = u32::try_from(inline).map_err(|_| "-I/--inline_size is too large")?;
        if let Some(m) = c.mtu {
            if !matches!(m, 256 | 512 | 1024 | 2048 | 4096) {
                return Err("-m/--mtu must be 256, 512, 1024, 2048 or 4096".into());
            }
        }
        if !(c.timeout > 0.0 && c.timeout <= 86_400.0) {
            return Err("--timeout must be in (0, 86400] seconds".into());
        }
        let (mut cq_mod, mut post_list, mut requested) = (1, 1, false);
        if let Some(b) = bw {
            post_list = b.post_list;
            if post_list == 0 || post_list > tx_depth {
                return Err(
                    format!("-l/--post_list must be in 1..={tx_depth} (the tx depth)").into(),
                );
            }
            if iters % u64::from(post_list) != 0 {
                return Err(
                    "the number of iterations must be a multiple of the post list size".into(),
                );
            }
            requested = b.cq_mod.is_some();
            cq_mod = match b.cq_mod {
                Some(0) => return Err("-Q/--cq-mod must be at least 1".into()),
                Some(q) if post_list > 1 && post_list % q != 0 => {
                    return Err("the post list size must be a multiple of the CQ moderation".into())
                }
                Some(q) => q,
                None if post_list > 1 => post_list,
                // As perftest: no moderation by default for one large size
                // (it would distort the peak).
                None if !c.all && !c.events && size > CQ_MOD_SIZE_LIMIT => 1,
                None => DEFAULT_CQ_MOD,
            };
            cq_mod = cq_mod.min(tx_depth);
        }
        Ok(Config {
            host: c.host.clone(),
            device: c.device.clone(),
            ib_port: c.ib_port,
            gid_index: c.gid_index,
            sizes,
            iters,
            inline,
            tx_depth,
            cq_mod,
            post_list,
            events: c.events,
            tcp_port: c.tcp_port,
            mtu: c.mtu,
            timeout: Duration::from_secs_f64(c.timeout),
            cq_mod_requested: requested,
        })
    }

    /// Whether this process is the server.
    pub fn is_server(&self) -> bool {
        self.host.is_none()
    }

    /// The largest message size of the run.
    pub fn max_size(&self) -> u64 {
        self.sizes.iter().copied().max().unwrap_or(1)
    }

    /// How long a passive side may wait for the active side to finish one
    /// size: the prompt timeout plus 10 ms per iteration plus the data at
    /// 1 MB/s (a slower peer is treated as dead).
    pub fn run_bound(&self, size: u64) -> Duration {
        let per_iter = 0.010 + size as f64 / 1e6;
        self.timeout + Duration::from_secs_f64((self.iters as f64 * per_iter).min(1e7))
    }
}
