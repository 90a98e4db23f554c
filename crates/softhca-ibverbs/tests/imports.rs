//! `ibv_import_pd` / `ibv_import_mr` (`foreign.rs`) against objects the program frees meanwhile,
//! in process: a context imported from another's `cmd_fd` shares its PDs and MRs by handle,
//! as contexts sharing a kernel ucontext do, and freeing the importer's objects (or the
//! exporter's, on another thread) must leave the imports reading nothing freed.

use std::ffi::{c_int, c_void};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use softhca_ibverbs::abi::*;

extern "C" {
    fn ibv_get_device_list(num: *mut c_int) -> *mut *mut ibv_device;
    fn ibv_free_device_list(list: *mut *mut ibv_device);
    fn ibv_open_device(device: *mut ibv_device) -> *mut ibv_context;
    fn ibv_close_device(context: *mut ibv_context) -> c_int;
    fn ibv_alloc_pd(context: *mut ibv_context) -> *mut ibv_pd;
    fn ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int;
    fn ibv_reg_mr(pd: *mut ibv_pd, addr: *mut c_void, len: usize, access: c_int) -> *mut ibv_mr;
    fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int;
    fn ibv_rereg_mr(
        mr: *mut ibv_mr,
        flags: c_int,
        pd: *mut ibv_pd,
        addr: *mut c_void,
        len: usize,
        access: c_int,
    ) -> c_int;
    fn ibv_import_device(cmd_fd: c_int) -> *mut ibv_context;
    fn ibv_import_pd(context: *mut ibv_context, handle: u32) -> *mut ibv_pd;
    fn ibv_unimport_pd(pd: *mut ibv_pd);
    fn ibv_import_mr(pd: *mut ibv_pd, handle: u32) -> *mut ibv_mr;
    fn ibv_unimport_mr(mr: *mut ibv_mr);
}

fn errno() -> c_int {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// A context of the device and one imported from (a duplicate of) its `cmd_fd`.
struct Pair {
    ctx: *mut ibv_context,
    imported: *mut ibv_context,
    fd: c_int,
}

impl Pair {
    fn open() -> Pair {
        // SAFETY: the library's device list and contexts; a descriptor duplicated here.
        unsafe {
            let list = ibv_get_device_list(null_mut());
            assert!(!list.is_null() && !(*list).is_null(), "a device: {}", errno());
            let ctx = ibv_open_device(*list);
            ibv_free_device_list(list);
            assert!(!ctx.is_null(), "ibv_open_device: {}", errno());
            let fd = libc::dup((*ctx).cmd_fd);
            assert!(fd >= 0);
            let imported = ibv_import_device(fd);
            assert!(!imported.is_null(), "ibv_import_device: {}", errno());
            Pair { ctx, imported, fd }
        }
    }
}

impl Drop for Pair {
    fn drop(&mut self) {
        // SAFETY: the pair's contexts and descriptor, each closed once, after their objects.
        unsafe {
            assert_eq!(ibv_close_device(self.imported), 0);
            assert_eq!(ibv_close_device(self.ctx), 0);
            libc::close(self.fd);
        }
    }
}

/// An MR registered on an imported PD, which the program then unimports (its object freed;
/// the PD stays, the exporter holds it): importing the MR on the exporter's PD of that
/// handle succeeds, as rdma-core's (the kernel's PD and MR are alive), with the MR's keys
/// and length. Before, the import read the freed PD object for its handle: here, memory the
/// program reused, so that it refused the import (EINVAL).
#[test]
fn an_mr_on_an_unimported_pd_imports_on_the_pd_of_its_handle() {
    let p = Pair::open();
    let mut buf = vec![0u8; 4096];
    // SAFETY: the pair's contexts; a local buffer that outlives its registration; each
    // object released once.
    unsafe {
        let pd = ibv_alloc_pd(p.ctx);
        assert!(!pd.is_null());
        let ipd = ibv_import_pd(p.imported, (*pd).handle);
        assert!(!ipd.is_null(), "ibv_import_pd: {}", errno());
        let mr = ibv_reg_mr(ipd, buf.as_mut_ptr().cast(), buf.len(), IBV_ACCESS_LOCAL_WRITE as c_int);
        assert!(!mr.is_null(), "ibv_reg_mr on the imported PD: {}", errno());
        ibv_unimport_pd(ipd);
        // The program's next allocations of that size take the freed object's memory.
        let reuse: Vec<Box<[u8; 24]>> = (0..8).map(|_| Box::new([0xFF; 24])).collect();
        let imr = ibv_import_mr(pd, (*mr).handle);
        assert!(!imr.is_null(), "ibv_import_mr: errno {}", errno());
        assert_eq!(
            ((*imr).pd, (*imr).lkey, (*imr).rkey, (*imr).length, (*imr).addr),
            (pd, (*mr).lkey, (*mr).rkey, buf.len(), null_mut())
        );
        // On a PD of another handle, still EINVAL.
        let other = ibv_alloc_pd(p.ctx);
        assert!(!other.is_null());
        assert!(ibv_import_mr(other, (*mr).handle).is_null());
        assert_eq!(errno(), libc::EINVAL);
        drop(reuse);
        ibv_unimport_mr(imr);
        assert_eq!(ibv_dereg_mr(mr), 0);
        assert_eq!(ibv_dealloc_pd(other), 0);
        assert_eq!(ibv_dealloc_pd(pd), 0);
    }
}

/// An MR moved to another PD (`ibv_rereg_mr` with `IBV_REREG_MR_CHANGE_PD`) imports on the
/// PD of the new handle and no longer on the old one.
#[test]
fn an_mr_moved_to_another_pd_imports_on_that_pd() {
    const IBV_REREG_MR_CHANGE_PD: c_int = 1 << 1;
    let p = Pair::open();
    let mut buf = vec![0u8; 4096];
    // SAFETY: the pair's contexts; a local buffer that outlives its registration; each
    // object released once.
    unsafe {
        let (a, b) = (ibv_alloc_pd(p.ctx), ibv_alloc_pd(p.ctx));
        assert!(!a.is_null() && !b.is_null());
        let mr = ibv_reg_mr(a, buf.as_mut_ptr().cast(), buf.len(), IBV_ACCESS_LOCAL_WRITE as c_int);
        assert!(!mr.is_null());
        assert_eq!(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_PD, b, null_mut(), 0, 0), 0, "{}", errno());
        let (ia, ib) = (ibv_import_pd(p.imported, (*a).handle), ibv_import_pd(p.imported, (*b).handle));
        assert!(!ia.is_null() && !ib.is_null());
        assert!(ibv_import_mr(ia, (*mr).handle).is_null());
        assert_eq!(errno(), libc::EINVAL);
        let imr = ibv_import_mr(ib, (*mr).handle);
        assert!(!imr.is_null(), "ibv_import_mr: errno {}", errno());
        assert_eq!(((*imr).pd, (*imr).lkey), (ib, (*mr).lkey));
        ibv_unimport_mr(imr);
        ibv_unimport_pd(ia);
        ibv_unimport_pd(ib);
        assert_eq!(ibv_dereg_mr(mr), 0);
        assert_eq!(ibv_dealloc_pd(a), 0);
        assert_eq!(ibv_dealloc_pd(b), 0);
    }
}

