//! The sidecar Envoy's bootstrap for one workload: `deploy/envoy/sidecar.yaml` (the
//! Wasm filter) or `sidecar-native.yaml` (the native module), every `${PLACEHOLDER}`
//! filled in. The one renderer: `themis sidecar render` prints it for people, the demo
//! and the Kubernetes image; the test kit renders its Envoys with it.
//!
//! Pure: text in, text out. The plugin configurations are JSON text the caller wrote
//! (the tests give deliberately broken ones too; they stay as given): the sealing
//! role's is the outbound role's with `role: seal` and no routing options, and the
//! native runtime adds what its module needs (the agent's socket, the callee's
//! service per sealing cluster, HTTP/1.1 carried as is).

use std::net::SocketAddr;
use std::path::PathBuf;

use serde_json::{Map, Value};

/// The templates, as the repository has them (built in: the `themis` binary renders
/// without a checkout).
pub const WASM_TEMPLATE: &str = include_str!("../../../deploy/envoy/sidecar.yaml");
/// The native module's template.
pub const NATIVE_TEMPLATE: &str = include_str!("../../../deploy/envoy/sidecar-native.yaml");
/// The TLS binding's template (the native module as Envoy's certificate validator).
pub const TLS_TEMPLATE: &str = include_str!("../../../deploy/envoy/sidecar-tls.yaml");

/// Where a template's outbound HTTP connection manager takes an access log.
const ACCESS_LOG_MARK: &str =
    "          # No access log: `themis sidecar render --access-log PATH` adds one here.\n";

/// Who seals.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Runtime {
    /// The proxy-wasm filter (`themis_envoy.wasm`), with its internal sealing listener.
    Wasm,
    /// The Envoy 1.40 dynamic module (`libthemis_native.so`): transport sockets on a
    /// sealing cluster per called service.
    Native,
    /// The TLS binding: Envoy's TLS 1.3 socket, the native module its certificate
    /// validator, one cluster for every called service.
    Tls,
}

impl Runtime {
    /// Its built-in template.
    pub fn template(self) -> &'static str {
        match self {
            Runtime::Wasm => WASM_TEMPLATE,
            Runtime::Native => NATIVE_TEMPLATE,
            Runtime::Tls => TLS_TEMPLATE,
        }
    }
}

/// What the app behind the sidecar speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AppProtocol {
    /// HTTP/1.1 (WebSocket too).
    Http1,
    /// HTTP/2 (gRPC).
    Http2,
    /// Plain TCP: CONNECT tunnels end at its port.
    Tcp,
}

impl AppProtocol {
    /// The app cluster's protocol options (the inbound side always receives HTTP/2).
    fn options(self) -> String {
        let explicit = |o: &str| {
            format!("typed_extension_protocol_options: {{envoy.extensions.upstreams.http.v3.HttpProtocolOptions: {{\"@type\": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions, explicit_http_config: {{{o}}}}}}}")
        };
        match self {
            AppProtocol::Http1 => explicit("http_protocol_options: {}"),
            AppProtocol::Http2 => explicit("http2_protocol_options: {}"),
            AppProtocol::Tcp => "# tcp: CONNECT tunnels end at the app port".into(),
        }
    }

    /// The inbound route that ends CONNECT tunnels at the app: a TCP app's only (raw
    /// bytes in a tunnel would reach an HTTP app past the header rules).
    fn connect_route(self) -> &'static str {
        match self {
            AppProtocol::Tcp => "- {match: {connect_matcher: {}}, route: {cluster: app, timeout: 0s, upgrade_configs: [{upgrade_type: CONNECT, connect_config: {}}]}}",
            AppProtocol::Http1 | AppProtocol::Http2 => "# (no CONNECT route: this app speaks HTTP)",
        }
    }
}

impl std::str::FromStr for AppProtocol {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "http1" => Ok(AppProtocol::Http1),
            "http2" => Ok(AppProtocol::Http2),
            "tcp" => Ok(AppProtocol::Tcp),
            _ => Err(format!("{s:?}: expected http1, http2 or tcp")),
        }
    }
}

