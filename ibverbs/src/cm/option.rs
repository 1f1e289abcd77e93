//! Options of an rdma_cm id (`rdma_set_option`).

use rdma_verbs_sys as sys;

use super::CmId;
use crate::error::Result;

/// An option of a [`CmId`], set with [`CmId::set_option`]. Each takes effect
/// at a given step of the connection, as `rdma_set_option(3)` says: set it
/// before that step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CmOption {
    /// The type of service of the connection's packets (the IP TOS byte;
    /// on RoCE the GRH traffic class). Before resolving the route.
    #[doc(alias = "RDMA_OPTION_ID_TOS")]
    Tos(u8),
    /// Whether the id may bind to an address (and port) already bound.
    /// Before binding.
    #[doc(alias = "RDMA_OPTION_ID_REUSEADDR")]
    ReuseAddr(bool),
    /// Whether an id bound to the IPv6 wildcard address listens on IPv6
    /// only (otherwise IPv4 too). Before binding.
    #[doc(alias = "RDMA_OPTION_ID_AFONLY")]
    AfOnly(bool),
    /// The QP's local ACK timeout exponent (4.096 µs × 2^n, 0 for none; the
    /// QP attribute `timeout`) that rdma_cm sets when it moves the QP to
    /// RTS. Before connecting or accepting.
    #[doc(alias = "RDMA_OPTION_ID_ACK_TIMEOUT")]
    AckTimeout(u8),
}

impl CmOption {
    /// The option's `optname` at level `RDMA_OPTION_ID` and its value as
    /// librdmacm reads it: a byte for TOS and the ACK timeout, an `int`
    /// for the two flags.
    fn raw(self) -> (u32, OptVal) {
        match self {
            CmOption::Tos(t) => (sys::RDMA_OPTION_ID_TOS, OptVal::Byte(t)),
            CmOption::ReuseAddr(b) => (sys::RDMA_OPTION_ID_REUSEADDR, OptVal::Int(b.into())),
            CmOption::AfOnly(b) => (sys::RDMA_OPTION_ID_AFONLY, OptVal::Int(b.into())),
            CmOption::AckTimeout(t) => (sys::RDMA_OPTION_ID_ACK_TIMEOUT, OptVal::Byte(t)),
        }
    }
}

/// An option's value in the type its `optname` takes.
enum OptVal {
    Byte(u8),
    Int(libc::c_int),
}

impl CmId {
    /// Sets an option of the id (see [`CmOption`] for when each applies).
    ///
    /// # Errors
    /// [`Error::Verb`](crate::Error::Verb) naming `rdma_set_option`
    /// (`EINVAL` for a value the kernel refuses, e.g. an ACK timeout above
    /// 31, or an option set after the step it configures; `ENOSYS` where
    /// the kernel lacks it).
    ///
    /// # References
    /// `rdma_set_option(3)`
    ///
    /// # Example
    /// ```no_run
    /// # fn demo(ch: &rdma_verbs::cm::EventChannel) -> rdma_verbs::Result<()> {
    /// use rdma_verbs::cm::{CmId, CmOption};
    /// let id = CmId::new(ch)?;
    /// id.set_option(CmOption::ReuseAddr(true))?;
    /// id.set_option(CmOption::AckTimeout(14))?;
    /// # Ok(()) }
    /// ```
    #[doc(alias = "rdma_set_option")]
    pub fn set_option(&self, option: CmOption) -> Result<()> {
        let (name, mut val) = option.raw();
        let (ptr, len) = match &mut val {
            OptVal::Byte(b) => ((b as *mut u8).cast(), 1),
            OptVal::Int(i) => (
                (i as *mut libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>(),
            ),
        };
        // SAFETY: live id; `ptr` points to `len` initialised bytes of the
        // type the option takes, alive for the call (librdmacm copies it).
        let rc = unsafe {
            sys::rdma_set_option(
                self.as_ptr(),
                sys::RDMA_OPTION_ID as i32,
                name as i32,
                ptr,
                len,
            )
        };
        super::cm_id::neg_errno("rdma_set_option", rc)
    }
}

#[cfg(test)]
mod tests {
    use super::{CmOption, OptVal};

    #[test]
    fn options_take_the_type_librdmacm_reads() {
        let byte = |o: CmOption| match o.raw() {
            (n, OptVal::Byte(b)) => Some((n, b)),
            _ => None,
        };
        let int = |o: CmOption| match o.raw() {
            (n, OptVal::Int(i)) => Some((n, i)),
            _ => None,
        };
        assert_eq!(byte(CmOption::Tos(0xb8)), Some((0, 0xb8)));
        assert_eq!(byte(CmOption::AckTimeout(14)), Some((3, 14)));
        assert_eq!(int(CmOption::ReuseAddr(true)), Some((1, 1)));
        assert_eq!(int(CmOption::AfOnly(false)), Some((2, 0)));
    }
}
