//! The safe data path does not allocate in steady state (device tests).
//!
//! A counting global allocator counts the heap allocations of the current
//! thread while counting is switched on for it (a thread-local flag, so
//! the test harness's own threads never count). After a warm-up, 1000
//! iterations of post → poll → take the buffers back must allocate nothing:
//! posting through the queue pairs' handles (typed methods, chains,
//! prepared requests), polling with borrowed completions (or `poll_one`),
//! and the Tokio dispatcher's futures.
//! The poll loop is written here without allocating (`common::wait` builds
//! a `Vec`).

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdma_verbs::{
    cq::{CompletionRef, WorkCompletion},
    qp::{AddressVector, UdDest},
    AccessFlags, Completion, CompletionQueue, Completions, LocalBuffer, QpType, RecvRequest,
    SendRequest, Wr,
};

struct Counting;

static ALLOCS: AtomicUsize = AtomicUsize::new(0);
static BYTES: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
}

fn note(size: usize) {
    // `try_with`: the flag may already be gone while a thread exits.
    if COUNTING.try_with(Cell::get).unwrap_or(false) {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(size, Ordering::Relaxed);
    }
}

// SAFETY: forwards every call to `System` unchanged; counting touches only
// atomics and a const-initialised thread-local (which never allocates).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: forwarded with the caller's contract.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: forwarded with the caller's contract.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        // SAFETY: forwarded with the caller's contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded with the caller's contract.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Serialises counting sections, so tests run in parallel cannot mix
/// their counts.
static SERIAL: Mutex<()> = Mutex::new(());

/// Runs `f` with counting on for this thread; returns (allocations, bytes).
fn count_allocations(f: impl FnOnce()) -> (usize, usize) {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let (a0, b0) = (ALLOCS.load(Ordering::SeqCst), BYTES.load(Ordering::SeqCst));
    COUNTING.with(|c| c.set(true));
    f();
    COUNTING.with(|c| c.set(false));
    (
        ALLOCS.load(Ordering::SeqCst) - a0,
        BYTES.load(Ordering::SeqCst) - b0,
    )
}

/// Runs `iteration` WARM_UP times, then MEASURED times counting, and
/// asserts that those allocated nothing; `what` names the data path.
fn steady_state_allocates_nothing(what: &str, mut iteration: impl FnMut(usize)) {
    for i in 0..WARM_UP {
        iteration(i);
    }
    let (n, bytes) = count_allocations(|| {
        for i in WARM_UP..WARM_UP + MEASURED {
            iteration(i);
        }
    });
    assert_eq!(
        (n, bytes),
        (0, 0),
        "{MEASURED} iterations of {what} allocated {n} times ({bytes} bytes)"
    );
}

#[test]
fn the_counter_counts() {
    let (n, bytes) = count_allocations(|| {
        let v = std::hint::black_box(vec![1u8; 100]);
        drop(v);
    });
    assert_eq!((n, bytes), (1, 100), "the counting allocator sees a Vec");
    let (n, _) = count_allocations(|| {
        std::hint::black_box(1 + 1);
    });
    assert_eq!(n, 0);
}

const WARM_UP: usize = 50;
const MEASURED: usize = 1000;

