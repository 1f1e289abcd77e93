// Hazard 3, "Keeping a slice across the post": a borrow of the buffer cannot
// outlive its move into the request.
// Expected: E0505.
#![allow(unused)]
use ibverbs::*;

fn main() {}

fn proof(
    pd: &ProtectionDomain,
    qp: &QueuePair,
    cq: &CompletionQueue,
    remote: RemoteMemory,
) -> Result<()> {
    let buf = pd.register(vec![0u8; 64], AccessFlags::LOCAL_WRITE)?;
    let view: &[u8] = &buf;
    qp.post_recv(RecvRequest::new(buf))?;
    println!("{}", view[0]);
    Ok(())
}
