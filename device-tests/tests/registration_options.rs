//! Registration options (device tests): memory registered at a chosen IOVA
//! (`ibv_reg_mr_iova2`) and with `RELAXED_ORDERING`, each carrying RC
//! RDMA write and read traffic whose every byte is checked.

mod common;

use common::{pair, pattern, remote_all, wait_ok};
use rdma_verbs::{memory::RegisterOptions, AccessFlags, Error, QpType, RemoteMemory, Wr};

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

    let mut sq = p.a.send_queue().unwrap();
    sq.write(source, remote.slice(1000, 3000).unwrap(), Wr::id(0))
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
    sq.read(dst, remote.slice(5000, 2000).unwrap(), Wr::id(0))
        .unwrap();
    let mut c = wait_ok(&p.cq_a);
    let dst = c.take_local().unwrap();
    assert_eq!(&dst[..], &second[..], "read from iova + 5000");
}

/// The top of the IOVA space (issue #35, finding 4): a region may end at
/// `2^64 - 1` at most (`iova + len` must be a u64). Before, a region
/// ending at `2^64` was admitted; joining its pieces computed that end (a
/// panic in debug builds) and `RemoteMemory::from_bytes` refused the
/// region's own range. Now it is refused with `OutOfRange`, and the
/// highest page-aligned region accepted splits, joins, round-trips its
/// `RemoteMemory` and takes a write and a read of its last bytes.
#[test]
#[ignore = "needs an RDMA device"]
fn iova_at_the_top_of_the_address_space() {
    const LEN: u64 = 8192;
    let p = pair(QpType::Rc, remote_all(), |b| b);
    let ending_at_2_64 = 0u64.wrapping_sub(LEN);
    match p.pd.alloc_shared(
        LEN as usize,
        RegisterOptions::new(remote_all()).iova(ending_at_2_64),
    ) {
        Err(Error::OutOfRange { value, max, .. }) => {
            assert_eq!((value, max), (ending_at_2_64, u64::MAX - LEN));
        }
        other => panic!("expected OutOfRange, got {:?}", other.map(|b| b.addr())),
    }
    // The highest page-aligned start: the region ends at 2^64 - 4096.
    let top = ending_at_2_64 - 4096;
    let target =
        p.pd.alloc_shared(LEN as usize, RegisterOptions::new(remote_all()).iova(top))
            .unwrap();
    let remote = target.remote().unwrap();
    assert_eq!((remote.addr, remote.len), (top, LEN));
    assert_eq!(
        RemoteMemory::from_bytes(&remote.to_bytes()).unwrap(),
        remote
    );
    let (low, high) = target.split_at(4096);
    assert_eq!(high.addr(), top + 4096);
    let mut target = low.unsplit(high).map_err(|_| "not joined").unwrap();

    let last = remote.slice(LEN - 8, 8).unwrap();
    let mut src = p.pd.alloc(8, AccessFlags::LOCAL_WRITE).unwrap();
    src.copy_from_slice(&0x1122_3344_5566_7788u64.to_le_bytes());
    let mut sq = p.a.send_queue().unwrap();
    sq.write(src, last, Wr::id(0)).unwrap();
    wait_ok(&p.cq_a);
    let mut word = [0u64];
    target.read_into(LEN as usize - 8, &mut word).unwrap();
    assert_eq!(word[0], 0x1122_3344_5566_7788, "written at the last bytes");

    target
        .write_from(LEN as usize - 8, &[0x99aa_bbcc_ddee_ff00u64])
        .unwrap();
    let dst = p.pd.alloc(8, AccessFlags::LOCAL_WRITE).unwrap();
    sq.read(dst, last, Wr::id(0)).unwrap();
    let dst = wait_ok(&p.cq_a).take_local().unwrap();
    assert_eq!(&dst[..], &0x99aa_bbcc_ddee_ff00u64.to_le_bytes());
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
    let mut sq = p.a.send_queue().unwrap();
    sq.write(src, remote, Wr::id(0)).unwrap();
    wait_ok(&p.cq_a);
    assert_eq!(target.to_vec(), payload, "write on relaxed-ordering memory");

    let dst = p.pd.alloc(4096, AccessFlags::LOCAL_WRITE | ro).unwrap();
    sq.read(dst, remote, Wr::id(0)).unwrap();
    let mut c = wait_ok(&p.cq_a);
    assert_eq!(&c.take_local().unwrap()[..], &payload[..], "read back");
}
