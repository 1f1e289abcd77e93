// Hazard 32, "Registering the whole address space from safe code": an implicit
// ODP region's keys reach every byte of the process, so
// `register_implicit_odp` is `unsafe`.
// Expected: E0133.
#![allow(unused)]
use rdma_verbs::*;

fn main() {}

fn proof(pd: &ProtectionDomain) -> Result<()> {
    let _all = pd.register_implicit_odp(AccessFlags::LOCAL_WRITE)?;
    Ok(())
}
