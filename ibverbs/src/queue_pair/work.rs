//! What the one send and the one receive entry point take: one request,
//! or a chain of them in a `Vec` (one doorbell).
//!
//! [`QueuePair::post_send`], [`QueuePair::post_recv`] and
//! [`SharedReceiveQueue::post_recv`] are generic over these sealed traits,
//! so a single request and a chain go through one method each, and the
//! queue itself picks the verb (`ibv_post_send` or the `ibv_wr_*` region of
//! a queue pair created with [`SendOps`](crate::SendOps)).

use super::request::{PostError, RecvRequest, SendRequest};
use crate::error::Error;
use crate::{QueuePair, SharedReceiveQueue};

mod sealed {
    pub trait Sealed {}
    /// Makes the traits' methods uncallable outside the crate: the entry
    /// points are the one public way to post.
    pub struct Token(pub(crate) ());
}
pub(crate) use sealed::Token;

/// What [`QueuePair::post_send`] takes.
///
/// - A [`SendRequest`]: a refused request comes back whole, buffers
///   included, in a [`PostError`].
/// - A `&mut Vec<SendRequest>`: a chain posted with one doorbell. The
///   posted requests are drained from the `Vec` (its capacity is kept for
///   reuse); those not posted stay in it, buffers included, and the error
///   is a plain [`Error`]. A check that fails posts none of them.
///
/// Sealed: implemented only for these two.
pub trait SendWork: sealed::Sealed {
    /// What a refused post returns ([`PostError`] or [`Error`]; `?`
    /// converts either into [`Error`]).
    type Error: Into<Error>;
    #[doc(hidden)]
    fn post_to(self, qp: &QueuePair, token: Token) -> Result<(), Self::Error>;
}

/// What [`QueuePair::post_recv`] and [`SharedReceiveQueue::post_recv`]
/// take: a [`RecvRequest`] (handed back in a [`PostError`] if refused) or a
/// `&mut Vec<RecvRequest>` chain (posted ones drained, the rest left in
/// the `Vec`), as for [`SendWork`].
///
/// Sealed: implemented only for these two.
pub trait RecvWork: sealed::Sealed {
    /// What a refused post returns ([`PostError`] or [`Error`]).
    type Error: Into<Error>;
    #[doc(hidden)]
    fn post_to_qp(self, qp: &QueuePair, token: Token) -> Result<(), Self::Error>;
    #[doc(hidden)]
    fn post_to_srq(self, srq: &SharedReceiveQueue, token: Token) -> Result<(), Self::Error>;
}

impl sealed::Sealed for SendRequest<'_> {}
impl sealed::Sealed for &mut Vec<SendRequest<'_>> {}
impl sealed::Sealed for RecvRequest {}
impl sealed::Sealed for &mut Vec<RecvRequest> {}

impl<'a> SendWork for SendRequest<'a> {
    type Error = PostError<SendRequest<'a>>;
    #[inline]
    fn post_to(mut self, qp: &QueuePair, _: Token) -> Result<(), Self::Error> {
        match qp.post_request(&mut self) {
            Ok(()) => {
                // Its buffers and address handle are in their slot: what is
                // left (ids, options, remote addresses) needs no drop, so
                // none is run (SgList's drop glue is a call).
                debug_assert!(matches!(self.sg, crate::SgList::Empty) && self.ud.is_none());
                std::mem::forget(self);
                Ok(())
            }
            Err(error) => Err(PostError {
                error,
                request: self,
            }),
        }
    }
}

impl SendWork for &mut Vec<SendRequest<'_>> {
    type Error = Error;
    fn post_to(self, qp: &QueuePair, _: Token) -> Result<(), Error> {
        let (posted, result) = qp.post_chain(self);
        self.drain(..posted);
        result
    }
}

impl RecvWork for RecvRequest {
    type Error = PostError<RecvRequest>;
    #[inline]
    fn post_to_qp(self, qp: &QueuePair, _: Token) -> Result<(), Self::Error> {
        let mut one = [self];
        match qp.post_recv_slice(&mut one).1 {
            Ok(()) => Ok(()),
            Err(error) => {
                let [request] = one;
                Err(PostError { error, request })
            }
        }
    }
    #[inline]
    fn post_to_srq(self, srq: &SharedReceiveQueue, _: Token) -> Result<(), Self::Error> {
        let mut one = [self];
        match srq.post_slice(&mut one).1 {
            Ok(()) => Ok(()),
            Err(error) => {
                let [request] = one;
                Err(PostError { error, request })
            }
        }
    }
}

impl RecvWork for &mut Vec<RecvRequest> {
    type Error = Error;
    fn post_to_qp(self, qp: &QueuePair, _: Token) -> Result<(), Error> {
        let (posted, result) = qp.post_recv_slice(self);
        self.drain(..posted);
        result
    }
    fn post_to_srq(self, srq: &SharedReceiveQueue, _: Token) -> Result<(), Error> {
        let (posted, result) = srq.post_slice(self);
        self.drain(..posted);
        result
    }
}
