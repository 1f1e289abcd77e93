//! Port and hardware counters, read from sysfs.
//!
//! The kernel publishes a port's counters as one decimal number per file:
//! `/sys/class/infiniband/DEV/ports/P/counters/` holds the IBA
//! PortCounters (the performance-management attributes, where the device
//! implements them) and `hw_counters/` the driver's own (rxe: packets sent
//! and received, retries, RNR and sequence NAKs, …). No verb reads them:
//! this is plain file I/O, no call into libibverbs.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

use crate::device::context::Context;
use crate::error::{Error, Result};
use crate::types::PortNumber;

/// Where the kernel publishes the counters of every RDMA device.
const SYSFS_ROOT: &str = "/sys/class/infiniband";

/// Files of `hw_counters/` that are settings, not counters (`lifespan`:
/// how long, in milliseconds, the driver caches the values).
const NOT_COUNTERS: &[&str] = &["lifespan"];

/// Which directory a counter was read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CounterSource {
    /// `ports/P/counters/`: the IBA PortCounters (names as in sysfs,
    /// `port_xmit_packets`, …).
    Standard,
    /// `ports/P/hw_counters/`: the driver's own counters (rxe:
    /// `sent_pkts`, `rcvd_pkts`, `rcvd_rnr_err`, …).
    Hardware,
}

/// A snapshot of one port's counters (`counters/` and `hw_counters/`),
/// every value as read, by name.
///
/// The accessors name the common ones, each with its unit; [`get`](Self::get)
/// and [`iter`](Self::iter) reach every counter the kernel publishes. A
/// counter the device does not publish is `None`, never 0. Take one
/// snapshot before and one after, and [`delta`](Self::delta) says what
/// changed.
///
/// Values are cumulative since the driver started (rxe: since the link
/// was added). The IBA PortCounters of `counters/` are 32 or 64 bits wide
/// and stop at their maximum instead of wrapping; `hw_counters/` are 64
/// bits. Drivers may cache `hw_counters/` for `lifespan` milliseconds
/// (10 by default), so a snapshot taken right after traffic may not yet
/// show all of it.
///
/// # References
/// The kernel's `Documentation/ABI/stable/sysfs-class-infiniband`
/// (`ports/<port-num>/counters/`, `hw_counters/`); IBA vol. 1, 16.1.3.5
/// (PortCounters).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortCounters {
    port: PortNumber,
    standard: BTreeMap<String, u64>,
    hardware: BTreeMap<String, u64>,
}

impl Context {
    /// Reads `port`'s counters from sysfs: every readable file of
    /// `/sys/class/infiniband/DEV/ports/P/counters/` and `hw_counters/`.
    ///
    /// Either directory may be missing (rxe publishes no `counters/`: it
    /// has no performance-management agent); a file the driver refuses to
    /// read (some do for counters they lack) or that holds no number is
    /// left out. The files are read one by one, so a snapshot taken during
    /// traffic is not atomic.
    ///
    /// # Errors
    /// [`Error::Sysfs`] with the path when the port has no directory
    /// (`ports/P`: no such port, or no sysfs) or a counters directory
    /// cannot be listed for another reason than being absent.
    ///
    /// # References
    /// The kernel's `Documentation/ABI/stable/sysfs-class-infiniband`;
    /// `rdma statistic show` (iproute2) reads the same counters through
    /// netlink.
    ///
    /// # Example
    /// ```no_run
    /// # fn demo(ctx: &rdma_verbs::Context, port: rdma_verbs::PortNumber) -> rdma_verbs::Result<()> {
    /// let before = ctx.port_counters(port)?;
    /// // ... traffic ...
    /// let moved = ctx.port_counters(port)?.delta(&before);
    /// println!("{:?} packets sent", moved.packets_sent());
    /// # Ok(()) }
    /// ```
    #[doc(alias = "hw_counters")]
    #[doc(alias = "rdma statistic")]
    pub fn port_counters(&self, port: PortNumber) -> Result<PortCounters> {
        PortCounters::read_from(Path::new(SYSFS_ROOT), self.name(), port)
    }
}

