//! `libmlx5.so.1`'s entry points outside the software-steering layer ([`crate::dr`]) and the
//! VFIO device list ([`crate::vfio`]).
//!
//! Almost all of them are, in rdma-core 44, thin dispatchers: they fetch the mlx5 operations
//! table of the context (`mlx5_get_dv_ops()` in `providers/mlx5/mlx5.c`), which exists only
//! when the context's device was opened by the mlx5 provider (`is_mlx5_dev()`: the device's
//! operations are mlx5's) or by its VFIO variant, and otherwise is NULL; a NULL table, or one
//! without the operation, makes the function fail with `EOPNOTSUPP`. The context is the
//! argument itself, or the `context` of the verbs object or vendor object passed. Every
//! context a program can hold here belongs to the drop-in libibverbs, so the lookup always
//! fails; the functions below give that failure without reading their arguments.

use std::ffi::{c_int, c_void};

use libc::{EINVAL, EOPNOTSUPP};

use crate::fail;

/// `MLX5DV_OBJ_QP | CQ | SRQ | RWQ | DM | AH | PD`: the object kinds `mlx5dv_init_obj` knows.
pub const MLX5DV_OBJ_ALL: u64 = 0x7f;

/// `mlx5dv_is_supported` (`providers/mlx5/mlx5.c`): whether the device's operations are the
/// mlx5 provider's (`is_mlx5_dev()`). A device of the drop-in never is: false.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_is_supported(_device: *mut c_void) -> bool {
    false
}

/// `mlx5dv_open_device` (`providers/mlx5/mlx5.c`): opens the device only if it is an mlx5
/// device (`is_mlx5_dev()`); for any other device errno `EOPNOTSUPP` and NULL.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_open_device(_device: *mut c_void, _attr: *mut c_void) -> *mut c_void {
    fail(EOPNOTSUPP)
}

/// `mlx5dv_query_device` (`providers/mlx5/mlx5.c`): dispatches to the context's mlx5
/// operations; without them (a non-mlx5 context) it returns `EOPNOTSUPP` and writes nothing.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_query_device(_ctx_in: *mut c_void, _attrs_out: *mut c_void) -> c_int {
    EOPNOTSUPP
}

/// `_mlx5dv_query_port` (`providers/mlx5/verbs.c`, behind the `mlx5dv_query_port` inline):
/// dispatches to the context's mlx5 operations; a non-mlx5 context returns `EOPNOTSUPP`.
#[no_mangle]
pub unsafe extern "C" fn _mlx5dv_query_port(
    _context: *mut c_void,
    _port_num: u32,
    _info: *mut c_void,
    _info_len: usize,
) -> c_int {
    EOPNOTSUPP
}

/// `mlx5dv_init_obj@@MLX5_1.2` (`providers/mlx5/mlx5.c`): takes the context from the first
/// object its `obj_type` names (QP, CQ, SRQ, RWQ, DM, AH, PD, in that order). When the type
/// names none of them there is no context and it returns `EINVAL`; otherwise it dispatches to
/// that context's mlx5 operations, and a verbs object of a non-mlx5 context gets `EOPNOTSUPP`.
/// The output structures are not written.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_init_obj(_obj: *mut c_void, obj_type: u64) -> c_int {
    if obj_type & MLX5DV_OBJ_ALL == 0 {
        EINVAL
    } else {
        EOPNOTSUPP
    }
}

/// `mlx5dv_init_obj@MLX5_1.0`, the compatibility entry (`providers/mlx5/mlx5.c`): runs the
/// current one and, only when that succeeded for a CQ, also stores the pre-1.2 UAR pointer;
/// so for objects of a non-mlx5 context its answer is the current one's. `mlx5_compat.c`
/// exports this under the name `mlx5dv_init_obj`, version `MLX5_1.0` (a symbol of a Rust
/// static library cannot carry two versions of one name).
#[no_mangle]
pub unsafe extern "C" fn softhca_vendor_mlx5dv_init_obj_1_0(obj: *mut c_void, obj_type: u64) -> c_int {
    // SAFETY: the same contract; the current entry reads nothing.
    unsafe { mlx5dv_init_obj(obj, obj_type) }
}

/// `mlx5dv_set_context_attr` (`providers/mlx5/mlx5.c`): dispatches to the context's mlx5
/// operations; a non-mlx5 context returns `EOPNOTSUPP`.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_set_context_attr(_context: *mut c_void, _type: u32, _attr: *mut c_void) -> c_int {
    EOPNOTSUPP
}

