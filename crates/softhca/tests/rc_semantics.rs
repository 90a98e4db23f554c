//! RC semantics: ordering (and the worked example of ORD), SQD draining, events, the SE bit,
//! CQE contents, and what each WR puts on the wire.

mod common;

use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex};

use common::pair::*;
use common::poll_all;
use softhca::link::sim::rewrite;
use softhca::transport::MAX_DATAGRAM;
use softhca::wire::Opcode;
use softhca::*;

const RUN: u64 = 10_000_000_000;

fn all_access() -> Access {
    Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC
}

fn statuses(cq: &Cq) -> Vec<(u64, WcStatus)> {
    poll_all(cq).iter().map(|w| (w.wr_id, w.status)).collect()
}

/// Moves up to `n` packets from `a` to `b` (and nothing back).
fn a_to_b(p: &mut Pair, n: usize) -> Vec<Pkt> {
    let mut buf = vec![0u8; MAX_DATAGRAM];
    let mut out = Vec::new();
    for _ in 0..n {
        let Some(len) = p.a.ctx.transmit(p.now, &mut buf) else { break };
        out.push(Pkt::parse(&buf[..len]));
        p.b.ctx.receive(p.now, &buf[..len]);
    }
    out
}

fn drain(ctx: &Context, now: u64) -> Vec<Vec<u8>> {
    let mut buf = vec![0u8; MAX_DATAGRAM];
    std::iter::from_fn(|| ctx.transmit(now, &mut buf).map(|n| buf[..n].to_vec())).collect()
}

/// The worked example of ORD: Read 3072, Read 512, Write 512 at PMTU 1024.
/// Rule ORD-EX-1, ORD-EX-2, ORD-EX-3, ORD-EX-4, ORD-EX-5, ORD-EX-6, ORD-EX-7, ORD-RLX-1, ORD-RLX-4,
/// ORD-SQ-1, ORD-SQ-2, ORD-SQ-4, ORD-SQ-3, ORD-SQ-6, WR-READ-1, WR-READ-2
#[test]
fn ord_worked_example() {
    let mut p = Pair::new(QpType::Rc, Mtu::Mtu1024);
    let remote = p.b.pd.reg_mr((0..8192u32).map(|i| (i % 253) as u8).collect(), all_access()).unwrap();
    let land = p.a.pd.alloc_mr(4096, Access::LOCAL_WRITE).unwrap();
    let src = p.a.pd.reg_mr(vec![0xEE; 512], Access::LOCAL_WRITE).unwrap();
    let (g1, g2, g3) = ([land.sge(0..3072)], [land.sge(3072..3584)], [src.sge(0..512)]);
    p.a.qp
        .post_send(&[
            SendWr::rdma_read(1, &g1, remote.addr(), remote.rkey()).signaled(),
            SendWr::rdma_read(2, &g2, remote.addr() + 4096, remote.rkey()).signaled(),
            SendWr::rdma_write(3, &g3, remote.addr() + 6000, remote.rkey()).signaled(),
        ])
        .unwrap();
    let reqs = a_to_b(&mut p, 10);
    let got: Vec<(Opcode, u32)> = reqs.iter().map(|k| (k.opcode, k.psn)).collect();
    assert_eq!(
        got,
        vec![(Opcode::RcRdmaReadRequest, 100), (Opcode::RcRdmaReadRequest, 103), (Opcode::RcRdmaWriteOnly, 104)]
    );
    // The Write is already in memory; the Reads have not been answered yet.
    let mut w = vec![0; 512];
    remote.read(6000, &mut w).unwrap();
    assert_eq!(w, vec![0xEE; 512]);
    let responses = drain(&p.b.ctx, p.now);
    let out: Vec<(Opcode, u32)> = responses.iter().map(|d| Pkt::parse(d)).map(|k| (k.opcode, k.psn)).collect();
    assert_eq!(
        out,
        vec![
            (Opcode::RcRdmaReadResponseFirst, 100),
            (Opcode::RcRdmaReadResponseMiddle, 101),
            (Opcode::RcRdmaReadResponseLast, 102),
            (Opcode::RcRdmaReadResponseOnly, 103),
            (Opcode::RcAcknowledge, 104),
        ]
    );
    for d in &responses {
        p.a.ctx.receive(p.now, d);
    }
    let p2 = &mut p;
    p2.run(RUN);
    let s = statuses(&p2.a.cq);
    assert_eq!(s, vec![(1, WcStatus::Success), (2, WcStatus::Success), (3, WcStatus::Success)]);
    assert_eq!(land.to_vec().unwrap()[..3072], remote.to_vec().unwrap()[..3072]);
}

/// The worked example end to end with the responses delivered, and its Fence variant: the
/// fenced Write leaves only after every response of both Reads has been received.
/// Rule ORD-EX-7, ORD-EX-8, WR-COM-6
#[test]
fn ord_worked_example_fenced() {
    for fence in [false, true] {
        let mut p = Pair::new(QpType::Rc, Mtu::Mtu1024);
        let remote = p.b.pd.alloc_mr(8192, all_access()).unwrap();
        let land = p.a.pd.alloc_mr(4096, Access::LOCAL_WRITE).unwrap();
        let src = p.a.pd.alloc_mr(512, Access::LOCAL_WRITE).unwrap();
        let (g1, g2, g3) = ([land.sge(0..3072)], [land.sge(3072..3584)], [src.sge(0..512)]);
        let mut w3 = SendWr::rdma_write(3, &g3, remote.addr() + 6000, remote.rkey()).signaled();
        if fence {
            w3 = w3.fence();
        }
        p.a.qp
            .post_send(&[
                SendWr::rdma_read(1, &g1, remote.addr(), remote.rkey()).signaled(),
                SendWr::rdma_read(2, &g2, remote.addr() + 4096, remote.rkey()).signaled(),
                w3,
            ])
            .unwrap();
        p.run(RUN);
        assert_eq!(statuses(&p.a.cq), vec![(1, WcStatus::Success), (2, WcStatus::Success), (3, WcStatus::Success)]);
        // Where in the trace did the Write go, relative to the last Read response?
        let pos_write =
            p.trace.iter().position(|(a, d)| *a && Pkt::parse(d).opcode == Opcode::RcRdmaWriteOnly).unwrap();
        let pos_last_resp =
            p.trace.iter().position(|(a, d)| !*a && Pkt::parse(d).opcode == Opcode::RcRdmaReadResponseOnly).unwrap();
        assert_eq!(pos_write > pos_last_resp, fence, "fence {fence}");
    }
}

