//! The `softhca` binary run as a user runs it. Deterministic: the sim link with fixed seeds,
//! no assertions on timing.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn softhca(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_softhca")).args(args).output().expect("run softhca")
}

/// Runs and expects success; returns stdout.
fn ok(args: &[&str]) -> String {
    let out = softhca(args);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "softhca {args:?} failed: {}\nstdout:\n{stdout}\nstderr:\n{stderr}", out.status);
    stdout
}

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("softhca-cli-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn rxe(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/rxe").join(name)
}

#[test]
fn devinfo_shows_device_port_gid_and_attributes() {
    let out = ok(&["devinfo"]);
    for want in [
        "hca_id:\tsofthca0",
        "node_guid:",
        "fw_ver:",
        "max_qp:",
        "max_qp_wr:",
        "max_sge:",
        "max_cq:",
        "max_cqe:",
        "max_mr:",
        "max_pd:",
        "max_qp_rd_atom:",
        "atomic_cap:",
        "max_inline_data:",
        "PORT_ACTIVE",
        "active_mtu:",
        "link_layer:                     Ethernet",
        "GID[  0]:",
        "::ffff:127.1.0.1",
    ] {
        assert!(out.contains(want), "missing {want:?} in\n{out}");
    }
    assert!(!out.contains("max_srq:"), "max_srq only with -v");
    let verbose = ok(&["devinfo", "-v"]);
    for want in ["max_srq:", "max_mw:", "max_res_rd_atom:", "P_Key[  0]:", "0xffff"] {
        assert!(verbose.contains(want), "missing {want:?} in -v output\n{verbose}");
    }
}

fn assert_pingpong(out: &str, size: u64, iters: u64) {
    let bytes = format!("{} bytes in ", size * iters * 2);
    assert!(out.contains(&bytes) && out.contains("Mbit/sec"), "{out}");
    assert!(out.contains(&format!("{iters} iters in ")) && out.contains("usec/iter"), "{out}");
    assert!(out.contains("payload check: ok"), "{out}");
    assert!(out.contains("local address:  LID 0x0000, QPN 0x"), "{out}");
}

#[test]
fn pingpong_rc_on_the_sim_link() {
    let out = ok(&["pingpong", "--qp", "rc", "--iters", "200", "--size", "4096"]);
    assert_pingpong(&out, 4096, 200);
}

#[test]
fn pingpong_rc_survives_loss() {
    let out =
        ok(&["pingpong", "--iters", "200", "--size", "3000", "--loss", "0.05", "--corrupt", "0.02", "--seed", "3"]);
    assert_pingpong(&out, 3000, 200);
}

#[test]
fn pingpong_uc_and_ud_on_the_sim_link() {
    let out = ok(&["pingpong", "--qp", "uc", "--iters", "100", "--size", "5000"]);
    assert_pingpong(&out, 5000, 100);
    let out = ok(&["pingpong", "--qp", "ud", "--iters", "100", "--size", "1024", "--mtu", "1024"]);
    assert_pingpong(&out, 1024, 100);
}

/// RD: each end's EECN crosses with its QPN, and the channel retransmits what the link loses.
/// Rule WR-SEND-6
#[test]
fn pingpong_rd_on_the_sim_link() {
    let out = ok(&["pingpong", "--qp", "rd", "--iters", "200", "--size", "3000"]);
    assert_pingpong(&out, 3000, 200);
    assert!(out.contains(", EECN 0x"), "{out}");
    let out = ok(&[
        "pingpong",
        "--qp",
        "rd",
        "--iters",
        "200",
        "--size",
        "3000",
        "--loss",
        "0.05",
        "--corrupt",
        "0.02",
        "--seed",
        "4",
    ]);
    assert_pingpong(&out, 3000, 200);
    assert!(!out.contains("retransmits: 0 "), "the lossy link made the channel retransmit:\n{out}");
}

#[test]
fn pingpong_ud_refuses_messages_over_the_mtu() {
    let out = softhca(&["pingpong", "--qp", "ud", "--size", "4096", "--mtu", "1024"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("exceeds --mtu"));
}

fn perf_json(args: &[&str]) -> Value {
    let mut all = vec!["perf"];
    all.extend_from_slice(args);
    all.push("--json");
    let out = ok(&all);
    let lines: Vec<&str> = out.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "exactly one JSON object: {out}");
    serde_json::from_str(lines[0]).unwrap_or_else(|e| panic!("bad JSON ({e}): {out}"))
}

