//! The answers the filter reads from its local agent (over the agent cluster): a
//! service's instances, the revocations, the workload's public identity and the
//! signatures the agent makes for it (the private key never leaves the agent). The agent verified
//! the records already; the filter verifies each one again against the mesh root of
//! its own configuration (the endorsement chain, validity, revocations), so neither a
//! confused agent nor a hostile DHT node can make it talk to a peer the mesh root did
//! not endorse for the service.

use std::net::SocketAddr;

use themis_contracts::api;
use themis_core::delegation::{Credential, DelegatedKey, Delegation};
use themis_core::identity::PublicIdentity;
use themis_core::{MeshName, PeerId};
use themis_trust::{InstanceValue, MeshRoot, Revocations, Signed, Verifier};

/// One instance of a service: who must answer, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instance {
    /// The id the key agreement must authenticate.
    pub id: PeerId,
    /// The peer's inbound listener.
    pub endpoint: SocketAddr,
    /// Its labels (e.g. `version`), as its record states them.
    pub metadata: themis_trust::Metadata,
    /// The grantees its endorsement rests on, the endorsing node last: a revocation of
    /// any of them (or of `id`) withdraws it, with no new resolution.
    pub vouched_by: Vec<[u8; 32]>,
}

impl Instance {
    /// The transports it takes, as its signed record says.
    pub fn takes(&self) -> crate::config::Takes {
        crate::config::Takes::of(&self.metadata)
    }

    /// Whether `revoked` withdraws it: its own key or a key its endorsement rests on.
    pub fn is_revoked(&self, root: &MeshRoot, revoked: &Revocations) -> bool {
        revoked.contains(&self.id)
            || self
                .vouched_by
                .iter()
                .any(|k| revoked.contains_key(root, k))
    }
}

/// Why an agent answer was not usable.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AgentError {
    /// Not the JSON expected.
    #[error("the agent's answer does not parse: {0}")]
    Json(String),
    /// An instance whose public key does not hash to its id, or of another mesh.
    #[error("the agent returned an instance whose key does not match its id")]
    KeyIdMismatch,
    /// An instance whose record does not verify against the mesh root.
    #[error("the agent returned an instance the mesh root does not vouch for: {0}")]
    NotEndorsed(themis_trust::TrustError),
    /// The identity does not parse, or is for another workload or mesh, or its key
    /// does not hash to its id.
    #[error("the agent's identity for the workload is unusable: {0}")]
    Key(String),
    /// The signature is not 64 bytes of hex.
    #[error("the agent's signature does not parse")]
    Signature,
    /// The delegation does not decode, or does not verify for the key asked about.
    #[error("the agent's delegation is unusable: {0}")]
    Delegation(String),
    /// An endorsed instance whose record names no transport this caller speaks (a
    /// TLS-only callee to a caller of the Themis channel alone): never called over
    /// another.
    #[error("{id} takes {takes:?} (its record's {label}), and this sidecar speaks {speaks}", label = crate::config::TRANSPORT_LABEL)]
    NoTransport {
        /// The instance (printable id).
        id: String,
        /// Its record's label as written (`themis` when it has none).
        takes: String,
        /// What this caller speaks.
        speaks: String,
    },
}

/// Reads `GET /v1/services/{service}`: each instance is taken from its record, verified
/// against `trust`'s root and revocations for `service`; the id the agent printed
/// must be the record's. One result per listed instance: a caller uses the good ones
/// and counts the others (one bad record must not take the whole service down).
pub fn parse_instances(
    body: &[u8],
    service: &str,
    trust: &Verifier<'_>,
) -> Result<Vec<Result<Instance, AgentError>>, AgentError> {
    let resolution: api::Resolution =
        serde_json::from_slice(body).map_err(|e| AgentError::Json(e.to_string()))?;
    Ok(resolution
        .instances
        .into_iter()
        .map(|raw| verify_instance(raw, service, trust))
        .collect())
}

fn verify_instance(
    raw: api::Instance,
    service: &str,
    trust: &Verifier<'_>,
) -> Result<Instance, AgentError> {
    let id = PeerId::parse_in(&raw.id, &trust.root.mesh).map_err(|_| AgentError::KeyIdMismatch)?;
    let value = hex::decode(&raw.record)
        .map_err(|_| AgentError::NotEndorsed(themis_trust::TrustError::Malformed))?;
    let value = InstanceValue::decode(&value).map_err(AgentError::NotEndorsed)?;
    let instance = trust
        .instance_value(&value, service)
        .map_err(AgentError::NotEndorsed)?;
    if instance.id != id {
        return Err(AgentError::KeyIdMismatch);
    }
    let endpoint = instance
        .endpoint
        .ok_or(AgentError::NotEndorsed(themis_trust::TrustError::Expired))?;
    Ok(Instance {
        id,
        endpoint,
        metadata: instance.metadata,
        vouched_by: value.grantees().collect(),
    })
}