/// One thread registers and deregisters MRs (allocates and deallocates PDs) in one context
/// while another imports each by its handle into the other: an import either finds the
/// object or fails with EINVAL, and never reads one freed meanwhile (before, the object found
/// under the context's lock was read after the lock was dropped, when a deregistration could
/// have freed it).
#[test]
fn imports_race_the_exporters_frees() {
    const RUN: Duration = Duration::from_secs(3);
    let p = Pair::open();
    // SAFETY: the pair's contexts.
    let pd = unsafe { ibv_alloc_pd(p.ctx) };
    assert!(!pd.is_null());
    // SAFETY: as above.
    let ipd = unsafe { ibv_import_pd(p.imported, (*pd).handle) };
    assert!(!ipd.is_null());
    let (mr_handle, pd_handle) = (Arc::new(AtomicU32::new(u32::MAX)), Arc::new(AtomicU32::new(u32::MAX)));
    let stop = Arc::new(AtomicBool::new(false));
    let (ctx, pd_addr) = (p.ctx as usize, pd as usize);
    let exporter = {
        let (mr_handle, pd_handle, stop) = (mr_handle.clone(), pd_handle.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 4096];
            let (ctx, pd) = (ctx as *mut ibv_context, pd_addr as *mut ibv_pd);
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                // SAFETY: the pair's context and PD; a buffer that outlives each registration.
                unsafe {
                    let mr = ibv_reg_mr(pd, buf.as_mut_ptr().cast(), buf.len(), IBV_ACCESS_LOCAL_WRITE as c_int);
                    assert!(!mr.is_null());
                    mr_handle.store((*mr).handle, Ordering::Relaxed);
                    let q = ibv_alloc_pd(ctx);
                    assert!(!q.is_null());
                    pd_handle.store((*q).handle, Ordering::Relaxed);
                    std::thread::yield_now();
                    assert_eq!(ibv_dereg_mr(mr), 0);
                    assert_eq!(ibv_dealloc_pd(q), 0);
                }
                n += 1;
            }
            n
        })
    };
    let start = Instant::now();
    let (mut found, mut missed) = (0u64, 0u64);
    while start.elapsed() < RUN {
        // SAFETY: the imported context and PD; what an import gives is unimported once.
        unsafe {
            let m = ibv_import_mr(ipd, mr_handle.load(Ordering::Relaxed));
            if m.is_null() {
                assert_eq!(errno(), libc::EINVAL);
                missed += 1;
            } else {
                found += 1;
                ibv_unimport_mr(m);
            }
            let q = ibv_import_pd(p.imported, pd_handle.load(Ordering::Relaxed));
            if q.is_null() {
                assert_eq!(errno(), libc::EINVAL);
            } else {
                ibv_unimport_pd(q);
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    let cycles = exporter.join().unwrap();
    eprintln!("{cycles} registrations, {found} imports found one, {missed} missed");
    // SAFETY: the import and the PD, released once, before the pair.
    unsafe {
        ibv_unimport_pd(ipd);
        assert_eq!(ibv_dealloc_pd(pd), 0);
    }
}
