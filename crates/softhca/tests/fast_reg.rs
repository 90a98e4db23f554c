//! Invalidating a region's key: fast-registration regions (IBA's Allocate L_Key and Fast
//! Registration, the kernel's `ib_alloc_mr` / `IB_WR_REG_MR`; libibverbs has none, and Linux
//! invalidates no region a program registered with `ibv_reg_mr`, as softhca does not). A
//! region starts Free, its keys reaching nothing; a Fast Register work request makes it Valid
//! with a key byte and rights the consumer chooses; Local Invalidate, or a peer's Send with
//! Invalidate naming its key, makes it Free again. The digest has no rules for these.

mod common;

use common::pair::*;
use common::poll_all;
use softhca::*;

const RUN: u64 = 10_000_000_000;

fn statuses(cq: &Cq) -> Vec<(u64, WcStatus, WcOpcode)> {
    poll_all(cq).iter().map(|w| (w.wr_id, w.status, w.opcode)).collect()
}

/// b posts `wr` (a local operation) and returns its completion.
fn local(p: &mut Pair, wr: SendWr<'_>) -> (u64, WcStatus, WcOpcode) {
    p.b.qp.post_send(&[wr.signaled()]).unwrap();
    p.run(RUN);
    let wcs = statuses(&p.b.cq);
    assert_eq!(wcs.len(), 1, "{wcs:?}");
    wcs[0]
}

/// a writes 64 bytes of 0x5A at `dst` through `rkey` and returns the status.
fn write_through(p: &mut Pair, dst: u64, rkey: u32) -> WcStatus {
    let src = p.a.pd.reg_mr(vec![0x5A; 64], Access::LOCAL_WRITE).unwrap();
    p.a.qp.post_send(&[SendWr::rdma_write(9, &[src.sge(0..64)], dst, rkey).signaled()]).unwrap();
    p.run(RUN);
    let wcs = poll_all(&p.a.cq);
    assert_eq!(wcs.len(), 1, "{wcs:?}");
    wcs[0].status
}

/// Free, its key reaches nothing; a Fast Register gives it the consumer's key byte (the index
/// stays) and the rights asked; a's Write through the new R_Key lands; a's Send with
/// Invalidate naming it completes at b with the key in the CQE (WITH_INV), and from then on the
/// key reaches nothing: a's next Write is a Remote Access Error.
#[test]
fn register_write_then_send_with_invalidate() {
    let mut p = Pair::new(QpType::Rc, Mtu::Mtu1024);
    let mr = p.b.pd.alloc_fast_reg_mr(vec![0; 4096]).unwrap();
    let free = mr.rkey();
    let (ctx, pd) = (p.b.ctx.clone(), p.b.pd.clone());
    let check = |key| ctx.check_access(key, &pd, mr.addr(), 64, Access::LOCAL_WRITE).err();
    assert_eq!(check(free), Some(AccessError::BadKey), "Free: the key reaches nothing");
    let byte = (free as u8).wrapping_add(3);
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
    assert_eq!(local(&mut p, SendWr::fast_reg(1, &mr, access, byte)), (1, WcStatus::Success, WcOpcode::FastReg));
    let rkey = mr.rkey();
    assert_eq!((rkey >> 8, rkey as u8), (free >> 8, byte), "the index stays, the key byte is the consumer's");
    assert_eq!(check(free), Some(AccessError::BadKey), "the old key is gone");
    assert_eq!(write_through(&mut p, mr.addr() + 256, rkey), WcStatus::Success);
    assert!(mr.to_vec().unwrap()[256..320].iter().all(|b| *b == 0x5A));

    let (sent, got) = p.send_with_invalidate(b"invalidate the region", rkey, RUN);
    assert_eq!((sent.len(), sent[0].wr_id, sent[0].status), (1, 2, WcStatus::Success));
    assert_eq!((got.len(), got[0].status, got[0].imm_data), (1, WcStatus::Success, rkey));
    assert!(got[0].wc_flags.contains(WcFlags::WITH_INV));
    assert_eq!(check(rkey), Some(AccessError::BadKey), "invalidated");
    assert_eq!(write_through(&mut p, mr.addr(), rkey), WcStatus::RemAccessErr);
}

/// Local Invalidate frees a Valid region; a new Fast Register (a new key byte) makes it Valid
/// again with new rights, and the rights are what it checks. A Fast Register of a Valid region
/// is refused with Local QP Operation Error, as is a Local Invalidate of a Free one, and of a
/// region registered whole (Register Memory Region: never invalidated).
#[test]
fn local_invalidate_and_register_again() {
    let mut p = Pair::new(QpType::Rc, Mtu::Mtu1024);
    let mr = p.b.pd.alloc_fast_reg_mr(vec![0; 4096]).unwrap();
    let k1 = (mr.rkey() as u8).wrapping_add(1);
    let read_only = Access::LOCAL_WRITE | Access::REMOTE_READ;
    assert_eq!(local(&mut p, SendWr::fast_reg(1, &mr, read_only, k1)).1, WcStatus::Success);
    let rkey1 = mr.rkey();
    let (ctx, pd) = (p.b.ctx.clone(), p.b.pd.clone());
    let check = |key, access| ctx.check_access(key, &pd, mr.addr(), 64, access).err();
    assert_eq!(check(rkey1, Access::REMOTE_READ), None);
    assert_eq!(check(rkey1, Access::REMOTE_WRITE), Some(AccessError::MissingRight));
    assert_eq!(local(&mut p, SendWr::local_inv(2, rkey1)), (2, WcStatus::Success, WcOpcode::LocalInv));
    assert_eq!(check(rkey1, Access::REMOTE_READ), Some(AccessError::BadKey));
    let k2 = k1.wrapping_add(1);
    assert_eq!(
        local(&mut p, SendWr::fast_reg(3, &mr, Access::LOCAL_WRITE | Access::REMOTE_WRITE, k2)).1,
        WcStatus::Success
    );
    let rkey2 = mr.rkey();
    assert_ne!(rkey2, rkey1);
    assert_eq!(check(rkey2, Access::REMOTE_WRITE), None);
    assert_eq!(write_through(&mut p, mr.addr(), rkey2), WcStatus::Success);
    // Registering a Valid region again: refused (the QP goes to Error, as for any failed
    // local operation of an RC QP).
    assert_eq!(local(&mut p, SendWr::fast_reg(4, &mr, read_only, k2.wrapping_add(1))).1, WcStatus::LocQpOpErr);
    assert_eq!(check(rkey2, Access::REMOTE_WRITE), None, "the refused request changed nothing");
}

