//! RC reliability: ACK timeouts and the Retry Count, duplicates at the responder, implied NAKs,
//! ACK coalescing, MSN and credits.

mod common;

use common::pair::*;
use common::poll_all;
use softhca::wire::{NakCode, Opcode, Syndrome};
use softhca::*;

const RUN: u64 = 10_000_000_000;

fn all_access() -> Access {
    Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC
}

fn statuses(cq: &Cq) -> Vec<(u64, WcStatus)> {
    poll_all(cq).iter().map(|w| (w.wr_id, w.status)).collect()
}

/// With every response lost, the requester retransmits exactly Retry Count times, each after
/// 4.096 µs × 2^timeout, then completes the oldest WQE with Transport Retry Counter Exceeded
/// and moves to Error. 7 is an ordinary count. Each retransmission after a timeout is the
/// probe: the oldest unacknowledged packet alone, the rest waiting for an answer.
/// Rule PKT-RTY-1, PKT-RTY-2, PKT-RTY-3, PKT-RTY-4, PKT-RTY-7, ERR-SQ-10, QPT-AUTO-3
#[test]
fn retry_count_exhausted_by_timeouts() {
    for retry in [0u8, 1, 7] {
        let o = Opts { retry_cnt: retry, timeout: 12, ..Opts::default() };
        let mut p = Pair::with(QpType::Rc, Mtu::Mtu1024, o);
        let src = p.a.pd.alloc_mr(2048, Access::LOCAL_WRITE).unwrap();
        let dst = p.b.pd.alloc_mr(2048, all_access()).unwrap();
        p.filter = Some(Box::new(|from_a, _| from_a)); // every response lost
        p.a.qp
            .post_send(&[
                SendWr::rdma_write(1, &[src.sge(0..2048)], dst.addr(), dst.rkey()).signaled(),
                SendWr::rdma_write(2, &[src.sge(0..8)], dst.addr(), dst.rkey()),
            ])
            .unwrap();
        p.run(1);
        let t0 = p.now;
        assert_eq!(p.a.ctx.poll_timeout(), Some(t0 + 4096 * (1 << 12)), "timer = 4.096 µs × 2^12");
        p.run(RUN);
        let firsts = p.sent_by(true).iter().filter(|k| k.opcode == Opcode::RcRdmaWriteFirst).count();
        assert_eq!(firsts, 1 + retry as usize, "retry_cnt {retry}: original plus {retry} retransmissions");
        assert_eq!(p.now - t0, (1 + retry as u64) * 4096 * (1 << 12));
        assert_eq!(statuses(&p.a.cq), vec![(1, WcStatus::RetryExcErr), (2, WcStatus::WrFlushErr)]);
        assert_eq!(p.a.qp.state().unwrap(), QpState::Error);
        assert_eq!(p.a.ctx.counters().timeouts, 1 + retry as u64);
        let qc = p.a.qp.counters();
        assert_eq!((qc.timeouts, qc.retransmits, qc.tx_packets), (1 + retry as u64, retry as u64, 3 + retry as u64));
        assert_eq!(p.b.qp.counters().rx_packets, 3 + retry as u64);
    }
}

/// A Local ACK Timeout of 0 disables the timer: nothing is ever retransmitted.
/// Rule PKT-RTY-2
#[test]
fn timeout_zero_is_infinite() {
    let o = Opts { timeout: 0, ..Opts::default() };
    let mut p = Pair::with(QpType::Rc, Mtu::Mtu1024, o);
    let src = p.a.pd.alloc_mr(8, Access::LOCAL_WRITE).unwrap();
    let dst = p.b.pd.alloc_mr(8, all_access()).unwrap();
    p.filter = Some(Box::new(|from_a, _| from_a));
    p.a.qp.post_send(&[SendWr::rdma_write(1, &[src.sge(0..8)], dst.addr(), dst.rkey()).signaled()]).unwrap();
    p.run(RUN);
    assert_eq!(p.a.ctx.poll_timeout(), None);
    assert_eq!(p.sent_by(true).len(), 1);
    assert_eq!(p.a.qp.state().unwrap(), QpState::Rts);
}

