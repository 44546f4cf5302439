//! Builds what the tests run: the component, and the `themis` agent.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("target"))
}

/// `cargo build -q <args>` in the workspace, into the tests' target directory.
fn cargo_build(args: &[&str]) {
    let status = Command::new(env!("CARGO"))
        .current_dir(workspace())
        .arg("build")
        .arg("-q")
        .args(args)
        .env("CARGO_TARGET_DIR", target_dir())
        .status()
        .expect("running cargo build");
    assert!(status.success(), "cargo build {args:?} failed");
}

/// Builds the component once (release, wasm32-wasip2) and returns its path.
pub fn component_path() -> &'static PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        cargo_build(&[
            "-p",
            "themis-component",
            "--release",
            "--target",
            "wasm32-wasip2",
        ]);
        target_dir().join("wasm32-wasip2/release/themis_component.wasm")
    })
}

/// Builds the `themis` tool and agent once and returns its path.
pub fn themis_path() -> &'static PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        cargo_build(&["-p", "themis-agent", "--bin", "themis"]);
        target_dir().join("debug/themis")
    })
}
