//! A deterministic in-process fabric: any number of devices, a virtual clock, seeded faults.
//!
//! The fabric drives each device through its sans-IO interface (`transmit`, `receive`,
//! `poll_timeout`, `handle_timeout`, DESIGN rule 1). Nothing reads a real clock or sleeps, and
//! every random choice comes from one RNG seeded by [`SimConfig::seed`], taken in an order that
//! depends only on the run itself, so one seed always gives the same run, packet for packet.
//!
//! # The path of a datagram
//!
//! 1. A device's `transmit` (or [`SimFabric::inject`]) puts it on the wire at `now`. Its
//!    destination device is looked up from the IP destination address *now*, so a filter that
//!    mangles the headers cannot reroute it.
//! 2. The [filter](SimFabric::set_filter) sees it and may mutate, drop or delay it.
//! 3. The pcap tap records it (at [`TapPoint::Sent`], the default): the datagram as the
//!    sender and filter made it, before any random fault; so do the [taps](SimFabric::add_tap)
//!    (`link::tap`, the middleware any link takes).
//! 4. No device at the destination: dropped, counted in `dropped_no_route`.
//! 5. Serialization: each directed link (sender → receiver) sends one datagram at a time at
//!    `bandwidth_bps`; a datagram waits for the ones before it on the same link.
//! 6. Loss (the datagram still used the link's bandwidth), then duplication (a second copy
//!    arrives just after the first), then, per copy, corruption and reordering.
//! 7. Arrival = end of serialization + `latency_ns` + uniform jitter in `0..=jitter_ns`. Copies
//!    that were not reordered or delayed by the filter keep FIFO order per link (jitter alone
//!    never reorders); a reordered copy arrives `reorder_delay_ns` later than it would have,
//!    so datagrams sent after it overtake it.
//! 8. On arrival the taps see each copy in turn and may drop or duplicate it before the
//!    device does.
//!
//! Corruption flips 1 to 3 distinct bits among those the receiver can check: everything the
//! ICRC covers and the ICRC itself. It never touches the RoCEv2 variant fields (IPv4 TOS, TTL
//! and header checksum; IPv6 traffic class, flow label and hop limit; the UDP checksum; BTH
//! byte 4), because a flip there is invisible by design and would make a "corrupted" datagram
//! that the receiver rightly accepts. With CRC-32's Hamming distance of 4 at these lengths,
//! every corrupted datagram fails verification. Datagrams that do not parse as RoCEv2 (test
//! garbage) are corrupted anywhere. Raw packets (Raw QPs' Ethernet frames and IPv6
//! datagrams) have no ICRC: one that is corrupted is discarded by the receiving port's
//! Ethernet FCS check instead, counted in `corrupted` and `fcs_dropped`.
//!
//! # Time and events
//!
//! [`SimFabric::step`] drains every device's pending output at `now`, advances the clock to the
//! earliest event (an arrival or a device's `poll_timeout`), delivers the datagrams due then,
//! in send order, and then runs the timers that are due, in device order. Arrivals go first so
//! that an ACK landing exactly at its requester's timeout beats it.

use std::collections::{BTreeMap, BinaryHeap};
use std::fmt;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::Path;
use std::sync::Arc;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::pcap::{mac_for_index, PcapTap, UNKNOWN_MAC};
use crate::transport::engine::MAX_DATAGRAM;
use crate::verbs::{Context, DeviceConfig, Gid, Result, VerbsError};
use crate::wire::ip::{IPV4_HEADER_LEN, IPV6_HEADER_LEN, UDP_HEADER_LEN};
use crate::wire::packet::BTH_LEN;
use crate::wire::roce::{self, IpRepr, RoceRepr};
use crate::wire::WireError;

/// Most datagrams taken from one device in one drain: a device that never stops transmitting
/// cannot stall the clock, it just gets the next step at the same instant.
const MAX_TX_PER_DRAIN: usize = 1024;
/// Raw IPv6 and Raw Ethertype QPs a device on the fabric may have (each), unless its config
/// asks for a number.
const RAW_QPS: u32 = 64;
/// Buffers kept for reuse after delivery. The pool never holds more than was in flight at
/// once (it fills only from delivered datagrams), so this bounds what a past peak keeps, not
/// the peak: with 10,000 QPs of four Sends each in flight (40,000 datagrams), a pool of 1,024
/// left `drain` allocating a buffer for most datagrams (malloc 1.4% of the run's profile).
const MAX_POOLED: usize = 1 << 16;

/// Timing and faults of one direction of a link. Probabilities are clamped to `0.0..=1.0`
/// (NaN counts as 0).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkConfig {
    pub latency_ns: u64,
    /// Extra delay drawn uniformly from `0..=jitter_ns` per copy; never reorders by itself.
    pub jitter_ns: u64,
    /// Serialization rate in bits per second of IP datagram; 0 = infinite.
    pub bandwidth_bps: u64,
    pub loss: f64,
    pub dup: f64,
    pub reorder: f64,
    /// How much later than its FIFO slot a reordered copy arrives.
    pub reorder_delay_ns: u64,
    pub corrupt: f64,
}

impl Default for LinkConfig {
    /// 1 µs latency, infinite bandwidth, no faults; reordered copies come 10 µs late.
    fn default() -> Self {
        LinkConfig {
            latency_ns: 1_000,
            jitter_ns: 0,
            bandwidth_bps: 0,
            loss: 0.0,
            dup: 0.0,
            reorder: 0.0,
            reorder_delay_ns: 10_000,
            corrupt: 0.0,
        }
    }
}

fn clamp_p(p: f64) -> f64 {
    if p.is_nan() {
        0.0
    } else {
        p.clamp(0.0, 1.0)
    }
}

