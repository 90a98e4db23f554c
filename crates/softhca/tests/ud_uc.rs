//! The UD and UC services, SQE and its recovery, and header checks that only datagram QPs
//! have.

mod common;

use common::pair::*;
use common::poll_all;
use softhca::link::sim::rewrite;
use softhca::transport::{pkey_match, MAX_DATAGRAM};
use softhca::wire::{NakCode, Opcode, Syndrome};
use softhca::*;

const RUN: u64 = 10_000_000_000;

fn statuses(cq: &Cq) -> Vec<(u64, WcStatus)> {
    poll_all(cq).iter().map(|w| (w.wr_id, w.status)).collect()
}

/// UD: one Send Only packet with a DETH (our QPN, the WR's Q_Key or, with its msb set, our
/// own), no PSN check at the receiver, the GRH area in the first 40 bytes of the receive, the
/// byte count including it, the source QPN in the CQE, and completion once the packet is out.
/// Rule WR-SEND-2, WR-SEND-3, WR-SEND-4, WR-SEND-5, PKT-UD-1, PKT-UD-2, PKT-LEN-6, WR-RQ-7, CQE-7,
/// CQE-10, CQE-12, CQE-13, PKT-ROCE-11, PKT-UC-3, PKT-VAL-10, WR-RQ-8
#[test]
fn ud_send_and_receive() {
    let mut p = Pair::new(QpType::Ud, Mtu::Mtu1024);
    let ah = p.a.pd.create_ah(&AhAttr::roce(p.b.gid, 0)).unwrap();
    let src = p.a.pd.reg_mr((0..1024u32).map(|i| i as u8).collect(), Access::LOCAL_WRITE).unwrap();
    let dst = p.b.pd.alloc_mr(4096, Access::LOCAL_WRITE).unwrap();
    p.b.qp.post_recv(&[RecvWr::new(1, &[dst.sge(0..2000)]), RecvWr::new(2, &[dst.sge(2000..4096)])]).unwrap();
    let bq = p.b.qp.qp_num();
    let g = [src.sge(0..1000)];
    p.a.qp
        .post_send(&[
            SendWr::send(10, &g).ud(&ah, bq, 0x1111).signaled().imm(3),
            // msb set: the sender's own Q_Key (also 0x1111) goes out instead.
            SendWr::send(11, &g[..0]).ud(&ah, bq, 0x8000_0000).signaled(),
            // A wrong Q_Key is dropped at the receiver and counted.
            SendWr::send(12, &g).ud(&ah, bq, 0x2222).signaled(),
        ])
        .unwrap();
    // Scramble the PSN of the first packet: UD does not look at it.
    p.filter = Some(Box::new(|from_a, d| {
        if from_a && Pkt::parse(d).psn == 100 {
            rewrite(d, |r| r.packet.bth.psn = softhca::wire::Psn::new(0x777)).unwrap();
        }
        true
    }));
    p.run(RUN);
    assert_eq!(statuses(&p.a.cq), vec![(10, WcStatus::Success), (11, WcStatus::Success), (12, WcStatus::Success)]);
    let pk: Vec<(Opcode, usize)> = p.sent_by(true).iter().map(|k| (k.opcode, k.payload_len)).collect();
    assert_eq!(pk, vec![(Opcode::UdSendOnlyWithImmediate, 1000), (Opcode::UdSendOnly, 0), (Opcode::UdSendOnly, 1000)]);
    for (_, d) in p.trace.iter().filter(|(a, _)| *a) {
        let deth = softhca::wire::roce::parse_ip(d).unwrap().packet.deth.unwrap();
        assert_eq!(deth.src_qp, p.a.qp.qp_num());
        assert!(deth.q_key == 0x1111 || deth.q_key == 0x2222);
    }
    let wb = poll_all(&p.b.cq);
    assert_eq!(wb.len(), 2);
    assert_eq!((wb[0].byte_len, wb[0].src_qp, wb[0].imm()), (1040, p.a.qp.qp_num(), Some(3)));
    assert!(wb[0].wc_flags.contains(WcFlags::GRH));
    assert_eq!(wb[0].network_hdr_type, NetworkHdrType::Ipv4);
    assert_eq!(wb[1].byte_len, 40);
    let got = dst.to_vec().unwrap();
    assert_eq!(&got[40..1040], &src.to_vec().unwrap()[..1000]);
    // IPv4 in the GRH area: 20 undefined bytes, then the IPv4 header with our addresses.
    assert_eq!(got[20] >> 4, 4);
    assert_eq!(&got[20 + 12..20 + 16], &[127, 1, 0, 1]);
    assert_eq!(p.b.ctx.counters().qkey_violations, 1);
}

