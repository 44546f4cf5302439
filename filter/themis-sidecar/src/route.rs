//! Outbound routing, sans-IO: which instance a call to a service goes to. Resolutions
//! are cached per worker; the pick is random among the instances the agent vouches
//! for (and that verified here), split by canary weight, avoiding instances whose
//! connection just failed (the fallback) unless none is left.

use std::collections::HashMap;
use std::time::Duration;

use themis_core::PeerId;

use crate::agent::Instance;
use crate::config::{Canary, Transport};

/// Where the call goes (`ip:port`), for `envoy.network.transport_socket.original_dst_address`.
pub const DESTINATION_HEADER: &str = "x-themis-destination";
/// The id it must prove (hex), for `envoy.network.upstream_server_name`.
pub const PEER_HEADER: &str = "x-themis-expect-peer";
/// The transport the pick takes (`tls`, `themis`), for the outbound route (native, a
/// sidecar that speaks both: the TLS cluster or the service's sealing cluster).
pub const TRANSPORT_HEADER: &str = "x-themis-transport";

/// At most this many services are remembered per worker (an app calling many
/// names must not grow the cache without bound).
pub const MAX_SERVICES: usize = 1024;

/// How long a resolution is kept: `resolve_ttl`, or a second at most for an `empty`
/// one. No instance may be the moment a node's revocation took the replicas it held,
/// or the records lapsed while their node was stalled: an empty answer is asked again
/// soon, not pinned for the whole TTL (both runtimes).
pub fn kept_for(resolve_ttl: Duration, empty: bool) -> Duration {
    match empty {
        true => resolve_ttl.min(Duration::from_secs(1)),
        false => resolve_ttl,
    }
}

/// The random numbers of picks: routing, not secrecy, so an xorshift per worker,
/// seeded once from the system (a system draw per request showed in the benchmark).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PickRandom(u64);

impl PickRandom {
    /// Seeded with `seed` (any value: the one bad state, zero, is never reached).
    pub fn new(seed: u64) -> Self {
        PickRandom(seed | 1)
    }

    /// Seeded from the system; a failed draw still leaves a valid (fixed) sequence.
    pub fn seeded(rng: &dyn ring::rand::SecureRandom) -> Self {
        let mut seed = [0u8; 8];
        let _ = rng.fill(&mut seed);
        PickRandom::new(u64::from_le_bytes(seed))
    }

    /// The next number.
    pub fn next_u32(&mut self) -> u32 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        (x >> 32) as u32
    }
}

/// What to do with a call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pick {
    /// Send it here.
    Instance(Instance),
    /// The resolution is unknown or expired: ask the agent, then pick again.
    Resolve,
    /// The service has no usable instance.
    NoInstance,
}

struct Resolved {
    instances: Vec<Instance>,
    expires_ms: u64,
}

/// One worker's resolutions and health marks.
#[derive(Default)]
pub struct Routes {
    services: HashMap<String, Resolved>,
    /// Instances to avoid until the time given (Unix ms).
    down: HashMap<PeerId, u64>,
    canary: Vec<Canary>,
}

impl Routes {
    /// Routes with these traffic splits.
    pub fn new(canary: Vec<Canary>) -> Self {
        Routes {
            canary,
            ..Routes::default()
        }
    }

    /// Picks an instance of `service` at `now_ms` that takes a transport of `speaks`;
    /// `random` is a fresh random number.
    pub fn pick(&self, service: &str, speaks: &[Transport], now_ms: u64, random: u32) -> Pick {
        let Some(resolved) = self.services.get(service).filter(|r| r.expires_ms > now_ms) else {
            return Pick::Resolve;
        };
        self.pick_from(service, &resolved.instances, speaks, now_ms, random)
    }

    /// Picks among `instances` of `service` (a resolution kept elsewhere: the native
    /// runtime's snapshot) that take a transport of `speaks` (its signed record
    /// says which), with this worker's canary splits and health marks.
    pub fn pick_from(
        &self,
        service: &str,
        instances: &[Instance],
        speaks: &[Transport],
        now_ms: u64,
        random: u32,
    ) -> Pick {
        let callable = || {
            instances
                .iter()
                .filter(|i| i.takes().first_of(speaks).is_some())
        };
        let up: Vec<&Instance> = callable()
            .filter(|i| self.down.get(&i.id).is_none_or(|&until| until <= now_ms))
            .collect();
        // Every instance failed recently: try them anyway rather than fail for sure.
        let candidates: Vec<&Instance> = match up.is_empty() {
            true => callable().collect(),
            false => up,
        };
        if candidates.is_empty() {
            return Pick::NoInstance;
        }
        let group = match self.canary.iter().find(|c| c.service == service) {
            Some(split) => {
                let (canary, stable): (Vec<&Instance>, Vec<&Instance>) =
                    candidates.iter().partition(|i| {
                        split
                            .matches
                            .iter()
                            .all(|(k, v)| i.metadata.get(k) == Some(v))
                    });
                // The low 16 bits decide the group, the high 16 the instance in it.
                let to_canary = (random & 0xffff) % 100 < split.weight_percent;
                match (to_canary, canary.is_empty(), stable.is_empty()) {
                    (true, false, _) | (false, false, true) => canary,
                    _ => stable,
                }
            }
            None => candidates,
        };
        let index = (random >> 16) as usize % group.len();
        Pick::Instance(group[index].clone())
    }

