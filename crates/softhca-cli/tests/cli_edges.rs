//! The `softhca` binary on bad flags, bad captures and bad peers (from a review): each gets a
//! clean error that says what to fix, never a panic, an abort or a hang.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_softhca");

fn softhca(args: &[&str]) -> Output {
    Command::new(BIN).args(args).env("SOFTHCA_WAIT_SECS", "5").output().expect("run softhca")
}

fn text(out: &Output) -> (String, String) {
    (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// A clean `softhca: error: ...` and exit code 1, no panic, no abort.
fn assert_clean_error(args: &[&str], out: &Output) {
    let (o, e) = text(out);
    assert_eq!(out.status.code(), Some(1), "softhca {args:?}: {}\nstdout:\n{o}\nstderr:\n{e}", out.status);
    assert!(!e.contains("panicked"), "softhca {args:?} panicked:\n{e}");
    assert!(e.contains("softhca: error:"), "softhca {args:?}:\n{e}");
}

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("softhca-review6-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A small capture written by softhca itself (sim link, Ethernet link type).
fn capture(name: &str) -> (PathBuf, Vec<u8>) {
    let path = tmp(name);
    let out = softhca(&["pingpong", "--iters", "3", "--size", "64", "--pcap", path.to_str().unwrap()]);
    assert!(out.status.success(), "{:?}", text(&out));
    let bytes = std::fs::read(&path).unwrap();
    (path, bytes)
}

/// The records of a little-endian microsecond pcap (what softhca writes): (header, data).
fn records(pcap: &[u8]) -> Vec<([u8; 16], Vec<u8>)> {
    let mut out = Vec::new();
    let mut at = 24;
    while at + 16 <= pcap.len() {
        let mut h = [0u8; 16];
        h.copy_from_slice(&pcap[at..at + 16]);
        let len = u32::from_le_bytes(h[8..12].try_into().unwrap()) as usize;
        out.push((h, pcap[at + 16..at + 16 + len].to_vec()));
        at += 16 + len;
    }
    out
}

// ---------------------------------------------------------------------------------------
// Flags

/// pingpong bounds --size (and its receive buffers) before allocating anything.
#[test]
fn pingpong_huge_size_is_an_error_not_a_panic() {
    let args = ["pingpong", "--size", "18446744073709551615"];
    assert_clean_error(&args, &softhca(&args));
}

/// `--duration 1e20` is refused by validation rather than overflowing a `Duration`.
#[test]
fn perf_huge_duration_is_an_error_not_a_panic() {
    let args = ["perf", "write", "--duration", "1e20"];
    assert_clean_error(&args, &softhca(&args));
}

// ---------------------------------------------------------------------------------------
// trace

/// Wireshark saves pcapng by default: the error names the format and how to convert it.
#[test]
fn trace_says_what_to_do_with_a_pcapng_file() {
    let path = tmp("saved-by-wireshark");
    // A pcapng Section Header Block (little-endian), no options.
    let mut shb = Vec::new();
    shb.extend_from_slice(&0x0a0d_0d0au32.to_le_bytes());
    shb.extend_from_slice(&28u32.to_le_bytes());
    shb.extend_from_slice(&0x1a2b_3c4du32.to_le_bytes());
    shb.extend_from_slice(&1u16.to_le_bytes());
    shb.extend_from_slice(&0u16.to_le_bytes());
    shb.extend_from_slice(&u64::MAX.to_le_bytes());
    shb.extend_from_slice(&28u32.to_le_bytes());
    std::fs::write(&path, &shb).unwrap();
    let out = softhca(&["trace", path.to_str().unwrap()]);
    let (_, e) = text(&out);
    assert!(!out.status.success());
    assert!(
        e.to_lowercase().contains("pcapng"),
        "the error should say the file is pcapng (and how to convert it):\n{e}"
    );
}

/// RoCE runs on VLANs (PFC needs the 802.1Q priority): tagged frames are decoded.
#[test]
fn trace_decodes_vlan_tagged_roce_frames() {
    let (_, bytes) = capture("plain.pcap");
    let plain = records(&bytes);
    assert!(!plain.is_empty());
    let mut tagged = bytes[..24].to_vec();
    for (mut h, data) in plain.iter().cloned() {
        let len = (data.len() + 4) as u32;
        h[8..12].copy_from_slice(&len.to_le_bytes());
        h[12..16].copy_from_slice(&len.to_le_bytes());
        tagged.extend_from_slice(&h);
        tagged.extend_from_slice(&data[..12]);
        tagged.extend_from_slice(&[0x81, 0x00, 0x60, 0x64]); // 802.1Q, PCP 3, VLAN 100
        tagged.extend_from_slice(&data[12..]);
    }
    let path = tmp("vlan.pcap");
    std::fs::write(&path, &tagged).unwrap();
    let out = softhca(&["trace", path.to_str().unwrap()]);
    let (o, e) = text(&out);
    assert!(out.status.success(), "{o}\n{e}");
    let want = format!("{} RoCEv2 packets, 0 other records", plain.len());
    assert!(o.contains(&want), "want {want:?}:\n{o}");
}

/// A capture cut inside its last record (tcpdump or `softhca perf --pcap` killed) still shows
/// the records before it.
#[test]
fn trace_shows_the_records_before_a_truncated_one() {
    let (_, bytes) = capture("whole.pcap");
    let n = records(&bytes).len();
    let path = tmp("cut.pcap");
    std::fs::write(&path, &bytes[..bytes.len() - 5]).unwrap();
    let out = softhca(&["trace", path.to_str().unwrap()]);
    let (o, e) = text(&out);
    assert!(!e.contains("panicked"), "{e}");
    assert!(
        o.contains(&format!("{} RoCEv2 packets", n - 1)),
        "the {} whole records should be shown:\nstdout:\n{o}\nstderr:\n{e}",
        n - 1
    );
}

// ---------------------------------------------------------------------------------------
// The TCP side channel

/// A peer that answers the QP information with garbage: the error says it came from the peer.
#[test]
fn pingpong_garbage_from_the_peer_is_named_as_such() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port().to_string();
    let peer = std::thread::spawn(move || {
        let (s, _) = listener.accept().unwrap();
        let mut r = BufReader::new(s.try_clone().unwrap());
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        (&s).write_all(b"HTTP/1.1 400 Bad Request\r\n").unwrap();
        // Hold the connection until the client leaves.
        let _ = r.read_to_end(&mut Vec::new());
    });
    let out = softhca(&["pingpong", "--link", "udp", "--connect", "127.0.0.1", "--port", &port]);
    peer.join().unwrap();
    let (_, e) = text(&out);
    assert_clean_error(&["pingpong"], &out);
    let lower = e.to_lowercase();
    assert!(
        lower.contains("peer") || lower.contains("server"),
        "the error should say the peer sent something bad:\n{e}"
    );
}

/// A peer that accepts the connection and then says nothing: the client gives up after
/// SOFTHCA_WAIT_SECS (here 1). The 60 s below only turns a hang into a failure.
#[test]
fn pingpong_does_not_wait_forever_for_a_silent_peer() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port().to_string();
    let peer = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let _ = s.read_to_end(&mut Vec::new()); // until the client is gone
    });
    let mut child = Command::new(BIN)
        .args(["pingpong", "--link", "udp", "--connect", "127.0.0.1", "--port", &port])
        .env("SOFTHCA_WAIT_SECS", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut e = String::new();
        let _ = child.stderr.take().unwrap().read_to_string(&mut e);
        let _ = tx.send((child.wait().unwrap(), e));
    });
    match rx.recv_timeout(std::time::Duration::from_secs(60)) {
        Ok((status, e)) => {
            assert_eq!(status.code(), Some(1), "{e}");
            assert!(e.contains("softhca: error:"), "{e}");
        }
        Err(_) => {
            let _ = Command::new("kill").arg("-9").arg(pid.to_string()).status();
            let _ = peer.join();
            panic!("softhca pingpong --connect still waiting on a silent peer after 60 s (SOFTHCA_WAIT_SECS=1)");
        }
    }
    peer.join().unwrap();
}