/// A UD message longer than the MTU completes with Local Length Error; the QP moves to SQE
/// and the WQEs queued behind it are flushed; the RQ keeps working in SQE; WRs posted in SQE
/// wait for SQE→RTS and then run in order.
/// Rule WR-SEND-9, ERR-SQ-1, QPT-AUTO-1, ERR-SQE-1, ERR-SQE-2, ERR-SQE-4, QPS-SQE-1, QPS-SQE-2,
/// QPS-SQE-3, QPS-SQE-4, QPS-SQE-5, QPS-SQE-6, QPT-SW-6, MOD-SQE-RTS-1
#[test]
fn ud_sqe_and_recovery() {
    let mut p = Pair::new(QpType::Ud, Mtu::Mtu1024);
    let ah = p.a.pd.create_ah(&AhAttr::roce(p.b.gid, 0)).unwrap();
    let src = p.a.pd.alloc_mr(8192, Access::LOCAL_WRITE).unwrap();
    let dst = p.a.pd.alloc_mr(8192, Access::LOCAL_WRITE).unwrap();
    let bq = p.b.qp.qp_num();
    let (big, small) = ([src.sge(0..4097)], [src.sge(0..8)]);
    p.a.qp.post_recv(&[RecvWr::new(50, &[dst.sge(0..100)])]).unwrap();
    p.a.qp
        .post_send(&[
            SendWr::send(1, &small).ud(&ah, bq, 0x1111).signaled(),
            SendWr::send(2, &big).ud(&ah, bq, 0x1111).signaled(),
            SendWr::send(3, &small).ud(&ah, bq, 0x1111).signaled(),
        ])
        .unwrap();
    p.run(RUN);
    assert_eq!(
        statuses(&p.a.cq),
        vec![
            (1, WcStatus::Success),
            (2, WcStatus::LocLenErr),
            (3, WcStatus::WrFlushErr),
            // a's own receive is untouched: SQE is not Error
        ]
    );
    assert_eq!(p.a.qp.state().unwrap(), QpState::Sqe);
    assert_eq!(p.sent_by(true).len(), 1);
    // In SQE: sends are accepted and held, receives are processed.
    p.a.qp.post_send(&[SendWr::send(4, &small).ud(&ah, bq, 0x1111).signaled()]).unwrap();
    p.a.qp.post_recv(&[RecvWr::new(51, &[dst.sge(100..200)])]).unwrap();
    let bah = p.b.pd.create_ah(&AhAttr::roce(p.a.gid, 0)).unwrap();
    let bsrc = p.b.pd.alloc_mr(8, Access::LOCAL_WRITE).unwrap();
    let aq = p.a.qp.qp_num();
    p.b.qp
        .post_send(&[
            SendWr::send(60, &[bsrc.sge(0..8)]).ud(&bah, aq, 0x1111),
            SendWr::send(61, &[]).ud(&bah, aq, 0x1111),
        ])
        .unwrap();
    p.run(RUN);
    assert_eq!(statuses(&p.a.cq), vec![(50, WcStatus::Success), (51, WcStatus::Success)]);
    assert_eq!(p.sent_by(true).len(), 1, "nothing sent from SQE");
    // Only RTS, Error or Reset are reachable from SQE.
    assert_eq!(p.a.qp.modify(&QpAttr::to_sqd()), Err(VerbsError::InvalidTransition));
    p.a.qp.modify(&QpAttr::to_rts()).unwrap();
    p.a.qp.post_send(&[SendWr::send(5, &small).ud(&ah, bq, 0x1111).signaled()]).unwrap();
    p.run(RUN);
    assert_eq!(statuses(&p.a.cq), vec![(4, WcStatus::Success), (5, WcStatus::Success)]);
}

