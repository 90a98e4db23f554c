//! `softhca perf send|write|read|atomic`: perftest for softhca. An initiator drives `--qps`
//! RC QPs against a responder, keeping `--depth` WRs outstanding per QP (one with `--lat`),
//! and reports wall-clock bandwidth, message rate, latency percentiles, errors and
//! retransmissions. At the end the bytes are checked: every destination slot must hold the
//! pattern of its source slot (the initiator's read landing zone for Read, the responder's
//! memory for Send and Write), and every atomic counter must equal the number of fetch-adds.
//!
//! Both ends run in this process on the sim link and with `--link udp --loopback`; with
//! `--link udp --server` / `--connect HOST` they are two processes (see `perf_remote`). The
//! two halves are the same code: `Flow` is an initiator's QP and its memory, `Target` a
//! responder's.

use std::collections::VecDeque;
use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};
use softhca::link::SimCounters;
use softhca::transport::DeviceCounters;
use softhca::*;

use crate::net::{self, err, LinkKind, Net, QpInfo, Res};
use crate::PcapArg;

/// Most memory one QP's slots may take.
const SLOT_BYTES: usize = 32 << 20;

/// Receive WRs carry this bit in their wr_id, so that even an error completion (whose opcode
/// is undefined) tells a receive from a send.
pub const RECV_TAG: u64 = 1 << 63;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    /// Send into receives the responder posts (send_bw; with --lat send_lat).
    Send,
    /// RDMA Write into the responder's memory (write_bw; with --lat write_lat).
    Write,
    /// RDMA Read of the responder's memory (read_bw / read_lat).
    Read,
    /// 8-byte Fetch & Add on a counter in the responder's memory (atomic_bw / atomic_lat).
    Atomic,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Send => "Send",
            Op::Write => "RDMA Write",
            Op::Read => "RDMA Read",
            Op::Atomic => "Atomic Fetch&Add",
        }
    }
}

#[derive(clap::Args, Debug, Clone)]
#[command(after_help = "\
Examples:
  softhca perf write                                    both ends here, on the sim link
  softhca perf send --loss 0.02 --seed 3                the sim link losing 2% of datagrams
  softhca perf read --link udp --loopback               two udp devices in this process
  softhca perf write --link udp --server                process 1: the responder
  softhca perf write --link udp --connect 127.0.0.1     process 2: the initiator, which measures
  softhca perf send --link udp --connect HOST --lat --size 8 --busy-poll

The udp devices bind SOFTHCA_ADDR if set, else the first free address in 127.0.0.1-254.
SOFTHCA_WAIT_SECS (default 60) bounds every wait for progress on the udp link.")]
pub struct PerfArgs {
    /// The operation to measure.
    #[arg(value_enum)]
    pub op: Op,
    /// Message size in bytes (atomics always move 8).
    #[arg(long, short = 's', default_value_t = 65536, value_name = "BYTES")]
    pub size: usize,
    /// Messages per QP [default: 1000 unless --duration is given].
    #[arg(long, short = 'n', conflicts_with = "duration", value_name = "N")]
    pub iters: Option<u64>,
    /// Keep posting for this many wall-clock seconds instead of a fixed count, then drain what
    /// is in flight.
    #[arg(long, short = 'D', value_name = "SECS")]
    pub duration: Option<f64>,
    /// Number of RC QP pairs, each with its own memory (one CQ per end for all of them).
    #[arg(long, short = 'q', default_value_t = 1, value_name = "N")]
    pub qps: usize,
    /// Work requests kept outstanding per QP in bandwidth tests, 1–4096 (--lat keeps one);
    /// for send the responder keeps twice as many receives posted.
    #[arg(long, short = 't', default_value_t = 128, value_name = "N")]
    pub depth: u32,
    /// Send and Write carry their payload inline, copied into the WR at post time (needs
    /// --size ≤ 512, the device's max_inline_data).
    #[arg(long)]
    pub inline: bool,
    /// Latency test: one message in flight per QP, p50/p99/p99.9/max in the table. In one
    /// process it times post to completion. Two processes (--server/--connect): send and
    /// write ping-pong between the ends like perftest's send_lat and write_lat (write polls
    /// the last byte of the buffer) and report half the round trip; read and atomic time
    /// post to completion.
    #[arg(long)]
    pub lat: bool,
    /// Path MTU in bytes: 256, 512, 1024, 2048 or 4096.
    #[arg(long, short = 'm', default_value_t = 4096, value_name = "BYTES")]
    pub mtu: u32,
    /// Which link: `sim` runs both ends in this process on the simulated fabric (faults
    /// available); `udp` is RoCEv2 over real UDP sockets and needs --loopback, --server or
    /// --connect.
    #[arg(long, value_enum, default_value_t = LinkKind::Sim)]
    pub link: LinkKind,
    /// udp, shm: be the server (the responder): wait for one client on the TCP --port, take the
    /// test (--size, --iters/--duration, --qps, --depth, --inline, --lat, --mtu) from it,
    /// serve it, then print the results the client measured.
    #[arg(long, conflicts_with_all = ["connect", "loopback"])]
    pub server: bool,
    /// udp, shm: be the client (the initiator) of the server whose TCP side channel is at
    /// HOST (tried for 10 s while the server starts); the client sets the test's parameters,
    /// measures and prints the results.
    #[arg(long, value_name = "HOST", conflicts_with = "loopback")]
    pub connect: Option<String>,
    /// udp, shm: run both ends in this process, on two devices (two 127.0.0.x addresses).
    #[arg(long)]
    pub loopback: bool,
    /// TCP port of the --server/--connect side channel, which carries the test parameters,
    /// the QP numbers, PSNs, GIDs, buffer addresses and R_Keys, and the start and stop (0:
    /// the server takes one the system picks, and prints it).
    #[arg(long, short = 'p', default_value_t = 18515)]
    pub port: u16,
    /// udp, shm: each device's engine thread spins on its socket or ring instead of sleeping
    /// in the kernel, and the application's polls drive the device: lower latency where each
    /// spinning thread has a core of its own, far higher where they share one.
    #[arg(long)]
    pub busy_poll: bool,
    #[command(flatten)]
    pub faults: net::Faults,
    /// Print exactly one JSON object (bw_gbps in gigabits/s and bw_gbytes_s in gigabytes/s,
    /// both 10^9; msg_rate_mps in millions of messages/s; lat_us_p50, lat_us_p99 in µs,
    /// completions, errors, retransmits, data_verified and more) instead of the table.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub pcap: PcapArg,
}

