// Hazard 19, "Keeping a buffer across posting it in a chain": a chain moves
// each buffer into its request as a single post does.
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
    let buf = pd.register(vec![0u8; 64], AccessFlags::LOCAL_WRITE)?;
    let view: &[u8] = &buf;
    let mut chain = vec![SendRequest::write(buf, remote)];
    sq.post_chain(&mut chain)?;
    println!("{}", view[0]);
    Ok(())
}
