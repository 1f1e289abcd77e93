//! Shared receive queues (device tests): one pool of receive buffers for
//! several RC queue pairs.

mod common;

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use rdma_verbs::{
    cq::CompletionRef, device::AsyncEventType, qp::SharedReceiveQueue, AccessFlags, Completion,
    CompletionQueue, Completions, Error, LocalBuffer, ProtectionDomain, QpType, QueuePair,
    RecvRequest, SendQueue, WcOpcode, Wr,
};

const MSG: usize = 256;

fn blank(pd: &ProtectionDomain, len: usize) -> LocalBuffer {
    let mut b = pd.alloc(len, AccessFlags::LOCAL_WRITE).unwrap();
    b.fill(0xAA);
    b
}

fn filled(pd: &ProtectionDomain, bytes: &[u8]) -> LocalBuffer {
    let mut b = pd.alloc(bytes.len(), AccessFlags::LOCAL_WRITE).unwrap();
    b.copy_from_slice(bytes);
    b
}

/// The message client `client` sends as its `k`-th: `[client, k]` then a pattern.
fn message(client: usize, k: usize) -> Vec<u8> {
    let mut m = common::pattern(MSG - 40 * k, (client * 16 + k) as u8);
    m[0] = client as u8;
    m[1] = k as u8;
    m
}

/// `n` server QPs receiving through `srq`, each connected to its own
/// client QP. Server `i` completes on `server_cqs[i]` (or all on one CQ).
struct Fan {
    dev: common::TestDevice,
    pd: ProtectionDomain,
    srq: SharedReceiveQueue,
    server_cqs: Vec<CompletionQueue>,
    client_cq: CompletionQueue,
    servers: Vec<QueuePair>,
    clients: Vec<QueuePair>,
}

fn fan(n: usize, srq_depth: u32, cq_per_server: bool) -> Fan {
    let dev = common::device();
    let pd = dev.ctx.alloc_pd().unwrap();
    let srq = pd
        .create_srq(srq_depth)
        .build()
        .unwrap_or_else(|e| panic!("creating an SRQ of {srq_depth}: {e}"));
    let client_cq = dev.ctx.create_cq(256).build().unwrap();
    let n_cqs = if cq_per_server { n } else { 1 };
    let server_cqs: Vec<_> = (0..n_cqs)
        .map(|_| dev.ctx.create_cq(256).build().unwrap())
        .collect();
    let mut servers = Vec::new();
    let mut clients = Vec::new();
    for i in 0..n {
        let cq = &server_cqs[i % n_cqs];
        let s = pd
            .create_qp(QpType::Rc, cq, cq)
            .srq(&srq)
            .build()
            .unwrap_or_else(|e| panic!("creating an RC QP on an SRQ: {e}"));
        assert!(s.srq().is_some(), "the QP reports its SRQ");
        let c = pd
            .create_qp(QpType::Rc, &client_cq, &client_cq)
            .build()
            .unwrap();
        common::connect_pair(&dev, &s, &c, AccessFlags::LOCAL_WRITE);
        servers.push(s);
        clients.push(c);
    }
    Fan {
        dev,
        pd,
        srq,
        server_cqs,
        client_cq,
        servers,
        clients,
    }
}

/// Polls all `cqs` until `n` completions arrived (10 s at most).
fn wait_any(cqs: &[CompletionQueue], n: usize) -> Vec<Completion> {
    let mut out = Vec::new();
    let mut batch = Completions::with_capacity(16);
    let deadline = Instant::now() + Duration::from_secs(10);
    while out.len() < n {
        for cq in cqs {
            out.extend(cq.poll(&mut batch).unwrap().map(CompletionRef::into_owned));
        }
        assert!(
            Instant::now() < deadline,
            "timed out: {} of {n} completions: {out:?}",
            out.len()
        );
    }
    out
}