impl LinkConfig {
    pub fn latency_ns(mut self, ns: u64) -> Self {
        self.latency_ns = ns;
        self
    }
    pub fn jitter_ns(mut self, ns: u64) -> Self {
        self.jitter_ns = ns;
        self
    }
    pub fn bandwidth_bps(mut self, bps: u64) -> Self {
        self.bandwidth_bps = bps;
        self
    }
    pub fn loss(mut self, p: f64) -> Self {
        self.loss = clamp_p(p);
        self
    }
    pub fn dup(mut self, p: f64) -> Self {
        self.dup = clamp_p(p);
        self
    }
    pub fn reorder(mut self, p: f64) -> Self {
        self.reorder = clamp_p(p);
        self
    }
    pub fn reorder_delay_ns(mut self, ns: u64) -> Self {
        self.reorder_delay_ns = ns;
        self
    }
    pub fn corrupt(mut self, p: f64) -> Self {
        self.corrupt = clamp_p(p);
        self
    }

    /// Nanoseconds `len` bytes occupy the link, rounded up.
    fn serialization_ns(&self, len: usize) -> u64 {
        if self.bandwidth_bps == 0 {
            return 0;
        }
        let bits = len as u128 * 8 * 1_000_000_000;
        let ns = bits.div_ceil(u128::from(self.bandwidth_bps));
        u64::try_from(ns).unwrap_or(u64::MAX)
    }
}

/// Configuration of a [`SimFabric`]: the seed, the default link and the bounds of the `run_*`
/// calls.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SimConfig {
    pub seed: u64,
    /// Every directed link without an override from [`SimFabric::set_link`].
    pub link: LinkConfig,
    /// Most events one `run_*` call processes before giving up.
    pub step_limit: u64,
    /// Most virtual time one `run_*` call (other than `run_for`) covers before giving up.
    pub time_limit_ns: u64,
}

impl Default for SimConfig {
    /// Seed 0, the default [`LinkConfig`], 10 million steps and 60 s of virtual time per run.
    fn default() -> Self {
        SimConfig { seed: 0, link: LinkConfig::default(), step_limit: 10_000_000, time_limit_ns: 60_000_000_000 }
    }
}

impl SimConfig {
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }
    pub fn link(mut self, link: LinkConfig) -> Self {
        self.link = link;
        self
    }
    pub fn latency_ns(mut self, ns: u64) -> Self {
        self.link = self.link.latency_ns(ns);
        self
    }
    pub fn jitter_ns(mut self, ns: u64) -> Self {
        self.link = self.link.jitter_ns(ns);
        self
    }
    pub fn bandwidth_bps(mut self, bps: u64) -> Self {
        self.link = self.link.bandwidth_bps(bps);
        self
    }
    pub fn loss(mut self, p: f64) -> Self {
        self.link = self.link.loss(p);
        self
    }
    pub fn dup(mut self, p: f64) -> Self {
        self.link = self.link.dup(p);
        self
    }
    pub fn reorder(mut self, p: f64) -> Self {
        self.link = self.link.reorder(p);
        self
    }
    pub fn reorder_delay_ns(mut self, ns: u64) -> Self {
        self.link = self.link.reorder_delay_ns(ns);
        self
    }
    pub fn corrupt(mut self, p: f64) -> Self {
        self.link = self.link.corrupt(p);
        self
    }
    pub fn step_limit(mut self, steps: u64) -> Self {
        self.step_limit = steps;
        self
    }
    pub fn time_limit_ns(mut self, ns: u64) -> Self {
        self.time_limit_ns = ns;
        self
    }
}

/// A device on a fabric: its index in the order of [`SimFabric::add_device`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DeviceId(pub usize);

/// Fabric-wide counters. Once the fabric is idle,
/// `sent - filtered - dropped_no_route - lost - fcs_dropped + duplicated == delivered`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SimCounters {
    /// Datagrams put on the wire: transmitted by devices plus injected.
    pub sent: u64,
    /// Of `sent`, those from [`SimFabric::inject`] / [`SimFabric::inject_to`].
    pub injected: u64,
    /// Dropped by the filter.
    pub filtered: u64,
    /// Delayed by the filter ([`Verdict::Delay`]).
    pub filter_delayed: u64,
    /// Handed to a device's `receive` (duplicates count twice).
    pub delivered: u64,
    pub lost: u64,
    /// Extra copies made.
    pub duplicated: u64,
    /// Copies given the reorder delay.
    pub reordered: u64,
    /// Copies with flipped bits.
    pub corrupted: u64,
    /// Of those, raw packets (Raw QPs' frames and IPv6 datagrams carry no ICRC): the receiving
    /// port's Ethernet FCS check discards them, so they are not delivered.
    pub fcs_dropped: u64,
    /// No device has the destination address (or the datagram has no readable one).
    pub dropped_no_route: u64,
    /// Records the pcap tap failed to write (the tap is dropped on the first failure).
    pub pcap_errors: u64,
}

/// What the filter knows about a datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FilterCtx {
    pub now: u64,
    /// The datagram's number among everything sent on this fabric, from 0.
    pub index: u64,
    /// The sending device; `None` for an injection from an address no device has.
    pub from: Option<DeviceId>,
    /// The receiving device; `None` when it will be dropped for lack of a route.
    pub to: Option<DeviceId>,
    /// Put on the wire by `inject`, not by a device.
    pub injected: bool,
}

/// The filter's decision on a datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Send it on (possibly mutated).
    Pass,
    /// Drop it; counted in `filtered`.
    Drop,
    /// Send it on this many nanoseconds late, outside the link's FIFO order.
    Delay(u64),
}

