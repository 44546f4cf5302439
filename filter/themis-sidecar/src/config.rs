//! The plugin configuration: JSON, unknown keys refused, every value checked before
//! Envoy accepts the plugin. It names clusters and policies, never key material: the
//! workload's private key comes from the local agent.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;
use themis_core::{Carries, MeshName, PeerId};
use themis_trust::MeshRoot;

/// Which part of the sidecar this plugin instance is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// HTTP filter on the listener the local app calls: resolves the service and
    /// picks the instance (by random, canary weight and health), for Envoy's router.
    Outbound,
    /// Network filter of the internal listener the router connects through: runs the
    /// key agreement with the picked instance and seals the byte stream.
    Seal,
    /// Network filter on the listener peers call: opens the stream in front of
    /// Envoy's HTTP connection manager and decides the policy per connection.
    Inbound,
}

impl Role {
    /// The name metrics and logs use.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Outbound => "outbound",
            Role::Seal => "seal",
            Role::Inbound => "inbound",
        }
    }
}

/// How peers' bytes are protected (docs/PROTOCOL.md §8): the paper's channel, or
/// Envoy's own TLS 1.3 with a self-certifying certificate that the native module's
/// validator checks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    /// The Themis channel (both runtimes; the Wasm filter speaks only this).
    #[default]
    Themis,
    /// TLS 1.3 (native runtime): the pick names the peer by its SNI name.
    Tls,
}

pub use themis_contracts::api::TRANSPORT_LABEL;

impl Transport {
    /// Its name in configurations and in [`TRANSPORT_LABEL`].
    pub fn as_str(self) -> &'static str {
        match self {
            Transport::Themis => "themis",
            Transport::Tls => "tls",
        }
    }

    /// The transport named `name`, if this build knows it.
    pub fn parse(name: &str) -> Option<Transport> {
        match name {
            "themis" => Some(Transport::Themis),
            "tls" => Some(Transport::Tls),
            _ => None,
        }
    }
}

/// The transports an instance takes, as its signed record's labels say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Takes {
    themis: bool,
    tls: bool,
}

impl Takes {
    /// From a record's labels: [`TRANSPORT_LABEL`]'s comma-separated names (names this
    /// build does not know are a later transport's, and skipped); without the label,
    /// the Themis channel alone.
    pub fn of(metadata: &themis_trust::Metadata) -> Takes {
        let Some(names) = metadata.get(TRANSPORT_LABEL) else {
            return Takes {
                themis: true,
                tls: false,
            };
        };
        let mut takes = Takes {
            themis: false,
            tls: false,
        };
        for name in names.split(',').map(str::trim) {
            match Transport::parse(name) {
                Some(Transport::Themis) => takes.themis = true,
                Some(Transport::Tls) => takes.tls = true,
                None => {}
            }
        }
        takes
    }

    /// Whether it takes `transport`.
    pub fn contains(self, transport: Transport) -> bool {
        match transport {
            Transport::Themis => self.themis,
            Transport::Tls => self.tls,
        }
    }

    /// The first of `speaks` (a caller's transports, by preference) that it takes.
    pub fn first_of(self, speaks: &[Transport]) -> Option<Transport> {
        speaks.iter().copied().find(|t| self.contains(*t))
    }

    /// The label's value for an instance that takes `transports`.
    pub fn label(transports: &[Transport]) -> String {
        let names: Vec<&str> = transports.iter().map(|t| t.as_str()).collect();
        names.join(",")
    }
}

