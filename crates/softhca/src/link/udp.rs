//! The UDP link: RoCEv2 over real sockets, one engine thread per device (issue 5).
//!
//! A [`UdpDevice`] is one RoCEv2 port bound to one IP address on UDP 4791; its GID 0 is the
//! IPv4-mapped form of that address. The address is [`UdpConfig::addr`], else `SOFTHCA_ADDR`,
//! else the first of 127.0.0.1 … 127.0.0.254 whose port 4791 is free, so several processes on
//! one machine just work.
//!
//! # The engine
//!
//! A thread per device drives the sans-IO core ([`Context::receive`], [`Context::transmit`],
//! [`Context::poll_timeout`], [`Context::handle_timeout`]) with a monotonic clock in
//! nanoseconds since the device opened. Each turn: receive a batch (`recvmmsg`, with UDP GRO
//! where the kernel has it), feed every datagram; run expired timers; drain `transmit` into a
//! batch and send it (`sendmmsg`, runs of equal-size datagrams of one flow as one UDP GSO
//! message); then, if nothing happened, wait in `ppoll` for the socket, the doorbell (an
//! eventfd the verbs layer rings after every post or modify, see [`Context::set_doorbell`]) or
//! the next deadline. The doorbell only makes a syscall when the engine is about to sleep or
//! asleep (a Dekker-style flag pair). In busy-poll mode the engine never sleeps.
//!
//! # Sending
//!
//! The core emits whole IP datagrams; the kernel writes the IP and UDP headers, so the link
//! sends the BTH … ICRC part as the payload. The ICRC covers header fields the kernel chooses,
//! so the link makes the kernel write exactly the header the core sealed, or re-seals the ICRC
//! for the header the kernel will write:
//! - sockets use `IP_MTU_DISCOVER = IP_PMTUDISC_DO`, so IPv4 goes out with DF. An unconnected
//!   socket sends Identification 0 (measured on this kernel with tshark, see the tests), which
//!   is what [`crate::wire::Ipv4Repr::new`] puts in the core's header. TTL, TOS and the UDP
//!   checksum are masked by the ICRC;
//! - the UDP source port is the one the core put in the header ([`crate::wire::roce::UdpRepr::for_qp`],
//!   one flow per QP): the link keeps a small cache of sockets bound to (address, port),
//!   created on first use. If such a socket cannot be had (port taken, or more than
//!   [`MAX_PORT_SOCKETS`] flows), the datagram goes out from port 4791 and the link re-seals its
//!   ICRC for that port (receivers accept any source port, PKT-ROCE-6);
//! - an RC or UC flow has one peer, so its socket is *connected* to it ([`UdpConfig::connected`],
//!   on by default): a send then skips the kernel's route lookup, about 0.4 µs of the 2.6 µs a
//!   small datagram costs on loopback. A connected IPv4 socket numbers its datagrams from a
//!   per-socket counter that `connect` starts at random; the link learns it once per flow with
//!   two probe datagrams to a drop-everything socket of its own (a software transmit timestamp
//!   returns a copy of each probe with its IP header; the two must be consecutive) and then
//!   stamps message i of a `sendmmsg` with counter + i. If the copy is withheld
//!   (`net.core.tstamp_allow_data = 0` without CAP_NET_RAW) or a send fails in a way that may
//!   have used an Identification, the socket is disconnected and the flow sends with
//!   Identification 0 from then on. UD and RD flows stay unconnected: their many peers would
//!   each see a sample of one counter. IPv6 has no such field;
//! - a GSO run is segmented by the kernel (or the NIC), which numbers the IPv4 Identification
//!   of the segments from the message's own: 0, 1, 2 … unconnected, counter + k connected (the
//!   counter itself moves by one per message); the link re-seals segment k's ICRC for its
//!   Identification (cheaply: the ICRC is affine in those bits, see [`verify`]).
//!
//! The pcap records each datagram as it leaves, Identification and ICRC included. A receiver
//! that verifies IPv4 ICRCs without the real header under [`IcrcPolicy::Exact`] cannot follow
//! a connected flow's random start: its peers should send with `connected(false)`.
//!
//! # Receiving and the ICRC
//!
//! Two receive modes ([`RxMode`]):
//! - [`RxMode::Socket`] (default, no privilege): the 4791 socket gives the payload and the
//!   source address. The link rebuilds the IP + UDP header and verifies the ICRC over it: exact
//!   for IPv6; for IPv4 the Identification and DF are unknown and are found by hypotheses
//!   (0, the GRO segment index, and what the source sent last, see `hints`) or, under [`IcrcPolicy::Solve`], solved
//!   for by linear algebra over GF(2) — the trade-off is explained in [`verify`].
//! - [`RxMode::Raw`] (CAP_NET_RAW, e.g. root in CI): a raw IPv4 socket bound to the address
//!   with a BPF filter for port 4791 sees the real IP header, so every ICRC is checked exactly
//!   against the header that was on the wire; the 4791 socket stays bound (so the port is
//!   ours and no ICMP unreachables go out) with a drop-everything filter. IPv6 does not need
//!   it. GSO superpackets on loopback reach a raw socket unsegmented; the link segments them
//!   itself by finding the segment size at which the first segment's ICRC verifies.
//!   [`RxMode::Auto`] uses raw when permitted.
//!
//! Malformed or hostile datagrams are dropped and counted in [`UdpCounters`], never trusted;
//! the core then validates the transport headers (PKT-VAL-*).

mod hints;
pub mod sys;
pub mod verify;

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, BufWriter};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::link::pcap::PcapTap;
use crate::transport::MAX_DATAGRAM;
use crate::verbs::{Context, DeviceConfig, Gid};
use crate::wire::packet::{BTH_LEN, ICRC_LEN};
use crate::wire::roce::{Ipv4Header, Ipv6Header, UdpHeader, IPV4_DONT_FRAGMENT, IPV4_HEADER_LEN};
use crate::wire::roce::{ROCE_V2_PORT, UDP_HEADER_LEN};
use crate::wire::Opcode;

pub use verify::{IcrcPolicy, Refused, Verified};

/// At most this many per-flow send sockets are kept (see the module docs).
pub const MAX_PORT_SOCKETS: usize = 1024;
/// Datagrams per `recvmmsg` / transmit batch.
const BATCH: usize = 64;
/// Receive buffer size: a whole GRO superpacket.
const RX_CAP: usize = 65536;
/// Most segments in one GSO message (the kernel's limit is 64 on older kernels).
const GSO_MAX_SEGS: usize = 64;
/// Most bytes in one GSO message (IPv4 UDP payload limit, with margin).
const GSO_MAX_BYTES: usize = 65000;

/// How the link receives (see the module docs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum RxMode {
    /// A raw socket where permitted, else the UDP socket.
    Auto,
    /// The UDP socket: no privilege, IPv4 ICRC verified per [`IcrcPolicy`].
    #[default]
    Socket,
    /// A raw IPv4 socket (needs CAP_NET_RAW); open fails without it.
    Raw,
}

/// How to open a [`UdpDevice`].
#[derive(Debug, Clone)]
pub struct UdpConfig {
    /// The address to bind; `None`: `SOFTHCA_ADDR`, else the first free 127.0.0.x.
    pub addr: Option<IpAddr>,
    /// Device name (`softhca_udp0` …).
    pub name: String,
    /// Spin instead of sleeping: lowest latency, one core busy.
    pub busy_poll: bool,
    /// Record every datagram sent and received (after verification) here.
    pub pcap: Option<PathBuf>,
    pub rx_mode: RxMode,
    pub icrc_policy: IcrcPolicy,
    /// Use UDP GSO on send where the kernel offers it.
    pub gso: bool,
    /// Use UDP GRO on receive where the kernel offers it.
    pub gro: bool,
    /// Send each flow through a socket connected to its peer, with the IPv4 Identification
    /// learned and followed (see "Sending" in the module docs); off: every socket stays
    /// unconnected and IPv4 goes out with Identification 0.
    pub connected: bool,
}

impl Default for UdpConfig {
    fn default() -> Self {
        UdpConfig {
            addr: None,
            name: "softhca_udp".into(),
            busy_poll: false,
            pcap: None,
            rx_mode: RxMode::Socket,
            icrc_policy: IcrcPolicy::Solve,
            gso: true,
            gro: true,
            connected: true,
        }
    }
}

