//! Atomic Write (IBA 1.5, RC opcode 0x1D; rxe's since Linux 6.2, `ibv_wr_atomic_write`): the
//! digest has no rule of its own for it, so these tests hold it to the spec's operation as rxe
//! implements it. An RETH and 8 bytes out; at the responder Remote Write is needed (QP and
//! region), the word must be aligned, and the bytes land in one store; the answer is an RDMA
//! Read Response Only with no payload; the operation takes a responder resource, so a
//! duplicate is answered again and never executed again.

mod common;

use common::pair::*;
use common::poll_all;
use softhca::wire::{NakCode, Opcode, Syndrome};
use softhca::*;

const RUN: u64 = 1_000_000_000;

fn all_access() -> Access {
    Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC
}

/// An Atomic Write of inline `data`.
fn inline<'a>(wr_id: u64, data: &'a [u8], remote_addr: u64, rkey: u32) -> SendWr<'a> {
    SendWr { inline_data: data, ..SendWr::atomic_write(wr_id, &[], remote_addr, rkey) }.inline()
}

fn word(mr: &Mr, at: usize) -> u64 {
    let mut b = [0u8; 8];
    mr.read(at, &mut b).unwrap();
    u64::from_ne_bytes(b)
}

/// What b sent: each packet's opcode, PSN, payload length and AETH syndrome.
fn answers(p: &Pair) -> Vec<(Opcode, u32, usize, Option<Syndrome>)> {
    p.sent_by(false).into_iter().map(|k| (k.opcode, k.psn, k.payload_len, k.syndrome)).collect()
}

/// From a gather list and inline: the word lands as the bytes were, the requester completes
/// with `AtomicWrite` and 8 bytes, and the answer is one RDMA Read Response Only, empty, with
/// an ACK syndrome.
/// Rule QPS-RTS-2
#[test]
fn an_atomic_write_lands_its_word_and_is_answered_by_an_empty_read_response() {
    let mut p = Pair::new(QpType::Rc, Mtu::Mtu1024);
    let src = p.a.pd.reg_mr(0x1122_3344_5566_7788u64.to_ne_bytes().to_vec(), Access::LOCAL_WRITE).unwrap();
    let dst = p.b.pd.alloc_mr(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE).unwrap();
    p.a.qp.post_send(&[SendWr::atomic_write(1, &[src.sge(0..8)], dst.addr() + 16, dst.rkey()).signaled()]).unwrap();
    p.run(RUN);
    let w = poll_all(&p.a.cq);
    assert_eq!((w.len(), w[0].status, w[0].opcode, w[0].byte_len), (1, WcStatus::Success, WcOpcode::AtomicWrite, 8));
    assert_eq!(word(&dst, 16), 0x1122_3344_5566_7788);
    assert_eq!(word(&dst, 8), 0, "only the word");
    let sent = p.sent_by(true);
    assert_eq!((sent[0].opcode, sent[0].payload_len, sent[0].ack_req), (Opcode::RcAtomicWrite, 8, true));
    let a = answers(&p);
    assert_eq!(a.len(), 1, "{a:?}");
    assert_eq!((a[0].0, a[0].1, a[0].2), (Opcode::RcRdmaReadResponseOnly, sent[0].psn, 0));
    assert!(a[0].3.is_some_and(|s| s.is_ack()));

    // Inline, behind a Write it must not pass: both land, in order.
    let data = 0xfeed_face_cafe_beefu64.to_ne_bytes();
    let big = p.a.pd.reg_mr(vec![7u8; 32], Access::LOCAL_WRITE).unwrap();
    p.a.qp
        .post_send(&[
            SendWr::rdma_write(2, &[big.sge(0..32)], dst.addr() + 24, dst.rkey()),
            inline(3, &data, dst.addr() + 56, dst.rkey()).signaled(),
        ])
        .unwrap();
    p.run(RUN);
    let w = poll_all(&p.a.cq);
    assert_eq!(w.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(), vec![(3, WcStatus::Success)]);
    assert_eq!(word(&dst, 56), u64::from_ne_bytes(data));
    assert_eq!(dst.to_vec().unwrap()[24..56], [7u8; 32]);
}

