//! RC edge cases a review found: a wrong-kind response behind a lost ACK, an ACK for a PSN
//! never sent, a multi-packet Write whose key is revoked midway, the check order of a Write
//! with Immediate, and a NAK that also acknowledges progress.

mod common;

use std::cell::Cell;
use std::rc::Rc;

use common::pair::*;
use common::poll_all;
use softhca::link::sim::{ip_between, rewrite};
use softhca::transport::MAX_DATAGRAM;
use softhca::wire::{AethRepr, BthRepr, NakCode, Opcode, PacketRepr, Psn, RoceRepr, Syndrome, UdpChecksum};
use softhca::*;

const RUN: u64 = 1_000_000_000;

/// A response datagram from b to a's QP.
fn forge_resp(p: &Pair, opcode: Opcode, psn: u32, syndrome: Syndrome, payload: &[u8]) -> Vec<u8> {
    let ip = ip_between(p.b.gid.to_ipv6(), p.a.gid.to_ipv6());
    let repr = RoceRepr {
        ip,
        udp: softhca::wire::roce::UdpRepr::for_qp(p.b.qp.qp_num(), UdpChecksum::default_for(&ip)),
        packet: PacketRepr {
            aeth: Some(AethRepr { syndrome, msn: 0 }),
            payload,
            ..PacketRepr::new(BthRepr::new(opcode, 0xFFFF, p.a.qp.qp_num(), Psn::new(psn)))
        },
    };
    let mut buf = vec![0; repr.buffer_len()];
    let n = repr.emit(&mut buf).unwrap();
    buf.truncate(n);
    buf
}

fn ids(w: &[Wc]) -> Vec<(u64, WcStatus)> {
    w.iter().map(|w| (w.wr_id, w.status)).collect()
}

/// A response of the wrong kind (an RDMA Read response naming a Send) arrives while an
/// earlier Send's ACK is lost: the earlier Send is still retransmitted and completes first,
/// then the named one with Bad Response.
/// Rule ERR-SQ-12, PKT-RTY-1
#[test]
fn bad_response_with_unacked_earlier_wqe_does_not_stall() {
    let mut p = Pair::new(QpType::Rc, Mtu::Mtu1024);
    let src = p.a.pd.alloc_mr(128, Access::LOCAL_WRITE).unwrap();
    let dst = p.b.pd.alloc_mr(128, Access::LOCAL_WRITE).unwrap();
    p.b.qp.post_recv(&[RecvWr::new(1, &[dst.sge(0..64)]), RecvWr::new(2, &[dst.sge(64..128)])]).unwrap();
    p.a.qp
        .post_send(&[SendWr::send(1, &[src.sge(0..64)]).signaled(), SendWr::send(2, &[src.sge(64..128)]).signaled()])
        .unwrap();
    let drop_b = Rc::new(Cell::new(true));
    let d = drop_b.clone();
    p.filter = Some(Box::new(move |from_a, _| from_a || !d.get()));
    p.run(10_000); // both Sends delivered, b's ACKs lost
    assert!(p.a.cq.is_empty().unwrap());
    let forged = forge_resp(&p, Opcode::RcRdmaReadResponseOnly, 101, Syndrome::ACK_NO_CREDITS, &[]);
    p.inject(true, &forged);
    drop_b.set(false);
    p.run(RUN);
    let w = poll_all(&p.a.cq);
    assert_eq!(
        ids(&w),
        vec![(1, WcStatus::Success), (2, WcStatus::BadRespErr)],
        "the ACK timer must still retransmit Send 1; state {:?}",
        p.a.qp.state().unwrap()
    );
}

/// An ACK naming a PSN that was assigned but never transmitted is outside the outstanding
/// range and is dropped: it does not complete a 4-packet Send of which one packet left.
/// Rule PKT-ACK-8, PKT-ACK-5
#[test]
fn ack_for_psn_never_sent_is_dropped() {
    let p = Pair::new(QpType::Rc, Mtu::Mtu1024);
    let src = p.a.pd.alloc_mr(4096, Access::LOCAL_WRITE).unwrap();
    p.a.qp.post_send(&[SendWr::send(1, &[src.sge(0..4096)]).signaled()]).unwrap();
    let mut buf = vec![0u8; MAX_DATAGRAM];
    let n = p.a.ctx.transmit(0, &mut buf).unwrap();
    assert_eq!(Pkt::parse(&buf[..n]).psn, 100); // PSNs 100..=103 assigned, only 100 sent
    let ack = forge_resp(&p, Opcode::RcAcknowledge, 103, Syndrome::ACK_NO_CREDITS, &[]);
    p.a.ctx.receive(0, &ack);
    assert_eq!(ids(&poll_all(&p.a.cq)), vec![], "a Send completed before 3 of its 4 packets were sent");
}

