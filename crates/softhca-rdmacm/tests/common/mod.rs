//! Helpers for the tests that run programs on the drop-in `librdmacm.so.1`: linking it and
//! the libraries beside it (`libibverbs.so.1`, `libmlx5.so.1`, `libefa.so.1`) from the static
//! libraries cargo builds beside the tests, as `scripts/build-libibverbs` does; compiling
//! `tests/c/*.c`; running two processes with a hang guard.
#![allow(dead_code)]

#[path = "../../../softhca-ibverbs/tests/common/procs.rs"]
mod procs;
pub use procs::*;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Mutex, OnceLock};

pub fn scratch() -> PathBuf {
    let d = std::env::temp_dir().join(format!("softhca-rdmacm-tests-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The newest `lib<crate>-*.a` (or `lib<crate>.a`) beside the test executable.
fn archive(krate: &str) -> PathBuf {
    let deps = std::env::current_exe().unwrap().parent().unwrap().to_path_buf();
    let hashed = format!("lib{krate}-");
    let plain = format!("lib{krate}.a");
    [deps.clone(), deps.parent().unwrap().to_path_buf()]
        .iter()
        .flat_map(|d| std::fs::read_dir(d).unwrap().filter_map(|e| e.ok().map(|e| e.path())))
        .filter(|p| {
            let n = p.file_name().unwrap().to_string_lossy();
            (n.starts_with(&hashed) && n.ends_with(".a")) || n == plain
        })
        .max_by_key(|p| p.metadata().and_then(|m| m.modified()).ok())
        .unwrap_or_else(|| panic!("cargo builds lib{krate}*.a beside the tests"))
}

fn link(out: &Path, soname: &str, map: &Path, pre: &[&str], archive: &Path, post: &[String]) {
    let res = Command::new("cc")
        .args(["-shared", "-o"])
        .arg(out)
        .arg(format!("-Wl,-soname,{soname}"))
        .arg(format!("-Wl,--version-script={}", map.display()))
        .args(pre)
        .arg("-Wl,--whole-archive")
        .arg(archive)
        .arg("-Wl,--no-whole-archive")
        .args(post)
        .args(["-lgcc_s", "-lutil", "-lrt", "-lpthread", "-lm", "-ldl", "-lc"])
        .output()
        .unwrap();
    assert!(res.status.success(), "linking {soname}: {}", String::from_utf8_lossy(&res.stderr));
}

/// A directory with the four drop-in libraries; once per test process.
pub fn libs() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let crates = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let dir = scratch().join("lib");
        std::fs::create_dir_all(&dir).unwrap();
        let verbs = crates.join("softhca-ibverbs/libibverbs.map");
        let crc_text = format!("-Wl,-T,{}", crates.join("softhca-ibverbs/crc-text.ld").display());
        link(&dir.join("libibverbs.so.1"), "libibverbs.so.1", &verbs, &[&crc_text], &archive("softhca_ibverbs"), &[]);
        let vendor = crates.join("softhca-vendor");
        let compat = vendor.join("mlx5_compat.c");
        let compat = compat.to_str().unwrap();
        link(
            &dir.join("libmlx5.so.1"),
            "libmlx5.so.1",
            &vendor.join("libmlx5.map"),
            &[compat],
            &archive("softhca_vendor"),
            &[],
        );
        link(&dir.join("libefa.so.1"), "libefa.so.1", &vendor.join("libefa.map"), &[], &archive("softhca_vendor"), &[]);
        let map = crates.join("softhca-rdmacm/librdmacm.map");
        let post = [format!("-L{}", dir.display()), "-Wl,--no-as-needed".into(), "-l:libibverbs.so.1".into()];
        link(
            &dir.join("librdmacm.so.1"),
            "librdmacm.so.1",
            &map,
            &["-Wl,--gc-sections"],
            &archive("softhca_rdmacm"),
            &post,
        );
        dir
    })
}

pub fn ready() -> bool {
    tool("cc") && have(Path::new("/usr/include/rdma/rdma_cma.h").exists(), "rdma/rdma_cma.h (librdmacm-dev)")
}

/// Compiles `tests/c/<name>.c` against the system's headers, once per test process.
pub fn compile(name: &str) -> PathBuf {
    static BUILT: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    let exe = scratch().join(name);
    if !built.iter().any(|n| n == name) {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c").join(format!("{name}.c"));
        let out = Command::new("cc")
            .args(["-O1", "-Wall", "-o"])
            .arg(&exe)
            .arg(&src)
            .args(["-lrdmacm", "-libverbs", "-lpthread"])
            .output()
            .unwrap();
        assert!(out.status.success(), "compiling {name}.c: {}", String::from_utf8_lossy(&out.stderr));
        built.push(name.to_string());
    }
    exe
}

/// `program args` on the drop-in libraries, piped.
pub fn command(program: impl AsRef<std::ffi::OsStr>, args: &[&str]) -> Command {
    let mut c = Command::new(program);
    c.args(args).env("LD_LIBRARY_PATH", libs()).stdout(Stdio::piped()).stderr(Stdio::piped());
    c
}

