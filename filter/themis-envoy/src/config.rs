//! The plugin configuration: JSON, unknown keys refused, every value checked before
//! Envoy accepts the plugin. It names clusters and policies, never key material: the
//! workload's private key comes from the local agent.

use std::time::Duration;

use serde::Deserialize;
use themis_core::{MeshName, PeerId};
use themis_trust::MeshRoot;

/// Which half of the sidecar this plugin instance is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// On the listener the local app calls: resolves, seals and sends.
    Outbound,
    /// On the listener peers call: opens, authorizes and forwards to the app.
    Inbound,
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
    /// The local workload whose key the agent hands over.
    workload: String,
    /// The service the local workload is registered as (the inbound side checks the
    /// caller's claim against the DHT).
    service: Option<String>,
    #[serde(default = "defaults::agent_cluster")]
    agent_cluster: String,
    #[serde(default = "defaults::peer_cluster")]
    peer_cluster: String,
    #[serde(default = "defaults::destination_header")]
    destination_header: String,
    app_cluster: Option<String>,
    #[serde(default = "defaults::timeout_ms")]
    timeout_ms: u64,
    #[serde(default = "defaults::resolve_ttl_secs")]
    resolve_ttl_secs: u64,
    #[serde(default = "defaults::session_ttl_secs")]
    session_ttl_secs: u64,
    #[serde(default = "defaults::revocation_poll_secs")]
    revocation_poll_secs: u64,
    policy: Option<RawPolicy>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPolicy {
    allow: Vec<RawRule>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    service: Option<String>,
    id: Option<String>,
}

mod defaults {
    pub fn agent_cluster() -> String {
        "themis_agent".into()
    }
    pub fn peer_cluster() -> String {
        "themis_peers".into()
    }
    pub fn destination_header() -> String {
        "x-envoy-original-dst-host".into()
    }
    pub fn timeout_ms() -> u64 {
        5_000
    }
    pub fn resolve_ttl_secs() -> u64 {
        10
    }
    pub fn session_ttl_secs() -> u64 {
        600
    }
    pub fn revocation_poll_secs() -> u64 {
        5
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
    /// The local workload (its key comes from the agent).
    pub workload: String,
    /// The local workload's service, claimed in outbound requests.
    pub service: Option<String>,
    /// The cluster that reaches the agent's Unix socket.
    pub agent_cluster: String,
    /// Outbound: the `ORIGINAL_DST` cluster that reaches peers, routed by
    /// [`Config::destination_header`].
    pub peer_cluster: String,
    /// The header the peer cluster routes by.
    pub destination_header: String,
    /// Inbound: the cluster of the local app.
    pub app_cluster: String,
    /// Limit on every call out (agent, peer, app).
    pub timeout: Duration,
    /// How long a resolution is reused.
    pub resolve_ttl: Duration,
    /// Outbound: a session is renewed after this long. Inbound: a session is kept
    /// this long plus a grace period.
    pub session_ttl: Duration,
    /// Inbound: who may call. `None`: every authenticated peer of the mesh.
    pub policy: Option<Policy>,
}

/// An allow list; a request is allowed if any rule matches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// The rules.
    pub allow: Vec<Rule>,
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

/// A service or workload name: a DNS label (what the agent accepts).
pub fn is_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

fn check_name(field: &'static str, name: &str) -> Result<(), ConfigError> {
    if is_name(name) {
        Ok(())
    } else {
        Err(invalid(
            field,
            format!("{name:?} is not a name (1-63 of a-z, 0-9 and '-', not at either end)"),
        ))
    }
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
        check_name("workload", &raw.workload)?;
        if let Some(service) = &raw.service {
            check_name("service", service)?;
        }
        check_nonempty("agent_cluster", &raw.agent_cluster)?;
        check_nonempty("peer_cluster", &raw.peer_cluster)?;
        check_nonempty("destination_header", &raw.destination_header)?;
        if raw
            .destination_header
            .bytes()
            .any(|b| b.is_ascii_uppercase())
        {
            return Err(invalid("destination_header", "header names are lower case"));
        }
        let app_cluster = match (raw.role, raw.app_cluster) {
            (Role::Inbound, Some(app)) if !app.is_empty() => app,
            (Role::Inbound, _) => {
                return Err(invalid(
                    "app_cluster",
                    "the inbound role needs the cluster of the local app",
                ))
            }
            (Role::Outbound, Some(_)) => {
                return Err(invalid(
                    "app_cluster",
                    "only the inbound role forwards to the app",
                ))
            }
            (Role::Outbound, None) => String::new(),
        };
        if raw.role == Role::Outbound && raw.policy.is_some() {
            return Err(invalid(
                "policy",
                "policies are enforced by the inbound role (the callee decides)",
            ));
        }
        if !(1..=600_000).contains(&raw.timeout_ms) {
            return Err(invalid("timeout_ms", "must be between 1 and 600000"));
        }
        if raw.session_ttl_secs == 0 {
            return Err(invalid("session_ttl_secs", "must be at least 1"));
        }
        let policy = raw
            .policy
            .map(|p| {
                p.allow
                    .into_iter()
                    .map(|rule| match (rule.service, rule.id) {
                        (Some(service), None) => {
                            check_name("policy.allow.service", &service)?;
                            Ok(Rule::Service(service))
                        }
                        (None, Some(id)) => PeerId::parse_in(&id, &mesh)
                            .map(Rule::Id)
                            .map_err(|e| invalid("policy.allow.id", format!("{id:?}: {e}"))),
                        _ => Err(invalid(
                            "policy.allow",
                            "each rule names exactly one of service or id",
                        )),
                    })
                    .collect::<Result<Vec<_>, _>>()
                    .map(|allow| Policy { allow })
            })
            .transpose()?;
        Ok(Config {
            role: raw.role,
            mesh,
            mesh_root,
            revocation_poll: Duration::from_secs(raw.revocation_poll_secs),
            workload: raw.workload,
            service: raw.service,
            agent_cluster: raw.agent_cluster,
            peer_cluster: raw.peer_cluster,
            destination_header: raw.destination_header,
            app_cluster,
            timeout: Duration::from_millis(raw.timeout_ms),
            resolve_ttl: Duration::from_secs(raw.resolve_ttl_secs),
            session_ttl: Duration::from_secs(raw.session_ttl_secs),
            policy,
        })
    }
}

