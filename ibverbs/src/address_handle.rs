//! Address vectors (where packets go: LID or GRH addressing) and address
//! handles (`struct ibv_ah`), the destinations of UD sends.

use std::ptr::NonNull;
use std::sync::Arc;

use rdma_verbs_sys as sys;

use crate::error::{ret_ptr, Error, Result};

use crate::device::port::PortAttr;
use crate::memory::protection_domain::ProtectionDomain;
use crate::types::{Gid, GidIndex, PortNumber};
use crate::wire::Endpoint;

/// The default GRH hop limit: enough to cross routers (RoCE v2 over IP,
/// routed InfiniBand), unlike `ibv_rc_pingpong`'s 1.
pub const DEFAULT_HOP_LIMIT: u8 = 64;

/// Where packets to a peer go (`struct ibv_ah_attr`): used for the path of
/// a connected QP ([`QpAttr::ah_attr`](crate::qp::QpAttr::ah_attr)) and for
/// address handles of UD sends ([`ProtectionDomain::create_ah`]).
///
/// InfiniBand addresses by LID (optionally with a GRH, which routed subnets
/// need); RoCE always needs the GRH, i.e. the peer's GID and the index of
/// the local GID to send from. [`AddressVector::for_port`] picks the right
/// one from the port's link layer.
///
/// # References
/// `ibv_create_ah(3)`, `ibv_modify_qp(3)`
#[derive(Clone, Copy)]
#[must_use]
pub struct AddressVector {
    raw: sys::ibv_ah_attr,
}

impl AddressVector {
    /// GRH addressing for RoCE (Ethernet link layer): the peer's GID `dgid`,
    /// sent from the local GID at `sgid_index` on `port`. The hop limit is
    /// [`DEFAULT_HOP_LIMIT`]; traffic class and flow label are 0.
    pub fn roce(port: PortNumber, dgid: Gid, sgid_index: GidIndex) -> AddressVector {
        AddressVector {
            raw: sys::ibv_ah_attr {
                port_num: port.0,
                ..Default::default()
            },
        }
        .grh(dgid, sgid_index)
    }

    /// LID addressing for InfiniBand: the peer's LID `dlid`, from `port`.
    /// Add [`AddressVector::grh`] to cross subnet routers.
    pub fn infiniband(port: PortNumber, dlid: u16) -> AddressVector {
        AddressVector {
            raw: sys::ibv_ah_attr {
                dlid,
                port_num: port.0,
                ..Default::default()
            },
        }
    }

    /// The addressing a port needs to reach `remote`, sending from the local
    /// GID at `sgid_index`:
    /// * RoCE (or any port whose address handles require a GRH,
    ///   [`PortAttr::grh_required`]): GRH to `remote.gid`;
    /// * InfiniBand: LID `remote.lid`, plus a GRH when `remote.gid` is set
    ///   (non-zero).
    ///
    /// # Errors
    /// [`Error::MissingRemoteAddress`] when the remote lacks what the link
    /// layer needs: a zero GID on RoCE, or LID 0 on InfiniBand.
    pub fn for_port(
        port_attr: &PortAttr,
        remote: &Endpoint,
        sgid_index: GidIndex,
    ) -> Result<AddressVector> {
        let port = port_attr.port();
        if port_attr.grh_required() {
            if remote.gid.is_zero() {
                return Err(Error::MissingRemoteAddress {
                    port,
                    needed: "GID",
                });
            }
            return Ok(AddressVector::roce(port, remote.gid, sgid_index));
        }
        if remote.lid == 0 {
            return Err(Error::MissingRemoteAddress {
                port,
                needed: "LID",
            });
        }
        let av = AddressVector::infiniband(port, remote.lid);
        Ok(if remote.gid.is_zero() {
            av
        } else {
            av.grh(remote.gid, sgid_index)
        })
    }

    /// Adds a global route header (`is_global = 1`) to `dgid` from the local
    /// GID at `sgid_index`. Keeps a hop limit set before, else uses
    /// [`DEFAULT_HOP_LIMIT`].
    pub fn grh(mut self, dgid: Gid, sgid_index: GidIndex) -> Self {
        self.raw.is_global = 1;
        self.raw.grh.dgid = dgid.to_raw();
        self.raw.grh.sgid_index = sgid_index.0;
        if self.raw.grh.hop_limit == 0 {
            self.raw.grh.hop_limit = DEFAULT_HOP_LIMIT;
        }
        self
    }

    /// GRH hop limit (IPv6 hop limit / IPv4 TTL on RoCE v2).
    pub fn hop_limit(mut self, hop_limit: u8) -> Self {
        self.raw.grh.hop_limit = hop_limit;
        self
    }

    /// GRH traffic class (the IP DSCP/ECN byte on RoCE v2).
    pub fn traffic_class(mut self, traffic_class: u8) -> Self {
        self.raw.grh.traffic_class = traffic_class;
        self
    }

    /// GRH flow label (20 bits; larger values are rejected when used).
    pub fn flow_label(mut self, flow_label: u32) -> Self {
        self.raw.grh.flow_label = flow_label;
        self
    }

