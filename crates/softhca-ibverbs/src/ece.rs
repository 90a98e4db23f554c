//! Enhanced Connection Establishment (ECE) and the data-placement query: what a connection
//! manager asks a QP before it connects. ECE options are vendor features negotiated in the CM
//! private data; softhca implements none, so it keeps what the program (or librdmacm, from the
//! peer's REQ) sets and reports it back, and reports its own vendor with no options before.
//! The kept value lives in the QP object, and goes with it.

use std::ffi::c_int;

use crate::abi::{ibv_ece, ibv_qp};
use crate::qp::qp;

/// The vendor softhca reports in ECE before one was set: its device's vendor id.
const SOFTHCA_VENDOR_ID: u32 = 0xFFFFFF;

/// Keeps `ece` for the QP. A zero vendor means "no ECE" and is refused with EOPNOTSUPP, as
/// libibverbs does before it asks the provider; `comp_mask` has no defined bits (EINVAL).
#[no_mangle]
pub unsafe extern "C" fn ibv_set_ece(q: *mut ibv_qp, ece: *mut ibv_ece) -> c_int {
    if q.is_null() || ece.is_null() {
        crate::set_errno(libc::EINVAL);
        return libc::EINVAL;
    }
    // SAFETY: a readable ECE (libibverbs' contract).
    let e = unsafe { *ece };
    if e.vendor_id == 0 {
        crate::set_errno(libc::EOPNOTSUPP);
        return libc::EOPNOTSUPP;
    }
    if e.comp_mask != 0 {
        return libc::EINVAL;
    }
    // SAFETY: a live QP of this library.
    *unsafe { qp(q) }.ece.lock().unwrap_or_else(|e| e.into_inner()) = Some(e);
    0
}

#[no_mangle]
pub unsafe extern "C" fn ibv_query_ece(q: *mut ibv_qp, ece: *mut ibv_ece) -> c_int {
    if q.is_null() || ece.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: a live QP of this library.
    let e = unsafe { qp(q) }.ece.lock().unwrap_or_else(|e| e.into_inner()).unwrap_or(ibv_ece {
        vendor_id: SOFTHCA_VENDOR_ID,
        options: 0,
        comp_mask: 0,
    });
    // SAFETY: a writable ECE.
    unsafe { ece.write(e) };
    0
}

/// Whether data of `op` lands in memory in order (`IBV_QUERY_QP_DATA_IN_ORDER_*`): softhca
/// places each packet in PSN order, but copies a packet's bytes with `memcpy`, whose order
/// within a buffer is not defined, so it promises nothing (0), which is also what libibverbs
/// answers for a provider without the query (rxe).
#[no_mangle]
pub unsafe extern "C" fn ibv_query_qp_data_in_order(_qp: *mut ibv_qp, _op: c_int, _flags: u32) -> c_int {
    0
}
