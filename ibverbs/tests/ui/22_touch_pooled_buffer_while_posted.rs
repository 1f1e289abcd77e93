// Hazard 22, "Touching a pooled buffer while it is posted": posting a
// `PooledBuffer` moves it to the queue pair until the completion hands it
// back.
// Expected: E0382.
#![allow(unused)]
use rdma_verbs::*;
use rdma_verbs::memory::BufferPool;

fn main() {}

fn proof(
    pool: &BufferPool,
    qp: &QueuePair,
    cq: &CompletionQueue,
    remote: RemoteMemory,
) -> Result<()> {
    let mut rq = qp.recv_queue()?;
    let mut buf = pool.get().unwrap();
    rq.recv(buf, 1)?;
    buf[0] = 1; // the device may be writing it
    Ok(())
}
