// Hazard 16, "Two typed views of one buffer, one of them mutable": typed views
// follow the buffer's borrow rules: no `&[T]` aliases a `&mut [U]`.
// Expected: E0502.
#![allow(unused)]
use rdma_verbs::*;

fn main() {}

fn proof(
    pd: &ProtectionDomain,
    qp: &QueuePair,
    cq: &CompletionQueue,
    remote: RemoteMemory,
) -> Result<()> {
    let mut buf = pd.alloc(64, AccessFlags::LOCAL_WRITE)?;
    let words: &[u32] = buf.as_slice_of()?;
    let floats: &mut [f32] = buf.as_mut_slice_of()?;
    floats[0] = words[0] as f32;
    Ok(())
}