/// `mlx5dv_get_clock_info` (`providers/mlx5/mlx5.c`): dispatches to the context's mlx5
/// operations; a non-mlx5 context returns `EOPNOTSUPP`.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_get_clock_info(_context: *mut c_void, _clock_info: *mut c_void) -> c_int {
    EOPNOTSUPP
}

/// `mlx5dv_create_cq` (`providers/mlx5/verbs.c`): dispatches to the context's mlx5
/// operations; a non-mlx5 context gets errno `EOPNOTSUPP` and NULL.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_create_cq(
    _context: *mut c_void,
    _cq_attr: *mut c_void,
    _mlx5_cq_attr: *mut c_void,
) -> *mut c_void {
    fail(EOPNOTSUPP)
}

/// `mlx5dv_create_qp` (`providers/mlx5/verbs.c`): dispatches to the context's mlx5
/// operations; a non-mlx5 context gets errno `EOPNOTSUPP` and NULL.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_create_qp(
    _context: *mut c_void,
    _qp_attr: *mut c_void,
    _mlx5_qp_attr: *mut c_void,
) -> *mut c_void {
    fail(EOPNOTSUPP)
}

/// `mlx5dv_create_wq` (`providers/mlx5/verbs.c`): dispatches to the context's mlx5
/// operations; a non-mlx5 context gets errno `EOPNOTSUPP` and NULL.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_create_wq(
    _context: *mut c_void,
    _wq_init_attr: *mut c_void,
    _mlx5_wq_attr: *mut c_void,
) -> *mut c_void {
    fail(EOPNOTSUPP)
}

/// `mlx5dv_alloc_dm` (`providers/mlx5/verbs.c`): dispatches to the context's mlx5
/// operations; a non-mlx5 context gets errno `EOPNOTSUPP` and NULL.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_alloc_dm(
    _context: *mut c_void,
    _dm_attr: *mut c_void,
    _mlx5_dm_attr: *mut c_void,
) -> *mut c_void {
    fail(EOPNOTSUPP)
}

/// `mlx5dv_dm_map_op_addr` (`providers/mlx5/verbs.c`): dispatches to the mlx5 operations of
/// the device memory's context; device memory of a non-mlx5 context gets errno `EOPNOTSUPP`
/// and NULL.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_dm_map_op_addr(_dm: *mut c_void, _op: u8) -> *mut c_void {
    fail(EOPNOTSUPP)
}

/// `mlx5dv_create_flow_action_esp` (`providers/mlx5/verbs.c`): dispatches to the context's
/// mlx5 operations; a non-mlx5 context gets errno `EOPNOTSUPP` and NULL.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_create_flow_action_esp(
    _ctx: *mut c_void,
    _esp: *mut c_void,
    _mlx5_attr: *mut c_void,
) -> *mut c_void {
    fail(EOPNOTSUPP)
}

/// `mlx5dv_create_flow_matcher` (`providers/mlx5/verbs.c`): dispatches to the context's
/// mlx5 operations; a non-mlx5 context gets errno `EOPNOTSUPP` and NULL.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_create_flow_matcher(_context: *mut c_void, _matcher_attr: *mut c_void) -> *mut c_void {
    fail(EOPNOTSUPP)
}

/// `mlx5dv_destroy_flow_matcher` (`providers/mlx5/verbs.c`): dispatches to the mlx5
/// operations of the matcher's context. No matcher can be created here (see
/// [`mlx5dv_create_flow_matcher`]); for one of a non-mlx5 context the answer is `EOPNOTSUPP`.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_destroy_flow_matcher(_matcher: *mut c_void) -> c_int {
    EOPNOTSUPP
}

/// `mlx5dv_create_flow` (`providers/mlx5/verbs.c`): dispatches to the mlx5 operations of
/// the matcher's context; for a matcher of a non-mlx5 context (none can exist here) errno
/// `EOPNOTSUPP` and NULL.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_create_flow(
    _matcher: *mut c_void,
    _match_value: *mut c_void,
    _num_actions: usize,
    _actions_attr: *mut c_void,
) -> *mut c_void {
    fail(EOPNOTSUPP)
}

/// `mlx5dv_create_flow_action_modify_header` (`providers/mlx5/verbs.c`): dispatches to the
/// context's mlx5 operations; a non-mlx5 context gets errno `EOPNOTSUPP` and NULL.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_create_flow_action_modify_header(
    _ctx: *mut c_void,
    _actions_sz: usize,
    _actions: *mut u64,
    _ft_type: u32,
) -> *mut c_void {
    fail(EOPNOTSUPP)
}

/// `mlx5dv_create_flow_action_packet_reformat` (`providers/mlx5/verbs.c`): dispatches to the
/// context's mlx5 operations; a non-mlx5 context gets errno `EOPNOTSUPP` and NULL.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_create_flow_action_packet_reformat(
    _ctx: *mut c_void,
    _data_sz: usize,
    _data: *mut c_void,
    _reformat_type: u32,
    _ft_type: u32,
) -> *mut c_void {
    fail(EOPNOTSUPP)
}

