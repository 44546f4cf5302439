//! The component's mesh client (`wasmtime run themis_component.wasm call --http …`)
//! against a real Envoy sidecar: the tool resolves `check` through agent A, verifies
//! the records against the mesh root, connects to Envoy B's inbound listener, runs the
//! stream's key agreement as the initiator with the instance's id, and speaks HTTP/2
//! inside the sealed stream; Envoy B's connection manager hands the request to the
//! echo app with the tool's authenticated id.
//!
//! The component is built (release, wasm32-wasip2) with the same nested `cargo build`
//! as the filter (themis-testkit's `build`); `wasmtime` is the one `scripts/setup.sh` installs.

use themis_testkit as support;

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::Duration;

use support::app::seen_header;
use support::build::release_wasm;
use support::mesh::{create_workload, random_hex, Mesh, Runtime, IP_A};
use support::process::poll_until;
use support::require;

/// How long one run of the tool may take.
const TOOL_LIMIT: Duration = Duration::from_secs(60);

fn wasmtime() -> PathBuf {
    std::env::var_os("HOME")
        .map(|home| Path::new(&home).join(".cargo/bin/wasmtime"))
        .filter(|p| p.exists())
        .unwrap_or_else(|| "wasmtime".into())
}

/// The agents of the harness serve their API on a Unix socket only (no
/// `--resolve-listen`), which WASI cannot reach: this forwards a loopback TCP port to
/// agent A's socket, whose `GET /v1/services/…` and `GET /v1/revocations` are the
/// handlers the resolve listener serves. One thread per connection, for the test's
/// life.
fn forward_to_unix(socket: PathBuf) -> SocketAddr {
    let listener = TcpListener::bind((IP_A, 0)).unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for tcp in listener.incoming().flatten() {
            let Ok(unix) = UnixStream::connect(&socket) else {
                continue;
            };
            let (mut tcp_in, mut unix_out) = (tcp.try_clone().unwrap(), unix.try_clone().unwrap());
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut tcp_in, &mut unix_out);
                let _ = unix_out.shutdown(Shutdown::Write);
            });
            let (mut unix_in, mut tcp_out) = (unix, tcp);
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut unix_in, &mut tcp_out);
                let _ = tcp_out.shutdown(Shutdown::Both);
            });
        }
    });
    addr
}

struct Run {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

/// `wasmtime run --dir . -S inherit-network <component> <args>` in `dir`, killed if it
/// takes longer than [`TOOL_LIMIT`].
fn run_tool(component: &Path, dir: &Path, args: &[&str]) -> Run {
    let (out, err) = (dir.join("tool.stdout"), dir.join("tool.stderr"));
    let mut child = Command::new(wasmtime())
        .current_dir(dir)
        .args(["run", "--dir", ".", "-S", "inherit-network"])
        .arg(component)
        .args(args)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "running {} (scripts/setup.sh installs it): {e}",
                wasmtime().display()
            )
        });
    let status = poll_until(TOOL_LIMIT, || child.try_wait().unwrap()).unwrap_or_else(|| {
        let _ = child.kill();
        let _ = child.wait();
        panic!(
            "the tool did not finish within {TOOL_LIMIT:?}; stderr:\n{}",
            std::fs::read_to_string(&err).unwrap_or_default()
        );
    });
    Run {
        status,
        stdout: std::fs::read_to_string(out).unwrap_or_default(),
        stderr: std::fs::read_to_string(err).unwrap_or_default(),
    }
}

/// What every call of the tool names: `call check --http METHOD PATH`, then `http`
/// (the rest of the request), then the delegated credential, the mesh root and the
/// agent to resolve through.
struct Caller<'a> {
    component: &'a Path,
    work: &'a Path,
    mesh_root: &'a str,
    agent: &'a str,
}

impl Caller<'_> {
    fn call(&self, http: &[&str]) -> Run {
        self.call_with("tool.credential", http)
    }

    /// [`Caller::call`] with the credential file `credential` (in the work directory).
    fn call_with(&self, credential: &str, http: &[&str]) -> Run {
        let mut args = vec!["call", "check", "--http"];
        args.extend_from_slice(http);
        args.extend_from_slice(&["--credential", credential, "--mesh-root", self.mesh_root]);
        args.extend_from_slice(&["--agent", self.agent]);
        run_tool(self.component, self.work, &args)
    }
}

/// A check that the forwarder works the way the tool uses it (HTTP/1.1, close).
fn agent_answers(addr: SocketAddr) -> bool {
    let Ok(mut s) = TcpStream::connect(addr) else {
        return false;
    };
    let _ = s.write_all(b"GET /v1/status HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n");
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    answer.starts_with("HTTP/1.1 200")
}

/// The tool against a Wasm sidecar.
#[test]
fn the_wasmtime_tool_calls_a_service_through_its_envoy_sidecar_over_http2() {
    tool_calls_through_a_sidecar(Runtime::Wasm);
}

/// The same against a native sidecar: the component's delegated handshake (wire v3)
/// is taken by the native runtime too.
#[test]
fn the_wasmtime_tool_calls_a_service_through_a_native_sidecar_over_http2() {
    tool_calls_through_a_sidecar(Runtime::Native);
}

