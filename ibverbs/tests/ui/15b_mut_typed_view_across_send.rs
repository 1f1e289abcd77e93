// Hazard 15, "A typed view across the post": a mutable typed view borrows the
// buffer, so it cannot outlive its move into a request.
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
    let mut sq = qp.send_queue()?;
    let mut buf = pd.alloc(64, AccessFlags::LOCAL_WRITE)?;
    let words: &mut [u32] = buf.as_mut_slice_of()?;
    sq.send(buf, Wr::id(1))?;
    words[0] = 1; // the device may be reading it
    Ok(())
}
