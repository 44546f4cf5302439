//! Builds the eBPF programs (`ebpf/themis-ebpf`) for bpfel with the pinned nightly and
//! bpf-linker (both from scripts/setup.sh), and leaves the object in OUT_DIR for
//! `include_bytes!`. The nightly build goes to one shared directory next to the
//! target's profiles, so debug, release and clippy builds reuse it.
use std::{env, path::PathBuf, process::Command};

const NIGHTLY: &str = "nightly-2026-05-20";

fn main() {
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").unwrap());
    let ebpf = manifest.join("../../ebpf/themis-ebpf");
    let common = manifest.join("../../ebpf/themis-ebpf-common");
    for path in [
        ebpf.join("src"),
        ebpf.join("Cargo.toml"),
        common.join("src"),
    ] {
        println!("cargo:rerun-if-changed={}", path.display());
    }
    let out = PathBuf::from(env::var_os("OUT_DIR").unwrap());
    // OUT_DIR is <target>/<profile>/build/<pkg>/out.
    let target_dir = out.ancestors().nth(4).unwrap_or(&out).join("bpf");

    let mut cargo = Command::new("rustup");
    cargo
        .args([
            "run",
            NIGHTLY,
            "cargo",
            "build",
            "--release",
            "-Z",
            "build-std=core",
        ])
        .args(["--target", "bpfel-unknown-none", "--target-dir"])
        .arg(&target_dir)
        .current_dir(&ebpf);
    // What the outer (stable) cargo set for us must not leak into the nightly build.
    for (key, _) in env::vars_os() {
        let key = key.to_string_lossy();
        if key.starts_with("CARGO") || key.starts_with("RUST") {
            cargo.env_remove(&*key);
        }
    }
    cargo.env(
        "CARGO_ENCODED_RUSTFLAGS",
        [
            "--cfg=bpf_target_arch=\"x86_64\"",
            "-Cdebuginfo=2",
            "-Clink-arg=--btf",
        ]
        .join("\x1f"),
    );
    let output = cargo.output().unwrap_or_else(|e| {
        panic!("cannot run rustup to build the eBPF programs ({e}); run scripts/setup.sh")
    });
    if !output.status.success() {
        panic!(
            "building the eBPF programs failed: they need {NIGHTLY} with rust-src and \
             bpf-linker (scripts/setup.sh installs both)\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let object = target_dir.join("bpfel-unknown-none/release/themis-ebpf");
    std::fs::copy(&object, out.join("themis-ebpf.o"))
        .unwrap_or_else(|e| panic!("cannot copy {}: {e}", object.display()));
}
