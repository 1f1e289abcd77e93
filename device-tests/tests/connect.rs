//! Connecting queue pairs (device tests): endpoints and remote memory
//! through their wire forms, the local endpoint `connect` takes, the
//! remote access a queue pair grants (and the status a peer sees when it
//! does not), and the RDMA-read depth both ways.

mod common;

use common::{device, pair, pattern, remote_all, wait};
use rdma_verbs::{
    qp::Posted, AccessFlags, ConnectOptions, Endpoint, LocalPort, QpState, QpType, RemoteMemory,
    SendQueue, WcStatus, Wr,
};

fn local() -> AccessFlags {
    AccessFlags::LOCAL_WRITE
}

/// Two queue pairs connected through nothing but each other's bytes: the
/// endpoints and a memory range cross as `to_bytes`, come back through
/// `from_bytes`, and carry a send and an RDMA write.
#[test]
#[ignore = "needs an RDMA device"]
fn endpoints_and_memory_cross_as_bytes() {
    let dev = device();
    let pd = dev.ctx.alloc_pd().unwrap();
    let cq = dev.ctx.create_cq(512).build().unwrap();
    let qp = || pd.create_qp(QpType::Rc, &cq, &cq).build().unwrap();
    let (a, b) = (qp(), qp());
    let port = LocalPort::query(&dev.ctx, dev.port, Some(dev.gid_index)).unwrap();
    let wire_a = port
        .endpoint(&a, Endpoint::random_psn())
        .unwrap()
        .to_bytes();
    let wire_b = port
        .endpoint(&b, Endpoint::random_psn())
        .unwrap()
        .to_bytes();
    let (ea, eb) = (
        Endpoint::from_bytes(&wire_a).unwrap(),
        Endpoint::from_bytes(&wire_b).unwrap(),
    );
    assert_eq!((ea.qp_num, eb.qp_num), (a.qp_num(), b.qp_num()));
    assert_eq!(ea.gid, port.gid());
    let opts = ConnectOptions::new(dev.port)
        .local_port(&port)
        .remote_access(AccessFlags::REMOTE_WRITE);
    a.connect(&ea, &eb, &opts).unwrap();
    b.connect(&eb, &ea, &opts).unwrap();
    let (qa, _) = a.query().unwrap();
    assert_eq!((qa.sq_psn(), qa.rq_psn()), (ea.psn, eb.psn));

    let target = pd
        .alloc_shared(4096, local() | AccessFlags::REMOTE_WRITE)
        .unwrap();
    let wire = target.remote().unwrap().to_bytes();
    let remote = RemoteMemory::from_bytes(&wire).unwrap();
    assert_eq!(Some(remote), target.remote());
    let mut src = pd.alloc(256, local()).unwrap();
    src.copy_from_slice(&pattern(256, 9));
    b.recv_queue()
        .unwrap()
        .recv(pd.alloc(64, local()).unwrap(), 1)
        .unwrap();
    let mut sq = a.send_queue().unwrap();
    sq.write(src, remote.slice(512, 256).unwrap(), Wr::id(2))
        .unwrap();
    sq.send_inline(b"done", Wr::id(3)).unwrap();
    let got = wait(&cq, 3);
    assert!(got.iter().all(|c| c.is_success()), "{got:?}");
    let mut bytes = vec![0; 256];
    target.copy_to_slice(512, &mut bytes).unwrap();
    assert_eq!(bytes, pattern(256, 9));

    // A message of a later version, or cut short in transit, is refused.
    let mut v2 = wire_a.to_vec();
    v2[0] = 2;
    assert!(Endpoint::from_bytes(&v2).is_err());
    assert!(Endpoint::from_bytes(&wire_a[..20]).is_err());
    assert!(RemoteMemory::from_bytes(&wire[..20]).is_err());
}

/// A request on a local buffer and a peer's memory, posted on a send queue.
type Op = fn(&mut SendQueue, rdma_verbs::LocalBuffer, RemoteMemory, Wr) -> Posted;

