//! Name resolution for rdma_cm (`rdma_getaddrinfo`): a host name (or
//! numeric address) and a service to the source and destination addresses
//! of an id. The C list is copied into owned values and freed with
//! `rdma_freeaddrinfo` before [`AddrInfo::lookup`] returns.

use std::ffi::{CStr, CString};
use std::net::SocketAddr;
use std::ptr::NonNull;

use rdma_verbs_sys as sys;

use super::cm_id::{from_sockaddr, PortSpace};
use crate::error::{Error, Result};

/// `RAI_PASSIVE` (rdma_cma.h): the result is for a listener.
const RAI_PASSIVE: i32 = 0x1;
/// `RAI_NUMERICHOST`: the node is a numeric address, never looked up.
const RAI_NUMERICHOST: i32 = 0x2;

/// What to look up (`struct rdma_addrinfo` as hints). Defaults: an active
/// side's lookup, names resolved, TCP port space.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub struct AddrInfoHints {
    passive: bool,
    numeric_host: bool,
    port_space: PortSpace,
}

impl Default for AddrInfoHints {
    fn default() -> Self {
        AddrInfoHints {
            passive: false,
            numeric_host: false,
            port_space: PortSpace::Tcp,
        }
    }
}

impl AddrInfoHints {
    /// The defaults.
    pub fn new() -> AddrInfoHints {
        AddrInfoHints::default()
    }
    /// For a listener (`RAI_PASSIVE`): the node names the local address to
    /// bind (the source), none means every address.
    pub fn passive(mut self, on: bool) -> Self {
        self.passive = on;
        self
    }
    /// The node is a numeric address, never looked up (`RAI_NUMERICHOST`).
    pub fn numeric_host(mut self, on: bool) -> Self {
        self.numeric_host = on;
        self
    }
    /// The port space the result is for (`ai_port_space`).
    pub fn port_space(mut self, ps: PortSpace) -> Self {
        self.port_space = ps;
        self
    }

    fn raw(&self) -> sys::rdma_addrinfo {
        let mut flags = 0;
        if self.passive {
            flags |= RAI_PASSIVE;
        }
        if self.numeric_host {
            flags |= RAI_NUMERICHOST;
        }
        sys::rdma_addrinfo {
            ai_flags: flags,
            ai_port_space: self.port_space.as_raw() as i32,
            ..blank()
        }
    }
}

/// An all-zero `rdma_addrinfo` (no addresses, NULL pointers).
fn blank() -> sys::rdma_addrinfo {
    // SAFETY: all-zero is valid for this C struct (integers and NULLs).
    unsafe { std::mem::zeroed() }
}

/// One result of [`AddrInfo::lookup`]: the addresses to give
/// [`CmId::resolve_addr`](super::CmId::resolve_addr) (active side) or
/// [`CmId::bind_addr`](super::CmId::bind_addr) (passive side).
///
/// # References
/// `rdma_getaddrinfo(3)`
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddrInfo {
    src: Option<SocketAddr>,
    dst: Option<SocketAddr>,
    port_space: PortSpace,
    canonical_name: Option<String>,
}

impl AddrInfo {
    /// Resolves `node` (a host name or numeric address; `None` with a
    /// passive lookup: every local address) and `service` (a port number
    /// or service name) with rdma_cm's `rdma_getaddrinfo`: the results, in
    /// its order, each with the source and destination address (active
    /// lookups: the destination is `node`; passive: the source is).
    ///
    /// # Errors
    /// [`Error::Verb`] naming `rdma_getaddrinfo`: for a name that cannot be
    /// resolved the error carries the resolver's reason (`getaddrinfo`'s
    /// `EAI_*` code, explained; `raw_os_error` is `None`), otherwise the
    /// errno (`EINVAL` for a string with a NUL byte). Without a node and a
    /// service, librdmacm returns one result without addresses.
    ///
    /// # References
    /// `rdma_getaddrinfo(3)`, `rdma_freeaddrinfo(3)`
    ///
    /// # Example
    /// ```no_run
    /// # fn main() -> rdma_verbs::Result<()> {
    /// use std::time::Duration;
    /// use rdma_verbs::cm::{AddrInfo, AddrInfoHints, CmId, EventChannel};
    /// let ai = AddrInfo::lookup(Some("server.example"), Some("7471"), &AddrInfoHints::new())?;
    /// let first = &ai[0];
    /// let ch = EventChannel::new()?;
    /// let id = CmId::new(&ch)?;
    /// id.resolve_addr(first.src(), first.dst().expect("active lookup"), Duration::from_secs(2))?;
    /// # Ok(()) }
    /// ```
    #[doc(alias = "rdma_getaddrinfo")]
    #[doc(alias = "rdma_freeaddrinfo")]
    pub fn lookup(
        node: Option<&str>,
        service: Option<&str>,
        hints: &AddrInfoHints,
    ) -> Result<Vec<AddrInfo>> {
        let cstr = |s: &str| {
            CString::new(s).map_err(|_| {
                Error::from_errno("rdma_getaddrinfo", libc::EINVAL)
                    .with_hint(Some(format!("{s:?} contains a NUL byte")))
            })
        };
        let c_node = node.map(cstr).transpose()?;
        let c_service = service.map(cstr).transpose()?;
        // librdmacm lists and opens the devices (`fork.rs`).
        crate::device::fork::note_verbs_start();
        let raw_hints = hints.raw();
        let mut res: *mut sys::rdma_addrinfo = std::ptr::null_mut();
        // SAFETY: NUL-terminated strings (or NULL) and hints valid for the
        // call; `res` receives a list we free below.
        let rc = unsafe {
            sys::rdma_getaddrinfo(
                c_node.as_ref().map_or(std::ptr::null(), |s| s.as_ptr()),
                c_service.as_ref().map_or(std::ptr::null(), |s| s.as_ptr()),
                &raw_hints,
                &mut res,
            )
        };
        let what = format!(
            "node {}, service {}",
            node.unwrap_or("(none)"),
            service.unwrap_or("(none)")
        );
        if rc != 0 {
            let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
            return Err(lookup_error(rc, errno).with_hint(Some(what)));
        }
        let Some(head) = NonNull::new(res) else {
            return Ok(Vec::new());
        };
        let list = OwnedList(head);
        let mut out = Vec::new();
        let mut at = list.0.as_ptr().cast_const();
        // SAFETY: a list rdma_getaddrinfo returned, alive until `list`
        // drops; each entry's addresses are NULL or valid sockaddrs, its
        // names NULL or NUL-terminated.
        while let Some(ai) = unsafe { at.as_ref() } {
            // SAFETY: (both) NULL or a valid sockaddr of its family, alive
            // until `list` drops.
            let (src, dst) =
                unsafe { (from_sockaddr(ai.ai_src_addr), from_sockaddr(ai.ai_dst_addr)) };
            let name = [ai.ai_dst_canonname, ai.ai_src_canonname]
                .into_iter()
                .find(|p| !p.is_null())
                // SAFETY: a non-NULL name is NUL-terminated, alive until
                // `list` drops; copied out here.
                .map(|p| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned());
            out.push(AddrInfo {
                src,
                dst,
                port_space: PortSpace::from_raw(ai.ai_port_space as u32),
                canonical_name: name,
            });
            at = ai.ai_next;
        }
        Ok(out)
    }