/// A Read whose R_Key is bad fails validation on arrival: Class C, and no request after it
/// executes, even one that already arrived.
/// Rule ORD-RLX-2, ORD-RLX-3, ORD-RLX-5
#[test]
fn failed_read_validation_stops_later_requests() {
    let mut p = Pair::new(QpType::Rc, Mtu::Mtu1024);
    let remote = p.b.pd.alloc_mr(4096, all_access()).unwrap();
    let land = p.a.pd.alloc_mr(4096, Access::LOCAL_WRITE).unwrap();
    let src = p.a.pd.reg_mr(vec![9; 64], Access::LOCAL_WRITE).unwrap();
    let (g1, g2) = ([land.sge(0..64)], [src.sge(0..64)]);
    p.a.qp
        .post_send(&[
            SendWr::rdma_read(1, &g1, remote.addr(), remote.rkey() ^ 0x100).signaled(),
            SendWr::rdma_write(2, &g2, remote.addr(), remote.rkey()).signaled(),
        ])
        .unwrap();
    p.run(RUN);
    assert_eq!(remote.to_vec().unwrap(), vec![0; 4096]);
    assert_eq!(statuses(&p.a.cq), vec![(1, WcStatus::RemAccessErr), (2, WcStatus::WrFlushErr)]);
}

/// An address vector supplied at SQD→RTS is the one the next request packet goes by: its
/// destination, hop limit and traffic class (the engine caches a connected QP's IP header,
/// and a Modify QP must not leave the old one in use).
/// Rule MOD-SQD-RTS-2, MOD-AV-2
#[test]
fn a_new_av_at_sqd_to_rts_moves_the_next_packet() {
    let mut p = Pair::new(QpType::Rc, Mtu::Mtu1024);
    let src = p.a.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    let g = [src.sge(0..64)];
    let ipv4 = |d: &[u8]| (Ipv4Addr::new(d[16], d[17], d[18], d[19]), d[8], d[1]);
    let land = p.b.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    p.b.qp.post_recv(&[RecvWr::new(1, &[land.sge(0..64)])]).unwrap();
    p.a.qp.post_send(&[SendWr::send(1, &g).signaled()]).unwrap();
    p.run(RUN);
    assert_eq!(statuses(&p.a.cq), vec![(1, WcStatus::Success)]);
    let before: Vec<_> = p.trace.iter().filter(|(from_a, _)| *from_a).map(|(_, d)| ipv4(d).0).collect();
    assert_eq!(before, vec![p.b.gid.to_ipv4().unwrap()]);
    p.a.qp.modify(&QpAttr::to_sqd()).unwrap();
    let elsewhere = Ipv4Addr::new(10, 9, 8, 7);
    let mut ah = AhAttr::roce(Gid::from_ipv4(elsewhere), 0);
    ah.grh.hop_limit = Some(9);
    ah.grh.traffic_class = Some(0x48);
    p.a.qp.modify(&QpAttr::to_rts().av(AddressVector::new(ah, Mtu::Mtu1024))).unwrap();
    p.a.qp.post_send(&[SendWr::send(2, &g)]).unwrap();
    let after = drain(&p.a.ctx, p.now);
    assert!(!after.is_empty());
    assert!(
        after.iter().all(|d| ipv4(d) == (elsewhere, 9, 0x48)),
        "{:?}",
        after.iter().map(|d| ipv4(d)).collect::<Vec<_>>()
    );
}

