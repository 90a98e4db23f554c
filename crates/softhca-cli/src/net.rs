//! What every traffic subcommand shares: the link the devices sit on (`Net`), QP setup and
//! connection, the QP information two ends exchange, and the data pattern that is verified.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use softhca::link::shm::{ShmConfig, ShmDevice};
use softhca::link::udp::{UdpConfig, UdpDevice};
use softhca::link::{PcapTap, TapHandle};
use softhca::link::{SimConfig, SimCounters, SimFabric};
use softhca::transport::DeviceCounters;
use softhca::*;

/// Errors of the CLI: any error, printed as a message.
pub type Error = Box<dyn std::error::Error + Send + Sync>;
pub type Res<T> = std::result::Result<T, Error>;

/// Builds an error from a message.
pub fn err(msg: impl Into<String>) -> Error {
    msg.into().into()
}

/// The Q_Key every UD QP of the CLI uses.
pub const QKEY: u32 = 0x1111_1111;

/// Which link the devices use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LinkKind {
    /// The deterministic in-process fabric (virtual clock, seeded faults).
    Sim,
    /// RoCEv2 over real UDP sockets.
    Udp,
    /// The same RoCEv2 datagrams through rings in shared memory: processes of one host.
    Shm,
}

impl LinkKind {
    /// The name `--link` takes.
    pub fn name(self) -> &'static str {
        match self {
            LinkKind::Sim => "sim",
            LinkKind::Udp => "udp",
            LinkKind::Shm => "shm",
        }
    }
}

/// The simulated link's faults and seed.
#[derive(Debug, Clone, Copy, Default, clap::Args)]
pub struct Faults {
    /// Sim link: probability that a datagram is lost.
    #[arg(long, default_value_t = 0.0, value_name = "P")]
    pub loss: f64,
    /// Sim link: probability that a datagram is duplicated.
    #[arg(long, default_value_t = 0.0, value_name = "P")]
    pub dup: f64,
    /// Sim link: probability that a datagram is reordered (arrives late).
    #[arg(long, default_value_t = 0.0, value_name = "P")]
    pub reorder: f64,
    /// Sim link: probability that a datagram gets 1-3 bit flips (the ICRC catches them).
    #[arg(long, default_value_t = 0.0, value_name = "P")]
    pub corrupt: f64,
    /// Sim link: seed of every random choice; one seed always gives the same run.
    #[arg(long, default_value_t = 1, value_name = "S")]
    pub seed: u64,
}

impl Faults {
    pub fn sim_config(&self) -> SimConfig {
        SimConfig::default()
            .seed(self.seed)
            .loss(self.loss)
            .dup(self.dup)
            .reorder(self.reorder)
            .corrupt(self.corrupt)
            .time_limit_ns(600_000_000_000)
    }

    pub fn validate(&self) -> Res<()> {
        for (name, p) in [("loss", self.loss), ("dup", self.dup), ("reorder", self.reorder), ("corrupt", self.corrupt)]
        {
            if !(0.0..=1.0).contains(&p) {
                return Err(err(format!("--{name} must be a probability in 0..=1, not {p}")));
            }
        }
        Ok(())
    }
}

