//! The RC responder's error classes end to end: each test provokes or forges the offending
//! packet and checks the NAK, the CQEs, the states and the events on both sides.

mod common;

use common::pair::*;
use common::poll_all;
use softhca::link::sim::rewrite;
use softhca::wire::{NakCode, Opcode, Syndrome};
use softhca::*;

const RUN: u64 = 1_000_000_000;

fn all_access() -> Access {
    Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC
}

fn naks(p: &Pair, from_a: bool) -> Vec<(u32, Syndrome)> {
    p.sent_by(from_a)
        .into_iter()
        .filter(|k| k.opcode == Opcode::RcAcknowledge)
        .filter_map(|k| k.syndrome.filter(|s| !s.is_ack()).map(|s| (k.psn, s)))
        .collect()
}

fn events(ctx: &Context) -> Vec<AsyncEvent> {
    std::iter::from_fn(|| ctx.get_async_event()).collect()
}

/// Out of sequence: one PSN Sequence Error NAK carrying ePSN, later out-of-sequence packets
/// dropped silently, no state change, no CQE; the retransmission from ePSN completes normally.
/// Rule ERR-RQ-1, ERR-B-1, ERR-B-2, ERR-B-3, ERR-B-4, PKT-PSN-5, PKT-PSN-6, PKT-NAK-1, PKT-NAK-3
#[test]
fn class_b_sequence_error() {
    let mut p = Pair::new(QpType::Rc, Mtu::Mtu1024);
    let src = p.a.pd.reg_mr((0..8192u32).map(|i| i as u8).collect(), Access::LOCAL_WRITE).unwrap();
    let dst = p.b.pd.alloc_mr(8192, Access::LOCAL_WRITE).unwrap();
    p.b.qp.post_recv(&[RecvWr::new(1, &[dst.sge(0..8192)]), RecvWr::new(2, &[dst.sge(0..8192)])]).unwrap();
    p.a.qp
        .post_send(&[
            SendWr::send(10, &[src.sge(0..1000)]).signaled(),
            SendWr::send(11, &[src.sge(0..8192)]).signaled(),
        ])
        .unwrap();
    // Lose the second message's first packet (PSN 101) once.
    let mut dropped = false;
    p.filter = Some(Box::new(move |from_a, d| {
        if from_a && !dropped && Pkt::parse(d).psn == 101 {
            dropped = true;
            return false;
        }
        true
    }));
    // Before the retransmission: run only until the NAK has gone out.
    p.run(10_000);
    let n = naks(&p, false);
    assert_eq!(n, vec![(101, Syndrome::Nak(NakCode::PsnSeqErr))], "exactly one NAK, carrying ePSN");
    assert_eq!(p.b.qp.state().unwrap(), QpState::Rts);
    p.run(RUN);
    let wa = poll_all(&p.a.cq);
    assert_eq!(
        wa.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        vec![(10, WcStatus::Success), (11, WcStatus::Success)]
    );
    let wb = poll_all(&p.b.cq);
    assert_eq!(
        wb.iter().map(|w| (w.wr_id, w.status, w.byte_len)).collect::<Vec<_>>(),
        vec![(1, WcStatus::Success, 1000), (2, WcStatus::Success, 8192)]
    );
    assert_eq!(dst.to_vec().unwrap(), src.to_vec().unwrap());
    assert!(p.a.ctx.counters().retransmits >= 1);
}

/// RNR: a Send finds no receive: RNR NAK with our Minimum RNR NAK Timer and the request's PSN;
/// the requester waits at least that long and retransmits; once a receive is posted it goes
/// through. An RNR Retry Count of 7 never runs out.
/// Rule ERR-RQ-3, PKT-RNR-1, PKT-RNR-2, PKT-RNR-3, PKT-RNR-5, PKT-RNR-6, PKT-ACK-12
#[test]
fn class_b_rnr_then_success() {
    let o = Opts { min_rnr_timer: 14, ..Opts::default() }; // 1.28 ms
    let mut p = Pair::with(QpType::Rc, Mtu::Mtu1024, o);
    let src = p.a.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    p.a.qp.post_send(&[SendWr::send(1, &[src.sge(0..64)]).signaled()]).unwrap();
    p.run(10_000);
    assert_eq!(naks(&p, false), vec![(100, Syndrome::RnrNak { timer_code: 14 })]);
    let first = p.now;
    // Let it retry a few times without a receive (rnr_retry 7: unlimited).
    p.run(20_000_000);
    let rnr: Vec<u64> = (0..naks(&p, false).len()).map(|_| 0).collect();
    assert!(rnr.len() >= 10, "kept retrying: {}", rnr.len());
    assert!(p.a.cq.is_empty().unwrap());
    // The retransmissions are spaced by at least the timer.
    let n = naks(&p, false).len() as u64;
    assert!(p.now - first >= (n - 1) * 1_280_000);
    let dst = p.b.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    p.b.qp.post_recv(&[RecvWr::new(9, &[dst.sge(0..64)])]).unwrap();
    p.run(RUN);
    assert_eq!(poll_all(&p.a.cq)[0].status, WcStatus::Success);
    assert_eq!(poll_all(&p.b.cq)[0].wr_id, 9);
    assert_eq!(p.a.qp.state().unwrap(), QpState::Rts);
}