/// Where the Wasm filter's code comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FilterCode {
    /// Fetched over HTTP from `server` at `path` and refused by Envoy unless its
    /// SHA-256 is `sha256` (hex): the module is pinned.
    Fetched {
        /// The server (the `themis_module` cluster's one endpoint).
        server: SocketAddr,
        /// The URL's path (`/themis_envoy.wasm`).
        path: String,
        /// The hex SHA-256 the fetched bytes must have.
        sha256: String,
    },
    /// A local file, loaded with no check (Envoy cannot check a local file's hash).
    Unpinned(PathBuf),
}

impl FilterCode {
    /// The vm_config `code` (`FILTER_CODE`).
    fn code(&self) -> String {
        match self {
            FilterCode::Fetched {
                server,
                path,
                sha256,
            } => format!(
                r#"{{remote: {{http_uri: {{uri: "http://{server}{path}", cluster: themis_module, timeout: 10s}}, sha256: {sha256}}}}}"#
            ),
            FilterCode::Unpinned(file) => format!(
                "{{local: {{filename: {}}}}}",
                Value::from(file.display().to_string())
            ),
        }
    }

    /// The cluster the module is fetched through (`MODULE_CLUSTER`).
    fn cluster(&self) -> String {
        match self {
            FilterCode::Fetched { server, .. } => format!(
                "  - name: themis_module
    connect_timeout: 1s
    type: STATIC
    load_assignment:
      cluster_name: themis_module
      endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: {}, port_value: {}}}}}}}}}]}}]",
                server.ip(),
                server.port()
            ),
            FilterCode::Unpinned(_) => {
                "  # (none: the module is a local file, not pinned)".into()
            }
        }
    }
}

/// One sidecar: its listeners, its app, its agent and its roles' configurations.
#[derive(Clone, Debug)]
pub struct Sidecar {
    /// Who seals.
    pub runtime: Runtime,
    /// Envoy's admin port on 127.0.0.1 (0: the kernel's choice).
    pub admin_port: u16,
    /// The listener the app calls.
    pub outbound: SocketAddr,
    /// The listener peers call (the registered endpoint).
    pub inbound: SocketAddr,
    /// The local app.
    pub app: SocketAddr,
    /// What it speaks.
    pub app_protocol: AppProtocol,
    /// The local agent's Unix socket.
    pub agent_socket: PathBuf,
    /// The outbound role's plugin configuration (JSON); the sealing role's is derived.
    pub outbound_config: String,
    /// The inbound role's (JSON), with its policy.
    pub inbound_config: String,
    /// The Wasm filter's code (the Wasm runtime only).
    pub filter_code: Option<FilterCode>,
    /// The services the app calls (the native runtime: a sealing cluster each; TCP
    /// services are added).
    pub calls: Vec<String>,
    /// A listener per TCP service: connections to the address reach the service.
    pub tcp: Vec<(String, SocketAddr)>,
    /// The outbound listener's access log; none by default (a line per request costs).
    pub access_log: Option<PathBuf>,
    /// The TLS binding only: the Themis channel too, both ways, for peers that speak
    /// only it (the Wasm filter, the component, older sidecars): a pair of sealing
    /// clusters per called service, used for callees whose records do not take TLS,
    /// and an inbound chain for callers whose first bytes are not a ClientHello. TLS
    /// is preferred where both sides take it. Register the workload with the same
    /// transports (`themis register --transport tls,themis`).
    pub channel_too: bool,
    /// The TLS binding only: Envoy's own network RBAC on the inbound chains, admitting
    /// only callers whose certificate's URI SAN is one of these
    /// (`spiffe://<mesh>/svc/<service>`), beside the module's policy: both must admit.
    /// A caller on the Themis channel has no certificate, so with the channel too
    /// such a rule refuses it (fails closed). Empty: no RBAC filter.
    pub rbac_principals: Vec<String>,
}

