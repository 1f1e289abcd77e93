// Hazard 14, "Raw polling that would swallow safe completions": `poll_raw`
// could swallow a safe request's completion and its buffers, so it is
// `unsafe`.
// Expected: E0133.
#![allow(unused)]
use rdma_verbs::*;
use rdma_verbs::cq::WorkCompletion;

fn main() {}

fn proof(
    pd: &ProtectionDomain,
    qp: &QueuePair,
    cq: &CompletionQueue,
    remote: RemoteMemory,
) -> Result<()> {
    let mut raw = vec![WorkCompletion::default(); 16];
    cq.poll_raw(&mut raw)?;
    Ok(())
}
