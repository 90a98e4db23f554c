//! Known-answer tests for each header, the opcode table, the AETH tables and
//! PSN arithmetic, all built by hand from RULES.md.

use softhca::wire::aeth::{self, credit_code_for, credits, rnr_timer_us};
use softhca::wire::*;

/// Emits `repr` through its view into a fresh buffer of `N` bytes.
macro_rules! emit_to {
    ($view:ident, $repr:expr, $n:expr) => {{
        let mut buf = [0u8; $n];
        $repr.emit(&mut $view::new_checked(&mut buf[..]).unwrap());
        buf
    }};
}

/// Rule PKT-HDR-1, PKT-ROCE-9: the BTH of the RULES.md test vector.
#[test]
fn bth_known_answer_test_vector() {
    let bytes = [0x04, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x11, 0x80, 0x00, 0x00, 0x05];
    let bth = Bth::new_checked(&bytes[..]).unwrap();
    let r = BthRepr::parse(&bth).unwrap();
    assert_eq!(r.opcode, Opcode::RcSendOnly);
    assert!(!r.se && !r.mig_req && !r.fecn && !r.becn);
    assert_eq!((r.pad_cnt, r.tver, r.p_key, r.dest_qp), (0, 0, 0xffff, 0x11));
    assert!(r.ack_req);
    assert_eq!(r.psn, Psn::new(5));
    assert_eq!(emit_to!(Bth, r, 12), bytes);
}

/// Rule PKT-HDR-1, PKT-HDR-2: every BTH field at its bit position; reserved
/// bits are ignored on receipt and sent as 0.
#[test]
fn bth_known_answer_all_fields_and_reserved_bits() {
    let received = [
        0x0d, // RC_RDMA_READ_RESPONSE_FIRST
        0xe5, // SE, M, PadCnt 2, TVer 5
        0x80, 0x01, // P_Key
        0xff, // FECN, BECN + 6 reserved bits set
        0xab, 0xcd, 0xef, // DestQP
        0xff, // AckReq + 7 reserved bits set
        0x12, 0x34, 0x56, // PSN
    ];
    let r = BthRepr::parse(&Bth::new_checked(&received[..]).unwrap()).unwrap();
    assert_eq!(
        r,
        BthRepr {
            opcode: Opcode::RcRdmaReadResponseFirst,
            se: true,
            mig_req: true,
            pad_cnt: 2,
            tver: 5,
            p_key: 0x8001,
            fecn: true,
            becn: true,
            dest_qp: 0xabcdef,
            ack_req: true,
            psn: Psn::new(0x123456),
        }
    );
    let mut sent = received;
    sent[4] = 0xc0;
    sent[8] = 0x80;
    assert_eq!(emit_to!(Bth, r, 12), sent);

    // The setters touch only their own bits.
    let mut buf = [0u8; 12];
    let mut v = Bth::new_checked(&mut buf[..]).unwrap();
    v.set_becn(true);
    v.set_pad_cnt(3);
    v.set_dest_qp(0x0100_0002);
    v.set_psn(Psn::new(0xffffff));
    assert_eq!(buf, [0, 0x30, 0, 0, 0x40, 0, 0, 2, 0, 0xff, 0xff, 0xff]);
}

/// Rule PKT-HDR-1, PKT-HDR-2: RDETH and DETH layouts; reserved bytes ignored
/// and sent as 0.
#[test]
fn rdeth_deth_known_answer() {
    let rdeth = [0xff, 0x12, 0x34, 0x56];
    let r = RdethRepr::parse(&Rdeth::new_checked(&rdeth[..]).unwrap()).unwrap();
    assert_eq!(r.ee_cnxt, 0x123456);
    assert_eq!(emit_to!(Rdeth, r, 4), [0, 0x12, 0x34, 0x56]);

    let deth = [0x80, 0x01, 0x02, 0x03, 0xff, 0x00, 0x00, 0x01];
    let r = DethRepr::parse(&Deth::new_checked(&deth[..]).unwrap()).unwrap();
    assert_eq!((r.q_key, r.src_qp), (0x8001_0203, 1));
    assert_eq!(emit_to!(Deth, r, 8), [0x80, 1, 2, 3, 0, 0, 0, 1]);
}

