// Hazard 20, "Using a buffer after posting it through a request table": a
// request table's post moves the buffer as a post on the send queue does.
// Expected: E0382.
#![allow(unused)]
use rdma_verbs::*;
use rdma_verbs_runtime::{Message, MessageChannel, Reaped, Received, RequestTable, Result, WriteChannel};

fn main() {}

fn proof(
    pd: &ProtectionDomain,
    qp: &QueuePair,
    cq: &CompletionQueue,
    remote: RemoteMemory,
) -> Result<()> {
    let mut sq = qp.send_queue()?;
    let mut table = RequestTable::new(cq, 16);
    let mut buf = pd.alloc(64, AccessFlags::LOCAL_WRITE)?;
    table.post_send(&mut sq, SendRequest::read(buf, remote), 7u32)?;
    buf[0] = 1; // the device may be writing it
    Ok(())
}
