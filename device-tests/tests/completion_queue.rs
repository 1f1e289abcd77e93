//! Completion queues and channels (device tests, mostly without traffic;
//! traffic and wake-ups are in the queue pair tests), and many queue pairs
//! sharing one CQ.

mod common;

use std::os::fd::AsRawFd;

use std::time::{Duration, Instant};

use common::{pair, pattern, remote_all};
use rdma_verbs::{
    cq::WorkCompletion, memory::SgList, AccessFlags, Completion, CompletionQueue, Completions,
    Error, LocalBuffer, QpType, QueuePair, RemoteMemory, SendRequest, WcOpcode, Wr,
};

/// Polls one completion with `poll_one`: its entry into `wc`, its buffers
/// returned.
fn poll_into_ok(cq: &rdma_verbs::CompletionQueue, wc: &mut WorkCompletion) -> SgList {
    let mut c = common::poll_until(|| cq.poll_one().unwrap());
    *wc = *c.wc();
    assert!(wc.is_success(), "{:?}", wc.status());
    c.take_buffers()
}

#[test]
#[ignore = "needs an RDMA device"]
fn poll_one_gives_the_callers_wr_id_and_the_buffers_back() {
    let p = pair(QpType::Rc, remote_all(), |b| b);
    let source =
        p.pd.register(
            pattern(512, 5),
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ,
        )
        .unwrap();
    let remote = source.memory_region().remote().unwrap();
    let mut wc = WorkCompletion::default();
    // An owned-buffer request: the buffer comes back with the entry.
    let dst = p.pd.alloc(128, AccessFlags::LOCAL_WRITE).unwrap();
    let mut sq = p.a.send_queue().unwrap();
    sq.read(dst, remote.slice(64, 128).unwrap(), Wr::id(77))
        .unwrap();
    let back = match poll_into_ok(&p.cq_a, &mut wc) {
        SgList::One(b) => b.into_local().unwrap(),
        other => panic!("buffer not given back: {other:?}"),
    };
    assert_eq!((wc.wr_id(), wc.opcode()), (77, WcOpcode::RdmaRead));
    assert_eq!(&back[..], &pattern(512, 5)[64..192]);
    // A prepared posting: no buffers, its count taken back.
    let mut read = sq
        .prepare(SendRequest::read(back, remote.slice(0, 128).unwrap()).wr_id(78))
        .unwrap();
    for _ in 0..3 {
        sq.post_prepared(&mut read).unwrap();
        assert!(matches!(poll_into_ok(&p.cq_a, &mut wc), SgList::Empty));
        assert_eq!(wc.wr_id(), 78);
        assert!(!read.is_posted(), "the completion kept a count");
        assert_eq!(read.bytes(0).unwrap(), &pattern(512, 5)[..128]);
    }
    assert!(p.cq_a.poll_one().unwrap().is_none());
}

#[test]
#[ignore = "needs an RDMA device"]
fn create_poll_empty_and_arm() {
    let t = common::device();
    let cq = t.ctx.create_cq(100).build().unwrap();
    assert!(cq.capacity() >= 100);
    let mut out = Completions::with_capacity(8);
    assert_eq!(cq.poll(&mut out).unwrap().len(), 0);
    let mut raw = [rdma_verbs::cq::WorkCompletion::default(); 4];
    // SAFETY: no queue pair reports to `cq`.
    assert_eq!(unsafe { cq.poll_raw(&mut raw) }.unwrap(), 0);
    assert!(cq.poll_one().unwrap().is_none());
    cq.req_notify(false).unwrap();
    cq.req_notify(true).unwrap();
}

#[test]
#[ignore = "needs an RDMA device"]
fn oversized_cq_is_an_error_naming_the_verb() {
    let t = common::device();
    let max = t.ctx.query_device().unwrap().max_cqe();
    let err = t.ctx.create_cq(max.saturating_add(1)).build().unwrap_err();
    assert_eq!(err.verb(), Some("ibv_create_cq"), "{err}");
}

