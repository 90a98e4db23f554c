//! The UDP link: RoCEv2 over real sockets, one engine thread per device (issue 5).
//!
//! A [`UdpDevice`] is one RoCEv2 port bound to one IP address on UDP 4791; its GID 0 is the
//! IPv4-mapped form of that address. The address is [`UdpConfig::addr`], else `SOFTHCA_ADDR`,
//! else the first of 127.0.0.1 … 127.0.0.254 whose port 4791 is free, so several processes on
//! one machine just work. A device may have a second address ([`UdpConfig::alt_addr`], else
//! `SOFTHCA_ALT_ADDR`), GID 1, where its QPs' alternate paths start: it then supports
//! Automatic Path Migration. That address has a plain socket, read after the first address's
//! in every turn and slept on with it; what leaves from it goes through that socket,
//! unconnected, from port 4791 (`batch::AltAddr`).
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
//!   at most [`MAX_PORT_SOCKETS`] at a time: an RC, UC or XRC QP's opened when Modify QP sets
//!   its path (the core announces it, [`crate::transport::FlowChange`], and the turn that
//!   Modify QP's doorbell runs opens and connects it), any other on first use. A connected
//!   flow's socket closes when the last QP on its port is reset or destroyed (after the ACKs
//!   it owed have left), so the slots go to the flows a process has, not the first it had. A
//!   flow beyond them (or whose port is taken) shares port 4791: its datagrams go out from the device's socket, their
//!   ICRC re-sealed for that port (receivers accept any source port, PKT-ROCE-6), and all such
//!   datagrams of a batch leave in one `sendmmsg`, whichever QPs they come from;
//! - an RC, UC or XRC flow has one peer, so its socket is *connected* to it ([`UdpConfig::connected`],
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
//! The fields the ICRC masks still say something on the wire (PKT-ROCE-3): the address
//! vector's Traffic Class goes with each message as the IPv4 TOS or IPv6 Traffic Class, and a
//! multicast datagram's hop limit as its TTL (a socket's own multicast TTL is 1), each as a
//! cmsg where the socket's default would not do (`sys::IpFields`). A unicast datagram takes
//! the route's TTL, as Linux's RoCE core puts the route's hop limit in its address vectors. An
//! IPv6 flow label is the kernel's: a socket sends its own only with a leased label.
//!
//! The pcap records each datagram as it leaves, Identification and ICRC included. A receiver
//! that verifies IPv4 ICRCs without the real header under [`IcrcPolicy::Exact`] drops a
//! connected flow's first datagram (its Identification starts at random) and follows the flow
//! from the Identification solving finds in it ([`Refused::Unproven`]).
//!
//! # Receiving and the ICRC
//!
//! Two receive modes ([`RxMode`]):
//! - [`RxMode::Socket`] (default, no privilege): the 4791 socket gives the payload and the
//!   source address. The link rebuilds the IP + UDP header and verifies the ICRC over it: exact
//!   for IPv6; for IPv4 the Identification and DF are unknown and are found by hypotheses
//!   (0, the GRO segment index, and what the source sent last, see `hints`) or, under [`IcrcPolicy::Solve`], solved
//!   for by linear algebra over GF(2) — the trade-off is explained in [`verify`]. The TOS
//!   and TTL the ICRC masks are the received ones while the device has a UD QP of the
//!   program's, whose receives show the header (the kernel reports them then:
//!   `Io::follow_ud_qps`), else 0 and 64.
//! - [`RxMode::Raw`] (CAP_NET_RAW, e.g. root in CI): a raw IPv4 socket bound to the address
//!   with a BPF filter for port 4791 sees the real IP header, so every ICRC is checked exactly
//!   against the header that was on the wire; the 4791 socket stays bound (so the port is
//!   ours and no ICMP unreachables go out) with a drop-everything filter. IPv6 does not need
//!   it. GSO superpackets on loopback reach a raw socket unsegmented; the link segments them
//!   itself by finding the segment size at which the first segment's ICRC verifies.
//!   [`RxMode::Auto`] uses raw when permitted.
//!
//! **The response queue.** Responses (RDMA Read responses, ACKs, Atomic ACKs: BTH opcodes
//! whose low five bits are 0x0D..=0x12, in RC, RD and XRC) can have a socket of their own
//! beside the 4791 socket: both are bound with `SO_REUSEPORT` into one group whose classic
//! BPF program (`SO_ATTACH_REUSEPORT_CBPF`, unprivileged) steers each datagram by its first
//! payload byte. While the 4791 socket has a backlog (a receive fills a whole batch), the
//! program steers responses apart and each turn reads them first; once the 4791 socket is
//! found empty 10 ms or more after the last backlog, it sends everything there again (a
//! second socket read per turn costs the busy-poll ping-pong about 0.5 µs), and the response
//! queue is read until empty.
//! A peer that floods the device with requests (Linux rxe sends a whole message per QP at
//! once, on many QPs, and again at every timeout) then fills and overflows only the request
//! queue: the ACKs of the device's own requests still arrive and are seen at once, where
//! behind the flood they were dropped or met stale, and the requester ran out of retries
//! (issue 12's `ibv_srq_pingpong -s 65536` against rxe in an emulated guest). Requests and
//! responses are independent streams; each keeps its order. Only sockets of the same user can join a reuseport group,
//! and one joined by another socket never gets a datagram (the program names ours); because
//! such a join would not fail, the device also binds TCP port 4791 on its address, exclusive,
//! as its claim on the address. In raw mode the raw socket sees responses too, and there is
//! no response queue.
//!
//! **Multicast.** A UD QP attached to a group (`Qp::attach_mcast`) hears it through a socket
//! bound to the group's address and joined on the device's interface, opened at the group's
//! first attach and closed at its last detach (`groups`); what it reads is verified as above,
//! over a header addressed to the group. Sending needs nothing more: the device's sockets are
//! bound to its address, which takes a multicast route out of the interface that holds it.
//!
//! Malformed or hostile datagrams are dropped and counted in [`UdpCounters`], never trusted;
//! the core then validates the transport headers (PKT-VAL-*).
//!
//! # Where things are
//!
//! This file opens and closes a device (sockets, the engine thread). [`config`] is how to
//! open one and the counters; `port` the link's I/O as the engine driver (`link::driver`,
//! shared with any OS-facing link: the engine thread, the doorbell, busy-poll turns) runs it;
//! `batch` the batched socket I/O and the stamping of what leaves; `verify` the ICRC checks
//! of what arrives, `hints` the IPv4 Identification hypotheses, `groups` the multicast groups'
//! sockets, `sys` the socket calls. The
//! driver uses the port, never the other way round; none of them reaches into the transport,
//! only the sans-IO [`Context`] interface.

