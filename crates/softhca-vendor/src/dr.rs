//! The software-steering API, `mlx5dv_dr_*` (`providers/mlx5/dr_*.c` in rdma-core 44).
//!
//! Unlike the rest of libmlx5 this layer does not start by checking that the device is an
//! mlx5 device, and parts of it work on any device:
//!
//! - `mlx5dv_dr_domain_create` queries port 1 and the device through libibverbs, refuses a
//!   port whose link layer is not Ethernet, and then asks the device for its steering
//!   capabilities with a DevX command. On a non-mlx5 context that command fails with
//!   `EOPNOTSUPP`, and the real code deliberately ignores the failure (so that root-level
//!   steering works without DevX): the domain is created, without software steering. A
//!   softhca port is Ethernet (RoCE), so on a softhca context the real library hands out a
//!   domain, and so does this one.
//! - Root tables (level 0) need nothing from the device; any other level needs software
//!   steering and fails with `EOPNOTSUPP`.
//! - Drop, tag, default-miss, VLAN pop and VLAN push actions, and a destination action for a
//!   raw-packet QP, are plain allocations that never look at a device.
//! - Everything that reaches the device fails as the real code fails there: matchers on a
//!   root table are mlx5 flow matchers (`mlx5dv_create_flow_matcher` on the domain's context:
//!   `EOPNOTSUPP`), root-level modify-header and reformat actions are mlx5 flow actions
//!   (`EOPNOTSUPP`), destination arrays and samplers create DevX flow tables (`EOPNOTSUPP`),
//!   and whatever needs software steering answers `EOPNOTSUPP`. So no matcher, rule,
//!   multi-destination or sampler action can exist, and nothing ever takes a reference to a
//!   table or an action: the only references are those of a domain's tables on it.
//!
//! The objects handed out are kept in a registry of live objects, so a pointer that is not a
//! live domain, table or action of this library (NULL included, or one already destroyed) is
//! refused with `EINVAL` (as errno for the functions returning a pointer, as the return value
//! for those returning an `int`) instead of being dereferenced, where the real library would
//! read it as one of its own. Matchers and rules, which cannot be created here, are always
//! refused that way.

use std::collections::BTreeMap;
use std::ffi::{c_int, c_void, CString};
use std::sync::{Arc, Mutex, MutexGuard};

use libc::{EBUSY, EINVAL, ENOMEM, EOPNOTSUPP};

use crate::{abi, fail, set_errno};

/// `MLX5DV_DR_DOMAIN_TYPE_NIC_RX`.
pub const DOMAIN_TYPE_NIC_RX: u32 = 0;
/// `MLX5DV_DR_DOMAIN_TYPE_NIC_TX`.
pub const DOMAIN_TYPE_NIC_TX: u32 = 1;
/// `MLX5DV_DR_DOMAIN_TYPE_FDB`.
pub const DOMAIN_TYPE_FDB: u32 = 2;
/// The domain flag `mlx5dv_dr_domain_set_reclaim_device_memory` sets.
const FLAG_MEMORY_RECLAIM: u32 = 1 << 0;
/// The domain flag `mlx5dv_dr_domain_allow_duplicate_rules(false)` sets.
const FLAG_DISABLE_DUPLICATE_RULES: u32 = 1 << 1;
/// `MLX5DV_DR_ACTION_FLAGS_ROOT_LEVEL`, the only action flag.
pub const ACTION_FLAGS_ROOT_LEVEL: u32 = 1 << 0;
/// The size of one modify-header action.
const MODIFY_ACTION_SIZE: usize = 8;
const CVLAN_ETHERTYPE: u32 = 0x8100;
const SVLAN_ETHERTYPE: u32 = 0x88a8;
/// `MLX5DV_FLOW_ACTION_PACKET_REFORMAT_TYPE_*`.
const REFORMAT_L2_TUNNEL_TO_L2: u32 = 0;
const REFORMAT_L2_TO_L2_TUNNEL: u32 = 1;
const REFORMAT_L3_TUNNEL_TO_L2: u32 = 2;
const REFORMAT_L2_TO_L3_TUNNEL: u32 = 3;
/// `MLX5DV_DR_ACTION_DEST` and `MLX5DV_DR_ACTION_DEST_REFORMAT`.
pub const DEST: u32 = 0;
pub const DEST_REFORMAT: u32 = 1;
/// rdma-core's version, which the domain dump records.
const PACKAGE_VERSION: &str = "44.0";

