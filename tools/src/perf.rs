//! Shared code of the perftest-style tools (`write_lat`, `write_bw`,
//! `send_lat`, `send_bw`, `read_lat`, `read_bw`, `atomic_lat`): options,
//! device setup, the TCP exchange, completion waiting, the streaming engine
//! of the bandwidth tools, statistics and the result tables.

pub mod args;
pub mod net;
pub mod report;
pub mod stats;
pub mod stream;

use std::process::ExitCode;
use std::time::{Duration, Instant};

use rdma_verbs::{
    cq::{CompletionChannel, WorkCompletion},
    device::{DeviceAttr, GidIndex, Mtu, PortAttr},
    memory::SgList,
    AccessFlags, Completion, CompletionQueue, ConnectOptions, Context, Endpoint, LocalPort,
    PortNumber, ProtectionDomain, QpType, QueuePair, RemoteMemory,
};

use args::Config;
use net::ConnInfo;

/// Errors of the tools: anything printable.
pub type Error = Box<dyn std::error::Error + Send + Sync>;
/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Memory budget for pools of buffers (receive buffers of `send_bw`, read
/// targets of `read_bw`): at most this much, at least one message.
pub const POOL_BUDGET: u64 = 64 << 20;

/// The tests, as exchanged in the greeting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Test {
    /// `write_lat`.
    WriteLat = 1,
    /// `write_bw`.
    WriteBw = 2,
    /// `send_lat`.
    SendLat = 3,
    /// `send_bw`.
    SendBw = 4,
    /// `read_lat`.
    ReadLat = 5,
    /// `read_bw`.
    ReadBw = 6,
    /// `atomic_lat -A CAS`.
    AtomicCas = 7,
    /// `atomic_lat -A FAA`.
    AtomicFaa = 8,
}

impl Test {
    /// perftest's title line.
    pub fn title(self) -> &'static str {
        match self {
            Test::WriteLat => "RDMA_Write Latency Test",
            Test::WriteBw => "RDMA_Write BW Test",
            Test::SendLat => "Send Latency Test",
            Test::SendBw => "Send BW Test",
            Test::ReadLat => "RDMA_Read Latency Test",
            Test::ReadBw => "RDMA_Read BW Test",
            Test::AtomicCas => "Atomic COMPARE_AND_SWAP Latency Test",
            Test::AtomicFaa => "Atomic FETCH_AND_ADD Latency Test",
        }
    }

    /// The tool name for an id from the greeting.
    pub fn name_of(id: u8) -> &'static str {
        match id {
            1 => "write_lat",
            2 => "write_bw",
            3 => "send_lat",
            4 => "send_bw",
            5 => "read_lat",
            6 => "read_bw",
            7 => "atomic_lat -A CAS",
            8 => "atomic_lat -A FAA",
            _ => "an unknown test",
        }
    }
}

