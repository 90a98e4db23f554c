//! The drop-in librdmacm.so.1's export table against Debian's librdmacm1 (rdma-core 44):
//! every symbol in the same version node, nothing more, so that every program built against
//! librdmacm loads on it (perftest, rdmacm-utils and pyverbs are linked BIND_NOW).

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use common::*;

const SYSTEM: &str = "/usr/lib/x86_64-linux-gnu/librdmacm.so.1";

/// Defined dynamic symbols as (version, name), and whether the library needs `needed`.
fn exports(lib: &Path) -> BTreeSet<(String, String)> {
    let out = Command::new("objdump").arg("-T").arg(lib).output().expect("objdump runs");
    assert!(out.status.success(), "objdump -T {}", lib.display());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.contains("*UND*"))
        .filter_map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            let (version, name) = (cols.get(cols.len().checked_sub(2)?)?, cols.last()?);
            version.starts_with("RDMACM_").then(|| (version.to_string(), name.to_string()))
        })
        .collect()
}

#[test]
fn every_symbol_of_librdmacm_44_with_its_version() {
    if !(ready() && tool("objdump") && have(Path::new(SYSTEM).exists(), "the system librdmacm.so.1 (librdmacm1)")) {
        return;
    }
    let system = exports(Path::new(SYSTEM));
    assert!(system.len() > 70, "the system table looks wrong: {system:?}");
    let ours = exports(&libs().join("librdmacm.so.1"));
    let missing: Vec<_> = system.difference(&ours).collect();
    let extra: Vec<_> = ours.difference(&system).collect();
    assert!(missing.is_empty() && extra.is_empty(), "missing {missing:?}, extra {extra:?}");
}

#[test]
fn it_needs_the_drop_in_libibverbs_and_resolves_against_it() {
    if !(ready() && tool("ldd")) {
        return;
    }
    let lib = libs().join("librdmacm.so.1");
    let out = Command::new("ldd").arg("-r").arg(&lib).env("LD_LIBRARY_PATH", libs()).output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(text.contains(&libs().join("libibverbs.so.1").display().to_string()), "{text}");
    assert!(!text.contains("undefined symbol"), "{text}");
}
