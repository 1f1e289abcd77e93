// Hazard 12, "Inline data that dies before the post": an inline request
// (a `SendRequest`, for a chain) borrows its bytes until `post_chain` copies
// them.
// Expected: E0597.
#![allow(unused)]
use rdma_verbs::*;

fn main() {}

fn proof(
    pd: &ProtectionDomain,
    qp: &QueuePair,
    cq: &CompletionQueue,
    remote: RemoteMemory,
) -> Result<()> {
    let mut sq = qp.send_queue()?;
    let wr = {
        let data = vec![1u8; 16];
        SendRequest::send_inline(&data)
    };
    sq.post_chain(&mut vec![wr])?;
    Ok(())
}
