//! GID table entries and GID selection (device tests): the table read with
//! `ibv_query_gid_table` against sysfs, the default choice, selection by
//! address and by network device, and the typed refusal.

mod common;

use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;

use rdma_verbs::{
    device::{GidEntry, GidIndex, GidSelector, GidType, LinkLayer},
    Error, Gid, PortNumber,
};

/// `/sys/class/infiniband/DEV/ports/P/`.
fn sysfs_port(t: &common::TestDevice) -> PathBuf {
    PathBuf::from(format!(
        "/sys/class/infiniband/{}/ports/{}",
        t.ctx.name(),
        t.port
    ))
}

/// A sysfs attribute, trimmed; `None` when it cannot be read (the kernel
/// refuses to read the type or netdev of an empty slot).
fn read(path: PathBuf) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}

fn port_table(t: &common::TestDevice) -> Vec<GidEntry> {
    let table = t.ctx.gid_table().unwrap();
    table.into_iter().filter(|e| e.port == t.port).collect()
}

fn in_vm() -> Option<String> {
    std::env::var("IBVERBS_TEST_EXPECT_GID1").ok()
}

#[test]
#[ignore = "needs an RDMA device"]
fn gid_table_matches_sysfs() {
    let t = common::device();
    let dir = sysfs_port(&t);
    assert!(dir.is_dir(), "{} missing", dir.display());
    let link = t.ctx.query_port(t.port).unwrap().link_layer();
    let table = port_table(&t);
    let len = t.ctx.query_port(t.port).unwrap().gid_table_len();
    let mut valid = 0;
    for i in 0..len.min(256) {
        let text = read(dir.join(format!("gids/{i}"))).unwrap();
        let gid: Gid = text.parse().unwrap();
        let entry = table.iter().find(|e| e.index == GidIndex(i as u8));
        if gid.is_zero() {
            assert!(entry.is_none(), "empty slot {i} in the table: {entry:?}");
            continue;
        }
        valid += 1;
        let e = entry.unwrap_or_else(|| panic!("sysfs GID {i} {gid} missing from the table"));
        assert_eq!(e.gid, gid, "index {i}");
        let kind = read(dir.join(format!("gid_attrs/types/{i}")));
        let expected = match (kind.as_deref(), link) {
            (Some("RoCE v2"), _) => GidType::RoceV2,
            (Some("IB/RoCE v1"), LinkLayer::Ethernet) => GidType::RoceV1,
            (Some("IB/RoCE v1") | None, _) => GidType::Ib,
            (Some(other), _) => panic!("index {i}: unknown sysfs GID type {other:?}"),
        };
        assert_eq!(e.gid_type, expected, "index {i} (sysfs {kind:?})");
        let ndev = read(dir.join(format!("gid_attrs/ndevs/{i}")));
        assert_eq!(e.netdev(), ndev, "index {i}");
        eprintln!(
            "index {i}: {gid} {:?} netdev {:?} (sysfs {kind:?} {ndev:?})",
            e.gid_type, ndev
        );
    }
    assert_eq!(table.len(), valid, "{table:?}");
    if let Some(gid1) = in_vm() {
        // rxe0 on eth0: a link-local RoCE v2 entry before the IPv4 one, so
        // the default choice has something to skip.
        let e0 = &table[0];
        assert_eq!(e0.index, GidIndex(0));
        assert!(e0.gid.is_link_local(), "{e0:?}");
        assert_eq!(e0.gid_type, GidType::RoceV2);
        let e1 = &table[1];
        assert_eq!((e1.index, e1.gid.to_string()), (GidIndex(1), gid1));
        assert_eq!(e1.gid_type, GidType::RoceV2);
        assert_eq!(e1.netdev().as_deref(), Some("eth0"));
    }
}

