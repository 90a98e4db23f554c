//! `softhca perf … --link udp --server` / `--connect HOST`: perftest's two-process mode.
//!
//! The side channel is one TCP connection carrying one JSON line per step:
//!
//! 1. client → server `Hello`: the test (op, size, iters/duration, qps, depth, inline, lat,
//!    MTU) and the client's QPs (QPN, PSN, GID; for write_lat the buffer the server writes its
//!    echoes into, address and R_Key).
//! 2. The server builds its QPs and memory from the client's parameters, connects them,
//!    posts its receives (send) and answers `Welcome`: its QPs and memory (address, R_Key).
//! 3. The client connects, posts its receives (send_lat) and sends "start"; the server
//!    answers "go" and serves: it reposts receives (send_bw), echoes every message (send_lat,
//!    write_lat), or just waits (write_bw, read, atomic: the work is one-sided).
//! 4. The client measures, then sends `Done` (the WRs it completed per QP). The server
//!    finishes what it was doing, checks its memory and answers `Report`: its data check,
//!    its error completions and its device counters.
//! 5. The client checks its own memory, builds the result and sends it to the server, which
//!    prints the same table (or JSON) as the client.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use softhca::*;

use crate::net::{self, err, Exchange, LinkKind, Net, QpInfo, Res};
use crate::perf::{
    self, CountersJson, Errors, Initiator, Op, PerfArgs, PerfResult, Responder, Tally, RECV_TAG, REMOTE_ACCESS,
};

/// Client → server: the test and the client's QPs.
#[derive(Debug, Serialize, Deserialize)]
struct Hello {
    op: Op,
    size: usize,
    iters: Option<u64>,
    duration: Option<f64>,
    qps: usize,
    depth: u32,
    inline: bool,
    lat: bool,
    mtu: u32,
    qp: Vec<QpInfo>,
    /// The client busy-polls: a server that does not switches to it for the test, since a
    /// latency measured against a sleeping peer is mostly its wake-up.
    #[serde(default)]
    busy_poll: bool,
    /// The client's link: a server on another cannot reach it (its packets would go to a
    /// port, or a ring, nobody reads).
    #[serde(default)]
    link: Option<LinkKind>,
}