/// A test's hook on every datagram; see [`SimFabric::set_filter`].
pub type Filter = Box<dyn FnMut(&FilterCtx, &mut Vec<u8>) -> Verdict>;

/// Where the pcap tap records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TapPoint {
    /// Every datagram once, as sent (after the filter, before faults), stamped with the send
    /// time.
    #[default]
    Sent,
    /// Every copy as delivered (faults applied, duplicates twice, in arrival order), stamped
    /// with the arrival time.
    Delivered,
}

struct Node {
    ctx: Context,
    addr: Ipv6Addr,
}

/// Per directed link: when its transmitter is free, and the latest FIFO arrival so far.
#[derive(Debug, Clone, Copy, Default)]
struct LinkState {
    busy_until: u64,
    last_arrival: u64,
}

struct InFlight {
    /// An Ethernet frame of a Raw Ethertype QP, not an IP datagram.
    frame: bool,
    at: u64,
    /// Breaks ties between equal arrival times in send order.
    seq: u64,
    from: Option<DeviceId>,
    to: DeviceId,
    data: Vec<u8>,
}

impl PartialEq for InFlight {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for InFlight {}
impl PartialOrd for InFlight {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for InFlight {
    // Reversed: BinaryHeap is a max-heap and the earliest arrival must come out first.
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

/// A directed link: (sender, receiver); a `None` sender is a foreign injected address.
type LinkKey = (Option<DeviceId>, DeviceId);

/// The datagrams on the wire, taken out in arrival order (ties in send order). A link's
/// ordinary arrivals are FIFO (its clock never goes back, see `SimFabric::offer`), so each
/// link keeps them in a queue and only the queues' heads meet in a heap, one entry per busy
/// link; copies reordered or delayed by the filter wait in a heap of their own. Taking one out
/// then costs a heap step over the busy links, not over every datagram in flight (40,000 with
/// 10,000 QPs four messages deep), and the order is exactly that of one heap of them all.
#[derive(Default)]
struct Wire {
    fifo: BTreeMap<LinkKey, std::collections::VecDeque<InFlight>>,
    /// `(at, seq)` of each non-empty queue's head.
    heads: BinaryHeap<std::cmp::Reverse<(u64, u64, LinkKey)>>,
    late: BinaryHeap<InFlight>,
    len: usize,
}

impl Wire {
    /// Adds a datagram: `in_order` when it arrives no earlier than everything before it on its
    /// link.
    fn push(&mut self, d: InFlight, in_order: bool) {
        self.len += 1;
        if !in_order {
            self.late.push(d);
            return;
        }
        let key = (d.from, d.to);
        let q = self.fifo.entry(key).or_default();
        if q.is_empty() {
            self.heads.push(std::cmp::Reverse((d.at, d.seq, key)));
        }
        q.push_back(d);
    }

    /// The earliest arrival time.
    fn next_at(&self) -> Option<u64> {
        let head = self.heads.peek().map(|h| h.0 .0);
        let late = self.late.peek().map(|d| d.at);
        head.into_iter().chain(late).min()
    }

    /// Whether the earliest datagram waits in `late` rather than at a link queue's head.
    fn earliest_is_late(&self) -> bool {
        let head = self.heads.peek().map(|h| (h.0 .0, h.0 .1));
        let late = self.late.peek().map(|d| (d.at, d.seq));
        match (head, late) {
            (Some(h), Some(l)) => l < h,
            (None, Some(_)) => true,
            _ => false,
        }
    }

    /// The earliest datagram, left in place, if it arrives by `now`.
    fn peek_due(&self, now: u64) -> Option<&InFlight> {
        let d = if self.earliest_is_late() {
            self.late.peek()?
        } else {
            let std::cmp::Reverse((_, _, key)) = self.heads.peek()?;
            self.fifo.get(key)?.front()?
        };
        (d.at <= now).then_some(d)
    }