/// Progress reloads the Retry Count: with a count of 1, losing one response per message many
/// times over still succeeds.
/// Rule PKT-RTY-5, PKT-RNR-8
#[test]
fn progress_reloads_the_retry_counter() {
    let o = Opts { retry_cnt: 1, ..Opts::default() };
    let mut p = Pair::with(QpType::Rc, Mtu::Mtu1024, o);
    let src = p.a.pd.alloc_mr(8, Access::LOCAL_WRITE).unwrap();
    let dst = p.b.pd.alloc_mr(8, all_access()).unwrap();
    let mut n = 0;
    p.filter = Some(Box::new(move |from_a, _| {
        if from_a {
            return true;
        }
        n += 1;
        n % 2 == 0 // lose every other ACK
    }));
    for i in 0..10 {
        p.a.qp.post_send(&[SendWr::rdma_write(i, &[src.sge(0..8)], dst.addr(), dst.rkey()).signaled()]).unwrap();
        p.run(RUN);
    }
    let s = statuses(&p.a.cq);
    assert_eq!(s.len(), 10);
    assert!(s.iter().all(|(_, st)| *st == WcStatus::Success), "{s:?}");
    assert!(p.a.ctx.counters().timeouts >= 5);
}

/// Duplicates are not executed again: a duplicate Send is re-ACKed with ePSN − 1 and consumes
/// no receive; a duplicate Read is answered again from its PSN; a duplicate Atomic returns
/// its saved result without executing; ePSN and the state never move.
/// Rule PKT-DUP-1, PKT-DUP-2, PKT-DUP-4, PKT-DUP-5, PKT-DUP-6, PKT-PSN-4
#[test]
fn duplicates_are_answered_not_executed() {
    let mut p = Pair::new(QpType::Rc, Mtu::Mtu1024);
    let remote = p.b.pd.reg_mr((0..4096u32).map(|i| (i / 3) as u8).collect(), all_access()).unwrap();
    let word = p.b.pd.alloc_mr(8, all_access()).unwrap();
    word.write(0, &5u64.to_ne_bytes()).unwrap();
    let land = p.a.pd.alloc_mr(4096, Access::LOCAL_WRITE).unwrap();
    p.b.qp.post_recv(&[RecvWr::new(1, &[remote.sge(0..0)]), RecvWr::new(2, &[])]).unwrap();
    p.a.qp
        .post_send(&[
            SendWr::send(10, &[]).signaled(),
            SendWr::rdma_read(11, &[land.sge(0..3000)], remote.addr(), remote.rkey()).signaled(),
            SendWr::atomic_fetch_add(12, &[land.sge(3000..3008)], word.addr(), word.rkey(), 10).signaled(),
        ])
        .unwrap();
    p.run(RUN);
    assert_eq!(statuses(&p.a.cq).len(), 3);
    assert_eq!(poll_all(&p.b.cq).len(), 1);
    let requests: Vec<Vec<u8>> = p.trace.iter().filter(|(a, _)| *a).map(|(_, d)| d.clone()).collect();
    assert_eq!(requests.len(), 3);
    let epsn_before = p.b.qp.debug_transport();
    p.clear_trace();
    // Replay each request, the Read from its second response packet on.
    let mut read_tail = requests[1].clone();
    softhca::link::sim::rewrite(&mut read_tail, |r| {
        r.packet.bth.psn = r.packet.bth.psn.add(1);
        let reth = r.packet.reth.as_mut().unwrap();
        reth.va += 1024;
        reth.dma_length -= 1024;
    })
    .unwrap();
    for d in [&requests[0], &requests[1], &read_tail, &requests[2]] {
        p.inject(false, d);
    }
    let mut buf = vec![0u8; softhca::transport::MAX_DATAGRAM];
    let mut out = Vec::new();
    while let Some(n) = p.b.ctx.transmit(p.now, &mut buf) {
        out.push(Pkt::parse(&buf[..n]));
    }
    let got: Vec<(Opcode, u32)> = out.iter().map(|k| (k.opcode, k.psn)).collect();
    assert_eq!(
        got,
        vec![
            (Opcode::RcAcknowledge, 104), // ePSN − 1: the atomic at 104 was the last new request
            (Opcode::RcRdmaReadResponseFirst, 101),
            (Opcode::RcRdmaReadResponseMiddle, 102),
            (Opcode::RcRdmaReadResponseLast, 103),
            (Opcode::RcRdmaReadResponseMiddle, 102),
            (Opcode::RcRdmaReadResponseLast, 103),
            (Opcode::RcAtomicAcknowledge, 104),
        ]
    );
    let mut w = [0; 8];
    word.read(0, &mut w).unwrap();
    assert_eq!(u64::from_ne_bytes(w), 15, "the atomic ran once");
    assert!(p.b.cq.is_empty().unwrap(), "no receive consumed");
    assert_eq!(p.b.qp.debug_transport(), epsn_before);
    assert_eq!(p.b.qp.state().unwrap(), QpState::Rts);
}