/// Server → client: the server's QPs and memory, or why it will not run the test.
#[derive(Debug, Serialize, Deserialize)]
enum Welcome {
    Ok {
        qp: Vec<QpInfo>,
        #[serde(deserialize_with = "net::peer_text")]
        addr: String,
    },
    Refused(#[serde(deserialize_with = "net::peer_text")] String),
}

/// Client → server: the initiator is finished; WRs completed per QP.
#[derive(Debug, Serialize, Deserialize)]
struct Done {
    completed: Vec<u64>,
}

/// Server → client: the responder's side of the result.
#[derive(Debug, Serialize, Deserialize)]
struct Report {
    data_verified: bool,
    errors: u64,
    #[serde(default, deserialize_with = "net::peer_text_opt")]
    first_error: Option<String>,
    device: CountersJson,
}

/// Send and write latency ping-pong between the processes (perftest's send_lat, write_lat).
fn pingpong(args: &PerfArgs) -> bool {
    args.lat && matches!(args.op, Op::Send | Op::Write)
}

/// The byte a write_lat message `c` ends with: never 0 (fresh memory), never the byte of
/// the previous message in the same slot.
fn marker(c: u64) -> u8 {
    (c % 255 + 1) as u8
}

/// The bytes of QP `i`'s echoes (send_lat, write_lat).
fn echo_pattern(i: usize, size: usize) -> Vec<u8> {
    net::pattern(!perf::seed(i), size)
}

/// The last message `c` < `completed` that used slot `s`.
fn last_in_slot(s: u64, slots: u64, completed: u64) -> u64 {
    s + slots * ((completed - 1 - s) / slots)
}

/// Checks write_lat memory: every used slot holds `expect(slot)` with its last byte the
/// marker of the last message written there.
fn verify_marked(mem: &Mr, slots: usize, size: usize, completed: u64, expect: impl Fn(usize) -> Vec<u8>) -> Res<bool> {
    let mut got = vec![0u8; size];
    for s in 0..completed.min(slots as u64) {
        let mut want = expect(s as usize);
        want[size - 1] = marker(last_in_slot(s, slots as u64, completed));
        mem.read(s as usize * size, &mut got)?;
        if got != want {
            return Ok(false);
        }
    }
    Ok(true)
}

fn last_byte_is(mem: &Mr, at: usize, m: u8) -> bool {
    let mut b = [0u8];
    mem.read(at, &mut b).is_ok() && b[0] == m
}

fn counters(ctx: &Context) -> CountersJson {
    ctx.counters().into()
}

fn sub(b: CountersJson, a: CountersJson) -> CountersJson {
    CountersJson {
        tx_packets: b.tx_packets - a.tx_packets,
        rx_packets: b.rx_packets - a.rx_packets,
        rx_dropped: b.rx_dropped - a.rx_dropped,
        rx_bad_icrc: b.rx_bad_icrc - a.rx_bad_icrc,
        retransmits: b.retransmits - a.retransmits,
        timeouts: b.timeouts - a.timeouts,
        seq_naks_sent: b.seq_naks_sent - a.seq_naks_sent,
        seq_naks_received: b.seq_naks_received - a.seq_naks_received,
        rnr_naks_sent: b.rnr_naks_sent - a.rnr_naks_sent,
        implied_naks: b.implied_naks - a.implied_naks,
    }
}

// ---------------------------------------------------------------------------------------
// The client: the initiator, which measures.

pub fn client(args: &PerfArgs, host: &str) -> Res<()> {
    let size = args.msg_size();
    let mtu = net::parse_mtu(args.mtu)?;
    let mut net = Net::os(args.link, args.pcap.pcap.as_deref(), args.busy_poll);
    let ctx = net.add_device("softhca_perf_client")?;
    let mut init = Initiator::new(&ctx, args)?;
    // Where the server's echoes land: written by the server (write_lat) or received (send_lat).
    let echo: Vec<Mr> = if pingpong(args) {
        let pd = init.flows[0].qp.pd();
        (0..args.qps).map(|_| pd.alloc_mr(init.flows[0].slots * size, REMOTE_ACCESS)).collect::<Result<_>>()?
    } else {
        Vec::new()
    };
    let mut mine = Vec::new();
    for (i, f) in init.flows.iter().enumerate() {
        mine.push(perf::qp_info(&f.qp, &ctx, echo.get(i).filter(|_| args.op == Op::Write))?);
    }
    let mut ex = Exchange::connect(host, args.port)?;
    ex.send(&Hello {
        op: args.op,
        size: args.size,
        iters: args.iters,
        duration: args.duration,
        qps: args.qps,
        depth: args.depth,
        inline: args.inline,
        lat: args.lat,
        mtu: args.mtu,
        qp: mine,
        busy_poll: args.busy_poll,
        link: Some(args.link),
    })?;
    let (theirs, peer) = match ex.recv::<Welcome>()? {
        Welcome::Ok { qp, addr } => (qp, addr),
        Welcome::Refused(why) => return Err(err(format!("the server refused the test: {why}"))),
    };
    if theirs.len() != init.flows.len() {
        return Err(err(format!("the server set up {} QPs, not {}", theirs.len(), init.flows.len())));
    }
    let timeout = args.ack_timeout();
    for (f, info) in init.flows.iter_mut().zip(&theirs) {
        net::connect_qp(&f.qp, net::initial_psn(f.qp.qp_num()), info, mtu, timeout)?;
        f.raddr = info.addr;
        f.rkey = info.rkey;
    }
    let mut echo_posted = vec![0u64; echo.len()];
    if pingpong(args) && args.op == Op::Send {
        for (i, f) in init.flows.iter().enumerate() {
            while echo_posted[i] < f.slots as u64 {
                post_echo_recv(&f.qp, &echo[i], f.slots, size, &mut echo_posted[i])?;
            }
        }
    }
    ex.send(&"start")?;
    let _: String = ex.recv()?;
    let c0 = counters(&ctx);
    let bar = perf::progress_bar(args);
    let mut bad_echoes = 0u64;
    let (tally, lat_method) = match (pingpong(args), args.op) {
        (true, Op::Write) => (write_lat_client(&mut net, &mut init, &echo, args, bar.as_ref())?, "half round trip"),
        (true, _) => (
            send_lat_client(&mut net, &mut init, &echo, &mut echo_posted, &mut bad_echoes, args, bar.as_ref())?,
            "half round trip",
        ),
        _ => (perf::drive(&mut net, &mut init, None, args, bar.as_ref())?, "completion"),
    };
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    let completed: Vec<u64> = init.flows.iter().map(|f| f.completed).collect();
    ex.send(&Done { completed: completed.clone() })?;
    let report: Report = ex.recv()?;
    // The server's Report comes after its echoes were acknowledged: they are all in place.
    let mut verified = report.data_verified && bad_echoes == 0;
    for f in &init.flows {
        verified &= f.verify(args.op, size)?;
    }
    if pingpong(args) && args.op == Op::Write {
        for (i, f) in init.flows.iter().enumerate() {
            verified &= verify_marked(&echo[i], f.slots, size, f.completed, |_| echo_pattern(i, size))?;
        }
    }
    let device = sub(counters(&ctx), c0) + report.device;
    let mut tally = tally;
    tally.errors.absorb(report.errors, report.first_error);
    let mut result = perf::result(args, "client", &init.flows, tally, lat_method, verified, device);
    result.peer = Some(peer);
    result.pcap = net.pcap_path().map(|p| p.display().to_string());
    ex.send(&result)?;
    let _: String = ex.recv()?;
    net.settle();
    net.finish()?;
    perf::report(&result, args.json)
}

fn post_echo_recv(qp: &Qp, mem: &Mr, slots: usize, size: usize, posted: &mut u64) -> Res<()> {
    let off = (*posted % slots as u64) as usize * size;
    qp.post_recv(&[RecvWr::new(*posted | RECV_TAG, &[mem.sge(off..off + size)])])?;
    *posted += 1;
    Ok(())
}

/// Reaps the initiator's CQ: send completions count against their flow; receive
/// completions go to `on_recv(flow, wc)`.
fn reap(
    init: &mut Initiator,
    wcs: &mut [Wc],
    t: &mut Tally,
    mut on_recv: impl FnMut(usize, &Wc) -> Res<()>,
) -> Res<()> {
    loop {
        let n = init.cq.poll(wcs)?;
        if n == 0 {
            return Ok(());
        }
        for wc in &wcs[..n] {
            let Some(i) = init.by_qpn.get(wc.qp_num) else { continue };
            if wc.wr_id & RECV_TAG != 0 {
                if wc.status != WcStatus::Success {
                    t.errors.record("echo receive", wc);
                }
                on_recv(i, wc)?;
                continue;
            }
            let f = &mut init.flows[i];
            f.completed += 1;
            f.posted_at.pop_front();
            t.completions += 1;
            if wc.status == WcStatus::Success {
                t.ok += 1;
            } else {
                t.errors.record("", wc);
            }
        }
    }
}

/// The iterations a ping-pong client runs: round robin over the QPs, `--iters` each or
/// until `--duration` is over.
struct Rounds {
    qps: usize,
    total: u64,
    deadline: Option<Duration>,
    start: Instant,
    j: u64,
}

impl Rounds {
    fn new(args: &PerfArgs) -> Rounds {
        Rounds {
            qps: args.qps,
            total: args.per_qp().unwrap_or(u64::MAX),
            deadline: args.duration.map(Duration::from_secs_f64),
            start: Instant::now(),
            j: 0,
        }
    }

