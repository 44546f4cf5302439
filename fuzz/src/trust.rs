//! Fixed mesh-trust material for the `trust_decoders` target: a mesh root, a
//! per-service authority, a node and a workload made from fixed seeds, and the
//! genuine credentials between them. Ed25519 signatures are deterministic, so these
//! bytes are the same in every run and every crash reproduces.

use std::net::SocketAddr;
use std::sync::OnceLock;

use themis_core::Identity;
use themis_trust::{
    chain_to_pem, to_pem, AddressRange, Admission, Announcement, Binding, Grant, InstanceValue,
    MeshRoot, Metadata, PemKind, Record, Revocation, Revocations, Signed, Verifier,
    ADMISSION_LABEL, ANNOUNCEMENT_LABEL, BINDING_LABEL, GRANT_LABEL, RECORD_LABEL,
    REVOCATION_LABEL,
};

use crate::{mesh, with_rng, MESH};

/// The verifiers' clock, Unix ms; every genuine statement is current then.
pub const NOW: u64 = 1_800_000_000_000;
/// The service the genuine records are for.
pub const SERVICE: &str = "check";
/// The namespace the genuine binding lets serve [`SERVICE`].
pub const NAMESPACE: &str = "shop";
/// The one ServiceAccount of [`NAMESPACE`] the genuine binding names.
pub const SERVICE_ACCOUNT: &str = "checker";
const MINUTE: u64 = 60_000;

/// The fixed keys and the genuine statements, encoded.
pub struct Trust {
    /// The mesh root (`fuzz:<hex>`).
    pub root: MeshRoot,
    /// Its private half (it signs the log's checkpoints).
    pub root_key: Identity,
    /// The admitted node, granted [`SERVICE`] directly and through the authority.
    pub node: Identity,
    /// The workload the records name.
    pub workload: Identity,
    /// Root → node admission.
    pub admission: Signed,
    /// Root → node grant of [`SERVICE`].
    pub grant: Signed,
    /// Root → authority (may delegate), authority → node.
    pub delegated_chain: Vec<Signed>,
    /// Instance values: the record under the direct grant, the record under the
    /// delegated chain, and a tombstone (no endpoint) under the direct grant.
    pub values: Vec<Vec<u8>>,
    /// The root's revocation of the workload.
    pub revocation: Signed,
    /// The root's binding of [`SERVICE`] to namespace [`NAMESPACE`], ServiceAccount
    /// [`SERVICE_ACCOUNT`] only.
    pub binding: Signed,
    /// Every genuine encoding above, with what it is (see [`Trust::genuine`]).
    genuine: Vec<(Genuine, Vec<u8>)>,
    /// A set holding [`Trust::revocation`].
    pub revoked: Revocations,
    /// An empty set.
    pub none: Revocations,
}

fn identity(seed: u8) -> Identity {
    with_rng(&[&[seed; 32]], |rng| Identity::generate(mesh(), rng)).expect("identity")
}

fn grant(by: &Identity, to: &Identity, delegate: bool) -> Signed {
    Signed::sign(
        by,
        GRANT_LABEL,
        &Grant {
            mesh: MESH.into(),
            service: SERVICE.into(),
            grantee: *to.public_key(),
            delegate,
            issued_at: NOW - MINUTE,
            not_after: None,
        },
    )
}

fn record(node: &Identity, workload: &Identity, endpoint: Option<SocketAddr>) -> Signed {
    let mut metadata = Metadata::new();
    metadata.insert("version".into(), "v2".into());
    Signed::sign(
        node,
        RECORD_LABEL,
        &Record {
            mesh: MESH.into(),
            service: SERVICE.into(),
            workload_key: *workload.public_key(),
            endpoint,
            metadata,
            issued_at: NOW - MINUTE,
            not_after: NOW + 10 * MINUTE,
        },
    )
}

