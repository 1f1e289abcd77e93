// `PreparedRecv`: a borrow of a prepared receive's buffers cannot live across
// `post_prepared(&mut recv)`, which takes it mutably: a peer's message may
// land under it.
// Expected: E0502.
#![allow(unused)]
use rdma_verbs::*;

fn main() {}

fn proof(qp: &QueuePair, buf: LocalBuffer) -> Result<()> {
    let mut rq = qp.recv_queue()?;
    let mut recv = rq.prepare(RecvRequest::new(buf))?;
    let bytes = recv.bytes(0).unwrap();
    rq.post_prepared(&mut recv)?; // a peer's message may land under `bytes`
    println!("{}", bytes[0]);
    Ok(())
}
