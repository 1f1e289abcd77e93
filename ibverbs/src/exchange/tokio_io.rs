//! [`Endpoint::exchange_async`]: the endpoint exchange over a Tokio stream.

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::{bad, check_header, header_endpoint, oob, Deadline, PeerInfo, HEADER_LEN, WHAT};
use crate::error::{Result, WireProblem};
use crate::Endpoint;

impl Endpoint {
    /// [`Endpoint::exchange`] over a Tokio stream (feature `tokio`): the
    /// same message, checks and errors; the whole exchange runs under
    /// `tokio::time::timeout`. Cancel-safe in the sense that dropping the
    /// future drops nothing but the bytes read so far (the stream is then
    /// mid-message: close it).
    ///
    /// # Panics
    /// As every Tokio timer, when polled outside a runtime with time
    /// enabled (`enable_time`, or `enable_all`).
    ///
    /// # Errors
    /// As [`Endpoint::exchange`].
    ///
    /// # Example
    /// ```no_run
    /// # async fn demo(qp: &ibverbs::QueuePair, local: &ibverbs::LocalPort,
    /// #               opts: &ibverbs::ConnectOptions) -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use ibverbs::Endpoint;
    /// let mut tcp = tokio::net::TcpStream::connect("server:18515").await?;
    /// let me = local.endpoint(qp, Endpoint::random_psn())?;
    /// let peer = me.exchange_async(&mut tcp, b"hello", Duration::from_secs(10)).await?;
    /// qp.connect(&me, &peer.endpoint, opts)?;
    /// # Ok(()) }
    /// ```
    ///
    /// # References
    /// `ibv_rc_pingpong(1)`
    pub async fn exchange_async<S>(
        &self,
        stream: &mut S,
        private: &[u8],
        timeout: Duration,
    ) -> Result<PeerInfo>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        let message = self.message(private)?;
        let deadline = Deadline::after(timeout);
        match tokio::time::timeout(timeout, exchange(stream, &message)).await {
            Ok(r) => r,
            Err(_) => Err(deadline.expired(WHAT)),
        }
    }
}

async fn exchange<S>(stream: &mut S, message: &[u8]) -> Result<PeerInfo>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    stream
        .write_all(message)
        .await
        .map_err(|io| oob(WHAT, io))?;
    stream.flush().await.map_err(|io| oob(WHAT, io))?;
    let mut header = [0u8; HEADER_LEN];
    let mut got = 0;
    let len = loop {
        let n = read(stream, &mut header[got..]).await?;
        if n == 0 {
            return Err(bad(WireProblem::Length {
                len: got,
                expected: HEADER_LEN,
            }));
        }
        got += n;
        if let Some(len) = check_header(&header, got)? {
            break len;
        }
    };
    let endpoint = header_endpoint(&header)?;
    // `len` was checked against MAX_PRIVATE_LEN before this allocation.
    let mut private = vec![0u8; len];
    let mut got = 0;
    while got < len {
        let n = read(stream, &mut private[got..]).await?;
        if n == 0 {
            return Err(bad(WireProblem::Length {
                len: HEADER_LEN + got,
                expected: HEADER_LEN + len,
            }));
        }
        got += n;
    }
    Ok(PeerInfo { endpoint, private })
}

/// One read; an interrupted read is retried.
async fn read<S: AsyncRead + Unpin>(stream: &mut S, buf: &mut [u8]) -> Result<usize> {
    loop {
        match stream.read(buf).await {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            r => return r.map_err(|io| oob(WHAT, io)),
        }
    }
}
