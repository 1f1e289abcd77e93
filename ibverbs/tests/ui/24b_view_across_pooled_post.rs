// Hazard 24, "Keeping a view of a pooled buffer after giving it back": a view
// borrows the `PooledBuffer`, so it cannot outlive the post that hands it to
// the device.
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
    let mut sq = qp.send_queue()?;
    let buf = pool.get().unwrap();
    let view: &[u8] = &buf;
    sq.write(buf, remote, Wr::id(1))?;
    println!("{}", view[0]);
    Ok(())
}
