//! The node's local registrations: which workload serves which service here, the
//! DHT value being re-stored for each, and the file that brings them back after a
//! restart (`<state_dir>/registrations.json`, a JSON list of [`Registration`]s).
//!
//! A registration's `serial` is the `issued_at` of its current record (Unix ms),
//! strictly increasing per registration even when the clock steps back: holders
//! keep the newest record, so a new one must never look older. No DHT and no clock
//! here: the caller passes `now_ms`.

use std::collections::BTreeMap;
use std::path::PathBuf;

use tracing::warn;

use super::{Registration, RegistryError};
use crate::names::{ServiceName, WorkloadName};

/// A registration's key: one workload under one service.
type Key = (ServiceName, WorkloadName);

/// The local registrations, each with the record bytes being re-stored for it.
pub(super) struct Registrations {
    saved: PathBuf,
    local: BTreeMap<Key, (Registration, Vec<u8>)>,
}

impl Registrations {
    /// None yet; saved to `saved`.
    pub(super) fn new(saved: PathBuf) -> Self {
        Registrations {
            saved,
            local: BTreeMap::new(),
        }
    }

    /// What was saved before a restart; nothing if there is no file, or (logged) if
    /// it cannot be read.
    pub(super) fn saved(&self) -> Vec<Registration> {
        let Ok(bytes) = std::fs::read(&self.saved) else {
            return Vec::new();
        };
        serde_json::from_slice(&bytes).unwrap_or_else(|error| {
            warn!(path = %self.saved.display(), %error, "ignoring unreadable registrations");
            Vec::new()
        })
    }

    /// `workload`'s registration under `service`, with its value.
    pub(super) fn get(
        &self,
        service: &ServiceName,
        workload: &WorkloadName,
    ) -> Option<(Registration, Vec<u8>)> {
        self.local
            .get(&(service.clone(), workload.clone()))
            .cloned()
    }

    /// Records `registration` with the value now stored for it (replacing the one
    /// before), and saves.
    pub(super) fn insert(
        &mut self,
        registration: Registration,
        value: Vec<u8>,
    ) -> Result<(), RegistryError> {
        let key = (registration.service.clone(), registration.workload.clone());
        self.local.insert(key, (registration, value));
        self.save()
    }

    /// Removes `workload`'s registration under `service`, and saves.
    pub(super) fn remove(
        &mut self,
        service: &ServiceName,
        workload: &WorkloadName,
    ) -> Result<(), RegistryError> {
        self.local.remove(&(service.clone(), workload.clone()));
        self.save()
    }

    /// Every registration.
    pub(super) fn list(&self) -> Vec<Registration> {
        self.local.values().map(|(r, _)| r.clone()).collect()
    }

    /// The registrations whose record, at `now_ms`, is at least `age_ms` old.
    pub(super) fn older_than(&self, age_ms: u64, now_ms: u64) -> Vec<Registration> {
        self.local
            .values()
            .filter(|(r, _)| now_ms.saturating_sub(r.serial) >= age_ms)
            .map(|(r, _)| r.clone())
            .collect()
    }

    /// The workload's current endorsement: the service, the value being re-stored
    /// for it and when that record was signed (the newest, if it serves several).
    pub(super) fn endorsement_of(
        &self,
        workload: &WorkloadName,
    ) -> Option<(ServiceName, Vec<u8>, u64)> {
        self.local
            .iter()
            .filter(|((_, w), _)| w == workload)
            .map(|((s, _), (r, value))| (s.clone(), value.clone(), r.serial))
            .max_by_key(|(_, _, serial)| *serial)
    }

    fn save(&self) -> Result<(), RegistryError> {
        let all: Vec<&Registration> = self.local.values().map(|(r, _)| r).collect();
        let json = serde_json::to_vec_pretty(&all).expect("registrations always encode");
        crate::files::replace(&self.saved, &json).map_err(|source| RegistryError::Save {
            path: self.saved.clone(),
            source,
        })
    }
}

