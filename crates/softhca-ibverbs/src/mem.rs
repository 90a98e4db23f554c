//! Protection domains, memory regions and address handles.

use std::ffi::{c_int, c_void};

use softhca::{Access, Ah as SoftAh, AhAttr, Gid, GlobalRoute, Mr as SoftMr, Mw as SoftMw, Pd as SoftPd};

use crate::abi::*;
use crate::context::ctx;
use crate::{command, errno_of, fail};

#[repr(C)]
pub(crate) struct Pd {
    pub ibv: ibv_pd,
    pub pd: SoftPd,
    /// The parent domains made of this PD: its dealloc is EBUSY while there are any.
    pub parents: std::sync::atomic::AtomicU32,
    /// A parent domain's own (`ibv_alloc_parent_domain`; see `domain`); None for a PD.
    pub parent: Option<Box<crate::domain::Parent>>,
}

impl Pd {
    /// A PD object over `pd`.
    pub(crate) fn new(ibv: ibv_pd, pd: SoftPd) -> Pd {
        Pd { ibv, pd, parents: Default::default(), parent: None }
    }
}

/// # Safety
/// `p` comes from [`ibv_alloc_pd`] and is not deallocated.
pub(crate) unsafe fn pd<'a>(p: *mut ibv_pd) -> &'a Pd {
    // SAFETY: `ibv` is the first field of the repr(C) Pd the pointer was made from.
    unsafe { &*(p as *const Pd) }
}

#[repr(C)]
pub(crate) struct Mr {
    pub ibv: ibv_mr,
    /// Shared with the MR objects `ibv_import_mr` made of it: one region, several handles.
    /// Written only by `ibv_rereg_mr`.
    pub mr: std::sync::Arc<std::sync::RwLock<SoftMr>>,
    /// The handle of the region's PD (the one `ibv.pd` names): what `ibv_import_mr` checks,
    /// which cannot read the PD object, freed if it was an imported one since unimported.
    /// Written, as `ibv.pd`, only under `mr`'s write lock (`ibv_rereg_mr`).
    pub pd_handle: u32,
    /// Made by `ibv_import_mr` (libibverbs' `IBV_MR_TYPE_IMPORTED_MR`), which `ibv_rereg_mr`
    /// refuses.
    pub imported: bool,
    /// A region of device memory (`ibv_reg_dm_mr`): the memory it holds until it is
    /// deregistered (`ibv_rereg_mr` refuses it).
    pub dm: Option<std::sync::Arc<crate::dm::DmMem>>,
}

impl Mr {
    /// The region, read.
    pub(crate) fn region(&self) -> std::sync::RwLockReadGuard<'_, SoftMr> {
        self.mr.read().unwrap_or_else(|e| e.into_inner())
    }
}

#[repr(C)]
pub(crate) struct Mw {
    pub ibv: ibv_mw,
    pub mw: SoftMw,
}

/// `ops.alloc_mw`: `IBV_MW_TYPE_1` or `IBV_MW_TYPE_2`.
pub(crate) unsafe extern "C" fn alloc_mw(p: *mut ibv_pd, mw_type: c_int) -> *mut ibv_mw {
    let kind = match mw_type {
        1 => softhca::MwType::Type1,
        2 => softhca::MwType::Type2,
        _ => return fail(libc::EINVAL),
    };
    // SAFETY: a live PD.
    let pd = unsafe { pd(p) };
    match pd.pd.alloc_mw_of(kind) {
        Ok(mw) => {
            let ibv = ibv_mw { context: pd.ibv.context, pd: p, rkey: mw.rkey(), handle: mw.rkey() >> 8, mw_type };
            Box::into_raw(Box::new(Mw { ibv, mw })).cast()
        }
        Err(e) => fail(errno_of(&e)),
    }
}

/// `ops.dealloc_mw`.
pub(crate) unsafe extern "C" fn dealloc_mw(m: *mut ibv_mw) -> c_int {
    command(|| {
        // SAFETY: a live window from alloc_mw.
        let w = unsafe { &*(m as *const Mw) };
        // SAFETY: an object of an open context.
        if unsafe { crate::context::left_by_fork((*m).context) } {
            return 0;
        }
        if let Err(e) = w.mw.dealloc() {
            return crate::errno_set(&e);
        }
        // SAFETY: from alloc_mw's Box::into_raw, freed once.
        drop(unsafe { Box::from_raw(m as *mut Mw) });
        0
    })
}

#[repr(C)]
pub(crate) struct Ah {
    pub ibv: ibv_ah,
    pub ah: SoftAh,
}

