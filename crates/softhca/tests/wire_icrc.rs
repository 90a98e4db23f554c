//! ICRC and RoCEv2 encapsulation known-answer tests.

use std::net::{Ipv4Addr, Ipv6Addr};

use softhca::wire::icrc;
use softhca::wire::roce::{self, udp_src_port, UdpRepr};
use softhca::wire::*;

/// The RULES.md PKT-ROCE-9 datagram, ICRC included.
const VECTOR: [u8; 48] = [
    0x45, 0x00, 0x00, 0x30, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0xb9, 0x69, 0xc0, 0xa8, 0x00, 0x01, 0xc0, 0xa8, 0x00,
    0x02, // IPv4
    0xc0, 0x00, 0x12, 0xb7, 0x00, 0x1c, 0x00, 0x00, // UDP
    0x04, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x11, 0x80, 0x00, 0x00, 0x05, // BTH
    0x01, 0x02, 0x03, 0x04, // payload
    0xa2, 0x63, 0x1a, 0xac, // ICRC
];

/// A bitwise CRC-32 (IEEE 802.3, reflected), independent of crc32fast.
fn crc32_bitwise(data: &[u8]) -> u32 {
    let mut crc = 0xffff_ffffu32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 { (crc >> 1) ^ 0xedb8_8320 } else { crc >> 1 };
        }
    }
    !crc
}

/// Rule PKT-ROCE-7, PKT-ROCE-8, PKT-ROCE-9: the RULES.md test vector.
#[test]
fn icrc_ipv4_test_vector() {
    assert_eq!(icrc::compute_datagram(&VECTOR).unwrap(), 0xac1a_63a2);
    icrc::verify_datagram(&VECTOR).unwrap();
    let mut d = VECTOR;
    d[44..].fill(0);
    icrc::fill_datagram(&mut d).unwrap();
    assert_eq!(d, VECTOR);
    // The bitwise CRC over the masked bytes written out by hand agrees.
    let mut masked = vec![0xff; 8];
    masked.extend_from_slice(&VECTOR[..44]);
    for at in [1, 8, 10, 11, 26, 27, 28 + 4] {
        masked[8 + at] = 0xff;
    }
    assert_eq!(crc32_bitwise(&masked), 0xac1a_63a2);
}

/// Rule PKT-ROCE-1, PKT-ROCE-2, PKT-ROCE-5, PKT-ROCE-9: building the vector's
/// packet from reprs gives exactly the vector (IP, UDP, BTH, payload, ICRC:
/// no LRH, no GRH, no VCRC), and parsing it gives the reprs back.
#[test]
fn roce_ipv4_emit_matches_test_vector() {
    let mut bth = BthRepr::new(Opcode::RcSendOnly, 0xffff, 0x11, Psn::new(5));
    bth.ack_req = true;
    let repr = RoceRepr {
        ip: IpRepr::V4(Ipv4Repr::new(Ipv4Addr::new(192, 168, 0, 1), Ipv4Addr::new(192, 168, 0, 2))),
        udp: UdpRepr { src_port: 0xc000, dst_port: ROCE_V2_PORT, checksum: UdpChecksum::Zero },
        packet: PacketRepr { payload: &[1, 2, 3, 4], ..PacketRepr::new(bth) },
    };
    assert_eq!(repr.buffer_len(), VECTOR.len());
    let mut buf = [0xaau8; 64];
    let n = repr.emit(&mut buf).unwrap();
    assert_eq!(buf[..n], VECTOR);
    let parsed = roce::parse_ip(&VECTOR).unwrap();
    assert_eq!(parsed.to_repr(), repr);
    assert_eq!(parsed.icrc, 0xac1a_63a2);

    // A receiver that only sees the UDP payload rebuilds the IP and UDP
    // headers it would have sent and verifies the ICRC over them.
    let mut ip_udp = [0u8; 48];
    let h = roce::emit_ip_udp(&repr.ip, &repr.udp, VECTOR.len() - 28, &mut ip_udp).unwrap();
    assert_eq!(h, 28);
    assert_eq!(roce::parse_transport(&ip_udp[..h], &VECTOR[28..]).unwrap(), repr.packet);
    let mut other = repr.ip;
    if let IpRepr::V4(v4) = &mut other {
        v4.identification = 7;
    }
    roce::emit_ip_udp(&other, &repr.udp, VECTOR.len() - 28, &mut ip_udp).unwrap();
    assert!(matches!(roce::parse_transport(&ip_udp[..h], &VECTOR[28..]), Err(WireError::BadIcrc { .. })));
}