/// One connection per operation the peer's queue pair was not connected
/// to accept: `op(buf, remote)` builds the request `a` posts to `b`'s
/// memory, which grants every right (only the queue pairs lack them).
/// Returns the status `a` sees and the state `b` ends in.
fn refused_by_the_peers_queue_pair(op: Op) -> (WcStatus, QpState) {
    // Both queue pairs grant LOCAL_WRITE only: the ConnectOptions default.
    let p = pair(QpType::Rc, local(), |b| b);
    let target = p.pd.alloc_shared(64, remote_all()).unwrap();
    let remote = target.remote().unwrap().slice(0, 8).unwrap();
    let mut sq = p.a.send_queue().unwrap();
    op(&mut sq, p.pd.alloc(8, local()).unwrap(), remote, Wr::id(7)).unwrap();
    let c = wait(&p.cq_a, 1).pop().unwrap();
    assert_eq!(c.wr_id(), 7);
    // The responder's side: give the device a moment to move it.
    std::thread::sleep(std::time::Duration::from_millis(100));
    (c.status(), p.b.state().unwrap())
}

/// What a peer sees when this side's queue pair lacks the remote access
/// flag its request needs (`ConnectOptions::remote_access`), next to what
/// it sees when the queue pair has it and the memory does not: the
/// statuses `WcStatus::RemInvReqErr` and `RemAccessErr` document.
#[test]
#[ignore = "needs an RDMA device"]
fn missing_remote_access_fails_the_peers_request() {
    let dev = device();
    let rxe = common::is_rxe(&dev);
    let cases: [(&str, Op); 3] = [
        ("RDMA write", |sq, b, r, o| sq.write(b, r, o)),
        ("RDMA read", |sq, b, r, o| sq.read(b, r, o)),
        ("fetch-and-add", |sq, b, r, o| sq.fetch_and_add(b, r, 1, o)),
    ];
    for (what, op) in cases {
        let (status, peer) = refused_by_the_peers_queue_pair(op);
        eprintln!("{what} to a queue pair without the right: {status:?}, peer in {peer:?}");
        if rxe {
            assert_eq!(status, WcStatus::RemInvReqErr, "{what}");
        } else {
            assert!(
                matches!(status, WcStatus::RemInvReqErr | WcStatus::RemAccessErr),
                "{what}: {status:?}"
            );
        }
    }

    // The queue pairs grant everything, the memory only remote reads: a
    // write is an access error, named as such.
    let p = pair(QpType::Rc, remote_all(), |b| b);
    let read_only =
        p.pd.alloc_shared(64, local() | AccessFlags::REMOTE_READ)
            .unwrap();
    let remote = read_only.remote().unwrap().slice(0, 8).unwrap();
    p.a.send_queue()
        .unwrap()
        .write(p.pd.alloc(8, local()).unwrap(), remote, Wr::id(0))
        .unwrap();
    let c = wait(&p.cq_a, 1).pop().unwrap();
    eprintln!(
        "RDMA write to memory without REMOTE_WRITE: {:?}",
        c.status()
    );
    assert_eq!(c.status(), WcStatus::RemAccessErr);
}

/// `rd_atomic(n)` sets both depths, and `n` reads outstanding at once
/// complete.
#[test]
#[ignore = "needs an RDMA device"]
fn rd_atomic_sets_both_directions() {
    let dev = device();
    let pd = dev.ctx.alloc_pd().unwrap();
    let cq = dev.ctx.create_cq(512).build().unwrap();
    let qp = || {
        pd.create_qp(QpType::Rc, &cq, &cq)
            .max_send_wr(8)
            .build()
            .unwrap()
    };
    let (a, b) = (qp(), qp());
    let (ea, eb) = (common::endpoint(&dev, &a, 1), common::endpoint(&dev, &b, 2));
    let opts = common::options(&dev, remote_all()).rd_atomic(4);
    a.connect(&ea, &eb, &opts).unwrap();
    b.connect(&eb, &ea, &opts).unwrap();
    for qp in [&a, &b] {
        let (attr, _) = qp.query().unwrap();
        assert_eq!((attr.max_rd_atomic(), attr.max_dest_rd_atomic()), (4, 4));
    }
    let mut source = pd.alloc_shared(4096, remote_all()).unwrap();
    source.copy_from_slice(0, &pattern(4096, 3)).unwrap();
    let remote = source.remote().unwrap();
    let mut sq = a.send_queue().unwrap();
    for i in 0..4u64 {
        let r = remote.slice(i * 1024, 1024).unwrap();
        sq.read(pd.alloc(1024, local()).unwrap(), r, Wr::id(i))
            .unwrap();
    }
    let mut got = wait(&cq, 4);
    got.sort_by_key(|c| c.wr_id());
    for (i, c) in got.iter_mut().enumerate() {
        c.result().unwrap();
        let want = &pattern(4096, 3)[i * 1024..(i + 1) * 1024];
        assert_eq!(&c.take_local().unwrap()[..], want);
    }
}