/// The XRCETH (IBA Annex A14): a reserved byte, sent as 0 and ignored, then the XRC SRQ
/// number; in a packet it comes first after the BTH, before the RETH (an XRC Write's first
/// packet here).
#[test]
fn xrceth_known_answer() {
    let x = [0xff, 0xab, 0xcd, 0xef];
    let r = XrcEthRepr::parse(&XrcEth::new_checked(&x[..]).unwrap()).unwrap();
    assert_eq!(r.xrc_srq, 0xabcdef);
    assert_eq!(emit_to!(XrcEth, r, 4), [0, 0xab, 0xcd, 0xef]);
    let bth = BthRepr::new(Opcode::XrcRdmaWriteFirst, 0xffff, 5, Psn::new(9));
    let p = PacketRepr {
        xrceth: Some(XrcEthRepr { xrc_srq: 0x123456 }),
        reth: Some(RethRepr { va: 0x1122_3344_5566_7788, r_key: 0x99aa_bbcc, dma_length: 0x1000 }),
        payload: &[7; 8],
        ..PacketRepr::new(bth)
    };
    let mut buf = [0u8; 64];
    let n = p.emit(&mut buf).unwrap();
    assert_eq!(n, 12 + 4 + 16 + 8 + 4);
    assert_eq!(buf[0], 0xA6);
    assert_eq!(buf[12..16], [0, 0x12, 0x34, 0x56]);
    assert_eq!(buf[16..24], 0x1122_3344_5566_7788u64.to_be_bytes());
    assert_eq!(buf[32..40], [7; 8]);
    assert_eq!(PacketRepr::parse_bytes(&buf[..n]).unwrap(), PacketRepr { payload: &buf[32..40], ..p });
}

/// Rule PKT-HDR-1: RETH, AtomicETH, AtomicAckETH, ImmDt and IETH layouts.
#[test]
fn reth_atomic_imm_ieth_known_answer() {
    let reth: Vec<u8> = (1..=16).collect();
    let r = RethRepr::parse(&Reth::new_checked(&reth[..]).unwrap()).unwrap();
    assert_eq!(r.va, 0x0102_0304_0506_0708);
    assert_eq!(r.r_key, 0x090a_0b0c);
    assert_eq!(r.dma_length, 0x0d0e_0f10);
    assert_eq!(emit_to!(Reth, r, 16)[..], reth[..]);

    let atomic: Vec<u8> = (1..=28).collect();
    let r = AtomicEthRepr::parse(&AtomicEth::new_checked(&atomic[..]).unwrap()).unwrap();
    assert_eq!(r.va, 0x0102_0304_0506_0708);
    assert_eq!(r.r_key, 0x090a_0b0c);
    assert_eq!(r.swap_add_data, 0x0d0e_0f10_1112_1314);
    assert_eq!(r.compare_data, 0x1516_1718_191a_1b1c);
    assert_eq!(emit_to!(AtomicEth, r, 28)[..], atomic[..]);

    let ack = [0xde, 0xad, 0xbe, 0xef, 0, 0, 0, 1];
    let r = AtomicAckEthRepr::parse(&AtomicAckEth::new_checked(&ack[..]).unwrap()).unwrap();
    assert_eq!(r.orig_remote_data, 0xdead_beef_0000_0001);
    assert_eq!(emit_to!(AtomicAckEth, r, 8), ack);

    let imm = [0x12, 0x34, 0x56, 0x78];
    let r = ImmDtRepr::parse(&ImmDt::new_checked(&imm[..]).unwrap()).unwrap();
    assert_eq!(r.imm_data, 0x1234_5678);
    assert_eq!(emit_to!(ImmDt, r, 4), imm);

    let r = IethRepr::parse(&Ieth::new_checked(&imm[..]).unwrap()).unwrap();
    assert_eq!(r.r_key, 0x1234_5678);
    assert_eq!(emit_to!(Ieth, r, 4), imm);
}

