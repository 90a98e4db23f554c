//! Posting rules per QP state (QPS) and post-time work request validation (WR), which need no
//! traffic.

mod common;

use common::*;
use softhca::*;

fn send_ids(wcs: &[Wc]) -> Vec<u64> {
    wcs.iter().map(|w| w.wr_id).collect()
}

/// Rule QPS-RESET-2, QPS-RESET-3, QPS-INIT-3, QPS-RTR-4
#[test]
fn immediate_errors_before_rts() {
    let f = fixture();
    let sges = [];
    for s in [QpState::Reset, QpState::Init, QpState::Rtr] {
        for t in [QpType::Rc, QpType::Uc, QpType::Ud] {
            let qp = f.qp_in(t, s);
            let e = qp.post_send(&[SendWr::send(1, &sges)]).unwrap_err();
            assert_eq!(e, PostError { index: 0, error: VerbsError::InvalidQpState });
            if s == QpState::Reset {
                assert_eq!(qp.post_recv(&[RecvWr::new(1, &sges)]).unwrap_err().error, VerbsError::InvalidQpState);
            }
            assert_eq!(qp.outstanding().unwrap().0, 0);
        }
    }
    assert!(f.cq.is_empty().unwrap(), "an immediate error produces no CQE");
}

/// Rule QPS-INIT-1, QPS-INIT-2, QPS-INIT-5, QPS-RTR-1
#[test]
fn receives_are_held_from_init_in_post_order() {
    let f = fixture();
    let qp = f.qp_in(QpType::Rc, QpState::Init);
    let sges = [];
    qp.post_recv(&[RecvWr::new(1, &sges), RecvWr::new(2, &sges)]).unwrap();
    assert_eq!(qp.outstanding().unwrap(), (0, 2), "queued, none consumed");
    drive_from_init_to_rtr(&qp);
    qp.post_recv(&[RecvWr::new(3, &sges)]).unwrap();
    assert_eq!(qp.outstanding().unwrap(), (0, 3));
    // The order they are held in shows when they are flushed.
    qp.modify(&QpAttr::to_error()).unwrap();
    assert_eq!(send_ids(&poll_all(&f.cq)), vec![1, 2, 3]);
}

fn drive_from_init_to_rtr(qp: &Qp) {
    qp.modify(&attr_with(QpState::Rtr, required(qp.qp_type(), QpState::Rtr))).unwrap();
}

/// Rule QPS-RTS-1, QPS-SQD-1, QPS-SQD-2
#[test]
fn rts_and_sqd_accept_both_queues() {
    let f = fixture();
    let sges = [];
    for s in [QpState::Rts, QpState::Sqd] {
        let qp = f.qp_in(QpType::Rc, s);
        qp.post_send(&[SendWr::send(1, &sges)]).unwrap();
        qp.post_recv(&[RecvWr::new(2, &sges)]).unwrap();
        assert_eq!(qp.outstanding().unwrap(), (1, 1));
        assert_eq!(qp.state().unwrap(), s);
    }
}

/// Rule QPS-ERR-3, QPS-ERR-4, ERR-FLUSH-5, WR-COM-4, WR-COM-1
#[test]
fn posting_in_error_flushes_each_wr_in_order() {
    let f = fixture();
    let qp = f.qp_in(QpType::Rc, QpState::Error);
    let sges = [];
    qp.post_send(&[SendWr::send(10, &sges), SendWr::rdma_write(11, &sges, 0, 0)]).unwrap();
    qp.post_recv(&[RecvWr::new(12, &sges)]).unwrap();
    qp.post_send(&[SendWr::send(u64::MAX, &sges)]).unwrap();
    let wcs = poll_all(&f.cq);
    assert_eq!(send_ids(&wcs), vec![10, 11, 12, u64::MAX]);
    assert!(wcs.iter().all(|w| w.status == WcStatus::WrFlushErr && w.qp_num == qp.qp_num()));
    assert_eq!(qp.outstanding().unwrap(), (0, 0));
}

