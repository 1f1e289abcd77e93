// Hazard 34, "Reading the library's event descriptors from safe code": an
// async event read past libibverbs is never acknowledged, and
// `ibv_destroy_qp`/`_srq`/`_cq` wait for that forever, so `Context` lends
// its descriptor only as a raw fd (no `AsFd`).
// Expected: E0599.
#![allow(unused)]
use rdma_verbs::*;
use std::io::Read;
use std::os::fd::AsFd;

fn main() {}

fn proof(ctx: &Context) -> std::io::Result<()> {
    let fd = ctx.as_fd().try_clone_to_owned()?;
    std::fs::File::from(fd).read(&mut [0u8; 32])?;
    Ok(())
}
