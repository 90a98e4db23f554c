//! The device-level verbs: the device list, Open/Close Device, the queries, asynchronous
//! events and the string helpers, and the ops tables a context hands the program (the one
//! file that names the other verbs' files). The context itself and the shared device behind
//! it are in `context.rs`.
//!
//! A process has one softhca0: the first Open Device opens a UDP device (one address, so one
//! GID and one port), and every context opened while it is open shares it, as contexts of one
//! adapter do under libibverbs: their QPs reach each other through the device's own address.
//! Each context keeps its objects and its asynchronous events; the device's events are handed
//! to the context that owns the object they name (port and device events to every context).
//! The device closes with its last context.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::net::IpAddr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::ptr::null_mut;
use std::sync::{Mutex, OnceLock};

use softhca::{AsyncEventType, EventElement, Mtu};

use crate::abi::*;
use crate::context::{acknowledge, cmd_file, ctx, shared_device, Ctx, EventQueue, Objects, DEVICE_NAME};
use crate::{command, errno_of, fail, set_errno};

/// The one device softhca shows; every Open Device gives a new UDP device (a new address).
struct Device {
    ibv: ibv_device,
}

// SAFETY: the device is written once, before it is shared, and only read afterwards.
unsafe impl Send for Device {}
// SAFETY: as above.
unsafe impl Sync for Device {}
/// The node GUID every context reports (softhca has no hardware GUID; a locally administered
/// EUI-64).
const NODE_GUID: u64 = 0x0200_5eff_fe00_5ca0;

fn copy_name(dst: &mut [c_char], s: &str) {
    let room = dst.len().saturating_sub(1);
    for (d, b) in dst.iter_mut().zip(s.bytes().take(room)) {
        *d = b as c_char;
    }
}

fn device() -> *mut ibv_device {
    static DEVICE: OnceLock<Box<Device>> = OnceLock::new();
    let d = DEVICE.get_or_init(|| {
        let mut ibv = ibv_device {
            _ops: _ibv_device_ops { _dummy1: null_mut(), _dummy2: null_mut() },
            node_type: IBV_NODE_CA,
            transport_type: IBV_TRANSPORT_IB,
            name: [0; IBV_SYSFS_NAME_MAX],
            dev_name: [0; IBV_SYSFS_NAME_MAX],
            dev_path: [0; IBV_SYSFS_PATH_MAX],
            ibdev_path: [0; IBV_SYSFS_PATH_MAX],
        };
        copy_name(&mut ibv.name, DEVICE_NAME);
        copy_name(&mut ibv.dev_name, "uverbs-softhca0");
        copy_name(&mut ibv.dev_path, "/nonexistent/softhca/uverbs-softhca0");
        copy_name(&mut ibv.ibdev_path, "/nonexistent/softhca/softhca0");
        Box::new(Device { ibv })
    });
    &d.ibv as *const ibv_device as *mut ibv_device
}

#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_list(num_devices: *mut c_int) -> *mut *mut ibv_device {
    // SAFETY: calloc of two pointers; checked for null below.
    let list = unsafe { libc::calloc(2, std::mem::size_of::<*mut ibv_device>()) } as *mut *mut ibv_device;
    if list.is_null() {
        return fail(libc::ENOMEM);
    }
    // SAFETY: `list` holds two pointers; the second stays null (the terminator).
    unsafe { *list = device() };
    if !num_devices.is_null() {
        // SAFETY: the caller passes a writable int or null.
        unsafe { *num_devices = 1 };
    }
    list
}

#[no_mangle]
pub unsafe extern "C" fn ibv_free_device_list(list: *mut *mut ibv_device) {
    // SAFETY: `list` came from ibv_get_device_list's calloc (or is null).
    unsafe { libc::free(list.cast()) };
}

#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_name(device: *mut ibv_device) -> *const c_char {
    if device.is_null() {
        return std::ptr::null();
    }
    // SAFETY: a device pointer from the list; `name` is NUL-terminated.
    unsafe { (*device).name.as_ptr() }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_guid(_device: *mut ibv_device) -> u64 {
    NODE_GUID.to_be()
}

#[no_mangle]
pub unsafe extern "C" fn ibv_open_device(device: *mut ibv_device) -> *mut ibv_context {
    if device.is_null() {
        return fail(libc::EINVAL);
    }
    open_context(device, None, None)
}

/// softhca0, as `ibv_get_device_list` lists it.
pub(crate) fn the_device() -> *mut ibv_device {
    device()
}

