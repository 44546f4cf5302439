//! The node's side of mesh trust: the mesh root it was configured with, its own
//! admission and grants (files the operator's `themis node admit` and
//! `themis service grant` wrote into the state directory), the revocations it knows,
//! and the checks made on every peer frame and every stored value.
//!
//! The root's private key never comes near a running agent; everything here only
//! verifies, except that the node signs records for its own workloads with its node
//! key, within the grants it holds (the registry does that signing).

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::trust_log::{CopyRefused, Offered, TrustLog};
use themis_core::{Identity, PeerId};
use themis_dht::{Key, Placement, Rejection, ValuePolicy};
use themis_log::LogError;
use themis_trust::{
    chain_from_pem, from_pem, Grant, Instance, InstanceValue, MeshRoot, PemKind, Record,
    Revocations, Signed, TrustError, Verifier, GRANT_LABEL,
};
use tracing::{info, warn};

use crate::metrics::Metrics;
use crate::roster::Roster;

/// The DHT name revocations are stored under (not a valid service name, so it
/// cannot collide with one).
pub const REVOCATIONS_NAME: &[u8] = b"themis/revocations";
/// File names in the state directory.
pub const ROOT_FILE: &str = "mesh.root";
/// The node's admission credential.
pub const ADMISSION_FILE: &str = "admission.pem";
/// The root's grant of addresses to the node (its pod range), if it has one.
pub const ADDRESS_RANGE_FILE: &str = "address-range.pem";
/// The directory of grant chains, one `<service>.pem` each.
pub const GRANTS_DIR: &str = "grants";
/// The revocations this node knows, kept across restarts.
pub const REVOCATIONS_FILE: &str = "revocations.pem";
/// Most instance slots one endorsing node may hold under one object id.
pub const RECORDS_PER_OWNER: usize = 16;
/// Peers whose admission is remembered (verified once, then compared).
const ADMITTED_CACHE: usize = 4096;

/// Why the node's trust material cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TrustSetupError {
    /// A file is missing or unreadable.
    #[error("{path}: {source}{hint}")]
    Read {
        /// The file.
        path: PathBuf,
        /// What the system said.
        source: std::io::Error,
        /// What to do about it.
        hint: &'static str,
    },
    /// A trust file another user could have written or replaced.
    #[error("{0}")]
    Unsafe(crate::keystore::KeyError),
    /// The mesh root does not parse.
    #[error("mesh root {0}")]
    Root(#[from] themis_trust::RootError),
    /// The node's own admission is not valid for its key under the root.
    #[error("{path}: the admission is not valid for this node ({error}); have the mesh operator run `themis node admit` again")]
    Admission {
        /// The file.
        path: PathBuf,
        /// Why.
        error: TrustError,
    },
    /// The node's address range (`address-range.pem`) is not valid for it.
    #[error("{path}: the address range is not valid for this node ({error}); have the mesh operator run `themis node range` again")]
    AddressRange {
        /// The file.
        path: PathBuf,
        /// Why.
        error: TrustError,
    },
    /// The configured mesh name differs from the root's.
    #[error("the mesh root is for mesh {root:?} but the agent is configured for {configured:?}")]
    MeshMismatch {
        /// The root's mesh.
        root: String,
        /// The configured one.
        configured: String,
    },
}

/// Reads a trust file (the mesh root, the admission): like a key, refused if another
/// user could have put it there (`keystore::read_trusted`).
fn read(path: &Path, hint: &'static str) -> Result<String, TrustSetupError> {
    crate::keystore::read_trusted(path).map_err(|error| match error {
        crate::keystore::KeyError::Io { path, source } => {
            TrustSetupError::Read { path, source, hint }
        }
        other => TrustSetupError::Unsafe(other),
    })
}

/// Unix milliseconds now.
pub fn unix_millis() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Reads the mesh root from text (`<mesh>:<hex>`) or from a file holding it.
pub fn load_root(spec: &str) -> Result<MeshRoot, TrustSetupError> {
    if let Ok(root) = spec.parse() {
        return Ok(root);
    }
    let text = read(
        Path::new(spec),
        " (give --mesh-root as <mesh>:<hex> or a file written by `themis mesh create`)",
    )?;
    Ok(text.parse()?)
}

