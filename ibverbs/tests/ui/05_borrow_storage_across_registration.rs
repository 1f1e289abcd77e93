// Hazard 5, "Borrowing the storage across registration": no reference into the
// storage survives its registration.
// Expected: E0505.
#![allow(unused)]
use rdma_verbs::*;

fn main() {}

fn proof(
    pd: &ProtectionDomain,
    qp: &QueuePair,
    cq: &CompletionQueue,
    remote: RemoteMemory,
) -> Result<()> {
    let v = vec![0u8; 64];
    let early = &v[..];
    let buf = pd.register(v, AccessFlags::LOCAL_WRITE)?;
    println!("{}", early[0]);
    Ok(())
}