mod batch;
pub mod config;
mod frames;
mod groups;
mod hints;
mod port;
pub mod sys;
pub mod verify;

use std::fs::File;
use std::io::{self, BufWriter};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::link::pcap::PcapTap;
use crate::transport::MAX_DATAGRAM;
use crate::verbs::{Context, DeviceConfig, Gid};
use crate::wire::ip::{IPV4_HEADER_LEN, UDP_HEADER_LEN};
use crate::wire::packet::{BTH_LEN, ICRC_LEN};
use crate::wire::roce::{Ipv4Header, Ipv6Header, UdpHeader, IPV4_DONT_FRAGMENT, ROCE_V2_PORT};
use crate::wire::Opcode;

use crate::link::clock::Clock;
use crate::link::driver::Running;
use batch::{Io, SendScratch, TxBufs};
use config::Stats;
pub use config::{RxMode, UdpConfig, UdpCounters};
use port::UdpPort;
pub use verify::{IcrcPolicy, Refused, Verified};

/// GID table slots of a UDP port: GID 0 is the device's address; the rest stay empty (as a
/// RoCE port's table has room for addresses its interface does not have), so that a program
/// probing an unused index gets the empty-entry answer (ENODATA through libibverbs). As many
/// as Linux rxe's port has (`RXE_PORT_GID_TBL_LEN`), so that an index answers as there:
/// ENODATA below 1024, EINVAL from it. The table is read by index only.
pub const GID_TABLE_LEN: u32 = 1024;
/// At most this many flows send from sockets of their own (see the module docs); the others
/// share the device's 4791 socket, so that one `sendmmsg` (and GSO) carries the datagrams of
/// many QPs: with 100 QPs of 8-byte Sends on loopback, 0.76 Mpps through the shared socket
/// against 0.16 with a socket and a syscall per flow (`softhca perf send --link udp
/// --loopback -s 8 -q 100`, 2026-11-25).
pub const MAX_PORT_SOCKETS: usize = 8;
/// Raw QPs of each kind a device that carries their packets may have.
const RAW_QPS: u32 = 64;
/// Datagrams per `recvmmsg` / transmit batch.
const BATCH: usize = 64;
/// Receive buffer size: a whole GRO superpacket.
const RX_CAP: usize = 65536;
/// Most segments in one GSO message (the kernel's limit is 64 on older kernels).
const GSO_MAX_SEGS: usize = 64;
/// Most bytes in one GSO message (IPv4 UDP payload limit, with margin).
const GSO_MAX_BYTES: usize = 65000;