/// SQD: the message in progress finishes (its remaining packets, its ACK, its CQE), nothing
/// new starts, SQ Drained comes once, after the last CQE; retuning is refused while draining;
/// back in RTS the next WQE goes.
/// Rule QPS-SQD-3, QPS-SQD-4, QPS-SQD-5, QPS-SQD-6, QPS-SQD-8, QPS-SQD-9, EVT-SQD-1, EVT-SQD-3,
/// EVT-SQD-5, MOD-SQD-RTS-4, MOD-SQD-RTS-3, MOD-SQD-RTS-2, QPS-SQD-7
#[test]
fn sqd_drains_in_progress_messages() {
    let mut p = Pair::new(QpType::Rc, Mtu::Mtu1024);
    let src = p.a.pd.alloc_mr(4096, Access::LOCAL_WRITE).unwrap();
    let dst = p.b.pd.alloc_mr(8192, all_access()).unwrap();
    let (g1, g2) = ([src.sge(0..3000)], [src.sge(0..100)]);
    p.a.qp
        .post_send(&[
            SendWr::rdma_write(1, &g1, dst.addr(), dst.rkey()).signaled(),
            SendWr::rdma_write(2, &g2, dst.addr() + 4096, dst.rkey()).signaled(),
        ])
        .unwrap();
    let first = a_to_b(&mut p, 1);
    assert_eq!(first[0].opcode, Opcode::RcRdmaWriteFirst);
    p.a.qp.modify(&QpAttr::to_sqd().en_sqd_async_notify(true)).unwrap();
    assert!(p.a.qp.query().unwrap().sq_draining);
    assert_eq!(p.a.qp.modify(&QpAttr::to_rts().timeout(12)), Err(VerbsError::InvalidQpState));
    assert_eq!(p.a.qp.modify(&QpAttr::new(QpState::Sqd).retry_cnt(3)), Err(VerbsError::InvalidQpState));
    assert!(p.a.ctx.get_async_event().is_none());
    // Lose the first ACK: the retransmission happens in SQD too (the timeout's probe, whose
    // duplicate ACK covers the whole message).
    let mut lost = false;
    p.filter = Some(Box::new(move |from_a, _| {
        if !from_a && !lost {
            lost = true;
            return false;
        }
        true
    }));
    p.run(RUN);
    let sent: Vec<(Opcode, u32)> = p.sent_by(true).iter().map(|k| (k.opcode, k.psn)).collect();
    assert_eq!(
        sent,
        vec![(Opcode::RcRdmaWriteMiddle, 101), (Opcode::RcRdmaWriteLast, 102), (Opcode::RcRdmaWriteFirst, 100)]
    );
    assert_eq!(statuses(&p.a.cq), vec![(1, WcStatus::Success)]);
    let ev: Vec<AsyncEvent> = std::iter::from_fn(|| p.a.ctx.get_async_event()).collect();
    assert_eq!(
        ev,
        vec![AsyncEvent { event_type: AsyncEventType::SqDrained, element: EventElement::Qp(p.a.qp.qp_num()) }]
    );
    let a = p.a.qp.query().unwrap();
    assert_eq!((a.qp_state, a.sq_draining), (QpState::Sqd, false));
    // A QP in SQD still receives: a Send from b is placed and ACKed.
    let land = p.a.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    p.a.qp.post_recv(&[RecvWr::new(77, &[land.sge(0..64)])]).unwrap();
    let bsrc = p.b.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    p.b.qp.post_send(&[SendWr::send(78, &[bsrc.sge(0..64)]).signaled()]).unwrap();
    p.run(RUN);
    assert_eq!(statuses(&p.a.cq), vec![(77, WcStatus::Success)]);
    assert_eq!(statuses(&p.b.cq), vec![(78, WcStatus::Success)]);
    // Drained: now retuning is accepted, and WQE 2 runs after SQD→RTS.
    p.a.qp.modify(&QpAttr::to_rts().timeout(11)).unwrap();
    p.run(RUN);
    assert_eq!(statuses(&p.a.cq), vec![(2, WcStatus::Success)]);
    assert!(p.a.ctx.get_async_event().is_none(), "SQ Drained at most once");
}

/// SQD→RTS with no parameter is accepted while still draining; the in-progress message then
/// completes before any new one starts. Without the request, no SQ Drained event.
/// Rule MOD-SQD-RTS-3, EVT-SQD-2, EVT-SQD-4
#[test]
fn sqd_to_rts_while_draining_and_no_event_unless_asked() {
    let mut p = Pair::new(QpType::Rc, Mtu::Mtu1024);
    let src = p.a.pd.alloc_mr(4096, Access::LOCAL_WRITE).unwrap();
    let dst = p.b.pd.alloc_mr(8192, all_access()).unwrap();
    let (g1, g2) = ([src.sge(0..3000)], [src.sge(0..100)]);
    p.a.qp
        .post_send(&[
            SendWr::rdma_write(1, &g1, dst.addr(), dst.rkey()).signaled(),
            SendWr::rdma_write(2, &g2, dst.addr() + 4096, dst.rkey()).signaled(),
        ])
        .unwrap();
    a_to_b(&mut p, 1);
    p.a.qp.modify(&QpAttr::to_sqd()).unwrap();
    p.a.qp.modify(&QpAttr::to_rts()).unwrap();
    p.run(RUN);
    let sent: Vec<u32> = p.sent_by(true).iter().map(|k| k.psn).collect();
    assert_eq!(sent, vec![101, 102, 103]);
    assert_eq!(statuses(&p.a.cq), vec![(1, WcStatus::Success), (2, WcStatus::Success)]);
    assert!(p.a.ctx.get_async_event().is_none());
    // Nothing in progress at RTS→SQD: the requested event comes at once.
    p.a.qp.modify(&QpAttr::to_sqd().en_sqd_async_notify(true)).unwrap();
    assert_eq!(p.a.ctx.get_async_event().map(|e| e.event_type), Some(AsyncEventType::SqDrained));
    // The request was that transition's: the next RTS→SQD without it raises nothing.
    p.a.qp.modify(&QpAttr::to_rts()).unwrap();
    p.a.qp.modify(&QpAttr::to_sqd()).unwrap();
    assert!(p.a.ctx.get_async_event().is_none());
}