/// The instances that verified and take a transport of `speaks` (the caller's); the
/// others are logged and counted by the caller.
pub fn endorsed(
    results: Vec<Result<Instance, AgentError>>,
    speaks: &[crate::config::Transport],
    mesh: &MeshName,
) -> (Vec<Instance>, Vec<AgentError>) {
    let mut good = Vec::with_capacity(results.len());
    let mut bad = Vec::new();
    for result in results {
        match result {
            Ok(instance) if instance.takes().first_of(speaks).is_some() => good.push(instance),
            Ok(instance) => bad.push(AgentError::NoTransport {
                id: instance.id.printable(mesh),
                takes: instance
                    .metadata
                    .get(crate::config::TRANSPORT_LABEL)
                    .map_or("themis", String::as_str)
                    .to_owned(),
                speaks: crate::config::Takes::label(speaks),
            }),
            Err(e) => bad.push(e),
        }
    }
    (good, bad)
}

/// Reads `GET /v1/revocations`, keeping only revocations the mesh root signed.
pub fn parse_revocations(body: &[u8], root: &MeshRoot) -> Result<Revocations, AgentError> {
    let raw = serde_json::from_slice(body).map_err(|e| AgentError::Json(e.to_string()))?;
    verify_revocations(raw, root).map(|list| list.revocations)
}

/// How long a filter asks its agent to hold a revocations poll (a long poll answered
/// as soon as the agent learns a revocation): under the agent's cap
/// (`paths::MAX_REVOCATIONS_WAIT_MS`) and under idle timeouts between the two.
pub const REVOCATIONS_WAIT_MS: u64 = 20_000;

/// What a revocations answer says about the next poll.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NextPoll {
    /// How many revocations the agent listed: the next poll waits for another count.
    pub known: usize,
    /// Whether the agent holds long polls (an older one answers at once).
    pub long_poll: bool,
}

impl NextPoll {
    /// Read from a `GET /v1/revocations` answer; `None` if it does not parse.
    pub fn of(body: &[u8]) -> Option<NextPoll> {
        #[derive(serde::Deserialize)]
        struct Counted {
            revocations: Vec<serde::de::IgnoredAny>,
            #[serde(default)]
            long_poll: bool,
        }
        let counted: Counted = serde_json::from_slice(body).ok()?;
        Some(NextPoll {
            known: counted.revocations.len(),
            long_poll: counted.long_poll,
        })
    }

    /// The path of the next poll: held by the agent until it knows another count of
    /// revocations, when it holds long polls; else the plain list, asked every period.
    pub fn path(next: Option<NextPoll>) -> String {
        match next {
            Some(n) if n.long_poll => {
                themis_contracts::paths::revocations_after(n.known, REVOCATIONS_WAIT_MS)
            }
            _ => themis_contracts::paths::REVOCATIONS.into(),
        }
    }
}

/// Where a filter stands in its agent's revocation list, which it follows page by page
/// ([`themis_contracts::paths::revocations_since`]): the list, the position of the
/// next revocation to read, and how many the agent listed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cursor {
    /// The agent's list (drawn when it started).
    pub list: u64,
    /// The position of the next revocation to read.
    pub next: usize,
    /// How many the agent's list held when it answered.
    pub total: usize,
}

impl Cursor {
    /// Where a paged answer leaves its reader; `None` for an older agent's answer,
    /// which lists everything.
    fn of(raw: &api::Revocations) -> Option<Cursor> {
        let (list, from, total) = (raw.list?, raw.from?, raw.total?);
        let next = from.saturating_add(raw.revocations.len());
        Some(Cursor {
            list,
            next,
            total: total.max(next),
        })
    }

    /// Whether pages remain to be read (asked at once, not held).
    pub fn behind(&self) -> bool {
        self.next < self.total
    }

    /// The next page's path: held by the agent until it learns a revocation when
    /// none remain.
    pub fn path(&self) -> String {
        let wait_ms = if self.behind() {
            0
        } else {
            REVOCATIONS_WAIT_MS
        };
        themis_contracts::paths::revocations_since(self.list, self.next, wait_ms)
    }

    /// The next page's path, answered at once even when none remain.
    pub fn unheld_path(&self) -> String {
        themis_contracts::paths::revocations_since(self.list, self.next, 0)
    }

