//! The drop-in's export table against the system's `libibverbs.so.1` (Debian's libibverbs1,
//! rdma-core 44): every public symbol with the same version node, so that any program or
//! library built against rdma-core (librdmacm, pyverbs, perftest, all linked BIND_NOW) finds
//! each verb it names. The one part of the system table left out on purpose is the private
//! provider interface (`ibv_cmd_*`, `verbs_*`, `execute_ioctl`, …), which builds kernel
//! commands for in-tree providers; of `IBVERBS_PRIVATE_34` the drop-in exports only what
//! programs and librdmacm import (`ibv_query_gid_type`).

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use common::*;

const SYSTEM: &str = "/usr/lib/x86_64-linux-gnu/libibverbs.so.1";

/// The private symbols programs outside rdma-core's providers use.
const PRIVATE_USED: &[&str] = &["ibv_query_gid_type"];

/// The defined, default-version dynamic symbols of `lib` as (version, name): `objdump -T`
/// marks a hidden (non-default) version with parentheses, and those are the pre-1.1
/// compatibility entries no program links against any more.
fn exports(lib: &Path) -> BTreeSet<(String, String)> {
    let out = Command::new("objdump").arg("-T").arg(lib).output().expect("objdump runs");
    assert!(out.status.success(), "objdump -T {}", lib.display());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.contains("*UND*"))
        .filter_map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            let (version, name) = (cols.get(cols.len().checked_sub(2)?)?, cols.last()?);
            (version.starts_with("IBVERBS_") && version != name).then(|| (version.to_string(), name.to_string()))
        })
        .collect()
}

/// Whether the system exports `name` in `version` for programs (not for providers).
fn public(version: &str, name: &str) -> bool {
    version != "IBVERBS_PRIVATE_34" || PRIVATE_USED.contains(&name)
}

#[test]
fn every_public_symbol_of_libibverbs_44_with_its_version() {
    if !(ready() && tool("objdump") && have(Path::new(SYSTEM).exists(), "the system libibverbs.so.1 (libibverbs1)")) {
        return;
    }
    let system: BTreeSet<_> = exports(Path::new(SYSTEM)).into_iter().filter(|(v, n)| public(v, n)).collect();
    assert!(system.len() > 70, "the system table looks wrong: {system:?}");
    let ours = exports(&library().join("libibverbs.so.1"));
    let missing: Vec<_> = system.difference(&ours).collect();
    assert!(missing.is_empty(), "{} symbols of the system libibverbs are missing: {missing:?}", missing.len());
    // Nothing beyond them either: a symbol the real library does not have, or has in another
    // node, would let a program built against softhca fail to load on a real system.
    let extra: Vec<_> = ours.difference(&system).collect();
    assert!(extra.is_empty(), "exported but not by libibverbs 44: {extra:?}");
}

#[test]
fn librdmacm_resolves_every_symbol_against_the_drop_in() {
    let rdmacm = Path::new("/usr/lib/x86_64-linux-gnu/librdmacm.so.1");
    if !(ready() && tool("ldd") && have(rdmacm.exists(), "librdmacm.so.1 (librdmacm1)")) {
        return;
    }
    let out = Command::new("ldd").arg("-r").arg(rdmacm).env("LD_LIBRARY_PATH", library()).output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(text.contains(&library().join("libibverbs.so.1").display().to_string()), "{text}");
    assert!(!text.contains("undefined symbol"), "{text}");
}

/// The CRC kernels that run under an emulator each start a 4 KiB page of the linked library
/// (`crc-text.ld`, linked as `scripts/build-libibverbs` links it): under qemu's TCG a loop that
/// crosses a page boundary runs at a fraction of its speed, and where the link would otherwise
/// put them moves with every change to the code.
#[test]
fn the_crc_kernels_start_a_page_each() {
    if !ready() {
        return;
    }
    let out = Command::new("nm").arg(library().join("libibverbs.so.1")).output().expect("nm runs");
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for kernel in ["13sparse_kernel", "18sparse_copy_kernel", "12table_kernel", "17table_copy_kernel"] {
        let addr = text
            .lines()
            .find(|l| l.contains("softhca3mem5crc32") && l.contains(kernel))
            .and_then(|l| u64::from_str_radix(l.split_whitespace().next()?, 16).ok())
            .unwrap_or_else(|| panic!("no {kernel} in the library"));
        assert_eq!(addr % 4096, 0, "{kernel} at {addr:#x}");
    }
}