impl PerfArgs {
    /// The settings the demo uses for a burst.
    pub fn burst(op: Op, size: usize, iters: u64, qps: usize) -> PerfArgs {
        PerfArgs {
            op,
            size,
            iters: Some(iters),
            duration: None,
            qps,
            depth: 32,
            inline: false,
            lat: false,
            mtu: 4096,
            link: LinkKind::Sim,
            server: false,
            connect: None,
            loopback: false,
            port: 18515,
            busy_poll: false,
            faults: net::Faults::default(),
            json: false,
            pcap: PcapArg::default(),
        }
    }

    pub(crate) fn msg_size(&self) -> usize {
        if self.op == Op::Atomic {
            8
        } else {
            self.size
        }
    }

    pub(crate) fn depth(&self) -> u32 {
        if self.lat {
            1
        } else {
            self.depth // in 1..=4096: `validate`
        }
    }

    /// The Local ACK Timeout exponent of the run's RC QPs (4.096 µs × 2^t): the link's
    /// ([`net::rc_timeout`]), raised until it covers the time the run's whole window takes to
    /// drain at a slow pace (100,000 messages and 100 MB a second, below what an emulated guest
    /// does). With 10,000 QPs four deep, 40,000 messages wait behind one another; on a busy
    /// host a QP's ACK then came after its 67 ms timeout, and it retransmitted what was never
    /// lost (thousands of times per run). The sim link's virtual time needs no margin.
    pub(crate) fn ack_timeout(&self) -> u8 {
        let base = net::rc_timeout(self.link);
        if self.link == LinkKind::Sim {
            return base;
        }
        let msgs = self.qps as f64 * f64::from(self.depth());
        let drain_s = msgs / 1e5 + msgs * self.msg_size() as f64 / 1e8;
        (base..=net::MAX_RC_TIMEOUT).find(|&t| net::rc_timeout_s(t) >= drain_s).unwrap_or(net::MAX_RC_TIMEOUT)
    }

    /// Messages per QP, `None` for --duration runs.
    pub(crate) fn per_qp(&self) -> Option<u64> {
        self.iters.or(if self.duration.is_some() { None } else { Some(1000) })
    }

    /// Memory slots per QP: enough for the WRs in flight, at most `SLOT_BYTES`.
    pub(crate) fn slots(&self) -> usize {
        let total = self.per_qp().unwrap_or(u64::MAX);
        let size = self.msg_size();
        (2 * u64::from(self.depth())).min(total).clamp(1, (SLOT_BYTES / size.max(1)).max(1) as u64) as usize
    }
}

/// The seed of QP `i`'s data: slot `s` holds `pattern(seed(i) | s)`.
pub(crate) fn seed(i: usize) -> u64 {
    (i as u64) << 32
}

/// The initial value of QP `i`'s atomic counter (both ends compute it).
pub(crate) fn counter0(i: usize) -> u64 {
    net::mix(i as u64 ^ 0xa70) >> 8
}

/// The source bytes of QP `i`: its `slots` patterns back to back.
pub(crate) fn source_bytes(i: usize, slots: usize, size: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(slots * size);
    for s in 0..slots {
        v.extend_from_slice(&net::pattern(seed(i) | s as u64, size));
    }
    v
}

pub(crate) fn qp_init(cq: &Cq, args: &PerfArgs) -> QpInitAttr {
    let depth = args.depth();
    QpInitAttr::rc(cq, cq)
        // Room for a ping-pong echo or two more than the protocol should ever need.
        .max_send_wr(depth.max(4))
        .max_recv_wr(depth * 2)
        .max_send_sge(1)
        .max_recv_sge(1)
        .max_inline_data(if args.inline { args.size as u32 } else { 0 })
}

pub(crate) fn cq_entries(args: &PerfArgs) -> u32 {
    ((args.depth().max(4) + 2 * args.depth()) * args.qps as u32 + 64).min(1 << 20)
}

/// What one end tells the other about a QP: QPN, PSN, GID, and the memory the peer may
/// access (`addr`/`rkey`, zero if none).
pub(crate) fn qp_info(qp: &Qp, ctx: &Context, mem: Option<&Mr>) -> Res<QpInfo> {
    Ok(QpInfo {
        qpn: qp.qp_num(),
        psn: net::initial_psn(qp.qp_num()),
        gid: net::gid_string(ctx.query_gid(1, 0)?),
        addr: mem.map_or(0, Mr::addr),
        rkey: mem.map_or(0, Mr::rkey),
        eecn: 0,
        params: String::new(),
    })
}

pub(crate) const REMOTE_ACCESS: Access =
    Access::LOCAL_WRITE.union(Access::REMOTE_WRITE).union(Access::REMOTE_READ).union(Access::REMOTE_ATOMIC);

/// An initiator's QP and its memory.
pub(crate) struct Flow {
    pub qp: Qp,
    /// Source slots (Send/Write), landing slots (Read), fetched values (Atomic).
    pub local: Mr,
    /// The source bytes again, for inline WRs.
    pub inline_src: Vec<u8>,
    /// The responder's memory.
    pub raddr: u64,
    pub rkey: u32,
    pub slots: usize,
    pub index: usize,
    pub posted: u64,
    pub completed: u64,
    /// Post time of every outstanding WR, in post order.
    pub posted_at: VecDeque<Instant>,
}

