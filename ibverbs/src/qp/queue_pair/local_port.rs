//! What one side knows of its own port when connecting queue pairs
//! ([`LocalPort`]): queried once, reused for every queue pair.

use std::sync::Arc;

use super::connect::check_24;
use crate::error::{Error, Result};

use crate::device::context::Context;
use crate::device::port::PortAttr;
use crate::qp::queue_pair::QueuePair;
use crate::types::{Gid, GidIndex, PortNumber};
use crate::wire::Endpoint;

/// The facts of a local port that connecting a queue pair needs: its
/// attributes (link layer, LID, active MTU) and the GID it sends from.
///
/// Queried once, as a C program does, and used for every queue pair on
/// the port: [`LocalPort::endpoint`] makes each one's [`Endpoint`] (the
/// only way to make this side's), and
/// [`ConnectOptions::local_port`](crate::ConnectOptions::local_port) hands
/// the same facts to [`QueuePair::connect`], so that it sends from the GID
/// the endpoint carries and makes no system call but its three
/// `ibv_modify_qp`. (Without it, `connect` queries the port and GID on
/// every call: `ibv_query_port`, `ibv_query_gid`, and the GID table when
/// no index is given.)
///
/// A snapshot: a port's attributes and GIDs can change (the link goes
/// down, an address is removed). Query again after such an event
/// (`IBV_EVENT_PORT_ERR`, `IBV_EVENT_GID_CHANGE`, …); a stale snapshot
/// makes connections fail, never memory unsafe.
///
/// # References
/// `ibv_query_port(3)`, `ibv_query_gid(3)`
#[derive(Clone)]
pub struct LocalPort {
    ctx: Context,
    attr: PortAttr,
    /// The GID index given, or the default one on a port that needs a GRH;
    /// `None`: LID-only addressing (InfiniBand without a GID index).
    gid_index: Option<GidIndex>,
    /// The GID at `gid_index` ([`Gid::ZERO`] without one).
    gid: Gid,
}

impl LocalPort {
    /// Queries `port` of `ctx` and the GID at `gid_index`. With `None`, a
    /// port that needs a GRH (RoCE) uses
    /// [`Context::default_gid_index`], and InfiniBand addresses by LID
    /// only ([`Gid::ZERO`], as `ibv_rc_pingpong` without `-g`).
    ///
    /// The index is this side's: the endpoints made here carry its GID, so
    /// the peer sends to it, and this side must send from it too. Pass this
    /// `LocalPort` to this side's
    /// [`ConnectOptions::local_port`](crate::ConnectOptions::local_port)
    /// (or give this side's
    /// [`ConnectOptions::gid_index`](crate::ConnectOptions::gid_index) the
    /// same index). The peer chooses its own index for its own GID.
    ///
    /// # Errors
    /// [`Error::EmptyGid`] when the port needs a GRH and the GID entry is
    /// empty; [`Error::Verb`] naming `ibv_query_port`,
    /// `ibv_query_gid` or `ibv_query_gid_table`.
    #[doc(alias = "ibv_query_port")]
    #[doc(alias = "ibv_query_gid")]
    pub fn query(
        ctx: &Context,
        port: PortNumber,
        gid_index: Option<GidIndex>,
    ) -> Result<LocalPort> {
        let attr = ctx.query_port(port)?;
        let gid_index = match gid_index {
            Some(i) => Some(i),
            None if attr.grh_required() => Some(ctx.default_gid_index(port)?),
            None => None,
        };
        let gid = match gid_index {
            Some(i) => ctx.query_gid(port, i)?,
            None => Gid::ZERO,
        };
        if attr.grh_required() && gid.is_zero() {
            return Err(Error::EmptyGid {
                port,
                index: gid_index.unwrap_or(GidIndex(0)),
            });
        }
        Ok(LocalPort {
            ctx: ctx.clone(),
            attr,
            gid_index,
            gid,
        })
    }

    /// The endpoint of `qp` on this port, for the peer and for `qp`'s own
    /// [`QueuePair::connect`]: its QP number, `psn` (the first PSN `qp`
    /// will send, e.g. [`Endpoint::random_psn`]), the port's LID and the
    /// GID. No system call.
    ///
    /// # Errors
    /// [`Error::OutOfRange`] when `psn` exceeds 24 bits,
    /// [`Error::ForeignContext`] when `qp` was created on another device
    /// context.
    pub fn endpoint(&self, qp: &QueuePair, psn: u32) -> Result<Endpoint> {
        check_24("psn", psn)?;
        self.check_context(qp)?;
        Ok(Endpoint {
            qp_num: qp.qp_num(),
            psn,
            lid: self.attr.lid(),
            gid: self.gid,
        })
    }

    /// The port.
    pub fn port(&self) -> PortNumber {
        self.attr.port()
    }

    /// The port's attributes, as queried.
    pub fn attr(&self) -> &PortAttr {
        &self.attr
    }

    /// The GID index this side sends from (`None`: LID-only addressing).
    pub fn gid_index(&self) -> Option<GidIndex> {
        self.gid_index
    }

    /// The GID at [`gid_index`](Self::gid_index) ([`Gid::ZERO`] without
    /// one), as queried.
    pub fn gid(&self) -> Gid {
        self.gid
    }

    /// The GID at `index`, if this snapshot holds it.
    pub(super) fn gid_at(&self, index: GidIndex) -> Option<Gid> {
        (self.gid_index == Some(index)).then_some(self.gid)
    }

    /// Refuses a queue pair of another device context (whose port this is
    /// not).
    pub(super) fn check_context(&self, qp: &QueuePair) -> Result<()> {
        if Arc::ptr_eq(&self.ctx.inner, &qp.pd().context().inner) {
            return Ok(());
        }
        Err(Error::ForeignContext { what: "LocalPort" })
    }
}

impl std::fmt::Debug for LocalPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalPort")
            .field("device", &self.ctx.name())
            .field("attr", &self.attr)
            .field("gid_index", &self.gid_index)
            .field("gid", &self.gid)
            .finish()
    }
}
