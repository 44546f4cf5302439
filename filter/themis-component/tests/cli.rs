//! The component as a tool under the stock `wasmtime` CLI (installed by
//! `scripts/setup.sh`): the exact `wasmtime run` lines of the README.

use std::path::Path;
use std::process::{Command, Output};

use themis_core::{Identity, MeshName};
use themis_testkit::agent::themis_binary;
use themis_testkit::build::component_wasm;
use themis_testkit::require;

/// `wasmtime run --dir . <component> <args>`, run in `dir`.
fn wasmtime(dir: &Path, args: &[&str]) -> Output {
    wasmtime_with(dir, &[], args)
}

/// The same with extra `wasmtime run` options.
fn wasmtime_with(dir: &Path, options: &[&str], args: &[&str]) -> Output {
    let wasmtime = std::env::var_os("HOME")
        .map(|home| Path::new(&home).join(".cargo/bin/wasmtime"))
        .filter(|p| p.exists())
        .unwrap_or_else(|| "wasmtime".into());
    Command::new(&wasmtime)
        .current_dir(dir)
        .args(["run", "--dir", "."])
        .args(options)
        .arg(component_wasm())
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
    if !(require::cargo_build("builds the component for wasm32-wasip2")
        && require::tool("wasmtime", "runs the component"))
    {
        return;
    }
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

/// A `themis agent` process, stopped by its pid when dropped.
struct AgentProcess(std::process::Child);

impl Drop for AgentProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn themis(socket: &Path, args: &[&str]) -> Output {
    Command::new(themis_binary())
        .arg("--socket")
        .arg(socket)
        .args(args)
        .output()
        .unwrap()
}

/// Serves the Themis channel as `identity` on 127.0.0.1, answering each request with
/// `<name> got <request>`; returns its address.
fn serve(
    runtime: &tokio::runtime::Runtime,
    identity: Identity,
    name: &'static str,
) -> std::net::SocketAddr {
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let handler = move |_peer: std::sync::Arc<themis_core::SessionInfo>,
                            request: bytes::BytesMut| async move {
            format!("{name} got {}", String::from_utf8_lossy(&request)).into_bytes()
        };
        let stats = std::sync::Arc::new(themis_net::NetStats::default());
        let config = themis_net::Config::default();
        tokio::spawn(themis_net::serve(
            listener,
            std::sync::Arc::new(identity),
            config,
            std::sync::Arc::new(handler),
            stats,
        ));
        addr
    })
}

/// The mesh client outside Envoy: the component under `wasmtime run` resolves a
/// service through a real agent and calls it over the Themis channel.
#[test]
fn the_wasmtime_tool_resolves_through_an_agent_and_calls_over_themis() {
    if !(require::cargo_build("builds the component and the themis agent")
        && require::tool("wasmtime", "runs the component"))
    {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let resolve = format!("127.0.0.1:{}", free_port());
    let state = dir.path().join("agent");
    // The operator's part: a mesh, this node admitted and granted check and fake.
    let mesh_dir = dir.path().join("mesh");
    let operator = |args: &[&std::ffi::OsStr]| {
        let out = Command::new(themis_binary()).args(args).output().unwrap();
        assert!(
            out.status.success(),
            "themis {args:?}: {}",
            text(&out.stderr)
        );
    };
    operator(&[
        "mesh".as_ref(),
        "create".as_ref(),
        "test".as_ref(),
        "--out".as_ref(),
        mesh_dir.as_os_str(),
    ]);
    operator(&[
        "node".as_ref(),
        "admit".as_ref(),
        "--mesh-dir".as_ref(),
        mesh_dir.as_os_str(),
        "--out".as_ref(),
        state.as_os_str(),
    ]);
    for service in ["check", "fake"] {
        operator(&[
            "service".as_ref(),
            "grant".as_ref(),
            service.as_ref(),
            "--mesh-dir".as_ref(),
            mesh_dir.as_os_str(),
            "--node".as_ref(),
            state.as_os_str(),
        ]);
    }
    let mesh_root = std::fs::read_to_string(mesh_dir.join("mesh.root"))
        .unwrap()
        .trim()
        .to_owned();
    let log = std::fs::File::create(dir.path().join("agent.log")).unwrap();
    let _agent = AgentProcess(
        Command::new(themis_binary())
            .args([
                "agent",
                "--mesh",
                "test",
                "--listen",
                "127.0.0.1:0",
                "--metrics",
                "off",
                "--resolve-listen",
                &resolve,
            ])
            .arg("--state-dir")
            .arg(&state)
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    let socket = state.join("agent.sock");
    themis_testkit::process::wait_until(
        "the agent to start",
        std::time::Duration::from_secs(20),
        || themis(&socket, &["status"]).status.success().then_some(()),
    );

    // `check` serves with the identity its agent created; it registers there.
    assert!(themis(&socket, &["workload", "check"]).status.success());
    let mesh = MeshName::new("test").unwrap();
    let pem = std::fs::read_to_string(state.join("workloads/check.key")).unwrap();
    let check = Identity::from_key_file(mesh.clone(), &pem).unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let at = serve(&runtime, check, "check");
    let out = themis(
        &socket,
        &[
            "register",
            "check",
            "--workload",
            "check",
            "--endpoint",
            &at.to_string(),
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    // `fake` is registered by workload fake-1, but another key answers at its endpoint.
    assert!(themis(&socket, &["workload", "fake-1"]).status.success());
    let impostor = Identity::generate(mesh.clone(), &ring::rand::SystemRandom::new()).unwrap();
    let at = serve(&runtime, impostor, "impostor");
    assert!(themis(
        &socket,
        &[
            "register",
            "fake",
            "--workload",
            "fake-1",
            "--endpoint",
            &at.to_string()
        ]
    )
    .status
    .success());

    let handler = Identity::generate(mesh, &ring::rand::SystemRandom::new()).unwrap();
    std::fs::write(
        dir.path().join("handler.key"),
        handler.to_key_file().as_str(),
    )
    .unwrap();
    let net = ["-S", "inherit-network"];
    let call = |service: &str, agent: &str, mesh_root: &str| {
        wasmtime_with(
            dir.path(),
            &net,
            &[
                "call",
                service,
                "--agent",
                agent,
                "--key",
                "handler.key",
                "--mesh-root",
                mesh_root,
                "is 7 prime?",
                "and 9?",
            ],
        )
    };

    let out = call("check", &resolve, &mesh_root);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout),
        "check got is 7 prime?\ncheck got and 9?\n"
    );

    let out = call("fake", &resolve, &mesh_root);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    assert!(
        text(&out.stdout).is_empty(),
        "nothing reached the impostor's answers"
    );
    assert!(
        text(&out.stderr).contains("no instance of fake could be reached"),
        "{}",
        text(&out.stderr)
    );

    let out = call("nothing-here", &resolve, &mesh_root);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("has no instances"),
        "{}",
        text(&out.stderr)
    );

    // The same agent, seen under another mesh root of the same mesh name (an agent
    // of an impostor mesh, say): nothing it returns is endorsed, nothing is called.
    let foreign = format!("test:{}", "11".repeat(32));
    let out = call("check", &resolve, &foreign);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    assert!(text(&out.stdout).is_empty(), "nothing was called");
    assert!(
        text(&out.stderr).contains("does not endorse"),
        "{}",
        text(&out.stderr)
    );

    let out = call("check", &format!("127.0.0.1:{}", free_port()), &mesh_root);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("cannot reach the agent"),
        "{}",
        text(&out.stderr)
    );
}
