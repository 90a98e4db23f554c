//! Property tests: every opcode round-trips through emit and parse, and no
//! byte string makes a parser panic.

use std::net::{Ipv4Addr, Ipv6Addr};

use proptest::prelude::*;
use softhca::wire::pcap::PcapReader;
use softhca::wire::roce::{self, UdpRepr};
use softhca::wire::*;

fn bth_strategy(opcode: Opcode) -> impl Strategy<Value = BthRepr> {
    (any::<[bool; 6]>(), 0u8..16, any::<u16>(), 0u32..(1 << 24), 0u32..(1 << 24)).prop_map(
        move |(f, tver, p_key, dest_qp, psn)| BthRepr {
            opcode,
            se: f[0],
            mig_req: f[1],
            pad_cnt: 0,
            tver,
            p_key,
            fecn: f[2],
            becn: f[3],
            dest_qp,
            ack_req: f[4],
            psn: Psn::new(psn),
        },
    )
}

/// Every extended header filled with arbitrary values; the test keeps the
/// ones the opcode needs.
#[derive(Debug, Clone)]
struct AllHeaders {
    rdeth: RdethRepr,
    deth: DethRepr,
    reth: RethRepr,
    atomic_eth: AtomicEthRepr,
    aeth: AethRepr,
    atomic_ack_eth: AtomicAckEthRepr,
    immdt: ImmDtRepr,
    ieth: IethRepr,
}

fn headers_strategy() -> impl Strategy<Value = AllHeaders> {
    (
        0u32..(1 << 24),
        (any::<u32>(), 0u32..(1 << 24)),
        (any::<u64>(), any::<u32>(), any::<u32>()),
        (any::<u64>(), any::<u32>(), any::<u64>(), any::<u64>()),
        (any::<u8>(), 0u32..(1 << 24)),
        any::<u64>(),
        any::<u32>(),
        any::<u32>(),
    )
        .prop_map(|(ee, deth, reth, atomic, aeth, orig, imm, ieth)| AllHeaders {
            rdeth: RdethRepr { ee_cnxt: ee },
            deth: DethRepr { q_key: deth.0, src_qp: deth.1 },
            reth: RethRepr { va: reth.0, r_key: reth.1, dma_length: reth.2 },
            atomic_eth: AtomicEthRepr {
                va: atomic.0,
                r_key: atomic.1,
                swap_add_data: atomic.2,
                compare_data: atomic.3,
            },
            aeth: AethRepr { syndrome: Syndrome::from_byte(aeth.0), msn: aeth.1 },
            atomic_ack_eth: AtomicAckEthRepr { orig_remote_data: orig },
            immdt: ImmDtRepr { imm_data: imm },
            ieth: IethRepr { r_key: ieth },
        })
}

/// An opcode: every listed one, plus reserved values.
fn opcode_strategy() -> impl Strategy<Value = Opcode> {
    prop_oneof![
        4 => proptest::sample::select(OPCODES.iter().map(|r| r.opcode).collect::<Vec<_>>()),
        1 => any::<u8>().prop_map(Opcode::from),
    ]
}

/// A packet repr's parts: the repr holds everything but the payload, which
/// the test borrows from the `Vec`.
fn packet_strategy() -> impl Strategy<Value = (PacketRepr<'static>, Vec<u8>)> {
    opcode_strategy()
        .prop_flat_map(|op| (bth_strategy(op), headers_strategy(), proptest::collection::vec(any::<u8>(), 0..80)))
        .prop_map(|(mut bth, h, mut payload)| {
            let (headers, payload_ok) = match bth.opcode.info() {
                Some(info) => (info.headers, info.payload),
                None => (ExtHeaders::empty(), true),
            };
            if !payload_ok {
                payload.clear();
            }
            bth.pad_cnt = ((4 - payload.len() % 4) % 4) as u8;
            let pick = |flag: ExtHeaders| headers.contains(flag);
            let repr = PacketRepr {
                bth,
                rdeth: pick(ExtHeaders::RDETH).then_some(h.rdeth),
                deth: pick(ExtHeaders::DETH).then_some(h.deth),
                xrceth: pick(ExtHeaders::XRCETH).then_some(XrcEthRepr { xrc_srq: h.rdeth.ee_cnxt }),
                reth: pick(ExtHeaders::RETH).then_some(h.reth),
                atomic_eth: pick(ExtHeaders::ATOMIC_ETH).then_some(h.atomic_eth),
                aeth: pick(ExtHeaders::AETH).then_some(h.aeth),
                atomic_ack_eth: pick(ExtHeaders::ATOMIC_ACK_ETH).then_some(h.atomic_ack_eth),
                immdt: pick(ExtHeaders::IMMDT).then_some(h.immdt),
                ieth: pick(ExtHeaders::IETH).then_some(h.ieth),
                payload: &[],
            };
            (repr, payload)
        })
}

