//! `softhca pingpong`: ibv_rc_pingpong (and its UC and UD siblings). The client sends a
//! message, the server echoes it, `--iters` times; every received payload is checked against
//! the sender's pattern.

use std::time::Instant;

use softhca::*;

use crate::net::{self, err, Exchange, LinkKind, Net, QpInfo, Res};
use crate::PcapArg;

/// The 40 bytes a UD receive buffer holds in front of the payload (the GRH area).
const GRH: usize = 40;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum QpKind {
    /// Reliable Connection: ACKs, retransmission, in-order delivery.
    Rc,
    /// Unreliable Connection: no ACKs; a lost packet loses its message.
    Uc,
    /// Unreliable Datagram: single-packet messages addressed per WR.
    Ud,
    /// Reliable Datagram: messages addressed per WR, carried reliably by an EEC pair.
    Rd,
}

impl QpKind {
    fn qp_type(self) -> QpType {
        match self {
            QpKind::Rc => QpType::Rc,
            QpKind::Uc => QpType::Uc,
            QpKind::Ud => QpType::Ud,
            QpKind::Rd => QpType::Rd,
        }
    }
}

#[derive(clap::Args, Debug)]
#[command(after_help = "\
Examples:
  softhca pingpong --qp ud --size 1024                  both ends here, on the sim link
  softhca pingpong --link udp --server                  process 1
  softhca pingpong --link udp --connect 127.0.0.1       process 2

The udp device binds SOFTHCA_ADDR if set, else the first free address in 127.0.0.1-254.")]
pub struct PingpongArgs {
    /// Transport service of the two QPs.
    #[arg(long, value_enum, default_value_t = QpKind::Rc)]
    pub qp: QpKind,
    /// Message size in bytes (UD: at most the MTU).
    #[arg(long, short = 's', default_value_t = 4096, value_name = "BYTES")]
    pub size: usize,
    /// Round trips: the client sends, the server answers with a Send of its own.
    #[arg(long, short = 'n', default_value_t = 1000, value_name = "N")]
    pub iters: u64,
    /// Receives each end keeps posted, 1–4096.
    #[arg(long, short = 'r', default_value_t = 500, value_name = "N")]
    pub rx_depth: u64,
    /// Path MTU in bytes: 256, 512, 1024, 2048 or 4096.
    #[arg(long, short = 'm', default_value_t = 1024, value_name = "BYTES")]
    pub mtu: u32,
    /// Which link: `sim` runs both ends in this process; `udp` and `shm` need --server or
    /// --connect.
    #[arg(long, value_enum, default_value_t = LinkKind::Sim)]
    pub link: LinkKind,
    /// udp, shm: be the server: wait for one client on the TCP --port, then answer its
    /// messages.
    /// Both ends must be given the same --qp, --size, --iters and --mtu.
    #[arg(long, conflicts_with = "connect")]
    pub server: bool,
    /// udp, shm: be the client of the server whose TCP side channel is at HOST (a name or an IP
    /// address); the client sends first.
    #[arg(long, value_name = "HOST")]
    pub connect: Option<String>,
    /// TCP port of the --server/--connect side channel, which exchanges QPN, PSN and GID
    /// as ibv_rc_pingpong does.
    #[arg(long, short = 'p', default_value_t = 18515)]
    pub port: u16,
    /// udp, shm: the device's engine thread spins on its socket or ring instead of sleeping in the
    /// kernel: lowest latency, one core kept busy.
    #[arg(long)]
    pub busy_poll: bool,
    #[command(flatten)]
    pub faults: net::Faults,
    #[command(flatten)]
    pub pcap: PcapArg,
}

/// One end of the pingpong.
struct End {
    client: bool,
    qp: Qp,
    cq: Cq,
    send: Mr,
    recv: Mr,
    ah: Option<Ah>,
    /// RD: the local end of the channel, and the domain it and the QP share.
    eec: Option<(Eec, Rdd)>,
    remote_qpn: u32,
    /// Bytes a receive slot holds (size, plus the GRH for UD).
    slot: usize,
    size: usize,
    rx_depth: u64,
    iters: u64,
    /// The peer's pattern, to check what arrives.
    expect: Vec<u8>,
    sent: u64,
    received: u64,
    recv_posted: u64,
    send_outstanding: bool,
    /// Sends this end may post now: the client starts with one, the server earns one per
    /// receive.
    tokens: u64,
    bad_payloads: u64,
    _pd: Pd,
}

