//! Connecting queue pairs: the endpoints peers exchange ([`Endpoint`]), the path and
//! transport parameters ([`ConnectOptions`]), and the RESET→INIT→RTR→RTS
//! helpers built on [`QueuePair::modify`].

use crate::address_handle::AddressVector;
use crate::device::port::{Mtu, PortAttr};
use crate::error::{Error, Result};
use crate::qp::queue_pair::{LocalPort, QpAttr, QueuePair};
use crate::types::{AccessFlags, GidIndex, PortNumber, QpState, QpType};
use crate::wire::{Endpoint, MAX_24};

pub(super) fn check_24(what: &'static str, v: u32) -> Result<()> {
    if v > MAX_24 {
        return Err(Error::OutOfRange {
            what,
            value: v.into(),
            max: MAX_24.into(),
        });
    }
    Ok(())
}

/// Path and transport parameters for [`QueuePair::connect`].
///
/// Defaults follow rdma-core's `ibv_rc_pingpong`: path MTU 1024 (capped at
/// the port's active MTU), service level 0, `timeout` 14, `retry_cnt` 7,
/// `rnr_retry` 7, `min_rnr_timer` 12, one outstanding RDMA read/atomic each
/// way, P_Key index 0. The GRH hop limit is 64 (pingpong uses 1, which
/// cannot cross a router). Remote access defaults to
/// [`AccessFlags::LOCAL_WRITE`] only: remote read, write and atomics are
/// opt-ins. There is no default port.
///
/// # References
/// `ibv_modify_qp(3)`, `ibv_rc_pingpong(1)`
#[derive(Debug, Clone)]
#[must_use]
pub struct ConnectOptions {
    port: PortNumber,
    gid_index: Option<GidIndex>,
    path_mtu: Mtu,
    sl: u8,
    timeout: u8,
    retry_cnt: u8,
    rnr_retry: u8,
    min_rnr_timer: u8,
    rd_atomic: u8,
    remote_access: AccessFlags,
    pkey_index: u16,
    hop_limit: u8,
    traffic_class: u8,
    static_rate: u8,
    /// The port's attributes and GID, queried once for many connections.
    local: Option<LocalPort>,
}

impl ConnectOptions {
    /// Options for connecting through `port`, with the defaults above.
    pub fn new(port: PortNumber) -> ConnectOptions {
        ConnectOptions {
            port,
            gid_index: None,
            path_mtu: Mtu::Mtu1024,
            sl: 0,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            rd_atomic: 1,
            remote_access: AccessFlags::LOCAL_WRITE,
            pkey_index: 0,
            hop_limit: crate::address_handle::DEFAULT_HOP_LIMIT,
            traffic_class: 0,
            static_rate: 0,
            local: None,
        }
    }

    /// Connects through `local`'s port, from its GID index, with its
    /// attributes and GID as queried (no system call for them when
    /// connecting; see [`LocalPort`]). Sets the port and
    /// [`gid_index`](Self::gid_index); a different index given afterwards
    /// is queried when connecting.
    pub fn local_port(mut self, local: &LocalPort) -> Self {
        self.port = local.port();
        self.gid_index = local.gid_index();
        self.local = Some(local.clone());
        self
    }

