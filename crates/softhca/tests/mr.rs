//! Memory regions: registration rules, keys, and the access check every local and remote access
//! goes through (DESIGN rule 5).

mod common;

use common::*;
use softhca::*;

#[test]
fn remote_write_or_atomic_needs_local_write() {
    let f = fixture();
    for bad in [Access::REMOTE_WRITE, Access::REMOTE_ATOMIC, Access::REMOTE_WRITE | Access::REMOTE_READ] {
        assert!(matches!(f.pd.alloc_mr(8, bad), Err(VerbsError::InvalidAccess(_))));
    }
    for good in
        [Access::empty(), Access::REMOTE_READ, Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_ATOMIC]
    {
        f.pd.alloc_mr(8, good).unwrap();
    }
}

#[test]
fn access_check_reports_the_precise_violation() {
    let f = fixture();
    let mr = f.pd.alloc_mr(4096, Access::LOCAL_WRITE | Access::REMOTE_READ).unwrap();
    let other_pd = f.ctx.alloc_pd().unwrap();
    let a = mr.addr();
    let k = mr.rkey();
    let check = |key, pd: &Pd, addr, len, acc| f.ctx.check_access(key, pd, addr, len, acc).map(|m| m.len());
    assert_eq!(check(k, &f.pd, a, 4096, Access::REMOTE_READ), Ok(4096));
    assert_eq!(check(k, &f.pd, a + 4000, 96, Access::LOCAL_WRITE), Ok(96));
    assert_eq!(check(k, &f.pd, a + 10, 0, Access::empty()), Ok(0));
    assert_eq!(check(k ^ 0x1, &f.pd, a, 1, Access::empty()).unwrap_err(), AccessError::BadKey);
    assert_eq!(check(k ^ 0x100, &f.pd, a, 1, Access::empty()).unwrap_err(), AccessError::BadKey);
    assert_eq!(check(k, &other_pd, a, 1, Access::empty()).unwrap_err(), AccessError::WrongPd);
    assert_eq!(check(k, &f.pd, a + 4000, 97, Access::empty()).unwrap_err(), AccessError::OutOfBounds);
    assert_eq!(check(k, &f.pd, a - 1, 2, Access::empty()).unwrap_err(), AccessError::OutOfBounds);
    assert_eq!(check(k, &f.pd, u64::MAX, 2, Access::empty()).unwrap_err(), AccessError::OutOfBounds);
    assert_eq!(check(k, &f.pd, a, u64::MAX, Access::empty()).unwrap_err(), AccessError::OutOfBounds);
    assert_eq!(check(k, &f.pd, a, 8, Access::REMOTE_WRITE).unwrap_err(), AccessError::MissingRight);
    assert_eq!(check(k, &f.pd, a, 8, Access::REMOTE_ATOMIC).unwrap_err(), AccessError::MissingRight);
    mr.dereg().unwrap();
    assert_eq!(check(k, &f.pd, a, 8, Access::empty()).unwrap_err(), AccessError::BadKey);
    assert_eq!(mr.dereg(), Err(VerbsError::InvalidMrHandle));
}

#[test]
fn keys_are_not_reused_back_to_back() {
    let f = fixture();
    let mut last = None;
    let mut seen = std::collections::HashSet::new();
    for _ in 0..500 {
        let mr = f.pd.alloc_mr(8, Access::empty()).unwrap();
        let key = mr.lkey();
        assert_ne!(Some(key), last, "the same slot must not give the same key twice in a row");
        seen.insert(key);
        last = Some(key);
        mr.dereg().unwrap();
    }
    assert!(seen.len() > 200, "key bytes vary: {} distinct keys", seen.len());
}

#[test]
fn checked_windows_copy_and_keep_memory_alive() {
    let f = fixture();
    let mr = f.pd.reg_mr((0..=255u8).collect(), Access::LOCAL_WRITE | Access::REMOTE_ATOMIC).unwrap();
    let m = f.ctx.check_access(mr.lkey(), &f.pd, mr.addr() + 16, 8, Access::REMOTE_ATOMIC).unwrap();
    let mut b = [0u8; 8];
    m.read(0, &mut b).unwrap();
    assert_eq!(b, [16, 17, 18, 19, 20, 21, 22, 23]);
    assert_eq!(m.write(4, &[0; 5]), Err(AccessError::OutOfBounds));
    m.write(0, &7u64.to_ne_bytes()).unwrap();
    let atomic = m.atomic_u64().expect("aligned 8-byte window");
    assert_eq!(atomic.fetch_add(5, std::sync::atomic::Ordering::SeqCst), 7);
    drop(mr); // deregisters; the checked window still holds the memory
    m.read(0, &mut b).unwrap();
    assert_eq!(u64::from_ne_bytes(b), 12);
}

