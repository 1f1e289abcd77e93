// `PreparedRecv`: a borrow of a prepared receive's buffers cannot live across
// `post()`, which takes `&mut self`: a peer's message may land under it.
// Expected: E0502.
#![allow(unused)]
use ibverbs::*;

fn main() {}

fn proof(qp: &QueuePair, buf: LocalBuffer) -> Result<()> {
    let mut recv = qp.prepare_recv(RecvRequest::new(buf))?;
    let bytes = recv.bytes(0).unwrap();
    recv.post()?; // a peer's message may land under `bytes`
    println!("{}", bytes[0]);
    Ok(())
}