/// A RoCEv2 device on a real UDP socket, with its engine. Dropping it stops and joins the
/// engine thread; the [`Context`] (and clones of it) stays usable but no longer moves packets.
pub struct UdpDevice {
    ctx: Context,
    addr: IpAddr,
    alt_addr: Option<IpAddr>,
    mac: Option<[u8; 6]>,
    gid: Gid,
    /// The engine driver and its thread; dropping it sends what is owed and stops the thread.
    engine: Running<UdpPort>,
    stats: Arc<Stats>,
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

/// A device's hold on its address: the 4791 socket, the response queue beside it, and the
/// claim that keeps other devices off the address.
struct Bound {
    sock: UdpSocket,
    /// The response queue (see "Receiving" in the module docs); `None` where the kernel
    /// refused the reuseport group or its steering program.
    responses: Option<UdpSocket>,
    /// TCP port 4791 on the address, bound and never listened on: the device socket's group
    /// admits any socket of the same user that sets `SO_REUSEPORT`, so two devices of one user
    /// would share an address unnoticed; the TCP bind is exclusive and says "taken".
    claim: OwnedFd,
}

fn bind_4791(addr: IpAddr) -> io::Result<Bound> {
    let at = SocketAddr::new(addr, ROCE_V2_PORT);
    let claim = sys::bound_socket(at, libc::SOCK_STREAM, false)?;
    let sock = UdpSocket::from(sys::bound_socket(at, libc::SOCK_DGRAM, true)?);
    // Everything to the 4791 socket until a backlog there turns steering on (see `Io`).
    let responses = sys::bound_socket(at, libc::SOCK_DGRAM, true)
        .and_then(|r| sys::steer_responses(sock.as_raw_fd(), false).map(|()| UdpSocket::from(r)))
        .ok();
    Ok(Bound { sock, responses, claim })
}

/// Binds the configured address, `SOFTHCA_ADDR`, or the first free 127.0.0.x.
fn bind_device_socket(cfg: &UdpConfig) -> io::Result<Bound> {
    super::claim_address(
        cfg.addr,
        IpAddr::V4,
        bind_4791,
        "UDP port 4791 is taken on every address 127.0.0.1-127.0.0.254",
    )
}

/// The second address's socket ([`UdpConfig::alt_addr`], else `SOFTHCA_ALT_ADDR`), if any.
fn open_alt(cfg: &UdpConfig, addr: IpAddr) -> io::Result<Option<batch::AltAddr>> {
    let alt = match (cfg.alt_addr, std::env::var("SOFTHCA_ALT_ADDR")) {
        (Some(a), _) => a,
        (None, Ok(s)) => s.trim().parse::<IpAddr>().map_err(|e| {
            io::Error::new(io::ErrorKind::InvalidInput, format!("SOFTHCA_ALT_ADDR={s:?} is not an address: {e}"))
        })?,
        (None, Err(_)) => return Ok(None),
    };
    if alt.is_ipv4() != addr.is_ipv4() || alt == addr {
        let why = format!("the alternate address {alt} must be another address of {addr}'s family");
        return Err(io::Error::new(io::ErrorKind::InvalidInput, why));
    }
    let sock = sys::udp_bind(SocketAddr::new(alt, ROCE_V2_PORT))?;
    prepare_send_socket(&sock, alt)?;
    let _ = sys::set_buffer(sock.as_raw_fd(), libc::SO_RCVBUF, 8 << 20);
    if cfg.gro {
        let _ = sys::setsockopt_int(sock.as_raw_fd(), sys::SOL_UDP, sys::UDP_GRO, 1);
    }
    Ok(Some(batch::AltAddr { addr: alt, sock }))
}

fn prepare_send_socket(s: &UdpSocket, addr: IpAddr) -> io::Result<()> {
    let fd = s.as_raw_fd();
    match addr {
        IpAddr::V4(_) => sys::setsockopt_int(fd, libc::IPPROTO_IP, libc::IP_MTU_DISCOVER, libc::IP_PMTUDISC_DO)?,
        IpAddr::V6(_) => {
            sys::setsockopt_int(fd, libc::IPPROTO_IPV6, libc::IPV6_MTU_DISCOVER, libc::IPV6_PMTUDISC_DO)?;
            // Multicast leaves by the address's interface: IPv4 takes it from the bound
            // address, IPv6 from this option (else from the routing table, which may have none).
            if let Some(index) = sys::interface_index(addr) {
                let _ = sys::setsockopt_int(fd, libc::IPPROTO_IPV6, libc::IPV6_MULTICAST_IF, index as libc::c_int);
            }
        }
    }
    s.set_nonblocking(true)
}

impl UdpDevice {
    /// Binds the address, creates the device (GID 0 = the address) and starts its engine.
    pub fn open(cfg: UdpConfig) -> io::Result<UdpDevice> {
        let Bound { sock, mut responses, claim } = bind_device_socket(&cfg)?;
        let addr = sock.local_addr()?.ip();
        prepare_send_socket(&sock, addr)?;
        let fd = sock.as_raw_fd();
        let _ = sys::set_buffer(fd, libc::SO_RCVBUF, 8 << 20);
        let _ = sys::set_buffer(fd, libc::SO_SNDBUF, 8 << 20);
        let gro = cfg.gro && sys::setsockopt_int(fd, sys::SOL_UDP, sys::UDP_GRO, 1).is_ok();
        if let Some(r) = &responses {
            let _ = sys::set_buffer(r.as_raw_fd(), libc::SO_RCVBUF, 8 << 20);
            if gro {
                let _ = sys::setsockopt_int(r.as_raw_fd(), sys::SOL_UDP, sys::UDP_GRO, 1);
            }
        }
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
            // The raw socket sees every datagram, responses included.
            sys::drop_all(fd)?;
            responses = None;
        }
        let alt = open_alt(&cfg, addr)?;
        let alt_addr = alt.as_ref().map(|a| a.addr);
        let (frames, ipv6) = if cfg.raw_packets {
            let v6 = match verify::unmap(addr) {
                IpAddr::V6(a) => frames::PacketPort::open(addr, frames::Kind::Ipv6(a)).ok().map(Arc::new),
                IpAddr::V4(_) => None,
            };
            (frames::PacketPort::open(addr, frames::Kind::Frames).ok().map(Arc::new), v6)
        } else {
            (None, None)
        };
        let mac = frames.as_ref().map(|f| f.mac());
        // The engine thread sleeps on every socket it reads.
        let rx_fds: Vec<RawFd> = [raw.as_ref().map_or(fd, |r| r.as_raw_fd())]
            .into_iter()
            .chain(responses.as_ref().map(|r| r.as_raw_fd()))
            .chain(alt.as_ref().map(|a| a.sock.as_raw_fd()))
            .chain(frames.as_ref().map(|f| f.fd()))
            .chain(ipv6.as_ref().map(|f| f.fd()))
            .collect();
        // And on the sockets of the multicast groups it joins.
        let groups = Arc::new(groups::Groups::new(sys::epoll_of(&rx_fds)?, addr));
        let gid = Gid::from_ipv6(verify::gid_addr(addr));
        let mut dcfg = DeviceConfig::default().name(cfg.name.clone()).gid0(gid);
        dcfg.port.gid_tbl_len = GID_TABLE_LEN;
        dcfg.attr.auto_path_mig = alt.is_some();
        if frames.is_some() {
            dcfg.attr.max_raw_ethy_qp = RAW_QPS;
        }
        if ipv6.is_some() {
            dcfg.attr.max_raw_ipv6_qp = RAW_QPS;
        }
        if let Some(mtu) = sys::interface_mtu(addr) {
            dcfg.port.active_mtu = active_mtu(mtu, addr.is_ipv6());
        }
        let ctx = Context::create(dcfg).map_err(|e| io::Error::other(e.to_string()))?;
        if let Some(a) = &alt {
            ctx.set_gid(1, Gid::from_ipv6(verify::gid_addr(a.addr))).map_err(|e| io::Error::other(e.to_string()))?;
        }
        // The driver sends in batches after transmit: UC/UD completions wait for the send.
        ctx.defer_unreliable_completions();
        // The peer's poller takes datagrams in as they arrive: an ACK goes behind the answer.
        ctx.acks_after_requests();
        // A QP's flow socket is opened and connected at Modify QP, not behind its first packet.
        ctx.announce_flows();
        if frames.is_some() || ipv6.is_some() {
            // Create QP starts the packet socket hearing, before it returns (the link's next
            // turn may come after a peer's first frame). Held weakly: the device must not keep
            // its link's sockets open.
            let (f, v6) = (frames.as_ref().map(Arc::downgrade), ipv6.as_ref().map(Arc::downgrade));
            ctx.set_raw_listener(Some(Arc::new(move |qp_type, on| {
                let port = if qp_type == crate::types::QpType::RawIpv6 { &v6 } else { &f };
                match port.as_ref().and_then(|p| p.upgrade()) {
                    Some(p) => p.listen(on).inspect_err(|e| tracing::warn!(error = %e, on, "packet socket")).is_ok(),
                    None => true,
                }
            })));
        }
        {
            // Attach QP to Multicast Group opens the group's socket before it returns. Held
            // weakly, as the raw listener's ports.
            let g = Arc::downgrade(&groups);
            ctx.set_group_listener(Some(Arc::new(move |mgid, on| match g.upgrade() {
                Some(g) if on => g.join(mgid),
                Some(g) => {
                    g.leave(mgid);
                    true
                }
                None => true,
            })));
        }
        let mut taps = crate::link::Taps::default();
        if let Some(p) = &cfg.pcap {
            taps.push(crate::link::TapHandle::new(PcapTap::new(BufWriter::new(File::create(p)?))?));
        }
        for t in &cfg.taps.0 {
            taps.push(t.clone());
        }
        let stats = Arc::new(Stats::default());
        let raw_on = raw.is_some();
        let time = Clock::start();
        let rx_batch = if raw.is_some() { BATCH / 2 } else { BATCH };
        let io = Io {
            ctx: ctx.clone(),
            addr,
            sock,
            responses,
            steering: false,
            draining: false,
            backlog_at: 0,
            groups: groups.clone(),
            _claim: claim,
            raw,
            alt,
            rx_from: batch::RxFrom::Device,
            frames,
            ipv6,
            ports: rustc_hash::FxHashMap::default(),
            flow_refs: rustc_hash::FxHashMap::default(),
            released: Vec::new(),
            connect: cfg.connected,
            sink: None,
            stats: stats.clone(),
            policy: cfg.icrc_policy,
            gso,
            taps,
            time,
            hints: hints::IdHints::default(),
            icrc: verify::IcrcCache::default(),
            clock: 0,
            rx_idle: false,
            rx_ip_fields: false,
            tx_backlog: false,
        };
        let port = UdpPort {
            io,
            rx: sys::RxBatch::new(rx_batch, RX_CAP, verify::MAX_IP_UDP),
            msgs: Vec::with_capacity(rx_batch),
            tx: TxBufs {
                buf: vec![0u8; BATCH * MAX_DATAGRAM],
                pending: Vec::with_capacity(BATCH),
                send: SendScratch::default(),
            },
            resume: None,
            group_socks: Vec::new(),
        };
        let engine = Running::start(ctx.clone(), cfg.busy_poll, time, port, &cfg.name)?;
        Ok(UdpDevice { ctx, addr, alt_addr, mac, gid, engine, stats, raw: raw_on, gso, gro })
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
    /// The second address (GID 1), where alternate paths start, if the device has one.
    pub fn alt_addr(&self) -> Option<IpAddr> {
        self.alt_addr
    }
    /// The MAC of the device's Raw Ethertype frames (its interface's; on loopback, which has
    /// none, `02:00` and the IPv4 address), if it carries frames (see [`UdpConfig::raw_packets`]).
    pub fn mac(&self) -> Option<[u8; 6]> {
        self.mac
    }
    pub fn counters(&self) -> UdpCounters {
        with_wakes(self.stats.snapshot(), &self.engine.link.wakes)
    }
    /// Stops the engine (after sending what the device owes, as dropping it does) and returns
    /// the final counters: every datagram the taps saw is in them.
    pub fn close(self) -> UdpCounters {
        let link = self.engine.link.clone();
        let stats = self.stats.clone();
        drop(self);
        with_wakes(stats.snapshot(), &link.wakes)
    }