/// An RNR Retry Count n of 0..6 allows n retransmissions after RNR NAKs, then RNR Retry
/// Counter Exceeded and Error.
/// Rule PKT-RNR-4, ERR-SQ-11, ERR-SQ-2, QPT-AUTO-3
#[test]
fn rnr_retry_count_exhausted() {
    for n in [0u8, 1, 3, 6] {
        let o = Opts { rnr_retry: n, ..Opts::default() };
        let mut p = Pair::with(QpType::Rc, Mtu::Mtu1024, o);
        let src = p.a.pd.alloc_mr(8, Access::LOCAL_WRITE).unwrap();
        p.a.qp.post_send(&[SendWr::send(1, &[src.sge(0..8)]), SendWr::send(2, &[src.sge(0..8)])]).unwrap();
        p.run(RUN);
        let rnr = naks(&p, false).iter().filter(|(_, s)| matches!(s, Syndrome::RnrNak { .. })).count();
        assert_eq!(rnr, n as usize + 1, "rnr_retry {n}");
        let w = poll_all(&p.a.cq);
        assert_eq!(
            w.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
            vec![(1, WcStatus::RnrRetryExcErr), (2, WcStatus::WrFlushErr)]
        );
        assert_eq!(p.a.qp.state().unwrap(), QpState::Error);
        assert_eq!(p.a.ctx.counters().rnr_naks_received, n as u64 + 1);
    }
}

/// A two-packet Send into an empty RQ: the First draws an RNR NAK and the Last, now out of
/// sequence, a PSN Sequence Error NAK for the same PSN. The requester is already going back
/// there once the RNR timer runs out, so that NAK costs no retry, and the Local ACK timer
/// stays stopped during the wait: with a Retry Count of 1 and an ACK timeout shorter than the
/// RNR timer the Send waits for its receive instead of ending in Retry Counter Exceeded.
/// Rule PKT-RNR-2, PKT-RNR-5, PKT-RTY-7, ERR-SQ-10
#[test]
fn a_sequence_error_behind_an_rnr_nak_costs_no_retry() {
    // ACK timeout 1.05 ms; RNR timer 3.84 ms (code 18).
    let o = Opts { retry_cnt: 1, rnr_retry: 7, timeout: 8, min_rnr_timer: 18, ..Opts::default() };
    let mut p = Pair::with(QpType::Rc, Mtu::Mtu1024, o);
    let src = p.a.pd.alloc_mr(2048, Access::LOCAL_WRITE).unwrap();
    p.a.qp.post_send(&[SendWr::send(1, &[src.sge(0..2048)]).signaled()]).unwrap();
    p.run(20_000_000);
    let n = naks(&p, false);
    assert!(n.contains(&(100, Syndrome::Nak(NakCode::PsnSeqErr))), "{n:?}");
    assert!(n.iter().filter(|(_, s)| matches!(s, Syndrome::RnrNak { .. })).count() >= 3, "{n:?}");
    assert_eq!(poll_all(&p.a.cq), vec![], "still waiting for a receive");
    assert_eq!(p.a.qp.state().unwrap(), QpState::Rts);
    let dst = p.b.pd.alloc_mr(2048, Access::LOCAL_WRITE).unwrap();
    p.b.qp.post_recv(&[RecvWr::new(9, &[dst.sge(0..2048)])]).unwrap();
    p.run(RUN);
    assert_eq!(poll_all(&p.a.cq).iter().map(|w| w.status).collect::<Vec<_>>(), vec![WcStatus::Success]);
    assert_eq!(poll_all(&p.b.cq).iter().map(|w| (w.wr_id, w.byte_len)).collect::<Vec<_>>(), vec![(9, 2048)]);
}

/// Retry Count and RNR Retry Count changed at SQD → RTS hold from the first request after
/// it: one retransmission where the QP came up with seven, and one RNR NAK's worth.
/// Rule MOD-SQD-RTS-2, PKT-RTY-7, PKT-RNR-4
#[test]
fn retry_counts_set_out_of_sqd_take_effect() {
    for rnr in [false, true] {
        let mut p = Pair::new(QpType::Rc, Mtu::Mtu1024);
        let src = p.a.pd.alloc_mr(8, Access::LOCAL_WRITE).unwrap();
        let dst = p.b.pd.alloc_mr(8, Access::LOCAL_WRITE).unwrap();
        p.b.qp.post_recv(&[RecvWr::new(9, &[dst.sge(0..8)])]).unwrap();
        p.a.qp.post_send(&[SendWr::send(1, &[src.sge(0..8)]).signaled()]).unwrap();
        p.run(RUN);
        assert_eq!(poll_all(&p.a.cq).len(), 1);
        poll_all(&p.b.cq);
        p.a.qp.modify(&QpAttr::new(QpState::Sqd)).unwrap();
        p.run(RUN);
        p.a.qp.modify(&QpAttr::new(QpState::Rts).retry_cnt(1).rnr_retry(1)).unwrap();
        if !rnr {
            p.filter = Some(Box::new(|from_a, _| from_a)); // b's answers are lost
        }
        p.clear_trace();
        p.a.qp.post_send(&[SendWr::send(2, &[src.sge(0..8)]).signaled()]).unwrap();
        p.run(RUN);
        let sends = p.sent_by(true).iter().filter(|k| k.opcode == Opcode::RcSendOnly).count();
        let want = if rnr { WcStatus::RnrRetryExcErr } else { WcStatus::RetryExcErr };
        assert_eq!(poll_all(&p.a.cq).iter().map(|w| w.status).collect::<Vec<_>>(), vec![want], "rnr {rnr}");
        assert_eq!(sends, 2, "the Send and one retransmission (rnr {rnr})");
    }
}