/// Open Device, the device on `addr` if it is not open yet (the connection manager binds
/// an address before it has a device: see `rdmacm`).
/// `cmd`: the command file of the context being imported (`ibv_import_device`), else a new one.
pub(crate) fn open_context(device: *mut ibv_device, addr: Option<IpAddr>, cmd: Option<OwnedFd>) -> *mut ibv_context {
    let shared = match shared_device(addr) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("softhca: cannot open a UDP device: {e}");
            return fail(e.raw_os_error().unwrap_or(libc::ENODEV));
        }
    };
    let cmd = match cmd {
        Some(fd) => Ok(fd),
        None => cmd_file(),
    };
    let (events, cmd) = match EventQueue::new().and_then(|q| Ok((q, cmd?))) {
        Ok(x) => x,
        Err(e) => return fail(e.raw_os_error().unwrap_or(libc::EMFILE)),
    };
    let ctx = shared.dev.context().clone();
    let async_fd = events.fd.as_raw_fd();
    let ops = ibv_context_ops {
        _compat_query_device: null_mut(),
        _compat_query_port: null_mut(),
        _compat_alloc_pd: null_mut(),
        _compat_dealloc_pd: null_mut(),
        _compat_reg_mr: null_mut(),
        _compat_rereg_mr: null_mut(),
        _compat_dereg_mr: null_mut(),
        alloc_mw: Some(crate::mem::alloc_mw),
        bind_mw: Some(crate::qp::bind_mw),
        dealloc_mw: Some(crate::mem::dealloc_mw),
        _compat_create_cq: null_mut(),
        poll_cq: Some(crate::cq::poll_cq),
        req_notify_cq: Some(crate::cq::req_notify_cq),
        _compat_cq_event: null_mut(),
        _compat_resize_cq: null_mut(),
        _compat_destroy_cq: null_mut(),
        _compat_create_srq: null_mut(),
        _compat_modify_srq: null_mut(),
        _compat_query_srq: null_mut(),
        _compat_destroy_srq: null_mut(),
        post_srq_recv: Some(crate::qp::post_srq_recv),
        _compat_create_qp: null_mut(),
        _compat_query_qp: null_mut(),
        _compat_modify_qp: null_mut(),
        _compat_destroy_qp: null_mut(),
        post_send: Some(crate::qp::post_send),
        post_recv: Some(crate::qp::post_recv),
        _compat_create_ah: null_mut(),
        _compat_destroy_ah: null_mut(),
        _compat_attach_mcast: null_mut(),
        _compat_detach_mcast: null_mut(),
        _compat_async_event: null_mut(),
    };
    let ops_ex = verbs_context_ops {
        query_port: Some(query_port_ex),
        advise_mr: Some(crate::mem::advise_mr),
        alloc_null_mr: null_mut(),
        read_counters: null_mut(),
        attach_counters_point_flow: null_mut(),
        create_counters: null_mut(),
        destroy_counters: null_mut(),
        reg_dm_mr: Some(crate::dm::reg_dm_mr),
        alloc_dm: Some(crate::dm::alloc_dm),
        free_dm: Some(crate::dm::free_dm),
        modify_flow_action_esp: null_mut(),
        destroy_flow_action: null_mut(),
        create_flow_action_esp: null_mut(),
        modify_qp_rate_limit: null_mut(),
        alloc_parent_domain: Some(crate::domain::alloc_parent_domain),
        dealloc_td: Some(crate::domain::dealloc_td),
        alloc_td: Some(crate::domain::alloc_td),
        modify_cq: null_mut(),
        post_srq_ops: null_mut(),
        destroy_rwq_ind_table: null_mut(),
        create_rwq_ind_table: null_mut(),
        destroy_wq: null_mut(),
        modify_wq: null_mut(),
        create_wq: null_mut(),
        query_rt_values: Some(query_rt_values),
        create_cq_ex: Some(crate::cq::create_cq_ex),
        priv_: null_mut(),
        query_device_ex: Some(query_device_ex),
        ibv_destroy_flow: null_mut(),
        abi_placeholder2: null_mut(),
        ibv_create_flow: null_mut(),
        abi_placeholder1: null_mut(),
        open_qp: null_mut(),
        create_qp_ex: Some(crate::qp::create_qp_ex),
        get_srq_num: Some(crate::qp::get_srq_num),
        create_srq_ex: Some(crate::qp::create_srq_ex),
        open_xrcd: Some(crate::xrcd::open_xrcd),
        close_xrcd: Some(crate::xrcd::close_xrcd),
        abi_placeholder3: 0,
        sz: size_of::<verbs_context>(),
    };
    let boxed = Box::new(Ctx {
        ops_ex,
        ibv: ibv_context {
            device,
            ops,
            cmd_fd: cmd.as_raw_fd(),
            async_fd,
            num_comp_vectors: comp_vectors(),
            // SAFETY: an all-zero pthread_mutex_t is PTHREAD_MUTEX_INITIALIZER on Linux.
            mutex: unsafe { std::mem::zeroed() },
            abi_compat: VERBS_ABI_IS_EXTENDED,
        },
        shared: shared.clone(),
        ctx,
        objects: Mutex::new(Objects::default()),
        events,
        cmd,
    });
    let p = Box::into_raw(boxed);
    shared.contexts.lock().unwrap_or_else(|e| e.into_inner()).push(p as usize);
    // SAFETY: a live box; the program holds its `ibv` field, as libibverbs hands out the
    // `context` member of its `verbs_context`.
    unsafe { std::ptr::addr_of_mut!((*p).ibv) }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_close_device(context: *mut ibv_context) -> c_int {
    if context.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: an open context.
    let p = (unsafe { ctx(context) } as *const Ctx).cast_mut();
    // SAFETY: as above; out of the routing list (under its lock) before it is freed.
    let c = unsafe { &*p };
    if c.shared.inherited() {
        // The parent's, left by a fork: its device's locks and threads are the parent's, so
        // nothing of it is touched or freed here (see `fork`).
        return 0;
    }
    let shared = c.shared.clone();
    shared.contexts.lock().unwrap_or_else(|e| e.into_inner()).retain(|&x| x != p as usize);
    // A thread waiting in ibv_get_async_event returns (EIO) before the context goes.
    c.events.close();
    // The kernel releases a closed context's objects. Its QPs go from the device, which other
    // contexts may keep open: none of them answers a peer or touches the program's memory
    // any more. (Their C structures stay allocated, as libibverbs leaves the provider's.)
    let qps: Vec<usize> = c.objects.lock().unwrap_or_else(|e| e.into_inner()).qps.values().copied().collect();
    for q in qps {
        // SAFETY: a QP of this context, not destroyed (Destroy QP takes it out of the map).
        let _ = unsafe { &*(q as *const crate::qp::Qp) }.qp.destroy();
    }
    drop(shared);
    // SAFETY: the pointer is the `ibv` field of ibv_open_device's Box::into_raw, closed once;
    // no reference to it is used after this.
    drop(unsafe { Box::from_raw(p) });
    0
}

