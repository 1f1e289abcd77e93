//! What each guarantee of the safe paths costs, measured: every instruction the measured program
//! executes in its own code is charged to a source line (`lines.rs`), and each line to the
//! guarantee it serves by the rules below. A path's floor is C's count plus what its guarantees
//! cost; what no rule claims (loops, iterator and `Result` plumbing, prologues, spills) is
//! overhead above the floor.

use super::lines::Line;

/// A guarantee (or what a path owes its API) and what it is.
pub struct Guarantee {
    pub key: &'static str,
    pub what: &'static str,
}

pub const GUARANTEES: &[Guarantee] = &[
    Guarantee {
        key: "result",
        what: "the verb's return code tested and an `Ok` returned (C hands the code back untested)",
    },
    Guarantee {
        key: "checks",
        what: "the checks a safe post owes: the buffer's protection domain and length, the \
               operation and options the common case takes; a prepared request's queue",
    },
    Guarantee {
        key: "template",
        what: "the C request's per-operation fields written (the buffer's SGE, remote address, \
               opcode, flags): C builds its request once",
    },
    Guarantee {
        key: "slot",
        what: "the in-flight slot (DESIGN.md, *The in-flight store*): the room test, the slot \
               filled and published before the doorbell, the head moved; from the completion, \
               one compare-and-swap claims it (stale, duplicate and foreign ids fail), the \
               caller's `wr_id` restored, the slot freed when the completion is dropped",
    },
    Guarantee {
        key: "buffer",
        what: "the buffer moved: out of the program's record into the slot, back out of the \
               slot into the record (C's buffer never moves)",
    },
    Guarantee {
        key: "rxe",
        what: "rxe's invalidate bit moved where libibverbs reads it (rxe only)",
    },
];