/// Both ends must be given the same --qp, --size, --iters and --mtu: the exchange carries
/// them, so a mismatch is named up front on both sides.
#[test]
fn pingpong_udp_names_a_size_mismatch() {
    let port = free_port().to_string();
    let server = Command::new(BIN)
        .args(["pingpong", "--link", "udp", "--server", "--port", &port, "--size", "64", "--iters", "10"])
        .env("SOFTHCA_WAIT_SECS", "5")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let client = softhca(&[
        "pingpong",
        "--link",
        "udp",
        "--connect",
        "127.0.0.1",
        "--port",
        &port,
        "--size",
        "4096",
        "--iters",
        "10",
    ]);
    let server = server.wait_with_output().unwrap();
    let (_, ce) = text(&client);
    let (_, se) = text(&server);
    assert!(!client.status.success() || !server.status.success());
    assert!(
        ce.contains("--size") || se.contains("--size"),
        "neither end says the sizes differ:\nclient: {ce}\nserver: {se}"
    );
}

/// A peer reporting counters near u64::MAX: the client adds them without overflowing. A proxy
/// between a real client and server rewrites the server's Report.
#[test]
fn perf_client_survives_a_report_with_huge_counters() {
    let server_port = free_port();
    let proxy = TcpListener::bind("127.0.0.1:0").unwrap();
    let proxy_port = proxy.local_addr().unwrap().port().to_string();
    let mut server = Command::new(BIN)
        .args(["perf", "write", "--link", "udp", "--server", "--port", &server_port.to_string(), "--json"])
        .env("SOFTHCA_WAIT_SECS", "5")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let relay = std::thread::spawn(move || {
        let (c, _) = proxy.accept().unwrap();
        let s = loop {
            match TcpStream::connect(("127.0.0.1", server_port)) {
                Ok(s) => break s,
                Err(_) => std::thread::yield_now(),
            }
        };
        let (mut cr, mut cw) = (BufReader::new(c.try_clone().unwrap()), c);
        let (mut sr, mut sw) = (BufReader::new(s.try_clone().unwrap()), s);
        let mut rewritten = false;
        loop {
            let mut line = String::new();
            if cr.read_line(&mut line).unwrap_or(0) == 0 || sw.write_all(line.as_bytes()).is_err() {
                break;
            }
            let mut line = String::new();
            if sr.read_line(&mut line).unwrap_or(0) == 0 {
                break;
            }
            if let Ok(mut v) = serde_json::from_str::<Value>(line.trim_end()) {
                if v.get("data_verified").is_some() && v.get("bw_gbps").is_none() {
                    v["device"]["tx_packets"] = Value::from(u64::MAX);
                    line = format!("{v}\n");
                    rewritten = true;
                }
            }
            if cw.write_all(line.as_bytes()).is_err() {
                break;
            }
        }
        rewritten
    });
    let client = Command::new(BIN)
        .args(["perf", "write", "--link", "udp", "--connect", "127.0.0.1", "--port", &proxy_port])
        .args(["--iters", "10", "--size", "64", "--json"])
        .env("SOFTHCA_WAIT_SECS", "5")
        .output()
        .unwrap();
    let rewritten = relay.join().unwrap();
    let _ = server.kill();
    let _ = server.wait();
    assert!(rewritten, "the proxy never saw the server's Report: {:?}", text(&client));
    let (_, e) = text(&client);
    assert!(!e.contains("panicked"), "a peer's counters made the client panic:\n{e}");
    assert_ne!(client.status.code(), Some(101), "{e}");
}

