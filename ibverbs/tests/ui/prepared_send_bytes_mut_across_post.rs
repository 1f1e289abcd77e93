// `PreparedSend`: a mutable borrow of a prepared request's buffers cannot
// live across `post()`, which takes `&mut self`: the device may write what
// it borrows.
// Expected: E0499.
#![allow(unused)]
use ibverbs::*;

fn main() {}

fn proof(qp: &QueuePair, buf: LocalBuffer, remote: RemoteMemory) -> Result<()> {
    let mut read = qp.prepare_send(SendRequest::read(buf, remote))?;
    let bytes = read.bytes_mut(0).unwrap();
    read.post()?; // the device may write what `bytes` borrows
    bytes[0] = 1;
    Ok(())
}
