//! End-to-end credits (IBA 9.7.7.2): an RC requester honours the credit count the responder
//! advertises in its ACKs (PKT-ACK-11). A Send or a Write with Immediate starts only while its
//! SSN is within the Limit Sequence Number (the ACK's MSN plus its credits), or one past it:
//! the probe a requester without credits may send. Code 31 (no credit information, as a QP
//! on an SRQ sends) lifts the limit. Before the first ACK there is no limit (softhca's
//! choice: the digest is silent on the initial credits).

mod common;

use common::pair::*;
use common::poll_all;
use softhca::wire::{Opcode, Syndrome};
use softhca::*;

const RUN: u64 = 10_000_000_000;

fn sends(p: &Pair) -> Vec<u32> {
    p.sent_by(true).into_iter().filter(|k| k.opcode == Opcode::RcSendOnly).map(|k| k.psn).collect()
}

fn rnr_naks(p: &Pair) -> usize {
    p.sent_by(false).into_iter().filter(|k| matches!(k.syndrome, Some(Syndrome::RnrNak { .. }))).count()
}

/// A responder that posts its receives slowly: with one receive left, a requester holding 20
/// Sends sends one (its credit) and one probe, not 20; each receive posted later lets the
/// probe in and the next probe out; all 20 complete, in order. The responder sends one RNR NAK
/// per probe that finds no receive, and no Send ever goes out beyond the probe: the only
/// repeated Sends are the probes sent again after their RNR wait.
#[test]
fn a_slow_responder_gets_probes_not_a_flood() {
    // RNR NAK timer code 13: 0.96 ms.
    let o = Opts { rnr_retry: 7, min_rnr_timer: 13, ..Opts::default() };
    let mut p = Pair::with(QpType::Rc, Mtu::Mtu1024, o);
    let src = p.a.pd.alloc_mr(64 * 21, Access::LOCAL_WRITE).unwrap();
    let dst = p.b.pd.alloc_mr(64 * 21, Access::LOCAL_WRITE).unwrap();
    // One Send while b has two receives: its ACK reports 1 credit (MSN 1 + 1 = LSN 2).
    p.b.qp.post_recv(&[RecvWr::new(0, &[dst.sge(0..64)]), RecvWr::new(1, &[dst.sge(64..128)])]).unwrap();
    p.a.qp.post_send(&[SendWr::send(0, &[src.sge(0..64)]).signaled()]).unwrap();
    p.run(RUN);
    let first = sends(&p)[0];
    assert_eq!(poll_all(&p.a.cq).len(), 1);
    p.clear_trace();

    let sges: Vec<_> = (1..=20usize).map(|i| [src.sge(i * 64..(i + 1) * 64)]).collect();
    let wrs: Vec<_> = sges.iter().enumerate().map(|(i, s)| SendWr::send(i as u64 + 1, s).signaled()).collect();
    p.a.qp.post_send(&wrs).unwrap();
    // Only until the first RNR wait ends: SSN 2 on its credit, SSN 3 as the probe.
    p.run(1_000);
    assert_eq!(sends(&p), vec![first + 1, first + 2], "one credited Send and one probe");
    assert!(p.a.qp.counters().credit_waits > 0);

    // The rest go as receives appear: each posted receive lets the probe (or its retry) in.
    for i in 2..=20u64 {
        p.b.qp.post_recv(&[RecvWr::new(i, &[dst.sge(i as usize * 64..(i as usize + 1) * 64)])]).unwrap();
        p.run(2_000_000); // past one RNR wait
    }
    p.run(RUN);
    let w = poll_all(&p.a.cq);
    assert_eq!(
        w.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        (1..=20).map(|i| (i, WcStatus::Success)).collect::<Vec<_>>()
    );
    assert_eq!(poll_all(&p.b.cq).len(), 21);
    // The first probe, and each probe after a receive let the one before it in, found none
    // (some more than once, retried after their RNR wait before the next receive came).
    assert!(rnr_naks(&p) >= 19, "{} RNR NAKs", rnr_naks(&p));
    let sent = sends(&p);
    assert_eq!(sent.len(), 20 + rnr_naks(&p), "each Send once, and each NAKed probe once more: {sent:?}");
}

/// Credits count only what takes a receive WQE: RDMA Writes (without Immediate) are not held
/// back by an exhausted credit count.
#[test]
fn writes_are_not_limited_by_credits() {
    let o = Opts { access: Access::LOCAL_WRITE | Access::REMOTE_WRITE, ..Opts::default() };
    let mut p = Pair::with(QpType::Rc, Mtu::Mtu1024, o);
    let src = p.a.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    let dst = p.b.pd.alloc_mr(64 * 16, Access::LOCAL_WRITE | Access::REMOTE_WRITE).unwrap();
    p.b.qp.post_recv(&[RecvWr::new(0, &[dst.sge(0..64)])]).unwrap();
    p.a.qp.post_send(&[SendWr::send(0, &[src.sge(0..64)]).signaled()]).unwrap();
    p.run(RUN); // its ACK: MSN 1, no credits left (LSN 1)
    poll_all(&p.a.cq);
    p.clear_trace();
    let sge = [src.sge(0..64)];
    let wrs: Vec<_> =
        (0..16u64).map(|i| SendWr::rdma_write(i, &sge, dst.addr() + i * 64, dst.rkey()).signaled()).collect();
    p.a.qp.post_send(&wrs).unwrap();
    p.run(1_000);
    let writes = p.sent_by(true).into_iter().filter(|k| k.opcode == Opcode::RcRdmaWriteOnly).count();
    assert_eq!(writes, 16, "all Writes go at once");
    p.run(RUN);
    assert_eq!(poll_all(&p.a.cq).len(), 16);
    assert_eq!(p.a.qp.counters().credit_waits, 0);
}