/// The demo checks its --loss before running anything.
#[test]
fn demo_refuses_a_bad_loss_up_front() {
    for loss in ["2", "NaN", "1.5"] {
        let out = Command::new(env!("CARGO_BIN_EXE_softhca")).args(["demo", "--loss", loss]).output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(!out.status.success(), "--loss {loss} accepted");
        assert!(String::from_utf8_lossy(&out.stderr).contains("--loss must be a probability"), "--loss {loss}");
        assert!(!stdout.contains("1. "), "--loss {loss}: a phase ran before the check:\n{stdout}");
    }
}

/// `--connect` with a name that does not resolve, or with a port glued on, is an error at once
/// that says what is wrong, not ten seconds of retries.
#[test]
fn connect_names_an_unresolvable_host_and_a_glued_port() {
    let out = softhca(&["pingpong", "--link", "udp", "--connect", "no.such.host.invalid"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot resolve no.such.host.invalid"));
    let out = softhca(&["pingpong", "--link", "udp", "--connect", "127.0.0.1:9000"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("give the port with --port"));
}

// ---------------------------------------------------------------------------------------
// From a new user's pass over the README and the help (2026-12-01)

/// Out-of-range queue depths are refused, not quietly clamped: `--depth 0` had run a latency
/// test under a bandwidth command, `--rx-depth 5000` past the "at most 4096" its help states.
#[test]
fn depths_out_of_range_are_errors() {
    for args in [
        &["perf", "write", "--depth", "0"][..],
        &["perf", "write", "--depth", "4097"],
        &["pingpong", "--rx-depth", "0"],
        &["pingpong", "--rx-depth", "5000"],
    ] {
        let out = softhca(args);
        assert_clean_error(args, &out);
        assert!(text(&out).1.contains("depth must be in 1..=4096"), "{args:?}: {:?}", text(&out));
    }
}

/// A client on another link than its server's is refused by the server, naming both links,
/// by perf and by pingpong alike. Before, perf ran, every packet went where nobody read, and
/// the client ended in retry-exceeded errors.
#[test]
fn a_client_on_another_link_is_refused() {
    let port = free_port().to_string();
    let spawn = |args: &[&str]| {
        Command::new(BIN)
            .args(args)
            .env("SOFTHCA_WAIT_SECS", "5")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let server = spawn(&["perf", "write", "--link", "udp", "--server", "--port", &port]);
    let client = softhca(&["perf", "write", "--link", "shm", "--connect", "127.0.0.1", "--port", &port, "-n", "50"]);
    let server = server.wait_with_output().unwrap();
    let (_, ce) = text(&client);
    assert!(!client.status.success() && !server.status.success());
    assert!(ce.contains("the client is on --link shm, this server on --link udp"), "{ce}");
    let port = free_port().to_string();
    let server = spawn(&["pingpong", "--link", "udp", "--server", "--port", &port, "--iters", "10"]);
    let client = softhca(&["pingpong", "--link", "shm", "--connect", "127.0.0.1", "--port", &port, "--iters", "10"]);
    let server = server.wait_with_output().unwrap();
    assert!(!client.status.success() && !server.status.success());
    let (_, ce) = text(&client);
    assert!(ce.contains("--link udp") && ce.contains("--link shm"), "{ce}");
}

/// `--port 0`: the server listens on a port the system picks and says which (it said 0).
#[test]
fn a_server_on_port_0_prints_the_port_it_listens_on() {
    let mut server = Command::new(BIN)
        .args(["perf", "write", "--link", "udp", "--server", "--port", "0"])
        .env("SOFTHCA_WAIT_SECS", "5")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(server.stderr.take().unwrap()).read_line(&mut line).unwrap();
    let port: u16 = line.trim().rsplit(' ').next().unwrap().parse().unwrap_or(0);
    assert!(port != 0 && line.contains("waiting for a client on TCP port"), "{line}");
    let client = softhca(&["perf", "write", "--link", "udp", "--connect", "127.0.0.1", "--port", &port.to_string()]);
    assert!(client.status.success(), "{:?}", text(&client));
    assert!(server.wait().unwrap().success());
}

/// A reader that leaves (`softhca demo | head -1`) ends the program quietly, by SIGPIPE as
/// any Unix filter ends, not with a panic printing to a closed pipe.
#[test]
fn a_closed_pipe_ends_the_program_quietly() {
    let mut child = Command::new(BIN).args(["demo"]).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let mut first = String::new();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    out.read_line(&mut first).unwrap();
    drop(out);
    let mut err = String::new();
    child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    let status = child.wait().unwrap();
    assert!(first.starts_with("softhca demo"), "{first}");
    assert!(!err.contains("panicked"), "{err}");
    use std::os::unix::process::ExitStatusExt;
    const SIGPIPE: i32 = 13;
    assert!(status.success() || status.signal() == Some(SIGPIPE), "{status}");
}
