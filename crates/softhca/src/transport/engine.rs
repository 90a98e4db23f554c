//! The device-level sans-IO interface that links drive: datagrams in, datagrams out, timers.
//! Time is an input in nanoseconds since an epoch the driver chooses (virtual on the sim link,
//! monotonic on the UDP link). Inbound packets pass header validation here (PKT-VAL-1) before
//! the responder or the completer sees them.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use crate::transport::wqe::{SendFlags, SendWqe, WrOpcode};
use crate::types::{AhAttr, Gid, QpState, QpType, WcStatus, GSI_QKEY, GSI_QPN};
use crate::wire::aeth::Syndrome;
use crate::wire::icrc;
use crate::wire::ip::UDP_HEADER_LEN;
use crate::wire::opcode::{Direction, Operation, Position, ServiceType, Suffix};
use crate::wire::packet::{pad_for, BTH_LEN, ICRC_LEN};
use crate::wire::psn::Psn;
use crate::wire::roce::{self, IpRepr, Ipv4Repr, Ipv6Repr, RoceDatagram, RoceRepr, UdpRepr};
use crate::wire::{
    AckTemplate, AethRepr, AtomicEthRepr, BthRepr, DethRepr, IethRepr, ImmDtRepr, Opcode, PacketRepr, RequestHead,
    RethRepr, UdpChecksum, WireError, XrcEthRepr,
};

use super::channel::Sent;
use super::completer::{self, Response};
use super::hca::Hca;
use super::mcast::{Groups, MULTICAST_QPN};
use super::qp::{QpCore, QpInner, QpTable};
use super::rd::eec::EecInner;
use super::requester;
use super::responder::{self, Request};

/// The largest datagram the device emits: IPv6 + UDP + BTH + the largest extended headers +
/// 4096 bytes of payload + ICRC, rounded up.
pub const MAX_DATAGRAM: usize = 4096 + 256;

/// A statistics counter. Incremented with a plain load and store, not an atomic
/// read-modify-write (a lock-prefixed add per count was 4% of the sim link's time per
/// message: `softhca perf send --link sim -s 8 -t 4`, six interleaved pairs, 1.033 -> 1.074
/// M messages/s): a device's counters move inside its engine calls, which every link makes one
/// at a time (the driver's port lock, the sim fabric's one thread), and a QP's under its lock
/// too. A count made outside them (Modify QP refusing a migration) or by a program calling
/// one device's sans-IO entry points from several threads at once may be lost against a
/// concurrent one: these are statistics, never state.
#[derive(Debug, Default)]
pub(crate) struct Counter(AtomicU64);

