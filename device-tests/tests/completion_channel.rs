//! Completion channels with traffic (device tests): the channel's fd wakes
//! `poll(2)` for armed CQs, `get_event` names the CQ, solicited-only arming
//! ignores unsolicited completions, and events are acknowledged so that
//! destroying the CQ never hangs (a watchdog aborts the process if it does).

mod common;

use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use rdma_verbs::{
    cq::{CompletionChannel, CompletionRef},
    AccessFlags, Completion, CompletionQueue, Completions, LocalBuffer, ProtectionDomain, QpType,
    QueuePair, WcOpcode, Wr,
};

/// Aborts the whole process unless disarmed (dropped) within `limit`:
/// a hang in `ibv_destroy_cq` would otherwise hang the test run.
struct Watchdog {
    done: Arc<(Mutex<bool>, Condvar)>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watchdog {
    fn new(what: &'static str, limit: Duration) -> Watchdog {
        let done = Arc::new((Mutex::new(false), Condvar::new()));
        let d = done.clone();
        let thread = std::thread::spawn(move || {
            let (lock, cv) = &*d;
            let guard = lock.lock().unwrap();
            let (guard, _) = cv.wait_timeout_while(guard, limit, |done| !*done).unwrap();
            if !*guard {
                eprintln!("WATCHDOG: {what} did not finish within {limit:?}: aborting");
                std::process::abort();
            }
        });
        Watchdog {
            done,
            thread: Some(thread),
        }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        *self.done.0.lock().unwrap() = true;
        self.done.1.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Whether `fd` becomes readable within `timeout_ms`.
fn readable(fd: RawFd, timeout_ms: i32) -> bool {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    let n = unsafe { libc::poll(&mut pfd, 1, timeout_ms) };
    assert!(n >= 0, "poll: {}", std::io::Error::last_os_error());
    n == 1 && pfd.revents & libc::POLLIN != 0
}

/// An RC pair whose CQs report to `ch` (both, or only the receiver's).
struct Wired {
    _dev: common::TestDevice,
    pd: ProtectionDomain,
    ch: CompletionChannel,
    cq_a: CompletionQueue,
    cq_b: CompletionQueue,
    a: QueuePair,
    b: QueuePair,
}

fn wired(sender_on_channel: bool) -> Wired {
    let dev = common::device();
    let pd = dev.ctx.alloc_pd().unwrap();
    let ch = dev.ctx.create_comp_channel().unwrap();
    ch.set_nonblocking(true).unwrap();
    let cq_a = if sender_on_channel {
        dev.ctx.create_cq(256).channel(&ch).build().unwrap()
    } else {
        dev.ctx.create_cq(256).build().unwrap()
    };
    let cq_b = dev.ctx.create_cq(256).channel(&ch).build().unwrap();
    let a = pd.create_qp(QpType::Rc, &cq_a, &cq_a).build().unwrap();
    let b = pd.create_qp(QpType::Rc, &cq_b, &cq_b).build().unwrap();
    common::connect_pair(&dev, &a, &b, AccessFlags::LOCAL_WRITE);
    Wired {
        _dev: dev,
        pd,
        ch,
        cq_a,
        cq_b,
        a,
        b,
    }
}

impl Wired {
    /// Posts a receive into `buf` on `b`, through a handle taken for it
    /// (none is kept: the tests drop the queue pairs in a given order).
    fn recv(&self, buf: LocalBuffer, wr_id: u64) {
        self.b.recv_queue().unwrap().recv(buf, wr_id).unwrap();
    }

    /// Sends `buf` from `a` with `o`, through a handle taken for it.
    fn send(&self, buf: LocalBuffer, o: Wr) {
        self.a.send_queue().unwrap().send(buf, o).unwrap();
    }
}

fn buf(pd: &ProtectionDomain, fill: u8) -> LocalBuffer {
    let mut b = pd.alloc(64, AccessFlags::LOCAL_WRITE).unwrap();
    b.fill(fill);
    b
}

/// Polls `cq` until empty (without waiting), keeping what came, owned.
fn drain(cq: &CompletionQueue, batch: &mut Completions) -> Vec<Completion> {
    let mut out = Vec::new();
    loop {
        let polled = cq.poll(batch).unwrap();
        if polled.is_empty() {
            break;
        }
        out.extend(polled.map(CompletionRef::into_owned));
    }
    out
}

/// `cq.wait` into `out`, keeping what came, owned.
fn wait_owned(
    cq: &CompletionQueue,
    out: &mut Completions,
    timeout: Option<Duration>,
) -> Vec<Completion> {
    cq.wait(out, timeout)
        .unwrap()
        .map(CompletionRef::into_owned)
        .collect()
}

/// Drops everything under a 10 s watchdog.
fn drop_all(w: Wired) {
    let dog = Watchdog::new("dropping the QPs, CQs and channel", Duration::from_secs(10));
    drop(w);
    drop(dog);
}

#[test]
#[ignore = "needs an RDMA device"]
fn event_wakes_poll_and_names_the_cq() {
    let w = wired(true);
    let fd = w.ch.as_raw_fd();
    w.cq_a.req_notify(false).unwrap();
    assert!(!readable(fd, 0), "no event before any completion");
    w.recv(buf(&w.pd, 0), 0);
    w.send(buf(&w.pd, 0x5A), Wr::id(7));
    assert!(
        readable(fd, 5000),
        "the channel fd becomes readable for the armed CQ's completion"
    );
    let cq = w.ch.get_event().unwrap().expect("the event's CQ is alive");
    assert_eq!(
        cq.as_ptr(),
        w.cq_a.as_ptr(),
        "get_event names the sender's CQ"
    );
    cq.req_notify(false).unwrap();
    let mut batch = Completions::with_capacity(8);
    let mut got = drain(&cq, &mut batch);
    assert_eq!(got.len(), 1, "one send completion: {got:?}");
    let c = &mut got[0];
    c.result().unwrap();
    assert_eq!((c.wr_id(), c.opcode()), (7, WcOpcode::Send));
    assert_eq!(c.take_local().unwrap()[0], 0x5A);
    // The receiver's CQ was never armed: no event for it.
    let r = common::wait_ok(&w.cq_b);
    assert_eq!(r.byte_len(), 64);
    assert!(
        !readable(fd, 100),
        "no further event: the re-armed CQ had no new completion, cq_b was not armed"
    );
    let err = w.ch.get_event().unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EAGAIN), "{err}");
    drop(cq);
    drop_all(w);
}

#[test]
#[ignore = "needs an RDMA device"]
fn solicited_only_ignores_unsolicited_completions() {
    let w = wired(false);
    let fd = w.ch.as_raw_fd();
    for i in 0..2 {
        w.recv(buf(&w.pd, 0), i);
    }
    w.cq_b.req_notify(true).unwrap();
    // Unsolicited: the RC ACK (sender's completion) proves it arrived.
    w.send(buf(&w.pd, 1), Wr::id(1));
    common::wait_ok(&w.cq_a);
    assert!(
        !readable(fd, 200),
        "an unsolicited receive must not wake a solicited-only CQ"
    );
    // Solicited: wakes it.
    w.send(buf(&w.pd, 2), Wr::id(2).solicited());
    common::wait_ok(&w.cq_a);
    assert!(
        readable(fd, 5000),
        "a solicited receive wakes the solicited-only CQ"
    );
    let cq = w.ch.get_event().unwrap().expect("live CQ");
    assert_eq!(cq.as_ptr(), w.cq_b.as_ptr(), "event for the receiver's CQ");
    let mut batch = Completions::with_capacity(8);
    let mut got = drain(&w.cq_b, &mut batch);
    assert_eq!(got.len(), 2, "both receives completed: {got:?}");
    for (i, c) in got.iter_mut().enumerate() {
        c.result().unwrap();
        assert_eq!(c.wr_id(), i as u64);
        assert!(
            c.take_local().unwrap().iter().all(|&x| x == i as u8 + 1),
            "receive {i} holds message {}",
            i + 1
        );
    }
    assert!(!readable(fd, 100), "exactly one event");
    drop(cq);
    drop_all(w);
}

#[test]
#[ignore = "needs an RDMA device"]
fn unacknowledged_event_does_not_block_destroy() {
    // One event taken with get_event and never explicitly acknowledged:
    // dropping the CQ must acknowledge it (ibv_destroy_cq waits otherwise).
    let w = wired(true);
    w.cq_a.req_notify(false).unwrap();
    w.recv(buf(&w.pd, 0), 0);
    w.send(buf(&w.pd, 3), Wr::id(0));
    assert!(readable(w.ch.as_raw_fd(), 5000), "event arrives");
    let cq = w.ch.get_event().unwrap().expect("live CQ");
    assert_eq!(cq.as_ptr(), w.cq_a.as_ptr());
    common::wait_ok(&w.cq_a);
    common::wait_ok(&w.cq_b);
    // Drop the handle get_event returned before the others, and the
    // channel before its CQs.
    let dog = Watchdog::new(
        "destroying a CQ with an unacked event",
        Duration::from_secs(10),
    );
    drop(cq);
    let Wired {
        _dev,
        pd,
        ch,
        cq_a,
        cq_b,
        a,
        b,
    } = w;
    drop(ch);
    drop(a);
    drop(cq_a);
    drop(b);
    drop(cq_b);
    drop(pd);
    drop(dog);
}

#[test]
#[ignore = "needs an RDMA device"]
fn unread_event_does_not_block_destroy() {
    // An event pending in the channel, never read by get_event.
    let w = wired(true);
    w.cq_a.req_notify(false).unwrap();
    w.cq_b.req_notify(false).unwrap();
    w.recv(buf(&w.pd, 0), 0);
    w.send(buf(&w.pd, 4), Wr::id(0));
    common::wait_ok(&w.cq_a);
    common::wait_ok(&w.cq_b);
    assert!(readable(w.ch.as_raw_fd(), 5000), "events pending");
    let ch = w.ch.clone();
    drop_all(w);
    // The CQs are gone; their pending events went with them.
    match ch.get_event() {
        Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EAGAIN), "{e}"),
        Ok(cq) => panic!("an event for a destroyed CQ: {cq:?}"),
    }
}

