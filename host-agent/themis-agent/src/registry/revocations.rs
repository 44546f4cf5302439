//! Revocations kept stored from this node: once the node knows a revocation (the
//! operator published it here, a poll found it in the DHT, or it was loaded after a
//! restart), it stores it in the DHT itself too, so revocations outlive the
//! operator's node and every agent's poll finds them. Which revocations are in
//! force is `MeshTrust`'s; this part only tracks which ones this node keeps stored,
//! and tries the others again at every poll.

use std::collections::HashSet;
use std::time::Duration;

use themis_core::PeerId;
use themis_trust::Revocations;

use super::{Registry, RegistryError};
use crate::trust::REVOCATIONS_NAME;

/// How long a stored revocation lives between re-stores (its holders keep
/// re-storing it: revocations do not expire).
const REVOCATION_TTL: Duration = Duration::from_secs(24 * 3600);

/// The revocations this node keeps stored in the DHT (as encoded).
#[derive(Default)]
pub(super) struct KeptRevocations {
    kept: HashSet<Vec<u8>>,
}

impl KeptRevocations {
    /// The revocations of `known` not kept stored from here yet: id and encoding.
    pub(super) fn missing(&self, known: &Revocations) -> Vec<(PeerId, Vec<u8>)> {
        known
            .iter()
            .filter(|(_, _, bytes)| !self.kept.contains(*bytes))
            .map(|(id, _, bytes)| (*id, bytes.to_vec()))
            .collect()
    }

    /// `bytes` is stored from here now.
    pub(super) fn kept(&mut self, bytes: Vec<u8>) {
        self.kept.insert(bytes);
    }
}

impl Registry {
    /// Publishes a root-signed revocation: this node refuses the key at once and
    /// stores the revocation in the DHT, where every agent's poll finds it.
    pub async fn publish_revocation(&self, bytes: Vec<u8>) -> Result<bool, RegistryError> {
        let new = self.trust.add_revocation(&bytes)?;
        let stored = self
            .overlay
            .store(
                REVOCATIONS_NAME,
                bytes.clone(),
                self.config.replicas,
                REVOCATION_TTL,
            )
            .await?;
        if stored.stored > 0 {
            self.kept_revocations.lock().await.kept(bytes);
        }
        Ok(new)
    }

    /// Looks for revocations in the DHT, adds the new ones, and keeps them stored
    /// from here too (so they survive without the operator). Returns how many were new.
    pub async fn poll_revocations(&self) -> Result<usize, RegistryError> {
        let found = self
            .overlay
            .resolve(REVOCATIONS_NAME, self.config.replicas)
            .await;
        // Every revocation found takes effect before anything waits on the network:
        // the revocation bound depends on it.
        let mut new = 0;
        for value in found.iter().flat_map(|f| &f.values) {
            match self.trust.add_revocation(value) {
                Ok(true) => new += 1,
                Ok(false) => {}
                Err(error) => self.metrics.record_refused(error.reason()),
            }
        }
        self.keep_revocations().await;
        found?;
        Ok(new)
    }

    /// Stores, from this node too, every revocation it knows and does not keep stored
    /// yet (the DHT then re-stores them periodically): those found by a poll, and
    /// those loaded from the state directory after a restart. A failed store is tried
    /// again at the next poll.
    async fn keep_revocations(&self) {
        // Held throughout: a concurrent publish waits rather than store twice.
        let mut kept = self.kept_revocations.lock().await;
        for (id, bytes) in kept.missing(&self.trust.revocations()) {
            let k = self.config.replicas;
            match self
                .overlay
                .store(REVOCATIONS_NAME, bytes.clone(), k, REVOCATION_TTL)
                .await
            {
                Ok(stored) if stored.stored > 0 => kept.kept(bytes),
                Ok(_) => {
                    tracing::debug!(%id, "no replica took a revocation yet; trying again at the next poll")
                }
                Err(error) => {
                    tracing::debug!(%id, %error, "could not store a revocation; trying again at the next poll")
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::endorser::tests::Mesh;
    use super::*;

    #[test]
    fn a_known_revocation_is_missing_until_kept_and_only_then() {
        let mesh = Mesh::new(&[]);
        let (first, second) = (mesh.workload(), mesh.workload());
        let mut kept = KeptRevocations::default();
        assert!(kept.missing(&mesh.trust.revocations()).is_empty());

        mesh.revoke(&first);
        let missing = kept.missing(&mesh.trust.revocations());
        assert_eq!(missing.len(), 1);
        assert_eq!(missing[0].0, first.id());

        // A store that failed marks nothing: the next poll tries it again.
        assert_eq!(kept.missing(&mesh.trust.revocations()), missing);

        kept.kept(missing[0].1.clone());
        assert!(kept.missing(&mesh.trust.revocations()).is_empty());

        mesh.revoke(&second);
        let missing = kept.missing(&mesh.trust.revocations());
        assert_eq!(missing.len(), 1);
        assert_eq!(missing[0].0, second.id());
    }

    #[test]
    fn bytes_kept_that_are_no_known_revocation_change_nothing() {
        let mesh = Mesh::new(&[]);
        let workload = mesh.workload();
        mesh.revoke(&workload);
        let mut kept = KeptRevocations::default();
        kept.kept(b"forged".to_vec());
        assert_eq!(kept.missing(&mesh.trust.revocations()).len(), 1);
    }
}
