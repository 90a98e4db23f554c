//! What is left unknown after an SQ error (ERR-UNK): the requester gave up on a message (here:
//! every response of the responder lost, retries exhausted) that the responder may well have
//! executed. Each test shows softhca landing on one of the outcomes the rule allows, and the
//! requester reporting the error all the same. And a WQE rejected for an inconsistency inside
//! the QP (ERR-SQ-14).

mod common;

use std::cell::Cell;
use std::rc::Rc;

use common::pair::*;
use common::poll_all;
use softhca::*;

const RUN: u64 = 60_000_000_000;

/// An RC pair whose requester retries once, quickly, and a filter that drops every packet b
/// sends (its ACKs and responses) once `cut` is set.
fn cut_pair(cut: Rc<Cell<bool>>) -> Pair {
    let mut p = Pair::with(QpType::Rc, Mtu::Mtu1024, Opts { timeout: 4, retry_cnt: 1, ..Opts::default() });
    p.filter = Some(Box::new(move |from_a, _| from_a || !cut.get()));
    p
}

/// A Send whose ACKs are lost completes in error at the requester, while the responder
/// received it whole and wrote its receive CQE (once: the retransmission is a duplicate).
/// Rule ERR-UNK-1, PKT-RTY-4, PKT-DUP-1
#[test]
fn a_failed_send_may_have_been_received() {
    let cut = Rc::new(Cell::new(true));
    let mut p = cut_pair(cut);
    let dst = p.b.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    p.b.qp.post_recv(&[RecvWr::new(1, &[dst.sge(0..64)])]).unwrap();
    let src = p.a.pd.reg_mr(vec![0x42; 32], Access::LOCAL_WRITE).unwrap();
    p.a.qp.post_send(&[SendWr::send(9, &[src.sge(0..32)]).signaled()]).unwrap();
    p.run(RUN);
    let a: Vec<_> = poll_all(&p.a.cq).iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(a, vec![(9, WcStatus::RetryExcErr)]);
    let b = poll_all(&p.b.cq);
    assert_eq!(b.iter().map(|w| (w.wr_id, w.status, w.byte_len)).collect::<Vec<_>>(), vec![(1, WcStatus::Success, 32)]);
    assert!(dst.to_vec().unwrap()[..32].iter().all(|x| *x == 0x42));
}

/// A Write with Immediate whose ACKs are lost: the requester reports the error, while the
/// remote memory was written and the remote RQ CQE with the immediate data exists.
/// Rule ERR-UNK-3
#[test]
fn a_failed_write_may_have_landed_with_its_immediate() {
    let cut = Rc::new(Cell::new(true));
    let mut p = cut_pair(cut);
    let dst = p.b.pd.alloc_mr(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE).unwrap();
    p.b.qp.post_recv(&[RecvWr::new(1, &[])]).unwrap();
    let src = p.a.pd.reg_mr(vec![0x17; 3000], Access::LOCAL_WRITE).unwrap();
    let sg = [src.sge(0..3000)];
    let wr = SendWr::rdma_write(9, &sg, dst.addr() + 100, dst.rkey()).imm(0xABCD).signaled();
    p.a.qp.post_send(&[wr]).unwrap();
    p.run(RUN);
    assert_eq!(poll_all(&p.a.cq).iter().map(|w| w.status).collect::<Vec<_>>(), vec![WcStatus::RetryExcErr]);
    let got = dst.to_vec().unwrap();
    assert!(got[100..3100].iter().all(|x| *x == 0x17) && got[..100].iter().all(|x| *x == 0));
    let b = poll_all(&p.b.cq);
    assert_eq!(b.len(), 1);
    assert_eq!((b[0].opcode, b[0].imm_data, b[0].status), (WcOpcode::RecvRdmaWithImm, 0xABCD, WcStatus::Success));
}

