//! Wire-format speed: parse + ICRC verify of an inbound datagram, and emit +
//! ICRC of an outbound one, for 64 B and 4 KiB payloads; plus header parse
//! alone and the raw ICRC. Targets (DESIGN, wire issue): ICRC >= 10 GB/s,
//! header parse <= 50 ns per packet. And the copy + ICRC of a 4 KiB payload, from a region
//! far larger than the cache and from a hot buffer: a copy then a CRC pass, against the one
//! fused pass (`mem::copy_crc`) that `emit` and the shared-memory link's receive use. And an
//! RC ACK's datagram built by the ordinary emitter against the one a responder writes from
//! its template (`AckTemplate`): the PSN and AETH written, the ICRC continued over them. And
//! the ICRC's CRC over a short datagram's headers from scratch against a `HeadMemo` hit
//! (`SOFTHCA_CRC=sparse` gives the kernel an emulator gets, the table walk for so few bytes).
//! And a short Send's headers and their CRC from the emitter against its QP's `RequestHead`.

use std::hint::black_box;
use std::net::Ipv4Addr;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use softhca::wire::roce::{self, UdpRepr};
use softhca::wire::*;

fn datagram(payload: &[u8]) -> RoceRepr<'_> {
    let mut bth = BthRepr::new(Opcode::RcRdmaWriteOnly, 0xffff, 0x11, Psn::new(5));
    bth.ack_req = true;
    RoceRepr {
        ip: IpRepr::V4(Ipv4Repr::new(Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2))),
        udp: UdpRepr::for_qp(0x11, UdpChecksum::Zero),
        packet: PacketRepr {
            reth: Some(RethRepr { va: 0x1000, r_key: 0x1234, dma_length: payload.len() as u32 }),
            payload,
            ..PacketRepr::new(bth)
        },
    }
}

fn bench(c: &mut Criterion) {
    for size in [8usize, 64, 4096] {
        let payload: Vec<u8> = (0..size).map(|i| i as u8).collect();
        let repr = datagram(&payload);
        let mut buf = vec![0u8; repr.buffer_len()];
        let n = repr.emit(&mut buf).unwrap();
        let wire = buf[..n].to_vec();
        let transport = &wire[28..];

        let mut g = c.benchmark_group(format!("wire/{size}B"));
        g.throughput(Throughput::Bytes(n as u64));
        g.bench_function("parse_ip+icrc_verify", |b| {
            b.iter(|| roce::parse_ip(black_box(&wire)).unwrap().packet.bth.psn)
        });
        g.bench_function("emit_ip+icrc", |b| b.iter(|| black_box(&repr).emit(black_box(&mut buf)).unwrap()));
        g.bench_function("icrc_only", |b| b.iter(|| icrc::compute_datagram(black_box(&wire)).unwrap()));
        g.bench_function("header_parse_ip_unverified", |b| {
            b.iter(|| roce::parse_ip_unverified(black_box(&wire)).unwrap().packet.bth.psn)
        });
        g.bench_function("header_parse_packet", |b| {
            b.iter(|| PacketRepr::parse_bytes(black_box(transport)).unwrap().bth.psn)
        });
        g.finish();
    }
}

/// The copy + ICRC of one 4 KiB packet payload, as a sender gathers it from an MR far larger
/// than the cache (`cold`) or from one buffer sent over and over (`hot`, also what a receiver
/// copying a datagram in reads): the copy then a CRC pass over the copy, against the one
/// fused pass of `mem::copy_crc` (the CRC folded from the registers the copy stores).
fn bench_copy_icrc(c: &mut Criterion) {
    const COLD: usize = 64 << 20;
    const PKT: usize = 4096;
    let src: Vec<u8> = (0..COLD).map(|i| (i * 7) as u8).collect();
    let mut dst = vec![0u8; PKT];
    for (name, span) in [("cold: 4096B from a 64 MiB region", COLD), ("hot: 4096B from one 4 KiB buffer", PKT)] {
        let mut g = c.benchmark_group(format!("copy+icrc/{name}"));
        g.throughput(Throughput::Bytes(PKT as u64));
        let mut at = 0usize;
        let mut next = move || {
            at = (at + PKT) % span;
            at
        };
        g.bench_function("copy_only", |b| {
            b.iter(|| {
                let o = next();
                dst.copy_from_slice(&src[o..o + PKT]);
                black_box(&dst);
            })
        });
        g.bench_function("copy_then_icrc", |b| {
            b.iter(|| {
                let o = next();
                dst.copy_from_slice(&src[o..o + PKT]);
                let mut h = crc32fast::Hasher::new();
                h.update(&dst);
                h.finalize()
            })
        });
        g.bench_function("fused_copy_crc", |b| {
            b.iter(|| {
                let o = next();
                softhca::mem::copy_crc(&mut dst, &src[o..o + PKT], 0)
            })
        });
        g.finish();
    }
}

