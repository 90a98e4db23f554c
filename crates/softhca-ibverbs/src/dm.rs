//! Device memory (`ibv_alloc_dm`, `ibv_memcpy_to_dm`/`ibv_memcpy_from_dm`, `ibv_reg_dm_mr`,
//! `ibv_free_dm`, `ibv_import_dm`), answered as mlx5 answers it for its on-chip memory
//! (MEMIC), the one device memory libibverbs users meet; rxe has none. A program written for
//! it runs here unchanged: the memory is the device's (a pool of [`MAX_DM_SIZE`] bytes per
//! device, out of the process's heap), reached through the two copies, which take 4-byte
//! aligned offsets and lengths as the hardware does, and registered as a zero-based region
//! (its SGEs and remote addresses are offsets into it) that the engine reaches like any
//! other. A registration holds the memory (`ibv_free_dm` is EBUSY meanwhile, as the kernel's
//! use count makes it); an import through a context on the same command file shares it.

use std::alloc::Layout;
use std::ffi::{c_int, c_uint, c_void};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;

use crate::abi::*;
use crate::context::{ctx, find_shared, left_by_fork};
use crate::fail;
use crate::mem::{pd, Mr};

/// The device memory a device has, as a ConnectX reports a few hundred KiB of MEMIC
/// (`max_dm_size` of `ibv_query_device_ex`).
pub(crate) const MAX_DM_SIZE: usize = 256 * 1024;
/// The pool's granule: an allocation takes a multiple of it (MEMIC's 64-byte base size).
const GRANULE: usize = 64;
/// The largest `log_align_req` taken: allocations are page-aligned.
const MAX_LOG_ALIGN: u32 = 12;
/// The access bits mlx5 takes for a region of device memory (`MLX5_DM_ALLOWED_ACCESS`).
const ALLOWED_ACCESS: c_uint = IBV_ACCESS_LOCAL_WRITE
    | IBV_ACCESS_REMOTE_WRITE
    | IBV_ACCESS_REMOTE_READ
    | IBV_ACCESS_REMOTE_ATOMIC
    | IBV_ACCESS_ZERO_BASED
    | 0x3ff0_0000; // IBV_ACCESS_OPTIONAL_RANGE

/// One allocation of device memory, shared by the objects that name it (the allocating one and
/// its imports) and the regions over it.
pub(crate) struct DmMem {
    ptr: NonNull<u8>,
    /// The length the program asked for: what copies and registrations are bounded by.
    len: usize,
    layout: Layout,
    /// Regions registered over it (`ibv_free_dm` is EBUSY while any is).
    pub regions: AtomicU32,
    /// The device's pool, which this allocation took `layout.size()` of.
    pool: Arc<AtomicUsize>,
}

// SAFETY: the memory is a heap allocation owned by this value; it is only reached through raw
// pointers (copies and the regions' accesses), as registered memory is.
unsafe impl Send for DmMem {}
// SAFETY: as above: nothing hands out references into it.
unsafe impl Sync for DmMem {}

impl Drop for DmMem {
    fn drop(&mut self) {
        // SAFETY: allocated in `alloc_dm` with this layout, freed once.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) };
        self.pool.fetch_sub(self.layout.size(), Ordering::AcqRel);
    }
}

impl DmMem {
    /// The bytes `[offset, offset + len)`: EFAULT past the end, EINVAL where the offset or the
    /// length is not a multiple of 4 (mlx5's `mlx5_access_dm`, in that order).
    fn range(&self, offset: u64, len: usize) -> Result<*mut u8, c_int> {
        let end = offset.checked_add(len as u64);
        if end.is_none_or(|end| end > self.len as u64) {
            return Err(libc::EFAULT);
        }
        if (offset | len as u64) & 3 != 0 {
            return Err(libc::EINVAL);
        }
        Ok(self.ptr.as_ptr().wrapping_add(offset as usize))
    }
}

/// The object behind an `ibv_dm`.
#[repr(C)]
pub(crate) struct Dm {
    pub ibv: ibv_dm,
    pub mem: Arc<DmMem>,
}

/// Handles of device memory: unique in the process, as the kernel's are in a user context.
static NEXT_HANDLE: AtomicU32 = AtomicU32::new(1);

/// # Safety
/// `d` is a live `ibv_dm` of this library.
unsafe fn dm<'a>(d: *mut ibv_dm) -> &'a Dm {
    // SAFETY: the `ibv_dm` is the first field of a repr(C) Dm.
    unsafe { &*(d as *const Dm) }
}

