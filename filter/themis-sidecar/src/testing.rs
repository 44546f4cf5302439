//! The unit tests' agent answers, built as a real agent builds them.

use themis_contracts::api;
use themis_core::delegation::Delegation;
use themis_core::Identity;

/// The tests' clock: a fixed Unix ms.
pub const NOW: u64 = 1_800_000_000_000;
/// An hour in ms: the delegations' life.
pub const HOUR: u64 = 3_600_000;

/// `workload`'s public identity as the agent names it: workload `check` of mesh
/// `demo`.
pub fn public_identity(workload: &Identity) -> api::PublicIdentity {
    api::PublicIdentity {
        workload: "check".parse().unwrap(),
        mesh: "demo".into(),
        id: workload.printable_id(),
        public_key: hex::encode(workload.public_key()),
    }
}

/// The agent's answer to a delegation request for `key`: `workload`'s key delegates it
/// from [`NOW`] for an [`HOUR`], with `endorsement` (hex in the answer).
pub fn delegated(workload: &Identity, key: [u8; 32], endorsement: Option<&[u8]>) -> api::Delegated {
    let d = Delegation::issue(workload, key, NOW, HOUR);
    api::Delegated {
        identity: public_identity(workload),
        delegation: hex::encode(d.encode()),
        not_after_ms: d.not_after_ms,
        renew_at_ms: d.renew_at_ms(),
        service: None,
        endorsement: endorsement.map(hex::encode),
    }
}

/// A mesh root with one admitted node granted `check` and `handler`: endorsements as
/// the node signs them.
pub struct Trusted {
    pub root_key: Identity,
    pub root: themis_trust::MeshRoot,
    pub node: Identity,
}

impl Trusted {
    pub fn new() -> Trusted {
        let mesh = themis_core::MeshName::new("demo").unwrap();
        let rng = ring::rand::SystemRandom::new();
        let root_key = Identity::generate(mesh.clone(), &rng).unwrap();
        Trusted {
            root: themis_trust::MeshRoot {
                mesh: mesh.clone(),
                key: *root_key.public_key(),
            },
            node: Identity::generate(mesh, &rng).unwrap(),
            root_key,
        }
    }

    /// A fresh workload key of the mesh.
    pub fn workload(&self) -> Identity {
        Identity::generate(self.root.mesh.clone(), &ring::rand::SystemRandom::new()).unwrap()
    }

    /// The node's endorsement of `workload` as an instance of `service` (a tombstone
    /// unless `live`), with the root's grant: an encoded instance value.
    pub fn endorsement(&self, workload: &Identity, service: &str, live: bool) -> Vec<u8> {
        use themis_trust::{Grant, InstanceValue, Record, Signed, GRANT_LABEL, RECORD_LABEL};
        InstanceValue {
            grants: vec![Signed::sign(
                &self.root_key,
                GRANT_LABEL,
                &Grant {
                    mesh: "demo".into(),
                    service: service.into(),
                    grantee: *self.node.public_key(),
                    delegate: false,
                    issued_at: NOW,
                    not_after: None,
                },
            )],
            record: Signed::sign(
                &self.node,
                RECORD_LABEL,
                &Record {
                    mesh: "demo".into(),
                    service: service.into(),
                    workload_key: *workload.public_key(),
                    endpoint: live.then(|| "127.0.0.12:15006".parse().unwrap()),
                    metadata: Default::default(),
                    issued_at: NOW,
                    not_after: NOW + 60_000,
                },
            ),
        }
        .encode()
    }

    /// The root's revocations of `ids`.
    pub fn revoking(&self, ids: &[themis_core::PeerId]) -> themis_trust::Revocations {
        use themis_trust::{Revocation, Signed, REVOCATION_LABEL};
        let mut revoked = themis_trust::Revocations::new();
        for id in ids {
            let signed = Signed::sign(
                &self.root_key,
                REVOCATION_LABEL,
                &Revocation {
                    mesh: "demo".into(),
                    id: id.0,
                    issued_at: NOW,
                    reason: String::new(),
                },
            );
            revoked.add(&self.root, &signed.encode()).unwrap();
        }
        revoked
    }

    /// A verifier at [`NOW`] (plus a second) with `revoked` in force.
    pub fn verifier<'a>(
        &'a self,
        revoked: &'a themis_trust::Revocations,
    ) -> themis_trust::Verifier<'a> {
        themis_trust::Verifier {
            root: &self.root,
            now_ms: NOW + 1_000,
            revoked,
        }
    }
}