    /// The first page's path, before any answer: an agent answers a position in a
    /// list not its own from its first.
    pub fn first_path() -> String {
        themis_contracts::paths::revocations_since(0, 0, 0)
    }
}

/// A page of the agent's revocations, verified.
#[derive(Debug)]
pub struct RevocationPage {
    /// The page's revocations.
    pub list: RevocationList,
    /// Where the list goes on; `None`: an older agent listed everything at once.
    pub cursor: Option<Cursor>,
}

/// Reads a `GET /v1/revocations` answer by page ([`Cursor`]): the page's revocations,
/// each verified, and where the list goes on. A filter merges each page into what
/// it holds: the whole set is never sent, nor verified, twice.
pub fn parse_revocation_page(body: &[u8], root: &MeshRoot) -> Result<RevocationPage, AgentError> {
    let raw: api::Revocations =
        serde_json::from_slice(body).map_err(|e| AgentError::Json(e.to_string()))?;
    let cursor = Cursor::of(&raw);
    Ok(RevocationPage {
        list: verify_revocations(raw, root)?,
        cursor,
    })
}

/// The most pages [`read_revocations`] reads (a million revocations): an agent that
/// keeps saying there is more cannot keep its reader forever.
const MAX_PAGES: usize = 4_096;

/// Every revocation an agent lists, read page by page with `get` (a path in, the
/// answer's body out), each verified; an older agent's whole list in one answer.
pub fn read_revocations(
    root: &MeshRoot,
    mut get: impl FnMut(&str) -> Result<Vec<u8>, String>,
) -> Result<Revocations, String> {
    let mut held = Revocations::new();
    let mut path = Cursor::first_path();
    for _ in 0..MAX_PAGES {
        let page = parse_revocation_page(&get(&path)?, root).map_err(|e| e.to_string())?;
        held.merge(page.list.revocations);
        match page.cursor {
            Some(cursor) if cursor.behind() => path = cursor.path(),
            _ => return Ok(held),
        }
    }
    Err(format!(
        "the agent listed more than {MAX_PAGES} pages of revocations"
    ))
}

/// A revocation list read from the agent.
#[derive(Debug, Default)]
pub struct RevocationList {
    /// The revocations, each verified.
    pub revocations: Revocations,
    /// How many were proven by the trust log's checkpoint (the rest by their own
    /// signature).
    pub proven: usize,
}

/// [`parse_revocations`], unless the agent lists exactly `held` revocations (the
/// count it listed last): then `None`, nothing verified. An agent's revocations only
/// ever grow (a key revoked is revoked for good), so the same count is the same list;
/// a poll of a list of thousands costs a parse, not thousands of signature checks.
/// Any other count is verified and returned, a shorter one too (an agent restarted
/// with less may still hold one the filter lacks): the filter merges what it is given
/// into what it holds ([`Revocations::merge`]), so no list takes a revocation back.
pub fn parse_new_revocations(
    body: &[u8],
    root: &MeshRoot,
    held: usize,
) -> Result<Option<RevocationList>, AgentError> {
    let raw: api::Revocations =
        serde_json::from_slice(body).map_err(|e| AgentError::Json(e.to_string()))?;
    if raw.revocations.len() == held {
        return Ok(None);
    }
    verify_revocations(raw, root).map(Some)
}

/// Every revocation of `raw` checked: by the trust log's checkpoint where it proves
/// them, else each by its own signature.
fn verify_revocations(
    raw: api::Revocations,
    root: &MeshRoot,
) -> Result<RevocationList, AgentError> {
    // A checkpoint of the trust log (one signature) proves the revocations that are
    // its leaves; the others are checked one signature each.
    let checkpoint = raw
        .checkpoint
        .as_deref()
        .and_then(|c| hex::decode(c).ok())
        .and_then(|c| themis_log::SignedCheckpoint::verify(root, &c).ok());
    let mut revocations = Revocations::new();
    let mut proven_count = 0;
    for r in raw.revocations {
        let bytes = hex::decode(&r.revocation).map_err(|e| AgentError::Json(e.to_string()))?;
        let proven = match (&checkpoint, &r.logged) {
            (Some(checkpoint), Some(logged)) => proven_in_log(checkpoint, &bytes, logged),
            _ => false,
        };
        if proven {
            proven_count += 1;
            revocations.add_proven(root, &bytes)
        } else {
            revocations.add(root, &bytes)
        }
        .map_err(AgentError::NotEndorsed)?;
    }
    Ok(RevocationList {
        revocations,
        proven: proven_count,
    })
}

