//! Builds what the tests run: the component, and the `themis` agent. The nested
//! `cargo build` is the one the Envoy filter's tests use (it keeps this package's
//! variables out of the build, so `ring` is not rebuilt on every run).

#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::OnceLock;

#[path = "../../../themis-envoy/tests/support/build.rs"]
mod build;

/// Builds the component once (release, wasm32-wasip2) and returns its path.
pub fn component_path() -> &'static PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        build::cargo_build(&[
            "-p",
            "themis-component",
            "--release",
            "--target",
            "wasm32-wasip2",
        ]);
        build::target_dir().join("wasm32-wasip2/release/themis_component.wasm")
    })
}

/// Builds the `themis` tool and agent once and returns its path.
pub fn themis_path() -> &'static str {
    build::themis_binary()
}
