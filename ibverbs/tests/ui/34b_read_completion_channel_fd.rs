// Hazard 34, "Reading the library's event descriptors from safe code": a
// CQ event read past libibverbs is never acknowledged, and
// `ibv_destroy_cq` waits for that forever, so `CompletionChannel` lends
// its descriptor only as a raw fd (no `AsFd`).
// Expected: E0599.
#![allow(unused)]
use rdma_verbs::*;
use rdma_verbs::cq::CompletionChannel;
use std::io::Read;
use std::os::fd::AsFd;

fn main() {}

fn proof(channel: &CompletionChannel) -> std::io::Result<()> {
    let fd = channel.as_fd().try_clone_to_owned()?;
    std::fs::File::from(fd).read(&mut [0u8; 32])?;
    Ok(())
}
