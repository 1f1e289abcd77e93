//! Connection management with rdma_cm (librdmacm), behind the `rdmacm`
//! feature.
//!
//! An [`EventChannel`] delivers the events of the [`CmId`]s created on it;
//! its file descriptor can be watched with poll/epoll. The active side
//! resolves an address and a route, creates its PD, CQs and RC
//! [`QueuePair`](crate::QueuePair) on [`CmId::context`] and calls
//! [`CmId::connect`]; the passive side binds, listens, takes the new id of
//! each `ConnectRequest` event and calls [`CmId::accept`] (or
//! [`CmId::reject`]). The library drives the queue pair's state transitions
//! with the attributes rdma_cm computes, so the connected QP is an ordinary
//! one: the owned-buffer data path works unchanged.
//!
//! # Example
//! ```no_run
//! # fn main() -> rdma_verbs::Result<()> {
//! use std::time::Duration;
//! use rdma_verbs::cm::{CmEventType, CmId, ConnParam, EventChannel};
//! use rdma_verbs::QpType;
//!
//! let ch = EventChannel::new()?;
//! let id = CmId::new(&ch)?;
//! let t = Some(Duration::from_secs(2));
//! id.resolve_addr(None, "10.0.2.15:7174".parse().unwrap(), Duration::from_secs(2))?;
//! ch.get_event(t)?.expect(CmEventType::AddrResolved)?;
//! id.resolve_route(Duration::from_secs(2))?;
//! ch.get_event(t)?.expect(CmEventType::RouteResolved)?;
//! let ctx = id.context().expect("resolved");
//! let pd = ctx.alloc_pd()?;
//! let cq = ctx.create_cq(16).build()?;
//! let qp = pd.create_qp(QpType::Rc, &cq, &cq).build()?;
//! id.connect(&qp, &ConnParam::new())?;
//! ch.get_event(t)?.expect(CmEventType::Established)?;
//! // post to `qp` as usual …
//! id.disconnect()?;
//! # Ok(()) }
//! ```
//!
//! # References
//! `rdma_cm(7)`

mod addrinfo;
mod cm_id;
mod create_qp;
mod event_channel;
mod migrate;
mod multicast;
mod option;
mod sync_mode;
mod ud;

pub use crate::types::CmEventType;
pub use addrinfo::{AddrInfo, AddrInfoHints};
pub use cm_id::{CmId, ConnParam, PortSpace};
pub use event_channel::{CmEvent, EventChannel};
pub use multicast::{JoinFlags, UdParam};
pub use option::CmOption;
