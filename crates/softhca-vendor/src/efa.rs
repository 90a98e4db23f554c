//! `libefa.so.1`: the `efadv_*` entry points (`providers/efa/verbs.c`).
//!
//! In rdma-core 44 each one but [`efadv_cq_from_ibv_cq_ex`] begins by checking that the
//! device of its context (or of its PD's or AH's context) is an EFA device (`is_efa_dev()`:
//! the device's operations are the EFA provider's), before looking at any other argument.
//! For every other device it logs "Not an EFA device" through libibverbs' provider log
//! (printed only when `VERBS_LOG_LEVEL` asks for errors; that log is libibverbs' private
//! interface, so these functions do not print it) and fails with `EOPNOTSUPP`. No device of
//! the drop-in is an EFA device.

use std::ffi::{c_int, c_void};

use libc::EOPNOTSUPP;

use crate::fail;

/// `efadv_query_device`: the EFA device check fails, so it returns `EOPNOTSUPP` (as the
/// return value; errno is not set) and leaves `attr` untouched.
#[no_mangle]
pub unsafe extern "C" fn efadv_query_device(_ibvctx: *mut c_void, _attr: *mut c_void, _inlen: u32) -> c_int {
    EOPNOTSUPP
}

/// `efadv_query_ah`: the EFA device check on the AH's context fails, so it returns
/// `EOPNOTSUPP` (errno is not set) and leaves `attr` untouched.
#[no_mangle]
pub unsafe extern "C" fn efadv_query_ah(_ibvah: *mut c_void, _attr: *mut c_void, _inlen: u32) -> c_int {
    EOPNOTSUPP
}

/// `efadv_create_driver_qp`: the EFA device check on the PD's context fails: errno
/// `EOPNOTSUPP` and NULL, before the QP type is looked at.
#[no_mangle]
pub unsafe extern "C" fn efadv_create_driver_qp(
    _ibvpd: *mut c_void,
    _attr: *mut c_void,
    _driver_qp_type: u32,
) -> *mut c_void {
    fail(EOPNOTSUPP)
}

/// `efadv_create_qp_ex`: the EFA device check fails: errno `EOPNOTSUPP` and NULL, before
/// the attributes are looked at.
#[no_mangle]
pub unsafe extern "C" fn efadv_create_qp_ex(
    _ibvctx: *mut c_void,
    _attr_ex: *mut c_void,
    _efa_attr: *mut c_void,
    _inlen: u32,
) -> *mut c_void {
    fail(EOPNOTSUPP)
}

/// `efadv_create_cq`: the EFA device check fails: errno `EOPNOTSUPP` and NULL, before the
/// attributes are looked at.
#[no_mangle]
pub unsafe extern "C" fn efadv_create_cq(
    _ibvctx: *mut c_void,
    _attr_ex: *mut c_void,
    _efa_attr: *mut c_void,
    _inlen: u32,
) -> *mut c_void {
    fail(EOPNOTSUPP)
}

/// `efadv_cq_from_ibv_cq_ex`: pure pointer arithmetic with no check: it takes the
/// `ibv_cq_ex` to be the one embedded in an EFA CQ and returns the address of that CQ's
/// `efadv_cq`, which for a CQ of any other provider lies in unrelated memory (and the
/// `efadv_wc_*` inlines then call through it). This library has no EFA CQ to point into: it
/// returns NULL, leaving errno alone as the real function does.
#[no_mangle]
pub unsafe extern "C" fn efadv_cq_from_ibv_cq_ex(_ibvcqx: *mut c_void) -> *mut c_void {
    std::ptr::null_mut()
}
