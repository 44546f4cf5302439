//! The TLS binding's decision on a peer (docs/PROTOCOL.md §8.3), past its certificate:
//! a runtime's TLS validator hands over the peer's DER certificate (and, on the
//! caller's side, the SNI it sent); this says who the peer is — its id, the service its
//! endorsement proves, its principal — or why it is refused, with the reason both
//! runtimes count. The callee's policy then decides on what this proved
//! ([`Proven::established`]), as it does on the paper's channel.

use themis_core::PeerId;
use themis_trust::{Grant, InstanceValue, Record, Verifier};

use crate::config::Policy;
use crate::conn::Close;
use crate::policy::{endorsement_lists, Denial};
use crate::reason::Reason;

/// A peer whose certificate, endorsement and names held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proven {
    pub id: PeerId,
    /// The service its endorsement proves (`None`: a workload of no service).
    pub service: Option<String>,
    /// Its URI SAN, which Envoy's RBAC and access logs read: the principal the
    /// endorsement proves ([`themis_x509::principal`]).
    pub principal: String,
    /// Unix ms: when its certificate's delegation ends.
    pub not_after_ms: u64,
    /// Unix ms: when the first of what the proof rests on ends (the delegation, the
    /// endorsement's record, a grant of its chain): past it, it must be checked anew.
    pub valid_until_ms: u64,
}

/// Checks a peer's certificate `der` under `verifier` (the mesh root, now, the
/// revocations in force). `sni`: on the caller's side, the name it sent, which names
/// the one id it may reach; `None` on the callee's side.
pub fn check(der: &[u8], sni: Option<&str>, verifier: &Verifier<'_>) -> Result<Proven, Close> {
    let mesh = &verifier.root.mesh;
    let peer = themis_x509::verify(der, mesh, verifier.now_ms)
        .map_err(|e| Close::new(Reason::Certificate, e.to_string()))?;
    if verifier.revoked.contains(&peer.id) {
        return Err(Close::new(Reason::Revoked, "the peer's id is revoked"));
    }
    held_to_sni(&peer.id, sni, verifier)?;
    let (service, endorsed_until) = match peer.endorsement.as_slice() {
        [] => (None, u64::MAX),
        endorsement => {
            let claimed = claimed_service(endorsement)
                .ok_or_else(|| Close::new(Reason::Principal, "the endorsement does not decode"))?;
            if !endorsement_lists(verifier, endorsement, &claimed, &peer.id) {
                return Err(Close::new(
                    Reason::Principal,
                    format!("the endorsement does not prove the peer an instance of {claimed}"),
                ));
            }
            (Some(claimed), endorsement_ends(endorsement))
        }
    };
    let principal = themis_x509::principal(mesh, &peer.id, service.as_deref());
    if peer.principal != principal {
        return Err(Close::new(
            Reason::Principal,
            format!(
                "the certificate names {:?}; its endorsement proves {principal:?}",
                peer.principal
            ),
        ));
    }
    Ok(Proven {
        id: peer.id,
        service,
        principal,
        not_after_ms: peer.not_after_ms,
        valid_until_ms: peer.not_after_ms.min(endorsed_until),
    })
}

/// On the caller's side (`sni` given), the peer must be the one id its SNI names.
fn held_to_sni(peer: &PeerId, sni: Option<&str>, verifier: &Verifier<'_>) -> Result<(), Close> {
    let Some(sni) = sni else {
        return Ok(());
    };
    let named = themis_x509::id_of_sni_name(sni);
    match named.as_ref().map(|(m, id)| (m, id)) == Some((&verifier.root.mesh, peer)) {
        true => Ok(()),
        false => Err(Close::new(
            Reason::WrongPeer,
            format!("the peer proved another id than the SNI {sni:?} names"),
        )),
    }
}