/// Rule PKT-HDR-1, PKT-ACK-1: AETH layout and syndrome encoding.
#[test]
fn aeth_known_answer() {
    let bytes = [0x63, 0x00, 0x01, 0x02];
    let r = AethRepr::parse(&Aeth::new_checked(&bytes[..]).unwrap()).unwrap();
    assert_eq!(r.syndrome, Syndrome::Nak(NakCode::RemoteOperationalError));
    assert_eq!(r.msn, 0x102);
    assert_eq!(emit_to!(Aeth, r, 4), bytes);
}

/// Rule PKT-HDR-3: every header view refuses a buffer one byte too short.
#[test]
fn header_views_refuse_short_buffers() {
    let b = [0u8; 28];
    assert!(Bth::new_checked(&b[..11]).is_err());
    assert!(Rdeth::new_checked(&b[..3]).is_err());
    assert!(Deth::new_checked(&b[..7]).is_err());
    assert!(Reth::new_checked(&b[..15]).is_err());
    assert!(AtomicEth::new_checked(&b[..27]).is_err());
    assert!(Aeth::new_checked(&b[..3]).is_err());
    assert!(AtomicAckEth::new_checked(&b[..7]).is_err());
    assert!(ImmDt::new_checked(&b[..3]).is_err());
    assert!(Ieth::new_checked(&b[..3]).is_err());
    assert_eq!(Bth::new_checked(&b[..5]).unwrap_err(), WireError::Truncated { needed: 12, len: 5 });
    assert!(Bth::new_checked(&b[..12]).is_ok());
    assert!(AtomicEth::new_checked(&b[..28]).is_ok());
}

/// Rule PKT-ACK-1: every syndrome byte decodes per the table and re-encodes
/// to itself.
#[test]
fn aeth_syndrome_table() {
    for b in 0..=255u8 {
        let s = Syndrome::from_byte(b);
        let expected = match b {
            0x00..=0x1f => Syndrome::Ack { credit_code: b },
            0x20..=0x3f => Syndrome::RnrNak { timer_code: b - 0x20 },
            0x60 => Syndrome::Nak(NakCode::PsnSeqErr),
            0x61 => Syndrome::Nak(NakCode::InvalidRequest),
            0x62 => Syndrome::Nak(NakCode::RemoteAccessError),
            0x63 => Syndrome::Nak(NakCode::RemoteOperationalError),
            0x64 => Syndrome::Nak(NakCode::InvalidRdRequest),
            _ => Syndrome::Reserved(b),
        };
        assert_eq!(s, expected, "syndrome {b:#04x}");
        assert_eq!(s.to_byte(), b);
    }
    assert_eq!(Syndrome::ACK_NO_CREDITS.to_byte(), 0x1f);
}

/// Rule PKT-ACK-1: the credit count code table, and the "largest code whose
/// credits do not exceed n" helper (the responder applies it to its free RQ WQEs).
#[test]
fn aeth_credit_codes() {
    let table = [
        0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096,
        6144, 8192, 12288, 16384, 24576, 32768,
    ];
    for (code, n) in table.iter().enumerate() {
        assert_eq!(credits(code as u8), Some(*n));
        assert_eq!(credit_code_for(*n), code as u8);
    }
    assert_eq!(credits(aeth::CREDIT_CODE_INVALID), None);
    assert_eq!(credits(32), None);
    assert_eq!(credit_code_for(5), 4);
    assert_eq!(credit_code_for(7), 5);
    assert_eq!(credit_code_for(100), 13);
    assert_eq!(credit_code_for(32767), 29);
    assert_eq!(credit_code_for(u32::MAX), 30);
    for n in 0..70_000u32 {
        let c = credit_code_for(n);
        assert!(credits(c).unwrap() <= n);
        assert!(credits(c + 1).is_none_or(|next| next > n));
    }
}

