//! Verbs descriptors registered with the Tokio reactor, each claimed
//! process-wide by one driver.

use std::os::fd::AsRawFd;
use std::sync::{Mutex, MutexGuard};

use rdma_verbs::{cq::CompletionChannel, Context};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

use crate::error::{Error, Result};

/// Verbs objects whose descriptor stays open, and the same, for as long as
/// the object lives: `as_raw_fd` reads an immutable field of the C object
/// (`ibv_comp_channel::fd`, `ibv_context::async_fd`), which libibverbs
/// closes only when the object is destroyed, i.e. after the last handle
/// (clone) is dropped.
pub(crate) trait VerbsFd: AsRawFd {
    /// The C object whose descriptor it is: the key of its [`Claim`]
    /// (several `Context` handles may wrap one `ibv_context`, as rdma_cm's
    /// ids do).
    fn key(&self) -> usize;
    /// What the descriptor is, for errors.
    const DESCRIPTOR: &'static str;
}
impl VerbsFd for CompletionChannel {
    fn key(&self) -> usize {
        self.as_ptr() as usize
    }
    const DESCRIPTOR: &'static str = "completion channel";
}
impl VerbsFd for Context {
    fn key(&self) -> usize {
        self.as_ptr() as usize
    }
    const DESCRIPTOR: &'static str = "context's async events";
}

/// The C objects whose descriptor an [`AsyncQueuePair`] or
/// [`EventStream`] drives, process-wide. epoll refuses a second
/// registration (`EEXIST`) only within one epoll instance, i.e. one Tokio
/// runtime; two dispatchers on two runtimes would poll the same CQs and
/// consume each other's events. Touched only when a wrapper is created or
/// dropped, never on the data path.
static CLAIMED: Mutex<Vec<usize>> = Mutex::new(Vec::new());

/// One entry of [`CLAIMED`], released when dropped. Held beside the
/// registration, whose handle keeps the C object alive, so the key cannot
/// be reused by another object while claimed. (A forgotten claim stays:
/// the object is then leaked too, with its handle.)
pub(crate) struct Claim(usize);

impl Claim {
    pub(crate) fn take(key: usize, by: &'static str, descriptor: &'static str) -> Result<Claim> {
        let mut claimed = lock(&CLAIMED);
        if claimed.contains(&key) {
            return Err(Error::AlreadyDriven { by, descriptor });
        }
        claimed.push(key);
        Ok(Claim(key))
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        lock(&CLAIMED).retain(|&k| k != self.0);
    }
}

/// A descriptor registered with a runtime's reactor, and its claim.
/// Fields drop in order: the registration (deregistered from epoll) before
/// the claim is released.
pub(crate) struct Registered<T: VerbsFd> {
    pub(crate) fd: AsyncFd<T>,
    _claim: Claim,
}

/// Claims the descriptor of `inner` process-wide and registers it with the
/// current Tokio runtime's reactor, for readability. `by` names the caller
/// in errors.
pub(crate) fn register<T: VerbsFd>(inner: T, by: &'static str) -> Result<Registered<T>> {
    if tokio::runtime::Handle::try_current().is_err() {
        return Err(Error::NoRuntime { by });
    }
    let claim = Claim::take(inner.key(), by, T::DESCRIPTOR)?;
    // `register_with_interest` needs the descriptor to stay open, referring
    // to the same file description, and to be what `as_raw_fd` returns, for
    // the whole life of the AsyncFd.
    // SAFETY: the AsyncFd owns `inner`, a handle keeping the verbs object and
    // its descriptor alive; `as_raw_fd` reads an immutable field (`VerbsFd`).
    let fd = unsafe { AsyncFd::register_with_interest(inner, Interest::READABLE) };
    let fd = fd.map_err(|e| {
        let (_, source) = e.into_parts();
        rdma_verbs::Error::Verb {
            verb: "epoll_ctl",
            io: source,
        }
    })?;
    Ok(Registered { fd, _claim: claim })
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_is_refused_while_held_and_free_once_dropped() {
        // A key no live verbs object has (odd, so never an aligned pointer).
        let key = 0x1001;
        let first = Claim::take(key, "AsyncQueuePair", "completion channel").unwrap();
        match Claim::take(key, "AsyncQueuePair", "completion channel") {
            Err(Error::AlreadyDriven { by, descriptor }) => {
                assert_eq!((by, descriptor), ("AsyncQueuePair", "completion channel"))
            }
            other => panic!("a second claim: {:?}", other.map(|_| ())),
        }
        let other = Claim::take(key + 2, "EventStream", "context's async events").unwrap();
        drop(first);
        let again = Claim::take(key, "AsyncQueuePair", "completion channel").unwrap();
        drop((again, other));
        assert!(!lock(&CLAIMED).contains(&key));
    }
}
