//! XRC (IBA Annex A14): an initiator QP's messages reach the XRC SRQ each names at the target,
//! through one target QP of the SRQ's XRC domain. The SRQ gives the message its receive WQE,
//! the PD of every key it uses and the CQ it completes on; the packets are RC's with XRC's
//! opcodes and an XRCETH on every request.

mod common;

use common::pair::*;
use common::poll_all;
use softhca::wire::roce::parse_ip;
use softhca::wire::{NakCode, Opcode, Syndrome};
use softhca::*;

const RUN: u64 = 10_000_000_000;
const ALL: Access = Access::LOCAL_WRITE.union(Access::REMOTE).union(Access::REMOTE_ATOMIC);

/// b's side of XRC: a domain, a target QP in it, and two XRC SRQs, each with a PD and a CQ of
/// its own.
struct Target {
    xrcd: Xrcd,
    qp: Qp,
    srqs: [(Srq, Pd, Cq); 2],
}

/// A pair whose a QP is an XRC initiator and whose b side is a [`Target`], connected.
fn xrc_pair() -> (Pair, Target) {
    let mut p = Pair::unconnected(QpType::Rc);
    p.a.qp.destroy().unwrap();
    p.b.qp.destroy().unwrap();
    p.a.qp = p.a.pd.create_qp(&QpInitAttr::new(QpType::XrcSend, &p.a.cq, &p.a.cq).max_send_sge(2)).unwrap();
    let xrcd = p.b.ctx.open_xrcd().unwrap();
    let qp = xrcd.create_tgt_qp().unwrap();
    let srqs = [0, 1].map(|_| {
        let pd = p.b.ctx.alloc_pd().unwrap();
        let cq = p.b.ctx.create_cq(64).unwrap();
        let srq = pd.create_xrc_srq(&xrcd, &cq, &SrqInitAttr::default()).unwrap();
        (srq, pd, cq)
    });
    p.b.qp = qp.clone();
    connect_xrc(&p.a, &p.b);
    connect_xrc(&p.b, &p.a);
    (p, Target { xrcd, qp, srqs })
}

/// Brings an XRC QP to RTS with what its side takes (the kernel's table for XRC_INI and
/// XRC_TGT): no responder attributes for an initiator, no retry counts for a target.
fn connect_xrc(x: &Side, y: &Side) {
    let av = AddressVector::new(AhAttr::roce(y.gid, 0), Mtu::Mtu1024);
    x.qp.modify(&QpAttr::to_init().port(1).pkey_index(0).access(ALL)).unwrap();
    let rtr = QpAttr::to_rtr(av, y.qp.qp_num()).rq_psn(7);
    let rts = QpAttr::to_rts().sq_psn(7).timeout(10);
    if x.qp.qp_type() == QpType::XrcSend {
        x.qp.modify(&rtr).unwrap();
        x.qp.modify(&rts.retry_cnt(7).rnr_retry(7).max_rd_atomic(4)).unwrap();
    } else {
        x.qp.modify(&rtr.max_dest_rd_atomic(4).min_rnr_timer(1)).unwrap();
        x.qp.modify(&rts).unwrap();
    }
}