/// Runs `f`, printing its error as `tool: error` and mapping it to exit
/// status 1.
pub fn main_with(tool: &str, f: impl FnOnce() -> Result<()>) -> ExitCode {
    match f() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{tool}: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Waits for completions: busy polling, or sleeping on a completion channel
/// (`-e`), every wait bounded by a timeout.
pub struct Waiter {
    cq: CompletionQueue,
    channel: Option<CompletionChannel>,
    timeout: Duration,
    armed: bool,
}

impl Waiter {
    /// Polls without waiting.
    pub fn poll(&mut self, done: &mut crate::Done) -> Result<usize> {
        Ok(done.poll(&self.cq)?)
    }

    /// Waits for the next completion: busy polling takes it with
    /// `poll_one`; sleeping goes through `done`, which may keep further
    /// completions for the next call.
    pub fn wait_one(&mut self, done: &mut crate::Done, what: &str) -> Result<Completion> {
        if self.channel.is_none() {
            return wait_one(&self.cq, self.timeout, what);
        }
        loop {
            if let Some(c) = done.pop() {
                return Ok(c);
            }
            self.wait(done, what)?;
        }
    }

    /// Waits for the next completion into `wc` (a failed one is an error)
    /// and returns its request's buffers, as `wait_one`.
    #[inline]
    pub fn wait_wc(
        &mut self,
        done: &mut crate::Done,
        wc: &mut WorkCompletion,
        what: &str,
    ) -> Result<SgList> {
        let mut c = self.wait_one(done, what)?;
        *wc = *c.wc();
        let sg = c.take_buffers();
        if !wc.is_success() {
            return Err(format!("{what} failed: {}", wc.status()).into());
        }
        Ok(sg)
    }

    /// Polls until at least one completion arrived; an error after the
    /// timeout. `what` names the awaited event in the error.
    pub fn wait(&mut self, done: &mut crate::Done, what: &str) -> Result<usize> {
        let Waiter {
            cq,
            channel,
            timeout,
            armed,
        } = self;
        match channel {
            None => wait_busy(cq, *timeout, done, what),
            Some(ch) => wait_event(cq, ch, armed, *timeout, done, what),
        }
    }
}

fn timed_out(timeout: Duration, what: &str) -> Error {
    format!(
        "no completion for {what} within {:.1} s (is the peer alive?)",
        timeout.as_secs_f64()
    )
    .into()
}

fn wait_busy(
    cq: &CompletionQueue,
    timeout: Duration,
    done: &mut crate::Done,
    what: &str,
) -> Result<usize> {
    let mut spins = 0u32;
    let mut start: Option<Instant> = None;
    loop {
        let n = done.poll(cq)?;
        if n > 0 {
            return Ok(n);
        }
        spins = spins.wrapping_add(1);
        if spins % 4096 == 0 && start.get_or_insert_with(Instant::now).elapsed() > timeout {
            return Err(timed_out(timeout, what));
        }
        // No `spin_loop()` (PAUSE), as in perftest's loops: it delays
        // noticing the event, and under QEMU's TCG it leaves the
        // translated-code loop on every spin.
    }
}

/// The raw loops' wait: busy-polls `cq` through `poll_raw` until one
/// completion arrived and checks its status. `what` names the request in
/// the errors, built only then (the loop does not allocate).
///
/// # Safety
/// The caller must ensure that only raw-path requests (`post_send_raw`,
/// `post_recv_raw`) complete on `cq`: the contract of
/// [`CompletionQueue::poll_raw`].
#[inline]
pub unsafe fn wait_raw(
    cq: &CompletionQueue,
    wc: &mut [WorkCompletion; 1],
    timeout: Duration,
    what: impl Fn() -> String,
) -> Result<()> {
    let mut spins = 0u32;
    let mut start: Option<Instant> = None;
    // SAFETY: forwarded to the caller's contract (only raw requests
    // complete on `cq`).
    while unsafe { cq.poll_raw(wc) }? == 0 {
        spins = spins.wrapping_add(1);
        if spins % 4096 == 0 && start.get_or_insert_with(Instant::now).elapsed() > timeout {
            return Err(format!("no completion for {} within the timeout", what()).into());
        }
    }
    if !wc[0].is_success() {
        return Err(format!("{} failed: {}", what(), wc[0].status()).into());
    }
    Ok(())
}

/// Busy-polls `cq` for one completion, an error after `timeout`.
#[inline]
fn wait_one(cq: &CompletionQueue, timeout: Duration, what: &str) -> Result<Completion> {
    spin(timeout, what, || cq.poll_one())
}

/// Calls `poll` until it gives something; an error after `timeout`.
#[inline(always)]
fn spin<T>(
    timeout: Duration,
    what: &str,
    mut poll: impl FnMut() -> rdma_verbs::Result<Option<T>>,
) -> Result<T> {
    let mut spins = 0u32;
    let mut start: Option<Instant> = None;
    loop {
        if let Some(got) = poll()? {
            return Ok(got);
        }
        spins = spins.wrapping_add(1);
        if spins % 4096 == 0 && start.get_or_insert_with(Instant::now).elapsed() > timeout {
            return Err(timed_out(timeout, what));
        }
        // No `spin_loop()` (PAUSE), as in perftest's loops: it delays
        // noticing the event, and under QEMU's TCG it leaves the
        // translated-code loop on every spin.
    }
}

fn wait_event(
    cq: &CompletionQueue,
    ch: &CompletionChannel,
    armed: &mut bool,
    timeout: Duration,
    done: &mut crate::Done,
    what: &str,
) -> Result<usize> {
    use std::os::fd::AsRawFd;
    let deadline = Instant::now() + timeout;
    loop {
        let n = done.poll(cq)?;
        if n > 0 {
            return Ok(n);
        }
        if !*armed {
            // Arm, then poll once more: a completion that arrived before
            // arming raises no event.
            cq.req_notify(false)?;
            *armed = true;
            continue;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(timed_out(timeout, what));
        }
        let ms = left.as_millis().clamp(1, i32::MAX as u128) as i32;
        match crate::wait_readable(ch.as_raw_fd(), ms) {
            Ok(false) => continue,
            Ok(true) => {
                ch.get_event()?;
                *armed = false;
            }
            Err(e) => return Err(format!("poll on the completion channel: {e}").into()),
        }
    }
}

/// Queue pair sizes.
#[derive(Debug, Clone, Copy)]
pub struct QpSpec {
    /// Send queue depth.
    pub send_wr: u32,
    /// Receive queue depth.
    pub recv_wr: u32,
}

/// Device, port, PD, CQ and the RC QP of a run.
pub struct Resources {
    /// The device.
    pub ctx: Context,
    /// Its attributes.
    pub dev_attr: DeviceAttr,
    /// The port.
    pub port: PortNumber,
    /// The port's attributes.
    pub port_attr: PortAttr,
    /// The GID index.
    pub gid_index: GidIndex,
    /// Protection domain.
    pub pd: ProtectionDomain,
    /// The one CQ (send and receive).
    pub cq: CompletionQueue,
    /// Completion waiting.
    pub waiter: Waiter,
    /// The RC queue pair.
    pub qp: QueuePair,
    /// The port's facts, queried once (for the endpoint and connecting).
    pub local: LocalPort,
    /// The queue pair's endpoint (with our first PSN).
    pub me: Endpoint,
    /// The path MTU after connecting.
    pub mtu: Mtu,
}

impl Resources {
    /// Opens the device and creates PD, CQ (with a channel for `-e`) and
    /// an RC QP with `spec` and `cfg.inline`.
    pub fn open(cfg: &Config, spec: QpSpec) -> Result<Resources> {
        Self::open_ex(cfg, spec, false)
    }

    /// As [`Resources::open`]; `extended` creates the CQ with
    /// `ibv_create_cq_ex` and the QP with `ibv_create_qp_ex` (`post_send`
    /// then goes through `ibv_wr_*`, `poll` through `ibv_start_poll`).
    pub fn open_ex(cfg: &Config, spec: QpSpec, extended: bool) -> Result<Resources> {
        let list = rdma_verbs::devices()?;
        let dev = match &cfg.device {
            Some(name) => list.find(name).ok_or_else(|| {
                format!(
                    "no RDMA device named {name:?} (found: {})",
                    list.iter()
                        .map(|d| d.name().to_owned())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            })?,
            None => list.get(0).ok_or("no RDMA device found")?,
        };
        let ctx = dev.open()?;
        let dev_attr = ctx.query_device()?;
        let port = match cfg.ib_port {
            Some(p) => PortNumber(p),
            None => ctx.active_port()?,
        };
        let port_attr = ctx
            .query_port(port)
            .map_err(|e| format!("port {port} of {}: {e}", ctx.name()))?;
        let gid_index = match cfg.gid_index {
            Some(g) => GidIndex(g),
            None => ctx.default_gid_index(port)?,
        };
        let max = cfg.max_size();
        if max > u64::from(port_attr.max_msg_size()) {
            return Err(format!(
                "messages of {max} B exceed the port's largest message ({} B)",
                port_attr.max_msg_size()
            )
            .into());
        }
        let pd = ctx.alloc_pd()?;
        let cqe = spec.send_wr + spec.recv_wr + 1;
        let channel = if cfg.events {
            Some(ctx.create_comp_channel()?)
        } else {
            None
        };
        let mut cqb = ctx.create_cq(cqe);
        if let Some(ch) = &channel {
            cqb = cqb.channel(ch);
        }
        if extended {
            cqb = cqb.wc_fields(rdma_verbs::cq::CompletionFields::standard());
        }
        let cq = cqb
            .build()
            .map_err(|e| format!("creating a CQ of {cqe} entries: {e}"))?;
        let ops = if extended {
            rdma_verbs::qp::SendOpFlags::rc_data()
        } else {
            rdma_verbs::qp::SendOpFlags::empty()
        };
        let qp = pd
            .create_qp(QpType::Rc, &cq, &cq)
            .send_ops(ops)
            .max_send_wr(spec.send_wr)
            .max_recv_wr(spec.recv_wr.max(1))
            .max_inline_data(cfg.inline)
            .build()
            .map_err(|e| {
                format!(
                    "creating an RC queue pair (send depth {}, receive depth {}, inline {} B): {e}",
                    spec.send_wr,
                    spec.recv_wr.max(1),
                    cfg.inline
                )
            })?;
        if qp.caps().max_inline_data < cfg.inline {
            return Err(format!(
                "the device allows {} B of inline data, -I asked for {}",
                qp.caps().max_inline_data,
                cfg.inline
            )
            .into());
        }
        let local = LocalPort::query(&ctx, port, Some(gid_index))?;
        let me = local.endpoint(&qp, Endpoint::random_psn())?;
        let waiter = Waiter {
            cq: cq.clone(),
            channel,
            timeout: cfg.timeout,
            armed: false,
        };
        Ok(Resources {
            ctx,
            dev_attr,
            port,
            port_attr,
            gid_index,
            pd,
            cq,
            waiter,
            qp,
            local,
            me,
            mtu: port_attr.active_mtu(),
        })
    }

    /// Our connection data, offering `mem` to the peer.
    pub fn local_info(&self, mem: Option<RemoteMemory>) -> Result<ConnInfo> {
        let mtu = match self.port_attr.active_mtu() {
            Mtu::Unknown(_) => 1024,
            m => m.bytes(),
        };
        Ok(ConnInfo {
            ep: self.me,
            mtu,
            mem: mem.unwrap_or(RemoteMemory {
                addr: 0,
                len: 0,
                rkey: rdma_verbs::memory::RemoteKey(0),
            }),
        })
    }

    /// Connects the QP to the peer: path MTU the smallest of -m and both
    /// ports' active MTUs; `access` granted to the peer; with `rd_atomic`,
    /// as many outstanding RDMA reads/atomics as the device allows both
    /// ways (up to 128, perftest's "Outstand reads").
    pub fn connect(
        &mut self,
        cfg: &Config,
        remote: &ConnInfo,
        access: AccessFlags,
        rd_atomic: bool,
    ) -> Result<()> {
        let mut mtu = remote.mtu.min(self.local_info(None)?.mtu);
        if let Some(m) = cfg.mtu {
            mtu = mtu.min(m);
        }
        self.mtu = Mtu::from_bytes(mtu).unwrap_or(Mtu::Mtu1024);
        let depth = if rd_atomic {
            let d = &self.dev_attr;
            d.max_qp_init_rd_atom()
                .min(d.max_qp_rd_atom())
                .clamp(1, 128) as u8
        } else {
            1
        };
        let opts = ConnectOptions::new(self.port)
            .local_port(&self.local)
            .path_mtu(self.mtu)
            .remote_access(access)
            .rd_atomic(depth);
        self.qp
            .connect(&self.me, &remote.ep, &opts)
            .map_err(|e| format!("connecting the queue pair to the peer: {e}"))?;
        Ok(())
    }
}

/// Nanoseconds since `base` (for the timestamp vectors).
#[inline]
pub fn ns_since(base: Instant) -> u64 {
    base.elapsed().as_nanos() as u64
}

/// Per-iteration timestamps of the latency tools, taken as perftest takes
/// them (`get_cycles`): on x86-64 the TSC, a single instruction on the
/// timed path instead of a clock read and its arithmetic. [`Clock::convert`]
/// converts them afterwards with a tick rate measured against the
/// monotonic clock over the whole run. Elsewhere: nanoseconds since start.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    start: Instant,
    ticks0: u64,
}

impl Clock {
    /// Starts the clock.
    pub fn start() -> Clock {
        let start = Instant::now();
        Clock {
            start,
            ticks0: Clock { start, ticks0: 0 }.stamp(),
        }
    }

    /// A timestamp in ticks.
    #[inline]
    pub fn stamp(&self) -> u64 {
        #[cfg(target_arch = "x86_64")]
        {
            // SAFETY: RDTSC exists on every x86-64 CPU and reads a counter;
            // it has no memory effects or preconditions.
            unsafe { std::arch::x86_64::_rdtsc() }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            ns_since(self.start)
        }
    }

    /// Turns `stamps` (from [`Clock::stamp`]) into nanoseconds since
    /// [`Clock::start`], at the tick rate measured from start to now.
    pub fn convert(&self, stamps: &mut [u64]) {
        let ns = ns_since(self.start) as f64;
        let ticks = self.stamp().wrapping_sub(self.ticks0) as f64;
        let ns_per_tick = if ticks > 0.0 { ns / ticks } else { 1.0 };
        for s in stamps {
            *s = (s.wrapping_sub(self.ticks0) as f64 * ns_per_tick) as u64;
        }
    }
}

/// Number of buffers of `size` bytes a pool holds: at most `want`, within
/// [`POOL_BUDGET`] but at least one.
pub fn pool_count(size: u64, want: u64) -> u64 {
    (POOL_BUDGET / size.max(1)).clamp(1, want.max(1))
}

/// The out-of-band part of the setup: TCP connection, greeting (same test,
/// same options), connection data (offering `mem`), then connects the QP
/// granting `access`. Returns the connection and both sides' data.
pub fn handshake(
    cfg: &Config,
    res: &mut Resources,
    test: Test,
    mem: Option<RemoteMemory>,
    access: AccessFlags,
    rd_atomic: bool,
) -> Result<(net::Peer, ConnInfo, ConnInfo)> {
    let mut peer = net::Peer::establish(cfg)?;
    peer.hello(&net::Hello::new(test as u8, cfg), Test::name_of)?;
    let local = res.local_info(mem)?;
    let remote = peer.exchange(&local)?;
    res.connect(cfg, &remote, access, rd_atomic)?;
    Ok((peer, local, remote))
}

/// Checks that the peer offers at least `need` bytes of memory, aligned to
/// `align`.
pub fn check_remote(remote: &ConnInfo, need: u64, align: u64) -> Result<RemoteMemory> {
    let m = remote.mem;
    if m.len < need {
        return Err(format!(
            "the peer offers {} B of memory, this test needs {need} B",
            m.len
        )
        .into());
    }
    if m.addr % align != 0 {
        return Err(format!(
            "the peer's memory at {:#x} is not {align}-byte aligned",
            m.addr
        )
        .into());
    }
    Ok(m)
}

/// Which table a tool prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Table {
    /// Latency.
    Lat,
    /// Bandwidth.
    Bw,
}

