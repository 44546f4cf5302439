//! The topology of `tests/protocols.rs`: two agents (node A 127.0.0.31 with workload
//! `handler`, node B 127.0.0.32 with whatever workloads a test needs), sidecar
//! Envoys rendered from `deploy/envoy/sidecar.yaml` with the additions
//! `themis sidecar render` makes (TCP listeners, canary splits), and packet captures
//! of what travels between the sidecars.
//!
//! A [`Proxy`] is a [`crate::envoy::Envoy`] started on a rendered configuration the
//! test may have extended, whose outbound port can be fixed in advance (a TCP
//! listener's tunnel cluster must name it).

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use crate::agent::Agent;
pub use crate::capture::{Capture, Captured};
use crate::envoy::{
    inbound_config, mesh_root, outbound_config, render_on, stats_of, wait_native_resolves_in,
    Additions, AppProtocol, Envoy, Sidecar, ALLOW_HANDLER,
};
use crate::mesh::{closed_port, create_workload, tempdir, two_agents, Runtime, IP_A, IP_B};
use crate::process::poll_until;

/// How long the DHT gets to make a registration resolvable.
const RESOLVE_LIMIT: Duration = Duration::from_secs(30);

/// Envoy's `server.memory_allocated` (bytes its allocator has handed out).
pub fn memory_allocated(admin: SocketAddr) -> u64 {
    *stats_of(admin)
        .get("server.memory_allocated")
        .expect("Envoy reports server.memory_allocated")
}

/// A process's resident set (VmRSS), bytes; 0 if it cannot be read.
pub fn rss(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

pub const MIB: u64 = 1024 * 1024;

/// One Envoy process on a configuration given as text: an [`Envoy`] (which starts
/// it) and the listeners of its TCP services.
pub struct Proxy {
    pub name: String,
    pub admin: SocketAddr,
    pub outbound: SocketAddr,
    pub inbound: SocketAddr,
    /// The TCP services' listeners, by service.
    pub tcp: BTreeMap<String, SocketAddr>,
    envoy: Envoy,
    /// Its configuration makes the module Envoy's TLS validator (the TLS binding).
    tls: bool,
}

impl Proxy {
    /// Starts Envoy on `yaml` and waits until it is ready.
    pub fn start(dir: &Path, name: &str, yaml: &str) -> Proxy {
        let envoy = Envoy::start_yaml(dir, name, yaml);
        let tcp = envoy
            .listeners
            .iter()
            .filter_map(|(listener, address)| {
                let service = listener.strip_prefix("themis_tcp_")?;
                Some((service.to_owned(), *address))
            })
            .collect();
        Proxy {
            name: name.to_owned(),
            admin: envoy.admin,
            outbound: envoy.outbound,
            inbound: envoy.inbound,
            tcp,
            envoy,
            tls: yaml.contains("envoy.tls.cert_validator.dynamic_modules"),
        }
    }

    pub fn pid(&self) -> u32 {
        self.envoy.pid()
    }

    pub fn stats(&self) -> BTreeMap<String, u64> {
        self.envoy.stats()
    }

    /// One stat, 0 if Envoy has none of that name (counters appear when first used).
    pub fn stat(&self, name: &str) -> u64 {
        self.stats().get(name).copied().unwrap_or(0)
    }

    /// The stats whose names contain `part`, one per line (for failure messages).
    pub fn stats_matching(&self, part: &str) -> String {
        self.stats()
            .iter()
            .filter(|(n, v)| n.contains(part) && **v != 0)
            .map(|(n, v)| format!("{n}: {v}"))
            .collect::<Vec<_>>()
            .join("\n")
    }

    pub fn memory(&self) -> u64 {
        memory_allocated(self.admin)
    }

    /// Waits until every worker's sealing and inbound filters hold the workload's key.
    pub fn wait_identity(&self) {
        self.envoy.wait_identity();
    }

    pub fn log_tail(&self, n: usize) -> String {
        self.envoy.log_tail(n)
    }

    pub fn stop(&mut self) {
        self.envoy.stop();
    }

    /// The runtime its sidecar runs.
    pub fn runtime(&self) -> Runtime {
        match (self.tls, self.envoy.is_native()) {
            (true, _) => Runtime::Tls,
            (false, true) => Runtime::Native,
            (false, false) => Runtime::Wasm,
        }
    }

    /// On the TLS binding, waits until its certificate carries its endorsement as an
    /// instance of `service` (the callee's policy refuses it until then).
    fn wait_endorsed(&self, service: &str) {
        if self.tls {
            self.envoy.wait_endorsed_certificate(service);
        }
    }

    /// Waits until it may call `service` at `endpoint`: on the native runtime, until
    /// its module's verified resolution lists it (the Wasm filter resolves on the
    /// first call).
    pub fn wait_resolves(&self, service: &str, endpoint: SocketAddr) {
        if self.envoy.is_native() {
            self.envoy.wait_native_resolves(service, endpoint);
        }
    }

    /// A counter of its sealing cluster(s) (`upstream_cx_total`, ...): the Wasm
    /// runtime's one `themis_seal`, or the native runtime's `themis_to_<service>`s,
    /// summed.
    pub fn sealing_cluster_stat(&self, name: &str) -> u64 {
        self.stats()
            .iter()
            .filter(|(n, _)| {
                [
                    "cluster.themis_seal.",
                    "cluster.themis_to_",
                    "cluster.themis_tls.",
                ]
                .iter()
                .any(|p| n.starts_with(p))
                    && n.ends_with(&format!(".{name}"))
            })
            .map(|(_, v)| *v)
            .sum()
    }

    /// The filter's counter `themis.<name>` on either runtime.
    pub fn themis_counter(&self, name: &str) -> u64 {
        self.envoy.themis_counter(name)
    }
}

/// What one sidecar is: whose, where, in front of what, with which additions.
pub struct Spec<'a> {
    pub name: &'a str,
    pub ip: &'a str,
    pub agent: &'a Agent,
    pub workload: &'a str,
    pub service: &'a str,
    pub app: SocketAddr,
    pub app_protocol: AppProtocol,
    /// Traffic splits for the outbound role (JSON array), as `--canary` takes them.
    pub canary: Option<Value>,
    /// TCP services that get a listener of their own (`--tcp SERVICE=IP:PORT`; the
    /// port is chosen here).
    pub tcp: &'a [&'a str],
    /// Who may call it (the inbound `policy`, JSON).
    pub policy: &'a str,
}

