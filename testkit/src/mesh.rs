//! The topology of themis-envoy's end-to-end tests: node A runs `handler` (agent A, Envoy A), node B runs
//! `check` (agent B, Envoy B, the echo app). Each test builds its own, on loopback
//! addresses no other suite uses, with kernel-chosen ports; everything stops when it
//! drops (Envoys first, then the app, then the agents, then the directory goes).

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use crate::agent::{metered, Agent, Spawn};
use crate::app::App;
use crate::envoy::{
    inbound_config, mesh_root, outbound_config, AppProtocol, Envoy, Sidecar, ALLOW_HANDLER,
    ALLOW_NOBODY,
};
use crate::http::{self, Response};
use crate::process::poll_until;

/// Node A's address.
pub const IP_A: &str = "127.0.0.31";
/// Node B's address.
pub const IP_B: &str = "127.0.0.32";
/// An admitted node without grants (the impostor of issue 11).
pub const IP_EVIL: &str = "127.0.0.35";

/// How long the DHT gets to make a registration resolvable.
const RESOLVE_LIMIT: Duration = Duration::from_secs(30);

pub fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("themis-envoy-e2e-")
        .tempdir()
        .unwrap()
}

pub use crate::ports::closed_port;

/// Random hex, for markers nobody else could produce.
pub fn random_hex(bytes: usize) -> String {
    use ring::rand::SecureRandom;
    let mut buf = vec![0u8; bytes];
    ring::rand::SystemRandom::new().fill(&mut buf).unwrap();
    hex::encode(buf)
}

pub struct Mesh {
    // Dropped in this order.
    pub envoy_a: Envoy,
    pub envoy_b: Envoy,
    pub app: App,
    pub a: Agent,
    pub b: Agent,
    /// Agent B's Prometheus metrics (what Envoy B makes it do).
    pub b_metrics: SocketAddr,
    /// The printable ids of the two workloads.
    pub handler_id: String,
    pub check_id: String,
    /// The marker the app puts in every response.
    pub app_marker: String,
    /// What the two sidecars run.
    pub runtime_a: Runtime,
    pub runtime_b: Runtime,
    pub dir: tempfile::TempDir,
}

/// Agents A (on [`IP_A`], which creates the test mesh under `root`) and B (on
/// [`IP_B`], admitted to it and joining A's ring), once both have joined.
pub fn two_agents(root: &Path) -> (Agent, Agent) {
    let (a, b, _) = two_agents_metered(root);
    (a, b)
}