/// When an endorsement that verified ends: its record's `not_after`, or an earlier
/// grant's of its chain.
fn endorsement_ends(endorsement: &[u8]) -> u64 {
    let Ok(value) = InstanceValue::decode(endorsement) else {
        return 0;
    };
    let record = postcard::from_bytes::<Record>(&value.record.body).map_or(0, |r| r.not_after);
    value
        .grants
        .iter()
        .filter_map(|g| postcard::from_bytes::<Grant>(&g.body).ok()?.not_after)
        .fold(record, u64::min)
}

/// Peers proven on this worker's recent handshakes, by the SHA-256 of their
/// certificate. A pool's next connection to (or from) the same peer presents the same
/// certificate: its signatures (the self-signature, the delegation, the endorsement
/// and its grants) are not checked again while nothing they rest on changed. An entry
/// counts only under the revocations it was proven with (their generation: a new
/// revocation empties it, so a revoked id or grantee is checked at once) and until
/// [`Proven::valid_until_ms`]; the SNI is held to on every handshake, and the policy
/// decides after ([`admit`]). Refusals are not kept: each is checked whole.
#[derive(Debug)]
pub struct ProvenCache {
    entries: std::collections::HashMap<[u8; 32], Proven>,
    generation: u64,
    capacity: usize,
}

impl ProvenCache {
    /// A cache of at most `capacity` certificates (past it, it starts again).
    pub fn new(capacity: usize) -> ProvenCache {
        ProvenCache {
            entries: Default::default(),
            generation: 0,
            capacity,
        }
    }

    /// [`check`], from the cache when `der` was proven under the revocations of
    /// `generation` and is still within its proof's life.
    pub fn check(
        &mut self,
        der: &[u8],
        sni: Option<&str>,
        verifier: &Verifier<'_>,
        generation: u64,
    ) -> Result<Proven, Close> {
        if generation != self.generation {
            self.entries.clear();
            self.generation = generation;
        }
        let key: [u8; 32] = ring::digest::digest(&ring::digest::SHA256, der)
            .as_ref()
            .try_into()
            .expect("SHA-256 is 32 bytes");
        if let Some(proven) = self.entries.get(&key) {
            if verifier.now_ms < proven.valid_until_ms {
                held_to_sni(&proven.id, sni, verifier)?;
                return Ok(proven.clone());
            }
        }
        let proven = check(der, sni, verifier)?;
        if self.entries.len() >= self.capacity {
            self.entries.clear();
        }
        self.entries.insert(key, proven.clone());
        Ok(proven)
    }

