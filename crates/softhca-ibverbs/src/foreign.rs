//! Importing objects, and what softhca cannot take from outside its own process.
//!
//! `ibv_import_device` of a context's `cmd_fd` (or a duplicate, as programs pass it around)
//! opens another context on the same user context, as the kernel shares a ucontext between
//! the importer and the original: the two share the command file, and `ibv_import_pd` /
//! `ibv_import_mr` of a handle of either give objects of the same PD and MR (the unimports
//! free only the importer's handle objects). A descriptor of another process reaches
//! nothing here: softhca's device lives in each process. Device memory and dma-bufs answer as
//! libibverbs 44 does for a provider without them: NULL with `errno` `EOPNOTSUPP`.

use std::ffi::c_int;
use std::os::fd::{FromRawFd, OwnedFd};

use crate::abi::{ibv_context, ibv_mr, ibv_pd};
use crate::context::{ctx, find_shared};
use crate::fail;
use crate::mem::{pd, Mr, Pd};

/// A context on the user context whose `cmd_fd` (or a duplicate) this is. Any other
/// descriptor fails as libibverbs fails it: EINVAL for one that is not a character device,
/// ENODEV for one that is no uverbs device of this host's.
#[no_mangle]
pub unsafe extern "C" fn ibv_import_device(cmd_fd: c_int) -> *mut ibv_context {
    if crate::context::is_context_cmd_fd(cmd_fd) {
        // SAFETY: F_DUPFD_CLOEXEC of a descriptor the caller holds; -1 on failure.
        let dup = unsafe { libc::fcntl(cmd_fd, libc::F_DUPFD_CLOEXEC, 0) };
        if dup < 0 {
            return fail(std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EMFILE));
        }
        // SAFETY: a descriptor just duplicated, owned by nobody else.
        let cmd = unsafe { OwnedFd::from_raw_fd(dup) };
        return crate::device::open_context(crate::device::the_device(), None, Some(cmd));
    }
    // SAFETY: fstat writes into a local stat buffer; a bad descriptor gives -1.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::fstat(cmd_fd, &mut st) } != 0 || st.st_mode & libc::S_IFMT != libc::S_IFCHR {
        return fail(libc::EINVAL);
    }
    fail(libc::ENODEV)
}

/// The PD `pd_handle` of `context`'s user context, as a PD object of `context`'s: EINVAL
/// when there is none.
#[no_mangle]
pub unsafe extern "C" fn ibv_import_pd(context: *mut ibv_context, pd_handle: u32) -> *mut ibv_pd {
    if context.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: an open context.
    let c = unsafe { ctx(context) };
    let found = find_shared(c, |o| {
        // SAFETY: a PD in the map is live while its lock is held (`ibv_dealloc_pd` takes it
        // out under the lock before freeing it): it is read here, under the lock.
        o.pds.get(&pd_handle).map(|&p| unsafe { pd(p as *mut ibv_pd) }.pd.clone())
    });
    let Some(soft) = found else { return fail(libc::EINVAL) };
    let ibv = ibv_pd { context, handle: pd_handle };
    Box::into_raw(Box::new(Pd::new(ibv, soft))).cast()
}

/// Frees the importer's PD object; the PD stays for the others that hold it.
#[no_mangle]
pub unsafe extern "C" fn ibv_unimport_pd(p: *mut ibv_pd) {
    // A parent domain is not an imported PD: left alone, as mlx5 refuses it (EINVAL).
    // SAFETY: a PD object of this library, or null.
    if !p.is_null() && unsafe { crate::mem::pd(p) }.parent.is_none() {
        // SAFETY: a PD object of this library that the program gives up.
        drop(unsafe { Box::from_raw(p as *mut Pd) });
    }
}

/// The MR `mr_handle` of `p`'s user context, on `p` (its PD must be the MR's): EINVAL
/// otherwise. Its address is NULL, as libibverbs leaves an imported MR's (the importer knows
/// where the memory is).
#[no_mangle]
pub unsafe extern "C" fn ibv_import_mr(p: *mut ibv_pd, mr_handle: u32) -> *mut ibv_mr {
    if p.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: a live PD.
    let d = unsafe { pd(p) };
    // SAFETY: its open context.
    let c = unsafe { ctx(d.ibv.context) };
    let found = find_shared(c, |o| {
        o.mrs.get(&mr_handle).map(|&m| {
            // SAFETY: an MR in the map is live while its lock is held (`ibv_dereg_mr` takes it
            // out under the lock before freeing it): it is read here, under the lock.
            // Field by field, no reference to the whole object: `ibv_rereg_mr` writes the
            // other fields (through its pointer) while it holds the region's lock, which this
            // read holds.
            let orig = m as *const Mr;
            // SAFETY: as above; `mr` itself is never written after the MR is made.
            let lock = unsafe { &(*orig).mr };
            let _region = lock.read().unwrap_or_else(|e| e.into_inner());
            // SAFETY: as above, under the lock; `dm` is never written after the MR is made.
            let (pd_handle, o, dm) = unsafe { ((*orig).pd_handle, &(*orig).ibv, (*orig).dm.clone()) };
            (pd_handle, o.length, o.handle, o.lkey, o.rkey, lock.clone(), dm)
        })
    });
    let Some((pd_handle, length, handle, lkey, rkey, region, dm)) = found else { return fail(libc::EINVAL) };
    // The MR's own record of its PD: the PD object it was registered through may be gone (an
    // imported PD, unimported) while the PD lives on.
    if pd_handle != d.ibv.handle {
        return fail(libc::EINVAL);
    }
    let ibv = ibv_mr { context: d.ibv.context, pd: p, addr: std::ptr::null_mut(), length, handle, lkey, rkey };
    // A region of device memory holds it through its import too: whichever object
    // deregisters the region (one can) gives the memory's hold back.
    Box::into_raw(Box::new(Mr { ibv, mr: region, pd_handle, imported: true, dm })).cast()
}

/// Frees the importer's MR object; the MR stays for the others that hold it.
#[no_mangle]
pub unsafe extern "C" fn ibv_unimport_mr(m: *mut ibv_mr) {
    if !m.is_null() {
        // SAFETY: an MR object of this library that the program gives up.
        drop(unsafe { Box::from_raw(m as *mut Mr) });
    }
}

/// A dma-buf is memory of another device's driver, which a user-space HCA cannot map.
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_dmabuf_mr(
    _pd: *mut ibv_pd,
    _offset: u64,
    _length: usize,
    _iova: u64,
    _fd: c_int,
    _access: c_int,
) -> *mut ibv_mr {
    fail(libc::EOPNOTSUPP)
}
