//! Shared receive queues: QPs drawing receives from one pool, the SRQ limit event, Last WQE
//! Reached, and credits.

mod common;

use common::pair::*;
use common::poll_all;
use softhca::wire::{Opcode, Syndrome};
use softhca::*;

const RUN: u64 = 10_000_000_000;

/// b's QP re-created on an SRQ, connected to a's QP.
fn pair_on_srq(srq_init: SrqInitAttr) -> (Pair, Srq) {
    let mut p = Pair::unconnected(QpType::Rc);
    let srq = p.b.pd.create_srq(&srq_init).unwrap();
    p.b.qp.destroy().unwrap();
    p.b.qp = p.b.pd.create_qp(&QpInitAttr::rc(&p.b.cq, &p.b.cq).max_recv_wr(0).srq(&srq)).unwrap();
    let o = Opts::default();
    connect(&p.a, &p.b, Mtu::Mtu1024, &o);
    connect(&p.b, &p.a, Mtu::Mtu1024, &o);
    (p, srq)
}

fn events(ctx: &Context) -> Vec<AsyncEvent> {
    std::iter::from_fn(|| ctx.get_async_event()).collect()
}

/// Receives come from the SRQ in post order; ACKs of a QP on an SRQ carry no credits; an empty
/// SRQ is RNR; a QP on an SRQ refuses its own Post Receive; an SRQ in use is not destroyed.
/// Rule PKT-ACK-11, ERR-RQ-3, ORD-RQ-1
#[test]
fn srq_feeds_receives() {
    let (mut p, srq) = pair_on_srq(SrqInitAttr::default());
    let dst = p.b.pd.alloc_mr(4096, Access::LOCAL_WRITE).unwrap();
    assert!(p.b.qp.post_recv(&[RecvWr::new(1, &[])]).is_err());
    assert!(matches!(srq.destroy(), Err(VerbsError::InUse(_))));
    srq.post_recv(&[RecvWr::new(1, &[dst.sge(0..2048)]), RecvWr::new(2, &[dst.sge(2048..4096)])]).unwrap();
    let src = p.a.pd.reg_mr((0..3000u32).map(|i| i as u8).collect(), Access::LOCAL_WRITE).unwrap();
    p.a.qp
        .post_send(&[
            SendWr::send(10, &[src.sge(0..2000)]).signaled(),
            SendWr::send(11, &[src.sge(1000..3000)]).signaled(),
            SendWr::send(12, &[src.sge(0..10)]).signaled(),
        ])
        .unwrap();
    p.run(50_000);
    let wb = poll_all(&p.b.cq);
    assert_eq!(
        wb.iter().map(|w| (w.wr_id, w.byte_len, w.qp_num)).collect::<Vec<_>>(),
        vec![(1, 2000, p.b.qp.qp_num()), (2, 2000, p.b.qp.qp_num())]
    );
    let acks: Vec<Syndrome> =
        p.sent_by(false).iter().filter(|k| k.opcode == Opcode::RcAcknowledge).filter_map(|k| k.syndrome).collect();
    assert!(acks.contains(&Syndrome::Ack { credit_code: 31 }));
    assert!(acks.iter().any(|s| matches!(s, Syndrome::RnrNak { .. })), "third send found the SRQ empty");
    srq.post_recv(&[RecvWr::new(3, &[dst.sge(0..64)])]).unwrap();
    p.run(RUN);
    assert_eq!(poll_all(&p.b.cq).iter().map(|w| w.wr_id).collect::<Vec<_>>(), vec![3]);
    assert_eq!(poll_all(&p.a.cq).len(), 3);
}

/// The SRQ limit: armed at L, the event comes once when a take leaves fewer than L WQEs, then
/// the limit is disarmed until armed again; a limit of 0 is not armed.
/// Rule EVT-SRQ-1, EVT-SRQ-2, EVT-AE-3
#[test]
fn srq_limit_event() {
    let (mut p, srq) = pair_on_srq(SrqInitAttr { max_wr: 16, max_sge: 1, srq_limit: 3 });
    let wrs: Vec<RecvWr> = (0..5).map(|i| RecvWr::new(i, &[])).collect();
    srq.post_recv(&wrs).unwrap();
    let send = |p: &mut Pair, n: u64| {
        for i in 0..n {
            p.a.qp.post_send(&[SendWr::send(i, &[])]).unwrap();
        }
        p.run(RUN);
    };
    send(&mut p, 2); // 3 left: not below 3
    assert!(events(&p.b.ctx).is_empty());
    send(&mut p, 1); // 2 left
    assert_eq!(
        events(&p.b.ctx),
        vec![AsyncEvent { event_type: AsyncEventType::SrqLimitReached, element: EventElement::Srq(srq.handle()) }]
    );
    assert_eq!(srq.query().unwrap().srq_limit, 0, "disarmed");
    send(&mut p, 1);
    assert!(events(&p.b.ctx).is_empty());
    srq.modify(None, Some(2)).unwrap();
    send(&mut p, 1); // 0 left, below 2
    assert_eq!(events(&p.b.ctx).len(), 1);
}