    /// Takes out the earliest datagram if it arrives by `now`.
    fn pop_due(&mut self, now: u64) -> Option<InFlight> {
        let d = if self.earliest_is_late() {
            self.late.peek().filter(|d| d.at <= now)?;
            self.late.pop()?
        } else {
            let std::cmp::Reverse((at, _, key)) = *self.heads.peek()?;
            if at > now {
                return None;
            }
            self.heads.pop();
            let q = self.fifo.get_mut(&key)?;
            let d = q.pop_front()?;
            if let Some(next) = q.front() {
                self.heads.push(std::cmp::Reverse((next.at, next.seq, key)));
            }
            d
        };
        self.len -= 1;
        Some(d)
    }
}

enum StepOutcome {
    Idle,
    /// The next event lies past the horizon; the clock did not move.
    Beyond,
    Progress,
}

/// Where a datagram goes: the device with its destination address (none: lost), or every
/// device for a multicast address.
enum Route {
    To(Option<DeviceId>),
    Everyone,
}

/// A deterministic fabric joining [`Context`]s; see the module docs.
pub struct SimFabric {
    config: SimConfig,
    rng: StdRng,
    now: u64,
    nodes: Vec<Node>,
    by_addr: BTreeMap<Ipv6Addr, DeviceId>,
    /// Overrides keyed by (sender, receiver); a `None` sender is a foreign injected address.
    links: BTreeMap<LinkKey, LinkConfig>,
    link_state: BTreeMap<LinkKey, LinkState>,
    in_flight: Wire,
    next_seq: u64,
    counters: SimCounters,
    filter: Option<Filter>,
    /// Middleware any link takes (see `link::tap`), after the filter.
    taps: super::Taps,
    tap: Option<PcapTap<Box<dyn Write>>>,
    tap_point: TapPoint,
    tx_buf: Vec<u8>,
    pool: Vec<Vec<u8>>,
    /// A device hit [`MAX_TX_PER_DRAIN`] and may have more to send at `now`.
    tx_backlog: bool,
}

impl fmt::Debug for SimFabric {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimFabric")
            .field("now", &self.now)
            .field("devices", &self.nodes.len())
            .field("in_flight", &self.in_flight.len)
            .field("counters", &self.counters)
            .finish_non_exhaustive()
    }
}

/// SplitMix64: turns the fabric seed and a device index into independent device seeds, so
/// adding a device never shifts the fabric's own random stream.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A Bernoulli draw that takes nothing from the RNG when `p` is 0, so a fault that is off
/// leaves the random stream of the others as it was. Never panics, whatever `p` is.
fn chance(rng: &mut StdRng, p: f64) -> bool {
    p > 0.0 && rng.random::<f64>() < p
}

/// Whether bit `bit` (0 = MSB of byte 0) of a RoCEv2 datagram is a variant field the receiver
/// cannot check (see the module docs).
fn is_variant_bit(ip_len: usize, bit: usize) -> bool {
    let byte = bit / 8;
    let udp_csum = ip_len + 6..ip_len + 8;
    let bth_byte4 = ip_len + UDP_HEADER_LEN + 4;
    if udp_csum.contains(&byte) || byte == bth_byte4 {
        return true;
    }
    if ip_len == IPV4_HEADER_LEN {
        matches!(byte, 1 | 8 | 10 | 11)
    } else {
        // Traffic class and flow label are bits 4..32; hop limit is byte 7.
        (4..32).contains(&bit) || byte == 7
    }
}

/// Flips 1 to 3 distinct checkable bits of `data` (see the module docs); returns whether any
/// bit was flipped.
fn corrupt_bits(rng: &mut StdRng, data: &mut [u8]) -> bool {
    if data.is_empty() {
        return false;
    }
    let ip_len = match data[0] >> 4 {
        4 if data[0] & 0x0f == 5 => Some(IPV4_HEADER_LEN),
        6 => Some(IPV6_HEADER_LEN),
        _ => None,
    }
    .filter(|len| data.len() >= len + UDP_HEADER_LEN + BTH_LEN);
    let nbits = data.len() * 8;
    let want = rng.random_range(1..=3usize);
    let mut flipped = [usize::MAX; 3];
    let mut n = 0;
    // Rejection sampling terminates quickly: at most 60 of the datagram's bits are excluded.
    for _ in 0..64 {
        if n == want {
            break;
        }
        let bit = rng.random_range(0..nbits);
        if flipped[..n].contains(&bit) || ip_len.is_some_and(|l| is_variant_bit(l, bit)) {
            continue;
        }
        data[bit / 8] ^= 0x80 >> (bit % 8);
        flipped[n] = bit;
        n += 1;
    }
    n > 0
}

impl SimFabric {
    pub fn new(config: SimConfig) -> Self {
        SimFabric {
            config,
            rng: StdRng::seed_from_u64(config.seed),
            now: 0,
            nodes: Vec::new(),
            by_addr: BTreeMap::new(),
            links: BTreeMap::new(),
            link_state: BTreeMap::new(),
            in_flight: Wire::default(),
            next_seq: 0,
            counters: SimCounters::default(),
            filter: None,
            taps: Default::default(),
            tap: None,
            tap_point: TapPoint::Sent,
            tx_buf: vec![0; MAX_DATAGRAM],
            pool: Vec::new(),
            tx_backlog: false,
        }
    }

    /// Creates a device named `name` with the next free address (127.1.0.1, 127.1.0.2, …) as
    /// GID 0 and a seed derived from the fabric's, and attaches it.
    pub fn add_device(&mut self, name: &str) -> Result<Context> {
        self.add_device_with(DeviceConfig::default().name(name))
    }

    /// As [`add_device`](Self::add_device) from a full config (attributes, P_Key table, …).
    /// A zero `gid0` gets the next free address, a non-zero one (IPv4-mapped or IPv6) is kept;
    /// a missing seed is derived from the fabric's.
    pub fn add_device_with(&mut self, mut config: DeviceConfig) -> Result<Context> {
        let index = self.nodes.len();
        if config.gid0.is_zero() {
            config.gid0 = Gid::from_ipv4(self.next_free_addr()?);
        }
        let addr = config.gid0.to_ipv6();
        if self.by_addr.contains_key(&addr) {
            return Err(VerbsError::InvalidArgument("address already on the fabric"));
        }
        if config.seed.is_none() {
            config.seed = Some(mix(self.config.seed ^ mix(index as u64)));
        }
        // The fabric carries raw packets: frames by MAC, Raw IPv6 datagrams by address.
        for max in [&mut config.attr.max_raw_ipv6_qp, &mut config.attr.max_raw_ethy_qp] {
            if *max == 0 {
                *max = RAW_QPS;
            }
        }
        let ctx = Context::create(config)?;
        self.by_addr.insert(addr, DeviceId(index));
        self.nodes.push(Node { ctx: ctx.clone(), addr });
        Ok(ctx)
    }

    fn next_free_addr(&self) -> Result<Ipv4Addr> {
        (1..=0xffffu32)
            .map(|n| Ipv4Addr::new(127, 1, (n >> 8) as u8, n as u8))
            .find(|a| !self.by_addr.contains_key(&a.to_ipv6_mapped()))
            .ok_or(VerbsError::InsufficientResources)
    }