/// A new `ibv_dm` object of `context` over `mem`.
fn object(context: *mut ibv_context, handle: u32, mem: Arc<DmMem>) -> *mut ibv_dm {
    let ibv = ibv_dm {
        context,
        memcpy_to_dm: Some(memcpy_to_dm),
        memcpy_from_dm: Some(memcpy_from_dm),
        comp_mask: 0,
        handle,
    };
    Box::into_raw(Box::new(Dm { ibv, mem })).cast()
}

/// `verbs_context.alloc_dm`: EINVAL for an unknown `comp_mask` bit, no bytes, more than
/// `max_dm_size` or an alignment past a page (mlx5's checks); ENOMEM when the device's pool
/// has no room left.
pub(crate) unsafe extern "C" fn alloc_dm(context: *mut ibv_context, attr: *mut ibv_alloc_dm_attr) -> *mut ibv_dm {
    // SAFETY: a readable attribute structure, or null.
    let Some(a) = (unsafe { attr.as_ref() }) else { return fail(libc::EINVAL) };
    if context.is_null()
        || a.comp_mask != 0
        || a.length == 0
        || a.length > MAX_DM_SIZE
        || a.log_align_req > MAX_LOG_ALIGN
    {
        return fail(libc::EINVAL);
    }
    // SAFETY: an open context.
    let c = unsafe { ctx(context) };
    let size = a.length.div_ceil(GRANULE) * GRANULE;
    let pool = c.shared.dm_pool.clone();
    if pool.fetch_add(size, Ordering::AcqRel) + size > MAX_DM_SIZE {
        pool.fetch_sub(size, Ordering::AcqRel);
        return fail(libc::ENOMEM);
    }
    let Ok(layout) = Layout::from_size_align(size, 1 << MAX_LOG_ALIGN) else {
        pool.fetch_sub(size, Ordering::AcqRel);
        return fail(libc::EINVAL);
    };
    // SAFETY: a layout of non-zero size; the memory starts zeroed, as fresh MEMIC reads.
    let Some(ptr) = NonNull::new(unsafe { std::alloc::alloc_zeroed(layout) }) else {
        pool.fetch_sub(size, Ordering::AcqRel);
        return fail(libc::ENOMEM);
    };
    let mem = Arc::new(DmMem { ptr, len: a.length, layout, regions: AtomicU32::new(0), pool });
    let handle = NEXT_HANDLE.fetch_add(1, Ordering::Relaxed);
    let d = object(context, handle, mem);
    c.objects.lock().unwrap_or_else(|e| e.into_inner()).dms.insert(handle, d as usize);
    d
}

/// `verbs_context.free_dm`: EBUSY while a region is registered over it. Frees this object; the
/// memory stays until the last object naming it (the allocating one, its imports) is gone.
/// Only the allocating object takes the handle out of the context's map.
pub(crate) unsafe extern "C" fn free_dm(d: *mut ibv_dm) -> c_int {
    crate::command(|| {
        if d.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: a live DM of this library, of an open context.
        let (x, c) = unsafe { (dm(d), (*d).context) };
        // SAFETY: as above.
        if unsafe { left_by_fork(c) } {
            return 0;
        }
        if x.mem.regions.load(Ordering::Acquire) > 0 {
            return libc::EBUSY;
        }
        // SAFETY: its open context.
        let cx = unsafe { ctx(c) };
        let mut o = cx.objects.lock().unwrap_or_else(|e| e.into_inner());
        if o.dms.get(&x.ibv.handle) == Some(&(d as usize)) {
            o.dms.remove(&x.ibv.handle);
        }
        drop(o);
        // SAFETY: from `object`'s Box::into_raw, freed once.
        drop(unsafe { Box::from_raw(d as *mut Dm) });
        0
    })
}

/// `ibv_dm.memcpy_to_dm`.
unsafe extern "C" fn memcpy_to_dm(d: *mut ibv_dm, dm_offset: u64, host_addr: *const c_void, length: usize) -> c_int {
    // SAFETY: a live DM of this library.
    match unsafe { dm(d) }.mem.range(dm_offset, length) {
        // SAFETY: `length` readable bytes at `host_addr` (the caller's), into the DM's own.
        Ok(at) => unsafe {
            std::ptr::copy_nonoverlapping(host_addr.cast::<u8>(), at, length);
            0
        },
        Err(e) => e,
    }
}

