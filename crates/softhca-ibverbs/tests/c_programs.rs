//! softhca's drop-in `libibverbs.so.1` as users meet it: C programs built against rdma-core's
//! `infiniband/verbs.h` and Debian's unmodified `ibverbs-utils`, run as separate processes
//! with `LD_LIBRARY_PATH` pointing at the library (the devices talk RoCEv2 over UDP on
//! 127.0.0.x). Needs `cc`, `libibverbs-dev` and `ibverbs-utils`; without them each test says
//! so and passes, except under CI (`CI` set), where they are required.

mod common;

use std::process::{Command, Output, Stdio};

use common::*;

/// A TCP port for one pingpong: distinct per test process and per call, and below the
/// ephemeral range (32768-60999), where another program's connection could take it as its
/// source port at any moment.
fn port(k: u16) -> u16 {
    20000 + (std::process::id() % 1200) as u16 * 10 + k
}

/// Runs `prog` as server and client (two processes) with `args`; both must report their
/// result line. Returns the client's output.
fn pingpong(prog: &str, args: &[&str], k: u16, env: &[(&str, &str)]) -> String {
    let p = port(k).to_string();
    let spawn = |client: bool| {
        let mut c = Command::new(prog);
        with_lib(&mut c).args(["-g", "0", "-p", &p]).args(args).envs(env.iter().copied());
        if client {
            c.arg("127.0.0.1");
        }
        c.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap()
    };
    let mut server = Reaped(Some(spawn(false)));
    await_listening(server.child(), port(k), 20, prog);
    let client = finish(spawn(true), 60, prog);
    let server = finish(server.take(), 60, prog);
    let text = |o: &Output| format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    for (who, o) in [("client", &client), ("server", &server)] {
        assert!(o.status.success(), "{prog} {args:?} {who} failed: {}", text(o));
        assert!(text(o).contains("iters in"), "{prog} {who} printed no result: {}", text(o));
    }
    text(&client)
}

/// The structures softhca-ibverbs shares with C programs have the system header's sizes and
/// field offsets (a union of 64-bit words makes `ibv_gid` 8-aligned, which moves the end of
/// `ibv_qp_attr`: this test found it).
#[test]
fn structure_layouts_match_the_system_header() {
    if !tool("cc") || !verbs_header() {
        return;
    }
    let exe = compile("layout");
    let out = Command::new(&exe).output().unwrap();
    assert!(out.status.success());
    let c = String::from_utf8(out.stdout).unwrap();
    let rust = softhca_ibverbs::abi::layout_report();
    for (cl, rl) in c.lines().zip(rust.lines()) {
        assert_eq!(cl, rl, "C says {cl:?}, Rust says {rl:?}");
    }
    assert_eq!(c.lines().count(), rust.lines().count());
}

/// A C program's RC operations through the drop-in library: Send with Immediate, Write,
/// Read, both atomics, inline Send, a wrong R_Key (Remote Access Error, QP to Error, the next
/// WR flushed), Query QP and the busy refusals of teardown.
#[test]
fn a_c_program_runs_rc_operations() {
    if !tool("cc") || !verbs_header() {
        return;
    }
    run("rc_ops", None);
}

/// Modify QP through the C ABI accepts what Linux accepts beyond the digest:
/// `IBV_QP_CUR_STATE` naming the current state (another is EINVAL), Read/Atomic enables on a
/// UC QP (ignored), RC Init -> RTR without the Minimum RNR NAK Timer; a bad state is EINVAL.
/// Rule B-2
#[test]
fn modify_qp_accepts_what_linux_accepts() {
    if !tool("cc") || !verbs_header() {
        return;
    }
    run("modify_qp", None);
}