    /// The GID index this side sends from (the source GID of its GRH;
    /// default:
    /// [`Context::default_gid_index`](crate::Context::default_gid_index)).
    /// Give it the index of the GID this side's [`Endpoint`] carries (the
    /// peer sends to that one); [`local_port`](Self::local_port) sets it so.
    pub fn gid_index(mut self, index: GidIndex) -> Self {
        self.gid_index = Some(index);
        self
    }
    /// The largest path MTU to use; the port's active MTU caps it
    /// (default 1024; both peers should pass the same value). An
    /// [`Mtu::Unknown`] value is refused when connecting.
    pub fn path_mtu(mut self, mtu: Mtu) -> Self {
        self.path_mtu = mtu;
        self
    }
    /// Service level (default 0).
    pub fn sl(mut self, sl: u8) -> Self {
        self.sl = sl;
        self
    }
    /// Local ACK timeout exponent, 4.096 µs × 2^n (default 14 ≈ 67 ms; RC).
    pub fn timeout(mut self, timeout: u8) -> Self {
        self.timeout = timeout;
        self
    }
    /// Transport retries (default 7; RC).
    pub fn retry_cnt(mut self, n: u8) -> Self {
        self.retry_cnt = n;
        self
    }
    /// RNR retries (default 7 = infinite; RC).
    pub fn rnr_retry(mut self, n: u8) -> Self {
        self.rnr_retry = n;
        self
    }
    /// Minimum RNR NAK timer (IBA encoding, default 12 = 0.64 ms; RC).
    pub fn min_rnr_timer(mut self, timer: u8) -> Self {
        self.min_rnr_timer = timer;
        self
    }
    /// RDMA reads and atomics outstanding at once, both ways (default 1;
    /// RC): as initiator (`max_rd_atomic`, set on RTS) and as target
    /// (`max_dest_rd_atomic`, set on RTR). Reads in flight from one side
    /// are bounded by its initiator depth and by the peer's target depth,
    /// so give both peers the same value. The device bounds them by
    /// [`DeviceAttr::max_qp_init_rd_atom`] and
    /// [`DeviceAttr::max_qp_rd_atom`]: take the smaller, a value above
    /// either makes `ibv_modify_qp` fail. (Different values each way:
    /// [`QpAttr::max_rd_atomic`] and [`QpAttr::max_dest_rd_atomic`] with
    /// [`QueuePair::modify`].)
    ///
    /// [`DeviceAttr::max_qp_init_rd_atom`]: crate::device::DeviceAttr::max_qp_init_rd_atom
    /// [`DeviceAttr::max_qp_rd_atom`]: crate::device::DeviceAttr::max_qp_rd_atom
    pub fn rd_atomic(mut self, n: u8) -> Self {
        self.rd_atomic = n;
        self
    }
    /// What the peer may do to this side's memory through this queue pair
    /// (`qp_access_flags`): [`AccessFlags::REMOTE_WRITE`] for its RDMA
    /// writes (with immediate too), [`AccessFlags::REMOTE_READ`] for its
    /// reads, [`AccessFlags::REMOTE_ATOMIC`] for its atomics. The memory
    /// must grant the same right (its region or window): the device checks
    /// both. Default: none of them ([`AccessFlags::LOCAL_WRITE`] only,
    /// which a queue pair ignores).
    ///
    /// A right missing here fails the peer's request, not this side's: on
    /// the peer it completes with
    /// [`WcStatus::RemInvReqErr`](crate::WcStatus::RemInvReqErr) (rxe;
    /// other devices may report
    /// [`WcStatus::RemAccessErr`](crate::WcStatus::RemAccessErr)), and both
    /// queue pairs end in ERR.
    pub fn remote_access(mut self, access: AccessFlags) -> Self {
        self.remote_access = access;
        self
    }
    /// P_Key index (default 0).
    pub fn pkey_index(mut self, index: u16) -> Self {
        self.pkey_index = index;
        self
    }
    /// GRH hop limit (default 64).
    pub fn hop_limit(mut self, hop_limit: u8) -> Self {
        self.hop_limit = hop_limit;
        self
    }
    /// GRH traffic class (default 0).
    pub fn traffic_class(mut self, traffic_class: u8) -> Self {
        self.traffic_class = traffic_class;
        self
    }
    /// Static rate, a raw `IBV_RATE_*` value (default 0 = port rate).
    pub fn static_rate(mut self, rate: u8) -> Self {
        self.static_rate = rate;
        self
    }

    /// The port.
    pub fn port(&self) -> PortNumber {
        self.port
    }

