//! Inbound authorization, sans-IO: decided once per connection, when the caller has
//! proved its id. A claimed service counts only if the DHT (through the agent,
//! verified against the mesh root here) lists the caller's id for it.

use std::collections::HashMap;

use themis_core::stream::Established;
use themis_core::PeerId;

use crate::config::{is_name, Policy};

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
    },
    /// Resolve this service (the caller's claim) and decide again.
    Verify(String),
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
    fn lists(&self, service: &str, peer: &PeerId, now_ms: u64) -> Option<bool> {
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

/// Decides for the caller `established` at `now_ms`.
pub fn decide(
    policy: Option<&Policy>,
    callers: &Callers,
    established: &Established,
    now_ms: u64,
) -> Verdict {
    let peer = &established.peer_id;
    let service = match established.meta.service.as_deref() {
        Some(claim) if is_name(claim) => match callers.lists(claim, peer, now_ms) {
            Some(true) => Some(claim.to_string()),
            Some(false) => None,
            None => return Verdict::Verify(claim.to_string()),
        },
        _ => None,
    };
    match policy.is_none_or(|p| p.allows(peer, service.as_deref())) {
        true => Verdict::Allow { service },
        false => Verdict::Deny { service },
    }
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
        }
    }

    #[test]
    fn a_claim_is_verified_before_it_counts() {
        let policy = Policy {
            allow: vec![Rule::Service("handler".into())],
        };
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
            Verdict::Deny { service: None }
        );
        // Expired verification: verify again.
        assert_eq!(
            decide(Some(&policy), &callers, &c, 100),
            Verdict::Verify("handler".into())
        );
    }

    #[test]
    fn ids_and_open_policies_need_no_lookup() {
        let policy = Policy {
            allow: vec![Rule::Id(PeerId([3; 32]))],
        };
        let callers = Callers::default();
        assert_eq!(
            decide(Some(&policy), &callers, &caller(3, None), 0),
            Verdict::Allow { service: None }
        );
        assert_eq!(
            decide(Some(&policy), &callers, &caller(4, None), 0),
            Verdict::Deny { service: None }
        );
        assert_eq!(
            decide(None, &callers, &caller(4, Some("Not A Name")), 0),
            Verdict::Allow { service: None }
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
}
