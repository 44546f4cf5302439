//! Service instance records: what the registry stores in the DHT under a service name.
//!
//! The DHT authenticates who routes, not what is stored: the node responsible for a
//! name can answer a `Get` with anything. So every record is signed by the workload it
//! announces, and a resolver keeps only records whose signature verifies under a key
//! that hashes to the announced id, in this mesh, for the service asked. A holder can
//! still withhold records or serve stale ones; it cannot invent or alter one.
//!
//! Withdrawal: the DHT has no delete (a delete would need the same authorisation), so
//! deregistering stores a signed *tombstone*: a record without an endpoint. Each
//! record carries a serial (the registration time in Unix milliseconds); resolvers keep
//! the newest record per instance and drop the instance if that is a tombstone.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use serde::{Deserialize, Serialize};
use serde_big_array::BigArray;
use themis_core::identity::verify_statement;
use themis_core::{Identity, MeshName, PeerId};

use crate::names::ServiceName;

/// The label instance records are signed under (see `Identity::sign_statement`).
pub const RECORD_LABEL: &str = "themis/1 registry instance record";
/// Most metadata entries on one instance.
pub const MAX_METADATA_ENTRIES: usize = 16;
/// Longest metadata key, in bytes.
pub const MAX_METADATA_KEY_LEN: usize = 63;
/// Longest metadata value, in bytes.
pub const MAX_METADATA_VALUE_LEN: usize = 255;

/// Free-form labels of an instance, e.g. `version = v2` for canaries.
pub type Metadata = BTreeMap<String, String>;

/// Why a record was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    /// Not a record at all.
    #[error("malformed record")]
    Malformed,
    /// The signature does not verify under the record's key.
    #[error("bad signature")]
    BadSignature,
    /// A record of another mesh.
    #[error("record of another mesh")]
    WrongMesh,
    /// A record of another service than the one resolved.
    #[error("record of another service")]
    WrongService,
    /// Metadata over its limits, or a record over the DHT's value limit.
    #[error(
        "metadata too large (at most {MAX_METADATA_ENTRIES} entries, keys up to \
         {MAX_METADATA_KEY_LEN} bytes, values up to {MAX_METADATA_VALUE_LEN} bytes)"
    )]
    TooLarge,
}

impl RecordError {
    /// A short, stable name for metrics labels.
    pub fn reason(&self) -> &'static str {
        match self {
            RecordError::Malformed => "malformed",
            RecordError::BadSignature => "bad_signature",
            RecordError::WrongMesh => "wrong_mesh",
            RecordError::WrongService => "wrong_service",
            RecordError::TooLarge => "too_large",
        }
    }
}

/// What is signed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Body {
    mesh: String,
    service: String,
    public_key: [u8; 32],
    endpoint: Option<SocketAddr>,
    metadata: Metadata,
    serial: u64,
}

/// What is stored: the body exactly as signed, and the signature.
#[derive(Serialize, Deserialize)]
struct Signed {
    body: Vec<u8>,
    #[serde(with = "BigArray")]
    signature: [u8; 64],
}

/// A verified instance of a service.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Instance {
    /// The workload's id (it hashes its public key with the mesh name).
    pub id: PeerId,
    /// The workload's Ed25519 public key.
    pub public_key: [u8; 32],
    /// Where its proxy accepts mesh traffic; `None` in a tombstone.
    pub endpoint: Option<SocketAddr>,
    /// Its labels.
    pub metadata: Metadata,
    /// Registration time, Unix milliseconds; the newest record of an instance wins.
    pub serial: u64,
}

fn check_metadata(metadata: &Metadata) -> Result<(), RecordError> {
    let ok = metadata.len() <= MAX_METADATA_ENTRIES
        && metadata
            .iter()
            .all(|(k, v)| k.len() <= MAX_METADATA_KEY_LEN && v.len() <= MAX_METADATA_VALUE_LEN);
    ok.then_some(()).ok_or(RecordError::TooLarge)
}

/// The signed record announcing that `workload` serves `service` at `endpoint`
/// (`None`: a tombstone withdrawing it), as the bytes to store in the DHT.
pub fn sign(
    workload: &Identity,
    service: &ServiceName,
    endpoint: Option<SocketAddr>,
    metadata: Metadata,
    serial: u64,
) -> Result<Vec<u8>, RecordError> {
    check_metadata(&metadata)?;
    let body = postcard::to_allocvec(&Body {
        mesh: workload.mesh().as_str().to_owned(),
        service: service.as_str().to_owned(),
        public_key: *workload.public_key(),
        endpoint,
        metadata,
        serial,
    })
    .map_err(|_| RecordError::Malformed)?;
    let signature = workload.sign_statement(RECORD_LABEL, &body);
    let value =
        postcard::to_allocvec(&Signed { body, signature }).map_err(|_| RecordError::Malformed)?;
    if value.len() > themis_dht::message::MAX_VALUE_LEN {
        return Err(RecordError::TooLarge);
    }
    Ok(value)
}

