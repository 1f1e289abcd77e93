//! Host tests of the request table's slot bookkeeping: `wr_id` encoding,
//! generations, covered chains, and every value back exactly once.

use super::*;

type Ev = Event<u32, &'static str>;

/// Posts `value` signaled or not on `chain`; its wr_id.
fn post(core: &mut Core<u32, &'static str>, value: u32, signaled: bool, chain: &mut Chain) -> u64 {
    let (idx, wr_id) = core.next().expect("room");
    core.fill(idx, value, signaled, chain);
    wr_id
}

/// Everything a completion yields, walk included.
fn all(core: &mut Core<u32, &'static str>, wr_id: u64, c: &'static str) -> Vec<Ev> {
    let mut out = vec![core.complete(Some(wr_id), c)];
    while let Some(e) = core.advance() {
        out.push(e);
    }
    out
}

#[test]
fn wr_id_round_trips_and_ids_are_nonzero() {
    for (id, gen, idx) in [
        (1, 0, 0),
        (ID_MASK, u16::MAX, MAX_CAPACITY - 1),
        (77, 300, 5),
    ] {
        assert_eq!(decode(encode(id, gen, idx)), (id, gen, idx));
    }
    for _ in 0..1000 {
        assert_ne!(next_table_id(), 0);
    }
    // A small caller wr_id (table id 0) never decodes to a table.
    assert_eq!(decode(42).0, 0);
}

#[test]
fn values_come_back_once_and_stale_wr_ids_are_foreign() {
    let mut core = Core::<u32, &str>::new(2);
    let mut chain = Chain::EMPTY;
    let a = post(&mut core, 10, true, &mut chain);
    let b = post(&mut core, 11, true, &mut chain);
    assert!(core.next().is_none(), "full at capacity");
    assert_eq!(all(&mut core, b, "cb"), [Event::Done(11, "cb")]);
    assert_eq!(all(&mut core, b, "again"), [Event::Foreign("again")]);
    // The slot is reused under a new generation: the old wr_id stays foreign.
    let c = post(&mut core, 12, true, &mut chain);
    assert_ne!(b, c);
    assert_eq!(decode(b).2, decode(c).2);
    assert_eq!(all(&mut core, b, "stale"), [Event::Foreign("stale")]);
    assert_eq!(all(&mut core, c, "cc"), [Event::Done(12, "cc")]);
    assert_eq!(all(&mut core, a, "ca"), [Event::Done(10, "ca")]);
    assert_eq!(core.outstanding(), 0);
    // Another table's id, an index out of range, an orphan.
    let other = encode(core.id ^ 1, 0, 0);
    assert_eq!(all(&mut core, other, "o"), [Event::Foreign("o")]);
    let out_of_range = encode(core.id, 0, 9);
    assert_eq!(all(&mut core, out_of_range, "r"), [Event::Foreign("r")]);
    assert_eq!(core.complete(None, "orphan"), Event::Foreign("orphan"));
}

#[test]
fn generations_wrap_without_matching_a_live_slot() {
    let mut core = Core::<u32, &str>::new(1);
    let mut chain = Chain::EMPTY;
    let first = post(&mut core, 0, true, &mut chain);
    assert_eq!(all(&mut core, first, "c"), [Event::Done(0, "c")]);
    for round in 1..=70_000u32 {
        let w = post(&mut core, round, true, &mut chain);
        if w != first {
            assert_eq!(
                all(&mut core, first, "s"),
                [Event::Foreign("s")],
                "round {round}"
            );
        }
        assert_eq!(all(&mut core, w, "c"), [Event::Done(round, "c")]);
    }
}

