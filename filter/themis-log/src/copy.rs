//! A whole copy of the log as one blob: what an agent keeps on disk, what the
//! operator's mesh directory holds, what `themis log verify` reads. Loading a copy
//! verifies all of it, from the first leaf, as if a peer had offered it.

use serde::{Deserialize, Serialize};
use themis_trust::MeshRoot;

use crate::{Log, LogError, MAX_LEAF_LEN};

/// What every copy starts with.
const MAGIC: &[u8] = b"themis log copy v1\n";
/// The largest copy read: a million leaves of a few hundred bytes.
pub const MAX_COPY_LEN: usize = 512 * 1024 * 1024;

#[derive(Serialize, Deserialize)]
struct Copy {
    checkpoint: Vec<u8>,
    leaves: Vec<Vec<u8>>,
}

impl Log {
    /// The copy's bytes: its checkpoint and every leaf. `None` if it has no
    /// checkpoint (nothing a reader could verify).
    pub fn to_copy(&self) -> Option<Vec<u8>> {
        let copy = Copy {
            checkpoint: self.checkpoint()?.encoded().to_vec(),
            leaves: self.leaves(0, usize::MAX).to_vec(),
        };
        let mut bytes = MAGIC.to_vec();
        bytes.extend(postcard::to_allocvec(&copy).expect("copies always encode"));
        Some(bytes)
    }

    /// Reads and verifies a whole copy under `root`: the checkpoint is the root's and
    /// every leaf, from the first, is a root-signed statement hashing to it.
    pub fn from_copy(root: MeshRoot, bytes: &[u8]) -> Result<Log, LogError> {
        if bytes.len() > MAX_COPY_LEN {
            return Err(LogError::Malformed);
        }
        let body = bytes.strip_prefix(MAGIC).ok_or(LogError::Malformed)?;
        let copy: Copy = match postcard::take_from_bytes(body) {
            Ok((copy, [])) => copy,
            _ => return Err(LogError::Malformed),
        };
        if copy.leaves.iter().any(|l| l.len() > MAX_LEAF_LEN) {
            return Err(LogError::Malformed);
        }
        let mut log = Log::new(root);
        log.extend(&copy.checkpoint, &copy.leaves)?;
        Ok(log)
    }
}
