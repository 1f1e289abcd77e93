// Hazard 35, "Holding a polled completion across the next poll": a
// `CompletionRef` (and its `Polled` batch) borrows the `Completions` storage
// its entry was polled into, so neither outlives that storage.
// Expected: E0597.
#![allow(unused)]
use rdma_verbs::*;

fn main() {}

fn proof(cq: &CompletionQueue) -> Result<()> {
    let first;
    {
        let mut comps = Completions::with_capacity(16);
        first = cq.poll(&mut comps)?.next();
    } // the storage is freed under `first`
    if let Some(c) = first {
        println!("{}", c.wr_id());
    }
    Ok(())
}