    /// How many certificates it holds.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// The callee's policy on a caller its certificate proved: the service counts as
/// its endorsement proved it (no lookup: the certificate carries the proof), `allow
/// id` rules match the id. No policy: nobody (`refused.no_policy`).
pub fn admit(policy: Option<&Policy>, caller: &Proven) -> Result<(), Close> {
    let denial = match policy {
        None => Denial::NoPolicy,
        Some(policy) if policy.allows(&caller.id, caller.service.as_deref()) => return Ok(()),
        Some(_) => Denial::NotAllowed,
    };
    Err(Close::new(
        denial.reason(),
        format!("{}: {}", caller.principal, denial.explain()),
    ))
}

/// The service an endorsement's record names, unverified: what to verify it for.
fn claimed_service(endorsement: &[u8]) -> Option<String> {
    let value = InstanceValue::decode(endorsement).ok()?;
    let record: Record = postcard::from_bytes(&value.record.body).ok()?;
    Some(record.service)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{Trusted, NOW};
    use ring::rand::SystemRandom;
    use themis_core::Identity;
    use themis_trust::Revocations;
    use themis_x509::{delegate, issue, principal, sni_name, Proof, TlsKey, PROOF_VERSION};

    const HOUR: u64 = 3_600_000;

    /// `workload`'s certificate with `endorsement`, naming `principal`.
    fn certificate(workload: &Identity, endorsement: Vec<u8>, principal: &str) -> Vec<u8> {
        let rng = SystemRandom::new();
        let key = TlsKey::generate(&rng).unwrap();
        let proof = Proof {
            version: PROOF_VERSION,
            mesh: "demo".into(),
            workload_key: *workload.public_key(),
            delegation: delegate(workload, &key, NOW, HOUR),
            endorsement,
        };
        issue(&key, &proof, principal, &rng).unwrap()
    }

    #[test]
    fn a_peer_is_what_its_certificate_and_endorsement_prove() {
        let mesh = Trusted::new();
        let revoked = Revocations::new();
        let verifier = mesh.verifier(&revoked);
        let check_ = mesh.workload();
        let endorsed = mesh.endorsement(&check_, "check", true);
        let svc = principal(&mesh.root.mesh, &check_.id(), Some("check"));
        let der = certificate(&check_, endorsed.clone(), &svc);
        let sni = sni_name(&check_.id(), &mesh.root.mesh);
        let proven = check(&der, Some(&sni), &verifier).unwrap();
        assert_eq!(proven.id, check_.id());
        assert_eq!(proven.service.as_deref(), Some("check"));
        assert_eq!(proven.principal, "spiffe://demo/svc/check");
        // A caller of no service: named by its id.
        let caller = mesh.workload();
        let by_id = principal(&mesh.root.mesh, &caller.id(), None);
        let proven = check(&certificate(&caller, Vec::new(), &by_id), None, &verifier).unwrap();
        assert_eq!(proven.service, None);
        assert!(proven.principal.starts_with("spiffe://demo/id/demo1"));

        let refused = |der: &[u8], sni: Option<&str>, verifier: &Verifier<'_>| {
            check(der, sni, verifier).unwrap_err().reason
        };
        // Reached under another id's SNI (a pool of another peer, a misdirected pick).
        let other = sni_name(&caller.id(), &mesh.root.mesh);
        assert_eq!(refused(&der, Some(&other), &verifier), Reason::WrongPeer);
        assert_eq!(
            refused(&der, Some("check.demo"), &verifier),
            Reason::WrongPeer
        );
        // A principal its endorsement does not prove: another service's, or the id's
        // form while it is endorsed, or a service with no endorsement at all.
        for lie in [
            "spiffe://demo/svc/payments".to_owned(),
            by_id.clone(),
            "spiffe://other/svc/check".to_owned(),
        ] {
            let der = certificate(&check_, endorsed.clone(), &lie);
            assert_eq!(refused(&der, None, &verifier), Reason::Principal, "{lie}");
        }
        let bare = certificate(&check_, Vec::new(), &svc);
        assert_eq!(refused(&bare, None, &verifier), Reason::Principal);
        // Another workload's endorsement, a tombstone, a forged one (not the root's
        // grant), garbage: each proves nothing of this peer.
        let others = mesh.endorsement(&caller, "check", true);
        let tombstone = mesh.endorsement(&check_, "check", false);
        let forged = Trusted::new().endorsement(&check_, "check", true);
        for endorsement in [others, tombstone, forged, b"garbage".to_vec()] {
            let der = certificate(&check_, endorsement, &svc);
            assert_eq!(refused(&der, None, &verifier), Reason::Principal);
        }
        // Not a Themis certificate at all.
        assert_eq!(refused(b"\x30\x00", None, &verifier), Reason::Certificate);
        // Revoked: the id, or the node its endorsement rests on.
        for (key, expected) in [(&check_, Reason::Revoked), (&mesh.node, Reason::Principal)] {
            let revoked = mesh.revoking(&[key.id()]);
            assert_eq!(refused(&der, None, &mesh.verifier(&revoked)), expected);
        }
    }