/// A Fetch & Add whose Atomic ACK is lost: the requester reports the error, while the remote
/// word was added to, once (the retransmission is answered from the saved result, never
/// executed again), and the local buffer was not written.
/// Rule ERR-UNK-4, PKT-DUP-4
#[test]
fn a_failed_atomic_may_have_executed_remotely() {
    let cut = Rc::new(Cell::new(true));
    let mut p = cut_pair(cut);
    let word = p.b.pd.reg_mr(100u64.to_ne_bytes().to_vec(), Access::LOCAL_WRITE | Access::REMOTE_ATOMIC).unwrap();
    let local = p.a.pd.reg_mr(vec![0xEE; 8], Access::LOCAL_WRITE).unwrap();
    p.a.qp
        .post_send(&[SendWr::atomic_fetch_add(9, &[local.sge(0..8)], word.addr(), word.rkey(), 5).signaled()])
        .unwrap();
    p.run(RUN);
    assert_eq!(poll_all(&p.a.cq).iter().map(|w| w.status).collect::<Vec<_>>(), vec![WcStatus::RetryExcErr]);
    assert_eq!(u64::from_ne_bytes(word.to_vec().unwrap().try_into().unwrap()), 105, "executed once");
}

/// An RDMA Read whose later responses are lost: the requester reports the error after its
/// retries, and its scatter buffer holds what the responses that did arrive put there (part of
/// the data, the rest untouched): contents the consumer must treat as undefined.
/// Rule ERR-UNK-2
#[test]
fn a_failed_read_leaves_its_buffer_partly_written() {
    let cut = Rc::new(Cell::new(false));
    let mut p = cut_pair(cut.clone());
    let first_only = Rc::new(Cell::new(0u32));
    let (c, n) = (cut.clone(), first_only.clone());
    // Let the first response of b through, then drop everything b sends.
    p.filter = Some(Box::new(move |from_a, _| {
        if from_a {
            return true;
        }
        n.set(n.get() + 1);
        if n.get() > 1 {
            c.set(true);
        }
        !c.get()
    }));
    let remote = p.b.pd.reg_mr(vec![0x99; 3000], Access::LOCAL_WRITE | Access::REMOTE_READ).unwrap();
    let local = p.a.pd.alloc_mr(3000, Access::LOCAL_WRITE).unwrap();
    p.a.qp.post_send(&[SendWr::rdma_read(9, &[local.sge(0..3000)], remote.addr(), remote.rkey()).signaled()]).unwrap();
    p.run(RUN);
    assert_eq!(poll_all(&p.a.cq).iter().map(|w| w.status).collect::<Vec<_>>(), vec![WcStatus::RetryExcErr]);
    let got = local.to_vec().unwrap();
    assert!(got[..1024].iter().all(|x| *x == 0x99), "the response that arrived was placed");
    assert!(got[2048..].iter().all(|x| *x == 0), "the last one never came");
}

/// A UD Send whose address handle names a source GID slot that has since been emptied cannot
/// be addressed: an inconsistency inside the QP, not the consumer's request, so the WQE
/// completes with Local QP Operation Error (and the QP moves to SQE).
/// Rule ERR-SQ-14, ERR-SQ-1
#[test]
fn a_send_the_qp_cannot_address_is_a_local_qp_operation_error() {
    let mut p = Pair::new(QpType::Ud, Mtu::Mtu1024);
    let ah = p.a.pd.create_ah(&AhAttr::roce(p.b.gid, 0)).unwrap();
    p.a.ctx.set_gid(0, Gid::default()).unwrap(); // the port's address goes away
    let src = p.a.pd.reg_mr(vec![1; 8], Access::LOCAL_WRITE).unwrap();
    let bq = p.b.qp.qp_num();
    p.a.qp.post_send(&[SendWr::send(9, &[src.sge(0..8)]).ud(&ah, bq, 0x1111).signaled()]).unwrap();
    p.run(RUN);
    assert_eq!(
        poll_all(&p.a.cq).iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        vec![(9, WcStatus::LocQpOpErr)]
    );
    assert_eq!(p.a.qp.state().unwrap(), QpState::Sqe);
    assert!(p.sent_by(true).is_empty(), "nothing went out");
}