    /// The path to `remote` for a port with attributes `port_attr`.
    fn address_vector(
        &self,
        port_attr: &PortAttr,
        remote: &Endpoint,
        sgid_index: GidIndex,
    ) -> Result<AddressVector> {
        Ok(AddressVector::for_port(port_attr, remote, sgid_index)?
            .sl(self.sl)
            .hop_limit(self.hop_limit)
            .traffic_class(self.traffic_class)
            .static_rate(self.static_rate))
    }

    /// The MTU to use: the requested one, capped at the port's active MTU.
    fn mtu(&self, port_attr: &PortAttr) -> Mtu {
        match port_attr.active_mtu() {
            Mtu::Unknown(_) => self.path_mtu,
            active if active.as_raw() < self.path_mtu.as_raw() => active,
            _ => self.path_mtu,
        }
    }
}

/// INIT→RTR attributes for a `qp_type` QP: what its row of the state
/// table requires (UD: nothing).
fn rtr_attr(
    qp_type: QpType,
    av: AddressVector,
    mtu: Mtu,
    remote: &Endpoint,
    opts: &ConnectOptions,
) -> QpAttr {
    let attr = QpAttr::new().qp_state(QpState::Rtr);
    match qp_type {
        QpType::Rc | QpType::Uc => {
            let attr = attr
                .ah_attr(av)
                .path_mtu(mtu)
                .dest_qp_num(remote.qp_num)
                .rq_psn(remote.psn);
            if qp_type == QpType::Rc {
                attr.max_dest_rd_atomic(opts.rd_atomic)
                    .min_rnr_timer(opts.min_rnr_timer)
            } else {
                attr
            }
        }
        _ => attr,
    }
}

/// RTR→RTS attributes for a `qp_type` QP (RC adds the retry parameters).
fn rts_attr(qp_type: QpType, sq_psn: u32, opts: &ConnectOptions) -> QpAttr {
    let attr = QpAttr::new().qp_state(QpState::Rts).sq_psn(sq_psn);
    if qp_type == QpType::Rc {
        attr.timeout(opts.timeout)
            .retry_cnt(opts.retry_cnt)
            .rnr_retry(opts.rnr_retry)
            .max_rd_atomic(opts.rd_atomic)
    } else {
        attr
    }
}

impl QueuePair {
    /// RESET→INIT (or INIT→INIT) for RC and UC: `port`, P_Key index and
    /// the remote access rights granted to the peer.
    ///
    /// # Errors
    /// As [`QueuePair::modify`]; a UD queue pair needs
    /// [`QueuePair::to_init_ud`].
    #[doc(alias = "ibv_modify_qp")]
    pub fn to_init(&self, port: PortNumber, pkey_index: u16, access: AccessFlags) -> Result<()> {
        self.modify(
            &QpAttr::new()
                .qp_state(QpState::Init)
                .pkey_index(pkey_index)
                .port_num(port)
                .qp_access_flags(access),
        )
    }

    /// RESET→INIT (or INIT→INIT) for UD: `port`, P_Key index and Q_Key.
    ///
    /// # Errors
    /// As [`QueuePair::modify`].
    #[doc(alias = "ibv_modify_qp")]
    pub fn to_init_ud(&self, port: PortNumber, pkey_index: u16, qkey: u32) -> Result<()> {
        self.modify(
            &QpAttr::new()
                .qp_state(QpState::Init)
                .pkey_index(pkey_index)
                .port_num(port)
                .qkey(qkey),
        )
    }

    /// Moves the queue pair to ERR: outstanding requests are flushed (they
    /// complete with [`WcStatus::WrFlushErr`](crate::WcStatus::WrFlushErr)).
    ///
    /// # Errors
    /// As [`QueuePair::modify`] (a QP in RESET cannot move to ERR).
    #[doc(alias = "ibv_modify_qp")]
    pub fn to_err(&self) -> Result<()> {
        self.modify(&QpAttr::new().qp_state(QpState::Err))
    }