/// Rule PKT-RNR-6: RNR NAK timer codes in microseconds.
#[test]
fn aeth_rnr_timer_table() {
    let ms = [
        655.36, 0.01, 0.02, 0.03, 0.04, 0.06, 0.08, 0.12, 0.16, 0.24, 0.32, 0.48, 0.64, 0.96, 1.28, 1.92, 2.56, 3.84,
        5.12, 7.68, 10.24, 15.36, 20.48, 30.72, 40.96, 61.44, 81.92, 122.88, 163.84, 245.76, 327.68, 491.52,
    ];
    for (code, ms) in ms.iter().enumerate() {
        let us = (ms * 1000.0f64).round() as u32;
        assert_eq!(rnr_timer_us(code as u8), us, "code {code}");
        assert_eq!(aeth::rnr_timer(code as u8).as_micros(), u128::from(us));
    }
}

/// Rule PKT-OP-1, PKT-ACK-10: every opcode of the RULES.md table has the value,
/// service type, extended headers and payload rule listed there (so RDMA Read
/// Response First/Last/Only carry an AETH and Middle does not).
#[test]
fn opcode_table_matches_spec() {
    use ExtHeaders as H;
    #[rustfmt::skip]
    let expected: &[(u8, &str, ServiceType, ExtHeaders, bool)] = &[
        (0x00, "RC_SEND_FIRST", ServiceType::Rc, H::empty(), true),
        (0x01, "RC_SEND_MIDDLE", ServiceType::Rc, H::empty(), true),
        (0x02, "RC_SEND_LAST", ServiceType::Rc, H::empty(), true),
        (0x03, "RC_SEND_LAST_WITH_IMMEDIATE", ServiceType::Rc, H::IMMDT, true),
        (0x04, "RC_SEND_ONLY", ServiceType::Rc, H::empty(), true),
        (0x05, "RC_SEND_ONLY_WITH_IMMEDIATE", ServiceType::Rc, H::IMMDT, true),
        (0x06, "RC_RDMA_WRITE_FIRST", ServiceType::Rc, H::RETH, true),
        (0x07, "RC_RDMA_WRITE_MIDDLE", ServiceType::Rc, H::empty(), true),
        (0x08, "RC_RDMA_WRITE_LAST", ServiceType::Rc, H::empty(), true),
        (0x09, "RC_RDMA_WRITE_LAST_WITH_IMMEDIATE", ServiceType::Rc, H::IMMDT, true),
        (0x0a, "RC_RDMA_WRITE_ONLY", ServiceType::Rc, H::RETH, true),
        (0x0b, "RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", ServiceType::Rc, H::RETH.union(H::IMMDT), true),
        (0x0c, "RC_RDMA_READ_REQUEST", ServiceType::Rc, H::RETH, false),
        (0x0d, "RC_RDMA_READ_RESPONSE_FIRST", ServiceType::Rc, H::AETH, true),
        (0x0e, "RC_RDMA_READ_RESPONSE_MIDDLE", ServiceType::Rc, H::empty(), true),
        (0x0f, "RC_RDMA_READ_RESPONSE_LAST", ServiceType::Rc, H::AETH, true),
        (0x10, "RC_RDMA_READ_RESPONSE_ONLY", ServiceType::Rc, H::AETH, true),
        (0x11, "RC_ACKNOWLEDGE", ServiceType::Rc, H::AETH, false),
        (0x12, "RC_ATOMIC_ACKNOWLEDGE", ServiceType::Rc, H::AETH.union(H::ATOMIC_ACK_ETH), false),
        (0x13, "RC_COMPARE_SWAP", ServiceType::Rc, H::ATOMIC_ETH, false),
        (0x14, "RC_FETCH_ADD", ServiceType::Rc, H::ATOMIC_ETH, false),
        (0x16, "RC_SEND_LAST_WITH_INVALIDATE", ServiceType::Rc, H::IETH, true),
        (0x17, "RC_SEND_ONLY_WITH_INVALIDATE", ServiceType::Rc, H::IETH, true),
        // IBA 1.5's Atomic Write: RC only here, as in rxe (UC 0x3D, RD 0x5D and XRC 0xBD
        // stay reserved).
        (0x1d, "RC_ATOMIC_WRITE", ServiceType::Rc, H::RETH, true),
        (0x64, "UD_SEND_ONLY", ServiceType::Ud, H::DETH, true),
        (0x65, "UD_SEND_ONLY_WITH_IMMEDIATE", ServiceType::Ud, H::DETH.union(H::IMMDT), true),
        (0x81, "CNP", ServiceType::Cnp, H::empty(), false),
    ];
    for &(value, name, svc, headers, payload) in expected {
        let info = Opcode::from(value).info().unwrap_or_else(|| panic!("{value:#x}"));
        assert_eq!((info.value, info.name, info.service), (value, name, svc));
        assert_eq!((info.headers, info.payload), (headers, payload), "{name}");
        if value < 0x18 {
            // UC 0x20-0x2B repeats RC 0x00-0x0B; RD 0x40-0x54 repeats RC
            // 0x00-0x14 with RDETH, and DETH on requests.
            if value <= 0x0b {
                let uc = Opcode::from(value | 0x20).info().unwrap();
                assert_eq!(uc.service, ServiceType::Uc);
                assert_eq!(uc.headers, headers);
                assert_eq!(uc.name, name.replacen("RC_", "UC_", 1));
            }
            if value <= 0x14 {
                let rd = Opcode::from(value | 0x40).info().unwrap();
                assert_eq!(rd.service, ServiceType::Rd);
                let mut rd_headers = headers | H::RDETH;
                if info.is_request() {
                    rd_headers |= H::DETH;
                }
                assert_eq!(rd.headers, rd_headers, "{}", rd.name);
                assert_eq!(rd.payload, payload);
                assert_eq!(rd.name, name.replacen("RC_", "RD_", 1));
            }
            // XRC 0xA0-0xB7 repeats RC 0x00-0x17 (IBA Annex A14), the XRCETH first after the
            // BTH on every request, responses as RC's.
            let xrc = Opcode::from(value | 0xA0).info().unwrap();
            assert_eq!(xrc.service, ServiceType::Xrc);
            let xrc_headers = if info.is_request() { headers | H::XRCETH } else { headers };
            assert_eq!((xrc.headers, xrc.payload), (xrc_headers, payload), "{}", xrc.name);
            assert_eq!(xrc.name, name.replacen("RC_", "XRC_", 1));
            if info.is_request() {
                assert_eq!(xrc.headers.offset_of(H::XRCETH), Some(0), "{}", xrc.name);
            }
        }
    }
    let resync = Opcode::RdResync.info().unwrap();
    assert_eq!((resync.value, resync.headers, resync.payload), (0x55, H::RDETH | H::DETH, false));
    // RC 24 (Atomic Write's included) + UC 12 + RD 22 + UD 2 + CNP 1 + XRC 23.
    assert_eq!(OPCODES.len(), 84);
}