impl End {
    fn new(ctx: &Context, kind: QpKind, client: bool, args: &PingpongArgs) -> Res<End> {
        let pd = ctx.alloc_pd()?;
        let depth = args.rx_depth as u32; // in 1..=4096: `run`
        let cq = ctx.create_cq(depth * 2 + 16)?;
        let eec = match kind {
            QpKind::Rd => {
                let rdd = ctx.alloc_rdd()?;
                Some((ctx.create_eec(&rdd)?, rdd))
            }
            _ => None,
        };
        let mut init = QpInitAttr::new(kind.qp_type(), &cq, &cq);
        init.rdd = eec.as_ref().map(|(_, rdd)| rdd.clone());
        let qp = pd.create_qp(&init.max_send_wr(16).max_recv_wr(depth).max_send_sge(1).max_recv_sge(1))?;
        let slot = args.size + if kind == QpKind::Ud { GRH } else { 0 };
        let own_seed = u64::from(!client);
        let send = pd.reg_mr(net::pattern(own_seed, args.size.max(1)), Access::LOCAL_WRITE)?;
        let recv = pd.alloc_mr((slot * depth as usize).max(1), Access::LOCAL_WRITE)?;
        Ok(End {
            client,
            qp,
            cq,
            send,
            recv,
            ah: None,
            eec,
            remote_qpn: 0,
            slot,
            size: args.size,
            rx_depth: u64::from(depth),
            iters: args.iters,
            expect: net::pattern(u64::from(client), args.size),
            sent: 0,
            received: 0,
            recv_posted: 0,
            send_outstanding: false,
            tokens: u64::from(client),
            bad_payloads: 0,
            _pd: pd,
        })
    }

    fn info(&self, ctx: &Context) -> Res<QpInfo> {
        let qpn = self.qp.qp_num();
        let eecn = self.eec.as_ref().map_or(0, |(e, _)| e.eecn());
        let gid = net::gid_string(ctx.query_gid(1, 0)?);
        Ok(QpInfo { qpn, psn: net::initial_psn(qpn), gid, addr: 0, rkey: 0, eecn, params: String::new() })
    }

    fn connect(&mut self, remote: &QpInfo, mtu: Mtu, link: LinkKind) -> Res<()> {
        let psn = net::initial_psn(self.qp.qp_num());
        match &self.eec {
            Some((eec, _)) => net::connect_rd(&self.qp, eec, psn, remote, mtu, net::rc_timeout(link))?,
            None => net::connect_qp(&self.qp, psn, remote, mtu, net::rc_timeout(link))?,
        }
        if self.qp.qp_type() == QpType::Ud {
            self.ah = Some(self.qp.pd().create_ah(&AhAttr::roce(remote.gid()?, 0))?);
        }
        self.remote_qpn = remote.qpn;
        while self.recv_posted < self.iters.min(self.rx_depth) {
            self.post_recv()?;
        }
        Ok(())
    }

    fn post_recv(&mut self) -> Res<()> {
        let k = self.recv_posted;
        let off = (k % self.rx_depth) as usize * self.slot;
        self.qp.post_recv(&[RecvWr::new(k, &[self.recv.sge(off..off + self.slot)])])?;
        self.recv_posted += 1;
        Ok(())
    }

    fn maybe_send(&mut self) -> Res<()> {
        if self.tokens == 0 || self.send_outstanding || self.sent == self.iters {
            return Ok(());
        }
        let sge = [self.send.sge(0..self.size)];
        let mut wr = SendWr::send(self.sent, &sge).signaled();
        if let Some(ah) = &self.ah {
            wr = wr.ud(ah, self.remote_qpn, net::QKEY);
        }
        if let Some((eec, _)) = &self.eec {
            wr = wr.rd(eec, self.remote_qpn, net::QKEY);
        }
        self.qp.post_send(&[wr])?;
        self.tokens -= 1;
        self.sent += 1;
        self.send_outstanding = true;
        Ok(())
    }

    fn done(&self) -> bool {
        self.sent == self.iters && self.received == self.iters && !self.send_outstanding
    }

