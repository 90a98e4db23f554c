//! What these libraries need to know of libibverbs' structures (rdma-core 44's
//! `infiniband/verbs.h`, x86-64 and other LP64 Linux targets), and the two queries the
//! software-steering domain makes through them.
//!
//! The real libmlx5 is compiled against `verbs.h`, whose `ibv_query_port` and
//! `ibv_query_device_ex` are inline functions: when the context is an extended one
//! (`abi_compat` holds `__VERBS_ABI_IS_EXTENDED`) and the surrounding `struct verbs_context`
//! is large enough to hold the operation and has it set, they call the operation through that
//! table; otherwise they fall back to the exported `ibv_query_port` / `ibv_query_device` (and
//! `ibv_query_device_ex` also falls back when the operation answers `EOPNOTSUPP` or `ENOSYS`).
//! [`query_port`] and [`query_device_ex`] do the same, so a domain is created on exactly the
//! contexts the real library creates one on. This crate links nothing but libc: the exported
//! fallbacks are looked up in the process (`dlsym`), where the program's libibverbs is.
//!
//! The offsets are checked against the installed header by `tests/answers.rs`.

use std::ffi::{c_int, c_void, CStr};

const _: () = assert!(std::mem::size_of::<usize>() == 8, "the offsets below are those of LP64 targets");

/// `offsetof(struct ibv_context, device)`.
pub const CONTEXT_DEVICE: usize = 0;
/// `offsetof(struct ibv_context, abi_compat)`.
pub const CONTEXT_ABI_COMPAT: usize = 320;
/// `offsetof(struct verbs_context, query_port)`.
pub const VCTX_QUERY_PORT: usize = 0;
/// `offsetof(struct verbs_context, query_device_ex)`.
pub const VCTX_QUERY_DEVICE_EX: usize = 216;
/// `offsetof(struct verbs_context, sz)`.
pub const VCTX_SZ: usize = 312;
/// `offsetof(struct verbs_context, context)`: the `ibv_context` is the last member.
pub const VCTX_CONTEXT: usize = 320;
/// `sizeof(struct verbs_context)`.
pub const VCTX_SIZE: usize = 648;
/// `sizeof(struct ibv_port_attr)`.
pub const PORT_ATTR_SIZE: usize = 52;
/// `offsetof(struct ibv_port_attr, link_layer)` (a `uint8_t`).
pub const PORT_ATTR_LINK_LAYER: usize = 46;
/// `sizeof(struct ibv_device_attr_ex)`.
pub const DEVICE_ATTR_EX_SIZE: usize = 400;
/// `offsetof(struct ibv_device_attr_ex, orig_attr) + offsetof(struct ibv_device_attr, fw_ver)`
/// (a `char[64]`).
pub const DEVICE_ATTR_FW_VER: usize = 0;
/// `offsetof(struct ibv_device, dev_name)` (a `char[64]`).
pub const DEVICE_DEV_NAME: usize = 88;
/// `offsetof(struct ibv_qp, qp_type)` (an `enum ibv_qp_type`).
pub const QP_TYPE: usize = 60;
/// `IBV_QPT_RAW_PACKET`.
pub const QPT_RAW_PACKET: u32 = 8;
/// `IBV_LINK_LAYER_ETHERNET`.
pub const LINK_LAYER_ETHERNET: u8 = 2;
/// `__VERBS_ABI_IS_EXTENDED`: `abi_compat`'s value in a context a `verbs_context` surrounds.
pub const VERBS_ABI_IS_EXTENDED: usize = usize::MAX;

