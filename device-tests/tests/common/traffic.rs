//! Traffic the way rdma-core's pyverbs suite runs it (`tests/utils.py`:
//! `traffic`, `rdma_traffic`, `atomic_traffic`), for the conformance
//! tests: two queue pairs of the test device, a client and a server; the
//! client sends (or writes, reads, runs an atomic), the other side checks
//! every byte, and the server answers the same way, for a number of
//! iterations. How the queue pairs are created (classic, or extended with
//! `SendOpFlags`) and how their CQs are polled (classic, extended, or one
//! completion event per completion) is the caller's choice.

use std::cell::RefCell;
use std::time::{Duration, Instant};

use rdma_verbs::{
    cq::CompletionFields,
    qp::{AddressHandle, AddressVector, SendOpFlags},
    AccessFlags, Completion, CompletionQueue, LocalBuffer, ProtectionDomain, QpType, QueuePair,
    RecvRequest, RemoteMemory, SendRequest, SharedBuffer, WcOpcode,
};

use super::{connect_pair, device, pattern, remote_all, TestDevice};

/// The Q_Key of the UD queue pairs (pyverbs' `UD_QKEY`).
pub const UD_QKEY: u32 = 0x1111_1111;
/// The GRH in front of every UD receive.
pub const GRH: usize = 40;
/// Bytes of each side's RDMA target region.
pub const REGION: usize = 4096;

/// How the players' CQs are created and polled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CqKind {
    /// `ibv_create_cq`, polled with `ibv_poll_cq`.
    Classic,
    /// `ibv_create_cq_ex` with the standard fields, polled with
    /// `ibv_start_poll`/`ibv_next_poll`/`ibv_end_poll`.
    Extended,
    /// `ibv_create_cq` on a completion channel of its own, armed at
    /// creation; every completion is taken only after reading its event
    /// (`ibv_get_cq_event`) and re-arming (pyverbs' `poll_cq` with a
    /// channel).
    Events,
}

/// One end.
pub struct Side {
    pub cq: CompletionQueue,
    pub qp: QueuePair,
    /// Target of the peer's RDMA writes, reads and atomics (every remote
    /// right; a `RefCell` for the `&mut` its copies take).
    pub region: RefCell<SharedBuffer>,
}

impl Side {
    /// `len` bytes of this side's region from `offset`, as the peer names them.
    pub fn remote(&self, offset: usize, len: usize) -> RemoteMemory {
        let r = self.region.borrow().remote().unwrap();
        r.slice(offset as u64, len as u64).unwrap()
    }
}

/// Two queue pairs of one device, connected (RC, UC) or activated (UD).
pub struct Players {
    pub dev: TestDevice,
    pub pd: ProtectionDomain,
    pub qp_type: QpType,
    pub cq_kind: CqKind,
    /// Access flags of the buffers the traffic posts.
    pub access: AccessFlags,
    /// UD: the address of the device's own GID (both players are on it).
    pub ah: Option<AddressHandle>,
    pub client: Side,
    pub server: Side,
}

