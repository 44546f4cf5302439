//! The signed statements and their encoding (postcard, like the rest of the wire).

use std::collections::BTreeMap;
use std::net::SocketAddr;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_big_array::BigArray;
use themis_core::identity::verify_statement;
use themis_core::Identity;

use crate::{TrustError, MAX_ENCODED_LEN};

/// The label node admissions are signed under.
pub const ADMISSION_LABEL: &str = "themis/1 node admission";
/// The label service grants are signed under.
pub const GRANT_LABEL: &str = "themis/1 service grant";
/// The label instance records are signed under.
pub const RECORD_LABEL: &str = "themis/1 instance record";
/// The label revocations are signed under.
pub const REVOCATION_LABEL: &str = "themis/1 revocation";

/// Free-form labels of an instance, e.g. `version = v2` for canaries.
pub type Metadata = BTreeMap<String, String>;

/// A statement as signed: the signer's public key, the encoded body exactly as
/// signed, and the Ed25519 signature over it (under the statement kind's label).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Signed {
    /// The signer's Ed25519 public key.
    pub signer: [u8; 32],
    /// The encoded statement.
    pub body: Vec<u8>,
    /// `Identity::sign_statement(label, body)`.
    #[serde(with = "BigArray")]
    pub signature: [u8; 64],
}

impl Signed {
    /// Signs `body` as `signer` under `label`.
    pub fn sign(signer: &Identity, label: &str, body: &impl Serialize) -> Signed {
        let body = postcard::to_allocvec(body).expect("statements always encode");
        let signature = signer.sign_statement(label, &body);
        Signed {
            signer: *signer.public_key(),
            body,
            signature,
        }
    }

    /// Checks the signature under `label` and decodes the body.
    pub fn open<T: DeserializeOwned>(&self, label: &str) -> Result<T, TrustError> {
        if !verify_statement(&self.signer, label, &self.body, &self.signature) {
            return Err(TrustError::BadSignature);
        }
        decode(&self.body)
    }

    /// The encoded form (what files and the DHT hold).
    pub fn encode(&self) -> Vec<u8> {
        postcard::to_allocvec(self).expect("statements always encode")
    }

    /// Decodes the encoded form; checks no signature.
    pub fn decode(bytes: &[u8]) -> Result<Signed, TrustError> {
        decode(bytes)
    }
}

/// Bounded, total decoding: oversize input and trailing bytes are refused.
pub(crate) fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, TrustError> {
    if bytes.len() > MAX_ENCODED_LEN {
        return Err(TrustError::Malformed);
    }
    match postcard::take_from_bytes(bytes) {
        Ok((value, [])) => Ok(value),
        _ => Err(TrustError::Malformed),
    }
}

/// Root → node: the node key may take part in the mesh's DHT.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Admission {
    /// The mesh.
    pub mesh: String,
    /// The admitted node's public key (its ring position is `H(node_key ‖ mesh)`).
    pub node_key: [u8; 32],
    /// Unix ms.
    pub issued_at: u64,
    /// Unix ms; `None`: until revoked.
    pub not_after: Option<u64>,
}

/// Root (or a delegating grantee) → key: `grantee` may endorse instances of `service`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    /// The mesh.
    pub mesh: String,
    /// The service name.
    pub service: String,
    /// Who may endorse (sign instance records) for the service.
    pub grantee: [u8; 32],
    /// Whether the grantee may grant the service on (a per-service authority).
    pub delegate: bool,
    /// Unix ms.
    pub issued_at: u64,
    /// Unix ms; `None`: until revoked.
    pub not_after: Option<u64>,
}

/// Granted node → the world: `workload_key` serves `service` at `endpoint`
/// (`None`: a tombstone withdrawing it) from `issued_at` to `not_after`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// The mesh.
    pub mesh: String,
    /// The service name.
    pub service: String,
    /// The workload's public key (its id is `H(workload_key ‖ mesh)`).
    pub workload_key: [u8; 32],
    /// Where its proxy accepts mesh traffic; `None` in a tombstone.
    pub endpoint: Option<SocketAddr>,
    /// Labels.
    pub metadata: Metadata,
    /// Unix ms; also the record's version: the newest record of an instance wins.
    pub issued_at: u64,
    /// Unix ms.
    pub not_after: u64,
}

/// Root → everyone: the key whose id is `id` is no longer trusted, in any role.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Revocation {
    /// The mesh.
    pub mesh: String,
    /// The revoked id (`H(key ‖ mesh)`: node, authority or workload).
    pub id: [u8; 32],
    /// Unix ms.
    pub issued_at: u64,
    /// Why, for people.
    pub reason: String,
}

/// What the DHT stores under a service's object ids: a record and the grants from
/// the root to its signer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstanceValue {
    /// Root → … → the record's signer; at most [`crate::MAX_GRANT_CHAIN`].
    pub grants: Vec<Signed>,
    /// The signed [`Record`].
    pub record: Signed,
}

impl InstanceValue {
    /// The encoded form stored in the DHT.
    pub fn encode(&self) -> Vec<u8> {
        postcard::to_allocvec(self).expect("values always encode")
    }

    /// Decodes a stored value; checks no signature.
    pub fn decode(bytes: &[u8]) -> Result<InstanceValue, TrustError> {
        decode(bytes)
    }

    /// The keys a verified value rests on besides its workload's: every grantee of
    /// its chain, the endorsing node last (in a chain that verified, each link after
    /// the root's is signed by the previous grantee, and the record by the last). A
    /// revocation of any of them withdraws the instance.
    pub fn grantees(&self) -> impl Iterator<Item = [u8; 32]> + '_ {
        let later_links = self.grants.iter().skip(1);
        later_links
            .chain(std::iter::once(&self.record))
            .map(|signed| signed.signer)
    }
}
