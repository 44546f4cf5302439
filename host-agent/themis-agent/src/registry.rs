//! The service registry and key cache of one node: local workloads register under a
//! service name (their identity is created on first use), the node endorses them by
//! signing an instance record with its node key — only for services the mesh root
//! granted it — and keeps that record stored and fresh in the DHT; anyone resolves a
//! service to its endorsed live instances (cached for a short while), and a local
//! proxy fetches its workload's key.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use themis_capture::{Capture, CaptureSpec, Status as CaptureStatus, WorkloadStatus};

use themis_core::{Identity, PeerId};
use tracing::{info, warn};

use crate::caller::{Access, Operators, Owners};
use crate::keystore::{KeyError, KeyStore};
use crate::metrics::Metrics;
use crate::names::{ServiceName, WorkloadName};
use crate::overlay::{Overlay, OverlayError};
use crate::trust::{unix_millis, MeshTrust};
use themis_trust::{
    live, Instance, InstanceValue, Metadata, Record, Signed, TrustError, RECORD_LABEL,
};

/// Settings of the registry.
#[derive(Debug, Clone)]
pub struct RegistryConfig {
    /// Extra replicas of each service's records (`k`: stored `k + 1` times).
    pub replicas: u8,
    /// Validity window of a record (its `not_after - issued_at`); the registry signs
    /// a fresh one when half of it has passed.
    pub record_ttl: Duration,
    /// How long a resolution is served from the cache.
    pub cache_ttl: Duration,
    /// Most services kept in the resolution cache; at the cap, the least recently
    /// used one goes (one at a time: a flood of new names never empties the cache).
    pub cache_capacity: usize,
    /// Resolutions that skip the cache (`fresh`), per second on average: each costs
    /// `replicas + 1` DHT lookups. Over the budget a fresh resolution is answered
    /// from the cache when it holds the service, else refused
    /// ([`RegistryError::RateLimited`]).
    pub fresh_per_sec: u32,
    /// Fresh resolutions allowed in a burst above the average.
    pub fresh_burst: u32,
    /// Resolutions that miss the cache (fresh ones included), per second on average:
    /// a caller resolving ever-new names makes one each. Over the budget a resolution
    /// is refused ([`RegistryError::LookupsLimited`]); the operator's are not counted.
    pub lookups_per_sec: u32,
    /// Resolutions missing the cache allowed in a burst above the average.
    pub lookups_burst: u32,
}

impl Default for RegistryConfig {
    fn default() -> Self {
        RegistryConfig {
            replicas: 4,
            record_ttl: Duration::from_secs(60),
            cache_ttl: Duration::from_secs(5),
            cache_capacity: 1024,
            fresh_per_sec: 20,
            fresh_burst: 40,
            lookups_per_sec: 50,
            lookups_burst: 200,
        }
    }
}

/// Why a registry operation failed.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// The DHT operation failed.
    #[error("{0}")]
    Overlay(#[from] OverlayError),
    /// A key file could not be used.
    #[error("{0}")]
    Key(#[from] KeyError),
    /// The record could not be made.
    #[error("{0}")]
    Record(#[from] TrustError),
    /// The node holds no grant for the service.
    #[error(
        "this node may not serve {service}: it holds no grant for it from the mesh root \
         (the operator runs `themis service grant {service} --node <this node's directory>`; \
         services granted here: {granted})"
    )]
    NotGranted {
        /// The service.
        service: ServiceName,
        /// What the node may serve.
        granted: String,
    },
    /// No replica acknowledged the store.
    #[error("no replica stored the record (0 of {replicas})")]
    NotStored {
        /// Replicas attempted.
        replicas: u8,
    },
    /// Deregistering something that is not registered here.
    #[error("workload {workload} is not registered under {service} on this node")]
    NotRegistered {
        /// The service.
        service: ServiceName,
        /// The workload.
        workload: WorkloadName,
    },
    /// A workload without a key file.
    #[error("no workload {0} on this node")]
    UnknownWorkload(WorkloadName),
    /// The root revoked the workload's key: it is endorsed nowhere any more.
    #[error("workload {0} is revoked by the mesh root (`themis log show <its id>`): it can no longer be registered")]
    Revoked(WorkloadName),
    /// eBPF capture failed or was refused.
    #[error("{0}")]
    Capture(#[from] themis_capture::CaptureError),
    /// Capture asked of an agent started without it.
    #[error("this agent runs without eBPF capture; start it with --capture")]
    CaptureDisabled,
    /// Too many resolutions skipping the cache, and the cache does not hold the service.
    #[error(
        "too many fresh resolutions (over {per_sec} a second): try again in {retry_after:?}, \
         or resolve without ?fresh=true"
    )]
    RateLimited {
        /// The configured average rate.
        per_sec: u32,
        /// When a token is available again.
        retry_after: Duration,
    },
    /// Too many resolutions missing the cache (lookups of names not cached).
    #[error(
        "too many resolutions of names not in the cache (over {per_sec} a second): try \
         again in {retry_after:?}"
    )]
    LookupsLimited {
        /// The configured average rate.
        per_sec: u32,
        /// When a token is available again.
        retry_after: Duration,
    },
    /// Saving the registrations failed.
    #[error("saving {path}: {source}")]
    Save {
        /// The file.
        path: PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
}

