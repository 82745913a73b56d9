//! Used from build scripts (`cli/build.rs`, `python/build.rs`) so that every
//! `--version` says what it was built from: the version, the git commit, and the crate's
//! enabled features. Sits below everything in `docs/ARCHITECTURE.md`'s picture: no ladle code,
//! only the build's environment and `git`.
//!
//! [`emit`] sets two compile-time variables for the crate being built:
//! - `LADLE_COMMIT`: `git rev-parse --short=12 HEAD`, or `unknown` outside a git checkout (a
//!   build from a source archive). Uncommitted changes are not marked: the script reruns only
//!   when the checked-out commit changes, so a mark would go stale;
//! - `LADLE_FEATURES`: the crate's enabled Cargo features, comma-separated, or `none`.

use std::path::PathBuf;
use std::process::Command;

/// Prints the `cargo:` lines that set `LADLE_COMMIT` and `LADLE_FEATURES` and rebuild when
/// the checked-out commit changes. Call it from `build.rs`.
pub fn emit() {
    let commit = git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=LADLE_COMMIT={commit}");
    println!("cargo:rustc-env=LADLE_FEATURES={}", features());
    // Rebuild when HEAD moves: HEAD itself (a checkout), and the branch it names (a commit).
    for path in watched() {
        println!("cargo:rerun-if-changed={}", path.display());
    }
}

/// The enabled features of the crate being built (Cargo sets `CARGO_FEATURE_<NAME>` for each).
fn features() -> String {
    let mut names: Vec<String> = std::env::vars()
        .filter_map(|(k, _)| k.strip_prefix("CARGO_FEATURE_").map(str::to_owned))
        .filter(|name| name != "DEFAULT")
        .map(|name| name.to_lowercase().replace('_', "-"))
        .collect();
    names.sort();
    if names.is_empty() {
        "none".to_owned()
    } else {
        names.join(",")
    }
}

/// The files whose change means another commit is checked out (absent outside git).
fn watched() -> Vec<PathBuf> {
    let mut paths = Vec::new();
    if let Some(dir) = git(&["rev-parse", "--git-dir"]) {
        paths.push(PathBuf::from(&dir).join("HEAD"));
    }
    if let (Some(common), Some(branch)) = (
        git(&["rev-parse", "--git-common-dir"]),
        git(&["symbolic-ref", "-q", "HEAD"]),
    ) {
        let reference = PathBuf::from(common).join(branch);
        if reference.exists() {
            paths.push(reference);
        }
    }
    paths
}

/// `git ARGS` in the crate's directory, its trimmed output when it succeeds.
fn git(args: &[&str]) -> Option<String> {
    let dir = std::env::var_os("CARGO_MANIFEST_DIR")?;
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}