    /// The current virtual time in nanoseconds (starts at 0).
    pub fn now(&self) -> u64 {
        self.now
    }

    pub fn counters(&self) -> SimCounters {
        self.counters
    }

    pub fn config(&self) -> &SimConfig {
        &self.config
    }

    /// The devices in the order they were added.
    pub fn devices(&self) -> impl Iterator<Item = (DeviceId, &Context)> {
        self.nodes.iter().enumerate().map(|(i, n)| (DeviceId(i), &n.ctx))
    }

    pub fn device(&self, id: DeviceId) -> Option<&Context> {
        self.nodes.get(id.0).map(|n| &n.ctx)
    }

    /// The fabric's id for a device handle (any clone of it).
    pub fn id_of(&self, ctx: &Context) -> Option<DeviceId> {
        self.nodes.iter().position(|n| Arc::ptr_eq(&n.ctx.inner, &ctx.inner)).map(DeviceId)
    }

    /// The device at an address (IPv4 as IPv4-mapped IPv6).
    pub fn id_of_addr(&self, addr: Ipv6Addr) -> Option<DeviceId> {
        self.by_addr.get(&addr).copied()
    }

    /// A device's address as an IPv6 (IPv4-mapped) address: its GID 0.
    pub fn addr(&self, id: DeviceId) -> Option<Ipv6Addr> {
        self.nodes.get(id.0).map(|n| n.addr)
    }

    /// The MAC of a device (as the pcap capture shows it): where a Raw Ethertype frame for it
    /// is addressed.
    pub fn mac(&self, id: DeviceId) -> Option<[u8; 6]> {
        (id.0 < self.nodes.len()).then(|| mac_for_index(id.0))
    }

    pub fn gid(&self, id: DeviceId) -> Option<Gid> {
        self.addr(id).map(Gid::from_ipv6)
    }

    /// Replaces the link used by every direction without an override. In-flight datagrams keep
    /// their timing.
    pub fn set_default_link(&mut self, link: LinkConfig) {
        self.config.link = link;
    }

    /// Overrides the link from `from` to `to` (one direction; call twice for both). A link
    /// with `loss(1.0)` partitions.
    pub fn set_link(&mut self, from: DeviceId, to: DeviceId, link: LinkConfig) {
        self.links.insert((Some(from), to), link);
    }

    /// Removes an override from [`set_link`](Self::set_link).
    pub fn clear_link(&mut self, from: DeviceId, to: DeviceId) {
        self.links.remove(&(Some(from), to));
    }

    fn link_config(&self, from: Option<DeviceId>, to: DeviceId) -> LinkConfig {
        self.links.get(&(from, to)).copied().unwrap_or(self.config.link)
    }

    /// Installs a hook called for every datagram before faults (see the module docs) with its
    /// sender and receiver; it may rewrite the bytes (re-seal them with [`reseal`] or
    /// [`rewrite`] so the ICRC matches), drop or delay the datagram.
    pub fn set_filter(&mut self, filter: impl FnMut(&FilterCtx, &mut Vec<u8>) -> Verdict + 'static) {
        self.filter = Some(Box::new(filter));
    }

    pub fn clear_filter(&mut self) {
        self.filter = None;
    }

    /// Adds a tap (see [`crate::link::tap`]) after those added before: it sees every datagram
    /// as sent (after the filter) and every copy as it arrives, before the device, and may
    /// drop or duplicate it there.
    pub fn add_tap(&mut self, tap: super::TapHandle) {
        self.taps.push(tap);
    }

    /// Taps every datagram into a pcap stream at [`TapPoint::Sent`] (see the module docs);
    /// writes the file header now. Replaces any earlier tap.
    pub fn set_pcap(&mut self, out: impl Write + 'static) -> io::Result<()> {
        self.set_pcap_at(out, TapPoint::Sent)
    }

    /// As [`set_pcap`](Self::set_pcap) at the given tap point.
    pub fn set_pcap_at(&mut self, out: impl Write + 'static, point: TapPoint) -> io::Result<()> {
        self.tap = Some(PcapTap::new(Box::new(out) as Box<dyn Write>)?);
        self.tap_point = point;
        Ok(())
    }

    /// Taps into a new file at `path` (buffered; flushed by [`flush_pcap`](Self::flush_pcap),
    /// a replacing tap, or dropping the fabric).
    pub fn pcap_file(&mut self, path: impl AsRef<Path>) -> io::Result<()> {
        self.set_pcap(BufWriter::new(File::create(path)?))
    }

    pub fn flush_pcap(&mut self) -> io::Result<()> {
        self.tap.as_mut().map_or(Ok(()), PcapTap::flush)
    }

    /// Stops tapping, flushing what was written.
    pub fn clear_pcap(&mut self) -> io::Result<()> {
        let r = self.flush_pcap();
        self.tap = None;
        r
    }

    /// Puts a hand-made datagram on the wire at `now`, as if sent by the device owning its IP
    /// source address (or a foreign host), to the device owning its destination address. It
    /// meets the filter, the tap and the faults like any other.
    pub fn inject(&mut self, datagram: impl Into<Vec<u8>>) {
        let data = datagram.into();
        let from = self.source_of(&data);
        self.counters.injected += 1;
        self.offer(from, None, data, true);
    }

    /// As [`inject`](Self::inject) but delivered to `to` whatever the headers say, so a test
    /// can hand a device bytes that are not even IP.
    pub fn inject_to(&mut self, to: DeviceId, datagram: impl Into<Vec<u8>>) {
        let data = datagram.into();
        let from = self.source_of(&data);
        self.counters.injected += 1;
        let to = if to.0 < self.nodes.len() { Some(to) } else { None };
        self.offer(from, Some(to), data, true);
    }

