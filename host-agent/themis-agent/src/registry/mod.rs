//! The service registry and key cache of one node: local workloads register under a
//! service name (their identity is created on first use), the node endorses them by
//! signing an instance record with its node key — only for services the mesh root
//! granted it — and keeps that record stored and fresh in the DHT; anyone resolves a
//! service to its endorsed live instances (cached for a short while), and a local
//! proxy fetches its workload's key.
//!
//! [`Registry`] is the local API's state and a thin composition of parts, each with
//! one job and tested on its own without sockets:
//!
//! * `workloads`: the local workloads' identities (key files);
//! * `endorser`: grants, and the node's signature on records and tombstones;
//! * `registrations`: what is registered here, and the file that survives restarts;
//! * `gate`: the resolution cache (`resolve_cache`) and the budgets (`budget`) of
//!   what bypasses it;
//! * `verdicts`: what the values the DHT returned are worth;
//! * `revocations`: the revocations this node keeps stored in the DHT;
//! * `capture`: the eBPF loader, when the agent has one.
//!
//! The parts hold state and decide; the DHT I/O that strings them together stays in
//! `impl Registry`, by concern (`lifecycle`, `resolving`, `revocations`). One
//! `Registry` rather than separate axum states because the routes share most parts
//! (a registration needs the workloads, the endorser, the registrations, the gate
//! and the overlay) and the API, the signing routes and the daemon's loops already
//! hold an `Arc<Registry>`: the split changes no caller.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use themis_capture::{Capture, CaptureSpec, Status as CaptureStatus, WorkloadStatus};

use themis_core::Identity;

use crate::caller::{Access, Operators, Owners};
use crate::keystore::{KeyError, KeyStore};
use crate::metrics::Metrics;
use crate::names::{ServiceName, WorkloadName};
use crate::overlay::{Overlay, OverlayError};
use crate::trust::MeshTrust;
use themis_trust::{Signed, TrustError};

mod budget;
mod capture;
mod endorser;
mod gate;
mod lifecycle;
mod registrations;
mod resolve_cache;
mod resolving;
mod revocations;
mod verdicts;
mod workloads;