/// `mlx5dv_create_steering_anchor` (`providers/mlx5/verbs.c`): dispatches to the context's
/// mlx5 operations; a non-mlx5 context gets errno `EOPNOTSUPP` and NULL.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_create_steering_anchor(_context: *mut c_void, _attr: *mut c_void) -> *mut c_void {
    fail(EOPNOTSUPP)
}

/// `mlx5dv_destroy_steering_anchor` (`providers/mlx5/verbs.c`): dispatches to the mlx5
/// operations of the anchor's context; for an anchor of a non-mlx5 context (none can exist
/// here) `EOPNOTSUPP`.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_destroy_steering_anchor(_sa: *mut c_void) -> c_int {
    EOPNOTSUPP
}

/// `mlx5dv_devx_alloc_uar` (`providers/mlx5/verbs.c`): dispatches to the context's mlx5
/// operations; a non-mlx5 context gets errno `EOPNOTSUPP` and NULL.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_devx_alloc_uar(_context: *mut c_void, _flags: u32) -> *mut c_void {
    fail(EOPNOTSUPP)
}

/// `mlx5dv_devx_free_uar` (`providers/mlx5/verbs.c`): dispatches to the mlx5 operations of
/// the UAR's context and, without them, returns without doing anything. No UAR can exist here.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_devx_free_uar(_devx_uar: *mut c_void) {}

/// `mlx5dv_devx_general_cmd` (`providers/mlx5/verbs.c`): dispatches to the context's mlx5
/// operations; a non-mlx5 context returns `EOPNOTSUPP` and writes no output.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_devx_general_cmd(
    _context: *mut c_void,
    _in: *const c_void,
    _inlen: usize,
    _out: *mut c_void,
    _outlen: usize,
) -> c_int {
    EOPNOTSUPP
}

/// `mlx5dv_devx_obj_create` (`providers/mlx5/verbs.c`): dispatches to the context's mlx5
/// operations; a non-mlx5 context gets errno `EOPNOTSUPP` and NULL.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_devx_obj_create(
    _context: *mut c_void,
    _in: *const c_void,
    _inlen: usize,
    _out: *mut c_void,
    _outlen: usize,
) -> *mut c_void {
    fail(EOPNOTSUPP)
}

/// `mlx5dv_devx_obj_query` (`providers/mlx5/verbs.c`): dispatches to the mlx5 operations of
/// the object's context; for an object of a non-mlx5 context (none can exist here)
/// `EOPNOTSUPP`.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_devx_obj_query(
    _obj: *mut c_void,
    _in: *const c_void,
    _inlen: usize,
    _out: *mut c_void,
    _outlen: usize,
) -> c_int {
    EOPNOTSUPP
}

/// `mlx5dv_devx_obj_modify` (`providers/mlx5/verbs.c`): dispatches to the mlx5 operations of
/// the object's context; for an object of a non-mlx5 context (none can exist here)
/// `EOPNOTSUPP`.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_devx_obj_modify(
    _obj: *mut c_void,
    _in: *const c_void,
    _inlen: usize,
    _out: *mut c_void,
    _outlen: usize,
) -> c_int {
    EOPNOTSUPP
}

/// `mlx5dv_devx_obj_destroy` (`providers/mlx5/verbs.c`): dispatches to the mlx5 operations
/// of the object's context; for an object of a non-mlx5 context (none can exist here)
/// `EOPNOTSUPP`.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_devx_obj_destroy(_obj: *mut c_void) -> c_int {
    EOPNOTSUPP
}

/// `mlx5dv_devx_query_eqn` (`providers/mlx5/verbs.c`): dispatches to the context's mlx5
/// operations; a non-mlx5 context returns `EOPNOTSUPP` and writes no EQ number.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_devx_query_eqn(_context: *mut c_void, _vector: u32, _eqn: *mut u32) -> c_int {
    EOPNOTSUPP
}

/// `mlx5dv_devx_umem_reg` (`providers/mlx5/verbs.c`): dispatches to the context's mlx5
/// operations; a non-mlx5 context gets errno `EOPNOTSUPP` and NULL.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_devx_umem_reg(
    _ctx: *mut c_void,
    _addr: *mut c_void,
    _size: usize,
    _access: u32,
) -> *mut c_void {
    fail(EOPNOTSUPP)
}

