// Hazard 1, "Using a buffer after posting it": posting moves the buffer into
// the request, so it is unreachable until the completion hands it back.
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
    let mut buf = pd.register(vec![0u8; 64], AccessFlags::LOCAL_WRITE)?;
    rq.recv(buf, 1)?;
    buf[0] = 1; // the device may be writing it
    Ok(())
}