/// An implied NAK that also acknowledges something costs its retry after what it
/// acknowledges reloads the counts, as a PSN Sequence Error NAK does: with a Retry Count of 1
/// the Read it goes back to is sent twice in all before Retry Counter Exceeded, not three times.
/// Here the ACK of a Send behind the Read comes in while the Read's response and the ACK of the
/// Send before it were lost; nothing gets through after.
/// Rule PKT-ACK-7, PKT-RTY-5, PKT-RTY-7
#[test]
fn an_implied_nak_that_acknowledges_costs_its_retry() {
    let o = Opts { retry_cnt: 1, ..Opts::default() };
    let mut p = Pair::with(QpType::Rc, Mtu::Mtu1024, o);
    let src = p.a.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    let dst = p.b.pd.alloc_mr(64, Access::LOCAL_WRITE | Access::REMOTE_READ).unwrap();
    p.b.qp.post_recv(&[RecvWr::new(1, &[dst.sge(0..8)]), RecvWr::new(2, &[dst.sge(8..16)])]).unwrap();
    let mut passed = false;
    p.filter = Some(Box::new(move |from_a, d| {
        if from_a {
            return true;
        }
        let k = Pkt::parse(d);
        let pass = !passed && k.opcode == Opcode::RcAcknowledge && k.psn == 102;
        passed |= pass;
        pass
    }));
    p.a.qp
        .post_send(&[
            SendWr::send(10, &[src.sge(0..8)]).signaled(),
            SendWr::rdma_read(11, &[src.sge(8..16)], dst.addr(), dst.rkey()).signaled(),
            SendWr::send(12, &[src.sge(16..24)]).signaled(),
        ])
        .unwrap();
    p.run(RUN);
    let reads = p.sent_by(true).iter().filter(|k| k.opcode == Opcode::RcRdmaReadRequest).count();
    let w = poll_all(&p.a.cq);
    assert_eq!(
        w.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>()[..2],
        [(10, WcStatus::Success), (11, WcStatus::RetryExcErr)]
    );
    assert_eq!(reads, 2, "the Read and one retransmission");
}

/// An RDMA Write whose R_Key check fails: Remote Access Error NAK, the requester completes it
/// with Remote Access Error and moves to Error; the responder moves to Error and, with no RQ
/// WQE in use, raises Local Access Violation; nothing was written. After that affiliated
/// error EVT-AE-2 lets a QP leave its outstanding WQEs without CQEs; softhca's answer, pinned
/// here, is that every one of them completes, flushed (the responder's receive below).
/// Rule ERR-RQ-9, ERR-C-1, ERR-C-2, ERR-C-5, ERR-C-6, ERR-C-7, ERR-SQ-7, PKT-NAK-2, QPT-AUTO-4, EVT-AE-2
#[test]
fn class_c_rkey_violation() {
    let mut p = Pair::new(QpType::Rc, Mtu::Mtu1024);
    let src = p.a.pd.reg_mr(vec![7; 100], Access::LOCAL_WRITE).unwrap();
    let dst = p.b.pd.alloc_mr(100, Access::LOCAL_WRITE | Access::REMOTE_WRITE).unwrap();
    p.b.qp.post_recv(&[RecvWr::new(5, &[])]).unwrap();
    let (g1, g2) = ([src.sge(0..100)], [src.sge(0..1)]);
    let bad = [SendWr::rdma_write(1, &g1, dst.addr(), dst.rkey() ^ 0x80).signaled(), SendWr::send(2, &g2)];
    p.a.qp.post_send(&bad).unwrap();
    p.run(RUN);
    assert_eq!(naks(&p, false), vec![(100, Syndrome::Nak(NakCode::RemoteAccessError))]);
    let wa = poll_all(&p.a.cq);
    assert_eq!(
        wa.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        vec![(1, WcStatus::RemAccessErr), (2, WcStatus::WrFlushErr)]
    );
    assert_eq!(p.a.qp.state().unwrap(), QpState::Error);
    assert_eq!(p.b.qp.state().unwrap(), QpState::Error);
    assert_eq!(dst.to_vec().unwrap(), vec![0; 100]);
    let ev = events(&p.b.ctx);
    assert!(ev
        .contains(&AsyncEvent { event_type: AsyncEventType::QpAccessErr, element: EventElement::Qp(p.b.qp.qp_num()) }));
    // The responder's receive was flushed, not consumed.
    let wb = poll_all(&p.b.cq);
    assert_eq!(wb.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(), vec![(5, WcStatus::WrFlushErr)]);
}