fn ip_strategy() -> impl Strategy<Value = IpRepr> {
    prop_oneof![
        (any::<[u8; 4]>(), any::<[u8; 4]>(), any::<u8>(), any::<u16>(), any::<bool>(), any::<u8>()).prop_map(
            |(s, d, tos, id, df, ttl)| IpRepr::V4(Ipv4Repr {
                src: Ipv4Addr::from(s),
                dst: Ipv4Addr::from(d),
                tos,
                identification: id,
                dont_fragment: df,
                ttl,
            })
        ),
        (any::<[u8; 16]>(), any::<[u8; 16]>(), any::<u8>(), 0u32..(1 << 20), any::<u8>()).prop_map(
            |(s, d, tc, fl, hl)| IpRepr::V6(Ipv6Repr {
                src: Ipv6Addr::from(s),
                dst: Ipv6Addr::from(d),
                traffic_class: tc,
                flow_label: fl,
                hop_limit: hl,
            })
        ),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// Rule PKT-OP-1, PKT-OP-4, PKT-HDR-1, PKT-LEN-5: parse(emit(r)) == r for
    /// every opcode (reserved ones included), and the length is the table's.
    #[test]
    fn packet_roundtrip((repr, payload) in packet_strategy()) {
        let repr = PacketRepr { payload: &payload, ..repr };
        let mut buf = [0u8; 256];
        let n = repr.emit(&mut buf).unwrap();
        prop_assert_eq!(n, repr.buffer_len());
        prop_assert_eq!(n % 4, 0);
        let parsed = PacketRepr::parse_bytes(&buf[..n]).unwrap();
        prop_assert_eq!(parsed, repr);
        // One byte short is a header violation, never a panic (PKT-HDR-3).
        prop_assert!(PacketRepr::parse_bytes(&buf[..n - 1]).is_err());
    }

    /// Rule PKT-ROCE-1, PKT-ROCE-2, PKT-ROCE-7, PKT-ROCE-8: whole datagrams
    /// round-trip over IPv4 and IPv6, ICRC verified.
    #[test]
    fn roce_roundtrip((repr, payload) in packet_strategy(), ip in ip_strategy(), qpn in 0u32..(1 << 24), csum in any::<bool>()) {
        let checksum = if csum { UdpChecksum::Compute } else { UdpChecksum::Zero };
        let roce = RoceRepr {
            ip,
            udp: UdpRepr::for_qp(qpn, checksum),
            packet: PacketRepr { payload: &payload, ..repr },
        };
        let mut buf = [0u8; 512];
        let n = roce.emit(&mut buf).unwrap();
        prop_assert_eq!(n, roce.buffer_len());
        let parsed = roce::parse_ip(&buf[..n]).unwrap();
        prop_assert_eq!(parsed.to_repr(), roce);
        // The look-ahead a link uses to warm the next packet's QP reads the same DestQP.
        prop_assert_eq!(roce::peek_dest_qp(&buf[..n]), Some(repr.bth.dest_qp));
        let mut frame = [0u8; 512];
        let m = roce.emit_ethernet(roce::MAC_A, roce::MAC_B, &mut frame).unwrap();
        let (eth, parsed) = roce::parse_ethernet(&frame[..m]).unwrap();
        prop_assert_eq!(eth.src, roce::MAC_A);
        prop_assert_eq!(parsed.to_repr(), roce);
    }

    /// Rule PKT-HDR-3, PKT-OP-2, PKT-ROCE-10: arbitrary bytes never panic any
    /// parser.
    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        let _ = PacketRepr::parse_bytes(&bytes);
        let _ = roce::parse_ip(&bytes);
        let _ = roce::parse_ip_unverified(&bytes);
        let _ = roce::peek_dest_qp(&bytes);
        let _ = roce::parse_ethernet(&bytes);
        let _ = roce::ip_datagram_of_frame(&bytes);
        let _ = softhca::wire::icrc::verify_datagram(&bytes);
        if let Ok(mut r) = PcapReader::new(&bytes[..]) {
            for rec in r.by_ref().take(16) {
                if rec.is_err() { break; }
            }
        }
    }

    /// Rule PKT-HDR-3, PKT-OP-2: a valid datagram with one byte changed or cut
    /// short parses or fails, never panics.
    #[test]
    fn mutated_datagrams_never_panic((repr, payload) in packet_strategy(), ip in ip_strategy(), at in any::<usize>(), xor in 1u8.., cut in any::<usize>()) {
        let roce = RoceRepr {
            ip,
            udp: UdpRepr::for_qp(1, UdpChecksum::Compute),
            packet: PacketRepr { payload: &payload, ..repr },
        };
        let mut buf = [0u8; 512];
        let n = roce.emit(&mut buf).unwrap();
        let d = &mut buf[..n];
        d[at % n] ^= xor;
        let _ = roce::parse_ip_unverified(d);
        // A changed byte outside the masked fields is caught by the ICRC or by
        // a header check.
        let _ = roce::parse_ip(d);
        let _ = roce::parse_ip_unverified(&d[..cut % (n + 1)]);
        let _ = roce::peek_dest_qp(&d[..cut % (n + 1)]);
    }

    /// Any 256 bytes that parse as a CM message re-emit to the same bytes except reserved
    /// bits, and parse again to the same message; no input panics.
    #[test]
    fn cm_messages_parse_total_and_round_trip(
        mut mad in proptest::collection::vec(any::<u8>(), 0..300),
        attr in 0x10u16..0x19,
    ) {
        use softhca::wire::mad::*;
        if mad.len() >= MAD_HEADER_LEN {
            mad[1] = MGMT_CLASS_CM;
            mad[16..18].copy_from_slice(&attr.to_be_bytes());
        }
        if let Ok((h, m)) = CmMessage::parse(&mad) {
            let mut out = [0u8; MAD_LEN];
            m.emit(&h, &mut out).unwrap();
            let (h2, m2) = CmMessage::parse(&out).unwrap();
            prop_assert_eq!(h2, h);
            prop_assert_eq!(m2, m);
        }
    }
}
