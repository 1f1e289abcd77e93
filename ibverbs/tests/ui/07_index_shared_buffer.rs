// Hazard 7, "Indexing remote-writable memory": a `SharedBuffer` has no
// `Index`/`IndexMut`, so no `[]` reads or writes.
// Expected: E0608.
#![allow(unused)]
use rdma_verbs::*;

fn main() {}

fn proof(
    pd: &ProtectionDomain,
    qp: &QueuePair,
    cq: &CompletionQueue,
    remote: RemoteMemory,
) -> Result<()> {
    let mut shared = pd.register_shared(
        vec![0u8; 64],
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_ATOMIC,
    )?;
    shared[0] = 1;
    Ok(())
}