/// A multi-packet RDMA Write through a memory window whose window is rebound elsewhere midway
/// (its R_Key revoked): the key is checked again for each packet, so the Last packet does not
/// land in memory no key allows.
/// DESIGN rule 5
#[test]
fn write_continuation_after_window_rebind_is_refused() {
    let mut p = Pair::new(QpType::Rc, Mtu::Mtu1024);
    let region = p.b.pd.alloc_mr(8192, Access::LOCAL_WRITE | Access::MW_BIND).unwrap();
    let mw = p.b.pd.alloc_mw().unwrap();
    p.b.qp.post_send(&[SendWr::bind_mw(1, &mw, &region, region.addr(), 4096, Access::REMOTE_WRITE)]).unwrap();
    p.run(RUN);
    let rkey = mw.rkey();
    let src = p.a.pd.reg_mr(vec![0x5A; 2048], Access::LOCAL_WRITE).unwrap();
    p.a.qp.post_send(&[SendWr::rdma_write(10, &[src.sge(0..2048)], region.addr(), rkey).signaled()]).unwrap();
    let held: Rc<Cell<Option<Vec<u8>>>> = Rc::new(Cell::new(None));
    let h = held.clone();
    p.filter = Some(Box::new(move |from_a, d| {
        if from_a && Pkt::parse(d).psn == 101 {
            h.set(Some(d.clone()));
            return false;
        }
        true
    }));
    p.run(10_000); // the First packet is written, the Last is held
    assert!(region.to_vec().unwrap()[..1024].iter().all(|b| *b == 0x5A));
    // The owner revokes the window: rebind it read-only over other bytes.
    p.b.qp.post_send(&[SendWr::bind_mw(2, &mw, &region, region.addr() + 4096, 64, Access::REMOTE_READ)]).unwrap();
    p.run(10_000);
    assert_ne!(mw.rkey(), rkey);
    let last = held.take().expect("held Last packet");
    p.inject(false, &last);
    let mem = region.to_vec().unwrap();
    assert!(mem[1024..2048].iter().all(|b| *b == 0), "the Last packet wrote through a revoked R_Key");
}

/// An RDMA Read whose region is deregistered after its first response left: the responder
/// sends a Remote Access Error NAK in place of the response it cannot send, with that
/// response's PSN. PKT-ACK-12's "PSN of the request that caused it" would be the Read's own,
/// which the requester has acknowledged with the first response: outside the outstanding
/// range (PKT-ACK-8), it would be dropped and the Read would end in Retry Counter Exceeded
/// against a responder in Error. With the response's PSN the requester completes the Read
/// with Remote Access Error.
/// Rule PKT-ACK-8, ERR-SQ-7
#[test]
fn a_read_whose_region_goes_midway_is_naked_in_place_of_its_response() {
    let mut p = Pair::new(QpType::Rc, Mtu::Mtu1024);
    let region = p.b.pd.reg_mr(vec![0x33; 3072], Access::LOCAL_WRITE | Access::REMOTE_READ).unwrap();
    let (addr, rkey) = (region.addr(), region.rkey());
    let land = p.a.pd.alloc_mr(3072, Access::LOCAL_WRITE).unwrap();
    let mut held = Some(region);
    p.filter = Some(Box::new(move |from_a, d| {
        if !from_a && Pkt::parse(d).opcode == Opcode::RcRdmaReadResponseFirst {
            drop(held.take()); // Deregister Memory Region, between two responses
        }
        true
    }));
    p.a.qp.post_send(&[SendWr::rdma_read(10, &[land.sge(0..3072)], addr, rkey).signaled()]).unwrap();
    p.run(RUN);
    let naks: Vec<(u32, Option<Syndrome>)> =
        p.sent_by(false).iter().filter(|k| k.opcode == Opcode::RcAcknowledge).map(|k| (k.psn, k.syndrome)).collect();
    assert_eq!(naks, vec![(101, Some(Syndrome::Nak(NakCode::RemoteAccessError)))]);
    assert_eq!(ids(&poll_all(&p.a.cq)), vec![(10, WcStatus::RemAccessErr)]);
    assert_eq!(p.sent_by(true).len(), 1, "no retransmission");
}