/// A steering domain: root level only (no software steering).
pub struct Domain {
    /// The `struct ibv_context *` it was created on.
    ctx: usize,
    /// Its `enum mlx5dv_dr_domain_type`.
    kind: u32,
    /// The device's firmware version, from the query at creation (the dump records it).
    fw_ver: Vec<u8>,
    state: Mutex<DomainState>,
}

struct DomainState {
    flags: u32,
    /// Its tables' addresses, in creation order (each holds a reference on the domain).
    tables: Vec<usize>,
}

/// A root table (level 0, the only level a domain without software steering has).
pub struct Table {
    dmn: Arc<Domain>,
}

/// What an action of this library is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActionKind {
    Drop,
    /// The flow tag, its low 24 bits.
    Tag(u32),
    DefaultMiss,
    PopVlan,
    /// The VLAN header in host order.
    PushVlan(u32),
    /// The `struct ibv_qp *` (a raw-packet QP).
    DestQp(usize),
}

struct Action {
    kind: ActionKind,
}

enum Obj {
    Domain(Arc<Domain>),
    Table(Arc<Table>),
    Action(Arc<Action>),
}

/// The live objects, by the address handed to the program.
static LIVE: Mutex<BTreeMap<usize, Obj>> = Mutex::new(BTreeMap::new());

fn live() -> MutexGuard<'static, BTreeMap<usize, Obj>> {
    // A contended lock waits in futex(2), which can fail with EAGAIN through libc's errno:
    // the functions that return their error leave errno as the program had it, as
    // rdma-core's do, so it is put back.
    // SAFETY: __errno_location returns the calling thread's errno slot, always valid.
    let saved = unsafe { *libc::__errno_location() };
    let live = LIVE.lock().unwrap_or_else(|e| e.into_inner());
    set_errno(saved);
    live
}

impl Domain {
    fn state(&self) -> MutexGuard<'_, DomainState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Keeps `obj` alive and returns the address the program will hold.
fn register(obj: Obj) -> *mut c_void {
    let addr = match &obj {
        Obj::Domain(d) => Arc::as_ptr(d) as usize,
        Obj::Table(t) => Arc::as_ptr(t) as usize,
        Obj::Action(a) => Arc::as_ptr(a) as usize,
    };
    live().insert(addr, obj);
    addr as *mut c_void
}

fn domain(p: *mut c_void) -> Option<Arc<Domain>> {
    match live().get(&(p as usize)) {
        Some(Obj::Domain(d)) => Some(d.clone()),
        _ => None,
    }
}

fn table(p: *mut c_void) -> Option<Arc<Table>> {
    match live().get(&(p as usize)) {
        Some(Obj::Table(t)) => Some(t.clone()),
        _ => None,
    }
}

fn action(p: *mut c_void) -> Option<ActionKind> {
    match live().get(&(p as usize)) {
        Some(Obj::Action(a)) => Some(a.kind),
        _ => None,
    }
}

/// What the action at `p` is, if it is a live action of this library (for tests and
/// diagnostics).
pub fn action_kind(p: *mut c_void) -> Option<ActionKind> {
    action(p)
}

fn new_action(kind: ActionKind) -> *mut c_void {
    register(Obj::Action(Arc::new(Action { kind })))
}

/// `mlx5dv_dr_domain_create` (`dr_domain.c`). A type beyond FDB is `EINVAL`. Then, as the
/// real capability initialisation does: port 1 is queried (`ibv_query_port`), and a failure
/// returns NULL with errno as the query left it; a link layer other than Ethernet is
/// `EOPNOTSUPP`; the device is queried (`ibv_query_device_ex`), a failure again returning
/// NULL; the DevX capability query then fails on any non-mlx5 context, which the real code
/// ignores, so the domain is created without software steering. A NULL context (which the
/// real function dereferences) is `EINVAL`.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_dr_domain_create(ctx: *mut c_void, kind: u32) -> *mut c_void {
    if kind > DOMAIN_TYPE_FDB || ctx.is_null() {
        return fail(EINVAL);
    }
    let mut port = abi::PortAttr([0; abi::PORT_ATTR_SIZE]);
    // SAFETY: a non-NULL ctx is a live context of the program's libibverbs (the prototype).
    if unsafe { abi::query_port(ctx, 1, &mut port) } != 0 {
        return std::ptr::null_mut();
    }
    if port.link_layer() != abi::LINK_LAYER_ETHERNET {
        return fail(EOPNOTSUPP);
    }
    let mut attr = abi::DeviceAttrEx([0; abi::DEVICE_ATTR_EX_SIZE]);
    // SAFETY: as above.
    if unsafe { abi::query_device_ex(ctx, &mut attr) } != 0 {
        return std::ptr::null_mut();
    }
    let state = Mutex::new(DomainState { flags: 0, tables: Vec::new() });
    register(Obj::Domain(Arc::new(Domain { ctx: ctx as usize, kind, fw_ver: attr.fw_ver(), state })))
}

