//! GIDs, the GID table and choosing an entry of it ([`GidSelector`]).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ibverbs_sys as sys;

use crate::port::{device_enum, PortNumber};

/// A 128-bit Global Identifier: an IPv6 address on RoCE v2, subnet prefix +
/// port GUID on InfiniBand.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// The all-zero GID (an empty table slot).
    pub const ZERO: Gid = Gid([0; 16]);

    /// Whether every byte is zero.
    pub fn is_zero(&self) -> bool {
        self.0 == [0; 16]
    }

    /// The GID as an IPv6 address.
    pub fn to_ipv6(&self) -> Ipv6Addr {
        Ipv6Addr::from(self.0)
    }

    /// The IPv4 address of an IPv4-mapped GID (`::ffff:a.b.c.d`).
    pub fn to_ipv4_mapped(&self) -> Option<Ipv4Addr> {
        self.to_ipv6().to_ipv4_mapped()
    }

    /// Whether the GID is a link-local address: IPv6 `fe80::/10`, or an
    /// IPv4-mapped address in `169.254.0.0/16`. Such a GID reaches only its
    /// own link (RoCE v2 does not route it), and the first one on a RoCE
    /// port (`fe80::` from the netdev's MAC) exists before any IP address
    /// is configured: what [`GidSelector::RoceV2Ipv4`] skips.
    pub fn is_link_local(&self) -> bool {
        match self.to_ipv4_mapped() {
            Some(v4) => v4.is_link_local(),
            None => self.0[0] == 0xfe && self.0[1] & 0xc0 == 0x80,
        }
    }

    /// Subnet prefix (upper 64 bits, host order).
    pub fn subnet_prefix(&self) -> u64 {
        u64::from_be_bytes(self.0[..8].try_into().unwrap())
    }

    /// Interface id (lower 64 bits, host order).
    pub fn interface_id(&self) -> u64 {
        u64::from_be_bytes(self.0[8..].try_into().unwrap())
    }

    pub(crate) fn from_raw(raw: &sys::ibv_gid) -> Gid {
        // SAFETY: every bit pattern of the 16-byte union is a valid `raw` array.
        Gid(unsafe { raw.raw })
    }

    pub(crate) fn to_raw(self) -> sys::ibv_gid {
        sys::ibv_gid { raw: self.0 }
    }
}

impl From<Ipv6Addr> for Gid {
    fn from(a: Ipv6Addr) -> Gid {
        Gid(a.octets())
    }
}

impl From<Ipv4Addr> for Gid {
    /// The IPv4-mapped GID used by RoCE v2 for IPv4 addresses.
    fn from(a: Ipv4Addr) -> Gid {
        Gid(a.to_ipv6_mapped().octets())
    }
}

impl std::fmt::Display for Gid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.to_ipv6().fmt(f)
    }
}

impl std::fmt::Debug for Gid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Gid({})", self.to_ipv6())
    }
}

impl std::str::FromStr for Gid {
    type Err = std::net::AddrParseError;
    /// Parses IPv6 text (`fe80::1`, `::ffff:10.0.2.15`) or a bare IPv4 address.
    fn from_str(s: &str) -> Result<Gid, Self::Err> {
        match s.parse::<Ipv4Addr>() {
            Ok(v4) => Ok(v4.into()),
            Err(_) => s.parse::<Ipv6Addr>().map(Gid::from),
        }
    }
}

/// An index into a port's GID table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GidIndex(pub u8);

device_enum! {
    /// The kind of a GID table entry.
    GidType {
        /// InfiniBand.
        Ib = sys::IBV_GID_TYPE_IB,
        /// RoCE v1 (Ethernet, ethertype 0x8915).
        RoceV1 = sys::IBV_GID_TYPE_ROCE_V1,
        /// RoCE v2 (UDP port 4791; routable).
        RoceV2 = sys::IBV_GID_TYPE_ROCE_V2,
    }
}

/// One valid entry of a port's GID table: its index, GID, type (RoCE v1,
/// RoCE v2 or InfiniBand; [`GidType::Unknown`] for a type this crate does
/// not know) and network device, from [`Context::gid_table`] or
/// [`Context::query_gid_entry`].
///
/// [`Context::gid_table`]: crate::Context::gid_table
/// [`Context::query_gid_entry`]: crate::Context::query_gid_entry
///
/// # References
/// `ibv_query_gid_table(3)`, `ibv_query_gid_ex(3)`
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GidEntry {
    /// The GID.
    pub gid: Gid,
    /// Its index in the table.
    pub index: GidIndex,
    /// The port.
    pub port: PortNumber,
    /// Its kind.
    pub gid_type: GidType,
    /// The kernel index of the network device it belongs to (0 when none).
    pub ndev_ifindex: u32,
}

impl GidEntry {
    pub(crate) fn from_raw(raw: &sys::ibv_gid_entry) -> GidEntry {
        GidEntry {
            gid: Gid::from_raw(&raw.gid),
            index: GidIndex(raw.gid_index as u8),
            port: PortNumber(raw.port_num as u8),
            gid_type: GidType::from_raw(raw.gid_type),
            ndev_ifindex: raw.ndev_ifindex,
        }
    }

    /// The name of the network device the GID belongs to (`eth0`), if any.
    pub fn netdev(&self) -> Option<String> {
        if self.ndev_ifindex == 0 {
            return None;
        }
        let mut buf = [0 as libc::c_char; libc::IF_NAMESIZE];
        // SAFETY: `buf` has the IF_NAMESIZE bytes if_indextoname(3) requires.
        let p = unsafe { libc::if_indextoname(self.ndev_ifindex, buf.as_mut_ptr()) };
        if p.is_null() {
            return None;
        }
        // SAFETY: on success the buffer holds a NUL-terminated name.
        let name = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
        Some(name.to_string_lossy().into_owned())
    }
}

