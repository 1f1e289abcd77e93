// Hazard 6, "Remote-writable memory as a slice": a `SharedBuffer` has no
// `Deref`: a peer could change the bytes behind the reference.
// Expected: E0308.
#![allow(unused)]
use rdma_verbs::*;

fn main() {}

fn proof(
    pd: &ProtectionDomain,
    qp: &QueuePair,
    cq: &CompletionQueue,
    remote: RemoteMemory,
) -> Result<()> {
    let shared = pd.register_shared(
        vec![0u8; 64],
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
    )?;
    let bytes: &[u8] = &shared;
    Ok(())
}