/// How long `wait` on the udp link waits for a condition before giving up:
/// `SOFTHCA_WAIT_SECS`, else 60 s. Read once: a ping-pong waits once per message, and the
/// environment lookup (a lock and a scan) was a twentieth of a busy-polled server's work.
pub fn udp_wait() -> Duration {
    static WAIT: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    *WAIT.get_or_init(|| {
        Duration::from_secs(std::env::var("SOFTHCA_WAIT_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(60))
    })
}

/// The devices' link and how the CLI waits for their progress.
pub enum Net {
    /// Everything happens inside `wait`, on the fabric's virtual clock.
    Sim { fabric: Box<SimFabric>, pcap: Option<PathBuf> },
    /// Engine threads move the packets (UDP sockets, or shared-memory rings with `shm`);
    /// `wait` polls. The first device records the pcap (everything it sends and receives).
    Udp { devs: Vec<OsDevice>, pcap: Option<PathBuf>, busy_poll: bool, shm: bool },
}

/// A device on a link of the operating system's: UDP sockets or shared memory.
pub enum OsDevice {
    Udp(UdpDevice),
    Shm(ShmDevice),
}

impl OsDevice {
    /// The device's address and its link's counters, for a diagnostic.
    pub fn describe(&self) -> String {
        match self {
            OsDevice::Udp(d) => {
                format!("{} at {}: {:?}; {:?}", d.context().name(), d.addr(), d.context().counters(), d.counters())
            }
            OsDevice::Shm(d) => {
                format!("{} at {}: {:?}; {:?}", d.context().name(), d.addr(), d.context().counters(), d.counters())
            }
        }
    }
}

impl Net {
    /// A sim fabric with `faults`, recording to `pcap` if given.
    pub fn sim(faults: &Faults, pcap: Option<&Path>) -> Res<Net> {
        faults.validate()?;
        let mut fabric = SimFabric::new(faults.sim_config());
        if let Some(path) = pcap {
            fabric.pcap_file(path).map_err(|e| err(format!("cannot write pcap {}: {e}", path.display())))?;
        }
        Ok(Net::Sim { fabric: Box::new(fabric), pcap: pcap.map(Path::to_path_buf) })
    }

    /// A udp link; devices bind `SOFTHCA_ADDR` or the first free 127.0.0.x.
    pub fn udp(pcap: Option<&Path>, busy_poll: bool) -> Net {
        Net::Udp { devs: Vec::new(), pcap: pcap.map(Path::to_path_buf), busy_poll, shm: false }
    }

    /// The link of `kind` between processes (udp or shm).
    pub fn os(kind: LinkKind, pcap: Option<&Path>, busy_poll: bool) -> Net {
        Net::Udp { devs: Vec::new(), pcap: pcap.map(Path::to_path_buf), busy_poll, shm: kind == LinkKind::Shm }
    }

    pub fn add_device(&mut self, name: &str) -> Res<Context> {
        match self {
            Net::Sim { fabric, .. } => Ok(fabric.add_device(name)?),
            Net::Udp { devs, pcap, busy_poll, shm: false } => {
                let cfg = UdpConfig {
                    name: name.to_string(),
                    busy_poll: *busy_poll,
                    pcap: if devs.is_empty() { pcap.clone() } else { None },
                    ..UdpConfig::default()
                };
                let dev = UdpDevice::open(cfg).map_err(|e| err(format!("cannot open udp device {name}: {e}")))?;
                let ctx = dev.context().clone();
                devs.push(OsDevice::Udp(dev));
                Ok(ctx)
            }
            Net::Udp { devs, pcap, busy_poll, shm: true } => {
                let mut cfg = ShmConfig::default().name(name).busy_poll(*busy_poll);
                if let (true, Some(path)) = (devs.is_empty(), pcap.as_ref()) {
                    let file = std::fs::File::create(path)
                        .map_err(|e| err(format!("cannot write pcap {}: {e}", path.display())))?;
                    let tap = PcapTap::new(std::io::BufWriter::new(file)).map_err(|e| err(format!("pcap: {e}")))?;
                    cfg = cfg.tap(TapHandle::new(tap));
                }
                let dev = ShmDevice::open(cfg).map_err(|e| err(format!("cannot open shm device {name}: {e}")))?;
                let ctx = dev.context().clone();
                devs.push(OsDevice::Shm(dev));
                Ok(ctx)
            }
        }
    }

    /// Switches the udp or shm devices' busy-poll mode (nothing on the sim link).
    pub fn set_busy_poll(&mut self, on: bool) {
        if let Net::Udp { devs, busy_poll, .. } = self {
            *busy_poll = on;
            for d in devs.iter() {
                match d {
                    OsDevice::Udp(d) => d.set_busy_poll(on),
                    OsDevice::Shm(d) => d.set_busy_poll(on),
                }
            }
        }
    }

    /// The udp or shm devices (empty on the sim link).
    pub fn os_devices(&self) -> &[OsDevice] {
        match self {
            Net::Sim { .. } => &[],
            Net::Udp { devs, .. } => devs,
        }
    }

    /// Runs the link until `cond` holds. An error if it cannot: the sim fabric went idle (a
    /// deadlock: nothing left that could make `cond` true) or hit its limits.
    pub fn wait(&mut self, what: &str, mut cond: impl FnMut() -> bool) -> Res<()> {
        match self {
            Net::Sim { fabric, .. } => {
                if fabric.run_until(|_| cond()) {
                    Ok(())
                } else {
                    let c = fabric.counters();
                    Err(err(format!(
                        "stalled waiting for {what} at virtual time {:.6} s: nothing left in flight that \
                         could bring it ({} datagrams sent, {} delivered, {} lost, {} corrupted; a UC or \
                         UD message lost is not resent)",
                        fabric.now() as f64 / 1e9,
                        c.sent,
                        c.delivered,
                        c.lost,
                        c.corrupted
                    )))
                }
            }
            Net::Udp { .. } => {
                let start = Instant::now();
                let limit = udp_wait();
                let mut spins = 0u32;
                loop {
                    if cond() {
                        return Ok(());
                    }
                    // The clock is read once per 64 spins: a busy-polled ping-pong spent a
                    // tenth of its time here reading it.
                    spins = spins.wrapping_add(1);
                    if !spins.is_multiple_of(64) {
                        std::hint::spin_loop();
                        continue;
                    }
                    if start.elapsed() > limit {
                        let Net::Udp { devs, .. } = &*self else { unreachable!() };
                        let state: Vec<String> = devs.iter().map(OsDevice::describe).collect();
                        return Err(err(format!(
                            "timed out after {} s waiting for {what}; {}",
                            udp_wait().as_secs(),
                            state.join("; ")
                        )));
                    }
                    // The engine threads need the cores too: spin briefly, then yield.
                    std::thread::yield_now();
                }
            }
        }
    }

    /// Replaces the sim link's faults for every datagram from now on.
    pub fn set_faults(&mut self, faults: &Faults) -> Res<()> {
        faults.validate()?;
        match self {
            Net::Sim { fabric, .. } => fabric.set_default_link(faults.sim_config().link),
            Net::Udp { .. } => return Err(err("faults are a feature of the sim link")),
        }
        Ok(())
    }

    /// The virtual clock in nanoseconds, on the sim link.
    pub fn virtual_ns(&self) -> Option<u64> {
        match self {
            Net::Sim { fabric, .. } => Some(fabric.now()),
            Net::Udp { .. } => None,
        }
    }

    pub fn sim_counters(&self) -> Option<SimCounters> {
        match self {
            Net::Sim { fabric, .. } => Some(fabric.counters()),
            Net::Udp { .. } => None,
        }
    }

    /// Lets in-flight retransmissions and ACKs settle (sim only; bounded).
    pub fn settle(&mut self) {
        match self {
            Net::Sim { fabric, .. } => {
                fabric.run_until_within(1_000_000_000, |f| f.in_flight() == 0);
            }
            // Let the last ACKs leave before the devices close.
            Net::Udp { .. } => std::thread::sleep(Duration::from_millis(20)),
        }
    }

    pub fn pcap_path(&self) -> Option<&Path> {
        match self {
            Net::Sim { pcap, .. } | Net::Udp { pcap, .. } => pcap.as_deref(),
        }
    }

    /// Flushes the pcap.
    pub fn finish(&mut self) -> Res<()> {
        match self {
            Net::Sim { fabric, .. } => fabric.flush_pcap().map_err(|e| err(format!("pcap: {e}"))),
            // Closing the devices flushes their pcap.
            Net::Udp { devs, .. } => {
                devs.clear();
                Ok(())
            }
        }
    }
}

/// Whether `cq` holds a CQE. It polls for none first, which runs the device's progress hook:
/// with `--busy-poll` the udp engine then runs in the caller's spin instead of beside it.
pub fn cq_ready(cq: &Cq) -> bool {
    let _ = cq.poll(&mut []);
    cq.len().unwrap_or(1) > 0
}

/// Sum of two devices' counters.
pub fn add_counters(a: DeviceCounters, b: DeviceCounters) -> DeviceCounters {
    a + b
}

/// `b - a` for counters that only grow.
pub fn sub_counters(b: DeviceCounters, a: DeviceCounters) -> DeviceCounters {
    b - a
}

/// What one end tells the other to connect, as in ibv_rc_pingpong's exchange: QPN, PSN, GID,
/// and for RDMA the buffer's address and R_Key.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct QpInfo {
    pub qpn: u32,
    pub psn: u32,
    pub gid: String,
    #[serde(default)]
    pub addr: u64,
    #[serde(default)]
    pub rkey: u32,
    /// RD: the EEC the peer's end of the channel is.
    #[serde(default)]
    pub eecn: u32,
    /// The run's parameters both ends must share (pingpong), to name a mismatch up front.
    #[serde(default, deserialize_with = "peer_text")]
    pub params: String,
}

impl QpInfo {
    pub fn gid(&self) -> Res<Gid> {
        let ip: std::net::Ipv6Addr = self.gid.parse().map_err(|_| err(format!("bad GID {:?} from peer", self.gid)))?;
        Ok(Gid::from_ipv6(ip))
    }

    pub fn describe(&self) -> String {
        let gid = self.gid().map(display_gid).unwrap_or_else(|_| printable(&self.gid));
        let eec = if self.eecn != 0 { format!(", EECN {:#08x}", self.eecn) } else { String::new() };
        format!("LID 0x0000, QPN {:#08x}, PSN {:#08x}{eec}, GID {gid}", self.qpn, self.psn)
    }
}

/// Text the peer sent, as this end may print it: control characters (terminal escapes among
/// them) and bidirectional overrides written as escapes, and at most 1,024 characters kept.
/// For the side channel's string fields (`#[serde(deserialize_with = "peer_text")]`).
pub fn peer_text<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let s = String::deserialize(d)?;
    Ok(printable(&s))
}

