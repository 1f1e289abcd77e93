//! Completion queues and channels (device tests without traffic; traffic
//! and wake-ups are in the queue pair tests).

mod common;

use std::os::fd::AsRawFd;

use common::{pair, pattern, remote_all};
use ibverbs::{AccessFlags, Completions, QpType, SendRequest, SgList, WcOpcode, WorkCompletion};

/// Polls one completion with `poll_one_into`.
fn poll_into_ok(cq: &ibverbs::CompletionQueue, wc: &mut WorkCompletion) -> SgList {
    let sg = common::poll_until(|| cq.poll_one_into(wc).unwrap());
    assert!(wc.is_success(), "{:?}", wc.status());
    sg
}

#[test]
#[ignore = "needs an RDMA device"]
fn poll_one_into_gives_the_callers_wr_id_and_the_buffers_back() {
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
    p.a.post_send(SendRequest::read(dst, remote.slice(64, 128).unwrap()).wr_id(77))
        .unwrap();
    let back = match poll_into_ok(&p.cq_a, &mut wc) {
        SgList::One(b) => b.into_local().unwrap(),
        other => panic!("buffer not given back: {other:?}"),
    };
    assert_eq!((wc.raw_wr_id(), wc.opcode()), (77, WcOpcode::RdmaRead));
    assert_eq!(&back[..], &pattern(512, 5)[64..192]);
    // A prepared posting: no buffers, its count taken back.
    let mut read =
        p.a.prepare_send(SendRequest::read(back, remote.slice(0, 128).unwrap()).wr_id(78))
            .unwrap();
    for _ in 0..3 {
        read.post().unwrap();
        assert!(matches!(poll_into_ok(&p.cq_a, &mut wc), SgList::Empty));
        assert_eq!(wc.raw_wr_id(), 78);
        assert!(!read.is_posted(), "the completion kept a count");
        assert_eq!(read.bytes(0).unwrap(), &pattern(512, 5)[..128]);
    }
    assert!(p.cq_a.poll_one_into(&mut wc).unwrap().is_none());
}

#[test]
#[ignore = "needs an RDMA device"]
fn create_poll_empty_and_arm() {
    let t = common::device();
    let cq = t.ctx.create_cq(100).build().unwrap();
    assert!(cq.capacity() >= 100);
    let mut out = Completions::with_capacity(8);
    assert_eq!(cq.poll(&mut out).unwrap(), 0);
    let mut raw = [ibverbs::WorkCompletion::default(); 4];
    // SAFETY: no queue pair reports to `cq`.
    assert_eq!(unsafe { cq.poll_raw(&mut raw) }.unwrap(), 0);
    assert!(cq.poll_one_into(&mut raw[0]).unwrap().is_none());
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