    /// The QP of the next round, or `None` when the run is over.
    fn next(&mut self, init: &Initiator, bar: Option<&indicatif::ProgressBar>) -> Option<usize> {
        if let Some(b) = bar {
            match self.deadline {
                Some(_) => b.set_position(self.start.elapsed().as_millis() as u64),
                None => b.set_position(self.j),
            }
        }
        if self.deadline.is_some_and(|d| self.start.elapsed() >= d) {
            return None;
        }
        let i = (self.j % self.qps as u64) as usize;
        if init.flows[i].posted >= self.total {
            return None;
        }
        self.j += 1;
        Some(i)
    }
}

/// write_lat, client side: write message `c` (its last byte the marker), wait until the
/// server's echo shows the same marker in the last byte of our buffer; half that time is
/// the latency.
fn write_lat_client(
    net: &mut Net,
    init: &mut Initiator,
    echo: &[Mr],
    args: &PerfArgs,
    bar: Option<&indicatif::ProgressBar>,
) -> Res<Tally> {
    let size = args.msg_size();
    let mut t = Tally::new((args.per_qp().unwrap_or(1 << 16) as usize).saturating_mul(args.qps).min(1 << 20));
    let mut wcs = vec![Wc::default(); 16];
    let mut rounds = Rounds::new(args);
    'run: while let Some(i) = rounds.next(init, bar) {
        let f = &mut init.flows[i];
        let c = f.posted;
        let at = (c % f.slots as u64) as usize * size + size - 1;
        let m = marker(c);
        f.local.write(at, &[m])?;
        if args.inline {
            f.inline_src[at] = m;
        }
        let t0 = Instant::now();
        f.post(Op::Write, size, args.inline, t0)?;
        let mut echoed = None;
        loop {
            if echoed.is_none() && last_byte_is(&echo[i], at, m) {
                echoed = Some(Instant::now());
            }
            reap(init, &mut wcs, &mut t, |_, _| Ok(()))?;
            if t.errors.count > 0 {
                break 'run;
            }
            let f = &init.flows[i];
            if let Some(t1) = echoed {
                if f.completed == f.posted {
                    t.lats.push((t1 - t0).as_secs_f64() * 1e6 / 2.0);
                    break;
                }
            }
            let cq = &init.cq;
            let mem = &echo[i];
            net.wait("the server's write echo", || {
                (echoed.is_none() && last_byte_is(mem, at, m)) || net::cq_ready(cq)
            })?;
        }
    }
    t.wall_s = rounds.start.elapsed().as_secs_f64();
    Ok(t)
}