/// Why a bootstrap was not rendered.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum RenderError {
    /// The Wasm runtime needs its module.
    #[error("the Wasm runtime needs the filter's code (a pinned URL or, said explicitly, an unpinned file)")]
    NoFilterCode,
    /// Sealing clusters per called service are the native runtime's.
    #[error("the services an app calls name the native runtime's sealing clusters; the Wasm runtime resolves any")]
    CallsNeedNative,
    /// A value would end the YAML single-quoted string it goes into.
    #[error("{0} must not contain a single quote")]
    SingleQuote(String),
    /// A name that would break the YAML it goes into.
    #[error("{0:?} is not a service name a listener or cluster can carry")]
    BadName(String),
    /// The template has a placeholder this renderer does not fill.
    #[error("the template has a placeholder nothing fills: ${{{0}}}")]
    Unfilled(String),
    /// The TLS binding asks the agent for the workload's certificate by its name.
    #[error("the outbound configuration names no workload (its \"workload\"): the TLS binding's certificate is the workload's")]
    NoWorkload,
    /// The Themis channel beside TLS is the TLS binding's option.
    #[error("the Themis channel beside TLS (--transport tls,themis) is the TLS binding's; this runtime speaks the channel alone")]
    ChannelTooNeedsTls,
    /// Envoy's RBAC on the peer's URI SAN needs a certificate: the TLS binding.
    #[error("an RBAC rule on the peer's URI SAN (--rbac-principal) needs the TLS binding: a Themis-channel peer has no certificate Envoy sees")]
    RbacNeedsTls,
    /// `access_log` given, and the template has no single place for it.
    #[error("the template has no single '{}' for the access log", ACCESS_LOG_MARK.trim())]
    NoAccessLogMark,
}

impl Sidecar {
    /// The services the app calls, HTTP and TCP, each once.
    fn called(&self) -> Vec<&str> {
        let mut calls: Vec<&str> = Vec::new();
        for service in self.calls.iter().chain(self.tcp.iter().map(|(s, _)| s)) {
            if !calls.contains(&service.as_str()) {
                calls.push(service);
            }
        }
        calls
    }

    /// The bootstrap, from the runtime's built-in template.
    pub fn render(&self) -> Result<String, RenderError> {
        self.render_template(self.runtime.template())
    }

