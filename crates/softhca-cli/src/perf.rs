//! `softhca perf send|write|read|atomic`: perftest for softhca. An initiator drives `--qps`
//! RC QPs against a responder, keeping `--depth` WRs outstanding per QP (one with `--lat`),
//! and reports wall-clock bandwidth, message rate, completion latency percentiles, errors and
//! retransmissions. At the end the bytes are checked: every destination slot must hold the
//! pattern of its source slot (the initiator's read landing zone for Read, the responder's
//! memory for Send and Write), and every atomic counter must equal the number of fetch-adds.

use std::collections::{HashMap, VecDeque};
use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use softhca::link::SimCounters;
use softhca::transport::DeviceCounters;
use softhca::*;

use crate::net::{self, err, LinkKind, Net, QpInfo, Res};
use crate::PcapArg;

/// Most memory one QP's slots may take.
const SLOT_BYTES: usize = 32 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    Send,
    Write,
    Read,
    Atomic,
}

#[derive(clap::Args, Debug, Clone)]
pub struct PerfArgs {
    /// The operation to measure.
    #[arg(value_enum)]
    pub op: Op,
    /// Message size in bytes (atomics are always 8).
    #[arg(long, short = 's', default_value_t = 65536)]
    pub size: usize,
    /// Messages per QP (default 1000 unless --duration is given).
    #[arg(long, short = 'n', conflicts_with = "duration")]
    pub iters: Option<u64>,
    /// Run for this many wall-clock seconds instead of a fixed count.
    #[arg(long, short = 'D', value_name = "SECS")]
    pub duration: Option<f64>,
    /// QP pairs.
    #[arg(long, short = 'q', default_value_t = 1)]
    pub qps: usize,
    /// Outstanding WRs per QP (ignored with --lat, which keeps one).
    #[arg(long, short = 't', default_value_t = 128)]
    pub depth: u32,
    /// Send and Write carry their payload inline in the WR (size ≤ 512).
    #[arg(long)]
    pub inline: bool,
    /// Latency test: one WR outstanding at a time; percentiles in the table.
    #[arg(long)]
    pub lat: bool,
    /// Path MTU in bytes.
    #[arg(long, short = 'm', default_value_t = 4096)]
    pub mtu: u32,
    /// Which link.
    #[arg(long, value_enum, default_value_t = LinkKind::Sim)]
    pub link: LinkKind,
    /// udp: be the server (the responder) of a client.
    #[arg(long, conflicts_with_all = ["connect", "loopback"])]
    pub server: bool,
    /// udp: be the client (the initiator) of the server at HOST.
    #[arg(long, value_name = "HOST", conflicts_with = "loopback")]
    pub connect: Option<String>,
    /// udp: run both ends in this process, on two devices.
    #[arg(long)]
    pub loopback: bool,
    /// TCP port of the QP information exchange.
    #[arg(long, short = 'p', default_value_t = 18515)]
    pub port: u16,
    /// udp: the devices' engines spin instead of sleeping.
    #[arg(long)]
    pub busy_poll: bool,
    #[command(flatten)]
    pub faults: net::Faults,
    /// Print exactly one JSON object instead of the table.
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

    fn msg_size(&self) -> usize {
        if self.op == Op::Atomic {
            8
        } else {
            self.size
        }
    }

    fn depth(&self) -> u32 {
        if self.lat {
            1
        } else {
            self.depth.clamp(1, 4096)
        }
    }
}

/// One QP pair and its memory.
struct Flow {
    a: Qp,
    b: Qp,
    /// Initiator: source slots (Send/Write), landing slots (Read), results (Atomic).
    local: Mr,
    /// Responder: destination or receive slots (Send/Write), source slots (Read), the
    /// counter (Atomic).
    remote: Mr,
    /// The source bytes for inline WRs: the same as `local`.
    inline_src: Vec<u8>,
    slots: usize,
    posted: u64,
    completed: u64,
    recv_posted: u64,
    recv_done: u64,
    /// Post time of every outstanding WR, in post order.
    posted_at: VecDeque<(Instant, u64)>,
    /// Atomic counter's initial value.
    counter0: u64,
}

/// Both ends, connected.
pub struct Setup {
    ca: Context,
    cb: Context,
    _pds: (Pd, Pd),
    cqa: Cq,
    cqb: Cq,
    flows: Vec<Flow>,
    by_qpn: HashMap<u32, usize>,
    by_recv_qpn: HashMap<u32, usize>,
}