/// Modify QP's attribute masks through the C ABI, exhaustively, against a table written
/// from the kernel's `qp_state_table` (`verbs.c`) apart from `modify_mask.rs`: for RC, UC and
/// UD and every (from, to) pair of the seven states, the required mask succeeds, one required
/// bit removed or one refused bit added is EINVAL and leaves the state unchanged, each
/// optional bit added succeeds, and a pair Linux refuses is EINVAL with every mask (SQE is
/// never a target; Error goes only to Reset or Error; no RTS -> RTR; no Reset, Init or RTR
/// to anything past the next state). `IBV_QP_CUR_STATE` is taken only out of RTR, RTS, SQD
/// and SQE, naming the current state. Softhca's own answers are applied apart: Reset ->
/// Error accepted, RC Init -> RTR without the Minimum RNR NAK Timer, SQD -> RTS taking the
/// SQD -> SQD attributes. UC and UD QPs reach SQE by a Send with a bad L_Key; an alternate
/// path passes the mask check and is refused (EINVAL) by a device without a second address.
/// Rule B-2, MOD-GEN-5, MOD-GEN-9, MOD-GEN-12, QPT-SW-8, QPT-INV-2, QPT-INV-3, QPT-INV-4,
/// QPT-INV-5, QPT-INV-6, QPT-INV-7, QPT-AUTO-1
#[test]
fn modify_qp_masks_follow_the_kernel_table() {
    if !tool("cc") || !verbs_header() {
        return;
    }
    run("modify_qp_table", None);
}

/// A device with a second address (`SOFTHCA_ALT_ADDR`) takes alternate paths through the C
/// ABI: AUTO_PATH_MIG in the device caps, GID 1, IBV_QP_ALT_PATH with IBV_MIG_REARM (ARMED),
/// Query QP's alternate attributes, a migration by the consumer, and a Send between the
/// second addresses after it; an alternate path from an empty GID slot is EINVAL.
/// Rule MOD-GEN-9
#[test]
fn a_second_address_brings_alternate_paths() {
    if !tool("cc") || !verbs_header() {
        return;
    }
    run_with("apm", None, &[("SOFTHCA_ALT_ADDR", "127.22.0.1")]);
}

/// Raw Packet QPs between two processes: a broadcast Ethernet frame arrives whole, the port
/// alone takes the QP to RTS; EPERM at Create QP without CAP_NET_RAW.
#[test]
fn raw_packet_qps_carry_whole_frames() {
    if !tool("cc") || !verbs_header() {
        return;
    }
    run("raw_packet", None);
}

/// `ibv_devinfo -v` shows the device, an active Ethernet port and its RoCE v2 GID.
#[test]
fn ibv_devinfo_shows_the_device() {
    if !tool("ibv_devinfo") || !tool("cc") {
        return;
    }
    let out = with_lib(&mut Command::new("ibv_devinfo")).arg("-v").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    for want in ["hca_id:\tsofthca0", "PORT_ACTIVE (4)", "link_layer:\t\tEthernet", "::ffff:127.0.", "RoCE v2"] {
        assert!(text.contains(want), "no {want:?} in:\n{text}");
    }
    assert!(!String::from_utf8_lossy(&out.stderr).contains("version information"), "symbol versions missing");
}

#[test]
fn ibv_rc_pingpong_between_two_processes() {
    if !tool("ibv_rc_pingpong") || !tool("cc") {
        return;
    }
    pingpong("ibv_rc_pingpong", &["-n", "200"], 0, &[]);
}

/// With `-e` the programs sleep in `ibv_get_cq_event` on the completion channel.
#[test]
fn ibv_rc_pingpong_with_completion_events() {
    if !tool("ibv_rc_pingpong") || !tool("cc") {
        return;
    }
    pingpong("ibv_rc_pingpong", &["-n", "200", "-e"], 1, &[]);
}

/// Busy-poll devices (SOFTHCA_BUSY_POLL=1), small messages.
#[test]
fn ibv_rc_pingpong_busy_poll() {
    if !tool("ibv_rc_pingpong") || !tool("cc") {
        return;
    }
    pingpong("ibv_rc_pingpong", &["-n", "2000", "-s", "8"], 2, &[("SOFTHCA_BUSY_POLL", "1")]);
}