// The API's bodies are the contract's types (`themis-contracts`), shared with the
// `themis` tool, the Envoy filter and the component.
pub use themis_contracts::api::{
    Explanation, Instance as InstanceView, KeyMaterial, Registration, Resolution, Verdict,
};

/// How long a stored revocation lives between re-stores (its holders keep
/// re-storing it: revocations do not expire).
const REVOCATION_TTL: Duration = Duration::from_secs(24 * 3600);

/// Local registrations, each with the record bytes being re-stored for it.
type Local = BTreeMap<(ServiceName, WorkloadName), (Registration, Vec<u8>)>;

/// The registry of one node.
pub struct Registry {
    overlay: Overlay,
    keys: KeyStore,
    node: Arc<Identity>,
    trust: Arc<MeshTrust>,
    metrics: Arc<Metrics>,
    config: RegistryConfig,
    saved: PathBuf,
    local: tokio::sync::Mutex<Local>,
    /// Revocations this node keeps stored in the DHT (as encoded).
    kept_revocations: tokio::sync::Mutex<std::collections::HashSet<Vec<u8>>>,
    /// Resolutions, with when and under which revocation generation they were made.
    cache: Mutex<ResolveCache>,
    /// The budget of resolutions that skip the cache.
    fresh: Mutex<TokenBucket>,
    /// The budget of resolutions that miss the cache.
    lookups: Mutex<TokenBucket>,
    /// The eBPF loader, when the agent runs with `--capture`.
    capture: Option<Mutex<Capture>>,
    /// Which pod each local workload belongs to, and who may call what.
    owners: Owners,
    access: Access,
}

impl Registry {
    /// A registry over `overlay`; registrations are saved under `state_dir`.
    pub fn new(
        overlay: Overlay,
        keys: KeyStore,
        (node, trust): (Arc<Identity>, Arc<MeshTrust>),
        state_dir: PathBuf,
        config: RegistryConfig,
        metrics: Arc<Metrics>,
    ) -> Self {
        let cache = ResolveCache::new(config.cache_capacity);
        let fresh = TokenBucket::new(config.fresh_per_sec, config.fresh_burst);
        let lookups = TokenBucket::new(config.lookups_per_sec, config.lookups_burst);
        Registry {
            overlay,
            keys,
            node,
            trust,
            metrics,
            config,
            saved: state_dir.join("registrations.json"),
            owners: Owners::load(state_dir.join("owners.json")),
            access: Access {
                operators: Operators {
                    uids: vec![0],
                    cgroups: Vec::new(),
                    own_cgroup: None,
                },
            },
            local: Default::default(),
            kept_revocations: Default::default(),
            cache: Mutex::new(cache),
            fresh: Mutex::new(fresh),
            lookups: Mutex::new(lookups),
            capture: None,
        }
    }

    /// With these operators (default: uid 0 but no operator cgroup, so nobody until the agent sets them).
    pub fn with_operators(mut self, operators: Operators) -> Self {
        self.access = Access { operators };
        self
    }

    /// The workloads' owners.
    pub fn owners(&self) -> &Owners {
        &self.owners
    }

    /// Who may call what on the local API.
    pub fn access(&self) -> &Access {
        &self.access
    }

    /// The agent's metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// With eBPF capture: registrations with a cgroup attach it, deregistrations detach it.
    pub fn with_capture(mut self, capture: Capture) -> Self {
        self.capture = Some(Mutex::new(capture));
        self
    }