/// Operations not enabled on the responder are Invalid Request (Class C), for Read, Write and
/// Atomic alike.
/// Rule MOD-ACC-1, MOD-ACC-2, MOD-ACC-3, ERR-RQ-4, ERR-SQ-6, QPT-AUTO-4, ERR-C-6
#[test]
fn class_c_operation_not_enabled() {
    for (i, op) in ["read", "write", "atomic"].into_iter().enumerate() {
        let access = all_access() - [Access::REMOTE_READ, Access::REMOTE_WRITE, Access::REMOTE_ATOMIC][i];
        let o = Opts { access, ..Opts::default() };
        let mut p = Pair::with(QpType::Rc, Mtu::Mtu1024, o);
        let local = p.a.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
        let remote = p.b.pd.alloc_mr(64, all_access()).unwrap();
        let sges = [local.sge(0..8)];
        let wr = match op {
            "read" => SendWr::rdma_read(1, &sges, remote.addr(), remote.rkey()),
            "write" => SendWr::rdma_write(1, &sges, remote.addr(), remote.rkey()),
            _ => SendWr::atomic_fetch_add(1, &sges, remote.addr(), remote.rkey(), 1),
        };
        p.a.qp.post_send(&[wr.signaled()]).unwrap();
        p.run(RUN);
        assert_eq!(naks(&p, false), vec![(100, Syndrome::Nak(NakCode::InvalidRequest))], "{op}");
        assert_eq!(poll_all(&p.a.cq)[0].status, WcStatus::RemInvReqErr);
        assert_eq!(p.b.qp.state().unwrap(), QpState::Error);
        let ev = events(&p.b.ctx);
        assert!(ev.iter().any(|e| e.event_type == AsyncEventType::QpReqErr), "{op}: {ev:?}");
    }
}

/// A Middle packet with no message in progress, and a new First while a Send is in progress:
/// both Class C; in the second case the receive in use completes with Remote Invalid Request
/// Error and the rest are flushed after it.
/// Rule ERR-RQ-7, ERR-RQ-8, ERR-C-3, ERR-C-4, QPS-RTS-3
#[test]
fn class_c_opcode_sequence() {
    // Middle without First.
    let mut p = Pair::new(QpType::Rc, Mtu::Mtu1024);
    let src = p.a.pd.alloc_mr(4096, Access::LOCAL_WRITE).unwrap();
    let dst = p.b.pd.alloc_mr(8192, Access::LOCAL_WRITE).unwrap();
    p.b.qp.post_recv(&[RecvWr::new(1, &[dst.sge(0..4096)]), RecvWr::new(2, &[dst.sge(4096..8192)])]).unwrap();
    p.filter = Some(Box::new(|from_a, d| {
        if from_a && Pkt::parse(d).opcode == Opcode::RcSendFirst {
            rewrite(d, |r| r.packet.bth.opcode = Opcode::RcSendMiddle).unwrap();
        }
        true
    }));
    p.a.qp.post_send(&[SendWr::send(7, &[src.sge(0..3000)]).signaled()]).unwrap();
    p.run(RUN);
    assert_eq!(naks(&p, false), vec![(100, Syndrome::Nak(NakCode::InvalidRequest))]);
    assert_eq!(p.b.qp.state().unwrap(), QpState::Error);
    let wb = poll_all(&p.b.cq);
    assert_eq!(
        wb.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        vec![(1, WcStatus::WrFlushErr), (2, WcStatus::WrFlushErr)]
    );
    assert!(events(&p.b.ctx).iter().any(|e| e.event_type == AsyncEventType::QpReqErr));

    // First where Middle is expected: the second packet of a Send turned into a First.
    let mut p = Pair::new(QpType::Rc, Mtu::Mtu1024);
    let src = p.a.pd.alloc_mr(4096, Access::LOCAL_WRITE).unwrap();
    let dst = p.b.pd.alloc_mr(8192, Access::LOCAL_WRITE).unwrap();
    p.b.qp.post_recv(&[RecvWr::new(1, &[dst.sge(0..4096)]), RecvWr::new(2, &[dst.sge(4096..8192)])]).unwrap();
    p.filter = Some(Box::new(|from_a, d| {
        if from_a && Pkt::parse(d).opcode == Opcode::RcSendMiddle {
            rewrite(d, |r| r.packet.bth.opcode = Opcode::RcSendFirst).unwrap();
        }
        true
    }));
    p.a.qp.post_send(&[SendWr::send(7, &[src.sge(0..3000)]).signaled()]).unwrap();
    p.run(RUN);
    assert_eq!(
        naks(&p, false),
        vec![(101, Syndrome::Nak(NakCode::InvalidRequest))],
        "NAK carries the bad packet's PSN"
    );
    let wb = poll_all(&p.b.cq);
    assert_eq!(
        wb.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        vec![(1, WcStatus::RemInvReqErr), (2, WcStatus::WrFlushErr)]
    );
    assert_eq!(poll_all(&p.a.cq)[0].status, WcStatus::RemInvReqErr);
}

