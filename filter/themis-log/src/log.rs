//! One copy of the log: its leaves, their tree, the newest checkpoint that covers
//! them, and what the statements say.

use ct_merkle::mem_backed_tree::MemoryBackedTree;
use ct_merkle::{ConsistencyProof, RootHash};
use sha2::{Digest, Sha256};
use themis_core::Identity;
use themis_trust::MeshRoot;

use crate::checkpoint::{Checkpoint, SignedCheckpoint};
use crate::entry::{Entry, Statement};
use crate::{LogError, HASH_LEN};

/// A copy of the mesh's log. Every leaf it holds was verified as a root-signed
/// statement of this mesh when it was added.
#[derive(Debug, Clone)]
pub struct Log {
    root: MeshRoot,
    tree: MemoryBackedTree<Sha256, Vec<u8>>,
    statements: Vec<Statement>,
    checkpoint: Option<SignedCheckpoint>,
}

/// What comparing a peer's checkpoint with this copy found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Audit {
    /// Theirs describes this log (the same one, or a prefix of it).
    Consistent,
    /// Theirs is newer: take its leaves ([`Log::extend`]) to check it.
    Ahead,
    /// Theirs and ours cannot both describe one append-only log.
    Fork(Fork),
}

/// Evidence that the root signed two histories: two checkpoints, both signed by the
/// root, that no append-only log satisfies. Anyone holding the root key checks the
/// signatures; anyone holding either log (or asking for a consistency proof, which
/// cannot exist) checks the rest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fork {
    /// The checkpoint this copy holds (signed bytes).
    pub ours: Vec<u8>,
    /// The one that contradicts it (signed bytes).
    pub theirs: Vec<u8>,
    /// For people.
    pub why: String,
}

/// The tree hash of the empty log (RFC 6962: the hash of the empty string).
pub(crate) fn empty_root() -> [u8; HASH_LEN] {
    Sha256::digest([]).into()
}

/// The tree hash of `tree`'s leaves.
fn tree_hash(tree: &MemoryBackedTree<Sha256, Vec<u8>>) -> [u8; HASH_LEN] {
    if tree.is_empty() {
        return empty_root();
    }
    (*tree.root().as_bytes()).into()
}

impl Log {
    /// An empty copy for `root`'s mesh.
    pub fn new(root: MeshRoot) -> Log {
        Log {
            root,
            tree: MemoryBackedTree::new(),
            statements: Vec::new(),
            checkpoint: None,
        }
    }

    /// The mesh root it is checked against.
    pub fn mesh_root(&self) -> &MeshRoot {
        &self.root
    }

    /// Leaves held.
    pub fn size(&self) -> u64 {
        self.tree.len()
    }

    /// The newest checkpoint taken (by [`Log::extend`] or [`Log::sign_checkpoint`]).
    pub fn checkpoint(&self) -> Option<&SignedCheckpoint> {
        self.checkpoint.as_ref()
    }

    /// The tree hash of every leaf held.
    pub fn root_hash(&self) -> [u8; HASH_LEN] {
        tree_hash(&self.tree)
    }

    /// Leaf `index`'s bytes.
    pub fn leaf(&self, index: u64) -> Option<&[u8]> {
        self.tree
            .get(usize::try_from(index).ok()?)
            .map(Vec::as_slice)
    }

    /// Up to `max` leaves from `from` on (what a peer asks for to catch up).
    pub fn leaves(&self, from: u64, max: usize) -> &[Vec<u8>] {
        let items = self.tree.items();
        let from = usize::try_from(from).unwrap_or(usize::MAX).min(items.len());
        let to = from.saturating_add(max).min(items.len());
        &items[from..to]
    }

    /// Every statement with its index, oldest first.
    pub fn statements(&self) -> impl Iterator<Item = (u64, &Statement)> {
        self.statements
            .iter()
            .enumerate()
            .map(|(i, s)| (i as u64, s))
    }

