//! Defects a review found in the UDP link's connected flows (learned IPv4 Identifications) and
//! in the receivers' Identification hints, each fixed and kept here as a test. Devices use
//! addresses 127.0.2.x so that they never meet the devices of other test files (which take
//! 127.0.0.x or 127.0.1.x).

mod udp_common;

use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use softhca::link::udp::{IcrcPolicy, RxMode, UdpConfig, UdpCounters, UdpDevice};
use softhca::wire::icrc;
use softhca::wire::pcap::PcapReader;
use softhca::wire::roce::{self, IpRepr, Ipv4Repr, UdpChecksum, UdpRepr};
use softhca::*;
use udp_common::*;

fn v4(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 2, last))
}

fn scratch_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("softhca-review-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Waits (a hang guard, not a timing assertion) until `cond` holds for the device's counters.
fn until(dev: &UdpDevice, what: &str, cond: impl Fn(&UdpCounters) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cond(&dev.counters()) {
        assert!(Instant::now() < deadline, "timed out waiting for {what}: {:?}", dev.counters());
        std::thread::yield_now();
    }
}

/// The IPv4 datagrams of a pcap the link wrote (Ethernet framing).
fn datagrams(path: &Path) -> Vec<Vec<u8>> {
    let mut r = PcapReader::new(std::fs::File::open(path).unwrap()).unwrap();
    let mut out = Vec::new();
    while let Some(rec) = r.next_record().unwrap() {
        out.push(rec.data[14..].to_vec());
    }
    out
}

fn dst_of(d: &[u8]) -> IpAddr {
    IpAddr::from([d[16], d[17], d[18], d[19]])
}

fn id_of(d: &[u8]) -> u16 {
    u16::from_be_bytes([d[4], d[5]])
}

/// The pcap holds each datagram as the kernel took it. When a send is refused (here: the
/// peer's port was closed, so the next send reports ECONNREFUSED) the flow is disconnected
/// and the rest of that very batch is re-stamped for Identification 0; the pcap used to be
/// written before, with Identifications (and ICRCs) that never were on the wire. Every
/// datagram the peer received appears in the sender's pcap with the Identification and ICRC
/// it was received with.
/// Rule PKT-ROCE-7
#[test]
fn pcap_records_what_a_refused_flows_batch_really_sent() {
    let dir = scratch_dir("refused");
    let pa = dir.join("a.pcap");
    let (aaddr, baddr) = (v4(1), v4(2));
    let a = uc_end(UdpConfig::default().addr(aaddr).pcap(&pa));
    let src = a.pd.reg_mr(vec![7u8; 64], Access::LOCAL_WRITE).unwrap();
    {
        let b = uc_end(UdpConfig::default().addr(baddr));
        uc_connect(&a.qp, b.dev.gid(), b.qp.qp_num());
        uc_connect(&b.qp, a.dev.gid(), a.qp.qp_num());
        let rbuf = b.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
        b.qp.post_recv(&[RecvWr::new(1, &[rbuf.sge(0..64)])]).unwrap();
        a.qp.post_send(&[SendWr::send(1, &[src.sge(0..8)]).signaled()]).unwrap();
        wait(&a.cq, 1, 10);
        assert_eq!(wait(&b.cq, 1, 10)[0].status, WcStatus::Success);
        assert_eq!(a.dev.counters().tx_connected_flows, 1);
    }
    let mut wr = 10u64;
    let mut receiver = None;
    for attempt in 0..20 {
        // To the vanished peer: the port unreachable it draws makes the socket's next send fail.
        let before = a.dev.counters();
        a.qp.post_send(&[SendWr::send(wr, &[src.sge(0..8)]).signaled()]).unwrap();
        wr += 1;
        wait(&a.cq, 1, 10);
        until(&a.dev, "the lone send", |c| c.tx_datagrams + c.tx_errors > before.tx_datagrams + before.tx_errors);
        // A new receiver at the address (raw where permitted: it records the real header).
        let pb = dir.join(format!("b{attempt}.pcap"));
        let b = UdpDevice::open(UdpConfig::default().addr(baddr).rx_mode(RxMode::Auto).pcap(&pb)).unwrap();
        // Three datagrams of different sizes (three messages, no GSO) in one post.
        let before = a.dev.counters();
        let sges: Vec<[Sge; 1]> = (0..3).map(|i| [src.sge(0..16 + 8 * i)]).collect();
        let wrs: Vec<SendWr> =
            sges.iter().enumerate().map(|(i, s)| SendWr::send(wr + i as u64, s).signaled()).collect();
        wr += 3;
        a.qp.post_send(&wrs).unwrap();
        wait(&a.cq, 3, 10);
        until(&a.dev, "the batch", |c| c.tx_datagrams + c.tx_errors >= before.tx_datagrams + before.tx_errors + 3);
        let refused = a.dev.counters().tx_errors - before.tx_errors;
        let arrived = 3 - refused;
        until(&b, "the batch at the receiver", |c| c.rx_datagrams + c.drop_bad_icrc >= arrived);
        if refused > 0 {
            receiver = Some((b, pb));
            break;
        }
        drop(b); // the refusal came too late this time: close the port again and retry
    }
    let (b, pb) = receiver.expect("no send was ever refused");
    let bc = b.counters();
    drop(b);
    drop(a);
    assert_eq!(bc.drop_bad_icrc, 0, "{bc:?}");
    let sent = datagrams(&pa);
    let got: Vec<Vec<u8>> = datagrams(&pb).into_iter().filter(|d| dst_of(d) == baddr).collect();
    assert!(!got.is_empty(), "the receiver got none of the batch");
    for r in &got {
        // The same packet (BTH and payload) as the sender recorded it, last occurrence.
        let s = sent
            .iter()
            .rev()
            .find(|s| dst_of(s) == baddr && s.len() == r.len() && s[28..s.len() - 4] == r[28..r.len() - 4])
            .expect("a received datagram is missing from the sender's pcap");
        assert_eq!(
            (id_of(s), &s[s.len() - 4..]),
            (id_of(r), &r[r.len() - 4..]),
            "the sender's pcap shows an Identification/ICRC that was not on the wire"
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// A receiver without UDP GRO (`gro(false)`, a kernel without it) gets every GSO segment as a
/// datagram of its own, so the "first of the last receive buffer + 1" hint no longer marks
/// where a connected sender's next GSO message starts (the socket's counter moves by one per
/// message while the segments count on from the message's own). The run of equal-size
/// datagrams with consecutive Identifications stands in for the buffer: most message starts
/// match a hypothesis, the rest are solved (the weaker check of the module docs), none is
/// refused. Before that hint every message start after a multi-segment one was solved.
/// Rule PKT-ROCE-10
#[test]
fn a_receiver_without_gro_follows_a_connected_flow_across_gso_messages() {
    let cfg = |last| UdpConfig::default().addr(v4(last)).gro(false);
    let (a, b) = (end(cfg(11)), end(cfg(12)));
    traffic(&a, &b);
    for (d, peer) in [(&a.dev, &b.dev), (&b.dev, &a.dev)] {
        let (c, p) = (d.counters(), peer.counters());
        assert_eq!((c.drop_bad_icrc, c.tx_errors), (0, 0), "{c:?}");
        assert!(
            c.rx_icrc_solved <= 1 + p.tx_gso_messages / 2,
            "{} solved for {} GSO messages at {}: {c:?}",
            c.rx_icrc_solved,
            p.tx_gso_messages,
            d.addr()
        );
    }
}

/// The UDP payloads from 198.18.0.1 to 198.18.0.2 in a real rxe capture: (source port,
/// Identification, the IPv4 datagram).
fn rxe_one_way(file: &str) -> Vec<(u16, u16, Vec<u8>)> {
    let path = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../testdata/rxe")).join(file);
    let mut r = PcapReader::new(std::fs::File::open(&path).expect("rxe capture")).unwrap();
    let mut out = Vec::new();
    while let Some(rec) = r.next_record().unwrap() {
        let ip = roce::ip_datagram_of_frame(&rec.data).unwrap();
        let split = roce::split_ip(ip).unwrap();
        if let IpRepr::V4(h) = split.ip {
            if h.src == Ipv4Addr::new(198, 18, 0, 1) {
                out.push((split.udp.src_port, h.identification, ip.to_vec()));
            }
        }
    }
    out
}

/// Replays the rxe capture's datagrams from 198.18.0.1 to a device at 127.0.2.`last` under
/// `policy`, each from a socket of our own per rxe source port; returns the device's counters,
/// how many datagrams there were, and how many were real jumps in rxe's counter.
fn replay_rxe(last: u8, policy: IcrcPolicy) -> (UdpCounters, u64, u64) {
    let (src, dst) = (Ipv4Addr::new(127, 0, 2, last - 1), v4(last));
    let dev = UdpDevice::open(UdpConfig::default().addr(dst).icrc_policy(policy)).unwrap();
    let IpAddr::V4(dst4) = dst else { unreachable!() };
    let packets = rxe_one_way("rxe-write_bw_rdmacm.pcap");
    assert!(packets.len() > 50);
    // rxe's source ports, mapped to ports of our own (distinct stays distinct).
    let mut ports: Vec<u16> = Vec::new();
    let mut socks: Vec<UdpSocket> = Vec::new();
    let mut jumps = 0;
    let mut prev: Option<u16> = None;
    for (i, (sport, id, ip)) in packets.iter().enumerate() {
        let k = ports.iter().position(|p| p == sport).unwrap_or_else(|| {
            ports.push(*sport);
            socks.push(UdpSocket::bind(SocketAddr::new(src.into(), 0xc100 + ports.len() as u16)).unwrap());
            ports.len() - 1
        });
        // The same datagram between our addresses and ports, with rxe's Identification.
        let mut d = ip.clone();
        d[12..16].copy_from_slice(&src.octets());
        d[16..20].copy_from_slice(&dst4.octets());
        d[20..22].copy_from_slice(&(0xc101 + k as u16).to_be_bytes());
        icrc::fill_datagram(&mut d).unwrap();
        socks[k].send_to(&d[28..], SocketAddr::new(dst, 4791)).unwrap();
        if *id != 0 && prev.map(|p| p.wrapping_add(1)) != Some(*id) {
            jumps += 1; // a real jump in the host's counter
        }
        prev = Some(*id);
        let n = i as u64 + 1;
        until(&dev, "the replayed datagram", |c| c.rx_datagrams + c.drop_bad_icrc + c.drop_malformed >= n);
    }
    (dev.counters(), packets.len() as u64, jumps)
}

/// Linux rxe numbers every RoCE datagram of a host pair from one counter
/// (`__ip_select_ident`), whatever QP (source port) sends it: in the capture replayed here a
/// source port's next datagram is the *host's* previous one + 1. Keeping hints per (address,
/// port) only made every switch between QPs fall through to solving; the per-address last
/// Identification is a hint too, so only the real jumps in rxe's counter need solving.
/// Rule PKT-ROCE-10
#[test]
fn a_per_host_identification_counter_still_matches_a_hypothesis() {
    let (c, _, jumps) = replay_rxe(32, IcrcPolicy::Solve);
    assert_eq!(c.drop_bad_icrc, 0, "{c:?}");
    assert_eq!(c.rx_icrc_solved, jumps, "datagrams following the host's counter had to be solved: {c:?}");
}

/// The same replay to a receiver under the exact policy, which takes nothing solved: each real
/// jump in rxe's counter costs that datagram (dropped, as a bad ICRC), and the Identification
/// solving found in it carries the receiver over the jump, so every other datagram matches a
/// hypothesis with all 32 bits of its ICRC. (Before, an exact receiver never followed a
/// jump: everything after the first one was dropped.)
/// Rule PKT-ROCE-10
#[test]
fn an_exact_receiver_follows_a_per_host_counter_across_its_jumps() {
    let (c, n, jumps) = replay_rxe(34, IcrcPolicy::Exact);
    assert!(jumps > 0, "the capture has jumps to follow");
    assert_eq!((c.rx_icrc_solved, c.drop_bad_icrc, c.drop_malformed), (0, jumps, 0), "{c:?}");
    assert_eq!(c.rx_icrc_hypothesis + c.rx_icrc_exact, n - jumps, "{c:?}");
}

/// A valid RoCEv2 UDP payload (a UD Send Only to QP 0x123456, which does not exist) as sent from
/// `src`:`port` to `dst` with IPv4 Identification `id`.
fn crafted(src: Ipv4Addr, port: u16, dst: Ipv4Addr, id: u16) -> Vec<u8> {
    let mut packet = vec![0u8; 12 + 8 + 8 + 4];
    packet[0] = 0x64; // UD Send Only
    packet[2..4].copy_from_slice(&0xffffu16.to_be_bytes()); // P_Key
    packet[5..8].copy_from_slice(&[0x12, 0x34, 0x56]); // DestQP
    packet[12..16].copy_from_slice(&0x1111_1111u32.to_be_bytes()); // DETH Q_Key
    packet[17..20].copy_from_slice(&[0, 0, 2]); // DETH SrcQP
    let ip = IpRepr::V4(Ipv4Repr { identification: id, ..Ipv4Repr::new(src, dst) });
    let udp = UdpRepr { src_port: port, dst_port: 4791, checksum: UdpChecksum::Zero };
    let mut d = vec![0u8; 28 + packet.len()];
    let n = roce::emit_ip_udp(&ip, &udp, packet.len(), &mut d).unwrap();
    assert_eq!(n, 28);
    d[28..].copy_from_slice(&packet);
    icrc::fill_datagram(&mut d).unwrap();
    d[28..].to_vec()
}

/// The hint table keeps at most 4096 sources, and a source is an (address, port) pair, so
/// 4096 flows over a device's lifetime fill it. It used to refuse new sources then, so two
/// connected flows taking turns lost each other's Identification on every turn; a full table
/// now starts over, and the flows still active are each solved once more.
/// Rule PKT-ROCE-10
#[test]
fn a_full_hint_table_still_follows_active_flows() {
    let (aaddr, baddr, other) = (v4(51), v4(52), Ipv4Addr::new(127, 0, 2, 53));
    let IpAddr::V4(b4) = baddr else { unreachable!() };
    let a1 = uc_end(UdpConfig::default().addr(aaddr));
    let b = uc_end(UdpConfig::default().addr(baddr));
    // A second QP pair on the same devices: a second flow between the two addresses.
    let a2qp = a1.pd.create_qp(&QpInitAttr::uc(&a1.cq, &a1.cq).max_send_wr(64).max_recv_wr(64)).unwrap();
    let b2qp = b.pd.create_qp(&QpInitAttr::uc(&b.cq, &b.cq).max_send_wr(64).max_recv_wr(64)).unwrap();
    // 4100 earlier sources (here: one host, 4100 ports), each heard from once.
    let mut sent = 0u64;
    for chunk in 0..41u16 {
        for i in 0..100u16 {
            let port = 20_000 + chunk * 100 + i;
            let s = UdpSocket::bind(SocketAddr::new(other.into(), port)).unwrap();
            s.send_to(&crafted(other, port, b4, 0), SocketAddr::new(baddr, 4791)).unwrap();
            sent += 1;
        }
        until(&b.dev, "the earlier sources", |c| c.rx_datagrams >= sent);
    }
    let before = b.dev.counters();
    uc_connect(&a1.qp, b.dev.gid(), b.qp.qp_num());
    uc_connect(&b.qp, a1.dev.gid(), a1.qp.qp_num());
    uc_connect(&a2qp, b.dev.gid(), b2qp.qp_num());
    uc_connect(&b2qp, a1.dev.gid(), a2qp.qp_num());
    let src = a1.pd.reg_mr(vec![5u8; 64], Access::LOCAL_WRITE).unwrap();
    let rbuf = b.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    let rounds = 5;
    let rsge = [rbuf.sge(0..64)];
    for qp in [&b.qp, &b2qp] {
        qp.post_recv(&(0..rounds).map(|i| RecvWr::new(i, &rsge)).collect::<Vec<_>>()).unwrap();
    }
    for round in 0..rounds {
        for qp in [&a1.qp, &a2qp] {
            qp.post_send(&[SendWr::send(round, &[src.sge(0..8)]).signaled()]).unwrap();
            wait(&a1.cq, 1, 10);
            assert_eq!(wait(&b.cq, 1, 10)[0].status, WcStatus::Success);
        }
    }
    let c = b.dev.counters();
    assert_eq!(a1.dev.counters().tx_connected_flows, 2, "{:?}", a1.dev.counters());
    assert_eq!(c.rx_datagrams - before.rx_datagrams, 2 * rounds, "{c:?}");
    assert!(
        c.rx_icrc_solved - before.rx_icrc_solved <= 2,
        "two flows taking turns were solved {} times, not once each: {c:?}",
        c.rx_icrc_solved - before.rx_icrc_solved
    );
}
