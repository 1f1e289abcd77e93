// Hazard 3, "Keeping a slice across the post": a borrow of the buffer cannot
// outlive its move into the request.
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
    let mut rq = qp.recv_queue()?;
    let buf = pd.register(vec![0u8; 64], AccessFlags::LOCAL_WRITE)?;
    let view: &[u8] = &buf;
    rq.recv(buf, 1)?;
    println!("{}", view[0]);
    Ok(())
}
