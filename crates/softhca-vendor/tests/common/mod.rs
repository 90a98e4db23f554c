//! Helpers for the tests that link and load the vendor libraries: what must be installed,
//! linking `libmlx5.so.1` and `libefa.so.1` (and the drop-in `libibverbs.so.1`) from the
//! static libraries cargo builds beside the tests, as `scripts/build-libibverbs` does, and
//! reading export tables with `objdump`.
#![allow(dead_code)]

pub mod fake;
#[path = "../../../softhca-ibverbs/tests/common/procs.rs"]
mod procs;
pub use procs::*;

use std::collections::BTreeSet;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

fn scratch() -> PathBuf {
    let d = std::env::temp_dir().join(format!("softhca-vendor-tests-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The newest `lib<crate>-*.a` beside the test executable (cargo builds the static library
/// of this crate, and of the softhca-ibverbs dev-dependency, into the same directory).
fn archive(krate: &str) -> PathBuf {
    let deps = std::env::current_exe().unwrap().parent().unwrap().to_path_buf();
    let prefix = format!("lib{krate}-");
    std::fs::read_dir(&deps)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let n = p.file_name().unwrap().to_string_lossy();
            n.starts_with(&prefix) && n.ends_with(".a")
        })
        .max_by_key(|p| p.metadata().and_then(|m| m.modified()).ok())
        .unwrap_or_else(|| panic!("cargo builds {prefix}*.a beside the tests"))
}

/// `cc -shared` of a whole static library (and `extra` sources) with a soname and a version
/// script, as `scripts/build-libibverbs` links each library.
fn link(out: &Path, soname: &str, map: &Path, extra: &[PathBuf], archive: &Path) {
    let res = Command::new("cc")
        .args(["-shared", "-o"])
        .arg(out)
        .arg(format!("-Wl,-soname,{soname}"))
        .arg(format!("-Wl,--version-script={}", map.display()))
        .args(extra)
        .arg("-Wl,--whole-archive")
        .arg(archive)
        .args(["-Wl,--no-whole-archive", "-lgcc_s", "-lutil", "-lrt", "-lpthread", "-lm", "-ldl", "-lc"])
        .output()
        .unwrap();
    assert!(res.status.success(), "linking {soname}: {}", String::from_utf8_lossy(&res.stderr));
}

fn manifest() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// A directory holding `libmlx5.so.1` and `libefa.so.1` linked from this crate's archive;
/// once per test process.
pub fn vendor_libs() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = scratch().join("vendor");
        std::fs::create_dir_all(&dir).unwrap();
        let a = archive("softhca_vendor");
        let m = manifest();
        link(&dir.join("libmlx5.so.1"), "libmlx5.so.1", &m.join("libmlx5.map"), &[m.join("mlx5_compat.c")], &a);
        link(&dir.join("libefa.so.1"), "libefa.so.1", &m.join("libefa.map"), &[], &a);
        dir
    })
}

/// A directory holding the drop-in `libibverbs.so.1` (from softhca-ibverbs' archive and
/// version script) beside the two vendor libraries: what `scripts/build-libibverbs` puts in
/// `target/release/ibverbs`. Once per test process.
pub fn all_libs() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = scratch().join("all");
        std::fs::create_dir_all(&dir).unwrap();
        for lib in ["libmlx5.so.1", "libefa.so.1"] {
            std::fs::copy(vendor_libs().join(lib), dir.join(lib)).unwrap();
        }
        let map = manifest().join("../softhca-ibverbs/libibverbs.map");
        let crc_text = PathBuf::from(format!("-Wl,-T,{}", manifest().join("../softhca-ibverbs/crc-text.ld").display()));
        link(&dir.join("libibverbs.so.1"), "libibverbs.so.1", &map, &[crc_text], &archive("softhca_ibverbs"));
        dir
    })
}

/// One row of `objdump -T`: a defined symbol (version, name, hidden) or an import (version,
/// name). objdump writes a hidden (non-default) version, and every import's, in parentheses.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Sym {
    pub version: String,
    pub name: String,
    pub hidden: bool,
}

/// The dynamic symbols of `file` whose version starts with one of `families`: the defined
/// functions, or with `imports` the undefined ones.
pub fn dynsyms(file: &Path, families: &[&str], imports: bool) -> BTreeSet<Sym> {
    let out = Command::new("objdump").arg("-T").arg(file).output().expect("objdump runs");
    assert!(out.status.success(), "objdump -T {}", file.display());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains("*UND*") == imports && (imports || l.contains(" DF ")))
        .filter_map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            let (version, name) = (cols.get(cols.len().checked_sub(2)?)?, cols.last()?);
            let hidden = version.starts_with('(');
            let version = version.trim_start_matches('(').trim_end_matches(')');
            families.iter().any(|f| version.starts_with(f)).then(|| Sym {
                version: version.to_string(),
                name: name.to_string(),
                hidden: hidden && !imports,
            })
        })
        .collect()
}

/// The `Version definitions` block of `objdump -p`, one line per row with its whitespace
/// normalised: a numbered row per node (index, flags, hash, name), each followed by a row
/// naming its parent if it has one.
pub fn version_definitions(file: &Path) -> Vec<String> {
    let out = Command::new("objdump").arg("-p").arg(file).output().expect("objdump runs");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    text.lines()
        .skip_while(|l| !l.starts_with("Version definitions"))
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect()
}

/// The ELF files of an installed Debian package whose path passes `keep`.
fn package_elves(package: &str, keep: impl Fn(&str) -> bool) -> Vec<PathBuf> {
    let Ok(out) = Command::new("dpkg").args(["-L", package]).output() else { return Vec::new() };
    if !out.status.success() {
        return Vec::new();
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| keep(l))
        .map(PathBuf::from)
        .filter(|p| {
            let mut magic = [0u8; 4];
            std::fs::File::open(p).and_then(|mut f| f.read_exact(&mut magic)).is_ok() && &magic == b"\x7fELF"
        })
        .collect()
}

/// Debian's perftest programs and python3-pyverbs' extension modules: the files whose
/// imports the vendor libraries must satisfy. Empty if either package is missing.
pub fn importers() -> Vec<PathBuf> {
    let perftest = package_elves("perftest", |p| p.starts_with("/usr/bin/"));
    let pyverbs = package_elves("python3-pyverbs", |p| p.ends_with(".so"));
    if perftest.is_empty() || pyverbs.is_empty() {
        return Vec::new();
    }
    perftest.into_iter().chain(pyverbs).collect()
}