/// A QP in RTR receives and answers, raises Communication Established once, and stays in RTR.
/// Rule EVT-CE-1, EVT-AE-3, QPS-RTR-2, QPS-RTR-3, QPS-RTR-5, QPS-RTR-6, QPS-RTR-1
#[test]
fn rtr_receives_and_raises_communication_established() {
    let mut p = Pair::unconnected(QpType::Rc);
    let o = Opts::default();
    connect(&p.a, &p.b, Mtu::Mtu1024, &o);
    let av = AddressVector::new(AhAttr::roce(p.a.gid, 0), Mtu::Mtu1024);
    p.b.qp.modify(&QpAttr::to_init().port(1).pkey_index(0).access(all_access())).unwrap();
    p.b.qp.modify(&QpAttr::to_rtr(av, p.a.qp.qp_num()).rq_psn(100).max_dest_rd_atomic(4)).unwrap();
    let src = p.a.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    let dst = p.b.pd.alloc_mr(64, all_access()).unwrap();
    p.b.qp.post_recv(&[RecvWr::new(1, &[dst.sge(0..64)])]).unwrap();
    p.a.qp.post_send(&[SendWr::send(1, &[src.sge(0..64)]).signaled()]).unwrap();
    p.a.qp.post_send(&[SendWr::rdma_write(2, &[src.sge(0..8)], dst.addr(), dst.rkey()).signaled()]).unwrap();
    p.run(RUN);
    assert_eq!(statuses(&p.a.cq), vec![(1, WcStatus::Success), (2, WcStatus::Success)]);
    assert_eq!(poll_all(&p.b.cq).len(), 1);
    assert_eq!(p.b.qp.state().unwrap(), QpState::Rtr);
    let ev: Vec<AsyncEvent> = std::iter::from_fn(|| p.b.ctx.get_async_event()).collect();
    assert_eq!(
        ev,
        vec![AsyncEvent { event_type: AsyncEventType::CommEst, element: EventElement::Qp(p.b.qp.qp_num()) }]
    );
    assert!(p.sent_by(false).iter().all(|k| k.opcode == Opcode::RcAcknowledge), "no requests from RTR");
}

/// Requests to a QP in Reset, Init or Error, and responses to one in Error, are dropped
/// silently.
/// Rule QPS-RESET-4, QPS-INIT-4, QPS-ERR-1, QPS-ERR-2, QPS-ERR-5, PKT-VAL-5, PKT-VAL-6
#[test]
fn packets_to_reset_init_and_error_are_dropped() {
    let p = Pair::new(QpType::Rc, Mtu::Mtu1024);
    let src = p.a.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    let dst = p.b.pd.alloc_mr(64, all_access()).unwrap();
    p.a.qp.post_send(&[SendWr::rdma_write(1, &[src.sge(0..8)], dst.addr(), dst.rkey()).signaled()]).unwrap();
    let mut buf = vec![0u8; MAX_DATAGRAM];
    let n = p.a.ctx.transmit(0, &mut buf).unwrap();
    let req = buf[..n].to_vec();
    p.b.ctx.receive(0, &req);
    let n = p.b.ctx.transmit(0, &mut buf).unwrap();
    let ack = buf[..n].to_vec();
    // The responder in Error, Reset, Init: the same request is dropped without an answer.
    for s in [QpState::Error, QpState::Reset, QpState::Init] {
        match s {
            QpState::Init => p.b.qp.modify(&QpAttr::to_init().port(1).pkey_index(0).access(all_access())).unwrap(),
            _ => p.b.qp.modify(&QpAttr::new(s)).unwrap(),
        }
        let before = p.b.ctx.counters().rx_dropped;
        p.b.ctx.receive(0, &req);
        assert_eq!(p.b.ctx.counters().rx_dropped, before + 1, "{s}");
        assert_eq!(p.b.ctx.transmit(0, &mut buf), None, "{s}");
    }
    // The requester in Error drops the ACK and sends nothing.
    p.a.qp.modify(&QpAttr::to_error()).unwrap();
    let before = p.a.ctx.counters().rx_dropped;
    p.a.ctx.receive(0, &ack);
    assert_eq!(p.a.ctx.counters().rx_dropped, before + 1);
    p.a.qp.post_send(&[SendWr::send(2, &[])]).unwrap();
    assert_eq!(p.a.ctx.transmit(0, &mut buf), None);
    assert_eq!(statuses(&p.a.cq), vec![(1, WcStatus::WrFlushErr), (2, WcStatus::WrFlushErr)]);
}

/// The SE bit: set on the last packet of a solicited Send or Write with Immediate, clear
/// everywhere else; the receiver's solicited notification fires only for solicited CQEs.
/// Rule EVT-SE-1, EVT-SE-2, EVT-SE-3, EVT-SOL-1, EVT-SOL-3, EVT-SOL-4, EVT-CN-2, WR-SEND-1
#[test]
fn solicited_event_bit_and_notification() {
    let mut p = Pair::new(QpType::Rc, Mtu::Mtu1024);
    let src = p.a.pd.alloc_mr(4096, Access::LOCAL_WRITE).unwrap();
    let dst = p.b.pd.alloc_mr(8192, all_access()).unwrap();
    let recvs: Vec<RecvWr> = (0..4).map(|i| RecvWr::new(i, &[])).collect();
    let big = [dst.sge(0..4096)];
    p.b.qp.post_recv(&recvs[..1]).unwrap();
    p.b.qp.post_recv(&[RecvWr::new(9, &big)]).unwrap();
    p.b.qp.post_recv(&recvs[1..]).unwrap();
    let calls = Arc::new(Mutex::new(0));
    let c = calls.clone();
    p.b.ctx.set_completion_handler(move |_| *c.lock().unwrap() += 1).unwrap();
    p.b.cq.req_notify(NotifyKind::Solicited).unwrap();
    let g = [src.sge(0..2500)];
    let e: [Sge; 0] = [];
    p.a.qp.post_send(&[SendWr::send(1, &e)]).unwrap(); // unsolicited
    p.run(RUN);
    assert_eq!(*calls.lock().unwrap(), 0, "an unsolicited receive does not fire a solicited request");
    p.a.qp
        .post_send(&[
            SendWr::send(2, &g).solicited().imm(77),
            SendWr::rdma_write(3, &g, dst.addr() + 4096, dst.rkey()).solicited(),
            SendWr::rdma_write(4, &e, dst.addr(), dst.rkey()).imm(5).solicited(),
            SendWr::rdma_read(5, &e, dst.addr(), dst.rkey()).solicited(),
        ])
        .unwrap();
    p.run(RUN);
    let se: Vec<(Opcode, bool)> = p.sent_by(true).iter().map(|k| (k.opcode, k.se)).collect();
    assert_eq!(
        se,
        vec![
            (Opcode::RcSendOnly, false),
            (Opcode::RcSendFirst, false),
            (Opcode::RcSendMiddle, false),
            (Opcode::RcSendLastWithImmediate, true),
            (Opcode::RcRdmaWriteFirst, false),
            (Opcode::RcRdmaWriteMiddle, false),
            (Opcode::RcRdmaWriteLast, false),
            (Opcode::RcRdmaWriteOnlyWithImmediate, true),
            (Opcode::RcRdmaReadRequest, false),
        ]
    );
    assert_eq!(*calls.lock().unwrap(), 1, "the solicited Send fired it");
    // SQ CQEs are unsolicited: a solicited request on a's CQ is not fired by them.
    let calls_a = Arc::new(Mutex::new(0));
    let c = calls_a.clone();
    p.a.ctx.set_completion_handler(move |_| *c.lock().unwrap() += 1).unwrap();
    p.a.cq.req_notify(NotifyKind::Solicited).unwrap();
    p.a.qp.post_send(&[SendWr::send(6, &e).signaled()]).unwrap();
    p.run(RUN);
    assert_eq!(*calls_a.lock().unwrap(), 0);
}

