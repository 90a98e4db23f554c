//! rdma_cm's answers through the C ABI, one process (`tests/c/cm_edges.c`): what a program
//! sees for bind errors, a port nobody listens on, a consumer's reject, accept with private
//! data both ways, a Send, and a disconnect that flushes the other side.

mod common;

use common::*;

/// Runs a case of `cm_edges` (`c`, its environment set) under a hang guard of `secs`: it must
/// exit 0 and say `<what>: ok`.
fn passes(c: &mut std::process::Command, what: &str, secs: u64) {
    let out = finish(c.spawn().unwrap(), secs, what);
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && text.contains(&format!("{what}: ok")), "{what}: {}:\n{text}", out.status);
}

/// Runs `cm_edges <case>` with its device on `addr`; it must pass (see [`passes`]).
fn case(name: &str, addr: &str) {
    let exe = compile("cm_edges");
    passes(command(&exe, &[name]).env("SOFTHCA_ADDR", addr), &format!("cm_edges {name}"), 60);
}

#[test]
fn cm_edges() {
    if !ready() {
        return;
    }
    let exe = compile("cm_edges");
    passes(command(&exe, &[]).env("SOFTHCA_ADDR", "127.0.0.33"), "cm_edges", 60);
}

/// A REQ nobody answers: after the CM's retries (shortened here with SOFTHCA_CM_RESPONSE_TIMEOUT
/// 12, about 17 ms, and SOFTHCA_CM_MAX_RETRIES 3), UNREACHABLE with -ETIMEDOUT, as rdma_cm
/// reports IB_CM_REQ_ERROR; and a DREQ nobody answers, DISCONNECTED with -ETIMEDOUT, as it
/// reports IB_CM_DREQ_ERROR. (The same timings bound the connection made before the DREQ, in
/// one thread: about 1 ms a try, as before, gave a loaded machine four to stall through.)
#[test]
fn a_peer_that_is_not_there_is_unreachable() {
    if !ready() {
        return;
    }
    let exe = compile("cm_edges");
    let mut c = command(&exe, &["unreachable"]);
    let c =
        c.env("SOFTHCA_ADDR", "127.0.0.41").env("SOFTHCA_CM_RESPONSE_TIMEOUT", "12").env("SOFTHCA_CM_MAX_RETRIES", "3");
    passes(c, "cm_edges unreachable", 60);
}

/// rdma_cm's UDP port space: service ID resolution as Linux reports it (the SIDR request
/// with its private data only, the REP's QPN, Q_Key and private data, a consumer's reject
/// UNREACHABLE with status 2), a datagram through the resolved address, and rdma_disconnect of
/// a UD id (0, its QP in Error).
#[test]
fn sidr_events_as_linux_reports_them() {
    if !ready() {
        return;
    }
    case("sidr", "127.0.0.43");
}

/// rdma_cm over IPv6: a device on ::1, a listener and a client of one process connect
/// through [::1] (the cma header's IPv6 form, IPv6 addresses in the request's id).
#[test]
fn ipv6_addresses_connect() {
    if !(ready() && have(std::net::UdpSocket::bind("[::1]:0").is_ok(), "an IPv6 loopback (::1)")) {
        return;
    }
    case("ipv6", "::1");
}

/// A type of service set on the client before its route resolves (`rdma_set_option` TOS) is
/// the traffic class of the route, the REQ and both QPs' address vectors: the server's side
/// takes it from the REQ (`cm_edges tos`).
#[test]
fn the_clients_type_of_service_reaches_both_address_vectors() {
    if !ready() {
        return;
    }
    case("tos", "127.0.0.53");
}