    fn source_of(&self, datagram: &[u8]) -> Option<DeviceId> {
        roce::split_ip(datagram).ok().and_then(|s| self.id_of_addr(s.ip.src_gid()))
    }

    fn route(&self, datagram: &[u8]) -> Route {
        let dst = match roce::raw_ipv6_dst(datagram) {
            Some(dst) if dst.octets()[0] == 0xFF => return Route::Everyone,
            Some(dst) => Some(dst),
            None => match roce::split_ip(datagram) {
                Ok(s) if s.ip.dst_is_multicast() => return Route::Everyone,
                Ok(s) => Some(s.ip.dst_gid()),
                Err(_) => None,
            },
        };
        Route::To(dst.and_then(|d| self.id_of_addr(d)))
    }

    fn buffer_from(&mut self, bytes: &[u8]) -> Vec<u8> {
        let mut v = self.pool.pop().unwrap_or_default();
        v.clear();
        v.extend_from_slice(bytes);
        v
    }

    fn recycle(&mut self, v: Vec<u8>) {
        if self.pool.len() < MAX_POOLED {
            self.pool.push(v);
        }
    }

    fn tap_mac(id: Option<DeviceId>) -> [u8; 6] {
        id.map_or(UNKNOWN_MAC, |d| mac_for_index(d.0))
    }

    fn tap_write(&mut self, at: u64, from: Option<DeviceId>, to: Option<DeviceId>, data: &[u8], frame: bool) {
        if let Some(tap) = self.tap.as_mut() {
            let written = if frame {
                tap.write_frame(at, data)
            } else {
                tap.write_datagram(at, Self::tap_mac(from), Self::tap_mac(to), data)
            };
            if written.is_err() {
                self.counters.pcap_errors += 1;
                self.tap = None;
            }
        }
    }

    /// Puts one datagram on the wire at `now`. `forced_to` overrides routing (`Some(None)`:
    /// to nobody).
    /// A datagram to a multicast address goes to every device, its sender's included (as IP
    /// multicast loops back to its host): each device's group table decides who takes it.
    #[inline]
    fn offer(&mut self, from: Option<DeviceId>, forced_to: Option<Option<DeviceId>>, data: Vec<u8>, injected: bool) {
        let to = match forced_to {
            Some(to) => to,
            None => match self.route(&data) {
                Route::To(to) => to,
                Route::Everyone => return self.offer_everyone(from, data, injected),
            },
        };
        self.offer_to(from, to, data, injected, false);
    }

    /// A multicast datagram: a copy to every device.
    #[cold]
    fn offer_everyone(&mut self, from: Option<DeviceId>, data: Vec<u8>, injected: bool) {
        for i in 0..self.nodes.len() {
            let copy = self.buffer_from(&data);
            self.offer_to(from, Some(DeviceId(i)), copy, injected, false);
        }
        self.recycle(data);
    }

    /// Puts a Raw Ethertype QP's frame on the wire: to the device with its destination MAC,
    /// or to every other device for a broadcast or multicast one. The filter and the taps,
    /// which deal in IP datagrams, do not see frames; the pcap capture and the faults do.
    fn offer_frame(&mut self, from: DeviceId, frame: Vec<u8>) {
        let dst: [u8; 6] = frame.get(..6).and_then(|d| d.try_into().ok()).unwrap_or(UNKNOWN_MAC);
        if dst[0] & 1 == 0 {
            let to = (0..self.nodes.len()).find(|&i| mac_for_index(i) == dst).map(DeviceId);
            return self.offer_to(Some(from), to, frame, false, true);
        }
        for i in (0..self.nodes.len()).filter(|&i| i != from.0) {
            let copy = self.buffer_from(&frame);
            self.offer_to(Some(from), Some(DeviceId(i)), copy, false, true);
        }
        self.recycle(frame);
    }

    fn offer_to(
        &mut self,
        from: Option<DeviceId>,
        to: Option<DeviceId>,
        mut data: Vec<u8>,
        injected: bool,
        frame: bool,
    ) {
        let now = self.now;
        let index = self.counters.sent;
        self.counters.sent += 1;

        let mut extra_delay = None;
        if let Some(filter) = self.filter.as_mut().filter(|_| !frame) {
            match filter(&FilterCtx { now, index, from, to, injected }, &mut data) {
                Verdict::Pass => {}
                Verdict::Drop => {
                    self.counters.filtered += 1;
                    self.recycle(data);
                    return;
                }
                Verdict::Delay(ns) => {
                    self.counters.filter_delayed += 1;
                    extra_delay = Some(ns);
                }
            }
        }
        if self.tap_point == TapPoint::Sent {
            self.tap_write(now, from, to, &data, frame);
        }
        if !self.taps.is_empty() && !frame {
            self.taps.sent(now, &data);
        }
        let Some(to) = to else {
            self.counters.dropped_no_route += 1;
            self.recycle(data);
            return;
        };

        let link = self.link_config(from, to);
        let state = self.link_state.entry((from, to)).or_default();
        let done = now.max(state.busy_until).saturating_add(link.serialization_ns(data.len()));
        state.busy_until = done;
        if chance(&mut self.rng, link.loss) {
            self.counters.lost += 1;
            self.recycle(data);
            return;
        }
        let copy = if chance(&mut self.rng, link.dup) {
            self.counters.duplicated += 1;
            Some(self.buffer_from(&data))
        } else {
            None
        };
        let raw = frame || roce::is_raw_ipv6(&data);
        for mut bytes in std::iter::once(data).chain(copy) {
            if chance(&mut self.rng, link.corrupt) {
                if raw {
                    // No ICRC to catch it: the Ethernet FCS does, at the receiving port.
                    self.counters.corrupted += 1;
                    self.counters.fcs_dropped += 1;
                    self.recycle(bytes);
                    continue;
                }
                if corrupt_bits(&mut self.rng, &mut bytes) {
                    self.counters.corrupted += 1;
                }
            }
            let jitter = if link.jitter_ns > 0 { self.rng.random_range(0..=link.jitter_ns) } else { 0 };
            let mut at = done.saturating_add(link.latency_ns).saturating_add(jitter);
            let reordered = chance(&mut self.rng, link.reorder);
            let state = self.link_state.entry((from, to)).or_default();
            let in_order = !(reordered || extra_delay.is_some());
            if !in_order {
                if reordered {
                    self.counters.reordered += 1;
                    at = at.saturating_add(link.reorder_delay_ns);
                }
                at = at.saturating_add(extra_delay.unwrap_or(0));
            } else {
                at = at.max(state.last_arrival);
                state.last_arrival = at;
            }
            let seq = self.next_seq;
            self.next_seq += 1;
            self.in_flight.push(InFlight { frame, at, seq, from, to, data: bytes }, in_order);
        }
    }

