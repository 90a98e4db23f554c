//! The simulated fabric on its own: addressing, the virtual clock, latency and bandwidth
//! arithmetic, faults, the filter, injection, the pcap tap and determinism. Until the transport
//! emits packets, traffic is injected by hand.

use std::cell::RefCell;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::rc::Rc;

use softhca::link::pcap::{mac_for_index, SharedBuf};
use softhca::link::sim::{ip_between, reseal, rewrite};
use softhca::link::{DeviceId, LinkConfig, SimConfig, SimCounters, SimFabric, TapPoint, Verdict};
use softhca::wire::pcap::{PcapReader, PcapRecord};
use softhca::wire::roce::{self, UdpRepr, ETHERTYPE_IPV4, ETHERTYPE_IPV6};
use softhca::wire::{BthRepr, Opcode, PacketRepr, Psn, RoceRepr, UdpChecksum, WireError};
use softhca::{DeviceConfig, Gid};

/// A valid RC Send Only datagram from `src` to `dst` carrying `psn` and `payload`.
fn datagram(src: Ipv6Addr, dst: Ipv6Addr, psn: u32, payload: &[u8]) -> Vec<u8> {
    let ip = ip_between(src, dst);
    let repr = RoceRepr {
        ip,
        udp: UdpRepr::for_qp(0x11, UdpChecksum::default_for(&ip)),
        packet: PacketRepr {
            payload,
            ..PacketRepr::new(BthRepr::new(Opcode::RcSendOnly, 0xffff, 0x22, Psn::new(psn)))
        },
    };
    let mut buf = vec![0; repr.buffer_len()];
    let n = repr.emit(&mut buf).unwrap();
    buf.truncate(n);
    buf
}

/// A fabric with two devices, their addresses.
fn pair(config: SimConfig) -> (SimFabric, Ipv6Addr, Ipv6Addr) {
    let mut f = SimFabric::new(config);
    f.add_device("sim-a").unwrap();
    f.add_device("sim-b").unwrap();
    let (a, b) = (f.addr(DeviceId(0)).unwrap(), f.addr(DeviceId(1)).unwrap());
    (f, a, b)
}

fn records(buf: &SharedBuf) -> Vec<PcapRecord> {
    PcapReader::new(&buf.contents()[..]).unwrap().map(Result::unwrap).collect()
}

fn psn_of(frame: &[u8]) -> u32 {
    u32::from(roce::parse_ip_unverified(&frame[14..]).unwrap().packet.bth.psn)
}

/// Steps to idle, returning the time of each step that delivered something.
fn delivery_times(f: &mut SimFabric) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut before = f.counters().delivered;
    while f.step() {
        let d = f.counters().delivered;
        if d > before {
            out.push((f.now(), d - before));
        }
        before = d;
    }
    out
}

fn conservation_holds(c: &SimCounters) -> bool {
    c.sent - c.filtered - c.dropped_no_route - c.lost - c.fcs_dropped + c.duplicated == c.delivered
}

#[test]
fn devices_get_loopback_addresses_in_order() {
    let mut f = SimFabric::new(SimConfig::default());
    let a = f.add_device("addr-a").unwrap();
    let b = f.add_device("addr-b").unwrap();
    assert_eq!(a.query_gid(1, 0).unwrap(), Gid::from_ipv4(Ipv4Addr::new(127, 1, 0, 1)));
    assert_eq!(b.query_gid(1, 0).unwrap(), Gid::from_ipv4(Ipv4Addr::new(127, 1, 0, 2)));
    assert_eq!(f.id_of(&b.clone()), Some(DeviceId(1)));
    assert_eq!(f.gid(DeviceId(0)), Some(Gid::from_ipv4(Ipv4Addr::new(127, 1, 0, 1))));
    assert_eq!(f.id_of_addr(Ipv4Addr::new(127, 1, 0, 2).to_ipv6_mapped()), Some(DeviceId(1)));
    assert_eq!(f.devices().count(), 2);

    // An explicit IPv6 address is kept; a taken one is refused.
    let v6: Ipv6Addr = "fd00::5".parse().unwrap();
    let c = f.add_device_with(DeviceConfig::default().name("addr-c").gid0(Gid::from_ipv6(v6))).unwrap();
    assert_eq!(c.query_gid(1, 0).unwrap(), Gid::from_ipv6(v6));
    assert!(f.add_device_with(DeviceConfig::default().name("addr-d").gid0(Gid::from_ipv6(v6))).is_err());
    assert_eq!(f.addr(DeviceId(2)), Some(v6));
    assert_eq!(f.addr(DeviceId(3)), None);
}

