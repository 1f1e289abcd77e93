// Hazard 36, "Two threads posting through one send queue handle": every post
// takes the handle `&mut` (it owns the queue's ring, without a lock), so two
// threads cannot post through it at once; share it in a `Mutex`.
// Expected: E0499.
#![allow(unused)]
use rdma_verbs::*;

fn main() {}

fn proof(qp: &QueuePair) -> Result<()> {
    let mut sq = qp.send_queue()?;
    std::thread::scope(|s| {
        s.spawn(|| sq.send_inline(b"one", Wr::id(1)));
        s.spawn(|| sq.send_inline(b"two", Wr::id(2)));
    });
    Ok(())
}