/// Rule PKT-OP-1: decoding is total; unlisted values are reserved opcodes and
/// every value round-trips.
#[test]
fn opcode_decoding_is_total() {
    let mut listed = 0;
    for v in 0..=255u8 {
        let op = Opcode::from(v);
        assert_eq!(op.value(), v);
        assert_eq!(u8::from(op), v);
        match op.info() {
            Some(info) => {
                listed += 1;
                assert_eq!(info.opcode, op);
                assert_eq!(info.value, v);
                assert!(!op.is_reserved());
            }
            None => {
                assert_eq!(op, Opcode::Reserved(v));
                assert_eq!(op.name(), "RESERVED");
            }
        }
    }
    assert_eq!(listed, OPCODES.len());
    assert!(Opcode::from(0x15).is_reserved());
    assert!([0x1c, 0x1e, 0x3d, 0x5d, 0xbd].iter().all(|&v| Opcode::from(v).is_reserved()));
    assert_eq!(Opcode::from(0x15).service_range(), Some(ServiceType::Rc));
    assert!(Opcode::from(0x2c).is_reserved());
    assert!(Opcode::from(0x66).is_reserved());
    assert_eq!(Opcode::from(0xe0).service_range(), None);
}

/// Rule PKT-OP-4: extended headers follow in the order BTH, RDETH, DETH,
/// RETH/AtomicETH/AETH, AtomicAckETH, ImmDt/IETH.
#[test]
fn ext_header_offsets_follow_wire_order() {
    use ExtHeaders as H;
    let rd_write_imm = Opcode::RdRdmaWriteOnlyWithImmediate.info().unwrap().headers;
    assert_eq!(rd_write_imm.offset_of(H::RDETH), Some(0));
    assert_eq!(rd_write_imm.offset_of(H::DETH), Some(4));
    assert_eq!(rd_write_imm.offset_of(H::RETH), Some(12));
    assert_eq!(rd_write_imm.offset_of(H::IMMDT), Some(28));
    assert_eq!(rd_write_imm.header_len(), 32);
    let rd_atomic_ack = Opcode::RdAtomicAcknowledge.info().unwrap().headers;
    assert_eq!(rd_atomic_ack.offset_of(H::AETH), Some(4));
    assert_eq!(rd_atomic_ack.offset_of(H::ATOMIC_ACK_ETH), Some(8));
    assert_eq!(rd_atomic_ack.offset_of(H::RETH), None);
    let names: Vec<_> = rd_write_imm.iter_names().map(|(n, _)| n).collect();
    assert_eq!(names, ["RDETH", "DETH", "RETH", "IMMDT"]);
}

