// Hazard 21, "A table value that borrows the buffer it is posted with": the
// table keeps the value while the request is outstanding, so it cannot borrow
// the request's buffer.
// Expected: E0505.
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
    let buf = pd.alloc(64, AccessFlags::LOCAL_WRITE)?;
    let view: &[u8] = &buf;
    table.post_send(&mut sq, SendRequest::read(buf, remote), view)?;
    if let Some(Reaped::Done(view, _)) = table.poll()? {
        println!("{}", view[0]);
    }
    Ok(())
}
