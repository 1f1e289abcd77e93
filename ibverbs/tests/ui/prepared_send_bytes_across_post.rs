// `PreparedSend`: a shared borrow of a prepared read's buffers cannot live
// across `post_prepared(&mut read)` either: Rust would see the bytes change
// under it.
// Expected: E0502.
#![allow(unused)]
use rdma_verbs::*;

fn main() {}

fn proof(qp: &QueuePair, buf: LocalBuffer, remote: RemoteMemory) -> Result<()> {
    let mut sq = qp.send_queue()?;
    let mut read = sq.prepare(SendRequest::read(buf, remote))?;
    let bytes = read.bytes(0).unwrap();
    sq.post_prepared(&mut read)?; // a read Rust sees change under it
    println!("{}", bytes[0]);
    Ok(())
}