/// `mlx5dv_dr_domain_destroy` (`dr_domain.c`): `EBUSY` while anything holds a reference on
/// the domain (here: its tables), else frees it and returns 0. Not a live domain: `EINVAL`.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_dr_domain_destroy(dmn: *mut c_void) -> c_int {
    let mut live = live();
    let busy = match live.get(&(dmn as usize)) {
        Some(Obj::Domain(d)) => !d.state().tables.is_empty(),
        _ => return EINVAL,
    };
    if busy {
        return EBUSY;
    }
    live.remove(&(dmn as usize));
    0
}

/// `mlx5dv_dr_domain_sync` (`dr_domain.c`): a domain without software steering sets errno
/// to `EOPNOTSUPP` and returns it, whatever the flags. Not a live domain: `EINVAL`, likewise.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_dr_domain_sync(dmn: *mut c_void, _flags: u32) -> c_int {
    let e = if domain(dmn).is_some() { EOPNOTSUPP } else { EINVAL };
    set_errno(e);
    e
}

/// `mlx5dv_dr_domain_allow_duplicate_rules` (`dr_domain.c`): clears (allow) or sets the
/// domain's "no duplicate rules" flag, which the domain dump shows. Not a live domain:
/// nothing.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_dr_domain_allow_duplicate_rules(dmn: *mut c_void, allow: bool) {
    if let Some(d) = domain(dmn) {
        let mut s = d.state();
        if allow {
            s.flags &= !FLAG_DISABLE_DUPLICATE_RULES;
        } else {
            s.flags |= FLAG_DISABLE_DUPLICATE_RULES;
        }
    }
}

/// `mlx5dv_dr_domain_set_reclaim_device_memory` (`dr_domain.c`): sets (enable) or clears the
/// domain's memory-reclaim flag, which the domain dump shows. Not a live domain: nothing.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_dr_domain_set_reclaim_device_memory(dmn: *mut c_void, enable: bool) {
    if let Some(d) = domain(dmn) {
        let mut s = d.state();
        if enable {
            s.flags |= FLAG_MEMORY_RECLAIM;
        } else {
            s.flags &= !FLAG_MEMORY_RECLAIM;
        }
    }
}

/// `mlx5dv_dr_table_create` (`dr_table.c`): a level other than 0 needs software steering,
/// which a domain of a non-mlx5 device lacks: errno `EOPNOTSUPP`, NULL. Level 0 is a root
/// table, which needs nothing from the device: it is created, added to the domain's table
/// list and holds a reference on the domain. Not a live domain: `EINVAL`.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_dr_table_create(dmn: *mut c_void, level: u32) -> *mut c_void {
    let Some(d) = domain(dmn) else { return fail(EINVAL) };
    if level != 0 {
        return fail(EOPNOTSUPP);
    }
    let t = Arc::new(Table { dmn: d.clone() });
    d.state().tables.push(Arc::as_ptr(&t) as usize);
    register(Obj::Table(t))
}

/// `mlx5dv_dr_table_destroy` (`dr_table.c`): `EBUSY` while referenced (nothing here can
/// reference a table), else the root table leaves its domain's list, drops its reference on
/// the domain and is freed: 0. Not a live table: `EINVAL`.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_dr_table_destroy(tbl: *mut c_void) -> c_int {
    let t = {
        let mut live = live();
        match live.get(&(tbl as usize)) {
            Some(Obj::Table(t)) => {
                let t = t.clone();
                live.remove(&(tbl as usize));
                t
            }
            _ => return EINVAL,
        }
    };
    t.dmn.state().tables.retain(|&a| a != tbl as usize);
    0
}

/// `mlx5dv_dr_matcher_create` (`dr_matcher.c`): on a root table the matcher is an mlx5 flow
/// matcher created on the domain's context, which for a non-mlx5 context fails with errno
/// `EOPNOTSUPP`: NULL. (Every table here is a root table.) Not a live table: `EINVAL`.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_dr_matcher_create(
    tbl: *mut c_void,
    _priority: u16,
    _match_criteria_enable: u8,
    _mask: *mut c_void,
) -> *mut c_void {
    fail(if table(tbl).is_some() { EOPNOTSUPP } else { EINVAL })
}

