// Hazard 23, "Using a buffer after it went back to the pool": dropping a
// `PooledBuffer` returns it to the pool: the next `get` may hand its bytes to
// someone else.
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
    let mut buf = pool.get().unwrap();
    drop(buf);
    buf[0] = 1;
    Ok(())
}