/// PKT-VAL-12: resources (an RQ WQE) are checked before lengths. An RDMA Write Only with
/// Immediate that finds no RQ WQE is RNR NAKed (Class B) even when its payload is too long,
/// rather than NAKed Invalid Request with the QP moved to Error.
/// Rule PKT-VAL-12, ERR-RQ-3, ERR-B-2
#[test]
fn write_imm_resources_checked_before_length() {
    let mut p = Pair::new(QpType::Rc, Mtu::Mtu256);
    let src = p.a.pd.alloc_mr(256, Access::LOCAL_WRITE).unwrap();
    let dst = p.b.pd.alloc_mr(1024, Access::LOCAL_WRITE | Access::REMOTE_WRITE).unwrap();
    p.a.qp.post_send(&[SendWr::rdma_write(1, &[src.sge(0..256)], dst.addr(), dst.rkey()).imm(7)]).unwrap();
    static BIG: [u8; 260] = [1; 260];
    let mut done = false;
    p.filter = Some(Box::new(move |from_a, d| {
        if from_a && !done {
            done = true;
            rewrite(d, |r| {
                r.packet.payload = &BIG;
                r.packet.reth.as_mut().unwrap().dma_length = 260;
            })
            .unwrap();
        }
        from_a
    }));
    p.run(10_000);
    let first_nak = p
        .sent_by(false)
        .into_iter()
        .find(|k| k.opcode == Opcode::RcAcknowledge && k.syndrome.is_some_and(|s| !s.is_ack()))
        .and_then(|k| k.syndrome);
    assert!(matches!(first_nak, Some(Syndrome::RnrNak { .. })), "got {first_nak:?}");
    assert_eq!(p.b.qp.state().unwrap(), QpState::Rts);
}

/// A PSN Sequence Error NAK that also acknowledges an earlier message: the counter is reloaded
/// by the acknowledgement, and then the retransmission the NAK causes consumes one unit: with
/// Retry Count 1 the NAKed packet is sent again once, not twice.
/// Rule PKT-RTY-3, PKT-RTY-5, PKT-RTY-7, PKT-NAK-3
#[test]
fn nak_with_progress_consumes_a_retry() {
    let o = Opts { retry_cnt: 1, ..Opts::default() };
    let mut p = Pair::with(QpType::Rc, Mtu::Mtu1024, o);
    let src = p.a.pd.alloc_mr(192, Access::LOCAL_WRITE).unwrap();
    let dst = p.b.pd.alloc_mr(192, Access::LOCAL_WRITE).unwrap();
    p.b.qp
        .post_recv(&[
            RecvWr::new(1, &[dst.sge(0..64)]),
            RecvWr::new(2, &[dst.sge(64..128)]),
            RecvWr::new(3, &[dst.sge(128..192)]),
        ])
        .unwrap();
    p.a.qp
        .post_send(&[
            SendWr::send(1, &[src.sge(0..64)]).signaled(),
            SendWr::send(2, &[src.sge(64..128)]).signaled(),
            SendWr::send(3, &[src.sge(128..192)]).signaled(),
        ])
        .unwrap();
    p.filter = Some(Box::new(|from_a, d| {
        let k = Pkt::parse(d);
        if from_a {
            k.psn != 101 // PSN 101 never gets through
        } else {
            !(k.psn == 100 && k.syndrome.is_some_and(|s| s.is_ack())) // the ACK of 100 is lost
        }
    }));
    p.run(RUN);
    let naks: Vec<_> =
        p.sent_by(false).into_iter().filter(|k| k.syndrome == Some(Syndrome::Nak(NakCode::PsnSeqErr))).collect();
    assert_eq!(naks.len(), 1);
    let w = poll_all(&p.a.cq);
    assert_eq!(w[0].wr_id, 1);
    assert_eq!(w[1].status, WcStatus::RetryExcErr);
    let sends_of_101 = p.sent_by(true).iter().filter(|k| k.psn == 101).count();
    assert_eq!(sends_of_101, 2, "original + retry_cnt (1) retransmissions");
}

