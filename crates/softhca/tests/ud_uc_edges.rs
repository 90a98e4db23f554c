//! UD and UC receive edge cases from a review: an oversized UD packet, an unusable UC receive
//! WQE.

mod common;

use common::pair::*;
use common::poll_all;
use softhca::link::sim::rewrite;
use softhca::*;

const RUN: u64 = 10_000_000_000;

static BIG: [u8; 5000] = [0xAB; 5000];

/// A UD Send Only whose payload is larger than any MTU (5000 > 4096, the port MTU) is not a
/// valid packet (PKT-LEN-1: Only carries 0 to PMTU bytes; a UD packet is always Only): the
/// responder drops it rather than scattering 5000 bytes into the receive buffer.
/// Rule PKT-LEN-1, ERR-RQ-13, DESIGN rule 6
#[test]
fn ud_send_only_above_mtu_is_dropped() {
    let mut p = Pair::new(QpType::Ud, Mtu::Mtu1024);
    let ah = p.a.pd.create_ah(&AhAttr::roce(p.b.gid, 0)).unwrap();
    let src = p.a.pd.alloc_mr(8, Access::LOCAL_WRITE).unwrap();
    let dst = p.b.pd.alloc_mr(8192, Access::LOCAL_WRITE).unwrap();
    p.b.qp.post_recv(&[RecvWr::new(1, &[dst.sge(0..8192)])]).unwrap();
    p.filter = Some(Box::new(|from_a, d| {
        if from_a {
            rewrite(d, |r| r.packet.payload = &BIG[..]).unwrap();
        }
        true
    }));
    p.a.qp.post_send(&[SendWr::send(7, &[src.sge(0..8)]).ud(&ah, p.b.qp.qp_num(), 0x1111)]).unwrap();
    p.run(RUN);
    let wb = poll_all(&p.b.cq);
    assert!(
        wb.is_empty(),
        "an oversized UD packet was accepted: {:?}",
        wb.iter().map(|w| (w.status, w.byte_len)).collect::<Vec<_>>()
    );
}

/// A UC Send into a receive WQE the responder cannot use (bad L_Key) must not wedge the QP
/// silently: RC handles it as Class A (ERR-RQ-2: the WQE completes with Local QP Operation
/// Error, the QP moves to Error) and UD completes it in error too; so does UC, instead of
/// keeping the WQE at the head and dropping every later message against it.
/// Rule ERR-RQ-2, ERR-A-2, ERR-A-3, QPT-AUTO-4
#[test]
fn uc_send_into_unusable_receive_wqe_completes_in_error() {
    let mut p = Pair::new(QpType::Uc, Mtu::Mtu1024);
    let src = p.a.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    let dst = p.b.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    let bad = Sge { lkey: dst.lkey() ^ 0x40, ..dst.sge(0..64) };
    p.b.qp.post_recv(&[RecvWr::new(1, &[bad]), RecvWr::new(2, &[dst.sge(0..64)])]).unwrap();
    p.a.qp
        .post_send(&[SendWr::send(7, &[src.sge(0..8)]).signaled(), SendWr::send(8, &[src.sge(0..8)]).signaled()])
        .unwrap();
    p.run(RUN);
    let wa: Vec<_> = poll_all(&p.a.cq).iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(wa, vec![(7, WcStatus::Success), (8, WcStatus::Success)]);
    let wb: Vec<_> = poll_all(&p.b.cq).iter().map(|w| (w.wr_id, w.status)).collect();
    assert!(
        wb.first().is_some_and(|&(id, st)| id == 1 && st != WcStatus::Success),
        "receive WR 1 never completes; b: {wb:?}, state {:?}",
        p.b.qp.state().unwrap()
    );
}

/// A UC RDMA Write with Immediate that finds no RQ WQE is silently dropped, and its packet
/// with the immediate writes nothing: an Only packet leaves the region as it was, a Last its
/// part of it (the First before it wrote, as it must have, not knowing). No CQE at either end
/// but the sender's, and the QP stays usable.
/// Rule PKT-RNR-7, PKT-UC-2
#[test]
fn uc_write_with_imm_without_a_receive_writes_nothing() {
    for len in [8usize, 1032] {
        let mut p = Pair::new(QpType::Uc, Mtu::Mtu1024);
        let src = p.a.pd.reg_mr(vec![0x11; 2048], Access::LOCAL_WRITE).unwrap();
        let dst = p.b.pd.alloc_mr(2048, Access::LOCAL_WRITE | Access::REMOTE_WRITE).unwrap();
        let sg = [src.sge(0..len)];
        let wr = SendWr::rdma_write(7, &sg, dst.addr(), dst.rkey()).imm(5).signaled();
        p.a.qp.post_send(&[wr]).unwrap();
        p.run(RUN);
        assert_eq!(poll_all(&p.a.cq).iter().map(|w| w.status).collect::<Vec<_>>(), vec![WcStatus::Success]);
        assert_eq!(poll_all(&p.b.cq), vec![], "len {len}");
        let got = dst.to_vec().unwrap();
        let first = if len > 1024 { 1024 } else { 0 };
        assert!(got[..first].iter().all(|&b| b == 0x11), "len {len}: the First packet landed");
        assert!(got[first..].iter().all(|&b| b == 0), "len {len}: the packet with the immediate wrote");
        assert_eq!(p.b.qp.state().unwrap(), QpState::Rts);
    }
}