/// `ibv_dm.memcpy_from_dm`.
unsafe extern "C" fn memcpy_from_dm(host_addr: *mut c_void, d: *mut ibv_dm, dm_offset: u64, length: usize) -> c_int {
    // SAFETY: a live DM of this library.
    match unsafe { dm(d) }.mem.range(dm_offset, length) {
        // SAFETY: `length` writable bytes at `host_addr` (the caller's), from the DM's own.
        Ok(at) => unsafe {
            std::ptr::copy_nonoverlapping(at.cast_const(), host_addr.cast::<u8>(), length);
            0
        },
        Err(e) => e,
    }
}

/// `verbs_context.reg_dm_mr`: a zero-based region over `[dm_offset, dm_offset + length)` of
/// the DM (no bytes is a region too, as on mlx5). EINVAL for access bits mlx5 does not take,
/// without IBV_ACCESS_ZERO_BASED (libibverbs: the memory has no address the program knows),
/// for remote write or atomic without local write (the kernel's `ib_check_mr_access`), and for
/// a range past the DM (the kernel's DM_MR_REG).
pub(crate) unsafe extern "C" fn reg_dm_mr(
    p: *mut ibv_pd,
    d: *mut ibv_dm,
    dm_offset: u64,
    length: usize,
    access: c_uint,
) -> *mut ibv_mr {
    if p.is_null() || d.is_null() || access & !ALLOWED_ACCESS != 0 || access & IBV_ACCESS_ZERO_BASED == 0 {
        return fail(libc::EINVAL);
    }
    let remote = access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC) != 0;
    if remote && access & IBV_ACCESS_LOCAL_WRITE == 0 {
        return fail(libc::EINVAL);
    }
    // SAFETY: a live PD and DM of this library.
    let (pdx, x) = unsafe { (pd(p), dm(d)) };
    let mem = &x.mem;
    if length > mem.len || dm_offset > (mem.len - length) as u64 {
        return fail(libc::EINVAL);
    }
    let rights =
        softhca::Access::from_bits_truncate(access) & !softhca::Access::from_bits_truncate(IBV_ACCESS_ZERO_BASED);
    let start = mem.ptr.as_ptr().wrapping_add(dm_offset as usize);
    // SAFETY: the DM's memory, kept alive by the region's `Mr` (its `dm`) until it is
    // deregistered; softhca reaches it only through the region's checks.
    let registered = unsafe { pdx.pd.reg_mr_raw_iova(start, length, 0, rights) };
    match registered {
        Ok(mr) => {
            mem.regions.fetch_add(1, Ordering::AcqRel);
            let ibv = ibv_mr {
                context: pdx.ibv.context,
                pd: p,
                addr: std::ptr::null_mut(), // zero-based: libibverbs leaves it NULL
                length,
                handle: mr.lkey(),
                lkey: mr.lkey(),
                rkey: mr.rkey(),
            };
            let handle = ibv.handle;
            let mr = Arc::new(std::sync::RwLock::new(mr));
            let m: *mut ibv_mr = Box::into_raw(Box::new(Mr {
                ibv,
                mr,
                pd_handle: pdx.ibv.handle,
                imported: false,
                dm: Some(mem.clone()),
            }))
            .cast();
            // SAFETY: the PD's open context.
            let o = &unsafe { ctx(pdx.ibv.context) }.objects;
            o.lock().unwrap_or_else(|e| e.into_inner()).mrs.insert(handle, m as usize);
            m
        }
        Err(e) => fail(crate::errno_of(&e)),
    }
}

/// The DM `dm_handle` of `context`'s user context (a context imported from the same command
/// file shares it), sharing its memory; EINVAL if there is none.
#[no_mangle]
pub unsafe extern "C" fn ibv_import_dm(context: *mut ibv_context, dm_handle: u32) -> *mut ibv_dm {
    if context.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: an open context.
    let c = unsafe { ctx(context) };
    let found = find_shared(c, |o| {
        // SAFETY: a DM in the map is live while the lock is held (`free_dm` takes it out
        // under the lock before freeing it).
        o.dms.get(&dm_handle).map(|&d| unsafe { dm(d as *mut ibv_dm) }.mem.clone())
    });
    match found {
        Some(mem) => object(context, dm_handle, mem),
        None => fail(libc::EINVAL),
    }
}

/// Frees the importer's DM object; the memory stays for the others that hold it.
#[no_mangle]
pub unsafe extern "C" fn ibv_unimport_dm(d: *mut ibv_dm) {
    if !d.is_null() {
        // SAFETY: a DM object of this library that the program gives up.
        drop(unsafe { Box::from_raw(d as *mut Dm) });
    }
}
