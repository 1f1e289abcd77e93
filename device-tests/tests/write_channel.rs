//! `WriteChannel` on a real device (device tests): writes of every size
//! both ways with a small window, a slow reader that must never see its
//! slot overwritten while it copies it out (the credit goes back only
//! after the copy), a reader sleeping on its completion channel, and the
//! refusals.

mod common;

use std::time::{Duration, Instant};

use rdma_verbs::{AccessFlags, Error};
use rdma_verbs_runtime::{ChannelProblem, WriteChannel};

const T: Option<Duration> = Some(Duration::from_secs(20));

/// Two started channel ends of `slots` × `size` on the test device,
/// connected to each other.
fn channel_pair(slots: u32, size: usize) -> (WriteChannel, WriteChannel) {
    let dev = common::device();
    let pd = dev.ctx.alloc_pd().unwrap();
    let mut a = WriteChannel::create(&pd, slots, size).unwrap();
    let mut b = WriteChannel::create(&pd, slots, size).unwrap();
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    common::connect_pair(&dev, a.queue_pair(), b.queue_pair(), access);
    let (ia, ib) = (a.inbox(), b.inbox());
    a.start(ib).unwrap();
    b.start(ia).unwrap();
    (a, b)
}

/// Write `k` of a stream: `len(k)` bytes, each a function of `k` and its
/// position.
fn len_of(k: u32, max: usize) -> usize {
    (k as usize * 7919) % (max + 1)
}
fn byte(seed: u8, k: u32, i: usize) -> u8 {
    (k as usize).wrapping_mul(31).wrapping_add(i) as u8 ^ seed
}

/// Both ends write `n` writes of every length up to a slot to each other
/// at once (one thread, zero timeouts: neither end blocks the other) and
/// check every byte of every write, in order.
#[test]
#[ignore = "needs an RDMA device"]
fn write_channel_both_ways() {
    const SIZE: usize = 1000;
    let n = 5_000u32;
    let (a, b) = channel_pair(3, SIZE);
    let mut ends = [(a, 0xa5u8, 0u32, 0u32), (b, 0x5a, 0, 0)];
    let mut out = vec![0u8; SIZE];
    let mut got = vec![0u8; SIZE];
    let deadline = Instant::now() + Duration::from_secs(120);
    while ends.iter().any(|e| e.2 < n || e.3 < n) {
        assert!(
            Instant::now() < deadline,
            "stuck: {:?}",
            ends.each_ref().map(|e| (e.2, e.3))
        );
        for side in 0..2 {
            let peer_seed = ends[1 - side].1;
            let (ch, seed, sent, recvd) = &mut ends[side];
            if *sent < n {
                let len = len_of(*sent, SIZE);
                for (i, x) in out[..len].iter_mut().enumerate() {
                    *x = byte(*seed, *sent, i);
                }
                match ch.send(&out[..len], Some(Duration::ZERO)) {
                    Ok(()) => *sent += 1,
                    Err(rdma_verbs_runtime::Error::TimedOut { .. }) => {}
                    Err(e) => panic!("send {sent}: {e}"),
                }
            }
            if let Some(w) = ch.recv(Some(Duration::ZERO)).unwrap() {
                let len = len_of(*recvd, SIZE);
                assert_eq!(w.len(), len, "write {recvd}");
                w.copy_to_slice(0, &mut got[..len]).unwrap();
                for (i, x) in got[..len].iter().enumerate() {
                    assert_eq!(*x, byte(peer_seed, *recvd, i), "write {recvd} byte {i}");
                }
                *recvd += 1;
            }
        }
    }
    for (ch, ..) in &mut ends {
        ch.flush(T).unwrap();
    }
}

/// A writer that writes the moment it gets a credit, and a reader that
/// holds each slot for a while before copying it out: every copy must
/// hold exactly the write it was handed out for. Returning the credit
/// before the copy (at `recv`) lets the writer overwrite the slot during
/// the pause, which this catches.
#[test]
#[ignore = "needs an RDMA device"]
fn write_channel_credit_only_after_the_copy() {
    const WORDS: usize = 4096;
    let (mut a, mut b) = channel_pair(2, WORDS * 4);
    let n = 200u32;
    let writer = std::thread::spawn(move || {
        let mut words = vec![0u32; WORDS];
        for k in 0..n {
            words.fill(k);
            a.send(bytemuck_bytes(&words), T).unwrap();
        }
        a.flush(T).unwrap();
        a
    });
    let mut got = vec![0u32; WORDS];
    for k in 0..n {
        let w = b.recv(T).unwrap().expect("a write");
        // The writer is blocked on its credit: give it time to misbehave.
        std::thread::sleep(Duration::from_millis(2));
        w.read_into(0, &mut got).unwrap();
        drop(w);
        let wrong = got.iter().position(|&x| x != k);
        assert_eq!(wrong, None, "write {k} was overwritten: {:?}", &got[..4]);
    }
    let _a = writer.join().unwrap();
    b.flush(T).unwrap();
}