#[test]
#[ignore = "needs an RDMA device"]
fn many_events_on_two_cqs_then_drop() {
    // 200 round trips, each producing one event on each of two CQs sharing
    // the channel: 400 events, more than the 64-event acknowledgement batch.
    const ROUNDS: usize = 200;
    let w = wired(true);
    let fd = w.ch.as_raw_fd();
    let mut batch = Completions::with_capacity(8);
    let mut events = [0usize; 2];
    let mut send = Some(buf(&w.pd, 0));
    let mut recv = Some(buf(&w.pd, 0));
    w.cq_a.req_notify(false).unwrap();
    w.cq_b.req_notify(false).unwrap();
    for round in 0..ROUNDS {
        let mut s = send.take().unwrap();
        s[..8].copy_from_slice(&(round as u64).to_le_bytes());
        w.recv(recv.take().unwrap(), round as u64);
        w.send(s, Wr::id(round as u64));
        let deadline = Instant::now() + Duration::from_secs(10);
        while send.is_none() || recv.is_none() {
            assert!(
                Instant::now() < deadline,
                "round {round}: timed out (events so far {events:?})"
            );
            if !readable(fd, 1000) {
                continue;
            }
            let cq = match w.ch.get_event() {
                Ok(cq) => cq.expect("event for a live CQ"),
                Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => continue,
                Err(e) => panic!("get_event: {e}"),
            };
            // Re-arm first, then poll: no completion is missed.
            cq.req_notify(false).unwrap();
            let which = if cq.as_ptr() == w.cq_a.as_ptr() {
                0
            } else {
                assert_eq!(cq.as_ptr(), w.cq_b.as_ptr(), "event for an unknown CQ");
                1
            };
            events[which] += 1;
            for mut c in drain(&cq, &mut batch) {
                c.result()
                    .unwrap_or_else(|e| panic!("round {round}: {e}: {c:?}"));
                assert_eq!(c.wr_id(), round as u64, "completion of round {round}");
                let b = c.take_local().expect("buffer back");
                assert_eq!(b[..8], (round as u64).to_le_bytes(), "round {round} data");
                if which == 0 {
                    send = Some(b);
                } else {
                    recv = Some(b);
                }
            }
        }
    }
    assert_eq!(
        events,
        [ROUNDS, ROUNDS],
        "one event per CQ per round (sender, receiver)"
    );
    assert!(!readable(fd, 100), "no stray event");
    // 200 events per CQ: 3 batches of 64 were acknowledged, 8 per CQ are
    // left for the CQs' destruction to acknowledge.
    drop(send);
    drop(recv);
    drop_all(w);
}

