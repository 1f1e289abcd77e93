//! Scenarios of rdma-core's pyverbs suite about completion queues
//! (`tests/test_cq.py`, `tests/test_cqex.py`) as device tests of this
//! library: CQ sizes 1, `max_cqe / 2` and `max_cqe` on every completion
//! vector the device offers (classic and extended, with and without a
//! completion channel); a size past `max_cqe` and a vector past
//! `num_comp_vectors` refused by the verb with the reason; an extended CQ
//! created with each completion field alone, reading that field and no
//! other; UD traffic polled through an extended CQ. The parity table in
//! docs/testing.md maps each pyverbs test to its counterpart here.

mod common;

use common::{device, TestDevice};
use rdma_verbs::{
    cq::CompletionFields,
    qp::{AddressVector, UdDest},
    AccessFlags, CompletionQueue, Error, QpType, WcOpcode, Wr,
};

/// Bytes of the global route header in front of every UD receive.
const GRH: u32 = 40;
const QKEY: u32 = 0x1111_1111;

/// The sizes pyverbs creates: 1, half the maximum and the maximum.
fn sizes(dev: &TestDevice) -> [u32; 3] {
    let max = dev.ctx.query_device().unwrap().max_cqe();
    [1, max / 2, max]
}

/// The vectors pyverbs creates on: the first two (where there are two)
/// and the last.
fn vectors(dev: &TestDevice) -> Vec<i32> {
    let n = dev.ctx.num_comp_vectors();
    assert!(n >= 1, "num_comp_vectors {n}");
    let mut v: Vec<i32> = (0..n.min(2) as i32).collect();
    v.push(n as i32 - 1);
    v.dedup();
    v
}

/// pyverbs `test_cq.CQAPITest.test_create_cq`, `test_create_cq_with_comp_channel`
/// and, for the extended CQ, `test_cqex.CQEXAPITest.test_create_cq_ex`'s
/// sizes: every size on every valid vector, with and without a channel,
/// classic and extended; the capacity is at least the size asked for.
#[test]
#[ignore = "needs an RDMA device"]
fn conformance_cq_sizes_on_every_completion_vector() {
    let dev = device();
    let channel = dev.ctx.create_comp_channel().unwrap();
    eprintln!(
        "{}: max_cqe {}, num_comp_vectors {}",
        dev.ctx.name(),
        dev.ctx.query_device().unwrap().max_cqe(),
        dev.ctx.num_comp_vectors()
    );
    for cqe in sizes(&dev) {
        for v in vectors(&dev) {
            for with_channel in [false, true] {
                for fields in [
                    None,
                    Some(CompletionFields::empty()),
                    Some(CompletionFields::standard()),
                ] {
                    let what = format!("cqe {cqe} vector {v} channel {with_channel} {fields:?}");
                    let mut b = dev.ctx.create_cq(cqe).comp_vector(v);
                    if with_channel {
                        b = b.channel(&channel);
                    }
                    if let Some(f) = fields {
                        b = b.wc_fields(f);
                    }
                    let cq = b.build().unwrap_or_else(|e| panic!("{what}: {e}"));
                    assert!(cq.capacity() >= cqe, "{what}: capacity {}", cq.capacity());
                    assert_eq!(cq.wc_fields(), fields, "{what}");
                    assert_eq!(cq.channel().is_some(), with_channel, "{what}");
                }
            }
        }
    }
}

/// Checks a refusal of `ibv_create_cq`/`ibv_create_cq_ex`: `EINVAL` from
/// the verb, with the library's reason in the message.
fn refused(e: Error, verb: &str, reason: &str, what: &str) {
    eprintln!("{what}: {e}");
    assert!(
        matches!(&e, Error::Verb { verb: v, .. } if *v == verb),
        "{what}: {e:?}"
    );
    assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "{what}: {e}");
    assert!(e.to_string().contains(reason), "{what}: {e}");
}