#[test]
fn region_io_and_resource_limit() {
    let mut cfg = DeviceConfig::default().seed(9);
    cfg.attr.max_mr = 3;
    let f = fixture_with(cfg);
    let a = f.pd.alloc_mr(32, Access::LOCAL_WRITE).unwrap();
    a.write(30, &[1, 2]).unwrap();
    assert!(a.write(31, &[1, 2]).is_err());
    assert_eq!(&a.to_vec().unwrap()[29..], &[0, 1, 2]);
    let sge = a.sge(4..20);
    assert_eq!((sge.addr, sge.length, sge.lkey), (a.addr() + 4, 16, a.lkey()));
    let _b = f.pd.alloc_mr(1, Access::empty()).unwrap();
    let _c = f.pd.alloc_mr(1, Access::empty()).unwrap();
    assert_eq!(f.pd.alloc_mr(1, Access::empty()).unwrap_err(), VerbsError::InsufficientResources);
    drop(a);
    f.pd.alloc_mr(1, Access::empty()).unwrap();
}

/// Reregister Memory Region: the PD, the rights and (raw) the memory change under the same key,
/// and the access check follows at once; the PDs' counts move with the region (the old one
/// can be deallocated, the new one cannot while the region is in it).
#[test]
fn rereg_changes_pd_rights_and_memory_under_the_same_key() {
    let f = fixture();
    let mut mr = f.pd.alloc_mr(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE).unwrap();
    let (k, a) = (mr.lkey(), mr.addr());
    let check = |pd: &Pd, addr, len, acc| f.ctx.check_access(k, pd, addr, len, acc).map(|m| m.len());
    assert_eq!(check(&f.pd, a, 8, Access::REMOTE_WRITE), Ok(8));

    mr.rereg(None, Some(Access::LOCAL_WRITE)).unwrap();
    assert_eq!((mr.lkey(), mr.rkey(), mr.access()), (k, k, Access::LOCAL_WRITE));
    assert_eq!(check(&f.pd, a, 8, Access::REMOTE_WRITE), Err(AccessError::MissingRight));
    assert!(matches!(mr.rereg(None, Some(Access::REMOTE_WRITE)), Err(VerbsError::InvalidAccess(_))));

    let other = f.ctx.alloc_pd().unwrap();
    mr.rereg(Some(&other), Some(Access::LOCAL_WRITE | Access::REMOTE_READ)).unwrap();
    assert_eq!(check(&f.pd, a, 8, Access::empty()), Err(AccessError::WrongPd));
    assert_eq!(check(&other, a, 8, Access::REMOTE_READ), Ok(8));
    assert!(matches!(other.dealloc(), Err(VerbsError::InUse(_))), "the region is in it now");
    f.pd.dealloc().unwrap();

    let mut buf = vec![0x77u8; 1000];
    // SAFETY: `buf` outlives `mr` (dropped first, below) and nothing else touches it meanwhile.
    unsafe { mr.rereg_raw(None, None, Some((buf.as_mut_ptr(), buf.len()))) }.unwrap();
    let b = buf.as_ptr() as u64;
    assert_eq!((mr.addr(), mr.len(), mr.lkey()), (b, 1000, k));
    assert_eq!(check(&other, a, 8, Access::empty()), Err(AccessError::OutOfBounds), "the old memory is gone");
    assert_eq!(check(&other, b, 1000, Access::REMOTE_READ), Ok(1000));
    assert_eq!(mr.to_vec().unwrap(), vec![0x77; 1000]);
    mr.dereg().unwrap();
    assert!(matches!(mr.rereg(None, Some(Access::LOCAL_WRITE)), Err(VerbsError::InvalidMrHandle)));
    drop(mr);
    other.dealloc().unwrap();
}

/// A region with a bound window is not reregistered (as it is not deregistered), nor is a
/// fast-registration region (its rights are its Fast Register's). Over the wire: a Write that
/// the old rights allowed fails with Remote Access Error once they are taken away.
#[test]
fn rereg_is_refused_with_windows_bound_and_taken_at_once_by_the_wire() {
    use common::pair::*;
    let mut p = Pair::new(QpType::Rc, Mtu::Mtu1024);
    let mut region = p.b.pd.alloc_mr(8192, Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::MW_BIND).unwrap();
    let mw = p.b.pd.alloc_mw().unwrap();
    p.b.qp.post_send(&[SendWr::bind_mw(1, &mw, &region, region.addr(), 64, Access::REMOTE_WRITE)]).unwrap();
    p.run(10_000_000_000);
    assert!(matches!(region.rereg(None, Some(Access::LOCAL_WRITE)), Err(VerbsError::InUse(_))));
    mw.dealloc().unwrap();
    let mut fast = p.b.pd.alloc_fast_reg_mr(vec![0; 64]).unwrap();
    assert!(matches!(fast.rereg(None, Some(Access::LOCAL_WRITE)), Err(VerbsError::InvalidArgument(_))));

    let src = p.a.pd.reg_mr(vec![0x5A; 64], Access::LOCAL_WRITE).unwrap();
    let (addr, rkey) = (region.addr(), region.rkey());
    let write = |p: &mut Pair, id| {
        p.a.qp.post_send(&[SendWr::rdma_write(id, &[src.sge(0..64)], addr, rkey).signaled()]).unwrap();
        p.run(10_000_000_000);
        poll_all(&p.a.cq).iter().map(|w| w.status).collect::<Vec<_>>()
    };
    assert_eq!(write(&mut p, 10), vec![WcStatus::Success]);
    region.rereg(None, Some(Access::LOCAL_WRITE)).unwrap();
    assert_eq!(write(&mut p, 11), vec![WcStatus::RemAccessErr]);
}
