//! Two hosts: two network namespaces joined by a veth pair (198.18.0.1/24 and 198.18.0.2/24,
//! the benchmarking range, existing only inside the namespaces), a server and a client process
//! in each, RC traffic between them over the udp link. Needs root and iproute2; when namespaces
//! are refused, the test prints why and passes.

mod udp_common;

use std::process::Command;

use udp_common::procs;

const NS_A: &str = "softhca-test-a";
const NS_B: &str = "softhca-test-b";

#[test]
#[ignore]
fn udp_netns_role() {
    procs::role();
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip").args(args).output().map_err(|e| format!("ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
    }
}

fn cleanup() {
    let _ = ip(&["netns", "del", NS_A]);
    let _ = ip(&["netns", "del", NS_B]);
}

fn setup() -> Result<(), String> {
    cleanup();
    ip(&["netns", "add", NS_A])?;
    ip(&["netns", "add", NS_B])?;
    ip(&["link", "add", "shca-veth0", "netns", NS_A, "type", "veth", "peer", "name", "shca-veth1", "netns", NS_B])?;
    for (ns, dev, addr) in [(NS_A, "shca-veth0", "198.18.0.1/24"), (NS_B, "shca-veth1", "198.18.0.2/24")] {
        ip(&["-n", ns, "addr", "add", addr, "dev", dev])?;
        // RoCE needs the path MTU (4096 here) to fit the link: jumbo frames, as RoCE fabrics use.
        ip(&["-n", ns, "link", "set", dev, "mtu", "9000", "up"])?;
        ip(&["-n", ns, "link", "set", "lo", "up"])?;
    }
    Ok(())
}

#[test]
fn two_namespaces_over_veth() {
    if let Err(e) = setup() {
        cleanup();
        eprintln!("SKIP two_namespaces_over_veth: network namespaces unavailable here: {e}");
        return;
    }
    let result = std::panic::catch_unwind(|| {
        procs::run_pair(
            &["ip", "netns", "exec", NS_A],
            &["ip", "netns", "exec", NS_B],
            "udp_netns_role",
            &[("SOFTHCA_ADDR", "198.18.0.1")],
            &[("SOFTHCA_ADDR", "198.18.0.2")],
        )
    });
    cleanup();
    if let Err(p) = result {
        std::panic::resume_unwind(p);
    }
}
