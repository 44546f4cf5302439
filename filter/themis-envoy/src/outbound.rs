//! The outbound role's state, independent of Envoy: each worker keeps its own
//! sessions (responses come back on the call that sent the request, so nothing needs
//! sharing) and its own resolution cache.

use std::cell::RefCell;
use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::rc::Rc;

use themis_core::{PeerId, Session};

use crate::agent::Instance;

/// An established session to one peer.
pub struct PeerSession {
    /// The channel.
    pub session: Session,
    /// Message 3, sent with requests until the peer has answered one (so that any of
    /// its workers can confirm the session).
    pub confirm: Option<Vec<u8>>,
    /// When to handshake again (Unix ms).
    pub renew_at_ms: u64,
}

/// A session shared by the worker's table and the requests in flight on it: a request
/// opens its response with the session it sealed with, even if the table has moved on.
pub type SharedSession = Rc<RefCell<PeerSession>>;

/// One worker's peers.
#[derive(Default)]
pub struct Peers {
    sessions: HashMap<PeerId, SharedSession>,
    resolved: HashMap<String, (Vec<Instance>, u64)>,
}

impl Peers {
    /// The live session to `peer`, if any.
    pub fn session(&mut self, peer: &PeerId, now_ms: u64) -> Option<SharedSession> {
        if self
            .sessions
            .get(peer)
            .is_some_and(|s| s.borrow().renew_at_ms <= now_ms)
        {
            self.sessions.remove(peer);
        }
        self.sessions.get(peer).cloned()
    }

    /// Keeps a new session unless the worker has one to that peer already (requests
    /// that raced to handshake keep using their own). Returns whether it was kept.
    pub fn insert(&mut self, peer: PeerId, session: SharedSession) -> bool {
        match self.sessions.entry(peer) {
            Entry::Occupied(_) => false,
            Entry::Vacant(slot) => {
                slot.insert(session);
                true
            }
        }
    }

    /// Forgets the session to `peer` (the peer no longer knows it).
    pub fn remove(&mut self, peer: &PeerId) -> bool {
        self.sessions.remove(peer).is_some()
    }

    /// A cached resolution of `service`.
    pub fn resolved(&self, service: &str, now_ms: u64) -> Option<&[Instance]> {
        self.resolved
            .get(service)
            .filter(|(_, expires)| *expires > now_ms)
            .map(|(instances, _)| instances.as_slice())
    }

    /// Caches a resolution (an empty one is not cached: the service may appear).
    pub fn cache_resolution(&mut self, service: &str, instances: Vec<Instance>, expires_ms: u64) {
        if !instances.is_empty() {
            self.resolved
                .insert(service.to_string(), (instances, expires_ms));
        }
    }

    /// Forgets a resolution none of whose instances answered: the next request asks
    /// the agent again (the service may have moved).
    pub fn forget_resolution(&mut self, service: &str) {
        self.resolved.remove(service);
    }

    /// Forgets every cached resolution (a revocation arrived).
    pub fn forget_resolutions(&mut self) {
        self.resolved.clear();
    }

    /// Forgets expired sessions and resolutions; returns the sessions dropped.
    pub fn expire(&mut self, now_ms: u64) -> usize {
        let before = self.sessions.len();
        self.sessions.retain(|_, s| s.borrow().renew_at_ms > now_ms);
        self.resolved.retain(|_, (_, expires)| *expires > now_ms);
        before - self.sessions.len()
    }
}

/// The order to try instances in: a uniformly random rotation per request, which
/// spreads load and, on failure, falls back to the next one.
pub fn attempt_order(instances: &[Instance], random: u32) -> Vec<Instance> {
    let mut order = instances.to_vec();
    if !order.is_empty() {
        let first = random as usize % order.len();
        order.rotate_left(first);
    }
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    fn instance(n: u8) -> Instance {
        Instance {
            id: PeerId([n; 32]),
            endpoint: format!("127.0.0.{n}:15006").parse().unwrap(),
        }
    }

    #[test]
    fn every_instance_is_tried_once_starting_anywhere() {
        let all: Vec<_> = (1..=3).map(instance).collect();
        let mut firsts = std::collections::HashSet::new();
        for r in 0..30 {
            let order = attempt_order(&all, r);
            let mut ids: Vec<_> = order.iter().map(|i| i.id).collect();
            firsts.insert(ids[0]);
            ids.sort();
            assert_eq!(ids, all.iter().map(|i| i.id).collect::<Vec<_>>());
        }
        assert_eq!(firsts.len(), 3);
        assert!(attempt_order(&[], 7).is_empty());
    }

    #[test]
    fn resolutions_expire_and_empty_ones_are_not_cached() {
        let mut peers = Peers::default();
        peers.cache_resolution("check", vec![instance(1)], 100);
        peers.cache_resolution("empty", vec![], 100);
        assert_eq!(peers.resolved("check", 99).map(<[_]>::len), Some(1));
        assert!(peers.resolved("check", 100).is_none());
        assert!(peers.resolved("empty", 0).is_none());
        peers.expire(100);
        assert!(peers.resolved.is_empty());
    }
}
