//! Debian's unmodified rdmacm-utils and perftest programs on the drop-in librdmacm.so.1, two
//! processes each, every pair on addresses of its own: rping, rdma_server/rdma_client,
//! rdma_xserver/rdma_xclient (RC and XRC),
//! ucmatose with several connections, udaddy (UD ids, SIDR), cmtime (a burst of 200
//! connections), mckey (multicast), pyverbs.cmid, and perftest's `-R` (connection through rdma_cm) for RDMA
//! Write, Send latency and RDMA Read.

mod common;

use common::*;

fn have_all(tools: &[&str]) -> bool {
    ready() && tools.iter().all(|t| tool(t))
}

#[test]
fn rping_exchanges_and_verifies_data() {
    if !have_all(&["rping"]) {
        return;
    }
    let (s, c) = pair(
        Proc { program: "rping", args: &["-s", "-a", "127.0.0.21", "-C", "200", "-v"], addr: [127, 0, 0, 21] },
        Proc { program: "rping", args: &["-c", "-a", "127.0.0.21", "-C", "200", "-v"], addr: [127, 0, 0, 22] },
    );
    // rping verifies each echo against what it sent (exit status); both sides print the data.
    assert!(c.contains("ping data: rdma-ping-199:"), "{c}");
    assert!(s.contains("server ping data: rdma-ping-199:"), "{s}");
}

#[test]
fn rdma_server_and_rdma_client_synchronous_endpoints() {
    if !have_all(&["rdma_server", "rdma_client"]) {
        return;
    }
    let (s, c) = pair(
        Proc { program: "rdma_server", args: &["-s", "127.0.0.23"], addr: [127, 0, 0, 23] },
        Proc { program: "rdma_client", args: &["-s", "127.0.0.23"], addr: [127, 0, 0, 24] },
    );
    assert!(s.contains("rdma_server: end 0"), "{s}");
    assert!(c.contains("rdma_client: end 0"), "{c}");
}

/// rdma_xserver/rdma_xclient in their RC mode (`-c r`, the default): the client's one Send is
/// inline on a QP that asked for no inline data, which Linux rxe's sizing allows (16 bytes
/// with one SGE). Their XRC mode is the next test.
#[test]
fn rdma_xserver_and_rdma_xclient_rc() {
    if !have_all(&["rdma_xserver", "rdma_xclient"]) {
        return;
    }
    let (s, c) = pair(
        Proc { program: "rdma_xserver", args: &["-p", "7472"], addr: [127, 0, 0, 27] },
        Proc { program: "rdma_xclient", args: &["-s", "127.0.0.27", "-p", "7472"], addr: [127, 0, 0, 28] },
    );
    assert!(s.contains("rdma_xserver: end 0"), "{s}");
    assert!(c.contains("rdma_xclient: end 0"), "{c}");
}

/// rdma_xserver/rdma_xclient in their XRC mode (`-c x`, port space IB): the server's endpoint
/// makes an XRC target QP and, with `rdma_create_srq`, an XRC SRQ (librdmacm gives both the
/// device's XRC domain), and accepts with the SRQ's number as private data; the client's
/// endpoint is an XRC initiator, whose inline Send names that SRQ and completes on the
/// server's SRQ CQ. Linux rxe has no XRC, so rdma-core's own test of this is softhca to
/// softhca only.
#[test]
fn rdma_xserver_and_rdma_xclient_xrc() {
    if !have_all(&["rdma_xserver", "rdma_xclient"]) {
        return;
    }
    let (s, c) = pair(
        Proc { program: "rdma_xserver", args: &["-c", "x", "-p", "7473"], addr: [127, 0, 0, 29] },
        Proc { program: "rdma_xclient", args: &["-c", "x", "-s", "127.0.0.29", "-p", "7473"], addr: [127, 0, 0, 30] },
    );
    assert!(s.contains("rdma_xserver: end 0"), "{s}");
    assert!(c.contains("rdma_xclient: end 0"), "{c}");
}

#[test]
fn ucmatose_with_several_connections() {
    if !have_all(&["ucmatose"]) {
        return;
    }
    let (s, c) = pair(
        Proc { program: "ucmatose", args: &["-b", "127.0.0.25", "-c", "8", "-C", "20"], addr: [127, 0, 0, 25] },
        Proc { program: "ucmatose", args: &["-s", "127.0.0.25", "-c", "8", "-C", "20"], addr: [127, 0, 0, 26] },
    );
    assert!(s.contains("test complete") && s.contains("disconnected"), "{s}");
    assert!(c.contains("test complete"), "{c}");
}

#[test]
fn udaddy_resolves_ud_services_with_sidr() {
    if !have_all(&["udaddy"]) {
        return;
    }
    let (s, c) = pair(
        Proc { program: "udaddy", args: &["-b", "127.0.0.35", "-c", "4", "-C", "20"], addr: [127, 0, 0, 35] },
        Proc { program: "udaddy", args: &["-s", "127.0.0.35", "-c", "4", "-C", "20"], addr: [127, 0, 0, 36] },
    );
    assert!(s.contains("test complete") && s.contains("return status 0"), "{s}");
    assert!(c.contains("test complete") && c.contains("return status 0"), "{c}");
}