fn bytemuck_bytes(words: &[u32]) -> &[u8] {
    rdma_verbs::bytemuck::cast_slice(words)
}

/// A blocking reader sleeps on its completion channel until a write
/// comes a while later (and spends little CPU doing so), then gets it
/// whole; a zero timeout finds nothing.
#[test]
#[ignore = "needs an RDMA device"]
fn write_channel_blocking_wait() {
    let (mut a, b) = channel_pair(2, 64);
    let mut b = b.blocking(true);
    assert!(b.recv(Some(Duration::ZERO)).unwrap().is_none());
    let writer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        a.send(b"late", T).unwrap();
        a.flush(T).unwrap();
        a
    });
    let cpu = cpu_time();
    let started = Instant::now();
    let w = b.recv(T).unwrap().expect("the late write");
    let mut bytes = [0u8; 4];
    w.copy_to_slice(0, &mut bytes).unwrap();
    assert_eq!(&bytes, b"late");
    drop(w);
    let (waited, spent) = (started.elapsed(), cpu_time() - cpu);
    assert!(waited >= Duration::from_millis(250), "{waited:?}");
    // Spinning would spend the whole wait on this thread's core.
    assert!(spent < waited / 2, "spent {spent:?} of CPU in {waited:?}");
    let _a = writer.join().unwrap();
    b.flush(T).unwrap();
}

/// This thread's CPU time (user + system): the reader's alone. The
/// writer thread's `flush` busy-polls (its channel is not blocking), so
/// the process's time counts its spin too: under a loaded host the ack took
/// long enough for that to fail the test (242 ms of 480).
fn cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0);
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Writes longer than a slot, ends of other sizes and calls before the
/// start are refused with typed errors; the channel stays usable.
#[test]
#[ignore = "needs an RDMA device"]
fn write_channel_refusals() {
    let dev = common::device();
    let pd = dev.ctx.alloc_pd().unwrap();
    assert!(matches!(
        WriteChannel::create(&pd, 0, 64),
        Err(rdma_verbs_runtime::Error::Verbs(Error::OutOfRange { .. }))
    ));
    let mut a = WriteChannel::create(&pd, 2, 64).unwrap();
    let b = WriteChannel::create(&pd, 2, 128).unwrap();
    assert!(matches!(
        a.send(b"early", T),
        Err(rdma_verbs_runtime::Error::Verbs(
            Error::NotReadyToSend { .. }
        ))
    ));
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    common::connect_pair(&dev, a.queue_pair(), b.queue_pair(), access);
    match a.start(b.inbox()) {
        Err(rdma_verbs_runtime::Error::ChannelProtocol {
            problem:
                ChannelProblem::Hello {
                    field: "inbox",
                    ours: 128,
                    theirs: 256,
                },
        }) => {}
        other => panic!("{other:?}"),
    }
    drop((a, b));
    let (mut a, mut c) = channel_pair(2, 64);
    assert!(matches!(
        a.start(c.inbox()),
        Err(rdma_verbs_runtime::Error::Verbs(Error::QueueFull { .. }))
    ));
    assert!(matches!(
        a.send(&[0; 65], T),
        Err(rdma_verbs_runtime::Error::MessageTooLarge { len: 65, max: 64 })
    ));
    a.send(&[7; 64], T).unwrap();
    let w = c.recv(T).unwrap().unwrap();
    let mut x = [0u8; 64];
    assert!(matches!(
        w.copy_to_slice(1, &mut x),
        Err(rdma_verbs_runtime::Error::Verbs(Error::OutOfBounds { .. }))
    ));
    w.copy_to_slice(0, &mut x).unwrap();
    assert_eq!(x, [7; 64]);
}