    /// Takes every device's pending output at `now`.
    fn drain(&mut self) {
        self.tx_backlog = false;
        for i in 0..self.nodes.len() {
            let mut sent = 0;
            while let Some(n) = self.nodes[i].ctx.transmit(self.now, &mut self.tx_buf) {
                let n = n.min(self.tx_buf.len());
                let mut data = self.pool.pop().unwrap_or_default();
                data.clear();
                data.extend_from_slice(&self.tx_buf[..n]);
                self.offer(Some(DeviceId(i)), None, data, false);
                sent += 1;
                if sent == MAX_TX_PER_DRAIN {
                    self.tx_backlog = true;
                    break;
                }
            }
            while let Some(n) = self.nodes[i].ctx.transmit_frame(self.now, &mut self.tx_buf) {
                let n = n.min(self.tx_buf.len());
                let mut data = self.pool.pop().unwrap_or_default();
                data.clear();
                data.extend_from_slice(&self.tx_buf[..n]);
                self.offer_frame(DeviceId(i), data);
                sent += 1;
                if sent == MAX_TX_PER_DRAIN {
                    self.tx_backlog = true;
                    break;
                }
            }
        }
    }

    /// The earliest pending event: an arrival, a device timer, or more output right now.
    fn next_event(&self) -> Option<u64> {
        let arrival = self.in_flight.next_at();
        let timer = self.nodes.iter().filter_map(|n| n.ctx.poll_timeout()).min();
        let backlog = self.tx_backlog.then_some(self.now);
        [arrival, timer, backlog].into_iter().flatten().min()
    }

    fn step_bounded(&mut self, horizon: u64) -> StepOutcome {
        self.drain();
        let Some(next) = self.next_event() else {
            return StepOutcome::Idle;
        };
        if next > horizon {
            return StepOutcome::Beyond;
        }
        // A timer already in the past runs now; the clock never goes back.
        self.now = self.now.max(next);
        let now = self.now;
        while let Some(pkt) = self.in_flight.pop_due(now) {
            // The next one's QP starts toward the cache while this one is handled, unless it
            // is this one's (a burst of one QP's packets: the lookup would be for nothing).
            let other_qp = |n: &InFlight| {
                !n.frame && (n.to != pkt.to || roce::peek_dest_qp(&n.data) != roce::peek_dest_qp(&pkt.data))
            };
            if let Some(next) = self.in_flight.peek_due(now).filter(|n| other_qp(n)) {
                if let Some(node) = self.nodes.get(next.to.0) {
                    node.ctx.prefetch_receive(&next.data);
                }
            }
            if self.tap_point == TapPoint::Delivered {
                self.tap_write(now, pkt.from, Some(pkt.to), &pkt.data, pkt.frame);
            }
            if let (true, Some(node)) = (pkt.frame, self.nodes.get(pkt.to.0)) {
                node.ctx.receive_frame(&pkt.data);
                self.counters.delivered += 1;
            } else if let Some(node) = self.nodes.get(pkt.to.0) {
                for _ in 0..self.taps.copies_arriving(now, &pkt.data) {
                    node.ctx.receive(now, &pkt.data);
                    self.counters.delivered += 1;
                }
            }
            self.recycle(pkt.data);
        }
        for node in &self.nodes {
            if node.ctx.poll_timeout().is_some_and(|t| t <= now) {
                node.ctx.handle_timeout(now);
            }
        }
        StepOutcome::Progress
    }

    /// Processes the next event (see the module docs); `false` when nothing at all is
    /// pending. Unbounded in virtual time: a step may jump the clock arbitrarily far.
    pub fn step(&mut self) -> bool {
        !matches!(self.step_bounded(u64::MAX), StepOutcome::Idle)
    }

    /// Steps until `cond` holds (checked before every step) and returns `true`; `false` if the
    /// fabric goes idle first or the config's step or virtual-time limit is reached.
    pub fn run_until(&mut self, cond: impl FnMut(&SimFabric) -> bool) -> bool {
        self.run_until_within(self.config.time_limit_ns, cond)
    }

    /// As [`run_until`](Self::run_until) giving up after `max_ns` of virtual time.
    pub fn run_until_within(&mut self, max_ns: u64, mut cond: impl FnMut(&SimFabric) -> bool) -> bool {
        let horizon = self.now.saturating_add(max_ns);
        let mut steps = 0;
        loop {
            if cond(self) {
                return true;
            }
            if steps >= self.config.step_limit {
                return false;
            }
            match self.step_bounded(horizon) {
                StepOutcome::Progress => steps += 1,
                StepOutcome::Idle => return cond(self),
                StepOutcome::Beyond => return false,
            }
        }
    }