/// CQE contents: WR ID, status, operation type and byte count on both sides, immediate data,
/// one CQE per reported WQE; unsignaled successes produce none unless the QP signals all.
/// Rule CQE-1, CQE-2, CQE-3, CQE-4, CQE-5, CQE-6, CQE-8, CQE-9, WR-COM-2, WR-COM-3, WR-WRITE-3,
/// WR-RQ-1, WR-RQ-2, WR-RQ-3, WR-RQ-4, WR-RQ-5, ORD-RQ-1, ORD-RQ-2, ORD-RQ-4, WR-COM-5
#[test]
fn cqe_contents() {
    let mut p = Pair::new(QpType::Rc, Mtu::Mtu1024);
    let src = p.a.pd.reg_mr((0..4096u32).map(|i| i as u8).collect(), Access::LOCAL_WRITE).unwrap();
    let dst = p.b.pd.alloc_mr(8192, all_access()).unwrap();
    let word = p.b.pd.alloc_mr(8, all_access()).unwrap();
    let land = p.a.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    let gather = [src.sge(10..20), src.sge(0..0), src.sge(100..1200)]; // 1110 bytes, a zero entry
    let scatter = [dst.sge(0..500), dst.sge(1000..2000)];
    p.b.qp
        .post_recv(&[RecvWr::new(100, &scatter), RecvWr::new(101, &[]), RecvWr::new(102, &[]), RecvWr::new(103, &[])])
        .unwrap();
    let (r8, a8, c8) = ([land.sge(0..8)], [land.sge(8..16)], [land.sge(16..24)]);
    p.a.qp
        .post_send(&[
            SendWr::send(1, &gather).signaled().imm(0xfeed),
            SendWr::rdma_write(2, &gather, dst.addr() + 4096, dst.rkey()).signaled(),
            SendWr::rdma_write(3, &gather, dst.addr() + 6000, dst.rkey()).imm(9).signaled(),
            SendWr::rdma_read(4, &r8, dst.addr(), dst.rkey()).signaled(),
            SendWr::atomic_fetch_add(5, &a8, word.addr(), word.rkey(), 3).signaled(),
            SendWr::atomic_cmp_swp(6, &c8, word.addr(), word.rkey(), 3, 4).signaled(),
            SendWr::send(7, &[]), // unsignaled: no CQE
            SendWr::send(8, &[]).signaled(),
        ])
        .unwrap();
    p.run(RUN);
    let wa: Vec<(u64, WcStatus, WcOpcode)> = poll_all(&p.a.cq).iter().map(|w| (w.wr_id, w.status, w.opcode)).collect();
    let ok = WcStatus::Success;
    assert_eq!(
        wa,
        vec![
            (1, ok, WcOpcode::Send),
            (2, ok, WcOpcode::RdmaWrite),
            (3, ok, WcOpcode::RdmaWrite),
            (4, ok, WcOpcode::RdmaRead),
            (5, ok, WcOpcode::FetchAdd),
            (6, ok, WcOpcode::CompSwap),
            (8, ok, WcOpcode::Send),
        ]
    );
    let wb = poll_all(&p.b.cq);
    let got: Vec<(u64, WcOpcode, u32, Option<u32>)> =
        wb.iter().map(|w| (w.wr_id, w.opcode, w.byte_len, w.imm())).collect();
    assert_eq!(
        got,
        vec![
            (100, WcOpcode::Recv, 1110, Some(0xfeed)),
            (101, WcOpcode::RecvRdmaWithImm, 1110, Some(9)),
            (102, WcOpcode::Recv, 0, None),
            (103, WcOpcode::Recv, 0, None),
        ]
    );
    let mut all = src.to_vec().unwrap()[10..20].to_vec();
    all.extend_from_slice(&src.to_vec().unwrap()[100..1200]);
    let d = dst.to_vec().unwrap();
    assert_eq!(&d[..500], &all[..500], "scatter in list order");
    assert_eq!(&d[1000..1610], &all[500..]);
    assert_eq!(&d[4096..4096 + 1110], &all[..]);
    assert_eq!(&d[6000..6000 + 1110], &all[..]);
    // The QP that signals every WR.
    let cq = p.a.ctx.create_cq(16).unwrap();
    let qp = p.a.pd.create_qp(&QpInitAttr::rc(&cq, &cq).sq_sig_all(true)).unwrap();
    qp.modify(&QpAttr::to_error()).unwrap();
    qp.post_send(&[SendWr::send(1, &[])]).unwrap();
    assert_eq!(poll_all(&cq).len(), 1);
}

