//! The JSON bodies of the agent's local API ([`crate::paths`]): what the agent sends
//! and reads, and what its clients (the `themis` tool, the Envoy filter, the
//! component) read and send. Answers tolerate unknown fields (an agent may add some);
//! request bodies refuse them (a typo is an error, not a silently ignored setting).
//!
//! Two bodies carry eBPF capture settings and status, which are the Linux-only
//! `themis-capture` crate's types: they are type parameters here ([`Register`],
//! [`Registered`]), so this crate stays `no_std`.

use alloc::collections::BTreeMap;
use alloc::string::String;
use alloc::vec::Vec;
use core::net::SocketAddr;

use serde::{Deserialize, Serialize};
use zeroize::Zeroizing;

use crate::names::{ServiceName, WorkloadName};

/// An instance's labels (e.g. `version`), as its record states them.
pub type Metadata = BTreeMap<String, String>;

/// Every error answer: `{"error": "<for people>", "reason": "<stable, for programs>"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// What went wrong, in words a user can act on.
    pub error: String,
    /// A stable reason code (`bad_request`, `not_found`, `not_granted`, ...).
    pub reason: String,
}

/// `GET /v1/status`: this node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {
    /// The node's printable id.
    pub id: String,
    /// The mesh.
    pub mesh: String,
    /// The mesh root (`<mesh>:<hex>`).
    pub mesh_root: String,
    /// The services this node holds a grant for.
    pub granted: Vec<String>,
    /// Revocations known.
    pub revocations: u64,
    /// The DHT listener.
    pub listen: SocketAddr,
    /// Whether the node is in the ring.
    pub joined: bool,
    /// DHT objects held.
    pub objects: u64,
    /// Values held over all objects.
    pub values: u64,
    /// The agent's version.
    pub version: String,
}

/// An instance of a service as the agent shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Instance {
    /// Printable id of the workload.
    pub id: String,
    /// Its public key, hex.
    pub public_key: String,
    /// Where its proxy accepts mesh traffic.
    pub endpoint: SocketAddr,
    /// Its labels.
    pub metadata: Metadata,
    /// Printable id of the node that endorsed it (signed its record).
    pub endorser: String,
    /// The record's end of validity, Unix ms.
    pub not_after: u64,
    /// The stored value (record and grant chain), hex: callers verify it themselves
    /// against the mesh root.
    pub record: String,
}

/// `GET /v1/services/{service}`: the answer to a resolution.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resolution {
    /// The service.
    pub service: ServiceName,
    /// Its live, verified instances.
    pub instances: Vec<Instance>,
    /// Whether it came from the agent's cache.
    pub cached: bool,
    /// Records refused (not endorsed, expired, revoked...).
    pub refused: usize,
    /// Replica holders that answered, of `replicas`.
    pub answered: u8,
    /// Replicas asked (`k + 1`).
    pub replicas: u8,
}

/// One stored value and what verification made of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Verdict {
    /// The workload id the value claims, if it decodes that far.
    pub id: Option<String>,
    /// The key that signed the record, as a printable id, if it decodes.
    pub endorser: Option<String>,
    /// The endpoint it claims (`None`: a tombstone, or undecodable).
    pub endpoint: Option<SocketAddr>,
    /// `issued_at`, Unix ms, if it decodes.
    pub issued_at: Option<u64>,
    /// `trusted`, `superseded`, `withdrawn` or `refused`.
    pub verdict: String,
    /// Why, in words.
    pub reason: String,
    /// The trust log's leaves behind the verdict: the endorser's admission, the grants
    /// of the service along its chain, revocations of the keys involved; each with its
    /// inclusion proof under [`Explanation::log_checkpoint`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub log: Vec<LogLeaf>,
}

/// `GET /v1/services/{service}/explain`: why each value stored for a service is or is
/// not trusted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Explanation {
    /// The service.
    pub service: ServiceName,
    /// The mesh root everything was checked against.
    pub mesh_root: String,
    /// Replica holders that answered, of `replicas`.
    pub answered: u8,
    /// Replicas asked.
    pub replicas: u8,
    /// Every value found, with its verdict.
    pub values: Vec<Verdict>,
    /// The resulting live instances.
    pub instances: Vec<Instance>,
    /// The trust log checkpoint the verdicts' leaves are proven under (hex; `None`:
    /// this node holds no log yet).
    #[serde(default)]
    pub log_checkpoint: Option<String>,
}