/// [`peer_text`] for an optional field.
pub fn peer_text_opt<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    Ok(Option::<String>::deserialize(d)?.map(|s| printable(&s)))
}

fn printable(s: &str) -> String {
    const MAX_CHARS: usize = 1024;
    let bidi = |c: char| matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
    let mut out = String::with_capacity(s.len().min(MAX_CHARS));
    for c in s.chars().take(MAX_CHARS) {
        if c.is_control() || bidi(c) {
            out.extend(c.escape_unicode());
        } else {
            out.push(c);
        }
    }
    out
}

/// A GID as an address: IPv4-mapped GIDs as `::ffff:a.b.c.d`.
pub fn display_gid(g: Gid) -> String {
    g.to_ipv6().to_string()
}

pub fn gid_string(g: Gid) -> String {
    g.to_ipv6().to_string()
}

/// The largest Local ACK Timeout exponent (5 bits; 31 is 2.4 hours).
pub const MAX_RC_TIMEOUT: u8 = 31;

/// What Local ACK Timeout exponent `t` means, in seconds: 4.096 µs × 2^t.
pub fn rc_timeout_s(t: u8) -> f64 {
    4.096e-6 * f64::from(1u32 << t.min(MAX_RC_TIMEOUT))
}

/// Timeout exponent for RC retransmissions: 4.096 µs × 2^t. The sim's virtual time is free,
/// so a short one keeps lossy runs quick; real links get a longer one.
pub fn rc_timeout(link: LinkKind) -> u8 {
    match link {
        LinkKind::Sim => 10,
        LinkKind::Udp | LinkKind::Shm => 14,
    }
}

