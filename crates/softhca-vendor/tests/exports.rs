//! The export tables of `libmlx5.so.1` and `libefa.so.1` as linked from this crate (the way
//! `scripts/build-libibverbs` links them): every `mlx5dv_*` / `efadv_*` symbol that Debian's
//! perftest and python3-pyverbs import is there with the version they import it with (they
//! are linked BIND_NOW, so one missing symbol stops them loading), and the whole table, with
//! its chain of version nodes, is that of rdma-core 44's libraries. Needs `cc`, `objdump`,
//! perftest, python3-pyverbs and ibverbs-providers; without them each test says so and
//! passes, except under CI (`CI` set), where they are required.

mod common;

use std::collections::BTreeSet;
use std::path::Path;

use common::*;

const FAMILIES: &[&str] = &["MLX5_", "EFA_"];

fn ready() -> bool {
    tool("cc") && tool("objdump")
}

/// What the vendor libraries export, as (version, name), hidden versions included.
fn ours() -> BTreeSet<(String, String)> {
    ["libmlx5.so.1", "libefa.so.1"]
        .iter()
        .flat_map(|l| dynsyms(&vendor_libs().join(l), FAMILIES, false))
        .map(|s| (s.version, s.name))
        .collect()
}

#[test]
fn every_symbol_perftest_and_pyverbs_import_is_exported_with_its_version() {
    if !ready() {
        return;
    }
    let files = importers();
    if !have(!files.is_empty(), "perftest and python3-pyverbs") {
        return;
    }
    let imports: BTreeSet<(String, String)> =
        files.iter().flat_map(|f| dynsyms(f, FAMILIES, true)).map(|s| (s.version, s.name)).collect();
    // rdma-core 44's perftest and pyverbs import 97 of them; fewer means the scan broke.
    assert!(imports.len() >= 90, "only {} imports found: {imports:?}", imports.len());
    let exported = ours();
    let missing: Vec<_> = imports.difference(&exported).collect();
    assert!(missing.is_empty(), "{} imported symbols are not exported: {missing:?}", missing.len());
}

#[test]
fn the_export_tables_are_those_of_rdma_core_44() {
    if !ready() {
        return;
    }
    for (lib, family) in [("libmlx5.so.1", "MLX5_"), ("libefa.so.1", "EFA_")] {
        let system = Path::new("/usr/lib/x86_64-linux-gnu").join(lib);
        if !have(system.exists(), &format!("the real {lib} (ibverbs-providers)")) {
            continue;
        }
        let real = dynsyms(&system, &[family], false);
        let mine = dynsyms(&vendor_libs().join(lib), FAMILIES, false);
        assert!(real.len() > 5, "the real {lib} table looks wrong: {real:?}");
        let missing: Vec<_> = real.difference(&mine).collect();
        assert!(missing.is_empty(), "{lib}: {} symbols of the real library are missing: {missing:?}", missing.len());
        let extra: Vec<_> = mine.difference(&real).collect();
        assert!(extra.is_empty(), "{lib}: exported but not by rdma-core 44: {extra:?}");
        assert_eq!(
            version_definitions(&vendor_libs().join(lib)),
            version_definitions(&system),
            "{lib}'s version nodes"
        );
    }
}

/// rdma-core 44's counts: 128 functions (129 entries with the MLX5_1.0 `mlx5dv_init_obj`)
/// in 25 nodes, 6 in 3; and neither library leaks the other's functions or the Rust runtime
/// (this holds without the real libraries to compare with).
#[test]
fn each_library_exports_its_own_family_and_nothing_else() {
    if !ready() {
        return;
    }
    let mlx5 = dynsyms(&vendor_libs().join("libmlx5.so.1"), &[""], false);
    let efa = dynsyms(&vendor_libs().join("libefa.so.1"), &[""], false);
    assert_eq!(mlx5.len(), 129, "{mlx5:?}");
    assert_eq!(efa.len(), 6, "{efa:?}");
    assert!(mlx5.iter().all(|s| s.version.starts_with("MLX5_1.") && s.name.contains("mlx5dv_")), "{mlx5:?}");
    assert!(efa.iter().all(|s| s.version.starts_with("EFA_1.") && s.name.starts_with("efadv_")), "{efa:?}");
    let init: Vec<_> = mlx5.iter().filter(|s| s.name == "mlx5dv_init_obj").collect();
    assert_eq!(init.len(), 2, "{init:?}");
    assert!(init.iter().any(|s| s.version == "MLX5_1.0" && s.hidden), "{init:?}");
    assert!(init.iter().any(|s| s.version == "MLX5_1.2" && !s.hidden), "{init:?}");
    let nodes = |lib: &str| {
        version_definitions(&vendor_libs().join(lib))
            .iter()
            .filter(|r| r.starts_with(|c: char| c.is_ascii_digit()))
            .count()
    };
    // One row for the library itself, then one per node.
    assert_eq!(nodes("libmlx5.so.1"), 26);
    assert_eq!(nodes("libefa.so.1"), 4);
}
