//! `fault_peer client`: moves the data and checks what comes back (see
//! the parent module).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use rdma_verbs::{memory::Buf, AccessFlags, Completions, Endpoint, QpType, Wr};

use super::message::{check, fill};
use super::{
    atomic_expected, atomic_explain, connect_qp, endpoint, hello, open, parse_hello, read_line,
    Common, Op, Stats, POISON,
};

/// See the module docs.
pub fn client(
    host: String,
    c: Common,
    op: Op,
    msg_size: usize,
    total: u64,
    window: usize,
    stall_timeout: f64,
) -> Result<Stats, String> {
    if op == Op::Atomic && msg_size != 8 {
        return Err("--op atomic moves 8 bytes per request: --msg-size 8".into());
    }
    if op != Op::Atomic && msg_size < 16 {
        return Err("--msg-size must be at least 16".into());
    }
    let msgs = total.div_ceil(msg_size as u64);
    let s = open(&c.device, c.ib_port, c.gid_index).map_err(|e| e.to_string())?;
    let mut st = Stats::new("client", op);
    let pd = s.ctx.alloc_pd().map_err(|e| e.to_string())?;
    let cq = s
        .ctx
        .create_cq(window as u32 * 2 + 4)
        .build()
        .map_err(|e| e.to_string())?;
    let qp = pd
        .create_qp(QpType::Rc, &cq, &cq)
        // Mixed has a message and a fetch-and-add in flight per slot.
        .max_send_wr(if op.interleaves_atomics() {
            2 * window
        } else {
            window
        } as u32)
        .max_recv_wr(4)
        .build()
        .map_err(|e| e.to_string())?;
    let me = endpoint(&s, &qp, Endpoint::random_psn()).map_err(|e| e.to_string())?;
    // Connect (the server may start later).
    let t0 = Instant::now();
    let stream = loop {
        match TcpStream::connect((host.as_str(), c.tcp_port)) {
            Ok(st) => break st,
            Err(e) if t0.elapsed() < Duration::from_secs(300) => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(e) => return Err(format!("connect {host}:{}: {e}", c.tcp_port)),
        }
    };
    stream
        .set_read_timeout(Some(Duration::from_secs(c.deadline)))
        .ok();
    let op_name = format!("{op:?}").to_lowercase();
    (&stream)
        .write_all(
            hello(
                &me,
                None,
                &format!("op={op_name} size={msg_size} msgs={msgs}"),
            )
            .as_bytes(),
        )
        .map_err(|e| e.to_string())?;
    let server = parse_hello(&read_line(&stream)?)?;
    connect_qp(&s, &c, &qp, &me, &server.ep).map_err(|e| e.to_string())?;
    // The harness times its faults from this line.
    eprintln!("fault_peer client: connected");
    let mut sq = qp.send_queue().map_err(|e| e.to_string())?;
    st.start = Instant::now();
    let (mut pool, _) = pd
        .alloc(msg_size * window, AccessFlags::LOCAL_WRITE)
        .map_err(|e| e.to_string())?
        .chunks_exact(msg_size);
    // Mixed: the fetch-and-adds' 8-byte results, apart from the messages.
    let (mut results, _) = pd
        .alloc(8 * window, AccessFlags::LOCAL_WRITE)
        .map_err(|e| e.to_string())?
        .chunks_exact(8);
    let requests = match op.interleaves_atomics() {
        true => 2 * msgs,
        false => msgs,
    };
    let deadline = Instant::now() + Duration::from_secs(c.deadline);
    let mut last_progress = Instant::now();
    // The server's verdict line can come before the end: a server that found
    // a message wrong stops (its QP in ERR), and a client that kept sending
    // into it would only retry until its deadline. Read it as it comes.
    stream.set_nonblocking(true).map_err(|e| e.to_string())?;
    let mut verdict = String::new();
    let mut last_check = Instant::now();
    let mut batch = Completions::with_capacity(32);
    // Message k's place in the server's region.
    let slot = |k: u64| {
        server
            .mem
            .slice(k * msg_size as u64, msg_size as u64)
            .ok_or("server region too small")
    };
    let mut next = 0u64;
    let mut outstanding = 0u64;
    let mut done = 0u64; // completed in order
    while (next < requests && st.status == "ok") || outstanding > 0 {
        while next < requests && st.status == "ok" {
            // Mixed: odd requests are fetch-and-adds, with their 8-byte
            // results apart from the messages.
            let result = op.interleaves_atomics() && next % 2 == 1;
            let from = match result {
                true => &mut results,
                false => &mut pool,
            };
            let Some(mut buf) = from.pop() else { break };
            if result || op == Op::Atomic {
                buf.copy_from_slice(&POISON.to_ne_bytes());
            }
            let o = Wr::id(next);
            let posted = match op {
                _ if result => {
                    let counter = server
                        .mem
                        .slice(msgs * msg_size as u64, 8)
                        .ok_or("server region too small")?;
                    sq.fetch_and_add(buf, counter, next / 2 + 1, o)
                }
                Op::Send => {
                    fill(&mut buf, next);
                    sq.send(buf, o)
                }
                Op::Mixed => sq.read(buf, slot(next / 2)?, o),
                Op::MixedWrite => {
                    fill(&mut buf, next / 2);
                    sq.write(buf, slot(next / 2)?, o)
                }
                Op::Write => {
                    fill(&mut buf, next);
                    sq.write(buf, slot(next)?, o.imm(next as u32))
                }
                Op::Read => sq.read(buf, slot(next)?, o),
                Op::Atomic => sq.fetch_and_add(buf, server.mem, next.wrapping_add(1), o),
            };
            match posted {
                Ok(()) => {
                    next += 1;
                    outstanding += 1;
                    st.posted += 1;
                }
                Err(e) => {
                    st.fail(format!("post:{}", e.error).replace(' ', "_"));
                    if let Buf::Local(b) = e.buf {
                        from.push(b);
                    }
                }
            }
        }
        if Instant::now() > deadline && st.status == "ok" {
            // Give up, but get every buffer back: the error state flushes.
            st.fail("timeout".into());
            let _ = qp.to_err();
        }
        if stall_timeout > 0.0
            && outstanding > 0
            && st.status == "ok"
            && !st.watchdog
            && last_progress.elapsed().as_secs_f64() > stall_timeout
        {
            // The device neither completes nor fails the outstanding
            // requests (rxe can stall without retrying while its netdev is
            // down): end it as an application would, with typed flushes.
            eprintln!(
                "fault_peer client: no completion for {stall_timeout:.1} s with {outstanding} \
                 outstanding: moving the QP to ERR (progress watchdog)"
            );
            st.watchdog = true;
            let _ = qp.to_err();
        }
        if Instant::now() > deadline + Duration::from_secs(30) {
            break; // the device did not even flush: report what we have
        }
        if !verdict.contains('\n') && last_check.elapsed() > Duration::from_millis(100) {
            last_check = Instant::now();
            let mut buf = [0u8; 256];
            if let Ok(n @ 1..) = (&stream).read(&mut buf) {
                verdict.push_str(&String::from_utf8_lossy(&buf[..n]));
            }
            // A closed exchange is no verdict: a killed server is the
            // transport's to report (RETRY_EXC_ERR, REM_OP_ERR).
            if let Some(status) = verdict_status(&verdict) {
                if status != "ok" && st.status == "ok" {
                    st.fail(format!("peer:{status}"));
                    let _ = qp.to_err();
                }
            }
        }
        for mut comp in cq.poll(&mut batch).map_err(|e| e.to_string())? {
            last_progress = Instant::now();
            outstanding -= 1;
            st.returned += 1;
            let buf = comp.take_local();
            if !comp.is_success() {
                st.error(comp.status());
            } else if st.status == "ok" {
                st.last_ok = Some(Instant::now());
                if comp.wr_id() != done {
                    eprintln!(
                        "fault_peer client: completion {} out of order (expected {done})",
                        comp.wr_id()
                    );
                    st.fail("corrupt".into());
                }
                let read = match op {
                    Op::Read => Some(comp.wr_id()),
                    Op::Mixed if comp.wr_id() % 2 == 0 => Some(comp.wr_id() / 2),
                    _ => None,
                };
                if let Some(k) = read {
                    match check(&buf.as_ref().unwrap()[..], k) {
                        Ok(()) => st.verified += 1,
                        Err(e) => {
                            eprintln!("fault_peer client: {e}");
                            st.fail("corrupt".into());
                        }
                    }
                }
                // The fetch-and-adds: request i of Atomic, i / 2 of the
                // interleaved ops.
                let atomic = match op {
                    Op::Atomic => Some(comp.wr_id()),
                    _ if op.interleaves_atomics() && comp.wr_id() % 2 == 1 => {
                        Some(comp.wr_id() / 2)
                    }
                    _ => None,
                };
                if let Some(k) = atomic {
                    let b = buf.as_ref().unwrap();
                    let got = u64::from_ne_bytes(b[..8].try_into().unwrap());
                    match got == atomic_expected(k) {
                        true if op == Op::Atomic => st.verified += 1,
                        true => {}
                        false => {
                            eprintln!("fault_peer client: {}", atomic_explain(k, got));
                            st.fail("corrupt".into());
                        }
                    }
                }
                done += 1;
                // The interleaved ops count their messages (the reads, each
                // checked here, or the writes the server checks).
                if !(op.interleaves_atomics() && comp.wr_id() % 2 == 1) {
                    st.msgs += 1;
                    st.bytes += msg_size as u64;
                }
            }
            match buf {
                Some(b) if op.interleaves_atomics() && b.len() == 8 => results.push(b),
                Some(b) => pool.push(b),
                None => {}
            }
        }
    }
    // Tell the server, and (send/write) learn its verdict.
    stream.set_nonblocking(false).map_err(|e| e.to_string())?;
    let _ = (&stream).write_all(format!("DONE {}\n", st.status).as_bytes());
    if matches!(op, Op::Send | Op::Write | Op::MixedWrite) && st.status == "ok" {
        let line = match verdict.contains('\n') {
            true => Ok(verdict),
            false => read_line(&stream).map(|l| verdict + &l),
        };
        match line {
            Ok(line) => {
                let mut f = line.split_whitespace().skip(1);
                let status = f.next().unwrap_or("?").to_owned();
                st.verified = f.next().and_then(|v| v.parse().ok()).unwrap_or(0);
                if status != "ok" {
                    st.fail(format!("peer:{status}"));
                }
            }
            Err(e) => st.fail(format!("peer:{}", e.replace(' ', "_"))),
        }
    }
    Ok(st)
}

/// The status of a complete `DONE <status> …` line, if `text` holds one.
fn verdict_status(text: &str) -> Option<&str> {
    let line = text
        .split_inclusive('\n')
        .next()
        .filter(|l| l.ends_with('\n'))?;
    line.strip_prefix("DONE ")?.split_whitespace().next()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_verdict_counts_once_its_line_is_complete() {
        assert_eq!(verdict_status("DONE corrupt 598\n"), Some("corrupt"));
        assert_eq!(verdict_status("DONE ok 1024\n"), Some("ok"));
        assert_eq!(verdict_status("DONE corr"), None);
        assert_eq!(verdict_status(""), None);
        assert_eq!(verdict_status("HELLO\n"), None);
    }
}
