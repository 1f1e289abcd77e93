// Hazard 28, "Two threads on one channel end": `send` and `recv` take `&mut`,
// so two threads cannot use one channel end at once.
// Expected: E0499.
#![allow(unused)]
use rdma_verbs::*;
use rdma_verbs_runtime::{Message, MessageChannel, Reaped, Received, RequestTable, Result, WriteChannel};

fn main() {}

fn proof(ch: &mut MessageChannel) -> Result<()> {
    std::thread::scope(|s| {
        s.spawn(|| ch.send(b"one", None));
        s.spawn(|| ch.send(b"two", None));
    });
    Ok(())
}