    fn poll(&mut self) -> Res<()> {
        let mut wcs = [Wc::default(); 32];
        loop {
            let n = self.cq.poll(&mut wcs)?;
            if n == 0 {
                return Ok(());
            }
            for wc in &wcs[..n] {
                if wc.status != WcStatus::Success {
                    return Err(err(format!(
                        "{} completion for wr_id {} with status \"{}\" ({:?})",
                        if wc.opcode == WcOpcode::Recv { "receive" } else { "send" },
                        wc.wr_id,
                        wc.status,
                        wc.status
                    )));
                }
                match wc.opcode {
                    WcOpcode::Recv => {
                        let off = (wc.wr_id % self.rx_depth) as usize * self.slot;
                        let skip = self.slot - self.size;
                        let mut got = vec![0u8; self.size];
                        self.recv.read(off + skip, &mut got)?;
                        if wc.byte_len as usize != self.slot.min(self.size + skip) || got != self.expect {
                            self.bad_payloads += 1;
                        }
                        self.received += 1;
                        if !self.client || self.received < self.iters {
                            self.tokens += 1;
                        }
                        if self.recv_posted < self.iters {
                            self.post_recv()?;
                        }
                    }
                    _ => self.send_outstanding = false,
                }
            }
        }
    }
}

pub fn run(args: &PingpongArgs) -> Res<()> {
    if args.iters == 0 {
        return Err(err("--iters must be at least 1"));
    }
    if args.size as u64 > MAX_MSG_SIZE {
        return Err(err(format!("--size {} is above the largest message, 2^31 bytes", args.size)));
    }
    if !(1..=4096).contains(&args.rx_depth) {
        return Err(err("--rx-depth must be in 1..=4096"));
    }
    let depth = args.rx_depth;
    if (args.size as u64 + GRH as u64).saturating_mul(depth) > 8 << 30 {
        return Err(err("--size × --rx-depth needs more than 8 GiB of receive buffers: lower one of them"));
    }
    let mtu = net::parse_mtu(args.mtu)?;
    if args.qp == QpKind::Ud && args.size > mtu.bytes() as usize {
        return Err(err(format!("UD messages must fit one packet: --size {} exceeds --mtu {}", args.size, args.mtu)));
    }
    match args.link {
        LinkKind::Sim => {
            if args.server || args.connect.is_some() {
                return Err(err("--server/--connect are for --link udp or shm; with --link sim both ends run here"));
            }
            run_sim(args)
        }
        LinkKind::Udp | LinkKind::Shm => {
            if !args.server && args.connect.is_none() {
                return Err(err("--link udp and --link shm need --server or --connect HOST"));
            }
            run_udp(args)
        }
    }
}

/// What a pingpong on the sim link measured.
pub struct PingResult {
    pub wall_s: f64,
    pub virtual_s: f64,
    pub bad_payloads: u64,
    pub local: QpInfo,
    pub remote: QpInfo,
}

/// Runs a pingpong between new QPs on `ca` (client) and `cb` (server), both on `net`.
pub fn run_pair(net: &mut Net, ca: &Context, cb: &Context, args: &PingpongArgs) -> Res<PingResult> {
    let mtu = net::parse_mtu(args.mtu)?;
    let mut client = End::new(ca, args.qp, true, args)?;
    let mut server = End::new(cb, args.qp, false, args)?;
    let (ic, is) = (client.info(ca)?, server.info(cb)?);
    client.connect(&is, mtu, LinkKind::Sim)?;
    server.connect(&ic, mtu, LinkKind::Sim)?;
    let v0 = net.virtual_ns().unwrap_or(0);
    let start = Instant::now();
    let mut ends = [client, server];
    drive(net, &mut ends)?;
    let wall_s = start.elapsed().as_secs_f64();
    let virtual_s = (net.virtual_ns().unwrap_or(0) - v0) as f64 / 1e9;
    net.settle();
    let bad_payloads = ends.iter().map(|e| e.bad_payloads).sum();
    Ok(PingResult { wall_s, virtual_s, bad_payloads, local: ic, remote: is })
}

