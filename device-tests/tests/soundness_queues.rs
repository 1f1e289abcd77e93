//! Queue and completion soundness (device tests): completions claimed out
//! of order by threads sharing a CQ, what `take_*` gives back, receives on a
//! queue pair in ERR, and CQ capacity against the queues reporting to it.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use common::{assert_quiet, connect_pair, device, pair, poll_until, remote_all, wait, wait_ok};
use rdma_verbs::{
    memory::{Buf, SgList},
    AccessFlags, Completions, Error, LocalBuffer, QpType, QueuePair, RecvRequest, SendQueue,
    WcStatus, Wr,
};

fn local() -> AccessFlags {
    AccessFlags::LOCAL_WRITE
}

const POLLERS: usize = 4;
const PER_QP: u64 = 10_000;
const POOL: usize = 16;

/// Four threads, each posting signaled RDMA writes on its own queue pair,
/// all four queue pairs reporting to one send CQ that every thread polls:
/// completions of one queue pair are claimed by different threads in any
/// order. Every request's buffer must come back with its own completion,
/// exactly once.
#[test]
#[ignore = "needs an RDMA device"]
fn soundness_q_four_pollers_share_one_cq_and_get_every_buffer_back_once() {
    let dev = device();
    let pd = dev.ctx.alloc_pd().unwrap();
    let shared = dev.ctx.create_cq(1024).build().unwrap();
    let rx = dev.ctx.create_cq(64).build().unwrap();
    let target = pd.alloc_shared(4096, remote_all()).unwrap();
    let remote = target.remote().unwrap();
    let mut qps = Vec::new();
    let mut peers = Vec::new();
    for _ in 0..POLLERS {
        let a = pd
            .create_qp(QpType::Rc, &shared, &rx)
            .max_send_wr(POOL as u32)
            .max_recv_wr(1)
            .build()
            .unwrap();
        let cq_b = dev.ctx.create_cq(256).build().unwrap();
        let b = pd.create_qp(QpType::Rc, &cq_b, &cq_b).build().unwrap();
        connect_pair(&dev, &a, &b, remote_all());
        qps.push(a);
        peers.push((b, cq_b));
    }
    // seen[qp][seq]: how many times request `seq` of `qp` came back with
    // its buffer.
    let seen: Arc<Vec<Vec<AtomicU8>>> = Arc::new(
        (0..POLLERS)
            .map(|_| (0..PER_QP).map(|_| AtomicU8::new(0)).collect())
            .collect(),
    );
    let missing = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicBool::new(false));
    let (senders, receivers): (Vec<_>, Vec<_>) = (0..POLLERS).map(|_| mpsc::channel()).unzip();
    let deadline = Instant::now() + Duration::from_secs(240);
    let threads: Vec<_> = receivers
        .into_iter()
        .enumerate()
        .map(|(me, back)| {
            let qp = qps[me].clone();
            let cq = shared.clone();
            let senders = senders.clone();
            let (seen, missing, done, failed) =
                (seen.clone(), missing.clone(), done.clone(), failed.clone());
            let mut pool: Vec<_> = (0..POOL).map(|_| pd.alloc(64, local()).unwrap()).collect();
            let remote = remote.slice(64 * me as u64, 64).unwrap();
            std::thread::spawn(move || {
                // This thread's queue pair, posted to through its handle.
                let mut sq = qp.send_queue().unwrap();
                let mut posted = 0u64;
                let mut batch = Completions::with_capacity(4);
                let mut turn = 0u64;
                let total = POLLERS as u64 * PER_QP;
                // One claimed completion: its `wr_id`, whether it succeeded,
                // the buffer `take_local` gave back, and itself to print.
                let settle =
                    |wr_id: u64, ok: bool, buf: Option<LocalBuffer>, c: &dyn std::fmt::Debug| {
                        if !ok {
                            failed.store(true, Ordering::Relaxed);
                            panic!("failed completion: {c:?}");
                        }
                        let (owner, seq) = ((wr_id >> 32) as usize, wr_id & 0xffff_ffff);
                        match buf {
                            Some(buf) => {
                                seen[owner][seq as usize].fetch_add(1, Ordering::Relaxed);
                                // The owner may have finished: then the
                                // buffer is simply dropped.
                                let _ = senders[owner].send(buf);
                            }
                            None => {
                                missing.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        done.fetch_add(1, Ordering::Relaxed);
                    };
                while done.load(Ordering::Relaxed) < total && !failed.load(Ordering::Relaxed) {
                    assert!(Instant::now() < deadline, "timed out");
                    pool.extend(back.try_iter());
                    while posted < PER_QP {
                        let Some(buf) = pool.pop() else { break };
                        let wr_id = (me as u64) << 32 | posted;
                        match sq.write(buf, remote, Wr::id(wr_id)) {
                            Ok(()) => posted += 1,
                            // The ring's tail waits for a completion another
                            // thread polled but has not claimed yet: the
                            // queue counts as full meanwhile. Back-pressure.
                            Err(e) if matches!(e.error, Error::QueueFull { .. }) => {
                                pool.push(e.buf.into_local().unwrap());
                                break;
                            }
                            Err(e) => panic!("posting {wr_id:#x}: {}", e.error),
                        }
                    }
                    // Alternate the two claim paths: poll (each completion
                    // claimed as the walk reaches it, borrowed) and poll_one
                    // (owned).
                    turn += 1;
                    if turn % 2 == 0 {
                        for mut c in cq.poll(&mut batch).unwrap() {
                            let buf = c.take_local();
                            settle(c.wr_id(), c.result().is_ok(), buf, &c);
                        }
                    } else if let Some(mut c) = cq.poll_one().unwrap() {
                        let buf = c.take_local();
                        settle(c.wr_id(), c.result().is_ok(), buf, &c);
                    }
                }
            })
        })
        .collect();
    drop(senders);
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(
        missing.load(Ordering::Relaxed),
        0,
        "signaled completions came back without their buffer"
    );
    let mut wrong = Vec::new();
    for (q, per) in seen.iter().enumerate() {
        for (s, n) in per.iter().enumerate() {
            let n = n.load(Ordering::Relaxed);
            if n != 1 {
                wrong.push((q, s, n));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "{} requests not handed back exactly once (qp, seq, times): {:?}",
        wrong.len(),
        &wrong[..wrong.len().min(20)]
    );
    for qp in &qps {
        assert_eq!(qp.send_outstanding(), 0);
    }
    drop(peers);
}

/// `take_local` on a completion holding a shared buffer (and `take_shared`
/// on a local one) gives `None` and leaves the buffer for the right call.
#[test]
#[ignore = "needs an RDMA device"]
fn soundness_q_take_of_the_wrong_kind_leaves_the_buffer() {
    let p = pair(QpType::Rc, local(), |b| b);
    let mut sq = p.a.send_queue().unwrap();
    let mut rq = p.b.recv_queue().unwrap();
    let shared = p.pd.alloc_shared(64, local()).unwrap();
    rq.recv(shared, 1).unwrap();
    sq.send_inline(b"shared", Wr::id(0)).unwrap();
    wait_ok(&p.cq_a);
    let mut c = wait_ok(&p.cq_b);
    assert!(c.take_local().is_none(), "a shared buffer is not local");
    assert!(
        c.take_shared().is_some(),
        "take_local dropped the shared buffer"
    );

    let mine = p.pd.alloc(64, local()).unwrap();
    rq.recv(mine, 2).unwrap();
    sq.send_inline(b"local", Wr::id(0)).unwrap();
    wait_ok(&p.cq_a);
    let mut c = wait_ok(&p.cq_b);
    assert!(c.take_shared().is_none(), "a local buffer is not shared");
    let back = c
        .take_local()
        .expect("take_shared dropped the local buffer");
    assert_eq!(&back[..5], b"local");
}

/// `take_buf` on a scatter list gives `None` and leaves every buffer for
/// `take_buffers`.
#[test]
#[ignore = "needs an RDMA device"]
fn soundness_q_take_buf_leaves_a_scatter_list_whole() {
    let p = pair(QpType::Rc, local(), |b| b.max_recv_sge(2));
    let mut sq = p.a.send_queue().unwrap();
    let mut rq = p.b.recv_queue().unwrap();
    let first = p.pd.alloc(4, local()).unwrap();
    let second = p.pd.alloc(60, local()).unwrap();
    rq.recv_sgl(vec![Buf::Local(first), Buf::Local(second)], 3)
        .unwrap();
    sq.send_inline(b"abcdefgh", Wr::id(0)).unwrap();
    wait_ok(&p.cq_a);
    let mut c = wait_ok(&p.cq_b);
    assert!(c.take_buf().is_none(), "take_buf split a scatter list");
    assert!(c.take_local().is_none());
    match c.take_buffers() {
        SgList::Many(v) => {
            assert_eq!(v.len(), 2, "buffers were dropped");
            let bytes: Vec<u8> = v
                .into_iter()
                .flat_map(|b| b.into_local().unwrap().to_vec())
                .take(8)
                .collect();
            assert_eq!(&bytes, b"abcdefgh");
        }
        other => panic!("expected both buffers, got {other:?}"),
    }
}

fn is_in_error(e: &Error) -> bool {
    matches!(e, Error::QueuePairInError { .. })
}

/// A queue pair moved to ERR flushes the receives outstanding then and
/// refuses later ones (table posts, lists and prepared receives), handing
/// the buffers back; reset, it no longer refuses for that reason.
#[test]
#[ignore = "needs an RDMA device"]
fn soundness_q_receive_after_err_is_refused_and_earlier_ones_flush() {
    let p = pair(QpType::Rc, local(), |b| b);
    let mut rq = p.b.recv_queue().unwrap();
    let early = p.pd.alloc(64, local()).unwrap();
    rq.recv(early, 10).unwrap();
    let mut prepared = rq
        .prepare(RecvRequest::new(p.pd.alloc(64, local()).unwrap()).wr_id(11))
        .unwrap();
    rq.post_prepared(&mut prepared).unwrap();
    p.b.to_err().unwrap();

    let late = p.pd.alloc(64, local()).unwrap();
    let refused = rq.recv(late, 12).unwrap_err();
    assert!(is_in_error(&refused.error), "{}", refused.error);
    assert!(refused.buf.into_local().is_some(), "buffer not handed back");
    let mut list = vec![RecvRequest::new(p.pd.alloc(64, local()).unwrap()).wr_id(13)];
    let e = rq.post_chain(&mut list).unwrap_err();
    assert!(is_in_error(&e), "{e}");
    assert_eq!(list.len(), 1, "the refused request stays in the list");

    // The two outstanding before the move come back flushed, with the
    // table buffer; the prepared posting's count is claimed.
    let mut flushed = wait(&p.cq_b, 2);
    flushed.sort_by_key(|c| c.wr_id());
    assert_eq!(
        flushed.iter().map(|c| c.wr_id()).collect::<Vec<_>>(),
        [10, 11]
    );
    for c in &flushed {
        assert_eq!(c.status(), WcStatus::WrFlushErr, "{c:?}");
    }
    assert!(
        flushed[0].take_local().is_some(),
        "the flushed buffer came back"
    );
    assert!(
        !prepared.is_posted(),
        "the prepared posting was not flushed"
    );
    // Now the prepared receive is refused too, and nothing else arrives.
    let e = rq.post_prepared(&mut prepared).unwrap_err();
    assert!(is_in_error(&e), "{e}");
    assert!(!prepared.is_posted());
    assert_quiet(&p.cq_b);

    // Reset clears the refusal (RESET itself may refuse receives, for its
    // own reason). The receive queue's handle goes first: a RESET is
    // refused while it lives.
    assert!(
        matches!(p.b.reset(), Err(Error::HandleLive { .. })),
        "reset with a live receive handle"
    );
    drop(rq);
    p.b.reset().unwrap();
    if let Err(e) = common::post_recv(&p.b, RecvRequest::new(p.pd.alloc(64, local()).unwrap())) {
        assert!(
            !is_in_error(&e.error),
            "still refused after reset: {}",
            e.error
        );
    }
}

/// The mechanism the prepared receives rely on when they race a move to
/// ERR: a receive that reached the queue after the move's flush is flushed
/// by moving the queue pair to ERR again. The receive goes through the raw
/// path (the safe ones refuse it).
#[test]
#[ignore = "needs an RDMA device"]
fn soundness_q_a_second_move_to_err_flushes_a_late_receive() {
    let p = pair(QpType::Rc, local(), |b| b);
    p.b.to_err().unwrap();
    assert_quiet(&p.cq_b);
    let mut buf = p.pd.alloc(64, local()).unwrap();
    let mut sge = rdma_verbs::sys::ibv_sge {
        addr: buf.as_mut_ptr() as u64,
        length: 64,
        lkey: buf.memory_region().lkey(),
    };
    let mut wr = rdma_verbs::sys::ibv_recv_wr {
        wr_id: 77,
        next: std::ptr::null_mut(),
        sg_list: &mut sge,
        num_sge: 1,
    };
    // SAFETY: `buf` is registered and neither read nor moved until the
    // completion is polled below (it lives to the end of the test); wr_id
    // has bit 63 clear; one NULL-terminated request.
    unsafe { p.b.post_recv_raw(&mut wr) }.unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let mut batch = Completions::with_capacity(4);
    let before = p.cq_b.poll(&mut batch).unwrap().len();
    if common::is_rxe(&p.dev) {
        // The premise of the refusal: rxe's user-space post_recv makes no
        // system call, so nothing flushes a receive posted in ERR.
        assert_eq!(before, 0, "rxe flushed a receive posted in ERR by itself");
    }
    if before == 0 {
        p.b.to_err().unwrap();
        let c = poll_until(|| p.cq_b.poll_one().unwrap());
        assert_eq!(c.wr_id(), 77);
        assert_eq!(c.status(), WcStatus::WrFlushErr);
    }
    drop(buf);
}

/// Prepared receives posted by one thread while another moves the queue
/// pair to ERR: every posting the library accepted comes back (flushed or
/// completed), none stays outstanding.
#[test]
#[ignore = "needs an RDMA device"]
fn soundness_q_prepared_receives_racing_a_move_to_err_all_come_back() {
    let dev = device();
    let pd = dev.ctx.alloc_pd().unwrap();
    for round in 0..30u32 {
        let cq = dev.ctx.create_cq(256).build().unwrap();
        let cq_peer = dev.ctx.create_cq(256).build().unwrap();
        let qp = pd.create_qp(QpType::Rc, &cq, &cq).build().unwrap();
        let peer = pd
            .create_qp(QpType::Rc, &cq_peer, &cq_peer)
            .build()
            .unwrap();
        connect_pair(&dev, &qp, &peer, local());
        let mut rq = qp.recv_queue().unwrap();
        let mut recvs: Vec<_> = (0..32u64)
            .map(|i| {
                rq.prepare(RecvRequest::new(pd.alloc(64, local()).unwrap()).wr_id(i))
                    .unwrap()
            })
            .collect();
        let poster = std::thread::spawn(move || {
            let mut accepted = 0;
            for r in &mut recvs {
                match rq.post_prepared(r) {
                    Ok(()) => accepted += 1,
                    Err(e) => assert!(is_in_error(&e), "{e}"),
                }
            }
            (recvs, accepted)
        });
        // Spread the move over the posting loop's run.
        for _ in 0..(round * 500) {
            std::hint::spin_loop();
        }
        qp.to_err().unwrap();
        let (recvs, accepted) = poster.join().unwrap();
        let flushed = wait(&cq, accepted).len();
        assert_eq!(flushed, accepted);
        for r in &recvs {
            assert!(
                !r.is_posted(),
                "round {round}: posting {} never came back",
                r.wr_id()
            );
        }
        assert_quiet(&cq);
    }
}

/// A CQ too small for the queues that would report to it is refused when
/// the queue pair is created: an SRQ's depth counts once per CQ, the QP is
/// destroyed again and nothing stays registered.
#[test]
#[ignore = "needs an RDMA device"]
fn soundness_q_undersized_cq_behind_an_srq_is_refused() {
    let dev = device();
    let pd = dev.ctx.alloc_pd().unwrap();
    let srq = pd.create_srq(64).build().unwrap();
    let send_cq = dev.ctx.create_cq(256).build().unwrap();
    let small = dev.ctx.create_cq(8).build().unwrap();
    assert!(small.capacity() < 64, "test premise");
    let err = pd
        .create_qp(QpType::Rc, &send_cq, &small)
        .max_send_wr(8)
        .srq(&srq)
        .build()
        .unwrap_err();
    match err {
        Error::CqTooSmall {
            capacity, needed, ..
        } => {
            assert_eq!(capacity, small.capacity());
            // The depth asked of the SRQ (the device may grant more).
            assert_eq!(needed, 64);
        }
        e => panic!("expected CqTooSmall, got {e}"),
    }
    // Nothing stayed registered: the send CQ still takes its whole size.
    let whole = pd
        .create_qp(QpType::Rc, &send_cq, &send_cq)
        .max_send_wr(8)
        .max_recv_wr(8)
        .build()
        .unwrap();
    let used = whole.caps().max_send_wr + whole.caps().max_recv_wr;
    drop(whole);
    assert!(used <= send_cq.capacity());

    // Sized for the SRQ once and two send queues: two QPs share it.
    let big = dev.ctx.create_cq(srq.capacity() + 64).build().unwrap();
    let qps: Vec<QueuePair> = (0..2)
        .map(|_| {
            pd.create_qp(QpType::Rc, &big, &big)
                .max_send_wr(8)
                .srq(&srq)
                .build()
                .unwrap()
        })
        .collect();
    let sends: u32 = qps.iter().map(|q| q.caps().max_send_wr).sum();
    assert!(sends + srq.capacity() <= big.capacity(), "test premise");
    // A send CQ too small for one send queue is refused too.
    let tiny = dev.ctx.create_cq(1).build().unwrap();
    let err = pd
        .create_qp(QpType::Rc, &tiny, &send_cq)
        .max_send_wr(tiny.capacity() + 1)
        .max_recv_wr(1)
        .build()
        .unwrap_err();
    assert!(matches!(err, Error::CqTooSmall { .. }), "{err}");
    // The SRQ still works with its two QPs.
    srq.recv_queue()
        .unwrap()
        .recv(pd.alloc(64, local()).unwrap(), 0)
        .unwrap();
    assert_eq!(srq.outstanding(), 1);
}

/// `n` signaled 8-byte RDMA writes through `sq`, request `i` writing
/// `i + 1` into word `i` of `target` (wr_id `i`): what gets refused comes
/// back with its error, the rest is posted.
fn post_writes(
    pd: &rdma_verbs::ProtectionDomain,
    sq: &mut SendQueue,
    target: &rdma_verbs::RemoteMemory,
    n: u32,
) -> Result<(), Error> {
    for i in 0..n {
        let mut buf = pd.alloc(8, local()).unwrap();
        buf.copy_from_slice(&(u64::from(i) + 1).to_le_bytes());
        let word = target.slice(u64::from(i) * 8, 8).unwrap();
        if let Err(e) = sq.write(buf, word, Wr::id(u64::from(i))) {
            assert!(e.buf.into_local().is_some(), "the refused buffer came back");
            return Err(e.error);
        }
    }
    Ok(())
}

/// Waits until word `n - 1` of `target` holds `n` (the last of
/// [`post_writes`] landed), then a while longer for the acknowledgements:
/// every write's completion is then queued in the sender's CQ, unpolled.
fn landed(target: &rdma_verbs::SharedBuffer, n: u32) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut word = [0u64; 1];
        target.read_into((n as usize - 1) * 8, &mut word).unwrap();
        if word[0] == u64::from(n) {
            break;
        }
        assert!(Instant::now() < deadline, "the writes never landed");
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(300));
}

/// Polls `cq` until a poll returns nothing: every completion must be an
/// orphan (a discarded or destroyed queue's). Returns how many.
fn poll_empty_of_orphans(cq: &rdma_verbs::CompletionQueue) -> usize {
    let mut batch = Completions::with_capacity(16);
    let mut orphans = 0;
    loop {
        let polled = cq.poll(&mut batch).unwrap();
        if polled.is_empty() {
            break;
        }
        for c in polled {
            assert!(c.is_orphan(), "a discarded request matched a slot: {c:?}");
            orphans += 1;
        }
    }
    orphans
}

/// Collects `n` completions of `cq` that hand back a buffer (orphans are
/// skipped and counted), within 10 s: a completion lost to an overrun CQ
/// fails the test.
fn buffers_back(cq: &rdma_verbs::CompletionQueue, n: u32) -> usize {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut batch = Completions::with_capacity(16);
    let (mut back, mut orphans) = (0, 0);
    while back < n {
        assert!(
            Instant::now() < deadline,
            "{back} of {n} buffers came back ({orphans} orphans): the CQ overran"
        );
        for mut c in cq.poll(&mut batch).unwrap() {
            if c.is_orphan() {
                orphans += 1;
                continue;
            }
            c.result().unwrap();
            assert!(c.take_local().is_some(), "{c:?}");
            back += 1;
        }
    }
    orphans
}

/// A sender whose send queue alone fills its CQ (`depth` = the CQ's
/// capacity), connected to a receiver, and a target region on the
/// receiver's side (`depth` words).
struct Filled {
    dev: common::TestDevice,
    pd: rdma_verbs::ProtectionDomain,
    cq: rdma_verbs::CompletionQueue,
    depth: u32,
    b: QueuePair,
    target: rdma_verbs::SharedBuffer,
    remote: rdma_verbs::RemoteMemory,
}

fn filled_cq() -> (Filled, QueuePair) {
    let dev = device();
    let pd = dev.ctx.alloc_pd().unwrap();
    let cq = dev.ctx.create_cq(16).build().unwrap();
    let depth = cq.capacity();
    let a = sender(&pd, &cq, depth, &dev);
    let cq_b = dev.ctx.create_cq(128).build().unwrap();
    let b = pd.create_qp(QpType::Rc, &cq_b, &cq_b).build().unwrap();
    connect_pair(&dev, &a, &b, remote_all());
    let target = pd.alloc_shared(depth as usize * 8, remote_all()).unwrap();
    let remote = target.remote().unwrap();
    let f = Filled {
        dev,
        pd,
        cq,
        depth,
        b,
        target,
        remote,
    };
    (f, a)
}

/// An RC queue pair whose `depth`-deep send queue reports to `cq` (its
/// receive queue to a CQ of its own).
fn sender(
    pd: &rdma_verbs::ProtectionDomain,
    cq: &rdma_verbs::CompletionQueue,
    depth: u32,
    dev: &common::TestDevice,
) -> QueuePair {
    let rx = dev.ctx.create_cq(4).build().unwrap();
    pd.create_qp(QpType::Rc, cq, &rx)
        .max_send_wr(depth)
        .max_recv_wr(1)
        .build()
        .unwrap()
}

impl Filled {
    /// Fills the CQ with `depth` completions of writes posted through
    /// `sq`, unpolled.
    fn fill(&self, sq: &mut SendQueue) {
        post_writes(&self.pd, sq, &self.remote, self.depth).unwrap();
        landed(&self.target, self.depth);
    }

    /// Zeroes the target and reconnects `a` to the receiver (both reset;
    /// `a`'s handles must be gone).
    fn reconnect(&mut self, a: &QueuePair) {
        self.target
            .copy_from_slice(0, &vec![0; self.depth as usize * 8])
            .unwrap();
        self.b.reset().unwrap();
        connect_pair(&self.dev, a, &self.b, remote_all());
    }
}

/// A move to RESET with completed requests' completions still queued
/// (issue #35, finding 1). The reset released every slot of the send
/// queue while the `depth` completions stayed in the CQ, so `depth` new
/// requests overran it: rxe dropped what did not fit, those buffers never
/// came back and their slots jammed the queue. Now the queue holds a slot
/// per discarded request (`QueueHeldAfterReset`, the request handed back)
/// until a poll finds the CQ empty.
#[test]
#[ignore = "needs an RDMA device"]
fn soundness_q_reset_with_completions_queued_cannot_overrun_the_cq() {
    let (mut f, a) = filled_cq();
    let mut sq = a.send_queue().unwrap();
    f.fill(&mut sq);
    // A RESET is refused while the send queue's handle lives: dropped
    // first, taken again once the queue pair is reconnected.
    assert!(
        matches!(a.reset(), Err(Error::HandleLive { .. })),
        "reset with a live send handle"
    );
    drop(sq);
    a.reset().unwrap();
    f.reconnect(&a);
    assert_eq!(a.send_outstanding(), 0, "the reset released every request");
    let mut sq = a.send_queue().unwrap();
    let first = post_writes(&f.pd, &mut sq, &f.remote, f.depth);
    if let Err(e) = &first {
        assert!(
            matches!(e, Error::QueueHeldAfterReset { held, depth, .. }
                if (*held, *depth) == (f.depth, f.depth)),
            "{e}"
        );
        // Polled empty: the stale completions are orphans, then paid.
        let orphans = poll_empty_of_orphans(&f.cq);
        assert!(orphans <= f.depth as usize, "{orphans} orphans");
        post_writes(&f.pd, &mut sq, &f.remote, f.depth).unwrap();
    }
    // Accepted at once, the writes would overrun the CQ here.
    buffers_back(&f.cq, f.depth);
    assert!(
        first.is_err(),
        "the first write after the reset was accepted"
    );
    // Nothing jammed: the whole queue again.
    assert_eq!(a.send_outstanding(), 0);
    post_writes(&f.pd, &mut sq, &f.remote, f.depth).unwrap();
    assert_eq!(buffers_back(&f.cq, f.depth), 0);
    assert_quiet(&f.cq);
}

/// The same with the queue pair destroyed: its depth left the CQ's
/// accounting while its completions stayed queued, so a new queue pair of
/// the same depth was admitted and overran the CQ. Now the destroyed
/// queue's outstanding requests are charged to the CQ (`CqTooSmall` with
/// `owed`) until a poll finds it empty.
#[test]
#[ignore = "needs an RDMA device"]
fn soundness_q_destroy_with_completions_queued_cannot_overrun_the_cq() {
    let (mut f, a) = filled_cq();
    let mut sq = a.send_queue().unwrap();
    f.fill(&mut sq);
    // The handle keeps the queue pair alive: both go.
    drop(sq);
    drop(a);
    let depth = f.depth;
    let rx = f.dev.ctx.create_cq(4).build().unwrap();
    let admitted =
        f.pd.create_qp(QpType::Rc, &f.cq, &rx)
            .max_send_wr(depth)
            .max_recv_wr(1)
            .build()
            .map(drop);
    match &admitted {
        Err(Error::CqTooSmall {
            capacity,
            needed,
            owed,
        }) => {
            assert_eq!(*capacity, depth);
            assert_eq!((*owed, *needed), (u64::from(depth), 2 * u64::from(depth)));
            let orphans = poll_empty_of_orphans(&f.cq);
            assert!(orphans <= depth as usize, "{orphans} orphans");
        }
        Err(e) => panic!("expected CqTooSmall, got {e}"),
        Ok(()) => {}
    }
    let a = sender(&f.pd, &f.cq, depth, &f.dev);
    f.reconnect(&a);
    let mut sq = a.send_queue().unwrap();
    post_writes(&f.pd, &mut sq, &f.remote, depth).unwrap();
    // Admitted at once, this queue pair's writes would overrun the CQ.
    buffers_back(&f.cq, depth);
    assert!(
        admitted.is_err(),
        "a queue pair was admitted against the debt"
    );
    assert_quiet(&f.cq);
}

/// `resize` under a destroyed queue's debt: shrinking below what it may
/// have left queued is refused (`CqResizeTooSmall` with `owed`), growing
/// is not, and a queue pair admitted against the grown CQ gets every
/// buffer back beside the stale completions. Once polled empty, the CQ
/// shrinks to what its queues need.
#[test]
#[ignore = "needs an RDMA device"]
fn soundness_q_resize_under_the_debt_of_a_destroyed_queue() {
    let (mut f, a) = filled_cq();
    let mut sq = a.send_queue().unwrap();
    f.fill(&mut sq);
    // The handle keeps the queue pair alive: both go.
    drop(sq);
    drop(a);
    let depth = f.depth;
    match f.cq.resize(depth - 1) {
        Err(Error::CqResizeTooSmall {
            registered, owed, ..
        }) => assert_eq!((registered, owed), (u64::from(depth), u64::from(depth))),
        other => panic!("expected CqResizeTooSmall, got {other:?}"),
    }
    let grown = f.cq.resize(2 * depth + 1).unwrap();
    assert!(grown > 2 * depth);
    let a = sender(&f.pd, &f.cq, depth, &f.dev);
    f.reconnect(&a);
    let mut sq = a.send_queue().unwrap();
    post_writes(&f.pd, &mut sq, &f.remote, depth).unwrap();
    // The stale completions come first, then every new buffer.
    let orphans = buffers_back(&f.cq, depth);
    assert!(orphans <= depth as usize, "{orphans} orphans");
    assert_eq!(poll_empty_of_orphans(&f.cq), 0);
    // Paid: the CQ shrinks to the send queue's depth (rxe rounds up).
    let shrunk = f.cq.resize(depth).unwrap();
    assert!(shrunk >= depth && shrunk < grown, "{shrunk}");
}
