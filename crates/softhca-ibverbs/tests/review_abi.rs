//! Review findings on the drop-in `libibverbs.so.1`: C programs built against rdma-core's
//! `infiniband/verbs.h` (`tests/c/review_*.c`), run against softhca's library, checking what
//! rdma-core's libibverbs does. Every test here failed when it was written; each names the
//! difference. The helpers are those of `tests/c_programs.rs` (a test file cannot import
//! another's). Waits in the C programs are hang guards only.

mod common;

use common::*;

/// `ibv_get_async_event` ignores a non-blocking `async_fd` and waits for an event forever
/// (src/device.rs: a loop of one-hour waits). libibverbs' `ibv_get_async_event` is a `read()`
/// of `async_fd`: a program that made it non-blocking (as `ibv_get_async_event(3)` shows, and
/// event loops that drain after a wakeup do) gets -1 with errno EAGAIN when nothing waits.
#[test]
fn get_async_event_honours_a_non_blocking_async_fd() {
    if ready() {
        run("review_abi", Some("async_nonblocking"));
    }
}

/// A CQ destroyed while its completion event sits unread in the channel leaves the event
/// behind: the next `ibv_get_cq_event` on the shared channel fails with -1/EINVAL (the CQ is
/// gone from the channel's map) instead of returning the next live CQ's event. The kernel
/// (`ib_uverbs_release_ucq`) removes a destroyed CQ's pending events from its channel, so
/// with libibverbs the program gets CQ b's event.
#[test]
fn destroying_a_cq_drops_its_pending_channel_events() {
    if ready() {
        run("review_abi", Some("cq_event_after_destroy"));
    }
}

/// `ibv_get_cq_event` waited on a condition variable no signal interrupts, where libibverbs'
/// is a `read()` of the channel: a signal whose handler lacks SA_RESTART ends the wait with
/// -1/EINTR, one with SA_RESTART has the read go on. qperf ends its event loops by its
/// SIGALRM test timer so; its server waited for ever after `rc_lat` (`tests/qperf.rs` of
/// softhca-rdmacm).
#[test]
fn a_signal_ends_a_blocking_get_cq_event_as_a_read_ends() {
    if ready() {
        run("review_abi", Some("cq_event_interrupted"));
    }
}

/// `ibv_get_async_event` as `ibv_get_cq_event` above: a read of `async_fd` in libibverbs.
#[test]
fn a_signal_ends_a_blocking_get_async_event_as_a_read_ends() {
    if ready() {
        run("review_abi", Some("async_event_interrupted"));
    }
}

/// An asynchronous event of a QP destroyed before the program read it is still delivered,
/// with `element.qp == NULL` (the QP is gone from `Objects`), so an event loop that
/// dereferences `ev.element.qp` crashes. The kernel (`ib_uverbs_release_uevent`) removes a
/// destroyed object's unread events; libibverbs then returns the next live QP's event.
#[test]
fn destroying_a_qp_drops_its_unread_async_events() {
    if ready() {
        run("review_abi", Some("qp_event_after_destroy"));
    }
}

/// `ibv_query_qp` with `IBV_QP_STATE` does not store the state it read in `qp->state`
/// (src/qp.rs `ibv_query_qp`); libibverbs' `ibv_query_qp` does (`if (attr_mask &
/// IBV_QP_STATE) qp->state = attr->qp_state;`), so a QP that moved to Error by itself still
/// shows RTS in `qp->state` after the program asked.
#[test]
fn query_qp_updates_the_qp_state_field() {
    if ready() {
        run("review_abi", Some("query_qp_updates_state"));
    }
}

/// `ibv_create_srq` passes `attr.srq_limit` to softhca, which refuses a limit above max_wr
/// (EINVAL) and otherwise arms the limit at creation. verbs.h documents srq_limit as
/// "irrelevant for ibv_create_srq": the limit is only set by `ibv_modify_srq(IBV_SRQ_LIMIT)`,
/// so creation must succeed with the SRQ unarmed (limit 0).
#[test]
fn create_srq_ignores_srq_limit() {
    if ready() {
        run("review_abi", Some("create_srq_ignores_limit"));
    }
}

/// `ibv_reg_mr` with Remote Write but no Local Write fails with errno EACCES (errno_of maps
/// softhca's InvalidAccess to EACCES); libibverbs (the kernel's `ib_check_mr_access`) fails
/// it with EINVAL.
#[test]
fn reg_mr_remote_write_without_local_write_is_einval() {
    if ready() {
        run("review_abi", Some("reg_mr_access_errno"));
    }
}

/// `ibv_reg_mr` registers a range whose end wraps past the top of the address space
/// (`reg_mr_raw` checks only for a null address). The kernel (`ib_umem_get`) refuses it with
/// EINVAL; softhca hands out keys to memory that does not exist.
#[test]
fn reg_mr_refuses_a_wrapping_range() {
    if ready() {
        run("review_abi", Some("reg_mr_wrapping_range"));
    }
}

