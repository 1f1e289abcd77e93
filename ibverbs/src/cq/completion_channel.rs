//! Completion channels: sleep until a CQ has a completion.

use std::os::fd::{AsRawFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use rdma_verbs_sys as sys;

use crate::cq::completion_queue::{CompletionQueue, CqInner};
use crate::device::context::set_nonblocking;
use crate::device::context::Context;
use crate::error::{ret_errno, ret_ptr, Error, Result};

pub(crate) struct ChannelInner {
    ch: NonNull<sys::ibv_comp_channel>,
    _ctx: Context,
    /// CQs created on the channel by [`CompletionQueueBuilder`] and not
    /// destroyed: [`CompletionQueue::wait`] needs a channel of its own.
    ///
    /// [`CompletionQueueBuilder`]: crate::cq::CompletionQueueBuilder
    cqs: AtomicUsize,
    /// Whether the descriptor is known to be non-blocking (set through
    /// [`CompletionChannel::set_nonblocking`] or by a wait).
    nonblocking: AtomicBool,
    /// Held by the one [`CompletionQueue::wait`] that sleeps on the
    /// channel (see there).
    sleeper: Mutex<()>,
}

// SAFETY: channel verbs are thread-safe.
unsafe impl Send for ChannelInner {}
// SAFETY: as above.
unsafe impl Sync for ChannelInner {}

impl Drop for ChannelInner {
    fn drop(&mut self) {
        // SAFETY: last reference: every CQ using it holds a clone.
        unsafe { sys::ibv_destroy_comp_channel(self.ch.as_ptr()) };
    }
}

/// A completion event channel (`struct ibv_comp_channel`): a file
/// descriptor that becomes readable when an armed CQ gets a completion.
///
/// Watch its descriptor ([`AsRawFd`]) with `poll(2)`/epoll/an async
/// runtime, then [`CompletionChannel::get_event`], re-arm with
/// [`CompletionQueue::req_notify`] and poll the CQ. Events are acknowledged
/// for you (in batches, and all of them before the CQ is destroyed).
///
/// # References
/// `ibv_create_comp_channel(3)`, `ibv_get_cq_event(3)`
#[derive(Clone)]
pub struct CompletionChannel {
    inner: Arc<ChannelInner>,
}

impl Context {
    /// Creates a completion channel.
    ///
    /// # Errors
    /// [`Error::Verb`](crate::Error::Verb) naming `ibv_create_comp_channel`.
    ///
    /// # References
    /// `ibv_create_comp_channel(3)`
    #[doc(alias = "ibv_create_comp_channel")]
    pub fn create_comp_channel(&self) -> Result<CompletionChannel> {
        // SAFETY: live context; destroyed in ChannelInner's Drop.
        let ch = unsafe { sys::ibv_create_comp_channel(self.as_ptr()) };
        let ch = ret_ptr("ibv_create_comp_channel", ch)?;
        Ok(CompletionChannel {
            inner: Arc::new(ChannelInner {
                ch,
                _ctx: self.clone(),
                cqs: AtomicUsize::new(0),
                nonblocking: AtomicBool::new(false),
                sleeper: Mutex::new(()),
            }),
        })
    }
}

impl CompletionChannel {
    /// The raw channel pointer.
    ///
    /// [`get_event`](Self::get_event) takes the `cq_context` of every CQ
    /// reporting to the channel for one the library set: code creating a
    /// CQ on this channel through the C API (`ibv_create_cq`) must give it
    /// a null `cq_context` (its events are then acknowledged and
    /// reported as `Ok(None)`); an event read from the channel through the
    /// C API (`ibv_get_cq_event`) must be acknowledged there
    /// (`ibv_ack_cq_events`), or destroying its CQ blocks for good.
    pub fn as_ptr(&self) -> *mut sys::ibv_comp_channel {
        self.inner.ch.as_ptr()
    }

    /// Waits for the next completion event and returns the CQ it is for
    /// (blocks unless the channel is non-blocking; a channel
    /// [`CompletionQueue::wait`] slept on is). The event is counted for
    /// acknowledgement; re-arm the CQ before polling it to not miss one.
    /// `Ok(None)`: the event was for a CQ whose last handle is gone (it is
    /// acknowledged here). No lock and no search: the CQ comes from the
    /// event's `cq_context`, as in C.
    ///
    /// # Errors
    /// [`Error::Verb`](crate::Error::Verb) naming `ibv_get_cq_event`
    /// (`EAGAIN` when non-blocking and no event is pending).
    ///
    /// # References
    /// `ibv_get_cq_event(3)`
    #[doc(alias = "ibv_get_cq_event")]
    pub fn get_event(&self) -> Result<Option<CompletionQueue>> {
        let mut cq: *mut sys::ibv_cq = std::ptr::null_mut();
        let mut cq_ctx: *mut std::ffi::c_void = std::ptr::null_mut();
        // SAFETY: live channel; out-pointers are valid.
        let rc = unsafe { sys::ibv_get_cq_event(self.as_ptr(), &mut cq, &mut cq_ctx) };
        ret_errno("ibv_get_cq_event", rc)?;
        // SAFETY: an event just read from this channel, not yet acked; every
        // CQ on the channel was made by CompletionQueueBuilder, which leaves
        // a Weak<CqInner> in `cq_context` (or one made through `as_ptr`,
        // whose contract says null).
        match unsafe { CqInner::from_event(cq_ctx) } {
            Some(inner) => {
                inner.add_unacked();
                Ok(Some(CompletionQueue { inner }))
            }
            None => {
                // The CQ is being destroyed and its destroy waits for this
                // ack (CqInner::from_event); the pointer stays valid until
                // then.
                // SAFETY: `cq` was just reported by the channel and is not
                // destroyed before all its events are acked.
                unsafe { sys::ibv_ack_cq_events(cq, 1) };
                Ok(None)
            }
        }
    }

    /// Makes [`CompletionChannel::get_event`] non-blocking (or blocking).
    /// [`CompletionQueue::wait`] makes the channel it sleeps on
    /// non-blocking itself.
    ///
    /// # Errors
    /// [`Error::Verb`](crate::Error::Verb) naming `fcntl`.
    pub fn set_nonblocking(&self, nonblocking: bool) -> Result<()> {
        set_nonblocking(self.as_raw_fd(), nonblocking)?;
        self.inner.nonblocking.store(nonblocking, Ordering::Release);
        Ok(())
    }

    /// A handle for a CQ created on the channel, counted until
    /// [`detach_cq`](Self::detach_cq).
    pub(crate) fn attach_cq(&self) -> CompletionChannel {
        self.inner.cqs.fetch_add(1, Ordering::AcqRel);
        self.clone()
    }

    /// Uncounts a CQ of the channel once `ibv_destroy_cq` succeeded (a CQ
    /// that failed to be destroyed may still report here: it stays
    /// counted).
    pub(crate) fn detach_cq(&self) {
        self.inner.cqs.fetch_sub(1, Ordering::AcqRel);
    }

    /// The lock of the one [`CompletionQueue::wait`] sleeping on the channel.
    pub(crate) fn sleeper(&self) -> &Mutex<()> {
        &self.inner.sleeper
    }

    /// The CQs created on the channel and not destroyed.
    pub(crate) fn cq_count(&self) -> usize {
        self.inner.cqs.load(Ordering::Acquire)
    }

    /// Makes the descriptor non-blocking unless it is known to be: a wait
    /// reads an event only after `poll(2)` reported one, and an event read
    /// elsewhere in between must not keep it past its deadline.
    pub(crate) fn ensure_nonblocking(&self) -> Result<()> {
        if self.inner.nonblocking.load(Ordering::Acquire) {
            return Ok(());
        }
        self.set_nonblocking(true)
    }

    /// Sleeps in `ppoll(2)` until the descriptor is readable (`true`), or
    /// `timeout` passed or a signal interrupted the sleep (`false`);
    /// `None` sleeps without limit.
    pub(crate) fn sleep(&self, timeout: Option<Duration>) -> Result<bool> {
        let mut pfd = libc::pollfd {
            fd: self.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ts = timeout.map(|t| libc::timespec {
            tv_sec: libc::time_t::try_from(t.as_secs()).unwrap_or(libc::time_t::MAX),
            tv_nsec: t.subsec_nanos() as libc::c_long,
        });
        let ts_ptr = ts
            .as_ref()
            .map_or(std::ptr::null(), |t| t as *const libc::timespec);
        // SAFETY: one valid pollfd; `ts_ptr` is null or points at `ts`,
        // which outlives the call; no signal mask.
        let n = unsafe { libc::ppoll(&mut pfd, 1, ts_ptr, std::ptr::null()) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                return Ok(false);
            }
            return Err(Error::Verb {
                verb: "ppoll",
                io: e,
            });
        }
        if pfd.revents & (libc::POLLERR | libc::POLLHUP | libc::POLLNVAL) != 0 {
            // The descriptor of a live channel never reports these; going
            // on would spin.
            let errno = if pfd.revents & libc::POLLNVAL != 0 {
                libc::EBADF
            } else {
                libc::EIO
            };
            return Err(Error::from_errno("ppoll", errno));
        }
        Ok(n > 0 && pfd.revents & libc::POLLIN != 0)
    }
}

/// The descriptor, lent for readiness only (`poll(2)`, epoll, Tokio's
/// `AsyncFd`). There is deliberately no `AsFd`: a `BorrowedFd` would let
/// safe code `read(2)` an event past libibverbs, which then never
/// acknowledges it, and `ibv_destroy_cq` waits for that acknowledgement
/// forever. Reading, writing or closing the raw descriptor is the
/// caller's `unsafe` (DESIGN.md, threat model: descriptors lent out).
impl AsRawFd for CompletionChannel {
    fn as_raw_fd(&self) -> RawFd {
        // SAFETY: `fd` is an immutable field of the live channel.
        unsafe { (*self.as_ptr()).fd }
    }
}

impl std::fmt::Debug for CompletionChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompletionChannel")
            .field("fd", &self.as_raw_fd())
            .finish()
    }
}