/// Walks `qp` Reset → Init → RTR → RTS towards `remote`.
pub fn connect_qp(qp: &Qp, local_psn: u32, remote: &QpInfo, mtu: Mtu, timeout: u8) -> Res<()> {
    let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    match qp.qp_type() {
        QpType::Ud => {
            qp.modify(&QpAttr::to_init().port(1).pkey_index(0).qkey(QKEY))?;
            qp.modify(&QpAttr::new(QpState::Rtr))?;
            qp.modify(&QpAttr::to_rts().sq_psn(local_psn))?;
        }
        QpType::Uc => {
            let av = AddressVector::new(AhAttr::roce(remote.gid()?, 0), mtu);
            qp.modify(&QpAttr::to_init().port(1).pkey_index(0).access(Access::REMOTE_WRITE))?;
            qp.modify(&QpAttr::to_rtr(av, remote.qpn).rq_psn(remote.psn))?;
            qp.modify(&QpAttr::to_rts().sq_psn(local_psn))?;
        }
        _ => {
            let av = AddressVector::new(AhAttr::roce(remote.gid()?, 0), mtu);
            qp.modify(&QpAttr::to_init().port(1).pkey_index(0).access(all))?;
            qp.modify(&QpAttr::to_rtr(av, remote.qpn).rq_psn(remote.psn).max_dest_rd_atomic(16).min_rnr_timer(1))?;
            qp.modify(
                &QpAttr::to_rts().sq_psn(local_psn).timeout(timeout).retry_cnt(7).rnr_retry(7).max_rd_atomic(16),
            )?;
        }
    }
    Ok(())
}