impl UdpConfig {
    pub fn addr(mut self, addr: impl Into<IpAddr>) -> Self {
        self.addr = Some(addr.into());
        self
    }
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }
    pub fn busy_poll(mut self, on: bool) -> Self {
        self.busy_poll = on;
        self
    }
    pub fn pcap(mut self, path: impl Into<PathBuf>) -> Self {
        self.pcap = Some(path.into());
        self
    }
    pub fn rx_mode(mut self, mode: RxMode) -> Self {
        self.rx_mode = mode;
        self
    }
    pub fn icrc_policy(mut self, policy: IcrcPolicy) -> Self {
        self.icrc_policy = policy;
        self
    }
    pub fn gso(mut self, on: bool) -> Self {
        self.gso = on;
        self
    }
    pub fn gro(mut self, on: bool) -> Self {
        self.gro = on;
        self
    }

    pub fn connected(mut self, on: bool) -> Self {
        self.connected = on;
        self
    }
}

macro_rules! counters {
    ($($(#[$m:meta])* $name:ident,)*) => {
        /// Link counters (DESIGN rule 7); the device's own are in [`Context::counters`].
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        pub struct UdpCounters { $($(#[$m])* pub $name: u64,)* }

        #[derive(Debug, Default)]
        struct Stats { $($name: AtomicU64,)* }

        impl Stats {
            fn snapshot(&self) -> UdpCounters {
                UdpCounters { $($name: self.$name.load(Ordering::Relaxed),)* }
            }
        }
    };
}

counters! {
    /// Datagrams handed to the device (after GRO splitting and verification).
    rx_datagrams,
    rx_bytes,
    /// `recvmmsg` calls that returned data.
    rx_syscalls,
    /// Receive buffers holding more than one datagram (GRO).
    rx_gro_buffers,
    /// ICRC checks by how they passed: exactly (IPv6 or raw), by an IPv4 hypothesis, solved.
    rx_icrc_exact,
    rx_icrc_hypothesis,
    rx_icrc_solved,
    /// Drops: no BTH+ICRC, wrong length, truncated, unknown address family, bad ICRC.
    drop_malformed,
    drop_truncated,
    drop_family,
    drop_bad_icrc,
    /// Datagrams not addressed to this device (raw mode) or not to port 4791.
    drop_not_ours,
    tx_datagrams,
    tx_bytes,
    /// `sendmmsg` calls.
    tx_syscalls,
    /// Messages sent as one GSO run, and the datagrams in them.
    tx_gso_messages,
    tx_gso_segments,
    /// Datagrams sent from port 4791 because the flow's port could not be bound.
    tx_port_fallback,
    /// Flows sending through a connected socket, and flows left unconnected because the
    /// Identification could not be learned or stopped matching (see the module docs).
    tx_connected_flows,
    tx_unconnected_flows,
    /// Datagrams the kernel refused (counted, then dropped; RC retransmits).
    tx_errors,
    /// Times the engine slept in ppoll, and doorbell syscalls.
    sleeps,
    doorbells,
}

/// Flags shared by the engine thread, the doorbell and inline callers.
#[derive(Debug, Default)]
struct Shared {
    stop: AtomicBool,
    /// The engine thread is (about to be) asleep in `ppoll`.
    sleeping: AtomicBool,
    /// Until when it sleeps (ns since the epoch); 0 while it is still deciding.
    sleep_until: AtomicU64,
    /// Doorbells rung (posts, Modify QP).
    rings: AtomicU64,
    /// When an application thread last ran a whole engine turn inline (busy-poll), ns since
    /// the epoch; 0: never.
    last_inline: AtomicU64,
    /// The doorbell count the last transmit flush covered. With `owed`, only a hint for the
    /// napping engine thread (a stale value costs it one needless flush), so both are written
    /// Relaxed on the poller's hot path.
    rings_flushed: AtomicU64,
    /// An inline turn took packets in after its flush: what they produced (ACKs) waits for
    /// the next turn.
    owed: AtomicBool,
}

/// What the engine thread, the doorbell and the progress hook share. The engine's state is
/// behind a mutex that inline callers only ever `try_lock`, so a poller never waits for
/// another thread's turn; work rung in meanwhile is picked up by whoever holds it (see
/// [`Link::drive_inline`]).
struct Link {
    ctx: Context,
    busy: bool,
    epoch: Instant,
    shared: Shared,
    stats: Arc<Stats>,
    efd: OwnedFd,
    /// The fd the engine receives on (the 4791 socket or the raw socket, owned by the engine).
    rx_fd: RawFd,
    engine: Mutex<Engine>,
}

/// A RoCEv2 device on a real UDP socket, with its engine. Dropping it stops and joins the
/// engine thread; the [`Context`] (and clones of it) stays usable but no longer moves packets.
pub struct UdpDevice {
    ctx: Context,
    addr: IpAddr,
    gid: Gid,
    link: Arc<Link>,
    thread: Option<JoinHandle<()>>,
    raw: bool,
    gso: bool,
    gro: bool,
}

impl std::fmt::Debug for UdpDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UdpDevice").field("name", &self.ctx.name()).field("addr", &self.addr).finish()
    }
}

/// Opens a device with the default configuration.
pub fn open_default() -> io::Result<UdpDevice> {
    UdpDevice::open(UdpConfig::default())
}

fn bind_4791(addr: IpAddr) -> io::Result<UdpSocket> {
    UdpSocket::bind(SocketAddr::new(addr, ROCE_V2_PORT))
}

/// Binds the configured address, `SOFTHCA_ADDR`, or the first free 127.0.0.x.
fn bind_device_socket(cfg: &UdpConfig) -> io::Result<UdpSocket> {
    let from_env = std::env::var("SOFTHCA_ADDR").ok();
    let chosen = match (cfg.addr, from_env) {
        (Some(a), _) => Some(a),
        (None, Some(s)) => Some(s.trim().parse::<IpAddr>().map_err(|e| {
            io::Error::new(io::ErrorKind::InvalidInput, format!("SOFTHCA_ADDR={s:?} is not an IP address: {e}"))
        })?),
        (None, None) => None,
    };
    if let Some(a) = chosen {
        return bind_4791(a);
    }
    for last in 1..=254u8 {
        match bind_4791(IpAddr::V4(Ipv4Addr::new(127, 0, 0, last))) {
            Ok(s) => return Ok(s),
            Err(e) if e.kind() == io::ErrorKind::AddrInUse => continue,
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::new(io::ErrorKind::AddrInUse, "UDP port 4791 is taken on every address 127.0.0.1-127.0.0.254"))
}

fn prepare_send_socket(s: &UdpSocket, addr: IpAddr) -> io::Result<()> {
    let fd = s.as_raw_fd();
    match addr {
        IpAddr::V4(_) => sys::setsockopt_int(fd, libc::IPPROTO_IP, libc::IP_MTU_DISCOVER, libc::IP_PMTUDISC_DO)?,
        IpAddr::V6(_) => sys::setsockopt_int(fd, libc::IPPROTO_IPV6, libc::IPV6_MTU_DISCOVER, libc::IPV6_PMTUDISC_DO)?,
    }
    s.set_nonblocking(true)
}

impl UdpDevice {
    /// Binds the address, creates the device (GID 0 = the address) and starts its engine.
    pub fn open(cfg: UdpConfig) -> io::Result<UdpDevice> {
        let sock = bind_device_socket(&cfg)?;
        let addr = sock.local_addr()?.ip();
        prepare_send_socket(&sock, addr)?;
        let fd = sock.as_raw_fd();
        let _ = sys::setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, 8 << 20);
        let _ = sys::setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_SNDBUF, 8 << 20);
        let gro = cfg.gro && sys::setsockopt_int(fd, sys::SOL_UDP, sys::UDP_GRO, 1).is_ok();
        let gso = cfg.gso && gso_available(addr);
        let raw = match (cfg.rx_mode, addr) {
            (RxMode::Socket, _) | (_, IpAddr::V6(_)) => None,
            (mode, IpAddr::V4(v4)) => match sys::raw_udp_v4(v4, ROCE_V2_PORT) {
                Ok(r) => Some(r),
                Err(e) if mode == RxMode::Raw => return Err(e),
                Err(_) => None,
            },
        };
        if raw.is_some() {
            sys::drop_all(fd)?;
        }
        let gid = Gid::from_ipv6(verify::gid_addr(addr));
        let mut dcfg = DeviceConfig::default().name(cfg.name.clone()).gid0(gid);
        if let Some(mtu) = sys::interface_mtu(addr) {
            dcfg.port.active_mtu = active_mtu(mtu, addr.is_ipv6());
        }
        let ctx = Context::create(dcfg).map_err(|e| io::Error::other(e.to_string()))?;
        let pcap = match &cfg.pcap {
            Some(p) => Some(PcapTap::new(BufWriter::new(File::create(p)?))?),
            None => None,
        };
        let efd = sys::eventfd()?;
        let stats = Arc::new(Stats::default());
        let raw_on = raw.is_some();
        let rx_fd = raw.as_ref().map_or(sock.as_raw_fd(), |r| r.as_raw_fd());
        let epoch = Instant::now();
        let rx_batch = if raw.is_some() { BATCH / 2 } else { BATCH };
        let io = Io {
            ctx: ctx.clone(),
            addr,
            sock,
            raw,
            ports: HashMap::new(),
            connect: cfg.connected,
            sink: None,
            stats: stats.clone(),
            policy: cfg.icrc_policy,
            gso,
            pcap,
            epoch,
            hints: hints::IdHints::default(),
            shifts: verify::Shifts::default(),
            clock: 0,
            rx_idle: false,
            tx_backlog: false,
        };
        let engine = Engine {
            io,
            rx: sys::RxBatch::new(rx_batch, RX_CAP, verify::MAX_IP_UDP),
            msgs: Vec::with_capacity(rx_batch),
            tx: TxBufs {
                buf: vec![0u8; BATCH * MAX_DATAGRAM],
                pending: Vec::with_capacity(BATCH),
                send: SendScratch::default(),
            },
            resume: None,
        };
        let link = Arc::new(Link {
            ctx: ctx.clone(),
            busy: cfg.busy_poll,
            epoch,
            shared: Shared::default(),
            stats: stats.clone(),
            efd,
            rx_fd,
            engine: Mutex::new(engine),
        });
        // The hooks hold the link weakly: the context must not keep its own driver alive.
        let weak = Arc::downgrade(&link);
        ctx.set_doorbell(move || {
            if let Some(l) = weak.upgrade() {
                l.ring();
            }
        });
        if cfg.busy_poll {
            let weak = Arc::downgrade(&link);
            ctx.set_progress(Some(Arc::new(move || {
                // Work the poller's turn left (the rest of a batch, more to send) must not
                // wait for the engine thread's idle wake if the poller stops here.
                if let Some(l) = weak.upgrade() {
                    if l.drive_inline(true) {
                        l.wake_for_leftovers();
                    }
                }
            })));
        }
        let bg = link.clone();
        let thread = std::thread::Builder::new().name(format!("{}-engine", cfg.name)).spawn(move || bg.background());
        let thread = match thread {
            Ok(t) => t,
            Err(e) => {
                ctx.set_progress(None);
                ctx.clear_doorbell();
                return Err(e);
            }
        };
        Ok(UdpDevice { ctx, addr, gid, link, thread: Some(thread), raw: raw_on, gso, gro })
    }

    /// The verbs device this link drives.
    pub fn context(&self) -> &Context {
        &self.ctx
    }
    /// The bound IP address (UDP port 4791).
    pub fn addr(&self) -> IpAddr {
        self.addr
    }
    /// GID 0: the IPv4-mapped form of the address, or the IPv6 address.
    pub fn gid(&self) -> Gid {
        self.gid
    }
    pub fn counters(&self) -> UdpCounters {
        self.link.stats.snapshot()
    }
    /// Whether the device busy-polls: the application's CQ polls and posts run the engine on
    /// their own thread, and the engine thread only stands in while nobody polls.
    pub fn busy_poll(&self) -> bool {
        self.link.busy
    }
    /// Whether the raw (exact IPv4 ICRC) receive path is in use.
    pub fn raw_rx(&self) -> bool {
        self.raw
    }
    /// Whether UDP GSO / GRO are in use.
    pub fn offloads(&self) -> (bool, bool) {
        (self.gso, self.gro)
    }
}

impl Drop for UdpDevice {
    fn drop(&mut self) {
        // What the device owes its peers (ACKs of what was completed, those of destroyed QPs)
        // leaves before it closes; handlers that fires run after the engine is let go.
        crate::verbs::callbacks::scope(|| self.link.drive_inline(false));
        self.ctx.set_progress(None);
        self.ctx.clear_doorbell();
        self.link.shared.stop.store(true, Ordering::SeqCst);
        sys::eventfd_signal(self.link.efd.as_raw_fd());
        if let Some(t) = self.thread.take() {
            // Dropped on the engine thread itself (from a handler it ran): it sees `stop` and
            // ends on its own; joining itself would deadlock.
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
    }
}

/// The largest IBA MTU whose packets fit the interface's MTU (`iface`, bytes of IP datagram)
/// with the headers around them: IP, UDP, BTH, the longest extended header a payload-carrying
/// packet adds (RETH + ImmDt), ICRC. The port reports it as its active MTU, which bounds a
/// QP's path MTU, so that DF datagrams are never too big for the link.
fn active_mtu(iface: u32, ipv6: bool) -> crate::verbs::Mtu {
    use crate::verbs::Mtu;
    let overhead = if ipv6 { 40 } else { 20 } + UDP_HEADER_LEN as u32 + BTH_LEN as u32 + 16 + 4 + ICRC_LEN as u32;
    let room = iface.saturating_sub(overhead);
    [Mtu::Mtu4096, Mtu::Mtu2048, Mtu::Mtu1024, Mtu::Mtu512]
        .into_iter()
        .find(|m| m.bytes() <= room)
        .unwrap_or(Mtu::Mtu256)
}

/// Whether the kernel accepts UDP_SEGMENT for this family.
fn gso_available(addr: IpAddr) -> bool {
    let any = SocketAddr::new(if addr.is_ipv4() { Ipv4Addr::UNSPECIFIED.into() } else { IpAddr::V6(0.into()) }, 0);
    UdpSocket::bind(any).is_ok_and(|s| sys::setsockopt_int(s.as_raw_fd(), sys::SOL_UDP, sys::UDP_SEGMENT, 1400).is_ok())
}

/// A transmitted datagram waiting in the batch: where its UDP payload is in its slot.
#[derive(Clone, Copy)]
struct Pending {
    slot: usize,
    start: usize,
    end: usize,
    dst: IpAddr,
    port: u16,
    /// An RC/RD response (ACK, RDMA Read response, Atomic ACK), not a request.
    response: bool,
    /// RC or UC: its flow has one peer.
    one_peer: bool,
}

/// A flow's send socket, bound to (the device's address, the flow's source port).
struct FlowSocket {
    sock: UdpSocket,
    /// Whom it is connected to, if it is.
    conn: Option<Conn>,
    /// Connecting was tried (once per flow).
    tried: bool,
}

/// A flow socket's association: its peer (port 4791) and, for IPv4, the Identification the
/// kernel gives the socket's next datagram.
#[derive(Debug, Clone, Copy)]
struct Conn {
    peer: IpAddr,
    next_id: u16,
}

/// How long a probe waits for its transmit timestamp (it comes back within the `sendto` on
/// loopback, where probes go).
const PROBE_PATIENCE: Duration = Duration::from_millis(5);

/// The engine's sockets and per-datagram state.
struct Io {
    ctx: Context,
    addr: IpAddr,
    sock: UdpSocket,
    raw: Option<OwnedFd>,
    /// Per-flow send sockets by source port; `None`: the port could not be bound.
    ports: HashMap<u16, Option<FlowSocket>>,
    /// Connect flow sockets ([`UdpConfig::connected`]).
    connect: bool,
    /// Where Identification probes go: a socket on this address that drops everything
    /// (opened on first use; `Some(None)`: it could not be).
    sink: Option<Option<UdpSocket>>,
    stats: Arc<Stats>,
    policy: IcrcPolicy,
    gso: bool,
    pcap: Option<PcapTap<BufWriter<File>>>,
    epoch: Instant,
    /// What each source sent last: the IPv4 Identification hypotheses.
    hints: hints::IdHints,
    /// Cached ICRC shift constants (see [`verify::Shifts`]).
    shifts: verify::Shifts,
    /// `now` for the datagrams being handled (read once per receive batch or transmit batch).
    clock: u64,
    /// The last receive found at most one datagram where it could have taken more (the next
    /// asks for a single message).
    rx_idle: bool,
    /// The last flush stopped at its batch limit with more to send.
    tx_backlog: bool,
}

/// The transmit batch: [`BATCH`] datagram slots and what is pending in them.
struct TxBufs {
    buf: Vec<u8>,
    pending: Vec<Pending>,
    send: SendScratch,
}

/// Reused between sends: the datagrams' byte ranges in the batch, the messages, and the
/// C-side arrays.
#[derive(Default)]
struct SendScratch {
    segs: Vec<std::ops::Range<usize>>,
    msgs: Vec<sys::TxMsg>,
    sys: sys::TxScratch,
}

/// Everything one engine turn needs, behind [`Link::engine`].
struct Engine {
    io: Io,
    rx: sys::RxBatch,
    msgs: Vec<sys::RxMsg>,
    tx: TxBufs,
    /// Where delivery of the received batch resumes (message, byte offset in it), when an
    /// inline turn left its tail for the next turn.
    resume: Option<(usize, usize)>,
}

/// Adds to a counter that only the engine's lock holder writes: a plain load and store (no
/// locked read-modify-write on the hot path); readers see a recent value.
fn bump(c: &AtomicU64, n: u64) {
    c.store(c.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
}

/// Adds to a counter written outside the engine's lock (doorbells, sleeps).
fn bump_shared(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

/// While an application thread ran a turn inline within this long, the busy-poll engine
/// thread naps instead of competing with it for the socket and the core.
const INLINE_GRACE: Duration = Duration::from_millis(10);
/// A doorbell leaves its transmit work to the poller if it polled this recently (busy-poll).
const DOORBELL_DEFER: Duration = Duration::from_micros(50);
/// While a poller drives the engine, the engine thread looks this often for a doorbell left
/// to a poller that has stopped since.
const DEFERRED_CHECK: Duration = Duration::from_millis(1);
/// How long a datagram waits for room in a full socket send buffer before it is dropped (and
/// counted; RC retransmits it), so that the engine's lock is not held for longer.
const SEND_PATIENCE: Duration = Duration::from_millis(50);
/// The engine thread wakes at least this often even with no deadline, so that a deadline an
/// inline transmit sets later than this needs no wake-up call.
const IDLE_WAKE: Duration = Duration::from_millis(50);
/// While receiving, flush the transmit side (ACKs, responses, newly opened windows) after
/// this many datagrams, so that a peer's window does not wait for a whole receive batch.
const FLUSH_EVERY: usize = 16;
/// A transmit batch with at most this many requests sends them before its responses.
const REQUESTS_FIRST: usize = 4;
/// At most this many transmit batches per flush, so that receiving keeps its turn.
const TX_ROUNDS: usize = 4;

impl Link {
    fn now(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    fn lock_engine(&self) -> MutexGuard<'_, Engine> {
        self.engine.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn try_engine(&self) -> Option<MutexGuard<'_, Engine>> {
        match self.engine.try_lock() {
            Ok(g) => Some(g),
            Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        }
    }

    /// Runs the engine on the calling thread unless another thread is running it: a whole
    /// turn (`full`: the progress hook, busy-poll) or the transmit side only (the doorbell).
    /// A doorbell rung while another thread held the engine is honoured by that thread when it
    /// lets go: it rechecks the ring count after unlocking (the ringer counts before trying).
    /// Returns whether it left work behind (more to transmit than one flush sends, or the rest
    /// of a receive batch), which a sleeping engine thread must be woken for.
    fn drive_inline(&self, mut full: bool) -> bool {
        loop {
            let seen = self.shared.rings.load(Ordering::SeqCst);
            let left = {
                let Some(mut e) = self.try_engine() else { return false };
                let now = self.now();
                if full {
                    self.shared.last_inline.store(now.max(1), Ordering::Relaxed);
                    let worked = e.turn(true, now);
                    self.shared.owed.store(worked, Ordering::Relaxed);
                } else {
                    e.flush_tx(now);
                    self.shared.owed.store(false, Ordering::Relaxed);
                }
                self.shared.rings_flushed.store(seen, Ordering::Relaxed);
                e.resume.is_some() || e.io.tx_backlog
            };
            if self.shared.rings.load(Ordering::SeqCst) == seen {
                return left;
            }
            full = false;
        }
    }

    /// Wakes the engine thread if it sleeps, for work an application thread left it.
    fn wake_for_leftovers(&self) {
        if self.shared.sleeping.load(Ordering::SeqCst) {
            bump_shared(&self.stats.doorbells, 1);
            sys::eventfd_signal(self.efd.as_raw_fd());
        }
    }

    /// The doorbell: transmit inline, then wake the engine thread only if it sleeps past a
    /// deadline that the new work set.
    fn ring(&self) {
        self.shared.rings.fetch_add(1, Ordering::SeqCst);
        if self.poller_spinning() {
            // The poller's next turn starts by transmitting: leave the work to it, so that
            // several posts (and a pending ACK) go out in one batch.
            return;
        }
        if self.drive_inline(false) {
            self.wake_for_leftovers(); // more than one flush sends: the engine thread goes on
            return;
        }
        if self.shared.sleeping.load(Ordering::SeqCst) {
            let until = self.shared.sleep_until.load(Ordering::SeqCst);
            if until == 0 || self.ctx.poll_timeout().is_some_and(|t| t < until) {
                bump_shared(&self.stats.doorbells, 1);
                sys::eventfd_signal(self.efd.as_raw_fd());
            }
        }
    }

    /// Whether a poller ran a turn within [`DOORBELL_DEFER`] (it is spinning on its CQ).
    fn poller_spinning(&self) -> bool {
        let last = self.shared.last_inline.load(Ordering::Relaxed);
        self.busy && last != 0 && self.now().saturating_sub(last) < DOORBELL_DEFER.as_nanos() as u64
    }

    /// Whether an application thread is driving the engine inline (busy-poll).
    fn inline_active(&self, now: u64) -> Option<Duration> {
        let last = self.shared.last_inline.load(Ordering::Relaxed);
        let idle = Duration::from_nanos(now.saturating_sub(last));
        (self.busy && last != 0 && idle < INLINE_GRACE).then(|| INLINE_GRACE - idle)
    }

    /// The engine thread. In blocking mode it runs every turn and sleeps in `ppoll` (socket,
    /// doorbell eventfd, next deadline) when idle. In busy-poll mode it does the same only
    /// while no application thread polls; while one does, it naps and leaves the socket, the
    /// timers and the core to the poller.
    fn background(self: Arc<Self>) {
        while !self.shared.stop.load(Ordering::Acquire) {
            if let Some(nap) = self.inline_active(self.now()) {
                // A doorbell left to a poller that stopped polling right after it (the
                // application posted its last request and went to sleep), or ACKs its last
                // turn left for the next, are flushed here.
                let deferred = self.shared.rings.load(Ordering::SeqCst)
                    != self.shared.rings_flushed.load(Ordering::Relaxed)
                    || self.shared.owed.load(Ordering::Relaxed);
                if deferred && !self.poller_spinning() && self.drive_inline(false) {
                    continue;
                }
                std::thread::sleep(nap.min(DEFERRED_CHECK).max(Duration::from_micros(200)));
                continue;
            }
            let seen = self.shared.rings.load(Ordering::SeqCst);
            let worked = if self.busy {
                match self.try_engine() {
                    Some(mut e) => e.turn(false, self.now()),
                    None => {
                        std::thread::yield_now();
                        continue;
                    }
                }
            } else {
                self.lock_engine().turn(false, self.now())
            };
            self.shared.rings_flushed.store(seen, Ordering::Relaxed);
            if worked {
                continue;
            }
            // Sleep until the socket, the doorbell or the next deadline (Dekker-style with
            // `ring`: flag first, then recheck the ring count).
            self.shared.sleep_until.store(0, Ordering::SeqCst);
            self.shared.sleeping.store(true, Ordering::SeqCst);
            if self.shared.rings.load(Ordering::SeqCst) != seen || self.shared.stop.load(Ordering::SeqCst) {
                self.shared.sleeping.store(false, Ordering::SeqCst);
                continue;
            }
            let now = self.now();
            let until = self.ctx.poll_timeout().unwrap_or(u64::MAX).min(now + IDLE_WAKE.as_nanos() as u64).max(1);
            self.shared.sleep_until.store(until, Ordering::SeqCst);
            let mut fds = [
                libc::pollfd { fd: self.rx_fd, events: libc::POLLIN, revents: 0 },
                libc::pollfd { fd: self.efd.as_raw_fd(), events: libc::POLLIN, revents: 0 },
            ];
            bump_shared(&self.stats.sleeps, 1);
            if let Err(e) = sys::ppoll(&mut fds, Some(Duration::from_nanos(until.saturating_sub(now)))) {
                tracing::warn!(error = %e, "ppoll failed");
            }
            self.shared.sleeping.store(false, Ordering::SeqCst);
            if fds[1].revents != 0 {
                sys::eventfd_drain(self.efd.as_raw_fd());
            }
        }
        if let Some(p) = self.lock_engine().io.pcap.as_mut() {
            let _ = p.flush();
        }
    }
}

impl Engine {
    /// One turn. On the engine thread: receive a batch (flushing the transmit side every
    /// [`FLUSH_EVERY`] datagrams), run expired timers, transmit. Inline (a poller's turn):
    /// transmit first, then receive and run timers, and leave what they produced (ACKs,
    /// responses, retransmissions) for the next poll or post, so that an ACK and the reply
    /// the application posts on seeing its completion leave in one `sendmmsg`; ACKs received
    /// behind a request wait for the next turn too (see [`Io::deliver_batch`]). Returns
    /// whether anything happened.
    fn turn(&mut self, inline: bool, mut now: u64) -> bool {
        let Engine { io, rx, msgs, tx, resume } = self;
        let mut worked = inline && io.flush_tx(tx, now);
        if let Some(at) = resume.take() {
            // The rest of the last batch, held back by an inline turn (see `deliver_batch`).
            worked = true;
            io.clock = if inline { now } else { io.now() };
            *resume = io.deliver_batch(rx, msgs, tx, at, inline);
            now = io.clock;
        } else {
            let rx_fd = io.raw.as_ref().map_or(io.sock.as_raw_fd(), |r| r.as_raw_fd());
            // After a receive that found nothing or a lone datagram, ask for one message: a
            // lone datagram (or a GRO buffer) is the common case then, and a larger vlen costs
            // a second, failing dequeue in the kernel (≈ 0.3 µs) before the data reaches the
            // device. A single message received, or several, restores the batch.
            let max = if io.rx_idle { 1 } else { BATCH };
            let got = rx.recv(rx_fd, msgs, max);
            io.rx_idle = !matches!(got, Ok(n) if n >= 2 || n == max);
            match got {
                Ok(n) if n > 0 => {
                    worked = true;
                    bump(&io.stats.rx_syscalls, 1);
                    io.clock = if inline { now } else { io.now() };
                    *resume = io.deliver_batch(rx, msgs, tx, (0, 0), inline);
                    now = io.clock;
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "recvmmsg failed"),
            }
        }
        if io.ctx.poll_timeout().is_some_and(|t| t <= now) {
            io.ctx.handle_timeout(now);
        }
        if inline {
            worked
        } else {
            io.flush_tx(tx, now) || worked
        }
    }

    fn flush_tx(&mut self, now: u64) -> bool {
        self.io.flush_tx(&mut self.tx, now)
    }
}

/// The datagram size of a received message (its GRO segment size, or its length).
fn gro_segment(m: &sys::RxMsg) -> usize {
    m.gro_size.filter(|&g| g > 0 && g < m.len).unwrap_or(m.len.max(1))
}

/// Whether a BTH opcode is a response (ACK, RDMA Read response, Atomic ACK: only RC and RD
/// have them), by the opcode table.
fn is_response(op: u8) -> bool {
    Opcode::from(op).info().is_some_and(|i| !i.is_request())
}

/// Whether every datagram of a received (socket-mode) message from byte `start` on is a
/// response; false for anything that is not plainly one.
fn only_responses(buf: &[u8], m: &sys::RxMsg, start: usize) -> bool {
    if m.truncated || m.from.is_none() {
        return false;
    }
    let seg = gro_segment(m);
    (start..m.len).step_by(seg).all(|off| buf.get(verify::MAX_IP_UDP + off).is_some_and(|&op| is_response(op)))
}

impl Io {
    fn now(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    /// Drains the device's transmit queue into batches and sends them (at most
    /// [`TX_ROUNDS`] batches). Returns whether anything was sent.
    fn flush_tx(&mut self, tx: &mut TxBufs, mut now: u64) -> bool {
        let mut any = false;
        // Set again below if every round is full: then more may be waiting.
        self.tx_backlog = false;
        for round in 0..TX_ROUNDS {
            if round > 0 {
                now = self.now();
            }
            self.clock = now;
            tx.pending.clear();
            let mut emitted = 0;
            for slot in 0..BATCH {
                let buf = &mut tx.buf[slot * MAX_DATAGRAM..(slot + 1) * MAX_DATAGRAM];
                let Some(len) = self.ctx.transmit(now, buf) else { break };
                emitted += 1;
                if let Some(p) = self.prepare(slot, &mut buf[..len]) {
                    tx.pending.push(p);
                }
            }
            if emitted == 0 {
                break;
            }
            any = true;
            // A few requests go before the responses of the same batch (in the same
            // `sendmmsg`, as datagrams of their own): when an application answers a message,
            // the peer waits for the answer, while the ACK that the transport queued first only
            // retires a Send the peer may not even wait for. (Requests and responses are
            // independent streams; each keeps its own order, and the sort is stable.)
            let requests = tx.pending.iter().filter(|p| !p.response).count();
            if requests > 0 && requests <= REQUESTS_FIRST && requests < tx.pending.len() {
                tx.pending.sort_by_key(|p| p.response);
            }
            self.send_batch(&mut tx.buf, &tx.pending, &mut tx.send);
            if emitted < BATCH {
                break;
            }
            self.tx_backlog = round + 1 == TX_ROUNDS;
        }
        any
    }

    /// Delivers the received batch `msgs` from message `at.0`, byte `at.1` of it on, flushing
    /// the transmit side every [`FLUSH_EVERY`] datagrams. In an inline turn, delivery stops
    /// after a request when only responses (ACKs) follow it in the batch, and the returned
    /// position is where the next turn resumes: the application sees the request's completion
    /// (and can answer it) without first waiting for the ACKs to be processed. Requests and
    /// responses are independent streams, and each keeps its order.
    fn deliver_batch(
        &mut self,
        rx: &mut sys::RxBatch,
        msgs: &[sys::RxMsg],
        tx: &mut TxBufs,
        at: (usize, usize),
        inline: bool,
    ) -> Option<(usize, usize)> {
        let mut since = 0;
        let mut start = at.1;
        for i in at.0..msgs.len() {
            let (n, stopped) = self.on_message(rx.buf_mut(i), &msgs[i], start, inline);
            since += n;
            if let Some(off) = stopped {
                let rest = &msgs[i + 1..];
                let later = (i + 1..msgs.len()).zip(rest).all(|(j, m)| only_responses(rx.buf_mut(j), m, 0));
                if later && only_responses(rx.buf_mut(i), &msgs[i], off) {
                    return Some((i, off));
                }
                // Something other than ACKs follows: go on delivering this message.
                let (n, _) = self.on_message(rx.buf_mut(i), &msgs[i], off, false);
                since += n;
            }
            start = 0;
            if since >= FLUSH_EVERY {
                let now = self.now();
                self.flush_tx(tx, now);
                since = 0;
            }
        }
        None
    }

    /// One received message: a datagram, or a GRO buffer of several, from byte `start` of it.
    /// Returns how many datagrams it delivered (or dropped), and with `stop_after_request`,
    /// the offset after the first request that more datagrams follow (delivery stopped there).
    fn on_message(
        &mut self,
        buf: &mut [u8],
        m: &sys::RxMsg,
        start: usize,
        stop_after_request: bool,
    ) -> (usize, Option<usize>) {
        let headroom = verify::MAX_IP_UDP;
        if m.truncated {
            bump(&self.stats.drop_truncated, 1);
            return (1, None);
        }
        let Some(from) = m.from else {
            bump(&self.stats.drop_family, 1);
            return (1, None);
        };
        if m.len == 0 {
            bump(&self.stats.drop_malformed, 1); // an empty datagram carries no packet
            return (1, None);
        }
        if self.raw.is_some() {
            return (self.on_raw(&mut buf[headroom..headroom + m.len]), None);
        }
        let seg = gro_segment(m);
        if seg < m.len && start == 0 {
            bump(&self.stats.rx_gro_buffers, 1);
        }
        let mut off = start;
        let mut index = (start / seg) as u16;
        let mut n = 0;
        while off < m.len {
            let len = seg.min(m.len - off);
            let at = headroom + off;
            let request = !is_response(buf[at]);
            self.on_payload(buf, at, len, from, index);
            off += len;
            n += 1;
            index = index.wrapping_add(1);
            if stop_after_request && request && off < m.len {
                return (n, Some(off));
            }
        }
        (n, None)
    }

    /// Verifies one UDP payload at `buf[at..at + len]` from `from`, writes the rebuilt header in
    /// front of it and hands the datagram to the device.
    fn on_payload(&mut self, buf: &mut [u8], at: usize, len: usize, from: SocketAddr, index: u16) {
        let src = verify::unmap(from.ip());
        let flow = SocketAddr::new(src, from.port());
        let payload = &buf[at..at + len];
        let hints = self.hints.for_datagram(flow, index);
        match verify::rebuild_with(&mut self.shifts, src, from.port(), self.addr, payload, &hints, self.policy) {
            Ok(h) => {
                let c = match h.how {
                    Verified::Exact => &self.stats.rx_icrc_exact,
                    Verified::Hypothesis { identification, .. } => {
                        self.hints.record(flow, identification, index, len);
                        &self.stats.rx_icrc_hypothesis
                    }
                    Verified::Solved { identification, .. } => {
                        self.hints.record(flow, identification, index, len);
                        &self.stats.rx_icrc_solved
                    }
                };
                bump(c, 1);
                let start = at - h.len;
                buf[start..at].copy_from_slice(h.header());
                self.deliver(&buf[start..at + len]);
            }
            Err(Refused::Malformed) => bump(&self.stats.drop_malformed, 1),
            Err(Refused::Family) => bump(&self.stats.drop_family, 1),
            Err(Refused::BadIcrc) => bump(&self.stats.drop_bad_icrc, 1),
        }
    }

    /// A raw-socket datagram: the real IPv4 header is present; a GSO superpacket is cut into
    /// its segments first.
    fn on_raw(&mut self, dgram: &mut [u8]) -> usize {
        const HDR: usize = 20 + UDP_HEADER_LEN;
        if dgram.len() < HDR + BTH_LEN + ICRC_LEN || dgram[0] != 0x45 {
            bump(&self.stats.drop_malformed, 1);
            return 1;
        }
        let dst = Ipv4Addr::new(dgram[16], dgram[17], dgram[18], dgram[19]);
        if IpAddr::V4(dst) != self.addr || u16::from_be_bytes([dgram[22], dgram[23]]) != ROCE_V2_PORT {
            bump(&self.stats.drop_not_ours, 1);
            return 1;
        }
        // On loopback and veth a UDP GSO message arrives here as one superpacket whose headers
        // describe the whole run (the UDP socket would have had it segmented or reported the
        // segment size); nothing in the headers tells the two apart, so a datagram is taken
        // whole only when its ICRC verifies whole. (The device checks it again: see
        // NOTES-udp.md for the receive-verified API that would avoid the second pass.)
        if crate::wire::icrc::verify_datagram(dgram).is_ok() {
            bump(&self.stats.rx_icrc_exact, 1);
            self.deliver(dgram);
            return 1;
        }
        // A superpacket: segments of one size (but the last) under copies of this header
        // with Identifications counting up. Candidate sizes are those at which a second BTH
        // with the same P_Key and destination QP follows; the one at which segment 0's ICRC
        // verifies wins.
        let body = dgram.len() - HDR;
        let id0 = Ipv4Header::new_unchecked(&dgram[..]).identification();
        let mut header = [0u8; HDR];
        header.copy_from_slice(&dgram[..HDR]);
        let first_bth = [dgram[HDR + 2], dgram[HDR + 3], dgram[HDR + 5], dgram[HDR + 6], dgram[HDR + 7]];
        let seg = (BTH_LEN + ICRC_LEN..=(body - BTH_LEN).min(MAX_DATAGRAM)).find(|&s| {
            let b = HDR + s;
            [dgram[b + 2], dgram[b + 3], dgram[b + 5], dgram[b + 6], dgram[b + 7]] == first_bth && {
                fix_v4_header(&mut header, s, id0);
                crate::wire::icrc::verify(&header, &dgram[HDR..b - ICRC_LEN], &dgram[b - ICRC_LEN..b]).is_ok()
            }
        });
        let Some(seg) = seg else {
            bump(&self.stats.drop_bad_icrc, 1);
            return 1;
        };
        bump(&self.stats.rx_gro_buffers, 1);
        let mut scratch = vec![0u8; HDR + seg];
        let mut off = 0;
        let mut k = 0u16;
        while off < body {
            let len = seg.min(body - off);
            fix_v4_header(&mut header, len, id0.wrapping_add(k));
            scratch[..HDR].copy_from_slice(&header);
            scratch[HDR..HDR + len].copy_from_slice(&dgram[HDR + off..HDR + off + len]);
            // Every segment is verified over the header it had on the wire, not only the one
            // that told the segment size.
            let piece = &scratch[..HDR + len];
            if len < BTH_LEN + ICRC_LEN {
                bump(&self.stats.drop_malformed, 1);
            } else if crate::wire::icrc::verify_datagram(piece).is_err() {
                bump(&self.stats.drop_bad_icrc, 1);
            } else {
                bump(&self.stats.rx_icrc_exact, 1);
                self.deliver(piece);
            }
            off += len;
            k = k.wrapping_add(1);
        }
        usize::from(k)
    }

    fn deliver(&mut self, dgram: &[u8]) {
        let now = self.clock;
        bump(&self.stats.rx_datagrams, 1);
        bump(&self.stats.rx_bytes, dgram.len() as u64);
        if let Some(p) = self.pcap.as_mut() {
            let (src, dst) = macs_of(dgram);
            let _ = p.write_datagram(now, src, dst, dgram);
        }
        // Every path here verified the ICRC first (on_message, on_raw).
        self.ctx.receive_icrc_checked(now, dgram);
    }

    /// Checks a datagram the core emitted and finds its UDP payload; fixes the header fields
    /// the kernel will write differently (it should never need to).
    fn prepare(&mut self, slot: usize, d: &mut [u8]) -> Option<Pending> {
        let (hl, dst) = match d.first().map(|b| b >> 4) {
            Some(4) if d.len() >= 20 => {
                let mut h = Ipv4Header::new_unchecked(&mut d[..]);
                if h.identification() != 0 || h.flags_fragment() != IPV4_DONT_FRAGMENT {
                    h.set_identification(0);
                    h.set_flags_fragment(IPV4_DONT_FRAGMENT);
                    h.fill_checksum();
                    let _ = crate::wire::icrc::fill_datagram(d);
                }
                (20, IpAddr::V4(Ipv4Header::new_unchecked(&d[..]).dst_addr()))
            }
            Some(6) if d.len() >= 40 => (40, verify::unmap(IpAddr::V6(Ipv6Header::new_unchecked(&d[..]).dst_addr()))),
            _ => {
                bump(&self.stats.tx_errors, 1);
                return None;
            }
        };
        if d.len() < hl + UDP_HEADER_LEN + BTH_LEN + ICRC_LEN {
            bump(&self.stats.tx_errors, 1);
            return None;
        }
        let port = UdpHeader::new_unchecked(&d[hl..]).src_port();
        let op = d[hl + UDP_HEADER_LEN];
        let one_peer = op >> 5 <= 1;
        Some(Pending { slot, start: hl + UDP_HEADER_LEN, end: d.len(), dst, port, response: is_response(op), one_peer })
    }

    /// The socket to send a flow's datagrams from (bound to (addr, port), created on first
    /// use; an RC or UC flow's is connected to `first.dst` on first use where configured) and
    /// its association; None if the port cannot be had.
    fn port_socket(&mut self, port: u16, first: &Pending) -> Option<(RawFd, Option<Conn>)> {
        if port == ROCE_V2_PORT {
            return Some((self.sock.as_raw_fd(), None));
        }
        if !self.ports.contains_key(&port) {
            if self.ports.len() >= MAX_PORT_SOCKETS {
                return None;
            }
            let s = UdpSocket::bind(SocketAddr::new(self.addr, port)).ok().filter(|s| {
                prepare_send_socket(s, self.addr).is_ok()
                    && sys::setsockopt_int(s.as_raw_fd(), libc::SOL_SOCKET, libc::SO_SNDBUF, 4 << 20).is_ok()
                    && sys::setsockopt_int(s.as_raw_fd(), libc::SOL_SOCKET, libc::SO_RCVBUF, 4096).is_ok()
            });
            self.ports.insert(port, s.map(|sock| FlowSocket { sock, conn: None, tried: false }));
        }
        let f = self.ports.get_mut(&port)?.as_mut()?;
        let fd = f.sock.as_raw_fd();
        // UD and RD flows talk to many peers: each peer would see a sample of the socket's
        // Identification counter, which only a solving receiver could follow. (Such a flow
        // whose port a connected flow holds goes out from 4791, see `send_batch`.) A QP
        // connected anew to another peer gets its socket connected anew.
        if !first.one_peer && f.conn.is_some() {
            return None;
        }
        let moved = f.conn.is_some_and(|c| c.peer != first.dst);
        if self.connect && first.one_peer && (!f.tried || moved) {
            f.tried = true;
            let sink = self.sink.get_or_insert_with(|| open_sink(self.addr));
            f.conn = connect_flow(fd, self.addr, first.dst, sink.as_ref());
            let c = if f.conn.is_some() { &self.stats.tx_connected_flows } else { &self.stats.tx_unconnected_flows };
            bump(c, 1);
        }
        Some((fd, f.conn))
    }

    /// Records a flow's association; None dissolves it (the socket goes on unconnected).
    fn set_conn(&mut self, port: u16, conn: Option<Conn>) {
        let Some(Some(f)) = self.ports.get_mut(&port) else { return };
        if f.conn.is_some() && conn.is_none() {
            tracing::debug!(port, "flow socket disconnected; Identification 0 from now on");
            let _ = sys::disconnect(f.sock.as_raw_fd());
            bump(&self.stats.tx_unconnected_flows, 1);
        }
        f.conn = conn;
    }

    /// Sends a transmit batch: consecutive datagrams of one flow go through one sendmmsg on
    /// that flow's socket, equal-size runs to one destination as GSO messages.
    fn send_batch(&mut self, tx: &mut [u8], pending: &[Pending], sc: &mut SendScratch) {
        let mut i = 0;
        while i < pending.len() {
            let port = pending[i].port;
            let mut j = i;
            while j < pending.len() && pending[j].port == port {
                j += 1;
            }
            let run = &pending[i..j];
            match self.port_socket(port, &run[0]) {
                Some((fd, conn)) => {
                    let after = self.send_run(fd, conn, tx, run, sc);
                    if conn.is_some() {
                        self.set_conn(port, after);
                    }
                }
                None => {
                    // Send from 4791 and re-seal the ICRC for that source port.
                    for p in run {
                        let d = &mut tx[p.slot * MAX_DATAGRAM..p.slot * MAX_DATAGRAM + p.end];
                        let hl = p.start - UDP_HEADER_LEN;
                        d[hl..hl + 2].copy_from_slice(&ROCE_V2_PORT.to_be_bytes());
                        let _ = crate::wire::icrc::fill_datagram(d);
                    }
                    bump(&self.stats.tx_port_fallback, run.len() as u64);
                    self.send_run(self.sock.as_raw_fd(), None, tx, run, sc);
                }
            }
            i = j;
        }
    }

    /// Sends one flow's run from `fd`, whose association is `conn`; returns the association
    /// after (None once it was given up).
    fn send_run(
        &mut self,
        fd: RawFd,
        mut conn: Option<Conn>,
        tx: &mut [u8],
        run: &[Pending],
        sc: &mut SendScratch,
    ) -> Option<Conn> {
        let SendScratch { segs, msgs, sys: scratch } = sc;
        segs.clear();
        msgs.clear();
        segs.extend(run.iter().map(|p| p.slot * MAX_DATAGRAM + p.start..p.slot * MAX_DATAGRAM + p.end));
        // Group into messages: equal-size runs to one destination (the last may be shorter), a
        // run of requests or of responses (never both in one GSO message, so that a request
        // reaches the peer as a datagram of its own).
        let mut k = 0;
        while k < run.len() {
            let size = segs[k].len();
            let mut n = 1;
            let mut bytes = size;
            if self.gso {
                while k + n < run.len()
                    && n < GSO_MAX_SEGS
                    && run[k + n].dst == run[k].dst
                    && run[k + n].response == run[k].response
                    && segs[k + n - 1].len() == size
                    && segs[k + n].len() <= size
                    && bytes + segs[k + n].len() <= GSO_MAX_BYTES
                {
                    bytes += segs[k + n].len();
                    n += 1;
                }
            }
            let to = destination(conn, run[k].dst);
            msgs.push(sys::TxMsg { to, first: k, count: n, gso: (n > 1).then_some(size as u16) });
            k += n;
        }
        stamp_identifications(&mut self.shifts, tx, run, msgs, conn.map(|c| c.next_id));
        let mut done = 0;
        let mut blocked_since: Option<Instant> = None;
        while done < msgs.len() {
            bump(&self.stats.tx_syscalls, 1);
            let r = sys::sendmmsg(fd, tx, segs, &msgs[done..], scratch);
            match r {
                Ok(n) => {
                    for m in &msgs[done..done + n] {
                        // The pcap holds what the kernel took, as it took it.
                        if let Some(p) = self.pcap.as_mut() {
                            for q in &run[m.first..m.first + m.count] {
                                let d = &tx[q.slot * MAX_DATAGRAM..q.slot * MAX_DATAGRAM + q.end];
                                let (src, dst) = macs_of(d);
                                let _ = p.write_datagram(self.clock, src, dst, d);
                            }
                        }
                        let bytes: usize = segs[m.first..m.first + m.count].iter().map(|r| r.len()).sum();
                        bump(&self.stats.tx_datagrams, m.count as u64);
                        bump(&self.stats.tx_bytes, bytes as u64);
                        if m.gso.is_some() {
                            bump(&self.stats.tx_gso_messages, 1);
                            bump(&self.stats.tx_gso_segments, m.count as u64);
                        }
                    }
                    if let Some(c) = conn.as_mut() {
                        // Linux counts messages, not segments (a GSO message's segments take
                        // consecutive Identifications from its own).
                        c.next_id = c.next_id.wrapping_add(n as u16);
                    }
                    done += n;
                    if done < msgs.len() && conn.is_some() {
                        // The kernel stopped at an error it did not report. Usually a full send
                        // buffer, which uses no Identification, but one that struck after the
                        // datagram was built did: ask the counter where it stands.
                        if let Some(next) = self.probe_next_id(fd) {
                            if let Some(c) = conn.as_mut() {
                                c.next_id = next;
                            }
                            stamp_identifications(&mut self.shifts, tx, run, &msgs[done..], Some(next));
                        }
                    }
                }
                // Refused before the kernel built the datagram: no Identification was used.
                Err(e)
                    if e.kind() == io::ErrorKind::WouldBlock
                        && blocked_since.get_or_insert_with(Instant::now).elapsed() < SEND_PATIENCE =>
                {
                    let mut fds = [libc::pollfd { fd, events: libc::POLLOUT, revents: 0 }];
                    let _ = sys::ppoll(&mut fds, Some(Duration::from_millis(1)));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    // Out of patience: this message is dropped, the ones behind it get one try
                    // each, numbered from where the counter stands.
                    bump(&self.stats.tx_errors, msgs[done].count as u64);
                    done += 1;
                    stamp_identifications(&mut self.shifts, tx, run, &msgs[done..], conn.map(|c| c.next_id));
                }
                Err(e) if msgs[done].gso.is_some() && matches!(e.raw_os_error(), Some(libc::EIO | libc::EINVAL)) => {
                    // The path cannot segment: send this run's datagrams one by one from now on.
                    tracing::warn!(error = %e, "UDP GSO refused; disabled");
                    self.gso = false;
                    let m = msgs[done];
                    let singles =
                        (0..m.count).map(|i| sys::TxMsg { to: m.to, first: m.first + i, count: 1, gso: None });
                    msgs.splice(done..done + 1, singles);
                    // The refusal came after the datagram was built: whether it used an
                    // Identification is unknown, so a connected flow goes on unconnected.
                    if conn.take().is_some() {
                        self.disconnect_run(fd, run, msgs, done);
                    }
                    stamp_identifications(&mut self.shifts, tx, run, &msgs[done..], conn.map(|c| c.next_id));
                }
                Err(e) => {
                    tracing::debug!(error = %e, "sendmmsg dropped a message");
                    bump(&self.stats.tx_errors, msgs[done].count as u64);
                    done += 1;
                    if conn.take().is_some() {
                        // Whether the refused datagram used an Identification is unknown:
                        // the flow goes on unconnected, from Identification 0.
                        self.disconnect_run(fd, run, msgs, done);
                        stamp_identifications(&mut self.shifts, tx, run, &msgs[done..], None);
                    }
                }
            }
        }
        conn
    }
}

impl Io {
    /// Dissolves the association of the flow socket `fd` in the middle of sending `run`: the
    /// messages from `from` on get their destination addresses.
    fn disconnect_run(&mut self, fd: RawFd, run: &[Pending], msgs: &mut [sys::TxMsg], from: usize) {
        let _ = sys::disconnect(fd);
        for m in &mut msgs[from..] {
            m.to = Some(sys::CAddr::new(SocketAddr::new(run[m.first].dst, ROCE_V2_PORT)));
        }
    }

    /// Where the connected IPv4 socket `fd`'s Identification counter stands (one probe), if
    /// it can be learned now.
    fn probe_next_id(&mut self, fd: RawFd) -> Option<u16> {
        let IpAddr::V4(local) = self.addr else { return None };
        let sink = match self.sink.as_ref()?.as_ref()?.local_addr().ok()? {
            SocketAddr::V4(s) => s,
            SocketAddr::V6(_) => return None,
        };
        sys::probe_identification(fd, local, sink, PROBE_PATIENCE).ok().map(|id| id.wrapping_add(1))
    }
}

/// Opens the socket Identification probes go to: bound to the device's address with a filter
/// that drops everything (so that nothing queues and no ICMP answers a probe).
fn open_sink(addr: IpAddr) -> Option<UdpSocket> {
    let s = UdpSocket::bind(SocketAddr::new(addr, 0)).ok()?;
    sys::drop_all(s.as_raw_fd()).ok()?;
    Some(s)
}

/// Connects flow socket `fd` to `dst` (port 4791). IPv6 needs nothing more: its header has no
/// field the kernel chooses. IPv4 needs the Identification the kernel will number the socket's
/// datagrams from: two probes must get consecutive ones, else the socket is disconnected again
/// and the flow sends unconnected (Identification 0).
fn connect_flow(fd: RawFd, local: IpAddr, dst: IpAddr, sink: Option<&UdpSocket>) -> Option<Conn> {
    let fresh = |next_id| Some(Conn { peer: dst, next_id });
    match (local, dst) {
        (IpAddr::V6(_), IpAddr::V6(_)) => {
            sys::connect(fd, SocketAddr::new(dst, ROCE_V2_PORT)).ok()?;
            fresh(0)
        }
        (IpAddr::V4(l), IpAddr::V4(_)) => {
            let SocketAddr::V4(sink) = sink?.local_addr().ok()? else { return None };
            sys::connect(fd, SocketAddr::new(dst, ROCE_V2_PORT)).ok()?;
            let probe = || sys::probe_identification(fd, l, sink, PROBE_PATIENCE);
            match (probe(), probe()) {
                (Ok(a), Ok(b)) if b == a.wrapping_add(1) => fresh(b.wrapping_add(1)),
                (a, b) => {
                    tracing::debug!(?a, ?b, "IPv4 Identification not learned; the flow stays unconnected");
                    let _ = sys::disconnect(fd);
                    None
                }
            }
        }
        _ => None,
    }
}

/// A message's destination: none (the connected peer) or its address.
fn destination(conn: Option<Conn>, dst: IpAddr) -> Option<sys::CAddr> {
    match conn {
        Some(c) if c.peer == dst => None,
        _ => Some(sys::CAddr::new(SocketAddr::new(dst, ROCE_V2_PORT))),
    }
}

/// Gives every IPv4 datagram of `msgs` the Identification it will leave with and re-seals its
/// ICRC for it: on a connected socket message i gets `next + i` (from the socket's counter), on
/// an unconnected one 0; segment k of a GSO message gets its message's + k.
fn stamp_identifications(
    shifts: &mut verify::Shifts,
    tx: &mut [u8],
    run: &[Pending],
    msgs: &[sys::TxMsg],
    next: Option<u16>,
) {
    for (i, m) in msgs.iter().enumerate() {
        let first = next.map_or(0, |n| n.wrapping_add(i as u16));
        for (k, p) in run[m.first..m.first + m.count].iter().enumerate() {
            if p.dst.is_ipv4() {
                let d = &mut tx[p.slot * MAX_DATAGRAM..p.slot * MAX_DATAGRAM + p.end];
                set_identification(shifts, d, first.wrapping_add(k as u16));
            }
        }
    }
}

/// Sets an IPv4 datagram's Identification (and header checksum) and re-seals its ICRC for it,
/// using the ICRC's linearity in those bits instead of a second pass over the payload.
fn set_identification(shifts: &mut verify::Shifts, d: &mut [u8], id: u16) {
    let n = d.len();
    let hdr = 20 + UDP_HEADER_LEN;
    let old = Ipv4Header::new_unchecked(&d[..]).identification();
    if n < hdr + BTH_LEN + ICRC_LEN || id == old {
        return;
    }
    let delta = verify::id_effect(shifts, n - hdr, old ^ id, true);
    let icrc = u32::from_le_bytes([d[n - 4], d[n - 3], d[n - 2], d[n - 1]]);
    d[n - 4..].copy_from_slice(&(icrc ^ delta).to_le_bytes());
    let mut h = Ipv4Header::new_unchecked(d);
    h.set_identification(id);
    h.fill_checksum();
}

/// Sets Total Length, Identification and the header checksum of a 28-byte IPv4 + UDP header
/// for a UDP payload of `payload` bytes.
fn fix_v4_header(h: &mut [u8; 28], payload: usize, id: u16) {
    UdpHeader::new_unchecked(&mut h[IPV4_HEADER_LEN..]).set_len((UDP_HEADER_LEN + payload) as u16);
    let mut ip = Ipv4Header::new_unchecked(&mut h[..]);
    ip.set_total_len((IPV4_HEADER_LEN + UDP_HEADER_LEN + payload) as u16);
    ip.set_identification(id);
    ip.fill_checksum();
}

/// The pcap MACs (source, destination) of a datagram: 02:00 + the IPv4 address; IPv6 gets a
/// fixed one.
fn macs_of(d: &[u8]) -> ([u8; 6], [u8; 6]) {
    let mac = |a: Ipv4Addr| {
        let o = a.octets();
        [0x02, 0, o[0], o[1], o[2], o[3]]
    };
    match Ipv4Header::new_checked(d) {
        Ok(h) if d[0] >> 4 == 4 => (mac(h.src_addr()), mac(h.dst_addr())),
        _ => (crate::link::pcap::UNKNOWN_MAC, crate::link::pcap::UNKNOWN_MAC),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verbs::Mtu;

    /// PKT-ROCE-1: a RoCEv2 packet is IP + UDP + BTH + extended headers + payload + ICRC, so
    /// a 1500-byte Ethernet MTU carries 1024-byte IBA payloads, a 9000-byte one 4096.
    #[test]
    fn the_active_mtu_fits_the_interface() {
        assert_eq!(active_mtu(1500, false), Mtu::Mtu1024);
        assert_eq!(active_mtu(1500, true), Mtu::Mtu1024);
        assert_eq!(active_mtu(9000, false), Mtu::Mtu4096);
        assert_eq!(active_mtu(65536, false), Mtu::Mtu4096);
        assert_eq!(active_mtu(4096 + 63, false), Mtu::Mtu2048);
        assert_eq!(active_mtu(4096 + 64, false), Mtu::Mtu4096);
        assert_eq!(active_mtu(576, false), Mtu::Mtu512);
        assert_eq!(active_mtu(0, false), Mtu::Mtu256);
    }

    #[test]
    fn loopback_carries_4096() {
        let lo = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let mtu = sys::interface_mtu(lo).expect("lo has an MTU");
        assert_eq!(active_mtu(mtu, false), Mtu::Mtu4096);
    }
}
