//! Checking statements against the mesh root, the clock and the revocations.

use std::net::SocketAddr;

use serde::Serialize;
use themis_core::PeerId;

use crate::statement::Metadata;
use crate::{
    Admission, Grant, InstanceValue, MeshRoot, Record, Revocations, Signed, TrustError,
    ADMISSION_LABEL, GRANT_LABEL, MAX_CLOCK_SKEW_MS, MAX_GRANT_CHAIN, MAX_METADATA_ENTRIES,
    MAX_METADATA_KEY_LEN, MAX_METADATA_VALUE_LEN, MAX_RECORD_LIFETIME_MS, RECORD_LABEL,
};

/// An endorsed instance of a service, from a verified [`InstanceValue`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Instance {
    /// The workload's id.
    #[serde(serialize_with = "hex_id")]
    pub id: PeerId,
    /// The workload's public key.
    #[serde(with = "hex::serde")]
    pub public_key: [u8; 32],
    /// Its endpoint; `None` in a tombstone.
    pub endpoint: Option<SocketAddr>,
    /// Its labels.
    pub metadata: Metadata,
    /// Unix ms; the record's version.
    pub issued_at: u64,
    /// Unix ms.
    pub not_after: u64,
    /// The key that signed the record (a granted node).
    #[serde(with = "hex::serde")]
    pub endorser: [u8; 32],
}

fn hex_id<S: serde::Serializer>(id: &PeerId, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&id.to_string())
}

/// Checks statements of one mesh at one moment against a set of revocations.
#[derive(Debug, Clone, Copy)]
pub struct Verifier<'a> {
    /// The mesh root.
    pub root: &'a MeshRoot,
    /// Now, Unix ms.
    pub now_ms: u64,
    /// Known revocations.
    pub revoked: &'a Revocations,
}

