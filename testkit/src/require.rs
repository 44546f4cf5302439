//! Gates for the tests that need what a plain `cargo test` by an ordinary user does
//! not have: root (network namespaces, cgroups, eBPF, tcpdump, other uids), Envoy
//! (`scripts/setup.sh`'s `.venv`), a kernel with BTF, a tool, or a nested `cargo
//! build` (the filter and the component are built by the tests that run them).
//!
//! Each such test starts with its gates:
//!
//! ```no_run
//! use themis_testkit::require;
//!
//! if !require::root("creates network namespaces") {
//!     return;
//! }
//! ```
//!
//! A missing prerequisite makes the gate write one line to stderr and return false,
//! so the test returns at once and passes:
//!
//! ```text
//! skipped agents_on_two_hosts_joined_by_a_veth_pair: needs root (creates network namespaces); scripts/test.sh runs it
//! ```
//!
//! The line is written to the process's stderr itself, past libtest's capture, so it
//! shows in a passing run. With `THEMIS_REQUIRE_ALL=1` in the environment (the native
//! tests of `scripts/test.sh`, the README's test command) a missing prerequisite
//! panics instead: that command runs every test and never skips one silently.

use std::ffi::CString;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use crate::build;

/// The variable that turns every skip into a failure.
pub const REQUIRE_ALL: &str = "THEMIS_REQUIRE_ALL";

/// Whether a skip must fail instead (`THEMIS_REQUIRE_ALL` set, and not to `0`).
pub fn all_required() -> bool {
    std::env::var_os(REQUIRE_ALL).is_some_and(|v| !v.is_empty() && v != "0")
}

/// The name of the running test: libtest runs each test on a thread named after it.
fn test_name() -> String {
    match std::thread::current().name() {
        Some(name) if name != "main" => name.to_owned(),
        _ => "a test".to_owned(),
    }
}

/// `true` if `ok`; otherwise says the test is skipped and why (or panics under
/// [`REQUIRE_ALL`]) and gives `false`.
fn gate(ok: bool, needs: &str, why: &str) -> bool {
    if ok {
        return true;
    }
    let test = test_name();
    if all_required() {
        panic!(
            "{test} needs {needs} ({why}), and {REQUIRE_ALL}=1 (scripts/test.sh) allows \
             no skipping"
        );
    }
    let line = format!("skipped {test}: needs {needs} ({why}); scripts/test.sh runs it");
    // Not eprintln!: libtest captures that, and shows it only when a test fails.
    let _ = std::io::stderr().write_all(format!("{line}\n").as_bytes());
    false
}

/// Whether the process may do `mode` (`libc::X_OK`, `W_OK`...) on `path`, as the
/// kernel decides for its real uid.
fn access(path: &Path, mode: libc::c_int) -> bool {
    let Ok(path) = CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: access(2) on a NUL-terminated path; it only reads the string.
    unsafe { libc::access(path.as_ptr(), mode) == 0 }
}

/// Whether the process runs as root (effective uid 0).
pub fn is_root() -> bool {
    // SAFETY: geteuid(2) cannot fail and touches no memory.
    unsafe { libc::geteuid() == 0 }
}

/// Root: network namespaces, cgroups, eBPF, packet capture, running as other uids.
pub fn root(why: &str) -> bool {
    gate(is_root(), "root", why)
}

/// Envoy from `scripts/setup.sh` (`.venv/bin/envoy`), and it runs: `envoy --version`
/// answers (checked once per process).
pub fn envoy(why: &str) -> bool {
    static RUNS: OnceLock<bool> = OnceLock::new();
    let runs = *RUNS.get_or_init(|| {
        let envoy = build::workspace().join(".venv/bin/envoy");
        access(&envoy, libc::X_OK)
            && Command::new(&envoy)
                .arg("--version")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
    });
    gate(
        runs,
        "Envoy (.venv/bin/envoy from scripts/setup.sh, runnable by this user)",
        why,
    )
}

/// A kernel with BTF (`/sys/kernel/btf/vmlinux`), which the capture programs load
/// against.
pub fn kernel_btf(why: &str) -> bool {
    let btf = Path::new("/sys/kernel/btf/vmlinux");
    gate(
        access(btf, libc::R_OK),
        "a kernel with BTF (/sys/kernel/btf/vmlinux, readable)",
        why,
    )
}

/// Where a program is: on `PATH`, else in `/usr/bin`, `/usr/sbin` (which a test
/// runner's `PATH` may lack) or `~/.cargo/bin` (where `scripts/setup.sh` installs
/// wasmtime); only if this user may run it.
pub fn find_tool(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let cargo_bin = std::env::var_os("HOME").map(|home| Path::new(&home).join(".cargo/bin"));
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/bin"), PathBuf::from("/usr/sbin")])
        .chain(cargo_bin)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file() && access(candidate, libc::X_OK))
}

/// A program (`tcpdump`, `bpftool`, `wasmtime`...) this user may run.
pub fn tool(name: &str, why: &str) -> bool {
    gate(find_tool(name).is_some(), name, why)
}

/// What a test of the filter in Envoy needs: [`envoy`], and [`cargo_build`] for the
/// filter (and the `themis` agent) it runs.
pub fn filter_in_envoy(why: &str) -> bool {
    envoy(why) && cargo_build("builds the filter (wasm32-wasip1) and the themis agent")
}

/// A nested `cargo build` into the target directory ([`build::cargo_build`]): cargo
/// runnable by this user and the target directory writable.
pub fn cargo_build(why: &str) -> bool {
    let cargo = Path::new(env!("CARGO"));
    let target = build::target_dir();
    let writable = access(&target, libc::W_OK)
        || (!target.exists() && target.parent().is_some_and(|p| access(p, libc::W_OK)));
    gate(
        access(cargo, libc::X_OK) && writable,
        "cargo and a writable target directory",
        why,
    )
}
