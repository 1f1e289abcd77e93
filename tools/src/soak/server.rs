//! The soak's server: accepts sessions one after another (the harness
//! kills and restarts it to inject a peer restart), receives and checks
//! every message on one shared receive queue and one completion queue for
//! all queue pairs, exposes the write, read and atomic regions, and
//! answers the client's `END` with its `LEDGER`.

use std::net::TcpListener;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use rdma_verbs::{AccessFlags, Completions, Endpoint, QpType, WcOpcode};

use super::model::{ledger_line, parse_end, ServerQp};
use super::pattern::{check, fill, mix, seed};
use super::{
    back_to_baseline, connect_qp, ep_line, parse_ep, regions_line, resources, uptime, Common, Conn,
    Regions, KIND_RECV, READ_REGION,
};
use crate::fault::{endpoint, open, Setup};

/// Receives posted on the shared receive queue.
const SRQ_DEPTH: usize = 64;

/// See the module docs. Runs until killed.
pub fn server(c: Common) -> Result<(), String> {
    let s = open(&c.device, c.ib_port, c.gid_index).map_err(|e| e.to_string())?;
    let dev = s.ctx.name().to_string();
    let listener = TcpListener::bind(("0.0.0.0", c.tcp_port)).map_err(|e| e.to_string())?;
    let baseline = resources(&dev);
    eprintln!("soak_peer server: listening on {}", c.tcp_port);
    loop {
        let (stream, _) = listener.accept().map_err(|e| format!("accept: {e}"))?;
        let started = Instant::now();
        let (id, st, end) = match session(&s, &c, stream) {
            Ok((id, st, end)) => (id, st, end),
            Err((id, st, e)) => (id, st, format!("failed:{}", e.replace(' ', "_"))),
        };
        let leak = match back_to_baseline(&dev, &baseline) {
            Ok(()) => "-".to_string(),
            Err(e) => e.replace(' ', "_"),
        };
        println!(
            "SERVER session={id} end={end} received={} bytes={} corrupt={} errors={} leak={leak} secs={:.1}",
            st.received,
            st.bytes,
            st.corrupt,
            st.errors,
            started.elapsed().as_secs_f64()
        );
    }
}

#[derive(Default)]
struct Totals {
    received: u64,
    bytes: u64,
    corrupt: u64,
    errors: u64,
}

type Failed = (u64, Totals, String);

