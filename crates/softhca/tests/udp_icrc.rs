//! ICRC verification on the UDP link's receive side, against real Linux rxe traffic
//! (`testdata/rxe/*.pcap`, copied from `../shared/interop/rxe`; non-zero IPv4 Identifications):
//! the unprivileged path sees only the payload and the addresses, the privileged path the real
//! header.

use std::fs::File;
use std::net::IpAddr;

use softhca::link::udp::verify::{rebuild, IcrcPolicy, Refused, Verified};
use softhca::wire::pcap::PcapReader;
use softhca::wire::roce::{self, IpRepr};

/// (file, source, source port, destination, UDP payload, the real IP + UDP header).
type RxePacket = (String, IpAddr, u16, IpAddr, Vec<u8>, Vec<u8>);

/// Every packet of the rxe captures.
fn rxe_packets() -> Vec<RxePacket> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../testdata/rxe");
    let mut out = Vec::new();
    let mut names: Vec<_> = std::fs::read_dir(dir).expect("rxe pcaps").flatten().map(|e| e.path()).collect();
    names.sort();
    for path in names.into_iter().filter(|p| p.extension().is_some_and(|e| e == "pcap")) {
        let mut r = PcapReader::new(File::open(&path).unwrap()).unwrap();
        while let Some(rec) = r.next_record().unwrap() {
            let ip = roce::ip_datagram_of_frame(&rec.data).unwrap();
            let split = roce::split_ip(ip).unwrap();
            let (src, dst) = match split.ip {
                IpRepr::V4(h) => (IpAddr::V4(h.src), IpAddr::V4(h.dst)),
                IpRepr::V6(h) => (IpAddr::V6(h.src), IpAddr::V6(h.dst)),
            };
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            out.push((name, src, split.udp.src_port, dst, split.packet.to_vec(), split.ip_udp.to_vec()));
        }
    }
    assert!(out.len() > 100, "expected the rxe captures, found {} packets", out.len());
    out
}

/// Privileged path: with the real header every rxe packet verifies exactly, as the raw socket
/// hands it to the device.
#[test]
fn rxe_packets_verify_exactly_with_the_real_header() {
    for (name, .., payload, hdr) in rxe_packets() {
        let mut d = hdr.clone();
        d.extend_from_slice(&payload);
        roce::parse_ip(&d).unwrap_or_else(|e| panic!("{name}: {e:?}"));
    }
}

/// Unprivileged path: from payload and addresses only, every rxe packet verifies by solving
/// for the IPv4 Identification and DF, and the solution is the Identification rxe really sent
/// (so the rebuilt header equals the real one in every field the ICRC covers); IPv6 is exact.
#[test]
fn rxe_packets_verify_without_privilege_by_solving() {
    let (mut solved, mut v6, mut hyp) = (0, 0, 0);
    for (name, src, sport, dst, payload, hdr) in rxe_packets() {
        let r = rebuild(src, sport, dst, &payload, &[], IcrcPolicy::Solve).unwrap_or_else(|e| panic!("{name}: {e:?}"));
        match r.how {
            Verified::Exact => v6 += 1,
            Verified::Hypothesis { .. } => hyp += 1,
            Verified::Solved { identification, dont_fragment } => {
                solved += 1;
                assert_eq!(identification, u16::from_be_bytes([hdr[4], hdr[5]]), "{name}");
                assert_eq!(dont_fragment, hdr[6] & 0x40 != 0, "{name}");
            }
        }
        // The rebuilt header is the real one but for the fields the ICRC masks.
        let mask: &[usize] = if hdr.len() == 28 { &[1, 8, 10, 11, 26, 27] } else { &[0, 1, 2, 3, 7, 46, 47] };
        for (i, (a, b)) in r.header().iter().zip(&hdr).enumerate() {
            assert!(mask.contains(&i) || a == b, "{name}: header byte {i}: {a:#x} vs {b:#x}");
        }
    }
    assert!(solved > 100 && v6 > 0, "solved {solved}, ipv6 {v6}, hypothesis {hyp}");
}

/// Rule PKT-ROCE-10: the exact policy refuses what it cannot check with all 32 bits, saying
/// which Identification solving would have found (the real one), and a hint with that
/// Identification makes it pass exactly.
#[test]
fn exact_policy_needs_the_identification() {
    let (name, src, sport, dst, payload, hdr) =
        rxe_packets().into_iter().find(|p| p.5.len() == 28 && p.5[4..6] != [0, 0]).unwrap();
    let id = u16::from_be_bytes([hdr[4], hdr[5]]);
    assert_eq!(
        rebuild(src, sport, dst, &payload, &[], IcrcPolicy::Exact).unwrap_err(),
        Refused::Unproven { identification: id },
        "{name}"
    );
    let r = rebuild(src, sport, dst, &payload, &[id], IcrcPolicy::Exact).unwrap();
    assert_eq!(r.how, Verified::Hypothesis { identification: id, dont_fragment: true });
    // The hinted header is the real one but for the fields the ICRC masks, with a checksum
    // of its own that holds.
    for (i, (a, b)) in r.header().iter().zip(&hdr).enumerate() {
        assert!([1, 8, 10, 11, 26, 27].contains(&i) || a == b, "{name}: header byte {i}: {a:#x} vs {b:#x}");
    }
    assert!(roce::Ipv4Header::new_checked(r.header()).unwrap().checksum_ok(), "{name}");
}

/// Corruption is still caught: single-bit flips anywhere in the covered packet are refused
/// (the solved check lets a random error through with probability 2^-15; this fixed set has
/// none).
#[test]
fn corrupted_rxe_packets_are_refused() {
    let mut accepted = 0;
    let mut tried = 0;
    for (i, (_, src, sport, dst, mut payload, _)) in rxe_packets().into_iter().enumerate().take(400) {
        let mut bit = (i * 131) % (payload.len() * 8);
        if bit / 8 == 4 {
            bit += 8; // BTH byte 4 (resv8a: FECN, BECN) is masked by the ICRC, by design
        }
        payload[bit / 8] ^= 1 << (bit % 8);
        tried += 1;
        match rebuild(src, sport, dst, &payload, &[], IcrcPolicy::Solve) {
            Err(Refused::BadIcrc) | Err(Refused::Malformed) => {}
            Err(e) => panic!("{e:?}"),
            Ok(_) => accepted += 1,
        }
    }
    assert_eq!(accepted, 0, "of {tried} corrupted packets passed");
    // A wrong source address is a corruption too.
    let (_, _, sport, dst, payload, _) = rxe_packets().into_iter().find(|p| p.5.len() == 28).unwrap();
    let other: IpAddr = "192.0.2.77".parse().unwrap();
    let r = rebuild(other, sport, dst, &payload, &[], IcrcPolicy::Exact);
    assert_eq!(r.unwrap_err(), Refused::BadIcrc);
}

/// Garbage never panics and is refused.
#[test]
fn short_and_garbage_payloads_are_refused() {
    let a: IpAddr = "127.0.0.1".parse().unwrap();
    let b: IpAddr = "::1".parse().unwrap();
    for len in 0..64 {
        let junk: Vec<u8> = (0..len).map(|i| (i * 37 + len) as u8).collect();
        assert!(rebuild(a, 1, a, &junk, &[0, 1], IcrcPolicy::Solve).is_err());
        assert!(rebuild(a, 1, b, &junk, &[], IcrcPolicy::Solve).is_err());
    }
}
