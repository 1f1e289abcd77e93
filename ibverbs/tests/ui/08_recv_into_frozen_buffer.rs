// Hazard 8, "Receiving into a frozen buffer": a `FrozenBuffer` is read through
// clones while posted, so it is not `DeviceWritable`.
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
    let mut rq = qp.recv_queue()?;
    let frozen = pd
        .register(vec![0u8; 64], AccessFlags::LOCAL_WRITE)?
        .freeze();
    rq.recv(frozen, 1)?;
    Ok(())
}