#[test]
#[ignore = "needs an RDMA device"]
fn channel_fd_and_nonblocking_get_event() {
    let t = common::device();
    let ch = t.ctx.create_comp_channel().unwrap();
    assert!(ch.as_raw_fd() >= 0);
    let cq = t.ctx.create_cq(256).channel(&ch).build().unwrap();
    assert!(cq.channel().is_some());
    cq.req_notify(false).unwrap();
    ch.set_nonblocking(true).unwrap();
    let err = ch.get_event().unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc_eagain()), "{err}");
    // Dropping the channel handle before the CQ is fine: the CQ keeps it.
    drop(ch);
    drop(cq);
}

fn libc_eagain() -> i32 {
    11
}

/// Queue pairs in [`many_queue_pairs_share_one_cq`].
const MANY: usize = 300;
/// Bytes each of them writes.
const LEN: usize = 64;

/// Queue pair `i`'s bytes: its number, then a pattern.
fn marked(i: usize) -> Vec<u8> {
    let mut v = pattern(LEN, i as u8);
    v[..2].copy_from_slice(&(i as u16).to_le_bytes());
    v
}

/// Posts queue pair `i`'s write of `buf` into its slice of `remote`,
/// `wr_id` = round << 32 | i.
fn post_write(qp: &QueuePair, i: usize, buf: LocalBuffer, remote: &RemoteMemory, round: u64) {
    let dst = remote.slice((i * LEN) as u64, LEN as u64).unwrap();
    qp.send_queue()
        .unwrap()
        .write(buf, dst, Wr::id(round << 32 | i as u64))
        .unwrap();
}

/// The queue pair and buffer of a completion of `round`: its own buffer,
/// checked by content.
fn take_back(c: &mut Completion, round: u64) -> (usize, LocalBuffer) {
    c.result().unwrap_or_else(|e| panic!("{e}: {c:?}"));
    assert!(!c.is_orphan(), "{c:?}");
    assert_eq!(c.wr_id() >> 32, round, "{c:?}");
    let i = (c.wr_id() & 0xffff_ffff) as usize;
    let buf = c.take_local().unwrap_or_else(|| panic!("no buffer: {c:?}"));
    assert_eq!(
        buf[..],
        marked(i)[..],
        "queue pair {i} got another's buffer"
    );
    (i, buf)
}

/// Polls `cq` until `live` completions that are not orphans arrived, then
/// for a while longer; returns (completions, orphans).
fn collect(cq: &CompletionQueue, live: usize) -> (Vec<Completion>, Vec<Completion>) {
    let (mut got, mut orphans) = (Vec::new(), Vec::new());
    let mut batch = Completions::with_capacity(64);
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut quiet_from = None;
    loop {
        for c in cq.poll(&mut batch).unwrap() {
            let c = c.into_owned();
            if c.is_orphan() {
                orphans.push(c);
            } else {
                got.push(c);
            }
        }
        let now = Instant::now();
        assert!(now < deadline, "{} of {live} completions", got.len());
        if got.len() >= live {
            let since = *quiet_from.get_or_insert(now);
            if now - since > Duration::from_millis(100) {
                return (got, orphans);
            }
        }
    }
}