    /// Moves the queue pair to RESET, from any state, to reconnect it.
    /// Requests still outstanding are discarded without completions (their
    /// buffers are dropped); move to ERR and poll the flushed completions
    /// first to get them back. A memory window whose bind or invalidate is
    /// discarded this way cannot know its binding any more: it keeps its
    /// regions and refuses further requests
    /// ([`Error::WindowIndeterminate`](crate::Error::WindowIndeterminate)).
    /// Completions of discarded requests that had finished may still be
    /// queued in the CQs: each queue holds an entry per discarded request
    /// until a poll finds its CQ empty
    /// ([`Error::QueueHeldAfterReset`](crate::Error::QueueHeldAfterReset)
    /// meanwhile), so new requests cannot overrun the CQ.
    ///
    /// # Errors
    /// As [`QueuePair::modify`].
    #[doc(alias = "ibv_modify_qp")]
    pub fn reset(&self) -> Result<()> {
        self.modify(&QpAttr::new().qp_state(QpState::Reset))
    }

    /// INIT→RTR for RC and UC: path to `remote` (GRH or LID addressing from
    /// the port's link layer, [`AddressVector::for_port`]), path MTU,
    /// remote QP number and PSN, plus for RC the responder resources and
    /// RNR timer from `opts`. For UD only the state changes.
    ///
    /// # Errors
    /// As [`QueuePair::modify`]; [`Error::MissingRemoteAddress`] when
    /// `remote` lacks what the link layer needs, [`Error::EmptyGid`] when
    /// the local GID index names an empty slot, [`Error::InvalidMtu`] when
    /// the path MTU is not an `IBV_MTU_*` value, [`Error::ForeignContext`]
    /// when [`ConnectOptions::local_port`] describes another device
    /// context's port; [`Error::Verb`] naming `ibv_query_port`, `ibv_query_gid` or
    /// `ibv_query_gid_table` (not asked with a [`LocalPort`] that holds
    /// them).
    #[doc(alias = "ibv_modify_qp")]
    pub fn to_rtr(&self, remote: &Endpoint, opts: &ConnectOptions) -> Result<()> {
        self.modify(&self.rtr_attr_for(remote, opts)?)
    }

    /// The INIT→RTR attributes for reaching `remote` through `opts.port`.
    fn rtr_attr_for(&self, remote: &Endpoint, opts: &ConnectOptions) -> Result<QpAttr> {
        let qp_type = self.qp_type();
        if qp_type == QpType::Ud {
            return Ok(QpAttr::new().qp_state(QpState::Rtr));
        }
        let ctx = self.pd().context();
        let local = opts.local.as_ref();
        let port_attr = match local {
            Some(l) => {
                l.check_context(self)?;
                *l.attr()
            }
            None => ctx.query_port(opts.port)?,
        };
        let sgid_index = match opts.gid_index {
            Some(i) => i,
            None if port_attr.grh_required() || !remote.gid.is_zero() => {
                ctx.default_gid_index(opts.port)?
            }
            None => GidIndex(0),
        };
        if let Mtu::Unknown(v) = opts.path_mtu {
            return Err(Error::InvalidMtu { value: v });
        }
        let av = opts.address_vector(&port_attr, remote, sgid_index)?;
        if av.is_global() {
            let sgid = match local.and_then(|l| l.gid_at(sgid_index)) {
                Some(gid) => gid,
                None => ctx.query_gid(opts.port, sgid_index)?,
            };
            if sgid.is_zero() {
                return Err(Error::EmptyGid {
                    port: opts.port,
                    index: sgid_index,
                });
            }
        }
        Ok(rtr_attr(qp_type, av, opts.mtu(&port_attr), remote, opts))
    }

