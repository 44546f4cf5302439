//! The mesh operator's offline commands: create a mesh, admit a node, grant a
//! service, set up a per-service authority and endorse a node with it, revoke a key.
//! Each reads key files and writes credential files; none talks to a network, and
//! the mesh key never goes anywhere a running agent reads.
//!
//! Layout (what `themis` writes; an agent's state directory is a node directory):
//!
//! ```text
//! <mesh dir>/mesh.key        the root's private key (0600; keep it offline)
//! <mesh dir>/mesh.root       the public root, <mesh>:<hex>
//! <mesh dir>/trust-log.bin   every statement the root signed, and its checkpoint
//! <node dir>/node.key        the node key, generated here by the operator
//! <node dir>/admission.pem   root → node
//! <node dir>/mesh.root       a copy of the root
//! <node dir>/grants/<service>.pem   the grant chain for one service
//! <node dir>/address-range.pem      root → node: its pods' addresses (Kubernetes)
//! <authority dir>/authority.key, grant.pem, mesh.root   a per-service authority
//! ```

use std::fs;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use ring::rand::SystemRandom;
use serde::Serialize;
use themis_core::{Identity, MeshName, PeerId};
use themis_log::{Entry, Kind, Log};
use themis_trust::{
    chain_from_pem, chain_to_pem, to_pem, AddressRange, Admission, Binding, Grant, IpNet, MeshRoot,
    PemKind, Revocation, Signed, ADDRESS_RANGE_LABEL, ADMISSION_LABEL, BINDING_LABEL,
    BROADEST_RANGE, GRANT_LABEL, MAX_REASON_LEN, REVOCATION_LABEL,
};

use themis_agent::keystore;
use themis_agent::names::ServiceName;
use themis_agent::trust::{
    load_root, unix_millis, ADDRESS_RANGE_FILE, ADMISSION_FILE, GRANTS_DIR, ROOT_FILE,
};

/// The root's private key file in a mesh directory.
pub const MESH_KEY_FILE: &str = "mesh.key";
/// The node key file in a node directory (the agent's state directory).
pub const NODE_KEY_FILE: &str = "node.key";
/// A per-service authority's key file.
pub const AUTHORITY_KEY_FILE: &str = "authority.key";
/// A per-service authority's grant chain.
pub const AUTHORITY_GRANT_FILE: &str = "grant.pem";