/// send_lat, client side: send message `c`, wait for the server's echo to arrive in a
/// receive; half that time is the latency. Every echo's bytes are checked.
fn send_lat_client(
    net: &mut Net,
    init: &mut Initiator,
    echo: &[Mr],
    echo_posted: &mut [u64],
    bad_echoes: &mut u64,
    args: &PerfArgs,
    bar: Option<&indicatif::ProgressBar>,
) -> Res<Tally> {
    let size = args.msg_size();
    let mut t = Tally::new((args.per_qp().unwrap_or(1 << 16) as usize).saturating_mul(args.qps).min(1 << 20));
    let mut wcs = vec![Wc::default(); 16];
    let expect: Vec<Vec<u8>> = (0..args.qps).map(|i| echo_pattern(i, size)).collect();
    let qps: Vec<Qp> = init.flows.iter().map(|f| f.qp.clone()).collect();
    let slots = init.flows[0].slots;
    let mut got = vec![0u8; size];
    let mut rounds = Rounds::new(args);
    'run: while let Some(i) = rounds.next(init, bar) {
        let t0 = Instant::now();
        init.flows[i].post(Op::Send, size, args.inline, t0)?;
        let mut echoed = None;
        loop {
            reap(init, &mut wcs, &mut t, |k, wc| {
                if k == i {
                    echoed.get_or_insert_with(Instant::now);
                }
                if wc.status == WcStatus::Success {
                    let off = ((wc.wr_id & !RECV_TAG) % slots as u64) as usize * size;
                    echo[k].read(off, &mut got)?;
                    if wc.byte_len as usize != size || got != expect[k] {
                        *bad_echoes += 1;
                    }
                    post_echo_recv(&qps[k], &echo[k], slots, size, &mut echo_posted[k])?;
                }
                Ok(())
            })?;
            if t.errors.count > 0 {
                break 'run;
            }
            let f = &init.flows[i];
            if let Some(t1) = echoed {
                if f.completed == f.posted {
                    t.lats.push((t1 - t0).as_secs_f64() * 1e6 / 2.0);
                    break;
                }
            }
            let cq = &init.cq;
            net.wait("the server's send echo", || net::cq_ready(cq))?;
        }
    }
    t.wall_s = rounds.start.elapsed().as_secs_f64();
    Ok(t)
}

