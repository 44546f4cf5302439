//! The node's endorsement of its workloads: a record signed with the node key, and
//! only for a service the mesh root granted this node (the grant chain travels with
//! the record, so anyone verifies it offline). A revoked workload gets no new
//! record; a deregistered one gets a tombstone that is held only as long as the
//! record it withdraws could still be accepted somewhere.
//!
//! No DHT and no clock: the caller passes `issued_at` and `now`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use themis_core::Identity;
use themis_trust::{
    InstanceValue, Metadata, Record, Signed, Subject, TrustError, RECORD_LABEL, SUBJECT_LABEL,
};

use super::RegistryError;
use crate::names::{ServiceName, WorkloadName};
use crate::trust::MeshTrust;

/// Signs instance records for local workloads, within the node's grants.
pub(super) struct Endorser {
    node: Arc<Identity>,
    trust: Arc<MeshTrust>,
    record_ttl: Duration,
    /// Endorse only subjects a binding allows.
    require_binding: bool,
}

impl Endorser {
    /// Endorses as `node` under `trust`'s grants (and, with `require_binding`, its
    /// log's bindings), records valid for `record_ttl`.
    pub(super) fn new(
        node: Arc<Identity>,
        trust: Arc<MeshTrust>,
        record_ttl: Duration,
        require_binding: bool,
    ) -> Self {
        Endorser {
            node,
            trust,
            record_ttl,
            require_binding,
        }
    }

    /// The subject a record's labels name ([`SUBJECT_LABEL`]), checked against the
    /// log's bindings for `service` at `now_ms`: a node endorses a pod only as what the
    /// platform says it runs as, whatever the pod claims. Without the label: refused
    /// when bindings are required, else nothing to check.
    pub(super) fn check_subject(
        &self,
        service: &ServiceName,
        metadata: &Metadata,
        now_ms: u64,
    ) -> Result<(), RegistryError> {
        let Some(uri) = metadata.get(SUBJECT_LABEL) else {
            return match self.require_binding {
                true => Err(RegistryError::NoSubject {
                    service: service.clone(),
                }),
                false => Ok(()),
            };
        };
        let subject = Subject::from_uri(uri, self.node.mesh().as_str())
            .map_err(|_| RegistryError::BadSubject(uri.clone()))?;
        let bindings = self.trust.log().bindings();
        match bindings.check(service.as_str(), &subject, now_ms) {
            Ok(_) => Ok(()),
            Err(_) => {
                let bound = bindings.bound(service.as_str(), now_ms);
                Err(RegistryError::NotBound {
                    service: service.clone(),
                    subject: uri.clone(),
                    bound: match bound.is_empty() {
                        true => "none".into(),
                        false => bound.join("; "),
                    },
                })
            }
        }
    }

    /// The services this node holds grants for (re-reading the grants directory).
    pub(super) fn granted(&self) -> Vec<String> {
        self.trust.reload_grants(&self.node)
    }

    /// The grant chain this node holds for `service` (re-reading the grants directory
    /// if it holds none yet): [`RegistryError::NotGranted`] otherwise.
    pub(super) fn check_granted(
        &self,
        service: &ServiceName,
    ) -> Result<Vec<Signed>, RegistryError> {
        if let Some(chain) = self.trust.grant_chain(service.as_str()) {
            return Ok(chain);
        }
        // The operator may have added a grant file since the last look.
        let granted = self.granted();
        self.trust
            .grant_chain(service.as_str())
            .ok_or_else(|| RegistryError::NotGranted {
                service: service.clone(),
                granted: if granted.is_empty() {
                    "none".into()
                } else {
                    granted.join(", ")
                },
            })
    }

    /// [`RegistryError::Revoked`] when the root revoked `workload`'s key `identity`.
    pub(super) fn check_not_revoked(
        &self,
        workload: &WorkloadName,
        identity: &Identity,
    ) -> Result<(), RegistryError> {
        if self.trust.is_revoked(&identity.id()) {
            return Err(RegistryError::Revoked(workload.clone()));
        }
        Ok(())
    }