    /// Service level (4 bits; larger values are rejected when used).
    pub fn sl(mut self, sl: u8) -> Self {
        self.raw.sl = sl;
        self
    }

    /// Source path bits (the low LID bits under LMC, InfiniBand).
    pub fn src_path_bits(mut self, bits: u8) -> Self {
        self.raw.src_path_bits = bits;
        self
    }

    /// Static rate limit: a raw `IBV_RATE_*` value (0 = the port's rate).
    pub fn static_rate(mut self, rate: u8) -> Self {
        self.raw.static_rate = rate;
        self
    }

    /// The destination LID (InfiniBand; RoCE ignores it).
    pub fn dlid(mut self, dlid: u16) -> Self {
        self.raw.dlid = dlid;
        self
    }

    /// The local port.
    pub fn port(&self) -> PortNumber {
        PortNumber(self.raw.port_num)
    }
    /// Whether a GRH is used.
    pub fn is_global(&self) -> bool {
        self.raw.is_global != 0
    }
    /// The destination GID (meaningful with a GRH).
    pub fn dgid(&self) -> Gid {
        Gid::from_raw(&self.raw.grh.dgid)
    }
    /// The local GID index (meaningful with a GRH).
    pub fn sgid_index(&self) -> GidIndex {
        GidIndex(self.raw.grh.sgid_index)
    }
    /// The C struct.
    pub fn as_raw(&self) -> &sys::ibv_ah_attr {
        &self.raw
    }

    /// Wraps a C struct (e.g. one filled by `ibv_query_qp`).
    pub fn from_raw(raw: sys::ibv_ah_attr) -> AddressVector {
        AddressVector { raw }
    }

    /// Rejects field values wider than their wire encoding.
    pub(crate) fn check(&self) -> Result<()> {
        if self.raw.sl > 15 {
            return Err(Error::OutOfRange {
                what: "service level",
                value: self.raw.sl.into(),
                max: 15,
            });
        }
        if self.is_global() && self.raw.grh.flow_label > 0xF_FFFF {
            return Err(Error::OutOfRange {
                what: "flow label",
                value: self.raw.grh.flow_label.into(),
                max: 0xF_FFFF,
            });
        }
        Ok(())
    }
}

impl std::fmt::Debug for AddressVector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("AddressVector");
        d.field("port", &self.port())
            .field("dlid", &self.raw.dlid)
            .field("sl", &self.raw.sl);
        if self.is_global() {
            d.field("dgid", &self.dgid())
                .field("sgid_index", &self.raw.grh.sgid_index)
                .field("hop_limit", &self.raw.grh.hop_limit)
                .field("traffic_class", &self.raw.grh.traffic_class)
                .field("flow_label", &self.raw.grh.flow_label);
        }
        d.field("static_rate", &self.raw.static_rate)
            .field("src_path_bits", &self.raw.src_path_bits)
            .finish()
    }
}

pub(crate) struct AhInner {
    pub(crate) ah: NonNull<sys::ibv_ah>,
    pub(crate) pd: ProtectionDomain,
    av: AddressVector,
    /// The port's active MTU in bytes when the AH was created (0: unknown).
    mtu: u32,
}

// SAFETY: address handles are immutable after creation and thread-safe.
unsafe impl Send for AhInner {}
// SAFETY: as above.
unsafe impl Sync for AhInner {}

impl Drop for AhInner {
    fn drop(&mut self) {
        // SAFETY: last reference; UD requests using it hold clones.
        unsafe { sys::ibv_destroy_ah(self.ah.as_ptr()) };
    }
}

/// An address handle (`struct ibv_ah`): the destination of UD sends.
///
/// Cheap to clone; it keeps its protection domain alive, and UD send
/// requests in flight keep it alive.
///
/// # References
/// `ibv_create_ah(3)`, `ibv_destroy_ah(3)`
#[derive(Clone)]
pub struct AddressHandle {
    pub(crate) inner: Arc<AhInner>,
}

impl ProtectionDomain {
    /// Creates an address handle for `av` in this PD.
    ///
    /// # Errors
    /// [`Error::OutOfRange`] for a service level or flow label wider
    /// than its field; [`Error::GrhRequired`] for an address vector
    /// without a GRH on a port that needs one (RoCE, see
    /// [`PortAttr::grh_required`](crate::device::PortAttr::grh_required));
    /// [`Error::Verb`] naming `ibv_create_ah` (e.g. `EINVAL`
    /// for a bad port, `ENODATA` for an empty GID slot, both explained in
    /// the message, `ENOENT`/`EHOSTUNREACH` when RoCE cannot resolve the
    /// peer's MAC address).
    ///
    /// # References
    /// `ibv_create_ah(3)`
    #[doc(alias = "ibv_create_ah")]
    pub fn create_ah(&self, av: &AddressVector) -> Result<AddressHandle> {
        av.check()?;
        let ctx = self.context();
        // A port the device lacks fails here and is explained by the verb's
        // error below.
        let port = ctx.query_port(av.port()).ok();
        if port.as_ref().is_some_and(|p| p.grh_required()) && !av.is_global() {
            return Err(Error::GrhRequired { port: av.port() });
        }
        let mut attr = av.raw;
        // SAFETY: live PD; `attr` is a valid, initialised ibv_ah_attr that
        // outlives the call; the AH is destroyed exactly once by AhInner.
        let ah = unsafe { sys::ibv_create_ah(self.as_ptr(), &mut attr) };
        let ah = ret_ptr("ibv_create_ah", ah).map_err(|e| {
            let hint = ctx.port_hint(av.port()).or_else(|| {
                av.is_global()
                    .then(|| ctx.gid_hint(av.port(), av.sgid_index()))
                    .flatten()
            });
            e.with_hint(hint)
        })?;
        let mtu = port.map_or(0, |p| p.active_mtu().bytes());
        Ok(AddressHandle {
            inner: Arc::new(AhInner {
                ah,
                pd: self.clone(),
                av: *av,
                mtu,
            }),
        })
    }
}