/// A duplicate Send packet that does not ask for an ACK still gets one, carrying ePSN − 1:
/// here the First packet of a two-packet Send, replayed once the Send is done.
/// Rule PKT-DUP-1
#[test]
fn a_duplicate_without_ackreq_is_acknowledged() {
    let mut p = Pair::new(QpType::Rc, Mtu::Mtu1024);
    let src = p.a.pd.alloc_mr(2048, Access::LOCAL_WRITE).unwrap();
    let dst = p.b.pd.alloc_mr(2048, Access::LOCAL_WRITE).unwrap();
    p.b.qp.post_recv(&[RecvWr::new(1, &[dst.sge(0..2048)])]).unwrap();
    p.a.qp.post_send(&[SendWr::send(10, &[src.sge(0..2048)]).signaled()]).unwrap();
    p.run(RUN);
    assert_eq!(statuses(&p.a.cq), vec![(10, WcStatus::Success)]);
    let first = p.trace.iter().find(|(a, d)| *a && Pkt::parse(d).opcode == Opcode::RcSendFirst).unwrap().1.clone();
    assert!(!Pkt::parse(&first).ack_req);
    p.clear_trace();
    p.inject(false, &first);
    p.run(RUN);
    let answers: Vec<(Opcode, u32)> = p.sent_by(false).iter().map(|k| (k.opcode, k.psn)).collect();
    assert_eq!(answers, vec![(Opcode::RcAcknowledge, 101)]);
    assert_eq!(poll_all(&p.b.cq).len(), 1, "the Send's one receive");
}

/// The saved results of the inbound-depth most recent Atomics outlive later Reads: with both
/// depths 1, a Fetch & Add and then a Read, the Atomic's duplicate still gets its original
/// value (and does not run again). Before, the Read's resource took the Atomic's slot.
/// Rule PKT-DUP-4, PKT-DUP-5
#[test]
fn an_atomic_result_outlives_a_later_read() {
    let o = Opts { max_rd_atomic: 1, max_dest_rd_atomic: 1, ..Opts::default() };
    let mut p = Pair::with(QpType::Rc, Mtu::Mtu1024, o);
    let remote = p.b.pd.alloc_mr(64, all_access()).unwrap();
    remote.write(0, &5u64.to_ne_bytes()).unwrap();
    let land = p.a.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    p.a.qp
        .post_send(&[
            SendWr::atomic_fetch_add(1, &[land.sge(0..8)], remote.addr(), remote.rkey(), 10).signaled(),
            SendWr::rdma_read(2, &[land.sge(8..16)], remote.addr() + 8, remote.rkey()).signaled(),
        ])
        .unwrap();
    p.run(RUN);
    assert_eq!(statuses(&p.a.cq), vec![(1, WcStatus::Success), (2, WcStatus::Success)]);
    let atomic = p.trace.iter().find(|(a, d)| *a && Pkt::parse(d).opcode == Opcode::RcFetchAdd).unwrap().1.clone();
    p.clear_trace();
    p.inject(false, &atomic);
    p.run(RUN);
    let answers: Vec<(Opcode, u32)> = p.sent_by(false).iter().map(|k| (k.opcode, k.psn)).collect();
    assert_eq!(answers, vec![(Opcode::RcAtomicAcknowledge, 100)]);
    let ack = &p.trace.iter().find(|(a, _)| !*a).unwrap().1;
    let orig = &ack[ack.len() - 4 - 8..ack.len() - 4]; // AtomicAckETH, before the ICRC
    assert_eq!(u64::from_be_bytes(orig.try_into().unwrap()), 5, "the saved original value");
    let mut w = [0; 8];
    remote.read(0, &mut w).unwrap();
    assert_eq!(u64::from_ne_bytes(w), 15, "the atomic ran once");
}