    /// The DHT value for `identity` as an instance of `service` (a tombstone without
    /// `endpoint`): the record signed by this node, issued at `issued_at` (Unix ms),
    /// with the grant chain for the service.
    pub(super) fn record(
        &self,
        service: &ServiceName,
        identity: &Identity,
        endpoint: Option<SocketAddr>,
        metadata: Metadata,
        issued_at: u64,
    ) -> Result<Vec<u8>, RegistryError> {
        let chain = self.check_granted(service)?;
        themis_trust::check_metadata(&metadata)?;
        // A tombstone withdraws: never refused, even once the binding is gone.
        if endpoint.is_some() {
            self.check_subject(service, &metadata, issued_at)?;
        }
        // What every replica holder checks of the endpoint, checked here first, so
        // that the caller hears why (with one-hop routing: not at this node's
        // address) rather than that no replica took the record.
        self.trust
            .check_endpoint(self.node.public_key(), endpoint)?;
        let record = Record {
            mesh: identity.mesh().as_str().to_owned(),
            service: service.as_str().to_owned(),
            workload_key: *identity.public_key(),
            endpoint,
            metadata,
            issued_at,
            not_after: issued_at.saturating_add(self.record_ttl_ms()),
        };
        let value = InstanceValue {
            grants: chain,
            record: Signed::sign(&self.node, RECORD_LABEL, &record),
        }
        .encode();
        if value.len() > themis_dht::message::MAX_VALUE_LEN {
            return Err(TrustError::TooLarge.into());
        }
        Ok(value)
    }

    /// How long a record lives, ms.
    pub(super) fn record_ttl_ms(&self) -> u64 {
        u64::try_from(self.record_ttl.as_millis()).unwrap_or(u64::MAX)
    }

