//! The agent's copy of the mesh's trust log (docs/PROTOCOL.md §6.13): loaded and
//! verified from `<state_dir>/trust-log.bin` before the agent serves, extended from
//! the operator (`POST /v1/log`) and from any peer (the log sync), never trusting
//! the one that serves it, and audited against every checkpoint a peer shows. A
//! checkpoint that contradicts the copy is a fork: an alarm and evidence on disk.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use themis_contracts::api as contract;
use themis_core::PeerId;
use themis_log::{Audit, Fork, Kind, Log, LogError, SignedCheckpoint, Statement};
use themis_trust::MeshRoot;
use tracing::{error, info, warn};

use crate::roster::{LogMembership, RangeGrant};

/// The trust log's copy in an agent's state directory (and in the operator's mesh
/// directory).
pub const LOG_FILE: &str = "trust-log.bin";

/// Each revocation in the log (by its encoded `Signed`): its leaf index and inclusion
/// proof.
pub type RevocationProofs = std::collections::HashMap<Vec<u8>, (u64, Vec<u8>)>;

/// Where fork evidence is kept, under the state directory.
pub const FORKS_DIR: &str = "log-forks";

/// What one offer added.
#[derive(Debug, Default)]
pub struct Offered {
    /// Leaves added.
    pub added: u64,
    /// The log's size after it.
    pub size: u64,
    /// The revocations among the new leaves (encoded `Signed`), to enforce.
    pub revocations: Vec<Vec<u8>>,
}

/// The log as the agent keeps it.
pub struct TrustLog {
    file: Option<PathBuf>,
    forks_dir: Option<PathBuf>,
    log: RwLock<Log>,
    /// The checkpoint and the revocations' proofs under it, made when the log changes
    /// (filters ask for them at every poll).
    proofs: RwLock<Arc<(Option<Vec<u8>>, RevocationProofs)>>,
    forks: Mutex<Vec<Fork>>,
    /// The size, for whoever wants to hear of growth at once (gossip pushes it).
    size: tokio::sync::watch::Sender<u64>,
}