/// Checks a stored value as a record of `service` in `mesh`.
pub fn verify(
    value: &[u8],
    mesh: &MeshName,
    service: &ServiceName,
) -> Result<Instance, RecordError> {
    let signed: Signed = postcard::from_bytes(value).map_err(|_| RecordError::Malformed)?;
    let body: Body = postcard::from_bytes(&signed.body).map_err(|_| RecordError::Malformed)?;
    if !verify_statement(
        &body.public_key,
        RECORD_LABEL,
        &signed.body,
        &signed.signature,
    ) {
        return Err(RecordError::BadSignature);
    }
    if body.mesh != mesh.as_str() {
        return Err(RecordError::WrongMesh);
    }
    if body.service != service.as_str() {
        return Err(RecordError::WrongService);
    }
    check_metadata(&body.metadata)?;
    Ok(Instance {
        id: PeerId::derive(&body.public_key, mesh.as_str()),
        public_key: body.public_key,
        endpoint: body.endpoint,
        metadata: body.metadata,
        serial: body.serial,
    })
}

/// The live instances among verified records: the newest record of each instance, if
/// it is not a tombstone. Sorted by id.
pub fn live(records: impl IntoIterator<Item = Instance>) -> Vec<Instance> {
    let mut newest: BTreeMap<PeerId, Instance> = BTreeMap::new();
    for record in records {
        match newest.get(&record.id) {
            Some(seen) if seen.serial >= record.serial => {}
            _ => {
                newest.insert(record.id, record);
            }
        }
    }
    newest
        .into_values()
        .filter(|i| i.endpoint.is_some())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use ring::rand::SystemRandom;

    fn workload(mesh: &str) -> Identity {
        Identity::generate(MeshName::new(mesh).unwrap(), &SystemRandom::new()).unwrap()
    }

    #[test]
    fn records_verify_only_unaltered_for_their_mesh_and_service() {
        let (w, mesh) = (workload("demo"), MeshName::new("demo").unwrap());
        let check = ServiceName::new("check").unwrap();
        let endpoint = Some("127.0.0.1:15006".parse().unwrap());
        let meta: Metadata = [("version".to_owned(), "v2".to_owned())].into();
        let value = sign(&w, &check, endpoint, meta.clone(), 7).unwrap();
        let instance = verify(&value, &mesh, &check).unwrap();
        assert_eq!(
            (instance.id, instance.endpoint, instance.metadata),
            (w.id(), endpoint, meta)
        );

        let other = ServiceName::new("other").unwrap();
        assert_eq!(
            verify(&value, &mesh, &other),
            Err(RecordError::WrongService)
        );
        assert_eq!(
            verify(&value, &MeshName::new("prod").unwrap(), &check),
            Err(RecordError::WrongMesh)
        );
        // Every byte flipped: refused, never accepted as some other valid record.
        for i in 0..value.len() {
            let mut bad = value.clone();
            bad[i] ^= 0x01;
            assert!(verify(&bad, &mesh, &check).is_err(), "byte {i}");
        }
        for len in 0..value.len() {
            assert!(verify(&value[..len], &mesh, &check).is_err());
        }
        // Another workload cannot sign for this one's key.
        let mut forged: Signed = postcard::from_bytes(&value).unwrap();
        forged.signature = workload("demo").sign_statement(RECORD_LABEL, &forged.body);
        let forged = postcard::to_allocvec(&forged).unwrap();
        assert_eq!(
            verify(&forged, &mesh, &check),
            Err(RecordError::BadSignature)
        );
    }

    #[test]
    fn the_newest_record_wins_and_tombstones_withdraw() {
        let (a, b) = (workload("demo"), workload("demo"));
        let (mesh, svc) = (
            MeshName::new("demo").unwrap(),
            ServiceName::new("check").unwrap(),
        );
        let at = |port| Some(SocketAddr::from(([127, 0, 0, 1], port)));
        let records = [
            sign(&a, &svc, at(1), Metadata::new(), 1).unwrap(),
            sign(&a, &svc, None, Metadata::new(), 2).unwrap(),
            sign(&b, &svc, None, Metadata::new(), 1).unwrap(),
            sign(&b, &svc, at(3), Metadata::new(), 3).unwrap(),
        ];
        let live = live(records.iter().map(|v| verify(v, &mesh, &svc).unwrap()));
        assert_eq!(live.len(), 1);
        assert_eq!((live[0].id, live[0].endpoint), (b.id(), at(3)));
    }

    #[test]
    fn oversize_metadata_is_refused_before_signing() {
        let w = workload("demo");
        let svc = ServiceName::new("check").unwrap();
        let many: Metadata = (0..=MAX_METADATA_ENTRIES)
            .map(|i| (i.to_string(), String::new()))
            .collect();
        assert_eq!(sign(&w, &svc, None, many, 1), Err(RecordError::TooLarge));
        let long: Metadata = [("k".to_owned(), "v".repeat(MAX_METADATA_VALUE_LEN + 1))].into();
        assert_eq!(sign(&w, &svc, None, long, 1), Err(RecordError::TooLarge));
    }
}