/// A duplicate Atomic whose PSN has no saved result, and a duplicate Read matching no earlier
/// Read, are dropped silently (Class D).
/// Rule ERR-RQ-14, PKT-DUP-3
#[test]
fn invalid_duplicates_are_dropped() {
    let mut p = Pair::new(QpType::Rc, Mtu::Mtu1024);
    let local = p.a.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    let remote = p.b.pd.alloc_mr(4096, all_access()).unwrap();
    p.a.qp
        .post_send(&[
            SendWr::atomic_fetch_add(1, &[local.sge(0..8)], remote.addr(), remote.rkey(), 1).signaled(),
            SendWr::rdma_read(2, &[local.sge(8..64)], remote.addr(), remote.rkey()).signaled(),
        ])
        .unwrap();
    p.run(RUN);
    assert_eq!(statuses(&p.a.cq).len(), 2);
    let reqs: Vec<Vec<u8>> = p.trace.iter().filter(|(a, _)| *a).map(|(_, d)| d.clone()).collect();
    // The atomic replayed under the read's PSN, and the read with another R_Key.
    let mut fake_atomic = reqs[0].clone();
    softhca::link::sim::rewrite(&mut fake_atomic, |r| r.packet.bth.psn = r.packet.bth.psn.add(1)).unwrap();
    let mut other_read = reqs[1].clone();
    softhca::link::sim::rewrite(&mut other_read, |r| r.packet.reth.as_mut().unwrap().r_key ^= 0x100).unwrap();
    let dropped = p.b.ctx.counters().rx_dropped;
    p.inject(false, &fake_atomic);
    p.inject(false, &other_read);
    let mut buf = vec![0u8; softhca::transport::MAX_DATAGRAM];
    assert_eq!(p.b.ctx.transmit(p.now, &mut buf), None);
    assert_eq!(p.b.qp.state().unwrap(), QpState::Rts);
    let _ = dropped;
}

/// A peer repeating a Read request cannot grow the responder's queue: while the inbound
/// depth's worth of Read responses is queued, a further duplicate is dropped (Class D), so
/// what goes out is bounded by the depth (16 here), not by the 1,000 duplicates.
/// Rule PKT-DUP-3, ERR-RQ-6
#[test]
fn repeated_duplicate_reads_are_bounded_by_the_inbound_depth() {
    let mut p = Pair::new(QpType::Rc, Mtu::Mtu1024);
    let remote = p.b.pd.reg_mr((0..3000u32).map(|i| i as u8).collect(), all_access()).unwrap();
    let land = p.a.pd.alloc_mr(3000, Access::LOCAL_WRITE).unwrap();
    p.a.qp.post_send(&[SendWr::rdma_read(1, &[land.sge(0..3000)], remote.addr(), remote.rkey()).signaled()]).unwrap();
    p.run(RUN);
    assert_eq!(statuses(&p.a.cq), vec![(1, WcStatus::Success)]);
    let read = p.trace.iter().find(|(a, _)| *a).map(|(_, d)| d.clone()).unwrap();
    for _ in 0..1000 {
        p.inject(false, &read);
    }
    let mut buf = vec![0u8; softhca::transport::MAX_DATAGRAM];
    let mut responses = 0;
    while let Some(n) = p.b.ctx.transmit(p.now, &mut buf) {
        assert!(Pkt::parse(&buf[..n]).opcode.name().contains("READ_RESPONSE"));
        responses += 1;
    }
    assert_eq!(responses, 16 * 3, "16 replays of 3 responses each");
    assert_eq!(p.b.qp.state().unwrap(), QpState::Rts);
}