impl AddressHandle {
    /// The raw pointer, valid while `self` lives.
    pub fn as_ptr(&self) -> *mut sys::ibv_ah {
        self.inner.ah.as_ptr()
    }
    /// The protection domain.
    pub fn pd(&self) -> &ProtectionDomain {
        &self.inner.pd
    }
    /// The address vector it was created from.
    pub fn address_vector(&self) -> &AddressVector {
        &self.inner.av
    }
    /// The active MTU of its port when it was created, in bytes (0 when
    /// unknown): the largest UD message sent through it.
    pub fn port_mtu(&self) -> u32 {
        self.inner.mtu
    }
}

impl std::fmt::Debug for AddressHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AddressHandle")
            .field("av", &self.inner.av)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::QpNumber;

    fn port_attr(link_layer: u32, flags: u32) -> PortAttr {
        PortAttr {
            raw: sys::ibv_port_attr {
                link_layer: link_layer as u8,
                flags: flags as u8,
                lid: 7,
                ..Default::default()
            },
            port: PortNumber(2),
        }
    }

    fn remote(lid: u16, gid: Gid) -> Endpoint {
        Endpoint {
            qp_num: QpNumber(0x1234),
            psn: 1,
            lid,
            gid,
        }
    }

    const GID: Gid = Gid([0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);

    #[test]
    fn roce_sets_grh() {
        let av = AddressVector::roce(PortNumber(2), GID, GidIndex(3));
        assert!(av.is_global());
        assert_eq!(av.port(), PortNumber(2));
        assert_eq!(av.dgid(), GID);
        assert_eq!(av.sgid_index(), GidIndex(3));
        assert_eq!(av.as_raw().grh.hop_limit, DEFAULT_HOP_LIMIT);
        let av = av.hop_limit(1).traffic_class(106).flow_label(5);
        assert_eq!(av.as_raw().grh.hop_limit, 1);
        assert_eq!(av.as_raw().grh.traffic_class, 106);
        assert_eq!(av.as_raw().grh.flow_label, 5);
        assert!(av.check().is_ok());
        assert!(av.flow_label(1 << 20).check().is_err());
    }

    #[test]
    fn infiniband_uses_lid() {
        let av = AddressVector::infiniband(PortNumber(1), 42).sl(3);
        assert!(!av.is_global());
        assert_eq!(av.as_raw().dlid, 42);
        assert_eq!(av.as_raw().sl, 3);
        assert!(av.check().is_ok());
        assert!(av.sl(16).check().is_err());
        // An explicit hop limit survives adding the GRH.
        let av = AddressVector::infiniband(PortNumber(1), 42)
            .hop_limit(9)
            .grh(GID, GidIndex(0));
        assert!(av.is_global());
        assert_eq!(av.as_raw().grh.hop_limit, 9);
    }

    #[test]
    fn for_port_picks_addressing() {
        let eth = port_attr(sys::IBV_LINK_LAYER_ETHERNET, 0);
        let ib = port_attr(sys::IBV_LINK_LAYER_INFINIBAND, 0);
        let ib_grh = port_attr(sys::IBV_LINK_LAYER_INFINIBAND, sys::IBV_QPF_GRH_REQUIRED);

        let av = AddressVector::for_port(&eth, &remote(0, GID), GidIndex(1)).unwrap();
        assert!(av.is_global());
        assert_eq!(av.port(), PortNumber(2));
        assert_eq!(av.sgid_index(), GidIndex(1));
        assert!(AddressVector::for_port(&eth, &remote(5, Gid::ZERO), GidIndex(1)).is_err());

        let av = AddressVector::for_port(&ib, &remote(5, Gid::ZERO), GidIndex(0)).unwrap();
        assert!(!av.is_global());
        assert_eq!(av.as_raw().dlid, 5);
        let av = AddressVector::for_port(&ib, &remote(5, GID), GidIndex(0)).unwrap();
        assert!(av.is_global());
        assert_eq!(av.as_raw().dlid, 5);
        assert!(AddressVector::for_port(&ib, &remote(0, GID), GidIndex(0)).is_err());

        let av = AddressVector::for_port(&ib_grh, &remote(5, GID), GidIndex(0)).unwrap();
        assert!(av.is_global());
    }
}
