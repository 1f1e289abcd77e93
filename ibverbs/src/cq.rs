//! Completion queues: polling, completion channels, extended CQs, work completions.

pub(crate) mod completion_channel;
pub(crate) mod completion_queue;
pub(crate) mod extended_cq;
pub(crate) mod work_completion;

pub use crate::types::WcStatus;
pub use completion_channel::CompletionChannel;
pub use completion_queue::{
    Completion, CompletionQueue, CompletionQueueBuilder, CompletionRef, Completions, Polled,
};
pub use extended_cq::CompletionFields;
pub use work_completion::{WcOpcode, WorkCompletion};
