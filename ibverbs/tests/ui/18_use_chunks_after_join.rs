// Hazard 18, "Using chunks after joining them": `join` consumes the pieces;
// only the joined buffer reaches their bytes.
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
    let mut rq = qp.recv_queue()?;
    let (chunks, _) = pd.alloc(64, AccessFlags::LOCAL_WRITE)?.chunks_exact(16);
    let whole = LocalBuffer::join(chunks).unwrap();
    rq.recv(whole, 1)?;
    println!("{}", chunks[0][0]);
    Ok(())
}