/// `mlx5dv_devx_umem_reg_ex` (`providers/mlx5/verbs.c`): dispatches to the context's mlx5
/// operations; a non-mlx5 context gets errno `EOPNOTSUPP` and NULL.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_devx_umem_reg_ex(_ctx: *mut c_void, _umem_in: *mut c_void) -> *mut c_void {
    fail(EOPNOTSUPP)
}

/// `mlx5dv_devx_umem_dereg` (`providers/mlx5/verbs.c`): dispatches to the mlx5 operations of
/// the registration's context; for one of a non-mlx5 context (none can exist here)
/// `EOPNOTSUPP`.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_devx_umem_dereg(_umem: *mut c_void) -> c_int {
    EOPNOTSUPP
}

/// `mlx5dv_devx_cq_query` (`providers/mlx5/verbs.c`): dispatches to the mlx5 operations of
/// the CQ's context; a CQ of a non-mlx5 context (every CQ here) gets `EOPNOTSUPP`.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_devx_cq_query(
    _cq: *mut c_void,
    _in: *const c_void,
    _inlen: usize,
    _out: *mut c_void,
    _outlen: usize,
) -> c_int {
    EOPNOTSUPP
}

/// `mlx5dv_devx_cq_modify` (`providers/mlx5/verbs.c`): dispatches to the mlx5 operations of
/// the CQ's context; a CQ of a non-mlx5 context (every CQ here) gets `EOPNOTSUPP`.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_devx_cq_modify(
    _cq: *mut c_void,
    _in: *const c_void,
    _inlen: usize,
    _out: *mut c_void,
    _outlen: usize,
) -> c_int {
    EOPNOTSUPP
}

/// `mlx5dv_devx_qp_query` (`providers/mlx5/verbs.c`): dispatches to the mlx5 operations of
/// the QP's context; a QP of a non-mlx5 context (every QP here) gets `EOPNOTSUPP`.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_devx_qp_query(
    _qp: *mut c_void,
    _in: *const c_void,
    _inlen: usize,
    _out: *mut c_void,
    _outlen: usize,
) -> c_int {
    EOPNOTSUPP
}

/// `mlx5dv_devx_qp_modify` (`providers/mlx5/verbs.c`): dispatches to the mlx5 operations of
/// the QP's context (and only after a successful command records the QP's new state); a QP
/// of a non-mlx5 context (every QP here) gets `EOPNOTSUPP` and keeps its state.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_devx_qp_modify(
    _qp: *mut c_void,
    _in: *const c_void,
    _inlen: usize,
    _out: *mut c_void,
    _outlen: usize,
) -> c_int {
    EOPNOTSUPP
}

/// `mlx5dv_devx_srq_query` (`providers/mlx5/verbs.c`): dispatches to the mlx5 operations of
/// the SRQ's context; an SRQ of a non-mlx5 context (every SRQ here) gets `EOPNOTSUPP`.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_devx_srq_query(
    _srq: *mut c_void,
    _in: *const c_void,
    _inlen: usize,
    _out: *mut c_void,
    _outlen: usize,
) -> c_int {
    EOPNOTSUPP
}

/// `mlx5dv_devx_srq_modify` (`providers/mlx5/verbs.c`): dispatches to the mlx5 operations
/// of the SRQ's context; an SRQ of a non-mlx5 context (every SRQ here) gets `EOPNOTSUPP`.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_devx_srq_modify(
    _srq: *mut c_void,
    _in: *const c_void,
    _inlen: usize,
    _out: *mut c_void,
    _outlen: usize,
) -> c_int {
    EOPNOTSUPP
}

/// `mlx5dv_devx_wq_query` (`providers/mlx5/verbs.c`): dispatches to the mlx5 operations of
/// the WQ's context; a WQ of a non-mlx5 context gets `EOPNOTSUPP`.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_devx_wq_query(
    _wq: *mut c_void,
    _in: *const c_void,
    _inlen: usize,
    _out: *mut c_void,
    _outlen: usize,
) -> c_int {
    EOPNOTSUPP
}

/// `mlx5dv_devx_wq_modify` (`providers/mlx5/verbs.c`): dispatches to the mlx5 operations of
/// the WQ's context; a WQ of a non-mlx5 context gets `EOPNOTSUPP`.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_devx_wq_modify(
    _wq: *mut c_void,
    _in: *const c_void,
    _inlen: usize,
    _out: *mut c_void,
    _outlen: usize,
) -> c_int {
    EOPNOTSUPP
}

/// `mlx5dv_devx_ind_tbl_query` (`providers/mlx5/verbs.c`): dispatches to the mlx5
/// operations of the indirection table's context; one of a non-mlx5 context gets
/// `EOPNOTSUPP`.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_devx_ind_tbl_query(
    _ind_tbl: *mut c_void,
    _in: *const c_void,
    _inlen: usize,
    _out: *mut c_void,
    _outlen: usize,
) -> c_int {
    EOPNOTSUPP
}