/// A 64 KiB Send from a to b (64 packets at MTU 1024, PSNs 100..=163) whose ACKs are all
/// lost, run until a's Local ACK timer expires and handled: the pair, its MRs (kept alive for
/// the retransmissions) and the time of the timeout.
fn a_send_timed_out() -> (Pair, (Mr, Mr), u64) {
    let mut p = Pair::new(QpType::Rc, Mtu::Mtu1024);
    let n = 64 * 1024;
    let src = p.a.pd.alloc_mr(n, Access::LOCAL_WRITE).unwrap();
    let dst = p.b.pd.alloc_mr(n, Access::LOCAL_WRITE).unwrap();
    p.b.qp.post_recv(&[RecvWr::new(7, &[dst.sge(0..n)])]).unwrap();
    p.a.qp.post_send(&[SendWr::send(1, &[src.sge(0..n)]).signaled()]).unwrap();
    p.filter = Some(Box::new(|from_a, _| from_a)); // every ACK lost
    p.run(1_000_000); // 64 packets out, well inside the 4 ms timeout
    assert_eq!(p.sent_by(true).len(), 64);
    let due = p.a.ctx.poll_timeout().expect("the Local ACK timer runs");
    p.a.ctx.handle_timeout(due);
    (p, (src, dst), due)
}

/// The ACK of a whole message is lost; the Local ACK timer sends the requester back to the
/// message's first packet; the responder answers the first packet resent with an ACK of the
/// message's last PSN (as rxe answers every duplicate): the message is done, and nothing more
/// of it is resent (seen against rxe in the emulated guest: softhca went on resending the
/// message one packet per duplicate ACK).
/// Rule PKT-ACK-5, PKT-RTY-1
#[test]
fn a_duplicate_ack_of_the_last_psn_ends_a_go_back() {
    let (p, _mrs, due) = a_send_timed_out();
    let mut buf = vec![0u8; MAX_DATAGRAM];
    let k = p.a.ctx.transmit(due, &mut buf).expect("the go-back resends");
    assert_eq!(Pkt::parse(&buf[..k]).psn, 100);
    let ack = forge_resp(&p, Opcode::RcAcknowledge, 163, Syndrome::ACK_NO_CREDITS, &[]);
    p.a.ctx.receive(due, &ack);
    assert_eq!(ids(&poll_all(&p.a.cq)), vec![(1, WcStatus::Success)]);
    assert_eq!(p.a.ctx.transmit(due, &mut buf), None, "nothing of a finished message is resent");
}

/// After a Local ACK timeout the requester resends the oldest unacknowledged packet alone,
/// with AckReq, and nothing more until an answer comes; an ACK that covers part of the window
/// (a responder answers a duplicate with everything it has) resumes the go-back at the first
/// packet it leaves unacknowledged. Against Linux rxe in an emulated guest, resending the
/// whole window at every timeout fed the receive backlog the ACKs were stuck in.
/// Rule PKT-RTY-1, PKT-DUP-1
#[test]
fn a_timeout_probes_with_the_oldest_packet_before_resending_the_rest() {
    let (p, _mrs, due) = a_send_timed_out();
    let mut buf = vec![0u8; MAX_DATAGRAM];
    let k = p.a.ctx.transmit(due, &mut buf).expect("the probe");
    let probe = Pkt::parse(&buf[..k]);
    assert_eq!((probe.opcode, probe.psn, probe.ack_req), (Opcode::RcSendFirst, 100, true));
    assert_eq!(p.a.ctx.transmit(due, &mut buf), None, "nothing more before an answer");
    let ack = forge_resp(&p, Opcode::RcAcknowledge, 131, Syndrome::ACK_NO_CREDITS, &[]);
    p.a.ctx.receive(due, &ack);
    let mut resent = vec![];
    while let Some(k) = p.a.ctx.transmit(due, &mut buf) {
        resent.push(Pkt::parse(&buf[..k]).psn);
    }
    assert_eq!(resent, (132..164).collect::<Vec<u32>>(), "the go-back resumes past what the ACK covers");
    // The next timeout probes again from the new oldest unacknowledged packet.
    let due = p.a.ctx.poll_timeout().expect("the timer runs again");
    p.a.ctx.handle_timeout(due);
    let k = p.a.ctx.transmit(due, &mut buf).expect("the second probe");
    assert_eq!(Pkt::parse(&buf[..k]).psn, 132);
    assert_eq!(p.a.ctx.transmit(due, &mut buf), None);
}