// ---------------------------------------------------------------------------------------
// The server: the responder.

pub fn serve(args: &PerfArgs) -> Res<()> {
    let mut net = Net::os(args.link, args.pcap.pcap.as_deref(), args.busy_poll);
    let ctx = net.add_device("softhca_perf_server")?;
    let gid = net::display_gid(ctx.query_gid(1, 0)?);
    let mut ex = Exchange::serve(args.port, |port| {
        eprintln!("softhca perf {:?} server: device at {gid}, waiting for a client on TCP port {port}", args.op);
    })?;
    let hello: Hello = ex.recv()?;
    // The client's parameters rule, as one perftest command line would for both ends.
    let mut a = args.clone();
    a.size = hello.size;
    a.iters = hello.iters;
    a.duration = hello.duration;
    a.qps = hello.qps;
    a.depth = hello.depth;
    a.inline = hello.inline;
    a.lat = hello.lat;
    a.mtu = hello.mtu;
    if hello.busy_poll && !args.busy_poll {
        eprintln!("softhca perf server: the client busy-polls; so does this server for its test");
        net.set_busy_poll(true);
        a.busy_poll = true;
    }
    let refusal = if let Some(l) = hello.link.filter(|&l| l != args.link) {
        Some(format!("the client is on --link {}, this server on --link {}", l.name(), args.link.name()))
    } else if hello.op != args.op {
        Some(format!(
            "the client runs perf {}, this server perf {}",
            format!("{:?}", hello.op).to_lowercase(),
            format!("{:?}", args.op).to_lowercase()
        ))
    } else if hello.qp.len() != hello.qps {
        Some(format!("{} QPs announced, {} described", hello.qps, hello.qp.len()))
    } else {
        perf::validate(&a).err().map(|e| e.to_string())
    };
    if let Some(why) = refusal {
        ex.send(&Welcome::Refused(why.clone()))?;
        return Err(err(format!("refused the client's test: {why}")));
    }
    let args = &a;
    let size = args.msg_size();
    let mtu = net::parse_mtu(args.mtu)?;
    let mut resp = Responder::new(&ctx, args)?;
    let mut theirs = Vec::new();
    let timeout = args.ack_timeout();
    for (t, info) in resp.targets.iter().zip(&hello.qp) {
        net::connect_qp(&t.qp, net::initial_psn(t.qp.qp_num()), info, mtu, timeout)?;
        theirs.push(perf::qp_info(&t.qp, &ctx, Some(&t.mem))?);
    }
    let total = args.per_qp().unwrap_or(u64::MAX);
    if args.op == Op::Send {
        resp.replenish(size, u64::from(args.depth()), |_| total)?;
    }
    let mut echoes: Vec<Echoer> = if pingpong(args) {
        resp.targets
            .iter()
            .zip(&hello.qp)
            .enumerate()
            .map(|(i, (t, info))| Echoer::new(t.qp.clone(), i, size, t.slots, args.inline, info))
            .collect::<Res<_>>()?
    } else {
        Vec::new()
    };
    ex.send(&Welcome::Ok { qp: theirs, addr: net::display_gid(ctx.query_gid(1, 0)?) })?;
    let _: String = ex.recv()?;
    let c0 = counters(&ctx);
    ex.send(&"go")?;
    let mut errors = Errors::default();
    let (mut ex, done) = if pingpong(args) || args.op == Op::Send {
        // Active: a thread waits for the client's Done while this one serves, as long as the
        // client's run takes.
        ex.patience(None)?;
        let closer = ex.closer()?;
        let reader = std::thread::spawn(move || {
            let done = ex.recv::<Done>();
            (ex, done)
        });
        let served = match (pingpong(args), args.op) {
            (true, Op::Write) => write_lat_server(&mut net, &mut resp, &mut echoes, &reader, &mut errors),
            (true, _) => send_lat_server(&mut net, &mut resp, &mut echoes, &reader, &mut errors, size),
            _ => send_bw_server(&mut net, &mut resp, &reader, &mut errors, args),
        };
        if served.is_err() {
            // The client learns that the server gave up; the reader stops waiting for it.
            let _ = closer.shutdown(std::net::Shutdown::Both);
        }
        let (ex, done) = reader.join().map_err(|_| err("the side-channel reader panicked"))?;
        served?;
        (ex, done?)
    } else {
        // Passive: write_bw, read and atomic are one-sided. The run takes as long as the
        // client says; the wait goes on while the device keeps receiving its packets.
        let rx = || ctx.counters().rx_packets;
        let mut seen = rx();
        let done: Done = ex.recv_while(|| {
            let now = rx();
            std::mem::replace(&mut seen, now) != now
        })?;
        (ex, done)
    };
    if done.completed.len() != resp.targets.len() {
        return Err(err("the client's Done does not cover every QP"));
    }
    // Finish what is still under way: the last receives, the last echoes.
    if errors.count == 0 {
        let (cq, targets) = (&resp.cq, &resp.targets);
        if args.op == Op::Send {
            net.wait("the last receives", || {
                net::cq_ready(cq) || targets.iter().zip(&done.completed).all(|(t, &c)| t.recv_done >= c)
            })?;
        }
    }
    let verified = finish(&mut net, &mut resp, &mut echoes, &mut errors, &done, args)?;
    let report = Report {
        data_verified: verified,
        errors: errors.count,
        first_error: errors.first.clone(),
        device: sub(counters(&ctx), c0),
    };
    ex.send(&report)?;
    let result: PerfResult = ex.recv()?;
    ex.send(&"bye")?;
    net.settle();
    net.finish()?;
    perf::report(&result, args.json)
}

