//! Whole-packet length and consistency checks, emission details, and the pcap
//! reader and writer.

use std::time::Duration;

use softhca::wire::packet::pad_for;
use softhca::wire::pcap::{PcapError, PcapReader, PcapWriter};
use softhca::wire::*;

/// BTH bytes for `opcode` with the given PadCnt.
fn bth(opcode: u8, pad: u8) -> Vec<u8> {
    vec![opcode, pad << 4, 0xff, 0xff, 0, 0, 0, 0x11, 0x80, 0, 0, 1]
}

/// Appends an ICRC slot (its value does not matter to the packet parser).
fn with_icrc(mut b: Vec<u8>) -> Vec<u8> {
    b.extend_from_slice(&[0xa, 0xb, 0xc, 0xd]);
    b
}

/// Rule PKT-HDR-3: a packet shorter than its opcode's headers plus PadCnt pad
/// bytes plus the ICRC is refused.
#[test]
fn too_short_for_headers_pad_and_icrc() {
    // BTH alone, no room for the ICRC.
    assert!(matches!(PacketRepr::parse_bytes(&bth(0x04, 0)), Err(WireError::Truncated { .. })));
    // RDMA Write First needs a RETH.
    let mut b = bth(0x06, 0);
    b.extend_from_slice(&[0; 12]);
    assert_eq!(PacketRepr::parse_bytes(&with_icrc(b)), Err(WireError::Truncated { needed: 32, len: 28 }));
    // PadCnt 3 with no payload bytes to pad.
    assert_eq!(PacketRepr::parse_bytes(&with_icrc(bth(0x04, 3))), Err(WireError::Truncated { needed: 19, len: 16 }));
    // Compare Swap needs all 28 AtomicETH bytes.
    let mut b = bth(0x13, 0);
    b.extend_from_slice(&[0; 24]);
    assert!(matches!(PacketRepr::parse_bytes(&with_icrc(b)), Err(WireError::Truncated { .. })));
    // CNP needs its 16 reserved bytes.
    let mut b = bth(0x81, 0);
    b.extend_from_slice(&[0; 12]);
    assert!(matches!(PacketRepr::parse_bytes(&with_icrc(b)), Err(WireError::Truncated { .. })));
}

/// Rule PKT-OP-2: extended headers or length inconsistent with the opcode are
/// refused: payload on an opcode that carries none.
#[test]
fn payload_on_opcode_without_payload() {
    for (op, ext) in [(0x11u8, 4usize), (0x12, 12), (0x0c, 16), (0x13, 28), (0x14, 28), (0x81, 16), (0x71, 0)] {
        let mut b = bth(op, 0);
        b.extend(std::iter::repeat_n(0u8, ext));
        let exact = with_icrc(b.clone());
        let info = Opcode::from(op).info();
        if info.is_some() {
            PacketRepr::parse_bytes(&exact).unwrap_or_else(|e| panic!("{op:#x}: {e}"));
            b.extend_from_slice(&[1, 2, 3, 4]);
            assert_eq!(PacketRepr::parse_bytes(&with_icrc(b)), Err(WireError::UnexpectedPayload(op)), "{op:#x}");
        } else {
            // A reserved opcode: no headers known, everything is payload, so
            // the transport can still apply the reserved-opcode rules.
            b.extend_from_slice(&[1, 2, 3, 4]);
            let b = with_icrc(b);
            let p = PacketRepr::parse_bytes(&b).unwrap();
            assert_eq!(p.bth.opcode, Opcode::Reserved(op));
            assert_eq!(p.payload, &[1, 2, 3, 4]);
        }
    }
    // With PadCnt but no payload on an opcode without payload.
    let mut b = bth(0x11, 1);
    b.extend_from_slice(&[0x1f, 0, 0, 1, 0, 0, 0, 0]);
    assert_eq!(PacketRepr::parse_bytes(&with_icrc(b)), Err(WireError::UnexpectedPayload(0x11)));
}