/// In SQE an RQ error moves the QP to Error: a UD receive too small for the message.
/// Rule QPT-AUTO-5, ERR-SQE-3
#[test]
fn sqe_then_rq_error_is_error() {
    let mut p = Pair::new(QpType::Ud, Mtu::Mtu1024);
    let ah = p.a.pd.create_ah(&AhAttr::roce(p.b.gid, 0)).unwrap();
    let src = p.a.pd.alloc_mr(8192, Access::LOCAL_WRITE).unwrap();
    let dst = p.a.pd.alloc_mr(100, Access::LOCAL_WRITE).unwrap();
    let bq = p.b.qp.qp_num();
    p.a.qp.post_send(&[SendWr::send(1, &[src.sge(0..5000)]).ud(&ah, bq, 0x1111).signaled()]).unwrap();
    p.run(RUN);
    assert_eq!(p.a.qp.state().unwrap(), QpState::Sqe);
    p.a.qp.post_recv(&[RecvWr::new(2, &[dst.sge(0..41)])]).unwrap();
    let bah = p.b.pd.create_ah(&AhAttr::roce(p.a.gid, 0)).unwrap();
    let bsrc = p.b.pd.alloc_mr(8, Access::LOCAL_WRITE).unwrap();
    p.b.qp.post_send(&[SendWr::send(3, &[bsrc.sge(0..8)]).ud(&bah, p.a.qp.qp_num(), 0x1111)]).unwrap();
    p.run(RUN);
    assert_eq!(p.a.qp.state().unwrap(), QpState::Error);
    let s = statuses(&p.a.cq);
    assert_eq!(s[0], (1, WcStatus::LocLenErr));
    assert_eq!(s[1], (2, WcStatus::LocLenErr));
}

/// UD and UC receives with no WQE are dropped, never RNR NAKed; no ACKs at all.
/// Rule PKT-RNR-7, PKT-UC-1
#[test]
fn no_rnr_and_no_acks_for_datagrams_and_uc() {
    for t in [QpType::Ud, QpType::Uc] {
        let mut p = Pair::new(t, Mtu::Mtu1024);
        let ah = p.a.pd.create_ah(&AhAttr::roce(p.b.gid, 0)).unwrap();
        let bq = p.b.qp.qp_num();
        p.a.qp.post_send(&[SendWr::send(1, &[]).ud(&ah, bq, 0x1111).signaled()]).unwrap();
        p.run(RUN);
        assert_eq!(statuses(&p.a.cq), vec![(1, WcStatus::Success)]);
        assert!(p.sent_by(false).is_empty(), "{t:?}: the receiver sends nothing");
        assert_eq!(p.b.qp.state().unwrap(), QpState::Rts);
    }
}

/// UC: a lost packet abandons the message without a CQE, the WQE stays for the next message,
/// and the next First or Only is accepted whatever its PSN. An RDMA Write to a UC QP without
/// the Write enable is dropped.
/// Rule PKT-UC-2, PKT-UC-4, MOD-ACC-4, PKT-UC-3
#[test]
fn uc_loss_and_recovery() {
    let mut p = Pair::new(QpType::Uc, Mtu::Mtu1024);
    let src = p.a.pd.reg_mr((0..4096u32).map(|i| (i * 3) as u8).collect(), Access::LOCAL_WRITE).unwrap();
    let dst = p.b.pd.alloc_mr(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE).unwrap();
    p.b.qp.post_recv(&[RecvWr::new(1, &[dst.sge(0..4096)])]).unwrap();
    p.filter = Some(Box::new(|from_a, d| !(from_a && Pkt::parse(d).psn == 101)));
    p.a.qp
        .post_send(&[SendWr::send(10, &[src.sge(0..3000)]).signaled(), SendWr::send(11, &[src.sge(0..500)]).signaled()])
        .unwrap();
    p.run(RUN);
    assert_eq!(statuses(&p.a.cq), vec![(10, WcStatus::Success), (11, WcStatus::Success)], "UC completes on send");
    let wb = poll_all(&p.b.cq);
    assert_eq!(wb.iter().map(|w| (w.wr_id, w.byte_len)).collect::<Vec<_>>(), vec![(1, 500)], "same WQE, next message");
    // A Write with a new PSN after a gap is accepted (it starts a message).
    p.filter = Some(Box::new(|from_a, d| {
        if from_a {
            rewrite(d, |r| r.packet.bth.psn = r.packet.bth.psn.add(1000)).unwrap();
        }
        true
    }));
    p.a.qp.post_send(&[SendWr::rdma_write(12, &[src.sge(0..100)], dst.addr() + 1000, dst.rkey())]).unwrap();
    p.run(RUN);
    assert_eq!(&dst.to_vec().unwrap()[1000..1100], &src.to_vec().unwrap()[..100]);
    // Writes disabled: dropped.
    p.filter = None;
    p.b.qp.modify(&QpAttr::to_rts().remote_write(false)).unwrap();
    p.a.qp.post_send(&[SendWr::rdma_write(13, &[src.sge(0..100)], dst.addr() + 2000, dst.rkey())]).unwrap();
    p.run(RUN);
    assert_eq!(&dst.to_vec().unwrap()[2000..2100], &[0; 100][..]);
    assert_eq!(p.b.qp.state().unwrap(), QpState::Rts);
}