/// pyverbs `test_cq.CQAPITest.test_create_cq_bad_flow` and
/// `test_cqex.CQEXAPITest.test_create_cq_ex_bad_flow`: `max_cqe + 1`
/// entries, and the vectors `num_comp_vectors` and `num_comp_vectors + 1`
/// (and a negative one), are refused by the kernel with `EINVAL`; the
/// error names the verb and says which limit was passed.
#[test]
#[ignore = "needs an RDMA device"]
fn conformance_cq_past_max_cqe_or_num_comp_vectors_is_refused() {
    let dev = device();
    let max = dev.ctx.query_device().unwrap().max_cqe();
    let n = dev.ctx.num_comp_vectors() as i32;
    for (fields, verb) in [
        (None, "ibv_create_cq"),
        (Some(CompletionFields::empty()), "ibv_create_cq_ex"),
        (Some(CompletionFields::standard()), "ibv_create_cq_ex"),
    ] {
        let build = |cqe: u32, v: i32| {
            let b = dev.ctx.create_cq(cqe).comp_vector(v);
            match fields {
                Some(f) => b.wc_fields(f),
                None => b,
            }
            .build()
        };
        let e = build(max + 1, 0).unwrap_err();
        refused(e, verb, "max_cqe", &format!("{fields:?} cqe {}", max + 1));
        for v in [n, n + 1, -1] {
            let e = build(100, v).unwrap_err();
            refused(
                e,
                verb,
                "num_comp_vectors",
                &format!("{fields:?} vector {v} of {n}"),
            );
        }
        // The limits themselves are accepted.
        build(max, n - 1).unwrap();
    }
}

