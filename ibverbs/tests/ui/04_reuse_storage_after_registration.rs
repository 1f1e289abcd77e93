// Hazard 4, "Reusing the storage after registration": registration consumes
// the storage; only the returned buffer reaches it.
// Expected: E0382.
#![allow(unused)]
use rdma_verbs::*;

fn main() {}

fn proof(
    pd: &ProtectionDomain,
    qp: &QueuePair,
    cq: &CompletionQueue,
    remote: RemoteMemory,
) -> Result<()> {
    let mut v = vec![0u8; 64];
    let buf = pd.register(v, AccessFlags::LOCAL_WRITE)?;
    v.push(1); // would reallocate memory the device knows
    Ok(())
}