/// `mlx5dv_devx_ind_tbl_modify` (`providers/mlx5/verbs.c`): dispatches to the mlx5
/// operations of the indirection table's context; one of a non-mlx5 context gets
/// `EOPNOTSUPP`.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_devx_ind_tbl_modify(
    _ind_tbl: *mut c_void,
    _in: *const c_void,
    _inlen: usize,
    _out: *mut c_void,
    _outlen: usize,
) -> c_int {
    EOPNOTSUPP
}

/// `mlx5dv_devx_create_cmd_comp` (`providers/mlx5/verbs.c`): dispatches to the context's
/// mlx5 operations; a non-mlx5 context gets errno `EOPNOTSUPP` and NULL.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_devx_create_cmd_comp(_context: *mut c_void) -> *mut c_void {
    fail(EOPNOTSUPP)
}

/// `mlx5dv_devx_destroy_cmd_comp` (`providers/mlx5/verbs.c`): closes the completion
/// channel's descriptor and frees it, with no context check. No channel can be created here
/// (see [`mlx5dv_devx_create_cmd_comp`]), so there is nothing to close or free: nothing is
/// done.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_devx_destroy_cmd_comp(_cmd_comp: *mut c_void) {}

/// `mlx5dv_devx_obj_query_async` (`providers/mlx5/verbs.c`): dispatches to the mlx5
/// operations of the object's context; for an object of a non-mlx5 context (none can exist
/// here) `EOPNOTSUPP`.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_devx_obj_query_async(
    _obj: *mut c_void,
    _in: *const c_void,
    _inlen: usize,
    _outlen: usize,
    _wr_id: u64,
    _cmd_comp: *mut c_void,
) -> c_int {
    EOPNOTSUPP
}

/// `mlx5dv_devx_get_async_cmd_comp` (`providers/mlx5/verbs.c`): reads a completion from the
/// channel's descriptor, with no context check, and returns the read's errno on failure. No
/// channel can be created here (see [`mlx5dv_devx_create_cmd_comp`]), so there is no
/// descriptor to read: `EOPNOTSUPP`, the answer that made the channel impossible, and
/// nothing is written.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_devx_get_async_cmd_comp(
    _cmd_comp: *mut c_void,
    _cmd_resp: *mut c_void,
    _cmd_resp_len: usize,
) -> c_int {
    EOPNOTSUPP
}

/// `mlx5dv_devx_create_event_channel` (`providers/mlx5/verbs.c`): dispatches to the
/// context's mlx5 operations; a non-mlx5 context gets errno `EOPNOTSUPP` and NULL.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_devx_create_event_channel(_context: *mut c_void, _flags: u32) -> *mut c_void {
    fail(EOPNOTSUPP)
}

/// `mlx5dv_devx_destroy_event_channel` (`providers/mlx5/verbs.c`): dispatches to the mlx5
/// operations of the channel's context and, without them, returns without doing anything. No
/// channel can exist here.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_devx_destroy_event_channel(_event_channel: *mut c_void) {}

/// `mlx5dv_devx_subscribe_devx_event` (`providers/mlx5/verbs.c`): dispatches to the mlx5
/// operations of the channel's context; for a channel of a non-mlx5 context (none can exist
/// here) `EOPNOTSUPP`.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_devx_subscribe_devx_event(
    _event_channel: *mut c_void,
    _obj: *mut c_void,
    _events_sz: u16,
    _events_num: *mut u16,
    _cookie: u64,
) -> c_int {
    EOPNOTSUPP
}

/// `mlx5dv_devx_subscribe_devx_event_fd` (`providers/mlx5/verbs.c`): dispatches to the mlx5
/// operations of the channel's context; for a channel of a non-mlx5 context (none can exist
/// here) `EOPNOTSUPP`.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_devx_subscribe_devx_event_fd(
    _event_channel: *mut c_void,
    _fd: c_int,
    _obj: *mut c_void,
    _event_num: u16,
) -> c_int {
    EOPNOTSUPP
}

/// `mlx5dv_devx_get_event` (`providers/mlx5/verbs.c`): reads an event from the channel's
/// descriptor, with no context check, and returns -1 with the read's errno on failure. No
/// channel can be created here (see [`mlx5dv_devx_create_event_channel`]): -1 with errno
/// `EOPNOTSUPP`, and nothing is written.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_devx_get_event(
    _event_channel: *mut c_void,
    _event_data: *mut c_void,
    _event_resp_len: usize,
) -> isize {
    crate::set_errno(EOPNOTSUPP);
    -1
}