/// The layout facts above, one `name value` per line, in the order of `tests/c/layout.c`.
pub fn layout_report() -> String {
    [
        ("context.device", CONTEXT_DEVICE),
        ("context.abi_compat", CONTEXT_ABI_COMPAT),
        ("verbs_context.query_port", VCTX_QUERY_PORT),
        ("verbs_context.query_device_ex", VCTX_QUERY_DEVICE_EX),
        ("verbs_context.sz", VCTX_SZ),
        ("verbs_context.context", VCTX_CONTEXT),
        ("sizeof(verbs_context)", VCTX_SIZE),
        ("sizeof(ibv_port_attr)", PORT_ATTR_SIZE),
        ("port_attr.link_layer", PORT_ATTR_LINK_LAYER),
        ("sizeof(ibv_device_attr_ex)", DEVICE_ATTR_EX_SIZE),
        ("device_attr_ex.orig_attr.fw_ver", DEVICE_ATTR_FW_VER),
        ("device.dev_name", DEVICE_DEV_NAME),
        ("qp.qp_type", QP_TYPE),
        ("IBV_QPT_RAW_PACKET", QPT_RAW_PACKET as usize),
        ("IBV_LINK_LAYER_ETHERNET", LINK_LAYER_ETHERNET as usize),
    ]
    .iter()
    .map(|(n, v)| format!("{n} {v}\n"))
    .collect()
}

/// A `struct ibv_port_attr`, as bytes.
#[repr(C, align(8))]
pub struct PortAttr(pub [u8; PORT_ATTR_SIZE]);

impl PortAttr {
    pub fn link_layer(&self) -> u8 {
        self.0[PORT_ATTR_LINK_LAYER]
    }
}

/// A `struct ibv_device_attr_ex`, as bytes.
#[repr(C, align(8))]
pub struct DeviceAttrEx(pub [u8; DEVICE_ATTR_EX_SIZE]);

impl DeviceAttrEx {
    /// `orig_attr.fw_ver`, up to its NUL.
    pub fn fw_ver(&self) -> Vec<u8> {
        let f = &self.0[DEVICE_ATTR_FW_VER..DEVICE_ATTR_FW_VER + 64];
        f[..f.iter().position(|&b| b == 0).unwrap_or(64)].to_vec()
    }
}

type QueryPortOp = unsafe extern "C" fn(*mut c_void, u8, *mut PortAttr, usize) -> c_int;
type QueryDeviceExOp = unsafe extern "C" fn(*mut c_void, *const c_void, *mut DeviceAttrEx, usize) -> c_int;
type QueryPortCompat = unsafe extern "C" fn(*mut c_void, u8, *mut PortAttr) -> c_int;
type QueryDevice = unsafe extern "C" fn(*mut c_void, *mut DeviceAttrEx) -> c_int;

/// `verbs_get_ctx_op(ctx, op)`: the operation at `op` (an offset in `struct verbs_context`)
/// if `ctx` is extended, its `verbs_context` is large enough to hold it and it is set.
///
/// # Safety
/// `ctx` is a live `struct ibv_context`.
unsafe fn ctx_op(ctx: *mut c_void, op: usize) -> Option<usize> {
    // SAFETY: abi_compat is a pointer-sized field of the live context.
    let compat = unsafe { ctx.cast::<u8>().add(CONTEXT_ABI_COMPAT).cast::<usize>().read() };
    if compat != VERBS_ABI_IS_EXTENDED {
        return None;
    }
    // SAFETY: an extended context is the last member of a verbs_context, whose `sz` field
    // tells how much of it (counted back from the context) exists.
    let vctx = unsafe { ctx.cast::<u8>().sub(VCTX_CONTEXT) };
    // SAFETY: `sz` sits immediately before the context, in every verbs_context.
    let sz = unsafe { vctx.add(VCTX_SZ).cast::<usize>().read() };
    if sz < VCTX_SIZE - op {
        return None;
    }
    // SAFETY: `sz` says the verbs_context reaches back to `op`.
    let f = unsafe { vctx.add(op).cast::<usize>().read() };
    (f != 0).then_some(f)
}

/// An exported libibverbs function of the process, by name (its default version).
fn exported(name: &CStr) -> Option<usize> {
    // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name only looks the name up.
    let f = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
    (!f.is_null()).then_some(f as usize)
}

