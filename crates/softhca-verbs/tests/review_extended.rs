//! Review findings on the shared device, its contexts and the extended verbs of the drop-in
//! `libibverbs.so.1` (`tests/c/review3_ext.c`), checked against what rdma-core's libibverbs
//! with Linux rxe does. Every test here failed when it was written. Waits in the C program
//! are hang guards only.

mod common;

use common::*;

/// Modify QP with an attribute-mask bit above `IBV_QP_DEST_QPN` answered EINVAL; libibverbs'
/// `ibv_cmd_modify_qp` (rxe) refuses `IBV_QP_RATE_LIMIT` and above, and the kernel's Modify QP
/// any bit past `IB_QP_DEST_QPN`, with EOPNOTSUPP.
#[test]
fn modify_qp_refuses_unknown_mask_bits_with_eopnotsupp() {
    if ready() {
        run("review3_ext", Some("modify_unknown_bits"));
    }
}