/// `mlx5dv_devx_alloc_msi_vector` (`providers/mlx5/verbs.c`): dispatches to the context's
/// mlx5 operations; a non-mlx5 context gets errno `EOPNOTSUPP` and NULL.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_devx_alloc_msi_vector(_ibctx: *mut c_void) -> *mut c_void {
    fail(EOPNOTSUPP)
}

/// `mlx5dv_devx_free_msi_vector` (`providers/mlx5/verbs.c`): dispatches to the mlx5
/// operations of the vector's context; for a vector of a non-mlx5 context (none can exist
/// here) `EOPNOTSUPP`.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_devx_free_msi_vector(_msi: *mut c_void) -> c_int {
    EOPNOTSUPP
}

/// `mlx5dv_devx_create_eq` (`providers/mlx5/verbs.c`): dispatches to the context's mlx5
/// operations; a non-mlx5 context gets errno `EOPNOTSUPP` and NULL.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_devx_create_eq(
    _ibctx: *mut c_void,
    _in: *const c_void,
    _inlen: usize,
    _out: *mut c_void,
    _outlen: usize,
) -> *mut c_void {
    fail(EOPNOTSUPP)
}

/// `mlx5dv_devx_destroy_eq` (`providers/mlx5/verbs.c`): dispatches to the mlx5 operations of
/// the EQ's context; for an EQ of a non-mlx5 context (none can exist here) `EOPNOTSUPP`.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_devx_destroy_eq(_eq: *mut c_void) -> c_int {
    EOPNOTSUPP
}

/// `mlx5dv_create_mkey` (`providers/mlx5/verbs.c`): dispatches to the mlx5 operations of the
/// context of the attribute's protection domain; a PD of a non-mlx5 context (every PD here)
/// gets errno `EOPNOTSUPP` and NULL.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_create_mkey(_mkey_init_attr: *mut c_void) -> *mut c_void {
    fail(EOPNOTSUPP)
}

/// `mlx5dv_destroy_mkey` (`providers/mlx5/verbs.c`): dispatches to the mlx5 operations of
/// the mkey's context; for an mkey of a non-mlx5 context (none can exist here) `EOPNOTSUPP`.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_destroy_mkey(_mkey: *mut c_void) -> c_int {
    EOPNOTSUPP
}

/// `_mlx5dv_mkey_check` (`providers/mlx5/verbs.c`, behind the `mlx5dv_mkey_check` inline):
/// reports the signature error of an mkey, with no context check; an mkey without a
/// signature context gets `EINVAL`. No mkey can be created here (see [`mlx5dv_create_mkey`]),
/// so none has one: `EINVAL`, and `err_info` is not written.
#[no_mangle]
pub unsafe extern "C" fn _mlx5dv_mkey_check(
    _mkey: *mut c_void,
    _err_info: *mut c_void,
    _err_info_size: usize,
) -> c_int {
    EINVAL
}

/// `mlx5dv_alloc_var` (`providers/mlx5/verbs.c`): dispatches to the context's mlx5
/// operations; a non-mlx5 context gets errno `EOPNOTSUPP` and NULL.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_alloc_var(_context: *mut c_void, _flags: u32) -> *mut c_void {
    fail(EOPNOTSUPP)
}

/// `mlx5dv_free_var` (`providers/mlx5/verbs.c`): dispatches to the mlx5 operations of the
/// VAR's context and, without them, returns without doing anything. No VAR can exist here.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_free_var(_dv_var: *mut c_void) {}

/// `mlx5dv_pp_alloc` (`providers/mlx5/verbs.c`): dispatches to the context's mlx5
/// operations; a non-mlx5 context gets errno `EOPNOTSUPP` and NULL.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_pp_alloc(
    _context: *mut c_void,
    _pp_context_sz: usize,
    _pp_context: *const c_void,
    _flags: u32,
) -> *mut c_void {
    fail(EOPNOTSUPP)
}

/// `mlx5dv_pp_free` (`providers/mlx5/verbs.c`): dispatches to the mlx5 operations of the
/// packet pacing object's context and, without them, returns without doing anything. No such
/// object can exist here.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_pp_free(_pp: *mut c_void) {}

/// `mlx5dv_modify_qp_lag_port` (`providers/mlx5/mlx5.c`): dispatches to the mlx5 operations
/// of the QP's context; a QP of a non-mlx5 context (every QP here) gets `EOPNOTSUPP`.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_modify_qp_lag_port(_qp: *mut c_void, _port_num: u8) -> c_int {
    EOPNOTSUPP
}

