//! Two hosts: two network namespaces joined by a veth pair (198.18.0.1/24 and 198.18.0.2/24,
//! the benchmarking range, existing only inside the namespaces), a server and a client process
//! in each, RC traffic between them over the udp link. Needs root and iproute2; when namespaces
//! are refused, the test prints why and passes.

mod udp_common;

use udp_common::netns::VethPair;
use udp_common::procs;

const NS_A: &str = "softhca-test-a";
const NS_B: &str = "softhca-test-b";
const PAIR: VethPair =
    VethPair { ns: [NS_A, NS_B], dev: ["shca-veth0", "shca-veth1"], addr: ["198.18.0.1/24", "198.18.0.2/24"] };

#[test]
#[ignore]
fn udp_netns_role() {
    procs::role();
}

#[test]
fn two_namespaces_over_veth() {
    PAIR.run("two_namespaces_over_veth", || {
        procs::run_pair(
            &["ip", "netns", "exec", NS_A],
            &["ip", "netns", "exec", NS_B],
            "udp_netns_role",
            &[("SOFTHCA_ADDR", "198.18.0.1")],
            &[("SOFTHCA_ADDR", "198.18.0.2")],
        )
    });
}