#[test]
#[ignore = "needs an RDMA device"]
fn destroy_waits_for_the_ack_of_an_event_read() {
    // What `get_event` relies on to upgrade the `Weak` the library keeps
    // in each CQ's `cq_context` without a lock: an event read from the
    // channel keeps `ibv_destroy_cq` waiting until it is acknowledged, so
    // the CQ outlives every event read for it. The event is read here
    // through the C API; every handle is dropped on another thread, which
    // must block in `ibv_destroy_cq` until the acknowledgement.
    let w = wired(true);
    w.cq_a.req_notify(false).unwrap();
    w.recv(buf(&w.pd, 0), 0);
    w.send(buf(&w.pd, 6), Wr::id(0));
    common::wait_ok(&w.cq_a);
    common::wait_ok(&w.cq_b);
    assert!(readable(w.ch.as_raw_fd(), 5000), "event arrives");
    let mut cq = std::ptr::null_mut();
    let mut cq_context = std::ptr::null_mut();
    // SAFETY: live channel, valid out-pointers; the event is acknowledged
    // below (the contract of `CompletionChannel::as_ptr`).
    let rc = unsafe { rdma_verbs_sys::ibv_get_cq_event(w.ch.as_ptr(), &mut cq, &mut cq_context) };
    assert_eq!(rc, 0, "ibv_get_cq_event");
    assert_eq!(cq, w.cq_a.as_ptr());
    assert!(!cq_context.is_null(), "the library's cq_context");
    let ch = w.ch.clone();
    let dropper = std::thread::spawn(move || drop(w));
    std::thread::sleep(Duration::from_millis(300));
    // Checked before the acknowledgement: had the destroy returned, the
    // CQ would be gone.
    assert!(
        !dropper.is_finished(),
        "ibv_destroy_cq returned with an event unacknowledged"
    );
    let dog = Watchdog::new(
        "destroying a CQ once its event is acked",
        Duration::from_secs(10),
    );
    // SAFETY: the event read above, acknowledged once; the CQ is not
    // destroyed before this acknowledgement.
    unsafe { rdma_verbs_sys::ibv_ack_cq_events(cq, 1) };
    dropper.join().unwrap();
    drop(dog);
    match ch.get_event() {
        Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EAGAIN), "{e}"),
        Ok(cq) => panic!("an event for a destroyed CQ: {cq:?}"),
    }
}

