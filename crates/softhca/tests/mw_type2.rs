//! Type 2 memory windows and invalidation (IBA 10.6.7; libibverbs `IBV_MW_TYPE_2`,
//! `IBV_WR_LOCAL_INV`, `IBV_WR_SEND_WITH_INV`): a window bound by a Bind MW work request to the
//! QP that posted it, usable through that QP only, freed by Local Invalidate or by the peer's
//! Send with Invalidate, and every error those name. The digest has no rules of its own for
//! these; the tests name the sections of the specification they follow.

mod common;

use common::pair::*;
use common::poll_all;
use softhca::wire::{NakCode, Opcode, Syndrome};
use softhca::*;

const RUN: u64 = 10_000_000_000;

fn statuses(cq: &Cq) -> Vec<(u64, WcStatus, WcOpcode)> {
    poll_all(cq).iter().map(|w| (w.wr_id, w.status, w.opcode)).collect()
}

/// A region of b's that windows may be bound to.
fn region(p: &Pair) -> Mr {
    p.b.pd.alloc_mr(8192, Access::LOCAL_WRITE | Access::MW_BIND).unwrap()
}

/// Binds `mw` over the first 4 KiB of `mr` with remote write and read, the key byte `key`.
fn bind(p: &mut Pair, wr_id: u64, mw: &Mw, mr: &Mr, key: u8) -> (WcStatus, u32) {
    let wr = SendWr::bind_mw(wr_id, mw, mr, mr.addr(), 4096, Access::REMOTE_WRITE | Access::REMOTE_READ).new_key(key);
    p.b.qp.post_send(&[wr.signaled()]).unwrap();
    p.run(RUN);
    let wcs = statuses(&p.b.cq);
    assert_eq!(wcs.len(), 1, "{wcs:?}");
    assert_eq!(wcs[0].2, WcOpcode::BindMw);
    (wcs[0].1, mw.rkey())
}

/// a writes 64 bytes through `rkey` and returns the status.
fn write_through(p: &mut Pair, qp_a: &Qp, cq_a: &Cq, dst: u64, rkey: u32) -> WcStatus {
    let src = p.a.pd.reg_mr(vec![0x6B; 64], Access::LOCAL_WRITE).unwrap();
    qp_a.post_send(&[SendWr::rdma_write(77, &[src.sge(0..64)], dst, rkey).signaled()]).unwrap();
    p.run(RUN);
    let wcs = poll_all(cq_a);
    assert_eq!(wcs.len(), 1, "{wcs:?}");
    wcs[0].status
}

/// A type 2 window starts free and grants nothing; a Bind MW on b's QP binds it with the key
/// byte the consumer chose; a's Write through it lands; a's Send with Invalidate carrying its
/// R_Key completes at b with the invalidated R_Key in the CQE, and from then on the R_Key
/// grants nothing (IBA 10.6.7.2, 9.4.1.1, 11.4.2.1: IBV_WC_WITH_INV).
#[test]
fn bind_write_then_send_with_invalidate() {
    let mut p = Pair::new(QpType::Rc, Mtu::Mtu1024);
    let mr = region(&p);
    let mw = p.b.pd.alloc_mw_of(MwType::Type2).unwrap();
    assert_eq!(mw.mw_type(), MwType::Type2);
    let free = mw.rkey();
    let (a_qp, a_cq) = (p.a.qp.clone(), p.a.cq.clone());
    let key = (free as u8).wrapping_add(1);
    let (status, rkey) = bind(&mut p, 1, &mw, &mr, key);
    assert_eq!(status, WcStatus::Success);
    assert_eq!((rkey >> 8, rkey as u8), (free >> 8, key), "the index stays, the key byte is the consumer's");
    assert!(matches!(mr.dereg(), Err(VerbsError::InUse(_))), "a region with a bound window stays");
    assert_eq!(write_through(&mut p, &a_qp, &a_cq, mr.addr() + 128, rkey), WcStatus::Success);
    assert!(mr.to_vec().unwrap()[128..192].iter().all(|b| *b == 0x6B));

    let (sent, got) = p.send_with_invalidate(b"invalidate it", rkey, RUN);
    let sent: Vec<_> = sent.iter().map(|w| (w.wr_id, w.status, w.opcode)).collect();
    assert_eq!(sent, vec![(2, WcStatus::Success, WcOpcode::Send)]);
    assert_eq!(got.len(), 1);
    assert_eq!(
        (got[0].wr_id, got[0].status, got[0].opcode, got[0].byte_len),
        (5, WcStatus::Success, WcOpcode::Recv, 13)
    );
    assert!(got[0].wc_flags.contains(WcFlags::WITH_INV) && !got[0].wc_flags.contains(WcFlags::WITH_IMM));
    assert_eq!(got[0].imm_data, rkey, "the invalidated R_Key");
    let ieth_sent = p.sent_by(true).iter().any(|k| k.opcode == Opcode::RcSendOnlyWithInvalidate);
    assert!(ieth_sent, "the Send went out as Send Only with Invalidate");
    mr.dereg().unwrap(); // the window no longer holds the region
    assert_eq!(write_through(&mut p, &a_qp, &a_cq, mr.addr() + 128, rkey), WcStatus::RemAccessErr);
}

