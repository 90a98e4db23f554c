//! Review findings on the shared device, its contexts and the extended verbs of the drop-in
//! `libibverbs.so.1` (`tests/c/review3_ext.c`), checked against what rdma-core's libibverbs
//! with Linux rxe does. Every test here failed when it was written. Waits in the C program
//! are hang guards only.

mod common;

use common::*;

/// A thread blocked in `ibv_get_async_event` while another thread closes the context waited
/// on a condition variable inside the freed context (a use after free; in practice it never
/// returned). Linux closes the context's async event queue with it and the blocked read
/// returns -EIO: `ibv_get_async_event` gives -1 with errno EIO.
#[test]
fn closing_a_context_wakes_its_async_event_waiter() {
    if ready() {
        run("review3_ext", Some("close_wakes_async_waiter"));
    }
}

/// A context closed with its QP still there left the QP running on the shared device (other
/// contexts keep it open): a peer's RDMA Write still landed in the closed context's memory,
/// which the program may have freed. Closing a context on Linux releases every object of it
/// (the kernel destroys the command file's uobjects), so the peer's write fails.
#[test]
fn closing_a_context_stops_its_qps() {
    if ready() {
        run("review3_ext", Some("close_stops_qps"));
    }
}

/// `ibv_wr_start` .. `ibv_wr_complete` was no critical section: another thread's `wr_start`
/// reset the batch being built, so requests were lost, posted twice, or failed with EINVAL.
/// ibv_wr_post(3): "The provider will provide locking to ensure that ibv_wr_start() and
/// ibv_wr_complete()/abort() form a per-QP critical section where no other threads can
/// enter" (rxe and mlx5 hold the SQ lock across it).
#[test]
fn the_wr_builder_is_a_per_qp_critical_section() {
    if ready() {
        run("review3_ext", Some("wr_exclusive"));
    }
}

/// Two threads polling one extended CQ overwrote each other's current completion between
/// `ibv_start_poll` and `ibv_end_poll` (one `current` slot per CQ, no lock), so a poller read
/// the other's `wr_id`: completions seen twice and never. rxe and mlx5 hold the CQ lock from
/// `start_poll` to `end_poll` unless the CQ was created single-threaded.
#[test]
fn an_extended_cq_poll_batch_belongs_to_its_poller() {
    if ready() {
        run("review3_ext", Some("cq_ex_exclusive"));
    }
}

/// Modify QP with an attribute-mask bit above `IBV_QP_DEST_QPN` answered EINVAL; libibverbs'
/// `ibv_cmd_modify_qp` (rxe) refuses `IBV_QP_RATE_LIMIT` and above, and the kernel's Modify QP
/// any bit past `IB_QP_DEST_QPN`, with EOPNOTSUPP.
#[test]
fn modify_qp_refuses_unknown_mask_bits_with_eopnotsupp() {
    if ready() {
        run("review3_ext", Some("modify_unknown_bits"));
    }
}

/// The queries left bytes libibverbs zeroes: the compatibility `ibv_query_port` did not write
/// `flags` (the old layout's last byte, which `__lib_query_port` copies from the provider's
/// answer), and
/// the extended `query_port` and `query_device_ex` wrote nothing past their own structure when
/// a program built against a newer header passed a larger one (libibverbs zeroes the caller's
/// whole `port_attr_len` / `attr_size` first).
#[test]
fn queries_zero_what_they_do_not_fill() {
    if ready() {
        run("review3_ext", Some("query_zeroes"));
    }
}

/// Create QP wrote back exactly the capacities asked for, where Linux rxe sizes a send WQE for
/// the larger of the SGEs and inline bytes and reports what it holds of both (1 SGE: 16 inline
/// bytes; 64 inline bytes: 4 SGEs), so rdma_xclient's 16-byte inline Send on a QP that asked for
/// no inline data failed with EINVAL. The table is what rxe wrote back in the guest. The Send
/// also checks the completion flags rxe sets outside the digest's fields (GRH on an RC receive,
/// WITH_IMM on the sender's completion), which softhca did not set.
#[test]
fn create_qp_reports_the_send_capacities_rxe_reports() {
    if ready() {
        run("review3_ext", Some("qp_caps"));
    }
}

/// Answers compared with Linux rxe's in the guest (a probe of each verb's failure, run on both):
/// a failed kernel-command verb (`ibv_modify_qp`, `ibv_destroy_cq`, `ibv_query_port`, …) left
/// errno alone, where the failed system call sets it on Linux and programs `perror` after it;
/// a CQ held a power of two where rxe and mlx5 give the next power of two above the request,
/// less one; an empty source GID slot was EINVAL (the kernel's ENODATA), an unknown QP type
/// EOPNOTSUPP (EINVAL), a P_Key past the table -1 without errno (ENOENT); the port reported
/// neither connection management nor that its addresses need the GRH.
#[test]
fn failures_and_sizes_answer_as_rxe() {
    if ready() {
        run("review3_ext", Some("as_rxe"));
    }
}