#[no_mangle]
pub unsafe extern "C" fn ibv_query_device(context: *mut ibv_context, attr: *mut ibv_device_attr) -> c_int {
    command(|| {
        // SAFETY: an open context.
        let c = unsafe { ctx(context) };
        let a = match c.ctx.query_device() {
            Ok(a) => a,
            Err(e) => return errno_of(&e),
        };
        let n = |v: u32| v.min(i32::MAX as u32) as c_int;
        // SAFETY: the caller passes a writable ibv_device_attr; every byte is written.
        let out = unsafe { &mut *attr };
        // SAFETY: ibv_device_attr is plain old data; all-zero is valid.
        *out = unsafe { std::mem::zeroed() };
        copy_name(&mut out.fw_ver, &a.fw_ver);
        out.node_guid = NODE_GUID.to_be();
        out.sys_image_guid = NODE_GUID.to_be();
        out.max_mr_size = a.max_mr_size;
        out.page_size_cap = a.page_size_cap;
        out.vendor_id = a.vendor_id;
        out.vendor_part_id = a.vendor_part_id;
        out.hw_ver = a.hw_ver;
        out.max_qp = n(a.max_qp);
        out.max_qp_wr = n(a.max_qp_wr);
        // RESIZE_MAX_WR, AUTO_PATH_MIG (a device with a second address, SOFTHCA_ALT_ADDR),
        // UD_AV_PORT_ENFORCE (an address handle of another port is refused), SYS_IMAGE_GUID,
        // RC_RNR_NAK_GEN, SRQ_RESIZE, N_NOTIFY_CQ, MEM_WINDOW, MEM_MGT_EXTENSIONS (Local
        // Invalidate, Send with Invalidate, type 2 windows; rxe says so with the same three),
        // MEM_WINDOW_TYPE_2B (type 2 windows bound to a QP, as rxe's), XRC.
        out.device_cap_flags = if a.resize_wq { 1 } else { 0 }
            | if a.auto_path_mig { 1 << 4 } else { 0 }
            | if a.xrc { IBV_DEVICE_XRC } else { 0 }
            | 1 << 6
            | 1 << 11
            | 1 << 12
            | 1 << 13
            | 1 << 14
            | 1 << 17
            | 1 << 21
            | 1 << 24;
        out.max_sge = n(a.max_sge);
        out.max_sge_rd = n(a.max_sge_rd);
        out.max_cq = n(a.max_cq);
        out.max_cqe = n(a.max_cqe);
        out.max_mr = n(a.max_mr);
        out.max_pd = n(a.max_pd);
        out.max_qp_rd_atom = n(a.max_qp_rd_atom);
        out.max_res_rd_atom = n(a.max_res_rd_atom);
        out.max_qp_init_rd_atom = n(a.max_qp_init_rd_atom);
        out.atomic_cap = IBV_ATOMIC_GLOB;
        out.max_ee = n(a.max_ee);
        // libibverbs has Raw Packet QPs (Raw Ethertype) and no Raw IPv6 ones.
        out.max_raw_ethy_qp = n(a.max_raw_ethy_qp);
        out.max_rdd = n(a.max_rdd);
        out.max_mw = n(a.max_mw);
        out.max_ah = n(a.max_ah);
        out.max_mcast_grp = n(a.max_mcast_grp);
        out.max_mcast_qp_attach = n(a.max_mcast_qp_attach);
        out.max_total_mcast_qp_attach = n(a.max_total_mcast_qp_attach);
        out.max_srq = n(a.max_srq);
        out.max_srq_wr = n(a.max_srq_wr);
        out.max_srq_sge = n(a.max_srq_sge);
        out.max_pkeys = a.max_pkeys;
        out.local_ca_ack_delay = 15;
        out.phys_port_cnt = a.phys_port_cnt;
        0
    })
}

