//! `fault_peer server`: receives (send), exposes memory (write, read,
//! atomics) and checks what arrives (see the parent module).

use std::io::{Read, Write};
use std::net::TcpListener;
use std::time::{Duration, Instant};

use rdma_verbs::{
    AccessFlags, Completions, Endpoint, LocalBuffer, QpType, RecvQueue, SharedBuffer,
};

use super::message::{check, fill};
use super::{
    connect_qp, endpoint, hello, open, parse_hello, read_line, Common, Op, Stats, RX_DEPTH,
};

/// See the module docs.
pub fn server(c: Common, recv_delay_ms: u64) -> Result<Stats, String> {
    let s = open(&c.device, c.ib_port, c.gid_index).map_err(|e| e.to_string())?;
    let listener = TcpListener::bind(("0.0.0.0", c.tcp_port)).map_err(|e| e.to_string())?;
    eprintln!("fault_peer server: listening on {}", c.tcp_port);
    // Accept with a deadline: a client that never comes must not hang us.
    listener.set_nonblocking(true).map_err(|e| e.to_string())?;
    let accept_by = Instant::now() + Duration::from_secs(c.deadline);
    let stream = loop {
        match listener.accept() {
            Ok((s, _)) => break s,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && Instant::now() < accept_by => {
                std::thread::sleep(Duration::from_millis(50))
            }
            Err(e) => return Err(format!("accept: {e}")),
        }
    };
    stream.set_nonblocking(false).map_err(|e| e.to_string())?;
    stream
        .set_read_timeout(Some(Duration::from_secs(c.deadline)))
        .ok();
    let client = parse_hello(&read_line(&stream)?)?;
    let field = |k: &str| {
        client
            .fields
            .iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.clone())
    };
    let op = match field("op").as_deref() {
        Some("send") => Op::Send,
        Some("write") => Op::Write,
        Some("read") => Op::Read,
        Some("atomic") => Op::Atomic,
        Some("mixed") => Op::Mixed,
        Some("mixedwrite") => Op::MixedWrite,
        other => return Err(format!("unknown op {other:?}")),
    };
    let msg_size: usize = field("size")
        .and_then(|v| v.parse().ok())
        .ok_or("no size")?;
    let msgs: u64 = field("msgs")
        .and_then(|v| v.parse().ok())
        .ok_or("no msgs")?;
    let min = if op == Op::Atomic { 8 } else { 16 };
    if !(min..=(1 << 24)).contains(&msg_size) || msgs == 0 || msgs > (1 << 20) {
        return Err(format!("refusing size {msg_size} × {msgs}"));
    }
    let mut st = Stats::new("server", op);
    let pd = s.ctx.alloc_pd().map_err(|e| e.to_string())?;
    let cq = s
        .ctx
        .create_cq(RX_DEPTH as u32 * 2)
        .build()
        .map_err(|e| e.to_string())?;
    let qp = pd
        .create_qp(QpType::Rc, &cq, &cq)
        .max_recv_wr(RX_DEPTH as u32)
        .max_send_wr(4)
        .build()
        .map_err(|e| e.to_string())?;
    let me = endpoint(&s, &qp, Endpoint::random_psn()).map_err(|e| e.to_string())?;
    let total = msg_size as u64 * msgs;
    let rights = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    // write: peers write here; read: we fill it and peers read it (both
    // stay alive until this function returns).
    let mut shared = None;
    let mut read_src = None;
    let exposed = match op {
        Op::Send => None,
        Op::Write => {
            let m = pd
                .alloc_shared(total as usize, rights)
                .map_err(|e| e.to_string())?;
            let r = m.remote();
            shared = Some(m);
            r
        }
        Op::Read => {
            let mut m = pd
                .alloc(
                    total as usize,
                    AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ,
                )
                .map_err(|e| e.to_string())?;
            for (i, chunk) in m.chunks_mut(msg_size).enumerate() {
                fill(chunk, i as u64);
            }
            let r = m.memory_region().remote();
            read_src = Some(m);
            r
        }
        Op::Mixed | Op::MixedWrite => {
            // The messages (to read, or zeroed slots the client writes),
            // then the counter.
            let mut m = pd
                .alloc_shared(
                    total as usize + 8,
                    AccessFlags::LOCAL_WRITE
                        | AccessFlags::REMOTE_READ
                        | AccessFlags::REMOTE_WRITE
                        | AccessFlags::REMOTE_ATOMIC,
                )
                .map_err(|e| e.to_string())?;
            if op == Op::Mixed {
                let mut msg = vec![0u8; msg_size];
                for i in 0..msgs {
                    fill(&mut msg, i);
                    m.copy_from_slice(i as usize * msg_size, &msg)
                        .map_err(|e| e.to_string())?;
                }
            }
            let r = m.remote();
            shared = Some(m);
            r
        }
        Op::Atomic => {
            let m = pd
                .alloc_shared(8, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_ATOMIC)
                .map_err(|e| e.to_string())?;
            let r = m.remote();
            shared = Some(m);
            r
        }
    };
    connect_qp(&s, &c, &qp, &me, &client.ep).map_err(|e| e.to_string())?;
    // Receive buffers (send op) or zero-length receives (write with imm).
    let recv_len = if op == Op::Send { msg_size } else { 0 };
    let mut pool: Vec<LocalBuffer> = Vec::new();
    if recv_len > 0 {
        (pool, _) = pd
            .alloc(recv_len * RX_DEPTH, AccessFlags::LOCAL_WRITE)
            .map_err(|e| e.to_string())?
            .chunks_exact(recv_len);
    }
    let mut rq = qp.recv_queue().map_err(|e| e.to_string())?;
    let post = |rq: &mut RecvQueue, buf: Option<LocalBuffer>| -> Result<(), String> {
        match buf {
            Some(b) => rq.recv(b, 0).map_err(|e| e.error.to_string()),
            None => rq.recv_empty(0).map_err(|e| e.to_string()),
        }
    };
    let initial = RX_DEPTH.min(msgs as usize) as u64;
    let post_initial = |rq: &mut RecvQueue, pool: &mut Vec<LocalBuffer>, st: &mut Stats| {
        for _ in 0..initial {
            post(rq, pool.pop())?;
            st.posted += 1;
        }
        Ok::<(), String>(())
    };
    // A responder posts its receives before it lets the peer send (as
    // rc_pingpong and perftest do): a client that starts first meets an
    // empty receive queue (RNR NAKs). The RNR scenario posts them late on
    // purpose (--recv-delay-ms), after the hello.
    let one_sided = matches!(op, Op::Read | Op::Atomic | Op::Mixed | Op::MixedWrite);
    if !one_sided && recv_delay_ms == 0 {
        post_initial(&mut rq, &mut pool, &mut st)?;
    }
    // The harness times its faults from this line.
    eprintln!("fault_peer server: connected");
    (&stream)
        .write_all(hello(&me, exposed, "").as_bytes())
        .map_err(|e| e.to_string())?;
    let deadline = Instant::now() + Duration::from_secs(c.deadline);
    if one_sided {
        // The client verifies; wait for its verdict line.
        let line = read_line(&stream).unwrap_or_default();
        st.msgs = msgs;
        st.bytes = total;
        if !line.starts_with("DONE") {
            st.fail(format!("peer:{}", line.trim().replace(' ', "_")));
        }
        if op == Op::MixedWrite {
            // Every write completed at a client that says ok: each slot
            // must hold its message. Our verdict goes back as a sender's.
            if line.starts_with("DONE ok") {
                check_slots(shared.as_ref(), msg_size, msgs, &mut st)?;
            }
            let _ = (&stream).write_all(format!("DONE {} {}\n", st.status, st.verified).as_bytes());
        }
        drop((read_src, shared));
        return Ok(st);
    }
    if recv_delay_ms > 0 {
        std::thread::sleep(Duration::from_millis(recv_delay_ms));
        post_initial(&mut rq, &mut pool, &mut st)?;
    }
    let mut outstanding = initial;
    let mut batch = Completions::with_capacity(32);
    let mut scratch = vec![0u8; msg_size];
    let mut next_post = initial;
    // The client reports its end over TCP; a client that gave up (error)
    // means no more data will come: then flush our receives back.
    stream.set_nonblocking(true).map_err(|e| e.to_string())?;
    let mut peer_line = String::new();
    let mut peer_done: Option<(String, Instant)> = None;
    let mut last_check = Instant::now();
    while (st.msgs < msgs && st.status == "ok") || outstanding > 0 {
        if Instant::now() > deadline && st.status == "ok" {
            st.fail("timeout".into());
            let _ = qp.to_err();
        }
        if Instant::now() > deadline + Duration::from_secs(30) {
            break; // the device did not even flush: report what we have
        }
        if last_check.elapsed() > Duration::from_millis(100) && st.status == "ok" {
            last_check = Instant::now();
            let mut buf = [0u8; 256];
            match (&stream).read(&mut buf) {
                Ok(0) => peer_line.push_str("DONE closed"),
                Ok(n) => peer_line.push_str(&String::from_utf8_lossy(&buf[..n])),
                Err(_) => {}
            }
            if let (None, Some(rest)) = (&peer_done, peer_line.strip_prefix("DONE ")) {
                let status = rest.split_whitespace().next().unwrap_or("?").to_owned();
                peer_done = Some((status, Instant::now()));
            }
        }
        // The client's "DONE ok" can overtake our last completions (it
        // follows the ACK, and the ACK our last poll): give them a moment to
        // arrive before calling the transfer short.
        if let Some((status, at)) = &peer_done {
            let short = st.msgs < msgs && at.elapsed() > Duration::from_secs(2);
            if st.status == "ok" && (status != "ok" || short) {
                st.fail(format!("peer:{status}"));
                let _ = qp.to_err();
            }
        }
        for mut comp in cq.poll(&mut batch).map_err(|e| e.to_string())? {
            outstanding -= 1;
            st.returned += 1;
            let buf = comp.take_local();
            if !comp.is_success() {
                st.error(comp.status());
                continue;
            }
            st.last_ok = Some(Instant::now());
            if st.status != "ok" {
                continue;
            }
            let seq = st.msgs;
            let verdict = match op {
                Op::Send => check(&buf.as_ref().unwrap()[..], seq),
                _ => {
                    let imm = comp.imm_data().map(u64::from);
                    if imm != Some(seq) {
                        Err(format!("write {seq}: immediate {imm:?}"))
                    } else {
                        let sh = shared.as_ref().unwrap();
                        sh.copy_to_slice(seq as usize * msg_size, &mut scratch)
                            .map_err(|e| e.to_string())
                            .and_then(|()| check(&scratch, seq))
                    }
                }
            };
            match verdict {
                Ok(()) => st.verified += 1,
                Err(e) => {
                    eprintln!("fault_peer server: {e}");
                    st.fail("corrupt".into());
                }
            }
            st.msgs += 1;
            st.bytes += msg_size as u64;
            if next_post < msgs && st.status == "ok" {
                post(&mut rq, buf)?;
                outstanding += 1;
                next_post += 1;
                st.posted += 1;
            }
        }
        if st.status != "ok" && outstanding > 0 {
            // Get every receive back: error state flushes them.
            let _ = qp.to_err();
        }
    }
    stream.set_nonblocking(false).map_err(|e| e.to_string())?;
    let _ = (&stream).write_all(format!("DONE {} {}\n", st.status, st.verified).as_bytes());
    // Keep the QP (the responder) until the client is done: if the ACK of
    // its last message was lost, its retransmission needs us to answer.
    // Returning now would destroy the QP, and the client (rxe retries
    // forever with retry_cnt 7) would wait for its deadline.
    if !peer_line.contains("DONE") {
        let left = (deadline + Duration::from_secs(30)).saturating_duration_since(Instant::now());
        stream
            .set_read_timeout(Some(left.max(Duration::from_secs(1))))
            .ok();
        let _ = read_line(&stream);
    }
    Ok(st)
}

/// Checks the slots a mixed-write client wrote: slot `i` must hold
/// message `i` (the first few wrong ones are printed).
fn check_slots(
    region: Option<&SharedBuffer>,
    msg_size: usize,
    msgs: u64,
    st: &mut Stats,
) -> Result<(), String> {
    let region = region.ok_or("no region for the writes")?;
    let mut slot = vec![0u8; msg_size];
    let mut wrong = 0;
    for i in 0..msgs {
        region
            .copy_to_slice(i as usize * msg_size, &mut slot)
            .map_err(|e| e.to_string())?;
        match check(&slot, i) {
            Ok(()) => st.verified += 1,
            Err(e) => {
                wrong += 1;
                if wrong <= 8 {
                    eprintln!("fault_peer server: slot {i}: {e}");
                }
                st.fail("corrupt".into());
            }
        }
    }
    if wrong > 8 {
        eprintln!("fault_peer server: {wrong} slots wrong in all");
    }
    Ok(())
}