/// A responder moved to Error right after it executed a Send, before it transmitted the ACK:
/// the ACK still leaves, so the requester's Send, which the responder's application has seen
/// arrive, completes with Success instead of being retried into a flush or an error (a
/// disconnect right after the last receive completion does this). Requests arriving after the
/// move get no answer.
/// Rule PKT-ACK-13, QPS-ERR-2
#[test]
fn acks_owed_at_a_move_to_error_still_leave() {
    let mut p = Pair::new(QpType::Rc, Mtu::Mtu1024);
    let src = p.a.pd.reg_mr(vec![7u8; 64], Access::LOCAL_WRITE).unwrap();
    let land = p.b.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    p.b.qp.post_recv(&[RecvWr::new(1, &[land.sge(0..64)])]).unwrap();
    p.a.qp
        .post_send(&[SendWr::send(10, &[src.sge(0..64)]).signaled(), SendWr::send(11, &[src.sge(0..64)]).signaled()])
        .unwrap();
    let mut buf = vec![0u8; softhca::transport::MAX_DATAGRAM];
    let n = p.a.ctx.transmit(p.now, &mut buf).expect("the first Send");
    p.inject(false, &buf[..n]);
    assert_eq!(statuses(&p.b.cq), vec![(1, WcStatus::Success)], "b's application saw it arrive");
    p.b.qp.modify(&QpAttr::to_error()).unwrap();
    p.run(RUN);
    let a = statuses(&p.a.cq);
    assert_eq!(a[0], (10, WcStatus::Success), "{a:?}");
    // The second Send reached a QP in Error: never acknowledged, it fails after its retries.
    assert_eq!(a[1], (11, WcStatus::RetryExcErr), "{a:?}");
}

/// A move to Reset forgets the channel: a Send left unacknowledged (its ACK lost) arms the ACK
/// timer, and once the QP is reset that timer finds nothing to time out, now or later.
/// Rule QPS-RESET-5, PKT-RTY-1
#[test]
fn reset_forgets_the_ack_timer() {
    let mut p = Pair::new(QpType::Rc, Mtu::Mtu1024);
    let src = p.a.pd.reg_mr(vec![7u8; 64], Access::LOCAL_WRITE).unwrap();
    p.a.qp.post_send(&[SendWr::send(10, &[src.sge(0..64)]).signaled()]).unwrap();
    let mut buf = vec![0u8; softhca::transport::MAX_DATAGRAM];
    assert!(p.a.ctx.transmit(p.now, &mut buf).is_some(), "the Send left, and was lost");
    assert!(p.a.ctx.poll_timeout().is_some(), "its ACK timer runs");
    p.a.qp.modify(&QpAttr::to_reset()).unwrap();
    let before = p.a.ctx.counters();
    p.run(RUN);
    let c = p.a.ctx.counters();
    assert_eq!((c.timeouts, c.retransmits), (before.timeouts, before.retransmits));
    assert!(p.a.cq.is_empty().unwrap());
}