/// Whether `revocation` (an encoded `Signed`) is the leaf `logged` says, under
/// `checkpoint`.
fn proven_in_log(
    checkpoint: &themis_log::SignedCheckpoint,
    revocation: &[u8],
    logged: &api::Logged,
) -> bool {
    let (Ok(statement), Ok(proof)) = (Signed::decode(revocation), hex::decode(&logged.proof))
    else {
        return false;
    };
    let leaf = themis_log::Entry::new(themis_log::Kind::Revocation, statement).encode();
    checkpoint
        .checkpoint
        .verify_inclusion(&leaf, logged.index, &proof)
        .is_ok()
}

/// Reads `GET /v1/workloads/{workload}/identity` into the workload's public identity:
/// for `workload` in `mesh`, and the public key must hash to the id. (The private key
/// stays in the agent, which signs the handshake messages: [`parse_signature`].)
pub fn parse_public_identity(
    body: &[u8],
    workload: &str,
    mesh: &MeshName,
) -> Result<PublicIdentity, AgentError> {
    let raw: api::PublicIdentity =
        serde_json::from_slice(body).map_err(|e| AgentError::Json(e.to_string()))?;
    check_public_identity(&raw, workload, mesh)
}

/// [`parse_public_identity`] on an identity already parsed (the one a delegation
/// answer carries): for `workload` in `mesh`, its key hashing to its id.
pub fn check_public_identity(
    raw: &api::PublicIdentity,
    workload: &str,
    mesh: &MeshName,
) -> Result<PublicIdentity, AgentError> {
    if raw.workload.as_str() != workload || raw.mesh != mesh.as_str() {
        return Err(AgentError::Key(format!(
            "it is for workload {} in mesh {}, not {workload} in {}",
            raw.workload,
            raw.mesh,
            mesh.as_str()
        )));
    }
    let mut key = [0u8; 32];
    hex::decode_to_slice(&raw.public_key, &mut key)
        .map_err(|_| AgentError::Key("the public key is not 32 bytes of hex".into()))?;
    let identity = PublicIdentity::new(key, mesh.clone());
    if identity.printable_id() != raw.id {
        return Err(AgentError::Key(
            "the public key does not match the id".into(),
        ));
    }
    Ok(identity)
}

/// Reads the answer of `POST /v1/workloads/{workload}/delegate` for `key` (the
/// delegated key this sidecar generated and asked about) into the credential it signs
/// handshakes with, checked at `now_ms`: the identity is the workload's (as
/// [`check_public_identity`]) and the workload key delegated `key` itself, so a
/// confused or lying agent cannot make the sidecar send handshakes its peers refuse.
/// Also returns when to ask again (Unix ms).
pub fn parse_delegated(
    body: &[u8],
    key: DelegatedKey,
    workload: &str,
    mesh: &MeshName,
    now_ms: u64,
) -> Result<(Credential, u64), AgentError> {
    let delegated: api::Delegated =
        serde_json::from_slice(body).map_err(|e| AgentError::Json(e.to_string()))?;
    let identity = check_public_identity(&delegated.identity, workload, mesh)?;
    let delegation = hex::decode(&delegated.delegation)
        .ok()
        .and_then(|b| Delegation::decode(&b))
        .ok_or(AgentError::Delegation("it does not decode".into()))?;
    let endorsement = match &delegated.endorsement {
        Some(text) => hex::decode(text)
            .map_err(|_| AgentError::Delegation("the endorsement is not hex".into()))?,
        None => Vec::new(),
    };
    let credential = Credential::new(identity, key, delegation, endorsement, now_ms)
        .map_err(|e| AgentError::Delegation(e.to_string()))?;
    // Not later than half the delegation's life (an agent's renewal time past its
    // end would leave the sidecar without a key), nor sooner than a second.
    let renew_at = delegated
        .renew_at_ms
        .min(delegation.renew_at_ms())
        .max(now_ms + 1_000);
    Ok((credential, renew_at))
}

/// Reads the answer of `POST /v1/workloads/{workload}/sign`. The signature is not
/// trusted here: the handshake checks it under the workload's own key before sending.
pub fn parse_signature(body: &[u8]) -> Result<[u8; 64], AgentError> {
    let raw: api::SignResponse =
        serde_json::from_slice(body).map_err(|e| AgentError::Json(e.to_string()))?;
    let mut signature = [0u8; 64];
    hex::decode_to_slice(&raw.signature, &mut signature).map_err(|_| AgentError::Signature)?;
    Ok(signature)
}

#[cfg(test)]
mod next_poll_tests {
    use super::*;