    /// The source address (passive lookups: the address to bind).
    pub fn src(&self) -> Option<SocketAddr> {
        self.src
    }
    /// The destination address (active lookups).
    pub fn dst(&self) -> Option<SocketAddr> {
        self.dst
    }
    /// The port space the result is for.
    pub fn port_space(&self) -> PortSpace {
        self.port_space
    }
    /// The canonical name, when the resolver gave one.
    pub fn canonical_name(&self) -> Option<&str> {
        self.canonical_name.as_deref()
    }
}

/// The list `rdma_getaddrinfo` returned, freed once.
struct OwnedList(NonNull<sys::rdma_addrinfo>);

impl Drop for OwnedList {
    fn drop(&mut self) {
        // SAFETY: the list rdma_getaddrinfo returned, freed once, after
        // every value was copied out of it.
        unsafe { sys::rdma_freeaddrinfo(self.0.as_ptr()) };
    }
}

/// The error of a failed `rdma_getaddrinfo` (return `rc`, `errno`):
/// librdmacm passes getaddrinfo's `EAI_*` code on (as the return value
/// or, negative, in errno); a positive errno is an OS error.
fn lookup_error(rc: i32, errno: i32) -> Error {
    let eai = if rc < -1 {
        Some(rc)
    } else if errno < 0 {
        Some(errno)
    } else {
        None
    };
    match eai {
        Some(code) => {
            // SAFETY: gai_strerror returns a static NUL-terminated string.
            let reason = unsafe { CStr::from_ptr(libc::gai_strerror(code)) }.to_string_lossy();
            Error::Verb {
                verb: "rdma_getaddrinfo",
                io: std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    format!("{reason} (getaddrinfo code {code})"),
                ),
            }
        }
        None => Error::from_errno(
            "rdma_getaddrinfo",
            if errno > 0 { errno } else { libc::EINVAL },
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hints_set_librdmacms_flags() {
        let raw = AddrInfoHints::new().raw();
        assert_eq!(raw.ai_flags, 0);
        assert_eq!(raw.ai_port_space, sys::RDMA_PS_TCP as i32);
        let raw = AddrInfoHints::new()
            .passive(true)
            .numeric_host(true)
            .port_space(PortSpace::Udp)
            .raw();
        assert_eq!(raw.ai_flags, 3);
        assert_eq!(raw.ai_port_space, 0x111);
        assert!(raw.ai_src_addr.is_null() && raw.ai_dst_addr.is_null());
    }

    #[test]
    fn resolver_codes_become_errors_naming_the_verb() {
        // EAI_NONAME (-2) in errno, as librdmacm passes it on.
        let e = lookup_error(-1, libc::EAI_NONAME);
        assert_eq!(e.verb(), Some("rdma_getaddrinfo"));
        assert_eq!(e.raw_os_error(), None);
        assert!(e.to_string().contains("getaddrinfo code -2"), "{e}");
        // ... or as the return value.
        let e = lookup_error(libc::EAI_NONAME, 0);
        assert!(e.to_string().contains("code -2"), "{e}");
        // A plain errno stays one.
        let e = lookup_error(-1, libc::ENOMEM);
        assert_eq!(e.raw_os_error(), Some(libc::ENOMEM));
    }
}
