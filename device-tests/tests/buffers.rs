//! Buffers (device tests): receives without a buffer, one registration
//! carved into equal buffers and joined back, and typed views of
//! plain-old-data (slices of local and frozen buffers, copies of shared
//! ones).

mod common;

use common::{pair, pattern, remote_all, wait, wait_ok};
use rdma_verbs::{memory::SgList, AccessFlags, Error, QpType, WcOpcode, WcStatus, Wr};

fn local() -> AccessFlags {
    AccessFlags::LOCAL_WRITE
}

/// A write with immediate data consumes an empty receive (no SGE): the
/// bytes land in the target memory, the immediate in the completion, and
/// the completion hands back no buffer. The same on an SRQ; a zero-length
/// send fits an empty receive, a send with a payload does not.
#[test]
#[ignore = "needs an RDMA device"]
fn an_empty_receive_takes_a_write_with_immediate() {
    let p = pair(QpType::Rc, remote_all(), |b| b);
    let target = p.pd.alloc_shared(64, remote_all()).unwrap();
    let remote = target.remote().unwrap();
    let mut sq = p.a.send_queue().unwrap();
    let mut rq = p.b.recv_queue().unwrap();
    rq.recv_empty(5).unwrap();
    assert_eq!(p.b.recv_outstanding(), 1);
    let mut src = p.pd.alloc(8, local()).unwrap();
    src.copy_from_slice(b"imm-data");
    sq.write(
        src,
        remote.slice(16, 8).unwrap(),
        Wr::id(0).imm(0x00c0_ffee),
    )
    .unwrap();
    wait_ok(&p.cq_a);
    let mut r = wait_ok(&p.cq_b);
    assert_eq!(
        (r.wr_id(), r.opcode(), r.imm_data()),
        (5, WcOpcode::RecvRdmaWithImm, Some(0x00c0_ffee))
    );
    eprintln!(
        "byte_len of the write's receive completion: {}",
        r.byte_len()
    );
    assert!(matches!(r.take_buffers(), SgList::Empty));
    assert_eq!(p.b.recv_outstanding(), 0);
    let mut got = [0u8; 8];
    target.copy_to_slice(16, &mut got).unwrap();
    assert_eq!(&got, b"imm-data");

    // A zero-length send: fits.
    rq.recv_empty(6).unwrap();
    sq.send_inline(b"", Wr::id(0).imm(1)).unwrap();
    wait_ok(&p.cq_a);
    let r = wait_ok(&p.cq_b);
    assert_eq!((r.wr_id(), r.byte_len(), r.imm_data()), (6, 0, Some(1)));

    // A send with a payload: no room for it (rxe reports a local QP
    // operation error at the receiver, a remote operation error at the
    // sender).
    rq.recv_empty(7).unwrap();
    sq.send_inline(b"x", Wr::id(0)).unwrap();
    let r = wait(&p.cq_b, 1).pop().unwrap();
    let s = wait(&p.cq_a, 1).pop().unwrap();
    eprintln!(
        "a payload into an empty receive: receiver {:?}, sender {:?}",
        r.status(),
        s.status()
    );
    assert_eq!(r.wr_id(), 7);
    assert!(!r.is_success() && !s.is_success());
    if common::is_rxe(&p.dev) {
        assert_eq!(
            (r.status(), s.status()),
            (WcStatus::LocQpOpErr, WcStatus::RemOpErr)
        );
    }

    // Through an SRQ.
    let dev = &p.dev;
    let srq = p.pd.create_srq(4).build().unwrap();
    let cq = dev.ctx.create_cq(256).build().unwrap();
    let a = p.pd.create_qp(QpType::Rc, &cq, &cq).build().unwrap();
    let b =
        p.pd.create_qp(QpType::Rc, &cq, &cq)
            .srq(&srq)
            .build()
            .unwrap();
    common::connect_pair(dev, &a, &b, remote_all());
    srq.recv_queue().unwrap().recv_empty(8).unwrap();
    a.send_queue()
        .unwrap()
        .write(
            p.pd.alloc(4, local()).unwrap(),
            remote.slice(0, 4).unwrap(),
            Wr::id(10).imm(9),
        )
        .unwrap();
    let mut got = wait(&cq, 2);
    got.sort_by_key(|c| c.wr_id());
    assert!(got.iter().all(|c| c.is_success()), "{got:?}");
    assert_eq!((got[0].wr_id(), got[0].imm_data()), (8, Some(9)));
}