/// Brings an RD QP to RTS and its EEC to RTS toward the peer's EEC: the EEC holds the path,
/// the PSNs and the retry counts; the QP its Q_Key and enables.
pub fn connect_rd(qp: &Qp, eec: &Eec, local_psn: u32, remote: &QpInfo, mtu: Mtu, timeout: u8) -> Res<()> {
    let all = Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    qp.modify(&QpAttr::to_init().access(all).qkey(QKEY))?;
    qp.modify(&QpAttr::new(QpState::Rtr).max_dest_rd_atomic(16).min_rnr_timer(1))?;
    qp.modify(&QpAttr::to_rts().max_rd_atomic(16))?;
    let av = AddressVector::new(AhAttr::roce(remote.gid()?, 0), mtu);
    eec.modify(&EecAttr::new(QpState::Init).pkey_index(0).port_num(1))?;
    eec.modify(&EecAttr::new(QpState::Rtr).av(av).dest_eecn(remote.eecn).rq_psn(remote.psn).max_dest_rd_atomic(16))?;
    eec.modify(
        &EecAttr::new(QpState::Rts).sq_psn(local_psn).timeout(timeout).retry_cnt(7).rnr_retry(7).max_rd_atomic(16),
    )?;
    Ok(())
}

/// A PSN for a QP: deterministic per QPN (so sim runs repeat), spread over the 24-bit space.
pub fn initial_psn(qpn: u32) -> u32 {
    (mix(u64::from(qpn)) as u32) & 0xFF_FFFF
}

/// SplitMix64 finaliser.
pub fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The known bytes of message slot `seed`: what receivers and initiators verify.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 8);
    let mut i = 0u64;
    while out.len() < len {
        out.extend_from_slice(&mix(seed.wrapping_mul(0x1_0000_0001).wrapping_add(i)).to_le_bytes());
        i += 1;
    }
    out.truncate(len);
    out
}

/// Parses `--mtu` bytes.
pub fn parse_mtu(bytes: u32) -> Res<Mtu> {
    Mtu::from_bytes(bytes).map_err(|_| err(format!("--mtu must be 256, 512, 1024, 2048 or 4096, not {bytes}")))
}

/// The TCP side channel of `--server` / `--connect`: one JSON line each way.
pub struct Exchange {
    stream: BufReader<TcpStream>,
}

impl Exchange {
    /// Waits for one client on `port` (0: one the system picks), once `listening` was told the
    /// port it listens on.
    pub fn serve(port: u16, listening: impl FnOnce(u16)) -> Res<Exchange> {
        let listener =
            TcpListener::bind(("0.0.0.0", port)).map_err(|e| err(format!("cannot listen on TCP port {port}: {e}")))?;
        listening(listener.local_addr()?.port());
        let (stream, _) = listener.accept()?;
        Exchange::over(stream)
    }