/// The configuration as written (see `docs/FILTER.md`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    role: Role,
    /// The mesh root, `<mesh>:<hex>`: instances are accepted only with an endorsement
    /// chain from it, revocations only signed by it.
    mesh_root: String,
    /// The mesh name; optional, and then taken from the root (must agree if given).
    mesh: Option<String>,
    /// The local workload; the agent holds its key and signs for it.
    workload: String,
    /// The service the local workload is registered as (the inbound side checks the
    /// caller's claim against the DHT).
    service: Option<String>,
    #[serde(default = "defaults::agent_cluster")]
    agent_cluster: String,
    /// Native runtime: the agent's Unix socket, reached from the module's own thread.
    agent_socket: Option<String>,
    /// Native runtime, seal role: the service every connection of this cluster
    /// reaches (an upstream transport socket learns nothing else per connection).
    peer_service: Option<String>,
    /// Native runtime, sealing cluster: what its connections carry, `h2` (default)
    /// or `http/1.1` (the cluster speaks HTTP/1.1 to callees that take it as is).
    carries: Option<String>,
    /// Native runtime, inbound: the HCM behind the socket detects its codec
    /// (`codec_type: AUTO`), so callers may carry HTTP/1.1 as is.
    #[serde(default)]
    takes_http1: bool,
    /// Native runtime: the transport this sidecar's peers speak (`themis` default).
    #[serde(default)]
    transport: Transport,
    /// Outbound: the transports the sidecar has clusters for, by preference (default:
    /// `transport` alone); each call takes the first its callee's record names.
    speaks: Option<Vec<Transport>>,
    /// Native runtime, outbound on TLS: the services the app calls, kept resolved
    /// (on the Themis channel each has a sealing cluster that says so).
    #[serde(default)]
    calls: Vec<String>,
    #[serde(default = "defaults::timeout_ms")]
    timeout_ms: u64,
    /// Seal and inbound, Wasm runtime: sign handshakes with a key the agent delegated.
    #[serde(default = "defaults::delegated_keys")]
    delegated_keys: bool,
    #[serde(default = "defaults::resolve_ttl_secs")]
    resolve_ttl_secs: u64,
    #[serde(default = "defaults::down_secs")]
    down_secs: u64,
    #[serde(default = "defaults::revocation_poll_secs")]
    revocation_poll_secs: u64,
    #[serde(default = "defaults::revocations_max_age_secs")]
    revocations_max_age_secs: u64,
    policy: Option<RawPolicy>,
    #[serde(default)]
    canary: Vec<RawCanary>,
    /// Inbound: handshakes each source address may start (token bucket).
    #[serde(default = "defaults::hellos_per_source")]
    hellos_per_source: RawRate,
    /// Inbound: how far message 1's timestamp may be from this clock.
    #[serde(default = "defaults::hello_window_secs")]
    hello_window_secs: u64,
    /// Inbound: message 1s remembered per worker for replay refusal.
    #[serde(default = "defaults::replay_cache_entries")]
    replay_cache_entries: usize,
    /// Inbound: how long a caller has to prove itself and be allowed.
    #[serde(default = "defaults::handshake_timeout_secs")]
    handshake_timeout_secs: u64,
    /// Inbound: fresh Hellos answered per worker, every source together (token
    /// bucket); over it, `refused.busy`.
    #[serde(default = "defaults::handshake_budget")]
    handshake_budget: RawRate,
    /// Inbound: the percentage of `handshake_budget` reserved for known-good sources.
    #[serde(default = "defaults::known_good_share_percent")]
    known_good_share_percent: u8,
    /// Inbound: how long a source stays known good after an allowed handshake.
    #[serde(default = "defaults::known_good_secs")]
    known_good_secs: u64,
    /// Inbound: known-good sources remembered per worker.
    #[serde(default = "defaults::known_good_entries")]
    known_good_entries: usize,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRate {
    per_second: u32,
    burst: u32,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCanary {
    service: String,
    #[serde(rename = "match")]
    matches: BTreeMap<String, String>,
    weight_percent: u32,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPolicy {
    allow: Option<Vec<RawRule>>,
    /// The explicit, logged opt-out of authorization: every authenticated member of
    /// the mesh may call.
    #[serde(default)]
    allow_any_caller: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    service: Option<String>,
    id: Option<String>,
}

/// A caller's time to prove itself and be allowed, unless `handshake_timeout_secs`
/// says otherwise (the native listener's deadline is rendered from the same).
pub const DEFAULT_HANDSHAKE_TIMEOUT_SECS: u64 = 10;

mod defaults {
    pub fn agent_cluster() -> String {
        "themis_agent".into()
    }
    pub fn timeout_ms() -> u64 {
        5_000
    }
    pub fn delegated_keys() -> bool {
        true
    }
    pub fn resolve_ttl_secs() -> u64 {
        10
    }
    pub fn down_secs() -> u64 {
        10
    }
    pub fn revocation_poll_secs() -> u64 {
        5
    }
    /// Five minutes: far past an agent's restart (seconds) or a held poll (20 s),
    /// short beside a stolen key's use.
    pub fn revocations_max_age_secs() -> u64 {
        300
    }
    /// Far above what a sidecar's pooled connections need (a handful of handshakes
    /// per peer per minute), far below what a flood sends.
    pub fn hellos_per_source() -> super::RawRate {
        super::RawRate {
            per_second: 50,
            burst: 100,
        }
    }
    pub fn hello_window_secs() -> u64 {
        themis_core::guard::DEFAULT_HELLO_WINDOW_MS / 1000
    }
    pub fn replay_cache_entries() -> usize {
        themis_core::guard::DEFAULT_REPLAY_CACHE_ENTRIES
    }
    pub fn handshake_timeout_secs() -> u64 {
        super::DEFAULT_HANDSHAKE_TIMEOUT_SECS
    }
    /// Per worker: far above the handshakes pooled connections need (a handful per
    /// peer per minute), and a bound on what a flood from many addresses costs.
    pub fn handshake_budget() -> super::RawRate {
        let rate = themis_core::guard::DEFAULT_HANDSHAKE_BUDGET;
        super::RawRate {
            per_second: rate.per_second,
            burst: rate.burst,
        }
    }
    pub fn known_good_share_percent() -> u8 {
        themis_core::guard::DEFAULT_KNOWN_GOOD_PERCENT
    }
    pub fn known_good_secs() -> u64 {
        themis_core::guard::DEFAULT_KNOWN_GOOD_MS / 1000
    }
    pub fn known_good_entries() -> usize {
        themis_core::guard::DEFAULT_KNOWN_GOOD_ENTRIES
    }
}

/// A checked configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Outbound or inbound.
    pub role: Role,
    /// The mesh every peer must belong to.
    pub mesh: MeshName,
    /// Its root: what endorsements and revocations are checked against.
    pub mesh_root: MeshRoot,
    /// How often the filter fetches the agent's revocations (each verified here).
    pub revocation_poll: Duration,
    /// Inbound: past this long without reading the agent's revocations, new callers
    /// are refused (`refused.revocations_stale`): a revoked key is not let in by a
    /// feed that froze.
    pub revocations_max_age: Duration,
    /// The local workload (its key comes from the agent).
    pub workload: String,
    /// The local workload's service, claimed on every connection it opens.
    pub service: Option<String>,
    /// The cluster that reaches the agent's Unix socket.
    pub agent_cluster: String,
    /// Native runtime: the agent's Unix socket itself.
    pub agent_socket: Option<String>,
    /// Native runtime, seal role: the service this cluster's connections reach.
    pub peer_service: Option<String>,
    /// Native runtime, seal role: what this cluster's connections carry (the
    /// protocol its Envoy speaks into them).
    pub carries: Carries,
    /// Native runtime, inbound: takes HTTP/1.1 as is (its HCM is `codec_type: AUTO`),
    /// and says so to callers.
    pub takes_http1: bool,
    /// Native runtime: the Themis channel or TLS 1.3 (docs/PROTOCOL.md §8).
    pub transport: Transport,
    /// Outbound: the transports it can call over, by preference; never empty.
    pub speaks: Vec<Transport>,
    /// Native runtime, outbound on TLS: the services the app calls, kept resolved.
    pub calls: Vec<String>,
    /// Limit on every call to the agent.
    pub timeout: Duration,
    /// How long a resolution (and a verified caller service) is reused.
    pub resolve_ttl: Duration,
    /// Outbound: how long an instance whose connection failed is avoided.
    pub down: Duration,
    /// Inbound: who may call. `None` (no `policy` configured): nobody, the sidecar
    /// fails closed (`refused.no_policy`).
    pub policy: Option<Policy>,
    /// Outbound: traffic splits by instance metadata.
    pub canary: Vec<Canary>,
    /// Inbound: handshakes per source address (per worker), checked before any
    /// public-key work; over it the connection is closed (`refused.rate_limited`).
    pub hellos_per_source: themis_core::Rate,
    /// Inbound: message 1's freshness window, either way (`refused.stale`).
    pub hello_window: Duration,
    /// Inbound: message 1s remembered per worker within the window (`refused.replay`).
    pub replay_cache_entries: usize,
    /// Inbound: a connection whose caller is not allowed this long after it opened
    /// is closed (`refused.handshake_timeout`), so a caller that stalls in the
    /// handshake holds no connection (`conn::deadline`). The native runtime's close
    /// is its listener's `transport_socket_connect_timeout`, which `themis sidecar
    /// render` sets to this.
    pub handshake_timeout: Duration,
    /// Inbound: the budget of fresh Hellos answered per worker, with its share
    /// reserved for known-good sources (`refused.busy` over it).
    pub handshake_budget: themis_core::BudgetConfig,
    /// Seal and inbound, Wasm runtime: each worker signs its handshakes with a key
    /// the agent delegated to it, carrying the workload's endorsement (default);
    /// `false` keeps the sidecar keyless, the agent signing each message (one call
    /// per handshake per side; callees resolve its claims). The native runtime
    /// always delegates: a transport socket cannot wait on a call.
    pub delegated_keys: bool,
}

/// A canary release: `weight_percent` of the calls to `service` go to the instances
/// whose metadata has every label of `matches`, the rest to the others.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Canary {
    /// The service split.
    pub service: String,
    /// The labels that make an instance part of the canary.
    pub matches: BTreeMap<String, String>,
    /// 0..=100.
    pub weight_percent: u32,
}