/// Rule PKT-ROCE-10: a wrong ICRC is an error (the link drops and counts the
/// packet); the masked fields may change in transit, any other byte may not.
#[test]
fn icrc_masks_variant_fields_only() {
    let mut bad = VECTOR;
    bad[47] ^= 1;
    assert!(matches!(roce::parse_ip(&bad), Err(WireError::BadIcrc { computed: 0xac1a_63a2, .. })));
    assert!(roce::parse_ip_unverified(&bad).is_ok());
    for at in 0..44 {
        let mut d = VECTOR;
        d[at] ^= 0x01;
        let masked = matches!(at, 1 | 8 | 10 | 11 | 26 | 27 | 32);
        assert_eq!(icrc::verify_datagram(&d).is_ok(), masked, "byte {at}");
    }
}

/// Rule PKT-ROCE-2, PKT-ROCE-3, PKT-ROCE-7, PKT-ROCE-8: an IPv6 datagram built
/// by hand; the ICRC agrees with a bitwise CRC over the masked bytes, and the
/// parsed and re-emitted datagram is identical.
#[test]
fn icrc_ipv6_hand_built() {
    let mut d: Vec<u8> = vec![
        0x6a, 0xb1, 0x23, 0x45, // version 6, TC 0xab, flow label 0x12345
        0x00, 0x24, 17, 9, // payload length 36, UDP, hop limit 9
    ];
    d.extend_from_slice(&[0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
    d.extend_from_slice(&[0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
    d.extend_from_slice(&[0xd0, 0x01, 0x12, 0xb7, 0x00, 0x24, 0x00, 0x00]); // UDP
    d.extend_from_slice(&[0x64, 0x20, 0xff, 0xff, 0x40, 0x00, 0x00, 0x01, 0, 0, 0, 7]); // UD_SEND_ONLY, pad 2
    d.extend_from_slice(&[0x80, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x05]); // DETH
    d.extend_from_slice(&[b'h', b'i', 0, 0]); // payload + pad
    let mut masked = vec![0xff; 8];
    masked.extend_from_slice(&d);
    masked[8] |= 0x0f;
    masked[9..12].fill(0xff);
    masked[8 + 7] = 0xff;
    masked[8 + 46..8 + 48].fill(0xff);
    masked[8 + 48 + 4] = 0xff;
    let crc = crc32_bitwise(&masked);
    d.extend_from_slice(&crc.to_le_bytes());

    let parsed = roce::parse_ip(&d).unwrap();
    let IpRepr::V6(ip) = parsed.ip else { panic!("not IPv6") };
    assert_eq!(ip.traffic_class, 0xab);
    assert_eq!(ip.flow_label, 0x12345);
    assert_eq!(ip.hop_limit, 9);
    assert_eq!(ip.src, "fe80::1".parse::<Ipv6Addr>().unwrap());
    assert_eq!(parsed.udp.src_port, 0xd001);
    assert_eq!(parsed.udp.checksum, UdpChecksum::Zero);
    assert_eq!(parsed.packet.bth.opcode, Opcode::UdSendOnly);
    assert!(parsed.packet.bth.becn);
    assert_eq!(parsed.packet.deth.unwrap().src_qp, 5);
    assert_eq!(parsed.packet.payload, b"hi");
    assert_eq!(parsed.icrc, crc);

    let mut buf = vec![0u8; d.len()];
    assert_eq!(parsed.to_repr().emit(&mut buf).unwrap(), d.len());
    assert_eq!(buf, d);
}

/// Rule PKT-ROCE-2, PKT-ROCE-3: IPv6 emission with the mandatory UDP
/// checksum, checked against an independent ones-complement sum; IPv4 header
/// checksum likewise; IPv4-mapped GIDs.
#[test]
fn roce_checksums() {
    fn ones(data: &[u8]) -> u32 {
        let mut s: u32 = data.chunks(2).map(|c| u32::from(c[0]) << 8 | u32::from(*c.get(1).unwrap_or(&0))).sum();
        while s >> 16 != 0 {
            s = (s & 0xffff) + (s >> 16);
        }
        s
    }
    let src: Ipv6Addr = "2001:db8::1".parse().unwrap();
    let dst: Ipv6Addr = "2001:db8::2".parse().unwrap();
    let ip = IpRepr::V6(Ipv6Repr::new(src, dst));
    let repr = RoceRepr {
        ip,
        udp: UdpRepr::for_qp(0x12, UdpChecksum::default_for(&ip)),
        packet: PacketRepr {
            payload: b"hello",
            ..PacketRepr::new(BthRepr::new(Opcode::RcSendOnly, 0xffff, 0x34, Psn::new(0)))
        },
    };
    let mut buf = [0u8; 128];
    let n = repr.emit(&mut buf).unwrap();
    let d = &buf[..n];
    let mut pseudo = Vec::new();
    pseudo.extend_from_slice(&src.octets());
    pseudo.extend_from_slice(&dst.octets());
    pseudo.extend_from_slice(&((n - 40) as u32).to_be_bytes());
    pseudo.extend_from_slice(&[0, 0, 0, 17]);
    pseudo.extend_from_slice(&d[40..]);
    assert_ne!(&d[46..48], &[0, 0]);
    assert_eq!(ones(&pseudo), 0xffff, "UDP checksum");
    // Emission derived PadCnt = 3 from the 5-byte payload (PKT-LEN-5).
    let mut expected = repr;
    expected.packet.bth.pad_cnt = 3;
    assert_eq!(roce::parse_ip(d).unwrap().to_repr(), expected);

    let ip4 = IpRepr::V4(Ipv4Repr::new(Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2)));
    let repr4 = RoceRepr { ip: ip4, udp: UdpRepr::for_qp(0x12, UdpChecksum::Compute), ..repr };
    let n = repr4.emit(&mut buf).unwrap();
    let d = &buf[..n];
    assert_eq!(ones(&d[..20]), 0xffff, "IPv4 header checksum");
    assert_eq!(d[6], 0x40, "DF");
    assert_eq!(&d[4..6], &[0, 0], "Identification 0");
    let mut pseudo = Vec::new();
    pseudo.extend_from_slice(&[10, 0, 0, 1, 10, 0, 0, 2, 0, 17]);
    pseudo.extend_from_slice(&((n - 20) as u16).to_be_bytes());
    pseudo.extend_from_slice(&d[20..]);
    assert_eq!(ones(&pseudo), 0xffff, "UDP checksum over IPv4");
    assert_eq!(ip4.src_gid(), "::ffff:10.0.0.1".parse::<Ipv6Addr>().unwrap());
    let mut broken = d.to_vec();
    broken[10] ^= 1;
    assert_eq!(roce::parse_ip(&broken), Err(WireError::BadIpChecksum));
}

/// Rule PKT-ROCE-1, PKT-ROCE-6: UDP destination 4791; one source port per QP,
/// in the dynamic range.
#[test]
fn roce_ports() {
    assert_eq!(udp_src_port(0x11), 0xc011);
    for qpn in [0u32, 1, 0x3fff, 0x4000, 0xff_ffff, 0x1234_5678] {
        let p = udp_src_port(qpn);
        assert!(p >= 0xc000);
        assert_eq!(p, udp_src_port(qpn), "stable");
    }
    assert_ne!(udp_src_port(0x4000), udp_src_port(0));
    // Receivers accept any source port.
    let mut any_port = VECTOR;
    any_port[20..22].copy_from_slice(&1234u16.to_be_bytes());
    icrc::fill_datagram(&mut any_port).unwrap();
    assert_eq!(roce::parse_ip(&any_port).unwrap().udp.src_port, 1234);
    let mut d = VECTOR;
    d[23] = 0xb8; // dst port 4792
    assert_eq!(roce::parse_ip(&d), Err(WireError::NotRoce(4792)));
}

/// Rule PKT-ROCE-12: a CNP is a BTH with OpCode 0x81 and BECN, followed by
/// 16 reserved zero bytes and the ICRC.
#[test]
fn cnp_layout() {
    let mut bth = BthRepr::new(Opcode::Cnp, 0xffff, 0x42, Psn::new(0));
    bth.becn = true;
    let repr = RoceRepr {
        ip: IpRepr::V4(Ipv4Repr::new(Ipv4Addr::LOCALHOST, Ipv4Addr::LOCALHOST)),
        udp: UdpRepr::for_qp(0x42, UdpChecksum::Zero),
        packet: PacketRepr::new(bth),
    };
    let mut buf = [0xeeu8; 80];
    let n = repr.emit(&mut buf).unwrap();
    assert_eq!(n, 20 + 8 + 12 + 16 + 4);
    assert_eq!(&buf[28..40], &[0x81, 0, 0xff, 0xff, 0x40, 0, 0, 0x42, 0, 0, 0, 0]);
    assert_eq!(&buf[40..56], &[0u8; 16]);
    let parsed = roce::parse_ip(&buf[..n]).unwrap();
    assert_eq!(parsed.packet, repr.packet);
    // A CNP carries nothing after its reserved bytes.
    let mut longer = [0u8; 96];
    let mut with_payload = repr;
    with_payload.packet.payload = &[0; 4];
    assert_eq!(with_payload.emit(&mut longer), Err(WireError::UnexpectedPayload(0x81)));
}

/// Rule PKT-ROCE-11: the 40-byte GRH area of a UD receive holds the IPv6
/// header, or 20 undefined (zero) bytes and the IPv4 header.
#[test]
fn ud_grh_area() {
    let grh = roce::ud_grh(&VECTOR).unwrap();
    assert_eq!(&grh[..20], &[0u8; 20]);
    assert_eq!(&grh[20..], &VECTOR[..20]);
    assert!(!roce::ud_grh_is_ipv6(&grh));
    let ip = IpRepr::V6(Ipv6Repr::new("fe80::1".parse().unwrap(), "fe80::2".parse().unwrap()));
    let repr = RoceRepr {
        ip,
        udp: UdpRepr::for_qp(1, UdpChecksum::Compute),
        packet: PacketRepr {
            deth: Some(DethRepr { q_key: 1, src_qp: 2 }),
            ..PacketRepr::new(BthRepr::new(Opcode::UdSendOnly, 0xffff, 3, Psn::new(0)))
        },
    };
    let mut buf = [0u8; 128];
    let n = repr.emit(&mut buf).unwrap();
    assert_eq!(roce::ud_grh(&buf[..n]).unwrap()[..], buf[..40]);
    assert!(roce::ud_grh_is_ipv6(&roce::ud_grh(&buf[..n]).unwrap()));
    assert!(roce::ud_grh(&[0x45; 10]).is_err());
}

/// Rule PKT-ROCE-7, PKT-ROCE-8, PKT-ROCE-10: checking the ICRC while copying a datagram in
/// (`icrc::copy_checked`) agrees with the two-pass check for IPv4 and IPv6 datagrams of
/// every payload size up to a few fused steps, for every cut of them short enough to lose
/// a header or the ICRC, and for the vector with each byte flipped; the copy is always exact.
/// One memo of header CRCs serves every check, as a link's does.
#[test]
fn copy_checked_agrees_with_verify() {
    let mut memo = icrc::HeadMemo::default();
    let mut check = |d: &[u8]| {
        let mut out = vec![0xAAu8; d.len()];
        // SAFETY: `d` holds `out.len()` bytes and is a different buffer.
        let ok = unsafe { icrc::copy_checked(&mut out, d.as_ptr(), &mut memo) };
        assert_eq!(out, d, "the copy, {} bytes", d.len());
        ok
    };
    let ips = [
        IpRepr::V4(Ipv4Repr::new(Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2))),
        IpRepr::V6(Ipv6Repr::new(Ipv6Addr::LOCALHOST, "fe80::2".parse().unwrap())),
    ];
    let payload: Vec<u8> = (0..4200u32).map(|i| (i * 31 + 7) as u8).collect();
    for ip in ips {
        for len in (0..600).chain((600..4200).step_by(37)).chain([4096, 4200]) {
            let mut bth = BthRepr::new(Opcode::RcSendOnly, 0xffff, 0x11, Psn::new(5));
            bth.ack_req = true;
            let udp = UdpRepr { src_port: 0xc000, dst_port: ROCE_V2_PORT, checksum: UdpChecksum::Zero };
            let repr = RoceRepr { ip, udp, packet: PacketRepr { payload: &payload[..len], ..PacketRepr::new(bth) } };
            let mut d = vec![0u8; repr.buffer_len()];
            repr.emit(&mut d).unwrap();
            assert!(check(&d), "{len}-byte payload");
            let mut bad = d.clone();
            *bad.last_mut().unwrap() ^= 1;
            assert!(!check(&bad));
            if len < 40 {
                for cut in 0..d.len() {
                    assert_eq!(check(&d[..cut]), icrc::verify_datagram(&d[..cut]).is_ok(), "cut at {cut}");
                }
            }
        }
    }
    for at in 0..VECTOR.len() {
        let mut d = VECTOR;
        d[at] ^= 0x04;
        assert_eq!(check(&d), icrc::verify_datagram(&d).is_ok(), "byte {at}");
    }
}
