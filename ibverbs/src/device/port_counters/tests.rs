//! Host tests of the sysfs counter parsing, on a temporary tree shaped
//! like `/sys/class/infiniband`.

use super::*;

/// A fresh directory under the system's temporary one, removed on drop.
struct TempTree(PathBuf);

impl TempTree {
    fn new(tag: &str) -> TempTree {
        let dir = std::env::temp_dir().join(format!(
            "ibverbs-port-counters-{tag}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempTree(dir)
    }

    fn file(&self, rel: &str, text: &str) {
        let path = self.0.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
}

impl Drop for TempTree {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn a_counter_is_a_decimal_number_with_its_newline() {
    assert_eq!(parse_counter("42\n"), Some(42));
    assert_eq!(parse_counter("0"), Some(0));
    assert_eq!(parse_counter(" 18446744073709551615 \n"), Some(u64::MAX));
    assert_eq!(parse_counter("18446744073709551616\n"), None, "overflow");
    assert_eq!(parse_counter(""), None);
    assert_eq!(parse_counter("\n"), None);
    assert_eq!(parse_counter("-1\n"), None);
    assert_eq!(parse_counter("+1\n"), None);
    assert_eq!(parse_counter("0x10\n"), None);
    assert_eq!(parse_counter("12 34\n"), None);
    assert_eq!(parse_counter("N/A\n"), None);
}

#[test]
fn both_directories_are_read_by_name_and_settings_left_out() {
    let t = TempTree::new("both");
    t.file("rxe9/ports/1/hw_counters/sent_pkts", "10\n");
    t.file("rxe9/ports/1/hw_counters/rcvd_pkts", "7\n");
    t.file("rxe9/ports/1/hw_counters/rcvd_rnr_err", "2\n");
    t.file("rxe9/ports/1/hw_counters/lifespan", "10\n");
    t.file("rxe9/ports/1/hw_counters/garbage", "n/a\n");
    t.file("rxe9/ports/1/counters/port_xmit_data", "100\n");
    t.file("rxe9/ports/1/counters/port_xmit_packets", "5\n");
    let c = PortCounters::read_from(&t.0, "rxe9", PortNumber(1)).unwrap();
    assert_eq!(c.port(), PortNumber(1));
    assert_eq!(c.len(), 5, "{c:?}");
    assert_eq!(c.get("lifespan"), None, "a setting, not a counter");
    assert_eq!(c.get("garbage"), None);
    assert_eq!(c.get_from(CounterSource::Hardware, "sent_pkts"), Some(10));
    assert_eq!(c.get_from(CounterSource::Standard, "sent_pkts"), None);
    // counters/ is preferred where both name a quantity.
    assert_eq!(c.packets_sent(), Some(5));
    assert_eq!(c.packets_received(), Some(7), "falls back to rcvd_pkts");
    assert_eq!(
        c.bytes_sent(),
        Some(400),
        "port_xmit_data counts 4-octet words"
    );
    assert_eq!(c.bytes_received(), None);
    assert_eq!(c.rnr_naks_received(), Some(2));
    assert_eq!(c.retries(), None, "absent, not 0");
    let listed: Vec<_> = c.iter().collect();
    assert_eq!(
        listed,
        vec![
            (CounterSource::Standard, "port_xmit_data", 100),
            (CounterSource::Standard, "port_xmit_packets", 5),
            (CounterSource::Hardware, "rcvd_pkts", 7),
            (CounterSource::Hardware, "rcvd_rnr_err", 2),
            (CounterSource::Hardware, "sent_pkts", 10),
        ]
    );
}

#[test]
fn a_device_without_port_counters_reads_hw_counters_alone() {
    let t = TempTree::new("hwonly");
    t.file("rxe9/ports/1/hw_counters/sent_pkts", "3\n");
    t.file("rxe9/ports/1/gids/0", "fe80::\n");
    let c = PortCounters::read_from(&t.0, "rxe9", PortNumber(1)).unwrap();
    assert_eq!(c.packets_sent(), Some(3));
    assert_eq!(c.bytes_sent(), None);
    assert_eq!(c.len(), 1);
}

#[test]
fn a_missing_port_is_an_error_naming_the_path() {
    let t = TempTree::new("noport");
    t.file("rxe9/ports/1/hw_counters/sent_pkts", "3\n");
    let e = PortCounters::read_from(&t.0, "rxe9", PortNumber(2)).unwrap_err();
    match &e {
        Error::Sysfs { path, io } => {
            assert!(path.ends_with("rxe9/ports/2"), "{path:?}");
            assert_eq!(io.kind(), io::ErrorKind::NotFound);
        }
        other => panic!("{other:?}"),
    }
    assert!(e.to_string().contains("rxe9/ports/2"), "{e}");
    let e = PortCounters::read_from(&t.0, "mlx5_0", PortNumber(1)).unwrap_err();
    assert!(matches!(e, Error::Sysfs { .. }), "{e:?}");
}

#[test]
fn delta_subtracts_by_name_and_never_wraps() {
    let snapshot = |pairs: &[(&str, u64)]| PortCounters {
        port: PortNumber(1),
        standard: BTreeMap::from([("port_xmit_packets".to_string(), pairs[0].1)]),
        hardware: pairs[1..]
            .iter()
            .map(|(n, v)| (n.to_string(), *v))
            .collect(),
    };
    let before = snapshot(&[
        ("port_xmit_packets", 10),
        ("sent_pkts", 100),
        ("rcvd_pkts", 50),
    ]);
    let after = snapshot(&[
        ("port_xmit_packets", 15),
        ("sent_pkts", 130),
        ("rcvd_pkts", 40),
        ("rcvd_seq_err", 2),
    ]);
    let d = after.delta(&before);
    assert_eq!(d.packets_sent(), Some(5));
    assert_eq!(d.get("sent_pkts"), Some(30));
    assert_eq!(d.get("rcvd_pkts"), Some(0), "went down: 0, not wrapped");
    assert_eq!(d.sequence_naks_received(), Some(2), "new since before");
    assert_eq!(d.len(), after.len());
    // Nothing moved: every delta is 0.
    assert!(after.delta(&after).iter().all(|(_, _, v)| v == 0));
}
