// Hazard 10, "Atomic result into a frozen buffer": an atomic's original value
// lands in the local buffer, a device write.
// Expected: E0277.
#![allow(unused)]
use rdma_verbs::*;

fn main() {}

fn proof(
    pd: &ProtectionDomain,
    qp: &QueuePair,
    cq: &CompletionQueue,
    remote: RemoteMemory,
) -> Result<()> {
    let mut sq = qp.send_queue()?;
    let frozen = pd
        .register(vec![0u8; 8], AccessFlags::LOCAL_WRITE)?
        .freeze();
    sq.fetch_and_add(frozen, remote, 1, Wr::id(1))?;
    Ok(())
}
