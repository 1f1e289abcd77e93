//! Fork safety (issue #22, item 2): `fork_init` as the process's first
//! call, then RC traffic over registered memory while the process forks —
//! children started through `std::process::Command` (a real `fork()` and
//! through `posix_spawn`) and raw `libc::fork()` children that only
//! `_exit` — and every byte the parent sends, receives, writes and reads
//! checked, before, during and after the forks.
//!
//! One test in this executable, on purpose: `fork_init` acts only before
//! the library's first verbs call in the process, so nothing else may run
//! first.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{pair, path_tool, pattern, process, remote_all, wait};
use rdma_verbs::{
    device::ForkStatus, AccessFlags, LocalBuffer, QpType, RecvQueue, SendQueue, SharedBuffer,
    WcOpcode, Wr,
};

/// Message size: a page each, so that each buffer is its own page set.
const LEN: usize = 4096;
/// Buffers in flight per direction per round.
const K: usize = 4;

/// One round of traffic over buffers the parent writes with the CPU
/// before each post (so any page the device uses is written by the parent
/// too: the case copy-on-write used to break): `K` sends into `K`
/// receives, `K` RDMA writes into the peer's shared target and `K` RDMA
/// reads back; every byte compared. Returns the buffers for the next round.
struct Traffic {
    p: common::Pair,
    /// The send queue of `p.a` and the receive queue of `p.b`.
    sq: SendQueue,
    rq: RecvQueue,
    sends: Vec<LocalBuffer>,
    recvs: Vec<LocalBuffer>,
    reads: Vec<LocalBuffer>,
    target: SharedBuffer,
}

impl Traffic {
    fn new() -> Traffic {
        let p = pair(QpType::Rc, remote_all(), |b| {
            b.max_send_wr(4 * K as u32).max_recv_wr(4 * K as u32)
        });
        let alloc = |n: usize| -> Vec<LocalBuffer> {
            (0..n)
                .map(|_| p.pd.alloc(LEN, AccessFlags::LOCAL_WRITE).unwrap())
                .collect()
        };
        let (sends, recvs, reads) = (alloc(K), alloc(K), alloc(K));
        let target = p.pd.alloc_shared(K * LEN, remote_all()).unwrap();
        let sq = p.a.send_queue().unwrap();
        let rq = p.b.recv_queue().unwrap();
        Traffic {
            p,
            sq,
            rq,
            sends,
            recvs,
            reads,
            target,
        }
    }

    fn round(&mut self, round: u64) {
        let seed = |k: usize| (round as u8).wrapping_mul(7).wrapping_add(k as u8);
        let remote = self.target.remote().unwrap();
        for (k, mut r) in self.recvs.drain(..).enumerate() {
            r.fill(0xEE);
            self.rq.recv(r, k as u64).unwrap();
        }
        for (k, mut s) in self.sends.drain(..).enumerate() {
            s.copy_from_slice(&pattern(LEN, seed(k)));
            self.sq.send(s, Wr::id(k as u64)).unwrap();
        }
        let mut sends: Vec<Option<LocalBuffer>> = (0..K).map(|_| None).collect();
        for mut c in wait(&self.p.cq_a, K) {
            c.result()
                .unwrap_or_else(|e| panic!("round {round}: {e}: {c:?}"));
            sends[c.wr_id() as usize] = c.take_local();
        }
        for mut c in wait(&self.p.cq_b, K) {
            c.result()
                .unwrap_or_else(|e| panic!("round {round}: {e}: {c:?}"));
            let k = c.wr_id() as usize;
            let got = c.take_local().unwrap();
            assert_eq!(c.opcode(), WcOpcode::Recv);
            assert!(
                got[..] == pattern(LEN, seed(k))[..],
                "round {round}: receive {k} differs from what was sent"
            );
            self.recvs.push(got);
        }
        // The send buffers again, as RDMA writes into the peer's target
        // (a different pattern), then read back into buffers zeroed first.
        for (k, s) in sends.into_iter().enumerate() {
            let mut s = s.expect("every send completed once");
            s.copy_from_slice(&pattern(LEN, seed(k) ^ 0x5A));
            let dst = remote.slice((k * LEN) as u64, LEN as u64).unwrap();
            self.sq.write(s, dst, Wr::id(100 + k as u64)).unwrap();
        }
        let mut written: Vec<Option<LocalBuffer>> = (0..K).map(|_| None).collect();
        for mut c in wait(&self.p.cq_a, K) {
            c.result()
                .unwrap_or_else(|e| panic!("round {round}: {e}: {c:?}"));
            written[c.wr_id() as usize - 100] = c.take_local();
        }
        self.sends = written.into_iter().map(Option::unwrap).collect();
        // The target as the parent's CPU sees it: the device's writes.
        let mut seen = vec![0u8; LEN];
        for k in 0..K {
            self.target.copy_to_slice(k * LEN, &mut seen).unwrap();
            assert!(
                seen == pattern(LEN, seed(k) ^ 0x5A),
                "round {round}: the parent does not see RDMA write {k} in its target"
            );
        }
        for (k, mut r) in self.reads.drain(..).enumerate() {
            r.fill(0);
            let src = remote.slice((k * LEN) as u64, LEN as u64).unwrap();
            self.sq.read(r, src, Wr::id(200 + k as u64)).unwrap();
        }
        let mut reads: Vec<Option<LocalBuffer>> = (0..K).map(|_| None).collect();
        for mut c in wait(&self.p.cq_a, K) {
            c.result()
                .unwrap_or_else(|e| panic!("round {round}: {e}: {c:?}"));
            let k = c.wr_id() as usize - 200;
            let got = c.take_local().unwrap();
            assert!(
                got[..] == pattern(LEN, seed(k) ^ 0x5A)[..],
                "round {round}: RDMA read {k} differs from what was written"
            );
            reads[k] = Some(got);
        }
        self.reads = reads.into_iter().map(Option::unwrap).collect();
    }
}