/// Reserved or foreign opcodes to UC and UD QPs are dropped silently.
/// Rule PKT-OP-5, PKT-VAL-9
#[test]
fn reserved_opcodes_to_datagram_and_uc_qps() {
    for t in [QpType::Ud, QpType::Uc] {
        let mut p = Pair::new(t, Mtu::Mtu1024);
        let ah = p.a.pd.create_ah(&AhAttr::roce(p.b.gid, 0)).unwrap();
        p.b.qp.post_recv(&[RecvWr::new(1, &[])]).unwrap();
        p.filter = Some(Box::new(move |from_a, d| {
            if from_a {
                let op = if t == QpType::Ud { 0x66 } else { 0x2C };
                rewrite(d, |r| {
                    r.packet.bth.opcode = Opcode::from(op);
                    r.packet.deth = None; // a reserved opcode has no extended headers
                })
                .unwrap();
            }
            true
        }));
        p.a.qp.post_send(&[SendWr::send(1, &[]).ud(&ah, p.b.qp.qp_num(), 0x1111)]).unwrap();
        p.run(RUN);
        assert!(p.b.cq.is_empty().unwrap(), "{t:?}");
        assert_eq!(p.b.ctx.counters().rx_dropped, 1);
        assert_eq!(p.b.qp.state().unwrap(), QpState::Rts);
    }
}

/// P_Key matching: low 15 bits equal, at least one full member, and the invalid P_Key matches
/// nothing, itself included. A packet failing both P_Key and Q_Key counts only the P_Key.
/// Rule PKT-VAL-8, PKT-VAL-13, PKT-VAL-14
#[test]
fn pkey_rules() {
    assert!(pkey_match(0xFFFF, 0xFFFF));
    assert!(pkey_match(0x7FFF, 0xFFFF));
    assert!(!pkey_match(0x7FFF, 0x7FFF), "two limited members");
    assert!(!pkey_match(0x8001, 0xFFFF));
    assert!(!pkey_match(0x8000, 0x8000) && !pkey_match(0x0000, 0x8000) && !pkey_match(0x8000, 0x0000));
    let mut p = Pair::new(QpType::Ud, Mtu::Mtu1024);
    let ah = p.a.pd.create_ah(&AhAttr::roce(p.b.gid, 0)).unwrap();
    p.b.qp.post_recv(&[RecvWr::new(1, &[])]).unwrap();
    p.filter = Some(Box::new(|from_a, d| {
        if from_a {
            rewrite(d, |r| r.packet.bth.p_key = 0x1234).unwrap();
        }
        true
    }));
    p.a.qp.post_send(&[SendWr::send(1, &[]).ud(&ah, p.b.qp.qp_num(), 0x4444)]).unwrap();
    p.run(RUN);
    let c = p.b.ctx.counters();
    assert_eq!((c.pkey_violations, c.qkey_violations), (1, 0));
}

