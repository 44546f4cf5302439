//! Key files on disk: the node identity and one identity per local workload.
//!
//! Each is a PEM PKCS#8 file (what `openssl genpkey -algorithm ed25519` writes) with
//! mode 0600 in a 0700 directory. A key file that anyone but its owner can read is
//! refused rather than used: a leaked key is a stolen identity, and there is no CA to
//! revoke it.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use ring::rand::SystemRandom;
use themis_core::{Identity, KeyFileError, MeshName};
use zeroize::Zeroizing;

use crate::names::WorkloadName;

/// Why a key file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// Reading or writing failed.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
    /// The file's permissions let others read it.
    #[error(
        "{path}: mode {mode:04o} lets other users read this private key; \
         run `chmod 600 {path}` (or replace the key if it may have leaked)"
    )]
    ReadableByOthers {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// The file is not a valid key.
    #[error("{path}: {source}")]
    Format {
        /// The file.
        path: PathBuf,
        /// Why it did not parse.
        source: KeyFileError,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> KeyError + '_ {
    move |source| KeyError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Loads the identity in the key file at `path`, refusing a file others can read.
pub fn load(path: &Path, mesh: &MeshName) -> Result<Identity, KeyError> {
    let mode = fs::metadata(path).map_err(io(path))?.permissions().mode();
    if mode & 0o077 != 0 {
        return Err(KeyError::ReadableByOthers {
            path: path.to_owned(),
            mode: mode & 0o7777,
        });
    }
    let pem = Zeroizing::new(fs::read_to_string(path).map_err(io(path))?);
    Identity::from_key_file(mesh.clone(), &pem).map_err(|source| KeyError::Format {
        path: path.to_owned(),
        source,
    })
}

/// Writes `identity` to a new key file at `path` with mode 0600. Never overwrites.
pub fn write(path: &Path, identity: &Identity) -> Result<(), KeyError> {
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(io(path))?;
    file.write_all(identity.to_key_file().as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(io(path))
}

/// Loads the key file at `path`, creating a new identity there first if there is none.
/// Returns the identity and whether it was created.
pub fn load_or_create(path: &Path, mesh: &MeshName) -> Result<(Identity, bool), KeyError> {
    if path.exists() {
        return load(path, mesh).map(|id| (id, false));
    }
    let identity = Identity::generate(mesh.clone(), &SystemRandom::new()).map_err(|source| {
        KeyError::Format {
            path: path.to_owned(),
            source,
        }
    })?;
    write(path, &identity)?;
    Ok((identity, true))
}

/// The key files of one agent: `node.key` and `workloads/<name>.key` under its state
/// directory.
#[derive(Debug, Clone)]
pub struct KeyStore {
    dir: PathBuf,
    mesh: MeshName,
}

impl KeyStore {
    /// Opens (creating with mode 0700 if needed) the key store under `state_dir`.
    pub fn open(state_dir: &Path, mesh: MeshName) -> Result<Self, KeyError> {
        let workloads = state_dir.join("workloads");
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&workloads)
            .map_err(io(&workloads))?;
        Ok(KeyStore {
            dir: state_dir.to_owned(),
            mesh,
        })
    }

    /// The node's identity, created on first use.
    pub fn node(&self) -> Result<(Identity, bool), KeyError> {
        load_or_create(&self.dir.join("node.key"), &self.mesh)
    }

    /// The identity of the local workload `name`, created on first use.
    pub fn workload(&self, name: &WorkloadName) -> Result<(Identity, bool), KeyError> {
        load_or_create(&self.workload_path(name), &self.mesh)
    }

    /// The identity of the local workload `name`, if it has one.
    pub fn existing_workload(&self, name: &WorkloadName) -> Result<Option<Identity>, KeyError> {
        let path = self.workload_path(name);
        if path.exists() {
            load(&path, &self.mesh).map(Some)
        } else {
            Ok(None)
        }
    }

    fn workload_path(&self, name: &WorkloadName) -> PathBuf {
        // `WorkloadName` admits no `/` and no leading dot: the path stays in the directory.
        self.dir.join("workloads").join(format!("{name}.key"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn created_keys_are_private_and_readable_keys_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mesh = MeshName::new("test").unwrap();
        let store = KeyStore::open(dir.path(), mesh.clone()).unwrap();
        let (node, created) = store.node().unwrap();
        assert!(created);
        let path = dir.path().join("node.key");
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(store.node().unwrap().0.id(), node.id());

        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        let error = store.node().unwrap_err();
        assert!(
            matches!(error, KeyError::ReadableByOthers { mode: 0o644, .. }),
            "{error}"
        );
        assert!(error.to_string().contains("chmod 600"));

        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
        fs::write(&path, "not a key").unwrap();
        assert!(matches!(store.node().unwrap_err(), KeyError::Format { .. }));
    }
}