/// A lost Read response is an implied NAK when a later response arrives: the Read is asked
/// again for its remaining part only, from the first missing PSN with VA and length moved on.
/// Rule PKT-ACK-7, PKT-RTY-6, PKT-ACK-6, PKT-PSN-7, PKT-LEN-7, PKT-ACK-10
#[test]
fn implied_nak_rerequests_the_rest_of_a_read() {
    let mut p = Pair::new(QpType::Rc, Mtu::Mtu1024);
    let remote = p.b.pd.reg_mr((0..5000u32).map(|i| (i % 251) as u8).collect(), all_access()).unwrap();
    let land = p.a.pd.alloc_mr(5000, Access::LOCAL_WRITE).unwrap();
    let mut lost = false;
    p.filter = Some(Box::new(move |from_a, d| {
        let k = Pkt::parse(d);
        if !from_a && k.psn == 102 && !lost {
            lost = true; // the third response packet
            return false;
        }
        true
    }));
    p.a.qp.post_send(&[SendWr::rdma_read(1, &[land.sge(0..5000)], remote.addr(), remote.rkey()).signaled()]).unwrap();
    p.run(RUN);
    assert_eq!(statuses(&p.a.cq), vec![(1, WcStatus::Success)]);
    assert_eq!(land.to_vec().unwrap(), remote.to_vec().unwrap());
    let reqs: Vec<(u32, u64, u32)> = p
        .trace
        .iter()
        .filter(|(a, _)| *a)
        .map(|(_, d)| {
            let r = softhca::wire::roce::parse_ip(d).unwrap().packet;
            let reth = r.reth.unwrap();
            (r.bth.psn.value(), reth.va - remote.addr(), reth.dma_length)
        })
        .collect();
    assert_eq!(reqs, vec![(100, 0, 5000), (102, 2048, 2952)]);
    let resp: Vec<(Opcode, u32, usize, bool)> =
        p.sent_by(false).iter().map(|k| (k.opcode, k.psn, k.payload_len, k.syndrome.is_some())).collect();
    assert_eq!(
        resp[..5],
        [
            (Opcode::RcRdmaReadResponseFirst, 100, 1024, true),
            (Opcode::RcRdmaReadResponseMiddle, 101, 1024, false),
            (Opcode::RcRdmaReadResponseMiddle, 102, 1024, false),
            (Opcode::RcRdmaReadResponseMiddle, 103, 1024, false),
            (Opcode::RcRdmaReadResponseLast, 104, 904, true),
        ]
    );
    assert_eq!(p.a.ctx.counters().implied_naks, 1);
}

/// AckReq is set on the last packet of Sends and Writes; the responder ACKs it promptly, one
/// ACK may cover several requests, MSN counts messages from 0, and the credit count is the
/// largest code not above the receives posted and not in use.
/// Rule PKT-ACK-2, PKT-ACK-3, PKT-ACK-4, PKT-ACK-9, PKT-ACK-11, PKT-ACK-13, PKT-ACK-14, PKT-ACK-15,
/// PKT-PSN-2, PKT-PSN-3, PKT-LEN-4
#[test]
fn ackreq_coalescing_msn_and_credits() {
    let mut p = Pair::new(QpType::Rc, Mtu::Mtu1024);
    let src = p.a.pd.alloc_mr(3000, Access::LOCAL_WRITE).unwrap();
    let dst = p.b.pd.alloc_mr(3000, all_access()).unwrap();
    let recvs: Vec<RecvWr> = (0..7).map(|i| RecvWr::new(i, &[])).collect();
    p.b.qp.post_recv(&recvs).unwrap();
    p.a.qp
        .post_send(&[
            SendWr::rdma_write(1, &[src.sge(0..3000)], dst.addr(), dst.rkey()),
            SendWr::send(2, &[]),
            SendWr::send(3, &[]).signaled(),
        ])
        .unwrap();
    p.run(RUN);
    let reqs: Vec<(Opcode, u32, bool)> = p.sent_by(true).iter().map(|k| (k.opcode, k.psn, k.ack_req)).collect();
    assert_eq!(
        reqs,
        vec![
            (Opcode::RcRdmaWriteFirst, 100, false),
            (Opcode::RcRdmaWriteMiddle, 101, false),
            (Opcode::RcRdmaWriteLast, 102, true),
            (Opcode::RcSendOnly, 103, true),
            (Opcode::RcSendOnly, 104, true),
        ]
    );
    // All five requests reached the responder before it transmitted: one ACK covers them.
    let acks = p.sent_by(false);
    assert_eq!(acks.len(), 1);
    assert_eq!(acks[0].psn, 104);
    assert_eq!(acks[0].msn, Some(3), "three messages");
    // 7 receives posted, 2 used: 5 left. Code 4 means 4 credits, code 5 six: the largest code
    // not above 5 credits is 4.
    assert_eq!(acks[0].syndrome, Some(Syndrome::Ack { credit_code: 4 }));
    assert_eq!(statuses(&p.a.cq), vec![(3, WcStatus::Success)]);
}

