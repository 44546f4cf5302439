//! A registration's life in the DHT: registered (its record stored), renewed before
//! it expires, restored after a restart, and deregistered (a tombstone stored in its
//! place). The bookkeeping is [`Registrations`](super::registrations), the signing
//! the [`Endorser`](super::endorser); here they meet the overlay.
//!
//! The registrations' lock is held across each registration's DHT operations, so a
//! renewal and a deregistration of the same workload never interleave.

use std::net::SocketAddr;

use themis_trust::Metadata;
use tracing::{info, warn};

use super::registrations::next_serial;
use super::{Registration, Registry, RegistryError};
use crate::names::{ServiceName, WorkloadName};
use crate::overlay::Stored;
use crate::trust::unix_millis;

impl Registry {
    /// Registers `workload` (creating its identity if needed) as an instance of
    /// `service` reachable at `endpoint`, and keeps its record stored.
    pub async fn register(
        &self,
        service: ServiceName,
        workload: WorkloadName,
        endpoint: SocketAddr,
        metadata: Metadata,
    ) -> Result<(Registration, Stored), RegistryError> {
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
    ) -> Result<Option<(Registration, Stored)>, RegistryError> {
        let (identity, _) = self.workloads.get_or_create(&workload)?;
        self.endorser.check_not_revoked(&workload, &identity)?;
        let mut registrations = self.registrations.lock().await;
        let previous = registrations
            .get(&service, &workload)
            .map(|(r, value)| (r.serial, value));
        if expect.is_some() && previous.as_ref().map(|p| p.0) != expect {
            return Ok(None);
        }
        let serial = next_serial(previous.as_ref().map(|p| p.0), unix_millis());
        let value = self.endorser.record(
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
        registrations.insert(registration.clone(), value)?;
        drop(registrations);
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
        let due = self
            .registrations
            .lock()
            .await
            .older_than(half, unix_millis());
        self.register_again(due, true, "could not renew a record")
            .await
    }

    /// Registers again what was registered before the agent restarted.
    pub async fn restore(&self) -> usize {
        let saved = self.registrations.lock().await.saved();
        self.register_again(saved, false, "could not restore a registration")
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
        let mut registrations = self.registrations.lock().await;
        let Some((registration, value)) = registrations.get(&service, &workload) else {
            return Err(RegistryError::NotRegistered { service, workload });
        };
        let identity = self.workloads.identity(&workload)?;
        let name = service.as_str().as_bytes();
        self.overlay.unstore(name, value).await;
        let tombstone = self.endorser.record(
            &service,
            &identity,
            None,
            Metadata::new(),
            next_serial(Some(registration.serial), unix_millis()),
        )?;
        // Stored once, not re-stored, and held only until the record it withdraws has
        // expired everywhere.
        let hold = self
            .endorser
            .tombstone_hold(registration.serial, unix_millis());
        let stored = self
            .overlay
            .store(name, tombstone.clone(), self.config.replicas, hold)
            .await;
        self.overlay.unstore(name, tombstone).await;
        registrations.remove(&service, &workload)?;
        drop(registrations);
        self.forget(&service);
        info!(%service, id = %registration.id, "deregistered");
        stored?;
        Ok(registration)
    }
}
