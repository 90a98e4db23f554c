//! The layering of DESIGN.md, checked from the `use` lines: every module of the library imports
//! only its own layer and the layers below it, so no import loop can join two layers.
//!
//! Ground floor (`types`, `attr`, `error`, `mem`) < `wire` < `transport` < `verbs` < `link`. The links
//! are the drivers: they own I/O and time and drive a device (`verbs::Context`) from outside,
//! so they sit on top even though packets leave through them.

use std::path::{Path, PathBuf};

/// The layer of a module path's first segment under `crate::`, lowest first.
fn rank(module: &str) -> Option<usize> {
    const LAYERS: &[&[&str]] = &[&["types", "attr", "error", "mem"], &["wire"], &["transport"], &["verbs"], &["link"]];
    LAYERS.iter().position(|layer| layer.contains(&module))
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("source directory") {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The `crate::<module>` paths a file names outside comments.
fn imports(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(at) = rest.find("crate::") {
            let tail = &rest[at + "crate::".len()..];
            let name: String = tail.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            // `crate::{a, b}` names several modules at once.
            if name.is_empty() && tail.starts_with('{') {
                let group = tail[1..].split('}').next().unwrap_or("");
                found.extend(group.split(',').map(|m| m.trim().split("::").next().unwrap_or("").to_string()));
            } else {
                found.push(name);
            }
            rest = tail;
        }
    }
    found
}

#[test]
fn every_module_imports_only_its_layer_and_those_below() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    assert!(files.len() > 40, "the library's sources were not found under {}", src.display());
    let mut violations = Vec::new();
    for file in &files {
        let rel = file.strip_prefix(&src).expect("under src");
        let first = rel.components().next().and_then(|c| c.as_os_str().to_str()).unwrap_or("");
        let module = first.trim_end_matches(".rs");
        if module == "lib" {
            continue; // the crate root declares every layer
        }
        let own = rank(module).unwrap_or_else(|| panic!("{} belongs to no layer of this test", rel.display()));
        let text = std::fs::read_to_string(file).expect("readable source");
        for imported in imports(&text) {
            match rank(&imported) {
                Some(r) if r > own => violations.push(format!("{} imports crate::{imported}", rel.display())),
                Some(_) => {}
                None => violations.push(format!("{} names crate::{imported}, which is in no layer", rel.display())),
            }
        }
    }
    assert!(violations.is_empty(), "imports against the layering:\n{}", violations.join("\n"));
}

#[test]
fn the_check_sees_an_upward_import() {
    // The test above would pass on a parser that finds nothing: make sure it finds these.
    let text = "use crate::verbs::qp::QpInner; // crate::link in a comment\nuse crate::{types, mem::MemRef};";
    assert_eq!(imports(text), ["verbs", "types", "mem"]);
    assert!(rank("verbs") > rank("transport"));
}
