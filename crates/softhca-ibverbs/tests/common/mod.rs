//! Helpers for the tests that run C programs against the drop-in library: what must be
//! installed, linking `libibverbs.so.1` from the crate's static library, compiling
//! `tests/c/*.c`, and waiting for child processes (with hang guards only).
#![allow(dead_code)]

mod procs;
pub use procs::*;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock};

pub fn verbs_header() -> bool {
    have(Path::new("/usr/include/infiniband/verbs.h").exists(), "infiniband/verbs.h (libibverbs-dev)")
}

pub fn ready() -> bool {
    tool("cc") && verbs_header()
}

pub fn scratch() -> PathBuf {
    let d = std::env::temp_dir().join(format!("softhca-ibverbs-tests-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Links the crate's static library into `libibverbs.so.1` with the version script, as
/// `scripts/build-libibverbs` does; once per test process.
pub fn library() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let deps = std::env::current_exe().unwrap().parent().unwrap().to_path_buf();
        let archive = std::fs::read_dir(&deps)
            .unwrap()
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                let n = p.file_name().unwrap().to_string_lossy();
                n.starts_with("libsofthca_ibverbs-") && n.ends_with(".a")
            })
            .max_by_key(|p| p.metadata().and_then(|m| m.modified()).ok())
            .expect("cargo builds libsofthca_ibverbs-*.a beside the tests");
        let dir = scratch().join("lib");
        std::fs::create_dir_all(&dir).unwrap();
        let map = Path::new(env!("CARGO_MANIFEST_DIR")).join("libibverbs.map");
        let crc_text = Path::new(env!("CARGO_MANIFEST_DIR")).join("crc-text.ld");
        let out = Command::new("cc")
            .args(["-shared", "-o"])
            .arg(dir.join("libibverbs.so.1"))
            .args(["-Wl,-soname,libibverbs.so.1"])
            .arg(format!("-Wl,--version-script={}", map.display()))
            .arg(format!("-Wl,-T,{}", crc_text.display()))
            .arg("-Wl,--whole-archive")
            .arg(&archive)
            .args(["-Wl,--no-whole-archive", "-lgcc_s", "-lutil", "-lrt", "-lpthread", "-lm", "-ldl", "-lc"])
            .output()
            .unwrap();
        assert!(out.status.success(), "linking libibverbs.so.1: {}", String::from_utf8_lossy(&out.stderr));
        dir
    })
}

/// Compiles `tests/c/<name>.c` against the system's verbs.h, once per test process (the
/// tests run in parallel and share the executables).
pub fn compile(name: &str) -> PathBuf {
    static BUILT: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    let exe = scratch().join(name);
    if !built.iter().any(|n| n == name) {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c").join(format!("{name}.c"));
        let out =
            Command::new("cc").args(["-O1", "-Wall", "-o"]).arg(&exe).arg(&src).arg("-libverbs").output().unwrap();
        assert!(out.status.success(), "compiling {name}.c: {}", String::from_utf8_lossy(&out.stderr));
        built.push(name.to_string());
    }
    exe
}

/// Runs `tests/c/<prog>.c` (with `arg`, if any) against the drop-in library; it must print
/// `<what>: ok` and exit 0.
pub fn run(prog: &str, arg: Option<&str>) {
    run_with(prog, arg, &[]);
}

/// [`run`] with environment variables set for the program.
pub fn run_with(prog: &str, arg: Option<&str>, env: &[(&str, &str)]) {
    let exe = compile(prog);
    let mut c = Command::new(&exe);
    c.env("LD_LIBRARY_PATH", library())
        .args(arg)
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let what = arg.unwrap_or(prog);
    let out = finish(c.spawn().unwrap(), 60, what);
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && text.contains(&format!("{what}: ok")), "{what} ({}):\n{text}", out.status);
}

/// `cmd` with `LD_LIBRARY_PATH` pointing at the drop-in library.
pub fn with_lib(cmd: &mut Command) -> &mut Command {
    cmd.env("LD_LIBRARY_PATH", library())
}
