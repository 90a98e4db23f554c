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
