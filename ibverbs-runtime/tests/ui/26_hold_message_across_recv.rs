// Hazard 26, "Holding a received message across the next receive": a `Message`
// borrows its channel, so the next `recv` waits until it is released.
// Expected: E0499.
#![allow(unused)]
use rdma_verbs::*;
use rdma_verbs_runtime::{Message, MessageChannel, Reaped, Received, RequestTable, Result, WriteChannel};

fn main() {}

fn proof(ch: &mut MessageChannel) -> Result<()> {
    let first = ch.recv(None)?.unwrap();
    let second = ch.recv(None)?.unwrap();
    println!("{} {}", first.len(), second.len());
    Ok(())
}