fn check_perf(v: &Value, completions: u64) {
    for key in ["bw_gbps", "bw_gbytes_s", "msg_rate_mps", "lat_us_p50", "lat_us_p99", "retransmits"] {
        assert!(v[key].is_number(), "{key} missing: {v}");
    }
    // Gigabits and gigabytes of the same run.
    let (bits, bytes) = (v["bw_gbps"].as_f64().unwrap(), v["bw_gbytes_s"].as_f64().unwrap());
    assert!((bits - 8.0 * bytes).abs() <= 1e-9 * bits.max(1.0), "{v}");
    assert_eq!(v["data_verified"], Value::Bool(true), "{v}");
    assert_eq!(v["completions"].as_u64(), Some(completions), "{v}");
    assert_eq!(v["errors"].as_u64(), Some(0), "{v}");
}

#[test]
fn perf_each_operation_on_a_clean_sim_link() {
    for op in ["send", "write", "read", "atomic"] {
        let v = perf_json(&[op, "--iters", "300", "--size", "8192"]);
        check_perf(&v, 300);
        assert_eq!(v["retransmits"].as_u64(), Some(0), "clean link: {v}");
        assert_eq!(v["test"], op);
    }
}

#[test]
fn perf_each_operation_under_faults() {
    for (op, seed) in [("send", "1"), ("write", "2"), ("read", "3"), ("atomic", "4")] {
        let v = perf_json(&[
            op,
            "--iters",
            "200",
            "--size",
            "4096",
            "--depth",
            "16",
            "--qps",
            "2",
            "--loss",
            "0.03",
            "--dup",
            "0.02",
            "--reorder",
            "0.03",
            "--corrupt",
            "0.02",
            "--seed",
            seed,
        ]);
        check_perf(&v, 400);
        assert!(v["retransmits"].as_u64().unwrap() > 0, "faults cause retransmissions: {v}");
        assert!(v["sim"]["lost"].as_u64().unwrap() > 0, "{v}");
    }
}

#[test]
fn perf_is_deterministic_on_the_sim_link() {
    let args = ["write", "--iters", "100", "--size", "2048", "--loss", "0.05", "--seed", "9"];
    let (a, b) = (perf_json(&args), perf_json(&args));
    assert_eq!(a["device"], b["device"]);
    assert_eq!(a["sim"], b["sim"]);
    assert_eq!(a["virtual_s"], b["virtual_s"]);
}

#[test]
fn perf_inline_lat_and_table() {
    let v = perf_json(&["send", "--inline", "--size", "64", "--iters", "100", "--lat"]);
    check_perf(&v, 100);
    assert_eq!(v["depth"].as_u64(), Some(1));
    let v = perf_json(&["write", "--inline", "--size", "256", "--iters", "100"]);
    check_perf(&v, 100);
    let table = ok(&["perf", "read", "--iters", "50", "--size", "1000", "--lat"]);
    for want in ["BW [Gb/s]", "p99 [us]", "data verified: yes", "virtual time"] {
        assert!(table.contains(want), "missing {want:?} in\n{table}");
    }
}

#[test]
fn perf_duration_mode_completes_what_it_posts() {
    let v = perf_json(&["atomic", "--duration", "0.2"]);
    assert_eq!(v["data_verified"], Value::Bool(true), "{v}");
    assert_eq!(v["errors"].as_u64(), Some(0));
    assert!(v["completions"].as_u64().unwrap() > 0);
}

#[test]
fn trace_decodes_rxe_captures() {
    let out = ok(&["trace", rxe("rxe-rc_pingpong.pcap").to_str().unwrap()]);
    for want in
        ["RC_SEND_FIRST", "RC_SEND_MIDDLE", "RC_SEND_LAST", "RC_ACKNOWLEDGE", "ACK MSN", "1 QP pair,", "|--", "-|"]
    {
        assert!(out.contains(want), "missing {want:?}");
    }
    let out = ok(&["trace", rxe("rxe-read_bw_4k.pcap").to_str().unwrap()]);
    assert!(out.contains("RC_RDMA_READ_REQUEST") && out.contains("RC_RDMA_READ_RESPONSE"), "read opcodes");
    let out = ok(&["trace", rxe("rxe-atomic_cas.pcap").to_str().unwrap()]);
    assert!(out.contains("RC_COMPARE_SWAP") && out.contains("RC_ATOMIC_ACKNOWLEDGE"), "{out}");
    let out = ok(&["trace", rxe("rxe-ud_pingpong.pcap").to_str().unwrap()]);
    assert!(out.contains("UD_SEND_ONLY") && out.contains("SrcQP"), "{out}");
    let out = ok(&["trace", rxe("rxe-rc_pingpong_ipv6.pcap").to_str().unwrap()]);
    assert!(out.contains("RC_SEND_LAST") && out.contains("RC_ACKNOWLEDGE"), "{out}");
}