/// One session: the client's hello, the resources, the traffic, the
/// ledger. Everything is dropped on return (the shared receive queue keeps
/// its buffers until it is destroyed).
fn session(
    s: &Setup,
    c: &Common,
    stream: std::net::TcpStream,
) -> Result<(u64, Totals, String), Failed> {
    let mut st = Totals::default();
    let mut conn = Conn::new(stream).map_err(|e| (0, Totals::default(), e))?;
    let hello = conn
        .line(Duration::from_secs(30))
        .map_err(|e| (0, Totals::default(), e))?;
    let (id, n, max, slots) = parse_hello(&hello).map_err(|e| (0, Totals::default(), e))?;
    let fail = |e: String| (id, Totals::default(), e);
    let err = |e: rdma_verbs::Error| (id, Totals::default(), e.to_string());
    let pd = s.ctx.alloc_pd().map_err(err)?;
    let cq = s
        .ctx
        .create_cq((SRQ_DEPTH + n) as u32)
        .build()
        .map_err(err)?;
    let srq = pd.create_srq(SRQ_DEPTH as u32).build().map_err(err)?;
    let mut qps = Vec::with_capacity(n);
    let mut mine = Vec::with_capacity(n);
    for _ in 0..n {
        let qp = pd
            .create_qp(QpType::Rc, &cq, &cq)
            .srq(&srq)
            .max_send_wr(1)
            .build()
            .map_err(err)?;
        mine.push(endpoint(s, &qp, Endpoint::random_psn()).map_err(err)?);
        qps.push(qp);
    }
    let remote = LOCAL_REMOTE;
    let write = pd.alloc_shared(n * slots * max, remote).map_err(err)?;
    let read_seed = mix(id ^ 0x5eed);
    let mut read = pd
        .alloc(
            READ_REGION,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ,
        )
        .map_err(err)?;
    fill(&mut read, read_seed, 0);
    let counter0 = mix(id);
    let mut atomic = pd
        .alloc_shared(
            8 * n,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_ATOMIC | AccessFlags::REMOTE_READ,
        )
        .map_err(err)?;
    for q in 0..n {
        atomic
            .copy_from_slice(8 * q, &counter0.to_ne_bytes())
            .map_err(err)?;
    }
    let regions = Regions {
        write: write
            .remote()
            .ok_or_else(|| fail("write region not remote".into()))?,
        read: read
            .memory_region()
            .remote()
            .ok_or_else(|| fail("read region not remote".into()))?,
        read_seed,
        atomic: atomic
            .remote()
            .ok_or_else(|| fail("atomic region not remote".into()))?,
        counter0,
    };
    let mut theirs = Vec::with_capacity(n);
    for _ in 0..n {
        let l = conn.line(Duration::from_secs(30)).map_err(fail)?;
        theirs.push(parse_ep(&l).map_err(fail)?);
    }
    for ((qp, me), them) in qps.iter().zip(&mine).zip(&theirs) {
        connect_qp(s, c, qp, me, them).map_err(err)?;
    }
    let (bufs, _) = pd
        .alloc(SRQ_DEPTH * max, AccessFlags::LOCAL_WRITE)
        .map_err(err)?
        .chunks_exact(max);
    let mut rq = srq.recv_queue().map_err(err)?;
    for b in bufs {
        rq.recv(b, 0).map_err(|e| fail(e.error.to_string()))?;
    }
    let mut reply: String = mine.iter().map(ep_line).collect();
    reply.push_str(&regions_line(&regions));
    conn.send(&reply).map_err(fail)?;
    let index: std::collections::HashMap<u32, usize> = qps
        .iter()
        .enumerate()
        .map(|(i, qp)| (qp.qp_num().0, i))
        .collect();
    let mut ledger = vec![ServerQp::default(); n];
    let mut batch = Completions::with_capacity(32);
    // The client's END: read on a helper thread (the exchange is
    // blocking); the receive loop polls until it arrives.
    let (tx, rx) = std::sync::mpsc::channel();
    let mut reader = conn;
    let t = std::thread::spawn(move || {
        let r = reader.line(Duration::from_secs(7200));
        let _ = tx.send(r);
        reader
    });
    let mut end: Option<(Result<String, String>, Instant)> = None;
    let outcome = loop {
        let polled = cq
            .poll(&mut batch)
            .map_err(|e| (id, Totals::default(), e.to_string()))?;
        let idle = polled.is_empty();
        for mut comp in polled {
            let buf = comp.take_local();
            let Some(&q) = index.get(&comp.qp_num()) else {
                continue;
            };
            if !comp.is_success() {
                st.errors += 1;
                eprintln!("soak_peer server: qp {q}: {:?}", comp.status());
                continue;
            }
            let len = comp.byte_len() as usize;
            let l = &mut ledger[q];
            let seq = l.verified + l.corrupt;
            let verdict = match comp.opcode() {
                WcOpcode::Recv => {
                    let b = buf.as_ref().expect("a receive's buffer");
                    match check(&b[..len], seed(id, q, KIND_RECV, seq), 0) {
                        None => Ok(()),
                        Some((at, bad)) => Err(format!(
                            "send {seq} of {len} B: {bad} bytes differ, the first at {at}{}",
                            whose(&b[..len], at, id, q, seq)
                        )),
                    }
                }
                WcOpcode::RecvRdmaWithImm => {
                    let imm = comp.imm_data().unwrap_or(0);
                    match imm == super::imm_of(seq, len) {
                        true => Ok(()),
                        false => Err(format!(
                            "write-with-immediate {seq} of {len} B: immediate {imm:#x}, expected {:#x}",
                            super::imm_of(seq, len)
                        )),
                    }
                }
                other => Err(format!("unexpected completion {other:?}")),
            };
            match verdict {
                Ok(()) => l.verified += 1,
                Err(e) => {
                    println!(
                        "CORRUPT at={:.2} side=server session={id} qp={q} {e}",
                        uptime()
                    );
                    l.corrupt += 1;
                    st.corrupt += 1;
                }
            }
            st.received += 1;
            st.bytes += len as u64;
            if let Some(b) = buf {
                rq.recv(b, 0)
                    .map_err(|e| (id, Totals::default(), e.error.to_string()))?;
            }
        }
        if end.is_none() {
            if let Ok(r) = rx.try_recv() {
                end = Some((r, Instant::now()));
            }
        }
        match &end {
            None => {}
            Some((Err(e), _)) => break format!("client-gone:{}", e.replace(' ', "_")),
            Some((Ok(line), at)) => {
                let client = match parse_end(line, n) {
                    Ok(c) => c,
                    Err(e) => break format!("bad-end:{}", e.replace(' ', "_")),
                };
                // Completions can trail the client's view (it saw the
                // ACK): give them 5 s to arrive.
                let behind = client
                    .iter()
                    .zip(&ledger)
                    .any(|(c, l)| l.verified + l.corrupt < c.delivered);
                if !behind || at.elapsed() > Duration::from_secs(5) {
                    for (q, l) in ledger.iter_mut().enumerate() {
                        l.counter = atomic
                            .atomic_u64(8 * q)
                            .map_err(|e| (id, Totals::default(), e.to_string()))?
                            .load(Ordering::Acquire);
                    }
                    break "ok".to_string();
                }
            }
        }
        if idle {
            std::thread::sleep(Duration::from_micros(50));
        }
    };
    if outcome == "ok" {
        let mut conn = t
            .join()
            .map_err(|_| fail("exchange thread panicked".into()))?;
        conn.send(&ledger_line(&ledger))
            .map_err(|e| (id, Totals::default(), e))?;
        // Let the client read it before the QPs go (it closes first).
        let _ = conn.line(Duration::from_secs(30));
    }
    Ok((id, st, outcome))
}

