//! GIDs and the GID table.

use std::net::{Ipv4Addr, Ipv6Addr};

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

/// One valid entry of a port's GID table.
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