/// One revocation the agent knows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Revocation {
    /// Printable id of the revoked key.
    pub id: String,
    /// When the mesh root signed it, Unix ms.
    pub issued_at: u64,
    /// Why, for people.
    pub reason: String,
    /// The signed revocation, hex: callers verify it against the mesh root.
    pub revocation: String,
    /// Its leaf in the trust log, if it is there: the index and the inclusion proof
    /// (hex) under [`Revocations::checkpoint`]. A caller holding the checkpoint checks
    /// the proof instead of the revocation's own signature.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logged: Option<Logged>,
}

/// Where a statement stands in the trust log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Logged {
    /// The leaf's index.
    pub index: u64,
    /// Its inclusion proof (concatenated hashes, hex).
    pub proof: String,
}

/// `GET /v1/revocations`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Revocations {
    /// The trust log checkpoint the `logged` proofs are under (signed, hex).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<String>,
    /// Every revocation known; asked by page
    /// ([`crate::paths::revocations_since`]), the page's.
    pub revocations: Vec<Revocation>,
    /// Which list the page is of: the agent's, chosen at random when it starts, so a
    /// position in one list is never read in another. `None`: an older agent that
    /// always lists everything.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub list: Option<u64>,
    /// The position of the page's first revocation in the list.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<usize>,
    /// How many revocations the list holds: more than `from` plus the page's means
    /// more pages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total: Option<usize>,
    /// The agent holds a request with `?known=&wait_ms=` until it learns a revocation
    /// ([`crate::paths::revocations_after`]): a client may ask again at once. An
    /// older agent answers at once and says nothing (`false`).
    #[serde(default)]
    pub long_poll: bool,
}

/// `POST /v1/revocations`: publish a root-signed revocation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PublishRevocation {
    /// The PEM text `themis revoke` writes.
    pub revocation: String,
}

/// The answer to [`PublishRevocation`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Published {
    /// Always `true`.
    pub published: bool,
    /// Whether this agent did not know it before.
    pub new: bool,
}

/// `GET /v1/log`: the trust log this node holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogStatus {
    /// Leaves held.
    pub size: u64,
    /// Their tree hash, hex.
    pub root_hash: String,
    /// The root-signed checkpoint held, hex (`None`: none yet).
    pub checkpoint: Option<String>,
    /// When the root signed it (Unix ms).
    pub issued_at: Option<u64>,
    /// Forks seen: why each pair of checkpoints contradicts (evidence in the state
    /// directory's `log-forks/`).
    pub forks: Vec<String>,
    /// Every leaf, oldest first.
    pub leaves: Vec<LogLeaf>,
}

/// One leaf of the trust log, for people and auditors.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogLeaf {
    /// Its index.
    pub index: u64,
    /// `admission`, `grant`, `revocation` or `address-range`.
    pub kind: String,
    /// The printable id of the key it is about (admitted node, grantee, revoked key).
    pub subject: String,
    /// The service, for a grant.
    pub service: Option<String>,
    /// Whether a grant may be passed on.
    pub delegate: Option<bool>,
    /// Why, for a revocation.
    pub reason: Option<String>,
    /// The addresses granted (`10.244.1.0/24`), for an address range.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub range: Option<String>,
    /// When the root signed it (Unix ms).
    pub issued_at: u64,
    /// The leaf, hex.
    pub leaf: String,
    /// Its inclusion proof in the log of `size` leaves (concatenated hashes, hex).
    pub proof: String,
}

/// The answer to `POST /v1/log`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogPublished {
    /// Whether this node now holds the copy's checkpoint.
    pub took: bool,
    /// Leaves added.
    pub added: u64,
    /// The log's size here now.
    pub size: u64,
}

/// A local registration, as the agent keeps it on disk and shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Registration {
    /// The service.
    pub service: ServiceName,
    /// The local workload.
    pub workload: WorkloadName,
    /// The workload's printable id.
    pub id: String,
    /// Where its proxy accepts mesh traffic.
    pub endpoint: SocketAddr,
    /// Its labels.
    #[serde(default)]
    pub metadata: Metadata,
    /// When the current record was signed (Unix ms); also its version.
    pub serial: u64,
}