use capture::CaptureSlot;
use endorser::Endorser;
use gate::ResolveGate;
use registrations::Registrations;
use revocations::KeptRevocations;
use workloads::Workloads;

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
    /// Endorse only subjects a root-signed binding allows (`--require-binding`).
    pub require_binding: bool,
    /// The longest delegation or TLS certificate signed for a proxy, whatever it asks.
    pub max_delegation: Duration,
    /// Delegations and certificates per workload per minute on average
    /// ([`RegistryError::DelegationsLimited`] over it).
    pub delegations_per_minute: u32,
    /// Delegations and certificates per workload in a burst.
    pub delegation_burst: u32,
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
            require_binding: false,
            max_delegation: Duration::from_secs(3600),
            delegations_per_minute: 30,
            delegation_burst: 30,
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
    /// A registration naming no subject on an agent that requires bindings.
    #[error(
        "this node endorses only subjects a binding allows (--require-binding): the \
         registration of {service} names none (label {label}, set by the node controller)",
        label = themis_trust::SUBJECT_LABEL
    )]
    NoSubject {
        /// The service.
        service: ServiceName,
    },
    /// A subject label that is not a subject of this mesh.
    #[error(
        "the label {label} is {0:?}: not spiffe://<mesh>/ns/<namespace>/sa/<service account> \
         of this mesh",
        label = themis_trust::SUBJECT_LABEL
    )]
    BadSubject(String),
    /// No binding lets the subject serve the service.
    #[error(
        "{subject} may not serve {service}: no binding of the mesh root allows its namespace \
         and ServiceAccount (the operator runs `themis service bind {service} --namespace <ns> \
         [--service-account <sa>]`, then `themis log publish`; bound now: {bound})"
    )]
    NotBound {
        /// The service.
        service: ServiceName,
        /// The subject refused.
        subject: String,
        /// Who may serve it.
        bound: String,
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
    /// Deleting a workload that is still registered.
    #[error("workload {workload} is registered under {services}: deregister it first")]
    StillRegistered {
        /// The workload.
        workload: WorkloadName,
        /// Where it is registered.
        services: String,
    },
    /// The owners file could not be saved without the workload.
    #[error("unbinding the workload: {0}")]
    Unbind(#[source] crate::caller::BindError),
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
    /// Too many delegations or certificates for one workload.
    #[error(
        "too many delegations for workload {workload} (over {per_minute} a minute): try \
         again in {retry_after:?}"
    )]
    DelegationsLimited {
        /// The workload.
        workload: WorkloadName,
        /// The configured average rate.
        per_minute: u32,
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

/// The registry of one node.
pub struct Registry {
    overlay: Overlay,
    trust: Arc<MeshTrust>,
    metrics: Arc<Metrics>,
    config: RegistryConfig,
    workloads: Workloads,
    endorser: Endorser,
    /// Async: held across a registration's DHT operations.
    registrations: tokio::sync::Mutex<Registrations>,
    /// Async: held across the stores of revocations.
    kept_revocations: tokio::sync::Mutex<KeptRevocations>,
    /// Never held across an await.
    gate: Mutex<ResolveGate>,
    /// Never held across an await.
    delegations: Mutex<budget::PerKey<WorkloadName>>,
    capture: CaptureSlot,
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
        Registry {
            overlay,
            workloads: Workloads::new(keys),
            endorser: Endorser::new(
                node,
                trust.clone(),
                config.record_ttl,
                config.require_binding,
            ),
            registrations: tokio::sync::Mutex::new(Registrations::new(
                state_dir.join("registrations.json"),
            )),
            kept_revocations: Default::default(),
            gate: Mutex::new(ResolveGate::new(&config, Instant::now())),
            delegations: Mutex::new(budget::PerKey::new(
                config.delegations_per_minute,
                config.delegation_burst,
            )),
            capture: CaptureSlot::default(),
            owners: Owners::load(state_dir.join("owners.json")),
            access: Access {
                operators: Operators {
                    uids: vec![0],
                    cgroups: Vec::new(),
                    own_cgroup: None,
                    controller_uids: Vec::new(),
                },
            },
            trust,
            metrics,
            config,
        }
    }

    /// With these operators (default: uid 0 but no operator cgroup, so nobody until the agent sets them).
    pub fn with_operators(mut self, operators: Operators) -> Self {
        self.access = Access { operators };
        self
    }

    /// With eBPF capture: registrations with a cgroup attach it, deregistrations detach it.
    pub fn with_capture(mut self, capture: Capture) -> Self {
        self.capture = CaptureSlot::with(capture);
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

    /// The overlay underneath.
    pub fn overlay(&self) -> &Overlay {
        &self.overlay
    }

    /// The node's trust state.
    pub fn trust(&self) -> &MeshTrust {
        &self.trust
    }

    /// Fails with [`RegistryError::CaptureDisabled`] when the agent runs without it.
    pub fn require_capture(&self) -> Result<(), RegistryError> {
        self.capture.require()
    }

    /// Attaches capture to a workload's cgroup (again, with a new spec, if attached).
    pub fn attach_capture(
        &self,
        workload: &WorkloadName,
        spec: &CaptureSpec,
    ) -> Result<WorkloadStatus, RegistryError> {
        self.capture.attach(workload, spec)
    }

    /// Detaches a workload's capture; `false` when it had none (or capture is off).
    pub fn detach_capture(&self, workload: &WorkloadName) -> Result<bool, RegistryError> {
        self.capture.detach(workload)
    }

    /// What is attached, from the pins and the kernel.
    pub fn capture_status(&self) -> Result<CaptureStatus, RegistryError> {
        self.capture.status()
    }

    /// The services this node holds grants for (re-reading the grants directory).
    pub fn granted(&self) -> Vec<String> {
        self.endorser.granted()
    }

    /// Whether this node holds a grant for `service` (re-reading the grants directory
    /// if not): [`RegistryError::NotGranted`] otherwise.
    pub fn check_granted(&self, service: &ServiceName) -> Result<Vec<Signed>, RegistryError> {
        self.endorser.check_granted(service)
    }

    /// Creates the identity of a local workload if it has none; returns it and whether
    /// it was created.
    pub fn workload(&self, name: &WorkloadName) -> Result<(Identity, bool), RegistryError> {
        self.workloads.get_or_create(name)
    }

    /// Deletes a local workload that is registered nowhere: its owner binding, then its
    /// key (a workload of the same name created later gets a new id). What it already
    /// delegated lives out its lifetime (wire v3, TLS certificates), unrenewed.
    pub async fn delete_workload(&self, name: &WorkloadName) -> Result<Identity, RegistryError> {
        // Held to the end: no registration of it lands between the check and the deletion.
        let registrations = self.registrations.lock().await;
        let services: Vec<String> = registrations
            .list()
            .into_iter()
            .filter(|r| &r.workload == name)
            .map(|r| r.service.to_string())
            .collect();
        if !services.is_empty() {
            return Err(RegistryError::StillRegistered {
                workload: name.clone(),
                services: services.join(", "),
            });
        }
        self.workloads.identity(name)?;
        self.owners.unbind(name).map_err(RegistryError::Unbind)?;
        self.workloads.delete(name)
    }

    /// The key material of a local workload, for its proxy.
    pub fn key_material(&self, workload: &WorkloadName) -> Result<KeyMaterial, RegistryError> {
        self.workloads.key_material(workload)
    }

    /// A local workload's identity, for signing on its behalf (`crate::signing`): the
    /// key stays in the agent.
    pub fn workload_identity(&self, workload: &WorkloadName) -> Result<Identity, RegistryError> {
        self.workloads.identity(workload)
    }

    /// The local registrations.
    pub async fn registrations(&self) -> Vec<Registration> {
        self.registrations.lock().await.list()
    }

    /// The workload's current endorsement: the service, the DHT value being re-stored
    /// for it (record and grant chain) and when that record was signed.
    pub async fn endorsement_of(
        &self,
        workload: &WorkloadName,
    ) -> Option<(ServiceName, Vec<u8>, u64)> {
        self.registrations.lock().await.endorsement_of(workload)
    }

    /// The longest delegation the agent signs for a proxy, ms.
    pub fn max_delegation_ms(&self) -> u64 {
        u64::try_from(self.config.max_delegation.as_millis()).unwrap_or(u64::MAX)
    }

    /// Takes one of `workload`'s delegations (or certificates) from its budget at
    /// `now`: a compromised proxy cannot mint keys without bound.
    pub fn take_delegation(
        &self,
        workload: &WorkloadName,
        now: Instant,
    ) -> Result<(), RegistryError> {
        self.delegations
            .lock()
            .expect("never poisoned")
            .take(workload, now)
            .map_err(|retry_after| RegistryError::DelegationsLimited {
                workload: workload.clone(),
                per_minute: self.config.delegations_per_minute,
                retry_after,
            })
    }

    /// How long a record lives, ms.
    pub fn record_ttl_ms(&self) -> u64 {
        self.endorser.record_ttl_ms()
    }

    fn gate(&self) -> MutexGuard<'_, ResolveGate> {
        self.gate.lock().expect("never poisoned")
    }

    /// Drops the cached resolution of `service` (its registrations here changed).
    fn forget(&self, service: &ServiceName) {
        self.gate().forget(service);
    }
}