#[test]
fn latency_is_exact_on_the_virtual_clock() {
    let (mut f, a, b) = pair(SimConfig::default().latency_ns(5_000));
    assert_eq!(f.now(), 0);
    f.inject(datagram(a, b, 0, b"x"));
    assert_eq!(f.in_flight(), 1);
    assert!(f.step());
    assert_eq!((f.now(), f.counters().delivered), (5_000, 1));
    assert!(!f.step(), "idle");
    assert_eq!(f.now(), 5_000, "an idle step does not move the clock");

    // Sent later, arrives later by the same amount.
    f.run_for(1_000);
    assert_eq!(f.now(), 6_000);
    f.inject(datagram(b, a, 1, b"y"));
    assert_eq!(delivery_times(&mut f), vec![(11_000, 1)]);
}

/// Bandwidth serializes datagrams per directed link: at 1 Gb/s a byte takes 8 ns, and each
/// datagram waits for the one before it; the reverse direction is independent.
#[test]
fn bandwidth_serialization_is_exact() {
    let (mut f, a, b) = pair(SimConfig::default().latency_ns(1_000).bandwidth_bps(1_000_000_000));
    let d = datagram(a, b, 0, &[7; 100]);
    let len = d.len() as u64;
    for _ in 0..3 {
        f.inject(d.clone());
    }
    f.inject(datagram(b, a, 0, &[7; 100]));
    let ser = len * 8;
    assert_eq!(delivery_times(&mut f), vec![(ser + 1_000, 2), (2 * ser + 1_000, 1), (3 * ser + 1_000, 1)]);

    // Rounding is up: 3 bits per second make one byte take 8/3 s.
    let (mut f, a, b) = pair(SimConfig::default().latency_ns(0).bandwidth_bps(3));
    let d = datagram(a, b, 0, &[]);
    let ns = (d.len() as u64 * 8 * 1_000_000_000).div_ceil(3);
    f.inject(d);
    assert_eq!(delivery_times(&mut f), vec![(ns, 1)]);

    // A link idle since before the send does not delay it.
    let (mut f, a, b) = pair(SimConfig::default().latency_ns(100).bandwidth_bps(8_000_000_000));
    f.inject(datagram(a, b, 0, &[0; 4]));
    f.run_for(1_000_000);
    let d = datagram(a, b, 1, &[0; 4]);
    let len = d.len() as u64;
    f.inject(d);
    assert_eq!(delivery_times(&mut f), vec![(1_000_000 + len + 100, 1)]);
}

#[test]
fn unknown_destinations_are_dropped_and_counted() {
    let (mut f, a, b) = pair(SimConfig::default());
    let nowhere = Ipv4Addr::new(127, 1, 0, 99).to_ipv6_mapped();
    f.inject(datagram(a, nowhere, 0, b"lost"));
    f.inject(vec![0xde, 0xad]);
    // inject_to delivers even bytes that are not IP, for Class D tests.
    f.inject_to(DeviceId(1), vec![0xde, 0xad]);
    f.inject_to(DeviceId(9), datagram(a, b, 0, b""));
    assert!(f.run_until_idle());
    let c = f.counters();
    assert_eq!((c.sent, c.injected, c.dropped_no_route, c.delivered), (4, 4, 3, 1));
    assert!(conservation_holds(&c));
    // The stub transport counts nothing yet; once it does, garbage must land in rx_dropped.
    let _ = f.device(DeviceId(1)).unwrap().counters();
}

#[test]
fn loss_and_duplication_rates_are_as_configured() {
    let (mut f, a, b) = pair(SimConfig::default().seed(11).loss(0.1).dup(0.05));
    let n = 20_000u64;
    for i in 0..n {
        f.inject(datagram(a, b, i as u32, b"rate"));
    }
    assert!(f.run_until_idle());
    let c = f.counters();
    assert!(conservation_holds(&c), "{c:?}");
    // Binomial bounds of about ±5 standard deviations; the seed is fixed, so this is exact.
    assert!((1_800..=2_200).contains(&c.lost), "{c:?}");
    assert!((780..=1_020).contains(&c.duplicated), "{c:?}");
    assert_eq!(c.delivered, n - c.lost + c.duplicated);
    assert_eq!((c.corrupted, c.reordered, c.filtered), (0, 0, 0));
}

