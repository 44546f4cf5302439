//! The crates' layering, read from `cargo metadata` and `cargo tree`: each runtime (the
//! Wasm filter, the native module, the wasmtime component) is a driver of the shared
//! sans-IO crates and depends on no other runtime; the node controller calls the agent
//! through the client, not by linking the daemon; the daemon links none of the
//! operator's tooling; the native module's `.so` brings no async runtime, HTTP stack
//! or proxy-wasm.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

const RUNTIMES: [&str; 3] = ["themis-envoy", "themis-native", "themis-component"];

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn cargo(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO"))
        .args(args)
        .current_dir(workspace())
        .output()
        .expect("running cargo");
    assert!(
        out.status.success(),
        "cargo {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

/// Each workspace crate and the workspace crates it depends on (normal and build
/// dependencies, any target: what its library or binary links).
fn workspace_graph() -> BTreeMap<String, BTreeSet<String>> {
    let metadata: Value = serde_json::from_str(&cargo(&[
        "metadata",
        "--format-version",
        "1",
        "--no-deps",
        "--offline",
    ]))
    .expect("cargo metadata is JSON");
    let packages = metadata["packages"].as_array().expect("packages");
    let ours: BTreeSet<String> = packages
        .iter()
        .map(|p| p["name"].as_str().expect("a name").to_owned())
        .collect();
    packages
        .iter()
        .map(|p| {
            let deps = p["dependencies"]
                .as_array()
                .expect("dependencies")
                .iter()
                .filter(|d| d["kind"].as_str() != Some("dev"))
                .filter_map(|d| d["name"].as_str())
                .filter(|name| ours.contains(*name))
                .map(str::to_owned)
                .collect();
            (p["name"].as_str().expect("a name").to_owned(), deps)
        })
        .collect()
}

fn closure(graph: &BTreeMap<String, BTreeSet<String>>, of: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut next = vec![of.to_owned()];
    while let Some(name) = next.pop() {
        for dep in graph.get(&name).into_iter().flatten() {
            if seen.insert(dep.clone()) {
                next.push(dep.clone());
            }
        }
    }
    seen
}

#[test]
fn no_runtime_depends_on_another_runtime_or_on_the_daemon_and_the_daemon_not_on_the_tool() {
    if !themis_testkit::require::cargo_build("reads the workspace's crates with cargo metadata") {
        return;
    }
    let graph = workspace_graph();
    for runtime in RUNTIMES {
        assert!(
            graph.contains_key(runtime),
            "{runtime} is not in the workspace"
        );
        let deps = closure(&graph, runtime);
        for other in RUNTIMES.iter().filter(|r| **r != runtime) {
            assert!(
                !deps.contains(*other),
                "{runtime} depends on {other}: {deps:?}"
            );
        }
        assert!(
            !deps.contains("themis-agent"),
            "{runtime} links the agent daemon"
        );
        assert!(
            deps.contains("themis-sidecar") || runtime == "themis-component",
            "{runtime} does not drive the sans-IO sidecar: {deps:?}"
        );
    }
    let controller = closure(&graph, "themis-node-controller");
    assert!(
        !controller.contains("themis-agent"),
        "the node controller links the whole agent daemon to call its API: {controller:?}"
    );
    assert!(controller.contains("themis-agent-client"));
    // The daemon runs on every node: the code that signs with the mesh root (and the
    // tool for people) stays out of it, a dev-dependency of its tests at most.
    let daemon = closure(&graph, "themis-agent");
    assert!(
        !daemon.contains("themis-cli"),
        "the agent daemon links the operator's tooling: {daemon:?}"
    );
    assert!(closure(&graph, "themis-cli").contains("themis-agent"));
}

#[test]
fn the_native_module_brings_no_async_runtime_http_stack_or_proxy_wasm() {
    if !themis_testkit::require::cargo_build("reads the module's dependency tree with cargo tree") {
        return;
    }
    // `cargo tree -p` resolves features as `cargo build -p themis-native` does: the
    // client's tokio driver is a feature the module does not turn on.
    let tree = cargo(&[
        "tree",
        "-p",
        "themis-native",
        "-e",
        "normal",
        "--prefix",
        "none",
        "--offline",
    ]);
    let crates: BTreeSet<&str> = tree.lines().filter_map(|l| l.split(' ').next()).collect();
    assert!(crates.contains("themis-agent-client"), "{crates:?}");
    for unwanted in ["tokio", "hyper", "proxy-wasm", "mio"] {
        assert!(
            !crates.contains(unwanted),
            "the .so links {unwanted}: {crates:?}"
        );
    }
}