/// [`two_agents`], agent B serving its metrics at the address returned.
pub fn two_agents_metered(root: &Path) -> (Agent, Agent, SocketAddr) {
    let a = Agent::spawn(
        root,
        "agent-a",
        Spawn {
            listen: &format!("{IP_A}:0"),
            ..Spawn::default()
        },
    );
    let (args, metrics) = metered(&[]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let b = Agent::spawn(
        root,
        "agent-b",
        Spawn {
            listen: &format!("{IP_B}:0"),
            join: Some(&a.contact),
            extra: &args,
            ..Spawn::default()
        },
    );
    a.wait_joined();
    b.wait_joined();
    (a, b, metrics)
}

/// Creates `workload` on `agent` with the `themis` tool; returns its printable id.
pub fn create_workload(agent: &Agent, workload: &str) -> String {
    let (code, out, err) = agent.cli(&["--json", "workload", workload]);
    assert_eq!(code, 0, "themis workload {workload}: {out}{err}");
    let answer: Value = serde_json::from_str(&out).expect("themis --json workload is JSON");
    assert_eq!(answer["workload"], workload, "{answer}");
    answer["id"].as_str().expect("an id").to_owned()
}

impl Mesh {
    /// Both nodes, with `handler` registered at Envoy A's inbound listener; `check`
    /// is not registered yet (see [`Mesh::register`]). `policy` is Envoy B's inbound
    /// policy (JSON; `None`: none, which refuses every caller). Nobody may call
    /// Envoy A.
    pub fn start(policy: Option<&str>) -> Mesh {
        Mesh::start_on(Runtime::Wasm, Runtime::Wasm, policy)
    }

    /// [`Mesh::start`] with Envoy A on runtime `a` and Envoy B on runtime `b`.
    pub fn start_on(a_runtime: Runtime, b_runtime: Runtime, policy: Option<&str>) -> Mesh {
        let dir = tempdir();
        let root = dir.path();
        let (a, b, b_metrics) = two_agents_metered(root);
        let handler_id = create_workload(&a, "handler");
        let check_id = create_workload(&b, "check");
        let app_marker = format!("RESPMARK-{}", random_hex(12));
        let app = App::start(IP_B, &app_marker);
        // Node A has no app: its inbound role forwards to a port nobody listens on.
        let envoy_a = a_runtime.start(
            root,
            "envoy-a",
            &Sidecar {
                app_protocol: AppProtocol::Http1,
                ip: IP_A,
                agent_socket: &a.dir.join("agent.sock"),
                app: closed_port(IP_A),
                outbound_config: &outbound_config(&mesh_root(root), "handler", "handler"),
                inbound_config: &inbound_config(
                    &mesh_root(root),
                    "handler",
                    "handler",
                    Some(ALLOW_NOBODY),
                ),
            },
        );
        let envoy_b = start_envoy_b(b_runtime, root, &b, "envoy-b", app.addr, policy);
        envoy_a.wait_identity();
        envoy_b.wait_identity();
        a.register_with(
            "handler",
            "handler",
            &envoy_a.inbound.to_string(),
            a_runtime.labels(None),
        );
        if a_runtime.speaks_tls() {
            envoy_a.wait_endorsed_certificate("handler");
        }
        let mesh = Mesh {
            envoy_a,
            envoy_b,
            app,
            a,
            b,
            b_metrics,
            handler_id,
            check_id,
            app_marker,
            runtime_a: a_runtime,
            runtime_b: b_runtime,
            dir,
        };
        // Node B verifies callers' services through the DHT; a native module, from
        // its own resolution of the services its policy names, which it keeps on a
        // thread of its own (a call before it has one is refused by the policy).
        let handler_at = mesh.envoy_a.inbound.to_string();
        mesh.wait_resolves(&mesh.b, "handler", &[&handler_at]);
        if b_runtime.is_native() && policy.is_some_and(|p| p.contains("handler")) {
            mesh.envoy_b
                .wait_native_resolves("handler", mesh.envoy_a.inbound);
        }
        mesh
    }

    /// [`Mesh::start`] with `check` registered at Envoy B's inbound listener, which
    /// admits `handler` ([`ALLOW_HANDLER`]).
    pub fn standard() -> Mesh {
        Mesh::standard_on(Runtime::Wasm)
    }

    /// [`Mesh::standard`] with both sidecars on `runtime`.
    pub fn standard_on(runtime: Runtime) -> Mesh {
        let mesh = Mesh::start_on(runtime, runtime, Some(ALLOW_HANDLER));
        mesh.register("check", "check", mesh.envoy_b.inbound);
        mesh
    }

    /// Registers workload `workload` of node B as an instance of `service` at
    /// `endpoint`, and waits until node A resolves it there (and, on the native
    /// runtime, until Envoy A's module has it in its verified resolution).
    pub fn register(&self, service: &str, workload: &str, endpoint: SocketAddr) {
        let endpoint_text = endpoint.to_string();
        let labels = self.runtime_b.labels(None);
        self.b
            .register_with(service, workload, &endpoint_text, labels);
        self.wait_resolves(&self.a, service, &[&endpoint_text]);
        if self.runtime_a.is_native() {
            self.envoy_a.wait_native_resolves(service, endpoint);
        }
        if self.runtime_b.speaks_tls() && endpoint == self.envoy_b.inbound {
            self.envoy_b.wait_endorsed_certificate(service);
        }
    }

    /// Waits until `agent` resolves `service` to (at least) these endpoints.
    pub fn wait_resolves(&self, agent: &Agent, service: &str, endpoints: &[&str]) {
        let mut answer = None;
        let resolved = poll_until(RESOLVE_LIMIT, || {
            answer = agent.resolve(service);
            let found: Vec<&str> = answer
                .as_ref()
                .and_then(|a| a["instances"].as_array())
                .map(|all| all.iter().filter_map(|i| i["endpoint"].as_str()).collect())
                .unwrap_or_default();
            endpoints.iter().all(|e| found.contains(e)).then_some(())
        });
        assert!(
            resolved.is_some(),
            "{} did not resolve {service} to {endpoints:?} within {RESOLVE_LIMIT:?}; \
             last answer: {answer:?}\n--- {} log:\n{}\n--- {} log:\n{}",
            agent.name,
            self.a.name,
            self.a.log_tail(),
            self.b.name,
            self.b.log_tail()
        );
    }

    /// Another Envoy on node B (workload `check`), with its own inbound policy.
    pub fn start_envoy_b(&self, name: &str, policy: Option<&str>) -> Envoy {
        self.start_sidecar(&self.b, IP_B, "check", name, policy)
    }

    /// A sidecar on B's runtime for `workload` of `agent`'s node (listening on `ip`),
    /// in front of the echo app, with its own inbound policy.
    pub fn start_sidecar(
        &self,
        agent: &Agent,
        ip: &str,
        workload: &str,
        name: &str,
        policy: Option<&str>,
    ) -> Envoy {
        start_sidecar(
            self.runtime_b,
            self.dir.path(),
            (agent, ip, workload),
            name,
            self.app.addr,
            policy,
        )
    }

    /// [`Mesh::start_sidecar`] on `runtime`, whatever Envoy B runs.
    pub fn start_sidecar_on(
        &self,
        runtime: Runtime,
        (agent, ip, workload): (&Agent, &str, &str),
        name: &str,
        policy: Option<&str>,
    ) -> Envoy {
        self.start_edited_sidecar_on(runtime, (agent, ip, workload), name, policy, &|yaml| yaml)
    }

    /// [`Mesh::start_sidecar_on`], its bootstrap edited by `edit` (an Envoy setting the
    /// renderer does not write, for what a test needs to force) before it starts.
    pub fn start_edited_sidecar_on(
        &self,
        runtime: Runtime,
        (agent, ip, workload): (&Agent, &str, &str),
        name: &str,
        policy: Option<&str>,
        edit: &dyn Fn(String) -> String,
    ) -> Envoy {
        start_edited_sidecar(
            runtime,
            self.dir.path(),
            (agent, ip, workload),
            name,
            self.app.addr,
            policy,
            edit,
        )
    }

    /// A sidecar of `check` on node B in front of an app at `app` (which may not be
    /// listening yet), with its own inbound policy.
    pub fn start_sidecar_of_app(&self, app: SocketAddr, name: &str, policy: Option<&str>) -> Envoy {
        start_sidecar(
            self.runtime_b,
            self.dir.path(),
            (&self.b, IP_B, "check"),
            name,
            app,
            policy,
        )
    }

    /// What `handler`'s app does: calls `http://<host><path>` through Envoy A.
    pub fn call(
        &self,
        method: &str,
        host: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Response {
        let mut all = vec![("host", host)];
        all.extend_from_slice(headers);
        http::request(self.envoy_a.outbound, method, path, &all, body)
    }

    /// Asserts that Envoy B checked `handler`'s claimed service offline, from the
    /// endorsement it carried in message 1, not by a resolution through its agent.
    pub fn assert_claim_checked_by_the_carried_endorsement(&self) {
        let log = std::fs::read_to_string(self.envoy_b.log_path()).unwrap_or_default();
        assert!(
            log.contains(r#"(service Some("handler"), by the endorsement it carried) connected"#),
            "{}",
            self.logs()
        );
    }

    /// The logs of both Envoys, for failure messages.
    pub fn logs(&self) -> String {
        format!(
            "--- envoy-a:\n{}\n--- envoy-b:\n{}",
            self.envoy_a.log_tail(30),
            self.envoy_b.log_tail(30)
        )
    }
}

impl Drop for Mesh {
    fn drop(&mut self) {
        // The Envoys first (SIGTERM, then SIGKILL after a bounded wait), then the
        // agents: SIGTERM and a bounded wait (`Agent::terminate`, which panics if
        // one does not stop), unless the test already failed: then the harness's
        // own drop kills them.
        self.envoy_a.stop();
        self.envoy_b.stop();
        if !std::thread::panicking() {
            self.b.terminate();
            self.a.terminate();
        }
    }
}

fn start_envoy_b(
    runtime: Runtime,
    root: &Path,
    b: &Agent,
    name: &str,
    app: SocketAddr,
    policy: Option<&str>,
) -> Envoy {
    start_sidecar(runtime, root, (b, IP_B, "check"), name, app, policy)
}

/// A sidecar of `workload` on `agent`'s node at `ip`, serving `check`.
fn start_sidecar(
    runtime: Runtime,
    root: &Path,
    (agent, ip, workload): (&Agent, &str, &str),
    name: &str,
    app: SocketAddr,
    policy: Option<&str>,
) -> Envoy {
    start_edited_sidecar(
        runtime,
        root,
        (agent, ip, workload),
        name,
        app,
        policy,
        &|yaml| yaml,
    )
}

/// [`start_sidecar`], its bootstrap edited by `edit` first.
fn start_edited_sidecar(
    runtime: Runtime,
    root: &Path,
    (agent, ip, workload): (&Agent, &str, &str),
    name: &str,
    app: SocketAddr,
    policy: Option<&str>,
    edit: &dyn Fn(String) -> String,
) -> Envoy {
    let sidecar = Sidecar {
        app_protocol: AppProtocol::Http1,
        ip,
        agent_socket: &agent.dir.join("agent.sock"),
        app,
        outbound_config: &outbound_config(&mesh_root(root), workload, "check"),
        inbound_config: &inbound_config(&mesh_root(root), workload, "check", policy),
    };
    Envoy::start_yaml(root, name, &edit(runtime.render(&sidecar)))
}

/// The services a native sidecar of these tests has a sealing cluster for (the
/// native runtime seals per cluster; a name without one is `not_routed`).
pub const NATIVE_CALLS: &[&str] = &[
    "check",
    "handler",
    "check-open",
    "check.default.svc",
    "check-limited",
    "check-budget",
    "check-small",
    "nosuch",
];

/// Which runtime of the filter a sidecar runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Runtime {
    /// The proxy-wasm filter (`deploy/envoy/sidecar.yaml`).
    Wasm,
    /// The native module's transport sockets (`deploy/envoy/sidecar-native.yaml`),
    /// sealing toward the services of the two-node tests.
    Native,
    /// The TLS binding (`deploy/envoy/sidecar-tls.yaml`): Envoy's TLS 1.3 with the
    /// native module as its validator, the certificate from the agent by `themis
    /// sidecar certificate`.
    Tls,
    /// The TLS binding with the Themis channel too, both ways (`themis sidecar render
    /// --transport tls,themis`): TLS with callees whose records take it, the channel
    /// with those (and callers) that speak only it.
    TlsAndChannel,
}

impl Runtime {
    /// The native module runs it (the Themis channel's sockets, or TLS's validator).
    pub fn is_native(self) -> bool {
        matches!(
            self,
            Runtime::Native | Runtime::Tls | Runtime::TlsAndChannel
        )
    }

    /// Its Envoy speaks TLS (and gets its certificate over SDS).
    pub fn speaks_tls(self) -> bool {
        matches!(self, Runtime::Tls | Runtime::TlsAndChannel)
    }

    /// A record's labels (`metadata`, if any) for an instance whose sidecar runs
    /// this: on TLS, the transport its record names (`themis.transport`); the others
    /// take the Themis channel, which a record without the label means.
    pub fn labels(self, metadata: Option<Value>) -> Option<Value> {
        match self {
            Runtime::Tls | Runtime::TlsAndChannel => {
                let takes = match self {
                    Runtime::Tls => "tls",
                    _ => "tls,themis",
                };
                let mut labels = metadata.unwrap_or_else(|| serde_json::json!({}));
                labels[themis_contracts::api::TRANSPORT_LABEL] = takes.into();
                Some(labels)
            }
            Runtime::Wasm | Runtime::Native => metadata,
        }
    }

    /// Its bootstrap for `sidecar`, with the sealing clusters of [`NATIVE_CALLS`].
    pub fn render(self, sidecar: &Sidecar<'_>) -> String {
        crate::envoy::render_on(
            sidecar,
            self,
            &crate::envoy::Additions {
                calls: NATIVE_CALLS,
                ..Default::default()
            },
        )
    }

    /// Starts Envoy on `sidecar` with this runtime and waits until it is ready.
    pub fn start(self, root: &Path, name: &str, sidecar: &Sidecar<'_>) -> Envoy {
        Envoy::start_yaml(root, name, &self.render(sidecar))
    }
}

/// Runs each named test function (`fn name(runtime: Runtime)`) on both runtimes of the
/// filter: `wasm::<name>` (the proxy-wasm filter, `deploy/envoy/sidecar.yaml`) and
/// `native::<name>` (the dynamic module, `deploy/envoy/sidecar-native.yaml`).
#[macro_export]
macro_rules! on_both_runtimes {
    ($($test:ident),* $(,)?) => {
        mod wasm {
            $(#[test] fn $test() { super::$test($crate::mesh::Runtime::Wasm) })*
        }
        mod native {
            $(#[test] fn $test() { super::$test($crate::mesh::Runtime::Native) })*
        }
    };
}

/// Runs each named test function (`fn name(runtime: Runtime)`) on the TLS binding too:
/// `tls::<name>` (`deploy/envoy/sidecar-tls.yaml`). The suite's time budget keeps this
/// to the data-path cases that matter most on it.
#[macro_export]
macro_rules! on_the_tls_binding {
    ($($test:ident),* $(,)?) => {
        mod tls {
            $(#[test] fn $test() { super::$test($crate::mesh::Runtime::Tls) })*
        }
    };
}