// ---- CompletionQueue::wait ----

/// CPU time the calling thread has used (user and system).
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime: {}", std::io::Error::last_os_error());
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// The receiver's CQ alone reports to the channel, which is left in its
/// default (blocking) mode; the sender's CQ has no channel.
fn own_channel() -> Wired {
    let w = wired(false);
    w.ch.set_nonblocking(false).unwrap();
    w
}

/// Sends `msg` from `w.a` (posting a receive on `w.b` first is the
/// caller's) and takes the send buffer back.
fn send_and_reap(w: &Wired, msg: LocalBuffer, wr_id: u64) -> LocalBuffer {
    w.send(msg, Wr::id(wr_id));
    let mut c = common::wait_ok(&w.cq_a);
    c.take_local().expect("send buffer back")
}

/// The one receive completion of `out`, checked: `wr_id` and first byte.
fn one_receive(mut out: Vec<Completion>, wr_id: u64, fill: u8) -> LocalBuffer {
    assert_eq!(out.len(), 1, "{out:?}");
    let mut c = out.pop().unwrap();
    c.result().unwrap_or_else(|e| panic!("{e}: {c:?}"));
    assert_eq!((c.wr_id(), c.opcode()), (wr_id, WcOpcode::Recv));
    let b = c.take_local().expect("receive buffer back");
    assert_eq!(b[0], fill, "the message of {wr_id}");
    b
}

