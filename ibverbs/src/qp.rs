//! Queue pairs and the queues they post to: the posting handles, requests, connection and attributes, shared receive queues, XRC.

pub(crate) mod queue_pair;
pub(crate) mod shared_receive_queue;
pub(crate) mod xrc_domain;