/// `verbs_context.query_device_ex`: the basic attributes and the extended ones softhca has
/// (one port; on-demand paging where `softhca::mem::odp` runs; no TSO, RSS, tag matching, pacing, device memory; completion timestamps in
/// nanoseconds of CLOCK_MONOTONIC, so `hca_core_clock` is 1 GHz). A program built against an
/// older header passes a smaller `attr_size`: only that much is written.
pub(crate) unsafe extern "C" fn query_device_ex(
    context: *mut ibv_context,
    input: *const ibv_query_device_ex_input,
    attr: *mut ibv_device_attr_ex,
    attr_size: usize,
) -> c_int {
    command(|| {
        // SAFETY: a readable input or null.
        if !input.is_null() && unsafe { (*input).comp_mask } != 0 {
            return libc::EINVAL;
        }
        if attr_size < size_of::<ibv_device_attr>() {
            return libc::EINVAL;
        }
        // SAFETY: ibv_device_attr_ex is plain old data; all-zero is valid.
        let mut a: ibv_device_attr_ex = unsafe { std::mem::zeroed() };
        // SAFETY: an open context and a writable structure.
        let r = unsafe { ibv_query_device(context, &mut a.orig_attr) };
        if r != 0 {
            return r;
        }
        a.completion_timestamp_mask = u64::MAX;
        a.hca_core_clock = 1_000_000; // kHz: timestamps count nanoseconds
        a.phys_port_cnt_ex = u32::from(a.orig_attr.phys_port_cnt);
        // The kernel's 64-bit flags, whose low half is `device_cap_flags`; above it Atomic
        // Write, as rxe sets it (libibverbs has no name for the bit and passes it through).
        a.device_cap_flags_ex = u64::from(a.orig_attr.device_cap_flags) | IB_UVERBS_DEVICE_ATOMIC_WRITE;
        a.pci_atomic_caps = ibv_pci_atomic_caps::default();
        a.max_dm_size = crate::dm::MAX_DM_SIZE as u64;
        if softhca::mem::odp::supported() {
            // On-demand paging on every transport and operation, and the implicit region.
            let rc = IBV_ODP_SUPPORT_SEND
                | IBV_ODP_SUPPORT_RECV
                | IBV_ODP_SUPPORT_WRITE
                | IBV_ODP_SUPPORT_READ
                | IBV_ODP_SUPPORT_ATOMIC
                | IBV_ODP_SUPPORT_SRQ_RECV;
            a.odp_caps = ibv_odp_caps {
                general_caps: IBV_ODP_SUPPORT | IBV_ODP_SUPPORT_IMPLICIT,
                rc_odp_caps: rc,
                uc_odp_caps: IBV_ODP_SUPPORT_SEND
                    | IBV_ODP_SUPPORT_RECV
                    | IBV_ODP_SUPPORT_WRITE
                    | IBV_ODP_SUPPORT_SRQ_RECV,
                ud_odp_caps: IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_SRQ_RECV,
            };
            a.xrc_odp_caps = rc;
        }
        // SAFETY: the caller passes `attr_size` writable bytes.
        unsafe { write_zero_padded(attr, &a, attr_size) };
        0
    })
}

