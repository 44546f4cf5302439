//! Builds what the tests run, once per test process, into `CARGO_TARGET_DIR`: the
//! filter (release, wasm32-wasip1), the component (release, wasm32-wasip2) and the
//! `themis` agent and tool. Tests that build start with
//! [`require::cargo_build`](crate::require::cargo_build).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The workspace's root directory.
pub fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Cargo's target directory; a relative `CARGO_TARGET_DIR` is taken from the
/// workspace root (where `cargo test` runs), not from this package's directory.
pub fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from) {
        Some(dir) if dir.is_absolute() => dir,
        Some(dir) => workspace().join(dir),
        None => workspace().join("target"),
    }
}

/// `cargo build -q <args>` in the workspace.
///
/// Cargo runs the test with this package's variables set (`CARGO_MANIFEST_DIR`,
/// `CARGO_PKG_NAME`, ...). Build scripts that watch them (`ring`'s does) would see
/// them change between this build and the one of the tests, and both would rebuild
/// `ring` and everything above it on every run: the nested build does not get them.
pub fn cargo_build(args: &[&str]) {
    let mut command = Command::new(env!("CARGO"));
    command
        .current_dir(workspace())
        .arg("build")
        .arg("-q")
        .args(args)
        .env("CARGO_TARGET_DIR", target_dir());
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        let per_package = name.starts_with("CARGO_PKG_")
            || name.starts_with("CARGO_MANIFEST_")
            || name.starts_with("CARGO_BIN_")
            || matches!(
                &*name,
                "CARGO_CRATE_NAME" | "CARGO_PRIMARY_PACKAGE" | "CARGO_TARGET_TMPDIR" | "OUT_DIR"
            );
        if per_package {
            command.env_remove(&*name);
        }
    }
    let status = command.status().expect("running cargo build");
    assert!(status.success(), "cargo build {args:?} failed");
}

/// `path`, which must be a file; `missing` says what to do about it otherwise.
fn present(path: PathBuf, missing: &str) -> PathBuf {
    assert!(path.is_file(), "{} is missing{missing}", path.display());
    path
}

/// A program of the workspace's `.venv` (Envoy; Python with grpcio and websockets),
/// which `scripts/setup.sh` fills.
pub fn venv_binary(name: &str) -> PathBuf {
    present(
        workspace().join(".venv/bin").join(name),
        ": run scripts/setup.sh",
    )
}

/// Builds `package` (release, for the wasm `target`) and returns its module.
pub fn release_wasm(package: &str, target: &str) -> PathBuf {
    cargo_build(&["-p", package, "--release", "--target", target]);
    let module = format!("{target}/release/{}.wasm", package.replace('-', "_"));
    present(target_dir().join(module), " after the build")
}

/// The filter module, built once.
pub fn filter_wasm() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| release_wasm("themis-envoy", "wasm32-wasip1"))
}

/// The component (release, wasm32-wasip2), built once.
pub fn component_wasm() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| release_wasm("themis-component", "wasm32-wasip2"))
}

/// The `themis` binary (agent and tool), built once (for the tests of other crates
/// than themis-cli: see [`crate::agent::themis_binary`]).
pub fn themis_binary() -> &'static str {
    static PATH: OnceLock<String> = OnceLock::new();
    PATH.get_or_init(|| {
        cargo_build(&["-p", "themis-cli", "--bin", "themis"]);
        let path = present(target_dir().join("debug/themis"), " after the build");
        path.to_str().expect("a UTF-8 target directory").to_owned()
    })
}

/// The native module (`libthemis_native.so`), built once; Envoy finds it in its
/// directory (`ENVOY_DYNAMIC_MODULES_SEARCH_PATH`, [`native_module_dir`]).
///
/// The release build users get, except in a test process that set
/// [`NATIVE_FAULTS`]: there, a debug build with the feature `fault-injection`, copied
/// to a directory of its own (only such a process's Envoys load it).
pub fn native_module() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        if std::env::var_os(NATIVE_FAULTS).is_none() {
            cargo_build(&["-p", "themis-native", "--release"]);
            return present(
                target_dir().join("release/libthemis_native.so"),
                " after the build",
            );
        }
        cargo_build(&["-p", "themis-native", "--features", "fault-injection"]);
        let built = present(
            target_dir().join("debug/libthemis_native.so"),
            " after the build",
        );
        let dir = native_module_dir();
        std::fs::create_dir_all(&dir).expect("a directory for the module with faults");
        let copy = dir.join("libthemis_native.so");
        std::fs::copy(&built, &copy).expect("copying the module with faults");
        copy
    })
}

/// The environment variable that arms the native module's faults (`src/faults.rs` in
/// themis-native): set in a test process, it also makes its Envoys load the module
/// built with them.
pub const NATIVE_FAULTS: &str = "THEMIS_NATIVE_FAULTS";

/// The directory Envoy loads the native module from (built or not: a Wasm sidecar's
/// Envoy never loads it).
pub fn native_module_dir() -> PathBuf {
    match std::env::var_os(NATIVE_FAULTS) {
        None => target_dir().join("release"),
        Some(_) => target_dir().join("debug/with-faults"),
    }
}