/// Why an operator command failed; the message says what to do.
#[derive(Debug, thiserror::Error)]
pub enum OperatorError {
    /// Reading or writing a file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
    /// A key file could not be used.
    #[error("{0}")]
    Key(#[from] keystore::KeyError),
    /// The mesh root could not be read.
    #[error("{0}")]
    Root(#[from] themis_agent::trust::TrustSetupError),
    /// A credential file is not valid.
    #[error("{path}: {error}")]
    Credential {
        /// The file.
        path: PathBuf,
        /// Why.
        error: themis_trust::TrustError,
    },
    /// Something is in the way or out of range.
    #[error("{0}")]
    Refused(String),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> OperatorError + '_ {
    move |source| OperatorError::Io {
        path: path.to_owned(),
        source,
    }
}

fn make_dir(dir: &Path) -> Result<(), OperatorError> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(io(dir))
}

/// Writes a public file that must not exist yet.
fn write_new(path: &Path, text: &str) -> Result<(), OperatorError> {
    use std::io::Write;
    fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .map_err(io(path))
}

/// Writes a public file, replacing what was there (a renewed grant, say).
fn write_replace(path: &Path, text: &str) -> Result<(), OperatorError> {
    themis_agent::files::replace(path, text.as_bytes()).map_err(io(path))
}

/// A mesh directory: the root key, its public form and the trust log.
pub struct MeshDir {
    /// The root's signing key.
    pub key: Identity,
    /// The public root.
    pub root: MeshRoot,
    /// Where it is.
    pub dir: PathBuf,
}

pub use themis_agent::trust_log::LOG_FILE;

impl MeshDir {
    /// The mesh's trust log as this directory holds it, verified from its first
    /// leaf; empty for a mesh made before the log (see `themis log import`).
    pub fn log(&self) -> Result<Log, OperatorError> {
        let path = self.dir.join(LOG_FILE);
        match fs::read(&path) {
            Ok(bytes) => Log::from_copy(self.root.clone(), &bytes).map_err(|e| {
                OperatorError::Refused(format!(
                    "{}: the trust log does not verify ({e}); `themis log verify` says more",
                    path.display()
                ))
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Log::new(self.root.clone())),
            Err(source) => Err(OperatorError::Io { path, source }),
        }
    }

    /// Appends root-signed statements to the trust log and signs a new checkpoint;
    /// returns the log's path and the statements' indices. The log is written
    /// before the credential files that hold the statements (tmp, fsync, rename):
    /// nothing the root signs escapes the log.
    pub fn record(
        &self,
        statements: &[(Kind, &Signed)],
    ) -> Result<(PathBuf, Vec<u64>), OperatorError> {
        let mut log = self.log()?;
        let mut indices = Vec::with_capacity(statements.len());
        for (kind, signed) in statements {
            let leaf = Entry::new(*kind, (*signed).clone()).encode();
            indices.push(
                log.append(leaf)
                    .map_err(|e| OperatorError::Refused(e.to_string()))?,
            );
        }
        log.sign_checkpoint(&self.key, unix_millis());
        let path = self.save_log(&log)?;
        Ok((path, indices))
    }

    /// Writes `log` as this directory's copy.
    pub fn save_log(&self, log: &Log) -> Result<PathBuf, OperatorError> {
        let path = self.dir.join(LOG_FILE);
        let bytes = log
            .to_copy()
            .ok_or_else(|| OperatorError::Refused("the log has no checkpoint yet".into()))?;
        themis_agent::files::replace(&path, &bytes).map_err(io(&path))?;
        Ok(path)
    }

    /// Opens a mesh directory `themis mesh create` made.
    pub fn open(dir: &Path) -> Result<MeshDir, OperatorError> {
        let root = load_root(&dir.join(ROOT_FILE).display().to_string())?;
        let key = keystore::load(&dir.join(MESH_KEY_FILE), &root.mesh)?;
        if key.public_key() != &root.key {
            return Err(OperatorError::Refused(format!(
                "{}: the mesh key does not match {}",
                dir.display(),
                ROOT_FILE
            )));
        }
        Ok(MeshDir {
            key,
            root,
            dir: dir.to_owned(),
        })
    }
}

/// What a command wrote, for people and `--json`.
#[derive(Debug, Serialize)]
pub struct Written {
    /// What was done, in words.
    pub summary: String,
    /// The printable id of the key concerned.
    pub id: String,
    /// The mesh root.
    pub mesh_root: String,
    /// Files written.
    pub files: Vec<PathBuf>,
}

/// Creates a mesh: a new root key (`mesh.key`, 0600) and `mesh.root` in `dir`.
pub fn create_mesh(name: &str, dir: &Path) -> Result<Written, OperatorError> {
    let mesh =
        MeshName::new(name).map_err(|e| OperatorError::Refused(format!("mesh {name:?}: {e}")))?;
    make_dir(dir)?;
    let key = Identity::generate(mesh.clone(), &SystemRandom::new())
        .map_err(|e| OperatorError::Refused(e.to_string()))?;
    let key_path = dir.join(MESH_KEY_FILE);
    keystore::write(&key_path, &key)?;
    let root = MeshRoot {
        mesh,
        key: *key.public_key(),
    };
    let root_path = dir.join(ROOT_FILE);
    write_new(&root_path, &format!("{root}\n"))?;
    let mesh_dir = MeshDir {
        key,
        root: root.clone(),
        dir: dir.to_owned(),
    };
    let (log_path, _) = mesh_dir.record(&[])?;
    let key = mesh_dir.key;
    Ok(Written {
        summary: format!(
            "created mesh {}; keep {} offline",
            root.mesh,
            key_path.display()
        ),
        id: key.printable_id(),
        mesh_root: root.to_string(),
        files: vec![key_path, root_path, log_path],
    })
}

/// Admits a node: generates its key in `node_dir` (so its ring position comes from
/// the operator's randomness, not the node's), and writes its admission and the root.
/// An existing `node.key` there is admitted instead only with `existing_key`.
pub fn admit_node(
    mesh: &MeshDir,
    node_dir: &Path,
    not_after: Option<u64>,
    existing_key: bool,
) -> Result<Written, OperatorError> {
    make_dir(node_dir)?;
    let key_path = node_dir.join(NODE_KEY_FILE);
    let node = if key_path.exists() {
        if !existing_key {
            return Err(OperatorError::Refused(format!(
                "{} exists: admission generates the node key itself (a node that chose its own \
                 key could have chosen its ring position); pass --existing-key to admit that key anyway",
                key_path.display()
            )));
        }
        keystore::load(&key_path, &mesh.root.mesh)?
    } else {
        let node = Identity::generate(mesh.root.mesh.clone(), &SystemRandom::new())
            .map_err(|e| OperatorError::Refused(e.to_string()))?;
        keystore::write(&key_path, &node)?;
        node
    };
    let admission = Signed::sign(
        &mesh.key,
        ADMISSION_LABEL,
        &Admission {
            mesh: mesh.root.mesh.to_string(),
            node_key: *node.public_key(),
            issued_at: unix_millis(),
            not_after,
        },
    );
    let (log_path, _) = mesh.record(&[(Kind::Admission, &admission)])?;
    let admission_path = node_dir.join(ADMISSION_FILE);
    write_replace(&admission_path, &to_pem(PemKind::Admission, &admission))?;
    let root_path = node_dir.join(ROOT_FILE);
    write_replace(&root_path, &format!("{}\n", mesh.root))?;
    Ok(Written {
        summary: format!(
            "admitted node {} to mesh {}; start its agent with --state-dir {}",
            node.printable_id(),
            mesh.root.mesh,
            node_dir.display()
        ),
        id: node.printable_id(),
        mesh_root: mesh.root.to_string(),
        files: vec![log_path, key_path, admission_path, root_path],
    })
}

fn node_key(node_dir: &Path, mesh: &MeshName) -> Result<Identity, OperatorError> {
    Ok(keystore::load(&node_dir.join(NODE_KEY_FILE), mesh)?)
}

fn grant(
    signer: &Identity,
    service: &ServiceName,
    grantee: &[u8; 32],
    delegate: bool,
    not_after: Option<u64>,
) -> Signed {
    Signed::sign(
        signer,
        GRANT_LABEL,
        &Grant {
            mesh: signer.mesh().to_string(),
            service: service.as_str().to_owned(),
            grantee: *grantee,
            delegate,
            issued_at: unix_millis(),
            not_after,
        },
    )
}

/// The root grants `service` to the node in `node_dir`: its agent may then endorse
/// local instances of the service. Written to `<node_dir>/grants/<service>.pem`.
pub fn grant_to_node(
    mesh: &MeshDir,
    service: &ServiceName,
    node_dir: &Path,
    not_after: Option<u64>,
) -> Result<Written, OperatorError> {
    let node = node_key(node_dir, &mesh.root.mesh)?;
    let chain = vec![grant(
        &mesh.key,
        service,
        node.public_key(),
        false,
        not_after,
    )];
    let (log_path, _) = mesh.record(&[(Kind::Grant, &chain[0])])?;
    let mut written = write_chain(node_dir, service, &chain, &node, &mesh.root)?;
    written.files.insert(0, log_path);
    Ok(written)
}

/// The root grants a node the addresses its workloads may listen at besides its own
/// (on Kubernetes, its pod range: `kubectl get node N -o jsonpath='{.spec.podCIDR}'`).
/// Writes DIR/address-range.pem (the agent reads it at start and binds it into its
/// address announcements) and records the grant in the log. A new grant replaces
/// the earlier one everywhere: only a node's newest logged grant counts, and the
/// node's agent announces it from its log without a restart. Refused if it overlaps
/// another node's grant in force.
pub fn grant_address_range(
    mesh: &MeshDir,
    node_dir: &Path,
    range: IpNet,
    not_after: Option<u64>,
) -> Result<Written, OperatorError> {
    if range.trunc() != range {
        return Err(OperatorError::Refused(format!(
            "{range} has host bits set: did you mean {}?",
            range.trunc()
        )));
    }
    let broadest = match range {
        IpNet::V4(_) => BROADEST_RANGE.0,
        IpNet::V6(_) => BROADEST_RANGE.1,
    };
    if range.prefix_len() < broadest {
        return Err(OperatorError::Refused(format!(
            "{range} is broader than /{broadest}: a node is granted its own pods' range, \
             and an address two nodes claim belongs to neither"
        )));
    }
    let node = node_key(node_dir, &mesh.root.mesh)?;
    if let Some((other, net)) = overlapping_range(&mesh.log()?, &mesh.root, &node, &range) {
        return Err(OperatorError::Refused(format!(
            "{range} overlaps {net}, granted to node {other}: an address two nodes claim \
             belongs to neither (revoke that node, or let its grant expire, first)"
        )));
    }
    let grant = Signed::sign(
        &mesh.key,
        ADDRESS_RANGE_LABEL,
        &AddressRange {
            mesh: mesh.root.mesh.to_string(),
            node_key: *node.public_key(),
            network: range.network(),
            prefix_len: range.prefix_len(),
            issued_at: unix_millis(),
            not_after,
        },
    );
    let (log_path, _) = mesh.record(&[(Kind::AddressRange, &grant)])?;
    let path = node_dir.join(ADDRESS_RANGE_FILE);
    write_replace(&path, &to_pem(PemKind::AddressRange, &grant))?;
    Ok(Written {
        summary: format!(
            "node {} may now place its workloads at {range} (its agent reads this at start)",
            node.printable_id()
        ),
        id: node.printable_id(),
        mesh_root: mesh.root.to_string(),
        files: vec![log_path, path],
    })
}

/// The root binds `service` to a Kubernetes namespace: on an agent that requires
/// bindings (`themis agent --require-binding`, the DaemonSet's), only pods of
/// `namespace` running as one of `service_accounts` (any, when empty) are endorsed
/// as the service, whatever their annotations say (docs/PROTOCOL.md §7.1). With
/// `withdraw`, a binding that has expired as it is signed: it replaces the
/// namespace's earlier one, so the namespace may serve the service no more. Only
/// logged: `themis log publish` hands it to the agents.
pub fn bind_service(
    mesh: &MeshDir,
    service: &ServiceName,
    namespace: &str,
    service_accounts: &[String],
    withdraw: bool,
) -> Result<Written, OperatorError> {
    let issued_at = unix_millis();
    let binding = Binding {
        mesh: mesh.root.mesh.to_string(),
        service: service.as_str().to_owned(),
        namespace: namespace.to_owned(),
        service_accounts: service_accounts.to_vec(),
        issued_at,
        not_after: withdraw.then_some(issued_at),
    };
    binding.check().map_err(|_| {
        OperatorError::Refused(format!(
            "namespace {namespace:?} and ServiceAccounts {service_accounts:?}: a namespace is a \
             DNS label, a ServiceAccount a DNS subdomain (lowercase), each named once, at most \
             {} of them",
            themis_trust::MAX_BOUND_ACCOUNTS
        ))
    })?;
    let signed = Signed::sign(&mesh.key, BINDING_LABEL, &binding);
    let (log_path, _) = mesh.record(&[(Kind::Binding, &signed)])?;
    let who = match service_accounts {
        [] => format!("any ServiceAccount of namespace {namespace}"),
        accounts => format!("namespace {namespace} as {}", accounts.join(", ")),
    };
    Ok(Written {
        summary: match withdraw {
            false => format!(
                "pods of {who} may now serve {service} (logged: `themis log publish` hands it to the agents)"
            ),
            true => format!(
                "pods of namespace {namespace} may no longer serve {service} (logged: `themis log publish` hands it to the agents)"
            ),
        },
        id: service.to_string(),
        mesh_root: mesh.root.to_string(),
        files: vec![log_path],
    })
}

/// The first range in `log` granted to a node other than `node` that overlaps
/// `range` and still holds: that node's newest grant (an older one no longer counts),
/// not expired, its node not revoked. (Two networks overlap when one holds the
/// other's first address: they nest or are apart.)
fn overlapping_range(
    log: &Log,
    root: &MeshRoot,
    node: &Identity,
    range: &IpNet,
) -> Option<(String, IpNet)> {
    let revoked: std::collections::HashSet<[u8; 32]> = log
        .statements()
        .filter_map(|(_, s)| match s {
            themis_log::Statement::Revocation(r) => Some(r.id),
            _ => None,
        })
        .collect();
    let now = unix_millis();
    let newest = log.newest_address_ranges();
    newest.into_values().find_map(|(_, grant)| {
        let other = PeerId::derive(&grant.node_key, root.mesh.as_str());
        let holds = grant.node_key != *node.public_key()
            && grant.not_after.is_none_or(|t| t > now)
            && !revoked.contains(&other.0);
        let net = grant.net().ok().filter(|_| holds)?;
        let overlaps = net.contains(&range.network()) || range.contains(&net.network());
        overlaps.then(|| (other.printable(&root.mesh), net))
    })
}

fn write_chain(
    node_dir: &Path,
    service: &ServiceName,
    chain: &[Signed],
    node: &Identity,
    root: &MeshRoot,
) -> Result<Written, OperatorError> {
    let dir = node_dir.join(GRANTS_DIR);
    make_dir(&dir)?;
    let path = dir.join(format!("{service}.pem"));
    write_replace(&path, &chain_to_pem(chain))?;
    Ok(Written {
        summary: format!(
            "node {} may now serve {service} (the agent picks the grant up at the next registration)",
            node.printable_id()
        ),
        id: node.printable_id(),
        mesh_root: root.to_string(),
        files: vec![path],
    })
}

/// The root creates a per-service authority in `dir`: a new key granted `service`
/// with the right to pass it on, so that service owners endorse nodes without the
/// mesh key.
pub fn create_authority(
    mesh: &MeshDir,
    service: &ServiceName,
    dir: &Path,
    not_after: Option<u64>,
) -> Result<Written, OperatorError> {
    make_dir(dir)?;
    let key = Identity::generate(mesh.root.mesh.clone(), &SystemRandom::new())
        .map_err(|e| OperatorError::Refused(e.to_string()))?;
    let key_path = dir.join(AUTHORITY_KEY_FILE);
    keystore::write(&key_path, &key)?;
    let chain = [grant(&mesh.key, service, key.public_key(), true, not_after)];
    let (log_path, _) = mesh.record(&[(Kind::Grant, &chain[0])])?;
    let grant_path = dir.join(AUTHORITY_GRANT_FILE);
    write_replace(&grant_path, &chain_to_pem(&chain))?;
    let root_path = dir.join(ROOT_FILE);
    write_replace(&root_path, &format!("{}\n", mesh.root))?;
    Ok(Written {
        summary: format!(
            "created an authority for {service}: `themis service endorse {service} --authority {}` grants it to nodes",
            dir.display()
        ),
        id: key.printable_id(),
        mesh_root: mesh.root.to_string(),
        files: vec![log_path, key_path, grant_path, root_path],
    })
}

/// A per-service authority (in `authority_dir`) grants `service` to the node in
/// `node_dir`: the chain root → authority → node.
pub fn endorse_node(
    authority_dir: &Path,
    service: &ServiceName,
    node_dir: &Path,
    not_after: Option<u64>,
) -> Result<Written, OperatorError> {
    let root = load_root(&authority_dir.join(ROOT_FILE).display().to_string())?;
    let key = keystore::load(&authority_dir.join(AUTHORITY_KEY_FILE), &root.mesh)?;
    let grant_path = authority_dir.join(AUTHORITY_GRANT_FILE);
    let text = fs::read_to_string(&grant_path).map_err(io(&grant_path))?;
    let mut chain = chain_from_pem(&text).map_err(|error| OperatorError::Credential {
        path: grant_path.clone(),
        error,
    })?;
    let revoked = themis_trust::Revocations::new();
    let verifier = themis_trust::Verifier {
        root: &root,
        now_ms: unix_millis(),
        revoked: &revoked,
    };
    let held =
        verifier
            .grants(&chain, service.as_str())
            .map_err(|error| OperatorError::Credential {
                path: grant_path.clone(),
                error,
            })?;
    if !held.delegate || &held.grantee != key.public_key() {
        return Err(OperatorError::Refused(format!(
            "{}: this authority may not pass {service} on",
            grant_path.display()
        )));
    }
    let node = node_key(node_dir, &root.mesh)?;
    chain.push(grant(&key, service, node.public_key(), false, not_after));
    write_chain(node_dir, service, &chain, &node, &root)
}

/// The root revokes the keys whose printable ids are `ids` (nodes, authorities or
/// workloads), for good, in one checkpoint of the trust log. Returns the PEM text of
/// the revocations and what was done.
pub fn revoke(
    mesh: &MeshDir,
    ids: &[String],
    reason: &str,
) -> Result<(String, Written), OperatorError> {
    if reason.len() > MAX_REASON_LEN {
        return Err(OperatorError::Refused(format!(
            "the reason is {} bytes; at most {MAX_REASON_LEN}",
            reason.len()
        )));
    }
    let mut revocations = Vec::with_capacity(ids.len());
    for id in ids {
        let peer = PeerId::parse_in(id, &mesh.root.mesh)
            .map_err(|e| OperatorError::Refused(format!("{id}: {e}")))?;
        if peer == mesh.root.id() {
            return Err(OperatorError::Refused(
                "that is the mesh root itself: create a new mesh instead".into(),
            ));
        }
        revocations.push(Signed::sign(
            &mesh.key,
            REVOCATION_LABEL,
            &Revocation {
                mesh: mesh.root.mesh.to_string(),
                id: peer.0,
                issued_at: unix_millis(),
                reason: reason.to_owned(),
            },
        ));
    }
    let statements: Vec<(Kind, &Signed)> =
        revocations.iter().map(|r| (Kind::Revocation, r)).collect();
    let (log_path, indices) = mesh.record(&statements)?;
    let pem: String = revocations
        .iter()
        .map(|r| to_pem(PemKind::Revocation, r))
        .collect();
    let (first, last) = (
        indices.first().copied().unwrap_or(0),
        indices.last().copied().unwrap_or(0),
    );
    let summary = match ids {
        [one] => format!("revoked {one} (trust log leaf {first})"),
        _ => format!(
            "revoked {} keys (trust log leaves {first}..={last})",
            ids.len()
        ),
    };
    Ok((
        pem,
        Written {
            summary,
            id: ids.join(","),
            mesh_root: mesh.root.to_string(),
            files: vec![log_path],
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An address two nodes claim belongs to neither, so the operator refuses a range
    /// that overlaps another node's grant in force (nested either way), and grants it
    /// again once that node is revoked; a node's own earlier range is no obstacle.
    #[test]
    fn a_range_overlapping_another_nodes_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        create_mesh("test", &dir.path().join("mesh")).unwrap();
        let mesh = MeshDir::open(&dir.path().join("mesh")).unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        admit_node(&mesh, &a, None, false).unwrap();
        admit_node(&mesh, &b, None, false).unwrap();
        let net = |text: &str| text.parse::<IpNet>().unwrap();
        grant_address_range(&mesh, &a, net("10.244.1.0/24"), None).unwrap();
        for overlapping in ["10.244.1.0/24", "10.244.1.128/25", "10.244.0.0/16"] {
            match grant_address_range(&mesh, &b, net(overlapping), None) {
                Err(OperatorError::Refused(why)) => {
                    assert!(why.contains("overlaps 10.244.1.0/24"), "{why}")
                }
                other => panic!("{overlapping}: {other:?}"),
            }
        }
        grant_address_range(&mesh, &b, net("10.244.2.0/24"), None).unwrap();
        // Narrowed: only a node's newest grant counts, so the half it gave up is free.
        grant_address_range(&mesh, &a, net("10.244.1.0/25"), None).unwrap();
        grant_address_range(&mesh, &b, net("10.244.1.128/25"), None).unwrap();
        assert!(grant_address_range(&mesh, &b, net("10.244.1.0/26"), None).is_err());
        // Expired grants and revoked nodes no longer count.
        let c = dir.path().join("c");
        admit_node(&mesh, &c, None, false).unwrap();
        grant_address_range(&mesh, &c, net("10.244.9.0/24"), Some(unix_millis() - 1)).unwrap();
        grant_address_range(&mesh, &b, net("10.244.9.0/24"), None).unwrap();
        let a_id = node_key(&a, &mesh.root.mesh).unwrap().printable_id();
        revoke(&mesh, &[a_id], "test").unwrap();
        grant_address_range(&mesh, &b, net("10.244.1.0/24"), None).unwrap();
    }
}