/// `SOFTHCA_STATS=1`: a program that closes its device before it exits, as the
/// pingpongs and perftest do, gets the counters as it closes, once (not again at exit).
#[test]
fn counters_print_when_the_device_closes() {
    if !tool("ibv_rc_pingpong") || !tool("cc") {
        return;
    }
    let text = pingpong("ibv_rc_pingpong", &["-n", "50"], 6, &[("SOFTHCA_STATS", "1")]);
    let lines: Vec<&str> = text.lines().filter(|l| l.starts_with("softhca stats: ")).collect();
    assert_eq!(lines.len(), 2, "one transport and one link line expected:\n{text}");
    assert!(lines[0].contains("rx_packets: ") && !lines[0].contains("rx_packets: 0,"), "{}", lines[0]);
}

#[test]
fn ibv_uc_pingpong_between_two_processes() {
    if !tool("ibv_uc_pingpong") || !tool("cc") {
        return;
    }
    pingpong("ibv_uc_pingpong", &["-n", "200"], 3, &[]);
}

#[test]
fn ibv_ud_pingpong_between_two_processes() {
    if !tool("ibv_ud_pingpong") || !tool("cc") {
        return;
    }
    pingpong("ibv_ud_pingpong", &["-n", "200"], 4, &[]);
}

#[test]
fn ibv_srq_pingpong_between_two_processes() {
    if !tool("ibv_srq_pingpong") || !tool("cc") {
        return;
    }
    pingpong("ibv_srq_pingpong", &["-n", "200"], 5, &[]);
}

/// Asynchronous events through the C ABI: Last WQE Reached names the QP (on an SRQ, moved to
/// Error), and Destroy QP returns once the program acknowledged it (libibverbs' destroy waits
/// for the acknowledgements of what it handed out).
/// Rule EVT-LWR-1
#[test]
fn async_events_name_their_qp_and_destroy_waits_for_the_ack() {
    if !tool("cc") || !verbs_header() {
        return;
    }
    run("async_events", None);
}

/// Memory windows through the C ABI: a type 1 window bound with `ibv_bind_mw` carries the
/// R_Key `ibv_inc_rkey` gives at once, grants its range to an RDMA Write, and after a rebind
/// the old R_Key is refused; there is no type 3.
/// Rule WR-BIND-1, WR-BIND-6
#[test]
fn memory_windows_through_the_c_abi() {
    if !tool("cc") || !verbs_header() {
        return;
    }
    run("mw", None);
}

/// Type 2 windows through the C ABI (IBA 10.6.7): bound by an `IBV_WR_BIND_MW` work request and
/// by `ibv_wr_bind_mw`, freed by the peer's `IBV_WR_SEND_WITH_INV` (the receive reports
/// `IBV_WC_WITH_INV` and the R_Key) and by `ibv_wr_local_inv`; the device reports
/// `IBV_DEVICE_MEM_WINDOW_TYPE_2B`.
/// Rule WR-BIND-6
#[test]
fn type_2_windows_and_invalidation_through_the_c_abi() {
    if !tool("cc") || !verbs_header() {
        return;
    }
    run("mw2", None);
}

/// The public helpers beyond the verbs (rates, kernel-ABI copies, P_Key and GID tables,
/// Ethernet neighbours, ECE, fork, sysfs) answer as libibverbs 44 does, and what softhca
/// cannot do (import, dma-buf) fails with libibverbs' errno.
#[test]
fn public_helpers_of_libibverbs() {
    if !tool("cc") || !verbs_header() {
        return;
    }
    run("helpers", None);
}

/// The extended verbs: Query Device Ex and the extended port attributes, `ibv_create_cq_ex`
/// polled through `ibv_start_poll`/`ibv_next_poll`/`ibv_wc_read_*`, `ibv_create_qp_ex` and
/// every `ibv_wr_*` operation and setter softhca posts (RC and UD), aborted and failed
/// batches (nothing posted), and the refusals of what softhca does not have.
#[test]
fn extended_verbs() {
    if !tool("cc") || !verbs_header() {
        return;
    }
    run("extended", None);
}

