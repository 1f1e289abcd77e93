// Hazard 11, "Writing to a frozen buffer": a `FrozenBuffer` is read-only: it
// has no `DerefMut`.
// Expected: E0594 (assigning through `Deref` without `DerefMut`).
#![allow(unused)]
use rdma_verbs::*;

fn main() {}

fn proof(
    pd: &ProtectionDomain,
    qp: &QueuePair,
    cq: &CompletionQueue,
    remote: RemoteMemory,
) -> Result<()> {
    let mut frozen = pd
        .register(vec![0u8; 64], AccessFlags::LOCAL_WRITE)?
        .freeze();
    frozen[0] = 1;
    Ok(())
}