/// mckey (rdmacm-utils): a receiver joins a multicast group through rdma_cm (its QP attached
/// on the join event), a sender in another process joins send-only and sends 20 datagrams to
/// the group's address handle, QPN 0xFFFFFF and Q_Key the event gave; the receiver must get
/// all 20 (it waits for ever otherwise: the hang guard kills it). The sender waits 3 s before
/// it sends, as mckey does.
#[test]
fn mckey_sends_to_a_multicast_group() {
    if !have_all(&["mckey"]) {
        return;
    }
    let (r, s) = pair_when(
        Proc { program: "mckey", args: &["-m", "239.0.0.57", "-b", "127.0.0.57", "-C", "20"], addr: [127, 0, 0, 57] },
        Proc {
            program: "mckey",
            args: &["-m", "239.0.0.57", "-b", "127.0.0.58", "-C", "20", "-s", "-o"],
            addr: [127, 0, 0, 58],
        },
        "MULTICAST_JOIN",
    );
    for out in [&r, &s] {
        assert!(out.contains("joined dgid: ::ffff:239.0.0.57") && out.contains("test complete"), "{out}");
    }
    assert!(r.contains("receiving data transfers") && s.contains("initiating data transfers"), "{r}\n{s}");
}

/// cmtime (rdmacm-utils): 200 connections set up and torn down at once, each step timed. What
/// it found: the GSI posted 32 receives and sent from an SQ of 32 dropping the rest, so a
/// burst of REQs, REPs or DREQs lost most of its MADs and they waited out a CM response
/// timeout (4.3 s) to be sent again (100 connections: 8.6 s to connect, 4.3 s to
/// disconnect); the GSI now posts 512 receives and queues what its SQ has no room for, as
/// Linux's MAD layer does. The client's CM must have resent nothing and dropped nothing
/// (its counters at exit, SOFTHCA_CM_DEBUG=1).
#[test]
fn cmtime_sets_up_and_tears_down_a_burst_of_connections_without_a_resend() {
    if !have_all(&["cmtime"]) {
        return;
    }
    let (_, c) = pair_serving(
        Proc { program: "cmtime", args: &["-b", "127.0.0.51"], addr: [127, 0, 0, 51] },
        Proc { program: "cmtime", args: &["-s", "127.0.0.51", "-c", "200"], addr: [127, 0, 0, 52] },
    );
    for step in ["create id", "resolve addr", "resolve route", "create qp", "connect", "disconnect", "destroy"] {
        assert!(c.lines().any(|l| l.starts_with(step) && l.contains(':')), "no {step} line\n{c}");
    }
    let counters = c.lines().find(|l| l.contains("counters at exit")).unwrap_or_else(|| panic!("no counters\n{c}"));
    assert!(counters.contains("resent: 0,") && counters.ends_with("MADs dropped by the GSI: 0"), "{counters}");
}

fn perftest(program: &str, args: &[&str], server: u8) {
    if !have_all(&[program]) {
        return;
    }
    let addr = format!("127.0.0.{server}");
    let client: Vec<&str> = args.iter().copied().chain([addr.as_str()]).collect();
    let (s, c) = pair(
        Proc { program, args, addr: [127, 0, 0, server] },
        Proc { program, args: &client, addr: [127, 0, 0, server + 1] },
    );
    // The result line: the size first, then the iteration count.
    let result = |t: &str| t.lines().any(|l| l.split_whitespace().take(2).collect::<Vec<_>>() == [args[3], args[5]]);
    assert!(result(&c) || result(&s), "no result line\nclient:\n{c}\nserver:\n{s}");
}

#[test]
fn perftest_write_bw_over_rdma_cm() {
    perftest("ib_write_bw", &["-R", "-F", "-s", "65536", "-n", "2000"], 27);
}

#[test]
fn perftest_send_lat_over_rdma_cm() {
    perftest("ib_send_lat", &["-R", "-F", "-s", "8", "-n", "2000"], 29);
}

#[test]
fn perftest_read_bw_over_rdma_cm() {
    perftest("ib_read_bw", &["-R", "-F", "-s", "65536", "-n", "2000"], 31);
}

/// python3-pyverbs' `pyverbs.cmid` (synchronous ids: rdma_create_ep, rdma_get_request, the
/// rdma_verbs.h helpers), unmodified, as two processes (`tests/python/cmid.py`).
#[test]
fn pyverbs_cmid_synchronous_endpoints() {
    let python = "/usr/bin/python3";
    let pyverbs = std::path::Path::new("/usr/lib/python3/dist-packages/pyverbs");
    if !(ready() && have(pyverbs.exists(), "python3-pyverbs")) {
        return;
    }
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/cmid.py");
    let (s, c) = pair(
        Proc { program: python, args: &[script, "server", "127.0.0.37", "7555"], addr: [127, 0, 0, 37] },
        Proc { program: python, args: &[script, "client", "127.0.0.37", "7555"], addr: [127, 0, 0, 38] },
    );
    assert!(s.contains("cmid server: ok"), "{s}");
    assert!(c.contains("cmid client: ok"), "{c}");
}