/// Which GID table entry to use: by address, by network device, or the
/// RoCE v2 IPv4 entry every RDMA runtime looks for by hand. Applied with
/// [`Context::select_gid`](crate::Context::select_gid) (reads the table)
/// or [`GidSelector::select`] (over a table already read).
///
/// Only non-empty entries of the port asked for are considered. Where the
/// table holds the same address twice (RoCE v1 and RoCE v2 entries, as
/// mlx5 ports do), the RoCE v2 one is chosen.
///
/// # References
/// `ibv_query_gid_table(3)`; the sysfs files `ports/P/gid_attrs/types/I` and
/// `ports/P/gid_attrs/ndevs/I` that back it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum GidSelector {
    /// The first RoCE v2 entry whose GID is an IPv4-mapped address that is
    /// not link-local (`169.254.0.0/16`): routable RoCE v2 over IPv4, what
    /// `-g`/`-x` usually name by hand.
    RoceV2Ipv4,
    /// [`RoceV2Ipv4`](GidSelector::RoceV2Ipv4) when the port has such an
    /// entry, else its first non-empty entry. What
    /// [`Context::default_gid_index`](crate::Context::default_gid_index)
    /// and the tools use on RoCE when no `-g` is given.
    Automatic,
    /// The entry holding this address: an IPv4 address as its IPv4-mapped
    /// GID (`::ffff:a.b.c.d`), an IPv6 address as itself.
    Address(IpAddr),
    /// [`Automatic`](GidSelector::Automatic) among the entries of this
    /// network device (`eth0`). A name that is no network device matches
    /// nothing.
    Netdev(String),
}

impl std::fmt::Display for GidSelector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GidSelector::RoceV2Ipv4 => {
                f.write_str("RoCE v2 GID with a non-link-local IPv4 address")
            }
            GidSelector::Automatic => f.write_str("non-empty GID"),
            GidSelector::Address(a) => write!(f, "GID with address {a}"),
            GidSelector::Netdev(n) => write!(f, "GID of network device {n:?}"),
        }
    }
}

/// A [`GidSelector`] with its network device name resolved to an ifindex,
/// so that choosing is pure (no system calls): see [`pick`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Want {
    RoceV2Ipv4,
    Automatic,
    Address(Gid),
    /// An ifindex; 0 (no such device) matches nothing, not the entries
    /// without a device.
    Netdev(u32),
}

/// Whether `e` is a routable RoCE v2 IPv4 entry.
fn is_roce_v2_ipv4(e: &GidEntry) -> bool {
    e.gid_type == GidType::RoceV2 && e.gid.to_ipv4_mapped().is_some() && !e.gid.is_link_local()
}

/// The first entry of `entries` that satisfies `prefer`, else the first.
fn preferred<'t>(
    entries: impl Iterator<Item = &'t GidEntry>,
    prefer: impl Fn(&GidEntry) -> bool,
) -> Option<&'t GidEntry> {
    let mut first = None;
    for e in entries {
        if prefer(e) {
            return Some(e);
        }
        first = first.or(Some(e));
    }
    first
}

/// The entry of `port` in `table` that `want` names, `None` when none does.
/// Pure: the unit tests run it over synthetic tables.
pub(crate) fn pick(table: &[GidEntry], port: PortNumber, want: Want) -> Option<&GidEntry> {
    let mut valid = table
        .iter()
        .filter(move |e| e.port == port && !e.gid.is_zero());
    match want {
        Want::RoceV2Ipv4 => valid.find(|e| is_roce_v2_ipv4(e)),
        Want::Automatic => preferred(valid, is_roce_v2_ipv4),
        Want::Address(gid) => preferred(valid.filter(|e| e.gid == gid), |e| {
            e.gid_type == GidType::RoceV2
        }),
        Want::Netdev(0) => None,
        Want::Netdev(ifindex) => {
            preferred(valid.filter(|e| e.ndev_ifindex == ifindex), is_roce_v2_ipv4)
        }
    }
}

impl GidSelector {
    /// The entry of `port` in `table` (as [`Context::gid_table`] returns
    /// it, every port's entries) this selector names.
    ///
    /// [`Context::gid_table`]: crate::Context::gid_table
    ///
    /// # Errors
    /// [`Error::NoMatchingGid`](crate::Error::NoMatchingGid) with the port
    /// and this selector when no entry matches.
    pub fn select<'t>(
        &self,
        table: &'t [GidEntry],
        port: PortNumber,
    ) -> crate::Result<&'t GidEntry> {
        pick(table, port, self.want()).ok_or_else(|| crate::Error::NoMatchingGid {
            port,
            wanted: self.clone(),
        })
    }

    /// Resolves a network device name to its ifindex (`if_nametoindex(3)`;
    /// 0 when there is none).
    pub(crate) fn want(&self) -> Want {
        match self {
            GidSelector::RoceV2Ipv4 => Want::RoceV2Ipv4,
            GidSelector::Automatic => Want::Automatic,
            GidSelector::Address(IpAddr::V4(a)) => Want::Address(Gid::from(*a)),
            GidSelector::Address(IpAddr::V6(a)) => Want::Address(Gid::from(*a)),
            GidSelector::Netdev(name) => Want::Netdev(netdev_index(name)),
        }
    }
}

/// The ifindex of network device `name`, 0 when there is none (also for a
/// name with a NUL byte or longer than a device name can be).
fn netdev_index(name: &str) -> u32 {
    let Ok(c) = std::ffi::CString::new(name) else {
        return 0;
    };
    // SAFETY: `c` is a NUL-terminated string that outlives the call.
    unsafe { libc::if_nametoindex(c.as_ptr()) }
}

#[cfg(test)]
mod tests;
