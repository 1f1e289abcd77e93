// Hazard 31, "Registering a dmabuf, or reading its bytes, from safe code": a
// dmabuf's bytes are its exporter's: `DmabufRegion` has no `Deref` and no
// index.
// Expected: E0608.
#![allow(unused)]
use rdma_verbs::*;
use rdma_verbs::memory::DmabufRegion;

fn main() {}

fn proof(r: &DmabufRegion) {
    let _b: u8 = r[0]; // no Deref to the exporter's bytes
}