/// Polls `cq` once into `batch` and hands each completion, borrowed, to
/// `f`; does not allocate.
fn poll_into(cq: &CompletionQueue, batch: &mut Completions, mut f: impl FnMut(CompletionRef<'_>)) {
    for c in cq.poll(batch).expect("ibv_poll_cq") {
        f(c);
    }
}

/// Polls `cq` once with `poll_one` and hands the completion to `f`.
fn poll_one_into(cq: &CompletionQueue, f: impl FnOnce(Completion)) {
    if let Some(c) = cq.poll_one().expect("ibv_poll_cq") {
        f(c);
    }
}

/// Panics (allocation allowed: the test fails anyway) when a completion
/// (owned or borrowed) is not a success.
fn ok<C: std::ops::Deref<Target = WorkCompletion> + std::fmt::Debug>(c: &C) {
    if !c.is_success() {
        panic!("work request failed: {c:?}");
    }
}

fn deadline() -> Instant {
    Instant::now() + Duration::from_secs(10)
}

#[test]
#[ignore = "needs an RDMA device"]
fn post_and_poll_do_not_allocate() {
    let p = common::pair(QpType::Rc, AccessFlags::LOCAL_WRITE, |b| b);
    let mut send = Some(p.pd.alloc(64, AccessFlags::LOCAL_WRITE).unwrap());
    let mut recv = Some(p.pd.alloc(64, AccessFlags::LOCAL_WRITE).unwrap());
    let mut batch_b = Completions::with_capacity(16);
    let mut sq = p.a.send_queue().unwrap();
    let mut rq = p.b.recv_queue().unwrap();

    let iteration = |i: usize| {
        let mut s = send.take().expect("send buffer is home");
        s[..8].copy_from_slice(&(i as u64).to_le_bytes());
        rq.recv(recv.take().expect("receive buffer is home"), i as u64)
            .expect("recv");
        sq.send(s, Wr::id(i as u64)).expect("send");
        let end = deadline();
        while send.is_none() || recv.is_none() {
            // The sender polls one at a time, the receiver in batches.
            poll_one_into(&p.cq_a, |mut c| {
                ok(&c);
                assert_eq!(c.wr_id(), i as u64);
                send = c.take_local();
            });
            poll_into(&p.cq_b, &mut batch_b, |mut c| {
                ok(&c);
                assert_eq!(c.wr_id(), i as u64);
                let b = c.take_local().expect("receive buffer back");
                assert_eq!(b[..8], (i as u64).to_le_bytes(), "message {i}");
                recv = Some(b);
            });
            assert!(Instant::now() < end, "iteration {i} timed out");
        }
    };
    steady_state_allocates_nothing("recv/send/poll/take", iteration);
}

#[test]
#[ignore = "needs an RDMA device"]
fn prepared_send_and_receive_do_not_allocate() {
    // The ping-pongs' data path: a prepared send and a prepared receive,
    // re-posted; the sender's completions polled one at a time, the
    // receiver's in borrowed batches.
    let p = common::pair(QpType::Rc, AccessFlags::LOCAL_WRITE, |b| b);
    let mut sq = p.a.send_queue().unwrap();
    let mut rq = p.b.recv_queue().unwrap();
    let msg = p.pd.alloc(64, AccessFlags::LOCAL_WRITE).unwrap();
    let mut send = sq.prepare(SendRequest::send(msg).wr_id(1)).unwrap();
    let into = p.pd.alloc(64, AccessFlags::LOCAL_WRITE).unwrap();
    let mut recv = rq.prepare(RecvRequest::new(into).wr_id(2)).unwrap();
    let mut batch_b = Completions::with_capacity(16);

    let iteration = |i: usize| {
        send.bytes_mut(0).expect("send idle")[..8].copy_from_slice(&(i as u64).to_le_bytes());
        rq.post_prepared(&mut recv).expect("post the receive");
        sq.post_prepared(&mut send).expect("post the send");
        let end = deadline();
        while send.is_posted() || recv.is_posted() {
            poll_one_into(&p.cq_a, |c| {
                assert!(c.is_success(), "iteration {i}: {:?}", c.status());
                assert_eq!(c.wr_id(), 1);
            });
            poll_into(&p.cq_b, &mut batch_b, |c| {
                assert!(c.is_success(), "iteration {i}: {:?}", c.status());
                assert_eq!(c.wr_id(), 2);
            });
            assert!(Instant::now() < end, "iteration {i} timed out");
        }
        let got = recv.bytes(0).expect("receive idle");
        assert_eq!(got[..8], (i as u64).to_le_bytes(), "message {i}");
    };
    steady_state_allocates_nothing("prepared post/poll", iteration);
}

#[test]
#[ignore = "needs an RDMA device"]
fn posting_lists_does_not_allocate() {
    const N: usize = 4;
    let p = common::pair(QpType::Rc, AccessFlags::LOCAL_WRITE, |b| b);
    let mut sends: [Option<LocalBuffer>; N] =
        std::array::from_fn(|_| Some(p.pd.alloc(32, AccessFlags::LOCAL_WRITE).unwrap()));
    let mut recvs: [Option<LocalBuffer>; N] =
        std::array::from_fn(|_| Some(p.pd.alloc(32, AccessFlags::LOCAL_WRITE).unwrap()));
    let mut send_list: Vec<SendRequest<'static>> = Vec::with_capacity(N);
    let mut recv_list: Vec<RecvRequest> = Vec::with_capacity(N);
    let mut batch_a = Completions::with_capacity(16);
    let mut batch_b = Completions::with_capacity(16);
    let mut sq = p.a.send_queue().unwrap();
    let mut rq = p.b.recv_queue().unwrap();

    let iteration = |i: usize| {
        for (j, slot) in recvs.iter_mut().enumerate() {
            let b = slot.take().expect("receive buffer is home");
            recv_list.push(RecvRequest::new(b).wr_id(j as u64));
        }
        rq.post_chain(&mut recv_list).expect("receive chain");
        for (j, slot) in sends.iter_mut().enumerate() {
            let mut b = slot.take().expect("send buffer is home");
            b[0] = j as u8;
            b[1] = i as u8;
            send_list.push(SendRequest::send(b).wr_id(j as u64));
        }
        sq.post_chain(&mut send_list).expect("send chain");
        assert!(send_list.is_empty() && recv_list.is_empty());
        let (mut got_s, mut got_r) = (0, 0);
        let end = deadline();
        while got_s < N || got_r < N {
            poll_into(&p.cq_a, &mut batch_a, |mut c| {
                ok(&c);
                assert_eq!(c.wr_id(), got_s as u64, "send completions in order");
                sends[got_s] = c.take_local();
                got_s += 1;
            });
            poll_into(&p.cq_b, &mut batch_b, |mut c| {
                ok(&c);
                assert_eq!(c.wr_id(), got_r as u64, "receive completions in order");
                let b = c.take_local().expect("receive buffer back");
                assert_eq!(
                    (b[0], b[1]),
                    (got_r as u8, i as u8),
                    "message {got_r} of {i}"
                );
                recvs[got_r] = Some(b);
                got_r += 1;
            });
            assert!(Instant::now() < end, "iteration {i} timed out");
        }
    };
    steady_state_allocates_nothing(
        &format!("receive/send post_chain ({N} each)/poll"),
        iteration,
    );
}

#[test]
#[ignore = "needs an RDMA device"]
fn ud_send_with_address_handle_does_not_allocate() {
    const QKEY: u32 = 0x5151;
    let t = common::device();
    let pd = t.ctx.alloc_pd().unwrap();
    let cq_a = t.ctx.create_cq(256).build().unwrap();
    let cq_b = t.ctx.create_cq(256).build().unwrap();
    let a = pd.create_qp(QpType::Ud, &cq_a, &cq_a).build().unwrap();
    let b = pd.create_qp(QpType::Ud, &cq_b, &cq_b).build().unwrap();
    a.activate_ud(t.port, QKEY, 1).unwrap();
    b.activate_ud(t.port, QKEY, 2).unwrap();
    let port_attr = t.ctx.query_port(t.port).unwrap();
    let ep = common::endpoint(&t, &b, 0);
    let ah = pd
        .create_ah(&AddressVector::for_port(&port_attr, &ep, t.gid_index).unwrap())
        .unwrap();
    let dest = UdDest::new(&ah, b.qp_num(), QKEY);
    let mut send = Some(pd.alloc(64, AccessFlags::LOCAL_WRITE).unwrap());
    let mut recv = Some(pd.alloc(40 + 64, AccessFlags::LOCAL_WRITE).unwrap());
    let mut batch_a = Completions::with_capacity(16);
    let mut batch_b = Completions::with_capacity(16);
    let mut sq = a.send_queue().unwrap();
    let mut rq = b.recv_queue().unwrap();

    let iteration = |i: usize| {
        let mut s = send.take().expect("send buffer is home");
        s[..8].copy_from_slice(&(i as u64).to_le_bytes());
        rq.recv(recv.take().expect("receive buffer is home"), i as u64)
            .expect("recv");
        // `send_to` clones the address handle (an Arc): no allocation.
        sq.send_to(s, &dest, Wr::id(i as u64)).expect("send_to");
        let end = deadline();
        while send.is_none() || recv.is_none() {
            poll_into(&cq_a, &mut batch_a, |mut c| {
                ok(&c);
                send = c.take_local();
            });
            poll_into(&cq_b, &mut batch_b, |mut c| {
                ok(&c);
                let r = c.take_local().expect("receive buffer back");
                assert_eq!(r[40..48], (i as u64).to_le_bytes(), "datagram {i}");
                recv = Some(r);
            });
            assert!(Instant::now() < end, "iteration {i} timed out");
        }
    };
    steady_state_allocates_nothing("UD send/receive", iteration);
}

/// `Mesh::barrier` (the per-step synchronisation of a collective) does not
/// allocate: two ranks of a mesh as threads, this thread's barriers
/// counted.
#[test]
#[ignore = "needs an RDMA device"]
fn exchange_mesh_barrier_does_not_allocate() {
    use rdma_verbs::{ConnectOptions, LocalPort};
    use rdma_verbs_runtime::Ranks;
    let ls: Vec<std::net::TcpListener> = (0..2)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    let addrs: Vec<std::net::SocketAddr> = ls.iter().map(|l| l.local_addr().unwrap()).collect();
    let rank = |rank: usize, l: std::net::TcpListener, addrs: Vec<std::net::SocketAddr>| {
        let dev = common::device();
        let pd = dev.ctx.alloc_pd().unwrap();
        let cq = dev.ctx.create_cq(256).build().unwrap();
        let local = LocalPort::query(&dev.ctx, dev.port, Some(dev.gid_index)).unwrap();
        let opts = ConnectOptions::new(dev.port).local_port(&local);
        Ranks::new(&addrs, rank)
            .listener(l)
            .connect_mesh(&local, &opts, |_| {
                let qp = pd.create_qp(QpType::Rc, &cq, &cq).build()?;
                Ok((qp, Vec::new()))
            })
            .unwrap()
    };
    let mut ls = ls.into_iter();
    let (l0, l1) = (ls.next().unwrap(), ls.next().unwrap());
    let other = {
        let addrs = addrs.clone();
        std::thread::spawn(move || {
            let mut mesh = rank(1, l1, addrs);
            for _ in 0..WARM_UP + MEASURED {
                mesh.barrier(Duration::from_secs(30)).unwrap();
            }
        })
    };
    let mut mesh = rank(0, l0, addrs);
    steady_state_allocates_nothing("Mesh::barrier", |_| {
        mesh.barrier(Duration::from_secs(30)).unwrap()
    });
    other.join().unwrap();
}

#[test]
#[ignore = "needs an RDMA device"]
fn message_channel_send_and_recv_do_not_allocate() {
    use rdma_verbs_runtime::MessageChannel;
    let t = common::device();
    let pd = t.ctx.alloc_pd().unwrap();
    // A window of 4: credits run out and come back (alone and piggy-backed)
    // within the measured iterations.
    let mut a = MessageChannel::create(&pd, 4, 256).unwrap();
    let mut b = MessageChannel::create(&pd, 4, 256).unwrap();
    let ea = common::endpoint(&t, a.queue_pair(), 1);
    let eb = common::endpoint(&t, b.queue_pair(), 2);
    let opts = common::options(&t, AccessFlags::LOCAL_WRITE);
    a.connect(&ea, &eb, &opts).unwrap();
    b.connect(&eb, &ea, &opts).unwrap();
    let wait = Some(Duration::from_secs(10));
    let mut bytes = [0u8; 256];

    let iteration = |i: usize| {
        // Small messages go inline, larger ones through a send slot.
        let len = if i % 2 == 0 { 16 } else { 200 };
        bytes[..8].copy_from_slice(&(i as u64).to_le_bytes());
        a.send(&bytes[..len], wait).expect("a.send");
        if i % 3 == 0 {
            b.send(&bytes[..len], wait).expect("b.send");
            let back = a.recv(wait).expect("a.recv").expect("a message");
            assert_eq!(back.len(), len);
        }
        let m = b.recv(wait).expect("b.recv").expect("a message");
        assert_eq!(m[..8], (i as u64).to_le_bytes(), "message {i}");
        assert_eq!(m.len(), len);
    };
    steady_state_allocates_nothing("MessageChannel send/recv", iteration);
}

#[test]
#[ignore = "needs an RDMA device"]
fn pool_get_post_poll_put_does_not_allocate() {
    // A runtime's loop over a buffer pool: get a send and a receive
    // buffer, post both, poll, put both back.
    let p = common::pair(QpType::Rc, AccessFlags::LOCAL_WRITE, |b| b);
    let pool =
        p.pd.alloc_pool(4, 64, AccessFlags::LOCAL_WRITE)
            .build()
            .unwrap();
    let mut batch_b = Completions::with_capacity(16);
    let mut sq = p.a.send_queue().unwrap();
    let mut rq = p.b.recv_queue().unwrap();

    let iteration = |i: usize| {
        let mut s = pool.get().expect("a free send buffer");
        s[..8].copy_from_slice(&(i as u64).to_le_bytes());
        let r = pool.get().expect("a free receive buffer");
        rq.recv(r, i as u64).expect("recv");
        sq.send(s, Wr::id(i as u64)).expect("send");
        let (mut sent, mut received) = (false, false);
        let end = deadline();
        while !sent || !received {
            poll_one_into(&p.cq_a, |mut c| {
                ok(&c);
                let b = c.take_local().expect("send buffer back");
                pool.put(b).expect("a slot of the pool");
                sent = true;
            });
            poll_into(&p.cq_b, &mut batch_b, |mut c| {
                ok(&c);
                let b = c.take_local().expect("receive buffer back");
                assert_eq!(b[..8], (i as u64).to_le_bytes(), "message {i}");
                pool.put(b).expect("a slot of the pool");
                received = true;
            });
            assert!(Instant::now() < end, "iteration {i} timed out");
        }
        assert_eq!(pool.available(), 4);
    };
    steady_state_allocates_nothing("pool get/post/poll/put", iteration);
}

#[test]
#[ignore = "needs an RDMA device"]
fn request_table_and_stream_do_not_allocate() {
    // The request table's data path: a send (b's table) and a receive
    // (a's table) posted with values, polled as (value, completion) pairs;
    // then a stream of inline writes (a's table) signaled every 4th, its
    // covered values handed out. The stream owns a's send handle (it
    // cannot lend it to `RequestTable::post_send`), so the table's send
    // goes from b to a.
    use rdma_verbs_runtime::{Reaped, RequestTable};
    let p = common::pair(QpType::Rc, common::remote_all(), |b| {
        b.max_send_wr(16).max_inline_data(64)
    });
    let target = p.pd.alloc_shared(64, common::remote_all()).unwrap();
    let remote = target.remote().unwrap();
    let mut send = Some(p.pd.alloc(64, AccessFlags::LOCAL_WRITE).unwrap());
    let mut recv = Some(p.pd.alloc(64, AccessFlags::LOCAL_WRITE).unwrap());
    let mut table_a = RequestTable::<(usize, u8)>::new(&p.cq_a, 16);
    let mut table_b = RequestTable::<usize>::new(&p.cq_b, 16);
    let mut rq_a = p.a.recv_queue().unwrap();
    let mut sq_b = p.b.send_queue().unwrap();
    let mut stream = table_a.send_stream(p.a.send_queue().unwrap(), 4).unwrap();

    let iteration = |i: usize| {
        let mut s = send.take().expect("send buffer is home");
        s[..8].copy_from_slice(&(i as u64).to_le_bytes());
        table_a
            .post_recv(
                &mut rq_a,
                RecvRequest::new(recv.take().expect("receive buffer is home")),
                (i, 0),
            )
            .expect("post_recv");
        table_b
            .post_send(&mut sq_b, SendRequest::send(s), i)
            .expect("post_send");
        let data = (i as u64).to_le_bytes();
        for k in 1..=8u8 {
            if k == 8 {
                stream.signal_next();
            }
            table_a
                .post_stream(
                    &mut stream,
                    SendRequest::write_inline(&data, remote),
                    (i, k),
                )
                .expect("post_stream");
        }
        let mut back = 0u32;
        let end = deadline();
        while send.is_none() || recv.is_none() || back != 0x1ff {
            if let Some(reaped) = table_a.poll().expect("poll") {
                match reaped {
                    Reaped::Done((j, k), mut c) => {
                        ok(&c);
                        assert_eq!(j, i);
                        if k == 0 {
                            let b = c.take_local().expect("receive buffer back");
                            assert_eq!(b[..8], (i as u64).to_le_bytes(), "message {i}");
                            recv = Some(b);
                        }
                        back |= 1 << k;
                    }
                    Reaped::Covered((j, k)) => {
                        assert_eq!(j, i);
                        back |= 1 << k;
                    }
                    Reaped::Foreign(c) => panic!("foreign {c:?}"),
                }
            }
            if let Some(Reaped::Done(j, mut c)) = table_b.poll().expect("poll") {
                ok(&c);
                assert_eq!(j, i);
                send = c.take_local();
            }
            assert!(Instant::now() < end, "iteration {i} timed out");
        }
    };
    steady_state_allocates_nothing("request table post/poll and stream", iteration);
}

#[test]
#[ignore = "needs an RDMA device"]
fn async_queue_pair_send_and_recv_do_not_allocate() {
    // The Tokio dispatcher's path: post a receive and a send, await both
    // futures (driving the completion channel, re-arming, filing each
    // completion in the dispatcher's slab, waking), reuse both buffers.
    use rdma_verbs_tokio::AsyncQueuePair;
    let t = common::device();
    let pd = t.ctx.alloc_pd().unwrap();
    let (a, b) = (
        common::channel_qp(&t, &pd, 16),
        common::channel_qp(&t, &pd, 16),
    );
    common::connect_pair(&t, &a, &b, AccessFlags::LOCAL_WRITE);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _in_runtime = rt.enter();
    let (a, b) = (
        AsyncQueuePair::new(a).unwrap(),
        AsyncQueuePair::new(b).unwrap(),
    );
    let mut bufs = Some((
        pd.alloc(64, AccessFlags::LOCAL_WRITE).unwrap(),
        pd.alloc(64, AccessFlags::LOCAL_WRITE).unwrap(),
    ));

    let iteration = |i: usize| {
        let (mut s, r) = bufs.take().expect("both buffers back");
        s[..8].copy_from_slice(&(i as u64).to_le_bytes());
        let incoming = b.post_recv(RecvRequest::new(r)).expect("post_recv");
        let sent = a.post_send(SendRequest::send(s)).expect("post_send");
        let (sent, incoming) = rt.block_on(async {
            tokio::time::timeout(Duration::from_secs(10), async {
                (sent.await, incoming.await)
            })
            .await
            .unwrap_or_else(|_| panic!("iteration {i} timed out"))
        });
        let s = sent.expect("send").take_local().expect("send buffer back");
        let r = incoming
            .expect("recv")
            .take_local()
            .expect("receive buffer back");
        assert_eq!(r[..8], (i as u64).to_le_bytes(), "message {i}");
        bufs = Some((s, r));
    };
    steady_state_allocates_nothing("AsyncQueuePair send/recv", iteration);
    assert_eq!((a.outstanding(), b.outstanding()), (0, 0));
}
