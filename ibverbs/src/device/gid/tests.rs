//! The pure GID selection rules over synthetic tables.

use super::*;
use std::net::Ipv4Addr;

use crate::error::Error;

fn entry(port: u8, index: u8, gid: &str, gid_type: GidType, ndev_ifindex: u32) -> GidEntry {
    GidEntry {
        gid: gid.parse().unwrap(),
        index: GidIndex(index),
        port: PortNumber(port),
        gid_type,
        ndev_ifindex,
    }
}

/// An mlx5-like port 1 (every address as a RoCE v1 and a RoCE v2 entry,
/// link-local first, an empty slot, a second netdev with an IPv4
/// link-local and an IPv6 global address) and a port 2.
fn table() -> Vec<GidEntry> {
    use GidType::*;
    vec![
        entry(1, 0, "fe80::5054:ff:fe12:3456", RoceV1, 2),
        entry(1, 1, "fe80::5054:ff:fe12:3456", RoceV2, 2),
        entry(1, 2, "::ffff:10.0.0.5", RoceV1, 2),
        entry(1, 3, "::ffff:10.0.0.5", RoceV2, 2),
        entry(1, 4, "::", RoceV2, 2),
        entry(1, 5, "::ffff:169.254.3.4", RoceV2, 3),
        entry(1, 6, "2001:db8::5", RoceV2, 3),
        entry(1, 7, "::ffff:10.0.9.9", Unknown(7), 3),
        entry(2, 0, "::ffff:10.0.1.5", RoceV2, 4),
        entry(2, 1, "fe80::1", Ib, 0),
    ]
}

fn index(table: &[GidEntry], port: u8, want: Want) -> Option<u8> {
    pick(table, PortNumber(port), want).map(|e| e.index.0)
}

fn addr(s: &str) -> Want {
    Want::Address(s.parse().unwrap())
}

#[test]
fn roce_v2_ipv4_skips_link_local_v1_empty_and_unknown_types() {
    let t = table();
    assert_eq!(index(&t, 1, Want::RoceV2Ipv4), Some(3));
    assert_eq!(index(&t, 1, Want::Automatic), Some(3));
    assert_eq!(index(&t, 2, Want::RoceV2Ipv4), Some(0));
    // Without index 3, the port's other IPv4 entries are v1, link-local
    // (169.254/16) or of a type this crate does not know: none qualifies.
    let without: Vec<_> = t.iter().filter(|e| e.index.0 != 3).cloned().collect();
    assert_eq!(index(&without, 1, Want::RoceV2Ipv4), None);
    // Automatic then takes the first non-empty entry.
    assert_eq!(index(&without, 1, Want::Automatic), Some(0));
}

#[test]
fn rxe_like_table_picks_the_ipv4_entry_not_the_link_local_one() {
    // rxe: RoCE v2 only, fe80:: at 0, the IPv4-mapped address at 1.
    let t = vec![
        entry(1, 0, "fe80::5054:ff:fe12:3456", GidType::RoceV2, 2),
        entry(1, 1, "::ffff:10.0.2.15", GidType::RoceV2, 2),
    ];
    assert_eq!(index(&t, 1, Want::Automatic), Some(1));
    assert_eq!(index(&t, 1, Want::RoceV2Ipv4), Some(1));
    // Only the link-local entry: RoceV2Ipv4 refuses, Automatic takes it.
    assert_eq!(index(&t[..1], 1, Want::RoceV2Ipv4), None);
    assert_eq!(index(&t[..1], 1, Want::Automatic), Some(0));
}

#[test]
fn automatic_skips_leading_empty_entries() {
    let t = vec![
        entry(1, 0, "::", GidType::RoceV2, 0),
        entry(1, 1, "fe80::1", GidType::RoceV1, 2),
    ];
    assert_eq!(index(&t, 1, Want::Automatic), Some(1));
    assert_eq!(index(&t[..1], 1, Want::Automatic), None);
    assert_eq!(index(&[], 1, Want::Automatic), None);
}

