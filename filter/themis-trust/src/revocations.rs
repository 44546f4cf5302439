//! The revocations a node knows, verified.

use std::collections::BTreeMap;

use themis_core::PeerId;

use crate::{MeshRoot, Revocation, Signed, TrustError, MAX_REASON_LEN, REVOCATION_LABEL};

/// Verified revocations by revoked id, with the signed bytes to pass on, and the
/// order they arrived in: a set that only grows, so a position in that order names
/// the same revocations for as long as the set lives ([`Revocations::page`]: an
/// agent serves its filters what is new since a position, not the whole set).
#[derive(Debug, Clone, Default)]
pub struct Revocations {
    by_id: BTreeMap<PeerId, (Revocation, Vec<u8>)>,
    arrived: Vec<PeerId>,
}

impl Revocations {
    /// No revocations.
    pub fn new() -> Self {
        Self::default()
    }

    /// Checks an encoded revocation against the root (revocations never expire).
    pub fn verify(root: &MeshRoot, bytes: &[u8]) -> Result<Revocation, TrustError> {
        Self::read(root, bytes, true)
    }

    /// The revocation `bytes` hold if they are the root's, of this mesh and within
    /// bounds; its signature is checked if `check_signature`.
    fn read(
        root: &MeshRoot,
        bytes: &[u8],
        check_signature: bool,
    ) -> Result<Revocation, TrustError> {
        let signed = Signed::decode(bytes)?;
        if signed.signer != root.key {
            return Err(TrustError::NotFromRoot);
        }
        let revocation: Revocation = if check_signature {
            signed.open(REVOCATION_LABEL)?
        } else {
            crate::statement::decode(&signed.body)?
        };
        if revocation.mesh != root.mesh.as_str() {
            return Err(TrustError::WrongMesh);
        }
        if revocation.reason.len() > MAX_REASON_LEN {
            return Err(TrustError::TooLarge);
        }
        Ok(revocation)
    }

    /// Adds an encoded revocation whose signature the caller need not check: it proved
    /// the revocation is a leaf of the trust log under a root-signed checkpoint (which
    /// commits to it). Still the root's and of this mesh; `Ok(true)` if it was new.
    pub fn add_proven(&mut self, root: &MeshRoot, bytes: &[u8]) -> Result<bool, TrustError> {
        let revocation = Self::read(root, bytes, false)?;
        Ok(self.insert(revocation, bytes))
    }

    /// Verifies and adds an encoded revocation; `Ok(true)` if it was new.
    pub fn add(&mut self, root: &MeshRoot, bytes: &[u8]) -> Result<bool, TrustError> {
        let revocation = Self::verify(root, bytes)?;
        Ok(self.insert(revocation, bytes))
    }

    /// Keeps `revocation` (the first of its id wins); `true` if it was new.
    fn insert(&mut self, revocation: Revocation, bytes: &[u8]) -> bool {
        let id = PeerId(revocation.id);
        if self.by_id.contains_key(&id) {
            return false;
        }
        self.by_id.insert(id, (revocation, bytes.to_vec()));
        self.arrived.push(id);
        true
    }

    /// Adds `other`'s revocations to these (a revocation held is never taken back);
    /// the number that were new.
    pub fn merge(&mut self, other: Revocations) -> usize {
        let before = self.by_id.len();
        let mut other = other;
        for id in other.arrived {
            if let Some(held) = other.by_id.remove(&id) {
                if let std::collections::btree_map::Entry::Vacant(slot) = self.by_id.entry(id) {
                    slot.insert(held);
                    self.arrived.push(id);
                }
            }
        }
        self.by_id.len() - before
    }

    /// Whether `id` is revoked.
    pub fn contains(&self, id: &PeerId) -> bool {
        self.by_id.contains_key(id)
    }

    /// Whether the key is revoked in `root`'s mesh.
    pub fn contains_key(&self, root: &MeshRoot, key: &[u8; 32]) -> bool {
        !self.by_id.is_empty() && self.contains(&PeerId::derive(key, root.mesh.as_str()))
    }

    /// How many.
    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    /// At most `limit` revocations from position `from` of the order they arrived in,
    /// with their signed bytes (none past the end).
    pub fn page(
        &self,
        from: usize,
        limit: usize,
    ) -> impl Iterator<Item = (&PeerId, &Revocation, &[u8])> {
        self.arrived
            .iter()
            .skip(from)
            .take(limit)
            .filter_map(|id| self.by_id.get_key_value(id))
            .map(|(id, (r, b))| (id, r, b.as_slice()))
    }

    /// Each revocation with its signed bytes.
    pub fn iter(&self) -> impl Iterator<Item = (&PeerId, &Revocation, &[u8])> {
        self.by_id.iter().map(|(id, (r, b))| (id, r, b.as_slice()))
    }
}