/// `ibv_reg_mr` registered memory that is not mapped, or mapped without the rights the
/// access needs, and the first access to it (a peer's Write, the engine's gather for a Send)
/// killed the process. The kernel pins the pages (`ib_umem_get`) and fails the registration
/// with EFAULT: a hole, PROT_NONE, or a read-only page under a writing access.
#[test]
fn reg_mr_refuses_memory_that_is_not_mapped() {
    if ready() {
        run("review_abi", Some("reg_mr_needs_mapped_memory"));
    }
}

/// `ibv_create_ah_from_wc` (IBVERBS_1.1) is not exported, nor `ibv_init_ah_from_wc`, so the
/// usual UD responder (answer the sender of a datagram) dies with "symbol lookup error" when
/// it first calls it. libibverbs builds the address from the completion and the GRH area
/// (softhca already writes the IPv4 header at bytes 20..40 of it). Also missing: every
/// IBVERBS_1.9 … 1.14 version node (a program using e.g. `ibv_get_device_index` or
/// `ibv_query_gid_ex` does not load at all), `ibv_rate_to_mult`, `ibv_attach_mcast`, ….
#[test]
fn ud_responder_replies_with_ibv_create_ah_from_wc() {
    if ready() {
        run("review_ud_ah", None);
    }
}

/// A Resize CQ right after UD sends were posted found their completions not written yet (the
/// engine thread had not sent them) and took a size below them, where Linux's rxe, which sends
/// in the `ibv_post_send` system call and completes at once, refuses it (EINVAL): rdma-core's
/// `test_resize_cq` failed in about half the runs. The drop-in's resize now gives the engine
/// up to 10 ms to finish what was posted (`Context::unsent`).
#[test]
fn resize_cq_counts_the_ud_sends_posted_before_it() {
    if ready() {
        run("review_abi", Some("resize_counts_posted_ud_sends"));
    }
}

/// Unsignaled UD sends and then, at once, Destroy QP: the destroy discarded what the engine
/// thread had not sent yet, where Linux's rxe has sent it in `ibv_post_send` (Debian's mckey
/// sender, which leaves its group and exits right after posting, delivered 1 of 20 datagrams
/// to rxe in the interop guest). The drop-in's destroy lets the QP's sends leave first (a second
/// at most, `Qp::unsent`).
#[test]
fn destroy_qp_after_unsignaled_ud_sends_loses_none() {
    if ready() {
        run("review_abi", Some("destroy_after_unsignaled_ud_sends"));
    }
}

/// A program that posts unsignaled UD sends and exits without destroying anything: Linux's rxe
/// has sent them in `ibv_post_send`; softhca's process ended with them still queued. An exit
/// handler now gives the engine up to a second to send what is posted (50 ms is within what a
/// loaded 2-core machine's scheduler can hold a thread back). Two processes (the drop-in has
/// one device a process): the receiver must get all 256, five times.
#[test]
fn a_program_that_exits_after_posting_loses_no_send() {
    use std::io::BufRead;
    if !ready() {
        return;
    }
    let exe = compile("exit_sends");
    for round in 0..5u8 {
        let mut recv = std::process::Command::new(&exe)
            .arg("recv")
            .env("LD_LIBRARY_PATH", library())
            .env("SOFTHCA_ADDR", "127.0.0.91")
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = std::io::BufReader::new(recv.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        let words: Vec<&str> = line.split_whitespace().collect();
        assert!(words.len() == 19 && words[0] == "qpn", "the receiver said {line:?}");
        let send = std::process::Command::new(&exe)
            .arg("send")
            .args(std::iter::once(words[1]).chain(words[3..].iter().copied()))
            .env("LD_LIBRARY_PATH", library())
            .env("SOFTHCA_ADDR", "127.0.0.92")
            .output()
            .unwrap();
        assert!(send.status.success(), "round {round}: the sender: {}", String::from_utf8_lossy(&send.stderr));
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
        let status = recv.wait().unwrap();
        assert!(status.success() && rest.contains("exit_sends: ok"), "round {round}: the receiver ({status}): {rest}");
    }
}

/// A gather or scatter list longer than the QP's `max_send_sge`/`max_recv_sge` (up to 32) was
/// read in full before the core refused it, past the end of the program's array (a NULL list
/// crashed), where rxe's provider checks `num_sge` first; and a circular list of work requests
/// on a QP in Error (each flushed at once, no queue ever full) was posted for ever. Now EINVAL
/// before any entry is read, and ENOMEM after max_qp_wr work requests of one list.
#[test]
fn bad_work_request_lists_fail_without_reading_past_them() {
    if ready() {
        run("review_abi", Some("bad_lists"));
    }
}
