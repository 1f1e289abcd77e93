// Hazard 27, "Sending from a received message's buffer": a `Message` borrows
// its channel, so it cannot be the source of the next `send`.
// Expected: E0499.
#![allow(unused)]
use rdma_verbs::*;
use rdma_verbs_runtime::{Message, MessageChannel, Reaped, Received, RequestTable, Result, WriteChannel};

fn main() {}

fn proof(ch: &mut MessageChannel) -> Result<()> {
    let msg = ch.recv(None)?.unwrap();
    ch.send(&msg, None)?; // echo from the receive buffer
    Ok(())
}