#[test]
fn trace_marks_retransmissions_in_the_rxe_loss_capture() {
    let out = ok(&["trace", rxe("rxe-rc_pingpong_loss.pcap").to_str().unwrap()]);
    let summary_retx = out.lines().filter(|l| l.ends_with(" RETX") && l.contains(" -> ")).count();
    assert!(summary_retx > 0, "a RETX in the summary");
    assert!(out.lines().any(|l| l.contains("RETX") && l.contains("|-")), "a RETX arrow in the ladder");
}

#[test]
fn pcap_flag_writes_a_readable_capture_that_trace_decodes() {
    let p = tmp("perf.pcap");
    let v = perf_json(&[
        "write",
        "--iters",
        "20",
        "--size",
        "3000",
        "--loss",
        "0.1",
        "--seed",
        "5",
        "--pcap",
        p.to_str().unwrap(),
    ]);
    check_perf(&v, 20);
    assert_eq!(v["pcap"].as_str(), Some(p.to_str().unwrap()));
    let out = ok(&["trace", p.to_str().unwrap()]);
    assert!(out.contains("RC_RDMA_WRITE_ONLY") && out.contains("RC_ACKNOWLEDGE"), "{out}");
    assert!(out.contains("127.1.0.1 -> 127.1.0.2"), "{out}");
    assert!(out.contains("RETX"), "10% loss forces a retransmission: {out}");

    let p2 = tmp("pp.pcap");
    ok(&["pingpong", "--iters", "5", "--size", "100", "--pcap", p2.to_str().unwrap()]);
    let out = ok(&["trace", p2.to_str().unwrap(), "--no-summary"]);
    assert!(out.contains("QP pair") && out.contains("RC_SEND_ONLY"), "{out}");
    // Both directions of the pingpong belong to one QP pair.
    assert!(out.contains("1 QP pair,"), "{out}");

    let p3 = tmp("devinfo.pcap");
    ok(&["devinfo", "--pcap", p3.to_str().unwrap()]);
    assert_eq!(std::fs::read(&p3).unwrap().len(), 24, "a pcap header and no packets");
}