impl Verifier<'_> {
    fn mesh(&self, mesh: &str) -> Result<(), TrustError> {
        (mesh == self.root.mesh.as_str())
            .then_some(())
            .ok_or(TrustError::WrongMesh)
    }

    fn current(&self, issued_at: u64, not_after: Option<u64>) -> Result<(), TrustError> {
        if issued_at > self.now_ms.saturating_add(MAX_CLOCK_SKEW_MS) {
            return Err(TrustError::FromTheFuture);
        }
        match not_after {
            Some(t) if t <= self.now_ms => Err(TrustError::Expired),
            _ => Ok(()),
        }
    }

    fn not_revoked(&self, key: &[u8; 32]) -> Result<(), TrustError> {
        if self.revoked.contains_key(self.root, key) {
            Err(TrustError::Revoked)
        } else {
            Ok(())
        }
    }

    /// Checks an encoded admission credential for the peer holding `node_key`.
    pub fn admission(&self, bytes: &[u8], node_key: &[u8; 32]) -> Result<Admission, TrustError> {
        let signed = Signed::decode(bytes)?;
        if signed.signer != self.root.key {
            return Err(TrustError::NotFromRoot);
        }
        let admission: Admission = signed.open(ADMISSION_LABEL)?;
        self.mesh(&admission.mesh)?;
        if &admission.node_key != node_key {
            return Err(TrustError::WrongKey);
        }
        self.current(admission.issued_at, admission.not_after)?;
        self.not_revoked(node_key)?;
        Ok(admission)
    }

    /// Checks the admission a peer presented, for the peer the secure channel
    /// authenticated as `peer`: the admitted key must hash to that id.
    pub fn admission_of(&self, bytes: &[u8], peer: &PeerId) -> Result<Admission, TrustError> {
        let signed = Signed::decode(bytes)?;
        let claimed: Admission = crate::statement::decode(&signed.body)?;
        if PeerId::derive(&claimed.node_key, self.root.mesh.as_str()) != *peer {
            return Err(TrustError::WrongKey);
        }
        self.admission(bytes, &claimed.node_key)
    }

    /// Checks a grant chain for `service`: the first link signed by the root, each next
    /// by the previous grantee (which must be allowed to delegate), none expired or
    /// revoked. Returns the last grant (whose grantee may endorse).
    pub fn grants(&self, chain: &[Signed], service: &str) -> Result<Grant, TrustError> {
        if chain.is_empty() || chain.len() > MAX_GRANT_CHAIN {
            return Err(TrustError::ChainLength);
        }
        let mut issuer = self.root.key;
        let mut may_delegate = true;
        let mut last = None;
        for (i, link) in chain.iter().enumerate() {
            if link.signer != issuer {
                return Err(if i == 0 {
                    TrustError::NotFromRoot
                } else {
                    TrustError::BrokenChain
                });
            }
            if !may_delegate {
                return Err(TrustError::NotDelegable);
            }
            let grant: Grant = link.open(GRANT_LABEL)?;
            self.mesh(&grant.mesh)?;
            if grant.service != service {
                return Err(TrustError::WrongService);
            }
            self.current(grant.issued_at, grant.not_after)?;
            self.not_revoked(&grant.grantee)?;
            issuer = grant.grantee;
            may_delegate = grant.delegate;
            last = Some(grant);
        }
        Ok(last.expect("the chain is not empty"))
    }

    /// Checks a stored value as an endorsed instance (or tombstone) of `service`.
    pub fn instance(&self, bytes: &[u8], service: &str) -> Result<Instance, TrustError> {
        let value = InstanceValue::decode(bytes)?;
        self.instance_value(&value, service)
    }

    /// [`Verifier::instance`] on a decoded value.
    pub fn instance_value(
        &self,
        value: &InstanceValue,
        service: &str,
    ) -> Result<Instance, TrustError> {
        let grant = self.grants(&value.grants, service)?;
        if value.record.signer != grant.grantee {
            return Err(TrustError::NotGranted);
        }
        let record: Record = value.record.open(RECORD_LABEL)?;
        self.mesh(&record.mesh)?;
        if record.service != service {
            return Err(TrustError::WrongService);
        }
        check_metadata(&record.metadata)?;
        if record.not_after <= record.issued_at
            || record.not_after - record.issued_at > MAX_RECORD_LIFETIME_MS
        {
            return Err(TrustError::BadLifetime);
        }
        self.current(record.issued_at, Some(record.not_after))?;
        self.not_revoked(&record.workload_key)?;
        Ok(Instance {
            id: PeerId::derive(&record.workload_key, self.root.mesh.as_str()),
            public_key: record.workload_key,
            endpoint: record.endpoint,
            metadata: record.metadata,
            issued_at: record.issued_at,
            not_after: record.not_after,
            endorser: value.record.signer,
        })
    }
}

/// Metadata within [`MAX_METADATA_ENTRIES`], [`MAX_METADATA_KEY_LEN`] and
/// [`MAX_METADATA_VALUE_LEN`].
pub fn check_metadata(metadata: &Metadata) -> Result<(), TrustError> {
    let ok = metadata.len() <= MAX_METADATA_ENTRIES
        && metadata
            .iter()
            .all(|(k, v)| k.len() <= MAX_METADATA_KEY_LEN && v.len() <= MAX_METADATA_VALUE_LEN);
    ok.then_some(()).ok_or(TrustError::TooLarge)
}

/// The live instances among verified records: for each endorsing node and instance,
/// its newest record (by `issued_at`), unless that is a tombstone. Sorted by id.
///
/// Per endorser, not per instance: a node granted the service may endorse any key
/// for it, so if one node's newer record or tombstone could replace another's, any
/// granted node could withdraw or redirect every other node's instances. An instance
/// endorsed by two nodes appears once per endorser (callers try each in turn).
pub fn live(records: impl IntoIterator<Item = Instance>) -> Vec<Instance> {
    let mut newest: std::collections::BTreeMap<(PeerId, [u8; 32]), Instance> = Default::default();
    for record in records {
        let key = (record.id, record.endorser);
        match newest.get(&key) {
            Some(seen) if seen.issued_at >= record.issued_at => {}
            _ => {
                newest.insert(key, record);
            }
        }
    }
    newest
        .into_values()
        .filter(|i| i.endpoint.is_some())
        .collect()
}