/// `(file, text the line contains, guarantee)`: the first rule that matches a line charges it.
/// An empty text matches every line of the file.
const RULES: &[(&str, &str, &str)] = &[
    // The return code.
    ("ibverbs/src/error.rs", "if rc == 0", "result"),
    (
        "ibverbs/src/qp/queue_pair/send_queue.rs",
        "if rc != 0",
        "result",
    ),
    (
        "ibverbs/src/qp/queue_pair/prepared.rs",
        "if rc != 0",
        "result",
    ),
    // rxe's quirk.
    ("ibverbs/src/cq/completion_queue.rs", "csum", "rxe"),
    (
        "ibverbs/src/cq/completion_queue/polled.rs",
        "self.rxe",
        "rxe",
    ),
    (
        "ibverbs/src/cq/completion_queue/polled.rs",
        "fix_rxe_inv_flag",
        "rxe",
    ),
    // The common case's checks.
    (
        "ibverbs/src/qp/queue_pair/send_queue.rs",
        "let common = self.fast",
        "checks",
    ),
    (
        "ibverbs/src/qp/queue_pair/send_queue.rs",
        "o.bits &",
        "checks",
    ),
    (
        "ibverbs/src/qp/queue_pair/send_queue.rs",
        "region.mr.pd",
        "checks",
    ),
    (
        "ibverbs/src/qp/queue_pair/send_queue.rs",
        "region.len().wrapping_sub(1)",
        "checks",
    ),
    (
        "ibverbs/src/qp/queue_pair/send_queue.rs",
        "Buf::Frozen",
        "checks",
    ),
    (
        "ibverbs/src/qp/queue_pair/send_queue.rs",
        "region.mr.access",
        "checks",
    ),
    (
        "ibverbs/src/qp/queue_pair/send_queue.rs",
        "buf.region()",
        "checks",
    ),
    (
        "ibverbs/src/qp/queue_pair/prepared.rs",
        "p.ring_id !=",
        "checks",
    ),
    // The template's changing fields.
    (
        "ibverbs/src/qp/queue_pair/send_queue.rs",
        "self.sge =",
        "template",
    ),
    (
        "ibverbs/src/qp/queue_pair/send_queue.rs",
        "self.wr.",
        "template",
    ),
    (
        "ibverbs/src/qp/queue_pair/send_queue.rs",
        "remote_addr:",
        "template",
    ),
    (
        "ibverbs/src/qp/queue_pair/send_queue.rs",
        "rkey: m.rkey",
        "template",
    ),
    (
        "ibverbs/src/qp/queue_pair/send_queue.rs",
        "let (opcode, remote)",
        "template",
    ),
    (
        "ibverbs/src/qp/queue_pair/send_queue.rs",
        "Op::",
        "template",
    ),
    (
        "ibverbs/src/qp/queue_pair/send_queue.rs",
        "if let Some(m) = remote",
        "template",
    ),
    ("ibverbs/src/memory/buffer.rs", "", "template"),
    // The slot.
    ("ibverbs/src/inflight.rs", "", "slot"),
    ("ibverbs/src/inflight/wr_id.rs", "", "slot"),
    (
        "ibverbs/src/qp/queue_pair/send_queue.rs",
        "reserve_head()",
        "slot",
    ),
    (
        "ibverbs/src/qp/queue_pair/send_queue.rs",
        "ring.fill(",
        "slot",
    ),
    (
        "ibverbs/src/qp/queue_pair/send_queue.rs",
        "ring.publish(",
        "slot",
    ),
    (
        "ibverbs/src/qp/queue_pair/send_queue.rs",
        "advance_one()",
        "slot",
    ),
    (
        "ibverbs/src/qp/queue_pair/send_queue.rs",
        "self.ring.as_mut()",
        "slot",
    ),
    (
        "ibverbs/src/qp/queue_pair/send_queue.rs",
        "let signaled =",
        "slot",
    ),
    (
        "ibverbs/src/qp/queue_pair/send_queue.rs",
        "Payload::bufs(",
        "slot",
    ),
    (
        "ibverbs/src/qp/queue_pair/send_queue.rs",
        "let ring = self.ring()",
        "slot",
    ),
    (
        "ibverbs/src/qp/queue_pair/prepared.rs",
        "reserve_head()",
        "slot",
    ),
    (
        "ibverbs/src/qp/queue_pair/prepared.rs",
        "fill_empty(",
        "slot",
    ),
    (
        "ibverbs/src/qp/queue_pair/prepared.rs",
        "ring.publish(",
        "slot",
    ),
    (
        "ibverbs/src/qp/queue_pair/prepared.rs",
        "advance_one()",
        "slot",
    ),
    (
        "ibverbs/src/qp/queue_pair/prepared.rs",
        "postings.last",
        "slot",
    ),
    (
        "ibverbs/src/qp/queue_pair/prepared.rs",
        "wr_id = slot.wr_id",
        "slot",
    ),
    (
        "ibverbs/src/qp/queue_pair/prepared.rs",
        "let ring = self.ring()",
        "slot",
    ),
    (
        "ibverbs/src/qp/queue_pair/prepared.rs",
        "let wr_id = p.wr_id",
        "slot",
    ),
    (
        "ibverbs/src/cq/completion_queue/polled.rs",
        "inflight::claim",
        "slot",
    ),
    (
        "ibverbs/src/cq/completion_queue/polled.rs",
        "c.user()",
        "slot",
    ),
    (
        "ibverbs/src/cq/completion_queue/polled.rs",
        "has_extras()",
        "slot",
    ),
    (
        "ibverbs/src/cq/completion_queue/polled.rs",
        "holds_nothing()",
        "slot",
    ),
    // The buffer's move.
    (
        "ibverbs/src/cq/completion_queue/polled.rs",
        "payload().held",
        "buffer",
    ),
    (
        "ibverbs/src/cq/completion_queue/polled.rs",
        "let sg = self.sg()",
        "buffer",
    ),
    (
        "ibverbs/src/cq/completion_queue/polled.rs",
        "SgList::One(Buf::Local(b))",
        "buffer",
    ),
    (
        "ibverbs/src/cq/completion_queue/polled.rs",
        "std::ptr::read(b)",
        "buffer",
    ),
    (
        "ibverbs/src/cq/completion_queue/polled.rs",
        "std::ptr::write(sg",
        "buffer",
    ),
    (
        "ibverbs/src/cq/completion_queue/polled.rs",
        "Some(b)",
        "buffer",
    ),
    ("tools/examples/opcost.rs", "r.buf.take()", "buffer"),
    (
        "tools/examples/opcost.rs",
        "r.buf = c.take_local()",
        "buffer",
    ),
    ("tools/examples/opcost.rs", "owned.get_mut(", "buffer"),
    // The floor prototypes (opcost's `floor` module): the same guarantees by hand.
    (
        "tools/examples/opcost.rs",
        "self.qp.post_send_raw",
        "result",
    ),
    (
        "tools/examples/opcost.rs",
        "if p.queue != self.id",
        "checks",
    ),
    (
        "tools/examples/opcost.rs",
        "if buf.lkey() != self.lkey",
        "checks",
    ),
    (
        "tools/examples/opcost.rs",
        "self.sge = sys::ibv_sge",
        "template",
    ),
    ("tools/examples/opcost.rs", "addr: buf.addr()", "template"),
    (
        "tools/examples/opcost.rs",
        "length: buf.len() as u32",
        "template",
    ),
    ("tools/examples/opcost.rs", "lkey: buf.lkey()", "template"),
    ("tools/examples/opcost.rs", "self.wr.", "template"),
    (
        "tools/examples/opcost.rs",
        "remote_addr: remote.addr",
        "template",
    ),
    (
        "tools/examples/opcost.rs",
        "rkey: remote.rkey.0",
        "template",
    ),
    ("tools/examples/opcost.rs", "Some(buf))", "buffer"),
    (
        "tools/examples/opcost.rs",
        "std::ptr::replace(self.buf.get(), None)",
        "buffer",
    ),
    ("tools/examples/opcost.rs", "take_and_free", "buffer"),
    ("tools/examples/opcost.rs", "r.buf = back", "buffer"),
    ("tools/examples/opcost.rs", "lane.store.claim(", "slot"),
    ("tools/examples/opcost.rs", "slot.free()", "slot"),
    ("tools/examples/opcost.rs", "self.free()", "slot"),
    ("tools/examples/opcost.rs", "self.state.store(FREE", "slot"),
    ("tools/examples/opcost.rs", "let id = wc.wr_id", "slot"),
    ("tools/examples/opcost.rs", "if id & OURS == 0", "slot"),
    ("tools/examples/opcost.rs", "self.slots.get(id", "slot"),
    (
        "tools/examples/opcost.rs",
        "compare_exchange(id, CLAIMING",
        "slot",
    ),
    ("tools/examples/opcost.rs", "*slot.user.get()", "slot"),
    ("tools/examples/opcost.rs", "slot.state.", "slot"),
    ("tools/examples/opcost.rs", "&*self.base.add(", "slot"),
    ("tools/examples/opcost.rs", "Some((slot, self.lap", "slot"),
    ("tools/examples/opcost.rs", "self.reserve()", "slot"),
    ("tools/examples/opcost.rs", "p.wr.wr_id = id", "slot"),
    ("tools/examples/opcost.rs", "p.last = id", "slot"),
    ("tools/examples/opcost.rs", "self.advance()", "slot"),
    ("tools/examples/opcost.rs", "self.head", "slot"),
    ("tools/examples/opcost.rs", "self.lap = self.lap", "slot"),
];