    /// Each node's newest address range grant (by `issued_at`), by node key, with its
    /// leaf index: a node's older grants no longer count.
    pub fn newest_address_ranges(
        &self,
    ) -> std::collections::BTreeMap<[u8; 32], (u64, &themis_trust::AddressRange)> {
        let mut newest = std::collections::BTreeMap::new();
        for (index, statement) in self.statements() {
            if let Statement::AddressRange(grant) = statement {
                let held = newest.entry(grant.node_key).or_insert((index, grant));
                if grant.issued_at > held.1.issued_at {
                    *held = (index, grant);
                }
            }
        }
        newest
    }

    /// The bindings in force: the newest of each service and namespace.
    pub fn bindings(&self) -> themis_trust::Bindings {
        let mut bindings = themis_trust::Bindings::default();
        for (_, statement) in self.statements() {
            if let Statement::Binding(binding) = statement {
                bindings.add(binding.clone());
            }
        }
        bindings
    }

    /// The operator's tool: verifies `leaf` (an encoded [`Entry`]) and appends it.
    /// Returns its index. The log is not checkpointed until [`Log::sign_checkpoint`].
    pub fn append(&mut self, leaf: Vec<u8>) -> Result<u64, LogError> {
        let index = self.size();
        let (_, statement) =
            Entry::open(&leaf, &self.root).map_err(|error| LogError::Leaf { index, error })?;
        self.tree.push(leaf);
        self.statements.push(statement);
        Ok(index)
    }

    /// The operator's tool: signs (with the mesh root's key) and holds a checkpoint
    /// of every leaf held.
    pub fn sign_checkpoint(&mut self, root_key: &Identity, now_ms: u64) -> SignedCheckpoint {
        let checkpoint = Checkpoint {
            mesh: self.root.mesh.as_str().to_owned(),
            size: self.size(),
            root_hash: self.root_hash(),
            issued_at: now_ms,
        }
        .sign(root_key);
        self.checkpoint = Some(checkpoint.clone());
        checkpoint
    }

    /// Takes a newer checkpoint (`checkpoint`, signed bytes) and the leaves this copy
    /// lacks (`leaves`, from index [`Log::size`] on) from anyone: the checkpoint
    /// must be the root's, not older than the one held, every leaf a root-signed
    /// statement of the mesh, and the leaves must hash to the checkpoint's root on
    /// top of the ones held. Nothing changes unless all of that holds. Returns how
    /// many leaves were added.
    pub fn extend(&mut self, checkpoint: &[u8], leaves: &[Vec<u8>]) -> Result<u64, LogError> {
        let offered = SignedCheckpoint::verify(&self.root, checkpoint)?;
        if let Some(held) = &self.checkpoint {
            if offered.size() < held.size() {
                return Err(LogError::Rollback {
                    offered: offered.size(),
                    held: held.size(),
                });
            }
        }
        let held = self.size();
        if held.checked_add(leaves.len() as u64) != Some(offered.size()) {
            return Err(LogError::SizeMismatch {
                held,
                leaves: leaves.len() as u64,
                size: offered.size(),
            });
        }
        let mut statements = Vec::with_capacity(leaves.len());
        for (n, leaf) in leaves.iter().enumerate() {
            let index = held + n as u64;
            let (_, statement) =
                Entry::open(leaf, &self.root).map_err(|error| LogError::Leaf { index, error })?;
            statements.push(statement);
        }
        let mut tree = self.tree.clone();
        for leaf in leaves {
            tree.push(leaf.clone());
        }
        if tree_hash(&tree) != offered.checkpoint.root_hash {
            return Err(LogError::RootMismatch);
        }
        self.tree = tree;
        self.statements.extend(statements);
        self.checkpoint = Some(offered);
        Ok(leaves.len() as u64)
    }