/// The fixed material, made once per process.
pub fn trust() -> &'static Trust {
    static TRUST: OnceLock<Trust> = OnceLock::new();
    TRUST.get_or_init(|| {
        let (root_key, authority, node, workload) =
            (identity(0xc0), identity(0xc1), identity(0xc2), identity(0xc3));
        let root = MeshRoot { mesh: mesh(), key: *root_key.public_key() };
        let admission = Signed::sign(
            &root_key,
            ADMISSION_LABEL,
            &Admission {
                mesh: MESH.into(),
                node_key: *node.public_key(),
                issued_at: NOW - MINUTE,
                not_after: Some(NOW + 60 * MINUTE),
            },
        );
        let direct = grant(&root_key, &node, false);
        let delegated_chain =
            vec![grant(&root_key, &authority, true), grant(&authority, &node, false)];
        let endpoint: SocketAddr = "10.0.0.7:15006".parse().expect("an address");
        let values: Vec<Vec<u8>> = vec![
            InstanceValue {
                grants: vec![direct.clone()],
                record: record(&node, &workload, Some(endpoint)),
            },
            InstanceValue {
                grants: delegated_chain.clone(),
                record: record(&node, &workload, Some(endpoint)),
            },
            InstanceValue { grants: vec![direct.clone()], record: record(&node, &workload, None) },
        ]
        .iter()
        .map(InstanceValue::encode)
        .collect();
        let revocation = Signed::sign(
            &root_key,
            REVOCATION_LABEL,
            &Revocation {
                mesh: MESH.into(),
                id: workload.id().0,
                issued_at: NOW,
                reason: "fuzz".into(),
            },
        );
        let mut revoked = Revocations::new();
        assert!(revoked.add(&root, &revocation.encode()).expect("the genuine revocation verifies"));
        let mut genuine = vec![
            (Genuine::Admission, admission.encode()),
            (Genuine::Revocation, revocation.encode()),
        ];
        genuine.extend(
            [&direct].into_iter().chain(&delegated_chain).map(|g| (Genuine::Grant, g.encode())),
        );
        genuine.extend(values.iter().map(|v| (Genuine::Value, v.clone())));
        let announcement = Signed::sign(
            &node,
            ANNOUNCEMENT_LABEL,
            &Announcement {
                mesh: MESH.into(),
                address: "10.0.0.7:7946".parse().expect("an address"),
                issued_at: NOW - MINUTE,
                leaving: false,
                address_range: None,
            },
        );
        genuine.push((Genuine::Announcement, announcement.encode()));
        let address_range = Signed::sign(
            &root_key,
            themis_trust::ADDRESS_RANGE_LABEL,
            &AddressRange {
                mesh: MESH.into(),
                node_key: *node.public_key(),
                network: "10.244.1.0".parse().expect("an address"),
                prefix_len: 24,
                issued_at: NOW - MINUTE,
                not_after: None,
            },
        );
        genuine.push((Genuine::AddressRange, address_range.encode()));
        let binding = Signed::sign(
            &root_key,
            BINDING_LABEL,
            &Binding {
                mesh: MESH.into(),
                service: SERVICE.into(),
                namespace: NAMESPACE.into(),
                service_accounts: vec![SERVICE_ACCOUNT.into()],
                issued_at: NOW - MINUTE,
                not_after: None,
            },
        );
        Trust {
            root,
            root_key,
            node,
            workload,
            admission,
            grant: direct,
            delegated_chain,
            values,
            revocation,
            binding,
            genuine,
            revoked,
            none: Revocations::new(),
        }
    })
}

impl Trust {
    /// A verifier at [`NOW`] without revocations.
    pub fn verifier(&self) -> Verifier<'_> {
        Verifier { root: &self.root, now_ms: NOW, revoked: &self.none }
    }

    /// A verifier at [`NOW`] that knows the workload is revoked.
    pub fn revoking_verifier(&self) -> Verifier<'_> {
        Verifier { root: &self.root, now_ms: NOW, revoked: &self.revoked }
    }

    /// Every genuine encoding, with what it is: the admission, the revocation, the
    /// three grants (root → node, root → authority, authority → node) and the three
    /// instance values.
    pub fn genuine(&self) -> &[(Genuine, Vec<u8>)] {
        &self.genuine
    }

    /// The grant chains the fixed keys made that verify on their own: root → node,
    /// root → authority (the authority may endorse too), root → authority → node.
    pub fn chains(&self) -> [Vec<Signed>; 3] {
        [
            vec![self.grant.clone()],
            vec![self.delegated_chain[0].clone()],
            self.delegated_chain.clone(),
        ]
    }

    /// Every genuine credential file: (kind, PEM text). The delegated chain is one
    /// file of two `THEMIS GRANT` blocks.
    pub fn pem_files(&self) -> Vec<(PemKind, String)> {
        vec![
            (PemKind::Admission, to_pem(PemKind::Admission, &self.admission)),
            (PemKind::Grant, to_pem(PemKind::Grant, &self.grant)),
            (PemKind::Grant, chain_to_pem(&self.delegated_chain)),
            (PemKind::Revocation, to_pem(PemKind::Revocation, &self.revocation)),
        ]
    }
}

/// What a genuine encoding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Genuine {
    /// A `Signed` admission.
    Admission,
    /// A `Signed` grant.
    Grant,
    /// A `Signed` revocation.
    Revocation,
    /// An encoded `InstanceValue`.
    Value,
    /// The node's `Signed` address announcement (at the records' endpoint IP).
    Announcement,
    /// The root's `Signed` grant of 10.244.1.0/24 to the node.
    AddressRange,
}
