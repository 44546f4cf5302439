//! The mesh's trust log: every decision the mesh root signs (admissions, grants,
//! revocations) is a leaf of one append-only Merkle tree (RFC 6962/9162 hashing, by
//! the `ct-merkle` crate), and the root signs checkpoints of it: (mesh, size, root
//! hash). Anchors: Certificate Transparency, C2SP signed checkpoints, Sigsum.
//!
//! * The operator's offline tool [`Log::append`]s statements and signs a
//!   [`Checkpoint`] with the mesh root ([`Checkpoint::sign`]).
//! * Every agent holds the whole log. It takes a newer checkpoint and the leaves it
//!   lacks from any peer with [`Log::extend`], trusting the peer for nothing: the
//!   checkpoint must be signed by the root, every leaf must be a root-signed
//!   statement of this mesh, and the leaves must hash to the signed root on top of
//!   what the agent already holds (so a peer cannot truncate, reorder, fork or flip a
//!   bit of the log without the root's key).
//! * Agents compare the checkpoints they hold ([`Log::audit`]): two root-signed
//!   checkpoints that cannot both describe one append-only log are a [`Fork`], the
//!   evidence that the root showed different nodes different histories.
//! * A holder of a checkpoint alone (a filter) checks that a leaf is in it with an
//!   inclusion proof ([`Checkpoint::verify_inclusion`]).
//!
//! Sans-IO like the rest of the core: time is passed in, bytes come and go.
//! See `docs/PROTOCOL.md` §6.13.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod checkpoint;
mod copy;
mod entry;
mod log;

pub use checkpoint::{Checkpoint, SignedCheckpoint, CHECKPOINT_LABEL};
pub use copy::MAX_COPY_LEN;
pub use entry::{Entry, Kind, Statement};
pub use log::{Audit, Fork, Log};

/// The longest leaf (an encoded [`Entry`]) any decoder here accepts.
pub const MAX_LEAF_LEN: usize = themis_trust::MAX_ENCODED_LEN + 16;
/// The longest encoded checkpoint.
pub const MAX_CHECKPOINT_LEN: usize = 512;
/// The most hashes a proof may hold: a tree of 2^63 leaves needs fewer than 128.
pub const MAX_PROOF_HASHES: usize = 128;
/// Hash length (SHA-256).
pub const HASH_LEN: usize = 32;

/// Why a leaf, checkpoint, proof or batch of leaves was refused. The variants are
/// what operators read; [`LogError::reason`] is the metrics label.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LogError {
    /// Not the encoding expected, or over its size limit.
    #[error("malformed log data")]
    Malformed,
    /// The statement or checkpoint was not signed by the mesh root.
    #[error("not signed by the mesh root")]
    NotFromRoot,
    /// A signature does not verify.
    #[error("bad signature")]
    BadSignature,
    /// Made for another mesh.
    #[error("made for another mesh")]
    WrongMesh,
    /// A checkpoint older (smaller) than the one held: a rollback, refused.
    #[error("the checkpoint is older than the one held (size {offered} < {held})")]
    Rollback {
        /// The offered checkpoint's size.
        offered: u64,
        /// The held one's.
        held: u64,
    },
    /// The leaves offered do not bring the log to the checkpoint's size.
    #[error("{leaves} leaves do not take a log of {held} to the checkpoint's {size}")]
    SizeMismatch {
        /// Leaves held.
        held: u64,
        /// Leaves offered.
        leaves: u64,
        /// The checkpoint's size.
        size: u64,
    },
    /// The leaves do not hash to the checkpoint's root on top of what is held: the
    /// peer changed a leaf, or the root signed a log that does not extend this one.
    #[error("the leaves do not hash to the checkpoint's root")]
    RootMismatch,
    /// An inclusion or consistency proof does not verify.
    #[error("the proof does not verify")]
    BadProof,
    /// A leaf whose statement does not verify.
    #[error("leaf {index}: {error}")]
    Leaf {
        /// Its index in the log.
        index: u64,
        /// Why.
        error: themis_trust::TrustError,
    },
}

impl LogError {
    /// A short, stable name for metrics labels.
    pub fn reason(&self) -> &'static str {
        match self {
            LogError::Malformed => "malformed",
            LogError::NotFromRoot => "not_from_root",
            LogError::BadSignature => "bad_signature",
            LogError::WrongMesh => "wrong_mesh",
            LogError::Rollback { .. } => "rollback",
            LogError::SizeMismatch { .. } => "size_mismatch",
            LogError::RootMismatch => "root_mismatch",
            LogError::BadProof => "bad_proof",
            LogError::Leaf { .. } => "bad_leaf",
        }
    }
}

/// Bounded, total decoding: oversize input and trailing bytes are refused.
pub(crate) fn decode<T: serde::de::DeserializeOwned>(
    bytes: &[u8],
    limit: usize,
) -> Result<T, LogError> {
    if bytes.len() > limit {
        return Err(LogError::Malformed);
    }
    match postcard::take_from_bytes(bytes) {
        Ok((value, [])) => Ok(value),
        _ => Err(LogError::Malformed),
    }
}