/// Creates the players: `ops` `Some` creates both queue pairs with
/// `ibv_create_qp_ex` and those operations (posted through `ibv_wr_*`),
/// `None` with `ibv_create_qp`. `access` is added to the posted buffers'
/// `LOCAL_WRITE` (and, for its `RELAXED_ORDERING`, to the regions').
pub fn players(
    qp_type: QpType,
    ops: Option<SendOpFlags>,
    cq_kind: CqKind,
    access: AccessFlags,
) -> Players {
    let dev = device();
    let pd = dev.ctx.alloc_pd().unwrap();
    let access = access | AccessFlags::LOCAL_WRITE;
    let side = || {
        let cq = match cq_kind {
            CqKind::Classic => dev.ctx.create_cq(256).build(),
            CqKind::Extended => dev
                .ctx
                .create_cq(256)
                .wc_fields(CompletionFields::standard())
                .build(),
            CqKind::Events => {
                let ch = dev.ctx.create_comp_channel().unwrap();
                ch.set_nonblocking(true).unwrap();
                dev.ctx.create_cq(256).channel(&ch).build()
            }
        }
        .unwrap();
        if cq_kind == CqKind::Events {
            cq.req_notify(false).unwrap();
        }
        let b = pd.create_qp(qp_type, &cq, &cq);
        let qp = match ops {
            Some(ops) => b.send_ops(ops),
            None => b,
        }
        .build()
        .unwrap_or_else(|e| panic!("{qp_type:?} {ops:?}: {e}"));
        assert_eq!(qp.send_ops(), ops, "the queue pair was created as asked");
        let region = pd
            .alloc_shared(
                REGION,
                remote_all() | (access & AccessFlags::RELAXED_ORDERING),
            )
            .unwrap();
        Side {
            cq,
            qp,
            region: RefCell::new(region),
        }
    };
    let (client, server) = (side(), side());
    let ah = if qp_type == QpType::Ud {
        client.qp.activate_ud(dev.port, UD_QKEY, 0).unwrap();
        server.qp.activate_ud(dev.port, UD_QKEY, 0).unwrap();
        let gid = dev.ctx.query_gid(dev.port, dev.gid_index).unwrap();
        Some(
            pd.create_ah(&AddressVector::roce(dev.port, gid, dev.gid_index))
                .unwrap(),
        )
    } else {
        connect_pair(&dev, &client.qp, &server.qp, remote_all());
        None
    };
    Players {
        dev,
        pd,
        qp_type,
        cq_kind,
        access,
        ah,
        client,
        server,
    }
}

/// How `traffic` carries each message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// Send.
    Send,
    /// Send with this immediate value.
    SendImm(u32),
    /// RDMA write with this immediate value into the start of the peer's
    /// region (consuming one of its receives).
    WriteImm(u32),
}

impl Players {
    /// A buffer of the players' access holding `bytes`.
    pub fn buf(&self, bytes: &[u8]) -> LocalBuffer {
        let mut b = self.pd.alloc(bytes.len(), self.access).unwrap();
        b.copy_from_slice(bytes);
        b
    }

    /// The next completion of `cq`, taken as the players' CQ kind says
    /// (10 s at most).
    pub fn next(&self, cq: &CompletionQueue) -> Completion {
        let deadline = Instant::now() + Duration::from_secs(10);
        if self.cq_kind == CqKind::Events {
            let ch = cq.channel().expect("a CQ with a channel");
            loop {
                match ch.get_event() {
                    Ok(Some(ev)) => {
                        assert_eq!(ev.as_ptr(), cq.as_ptr(), "the event names its CQ");
                        break;
                    }
                    Ok(None) => panic!("an event for a CQ that is gone"),
                    Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => {
                        assert!(Instant::now() < deadline, "no completion event");
                        std::thread::sleep(Duration::from_micros(200));
                    }
                    Err(e) => panic!("{e}"),
                }
            }
            cq.req_notify(false).unwrap();
        }
        loop {
            if let Some(c) = cq.poll_one().unwrap() {
                return c;
            }
            assert!(Instant::now() < deadline, "no completion");
        }
    }

    /// [`Players::next`], which must be a success.
    pub fn next_ok(&self, cq: &CompletionQueue) -> Completion {
        let c = self.next(cq);
        c.result().unwrap_or_else(|e| panic!("{e}: {c:?}"));
        c
    }

    /// Nothing more on either CQ (and no event pending).
    pub fn quiet(&self) {
        std::thread::sleep(Duration::from_millis(50));
        for cq in [&self.client.cq, &self.server.cq] {
            assert!(cq.poll_one().unwrap().is_none(), "unexpected completion");
            if let Some(ch) = cq.channel() {
                assert!(
                    matches!(ch.get_event(), Err(ref e) if e.raw_os_error() == Some(libc::EAGAIN)),
                    "unexpected event"
                );
            }
        }
    }

    fn recv(&self, side: &Side, size: usize, wr_id: u64) {
        let extra = if self.qp_type == QpType::Ud { GRH } else { 0 };
        let buf = self.buf(&vec![0xEE; extra + size]);
        super::post_recv(&side.qp, RecvRequest::new(buf).wr_id(wr_id)).unwrap();
    }

