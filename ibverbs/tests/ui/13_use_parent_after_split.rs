// Hazard 13, "Using the halves' parent after a split": `split_at` consumes the
// buffer; each half owns a disjoint range.
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
    let buf = pd.register(vec![0u8; 64], AccessFlags::LOCAL_WRITE)?;
    let (a, b) = buf.split_at(32);
    rq.recv(a, 1)?;
    println!("{}", buf[0]);
    Ok(())
}
