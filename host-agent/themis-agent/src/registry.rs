//! The service registry and key cache of one node: local workloads register under a
//! service name (their identity is created on first use and their signed record
//! stored in the DHT), anyone resolves a service to its verified live instances
//! (cached for a short while), and a local proxy fetches its workload's key.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use themis_capture::{Capture, CaptureSpec, Status as CaptureStatus, WorkloadStatus};

use serde::{Deserialize, Serialize};
use themis_core::Identity;
use tracing::{info, warn};
use zeroize::Zeroizing;

use crate::keystore::{KeyError, KeyStore};
use crate::metrics::Metrics;
use crate::names::{ServiceName, WorkloadName};
use crate::overlay::{Overlay, OverlayError};
use crate::record::{self, Instance, Metadata, RecordError};

/// Settings of the registry.
#[derive(Debug, Clone)]
pub struct RegistryConfig {
    /// Extra replicas of each service's records (`k`: stored `k + 1` times).
    pub replicas: u8,
    /// Lifetime of a stored record; the DHT re-stores it well before.
    pub record_ttl: Duration,
    /// How long a resolution is served from the cache.
    pub cache_ttl: Duration,
    /// Most services kept in the resolution cache.
    pub cache_capacity: usize,
}

impl Default for RegistryConfig {
    fn default() -> Self {
        RegistryConfig {
            replicas: 2,
            record_ttl: Duration::from_secs(60),
            cache_ttl: Duration::from_secs(5),
            cache_capacity: 1024,
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
    Record(#[from] RecordError),
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
    /// eBPF capture failed or was refused.
    #[error("{0}")]
    Capture(#[from] themis_capture::CaptureError),
    /// Capture asked of an agent started without it.
    #[error("this agent runs without eBPF capture; start it with --capture")]
    CaptureDisabled,
    /// Saving the registrations failed.
    #[error("saving {path}: {source}")]
    Save {
        /// The file.
        path: PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
}

/// A local registration, as kept on disk and shown to people.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Registration {
    /// The service.
    pub service: ServiceName,
    /// The local workload.
    pub workload: WorkloadName,
    /// The workload's printable id.
    pub id: String,
    /// Where its proxy accepts mesh traffic.
    pub endpoint: SocketAddr,
    /// Its labels.
    #[serde(default)]
    pub metadata: Metadata,
    /// The record's serial (Unix milliseconds).
    pub serial: u64,
}

/// An instance as the API shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstanceView {
    /// Printable id of the workload.
    pub id: String,
    /// Its public key, hex.
    pub public_key: String,
    /// Where its proxy accepts mesh traffic.
    pub endpoint: SocketAddr,
    /// Its labels.
    pub metadata: Metadata,
}

/// The answer to a resolution.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Resolution {
    /// The service.
    pub service: ServiceName,
    /// Its live, verified instances, by id.
    pub instances: Vec<InstanceView>,
    /// Whether it came from the cache.
    pub cached: bool,
    /// Records refused (bad signature, wrong service...).
    pub refused: usize,
}

/// A workload's key material, for its local proxy.
#[derive(Serialize)]
pub struct KeyMaterial {
    /// The workload.
    pub workload: WorkloadName,
    /// The mesh.
    pub mesh: String,
    /// Printable id.
    pub id: String,
    /// Public key, hex.
    pub public_key: String,
    /// The key file text (PEM PKCS#8). Secret.
    #[serde(serialize_with = "secret_text")]
    pub private_key_pem: Zeroizing<String>,
}

/// Local registrations, each with the record bytes being re-stored for it.
type Local = BTreeMap<(ServiceName, WorkloadName), (Registration, Vec<u8>)>;

fn secret_text<S: serde::Serializer>(text: &Zeroizing<String>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(text)
}

/// The registry of one node.
pub struct Registry {
    overlay: Overlay,
    keys: KeyStore,
    metrics: Arc<Metrics>,
    config: RegistryConfig,
    saved: PathBuf,
    local: tokio::sync::Mutex<Local>,
    cache: Mutex<HashMap<ServiceName, (Instant, Resolution)>>,
    /// The eBPF loader, when the agent runs with `--capture`.
    capture: Option<Mutex<Capture>>,
}

fn unix_millis() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl Registry {
    /// A registry over `overlay`; registrations are saved under `state_dir`.
    pub fn new(
        overlay: Overlay,
        keys: KeyStore,
        state_dir: PathBuf,
        config: RegistryConfig,
        metrics: Arc<Metrics>,
    ) -> Self {
        Registry {
            overlay,
            keys,
            metrics,
            config,
            saved: state_dir.join("registrations.json"),
            local: Default::default(),
            cache: Default::default(),
            capture: None,
        }
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
        let (identity, _) = self.workload(&workload)?;
        let mut local = self.local.lock().await;
        let key = (service.clone(), workload.clone());
        let previous = local.get(&key).map(|(r, value)| (r.serial, value.clone()));
        let serial = unix_millis().max(previous.as_ref().map_or(0, |p| p.0 + 1));
        let value = record::sign(
            &identity,
            &service,
            Some(endpoint),
            metadata.clone(),
            serial,
        )?;
        if let Some((_, old)) = previous {
            self.overlay.unstore(service.as_str().as_bytes(), old).await;
        }
        let stored = self
            .overlay
            .store(
                service.as_str().as_bytes(),
                value.clone(),
                self.config.replicas,
                self.config.record_ttl,
            )
            .await?;
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
        Ok((registration, stored))
    }

    /// Withdraws `workload` from `service`: stops re-storing its record and stores a
    /// signed tombstone, so resolvers drop it at once rather than when it expires.
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
        let tombstone = record::sign(
            &identity,
            &service,
            None,
            Metadata::new(),
            registration.serial + 1,
        )?;
        // Stored once, not re-stored: it outlives the record it withdraws, which is no
        // longer refreshed either.
        let stored = self
            .overlay
            .store(
                name,
                tombstone.clone(),
                self.config.replicas,
                self.config.record_ttl,
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

    /// The live, verified instances of `service`, from the cache unless `fresh`.
    pub async fn resolve(
        &self,
        service: &ServiceName,
        fresh: bool,
    ) -> Result<Resolution, RegistryError> {
        if !fresh {
            let cache = self.cache.lock().expect("never poisoned");
            if let Some((at, resolution)) = cache.get(service) {
                if at.elapsed() < self.config.cache_ttl {
                    self.metrics.resolve_cache(true);
                    return Ok(Resolution {
                        cached: true,
                        ..resolution.clone()
                    });
                }
            }
        }
        self.metrics.resolve_cache(false);
        let found = self
            .overlay
            .resolve(service.as_str().as_bytes(), self.config.replicas)
            .await?;
        let mesh = self.overlay.mesh();
        let mut refused = 0;
        let verified: Vec<Instance> = found
            .values
            .iter()
            .filter_map(|value| match record::verify(value, mesh, service) {
                Ok(instance) => Some(instance),
                Err(error) => {
                    warn!(%service, %error, "refused a stored record");
                    self.metrics.record_refused(error.reason());
                    refused += 1;
                    None
                }
            })
            .collect();
        let instances = record::live(verified)
            .into_iter()
            .filter_map(|i| {
                Some(InstanceView {
                    id: i.id.printable(mesh),
                    public_key: hex::encode(i.public_key),
                    endpoint: i.endpoint?,
                    metadata: i.metadata,
                })
            })
            .collect();
        let resolution = Resolution {
            service: service.clone(),
            instances,
            cached: false,
            refused,
        };
        let mut cache = self.cache.lock().expect("never poisoned");
        if cache.len() >= self.config.cache_capacity {
            let ttl = self.config.cache_ttl;
            cache.retain(|_, (at, _)| at.elapsed() < ttl);
            if cache.len() >= self.config.cache_capacity {
                cache.clear();
            }
        }
        cache.insert(service.clone(), (Instant::now(), resolution.clone()));
        Ok(resolution)
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
        let mut restored = 0;
        for r in saved {
            match self
                .register(
                    r.service.clone(),
                    r.workload.clone(),
                    r.endpoint,
                    r.metadata,
                )
                .await
            {
                Ok(_) => restored += 1,
                Err(error) => {
                    warn!(service = %r.service, workload = %r.workload, %error, "could not restore a registration")
                }
            }
        }
        restored
    }

    fn forget(&self, service: &ServiceName) {
        self.cache.lock().expect("never poisoned").remove(service);
    }

    fn save(&self, local: &Local) -> Result<(), RegistryError> {
        let all: Vec<&Registration> = local.values().map(|(r, _)| r).collect();
        let json = serde_json::to_vec_pretty(&all).expect("registrations always encode");
        // Write then rename: a crash leaves the old file or the new one, never half.
        let tmp = self.saved.with_extension("json.tmp");
        std::fs::write(&tmp, json)
            .and_then(|()| std::fs::rename(&tmp, &self.saved))
            .map_err(|source| RegistryError::Save {
                path: self.saved.clone(),
                source,
            })
    }
}