/// Every corrupted copy fails RoCEv2 verification (ICRC or IP header checks), and every
/// uncorrupted one passes: the receiver can always tell.
#[test]
fn corrupted_datagrams_fail_verification() {
    let v6a: Ipv6Addr = "fd00::a".parse().unwrap();
    let v6b: Ipv6Addr = "fd00::b".parse().unwrap();
    for (p, seed) in [(1.0, 1u64), (0.3, 2)] {
        let mut f = SimFabric::new(SimConfig::default().seed(seed).corrupt(p));
        f.add_device("cor-a").unwrap();
        f.add_device("cor-b").unwrap();
        f.add_device_with(DeviceConfig::default().name("cor-c").gid0(Gid::from_ipv6(v6a))).unwrap();
        f.add_device_with(DeviceConfig::default().name("cor-d").gid0(Gid::from_ipv6(v6b))).unwrap();
        let (a, b) = (f.addr(DeviceId(0)).unwrap(), f.addr(DeviceId(1)).unwrap());
        let tap = SharedBuf::new();
        f.set_pcap_at(tap.clone(), TapPoint::Delivered).unwrap();
        for i in 0..2_000u32 {
            let payload = vec![i as u8; (i % 300) as usize];
            if i % 2 == 0 {
                f.inject(datagram(a, b, i, &payload));
            } else {
                f.inject(datagram(v6a, v6b, i, &payload));
            }
        }
        assert!(f.run_until_idle());
        let recs = records(&tap);
        assert_eq!(recs.len(), 2_000);
        let bad = recs.iter().filter(|r| roce::parse_ip(&r.data[14..]).is_err()).count() as u64;
        assert_eq!(bad, f.counters().corrupted, "p = {p}");
        if p == 1.0 {
            assert_eq!(bad, 2_000);
        } else {
            assert!((450..=750).contains(&bad), "{bad}");
        }
    }
}

#[test]
fn reordering_reorders_and_loses_nothing() {
    let (mut f, a, b) = pair(SimConfig::default().seed(3).reorder(0.1).reorder_delay_ns(5_000));
    let tap = SharedBuf::new();
    f.set_pcap_at(tap.clone(), TapPoint::Delivered).unwrap();
    // One datagram per microsecond, so a 5 µs delay lets about five later ones overtake.
    for i in 0..1_000u32 {
        f.inject(datagram(a, b, i, b"r"));
        f.run_for(1_000);
    }
    assert!(f.run_until_idle());
    let psns: Vec<u32> = records(&tap).iter().map(|r| psn_of(&r.data)).collect();
    let mut sorted = psns.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..1_000).collect::<Vec<_>>(), "each exactly once");
    let late = psns.windows(2).filter(|w| w[0] > w[1]).count() as u64;
    let c = f.counters();
    assert!((50..=150).contains(&c.reordered), "{c:?}");
    // Each reordered datagram shows up as (at least) one descent, unless two are adjacent.
    assert!(late > c.reordered / 2 && late <= c.reordered, "{late} descents, {c:?}");
}

#[test]
fn jitter_varies_arrival_but_keeps_fifo_order() {
    let (mut f, a, b) = pair(SimConfig::default().seed(5).latency_ns(1_000).jitter_ns(20_000));
    let tap = SharedBuf::new();
    f.set_pcap_at(tap.clone(), TapPoint::Delivered).unwrap();
    let mut gaps = Vec::new();
    for i in 0..200u32 {
        f.inject(datagram(a, b, i, b"j"));
        let sent = f.now();
        assert!(f.run_until(|f| f.counters().delivered == u64::from(i) + 1));
        gaps.push(f.now() - sent);
    }
    assert!(gaps.iter().all(|g| (1_000..=21_000).contains(g)), "{gaps:?}");
    assert!(gaps.iter().min() != gaps.iter().max());

    // Back to back, jitter alone never reorders.
    for i in 0..200u32 {
        f.inject(datagram(a, b, 1000 + i, b"j"));
    }
    assert!(f.run_until_idle());
    let psns: Vec<u32> = records(&tap).iter().map(|r| psn_of(&r.data)).collect();
    assert!(psns.windows(2).all(|w| w[0] < w[1]));
}