/// Makes the router's pools of sealed connections (the Wasm runtime's cluster
/// `themis_seal`, the native runtime's `themis_to_<service>`s, the TLS binding's
/// `themis_tls`) use each connection for one request only: every call is a new
/// sealed connection, with its own key agreement (or TLS handshake).
pub fn one_request_per_sealed_connection(yaml: &str) -> String {
    // The TLS binding's one cluster takes the caller's protocol.
    let tls = "        use_downstream_protocol_config:";
    if yaml.contains(tls) {
        let once = "        common_http_protocol_options: {max_requests_per_connection: 1}";
        return yaml.replace(tls, &format!("{once}\n{tls}"));
    }
    let http2 = "explicit_http_config: {http2_protocol_options: {allow_connect: true}}";
    let http1 = "explicit_http_config: {http_protocol_options: {}}";
    let anchor = |protocol: &str| format!("{protocol}\n    transport_socket:");
    assert!(
        yaml.contains(&anchor(http2)),
        "the sealing clusters' protocol options are not where they were"
    );
    let once = |protocol: &str| {
        format!("{protocol}\n        common_http_protocol_options: {{max_requests_per_connection: 1}}\n    transport_socket:")
    };
    yaml.replace(&anchor(http2), &once(http2))
        .replace(&anchor(http1), &once(http1))
}

/// The two nodes. Proxies and apps a test starts must drop before this does
/// (declare them after it).
pub struct Nodes {
    pub a: Agent,
    pub b: Agent,
    pub mesh_root: String,
    pub handler_id: String,
    /// What node A's sidecars run (and node B's, unless [`Nodes::start_mixed`]).
    pub runtime: Runtime,
    /// What node B's sidecars run.
    callee_runtime: Runtime,
    /// Envoy A's log, once started on the native runtime: a new instance is
    /// callable once Envoy A's module resolves it (see [`Nodes::wait_resolves`]).
    caller_log: RefCell<Option<PathBuf>>,
    /// Envoy A's inbound address, once started (`handler` is registered there).
    caller_inbound: std::cell::Cell<Option<SocketAddr>>,
    pub dir: tempfile::TempDir,
}

impl Nodes {
    /// Agents A and B in one ring, workload `handler` created on A; sidecars on the
    /// Wasm runtime.
    pub fn start() -> Nodes {
        Nodes::start_on(Runtime::Wasm)
    }

