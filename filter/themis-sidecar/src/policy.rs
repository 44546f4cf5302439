//! Inbound authorization, sans-IO: decided once per connection, when the caller has
//! proved its id. A claimed service counts only if the DHT (through the agent,
//! verified against the mesh root here) lists the caller's id for it, and it is
//! looked up only when the decision depends on it: the policy names that service and
//! no other rule already allows the caller. So a caller makes the sidecar resolve
//! only names its own policy lists, and nothing with no policy, an id-only policy
//! or `allow_any_caller`. With no policy at all every caller is refused.

use std::collections::HashMap;

use themis_core::stream::Established;
use themis_core::PeerId;

use crate::config::Policy;
use crate::reason::Reason;

/// At most this many verified services are remembered per worker.
pub const MAX_CALLER_SERVICES: usize = 1024;

/// The decision for one connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Let it through; `service` is the caller's verified service, if any.
    Allow {
        /// Verified, never just claimed.
        service: Option<String>,
    },
    /// The policy does not allow this caller.
    Deny {
        /// The caller's verified service, for the log.
        service: Option<String>,
        /// Why.
        denial: Denial,
    },
    /// Resolve this service (the caller's claim) and decide again.
    Verify(String),
}

/// Why a caller was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Denial {
    /// The sidecar has no `policy`: it fails closed.
    NoPolicy,
    /// No rule of the policy matches the caller.
    NotAllowed,
}

impl Denial {
    /// The reason counted (`refused.<reason>`) and logged.
    pub fn reason(self) -> Reason {
        match self {
            Denial::NoPolicy => Reason::NoPolicy,
            Denial::NotAllowed => Reason::Policy,
        }
    }

    /// What the log says about it.
    pub fn explain(self) -> &'static str {
        match self {
            Denial::NoPolicy => "no policy: deny by default",
            Denial::NotAllowed => "not allowed by the policy",
        }
    }
}

/// Services resolved to check callers' claims, with the ids they list.
#[derive(Default)]
pub struct Callers {
    services: HashMap<String, (Vec<PeerId>, u64)>,
}

impl Callers {
    /// Remembers `service`'s verified instance ids until `expires_ms`.
    pub fn insert(&mut self, service: String, ids: Vec<PeerId>, expires_ms: u64) {
        if self.services.len() >= MAX_CALLER_SERVICES && !self.services.contains_key(&service) {
            let now = expires_ms.saturating_sub(1);
            self.services.retain(|_, (_, e)| *e > now);
            if let Some(victim) = (self.services.len() >= MAX_CALLER_SERVICES)
                .then(|| self.services.keys().next().cloned())
                .flatten()
            {
                self.services.remove(&victim);
            }
        }
        self.services.insert(service, (ids, expires_ms));
    }

    /// Drops expired entries.
    pub fn expire(&mut self, now_ms: u64) {
        self.services.retain(|_, (_, e)| *e > now_ms);
    }

    /// Forgets everything (a revocation arrived).
    pub fn clear(&mut self) {
        self.services.clear();
    }

    /// `Some(listed)` if `service` was verified and is still fresh.
    pub fn lists(&self, service: &str, peer: &PeerId, now_ms: u64) -> Option<bool> {
        self.services
            .get(service)
            .filter(|(_, e)| *e > now_ms)
            .map(|(ids, _)| ids.contains(peer))
    }

    /// How many services are remembered.
    pub fn len(&self) -> usize {
        self.services.len()
    }

    /// True if none is.
    pub fn is_empty(&self) -> bool {
        self.services.is_empty()
    }
}

/// Decides for the caller `established` at `now_ms`, with the services verified so
/// far (`callers`, from DHT lookups). `policy` is `None` when the sidecar has none
/// configured: then nobody is allowed.
pub fn decide(
    policy: Option<&Policy>,
    callers: &Callers,
    established: &Established,
    now_ms: u64,
) -> Verdict {
    decide_with(policy, established, |claim, peer| {
        callers.lists(claim, peer, now_ms)
    })
}

