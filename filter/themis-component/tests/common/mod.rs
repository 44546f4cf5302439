//! Builds the component for the tests.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

/// Builds the component once (release, wasm32-wasip2) and returns its path.
pub fn component_path() -> &'static PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
        let target = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| root.join("target"));
        let status = Command::new(env!("CARGO"))
            .current_dir(&root)
            .args([
                "build",
                "-q",
                "-p",
                "themis-component",
                "--release",
                "--target",
                "wasm32-wasip2",
            ])
            .env("CARGO_TARGET_DIR", &target)
            .status()
            .expect("running cargo build for the component");
        assert!(
            status.success(),
            "building the component for wasm32-wasip2 failed"
        );
        target.join("wasm32-wasip2/release/themis_component.wasm")
    })
}