    /// [`Nodes::start`] with every sidecar on `runtime`.
    pub fn start_on(runtime: Runtime) -> Nodes {
        Nodes::start_mixed(runtime, runtime)
    }

    /// [`Nodes::start`] with node A's sidecars on `caller` and node B's on `callee`.
    pub fn start_mixed(caller: Runtime, callee: Runtime) -> Nodes {
        let dir = tempdir();
        let root = dir.path();
        let (a, b) = two_agents(root);
        let handler_id = create_workload(&a, "handler");
        Nodes {
            mesh_root: mesh_root(root),
            a,
            b,
            handler_id,
            runtime: caller,
            callee_runtime: callee,
            caller_log: RefCell::new(None),
            caller_inbound: std::cell::Cell::new(None),
            dir,
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Renders and starts a sidecar (without waiting for its key: see
    /// [`Proxy::wait_identity`]).
    pub fn sidecar(&self, spec: &Spec<'_>) -> Proxy {
        self.sidecar_edited(spec, |yaml| yaml.to_owned())
    }

    /// [`Nodes::sidecar`] on a configuration `edit` changed (after the additions).
    pub fn sidecar_edited(&self, spec: &Spec<'_>, edit: impl Fn(&str) -> String) -> Proxy {
        let mut outbound: Value = serde_json::from_str(&outbound_config(
            &self.mesh_root,
            spec.workload,
            spec.service,
        ))
        .unwrap();
        if let Some(canary) = &spec.canary {
            outbound["canary"] = canary.clone();
        }
        let outbound = outbound.to_string();
        let inbound = inbound_config(
            &self.mesh_root,
            spec.workload,
            spec.service,
            Some(spec.policy),
        );
        let sidecar = Sidecar {
            app_protocol: spec.app_protocol,
            ip: spec.ip,
            agent_socket: &spec.agent.dir.join("agent.sock"),
            app: spec.app,
            outbound_config: &outbound,
            inbound_config: &inbound,
        };
        let runtime = match std::ptr::eq(spec.agent, &self.b) {
            true => self.callee_runtime,
            false => self.runtime,
        };
        // The services these tests call: `check`, `handler` and the TCP services,
        // each of which gets a listener tunnelled through the outbound one.
        let mut calls = vec!["check", "handler"];
        for service in spec.tcp {
            if !calls.contains(service) {
                calls.push(service);
            }
        }
        let tcp: Vec<(&str, SocketAddr)> = spec
            .tcp
            .iter()
            .map(|s| (*s, closed_port(spec.ip)))
            .collect();
        let additions = Additions {
            calls: &calls,
            tcp: &tcp,
            outbound: (!tcp.is_empty()).then(|| closed_port(spec.ip)),
        };
        let yaml = render_on(&sidecar, runtime, &additions);
        Proxy::start(self.path(), spec.name, &edit(&yaml))
    }

    /// Envoy A: `handler`'s sidecar (no app behind it), registered as `handler` (node
    /// B verifies callers' services through the DHT) once its key is loaded.
    pub fn envoy_a(&self, canary: Option<Value>, tcp: &[&str]) -> Proxy {
        self.envoy_a_edited(canary, tcp, |yaml| yaml.to_owned())
    }

    /// [`Nodes::envoy_a`] on a configuration `edit` changed.
    pub fn envoy_a_edited(
        &self,
        canary: Option<Value>,
        tcp: &[&str],
        edit: impl Fn(&str) -> String,
    ) -> Proxy {
        let proxy = self.sidecar_edited(
            &Spec {
                name: "envoy-a",
                ip: IP_A,
                agent: &self.a,
                workload: "handler",
                service: "handler",
                app: closed_port(IP_A),
                app_protocol: AppProtocol::Http1,
                canary,
                tcp,
                policy: ALLOW_HANDLER,
            },
            edit,
        );
        proxy.wait_identity();
        let labels = self.runtime.labels(None);
        register(&self.a, "handler", "handler", proxy.inbound, labels);
        self.wait_resolves(&self.b, "handler", &[proxy.inbound]);
        proxy.wait_endorsed("handler");
        if self.runtime.is_native() {
            *self.caller_log.borrow_mut() = Some(proxy.envoy.log_path().to_owned());
        }
        self.caller_inbound.set(Some(proxy.inbound));
        proxy
    }

    /// A sidecar on node B for `workload` (created here if new) in front of `app`,
    /// registered as an instance of `service` (with `metadata`) once its key is
    /// loaded; returns when node A resolves it.
    #[allow(clippy::too_many_arguments)]
    pub fn envoy_b(
        &self,
        name: &str,
        ip: &str,
        workload_name: &str,
        service: &str,
        app: SocketAddr,
        app_protocol: AppProtocol,
        metadata: Option<Value>,
    ) -> (Proxy, String) {
        let spec = Spec {
            name,
            ip,
            agent: &self.b,
            workload: workload_name,
            service,
            app,
            app_protocol,
            canary: None,
            tcp: &[],
            policy: ALLOW_HANDLER,
        };
        self.envoy_b_from(&spec, metadata, |yaml| yaml.to_owned())
    }

    /// [`Nodes::envoy_b_serving`], its configuration changed by `edit` first.
    pub fn envoy_b_serving_edited(
        &self,
        service: &str,
        app: SocketAddr,
        app_protocol: AppProtocol,
        edit: impl Fn(&str) -> String,
    ) -> Proxy {
        let spec = Spec {
            name: "envoy-b",
            ip: IP_B,
            agent: &self.b,
            workload: service,
            service,
            app,
            app_protocol,
            canary: None,
            tcp: &[],
            policy: ALLOW_HANDLER,
        };
        self.envoy_b_from(&spec, None, edit).0
    }

    fn envoy_b_from(
        &self,
        spec: &Spec<'_>,
        metadata: Option<Value>,
        edit: impl Fn(&str) -> String,
    ) -> (Proxy, String) {
        let id = create_workload(&self.b, spec.workload);
        let proxy = self.sidecar_edited(spec, edit);
        proxy.wait_identity();
        // A native callee checks a Wasm caller that carries no endorsement yet against
        // its module's resolution of the policy's service.
        if let (Runtime::Wasm, Some(handler_at)) = (self.runtime, self.caller_inbound.get()) {
            proxy.wait_resolves("handler", handler_at);
        }
        register(
            &self.b,
            spec.service,
            spec.workload,
            proxy.inbound,
            self.runtime.labels(metadata),
        );
        self.wait_resolves(&self.a, spec.service, &[proxy.inbound]);
        proxy.wait_endorsed(spec.service);
        (proxy, id)
    }

    /// The usual Envoy B: `envoy-b` on node B's address, for a workload named like
    /// the `service` it is an instance of, in front of `app`.
    pub fn envoy_b_serving(&self, service: &str, app: SocketAddr, protocol: AppProtocol) -> Proxy {
        let (proxy, _) = self.envoy_b("envoy-b", IP_B, service, service, app, protocol, None);
        proxy
    }

    /// Waits until `agent` resolves `service` to (at least) these endpoints, and, if
    /// `agent` is node A's and Envoy A runs the native module, until the module's
    /// verified resolution lists them too.
    pub fn wait_resolves(&self, agent: &Agent, service: &str, endpoints: &[SocketAddr]) {
        self.wait_agent_resolves(agent, service, endpoints);
        if std::ptr::eq(agent, &self.a) {
            if let Some(log) = self.caller_log.borrow().as_ref() {
                for endpoint in endpoints {
                    wait_native_resolves_in(log, service, *endpoint);
                }
            }
        }
    }

    fn wait_agent_resolves(&self, agent: &Agent, service: &str, endpoints: &[SocketAddr]) {
        let mut answer = None;
        let resolved = poll_until(RESOLVE_LIMIT, || {
            answer = agent.resolve(service);
            let found: Vec<String> = answer
                .as_ref()
                .and_then(|a| a["instances"].as_array())
                .map(|all| {
                    all.iter()
                        .filter_map(|i| i["endpoint"].as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default();
            endpoints
                .iter()
                .all(|e| found.contains(&e.to_string()))
                .then_some(())
        });
        assert!(
            resolved.is_some(),
            "{} did not resolve {service} to {endpoints:?} within {RESOLVE_LIMIT:?}; \
             last answer: {answer:?}\n--- agent-a:\n{}\n--- agent-b:\n{}",
            agent.name,
            self.a.log_tail(),
            self.b.log_tail()
        );
    }
}

impl Drop for Nodes {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            self.b.terminate();
            self.a.terminate();
        }
    }
}

/// Registers `workload` as an instance of `service` at `endpoint`, with `metadata`
/// (`{"version":"v2"}`...), granting the service to the node first.
pub fn register(
    agent: &Agent,
    service: &str,
    workload: &str,
    endpoint: SocketAddr,
    metadata: Option<Value>,
) {
    agent.register_with(service, workload, &endpoint.to_string(), metadata);
}