/// `mlx5dv_dr_matcher_destroy` (`dr_matcher.c`): no matcher can be created here (see
/// [`mlx5dv_dr_matcher_create`]), so the argument is not one: `EINVAL`.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_dr_matcher_destroy(_matcher: *mut c_void) -> c_int {
    EINVAL
}

/// `mlx5dv_dr_matcher_set_layout` (`dr_matcher.c`), which sets errno to what it returns on
/// failure: no matcher can be created here, so the argument is not one: `EINVAL`, both ways.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_dr_matcher_set_layout(_matcher: *mut c_void, _layout: *mut c_void) -> c_int {
    set_errno(EINVAL);
    EINVAL
}

/// `mlx5dv_dr_rule_create` (`dr_rule.c`): no matcher can be created here, so the argument is
/// not one: errno `EINVAL`, NULL.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_dr_rule_create(
    _matcher: *mut c_void,
    _value: *mut c_void,
    _num_actions: usize,
    _actions: *mut *mut c_void,
) -> *mut c_void {
    fail(EINVAL)
}

/// `mlx5dv_dr_rule_destroy` (`dr_rule.c`): no rule can be created here, so the argument is
/// not one: `EINVAL`.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_dr_rule_destroy(_rule: *mut c_void) -> c_int {
    EINVAL
}

/// `mlx5dv_dr_action_create_drop` (`dr_action.c`): a plain allocation that never looks at a
/// device: a drop action.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_dr_action_create_drop() -> *mut c_void {
    new_action(ActionKind::Drop)
}

/// `mlx5dv_dr_action_create_default_miss` (`dr_action.c`): a plain allocation: a
/// default-miss action.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_dr_action_create_default_miss() -> *mut c_void {
    new_action(ActionKind::DefaultMiss)
}

/// `mlx5dv_dr_action_create_tag` (`dr_action.c`): a plain allocation keeping the tag's low
/// 24 bits: a tag action.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_dr_action_create_tag(tag_value: u32) -> *mut c_void {
    new_action(ActionKind::Tag(tag_value & 0xff_ffff))
}

/// `mlx5dv_dr_action_create_pop_vlan` (`dr_action.c`): a plain allocation: a VLAN pop
/// action.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_dr_action_create_pop_vlan() -> *mut c_void {
    new_action(ActionKind::PopVlan)
}

/// `mlx5dv_dr_action_create_push_vlan` (`dr_action.c`): the header (big-endian) must carry
/// the C-VLAN (0x8100) or S-VLAN (0x88a8) ethertype in its upper 16 bits, else errno
/// `EINVAL`; then a plain allocation: a VLAN push action. The domain is not used (the real
/// function reads it only for a debug message on the error path).
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_dr_action_create_push_vlan(_dmn: *mut c_void, vlan_hdr: u32) -> *mut c_void {
    let hdr = u32::from_be(vlan_hdr);
    let ethertype = hdr >> 16;
    if ethertype != SVLAN_ETHERTYPE && ethertype != CVLAN_ETHERTYPE {
        return fail(EINVAL);
    }
    new_action(ActionKind::PushVlan(hdr))
}

/// `mlx5dv_dr_action_create_dest_ibv_qp` (`dr_action.c`): a QP whose type is not
/// `IBV_QPT_RAW_PACKET` is errno `EINVAL`; a raw-packet QP gets a plain allocation, a QP
/// destination action, without any device check. A NULL QP (which the real function
/// dereferences) is `EINVAL`.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_dr_action_create_dest_ibv_qp(qp: *mut c_void) -> *mut c_void {
    // SAFETY: a non-NULL qp is a live ibv_qp (the prototype).
    if qp.is_null() || unsafe { abi::qp_type(qp) } != abi::QPT_RAW_PACKET {
        return fail(EINVAL);
    }
    new_action(ActionKind::DestQp(qp as usize))
}

/// `mlx5dv_dr_action_create_dest_table` (`dr_action.c`): a root table cannot be a
/// destination: errno `EINVAL`, NULL. Every table here is a root table, and anything that is
/// not a live table is refused with `EINVAL` too.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_dr_action_create_dest_table(_tbl: *mut c_void) -> *mut c_void {
    fail(EINVAL)
}

/// `mlx5dv_dr_action_create_dest_root_table` (`dr_action.c`): on a root table it creates an
/// mlx5 steering anchor on the domain's context, which for a non-mlx5 context fails with
/// errno `EOPNOTSUPP`: NULL. Not a live table: `EINVAL`.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_dr_action_create_dest_root_table(tbl: *mut c_void, _priority: u16) -> *mut c_void {
    fail(if table(tbl).is_some() { EOPNOTSUPP } else { EINVAL })
}