    /// pyverbs' `traffic()`: a receive posted on each side; then `iters`
    /// times the client's `size`-byte message to the server, checked, a
    /// receive posted again, and the server's answer checked the same way.
    /// Every send's buffer comes back unchanged, every receive's opcode,
    /// length and immediate value is checked.
    pub fn traffic(&self, iters: usize, size: usize, via: Via) {
        let ud = self.qp_type == QpType::Ud;
        let extra = if ud { GRH } else { 0 };
        self.recv(&self.client, size, 1);
        self.recv(&self.server, size, 2);
        for i in 0..iters {
            for (from, to, seed, recv_id) in [
                (&self.client, &self.server, b'c', 2),
                (&self.server, &self.client, b's', 1),
            ] {
                let payload = pattern(size, seed.wrapping_add(i as u8));
                let buf = self.buf(&payload);
                let (req, imm) = match via {
                    Via::Send => (SendRequest::send(buf), None),
                    Via::SendImm(imm) => (SendRequest::send(buf).imm(imm), Some(imm)),
                    Via::WriteImm(imm) => {
                        let remote = to.remote(0, size);
                        (SendRequest::write(buf, remote).imm(imm), Some(imm))
                    }
                };
                let req = match &self.ah {
                    Some(ah) => req.ud(ah, to.qp.qp_num(), UD_QKEY),
                    None => req,
                };
                super::post_send(&from.qp, req.wr_id(100 + i as u64)).unwrap();
                let mut s = self.next_ok(&from.cq);
                let want = match via {
                    Via::WriteImm(_) => WcOpcode::RdmaWrite,
                    _ => WcOpcode::Send,
                };
                assert_eq!((s.wr_id(), s.opcode()), (100 + i as u64, want), "{i}");
                assert_eq!(
                    &s.take_local().expect("the send's buffer")[..],
                    &payload[..]
                );

                let mut r = self.next_ok(&to.cq);
                let want = match via {
                    Via::WriteImm(_) => WcOpcode::RecvRdmaWithImm,
                    _ => WcOpcode::Recv,
                };
                assert_eq!((r.wr_id(), r.opcode()), (recv_id, want), "{i}: {r:?}");
                assert_eq!(r.imm_data(), imm, "{i}");
                assert_eq!(r.qp_num(), to.qp.qp_num().0, "{i}");
                let got = match via {
                    Via::WriteImm(_) => {
                        assert_eq!(r.byte_len() as usize, size, "{i}");
                        let mut got = vec![0; size];
                        to.region.borrow().copy_to_slice(0, &mut got).unwrap();
                        got
                    }
                    _ => {
                        assert_eq!(r.byte_len() as usize, extra + size, "{i}");
                        r.take_local().expect("the receive's buffer")[extra..].to_vec()
                    }
                };
                assert_eq!(got, payload, "{i}: the bytes that arrived");
                self.recv(to, size, recv_id);
            }
        }
        self.quiet();
    }
}

/// What `rdma_traffic` does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rdma {
    Write,
    Read,
}