/// Rule PKT-LEN-5, PKT-HDR-2: PadCnt pad bytes are excluded from the
/// payload; payload plus pad must fill whole 4-byte words; pad bytes are sent
/// as 0.
#[test]
fn pad_count_and_payload_length() {
    let mut b = bth(0x04, 3);
    b.extend_from_slice(&[9, 8, 7, 6, 5, 0xee, 0xee, 0xee]);
    let b = with_icrc(b);
    let p = PacketRepr::parse_bytes(&b).unwrap();
    assert_eq!(p.payload, &[9, 8, 7, 6, 5]);
    let view = Packet::new_checked(&b[..]).unwrap();
    assert_eq!(view.payload_range(), 12..17);
    assert_eq!(view.icrc_offset(), 20);
    assert_eq!(view.icrc(), 0x0d0c_0b0a);

    let mut odd = bth(0x04, 0);
    odd.extend_from_slice(&[1, 2, 3]);
    assert_eq!(PacketRepr::parse_bytes(&with_icrc(odd)), Err(WireError::BadLength));

    // Emission derives PadCnt and writes zero pad whatever the buffer held.
    let mut buf = [0xeeu8; 64];
    let n = p.emit(&mut buf).unwrap();
    assert_eq!(n, 24);
    assert_eq!(buf[1] >> 4 & 3, 3);
    assert_eq!(&buf[12..24], &[9, 8, 7, 6, 5, 0, 0, 0, 0, 0, 0, 0]);
    for len in 0..9 {
        assert_eq!((len + pad_for(len)) % 4, 0);
        assert!(pad_for(len) < 4);
    }
}

/// Rule PKT-OP-1, PKT-OP-4: emission refuses extended headers the opcode
/// does not list (or lacks ones it does), and places them in wire order.
#[test]
fn emission_checks_headers_against_the_table() {
    let b = BthRepr::new(Opcode::RcRdmaWriteOnly, 0xffff, 1, Psn::new(0));
    let mut buf = [0u8; 128];
    assert_eq!(PacketRepr::new(b).emit(&mut buf), Err(WireError::HeaderMismatch(0x0a)));
    let extra =
        PacketRepr { reth: Some(RethRepr::default()), immdt: Some(ImmDtRepr { imm_data: 1 }), ..PacketRepr::new(b) };
    assert_eq!(extra.emit(&mut buf), Err(WireError::HeaderMismatch(0x0a)));
    let ok = PacketRepr { reth: Some(RethRepr { va: 1, r_key: 2, dma_length: 3 }), ..PacketRepr::new(b) };
    assert_eq!(ok.buffer_len(), 12 + 16 + 4);
    assert_eq!(ok.emit(&mut buf[..31]), Err(WireError::Truncated { needed: 32, len: 31 }));
    assert_eq!(ok.emit(&mut buf), Ok(32));

    let b = BthRepr::new(Opcode::RdRdmaWriteOnlyWithImmediate, 0xffff, 1, Psn::new(0));
    let rd = PacketRepr {
        rdeth: Some(RdethRepr { ee_cnxt: 0xaa }),
        deth: Some(DethRepr { q_key: 0xbb, src_qp: 0xcc }),
        reth: Some(RethRepr { va: 0xdd, r_key: 0, dma_length: 0 }),
        immdt: Some(ImmDtRepr { imm_data: 0xee }),
        payload: &[],
        ..PacketRepr::new(b)
    };
    let n = rd.emit(&mut buf).unwrap();
    assert_eq!(n, 12 + 4 + 8 + 16 + 4 + 4);
    assert_eq!(buf[15], 0xaa, "RDETH right after the BTH");
    assert_eq!(buf[19], 0xbb, "then DETH");
    assert_eq!(buf[31], 0xdd, "then RETH");
    assert_eq!(buf[43], 0xee, "then ImmDt");
    let view = Packet::new_checked(&buf[..n]).unwrap();
    assert_eq!(view.deth().unwrap().src_qp(), 0xcc);
    assert_eq!(view.ext_headers(), Opcode::RdRdmaWriteOnlyWithImmediate.info().unwrap().headers);
    assert!(view.aeth().is_none());
}

