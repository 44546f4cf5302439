//! Key files on disk: the node identity and one identity per local workload.
//!
//! Each is a PEM PKCS#8 file (what `openssl genpkey -algorithm ed25519` writes) with
//! mode 0600 in a 0700 directory. A key file that anyone but its owner can read is
//! refused rather than used: a leaked key is a stolen identity, and there is no CA to
//! revoke it.
//!
//! A key file is also refused unless this user owns it, it is no symbolic link, and
//! no other user can replace it: its directory and every directory above it belong to
//! root or to this user and are writable by no one else (a directory writable by all
//! with the sticky bit, such as `/tmp`, may stand above, not as the key's own
//! directory). Otherwise a local user who made `/tmp/mesh` first could put their own
//! `mesh.key` or workload keys in it. The same rule covers the trust files the agent
//! reads (`mesh.root`, admissions, grants: [`read_trusted`]).

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use ring::rand::SystemRandom;
use themis_core::{Identity, KeyFileError, MeshName};
use zeroize::Zeroizing;

use crate::sys::euid;

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
    /// Another user could have written or replaced the file.
    #[error("{path}: {why}; refusing a key or trust file another user could have put there")]
    NotOurs {
        /// The file or the directory at fault.
        path: PathBuf,
        /// What is wrong with it.
        why: String,
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

fn not_ours(path: &Path, why: impl Into<String>) -> KeyError {
    KeyError::NotOurs {
        path: path.to_owned(),
        why: why.into(),
    }
}

/// Checks that no other user can add, remove or replace files in `dir`: it and every
/// directory above it (symbolic links resolved) belong to root or to this user, and
/// none is writable by group or others — except, above `dir` itself, a directory with
/// the sticky bit (where others cannot replace what is ours).
pub fn check_dir(dir: &Path) -> Result<(), KeyError> {
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    let real = fs::canonicalize(dir).map_err(io(dir))?;
    let me = euid();
    for (depth, ancestor) in real.ancestors().enumerate() {
        let meta = fs::metadata(ancestor).map_err(io(ancestor))?;
        let (owner, mode) = (meta.uid(), meta.mode());
        if owner != 0 && owner != me {
            return Err(not_ours(
                ancestor,
                format!("the directory belongs to uid {owner}, not to root or uid {me}"),
            ));
        }
        let sticky = mode & 0o1000 != 0;
        if mode & 0o022 != 0 && (depth == 0 || !sticky) {
            return Err(not_ours(
                ancestor,
                format!(
                    "the directory has mode {:04o}: other users may write in it \
                     (chmod go-w, or keep keys in a directory of your own)",
                    mode & 0o7777
                ),
            ));
        }
    }
    Ok(())
}

/// Opens `path` for reading, refusing a symbolic link, a file that is not regular or
/// not owned by this user (or root, where `root_ok`), one writable by others, and
/// one in a directory others can write ([`check_dir`]). Returns the open file and
/// its mode bits.
fn open_checked(path: &Path, root_ok: bool) -> Result<(File, u32), KeyError> {
    check_dir(path.parent().unwrap_or(Path::new("/")))?;
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => not_ours(path, "it is a symbolic link"),
            _ => io(path)(e),
        })?;
    // The checks are on the file opened, not on the name: nothing can swap it between.
    let meta = file.metadata().map_err(io(path))?;
    let (owner, mode, me) = (meta.uid(), meta.mode(), euid());
    if !meta.is_file() {
        return Err(not_ours(path, "it is not a regular file"));
    }
    if owner != me && !(root_ok && owner == 0) {
        return Err(not_ours(
            path,
            format!("it belongs to uid {owner}, not to uid {me}"),
        ));
    }
    if mode & 0o022 != 0 {
        return Err(not_ours(
            path,
            format!("mode {:04o} lets other users write it", mode & 0o7777),
        ));
    }
    Ok((file, mode))
}

/// Reads a file the agent trusts without a secret in it (the mesh root, an admission,
/// a grant): refused unless root or this user owns it and no other user could have
/// written or replaced it.
pub fn read_trusted(path: &Path) -> Result<String, KeyError> {
    let (mut file, _) = open_checked(path, true)?;
    let mut text = String::new();
    file.read_to_string(&mut text).map_err(io(path))?;
    Ok(text)
}

/// Loads the identity in the key file at `path`, refusing a file others can read,
/// write or replace.
pub fn load(path: &Path, mesh: &MeshName) -> Result<Identity, KeyError> {
    let (mut file, mode) = open_checked(path, false)?;
    if mode & 0o077 != 0 {
        return Err(KeyError::ReadableByOthers {
            path: path.to_owned(),
            mode: mode & 0o7777,
        });
    }
    let mut pem = Zeroizing::new(String::new());
    file.read_to_string(&mut pem).map_err(io(path))?;
    Identity::from_key_file(mesh.clone(), &pem).map_err(|source| KeyError::Format {
        path: path.to_owned(),
        source,
    })
}

