//! What the values stored for a service say, once checked: every value gets a
//! verdict (`trusted`, `superseded`, `withdrawn` or `refused`, with why), and the
//! newest trusted record of each instance, per endorser, becomes a live instance.
//! `resolve` answers with the instances, `explain` with the verdicts and the trust
//! log's leaves behind them.
//!
//! No I/O: the caller brings the values a DHT resolve returned.

use themis_contracts::api::LogLeaf;
use themis_core::{MeshName, PeerId};
use themis_trust::{live, Instance, InstanceValue, Record};
use tracing::warn;

use super::{InstanceView, Verdict};
use crate::metrics::Metrics;
use crate::names::ServiceName;
use crate::trust::MeshTrust;

/// The verdicts on a resolve's values, and the live instances among them.
pub(super) struct Judged {
    /// The live, endorsed instances (newest record per instance and endorser).
    pub instances: Vec<InstanceView>,
    /// One per value, in the order given.
    pub verdicts: Vec<Verdict>,
}

impl Judged {
    /// How many values were refused.
    pub fn refused(&self) -> usize {
        self.verdicts
            .iter()
            .filter(|v| v.verdict == "refused")
            .count()
    }
}

/// Verifies every value stored for `service` against the mesh root and the
/// revocations (`trust`), and keeps the newest record of each instance; refusals are
/// counted in `metrics`.
pub(super) fn judge(
    values: &[Vec<u8>],
    service: &ServiceName,
    mesh: &MeshName,
    trust: &MeshTrust,
    metrics: &Metrics,
) -> Judged {
    let printable = |key: &[u8; 32]| PeerId::derive(key, mesh.as_str()).printable(mesh);
    let mut verdicts = Vec::new();
    let mut verified: Vec<(Instance, &Vec<u8>)> = Vec::new();
    for value in values {
        // What the value claims, read without trusting it, for the explanation.
        let claimed = InstanceValue::decode(value).ok().and_then(|v| {
            let record: Record = postcard::from_bytes(&v.record.body).ok()?;
            Some((v.record.signer, record))
        });
        let mut verdict = Verdict {
            id: claimed.as_ref().map(|(_, r)| printable(&r.workload_key)),
            endorser: claimed.as_ref().map(|(signer, _)| printable(signer)),
            endpoint: claimed.as_ref().and_then(|(_, r)| r.endpoint),
            issued_at: claimed.as_ref().map(|(_, r)| r.issued_at),
            verdict: "trusted".into(),
            reason: "endorsed by a node the mesh root granted the service".into(),
            log: Vec::new(),
        };
        let checked = InstanceValue::decode(value)
            .and_then(|decoded| trust.instance(&decoded, service.as_str()));
        match checked {
            Ok(instance) => verified.push((instance, value)),
            Err(error) => {
                warn!(%service, %error, "refused a stored record");
                metrics.record_refused(error.reason());
                verdict.verdict = "refused".into();
                verdict.reason = error.to_string();
            }
        }
        verdicts.push(verdict);
    }
    let newest = live(verified.iter().map(|(i, _)| i.clone()));
    for verdict in verdicts.iter_mut().filter(|v| v.verdict == "trusted") {
        // Records compete only with records of the same endorser (see `live`).
        let same = |i: &Instance| {
            Some(i.id.printable(mesh)) == verdict.id
                && Some(printable(&i.endorser)) == verdict.endorser
        };
        let current = newest.iter().find(|i| same(i));
        match (current, verdict.endpoint) {
            (Some(i), Some(_)) if Some(i.issued_at) == verdict.issued_at => {}
            (None, _)
                if verified
                    .iter()
                    .any(|(i, _)| same(i) && i.endpoint.is_none()) =>
            {
                verdict.verdict = "withdrawn".into();
                verdict.reason = "the instance was deregistered (a newer tombstone)".into();
            }
            _ => {
                verdict.verdict = "superseded".into();
                verdict.reason = "a newer record of the same instance exists".into();
            }
        }
    }
    let instances = newest
        .into_iter()
        .filter_map(|i| {
            let value = verified
                .iter()
                .find(|(v, _)| (v.id, v.endorser, v.issued_at) == (i.id, i.endorser, i.issued_at))?
                .1;
            Some(InstanceView {
                id: i.id.printable(mesh),
                public_key: hex::encode(i.public_key),
                endpoint: i.endpoint?,
                metadata: i.metadata,
                endorser: printable(&i.endorser),
                not_after: i.not_after,
                record: hex::encode(value),
            })
        })
        .collect();
    Judged {
        instances,
        verdicts,
    }
}

