//! Memory windows: binding by work request, remote access through the window's R_Key, and the
//! bind errors.

mod common;

use common::pair::*;
use common::poll_all;
use softhca::wire::{NakCode, Opcode, Syndrome};
use softhca::*;

const RUN: u64 = 10_000_000_000;

fn statuses(cq: &Cq) -> Vec<(u64, WcStatus, WcOpcode)> {
    poll_all(cq).iter().map(|w| (w.wr_id, w.status, w.opcode)).collect()
}

/// b binds a window over part of a region; a then writes and reads through the window's
/// R_Key, within the window and its rights only. A rebind gives a new R_Key and the old one
/// stops working. The bind completes with operation type Memory Window Bind.
/// Rule WR-BIND-1, WR-BIND-2, WR-BIND-6, WR-SQ-5
#[test]
fn bind_then_remote_access_through_the_window() {
    let mut p = Pair::new(QpType::Rc, Mtu::Mtu1024);
    let region = p.b.pd.alloc_mr(8192, Access::LOCAL_WRITE | Access::MW_BIND).unwrap();
    let mw = p.b.pd.alloc_mw().unwrap();
    let before = mw.rkey();
    p.b.qp
        .post_send(&[SendWr::bind_mw(1, &mw, &region, region.addr() + 1024, 2048, Access::REMOTE_WRITE).signaled()])
        .unwrap();
    p.run(RUN);
    assert_eq!(statuses(&p.b.cq), vec![(1, WcStatus::Success, WcOpcode::BindMw)]);
    let rkey = mw.rkey();
    assert_ne!(rkey, before);
    assert!(matches!(region.dereg(), Err(VerbsError::InUse(_))), "a region with a bound window stays");

    let src = p.a.pd.reg_mr(vec![0x5A; 4096], Access::LOCAL_WRITE).unwrap();
    let land = p.a.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    p.a.qp.post_send(&[SendWr::rdma_write(10, &[src.sge(0..2048)], region.addr() + 1024, rkey).signaled()]).unwrap();
    p.run(RUN);
    assert_eq!(statuses(&p.a.cq), vec![(10, WcStatus::Success, WcOpcode::RdmaWrite)]);
    let got = region.to_vec().unwrap();
    assert!(got[1024..3072].iter().all(|b| *b == 0x5A) && got[..1024].iter().all(|b| *b == 0));

    // Rebind read-only to another range: the old R_Key misses, the new one reads, not writes.
    p.b.qp.post_send(&[SendWr::bind_mw(2, &mw, &region, region.addr(), 64, Access::REMOTE_READ).signaled()]).unwrap();
    p.run(RUN);
    let rkey2 = mw.rkey();
    assert_ne!(rkey2, rkey);
    p.a.qp.post_send(&[SendWr::rdma_read(11, &[land.sge(0..64)], region.addr(), rkey2).signaled()]).unwrap();
    p.run(RUN);
    assert_eq!(statuses(&p.a.cq), vec![(11, WcStatus::Success, WcOpcode::RdmaRead)]);
    p.a.qp.post_send(&[SendWr::rdma_write(12, &[src.sge(0..8)], region.addr(), rkey).signaled()]).unwrap();
    p.run(RUN);
    let naks: Vec<Syndrome> =
        p.sent_by(false).iter().filter(|k| k.opcode == Opcode::RcAcknowledge).filter_map(|k| k.syndrome).collect();
    assert!(naks.contains(&Syndrome::Nak(NakCode::RemoteAccessError)));
    assert_eq!(statuses(&p.a.cq)[0].1, WcStatus::RemAccessErr);
}

/// Outside the window, or beyond its rights, is a Remote Access Error.
/// Rule ERR-RQ-9
#[test]
fn window_bounds_and_rights() {
    for (off, len, write) in [(0u64, 8u64, true), (60, 8, false)] {
        let mut p = Pair::new(QpType::Rc, Mtu::Mtu1024);
        let region = p.b.pd.alloc_mr(4096, Access::LOCAL_WRITE | Access::MW_BIND).unwrap();
        let mw = p.b.pd.alloc_mw().unwrap();
        p.b.qp.post_send(&[SendWr::bind_mw(1, &mw, &region, region.addr(), 64, Access::REMOTE_READ)]).unwrap();
        p.run(RUN);
        let local = p.a.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
        let sg = [local.sge(0..len as usize)];
        let wr = if write {
            SendWr::rdma_write(1, &sg, region.addr() + off, mw.rkey())
        } else {
            SendWr::rdma_read(1, &sg, region.addr() + off, mw.rkey())
        };
        p.a.qp.post_send(&[wr.signaled()]).unwrap();
        p.run(RUN);
        assert_eq!(poll_all(&p.a.cq)[0].status, WcStatus::RemAccessErr, "offset {off} write {write}");
    }
}

/// Bind errors complete with Memory Window Bind Error: remote write or atomic on a region
/// without local write, a range not inside the region.
/// Rule WR-BIND-3, WR-BIND-4, WR-BIND-5, QPT-AUTO-3
#[test]
fn bind_errors() {
    let cases: [(Access, Access, u64, u64); 3] = [
        (Access::MW_BIND, Access::REMOTE_WRITE, 0, 64),
        (Access::MW_BIND, Access::REMOTE_ATOMIC, 0, 64),
        (Access::MW_BIND | Access::LOCAL_WRITE, Access::REMOTE_READ, 4000, 200),
    ];
    for (mr_access, access, off, len) in cases {
        let mut p = Pair::new(QpType::Rc, Mtu::Mtu1024);
        let region = p.b.pd.alloc_mr(4096, mr_access).unwrap();
        let mw = p.b.pd.alloc_mw().unwrap();
        let key = mw.rkey();
        p.b.qp
            .post_send(&[SendWr::bind_mw(1, &mw, &region, region.addr() + off, len, access), SendWr::send(2, &[])])
            .unwrap();
        p.run(RUN);
        assert_eq!(
            statuses(&p.b.cq),
            vec![(1, WcStatus::MwBindErr, WcOpcode::BindMw), (2, WcStatus::WrFlushErr, WcOpcode::Send)]
        );
        assert_eq!(mw.rkey(), key, "a failed bind changes nothing");
        assert_eq!(p.b.qp.state().unwrap(), QpState::Error);
    }
}