/// Entering Error flushes both queues, each in post order, unsignaled WRs included.
/// Rule ERR-FLUSH-1, ERR-FLUSH-3, ERR-FLUSH-4, ERR-FLUSH-6, QPT-SW-8, WR-COM-4
#[test]
fn entering_error_flushes_everything_outstanding() {
    let f = fixture();
    let rcq = f.ctx.create_cq(64).unwrap();
    let qp = f.pd.create_qp(&QpInitAttr::rc(&f.cq, &rcq)).unwrap();
    drive(&qp, QpState::Init);
    let sges = [];
    qp.post_recv(&[RecvWr::new(1, &sges), RecvWr::new(2, &sges)]).unwrap();
    drive_from_init_to_rtr(&qp);
    qp.modify(&attr_with(QpState::Rts, required(QpType::Rc, QpState::Rts))).unwrap();
    qp.modify(&QpAttr::to_sqd()).unwrap();
    qp.post_send(&[SendWr::send(3, &sges), SendWr::send(4, &sges).signaled()]).unwrap();
    qp.post_recv(&[RecvWr::new(5, &sges)]).unwrap();
    assert!(f.cq.is_empty().unwrap(), "SQD holds the sends");
    qp.modify(&QpAttr::to_error()).unwrap();
    let s = poll_all(&f.cq);
    let r = poll_all(&rcq);
    assert_eq!(send_ids(&s), vec![3, 4]);
    assert_eq!(send_ids(&r), vec![1, 2, 5]);
    assert!(s.iter().chain(&r).all(|w| w.status == WcStatus::WrFlushErr));
    assert_eq!(s[0].opcode, WcOpcode::Send);
    assert_eq!(qp.outstanding().unwrap(), (0, 0));
}

/// Entering Reset discards both queues without CQEs and removes this QP's CQEs only.
/// Rule QPS-RESET-5, QPS-RESET-6, QPS-RESET-7, QPT-SW-7
#[test]
fn entering_reset_empties_queues_and_purges_own_cqes() {
    let f = fixture();
    let a = f.qp_in(QpType::Rc, QpState::Error);
    let b = f.qp_in(QpType::Uc, QpState::Error);
    let sges = [];
    a.post_send(&[SendWr::send(1, &sges)]).unwrap();
    b.post_send(&[SendWr::send(2, &sges)]).unwrap();
    a.post_recv(&[RecvWr::new(3, &sges)]).unwrap();
    b.post_recv(&[RecvWr::new(4, &sges)]).unwrap();
    a.post_send(&[SendWr::send(5, &sges)]).unwrap();
    let c = f.qp_in(QpType::Rc, QpState::Rts);
    c.post_send(&[SendWr::send(6, &sges)]).unwrap();
    c.post_recv(&[RecvWr::new(7, &sges)]).unwrap();

    a.modify(&QpAttr::to_reset()).unwrap();
    c.modify(&QpAttr::to_reset()).unwrap();
    assert_eq!(c.outstanding().unwrap(), (0, 0));
    assert_eq!(send_ids(&poll_all(&f.cq)), vec![2, 4], "b's CQEs stay, in order; none for c's WQEs");
    // A QP back in Reset starts again from scratch.
    drive(&c, QpState::Rts);
    assert_eq!(c.outstanding().unwrap(), (0, 0));
}

/// Rule WR-SQ-1, WR-SQ-2, WR-SQ-3, WR-SQ-4, WR-SQ-5, WR-SQ-7
#[test]
fn operations_allowed_per_service_type() {
    let f = fixture();
    let mr = f.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    let ah = f.pd.create_ah(&remote_av().ah).unwrap();
    let sge = [mr.sge(0..8)];
    let base = |op: WrOpcode| SendWr { opcode: op, sg_list: &sge, ..Default::default() }.ud(&ah, 2, 0x11);
    use WrOpcode as O;
    // RC, UC, UD
    let table: [(WrOpcode, [bool; 3]); 7] = [
        (O::Send, [true, true, true]),
        (O::SendWithImm, [true, true, true]),
        (O::RdmaWrite, [true, true, false]),
        (O::RdmaWriteWithImm, [true, true, false]),
        (O::RdmaRead, [true, false, false]),
        (O::AtomicCmpSwp, [true, false, false]),
        (O::AtomicFetchAdd, [true, false, false]),
    ];
    for (i, t) in [QpType::Rc, QpType::Uc, QpType::Ud].into_iter().enumerate() {
        let qp = f.qp_in(t, QpState::Rts);
        for (op, ok) in table {
            let r = qp.post_send(&[base(op)]);
            if ok[i] {
                r.unwrap_or_else(|e| panic!("{t:?} {op:?}: {e}"));
            } else {
                assert_eq!(r.unwrap_err().error, VerbsError::InvalidWrType, "{t:?} {op:?}");
            }
        }
        // Memory window binds: valid on RC and UC (this one lacks its window), never on UD.
        let r = qp.post_send(&[base(O::BindMw)]).unwrap_err().error;
        if t == QpType::Ud {
            assert_eq!(r, VerbsError::InvalidWrType);
        } else {
            assert!(matches!(r, VerbsError::InvalidWr(_)), "{r:?}");
        }
        assert_eq!(qp.post_send(&[base(O::Resync)]).unwrap_err().error, VerbsError::InvalidWrType);
    }
}