    /// The bootstrap, from `template` (an ablation of the built-in one, say).
    pub fn render_template(&self, template: &str) -> Result<String, RenderError> {
        for service in self.calls.iter().chain(self.tcp.iter().map(|(s, _)| s)) {
            let fits = !service.is_empty()
                && service
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
            if !fits {
                return Err(RenderError::BadName(service.clone()));
            }
        }
        let agent_socket = self.agent_socket.display().to_string();
        let mut values: Vec<(&str, String)> = vec![
            ("ADMIN_PORT", self.admin_port.to_string()),
            ("OUTBOUND_ADDRESS", self.outbound.ip().to_string()),
            ("OUTBOUND_PORT", self.outbound.port().to_string()),
            ("INBOUND_ADDRESS", self.inbound.ip().to_string()),
            ("INBOUND_PORT", self.inbound.port().to_string()),
            ("APP_ADDRESS", self.app.ip().to_string()),
            ("APP_PORT", self.app.port().to_string()),
            ("APP_PROTOCOL_OPTIONS", self.app_protocol.options()),
            (
                "INBOUND_CONNECT_ROUTE",
                self.app_protocol.connect_route().into(),
            ),
        ];
        let seal = edit_json(&self.outbound_config, |map| {
            map.insert("role".into(), "seal".into());
            map.remove("canary");
        });
        if self.channel_too && self.runtime != Runtime::Tls {
            return Err(RenderError::ChannelTooNeedsTls);
        }
        if !self.rbac_principals.is_empty() && self.runtime != Runtime::Tls {
            return Err(RenderError::RbacNeedsTls);
        }
        let with_socket = |config: &str| {
            edit_json(config, |map| {
                map.insert("agent_socket".into(), agent_socket.clone().into());
            })
        };
        // The native runtime's sealing clusters (two per called service) and the
        // configuration of its inbound socket, whose HCM detects its codec: callers
        // may carry HTTP/1.1 as is.
        let seal_clusters = |calls: &[&str]| -> Result<String, RenderError> {
            let mut clusters = String::new();
            for service in calls {
                for http1 in [false, true] {
                    let config = edit_json(&with_socket(&seal), |map| {
                        map.insert("peer_service".into(), (*service).into());
                        if http1 {
                            map.insert("carries".into(), "http/1.1".into());
                        }
                    });
                    clusters.push_str(&seal_cluster(service, &config, http1)?);
                }
            }
            Ok(clusters)
        };
        let channel_inbound = || {
            edit_json(&with_socket(&self.inbound_config), |map| {
                map.insert("takes_http1".into(), true.into());
            })
        };
        let handshake_timeout = format!("{}s", handshake_timeout_secs(&self.inbound_config));
        match self.runtime {
            Runtime::Wasm => {
                if !self.calls.is_empty() {
                    return Err(RenderError::CallsNeedNative);
                }
                let code = self.filter_code.as_ref().ok_or(RenderError::NoFilterCode)?;
                values.extend([
                    ("FILTER_CODE", code.code()),
                    ("MODULE_CLUSTER", code.cluster()),
                    // A path may hold what YAML reads as syntax: quoted (JSON is YAML).
                    ("AGENT_SOCKET", Value::from(agent_socket).to_string()),
                    ("OUTBOUND_CONFIG", self.outbound_config.clone()),
                    ("SEAL_CONFIG", seal),
                    ("INBOUND_CONFIG", self.inbound_config.clone()),
                ]);
            }
            Runtime::Tls => {
                let workload = serde_json::from_str::<Value>(&self.outbound_config)
                    .ok()
                    .and_then(|c| c.get("workload")?.as_str().map(str::to_owned))
                    .ok_or(RenderError::NoWorkload)?;
                let tls = |config: &str| {
                    edit_json(&with_socket(config), |map| {
                        map.insert("transport".into(), "tls".into());
                    })
                };
                let calls = self.called();
                let outbound = edit_json(&tls(&self.outbound_config), |map| {
                    map.insert("calls".into(), calls.clone().into());
                    if self.channel_too {
                        map.insert("speaks".into(), vec!["tls", "themis"].into());
                    }
                });
                let (vhosts, clusters, listener_filters, tls_match, channel_chain) =
                    match self.channel_too {
                        false => (
                            vhost_list(&calls, tls_outbound_vhost),
                            "  # (TLS alone: no sealing clusters)".to_owned(),
                            "# (TLS alone: no listener filter)".to_owned(),
                            "# (TLS alone: one chain)".to_owned(),
                            "# (TLS alone: no channel chain)".to_owned(),
                        ),
                        true => (
                            vhost_list(&calls, negotiated_outbound_vhost),
                            seal_clusters(&calls)?,
                            tls_inspector(&handshake_timeout),
                            "filter_chain_match: {transport_protocol: tls}".to_owned(),
                            channel_chain(&channel_inbound(), &handshake_timeout)?,
                        ),
                    };
                values.extend([
                    ("OUTBOUND_CONFIG", outbound),
                    ("SEAL_CONFIG", tls(&seal)),
                    ("INBOUND_CONFIG", tls(&self.inbound_config)),
                    ("HANDSHAKE_TIMEOUT", handshake_timeout.clone()),
                    ("OUTBOUND_VHOSTS", vhosts),
                    ("SEAL_CLUSTERS", clusters),
                    ("INBOUND_LISTENER_FILTERS", listener_filters),
                    ("TLS_CHAIN_MATCH", tls_match),
                    ("INBOUND_CHANNEL_CHAIN", channel_chain),
                    // Quoted (JSON is YAML): a path may hold what YAML reads as syntax.
                    (
                        "AGENT_SOCKET",
                        Value::from(agent_socket.clone()).to_string(),
                    ),
                    ("WORKLOAD", Value::from(workload).to_string()),
                ]);
            }
            Runtime::Native => {
                let calls = self.called();
                // No calls: the app calls no mesh service (each call answered 404).
                let vhosts = vhost_list(&calls, outbound_vhost);
                values.extend([
                    ("OUTBOUND_CONFIG", with_socket(&self.outbound_config)),
                    ("INBOUND_CONFIG", channel_inbound()),
                    ("SEAL_CLUSTERS", seal_clusters(&calls)?),
                    ("HANDSHAKE_TIMEOUT", handshake_timeout),
                    ("OUTBOUND_VHOSTS", vhosts),
                ]);
            }
        }
        let mut text = template.to_owned();
        for (name, value) in &values {
            // The configurations go into single-quoted YAML strings (the sealing
            // clusters' are checked as they are written).
            if name.ends_with("_CONFIG") && value.contains('\'') {
                return Err(RenderError::SingleQuote((*name).into()));
            }
            text = text.replace(&format!("${{{name}}}"), value);
        }
        if let Some(left) = placeholder_in(&text) {
            return Err(RenderError::Unfilled(left.into()));
        }
        if !self.tcp.is_empty() {
            text = add_tcp_listeners(&text, &self.tcp, self.outbound);
        }
        if !self.rbac_principals.is_empty() {
            text = with_rbac(&text, &self.rbac_principals);
        }
        if let Some(path) = &self.access_log {
            if text.matches(ACCESS_LOG_MARK).count() != 1 {
                return Err(RenderError::NoAccessLogMark);
            }
            let path = Value::from(path.display().to_string()).to_string();
            text = text.replace(ACCESS_LOG_MARK, &access_log(&path));
        }
        Ok(text)
    }
}

