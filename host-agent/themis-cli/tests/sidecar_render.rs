//! `themis sidecar render`, as people, the demo and the Kubernetes image run it: the
//! real binary, its flags, its refusals and what it warns of. (What it renders is
//! checked as data in `themis-bootstrap`'s tests, and in use by every Envoy the suite
//! starts.)

use std::path::Path;
use std::process::{Command, Output};

use themis_testkit::agent::themis_binary;
use themis_testkit::mesh::tempdir;
use themis_testkit::module::sha256_hex;

const ROOT: &str = "demo:1111111111111111111111111111111111111111111111111111111111111111";

fn render(dir: &Path, extra: &[&str]) -> Output {
    Command::new(themis_binary())
        .current_dir(dir)
        .args([
            "sidecar",
            "render",
            "--workload",
            "check",
            "--service",
            "check",
        ])
        .args(["--agent-socket", "agent.sock", "--app", "127.0.0.12:8080"])
        .args([
            "--outbound",
            "127.0.0.12:15001",
            "--inbound",
            "127.0.0.12:15006",
        ])
        .args(["--admin-port", "15000"])
        .args(extra)
        .output()
        .expect("running themis")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn a_pinned_wasm_sidecar_names_the_module_by_its_hash() {
    let dir = tempdir();
    std::fs::write(dir.path().join("mesh.root"), format!("{ROOT}\n")).unwrap();
    let module = b"\0asm not really a module";
    std::fs::write(dir.path().join("f.wasm"), module).unwrap();
    let out = render(
        dir.path(),
        &[
            "--mesh-root",
            "mesh.root",
            "--wasm",
            "f.wasm",
            "--wasm-url",
            "http://127.0.0.1:8099/themis_envoy.wasm",
            "--policy",
            r#"{"allow":[{"service":"handler"}]}"#,
        ],
    );
    let (yaml, err) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{err}");
    assert!(
        yaml.contains(&format!("sha256: {}", sha256_hex(module))),
        "{yaml}"
    );
    assert!(yaml.contains(r#"uri: "http://127.0.0.1:8099/themis_envoy.wasm""#));
    // The root read from its file, the socket made absolute, the policy carried.
    assert!(yaml.contains(ROOT));
    let socket = dir.path().join("agent.sock");
    assert!(yaml.contains(&socket.display().to_string()), "{yaml}");
    assert!(yaml.contains(r#""policy":{"allow":[{"service":"handler"}]}"#));
    assert!(err.is_empty(), "nothing to warn of: {err}");
}

#[test]
fn a_tcp_app_and_a_tcp_service_render_on_the_native_runtime() {
    let dir = tempdir();
    let out = render(
        dir.path(),
        &[
            "--mesh-root",
            ROOT,
            "--runtime",
            "native",
            "--app-protocol",
            "tcp",
            "--tcp",
            "redis=127.0.0.12:6380",
            "--policy",
            r#"{"allow_any_caller":true}"#,
        ],
    );
    let yaml = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(yaml.contains("name: themis_tcp_redis") && yaml.contains("name: themis_to_redis"));
    assert!(
        yaml.contains("upgrade_type: CONNECT, connect_config: {}"),
        "{yaml}"
    );
}

#[test]
fn what_is_unsafe_is_refused_or_said() {
    let dir = tempdir();
    std::fs::write(dir.path().join("f.wasm"), b"m").unwrap();
    // Neither a pin nor an explicit --unpinned: refused.
    let out = render(dir.path(), &["--mesh-root", ROOT, "--wasm", "f.wasm"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("--unpinned"),
        "{}",
        text(&out.stderr)
    );
    assert!(out.stdout.is_empty());
    // Unpinned and with no policy: rendered, and both said.
    let out = render(
        dir.path(),
        &["--mesh-root", ROOT, "--wasm", "f.wasm", "--unpinned"],
    );
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("unpinned") && err.contains("refuses every caller"),
        "{err}"
    );
    // A policy that would break out of its YAML string, a name that would break a
    // listener, a Wasm sidecar given --calls, a URL that is not http://IP:PORT/PATH.
    for (extra, says) in [
        (
            &[
                "--runtime",
                "native",
                "--policy",
                r#"{"allow":[{"service":"a'b"}]}"#,
            ][..],
            "single quote",
        ),
        (
            &["--runtime", "native", "--calls", "check}, {name: evil"][..],
            "not a service name",
        ),
        (
            &["--wasm", "f.wasm", "--unpinned", "--calls", "check"][..],
            "native runtime",
        ),
        (
            &["--wasm", "f.wasm", "--wasm-url", "ftp://x/y"][..],
            "expected http://IP:PORT/PATH",
        ),
        (
            &["--runtime", "native", "--tcp", "redis"][..],
            "SERVICE=IP:PORT",
        ),
        (
            &["--runtime", "native", "--policy", "{not json"][..],
            "not JSON",
        ),
    ] {
        let out = render(dir.path(), &[&["--mesh-root", ROOT][..], extra].concat());
        assert!(!out.status.success(), "{extra:?} rendered");
        assert!(
            text(&out.stderr).contains(says),
            "{extra:?}: {}",
            text(&out.stderr)
        );
        assert!(out.stdout.is_empty(), "{extra:?}");
    }
    // A missing root file names itself.
    let out = render(
        dir.path(),
        &["--mesh-root", "nosuch.root", "--runtime", "native"],
    );
    assert!(
        text(&out.stderr).contains("nosuch.root"),
        "{}",
        text(&out.stderr)
    );
}