/// Refuses to go on without `<state_dir>/admission.pem`, before anything (such as a
/// node key) is created there.
pub fn require_admission(state_dir: &Path) -> Result<(), TrustSetupError> {
    read(&state_dir.join(ADMISSION_FILE), ADMISSION_HINT).map(drop)
}

const ADMISSION_HINT: &str = " (an agent joins only with an admission: have the mesh operator \
     run `themis node admit --out <dir>` and use that directory as the agent's --state-dir)";

/// The node's trust state; shared by the overlay, the DHT's value policy and the
/// registry.
pub struct MeshTrust {
    root: MeshRoot,
    admission: Vec<u8>,
    /// This node's key.
    node_key: [u8; 32],
    /// The root's grant of this node's pod range from `address-range.pem`, if any
    /// (the trust log may hold a newer one: [`MeshTrust::own_address_range`]).
    address_range: Option<Vec<u8>>,
    grants_dir: PathBuf,
    grants: RwLock<BTreeMap<String, Vec<Signed>>>,
    /// Where known revocations are saved (`None`: kept in memory only).
    revocations_file: Option<PathBuf>,
    revoked: RwLock<Revocations>,
    /// Which list `revoked` is, for filters that follow it by position
    /// ([`MeshTrust::revocation_page`]): drawn at start, so a position a filter holds
    /// from before a restart is never read in another order.
    revocation_list: u64,
    /// Admissions verified, by peer: the hash of the credential bytes seen, the
    /// admission's `not_after`, and the revocation generation it was verified under
    /// (a revocation that arrives during a verification must not be missed).
    admitted: Mutex<HashMap<PeerId, Admitted>>,
    /// Bumped at every new revocation; caches compare it.
    generation: AtomicU64,
    /// How many revocations are known, for whoever waits on the next one (filters'
    /// long polls).
    revoked_count: tokio::sync::watch::Sender<usize>,
    metrics: Arc<Metrics>,
    /// The mesh's trust log (its revocations are enforced like any other).
    log: TrustLog,
    /// With one-hop routing, the members at the addresses they signed; records must
    /// then have their endpoint at their endorser's address.
    roster: std::sync::OnceLock<Mutex<Roster>>,
}

impl MeshTrust {
    /// Checks the node's own admission (`<state_dir>/admission.pem`) under `root`
    /// and loads its grants.
    pub fn load(
        state_dir: &Path,
        root: MeshRoot,
        node: &Identity,
        metrics: Arc<Metrics>,
    ) -> Result<MeshTrust, TrustSetupError> {
        if &root.mesh != node.mesh() {
            return Err(TrustSetupError::MeshMismatch {
                root: root.mesh.to_string(),
                configured: node.mesh().to_string(),
            });
        }
        let path = state_dir.join(ADMISSION_FILE);
        let text = read(&path, ADMISSION_HINT)?;
        let trust = from_pem(PemKind::Admission, &text)
            .and_then(|admission| {
                MeshTrust::new(
                    root,
                    admission.encode(),
                    state_dir.join(GRANTS_DIR),
                    node,
                    metrics,
                )
            })
            .map_err(|error| TrustSetupError::Admission { path, error })?;
        let range_path = state_dir.join(ADDRESS_RANGE_FILE);
        let address_range = match range_path.exists() {
            false => None,
            true => {
                let text = read(&range_path, "")?;
                let checked = from_pem(PemKind::AddressRange, &text).and_then(|signed| {
                    let bytes = signed.encode();
                    let (_, net) = trust.verify(|v| v.address_range(&bytes, node.public_key()))?;
                    info!(addresses = %net, "the root granted this node an address range");
                    Ok(bytes)
                });
                let error = |error| TrustSetupError::AddressRange {
                    path: range_path.clone(),
                    error,
                };
                Some(checked.map_err(error)?)
            }
        };
        let trust = MeshTrust {
            address_range,
            revocations_file: Some(state_dir.join(REVOCATIONS_FILE)),
            log: TrustLog::load(Some(state_dir), trust.root.clone()),
            ..trust
        };
        trust.reload_grants(node);
        trust.load_revocations();
        // Every revocation of the saved log is in force before the agent serves.
        trust.add_revocations(&trust.log.revocations());
        let known = trust.revoked.read().expect("never poisoned").len();
        trust.revoked_count.send_replace(known);
        Ok(trust)
    }