/// The trust log's leaves behind `verdict` on a value of `service`: the endorser's
/// admission, the grants of the service a chain can go through (the endorser's, or
/// an authority's that may pass it on), and revocations of the keys involved.
pub(super) fn leaves_behind(
    verdict: &Verdict,
    service: &ServiceName,
    leaves: &[LogLeaf],
) -> Vec<LogLeaf> {
    let endorser = verdict.endorser.as_deref();
    let is = |who: Option<&str>, leaf: &LogLeaf| who == Some(leaf.subject.as_str());
    leaves
        .iter()
        .filter(|leaf| match leaf.kind.as_str() {
            "admission" => is(endorser, leaf),
            "grant" => {
                leaf.service.as_deref() == Some(service.as_str())
                    && (is(endorser, leaf) || leaf.delegate == Some(true))
            }
            _ => is(endorser, leaf) || is(verdict.id.as_deref(), leaf),
        })
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::endorser::tests::Mesh;
    use super::*;
    use std::net::SocketAddr;

    fn endpoint(port: u16) -> SocketAddr {
        SocketAddr::from(([10, 0, 0, 1], port))
    }

    #[test]
    fn a_granted_nodes_record_is_a_live_instance() {
        let mesh = Mesh::new(&["web"]);
        let workload = mesh.workload();
        let value = mesh.record("web", &workload, Some(endpoint(80)), 1_000);
        let judged = mesh.judge("web", std::slice::from_ref(&value));
        assert_eq!(judged.refused(), 0);
        assert_eq!(judged.verdicts[0].verdict, "trusted");
        assert_eq!(judged.instances.len(), 1);
        let instance = &judged.instances[0];
        assert_eq!(instance.id, workload.printable_id());
        assert_eq!(instance.endpoint, endpoint(80));
        assert_eq!(instance.endorser, mesh.node.printable_id());
        assert_eq!(instance.record, hex::encode(&value));
    }

    #[test]
    fn garbage_and_records_for_another_service_are_refused() {
        let mesh = Mesh::new(&["web", "db"]);
        let workload = mesh.workload();
        let for_db = mesh.record("db", &workload, Some(endpoint(5432)), 1_000);
        let judged = mesh.judge("web", &[b"not a record".to_vec(), for_db]);
        assert!(judged.instances.is_empty());
        assert_eq!(judged.refused(), 2);
        assert!(judged.verdicts.iter().all(|v| v.verdict == "refused"));
        // Undecodable: nothing claimed. Decodable: what it claims, for the explanation.
        assert_eq!(judged.verdicts[0].id, None);
        assert_eq!(judged.verdicts[1].id, Some(workload.printable_id()));
    }

    #[test]
    fn a_revoked_workloads_record_is_refused() {
        let mesh = Mesh::new(&["web"]);
        let workload = mesh.workload();
        let value = mesh.record("web", &workload, Some(endpoint(80)), 1_000);
        mesh.revoke(&workload);
        let judged = mesh.judge("web", &[value]);
        assert!(judged.instances.is_empty());
        assert_eq!(judged.verdicts[0].verdict, "refused");
    }

    #[test]
    fn the_newest_record_wins_and_a_newer_tombstone_withdraws() {
        let mesh = Mesh::new(&["web"]);
        let workload = mesh.workload();
        let old = mesh.record("web", &workload, Some(endpoint(80)), 2_000);
        let new = mesh.record("web", &workload, Some(endpoint(81)), 1_000);
        let judged = mesh.judge("web", &[old.clone(), new.clone()]);
        let verdicts: Vec<&str> = judged.verdicts.iter().map(|v| v.verdict.as_str()).collect();
        assert_eq!(verdicts, ["superseded", "trusted"]);
        assert_eq!(judged.instances.len(), 1);
        assert_eq!(judged.instances[0].endpoint, endpoint(81));

        let tombstone = mesh.record("web", &workload, None, 0);
        let judged = mesh.judge("web", &[old, new, tombstone]);
        assert!(judged.instances.is_empty());
        let verdicts: Vec<&str> = judged.verdicts.iter().map(|v| v.verdict.as_str()).collect();
        assert_eq!(verdicts, ["withdrawn", "withdrawn", "withdrawn"]);
    }

    #[test]
    fn the_leaves_behind_a_verdict_are_its_endorsers_and_its_services() {
        let leaf = |kind: &str, subject: &str, service: Option<&str>, delegate| LogLeaf {
            index: 0,
            kind: kind.into(),
            subject: subject.into(),
            service: service.map(Into::into),
            delegate,
            reason: None,
            range: None,
            issued_at: 0,
            leaf: String::new(),
            proof: String::new(),
        };
        let verdict = Verdict {
            id: Some("workload".into()),
            endorser: Some("node".into()),
            endpoint: None,
            issued_at: None,
            verdict: "trusted".into(),
            reason: String::new(),
            log: Vec::new(),
        };
        let leaves = [
            leaf("admission", "node", None, None),
            leaf("admission", "other-node", None, None),
            leaf("grant", "node", Some("web"), Some(false)),
            leaf("grant", "node", Some("db"), Some(false)),
            leaf("grant", "authority", Some("web"), Some(true)),
            leaf("grant", "other-node", Some("web"), Some(false)),
            leaf("revocation", "workload", None, None),
            leaf("revocation", "someone-else", None, None),
        ];
        let service = ServiceName::new("web").unwrap();
        let behind = leaves_behind(&verdict, &service, &leaves);
        let picked: Vec<(&str, &str)> = behind
            .iter()
            .map(|l| (l.kind.as_str(), l.subject.as_str()))
            .collect();
        assert_eq!(
            picked,
            [
                ("admission", "node"),
                ("grant", "node"),
                ("grant", "authority"),
                ("revocation", "workload"),
            ]
        );
    }
}