impl TrustLog {
    /// The copy in `state_dir` (none: an empty log), verified from its first leaf. A
    /// copy that does not verify is kept as `trust-log.bin.bad` and the agent starts
    /// from an empty log, which its peers fill.
    pub fn load(state_dir: Option<&Path>, root: MeshRoot) -> TrustLog {
        let file = state_dir.map(|d| d.join(LOG_FILE));
        let mut log = Log::new(root.clone());
        if let Some(path) = &file {
            match std::fs::read(path) {
                Ok(bytes) => match Log::from_copy(root, &bytes) {
                    Ok(loaded) => {
                        info!(size = loaded.size(), "loaded the trust log");
                        log = loaded;
                    }
                    Err(e) => {
                        let bad = path.with_extension("bin.bad");
                        error!(path = %path.display(), error = %e, kept = %bad.display(),
                            "the saved trust log does not verify; starting from an empty one");
                        let _ = std::fs::rename(path, &bad);
                    }
                },
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => warn!(path = %path.display(), error = %e, "could not read the trust log"),
            }
        }
        TrustLog {
            file,
            forks_dir: state_dir.map(|d| d.join(FORKS_DIR)),
            proofs: RwLock::new(Arc::new(proofs_of(&log))),
            size: tokio::sync::watch::Sender::new(log.size()),
            log: RwLock::new(log),
            forks: Mutex::new(Vec::new()),
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Log> {
        self.log.read().expect("never poisoned")
    }

    /// Leaves held.
    pub fn size(&self) -> u64 {
        self.read().size()
    }

    /// Leaves held and the tree's root hash over them, read together.
    pub fn head(&self) -> (u64, [u8; 32]) {
        let log = self.read();
        (log.size(), log.root_hash())
    }

    /// Watches the size: changes as soon as the log grows.
    pub fn watch_size(&self) -> tokio::sync::watch::Receiver<u64> {
        self.size.subscribe()
    }

    /// Forks seen since start.
    pub fn forks(&self) -> Vec<Fork> {
        self.forks.lock().expect("never poisoned").clone()
    }

    /// What a peer asking from `from` gets: the checkpoint held (empty: none) and up
    /// to `max` leaves.
    pub fn answer(&self, from: u64, max: usize) -> (Vec<u8>, Vec<Vec<u8>>) {
        let log = self.read();
        let checkpoint = log
            .checkpoint()
            .map_or_else(Vec::new, |c| c.encoded().to_vec());
        (checkpoint, log.leaves(from, max).to_vec())
    }

    /// The whole copy (for `themis log verify` and auditors).
    pub fn copy(&self) -> Option<Vec<u8>> {
        self.read().to_copy()
    }

    /// Every revocation in the log (encoded `Signed`), oldest first.
    pub fn revocations(&self) -> Vec<Vec<u8>> {
        revocations_from(&self.read(), 0)
            .map(|(_, signed)| signed)
            .collect()
    }

    /// The checkpoint held (signed bytes) and, for each revocation in the log (by its
    /// encoded `Signed`), its leaf index and inclusion proof under that checkpoint.
    pub fn revocation_proofs(&self) -> Arc<(Option<Vec<u8>>, RevocationProofs)> {
        self.proofs.read().expect("never poisoned").clone()
    }

    /// The service bindings in force (docs/PROTOCOL.md §7.1).
    pub fn bindings(&self) -> themis_trust::Bindings {
        self.read().bindings()
    }

    /// What the log says of the membership: every admitted key (with its
    /// admission's `not_after`) and each node's newest range grant, with the digest an
    /// announcement binds it by ([`crate::roster::Roster::set_log`]).
    pub fn membership(&self) -> LogMembership {
        let log = self.read();
        let admissions = log
            .statements()
            .filter_map(|(_, statement)| match statement {
                Statement::Admission(a) => Some((a.node_key, a.not_after)),
                _ => None,
            })
            .collect();
        let ranges = log
            .newest_address_ranges()
            .into_iter()
            .filter_map(|(key, (index, grant))| {
                // Never `None`: the log takes no grant of an invalid network
                // (`Entry::verify`), so no older grant can count in its place.
                let net = grant.net().ok()?;
                let signed = signed_statement(&log, index)?;
                let held = RangeGrant {
                    net,
                    not_after: grant.not_after,
                    issued_at: grant.issued_at,
                };
                Some((key, (themis_trust::grant_digest(&signed), held)))
            })
            .collect();
        LogMembership { admissions, ranges }
    }

    /// The newest address range grant for `node_key` in the log: its `issued_at` and
    /// its signed bytes.
    pub fn newest_range_of(&self, node_key: &[u8; 32]) -> Option<(u64, Vec<u8>)> {
        let log = self.read();
        let (index, issued_at) = log
            .newest_address_ranges()
            .get(node_key)
            .map(|(index, grant)| (*index, grant.issued_at))?;
        Some((issued_at, signed_statement(&log, index)?))
    }

    /// What `GET /v1/log` shows: the checkpoint, the forks seen, every leaf.
    pub fn status(&self) -> contract::LogStatus {
        let forks = self.forks().into_iter().map(|f| f.why).collect();
        status_of(&self.read(), forks)
    }

    /// Takes a newer checkpoint and the leaves from [`TrustLog::size`] on; saves
    /// the copy when it grew.
    pub fn offer(&self, checkpoint: &[u8], leaves: &[Vec<u8>]) -> Result<Offered, LogError> {
        let mut log = self.log.write().expect("never poisoned");
        let from = log.size();
        let added = log.extend(checkpoint, leaves)?;
        let offered = Offered {
            added,
            size: log.size(),
            revocations: revocations_from(&log, from)
                .map(|(_, signed)| signed)
                .collect(),
        };
        *self.proofs.write().expect("never poisoned") = Arc::new(proofs_of(&log));
        if added > 0 {
            self.save(&log);
            info!(size = offered.size, added, "the trust log grew");
            self.size.send_replace(offered.size);
        }
        Ok(offered)
    }

    /// The operator's whole copy (`POST /v1/log`): verified from its first leaf; the
    /// leaves this copy lacks are taken if the operator's log extends it, and a
    /// copy that does not is a fork (recorded, and refused).
    pub fn offer_copy(&self, bytes: &[u8]) -> Result<Offered, CopyRefused> {
        let root = self.read().mesh_root().clone();
        let theirs = Log::from_copy(root, bytes).map_err(CopyRefused::Invalid)?;
        let Some(checkpoint) = theirs.checkpoint().cloned() else {
            return Err(CopyRefused::Invalid(LogError::Malformed));
        };
        let all = theirs.leaves(0, usize::MAX).to_vec();
        let from = self.size();
        if from > theirs.size() {
            return Err(CopyRefused::Invalid(LogError::Rollback {
                offered: theirs.size(),
                held: from,
            }));
        }
        match self.offer(checkpoint.encoded(), &all[from as usize..]) {
            Err(LogError::RootMismatch) => {
                match self.check_fork(checkpoint.encoded(), &all, "the operator's copy") {
                    Ok(Some(fork)) => Err(CopyRefused::Fork(fork)),
                    _ => Err(CopyRefused::Invalid(LogError::RootMismatch)),
                }
            }
            other => other.map_err(CopyRefused::Invalid),
        }
    }

    /// Compares a checkpoint a peer holds with this copy; a fork is recorded.
    /// Returns the checkpoint, verified, and what the comparison found.
    pub fn audit(
        &self,
        checkpoint: &[u8],
        from: &str,
    ) -> Result<(SignedCheckpoint, Audit), LogError> {
        let log = self.read();
        let theirs = SignedCheckpoint::verify(log.mesh_root(), checkpoint)?;
        let audit = log.audit(&theirs);
        drop(log);
        if let Audit::Fork(fork) = &audit {
            self.record_fork(fork.clone(), from);
        }
        Ok((theirs, audit))
    }

    /// After an offer failed with a root mismatch: a whole copy (`leaves` from the
    /// first) of the log `checkpoint` describes, which proves a fork (recorded) or
    /// proves its sender a liar (`Ok(None)` or `Err`).
    pub fn check_fork(
        &self,
        checkpoint: &[u8],
        leaves: &[Vec<u8>],
        from: &str,
    ) -> Result<Option<Fork>, LogError> {
        let fork = self.read().prove_fork(checkpoint, leaves)?;
        if let Some(fork) = &fork {
            self.record_fork(fork.clone(), from);
        }
        Ok(fork)
    }

    /// An alarm: the root signed two histories. Kept (once) in memory and on disk.
    fn record_fork(&self, fork: Fork, from: &str) {
        let mut forks = self.forks.lock().expect("never poisoned");
        if forks
            .iter()
            .any(|f| f.theirs == fork.theirs && f.ours == fork.ours)
        {
            return;
        }
        error!(from, why = %fork.why, "THE MESH ROOT FORKED THE TRUST LOG: two signed checkpoints contradict each other; evidence kept");
        if let Some(dir) = &self.forks_dir {
            let saved = std::fs::create_dir_all(dir).and_then(|()| {
                let n = forks.len();
                std::fs::write(dir.join(format!("fork-{n}-ours.checkpoint")), &fork.ours)?;
                std::fs::write(
                    dir.join(format!("fork-{n}-theirs.checkpoint")),
                    &fork.theirs,
                )?;
                std::fs::write(
                    dir.join(format!("fork-{n}.txt")),
                    format!("{}\nseen from {from}\n", fork.why),
                )
            });
            if let Err(e) = saved {
                warn!(dir = %dir.display(), error = %e, "could not keep the fork evidence");
            }
        }
        forks.push(fork);
    }

    fn save(&self, log: &Log) {
        let (Some(path), Some(bytes)) = (&self.file, log.to_copy()) else {
            return;
        };
        if let Err(e) = crate::files::replace(path, &bytes) {
            warn!(path = %path.display(), error = %e, "could not save the trust log");
        }
    }
}

/// Why the operator's copy was refused.
#[derive(Debug)]
pub enum CopyRefused {
    /// It does not verify, or is older than the copy held.
    Invalid(LogError),
    /// It verifies, and contradicts the copy held: the root forked the log.
    Fork(Fork),
}

/// The revocations of the log from leaf `from` on: each leaf's index and its
/// statement (encoded `Signed`).
fn revocations_from(log: &Log, from: u64) -> impl Iterator<Item = (u64, Vec<u8>)> + '_ {
    log.statements()
        .filter(move |(i, s)| *i >= from && s.kind() == Kind::Revocation)
        .filter_map(|(i, _)| {
            let entry = themis_log::Entry::decode(log.leaf(i)?).ok()?;
            Some((i, entry.statement.encode()))
        })
}

/// The checkpoint `log` holds and each revocation's proof under it.
fn proofs_of(log: &Log) -> (Option<Vec<u8>>, RevocationProofs) {
    let Some(checkpoint) = log.checkpoint() else {
        return (None, RevocationProofs::new());
    };
    let proofs = revocations_from(log, 0)
        .filter_map(|(i, signed)| Some((signed, (i, log.inclusion_proof(i)?))))
        .collect();
    (Some(checkpoint.encoded().to_vec()), proofs)
}

/// A log as people and auditors read it (`themis log show`, `GET /v1/log`): each
/// leaf with what it says and its inclusion proof under the checkpoint held.
pub fn status_of(log: &Log, forks: Vec<String>) -> contract::LogStatus {
    let mesh = &log.mesh_root().mesh;
    let printable = |key: &[u8; 32]| PeerId::derive(key, mesh.as_str()).printable(mesh);
    let leaves = log
        .statements()
        .map(|(index, statement)| {
            let mut range = None;
            let (subject, service, delegate, reason) = match statement {
                Statement::Admission(a) => (printable(&a.node_key), None, None, None),
                Statement::AddressRange(r) => {
                    range = r.net().ok().map(|net| net.to_string());
                    (printable(&r.node_key), None, None, None)
                }
                Statement::Binding(b) => (
                    match b.service_accounts.as_slice() {
                        [] => format!("ns/{}", b.namespace),
                        accounts => format!("ns/{} sa/{}", b.namespace, accounts.join(",")),
                    },
                    Some(b.service.clone()),
                    None,
                    b.not_after.map(|t| match t <= b.issued_at {
                        true => "withdrawn".to_owned(),
                        false => format!("until {t} (Unix ms)"),
                    }),
                ),
                Statement::Grant(g) => (
                    printable(&g.grantee),
                    Some(g.service.clone()),
                    Some(g.delegate),
                    None,
                ),
                Statement::Revocation(v) => (
                    PeerId(v.id).printable(mesh),
                    None,
                    None,
                    Some(v.reason.clone()),
                ),
            };
            contract::LogLeaf {
                index,
                kind: statement.kind().as_str().to_owned(),
                subject,
                service,
                delegate,
                reason,
                range,
                issued_at: statement.issued_at(),
                leaf: hex::encode(log.leaf(index).unwrap_or_default()),
                proof: hex::encode(log.inclusion_proof(index).unwrap_or_default()),
            }
        })
        .collect();
    let checkpoint = log.checkpoint();
    contract::LogStatus {
        size: log.size(),
        root_hash: hex::encode(log.root_hash()),
        checkpoint: checkpoint.map(|c| hex::encode(c.encoded())),
        issued_at: checkpoint.map(|c| c.checkpoint.issued_at),
        forks,
        leaves,
    }
}

/// Leaf `index`'s statement as the root signed it (encoded `Signed`): what an
/// announcement's range digest is taken over.
fn signed_statement(log: &Log, index: u64) -> Option<Vec<u8>> {
    let leaf = log.leaf(index)?;
    Some(themis_log::Entry::decode(leaf).ok()?.statement.encode())
}
