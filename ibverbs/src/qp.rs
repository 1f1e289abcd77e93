//! Queue pairs and the queues they post to: the posting handles, requests, connection and attributes, shared receive queues, XRC.

pub(crate) mod queue_pair;
pub(crate) mod shared_receive_queue;
pub(crate) mod xrc_domain;

pub use crate::address_handle::{AddressHandle, AddressVector, DEFAULT_HOP_LIMIT};
pub use crate::inflight::owner::{Owner, MAX_OWNERS};
pub use crate::types::{QpNumber, QpState, QpType, RequestOption, SendOp, SendOpFlags};
pub use crate::wire::Endpoint;
pub use queue_pair::{
    ConnectOptions, Ece, LocalPort, PathMigState, Posted, PreparedRecv, PreparedSend, QpAttr,
    QpAttrView, QpCaps, QueuePair, QueuePairBuilder, RecvQueue, RecvRequest, Refused, SendQueue,
    SendRequest, UdDest, Wr,
};
pub use queue_pair::{FlushLevel, FlushType};
pub use shared_receive_queue::{SharedReceiveQueue, SharedReceiveQueueBuilder};
pub use xrc_domain::{XrcDomain, XrcRecvQueuePair, XrcdOpenFlags, XrcdOptions};