impl PortCounters {
    /// Reads the counters of `device`'s `port` under `root` (the sysfs
    /// class directory; a temporary tree in unit tests).
    pub(crate) fn read_from(root: &Path, device: &str, port: PortNumber) -> Result<PortCounters> {
        let dir = port_dir(root, device, port);
        if let Err(io) = std::fs::metadata(&dir) {
            return Err(Error::Sysfs { path: dir, io });
        }
        Ok(PortCounters {
            port,
            standard: read_counter_dir(&dir.join("counters"))?,
            hardware: read_counter_dir(&dir.join("hw_counters"))?,
        })
    }

    /// The port these counters are of.
    pub fn port(&self) -> PortNumber {
        self.port
    }

    /// The counter `name` of `source`, as read.
    pub fn get_from(&self, source: CounterSource, name: &str) -> Option<u64> {
        self.map(source).get(name).copied()
    }

    /// The counter `name`, looked up in `counters/` first, then in
    /// `hw_counters/` (no name is in both on rxe or mlx5).
    pub fn get(&self, name: &str) -> Option<u64> {
        self.get_from(CounterSource::Standard, name)
            .or_else(|| self.get_from(CounterSource::Hardware, name))
    }

    /// Every counter: `counters/` first, then `hw_counters/`, each by name.
    pub fn iter(&self) -> impl Iterator<Item = (CounterSource, &str, u64)> + '_ {
        fn side(
            source: CounterSource,
            map: &BTreeMap<String, u64>,
        ) -> impl Iterator<Item = (CounterSource, &str, u64)> + '_ {
            map.iter()
                .map(move |(name, value)| (source, name.as_str(), *value))
        }
        side(CounterSource::Standard, &self.standard)
            .chain(side(CounterSource::Hardware, &self.hardware))
    }

    /// How many counters were read.
    pub fn len(&self) -> usize {
        self.standard.len() + self.hardware.len()
    }

    /// Whether no counter was read (neither directory had one).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// What changed since `before` (a snapshot of the same port): each
    /// counter of `self` minus its value in `before`. A counter absent
    /// from `before` keeps its value; one that went down (the driver was
    /// reset, or a PortCounter was cleared) gives 0, never a wrapped
    /// number. The result has `self`'s names and port.
    pub fn delta(&self, before: &PortCounters) -> PortCounters {
        let diff = |now: &BTreeMap<String, u64>, then: &BTreeMap<String, u64>| {
            now.iter()
                .map(|(name, v)| {
                    let base = then.get(name).copied().unwrap_or(0);
                    (name.clone(), v.saturating_sub(base))
                })
                .collect()
        };
        PortCounters {
            port: self.port,
            standard: diff(&self.standard, &before.standard),
            hardware: diff(&self.hardware, &before.hardware),
        }
    }

    /// Packets sent: `port_xmit_packets` of `counters/`, else the
    /// driver's `sent_pkts` (rxe). Unit: packets.
    pub fn packets_sent(&self) -> Option<u64> {
        self.get_from(CounterSource::Standard, "port_xmit_packets")
            .or_else(|| self.get_from(CounterSource::Hardware, "sent_pkts"))
    }

    /// Packets received: `port_rcv_packets` of `counters/`, else the
    /// driver's `rcvd_pkts` (rxe). Unit: packets.
    pub fn packets_received(&self) -> Option<u64> {
        self.get_from(CounterSource::Standard, "port_rcv_packets")
            .or_else(|| self.get_from(CounterSource::Hardware, "rcvd_pkts"))
    }

    /// Bytes sent: `port_xmit_data` of `counters/`, which counts in units
    /// of 4 octets, times 4. Unit: bytes. `None` where the device has no
    /// PortCounters (rxe).
    pub fn bytes_sent(&self) -> Option<u64> {
        self.get_from(CounterSource::Standard, "port_xmit_data")
            .map(|words| words.saturating_mul(4))
    }

    /// Bytes received: `port_rcv_data` of `counters/` (4-octet units)
    /// times 4. Unit: bytes. `None` where the device has no PortCounters.
    pub fn bytes_received(&self) -> Option<u64> {
        self.get_from(CounterSource::Standard, "port_rcv_data")
            .map(|words| words.saturating_mul(4))
    }

    /// Received packets with errors (`port_rcv_errors` of `counters/`).
    /// Unit: packets.
    pub fn receive_errors(&self) -> Option<u64> {
        self.get_from(CounterSource::Standard, "port_rcv_errors")
    }

    /// Times a requester resent after a timeout or a sequence NAK: rxe's
    /// `completer_retry_err` (each retry of a send queue), mlx5's
    /// `local_ack_timeout_err`. Unit: retries (events).
    pub fn retries(&self) -> Option<u64> {
        self.get_from(CounterSource::Hardware, "completer_retry_err")
            .or_else(|| self.get_from(CounterSource::Hardware, "local_ack_timeout_err"))
    }

    /// Requests that failed after exhausting their retry count (rxe's
    /// `retry_exceeded_err`, the `RETRY_EXC_ERR` completions). Unit:
    /// events.
    pub fn retries_exceeded(&self) -> Option<u64> {
        self.get_from(CounterSource::Hardware, "retry_exceeded_err")
    }

    /// RNR NAKs received by requesters (rxe's `rcvd_rnr_err`, mlx5's
    /// `rnr_nak_retry_err`): the peer had no receive posted. Unit: NAKs.
    pub fn rnr_naks_received(&self) -> Option<u64> {
        self.get_from(CounterSource::Hardware, "rcvd_rnr_err")
            .or_else(|| self.get_from(CounterSource::Hardware, "rnr_nak_retry_err"))
    }

    /// RNR NAKs sent by responders (rxe's `send_rnr_err`): a request
    /// arrived with no receive posted. Unit: NAKs.
    pub fn rnr_naks_sent(&self) -> Option<u64> {
        self.get_from(CounterSource::Hardware, "send_rnr_err")
    }

    /// Sequence-error NAKs received by requesters (rxe's `rcvd_seq_err`,
    /// mlx5's `packet_seq_err`): the peer saw a gap in the PSNs (a lost
    /// packet). Unit: NAKs.
    pub fn sequence_naks_received(&self) -> Option<u64> {
        self.get_from(CounterSource::Hardware, "rcvd_seq_err")
            .or_else(|| self.get_from(CounterSource::Hardware, "packet_seq_err"))
    }

    /// Requests a responder received out of sequence (rxe's
    /// `out_of_seq_request`, mlx5's `out_of_sequence`). Unit: packets.
    pub fn out_of_sequence(&self) -> Option<u64> {
        self.get_from(CounterSource::Hardware, "out_of_seq_request")
            .or_else(|| self.get_from(CounterSource::Hardware, "out_of_sequence"))
    }

    /// Duplicate requests a responder received (rxe's
    /// `duplicate_request`, mlx5's `duplicate_request`): retransmits that
    /// reached it. Unit: packets.
    pub fn duplicate_requests(&self) -> Option<u64> {
        self.get_from(CounterSource::Hardware, "duplicate_request")
    }

    fn map(&self, source: CounterSource) -> &BTreeMap<String, u64> {
        match source {
            CounterSource::Standard => &self.standard,
            CounterSource::Hardware => &self.hardware,
        }
    }
}