/// Drains the responder's CQ until its receives and echoes are complete (bounded), then
/// checks its memory.
fn finish(
    net: &mut Net,
    resp: &mut Responder,
    echoes: &mut [Echoer],
    errors: &mut Errors,
    done: &Done,
    args: &PerfArgs,
) -> Res<bool> {
    let size = args.msg_size();
    let mut wcs = vec![Wc::default(); 64];
    loop {
        poll_server(resp, echoes, &mut wcs, errors, size, |_, _| Ok(()))?;
        let recvs = args.op != Op::Send || resp.targets.iter().zip(&done.completed).all(|(t, &c)| t.recv_done >= c);
        let sent = echoes.iter().all(|e| e.completed == e.posted);
        if errors.count > 0 || (recvs && sent) {
            break;
        }
        let cq = &resp.cq;
        net.wait("the server's last completions", || net::cq_ready(cq))?;
    }
    if errors.count > 0 {
        return Ok(false);
    }
    match (pingpong(args), args.op) {
        (true, Op::Write) => {
            let mut ok = true;
            for (t, (e, &c)) in resp.targets.iter().zip(echoes.iter().zip(&done.completed)) {
                ok &= e.posted == c;
                ok &= verify_marked(&t.mem, t.slots, size, c, |s| net::pattern(perf::seed(t.index) | s as u64, size))?;
            }
            Ok(ok)
        }
        (true, _) => {
            let mut ok = resp.verify(args.op, size, &done.completed)?;
            for (e, &c) in echoes.iter().zip(&done.completed) {
                ok &= e.posted == c;
            }
            Ok(ok)
        }
        _ => resp.verify(args.op, size, &done.completed),
    }
}

