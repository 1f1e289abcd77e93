//! [`exchange`]: `rdma-verbs-runtime`'s endpoint exchange over a Tokio stream.

use std::io;
use std::time::Duration;

use rdma_verbs::Endpoint;
use rdma_verbs_runtime::{Error, Incoming, PeerInfo, Result};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// What [`Error::OutOfBand`] names.
const WHAT: &str = "endpoint exchange";

/// [`rdma_verbs_runtime::exchange`] over a Tokio stream: the same message,
/// checks and errors; the whole exchange runs under
/// `tokio::time::timeout`. Dropping the future drops nothing but the bytes
/// read so far (the stream is then mid-message: close it).
///
/// # Panics
/// As every Tokio timer, when polled outside a runtime with time enabled
/// (`enable_time`, or `enable_all`).
///
/// # Errors
/// As [`rdma_verbs_runtime::exchange`]: this crate returns the runtime
/// crate's [`Error`].
///
/// # Example
/// ```no_run
/// # async fn demo(qp: &rdma_verbs::QueuePair, local: &rdma_verbs::LocalPort,
/// #               opts: &rdma_verbs::ConnectOptions) -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use rdma_verbs::Endpoint;
/// let mut tcp = tokio::net::TcpStream::connect("server:18515").await?;
/// let me = local.endpoint(qp, Endpoint::random_psn())?;
/// let peer = rdma_verbs_tokio::exchange(&mut tcp, &me, b"hello", Duration::from_secs(10)).await?;
/// qp.connect(&me, &peer.endpoint, opts)?;
/// # Ok(()) }
/// ```
///
/// # References
/// `ibv_rc_pingpong(1)`
pub async fn exchange<S>(
    stream: &mut S,
    local: &Endpoint,
    private: &[u8],
    timeout: Duration,
) -> Result<PeerInfo>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let message = rdma_verbs_runtime::message(local, private)?;
    match tokio::time::timeout(timeout, run(stream, &message)).await {
        Ok(r) => r,
        Err(_) => Err(oob(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("the peer did not answer within {timeout:?}"),
        ))),
    }
}

async fn run<S>(stream: &mut S, message: &[u8]) -> Result<PeerInfo>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    stream.write_all(message).await.map_err(oob)?;
    stream.flush().await.map_err(oob)?;
    let mut incoming = Incoming::new();
    loop {
        let n = loop {
            match stream.read(incoming.buf()).await {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                r => break r.map_err(oob)?,
            }
        };
        if let Some(peer) = incoming.advance(n)? {
            return Ok(peer);
        }
    }
}

/// An [`Error::OutOfBand`] of the exchange.
fn oob(io: io::Error) -> Error {
    Error::OutOfBand { during: WHAT, io }
}

#[cfg(test)]
mod tests;