/// Rule WR-COM-7, WR-COM-8
#[test]
fn sge_count_and_queue_depth() {
    let f = fixture();
    let init = QpInitAttr::rc(&f.cq, &f.cq).max_send_wr(3).max_recv_wr(2).max_send_sge(2).max_recv_sge(1);
    let qp = f.pd.create_qp(&init).unwrap();
    drive(&qp, QpState::Rts);
    let mr = f.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    let three = [mr.sge(0..1), mr.sge(1..2), mr.sge(2..3)];
    assert_eq!(qp.post_send(&[SendWr::send(1, &three)]).unwrap_err().error, VerbsError::MaxSgeExceeded);
    assert_eq!(qp.post_recv(&[RecvWr::new(1, &three[..2])]).unwrap_err().error, VerbsError::MaxSgeExceeded);
    let two = &three[..2];
    qp.post_send(&[SendWr::send(1, two), SendWr::send(2, two)]).unwrap();
    let e = qp.post_send(&[SendWr::send(3, two), SendWr::send(4, two)]).unwrap_err();
    assert_eq!(e, PostError { index: 1, error: VerbsError::QueueFull });
    assert_eq!(qp.outstanding().unwrap().0, 2, "all or nothing");
    qp.post_send(&[SendWr::send(3, two)]).unwrap();
    assert_eq!(qp.post_send(&[SendWr::send(4, two)]).unwrap_err().error, VerbsError::QueueFull);
    qp.post_recv(&[RecvWr::new(1, &three[..1]), RecvWr::new(2, &[])]).unwrap();
    assert_eq!(qp.post_recv(&[RecvWr::new(3, &[])]).unwrap_err().error, VerbsError::QueueFull);
}

/// Rule WR-ATOM-3, WR-WRITE-4
#[test]
fn atomic_operands_and_message_length_are_checked_at_post() {
    let f = fixture();
    let qp = f.qp_in(QpType::Rc, QpState::Rts);
    let mr = f.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    let eight = [mr.sge(0..8)];
    let four = [mr.sge(0..4)];
    let two_eights = [mr.sge(0..8), mr.sge(8..16)];
    for sg in [&four[..], &two_eights[..], &[][..]] {
        let e = qp.post_send(&[SendWr::atomic_fetch_add(1, sg, 0x1000, 1, 1)]).unwrap_err();
        assert!(matches!(e.error, VerbsError::InvalidWr(_)), "{e:?}");
        let e = qp.post_send(&[SendWr::atomic_cmp_swp(1, sg, 0x1000, 1, 1, 2)]).unwrap_err();
        assert!(matches!(e.error, VerbsError::InvalidWr(_)));
    }
    qp.post_send(&[SendWr::atomic_fetch_add(1, &eight, 0x1000, 1, 1)]).unwrap();
    let huge = [Sge { addr: 0, length: u32::MAX, lkey: 0 }];
    let e = qp.post_send(&[SendWr::rdma_read(2, &huge, 0, 0)]).unwrap_err();
    assert!(matches!(e.error, VerbsError::InvalidWr(_)));
    let e = qp.post_send(&[SendWr::rdma_write(2, &huge, 0, 0)]).unwrap_err();
    assert!(matches!(e.error, VerbsError::InvalidWr(_)));
    let exactly = [Sge { addr: 0, length: 1 << 31, lkey: 0 }];
    qp.post_send(&[SendWr::rdma_write(3, &exactly, 0, 0)]).unwrap();
}

#[test]
fn inline_and_ud_address_checks() {
    let f = fixture();
    let qp = f.pd.create_qp(&QpInitAttr::ud(&f.cq, &f.cq).max_inline_data(16)).unwrap();
    drive(&qp, QpState::Rts);
    let ah = f.pd.create_ah(&remote_av().ah).unwrap();
    let e = qp.post_send(&[SendWr::send_inline(1, &[0; 8])]).unwrap_err();
    assert!(matches!(e.error, VerbsError::InvalidWr(_)), "UD without an AH");
    qp.post_send(&[SendWr::send_inline(1, &[0; 16]).ud(&ah, 5, 0x11)]).unwrap();
    let e = qp.post_send(&[SendWr::send_inline(2, &[0; 17]).ud(&ah, 5, 0x11)]).unwrap_err();
    assert!(matches!(e.error, VerbsError::InvalidWr(_)));
    let other_pd = f.ctx.alloc_pd().unwrap();
    let foreign = other_pd.create_ah(&remote_av().ah).unwrap();
    let e = qp.post_send(&[SendWr::send_inline(3, &[]).ud(&foreign, 5, 0x11)]).unwrap_err();
    assert!(matches!(e.error, VerbsError::InvalidWr(_)));
    ah.destroy().unwrap();
    let e = qp.post_send(&[SendWr::send_inline(4, &[]).ud(&ah, 5, 0x11)]).unwrap_err();
    assert_eq!(e.error, VerbsError::InvalidAhHandle);
}
