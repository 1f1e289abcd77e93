//! Request tables and send streams on a real device (SoftRoCE in the VM).

mod common;

use std::time::{Duration, Instant};

use rdma_verbs::{
    memory::{RemoteKey, SgList},
    AccessFlags, LocalBuffer, QpType, QueuePair, RecvQueue, RecvRequest, RemoteMemory, SendQueue,
    SendRequest, WcStatus, Wr,
};
use rdma_verbs_runtime::{Reaped, RequestTable, SendStream};

/// What a test's value says of its request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Write { block: usize, seq: usize },
    Read { block: usize, seq: usize },
    Recv { qp: usize, seq: usize },
}

impl Op {
    fn seq(self) -> usize {
        match self {
            Op::Write { seq, .. } | Op::Read { seq, .. } | Op::Recv { seq, .. } => seq,
        }
    }
}

const QPS: usize = 4;
const DEPTH: u32 = 16;
const BLOCKS: usize = 64;
const BLOCK: usize = 512;

fn block_bytes(block: usize, round: u8) -> Vec<u8> {
    common::pattern(BLOCK, (block as u8).wrapping_mul(7) ^ round)
}

/// Polls `table` until it yields something (10 s at most).
fn next<T>(table: &mut RequestTable<T>) -> Reaped<T> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(p) = table.poll().expect("poll") {
            return p;
        }
        assert!(Instant::now() < deadline, "nothing completed ({table:?})");
    }
}

/// Posts `(request(buffers), value)` through `sq`, polling the table
/// while it is full (the refusal hands the buffers and the value back;
/// `request` builds the request again from the buffers); every value
/// polled meanwhile goes to `done`.
fn post_send_polling<'a>(
    table: &mut RequestTable<Op>,
    sq: &mut SendQueue,
    mut buffers: SgList,
    request: impl Fn(SgList) -> SendRequest<'a>,
    mut value: Op,
    max_seen: &mut u32,
    done: &mut impl FnMut(Reaped<Op>),
) {
    loop {
        match table.post_send(sq, request(buffers), value) {
            Ok(()) => {
                *max_seen = (*max_seen).max(table.len());
                return;
            }
            Err(e) => {
                assert!(
                    matches!(
                        e.error,
                        rdma_verbs_runtime::Error::RequestTableFull { capacity: DEPTH }
                    ),
                    "{e}"
                );
                assert_eq!(table.len(), DEPTH);
                (buffers, value) = (e.buffers, e.value);
                done(next(table));
            }
        }
    }
}

/// The one local buffer of a request handed back.
fn local(buffers: SgList) -> LocalBuffer {
    buffers
        .into_local()
        .expect("the request's buffer came back")
}