/// A server QP's echoes (send_lat, write_lat).
struct Echoer {
    qp: Qp,
    src: Mr,
    inline_src: Vec<u8>,
    /// The client's echo buffer (write_lat).
    raddr: u64,
    rkey: u32,
    slots: usize,
    size: usize,
    inline: bool,
    posted: u64,
    completed: u64,
    /// Messages received and not yet echoed (send_lat).
    due: u64,
}

impl Echoer {
    fn new(qp: Qp, i: usize, size: usize, slots: usize, inline: bool, client: &QpInfo) -> Res<Echoer> {
        let bytes = echo_pattern(i, size);
        let src = qp.pd().reg_mr(bytes.clone(), Access::LOCAL_WRITE)?;
        Ok(Echoer {
            qp,
            src,
            inline_src: if inline { bytes } else { Vec::new() },
            raddr: client.addr,
            rkey: client.rkey,
            slots,
            size,
            inline,
            posted: 0,
            completed: 0,
            due: 0,
        })
    }

    /// Sends echo `posted` (send_lat) or writes it, with its marker, into the client's slot
    /// (write_lat).
    fn post(&mut self, op: Op) -> Res<()> {
        let c = self.posted;
        let size = self.size;
        let sge = [self.src.sge(0..size)];
        let mut wr = match op {
            Op::Write => {
                let m = marker(c);
                self.src.write(size - 1, &[m])?;
                if self.inline {
                    self.inline_src[size - 1] = m;
                }
                let off = (c % self.slots as u64) as usize * size;
                SendWr::rdma_write(c, &sge, self.raddr.wrapping_add(off as u64), self.rkey)
            }
            _ => SendWr::send(c, &sge),
        };
        if self.inline {
            wr.inline_data = &self.inline_src;
            wr = wr.inline();
        }
        self.qp.post_send(&[wr.signaled()])?;
        self.posted += 1;
        Ok(())
    }
}

/// Reaps the server's CQ once (up to `wcs.len()` completions): echo completions count against
/// their echoer, receives are counted and checked for length, then handed to `on_recv(qp
/// index, wc)`. Once, not until empty: every poll runs an engine turn, and a latency server
/// must answer what arrived before that turn takes in the ACKs queued behind it.
fn poll_server(
    resp: &mut Responder,
    echoes: &mut [Echoer],
    wcs: &mut [Wc],
    errors: &mut Errors,
    size: usize,
    mut on_recv: impl FnMut(usize, &Wc) -> Res<()>,
) -> Res<()> {
    let n = resp.cq.poll(wcs)?;
    for wc in &wcs[..n] {
        let Some(i) = resp.by_qpn.get(wc.qp_num) else { continue };
        let ok = wc.status == WcStatus::Success;
        if wc.wr_id & RECV_TAG != 0 {
            let t = &mut resp.targets[i];
            t.recv_done += 1;
            if !ok {
                errors.record("receive", wc);
                continue;
            }
            if wc.byte_len as usize != size {
                t.bad_len += 1;
            }
            on_recv(i, wc)?;
        } else {
            if let Some(e) = echoes.get_mut(i) {
                e.completed += 1;
            }
            if !ok {
                errors.record("echo", wc);
            }
        }
    }
    Ok(())
}

type Reader = std::thread::JoinHandle<(Exchange, Res<Done>)>;