/// What a run measured.
#[derive(Debug, Clone, Serialize)]
pub struct PerfResult {
    pub test: Op,
    pub link: LinkKind,
    pub size: usize,
    pub qps: usize,
    pub depth: u32,
    pub inline: bool,
    pub iters: u64,
    /// Gigabits per second of payload, wall-clock.
    pub bw_gbps: f64,
    /// Millions of messages per second, wall-clock.
    pub msg_rate_mps: f64,
    /// Completion latency (post to CQE), wall-clock microseconds.
    pub lat_us_p50: f64,
    pub lat_us_p99: f64,
    pub lat_us_p999: f64,
    pub lat_us_max: f64,
    pub completions: u64,
    pub errors: u64,
    pub retransmits: u64,
    pub data_verified: bool,
    pub bytes: u64,
    pub wall_s: f64,
    /// Sim link only: virtual time the run took, and the bandwidth on the virtual clock.
    pub virtual_s: Option<f64>,
    pub virtual_bw_gbps: Option<f64>,
    pub device: CountersJson,
    pub sim: Option<SimJson>,
    pub pcap: Option<String>,
    /// The first error completion, if any.
    pub first_error: Option<String>,
}

#[derive(Debug, Clone, Serialize, Default)]
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

#[derive(Debug, Clone, Serialize, Default)]
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