#[test]
#[ignore = "needs an RDMA device"]
fn request_table_many_qps_share_one_cq_and_one_table_at_depth_16() {
    let dev = common::device();
    let pd = dev.ctx.alloc_pd().unwrap();
    let cq = dev.ctx.create_cq(256).build().unwrap();
    let peer_cq = dev.ctx.create_cq(256).build().unwrap();
    let qps: Vec<QueuePair> = (0..QPS)
        .map(|_| {
            pd.create_qp(QpType::Rc, &cq, &cq)
                .max_send_wr(DEPTH)
                .max_recv_wr(2)
                .build()
                .unwrap()
        })
        .collect();
    let peers: Vec<QueuePair> = (0..QPS)
        .map(|_| {
            pd.create_qp(QpType::Rc, &peer_cq, &peer_cq)
                .max_send_wr(4)
                .max_recv_wr(2)
                .build()
                .unwrap()
        })
        .collect();
    for (qp, peer) in qps.iter().zip(&peers) {
        common::connect_pair(&dev, qp, peer, common::remote_all());
    }
    let mut sqs: Vec<SendQueue> = qps.iter().map(|qp| qp.send_queue().unwrap()).collect();
    let mut rqs: Vec<RecvQueue> = qps.iter().map(|qp| qp.recv_queue().unwrap()).collect();
    let mut peer_sqs: Vec<SendQueue> = peers.iter().map(|qp| qp.send_queue().unwrap()).collect();
    let store = pd
        .alloc_shared(BLOCKS * BLOCK, common::remote_all())
        .unwrap();
    let remote = store.remote().unwrap();
    let block_at = |b: usize| remote.slice((b * BLOCK) as u64, BLOCK as u64).unwrap();

    let mut table = RequestTable::<Op>::new(&cq, DEPTH);
    assert_eq!((table.capacity(), table.len()), (DEPTH, 0));
    let mut seen = vec![0u32; 4 * BLOCKS];
    let mut seq = 0;

    // A queue whose completions go elsewhere is refused, request and value back.
    let buf = pd.alloc(64, AccessFlags::LOCAL_WRITE).unwrap();
    let e = table
        .post_recv(
            &mut peers[0].recv_queue().unwrap(),
            RecvRequest::new(buf),
            Op::Recv { qp: 0, seq: 9999 },
        )
        .unwrap_err();
    assert!(
        matches!(
            e.error,
            rdma_verbs_runtime::Error::CompletionQueueMismatch {
                queue: "receive queue"
            }
        ),
        "{e}"
    );
    assert_eq!(e.value, Op::Recv { qp: 0, seq: 9999 });
    assert_eq!(
        e.buffers.into_local().map(|b| b.len()),
        Some(64),
        "the buffer came back"
    );
    assert!(table.is_empty());

    // Receives through the table on every queue pair; the peers send.
    for (i, rq) in rqs.iter_mut().enumerate() {
        let buf = pd.alloc(64, AccessFlags::LOCAL_WRITE).unwrap();
        table
            .post_recv(rq, RecvRequest::new(buf), Op::Recv { qp: i, seq })
            .unwrap();
        seq += 1;
        let msg = pd.alloc_frozen_pattern(i);
        peer_sqs[i].send(msg, Wr::id(0)).unwrap();
    }
    let mut got = 0;
    while got < QPS {
        match next(&mut table) {
            Reaped::Done(op @ Op::Recv { qp, seq }, mut c) => {
                c.result().unwrap();
                assert_eq!(c.byte_len(), 64);
                let buf = c.take_local().expect("receive buffer back");
                assert_eq!(&buf[..], &common::pattern(64, qp as u8)[..], "{op:?}");
                seen[seq] += 1;
                got += 1;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    common::wait(&peer_cq, QPS);

    // Writes of every block, then reads of every block, spread over the
    // queue pairs, 16 outstanding at most.
    let mut max_seen = 0;
    let check = |p: Reaped<Op>, seen: &mut Vec<u32>| match p {
        Reaped::Done(op, mut c) => {
            c.result().unwrap_or_else(|e| panic!("{op:?}: {e}"));
            let buf = c.take_local().expect("buffer back");
            if let Op::Read { block, .. } = op {
                assert_eq!(&buf[..], &block_bytes(block, 1)[..], "{op:?}");
            }
            seen[op.seq()] += 1;
        }
        other => panic!("unexpected {other:?}"),
    };
    for phase in 0..2 {
        for block in 0..BLOCKS {
            let mut buf = pd.alloc(BLOCK, AccessFlags::LOCAL_WRITE).unwrap();
            let sq = &mut sqs[(block + phase) % QPS];
            let remote = block_at(block);
            let value = if phase == 0 {
                buf.copy_from_slice(&block_bytes(block, 1));
                Op::Write { block, seq }
            } else {
                Op::Read { block, seq }
            };
            let request = |b| match value {
                Op::Write { .. } => SendRequest::write(local(b), remote),
                _ => SendRequest::read(local(b), remote),
            };
            seq += 1;
            post_send_polling(
                &mut table,
                sq,
                SgList::One(buf.into()),
                request,
                value,
                &mut max_seen,
                &mut |p| check(p, &mut seen),
            );
        }
        // Every write has landed before a read of its block is posted.
        while !table.is_empty() {
            check(next(&mut table), &mut seen);
        }
        if phase == 0 {
            let mut bytes = vec![0u8; BLOCKS * BLOCK];
            store.read_into(0, &mut bytes).unwrap();
            for block in 0..BLOCKS {
                assert_eq!(
                    &bytes[block * BLOCK..(block + 1) * BLOCK],
                    &block_bytes(block, 1)[..],
                    "block {block} in the store"
                );
            }
        }
    }
    assert_eq!(max_seen, DEPTH, "the table ran full");
    assert!(
        seen[..seq].iter().all(|&n| n == 1),
        "each value back exactly once: {:?}",
        seen[..seq]
            .iter()
            .enumerate()
            .filter(|(_, &n)| n != 1)
            .collect::<Vec<_>>()
    );
    common::assert_quiet(&cq);
    assert!(table.poll().unwrap().is_none());
}

/// A protection domain's frozen 64-byte pattern (test helper).
trait FrozenPattern {
    fn alloc_frozen_pattern(&self, seed: usize) -> rdma_verbs::memory::FrozenBuffer;
}

impl FrozenPattern for rdma_verbs::ProtectionDomain {
    fn alloc_frozen_pattern(&self, seed: usize) -> rdma_verbs::memory::FrozenBuffer {
        let mut b = self.alloc(64, AccessFlags::LOCAL_WRITE).unwrap();
        b.copy_from_slice(&common::pattern(64, seed as u8));
        b.freeze()
    }
}

/// `remote` with a key the peer never gave: the write fails remotely.
fn bad_key(remote: RemoteMemory) -> RemoteMemory {
    RemoteMemory {
        rkey: RemoteKey(remote.rkey.0 ^ 0x5a5a_0000),
        ..remote
    }
}

#[test]
#[ignore = "needs an RDMA device"]
fn request_table_error_completions_give_back_values_and_buffers() {
    let p = common::pair(QpType::Rc, common::remote_all(), |b| {
        b.max_send_wr(DEPTH).max_recv_wr(4)
    });
    let target = p.pd.alloc_shared(4096, common::remote_all()).unwrap();
    let remote = target.remote().unwrap();
    let mut table = RequestTable::<&'static str>::new(&p.cq_a, DEPTH);
    let (mut sq, mut rq) = (p.a.send_queue().unwrap(), p.a.recv_queue().unwrap());
    let buf = |n| p.pd.alloc(n, AccessFlags::LOCAL_WRITE).unwrap();
    table
        .post_recv(&mut rq, RecvRequest::new(buf(128)), "receive")
        .unwrap();
    table
        .post_send(
            &mut sq,
            SendRequest::write(buf(64), bad_key(remote)),
            "bad write",
        )
        .unwrap();
    for name in ["after 1", "after 2", "after 3"] {
        table
            .post_send(&mut sq, SendRequest::write(buf(64), remote), name)
            .unwrap();
    }
    let mut back = Vec::new();
    while back.len() < 5 {
        match next(&mut table) {
            Reaped::Done(name, mut c) => {
                let buffer = c.take_local().map(|b| b.len());
                back.push((name, c.status(), buffer));
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    back.sort_by_key(|b| b.0);
    assert_eq!(back[0].0, "after 1");
    for (name, status, len) in &back {
        let want = match *name {
            "bad write" => WcStatus::RemAccessErr,
            _ => WcStatus::WrFlushErr,
        };
        assert_eq!(*status, want, "{name}");
        let want_len = if *name == "receive" { 128 } else { 64 };
        assert_eq!(*len, Some(want_len), "{name}: its buffer came back");
    }
    assert!(table.is_empty());
    assert!(table.poll().unwrap().is_none());
}

/// Posts `(request(buffers), value)` on `stream`, polling the table while
/// it is full (the refusal hands the buffers and the value back; `request`
/// builds the request again from the buffers); every value polled goes to
/// `done`. Any other refusal fails.
fn post_stream_polling<'a>(
    table: &mut RequestTable<usize>,
    stream: &mut SendStream,
    mut buffers: SgList,
    request: impl Fn(SgList) -> SendRequest<'a>,
    mut value: usize,
    done: &mut impl FnMut(Reaped<usize>),
) {
    loop {
        match table.post_stream(stream, request(buffers), value) {
            Ok(()) => return,
            Err(e) => {
                assert!(
                    matches!(e.error, rdma_verbs_runtime::Error::RequestTableFull { .. }),
                    "{e}"
                );
                (buffers, value) = (e.buffers, e.value);
                done(next(table));
            }
        }
    }
}

#[test]
#[ignore = "needs an RDMA device"]
fn request_table_stream_of_10000_inline_writes_signals_every_8th() {
    const WRITES: usize = 10_000;
    const EVERY: u32 = 8;
    const SLOTS: usize = 64;
    let p = common::pair(QpType::Rc, common::remote_all(), |b| {
        b.max_send_wr(DEPTH).max_inline_data(64)
    });
    let target = p.pd.alloc_shared(SLOTS * 8, common::remote_all()).unwrap();
    let remote = target.remote().unwrap();
    let mut table = RequestTable::<usize>::new(&p.cq_a, 64);
    let mut stream = table.send_stream(p.a.send_queue().unwrap(), EVERY).unwrap();
    assert_eq!(stream.every(), EVERY);
    let mut seen = vec![0u8; WRITES];
    let (mut done, mut covered) = (0usize, 0usize);
    let mut count = |polled: Reaped<usize>| match polled {
        Reaped::Done(i, mut c) => {
            c.result().unwrap_or_else(|e| panic!("write {i}: {e}"));
            if i % 1000 == 999 {
                let b = c
                    .take_local()
                    .expect("a local buffer is signaled and comes back");
                assert_eq!(&b[..], &(i as u64).to_le_bytes());
            }
            seen[i] += 1;
            done += 1;
        }
        Reaped::Covered(i) => {
            seen[i] += 1;
            covered += 1;
        }
        Reaped::Foreign(c) => panic!("foreign {c:?}"),
    };
    for i in 0..WRITES {
        let data = (i as u64).to_le_bytes();
        let slot = remote.slice((i % SLOTS * 8) as u64, 8).unwrap();
        if i + 1 == WRITES {
            stream.signal_next();
        }
        // Every 1000th carries a buffer of its own: the stream signals it.
        if i % 1000 == 999 {
            let mut b = p.pd.alloc(8, AccessFlags::LOCAL_WRITE).unwrap();
            b.copy_from_slice(&data);
            let request = |b| SendRequest::write(local(b), slot);
            post_stream_polling(
                &mut table,
                &mut stream,
                SgList::One(b.into()),
                request,
                i,
                &mut count,
            );
        } else {
            let request = |b: SgList| {
                assert!(matches!(b, SgList::Empty), "inline data has no buffer");
                SendRequest::write_inline(&data, slot)
            };
            post_stream_polling(
                &mut table,
                &mut stream,
                SgList::Empty,
                request,
                i,
                &mut count,
            );
        }
        assert!(p.a.send_outstanding() <= DEPTH);
        while let Some(polled) = table.poll().unwrap() {
            count(polled);
        }
    }
    assert_eq!(stream.uncovered(), 0);
    while !table.is_empty() {
        count(next(&mut table));
    }
    assert!(seen.iter().all(|&n| n == 1), "every value back once");
    assert_eq!(done + covered, WRITES);
    println!("{WRITES} writes, every {EVERY}th signaled: {done} completions, {covered} covered");
    // WRITES / EVERY = 1250 completions (the 10 requests with a buffer of
    // their own fall on every 8th; at worst they add one each).
    assert!(
        done <= WRITES / EVERY as usize + WRITES / 1000,
        "{done} completions for {WRITES} writes"
    );
    common::assert_quiet(&p.cq_a);
    let mut words = [0u64; SLOTS];
    target.read_into(0, &mut words).unwrap();
    for (s, w) in words.iter().enumerate() {
        let last = s + (WRITES - 1 - s) / SLOTS * SLOTS;
        assert_eq!(*w, last as u64, "slot {s} holds the last write to it");
    }
}

#[test]
#[ignore = "needs an RDMA device"]
fn request_table_failing_unsignaled_stream_write_returns_its_value_with_its_error() {
    let p = common::pair(QpType::Rc, common::remote_all(), |b| {
        b.max_send_wr(DEPTH).max_inline_data(64)
    });
    let target = p.pd.alloc_shared(4096, common::remote_all()).unwrap();
    let remote = target.remote().unwrap();
    let mut table = RequestTable::<usize>::new(&p.cq_a, 32);
    let mut stream = table.send_stream(p.a.send_queue().unwrap(), DEPTH).unwrap();
    // Another table's stream is refused, request and value back.
    let mut other = RequestTable::<usize>::new(&p.cq_a, 1);
    let e = other
        .post_stream(&mut stream, SendRequest::write_inline(b"x", remote), 77)
        .unwrap_err();
    assert!(
        matches!(e.error, rdma_verbs_runtime::Error::StreamOfAnotherTable),
        "{e}"
    );
    assert_eq!(e.value, 77);
    for i in 0..8 {
        let to = if i == 3 { bad_key(remote) } else { remote };
        if i == 7 {
            stream.signal_next();
        }
        table
            .post_stream(&mut stream, SendRequest::write_inline(b"12345678", to), i)
            .unwrap();
    }
    assert_eq!(stream.uncovered(), 0);
    let mut events = Vec::new();
    while events.len() < 8 {
        events.push(match next(&mut table) {
            Reaped::Done(i, c) => (i, Some(c.status())),
            Reaped::Covered(i) => (i, None),
            Reaped::Foreign(c) => panic!("foreign {c:?}"),
        });
    }
    // Before the failure: completed (covered by the last one's completion,
    // which is flushed). The failure: its own error. After it: flushed.
    let flush = Some(WcStatus::WrFlushErr);
    assert_eq!(
        events,
        [
            (3, Some(WcStatus::RemAccessErr)),
            (4, flush),
            (5, flush),
            (6, flush),
            (0, None),
            (1, None),
            (2, None),
            (7, flush),
        ]
    );
    assert!(
        table.is_empty(),
        "the failed request's slot went with its cover"
    );
    assert!(table.poll().unwrap().is_none());
}

#[test]
#[ignore = "needs an RDMA device"]
fn request_table_foreign_completions_are_handed_back_not_attributed() {
    // A plain post on a queue pair sharing the table's CQ, and one that
    // copies the wr_id of a request the table already handed back: both
    // come back as Foreign, buffers included, and no value is touched.
    let p = common::pair(QpType::Rc, common::remote_all(), |b| b.max_send_wr(DEPTH));
    let target = p.pd.alloc_shared(4096, common::remote_all()).unwrap();
    let remote = target.remote().unwrap();
    let mut table = RequestTable::<u32>::new(&p.cq_a, 4);
    let mut sq = p.a.send_queue().unwrap();
    let buf = |n| p.pd.alloc(n, AccessFlags::LOCAL_WRITE).unwrap();
    table
        .post_send(&mut sq, SendRequest::write(buf(8), remote), 1)
        .unwrap();
    let stale = match next(&mut table) {
        Reaped::Done(1, c) => c.wr_id(),
        other => panic!("unexpected {other:?}"),
    };
    // The slot is reused under a new generation, then the old wr_id posted
    // directly, then an unrelated plain post.
    table
        .post_send(&mut sq, SendRequest::write(buf(16), remote), 2)
        .unwrap();
    sq.write(buf(24), remote, Wr::id(stale)).unwrap();
    sq.write(buf(32), remote, Wr::id(5)).unwrap();
    let mut got = Vec::new();
    while got.len() < 3 {
        got.push(match next(&mut table) {
            Reaped::Done(v, mut c) => (Some(v), c.wr_id() == stale, c.take_local().unwrap().len()),
            Reaped::Foreign(mut c) => (None, c.wr_id() == stale, c.take_local().unwrap().len()),
            Reaped::Covered(v) => panic!("covered {v}"),
        });
    }
    assert_eq!(
        got,
        [(Some(2), false, 16), (None, true, 24), (None, false, 32)]
    );
    assert!(table.is_empty());
}

#[test]
#[ignore = "needs an RDMA device"]
fn request_table_wait_sleeps_until_a_completion_or_the_deadline() {
    let dev = common::device();
    let pd = dev.ctx.alloc_pd().unwrap();
    let channel = dev.ctx.create_comp_channel().unwrap();
    let cq = dev.ctx.create_cq(64).channel(&channel).build().unwrap();
    let peer_cq = dev.ctx.create_cq(64).build().unwrap();
    let a = pd
        .create_qp(QpType::Rc, &cq, &cq)
        .max_send_wr(4)
        .max_recv_wr(4)
        .build()
        .unwrap();
    let b = pd
        .create_qp(QpType::Rc, &peer_cq, &peer_cq)
        .max_send_wr(4)
        .max_recv_wr(4)
        .build()
        .unwrap();
    common::connect_pair(&dev, &a, &b, common::remote_all());
    let mut table = RequestTable::<&str>::new(&cq, 4);
    let start = Instant::now();
    assert!(table
        .wait(Some(Duration::from_millis(100)))
        .unwrap()
        .is_none());
    assert!(
        start.elapsed() >= Duration::from_millis(100),
        "returned early"
    );
    let into = pd.alloc(64, AccessFlags::LOCAL_WRITE).unwrap();
    table
        .post_recv(
            &mut a.recv_queue().unwrap(),
            RecvRequest::new(into),
            "receive",
        )
        .unwrap();
    let sender = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        let mut sq = b.send_queue().unwrap();
        sq.send(pd.alloc_frozen_pattern(3), Wr::id(0)).unwrap();
        common::wait_ok(&peer_cq);
    });
    match table.wait(Some(Duration::from_secs(10))).unwrap() {
        Some(Reaped::Done("receive", mut c)) => {
            c.result().unwrap();
            assert_eq!(&c.take_local().unwrap()[..], &common::pattern(64, 3)[..]);
        }
        other => panic!("unexpected {other:?}"),
    }
    sender.join().unwrap();
}
