//! The context's asynchronous events as an async stream.

use std::task::{Context as TaskContext, Poll};

use rdma_verbs::{device::AsyncEvent, Context};

use crate::error::{Error, Result};
use crate::reactor::{register, Registered};

/// A device's asynchronous events (port changes, QP/CQ/SRQ errors, …) as
/// an async stream.
///
/// Makes the context's async-event descriptor non-blocking (it stays so:
/// [`Context::get_async_event`] returns `EAGAIN` instead of blocking while
/// nothing is pending) and registers it with the current Tokio runtime.
/// One per context in the process, across runtimes (a second is refused
/// until the first is dropped).
///
/// # Example
/// ```no_run
/// # async fn demo(ctx: &rdma_verbs::Context) -> rdma_verbs_tokio::Result<()> {
/// let mut events = rdma_verbs_tokio::EventStream::new(ctx)?;
/// loop {
///     let ev = events.next().await?; // already acknowledged: plain data
///     println!("{:?} on port {:?}", ev.event_type(), ev.port());
/// }
/// # }
/// ```
///
/// # References
/// `ibv_get_async_event(3)`
pub struct EventStream {
    reg: Registered<Context>,
}

impl EventStream {
    /// Watches `ctx`'s asynchronous events.
    ///
    /// # Errors
    /// [`Error::NoRuntime`] outside a Tokio runtime;
    /// [`Error::AlreadyDriven`] when the context's async events are already
    /// watched by another `EventStream` (on any runtime, through any handle
    /// of the same `ibv_context`); [`rdma_verbs::Error::Verb`] naming `fcntl` or
    /// `epoll_ctl`.
    ///
    /// # Panics
    /// Tokio panics when the current runtime was built without IO.
    ///
    /// # References
    /// `ibv_get_async_event(3)`, `fcntl(2)`, `epoll_ctl(2)`
    pub fn new(ctx: &Context) -> Result<EventStream> {
        ctx.set_async_nonblocking(true)?;
        Ok(EventStream {
            reg: register(ctx.clone(), "EventStream")?,
        })
    }

    /// The context watched.
    pub fn context(&self) -> &Context {
        self.reg.fd.get_ref()
    }

    /// Waits for the next event. Cancel-safe: an event is taken from the
    /// device only when it is returned.
    ///
    /// # Errors
    /// [`rdma_verbs::Error::Verb`] naming `ibv_get_async_event`, or `epoll_wait` when
    /// the runtime's reactor fails (e.g. it is shutting down).
    ///
    /// # References
    /// `ibv_get_async_event(3)`
    #[doc(alias = "ibv_get_async_event")]
    pub async fn next(&mut self) -> Result<AsyncEvent> {
        std::future::poll_fn(|cx| self.poll_next(cx)).await
    }

    /// Polls for the next event (the waker of the latest call is woken).
    ///
    /// # Errors
    /// As [`EventStream::next`].
    pub fn poll_next(&mut self, cx: &mut TaskContext<'_>) -> Poll<Result<AsyncEvent>> {
        loop {
            let mut guard = match self.reg.fd.poll_read_ready(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(source)) => {
                    return Poll::Ready(Err(rdma_verbs::Error::Verb {
                        verb: "epoll_wait",
                        io: source,
                    }
                    .into()))
                }
                Poll::Ready(Ok(guard)) => guard,
            };
            match self.reg.fd.get_ref().get_async_event() {
                Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => guard.clear_ready(),
                other => return Poll::Ready(other.map_err(Error::from)),
            }
        }
    }
}

impl EventStream {
    /// Waits for the next event nobody subscribed to, routing every event
    /// read meanwhile as [`Context::route_async_event`] does: the
    /// subscribers of its QP, SRQ or CQ get it, and the others (port and
    /// device events, objects without a live subscriber) are returned.
    /// Cancel-safe: an event read is routed at once, before this awaits
    /// again.
    ///
    /// # Errors
    /// As [`EventStream::next`].
    ///
    /// # References
    /// `ibv_get_async_event(3)`
    pub async fn next_unrouted(&mut self) -> Result<AsyncEvent> {
        loop {
            if let Some(ev) = self.next().await?.route() {
                return Ok(ev);
            }
        }
    }
}

impl std::fmt::Debug for EventStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventStream")
            .field("context", self.reg.fd.get_ref())
            .finish()
    }
}