    /// Adds the revocations saved before a restart: a revoked key stays refused from
    /// the first moment, not from the first poll.
    fn load_revocations(&self) {
        let Some(path) = &self.revocations_file else {
            return;
        };
        let Ok(text) = std::fs::read_to_string(path) else {
            return;
        };
        let mut loaded = 0;
        for block in themis_trust::pem_blocks(&text) {
            let added = block.and_then(|(kind, signed)| match kind {
                PemKind::Revocation => self.revoked_mut().add(&self.root, &signed.encode()),
                _ => Err(TrustError::Malformed),
            });
            match added {
                Ok(_) => loaded += 1,
                Err(error) => warn!(path = %path.display(), %error, "ignoring a saved revocation"),
            }
        }
        if loaded > 0 {
            info!(revocations = loaded, "loaded saved revocations");
        }
    }

    fn revoked_mut(&self) -> std::sync::RwLockWriteGuard<'_, Revocations> {
        self.revoked.write().expect("never poisoned")
    }

    /// Saves every known revocation (write then rename: never half a file).
    fn save_revocations(&self) {
        let Some(path) = &self.revocations_file else {
            return;
        };
        let text: String = self
            .revoked
            .read()
            .expect("never poisoned")
            .iter()
            .filter_map(|(_, _, bytes)| Signed::decode(bytes).ok())
            .map(|signed| themis_trust::to_pem(PemKind::Revocation, &signed))
            .collect();
        if let Err(error) = crate::files::replace(path, text.as_bytes()) {
            warn!(path = %path.display(), %error, "could not save the revocations");
        }
    }

    /// The trust state of `node` from an encoded admission it holds under `root`,
    /// with grants read from `grants_dir` (by [`MeshTrust::reload_grants`]).
    pub fn new(
        root: MeshRoot,
        admission: Vec<u8>,
        grants_dir: PathBuf,
        node: &Identity,
        metrics: Arc<Metrics>,
    ) -> Result<MeshTrust, TrustError> {
        let revoked = Revocations::new();
        Verifier {
            root: &root,
            now_ms: unix_millis(),
            revoked: &revoked,
        }
        .admission(&admission, node.public_key())?;
        Ok(MeshTrust {
            root: root.clone(),
            admission,
            node_key: *node.public_key(),
            address_range: None,
            grants_dir,
            grants: Default::default(),
            revocations_file: None,
            revoked: RwLock::new(revoked),
            revocation_list: new_list_id(node.public_key()),
            admitted: Default::default(),
            generation: AtomicU64::new(0),
            revoked_count: tokio::sync::watch::Sender::new(0),
            metrics,
            log: TrustLog::load(None, root.clone()),
            roster: std::sync::OnceLock::new(),
        })
    }

    /// Keeps a roster of the members (one-hop routing) from now on; from then on a
    /// record is trusted only with its endpoint at its endorser's signed address.
    pub fn enable_roster(&self) -> &Mutex<Roster> {
        self.roster.get_or_init(|| {
            let mut roster = Roster::default();
            self.verify(|v| roster.set_log(self.log.membership(), v));
            Mutex::new(roster)
        })
    }

    /// The log grew: the roster learns the keys it admits and which range grants are
    /// the newest.
    fn log_grew(&self, offered: &Offered) {
        if offered.added > 0 {
            // Lock order: the roster, then the revocations (`verify`).
            if let Some(mut roster) = self.roster() {
                self.verify(|v| roster.set_log(self.log.membership(), v));
            }
        }
    }

    /// The roster, if one is kept.
    pub fn roster(&self) -> Option<std::sync::MutexGuard<'_, Roster>> {
        Some(self.roster.get()?.lock().expect("never poisoned"))
    }

    /// Checks a stored value as an endorsed instance of `service` (see
    /// [`Verifier::instance_value`]) whose endpoint belongs to its endorser
    /// ([`MeshTrust::check_endpoint`]).
    pub fn instance(&self, value: &InstanceValue, service: &str) -> Result<Instance, TrustError> {
        let instance = self.verify(|v| v.instance_value(value, service))?;
        self.check_endpoint(&instance.endorser, instance.endpoint)?;
        Ok(instance)
    }

    /// With a roster (one-hop routing), `endpoint` must belong to the node with key
    /// `endorser` ([`Roster::check_endpoint`]): a granted node cannot point a service
    /// elsewhere. Without a roster (Chord routing), anything goes, as before.
    pub fn check_endpoint(
        &self,
        endorser: &[u8; 32],
        endpoint: Option<SocketAddr>,
    ) -> Result<(), TrustError> {
        match (self.roster(), endpoint) {
            (Some(roster), Some(_)) => {
                self.verify(|v| roster.check_endpoint(endorser, endpoint, v))
            }
            _ => Ok(()),
        }
    }

    /// The mesh root.
    pub fn root(&self) -> &MeshRoot {
        &self.root
    }

    /// This node's admission credential, as sent with every DHT frame.
    pub fn own_admission(&self) -> &[u8] {
        &self.admission
    }

    /// The root's grant of this node's address range, if it has one: the newest of
    /// the file's (`address-range.pem`) and the trust log's for this node's key, so
    /// that a grant the root publishes later (a narrower range, a withdrawal) is the
    /// one told with the announcement, with no restart.
    pub fn own_address_range(&self) -> Option<Vec<u8>> {
        let logged = self.log.newest_range_of(&self.node_key);
        let Some(file) = &self.address_range else {
            return logged.map(|(_, grant)| grant);
        };
        let file_at = self
            .verify(|v| v.address_range(file, &self.node_key))
            .map_or(0, |(grant, _)| grant.issued_at);
        match logged {
            Some((at, grant)) if at > file_at => Some(grant),
            _ => Some(file.clone()),
        }
    }

    /// Runs `f` with a verifier for now and the known revocations.
    pub fn verify<T>(&self, f: impl FnOnce(&Verifier<'_>) -> T) -> T {
        let revoked = self.revoked.read().expect("never poisoned");
        f(&Verifier {
            root: &self.root,
            now_ms: unix_millis(),
            revoked: &revoked,
        })
    }

    /// Re-reads `<state_dir>/grants/*.pem`, keeping the chains that are valid for
    /// this node's key; returns the services granted.
    pub fn reload_grants(&self, node: &Identity) -> Vec<String> {
        let mut grants = BTreeMap::new();
        let entries = std::fs::read_dir(&self.grants_dir).into_iter().flatten();
        for path in entries.flatten().map(|e| e.path()) {
            if path.extension().is_none_or(|e| e != "pem") {
                continue;
            }
            let checked = std::fs::read_to_string(&path)
                .map_err(|_| TrustError::Malformed)
                .and_then(|text| chain_from_pem(&text))
                .and_then(|chain| {
                    let last: Grant = chain
                        .last()
                        .ok_or(TrustError::ChainLength)?
                        .open(GRANT_LABEL)?;
                    let grant = self.verify(|v| v.grants(&chain, &last.service))?;
                    if &grant.grantee != node.public_key() {
                        return Err(TrustError::NotGranted);
                    }
                    Ok((grant.service, chain))
                });
            match checked {
                Ok((service, chain)) => {
                    grants.insert(service, chain);
                }
                Err(error) => {
                    warn!(path = %path.display(), %error, "ignoring a grant that is not valid for this node")
                }
            }
        }
        let services: Vec<String> = grants.keys().cloned().collect();
        *self.grants.write().expect("never poisoned") = grants;
        services
    }

    /// The grant chain this node holds for `service`.
    pub fn grant_chain(&self, service: &str) -> Option<Vec<Signed>> {
        self.grants
            .read()
            .expect("never poisoned")
            .get(service)
            .cloned()
    }

    /// The services this node may endorse instances of.
    pub fn granted_services(&self) -> Vec<String> {
        self.grants
            .read()
            .expect("never poisoned")
            .keys()
            .cloned()
            .collect()
    }

    /// Checks the admission a peer sent with a frame; verified once per peer and
    /// credential, then remembered until the next revocation.
    pub fn check_peer(&self, peer: &PeerId, admission: &[u8]) -> Result<(), TrustError> {
        let digest = fingerprint(admission);
        let generation = self.generation();
        let cached = self
            .admitted
            .lock()
            .expect("never poisoned")
            .get(peer)
            .copied();
        if let Some((seen, not_after, verified_under)) = cached {
            let current =
                verified_under == generation && not_after.is_none_or(|t| t > unix_millis());
            if seen == digest && current {
                return Ok(());
            }
        }
        let verified = self.verify(|v| v.admission_of(admission, peer))?;
        let mut admitted = self.admitted.lock().expect("never poisoned");
        if admitted.len() >= ADMITTED_CACHE {
            admitted.clear();
        }
        admitted.insert(*peer, (digest, verified.not_after, generation));
        Ok(())
    }

    /// Verifies and adds an encoded revocation; `Ok(true)` when it is new (caches
    /// that depend on trust are invalidated then).
    pub fn add_revocation(&self, bytes: &[u8]) -> Result<bool, TrustError> {
        let added = self.revoked_mut().add(&self.root, bytes)?;
        if added {
            self.save_revocations();
            let revocation = Revocations::verify(&self.root, bytes)?;
            info!(
                revoked = %PeerId(revocation.id).printable(&self.root.mesh),
                reason = %revocation.reason,
                "learnt a revocation"
            );
            self.admitted.lock().expect("never poisoned").clear();
            self.generation.fetch_add(1, Ordering::Relaxed);
            // The count first, its guard dropped: no lock of the revocations is held
            // while the watch's own is taken (a long poll's check takes them the
            // other way round).
            let known = self.revoked.read().expect("never poisoned").len();
            self.revoked_count.send_replace(known);
            self.metrics.revocation_learnt();
        }
        Ok(added)
    }

    /// Verifies and adds many encoded revocations at once (the log's): saved once,
    /// caches invalidated once. Returns how many were new; refused ones are logged.
    pub fn add_revocations(&self, batch: &[Vec<u8>]) -> usize {
        let mut added = 0;
        {
            let mut revoked = self.revoked_mut();
            for bytes in batch {
                match revoked.add(&self.root, bytes) {
                    Ok(true) => added += 1,
                    Ok(false) => {}
                    Err(error) => warn!(%error, "a revocation of the trust log was refused"),
                }
            }
        }
        if added > 0 {
            self.save_revocations();
            info!(revocations = added, "learnt revocations from the trust log");
            self.admitted.lock().expect("never poisoned").clear();
            self.generation.fetch_add(1, Ordering::Relaxed);
            // The count first, its guard dropped: no lock of the revocations is held
            // while the watch's own is taken (a long poll's check takes them the
            // other way round).
            let known = self.revoked.read().expect("never poisoned").len();
            self.revoked_count.send_replace(known);
            for _ in 0..added {
                self.metrics.revocation_learnt();
            }
        }
        added
    }

    /// Watches how many revocations are known: changes as soon as one is learnt.
    pub fn watch_revocations(&self) -> tokio::sync::watch::Receiver<usize> {
        self.revoked_count.subscribe()
    }

    /// The trust log.
    pub fn log(&self) -> &TrustLog {
        &self.log
    }

    /// Takes a newer checkpoint and the leaves this node lacks (from a peer), and
    /// enforces the revocations among them.
    pub fn offer_log(&self, checkpoint: &[u8], leaves: &[Vec<u8>]) -> Result<Offered, LogError> {
        let offered = self.log.offer(checkpoint, leaves)?;
        self.add_revocations(&offered.revocations);
        self.log_grew(&offered);
        Ok(offered)
    }

    /// The operator's whole copy; enforces the revocations it adds.
    pub fn offer_log_copy(&self, bytes: &[u8]) -> Result<Offered, CopyRefused> {
        let offered = self.log.offer_copy(bytes)?;
        self.add_revocations(&offered.revocations);
        self.log_grew(&offered);
        Ok(offered)
    }

    /// Whether `id` is revoked.
    pub fn is_revoked(&self, id: &PeerId) -> bool {
        self.revoked.read().expect("never poisoned").contains(id)
    }

    /// The known revocations.
    pub fn revocations(&self) -> Revocations {
        self.revoked.read().expect("never poisoned").clone()
    }

    /// How many revocations are known.
    pub fn revocation_count(&self) -> usize {
        self.revoked.read().expect("never poisoned").len()
    }

    /// At most `limit` revocations from position `from` of this agent's list, in the
    /// order it learnt them (with their signed bytes), and how many the list holds; a
    /// `list` other than this agent's reads from its first ([`Self::revocation_list`]).
    pub fn revocation_page(&self, list: Option<u64>, from: usize, limit: usize) -> RevocationPage {
        let from = if list == Some(self.revocation_list) {
            from
        } else {
            0
        };
        let revoked = self.revoked.read().expect("never poisoned");
        RevocationPage {
            list: self.revocation_list,
            from,
            total: revoked.len(),
            revocations: revoked
                .page(from, limit)
                .map(|(id, r, bytes)| (*id, r.clone(), bytes.to_vec()))
                .collect(),
        }
    }

    /// This agent's revocation list (drawn at start).
    pub fn revocation_list(&self) -> u64 {
        self.revocation_list
    }

    /// Changes at every new revocation.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Relaxed)
    }
}

