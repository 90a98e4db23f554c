//! libfabric on the drop-in libraries: Debian's libfabric1 (1.17) and its `fi_pingpong`
//! (libfabric-bin), unmodified, as two processes, every message's data checked (`-c`). Its
//! verbs provider takes softhca0 through both libraries: datagram endpoints (UD) straight on
//! libibverbs; message endpoints (RC, connected through rdma_cm) and reliable-datagram ones
//! (`verbs;ofi_rxm`, RDM over those message endpoints).
//!
//! The provider offers message endpoints only on the addresses of interfaces that are up and
//! not loopback (it binds each with `rdma_bind_addr` to find their devices), so those two run
//! between two network namespaces joined by a veth pair, each device on its namespace's
//! address; where namespaces are refused (not root), that test says so and passes, as
//! `udp_netns.rs` does. Datagram endpoints need no interface address: they run on loopback.

mod common;
#[path = "../../softhca/tests/udp_common/netns.rs"]
mod netns;

use common::*;
use netns::VethPair;
use std::process::{Child, Command};

/// The fi_pingpong pair's output: both must exit 0 and report every exchange of every size.
fn check(what: &str, server: Child, client: Child, iterations: u32) {
    let c = finish(client, 120, &format!("{what} client"));
    let s = finish(server, 30, &format!("{what} server"));
    for (side, o) in [("server", &s), ("client", &c)] {
        let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
        let rows: Vec<&str> =
            text.lines().filter(|l| l.split_whitespace().nth(2) == Some(&format!("={iterations}"))).collect();
        assert!(o.status.success() && !rows.is_empty(), "{what} {side}: {}:\n{text}", o.status);
        // -c: fi_pingpong checks each message's bytes and fails on a mismatch; every size
        // it tried completed all its exchanges.
        assert!(!text.contains("error"), "{what} {side}:\n{text}");
    }
}

/// `fi_pingpong` on the drop-in libraries, its device on `addr` (else where a device goes by
/// default), under `wrap` (`ip netns exec NS`, which runs it in its own process, environment
/// and all).
fn pingpong(wrap: &[&str], addr: Option<&str>, args: &[&str]) -> Command {
    let argv = [wrap, &["fi_pingpong"], args].concat();
    let mut c = command(argv[0], &argv[1..]);
    if let Some(a) = addr {
        c.env("SOFTHCA_ADDR", a);
    }
    c
}

/// Datagram endpoints (the verbs provider's UD) between two processes on loopback, every
/// size fi_pingpong tries up to the path MTU: with the devices where `SOFTHCA_ADDR` puts them,
/// and where they go by default (the provider's probe binds "localhost" and each interface's
/// address, which must neither fail nor move a device onto an interface address the other
/// process then cannot have).
#[test]
fn fi_pingpong_datagram_endpoints() {
    if !(ready() && tool("fi_pingpong")) {
        return;
    }
    let args = ["-p", "verbs", "-e", "dgram", "-I", "100", "-c"];
    for (server, client, port) in [(Some("127.0.0.71"), Some("127.0.0.72"), "29611"), (None, None, "29612")] {
        let mut s = pingpong(&[], server, &[&args[..], &["-B", port]].concat()).spawn().unwrap();
        await_listening(&mut s, port.parse().unwrap(), 30, "fi_pingpong dgram");
        let mut c = pingpong(&[], client, &[&args[..], &["-P", port, server.unwrap_or("127.0.0.1")]].concat());
        check(&format!("fi_pingpong dgram, SOFTHCA_ADDR {server:?}"), s, c.spawn().unwrap(), 100);
    }
}

const NS_A: &str = "softhca-fab-a";
const NS_B: &str = "softhca-fab-b";
const PAIR: VethPair =
    VethPair { ns: [NS_A, NS_B], dev: ["fab-veth0", "fab-veth1"], addr: ["198.19.0.1/24", "198.19.0.2/24"] };

/// Message endpoints (RC through rdma_cm: the provider's passive endpoint listens, the client
/// connects) and reliable-datagram endpoints on them (`verbs;ofi_rxm`), each between the two
/// namespaces, every size fi_pingpong tries (64 B to 1 MiB).
#[test]
fn fi_pingpong_message_and_rdm_endpoints_between_namespaces() {
    if !(ready() && tool("fi_pingpong") && tool("ip")) {
        return;
    }
    PAIR.run("fi_pingpong_message_and_rdm_endpoints_between_namespaces", || {
        for (provider, ep) in [("verbs", "msg"), ("verbs;ofi_rxm", "rdm")] {
            let what = format!("fi_pingpong -p {provider} -e {ep}");
            let args = ["-p", provider, "-e", ep, "-I", "50", "-c"];
            let a = ["ip", "netns", "exec", NS_A];
            let b = ["ip", "netns", "exec", NS_B];
            let mut s = pingpong(&a, Some("198.19.0.1"), &args).spawn().unwrap();
            let pid = s.id();
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
            while !listening_in(pid, 47592) {
                assert!(s.try_wait().unwrap().is_none() && std::time::Instant::now() < deadline, "{what}: no server");
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
            let c = pingpong(&b, Some("198.19.0.2"), &[&args[..], &["198.19.0.1"]].concat()).spawn().unwrap();
            check(&what, s, c, 50);
        }
    });
}
