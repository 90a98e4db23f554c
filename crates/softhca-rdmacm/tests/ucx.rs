//! UCX on the drop-in libraries: Debian's UCX 1.13 (ucx-utils), unmodified, as two processes,
//! with its InfiniBand transports on softhca0 (`UCX_TLS=rc_verbs,ud_verbs`): `ucx_perftest`
//! (tag matching and RMA put) and `io_demo` with its data-integrity check (`-q`), reads and
//! writes from 1 B to 1 MiB; and Debian's Open MPI 4.1 on UCX (`--mca pml ucx --mca osc
//! ucx`), two ranks running `tests/c/mpi_check.c`. Each over UDP and the shared-memory link.
//!
//! UCX takes an IB device only if `/dev/infiniband/<ibv_device.dev_name>` is an accessible
//! character device (uct_ib_device_is_accessible); a user-space HCA has none, so the test
//! makes that entry a link to /dev/null for its run (as README "UCX" tells a user to do once,
//! as root), and removes it after if it made it. Where that is refused (not root), the test
//! says so and passes, as the namespace tests do.
//!
//! What it caught: UCX's RoCE address handles carry `flow_label = ~0` (for rdma-core's flow
//! label to UDP source port conversion), which `ibv_create_ah` refused as wider than 20 bits
//! (Linux takes it); and UCX's ud_verbs finds a UD packet's destination address in the GRH
//! area by the RoCE packet type ConnectX reports in `wc.sl`, dropping every packet without it.

mod common;

use common::*;
use std::path::Path;
use std::process::{Child, Output};
use std::sync::Mutex;

/// The tests here take turns: each makes the device entry for its run and removes it after.
static TURN: Mutex<()> = Mutex::new(());

/// The device entry UCX looks for, a link to /dev/null while it lives (if it made it).
struct DevEntry {
    made: Vec<&'static Path>,
}

impl DevEntry {
    const DIR: &'static str = "/dev/infiniband";
    const ENTRY: &'static str = "/dev/infiniband/uverbs-softhca0";

    /// `None` when the entry is missing and cannot be made (not root).
    fn make() -> Option<DevEntry> {
        let mut made = Vec::new();
        if !Path::new(Self::DIR).exists() {
            std::fs::create_dir(Self::DIR).ok()?;
            made.push(Path::new(Self::DIR));
        }
        if std::fs::metadata(Self::ENTRY).is_err() {
            if std::os::unix::fs::symlink("/dev/null", Self::ENTRY).is_err() {
                drop(DevEntry { made });
                return None;
            }
            made.insert(0, Path::new(Self::ENTRY));
        }
        Some(DevEntry { made })
    }
}

impl Drop for DevEntry {
    fn drop(&mut self) {
        for p in &self.made {
            let _ = std::fs::remove_file(p).or_else(|_| std::fs::remove_dir(p));
        }
    }
}

/// This test's turn with the device entry made, or `None` (said so) where it cannot be made.
/// The entry comes first: a tuple drops its fields in order, so the entry is gone before the
/// next test takes its turn (the other way round, that test found the entry, made none, and
/// lost it to this one's removal midway).
fn turn_with_entry() -> Option<(DevEntry, std::sync::MutexGuard<'static, ()>)> {
    let turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let Some(entry) = DevEntry::make() else {
        eprintln!("SKIPPED: {} cannot be made here (not root)", DevEntry::ENTRY);
        return None;
    };
    Some((entry, turn))
}

/// The client must exit 0, and the server too unless it `serves_on` (io_demo's server runs
/// until it is stopped: it is stopped once its client is done); returns the client's output.
fn both(what: &str, mut server: Child, client: Child, serves_on: bool) -> String {
    let text = |o: &Output| format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    let c = finish(client, 120, &format!("{what} client"));
    if serves_on {
        let _ = server.kill();
    }
    let s = finish(server, 30, &format!("{what} server"));
    let (st, ct) = (text(&s), text(&c));
    let server_ok = serves_on || s.status.success();
    assert!(c.status.success() && server_ok, "{what}: client {}, server {}:\n{ct}\n---\n{st}", c.status, s.status);
    ct
}

/// A UCX program on the drop-in libraries, its device on `addr`, UCX on softhca0 only.
fn ucx(program: &str, args: &[&str], addr: &str, link: &str) -> std::process::Command {
    let mut c = command(program, args);
    c.env("SOFTHCA_ADDR", addr)
        .env("SOFTHCA_LINK", link)
        .env("UCX_NET_DEVICES", "softhca0:1")
        .env("UCX_TLS", "rc_verbs,ud_verbs,self")
        .env("UCX_WARN_UNUSED_ENV_VARS", "n");
    c
}

