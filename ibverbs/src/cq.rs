//! Completion queues: polling, completion channels, extended CQs, work completions.

pub(crate) mod completion_channel;
pub(crate) mod completion_queue;
pub(crate) mod extended_cq;
pub(crate) mod work_completion;