/// `ibv_devices` lists the device with its node GUID.
#[test]
fn ibv_devices_lists_the_device() {
    if !tool("ibv_devices") || !tool("cc") {
        return;
    }
    let out = with_lib(&mut Command::new("ibv_devices")).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.lines().any(|l| l.contains("softhca0") && l.contains("02005efffe005ca0")), "{text}");
}

/// UD multicast: `ibv_attach_mcast`/`ibv_detach_mcast` with Linux's answers (EINVAL for a
/// unicast GID, a non-UD QP, a detach of what is not attached; 0 for an attach again; EBUSY
/// for Destroy QP while attached), rxe's limits in Query Device, and a Send to the group
/// reaching both attached QPs of the device, the sender's own included.
#[test]
fn ud_multicast() {
    if !tool("cc") || !verbs_header() {
        return;
    }
    run("mcast", None);
}

/// XRC through libibverbs' calls (`tests/c/xrc.c`): `ibv_open_xrcd`'s errnos and a file's
/// domain shared by two handles, `ibv_close_xrcd` EBUSY while held, XRC SRQs and their numbers,
/// target and initiator QPs, perftest's Modify QP masks, Sends and a Write completing on the
/// CQ of the SRQ each names.
#[test]
fn xrc() {
    if !tool("cc") || !verbs_header() {
        return;
    }
    run("xrc", None);
}

/// `ibv_rereg_mr`: libibverbs' input errors and the kernel's command errors with errno, a new
/// PD, new rights (a remote Write refused once they are gone), new memory under the same keys
/// (the translation, mlx5's; rxe answers it EOPNOTSUPP), EFAULT for memory not mapped.
#[test]
fn rereg_mr() {
    if !tool("cc") || !verbs_header() {
        return;
    }
    run("rereg", None);
}

/// A program that forks with the device open (`tests/c/fork.c`): the child's ibv_open_device
/// opens a device of its own, on its own address, and data moves on it; the context it
/// inherited closes as a no-op; the parent's device goes on working.
#[test]
fn a_forked_child_opens_a_device_of_its_own() {
    if !tool("cc") || !verbs_header() {
        return;
    }
    run("fork", None);
}

/// On-demand paging through libibverbs (`tests/c/odp.c`): the capabilities, a region over a
/// hole and a read-only page (EFAULT without IBV_ACCESS_ON_DEMAND), Writes into them failing
/// with REM_ACCESS_ERR while the process lives, the implicit region, `ibv_advise_mr`'s
/// answers, and `ibv_rereg_mr` keeping on-demand paging the region's.
#[test]
fn on_demand_paging() {
    if !tool("cc") || !verbs_header() {
        return;
    }
    run("odp", None);
}

/// Thread domains and parent domains (`tests/c/domains.c`): the attribute checks, a parent
/// domain standing for its PD (QP, region, extended CQ, a Write), and the holds (EBUSY) in
/// each direction, released in order.
#[test]
fn thread_and_parent_domains() {
    if !tool("cc") || !verbs_header() {
        return;
    }
    run("domains", None);
}

/// Atomic Write through libibverbs (`tests/c/atomic_write.c`): RC only, `ibv_wr_atomic_write`
/// and `IBV_WR_ATOMIC_WRITE` landing their word, `IBV_WC_ATOMIC_WRITE`, the length check, and
/// the responder's refusals (a misaligned word, a region without Remote Write).
#[test]
fn atomic_write() {
    if !tool("cc") || !verbs_header() {
        return;
    }
    run("atomic_write", None);
}

/// Device memory through libibverbs (`tests/c/dm.c`), as mlx5 answers it for MEMIC: the pool,
/// the copies' granules, the zero-based region moving data (Send, Write and Read), the holds
/// and the import.
#[test]
fn device_memory() {
    if !tool("cc") || !verbs_header() {
        return;
    }
    run("dm", None);
}