/// The record label naming the transports an instance's sidecar takes (`tls`,
/// `themis`, comma-separated; the order says nothing: the caller's preference picks).
/// Its node signs it with the rest of the record, so no one on the path can change
/// which transport a caller uses, and nothing is negotiated on the wire. A record
/// without it is an older peer's: the Themis channel alone.
pub const TRANSPORT_LABEL: &str = "themis.transport";

/// The transports this build knows, as [`TRANSPORT_LABEL`] names them.
pub const TRANSPORTS: [&str; 2] = ["tls", "themis"];

/// A name in a transport list that is not one of [`TRANSPORTS`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a transport (tls, themis)")]
pub struct UnknownTransport(pub String);

/// A comma-separated transport list, as `--transport`, a pod's annotation or the
/// label write it, name by name; refused at the first name that is not a transport.
pub fn transports(list: &str) -> Result<Vec<&str>, UnknownTransport> {
    let names: Vec<&str> = list.split(',').map(str::trim).collect();
    match names.iter().find(|name| !TRANSPORTS.contains(name)) {
        Some(bad) => Err(UnknownTransport((*bad).into())),
        None => Ok(names),
    }
}

/// `PUT /v1/services/{service}/instances/{workload}`: register. `C` is the eBPF
/// capture spec (`themis_capture::CaptureSpec`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Register<C> {
    /// Where the workload's proxy accepts mesh traffic (not `0.0.0.0`, not port 0).
    pub endpoint: SocketAddr,
    /// Its labels.
    #[serde(default)]
    pub metadata: Metadata,
    /// eBPF capture for the workload's cgroup: attached before the record is stored.
    #[serde(default = "none")]
    pub capture: Option<C>,
}

fn none<C>() -> Option<C> {
    None
}

/// The answer to [`Register`]. `C` is the capture status
/// (`themis_capture::WorkloadStatus`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Registered<C> {
    /// What was registered.
    pub registration: Registration,
    /// Replicas that stored the record.
    pub stored: u8,
    /// Replicas attempted.
    pub replicas: u8,
    /// The capture attached, if one was asked for.
    #[serde(default = "none")]
    pub capture: Option<C>,
}

/// `DELETE /v1/services/{service}/instances/{workload}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Deregistered {
    /// What was withdrawn.
    pub deregistered: Registration,
    /// Whether the workload's capture was detached too.
    pub capture_detached: bool,
}

/// `GET /v1/workloads`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Workloads {
    /// This node's registrations.
    pub registrations: Vec<Registration>,
    /// The workloads bound to a pod, registered or not, and their owners.
    #[serde(default)]
    pub owners: BTreeMap<WorkloadName, Owner>,
}

/// The pod a workload belongs to: callers of the local API in this cgroup v2
/// directory (or below), with this uid if one is set, are the workload's proxy.
/// The operator gives the uid, or says explicitly that any uid in the cgroup will do
/// (`any_uid`): the agent binds no owner with neither.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Owner {
    /// A cgroup v2 directory, e.g. `/sys/fs/cgroup/kubepods.slice/…/pod<uid>`.
    pub cgroup: String,
    /// The proxy's uid (Istio: 1337): callers must run as it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    /// No uid: any process in the cgroup is the proxy (a platform that gives the
    /// proxy no uid of its own). Must be said; never the default.
    #[serde(default, skip_serializing_if = "core::ops::Not::not")]
    pub any_uid: bool,
}

/// `PUT /v1/workloads/{workload}` body (optional): binds the workload to its pod.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateWorkload {
    /// The pod that owns the workload's identity.
    #[serde(default)]
    pub owner: Option<Owner>,
}

/// `PUT /v1/workloads/{workload}`: the workload's identity (201 if just created).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkloadIdentity {
    /// The workload.
    pub workload: WorkloadName,
    /// Its printable id.
    pub id: String,
    /// Its public key, hex.
    pub public_key: String,
    /// Whether this call created it.
    pub created: bool,
    /// The pod it is bound to, if any.
    #[serde(default)]
    pub owner: Option<Owner>,
}

/// `DELETE /v1/workloads/{workload}`: the workload deleted, and the id it had.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeletedWorkload {
    /// The workload.
    pub workload: WorkloadName,
    /// The printable id it had (none has it now on this node).
    pub id: String,
}