/// A run with every fault on: its delivered trace and counters.
fn faulty_run(seed: u64, point: TapPoint) -> (Vec<u8>, SimCounters, u64) {
    let config = SimConfig::default()
        .seed(seed)
        .latency_ns(2_000)
        .jitter_ns(500)
        .bandwidth_bps(10_000_000_000)
        .loss(0.05)
        .dup(0.05)
        .reorder(0.05)
        .corrupt(0.05);
    let (mut f, a, b) = pair(config);
    let tap = SharedBuf::new();
    f.set_pcap_at(tap.clone(), point).unwrap();
    for i in 0..500u32 {
        f.inject(datagram(a, b, i, &vec![i as u8; (i % 64) as usize]));
        f.inject(datagram(b, a, i, b"back"));
        f.run_for(300);
    }
    assert!(f.run_until_idle());
    (tap.contents(), f.counters(), f.now())
}

#[test]
fn same_seed_same_run_different_seed_different_run() {
    let one = faulty_run(7, TapPoint::Delivered);
    assert_eq!(one, faulty_run(7, TapPoint::Delivered));
    let other = faulty_run(8, TapPoint::Delivered);
    assert_ne!(one.0, other.0);
    assert_ne!(one.1, other.1);
    assert!(conservation_holds(&one.1) && conservation_holds(&other.1));

    // The sent trace is taken before faults, so it does not depend on the seed here (only on
    // what the devices send, and they react to what arrives).
    let sent = faulty_run(7, TapPoint::Sent);
    assert_eq!(sent.0, faulty_run(7, TapPoint::Sent).0);
    assert_eq!(sent.0, faulty_run(8, TapPoint::Sent).0);
    assert_eq!(records_of(&sent.0).len(), 1_000);
}

fn records_of(bytes: &[u8]) -> Vec<PcapRecord> {
    PcapReader::new(bytes).unwrap().map(Result::unwrap).collect()
}

#[test]
fn pcap_records_are_ethernet_frames_at_virtual_time() {
    let v6a: Ipv6Addr = "fd00::1".parse().unwrap();
    let v6b: Ipv6Addr = "fd00::2".parse().unwrap();
    let mut f = SimFabric::new(SimConfig::default().latency_ns(3_000));
    f.add_device("pcap-a").unwrap();
    f.add_device("pcap-b").unwrap();
    f.add_device_with(DeviceConfig::default().name("pcap-c").gid0(Gid::from_ipv6(v6a))).unwrap();
    f.add_device_with(DeviceConfig::default().name("pcap-d").gid0(Gid::from_ipv6(v6b))).unwrap();
    let (a, b) = (f.addr(DeviceId(0)).unwrap(), f.addr(DeviceId(1)).unwrap());
    let tap = SharedBuf::new();
    f.set_pcap(tap.clone()).unwrap();
    let d4 = datagram(a, b, 1, b"four");
    let d6 = datagram(v6b, v6a, 2, b"six");
    f.run_for(7_000);
    f.inject(d4.clone());
    f.run_for(2_000_000);
    f.inject(d6.clone());
    assert!(f.run_until_idle());

    let recs = records(&tap);
    assert_eq!(recs.len(), 2);
    // Stamped when sent, at microsecond resolution.
    assert_eq!(recs[0].timestamp.as_nanos(), 7_000);
    assert_eq!(recs[1].timestamp.as_nanos(), 2_007_000);
    let (eth, parsed) = roce::parse_ethernet(&recs[0].data).unwrap();
    assert_eq!((eth.src, eth.dst, eth.ethertype), (mac_for_index(0), mac_for_index(1), ETHERTYPE_IPV4));
    assert_eq!(u32::from(parsed.packet.bth.psn), 1);
    assert_eq!(&recs[0].data[14..], &d4[..]);
    let (eth, _) = roce::parse_ethernet(&recs[1].data).unwrap();
    assert_eq!((eth.src, eth.dst, eth.ethertype), (mac_for_index(3), mac_for_index(2), ETHERTYPE_IPV6));
    assert_eq!(&recs[1].data[14..], &d6[..]);
    assert_eq!(mac_for_index(0), roce::MAC_A);
    assert_eq!(mac_for_index(1), roce::MAC_B);
}