impl Flow {
    pub fn new(pd: &Pd, cq: &Cq, args: &PerfArgs, index: usize) -> Res<Flow> {
        let size = args.msg_size();
        let slots = args.slots();
        let qp = pd.create_qp(&qp_init(cq, args))?;
        let (local, inline_src) = match args.op {
            Op::Send | Op::Write => {
                let src = source_bytes(index, slots, size);
                let inline_src = if args.inline { src.clone() } else { Vec::new() };
                (pd.reg_mr(src, Access::LOCAL_WRITE)?, inline_src)
            }
            Op::Read => (pd.alloc_mr(slots * size, Access::LOCAL_WRITE)?, Vec::new()),
            Op::Atomic => (pd.alloc_mr(slots * 8, Access::LOCAL_WRITE)?, Vec::new()),
        };
        Ok(Flow {
            qp,
            local,
            inline_src,
            raddr: 0,
            rkey: 0,
            slots,
            index,
            posted: 0,
            completed: 0,
            posted_at: VecDeque::new(),
        })
    }

    /// Posts the next WR: message `posted` from (or into) slot `posted % slots`.
    pub fn post(&mut self, op: Op, size: usize, inline: bool, now: Instant) -> Res<()> {
        let k = self.posted;
        let s = (k % self.slots as u64) as usize;
        let off = s * size;
        match op {
            Op::Send | Op::Write => {
                let sge = [self.local.sge(off..off + size)];
                let mut wr = if op == Op::Send {
                    SendWr::send(k, &sge)
                } else {
                    SendWr::rdma_write(k, &sge, self.raddr.wrapping_add(off as u64), self.rkey)
                };
                if inline {
                    wr.inline_data = &self.inline_src[off..off + size];
                    wr = wr.inline();
                }
                self.qp.post_send(&[wr.signaled()])?;
            }
            Op::Read => {
                let sge = [self.local.sge(off..off + size)];
                self.qp.post_send(&[
                    SendWr::rdma_read(k, &sge, self.raddr.wrapping_add(off as u64), self.rkey).signaled()
                ])?;
            }
            Op::Atomic => {
                let sge = [self.local.sge(s * 8..s * 8 + 8)];
                self.qp.post_send(&[SendWr::atomic_fetch_add(k, &sge, self.raddr, self.rkey, 1).signaled()])?;
            }
        }
        self.posted += 1;
        self.posted_at.push_back(now);
        Ok(())
    }

    /// The initiator's half of the data check: the landing slots of Read, the values Fetch &
    /// Add returned.
    pub fn verify(&self, op: Op, size: usize) -> Res<bool> {
        let used = self.completed.min(self.slots as u64) as usize;
        match op {
            Op::Send | Op::Write => Ok(true),
            Op::Read => {
                let mut got = vec![0u8; size];
                for s in 0..used {
                    self.local.read(s * size, &mut got)?;
                    if got != net::pattern(seed(self.index) | s as u64, size) {
                        return Ok(false);
                    }
                }
                Ok(true)
            }
            Op::Atomic => {
                let slots = self.slots as u64;
                let mut w = [0u8; 8];
                for s in 0..used as u64 {
                    // The last fetch-add that used slot s.
                    let last = s + slots * ((self.completed - 1 - s) / slots);
                    self.local.read(s as usize * 8, &mut w)?;
                    if u64::from_ne_bytes(w) != counter0(self.index).wrapping_add(last) {
                        return Ok(false);
                    }
                }
                Ok(true)
            }
        }
    }
}

/// A responder's QP and its memory.
pub(crate) struct Target {
    pub qp: Qp,
    /// Destination or receive slots (Send/Write), source slots (Read), the counter (Atomic).
    pub mem: Mr,
    pub slots: usize,
    pub index: usize,
    pub recv_posted: u64,
    pub recv_done: u64,
    /// Receives whose length was not the message size.
    pub bad_len: u64,
}

impl Target {
    pub fn new(pd: &Pd, cq: &Cq, args: &PerfArgs, index: usize) -> Res<Target> {
        let size = args.msg_size();
        let slots = args.slots();
        let qp = pd.create_qp(&qp_init(cq, args))?;
        let mem = match args.op {
            Op::Send | Op::Write => pd.alloc_mr(slots * size, REMOTE_ACCESS)?,
            Op::Read => pd.reg_mr(source_bytes(index, slots, size), REMOTE_ACCESS)?,
            Op::Atomic => {
                let word = pd.alloc_mr(8, REMOTE_ACCESS)?;
                word.write(0, &counter0(index).to_ne_bytes())?;
                word
            }
        };
        Ok(Target { qp, mem, slots, index, recv_posted: 0, recv_done: 0, bad_len: 0 })
    }

    pub fn post_recv(&mut self, size: usize) -> Res<()> {
        let k = self.recv_posted;
        let off = (k % self.slots as u64) as usize * size;
        self.qp.post_recv(&[RecvWr::new(k | RECV_TAG, &[self.mem.sge(off..off + size)])])?;
        self.recv_posted += 1;
        Ok(())
    }

    /// The responder's half of the data check, once the initiator completed `completed`
    /// messages on this QP: every used slot holds its pattern, every Send arrived whole, the
    /// counter counts every fetch-add.
    pub fn verify(&self, op: Op, size: usize, completed: u64) -> Res<bool> {
        let used = completed.min(self.slots as u64) as usize;
        match op {
            Op::Send | Op::Write => {
                if op == Op::Send && (self.recv_done != completed || self.bad_len > 0) {
                    return Ok(false);
                }
                let mut got = vec![0u8; size];
                for s in 0..used {
                    self.mem.read(s * size, &mut got)?;
                    if got != net::pattern(seed(self.index) | s as u64, size) {
                        return Ok(false);
                    }
                }
                Ok(true)
            }
            Op::Read => Ok(true),
            Op::Atomic => {
                let mut w = [0u8; 8];
                self.mem.read(0, &mut w)?;
                Ok(u64::from_ne_bytes(w) == counter0(self.index).wrapping_add(completed))
            }
        }
    }
}

/// Error completions and the first one's description.
#[derive(Debug, Default)]
pub(crate) struct Errors {
    pub count: u64,
    pub first: Option<String>,
}