fn mtu_code(m: Mtu) -> c_int {
    m as c_int
}

/// A port's `active_width` and `active_speed` codes for its speed in Gb/s, as Linux reports an
/// Ethernet port's to RoCE (`ib_get_eth_speed`: up to that many Gb/s, width, speed): the
/// device's 100 Gb/s is 4X EDR, as a 100 Gb/s RoCE NIC's. Programs size their protocols by it:
/// UCX on softhca over shm, told 1X EDR (25 Gb/s), sent `tag_bw`'s 64 KiB messages at 2.8
/// GB/s, told 4X EDR, 5.9-6.2 (2026-11-29).
const ETH_SPEEDS: [(u32, u8, u8); 6] = [
    (1, 1, 1),         // 1X SDR
    (10, 1, 8),        // 1X FDR10
    (20, 2, 2),        // 4X DDR
    (25, 1, 32),       // 1X EDR
    (40, 2, 8),        // 4X FDR10
    (u32::MAX, 2, 32), // 4X EDR
];

fn width_and_speed(gbps: u32) -> (u8, u8) {
    ETH_SPEEDS.iter().find(|&&(max, ..)| gbps <= max).map_or((2, 32), |&(_, w, s)| (w, s))
}

/// The port's attributes in the current layout.
fn port_attr(c: &Ctx, port_num: u8) -> Result<ibv_port_attr, c_int> {
    let p = c.ctx.query_port(port_num).map_err(|e| errno_of(&e))?;
    let (active_width, active_speed) = width_and_speed(p.active_speed_gbps);
    Ok(ibv_port_attr {
        state: p.state as c_int + 1, // IBV_PORT_DOWN = 1 … IBV_PORT_ACTIVE = 4
        max_mtu: mtu_code(p.max_mtu),
        active_mtu: mtu_code(p.active_mtu),
        gid_tbl_len: p.gid_tbl_len as c_int,
        // Connection management is supported (the CM answers on QP1), as rxe reports.
        port_cap_flags: IBV_PORT_CM_SUP,
        max_msg_sz: p.max_msg_sz,
        bad_pkey_cntr: 0,
        qkey_viol_cntr: 0,
        pkey_tbl_len: p.pkey_tbl_len,
        lid: p.lid,
        sm_lid: p.sm_lid,
        lmc: p.lmc,
        max_vl_num: 1,
        sm_sl: 0,
        subnet_timeout: 0,
        init_type_reply: 0,
        active_width,
        active_speed,
        phys_state: 5, // LinkUp
        link_layer: if p.link_layer_ethernet { IBV_LINK_LAYER_ETHERNET } else { 1 },
        // A RoCE port's addresses need the GRH (rxe and mlx5 say so; UCX and others read it).
        flags: if p.link_layer_ethernet { IBV_QPF_GRH_REQUIRED } else { 0 },
        port_cap_flags2: 0,
    })
}

/// Writes the first `len` bytes of `a` to `out` (a caller's structure of that size).
///
/// # Safety
/// `out` has `len` writable bytes, and `len` is at most the size of `T`.
unsafe fn write_prefix<T>(out: *mut T, a: &T, len: usize) {
    // SAFETY: as the caller promises; `a` has size_of::<T>() >= len readable bytes.
    unsafe { std::ptr::copy_nonoverlapping((a as *const T).cast::<u8>(), out.cast::<u8>(), len) };
}

