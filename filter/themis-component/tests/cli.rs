//! The component as a tool under the stock `wasmtime` CLI (installed by
//! `scripts/setup.sh`): the exact `wasmtime run` lines of the README.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::component_path;
use themis_core::{Identity, MeshName};

/// `wasmtime run --dir <dir>::/ <component> <args>`, run in `dir`.
fn wasmtime(dir: &Path, args: &[&str]) -> Output {
    let wasmtime = std::env::var_os("HOME")
        .map(|home| Path::new(&home).join(".cargo/bin/wasmtime"))
        .filter(|p| p.exists())
        .unwrap_or_else(|| "wasmtime".into());
    Command::new(&wasmtime)
        .current_dir(dir)
        .args(["run", "--dir", "."])
        .arg(component_path())
        .args(args)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "running {} (scripts/setup.sh installs it): {e}",
                wasmtime.display()
            )
        })
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn identities_from_the_wasmtime_cli_work_with_the_native_core() {
    let dir = tempfile::tempdir().unwrap();
    let new = wasmtime(dir.path(), &["id", "new", "--mesh", "demo"]);
    assert!(new.status.success(), "{}", text(&new.stderr));
    let (pem, id) = (text(&new.stdout), text(&new.stderr).trim().to_owned());
    std::fs::write(dir.path().join("a.key"), &pem).unwrap();

    // The native core reads the key the component wrote, with the same id.
    let native = Identity::from_key_file(MeshName::new("demo").unwrap(), &pem).unwrap();
    assert_eq!(native.printable_id(), id);

    let show = wasmtime(dir.path(), &["id", "show", "--mesh", "demo", "a.key"]);
    assert!(show.status.success(), "{}", text(&show.stderr));
    let shown = text(&show.stdout);
    assert!(
        shown.contains(&id) && shown.contains(&hex::encode(native.public_key())),
        "{shown}"
    );

    let check = wasmtime(dir.path(), &["id", "check", &id, "--key", "a.key"]);
    assert!(check.status.success(), "{}", text(&check.stderr));

    // A key file the native core wrote, checked against another id: refused, exit 1.
    let other = Identity::generate(
        MeshName::new("demo").unwrap(),
        &ring::rand::SystemRandom::new(),
    )
    .unwrap();
    std::fs::write(dir.path().join("b.key"), other.to_key_file().as_str()).unwrap();
    let wrong = wasmtime(dir.path(), &["id", "check", &id, "--key", "b.key"]);
    assert_eq!(wrong.status.code(), Some(1));
    assert!(text(&wrong.stderr).contains(&format!("is the key of {}", other.printable_id())));

    // Bad input: a clear message and a failing exit status, never a trap.
    for args in [
        &["id", "new", "--mesh", "Not A Mesh"][..],
        &["id", "show", "--mesh", "demo", "missing.key"],
        &["id", "check", "demo1typo", "--key", "a.key"],
        &["id", "frobnicate"],
    ] {
        let out = wasmtime(dir.path(), args);
        let stderr = text(&out.stderr);
        assert!(
            matches!(out.status.code(), Some(1 | 2)),
            "{args:?}: {:?} {stderr}",
            out.status
        );
        assert!(stderr.contains("error"), "{args:?}: {stderr}");
        assert!(!stderr.contains("wasm trap"), "{args:?}: {stderr}");
    }
}