#[test]
#[ignore = "needs an RDMA device"]
fn many_queue_pairs_share_one_cq() {
    // The CQ finds each completion's table by id among 2 * MANY (every
    // queue pair's send and receive queue): each completion hands back its
    // own queue pair's buffer, before and after half of them are destroyed;
    // a destroyed queue pair's completion left in the CQ is an orphan; and
    // the depths of the destroyed ones are free again for new ones.
    let dev = common::device();
    let pd = dev.ctx.alloc_pd().unwrap();
    // Each queue pair asks for 2 sends and 1 receive: 3 CQ entries.
    let cq = dev.ctx.create_cq(3 * MANY as u32).build().unwrap();
    let new_qp = || {
        pd.create_qp(QpType::Rc, &cq, &cq)
            .max_send_wr(2)
            .max_recv_wr(1)
            .build()
    };
    let mut target = pd.alloc_shared(MANY * LEN, remote_all()).unwrap();
    let remote = target.remote().unwrap();
    let mut qps: Vec<Option<QueuePair>> = (0..MANY)
        .map(|_| {
            let qp = new_qp().unwrap();
            common::connect_self(&dev, &qp, remote_all());
            Some(qp)
        })
        .collect();
    let mut bufs: Vec<Option<LocalBuffer>> = (0..MANY)
        .map(|i| Some(pd.register(marked(i), AccessFlags::LOCAL_WRITE).unwrap()))
        .collect();
    let everything: Vec<u8> = (0..MANY).flat_map(marked).collect();

    // Round 1: every queue pair, every buffer back to its owner.
    for (i, qp) in qps.iter().enumerate() {
        post_write(qp.as_ref().unwrap(), i, bufs[i].take().unwrap(), &remote, 1);
    }
    let (mut got, orphans) = collect(&cq, MANY);
    assert!(orphans.is_empty(), "{orphans:?}");
    assert_eq!(got.len(), MANY);
    for c in &mut got {
        let (i, buf) = take_back(c, 1);
        assert!(bufs[i].replace(buf).is_none(), "queue pair {i} twice");
    }
    assert!(target.to_vec() == everything, "the writes landed");

    // Round 2: post on all, let every write complete into the CQ unpolled,
    // then destroy the odd ones.
    target.copy_from_slice(0, &vec![0; MANY * LEN]).unwrap();
    for (i, qp) in qps.iter().enumerate() {
        post_write(qp.as_ref().unwrap(), i, bufs[i].take().unwrap(), &remote, 2);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while target.to_vec() != everything {
        assert!(Instant::now() < deadline, "round 2's writes did not land");
        std::thread::sleep(Duration::from_millis(10));
    }
    // The writes landed; their acknowledgements follow at once.
    std::thread::sleep(Duration::from_millis(200));
    for qp in qps.iter_mut().skip(1).step_by(2) {
        assert!(qp.take().unwrap().close().unwrap());
    }
    let live = MANY.div_ceil(2);
    let (mut got, orphans) = collect(&cq, live);
    assert_eq!(got.len(), live);
    for c in &mut got {
        let (i, buf) = take_back(c, 2);
        assert!(
            i % 2 == 0,
            "a destroyed queue pair's completion matched: {i}"
        );
        assert!(bufs[i].replace(buf).is_none(), "queue pair {i} twice");
    }
    // rxe leaves a destroyed queue pair's entries in the CQ (as in
    // errors.rs's stale-completion test): one per destroyed queue pair,
    // each an orphan with no buffers and the library's tag as its wr_id.
    assert_eq!(orphans.len(), MANY - live, "{orphans:?}");
    for mut c in orphans {
        assert!(c.wr_id() >> 63 == 1, "not the library's tag: {c:?}");
        assert!(matches!(c.take_buffers(), SgList::Empty), "{c:?}");
    }

    // Round 3: the survivors, found after the removals.
    for (i, qp) in qps.iter().enumerate().step_by(2) {
        post_write(qp.as_ref().unwrap(), i, bufs[i].take().unwrap(), &remote, 3);
    }
    let (mut got, orphans) = collect(&cq, live);
    assert!(orphans.is_empty(), "{orphans:?}");
    for c in &mut got {
        let (i, buf) = take_back(c, 3);
        assert!(bufs[i].replace(buf).is_none(), "queue pair {i} twice");
    }
    assert!((0..MANY).step_by(2).all(|i| bufs[i].is_some()));

    // The destroyed queue pairs' depths are free again, and no more.
    let free = cq.capacity() as usize - 3 * live;
    let more: Vec<QueuePair> = (0..free / 3).map(|_| new_qp().unwrap()).collect();
    match new_qp() {
        Err(Error::CqTooSmall {
            capacity, needed, ..
        }) => {
            assert_eq!(capacity, cq.capacity());
            // The send queue's 2 fit when 2 entries were left over, then
            // the receive queue's 1 did not.
            let refused = if free % 3 == 2 { 3 } else { 2 };
            assert_eq!(needed as usize, 3 * (live + more.len()) + refused);
        }
        other => panic!("expected CqTooSmall, got {other:?}"),
    }
    drop(more);
    drop(qps);
}
