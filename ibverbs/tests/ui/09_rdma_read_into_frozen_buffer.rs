// Hazard 9, "RDMA read into a frozen buffer": an RDMA read's result is a
// device write, so it needs a `DeviceWritable` buffer.
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
        .register(vec![0u8; 64], AccessFlags::LOCAL_WRITE)?
        .freeze();
    sq.read(frozen, remote, Wr::id(1))?;
    Ok(())
}