fn run_sim(args: &PingpongArgs) -> Res<()> {
    let mut net = Net::sim(&args.faults, args.pcap.pcap.as_deref())?;
    let ca = net.add_device("softhca0")?;
    let cb = net.add_device("softhca1")?;
    let r = run_pair(&mut net, &ca, &cb, args).map_err(|e| {
        if matches!(args.qp, QpKind::Uc | QpKind::Ud) && args.faults.loss > 0.0 {
            net::err(format!(
                "{e}\n(UC and UD do not retransmit: a lost message stops a pingpong, as it would stop ibv_uc_pingpong)"
            ))
        } else {
            e
        }
    })?;
    net.finish()?;
    println!("  local address:  {}", r.local.describe());
    println!("  remote address: {}", r.remote.describe());
    report(args, r.wall_s);
    println!(
        "  sim link: {:.6} s of virtual time = {:.2} usec/iter on the simulated wire; the lines above are wall-clock",
        r.virtual_s,
        r.virtual_s * 1e6 / args.iters as f64
    );
    let c = net::add_counters(ca.counters(), cb.counters());
    println!("  retransmits: {}  payload check: {}", c.retransmits, if r.bad_payloads == 0 { "ok" } else { "FAILED" });
    if let Some(p) = net.pcap_path() {
        println!("  pcap: {}", p.display());
    }
    if r.bad_payloads > 0 {
        return Err(err(format!("{} received payloads differed from the sender's pattern", r.bad_payloads)));
    }
    Ok(())
}

/// One end over the udp link, the other in another process; QP information crosses TCP.
fn run_udp(args: &PingpongArgs) -> Res<()> {
    let mtu = net::parse_mtu(args.mtu)?;
    let client = !args.server;
    let mut net = Net::os(args.link, args.pcap.pcap.as_deref(), args.busy_poll);
    let ctx = net.add_device(if client { "softhca_udp_client" } else { "softhca_udp_server" })?;
    let mut end = End::new(&ctx, args.qp, client, args)?;
    let mut mine = end.info(&ctx)?;
    mine.params = format!(
        "--link {} --qp {:?} --size {} --iters {} --mtu {}",
        args.link.name(),
        args.qp,
        args.size,
        args.iters,
        args.mtu
    )
    .to_lowercase();
    let (mut ex, theirs) = if let Some(host) = &args.connect {
        let mut ex = Exchange::connect(host, args.port)?;
        ex.send(&mine)?;
        let theirs: QpInfo = ex.recv()?;
        (ex, theirs)
    } else {
        let gid = net::display_gid(ctx.query_gid(1, 0)?);
        let mut ex = Exchange::serve(args.port, |port| {
            println!("  waiting for a client on TCP port {port} (device {gid})");
        })?;
        let theirs: QpInfo = ex.recv()?;
        ex.send(&mine)?;
        (ex, theirs)
    };
    if !theirs.params.is_empty() && theirs.params != mine.params {
        return Err(err(format!(
            "the peer runs {}, this end {}: both ends need the same --link, --qp, --size, --iters and --mtu",
            theirs.params, mine.params
        )));
    }
    end.connect(&theirs, mtu, args.link)?;
    // Both ends have their receives posted before the first Send.
    ex.send(&"ready")?;
    let _: String = ex.recv()?;
    println!("  local address:  {}", mine.describe());
    println!("  remote address: {}", theirs.describe());
    let start = Instant::now();
    let mut ends = [end];
    drive(&mut net, &mut ends)?;
    let wall = start.elapsed().as_secs_f64();
    // Neither end closes its device while the other may still need an ACK.
    ex.send(&"done")?;
    let _: String = ex.recv()?;
    net.settle();
    let c = ctx.counters();
    net.finish()?;
    report(args, wall);
    let bad = ends[0].bad_payloads;
    println!("  retransmits: {}  payload check: {}", c.retransmits, if bad == 0 { "ok" } else { "FAILED" });
    if let Some(p) = net.pcap_path() {
        println!("  pcap: {}", p.display());
    }
    if bad > 0 {
        return Err(err(format!("{bad} received payloads differed from the sender's pattern")));
    }
    Ok(())
}

/// Runs every end until all are done.
fn drive(net: &mut Net, ends: &mut [End]) -> Res<()> {
    loop {
        for e in ends.iter_mut() {
            e.maybe_send()?;
        }
        if ends.iter().all(End::done) {
            return Ok(());
        }
        net.wait("pingpong completions", || ends.iter().any(|e| net::cq_ready(&e.cq)))?;
        for e in ends.iter_mut() {
            e.poll()?;
        }
    }
}

fn report(args: &PingpongArgs, secs: f64) {
    let bytes = args.size as u64 * args.iters * 2;
    let usec = secs * 1e6;
    println!("{bytes} bytes in {secs:.2} seconds = {:.2} Mbit/sec", bytes as f64 * 8.0 / usec.max(1e-9));
    println!("{} iters in {secs:.2} seconds = {:.2} usec/iter", args.iters, usec / args.iters as f64);
}