#[test]
fn pcap_file_is_written_and_flushed() {
    let path = std::env::temp_dir().join(format!("softhca-sim-{}.pcap", std::process::id()));
    {
        let (mut f, a, b) = pair(SimConfig::default());
        f.pcap_file(&path).unwrap();
        f.inject(datagram(a, b, 4, b"file"));
        assert!(f.run_until_idle());
    } // dropping the fabric flushes
    let bytes = std::fs::read(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    let recs = records_of(&bytes);
    assert_eq!(recs.len(), 1);
    assert_eq!(psn_of(&recs[0].data), 4);
}

/// The filter sees every datagram with its endpoints, and can drop, delay and rewrite it; a
/// rewritten datagram re-sealed with `rewrite`/`reseal` passes verification.
#[test]
fn filter_drops_delays_and_rewrites() {
    let (mut f, a, b) = pair(SimConfig::default().latency_ns(1_000));
    let seen = Rc::new(RefCell::new(Vec::new()));
    let log = seen.clone();
    f.set_filter(move |ctx, d| {
        log.borrow_mut().push((ctx.index, ctx.from, ctx.to, ctx.injected, ctx.now));
        match ctx.index {
            0 => Verdict::Drop,
            1 => {
                rewrite(d, |r| r.packet.bth.psn = Psn::new(99)).unwrap();
                Verdict::Pass
            }
            2 => Verdict::Delay(10_000),
            3 => {
                d[28] = Opcode::RcSendFirst.into(); // BTH opcode byte behind IPv4 + UDP
                Verdict::Pass
            }
            _ => Verdict::Pass,
        }
    });
    let tap = SharedBuf::new();
    f.set_pcap_at(tap.clone(), TapPoint::Delivered).unwrap();
    for i in 0..5 {
        f.inject(datagram(a, b, i, b"f"));
    }
    f.inject(datagram(a, Ipv4Addr::new(10, 0, 0, 1).to_ipv6_mapped(), 5, b"f"));
    assert!(f.run_until_idle());

    let seen = seen.borrow();
    assert_eq!(seen.len(), 6);
    assert_eq!(seen[0], (0, Some(DeviceId(0)), Some(DeviceId(1)), true, 0));
    assert_eq!(seen[5], (5, Some(DeviceId(0)), None, true, 0));
    let recs = records(&tap);
    let psns: Vec<u32> = recs.iter().map(|r| psn_of(&r.data)).collect();
    assert_eq!(psns, vec![99, 3, 4, 2], "0 dropped, 1 rewritten, 2 delayed past 3 and 4");
    assert_eq!(recs[3].timestamp.as_nanos(), 11_000);
    assert!(roce::parse_ip(&recs[0].data[14..]).is_ok(), "rewrite re-seals");
    assert!(matches!(roce::parse_ip(&recs[1].data[14..]), Err(WireError::BadIcrc { .. })), "raw edit without reseal");
    let c = f.counters();
    assert_eq!((c.filtered, c.filter_delayed, c.dropped_no_route, c.delivered), (1, 1, 1, 4));
}

#[test]
fn reseal_fixes_icrc_and_checksums_after_byte_edits() {
    let a = Ipv4Addr::new(127, 1, 0, 1).to_ipv6_mapped();
    let b = Ipv4Addr::new(127, 1, 0, 2).to_ipv6_mapped();
    let mut d = datagram(a, b, 1, b"abc");
    d[28 + 7] ^= 0x01; // DestQP low byte
    assert!(matches!(roce::parse_ip(&d), Err(WireError::BadIcrc { .. })));
    reseal(&mut d).unwrap();
    assert_eq!(roce::parse_ip(&d).unwrap().packet.bth.dest_qp, 0x23);
    // An IPv4 header edit: the header checksum is redone too.
    d[8] = 3; // TTL
    reseal(&mut d).unwrap();
    assert!(roce::parse_ip(&d).is_ok());
    // IPv6 with a UDP checksum: still consistent after the edit.
    let v6a: Ipv6Addr = "fd00::1".parse().unwrap();
    let v6b: Ipv6Addr = "fd00::2".parse().unwrap();
    let mut d = datagram(v6a, v6b, 1, b"abcd");
    let last = d.len() - 5;
    d[last] ^= 0xff; // payload
    reseal(&mut d).unwrap();
    let mut reemitted = vec![0; d.len()];
    roce::parse_ip(&d).unwrap().to_repr().emit(&mut reemitted).unwrap();
    assert_eq!(reemitted, d, "UDP checksum recomputed");
    assert!(reseal(&mut [0x45, 0, 0]).is_err());
}

#[test]
fn per_link_overrides_apply_to_one_direction() {
    let (mut f, a, b) = pair(SimConfig::default().latency_ns(1_000));
    f.set_link(DeviceId(0), DeviceId(1), LinkConfig::default().loss(1.0));
    f.set_link(DeviceId(1), DeviceId(0), LinkConfig::default().latency_ns(50_000));
    f.inject(datagram(a, b, 0, b""));
    f.inject(datagram(b, a, 0, b""));
    assert_eq!(delivery_times(&mut f), vec![(50_000, 1)]);
    assert_eq!(f.counters().lost, 1);
    f.clear_link(DeviceId(0), DeviceId(1));
    f.inject(datagram(a, b, 1, b""));
    assert_eq!(delivery_times(&mut f), vec![(51_000, 1)]);
    f.set_default_link(LinkConfig::default().latency_ns(7));
    f.inject(datagram(a, b, 2, b""));
    assert_eq!(delivery_times(&mut f), vec![(51_007, 1)]);
}

#[test]
fn run_until_gives_up_on_its_bounds() {
    let (mut f, a, b) = pair(SimConfig::default().latency_ns(10_000_000_000));
    // Idle from the start: nothing can make the condition true.
    assert!(!f.run_until(|_| false));
    f.inject(datagram(a, b, 0, b""));
    // The arrival lies past the bound: give up without moving the clock past it.
    assert!(!f.run_until_within(1_000_000_000, |f| f.counters().delivered == 1));
    assert!(f.now() <= 1_000_000_000);
    assert!(f.run_until(|f| f.counters().delivered == 1));
    assert_eq!(f.now(), 10_000_000_000);
    // Already true: no step taken.
    assert!(f.run_until(|_| true));

    // The step limit.
    let (mut f, a, b) = pair(SimConfig::default().step_limit(3));
    for i in 0..10 {
        f.inject(datagram(a, b, i, b""));
        f.run_for(1);
    }
    assert!(!f.run_until_idle());
    assert_eq!(f.counters().delivered, 3);
    assert!(!f.run_until(|_| false));
    assert!(!f.run_for(1_000_000));
    assert_eq!(f.counters().delivered, 9);
    assert!(f.run_until_idle());
    assert_eq!(f.counters().delivered, 10);
}

#[test]
fn run_for_moves_the_clock_when_idle() {
    let mut f = SimFabric::new(SimConfig::default());
    assert!(!f.step());
    assert!(f.run_for(1_234));
    assert_eq!(f.now(), 1_234);
    assert!(f.run_until_idle());
    assert_eq!(f.now(), 1_234);
}

#[test]
fn nonsense_probabilities_do_not_panic() {
    let (mut f, a, b) = pair(SimConfig::default().loss(f64::NAN).dup(-1.0).corrupt(7.0).reorder(f64::INFINITY));
    assert_eq!(f.config().link.loss, 0.0);
    assert_eq!(f.config().link.corrupt, 1.0);
    f.inject(datagram(a, b, 0, b"p"));
    f.inject(Vec::new());
    f.inject_to(DeviceId(0), Vec::new());
    assert!(f.run_until_idle());
    let c = f.counters();
    // The empty injection has no route; the empty inject_to has no bits to flip.
    assert_eq!((c.delivered, c.dropped_no_route, c.corrupted, c.reordered), (2, 1, 1, 2));
}

/// The middleware any link takes (`link::tap`) on the sim fabric: a capture tap records each
/// datagram as sent and each copy as it arrives, and a faults tap after it decides what the
/// device gets: with loss 1 nothing, with duplication 1 every datagram twice.
#[test]
fn taps_see_what_is_sent_and_decide_what_arrives() {
    use softhca::link::{Faults, PcapTap, TapHandle};
    for (faults, want) in [(Faults::new(3).loss(1.0), 0u64), (Faults::new(3).dup(1.0), 2), (Faults::new(3), 1)] {
        let (mut f, a, b) = pair(SimConfig::default());
        let capture = SharedBuf::new();
        f.add_tap(TapHandle::new(PcapTap::new(capture.clone()).unwrap()));
        f.add_tap(TapHandle::new(faults));
        for i in 0..10 {
            f.inject(datagram(a, b, i, b"tap"));
        }
        assert!(f.run_until_idle());
        assert_eq!(f.counters().delivered, 10 * want);
        assert_eq!(records(&capture).len(), 20, "10 sent, 10 arrived (before the faults)");
        let c = f.device(DeviceId(1)).unwrap().counters();
        let got = c.rx_packets;
        assert_eq!(got, 10 * want, "the device saw every copy the taps let through");
    }
}
