//! Queue pairs and completion queues used from several threads at once
//! (device tests), and the `Send`/`Sync` promises of the handles.
//!
//! Threads: one (or two, sharing its send queue's handle in a `Mutex`)
//! posting sends on an RC QP, one polling the sender's CQ and handing the
//! buffers back to their sender, one polling the receiver's CQ and
//! re-posting receives (through the receive queue's handle it owns). Every message carries its
//! sender and sequence number; all must arrive in order and every buffer
//! must come home.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crossbeam::channel::{self, RecvTimeoutError};
use rdma_verbs::{
    cq::{CompletionChannel, Polled},
    memory::FrozenBuffer,
    qp::{AddressHandle, SharedReceiveQueue},
    AccessFlags, Completion, CompletionQueue, Completions, Context, LocalBuffer, MemoryRegion,
    ProtectionDomain, QpType, QueuePair, RecvQueue, RecvRequest, SendQueue, SendRequest,
    SharedBuffer, Wr,
};

const MSG: usize = 64;
/// Send buffers per sending thread (the send queue holds 64).
const SEND_BUFS: usize = 16;
/// Receives kept posted (the receive queue holds 64).
const RECV_BUFS: usize = 64;

/// The message `seq` of sender `id`.
fn fill_message(buf: &mut [u8], id: usize, seq: u64) {
    buf[0] = id as u8;
    buf[1..8].fill(0);
    buf[8..16].copy_from_slice(&seq.to_le_bytes());
    buf[16..].copy_from_slice(&common::pattern(MSG - 16, seq as u8 ^ (id as u8 * 101)));
}

/// Sets the shared abort flag when its thread unwinds, so the other
/// threads stop instead of waiting for their deadline.
struct AbortOnPanic<'a>(&'a AtomicBool);

impl Drop for AbortOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.store(true, Ordering::SeqCst);
        }
    }
}

fn check(abort: &AtomicBool, deadline: Instant, what: impl FnOnce() -> String) {
    if abort.load(Ordering::SeqCst) {
        panic!("stopping: another thread failed ({})", what());
    }
    if Instant::now() > deadline {
        panic!("timed out: {}", what());
    }
}

fn join<T>(h: crossbeam::thread::ScopedJoinHandle<'_, T>) -> T {
    h.join().unwrap_or_else(|e| std::panic::resume_unwind(e))
}

/// Polls `cq` once; yields the CPU when it was empty.
fn poll_some<'a>(cq: &CompletionQueue, batch: &'a mut Completions) -> Polled<'a> {
    let polled = cq.poll(batch).expect("ibv_poll_cq");
    if polled.is_empty() {
        std::thread::yield_now();
    }
    polled
}