    /// Processes every event up to `now + ns`, then sets the clock there (even if idle).
    /// `false` if the step limit stopped it first.
    pub fn run_for(&mut self, ns: u64) -> bool {
        let target = self.now.saturating_add(ns);
        let mut steps = 0;
        loop {
            if steps >= self.config.step_limit {
                return false;
            }
            match self.step_bounded(target) {
                StepOutcome::Progress => steps += 1,
                StepOutcome::Idle | StepOutcome::Beyond => break,
            }
        }
        self.now = self.now.max(target);
        true
    }

    /// Steps until nothing is pending (`true`) or a limit is reached (`false`).
    pub fn run_until_idle(&mut self) -> bool {
        let horizon = self.now.saturating_add(self.config.time_limit_ns);
        let mut steps = 0;
        loop {
            if steps >= self.config.step_limit {
                return false;
            }
            match self.step_bounded(horizon) {
                StepOutcome::Progress => steps += 1,
                StepOutcome::Idle => return true,
                StepOutcome::Beyond => return false,
            }
        }
    }

    /// Datagrams on the wire, not yet delivered.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len
    }
}

impl Drop for SimFabric {
    fn drop(&mut self) {
        // Nowhere to report a failure from a destructor; `flush_pcap` is there for callers
        // who care.
        let _ = self.flush_pcap();
    }
}

/// Recomputes what a mutated datagram's receiver checks, so that only the mutation is seen:
/// the IPv4 header checksum, the ICRC, and the UDP checksum when it was non-zero. The IP and
/// UDP lengths must still be consistent.
pub fn reseal(datagram: &mut [u8]) -> std::result::Result<(), WireError> {
    if datagram.first().is_some_and(|b| b >> 4 == 4) && datagram.len() >= IPV4_HEADER_LEN {
        roce::Ipv4Header::new_unchecked(&mut datagram[..]).fill_checksum();
    }
    let split = roce::split_ip(datagram)?;
    let (ip, checksum) = (split.ip, split.udp.checksum);
    roce::seal(datagram, &ip, checksum)
}

/// Parses `datagram` (without checking its ICRC), lets `edit` change any header field or the
/// payload, and re-emits it in place, sealed. The edit must leave a packet the opcode table
/// accepts (e.g. change an opcode only to one with the same extended headers), else the
/// datagram is left unchanged and the error returned; use byte edits and [`reseal`] for
/// anything else.
pub fn rewrite(datagram: &mut Vec<u8>, edit: impl FnOnce(&mut RoceRepr<'_>)) -> std::result::Result<(), WireError> {
    let mut out = Vec::new();
    {
        let parsed = roce::parse_ip_unverified(datagram)?;
        let mut repr = parsed.to_repr();
        edit(&mut repr);
        out.resize(repr.buffer_len(), 0);
        let n = repr.emit(&mut out)?;
        out.truncate(n);
    }
    *datagram = out;
    Ok(())
}

/// Convenience for tests building datagrams: the IP header of a datagram from `src` to `dst`
/// (IPv4 when both are IPv4-mapped, else IPv6).
pub fn ip_between(src: Ipv6Addr, dst: Ipv6Addr) -> IpRepr {
    match (src.to_ipv4_mapped(), dst.to_ipv4_mapped()) {
        (Some(s), Some(d)) => IpRepr::V4(roce::Ipv4Repr::new(s, d)),
        _ => IpRepr::V6(roce::Ipv6Repr::new(src, dst)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The per-link queues give exactly the order of one heap of every datagram: by arrival,
    /// ties in send order, with late copies anywhere among them; a peek shows the one a pop
    /// takes.
    #[test]
    fn the_wire_pops_in_the_order_of_one_heap() {
        let mut rng = StdRng::seed_from_u64(7);
        let (mut wire, mut heap) = (Wire::default(), BinaryHeap::new());
        let mut last = BTreeMap::new();
        let (mut now, mut seq, mut popped) = (0u64, 0u64, 0usize);
        for _ in 0..20_000 {
            if rng.random_range(0..3) > 0 {
                let (from, to) =
                    (rng.random_range(0..3usize).checked_sub(1).map(DeviceId), DeviceId(rng.random_range(0..3)));
                let in_order = rng.random_range(0..10) > 0;
                let mut at = now + rng.random_range(0..50);
                if in_order {
                    let l = last.entry((from, to)).or_insert(0u64);
                    at = at.max(*l);
                    *l = at;
                }
                let d = |data| InFlight { frame: false, at, seq, from, to, data };
                wire.push(d(vec![]), in_order);
                heap.push(d(vec![]));
                seq += 1;
            } else {
                now += rng.random_range(0..20);
                assert_eq!(wire.next_at(), heap.peek().map(|d: &InFlight| d.at));
                loop {
                    // What the sim prefetches for is what comes out next.
                    let peeked = wire.peek_due(now).map(|d| (d.at, d.seq));
                    let Some(d) = wire.pop_due(now) else {
                        assert_eq!(peeked, None);
                        break;
                    };
                    assert_eq!(peeked, Some((d.at, d.seq)));
                    let want = heap.pop().expect("the reference has it too");
                    assert_eq!((d.at, d.seq), (want.at, want.seq));
                    popped += 1;
                }
                assert!(heap.peek().is_none_or(|d| d.at > now));
                assert_eq!(wire.len, heap.len());
            }
        }
        assert!(popped > 5_000, "{popped}");
    }
}
