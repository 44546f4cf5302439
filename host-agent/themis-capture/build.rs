//! Builds the eBPF programs (`ebpf/themis-ebpf`) for bpfel with the pinned nightly and
//! bpf-linker (both from scripts/setup.sh), and leaves the object in OUT_DIR for
//! `include_bytes!`. The nightly build goes to one shared directory next to the
//! target's profiles, so debug, release and clippy builds reuse it.
//!
//! As in aya-template, a build without the eBPF toolchain still compiles (so that a
//! `cargo check` of the agent, the test kit or the fuzz crate needs no nightly):
//!
//! | `THEMIS_EBPF` | what happens |
//! |---|---|
//! | unset (default) | built if the nightly and bpf-linker are installed; otherwise no programs (a cargo warning says so) and `Capture::start` refuses with the reason |
//! | `required` | built, or the build fails with what is missing (`scripts/test.sh` and `scripts/demo.sh` set it: the real build is never optional there) |
//! | `skip` | no programs, without trying |
//!
//! `THEMIS_EBPF_OBJECT=<path>` uses a prebuilt object instead (a packager's choice).
use std::{env, path::PathBuf, process::Command};

const NIGHTLY: &str = "nightly-2026-05-20";

/// Leaves an empty object: `Capture::start` refuses to load it, saying why.
fn without_programs(out: &std::path::Path, why: &str) {
    println!("cargo:warning=themis-capture is built WITHOUT its eBPF programs: {why}; the agent's --capture will refuse to start (scripts/setup.sh installs the toolchain; THEMIS_EBPF=required makes this an error)");
    std::fs::write(out.join("themis-ebpf.o"), b"").expect("writing OUT_DIR");
}

fn main() {
    println!("cargo:rerun-if-env-changed=THEMIS_EBPF");
    println!("cargo:rerun-if-env-changed=THEMIS_EBPF_OBJECT");
    let out = PathBuf::from(env::var_os("OUT_DIR").unwrap());
    if let Some(object) = env::var_os("THEMIS_EBPF_OBJECT") {
        println!(
            "cargo:rerun-if-changed={}",
            PathBuf::from(&object).display()
        );
        std::fs::copy(&object, out.join("themis-ebpf.o")).unwrap_or_else(|e| {
            panic!(
                "THEMIS_EBPF_OBJECT={}: {e}",
                PathBuf::from(&object).display()
            )
        });
        return;
    }
    let mode = env::var("THEMIS_EBPF").unwrap_or_default();
    match mode.as_str() {
        "" | "required" => {}
        "skip" => return without_programs(&out, "THEMIS_EBPF=skip"),
        other => panic!("THEMIS_EBPF={other:?}: expected required, skip or nothing"),
    }
    if mode.is_empty() {
        if let Some(missing) = missing_toolchain() {
            return without_programs(&out, &missing);
        }
    }
    build(&out);
}

/// What the eBPF build lacks, if anything: the pinned nightly (with rust-src) or
/// bpf-linker.
fn missing_toolchain() -> Option<String> {
    let nightly = Command::new("rustup")
        .args(["run", NIGHTLY, "rustc", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !nightly {
        return Some(format!("the {NIGHTLY} toolchain is not installed"));
    }
    let linker = Command::new("bpf-linker")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    (!linker).then(|| "bpf-linker is not installed".to_owned())
}

fn build(out: &std::path::Path) {
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
    // OUT_DIR is <target>/<profile>/build/<pkg>/out.
    let target_dir = out.ancestors().nth(4).unwrap_or(out).join("bpf");

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