/// `mlx5dv_dr_action_create_dest_vport` (`dr_action.c`): needs software steering on an FDB
/// domain; a domain without it gets errno `EOPNOTSUPP`, NULL. Not a live domain: `EINVAL`.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_dr_action_create_dest_vport(dmn: *mut c_void, _vport: u32) -> *mut c_void {
    fail(if domain(dmn).is_some() { EOPNOTSUPP } else { EINVAL })
}

/// `mlx5dv_dr_action_create_dest_ib_port` (`dr_action.c`): needs software steering on an
/// FDB domain; a domain without it gets errno `EOPNOTSUPP`, NULL. Not a live domain:
/// `EINVAL`.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_dr_action_create_dest_ib_port(dmn: *mut c_void, _ib_port: u32) -> *mut c_void {
    fail(if domain(dmn).is_some() { EOPNOTSUPP } else { EINVAL })
}

/// `mlx5dv_dr_action_create_dest_devx_tir` (`dr_action.c`): an object that is not a DevX TIR
/// is errno `EINVAL`. No DevX object can be created here: `EINVAL`, NULL.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_dr_action_create_dest_devx_tir(_devx_obj: *mut c_void) -> *mut c_void {
    fail(EINVAL)
}

/// `mlx5dv_dr_action_create_flow_counter` (`dr_action.c`): an object that is not a DevX flow
/// counter is errno `EINVAL`. No DevX object can be created here: `EINVAL`, NULL.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_dr_action_create_flow_counter(_devx_obj: *mut c_void, _offset: u32) -> *mut c_void {
    fail(EINVAL)
}

/// `mlx5dv_dr_action_create_aso` (`dr_action.c`): needs software steering; a domain without
/// it gets errno `EOPNOTSUPP`, NULL, before the DevX object is looked at. Not a live domain:
/// `EINVAL`.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_dr_action_create_aso(
    dmn: *mut c_void,
    _devx_obj: *mut c_void,
    _offset: u32,
    _flags: u32,
    _return_reg_c: u8,
) -> *mut c_void {
    fail(if domain(dmn).is_some() { EOPNOTSUPP } else { EINVAL })
}

/// `mlx5dv_dr_action_create_flow_meter` (`dr_action.c`): the meter's next table's domain
/// must have software steering, else errno `EOPNOTSUPP`, NULL. The next table is the first
/// member of `struct mlx5dv_dr_flow_meter_attr`; a NULL attribute or a next table that is not
/// a live table is `EINVAL`.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_dr_action_create_flow_meter(attr: *mut c_void) -> *mut c_void {
    if attr.is_null() {
        return fail(EINVAL);
    }
    // SAFETY: a non-NULL attr is a readable mlx5dv_dr_flow_meter_attr, which starts with
    // the next table's pointer.
    let next = unsafe { attr.cast::<*mut c_void>().read() };
    fail(if table(next).is_some() { EOPNOTSUPP } else { EINVAL })
}

/// `struct mlx5dv_dr_flow_sampler_attr`.
#[repr(C)]
pub struct FlowSamplerAttr {
    pub sample_ratio: u32,
    pub default_next_table: *mut c_void,
    pub num_sample_actions: u32,
    pub sample_actions: *mut *mut c_void,
    pub action: u64,
}

/// `mlx5dv_dr_action_create_flow_sampler` (`dr_action.c`): a zero ratio, no default next
/// table (or one without a domain), no sample actions or a zero count are errno `EINVAL`; a
/// domain other than NIC RX or FDB is `EOPNOTSUPP`; otherwise it builds the sampler's
/// terminating flow table with DevX commands, where every path fails with `EOPNOTSUPP` on a
/// non-mlx5 context (unsupported sample actions, then the DevX table itself). A NULL
/// attribute, or a default next table that is not a live table, is `EINVAL`.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_dr_action_create_flow_sampler(attr: *mut FlowSamplerAttr) -> *mut c_void {
    if attr.is_null() {
        return fail(EINVAL);
    }
    // SAFETY: a non-NULL attr is a readable mlx5dv_dr_flow_sampler_attr (the prototype).
    let attr = unsafe { &*attr };
    let Some(t) = table(attr.default_next_table) else { return fail(EINVAL) };
    if attr.sample_ratio == 0 || attr.sample_actions.is_null() || attr.num_sample_actions == 0 {
        return fail(EINVAL);
    }
    if t.dmn.kind != DOMAIN_TYPE_NIC_RX && t.dmn.kind != DOMAIN_TYPE_FDB {
        return fail(EOPNOTSUPP);
    }
    fail(EOPNOTSUPP)
}