/// The refusals one by one, each on a fresh pair: a Local Invalidate of a Free region or of a
/// region registered whole, a Fast Register whose rights are inconsistent (remote write
/// without local write), or of an ordinary region.
#[test]
fn what_fast_registration_refuses() {
    let refused = |make: &dyn for<'m> Fn(&'m Mr, &'m Mr) -> SendWr<'m>| {
        let mut p = Pair::new(QpType::Rc, Mtu::Mtu1024);
        let fast = p.b.pd.alloc_fast_reg_mr(vec![0; 64]).unwrap();
        let whole = p.b.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
        let wr = make(&fast, &whole);
        let got = local(&mut p, wr);
        assert_eq!(got.1, WcStatus::LocQpOpErr, "{got:?}");
        assert_eq!(
            p.b.ctx.check_access(fast.lkey(), &p.b.pd, fast.addr(), 8, Access::LOCAL_WRITE).err(),
            Some(AccessError::BadKey),
            "still Free"
        );
    };
    refused(&|fast, _| SendWr::local_inv(1, fast.rkey()));
    refused(&|_, whole| SendWr::local_inv(1, whole.rkey()));
    refused(&|fast, _| SendWr::fast_reg(1, fast, Access::REMOTE_WRITE, (fast.rkey() as u8).wrapping_add(1)));
    refused(&|_, whole| SendWr::fast_reg(1, whole, Access::LOCAL_WRITE, (whole.rkey() as u8).wrapping_add(1)));
}

/// A Fast Register may give the region the key byte it has (rxe's `rxe_reg_fast_mr` checks
/// only that the index stays; a window's bind is what must change its key): the key then
/// works with the rights asked. Before, it was refused with Local QP Operation Error.
#[test]
fn a_fast_register_may_keep_the_key_byte() {
    let mut p = Pair::new(QpType::Rc, Mtu::Mtu1024);
    let mr = p.b.pd.alloc_fast_reg_mr(vec![0; 4096]).unwrap();
    let key = mr.rkey();
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
    assert_eq!(local(&mut p, SendWr::fast_reg(1, &mr, access, key as u8)), (1, WcStatus::Success, WcOpcode::FastReg));
    assert_eq!(mr.rkey(), key, "the same key");
    assert_eq!(write_through(&mut p, mr.addr(), key), WcStatus::Success);
    assert!(mr.to_vec().unwrap()[..64].iter().all(|b| *b == 0x5A));
}

/// A memory window binds to a fast-registration region whose Fast Register granted Bind and
/// Local Write (WR-BIND-3), and a Write through the window's R_Key lands; on a Free region, or
/// one registered without Bind, the bind fails (Memory Window Bind Error). Before, every bind
/// to a fast-registration region failed: the check read the rights it was allocated with (none).
#[test]
fn a_window_binds_to_a_fast_registered_region() {
    let bind = |rights: Option<Access>| {
        let mut p = Pair::new(QpType::Rc, Mtu::Mtu1024);
        let mr = p.b.pd.alloc_fast_reg_mr(vec![0; 4096]).unwrap();
        if let Some(r) = rights {
            let byte = (mr.rkey() as u8).wrapping_add(1);
            assert_eq!(local(&mut p, SendWr::fast_reg(1, &mr, r, byte)).1, WcStatus::Success);
        }
        let mw = p.b.pd.alloc_mw_of(MwType::Type2).unwrap();
        let key = (mw.rkey() as u8).wrapping_add(1);
        let wr = SendWr::bind_mw(2, &mw, &mr, mr.addr(), 4096, Access::REMOTE_WRITE).new_key(key);
        let status = local(&mut p, wr).1;
        let landed = status == WcStatus::Success && {
            assert_eq!(write_through(&mut p, mr.addr() + 128, mw.rkey()), WcStatus::Success);
            mr.to_vec().unwrap()[128..192].iter().all(|b| *b == 0x5A)
        };
        (status, landed)
    };
    assert_eq!(bind(Some(Access::LOCAL_WRITE | Access::MW_BIND)), (WcStatus::Success, true));
    assert_eq!(bind(None), (WcStatus::MwBindErr, false), "a Free region");
    assert_eq!(bind(Some(Access::LOCAL_WRITE)), (WcStatus::MwBindErr, false), "registered without Bind");
}
