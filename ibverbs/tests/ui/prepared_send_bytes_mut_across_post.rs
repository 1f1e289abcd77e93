// `PreparedSend`: a mutable borrow of a prepared request's buffers cannot
// live across `post_prepared(&mut read)`, which takes it mutably: the device
// may write what it borrows.
// Expected: E0499.
#![allow(unused)]
use rdma_verbs::*;

fn main() {}

fn proof(qp: &QueuePair, buf: LocalBuffer, remote: RemoteMemory) -> Result<()> {
    let mut sq = qp.send_queue()?;
    let mut read = sq.prepare(SendRequest::read(buf, remote))?;
    let bytes = read.bytes_mut(0).unwrap();
    sq.post_prepared(&mut read)?; // the device may write what `bytes` borrows
    bytes[0] = 1;
    Ok(())
}
