//! The registered buffer pool (device tests): threads sharing one pool
//! over real queue pairs, buffers that are not whole slots refused, a pool
//! dropped with buffers out, a buffer lost with its queue pair, and huge
//! pages (or their refusal).

mod common;

use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{pair, pattern, wait_ok};
use rdma_verbs::{
    memory::{BufferPool, PutError},
    AccessFlags, Error, LocalBuffer, QpType, Wr,
};

fn local() -> AccessFlags {
    AccessFlags::LOCAL_WRITE
}

/// A free buffer of `pool`, waiting (10 s at most) while other threads
/// hold them all.
fn get_waiting(pool: &BufferPool) -> rdma_verbs::memory::PooledBuffer {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(b) = pool.get() {
            return b;
        }
        assert!(Instant::now() < deadline, "no buffer came back to the pool");
        std::thread::yield_now();
    }
}

/// Four threads, each with its own RC pair, take send and receive buffers
/// from one pool of five (fewer than they could hold at once, so `get`
/// comes back empty and they wait for each other's puts), post them, and
/// complete them; a fifth thread checks every received message and puts
/// its buffer back (a put on another thread than the get). Every byte of
/// every message is checked, and every buffer is back at the end.
#[test]
#[ignore = "needs an RDMA device"]
fn pool_shared_by_threads_over_real_queue_pairs() {
    const THREADS: usize = 4;
    const ITERS: usize = 150;
    const SIZE: usize = 1024;
    let dev = common::device();
    let pd = dev.ctx.alloc_pd().unwrap();
    let pool = pd.alloc_pool(THREADS + 1, SIZE, local()).build().unwrap();
    assert_eq!((pool.count(), pool.size(), pool.available()), (5, SIZE, 5));
    let pairs: Vec<_> = (0..THREADS)
        .map(|_| {
            let (cq_a, cq_b) = (
                dev.ctx.create_cq(256).build().unwrap(),
                dev.ctx.create_cq(256).build().unwrap(),
            );
            let a = pd.create_qp(QpType::Rc, &cq_a, &cq_a).build().unwrap();
            let b = pd.create_qp(QpType::Rc, &cq_b, &cq_b).build().unwrap();
            common::connect_pair(&dev, &a, &b, local());
            (cq_a, cq_b, a, b)
        })
        .collect();
    let (to_checker, checked) = mpsc::channel::<(usize, usize, LocalBuffer)>();
    let verified = std::thread::scope(|s| {
        let checker = s.spawn(|| {
            let mut n = 0;
            for (t, i, buf) in checked {
                let mut want = pattern(SIZE, (t * 7 + i) as u8);
                want[..16].copy_from_slice(
                    &[&(t as u64).to_le_bytes()[..], &(i as u64).to_le_bytes()[..]].concat(),
                );
                assert!(buf[..] == want[..], "message {i} of thread {t} corrupted");
                pool.put(buf).unwrap();
                n += 1;
            }
            n
        });
        for (t, (cq_a, cq_b, a, b)) in pairs.iter().enumerate() {
            let (pool, to_checker) = (&pool, to_checker.clone());
            s.spawn(move || {
                let mut sq = a.send_queue().unwrap();
                let mut rq = b.recv_queue().unwrap();
                for i in 0..ITERS {
                    let mut send = get_waiting(pool);
                    send.copy_from_slice(&pattern(SIZE, (t * 7 + i) as u8));
                    send[..8].copy_from_slice(&(t as u64).to_le_bytes());
                    send[8..16].copy_from_slice(&(i as u64).to_le_bytes());
                    // A guard dropped unposted goes back at once.
                    if i % 3 == 0 {
                        drop(pool.get());
                    }
                    let recv = get_waiting(pool);
                    rq.recv(recv, i as u64).unwrap();
                    sq.send(send, Wr::id(i as u64)).unwrap();
                    let mut s = wait_ok(cq_a);
                    pool.put(s.take_local().expect("the send buffer")).unwrap();
                    let mut r = wait_ok(cq_b);
                    assert_eq!((r.wr_id(), r.byte_len()), (i as u64, SIZE as u32));
                    let buf = r.take_local().expect("the receive buffer");
                    to_checker.send((t, i, buf)).unwrap();
                }
            });
        }
        drop(to_checker);
        checker.join().unwrap()
    });
    assert_eq!(verified, THREADS * ITERS);
    assert_eq!(pool.available(), pool.count(), "every buffer came back");
}

fn refused(r: Result<(), PutError>) -> (Error, LocalBuffer) {
    let e = r.expect_err("put accepted a buffer that is not a whole slot");
    (e.error, e.buffer)
}