/// A page of an agent's revocations ([`MeshTrust::revocation_page`]).
pub struct RevocationPage {
    /// The agent's list.
    pub list: u64,
    /// The position of the first.
    pub from: usize,
    /// How many the list holds.
    pub total: usize,
    /// The page's revocations, each with its signed bytes.
    pub revocations: Vec<(PeerId, themis_trust::Revocation, Vec<u8>)>,
}

/// A verified admission, remembered: (hash of its bytes, its `not_after`, the
/// revocation generation it was verified under).
type Admitted = (u64, Option<u64>, u64);

/// A revocation list's id: this node's key, this moment and this process, hashed
/// (an agent restarted in the same nanosecond is the one case it would repeat).
fn new_list_id(node_key: &[u8; 32]) -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let mut seed = node_key.to_vec();
    seed.extend(nanos.to_le_bytes());
    seed.extend(std::process::id().to_le_bytes());
    fingerprint(&seed)
}

fn fingerprint(bytes: &[u8]) -> u64 {
    let digest = ring::digest::digest(&ring::digest::SHA256, bytes);
    u64::from_le_bytes(digest.as_ref()[..8].try_into().expect("8 bytes"))
}

/// What the DHT keeps: endorsed instance records under their service's object ids,
/// root-signed revocations under [`REVOCATIONS_NAME`]'s. Everything else is refused
/// before it takes memory.
pub struct TrustPolicy(pub Arc<MeshTrust>);