/// A QP on an SRQ entering Error reports Last WQE Reached once: after the flush CQE of the WQE
/// it was using, or at once when it used none.
/// Rule EVT-LWR-1
#[test]
fn last_wqe_reached() {
    let (mut p, srq) = pair_on_srq(SrqInitAttr::default());
    let dst = p.b.pd.alloc_mr(4096, Access::LOCAL_WRITE).unwrap();
    srq.post_recv(&[RecvWr::new(1, &[dst.sge(0..4096)]), RecvWr::new(2, &[])]).unwrap();
    let src = p.a.pd.alloc_mr(4096, Access::LOCAL_WRITE).unwrap();
    p.a.qp.post_send(&[SendWr::send(10, &[src.sge(0..3000)])]).unwrap();
    // Only the first packet arrives: WQE 1 is in use.
    let mut buf = vec![0u8; softhca::transport::MAX_DATAGRAM];
    let n = p.a.ctx.transmit(0, &mut buf).unwrap();
    p.b.ctx.receive(0, &buf[..n]);
    assert_eq!(srq.len().unwrap(), 1);
    p.b.qp.modify(&QpAttr::to_error()).unwrap();
    let wb = poll_all(&p.b.cq);
    assert_eq!(wb.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(), vec![(1, WcStatus::WrFlushErr)]);
    let ev = events(&p.b.ctx);
    assert_eq!(
        ev,
        vec![AsyncEvent { event_type: AsyncEventType::QpLastWqeReached, element: EventElement::Qp(p.b.qp.qp_num()) }]
    );
    assert_eq!(srq.len().unwrap(), 1, "WQE 2 stays on the SRQ for other QPs");
    p.run(RUN);
    // A second QP on the SRQ, idle, entering Error: the event at once.
    let qp2 = p.b.pd.create_qp(&QpInitAttr::rc(&p.b.cq, &p.b.cq).max_recv_wr(0).srq(&srq)).unwrap();
    qp2.modify(&QpAttr::to_error()).unwrap();
    assert_eq!(events(&p.b.ctx).iter().filter(|e| e.element == EventElement::Qp(qp2.qp_num())).count(), 1);
}

/// A Write with Immediate refused on a QP of an SRQ retires an SRQ WQE with the error, as it
/// retires the RQ head on a QP of its own: for its R_Key (Remote Access Error), and for
/// remote writes not enabled on the QP (Remote Invalid Request). Before, in the second case
/// the SRQ having a WQE counted as one in use, none was taken, and the error left no CQE and
/// no asynchronous event. Rule ERR-C-3
#[test]
fn a_refused_write_with_immediate_retires_an_srq_wqe() {
    for enabled in [true, false] {
        let (mut p, srq) = pair_on_srq(SrqInitAttr::default());
        let dst = p.b.pd.alloc_mr(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE).unwrap();
        srq.post_recv(&[RecvWr::new(1, &[dst.sge(0..64)]), RecvWr::new(2, &[dst.sge(0..64)])]).unwrap();
        let src = p.a.pd.reg_mr(vec![1; 8], Access::LOCAL_WRITE).unwrap();
        let (rkey, want) = if enabled {
            (dst.rkey() ^ 0x0100, WcStatus::RemAccessErr)
        } else {
            p.b.qp.modify(&QpAttr::new(QpState::Rts).access(Access::REMOTE_READ)).unwrap();
            (dst.rkey(), WcStatus::RemInvReqErr)
        };
        p.a.qp.post_send(&[SendWr::rdma_write(10, &[src.sge(0..8)], dst.addr(), rkey).imm(7).signaled()]).unwrap();
        p.run(RUN);
        let wb: Vec<_> = poll_all(&p.b.cq).iter().map(|w| (w.wr_id, w.status)).collect();
        assert_eq!(wb.first(), Some(&(1, want)), "enabled {enabled}: {wb:?}");
        assert_eq!(poll_all(&p.a.cq).first().map(|w| w.status), Some(want), "enabled {enabled}");
        assert_eq!(p.b.qp.state().unwrap(), QpState::Error);
    }
}

/// A QP on an SRQ has no receive queue of its own: Create QP does not judge receive sizes it
/// will never use (rxe's `rxe_qp_chk_cap` skips them too) and the QP reports 0 for them, as
/// rxe does, where the same sizes without an SRQ are refused; a Modify QP's receive size is
/// ignored likewise. The largest sizes there are must not make anything for them.
/// Rule CRT-QP-8, CRT-QP-9
#[test]
fn a_qp_on_an_srq_ignores_receive_sizes() {
    let p = Pair::new(QpType::Rc, Mtu::Mtu1024);
    let srq = p.b.pd.create_srq(&SrqInitAttr::default()).unwrap();
    let dev = p.b.ctx.query_device().unwrap();
    let plain =
        QpInitAttr::new(QpType::Rc, &p.b.cq, &p.b.cq).max_recv_wr(dev.max_qp_wr + 1).max_recv_sge(dev.max_sge + 1);
    assert!(p.b.pd.create_qp(&plain).is_err(), "without an SRQ the sizes are judged");
    let on_srq = QpInitAttr::new(QpType::Rc, &p.b.cq, &p.b.cq).max_recv_wr(u32::MAX).max_recv_sge(u32::MAX).srq(&srq);
    let qp = p.b.pd.create_qp(&on_srq).unwrap();
    let cap = qp.query().unwrap().cap;
    assert_eq!((cap.max_recv_wr, cap.max_recv_sge), (0, 0));
    qp.modify(&QpAttr::to_init().port(1).pkey_index(0).access(Access::REMOTE_WRITE)).unwrap();
    let av = AddressVector::new(AhAttr::roce(p.a.gid, 0), Mtu::Mtu1024);
    let mut resize = QpAttr::to_rtr(av, p.a.qp.qp_num()).rq_psn(0).max_dest_rd_atomic(1);
    resize.cap = Some(WqSizes { max_send_wr: 16, max_recv_wr: u32::MAX });
    qp.modify(&resize).unwrap();
    assert_eq!(qp.query().unwrap().cap.max_recv_wr, 0);
    qp.destroy().unwrap();
}