/// `GET /v1/workloads/{workload}/key`: a workload's key material, for its local proxy.
/// The private key is wiped from memory when this is dropped, and never printed by
/// `Debug`.
#[derive(Clone, Serialize, Deserialize)]
pub struct KeyMaterial {
    /// The workload.
    pub workload: WorkloadName,
    /// The mesh.
    pub mesh: String,
    /// Printable id.
    pub id: String,
    /// Public key, hex.
    pub public_key: String,
    /// The key file text (PEM PKCS#8). Secret.
    #[serde(with = "secret_text")]
    pub private_key_pem: Zeroizing<String>,
}

impl core::fmt::Debug for KeyMaterial {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("KeyMaterial")
            .field("workload", &self.workload)
            .field("mesh", &self.mesh)
            .field("id", &self.id)
            .field("public_key", &self.public_key)
            .field("private_key_pem", &"<secret>")
            .finish()
    }
}

mod secret_text {
    use alloc::string::String;

    use serde::{Deserialize, Deserializer, Serializer};
    use zeroize::Zeroizing;

    pub fn serialize<S: Serializer>(text: &Zeroizing<String>, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(text)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Zeroizing<String>, D::Error> {
        String::deserialize(d).map(Zeroizing::new)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::format;
    use alloc::string::ToString;
    use serde_json::json;

    #[test]
    fn a_transport_list_names_only_known_transports() {
        assert_eq!(transports("tls"), Ok(alloc::vec!["tls"]));
        assert_eq!(
            transports(" tls , themis"),
            Ok(alloc::vec!["tls", "themis"])
        );
        for bad in ["", "quic", "tls,", "TLS", "tls;themis"] {
            assert!(transports(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn answers_read_what_the_agent_writes() {
        let instance = json!({
            "id": "demo1xyz", "public_key": "00", "endpoint": "127.0.0.1:15006",
            "metadata": {"version": "v2"}, "endorser": "demo1abc", "not_after": 5,
            "record": "ff",
        });
        let resolution: Resolution = serde_json::from_value(json!({
            "service": "check.default.svc", "instances": [instance], "cached": false,
            "refused": 0, "answered": 1, "replicas": 5,
        }))
        .unwrap();
        assert_eq!(resolution.service.as_str(), "check.default.svc");
        assert_eq!(resolution.instances[0].metadata["version"], "v2");
        // An answer naming an invalid service is refused as a whole.
        let bad = json!({
            "service": "../x", "instances": [], "cached": false, "refused": 0,
            "answered": 1, "replicas": 5,
        });
        assert!(serde_json::from_value::<Resolution>(bad).is_err());

        let key: KeyMaterial = serde_json::from_value(json!({
            "workload": "web.prod", "mesh": "demo", "id": "demo1xyz",
            "public_key": "00", "private_key_pem": "-----BEGIN PRIVATE KEY-----",
        }))
        .unwrap();
        assert!(!format!("{key:?}").contains("BEGIN"));
        assert!(serde_json::to_string(&key).unwrap().contains("BEGIN"));

        let error: ErrorBody =
            serde_json::from_str(r#"{"error":"no","reason":"not_found"}"#).unwrap();
        assert_eq!(error.reason, "not_found");
    }

    #[test]
    fn request_bodies_refuse_unknown_fields() {
        let body: Register<serde_json::Value> =
            serde_json::from_str(r#"{"endpoint":"10.0.0.1:15006"}"#).unwrap();
        assert_eq!(body.capture, None);
        assert!(body.metadata.is_empty());
        let typo = serde_json::from_str::<Register<serde_json::Value>>(
            r#"{"endpoint":"10.0.0.1:15006","metdata":{}}"#,
        );
        assert!(typo.unwrap_err().to_string().contains("unknown field"));
        assert!(serde_json::from_str::<PublishRevocation>(r#"{"pem":"x"}"#).is_err());
    }
}

/// `GET /v1/workloads/{workload}/identity`: the public identity a workload's proxy
/// needs (the private key stays in the agent).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PublicIdentity {
    /// The workload.
    pub workload: WorkloadName,
    /// The mesh.
    pub mesh: String,
    /// Its printable id.
    pub id: String,
    /// Its Ed25519 public key, hex.
    pub public_key: String,
}

/// `POST /v1/workloads/{workload}/sign`: one handshake message of the workload's, to
/// sign. The agent parses the body and signs only a well-formed message naming the
/// workload's own key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignRequest {
    /// `hello` (message 1, from an initiator) or `hello_reply` (message 2, from a
    /// responder).
    pub kind: String,
    /// The unsigned message body, hex.
    pub body: String,
    /// For `hello_reply`: SHA-256 of the whole message 1 it answers, hex.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hello_hash: Option<String>,
}

/// `POST /v1/workloads/{workload}/delegate`: the proxy's short-lived handshake key,
/// for the agent to delegate to (wire v3). The agent refuses a revoked workload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DelegateRequest {
    /// The Ed25519 public key the proxy generated, hex (32 bytes).
    pub delegated_key: String,
    /// The lifetime asked for, seconds (default one hour, at most one day).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifetime_secs: Option<u64>,
}

/// The answer to a [`DelegateRequest`]: the delegation, and the workload's current
/// endorsement (its record with the grant chain) for the handshakes to carry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delegated {
    /// The workload's public identity.
    pub identity: PublicIdentity,
    /// The encoded delegation, hex.
    pub delegation: String,
    /// When it expires, Unix ms.
    pub not_after_ms: u64,
    /// When to ask again, Unix ms: half the delegation's lifetime, or sooner if the
    /// endorsement's record is renewed first.
    pub renew_at_ms: u64,
    /// The service the endorsement is for, if the workload is registered.
    #[serde(default)]
    pub service: Option<ServiceName>,
    /// The endorsement (the DHT value of the workload's record), hex.
    #[serde(default)]
    pub endorsement: Option<String>,
}

/// A delegated credential in a file, for a client outside a sidecar (the
/// standalone component, `wasmtime run themis_component.wasm call --credential`):
/// what `themis delegate` got from the agent, with the delegated key's
/// seed. Whoever holds the file speaks as the workload until `not_after_ms`, and no
/// longer; the workload's own key never leaves the agent.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DelegatedCredential {
    /// The agent's answer.
    #[serde(flatten)]
    pub delegated: Delegated,
    /// The delegated key's 32-byte Ed25519 seed, hex.
    pub delegated_key_seed: String,
}

/// Without the seed: a credential in a log or a panic message gives nothing away.
impl core::fmt::Debug for DelegatedCredential {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("DelegatedCredential")
            .field("delegated", &self.delegated)
            .field("delegated_key_seed", &"<redacted>")
            .finish()
    }
}

/// `POST /v1/workloads/{workload}/certificate`: a TLS certificate for the workload's
/// proxy (docs/PROTOCOL.md §8). The agent refuses a revoked workload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CertificateRequest {
    /// The lifetime asked for, seconds (default one hour, at most one day).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifetime_secs: Option<u64>,
}

/// The answer to a [`CertificateRequest`]: the certificate and its private key, for
/// the proxy's TLS context. Whoever holds the key speaks as the workload until
/// `not_after_ms`, and no longer; the workload's own key never leaves the agent.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IssuedCertificate {
    /// The workload's public identity.
    pub identity: PublicIdentity,
    /// The certificate, DER, hex.
    pub certificate: String,
    /// Its ECDSA P-256 private key, PKCS#8 DER, hex.
    pub private_key: String,
    /// Its URI SAN: the principal Envoy's RBAC and access logs read.
    pub principal: String,
    /// Its DNS SAN, the name a caller sends as SNI to reach this workload.
    pub sni_name: String,
    /// When it expires (its delegation's end), Unix ms.
    pub not_after_ms: u64,
    /// When to ask for the next, Unix ms: half its life, or sooner when the
    /// endorsement's record is renewed first (the certificate carries it).
    pub renew_at_ms: u64,
    /// The service its endorsement is for, if the workload is registered.
    #[serde(default)]
    pub service: Option<ServiceName>,
}

/// Without the private key: a certificate in a log or a panic message gives nothing
/// away.
impl core::fmt::Debug for IssuedCertificate {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("IssuedCertificate")
            .field("identity", &self.identity)
            .field("principal", &self.principal)
            .field("not_after_ms", &self.not_after_ms)
            .field("private_key", &"<redacted>")
            .finish()
    }
}

/// The answer to a [`SignRequest`]: an Ed25519 signature.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignResponse {
    /// 64 bytes, hex.
    pub signature: String,
}