/// What Writes, Reads and Atomics carry: RETH in the first packet only with the whole length,
/// AtomicETH operands, the first PSN is the SQ Start PSN, DestQP and P_Key from the QP.
/// Rule WR-WRITE-1, WR-WRITE-2, WR-ATOM-1, WR-ATOM-2, MOD-RTR-RTS-2, MOD-DQPN-1, MOD-PKEY-1,
/// MOD-AV-3, PKT-LEN-1, PKT-LEN-2, PKT-LEN-3
#[test]
fn request_headers() {
    let o = Opts { sq_psn: 0xFF_FFFE, ..Opts::default() };
    let mut p = Pair::with(QpType::Rc, Mtu::Mtu512, o);
    let src = p.a.pd.alloc_mr(2048, Access::LOCAL_WRITE).unwrap();
    let dst = p.b.pd.alloc_mr(2048, all_access()).unwrap();
    p.a.qp
        .post_send(&[
            SendWr::rdma_write(1, &[src.sge(0..700), src.sge(700..1100)], dst.addr() + 8, dst.rkey()),
            SendWr::atomic_cmp_swp(2, &[src.sge(0..8)], dst.addr(), dst.rkey(), 11, 22),
            SendWr::atomic_fetch_add(3, &[src.sge(8..16)], dst.addr(), dst.rkey(), 33),
        ])
        .unwrap();
    p.run(RUN);
    let mut seen = Vec::new();
    for (_, d) in p.trace.iter().filter(|(a, _)| *a) {
        let r = softhca::wire::roce::parse_ip(d).unwrap().packet;
        assert_eq!(r.bth.dest_qp, p.b.qp.qp_num());
        assert_eq!(r.bth.p_key, 0xFFFF);
        assert!(r.payload.len() <= 512);
        seen.push((
            r.bth.opcode,
            r.bth.psn.value(),
            r.payload.len(),
            r.reth.map(|x| (x.va - dst.addr(), x.dma_length)),
            r.atomic_eth.map(|a| (a.swap_add_data, a.compare_data)),
        ));
    }
    assert_eq!(
        seen,
        vec![
            (Opcode::RcRdmaWriteFirst, 0xFF_FFFE, 512, Some((8, 1100)), None),
            (Opcode::RcRdmaWriteMiddle, 0xFF_FFFF, 512, None, None),
            (Opcode::RcRdmaWriteLast, 0, 76, None, None),
            (Opcode::RcCompareSwap, 1, 0, None, Some((22, 11))),
            (Opcode::RcFetchAdd, 2, 0, None, Some((33, 0))),
        ]
    );
}

/// Interface checks: a WQE whose gather L_Key is bad fails before any of its packets is sent,
/// with Local Protection Error; the WQEs before it complete successfully first; the RC QP
/// moves to Error and the rest is flushed.
/// Rule WR-COM-9, ERR-SQ-2, ERR-SQ-3, ERR-SQ-4, ERR-SQ-5, ERR-FLUSH-2, ERR-FLUSH-3
#[test]
fn bad_lkey_is_a_local_protection_error() {
    let mut p = Pair::new(QpType::Rc, Mtu::Mtu1024);
    let src = p.a.pd.alloc_mr(4096, Access::LOCAL_WRITE).unwrap();
    let dst = p.b.pd.alloc_mr(4096, all_access()).unwrap();
    let bad = [Sge { lkey: src.lkey() ^ 0x100, ..src.sge(0..64) }];
    let good = [src.sge(0..3000)];
    p.a.qp
        .post_send(&[
            SendWr::rdma_write(1, &good, dst.addr(), dst.rkey()).signaled(),
            SendWr::rdma_write(2, &bad, dst.addr(), dst.rkey()).signaled(),
            SendWr::rdma_write(3, &good, dst.addr(), dst.rkey()).signaled(),
        ])
        .unwrap();
    p.run(RUN);
    assert_eq!(statuses(&p.a.cq), vec![(1, WcStatus::Success), (2, WcStatus::LocProtErr), (3, WcStatus::WrFlushErr)]);
    assert_eq!(p.sent_by(true).len(), 3, "only WQE 1's three packets left");
    assert_eq!(p.a.qp.state().unwrap(), QpState::Error);
}