#[no_mangle]
pub unsafe extern "C" fn ibv_alloc_pd(context: *mut ibv_context) -> *mut ibv_pd {
    // SAFETY: an open context.
    let c = unsafe { ctx(context) };
    match c.ctx.alloc_pd() {
        Ok(pd) => {
            let handle = pd.handle();
            let p: *mut ibv_pd = Box::into_raw(Box::new(Pd::new(ibv_pd { context, handle }, pd))).cast();
            c.objects.lock().unwrap_or_else(|e| e.into_inner()).pds.insert(handle, p as usize);
            p
        }
        Err(e) => fail(errno_of(&e)),
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_dealloc_pd(p: *mut ibv_pd) -> c_int {
    command(|| {
        // SAFETY: a live PD.
        let d = unsafe { pd(p) };
        // SAFETY: an object of an open context.
        if unsafe { crate::context::left_by_fork((*p).context) } {
            return 0;
        }
        if d.parent.is_some() {
            // SAFETY: a parent domain, from `domain::alloc_parent_domain`.
            return unsafe { crate::domain::dealloc_parent_domain(p) };
        }
        if d.parents.load(std::sync::atomic::Ordering::Acquire) > 0 {
            return libc::EBUSY; // mlx5: a parent domain holds the PD
        }
        if let Err(e) = d.pd.dealloc() {
            return errno_of(&e);
        }
        // SAFETY: the PD's open context.
        let o = &unsafe { ctx(d.ibv.context) }.objects;
        o.lock().unwrap_or_else(|e| e.into_inner()).pds.remove(&d.ibv.handle);
        // SAFETY: from ibv_alloc_pd's Box::into_raw, freed once (the dealloc above succeeded).
        drop(unsafe { Box::from_raw(p as *mut Pd) });
        0
    })
}

fn access_of(flags: c_int) -> Access {
    Access::from_bits_truncate(flags as u32)
}

/// The access bits Linux knows (`IB_ACCESS_SUPPORTED`): 0..=9, up to the FLUSH ones, and the
/// optional range 20..=29, which a device without those features ignores.
const KNOWN_ACCESS: u32 = 0x3ff | 0x3ff0_0000;
/// The two FLUSH bits: capabilities softhca does not report.
const UNSUPPORTED_ACCESS: u32 = 1 << 8 | 1 << 9;
/// `IBV_ACCESS_ON_DEMAND`: on-demand paging, where the kernel lets the process copy its own
/// memory (`softhca::mem::odp`; reported in `odp_caps`).
pub(crate) const IBV_ACCESS_ON_DEMAND: u32 = 1 << 6;

/// The kernel's `ib_check_mr_access`, before it looks at the memory: EINVAL for remote write
/// or atomic without local write and for a bit it does not know (softhca would drop it),
/// EOPNOTSUPP for FLUSH, and for on-demand paging where it is not reported.
fn check_access(flags: c_int) -> Result<(), c_int> {
    let a = access_of(flags);
    let remote = a.intersects(Access::REMOTE_WRITE | Access::REMOTE_ATOMIC);
    if (remote && !a.contains(Access::LOCAL_WRITE)) || flags as u32 & !KNOWN_ACCESS != 0 {
        return Err(libc::EINVAL);
    }
    let odp_refused = flags as u32 & IBV_ACCESS_ON_DEMAND != 0 && !softhca::mem::odp::supported();
    if flags as u32 & UNSUPPORTED_ACCESS != 0 || odp_refused {
        return Err(libc::EOPNOTSUPP);
    }
    Ok(())
}

/// The access bits that make the kernel pin a region for writing (`ib_access_writable`: local
/// and remote write, remote atomic, window binding).
const WRITABLE: Access =
    Access::LOCAL_WRITE.union(Access::REMOTE_WRITE).union(Access::REMOTE_ATOMIC).union(Access::MW_BIND);

/// The system's page size (the kernel pins regions page by page).
fn page_size() -> usize {
    softhca::mem::odp::page_size()
}

/// Whether every page of `[addr, addr + len)` is mapped readable, and writable if `write`:
/// what the kernel's pin of a user region (`ib_umem_get`) demands of it, EFAULT otherwise.
/// softhca pins nothing: memory that fails this would be a crash at the first access to it (a
/// peer's Write, the engine's gather), where Linux refuses the registration. A region of
/// on-demand paging is not checked: it faults access by access instead.
fn mapped(addr: usize, len: usize, write: bool) -> bool {
    softhca::mem::odp::mapped(addr, len, write)
}

#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr(p: *mut ibv_pd, addr: *mut c_void, length: usize, access: c_int) -> *mut ibv_mr {
    // SAFETY: the caller's guarantees.
    unsafe { reg_mr(p, addr, length, addr as u64, access) }
}

/// `ibv_reg_mr` with the region's virtual addresses starting at `iova`.
///
/// # Safety
/// A live PD; memory the program keeps mapped until it deregisters the region.
unsafe fn reg_mr(p: *mut ibv_pd, addr: *mut c_void, length: usize, iova: u64, access: c_int) -> *mut ibv_mr {
    // SAFETY: a live PD.
    let pd = unsafe { pd(p) };
    if let Err(e) = check_access(access) {
        return fail(e);
    }
    let on_demand = access as u32 & IBV_ACCESS_ON_DEMAND != 0;
    // The implicit region of on-demand paging (mlx5's): the whole address space, at iova 0.
    let implicit = on_demand && addr.is_null() && length == usize::MAX;
    if implicit && iova != 0 {
        return fail(libc::EINVAL);
    }
    if (addr as usize).checked_add(length).is_none() {
        return fail(libc::EINVAL); // a range past the top of the address space
    }
    // The kernel pins the pages the range touches (`ib_umem_get`): no bytes at a page boundary
    // touch none, which the driver refuses (EINVAL on rxe); no bytes inside a page touch that
    // page and register.
    if length == 0 && (addr as usize).is_multiple_of(page_size()) {
        return fail(libc::EINVAL);
    }
    if !on_demand && !mapped(addr as usize, length, access_of(access).intersects(WRITABLE)) {
        return fail(libc::EFAULT);
    }
    // SAFETY: the caller registers memory it owns and keeps mapped until ibv_dereg_mr, as the
    // libibverbs contract says; softhca only touches it through the region's checks (a region
    // of on-demand paging through the kernel's copies, which fault instead of the process).
    let registered = unsafe {
        match (implicit, on_demand) {
            (true, _) => pd.pd.reg_mr_implicit(access_of(access)),
            (false, true) => pd.pd.reg_mr_on_demand(addr.cast(), length, iova, access_of(access)),
            (false, false) => pd.pd.reg_mr_raw_iova(addr.cast(), length, iova, access_of(access)),
        }
    };
    match registered {
        Ok(mr) => {
            let ibv = ibv_mr {
                context: pd.ibv.context,
                pd: p,
                addr,
                length,
                handle: mr.lkey(),
                lkey: mr.lkey(),
                // The key whatever the rights, as mlx5 and rxe since Linux 6.2 report it (6.1's
                // rxe reported 0 without remote rights): a program that reregisters the region
                // with remote rights (rdma-core's `test_mr_rereg_access`) keeps the key it
                // handed its peer.
                rkey: mr.rkey(),
            };
            let handle = ibv.handle;
            let mr = std::sync::Arc::new(std::sync::RwLock::new(mr));
            let m: *mut ibv_mr =
                Box::into_raw(Box::new(Mr { ibv, mr, pd_handle: pd.ibv.handle, imported: false, dm: None })).cast();
            // SAFETY: the PD's open context.
            let o = &unsafe { ctx(pd.ibv.context) }.objects;
            o.lock().unwrap_or_else(|e| e.into_inner()).mrs.insert(handle, m as usize);
            m
        }
        Err(e) => fail(errno_of(&e)),
    }
}

/// `ibv_reg_mr` with an I/O virtual address: local SGEs and remote accesses name the region's
/// memory from `iova` on. Its offset in a page must be the address's (EINVAL, as the kernel's
/// `ib_uverbs_reg_mr` checks).
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr_iova2(
    p: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: u32,
) -> *mut ibv_mr {
    let page = page_size() as u64;
    if iova % page != addr as u64 % page {
        return fail(libc::EINVAL);
    }
    // SAFETY: forwarded with the caller's guarantees.
    unsafe { reg_mr(p, addr, length, iova, access as c_int) }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr_iova(
    p: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_int,
) -> *mut ibv_mr {
    // SAFETY: forwarded with the caller's guarantees.
    unsafe { ibv_reg_mr_iova2(p, addr, length, iova, access as u32) }
}

/// `verbs_context.advise_mr` (`ibv_advise_mr`, which returns the errno): prefetch of ranges of
/// on-demand regions, as mlx5 answers it. Unknown advice is EOPNOTSUPP, unknown flags and an
/// empty list EINVAL (uverbs' attribute checks); an lkey that is not an on-demand region of
/// `pd`, or not writable for PREFETCH_WRITE, is ENOENT (mlx5's `get_prefetchable_mr`); a range
/// outside its region EFAULT. Prefetching faults the pages in (NO_FAULT touches nothing); with
/// IBV_ADVISE_MR_FLAG_FLUSH (synchronous) a page that cannot be is EFAULT, without it the
/// advice is best effort and answers 0.
pub(crate) unsafe extern "C" fn advise_mr(
    p: *mut ibv_pd,
    advice: c_int,
    flags: u32,
    sg: *mut ibv_sge,
    num: u32,
) -> c_int {
    let write = match advice {
        IBV_ADVISE_MR_ADVICE_PREFETCH | IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT => false,
        IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE => true,
        _ => return libc::EOPNOTSUPP,
    };
    if p.is_null() || flags & !IBV_ADVISE_MR_FLAG_FLUSH != 0 || num == 0 || sg.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: a live PD, and the program's list of `num` entries.
    let (d, list) = unsafe { (pd(p), std::slice::from_raw_parts(sg, num as usize)) };
    // SAFETY: the PD's open context.
    let objects = &unsafe { ctx(d.ibv.context) }.objects;
    for e in list {
        // Each region is looked at under the objects lock, which its deregistration takes
        // before it frees it; its pages are faulted in after, outside that lock (a prefetch of
        // gigabytes would hold up every other verb of the context), the region kept by its own
        // reference (faulting in the pages of a region deregistered meanwhile changes nothing).
        let lock = {
            let o = objects.lock().unwrap_or_else(|e| e.into_inner());
            let Some(&m) = o.mrs.get(&e.lkey) else { return libc::ENOENT };
            // SAFETY: an MR in the map is live while the lock is held; its lock alone is taken.
            let lock = unsafe { &(*(m as *const Mr)).mr };
            let region = lock.read().unwrap_or_else(|e| e.into_inner());
            // SAFETY: as above, under the region's lock (`ibv_rereg_mr` writes it under its
            // write lock).
            let pd_handle = unsafe { (*(m as *const Mr)).pd_handle };
            let writable = region.access().contains(Access::LOCAL_WRITE);
            if region.lkey() != e.lkey || pd_handle != d.ibv.handle || !region.is_on_demand() || (write && !writable) {
                return libc::ENOENT;
            }
            lock.clone()
        };
        if advice == IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT {
            continue;
        }
        let region = lock.read().unwrap_or_else(|e| e.into_inner());
        match region.prefetch(e.addr, u64::from(e.length), write) {
            Ok(()) => {}
            Err(softhca::AccessError::PageFault) if flags & IBV_ADVISE_MR_FLAG_FLUSH == 0 => {}
            // Deregistered, or its Local Write taken, since it was looked up above.
            Err(softhca::AccessError::BadKey | softhca::AccessError::MissingRight) => return libc::ENOENT,
            Err(_) => return libc::EFAULT,
        }
    }
    0
}

#[no_mangle]
pub unsafe extern "C" fn ibv_dereg_mr(m: *mut ibv_mr) -> c_int {
    command(|| {
        // SAFETY: a live MR from ibv_reg_mr.
        let mr = unsafe { &*(m as *const Mr) };
        // SAFETY: an object of an open context.
        if unsafe { crate::context::left_by_fork(mr.ibv.context) } {
            return 0;
        }
        match mr.region().dereg() {
            Ok(()) => {}
            // A region with windows bound: EINVAL, as rxe's `rxe_dereg_mr` answers.
            Err(softhca::VerbsError::InUse(_)) => return libc::EINVAL,
            Err(e) => return errno_of(&e),
        }
        // SAFETY: the MR's open context.
        let o = &unsafe { ctx(mr.ibv.context) }.objects;
        o.lock().unwrap_or_else(|e| e.into_inner()).mrs.remove(&mr.ibv.handle);
        if let Some(dm) = &mr.dm {
            // Deregistered, with no access left in flight: the device memory is free to go.
            dm.regions.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
        }
        // SAFETY: from ibv_reg_mr's Box::into_raw, freed once.
        drop(unsafe { Box::from_raw(m as *mut Mr) });
        0
    })
}

/// softhca's address from an `ibv_ah_attr`.
pub(crate) fn ah_attr_of(a: &ibv_ah_attr) -> AhAttr {
    let g = &a.grh;
    AhAttr {
        is_global: a.is_global != 0,
        grh: GlobalRoute {
            dgid: Some(Gid(g.dgid.raw)),
            flow_label: Some(g.flow_label),
            sgid_index: Some(g.sgid_index),
            hop_limit: Some(g.hop_limit),
            traffic_class: Some(g.traffic_class),
        },
        dlid: a.dlid,
        sl: a.sl,
        src_path_bits: a.src_path_bits,
        static_rate: a.static_rate,
        port_num: a.port_num,
    }
}

/// A program's address as Linux's RoCE core takes it where it resolves one (Create AH, a
/// connected QP's primary address vector): an empty source GID slot is ENODATA
/// ([`empty_source`]); then a unicast destination gets the route's hop limit
/// (`ib_resolve_unicast_gid_dmac` takes it from `ip4_dst_hoplimit`/`ip6_dst_hoplimit`: the
/// host's default TTL or hop limit, 64 unless configured), whatever the program asked for, so
/// Query QP reports it and the IP header carries it; a multicast one keeps its own.
pub(crate) fn resolve_ah_attr(ctx: &softhca::Context, a: &ibv_ah_attr) -> Result<AhAttr, c_int> {
    if empty_source(ctx, a) {
        return Err(libc::ENODATA);
    }
    let mut ah = ah_attr_of(a);
    let dgid = Gid(a.grh.dgid.raw);
    if a.is_global != 0 && !dgid.is_multicast() {
        ah.grh.hop_limit = Some(route_hop_limit(dgid.to_ipv4().is_some()));
    }
    Ok(ah)
}

/// The host's default IPv4 TTL or IPv6 hop limit (read once; 64, Linux's default, if unreadable).
fn route_hop_limit(ipv4: bool) -> u8 {
    static LIMITS: std::sync::OnceLock<(u8, u8)> = std::sync::OnceLock::new();
    let read = |path: &str| {
        std::fs::read_to_string(path).ok().and_then(|s| s.trim().parse::<u8>().ok()).filter(|&h| h > 0).unwrap_or(64)
    };
    let (v4, v6) = *LIMITS
        .get_or_init(|| (read("/proc/sys/net/ipv4/ip_default_ttl"), read("/proc/sys/net/ipv6/conf/all/hop_limit")));
    if ipv4 {
        v4
    } else {
        v6
    }
}

/// Whether `a` sends from an empty slot of the GID table: Linux refuses such an address
/// with ENODATA (`rdma_get_gid_attr`), there being no source address to send from; an index
/// past the table is EINVAL there, as here.
pub(crate) fn empty_source(ctx: &softhca::Context, a: &ibv_ah_attr) -> bool {
    a.is_global != 0 && ctx.query_gid(a.port_num, u32::from(a.grh.sgid_index)).is_ok_and(|g| g.is_zero())
}

/// The `ibv_ah_attr` of a softhca address.
pub(crate) fn c_ah_attr(a: &AhAttr) -> ibv_ah_attr {
    let g = &a.grh;
    ibv_ah_attr {
        grh: ibv_global_route {
            dgid: ibv_gid { raw: g.dgid.map_or([0; 16], |d| d.0) },
            flow_label: g.flow_label.unwrap_or(0),
            sgid_index: g.sgid_index.unwrap_or(0),
            hop_limit: g.hop_limit.unwrap_or(0),
            traffic_class: g.traffic_class.unwrap_or(0),
        },
        dlid: a.dlid,
        sl: a.sl,
        src_path_bits: a.src_path_bits,
        static_rate: a.static_rate,
        is_global: a.is_global as u8,
        port_num: a.port_num,
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_create_ah(p: *mut ibv_pd, attr: *mut ibv_ah_attr) -> *mut ibv_ah {
    // SAFETY: a live PD and a readable attribute structure.
    let (pd, attr) = unsafe { (pd(p), &*attr) };
    // SAFETY: the PD's context is open.
    let ah = match resolve_ah_attr(&unsafe { ctx(pd.ibv.context) }.ctx, attr) {
        Ok(ah) => ah,
        Err(e) => return fail(e),
    };
    match pd.pd.create_ah(&ah) {
        Ok(ah) => {
            let ibv = ibv_ah { context: pd.ibv.context, pd: p, handle: 0 };
            Box::into_raw(Box::new(Ah { ibv, ah })).cast()
        }
        Err(e) => fail(errno_of(&e)),
    }
}

/// The address of a UD completion's sender (`ibv_init_ah_from_wc`), as libibverbs 44 makes
/// it: the completion's fields; with `IBV_WC_GRH`, the GRH area's header (on RoCEv2 an IPv6
/// header, or 20 undefined bytes and an IPv4 header, PKT-ROCE-11, told apart as libibverbs'
/// `get_grh_header_version` does: a version nibble other than 6 at byte 0, or an IPv4 header
/// at byte 20 whose checksum holds), its source as the destination, and as the source GID
/// index the entry of this port's table holding the address the datagram was sent to. -1 with errno on failure:
/// EINVAL for a datagram sent to a multicast address (no entry holds one) or a NULL GRH area,
/// EPROTONOSUPPORT for a header of neither kind, and the table's error when no entry holds
/// the address.
#[no_mangle]
pub unsafe extern "C" fn ibv_init_ah_from_wc(
    context: *mut ibv_context,
    port_num: u8,
    wc: *mut ibv_wc,
    grh: *mut c_void,
    ah_attr: *mut ibv_ah_attr,
) -> c_int {
    // SAFETY: a readable completion.
    let wc = unsafe { &*wc };
    // The GRH area is registered memory of a receive buffer, which the device (an engine
    // thread) may be writing meanwhile: copied out, never borrowed as a slice.
    let g = (!grh.is_null()).then(|| {
        let mut g = [0u8; 40];
        // SAFETY: the 40 readable bytes of the GRH area, as libibverbs' contract says, into a
        // local array; the two do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(grh as *const u8, g.as_mut_ptr(), g.len()) };
        g
    });
    let word0 = g.map_or(0, |g| u32::from_be_bytes([g[0], g[1], g[2], g[3]]));
    // SAFETY: all-zero is a valid ibv_ah_attr.
    let mut out: ibv_ah_attr = unsafe { std::mem::zeroed() };
    out.grh.flow_label = word0 & 0xF_FFFF;
    out.dlid = wc.slid;
    out.sl = wc.sl;
    out.src_path_bits = wc.dlid_path_bits;
    out.port_num = port_num;
    let result = if wc.wc_flags & IBV_WC_GRH == 0 {
        Ok(())
    } else {
        out.is_global = 1;
        match g {
            None => Err(libc::EINVAL),
            // SAFETY: an open context.
            Some(g) => from_grh(&unsafe { ctx(context) }.ctx, port_num, &g, &mut out),
        }
    };
    // SAFETY: a writable attribute structure (libibverbs writes it on failure too).
    unsafe { std::ptr::write(ah_attr, out) };
    match result {
        Ok(()) => 0,
        Err(e) => {
            crate::set_errno(e);
            -1
        }
    }
}

/// `ibv_init_ah_from_wc`'s GRH part: the header's version (libibverbs'
/// `get_grh_header_version`), then the addresses.
fn from_grh(dev: &softhca::Context, port: u8, g: &[u8], out: &mut ibv_ah_attr) -> Result<(), c_int> {
    const IB_NEXT_HDR: u8 = 0x1b;
    let ip4 = &g[20..40];
    let ipv4 = if g[0] >> 4 != 6 {
        if ip4[0] >> 4 != 4 {
            return Err(libc::EPROTONOSUPPORT);
        }
        true
    } else {
        ip4[0] & 0xF == 5 && ipv4_checksum_holds(ip4)
    };
    let (dst, v2) = if ipv4 {
        if ip4[16] >> 4 == 0xE {
            return Err(libc::EINVAL); // a multicast destination (class D)
        }
        let mapped = |a: &[u8]| {
            let mut m = [0u8; 16];
            m[10..12].fill(0xFF);
            m[12..].copy_from_slice(a);
            m
        };
        out.grh.dgid.raw = mapped(&ip4[12..16]);
        out.grh.hop_limit = ip4[8];
        out.grh.traffic_class = ip4[1];
        (mapped(&ip4[16..20]), true)
    } else {
        let dst: [u8; 16] = g[24..40].try_into().unwrap_or_default();
        if dst[0] == 0xFF {
            return Err(libc::EINVAL);
        }
        let v2 = match g[6] {
            17 => true, // UDP: RoCE v2
            IB_NEXT_HDR => false,
            _ => return Err(libc::EPROTONOSUPPORT),
        };
        out.grh.dgid.raw = g[8..24].try_into().unwrap_or_default();
        out.grh.hop_limit = g[7];
        out.grh.traffic_class = (g[0] << 4) | (g[1] >> 4); // the 8 bits after the version
        (dst, v2)
    };
    // libibverbs' ibv_find_gid_index: the first entry holding the address, of the header's
    // type (a filled entry here is RoCE v2; an empty one, typed RoCE v1 as libibverbs types
    // it, holds nothing); none: EINVAL, the table query's error past its end. The index is
    // a byte (`sgid_index`), so the search ends at 255 if the table is longer.
    out.grh.sgid_index = (0..=u8::MAX)
        .map_while(|i| dev.query_gid(port, u32::from(i)).ok().map(|gid| (i, gid)))
        .find(|(_, gid)| v2 && gid.0 != [0; 16] && gid.0 == dst)
        .map(|(i, _)| i)
        .ok_or(libc::EINVAL)?;
    Ok(())
}

/// Whether a 20-byte IPv4 header's checksum holds, reckoned as libibverbs does
/// (`ipv4_calc_hdr_csum`): the header summed with its checksum field 0, folded once,
/// complemented, and compared with the field.
fn ipv4_checksum_holds(h: &[u8]) -> bool {
    let word = |i: usize| u32::from(u16::from_be_bytes([h[i], h[i + 1]]));
    let sum: u32 = (0..20).step_by(2).filter(|&i| i != 10).map(word).sum();
    let folded = (sum & 0xFFFF) + (sum >> 16);
    (!folded & 0xFFFF) == word(10)
}

#[no_mangle]
pub unsafe extern "C" fn ibv_create_ah_from_wc(
    p: *mut ibv_pd,
    wc: *mut ibv_wc,
    grh: *mut c_void,
    port_num: u8,
) -> *mut ibv_ah {
    // SAFETY: all-zero is a valid ibv_ah_attr.
    let mut attr: ibv_ah_attr = unsafe { std::mem::zeroed() };
    // SAFETY: forwarded with the caller's guarantees (a live PD).
    if unsafe { ibv_init_ah_from_wc(pd(p).ibv.context, port_num, wc, grh, &mut attr) } != 0 {
        return std::ptr::null_mut(); // errno set
    }
    // SAFETY: a live PD and the attributes just made.
    unsafe { ibv_create_ah(p, &mut attr) }
}

/// Attach QP to Multicast Group (`softhca::Qp::attach_mcast`: a UD QP and a multicast GID,
/// EINVAL otherwise; the LID ignored, as on any RoCE port; ENOMEM past the device's limits).
/// A member attaching again gets 0, as from uverbs. On the UDP link the attach also joins the
/// group on the device's interface, which on Linux only rdma_cm's join does.
#[no_mangle]
pub unsafe extern "C" fn ibv_attach_mcast(q: *mut ibv_qp, gid: *const ibv_gid, lid: u16) -> c_int {
    command(|| {
        if gid.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: the caller's live QP; `gid` is readable (not null).
        let (x, g) = unsafe { (crate::qp::qp(q), Gid((*gid).raw)) };
        x.qp.attach_mcast(g, lid).err().map_or(0, |e| errno_of(&e))
    })
}

/// Detach QP from Multicast Group: EINVAL for a group the QP is not attached to (uverbs').
#[no_mangle]
pub unsafe extern "C" fn ibv_detach_mcast(q: *mut ibv_qp, gid: *const ibv_gid, lid: u16) -> c_int {
    command(|| {
        if gid.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: the caller's live QP; `gid` is readable (not null).
        let (x, g) = unsafe { (crate::qp::qp(q), Gid((*gid).raw)) };
        // SAFETY: the QP's context is open.
        if unsafe { crate::context::left_by_fork(x.ibv.qp_base.context) } {
            return 0;
        }
        x.qp.detach_mcast(g, lid).err().map_or(0, |e| errno_of(&e))
    })
}

/// `ibv_rereg_mr`'s flags and answers (`enum ibv_rereg_mr_flags`, `ibv_rereg_mr_err_code`).
const IBV_REREG_MR_CHANGE_TRANSLATION: c_int = 1 << 0;
const IBV_REREG_MR_CHANGE_PD: c_int = 1 << 1;
const IBV_REREG_MR_CHANGE_ACCESS: c_int = 1 << 2;
/// What libibverbs 44 passes on (`IBV_REREG_MR_KEEP_VALID`, bit 3, went in v32).
const IBV_REREG_MR_FLAGS_SUPPORTED: c_int = (IBV_REREG_MR_CHANGE_ACCESS << 1) - 1;
const IBV_REREG_MR_ERR_INPUT: c_int = -1;
const IBV_REREG_MR_ERR_CMD: c_int = -4;

/// Reregister Memory Region (`softhca::Mr::rereg_raw`): a new PD, new rights or new memory
/// under the same keys. libibverbs' checks first (an imported region, an unknown flag, a
/// translation without an address or a length, rights without `IBV_REREG_MR_CHANGE_ACCESS`:
/// `IBV_REREG_MR_ERR_INPUT`, EINVAL), then the kernel's (`ib_uverbs_rereg_mr`: no flag,
/// rights as `ibv_reg_mr` checks them, a PD of another context;
/// memory that is not mapped with the rights: EFAULT, as the kernel's pin), each failing with
/// `IBV_REREG_MR_ERR_CMD` and errno. The translation is mlx5's: rxe answers it EOPNOTSUPP.
/// On success the program's `ibv_mr` gets the new PD, address and length, as libibverbs
/// writes them.
#[no_mangle]
pub unsafe extern "C" fn ibv_rereg_mr(
    m: *mut ibv_mr,
    flags: c_int,
    p: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> c_int {
    let input = |e| {
        crate::set_errno(e);
        IBV_REREG_MR_ERR_INPUT
    };
    let cmd = |e| {
        crate::set_errno(e);
        IBV_REREG_MR_ERR_CMD
    };
    if m.is_null() {
        return input(libc::EINVAL);
    }
    // The caller's live MR, which no other call on it uses meanwhile (libibverbs' rule); but
    // `ibv_import_mr` of a context sharing this one's reads it from other threads, under the
    // region's lock. So no reference to the whole object: its fields are read and written
    // through the pointer, under that lock.
    let x = m as *mut Mr;
    // SAFETY: as above; `imported`, `dm`, `mr` and the context are never written after it is
    // made.
    let (imported, on_dm, lock, context) = unsafe { ((*x).imported, (*x).dm.is_some(), &(*x).mr, (*x).ibv.context) };
    let translate = flags & IBV_REREG_MR_CHANGE_TRANSLATION != 0;
    if imported
        || flags & !IBV_REREG_MR_FLAGS_SUPPORTED != 0
        || (translate && (length == 0 || addr.is_null()))
        || (access != 0 && flags & IBV_REREG_MR_CHANGE_ACCESS == 0)
    {
        return input(libc::EINVAL);
    }
    if flags == 0 || on_dm {
        return cmd(libc::EINVAL); // and a region of device memory, whose memory cannot change
    }
    let new_access = if flags & IBV_REREG_MR_CHANGE_ACCESS != 0 {
        if let Err(e) = check_access(access) {
            return cmd(e);
        }
        Some(access_of(access))
    } else {
        None
    };
    let new_pd = if flags & IBV_REREG_MR_CHANGE_PD != 0 {
        // SAFETY: a non-null PD is the caller's live PD.
        match (!p.is_null()).then(|| unsafe { pd(p) }) {
            Some(d) if d.ibv.context == context => Some(d),
            _ => return cmd(libc::EINVAL),
        }
    } else {
        None
    };
    let mut region = lock.write().unwrap_or_else(|e| e.into_inner());
    // SAFETY: the MR's fields, under the lock (above).
    let (old_at, old_len) = unsafe { ((*x).ibv.addr, (*x).ibv.length) };
    let on_demand = region.is_on_demand();
    // On-demand paging is the region's for good: rights that add or drop it, or new memory for
    // the implicit region (which has all of it), are refused.
    let implicit = on_demand && old_at.is_null() && old_len == usize::MAX;
    let toggles = flags & IBV_REREG_MR_CHANGE_ACCESS != 0 && (access as u32 & IBV_ACCESS_ON_DEMAND != 0) != on_demand;
    if toggles || (translate && implicit) {
        return cmd(libc::EINVAL);
    }
    let rights = new_access.unwrap_or(region.access());
    let (at, len) = if translate { (addr as usize, length) } else { (old_at as usize, old_len) };
    if at.checked_add(len).is_none() {
        return cmd(libc::EINVAL);
    }
    // The kernel pins new memory with the rights it gets; rights that now write memory that
    // was registered read-only must find it writable too.
    if !on_demand && (translate || new_access.is_some()) && !mapped(at, len, rights.intersects(WRITABLE)) {
        return cmd(libc::EFAULT);
    }
    // SAFETY: new memory is the program's, kept mapped until it deregisters or reregisters
    // the region, as for ibv_reg_mr.
    let r = unsafe { region.rereg_raw(new_pd.map(|d| &d.pd), new_access, translate.then_some((addr.cast(), length))) };
    if let Err(e) = r {
        return cmd(errno_of(&e));
    }
    // SAFETY: the MR's fields, written under the lock (above).
    unsafe {
        if let Some(d) = new_pd {
            (*x).ibv.pd = p;
            (*x).pd_handle = d.ibv.handle;
        }
        if translate {
            (*x).ibv.addr = addr;
            (*x).ibv.length = length;
        }
        (*x).ibv.lkey = region.lkey();
        (*x).ibv.rkey = region.rkey();
    }
    0
}

#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_ah(a: *mut ibv_ah) -> c_int {
    command(|| {
        // SAFETY: a live AH from ibv_create_ah.
        let ah = unsafe { &*(a as *const Ah) };
        // SAFETY: an object of an open context.
        if unsafe { crate::context::left_by_fork((*a).context) } {
            return 0;
        }
        if let Err(e) = ah.ah.destroy() {
            return errno_of(&e);
        }
        // SAFETY: from ibv_create_ah's Box::into_raw, freed once.
        drop(unsafe { Box::from_raw(a as *mut Ah) });
        0
    })
}
