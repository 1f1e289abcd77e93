//! Ports: numbers, attributes, states, MTUs and link layers.

use crate::types::{device_enum, PortNumber};
use rdma_verbs_sys as sys;

device_enum! {
    /// Logical state of a port.
    PortState {
        /// Reserved.
        Nop = sys::IBV_PORT_NOP,
        /// The link is down.
        Down = sys::IBV_PORT_DOWN,
        /// Link up, not yet configured by the subnet manager.
        Init = sys::IBV_PORT_INIT,
        /// Configured, only management traffic.
        Armed = sys::IBV_PORT_ARMED,
        /// Ready for traffic.
        Active = sys::IBV_PORT_ACTIVE,
        /// Deferred activation.
        ActiveDefer = sys::IBV_PORT_ACTIVE_DEFER,
    }
}

device_enum! {
    /// A path MTU.
    Mtu {
        /// 256 bytes.
        Mtu256 = sys::IBV_MTU_256,
        /// 512 bytes.
        Mtu512 = sys::IBV_MTU_512,
        /// 1024 bytes.
        Mtu1024 = sys::IBV_MTU_1024,
        /// 2048 bytes.
        Mtu2048 = sys::IBV_MTU_2048,
        /// 4096 bytes.
        Mtu4096 = sys::IBV_MTU_4096,
    }
}

impl Mtu {
    /// The MTU in bytes (0 for an unknown value).
    pub fn bytes(self) -> u32 {
        match self {
            Mtu::Unknown(_) => 0,
            m => 128 << m.as_raw(),
        }
    }

    /// The MTU for a byte count (256, 512, 1024, 2048, 4096).
    pub fn from_bytes(bytes: u32) -> Option<Mtu> {
        Some(match bytes {
            256 => Mtu::Mtu256,
            512 => Mtu::Mtu512,
            1024 => Mtu::Mtu1024,
            2048 => Mtu::Mtu2048,
            4096 => Mtu::Mtu4096,
            _ => return None,
        })
    }
}

/// The link layer of a port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LinkLayer {
    /// Not reported (old kernels; treat as InfiniBand).
    Unspecified,
    /// InfiniBand: address by LID; GRH optional.
    InfiniBand,
    /// Ethernet (RoCE, iWARP): address by GID; GRH required.
    Ethernet,
    /// A value this version of the crate does not know.
    Unknown(u8),
}

impl LinkLayer {
    fn from_raw(raw: u8) -> Self {
        match u32::from(raw) {
            x if x == sys::IBV_LINK_LAYER_UNSPECIFIED => LinkLayer::Unspecified,
            x if x == sys::IBV_LINK_LAYER_INFINIBAND => LinkLayer::InfiniBand,
            x if x == sys::IBV_LINK_LAYER_ETHERNET => LinkLayer::Ethernet,
            _ => LinkLayer::Unknown(raw),
        }
    }
}

/// Attributes of a port, from [`Context::query_port`](crate::Context::query_port).
///
/// # References
/// `ibv_query_port(3)`
#[derive(Clone, Copy)]
pub struct PortAttr {
    pub(crate) raw: sys::ibv_port_attr,
    pub(crate) port: PortNumber,
}

impl PortAttr {
    /// The port these attributes describe.
    pub fn port(&self) -> PortNumber {
        self.port
    }
    /// Logical port state.
    pub fn state(&self) -> PortState {
        PortState::from_raw(self.raw.state)
    }
    /// Largest MTU the port supports.
    pub fn max_mtu(&self) -> Mtu {
        Mtu::from_raw(self.raw.max_mtu)
    }
    /// MTU in use.
    pub fn active_mtu(&self) -> Mtu {
        Mtu::from_raw(self.raw.active_mtu)
    }
    /// Link layer.
    pub fn link_layer(&self) -> LinkLayer {
        LinkLayer::from_raw(self.raw.link_layer)
    }
    /// Base LID (InfiniBand; 0 on Ethernet).
    pub fn lid(&self) -> u16 {
        self.raw.lid
    }
    /// LID of the subnet manager.
    pub fn sm_lid(&self) -> u16 {
        self.raw.sm_lid
    }
    /// Number of entries in the GID table.
    pub fn gid_table_len(&self) -> u32 {
        self.raw.gid_tbl_len as u32
    }
    /// Number of entries in the P_Key table.
    pub fn pkey_table_len(&self) -> u16 {
        self.raw.pkey_tbl_len
    }
    /// Largest message size.
    pub fn max_msg_size(&self) -> u32 {
        self.raw.max_msg_sz
    }
    /// Port capability flags (`IBV_PORT_*_SUP`).
    pub fn port_cap_flags(&self) -> u32 {
        self.raw.port_cap_flags
    }
    /// Whether address handles on this port need a GRH
    /// (`IBV_QPF_GRH_REQUIRED`): true on RoCE.
    pub fn grh_required(&self) -> bool {
        u32::from(self.raw.flags) & sys::IBV_QPF_GRH_REQUIRED != 0
            || self.link_layer() == LinkLayer::Ethernet
    }
    /// Active link width (raw `IBV_WIDTH_*` encoding).
    pub fn active_width(&self) -> u8 {
        self.raw.active_width
    }
    /// Active link speed (raw `IBV_SPEED_*` encoding).
    pub fn active_speed(&self) -> u8 {
        self.raw.active_speed
    }
    /// Physical port state (raw, e.g. 5 = LinkUp).
    pub fn phys_state(&self) -> u8 {
        self.raw.phys_state
    }
    /// The raw C struct.
    pub fn as_raw(&self) -> &sys::ibv_port_attr {
        &self.raw
    }
}

impl std::fmt::Debug for PortAttr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PortAttr")
            .field("port", &self.port)
            .field("state", &self.state())
            .field("max_mtu", &self.max_mtu())
            .field("active_mtu", &self.active_mtu())
            .field("link_layer", &self.link_layer())
            .field("lid", &self.lid())
            .field("gid_table_len", &self.gid_table_len())
            .finish()
    }
}