/// A CNP changes nothing and is not acknowledged; a response outside the outstanding range is
/// dropped; an Invalid RD Request NAK completes the WQE with Remote Invalid RD Request.
/// Rule PKT-ROCE-13, PKT-ACK-8, ERR-SQ-9, PKT-ACK-5
#[test]
fn cnp_stale_responses_and_rd_nak() {
    let mut p = Pair::new(QpType::Rc, Mtu::Mtu1024);
    let cnp_repr = softhca::wire::RoceRepr {
        ip: softhca::link::sim::ip_between(p.a.gid.to_ipv6(), p.b.gid.to_ipv6()),
        udp: softhca::wire::roce::UdpRepr::for_qp(1, softhca::wire::UdpChecksum::Zero),
        packet: softhca::wire::PacketRepr {
            bth: softhca::wire::BthRepr {
                becn: true,
                ..softhca::wire::BthRepr::new(Opcode::Cnp, 0xFFFF, p.b.qp.qp_num(), softhca::wire::Psn::new(0))
            },
            ..softhca::wire::PacketRepr::new(softhca::wire::BthRepr::new(
                Opcode::Cnp,
                0xFFFF,
                p.b.qp.qp_num(),
                softhca::wire::Psn::new(0),
            ))
        },
    };
    let mut cnp = vec![0u8; 200];
    let n = cnp_repr.emit(&mut cnp).unwrap();
    let before = p.b.qp.debug_transport();
    p.inject(false, &cnp[..n]);
    let mut buf = vec![0u8; MAX_DATAGRAM];
    assert_eq!(p.b.ctx.transmit(0, &mut buf), None);
    assert_eq!(p.b.qp.debug_transport(), before);

    // A stale ACK (for a PSN before anything outstanding) is dropped.
    let src = p.a.pd.alloc_mr(8, Access::LOCAL_WRITE).unwrap();
    let dst = p.b.pd.alloc_mr(8, Access::LOCAL_WRITE | Access::REMOTE_WRITE).unwrap();
    p.a.qp.post_send(&[SendWr::rdma_write(1, &[src.sge(0..8)], dst.addr(), dst.rkey()).signaled()]).unwrap();
    p.run(RUN);
    let ack = p.trace.iter().find(|(a, _)| !*a).unwrap().1.clone();
    p.a.qp.post_send(&[SendWr::rdma_write(2, &[src.sge(0..8)], dst.addr(), dst.rkey()).signaled()]).unwrap();
    p.filter = Some(Box::new(|from_a, _| from_a));
    p.run(1);
    let dropped = p.a.ctx.counters().rx_dropped;
    p.inject(true, &ack);
    assert_eq!(p.a.ctx.counters().rx_dropped, dropped + 1);
    assert_eq!(statuses(&p.a.cq), vec![(1, WcStatus::Success)], "WQE 2 not completed by a stale ACK");
    // Now an Invalid RD Request NAK for WQE 2.
    let mut nak = ack.clone();
    rewrite(&mut nak, |r| {
        r.packet.bth.psn = r.packet.bth.psn.add(1);
        r.packet.aeth.as_mut().unwrap().syndrome = Syndrome::Nak(NakCode::InvalidRdRequest);
    })
    .unwrap();
    p.inject(true, &nak);
    assert_eq!(statuses(&p.a.cq), vec![(2, WcStatus::RemInvRdReqErr)]);
}

/// The outbound depth: with max_rd_atomic 1 the second Read waits for the first's response.
/// Rule WR-READ-3
#[test]
fn outbound_depth_limits_reads() {
    let o = Opts { max_rd_atomic: 1, ..Opts::default() };
    let mut p = Pair::with(QpType::Rc, Mtu::Mtu1024, o);
    let remote = p.b.pd.alloc_mr(64, Access::LOCAL_WRITE | Access::REMOTE_READ).unwrap();
    let land = p.a.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    p.a.qp
        .post_send(&[
            SendWr::rdma_read(1, &[land.sge(0..8)], remote.addr(), remote.rkey()).signaled(),
            SendWr::rdma_read(2, &[land.sge(8..16)], remote.addr(), remote.rkey()).signaled(),
        ])
        .unwrap();
    p.run(RUN);
    let order: Vec<(bool, Opcode)> = p.trace.iter().map(|(a, d)| (*a, Pkt::parse(d).opcode)).collect();
    assert_eq!(
        order,
        vec![
            (true, Opcode::RcRdmaReadRequest),
            (false, Opcode::RcRdmaReadResponseOnly),
            (true, Opcode::RcRdmaReadRequest),
            (false, Opcode::RcRdmaReadResponseOnly),
        ]
    );
}

