// Hazard 30, "Reading a received write after its credit went back": a
// `Received` borrows its channel, so it cannot be kept across the `send` that
// may reuse its credit.
// Expected: E0499.
#![allow(unused)]
use rdma_verbs::*;
use rdma_verbs_runtime::{Message, MessageChannel, Reaped, Received, RequestTable, Result, WriteChannel};

fn main() {}

fn proof(ch: &mut WriteChannel) -> Result<()> {
    let w = ch.recv(None)?.unwrap();
    ch.send(b"next", None)?; // may take the credit the guard still owes
    let mut b = [0u8; 4];
    w.copy_to_slice(0, &mut b)?;
    Ok(())
}