    #[test]
    fn a_long_poll_waits_for_another_count_and_an_old_agent_is_polled_by_period() {
        let long = NextPoll::of(br#"{"revocations":[{},{}],"long_poll":true}"#);
        assert_eq!(
            long,
            Some(NextPoll {
                known: 2,
                long_poll: true
            })
        );
        assert_eq!(
            NextPoll::path(long),
            themis_contracts::paths::revocations_after(2, REVOCATIONS_WAIT_MS)
        );
        // An agent from before long polls says nothing: asked every period, plainly.
        let old = NextPoll::of(br#"{"revocations":[]}"#);
        assert_eq!(
            old,
            Some(NextPoll {
                known: 0,
                long_poll: false
            })
        );
        assert_eq!(NextPoll::path(old), themis_contracts::paths::REVOCATIONS);
        assert_eq!(NextPoll::of(b"not json"), None);
        assert_eq!(NextPoll::path(None), themis_contracts::paths::REVOCATIONS);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use themis_core::Identity;

    fn mesh() -> MeshName {
        MeshName::new("demo").unwrap()
    }

    #[test]
    fn instances_are_verified_against_the_mesh_root() {
        use themis_trust::{
            Grant, InstanceValue, Metadata, Record, Revocation, Signed, TrustError, GRANT_LABEL,
            RECORD_LABEL, REVOCATION_LABEL,
        };
        let rng = ring::rand::SystemRandom::new();
        let root_key = Identity::generate(mesh(), &rng).unwrap();
        let root = MeshRoot {
            mesh: mesh(),
            key: *root_key.public_key(),
        };
        let (node, peer) = (
            Identity::generate(mesh(), &rng).unwrap(),
            Identity::generate(mesh(), &rng).unwrap(),
        );
        let now = 1_800_000_000_000;
        let grant = |by: &Identity| {
            Signed::sign(
                by,
                GRANT_LABEL,
                &Grant {
                    mesh: "demo".into(),
                    service: "check".into(),
                    grantee: *node.public_key(),
                    delegate: false,
                    issued_at: now,
                    not_after: None,
                },
            )
        };
        let value = |by: &Identity| {
            hex::encode(
                InstanceValue {
                    grants: vec![grant(by)],
                    record: Signed::sign(
                        &node,
                        RECORD_LABEL,
                        &Record {
                            mesh: "demo".into(),
                            service: "check".into(),
                            workload_key: *peer.public_key(),
                            endpoint: Some("127.0.0.12:15006".parse().unwrap()),
                            metadata: Metadata::new(),
                            issued_at: now,
                            not_after: now + 60_000,
                        },
                    ),
                }
                .encode(),
            )
        };
        // An instance as the agent lists it (the filter reads only the id and record).
        let listed = |id: &str, record: &str| {
            format!(
                r#"{{"id":"{id}","public_key":"00","record":"{record}","endpoint":"127.0.0.12:15006","metadata":{{}},"endorser":"x","not_after":0}}"#
            )
        };
        let answer = |id: &str, record: &str| {
            format!(
                r#"{{"service":"check","instances":[{}],"cached":false,"refused":0,"answered":1,"replicas":1}}"#,
                listed(id, record)
            )
        };
        let none = Revocations::new();
        let trust = Verifier {
            root: &root,
            now_ms: now,
            revoked: &none,
        };
        let good = answer(&peer.printable_id(), &value(&root_key));
        assert_eq!(
            parse_instances(good.as_bytes(), "check", &trust).unwrap(),
            vec![Ok(Instance {
                id: peer.id(),
                endpoint: "127.0.0.12:15006".parse().unwrap(),
                metadata: Default::default(),
                vouched_by: vec![*node.public_key()],
            })]
        );
        // Granted by someone other than the root: a confused or hostile agent's answer.
        let self_granted = answer(&peer.printable_id(), &value(&node));
        assert_eq!(
            parse_instances(self_granted.as_bytes(), "check", &trust).unwrap(),
            vec![Err(AgentError::NotEndorsed(TrustError::NotFromRoot))]
        );
        // One bad record next to a good one: the good one is still used.
        let mixed = good.replace(
            "}],",
            &format!("}},{}],", listed(&peer.printable_id(), &value(&node))),
        );
        let themis = [crate::config::Transport::Themis];
        let (usable, refused) = endorsed(
            parse_instances(mixed.as_bytes(), "check", &trust).unwrap(),
            &themis,
            &root.mesh,
        );
        assert_eq!((usable.len(), refused.len()), (1, 1), "{mixed}");
        // Its record names no transport: an older peer's, the channel alone, which a
        // TLS-only caller does not speak.
        let tls = [crate::config::Transport::Tls];
        let (usable, refused) = endorsed(
            parse_instances(good.as_bytes(), "check", &trust).unwrap(),
            &tls,
            &root.mesh,
        );
        assert!(usable.is_empty());
        assert!(
            matches!(&refused[..], [AgentError::NoTransport { takes, speaks, .. }] if takes == "themis" && speaks == "tls"),
            "{refused:?}"
        );
        // The right record under another id.
        let swapped = answer(&node.printable_id(), &value(&root_key));
        assert_eq!(
            parse_instances(swapped.as_bytes(), "check", &trust).unwrap(),
            vec![Err(AgentError::KeyIdMismatch)]
        );
        // Asked for another service.
        assert!(parse_instances(good.as_bytes(), "other", &trust).unwrap()[0].is_err());
        // Revoked since.
        let revoke_id = |by: &Identity, id: PeerId| {
            Signed::sign(
                by,
                REVOCATION_LABEL,
                &Revocation {
                    mesh: "demo".into(),
                    id: id.0,
                    issued_at: now,
                    reason: String::new(),
                },
            )
        };
        let revoke = |by: &Identity| revoke_id(by, peer.id());
        let (usable, _) = endorsed(
            parse_instances(good.as_bytes(), "check", &trust).unwrap(),
            &themis,
            &root.mesh,
        );
        let cached = &usable[0];
        // What a revocation withdraws from a resolution already made: the workload,
        // or the node that endorsed it; another node's revocation leaves it.
        for (revoked_id, withdrawn) in
            [(peer.id(), true), (node.id(), true), (root_key.id(), false)]
        {
            let mut revoked = Revocations::new();
            revoked
                .add(&root, &revoke_id(&root_key, revoked_id).encode())
                .unwrap();
            assert_eq!(
                cached.is_revoked(&root, &revoked),
                withdrawn,
                "{revoked_id:?}"
            );
        }
        let mut revoked = Revocations::new();
        let revocation = revoke(&root_key);
        revoked.add(&root, &revocation.encode()).unwrap();
        let trust = Verifier {
            root: &root,
            now_ms: now,
            revoked: &revoked,
        };
        assert_eq!(
            parse_instances(good.as_bytes(), "check", &trust).unwrap(),
            vec![Err(AgentError::NotEndorsed(TrustError::Revoked))]
        );
        let list = format!(
            r#"{{"revocations":[{{"id":"x","issued_at":0,"reason":"","revocation":"{}"}}]}}"#,
            hex::encode(revocation.encode())
        );
        assert!(parse_revocations(list.as_bytes(), &root)
            .unwrap()
            .contains(&peer.id()));
        let forged = revoke(&node);
        let list = format!(
            r#"{{"revocations":[{{"id":"x","issued_at":0,"reason":"","revocation":"{}"}}]}}"#,
            hex::encode(forged.encode())
        );
        assert!(matches!(
            parse_revocations(list.as_bytes(), &root),
            Err(AgentError::NotEndorsed(_))
        ));
        assert!(matches!(
            parse_instances(b"{", "check", &trust),
            Err(AgentError::Json(_))
        ));
    }

    #[test]
    fn identity_must_be_the_workloads() {
        let rng = ring::rand::SystemRandom::new();
        let me = Identity::generate(mesh(), &rng).unwrap();
        let body = |workload: &str, id: &str| {
            serde_json::json!({
                "workload": workload, "mesh": "demo", "id": id,
                "public_key": hex::encode(me.public_key()),
            })
            .to_string()
        };
        let ok = parse_public_identity(
            body("check", &me.printable_id()).as_bytes(),
            "check",
            &mesh(),
        );
        assert_eq!(&ok.unwrap(), me.public());
        assert!(parse_public_identity(
            body("other", &me.printable_id()).as_bytes(),
            "check",
            &mesh()
        )
        .is_err());
        let wrong_id = Identity::generate(mesh(), &rng).unwrap().printable_id();
        assert!(
            parse_public_identity(body("check", &wrong_id).as_bytes(), "check", &mesh()).is_err()
        );
        let sig = format!(r#"{{"signature":"{}"}}"#, "ab".repeat(64));
        assert_eq!(parse_signature(sig.as_bytes()).unwrap(), [0xab; 64]);
        assert!(parse_signature(br#"{"signature":"abcd"}"#).is_err());
        assert!(parse_signature(b"{").is_err());
    }

    /// Revocations proven by the trust log: a list with a root-signed checkpoint and
    /// inclusion proofs is taken; a proof that does not hold falls back to the
    /// revocation's own signature; a statement not from the root is refused however it
    /// is presented; a checkpoint not from the root proves nothing.
    #[test]
    fn revocations_are_proven_by_the_log_or_by_their_signature() {
        use themis_log::{Entry, Kind, Log};
        use themis_trust::{Revocation, Signed, REVOCATION_LABEL};
        let rng = ring::rand::SystemRandom::new();
        let root_key = Identity::generate(mesh(), &rng).unwrap();
        let root = MeshRoot {
            mesh: mesh(),
            key: *root_key.public_key(),
        };
        let revoke = |by: &Identity, n: u8| {
            Signed::sign(
                by,
                REVOCATION_LABEL,
                &Revocation {
                    mesh: "demo".into(),
                    id: [n; 32],
                    issued_at: 1,
                    reason: String::new(),
                },
            )
        };
        // A revocation as the agent lists it: its leaf index and proof, if logged.
        type Listed = (Signed, Option<(u64, Vec<u8>)>);
        let mut log = Log::new(root.clone());
        let statements: Vec<Signed> = (0..5).map(|n| revoke(&root_key, n)).collect();
        for statement in &statements {
            log.append(Entry::new(Kind::Revocation, statement.clone()).encode())
                .unwrap();
        }
        let checkpoint = hex::encode(log.sign_checkpoint(&root_key, 1).encoded());
        let listed = |checkpoint: Option<&str>, entries: &[Listed]| {
            serde_json::to_vec(&api::Revocations {
                checkpoint: checkpoint.map(str::to_owned),
                revocations: entries
                    .iter()
                    .map(|(signed, logged)| api::Revocation {
                        id: String::new(),
                        issued_at: 1,
                        reason: String::new(),
                        revocation: hex::encode(signed.encode()),
                        logged: logged.as_ref().map(|(index, proof)| api::Logged {
                            index: *index,
                            proof: hex::encode(proof),
                        }),
                    })
                    .collect(),
                long_poll: false,
                list: None,
                from: None,
                total: None,
            })
            .unwrap()
        };
        let proven: Vec<Listed> = statements
            .iter()
            .enumerate()
            .map(|(i, s)| {
                (
                    s.clone(),
                    Some((i as u64, log.inclusion_proof(i as u64).unwrap())),
                )
            })
            .collect();
        let all = parse_revocations(&listed(Some(&checkpoint), &proven), &root).unwrap();
        assert_eq!(all.len(), 5);
        // Proofs that do not hold (another index): each revocation's signature decides.
        let mut shifted = proven.clone();
        for (n, entry) in shifted.iter_mut().enumerate() {
            entry.1 = Some(((n as u64 + 1) % 5, log.inclusion_proof(n as u64).unwrap()));
        }
        assert_eq!(
            parse_revocations(&listed(Some(&checkpoint), &shifted), &root)
                .unwrap()
                .len(),
            5
        );
        // A revocation signed by another key, with a proof of a genuine leaf: refused.
        let stranger = Identity::generate(mesh(), &rng).unwrap();
        let mut forged = proven.clone();
        forged[2].0 = revoke(&stranger, 2);
        assert!(parse_revocations(&listed(Some(&checkpoint), &forged), &root).is_err());
        // A checkpoint signed by another key proves nothing: signatures decide again.
        let mut other = Log::new(root.clone());
        other
            .append(Entry::new(Kind::Revocation, statements[0].clone()).encode())
            .unwrap();
        let foreign = hex::encode(other.sign_checkpoint(&stranger, 1).encoded());
        assert_eq!(
            parse_revocations(&listed(Some(&foreign), &proven), &root)
                .unwrap()
                .len(),
            5
        );
        // A statement the root signed under another label is no revocation, proof or not.
        let relabelled = Signed::sign(
            &root_key,
            themis_trust::GRANT_LABEL,
            &Revocation {
                mesh: "demo".into(),
                id: [9; 32],
                issued_at: 1,
                reason: String::new(),
            },
        );
        assert!(parse_revocations(&listed(None, &[(relabelled, None)]), &root).is_err());
    }
}

/// A confused or lying agent's delegation answers: each is refused before the worker
/// signs a handshake with it (its peers would refuse the handshake, or worse, the
/// worker would speak for a workload other than its own).
#[cfg(test)]
mod delegated_tests {
    use super::*;
    use crate::testing::{delegated, HOUR, NOW};
    use themis_core::delegation::HandshakeSigner;
    use themis_core::Identity;

    struct Case {
        mesh: MeshName,
        workload: Identity,
        key_seed: [u8; 32],
    }

    impl Case {
        fn new() -> Case {
            let rng = ring::rand::SystemRandom::new();
            let mesh = MeshName::new("demo").unwrap();
            Case {
                workload: Identity::generate(mesh.clone(), &rng).unwrap(),
                mesh,
                key_seed: [7; 32],
            }
        }

        fn key(&self) -> DelegatedKey {
            DelegatedKey::from_seed(&self.key_seed).unwrap()
        }

        /// The agent's answer delegating `to` (this case's key, by default) as
        /// `signer`, named `workload`, edited by `edit`.
        fn answer(&self, edit: impl FnOnce(&mut api::Delegated)) -> Vec<u8> {
            let key = *self.key().public_key();
            let mut answer = delegated(&self.workload, key, Some(b"an endorsement"));
            edit(&mut answer);
            serde_json::to_vec(&answer).unwrap()
        }

        fn parse(&self, body: &[u8], now: u64) -> Result<(Credential, u64), AgentError> {
            parse_delegated(body, self.key(), "check", &self.mesh, now)
        }
    }

    #[test]
    fn a_good_delegation_signs_as_the_workload_and_carries_its_endorsement() {
        let case = Case::new();
        let (credential, renew_at) = case.parse(&case.answer(|_| {}), NOW).unwrap();
        assert_eq!(
            credential.identity().public_key(),
            case.workload.public_key()
        );
        assert_eq!(credential.endorsement(), b"an endorsement");
        assert_eq!(renew_at, NOW + HOUR / 2);
        // An agent's renewal time past the delegation's half-life, or at once, is
        // not taken as it is: the key would lapse unrenewed, or be asked for in a loop.
        for (said, taken) in [(u64::MAX, NOW + HOUR / 2), (0, NOW + 1_000)] {
            let body = case.answer(|a| a.renew_at_ms = said);
            assert_eq!(case.parse(&body, NOW).unwrap().1, taken);
        }
    }

    /// (The agent is the authority on which key is the workload's: an answer naming
    /// another key, consistent in itself, is for the worker to refuse when it knows
    /// the identity already, `Root::install_credential`.)
    #[test]
    fn a_lying_agents_delegation_is_refused() {
        let case = Case::new();
        let rng = ring::rand::SystemRandom::new();
        let other = Identity::generate(case.mesh.clone(), &rng).unwrap();
        let delegation_by = |signer: &Identity, key: [u8; 32]| {
            hex::encode(Delegation::issue(signer, key, NOW, HOUR).encode())
        };
        let mine = *case.key().public_key();
        let refused: Vec<(&str, Vec<u8>, u64)> = vec![
            ("not JSON", b"{".to_vec(), NOW),
            (
                "for another workload",
                case.answer(|a| a.identity.workload = "billing".parse().unwrap()),
                NOW,
            ),
            (
                "of another mesh",
                case.answer(|a| a.identity.mesh = "other".into()),
                NOW,
            ),
            (
                "a key that is not the id's",
                case.answer(|a| a.identity.public_key = hex::encode(other.public_key())),
                NOW,
            ),
            (
                "signed by another workload",
                case.answer(|a| a.delegation = delegation_by(&other, mine)),
                NOW,
            ),
            (
                "for another delegated key",
                case.answer(|a| a.delegation = delegation_by(&case.workload, [9; 32])),
                NOW,
            ),
            ("not hex", case.answer(|a| a.delegation = "zz".into()), NOW),
            (
                "cut short",
                case.answer(|a| a.delegation.truncate(a.delegation.len() - 2)),
                NOW,
            ),
            (
                "an endorsement that is not hex",
                case.answer(|a| a.endorsement = Some("zz".into())),
                NOW,
            ),
            ("expired", case.answer(|_| {}), NOW + 2 * HOUR),
            ("not valid yet", case.answer(|_| {}), NOW - HOUR),
        ];
        for (what, body, now) in refused {
            assert!(case.parse(&body, now).is_err(), "{what}: taken");
        }
        // Every flipped byte of the delegation is refused too.
        let good: api::Delegated = serde_json::from_slice(&case.answer(|_| {})).unwrap();
        let bytes = hex::decode(&good.delegation).unwrap();
        for i in 0..bytes.len() {
            let mut flipped = bytes.clone();
            flipped[i] ^= 0x01;
            let body = case.answer(|a| a.delegation = hex::encode(&flipped));
            assert!(case.parse(&body, NOW).is_err(), "byte {i} flipped: taken");
        }
    }
}
