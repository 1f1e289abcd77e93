// Hazard 35, "Holding a polled completion across the next poll": a
// `CompletionRef` borrows its entry in the `Completions` storage, which the
// next poll into that storage overwrites; so the storage stays borrowed until
// the completion is dropped (or made owned with `into_owned`).
// Expected: E0499.
#![allow(unused)]
use rdma_verbs::*;

fn main() {}

fn proof(cq: &CompletionQueue) -> Result<()> {
    let mut comps = Completions::with_capacity(16);
    let first = cq.poll(&mut comps)?.next();
    cq.poll(&mut comps)?; // overwrites the entry `first` reads
    if let Some(mut c) = first {
        println!("{} {:?}", c.wr_id(), c.take_local().map(|b| b.len()));
    }
    Ok(())
}