/// `put` refuses a buffer of another registration (another pool's, a
/// plain `alloc`), a piece of a slot, slots joined, and a slot-sized
/// range across two slots; each comes back untouched and the pool is
/// unchanged. A buffer swapped into a guard is not taken at its drop.
#[test]
#[ignore = "needs an RDMA device"]
fn pool_put_refuses_what_is_not_one_whole_slot() {
    let dev = common::device();
    let pd = dev.ctx.alloc_pd().unwrap();
    let pool = pd.alloc_pool(4, 256, local()).build().unwrap();
    let other = pd.alloc_pool(4, 256, local()).build().unwrap();

    let foreign = pd.alloc(256, local()).unwrap();
    let addr = foreign.addr();
    let (e, foreign) = refused(pool.put(foreign));
    assert!(
        matches!(e, Error::NotPoolSlot { addr: a, len: 256, size: 256, same_registration: false } if a == addr),
        "{e}"
    );
    assert_eq!(foreign.addr(), addr);
    assert_eq!(pool.available(), 4);

    let theirs = other.get().unwrap().into_local();
    let (e, theirs) = refused(pool.put(theirs));
    assert!(
        matches!(
            e,
            Error::NotPoolSlot {
                same_registration: false,
                ..
            }
        ),
        "{e}"
    );
    other.put(theirs).unwrap();
    assert_eq!((pool.available(), other.available()), (4, 4));

    // A slot split in two: neither half goes back; joined again, it does.
    let slot = pool.get().unwrap().into_local();
    let (head, tail) = slot.split_at(100);
    let (e, head) = refused(pool.put(head));
    assert!(
        matches!(
            e,
            Error::NotPoolSlot {
                len: 100,
                size: 256,
                same_registration: true,
                ..
            }
        ),
        "{e}"
    );
    let (_, tail) = refused(pool.put(tail));
    assert_eq!(pool.available(), 3);
    pool.put(head.unsplit(tail).unwrap()).unwrap();
    assert_eq!(pool.available(), 4);

    // Two slots joined, and a slot-sized range across both.
    let (s0, s1) = (pool.get().unwrap(), pool.get().unwrap());
    assert_eq!(s1.addr(), s0.addr() + 256, "slots come out in order");
    let both = LocalBuffer::join(vec![s0.into_local(), s1.into_local()]).unwrap();
    let (e, both) = refused(pool.put(both));
    assert!(matches!(e, Error::NotPoolSlot { len: 512, .. }), "{e}");
    let (x, rest) = both.split_at(100);
    let (mid, z) = rest.split_at(256);
    let (e, mid) = refused(pool.put(mid));
    assert!(
        matches!(
            e,
            Error::NotPoolSlot {
                len: 256,
                same_registration: true,
                ..
            }
        ),
        "a slot's length at no slot's start: {e}"
    );
    assert_eq!(pool.available(), 2);
    let both = LocalBuffer::join(vec![x, mid, z]).unwrap();
    let (slots, rest) = both.chunks_exact(256);
    assert!(rest.is_empty());
    for s in slots {
        pool.put(s).unwrap();
    }
    assert_eq!(pool.available(), 4);

    // A foreign buffer swapped into a guard: its drop keeps the foreign
    // buffer out; the slot swapped out goes back by `put`.
    let mut guard = pool.get().unwrap();
    let mut swapped = pd.alloc(256, local()).unwrap();
    std::mem::swap(&mut *guard, &mut swapped);
    drop(guard);
    assert_eq!(pool.available(), 3);
    pool.put(swapped).unwrap();
    assert_eq!(pool.available(), 4);

    // Remote write rights are refused: the pool hands out `&mut [u8]`.
    let e = pd
        .alloc_pool(2, 64, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .build()
        .unwrap_err();
    assert!(matches!(e, Error::NeedsSharedBuffer { .. }), "{e}");
    let e = pd.alloc_pool(0, 64, local()).build().unwrap_err();
    assert!(matches!(e, Error::EmptyRegistration), "{e}");
    let e = pd
        .alloc_pool(usize::MAX / 2, 4, local())
        .build()
        .unwrap_err();
    assert!(matches!(e, Error::OutOfRange { .. }), "{e}");
}

/// The pool's last handle dropped while buffers are out: a posted receive
/// still completes into its (registered) memory, a guard still works and
/// its drop is harmless, and the buffers outlive the pool.
#[test]
#[ignore = "needs an RDMA device"]
fn pool_dropped_with_buffers_out() {
    let p = pair(QpType::Rc, local(), |b| b);
    let pool = p.pd.alloc_pool(4, 64, local()).build().unwrap();
    let mr = pool.memory_region().clone();
    let mut sq = p.a.send_queue().unwrap();
    let mut rq = p.b.recv_queue().unwrap();
    rq.recv(pool.get().unwrap(), 1).unwrap();
    let mut held = pool.get().unwrap();
    let kept = pool.get().unwrap().into_local();
    drop(pool);

    let mut msg = p.pd.alloc(64, local()).unwrap();
    msg.copy_from_slice(&pattern(64, 3));
    sq.send(msg, Wr::id(0)).unwrap();
    wait_ok(&p.cq_a);
    let mut r = wait_ok(&p.cq_b);
    let got = r.take_local().unwrap();
    assert_eq!(got[..], pattern(64, 3)[..]);
    assert_eq!(got.lkey(), mr.lkey());
    held.copy_from_slice(&pattern(64, 4));
    assert_eq!(held[..], pattern(64, 4)[..]);
    drop(held); // back into a pool nobody can reach: dropped with it
    drop(mr);
    // The registration lives while any buffer does: post the last one.
    rq.recv(kept, 0).unwrap();
    let mut msg = p.pd.alloc(64, local()).unwrap();
    msg.copy_from_slice(&pattern(64, 5));
    sq.send(msg, Wr::id(0)).unwrap();
    wait_ok(&p.cq_a);
    let kept = wait_ok(&p.cq_b).take_local().unwrap();
    assert_eq!(kept[..], pattern(64, 5)[..]);
    drop((got, kept));
}

/// A pooled receive posted on a queue pair that is dropped: the buffer is
/// the queue pair's, released (not returned) after `ibv_destroy_qp`, so
/// it never comes back to the pool while the device might still write it
/// — nor afterwards.
#[test]
#[ignore = "needs an RDMA device"]
fn pool_buffer_posted_on_a_dropped_queue_pair_never_returns() {
    let p = pair(QpType::Rc, local(), |b| b);
    let pool = p.pd.alloc_pool(2, 64, local()).build().unwrap();
    // Through a handle dropped at once (a live handle would keep the queue
    // pair alive).
    p.b.recv_queue()
        .unwrap()
        .recv(pool.get().unwrap(), 0)
        .unwrap();
    assert_eq!(pool.available(), 1);
    let common::Pair {
        a, b, cq_a, cq_b, ..
    } = p;
    drop((a, b, cq_a, cq_b));
    assert_eq!(pool.available(), 1, "a posted buffer came back on its own");
    let last = pool.get().unwrap();
    assert!(pool.get().is_none(), "the lost slot was handed out again");
    drop(last);
    assert_eq!(pool.available(), 1);
}

/// `(Hugepagesize, HugePages_Free, HugePages_Total)` from /proc/meminfo.
fn huge_pages() -> (usize, usize, usize) {
    let info = std::fs::read_to_string("/proc/meminfo").unwrap();
    let field = |name: &str| -> usize {
        info.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|r| r.trim_start_matches(':').split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    (
        field("Hugepagesize") * 1024,
        field("HugePages_Free"),
        field("HugePages_Total"),
    )
}

/// A huge-page pool when the system has huge pages free (the VM harness
/// reserves 16 of 2 MiB): one page carved into 4 KiB buffers, a message
/// sent through two of them. Asking for more pages than the system has
/// is an `mmap` error that says how many are free, never a silent
/// fallback to small pages.
#[test]
#[ignore = "needs an RDMA device"]
fn pool_on_huge_pages_or_its_refusal() {
    let p = pair(QpType::Rc, local(), |b| b);
    let (page, free, total) = huge_pages();
    let overcommit = std::fs::read_to_string("/proc/sys/vm/nr_overcommit_hugepages")
        .map_or(0, |s| s.trim().parse::<usize>().unwrap_or(0));
    if free >= 1 {
        let pool =
            p.pd.alloc_pool(page / 4096, 4096, local())
                .huge_pages(true)
                .build()
                .unwrap();
        assert!(pool.memory_region().is_huge());
        assert_eq!(pool.memory_region().len(), page);
        assert_eq!(pool.memory_region().addr() % page as u64, 0);
        let mut send = pool.get().unwrap();
        send.copy_from_slice(&pattern(4096, 9));
        p.b.recv_queue()
            .unwrap()
            .recv(pool.get().unwrap(), 0)
            .unwrap();
        p.a.send_queue().unwrap().send(send, Wr::id(0)).unwrap();
        pool.put(wait_ok(&p.cq_a).take_local().unwrap()).unwrap();
        let got = wait_ok(&p.cq_b).take_local().unwrap();
        assert_eq!(got[..], pattern(4096, 9)[..]);
        pool.put(got).unwrap();
        assert_eq!(pool.available(), pool.count());
        eprintln!("a pool on one huge page of {page} bytes ({free} of {total} were free)");
    } else {
        eprintln!("UNSUPPORTED on this system: huge pages (none free): checking the refusal");
    }
    if overcommit == 0 {
        // More pages than the system has: refused by mmap, with the numbers.
        let pages = total + 1;
        let e =
            p.pd.alloc_pool(pages, page.max(4096), local())
                .huge_pages(true)
                .build()
                .unwrap_err();
        assert_eq!(e.verb(), Some("mmap"), "{e}");
        let text = e.to_string();
        assert!(
            text.contains(&format!("needs {pages} free huge pages"))
                && text.contains("nr_hugepages"),
            "{text}"
        );
        eprintln!("refused as it should: {text}");
    }
}
