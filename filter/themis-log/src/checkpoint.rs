//! Checkpoints: the root's signature on the log's size and root hash.

use ct_merkle::{ConsistencyProof, InclusionProof, RootHash};
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use themis_core::Identity;
use themis_trust::{MeshRoot, Signed};

use crate::{decode, LogError, HASH_LEN, MAX_CHECKPOINT_LEN, MAX_PROOF_HASHES};

/// The label checkpoints are signed under.
pub const CHECKPOINT_LABEL: &str = "themis/1 log checkpoint";

/// What the root signs: the log of `mesh` had `size` leaves hashing to `root_hash`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// The mesh.
    pub mesh: String,
    /// Leaves.
    pub size: u64,
    /// RFC 6962 tree hash of the leaves (of the empty string when `size` is 0).
    pub root_hash: [u8; HASH_LEN],
    /// Unix ms.
    pub issued_at: u64,
}

/// A checkpoint whose signature was checked against the mesh root, with its signed
/// bytes (what is passed on, and kept as evidence).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedCheckpoint {
    /// What it says.
    pub checkpoint: Checkpoint,
    encoded: Vec<u8>,
}

impl Checkpoint {
    /// Signs it with the mesh root's key.
    pub fn sign(&self, root_key: &Identity) -> SignedCheckpoint {
        let signed = Signed::sign(root_key, CHECKPOINT_LABEL, self);
        SignedCheckpoint {
            checkpoint: self.clone(),
            encoded: postcard::to_allocvec(&signed).expect("checkpoints always encode"),
        }
    }

    /// Checks that `leaf` (its bytes) is leaf `index` of the log this checkpoint
    /// describes, with an inclusion proof (concatenated hashes).
    pub fn verify_inclusion(&self, leaf: &[u8], index: u64, proof: &[u8]) -> Result<(), LogError> {
        if proof.len() > MAX_PROOF_HASHES * HASH_LEN {
            return Err(LogError::Malformed);
        }
        let proof = InclusionProof::<Sha256>::try_from_bytes(proof.to_vec())
            .map_err(|_| LogError::Malformed)?;
        self.root()
            .verify_inclusion(&leaf, index, &proof)
            .map_err(|_| LogError::BadProof)
    }

    /// Checks that this checkpoint's log extends `older`'s (append-only), with a
    /// consistency proof from `older.size` to `self.size` (concatenated hashes): what a
    /// holder of checkpoints alone (a filter, a witness) checks.
    pub fn verify_extends(&self, older: &Checkpoint, proof: &[u8]) -> Result<(), LogError> {
        if older.mesh != self.mesh || older.size > self.size {
            return Err(LogError::BadProof);
        }
        if proof.len() > MAX_PROOF_HASHES * HASH_LEN {
            return Err(LogError::Malformed);
        }
        if older.size == 0 {
            // Every log extends the empty one, whose hash is fixed.
            return (older.root_hash == crate::log::empty_root() && proof.is_empty())
                .then_some(())
                .ok_or(LogError::BadProof);
        }
        if older.size == self.size {
            return (older.root_hash == self.root_hash && proof.is_empty())
                .then_some(())
                .ok_or(LogError::BadProof);
        }
        let proof = ConsistencyProof::<Sha256>::try_from_bytes(proof.to_vec())
            .map_err(|_| LogError::Malformed)?;
        self.root()
            .verify_consistency(&older.root(), &proof)
            .map_err(|_| LogError::BadProof)
    }

    pub(crate) fn root(&self) -> RootHash<Sha256> {
        RootHash::new(self.root_hash.into(), self.size)
    }
}

impl SignedCheckpoint {
    /// Decodes `bytes` and checks they are a checkpoint of `root`'s mesh, signed by it.
    pub fn verify(root: &MeshRoot, bytes: &[u8]) -> Result<SignedCheckpoint, LogError> {
        let signed: Signed = decode(bytes, MAX_CHECKPOINT_LEN)?;
        if signed.signer != root.key {
            return Err(LogError::NotFromRoot);
        }
        let checkpoint: Checkpoint = signed.open(CHECKPOINT_LABEL).map_err(|e| match e {
            themis_trust::TrustError::BadSignature => LogError::BadSignature,
            _ => LogError::Malformed,
        })?;
        if checkpoint.mesh != root.mesh.as_str() {
            return Err(LogError::WrongMesh);
        }
        Ok(SignedCheckpoint {
            checkpoint,
            encoded: bytes.to_vec(),
        })
    }

    /// The signed bytes.
    pub fn encoded(&self) -> &[u8] {
        &self.encoded
    }

    /// Leaves.
    pub fn size(&self) -> u64 {
        self.checkpoint.size
    }
}