/// Adds `n` to a statistic that one holder at a time writes (the engine's calls, a link's
/// turn): a plain load and store, no locked read-modify-write on the hot path (see
/// [`Counter`]); readers see a recent value.
pub(crate) fn bump_plain(c: &AtomicU64, n: u64) {
    c.store(c.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
}

impl Counter {
    pub fn inc(&self) {
        bump_plain(&self.0, 1);
    }

    fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// The counters, listed once: the public snapshot type, the live atomic `Stats`, the snapshot
/// and the field-wise sum and difference all come from this one list.
macro_rules! counters {
    ($($(#[$doc:meta])* $name:ident,)*) => {
        /// Per-device and per-QP counters (DESIGN rule 7). On a QP, `rx_dropped` and
        /// `rx_bad_icrc` stay 0: a packet dropped before it was matched to a QP belongs to no QP.
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        pub struct DeviceCounters {
            $($(#[$doc])* pub $name: u64,)*
        }

        #[derive(Debug, Default)]
        pub(crate) struct Stats {
            $(pub $name: Counter,)*
        }

        impl Stats {
            pub(crate) fn snapshot(&self) -> DeviceCounters {
                DeviceCounters { $($name: self.$name.get(),)* }
            }
        }

        // Sums over devices, and differences between two snapshots of one (counters only grow).
        impl std::ops::Add for DeviceCounters {
            type Output = DeviceCounters;
            fn add(self, o: DeviceCounters) -> DeviceCounters {
                DeviceCounters { $($name: self.$name.saturating_add(o.$name),)* }
            }
        }

        impl std::ops::Sub for DeviceCounters {
            type Output = DeviceCounters;
            fn sub(self, o: DeviceCounters) -> DeviceCounters {
                DeviceCounters { $($name: self.$name.saturating_sub(o.$name),)* }
            }
        }
    };
}

counters! {
    tx_packets,
    rx_packets,
    /// Inbound datagrams dropped: malformed, bad ICRC, unknown QP, header violations.
    rx_dropped,
    rx_bad_icrc,
    /// Times a requester went back (go-back-N rounds after a NAK, an implied NAK, a timeout or
    /// an RNR wait).
    retransmits,
    /// Request packets sent again.
    retransmitted_packets,
    rnr_naks_sent,
    rnr_naks_received,
    seq_naks_sent,
    seq_naks_received,
    implied_naks,
    timeouts,
    /// Times an RC requester held a Send or Write with Immediate back for want of the
    /// responder's end-to-end credits (IBA 9.7.7.2).
    credit_waits,
    pkey_violations,
    qkey_violations,
    /// Packets dropped as migration requests the QP could not follow (its alternate path
    /// loaded but not armed: Path Migration Request Error).
    migrations_refused,
}

/// How many packets in a row a QP sends in its transmit turn before the next QP's turn.
/// One per turn made every packet of a many-QP load a visit to a QP the cache had lost:
/// in a turn of several, the QP's state stays hot, its packets reach the responder together
/// (which then coalesces its ACKs, PKT-ACK-4) and their completions come together, and on
/// UDP a turn's packets leave as one GSO message. Eight keeps a turn short beside other
/// QPs': 32 KiB at 4 KiB MTU, some 13 µs at 2.5 GB/s.
const TURN_PACKETS: u32 = 8;

/// The QPs that may have something to send, in turn order, and how many packets the QP at
/// the front has sent in its current turn.
#[derive(Default)]
struct ReadyList {
    qpns: VecDeque<u32>,
    streak: u32,
}

/// A [`ReadyList`] and whether it lists any QP, written under its lock: a busy-polled device
/// is asked for packets on every poll, and an idle one answers from the flag without the
/// lock. A flag read false while a QP is being listed is no lost wake-up: whoever lists a QP
/// rings the doorbell, or runs in a turn under the port's lock, after listing it, and the
/// flush that follows (theirs, or the port holder's on seeing the ring) reads it after.
#[derive(Default)]
struct Ready {
    list: Mutex<ReadyList>,
    any: AtomicBool,
}

impl Ready {
    fn lock(&self) -> std::sync::MutexGuard<'_, ReadyList> {
        self.list.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// What a QP's transmit turn came to (see [`unlist`]).
#[derive(Clone, Copy, PartialEq, Eq)]
enum TurnEnd {
    /// It sent a packet: it keeps the turn for up to [`TURN_PACKETS`] packets, then goes to
    /// the back of the list.
    Sent,
    /// It stays listed without having sent (an RD QP waiting on its EEC): to the back now.
    Pass,
    /// Nothing to send, or gone: off the list.
    Idle,
}

/// Ends or continues `qpn`'s turn on the ready list (see [`TurnEnd`]); a lone QP stays
/// where it is. It is nearly always at the front.
fn unlist(list: &Ready, qpn: u32, end: TurnEnd) {
    let mut ready = list.lock();
    if end != TurnEnd::Idle {
        ready.streak += 1;
        let keeps = end == TurnEnd::Sent && ready.streak < TURN_PACKETS && ready.qpns.front() == Some(&qpn);
        if ready.qpns.len() <= 1 || keeps {
            return;
        }
    }
    ready.streak = 0;
    if let Some(at) = ready.qpns.iter().position(|&q| q == qpn) {
        // Nearly always the head (the QP whose turn it was): popped, not shifted.
        if at == 0 {
            ready.qpns.pop_front();
        } else {
            ready.qpns.remove(at);
        }
        if end != TurnEnd::Idle {
            ready.qpns.push_back(qpn);
        }
        list.any.store(!ready.qpns.is_empty(), Ordering::Relaxed);
    }
}

/// Asks the CPU to bring the QP whose turn comes next toward the cache while this turn runs:
/// with thousands of QPs taking turns, a QP's first touch (its lock word) was the largest
/// single cost of a turn (10,000 QPs on the sim link, nine interleaved pairs: median 1.07x
/// message rate; level with one QP). Only the QP's own allocation is prefetched: anything it
/// points to would have to be read first.
fn prefetch_qp(q: &Arc<QpInner>) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let p = Arc::as_ptr(q).cast::<i8>();
        for off in (0..std::mem::size_of::<QpInner>()).step_by(64) {
            // SAFETY: a prefetch is a hint that never faults or changes memory; the address
            // lies inside the QP's live allocation (which `q` keeps alive).
            unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(off)) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = q;
}

/// PKT-VAL-8, PKT-VAL-14: equal low 15 bits, not the invalid P_Key, and at least one full
/// member.
pub fn pkey_match(a: u16, b: u16) -> bool {
    let (la, lb) = (a & 0x7FFF, b & 0x7FFF);
    la != 0 && la == lb && (a | b) & 0x8000 != 0
}

fn service_of(t: QpType) -> Option<ServiceType> {
    match t {
        QpType::Rc => Some(ServiceType::Rc),
        QpType::Uc => Some(ServiceType::Uc),
        QpType::Ud => Some(ServiceType::Ud),
        QpType::Rd => Some(ServiceType::Rd),
        QpType::XrcSend | QpType::XrcRecv => Some(ServiceType::Xrc),
        _ => None,
    }
}

/// Whose timer an entry of the [`TimerQueue`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum TimerOwner {
    Qp(u32),
    Eec(u32),
}

/// The device's ACK and RNR timers in one queue ordered by deadline, so that `poll_timeout`
/// is one load and `handle_timeout` visits only the QPs and EECs whose timer is due.
///
/// Entries are never removed from the middle. Each owner remembers the deadline of its
/// earliest entry (`queued`, kept under the owner's own lock) and queues a new one only for an
/// earlier deadline: a timer re-armed later (each ACK that makes progress does that) leaves its
/// entry to fire early, find nothing due and queue the real deadline then; one disarmed leaves
/// a stale entry that fires and does nothing. So an owner has at most a few entries, and
/// arming costs no allocation once the queue has grown to the device's working set.
///
/// Lock order: an owner's lock, then the queue's; `handle_timeout` pops under the queue's lock
/// alone and releases it before taking the owner's.
pub(crate) struct TimerQueue {
    heap: Mutex<BinaryHeap<Reverse<(u64, TimerOwner)>>>,
    /// The earliest deadline queued (`u64::MAX`: none), stored under `heap`'s lock.
    next: AtomicU64,
}

impl Default for TimerQueue {
    fn default() -> Self {
        TimerQueue { heap: Mutex::default(), next: AtomicU64::new(u64::MAX) }
    }
}

impl TimerQueue {
    /// Queues `owner`'s deadline `at` unless its entry `queued` fires no later.
    pub fn schedule(&self, owner: TimerOwner, queued: &mut Option<u64>, at: u64) {
        if queued.is_some_and(|q| q <= at) {
            return;
        }
        *queued = Some(at);
        let mut heap = self.heap.lock().unwrap_or_else(|e| e.into_inner());
        heap.push(Reverse((at, owner)));
        self.next.fetch_min(at, Ordering::AcqRel);
    }

    /// The earliest deadline queued, if any.
    pub fn next(&self) -> Option<u64> {
        let next = self.next.load(Ordering::Acquire);
        (next != u64::MAX).then_some(next)
    }

    /// Takes the earliest entry if it is due at `now`.
    fn pop_due(&self, now: u64) -> Option<(u64, TimerOwner)> {
        if self.next.load(Ordering::Acquire) > now {
            return None;
        }
        let mut heap = self.heap.lock().unwrap_or_else(|e| e.into_inner());
        let due = match heap.peek() {
            Some(&Reverse((t, owner))) if t <= now => {
                heap.pop();
                Some((t, owner))
            }
            _ => None,
        };
        let next = heap.peek().map_or(u64::MAX, |&Reverse((t, _))| t);
        self.next.store(next, Ordering::Release);
        due
    }

    fn len(&self) -> usize {
        self.heap.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

/// A connected QP's flow, announced to the link when the QP's path is set (Init → RTR), so
/// that a link that prepares something per flow does it then (as Linux rxe resolves a QP's
/// route at Modify QP), not between writing the flow's first packet and sending it: that
/// packet's Local ACK timer runs from its writing, and its peer waits. The UDP link opens,
/// connects and probes a flow's socket there (see `link::udp`): a fresh connection's first
/// 8-byte Send took 107-177 µs one way, 56-78 µs with the socket ready (`softhca perf send
/// --lat --iters 1` over UDP, alternating runs, 2026-11-30). A path set later (SQD→RTS, a
/// migration) is not announced: its flow is prepared when its first packet leaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flow {
    /// The QP's address and the peer's, as GIDs (IPv4 addresses mapped, PKT-ROCE-3).
    pub src_gid: std::net::Ipv6Addr,
    pub dst_gid: std::net::Ipv6Addr,
    /// The UDP source port of the QP's datagrams.
    pub src_port: u16,
}

/// What the core tells a link about a flow ([`Context::take_flows`](crate::verbs::Context::take_flows)):
/// it opened (Init → RTR) or closed (the QP reset or destroyed, after the datagrams it still
/// owed were queued). Each `Closed` follows the `Opened` of the same flow, so a link can count
/// a source port's live flows and free what it holds for the port when none is left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlowChange {
    Opened(Flow),
    Closed(Flow),
}

/// The most opened flows waiting for the link (a device making QPs faster than its link
/// turns: beyond these the first packet prepares its flow). A flow's close always waits: it
/// follows an open that was queued, so closes are bounded by the QPs.
pub const MAX_FLOWS_QUEUED: usize = 4096;

/// The transport's state of one device, held by value by the device above (DESIGN rule 1):
/// its QPs and EECs, the transmit turns, the counters, the timer hint, and the datagrams
/// destroyed QPs still owed. A step (`receive`, `transmit`, `handle_timeout`) takes the
/// device's narrow interface, [`Hca`], for everything else.
#[derive(Default)]
pub(crate) struct Engine {
    pub qps: RwLock<QpTable>,
    pub eecs: RwLock<BTreeMap<u32, Arc<EecInner>>>,
    /// EECs in `eecs` (kept by `add_eec` and `remove_eec`): with none, the RD turn costs no
    /// lock.
    live_eecs: AtomicU32,
    /// The next EEC to get a transmit turn.
    pub eec_cursor: AtomicU32,
    /// Whether the RD channels go first at the next transmit.
    pub rd_turn: AtomicBool,
    /// The QPs that may have something to send, in turn order (see [`Engine::wake`]).
    ready: Ready,
    /// The same for the Raw Ethertype QPs, whose packets are Ethernet frames: they leave by
    /// [`Engine::transmit_frame`], not among the datagrams.
    frames_ready: Ready,
    /// The Raw QPs, which take the inbound raw packets (`receive_raw`).
    raw: RwLock<Vec<(u32, QpType)>>,
    /// The multicast groups and their UD QPs (`mcast`), read only for multicast packets (boxed:
    /// the engine's hot fields keep their lines).
    pub groups: Box<RwLock<Groups>>,
    /// How many of them are Raw Ethertype QPs and Raw IPv6 QPs: a link listens for their
    /// packets only while there are.
    frame_qps: AtomicU32,
    ipv6_qps: AtomicU32,
    /// How many UD QPs a consumer made (the GSI not counted): a link that rebuilds inbound IP
    /// headers asks the kernel for their TOS and TTL only while there are (`has_ud_qps`).
    ud_qps: AtomicU32,
    pub stats: Stats,
    /// Every armed ACK and RNR timer of the device's QPs and EECs.
    pub timers: TimerQueue,
    /// Datagrams destroyed QPs still owed (their ACKs), sent before anything else.
    orphans: Mutex<VecDeque<Vec<u8>>>,
    orphaned: AtomicBool,
    /// The link sends what `transmit` wrote later, in batches, and says so with `sent`: a UC or
    /// UD send WQE completes then, never before its datagram left (a program that exits on
    /// the completion must not lose it). Off: it completes as its last packet is written.
    pub defer_unreliable: AtomicBool,
    /// A QP's ACK lets its own requests go first (up to `channel::ACK_WAIT` packets): for a
    /// link whose receiver takes datagrams in as they arrive, one by one (see
    /// [`Context::acks_after_requests`](crate::verbs::Context::acks_after_requests)). Off: a
    /// QP's responses go before its requests.
    pub acks_after_requests: AtomicBool,
    /// The link prepares each connected QP's flow when the QP's path is set
    /// ([`Engine::announce_flow`]); off, nothing is queued.
    pub announce_flows: AtomicBool,
    /// The flows announced and not yet taken by the link, and whether there are any (read
    /// without the lock by every flush).
    flows: Mutex<Vec<FlowChange>>,
    flows_any: AtomicBool,
    /// QPs with a UC/UD WQE awaiting the link's `sent`.
    awaiting_wire: Mutex<Vec<u32>>,
    /// `awaiting_wire` is not empty: written under its lock, read without it by `sent`, which
    /// the link calls after every flush; a device sending only RC has nothing there and takes
    /// no lock.
    awaiting_any: AtomicBool,
}

impl Engine {
    /// The link sent every datagram `transmit` wrote so far: the UC and UD WQEs whose last
    /// packet was among them complete (see `defer_unreliable`). Its caller
    /// (`Context::sent`) asks [`Engine::awaits_wire`] first, so that a flush with none opens
    /// no step; called without, it finds the list empty and completes nothing.
    pub fn sent(&self) {
        let mut qpns = std::mem::take(&mut *self.awaiting_wire.lock().unwrap_or_else(|e| e.into_inner()));
        self.complete_sent(&qpns);
        // The list's allocation goes back for the next flush, unless one was pushed meanwhile.
        qpns.clear();
        let mut awaiting = self.awaiting_wire.lock().unwrap_or_else(|e| e.into_inner());
        // Cleared once the completions are written, not before: `Context::unsent` must not
        // find nothing pending while they are still on their way (Release: they are seen by
        // whoever sees the flag clear).
        self.awaiting_any.store(!awaiting.is_empty(), Ordering::Release);
        if awaiting.capacity() == 0 {
            *awaiting = qpns;
        }
    }

    /// Whether a UC or UD WQE's datagram is written and not yet sent, or sent and its
    /// completion not yet written ([`Engine::sent`]); for threads other than the link's.
    pub fn unsent_unreliable(&self) -> bool {
        self.awaiting_any.load(Ordering::Acquire)
    }

    /// Whether a UC or UD WQE waits for [`Engine::sent`]: most flushes have none (RC, or no
    /// deferral), and the link asks before opening a step for it.
    pub fn awaits_wire(&self) -> bool {
        // Relaxed: the WQEs a flush sent were pushed by the `transmit` calls of the same turn
        // of the link (a link's turns run one at a time, under its driver's lock).
        self.awaiting_any.load(Ordering::Relaxed)
    }

    fn complete_sent(&self, qpns: &[u32]) {
        let qps = self.qps.read().unwrap_or_else(|e| e.into_inner());
        for &qpn in qpns {
            let Some(q) = qps.get(qpn) else { continue };
            let mut core = q.core.lock().unwrap_or_else(|e| e.into_inner());
            let mut any = false;
            for i in 0..core.req.started {
                if let Some(w) = core.sq.get_mut(i) {
                    if w.tx.awaiting_wire {
                        w.tx.awaiting_wire = false;
                        w.tx.status = Some(WcStatus::Success);
                        any = true;
                    }
                }
            }
            if any {
                completer::retire(q, &mut core);
            }
        }
    }

    /// Feeds one inbound RoCEv2 datagram, from its IP header on. Anything malformed is
    /// dropped and counted, never trusted (PKT-VAL-2, PKT-ROCE-10). `verify_icrc` false is for
    /// a link that has already verified the ICRC over the header the datagram really had.
    pub fn receive(&self, dev: &dyn Hca, now: u64, datagram: &[u8], verify_icrc: bool) {
        self.stats.rx_packets.inc();
        if roce::is_raw_ipv6(datagram) {
            // Not RoCE: an IPv6 datagram for the Raw IPv6 QPs, if there are any.
            if !self.receive_raw(QpType::RawIpv6, datagram) {
                self.stats.rx_dropped.inc();
            }
            return;
        }
        let parsed = if verify_icrc { roce::parse_ip(datagram) } else { roce::parse_ip_unverified(datagram) };
        match parsed {
            Ok(d) => {
                if !deliver(self, dev, now, &d, datagram) {
                    self.stats.rx_dropped.inc();
                }
            }
            Err(e) => {
                if matches!(e, WireError::BadIcrc { .. }) {
                    self.stats.rx_bad_icrc.inc();
                }
                self.stats.rx_dropped.inc();
            }
        }
    }

    /// Warms the QP an inbound datagram is for (see [`prefetch_qp`]): a link holding the next
    /// datagram while it delivers this one calls it, so that with thousands of QPs the next
    /// QP's first lines are on their way while this packet is handled (10,000 QPs on the sim
    /// link against one, six interleaved pairs: median 0.81x -> 0.85x message rate). Reads
    /// only the BTH's DestQP and the table slot it names ([`QpTable::slot`], not the QP's
    /// number, which is on the line being fetched); nothing is checked or changed.
    pub fn prefetch_dest(&self, datagram: &[u8]) {
        let Some(qpn) = roce::peek_dest_qp(datagram) else { return };
        if let Some(q) = self.qps.read().unwrap_or_else(|e| e.into_inner()).slot(qpn) {
            prefetch_qp(q);
        }
    }

    /// Writes the next outbound datagram (IP header on, ICRC included) into `buf`, which holds
    /// at least [`MAX_DATAGRAM`] bytes, and returns its length; `None` when nothing is ready.
    /// QPs take turns, and a QP's responses go before its requests.
    pub fn transmit(&self, dev: &dyn Hca, now: u64, buf: &mut [u8]) -> Option<usize> {
        if let Some(len) = self.take_orphan(buf) {
            self.stats.tx_packets.inc();
            return Some(len);
        }
        // The RD channels and the QPs take turns going first, so that neither starves the other.
        let rd_first = self.has_eecs() && !self.rd_turn.fetch_xor(true, Ordering::Relaxed);
        if rd_first {
            if let Some(len) = super::rd::transmit(dev, now, buf) {
                self.stats.tx_packets.inc();
                return Some(len);
            }
        }
        if let Some(len) = self.transmit_qps(&self.ready, now, buf) {
            return Some(len);
        }
        if rd_first {
            return None;
        }
        let len = super::rd::transmit(dev, now, buf)?;
        self.stats.tx_packets.inc();
        Some(len)
    }

    /// Whether [`Engine::transmit`] may find something to send; false answers from flags
    /// alone (no lock, see [`Ready`]), as a busy-polled idle device is asked on every poll.
    pub fn may_transmit(&self) -> bool {
        self.ready.any.load(Ordering::Relaxed) || self.orphaned.load(Ordering::Acquire) || self.has_eecs()
    }

    /// Writes the next outbound Ethertype frame of a Raw Ethertype QP (destination MAC on, no
    /// FCS) into `buf` (at least [`MAX_DATAGRAM`] bytes) and returns its length; `None` when
    /// none is ready. Only a link that carries raw packets has such QPs (`DeviceAttr`).
    pub fn transmit_frame(&self, now: u64, buf: &mut [u8]) -> Option<usize> {
        if !self.has_raw_qps(QpType::RawEthertype) {
            return None; // no lock taken: most devices have no such QP
        }
        self.transmit_qps(&self.frames_ready, now, buf)
    }

    /// Feeds one inbound Ethernet frame that carries no RoCE packet of this device (the link
    /// decides) to the Raw Ethertype QPs.
    pub fn receive_frame(&self, frame: &[u8]) {
        self.stats.rx_packets.inc();
        if !self.receive_raw(QpType::RawEthertype, frame) {
            self.stats.rx_dropped.inc();
        }
    }

    /// Hands a raw packet to every Raw QP of `qp_type` that takes it (each has its own
    /// receive queue, as every raw QP of a port sees the port's raw traffic). False when none
    /// did.
    fn receive_raw(&self, qp_type: QpType, packet: &[u8]) -> bool {
        // `qps` before `raw`, as Create QP takes them (it registers a Raw QP under `qps`).
        let qps = self.qps.read().unwrap_or_else(|e| e.into_inner());
        let raw = self.raw.read().unwrap_or_else(|e| e.into_inner());
        let mut taken = false;
        for &(qpn, _) in raw.iter().filter(|(_, t)| *t == qp_type) {
            let Some(qp) = qps.get(qpn) else { continue };
            let mut core = qp.core.lock().unwrap_or_else(|e| e.into_inner());
            taken |= responder::on_raw(qp, &mut core, packet);
        }
        taken
    }

    /// Registers a Raw QP; false (nothing registered) when `max` of its type exist already, or
    /// when it is the first of its type and `listen(qp_type, true)`, which starts the link
    /// hearing such packets, fails. `listen` runs under the list's lock, so that the link
    /// hears of the firsts and lasts in the order they happened.
    pub fn add_raw(&self, qpn: u32, qp_type: QpType, max: usize, listen: impl FnOnce(QpType, bool) -> bool) -> bool {
        let mut raw = self.raw.write().unwrap_or_else(|e| e.into_inner());
        // The count moves only under the list's write lock: it is the list's, read without it.
        let Some(n) = self.raw_count(qp_type).filter(|n| (n.load(Ordering::Relaxed) as usize) < max) else {
            return false;
        };
        if n.load(Ordering::Relaxed) == 0 && !listen(qp_type, true) {
            return false;
        }
        raw.push((qpn, qp_type));
        n.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// Unregisters a Raw QP; `listen(qp_type, false)` when it was the last of its type.
    pub fn remove_raw(&self, qpn: u32, listen: impl FnOnce(QpType, bool) -> bool) {
        let mut raw = self.raw.write().unwrap_or_else(|e| e.into_inner());
        if let Some(at) = raw.iter().position(|(q, _)| *q == qpn) {
            let qp_type = raw.remove(at).1;
            if let Some(n) = self.raw_count(qp_type) {
                if n.fetch_sub(1, Ordering::Relaxed) == 1 {
                    listen(qp_type, false);
                }
            }
        }
    }

    fn raw_count(&self, qp_type: QpType) -> Option<&AtomicU32> {
        match qp_type {
            QpType::RawEthertype => Some(&self.frame_qps),
            QpType::RawIpv6 => Some(&self.ipv6_qps),
            _ => None,
        }
    }

    /// QP `qpn` of `qp_type` was made (`true`) or destroyed: counted if it is a consumer's UD
    /// QP (see `ud_qps`; the GSI is the device's own).
    pub fn count_ud(&self, qp_type: QpType, qpn: u32, made: bool) {
        if qp_type != QpType::Ud || qpn == GSI_QPN {
            return;
        }
        if made {
            self.ud_qps.fetch_add(1, Ordering::Relaxed);
        } else {
            self.ud_qps.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// An RC or UC QP's path was set (Init → RTR): its flow goes to the link, if it asked for
    /// them (`announce_flows`). At most [`MAX_FLOWS_QUEUED`] wait; past that, a flow is
    /// prepared by the link when its first packet leaves, as without the announcement.
    pub(crate) fn announce_flow(&self, q: &QpInner, core: &mut QpCore) {
        if !self.announce_flows.load(Ordering::Relaxed) || !q.qp_type.is_connected() {
            return;
        }
        let Some(ip) = route(q, core) else { return };
        let flow = Flow { src_gid: ip.src_gid(), dst_gid: ip.dst_gid(), src_port: roce::udp_src_port(q.qpn) };
        let mut flows = self.flows.lock().unwrap_or_else(|e| e.into_inner());
        if flows.len() < MAX_FLOWS_QUEUED {
            flows.push(FlowChange::Opened(flow));
            self.flows_any.store(true, Ordering::Release);
            core.flow = Some(flow);
        }
    }

    /// A QP's announced flow (`QpCore::flow`, taken) closes: the QP was reset or destroyed.
    /// Called once the datagrams the QP still owes are queued ([`Engine::orphan`]), so that
    /// the link sees them before the close and sends them before it lets go of the flow.
    pub(crate) fn close_flow(&self, flow: Option<Flow>) {
        let Some(flow) = flow else { return };
        let mut flows = self.flows.lock().unwrap_or_else(|e| e.into_inner());
        flows.push(FlowChange::Closed(flow));
        self.flows_any.store(true, Ordering::Release);
    }

    /// Moves the flow changes since the last call into `out` (emptied first), in the order
    /// they happened. No lock is taken while none waits: the link asks at every flush.
    #[inline]
    pub fn take_flows(&self, out: &mut Vec<FlowChange>) {
        out.clear();
        if !self.flows_any.load(Ordering::Acquire) {
            return;
        }
        let mut flows = self.flows.lock().unwrap_or_else(|e| e.into_inner());
        std::mem::swap(&mut *flows, out);
        self.flows_any.store(false, Ordering::Release);
    }

    /// Whether the device has a consumer's UD QP, whose receives show the IP header.
    pub fn has_ud_qps(&self) -> bool {
        self.ud_qps.load(Ordering::Relaxed) > 0
    }

    /// Whether the device has a Raw QP of `qp_type` (whose packets a link must carry).
    pub fn has_raw_qps(&self, qp_type: QpType) -> bool {
        self.raw_count(qp_type).is_some_and(|n| n.load(Ordering::Relaxed) > 0)
    }

    /// One packet of the first QP on `list` (the datagram QPs' or the frame QPs') that has
    /// one. A QP that sent goes to the back of the list (it may have more); one that had
    /// nothing leaves it until it is woken. RD QPs stay on it: what frees their channels
    /// happens on the EECs. A QP stays on the list while it is tried (so a wake meanwhile
    /// queues nothing twice), and a lone busy QP is not moved at all: one lock of the list per
    /// packet.
    fn transmit_qps(&self, list: &Ready, now: u64, buf: &mut [u8]) -> Option<usize> {
        // The list first: an idle device (a busy-polled one asks on every poll) returns
        // without a lock.
        if !list.any.load(Ordering::Relaxed) {
            return None;
        }
        let (first, listed, next) = {
            let ready = &list.lock().qpns;
            (*ready.front()?, ready.len(), ready.get(1).copied())
        };
        let qps = self.qps.read().unwrap_or_else(|e| e.into_inner());
        if let Some(q) = next.and_then(|n| qps.slot(n)) {
            prefetch_qp(q);
        }
        let unlist = |qpn, end| unlist(list, qpn, end);
        let mut qpn = first;
        for turn in 0..listed {
            if turn > 0 {
                qpn = *list.lock().qpns.front()?;
            }
            let Some(qp) = qps.get(qpn) else {
                unlist(qpn, TurnEnd::Idle);
                continue;
            };
            let mut core = qp.core.lock().unwrap_or_else(|e| e.into_inner());
            if qp.destroyed.load(Ordering::Acquire) {
                drop(core);
                unlist(qpn, TurnEnd::Idle);
                continue;
            }
            let mut sent = emit_one(qp, &mut core, now, buf);
            if sent.is_some() && drained(qp, &core) {
                // That was its last packet (a post's flush nearly always ends so): off the list
                // now, under the locks this turn holds, and the flush's next call finds the
                // list empty without a lock instead of taking them all to find nothing. What
                // that call would have done with nothing to send is done here: the SQ head's
                // retirement (`emit_request_packet`), then the look for work whose waker saw
                // the flag still set, which `drained` answers as `emit_one` would.
                completer::retire(qp, &mut core);
                unlist(qpn, TurnEnd::Idle);
                qp.ready.store(false, Ordering::SeqCst);
                std::sync::atomic::fence(Ordering::SeqCst);
                if !drained(qp, &core) {
                    self.wake(qp);
                }
            } else if sent.is_some() || qp.qp_type == QpType::Rd {
                if listed > 1 {
                    unlist(qpn, if sent.is_some() { TurnEnd::Sent } else { TurnEnd::Pass });
                }
            } else {
                unlist(qpn, TurnEnd::Idle);
                // Idle: off the list, then one more look for work whose waker saw the flag
                // still set. The fence pairs with the waker's SeqCst publish then swap (see
                // `wake`): one of the two sees the other.
                qp.ready.store(false, Ordering::SeqCst);
                std::sync::atomic::fence(Ordering::SeqCst);
                sent = emit_one(qp, &mut core, now, buf);
                if sent.is_some() {
                    self.wake(qp);
                }
            }
            if let Some(len) = sent {
                qp.bump(|s| &s.tx_packets);
                return Some(len);
            }
        }
        None
    }

    /// Adds an EEC under the first number `next_eecn` gives that is neither 0 nor in use.
    pub fn add_eec(
        &self,
        mut next_eecn: impl FnMut() -> u32,
        make: impl FnOnce(u32) -> Arc<EecInner>,
    ) -> Arc<EecInner> {
        let mut eecs = self.eecs.write().unwrap_or_else(|e| e.into_inner());
        let eecn = std::iter::repeat_with(&mut next_eecn).find(|n| *n != 0 && !eecs.contains_key(n)).unwrap_or(0);
        let eec = make(eecn);
        eecs.insert(eecn, eec.clone());
        self.live_eecs.fetch_add(1, Ordering::Relaxed);
        eec
    }

    pub fn remove_eec(&self, eecn: u32) {
        if self.eecs.write().unwrap_or_else(|e| e.into_inner()).remove(&eecn).is_some() {
            self.live_eecs.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Whether the device has an EEC at all.
    pub fn has_eecs(&self) -> bool {
        self.live_eecs.load(Ordering::Relaxed) > 0
    }

    /// Puts `q` on the ready list unless it is there: whatever may give a QP something to send
    /// (a post, a Modify QP, a packet it received, a timer of its) wakes it. Whoever made the
    /// work visible did so before waking (a ring's SeqCst publish, or under the QP's lock), so
    /// either this swap finds the QP off the list and queues it, or the transmitter that took
    /// it off, clearing the flag after this swap, sees the work when it looks again before
    /// letting go (see `transmit_qps`).
    pub fn wake(&self, q: &QpInner) {
        if !q.ready.swap(true, Ordering::SeqCst) {
            let list = if q.qp_type == QpType::RawEthertype { &self.frames_ready } else { &self.ready };
            let mut l = list.lock();
            l.qpns.push_back(q.qpn);
            list.any.store(true, Ordering::Relaxed);
        }
    }

    /// Wakes every QP: for a change that can make any QP's packets addressable (the GID table).
    pub fn wake_all(&self) {
        let qps = self.qps.read().unwrap_or_else(|e| e.into_inner());
        for q in qps.values() {
            self.wake(q);
        }
    }

    /// The earliest time at which [`Engine::handle_timeout`] has work, if any.
    /// It may be earlier than the next timer (a timer disarmed or moved later since), never
    /// later.
    pub fn poll_timeout(&self) -> Option<u64> {
        self.timers.next()
    }

    /// Runs every timer that has expired at `now`: RNR waits end, ACK timeouts retry
    /// (PKT-RTY-1) or fail (PKT-RTY-4). Only the QPs and EECs whose timer is due are visited.
    pub fn handle_timeout(&self, dev: &dyn Hca, now: u64) {
        // Each entry handled either expires a timer or is stale, and what it re-arms lies
        // after `now`; the bound only keeps a bug from spinning here.
        let mut budget = self.timers.len().saturating_mul(2) + 16;
        while let Some((t, owner)) = self.timers.pop_due(now) {
            match owner {
                TimerOwner::Qp(qpn) => self.qp_timer(qpn, t, now),
                TimerOwner::Eec(eecn) => super::rd::on_timer(dev, eecn, t, now),
            }
            budget -= 1;
            if budget == 0 {
                break;
            }
        }
    }

    /// QP `qpn`'s timer entry `t` is due at `now`. A stale entry (the QP queued an earlier one
    /// since, was reset, or is gone) does nothing.
    fn qp_timer(&self, qpn: u32, t: u64, now: u64) {
        let qps = self.qps.read().unwrap_or_else(|e| e.into_inner());
        let Some(qp) = qps.get(qpn) else { return };
        let mut core = qp.core.lock().unwrap_or_else(|e| e.into_inner());
        if qp.destroyed.load(Ordering::Acquire) {
            return;
        }
        let Some(ack_expired) = core.chan.send.due(t, now) else { return };
        if ack_expired {
            requester::on_ack_timeout(qp, &mut core);
            completer::retire(qp, &mut core);
        }
        // What is still armed goes back in the queue (a re-arm above may have put it there).
        core.chan.send.requeue(&*qp.dev, TimerOwner::Qp(qpn));
        self.wake(qp); // a retransmission, or the end of an RNR wait
    }

    /// A snapshot of the device's counters.
    pub fn counters(&self) -> DeviceCounters {
        self.stats.snapshot()
    }

    /// Queues datagrams a destroyed QP still owed for the next `transmit`; false if there
    /// were none (so the caller need not ring the doorbell).
    pub fn orphan(&self, datagrams: Vec<Vec<u8>>) -> bool {
        if datagrams.is_empty() {
            return false;
        }
        self.orphans.lock().unwrap_or_else(|e| e.into_inner()).extend(datagrams);
        self.orphaned.store(true, Ordering::Release);
        true
    }

    /// The next orphaned datagram, copied into `buf` (see [`Engine::orphan`]).
    fn take_orphan(&self, buf: &mut [u8]) -> Option<usize> {
        if !self.orphaned.load(Ordering::Acquire) {
            return None;
        }
        let mut q = self.orphans.lock().unwrap_or_else(|e| e.into_inner());
        let Some(d) = q.pop_front() else {
            self.orphaned.store(false, Ordering::Release);
            return None;
        };
        let len = d.len().min(buf.len());
        buf[..len].copy_from_slice(&d[..len]);
        Some(len)
    }
}

/// Header validation in the order of PKT-VAL-1, then the transport. Returns false when the
/// packet was dropped.
fn deliver(engine: &Engine, dev: &dyn Hca, now: u64, d: &RoceDatagram<'_>, datagram: &[u8]) -> bool {
    let p = &d.packet;
    let bth = p.bth;
    if bth.tver != 0 {
        return false; // PKT-VAL-3
    }
    if bth.opcode == Opcode::Cnp {
        return true; // PKT-ROCE-13: no congestion control here; changes nothing
    }
    // The table stays read-locked while the packet is handled: Create and Destroy QP wait, no
    // reference count moves per packet.
    let qps = engine.qps.read().unwrap_or_else(|e| e.into_inner());
    if bth.opcode.service_range() == Some(ServiceType::Rd) {
        return super::rd::deliver(dev, &qps, now, d);
    }
    let multicast = d.ip.dst_is_multicast();
    if bth.dest_qp == MULTICAST_QPN || multicast {
        return deliver_multicast(engine, dev, &qps, now, d, datagram, multicast);
    }
    let Some(qp) = qps.get(bth.dest_qp) else {
        return false; // PKT-VAL-4
    };
    deliver_to(engine, dev, qp, now, d, datagram)
}

/// IBA 10.5: a multicast packet names the group in its destination GID and DestQP 0xFFFFFF;
/// either without the other is malformed. Each QP attached to the group gets the packet as if
/// addressed to it alone (its state, P_Key, service type and Q_Key checked), the one that sent
/// it included, as IP multicast loops back to its host.
#[cold]
fn deliver_multicast(
    engine: &Engine,
    dev: &dyn Hca,
    qps: &QpTable,
    now: u64,
    d: &RoceDatagram<'_>,
    datagram: &[u8],
    to_group: bool,
) -> bool {
    if d.packet.bth.dest_qp != MULTICAST_QPN || !to_group {
        return false;
    }
    let mgid = Gid::from_ipv6(d.ip.dst_gid());
    let groups = engine.groups.read().unwrap_or_else(|e| e.into_inner());
    let mut taken = false;
    for qp in groups.members(mgid).iter().filter_map(|&qpn| qps.get(qpn)) {
        taken |= deliver_to(engine, dev, qp, now, d, datagram);
    }
    taken
}

/// [`deliver`] of a packet to one QP, from PKT-VAL-5 on.
#[inline(always)]
fn deliver_to(engine: &Engine, dev: &dyn Hca, qp: &QpInner, now: u64, d: &RoceDatagram<'_>, datagram: &[u8]) -> bool {
    let p = &d.packet;
    let bth = p.bth;
    let mut core = qp.core.lock().unwrap_or_else(|e| e.into_inner());
    if qp.destroyed.load(Ordering::Acquire) {
        return false;
    }
    qp.stats.rx_packets.inc();
    let info = bth.opcode.info();
    let is_request = info.is_none_or(|i| i.direction == Direction::Request);
    let state = core.attrs.qp_state;
    // PKT-VAL-5: requests from RTR on; PKT-VAL-6: responses from RTS on.
    let accepts = if is_request {
        matches!(state, QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe)
    } else {
        matches!(state, QpState::Rts | QpState::Sqd | QpState::Sqe)
    };
    if !accepts {
        return false;
    }
    // PKT-VAL-7: the entry the QP's P_Key index selects; for the GSI, any entry of the table,
    // whose index its receive CQE reports (CQE-14).
    let pkey_index = if qp.qpn == GSI_QPN {
        (0..=u16::MAX).map_while(|i| dev.pkey(i)).position(|k| pkey_match(bth.p_key, k)).map(|i| i as u16)
    } else {
        dev.pkey(core.attrs.pkey_index).filter(|k| pkey_match(bth.p_key, *k)).map(|_| core.attrs.pkey_index)
    };
    let Some(pkey_index) = pkey_index else {
        qp.bump(|s| &s.pkey_violations); // PKT-VAL-7, PKT-VAL-13
        return false;
    };
    if bth.opcode.service_range() != service_of(qp.qp_type) {
        return false; // PKT-VAL-9
    }
    if info.is_none() && !qp.qp_type.is_reliable_connected() {
        return false; // PKT-OP-5
    }
    if qp.qp_type.is_connected() {
        let src = crate::types::Gid::from_ipv6(d.ip.src_gid());
        // By reference: the paths are large, and every packet of the QP asks.
        let on_alternate = || core.attrs.alt.as_ref().and_then(|alt| alt.av.ah.grh.dgid) == Some(src);
        if bth.mig_req && on_alternate() {
            if core.attrs.path_mig_state != crate::types::MigState::Armed {
                // IBA 17.2.8: the peer migrated onto a path this side has loaded but not
                // armed. The request is refused (the packet dropped, the peer's retries
                // decide) and reported once per alternate path loaded, so that a peer's
                // retransmissions cannot fill the event queue (EVT-AE-1).
                qp.refuse_migration(&mut core);
                return false;
            }
            // IBA 17.2.8: the peer migrated; this side follows onto the alternate path.
            qp.migrate(&mut core, true);
        } else if core.attrs.av.as_ref().and_then(|av| av.ah.grh.dgid) != Some(src) {
            return false; // PKT-VAL-11, PKT-ROCE-5
        }
    }
    if qp.qp_type == QpType::Ud {
        // The GSI's Q_Key is the well-known one, whatever Modify QP set (IBA 13.5.1).
        let qkey = if qp.qpn == GSI_QPN { GSI_QKEY } else { core.attrs.qkey };
        match p.deth {
            Some(deth) if deth.q_key == qkey => {}
            _ => {
                qp.bump(|s| &s.qkey_violations); // PKT-VAL-10
                return false;
            }
        }
    }
    if is_request {
        // The 40-byte GRH area of a UD receive (PKT-ROCE-11); nobody else needs it.
        let grh = if qp.qp_type == QpType::Ud { roce::ud_grh(datagram).ok() } else { None };
        let req = Request { pkey_index, ..Request::of(p, info, grh) };
        responder::on_request(qp, &mut core, &req);
        // An ACK, a NAK or Read responses to send.
        if !core.chan.out.is_empty() {
            engine.wake(qp);
        }
        true
    } else {
        let Some(info) = info else { return false };
        if !qp.qp_type.is_reliable_connected() {
            return false;
        }
        let r = Response::of(p, info);
        let accepted = completer::on_response(qp, &mut core, now, &r);
        // A window that opened, a go-back, or responses owed: anything left on the SQ may move.
        if !core.sq.is_empty() || !core.chan.out.is_empty() {
            engine.wake(qp);
        }
        accepted
    }
}

/// The IP header toward `ah`, from our GID `sgid_index` (PKT-ROCE-3).
pub(crate) fn ip_for(dev: &dyn Hca, ah: &AhAttr) -> Option<IpRepr> {
    // An empty slot (the zero GID) has no address to send from: unaddressable.
    let sgid = dev.gid(ah.grh.sgid_index?).filter(|g| !g.is_zero())?;
    let dgid = ah.grh.dgid?;
    let tc = ah.grh.traffic_class.unwrap_or(0);
    let hop = ah.grh.hop_limit.unwrap_or(64);
    Some(match (sgid.to_ipv4(), dgid.to_ipv4()) {
        (Some(src), Some(dst)) => IpRepr::V4(Ipv4Repr { tos: tc, ttl: hop, ..Ipv4Repr::new(src, dst) }),
        _ => IpRepr::V6(Ipv6Repr {
            traffic_class: tc,
            flow_label: ah.grh.flow_label.unwrap_or(0),
            hop_limit: hop,
            ..Ipv6Repr::new(sgid.to_ipv6(), dgid.to_ipv6())
        }),
    })
}

/// The connected QP's route, from its cache while the AV and the GID table are unchanged
/// (see `QpCore::route`).
fn route(q: &QpInner, core: &mut QpCore) -> Option<IpRepr> {
    let gen = q.dev.gid_generation();
    if let Some((g, ip)) = core.route {
        if g == gen {
            return Some(ip);
        }
    }
    let ip = ip_for(&*q.dev, &core.attrs.av?.ah)?;
    core.route = Some((gen, ip));
    Some(ip)
}

/// Emits `packet` with a payload of `payload_len` bytes that `fill` writes in place through a
/// [`Payload`]. The ICRC runs from the headers on, its CRC over the first of them taken from
/// `memo` where they are a recent packet's (a QP's requests, see [`icrc::HeadMemo`]). A
/// payload of at least [`mem::COPY_CRC_MIN`](crate::mem::COPY_CRC_MIN) bytes has the CRC
/// continued over each byte as it is copied, so no second pass reads it back; a shorter one is
/// copied plainly and then checksummed, which costs less than several short CRC calls.
pub(crate) fn emit(
    qpn: u32,
    ip: IpRepr,
    packet: PacketRepr<'_>,
    payload_len: usize,
    buf: &mut [u8],
    memo: Option<&mut icrc::HeadMemo>,
    fill: impl FnOnce(&mut Payload<'_>) -> bool,
) -> Option<usize> {
    let udp = UdpRepr::for_qp(qpn, UdpChecksum::default_for(&ip));
    let repr = RoceRepr { ip, udp, packet };
    let range = repr.emit_headers(payload_len, buf).ok()?;
    let head = &buf[..range.start];
    let head_crc = match memo {
        Some(memo) => memo.start(head),
        None => icrc::start_datagram(head),
    }
    .ok()?;
    emit_payload(&ip, udp.checksum, range, head_crc, buf, fill)
}

/// The rest of [`emit`] once the headers are in `buf` (through `range.start`, the payload's
/// place) and `head_crc` is the ICRC's CRC over them: the payload, the pad (zeroed here: a
/// `wire::RequestHead` writes the headers alone, over whatever the buffer held), the seal.
/// `None` where `buf` cannot hold the datagram.
fn emit_payload(
    ip: &IpRepr,
    checksum: UdpChecksum,
    range: std::ops::Range<usize>,
    head_crc: u32,
    buf: &mut [u8],
    fill: impl FnOnce(&mut Payload<'_>) -> bool,
) -> Option<usize> {
    let payload_len = range.len();
    let pad_end = range.end + pad_for(payload_len);
    let end = pad_end + ICRC_LEN;
    if buf.len() < end {
        return None;
    }
    let fused = payload_len >= crate::mem::COPY_CRC_MIN;
    let (before, rest) = buf.split_at_mut(range.end);
    let mut payload = Payload { dst: &mut before[range.start..], crc: fused.then_some(head_crc), at: 0 };
    if !fill(&mut payload) || payload.at != payload_len {
        return None;
    }
    // The pad bytes (zeros, PKT-HDR-2) close the running CRC.
    let pad = &mut rest[..pad_end - range.end];
    pad.fill(0);
    let crc = match payload.crc {
        Some(crc) => crc,
        None => crate::mem::crc32::update(head_crc, &before[range.start..]),
    };
    let crc = if pad.is_empty() { crc } else { crate::mem::crc32::update(crc, pad) };
    roce::seal_with(buf.get_mut(..end)?, ip, checksum, crc).ok()?;
    Some(end)
}

/// The payload of a packet being emitted, written front to back. With a running ICRC, only
/// through copies that continue it as they go (`mem::copy_crc`: one pass over each byte).
pub(crate) struct Payload<'a> {
    dst: &'a mut [u8],
    /// The ICRC so far (crc32fast's value), where it runs with the copies; `None`: plain copies,
    /// the ICRC computed over the whole datagram afterwards.
    crc: Option<u32>,
    /// Bytes written.
    at: usize,
}

impl Payload<'_> {
    /// Bytes still to write.
    pub fn remaining(&self) -> usize {
        self.dst.len() - self.at
    }

    /// Appends `src`; false (nothing written) if it does not fit.
    pub fn copy(&mut self, src: &[u8]) -> bool {
        let Some(dst) = self.dst.get_mut(self.at..self.at + src.len()) else { return false };
        match &mut self.crc {
            Some(crc) => *crc = crate::mem::copy_crc(dst, src, *crc),
            None => dst.copy_from_slice(src),
        }
        self.at += src.len();
        true
    }

    /// Appends `len` bytes of `m` from `at` (checked by the window).
    pub fn read(&mut self, m: &crate::mem::MemRef, at: usize, len: usize) -> bool {
        let Some(dst) = self.dst.get_mut(self.at..self.at + len) else { return false };
        let read = match &mut self.crc {
            Some(crc) => m.read_crc(at, dst, *crc).map(|c| *crc = c),
            None => m.read(at, dst),
        };
        if read.is_err() {
            return false;
        }
        self.at += len;
        true
    }

    /// Fills the rest with the bytes at byte `offset` of a gather list (WR-COM-5).
    pub fn gather(&mut self, list: &[crate::mem::MemRef], mut offset: u64) -> bool {
        for m in list {
            if self.remaining() == 0 {
                return true;
            }
            let len = m.len() as u64;
            if offset >= len {
                offset -= len;
                continue;
            }
            let n = ((len - offset) as usize).min(self.remaining());
            if !self.read(m, offset as usize, n) {
                return false;
            }
            offset = 0;
        }
        self.remaining() == 0
    }

    /// Fills the rest with a send WQE's bytes from `offset`: its inline data or its gather list.
    pub fn wqe(&mut self, w: &SendWqe, offset: u64) -> bool {
        if w.inline.is_empty() {
            return self.gather(&w.tx.local, offset);
        }
        let start = offset as usize;
        match w.inline.get(start..start + self.remaining()) {
            Some(src) => self.copy(src),
            None => false,
        }
    }
}

/// Whether an RC, UC, UD or XRC QP has nothing left to send: no response owed, and the SQ's
/// cursor past its last WQE, so that [`emit_one`] would find nothing without changing anything
/// but the retirement of the SQ head. False when unsure (an RD QP's turn is its EECs').
fn drained(q: &QpInner, core: &QpCore) -> bool {
    (q.qp_type.is_connected() || q.qp_type == QpType::Ud)
        && core.chan.out.is_empty()
        && core.req.cursor >= core.sq.len()
}

fn emit_one(q: &Arc<QpInner>, core: &mut QpCore, now: u64, buf: &mut [u8]) -> Option<usize> {
    if core.attrs.qp_state == QpState::Reset {
        return None;
    }
    if q.qp_type == QpType::Rd {
        return super::rd::qp_turn(q, core, now, buf);
    }
    // Responses go first, but not for ever (`Outbox::response_first`); on a link that asks, a
    // plain ACK lets a few of the QP's request packets go ahead of it (`acks_after_requests`).
    if core.chan.out.response_first() {
        if core.chan.out.ack_may_wait() && q.dev.engine().acks_after_requests.load(Ordering::Relaxed) {
            if let Some(len) = emit_request_packet(q, core, now, buf) {
                core.chan.out.ack_waits();
                core.chan.out.took_turn(false, false);
                return Some(len);
            }
        }
        if let Some(len) = emit_response(q, core, buf) {
            core.chan.out.took_turn(true, false);
            return Some(len);
        }
    }
    if let Some(len) = emit_request_packet(q, core, now, buf) {
        core.chan.out.took_turn(false, false);
        return Some(len);
    }
    let len = emit_response(q, core, buf)?;
    core.chan.out.took_turn(true, true);
    Some(len)
}

fn emit_request_packet(q: &Arc<QpInner>, core: &mut QpCore, now: u64, buf: &mut [u8]) -> Option<usize> {
    loop {
        let Some(np) = requester::next_packet(q, core) else {
            completer::retire(q, core); // a WQE that failed its interface checks
            return None;
        };
        let connected = if q.qp_type.one_packet_messages() { None } else { route(q, core) };
        if let Some(len) = emit_request(q, core, &np, connected, buf) {
            if q.qp_type.is_reliable_connected() {
                let psn = Psn::new(np.psn);
                if psn.psn_cmp(Psn::new(core.req.sent_high)).is_lt() {
                    q.bump(|s| &s.retransmitted_packets);
                }
                // A Read request stands for the PSNs of all the responses it asks for.
                let covered = match core.sq.get(np.idx) {
                    Some(w) if w.opcode == WrOpcode::RdmaRead => Psn::new(w.tx.first_psn).add(w.tx.npkts),
                    _ => psn.next(),
                };
                if covered.psn_cmp(Psn::new(core.req.sent_high)).is_gt() {
                    core.req.sent_high = covered.value();
                }
                core.chan.send.sent(&*q.dev, TimerOwner::Qp(q.qpn), now, core.attrs.timeout);
            } else if np.offset + np.payload >= core.sq.get(np.idx).map_or(0, |w| w.length) {
                // PKT-UC-3: a UC or UD WQE is done once its last packet is out: now, or when
                // the link says the datagram left (`Engine::sent`).
                let engine = q.dev.engine();
                let defer = engine.defer_unreliable.load(Ordering::Relaxed);
                if let Some(w) = core.sq.get_mut(np.idx) {
                    if defer {
                        w.tx.awaiting_wire = true;
                    } else {
                        w.tx.status = Some(WcStatus::Success);
                    }
                }
                core.req.una = core.chan.send.psn;
                if defer {
                    let mut awaiting = engine.awaiting_wire.lock().unwrap_or_else(|e| e.into_inner());
                    awaiting.push(q.qpn);
                    engine.awaiting_any.store(true, Ordering::Relaxed);
                } else {
                    completer::retire(q, core);
                }
            }
            return Some(len);
        }
        // A page of on-demand memory the gather found missing: Local Protection Error, as an
        // HCA's unserved page fault. Else unaddressable (a UD AH whose GID vanished): fail the
        // WQE rather than stall.
        if let Some(w) = core.sq.get_mut(np.idx) {
            let fault = w.tx.local.iter().any(|m| m.is_on_demand() && !m.readable(0, m.len()));
            w.tx.status = Some(if fault { WcStatus::LocProtErr } else { WcStatus::LocQpOpErr });
        }
        core.req.halted = true;
        completer::retire(q, core);
    }
}

/// The opcode of a request packet of a `op` work request on `service`, the `first` and/or
/// `last` of its message, chosen from the opcode table by what it means (PKT-OP-1). `None`
/// for what the table has no opcode for (the post-time checks keep those from the wire).
pub(crate) fn request_opcode(service: ServiceType, op: WrOpcode, first: bool, last: bool) -> Option<Opcode> {
    let (operation, single) = match op {
        WrOpcode::RdmaRead => (Operation::RdmaReadRequest, true),
        WrOpcode::AtomicCmpSwp => (Operation::CompareSwap, true),
        WrOpcode::AtomicFetchAdd => (Operation::FetchAdd, true),
        WrOpcode::AtomicWrite => (Operation::AtomicWrite, true),
        WrOpcode::Resync => (Operation::Resync, true),
        WrOpcode::RdmaWrite | WrOpcode::RdmaWriteWithImm => (Operation::RdmaWrite, false),
        _ => (Operation::Send, false),
    };
    let position = if single { Position::Only } else { Position::of(first, last) };
    // Immediate Data and the R_Key to invalidate ride on the message's last packet.
    let suffix = match op {
        _ if !last => Suffix::Plain,
        _ if op.has_imm() => Suffix::Immediate,
        WrOpcode::SendWithInv => Suffix::Invalidate,
        _ => Suffix::Plain,
    };
    Opcode::lookup(service, operation, position, suffix)
}

/// `connected` is the route of an RC or UC QP; a UD packet takes its WQE's address handle.
fn emit_request(
    q: &QpInner,
    core: &mut QpCore,
    np: &requester::NextPacket,
    connected: Option<IpRepr>,
    buf: &mut [u8],
) -> Option<usize> {
    let w = core.sq.get(np.idx)?;
    if q.qp_type.is_raw() {
        return emit_raw(w, buf);
    }
    let a = &core.attrs;
    let first = np.offset == 0;
    let last = np.offset + np.payload >= w.length;
    let connected_qp = q.qp_type.is_connected();
    let dest_qp = if connected_qp { a.dest_qp_num } else { w.remote_qpn };
    let opcode = request_opcode(service_of(q.qp_type)?, w.opcode, first, last)?;
    let pkey = q.dev.pkey(a.pkey_index).unwrap_or(0xFFFF); // MOD-PKEY-1
    let mut bth = BthRepr::new(opcode, pkey, dest_qp, Psn::new(np.psn)); // MOD-DQPN-1
    bth.mig_req = mig_req(q, core);
    let solicited_kind = matches!(w.opcode, WrOpcode::Send | WrOpcode::SendWithImm | WrOpcode::RdmaWriteWithImm);
    bth.se = last && solicited_kind && w.flags.contains(SendFlags::SOLICITED); // EVT-SE-1..3

    // AckReq (RC): on the last packet (PKT-ACK-2), on every ACK_EVERY-th so that the window
    // keeps moving, and on a timeout's probe, whose answer the go-back waits for.
    bth.ack_req = q.qp_type.is_reliable_connected()
        && w.opcode.gathers()
        && (last || np.psn % requester::ACK_EVERY == requester::ACK_EVERY - 1 || core.chan.send.probe_due());
    let payload_len = np.payload as usize;
    // A packet of a connected QP that is a BTH and a payload reuses the headers of the last
    // such packet of its shape (`wire::RequestHead`).
    let plain = connected_qp && opcode.info().is_some_and(|i| i.headers.is_empty() && i.reserved_len == 0);
    if let (true, Some(ip)) = (plain, connected) {
        let udp = UdpRepr::for_qp(q.qpn, UdpChecksum::default_for(&ip));
        if let Some(h) = core.req_head.as_ref().filter(|h| h.is_for(&ip, &udp, &bth, payload_len)) {
            let (n, head_crc) = h.write(bth.psn, buf).ok()?;
            return emit_payload(h.ip(), h.udp().checksum, n..n + payload_len, head_crc, buf, |p| p.wqe(w, np.offset));
        }
        let len =
            emit(q.qpn, ip, PacketRepr::new(bth), payload_len, buf, Some(&mut core.tx_memo), |p| p.wqe(w, np.offset))?;
        let n = ip.header_len() + UDP_HEADER_LEN + BTH_LEN;
        core.req_head = RequestHead::new(ip, udp, bth, payload_len, &buf[..n]).ok();
        return Some(len);
    }
    let mut packet = PacketRepr::new(bth);
    if q.qp_type == QpType::XrcSend {
        packet.xrceth = Some(XrcEthRepr { xrc_srq: w.xrc_srqn }); // the SRQ at the target
    }
    add_request_headers(&mut packet, w, np.offset, first, last);
    if q.qp_type == QpType::Ud {
        // WR-SEND-4, WR-SEND-5: a Q_Key with its msb set means "use the QP's own".
        let q_key = if w.remote_qkey & 0x8000_0000 != 0 { a.qkey } else { w.remote_qkey };
        packet.deth = Some(DethRepr { q_key, src_qp: q.qpn }); // PKT-UD-2
    }
    let ip = match connected {
        Some(ip) => ip,
        // The address handle is read only here: it is a large copy, and a connected QP's
        // route is its cache's.
        None => ip_for(&*q.dev, &if connected_qp { a.av?.ah } else { w.ah? })?,
    };
    emit(q.qpn, ip, packet, np.payload as usize, buf, Some(&mut core.tx_memo), |p| p.wqe(w, np.offset))
}

/// A Raw QP's packet is its message: an Ethernet frame (Raw Ethertype, the WR's EtherType
/// written into it, WR-SEND-8) or an IPv6 datagram (Raw IPv6). No LRH on RoCE: the WR's DLID,
/// SL and Source Path Bits (WR-SEND-7) have nowhere to go. `check_local` bounded the length.
fn emit_raw(w: &SendWqe, buf: &mut [u8]) -> Option<usize> {
    let len = w.length as usize;
    let dst = buf.get_mut(..len)?;
    // A frame has no ICRC: plain copies.
    if !(Payload { dst: &mut *dst, crc: None, at: 0 }).wqe(w, 0) {
        return None;
    }
    if let (Some(t), Some(field)) = (w.raw_ethertype, dst.get_mut(12..14)) {
        field.copy_from_slice(&t.to_be_bytes());
    }
    Some(len)
}

/// The headers a request packet of `w` at byte `offset` carries after the BTH (and the
/// RDETH/DETH of its service): RETH on a Write's first packet and on every Read request (a
/// re-request asks for the rest from `offset`) and Atomic Write, AtomicETH on an Atomic, ImmDt
/// on the last packet of a message with Immediate (WR-SEND-1).
pub(crate) fn add_request_headers(p: &mut PacketRepr<'_>, w: &SendWqe, offset: u64, first: bool, last: bool) {
    match w.opcode {
        WrOpcode::RdmaWrite | WrOpcode::RdmaWriteWithImm | WrOpcode::AtomicWrite if first => {
            p.reth = Some(RethRepr { va: w.remote_addr, r_key: w.rkey, dma_length: w.length as u32 });
        }
        WrOpcode::RdmaRead => {
            p.reth = Some(RethRepr {
                va: w.remote_addr.wrapping_add(offset),
                r_key: w.rkey,
                dma_length: (w.length - offset.min(w.length)) as u32,
            });
        }
        WrOpcode::AtomicCmpSwp => {
            p.atomic_eth = Some(AtomicEthRepr {
                va: w.remote_addr,
                r_key: w.rkey,
                swap_add_data: w.swap,
                compare_data: w.compare_add,
            });
        }
        WrOpcode::AtomicFetchAdd => {
            p.atomic_eth =
                Some(AtomicEthRepr { va: w.remote_addr, r_key: w.rkey, swap_add_data: w.compare_add, compare_data: 0 });
        }
        _ => {}
    }
    if w.opcode.has_imm() && last {
        p.immdt = Some(ImmDtRepr { imm_data: w.imm_data });
    }
    if w.opcode == WrOpcode::SendWithInv && last {
        p.ieth = Some(IethRepr { r_key: w.invalidate_rkey }); // the R_Key the responder invalidates
    }
}

/// The ACKs and NAKs a QP still owes, built now (Destroy QP hands them to the device: the
/// application may already have seen the completions they acknowledge, PKT-ACK-13). Read
/// responses and Atomic ACKs owed are not: the QP's resources go with it.
pub(crate) fn owed_acks(q: &QpInner, core: &mut QpCore) -> Vec<Vec<u8>> {
    owed_datagrams(core, |c| c.chan.out.ack_next(), |c, buf| emit_response(q, c, buf))
}

/// Builds datagrams with `emit` while `owes` says the next response is one to keep (Destroy
/// QP's and Destroy EEC's ACKs); stops early if one cannot be built.
pub(crate) fn owed_datagrams<C>(
    core: &mut C,
    owes: impl Fn(&C) -> bool,
    mut emit: impl FnMut(&mut C, &mut [u8]) -> Option<usize>,
) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    while owes(core) {
        let mut buf = vec![0u8; MAX_DATAGRAM];
        let Some(len) = emit(core, &mut buf) else { break };
        buf.truncate(len);
        out.push(buf);
    }
    out
}

/// The BTH MigReq bit a connected QP sends (IBA 17.2.8): set while its path migration state
/// is Migrated, clear while an alternate path is armed; a responder whose alternate is armed
/// migrates when a packet with it set comes over that path. (Linux's qib/hfi1 send it so;
/// rxe, which has no APM, always sends 0.) UD QPs send 0.
fn mig_req(q: &QpInner, core: &QpCore) -> bool {
    q.qp_type.is_connected() && core.attrs.path_mig_state == crate::types::MigState::Migrated
}

fn emit_response(q: &QpInner, core: &mut QpCore, buf: &mut [u8]) -> Option<usize> {
    if core.chan.out.is_empty() {
        return None;
    }
    let ip = route(q, core)?;
    let pkey = q.dev.pkey(core.attrs.pkey_index).unwrap_or(0xFFFF);
    let dest = core.attrs.dest_qp_num;
    // PKT-ACK-11: a QP on an SRQ has no credits of its own to report.
    let credit_code =
        if q.on_srq() { crate::wire::aeth::CREDIT_CODE_INVALID } else { core.resp.credit_code(core.rq.len()) };
    let mig = mig_req(q, core);
    let bth = |op: Opcode, _: (), psn: Psn| BthRepr { mig_req: mig, ..BthRepr::new(op, pkey, dest, psn) };
    let msn = core.chan.recv.msn;
    // RC's responses, or XRC's (the same with XRC's opcodes).
    let service = service_of(q.qp_type)?;
    if let Some(((), psn, aeth)) = core.chan.out.take_ack(Syndrome::Ack { credit_code }, msn) {
        let ack = Opcode::lookup(service, Operation::Acknowledge, Position::Only, Suffix::Plain)?;
        return emit_ack(q, core, ip, bth(ack, (), psn), aeth, buf);
    }
    let sent =
        core.chan.out.send_next(service, &*q.dev, bth, Syndrome::Ack { credit_code }, msn, |_, p, n, fill| {
            emit(q.qpn, ip, p, n, buf, None, fill)
        })?;
    let len = match sent {
        Sent::Packet(len) => len,
        Sent::AccessLost { len, .. } => {
            // The key no longer covers the Read's bytes: Remote Access Error, as for a bad
            // R_Key at the request (ERR-RQ-9, Class C).
            responder::access_lost(q, core);
            len
        }
    };
    if len.is_none() {
        tracing::warn!(qpn = q.qpn, "a response could not be emitted");
    }
    len
}

/// An ACK or NAK, written from the QP's [`AckTemplate`]: the datagram the ordinary emitter
/// would build (see there), for about a third of the work. The template is rebuilt when the
/// route, P_Key, destination QP or MigReq it was made for changes. RD's ACKs carry an RDETH
/// and take the ordinary path (`Outbox::send_next`).
fn emit_ack(q: &QpInner, core: &mut QpCore, ip: IpRepr, bth: BthRepr, aeth: AethRepr, buf: &mut [u8]) -> Option<usize> {
    let udp = UdpRepr::for_qp(q.qpn, UdpChecksum::default_for(&ip));
    if !core.ack.as_ref().is_some_and(|t| t.is_for(&ip, &udp, &bth)) {
        core.ack = AckTemplate::new(ip, udp, bth).ok();
    }
    let len = core.ack.as_ref().and_then(|t| t.emit(bth.psn, aeth, buf).ok());
    if len.is_none() {
        tracing::warn!(qpn = q.qpn, "an acknowledgement could not be emitted");
    }
    len
}

#[cfg(test)]
mod request_head_tests {
    use super::*;
    use crate::wire::roce::Ipv6Repr;

    /// Rule PKT-HDR-2: a plain request written from a `RequestHead` over a dirty buffer is,
    /// byte for byte, the datagram the emitter builds, its pad bytes zero: IPv4 (UDP checksum
    /// 0) and IPv6 (computed), payloads that need 0 to 3 pad bytes, short (plain copies) and
    /// long (the fused copy and CRC).
    #[test]
    fn a_request_from_its_head_is_the_emitters_datagram() {
        let v4 = IpRepr::V4(Ipv4Repr::new([10, 0, 0, 1].into(), [10, 0, 0, 2].into()));
        let v6 = IpRepr::V6(Ipv6Repr::new("fd00::1".parse().unwrap(), "fd00::2".parse().unwrap()));
        for ip in [v4, v6] {
            let udp = UdpRepr::for_qp(0x31, UdpChecksum::default_for(&ip));
            for len in [0usize, 1, 2, 3, 5, 8, 301, 1023, 4095] {
                let data: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
                let bth =
                    |psn| BthRepr { ack_req: true, ..BthRepr::new(Opcode::RcSendOnly, 0xffff, 0x42, Psn::new(psn)) };
                let mut first = vec![0u8; MAX_DATAGRAM];
                let n = emit(0x31, ip, PacketRepr::new(bth(1)), len, &mut first, None, |p| p.copy(&data)).unwrap();
                let hl = ip.header_len() + UDP_HEADER_LEN + BTH_LEN;
                let head = RequestHead::new(ip, udp, bth(1), len, &first[..hl]).unwrap();
                assert!(head.is_for(&ip, &udp, &bth(2), len));
                let want = RoceRepr { ip, udp, packet: PacketRepr { payload: &data, ..PacketRepr::new(bth(2)) } };
                let mut expect = vec![0u8; MAX_DATAGRAM];
                let m = want.emit(&mut expect).unwrap();
                let mut got = vec![0xa5u8; MAX_DATAGRAM];
                let (h, crc) = head.write(Psn::new(2), &mut got).unwrap();
                let k = emit_payload(head.ip(), head.udp().checksum, h..h + len, crc, &mut got, |p| p.copy(&data));
                assert_eq!((k, n), (Some(m), m), "{ip:?}, {len} bytes");
                assert_eq!(&got[..m], &expect[..m], "{ip:?}, {len} bytes");
                // A buffer that cannot hold the datagram is refused, not overrun.
                let mut short = vec![0u8; m - 1];
                let (h, crc) = head.write(Psn::new(3), &mut short).unwrap();
                assert_eq!(
                    emit_payload(head.ip(), head.udp().checksum, h..h + len, crc, &mut short, |p| p.copy(&data)),
                    None
                );
            }
        }
    }
}

#[cfg(test)]
mod timer_queue_tests {
    use super::*;

    /// A timer moved later keeps one entry, which fires early and finds
    /// nothing due; one moved earlier queues a new entry; entries come out by deadline.
    #[test]
    fn owners_keep_at_most_their_earliest_entry_queued() {
        let q = TimerQueue::default();
        let (mut a, mut b) = (None, None);
        assert_eq!(q.next(), None);
        q.schedule(TimerOwner::Qp(7), &mut a, 100);
        q.schedule(TimerOwner::Qp(7), &mut a, 300); // re-armed later: no new entry
        assert_eq!((a, q.len()), (Some(100), 1));
        q.schedule(TimerOwner::Eec(3), &mut b, 50);
        q.schedule(TimerOwner::Eec(3), &mut b, 40); // earlier: a new entry, the old one stale
        assert_eq!((b, q.len(), q.next()), (Some(40), 3, Some(40)));
        assert_eq!(q.pop_due(39), None);
        assert_eq!(q.pop_due(1000), Some((40, TimerOwner::Eec(3))));
        assert_eq!(q.pop_due(1000), Some((50, TimerOwner::Eec(3))));
        assert_eq!(q.next(), Some(100));
        assert_eq!(q.pop_due(99), None);
        assert_eq!(q.pop_due(100), Some((100, TimerOwner::Qp(7))));
        assert_eq!((q.next(), q.len()), (None, 0));
    }
}
