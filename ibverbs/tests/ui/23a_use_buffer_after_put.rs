// Hazard 23, "Using a buffer after it went back to the pool":
// `BufferPool::put` consumes the buffer: the next `get` may hand its bytes to
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
    let buf = pool.get().unwrap().into_local();
    pool.put(buf)?;
    println!("{}", buf[0]);
    Ok(())
}
