//! rsockets (`<rdma/rsocket.h>`) on the drop-in librdmacm.so.1: the C API's answers in one
//! process (`tests/c/rsocket_edges.c`), and Debian's rdmacm-utils programs built on it, two
//! processes each: rstream in its modes (blocking, non-blocking, asynchronous, verified data, keep-alive,
//! `rdma_getaddrinfo`) and rcopy copying a file.

mod common;

use common::*;

#[test]
fn rsocket_edges() {
    if !ready() {
        return;
    }
    let exe = compile("rsocket_edges");
    let out = finish(command(&exe, &[]).env("SOFTHCA_ADDR", "127.0.0.71").spawn().unwrap(), 60, "rsocket_edges");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && text.contains("rsocket_edges: ok"), "{}:\n{text}", out.status);
}

/// `program`'s server and client (rdmacm-utils' `-b ADDR` / `-s ADDR`) with `extra` options
/// on both, over `link` (through `env`: `pair` sets only the address); both must finish.
/// Returns (server output, client output), or None if the program is not installed.
fn both_sides(program: &str, addr: [u8; 2], link: &str, extra: &[&str]) -> Option<(String, String)> {
    if !(ready() && tool(program)) {
        return None;
    }
    let sa = format!("127.0.0.{}", addr[0]);
    let args = |side: &str| -> Vec<String> {
        [format!("SOFTHCA_LINK={link}"), program.to_string(), side.to_string(), sa.clone()]
            .into_iter()
            .chain(extra.iter().map(|a| a.to_string()))
            .collect()
    };
    let (s, c) = (args("-b"), args("-s"));
    let s: Vec<&str> = s.iter().map(String::as_str).collect();
    let c: Vec<&str> = c.iter().map(String::as_str).collect();
    Some(pair(
        Proc { program: "env", args: &s, addr: [127, 0, 0, addr[0]] },
        Proc { program: "env", args: &c, addr: [127, 0, 0, addr[1]] },
    ))
}

/// rstream with `extra` on both sides: both print their figures for `name`.
fn rstream(addr: [u8; 2], extra: &[&str], name: &str) {
    let Some((s, c)) = both_sides("rstream", addr, "udp", extra) else { return };
    assert!(c.lines().any(|l| l.starts_with(name)), "client:\n{c}\nserver:\n{s}");
    assert!(s.lines().any(|l| l.starts_with(name)), "client:\n{c}\nserver:\n{s}");
}

/// rstream's default run: latency and bandwidth tests from 64 bytes to 1 MiB, each way.
#[test]
fn rstream_all_sizes() {
    rstream([72, 73], &[], "1m_bw");
}

/// Every byte checked (`-T v`), in transfers of 100,000 bytes: larger than half the receive
/// buffer, so each spans buffer offers and wraps.
#[test]
fn rstream_verifies_data() {
    rstream([74, 75], &["-T", "v", "-S", "100000", "-C", "100"], "custom");
}

/// Blocking calls with MSG_WAITALL (`-T b`), and rsockets made by rdma_getaddrinfo (`-T r`).
#[test]
fn rstream_blocking_and_resolved() {
    rstream([76, 77], &["-T", "b", "-S", "10000", "-C", "200"], "custom");
    rstream([76, 77], &["-T", "r", "-S", "4096", "-C", "200"], "custom");
}

/// Non-blocking sockets (`-T n`: rfcntl O_NONBLOCK, EAGAIN retried) and keep-alive (`-k`:
/// SO_KEEPALIVE, TCP_KEEPIDLE set and read back).
#[test]
fn rstream_nonblocking_and_keepalive() {
    rstream([78, 79], &["-T", "n", "-S", "65536", "-C", "200"], "custom");
    rstream([78, 79], &["-k", "-S", "1000", "-C", "100"], "custom");
}

/// Asynchronous calls (`-T a`: rpoll with a timeout of 0 before each call, non-blocking
/// sockets). rstream takes POLLHUP for an error: the server's last transfer and its
/// disconnect arrive in one engine turn, and the hang-up must wait until that data is read.
#[test]
fn rstream_async() {
    rstream([90, 91], &["-T", "a", "-S", "100000", "-C", "50"], "custom");
}