    /// Remembers a resolution until `expires_ms`.
    pub fn cache(&mut self, service: &str, instances: Vec<Instance>, expires_ms: u64) {
        if self.services.len() >= MAX_SERVICES && !self.services.contains_key(service) {
            let now = expires_ms.saturating_sub(1);
            self.services.retain(|_, r| r.expires_ms > now);
            if self.services.len() >= MAX_SERVICES {
                // Still full of live entries: drop one; resolving it again is cheap.
                if let Some(victim) = self.services.keys().next().cloned() {
                    self.services.remove(&victim);
                }
            }
        }
        self.services.insert(
            service.to_string(),
            Resolved {
                instances,
                expires_ms,
            },
        );
    }

    /// The instance's connection failed: avoid it until `until_ms`.
    pub fn mark_down(&mut self, id: PeerId, until_ms: u64) {
        self.down.insert(id, until_ms);
    }

    /// Drops expired resolutions and health marks.
    pub fn expire(&mut self, now_ms: u64) {
        self.services.retain(|_, r| r.expires_ms > now_ms);
        self.down.retain(|_, &mut until| until > now_ms);
    }

    /// A revocation arrived: withdraws the instances it `revokes` from every
    /// resolution, and forgets a resolution left with none (resolved again on its next
    /// call). The others stay until they expire: a revocation must not send every
    /// worker of the mesh to its agent, and every agent to the DHT, at the same moment
    /// (when the replicas a revoked node held are not yet stored again).
    pub fn withdraw(&mut self, revokes: impl Fn(&Instance) -> bool) {
        self.services.retain(|_, resolved| {
            resolved.instances.retain(|i| !revokes(i));
            !resolved.instances.is_empty()
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn instance(n: u8, version: &str) -> Instance {
        Instance {
            id: PeerId([n; 32]),
            endpoint: format!("127.0.0.{n}:15006").parse().unwrap(),
            metadata: BTreeMap::from([("version".to_string(), version.to_string())]),
            vouched_by: vec![[n; 32]],
        }
    }

    const THEMIS: &[Transport] = &[Transport::Themis];

    #[test]
    fn a_pick_is_of_an_instance_that_takes_a_transport_the_caller_speaks() {
        let mut tls_only = instance(1, "v1");
        tls_only
            .metadata
            .insert(crate::config::TRANSPORT_LABEL.into(), "tls".into());
        let older = instance(2, "v1");
        let mut routes = Routes::default();
        routes.cache("check", vec![tls_only.clone(), older.clone()], 100);
        // The channel alone: never the TLS-only callee, even when the other is down.
        routes.mark_down(older.id, 50);
        for r in 0..64 {
            match routes.pick("check", THEMIS, 0, r << 16) {
                Pick::Instance(i) => assert_eq!(i.id, older.id),
                other => panic!("{other:?}"),
            }
        }
        let tls = [Transport::Tls];
        for r in 0..64 {
            match routes.pick("check", &tls, 0, r << 16) {
                Pick::Instance(i) => assert_eq!(i.id, tls_only.id),
                other => panic!("{other:?}"),
            }
        }
        routes.cache("tls-only", vec![tls_only], 100);
        assert_eq!(routes.pick("tls-only", THEMIS, 0, 0), Pick::NoInstance);
    }

    fn split(weight_percent: u32) -> Routes {
        Routes::new(vec![Canary {
            service: "check".into(),
            matches: BTreeMap::from([("version".to_string(), "v2".to_string())]),
            weight_percent,
        }])
    }

    #[test]
    fn an_empty_resolution_is_kept_a_second_at_most() {
        let ttl = Duration::from_secs(10);
        assert_eq!(kept_for(ttl, false), ttl);
        assert_eq!(kept_for(ttl, true), Duration::from_secs(1));
        let short = Duration::from_millis(300);
        assert_eq!(kept_for(short, true), short, "never longer than the TTL");
    }

    #[test]
    fn unknown_or_expired_services_are_resolved_first() {
        let mut routes = Routes::default();
        assert_eq!(routes.pick("check", THEMIS, 0, 0), Pick::Resolve);
        routes.cache("check", vec![instance(1, "v1")], 100);
        assert!(matches!(
            routes.pick("check", THEMIS, 99, 0),
            Pick::Instance(_)
        ));
        assert_eq!(routes.pick("check", THEMIS, 100, 0), Pick::Resolve);
        routes.cache("check", vec![], 200);
        assert_eq!(routes.pick("check", THEMIS, 150, 0), Pick::NoInstance);
    }

    #[test]
    fn a_revocation_withdraws_its_instances_and_keeps_the_rest() {
        let mut routes = Routes::default();
        routes.cache("check", vec![instance(1, "v1"), instance(2, "v1")], 1000);
        routes.cache("audit", vec![instance(1, "v1")], 1000);
        // Node 1 is revoked: check keeps instance 2 until it expires, with no new
        // resolution; audit, left with none, is resolved again.
        routes.withdraw(|i| i.vouched_by.contains(&[1; 32]));
        for r in 0..16u32 {
            assert!(
                matches!(routes.pick("check", THEMIS, 0, r << 16), Pick::Instance(i) if i.id == PeerId([2; 32]))
            );
        }
        assert_eq!(routes.pick("check", THEMIS, 1000, 0), Pick::Resolve);
        assert_eq!(routes.pick("audit", THEMIS, 0, 0), Pick::Resolve);
    }

    #[test]
    fn pick_numbers_cover_the_canary_range_from_any_seed() {
        for seed in [0, 1, u64::MAX] {
            let mut random = PickRandom::new(seed);
            let mut percents = std::collections::HashSet::new();
            for _ in 0..10_000 {
                percents.insert((random.next_u32() & 0xffff) % 100);
            }
            assert_eq!(percents.len(), 100, "seed {seed}");
        }
    }

    #[test]
    fn picks_spread_over_the_instances() {
        let mut routes = Routes::default();
        routes.cache("check", (1..=4).map(|n| instance(n, "v1")).collect(), 1000);
        let mut seen = std::collections::HashSet::new();
        for r in 0..64u32 {
            if let Pick::Instance(i) = routes.pick("check", THEMIS, 0, r << 16) {
                seen.insert(i.id);
            }
        }
        assert_eq!(seen.len(), 4);
    }

    #[test]
    fn the_canary_gets_its_weight_exactly_over_the_random_range() {
        let mut routes = split(10);
        routes.cache("check", vec![instance(1, "v1"), instance(2, "v2")], 1000);
        let to_v2 = (0..100u32)
            .filter(|&r| matches!(routes.pick("check", THEMIS, 0, r), Pick::Instance(i) if i.id == PeerId([2; 32])))
            .count();
        assert_eq!(to_v2, 10);
        // Weight 0 sends nothing to the canary, 100 everything.
        let mut none = split(0);
        none.cache("check", vec![instance(1, "v1"), instance(2, "v2")], 1000);
        assert!((0..100).all(
            |r| matches!(none.pick("check", THEMIS, 0, r), Pick::Instance(i) if i.id == PeerId([1; 32]))
        ));
    }

    #[test]
    fn an_empty_side_of_a_split_falls_back_to_the_other() {
        let mut routes = split(50);
        routes.cache("check", vec![instance(1, "v1")], 1000);
        assert!((0..100).all(|r| matches!(routes.pick("check", THEMIS, 0, r), Pick::Instance(_))));
        let mut only_canary = split(50);
        only_canary.cache("check", vec![instance(2, "v2")], 1000);
        assert!(
            (0..100).all(|r| matches!(only_canary.pick("check", THEMIS, 0, r), Pick::Instance(_)))
        );
    }

    #[test]
    fn failed_instances_are_avoided_until_their_mark_expires() {
        let mut routes = Routes::default();
        routes.cache("check", vec![instance(1, "v1"), instance(2, "v1")], 10_000);
        routes.mark_down(PeerId([1; 32]), 500);
        for r in 0..32u32 {
            assert!(
                matches!(routes.pick("check", THEMIS, 0, r << 16), Pick::Instance(i) if i.id == PeerId([2; 32]))
            );
        }
        // All down: still try one rather than fail for sure.
        routes.mark_down(PeerId([2; 32]), 500);
        assert!(matches!(
            routes.pick("check", THEMIS, 0, 0),
            Pick::Instance(_)
        ));
        routes.expire(600);
        let ids: std::collections::HashSet<_> = (0..32u32)
            .filter_map(|r| match routes.pick("check", THEMIS, 600, r << 16) {
                Pick::Instance(i) => Some(i.id),
                _ => None,
            })
            .collect();
        assert_eq!(ids.len(), 2);
    }

    #[test]
    fn the_cache_is_bounded() {
        let mut routes = Routes::default();
        for n in 0..(MAX_SERVICES + 10) {
            routes.cache(&format!("s{n}"), vec![], 1000);
        }
        assert!(routes.services.len() <= MAX_SERVICES);
    }
}
