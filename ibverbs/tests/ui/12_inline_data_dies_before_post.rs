// Hazard 12, "Inline data that dies before the post": an inline request
// borrows its bytes until `post_send` copies them.
// Expected: E0597.
#![allow(unused)]
use ibverbs::*;

fn main() {}

fn proof(
    pd: &ProtectionDomain,
    qp: &QueuePair,
    cq: &CompletionQueue,
    remote: RemoteMemory,
) -> Result<()> {
    let wr = {
        let data = vec![1u8; 16];
        SendRequest::send_inline(&data)
    };
    qp.post_send(wr)?;
    Ok(())
}