impl Policy {
    /// Whether a peer with this id, verified as an instance of `service` (if any),
    /// may call.
    pub fn allows(&self, peer: &PeerId, service: Option<&str>) -> bool {
        self.allow.iter().any(|rule| match rule {
            Rule::Id(id) => id == peer,
            Rule::Service(s) => service == Some(s.as_str()),
        })
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
        assert_eq!(out.peer_cluster, "themis_peers");
        assert_eq!(out.destination_header, "x-envoy-original-dst-host");
        assert_eq!(out.timeout, Duration::from_secs(5));
        assert!(out.policy.is_none());
        let inbound =
            parse(r#"{"role":"inbound","mesh":"demo","mesh_root":"demo:1111111111111111111111111111111111111111111111111111111111111111","workload":"check","app_cluster":"app"}"#)
                .unwrap();
        assert_eq!(inbound.app_cluster, "app");
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
                r#"{"role":"inbound","mesh":"demo","mesh_root":"demo:1111111111111111111111111111111111111111111111111111111111111111","workload":"w"}"#,
                "app_cluster",
            ),
            (
                r#"{"role":"outbound","mesh":"demo","mesh_root":"demo:1111111111111111111111111111111111111111111111111111111111111111","workload":"w","app_cluster":"a"}"#,
                "only the inbound",
            ),
            (
                r#"{"role":"outbound","mesh":"demo","mesh_root":"demo:1111111111111111111111111111111111111111111111111111111111111111","workload":"w","timeout_ms":0}"#,
                "timeout_ms",
            ),
            (
                r#"{"role":"outbound","mesh":"demo","mesh_root":"demo:1111111111111111111111111111111111111111111111111111111111111111","workload":"w","policy":{"allow":[]}}"#,
                "enforced by the inbound",
            ),
            (
                r#"{"role":"inbound","mesh":"demo","mesh_root":"demo:1111111111111111111111111111111111111111111111111111111111111111","workload":"w","app_cluster":"a","policy":{"allow":[{}]}}"#,
                "exactly one",
            ),
            (
                r#"{"role":"inbound","mesh":"demo","mesh_root":"demo:1111111111111111111111111111111111111111111111111111111111111111","workload":"w","app_cluster":"a","policy":{"allow":[{"id":"nope"}]}}"#,
                "policy.allow.id",
            ),
            (
                r#"{"role":"inbound","mesh":"demo","mesh_root":"demo:1111111111111111111111111111111111111111111111111111111111111111","workload":"w","app_cluster":"a","policy":{"allow":[{"service":"Bad Name"}]}}"#,
                "policy.allow.service",
            ),
        ];
        for (json, expected) in cases {
            let err = parse(json).unwrap_err().to_string();
            assert!(err.contains(expected), "{json}: {err}");
        }
    }

    #[test]
    fn policies_allow_by_service_or_id() {
        let rng = ring::rand::SystemRandom::new();
        let mesh = MeshName::new("demo").unwrap();
        let peer = themis_core::Identity::generate(mesh.clone(), &rng).unwrap();
        let other = themis_core::Identity::generate(mesh, &rng).unwrap();
        let json = format!(
            r#"{{"role":"inbound","mesh":"demo","mesh_root":"demo:1111111111111111111111111111111111111111111111111111111111111111","workload":"check","app_cluster":"app",
                "policy":{{"allow":[{{"service":"handler"}},{{"id":"{}"}}]}}}}"#,
            peer.printable_id()
        );
        let policy = parse(&json).unwrap().policy.unwrap();
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
