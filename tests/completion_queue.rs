//! Completion queues and channels (device tests without traffic; traffic
//! and wake-ups are in the queue pair tests).

mod common;

use std::os::fd::AsRawFd;

use ibverbs::Completions;

#[test]
#[ignore = "needs an RDMA device"]
fn create_poll_empty_and_arm() {
    let t = common::device();
    let cq = t.ctx.create_cq(100).build().unwrap();
    assert!(cq.capacity() >= 100);
    let mut out = Completions::with_capacity(8);
    assert_eq!(cq.poll(&mut out).unwrap(), 0);
    let mut raw = [ibverbs::WorkCompletion::default(); 4];
    assert_eq!(cq.poll_raw(&mut raw).unwrap(), 0);
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
    let cq = t.ctx.create_cq(16).channel(&ch).build().unwrap();
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
