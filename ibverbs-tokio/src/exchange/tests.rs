//! Host tests of the exchange over Tokio streams (localhost TCP).

use std::time::Instant;

use rdma_verbs::{error::WireProblem, qp::QpNumber, Gid};
use rdma_verbs_runtime::MAX_PRIVATE_LEN;

use super::*;
use tokio::io::AsyncWriteExt;

fn run<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

async fn pair() -> (tokio::net::TcpStream, tokio::net::TcpStream) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let a = tokio::spawn(async move { tokio::net::TcpStream::connect(addr).await });
    let (b, _) = l.accept().await.unwrap();
    (a.await.unwrap().unwrap(), b)
}

#[test]
fn round_trip() {
    run(async {
        let (mut a, mut b) = pair().await;
        let other =
            tokio::spawn(async move { exchange(&mut b, &ep(2), &[7; MAX_PRIVATE_LEN], T).await });
        let x = exchange(&mut a, &ep(1), b"from a", T).await.unwrap();
        let y = other.await.unwrap().unwrap();
        assert_eq!((x.endpoint, &x.private[..]), (ep(2), &[7u8; 4096][..]));
        assert_eq!((y.endpoint, &y.private[..]), (ep(1), &b"from a"[..]));
    })
}

#[test]
fn silent_hostile_and_oversize() {
    run(async {
        let (mut a, _b) = pair().await;
        let timeout = Duration::from_millis(200);
        let start = Instant::now();
        let r = exchange(&mut a, &ep(1), b"", timeout).await;
        assert!(
            matches!(&r, Err(Error::OutOfBand { during: "endpoint exchange", io }) if io.kind() == io::ErrorKind::TimedOut),
            "{r:?}"
        );
        assert!(start.elapsed() >= timeout);

        let (mut a, mut b) = pair().await;
        let mut m = rdma_verbs_runtime::message(&ep(2), b"").unwrap();
        m[5..9].copy_from_slice(&u32::MAX.to_be_bytes());
        b.write_all(&m).await.unwrap();
        let r = exchange(&mut a, &ep(1), b"", T).await;
        assert!(matches!(
            problem(r),
            WireProblem::OutOfRange {
                field: "private length",
                ..
            }
        ));

        let (mut a, mut b) = pair().await;
        b.write_all(&rdma_verbs_runtime::message(&ep(2), b"abc").unwrap()[..38])
            .await
            .unwrap();
        drop(b);
        let r = exchange(&mut a, &ep(1), b"", T).await;
        assert_eq!(
            problem(r),
            WireProblem::Length {
                len: 38,
                expected: 39
            }
        );

        let r = exchange(&mut a, &ep(1), &[0; 4097], T).await;
        assert!(
            matches!(r, Err(Error::Verbs(rdma_verbs::Error::OutOfRange { .. }))),
            "{r:?}"
        );
    })
}

fn ep(qp: u32) -> Endpoint {
    Endpoint {
        qp_num: QpNumber(qp),
        psn: 0x12_3456,
        lid: 7,
        gid: Gid([0xfe; 16]),
    }
}

const T: Duration = Duration::from_secs(5);

/// The wire problem of a refused exchange.
fn problem(r: Result<PeerInfo>) -> WireProblem {
    match r {
        Err(Error::BadWireFormat {
            what: "endpoint exchange",
            problem,
        }) => problem,
        other => panic!("not a malformed exchange: {other:?}"),
    }
}
