//! Batched socket I/O: receiving a batch (`recvmmsg`, GRO, the raw socket), verifying each
//! datagram's ICRC and handing it to the core; draining the core's transmit side into a batch
//! and sending it (`sendmmsg`, GSO runs, per-flow sockets, connected flows and their learned
//! IPv4 Identifications, see "Sending" in the module docs of [`super`]).

use super::*;
use crate::transport::FlowChange;
use crate::types::QpType;
use rustc_hash::FxHashMap;
use std::collections::hash_map::Entry;

/// Adds to a counter that only the engine's lock holder writes (`bump_plain`).
pub(super) use crate::transport::engine::bump_plain as bump;

/// How long a datagram waits for room in a full socket send buffer before it is dropped (and
/// counted; RC retransmits it), so that the engine's lock is not held for longer.
pub(super) const SEND_PATIENCE: Duration = Duration::from_millis(50);
/// Response steering stays on this long (ns) after the 4791 socket last had a backlog.
pub(super) const STEER_HOLD: u64 = 10_000_000;
/// While receiving, flush the transmit side (ACKs, responses, newly opened windows) after
/// this many datagrams, so that a peer's window does not wait for a whole receive batch (up
/// to [`BATCH`](super::BATCH) messages, each a GRO buffer of up to 64 KiB). More than a
/// 64 KiB message's 16: at 16 the flush came right after such a Write's last datagram,
/// before the ACK its peer sent behind it in the same batch was taken in, and sent this
/// side's ACK alone, ahead of the answer the program was about to post (see the driver's
/// `ack_wait_ns`).
pub(super) const FLUSH_EVERY: usize = 64;
/// A transmit batch with at most this many requests sends them before its responses.
pub(super) const REQUESTS_FIRST: usize = 4;
/// At most this many transmit batches per flush, so that receiving keeps its turn.
pub(super) const TX_ROUNDS: usize = 4;

/// A transmitted datagram waiting in the batch: where its UDP payload is in its slot.
#[derive(Clone, Copy)]
pub(super) struct Pending {
    pub(super) slot: usize,
    pub(super) start: usize,
    pub(super) end: usize,
    pub(super) dst: IpAddr,
    pub(super) port: u16,
    /// An RC/RD response (ACK, RDMA Read response, Atomic ACK), not a request.
    pub(super) response: bool,
    /// RC, UC or XRC: its flow has one peer.
    pub(super) one_peer: bool,
    /// XRC's (see [`requests_first`]).
    pub(super) xrc: bool,
    /// From the alternate address (see [`AltAddr`]).
    pub(super) alt: bool,
    /// The header fields the core wrote that the kernel, which writes the header, is told
    /// per message (the TOS, a multicast datagram's hop limit).
    pub(super) ip: sys::IpFields,
}

/// The device's second address, GID 1: where its QPs' alternate paths start (Automatic Path
/// Migration, IBA 17.2.8). A plain socket on UDP 4791 of that address, received from in the
/// socket mode whatever [`RxMode`] the first address uses; everything from that address
/// leaves through it, unconnected (IPv4 Identification 0), its source port 4791 with the ICRC
/// re-sealed for it (PKT-ROCE-6 lets receivers take any source port).
pub(super) struct AltAddr {
    pub(super) addr: IpAddr,
    pub(super) sock: UdpSocket,
}

/// A flow's send socket, bound to (the device's address, the flow's source port).
pub(super) struct FlowSocket {
    pub(super) sock: UdpSocket,
    /// Whom it is connected to, if it is.
    pub(super) conn: Option<Conn>,
    /// Connecting was tried (once per flow).
    pub(super) tried: bool,
}

/// A flow socket's association: its peer (port 4791) and, for IPv4, the Identification the
/// kernel gives the socket's next datagram.
#[derive(Debug, Clone, Copy)]
pub(super) struct Conn {
    pub(super) peer: IpAddr,
    pub(super) next_id: u16,
}

/// How long a probe waits for its transmit timestamp (it comes back within the `sendto` on
/// loopback, where probes go).
pub(super) const PROBE_PATIENCE: Duration = Duration::from_millis(5);

/// The socket a received batch came from: it says which address the datagrams were sent to,
/// which the rebuilt IP header (and so the ICRC) needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum RxFrom {
    /// The device's own (its 4791 socket, the response queue, or the raw socket).
    Device,
    /// The alternate address's.
    Alt,
    /// A multicast group's, bound to this group address.
    Group(IpAddr),
}