/// Writes `identity` to a new key file at `path` with mode 0600, in a directory no
/// other user can write ([`check_dir`]). Never overwrites, never follows a link.
pub fn write(path: &Path, identity: &Identity) -> Result<(), KeyError> {
    check_dir(path.parent().unwrap_or(Path::new("/")))?;
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW)
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
    // A dangling link counts as there: refused by `load`, never written through.
    if fs::symlink_metadata(path).is_ok() {
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
    /// Opens (creating with mode 0700 if needed) the key store under `state_dir`,
    /// refusing directories other users could write ([`check_dir`]).
    pub fn open(state_dir: &Path, mesh: MeshName) -> Result<Self, KeyError> {
        let workloads = state_dir.join("workloads");
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&workloads)
            .map_err(io(&workloads))?;
        // Both hold keys (and the state directory the trust files): neither may be
        // writable by others, sticky or not.
        check_dir(state_dir)?;
        check_dir(&workloads)?;
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
        if fs::symlink_metadata(&path).is_ok() {
            load(&path, &self.mesh).map(Some)
        } else {
            Ok(None)
        }
    }

    /// Deletes the key of the local workload `name`; whether it had one.
    pub fn remove_workload(&self, name: &WorkloadName) -> Result<bool, KeyError> {
        let path = self.workload_path(name);
        match fs::remove_file(&path) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(io(&path)(e)),
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
    use std::os::unix::fs::PermissionsExt;

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

    /// The attack: another local user prepares the directory (or a link) first and
    /// puts their own key there; the agent must refuse it rather than use it.
    #[test]
    fn keys_others_could_have_placed_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mesh = MeshName::new("test").unwrap();
        let store = KeyStore::open(dir.path(), mesh.clone()).unwrap();
        let (node, _) = store.node().unwrap();
        let path = dir.path().join("node.key");

        // A symbolic link to a key elsewhere (the attacker's).
        let elsewhere = dir.path().join("elsewhere.key");
        fs::rename(&path, &elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &path).unwrap();
        let error = store.node().unwrap_err();
        assert!(matches!(error, KeyError::NotOurs { .. }), "{error}");
        assert!(error.to_string().contains("symbolic link"), "{error}");
        // A dangling link is not written through either.
        fs::remove_file(&elsewhere).unwrap();
        assert!(store.node().is_err());
        assert!(!elsewhere.exists());
        fs::remove_file(&path).unwrap();

        // A directory other users can write: the key could have been swapped.
        let (again, _) = store.node().unwrap();
        assert_ne!(
            again.id(),
            node.id(),
            "a new key after the link was removed"
        );
        for mode in [0o770, 0o777, 0o1777] {
            fs::set_permissions(dir.path(), fs::Permissions::from_mode(mode)).unwrap();
            let error = store.node().unwrap_err();
            assert!(
                matches!(error, KeyError::NotOurs { .. }),
                "{mode:o}: {error}"
            );
            assert!(
                KeyStore::open(dir.path(), mesh.clone()).is_err(),
                "{mode:o}"
            );
        }
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o700)).unwrap();
        assert_eq!(store.node().unwrap().0.id(), again.id());

        // A key file writable by others, or trust files that are.
        fs::set_permissions(&path, fs::Permissions::from_mode(0o620)).unwrap();
        assert!(store.node().is_err());
        let root = dir.path().join("mesh.root");
        fs::write(&root, "x").unwrap();
        fs::set_permissions(&root, fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(read_trusted(&root).unwrap(), "x");
        fs::set_permissions(&root, fs::Permissions::from_mode(0o666)).unwrap();
        assert!(matches!(
            read_trusted(&root).unwrap_err(),
            KeyError::NotOurs { .. }
        ));
    }

    /// Files of another user: a key the agent did not write is not used.
    #[test]
    fn a_key_owned_by_another_user_is_refused() {
        if !themis_testkit::require::root("gives key files to another user") {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let mesh = MeshName::new("test").unwrap();
        let store = KeyStore::open(dir.path(), mesh.clone()).unwrap();
        store.node().unwrap();
        let path = dir.path().join("node.key");
        std::os::unix::fs::chown(&path, Some(1000), Some(1000)).unwrap();
        let error = store.node().unwrap_err();
        assert!(error.to_string().contains("belongs to uid 1000"), "{error}");
        // A directory of another user's.
        std::os::unix::fs::chown(&path, Some(0), Some(0)).unwrap();
        std::os::unix::fs::chown(dir.path(), Some(1000), Some(1000)).unwrap();
        assert!(store.node().is_err());
        std::os::unix::fs::chown(dir.path(), Some(0), Some(0)).unwrap();
        assert!(store.node().is_ok());
    }
}
