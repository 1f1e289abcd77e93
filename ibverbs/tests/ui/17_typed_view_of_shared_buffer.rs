// Hazard 17, "A typed view of remote-writable memory": a peer may write a
// `SharedBuffer` at any time, so it has no typed view, only typed copies.
// Expected: E0599.
#![allow(unused)]
use rdma_verbs::*;

fn main() {}

fn proof(
    pd: &ProtectionDomain,
    qp: &QueuePair,
    cq: &CompletionQueue,
    remote: RemoteMemory,
) -> Result<()> {
    let shared = pd.alloc_shared(64, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)?;
    let words: &[u32] = shared.as_slice_of()?;
    Ok(())
}
