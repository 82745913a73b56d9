//! The house keeps its documented shape: the crates' dependencies are the arrows that
//! `docs/ARCHITECTURE.md` draws (read from `cargo metadata`, so a new dependency that the map
//! does not show fails here).

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_owned()
}

/// Each workspace crate by its folder (`consumer-sdk`, `python`), with the folders of the
/// ladle crates its `[dependencies]` name (not dev- or build-dependencies).
fn actual() -> BTreeMap<String, BTreeSet<String>> {
    let (meta, folder) = metadata();
    let packages = meta["packages"].as_array().unwrap();
    let by_name: BTreeMap<&str, String> = packages
        .iter()
        .map(|p| {
            let name = p["name"].as_str().unwrap();
            (name, folder(p["manifest_path"].as_str().unwrap()))
        })
        .collect();
    packages
        .iter()
        .map(|p| {
            let deps = normal_dependencies(p)
                .filter_map(|name| by_name.get(name).cloned())
                .collect();
            (folder(p["manifest_path"].as_str().unwrap()), deps)
        })
        .collect()
}

/// The names of a package's `[dependencies]` (not dev- or build-dependencies).
fn normal_dependencies(package: &serde_json::Value) -> impl Iterator<Item = &str> {
    (package["dependencies"].as_array().unwrap().iter())
        .filter(|d| d["kind"].is_null())
        .map(|d| d["name"].as_str().unwrap())
}

/// `cargo metadata` of the workspace, and how to name a package by its folder.
fn metadata() -> (serde_json::Value, impl Fn(&str) -> String) {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let out = Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(repo())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let folder = |manifest: &str| {
        let dir = Path::new(manifest).parent().unwrap();
        let rel = dir.strip_prefix(repo()).unwrap();
        rel.to_str().unwrap().to_owned()
    };
    (meta, folder)
}

/// The arrows of the map's "Dependencies" block: `a, b → c, d` or `a → no ladle crate`.
fn documented() -> BTreeMap<String, BTreeSet<String>> {
    let map = repo().join("docs/ARCHITECTURE.md");
    let text = std::fs::read_to_string(&map).unwrap();
    let section = text
        .split("## Dependencies")
        .nth(1)
        .unwrap_or_else(|| panic!("{}: no Dependencies section", map.display()));
    let block = section.split("```").nth(1).unwrap();
    let mut arrows = BTreeMap::new();
    for line in block.lines().filter(|l| l.contains('→')) {
        let (from, to) = line.split_once('→').unwrap();
        let to: BTreeSet<String> = if to.trim() == "no ladle crate" {
            BTreeSet::new()
        } else {
            to.split(',').map(|t| t.trim().to_owned()).collect()
        };
        for name in from.split(',') {
            arrows.insert(name.trim().to_owned(), to.clone());
        }
    }
    arrows
}

#[test]
fn the_crates_depend_on_each_other_exactly_as_the_architecture_map_draws() {
    let actual = actual();
    let documented = documented();
    // The test and bench packages are described in prose below the block.
    let drawn: BTreeMap<&String, &BTreeSet<String>> = actual
        .iter()
        .filter(|(folder, _)| !matches!(folder.as_str(), "tests" | "benches"))
        .collect();
    for (folder, deps) in &drawn {
        let doc = documented.get(*folder).unwrap_or_else(|| {
            panic!("docs/ARCHITECTURE.md draws no arrow for the crate in {folder}/")
        });
        assert_eq!(
            doc, *deps,
            "{folder}/: the map's arrows (left) against Cargo.toml's [dependencies] (right)"
        );
    }
    for folder in documented.keys() {
        assert!(
            drawn.contains_key(folder),
            "docs/ARCHITECTURE.md draws {folder}, which is no crate of the workspace"
        );
    }
}

#[test]
fn only_the_os_crate_calls_the_operating_system_directly() {
    // Test, bench and fuzz packages may attack with raw calls; every other crate goes through
    // `ladle-os` (and `clippy.toml` keeps the raw calls it wraps out of their code).
    let (meta, folder) = metadata();
    let raw = ["libc", "rustix", "nix"];
    let mut callers: Vec<String> = (meta["packages"].as_array().unwrap().iter())
        .filter(|p| normal_dependencies(p).any(|name| raw.contains(&name)))
        .map(|p| folder(p["manifest_path"].as_str().unwrap()))
        .filter(|f| !matches!(f.as_str(), "tests" | "benches" | "fuzz"))
        .collect();
    callers.sort();
    assert_eq!(callers, ["os"], "crates that depend on {raw:?} directly");
}
