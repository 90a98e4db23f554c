//! Review findings on memory windows and event acknowledgements in the drop-in
//! `libibverbs.so.1` (`tests/c/review2_*.c`), checked against what rdma-core's libibverbs
//! (mlx5's `bind_mw`) does. Every test here failed when it was written. Waits in the C
//! programs are hang guards only.

mod common;

use common::*;

/// `ops.bind_mw` posts the bind with the key byte `ibv_inc_rkey(mw->rkey)` but names, as the
/// key the window must still carry, softhca's *executed* key (`SendWr::bind_mw` reads
/// `mw.rkey()` at post time). A second `ibv_bind_mw` posted before the first one executed
/// therefore names the pre-bind key and completes with IBV_WC_MW_BIND_ERR (the QP goes to
/// Error). With libibverbs both binds succeed and the window ends with `mw->rkey`. Made
/// deterministic by posting both while the QP is in SQD (nothing starts), then back to RTS;
/// without SQD it fails whenever the engine is busy (e.g. another poller mid-turn).
#[test]
fn two_binds_posted_while_the_sq_is_drained() {
    if ready() {
        run("review2_mw", Some("bind_twice_sqd"));
    }
}

/// `IBV_ACCESS_ZERO_BASED` in `mw_access_flags` is silently dropped by
/// `Access::from_bits_truncate`, so the window is bound VA-based although the program asked
/// for offsets from 0; mlx5's `bind_mw` refuses it with EINVAL.
#[test]
fn a_zero_based_bind_is_refused() {
    if ready() {
        run("review2_mw", Some("zero_based"));
    }
}
