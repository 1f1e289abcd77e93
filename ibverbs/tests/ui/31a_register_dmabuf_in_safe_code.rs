// Hazard 31, "Registering a dmabuf, or reading its bytes, from safe code":
// what makes registering a dmabuf sound is outside the crate's view, so
// `register_dmabuf` is `unsafe`.
// Expected: E0133.
#![allow(unused)]
use rdma_verbs::*;

fn main() {}

fn proof(pd: &ProtectionDomain, fd: std::os::fd::OwnedFd) -> Result<()> {
    let _r = pd.register_dmabuf(fd, 0, 4096, AccessFlags::LOCAL_WRITE)?;
    Ok(())
}