/// Who may call the inbound side.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Policy {
    /// An allow list; a caller is allowed if any rule matches.
    Allow(Vec<Rule>),
    /// Every authenticated member of the mesh (`"allow_any_caller": true`): an
    /// explicit choice, warned about at start and shown as the gauge
    /// `themis.inbound.allow_any_caller`.
    AnyCaller,
}

/// One allow rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rule {
    /// Peers verified as instances of this service.
    Service(String),
    /// This one peer.
    Id(PeerId),
}

/// What is wrong with a configuration: said in Envoy's log when it rejects the plugin.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    /// Not JSON, or not the expected shape (unknown key, wrong type, missing key).
    #[error("themis filter configuration: {0}")]
    Json(String),
    /// No configuration at all.
    #[error(
        "themis filter configuration is empty: it needs at least role, mesh_root and workload"
    )]
    Empty,
    /// A field with a bad value.
    #[error("themis filter configuration: {field}: {reason}")]
    Invalid {
        /// The field.
        field: &'static str,
        /// Why.
        reason: String,
    },
}

fn invalid(field: &'static str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        field,
        reason: reason.into(),
    }
}

/// A service or workload name: the one rule the agent applies too (a DNS subdomain
/// such as `check.default.svc`, see `themis_contracts::names`). Names never reach a
/// stat name (those are `themis.<role>.<fixed name>`), so dots need no escaping.
pub use themis_contracts::names::is_name;

fn check_name(field: &'static str, name: &str) -> Result<(), ConfigError> {
    let checked = if field == "workload" {
        themis_contracts::WorkloadName::check(name)
    } else {
        themis_contracts::ServiceName::check(name)
    };
    checked.map_err(|e| invalid(field, e.to_string()))
}

fn check_nonempty(field: &'static str, value: &str) -> Result<(), ConfigError> {
    if value.is_empty() {
        Err(invalid(field, "must not be empty"))
    } else {
        Ok(())
    }
}