/// `mlx5dv_dr_action_create_modify_header` (`dr_action.c`): flags other than ROOT_LEVEL, or
/// a size that is not a whole number of 8-byte actions, are errno `EINVAL`; without
/// ROOT_LEVEL the action needs software steering (`EOPNOTSUPP`); with it, it is an mlx5 flow
/// action created on the domain's context, which fails with `EOPNOTSUPP` for a non-mlx5
/// context. Not a live domain: `EINVAL`.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_dr_action_create_modify_header(
    dmn: *mut c_void,
    flags: u32,
    actions_sz: usize,
    _actions: *mut u64,
) -> *mut c_void {
    if domain(dmn).is_none() || flags & !ACTION_FLAGS_ROOT_LEVEL != 0 || !actions_sz.is_multiple_of(MODIFY_ACTION_SIZE)
    {
        return fail(EINVAL);
    }
    fail(EOPNOTSUPP)
}

/// `mlx5dv_dr_action_create_packet_reformat` (`dr_action.c`): flags other than ROOT_LEVEL
/// are errno `EINVAL`; without ROOT_LEVEL the action needs software steering
/// (`EOPNOTSUPP`); then the parameters are checked (`EINVAL` for data without a size or a
/// size without data, an unknown reformat type, an encapsulation on a NIC RX domain or a
/// decapsulation on a NIC TX domain); then it is an mlx5 flow action created on the domain's
/// context, which fails with `EOPNOTSUPP` for a non-mlx5 context. Not a live domain:
/// `EINVAL`.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_dr_action_create_packet_reformat(
    dmn: *mut c_void,
    flags: u32,
    reformat_type: u32,
    data_sz: usize,
    data: *mut c_void,
) -> *mut c_void {
    let Some(d) = domain(dmn) else { return fail(EINVAL) };
    if flags & !ACTION_FLAGS_ROOT_LEVEL != 0 {
        return fail(EINVAL);
    }
    if flags & ACTION_FLAGS_ROOT_LEVEL == 0 {
        return fail(EOPNOTSUPP);
    }
    let bad_params = data.is_null() != (data_sz == 0) || reformat_type > REFORMAT_L2_TO_L3_TUNNEL;
    let bad_direction = match d.kind {
        DOMAIN_TYPE_NIC_RX => reformat_type != REFORMAT_L2_TUNNEL_TO_L2 && reformat_type != REFORMAT_L3_TUNNEL_TO_L2,
        DOMAIN_TYPE_NIC_TX => reformat_type != REFORMAT_L2_TO_L2_TUNNEL && reformat_type != REFORMAT_L2_TO_L3_TUNNEL,
        _ => false,
    };
    fail(if bad_params || bad_direction { EINVAL } else { EOPNOTSUPP })
}

/// `struct mlx5dv_dr_action_dest_attr`: the type, then a union of the destination action
/// and a pointer to a `struct mlx5dv_dr_action_dest_reformat`.
#[repr(C)]
pub struct DestAttr {
    pub kind: u32,
    pub dest: *mut c_void,
}

/// `struct mlx5dv_dr_action_dest_reformat`.
#[repr(C)]
pub struct DestReformat {
    pub reformat: *mut c_void,
    pub dest: *mut c_void,
}