/// Rule PKT-OP-2: `emit_headers` leaves the payload to the caller and still
/// refuses a payload the opcode cannot carry.
#[test]
fn emit_headers_leaves_payload_to_the_caller() {
    let b = BthRepr::new(Opcode::RcSendFirst, 0xffff, 1, Psn::new(0));
    let mut buf = [0u8; 64];
    let range = PacketRepr::new(b).emit_headers(6, &mut buf).unwrap();
    assert_eq!(range, 12..18);
    buf[range].copy_from_slice(b"abcdef");
    let p = PacketRepr::parse_bytes(&buf[..24]).unwrap();
    assert_eq!(p.payload, b"abcdef");
    let ack = BthRepr::new(Opcode::RcAcknowledge, 0xffff, 1, Psn::new(0));
    let ack =
        PacketRepr { aeth: Some(AethRepr { syndrome: Syndrome::ACK_NO_CREDITS, msn: 0 }), ..PacketRepr::new(ack) };
    assert_eq!(ack.emit_headers(1, &mut buf), Err(WireError::UnexpectedPayload(0x11)));
}

fn sample_records() -> Vec<(Duration, Vec<u8>)> {
    vec![
        (Duration::new(1_700_000_000, 123_456_000), vec![1, 2, 3]),
        (Duration::new(1_700_000_001, 0), vec![]),
        (Duration::new(5, 999_999_000), (0..=255).collect()),
    ]
}

/// The pcap writer's output reads back record for record.
#[test]
fn pcap_roundtrip() {
    let mut w = PcapWriter::new(Vec::new()).unwrap();
    for (ts, data) in sample_records() {
        w.write_packet(ts, &data).unwrap();
    }
    let bytes = w.into_inner();
    assert_eq!(&bytes[..4], &[0xd4, 0xc3, 0xb2, 0xa1]);
    assert_eq!(bytes.len(), 24 + 3 * 16 + 3 + 256);
    let r = PcapReader::new(&bytes[..]).unwrap();
    assert_eq!(r.linktype(), 1);
    let got: Vec<_> = r.map(|rec| rec.map(|r| (r.timestamp, r.data))).collect::<Result<_, _>>().unwrap();
    assert_eq!(got, sample_records());
}

/// The reader takes big-endian files and nanosecond timestamps.
#[test]
fn pcap_reader_big_endian_and_nanoseconds() {
    for nanos in [false, true] {
        let mut f = Vec::new();
        f.extend_from_slice(&(if nanos { 0xa1b2_3c4du32 } else { 0xa1b2_c3d4 }).to_be_bytes());
        f.extend_from_slice(&2u16.to_be_bytes());
        f.extend_from_slice(&4u16.to_be_bytes());
        f.extend_from_slice(&[0; 8]);
        f.extend_from_slice(&65535u32.to_be_bytes());
        f.extend_from_slice(&1u32.to_be_bytes());
        f.extend_from_slice(&7u32.to_be_bytes());
        f.extend_from_slice(&500u32.to_be_bytes());
        f.extend_from_slice(&2u32.to_be_bytes());
        f.extend_from_slice(&60u32.to_be_bytes());
        f.extend_from_slice(&[0xaa, 0xbb]);
        let mut r = PcapReader::new(&f[..]).unwrap();
        assert_eq!(r.linktype(), 1);
        let rec = r.next_record().unwrap().unwrap();
        let frac = if nanos { Duration::from_nanos(500) } else { Duration::from_micros(500) };
        assert_eq!(rec.timestamp, Duration::from_secs(7) + frac);
        assert_eq!((rec.orig_len, rec.data), (60, vec![0xaa, 0xbb]));
        assert!(r.next_record().unwrap().is_none());
    }
}

/// Broken pcap streams are errors, not panics or huge allocations.
#[test]
fn pcap_reader_errors() {
    assert!(matches!(PcapReader::new(&[0u8; 24][..]), Err(PcapError::BadMagic(0))));
    assert!(matches!(PcapReader::new(&[0xd4, 0xc3][..]), Err(PcapError::Truncated)));
    let mut w = PcapWriter::new(Vec::new()).unwrap();
    w.write_packet(Duration::ZERO, &[1, 2, 3, 4]).unwrap();
    let bytes = w.into_inner();
    let mut r = PcapReader::new(&bytes[..bytes.len() - 1]).unwrap();
    assert!(matches!(r.next_record(), Err(PcapError::Truncated)));
    let mut huge = bytes.clone();
    huge[24 + 8..24 + 12].copy_from_slice(&u32::MAX.to_le_bytes());
    let mut r = PcapReader::new(&huge[..]).unwrap();
    assert!(matches!(r.next_record(), Err(PcapError::RecordTooLarge(u32::MAX))));
}