    fn capture(&self) -> Result<std::sync::MutexGuard<'_, Capture>, RegistryError> {
        let capture = self
            .capture
            .as_ref()
            .ok_or(RegistryError::CaptureDisabled)?;
        Ok(capture
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()))
    }

    /// Fails with [`RegistryError::CaptureDisabled`] when the agent runs without it.
    pub fn require_capture(&self) -> Result<(), RegistryError> {
        self.capture().map(drop)
    }

    /// Attaches capture to a workload's cgroup (again, with a new spec, if attached).
    pub fn attach_capture(
        &self,
        workload: &WorkloadName,
        spec: &CaptureSpec,
    ) -> Result<WorkloadStatus, RegistryError> {
        Ok(self.capture()?.attach(workload.as_str(), spec)?)
    }

    /// Detaches a workload's capture; `false` when it had none (or capture is off).
    pub fn detach_capture(&self, workload: &WorkloadName) -> Result<bool, RegistryError> {
        match self.capture() {
            Ok(mut capture) => Ok(capture.detach(workload.as_str())?),
            Err(RegistryError::CaptureDisabled) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// What is attached, from the pins and the kernel.
    pub fn capture_status(&self) -> Result<CaptureStatus, RegistryError> {
        Ok(self.capture()?.status()?)
    }

    /// The overlay underneath.
    pub fn overlay(&self) -> &Overlay {
        &self.overlay
    }

    /// The node's trust state.
    pub fn trust(&self) -> &MeshTrust {
        &self.trust
    }

    /// The services this node holds grants for (re-reading the grants directory).
    pub fn granted(&self) -> Vec<String> {
        self.trust.reload_grants(&self.node)
    }

    /// Whether this node holds a grant for `service` (re-reading the grants directory
    /// if not): [`RegistryError::NotGranted`] otherwise.
    pub fn check_granted(&self, service: &ServiceName) -> Result<Vec<Signed>, RegistryError> {
        if let Some(chain) = self.trust.grant_chain(service.as_str()) {
            return Ok(chain);
        }
        // The operator may have added a grant file since the last look.
        let granted = self.granted();
        self.trust
            .grant_chain(service.as_str())
            .ok_or_else(|| RegistryError::NotGranted {
                service: service.clone(),
                granted: if granted.is_empty() {
                    "none".into()
                } else {
                    granted.join(", ")
                },
            })
    }

    /// The record for `identity` as an instance of `service` (a tombstone without
    /// `endpoint`), signed by this node under its grant for the service.
    fn endorse(
        &self,
        service: &ServiceName,
        identity: &Identity,
        endpoint: Option<SocketAddr>,
        metadata: Metadata,
        issued_at: u64,
    ) -> Result<Vec<u8>, RegistryError> {
        let chain = self.check_granted(service)?;
        themis_trust::check_metadata(&metadata)?;
        let ttl = self.record_ttl_ms();
        let record = Record {
            mesh: identity.mesh().as_str().to_owned(),
            service: service.as_str().to_owned(),
            workload_key: *identity.public_key(),
            endpoint,
            metadata,
            issued_at,
            not_after: issued_at.saturating_add(ttl),
        };
        let value = InstanceValue {
            grants: chain,
            record: Signed::sign(&self.node, RECORD_LABEL, &record),
        }
        .encode();
        if value.len() > themis_dht::message::MAX_VALUE_LEN {
            return Err(TrustError::TooLarge.into());
        }
        Ok(value)
    }

    /// Creates the identity of a local workload if it has none; returns it and whether
    /// it was created.
    pub fn workload(&self, name: &WorkloadName) -> Result<(Identity, bool), RegistryError> {
        let (identity, created) = self.keys.workload(name)?;
        if created {
            info!(workload = %name, id = %identity.printable_id(), "created a workload identity");
        }
        Ok((identity, created))
    }

    /// Registers `workload` (creating its identity if needed) as an instance of
    /// `service` reachable at `endpoint`, and keeps its record stored.
    pub async fn register(
        &self,
        service: ServiceName,
        workload: WorkloadName,
        endpoint: SocketAddr,
        metadata: Metadata,
    ) -> Result<(Registration, crate::overlay::Stored), RegistryError> {
        self.register_if(service, workload, endpoint, metadata, None)
            .await
            .map(|done| done.expect("an unconditional registration always runs"))
    }

    /// [`Registry::register`], but with `expect: Some(serial)` only while the
    /// registration is still the one with that serial (`None` returned otherwise):
    /// a renewal must never bring back what a deregistration removed meanwhile.
    async fn register_if(
        &self,
        service: ServiceName,
        workload: WorkloadName,
        endpoint: SocketAddr,
        metadata: Metadata,
        expect: Option<u64>,
    ) -> Result<Option<(Registration, crate::overlay::Stored)>, RegistryError> {
        let (identity, _) = self.workload(&workload)?;
        if self.trust.is_revoked(&identity.id()) {
            return Err(RegistryError::Revoked(workload));
        }
        let mut local = self.local.lock().await;
        let key = (service.clone(), workload.clone());
        let previous = local.get(&key).map(|(r, value)| (r.serial, value.clone()));
        if expect.is_some() && previous.as_ref().map(|p| p.0) != expect {
            return Ok(None);
        }
        let serial = unix_millis().max(previous.as_ref().map_or(0, |p| p.0 + 1));
        let value = self.endorse(
            &service,
            &identity,
            Some(endpoint),
            metadata.clone(),
            serial,
        )?;
        // The new record first (holders replace the old one with it); the old one is
        // let go only once the new one is out, and a new one that failed is let go too,
        // so nothing is re-stored that the registration no longer names.
        let name = service.as_str().as_bytes();
        let stored = match self
            .overlay
            .store(
                name,
                value.clone(),
                self.config.replicas,
                self.config.record_ttl,
            )
            .await
        {
            Ok(stored) => stored,
            Err(error) => {
                self.overlay.unstore(name, value).await;
                return Err(error.into());
            }
        };
        if let Some((_, old)) = previous {
            self.overlay.unstore(name, old).await;
        }
        let registration = Registration {
            service: service.clone(),
            workload,
            id: identity.printable_id(),
            endpoint,
            metadata,
            serial,
        };
        local.insert(key, (registration.clone(), value));
        self.save(&local)?;
        drop(local);
        self.forget(&service);
        info!(%service, id = %registration.id, %endpoint, stored = stored.stored, replicas = stored.replicas, "registered");
        if stored.stored == 0 {
            return Err(RegistryError::NotStored {
                replicas: stored.replicas,
            });
        }
        Ok(Some((registration, stored)))
    }

    /// Signs fresh records for the local registrations whose record has passed half
    /// of its validity, and stores them in place of the old ones. Called
    /// periodically: no central service renews anything.
    pub async fn refresh(&self) -> usize {
        let half = self.config.record_ttl.as_millis() as u64 / 2;
        let due: Vec<Registration> = self
            .local
            .lock()
            .await
            .values()
            .filter(|(r, _)| unix_millis().saturating_sub(r.serial) >= half)
            .map(|(r, _)| r.clone())
            .collect();
        self.register_again(due, true, "could not renew a record")
            .await
    }

    /// Registers each of `registrations` again (a fresh record each); returns how many
    /// succeeded, logging the others with `failure`. A renewal skips what changed
    /// since the list was taken (deregistered, or registered again).
    async fn register_again(
        &self,
        registrations: Vec<Registration>,
        renewal: bool,
        failure: &str,
    ) -> usize {
        let mut done = 0;
        for r in registrations {
            let (service, workload) = (r.service.clone(), r.workload.clone());
            let expect = renewal.then_some(r.serial);
            match self
                .register_if(service, workload, r.endpoint, r.metadata, expect)
                .await
            {
                Ok(Some(_)) => done += 1,
                Ok(None) => {}
                Err(error) => {
                    warn!(service = %r.service, workload = %r.workload, %error, "{failure}")
                }
            }
        }
        done
    }

    /// Withdraws `workload` from `service`: stops re-storing its record and stores a
    /// signed tombstone, so resolvers drop it at once rather than when it expires.
    /// Holders keep the tombstone until the record it cancels has expired, and refuse
    /// that older record meanwhile.
    pub async fn deregister(
        &self,
        service: ServiceName,
        workload: WorkloadName,
    ) -> Result<Registration, RegistryError> {
        let mut local = self.local.lock().await;
        let key = (service.clone(), workload.clone());
        let Some((registration, value)) = local.get(&key).cloned() else {
            return Err(RegistryError::NotRegistered { service, workload });
        };
        let identity = self
            .keys
            .existing_workload(&workload)?
            .ok_or_else(|| RegistryError::UnknownWorkload(workload.clone()))?;
        let name = service.as_str().as_bytes();
        self.overlay.unstore(name, value).await;
        let tombstone = self.endorse(
            &service,
            &identity,
            None,
            Metadata::new(),
            unix_millis().max(registration.serial + 1),
        )?;
        // Stored once, not re-stored, and held only until the record it withdraws has
        // expired everywhere (its not_after plus the clock-skew allowance): it outlives
        // that record, and takes its endorser's slot no longer than needed.
        let record_ttl = u64::try_from(self.config.record_ttl.as_millis()).unwrap_or(u64::MAX);
        let hold = (registration.serial + record_ttl + themis_trust::MAX_CLOCK_SKEW_MS)
            .saturating_sub(unix_millis());
        let stored = self
            .overlay
            .store(
                name,
                tombstone.clone(),
                self.config.replicas,
                Duration::from_millis(hold.max(1)),
            )
            .await;
        self.overlay.unstore(name, tombstone).await;
        local.remove(&key);
        self.save(&local)?;
        drop(local);
        self.forget(&service);
        info!(%service, id = %registration.id, "deregistered");
        stored?;
        Ok(registration)
    }

    /// The live, endorsed instances of `service`, from the cache unless `fresh` (or
    /// a revocation arrived since it was cached). Fresh lookups draw from a budget,
    /// and every lookup that misses the cache from another, unless `unbudgeted` (the
    /// node's operator).
    pub async fn resolve(
        &self,
        service: &ServiceName,
        fresh: bool,
        unbudgeted: bool,
    ) -> Result<Resolution, RegistryError> {
        let generation = self.trust.generation();
        let cached = || {
            let mut cache = self.cache.lock().expect("never poisoned");
            cache.get(service, self.config.cache_ttl, generation)
        };
        if !fresh {
            if let Some(resolution) = cached() {
                self.metrics.resolve_cache(true);
                return Ok(resolution);
            }
        } else if let Some(retry_after) = (!unbudgeted).then(|| self.take_fresh().err()).flatten() {
            // Over the budget of cache-skipping lookups: the cached answer if there
            // is one (it says `cached: true`), else a refusal.
            if let Some(resolution) = cached() {
                self.metrics.resolve_fresh_limited("served_cached");
                self.metrics.resolve_cache(true);
                return Ok(resolution);
            }
            self.metrics.resolve_fresh_limited("refused");
            return Err(RegistryError::RateLimited {
                per_sec: self.config.fresh_per_sec,
                retry_after,
            });
        }
        if let Some(retry_after) = (!unbudgeted).then(|| self.take_lookup().err()).flatten() {
            // Ever-new names would each cost `replicas + 1` DHT lookups: over the
            // budget, refused (a fresh one over it is served from the cache if it can).
            if let Some(resolution) = fresh.then(cached).flatten() {
                self.metrics.resolve_lookups_limited("served_cached");
                self.metrics.resolve_cache(true);
                return Ok(resolution);
            }
            self.metrics.resolve_lookups_limited("refused");
            return Err(RegistryError::LookupsLimited {
                per_sec: self.config.lookups_per_sec,
                retry_after,
            });
        }
        self.metrics.resolve_cache(false);
        let (resolution, _) = self.lookup(service).await?;
        let evicted = self.cache.lock().expect("never poisoned").insert(
            service.clone(),
            generation,
            resolution.clone(),
        );
        if evicted {
            self.metrics.resolve_cache_evicted();
        }
        Ok(resolution)
    }

    /// A token from the budget of cache-skipping resolutions, or how long until one.
    fn take_fresh(&self) -> Result<(), Duration> {
        self.fresh.lock().expect("never poisoned").take()
    }

    /// A token from the budget of resolutions missing the cache, or how long until one.
    fn take_lookup(&self) -> Result<(), Duration> {
        self.lookups.lock().expect("never poisoned").take()
    }

    /// Every value stored for `service` (all replicas), with why it is or is not
    /// trusted.
    pub async fn explain(&self, service: &ServiceName) -> Result<Explanation, RegistryError> {
        let (resolution, mut verdicts) = self.lookup(service).await?;
        // The log's leaves behind each verdict, with their proofs.
        let log = self.trust.log().status();
        for verdict in &mut verdicts {
            let endorser = verdict.endorser.as_deref();
            let is = |who: Option<&str>, leaf: &themis_contracts::api::LogLeaf| {
                who == Some(leaf.subject.as_str())
            };
            verdict.log = log
                .leaves
                .iter()
                .filter(|leaf| match leaf.kind.as_str() {
                    "admission" => is(endorser, leaf),
                    // The endorser's grant, or an authority's (one that may pass the
                    // service on) that a chain can go through.
                    "grant" => {
                        leaf.service.as_deref() == Some(service.as_str())
                            && (is(endorser, leaf) || leaf.delegate == Some(true))
                    }
                    _ => is(endorser, leaf) || is(verdict.id.as_deref(), leaf),
                })
                .cloned()
                .collect();
        }
        Ok(Explanation {
            service: service.clone(),
            mesh_root: self.trust.root().to_string(),
            answered: resolution.answered,
            replicas: resolution.replicas,
            values: verdicts,
            instances: resolution.instances,
            log_checkpoint: log.checkpoint,
        })
    }

    /// Resolves `service` in the DHT, verifies every value against the mesh root and
    /// the revocations, and keeps the newest record of each instance.
    async fn lookup(
        &self,
        service: &ServiceName,
    ) -> Result<(Resolution, Vec<Verdict>), RegistryError> {
        let found = self
            .overlay
            .resolve(service.as_str().as_bytes(), self.config.replicas)
            .await?;
        let mesh = self.overlay.mesh();
        let printable = |key: &[u8; 32]| PeerId::derive(key, mesh.as_str()).printable(mesh);
        let mut verdicts = Vec::new();
        let mut verified: Vec<(Instance, &Vec<u8>)> = Vec::new();
        for value in &found.values {
            // What the value claims, read without trusting it, for the explanation.
            let claimed = InstanceValue::decode(value).ok().and_then(|v| {
                let record: Record = postcard::from_bytes(&v.record.body).ok()?;
                Some((v.record.signer, record))
            });
            let mut verdict = Verdict {
                id: claimed.as_ref().map(|(_, r)| printable(&r.workload_key)),
                endorser: claimed.as_ref().map(|(signer, _)| printable(signer)),
                endpoint: claimed.as_ref().and_then(|(_, r)| r.endpoint),
                issued_at: claimed.as_ref().map(|(_, r)| r.issued_at),
                verdict: "trusted".into(),
                reason: "endorsed by a node the mesh root granted the service".into(),
                log: Vec::new(),
            };
            match self.trust.verify(|v| v.instance(value, service.as_str())) {
                Ok(instance) => verified.push((instance, value)),
                Err(error) => {
                    warn!(%service, %error, "refused a stored record");
                    self.metrics.record_refused(error.reason());
                    verdict.verdict = "refused".into();
                    verdict.reason = error.to_string();
                }
            }
            verdicts.push(verdict);
        }
        let newest = live(verified.iter().map(|(i, _)| i.clone()));
        for verdict in verdicts.iter_mut().filter(|v| v.verdict == "trusted") {
            // Records compete only with records of the same endorser (see `live`).
            let same = |i: &Instance| {
                Some(i.id.printable(mesh)) == verdict.id
                    && Some(printable(&i.endorser)) == verdict.endorser
            };
            let current = newest.iter().find(|i| same(i));
            match (current, verdict.endpoint) {
                (Some(i), Some(_)) if Some(i.issued_at) == verdict.issued_at => {}
                (None, _)
                    if verified
                        .iter()
                        .any(|(i, _)| same(i) && i.endpoint.is_none()) =>
                {
                    verdict.verdict = "withdrawn".into();
                    verdict.reason = "the instance was deregistered (a newer tombstone)".into();
                }
                _ => {
                    verdict.verdict = "superseded".into();
                    verdict.reason = "a newer record of the same instance exists".into();
                }
            }
        }
        let instances = newest
            .into_iter()
            .filter_map(|i| {
                let value = verified
                    .iter()
                    .find(|(v, _)| {
                        (v.id, v.endorser, v.issued_at) == (i.id, i.endorser, i.issued_at)
                    })?
                    .1;
                Some(InstanceView {
                    id: i.id.printable(mesh),
                    public_key: hex::encode(i.public_key),
                    endpoint: i.endpoint?,
                    metadata: i.metadata,
                    endorser: printable(&i.endorser),
                    not_after: i.not_after,
                    record: hex::encode(value),
                })
            })
            .collect();
        let refused = verdicts.iter().filter(|v| v.verdict == "refused").count();
        let resolution = Resolution {
            service: service.clone(),
            instances,
            cached: false,
            refused,
            answered: found.answered,
            replicas: found.replicas,
        };
        Ok((resolution, verdicts))
    }

    /// The local registrations.
    pub async fn registrations(&self) -> Vec<Registration> {
        self.local
            .lock()
            .await
            .values()
            .map(|(r, _)| r.clone())
            .collect()
    }

    /// The workload's current endorsement: the service, the DHT value being re-stored
    /// for it (record and grant chain) and when that record was signed.
    pub async fn endorsement_of(
        &self,
        workload: &WorkloadName,
    ) -> Option<(ServiceName, Vec<u8>, u64)> {
        self.local
            .lock()
            .await
            .iter()
            .filter(|((_, w), _)| w == workload)
            .map(|((s, _), (r, value))| (s.clone(), value.clone(), r.serial))
            .max_by_key(|(_, _, serial)| *serial)
    }

    /// How long a record lives, ms.
    pub fn record_ttl_ms(&self) -> u64 {
        u64::try_from(self.config.record_ttl.as_millis()).unwrap_or(u64::MAX)
    }

    /// The key material of a local workload, for its proxy.
    pub fn key_material(&self, workload: &WorkloadName) -> Result<KeyMaterial, RegistryError> {
        let identity = self
            .keys
            .existing_workload(workload)?
            .ok_or_else(|| RegistryError::UnknownWorkload(workload.clone()))?;
        Ok(KeyMaterial {
            workload: workload.clone(),
            mesh: identity.mesh().as_str().to_owned(),
            id: identity.printable_id(),
            public_key: hex::encode(identity.public_key()),
            private_key_pem: identity.to_key_file(),
        })
    }

    /// A local workload's identity, for signing on its behalf (`crate::signing`): the
    /// key stays in the agent.
    pub fn workload_identity(&self, workload: &WorkloadName) -> Result<Identity, RegistryError> {
        self.keys
            .existing_workload(workload)?
            .ok_or_else(|| RegistryError::UnknownWorkload(workload.clone()))
    }

    /// Registers again what was registered before the agent restarted.
    pub async fn restore(&self) -> usize {
        let saved: Vec<Registration> = match std::fs::read(&self.saved) {
            Ok(bytes) => match serde_json::from_slice(&bytes) {
                Ok(saved) => saved,
                Err(error) => {
                    warn!(path = %self.saved.display(), %error, "ignoring unreadable registrations");
                    return 0;
                }
            },
            Err(_) => return 0,
        };
        self.register_again(saved, false, "could not restore a registration")
            .await
    }

    /// Publishes a root-signed revocation: this node refuses the key at once and
    /// stores the revocation in the DHT, where every agent's poll finds it.
    pub async fn publish_revocation(&self, bytes: Vec<u8>) -> Result<bool, RegistryError> {
        let new = self.trust.add_revocation(&bytes)?;
        let stored = self
            .overlay
            .store(
                crate::trust::REVOCATIONS_NAME,
                bytes.clone(),
                self.config.replicas,
                REVOCATION_TTL,
            )
            .await?;
        if stored.stored > 0 {
            self.kept_revocations.lock().await.insert(bytes);
        }
        Ok(new)
    }

    /// Looks for revocations in the DHT, adds the new ones, and keeps them stored
    /// from here too (so they survive without the operator). Returns how many were new.
    pub async fn poll_revocations(&self) -> Result<usize, RegistryError> {
        let found = self
            .overlay
            .resolve(crate::trust::REVOCATIONS_NAME, self.config.replicas)
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
        let known = self.trust.revocations();
        let mut kept = self.kept_revocations.lock().await;
        for (id, _, bytes) in known.iter() {
            if kept.contains(bytes) {
                continue;
            }
            let name = crate::trust::REVOCATIONS_NAME;
            let k = self.config.replicas;
            match self
                .overlay
                .store(name, bytes.to_vec(), k, REVOCATION_TTL)
                .await
            {
                Ok(stored) if stored.stored > 0 => {
                    kept.insert(bytes.to_vec());
                }
                Ok(_) => {
                    tracing::debug!(%id, "no replica took a revocation yet; trying again at the next poll")
                }
                Err(error) => {
                    tracing::debug!(%id, %error, "could not store a revocation; trying again at the next poll")
                }
            }
        }
    }

    fn forget(&self, service: &ServiceName) {
        self.cache.lock().expect("never poisoned").remove(service);
    }

    fn save(&self, local: &Local) -> Result<(), RegistryError> {
        let all: Vec<&Registration> = local.values().map(|(r, _)| r).collect();
        let json = serde_json::to_vec_pretty(&all).expect("registrations always encode");
        crate::files::replace(&self.saved, &json).map_err(|source| RegistryError::Save {
            path: self.saved.clone(),
            source,
        })
    }
}

/// The resolution cache: at most `capacity` services, each with when and under which
/// revocation generation it was resolved. Full, it drops the least recently used
/// service, one at a time; a lookup of an expired or outdated entry drops that entry.
struct ResolveCache {
    capacity: usize,
    entries: HashMap<ServiceName, CacheEntry>,
    /// Use order: the smallest tick is the least recently used.
    by_use: BTreeMap<u64, ServiceName>,
    tick: u64,
}

struct CacheEntry {
    at: Instant,
    generation: u64,
    used: u64,
    resolution: Resolution,
}

impl ResolveCache {
    fn new(capacity: usize) -> Self {
        ResolveCache {
            capacity: capacity.max(1),
            entries: HashMap::new(),
            by_use: BTreeMap::new(),
            tick: 0,
        }
    }

    fn next_tick(&mut self) -> u64 {
        self.tick += 1;
        self.tick
    }

    /// The cached resolution of `service` (marked `cached`), if younger than `ttl`
    /// and made under revocation generation `generation`; counts as a use.
    fn get(&mut self, service: &ServiceName, ttl: Duration, generation: u64) -> Option<Resolution> {
        let entry = self.entries.get(service)?;
        if entry.at.elapsed() >= ttl || entry.generation != generation {
            self.remove(service);
            return None;
        }
        let tick = self.next_tick();
        let entry = self.entries.get_mut(service).expect("just found");
        self.by_use.remove(&entry.used);
        entry.used = tick;
        self.by_use.insert(tick, service.clone());
        Some(Resolution {
            cached: true,
            ..entry.resolution.clone()
        })
    }

    /// Caches a resolution made now; `true` if another service was evicted for it.
    fn insert(&mut self, service: ServiceName, generation: u64, resolution: Resolution) -> bool {
        self.remove(&service);
        let mut evicted = false;
        if self.entries.len() >= self.capacity {
            if let Some((_, oldest)) = self.by_use.pop_first() {
                self.entries.remove(&oldest);
                evicted = true;
            }
        }
        let tick = self.next_tick();
        self.by_use.insert(tick, service.clone());
        self.entries.insert(
            service,
            CacheEntry {
                at: Instant::now(),
                generation,
                used: tick,
                resolution,
            },
        );
        evicted
    }

    fn remove(&mut self, service: &ServiceName) {
        if let Some(entry) = self.entries.remove(service) {
            self.by_use.remove(&entry.used);
        }
    }
}

/// A token bucket: `per_sec` tokens a second, at most `burst` saved up.
struct TokenBucket {
    per_sec: f64,
    burst: f64,
    tokens: f64,
    at: Instant,
}

impl TokenBucket {
    fn new(per_sec: u32, burst: u32) -> Self {
        let burst = f64::from(burst.max(1));
        TokenBucket {
            per_sec: f64::from(per_sec),
            burst,
            tokens: burst,
            at: Instant::now(),
        }
    }

    /// Takes a token, or says how long until one is available.
    fn take(&mut self) -> Result<(), Duration> {
        let now = Instant::now();
        let earned = now.duration_since(self.at).as_secs_f64() * self.per_sec;
        self.tokens = (self.tokens + earned).min(self.burst);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            return Ok(());
        }
        if self.per_sec <= 0.0 {
            return Err(Duration::from_secs(60));
        }
        Err(Duration::from_secs_f64((1.0 - self.tokens) / self.per_sec))
    }
}