#[test]
fn address_matches_v4_as_mapped_prefers_v2_and_stays_on_its_port() {
    let t = table();
    let v4 = |s: &str| Want::Address(Gid::from(s.parse::<Ipv4Addr>().unwrap()));
    assert_eq!(index(&t, 1, v4("10.0.0.5")), Some(3));
    assert_eq!(index(&t, 1, addr("::ffff:10.0.0.5")), Some(3));
    assert_eq!(index(&t, 1, addr("2001:db8::5")), Some(6));
    // Only a v1 entry holds it: that one.
    let v1_only: Vec<_> = t.iter().filter(|e| e.index.0 != 3).cloned().collect();
    assert_eq!(index(&v1_only, 1, v4("10.0.0.5")), Some(2));
    // Link-local addresses are found when asked for by address.
    assert_eq!(index(&t, 1, addr("fe80::5054:ff:fe12:3456")), Some(1));
    // Port 2's address is not on port 1; absent addresses match nothing.
    assert_eq!(index(&t, 1, v4("10.0.1.5")), None);
    assert_eq!(index(&t, 2, v4("10.0.1.5")), Some(0));
    assert_eq!(index(&t, 1, v4("10.0.0.6")), None);
    // `::` never matches an empty slot.
    assert_eq!(index(&t, 1, addr("::")), None);
}

#[test]
fn netdev_takes_its_entries_only_and_index_zero_matches_nothing() {
    let t = table();
    assert_eq!(index(&t, 1, Want::Netdev(2)), Some(3));
    // ifindex 3 has a 169.254 v2, an IPv6 v2 and an unknown-type IPv4: no
    // routable RoCE v2 IPv4 entry, so its first entry.
    assert_eq!(index(&t, 1, Want::Netdev(3)), Some(5));
    assert_eq!(index(&t, 2, Want::Netdev(4)), Some(0));
    assert_eq!(index(&t, 1, Want::Netdev(4)), None);
    // 0 is "no such device", not "entries without a device" (port 2's IB entry).
    assert_eq!(index(&t, 2, Want::Netdev(0)), None);
}

#[test]
fn select_refuses_with_port_and_selector() {
    let t = table();
    let wanted = GidSelector::Address("10.0.0.77".parse().unwrap());
    match wanted.select(&t, PortNumber(1)) {
        Err(Error::NoMatchingGid { port, wanted: w }) => {
            assert_eq!(port, PortNumber(1));
            assert_eq!(w, wanted);
        }
        other => panic!("expected NoMatchingGid, got {other:?}"),
    }
    let e = GidSelector::RoceV2Ipv4.select(&t, PortNumber(1)).unwrap();
    assert_eq!(e.index, GidIndex(3));
    // A name that is no network device resolves to 0 and matches nothing.
    let none = GidSelector::Netdev("no-such-netdev-x".into());
    assert_eq!(none.want(), Want::Netdev(0));
    assert!(matches!(
        none.select(&t, PortNumber(2)),
        Err(Error::NoMatchingGid { .. })
    ));
    assert_eq!(
        GidSelector::Netdev("bad\0name".into()).want(),
        Want::Netdev(0)
    );
    assert!(matches!(
        GidSelector::Automatic.select(&[], PortNumber(1)),
        Err(Error::NoMatchingGid { .. })
    ));
}

#[test]
fn link_local_covers_ipv6_and_mapped_ipv4() {
    let ll = |s: &str| s.parse::<Gid>().unwrap().is_link_local();
    assert!(ll("fe80::1"));
    assert!(ll("febf::1"));
    assert!(!ll("fec0::1"));
    assert!(ll("169.254.0.1"));
    assert!(!ll("10.0.2.15"));
    assert!(!ll("2001:db8::1"));
    assert!(!ll("::"));
}

#[test]
fn selector_display_names_what_was_wanted() {
    assert_eq!(
        GidSelector::Netdev("eth9".into()).to_string(),
        "GID of network device \"eth9\""
    );
    assert_eq!(
        GidSelector::RoceV2Ipv4.to_string(),
        "RoCE v2 GID with a non-link-local IPv4 address"
    );
}