/// Responses that do not fit: an RDMA Read response for a Send is a Bad Response; a Read
/// response carrying fewer bytes than asked, or ending the Read before its last response,
/// is a Local Length Error.
/// Rule ERR-SQ-12, ERR-SQ-13
#[test]
fn bad_responses() {
    let mut p = Pair::new(QpType::Rc, Mtu::Mtu1024);
    p.b.qp.post_recv(&[RecvWr::new(1, &[])]).unwrap();
    p.filter = Some(Box::new(|from_a, d| {
        if !from_a {
            rewrite(d, |r| {
                r.packet.bth.opcode = Opcode::RcRdmaReadResponseOnly;
                r.packet.payload = &[1, 2, 3, 4];
            })
            .unwrap();
        }
        true
    }));
    p.a.qp.post_send(&[SendWr::send(1, &[]).signaled()]).unwrap();
    p.run(RUN);
    assert_eq!(statuses(&p.a.cq), vec![(1, WcStatus::BadRespErr)]);

    let mut p = Pair::new(QpType::Rc, Mtu::Mtu1024);
    let remote = p.b.pd.alloc_mr(100, all_access()).unwrap();
    let land = p.a.pd.alloc_mr(100, Access::LOCAL_WRITE).unwrap();
    p.filter = Some(Box::new(|from_a, d| {
        if !from_a {
            rewrite(d, |r| r.packet.payload = &[0; 96]).unwrap();
        }
        true
    }));
    p.a.qp.post_send(&[SendWr::rdma_read(1, &[land.sge(0..100)], remote.addr(), remote.rkey()).signaled()]).unwrap();
    p.run(RUN);
    assert_eq!(statuses(&p.a.cq), vec![(1, WcStatus::LocLenErr)]);
    assert_eq!(p.a.qp.state().unwrap(), QpState::Error);

    // A 2048-byte Read answered by one Only response of 1024 bytes: it ends the Read early,
    // fewer bytes than asked (not an opcode that fits no Read).
    let mut p = Pair::new(QpType::Rc, Mtu::Mtu1024);
    let remote = p.b.pd.alloc_mr(2048, all_access()).unwrap();
    let land = p.a.pd.alloc_mr(2048, Access::LOCAL_WRITE).unwrap();
    p.filter = Some(Box::new(|from_a, d| {
        if !from_a && Pkt::parse(d).opcode == Opcode::RcRdmaReadResponseFirst {
            rewrite(d, |r| r.packet.bth.opcode = Opcode::RcRdmaReadResponseOnly).unwrap();
        }
        true
    }));
    p.a.qp.post_send(&[SendWr::rdma_read(1, &[land.sge(0..2048)], remote.addr(), remote.rkey()).signaled()]).unwrap();
    p.run(RUN);
    assert_eq!(statuses(&p.a.cq), vec![(1, WcStatus::LocLenErr)]);
}

/// A new value from Modify QP applies to the next packet: the Minimum RNR NAK Timer changed
/// with RTS→RTS shows up in the next RNR NAK.
/// Rule MOD-GEN-7, PKT-RNR-1
#[test]
fn modified_values_take_effect_at_once() {
    let mut p = Pair::new(QpType::Rc, Mtu::Mtu1024);
    p.b.qp.modify(&QpAttr::to_rts().min_rnr_timer(20)).unwrap();
    p.a.qp.post_send(&[SendWr::send(1, &[])]).unwrap();
    a_to_b(&mut p, 1);
    let out = drain(&p.b.ctx, 0);
    assert_eq!(Pkt::parse(&out[0]).syndrome, Some(softhca::wire::Syndrome::RnrNak { timer_code: 20 }));
}

/// INLINE takes the bytes at post time: from `inline_data`, or from the gather list as
/// libibverbs does, so the buffer may change right after the post; a gather list whose key does
/// not cover it completes with Local Protection Error; more than max_inline_data is refused.
/// Rule WR-COM-9, WR-COM-5
#[test]
fn inline_sends_copy_at_post_time() {
    let mut p = Pair::new(QpType::Rc, Mtu::Mtu1024);
    let src = p.a.pd.reg_mr(b"abcdefgh".to_vec(), Access::LOCAL_WRITE).unwrap();
    let dst = p.b.pd.alloc_mr(64, all_access()).unwrap();
    p.b.qp.post_recv(&[RecvWr::new(1, &[dst.sge(0..32)]), RecvWr::new(2, &[dst.sge(32..64)])]).unwrap();
    let g = [src.sge(0..4), src.sge(4..8)];
    p.a.qp.post_send(&[SendWr::send(1, &g).inline().signaled()]).unwrap();
    src.write(0, b"XXXXXXXX").unwrap(); // too late to change what was posted
    p.a.qp.post_send(&[SendWr::send_inline(2, b"12345").signaled()]).unwrap();
    p.run(RUN);
    assert_eq!(statuses(&p.a.cq), vec![(1, WcStatus::Success), (2, WcStatus::Success)]);
    let d = dst.to_vec().unwrap();
    assert_eq!((&d[..8], &d[32..37]), (&b"abcdefgh"[..], &b"12345"[..]));
    let bad = [Sge { lkey: src.lkey() ^ 0x100, ..src.sge(0..4) }];
    p.b.qp.post_recv(&[RecvWr::new(3, &[])]).unwrap();
    p.a.qp.post_send(&[SendWr::send(3, &bad).inline().signaled()]).unwrap();
    p.run(RUN);
    assert_eq!(statuses(&p.a.cq), vec![(3, WcStatus::LocProtErr)]);
    let big = vec![0u8; 65];
    let q = p.a.pd.create_qp(&QpInitAttr::rc(&p.a.cq, &p.a.cq).max_inline_data(64)).unwrap();
    q.modify(&QpAttr::to_error()).unwrap();
    assert!(matches!(q.post_send(&[SendWr::send_inline(4, &big)]).unwrap_err().error, VerbsError::InvalidWr(_)));
}