/// Length errors: a Send longer than the receive, a Write whose payload is not its RETH length,
/// a First shorter than the PMTU.
/// Rule ERR-RQ-11, ERR-RQ-12, ERR-RQ-13, PKT-LEN-1, PKT-LEN-2, PKT-LEN-3
#[test]
fn class_c_length_errors() {
    // Send longer than the scatter list.
    let mut p = Pair::new(QpType::Rc, Mtu::Mtu1024);
    let src = p.a.pd.alloc_mr(4096, Access::LOCAL_WRITE).unwrap();
    let dst = p.b.pd.alloc_mr(4096, all_access()).unwrap();
    p.b.qp.post_recv(&[RecvWr::new(1, &[dst.sge(0..100)])]).unwrap();
    p.a.qp.post_send(&[SendWr::send(7, &[src.sge(0..101)]).signaled()]).unwrap();
    p.run(RUN);
    assert_eq!(naks(&p, false), vec![(100, Syndrome::Nak(NakCode::InvalidRequest))]);
    assert_eq!(poll_all(&p.b.cq)[0].status, WcStatus::RemInvReqErr);

    // An RDMA Write Only whose RETH says one byte more than it carries.
    let mut p = Pair::new(QpType::Rc, Mtu::Mtu1024);
    let src = p.a.pd.alloc_mr(4096, Access::LOCAL_WRITE).unwrap();
    let dst = p.b.pd.alloc_mr(4096, all_access()).unwrap();
    p.filter = Some(Box::new(|from_a, d| {
        if from_a && Pkt::parse(d).opcode == Opcode::RcRdmaWriteOnly {
            rewrite(d, |r| r.packet.reth.as_mut().unwrap().dma_length += 1).unwrap();
        }
        true
    }));
    p.a.qp.post_send(&[SendWr::rdma_write(7, &[src.sge(0..64)], dst.addr(), dst.rkey()).signaled()]).unwrap();
    p.run(RUN);
    assert_eq!(naks(&p, false), vec![(100, Syndrome::Nak(NakCode::InvalidRequest))]);
    assert_eq!(dst.to_vec().unwrap(), vec![0; 4096], "not executed");

    // A Send First carrying less than a PMTU.
    let mut p = Pair::new(QpType::Rc, Mtu::Mtu1024);
    let src = p.a.pd.alloc_mr(4096, Access::LOCAL_WRITE).unwrap();
    let dst = p.b.pd.alloc_mr(4096, all_access()).unwrap();
    p.b.qp.post_recv(&[RecvWr::new(1, &[dst.sge(0..4096)])]).unwrap();
    p.filter = Some(Box::new(|from_a, d| {
        if from_a && Pkt::parse(d).opcode == Opcode::RcSendFirst {
            rewrite(d, |r| r.packet.payload = &[1, 2, 3, 4]).unwrap();
        }
        true
    }));
    p.a.qp.post_send(&[SendWr::send(7, &[src.sge(0..2000)]).signaled()]).unwrap();
    p.run(RUN);
    assert_eq!(naks(&p, false), vec![(100, Syndrome::Nak(NakCode::InvalidRequest))]);
    assert_eq!(poll_all(&p.b.cq)[0].status, WcStatus::RemInvReqErr);
}

/// A misaligned Atomic, and a reserved opcode in the RC range: Class C, Invalid Request.
/// Rule ERR-RQ-5, PKT-OP-3
#[test]
fn class_c_misaligned_atomic_and_reserved_opcode() {
    let mut p = Pair::new(QpType::Rc, Mtu::Mtu1024);
    let local = p.a.pd.alloc_mr(8, Access::LOCAL_WRITE).unwrap();
    let remote = p.b.pd.alloc_mr(64, all_access()).unwrap();
    remote.write(0, &[0xAA; 64]).unwrap();
    p.a.qp
        .post_send(&[SendWr::atomic_fetch_add(1, &[local.sge(0..8)], remote.addr() + 4, remote.rkey(), 1).signaled()])
        .unwrap();
    p.run(RUN);
    assert_eq!(naks(&p, false), vec![(100, Syndrome::Nak(NakCode::InvalidRequest))]);
    assert_eq!(remote.to_vec().unwrap(), vec![0xAA; 64]);
    assert_eq!(poll_all(&p.a.cq)[0].status, WcStatus::RemInvReqErr);

    let mut p = Pair::new(QpType::Rc, Mtu::Mtu1024);
    let src = p.a.pd.alloc_mr(8, Access::LOCAL_WRITE).unwrap();
    p.b.qp.post_recv(&[RecvWr::new(1, &[])]).unwrap();
    p.filter = Some(Box::new(|from_a, d| {
        if from_a {
            rewrite(d, |r| r.packet.bth.opcode = Opcode::from(0x15)).unwrap();
        }
        true
    }));
    p.a.qp.post_send(&[SendWr::send(1, &[src.sge(0..0)])]).unwrap();
    p.run(RUN);
    assert_eq!(naks(&p, false), vec![(100, Syndrome::Nak(NakCode::InvalidRequest))]);
    assert_eq!(p.b.qp.state().unwrap(), QpState::Error);
}