/// send_bw, server side: keep every QP's receives `2 × depth` ahead until the client is done.
fn send_bw_server(
    net: &mut Net,
    resp: &mut Responder,
    reader: &Reader,
    errors: &mut Errors,
    args: &PerfArgs,
) -> Res<()> {
    let size = args.msg_size();
    let depth = u64::from(args.depth());
    let total = args.per_qp().unwrap_or(u64::MAX);
    let mut wcs = vec![Wc::default(); 256];
    loop {
        resp.replenish(size, depth, |_| total)?;
        if reader.is_finished() || errors.count > 0 {
            return Ok(());
        }
        let cq = &resp.cq;
        net.wait("the client's Sends", || net::cq_ready(cq) || reader.is_finished())?;
        resp.poll(&mut wcs, size, errors)?;
    }
}

/// send_lat, server side: echo every message as soon as it arrives, then check its bytes
/// and repost its receive.
fn send_lat_server(
    net: &mut Net,
    resp: &mut Responder,
    echoes: &mut [Echoer],
    reader: &Reader,
    errors: &mut Errors,
    size: usize,
) -> Res<()> {
    let mut wcs = vec![Wc::default(); 16];
    let slots = resp.targets[0].slots;
    let expect: Vec<Vec<u8>> = (0..resp.targets.len()).map(|i| perf::source_bytes(i, slots, size)).collect();
    let mut got = vec![0u8; size];
    let mut arrived: Vec<(usize, u64)> = Vec::new();
    loop {
        poll_server(resp, echoes, &mut wcs, errors, size, |i, wc| {
            arrived.push((i, wc.wr_id & !RECV_TAG));
            Ok(())
        })?;
        // Echo first (the client is waiting), then check and repost.
        for &(i, _) in &arrived {
            echoes[i].due += 1;
        }
        for e in echoes.iter_mut() {
            while e.due > 0 && e.posted - e.completed < 4 {
                e.post(Op::Send)?;
                e.due -= 1;
            }
        }
        for (i, k) in arrived.drain(..) {
            let t = &mut resp.targets[i];
            let off = (k % slots as u64) as usize * size;
            t.mem.read(off, &mut got)?;
            if got[..] != expect[i][off..off + size] {
                t.bad_len += 1;
            }
            t.post_recv(size)?;
        }
        if reader.is_finished() || errors.count > 0 {
            return Ok(());
        }
        let cq = &resp.cq;
        net.wait("the client's next Send", || net::cq_ready(cq) || reader.is_finished())?;
    }
}

/// write_lat, server side: poll the last byte of the slot the client's next message goes
/// to; when its marker appears, write the echo with the same marker back.
fn write_lat_server(
    net: &mut Net,
    resp: &mut Responder,
    echoes: &mut [Echoer],
    reader: &Reader,
    errors: &mut Errors,
) -> Res<()> {
    let mut wcs = vec![Wc::default(); 16];
    let qps = resp.targets.len();
    let slots = resp.targets[0].slots;
    let size = echoes[0].size;
    let mut j = 0u64;
    loop {
        let i = (j % qps as u64) as usize;
        let c = echoes[i].posted;
        let at = (c % slots as u64) as usize * size + size - 1;
        let m = marker(c);
        poll_server(resp, echoes, &mut wcs, errors, size, |_, _| Ok(()))?;
        if reader.is_finished() || errors.count > 0 {
            return Ok(());
        }
        let e = &mut echoes[i];
        // The echo source is rewritten for every echo: the previous one must be complete.
        if last_byte_is(&resp.targets[i].mem, at, m) && e.completed == e.posted {
            e.post(Op::Write)?;
            j += 1;
            continue;
        }
        let (cq, mem) = (&resp.cq, &resp.targets[i].mem);
        net.wait("the client's next write", || last_byte_is(mem, at, m) || net::cq_ready(cq) || reader.is_finished())?;
    }
}