fn tool_calls_through_a_sidecar(runtime: Runtime) {
    if !(require::filter_in_envoy("runs the sidecar")
        && require::cargo_build("builds the component")
        && require::tool("wasmtime", "runs the component"))
    {
        return;
    }
    let component = release_wasm("themis-component", "wasm32-wasip2");
    // The tool's identity: a workload of node A, a member of the mesh like any other,
    // which Envoy B admits by its explicit `allow_any_caller` policy. Its key stays in
    // agent A: the tool gets a delegated credential (`themis delegate`), a short-lived
    // key of its own the workload key signed for.
    let mesh = Mesh::start_on(runtime, runtime, Some(r#"{"allow_any_caller":true}"#));
    mesh.register("check", "check", mesh.envoy_b.inbound);
    let tool_id = create_workload(&mesh.a, "tool");
    let work = mesh.dir.path().join("tool");
    std::fs::create_dir_all(&work).unwrap();
    let credential = work.join("tool.credential");
    let (code, out, err) = mesh
        .a
        .cli(&["delegate", "tool", "--out", credential.to_str().unwrap()]);
    assert_eq!(code, 0, "themis delegate: {out}{err}");
    assert!(out.contains(&tool_id), "{out}");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&credential).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "the credential file is private");
    let (code, _, err) = mesh
        .a
        .cli(&["delegate", "tool", "--out", credential.to_str().unwrap()]);
    assert_ne!(code, 0, "an existing credential file was overwritten");
    assert!(err.contains("exists"), "{err}");
    let mesh_root = support::envoy::mesh_root(mesh.dir.path());
    let agent = forward_to_unix(mesh.a.dir.join("agent.sock"));
    assert!(agent_answers(agent), "the forwarder to agent A's API");

    let marker = format!("TOOLMARK-{}", random_hex(12));
    let agent = agent.to_string();
    let tool = Caller {
        component: &component,
        work: &work,
        mesh_root: &mesh_root,
        agent: &agent,
    };
    let run = tool.call(&[
        "POST",
        "/echo?from=tool",
        "--body",
        &marker,
        "--header",
        "x-custom: custom-value",
        "--header",
        "x-themis-peer-id: forged",
    ]);
    let context = format!(
        "status {:?}\n--- stdout:\n{}\n--- stderr:\n{}\n{}",
        run.status,
        run.stdout,
        run.stderr,
        mesh.logs()
    );
    assert_eq!(run.status.code(), Some(0), "{context}");

    // The response: status and headers on stderr, the app's JSON body on stdout.
    assert!(run.stderr.contains("HTTP/2 200"), "{context}");
    assert!(run.stderr.contains("x-app: echo"), "{context}");
    assert!(
        run.stderr
            .contains(&format!("authenticated {}", mesh.check_id)),
        "the tool says whom it authenticated: {context}"
    );
    let echo: serde_json::Value = serde_json::from_str(&run.stdout)
        .unwrap_or_else(|e| panic!("the body is the echo's JSON ({e}): {context}"));
    assert!(run.stdout.contains(&marker), "{context}");
    assert_eq!(echo["marker"], mesh.app_marker.as_str(), "{context}");

    // What the app saw: the request, and the tool's authenticated id (never the
    // forged one), no service (the tool claimed none).
    assert_eq!(echo["method"], "POST", "{echo}");
    assert_eq!(echo["path"], "/echo?from=tool", "{echo}");
    assert_eq!(echo["body"], marker.as_str(), "{echo}");
    assert_eq!(seen_header(&echo, "x-custom"), ["custom-value"], "{echo}");
    assert_eq!(
        seen_header(&echo, "x-themis-peer-id"),
        [tool_id.as_str()],
        "{echo}"
    );
    assert!(
        seen_header(&echo, "x-themis-peer-service").is_empty(),
        "{echo}"
    );
    assert!(!echo.to_string().contains("forged"), "{echo}");
    assert_eq!(mesh.app.count(), 1);

    // A GET without a body, on the same sidecar: a second connection, a second key
    // agreement.
    let run = tool.call(&["GET", "/second"]);
    assert_eq!(
        run.status.code(),
        Some(0),
        "{}\n{}",
        run.stderr,
        mesh.logs()
    );
    let echo: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(echo["method"], "GET", "{echo}");
    assert_eq!(echo["path"], "/second", "{echo}");
    assert_eq!(echo["body_len"], 0, "{echo}");
    assert_eq!(mesh.app.count(), 2);

    // Credentials tampered with are refused by the tool itself, before it connects:
    // another delegated key (the delegation names the first), a flipped bit of the
    // delegation's signature, another id for the public key, another mesh.
    let file: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&credential).unwrap()).unwrap();
    let tampered = |name: &str, change: &dyn Fn(&mut serde_json::Value)| {
        let mut copy = file.clone();
        change(&mut copy);
        std::fs::write(work.join(name), copy.to_string()).unwrap();
        let run = tool.call_with(name, &["GET", "/tampered"]);
        assert_eq!(run.status.code(), Some(1), "{name}: {}", run.stderr);
        run.stderr
    };
    let swapped = tampered("swapped.credential", &|c| {
        c["delegated_key_seed"] = random_hex(32).into();
    });
    assert!(
        swapped.contains("does not match the delegation"),
        "{swapped}"
    );
    let flipped = tampered("flipped.credential", &|c| {
        let mut bytes = hex::decode(c["delegation"].as_str().unwrap()).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        c["delegation"] = hex::encode(bytes).into();
    });
    assert!(
        flipped.contains("not signed by the workload key"),
        "{flipped}"
    );
    let other_id = tampered("other-id.credential", &|c| {
        c["identity"]["id"] = mesh.check_id.clone().into();
    });
    assert!(
        other_id.contains("is not the id of its public key"),
        "{other_id}"
    );
    let other_mesh = tampered("other-mesh.credential", &|c| {
        c["identity"]["mesh"] = "othermesh".into();
    });
    assert!(other_mesh.contains("a credential of mesh"), "{other_mesh}");
    assert_eq!(mesh.app.count(), 2, "a tampered credential reached the app");
}