/// `mlx5dv_dr_action_create_dest_array` (`dr_action.c`): fewer than two destinations is
/// errno `EINVAL`; a domain other than FDB or NIC RX is `EOPNOTSUPP`. Then each destination
/// in turn: an unknown destination type is `EINVAL`; a destination action that is not a
/// miss, vport, QP, counter or table action is `EOPNOTSUPP`, and so is a default-miss outside
/// an FDB domain and any reformat action given with it (only software-steering reformat
/// actions qualify, and none can exist here). When every destination passes, the DevX flow
/// table that implements the array fails with `EOPNOTSUPP` on a non-mlx5 context. So the
/// answer is `EINVAL` or `EOPNOTSUPP` depending on the first offending destination, and NULL.
/// A NULL array or entry, or an action or domain that is not a live one of this library, is
/// `EINVAL`.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_dr_action_create_dest_array(
    dmn: *mut c_void,
    num_dest: usize,
    dests: *mut *mut DestAttr,
) -> *mut c_void {
    if num_dest <= 1 {
        return fail(EINVAL);
    }
    let Some(d) = domain(dmn) else { return fail(EINVAL) };
    if d.kind != DOMAIN_TYPE_FDB && d.kind != DOMAIN_TYPE_NIC_RX {
        return fail(EOPNOTSUPP);
    }
    if dests.is_null() {
        return fail(EINVAL);
    }
    // rdma-core allocates a 16-byte record per destination before it reads the array: a count
    // no allocation can hold is ENOMEM, not a walk past the program's array.
    if num_dest.checked_mul(16).is_none_or(|n| n > isize::MAX as usize) {
        return fail(ENOMEM);
    }
    for i in 0..num_dest {
        // SAFETY: dests holds num_dest entries (the prototype).
        let entry = unsafe { dests.add(i).read() };
        if entry.is_null() {
            return fail(EINVAL);
        }
        // SAFETY: a non-NULL entry is a readable mlx5dv_dr_action_dest_attr.
        let entry = unsafe { &*entry };
        let (dest, reformat) = match entry.kind {
            DEST => (entry.dest, std::ptr::null_mut()),
            DEST_REFORMAT => {
                let r = entry.dest.cast::<DestReformat>();
                if r.is_null() {
                    return fail(EINVAL);
                }
                // SAFETY: a non-NULL dest_reformat is a readable mlx5dv_dr_action_dest_reformat.
                let r = unsafe { &*r };
                (r.dest, r.reformat)
            }
            _ => return fail(EINVAL),
        };
        let Some(kind) = action(dest) else { return fail(EINVAL) };
        if !matches!(kind, ActionKind::DefaultMiss | ActionKind::DestQp(_)) {
            return fail(EOPNOTSUPP);
        }
        if !reformat.is_null() && action(reformat).is_none() {
            return fail(EINVAL);
        }
        if (kind == ActionKind::DefaultMiss && d.kind != DOMAIN_TYPE_FDB) || !reformat.is_null() {
            return fail(EOPNOTSUPP);
        }
    }
    fail(EOPNOTSUPP)
}

/// `mlx5dv_dr_action_destroy` (`dr_action.c`): `EBUSY` while a rule or another action
/// references the action (nothing can, here), else it is freed: 0. Not a live action:
/// `EINVAL`.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_dr_action_destroy(act: *mut c_void) -> c_int {
    let mut live = live();
    match live.get(&(act as usize)) {
        Some(Obj::Action(_)) => {
            live.remove(&(act as usize));
            0
        }
        _ => EINVAL,
    }
}

/// `mlx5dv_dr_action_modify_aso` (`dr_action.c`): an action that is not an ASO action sets
/// errno to `EINVAL` and returns it. No ASO action can be created here.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_dr_action_modify_aso(
    _act: *mut c_void,
    _offset: u32,
    _flags: u32,
    _return_reg_c: u8,
) -> c_int {
    set_errno(EINVAL);
    EINVAL
}

/// `mlx5dv_dr_action_modify_flow_meter` (`dr_action.c`): an action that is not a meter sets
/// errno to `EINVAL` and returns it. No meter can be created here.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_dr_action_modify_flow_meter(
    _act: *mut c_void,
    _attr: *mut c_void,
    _modify_field_select: u64,
) -> c_int {
    set_errno(EINVAL);
    EINVAL
}

/// `mlx5dv_dr_aso_other_domain_link` (`dr_ste.c`): anything but a connection-tracking ASO
/// DevX object sets errno to `EOPNOTSUPP` and returns it (as does a domain whose steering
/// format has no such link). No DevX object can be created here: `EOPNOTSUPP`.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_dr_aso_other_domain_link(
    _devx_obj: *mut c_void,
    _peer_dmn: *mut c_void,
    _dmn: *mut c_void,
    _flags: u32,
    _return_reg_c: u8,
) -> c_int {
    set_errno(EOPNOTSUPP);
    EOPNOTSUPP
}

/// `mlx5dv_dr_aso_other_domain_unlink` (`dr_ste.c`): sets errno to `EOPNOTSUPP` and returns
/// it when the domain's steering format has no unlink operation. A domain without software
/// steering has no steering format at all (the real function then dereferences NULL); no
/// DevX object can exist here either: `EOPNOTSUPP`.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_dr_aso_other_domain_unlink(_devx_obj: *mut c_void, _dmn: *mut c_void) -> c_int {
    set_errno(EOPNOTSUPP);
    EOPNOTSUPP
}

