// Hazard 24, "Keeping a view of a pooled buffer after giving it back": a view
// borrows the `PooledBuffer`, so it cannot outlive the drop that returns it to
// the pool.
// Expected: E0505.
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
    let buf = pool.get().unwrap();
    let words: &[u32] = buf.as_slice_of()?;
    drop(buf);
    println!("{}", words[0]); // another thread may have the bytes now
    Ok(())
}
