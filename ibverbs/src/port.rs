//! Ports: numbers, attributes, states, MTUs and link layers.

use ibverbs_sys as sys;

/// A port number of a device (1-based on HCAs; switches have port 0).
///
/// Never assume port 1: take it from the user or from
/// [`Context::active_port`](crate::Context::active_port).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PortNumber(pub u8);

impl std::fmt::Display for PortNumber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

macro_rules! device_enum {
    (
        $(#[$meta:meta])* $name:ident { $( $(#[$vmeta:meta])* $variant:ident = $value:path ),* $(,)? }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        pub enum $name {
            $( $(#[$vmeta])* $variant, )*
            /// A value this version of the crate does not know.
            Unknown(u32),
        }

        impl $name {
            /// Maps the C value; unknown values are kept, never undefined behaviour.
            pub fn from_raw(raw: u32) -> Self {
                #[allow(non_upper_case_globals)]
                match raw {
                    $( x if x == $value as u32 => $name::$variant, )*
                    other => $name::Unknown(other),
                }
            }

            /// The C value.
            pub fn as_raw(self) -> u32 {
                match self {
                    $( $name::$variant => $value as u32, )*
                    $name::Unknown(v) => v,
                }
            }
        }
    };
}
pub(crate) use device_enum;

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

impl crate::Context {
    /// Entry `index` of `port`'s P_Key table, in host order (`0xffff`, the
    /// full-membership default partition, at index 0 on RoCE and on an
    /// unpartitioned InfiniBand subnet). [`PortAttr::pkey_table_len`] is the
    /// table's length; a queue pair names its partition by index
    /// ([`ConnectOptions::pkey_index`](crate::ConnectOptions::pkey_index)).
    ///
    /// # Errors
    /// [`Error::Verb`](crate::Error::Verb) naming `ibv_query_pkey` (libibverbs reads
    /// the entry from sysfs: `ENOENT` for a port or an index the device
    /// does not have, explained in the message).
    ///
    /// # References
    /// `ibv_query_pkey(3)`
    #[doc(alias = "ibv_query_pkey")]
    pub fn query_pkey(&self, port: PortNumber, index: u16) -> crate::Result<u16> {
        let mut pkey: sys::__be16 = 0;
        // SAFETY: live context; `pkey` is valid for writes of a __be16.
        let rc = unsafe { sys::ibv_query_pkey(self.as_ptr(), port.0, index.into(), &mut pkey) };
        if rc != 0 {
            let io = std::io::Error::last_os_error();
            // libibverbs returns -1 without errno when the sysfs entry does
            // not parse.
            let io = if rc == -1 && io.raw_os_error().is_some_and(|e| e != 0) {
                io
            } else {
                std::io::Error::other(format!("returned {rc}"))
            };
            let e = crate::Error::Verb {
                verb: "ibv_query_pkey",
                io,
            };
            return Err(e.with_hint(self.pkey_hint(port, index)));
        }
        Ok(u16::from_be(pkey))
    }

    /// Why `(port, index)` names no P_Key. Error paths only.
    fn pkey_hint(&self, port: PortNumber, index: u16) -> Option<String> {
        if let Some(hint) = self.port_hint(port) {
            return Some(hint);
        }
        let len = self.query_port(port).ok()?.pkey_table_len();
        (index >= len).then(|| {
            format!(
                "P_Key index {index} is past the P_Key table of {} port {port} ({len} entries)",
                self.name()
            )
        })
    }
}