impl Errors {
    pub fn record(&mut self, what: &str, wc: &Wc) {
        self.count += 1;
        self.first.get_or_insert_with(|| {
            let what = if what.is_empty() { String::new() } else { format!("{what} ") };
            format!("{what}wr_id {} on QP {:#08x}: {} ({:?})", wc.wr_id & !RECV_TAG, wc.qp_num, wc.status, wc.status)
        });
    }

    pub fn absorb(&mut self, count: u64, first: Option<String>) {
        self.count = self.count.saturating_add(count); // the peer's count: not trusted
        if self.first.is_none() {
            self.first = first;
        }
    }
}

/// The responder's QPs of a run, on one device.
pub(crate) struct Responder {
    pub ctx: Context,
    pub _pd: Pd,
    pub cq: Cq,
    pub targets: Vec<Target>,
    pub by_qpn: QpIndex,
}

impl Responder {
    pub fn new(ctx: &Context, args: &PerfArgs) -> Res<Responder> {
        let pd = ctx.alloc_pd()?;
        let cq = ctx.create_cq(cq_entries(args))?;
        let mut targets = Vec::new();
        for i in 0..args.qps {
            targets.push(Target::new(&pd, &cq, args, i)?);
        }
        let by_qpn = QpIndex::new(targets.iter().map(|t| t.qp.qp_num()));
        Ok(Responder { ctx: ctx.clone(), _pd: pd, cq, targets, by_qpn })
    }

    /// Keeps each QP's receives `2 × depth` ahead of what arrived, but never beyond
    /// `limit(i)` in all.
    pub fn replenish(&mut self, size: usize, depth: u64, limit: impl Fn(usize) -> u64) -> Res<()> {
        for (i, t) in self.targets.iter_mut().enumerate() {
            while t.recv_posted < (t.recv_done + 2 * depth).min(limit(i)) {
                t.post_recv(size)?;
            }
        }
        Ok(())
    }

    /// Reaps receive completions; returns how many CQEs it took.
    pub fn poll(&mut self, wcs: &mut [Wc], size: usize, errors: &mut Errors) -> Res<usize> {
        let mut all = 0;
        loop {
            let n = self.cq.poll(wcs)?;
            if n == 0 {
                return Ok(all);
            }
            all += n;
            for wc in &wcs[..n] {
                let Some(i) = self.by_qpn.get(wc.qp_num) else { continue };
                let t = &mut self.targets[i];
                if wc.wr_id & RECV_TAG != 0 {
                    t.recv_done += 1;
                    if wc.status == WcStatus::Success && wc.byte_len as usize != size {
                        t.bad_len += 1;
                    }
                }
                if wc.status != WcStatus::Success {
                    errors.record(if wc.wr_id & RECV_TAG != 0 { "receive" } else { "send" }, wc);
                }
            }
        }
    }

    pub fn verify(&self, op: Op, size: usize, completed: &[u64]) -> Res<bool> {
        for (t, &c) in self.targets.iter().zip(completed) {
            if !t.verify(op, size, c)? {
                return Ok(false);
            }
        }
        Ok(completed.len() == self.targets.len())
    }
}

/// Which of a run's QPs (by position) a completion's QP number is. A device numbers the QPs
/// created one after another in a row, so a number is looked for first where that puts it:
/// with 10,000 QPs a hash map's lookup per completion was a cache miss (most of the time the
/// harness took); numbers not in a row are found by binary search.
pub(crate) struct QpIndex {
    /// (QPN, position), sorted by QPN.
    by_qpn: Vec<(u32, u32)>,
}

impl QpIndex {
    pub fn new(qpns: impl Iterator<Item = u32>) -> QpIndex {
        let mut by_qpn: Vec<(u32, u32)> = qpns.zip(0..).collect();
        by_qpn.sort_unstable();
        QpIndex { by_qpn }
    }

    pub fn get(&self, qpn: u32) -> Option<usize> {
        let first = self.by_qpn.first()?.0;
        let found = match self.by_qpn.get(qpn.wrapping_sub(first) as usize) {
            Some(&(q, i)) if q == qpn => Some(i),
            _ => self.by_qpn.binary_search_by_key(&qpn, |&(q, _)| q).ok().map(|at| self.by_qpn[at].1),
        };
        found.map(|i| i as usize)
    }
}

/// The initiator's QPs of a run, on one device.
pub(crate) struct Initiator {
    pub ctx: Context,
    pub _pd: Pd,
    pub cq: Cq,
    pub flows: Vec<Flow>,
    pub by_qpn: QpIndex,
}

impl Initiator {
    pub fn new(ctx: &Context, args: &PerfArgs) -> Res<Initiator> {
        let pd = ctx.alloc_pd()?;
        let cq = ctx.create_cq(cq_entries(args))?;
        let mut flows = Vec::new();
        for i in 0..args.qps {
            flows.push(Flow::new(&pd, &cq, args, i)?);
        }
        let by_qpn = QpIndex::new(flows.iter().map(|f| f.qp.qp_num()));
        Ok(Initiator { ctx: ctx.clone(), _pd: pd, cq, flows, by_qpn })
    }
}

/// Both ends in this process, connected.
pub struct Setup {
    init: Initiator,
    resp: Responder,
}

