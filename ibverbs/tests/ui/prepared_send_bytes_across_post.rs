// `PreparedSend`: a shared borrow of a prepared read's buffers cannot live
// across `post()` either: Rust would see the bytes change under it.
// Expected: E0502.
#![allow(unused)]
use ibverbs::*;

fn main() {}

fn proof(qp: &QueuePair, buf: LocalBuffer, remote: RemoteMemory) -> Result<()> {
    let mut read = qp.prepare_send(SendRequest::read(buf, remote))?;
    let bytes = read.bytes(0).unwrap();
    read.post()?; // a read Rust sees change under it
    println!("{}", bytes[0]);
    Ok(())
}