/// A role's plugin configuration (JSON): its `role`, the mesh root, the workload and
/// its service, and one more field (`canary` outbound, `policy` inbound) if given.
pub fn role_config(
    role: &str,
    mesh_root: &str,
    workload: &str,
    service: Option<&str>,
    extra: Option<(&str, &Value)>,
) -> String {
    let mut config = Map::new();
    config.insert("role".into(), role.into());
    config.insert("mesh_root".into(), mesh_root.into());
    config.insert("workload".into(), workload.into());
    if let Some(service) = service {
        config.insert("service".into(), service.into());
    }
    if let Some((key, value)) = extra {
        config.insert(key.into(), value.clone());
    }
    Value::Object(config).to_string()
}

/// `config` (JSON) changed by `edit`; a deliberately broken one stays broken.
/// The inbound configuration's `handshake_timeout_secs`: the native listener closes a
/// caller not allowed by then, and the module counts that close as the deadline's.
fn handshake_timeout_secs(inbound_config: &str) -> u64 {
    serde_json::from_str::<Value>(inbound_config)
        .ok()
        .and_then(|config| config.get("handshake_timeout_secs")?.as_u64())
        .unwrap_or(themis_sidecar::config::DEFAULT_HANDSHAKE_TIMEOUT_SECS)
}

fn edit_json(config: &str, edit: impl FnOnce(&mut Map<String, Value>)) -> String {
    let Ok(mut value) = serde_json::from_str::<Value>(config) else {
        return config.to_owned();
    };
    if let Some(map) = value.as_object_mut() {
        edit(map);
    }
    value.to_string()
}

/// A native sealing cluster: ORIGINAL_DST (the pick's address), HTTP/2 (or, `http1`,
/// HTTP/1.1 as the app wrote it, for callees that take it), the module's `outbound`
/// transport socket for `service`.
fn seal_cluster(service: &str, config: &str, http1: bool) -> Result<String, RenderError> {
    if config.contains('\'') {
        return Err(RenderError::SingleQuote(format!(
            "the configuration of {service}'s sealing cluster"
        )));
    }
    let (name, protocol) = match http1 {
        true => (
            format!("themis_to_{service}_http1"),
            "http_protocol_options: {}",
        ),
        false => (
            format!("themis_to_{service}"),
            "http2_protocol_options: {allow_connect: true}",
        ),
    };
    Ok(format!(
        r#"  - name: {name}
    connect_timeout: 2s
    type: ORIGINAL_DST
    lb_policy: CLUSTER_PROVIDED
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {{{protocol}}}
{}"#,
        module_socket("outbound", config, 4)
    ))
}

/// The native module's transport socket `name` (`outbound` on a sealing cluster,
/// `inbound` on a listener's chain) with its configuration, as YAML lines indented by
/// `indent` spaces.
fn module_socket(name: &str, config: &str, indent: usize) -> String {
    let lines = [
        "transport_socket:".to_owned(),
        "  name: envoy.transport_sockets.dynamic_modules".to_owned(),
        "  typed_config:".to_owned(),
        "    \"@type\": type.googleapis.com/envoy.extensions.transport_sockets.dynamic_modules.v3.DynamicModuleTransportSocket".to_owned(),
        "    dynamic_module_config: {name: themis_native, do_not_close: true}".to_owned(),
        format!("    transport_socket_name: {name}"),
        "    implements_secure_transport: true".to_owned(),
        "    transport_socket_config:".to_owned(),
        "      \"@type\": type.googleapis.com/google.protobuf.StringValue".to_owned(),
        format!("      value: '{config}'"),
    ];
    let pad = " ".repeat(indent);
    lines.iter().map(|line| format!("{pad}{line}\n")).collect()
}

