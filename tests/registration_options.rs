//! Registration options (device tests): memory registered at a chosen IOVA
//! (`ibv_reg_mr_iova2`) and with `RELAXED_ORDERING`, each carrying RC
//! RDMA write and read traffic whose every byte is checked.

mod common;

use common::{pair, pattern, remote_all, wait_ok};
use ibverbs::{AccessFlags, QpType, RegisterOptions, SendRequest};

const TARGET_IOVA: u64 = 0x7_0000_0000;
const SOURCE_IOVA: u64 = 0x10_0000_0000;

/// A peer's write and read addressed by the chosen IOVA land in (and come
/// from) the right bytes; the local source buffer, also registered at an
/// IOVA and split so that its SGE starts inside the region, is read by the
/// device at the right bytes too.
#[test]
#[ignore = "needs an RDMA device"]
fn iova_addresses_the_right_bytes() {
    let p = pair(QpType::Rc, remote_all(), |b| b);
    let mut target =
        p.pd.alloc_shared(8192, RegisterOptions::new(remote_all()).iova(TARGET_IOVA))
            .unwrap();
    let remote = target.remote().unwrap();
    assert_eq!((remote.addr, remote.len), (TARGET_IOVA, 8192));
    assert_eq!(target.memory_region().addr(), TARGET_IOVA);
    assert_eq!(target.addr(), TARGET_IOVA, "the buffer's device address");

    // Source: 100 bytes of padding, then the payload, at SOURCE_IOVA
    // (page-aligned memory: the kernel wants iova and address to share
    // their offset within a page).
    let payload = pattern(3000, 7);
    let mut source =
        p.pd.alloc(
            3100,
            RegisterOptions::new(AccessFlags::LOCAL_WRITE).iova(SOURCE_IOVA),
        )
        .unwrap();
    source[..100].fill(0xEE);
    source[100..].copy_from_slice(&payload);
    let (_pad, source) = source.split_at(100);
    assert_eq!(source.addr(), SOURCE_IOVA + 100);

    p.a.post_send(SendRequest::write(
        source,
        remote.slice(1000, 3000).unwrap(),
    ))
    .unwrap();
    wait_ok(&p.cq_a);
    let got = target.to_vec();
    assert_eq!(&got[1000..4000], &payload[..], "written at iova + 1000");
    assert!(
        got[..1000].iter().chain(&got[4000..]).all(|&b| b == 0),
        "nothing else written"
    );

    // Read back from another range into a local buffer at an IOVA.
    let second = pattern(2000, 99);
    target.copy_from_slice(5000, &second).unwrap();
    let dst =
        p.pd.alloc(
            2000,
            RegisterOptions::new(AccessFlags::LOCAL_WRITE).iova(SOURCE_IOVA + (1 << 20)),
        )
        .unwrap();
    p.a.post_send(SendRequest::read(dst, remote.slice(5000, 2000).unwrap()))
        .unwrap();
    let mut c = wait_ok(&p.cq_a);
    let dst = c.take_local().unwrap();
    assert_eq!(&dst[..], &second[..], "read from iova + 5000");
}

/// `RELAXED_ORDERING` is accepted (stripped by libibverbs where the device
/// lacks it), reported back, and RC write/read traffic on such regions is
/// byte-exact.
#[test]
#[ignore = "needs an RDMA device"]
fn relaxed_ordering_regions_carry_rc_traffic() {
    let p = pair(QpType::Rc, remote_all(), |b| b);
    let ro = AccessFlags::RELAXED_ORDERING;
    let target = p.pd.alloc_shared(4096, remote_all() | ro).unwrap();
    assert!(target.memory_region().access().contains(ro));
    let remote = target.remote().unwrap();
    let payload = pattern(4096, 3);
    let mut src = p.pd.alloc(4096, AccessFlags::LOCAL_WRITE | ro).unwrap();
    src.copy_from_slice(&payload);
    p.a.post_send(SendRequest::write(src, remote)).unwrap();
    wait_ok(&p.cq_a);
    assert_eq!(target.to_vec(), payload, "write on relaxed-ordering memory");

    let dst = p.pd.alloc(4096, AccessFlags::LOCAL_WRITE | ro).unwrap();
    p.a.post_send(SendRequest::read(dst, remote)).unwrap();
    let mut c = wait_ok(&p.cq_a);
    assert_eq!(&c.take_local().unwrap()[..], &payload[..], "read back");
}