/// The responder's refusals: a misaligned word is an Invalid Request (as a misaligned Atomic),
/// a QP without Remote Write enabled too, a region without Remote Write is a Remote Access
/// Error; nothing lands.
/// Rule ERR-RQ-5, ERR-RQ-9, MOD-ACC-2
#[test]
fn a_misaligned_word_or_missing_remote_write_is_refused() {
    let cases: [(Access, Access, u64, NakCode, WcStatus); 3] = [
        (all_access(), all_access(), 4, NakCode::InvalidRequest, WcStatus::RemInvReqErr),
        (Access::REMOTE_READ | Access::REMOTE_ATOMIC, all_access(), 0, NakCode::InvalidRequest, WcStatus::RemInvReqErr),
        (
            all_access(),
            Access::LOCAL_WRITE | Access::REMOTE_ATOMIC | Access::REMOTE_READ,
            0,
            NakCode::RemoteAccessError,
            WcStatus::RemAccessErr,
        ),
    ];
    for (qp_access, mr_access, offset, nak, status) in cases {
        let o = Opts { access: qp_access, ..Opts::default() };
        let mut p = Pair::with(QpType::Rc, Mtu::Mtu1024, o);
        let dst = p.b.pd.alloc_mr(64, mr_access).unwrap();
        dst.write(0, &[0xAA; 64]).unwrap();
        let data = 1u64.to_ne_bytes();
        p.a.qp.post_send(&[inline(1, &data, dst.addr() + offset, dst.rkey()).signaled()]).unwrap();
        p.run(RUN);
        let a = answers(&p);
        assert_eq!(
            a.iter().map(|x| (x.0, x.3)).collect::<Vec<_>>(),
            vec![(Opcode::RcAcknowledge, Some(Syndrome::Nak(nak)))]
        );
        assert_eq!(poll_all(&p.a.cq)[0].status, status, "{qp_access:?} {mr_access:?} +{offset}");
        assert_eq!(dst.to_vec().unwrap(), vec![0xAA; 64], "nothing landed");
        assert_eq!(p.b.qp.state().unwrap(), QpState::Error);
    }
}

/// Its answer lost, the requester sends it again: the responder answers the duplicate from its
/// resource and does not store the word again (a value the program wrote there since stays).
/// Rule PKT-DUP-4, PKT-RTY-1
#[test]
fn a_duplicate_is_answered_again_and_not_executed_again() {
    let mut p = Pair::new(QpType::Rc, Mtu::Mtu1024);
    let dst = p.b.pd.alloc_mr(8, Access::LOCAL_WRITE | Access::REMOTE_WRITE).unwrap();
    let mut dropped = false;
    p.filter = Some(Box::new(move |from_a, d| {
        let answer =
            !from_a && softhca::wire::roce::parse_ip(d).unwrap().packet.bth.opcode == Opcode::RcRdmaReadResponseOnly;
        let keep = !answer || dropped;
        dropped |= answer;
        keep
    }));
    let data = 5u64.to_ne_bytes();
    p.a.qp.post_send(&[inline(1, &data, dst.addr(), dst.rkey()).signaled()]).unwrap();
    // Less than the Local ACK timeout: executed, its answer dropped, the requester waiting.
    p.run(1_000_000);
    assert!(poll_all(&p.a.cq).is_empty());
    assert_eq!(word(&dst, 0), 5);
    dst.write(0, &9u64.to_ne_bytes()).unwrap();
    p.run(RUN);
    let w = poll_all(&p.a.cq);
    assert_eq!((w.len(), w[0].status), (1, WcStatus::Success));
    assert_eq!(word(&dst, 0), 9, "the duplicate was not executed");
    let requests = p.sent_by(true).into_iter().filter(|k| k.opcode == Opcode::RcAtomicWrite).count();
    let answered = answers(&p).into_iter().filter(|x| x.0 == Opcode::RcRdmaReadResponseOnly).count();
    assert_eq!((requests, answered), (2, 2));
}

/// Post-time checks: RC only (UC, UD and an XRC initiator have no opcode for it), and exactly
/// 8 bytes.
/// Rule WR-SQ-4
#[test]
fn only_rc_posts_it_and_only_with_eight_bytes() {
    for t in [QpType::Uc, QpType::Ud] {
        let p = Pair::new(t, Mtu::Mtu1024);
        let data = [0u8; 8];
        let e = p.a.qp.post_send(&[inline(1, &data, 0, 0)]).unwrap_err();
        assert_eq!(e.error, VerbsError::InvalidWrType, "{t:?}");
    }
    let p = Pair::new(QpType::Rc, Mtu::Mtu1024);
    let src = p.a.pd.alloc_mr(16, Access::LOCAL_WRITE).unwrap();
    for len in [0, 4, 16] {
        let e = p.a.qp.post_send(&[SendWr::atomic_write(1, &[src.sge(0..len)], 0, 0)]).unwrap_err();
        assert!(matches!(e.error, VerbsError::InvalidWr(_)), "{len}: {e:?}");
    }
    assert!(!softhca::verbs::wr::wr_allowed(QpType::XrcSend, WrOpcode::AtomicWrite));
    assert!(softhca::verbs::wr::wr_allowed(QpType::XrcSend, WrOpcode::AtomicFetchAdd));
}
