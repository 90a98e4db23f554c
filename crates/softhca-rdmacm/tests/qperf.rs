//! Debian's qperf 0.4.11, unmodified, on the drop-in libraries, run as a user runs it: `qperf`
//! (the server, which forks a child per test) and `qperf 127.0.0.1 -cm1 TESTS`, with no
//! SOFTHCA_ADDR, so that each process's device takes the first free 127.0.0.x. That needs a
//! loopback no other test's devices are on: both run in a network namespace of their own
//! (root; where it cannot be made the test says so and passes, as the namespace tests do).
//! Every RC test qperf has through rdma_cm, its data-checking `ver_` atomics included, must
//! print its figure. (Its UC and UD tests address the peer by LID, with no GRH, which a RoCE
//! port refuses on Linux too.)
//!
//! What it caught: qperf's one-way tests create the sending QP with no receive queue and the
//! receiving one with no send queue (`max_recv_wr` or `max_send_wr` 0), which Create QP
//! refused (Linux takes an empty queue); and qperf 0.4.11's server sends its port before it
//! listens, having bound the any address, which left 127.0.0.1 free for its client, whose
//! connect then reached the client's own device (REJ, no listener there) in most runs.

mod common;

use common::*;
use std::process::Command;

const NS: &str = "softhca-qperf";

/// `ip ARGS`, Err with what it printed.
fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip").args(args).output().map_err(|e| format!("ip: {e}"))?;
    if out.status.success() {
        return Ok(());
    }
    Err(format!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
}

/// The namespace, removed when dropped.
struct Netns;

impl Netns {
    fn make() -> Result<Netns, String> {
        let _ = ip(&["netns", "del", NS]);
        ip(&["netns", "add", NS])?;
        let ns = Netns;
        ip(&["-n", NS, "link", "set", "lo", "up"])?;
        Ok(ns)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = ip(&["netns", "del", NS]);
    }
}

/// `qperf ARGS` in the namespace, on the drop-in libraries.
fn qperf(args: &[&str]) -> Command {
    let all: Vec<&str> = ["netns", "exec", NS, "qperf"].iter().chain(args).copied().collect();
    command("ip", &all)
}

/// Each test's result line: its name, then `latency = `, `bw = ` or `msg_rate = ` and a figure.
fn figures(out: &str, tests: &[&str]) -> Result<(), String> {
    let lines: Vec<&str> = out.lines().map(str::trim).collect();
    for t in tests {
        let at = lines.iter().position(|l| *l == format!("{t}:")).ok_or(format!("no {t}"))?;
        let next = lines.get(at + 1).copied().unwrap_or("");
        let figure = next.split_once('=').and_then(|(k, v)| {
            let n: f64 = v.split_whitespace().next()?.parse().ok()?;
            (["latency", "bw", "msg_rate"].contains(&k.trim()) && n > 0.0).then_some(())
        });
        figure.ok_or(format!("{t}: {next}"))?;
    }
    Ok(())
}

#[test]
fn qperf_rc_tests_over_rdma_cm() {
    if !ready() || !tool("qperf") || !tool("ip") {
        return;
    }
    let _ns = match Netns::make() {
        Ok(ns) => ns,
        Err(e) => {
            eprintln!("SKIP qperf_rc_tests_over_rdma_cm: network namespaces unavailable here: {e}");
            return;
        }
    };
    let mut server = qperf(&[]).spawn().unwrap();
    let pid = server.id();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !listening_in(pid, 19765) {
        assert!(server.try_wait().unwrap().is_none(), "the qperf server exited");
        assert!(std::time::Instant::now() < deadline, "the qperf server never listened");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    #[rustfmt::skip]
    let tests = [
        "rc_lat", "rc_bw", "rc_bi_bw", "rc_rdma_write_lat", "rc_rdma_write_bw", "rc_rdma_read_lat",
        "rc_rdma_read_bw", "rc_compare_swap_mr", "rc_fetch_add_mr", "ver_rc_compare_swap", "ver_rc_fetch_add",
    ];
    let args: Vec<&str> = ["127.0.0.1", "-cm1", "-t", "1"].iter().chain(&tests).copied().collect();
    let client = finish(qperf(&args).spawn().unwrap(), 120, "qperf client");
    let _ = server.kill();
    let server = server.wait_with_output().unwrap();
    let out = String::from_utf8_lossy(&client.stdout).to_string() + &String::from_utf8_lossy(&client.stderr);
    let report = || format!("client ({}):\n{out}\nserver:\n{}", client.status, String::from_utf8_lossy(&server.stderr));
    assert!(client.status.success(), "{}", report());
    if let Err(e) = figures(&out, &tests) {
        panic!("{e}\n{}", report());
    }
}
