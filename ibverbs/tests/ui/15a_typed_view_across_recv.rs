// Hazard 15, "A typed view across the post": a typed view borrows the buffer,
// so it cannot outlive its move into a request.
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
    let buf = pd.alloc(64, AccessFlags::LOCAL_WRITE)?;
    let floats: &[f32] = buf.as_slice_of()?;
    rq.recv(buf, 1)?;
    println!("{}", floats[0]); // the device may be writing it
    Ok(())
}