/// Each completion field an extended CQ can report, with what a UD
/// receive of `len` payload bytes and immediate `imm` from `src_qp`
/// to `qp_num` carries in it (RoCE: no LID, SL 0, no path bits).
fn fields() -> [(CompletionFields, &'static str); 9] {
    [
        (CompletionFields::BYTE_LEN, "byte_len"),
        (CompletionFields::IMM, "imm"),
        (CompletionFields::QP_NUM, "qp_num"),
        (CompletionFields::SRC_QP, "src_qp"),
        (CompletionFields::SLID, "slid"),
        (CompletionFields::SL, "sl"),
        (CompletionFields::DLID_PATH_BITS, "dlid_path_bits"),
        (
            CompletionFields::COMPLETION_TIMESTAMP,
            "completion_timestamp",
        ),
        (
            CompletionFields::COMPLETION_TIMESTAMP_WALLCLOCK,
            "completion_timestamp_wallclock",
        ),
    ]
}

/// A UD receiver on `rcq` and a sender on its own classic CQ; one send
/// of 32 bytes with immediate data from the sender to the receiver,
/// polled from `rcq`. Returns the receive's completion, and the two QP
/// numbers (receiver, sender).
fn ud_receive(dev: &TestDevice, rcq: &CompletionQueue) -> (rdma_verbs::Completion, u32, u32) {
    let pd = dev.ctx.alloc_pd().unwrap();
    let scq = dev.ctx.create_cq(256).build().unwrap();
    let rx = pd.create_qp(QpType::Ud, rcq, rcq).build().unwrap();
    let tx = pd.create_qp(QpType::Ud, &scq, &scq).build().unwrap();
    rx.activate_ud(dev.port, QKEY, 1).unwrap();
    tx.activate_ud(dev.port, QKEY, 2).unwrap();
    let port = dev.ctx.query_port(dev.port).unwrap();
    let av = AddressVector::for_port(&port, &common::endpoint(dev, &rx, 0), dev.gid_index).unwrap();
    let ah = pd.create_ah(&av).unwrap();
    rx.recv_queue()
        .unwrap()
        .recv(pd.alloc(256, AccessFlags::LOCAL_WRITE).unwrap(), 7)
        .unwrap();
    let mut buf = pd.alloc(32, AccessFlags::LOCAL_WRITE).unwrap();
    buf.copy_from_slice(&common::pattern(32, 3));
    tx.send_queue()
        .unwrap()
        .send_to(
            buf,
            &UdDest::new(&ah, rx.qp_num(), QKEY),
            Wr::id(8).imm(0x1234_5678),
        )
        .unwrap();
    common::wait_ok(&scq);
    let mut c = common::wait_ok(rcq);
    assert_eq!(c.wr_id(), 7);
    let got = c.take_local().expect("the receive buffer comes back");
    assert_eq!(&got[40..72], &common::pattern(32, 3)[..]);
    (c, rx.qp_num().0, tx.qp_num().0)
}

/// pyverbs `test_cqex.CQEXAPITest.test_create_cq_ex` (each
/// `IBV_WC_EX_WITH_*` flag alone; a refusal may only be `EOPNOTSUPP`),
/// and more: each field the device offers alone reports its value for a
/// UD receive with immediate data, and the fields not asked for read 0.
#[test]
#[ignore = "needs an RDMA device"]
fn conformance_cq_ex_each_field_alone() {
    let dev = device();
    let mut created = 0;
    for (f, name) in fields() {
        let cq = match dev.ctx.create_cq(256).wc_fields(f).build() {
            Ok(cq) => cq,
            Err(e) => {
                // rxe has no completion timestamps: its extended CQ
                // refuses them (EOPNOTSUPP from the verb) or lacks the
                // reader the library checks for.
                eprintln!("{name} alone: refused: {e}");
                assert!(
                    e.raw_os_error() == Some(libc::EOPNOTSUPP)
                        || matches!(e, Error::Unsupported(_)),
                    "{name}: {e:?}"
                );
                continue;
            }
        };
        created += 1;
        let (c, rx, tx) = ud_receive(&dev, &cq);
        let wc = c.wc();
        eprintln!("{name} alone: {wc:?}, timestamp {:?}", c.timestamp());
        // Always read: status, opcode, flags (immediate present, GRH).
        assert_eq!(wc.opcode(), WcOpcode::Recv, "{name}");
        assert!(wc.imm_data().is_some(), "{name}: the flag is always read");
        let on = |x: CompletionFields| f == x;
        let expect = |x: CompletionFields, v: u32| if on(x) { v } else { 0 };
        assert_eq!(
            wc.byte_len(),
            expect(CompletionFields::BYTE_LEN, 32 + GRH),
            "{name}"
        );
        assert_eq!(
            wc.imm_data(),
            Some(expect(CompletionFields::IMM, 0x1234_5678)),
            "{name}"
        );
        assert_eq!(wc.qp_num(), expect(CompletionFields::QP_NUM, rx), "{name}");
        assert_eq!(wc.src_qp(), expect(CompletionFields::SRC_QP, tx), "{name}");
        assert_eq!((wc.slid(), wc.sl()), (0, 0), "{name}: RoCE");
        assert_eq!(wc.as_raw().dlid_path_bits, 0, "{name}");
        let stamped = f.intersects(
            CompletionFields::COMPLETION_TIMESTAMP
                | CompletionFields::COMPLETION_TIMESTAMP_WALLCLOCK,
        );
        assert_eq!(c.timestamp().is_some(), stamped, "{name}");
    }
    assert!(created >= 7, "the seven classic fields are offered alone");
    // Both timestamps at once name one clock too many.
    let e = dev
        .ctx
        .create_cq(16)
        .wc_fields(
            CompletionFields::COMPLETION_TIMESTAMP
                | CompletionFields::COMPLETION_TIMESTAMP_WALLCLOCK,
        )
        .build()
        .unwrap_err();
    assert!(matches!(e, Error::ConflictingOptions { .. }), "{e}");
}

/// pyverbs `test_cqex.CqExTestCase.test_ud_traffic_cq_ex`: UD traffic
/// polled through an extended CQ with the standard fields; every field a
/// classic `ibv_wc` carries reads back, the completion flags (GRH,
/// immediate) as a classic CQ reports them for the same traffic.
#[test]
#[ignore = "needs an RDMA device"]
fn conformance_cq_ex_ud_traffic() {
    let dev = device();
    let cq = dev
        .ctx
        .create_cq(256)
        .wc_fields(CompletionFields::standard())
        .build()
        .unwrap();
    for round in 0..5 {
        let (c, rx, tx) = ud_receive(&dev, &cq);
        let wc = c.wc();
        assert_eq!(wc.opcode(), WcOpcode::Recv, "{round}");
        assert_eq!(wc.byte_len(), 32 + GRH, "{round}");
        assert_eq!(wc.imm_data(), Some(0x1234_5678), "{round}");
        assert_eq!((wc.qp_num(), wc.src_qp()), (rx, tx), "{round}");
        let classic = dev.ctx.create_cq(256).build().unwrap();
        let (cc, ..) = ud_receive(&dev, &classic);
        eprintln!(
            "{round}: extended: flags {:#x} (GRH {}), classic: flags {:#x} (GRH {})",
            wc.wc_flags(),
            wc.has_grh(),
            cc.wc().wc_flags(),
            cc.wc().has_grh()
        );
        assert_eq!(wc.wc_flags(), cc.wc().wc_flags(), "{round}");
        assert_eq!(c.source_gid(), cc.source_gid(), "{round}");
        common::assert_quiet(&cq);
    }
}