/// A GID change (the link layer setting its address) applies to the next packet, even on a
/// connected QP whose route softhca caches.
/// Rule MOD-AV-2, PKT-ROCE-3
#[test]
fn gid_change_reaches_the_next_packet() {
    let p = Pair::new(QpType::Rc, Mtu::Mtu1024);
    let src = p.a.pd.alloc_mr(8, Access::LOCAL_WRITE).unwrap();
    let dst = p.b.pd.alloc_mr(8, all_access()).unwrap();
    let mut buf = vec![0u8; MAX_DATAGRAM];
    let source = |buf: &[u8]| softhca::wire::roce::parse_ip(buf).unwrap().ip.src_gid();
    p.a.qp.post_send(&[SendWr::rdma_write(1, &[src.sge(0..8)], dst.addr(), dst.rkey())]).unwrap();
    let n = p.a.ctx.transmit(0, &mut buf).unwrap();
    assert_eq!(Gid::from_ipv6(source(&buf[..n])), p.a.gid);
    let moved = Gid::from_ipv4([127, 1, 0, 77].into());
    p.a.ctx.set_gid(0, moved).unwrap();
    p.a.qp.post_send(&[SendWr::rdma_write(2, &[src.sge(0..8)], dst.addr(), dst.rkey())]).unwrap();
    let n = p.a.ctx.transmit(0, &mut buf).unwrap();
    assert_eq!(Gid::from_ipv6(source(&buf[..n])), moved);
}

/// A QP with many RDMA Read responses queued still gets its own request out after a short
/// burst of them, and its responses keep their order.
/// Rule ORD-RLX-4
#[test]
fn requests_are_not_starved_by_queued_responses() {
    let p = Pair::new(QpType::Rc, Mtu::Mtu1024);
    let src = p.a.pd.alloc_mr(64 * 1024, all_access()).unwrap();
    let land = p.b.pd.alloc_mr(64 * 1024, Access::LOCAL_WRITE).unwrap();
    let into = p.b.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    let reads: Vec<[Sge; 1]> = (0..16).map(|i| [land.sge(i * 4096..(i + 1) * 4096)]).collect();
    let wrs: Vec<SendWr> = reads
        .iter()
        .enumerate()
        .map(|(i, s)| SendWr::rdma_read(i as u64, s, src.addr() + i as u64 * 4096, src.rkey()))
        .collect();
    p.b.qp.post_send(&wrs).unwrap();
    p.b.qp.post_recv(&[RecvWr::new(99, &[into.sge(0..64)])]).unwrap();
    let mut buf = vec![0u8; MAX_DATAGRAM];
    while let Some(n) = p.b.ctx.transmit(p.now, &mut buf) {
        p.a.ctx.receive(p.now, &buf[..n]);
    }
    let msg = p.a.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    p.a.qp.post_send(&[SendWr::send(7, &[msg.sge(0..64)])]).unwrap();
    let mut out = Vec::new();
    while let Some(n) = p.a.ctx.transmit(p.now, &mut buf) {
        out.push(Pkt::parse(&buf[..n]));
    }
    assert_eq!(out.len(), 16 * 4 + 1);
    let send_at = out.iter().position(|k| k.opcode == Opcode::RcSendOnly).expect("the Send went out");
    assert!(send_at <= 8, "the Send waited behind {send_at} responses");
    let psns: Vec<u32> = out.iter().filter(|k| k.opcode != Opcode::RcSendOnly).map(|k| k.psn).collect();
    assert!(psns.windows(2).all(|w| w[1] == w[0] + 1), "responses in PSN order: {psns:?}");
}

/// RoCEv2 packets have no LRH: the AV's DLID, SL and Source Path Bits, which MOD-AV-1 puts in
/// an InfiniBand LRH, go nowhere on the wire (as on Linux rxe), and the packet begins with the
/// IP header the AV's GRH gives (PKT-ROCE-3). A QP moved (SQD → RTS) to an AV that differs
/// only in them sends packets of the same length whose headers differ only in the PSN.
/// Rule MOD-AV-1, PKT-ROCE-3
#[test]
fn the_avs_lrh_fields_go_nowhere_on_a_roce_packet() {
    let p = Pair::new(QpType::Rc, Mtu::Mtu1024);
    let src = p.a.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    let dst = p.b.pd.alloc_mr(64, all_access()).unwrap();
    let mut buf = vec![0u8; MAX_DATAGRAM];
    let write = |id, buf: &mut Vec<u8>| {
        p.a.qp.post_send(&[SendWr::rdma_write(id, &[src.sge(0..64)], dst.addr(), dst.rkey())]).unwrap();
        let n = p.a.ctx.transmit(0, buf).unwrap();
        buf[..n].to_vec()
    };
    let before = write(1, &mut buf);
    // Delivered and acknowledged, so that the SQ is drained for SQD → RTS (MOD-SQD-RTS-4).
    p.b.ctx.receive(0, &before);
    let n = p.b.ctx.transmit(0, &mut buf).expect("the ACK");
    p.a.ctx.receive(0, &buf[..n]);
    let mut ah = AhAttr::roce(p.b.gid, 0);
    (ah.dlid, ah.sl, ah.src_path_bits) = (0x1234, 5, 3);
    p.a.qp.modify(&QpAttr::to_sqd()).unwrap();
    let mut to_rts = QpAttr::to_rts();
    to_rts.av = Some(AddressVector::new(ah, Mtu::Mtu1024));
    p.a.qp.modify(&to_rts).unwrap();
    let after = write(2, &mut buf);
    assert_eq!(before.len(), after.len(), "no link header added");
    assert_eq!(before[0] >> 4, 4, "the datagram starts with the IPv4 header");
    let (x, y) = (softhca::wire::roce::parse_ip(&before).unwrap(), softhca::wire::roce::parse_ip(&after).unwrap());
    assert_eq!((x.ip, x.udp), (y.ip, y.udp));
    let mut bth = y.packet.bth;
    bth.psn = x.packet.bth.psn;
    assert_eq!(x.packet.bth, bth);
    assert_eq!(x.packet.reth, y.packet.reth);
}