#[test]
fn ucx_perftest_and_io_demo_over_rc_and_ud_verbs() {
    if !(ready() && tool("ucx_perftest") && tool("io_demo")) {
        return;
    }
    let Some(_entry) = turn_with_entry() else { return };
    let (sa, ca) = ("127.0.0.81", "127.0.0.82");
    // Below the ephemeral range (32768-60999): a port there can be taken at any moment as
    // the source port of another program's connection (ucx_perftest's bind failed once so,
    // with Open MPI running beside it).
    let mut port = 29621u16;
    for link in ["udp", "shm"] {
        // ucx_perftest: the UD transport alone (every packet through the GRH-area check), then
        // RC for the data with UD for the wire-up: tag matching, RMA put, and RMA get and
        // atomics (RDMA Read and Fetch & Add, which a target that does not poll answers)
        // with the devices busy-polling.
        for (tls, busy, test) in [
            ("ud_verbs,self", "0", &["-t", "tag_lat", "-s", "8", "-n", "2000"][..]),
            ("rc_verbs,ud_verbs,self", "0", &["-t", "tag_bw", "-s", "65536", "-n", "500"][..]),
            ("rc_verbs,ud_verbs,self", "0", &["-t", "ucp_put_bw", "-s", "65536", "-n", "500"][..]),
            ("rc_verbs,ud_verbs,self", "1", &["-t", "ucp_get", "-s", "65536", "-n", "500"][..]),
            ("rc_verbs,ud_verbs,self", "1", &["-t", "ucp_fadd", "-n", "500"][..]),
        ] {
            port += 1;
            let p = port.to_string();
            let what = format!("ucx_perftest {} over {link} ({tls})", test[1]);
            let env = [("UCX_TLS", tls), ("SOFTHCA_BUSY_POLL", busy)];
            let mut s = ucx("ucx_perftest", &["-p", &p], sa, link).envs(env).spawn().unwrap();
            await_listening(&mut s, port, 30, &what);
            let mut c = ucx("ucx_perftest", &[&["-p", &p][..], test, &[sa]].concat(), ca, link);
            let out = both(&what, s, c.envs(env).spawn().unwrap(), false);
            assert!(out.lines().any(|l| l.starts_with("Final:")), "{what}: no result:\n{out}");
        }
        // io_demo: every read and write checked (-q), sizes 1 B to 1 MiB.
        port += 1;
        let p = port.to_string();
        let what = format!("io_demo -q over {link}");
        let mut s = ucx("io_demo", &["-p", &p, "-q", "-d", "1:1048576"], sa, link).spawn().unwrap();
        await_listening(&mut s, port, 30, &what);
        let args = ["-p", &p, "-q", "-d", "1:1048576", "-i", "400", "-o", "read,write", sa];
        let c = ucx("io_demo", &args, ca, link).spawn().unwrap();
        let out = both(&what, s, c, true);
        assert!(out.contains("Client exit with status 'OK'"), "{what}:\n{out}");
    }
}

/// Open MPI over UCX on softhca0, two ranks (an MPMD launch: each its own device address):
/// messages of 1 B to 4 MiB checked on both sides, an Allreduce, one-sided puts. Each rank's
/// device counters (`SOFTHCA_STATS=1`) must show the traffic went through softhca.
#[test]
fn open_mpi_over_ucx() {
    if !(ready() && tool("mpicc") && tool("mpirun")) {
        return;
    }
    let Some(_entry) = turn_with_entry() else { return };
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/mpi_check.c");
    let exe = scratch().join("mpi_check");
    let cc = std::process::Command::new("mpicc").args(["-O1", "-Wall", "-o"]).arg(&exe).arg(&src).output().unwrap();
    assert!(cc.status.success(), "mpicc: {}", String::from_utf8_lossy(&cc.stderr));
    let exe = exe.to_str().unwrap();
    for link in ["udp", "shm"] {
        // -x applies to the application context it is in: each rank gets the whole set.
        let env = |addr: &str| {
            ["LD_LIBRARY_PATH", &format!("SOFTHCA_LINK={link}"), "SOFTHCA_STATS=1", &format!("SOFTHCA_ADDR={addr}")]
                .into_iter()
                .chain(["UCX_NET_DEVICES=softhca0:1", "UCX_TLS=rc_verbs,ud_verbs,self", "UCX_WARN_UNUSED_ENV_VARS=n"])
                .flat_map(|v| ["-x".to_string(), v.to_string()])
                .collect::<Vec<_>>()
        };
        let mut args: Vec<String> =
            ["--allow-run-as-root", "--oversubscribe", "--mca", "pml", "ucx", "--mca", "osc", "ucx"]
                .into_iter()
                .chain(["--mca", "btl", "^openib,uct"])
                .map(String::from)
                .collect();
        for (i, addr) in ["127.0.0.83", "127.0.0.84"].into_iter().enumerate() {
            if i > 0 {
                args.push(":".into());
            }
            args.extend(["-np".to_string(), "1".to_string()]);
            args.extend(env(addr));
            args.push(exe.into());
        }
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = finish(command("mpirun", &argv).spawn().unwrap(), 120, &format!("mpirun over {link}"));
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success() && text.contains("mpi_check: ok (2 ranks, 0 bad)"), "mpirun over {link}:\n{text}");
        let carried = text
            .split("tx_packets: ")
            .skip(1)
            .filter_map(|t| t.split(',').next()?.parse::<u64>().ok())
            .filter(|&n| n > 1000)
            .count();
        assert!(carried >= 2, "mpirun over {link}: both ranks' devices should have carried the traffic:\n{text}");
    }
}