/// A signal ends a blocking `rdma_get_cm_event` as it ends librdmacm's (a system call on the
/// kernel's rdma_cm file): -1/EINTR where the handler lacks SA_RESTART. The drop-in read its
/// descriptor again after EINTR.
#[test]
fn a_signal_ends_a_blocking_get_cm_event() {
    if !ready() {
        return;
    }
    let exe = compile("cm_edges");
    let mut c = command(&exe, &["get_event_interrupted"]);
    passes(c.env("SOFTHCA_ADDR", "127.0.0.49"), "cm_edges get_event_interrupted", 60);
}

/// A QP that `rdma_create_qp` made and the program destroyed with `ibv_destroy_qp` (rping
/// does) is no longer the id's, so the CM thread, which moves a connected id's QP to Error on
/// the peer's DREQ, touches no freed memory. Run under valgrind's memcheck, which fails the
/// program on such a touch (before the fix it read the freed QP, and rping hung now and then
/// on the lock it found there).
#[test]
fn a_qp_destroyed_with_ibv_destroy_qp_is_forgotten_by_its_id() {
    if !(ready() && tool("valgrind")) {
        return;
    }
    let exe = compile("cm_edges");
    let mut c = command("valgrind", &["-q", "--error-exitcode=9", exe.to_str().unwrap(), "qp_destroyed"]);
    passes(c.env("SOFTHCA_ADDR", "127.0.0.45"), "cm_edges qp_destroyed", 120);
}

/// Where a bind puts a device not yet open: with `SOFTHCA_ADDR`, there, whatever loopback
/// address is bound first (it binds with no device, as on Linux); without, on the bound
/// loopback address (`rping -s -a 127.0.0.x` needs nothing more).
#[test]
fn a_first_bind_places_the_device_on_softhca_addr_else_on_its_loopback_address() {
    if !ready() {
        return;
    }
    let exe = compile("cm_edges");
    for (env, first) in [(Some("127.0.0.46"), "127.0.0.47"), (None, "127.0.0.48")] {
        let mut c = command(&exe, &["placement", first]);
        c.env_remove("SOFTHCA_ADDR");
        if let Some(a) = env {
            c.env("SOFTHCA_ADDR", a);
        }
        eprintln!("placement: SOFTHCA_ADDR {env:?}, first bind {first}");
        passes(&mut c, "cm_edges placement", 60);
    }
}

/// A process that exits while connected ends its connection as the kernel does when the
/// process's rdma_cm file closes: the peer gets DISCONNECTED (`tests/c/cm_exit.c`).
#[test]
fn exit_while_connected_disconnects_the_peer() {
    if !ready() {
        return;
    }
    let exe = compile("cm_exit");
    let exe = exe.to_str().unwrap();
    let (s, c) = pair(
        Proc { program: exe, args: &["server", "127.0.0.39", "7600"], addr: [127, 0, 0, 39] },
        Proc { program: exe, args: &["client", "127.0.0.39", "7600"], addr: [127, 0, 0, 40] },
    );
    assert!(s.contains("cm_exit server: ok"), "{s}");
    assert!(c.contains("cm_exit client: ok"), "{c}");
}

/// rdma_cm across a fork (`tests/c/cm_fork.c`): a connected process forks; the child, on an
/// address of its own, connects to itself through its own device and CM thread; the parent
/// connects again after the child has gone.
#[test]
fn a_forked_child_runs_a_connection_manager_of_its_own() {
    if !ready() {
        return;
    }
    let exe = compile("cm_fork");
    let mut c = command(&exe, &["127.0.0.181", "127.0.0.182", "7610"]);
    passes(c.env("SOFTHCA_ADDR", "127.0.0.181"), "cm_fork", 60);
}

/// Multicast through rdma_cm (`cm_edges multicast`): the join event's address handle, QPN,
/// Q_Key and context; the QP attached by the join and detached by the leave, a send-only join
/// attaching nothing; the refusals of a join before the bind, an IPv6 group (524), join_ex's
/// mask and flags, and a leave of what was not joined.
#[test]
fn multicast_joins_and_leaves() {
    if !ready() {
        return;
    }
    case("multicast", "127.0.0.42");
}