    /// A peer that says nothing is given up on after SOFTHCA_WAIT_SECS (see `patience`).
    fn over(stream: TcpStream) -> Res<Exchange> {
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(udp_wait()))?;
        Ok(Exchange { stream: BufReader::new(stream) })
    }

    /// How long the next receives may wait: `None` while the peer is busy with a run of its
    /// own length (a benchmark's `--duration`), the SOFTHCA_WAIT_SECS default otherwise.
    pub fn patience(&self, limit: Option<Duration>) -> Res<()> {
        Ok(self.stream.get_ref().set_read_timeout(limit)?)
    }

    /// Connects to a server, retrying for a few seconds while it starts. A name that does not
    /// resolve is an error at once (retrying cannot fix it).
    pub fn connect(host: &str, port: u16) -> Res<Exchange> {
        use std::net::ToSocketAddrs;
        if host.parse::<std::net::SocketAddr>().is_ok() {
            return Err(err(format!("--connect takes a host without a port ({host}); give the port with --port")));
        }
        (host, port).to_socket_addrs().map_err(|e| err(format!("cannot resolve {host}: {e}")))?;
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut told = false;
        loop {
            match TcpStream::connect((host, port)) {
                Ok(stream) => return Exchange::over(stream),
                Err(e) if Instant::now() >= deadline => {
                    return Err(err(format!("cannot connect to {host}:{port}: {e}")));
                }
                Err(e) => {
                    if !told {
                        eprintln!("softhca: no server at {host}:{port} yet ({e}); trying again for 10 s");
                        told = true;
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        }
    }

    /// A second handle on the connection, to shut it down while another thread reads.
    pub fn closer(&self) -> Res<TcpStream> {
        Ok(self.stream.get_ref().try_clone()?)
    }

    pub fn send<T: Serialize>(&mut self, value: &T) -> Res<()> {
        let mut line = serde_json::to_string(value)?;
        line.push('\n');
        self.stream.get_mut().write_all(line.as_bytes())?;
        Ok(())
    }

    pub fn recv<T: for<'de> Deserialize<'de>>(&mut self) -> Res<T> {
        self.recv_while(|| false)
    }

    /// [`Exchange::recv`], waiting on past each read timeout (`patience`) as long as
    /// `progressing` says the run is still moving (the device still receiving): a peer that
    /// goes silent with its connection open is given up on then, not waited for ever.
    pub fn recv_while<T: for<'de> Deserialize<'de>>(&mut self, mut progressing: impl FnMut() -> bool) -> Res<T> {
        // Every message is one JSON line: at most 16,384 QPs' entries of about 120 bytes (a
        // Hello or Welcome); a peer cannot make this end buffer more.
        const MAX_LINE: u64 = 4 << 20;
        let mut line = String::new();
        let n = loop {
            // A line cut by a timeout is kept: the next read appends to it.
            match (&mut self.stream).take(MAX_LINE - line.len() as u64).read_line(&mut line) {
                Ok(_) => break line.len(),
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                    if progressing() {
                        continue;
                    }
                    return Err(err(format!(
                        "the peer sent nothing on the TCP side channel for {} s (SOFTHCA_WAIT_SECS)",
                        udp_wait().as_secs()
                    )));
                }
                Err(e) => return Err(err(format!("the TCP side channel failed: {e}"))),
            }
        };
        if n == 0 {
            return Err(err("peer closed the TCP exchange"));
        }
        if !line.ends_with('\n') && n as u64 == MAX_LINE {
            return Err(err("the peer sent an over-long line on the TCP side channel; is it softhca?"));
        }
        serde_json::from_str(line.trim_end()).map_err(|e| {
            err(format!("the peer sent something softhca did not expect on the TCP side channel ({e}); is it softhca, the same version, run with the same subcommand?"))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::{Exchange, QpInfo};
    use std::io::Write;
    use std::net::{TcpListener, TcpStream};
    use std::time::Duration;

    /// A receive waits past its read timeouts while the run progresses and gives up once it
    /// does not; a line cut by a timeout is completed by the next read, not lost.
    #[test]
    fn a_receive_waits_while_the_run_progresses() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut peer = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let mut ex = Exchange::over(listener.accept().unwrap().0).unwrap();
        ex.patience(Some(Duration::from_millis(20))).unwrap();
        let mut asked = 0;
        let silent = ex.recv_while::<u32>(|| {
            asked += 1;
            asked < 3
        });
        assert!(silent.is_err() && asked == 3, "{silent:?} after {asked}");
        peer.write_all(b"12").unwrap();
        let mut rest = Some(b"34\n");
        let got = ex.recv_while::<u32>(|| {
            if let Some(r) = rest.take() {
                peer.write_all(r).unwrap();
            }
            true
        });
        assert_eq!(got.unwrap(), 1234);
    }

    /// The peer's text reaches the terminal escaped: a terminal escape sent as a parameter
    /// string is printed as `\u{1b}`, not obeyed.
    #[test]
    fn the_peers_text_is_printed_escaped() {
        let line = r#"{"qpn":1,"psn":2,"gid":"\u001b]0;x\u0007","params":"\u001b[2J\u202eq=1"}"#;
        let info: QpInfo = serde_json::from_str(line).unwrap();
        assert_eq!(info.params, "\\u{1b}[2J\\u{202e}q=1");
        assert!(!info.describe().contains('\u{1b}'), "{}", info.describe());
        let long = format!(r#"{{"qpn":1,"psn":2,"gid":"::1","params":"{}"}}"#, "a".repeat(5000));
        assert_eq!(serde_json::from_str::<QpInfo>(&long).unwrap().params.len(), 1024);
    }
}