/// The passive side (the target of RDMA reads, writes or atomics): for
/// every size, meet the client, wait for its results and print them.
pub fn serve_passive(cfg: &Config, peer: &mut net::Peer, table: Table) -> Result<()> {
    match table {
        Table::Lat => report::lat_header(),
        Table::Bw => report::bw_header(),
    }
    for &size in &cfg.sizes {
        peer.barrier(cfg.timeout)?;
        let r = peer.recv_report(size, cfg.iters, cfg.run_bound(size))?;
        match table {
            Table::Lat => report::lat_row(size, r.iters, &report::lat_from(&r.values)),
            Table::Bw => report::bw_row(size, r.iters, &report::bw_from(&r.values)),
        }
    }
    println!("{}", report::LINE);
    Ok(())
}

/// Waits for the completion of the only outstanding request and returns
/// the local buffer it carried.
pub fn wait_local(
    waiter: &mut Waiter,
    done: &mut crate::Done,
    what: &str,
) -> Result<rdma_verbs::LocalBuffer> {
    let mut c = waiter.wait_one(done, what)?;
    c.result()?;
    if !done.is_empty() {
        return Err(format!("unexpected extra completions while waiting for {what}").into());
    }
    c.take_local()
        .ok_or_else(|| format!("the completion of {what} did not return its buffer").into())
}

/// Splits `region` into `count` pieces of `size` bytes, the last one
/// taking the rest (set-up only: allocates the list).
pub fn split_pool(
    region: rdma_verbs::LocalBuffer,
    count: u32,
    size: u64,
) -> Vec<rdma_verbs::LocalBuffer> {
    let mut pieces = Vec::with_capacity(count as usize);
    let mut rest = region;
    for _ in 1..count {
        let (piece, tail) = rest.split_at(size as usize);
        pieces.push(piece);
        rest = tail;
    }
    pieces.push(rest);
    pieces
}

/// Splits `region` into `count` receive buffers of `size` bytes (see
/// [`split_pool`]) and posts them all with `wr_id`. The QP must be
/// connected (receives cannot be posted in RESET).
pub fn post_recv_pool(
    rq: &mut rdma_verbs::RecvQueue,
    region: rdma_verbs::LocalBuffer,
    count: u32,
    size: u64,
    wr_id: u64,
) -> Result<()> {
    for piece in split_pool(region, count, size) {
        rq.recv(piece, wr_id)
            .map_err(|e| format!("posting a receive: {}", e.error))?;
    }
    Ok(())
}