/// What a run measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PerfResult {
    pub test: Op,
    pub link: LinkKind,
    /// Where the ends ran: "sim", "loopback" (udp, one process) or "client" (udp, two
    /// processes; the server's counters and data check included).
    pub mode: String,
    pub size: usize,
    pub qps: usize,
    pub depth: u32,
    pub inline: bool,
    /// The RC QPs' Local ACK Timeout in ms (see `PerfArgs::ack_timeout`).
    pub ack_timeout_ms: f64,
    pub iters: u64,
    /// Gigabits (10^9 bits) per second of payload, wall-clock.
    pub bw_gbps: f64,
    /// The same in gigabytes (10^9 bytes) per second: `bw_gbps / 8`.
    pub bw_gbytes_s: f64,
    /// Millions of messages per second, wall-clock.
    pub msg_rate_mps: f64,
    /// What the latency figures are: "completion" (post to CQE) or "half round trip"
    /// (ping-pong between two processes, perftest's send_lat / write_lat convention).
    pub lat_method: String,
    /// Latency percentiles, wall-clock microseconds.
    pub lat_us_p50: f64,
    pub lat_us_p99: f64,
    pub lat_us_p999: f64,
    pub lat_us_max: f64,
    /// Successful and failed completions of the initiator's WRs.
    pub completions: u64,
    /// Error completions at either end.
    pub errors: u64,
    /// Go-back-N retransmission rounds at either end.
    pub retransmits: u64,
    pub data_verified: bool,
    pub bytes: u64,
    pub wall_s: f64,
    /// Sim link only: virtual time the run took, and the bandwidth on the virtual clock.
    pub virtual_s: Option<f64>,
    pub virtual_bw_gbps: Option<f64>,
    /// Both ends' device counters.
    pub device: CountersJson,
    pub sim: Option<SimJson>,
    pub pcap: Option<String>,
    /// Two processes: the server's device address.
    pub peer: Option<String>,
    /// The first error completion, if any.
    pub first_error: Option<String>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, Default)]
pub struct CountersJson {
    pub tx_packets: u64,
    pub rx_packets: u64,
    pub rx_dropped: u64,
    pub rx_bad_icrc: u64,
    pub retransmits: u64,
    pub timeouts: u64,
    pub seq_naks_sent: u64,
    pub seq_naks_received: u64,
    pub rnr_naks_sent: u64,
    pub implied_naks: u64,
}

impl From<DeviceCounters> for CountersJson {
    fn from(c: DeviceCounters) -> Self {
        CountersJson {
            tx_packets: c.tx_packets,
            rx_packets: c.rx_packets,
            rx_dropped: c.rx_dropped,
            rx_bad_icrc: c.rx_bad_icrc,
            retransmits: c.retransmits,
            timeouts: c.timeouts,
            seq_naks_sent: c.seq_naks_sent,
            seq_naks_received: c.seq_naks_received,
            rnr_naks_sent: c.rnr_naks_sent,
            implied_naks: c.implied_naks,
        }
    }
}