/// `mlx5dv_query_qp_lag_port` (`providers/mlx5/mlx5.c`): dispatches to the mlx5 operations
/// of the QP's context; a QP of a non-mlx5 context (every QP here) gets `EOPNOTSUPP`, and
/// the port numbers are not written.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_query_qp_lag_port(
    _qp: *mut c_void,
    _port_num: *mut u8,
    _active_port_num: *mut u8,
) -> c_int {
    EOPNOTSUPP
}

/// `mlx5dv_modify_qp_udp_sport` (`providers/mlx5/mlx5.c`): dispatches to the mlx5
/// operations of the QP's context; a QP of a non-mlx5 context (every QP here) gets
/// `EOPNOTSUPP`.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_modify_qp_udp_sport(_qp: *mut c_void, _udp_sport: u16) -> c_int {
    EOPNOTSUPP
}

/// `mlx5dv_modify_qp_sched_elem` (`providers/mlx5/mlx5.c`): dispatches to the mlx5
/// operations of the QP's context; a QP of a non-mlx5 context (every QP here) gets
/// `EOPNOTSUPP`.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_modify_qp_sched_elem(
    _qp: *mut c_void,
    _requestor: *const c_void,
    _responder: *const c_void,
) -> c_int {
    EOPNOTSUPP
}

/// `mlx5dv_sched_node_create` (`providers/mlx5/mlx5.c`): dispatches to the context's mlx5
/// operations; a non-mlx5 context gets errno `EOPNOTSUPP` and NULL.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_sched_node_create(_context: *mut c_void, _sched_attr: *const c_void) -> *mut c_void {
    fail(EOPNOTSUPP)
}

/// `mlx5dv_sched_leaf_create` (`providers/mlx5/mlx5.c`): dispatches to the context's mlx5
/// operations; a non-mlx5 context gets errno `EOPNOTSUPP` and NULL.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_sched_leaf_create(_context: *mut c_void, _sched_attr: *const c_void) -> *mut c_void {
    fail(EOPNOTSUPP)
}

/// `mlx5dv_sched_node_modify` (`providers/mlx5/mlx5.c`): dispatches to the mlx5 operations
/// of the node's context; for a node of a non-mlx5 context (none can exist here)
/// `EOPNOTSUPP`.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_sched_node_modify(_node: *mut c_void, _sched_attr: *const c_void) -> c_int {
    EOPNOTSUPP
}

/// `mlx5dv_sched_leaf_modify` (`providers/mlx5/mlx5.c`): dispatches to the mlx5 operations
/// of the leaf's context; for a leaf of a non-mlx5 context (none can exist here)
/// `EOPNOTSUPP`.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_sched_leaf_modify(_leaf: *mut c_void, _sched_attr: *const c_void) -> c_int {
    EOPNOTSUPP
}

/// `mlx5dv_sched_node_destroy` (`providers/mlx5/mlx5.c`): dispatches to the mlx5 operations
/// of the node's context; for a node of a non-mlx5 context (none can exist here)
/// `EOPNOTSUPP`.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_sched_node_destroy(_node: *mut c_void) -> c_int {
    EOPNOTSUPP
}

/// `mlx5dv_sched_leaf_destroy` (`providers/mlx5/mlx5.c`): dispatches to the mlx5 operations
/// of the leaf's context; for a leaf of a non-mlx5 context (none can exist here)
/// `EOPNOTSUPP`.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_sched_leaf_destroy(_leaf: *mut c_void) -> c_int {
    EOPNOTSUPP
}

/// `mlx5dv_reserved_qpn_alloc` (`providers/mlx5/mlx5.c`): dispatches to the context's mlx5
/// operations; a non-mlx5 context returns `EOPNOTSUPP` and writes no QP number.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_reserved_qpn_alloc(_ctx: *mut c_void, _qpn: *mut u32) -> c_int {
    EOPNOTSUPP
}

/// `mlx5dv_reserved_qpn_dealloc` (`providers/mlx5/mlx5.c`): dispatches to the context's
/// mlx5 operations; a non-mlx5 context returns `EOPNOTSUPP`.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_reserved_qpn_dealloc(_ctx: *mut c_void, _qpn: u32) -> c_int {
    EOPNOTSUPP
}

/// `mlx5dv_map_ah_to_qp` (`providers/mlx5/verbs.c`): dispatches to the mlx5 operations of
/// the AH's context; an AH of a non-mlx5 context (every AH here) gets `EOPNOTSUPP`.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_map_ah_to_qp(_ah: *mut c_void, _qp_num: u32) -> c_int {
    EOPNOTSUPP
}

