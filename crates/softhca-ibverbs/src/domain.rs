//! Thread domains and parent domains (`ibv_alloc_td`, `ibv_alloc_parent_domain`), as mlx5
//! has them. A parent domain is a PD object (`ibv_pd`, its handle the PD's) that stands for
//! the PD it was made of wherever a PD is taken: QPs, SRQs, regions, windows, address handles,
//! and the CQs of `ibv_create_cq_ex` with `IBV_CQ_INIT_ATTR_MASK_PD`, which take only a
//! parent domain. It holds its PD and thread domain, and QPs and CQs made through it hold it
//! (EBUSY for each dealloc meanwhile, as mlx5 counts them).
//!
//! What the two carry is for a provider with buffers of its own: a thread domain lets mlx5
//! give a QP a doorbell register and no lock, and a parent domain's allocators place its
//! queues' buffers. softhca's queues are the engine's memory, never the program's, so a
//! thread domain changes nothing and the allocators are kept but never called (a provider
//! may use them for any buffer or none; mlx5 uses them for some).

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicU32, Ordering};

use crate::abi::*;
use crate::fail;
use crate::mem::{pd, Pd};

/// A thread domain: an `ibv_td` and the parent domains that hold it.
#[repr(C)]
pub(crate) struct Td {
    ibv: ibv_td,
    users: AtomicU32,
}

/// What a parent domain adds to its PD object ([`Pd::parent`]).
pub(crate) struct Parent {
    /// The PD it was made of.
    protection: *mut ibv_pd,
    /// Its thread domain, or null.
    td: *mut ibv_td,
    /// QPs and CQs made through it.
    users: AtomicU32,
    /// The program's allocators and their context, kept as given.
    _alloc: Option<PdAlloc>,
    _free: Option<PdFree>,
    _pd_context: *mut c_void,
}

// SAFETY: the raw pointers name the program's objects, which outlive the parent domain (their
// deallocs are EBUSY while it holds them); they are only compared and counted through.
unsafe impl Send for Parent {}
// SAFETY: as above; the counter is atomic.
unsafe impl Sync for Parent {}

/// `verbs_context.alloc_td`: EINVAL for a null attribute or any `comp_mask` bit (mlx5).
pub(crate) unsafe extern "C" fn alloc_td(context: *mut ibv_context, attr: *mut ibv_td_init_attr) -> *mut ibv_td {
    // SAFETY: a readable attribute structure or null.
    if attr.is_null() || unsafe { (*attr).comp_mask } != 0 {
        return fail(libc::EINVAL);
    }
    Box::into_raw(Box::new(Td { ibv: ibv_td { context }, users: AtomicU32::new(0) })).cast()
}

/// `verbs_context.dealloc_td`: EBUSY while a parent domain holds it.
pub(crate) unsafe extern "C" fn dealloc_td(td: *mut ibv_td) -> c_int {
    // SAFETY: a live thread domain of an open context.
    if unsafe { crate::context::left_by_fork((*td).context) } {
        return 0;
    }
    // SAFETY: a live thread domain of this library.
    if unsafe { &*(td as *const Td) }.users.load(Ordering::Acquire) > 0 {
        return libc::EBUSY;
    }
    // SAFETY: from alloc_td's Box::into_raw, freed once.
    drop(unsafe { Box::from_raw(td as *mut Td) });
    0
}

/// `verbs_context.alloc_parent_domain`: EINVAL without a PD (libibverbs'
/// `ibv_check_alloc_parent_domain`), with an unknown `comp_mask` bit or allocators missing
/// one of the two (mlx5), and for a PD or thread domain of another context or a parent
/// domain as the PD.
pub(crate) unsafe extern "C" fn alloc_parent_domain(
    context: *mut ibv_context,
    attr: *mut ibv_parent_domain_init_attr,
) -> *mut ibv_pd {
    if attr.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: a readable attribute structure.
    let a = unsafe { &*attr };
    let known = IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS | IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT;
    let allocators = a.comp_mask & IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS != 0;
    if a.pd.is_null() || a.comp_mask & !known != 0 || (allocators && (a.alloc.is_none() || a.free.is_none())) {
        return fail(libc::EINVAL);
    }
    // SAFETY: the program's live PD and thread domain (or null).
    let (protection, td) = unsafe { (pd(a.pd), (!a.td.is_null()).then(|| &*(a.td as *const Td))) };
    if protection.parent.is_some() || protection.ibv.context != context || td.is_some_and(|t| t.ibv.context != context)
    {
        return fail(libc::EINVAL);
    }
    let parent = Parent {
        protection: a.pd,
        td: a.td,
        users: AtomicU32::new(0),
        _alloc: a.alloc.filter(|_| allocators),
        _free: a.free.filter(|_| allocators),
        _pd_context: if a.comp_mask & IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT != 0 {
            a.pd_context
        } else {
            std::ptr::null_mut()
        },
    };
    protection.parents.fetch_add(1, Ordering::AcqRel);
    if let Some(t) = td {
        t.users.fetch_add(1, Ordering::AcqRel);
    }
    // libibverbs' `ibv_initialize_parent_domain`: the context and handle of the PD.
    let mut d = Pd::new(ibv_pd { context, handle: protection.ibv.handle }, protection.pd.clone());
    d.parent = Some(Box::new(parent));
    Box::into_raw(Box::new(d)).cast()
}

/// `ibv_dealloc_pd` of a parent domain: EBUSY while QPs or CQs made through it exist;
/// otherwise its PD and thread domain are released and it is freed.
///
/// # Safety
/// `p` is a live parent domain of this library.
pub(crate) unsafe fn dealloc_parent_domain(p: *mut ibv_pd) -> c_int {
    // SAFETY: as the caller promises.
    let Some(parent) = unsafe { pd(p) }.parent.as_ref() else { return libc::EINVAL };
    if parent.users.load(Ordering::Acquire) > 0 {
        return libc::EBUSY;
    }
    // SAFETY: the PD and thread domain it holds are live (their deallocs wait for it).
    unsafe {
        pd(parent.protection).parents.fetch_sub(1, Ordering::AcqRel);
        if !parent.td.is_null() {
            (*(parent.td as *const Td)).users.fetch_sub(1, Ordering::AcqRel);
        }
    }
    // SAFETY: from alloc_parent_domain's Box::into_raw, freed once.
    drop(unsafe { Box::from_raw(p as *mut Pd) });
    0
}

/// A QP or CQ made through `p`: if it is a parent domain, one more user of it.
///
/// # Safety
/// `p` is a live PD object of this library, or null.
pub(crate) unsafe fn hold(p: *mut ibv_pd) {
    // SAFETY: as the caller promises.
    if let Some(parent) = (!p.is_null()).then(|| unsafe { pd(p) }).and_then(|d| d.parent.as_ref()) {
        parent.users.fetch_add(1, Ordering::AcqRel);
    }
}

/// The end of what [`hold`] counted.
///
/// # Safety
/// As [`hold`]; `p` held by the object going.
pub(crate) unsafe fn release(p: *mut ibv_pd) {
    // SAFETY: as the caller promises.
    if let Some(parent) = (!p.is_null()).then(|| unsafe { pd(p) }).and_then(|d| d.parent.as_ref()) {
        parent.users.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Whether `p` is a parent domain (what a CQ's `IBV_CQ_INIT_ATTR_MASK_PD` must name).
///
/// # Safety
/// As [`hold`].
pub(crate) unsafe fn is_parent(p: *mut ibv_pd) -> bool {
    // SAFETY: as the caller promises.
    !p.is_null() && unsafe { pd(p) }.parent.is_some()
}