/// An RC ACK, as the ordinary emitter builds it (IP and UDP headers, the BTH and AETH, the
/// ICRC over the masked headers) and as `AckTemplate` writes it; the bytes are the same.
fn bench_ack(c: &mut Criterion) {
    let ip = IpRepr::V4(Ipv4Repr::new(Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2)));
    let udp = UdpRepr::for_qp(0x11, UdpChecksum::Zero);
    let bth = BthRepr::new(Opcode::RcAcknowledge, 0xffff, 0x12, Psn::new(0));
    let template = AckTemplate::new(ip, udp, bth).unwrap();
    let aeth = AethRepr { syndrome: Syndrome::Ack { credit_code: 31 }, msn: 7 };
    let mut buf = [0u8; 128];
    let mut g = c.benchmark_group("wire/ack");
    g.bench_function("emitter", |b| {
        let mut psn = 0u32;
        b.iter(|| {
            psn = (psn + 1) & 0xff_ffff;
            let packet = PacketRepr { aeth: Some(aeth), ..PacketRepr::new(BthRepr { psn: Psn::new(psn), ..bth }) };
            RoceRepr { ip, udp, packet }.emit(black_box(&mut buf)).unwrap()
        })
    });
    g.bench_function("template", |b| {
        let mut psn = 0u32;
        b.iter(|| {
            psn = (psn + 1) & 0xff_ffff;
            black_box(&template).emit(Psn::new(psn), aeth, black_box(&mut buf)).unwrap()
        })
    });
    g.finish();
}

/// The CRC over an 8-byte Send's headers (IP through BTH), from scratch (`start_datagram`) and
/// from a memo that has seen them (`HeadMemo::start`, a hit: only the AckReq byte and the PSN
/// are checksummed), the PSN changing each time as in a stream.
fn bench_head_memo(c: &mut Criterion) {
    let payload = [7u8; 8];
    let mut repr = datagram(&payload);
    repr.packet.bth.opcode = Opcode::RcSendOnly;
    repr.packet.reth = None;
    let mut buf = vec![0u8; repr.buffer_len()];
    let n = repr.emit(&mut buf).unwrap();
    let head_len = n - 4 - payload.len();
    let psn_at = 28 + 9;
    let mut memo = icrc::HeadMemo::default();
    let mut g = c.benchmark_group("wire/head_crc");
    g.bench_function("from_scratch", |b| {
        let mut psn = 0u32;
        b.iter(|| {
            psn = psn.wrapping_add(1);
            buf[psn_at + 2] = psn as u8;
            icrc::start_datagram(black_box(&buf[..head_len])).unwrap()
        })
    });
    g.bench_function("memo", |b| {
        let mut psn = 0u32;
        b.iter(|| {
            psn = psn.wrapping_add(1);
            buf[psn_at + 2] = psn as u8;
            memo.start(black_box(&buf[..head_len])).unwrap()
        })
    });
    g.finish();
}

/// An 8-byte RC Send Only's headers (IP through BTH) and the ICRC's CRC over them, as the
/// ordinary emitter writes them (with a `HeadMemo` that has seen them) and as a
/// `RequestHead` writes them (a copy, the PSN, the CRC continued over its three bytes); the
/// PSN changing each time as in a stream, the bytes the same.
fn bench_request_head(c: &mut Criterion) {
    let ip = IpRepr::V4(Ipv4Repr::new(Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2)));
    let udp = UdpRepr::for_qp(0x11, UdpChecksum::Zero);
    let bth = BthRepr { ack_req: true, ..BthRepr::new(Opcode::RcSendOnly, 0xffff, 0x12, Psn::new(0)) };
    let mut buf = [0u8; 128];
    let range = RoceRepr { ip, udp, packet: PacketRepr::new(bth) }.emit_headers(8, &mut buf).unwrap();
    let head = RequestHead::new(ip, udp, bth, 8, &buf[..range.start]).unwrap();
    let mut memo = icrc::HeadMemo::default();
    let mut g = c.benchmark_group("wire/request_head");
    g.bench_function("emitter", |b| {
        let mut psn = 0u32;
        b.iter(|| {
            psn = (psn + 1) & 0xff_ffff;
            let packet = PacketRepr::new(BthRepr { psn: Psn::new(psn), ..bth });
            let range = RoceRepr { ip, udp, packet }.emit_headers(8, black_box(&mut buf)).unwrap();
            memo.start(&buf[..range.start]).unwrap()
        })
    });
    g.bench_function("template", |b| {
        let mut psn = 0u32;
        b.iter(|| {
            psn = (psn + 1) & 0xff_ffff;
            black_box(&head).write(Psn::new(psn), black_box(&mut buf)).unwrap()
        })
    });
    g.finish();
}

criterion_group!(benches, bench, bench_copy_icrc, bench_ack, bench_head_memo, bench_request_head);
criterion_main!(benches);