/// The outbound virtual host of `service` (by the call's host): its sealing cluster,
/// or its HTTP/1.1 one for a request the pick marked `x-themis-carry: http/1.1`.
fn outbound_vhost(service: &str) -> String {
    format!(
        "- {{name: {service}, domains: [\"{service}\", \"{service}:*\"], routes: [{{match: {{prefix: \"/\", headers: [{{name: x-themis-carry, string_match: {{exact: \"http/1.1\"}}}}]}}, {}}}, {{match: {{connect_matcher: {{}}}}, {}}}, {{match: {{prefix: \"/\"}}, {}}}]}}",
        route(&format!("themis_to_{service}_http1")),
        route(&format!("themis_to_{service}")),
        route(&format!("themis_to_{service}")),
    )
}

/// The TLS binding's outbound virtual host of `service`: the one TLS cluster.
fn tls_outbound_vhost(service: &str) -> String {
    format!(
        "- {{name: {service}, domains: [\"{service}\", \"{service}:*\"], routes: [{{match: {{connect_matcher: {{}}}}, {}}}, {{match: {{prefix: \"/\"}}, {}}}]}}",
        route("themis_tls"),
        route("themis_tls"),
    )
}

/// The outbound virtual host of `service` on a sidecar that speaks TLS and the Themis
/// channel: the pick's transport (`x-themis-transport`, which the outbound filter
/// sets from the callee's record) chooses the TLS cluster or the service's sealing
/// clusters.
fn negotiated_outbound_vhost(service: &str) -> String {
    let channel = r#"{name: x-themis-transport, string_match: {exact: "themis"}}"#;
    format!(
        "- {{name: {service}, domains: [\"{service}\", \"{service}:*\"], routes: [{{match: {{prefix: \"/\", headers: [{channel}, {{name: x-themis-carry, string_match: {{exact: \"http/1.1\"}}}}]}}, {}}}, {{match: {{connect_matcher: {{}}, headers: [{channel}]}}, {}}}, {{match: {{prefix: \"/\", headers: [{channel}]}}, {}}}, {{match: {{connect_matcher: {{}}}}, {}}}, {{match: {{prefix: \"/\"}}, {}}}]}}",
        route(&format!("themis_to_{service}_http1")),
        route(&format!("themis_to_{service}")),
        route(&format!("themis_to_{service}")),
        route("themis_tls"),
        route("themis_tls"),
    )
}

/// The inbound listener's filter that reads a ClientHello, if the first bytes are
/// one, so the filter chain match can tell TLS from the Themis channel; a caller
/// that sends nothing is closed at the handshake timeout.
fn tls_inspector(timeout: &str) -> String {
    format!(
        r#"listener_filters:
    - name: envoy.filters.listener.tls_inspector
      typed_config: {{"@type": type.googleapis.com/envoy.extensions.filters.listener.tls_inspector.v3.TlsInspector}}
    listener_filters_timeout: {timeout}"#
    )
}

/// The inbound chain of callers on the Themis channel (any first bytes but a
/// ClientHello): the native module's socket, its `peer` filter, and the TLS chain's
/// connection manager (the YAML alias `inbound_http`).
fn channel_chain(config: &str, timeout: &str) -> Result<String, RenderError> {
    if config.contains('\'') {
        return Err(RenderError::SingleQuote("INBOUND_CONFIG".into()));
    }
    Ok(format!(
        r#"- filter_chain_match: {{transport_protocol: raw_buffer}}
      transport_socket_connect_timeout: {timeout}
{}      filters:
      - name: themis.peer
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.dynamic_modules.v3.DynamicModuleNetworkFilter
          dynamic_module_config: {{name: themis_native, do_not_close: true}}
          filter_name: peer
      - *inbound_http"#,
        module_socket("inbound", config, 6)
    ))
}

