//! Completions kept, owned, in polling order: what the tools and tests
//! take one at a time. The library lends each poll's completions out
//! (`CompletionQueue::poll`); this keeps them for later.

use std::collections::VecDeque;
use std::time::Duration;

use rdma_verbs::{cq::CompletionRef, Completion, CompletionQueue, Completions};

/// Owned completions from polls, oldest first.
pub struct Done {
    storage: Completions,
    kept: VecDeque<Completion>,
}

impl Done {
    /// Room for `capacity` completions per poll (and as many kept).
    pub fn with_capacity(capacity: usize) -> Done {
        let capacity = capacity.max(1);
        Done {
            storage: Completions::with_capacity(capacity),
            kept: VecDeque::with_capacity(2 * capacity),
        }
    }

    /// Polls `cq` once, keeping what came (none while `capacity` are kept
    /// already): how many.
    pub fn poll(&mut self, cq: &CompletionQueue) -> rdma_verbs::Result<usize> {
        if self.kept.len() >= self.storage.capacity() {
            return Ok(0);
        }
        let before = self.kept.len();
        let polled = cq.poll(&mut self.storage)?;
        self.kept.extend(polled.map(CompletionRef::into_owned));
        Ok(self.kept.len() - before)
    }

    /// [`CompletionQueue::wait`] into the kept completions: how many came.
    pub fn wait(
        &mut self,
        cq: &CompletionQueue,
        timeout: Option<Duration>,
    ) -> rdma_verbs::Result<usize> {
        if self.kept.len() >= self.storage.capacity() {
            return Ok(0);
        }
        let before = self.kept.len();
        let polled = cq.wait(&mut self.storage, timeout)?;
        self.kept.extend(polled.map(CompletionRef::into_owned));
        Ok(self.kept.len() - before)
    }

    /// The oldest kept completion.
    pub fn pop(&mut self) -> Option<Completion> {
        self.kept.pop_front()
    }

    /// Every kept completion, oldest first.
    pub fn drain(&mut self) -> std::collections::vec_deque::Drain<'_, Completion> {
        self.kept.drain(..)
    }

    /// Completions kept.
    pub fn len(&self) -> usize {
        self.kept.len()
    }

    /// Whether none is kept.
    pub fn is_empty(&self) -> bool {
        self.kept.is_empty()
    }

    /// The kept completions (without taking them).
    pub fn iter(&self) -> impl Iterator<Item = &Completion> {
        self.kept.iter()
    }
}

impl std::fmt::Debug for Done {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.kept.iter()).finish()
    }
}