/// Sends go to the SRQ each names: its WQE, its CQ, the target QP's number in the CQE; the
/// packets are XRC's, every request with an XRCETH naming the SRQ, the ACKs XRC's.
#[test]
fn each_send_takes_the_wqe_and_cq_of_the_srq_it_names() {
    let (mut p, t) = xrc_pair();
    for (i, (srq, pd, _)) in t.srqs.iter().enumerate() {
        let land = pd.alloc_mr(4096, Access::LOCAL_WRITE).unwrap();
        srq.post_recv(&[RecvWr::new(10 + i as u64, &[land.sge(0..4096)])]).unwrap();
        std::mem::forget(land);
    }
    let src = p.a.pd.reg_mr((0..3000u32).map(|i| i as u8).collect(), Access::LOCAL_WRITE).unwrap();
    let (n0, n1) = (t.srqs[0].0.srq_num(), t.srqs[1].0.srq_num());
    assert_ne!(n0, n1);
    p.a.qp
        .post_send(&[
            SendWr::send(1, &[src.sge(0..3000)]).xrc(n1).signaled(),
            SendWr::send(2, &[src.sge(0..8)]).xrc(n0).imm(0xabc).signaled(),
        ])
        .unwrap();
    p.run(RUN);
    let wa = poll_all(&p.a.cq);
    assert_eq!(
        wa.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    let w1 = poll_all(&t.srqs[1].2);
    assert_eq!(w1.iter().map(|w| (w.wr_id, w.byte_len, w.qp_num)).collect::<Vec<_>>(), [(11, 3000, t.qp.qp_num())]);
    let w0 = poll_all(&t.srqs[0].2);
    assert_eq!(w0.iter().map(|w| (w.wr_id, w.byte_len, w.imm_data)).collect::<Vec<_>>(), [(10, 8, 0xabc)]);
    // Three packets of 1024 bytes and one of 8: each with the XRCETH of its message's SRQ.
    let requests: Vec<(Opcode, u32)> = p
        .trace
        .iter()
        .filter(|(from_a, _)| *from_a)
        .map(|(_, d)| parse_ip(d).unwrap().packet)
        .map(|k| (k.bth.opcode, k.xrceth.expect("every XRC request has an XRCETH").xrc_srq))
        .collect();
    assert_eq!(
        requests,
        [
            (Opcode::XrcSendFirst, n1),
            (Opcode::XrcSendMiddle, n1),
            (Opcode::XrcSendLast, n1),
            (Opcode::XrcSendOnlyWithImmediate, n0)
        ]
    );
    let responses = p.sent_by(false);
    assert!(!responses.is_empty());
    assert!(responses.iter().all(|k| k.opcode == Opcode::XrcAcknowledge), "{responses:?}");
    assert!(p.trace.iter().filter(|(a, _)| !a).all(|(_, d)| parse_ip(d).unwrap().packet.xrceth.is_none()));
}

/// RDMA Write, Read and Atomic use the keys of the named SRQ's PD: a region of the other
/// SRQ's PD is a Remote Access Error (and the target QP goes to Error).
#[test]
fn remote_keys_belong_to_the_named_srqs_pd() {
    let (mut p, t) = xrc_pair();
    let target = t.srqs[1].1.alloc_mr(4096, ALL).unwrap();
    let n1 = t.srqs[1].0.srq_num();
    let local = p.a.pd.alloc_mr(4096, Access::LOCAL_WRITE).unwrap();
    local.write(0, b"xrc write").unwrap();
    let (va, rkey) = (target.addr(), target.rkey());
    p.a.qp
        .post_send(&[
            SendWr::rdma_write(1, &[local.sge(0..9)], va, rkey).xrc(n1).signaled(),
            SendWr::rdma_read(2, &[local.sge(100..109)], va, rkey).xrc(n1).signaled(),
            SendWr::atomic_fetch_add(3, &[local.sge(200..208)], va + 1000, rkey, 5).xrc(n1).signaled(),
        ])
        .unwrap();
    p.run(RUN);
    let wa = poll_all(&p.a.cq);
    assert_eq!(wa.iter().map(|w| w.status).collect::<Vec<_>>(), [WcStatus::Success; 3]);
    let mut b = [0u8; 9];
    local.read(100, &mut b).unwrap();
    assert_eq!(&b, b"xrc write");
    let mut n = [0u8; 8];
    target.read(1000, &mut n).unwrap();
    assert_eq!(u64::from_ne_bytes(n), 5);
    let read_responses = p.sent_by(false).iter().filter(|k| k.opcode == Opcode::XrcRdmaReadResponseOnly).count();
    assert_eq!(read_responses, 1);
    // The same region through the other SRQ: its PD is not the region's.
    p.a.qp
        .post_send(&[SendWr::rdma_write(4, &[local.sge(0..9)], va, rkey).xrc(t.srqs[0].0.srq_num()).signaled()])
        .unwrap();
    p.run(RUN);
    let wa = poll_all(&p.a.cq);
    assert_eq!(wa.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(), [(4, WcStatus::RemAccessErr)]);
    assert_eq!(t.qp.state().unwrap(), QpState::Error);
}

/// A request naming an SRQ outside the target's domain, a basic SRQ or a destroyed one is a
/// Remote Access Error, NAKed, and the target QP raises its access error.
#[test]
fn an_srq_the_target_may_not_take_is_a_remote_access_error() {
    for case in 0..3 {
        let (mut p, t) = xrc_pair();
        let other = p.b.ctx.open_xrcd().unwrap();
        let elsewhere = t.srqs[0].1.create_xrc_srq(&other, &t.srqs[0].2, &SrqInitAttr::default()).unwrap();
        let basic = t.srqs[0].1.create_srq(&SrqInitAttr::default()).unwrap();
        let srqn = match case {
            0 => elsewhere.srq_num(),
            1 => basic.srq_num(),
            _ => {
                let n = t.srqs[1].0.srq_num();
                t.srqs[1].0.destroy().unwrap();
                n
            }
        };
        p.a.qp.post_send(&[SendWr::send(1, &[]).xrc(srqn).signaled()]).unwrap();
        p.run(RUN);
        let wa = poll_all(&p.a.cq);
        assert_eq!(wa.iter().map(|w| w.status).collect::<Vec<_>>(), [WcStatus::RemAccessErr], "case {case}");
        let naks: Vec<_> = p.sent_by(false).iter().filter_map(|k| k.syndrome).collect();
        assert_eq!(naks, [Syndrome::Nak(NakCode::RemoteAccessError)], "case {case}");
        assert_eq!(t.qp.state().unwrap(), QpState::Error);
        let ev = p.b.ctx.get_async_event().unwrap();
        assert_eq!((ev.event_type, ev.element), (AsyncEventType::QpAccessErr, EventElement::Qp(t.qp.qp_num())));
    }
}

/// A refused SRQ takes no receive WQE: after a message to SRQ 0, a Send with Immediate naming
/// another domain's SRQ (whose failure would use a WQE, had it one) leaves SRQ 0's next WQE
/// where it is and completes nothing there; the target QP raises its access error instead.
#[test]
fn a_refused_srq_takes_no_wqe_of_the_last_message() {
    let (mut p, t) = xrc_pair();
    let (srq, pd, cq) = &t.srqs[0];
    let land = pd.alloc_mr(4096, Access::LOCAL_WRITE).unwrap();
    srq.post_recv(&[RecvWr::new(1, &[land.sge(0..2048)]), RecvWr::new(2, &[land.sge(2048..4096)])]).unwrap();
    p.a.qp.post_send(&[SendWr::send(1, &[]).xrc(srq.srq_num()).signaled()]).unwrap();
    p.run(RUN);
    assert_eq!(poll_all(cq).iter().map(|w| w.wr_id).collect::<Vec<_>>(), [1]);
    let other = p.b.ctx.open_xrcd().unwrap();
    let elsewhere = pd.create_xrc_srq(&other, cq, &SrqInitAttr::default()).unwrap();
    p.a.qp.post_send(&[SendWr::send(2, &[]).imm(7).xrc(elsewhere.srq_num()).signaled()]).unwrap();
    p.run(RUN);
    assert_eq!(
        poll_all(&p.a.cq).iter().map(|w| w.status).collect::<Vec<_>>(),
        [WcStatus::Success, WcStatus::RemAccessErr]
    );
    assert_eq!(srq.len().unwrap(), 1, "SRQ 0's second WQE is still posted");
    assert!(
        poll_all(cq).iter().all(|w| w.status != WcStatus::RemAccessErr),
        "nothing completed in error on SRQ 0's CQ"
    );
    let ev = p.b.ctx.get_async_event().unwrap();
    assert_eq!(ev.event_type, AsyncEventType::QpAccessErr);
}

/// What each side lacks is refused: an initiator's receive queue and responder attributes, a
/// target's send queue and requester attributes; a target QP is made only in its domain, and
/// the domain is not closed while an SRQ or target QP is in it.
#[test]
fn each_side_has_only_its_half() {
    let (p, t) = xrc_pair();
    assert!(p.a.qp.post_recv(&[RecvWr::new(1, &[])]).is_err(), "an initiator has no receive queue");
    assert!(t.qp.post_send(&[SendWr::send(1, &[])]).is_err(), "a target has no send queue");
    assert!(matches!(
        p.b.pd.create_qp(&QpInitAttr::new(QpType::XrcRecv, &p.b.cq, &p.b.cq)),
        Err(VerbsError::InvalidServiceType(_))
    ));
    let ini = p.a.pd.create_qp(&QpInitAttr::new(QpType::XrcSend, &p.a.cq, &p.a.cq).max_recv_wr(16)).unwrap();
    assert_eq!(ini.query().unwrap().cap.max_recv_wr, 0, "no receive queue asked for is made");
    ini.modify(&QpAttr::to_init().port(1).pkey_index(0).access(ALL)).unwrap();
    let av = AddressVector::new(AhAttr::roce(p.b.gid, 0), Mtu::Mtu1024);
    let rtr = QpAttr::to_rtr(av, 5).rq_psn(0);
    assert!(matches!(ini.modify(&rtr.clone().max_dest_rd_atomic(1)), Err(VerbsError::InvalidAttribute(..))));
    // New queue sizes resize the send queue; the receive queue stays none.
    let mut grow = rtr.clone();
    grow.cap = Some(WqSizes { max_send_wr: 32, max_recv_wr: 16 });
    ini.modify(&grow).unwrap();
    assert_eq!((ini.query().unwrap().cap.max_send_wr >= 32, ini.query().unwrap().cap.max_recv_wr), (true, 0));
    assert!(ini.post_recv(&[RecvWr::new(1, &[])]).is_err(), "still no receive queue");
    let tgt = t.xrcd.create_tgt_qp().unwrap();
    tgt.modify(&QpAttr::to_init().port(1).pkey_index(0).access(ALL)).unwrap();
    let rtr = QpAttr::to_rtr(av, 5).rq_psn(0);
    assert!(matches!(tgt.modify(&rtr), Err(VerbsError::MissingAttribute(_))), "MAX_DEST_RD_ATOMIC");
    tgt.modify(&rtr.max_dest_rd_atomic(1)).unwrap();
    assert!(matches!(
        tgt.modify(&QpAttr::to_rts().sq_psn(0).timeout(9).retry_cnt(7)),
        Err(VerbsError::InvalidAttribute(..))
    ));
    tgt.modify(&QpAttr::to_rts().sq_psn(0).timeout(9)).unwrap();
    assert!(matches!(t.xrcd.close(), Err(VerbsError::InUse(_))));
    tgt.destroy().unwrap();
    t.qp.destroy().unwrap();
    for (srq, _, _) in &t.srqs {
        assert!(matches!(t.xrcd.close(), Err(VerbsError::InUse(_))));
        srq.destroy().unwrap();
    }
    t.xrcd.close().unwrap();
    assert!(t.xrcd.create_tgt_qp().is_err());
}