/// Fills a caller's structure of `len` bytes, as libibverbs does after zeroing all of it:
/// `a` up to `len`, and zeros past the end of `T` (the fields of a newer, larger structure).
///
/// # Safety
/// `out` has `len` writable bytes.
unsafe fn write_zero_padded<T>(out: *mut T, a: &T, len: usize) {
    let n = len.min(size_of::<T>());
    // SAFETY: `n` <= both sizes; the tail is within the caller's `len` bytes.
    unsafe {
        write_prefix(out, a, n);
        std::ptr::write_bytes(out.cast::<u8>().add(n), 0, len - n);
    }
}

/// The compatibility entry (`verbs.h` calls it only for a context without the extended
/// `query_port`): writes the old layout's 48 bytes, up to `flags` (libibverbs zeroes them all
/// before the provider fills them).
#[no_mangle]
pub unsafe extern "C" fn ibv_query_port(context: *mut ibv_context, port_num: u8, attr: *mut ibv_port_attr) -> c_int {
    command(|| {
        // SAFETY: an open context.
        let c = unsafe { ctx(context) };
        match port_attr(c, port_num) {
            // SAFETY: the caller passes a port attribute structure at least as large as the old one.
            Ok(a) => unsafe { write_prefix(attr, &a, std::mem::offset_of!(ibv_port_attr, flags) + 1) },
            Err(e) => return e,
        }
        0
    })
}