/// The engine's sockets and per-datagram state.
pub(super) struct Io {
    pub(super) ctx: Context,
    pub(super) addr: IpAddr,
    pub(super) sock: UdpSocket,
    /// The response queue: RC/RD/XRC responses, steered here by the kernel while the 4791
    /// socket has a backlog (see the parent module), and then read before it, so that a flood
    /// of requests never holds up or crowds out the ACKs a requester is waiting for.
    pub(super) responses: Option<UdpSocket>,
    /// Whether the group's program steers responses to `responses` now.
    pub(super) steering: bool,
    /// Steering ended; `responses` is read until it is empty.
    pub(super) draining: bool,
    /// When the 4791 socket last had a backlog (ns on the engine clock).
    pub(super) backlog_at: u64,
    /// The epoll set of every socket the engine thread reads, which it sleeps on, and the
    /// multicast groups' sockets (see `groups`).
    pub(super) groups: Arc<super::groups::Groups>,
    pub(super) _claim: OwnedFd,
    pub(super) raw: Option<OwnedFd>,
    pub(super) alt: Option<AltAddr>,
    /// Which socket the batch being delivered came from.
    pub(super) rx_from: RxFrom,
    /// Raw Ethertype frames and Raw IPv6 datagrams (packet sockets), where the process may
    /// have them (see `frames`).
    pub(super) frames: Option<Arc<super::frames::PacketPort>>,
    pub(super) ipv6: Option<Arc<super::frames::PacketPort>>,
    /// Per-flow send sockets by source port; `None`: the port could not be bound.
    /// Looked up per flow of each batch sent: FxHash, not SipHash.
    pub(super) ports: FxHashMap<u16, Option<FlowSocket>>,
    /// The open flows the core announced, by source port (several QPs may share one), and
    /// the ports whose last flow closed in the previous flush: their sockets close at the
    /// next (see [`Io::follow_flows`]).
    pub(super) flow_refs: FxHashMap<u16, u32>,
    pub(super) released: Vec<u16>,
    /// Connect flow sockets ([`UdpConfig::connected`]).
    pub(super) connect: bool,
    /// Where Identification probes go: a socket on this address that drops everything
    /// (opened on first use; `Some(None)`: it could not be).
    pub(super) sink: Option<Option<UdpSocket>>,
    pub(super) stats: Arc<Stats>,
    pub(super) policy: IcrcPolicy,
    pub(super) gso: bool,
    /// Middleware on the datagram path (a pcap capture, faults).
    pub(super) taps: crate::link::Taps,
    /// The link's clock; `clock` below holds the reading a batch uses.
    pub(super) time: Clock,
    /// What each source sent last: the IPv4 Identification hypotheses.
    pub(super) hints: hints::IdHints,
    /// What checking and stamping ICRCs remembers (see [`verify::IcrcCache`]).
    pub(super) icrc: verify::IcrcCache,
    /// `now` for the datagrams being handled (read once per receive batch or transmit batch).
    pub(super) clock: u64,
    /// The last receive found at most one datagram where it could have taken more (the next
    /// asks for a single message).
    pub(super) rx_idle: bool,
    /// The receiving sockets report each datagram's TOS and TTL: while the device has UD QPs
    /// (see [`Io::follow_ud_qps`]).
    pub(super) rx_ip_fields: bool,
    /// The last flush stopped at its batch limit with more to send.
    pub(super) tx_backlog: bool,
}

/// The transmit batch: [`BATCH`] datagram slots and what is pending in them.
pub(super) struct TxBufs {
    pub(super) buf: Vec<u8>,
    pub(super) pending: Vec<Pending>,
    pub(super) send: SendScratch,
}

/// Reused between sends: the datagrams' byte ranges in the batch, the messages, and the
/// C-side arrays.
#[derive(Default)]
pub(super) struct SendScratch {
    /// Each pending datagram's socket and its flow's association, the batch's order grouped
    /// by socket (sort keys and indices), and one socket's run (see `send_batch`).
    pub(super) via: Vec<(RawFd, Option<Conn>)>,
    pub(super) order: Vec<(usize, usize)>,
    pub(super) run: Vec<Pending>,
    pub(super) segs: Vec<std::ops::Range<usize>>,
    pub(super) msgs: Vec<sys::TxMsg>,
    pub(super) sys: sys::TxScratch,
    /// The flow changes the core announced (see [`Io::follow_flows`]).
    pub(super) flows: Vec<FlowChange>,
}

/// Within each flow (destination and source port: one QP's), its requests before its
/// responses, each in batch order; the flows in the order they first appear. XRC's datagrams
/// to one address count as one flow here: a program's XRC conversation is an initiator QP
/// that sends and a target QP that answers it, two flows, and the answer (its initiator's
/// request) must leave before the target's ACK as RC's does, or the peer, polling for that ACK,
/// takes it alone and turns to the memory the answer has not reached. Uses the scratch's
/// `order` and `run`: no allocation.
fn requests_first(pending: &mut Vec<Pending>, sc: &mut SendScratch) {
    let flow = |p: &Pending| (p.dst, (!p.xrc).then_some(p.port));
    sc.order.clear();
    sc.order.extend(pending.iter().enumerate().map(|(k, p)| {
        let first = pending.iter().position(|q| flow(q) == flow(p)).unwrap_or(k);
        (2 * first + usize::from(p.response), k)
    }));
    sc.order.sort_unstable();
    sc.run.clear();
    sc.run.extend(sc.order.iter().map(|&(_, k)| pending[k]));
    std::mem::swap(pending, &mut sc.run);
}

/// Counts a Raw QP's packet handed to the kernel, or refused by it.
fn count_raw_send(stats: &Stats, sent: io::Result<()>) {
    bump(if sent.is_ok() { &stats.tx_raw_packets } else { &stats.tx_raw_errors }, 1);
}

/// The datagram size of a received message (its GRO segment size, or its length).
pub(super) fn gro_segment(m: &sys::RxMsg) -> usize {
    m.gro_size.filter(|&g| g > 0 && g < m.len).unwrap_or(m.len.max(1))
}

/// Whether a BTH opcode is a response (ACK, RDMA Read response, Atomic ACK: only RC and RD
/// have them), by the opcode table.
pub(super) fn is_response(op: u8) -> bool {
    Opcode::from(op).is_response()
}

/// Whether every datagram of a received (socket-mode) message from byte `start` on is a
/// response; false for anything that is not plainly one.
pub(super) fn only_responses(buf: &[u8], m: &sys::RxMsg, start: usize) -> bool {
    if m.truncated || m.from.is_none() {
        return false;
    }
    let seg = gro_segment(m);
    (start..m.len).step_by(seg).all(|off| buf.get(verify::MAX_IP_UDP + off).is_some_and(|&op| is_response(op)))
}

impl Io {
    pub(super) fn now(&self) -> u64 {
        self.time.now()
    }