/// rcopy: a client sends a 3 MB file to the server's rcopy, which writes it where told.
#[test]
fn rcopy_copies_a_file() {
    if !(ready() && tool("rcopy")) {
        return;
    }
    let dir = scratch();
    let (src, dst) = (dir.join("rcopy.src"), dir.join("rcopy.dst"));
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    std::fs::write(&src, &data).unwrap();
    let _ = std::fs::remove_file(&dst);
    let target = format!("127.0.0.80:{}", dst.display());
    let (_, c) = pair_serving(
        Proc { program: "rcopy", args: &["-p", "7481"], addr: [127, 0, 0, 80] },
        Proc { program: "rcopy", args: &[src.to_str().unwrap(), &target, "-p", "7481"], addr: [127, 0, 0, 81] },
    );
    assert!(c.contains("done"), "{c}");
    assert!(std::fs::read(&dst).unwrap() == data, "the copy differs");
}

/// riostream: each side maps its buffer (`riomap`) and the other writes into it with
/// `riowrite` (RDMA Writes, no message), then polls the buffer's last byte for the peer's
/// marker and answers by writing its own into that same byte. `extra` on both sides.
fn riostream(addr: [u8; 2], link: &str, extra: &[&str]) {
    let Some((s, c)) = both_sides("riostream", addr, link, extra) else { return };
    assert!(c.lines().any(|l| l.starts_with("custom")), "client:\n{c}\nserver:\n{s}");
}

/// 2,000 round trips of a 64-byte buffer, each side polling the last byte the other wrote:
/// the delivery of a Write stored some of its last bytes twice (glibc's memcpy), and a side
/// that had seen its peer's marker and written its own answer there had it overwritten when
/// its engine thread was preempted between the two stores: riostream hung after a few hundred
/// to a few thousand round trips, on both links.
#[test]
fn riostream_polls_the_last_byte() {
    riostream([82, 83], "udp", &["-S", "64", "-C", "1", "-I", "2000"]);
}

/// The same over the shared-memory link, whose doorbell to a peer that had exited while
/// asleep raised SIGPIPE, which killed the other program (a C program's default action).
#[test]
fn riostream_over_shared_memory() {
    riostream([84, 85], "shm", &["-S", "64", "-C", "1", "-I", "500"]);
    riostream([84, 85], "shm", &["-S", "100000", "-C", "100", "-T", "v"]);
}

/// Verified data in transfers larger than the receive buffer's half (riomap'd buffers,
/// riowrite in 64 KiB pieces).
#[test]
fn riostream_verifies_large_transfers() {
    riostream([86, 87], "udp", &["-S", "100000", "-C", "100", "-T", "v"]);
}

/// librdmacm's `librspreload.so` (Debian's librdmacm1), preloaded into a plain TCP program
/// (`tests/c/tcp_echo.c`: socket, bind, listen, accept, connect, send, recv, poll): its
/// sockets are rsockets on the drop-in, 4 MB echoed and checked, and the device's counters
/// show the bytes went as RoCE packets. softhca's own UDP sockets are made with the system
/// call itself, not libc's `socket`, which the preload library takes over: before that,
/// opening the device for the first rsocket waited for itself.
#[test]
fn a_tcp_program_runs_over_rsockets_with_librspreload() {
    let preload = "/usr/lib/x86_64-linux-gnu/rsocket/librspreload.so";
    if !(ready() && have(std::path::Path::new(preload).exists(), "librspreload.so (librdmacm1)")) {
        return;
    }
    let exe = compile("tcp_echo");
    let exe = exe.to_str().unwrap();
    let pre = format!("LD_PRELOAD={preload}");
    let (s, c) = pair(
        Proc { program: "env", args: &[&pre, exe, "s", "127.0.0.88", "7688"], addr: [127, 0, 0, 88] },
        Proc {
            program: "env",
            args: &[&pre, "SOFTHCA_STATS=1", exe, "c", "127.0.0.88", "7688", "4000000"],
            addr: [127, 0, 0, 89],
        },
    );
    assert!(c.contains("tcp_echo: ok") && s.contains("echoed 4000000 bytes"), "client:\n{c}\nserver:\n{s}");
    let sent = c
        .split("tx_packets: ")
        .nth(1)
        .and_then(|t| t.split(|ch: char| !ch.is_ascii_digit()).next())
        .and_then(|n| n.parse::<u64>().ok());
    assert!(sent.is_some_and(|n| n > 1000), "the client's device sent {sent:?} packets:\n{c}");
}