/// A raw `fork()` whose child only `_exit`s; returns its exit status.
fn fork_and_exit() -> i32 {
    // SAFETY: the child calls only `_exit` (async-signal-safe), so the
    // multi-threaded parent's state (locks, allocator) is never used there.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        // SAFETY: in the child: ends it at once, no destructors, no atexit.
        unsafe { libc::_exit(7) };
    }
    let mut status = 0;
    // SAFETY: our own child; `status` is a valid out-pointer.
    let r = unsafe { libc::waitpid(pid, &mut status, 0) };
    assert_eq!(r, pid, "waitpid: {}", std::io::Error::last_os_error());
    assert!(libc::WIFEXITED(status), "child status {status:#x}");
    libc::WEXITSTATUS(status)
}

#[test]
#[ignore = "needs an RDMA device"]
fn fork_and_spawn_while_rc_traffic_runs_keep_the_parents_data_path() {
    // The process's first call into the library.
    let before = rdma_verbs::device::fork_status();
    let status = rdma_verbs::device::fork_init().expect("fork_init as the first call");
    eprintln!("fork status before: {before:?}; fork_init: {status:?}");
    assert!(status.is_fork_safe(), "{status:?}");
    assert_eq!(rdma_verbs::device::fork_status(), status);
    if before == ForkStatus::Unneeded {
        // The kernel copies pinned pages at fork: nothing to enable.
        assert_eq!(status, ForkStatus::Unneeded);
    }
    let mut traffic = Traffic::new();
    traffic.round(0);
    // Now late: the library has called into libibverbs. Already safe, so
    // it says so again (it refuses only when fork support is off).
    assert_eq!(rdma_verbs::device::fork_init().unwrap(), status);
    if status == ForkStatus::Unneeded {
        // What rdma-core itself does when called after registrations with
        // the kernel copying pinned pages: rdma-core 44 refuses (EINVAL),
        // 52 and later return 0 and do nothing. Called while no other
        // thread uses verbs (the traffic thread starts below).
        // SAFETY: no other verbs call runs now.
        let rc = unsafe { rdma_verbs::sys::ibv_fork_init() };
        eprintln!("rdma-core's own ibv_fork_init after registrations: {rc}");
        assert!(rc == 0 || rc == libc::EINVAL, "{rc}");
        assert_eq!(rdma_verbs::device::fork_status(), ForkStatus::Unneeded);
    }

    let stop = Arc::new(AtomicBool::new(false));
    let rounds = Arc::new(AtomicU64::new(1));
    let worker = {
        let (stop, rounds) = (stop.clone(), rounds.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Acquire) {
                let r = rounds.load(Ordering::Relaxed);
                traffic.round(r);
                rounds.store(r + 1, Ordering::Release);
            }
            traffic
        })
    };
    let wait_rounds = |n: u64| {
        let until = rounds.load(Ordering::Acquire) + n;
        let deadline = Instant::now() + Duration::from_secs(120);
        while rounds.load(Ordering::Acquire) < until {
            // A wrong byte panics the traffic thread (its message is
            // printed above): stop here too.
            assert!(!worker.is_finished(), "the traffic thread stopped");
            assert!(Instant::now() < deadline, "traffic stalled");
            std::thread::sleep(Duration::from_millis(1));
        }
    };
    wait_rounds(10);
    let at_first_fork = rounds.load(Ordering::Acquire);
    let sleep = path_tool("sleep");
    let mut raw = 0;
    for i in 0..10 {
        // A child started through a real fork() (then exec), one through
        // posix_spawn, and raw forks, all while rounds run.
        let forked = process::spawn_forked(&sleep, &["0.05".into()]);
        let spawned = process::spawn(&sleep, &["0.05".into()]);
        for _ in 0..5 {
            assert_eq!(fork_and_exit(), 7);
            raw += 1;
        }
        forked.finish(Duration::from_secs(30)).assert_success();
        spawned.finish(Duration::from_secs(30)).assert_success();
        eprintln!(
            "fork batch {i}: {} rounds so far",
            rounds.load(Ordering::Acquire)
        );
    }
    let at_last_fork = rounds.load(Ordering::Acquire);
    // Many more rounds after the last fork, every byte checked.
    wait_rounds(100);
    stop.store(true, Ordering::Release);
    let traffic = worker
        .join()
        .expect("the traffic thread found a wrong byte");
    let total = rounds.load(Ordering::Acquire);
    eprintln!(
        "{total} rounds ({} bytes checked each); forks from round {at_first_fork} to \
         {at_last_fork}: 10 Command children forked, 10 spawned, {raw} raw",
        K * LEN * 4
    );
    assert!(total >= at_last_fork + 100);
    drop(traffic);
}