/// The domain's records in rdma-core's dump format (`dr_dbg.c`): the domain line (its id is
/// the process id shifted left by 8 with the domain type in the low byte; the DevX
/// capabilities it would print are all zero, since that query failed), the device-attribute
/// line (firmware version), the capabilities line and the four flex-parser lines; no send
/// rings, which only software steering has.
fn domain_records(d: &Domain) -> Vec<Vec<u8>> {
    // SAFETY: getpid cannot fail.
    let pid = unsafe { libc::getpid() } as u32;
    let id = u64::from(pid.wrapping_shl(8) | (d.kind & 0xff));
    let flags = d.state().flags;
    // SAFETY: the domain's context is live while the domain is (the program's contract).
    let dev_name = unsafe { abi::dev_name(d.ctx as *mut c_void) };
    let mut domain = format!("3000,0x{id:x},{},00,0,{PACKAGE_VERSION},", d.kind).into_bytes();
    domain.extend_from_slice(&dev_name);
    domain.extend_from_slice(format!(",{flags},0,0,0\n").as_bytes());
    let mut dev_attr = format!("3002,0x{id:x},0,").into_bytes();
    dev_attr.extend_from_slice(&d.fw_ver);
    dev_attr.extend_from_slice(b",0\n");
    let mut records = vec![domain, dev_attr, format!("3004,0x{id:x},0x0,0x0,0x0,0x0,0,0\n").into_bytes()];
    for parser in ["icmp_dw0", "icmp_dw1", "icmpv6_dw0", "icmpv6_dw1"] {
        records.push(format!("3001,0x{id:x},{parser},0x0\n").into_bytes());
    }
    records
}

/// A root table's record: its address, its domain's id, table type 0 and level 0.
fn table_record(t: usize, d: &Domain) -> Vec<u8> {
    // SAFETY: getpid cannot fail.
    let pid = unsafe { libc::getpid() } as u32;
    let id = u64::from(pid.wrapping_shl(8) | (d.kind & 0xff));
    format!("3100,0x{t:x},0x{id:x},0,0\n").into_bytes()
}

/// Writes the records in order, stopping at the first failed write, whose result (negative)
/// is returned, as the real dump does with `fprintf`'s.
///
/// # Safety
/// `fout` is an open `FILE *`.
unsafe fn write_records(fout: *mut libc::FILE, records: Vec<Vec<u8>>) -> c_int {
    for r in records {
        let Ok(r) = CString::new(r) else { return -EINVAL };
        // SAFETY: fout is open (caller); r is NUL-terminated.
        let ret = unsafe { libc::fputs(r.as_ptr(), fout) };
        if ret < 0 {
            return ret;
        }
    }
    0
}

/// `mlx5dv_dump_dr_domain` (`dr_dbg.c`): a NULL file or domain is `-EINVAL`; otherwise the
/// domain's records, then each table's (for a root table its one record), in creation
/// order: 0, or the negative result of the write that failed. Not a live domain: `-EINVAL`.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_dump_dr_domain(fout: *mut libc::FILE, dmn: *mut c_void) -> c_int {
    let Some(d) = domain(dmn) else { return -EINVAL };
    if fout.is_null() {
        return -EINVAL;
    }
    let mut records = domain_records(&d);
    let tables = d.state().tables.clone();
    records.extend(tables.into_iter().map(|t| table_record(t, &d)));
    // SAFETY: a non-NULL fout is an open FILE (the prototype).
    unsafe { write_records(fout, records) }
}

/// `mlx5dv_dump_dr_table` (`dr_dbg.c`): a NULL file or table is `-EINVAL`; otherwise the
/// records of the table's domain (without its other tables), then the table's: 0, or the
/// negative result of the write that failed. Not a live table: `-EINVAL`.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_dump_dr_table(fout: *mut libc::FILE, tbl: *mut c_void) -> c_int {
    let Some(t) = table(tbl) else { return -EINVAL };
    if fout.is_null() {
        return -EINVAL;
    }
    let mut records = domain_records(&t.dmn);
    records.push(table_record(tbl as usize, &t.dmn));
    // SAFETY: a non-NULL fout is an open FILE (the prototype).
    unsafe { write_records(fout, records) }
}

/// `mlx5dv_dump_dr_matcher` (`dr_dbg.c`): a NULL file or matcher is `-EINVAL`. No matcher
/// can be created here, so the argument is not one: `-EINVAL`.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_dump_dr_matcher(_fout: *mut libc::FILE, _matcher: *mut c_void) -> c_int {
    -EINVAL
}

/// `mlx5dv_dump_dr_rule` (`dr_dbg.c`): a NULL file or rule is `-EINVAL`. No rule can be
/// created here, so the argument is not one: `-EINVAL`.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_dump_dr_rule(_fout: *mut libc::FILE, _rule: *mut c_void) -> c_int {
    -EINVAL
}