    /// Drains the device's transmit queue into batches and sends them (at most
    /// [`TX_ROUNDS`] batches). Returns whether anything was sent.
    pub(super) fn flush_tx(&mut self, tx: &mut TxBufs, mut now: u64) -> bool {
        self.follow_flows(&mut tx.send.flows);
        let mut any = self.send_frames(tx, now);
        // Set again below if every round is full: then more may be waiting.
        self.tx_backlog = false;
        if !self.ctx.may_transmit() {
            self.clock = now;
            return any; // idle: every busy poll flushes first
        }
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
                if let Some(port) = self.ipv6.as_ref().filter(|_| crate::wire::roce::is_raw_ipv6(&buf[..len])) {
                    // A Raw IPv6 QP's datagram: not for the UDP sockets.
                    count_raw_send(&self.stats, port.send(&buf[..len]));
                    continue;
                }
                if let Some(p) = self.prepare(slot, &mut buf[..len]) {
                    tx.pending.push(p);
                }
            }
            if emitted == 0 {
                break;
            }
            any = true;
            // A few requests go before the responses of their flow in the same batch (in the
            // same `sendmmsg`, as datagrams of their own): when an application answers a
            // message, the peer waits for the answer, while the ACK that the transport queued
            // first only retires a Send the peer may not even wait for. (A flow's requests and
            // responses are independent streams; each keeps its own order, and the sort is
            // stable.) Flows keep the order they came in: a request of another QP does not
            // overtake an ACK; the client's DREQ (QP1) passing its ACK of the server's last
            // Send made the server flush that Send (IBV_WC_WR_FLUSH_ERR) in rdma-core's
            // `rdma_server`/pyverbs CMID tests.
            let requests = tx.pending.iter().filter(|p| !p.response).count();
            let answer = requests > 0 && requests <= REQUESTS_FIRST && requests < tx.pending.len();
            if answer {
                requests_first(&mut tx.pending, &mut tx.send);
            }
            // Such a small batch (an answer and its ACKs) may leave as one GSO message, the
            // ACKs being the shorter last segments: the peer gets both at once, where as two
            // datagrams the second came about 1.5 µs after the first, and the peer (perftest's
            // `ib_send_lat` waits for its Send's completion before it answers) waited for it.
            // Not in a flood: there a response inside a request's superpacket would escape the
            // receiver's response steering (see `Io::responses`).
            let mix = answer && tx.pending.len() <= 2 * REQUESTS_FIRST;
            self.send_batch(&mut tx.buf, &tx.pending, mix, &mut tx.send);
            // Now UC/UD sends of the batch complete: their datagrams are the kernel's.
            self.ctx.sent();
            if emitted < BATCH {
                break;
            }
            self.tx_backlog = round + 1 == TX_ROUNDS;
        }
        any
    }

    /// The packet port of `qp_type`'s packets while the device has such QPs (it listens
    /// exactly then: see `frames`).
    fn raw_port(&self, qp_type: QpType) -> Option<&super::frames::PacketPort> {
        let port = if qp_type == QpType::RawIpv6 { self.ipv6.as_deref() } else { self.frames.as_deref() };
        port.filter(|p| p.listening())
    }

    /// Sends the Raw Ethertype QPs' frames (one system call each: raw frames are rare), with
    /// the rest of a flush. Nothing to do, and no call made, while the device has no such QP.
    pub(super) fn send_frames(&mut self, tx: &mut TxBufs, now: u64) -> bool {
        // Raw IPv6 datagrams leave among the datagrams (`flush_tx`).
        let Some(port) = self.raw_port(QpType::RawEthertype) else { return false };
        let buf = &mut tx.buf[..MAX_DATAGRAM];
        let mut sent = false;
        while let Some(n) = self.ctx.transmit_frame(now, buf) {
            sent = true;
            count_raw_send(&self.stats, port.send(&buf[..n]));
        }
        if sent {
            // The frames are the kernel's now: their sends complete (as UD's, `Context::sent`).
            self.ctx.sent();
        }
        sent
    }

    /// Hands the device the raw packets that arrived (at most a batch of each kind), while
    /// it has Raw QPs of their kind. Returns whether any came.
    pub(super) fn receive_frames(&mut self, tx: &mut TxBufs) -> bool {
        let mut got = false;
        for qp_type in [QpType::RawEthertype, QpType::RawIpv6] {
            let Some(port) = self.raw_port(qp_type) else { continue };
            let buf = &mut tx.buf[..MAX_DATAGRAM];
            for _ in 0..BATCH {
                let Some(at) = port.recv(buf) else { break };
                got = true;
                bump(&self.stats.rx_raw_packets, 1);
                match qp_type {
                    QpType::RawIpv6 => self.ctx.receive(self.clock, &buf[at]),
                    _ => self.ctx.receive_frame(&buf[at]),
                }
            }
        }
        got
    }

    /// After a receive from the 4791 socket: `Some(backlog)` when it took datagrams (a whole
    /// batch: more are waiting there), `None` when it found the socket empty. Steering turns
    /// on at a backlog and off once the socket is found empty [`STEER_HOLD`] after the last
    /// backlog (see `Io::responses`): a socket still taking in a flood, even in smaller
    /// batches, keeps it on. The program is replaced only on a change; a refusal leaves
    /// things as they are.
    pub(super) fn steer(&mut self, read: Option<bool>) {
        if self.responses.is_none() {
            return;
        }
        if read == Some(true) {
            self.backlog_at = self.clock;
        }
        let want = match read {
            Some(backlog) => backlog || self.steering,
            None => self.steering && self.clock.saturating_sub(self.backlog_at) < STEER_HOLD,
        };
        if want != self.steering && sys::steer_responses(self.sock.as_raw_fd(), want).is_ok() {
            self.steering = want;
            self.draining = !want;
            bump(&self.stats.steering_changes, 1);
        }
    }

    /// Delivers the received batch `msgs` from message `at.0`, byte `at.1` of it on, flushing
    /// the transmit side every [`FLUSH_EVERY`] datagrams. In an inline turn, delivery stops
    /// after a request when only responses (ACKs) follow it in the batch, and the returned
    /// position is where the next turn resumes: the application sees the request's completion
    /// (and can answer it) without first waiting for the ACKs to be processed. Requests and
    /// responses are independent streams, and each keeps its order.
    pub(super) fn deliver_batch(
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
    pub(super) fn on_message(
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
        if self.raw.is_some() && self.rx_from == RxFrom::Device {
            return (self.on_raw(&mut buf[headroom..headroom + m.len]), None);
        }
        let seg = gro_segment(m);
        if seg < m.len && start == 0 {
            bump(&self.stats.rx_gro_buffers, 1);
        }
        let mut off = start;
        let mut index = (start / seg) as u16;
        let mut n = 0;
        // One step for the datagrams of one message (`Context::together`).
        Context::together(|| {
            while off < m.len {
                let len = seg.min(m.len - off);
                let at = headroom + off;
                let request = !is_response(buf[at]);
                self.on_payload(buf, at, len, from, index, (m.tos, m.ttl));
                off += len;
                n += 1;
                index = index.wrapping_add(1);
                if stop_after_request && request && off < m.len {
                    return (n, Some(off));
                }
            }
            (n, None)
        })
    }

    /// Verifies one UDP payload at `buf[at..at + len]` from `from`, writes the rebuilt header in
    /// front of it and hands the datagram to the device.
    pub(super) fn on_payload(
        &mut self,
        buf: &mut [u8],
        at: usize,
        len: usize,
        from: SocketAddr,
        index: u16,
        (tos, ttl): (Option<u8>, Option<u8>),
    ) {
        let src = verify::unmap(from.ip());
        let flow = SocketAddr::new(src, from.port());
        let payload = &buf[at..at + len];
        let hints = self.hints.for_datagram(flow, index);
        let local = match (self.rx_from, &self.alt) {
            (RxFrom::Alt, Some(alt)) => alt.addr,
            (RxFrom::Group(g), _) => g,
            _ => self.addr,
        };
        let verdict = verify::rebuild_with(&mut self.icrc, src, from.port(), local, payload, &hints, self.policy);
        // What the verdict counts, and the Identification it teaches the source's hints: a
        // datagram refused as unproven is dropped, but what it would have carried is the
        // source's next hypothesis.
        let (counter, learned) = match &verdict {
            Ok(h) => match h.how {
                Verified::Exact => (&self.stats.rx_icrc_exact, None),
                Verified::Hypothesis { identification, .. } => (&self.stats.rx_icrc_hypothesis, Some(identification)),
                Verified::Solved { identification, .. } => (&self.stats.rx_icrc_solved, Some(identification)),
            },
            Err(Refused::Malformed) => (&self.stats.drop_malformed, None),
            Err(Refused::Family) => (&self.stats.drop_family, None),
            Err(Refused::BadIcrc) => (&self.stats.drop_bad_icrc, None),
            Err(Refused::Unproven { identification }) => (&self.stats.drop_bad_icrc, Some(*identification)),
        };
        bump(counter, 1);
        if let Some(id) = learned {
            self.hints.record(flow, id, index, len);
        }
        if let Ok(mut h) = verdict {
            h.set_received(tos, ttl);
            let start = at - h.len;
            buf[start..at].copy_from_slice(h.header());
            self.deliver(&buf[start..at + len]);
        }
    }

    /// A raw-socket datagram: the real IPv4 header is present; a GSO superpacket is cut into
    /// its segments first.
    pub(super) fn on_raw(&mut self, dgram: &mut [u8]) -> usize {
        const HDR: usize = 20 + UDP_HEADER_LEN;
        if dgram.len() < HDR + BTH_LEN + ICRC_LEN || !Ipv4Header::new_unchecked(&dgram[..]).is_plain_v4() {
            bump(&self.stats.drop_malformed, 1);
            return 1;
        }
        let dst = Ipv4Header::new_unchecked(&dgram[..]).dst_addr();
        let port = UdpHeader::new_unchecked(&dgram[IPV4_HEADER_LEN..]).dst_port();
        if IpAddr::V4(dst) != self.addr || port != ROCE_V2_PORT {
            bump(&self.stats.drop_not_ours, 1);
            return 1;
        }
        // On loopback and veth a UDP GSO message arrives here as one superpacket whose headers
        // describe the whole run (the UDP socket would have had it segmented or reported the
        // segment size); nothing in the headers tells the two apart, so a datagram is taken
        // whole only when its ICRC verifies whole (the device then takes it as checked).
        if crate::wire::icrc::verify_datagram(dgram).is_ok() {
            bump(&self.stats.rx_icrc_exact, 1);
            self.deliver(dgram);
            return 1;
        }
        let body = dgram.len() - HDR;
        let id0 = Ipv4Header::new_unchecked(&dgram[..]).identification();
        let mut header = [0u8; HDR];
        header.copy_from_slice(&dgram[..HDR]);
        let seg = superpacket_segment(dgram, &mut header);
        let Some(seg) = seg else {
            bump(&self.stats.drop_bad_icrc, 1);
            return 1;
        };
        bump(&self.stats.rx_gro_buffers, 1);
        let mut off = 0;
        let mut k = 0u16;
        while off < body {
            let len = seg.min(body - off);
            fix_v4_header(&mut header, len, id0.wrapping_add(k));
            // Segment k's header goes in place, over the last HDR bytes of segment k - 1, which
            // the device has already taken (it copies what it keeps): no copy of the payload,
            // no allocation. (Segments are at least BTH + ICRC = 16 bytes and HDR is 28, so it
            // may reach back into segment k - 2 or the superpacket's header: taken too.)
            dgram[off..off + HDR].copy_from_slice(&header);
            // Every segment is verified over the header it had on the wire, not only the one
            // that told the segment size.
            let piece = &dgram[off..HDR + off + len];
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

    pub(super) fn deliver(&mut self, dgram: &[u8]) {
        let now = self.clock;
        bump(&self.stats.rx_datagrams, 1);
        bump(&self.stats.rx_bytes, dgram.len() as u64);
        for _ in 0..self.taps.copies_arriving(now, dgram) {
            // Every path here verified the ICRC first (on_message, on_raw); taps never change
            // a datagram.
            self.ctx.receive_icrc_checked(now, dgram);
        }
    }

    /// Has the receiving sockets report each datagram's TOS and TTL while the device has UD
    /// QPs, whose receives show the IP header (PKT-ROCE-11), and not otherwise: the reports
    /// cost every datagram (0.07 µs of an 8-byte RC Send's one-way latency). A group's socket
    /// always reports (only UD QPs attach to groups). Datagrams already queued when a first UD
    /// QP comes show TOS 0 and TTL 64.
    pub(super) fn follow_ud_qps(&mut self) {
        let want = self.ctx.has_ud_qps();
        if want == self.rx_ip_fields {
            return;
        }
        self.rx_ip_fields = want;
        let v6 = self.addr.is_ipv6();
        let socks = [Some(&self.sock), self.responses.as_ref(), self.alt.as_ref().map(|a| &a.sock)];
        for s in socks.into_iter().flatten() {
            if let Err(e) = sys::report_ip_fields(s.as_raw_fd(), v6, want) {
                tracing::debug!(error = %e, "the TOS and TTL reports could not be switched");
            }
        }
    }

    /// Checks a datagram the core emitted and finds its UDP payload; fixes the header fields
    /// the kernel will write differently (it should never need to).
    pub(super) fn prepare(&mut self, slot: usize, d: &mut [u8]) -> Option<Pending> {
        let (hl, dst, src, tos, hops) = match d.first().map(|b| b >> 4) {
            Some(4) if d.len() >= 20 => {
                let mut h = Ipv4Header::new_unchecked(&mut d[..]);
                if h.identification() != 0 || h.flags_fragment() != IPV4_DONT_FRAGMENT {
                    h.set_identification(0);
                    h.set_flags_fragment(IPV4_DONT_FRAGMENT);
                    h.fill_checksum();
                    let _ = crate::wire::icrc::fill_datagram(d);
                }
                let h = Ipv4Header::new_unchecked(&d[..]);
                (20, IpAddr::V4(h.dst_addr()), IpAddr::V4(h.src_addr()), d[1], d[8])
            }
            Some(6) if d.len() >= 40 => {
                let h = Ipv6Header::new_unchecked(&d[..]);
                let tclass = (d[0] << 4) | (d[1] >> 4);
                (40, verify::unmap(IpAddr::V6(h.dst_addr())), verify::unmap(IpAddr::V6(h.src_addr())), tclass, d[7])
            }
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
        let service = crate::wire::Opcode::from(op).service_range();
        let one_peer = service.is_some_and(crate::wire::ServiceType::is_connected);
        let xrc = service == Some(crate::wire::ServiceType::Xrc);
        let alt = self.alt.as_ref().is_some_and(|a| a.addr == src);
        Some(Pending {
            slot,
            start: hl + UDP_HEADER_LEN,
            end: d.len(),
            dst,
            port,
            response: is_response(op),
            one_peer,
            xrc,
            alt,
            ip: sys::IpFields { v6: dst.is_ipv6(), tos, hop_limit: dst.is_multicast().then_some(hops) },
        })
    }

    /// Follows the flows the core announced since the last flush. An opened one (an RC, UC or XRC
    /// QP whose path Modify QP has just set) gets its socket now, connected where configured:
    /// before any of its packets is written, whose Local ACK timer would otherwise run while
    /// the socket is opened and its Identification probed (see `transport::Flow`). A port
    /// whose last flow closed (its QPs reset or destroyed) has its socket closed one flush
    /// later, once the ACKs the QP still owed (queued before the close) have left through it;
    /// so a long-lived process that makes and ends connections keeps its flow sockets for
    /// the flows it has. Where the table is full, an opened flow takes the slot of a socket
    /// no announced flow holds (one opened on first use, or released). A flow from the
    /// alternate address has no socket of its own.
    pub(super) fn follow_flows(&mut self, changes: &mut Vec<FlowChange>) {
        while let Some(port) = self.released.pop() {
            if !self.flow_refs.contains_key(&port) {
                self.close_port(port);
            }
        }
        self.ctx.take_flows(changes);
        for &change in changes.iter() {
            let (FlowChange::Opened(f) | FlowChange::Closed(f)) = change;
            if verify::unmap(IpAddr::V6(f.src_gid)) != self.addr || f.src_port == ROCE_V2_PORT {
                continue;
            }
            let port = f.src_port;
            if let FlowChange::Closed(_) = change {
                if let Entry::Occupied(mut e) = self.flow_refs.entry(port) {
                    *e.get_mut() -= 1;
                    if *e.get() == 0 {
                        e.remove();
                        self.released.push(port);
                    }
                }
                continue;
            }
            *self.flow_refs.entry(port).or_default() += 1;
            // A port released in this flush (its QP reset and connected anew in one turn)
            // gets a fresh socket, as one released in an earlier flush does.
            if let Some(k) = self.released.iter().position(|&p| p == port) {
                self.released.swap_remove(k);
                self.close_port(port);
            }
            if self.ports.len() >= MAX_PORT_SOCKETS && !self.ports.contains_key(&port) {
                // Not one released in this flush: its QP's last ACKs are still to leave.
                let idle =
                    self.ports.keys().copied().find(|p| !self.flow_refs.contains_key(p) && !self.released.contains(p));
                if let Some(idle) = idle {
                    self.close_port(idle);
                }
            }
            self.port_socket(port, verify::unmap(IpAddr::V6(f.dst_gid)), true);
        }
    }

    /// Frees a port's slot in the flow socket table, closing its socket if it had one.
    fn close_port(&mut self, port: u16) {
        if let Some(Some(_)) = self.ports.remove(&port) {
            bump(&self.stats.tx_flows_closed, 1);
        }
    }

    /// The socket to send a flow's datagrams from (bound to (addr, port), created on first
    /// use; an RC, UC or XRC flow's, `one_peer`, is connected to `dst` on first use where
    /// configured) and its association; None if the port cannot be had.
    pub(super) fn port_socket(&mut self, port: u16, dst: IpAddr, one_peer: bool) -> Option<(RawFd, Option<Conn>)> {
        if port == ROCE_V2_PORT {
            return Some((self.sock.as_raw_fd(), None));
        }
        let full = self.ports.len() >= MAX_PORT_SOCKETS;
        let f = match self.ports.entry(port) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(_) if full => return None,
            Entry::Vacant(v) => {
                let s = sys::udp_bind(SocketAddr::new(self.addr, port)).ok().filter(|s| {
                    prepare_send_socket(s, self.addr).is_ok()
                        && sys::setsockopt_int(s.as_raw_fd(), libc::SOL_SOCKET, libc::SO_SNDBUF, 4 << 20).is_ok()
                        && sys::setsockopt_int(s.as_raw_fd(), libc::SOL_SOCKET, libc::SO_RCVBUF, 4096).is_ok()
                });
                v.insert(s.map(|sock| FlowSocket { sock, conn: None, tried: false }))
            }
        }
        .as_mut()?;
        let fd = f.sock.as_raw_fd();
        // UD and RD flows talk to many peers: each peer would see a sample of the socket's
        // Identification counter, which only a solving receiver could follow. (Such a flow
        // whose port a connected flow holds goes out from 4791, see `send_batch`.) A QP
        // connected anew to another peer gets its socket connected anew.
        if !one_peer && f.conn.is_some() {
            return None;
        }
        let moved = f.conn.is_some_and(|c| c.peer != dst);
        if self.connect && one_peer && (!f.tried || moved) {
            f.tried = true;
            let sink = self.sink.get_or_insert_with(|| open_sink(self.addr));
            f.conn = connect_flow(fd, self.addr, dst, sink.as_ref());
            let c = if f.conn.is_some() { &self.stats.tx_connected_flows } else { &self.stats.tx_unconnected_flows };
            bump(c, 1);
        }
        Some((fd, f.conn))
    }

    /// Records a flow's association; None dissolves it (the socket goes on unconnected).
    pub(super) fn set_conn(&mut self, port: u16, conn: Option<Conn>) {
        let Some(Some(f)) = self.ports.get_mut(&port) else { return };
        if f.conn.is_some() && conn.is_none() {
            tracing::debug!(port, "flow socket disconnected; Identification 0 from now on");
            let _ = sys::disconnect(f.sock.as_raw_fd());
            bump(&self.stats.tx_unconnected_flows, 1);
        }
        f.conn = conn;
    }

    /// Sends a transmit batch: the datagrams that leave through one socket (a flow socket, or
    /// the device's 4791 socket the other flows share) go through one sendmmsg, in batch order
    /// (flows are independent streams; each keeps its order), equal-size runs to one
    /// destination as GSO messages. A datagram of a flow without a socket of its own leaves
    /// from 4791, its ICRC re-sealed for that source port; so does every datagram from the
    /// alternate address, through that address's socket. With `mix`, a GSO message may hold
    /// requests and responses together (an answer and its ACKs, see `flush_tx`).
    pub(super) fn send_batch(&mut self, tx: &mut [u8], pending: &[Pending], mix: bool, sc: &mut SendScratch) {
        let shared = self.sock.as_raw_fd();
        let mut via = std::mem::take(&mut sc.via);
        via.clear();
        for p in pending {
            // The alternate address sends everything from its 4791 socket.
            let alt = self.alt.as_ref().filter(|_| p.alt).map(|a| a.sock.as_raw_fd());
            let own = if alt.is_none() { self.port_socket(p.port, p.dst, p.one_peer) } else { None };
            via.push(match own {
                Some(s) => s,
                None => {
                    let d = &mut tx[p.slot * MAX_DATAGRAM..p.slot * MAX_DATAGRAM + p.end];
                    let hl = p.start - UDP_HEADER_LEN;
                    d[hl..hl + 2].copy_from_slice(&ROCE_V2_PORT.to_be_bytes());
                    let _ = crate::wire::icrc::fill_datagram(d);
                    if alt.is_none() {
                        bump(&self.stats.tx_port_fallback, 1);
                    }
                    (alt.unwrap_or(shared), None)
                }
            });
        }
        // Grouped by socket, the sockets in the order they first appear in the batch (an ACK
        // from a flow socket stays ahead of a later request from 4791), batch order within:
        // no allocation. Each entry is (the socket's first datagram, the datagram).
        let mut order = std::mem::take(&mut sc.order);
        order.clear();
        order.extend(via.iter().enumerate().map(|(k, v)| (via.iter().position(|w| w.0 == v.0).unwrap_or(k), k)));
        order.sort_unstable();
        let mut run = std::mem::take(&mut sc.run);
        let mut i = 0;
        while i < order.len() {
            let first = order[i].0;
            let fd = via[first].0;
            let mut j = i + 1;
            while j < order.len() && order[j].0 == first {
                j += 1;
            }
            run.clear();
            run.extend(order[i..j].iter().map(|&(_, k)| pending[k]));
            let conn = via[first].1;
            let after = self.send_run(fd, conn, tx, &run, mix, sc);
            if conn.is_some() {
                self.set_conn(pending[first].port, after);
            }
            i = j;
        }
        (sc.via, sc.order, sc.run) = (via, order, run);
    }

    /// Sends one flow's run from `fd`, whose association is `conn`; returns the association
    /// after (None once it was given up).
    pub(super) fn send_run(
        &mut self,
        fd: RawFd,
        mut conn: Option<Conn>,
        tx: &mut [u8],
        run: &[Pending],
        mix: bool,
        sc: &mut SendScratch,
    ) -> Option<Conn> {
        let SendScratch { segs, msgs, sys: scratch, .. } = sc;
        segs.clear();
        msgs.clear();
        segs.extend(run.iter().map(|p| p.slot * MAX_DATAGRAM + p.start..p.slot * MAX_DATAGRAM + p.end));
        // Group into messages: equal-size runs to one destination (the last may be shorter), a
        // run of requests or of responses (both only with `mix`).
        let mut k = 0;
        while k < run.len() {
            let size = segs[k].len();
            let mut n = 1;
            let mut bytes = size;
            if self.gso {
                while k + n < run.len()
                    && n < GSO_MAX_SEGS
                    && run[k + n].dst == run[k].dst
                    && run[k + n].ip == run[k].ip
                    && (mix || run[k + n].response == run[k].response)
                    && segs[k + n - 1].len() == size
                    && segs[k + n].len() <= size
                    && bytes + segs[k + n].len() <= GSO_MAX_BYTES
                {
                    bytes += segs[k + n].len();
                    n += 1;
                }
            }
            let to = destination(conn, run[k].dst);
            msgs.push(sys::TxMsg { to, first: k, count: n, gso: (n > 1).then_some(size as u16), ip: run[k].ip });
            k += n;
        }
        stamp_identifications(&mut self.icrc.shifts, tx, run, msgs, conn.map(|c| c.next_id));
        let mut done = 0;
        let mut blocked_since: Option<Instant> = None;
        while done < msgs.len() {
            bump(&self.stats.tx_syscalls, 1);
            let r = sys::sendmmsg(fd, tx, segs, &msgs[done..], scratch);
            match r {
                Ok(n) => {
                    for m in &msgs[done..done + n] {
                        // The taps see what the kernel took, as it took it.
                        if !self.taps.is_empty() {
                            for q in &run[m.first..m.first + m.count] {
                                self.taps.sent(self.clock, &tx[q.slot * MAX_DATAGRAM..q.slot * MAX_DATAGRAM + q.end]);
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
                            stamp_identifications(&mut self.icrc.shifts, tx, run, &msgs[done..], Some(next));
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
                    stamp_identifications(&mut self.icrc.shifts, tx, run, &msgs[done..], conn.map(|c| c.next_id));
                }
                Err(e) if msgs[done].gso.is_some() && matches!(e.raw_os_error(), Some(libc::EIO | libc::EINVAL)) => {
                    // The path cannot segment: send this run's datagrams one by one from now on.
                    tracing::warn!(error = %e, "UDP GSO refused; disabled");
                    self.gso = false;
                    let m = msgs[done];
                    let singles = (0..m.count).map(|i| sys::TxMsg { first: m.first + i, count: 1, gso: None, ..m });
                    msgs.splice(done..done + 1, singles);
                    // The refusal came after the datagram was built: whether it used an
                    // Identification is unknown, so a connected flow goes on unconnected.
                    if conn.take().is_some() {
                        self.disconnect_run(fd, run, msgs, done);
                    }
                    stamp_identifications(&mut self.icrc.shifts, tx, run, &msgs[done..], conn.map(|c| c.next_id));
                }
                Err(e) => {
                    tracing::debug!(error = %e, "sendmmsg dropped a message");
                    bump(&self.stats.tx_errors, msgs[done].count as u64);
                    done += 1;
                    if conn.take().is_some() {
                        // Whether the refused datagram used an Identification is unknown:
                        // the flow goes on unconnected, from Identification 0.
                        self.disconnect_run(fd, run, msgs, done);
                        stamp_identifications(&mut self.icrc.shifts, tx, run, &msgs[done..], None);
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
    pub(super) fn disconnect_run(&mut self, fd: RawFd, run: &[Pending], msgs: &mut [sys::TxMsg], from: usize) {
        let _ = sys::disconnect(fd);
        for m in &mut msgs[from..] {
            m.to = Some(sys::CAddr::new(SocketAddr::new(run[m.first].dst, ROCE_V2_PORT)));
        }
    }

    /// Where the connected IPv4 socket `fd`'s Identification counter stands (one probe), if
    /// it can be learned now.
    pub(super) fn probe_next_id(&mut self, fd: RawFd) -> Option<u16> {
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
pub(super) fn open_sink(addr: IpAddr) -> Option<UdpSocket> {
    let s = sys::udp_bind(SocketAddr::new(addr, 0)).ok()?;
    sys::drop_all(s.as_raw_fd()).ok()?;
    Some(s)
}

/// Connects flow socket `fd` to `dst` (port 4791). IPv6 needs nothing more: its header has no
/// field the kernel chooses. IPv4 needs the Identification the kernel will number the socket's
/// datagrams from: two probes must get consecutive ones, else the socket is disconnected again
/// and the flow sends unconnected (Identification 0).
pub(super) fn connect_flow(fd: RawFd, local: IpAddr, dst: IpAddr, sink: Option<&UdpSocket>) -> Option<Conn> {
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
pub(super) fn destination(conn: Option<Conn>, dst: IpAddr) -> Option<sys::CAddr> {
    match conn {
        Some(c) if c.peer == dst => None,
        _ => Some(sys::CAddr::new(SocketAddr::new(dst, ROCE_V2_PORT))),
    }
}

/// Gives every IPv4 datagram of `msgs` the Identification it will leave with and re-seals its
/// ICRC for it: on a connected socket message i gets `next + i` (from the socket's counter), on
/// an unconnected one 0; segment k of a GSO message gets its message's + k.
pub(super) fn stamp_identifications(
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
pub(super) fn set_identification(shifts: &mut verify::Shifts, d: &mut [u8], id: u16) {
    let n = d.len();
    let hdr = 20 + UDP_HEADER_LEN;
    let old = Ipv4Header::new_unchecked(&d[..]).identification();
    if n < hdr + BTH_LEN + ICRC_LEN || id == old {
        return;
    }
    let delta = verify::id_effect(shifts, n - hdr, old ^ id, true);
    crate::wire::icrc::xor_trailer(d, delta);
    let mut h = Ipv4Header::new_unchecked(d);
    h.set_identification(id);
    h.fill_checksum();
}

/// The most segment sizes whose ICRC [`superpacket_segment`] checks.
const MAX_SEGMENT_TRIES: usize = 64;

/// The segment size of a superpacket that a raw socket took in whole (`dgram`, from its
/// IPv4 header; `header` a copy of its IPv4 and UDP headers, rewritten): segments of one size
/// (but the last) under copies of that header with Identifications counting up. Candidate
/// sizes (BTH through ICRC: whole words, as every packet is) are those at which a second BTH
/// with the first's P_Key and destination QP follows; the first whose segment 0 verifies
/// under its own header wins. At most [`MAX_SEGMENT_TRIES`] candidates are checksummed: an
/// honest superpacket's size is almost always its first (a payload rarely repeats those five
/// bytes at a word boundary), while a datagram of zeros made every size a candidate, a CRC
/// over each prefix of itself: about 9.5 MB checksummed for 4.4 KB received.
fn superpacket_segment(dgram: &[u8], header: &mut [u8; 28]) -> Option<usize> {
    const HDR: usize = 20 + UDP_HEADER_LEN;
    let id0 = Ipv4Header::new_unchecked(dgram).identification();
    segment_candidates(dgram).find(|&s| {
        let b = HDR + s;
        fix_v4_header(header, s, id0);
        crate::wire::icrc::verify(header, &dgram[HDR..b - ICRC_LEN], &dgram[b - ICRC_LEN..b]).is_ok()
    })
}

/// The sizes [`superpacket_segment`] checks, smallest first, at most [`MAX_SEGMENT_TRIES`].
fn segment_candidates(dgram: &[u8]) -> impl Iterator<Item = usize> + '_ {
    const HDR: usize = 20 + UDP_HEADER_LEN;
    let body = dgram.len().saturating_sub(HDR + BTH_LEN);
    let bth_key = |at: usize| [dgram[at + 2], dgram[at + 3], dgram[at + 5], dgram[at + 6], dgram[at + 7]];
    let first = (body > 0).then(|| bth_key(HDR));
    (BTH_LEN + ICRC_LEN..=body.min(MAX_DATAGRAM))
        .step_by(4)
        .filter(move |&s| Some(bth_key(HDR + s)) == first)
        .take(MAX_SEGMENT_TRIES)
}

/// Sets Total Length, Identification and the header checksum of a 28-byte IPv4 + UDP header
/// for a UDP payload of `payload` bytes.
pub(super) fn fix_v4_header(h: &mut [u8; 28], payload: usize, id: u16) {
    UdpHeader::new_unchecked(&mut h[IPV4_HEADER_LEN..]).set_len((UDP_HEADER_LEN + payload) as u16);
    let mut ip = Ipv4Header::new_unchecked(&mut h[..]);
    ip.set_total_len((IPV4_HEADER_LEN + UDP_HEADER_LEN + payload) as u16);
    ip.set_identification(id);
    ip.fill_checksum();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pending(slot: usize, port: u16, response: bool) -> Pending {
        let dst = IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 9));
        Pending {
            slot,
            start: 0,
            end: 0,
            dst,
            port,
            response,
            one_peer: true,
            xrc: false,
            alt: false,
            ip: Default::default(),
        }
    }

    /// A superpacket's segment size is found by search: two real segments give the first's
    /// size, also when the payload holds a copy of the BTH's key bytes at a word boundary; a
    /// datagram of zeros, where every word boundary looks like the next segment of the same
    /// QP, gives none, after at most `MAX_SEGMENT_TRIES` checksums (it was one per word).
    #[test]
    fn a_superpackets_segment_size_is_searched_within_bounds() {
        use crate::wire::bth::BthRepr;
        use crate::wire::opcode::Opcode;
        use crate::wire::packet::PacketRepr;
        use crate::wire::psn::Psn;
        use crate::wire::roce::{IpRepr, Ipv4Repr, RoceRepr, UdpChecksum, UdpRepr};
        let ip = |id| {
            IpRepr::V4(Ipv4Repr { identification: id, ..Ipv4Repr::new([10, 0, 0, 1].into(), [10, 0, 0, 2].into()) })
        };
        let mut payload = [7u8; 64];
        // Bytes 2, 3 and 5..8 of a BTH are its P_Key and destination QP: this copy at payload
        // offset 8 sits where the next BTH after a 20-byte segment would, a false candidate.
        payload[8..16].copy_from_slice(&[0, 0, 0xff, 0xff, 0, 0, 0, 0x42]);
        let datagram = |psn, id| {
            let udp = UdpRepr::for_qp(0x11, UdpChecksum::Zero);
            let bth = BthRepr::new(Opcode::RcSendOnly, 0xffff, 0x42, Psn::new(psn));
            let packet = PacketRepr { payload: &payload, ..PacketRepr::new(bth) };
            let mut buf = vec![0u8; 256];
            let n = RoceRepr { ip: ip(id), udp, packet }.emit(&mut buf).unwrap();
            buf.truncate(n);
            buf
        };
        let (seg0, seg1) = (datagram(5, 9), datagram(6, 10));
        let mut superpacket = seg0.clone();
        superpacket.extend_from_slice(&seg1[28..]);
        assert_eq!(segment_candidates(&superpacket).take(2).collect::<Vec<_>>(), [20, seg0.len() - 28]);
        let mut header = [0u8; 28];
        header.copy_from_slice(&superpacket[..28]);
        assert_eq!(superpacket_segment(&superpacket, &mut header), Some(seg0.len() - 28));

        let mut zeros = datagram(5, 0)[..28].to_vec();
        zeros.resize(4400, 0);
        assert_eq!(segment_candidates(&zeros).count(), MAX_SEGMENT_TRIES);
        header.copy_from_slice(&zeros[..28]);
        assert_eq!(superpacket_segment(&zeros, &mut header), None);
        assert_eq!(segment_candidates(&zeros[..28 + BTH_LEN]).count(), 0, "no room for a segment");
    }

    /// Rule PKT-ACK-13: an answer goes before the ACK its QP owes, but never before what
    /// another QP queued first (a DREQ on QP1 behind the ACK of the RC QP's last message).
    #[test]
    fn requests_go_first_within_their_flow_only() {
        let mut sc = SendScratch::default();
        let mut batch =
            vec![pending(0, 100, true), pending(1, 200, false), pending(2, 100, false), pending(3, 100, true)];
        requests_first(&mut batch, &mut sc);
        let slots: Vec<usize> = batch.iter().map(|p| p.slot).collect();
        assert_eq!(slots, [2, 0, 3, 1]);
    }

    /// XRC's datagrams to one peer are one conversation: an initiator's request goes before a
    /// target's ACK queued ahead of it (another QP's, another source port), as RC's answer goes
    /// before its own QP's ACK; RC's flows keep their order.
    #[test]
    fn an_xrc_initiators_request_goes_before_its_targets_ack() {
        let mut sc = SendScratch::default();
        let xrc = |slot, port, response| Pending { xrc: true, ..pending(slot, port, response) };
        let mut batch = vec![xrc(0, 100, true), pending(1, 300, true), xrc(2, 200, false), pending(3, 400, false)];
        requests_first(&mut batch, &mut sc);
        let slots: Vec<usize> = batch.iter().map(|p| p.slot).collect();
        assert_eq!(slots, [2, 0, 1, 3]);
    }
}