/// A deallocated window's key is dead, and the region can go.
#[test]
fn dealloc_window() {
    let p = Pair::new(QpType::Rc, Mtu::Mtu1024);
    let region = p.b.pd.alloc_mr(64, Access::LOCAL_WRITE | Access::MW_BIND).unwrap();
    let mw = p.b.pd.alloc_mw().unwrap();
    mw.dealloc().unwrap();
    assert!(mw.dealloc().is_err());
    assert_eq!(
        p.b.ctx.check_access(mw.rkey(), &p.b.pd, region.addr(), 8, Access::REMOTE_READ).unwrap_err(),
        AccessError::BadKey
    );
    region.dereg().unwrap();
}

/// A consumer may choose the key byte of the window's next R_Key (as libibverbs'
/// `ibv_bind_mw` does with `ibv_inc_rkey`): the bind gives the window exactly that R_Key, and
/// the old one stops working; naming the current key byte again fails the bind.
/// Rule WR-BIND-1, WR-BIND-6
#[test]
fn bind_with_a_chosen_key_byte() {
    let mut p = Pair::new(QpType::Rc, Mtu::Mtu1024);
    let region = p.b.pd.alloc_mr(4096, Access::LOCAL_WRITE | Access::MW_BIND).unwrap();
    let mw = p.b.pd.alloc_mw().unwrap();
    let before = mw.rkey();
    let next = (before as u8).wrapping_add(1);
    let bind =
        |id: u64, byte: u8| SendWr::bind_mw(id, &mw, &region, region.addr(), 4096, Access::REMOTE_WRITE).new_key(byte);
    p.b.qp.post_send(&[bind(1, next).signaled()]).unwrap();
    p.run(RUN);
    assert_eq!(statuses(&p.b.cq), vec![(1, WcStatus::Success, WcOpcode::BindMw)]);
    assert_eq!(mw.rkey(), (before & !0xff) | u32::from(next));
    let src = p.a.pd.reg_mr(vec![7; 64], Access::LOCAL_WRITE).unwrap();
    p.a.qp.post_send(&[SendWr::rdma_write(10, &[src.sge(0..64)], region.addr(), before).signaled()]).unwrap();
    p.run(RUN);
    assert_eq!(statuses(&p.a.cq)[0].1, WcStatus::RemAccessErr, "the old R_Key still works");

    // On a fresh pair: the current key byte again is refused, the key stays.
    let mut p = Pair::new(QpType::Rc, Mtu::Mtu1024);
    let region = p.b.pd.alloc_mr(4096, Access::LOCAL_WRITE | Access::MW_BIND).unwrap();
    let mw = p.b.pd.alloc_mw().unwrap();
    let before = mw.rkey();
    p.b.qp
        .post_send(&[SendWr::bind_mw(2, &mw, &region, region.addr(), 4096, Access::REMOTE_WRITE)
            .new_key(before as u8)
            .signaled()])
        .unwrap();
    p.run(RUN);
    assert_eq!(statuses(&p.b.cq), vec![(2, WcStatus::MwBindErr, WcOpcode::BindMw)]);
    assert_eq!(mw.rkey(), before);
}

/// A zero-length bind unbinds a type 1 window (IBA 10.6.7; rxe likewise): it gets a new R_Key
/// that reaches nothing, and its region, no longer bound, can be deregistered. A type 2
/// window is not unbound so (it is invalidated) and the bind fails.
#[test]
fn a_zero_length_bind_unbinds_a_type_1_window() {
    let mut p = Pair::new(QpType::Rc, Mtu::Mtu1024);
    let region = p.b.pd.alloc_mr(4096, Access::LOCAL_WRITE | Access::MW_BIND).unwrap();
    let mw = p.b.pd.alloc_mw().unwrap();
    p.b.qp.post_send(&[SendWr::bind_mw(1, &mw, &region, region.addr(), 4096, Access::REMOTE_WRITE)]).unwrap();
    p.run(RUN);
    let bound = mw.rkey();
    assert!(matches!(region.dereg(), Err(VerbsError::InUse(_))));
    p.b.qp.post_send(&[SendWr::unbind_mw(2, &mw).signaled()]).unwrap();
    p.run(RUN);
    assert_eq!(statuses(&p.b.cq), vec![(2, WcStatus::Success, WcOpcode::BindMw)]);
    assert_ne!(mw.rkey(), bound);
    for key in [bound, mw.rkey()] {
        assert!(p.b.ctx.check_access(key, &p.b.pd, region.addr(), 8, Access::REMOTE_WRITE).is_err());
    }
    region.dereg().unwrap();

    let region2 = p.b.pd.alloc_mr(4096, Access::LOCAL_WRITE | Access::MW_BIND).unwrap();
    let mw2 = p.b.pd.alloc_mw_of(MwType::Type2).unwrap();
    let zero = SendWr::bind_mw(3, &mw2, &region2, region2.addr(), 0, Access::REMOTE_WRITE).signaled();
    p.b.qp.post_send(&[zero]).unwrap();
    p.run(RUN);
    assert_eq!(statuses(&p.b.cq)[0].1, WcStatus::MwBindErr);
}