/// [`decide`] with the claim checked by `lists(service, peer)`: `Some(true)` if
/// `peer` is verified as an instance of `service`, `Some(false)` if not, `None` if
/// that is not known yet (then the verdict asks to [`Verdict::Verify`] it). It is
/// asked only when the claim can change the decision.
pub fn decide_with(
    policy: Option<&Policy>,
    established: &Established,
    lists: impl FnOnce(&str, &PeerId) -> Option<bool>,
) -> Verdict {
    let Some(policy) = policy else {
        return Verdict::Deny {
            service: None,
            denial: Denial::NoPolicy,
        };
    };
    let peer = &established.peer_id;
    let service = match established.meta.service.as_deref() {
        // A lookup per claim only where the claim can change the decision.
        Some(claim) if !policy.allows(peer, None) && policy.names_service(claim) => {
            match lists(claim, peer) {
                Some(true) => Some(claim.to_string()),
                Some(false) => None,
                None => return Verdict::Verify(claim.to_string()),
            }
        }
        _ => None,
    };
    match policy.allows(peer, service.as_deref()) {
        true => Verdict::Allow { service },
        false => Verdict::Deny {
            service,
            denial: Denial::NotAllowed,
        },
    }
}

/// Whether the endorsement a caller carried (an encoded `InstanceValue`) makes `peer`
/// a verified instance of `claim` under `verifier` (the root, now, the revocations in
/// force): the record names this very id, and its grant chain holds. A node revoked
/// since makes it fail, so a claim endorsed by a revoked node does not count; an
/// `allow id` rule does not look at it (see `docs/PROTOCOL.md` §6.12). A tombstone
/// (a record with no endpoint: the node withdrew the instance) lists nobody.
pub fn endorsement_lists(
    verifier: &themis_trust::Verifier<'_>,
    endorsement: &[u8],
    claim: &str,
    peer: &PeerId,
) -> bool {
    verifier
        .instance(endorsement, claim)
        .is_ok_and(|instance| instance.id == *peer && instance.endpoint.is_some())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Rule;
    use themis_core::stream::Meta;

    fn caller(n: u8, claim: Option<&str>) -> Established {
        Established {
            peer_id: PeerId([n; 32]),
            meta: Meta {
                service: claim.map(str::to_string),
            },
            peer_endorsement: Vec::new(),
            carries: themis_core::Carries::HTTP2,
        }
    }

    #[test]
    fn a_claim_is_verified_before_it_counts() {
        let policy = Policy::Allow(vec![Rule::Service("handler".into())]);
        let mut callers = Callers::default();
        let c = caller(1, Some("handler"));
        assert_eq!(
            decide(Some(&policy), &callers, &c, 0),
            Verdict::Verify("handler".into())
        );
        callers.insert("handler".into(), vec![PeerId([1; 32])], 100);
        assert_eq!(
            decide(Some(&policy), &callers, &c, 0),
            Verdict::Allow {
                service: Some("handler".into())
            }
        );
        // A caller the DHT does not list for the service it claims: no service.
        let liar = caller(2, Some("handler"));
        assert_eq!(
            decide(Some(&policy), &callers, &liar, 0),
            Verdict::Deny {
                service: None,
                denial: Denial::NotAllowed
            }
        );
        // Expired verification: verify again.
        assert_eq!(
            decide(Some(&policy), &callers, &c, 100),
            Verdict::Verify("handler".into())
        );
    }

    /// The attack of issue 21 (3): a caller claims a service to make the callee
    /// resolve it, k+1 DHT lookups each. Only a policy that names the claimed service
    /// (and allows the caller no other way) may look it up.
    #[test]
    fn a_claim_is_looked_up_only_when_the_policy_names_it() {
        let callers = Callers::default();
        let claimant = caller(4, Some("anything-at-all"));
        let no_lookup = |policy: Option<&Policy>, who: &Established| {
            let verdict = decide(policy, &callers, who, 0);
            assert!(
                !matches!(verdict, Verdict::Verify(_)),
                "{policy:?} looks up the claim of {:?}: {verdict:?}",
                who.meta.service
            );
            verdict
        };
        // No policy, an id-only policy, allow_any_caller, a policy naming another
        // service: the claim decides nothing.
        no_lookup(None, &claimant);
        let ids = Policy::Allow(vec![Rule::Id(PeerId([3; 32]))]);
        no_lookup(Some(&ids), &claimant);
        no_lookup(Some(&Policy::AnyCaller), &claimant);
        let handler_only = Policy::Allow(vec![Rule::Service("handler".into())]);
        no_lookup(Some(&handler_only), &claimant);
        // A caller the policy allows by id needs no lookup of what it claims either.
        let both = Policy::Allow(vec![
            Rule::Id(PeerId([3; 32])),
            Rule::Service("handler".into()),
        ]);
        no_lookup(Some(&both), &caller(3, Some("handler")));
        // The one case that looks up: the policy names the claim.
        assert_eq!(
            decide(Some(&both), &callers, &caller(4, Some("handler")), 0),
            Verdict::Verify("handler".into())
        );
    }

    /// Issue 21 (4): a sidecar without a policy fails closed.
    #[test]
    fn no_policy_denies_every_caller() {
        let callers = Callers::default();
        for who in [caller(4, None), caller(5, Some("handler"))] {
            assert_eq!(
                decide(None, &callers, &who, 0),
                Verdict::Deny {
                    service: None,
                    denial: Denial::NoPolicy
                }
            );
        }
        assert_eq!(Denial::NoPolicy.explain(), "no policy: deny by default");
    }

    #[test]
    fn ids_and_open_policies_need_no_lookup() {
        let policy = Policy::Allow(vec![Rule::Id(PeerId([3; 32]))]);
        let callers = Callers::default();
        assert_eq!(
            decide(Some(&policy), &callers, &caller(3, None), 0),
            Verdict::Allow { service: None }
        );
        assert_eq!(
            decide(Some(&policy), &callers, &caller(4, None), 0),
            Verdict::Deny {
                service: None,
                denial: Denial::NotAllowed
            }
        );
        assert_eq!(
            decide(
                Some(&Policy::AnyCaller),
                &callers,
                &caller(4, Some("Not A Name")),
                0
            ),
            Verdict::Allow { service: None }
        );
        // Nobody, explicitly.
        assert_eq!(
            decide(Some(&Policy::Allow(vec![])), &callers, &caller(4, None), 0),
            Verdict::Deny {
                service: None,
                denial: Denial::NotAllowed
            }
        );
    }

    #[test]
    fn the_cache_is_bounded() {
        let mut callers = Callers::default();
        for n in 0..(MAX_CALLER_SERVICES + 5) {
            callers.insert(format!("s{n}"), vec![], 10);
        }
        assert!(callers.len() <= MAX_CALLER_SERVICES);
    }

    /// What revoking a node leaves (§6.12): a claim its endorsement carried no longer
    /// counts, so `allow service` refuses the caller; `allow id` still admits the
    /// workload key, until that id is revoked too.
    #[test]
    fn a_revoked_nodes_endorsement_no_longer_counts_but_an_allow_id_rule_does() {
        use crate::testing::Trusted;
        use themis_trust::Revocations;
        let mesh = Trusted::new();
        let workload = mesh.workload();
        let caller = Established {
            peer_id: workload.id(),
            meta: Meta {
                service: Some("handler".into()),
            },
            peer_endorsement: mesh.endorsement(&workload, "handler", true),
            carries: themis_core::Carries::HTTP2,
        };
        let by_service = Policy::Allow(vec![Rule::Service("handler".into())]);
        let by_id = Policy::Allow(vec![Rule::Id(workload.id())]);
        let decide_under = |revoked: &Revocations, policy: &Policy| {
            let verifier = mesh.verifier(revoked);
            decide_with(Some(policy), &caller, |claim, peer| {
                Some(endorsement_lists(
                    &verifier,
                    &caller.peer_endorsement,
                    claim,
                    peer,
                ))
            })
        };
        let allowed = Verdict::Allow {
            service: Some("handler".into()),
        };
        assert_eq!(decide_under(&Revocations::new(), &by_service), allowed);
        // The node revoked: its endorsement counts no more.
        let node_revoked = mesh.revoking(&[mesh.node.id()]);
        assert!(matches!(
            decide_under(&node_revoked, &by_service),
            Verdict::Deny { service: None, .. }
        ));
        // What remains: the workload's own key, named by id.
        assert!(matches!(
            decide_under(&node_revoked, &by_id),
            Verdict::Allow { .. }
        ));
        // (The id's own revocation is the handshake's refusal, `revoked`, before any
        // policy.)
    }

    /// A node's tombstone for a workload (its record with no endpoint: withdrawn) is
    /// signed and granted like a live record, but endorses nobody: carried, it makes
    /// no claim count.
    #[test]
    fn a_tombstone_endorses_nobody() {
        let mesh = crate::testing::Trusted::new();
        let workload = mesh.workload();
        let revoked = themis_trust::Revocations::new();
        let verifier = mesh.verifier(&revoked);
        let live = mesh.endorsement(&workload, "handler", true);
        assert!(endorsement_lists(
            &verifier,
            &live,
            "handler",
            &workload.id()
        ));
        let tombstone = mesh.endorsement(&workload, "handler", false);
        assert!(!endorsement_lists(
            &verifier,
            &tombstone,
            "handler",
            &workload.id()
        ));
    }
}