/// Rule PKT-OP-1: the table read backwards: every row is the one opcode of its service,
/// operation, position and suffix, and meanings no row has give none.
#[test]
fn opcode_lookup_by_meaning() {
    for row in OPCODES {
        assert_eq!(
            Opcode::lookup(row.service, row.operation, row.position, row.suffix()),
            Some(row.opcode),
            "{}",
            row.name
        );
    }
    use Operation as O;
    use Position as P;
    use ServiceType as S;
    use Suffix as X;
    assert_eq!(Opcode::lookup(S::Rc, O::Send, P::Middle, X::Plain), Some(Opcode::RcSendMiddle));
    assert_eq!(Opcode::lookup(S::Uc, O::RdmaWrite, P::Only, X::Immediate), Some(Opcode::UcRdmaWriteOnlyWithImmediate));
    assert_eq!(Opcode::lookup(S::Rd, O::Resync, P::Only, X::Plain), Some(Opcode::RdResync));
    assert_eq!(Opcode::lookup(S::Ud, O::Send, P::Only, X::Immediate), Some(Opcode::UdSendOnlyWithImmediate));
    // What the table has no opcode for.
    assert_eq!(Opcode::lookup(S::Ud, O::RdmaWrite, P::Only, X::Plain), None);
    assert_eq!(Opcode::lookup(S::Ud, O::Send, P::First, X::Plain), None);
    assert_eq!(Opcode::lookup(S::Uc, O::RdmaReadRequest, P::Only, X::Plain), None);
    assert_eq!(Opcode::lookup(S::Rc, O::Send, P::First, X::Immediate), None);
    assert_eq!(Opcode::lookup(S::Rc, O::RdmaWrite, P::Last, X::Invalidate), None);
    assert_eq!(Opcode::lookup(S::Rc, O::FetchAdd, P::Middle, X::Plain), None);
    assert_eq!(Position::of(true, true), P::Only);
    assert_eq!(Position::of(true, false), P::First);
    assert_eq!(Position::of(false, false), P::Middle);
    assert_eq!(Position::of(false, true), P::Last);
}