/// More RDMA Reads than the inbound depth at once: Invalid Request, not silence, and the
/// excess Read is not executed.
/// Rule ERR-RQ-6, WR-RQ-6
#[test]
fn class_c_too_many_reads() {
    let o = Opts { max_dest_rd_atomic: 1, max_rd_atomic: 4, ..Opts::default() };
    let mut p = Pair::with(QpType::Rc, Mtu::Mtu1024, o);
    let local = p.a.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    let remote = p.b.pd.alloc_mr(64, all_access()).unwrap();
    // Both reads reach the responder before it sends anything.
    p.a.qp
        .post_send(&[
            SendWr::rdma_read(1, &[local.sge(0..8)], remote.addr(), remote.rkey()).signaled(),
            SendWr::rdma_read(2, &[local.sge(8..16)], remote.addr(), remote.rkey()).signaled(),
        ])
        .unwrap();
    p.run(RUN);
    assert_eq!(naks(&p, false), vec![(101, Syndrome::Nak(NakCode::InvalidRequest))]);
    let wa = poll_all(&p.a.cq);
    assert_eq!(
        wa.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        vec![(1, WcStatus::Success), (2, WcStatus::RemInvReqErr)]
    );
}

/// A receive WQE the responder cannot use (its L_Key is bad): Class A. Remote Operational
/// Error NAK; the WQE completes with Local QP Operation Error, the rest of the RQ and the SQ
/// are flushed in order; the requester completes with Remote Operation Error.
/// Rule ERR-RQ-2, ERR-A-1, ERR-A-2, ERR-A-3, ERR-A-4, ERR-A-5, ERR-SQ-8, ERR-FLUSH-2
#[test]
fn class_a_malformed_receive() {
    let mut p = Pair::new(QpType::Rc, Mtu::Mtu1024);
    let src = p.a.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    let dst = p.b.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    let bad = Sge { lkey: dst.lkey() ^ 0x40, ..dst.sge(0..64) };
    p.b.qp.post_recv(&[RecvWr::new(1, &[bad]), RecvWr::new(2, &[dst.sge(0..64)])]).unwrap();
    let bsrc = p.b.pd.alloc_mr(8, Access::LOCAL_WRITE).unwrap();
    p.b.qp.modify(&QpAttr::to_sqd()).unwrap(); // hold a send on b's SQ
    p.b.qp.post_send(&[SendWr::send(3, &[bsrc.sge(0..8)])]).unwrap();
    p.a.qp.post_send(&[SendWr::send(7, &[src.sge(0..64)]).signaled()]).unwrap();
    p.run(RUN);
    assert_eq!(naks(&p, false), vec![(100, Syndrome::Nak(NakCode::RemoteOperationalError))]);
    assert_eq!(p.b.qp.state().unwrap(), QpState::Error);
    let wb = poll_all(&p.b.cq);
    let got: Vec<(u64, WcStatus)> = wb.iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(got[0], (1, WcStatus::LocQpOpErr), "{got:?}");
    assert!(got.contains(&(2, WcStatus::WrFlushErr)) && got.contains(&(3, WcStatus::WrFlushErr)));
    assert_eq!(poll_all(&p.a.cq)[0].status, WcStatus::RemOpErr);
    assert_eq!(p.a.qp.state().unwrap(), QpState::Error);
}

/// Class G: the message is executed and ACKed but its CQE does not fit the CQ: the responder
/// moves to Error with no CQE at all and a CQ Error event; the requester succeeds.
/// Rule ERR-RQ-15, ERR-G-1, ERR-G-2, ERR-G-3, ERR-G-4, ERR-G-5, CQ-OVF-1, CQ-OVF-2, QPT-AUTO-6
#[test]
fn class_g_cq_overflow() {
    let o = Opts { cq_size: 1, ..Opts::default() };
    let mut p = Pair::with(QpType::Rc, Mtu::Mtu1024, o);
    let src = p.a.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    let dst = p.b.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    p.b.qp
        .post_recv(&[RecvWr::new(1, &[dst.sge(0..32)]), RecvWr::new(2, &[dst.sge(32..64)]), RecvWr::new(3, &[])])
        .unwrap();
    p.a.qp.post_send(&[SendWr::send(7, &[src.sge(0..8)])]).unwrap();
    p.run(RUN);
    p.a.qp.post_send(&[SendWr::send(8, &[src.sge(0..8)]).signaled()]).unwrap();
    p.run(RUN);
    assert_eq!(poll_all(&p.a.cq).iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(), vec![(8, WcStatus::Success)]);
    assert_eq!(p.b.qp.state().unwrap(), QpState::Error);
    let wb = poll_all(&p.b.cq);
    assert_eq!(wb.iter().map(|w| w.wr_id).collect::<Vec<_>>(), vec![1], "no CQE for 2, no flush for 3");
    let ev = events(&p.b.ctx);
    assert!(ev.iter().any(|e| e.event_type == AsyncEventType::CqErr), "{ev:?}");
    assert!(naks(&p, false).is_empty());
}