/// `senders` threads each send `per_sender` messages on one RC QP.
fn run(senders: usize, per_sender: u64) {
    let p = common::pair(QpType::Rc, AccessFlags::LOCAL_WRITE, |b| {
        b.max_send_wr(64).max_recv_wr(RECV_BUFS as u32)
    });
    let total = senders as u64 * per_sender;
    let abort = AtomicBool::new(false);
    let deadline = Instant::now() + Duration::from_secs(120);

    // Each sender's buffers: one registration split into SEND_BUFS pieces.
    let pools: Vec<Vec<LocalBuffer>> = (0..senders)
        .map(|_| {
            let mut rest =
                p.pd.alloc(MSG * SEND_BUFS, AccessFlags::LOCAL_WRITE)
                    .unwrap();
            let mut pool = Vec::new();
            for _ in 0..SEND_BUFS - 1 {
                let (piece, tail) = rest.split_at(MSG);
                pool.push(piece);
                rest = tail;
            }
            pool.push(rest);
            pool
        })
        .collect();
    let (txs, rxs): (Vec<_>, Vec<_>) = (0..senders).map(|_| channel::unbounded()).unzip();
    let mut first_recvs = Vec::new();
    for i in 0..RECV_BUFS.min(total as usize) {
        first_recvs.push(
            RecvRequest::new(p.pd.alloc(MSG, AccessFlags::LOCAL_WRITE).unwrap()).wr_id(i as u64),
        );
    }
    let posted_first = first_recvs.len() as u64;
    let mut rq = p.b.recv_queue().unwrap();
    rq.post_chain(&mut first_recvs).unwrap();
    assert!(first_recvs.is_empty(), "every first receive posted");
    // The send queue's handle, shared by the sending threads.
    let sq = Mutex::new(p.a.send_queue().unwrap());

    let (pools, recvs) = crossbeam::scope(|s| {
        let p = &p;
        let abort = &abort;
        let sq = &sq;
        let senders_h: Vec<_> = pools
            .into_iter()
            .zip(rxs)
            .enumerate()
            .map(|(id, (mut pool, rx))| {
                s.spawn(move |_| {
                    let _guard = AbortOnPanic(abort);
                    // Waits until a returned buffer is in `pool`.
                    let refill = |pool: &mut Vec<LocalBuffer>, what: &dyn Fn() -> String| loop {
                        match rx.recv_timeout(Duration::from_millis(10)) {
                            Ok(b) => return pool.push(b),
                            Err(RecvTimeoutError::Timeout) => check(abort, deadline, what),
                            Err(RecvTimeoutError::Disconnected) => {
                                panic!("sender {id}: the send poller hung up: {}", what())
                            }
                        }
                    };
                    for seq in 0..per_sender {
                        if pool.is_empty() {
                            refill(&mut pool, &|| {
                                format!("sender {id} waiting for a buffer for message {seq}")
                            });
                        }
                        let mut b = pool.pop().unwrap();
                        fill_message(&mut b, id, seq);
                        let wr_id = ((id as u64) << 32) | seq;
                        sq.lock()
                            .unwrap()
                            .send(b, Wr::id(wr_id))
                            .unwrap_or_else(|e| {
                                panic!("sender {id}: post_send {seq}: {}", e.error)
                            });
                    }
                    // Every buffer comes back.
                    while pool.len() < SEND_BUFS {
                        let n = pool.len();
                        refill(&mut pool, &|| {
                            format!("sender {id}: {n} of {SEND_BUFS} buffers back")
                        });
                    }
                    pool
                })
            })
            .collect();

        // Polls the sender's CQ and hands each buffer back to its sender.
        let poller = s.spawn(move |_| {
            let _guard = AbortOnPanic(abort);
            let mut batch = Completions::with_capacity(32);
            let mut next = vec![0u64; senders];
            let mut done = 0;
            while done < total {
                for mut c in poll_some(&p.cq_a, &mut batch) {
                    c.result()
                        .unwrap_or_else(|e| panic!("send completion {done}: {e}: {c:?}"));
                    let (id, seq) = ((c.wr_id() >> 32) as usize, c.wr_id() & 0xFFFF_FFFF);
                    assert_eq!(seq, next[id], "sender {id}'s send completions in order");
                    next[id] += 1;
                    let b = c
                        .take_local()
                        .expect("send completion hands the buffer back");
                    assert_eq!(b[8..16], seq.to_le_bytes(), "the buffer of message {seq}");
                    txs[id].send(b).expect("sender thread alive");
                    done += 1;
                }
                check(abort, deadline, || {
                    format!("{done} of {total} send completions")
                });
            }
            assert_eq!(next, vec![per_sender; senders]);
        });

        // Polls the receiver's CQ, checks each message, re-posts receives.
        let receiver = s.spawn(move |_| {
            let _guard = AbortOnPanic(abort);
            let mut rq = rq;
            let mut batch = Completions::with_capacity(32);
            let mut next = vec![0u64; senders];
            let mut posted = posted_first;
            let mut got = 0;
            let mut home = Vec::new();
            let mut want = [0u8; MSG];
            while got < total {
                for mut c in poll_some(&p.cq_b, &mut batch) {
                    c.result()
                        .unwrap_or_else(|e| panic!("receive completion {got}: {e}: {c:?}"));
                    assert_eq!(c.byte_len() as usize, MSG, "{c:?}");
                    let b = c
                        .take_local()
                        .expect("receive completion hands the buffer back");
                    let id = b[0] as usize;
                    assert!(id < senders, "sender id {id} in message {got}");
                    let seq = u64::from_le_bytes(b[8..16].try_into().unwrap());
                    assert_eq!(seq, next[id], "sender {id}'s messages arrive in order");
                    fill_message(&mut want, id, seq);
                    assert_eq!(&b[..], &want[..], "bytes of message {seq} from sender {id}");
                    next[id] += 1;
                    got += 1;
                    if posted < total {
                        rq.recv(b, posted)
                            .unwrap_or_else(|e| panic!("re-posting receive {posted}: {}", e.error));
                        posted += 1;
                    } else {
                        home.push(b);
                    }
                }
                check(abort, deadline, || {
                    format!("{got} of {total} messages received")
                });
            }
            assert_eq!(
                next,
                vec![per_sender; senders],
                "every message of every sender"
            );
            home
        });

        let pools: Vec<Vec<LocalBuffer>> = senders_h.into_iter().map(join).collect();
        join(poller);
        (pools, join(receiver))
    })
    .unwrap_or_else(|e| std::panic::resume_unwind(e));

    assert_eq!(
        recvs.len(),
        posted_first as usize,
        "every receive buffer came home"
    );
    assert_eq!(
        (p.a.send_outstanding(), p.b.recv_outstanding()),
        (0, 0),
        "nothing left in flight"
    );
    // Every piece of every sender's registration came home: they join
    // back into the whole.
    for (id, mut pool) in pools.into_iter().enumerate() {
        pool.sort_by_key(|b| b.addr());
        let mut pieces = pool.into_iter();
        let mut whole = pieces.next().unwrap();
        for piece in pieces {
            whole = whole
                .unsplit(piece)
                .unwrap_or_else(|_| panic!("sender {id}: a send buffer is missing"));
        }
        assert_eq!(
            whole.len(),
            MSG * SEND_BUFS,
            "sender {id}'s registration is whole again"
        );
    }
    common::assert_quiet(&p.cq_a);
    common::assert_quiet(&p.cq_b);
}

#[test]
#[ignore = "needs an RDMA device"]
fn sender_and_pollers_on_separate_threads() {
    run(1, 2000);
}

#[test]
#[ignore = "needs an RDMA device"]
fn two_threads_post_on_one_queue_pair() {
    run(2, 1000);
}

fn assert_send_sync<T: Send + Sync>() {}
fn assert_send<T: Send>() {}

#[test]
fn handles_are_send_and_sync() {
    assert_send_sync::<Context>();
    assert_send_sync::<ProtectionDomain>();
    assert_send_sync::<MemoryRegion>();
    assert_send_sync::<CompletionQueue>();
    assert_send_sync::<CompletionChannel>();
    assert_send_sync::<QueuePair>();
    assert_send_sync::<SharedReceiveQueue>();
    assert_send_sync::<AddressHandle>();
    assert_send_sync::<LocalBuffer>();
    assert_send_sync::<SharedBuffer>();
    assert_send_sync::<FrozenBuffer>();
    // The posting handles: shared in a `Mutex`, or moved to a thread.
    assert_send_sync::<SendQueue>();
    assert_send_sync::<RecvQueue>();
    // Completions (with the buffers they hand back) move between threads.
    assert_send::<Completion>();
    assert_send::<Completions>();
    assert_send::<RecvRequest>();
    assert_send::<SendRequest<'static>>();
}
