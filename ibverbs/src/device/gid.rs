//! GIDs, the GID table and choosing an entry of it ([`GidSelector`]).

use std::net::IpAddr;

use crate::types::{device_enum, Gid, GidIndex, GidSelector, PortNumber};
use rdma_verbs_sys as sys;

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
    ) -> crate::error::Result<&'t GidEntry> {
        pick(table, port, self.want()).ok_or_else(|| crate::error::Error::NoMatchingGid {
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