impl Config {
    /// Parses and checks the plugin configuration.
    pub fn parse(bytes: &[u8]) -> Result<Config, ConfigError> {
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Err(ConfigError::Empty);
        }
        let raw: Raw =
            serde_json::from_slice(bytes).map_err(|e| ConfigError::Json(e.to_string()))?;
        let mesh_root: MeshRoot = raw
            .mesh_root
            .parse()
            .map_err(|e: themis_trust::RootError| invalid("mesh_root", e.to_string()))?;
        let mesh = match &raw.mesh {
            Some(name) => MeshName::new(name).map_err(|e| invalid("mesh", e.to_string()))?,
            None => mesh_root.mesh.clone(),
        };
        if mesh != mesh_root.mesh {
            return Err(invalid(
                "mesh",
                format!(
                    "{mesh} differs from the mesh root's mesh {}",
                    mesh_root.mesh
                ),
            ));
        }
        if raw.revocation_poll_secs == 0 {
            return Err(invalid("revocation_poll_secs", "must be at least 1"));
        }
        if !(60..=86_400).contains(&raw.revocations_max_age_secs) {
            return Err(invalid(
                "revocations_max_age_secs",
                "must be from 60 (past an agent's restart) to 86400",
            ));
        }
        check_name("workload", &raw.workload)?;
        if let Some(service) = &raw.service {
            check_name("service", service)?;
        }
        check_nonempty("agent_cluster", &raw.agent_cluster)?;
        if let Some(socket) = &raw.agent_socket {
            check_nonempty("agent_socket", socket)?;
        }
        if let Some(peer_service) = &raw.peer_service {
            if raw.role != Role::Seal {
                return Err(invalid(
                    "peer_service",
                    "names the service of a sealing cluster (the seal role)",
                ));
            }
            check_name("peer_service", peer_service)?;
        }
        let carries = match raw.carries.as_deref() {
            None | Some("h2") => Carries::HTTP2,
            Some("http/1.1") => Carries::HTTP1,
            Some(other) => {
                return Err(invalid(
                    "carries",
                    format!("{other:?}: a sealing cluster carries \"h2\" or \"http/1.1\""),
                ))
            }
        };
        if raw.carries.is_some() && raw.peer_service.is_none() {
            return Err(invalid(
                "carries",
                "says what a native sealing cluster carries (with peer_service)",
            ));
        }
        if raw.takes_http1 && (raw.role != Role::Inbound || raw.agent_socket.is_none()) {
            return Err(invalid(
                "takes_http1",
                "says that a native inbound socket's HCM takes HTTP/1.1 (role inbound, with agent_socket); a Wasm callee takes HTTP/2 only",
            ));
        }
        if raw.transport == Transport::Tls && raw.agent_socket.is_none() {
            return Err(invalid(
                "transport",
                "tls is the native runtime's (with agent_socket): Envoy's TLS socket and the module's validator; the Wasm filter speaks the Themis channel",
            ));
        }
        if let Some(speaks) = &raw.speaks {
            let each_once = (0..speaks.len()).all(|i| !speaks[..i].contains(&speaks[i]));
            if raw.role != Role::Outbound
                || speaks.is_empty()
                || !each_once
                || (speaks.contains(&Transport::Tls) && raw.transport != Transport::Tls)
            {
                return Err(invalid(
                    "speaks",
                    "lists, once each, the transports an outbound sidecar has clusters for (tls only with transport tls)",
                ));
            }
        }
        if !raw.calls.is_empty() && (raw.role != Role::Outbound || raw.transport != Transport::Tls)
        {
            return Err(invalid(
                "calls",
                "lists the services a TLS sidecar's app calls (role outbound, transport tls); on the Themis channel each has its sealing cluster",
            ));
        }
        if let Some(bad) = raw.calls.iter().find(|c| !is_name(c)) {
            return Err(invalid("calls", format!("{bad:?} is not a service name")));
        }
        if raw.role != Role::Inbound && raw.policy.is_some() {
            return Err(invalid(
                "policy",
                "policies are enforced by the inbound role (the callee decides)",
            ));
        }
        if raw.role != Role::Outbound && !raw.canary.is_empty() {
            return Err(invalid("canary", "traffic splits are the outbound role's"));
        }
        if !(1..=600_000).contains(&raw.timeout_ms) {
            return Err(invalid("timeout_ms", "must be between 1 and 600000"));
        }
        if raw.hellos_per_source.per_second == 0 || raw.hellos_per_source.burst == 0 {
            return Err(invalid(
                "hellos_per_source",
                "per_second and burst must be at least 1",
            ));
        }
        if !(1..=3_600).contains(&raw.hello_window_secs) {
            return Err(invalid("hello_window_secs", "must be between 1 and 3600"));
        }
        if !(1..=300).contains(&raw.handshake_timeout_secs) {
            return Err(invalid(
                "handshake_timeout_secs",
                "must be between 1 and 300",
            ));
        }
        let budget = raw.handshake_budget;
        if budget.per_second == 0 || budget.burst == 0 {
            return Err(invalid(
                "handshake_budget",
                "per_second and burst must be at least 1",
            ));
        }
        let share = raw.known_good_share_percent;
        if share > themis_core::guard::MAX_KNOWN_GOOD_PERCENT {
            return Err(invalid(
                "known_good_share_percent",
                format!(
                    "must be 0 to {} (at 100 no new peer could ever connect)",
                    themis_core::guard::MAX_KNOWN_GOOD_PERCENT
                ),
            ));
        }
        let burst_of = |percent: u8| u64::from(budget.burst) * u64::from(percent) / 100;
        if (share > 0 && burst_of(share) == 0) || burst_of(100 - share) == 0 {
            return Err(invalid(
                "handshake_budget",
                format!(
                    "a burst of {} cannot be split {share} % / {} %: each share needs at least one handshake",
                    budget.burst,
                    100 - share
                ),
            ));
        }
        if !(1..=86_400).contains(&raw.known_good_secs) {
            return Err(invalid("known_good_secs", "must be between 1 and 86400"));
        }
        if raw.resolve_ttl_secs == 0 {
            // 0 made every request a resolution and connections loop on agent calls
            // (found in review).
            return Err(invalid(
                "resolve_ttl_secs",
                "must be at least 1 (a resolution is cached this long)",
            ));
        }
        if !(1..=1 << 16).contains(&raw.known_good_entries) {
            return Err(invalid("known_good_entries", "must be between 1 and 65536"));
        }
        if raw.replay_cache_entries > 1 << 20 {
            return Err(invalid(
                "replay_cache_entries",
                "must be at most 1048576 (0 turns the cache off)",
            ));
        }
        let canary = raw
            .canary
            .into_iter()
            .map(|c| {
                check_name("canary.service", &c.service)?;
                if c.weight_percent > 100 {
                    return Err(invalid("canary.weight_percent", "must be 0 to 100"));
                }
                if c.matches.is_empty() {
                    return Err(invalid("canary.match", "name at least one label"));
                }
                Ok(Canary {
                    service: c.service,
                    matches: c.matches,
                    weight_percent: c.weight_percent,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let policy = raw.policy.map(|p| parse_policy(p, &mesh)).transpose()?;
        Ok(Config {
            role: raw.role,
            mesh,
            mesh_root,
            revocation_poll: Duration::from_secs(raw.revocation_poll_secs),
            revocations_max_age: Duration::from_secs(raw.revocations_max_age_secs),
            agent_socket: raw.agent_socket,
            peer_service: raw.peer_service,
            carries,
            takes_http1: raw.takes_http1,
            transport: raw.transport,
            speaks: raw.speaks.unwrap_or_else(|| vec![raw.transport]),
            calls: raw.calls,
            workload: raw.workload,
            service: raw.service,
            agent_cluster: raw.agent_cluster,
            timeout: Duration::from_millis(raw.timeout_ms),
            delegated_keys: raw.delegated_keys,
            resolve_ttl: Duration::from_secs(raw.resolve_ttl_secs),
            down: Duration::from_secs(raw.down_secs),
            policy,
            canary,
            hellos_per_source: themis_core::Rate {
                per_second: raw.hellos_per_source.per_second,
                burst: raw.hellos_per_source.burst,
            },
            hello_window: Duration::from_secs(raw.hello_window_secs),
            replay_cache_entries: raw.replay_cache_entries,
            handshake_timeout: Duration::from_secs(raw.handshake_timeout_secs),
            handshake_budget: themis_core::BudgetConfig {
                rate: themis_core::Rate {
                    per_second: budget.per_second,
                    burst: budget.burst,
                },
                known_good_percent: share,
                known_good_ms: raw.known_good_secs * 1000,
                known_good_entries: raw.known_good_entries,
            },
        })
    }
}

fn parse_policy(raw: RawPolicy, mesh: &MeshName) -> Result<Policy, ConfigError> {
    match (raw.allow, raw.allow_any_caller) {
        (None, true) => Ok(Policy::AnyCaller),
        (Some(_), true) => Err(invalid(
            "policy",
            "allow_any_caller already admits every caller of the mesh: drop allow, or drop allow_any_caller to admit only the callers allow lists",
        )),
        (None, false) => Err(invalid(
            "policy",
            "name who may call: allow (a list of rules, [] for nobody) or \"allow_any_caller\": true",
        )),
        (Some(rules), false) => rules
            .into_iter()
            .map(|rule| match (rule.service, rule.id) {
                (Some(service), None) => {
                    check_name("policy.allow.service", &service)?;
                    Ok(Rule::Service(service))
                }
                (None, Some(id)) => PeerId::parse_in(&id, mesh)
                    .map(Rule::Id)
                    .map_err(|e| invalid("policy.allow.id", format!("{id:?}: {e}"))),
                _ => Err(invalid(
                    "policy.allow",
                    "each rule names exactly one of service or id",
                )),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Policy::Allow),
    }
}

impl Policy {
    /// Whether a peer with this id, verified as an instance of `service` (if any),
    /// may call.
    pub fn allows(&self, peer: &PeerId, service: Option<&str>) -> bool {
        match self {
            Policy::AnyCaller => true,
            Policy::Allow(rules) => rules.iter().any(|rule| match rule {
                Rule::Id(id) => id == peer,
                Rule::Service(s) => service == Some(s.as_str()),
            }),
        }
    }

    /// Whether one of the rules names this id (no lookup needed to allow it).
    pub fn names_id(&self, peer: &PeerId) -> bool {
        matches!(self, Policy::Allow(rules) if rules.contains(&Rule::Id(*peer)))
    }

    /// Whether the decision can depend on the caller being an instance of
    /// `service`: only then is a claim of it worth a lookup.
    pub fn names_service(&self, service: &str) -> bool {
        matches!(self, Policy::Allow(rules)
            if rules.iter().any(|r| matches!(r, Rule::Service(s) if s == service)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<Config, ConfigError> {
        Config::parse(json.as_bytes())
    }

    #[test]
    fn minimal_configs_get_working_defaults() {
        let out = parse(r#"{"role":"outbound","mesh":"demo","mesh_root":"demo:1111111111111111111111111111111111111111111111111111111111111111","workload":"handler"}"#).unwrap();
        assert_eq!(out.role, Role::Outbound);
        assert_eq!(out.agent_cluster, "themis_agent");
        assert_eq!(out.timeout, Duration::from_secs(5));
        assert!(out.policy.is_none());
        assert_eq!(
            out.hellos_per_source,
            themis_core::Rate {
                per_second: 50,
                burst: 100
            }
        );
        assert_eq!(out.hello_window, Duration::from_secs(60));
        assert_eq!(out.replay_cache_entries, 4096);
        assert_eq!(
            out.handshake_budget,
            themis_core::BudgetConfig {
                rate: themis_core::Rate {
                    per_second: 200,
                    burst: 400
                },
                known_good_percent: 50,
                known_good_ms: 600_000,
                known_good_entries: 1024,
            }
        );
        let canary = parse(r#"{"role":"outbound","mesh_root":"demo:1111111111111111111111111111111111111111111111111111111111111111","workload":"w","canary":[{"service":"check","match":{"version":"v2"},"weight_percent":10}]}"#).unwrap();
        assert_eq!(canary.canary[0].weight_percent, 10);
        let seal = r#"{"role":"seal","mesh_root":"demo:1111111111111111111111111111111111111111111111111111111111111111","workload":"w","peer_service":"check""#;
        assert_eq!(parse(&format!("{seal}}}")).unwrap().carries, Carries::HTTP2);
        let http1 = parse(&format!(r#"{seal},"carries":"http/1.1"}}"#)).unwrap();
        assert_eq!(http1.carries, Carries::HTTP1);
    }

    #[test]
    fn a_records_transports_are_its_label_or_else_the_channel_alone() {
        let labels = |value: Option<&str>| {
            let mut metadata = themis_trust::Metadata::new();
            if let Some(value) = value {
                metadata.insert(TRANSPORT_LABEL.into(), value.into());
            }
            Takes::of(&metadata)
        };
        let both = [Transport::Tls, Transport::Themis];
        // An older peer's record: the channel, whatever the caller prefers.
        assert_eq!(labels(None).first_of(&both), Some(Transport::Themis));
        assert_eq!(labels(None).first_of(&[Transport::Tls]), None);
        // The caller's preference picks among what the callee takes.
        let takes = labels(Some("themis, tls"));
        assert_eq!(takes.first_of(&both), Some(Transport::Tls));
        assert_eq!(
            takes.first_of(&[Transport::Themis, Transport::Tls]),
            Some(Transport::Themis)
        );
        // A TLS-only callee is never called over the channel.
        assert_eq!(labels(Some("tls")).first_of(&[Transport::Themis]), None);
        // A later transport's name is skipped; none known: nothing to call it over.
        assert_eq!(
            labels(Some("quic,tls")).first_of(&both),
            Some(Transport::Tls)
        );
        assert_eq!(labels(Some("quic")).first_of(&both), None);
        assert_eq!(labels(Some("")).first_of(&both), None);
        assert_eq!(Takes::label(&both), "tls,themis");
        assert_eq!(labels(Some(&Takes::label(&both))), takes);
    }

    #[test]
    fn an_outbound_sidecar_speaks_its_transport_or_the_list_it_was_given() {
        let base = r#""role":"outbound","mesh_root":"demo:1111111111111111111111111111111111111111111111111111111111111111","workload":"w""#;
        let tls = format!(r#"{base},"agent_socket":"/a.sock","transport":"tls""#);
        assert_eq!(
            parse(&format!("{{{base}}}")).unwrap().speaks,
            [Transport::Themis]
        );
        assert_eq!(
            parse(&format!("{{{tls}}}")).unwrap().speaks,
            [Transport::Tls]
        );
        let both = parse(&format!(r#"{{{tls},"speaks":["tls","themis"]}}"#)).unwrap();
        assert_eq!(both.speaks, [Transport::Tls, Transport::Themis]);
        for bad in [
            format!(r#"{{{tls},"speaks":[]}}"#),
            format!(r#"{{{tls},"speaks":["tls","tls"]}}"#),
            format!(r#"{{{base},"speaks":["tls"]}}"#),
        ] {
            let e = parse(&bad).unwrap_err().to_string();
            assert!(e.contains("speaks"), "{bad}: {e}");
        }
    }

    #[test]
    fn bad_configs_say_what_is_wrong() {
        let cases = [
            ("", "empty"),
            ("not json", "expected"),
            (
                r#"{"role":"sideways","mesh":"demo","mesh_root":"demo:1111111111111111111111111111111111111111111111111111111111111111","workload":"w"}"#,
                "unknown variant",
            ),
            (
                r#"{"role":"outbound","mesh":"demo","mesh_root":"demo:1111111111111111111111111111111111111111111111111111111111111111"}"#,
                "missing field `workload`",
            ),
            (
                r#"{"role":"outbound","mesh":"demo","mesh_root":"demo:1111111111111111111111111111111111111111111111111111111111111111","workload":"w","private_key":"x"}"#,
                "unknown field `private_key`",
            ),
            (
                r#"{"role":"outbound","mesh":"","mesh_root":"demo:1111111111111111111111111111111111111111111111111111111111111111","workload":"w"}"#,
                "mesh",
            ),
            (
                r#"{"role":"outbound","mesh":"demo","mesh_root":"demo:1111111111111111111111111111111111111111111111111111111111111111","workload":"../etc"}"#,
                "workload",
            ),
            (
                r#"{"role":"outbound","mesh_root":"demo:1111111111111111111111111111111111111111111111111111111111111111","workload":"w","canary":[{"service":"check","match":{"version":"v2"},"weight_percent":101}]}"#,
                "weight_percent",
            ),
            (
                r#"{"role":"seal","mesh_root":"demo:1111111111111111111111111111111111111111111111111111111111111111","workload":"w","canary":[{"service":"check","match":{"version":"v2"},"weight_percent":1}]}"#,
                "outbound role",
            ),
            (
                r#"{"role":"seal","mesh_root":"demo:1111111111111111111111111111111111111111111111111111111111111111","workload":"w","peer_service":"check","carries":"tcp"}"#,
                "a sealing cluster carries",
            ),
            (
                r#"{"role":"seal","mesh_root":"demo:1111111111111111111111111111111111111111111111111111111111111111","workload":"w","carries":"http/1.1"}"#,
                "with peer_service",
            ),
            (
                r#"{"role":"inbound","mesh_root":"demo:1111111111111111111111111111111111111111111111111111111111111111","workload":"w","takes_http1":true}"#,
                "a Wasm callee takes HTTP/2 only",
            ),
            (
                r#"{"role":"outbound","mesh":"demo","mesh_root":"demo:1111111111111111111111111111111111111111111111111111111111111111","workload":"w","timeout_ms":0}"#,
                "timeout_ms",
            ),
            (
                r#"{"role":"outbound","mesh":"demo","mesh_root":"demo:1111111111111111111111111111111111111111111111111111111111111111","workload":"w","resolve_ttl_secs":0}"#,
                "resolve_ttl_secs: must be at least 1",
            ),
            (
                r#"{"role":"inbound","mesh_root":"demo:1111111111111111111111111111111111111111111111111111111111111111","workload":"w","hellos_per_source":{"per_second":0,"burst":1}}"#,
                "hellos_per_source",
            ),
            (
                r#"{"role":"inbound","mesh_root":"demo:1111111111111111111111111111111111111111111111111111111111111111","workload":"w","hellos_per_source":{"per_second":1}}"#,
                "missing field `burst`",
            ),
            (
                r#"{"role":"inbound","mesh_root":"demo:1111111111111111111111111111111111111111111111111111111111111111","workload":"w","hello_window_secs":0}"#,
                "hello_window_secs",
            ),
            (
                r#"{"role":"inbound","mesh_root":"demo:1111111111111111111111111111111111111111111111111111111111111111","workload":"w","handshake_timeout_secs":0}"#,
                "handshake_timeout_secs",
            ),
            (
                r#"{"role":"inbound","mesh_root":"demo:1111111111111111111111111111111111111111111111111111111111111111","workload":"w","handshake_timeout_secs":301}"#,
                "handshake_timeout_secs",
            ),
            (
                r#"{"role":"inbound","mesh_root":"demo:1111111111111111111111111111111111111111111111111111111111111111","workload":"w","handshake_budget":{"per_second":0,"burst":4}}"#,
                "handshake_budget: per_second",
            ),
            (
                r#"{"role":"inbound","mesh_root":"demo:1111111111111111111111111111111111111111111111111111111111111111","workload":"w","handshake_budget":{"per_second":1,"burst":1}}"#,
                "cannot be split 50 % / 50 %",
            ),
            (
                r#"{"role":"inbound","mesh_root":"demo:1111111111111111111111111111111111111111111111111111111111111111","workload":"w","known_good_share_percent":100}"#,
                "known_good_share_percent: must be 0 to 90",
            ),
            (
                r#"{"role":"inbound","mesh_root":"demo:1111111111111111111111111111111111111111111111111111111111111111","workload":"w","known_good_secs":0}"#,
                "known_good_secs",
            ),
            (
                r#"{"role":"inbound","mesh_root":"demo:1111111111111111111111111111111111111111111111111111111111111111","workload":"w","known_good_entries":0}"#,
                "known_good_entries",
            ),
            (
                r#"{"role":"outbound","mesh":"demo","mesh_root":"demo:1111111111111111111111111111111111111111111111111111111111111111","workload":"w","policy":{"allow":[]}}"#,
                "enforced by the inbound",
            ),
            (
                r#"{"role":"inbound","mesh":"demo","mesh_root":"demo:1111111111111111111111111111111111111111111111111111111111111111","workload":"w","policy":{"allow":[{}]}}"#,
                "exactly one",
            ),
            (
                r#"{"role":"inbound","mesh":"demo","mesh_root":"demo:1111111111111111111111111111111111111111111111111111111111111111","workload":"w","policy":{"allow":[{"id":"nope"}]}}"#,
                "policy.allow.id",
            ),
            (
                r#"{"role":"inbound","mesh":"demo","mesh_root":"demo:1111111111111111111111111111111111111111111111111111111111111111","workload":"w","policy":{"allow":[{"service":"Bad Name"}]}}"#,
                "policy.allow.service",
            ),
            (
                r#"{"role":"inbound","mesh_root":"demo:1111111111111111111111111111111111111111111111111111111111111111","workload":"w","policy":{}}"#,
                "policy: name who may call",
            ),
            (
                r#"{"role":"inbound","mesh_root":"demo:1111111111111111111111111111111111111111111111111111111111111111","workload":"w","policy":{"allow_any_caller":false}}"#,
                "policy: name who may call",
            ),
            (
                r#"{"role":"inbound","mesh_root":"demo:1111111111111111111111111111111111111111111111111111111111111111","workload":"w","policy":{"allow_any_caller":true,"allow":[]}}"#,
                "allow_any_caller already admits every caller",
            ),
            (
                r#"{"role":"inbound","mesh_root":"demo:1111111111111111111111111111111111111111111111111111111111111111","workload":"w","policy":{"allow_any_caller":"yes"}}"#,
                "invalid type",
            ),
        ];
        for (json, expected) in cases {
            let err = parse(json).unwrap_err().to_string();
            assert!(err.contains(expected), "{json}: {err}");
        }
    }

    #[test]
    fn the_handshake_budget_and_its_known_good_share_are_configurable() {
        let out = parse(r#"{"role":"inbound","mesh_root":"demo:1111111111111111111111111111111111111111111111111111111111111111","workload":"w","handshake_budget":{"per_second":2,"burst":10},"known_good_share_percent":90,"known_good_secs":30,"known_good_entries":8}"#).unwrap();
        assert_eq!(
            out.handshake_budget,
            themis_core::BudgetConfig {
                rate: themis_core::Rate {
                    per_second: 2,
                    burst: 10
                },
                known_good_percent: 90,
                known_good_ms: 30_000,
                known_good_entries: 8,
            }
        );
        // No reserved share at all: one budget for every source.
        let open = parse(r#"{"role":"inbound","mesh_root":"demo:1111111111111111111111111111111111111111111111111111111111111111","workload":"w","handshake_budget":{"per_second":1,"burst":1},"known_good_share_percent":0}"#).unwrap();
        assert_eq!(open.handshake_budget.known_good_percent, 0);
    }

    /// The filter takes exactly the names the agent takes: a dotted service such as
    /// `check.default.svc` registers at the agent, so the outbound filter must route
    /// it (it answered 400 when the filter had a rule of its own).
    #[test]
    fn names_are_the_agents_names() {
        use themis_contracts::names::{vectors, ServiceName, WorkloadName};
        let config = |workload: &str, service: &str| {
            parse(&format!(
                r#"{{"role":"inbound","mesh_root":"demo:1111111111111111111111111111111111111111111111111111111111111111","workload":"{workload}","service":"{service}","policy":{{"allow":[{{"service":"{service}"}}]}}}}"#
            ))
        };
        for name in vectors::valid() {
            assert!(ServiceName::new(&name).is_ok() && WorkloadName::new(&name).is_ok());
            assert!(
                is_name(&name),
                "the filter refuses {name:?}, which the agent takes"
            );
            config(&name, &name).unwrap_or_else(|e| panic!("{name:?}: {e}"));
        }
        for name in vectors::invalid() {
            assert!(ServiceName::new(&name).is_err() && WorkloadName::new(&name).is_err());
            assert!(
                !is_name(&name),
                "the filter takes {name:?}, which the agent refuses"
            );
            if !name.contains(['"', '\\', '\0']) {
                assert!(config(&name, "check").is_err(), "workload {name:?}");
                assert!(config("check", &name).is_err(), "service {name:?}");
            }
        }
        assert!(is_name("check.default.svc"));
    }

    /// No policy denies (the filter fails closed); admitting anyone must be said.
    #[test]
    fn admitting_any_caller_is_explicit() {
        let base = r#"{"role":"inbound","mesh_root":"demo:1111111111111111111111111111111111111111111111111111111111111111","workload":"w""#;
        assert_eq!(parse(&format!("{base}}}")).unwrap().policy, None);
        let open = parse(&format!(r#"{base},"policy":{{"allow_any_caller":true}}}}"#)).unwrap();
        assert_eq!(open.policy, Some(Policy::AnyCaller));
        let nobody = parse(&format!(r#"{base},"policy":{{"allow":[]}}}}"#)).unwrap();
        assert_eq!(nobody.policy, Some(Policy::Allow(vec![])));
        let any = PeerId([7; 32]);
        assert!(Policy::AnyCaller.allows(&any, None));
        assert!(!Policy::Allow(vec![]).allows(&any, Some("handler")));
        assert!(!Policy::AnyCaller.names_service("handler"));
    }

    #[test]
    fn policies_allow_by_service_or_id() {
        let rng = ring::rand::SystemRandom::new();
        let mesh = MeshName::new("demo").unwrap();
        let peer = themis_core::Identity::generate(mesh.clone(), &rng).unwrap();
        let other = themis_core::Identity::generate(mesh, &rng).unwrap();
        let json = format!(
            r#"{{"role":"inbound","mesh":"demo","mesh_root":"demo:1111111111111111111111111111111111111111111111111111111111111111","workload":"check",
                "policy":{{"allow":[{{"service":"handler"}},{{"id":"{}"}}]}}}}"#,
            peer.printable_id()
        );
        let policy = parse(&json).unwrap().policy.unwrap();
        assert!(policy.names_id(&peer.id()) && !policy.names_id(&other.id()));
        assert!(policy.names_service("handler") && !policy.names_service("intruder"));
        assert!(policy.allows(&other.id(), Some("handler")));
        assert!(!policy.allows(&other.id(), Some("intruder")));
        assert!(!policy.allows(&other.id(), None));
        assert!(policy.allows(&peer.id(), None));
        // An id of another mesh is refused at configuration time.
        let foreign = json
            .replace("\"mesh\":\"demo\",", "")
            .replace("demo:", "other:");
        assert!(parse(&foreign).is_err());
    }
}