#[test]
fn a_signaled_completion_hands_out_the_values_it_covers_in_order() {
    let mut core = Core::<u32, &str>::new(8);
    let mut chain = Chain::EMPTY;
    let _u0 = post(&mut core, 0, false, &mut chain);
    let _u1 = post(&mut core, 1, false, &mut chain);
    let s2 = post(&mut core, 2, true, &mut chain);
    assert_eq!(chain, Chain::EMPTY);
    let _u3 = post(&mut core, 3, false, &mut chain);
    let s4 = post(&mut core, 4, true, &mut chain);
    assert_eq!(
        all(&mut core, s2, "c2"),
        [Event::Covered(0), Event::Covered(1), Event::Done(2, "c2")]
    );
    assert_eq!(
        all(&mut core, s4, "c4"),
        [Event::Covered(3), Event::Done(4, "c4")]
    );
    assert_eq!(core.outstanding(), 0);
}

#[test]
fn an_unsignaled_error_returns_its_value_once_and_its_slot_with_the_cover() {
    // u0 ok, u1 fails (its own completion), s2 flushed: u0 Covered,
    // u1 Done then skipped by the walk, s2 Done.
    let mut core = Core::<u32, &str>::new(3);
    let mut chain = Chain::EMPTY;
    let _u0 = post(&mut core, 0, false, &mut chain);
    let u1 = post(&mut core, 1, false, &mut chain);
    let s2 = post(&mut core, 2, true, &mut chain);
    assert_eq!(all(&mut core, u1, "err"), [Event::Done(1, "err")]);
    assert_eq!(core.outstanding(), 3, "u1's slot waits for its cover");
    assert_eq!(all(&mut core, u1, "dup"), [Event::Foreign("dup")]);
    assert_eq!(
        all(&mut core, s2, "flush"),
        [Event::Covered(0), Event::Done(2, "flush")]
    );
    assert_eq!(core.outstanding(), 0);
    assert_eq!(core.free.len(), 3, "every slot free once");
}

#[test]
fn random_streams_hand_every_value_back_exactly_once() {
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        rng = rng.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        (rng >> 33) as u32
    };
    let mut core = Core::<u32, &str>::new(16);
    let mut seen = vec![0u8; 50_000];
    let mut value = 0u32;
    // Two streams interleaved, each in order; completions of their
    // signaled requests (and some unsignaled errors) in stream order.
    let mut chains = [Chain::EMPTY; 2];
    let mut queues: [Vec<(u64, bool)>; 2] = [Vec::new(), Vec::new()];
    while (value as usize) < seen.len() - 40 {
        while core.next().is_some() {
            let s = (next() % 2) as usize;
            let sig = next() % 4 == 0 || core.free.len() == 1;
            let w = post(&mut core, value, sig, &mut chains[s]);
            queues[s].push((w, sig));
            value += 1;
        }
        for q in &mut queues {
            // Complete up to the last signaled request of this stream.
            let Some(last) = q.iter().rposition(|&(_, sig)| sig) else {
                continue;
            };
            for (w, sig) in q.drain(..=last).collect::<Vec<_>>() {
                let fail = !sig && next() % 7 == 0;
                if sig || fail {
                    for e in all(&mut core, w, "c") {
                        match e {
                            Event::Done(v, _) | Event::Covered(v) => seen[v as usize] += 1,
                            Event::Foreign(_) => panic!("lost {w:#x}"),
                        }
                    }
                }
            }
        }
    }
    // Whatever is still uncovered belongs to a stream without a cover.
    let uncovered: usize = queues.iter().map(Vec::len).sum();
    assert_eq!(core.outstanding() as usize, uncovered);
    let back = seen.iter().filter(|&&n| n == 1).count();
    assert!(seen.iter().all(|&n| n <= 1), "a value came back twice");
    assert_eq!(back + uncovered, value as usize);
}

#[test]
fn tables_and_streams_cross_threads() {
    fn send<S: Send>() {}
    fn sync<S: Sync>() {}
    send::<RequestTable<Vec<u8>>>();
    sync::<RequestTable<Vec<u8>>>();
    send::<SendStream>();
    sync::<SendStream>();
    send::<TableRefused<u32>>();
}