/// The GID fd00::`n`.
fn v6_gid(n: u8) -> Gid {
    Gid::from_ipv6(format!("fd00::{n}").parse().unwrap())
}

/// A device `<name>-<n>` on GID fd00::`n`, a PD and a CQ.
fn v6_device(name: &str, n: u8) -> (Context, Pd, Cq) {
    let ctx =
        Context::create(DeviceConfig::default().name(format!("{name}-{n}")).gid0(v6_gid(n)).seed(n as u64)).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16).unwrap();
    (ctx, pd, cq)
}

/// An IPv6 address vector: every packet carries the AV's traffic class, flow label and hop
/// limit in its IPv6 header, between the two GIDs.
/// Rule MOD-AV-2, PKT-ROCE-3
#[test]
fn ipv6_av_fields_on_the_wire() {
    let gid = v6_gid;
    let mk = |n: u8| {
        let (ctx, pd, cq) = v6_device("v6", n);
        let qp = pd.create_qp(&QpInitAttr::rc(&cq, &cq)).unwrap();
        (ctx, pd, cq, qp)
    };
    let (ca, pa, cqa, qa) = mk(1);
    let (cb, pb, _cqb, qb) = mk(2);
    for (qp, peer, peer_qp) in [(&qa, 2u8, &qb), (&qb, 1u8, &qa)] {
        let mut ah = AhAttr::roce(gid(peer), 0);
        ah.grh.traffic_class = Some(0x28);
        ah.grh.flow_label = Some(0xABCDE);
        ah.grh.hop_limit = Some(9);
        let av = AddressVector::new(ah, Mtu::Mtu1024);
        let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
        qp.modify(&QpAttr::to_init().port(1).pkey_index(0).access(all)).unwrap();
        qp.modify(&QpAttr::to_rtr(av, peer_qp.qp_num()).rq_psn(0).max_dest_rd_atomic(1)).unwrap();
        qp.modify(&QpAttr::to_rts().sq_psn(0).timeout(10).retry_cnt(7).rnr_retry(7).max_rd_atomic(1)).unwrap();
    }
    let src = pa.alloc_mr(8, Access::LOCAL_WRITE).unwrap();
    let dst = pb.alloc_mr(8, Access::LOCAL_WRITE | Access::REMOTE_WRITE).unwrap();
    qa.post_send(&[SendWr::rdma_write(1, &[src.sge(0..8)], dst.addr(), dst.rkey()).signaled()]).unwrap();
    let mut buf = vec![0u8; MAX_DATAGRAM];
    let n = ca.transmit(0, &mut buf).unwrap();
    let d = softhca::wire::roce::parse_ip(&buf[..n]).unwrap();
    match d.ip {
        softhca::wire::IpRepr::V6(ip) => {
            assert_eq!((ip.traffic_class, ip.flow_label, ip.hop_limit), (0x28, 0xABCDE, 9));
            assert_eq!((Gid::from_ipv6(ip.src), Gid::from_ipv6(ip.dst)), (gid(1), gid(2)));
        }
        other => panic!("IPv6 expected, got {other:?}"),
    }
    cb.receive(0, &buf[..n]);
    let n = cb.transmit(0, &mut buf).unwrap();
    ca.receive(0, &buf[..n]);
    assert_eq!(statuses(&cqa), vec![(1, WcStatus::Success)]);
}