/// The serial (`issued_at`, Unix ms) of a record made at `now_ms` after one with
/// serial `previous`: now, unless the clock is not past the previous one.
pub(super) fn next_serial(previous: Option<u64>, now_ms: u64) -> u64 {
    now_ms.max(previous.map_or(0, |p| p + 1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;
    use themis_trust::Metadata;

    fn registration(service: &str, workload: &str, serial: u64) -> Registration {
        Registration {
            service: ServiceName::new(service).unwrap(),
            workload: WorkloadName::new(workload).unwrap(),
            id: format!("id-of-{workload}"),
            endpoint: SocketAddr::from(([10, 0, 0, 1], 80)),
            metadata: Metadata::from([("zone".into(), "a".into())]),
            serial,
        }
    }

    /// Registrations saved in a temporary directory, holding `entries` (service,
    /// workload, serial), each with the value `<service>/<workload>`.
    fn registered(entries: &[(&str, &str, u64)]) -> (tempfile::TempDir, Registrations) {
        let dir = tempfile::tempdir().unwrap();
        let mut registrations = Registrations::new(dir.path().join("registrations.json"));
        for (service, workload, serial) in entries {
            let value = format!("{service}/{workload}").into_bytes();
            registrations
                .insert(registration(service, workload, *serial), value)
                .unwrap();
        }
        (dir, registrations)
    }

    fn names(service: &str, workload: &str) -> (ServiceName, WorkloadName) {
        (
            ServiceName::new(service).unwrap(),
            WorkloadName::new(workload).unwrap(),
        )
    }

    #[test]
    fn what_is_saved_comes_back_after_a_restart() {
        let (dir, mut registrations) = registered(&[]);
        let path = dir.path().join("registrations.json");
        assert!(registrations.saved().is_empty(), "no file yet");
        registrations
            .insert(registration("web", "web-1", 10), b"v1".to_vec())
            .unwrap();
        registrations
            .insert(registration("db", "db-1", 20), b"v2".to_vec())
            .unwrap();
        let (service, workload) = names("db", "db-1");
        registrations.remove(&service, &workload).unwrap();

        let restarted = Registrations::new(path.clone());
        assert_eq!(restarted.saved(), [registration("web", "web-1", 10)]);
        // The file is the API's JSON list of registrations, as before the split.
        let json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(json[0]["service"], "web");
        assert_eq!(json[0]["workload"], "web-1");
        assert_eq!(json[0]["serial"], 10);
        // Values are not saved: a restart signs fresh records.
        assert!(!String::from_utf8_lossy(&std::fs::read(&path).unwrap()).contains("v1"));
    }

    #[test]
    fn an_unreadable_file_restores_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("registrations.json");
        std::fs::write(&path, b"{ not json").unwrap();
        assert!(Registrations::new(path).saved().is_empty());
    }

    #[test]
    fn a_failed_save_is_a_typed_error_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("missing-dir").join("registrations.json");
        let mut registrations = Registrations::new(path.clone());
        let error = registrations
            .insert(registration("web", "web-1", 10), Vec::new())
            .unwrap_err();
        assert!(matches!(error, RegistryError::Save { path: ref p, .. } if *p == path));
    }

    #[test]
    fn a_registration_again_replaces_the_one_before() {
        let (_dir, mut registrations) = registered(&[]);
        let (service, workload) = names("web", "web-1");
        assert_eq!(
            registrations
                .get(&service, &workload)
                .map(|(r, v)| (r.serial, v)),
            None
        );
        registrations
            .insert(registration("web", "web-1", 10), b"old".to_vec())
            .unwrap();
        registrations
            .insert(registration("web", "web-1", 11), b"new".to_vec())
            .unwrap();
        assert_eq!(
            registrations
                .get(&service, &workload)
                .map(|(r, v)| (r.serial, v)),
            Some((11, b"new".to_vec()))
        );
        assert_eq!(registrations.list().len(), 1);
        // Removing what is not there changes nothing.
        let (other, _) = names("db", "web-1");
        registrations.remove(&other, &workload).unwrap();
        assert_eq!(registrations.list().len(), 1);
    }

    #[test]
    fn only_records_past_the_age_are_due() {
        let (_dir, registrations) = registered(&[("web", "old", 1_000), ("web", "young", 20_000)]);
        let due = registrations.older_than(30_000, 31_000);
        assert_eq!(due, [registration("web", "old", 1_000)]);
        // A record from the future (the clock stepped back) is not due.
        assert!(registrations.older_than(30_000, 500).is_empty());
    }

    #[test]
    fn a_workloads_endorsement_is_its_newest_record() {
        let (_dir, registrations) =
            registered(&[("web", "w", 10), ("api", "w", 30), ("db", "other", 99)]);
        let (_, w) = names("web", "w");
        let (service, value, serial) = registrations.endorsement_of(&w).unwrap();
        assert_eq!(
            (service.as_str(), value, serial),
            ("api", b"api/w".to_vec(), 30)
        );
        let (_, nobody) = names("web", "nobody");
        assert_eq!(registrations.endorsement_of(&nobody), None);
    }

    #[test]
    fn serials_only_go_forward() {
        assert_eq!(next_serial(None, 5_000), 5_000);
        assert_eq!(next_serial(Some(4_000), 5_000), 5_000);
        // The clock stepped back, or two registrations in one millisecond.
        assert_eq!(next_serial(Some(5_000), 5_000), 5_001);
        assert_eq!(next_serial(Some(9_000), 5_000), 9_001);
    }
}
