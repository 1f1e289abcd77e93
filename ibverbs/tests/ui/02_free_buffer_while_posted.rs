// Hazard 2, "Freeing a buffer while it is posted": dropping needs ownership,
// and the posted request has it.
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
    let mut sq = qp.send_queue()?;
    let buf = pd.register(vec![0u8; 64], AccessFlags::LOCAL_WRITE)?;
    sq.send(buf, Wr::id(1))?;
    drop(buf);
    Ok(())
}