/// The guarantee a line serves, if any.
fn guarantee_of(l: &Line) -> Option<&'static str> {
    let file = l.location.rsplit_once(':').map_or("", |(f, _)| f);
    RULES
        .iter()
        .find(|(f, text, _)| *f == file && l.source.contains(text))
        .map(|(_, _, key)| *key)
}

/// Instructions per operation charged to each guarantee, in [`GUARANTEES`] order (those with
/// none left out).
pub fn charge(lines: &[Line]) -> Vec<(&'static Guarantee, f64)> {
    GUARANTEES
        .iter()
        .map(|g| {
            let n = lines
                .iter()
                .filter(|l| guarantee_of(l) == Some(g.key))
                .map(|l| l.per_op)
                .sum::<f64>();
            (g, n)
        })
        .filter(|(_, n)| *n > 0.0)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(location: &str, source: &str, per_op: f64) -> Line {
        Line {
            location: location.into(),
            source: source.into(),
            per_op,
        }
    }

    #[test]
    fn lines_are_charged_by_file_and_text_and_the_rest_is_overhead() {
        let lines = [
            line(
                "ibverbs/src/inflight.rs:338",
                "if slot.state.load(Ordering::Acquire) != FREE {",
                3.0,
            ),
            line(
                "ibverbs/src/inflight/wr_id.rs:48",
                "if wr_id & OURS == 0 {",
                2.0,
            ),
            line(
                "ibverbs/src/qp/queue_pair/send_queue.rs:557",
                "if rc != 0 {",
                2.0,
            ),
            line("ibverbs/src/error.rs:1170", "if rc == 0 {", 2.0),
            line(
                "tools/examples/opcost.rs:250",
                "r.buf = c.take_local();",
                8.0,
            ),
            line("tools/examples/opcost.rs:328", "for r in reqs {", 6.0),
            line("(std::thread::functions::sleep)", "", 2.5),
        ];
        let charged = charge(&lines);
        let by = |k: &str| charged.iter().find(|(g, _)| g.key == k).map(|(_, n)| *n);
        assert_eq!(by("slot"), Some(5.0));
        assert_eq!(by("result"), Some(4.0));
        assert_eq!(by("buffer"), Some(8.0));
        assert_eq!(by("template"), None);
        // The loop and the sleep are nobody's guarantee.
        let total: f64 = charged.iter().map(|(_, n)| n).sum();
        assert_eq!(total, 17.0);
    }
}