/// Class D: header violations are dropped silently — no ACK or NAK, no state or ePSN change —
/// and counted.
/// Rule ERR-RQ-10, ERR-D-1, ERR-D-2, ERR-D-3, ERR-D-4, PKT-VAL-1, PKT-VAL-2, PKT-VAL-3, PKT-VAL-4,
/// PKT-VAL-7, PKT-VAL-9, PKT-VAL-11, PKT-OP-2, PKT-HDR-3, PKT-ROCE-10
#[test]
fn class_d_header_violations() {
    let mut p = Pair::new(QpType::Rc, Mtu::Mtu1024);
    let src = p.a.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    let dst = p.b.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    p.b.qp.post_recv(&[RecvWr::new(1, &[dst.sge(0..64)])]).unwrap();
    // Capture one good request without delivering it.
    p.filter = Some(Box::new(|from_a, _| !from_a));
    p.a.qp.post_send(&[SendWr::send(7, &[src.sge(0..16)]).signaled()]).unwrap();
    p.run(1);
    let good = p.trace.iter().find(|(a, _)| *a).unwrap().1.clone();
    p.filter = None;
    let bqpn = p.b.qp.qp_num();
    let mut variants: Vec<Vec<u8>> = Vec::new();
    let mut v = good.clone();
    let last = v.len() - 1;
    v[last] ^= 1; // bad ICRC
    variants.push(v);
    for edit in [
        (|r: &mut softhca::wire::RoceRepr<'_>| r.packet.bth.tver = 1) as fn(&mut softhca::wire::RoceRepr<'_>),
        // A QPN with the low bits of B's QP: its slot in the QP table, not its number.
        |r| r.packet.bth.dest_qp ^= 0x1000,
        |r| r.packet.bth.p_key = 0x9234,
        |r| r.packet.bth.p_key = 0x8000,
        |r| r.packet.bth.opcode = Opcode::UcSendOnly,
        |r| {
            if let softhca::wire::IpRepr::V4(ip) = &mut r.ip {
                ip.src = [127, 1, 0, 9].into();
            }
        },
    ] {
        let mut v = good.clone();
        rewrite(&mut v, edit).unwrap();
        variants.push(v);
    }
    variants.push(good[..good.len() - 6].to_vec()); // truncated
    let before = p.b.ctx.counters();
    for v in &variants {
        p.inject(false, v);
    }
    let after = p.b.ctx.counters();
    assert_eq!(after.rx_dropped - before.rx_dropped, variants.len() as u64);
    assert_eq!(after.rx_bad_icrc - before.rx_bad_icrc, 1);
    assert_eq!(after.pkey_violations - before.pkey_violations, 2);
    let mut buf = vec![0u8; softhca::transport::MAX_DATAGRAM];
    assert_eq!(p.b.ctx.transmit(p.now, &mut buf), None, "no ACK or NAK for a Class D drop");
    assert!(p.b.cq.is_empty().unwrap());
    assert_eq!(p.b.qp.state().unwrap(), QpState::Rts);
    let _ = bqpn;
    // The good packet is still expected (ePSN unchanged).
    p.inject(false, &good);
    p.run(RUN);
    assert_eq!(poll_all(&p.b.cq).len(), 1);
}

/// A Class D drop in the middle of a message: the message continues with the packet that
/// carries ePSN, without a new First and without resetting the receive in use.
/// Rule ERR-D-5
#[test]
fn class_d_mid_message_then_continue() {
    let mut p = Pair::new(QpType::Rc, Mtu::Mtu1024);
    let src = p.a.pd.reg_mr((0..4096u32).map(|i| (i * 7) as u8).collect(), Access::LOCAL_WRITE).unwrap();
    let dst = p.b.pd.alloc_mr(4096, Access::LOCAL_WRITE).unwrap();
    p.b.qp.post_recv(&[RecvWr::new(1, &[dst.sge(0..4096)])]).unwrap();
    let mut spoiled = false;
    p.filter = Some(Box::new(move |from_a, d| {
        let k = Pkt::parse(d);
        if from_a && k.opcode == Opcode::RcSendMiddle && !spoiled {
            spoiled = true;
            let n = d.len();
            d[n - 1] ^= 0xFF; // bad ICRC: Class D at the responder
        }
        true
    }));
    p.a.qp.post_send(&[SendWr::send(7, &[src.sge(0..4096)]).signaled()]).unwrap();
    p.run(RUN);
    assert_eq!(poll_all(&p.a.cq)[0].status, WcStatus::Success);
    let wb = poll_all(&p.b.cq);
    assert_eq!((wb.len(), wb[0].status, wb[0].byte_len), (1, WcStatus::Success, 4096));
    assert_eq!(dst.to_vec().unwrap(), src.to_vec().unwrap());
}