pub fn run(args: &PerfArgs) -> Res<()> {
    validate(args)?;
    let mut net = match args.link {
        LinkKind::Sim => {
            if args.server || args.connect.is_some() || args.loopback {
                return Err(err("--server/--connect/--loopback are for --link udp; --link sim runs both ends here"));
            }
            Net::sim(&args.faults, args.pcap.pcap.as_deref())?
        }
        LinkKind::Udp => {
            if args.server || args.connect.is_some() {
                return Err(err(
                    "perf --server/--connect is not implemented yet: use --link udp --loopback (both ends in this process, two devices) or pingpong --server/--connect",
                ));
            }
            if !args.loopback {
                return Err(err("--link udp needs --loopback (or, later, --server / --connect HOST)"));
            }
            if args.faults.loss + args.faults.dup + args.faults.reorder + args.faults.corrupt > 0.0 {
                return Err(err("--loss/--dup/--reorder/--corrupt are faults of the sim link"));
            }
            Net::udp(args.pcap.pcap.as_deref(), args.busy_poll)
        }
    };
    let ca = net.add_device("softhca0")?;
    let cb = net.add_device("softhca1")?;
    let mut setup = setup(&ca, &cb, args)?;
    let bar = progress_bar(args);
    let result = measure(&mut net, &mut setup, args, bar.as_ref())?;
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    if args.json {
        println!("{}", serde_json::to_string(&result)?);
    } else {
        print_table(&result);
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

fn validate(args: &PerfArgs) -> Res<()> {
    if args.qps == 0 || args.qps > 1024 {
        return Err(err("--qps must be in 1..=1024"));
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
    if let Some(d) = args.duration {
        if !(d > 0.0 && d.is_finite()) {
            return Err(err("--duration must be a positive number of seconds"));
        }
    }
    net::parse_mtu(args.mtu)?;
    Ok(())
}

fn progress_bar(args: &PerfArgs) -> Option<ProgressBar> {
    if args.json || !std::io::stdout().is_terminal() {
        return None;
    }
    let bar = match args.duration {
        Some(d) => ProgressBar::new((d * 1000.0) as u64).with_style(
            ProgressStyle::with_template("{spinner} {elapsed_precise} [{bar:40}] {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        ),
        None => ProgressBar::new(args.iters.unwrap_or(1000) * args.qps as u64).with_style(
            ProgressStyle::with_template("{spinner} {elapsed_precise} [{bar:40}] {pos}/{len} {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        ),
    };
    Some(bar)
}

/// Creates and connects `args.qps` RC QP pairs between `ca` (initiator) and `cb` (responder).
pub fn setup(ca: &Context, cb: &Context, args: &PerfArgs) -> Res<Setup> {
    let depth = args.depth();
    let size = args.msg_size();
    let (pda, pdb) = (ca.alloc_pd()?, cb.alloc_pd()?);
    let cqe = (depth * 2 * args.qps as u32 + 64).min(1 << 20);
    let (cqa, cqb) = (ca.create_cq(cqe)?, cb.create_cq(cqe)?);
    let total = args.iters.unwrap_or(u64::MAX);
    let slots = (2 * depth as u64).min(total).clamp(1, (SLOT_BYTES / size.max(1)).max(1) as u64) as usize;
    let remote_access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    let inline_cap = if args.inline { args.size as u32 } else { 0 };
    let mut flows = Vec::new();
    let mut by_qpn = HashMap::new();
    let mut by_recv_qpn = HashMap::new();
    for i in 0..args.qps {
        let init = |cq: &Cq| {
            QpInitAttr::rc(cq, cq)
                .max_send_wr(depth)
                .max_recv_wr(depth * 2)
                .max_send_sge(1)
                .max_recv_sge(1)
                .max_inline_data(inline_cap)
        };
        let a = pda.create_qp(&init(&cqa))?;
        let b = pdb.create_qp(&init(&cqb))?;
        let src_seed = (i as u64) << 32;
        let mut slots_src = Vec::with_capacity(slots * size);
        for s in 0..slots {
            slots_src.extend_from_slice(&net::pattern(src_seed | s as u64, size));
        }
        let counter0 = net::mix(i as u64 ^ 0xa70) >> 8;
        let (local, remote, inline_src) = match args.op {
            Op::Send | Op::Write => (
                pda.reg_mr(slots_src.clone(), Access::LOCAL_WRITE)?,
                pdb.alloc_mr(slots * size, remote_access)?,
                if args.inline { slots_src } else { Vec::new() },
            ),
            Op::Read => {
                (pda.alloc_mr(slots * size, Access::LOCAL_WRITE)?, pdb.reg_mr(slots_src, remote_access)?, Vec::new())
            }
            Op::Atomic => {
                let words = pdb.alloc_mr(8, remote_access)?;
                words.write(0, &counter0.to_ne_bytes())?;
                (pda.alloc_mr(slots * 8, Access::LOCAL_WRITE)?, words, Vec::new())
            }
        };
        let info = |qp: &Qp, ctx: &Context| -> Res<QpInfo> {
            Ok(QpInfo {
                qpn: qp.qp_num(),
                psn: net::initial_psn(qp.qp_num()),
                gid: net::gid_string(ctx.query_gid(1, 0)?),
                addr: 0,
                rkey: 0,
            })
        };
        let (ia, ib) = (info(&a, ca)?, info(&b, cb)?);
        let mtu = net::parse_mtu(args.mtu)?;
        net::connect_qp(&a, ia.psn, &ib, mtu, net::rc_timeout(args.link))?;
        net::connect_qp(&b, ib.psn, &ia, mtu, net::rc_timeout(args.link))?;
        by_qpn.insert(a.qp_num(), i);
        by_recv_qpn.insert(b.qp_num(), i);
        flows.push(Flow {
            a,
            b,
            local,
            remote,
            inline_src,
            slots,
            posted: 0,
            completed: 0,
            recv_posted: 0,
            recv_done: 0,
            posted_at: VecDeque::new(),
            counter0,
        });
    }
    Ok(Setup { ca: ca.clone(), cb: cb.clone(), _pds: (pda, pdb), cqa, cqb, flows, by_qpn, by_recv_qpn })
}

fn post_one(f: &mut Flow, op: Op, size: usize, inline: bool, now: Instant) -> Res<()> {
    let k = f.posted;
    let s = (k % f.slots as u64) as usize;
    let off = s * size;
    match op {
        Op::Send | Op::Write => {
            let sge = [f.local.sge(off..off + size)];
            let mut wr = if op == Op::Send {
                SendWr::send(k, &sge)
            } else {
                SendWr::rdma_write(k, &sge, f.remote.addr() + off as u64, f.remote.rkey())
            };
            if inline {
                wr.inline_data = &f.inline_src[off..off + size];
                wr = wr.inline();
            }
            f.a.post_send(&[wr.signaled()])?;
        }
        Op::Read => {
            let sge = [f.local.sge(off..off + size)];
            f.a.post_send(&[SendWr::rdma_read(k, &sge, f.remote.addr() + off as u64, f.remote.rkey()).signaled()])?;
        }
        Op::Atomic => {
            let sge = [f.local.sge(s * 8..s * 8 + 8)];
            f.a.post_send(&[SendWr::atomic_fetch_add(k, &sge, f.remote.addr(), f.remote.rkey(), 1).signaled()])?;
        }
    }
    f.posted += 1;
    f.posted_at.push_back((now, k));
    Ok(())
}

fn post_recv(f: &mut Flow, size: usize) -> Res<()> {
    let k = f.recv_posted;
    let off = (k % f.slots as u64) as usize * size;
    f.b.post_recv(&[RecvWr::new(k, &[f.remote.sge(off..off + size)])])?;
    f.recv_posted += 1;
    Ok(())
}

/// Runs the test on a connected setup and checks the data.
pub fn measure(net: &mut Net, st: &mut Setup, args: &PerfArgs, bar: Option<&ProgressBar>) -> Res<PerfResult> {
    let size = args.msg_size();
    let depth = u64::from(args.depth());
    let per_qp = args.iters.or(if args.duration.is_some() { None } else { Some(1000) });
    let total = per_qp.unwrap_or(u64::MAX);
    let deadline = args.duration.map(Duration::from_secs_f64);
    let c0 = net::add_counters(st.ca.counters(), st.cb.counters());
    let v0 = net.virtual_ns();
    let sim0 = net.sim_counters();
    let mut lats: Vec<f64> = Vec::with_capacity(per_qp.unwrap_or(1 << 16).min(1 << 24) as usize * st.flows.len());
    let (mut errors, mut completions, mut ok) = (0u64, 0u64, 0u64);
    let mut first_error: Option<String> = None;
    let mut stop_posting = false;
    let mut wcs = vec![Wc::default(); 256];
    let start = Instant::now();
    loop {
        let now = Instant::now();
        if deadline.is_some_and(|d| now - start >= d) || errors > 0 {
            stop_posting = true;
        }
        for f in st.flows.iter_mut() {
            if args.op == Op::Send && errors == 0 {
                while f.recv_posted < (f.recv_done + 2 * depth).min(total)
                    && !(stop_posting && f.recv_posted >= f.posted)
                {
                    post_recv(f, size)?;
                }
            }
            if !stop_posting {
                while f.posted - f.completed < depth && f.posted < total {
                    post_one(f, args.op, size, args.inline, now)?;
                }
            }
        }
        let sends_done = st.flows.iter().all(|f| f.completed == f.posted);
        let recvs_done = args.op != Op::Send || errors > 0 || st.flows.iter().all(|f| f.recv_done >= f.completed);
        let all_posted = stop_posting || st.flows.iter().all(|f| f.posted >= total);
        if sends_done && recvs_done && all_posted {
            break;
        }
        let (cqa, cqb) = (&st.cqa, &st.cqb);
        net.wait("completions", || cqa.len().unwrap_or(1) > 0 || cqb.len().unwrap_or(1) > 0)?;
        let now = Instant::now();
        loop {
            let n = st.cqa.poll(&mut wcs)?;
            if n == 0 {
                break;
            }
            for wc in &wcs[..n] {
                let Some(&i) = st.by_qpn.get(&wc.qp_num) else { continue };
                let f = &mut st.flows[i];
                f.completed += 1;
                completions += 1;
                if let Some((t, _)) = f.posted_at.pop_front() {
                    lats.push((now - t).as_secs_f64() * 1e6);
                }
                if wc.status == WcStatus::Success {
                    ok += 1;
                } else {
                    errors += 1;
                    first_error.get_or_insert_with(|| {
                        format!("wr_id {} on QP {:#08x}: {} ({:?})", wc.wr_id, wc.qp_num, wc.status, wc.status)
                    });
                }
            }
        }
        loop {
            let n = st.cqb.poll(&mut wcs)?;
            if n == 0 {
                break;
            }
            for wc in &wcs[..n] {
                let Some(&i) = st.by_recv_qpn.get(&wc.qp_num) else { continue };
                st.flows[i].recv_done += 1;
                if wc.status != WcStatus::Success {
                    errors += 1;
                    first_error.get_or_insert_with(|| {
                        format!("receive wr_id {} on QP {:#08x}: {} ({:?})", wc.wr_id, wc.qp_num, wc.status, wc.status)
                    });
                }
            }
        }
        if let Some(b) = bar {
            match deadline {
                Some(_) => b.set_position(start.elapsed().as_millis() as u64),
                None => b.set_position(completions),
            }
        }
    }
    let wall = start.elapsed().as_secs_f64();
    let virt = net.virtual_ns().zip(v0).map(|(b, a)| b - a);
    net.settle();
    net.finish()?;
    let data_verified = errors == 0 && verify(st, args.op, size)?;
    let dc = net::sub_counters(net::add_counters(st.ca.counters(), st.cb.counters()), c0);
    let sim = net.sim_counters().zip(sim0).map(|(b, a)| SimJson {
        sent: b.sent - a.sent,
        delivered: b.delivered - a.delivered,
        lost: b.lost - a.lost,
        duplicated: b.duplicated - a.duplicated,
        reordered: b.reordered - a.reordered,
        corrupted: b.corrupted - a.corrupted,
    });
    lats.sort_by(f64::total_cmp);
    let bytes = ok * size as u64;
    let iters = st.flows.iter().map(|f| f.posted).max().unwrap_or(0);
    Ok(PerfResult {
        test: args.op,
        link: args.link,
        size,
        qps: st.flows.len(),
        depth: args.depth(),
        inline: args.inline,
        iters,
        bw_gbps: bytes as f64 * 8.0 / wall.max(1e-9) / 1e9,
        msg_rate_mps: ok as f64 / wall.max(1e-9) / 1e6,
        lat_us_p50: percentile(&lats, 50.0),
        lat_us_p99: percentile(&lats, 99.0),
        lat_us_p999: percentile(&lats, 99.9),
        lat_us_max: lats.last().copied().unwrap_or(0.0),
        completions,
        errors,
        retransmits: dc.retransmits,
        data_verified,
        bytes,
        wall_s: wall,
        virtual_s: virt.map(|v| v as f64 / 1e9),
        virtual_bw_gbps: virt.map(|v| bytes as f64 * 8.0 / (v.max(1) as f64)),
        device: dc.into(),
        sim,
        pcap: net.pcap_path().map(|p| p.display().to_string()),
        first_error,
    })
}

/// Checks every slot that was used against the pattern it must hold.
fn verify(st: &Setup, op: Op, size: usize) -> Res<bool> {
    for (i, f) in st.flows.iter().enumerate() {
        let used = (f.completed.min(f.slots as u64)) as usize;
        let seed = (i as u64) << 32;
        let mut got = vec![0u8; size];
        match op {
            Op::Send | Op::Write => {
                if op == Op::Send && f.recv_done != f.completed {
                    return Ok(false);
                }
                for s in 0..used {
                    f.remote.read(s * size, &mut got)?;
                    if got != net::pattern(seed | s as u64, size) {
                        return Ok(false);
                    }
                }
            }
            Op::Read => {
                for s in 0..used {
                    f.local.read(s * size, &mut got)?;
                    if got != net::pattern(seed | s as u64, size) {
                        return Ok(false);
                    }
                }
            }
            Op::Atomic => {
                let mut w = [0u8; 8];
                f.remote.read(0, &mut w)?;
                if u64::from_ne_bytes(w) != f.counter0.wrapping_add(f.completed) {
                    return Ok(false);
                }
                let slots = f.slots as u64;
                for s in 0..used as u64 {
                    let last = s + slots * ((f.completed - 1 - s) / slots);
                    f.local.read(s as usize * 8, &mut w)?;
                    if u64::from_ne_bytes(w) != f.counter0.wrapping_add(last) {
                        return Ok(false);
                    }
                }
            }
        }
    }
    Ok(true)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let idx = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

pub fn print_table(r: &PerfResult) {
    let line = "-".repeat(96);
    println!("{line}");
    println!(
        " {} test ({}) over the {} link, {} QP{}, depth {}{}",
        match r.test {
            Op::Send => "Send",
            Op::Write => "RDMA Write",
            Op::Read => "RDMA Read",
            Op::Atomic => "Atomic Fetch&Add",
        },
        if r.depth == 1 { "latency" } else { "bandwidth" },
        match r.link {
            LinkKind::Sim => "sim",
            LinkKind::Udp => "udp",
        },
        r.qps,
        if r.qps == 1 { "" } else { "s" },
        r.depth,
        if r.inline { ", inline" } else { "" }
    );
    println!("{line}");
    println!(
        " {:>10} {:>12} {:>12} {:>14} {:>10} {:>10} {:>10} {:>7} {:>6}",
        "#bytes", "#iterations", "BW [Gb/s]", "MsgRate [Mpps]", "p50 [us]", "p99 [us]", "p99.9[us]", "retx", "errors"
    );
    println!(
        " {:>10} {:>12} {:>12.3} {:>14.4} {:>10.2} {:>10.2} {:>10.2} {:>7} {:>6}",
        r.size, r.iters, r.bw_gbps, r.msg_rate_mps, r.lat_us_p50, r.lat_us_p99, r.lat_us_p999, r.retransmits, r.errors
    );
    println!("{line}");
    println!(
        " wall-clock {:.3} s, {} completions, data verified: {}",
        r.wall_s,
        r.completions,
        if r.data_verified { "yes" } else { "NO" }
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
