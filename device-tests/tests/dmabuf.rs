//! dmabuf registration (device tests): a real dmabuf from `/dev/udmabuf`
//! (a sealed memfd exported by the `UDMABUF_CREATE` ioctl). Where the
//! device registers it, a peer RDMA-writes into it and every byte is read
//! back through the memfd mapping; where it refuses (rxe), the refusal is
//! typed, names `ibv_reg_dmabuf_mr`, and the fd is closed.

mod common;

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use common::{pair, pattern, remote_all, wait_ok};
use rdma_verbs::{AccessFlags, Error, QpType, Wr};

const LEN: usize = 16 * 4096;

/// `struct udmabuf_create` of `<linux/udmabuf.h>`.
#[repr(C)]
struct UdmabufCreate {
    memfd: u32,
    flags: u32,
    offset: u64,
    size: u64,
}
/// `_IOW('u', 0x42, struct udmabuf_create)`.
const UDMABUF_CREATE: libc::c_ulong =
    (1 << 30) | (24 << 16) | ((b'u' as libc::c_ulong) << 8) | 0x42;
const UDMABUF_FLAGS_CLOEXEC: u32 = 1;

fn check(what: &str, rc: libc::c_int) -> RawFd {
    assert!(rc >= 0, "{what}: {}", std::io::Error::last_os_error());
    rc
}

/// A sealed memfd of `len` bytes and a dmabuf exporting all of it.
fn udmabuf(len: usize) -> (OwnedFd, OwnedFd) {
    // SAFETY: plain syscalls on fds this function creates and owns.
    unsafe {
        let memfd = check(
            "memfd_create",
            libc::memfd_create(
                c"ibverbs-dmabuf".as_ptr(),
                libc::MFD_ALLOW_SEALING | libc::MFD_CLOEXEC,
            ),
        );
        let memfd = OwnedFd::from_raw_fd(memfd);
        check(
            "ftruncate",
            libc::ftruncate(memfd.as_raw_fd(), len as libc::off_t),
        );
        check(
            "F_ADD_SEALS",
            libc::fcntl(memfd.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_SHRINK),
        );
        let dev = check(
            "open /dev/udmabuf",
            libc::open(c"/dev/udmabuf".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC),
        );
        let dev = OwnedFd::from_raw_fd(dev);
        let create = UdmabufCreate {
            memfd: memfd.as_raw_fd() as u32,
            flags: UDMABUF_FLAGS_CLOEXEC,
            offset: 0,
            size: len as u64,
        };
        let buf = check(
            "UDMABUF_CREATE",
            libc::ioctl(dev.as_raw_fd(), UDMABUF_CREATE as _, &create),
        );
        (memfd, OwnedFd::from_raw_fd(buf))
    }
}

/// Whether `fd` is open in this process.
fn is_open(fd: RawFd) -> bool {
    // SAFETY: F_GETFD only queries the descriptor table.
    unsafe { libc::fcntl(fd, libc::F_GETFD) != -1 }
}

/// Reads the memfd's bytes with `pread` (no mapping, no reference to
/// memory the device writes).
fn memfd_bytes(memfd: &OwnedFd, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    // SAFETY: `out` is writable for `len` bytes.
    let n = unsafe { libc::pread(memfd.as_raw_fd(), out.as_mut_ptr().cast(), len, 0) };
    assert_eq!(
        n,
        len as isize,
        "pread: {}",
        std::io::Error::last_os_error()
    );
    out
}

#[test]
#[ignore = "needs an RDMA device"]
fn dmabuf_registration_runs_traffic_or_is_refused_by_name() {
    let p = pair(QpType::Rc, remote_all(), |b| b);
    // One test, so no other test of this binary opens descriptors while
    // the closed ones' numbers are checked.

    // A descriptor that is no dmabuf: refused (by the kernel or, as on
    // rxe, the provider), naming the verb, and closed.
    let (not_dmabuf, _unused) = udmabuf(4096);
    let raw = not_dmabuf.as_raw_fd();
    // SAFETY: the memfd is not a dmabuf: the registration cannot succeed.
    let e = unsafe {
        p.pd.register_dmabuf(not_dmabuf, 0, 4096, AccessFlags::LOCAL_WRITE)
    }
    .unwrap_err();
    assert!(e.to_string().contains("ibv_reg_dmabuf_mr"), "{e:?}");
    assert!(!is_open(raw), "a refused fd is closed");
    drop(_unused);

    let (memfd, dmabuf) = udmabuf(LEN);
    let raw = dmabuf.as_raw_fd();
    // SAFETY: the udmabuf's pages are the memfd's, which this test owns
    // and never references while registered (it reads them with pread
    // after the write completed); nothing else uses the dmabuf.
    let got = unsafe { p.pd.register_dmabuf(dmabuf, 4096, LEN - 4096, remote_all()) };
    match got {
        Err(e) => {
            assert!(
                matches!(
                    e,
                    Error::DeviceLacks {
                        verb: "ibv_reg_dmabuf_mr",
                        ..
                    }
                ),
                "a typed refusal naming the verb, got {e:?}"
            );
            assert!(e.to_string().contains("ibv_reg_dmabuf_mr"), "{e}");
            assert!(!is_open(raw), "the refused dmabuf fd is closed");
            eprintln!("refused as expected on this device: {e}");
        }
        Ok(region) => {
            assert!(is_open(raw), "the region keeps the fd open");
            let remote = region.remote().unwrap();
            assert_eq!(region.offset(), 4096);
            assert_eq!((remote.addr, remote.len), (4096, (LEN - 4096) as u64));
            let payload = pattern(8000, 5);
            let mut src = p.pd.alloc(8000, AccessFlags::LOCAL_WRITE).unwrap();
            src.copy_from_slice(&payload);
            p.a.send_queue()
                .unwrap()
                .write(src, remote.slice(100, 8000).unwrap(), Wr::id(0))
                .unwrap();
            wait_ok(&p.cq_a);
            let bytes = memfd_bytes(&memfd, LEN);
            let at = 4096 + 100;
            assert_eq!(&bytes[at..at + 8000], &payload[..], "written bytes");
            assert!(
                bytes[..at]
                    .iter()
                    .chain(&bytes[at + 8000..])
                    .all(|&b| b == 0),
                "nothing else written"
            );
            drop(region);
            assert!(!is_open(raw), "deregistration closes the fd");
        }
    }
}