/// One registration carved into equal buffers, each posted on its own,
/// and joined back once they all returned; the remainder comes back too.
#[test]
#[ignore = "needs an RDMA device"]
fn chunks_of_one_registration_post_independently_and_join_back() {
    let p = pair(QpType::Rc, local(), |b| b.max_recv_wr(8).max_send_wr(8));
    let whole = p.pd.alloc(4 * 256 + 100, local()).unwrap();
    let (addr, lkey) = (whole.addr(), whole.lkey());
    let (chunks, rest) = whole.chunks_exact(256);
    assert_eq!(chunks.len(), 4);
    for (i, c) in chunks.iter().enumerate() {
        assert_eq!(
            (c.addr(), c.len(), c.lkey()),
            (addr + 256 * i as u64, 256, lkey)
        );
    }
    assert_eq!((rest.addr(), rest.len()), (addr + 1024, 100));
    let mut sq = p.a.send_queue().unwrap();
    let mut rq = p.b.recv_queue().unwrap();
    for (i, c) in chunks.into_iter().enumerate() {
        rq.recv(c, i as u64).unwrap();
    }
    for i in 0..4u8 {
        let mut m = p.pd.alloc(256, local()).unwrap();
        m.copy_from_slice(&pattern(256, i));
        sq.send(m, Wr::id(0)).unwrap();
    }
    wait(&p.cq_a, 4);
    let mut back: Vec<_> = wait(&p.cq_b, 4)
        .into_iter()
        .map(|mut c| (c.wr_id(), c.take_local().unwrap()))
        .collect();
    // Out of order: refused, the pieces handed back untouched.
    back.sort_by_key(|(i, _)| std::cmp::Reverse(*i));
    let pieces: Vec<_> = back.into_iter().map(|(_, b)| b).collect();
    let mut pieces = rdma_verbs::LocalBuffer::join(pieces).unwrap_err();
    assert_eq!(pieces.len(), 4);
    pieces.reverse();
    pieces.push(rest);
    let joined = rdma_verbs::LocalBuffer::join(pieces).unwrap();
    assert_eq!((joined.addr(), joined.len()), (addr, 1124));
    for i in 0..4u8 {
        let at = 256 * i as usize;
        assert_eq!(&joined[at..at + 256], &pattern(256, i)[..]);
    }
    // An exact multiple leaves an empty remainder; chunks of another
    // registration do not join; none is no buffer.
    let (chunks, rest) = joined.chunks_exact(562);
    assert_eq!((chunks.len(), rest.len()), (2, 0));
    let other = p.pd.alloc(562, local()).unwrap();
    let mixed = vec![chunks.into_iter().next().unwrap(), other];
    assert_eq!(rdma_verbs::LocalBuffer::join(mixed).unwrap_err().len(), 2);
    assert!(rdma_verbs::LocalBuffer::join(Vec::new()).is_err());

    // Shared buffers carve the same way.
    let shared = p.pd.alloc_shared(64, remote_all()).unwrap();
    let (parts, rest) = shared.chunks_exact(16);
    assert_eq!((parts.len(), rest.len()), (4, 0));
    let mut parts = parts;
    parts.push(rest);
    assert_eq!(rdma_verbs::SharedBuffer::join(parts).unwrap().len(), 64);
}

/// Typed views: `f32`s written through a slice of a local buffer cross an
/// RDMA write into a shared buffer, come out with `read_into` (at any
/// offset), go back in with `write_from`, and an RDMA read brings them to
/// a buffer viewed as `f32`s again; misaligned and ragged views are
/// refused with their numbers.
#[test]
#[ignore = "needs an RDMA device"]
fn typed_views_of_plain_old_data() {
    let p = pair(QpType::Rc, remote_all(), |b| b);
    let values: Vec<f32> = (0..64).map(|i| i as f32 * 0.5 - 3.0).collect();
    let mut src = p.pd.alloc(256, local()).unwrap();
    src.as_mut_slice_of::<f32>()
        .unwrap()
        .copy_from_slice(&values);
    assert_eq!(src.as_slice_of::<f32>().unwrap(), &values[..]);
    let frozen = src.freeze();
    assert_eq!(frozen.as_slice_of::<u32>().unwrap()[1], values[1].to_bits());

    let mut target = p.pd.alloc_shared(512, remote_all()).unwrap();
    let remote = target.remote().unwrap();
    let mut sq = p.a.send_queue().unwrap();
    sq.write(frozen.clone(), remote.slice(3, 256).unwrap(), Wr::id(0))
        .unwrap();
    wait_ok(&p.cq_a);
    let mut out = vec![0f32; 64];
    target.read_into(3, &mut out).unwrap(); // offset 3: no alignment needed
    assert_eq!(out, values);
    let doubled: Vec<f32> = values.iter().map(|v| v * 2.0).collect();
    target.write_from(256, &doubled).unwrap();
    sq.read(
        p.pd.alloc(256, local()).unwrap(),
        remote.slice(256, 256).unwrap(),
        Wr::id(0),
    )
    .unwrap();
    let mut c = wait_ok(&p.cq_a);
    let back = c.take_local().unwrap();
    assert_eq!(back.as_slice_of::<f32>().unwrap(), &doubled[..]);
    let mut word = [0u64; 1];
    assert!(target.read_into(505, &mut word).is_err(), "out of bounds");

    // Refused with their numbers.
    let (_, mut odd) = p.pd.alloc(64, local()).unwrap().split_at(1);
    let addr = odd.addr();
    match odd.as_slice_of::<u32>() {
        Err(Error::Misaligned { addr: a, align: 4 }) => assert_eq!(a, addr),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        odd.as_mut_slice_of::<u64>(),
        Err(Error::Misaligned { align: 8, .. })
    ));
    assert_eq!(odd.as_slice_of::<u8>().unwrap().len(), 63);
    let (six, _) = p.pd.alloc(8, local()).unwrap().split_at(6);
    assert!(matches!(
        six.as_slice_of::<u32>(),
        Err(Error::LengthNotMultiple { len: 6, size: 4 })
    ));
    assert!(matches!(
        six.freeze().as_slice_of::<[u8; 4]>(),
        Err(Error::LengthNotMultiple { len: 6, size: 4 })
    ));
}