    /// A proof that the log at `old_size` leaves is a prefix of this one (RFC 6962
    /// `PROOF(m, D[n])`, concatenated hashes); `None` if `old_size` is 0 or larger
    /// than the log. Empty when the sizes are equal.
    pub fn consistency_proof(&self, old_size: u64) -> Option<Vec<u8>> {
        let size = self.size();
        if old_size == 0 || old_size > size {
            return None;
        }
        if old_size == size {
            return Some(Vec::new());
        }
        let additions = usize::try_from(size - old_size).ok()?;
        Some(self.tree.prove_consistency(additions).as_bytes().to_vec())
    }

    /// A proof that leaf `index` is in the log of [`Log::size`] leaves.
    pub fn inclusion_proof(&self, index: u64) -> Option<Vec<u8>> {
        let index = usize::try_from(index).ok()?;
        (index < self.tree.items().len())
            .then(|| self.tree.prove_inclusion(index).as_bytes().to_vec())
    }

    /// Whether the first `size` leaves held hash to `root_hash`.
    fn prefix_hashes_to(&self, size: u64, root_hash: &[u8; HASH_LEN]) -> bool {
        let held = self.size();
        if size == 0 {
            return *root_hash == empty_root();
        }
        if size > held {
            return false;
        }
        if size == held {
            return self.root_hash() == *root_hash;
        }
        let Some(proof) = self.consistency_proof(size) else {
            return false;
        };
        let Ok(proof) = ConsistencyProof::<Sha256>::try_from_bytes(proof) else {
            return false;
        };
        let old = RootHash::<Sha256>::new((*root_hash).into(), size);
        self.tree.root().verify_consistency(&old, &proof).is_ok()
    }

    /// Compares a peer's checkpoint (already verified) with this copy.
    pub fn audit(&self, theirs: &SignedCheckpoint) -> Audit {
        let Some(ours) = &self.checkpoint else {
            return Audit::Ahead;
        };
        if theirs.size() > ours.size() {
            return Audit::Ahead;
        }
        if self.prefix_hashes_to(theirs.size(), &theirs.checkpoint.root_hash) {
            return Audit::Consistent;
        }
        let why = if theirs.size() == ours.size() {
            format!(
                "two checkpoints of size {} with different root hashes",
                ours.size()
            )
        } else {
            format!(
                "a checkpoint of size {} is not a prefix of the one of size {}",
                theirs.size(),
                ours.size()
            )
        };
        Audit::Fork(Fork {
            ours: ours.encoded().to_vec(),
            theirs: theirs.encoded().to_vec(),
            why,
        })
    }

    /// After [`Log::extend`] failed with [`LogError::RootMismatch`]: `theirs` (a
    /// newer checkpoint) and a peer's whole copy of the log it describes (`leaves`
    /// from index 0). If those leaves hash to `theirs` but do not start with the log
    /// held, the root signed both: a [`Fork`]. If they do not hash to `theirs`, the
    /// peer served a log that is not the one it claimed: `Err`.
    pub fn prove_fork(&self, theirs: &[u8], leaves: &[Vec<u8>]) -> Result<Option<Fork>, LogError> {
        let offered = SignedCheckpoint::verify(&self.root, theirs)?;
        let mut other = Log::new(self.root.clone());
        other.extend(theirs, leaves)?;
        let Some(ours) = &self.checkpoint else {
            return Ok(None);
        };
        let (small, large) = if ours.size() <= offered.size() {
            (ours, &other)
        } else {
            (&offered, self)
        };
        if large.prefix_hashes_to(small.size(), &small.checkpoint.root_hash) {
            return Ok(None);
        }
        Ok(Some(Fork {
            ours: ours.encoded().to_vec(),
            theirs: offered.encoded().to_vec(),
            why: format!(
                "the log of size {} does not extend the one of size {}",
                offered.size().max(ours.size()),
                offered.size().min(ours.size())
            ),
        }))
    }
}