    /// RTR→RTS: the send PSN, plus for RC the ACK timeout, retry counts and
    /// initiator RDMA-read depth from `opts`.
    ///
    /// # Errors
    /// As [`QueuePair::modify`].
    #[doc(alias = "ibv_modify_qp")]
    pub fn to_rts(&self, sq_psn: u32, opts: &ConnectOptions) -> Result<()> {
        self.modify(&rts_attr(self.qp_type(), sq_psn, opts))
    }

    /// Connects an RC or UC queue pair in RESET to `remote` in one call:
    /// RESET→INIT (port, P_Key index, the rights of
    /// [`ConnectOptions::remote_access`]) → RTR (path to `remote`) → RTS
    /// (sending from `local.psn`), each step checked by
    /// [`QueuePair::modify`]. `local` is the endpoint of this queue pair
    /// that the peer was sent ([`LocalPort::endpoint`]); it must name this
    /// queue pair.
    ///
    /// On error the QP stays in the state it reached; [`QueuePair::reset`]
    /// it before trying again.
    ///
    /// System calls: the port and GID queries (none with
    /// [`ConnectOptions::local_port`]) and three `ibv_modify_qp`, as
    /// `ibv_rc_pingpong` (the state is not queried: see
    /// [`QueuePair::modify`]).
    ///
    /// # Errors
    /// All before the first step: [`Error::NotThisQueuePair`] when `local`
    /// names another queue pair, [`Error::WrongQpType`] for a UD queue
    /// pair (use [`QueuePair::activate_ud`]), [`Error::OutOfRange`] for a
    /// PSN or QP number wider than 24 bits (or another option wider than its
    /// field), [`Error::MissingRemoteAddress`] for a `remote` lacking what
    /// the link layer needs (a GID on RoCE, a LID on InfiniBand),
    /// [`Error::EmptyGid`] for an empty local GID slot,
    /// [`Error::InvalidMtu`] for an unknown path MTU,
    /// [`Error::ForeignContext`] for a [`LocalPort`] of another device
    /// context. Then [`Error::InvalidTransition`] when the
    /// QP is not in RESET; otherwise as [`QueuePair::modify`] and
    /// [`Context::query_port`](crate::Context::query_port).
    ///
    /// # References
    /// `ibv_modify_qp(3)`, `ibv_rc_pingpong(1)`
    ///
    /// # Example
    /// ```no_run
    /// # fn demo(ctx: &rdma_verbs::Context, qp: &rdma_verbs::QueuePair, port: rdma_verbs::PortNumber,
    /// #         exchange: impl Fn(&[u8]) -> Vec<u8>) -> rdma_verbs::Result<()> {
    /// use rdma_verbs::{AccessFlags, ConnectOptions, Endpoint, LocalPort};
    /// let local = LocalPort::query(ctx, port, None)?; // once per port
    /// let me = local.endpoint(qp, Endpoint::random_psn())?;
    /// // Out of band: TCP, a file …
    /// let peer = Endpoint::from_bytes(&exchange(&me.to_bytes()))?;
    /// let opts = ConnectOptions::new(port)
    ///     .local_port(&local)
    ///     .remote_access(AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE);
    /// qp.connect(&me, &peer, &opts)?;
    /// # Ok(()) }
    /// ```
    #[doc(alias = "ibv_modify_qp")]
    pub fn connect(
        &self,
        local: &Endpoint,
        remote: &Endpoint,
        opts: &ConnectOptions,
    ) -> Result<()> {
        if !matches!(self.qp_type(), QpType::Rc | QpType::Uc) {
            return Err(Error::WrongQpType {
                what: "connect",
                qp_type: self.qp_type(),
            });
        }
        if local.qp_num != self.qp_num() {
            return Err(Error::NotThisQueuePair {
                qp_num: self.qp_num(),
                endpoint: local.qp_num,
            });
        }
        let local_psn = local.psn;
        check_24("local PSN", local_psn)?;
        check_24("remote PSN", remote.psn)?;
        check_24("remote QP number", remote.qp_num.0)?;
        // Everything that can be checked is checked before the first step.
        let rtr = self.rtr_attr_for(remote, opts)?;
        let rts = rts_attr(self.qp_type(), local_psn, opts);
        rtr.validate(self.qp_type(), QpState::Init)?;
        rts.validate(self.qp_type(), QpState::Rtr)?;
        self.to_init(opts.port, opts.pkey_index, opts.remote_access)?;
        self.modify(&rtr)?;
        self.modify(&rts)
    }