#[test]
#[ignore = "needs an RDMA device"]
fn wait_returns_completions_from_before_and_during_the_wait() {
    let w = own_channel();
    let mut out = Completions::with_capacity(4);
    let mut rbuf = buf(&w.pd, 0);
    let mut sbuf = buf(&w.pd, 0);
    // Before: the receive completed before the wait began (the sender's
    // completion follows the receiver's ACK).
    w.recv(rbuf, 1);
    sbuf.fill(1);
    sbuf = send_and_reap(&w, sbuf, 1);
    std::thread::sleep(Duration::from_millis(50));
    let t = Instant::now();
    let got = wait_owned(&w.cq_b, &mut out, Some(Duration::from_secs(10)));
    assert_eq!(got.len(), 1);
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    rbuf = one_receive(got, 1, 1);
    // During: another thread sends 200 ms into the wait, which sleeps on
    // the channel (with a deadline, then without).
    for (round, timeout) in [(2u64, Some(Duration::from_secs(10))), (3, None)] {
        w.recv(rbuf, round);
        sbuf.fill(round as u8);
        let t = Instant::now();
        let cpu = thread_cpu();
        let (got, back) = std::thread::scope(|s| {
            let sender = s.spawn(|| {
                std::thread::sleep(Duration::from_millis(200));
                send_and_reap(&w, sbuf, round)
            });
            let got = wait_owned(&w.cq_b, &mut out, timeout);
            (got, sender.join().unwrap())
        });
        let (wall, cpu) = (t.elapsed(), thread_cpu() - cpu);
        sbuf = back;
        assert_eq!(got.len(), 1, "round {round}");
        assert!(
            wall >= Duration::from_millis(200) && wall < Duration::from_secs(5),
            "round {round}: woke after {wall:?}"
        );
        assert!(
            cpu < Duration::from_millis(20) + wall / 10,
            "round {round}: {cpu:?} of CPU in {wall:?}: the wait did not sleep"
        );
        rbuf = one_receive(got, round, round as u8);
    }
    drop((rbuf, sbuf));
    drop_all(w);
}

#[test]
#[ignore = "needs an RDMA device"]
fn wait_times_out_asleep_and_refuses_what_it_cannot_wait_on() {
    let w = own_channel();
    let mut out = Completions::with_capacity(4);
    for ms in [0, 300, 600] {
        let timeout = Duration::from_millis(ms);
        let t = Instant::now();
        let cpu = thread_cpu();
        let n = w.cq_b.wait(&mut out, Some(timeout)).unwrap().len();
        let (wall, cpu) = (t.elapsed(), thread_cpu() - cpu);
        assert_eq!(n, 0, "nothing to complete");
        assert!(
            wall >= timeout && wall < timeout + Duration::from_secs(3),
            "{timeout:?} timeout returned after {wall:?}"
        );
        // A loose bound, not a performance gate: a wait that spun would
        // use about as much CPU as wall time.
        assert!(
            cpu < Duration::from_millis(20) + wall / 10,
            "{timeout:?} timeout: {cpu:?} of CPU in {wall:?}: the wait spun"
        );
    }
    // The wait made the channel non-blocking: a read finds nothing.
    let err = w.ch.get_event().unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EAGAIN), "{err}");
    // No channel: nothing to sleep on.
    let err = w
        .cq_a
        .wait(&mut out, Some(Duration::ZERO))
        .expect_err("a wait on a CQ without a channel is refused");
    assert!(
        matches!(
            err,
            rdma_verbs::Error::NoCompletionChannel {
                which: "CQ waited on"
            }
        ),
        "{err:?}"
    );
    drop_all(w);
    // A channel two CQs report to: an event read for the other would be
    // lost to it.
    let w = wired(true);
    let err = w
        .cq_b
        .wait(&mut out, Some(Duration::ZERO))
        .expect_err("a wait on a shared channel is refused");
    assert!(
        matches!(err, rdma_verbs::Error::CompletionChannelShared { cqs: 2 }),
        "{err:?}"
    );
    drop_all(w);
}