#[test]
fn trace_refuses_what_is_not_a_pcap() {
    let p = tmp("garbage.pcap");
    std::fs::write(&p, b"not a pcap at all, just text").unwrap();
    let out = softhca(&["trace", p.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a pcap"));
}

#[test]
fn demo_runs_by_default_and_says_where_the_pcap_is() {
    let p = tmp("demo.pcap");
    let out = ok(&["demo", "--pcap", p.to_str().unwrap()]);
    for want in [
        "RC pingpong",
        "RDMA Write",
        "RDMA Read",
        "Fetch&Add",
        "verified",
        "retransmission",
        "every WR completed successfully: yes",
        "ladder around the first retransmission",
        "RETX",
    ] {
        assert!(out.contains(want), "missing {want:?} in\n{out}");
    }
    assert!(out.contains(&format!("pcap written to {}", p.display())), "{out}");
    assert!(std::fs::metadata(&p).unwrap().len() > 24);

    // No subcommand: the demo, with its pcap in the temp dir.
    let out = ok(&[]);
    let default = std::env::temp_dir().join("softhca-demo.pcap");
    assert!(out.contains(&format!("pcap written to {}", default.display())), "{out}");
}

#[test]
fn udp_link_flags_are_checked() {
    let out = softhca(&["pingpong", "--link", "udp"]);
    assert!(!out.status.success());
    let out = softhca(&["perf", "write", "--link", "sim", "--loopback"]);
    assert!(!out.status.success());
    let out = softhca(&["perf", "write", "--link", "udp"]);
    assert!(!out.status.success());
}

/// A free TCP port for the QP-information exchange.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

#[test]
fn udp_pingpong_between_two_processes() {
    for qp in ["rc", "ud", "rd"] {
        let port = free_port().to_string();
        let size = "1024";
        let common = ["pingpong", "--link", "udp", "--qp", qp, "--iters", "200", "--size", size, "--port", &port];
        let server = Command::new(env!("CARGO_BIN_EXE_softhca"))
            .args(common)
            .arg("--server")
            .env("SOFTHCA_WAIT_SECS", "30")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let client = Command::new(env!("CARGO_BIN_EXE_softhca"))
            .args(common)
            .args(["--connect", "127.0.0.1"])
            .env("SOFTHCA_WAIT_SECS", "30")
            .output()
            .unwrap();
        let server = server.wait_with_output().unwrap();
        for (who, out) in [("server", &server), ("client", &client)] {
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(out.status.success(), "{qp} {who} failed:\n{text}\n{}", String::from_utf8_lossy(&out.stderr));
            assert_pingpong(&text, 1024, 200);
            assert!(text.contains("GID ::ffff:127.0.0."), "{text}");
        }
    }
}

/// Every perf operation with both ends in this process on `link`, its data verified.
fn perf_loopback_verifies_data(link: &str) {
    for op in ["write", "send", "read", "atomic"] {
        let out = Command::new(env!("CARGO_BIN_EXE_softhca"))
            .args(["perf", op, "--link", link, "--loopback", "--iters", "300", "--size", "16384", "--json"])
            .env("SOFTHCA_WAIT_SECS", "30")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{op}: {text}\n{}", String::from_utf8_lossy(&out.stderr));
        let v: Value = serde_json::from_str(text.trim()).unwrap();
        check_perf(&v, 300);
        assert_eq!(v["link"], link);
    }
}

#[test]
fn udp_perf_loopback_verifies_data() {
    perf_loopback_verifies_data("udp");
}

/// A child process that is killed (by its PID) and reaped if the test ends before it does.
struct Child {
    child: std::process::Child,
    stdout: PathBuf,
    stderr: PathBuf,
}

impl Child {
    /// Starts `softhca args`, its output going to files (no pipe can fill up and block it).
    fn spawn(name: &str, args: &[&str]) -> Child {
        let stdout = tmp(&format!("{name}.stdout"));
        let stderr = tmp(&format!("{name}.stderr"));
        let child = Command::new(env!("CARGO_BIN_EXE_softhca"))
            .args(args)
            .env("SOFTHCA_WAIT_SECS", "30")
            .stdin(std::process::Stdio::null())
            .stdout(std::fs::File::create(&stdout).unwrap())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .expect("start softhca");
        Child { child, stdout, stderr }
    }

    /// Waits at most `secs` for the exit; returns success and stdout, stderr.
    fn finish(mut self, secs: u64) -> (bool, String, String) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break Some(status);
            }
            if std::time::Instant::now() >= deadline {
                break None;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        let out = std::fs::read_to_string(&self.stdout).unwrap_or_default();
        let mut err = std::fs::read_to_string(&self.stderr).unwrap_or_default();
        if status.is_none() {
            err.push_str(&format!("\n(still running after {secs} s: killed)"));
        }
        (status.is_some_and(|s| s.success()), out, err)
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// Runs `perf` as a server and a client process; returns both JSON results.
fn perf_two_processes(name: &str, op: &str, args: &[&str]) -> (Value, Value) {
    let port = free_port().to_string();
    let server =
        Child::spawn(&format!("{name}-server"), &["perf", op, "--link", "udp", "--server", "--port", &port, "--json"]);
    let mut client_args = vec!["perf", op, "--link", "udp", "--connect", "127.0.0.1", "--port", &port, "--json"];
    client_args.extend_from_slice(args);
    let client = Child::spawn(&format!("{name}-client"), &client_args);
    let (c_ok, c_out, c_err) = client.finish(90);
    // The server ends with its client; a failed client takes the server down via TCP, and
    // `Drop` kills it if not.
    let (s_ok, s_out, s_err) = server.finish(if c_ok { 30 } else { 5 });
    assert!(c_ok, "{name}: client failed\nstdout:\n{c_out}\nstderr:\n{c_err}\nserver stderr:\n{s_err}");
    assert!(s_ok, "{name}: server failed\nstdout:\n{s_out}\nstderr:\n{s_err}");
    let parse = |who: &str, out: &str| -> Value {
        let lines: Vec<&str> = out.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(lines.len(), 1, "{name}: the {who} prints exactly one JSON object: {out}");
        serde_json::from_str(lines[0]).unwrap_or_else(|e| panic!("{name}: bad JSON from the {who} ({e}): {out}"))
    };
    (parse("client", &c_out), parse("server", &s_out))
}

fn check_two_processes(client: &Value, server: &Value, op: &str, completions: u64) {
    check_perf(client, completions);
    assert_eq!(client["test"], op, "{client}");
    assert_eq!(client["link"], "udp", "{client}");
    assert_eq!(client["mode"], "client", "{client}");
    assert!(client["peer"].as_str().is_some_and(|p| p.starts_with("::ffff:127.0.0.")), "{client}");
    // The server prints what the client measured.
    assert_eq!(client, server);
}

#[test]
fn udp_perf_write_and_send_between_two_processes() {
    for op in ["write", "send"] {
        let (c, s) = perf_two_processes(&format!("bw-{op}"), op, &["--iters", "300", "--size", "16384"]);
        check_two_processes(&c, &s, op, 300);
        assert_eq!(c["lat_method"], "completion");
        let (c, s) = perf_two_processes(
            &format!("bw-qps-{op}"),
            op,
            &["--iters", "100", "--size", "5000", "--qps", "3", "--depth", "16", "--mtu", "1024"],
        );
        check_two_processes(&c, &s, op, 300);
        assert_eq!(c["qps"].as_u64(), Some(3));
    }
}

#[test]
fn udp_perf_latency_between_two_processes() {
    for op in ["write", "send"] {
        let (c, s) = perf_two_processes(&format!("lat-{op}"), op, &["--lat", "--iters", "200", "--size", "64"]);
        check_two_processes(&c, &s, op, 200);
        assert_eq!(c["lat_method"], "half round trip", "{c}");
        assert_eq!(c["depth"].as_u64(), Some(1));
        let (c, s) = perf_two_processes(
            &format!("lat-inline-qps-{op}"),
            op,
            &["--lat", "--iters", "50", "--size", "200", "--inline", "--qps", "2"],
        );
        check_two_processes(&c, &s, op, 100);
    }
}

#[test]
fn udp_perf_read_and_atomic_between_two_processes() {
    for op in ["read", "atomic"] {
        let (c, s) = perf_two_processes(&format!("bw-{op}"), op, &["--iters", "200", "--size", "8192", "--qps", "2"]);
        check_two_processes(&c, &s, op, 400);
    }
}

#[test]
fn udp_perf_server_refuses_a_different_test() {
    let port = free_port().to_string();
    let server = Child::spawn("refuse-server", &["perf", "write", "--link", "udp", "--server", "--port", &port]);
    let client =
        Child::spawn("refuse-client", &["perf", "read", "--link", "udp", "--connect", "127.0.0.1", "--port", &port]);
    let (c_ok, _, c_err) = client.finish(60);
    let (s_ok, _, s_err) = server.finish(10);
    assert!(!c_ok && !s_ok);
    assert!(
        c_err.contains("the server refused the test: the client runs perf read, this server perf write"),
        "{c_err}"
    );
    assert!(s_err.contains("refused"), "{s_err}");
}

/// `--link shm`: both ends in one process (`--loopback`), and a server and a client process
/// meeting through their rings in /dev/shm; every operation's data is verified. A server
/// started without `--busy-poll` busy-polls for a client that does.
#[test]
fn shm_perf_in_one_process_and_between_two() {
    perf_loopback_verifies_data("shm");
    for (op, extra) in [("write", &[][..]), ("send", &["--lat", "--size", "8", "--busy-poll"][..])] {
        let port = free_port().to_string();
        let server =
            Child::spawn(&format!("shm-{op}-server"), &["perf", op, "--link", "shm", "--server", "--port", &port]);
        let mut args = vec!["perf", op, "--link", "shm", "--connect", "127.0.0.1", "--port", &port, "--iters", "200"];
        args.extend_from_slice(extra);
        args.push("--json");
        let (c_ok, c_out, c_err) = Child::spawn(&format!("shm-{op}-client"), &args).finish(90);
        let (s_ok, _, s_err) = server.finish(if c_ok { 30 } else { 5 });
        assert!(c_ok && s_ok, "{op}: client {c_out} {c_err}\nserver {s_err}");
        // A server started without --busy-poll follows a client that busy-polls.
        assert_eq!(s_err.contains("so does this server"), extra.contains(&"--busy-poll"), "{s_err}");
        let v: Value = serde_json::from_str(c_out.trim()).unwrap();
        check_perf(&v, 200);
        assert_eq!((v["link"].as_str(), v["mode"].as_str()), (Some("shm"), Some("client")), "{v}");
    }
}