/// The child's output once it exits, and whether it had to be killed after `secs` (then the
/// output is what it wrote until then).
fn wait_or_kill(mut child: std::process::Child, secs: u64) -> (Output, bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    loop {
        if child.try_wait().unwrap().is_some() {
            return (child.wait_with_output().unwrap(), false);
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            return (child.wait_with_output().unwrap(), true);
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// A process of a two-process test: the program, its arguments, and the address its device
/// takes (`SOFTHCA_ADDR`: the tests run in parallel, each pair on addresses of its own).
pub struct Proc<'a> {
    pub program: &'a str,
    pub args: &'a [&'a str],
    pub addr: [u8; 4],
}

/// Runs a server and then its client as two processes; both must exit 0. The client starts
/// once the server listens: the server runs with `SOFTHCA_CM_DEBUG=1`, and its stderr's
/// `listening` line says so (a REQ before the listen is refused, as on Linux, unless the port
/// is bound already: then it waits for the listen, see `Cm::reserve`). Returns
/// (server output, client output).
///
/// A program that listens a second time (perftest's `-R` sets up its test QPs on a new
/// listener after its control connection) races its client's second REQ: one that comes
/// before that listen is refused (REJ reason 8, as Linux's CM answers it), and perftest 4.5's
/// client then gives up while its server waits for ever. Such a run (the client saw REJECTED
/// with status 8) is run again, at most 3 times; any other failure fails the test.
pub fn pair(server: Proc, client: Proc) -> (String, String) {
    pair_with(server, client, false, "listening on")
}

/// [`pair`] for a first process that does not listen: the second starts once the first's
/// CM debug output has a line with `ready` in it (the event it waits for, say).
pub fn pair_when(first: Proc, second: Proc, ready: &'static str) -> (String, String) {
    pair_with(first, second, false, ready)
}

/// [`pair`] with a server that serves on after its client (cmtime's): it is stopped once the
/// client is done, and only the client must exit 0.
pub fn pair_serving(server: Proc, client: Proc) -> (String, String) {
    pair_with(server, client, true, "listening on")
}

fn pair_with(server: Proc, client: Proc, serves_on: bool, ready: &'static str) -> (String, String) {
    // One pair at a time: a perftest bandwidth pair floods the loopback, and UD programs
    // (udaddy) lose what the kernel drops and wait for ever, as they would on Linux.
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    for attempt in 1..=3 {
        match try_pair(&server, &client, serves_on, ready) {
            Ok(out) => return out,
            Err(ct) if attempt < 3 && ct.contains("RDMA_CM_EVENT_REJECTED (status 8)") => continue,
            Err(report) => panic!("{report}"),
        }
    }
    unreachable!()
}

fn try_pair(server: &Proc, client: &Proc, serves_on: bool, ready: &'static str) -> Result<(String, String), String> {
    use std::io::BufRead;
    let ip = |a: [u8; 4]| format!("{}.{}.{}.{}", a[0], a[1], a[2], a[3]);
    let mut s = command(server.program, server.args);
    let mut s = s.env("SOFTHCA_ADDR", ip(server.addr)).env("SOFTHCA_CM_DEBUG", "1").spawn().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let stderr = s.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut all = String::new();
        for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.contains("softhca-cm:") && line.contains(ready) {
                let _ = tx.send(());
            }
            all.push_str(&line);
            all.push('\n');
        }
        all
    });
    // A hang guard only: the line comes as soon as the program listens.
    let listening = rx.recv_timeout(std::time::Duration::from_secs(30)).is_ok();
    let mut c = command(client.program, client.args);
    let c = c.env("SOFTHCA_ADDR", ip(client.addr)).env("SOFTHCA_CM_DEBUG", "1");
    // Hang guards only: wait for the client, then the server (not at all once the client
    // failed); a hang kills both and shows what each said.
    let c = listening.then(|| wait_or_kill(c.spawn().unwrap(), 60));
    let client_ok = c.as_ref().is_some_and(|(c, hung)| !hung && c.status.success());
    let (s, s_hung) = wait_or_kill(s, if client_ok && !serves_on { 60 } else { 0 });
    let (s_hung, s_ok) = if serves_on { (false, true) } else { (s_hung, s.status.success()) };
    let st = format!("{}{}", String::from_utf8_lossy(&s.stdout), reader.join().unwrap());
    let Some((c, c_hung)) = c else { return Err(format!("{} never listened:\n{st}", server.program)) };
    let ct = text(&c);
    if c_hung || s_hung || !c.status.success() || !s_ok {
        return Err(format!(
            "{} ({}{}) / {} ({}{}):\nclient:\n{ct}\nserver:\n{st}",
            client.program,
            c.status,
            if c_hung { ", hung" } else { "" },
            server.program,
            s.status,
            if s_hung { ", hung" } else { "" }
        ));
    }
    Ok((st, ct))
}