#[test]
#[ignore = "needs an RDMA device"]
fn gid_default_is_the_roce_v2_ipv4_entry() {
    let t = common::device();
    let link = t.ctx.query_port(t.port).unwrap().link_layer();
    let index = t.ctx.default_gid_index(t.port).unwrap();
    if link != LinkLayer::Ethernet {
        assert_eq!(index, GidIndex(0), "InfiniBand keeps index 0");
        return;
    }
    let auto = t.ctx.select_gid(t.port, &GidSelector::Automatic).unwrap();
    assert_eq!(auto.index, index);
    match t.ctx.select_gid(t.port, &GidSelector::RoceV2Ipv4) {
        Ok(e) => {
            assert_eq!(e, auto);
            assert_eq!(e.gid_type, GidType::RoceV2);
            let v4 = e.gid.to_ipv4_mapped().expect("IPv4-mapped");
            assert!(!v4.is_link_local() && !e.gid.is_link_local(), "{e:?}");
        }
        Err(Error::NoMatchingGid { port, wanted }) => {
            assert_eq!((port, wanted), (t.port, GidSelector::RoceV2Ipv4));
            assert!(in_vm().is_none(), "the VM's rxe0 has an IPv4 RoCE v2 GID");
        }
        Err(e) => panic!("{e}"),
    }
    if let Some(gid1) = in_vm() {
        assert_eq!(index, GidIndex(1));
        assert_eq!(auto.gid.to_string(), gid1);
    }
}

#[test]
#[ignore = "needs an RDMA device"]
fn gid_select_by_address_and_netdev() {
    let t = common::device();
    let Ok(ipv4) = t.ctx.select_gid(t.port, &GidSelector::RoceV2Ipv4) else {
        eprintln!(
            "no RoCE v2 IPv4 GID on {} port {}: nothing to select by",
            t.ctx.name(),
            t.port
        );
        assert!(in_vm().is_none());
        return;
    };
    let v4 = ipv4.gid.to_ipv4_mapped().unwrap();
    if in_vm().is_some() {
        assert_eq!(v4, Ipv4Addr::new(10, 0, 2, 15));
    }
    // By the IPv4 address, and by its IPv4-mapped IPv6 form.
    let by_v4 = t
        .ctx
        .select_gid(t.port, &GidSelector::Address(IpAddr::V4(v4)))
        .unwrap();
    assert_eq!(by_v4, ipv4);
    let by_v6 = t
        .ctx
        .select_gid(
            t.port,
            &GidSelector::Address(IpAddr::V6(ipv4.gid.to_ipv6())),
        )
        .unwrap();
    assert_eq!(by_v6, ipv4);
    // Every entry is found by its own address (link-local ones too).
    for e in port_table(&t) {
        let found = t
            .ctx
            .select_gid(t.port, &GidSelector::Address(IpAddr::V6(e.gid.to_ipv6())))
            .unwrap();
        assert_eq!(found.gid, e.gid);
    }
    // By the network device the IPv4 entry belongs to.
    let netdev = ipv4.netdev().expect("a RoCE GID has a netdev");
    let by_dev = t
        .ctx
        .select_gid(t.port, &GidSelector::Netdev(netdev.clone()))
        .unwrap();
    assert_eq!(by_dev, ipv4, "netdev {netdev}");
    eprintln!("{v4} and {netdev} both select GID index {}", ipv4.index.0);
}

#[test]
#[ignore = "needs an RDMA device"]
fn gid_select_refuses_what_is_not_there() {
    let t = common::device();
    // TEST-NET-1 (RFC 5737): on no test machine.
    let absent = GidSelector::Address("192.0.2.77".parse().unwrap());
    match t.ctx.select_gid(t.port, &absent) {
        Err(Error::NoMatchingGid { port, wanted }) => {
            assert_eq!(port, t.port);
            assert_eq!(wanted, absent);
        }
        other => panic!("expected NoMatchingGid, got {other:?}"),
    }
    let e = t
        .ctx
        .select_gid(t.port, &GidSelector::Netdev("nosuchnetdev0".into()))
        .unwrap_err();
    assert!(
        matches!(&e, Error::NoMatchingGid { wanted: GidSelector::Netdev(n), .. } if n == "nosuchnetdev0"),
        "{e:?}"
    );
    assert_eq!(
        e.to_string(),
        format!(
            "port {} has no GID of network device \"nosuchnetdev0\"",
            t.port
        )
    );
    assert_eq!(std::io::Error::from(e).kind(), std::io::ErrorKind::NotFound);
    // "lo" exists everywhere and has no GID.
    assert!(matches!(
        t.ctx.select_gid(t.port, &GidSelector::Netdev("lo".into())),
        Err(Error::NoMatchingGid { .. })
    ));
    // A port the device does not have: the table reads fine and holds no
    // entry of it.
    let other = PortNumber(t.port.0.wrapping_add(100));
    assert!(matches!(
        t.ctx.select_gid(other, &GidSelector::Automatic),
        Err(Error::NoMatchingGid { port, .. }) if port == other
    ));
}
