// Hazard 34, "Reading the library's event descriptors from safe code":
// rdma_ucm's `write(2)` commands carry pointers the kernel writes its
// responses to (and a read takes an event librdmacm never acknowledges),
// so `cm::EventChannel` lends its descriptor only as a raw fd (no `AsFd`).
// Expected: E0599.
#![allow(unused)]
use rdma_verbs::cm::EventChannel;
use std::io::Write;
use std::os::fd::AsFd;

fn main() {}

fn proof(channel: &EventChannel) -> std::io::Result<()> {
    let fd = channel.as_fd().try_clone_to_owned()?;
    std::fs::File::from(fd).write(&[0u8; 32])?;
    Ok(())
}
