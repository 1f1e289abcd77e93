// Hazard 33, "Re-registering a region while the device may use it":
// `rereg_access` takes the buffer mutably, and a posted buffer moved into its
// request.
// Expected: E0382.
#![allow(unused)]
use rdma_verbs::*;

fn main() {}

fn proof(pd: &ProtectionDomain, qp: &QueuePair) -> Result<()> {
    let mut sq = qp.send_queue()?;
    let mut buf = pd.alloc(4096, AccessFlags::LOCAL_WRITE)?;
    sq.send(buf, Wr::id(1))?;
    buf.rereg_access(AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ)?;
    Ok(())
}