/// `yaml` (a rendered TLS sidecar) with Envoy's stock network RBAC before the `peer`
/// filter of every inbound chain (the TLS one, and the channel's, where it refuses: no
/// certificate): only callers whose URI SAN is one of `principals` (each JSON-quoted:
/// any text stays one YAML string), counted under `themis_rbac.`.
pub fn with_rbac(yaml: &str, principals: &[String]) -> String {
    let peer = "      - name: themis.peer\n";
    yaml.replace(peer, &format!("{}{peer}", rbac_filter(principals)))
}

fn rbac_filter(principals: &[String]) -> String {
    let principals: Vec<String> = principals
        .iter()
        .map(|p| {
            format!(
                "{{authenticated: {{principal_name: {{exact: {}}}}}}}",
                Value::from(p.as_str())
            )
        })
        .collect();
    format!(
        r#"      - name: envoy.filters.network.rbac
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.rbac.v3.RBAC
          stat_prefix: themis_rbac
          rules:
            action: ALLOW
            policies:
              peers:
                permissions: [{{any: true}}]
                principals: [{}]
"#,
        principals.join(", ")
    )
}

/// A route to `cluster`, the pick's headers removed on the way.
fn route(cluster: &str) -> String {
    format!("route: {{cluster: {cluster}, timeout: 0s}}, request_headers_to_remove: [x-themis-destination, x-themis-expect-peer, x-themis-transport, x-themis-carry]")
}

/// The outbound virtual hosts of `calls`, as YAML list items (`[]` for none).
fn vhost_list(calls: &[&str], vhost: fn(&str) -> String) -> String {
    match calls.is_empty() {
        true => "[]".to_owned(),
        false => calls
            .iter()
            .map(|s| vhost(s))
            .collect::<Vec<_>>()
            .join("\n            "),
    }
}

/// A listener per TCP service: tcp_proxy tunnels each connection as an HTTP/2 CONNECT
/// to `<service>:<port>` through the outbound listener (so the same pick, sealing and
/// policy apply), and a cluster that reaches that listener.
fn add_tcp_listeners(
    text: &str,
    services: &[(String, SocketAddr)],
    outbound: SocketAddr,
) -> String {
    let mut listeners = String::new();
    for (service, at) in services {
        listeners.push_str(&format!(
            r#"  - name: themis_tcp_{service}
    address: {{socket_address: {{address: {}, port_value: {}}}}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.tcp_proxy
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy
          stat_prefix: themis_tcp_{service}
          cluster: themis_outbound_self
          tunneling_config: {{hostname: "{service}:{}"}}
"#,
            at.ip(),
            at.port(),
            at.port()
        ));
    }
    let cluster = format!(
        r#"  - name: themis_outbound_self
    type: STATIC
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {{http2_protocol_options: {{}}}}
    load_assignment:
      cluster_name: themis_outbound_self
      endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: {}, port_value: {}}}}}}}}}]}}]
"#,
        outbound.ip(),
        outbound.port()
    );
    match text.split_once("  clusters:\n") {
        Some((head, tail)) => format!("{head}{listeners}  clusters:\n{cluster}{tail}"),
        None => text.to_owned(),
    }
}

/// The outbound listener's access log, to `path` (JSON-quoted).
fn access_log(path: &str) -> String {
    format!(
        r#"          access_log:
          - name: envoy.access_loggers.file
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog
              path: {path}
              log_format:
                text_format_source:
                  inline_string: "[%START_TIME%] outbound %REQ(:METHOD)% http://%REQ(:AUTHORITY)%%REQ(X-ENVOY-ORIGINAL-PATH?:PATH)% original_dst=%DOWNSTREAM_LOCAL_ADDRESS% from=%DOWNSTREAM_REMOTE_ADDRESS% -> %RESPONSE_CODE% %RESPONSE_FLAGS% %DURATION%ms\n"
"#
    )
}

/// The first `${NAME}` (upper case, digits, `_`) left in `text`.
fn placeholder_in(text: &str) -> Option<&str> {
    text.match_indices("${").find_map(|(at, _)| {
        let rest = &text[at + 2..];
        let name = &rest[..rest.find('}')?];
        (!name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_'))
        .then_some(name)
    })
}

#[cfg(test)]
mod tests;