/// The WR table: Send with Immediate on a Raw QP is refused.
/// Rule WR-SQ-6
/// A flow label wider than the GRH's 20 bits (UCX puts `~path_index` there on RoCE) is taken,
/// as Linux takes it, by Create AH and Modify QP alike, and the IPv6 header carries its low 20
/// bits; a UD receive over IPv6 reports that network header (the GRH area holds it whole).
/// Rule MOD-AV-2, PKT-ROCE-3, PKT-ROCE-11, CQE-13
#[test]
fn wide_flow_label_and_ipv6_ud_receive() {
    let (ca, pa, cqa) = v6_device("fl", 1);
    let (cb, pb, cqb) = v6_device("fl", 2);
    let mut wide = AhAttr::roce(v6_gid(2), 0);
    wide.grh.flow_label = Some(0xFFF1_2345);
    let rc = pa.create_qp(&QpInitAttr::rc(&cqa, &cqa)).unwrap();
    rc.modify(&QpAttr::to_init().port(1).pkey_index(0).access(Access::LOCAL_WRITE)).unwrap();
    rc.modify(&QpAttr::to_rtr(AddressVector::new(wide, Mtu::Mtu1024), 5).rq_psn(0).max_dest_rd_atomic(1)).unwrap();
    let ah = pa.create_ah(&wide).unwrap();
    let ud = |pd: &Pd, cq: &Cq| {
        let qp = pd.create_qp(&QpInitAttr::ud(cq, cq)).unwrap();
        qp.modify(&QpAttr::to_init().port(1).pkey_index(0).qkey(7)).unwrap();
        qp.modify(&QpAttr::new(QpState::Rtr)).unwrap();
        qp.modify(&QpAttr::to_rts().sq_psn(0)).unwrap();
        qp
    };
    let (qa, qb) = (ud(&pa, &cqa), ud(&pb, &cqb));
    let dst = pb.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    qb.post_recv(&[RecvWr::new(1, &[dst.sge(0..64)])]).unwrap();
    qa.post_send(&[SendWr::send(1, &[]).ud(&ah, qb.qp_num(), 7)]).unwrap();
    let mut buf = vec![0u8; MAX_DATAGRAM];
    let n = ca.transmit(0, &mut buf).unwrap();
    match softhca::wire::roce::parse_ip(&buf[..n]).unwrap().ip {
        softhca::wire::IpRepr::V6(ip) => assert_eq!(ip.flow_label, 0x1_2345),
        other => panic!("IPv6 expected, got {other:?}"),
    }
    cb.receive(0, &buf[..n]);
    let wc = poll_all(&cqb);
    assert_eq!((wc.len(), wc[0].status, wc[0].network_hdr_type), (1, WcStatus::Success, NetworkHdrType::Ipv6));
    assert_eq!(dst.to_vec().unwrap()[0] >> 4, 6);
}

#[test]
fn raw_send_with_immediate_is_refused() {
    assert!(softhca::verbs::wr::wr_allowed(QpType::RawEthertype, WrOpcode::Send));
    assert!(!softhca::verbs::wr::wr_allowed(QpType::RawEthertype, WrOpcode::SendWithImm));
    assert!(!softhca::verbs::wr::wr_allowed(QpType::RawIpv6, WrOpcode::SendWithImm));
}

/// A link that sends later what `transmit` wrote (the UDP link's batches) holds UC and UD send
/// completions until it says the datagrams left: a program that exits on the completion does
/// not lose them. PKT-UC-3 (a UC/UD WQE completes once its last packet is out)
/// Rule PKT-UC-3
#[test]
fn deferred_unreliable_completions_wait_for_the_link() {
    for qp_type in [QpType::Uc, QpType::Ud] {
        let p = Pair::new(qp_type, Mtu::Mtu1024);
        p.a.ctx.defer_unreliable_completions();
        let src = p.a.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
        let dst = p.b.pd.alloc_mr(64 + 40, Access::LOCAL_WRITE).unwrap();
        p.b.qp.post_recv(&[RecvWr::new(9, &[dst.sge(0..104)])]).unwrap();
        let ah = p.a.pd.create_ah(&AhAttr::roce(p.b.gid, 0)).unwrap();
        let sge = [src.sge(0..64)];
        let wr = SendWr::send(1, &sge).signaled();
        let wr = if qp_type == QpType::Ud { wr.ud(&ah, p.b.qp.qp_num(), 0x1111) } else { wr };
        p.a.qp.post_send(&[wr]).unwrap();
        let mut buf = vec![0u8; MAX_DATAGRAM];
        let n = p.a.ctx.transmit(0, &mut buf).expect("the Send's datagram");
        assert!(p.a.cq.is_empty().unwrap(), "{qp_type:?}: no completion while the datagram is the link's");
        p.a.ctx.sent();
        assert_eq!(statuses(&p.a.cq), vec![(1, WcStatus::Success)], "{qp_type:?}");
        p.b.ctx.receive(0, &buf[..n]);
        assert_eq!(statuses(&p.b.cq), vec![(9, WcStatus::Success)], "{qp_type:?}");
    }
}