/// Rule PKT-OP-1: positions, directions, operations and flags of the table.
#[test]
fn opcode_attributes() {
    let i = |op: Opcode| op.info().unwrap();
    assert_eq!(i(Opcode::RcSendFirst).position, Position::First);
    assert_eq!(i(Opcode::UcRdmaWriteMiddle).position, Position::Middle);
    assert_eq!(i(Opcode::RcRdmaReadResponseLast).position, Position::Last);
    assert_eq!(i(Opcode::RcAcknowledge).position, Position::Only);
    assert_eq!(i(Opcode::RcAcknowledge).direction, Direction::Response);
    assert_eq!(i(Opcode::RcFetchAdd).operation, Operation::FetchAdd);
    assert!(i(Opcode::RcCompareSwap).is_request());
    assert!(i(Opcode::RcSendLastWithImmediate).has_immediate());
    assert!(i(Opcode::RcSendOnlyWithInvalidate).has_invalidate());
    assert!(!i(Opcode::RcSendOnly).has_immediate());
    assert!(i(Opcode::RcSendOnly).solicited_event);
    assert!(i(Opcode::RcRdmaWriteOnlyWithImmediate).solicited_event);
    assert!(!i(Opcode::RcRdmaWriteOnly).solicited_event);
    assert!(!i(Opcode::RcSendFirst).solicited_event);
    assert_eq!(i(Opcode::Cnp).reserved_len, 16);
    assert_eq!(i(Opcode::Cnp).ext_len(), 16);
    for row in OPCODES {
        assert_eq!(row.has_immediate(), row.name.contains("IMMEDIATE"));
        assert_eq!(row.has_invalidate(), row.name.contains("INVALIDATE"));
        assert_eq!(
            row.is_request(),
            !matches!(
                row.operation,
                Operation::RdmaReadResponse | Operation::Acknowledge | Operation::AtomicAcknowledge
            )
        );
    }
}

/// Rule PKT-PSN-1: PSN arithmetic and comparison modulo 2^24.
#[test]
fn psn_arithmetic_is_modulo_2_24() {
    let max = Psn::new(0xff_ffff);
    assert_eq!(Psn::new(0x0100_0005), Psn::new(5));
    assert_eq!(max + 1, Psn::new(0));
    assert_eq!(max.next(), Psn::new(0));
    assert_eq!(Psn::new(0) - 1, max);
    assert_eq!(Psn::new(2).distance_from(max), 3);
    assert_eq!(max.distance_from(Psn::new(2)), 0xff_fffd);
    use std::cmp::Ordering::*;
    assert_eq!(Psn::new(1).psn_cmp(max), Greater);
    assert_eq!(max.psn_cmp(Psn::new(1)), Less);
    assert_eq!(Psn::new(7).psn_cmp(Psn::new(7)), Equal);
    assert_eq!(Psn::new(0x7f_ffff).psn_cmp(Psn::new(0)), Greater);
    assert_eq!(Psn::new(0x80_0000).psn_cmp(Psn::new(0)), Less);
    let mut p = max;
    p += 3;
    assert_eq!(p, Psn::new(2));
    assert!(Psn::new(1).in_range(max, Psn::new(3)));
    assert!(!Psn::new(4).in_range(max, Psn::new(3)));
}

/// Rule PKT-PSN-1, PKT-PSN-4: expected / duplicate (the 2^23 PSNs before
/// ePSN) / out of sequence, across the wrap.
#[test]
fn psn_classification_window() {
    let epsn = Psn::new(10);
    assert_eq!(Psn::new(10).classify(epsn), PsnClass::Expected);
    assert_eq!(Psn::new(9).classify(epsn), PsnClass::Duplicate);
    assert_eq!((epsn - (1 << 23)).classify(epsn), PsnClass::Duplicate);
    assert_eq!((epsn - ((1 << 23) + 1)).classify(epsn), PsnClass::OutOfSequence);
    assert_eq!(Psn::new(11).classify(epsn), PsnClass::OutOfSequence);
    assert_eq!(Psn::new(0xff_fff0).classify(epsn), PsnClass::Duplicate);
    let epsn = Psn::new(0);
    assert_eq!(Psn::new(0xff_ffff).classify(epsn), PsnClass::Duplicate);
    assert_eq!(Psn::new(0x80_0000).classify(epsn), PsnClass::Duplicate);
    assert_eq!(Psn::new(0x7f_ffff).classify(epsn), PsnClass::OutOfSequence);
}
