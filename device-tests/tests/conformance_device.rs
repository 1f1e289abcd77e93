//! Scenarios of rdma-core's pyverbs suite about the device and protection
//! domains (`tests/test_device.py`, `tests/test_pd.py`) as device tests of
//! this library: the device attributes are sane and agree with sysfs
//! where sysfs has them; protection domains are allocated and freed in a
//! loop and held by the hundred, and the kernel's resource tracking
//! (`rdma res show pd`) counts exactly the ones alive.
//!
//! The PD test counts the kernel's PDs of its own thread (the kernel
//! records the allocating task), so no test running in parallel changes
//! the count.

mod common;

use std::path::Path;
use std::process::Command;

/// A sysfs GUID (`fe80:0000:0000:0001`, four big-endian 16-bit groups) in
/// host byte order.
fn sysfs_guid(path: &Path) -> u64 {
    let s = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    let hex: String = s.trim().chars().filter(|c| *c != ':').collect();
    u64::from_str_radix(&hex, 16).unwrap_or_else(|e| panic!("{path:?}: {s:?}: {e}"))
}

fn page_size() -> u64 {
    // SAFETY: sysconf has no memory-safety preconditions.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) as u64 }
}

/// pyverbs `test_device.DeviceTest.test_query_device`,
/// `test_query_device_ex` (`verify_device_attr`), `test_phys_port_cnt_ex`
/// and `test_dev_list`/`test_open_dev`, for every device: GUIDs non-zero
/// and equal to sysfs' `node_guid`/`sys_image_guid` (and to the device
/// list's GUID), `max_mr_size` above a page, `page_size_cap` at least a
/// page, `vendor_id`, `max_pd`, `max_pkeys` and the other limits
/// non-zero, `phys_port_cnt_ex` equal to `phys_port_cnt` (below 256) and
/// to the ports sysfs lists, `fw_ver` equal to sysfs' where the kernel
/// driver has one, every port's
/// P_Key table as long as sysfs' `pkeys/`.
#[test]
#[ignore = "needs an RDMA device"]
fn conformance_device_attributes_are_sane_and_match_sysfs() {
    let list = rdma_verbs::devices().unwrap();
    assert!(!list.is_empty());
    let page = page_size();
    for dev in list.iter() {
        let name = dev.name().to_owned();
        let ctx = dev.open().unwrap();
        let a = ctx.query_device().unwrap();
        let ax = ctx.query_device_ex().unwrap();
        let sys = Path::new(dev.ibdev_path()).to_owned();
        eprintln!(
            "{name} ({sys:?}): node_guid {:#018x}, sys_image_guid {:#018x}, max_mr_size {:#x}, \
             page_size_cap {:#x}, vendor_id {:#x}, max_pd {}, max_pkeys {}, phys_port_cnt {} \
             (ex {}), fw_ver {:?}",
            a.node_guid(),
            a.sys_image_guid(),
            a.max_mr_size(),
            a.page_size_cap(),
            a.vendor_id(),
            a.max_pd(),
            a.max_pkeys(),
            a.phys_port_cnt(),
            ax.phys_port_cnt_ex(),
            a.fw_ver()
        );
        assert_ne!(a.node_guid(), 0, "{name}");
        assert_ne!(a.sys_image_guid(), 0, "{name}");
        assert_eq!(a.node_guid(), dev.guid(), "{name}: ibv_get_device_guid");
        assert!(a.max_mr_size() > page, "{name}");
        assert!(a.page_size_cap() >= page, "{name}");
        assert_ne!(a.vendor_id(), 0, "{name}");
        for (what, v) in [
            ("max_qp", a.max_qp()),
            ("max_qp_wr", a.max_qp_wr()),
            ("max_sge", a.max_sge()),
            ("max_cq", a.max_cq()),
            ("max_cqe", a.max_cqe()),
            ("max_mr", a.max_mr()),
            ("max_pd", a.max_pd()),
            ("max_pkeys", a.max_pkeys().into()),
        ] {
            assert!(v > 0, "{name}: {what} {v}");
        }
        // The extended query repeats the classic attributes.
        assert_eq!(ax.base().node_guid(), a.node_guid(), "{name}");
        assert_eq!(ax.base().max_pd(), a.max_pd(), "{name}");
        let ports = ax.phys_port_cnt_ex();
        if ports > 255 {
            assert_eq!(a.phys_port_cnt(), 255, "{name}");
        } else {
            assert_eq!(u32::from(a.phys_port_cnt()), ports, "{name}");
        }
        assert!(ports >= 1, "{name}");

        // sysfs.
        assert_eq!(sysfs_guid(&sys.join("node_guid")), a.node_guid(), "{name}");
        assert_eq!(
            sysfs_guid(&sys.join("sys_image_guid")),
            a.sys_image_guid(),
            "{name}"
        );
        // sysfs' fw_ver is the kernel driver's string, empty when the
        // driver has none (rxe); the provider may then format its own
        // (rxe's says "0.0.0").
        let fw = std::fs::read_to_string(sys.join("fw_ver")).unwrap();
        eprintln!("{name}: sysfs fw_ver {:?}", fw.trim());
        if !fw.trim().is_empty() {
            assert_eq!(fw.trim(), a.fw_ver(), "{name}: fw_ver");
        }
        let sys_ports = std::fs::read_dir(sys.join("ports")).unwrap().count() as u32;
        assert_eq!(sys_ports, ports, "{name}: ports/");
        for p in ctx.ports().unwrap() {
            let pa = ctx.query_port(p).unwrap();
            let pkeys = sys.join(format!("ports/{}/pkeys", p.0));
            let n = std::fs::read_dir(&pkeys)
                .unwrap_or_else(|e| panic!("{pkeys:?}: {e}"))
                .count();
            assert_eq!(n, usize::from(pa.pkey_table_len()), "{name} port {}", p.0);
            assert!(pa.pkey_table_len() <= a.max_pkeys(), "{name} port {}", p.0);
        }
    }
}

