// Hazard 25, "Reading a received message after releasing it": dropping a
// `Message` posts its buffer again, and its bytes borrow it.
// Expected: E0505.
#![allow(unused)]
use rdma_verbs::*;
use rdma_verbs_runtime::{Message, MessageChannel, Reaped, Received, RequestTable, Result, WriteChannel};

fn main() {}

fn proof(ch: &mut MessageChannel) -> Result<()> {
    let msg = ch.recv(None)?.unwrap();
    let bytes: &[u8] = &msg;
    drop(msg); // posted again: the device may be writing it
    println!("{}", bytes[0]);
    Ok(())
}