// Saturating: the peer reports its half, and a peer is not trusted to report sense.
impl std::ops::Add for CountersJson {
    type Output = CountersJson;
    fn add(self, o: CountersJson) -> CountersJson {
        CountersJson {
            tx_packets: self.tx_packets.saturating_add(o.tx_packets),
            rx_packets: self.rx_packets.saturating_add(o.rx_packets),
            rx_dropped: self.rx_dropped.saturating_add(o.rx_dropped),
            rx_bad_icrc: self.rx_bad_icrc.saturating_add(o.rx_bad_icrc),
            retransmits: self.retransmits.saturating_add(o.retransmits),
            timeouts: self.timeouts.saturating_add(o.timeouts),
            seq_naks_sent: self.seq_naks_sent.saturating_add(o.seq_naks_sent),
            seq_naks_received: self.seq_naks_received.saturating_add(o.seq_naks_received),
            rnr_naks_sent: self.rnr_naks_sent.saturating_add(o.rnr_naks_sent),
            implied_naks: self.implied_naks.saturating_add(o.implied_naks),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct SimJson {
    pub sent: u64,
    pub delivered: u64,
    pub lost: u64,
    pub duplicated: u64,
    pub reordered: u64,
    pub corrupted: u64,
}

impl From<SimCounters> for SimJson {
    fn from(c: SimCounters) -> Self {
        SimJson {
            sent: c.sent,
            delivered: c.delivered,
            lost: c.lost,
            duplicated: c.duplicated,
            reordered: c.reordered,
            corrupted: c.corrupted,
        }
    }
}

/// Checks which link takes which options: before anything is opened, for every mode.
pub(crate) fn check_link_flags(args: &PerfArgs) -> Res<()> {
    validate(args)?;
    match args.link {
        LinkKind::Sim if args.server || args.connect.is_some() || args.loopback => {
            Err(err("--server/--connect/--loopback are for --link udp or shm; --link sim runs both ends here"))
        }
        LinkKind::Udp | LinkKind::Shm
            if args.faults.loss + args.faults.dup + args.faults.reorder + args.faults.corrupt > 0.0 =>
        {
            Err(err("--loss/--dup/--reorder/--corrupt are faults of the sim link"))
        }
        LinkKind::Udp | LinkKind::Shm if !args.server && args.connect.is_none() && !args.loopback => {
            Err(err("--link udp and --link shm need --loopback (both ends here), --server or --connect HOST"))
        }
        _ => Ok(()),
    }
}

/// Both ends in this process: on the sim link, or on two UDP devices (`--loopback`). The two
/// processes of `--server`/`--connect` are [`crate::perf_remote`]'s.
pub fn run_local(args: &PerfArgs) -> Res<()> {
    let mut net = match args.link {
        LinkKind::Sim => Net::sim(&args.faults, args.pcap.pcap.as_deref())?,
        LinkKind::Udp | LinkKind::Shm => Net::os(args.link, args.pcap.pcap.as_deref(), args.busy_poll),
    };
    let ca = net.add_device("softhca0")?;
    let cb = net.add_device("softhca1")?;
    let mut setup = setup(&ca, &cb, args)?;
    let bar = progress_bar(args);
    let result = measure(&mut net, &mut setup, args, bar.as_ref())?;
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    report(&result, args.json)
}

/// Prints `result` as the table or JSON; an error if it failed.
pub(crate) fn report(result: &PerfResult, json: bool) -> Res<()> {
    if json {
        println!("{}", serde_json::to_string(result)?);
    } else {
        print_table(result);
    }
    if result.errors > 0 {
        return Err(err(format!(
            "{} error completions; first: {}",
            result.errors,
            result.first_error.as_deref().unwrap_or("?")
        )));
    }
    if !result.data_verified {
        return Err(err("data verification FAILED: destination bytes differ from the source pattern"));
    }
    Ok(())
}

pub(crate) fn validate(args: &PerfArgs) -> Res<()> {
    if args.qps == 0 || args.qps > 16384 {
        return Err(err("--qps must be in 1..=16384"));
    }
    if args.op != Op::Atomic && args.size == 0 {
        return Err(err("--size must be at least 1"));
    }
    if args.size > 1 << 30 {
        return Err(err("--size must be at most 1 GiB"));
    }
    if args.inline && !matches!(args.op, Op::Send | Op::Write) {
        return Err(err("--inline applies to send and write only"));
    }
    if args.inline && args.size > 512 {
        return Err(err("--inline needs --size ≤ 512 (max_inline_data)"));
    }
    if args.iters == Some(0) {
        return Err(err("--iters must be at least 1"));
    }
    if !args.lat && !(1..=4096).contains(&args.depth) {
        return Err(err("--depth must be in 1..=4096"));
    }
    if let Some(d) = args.duration {
        if !(d > 0.0 && d <= 1e6) {
            return Err(err("--duration must be a number of seconds in (0, 1000000]"));
        }
    }
    // Each QP's buffers hold its message slots at each end, and in a latency run the
    // server's copy of what it expects and its echo's source (with the copy registered):
    // keep the whole within reach. A server takes these sizes from its client's Hello.
    let slots = args.slots() as u64;
    let messages = if args.lat { slots.saturating_mul(2).saturating_add(2) } else { slots };
    let bytes = messages.saturating_mul(args.msg_size() as u64).saturating_mul(args.qps as u64);
    if bytes > 8 << 30 {
        return Err(err("--size and --qps need more than 8 GiB of buffers per end: use fewer QPs or smaller messages"));
    }
    net::parse_mtu(args.mtu)?;
    Ok(())
}

pub(crate) fn progress_bar(args: &PerfArgs) -> Option<ProgressBar> {
    if args.json || !std::io::stdout().is_terminal() {
        return None;
    }
    let bar = match args.duration {
        Some(d) => ProgressBar::new((d * 1000.0) as u64).with_style(
            ProgressStyle::with_template("{spinner} {elapsed_precise} [{bar:40}] {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        ),
        None => ProgressBar::new(args.iters.unwrap_or(1000).saturating_mul(args.qps as u64)).with_style(
            ProgressStyle::with_template("{spinner} {elapsed_precise} [{bar:40}] {pos}/{len} {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        ),
    };
    Some(bar)
}

/// Creates and connects `args.qps` RC QP pairs between `ca` (initiator) and `cb` (responder).
pub fn setup(ca: &Context, cb: &Context, args: &PerfArgs) -> Res<Setup> {
    let mut init = Initiator::new(ca, args)?;
    let resp = Responder::new(cb, args)?;
    let (mtu, timeout) = (net::parse_mtu(args.mtu)?, args.ack_timeout());
    for (f, t) in init.flows.iter_mut().zip(&resp.targets) {
        let ia = qp_info(&f.qp, ca, None)?;
        let ib = qp_info(&t.qp, cb, Some(&t.mem))?;
        net::connect_qp(&f.qp, ia.psn, &ib, mtu, timeout)?;
        net::connect_qp(&t.qp, ib.psn, &ia, mtu, timeout)?;
        f.raddr = ib.addr;
        f.rkey = ib.rkey;
    }
    Ok(Setup { init, resp })
}

/// What the initiator's loop saw.
pub(crate) struct Tally {
    pub completions: u64,
    pub ok: u64,
    pub errors: Errors,
    /// Latency samples in microseconds.
    pub lats: Vec<f64>,
    pub wall_s: f64,
}

impl Tally {
    pub fn new(capacity: usize) -> Tally {
        Tally { completions: 0, ok: 0, errors: Errors::default(), lats: Vec::with_capacity(capacity), wall_s: 0.0 }
    }
}

/// The bandwidth loop (and the completion-latency loop, with depth 1): keeps `depth` WRs
/// outstanding on every flow until all are posted (or the duration is over, or an error
/// came) and completed. With `resp` the responder is in this process and its receives are
/// posted here.
pub(crate) fn drive(
    net: &mut Net,
    init: &mut Initiator,
    mut resp: Option<&mut Responder>,
    args: &PerfArgs,
    bar: Option<&ProgressBar>,
) -> Res<Tally> {
    let size = args.msg_size();
    let depth = u64::from(args.depth());
    let per_qp = args.per_qp();
    let total = per_qp.unwrap_or(u64::MAX);
    let deadline = args.duration.map(Duration::from_secs_f64);
    // The latency list grows as samples come; this only sizes its start.
    let mut t = Tally::new((per_qp.unwrap_or(1 << 16) as usize).saturating_mul(init.flows.len()).min(1 << 20));
    let mut resp_errors = Errors::default();
    let mut stop_posting = false;
    let mut wcs = vec![Wc::default(); 256];
    let start = Instant::now();
    loop {
        let now = Instant::now();
        if deadline.is_some_and(|d| now - start >= d) || t.errors.count + resp_errors.count > 0 {
            stop_posting = true;
        }
        if let Some(r) = resp.as_deref_mut() {
            if args.op == Op::Send && t.errors.count + resp_errors.count == 0 {
                let flows = &init.flows;
                r.replenish(size, depth, |i| if stop_posting { flows[i].posted.min(total) } else { total })?;
            }
        }
        if !stop_posting {
            for f in init.flows.iter_mut() {
                while f.posted - f.completed < depth && f.posted < total {
                    f.post(args.op, size, args.inline, now)?;
                }
            }
        }
        let sends_done = init.flows.iter().all(|f| f.completed == f.posted);
        let recvs_done = match resp.as_deref() {
            Some(r) if args.op == Op::Send && t.errors.count + resp_errors.count == 0 => {
                init.flows.iter().zip(&r.targets).all(|(f, t)| t.recv_done >= f.completed)
            }
            _ => true,
        };
        let all_posted = stop_posting || init.flows.iter().all(|f| f.posted >= total);
        if sends_done && recvs_done && all_posted {
            break;
        }
        {
            let cqa = &init.cq;
            let cqb = resp.as_deref().map(|r| &r.cq);
            net.wait("completions", || net::cq_ready(cqa) || cqb.is_some_and(net::cq_ready))?;
        }
        let now = Instant::now();
        loop {
            let n = init.cq.poll(&mut wcs)?;
            if n == 0 {
                break;
            }
            for wc in &wcs[..n] {
                let Some(i) = init.by_qpn.get(wc.qp_num) else { continue };
                let f = &mut init.flows[i];
                f.completed += 1;
                t.completions += 1;
                if let Some(at) = f.posted_at.pop_front() {
                    t.lats.push((now - at).as_secs_f64() * 1e6);
                }
                if wc.status == WcStatus::Success {
                    t.ok += 1;
                } else {
                    t.errors.record("", wc);
                }
            }
        }
        if let Some(r) = resp.as_deref_mut() {
            r.poll(&mut wcs, size, &mut resp_errors)?;
        }
        if let Some(b) = bar {
            match deadline {
                Some(_) => b.set_position(start.elapsed().as_millis() as u64),
                None => b.set_position(t.completions),
            }
        }
    }
    t.wall_s = start.elapsed().as_secs_f64();
    t.errors.absorb(resp_errors.count, resp_errors.first);
    Ok(t)
}

/// Builds the result of a run from the tally and what the ends report.
pub(crate) fn result(
    args: &PerfArgs,
    mode: &str,
    flows: &[Flow],
    mut t: Tally,
    lat_method: &str,
    data_verified: bool,
    device: CountersJson,
) -> PerfResult {
    let size = args.msg_size();
    t.lats.sort_by(f64::total_cmp);
    let bytes = t.ok * size as u64;
    let wall = t.wall_s;
    PerfResult {
        test: args.op,
        link: args.link,
        mode: mode.to_string(),
        size,
        qps: flows.len(),
        depth: args.depth(),
        inline: args.inline,
        ack_timeout_ms: net::rc_timeout_s(args.ack_timeout()) * 1e3,
        iters: flows.iter().map(|f| f.posted).max().unwrap_or(0),
        bw_gbps: bytes as f64 * 8.0 / wall.max(1e-9) / 1e9,
        bw_gbytes_s: bytes as f64 / wall.max(1e-9) / 1e9,
        msg_rate_mps: t.ok as f64 / wall.max(1e-9) / 1e6,
        lat_method: lat_method.to_string(),
        lat_us_p50: percentile(&t.lats, 50.0),
        lat_us_p99: percentile(&t.lats, 99.0),
        lat_us_p999: percentile(&t.lats, 99.9),
        lat_us_max: t.lats.last().copied().unwrap_or(0.0),
        completions: t.completions,
        errors: t.errors.count,
        retransmits: device.retransmits,
        data_verified: data_verified && t.errors.count == 0,
        bytes,
        wall_s: wall,
        virtual_s: None,
        virtual_bw_gbps: None,
        device,
        sim: None,
        pcap: None,
        peer: None,
        first_error: t.errors.first,
    }
}

/// Runs the test on a connected setup (both ends in this process) and checks the data.
pub fn measure(net: &mut Net, st: &mut Setup, args: &PerfArgs, bar: Option<&ProgressBar>) -> Res<PerfResult> {
    let size = args.msg_size();
    let c0 = net::add_counters(st.init.ctx.counters(), st.resp.ctx.counters());
    let v0 = net.virtual_ns();
    let sim0 = net.sim_counters();
    let t = drive(net, &mut st.init, Some(&mut st.resp), args, bar)?;
    let virt = net.virtual_ns().zip(v0).map(|(b, a)| b - a);
    net.settle();
    net.finish()?;
    let mut verified = true;
    for f in &st.init.flows {
        verified &= f.verify(args.op, size)?;
    }
    let completed: Vec<u64> = st.init.flows.iter().map(|f| f.completed).collect();
    verified &= st.resp.verify(args.op, size, &completed)?;
    let dc = net::sub_counters(net::add_counters(st.init.ctx.counters(), st.resp.ctx.counters()), c0);
    let sim = net.sim_counters().zip(sim0).map(|(b, a)| SimJson {
        sent: b.sent - a.sent,
        delivered: b.delivered - a.delivered,
        lost: b.lost - a.lost,
        duplicated: b.duplicated - a.duplicated,
        reordered: b.reordered - a.reordered,
        corrupted: b.corrupted - a.corrupted,
    });
    let mode = if args.link == LinkKind::Sim { "sim" } else { "loopback" };
    let mut r = result(args, mode, &st.init.flows, t, "completion", verified, dc.into());
    r.virtual_s = virt.map(|v| v as f64 / 1e9);
    r.virtual_bw_gbps = virt.map(|v| r.bytes as f64 * 8.0 / (v.max(1) as f64));
    r.sim = sim;
    r.pcap = net.pcap_path().map(|p| p.display().to_string());
    Ok(r)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    // Nearest rank: the smallest sample with at least p% of the samples at or below it.
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

pub fn print_table(r: &PerfResult) {
    let line = "-".repeat(104);
    println!("{line}");
    println!(
        " {} test ({}) over the {} link{}, {} QP{}, depth {}{}, ACK timeout {:.0} ms",
        r.test.name(),
        if r.depth == 1 { "latency" } else { "bandwidth" },
        r.link.name(),
        match (r.mode.as_str(), &r.peer) {
            ("client", Some(p)) => format!(" (two processes, server {p})"),
            ("client", None) => " (two processes)".to_string(),
            ("loopback", _) => " (both ends in one process)".to_string(),
            _ => String::new(),
        },
        r.qps,
        if r.qps == 1 { "" } else { "s" },
        r.depth,
        if r.inline { ", inline" } else { "" },
        r.ack_timeout_ms
    );
    println!("{line}");
    println!(
        " {:>9} {:>11} {:>10} {:>10} {:>14} {:>9} {:>9} {:>9} {:>6} {:>6}",
        "#bytes",
        "#iterations",
        "BW [Gb/s]",
        "BW [GB/s]",
        "MsgRate [Mpps]",
        "p50 [us]",
        "p99 [us]",
        "p99.9[us]",
        "retx",
        "errors"
    );
    println!(
        " {:>9} {:>11} {:>10.3} {:>10.3} {:>14.4} {:>9.2} {:>9.2} {:>9.2} {:>6} {:>6}",
        r.size,
        r.iters,
        r.bw_gbps,
        r.bw_gbps / 8.0,
        r.msg_rate_mps,
        r.lat_us_p50,
        r.lat_us_p99,
        r.lat_us_p999,
        r.retransmits,
        r.errors
    );
    println!("{line}");
    println!(
        " wall-clock {:.3} s, {} completions, data verified: {}; latency is {}{}",
        r.wall_s,
        r.completions,
        if r.data_verified { "yes" } else { "NO" },
        r.lat_method,
        if r.lat_method == "completion" {
            " time (post to CQE: a whole round trip, the ACK's included)"
        } else {
            " (ping-pong: one way)"
        }
    );
    if let (Some(v), Some(vbw)) = (r.virtual_s, r.virtual_bw_gbps) {
        println!(
            " sim link: {v:.6} s of virtual time ({vbw:.3} Gb/s on the simulated wire); BW and rate above are wall-clock: what this CPU achieves"
        );
    }
    if let Some(s) = &r.sim {
        println!(
            " sim faults: {} lost, {} duplicated, {} reordered, {} corrupted of {} sent",
            s.lost, s.duplicated, s.reordered, s.corrupted, s.sent
        );
    }
    let d = &r.device;
    println!(
        " device counters (both ends): {} retransmits, {} timeouts, {} seq NAKs, {} dropped ({} bad ICRC)",
        d.retransmits, d.timeouts, d.seq_naks_received, d.rx_dropped, d.rx_bad_icrc
    );
    if let Some(p) = &r.pcap {
        println!(" pcap: {p}");
    }
}

#[cfg(test)]
mod tests {
    use super::{percentile, LinkKind, Op, PerfArgs, QpIndex};

    /// A completion's QP is found by its number whether the device numbered the run's QPs in
    /// a row, across the wrap of the 24-bit QPN space, or with gaps; a stranger is not.
    #[test]
    fn a_qp_index_finds_numbers_in_a_row_and_out_of_it() {
        let in_a_row = QpIndex::new(0x1234..0x1234 + 100);
        assert_eq!(in_a_row.get(0x1234), Some(0));
        assert_eq!(in_a_row.get(0x1234 + 99), Some(99));
        assert_eq!(in_a_row.get(0x1233), None);
        assert_eq!(in_a_row.get(0x1234 + 100), None);
        let wrapped = QpIndex::new([0xFF_FFFD, 0xFF_FFFE, 2, 3].into_iter());
        let gaps = QpIndex::new([40, 7, 9, 1000].into_iter());
        for (index, qpn, want) in [(&wrapped, 0xFF_FFFE, Some(1)), (&wrapped, 2, Some(2)), (&wrapped, 4, None)]
            .into_iter()
            .chain([(&gaps, 40, Some(0)), (&gaps, 1000, Some(3)), (&gaps, 9, Some(2)), (&gaps, 8, None)])
        {
            assert_eq!(index.get(qpn), want, "QPN {qpn:#x}");
        }
        assert_eq!(QpIndex::new(std::iter::empty()).get(5), None);
    }

    /// The ACK timeout covers the run's window: one QP keeps the link's 67 ms, 10,000 QPs four
    /// deep (40,000 messages, 0.4 s at 100,000 a second) get 537 ms, long Writes their bytes'
    /// worth; the sim link keeps its own.
    #[test]
    fn the_ack_timeout_covers_the_window() {
        let udp = |op, size, qps, depth| PerfArgs { link: LinkKind::Udp, depth, ..PerfArgs::burst(op, size, 10, qps) };
        assert_eq!(udp(Op::Send, 8, 1, 4).ack_timeout(), 14);
        assert_eq!(udp(Op::Write, 65536, 1, 32).ack_timeout(), 14);
        assert_eq!(udp(Op::Send, 8, 10_000, 4).ack_timeout(), 17);
        assert_eq!(udp(Op::Write, 65536, 16, 128).ack_timeout(), 19); // 134 MB: 1.36 s, 2.1 s
        let sim = PerfArgs { depth: 4, ..PerfArgs::burst(Op::Send, 8, 10, 10_000) };
        assert_eq!(sim.ack_timeout(), 10);
    }

    /// The responder's address is the peer's to state: a message's address past the top of
    /// the 64-bit range wraps (the peer's key check refuses it) instead of overflowing (a
    /// server that announced u64::MAX made the client panic at its second message).
    #[test]
    fn a_remote_address_at_the_top_wraps() {
        let ctx = softhca::Context::create(softhca::DeviceConfig::default().name("perf-wrap")).unwrap();
        let (pd, cq) = (ctx.alloc_pd().unwrap(), ctx.create_cq(16).unwrap());
        for op in [Op::Write, Op::Read] {
            let mut f = super::Flow::new(&pd, &cq, &PerfArgs::burst(op, 8, 10, 1), 0).unwrap();
            assert!(f.slots >= 2);
            (f.raddr, f.posted) = (u64::MAX, 1);
            // The QP is in Reset: the post is refused, with an error, not a panic.
            assert!(f.post(op, 8, false, std::time::Instant::now()).is_err());
        }
    }

    /// Nearest rank: with two samples the median is the smaller one, p99 the larger.
    #[test]
    fn percentiles_by_nearest_rank() {
        assert_eq!(percentile(&[1.0, 2.0], 50.0), 1.0);
        assert_eq!(percentile(&[1.0, 2.0], 99.0), 2.0);
        let hundred: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&hundred, 50.0), 50.0);
        assert_eq!(percentile(&hundred, 99.0), 99.0);
        assert_eq!(percentile(&[7.0], 0.0), 7.0);
        assert_eq!(percentile(&[], 50.0), 0.0);
    }
}