/// The kernel's PDs of the calling thread on device `dev` (`rdma res show
/// pd`, one line per PD, filtered by the task id it prints), or `None`
/// without the `rdma` tool or resource tracking.
fn kernel_pds(dev: &str) -> Option<usize> {
    let out = Command::new("rdma")
        .args(["res", "show", "pd", "dev", dev])
        .output()
        .ok()?;
    if !out.status.success() {
        eprintln!(
            "rdma res show pd: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        return None;
    }
    // The kernel records the task that allocated each PD, and `rdma`
    // prints that task's id: for a thread, its thread id (the test
    // thread's, which allocates every PD of this test).
    // SAFETY: gettid has no preconditions.
    let pid = format!(" pid {} ", unsafe { libc::gettid() });
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    eprintln!(
        "rdma res show pd dev {dev}: {} lines, first: {:?}, last: {:?}",
        lines.len(),
        lines.first(),
        lines.last()
    );
    Some(
        text.lines()
            .filter(|l| format!("{l} ").contains(&pid))
            .count(),
    )
}

/// pyverbs `test_pd.PDTest.test_alloc_pd`, `test_dealloc_pd` and
/// `test_multiple_pd_creation`, larger: 1000 PDs allocated and freed
/// one after the other (dropped, or closed explicitly with the verb's
/// result), then 500 held at once and freed; the kernel's count of this
/// thread's PDs follows exactly (when the `rdma` tool and resource
/// tracking are present; the VM has both).
#[test]
#[ignore = "needs an RDMA device"]
fn conformance_many_pds_alloc_free_without_leak() {
    let dev = common::device();
    let name = dev.ctx.name().to_owned();
    let before = kernel_pds(&name);
    eprintln!("{name}: kernel PDs of this process before: {before:?}");
    if common::is_rxe(&dev) {
        assert!(before.is_some(), "the VM has `rdma` and resource tracking");
    }
    for i in 0..1000 {
        let pd = dev.ctx.alloc_pd().unwrap_or_else(|e| panic!("PD {i}: {e}"));
        if i % 2 == 0 {
            assert!(pd.close().unwrap(), "PD {i}: the last handle frees it");
        }
    }
    assert_eq!(kernel_pds(&name), before, "after 1000 alloc/free");
    const HELD: usize = 500;
    let held: Vec<_> = (0..HELD)
        .map(|i| dev.ctx.alloc_pd().unwrap_or_else(|e| panic!("PD {i}: {e}")))
        .collect();
    let during = kernel_pds(&name);
    eprintln!("{name}: with {HELD} held: {during:?}");
    assert_eq!(during, before.map(|b| b + HELD));
    // A second handle keeps a PD: close says so and frees nothing.
    let clone = held[0].clone();
    assert!(!clone.close().unwrap());
    assert_eq!(kernel_pds(&name), during);
    drop(held);
    assert_eq!(kernel_pds(&name), before, "after freeing the {HELD}");
}

/// pyverbs `test_device.DeviceTest.test_query_port` (`verify_port_attr`)
/// and `test_query_port_bad_flow`, and `test_query_gid_table_bad_flow`:
/// every port's state, physical state, MTUs, link width and speed are
/// values of their enumerations, the link layer is known and the largest
/// message exceeds a page; ports 1 to 10 past the last are refused by
/// `ibv_query_port` with `EINVAL`. A GID table query with room for no
/// entry is refused with `EINVAL`: `Context::gid_table` sizes its buffer
/// from the ports' table lengths and cannot ask that, so the verb is
/// called raw here.
#[test]
#[ignore = "needs an RDMA device"]
fn conformance_query_port_and_its_bad_flows() {
    let dev = common::device();
    let ctx = &dev.ctx;
    let ports = ctx.query_device().unwrap().phys_port_cnt();
    for p in ctx.ports().unwrap() {
        let a = ctx.query_port(p).unwrap();
        eprintln!(
            "port {p}: {a:?}, phys_state {}, width {}, speed {}, max_msg_size {}",
            a.phys_state(),
            a.active_width(),
            a.active_speed(),
            a.max_msg_size()
        );
        assert!(
            !matches!(a.state(), rdma_verbs::device::PortState::Unknown(_)),
            "{a:?}"
        );
        assert!((1..=7).contains(&a.phys_state()), "port {p}: phys_state");
        assert!(
            !matches!(a.max_mtu(), rdma_verbs::device::Mtu::Unknown(_)),
            "{a:?}"
        );
        assert!(
            !matches!(a.active_mtu(), rdma_verbs::device::Mtu::Unknown(_)),
            "{a:?}"
        );
        assert!(
            [1, 2, 4, 8, 16].contains(&a.active_width()),
            "port {p}: width {}",
            a.active_width()
        );
        assert!(
            [1, 2, 4, 8, 16, 32, 64, 128].contains(&a.active_speed()),
            "port {p}: speed {}",
            a.active_speed()
        );
        assert!(
            matches!(
                a.link_layer(),
                rdma_verbs::device::LinkLayer::InfiniBand | rdma_verbs::device::LinkLayer::Ethernet
            ),
            "{a:?}"
        );
        assert!(a.max_msg_size() > 0x1000, "port {p}");
    }
    for k in 1..=10u16 {
        let Ok(n) = u8::try_from(u16::from(ports) + k) else {
            break;
        };
        let e = ctx.query_port(rdma_verbs::PortNumber(n)).unwrap_err();
        assert_eq!(e.verb(), Some("ibv_query_port"), "port {n}: {e:?}");
        assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "port {n}: {e:?}");
    }

    let mut entries = [rdma_verbs::sys::ibv_gid_entry::default()];
    // SAFETY: live context; `entries` has room for one entry and the call
    // is told there is room for none.
    let n =
        unsafe { rdma_verbs::sys::ibv_query_gid_table(ctx.as_ptr(), entries.as_mut_ptr(), 0, 0) };
    eprintln!("ibv_query_gid_table with room for 0 entries: {n}");
    assert_eq!(n, -(libc::EINVAL as isize));
}