/// A partly sent Send that loses its last packet: the requester retransmits only from the
/// NAKed PSN, with the same opcode and payload (PKT-RTY-6), and the receiver assembles the
/// message once.
/// Rule PKT-RTY-6, PKT-NAK-1
#[test]
fn go_back_n_resends_the_same_packets() {
    let mut p = Pair::new(QpType::Rc, Mtu::Mtu1024);
    let src = p.a.pd.reg_mr((0..4000u32).map(|i| (i * 13) as u8).collect(), Access::LOCAL_WRITE).unwrap();
    let dst = p.b.pd.alloc_mr(4000, Access::LOCAL_WRITE).unwrap();
    p.b.qp.post_recv(&[RecvWr::new(1, &[dst.sge(0..4000)])]).unwrap();
    let mut lost = false;
    p.filter = Some(Box::new(move |from_a, d| {
        if from_a && Pkt::parse(d).psn == 101 && !lost {
            lost = true;
            return false;
        }
        true
    }));
    p.a.qp.post_send(&[SendWr::send(1, &[src.sge(0..4000)]).signaled()]).unwrap();
    p.run(RUN);
    let sent: Vec<(Opcode, u32, usize)> = p.sent_by(true).iter().map(|k| (k.opcode, k.psn, k.payload_len)).collect();
    assert_eq!(
        sent,
        vec![
            (Opcode::RcSendFirst, 100, 1024),
            (Opcode::RcSendMiddle, 101, 1024),
            (Opcode::RcSendMiddle, 102, 1024),
            (Opcode::RcSendLast, 103, 928),
            (Opcode::RcSendMiddle, 101, 1024),
            (Opcode::RcSendMiddle, 102, 1024),
            (Opcode::RcSendLast, 103, 928),
        ]
    );
    assert_eq!(p.sent_by(false)[0].syndrome, Some(Syndrome::Nak(NakCode::PsnSeqErr)));
    let c = p.a.qp.counters();
    assert_eq!((c.retransmits, c.retransmitted_packets, c.seq_naks_received), (1, 3, 1));
    assert_eq!(poll_all(&p.b.cq)[0].byte_len, 4000);
    assert_eq!(dst.to_vec().unwrap(), src.to_vec().unwrap());
}

/// A long Write asks for ACKs along the way, and the requester never has more than its window
/// of PSNs unacknowledged, so that a loss costs at most a window of retransmissions.
/// Rule PKT-ACK-2, PKT-ACK-3
#[test]
fn window_bounds_packets_in_flight() {
    let mut p = Pair::new(QpType::Rc, Mtu::Mtu1024);
    let src = p.a.pd.alloc_mr(2 << 20, Access::LOCAL_WRITE).unwrap();
    let dst = p.b.pd.alloc_mr(2 << 20, all_access()).unwrap();
    p.a.qp.post_send(&[SendWr::rdma_write(1, &[src.sge(0..2 << 20)], dst.addr(), dst.rkey()).signaled()]).unwrap();
    p.run(RUN);
    assert_eq!(statuses(&p.a.cq), vec![(1, WcStatus::Success)]);
    let mut acked = 99u32; // the PSN before the first request
    let mut most = 0;
    let mut ackreqs = 0;
    for (from_a, d) in &p.trace {
        let k = Pkt::parse(d);
        if *from_a {
            most = most.max(k.psn - acked);
            if k.ack_req {
                ackreqs += 1;
                assert!(k.psn % 64 == 63 || k.opcode == Opcode::RcRdmaWriteLast, "{k:?}");
            }
        } else {
            acked = k.psn;
        }
    }
    assert_eq!(most, 256);
    assert_eq!(ackreqs, 2048 / 64 + 1);
}