    /// How long, from `now_ms`, to hold the tombstone of a record issued at
    /// `serial`: until that record has expired everywhere (its `not_after` plus the
    /// clock-skew allowance), so the tombstone outlives it and takes its endorser's
    /// slot no longer than needed; at least a millisecond.
    pub(super) fn tombstone_hold(&self, serial: u64, now_ms: u64) -> Duration {
        let hold = (serial + self.record_ttl_ms() + themis_trust::MAX_CLOCK_SKEW_MS)
            .saturating_sub(now_ms);
        Duration::from_millis(hold.max(1))
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::metrics::Metrics;
    use crate::trust::unix_millis;
    use ring::rand::SystemRandom;
    use themis_cli::operator::{self, MeshDir};
    use themis_trust::PemKind;

    const TTL: Duration = Duration::from_secs(60);

    /// A mesh made by the operator's own commands in a temporary directory, and one
    /// admitted node holding grants for some services.
    pub(in crate::registry) struct Mesh {
        pub dir: tempfile::TempDir,
        pub root: MeshDir,
        pub node: Arc<Identity>,
        pub trust: Arc<MeshTrust>,
        pub metrics: Arc<Metrics>,
    }

    impl Mesh {
        pub fn new(granted: &[&str]) -> Mesh {
            let dir = tempfile::tempdir().unwrap();
            operator::create_mesh("test", &dir.path().join("mesh")).unwrap();
            let root = MeshDir::open(&dir.path().join("mesh")).unwrap();
            let node_dir = dir.path().join("node");
            operator::admit_node(&root, &node_dir, None, false).unwrap();
            for service in granted {
                let service = ServiceName::new(service).unwrap();
                operator::grant_to_node(&root, &service, &node_dir, None).unwrap();
            }
            let node = crate::keystore::load(&node_dir.join("node.key"), &root.root.mesh).unwrap();
            let metrics = Arc::new(Metrics::new());
            let trust =
                MeshTrust::load(&node_dir, root.root.clone(), &node, metrics.clone()).unwrap();
            Mesh {
                dir,
                root,
                node: Arc::new(node),
                trust: Arc::new(trust),
                metrics,
            }
        }

        pub fn node_dir(&self) -> std::path::PathBuf {
            self.dir.path().join("node")
        }

        pub fn endorser(&self) -> Endorser {
            Endorser::new(self.node.clone(), self.trust.clone(), TTL, false)
        }

        pub fn workload(&self) -> Identity {
            Identity::generate(self.root.root.mesh.clone(), &SystemRandom::new()).unwrap()
        }

        /// The value of `workload` as an instance of `service` at `endpoint`, signed
        /// `ms_ago` milliseconds ago.
        pub fn record(
            &self,
            service: &str,
            workload: &Identity,
            endpoint: Option<SocketAddr>,
            ms_ago: u64,
        ) -> Vec<u8> {
            let service = ServiceName::new(service).unwrap();
            let issued_at = unix_millis() - ms_ago;
            self.endorser()
                .record(&service, workload, endpoint, Metadata::new(), issued_at)
                .unwrap()
        }

        /// This node's agent takes the operator's log (as `themis log publish`).
        pub fn publish_log(&self) {
            let log = self.root.log().unwrap();
            let held = self.trust.log().size();
            let checkpoint = log.checkpoint().unwrap().encoded().to_vec();
            let leaves = log.leaves(held, usize::MAX).to_vec();
            self.trust.log().offer(&checkpoint, &leaves).unwrap();
        }

        /// The root revokes `identity`, and this node learns it.
        pub fn revoke(&self, identity: &Identity) {
            let (pem, _) =
                operator::revoke(&self.root, &[identity.printable_id()], "test").unwrap();
            for block in themis_trust::pem_blocks(&pem) {
                let (kind, signed) = block.unwrap();
                assert_eq!(kind, PemKind::Revocation);
                assert!(self.trust.add_revocation(&signed.encode()).unwrap());
            }
        }

        pub fn judge(&self, service: &str, values: &[Vec<u8>]) -> super::super::verdicts::Judged {
            let service = ServiceName::new(service).unwrap();
            super::super::verdicts::judge(
                values,
                &service,
                &self.root.root.mesh,
                &self.trust,
                &self.metrics,
            )
        }
    }

    fn service(name: &str) -> ServiceName {
        ServiceName::new(name).unwrap()
    }

    #[test]
    fn a_service_without_a_grant_is_refused_saying_what_is_granted() {
        let mesh = Mesh::new(&["db", "web"]);
        let endorser = mesh.endorser();
        assert!(endorser.check_granted(&service("web")).is_ok());
        let error = endorser.check_granted(&service("mail")).unwrap_err();
        assert!(matches!(error, RegistryError::NotGranted { .. }));
        let text = error.to_string();
        assert!(text.contains("this node may not serve mail"), "{text}");
        assert!(text.ends_with("services granted here: db, web)"), "{text}");
        let workload = mesh.workload();
        let refused = endorser.record(&service("mail"), &workload, None, Metadata::new(), 1);
        assert!(matches!(refused, Err(RegistryError::NotGranted { .. })));

        let none = Mesh::new(&[]);
        let text = none.endorser().check_granted(&service("web")).unwrap_err();
        assert!(text.to_string().ends_with("services granted here: none)"));
    }

    #[test]
    fn with_bindings_required_a_grant_endorses_only_the_subjects_the_root_bound() {
        let mesh = Mesh::new(&["payments"]);
        let payments = service("payments");
        let endorser = Endorser::new(mesh.node.clone(), mesh.trust.clone(), TTL, true);
        let workload = mesh.workload();
        let at = Some(SocketAddr::from(([10, 0, 0, 1], 15006)));
        let as_subject = |uri: &str| Metadata::from([(SUBJECT_LABEL.to_owned(), uri.to_owned())]);
        let team_a = as_subject("spiffe://test/ns/team-a/sa/payments");
        let endorse = |metadata: &Metadata| {
            endorser.record(&payments, &workload, at, metadata.clone(), unix_millis())
        };
        // The grant alone: no subject, or a subject no binding names, is refused.
        assert!(matches!(
            endorse(&Metadata::new()),
            Err(RegistryError::NoSubject { .. })
        ));
        let refused = endorse(&team_a).unwrap_err();
        assert!(
            matches!(refused, RegistryError::NotBound { .. }),
            "{refused}"
        );
        assert!(
            refused.to_string().ends_with("bound now: none)"),
            "{refused}"
        );

        let accounts = ["payments".to_owned()];
        operator::bind_service(&mesh.root, &payments, "team-a", &accounts, false).unwrap();
        mesh.publish_log();
        assert!(endorse(&team_a).is_ok());
        for (uri, why) in [
            ("spiffe://test/ns/team-b/sa/payments", "another namespace"),
            (
                "spiffe://test/ns/team-a/sa/default",
                "another ServiceAccount of the namespace",
            ),
        ] {
            let refused = endorse(&as_subject(uri)).unwrap_err();
            assert!(
                matches!(refused, RegistryError::NotBound { .. }),
                "{why}: {refused}"
            );
            assert!(
                refused
                    .to_string()
                    .ends_with("bound now: team-a/{payments})"),
                "{refused}"
            );
        }
        for uri in ["spiffe://other/ns/team-a/sa/payments", "team-a/payments"] {
            let refused = endorse(&as_subject(uri)).unwrap_err();
            assert!(
                matches!(refused, RegistryError::BadSubject(_)),
                "{uri}: {refused}"
            );
        }

        // Withdrawn: renewals are refused, and the tombstone that withdraws the
        // instance is still signed.
        operator::bind_service(&mesh.root, &payments, "team-a", &[], true).unwrap();
        mesh.publish_log();
        assert!(matches!(
            endorse(&team_a),
            Err(RegistryError::NotBound { .. })
        ));
        let tombstone = endorser.record(&payments, &workload, None, team_a.clone(), unix_millis());
        assert!(tombstone.is_ok());
        // Without --require-binding a record that names no subject needs no binding,
        // and one that names a subject is still checked.
        let lax = mesh.endorser();
        assert!(lax
            .record(&payments, &workload, at, Metadata::new(), unix_millis())
            .is_ok());
        let named = lax.record(&payments, &workload, at, team_a, unix_millis());
        assert!(matches!(named, Err(RegistryError::NotBound { .. })));
    }

    #[test]
    fn a_grant_written_after_start_is_picked_up_at_the_next_check() {
        let mesh = Mesh::new(&[]);
        let endorser = mesh.endorser();
        assert!(endorser.check_granted(&service("web")).is_err());
        operator::grant_to_node(&mesh.root, &service("web"), &mesh.node_dir(), None).unwrap();
        assert_eq!(endorser.check_granted(&service("web")).unwrap().len(), 1);
        assert_eq!(endorser.granted(), ["web"]);
    }

    #[test]
    fn a_revoked_workload_is_refused_and_others_are_not() {
        let mesh = Mesh::new(&["web"]);
        let endorser = mesh.endorser();
        let (revoked, kept) = (mesh.workload(), mesh.workload());
        let name = WorkloadName::new("web-1").unwrap();
        assert!(endorser.check_not_revoked(&name, &revoked).is_ok());
        mesh.revoke(&revoked);
        let error = endorser.check_not_revoked(&name, &revoked).unwrap_err();
        assert!(matches!(error, RegistryError::Revoked(ref w) if *w == name));
        assert!(error.to_string().starts_with("workload web-1 is revoked"));
        assert!(endorser.check_not_revoked(&name, &kept).is_ok());
    }

    #[test]
    fn a_record_carries_the_grant_and_verifies_for_its_service_only() {
        let mesh = Mesh::new(&["web"]);
        let workload = mesh.workload();
        let at = SocketAddr::from(([10, 0, 0, 1], 8080));
        let value = mesh.record("web", &workload, Some(at), 0);
        let instance = mesh
            .trust
            .verify(|v| v.instance(&value, "web"))
            .expect("the node's own record verifies");
        assert_eq!(instance.endpoint, Some(at));
        assert_eq!(instance.id, workload.id());
        assert_eq!(instance.endorser, *mesh.node.public_key());
        assert_eq!(instance.not_after - instance.issued_at, 60_000);
        assert!(mesh.trust.verify(|v| v.instance(&value, "db")).is_err());
    }

    #[test]
    fn oversized_metadata_is_refused() {
        let mesh = Mesh::new(&["web"]);
        let workload = mesh.workload();
        let mut metadata = Metadata::new();
        for i in 0..1000 {
            metadata.insert(format!("key-{i}"), "x".repeat(100));
        }
        let refused = mesh
            .endorser()
            .record(&service("web"), &workload, None, metadata, 1);
        assert!(matches!(refused, Err(RegistryError::Record(_))));
    }

    #[test]
    fn a_tombstone_is_held_until_the_record_has_expired_everywhere() {
        let mesh = Mesh::new(&[]);
        let endorser = mesh.endorser();
        let skew = themis_trust::MAX_CLOCK_SKEW_MS;
        let serial = 1_000_000;
        assert_eq!(
            endorser.tombstone_hold(serial, serial),
            Duration::from_millis(60_000 + skew)
        );
        assert_eq!(
            endorser.tombstone_hold(serial, serial + 10_000),
            Duration::from_millis(50_000 + skew)
        );
        // Long past: held a millisecond, not forever and not zero.
        assert_eq!(
            endorser.tombstone_hold(serial, u64::MAX),
            Duration::from_millis(1)
        );
    }
}