/// `mlx5dv_qp_ex_from_ibv_qp_ex` (`providers/mlx5/verbs.c`): pure pointer arithmetic, with
/// no check at all: it takes the `ibv_qp_ex` to be the one embedded in an mlx5 QP and
/// returns the address of that QP's `mlx5dv_qp_ex`. For a QP of any other provider that
/// address lies in unrelated memory, and the first `mlx5dv_wr_*` call through it jumps
/// through garbage. This library cannot return an mlx5 QP's member, since it has none: it
/// returns NULL, which fails at the same point without running foreign memory. errno is
/// left alone, as the real function never sets it.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_qp_ex_from_ibv_qp_ex(_qp: *mut c_void) -> *mut c_void {
    std::ptr::null_mut()
}

/// `mlx5dv_qp_cancel_posted_send_wrs` (`providers/mlx5/qp.c`): first queries the QP's
/// hardware state with a DevX command, which fails with `EOPNOTSUPP` for a QP of a non-mlx5
/// context, and returns that failure negated (its successes are counts): `-EOPNOTSUPP`.
/// (Its argument comes from [`mlx5dv_qp_ex_from_ibv_qp_ex`], which here gives NULL.)
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_qp_cancel_posted_send_wrs(_mqp: *mut c_void, _wr_id: u64) -> c_int {
    -EOPNOTSUPP
}

/// `mlx5dv_dci_stream_id_reset` (`providers/mlx5/mlx5.c`): checks first that the QP's
/// device is an mlx5 device (`is_mlx5_dev()`) and returns `EOPNOTSUPP` when it is not, as for
/// every QP here.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_dci_stream_id_reset(_qp: *mut c_void, _stream_id: u16) -> c_int {
    EOPNOTSUPP
}

/// `mlx5dv_crypto_login` (`providers/mlx5/verbs.c`): dispatches to the context's mlx5
/// operations; a non-mlx5 context returns `EOPNOTSUPP`.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_crypto_login(_context: *mut c_void, _login_attr: *mut c_void) -> c_int {
    EOPNOTSUPP
}

/// `mlx5dv_crypto_login_query_state` (`providers/mlx5/verbs.c`): dispatches to the
/// context's mlx5 operations; a non-mlx5 context returns `EOPNOTSUPP` and writes no state.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_crypto_login_query_state(_context: *mut c_void, _state: *mut u32) -> c_int {
    EOPNOTSUPP
}

/// `mlx5dv_crypto_logout` (`providers/mlx5/verbs.c`): dispatches to the context's mlx5
/// operations; a non-mlx5 context returns `EOPNOTSUPP`.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_crypto_logout(_context: *mut c_void) -> c_int {
    EOPNOTSUPP
}

/// `mlx5dv_crypto_login_create` (`providers/mlx5/verbs.c`): dispatches to the context's
/// mlx5 operations; a non-mlx5 context gets errno `EOPNOTSUPP` and NULL.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_crypto_login_create(_context: *mut c_void, _login_attr: *mut c_void) -> *mut c_void {
    fail(EOPNOTSUPP)
}

/// `mlx5dv_crypto_login_query` (`providers/mlx5/verbs.c`): dispatches to the mlx5
/// operations of the login object's context; for one of a non-mlx5 context (none can exist
/// here) `EOPNOTSUPP`.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_crypto_login_query(_crypto_login: *mut c_void, _query_attr: *mut c_void) -> c_int {
    EOPNOTSUPP
}

/// `mlx5dv_crypto_login_destroy` (`providers/mlx5/verbs.c`): dispatches to the mlx5
/// operations of the login object's context; for one of a non-mlx5 context (none can exist
/// here) `EOPNOTSUPP`.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_crypto_login_destroy(_crypto_login: *mut c_void) -> c_int {
    EOPNOTSUPP
}

/// `mlx5dv_dek_create` (`providers/mlx5/verbs.c`): dispatches to the context's mlx5
/// operations; a non-mlx5 context gets errno `EOPNOTSUPP` and NULL.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_dek_create(_context: *mut c_void, _init_attr: *mut c_void) -> *mut c_void {
    fail(EOPNOTSUPP)
}

/// `mlx5dv_dek_query` (`providers/mlx5/verbs.c`): dispatches to the mlx5 operations of the
/// DEK's context; for a DEK of a non-mlx5 context (none can exist here) `EOPNOTSUPP`.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_dek_query(_dek: *mut c_void, _attr: *mut c_void) -> c_int {
    EOPNOTSUPP
}

/// `mlx5dv_dek_destroy` (`providers/mlx5/verbs.c`): dispatches to the mlx5 operations of the
/// DEK's context; for a DEK of a non-mlx5 context (none can exist here) `EOPNOTSUPP`.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_dek_destroy(_dek: *mut c_void) -> c_int {
    EOPNOTSUPP
}
