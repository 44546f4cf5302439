//! The plugin configuration: JSON, unknown keys refused, every value checked before
//! Envoy accepts the plugin. It names clusters and policies, never key material: the
//! workload's private key comes from the local agent.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;
use themis_core::{MeshName, PeerId};
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
    #[serde(default = "defaults::timeout_ms")]
    timeout_ms: u64,
    #[serde(default = "defaults::resolve_ttl_secs")]
    resolve_ttl_secs: u64,
    #[serde(default = "defaults::down_secs")]
    down_secs: u64,
    #[serde(default = "defaults::revocation_poll_secs")]
    revocation_poll_secs: u64,
    policy: Option<RawPolicy>,
    #[serde(default)]
    canary: Vec<RawCanary>,
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
    pub fn timeout_ms() -> u64 {
        5_000
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
    /// The local workload's service, claimed on every connection it opens.
    pub service: Option<String>,
    /// The cluster that reaches the agent's Unix socket.
    pub agent_cluster: String,
    /// Limit on every call to the agent.
    pub timeout: Duration,
    /// How long a resolution (and a verified caller service) is reused.
    pub resolve_ttl: Duration,
    /// Outbound: how long an instance whose connection failed is avoided.
    pub down: Duration,
    /// Inbound: who may call. `None`: every authenticated peer of the mesh.
    pub policy: Option<Policy>,
    /// Outbound: traffic splits by instance metadata.
    pub canary: Vec<Canary>,
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
            timeout: Duration::from_millis(raw.timeout_ms),
            resolve_ttl: Duration::from_secs(raw.resolve_ttl_secs),
            down: Duration::from_secs(raw.down_secs),
            policy,
            canary,
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
        assert_eq!(out.timeout, Duration::from_secs(5));
        assert!(out.policy.is_none());
        let canary = parse(r#"{"role":"outbound","mesh_root":"demo:1111111111111111111111111111111111111111111111111111111111111111","workload":"w","canary":[{"service":"check","match":{"version":"v2"},"weight_percent":10}]}"#).unwrap();
        assert_eq!(canary.canary[0].weight_percent, 10);
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
                r#"{"role":"outbound","mesh":"demo","mesh_root":"demo:1111111111111111111111111111111111111111111111111111111111111111","workload":"w","timeout_ms":0}"#,
                "timeout_ms",
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
            r#"{{"role":"inbound","mesh":"demo","mesh_root":"demo:1111111111111111111111111111111111111111111111111111111111111111","workload":"check",
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