    #[test]
    fn a_cached_proof_holds_only_under_its_revocations_its_life_and_the_sni() {
        let mesh = Trusted::new();
        let none = Revocations::new();
        let check_ = mesh.workload();
        let svc = principal(&mesh.root.mesh, &check_.id(), Some("check"));
        let der = certificate(&check_, mesh.endorsement(&check_, "check", true), &svc);
        let sni = sni_name(&check_.id(), &mesh.root.mesh);
        let mut cache = ProvenCache::new(2);
        let first = cache
            .check(&der, Some(&sni), &mesh.verifier(&none), 0)
            .unwrap();
        assert_eq!(cache.len(), 1);
        // The endorsement's record ends first (a minute; the delegation an hour).
        assert_eq!(first.valid_until_ms, NOW + 60_000);
        assert!(first.valid_until_ms < first.not_after_ms);
        // The same certificate again: from the cache, held to the SNI all the same.
        assert_eq!(
            cache.check(&der, Some(&sni), &mesh.verifier(&none), 0),
            Ok(first.clone())
        );
        let other = sni_name(&mesh.workload().id(), &mesh.root.mesh);
        let wrong = cache.check(&der, Some(&other), &mesh.verifier(&none), 0);
        assert_eq!(wrong.unwrap_err().reason, Reason::WrongPeer);
        // A revocation of the id, or of the node its endorsement rests on: the next
        // generation checks it whole.
        for (key, expected) in [(&check_, Reason::Revoked), (&mesh.node, Reason::Principal)] {
            let revoked = mesh.revoking(&[key.id()]);
            let got = cache.check(&der, None, &mesh.verifier(&revoked), 1);
            assert_eq!(got.unwrap_err().reason, expected);
            assert!(cache.is_empty(), "a refusal is not kept");
            assert!(cache.check(&der, None, &mesh.verifier(&none), 2).is_ok());
        }
        // Past its proof's life it is checked anew: refused, its record has ended,
        // though the delegation has not (beyond the clock skew a verifier allows).
        let mut late = mesh.verifier(&none);
        late.now_ms = first.valid_until_ms + 10 * 60 * 1000;
        assert!(late.now_ms < first.not_after_ms);
        let got = cache.check(&der, None, &late, 2);
        assert_eq!(got.unwrap_err().reason, Reason::Principal);
        // A garbage certificate is refused each time, never cached.
        for _ in 0..2 {
            let got = cache.check(b"\x30\x00", None, &mesh.verifier(&none), 2);
            assert_eq!(got.unwrap_err().reason, Reason::Certificate);
        }
    }

    #[test]
    fn the_callee_admits_by_what_the_certificate_proved() {
        let mesh = Trusted::new();
        let revoked = Revocations::new();
        let verifier = mesh.verifier(&revoked);
        let handler = mesh.workload();
        let svc = principal(&mesh.root.mesh, &handler.id(), Some("handler"));
        let der = certificate(&handler, mesh.endorsement(&handler, "handler", true), &svc);
        let caller = check(&der, None, &verifier).unwrap();
        let config = |policy: &str| {
            crate::config::Config::parse(
                format!(
                    r#"{{"role":"inbound","mesh_root":"{}","workload":"w","policy":{policy}}}"#,
                    mesh.root
                )
                .as_bytes(),
            )
            .unwrap()
            .policy
        };
        assert_eq!(
            admit(
                config(r#"{"allow":[{"service":"handler"}]}"#).as_ref(),
                &caller
            ),
            Ok(())
        );
        let by_id = format!(
            r#"{{"allow":[{{"id":"{}"}}]}}"#,
            handler.id().printable(&mesh.root.mesh)
        );
        assert_eq!(admit(config(&by_id).as_ref(), &caller), Ok(()));
        let refused = |policy: Option<Policy>| admit(policy.as_ref(), &caller).unwrap_err().reason;
        assert_eq!(
            refused(config(r#"{"allow":[{"service":"check"}]}"#)),
            Reason::Policy
        );
        assert_eq!(refused(config(r#"{"allow":[]}"#)), Reason::Policy);
        assert_eq!(refused(None), Reason::NoPolicy);
    }
}