/// The window is the binding QP's alone: the same R_Key through another QP of the same PD on
/// the same device is a Remote Access Error (IBA 10.6.7.2.2); through its own QP it works.
#[test]
fn a_type_2_window_answers_only_its_qp() {
    let mut p = Pair::new(QpType::Rc, Mtu::Mtu1024);
    let mr = region(&p);
    let mw = p.b.pd.alloc_mw_of(MwType::Type2).unwrap();
    let key = (mw.rkey() as u8).wrapping_add(7);
    let (status, rkey) = bind(&mut p, 1, &mw, &mr, key);
    assert_eq!(status, WcStatus::Success);
    let second = |s: &Side| {
        let qp = s.pd.create_qp(&QpInitAttr::rc(&s.cq, &s.cq).max_send_wr(16).max_recv_wr(16)).unwrap();
        Side { ctx: s.ctx.clone(), pd: s.pd.clone(), cq: s.cq.clone(), qp, gid: s.gid }
    };
    let (a2, b2) = (second(&p.a), second(&p.b));
    connect(&a2, &b2, Mtu::Mtu1024, &Opts::default());
    connect(&b2, &a2, Mtu::Mtu1024, &Opts::default());
    p.clear_trace();
    assert_eq!(write_through(&mut p, &a2.qp, &a2.cq, mr.addr(), rkey), WcStatus::RemAccessErr);
    let naks: Vec<Syndrome> =
        p.sent_by(false).iter().filter(|k| k.opcode == Opcode::RcAcknowledge).filter_map(|k| k.syndrome).collect();
    assert!(naks.contains(&Syndrome::Nak(NakCode::RemoteAccessError)), "{naks:?}");
    poll_all(&p.b.cq); // b2's side of the failed pair: not the window's concern
    let (a_qp, a_cq) = (p.a.qp.clone(), p.a.cq.clone());
    assert_eq!(write_through(&mut p, &a_qp, &a_cq, mr.addr(), rkey), WcStatus::Success);
}

/// A bound type 2 window cannot be bound again until a Local Invalidate frees it; after it,
/// its R_Key grants nothing and a new bind (a new key byte) works again. Local Invalidate
/// completes with its own operation type (IBA 10.6.7.2.3, 11.4.1.1).
#[test]
fn local_invalidate_frees_the_window_for_a_new_bind() {
    let mut p = Pair::new(QpType::Rc, Mtu::Mtu1024);
    let mr = region(&p);
    let mw = p.b.pd.alloc_mw_of(MwType::Type2).unwrap();
    let k1 = (mw.rkey() as u8).wrapping_add(1);
    let (_, rkey1) = bind(&mut p, 1, &mw, &mr, k1);
    p.b.qp.post_send(&[SendWr::local_inv(2, rkey1).signaled()]).unwrap();
    p.run(RUN);
    assert_eq!(statuses(&p.b.cq), vec![(2, WcStatus::Success, WcOpcode::LocalInv)]);
    let (a_qp, a_cq) = (p.a.qp.clone(), p.a.cq.clone());
    let (status, rkey2) = bind(&mut p, 3, &mw, &mr, k1.wrapping_add(1));
    assert_eq!(status, WcStatus::Success);
    assert_ne!(rkey2, rkey1);
    assert_eq!(write_through(&mut p, &a_qp, &a_cq, mr.addr(), rkey2), WcStatus::Success);
    assert_eq!(write_through(&mut p, &a_qp, &a_cq, mr.addr(), rkey1), WcStatus::RemAccessErr);
}

