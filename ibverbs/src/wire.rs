//! What peers send each other: the wire forms of this crate (a version byte
//! first, then fixed fields) and the [`Endpoint`] they connect with.
//! Everything read from a peer is checked here before it is used.

use std::hash::{BuildHasher, Hasher};

use crate::error::{Error, Result, WireProblem};
use crate::types::{Gid, QpNumber};

/// Largest 24-bit value (PSNs, QP numbers).
pub(crate) const MAX_24: u32 = 0xFF_FFFF;

/// The version byte that starts every wire message this library writes
/// ([`Endpoint::to_bytes`](crate::Endpoint::to_bytes),
/// [`RemoteMemory::to_bytes`](crate::RemoteMemory::to_bytes)).
pub(crate) const WIRE_VERSION: u8 = 1;

/// Checks the frame of a wire message `what` whose version
/// [`WIRE_VERSION`] has `len` bytes: the version byte first (a later
/// version may have another length), then the length.
pub(crate) fn check_wire(what: &'static str, b: &[u8], len: usize) -> Result<()> {
    let problem = match b.first() {
        None => WireProblem::Length {
            len: 0,
            expected: len,
        },
        Some(&v) if v != WIRE_VERSION => WireProblem::Version {
            version: v,
            supported: WIRE_VERSION,
        },
        Some(_) if b.len() != len => WireProblem::Length {
            len: b.len(),
            expected: len,
        },
        Some(_) => return Ok(()),
    };
    Err(Error::BadWireFormat { what, problem })
}

/// What two peers exchange to connect RC or UC queue pairs (or to address
/// a UD one): the same fields as rdma-core's `ibv_rc_pingpong` (LID, QP
/// number, PSN, GID).
///
/// [`LocalPort::endpoint`](crate::LocalPort::endpoint) makes this side's; send it with
/// [`to_bytes`](Endpoint::to_bytes) and read the peer's with
/// [`from_bytes`](Endpoint::from_bytes), then pass both to
/// [`QueuePair::connect`](crate::QueuePair::connect).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Endpoint {
    /// The queue pair number.
    pub qp_num: QpNumber,
    /// The first packet sequence number it sends (24 bits).
    pub psn: u32,
    /// The port's LID (InfiniBand; 0 on RoCE).
    pub lid: u16,
    /// The GID it sends from (needed on RoCE; optional on InfiniBand,
    /// where [`Gid::ZERO`] means LID-only addressing).
    pub gid: Gid,
}

impl Endpoint {
    /// Bytes of the wire form ([`Endpoint::to_bytes`]).
    pub const WIRE_LEN: usize = 27;

    /// The wire form, for sending to the peer out of band: a version byte
    /// (1), then the QP number (4 bytes), the PSN (4) and the LID (2), all
    /// big-endian, then the GID's 16 bytes as they are (network order).
    /// [`RemoteMemory::to_bytes`](crate::RemoteMemory::to_bytes) starts
    /// with the same version byte.
    pub fn to_bytes(&self) -> [u8; Self::WIRE_LEN] {
        let mut b = [0; Self::WIRE_LEN];
        b[0] = WIRE_VERSION;
        b[1..5].copy_from_slice(&self.qp_num.0.to_be_bytes());
        b[5..9].copy_from_slice(&self.psn.to_be_bytes());
        b[9..11].copy_from_slice(&self.lid.to_be_bytes());
        b[11..].copy_from_slice(&self.gid.0);
        b
    }

    /// Parses [`Endpoint::to_bytes`] from a peer, which is not trusted:
    /// whatever it accepts is an endpoint [`to_bytes`](Self::to_bytes)
    /// writes back byte for byte.
    ///
    /// # Errors
    /// [`Error::BadWireFormat`] with [`WireProblem::Version`] for a first
    /// byte other than 1, [`WireProblem::Length`] for a message that is
    /// not [`WIRE_LEN`](Self::WIRE_LEN) bytes long, and
    /// [`WireProblem::OutOfRange`] for a QP number or PSN wider than 24
    /// bits.
    ///
    /// [`WireProblem::Version`]: crate::error::WireProblem::Version
    /// [`WireProblem::Length`]: crate::error::WireProblem::Length
    /// [`WireProblem::OutOfRange`]: crate::error::WireProblem::OutOfRange
    pub fn from_bytes(b: &[u8]) -> Result<Endpoint> {
        const WHAT: &str = "Endpoint";
        check_wire(WHAT, b, Self::WIRE_LEN)?;
        let be32 = |at: usize| u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
        let (qp_num, psn) = (be32(1), be32(5));
        for (field, value) in [("qp_num", qp_num), ("psn", psn)] {
            if value > MAX_24 {
                return Err(Error::BadWireFormat {
                    what: WHAT,
                    problem: WireProblem::OutOfRange {
                        field,
                        value: value.into(),
                        max: MAX_24.into(),
                    },
                });
            }
        }
        let mut gid = [0; 16];
        gid.copy_from_slice(&b[11..]);
        Ok(Endpoint {
            qp_num: QpNumber(qp_num),
            psn,
            lid: u16::from_be_bytes([b[9], b[10]]),
            gid: Gid(gid),
        })
    }

    /// A random 24-bit starting PSN (as `ibv_rc_pingpong`'s
    /// `lrand48() & 0xffffff`; not cryptographic).
    pub fn random_psn() -> u32 {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        if let Ok(d) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
            h.write_u128(d.as_nanos());
        }
        // The process id, read once: `getpid` is a system call per PSN
        // otherwise (one per queue pair connected).
        static PID: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
        h.write_u32(*PID.get_or_init(std::process::id));
        (h.finish() as u32) & MAX_24
    }
}
