//! The identities of the node's local workloads: created on first use, kept in the
//! key store (0600 files under the state directory), handed whole only to the
//! workload's own proxy (`key_material`) and otherwise used inside the agent
//! (`identity`, for signing on the workload's behalf).

use themis_core::Identity;
use tracing::info;

use super::{KeyMaterial, RegistryError};
use crate::keystore::KeyStore;
use crate::names::WorkloadName;

/// The local workloads' keys.
pub(super) struct Workloads {
    keys: KeyStore,
}

impl Workloads {
    /// Over `keys`.
    pub(super) fn new(keys: KeyStore) -> Self {
        Workloads { keys }
    }

    /// The identity of `name`, created if it has none; and whether it was created.
    pub(super) fn get_or_create(
        &self,
        name: &WorkloadName,
    ) -> Result<(Identity, bool), RegistryError> {
        let (identity, created) = self.keys.workload(name)?;
        if created {
            info!(workload = %name, id = %identity.printable_id(), "created a workload identity");
        }
        Ok((identity, created))
    }

    /// The identity of `name`: [`RegistryError::UnknownWorkload`] if it has none
    /// (never created here).
    pub(super) fn identity(&self, name: &WorkloadName) -> Result<Identity, RegistryError> {
        self.keys
            .existing_workload(name)?
            .ok_or_else(|| RegistryError::UnknownWorkload(name.clone()))
    }

    /// Deletes the key of `name`: [`RegistryError::UnknownWorkload`] if it had none.
    /// A workload of that name created later has a new key, so a new id.
    pub(super) fn delete(&self, name: &WorkloadName) -> Result<Identity, RegistryError> {
        let identity = self.identity(name)?;
        self.keys.remove_workload(name)?;
        info!(workload = %name, id = %identity.printable_id(), "deleted a workload identity");
        Ok(identity)
    }

    /// The key material of `name`, for its proxy.
    pub(super) fn key_material(&self, name: &WorkloadName) -> Result<KeyMaterial, RegistryError> {
        let identity = self.identity(name)?;
        Ok(KeyMaterial {
            workload: name.clone(),
            mesh: identity.mesh().as_str().to_owned(),
            id: identity.printable_id(),
            public_key: hex::encode(identity.public_key()),
            private_key_pem: identity.to_key_file(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use themis_core::MeshName;

    fn workloads() -> (tempfile::TempDir, Workloads) {
        let dir = tempfile::tempdir().unwrap();
        let keys = KeyStore::open(dir.path(), MeshName::new("test").unwrap()).unwrap();
        (dir, Workloads::new(keys))
    }

    fn name(name: &str) -> WorkloadName {
        WorkloadName::new(name).unwrap()
    }

    #[test]
    fn an_identity_is_created_once_then_kept() {
        let (_dir, workloads) = workloads();
        let (first, created) = workloads.get_or_create(&name("web-1")).unwrap();
        assert!(created);
        let (again, created) = workloads.get_or_create(&name("web-1")).unwrap();
        assert!(!created);
        assert_eq!(again.id(), first.id());
        assert_eq!(workloads.identity(&name("web-1")).unwrap().id(), first.id());
        let (other, _) = workloads.get_or_create(&name("web-2")).unwrap();
        assert_ne!(other.id(), first.id());
    }

    #[test]
    fn an_unknown_workload_gets_no_key_and_none_is_made_for_it() {
        let (dir, workloads) = workloads();
        let refused = workloads.key_material(&name("ghost")).unwrap_err();
        assert!(matches!(refused, RegistryError::UnknownWorkload(ref w) if *w == name("ghost")));
        assert_eq!(refused.to_string(), "no workload ghost on this node");
        assert!(matches!(
            workloads.identity(&name("ghost")),
            Err(RegistryError::UnknownWorkload(_))
        ));
        assert!(!dir.path().join("workloads/ghost.key").exists());
    }

    #[test]
    fn key_material_is_the_workloads_own_key() {
        let (_dir, workloads) = workloads();
        let (identity, _) = workloads.get_or_create(&name("web-1")).unwrap();
        let material = workloads.key_material(&name("web-1")).unwrap();
        assert_eq!(material.id, identity.printable_id());
        assert_eq!(material.mesh, "test");
        assert_eq!(material.public_key, hex::encode(identity.public_key()));
        assert_eq!(*material.private_key_pem, *identity.to_key_file());
    }
}