/// The errors, each on a fresh pair (an RC QP whose local operation fails moves to Error):
/// binding a type 2 window that is still bound, or with zero length, is a Memory Window Bind
/// Error; Local Invalidate of a region's key or of a type 1 window is a Local QP Operation
/// Error; a Send with Invalidate whose R_Key the receiving QP cannot invalidate fails its
/// receive WQE with Remote Invalid Request, NAKed Invalid Request (Class C), its payload
/// unwritten.
/// Rule ERR-C-7
#[test]
fn invalidation_and_type_2_bind_errors() {
    // Bound twice.
    let mut p = Pair::new(QpType::Rc, Mtu::Mtu1024);
    let (mr, mw) = (region(&p), p.b.pd.alloc_mw_of(MwType::Type2).unwrap());
    let k = (mw.rkey() as u8).wrapping_add(1);
    assert_eq!(bind(&mut p, 1, &mw, &mr, k).0, WcStatus::Success);
    assert_eq!(bind(&mut p, 2, &mw, &mr, k.wrapping_add(1)).0, WcStatus::MwBindErr);

    // Zero length.
    let mut p = Pair::new(QpType::Rc, Mtu::Mtu1024);
    let (mr, mw) = (region(&p), p.b.pd.alloc_mw_of(MwType::Type2).unwrap());
    let k = (mw.rkey() as u8).wrapping_add(1);
    let wr = SendWr::bind_mw(1, &mw, &mr, mr.addr(), 0, Access::REMOTE_READ).new_key(k);
    p.b.qp.post_send(&[wr.signaled()]).unwrap();
    p.run(RUN);
    assert_eq!(statuses(&p.b.cq), vec![(1, WcStatus::MwBindErr, WcOpcode::BindMw)]);

    // Local Invalidate of what cannot be invalidated.
    for type1 in [false, true] {
        let mut p = Pair::new(QpType::Rc, Mtu::Mtu1024);
        let mr = region(&p);
        let key = if type1 {
            let mw = p.b.pd.alloc_mw().unwrap();
            assert_eq!(bind(&mut p, 1, &mw, &mr, (mw.rkey() as u8).wrapping_add(1)).0, WcStatus::Success);
            mw.rkey()
        } else {
            mr.rkey()
        };
        p.b.qp.post_send(&[SendWr::local_inv(2, key).signaled()]).unwrap();
        p.run(RUN);
        assert_eq!(statuses(&p.b.cq), vec![(2, WcStatus::LocQpOpErr, WcOpcode::LocalInv)], "type 1: {type1}");
    }

    // Send with Invalidate of a key b's QP cannot invalidate.
    let mut p = Pair::new(QpType::Rc, Mtu::Mtu1024);
    let mr = region(&p);
    let land = p.b.pd.reg_mr(vec![0xEE; 64], Access::LOCAL_WRITE).unwrap();
    p.b.qp.post_recv(&[RecvWr::new(5, &[land.sge(0..64)])]).unwrap();
    let msg = p.a.pd.reg_mr(vec![1; 8], Access::LOCAL_WRITE).unwrap();
    p.a.qp.post_send(&[SendWr::send_with_inv(2, &[msg.sge(0..8)], mr.rkey()).signaled()]).unwrap();
    p.run(RUN);
    assert_eq!(statuses(&p.a.cq), vec![(2, WcStatus::RemInvReqErr, WcOpcode::Send)]);
    assert_eq!(
        poll_all(&p.b.cq).iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        vec![(5, WcStatus::RemInvReqErr)]
    );
    let naks: Vec<Syndrome> =
        p.sent_by(false).iter().filter(|k| k.opcode == Opcode::RcAcknowledge).filter_map(|k| k.syndrome).collect();
    assert!(naks.contains(&Syndrome::Nak(NakCode::InvalidRequest)), "{naks:?}");
    assert_eq!(p.b.qp.state().unwrap(), QpState::Error);
    assert_eq!(land.to_vec().unwrap(), vec![0xEE; 64], "the refused packet wrote nothing (ERR-C-7)");
}

/// Send with Invalidate is RC only; Local Invalidate goes where a bind goes (RC, UC, RD), so
/// it is refused on UD (the WR-SQ table's rows for them, as libibverbs providers take them).
#[test]
fn invalidation_work_requests_per_service() {
    let uc = Pair::new(QpType::Uc, Mtu::Mtu1024);
    let e = uc.a.qp.post_send(&[SendWr::send_with_inv(1, &[], 0x1234)]).unwrap_err();
    assert_eq!(e.error, VerbsError::InvalidWrType);
    uc.a.qp.post_send(&[SendWr::local_inv(2, 0x1234)]).unwrap();
    let ud = Pair::new(QpType::Ud, Mtu::Mtu1024);
    let e = ud.a.qp.post_send(&[SendWr::local_inv(1, 0x1234)]).unwrap_err();
    assert_eq!(e.error, VerbsError::InvalidWrType);
}
