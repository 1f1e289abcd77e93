// Hazard 29, "A reference into a write channel's inbox": a peer writes a
// `WriteChannel`'s inbox, so a `Received` has no `Deref` and no index.
// Expected: E0608.
#![allow(unused)]
use rdma_verbs::*;
use rdma_verbs_runtime::{Message, MessageChannel, Reaped, Received, RequestTable, Result, WriteChannel};

fn main() {}

fn proof(ch: &mut WriteChannel) -> Result<()> {
    let w = ch.recv(None)?.unwrap();
    let bytes: &[u8] = &w[..]; // the peer may write these bytes
    println!("{}", bytes[0]);
    Ok(())
}