impl Players {
    /// pyverbs' `rdma_traffic()`: `iters` times, the client writes `size`
    /// bytes into the start of the server's region (or reads them from
    /// there), the bytes are checked on both sides, and the server does
    /// the same to the client. The rest of the target region is checked
    /// untouched (all of it for `size` 0).
    pub fn rdma_traffic(&self, iters: usize, size: usize, op: Rdma) {
        for i in 0..iters {
            for (from, to, seed) in [
                (&self.client, &self.server, b'c'),
                (&self.server, &self.client, b's'),
            ] {
                let payload = pattern(size, seed.wrapping_add(i as u8));
                // What the target holds before: `payload` in front for a
                // read, something else everywhere for a write.
                let mut before = pattern(REGION, seed.wrapping_add(100 + i as u8));
                if op == Rdma::Read {
                    before[..size].copy_from_slice(&payload);
                }
                to.region.borrow_mut().copy_from_slice(0, &before).unwrap();
                let remote = to.remote(0, size);
                let wr_id = 200 + i as u64;
                match op {
                    Rdma::Write => {
                        let req = SendRequest::write(self.buf(&payload), remote).wr_id(wr_id);
                        super::post_send(&from.qp, req).unwrap();
                    }
                    Rdma::Read => {
                        let dst = self.buf(&vec![0xEE; size]);
                        super::post_send(&from.qp, SendRequest::read(dst, remote).wr_id(wr_id))
                            .unwrap();
                    }
                }
                let mut c = self.next_ok(&from.cq);
                let want = match op {
                    Rdma::Write => WcOpcode::RdmaWrite,
                    Rdma::Read => WcOpcode::RdmaRead,
                };
                assert_eq!((c.wr_id(), c.opcode()), (wr_id, want), "{i}");
                assert_eq!(
                    &c.take_local().expect("the request's buffer")[..],
                    &payload[..],
                    "{i}: the written bytes, or what the read brought back"
                );
                let mut after = before.clone();
                after[..size].copy_from_slice(&payload);
                assert_eq!(to.region.borrow().to_vec(), after, "{i}: the target");
            }
        }
        self.quiet();
    }
}

/// What `atomic_traffic` runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Atomic {
    CompareSwap,
    FetchAdd,
    /// Atomic write (extended queue pairs only).
    Write,
}

impl Players {
    /// pyverbs' `atomic_traffic()` (and, for `Write`, its atomic-write
    /// `rdma_traffic()`): `iters` times the client runs `op` on the first
    /// word of the server's region, then the server on the client's; the
    /// word and the original value handed back are checked. Compare-and-
    /// swap alternates a matching compare (the word is swapped) with one
    /// that does not match (the word stays), as pyverbs' two rounds do.
    pub fn atomic_traffic(&self, iters: usize, op: Atomic) {
        for i in 0..iters as u64 {
            for (from, to, seed) in [
                (&self.client, &self.server, 1),
                (&self.server, &self.client, 2),
            ] {
                let old = 0x0101_0101_0101_0101u64.wrapping_mul(seed + i % 100);
                let arg = 0x0202_0202_0202_0202u64.wrapping_add(i);
                to.region
                    .borrow_mut()
                    .copy_from_slice(0, &old.to_ne_bytes())
                    .unwrap();
                let word = to.remote(0, 8);
                let wr_id = 300 + i;
                let result = || self.buf(&[0xEE; 8]);
                let (req, want, new) = match op {
                    Atomic::CompareSwap if i % 2 == 0 => (
                        SendRequest::compare_and_swap(result(), word, old, arg),
                        WcOpcode::CompSwap,
                        arg,
                    ),
                    Atomic::CompareSwap => (
                        SendRequest::compare_and_swap(result(), word, old ^ 1, arg),
                        WcOpcode::CompSwap,
                        old,
                    ),
                    Atomic::FetchAdd => (
                        SendRequest::fetch_and_add(result(), word, arg),
                        WcOpcode::FetchAdd,
                        old.wrapping_add(arg),
                    ),
                    Atomic::Write => (
                        SendRequest::atomic_write(word, arg.to_ne_bytes()),
                        WcOpcode::AtomicWrite,
                        arg,
                    ),
                };
                super::post_send(&from.qp, req.wr_id(wr_id)).unwrap();
                let mut c = self.next_ok(&from.cq);
                assert_eq!((c.wr_id(), c.opcode()), (wr_id, want), "{op:?} {i}");
                if op != Atomic::Write {
                    let r = c.take_local().expect("the result buffer");
                    let got = u64::from_ne_bytes(r[..8].try_into().unwrap());
                    assert_eq!(got, old, "{op:?} {i}: the original value comes back");
                }
                let mut now = [0u8; 8];
                to.region.borrow().copy_to_slice(0, &mut now).unwrap();
                assert_eq!(u64::from_ne_bytes(now), new, "{op:?} {i}: the word");
            }
        }
        self.quiet();
    }
}