impl TrustPolicy {
    fn check(&self, key: &Key, value: &[u8]) -> Result<Placement, TrustError> {
        let is_under = |name: &[u8]| {
            (0..=themis_dht::message::MAX_REPLICAS).any(|r| Key::object(name, r) == *key)
        };
        let now = unix_millis();
        if is_under(REVOCATIONS_NAME) {
            let revocation = Revocations::verify(&self.0.root, value)?;
            return Ok(Placement {
                owner: self.0.root.key,
                slot: revocation.id,
                version: 0,
                owner_limit: themis_dht::message::MAX_VALUES_PER_KEY,
                ttl_cap: None,
            });
        }
        // The service is inside the value; the key must be one of its object ids.
        let parsed = InstanceValue::decode(value)?;
        let claimed: Record =
            postcard::from_bytes(&parsed.record.body).map_err(|_| TrustError::Malformed)?;
        if !is_under(claimed.service.as_bytes()) {
            return Err(TrustError::WrongService);
        }
        let instance = self.0.instance(&parsed, &claimed.service)?;
        Ok(Placement {
            owner: instance.endorser,
            slot: instance.id.0,
            version: instance.issued_at,
            owner_limit: RECORDS_PER_OWNER,
            ttl_cap: Some(instance.not_after.saturating_sub(now)),
        })
    }
}

impl ValuePolicy for TrustPolicy {
    fn place(&self, key: &Key, value: &[u8]) -> Result<Placement, Rejection> {
        self.check(key, value).map_err(|error| {
            self.0.metrics.record_refused(error.reason());
            Rejection::InvalidValue
        })
    }
}
