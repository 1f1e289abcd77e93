//! The streaming engine of the bandwidth tools: keep up to `tx depth`
//! requests outstanding, post them in lists of `-l`, signal every `-Q`-th
//! (and the last), and time every post and completion.
//!
//! Steady state allocates nothing: the request list, the timestamp vectors
//! and the completion batch are allocated before the run and reused, and
//! the requests carry buffers the source hands out and takes back.

use std::time::Instant;

use rdma_verbs::{Completion, SendQueue, SendRequest};

use crate::Done;

use super::{ns_since, stats, Result, Waiter};

/// Where the requests of a stream come from.
pub trait Source<'a> {
    /// The request for message `index`; the engine sets its `wr_id` and
    /// signaling. Unsignaled requests may only carry frozen buffers or
    /// inline data (the library refuses anything else).
    fn request(&mut self, index: u64) -> Result<SendRequest<'a>>;
    /// A signaled request completed successfully; take its buffers back.
    fn completed(&mut self, c: &mut Completion) -> Result<()>;
}

/// Shape of a stream.
#[derive(Debug, Clone, Copy)]
pub struct Params {
    /// Messages.
    pub n: u64,
    /// Most requests outstanding at once.
    pub depth: u64,
    /// Requests per post list.
    pub post_list: u64,
    /// Signal every `cq_mod`-th request.
    pub cq_mod: u64,
}

/// Post and completion times of each message, in ns since `base`.
pub struct Timing {
    base: Instant,
    /// When each message was posted.
    pub posted: Vec<u64>,
    /// When each message was known complete.
    pub completed: Vec<u64>,
}

impl Timing {
    /// Room for `n` messages, allocated now.
    pub fn with_capacity(n: u64) -> Timing {
        Timing {
            base: Instant::now(),
            posted: Vec::with_capacity(n as usize),
            completed: Vec::with_capacity(n as usize),
        }
    }

    /// The bandwidth figures of the last stream.
    pub fn summary(&self, size: u64, p: &Params) -> Option<stats::BwSummary> {
        stats::bandwidth(
            size,
            &self.posted,
            &self.completed,
            p.post_list as usize,
            p.cq_mod as usize,
        )
    }
}

/// Streams `p.n` requests from `src` through `sq`, waiting on `waiter`.
pub fn run<'a, S: Source<'a>>(
    sq: &mut SendQueue,
    waiter: &mut Waiter,
    done: &mut Done,
    p: Params,
    src: &mut S,
    t: &mut Timing,
) -> Result<()> {
    let n = p.n as usize;
    t.posted.clear();
    t.posted.resize(n, 0);
    t.completed.clear();
    t.completed.resize(n, 0);
    let mut list: Vec<SendRequest<'a>> = Vec::with_capacity(p.post_list as usize);
    let (mut posted, mut completed) = (0u64, 0u64);
    while completed < p.n {
        while posted < p.n {
            let l = p.post_list.min(p.n - posted);
            if posted - completed + l > p.depth {
                break;
            }
            for idx in posted..posted + l {
                let signaled = (idx + 1) % p.cq_mod == 0 || idx + 1 == p.n;
                list.push(src.request(idx)?.wr_id(idx).signaled(signaled));
            }
            let ts = ns_since(t.base);
            if let Err(e) = sq.post_chain(&mut list) {
                list.clear();
                return Err(format!("posting request {posted}: {e}").into());
            }
            t.posted[posted as usize..(posted + l) as usize].fill(ts);
            posted += l;
        }
        waiter.wait(done, "a send-queue request")?;
        let ts = ns_since(t.base);
        for mut c in done.drain() {
            c.result()?;
            let idx = c.wr_id();
            if idx < completed || idx >= posted {
                return Err(format!(
                    "unexpected completion for request {idx} ({completed} of {posted} posted \
                     requests were complete)"
                )
                .into());
            }
            t.completed[completed as usize..=idx as usize].fill(ts);
            completed = idx + 1;
            src.completed(&mut c)?;
        }
    }
    Ok(())
}