#[test]
#[ignore = "needs an RDMA device"]
fn many_waits_acknowledge_their_events() {
    // Each round the receiver waits before the sender sends (3 ms later),
    // so most waits sleep and read an event: more than the 64-event
    // acknowledgement batch. The CQ's destruction must not hang on one
    // left unacknowledged (the watchdog aborts the process if it does).
    const ROUNDS: u64 = 200;
    let w = own_channel();
    let mut out = Completions::with_capacity(4);
    let mut rbuf = buf(&w.pd, 0);
    let mut sbuf = buf(&w.pd, 0);
    let mut slept = 0;
    std::thread::scope(|s| {
        let (go, went) = std::sync::mpsc::channel::<(u64, LocalBuffer)>();
        let (back, came_back) = std::sync::mpsc::channel();
        let w = &w;
        s.spawn(move || {
            for (round, mut b) in went {
                std::thread::sleep(Duration::from_millis(3));
                b.fill(round as u8);
                back.send(send_and_reap(w, b, round)).unwrap();
            }
        });
        for round in 0..ROUNDS {
            w.recv(rbuf, round);
            go.send((round, sbuf)).unwrap();
            let t = Instant::now();
            let got = wait_owned(&w.cq_b, &mut out, Some(Duration::from_secs(10)));
            assert_eq!(got.len(), 1, "round {round}");
            if t.elapsed() >= Duration::from_millis(2) {
                slept += 1;
            }
            rbuf = one_receive(got, round, round as u8);
            sbuf = came_back.recv().unwrap();
        }
        drop(go);
    });
    assert!(
        slept > 64,
        "only {slept} of {ROUNDS} waits slept: the test did not exercise the batch"
    );
    drop_all(w);
}

#[test]
#[ignore = "needs an RDMA device"]
fn wait_finds_a_completion_that_raised_no_event() {
    // The lost wake-up: a completion that lands after a wait's first poll
    // but before it armed the CQ raises no event; only the poll after
    // arming finds it. Two waiters make that moment wide: the second polls
    // (nothing yet) and queues behind the first, which sleeps. Two
    // messages then complete together: the first completion's event wakes
    // the first waiter, whose batch holds one; the second completion
    // raised no event (the event disarmed the CQ) unless it came after the
    // first waiter re-armed, and the second waiter arms after it. Without
    // the poll after arming it would sleep until its deadline.
    const ROUNDS: u64 = 20;
    let w = own_channel();
    let deadline = Duration::from_secs(10);
    for round in 0..ROUNDS {
        let ids = [2 * round, 2 * round + 1];
        for id in ids {
            w.recv(buf(&w.pd, 0), id);
        }
        let (first, second) = std::thread::scope(|s| {
            let waiter = |capacity| {
                let w = &w;
                move || {
                    let mut out = Completions::with_capacity(capacity);
                    let t = Instant::now();
                    let got = wait_owned(&w.cq_b, &mut out, Some(deadline));
                    (got, t.elapsed())
                }
            };
            let first = s.spawn(waiter(1));
            std::thread::sleep(Duration::from_millis(100));
            let second = s.spawn(waiter(4));
            std::thread::sleep(Duration::from_millis(100));
            for id in ids {
                w.send(buf(&w.pd, id as u8), Wr::id(id));
            }
            for c in common::wait(&w.cq_a, 2) {
                c.result().unwrap_or_else(|e| panic!("{e}: {c:?}"));
            }
            (first.join().unwrap(), second.join().unwrap())
        });
        let mut got = Vec::new();
        for (who, (mut out, took)) in [("first", first), ("second", second)] {
            let n = out.len();
            assert_eq!(n, 1, "round {round}: the {who} waiter got {n}: {out:?}");
            assert!(
                took < deadline / 2,
                "round {round}: the {who} waiter slept {took:?} with a completion in the CQ"
            );
            let mut c = out.pop().unwrap();
            c.result().unwrap_or_else(|e| panic!("{e}: {c:?}"));
            assert_eq!(c.take_local().unwrap()[0], c.wr_id() as u8);
            got.push(c.wr_id());
        }
        got.sort();
        assert_eq!(got, ids, "round {round}: each message once");
    }
    drop_all(w);
}