/// Whose bytes a received message holds from offset `at` (where it first
/// differs): another message of the same queue pair, shifted by whole
/// 1 KiB packets or not, or zeros; checked on up to 1 KiB.
fn whose(msg: &[u8], at: usize, id: u64, q: usize, seq: u64) -> String {
    let part = &msg[at..msg.len().min(at + 1024)];
    if part.iter().all(|&b| b == 0) {
        return ": zeros there".into();
    }
    for other in seq.saturating_sub(3)..=seq + 3 {
        for shift in [0i64, -1024, 1024, -2048, 2048] {
            let Some(off) = (at as i64).checked_add(shift).filter(|o| *o >= 0) else {
                continue;
            };
            if (other, shift) != (seq, 0)
                && check(part, seed(id, q, KIND_RECV, other), off as u64).is_none()
            {
                return format!(": from there it holds send {other}'s bytes at offset {off}");
            }
        }
    }
    ": bytes of no nearby message".into()
}

/// Remote write and read (the write region).
const LOCAL_REMOTE: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ);

/// `SOAK1 <session> <qps> <max> <slots>`.
fn parse_hello(line: &str) -> Result<(u64, usize, usize, usize), String> {
    let f: Vec<&str> = line.split_whitespace().collect();
    let ["SOAK1", id, n, max, slots] = f[..] else {
        return Err(format!("bad hello {line:?}"));
    };
    let num = |s: &str| s.parse::<u64>().map_err(|e| format!("{line:?}: {e}"));
    let (id, n, max, slots) = (
        num(id)?,
        num(n)? as usize,
        num(max)? as usize,
        num(slots)? as usize,
    );
    if !(1..=256).contains(&n) || !(8..=(1 << 20)).contains(&max) || !(1..=64).contains(&slots) {
        return Err(format!(
            "refusing {n} queue pairs of {slots} slots of {max} B"
        ));
    }
    Ok((id, n, max, slots))
}

pub(super) fn hello_line(id: u64, n: usize, max: usize, slots: usize) -> String {
    format!("SOAK1 {id} {n} {max} {slots}\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hello_round_trips_and_bounds_the_request() {
        assert_eq!(
            parse_hello(&hello_line(5, 16, 1 << 20, 2)),
            Ok((5, 16, 1 << 20, 2))
        );
        assert!(parse_hello(&hello_line(5, 0, 64, 2)).is_err());
        assert!(parse_hello(&hello_line(5, 1, (1 << 20) + 1, 2)).is_err());
        assert!(parse_hello("SOAK1 1 2").is_err());
    }
}