    /// Whether the device busy-polls: the application's CQ polls and posts run the engine on
    /// their own thread, and the engine thread only stands in while nobody polls.
    pub fn busy_poll(&self) -> bool {
        self.engine.link.busy()
    }

    /// Switches busy-poll mode while the device runs.
    pub fn set_busy_poll(&self, on: bool) {
        self.engine.link.set_busy_poll(on);
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

/// The link's counters with the driver's.
fn with_wakes(mut c: UdpCounters, w: &crate::link::driver::Wakes) -> UdpCounters {
    c.sleeps = w.sleeps.load(Ordering::Relaxed);
    c.doorbells = w.doorbells.load(Ordering::Relaxed);
    c.poller_turns = w.poller_turns.load(Ordering::Relaxed);
    c.naps_cut = w.naps_cut.load(Ordering::Relaxed);
    c
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
    sys::udp_bind(any).is_ok_and(|s| sys::setsockopt_int(s.as_raw_fd(), sys::SOL_UDP, sys::UDP_SEGMENT, 1400).is_ok())
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

    /// The engine thread standing in for a program that spins on memory takes the peer's
    /// Write in and leaves its ACK for the program's next post (the driver's hold), so that
    /// the two leave together; nothing of it is lost: the next flush sends it. The port is
    /// held here, so that the engine thread cannot take the Write first.
    #[test]
    fn a_turn_standing_in_leaves_the_ack_for_the_next_post() {
        use crate::link::driver::Port;
        use crate::verbs::{Access, AddressVector, AhAttr, QpAttr, QpInitAttr, SendWr};
        let open = |last| UdpDevice::open(UdpConfig::default().addr(Ipv4Addr::new(127, 0, 3, last))).unwrap();
        let (a, b) = (open(7), open(8));
        let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
        let side = |d: &UdpDevice| {
            let pd = d.context().alloc_pd().unwrap();
            let cq = d.context().create_cq(16).unwrap();
            let qp = pd.create_qp(&QpInitAttr::rc(&cq, &cq)).unwrap();
            (pd, cq, qp)
        };
        let ((a_pd, _a_cq, a_qp), (b_pd, _b_cq, b_qp)) = (side(&a), side(&b));
        for (qp, to, qpn) in [(&a_qp, b.gid(), b_qp.qp_num()), (&b_qp, a.gid(), a_qp.qp_num())] {
            let av = AddressVector::new(AhAttr::roce(to, 0), Mtu::Mtu1024);
            qp.modify(&QpAttr::to_init().port(1).pkey_index(0).access(all)).unwrap();
            qp.modify(&QpAttr::to_rtr(av, qpn).rq_psn(0).max_dest_rd_atomic(1).min_rnr_timer(1)).unwrap();
            qp.modify(&QpAttr::to_rts().sq_psn(0).timeout(14).retry_cnt(7).rnr_retry(7).max_rd_atomic(1)).unwrap();
        }
        let land = a_pd.alloc_mr(64, all).unwrap();
        let src = b_pd.alloc_mr(64, all).unwrap();
        let mut port = a.engine.link.lock_port();
        let before = a.counters();
        b_qp.post_send(&[SendWr::rdma_write(1, &[src.sge(0..8)], land.addr(), land.rkey()).signaled()]).unwrap();
        let mut fds = [libc::pollfd { fd: port.rx_fd(), events: libc::POLLIN, revents: 0 }];
        assert_eq!(crate::link::os::ppoll(&mut fds, Some(Duration::from_secs(10))).unwrap(), 1, "no Write came");
        let now = a.engine.link.now();
        assert_eq!(port.stand_in(now), (true, true), "taken in, its ACK left");
        assert_eq!(a.counters().rx_datagrams, before.rx_datagrams + 1);
        assert_eq!(a.counters().tx_datagrams, before.tx_datagrams, "the ACK waits");
        assert!(port.flush(now), "the next flush sends it");
        assert_eq!(a.counters().tx_datagrams, before.tx_datagrams + 1);
    }

    /// A device socket bound on the first free 127.0.0.x from .2 on (.1 is the usual
    /// default of a device; SOFTHCA_ADDR is not consulted).
    fn bound_on_a_free_address() -> Bound {
        (2..255u8)
            .map(|x| IpAddr::V4(Ipv4Addr::new(127, 0, 0, x)))
            .find_map(|a| bind_4791(a).ok())
            .expect("a free 127.0.0.x")
    }

    /// The bug of issue 12 without the guest: a requester's 4791 socket full of requests
    /// nobody has read yet dropped the ACK behind them. The request queue is made tiny and
    /// filled until it overflows; an ACK and an Atomic ACK sent after that still arrive, on
    /// the response queue, and the requests that did fit are still there, in order.
    #[test]
    fn responses_get_past_a_full_request_queue() {
        let addr = bound_on_a_free_address();
        let Bound { sock, responses, claim: _claim } = addr;
        let responses = responses.expect("the kernel takes the group's program");
        sys::setsockopt_int(sock.as_raw_fd(), libc::SOL_SOCKET, libc::SO_RCVBUF, 1).unwrap();
        let to = sock.local_addr().unwrap();
        let peer = UdpSocket::bind(SocketAddr::new(to.ip(), 0)).unwrap();
        let datagram = |opcode: u8, tag: u8| {
            let mut d = [tag; 64];
            d[0] = opcode;
            d
        };
        let mut buf = [0u8; 128];
        // Not steering (a device starts so): an ACK goes to the 4791 socket like the rest.
        peer.send_to(&datagram(0x11, 0xA0), to).unwrap();
        sock.set_nonblocking(false).unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        assert_eq!(sock.recv(&mut buf).map(|n| (n, buf[1])).unwrap(), (64, 0xA0));
        sock.set_nonblocking(true).unwrap();
        sys::steer_responses(sock.as_raw_fd(), true).unwrap();
        // Send Only requests (0x04) until the queue has certainly overflowed: the smallest
        // receive buffer holds a few datagrams, far fewer than these.
        for i in 0..64u8 {
            peer.send_to(&datagram(0x04, i), to).unwrap();
        }
        peer.send_to(&datagram(0x11, 0xA1), to).unwrap(); // Acknowledge
        peer.send_to(&datagram(0x12, 0xA2), to).unwrap(); // Atomic Acknowledge
        peer.send_to(&datagram(0x4D, 0xA3), to).unwrap(); // RD RDMA Read Response First
        peer.send_to(&datagram(0x13, 0xA4), to).unwrap(); // Compare & Swap: a request
        responses.set_nonblocking(false).unwrap();
        responses.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        for want in [0xA1, 0xA2, 0xA3] {
            let n = responses.recv(&mut buf).unwrap();
            assert_eq!((n, buf[1]), (64, want));
        }
        responses.set_nonblocking(true).unwrap();
        assert!(responses.recv(&mut buf).is_err(), "only responses go to the response queue");
        let mut got = Vec::new();
        while let Ok(n) = sock.recv(&mut buf) {
            assert_eq!(n, 64);
            got.push(buf[1]);
        }
        assert!(!got.is_empty() && got.len() < 64, "the request queue overflowed: {got:?}");
        assert!(got.windows(2).all(|w| w[0] < w[1]), "{got:?}");
        // Steering off again: the next ACK goes to the 4791 socket.
        sys::steer_responses(sock.as_raw_fd(), false).unwrap();
        peer.send_to(&datagram(0x11, 0xA5), to).unwrap();
        sock.set_nonblocking(false).unwrap();
        assert_eq!(sock.recv(&mut buf).map(|n| (n, buf[1])).unwrap(), (64, 0xA5));
        assert!(responses.recv(&mut buf).is_err());
    }

    /// Two devices never share an address: the reuseport group would admit a second one of
    /// the same user, the claim does not.
    #[test]
    fn an_address_has_one_device() {
        let first = bound_on_a_free_address();
        let ip = first.sock.local_addr().unwrap().ip();
        let again = bind_4791(ip).err().map(|e| e.kind());
        assert_eq!(again, Some(io::ErrorKind::AddrInUse));
        drop(first);
        assert!(bind_4791(ip).is_ok(), "the address is free again once the device is gone");
    }

    /// A Raw Ethertype QP hears its port from the moment Create QP returns, however late the
    /// link's next turn: here the receiving device's port is held (as by a long turn on
    /// another thread) while its QP is made and the peer's frame arrives, and the frame is
    /// there once the port is free. The packet socket used to start listening at that next
    /// turn, after the frame: lost, and the receive never completed (the udp_raw tests'
    /// timeout, 1 run in 130 when two tests ran at once).
    #[test]
    fn a_raw_qp_hears_from_create_qp_on() {
        use crate::verbs::{Access, QpAttr, QpInitAttr, QpState, RecvWr, SendWr, Wc, WcStatus};
        let open = |last| UdpDevice::open(UdpConfig::default().addr(IpAddr::V4(Ipv4Addr::new(127, 24, 0, last))));
        let (a, b) = (open(1).unwrap(), open(2).unwrap());
        let Some(to) = b.mac() else { return }; // no packet socket here (no CAP_NET_RAW)
        let raw_qp = |dev: &UdpDevice| {
            let ctx = dev.context();
            let (pd, cq) = (ctx.alloc_pd().unwrap(), ctx.create_cq(4).unwrap());
            let mr = pd.alloc_mr(4096, Access::LOCAL_WRITE).unwrap();
            let qp = pd.create_qp(&QpInitAttr::new(crate::types::QpType::RawEthertype, &cq, &cq)).unwrap();
            qp.modify(&QpAttr::to_init().port(1)).unwrap();
            qp.post_recv(&[RecvWr::new(7, &[mr.sge(0..2048)])]).unwrap();
            qp.modify(&QpAttr::new(QpState::Rtr)).unwrap();
            qp.modify(&QpAttr::to_rts()).unwrap();
            (qp, cq, mr)
        };
        let first = |cq: &crate::verbs::Cq| {
            let mut wc = [Wc::default()];
            let deadline = Instant::now() + Duration::from_secs(30);
            while cq.poll(&mut wc).unwrap() == 0 {
                assert!(Instant::now() < deadline, "no completion");
                std::thread::yield_now();
            }
            wc[0]
        };
        let held = b.engine.link.lock_port();
        let (bq, bcq, _bmr) = raw_qp(&b);
        let listening = |p: &UdpPort| p.io.frames.as_ref().is_some_and(|f| f.listening());
        assert!(listening(&held), "Create QP made the socket listen");
        let (aq, acq, amr) = raw_qp(&a);
        let frame = [&to[..], &a.mac().unwrap()[..], &0x88B5u16.to_be_bytes()[..], b"early"].concat();
        amr.write(2048, &frame).unwrap();
        aq.post_send(&[SendWr::send(1, &[amr.sge(2048..2048 + frame.len())]).signaled()]).unwrap();
        assert_eq!(first(&acq).status, WcStatus::Success);
        drop(held);
        let wc = first(&bcq);
        assert_eq!((wc.wr_id, wc.status, wc.byte_len as usize), (7, WcStatus::Success, frame.len()));
        // Destroy QP of the last Raw Ethertype QP stops it again (the kernel no longer copies
        // the interface's packets for it).
        bq.destroy().unwrap();
        assert!(!listening(&b.engine.link.lock_port()));
    }

    #[test]
    fn loopback_carries_4096() {
        let lo = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let mtu = sys::interface_mtu(lo).expect("lo has an MTU");
        assert_eq!(active_mtu(mtu, false), Mtu::Mtu4096);
    }
}