#[test]
#[ignore = "needs an RDMA device"]
fn three_qps_share_one_receive_pool() {
    let f = fan(3, 64, true);
    assert!(f.srq.capacity() >= 64, "SRQ capacity {}", f.srq.capacity());
    for s in &f.servers {
        assert_eq!(s.recv_outstanding(), 0, "an SRQ QP has no receive queue");
    }
    // The pool: 16 receive buffers, 6 posted one by one and 10 as a list.
    let mut rq = f.srq.recv_queue().unwrap();
    let mut pool_addrs = HashSet::new();
    for i in 0..6u64 {
        let b = blank(&f.pd, MSG);
        pool_addrs.insert(b.addr());
        rq.recv(b, 1000 + i).unwrap();
    }
    let mut list: Vec<RecvRequest> = (6..16u64)
        .map(|i| {
            let b = blank(&f.pd, MSG);
            pool_addrs.insert(b.addr());
            RecvRequest::new(b).wr_id(1000 + i)
        })
        .collect();
    rq.post_chain(&mut list).unwrap();
    assert!(list.is_empty(), "posted requests are drained from the list");
    assert_eq!(f.srq.outstanding(), 16, "16 receives in the pool");

    // Every client sends 4 distinct messages (12 in all).
    let server_of: HashMap<u32, usize> = f
        .servers
        .iter()
        .enumerate()
        .map(|(i, s)| (s.qp_num().0, i))
        .collect();
    let mut sqs: Vec<SendQueue> = f.clients.iter().map(|c| c.send_queue().unwrap()).collect();
    for k in 0..4 {
        for (c, sq) in sqs.iter_mut().enumerate() {
            sq.send(filled(&f.pd, &message(c, k)), Wr::id((c * 10 + k) as u64))
                .unwrap();
        }
    }
    for s in common::wait(&f.client_cq, 12) {
        s.result()
            .unwrap_or_else(|e| panic!("client send failed: {e}: {s:?}"));
    }
    let got = wait_any(&f.server_cqs, 12);
    let mut next_k = [0usize; 3];
    let mut seen_wr = HashSet::new();
    let mut seen_addr = HashSet::new();
    for mut c in got {
        c.result()
            .unwrap_or_else(|e| panic!("SRQ receive failed: {e}: {c:?}"));
        assert_eq!(c.opcode(), WcOpcode::Recv, "{c:?}");
        let server = *server_of
            .get(&c.qp_num())
            .unwrap_or_else(|| panic!("completion of an unknown QP {:#x}", c.qp_num()));
        // Server i is connected to client i; RC keeps each sender's order.
        let k = next_k[server];
        next_k[server] += 1;
        let want = message(server, k);
        assert_eq!(
            c.byte_len() as usize,
            want.len(),
            "message {k} of client {server}"
        );
        assert!(
            (1000..1016).contains(&c.wr_id()) && seen_wr.insert(c.wr_id()),
            "wr_id {} is one of the pool's, once",
            c.wr_id()
        );
        let b = c.take_local().expect("SRQ receive hands its buffer back");
        assert!(
            pool_addrs.contains(&b.addr()) && seen_addr.insert(b.addr()),
            "buffer {:#x} comes from the SRQ pool, once",
            b.addr()
        );
        assert_eq!(
            &b[..want.len()],
            &want[..],
            "data of message {k} from client {server} (completion on server QP {server})"
        );
        assert!(b[want.len()..].iter().all(|&x| x == 0xAA), "tail untouched");
    }
    assert_eq!(next_k, [4, 4, 4], "every client's 4 messages arrived");
    assert_eq!(f.srq.outstanding(), 4, "12 of 16 receives consumed");
    for cq in &f.server_cqs {
        common::assert_quiet(cq);
    }
    // The 4 left over are released when everything is dropped.
}

#[test]
#[ignore = "needs an RDMA device"]
fn posting_on_an_srq_queue_pair_is_invalid() {
    let f = fan(1, 16, false);
    let qp = &f.servers[0];
    // An SRQ-attached QP has no receive queue to post to: its handle is
    // refused, so no receive (single or chain) can reach it.
    let err = qp.recv_queue().unwrap_err();
    assert!(
        matches!(err, Error::ReceivesThroughSrq),
        "recv_queue of an SRQ-attached QP must be ReceivesThroughSrq, got {err}"
    );
    assert_eq!((qp.recv_outstanding(), f.srq.outstanding()), (0, 0));
    // The SRQ itself takes them.
    let mut list = vec![
        RecvRequest::new(blank(&f.pd, 64)),
        RecvRequest::new(blank(&f.pd, 64)),
    ];
    f.srq.recv_queue().unwrap().post_chain(&mut list).unwrap();
    assert!(list.is_empty());
    assert_eq!(f.srq.outstanding(), 2);
}

#[test]
#[ignore = "needs an RDMA device"]
fn query_and_arm_limit() {
    let t = common::device();
    let pd = t.ctx.alloc_pd().unwrap();
    let srq = pd.create_srq(32).max_sge(2).build().unwrap();
    let a = srq.query().unwrap();
    assert!(a.max_wr >= 32, "queried max_wr {} >= 32", a.max_wr);
    assert!(a.max_sge >= 2, "queried max_sge {} >= 2", a.max_sge);
    assert_eq!(a.srq_limit, 0, "no limit armed at creation");
    assert!(srq.capacity() >= 32, "capacity {}", srq.capacity());
    srq.arm_limit(8).unwrap();
    assert_eq!(
        srq.query().unwrap().srq_limit,
        8,
        "limit after arm_limit(8)"
    );
    srq.arm_limit(0).unwrap();
    assert_eq!(srq.query().unwrap().srq_limit, 0, "limit disarmed");
    // A limit beyond the queue is the device's error, naming the verb.
    let err = srq.arm_limit(a.max_wr + 1).unwrap_err();
    assert_eq!(err.verb(), Some("ibv_modify_srq"), "{err}");
    // Built with a limit.
    let srq2 = pd.create_srq(16).srq_limit(4).build().unwrap();
    assert_eq!(srq2.query().unwrap().srq_limit, 4, "builder's srq_limit");
}