    /// Activates a UD queue pair in RESET: RESET→INIT (P_Key index 0,
    /// `port`, `qkey`) → RTR → RTS (send PSN `psn`). Destinations are then
    /// given per send ([`SendRequest::ud`](crate::SendRequest::ud)).
    ///
    /// # Errors
    /// [`Error::WrongQpType`] for a QP that is not UD,
    /// [`Error::OutOfRange`] for a PSN wider than 24 bits; otherwise as
    /// [`QueuePair::modify`].
    ///
    /// # References
    /// `ibv_modify_qp(3)`, `ibv_ud_pingpong(1)`
    #[doc(alias = "ibv_modify_qp")]
    pub fn activate_ud(&self, port: PortNumber, qkey: u32, psn: u32) -> Result<()> {
        if self.qp_type() != QpType::Ud {
            return Err(Error::WrongQpType {
                what: "activate_ud",
                qp_type: self.qp_type(),
            });
        }
        check_24("PSN", psn)?;
        self.to_init_ud(port, 0, qkey)?;
        self.modify(&QpAttr::new().qp_state(QpState::Rtr))?;
        self.modify(&QpAttr::new().qp_state(QpState::Rts).sq_psn(psn))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::WireProblem;
    use crate::types::{Gid, QpNumber};
    use rdma_verbs_sys as sys;
    use sys::ibv_qp_attr_mask as M;
    use QpState as S;
    use QpType::{Rc as RC, Ud as UD};

    fn port_attr(link_layer: u32, active_mtu: u32) -> PortAttr {
        PortAttr {
            raw: sys::ibv_port_attr {
                link_layer: link_layer as u8,
                active_mtu,
                lid: 1,
                ..Default::default()
            },
            port: PortNumber(1),
        }
    }

    fn remote() -> Endpoint {
        Endpoint {
            qp_num: QpNumber(0x42),
            psn: 0x12_3456,
            lid: 9,
            gid: "::ffff:10.0.0.2".parse().unwrap(),
        }
    }

    #[test]
    fn defaults_match_pingpong() {
        let o = ConnectOptions::new(PortNumber(2));
        assert_eq!(o.port(), PortNumber(2));
        assert_eq!(o.path_mtu, Mtu::Mtu1024);
        assert_eq!((o.timeout, o.retry_cnt, o.rnr_retry), (14, 7, 7));
        assert_eq!((o.min_rnr_timer, o.rd_atomic), (12, 1));
        assert_eq!(o.remote_access, AccessFlags::LOCAL_WRITE);
        assert_eq!((o.sl, o.pkey_index, o.hop_limit), (0, 0, 64));
        assert_eq!(o.gid_index, None);
    }

    #[test]
    fn mtu_is_capped_by_the_port() {
        let o = ConnectOptions::new(PortNumber(1)).path_mtu(Mtu::Mtu4096);
        let eth = port_attr(sys::IBV_LINK_LAYER_ETHERNET, sys::IBV_MTU_1024);
        assert_eq!(o.mtu(&eth), Mtu::Mtu1024);
        let ib = port_attr(sys::IBV_LINK_LAYER_INFINIBAND, sys::IBV_MTU_4096);
        assert_eq!(o.mtu(&ib), Mtu::Mtu4096);
        assert_eq!(o.clone().path_mtu(Mtu::Mtu512).mtu(&ib), Mtu::Mtu512);
    }

    #[test]
    fn address_vector_follows_link_layer() {
        let o = ConnectOptions::new(PortNumber(1)).sl(2).hop_limit(5);
        let eth = port_attr(sys::IBV_LINK_LAYER_ETHERNET, sys::IBV_MTU_1024);
        let av = o.address_vector(&eth, &remote(), GidIndex(3)).unwrap();
        assert!(av.is_global());
        assert_eq!(av.sgid_index(), GidIndex(3));
        assert_eq!(av.as_raw().grh.hop_limit, 5);
        assert_eq!(av.as_raw().sl, 2);
        let ib = port_attr(sys::IBV_LINK_LAYER_INFINIBAND, sys::IBV_MTU_4096);
        let lid_only = Endpoint {
            gid: Gid::ZERO,
            ..remote()
        };
        let av = o.address_vector(&ib, &lid_only, GidIndex(0)).unwrap();
        assert!(!av.is_global());
        assert_eq!(av.as_raw().dlid, 9);
    }

    /// The attributes the helpers build satisfy the state table for each
    /// QP type, step by step.
    #[test]
    fn helper_sequences_pass_the_state_table() {
        let o = ConnectOptions::new(PortNumber(1));
        let r = remote();
        let av = AddressVector::roce(PortNumber(1), r.gid, GidIndex(1));
        for t in [QpType::Rc, QpType::Uc] {
            let init = QpAttr::new()
                .qp_state(QpState::Init)
                .pkey_index(0)
                .port_num(PortNumber(1))
                .qp_access_flags(AccessFlags::LOCAL_WRITE);
            init.validate(t, QpState::Reset).unwrap();
            rtr_attr(t, av, Mtu::Mtu1024, &r, &o)
                .validate(t, QpState::Init)
                .unwrap();
            rts_attr(t, 7, &o).validate(t, QpState::Rtr).unwrap();
        }
        let t = QpType::Ud;
        rtr_attr(t, av, Mtu::Mtu1024, &r, &o)
            .validate(t, QpState::Init)
            .unwrap();
        rts_attr(t, 7, &o).validate(t, QpState::Rtr).unwrap();
        let rts = rts_attr(QpType::Rc, 7, &o);
        QpState::Rtr
            .check_transition(QpState::Rts, QpType::Rc, rts.mask())
            .unwrap();
        assert!(rts_attr(QpType::Rc, 1 << 24, &o)
            .validate(QpType::Rc, QpState::Rtr)
            .is_err());
    }

    fn wire_problem(r: Result<Endpoint>) -> WireProblem {
        match r {
            Err(Error::BadWireFormat {
                what: "Endpoint",
                problem,
            }) => problem,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn endpoint_wire_form_round_trips() {
        let e = remote();
        let b = e.to_bytes();
        assert_eq!(b.len(), Endpoint::WIRE_LEN);
        let mut want = vec![1, 0, 0, 0, 0x42, 0, 0x12, 0x34, 0x56, 0, 9];
        want.extend_from_slice(&e.gid.0);
        assert_eq!(&b[..], &want[..], "version, big-endian numbers, the GID");
        assert_eq!(Endpoint::from_bytes(&b).unwrap(), e);
        // The extremes of every field.
        for e in [
            Endpoint {
                qp_num: QpNumber(0),
                psn: 0,
                lid: 0,
                gid: Gid::ZERO,
            },
            Endpoint {
                qp_num: QpNumber(MAX_24),
                psn: MAX_24,
                lid: u16::MAX,
                gid: Gid([0xff; 16]),
            },
        ] {
            assert_eq!(Endpoint::from_bytes(&e.to_bytes()).unwrap(), e);
        }
    }

    #[test]
    fn endpoint_wire_form_is_checked() {
        let b = remote().to_bytes();
        let n = Endpoint::WIRE_LEN;
        for len in [0, 1, n - 1] {
            assert_eq!(
                wire_problem(Endpoint::from_bytes(&b[..len])),
                WireProblem::Length { len, expected: n }
            );
        }
        let mut longer = b.to_vec();
        longer.push(0);
        assert_eq!(
            wire_problem(Endpoint::from_bytes(&longer)),
            WireProblem::Length {
                len: n + 1,
                expected: n
            }
        );
        // An unknown version is named as such, whatever its length.
        for v in [0, 2, 0xff] {
            let mut other = longer.clone();
            other[0] = v;
            assert_eq!(
                wire_problem(Endpoint::from_bytes(&other)),
                WireProblem::Version {
                    version: v,
                    supported: 1
                }
            );
        }
        for (field, at) in [("qp_num", 1), ("psn", 5)] {
            let mut wide = b;
            wide[at] = 1; // bit 24
            assert_eq!(
                wire_problem(Endpoint::from_bytes(&wide)),
                WireProblem::OutOfRange {
                    field,
                    value: u64::from(u32::from_be_bytes(wide[at..at + 4].try_into().unwrap())),
                    max: 0xff_ffff
                }
            );
        }
        let e = Endpoint::from_bytes(&[2]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "malformed Endpoint message: version 2, this library reads version 1"
        );
    }

    #[test]
    fn random_psn_is_24_bits() {
        for _ in 0..100 {
            assert!(Endpoint::random_psn() <= MAX_24);
        }
    }

    #[test]
    fn check_24_bounds() {
        assert!(check_24("psn", MAX_24).is_ok());
        assert!(check_24("psn", MAX_24 + 1).is_err());
    }

    #[test]
    fn qp_attr_builds_mask_and_validates() {
        let a = QpAttr::new()
            .qp_state(S::Rtr)
            .ah_attr(AddressVector::infiniband(PortNumber(1), 3))
            .path_mtu(Mtu::Mtu1024)
            .dest_qp_num(QpNumber(0x12))
            .rq_psn(0xab_cdef)
            .max_dest_rd_atomic(1)
            .min_rnr_timer(12);
        let rtr = M::IBV_QP_STATE
            | M::IBV_QP_AV
            | M::IBV_QP_PATH_MTU
            | M::IBV_QP_DEST_QPN
            | M::IBV_QP_RQ_PSN
            | M::IBV_QP_MAX_DEST_RD_ATOMIC
            | M::IBV_QP_MIN_RNR_TIMER;
        assert_eq!(a.mask(), rtr);
        assert_eq!(a.as_raw().rq_psn, 0xab_cdef);
        assert_eq!(a.as_raw().path_mtu, sys::IBV_MTU_1024);
        a.validate(RC, S::Init).unwrap();
        assert!(a.validate(RC, S::Rtr).is_err());
        assert!(a.validate(UD, S::Init).is_err());
        assert!(format!("{a:?}").contains("IBV_QP_DEST_QPN"));
        // Field widths.
        let wide = a.rq_psn(1 << 24).validate(RC, S::Init);
        assert!(matches!(
            wide,
            Err(Error::OutOfRange {
                what: "rq_psn",
                value: 0x100_0000,
                max: 0xFF_FFFF
            })
        ));
        let rts = QpAttr::new().qp_state(S::Rts).sq_psn(0).timeout(14);
        let rts = rts.retry_cnt(7).rnr_retry(7).max_rd_atomic(1);
        rts.validate(RC, S::Rtr).unwrap();
        assert!(rts.retry_cnt(8).validate(RC, S::Rtr).is_err());
        assert!(rts.timeout(32).validate(RC, S::Rtr).is_err());
        // Without IBV_QP_STATE the QP stays where it is.
        QpAttr::new().min_rnr_timer(3).validate(RC, S::Rts).unwrap();
        // cur_qp_state overrides the given current state.
        let sqe = QpAttr::new().qp_state(S::Rts).cur_qp_state(S::Sqe);
        sqe.validate(UD, S::Err).unwrap();
    }
}