/// `verbs_context.query_port`: the whole structure, as much of it as the program's
/// `port_attr_len` holds (a program built against an older header passes less).
pub(crate) unsafe extern "C" fn query_port_ex(
    context: *mut ibv_context,
    port_num: u8,
    attr: *mut ibv_port_attr,
    port_attr_len: usize,
) -> c_int {
    command(|| {
        // SAFETY: an open context.
        let c = unsafe { ctx(context) };
        match port_attr(c, port_num) {
            // SAFETY: the caller passes `port_attr_len` writable bytes.
            Ok(a) => unsafe { write_zero_padded(attr, &a, port_attr_len) },
            Err(e) => return e,
        }
        0
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_query_gid(
    context: *mut ibv_context,
    port_num: u8,
    index: c_int,
    gid: *mut ibv_gid,
) -> c_int {
    // SAFETY: an open context.
    let c = unsafe { ctx(context) };
    let Ok(index) = u32::try_from(index) else { return -1 };
    match c.ctx.query_gid(port_num, index) {
        Ok(g) => {
            // SAFETY: the caller passes a writable gid.
            unsafe { (*gid).raw = g.0 };
            0
        }
        Err(_) => {
            crate::set_errno(libc::EINVAL);
            -1
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_query_pkey(
    context: *mut ibv_context,
    port_num: u8,
    index: c_int,
    pkey: *mut u16,
) -> c_int {
    // SAFETY: an open context.
    let c = unsafe { ctx(context) };
    // libibverbs reads the key from sysfs (`ports/<port>/pkeys/<index>`): a port or index
    // past the table is a file that is not there, ENOENT.
    let found = u16::try_from(index).ok().and_then(|i| c.ctx.query_pkey(port_num, i).ok());
    let Some(p) = found else {
        set_errno(libc::ENOENT);
        return -1;
    };
    // SAFETY: the caller passes a writable u16.
    unsafe { *pkey = p.to_be() };
    0
}

/// rdma-core's private `ibv_query_gid_type` (ibv_devinfo calls it): every GID is RoCE v2.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_gid_type(
    context: *mut ibv_context,
    port_num: u8,
    index: u32,
    gid_type: *mut c_int,
) -> c_int {
    // SAFETY: an open context.
    let c = unsafe { ctx(context) };
    // An index past the table is the kernel's EINVAL; an empty slot its ENODATA, which
    // libibverbs answers with 0 and IBV_GID_TYPE_SYSFS_IB_ROCE_V1 ("preserve API behavior for
    // empty GID"); a GID of softhca's is RoCE v2.
    let Ok(g) = c.ctx.query_gid(port_num, index) else {
        crate::set_errno(libc::EINVAL);
        return -1;
    };
    // SAFETY: the caller passes a writable enum.
    unsafe { *gid_type = if g.is_zero() { 0 } else { 1 } };
    0
}

/// There is no sysfs for softhca: every read fails (callers treat the value as absent).
#[no_mangle]
pub unsafe extern "C" fn ibv_read_sysfs_file(
    _dir: *const c_char,
    _file: *const c_char,
    _buf: *mut c_char,
    _size: usize,
) -> c_int {
    -1
}

fn event_code(t: AsyncEventType) -> c_int {
    use AsyncEventType::*;
    match t {
        CqErr => 0,
        QpFatal => 1,
        QpReqErr => 2,
        QpAccessErr => 3,
        CommEst => 4,
        SqDrained => 5,
        PathMig => 6,
        PathMigErr => 7,
        DeviceFatal => 8,
        PortActive => 9,
        PortErr => 10,
        SrqErr => 14,
        SrqLimitReached => 15,
        QpLastWqeReached => 16,
    }
}

/// The next asynchronous event of the context; -1 with EAGAIN when none waits on a
/// non-blocking `async_fd`, and with EIO when the context is closed meanwhile (its close
/// waits until this has returned).
#[no_mangle]
pub unsafe extern "C" fn ibv_get_async_event(context: *mut ibv_context, event: *mut ibv_async_event) -> c_int {
    // SAFETY: an open context.
    let c = unsafe { ctx(context) };
    if !c.events.enter() {
        crate::set_errno(libc::EIO);
        return -1;
    }
    // SAFETY: an open context (its close waits for `leave`) and a writable event.
    let r = unsafe { next_async_event(c, event) };
    c.events.leave();
    r
}

/// [`ibv_get_async_event`] between `enter` and `leave`.
///
/// # Safety
/// `event` is writable.
unsafe fn next_async_event(c: &Ctx, event: *mut ibv_async_event) -> c_int {
    loop {
        let ev = match c.events.pop(crate::nonblocking(c.ibv.async_fd)) {
            Ok(Some(ev)) => ev,
            Ok(None) => {
                crate::set_errno(libc::EAGAIN);
                return -1;
            }
            Err(e) => {
                crate::set_errno(e);
                return -1;
            }
        };
        let mut objects = c.objects.lock().unwrap_or_else(|e| e.into_inner());
        let object = match ev.element {
            EventElement::Qp(qpn) => objects.qps.get(&qpn).copied(),
            EventElement::Cq(h) => objects.cqs.get(&h).copied(),
            EventElement::Srq(h) => objects.srqs.get(&h).copied(),
            EventElement::Port(p) => {
                let e = ibv_async_event { element: p as usize as *mut c_void, event_type: event_code(ev.event_type) };
                // SAFETY: the caller passes a writable event.
                unsafe { std::ptr::write(event, e) };
                return 0;
            }
            EventElement::Device => Some(0),
        };
        // An event whose object was destroyed meanwhile names nothing: the next one.
        let Some(object) = object else { continue };
        if object != 0 {
            // Counted under the objects lock: a destroy that takes the object out later waits
            // for this event's acknowledgement.
            *objects.delivered.entry(object).or_default() += 1;
        }
        let e = ibv_async_event { element: object as *mut c_void, event_type: event_code(ev.event_type) };
        // SAFETY: the caller passes a writable event.
        unsafe { std::ptr::write(event, e) };
        return 0;
    }
}

/// Acknowledges an event: its object's destroy waits for this (see [`crate::context::wait_for_acks`]).
#[no_mangle]
pub unsafe extern "C" fn ibv_ack_async_event(event: *mut ibv_async_event) {
    // SAFETY: an event ibv_get_async_event filled; its object stays alive until this
    // acknowledgement (its destroy waits for it).
    let e = unsafe { &*event };
    if e.element.is_null() {
        return;
    }
    // SAFETY: as above: the element is the object the event type names.
    unsafe {
        match e.event_type {
            0 => {
                let c = e.element as *mut ibv_cq;
                acknowledge(
                    std::ptr::addr_of_mut!((*c).mutex),
                    std::ptr::addr_of_mut!((*c).cond),
                    std::ptr::addr_of_mut!((*c).async_events_completed),
                    1,
                )
            }
            1..=7 | 16 => {
                let q = e.element as *mut ibv_qp;
                acknowledge(
                    std::ptr::addr_of_mut!((*q).mutex),
                    std::ptr::addr_of_mut!((*q).cond),
                    std::ptr::addr_of_mut!((*q).events_completed),
                    1,
                )
            }
            14 | 15 => {
                let s = e.element as *mut ibv_srq;
                acknowledge(
                    std::ptr::addr_of_mut!((*s).mutex),
                    std::ptr::addr_of_mut!((*s).cond),
                    std::ptr::addr_of_mut!((*s).events_completed),
                    1,
                )
            }
            _ => {}
        }
    }
}

macro_rules! c_strs {
    ($($s:literal),* $(,)?) => { [$(concat!($s, "\0")),*] };
}

fn c_str(table: &[&'static str], i: c_int, unknown: &'static str) -> *const c_char {
    let s = usize::try_from(i).ok().and_then(|i| table.get(i)).copied().unwrap_or(unknown);
    debug_assert!(CStr::from_bytes_with_nul(s.as_bytes()).is_ok());
    s.as_ptr().cast()
}

#[no_mangle]
pub unsafe extern "C" fn ibv_wc_status_str(status: c_int) -> *const c_char {
    const S: [&str; 22] = c_strs!(
        "success",
        "local length error",
        "local QP operation error",
        "local EE context operation error",
        "local protection error",
        "Work Request Flushed Error",
        "memory management operation error",
        "bad response error",
        "local access error",
        "remote invalid request error",
        "remote access error",
        "remote operation error",
        "transport retry counter exceeded",
        "RNR retry counter exceeded",
        "local RDD violation error",
        "remote invalid RD request",
        "aborted error",
        "invalid EE context number",
        "invalid EE context state",
        "fatal error",
        "response timeout error",
        "general error",
    );
    c_str(&S, status, "unknown\0")
}

#[no_mangle]
pub unsafe extern "C" fn ibv_port_state_str(state: c_int) -> *const c_char {
    const S: [&str; 6] = c_strs!("no state change (NOP)", "down", "init", "armed", "active", "active defer");
    c_str(&S, state, "unknown\0")
}

#[no_mangle]
pub unsafe extern "C" fn ibv_node_type_str(node_type: c_int) -> *const c_char {
    const S: [&str; 5] =
        c_strs!("unknown", "InfiniBand channel adapter", "InfiniBand switch", "InfiniBand router", "iWARP NIC");
    c_str(&S, node_type, "unknown\0")
}

#[no_mangle]
pub unsafe extern "C" fn ibv_event_type_str(event: c_int) -> *const c_char {
    const S: [&str; 19] = c_strs!(
        "CQ error",
        "local work queue catastrophic error",
        "invalid request local work queue error",
        "local access violation work queue error",
        "communication established",
        "send queue drained",
        "path migrated",
        "path migration request error",
        "local catastrophic error",
        "port active",
        "port error",
        "LID change",
        "P_Key change",
        "SM change",
        "SRQ catastrophic error",
        "SRQ limit reached",
        "last WQE reached",
        "client reregistration",
        "GID table change",
    );
    c_str(&S, event, "unknown\0")
}

/// `ibv_query_rt_values_ex`: the device's clock now, in the units of its completion
/// timestamps (CLOCK_MONOTONIC nanoseconds, `hca_core_clock` 1 GHz), as mlx5 answers it
/// (`raw_clock.tv_nsec` the count, `tv_sec` 0); EINVAL for a mask bit it does not know.
unsafe extern "C" fn query_rt_values(_context: *mut ibv_context, values: *mut ibv_values_ex) -> c_int {
    if values.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: the program's structure, readable and writable.
    let v = unsafe { &mut *values };
    if v.comp_mask & !IBV_VALUES_MASK_RAW_CLOCK != 0 {
        return libc::EINVAL;
    }
    if v.comp_mask & IBV_VALUES_MASK_RAW_CLOCK != 0 {
        let ns = crate::cq::now_ns(libc::CLOCK_MONOTONIC);
        v.raw_clock = libc::timespec { tv_sec: 0, tv_nsec: ns as _ };
    }
    0
}

/// Completion vectors, one per CPU as rxe counts them (`num_possible_cpus`): a program that
/// picks a vector below that gets its CQ. All of them are one here (one engine thread wakes
/// every channel), as all of rxe's are one workqueue.
fn comp_vectors() -> c_int {
    // SAFETY: sysconf reads a system value.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) };
    n.clamp(1, 4096) as c_int
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The width and speed codes of a port, as Linux gives a RoCE port of that Ethernet speed.
    #[test]
    fn a_port_reports_its_speed_as_linux_reports_an_ethernet_port() {
        for (gbps, want) in
            [(1, (1, 1)), (10, (1, 8)), (20, (2, 2)), (25, (1, 32)), (40, (2, 8)), (100, (2, 32)), (400, (2, 32))]
        {
            assert_eq!(width_and_speed(gbps), want, "{gbps} Gb/s");
        }
    }
}