#[test]
#[ignore = "needs an RDMA device"]
fn limit_event_when_the_pool_runs_low() {
    let f = fan(1, 16, false);
    let mut rq = f.srq.recv_queue().unwrap();
    for i in 0..6 {
        rq.recv(blank(&f.pd, 64), i).unwrap();
    }
    f.srq.arm_limit(4).unwrap();
    f.dev.ctx.set_async_nonblocking(true).unwrap();
    // 3 receives consumed: 3 left < limit 4.
    let mut sq = f.clients[0].send_queue().unwrap();
    for k in 0..3u8 {
        sq.send(filled(&f.pd, &[k; 32]), Wr::id(0)).unwrap();
    }
    for c in common::wait(&f.client_cq, 3) {
        c.result().unwrap();
    }
    for c in common::wait(&f.server_cqs[0], 3) {
        c.result().unwrap();
    }
    assert_eq!(f.srq.outstanding(), 3);
    let deadline = Instant::now() + Duration::from_secs(5);
    let event = loop {
        match f.dev.ctx.get_async_event() {
            Ok(e) if e.event_type() == AsyncEventType::SrqLimitReached => break Some(e),
            Ok(e) => eprintln!("other async event: {e:?}"),
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => {}
            Err(e) => panic!("get_async_event: {e}"),
        }
        if Instant::now() > deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    match event {
        Some(_) => {
            // The event disarms the limit.
            assert_eq!(
                f.srq.query().unwrap().srq_limit,
                0,
                "limit disarmed by the event"
            );
        }
        None => common::unsupported(
            "IBV_EVENT_SRQ_LIMIT_REACHED",
            &Error::Unsupported("an SRQ limit event within 5 s"),
        ),
    }
    f.dev.ctx.set_async_nonblocking(false).unwrap();
}

#[test]
#[ignore = "needs an RDMA device"]
fn over_posting_is_queue_full() {
    let t = common::device();
    let pd = t.ctx.alloc_pd().unwrap();
    let srq = pd.create_srq(8).build().unwrap();
    let cap = srq.capacity();
    assert!(cap >= 8, "capacity {cap}");
    let mut rq = srq.recv_queue().unwrap();
    for i in 0..cap - 1 {
        rq.recv(blank(&pd, 16), u64::from(i))
            .unwrap_or_else(|e| panic!("receive {i} of {cap}: {}", e.error));
    }
    // Two more do not fit in the one free slot: nothing of the list is posted.
    let mut list = vec![
        RecvRequest::new(blank(&pd, 16)),
        RecvRequest::new(blank(&pd, 16)),
    ];
    let err = rq.post_chain(&mut list).unwrap_err();
    assert!(
        matches!(err, Error::QueueFull { queue: "shared receive queue", depth } if depth == cap),
        "over-posting a list: {err}"
    );
    assert_eq!(
        list.len(),
        2,
        "a list that does not fit is not posted at all"
    );
    assert_eq!(srq.outstanding(), cap - 1);
    // The last slot takes one; the next one is refused and handed back.
    let mut one = vec![list.pop().unwrap()];
    rq.post_chain(&mut one).unwrap();
    assert!(one.is_empty());
    assert_eq!(srq.outstanding(), cap);
    let last = list.pop().unwrap().into_buffers().into_local().unwrap();
    let err = rq.recv(last, 42).unwrap_err();
    assert!(
        matches!(err.error, Error::QueueFull { queue: "shared receive queue", depth } if depth == cap),
        "over-posting one: {}",
        err.error
    );
    assert_eq!(err.buf.len(), 16, "request handed back");
    assert_eq!(srq.outstanding(), cap);
}

#[test]
#[ignore = "needs an RDMA device"]
fn queue_pairs_keep_a_dropped_srq_alive() {
    let Fan {
        dev: _dev,
        pd,
        srq,
        server_cqs,
        client_cq,
        servers,
        clients,
    } = fan(2, 16, false);
    let mut rq = srq.recv_queue().unwrap();
    for i in 0..4 {
        rq.recv(blank(&pd, MSG), i).unwrap();
    }
    // The handle keeps the SRQ alive too: dropped first.
    drop(rq);
    drop(srq); // the QPs still hold it
    for (c, qp) in clients.iter().enumerate() {
        qp.send_queue()
            .unwrap()
            .send(filled(&pd, &message(c, 0)), Wr::id(0))
            .unwrap();
    }
    for s in common::wait(&client_cq, 2) {
        s.result().unwrap();
    }
    let mut got = common::wait(&server_cqs[0], 2);
    got.sort_by_key(|c| c.qp_num());
    let mut order: Vec<_> = servers.iter().enumerate().collect();
    order.sort_by_key(|(_, s)| s.qp_num().0);
    for (mut c, (i, s)) in got.into_iter().zip(order) {
        c.result().unwrap();
        assert_eq!(c.qp_num(), s.qp_num().0);
        let want = message(i, 0);
        let b = c
            .take_local()
            .expect("buffer of a dropped SRQ handle comes back");
        assert_eq!(&b[..want.len()], &want[..], "message of client {i}");
    }
    let srq = servers[0].srq().expect("QP still has its SRQ");
    assert_eq!(srq.outstanding(), 2, "2 receives left in the pool");
    // Drop the QPs in any order; the SRQ goes with the last one.
    drop(servers);
    drop(clients);
}