/// A link that verified the ICRC itself hands the datagram over with `receive_icrc_checked`:
/// only the CRC is skipped, every header check still applies.
/// Rule PKT-VAL-2
#[test]
fn receive_icrc_checked_skips_only_the_crc() {
    let mut p = Pair::new(QpType::Rc, Mtu::Mtu1024);
    p.b.qp.post_recv(&[RecvWr::new(1, &[])]).unwrap();
    p.filter = Some(Box::new(|from_a, _| !from_a));
    p.a.qp.post_send(&[SendWr::send(7, &[]).signaled()]).unwrap();
    p.run(1);
    let mut d = p.trace.iter().find(|(a, _)| *a).unwrap().1.clone();
    let n = d.len();
    d[n - 1] ^= 1;
    p.b.ctx.receive(0, &d);
    assert_eq!(p.b.ctx.counters().rx_bad_icrc, 1);
    let mut wrong_qp = d.clone();
    rewrite(&mut wrong_qp, |r| r.packet.bth.dest_qp ^= 0x1000).unwrap();
    p.b.ctx.receive_icrc_checked(0, &wrong_qp);
    assert_eq!(p.b.ctx.counters().rx_dropped, 2);
    p.b.ctx.receive_icrc_checked(0, &d);
    assert_eq!(poll_all(&p.b.cq).len(), 1);
}

/// The responder's checks run in order — PSN, opcode sequence, operation enabled, resources,
/// lengths, R_Key — and the first failure decides: each case fails two checks and must be
/// answered for the earlier one.
/// Rule PKT-VAL-12
#[test]
fn responder_check_order() {
    // PSN before R_Key: an out-of-sequence Write with a bad R_Key gets a sequence NAK.
    let mut p = Pair::new(QpType::Rc, Mtu::Mtu1024);
    let src = p.a.pd.alloc_mr(4096, Access::LOCAL_WRITE).unwrap();
    let dst = p.b.pd.alloc_mr(4096, all_access()).unwrap();
    p.filter = Some(Box::new(|from_a, d| {
        if from_a {
            rewrite(d, |r| r.packet.bth.psn = r.packet.bth.psn.add(5)).unwrap();
        }
        true
    }));
    p.a.qp.post_send(&[SendWr::rdma_write(1, &[src.sge(0..8)], dst.addr(), dst.rkey() ^ 0x100)]).unwrap();
    p.run(10_000);
    assert_eq!(naks(&p, false), vec![(100, Syndrome::Nak(NakCode::PsnSeqErr))]);

    // Enabled before resources: a Write with Immediate to a QP without Write enabled and no
    // receive posted is Invalid Request, not RNR.
    let o = Opts { access: all_access() - Access::REMOTE_WRITE, ..Opts::default() };
    let mut p = Pair::with(QpType::Rc, Mtu::Mtu1024, o);
    let src = p.a.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    p.a.qp.post_send(&[SendWr::rdma_write(1, &[src.sge(0..8)], 0x1000, 1).imm(1)]).unwrap();
    p.run(10_000);
    assert_eq!(naks(&p, false), vec![(100, Syndrome::Nak(NakCode::InvalidRequest))]);

    // Resources before lengths: a too-short Send First with no receive posted is RNR.
    let mut p = Pair::new(QpType::Rc, Mtu::Mtu1024);
    let src = p.a.pd.alloc_mr(4096, Access::LOCAL_WRITE).unwrap();
    p.filter = Some(Box::new(|from_a, d| {
        if from_a && Pkt::parse(d).opcode == Opcode::RcSendFirst {
            rewrite(d, |r| r.packet.payload = &[0; 8]).unwrap();
        }
        true
    }));
    p.a.qp.post_send(&[SendWr::send(1, &[src.sge(0..3000)])]).unwrap();
    p.run(10_000);
    assert!(matches!(naks(&p, false)[0].1, Syndrome::RnrNak { .. }));

    // Lengths before R_Key: a Write Only whose RETH length is wrong and whose R_Key is bad is
    // Invalid Request, not Remote Access Error.
    let mut p = Pair::new(QpType::Rc, Mtu::Mtu1024);
    let src = p.a.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    p.filter = Some(Box::new(|from_a, d| {
        if from_a {
            rewrite(d, |r| r.packet.reth.as_mut().unwrap().dma_length += 4).unwrap();
        }
        true
    }));
    p.a.qp.post_send(&[SendWr::rdma_write(1, &[src.sge(0..8)], 0x1000, 0xdead)]).unwrap();
    p.run(10_000);
    assert_eq!(naks(&p, false), vec![(100, Syndrome::Nak(NakCode::InvalidRequest))]);
}