/// `ROOT/DEV/ports/P`.
fn port_dir(root: &Path, device: &str, port: PortNumber) -> PathBuf {
    root.join(device).join("ports").join(port.0.to_string())
}

/// Every counter file of `dir`, by name; an absent directory is empty.
/// Files that cannot be read or hold no number, and the settings in
/// [`NOT_COUNTERS`], are left out.
fn read_counter_dir(dir: &Path) -> Result<BTreeMap<String, u64>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
        Err(io) => {
            return Err(Error::Sysfs {
                path: dir.to_path_buf(),
                io,
            })
        }
    };
    let mut out = BTreeMap::new();
    for entry in entries {
        let entry = entry.map_err(|io| Error::Sysfs {
            path: dir.to_path_buf(),
            io,
        })?;
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        if NOT_COUNTERS.contains(&name.as_str()) {
            continue;
        }
        // Unreadable (a driver refusing a counter it lacks, a
        // subdirectory) or not a number: not a counter of this port.
        if let Some(value) = std::fs::read_to_string(entry.path())
            .ok()
            .and_then(|text| parse_counter(&text))
        {
            out.insert(name, value);
        }
    }
    Ok(out)
}

/// One counter file's value: a decimal number, surrounding whitespace
/// (the trailing newline) allowed; anything else is not a counter.
fn parse_counter(text: &str) -> Option<u64> {
    let text = text.trim();
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

#[cfg(test)]
mod tests;