/// `ibv_query_port(ctx, port, attr)` as `verbs.h` inlines it. Returns its result, an errno
/// value (`ENOSYS` if the process has no libibverbs to fall back on).
///
/// # Safety
/// `ctx` is a live `struct ibv_context`.
pub unsafe fn query_port(ctx: *mut c_void, port: u8, attr: &mut PortAttr) -> c_int {
    // SAFETY: ctx is live (caller).
    if let Some(f) = unsafe { ctx_op(ctx, VCTX_QUERY_PORT) } {
        // SAFETY: the verbs_context's query_port has this prototype.
        let f: QueryPortOp = unsafe { std::mem::transmute::<usize, QueryPortOp>(f) };
        // SAFETY: libibverbs' operation on its own live context, with a whole ibv_port_attr.
        return unsafe { f(ctx, port, attr, PORT_ATTR_SIZE) };
    }
    attr.0 = [0; PORT_ATTR_SIZE];
    let Some(f) = exported(c"ibv_query_port") else { return libc::ENOSYS };
    // SAFETY: libibverbs' exported ibv_query_port has this prototype.
    let f: QueryPortCompat = unsafe { std::mem::transmute::<usize, QueryPortCompat>(f) };
    // SAFETY: as above; the compatibility entry writes less than a whole ibv_port_attr.
    unsafe { f(ctx, port, attr) }
}

/// `ibv_query_device_ex(ctx, NULL, attr)` as `verbs.h` inlines it. Returns its result, an
/// errno value (`ENOSYS` if the process has no libibverbs to fall back on).
///
/// # Safety
/// `ctx` is a live `struct ibv_context`.
pub unsafe fn query_device_ex(ctx: *mut c_void, attr: &mut DeviceAttrEx) -> c_int {
    // SAFETY: ctx is live (caller).
    if let Some(f) = unsafe { ctx_op(ctx, VCTX_QUERY_DEVICE_EX) } {
        // SAFETY: the verbs_context's query_device_ex has this prototype.
        let f: QueryDeviceExOp = unsafe { std::mem::transmute::<usize, QueryDeviceExOp>(f) };
        // SAFETY: libibverbs' operation on its own live context, with a whole attribute block.
        let ret = unsafe { f(ctx, std::ptr::null(), attr, DEVICE_ATTR_EX_SIZE) };
        if ret != libc::EOPNOTSUPP && ret != libc::ENOSYS {
            return ret;
        }
    }
    attr.0 = [0; DEVICE_ATTR_EX_SIZE];
    let Some(f) = exported(c"ibv_query_device") else { return libc::ENOSYS };
    // SAFETY: libibverbs' exported ibv_query_device has this prototype; orig_attr is at 0.
    let f: QueryDevice = unsafe { std::mem::transmute::<usize, QueryDevice>(f) };
    // SAFETY: as above.
    unsafe { f(ctx, attr) }
}

/// The `dev_name` of the context's device, up to its NUL.
///
/// # Safety
/// `ctx` is a live `struct ibv_context` whose `device` is live.
pub unsafe fn dev_name(ctx: *mut c_void) -> Vec<u8> {
    // SAFETY: `device` is the context's first field; dev_name a char[64] of the device.
    let name = unsafe {
        let dev = ctx.cast::<u8>().add(CONTEXT_DEVICE).cast::<*const u8>().read();
        std::slice::from_raw_parts(dev.add(DEVICE_DEV_NAME), 64)
    };
    name[..name.iter().position(|&b| b == 0).unwrap_or(64)].to_vec()
}

/// The `qp_type` of a `struct ibv_qp`.
///
/// # Safety
/// `qp` is a live `struct ibv_qp`.
pub unsafe fn qp_type(qp: *const c_void) -> u32 {
    // SAFETY: qp_type is a 4-byte enum field of the live QP.
    unsafe { qp.cast::<u8>().add(QP_TYPE).cast::<u32>().read() }
}
