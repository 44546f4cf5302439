//! The resolution cache: what `resolve` answers without asking the DHT. Bounded (a
//! flood of new names evicts one entry at a time, never more than the cap is kept),
//! short-lived (an entry older than the TTL is never served) and tied to the
//! revocation generation it was made under (a revocation learnt since makes it
//! stale at once: the revocation bound must not wait for the TTL).
//!
//! Sans-IO: the caller passes the time, so expiry is tested without sleeping.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use super::Resolution;
use crate::names::ServiceName;

/// At most `capacity` services, each with when and under which revocation
/// generation it was resolved. Full, it drops the least recently used service, one
/// at a time; a lookup of an expired or outdated entry drops that entry.
pub(super) struct ResolveCache {
    capacity: usize,
    entries: HashMap<ServiceName, CacheEntry>,
    /// Use order: the smallest tick is the least recently used.
    by_use: BTreeMap<u64, ServiceName>,
    tick: u64,
}

struct CacheEntry {
    at: Instant,
    generation: u64,
    used: u64,
    resolution: Resolution,
}

impl ResolveCache {
    /// An empty cache holding at most `capacity` services (at least one).
    pub(super) fn new(capacity: usize) -> Self {
        ResolveCache {
            capacity: capacity.max(1),
            entries: HashMap::new(),
            by_use: BTreeMap::new(),
            tick: 0,
        }
    }

    fn next_tick(&mut self) -> u64 {
        self.tick += 1;
        self.tick
    }

    /// The cached resolution of `service` (marked `cached`), if younger than `ttl` at
    /// `now` and made under revocation generation `generation`; counts as a use.
    pub(super) fn get(
        &mut self,
        service: &ServiceName,
        ttl: Duration,
        generation: u64,
        now: Instant,
    ) -> Option<Resolution> {
        let entry = self.entries.get(service)?;
        if now.saturating_duration_since(entry.at) >= ttl || entry.generation != generation {
            self.remove(service);
            return None;
        }
        let tick = self.next_tick();
        let entry = self.entries.get_mut(service).expect("just found");
        self.by_use.remove(&entry.used);
        entry.used = tick;
        self.by_use.insert(tick, service.clone());
        Some(Resolution {
            cached: true,
            ..entry.resolution.clone()
        })
    }

    /// Caches a resolution made at `now`; `true` if another service was evicted for it.
    pub(super) fn insert(
        &mut self,
        service: ServiceName,
        generation: u64,
        resolution: Resolution,
        now: Instant,
    ) -> bool {
        self.remove(&service);
        let mut evicted = false;
        if self.entries.len() >= self.capacity {
            if let Some((_, oldest)) = self.by_use.pop_first() {
                self.entries.remove(&oldest);
                evicted = true;
            }
        }
        let tick = self.next_tick();
        self.by_use.insert(tick, service.clone());
        self.entries.insert(
            service,
            CacheEntry {
                at: now,
                generation,
                used: tick,
                resolution,
            },
        );
        evicted
    }

    /// Drops `service`'s entry, if any (its registrations here changed).
    pub(super) fn remove(&mut self, service: &ServiceName) {
        if let Some(entry) = self.entries.remove(service) {
            self.by_use.remove(&entry.used);
        }
    }

    /// How many services are cached.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        debug_assert_eq!(self.entries.len(), self.by_use.len());
        self.entries.len()
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    pub(in crate::registry) fn service(name: &str) -> ServiceName {
        ServiceName::new(name).unwrap()
    }

    /// A resolution of `name` that found `answered` replicas (to tell entries apart).
    pub(in crate::registry) fn resolution(name: &str, answered: u8) -> Resolution {
        Resolution {
            service: service(name),
            instances: Vec::new(),
            cached: false,
            refused: 0,
            answered,
            replicas: 5,
        }
    }

    const TTL: Duration = Duration::from_secs(5);

    #[test]
    fn serves_a_fresh_entry_marked_cached() {
        let (mut cache, t0) = (ResolveCache::new(4), Instant::now());
        assert!(!cache.insert(service("a"), 0, resolution("a", 3), t0));
        let got = cache.get(&service("a"), TTL, 0, t0 + TTL / 2).unwrap();
        assert!(got.cached);
        assert_eq!(got.answered, 3);
        assert!(cache.get(&service("b"), TTL, 0, t0).is_none());
    }

    #[test]
    fn an_expired_entry_is_never_served_and_is_dropped() {
        let (mut cache, t0) = (ResolveCache::new(4), Instant::now());
        cache.insert(service("a"), 0, resolution("a", 3), t0);
        // Exactly at the TTL is already too old.
        assert!(cache.get(&service("a"), TTL, 0, t0 + TTL).is_none());
        assert_eq!(cache.len(), 0);
        // Gone for good: asking again with an earlier clock does not bring it back.
        assert!(cache.get(&service("a"), TTL, 0, t0).is_none());
    }

    #[test]
    fn an_entry_from_before_a_revocation_is_not_served() {
        let (mut cache, t0) = (ResolveCache::new(4), Instant::now());
        cache.insert(service("a"), 7, resolution("a", 3), t0);
        assert!(cache.get(&service("a"), TTL, 8, t0).is_none());
        assert_eq!(cache.len(), 0);
    }

    #[test]
    fn a_flood_of_new_names_never_grows_it_past_the_bound() {
        let (mut cache, t0) = (ResolveCache::new(3), Instant::now());
        let mut evictions = 0;
        for i in 0..100 {
            let name = format!("flood-{i}");
            evictions += usize::from(cache.insert(service(&name), 0, resolution(&name, 1), t0));
            assert!(cache.len() <= 3);
        }
        assert_eq!(cache.len(), 3);
        assert_eq!(evictions, 97);
        // The newest names stay, the oldest went.
        assert!(cache.get(&service("flood-99"), TTL, 0, t0).is_some());
        assert!(cache.get(&service("flood-0"), TTL, 0, t0).is_none());
    }

    #[test]
    fn the_least_recently_used_goes_first() {
        let (mut cache, t0) = (ResolveCache::new(2), Instant::now());
        cache.insert(service("a"), 0, resolution("a", 1), t0);
        cache.insert(service("b"), 0, resolution("b", 1), t0);
        // A use of `a` makes `b` the least recently used.
        assert!(cache.get(&service("a"), TTL, 0, t0).is_some());
        assert!(cache.insert(service("c"), 0, resolution("c", 1), t0));
        assert!(cache.get(&service("b"), TTL, 0, t0).is_none());
        assert!(cache.get(&service("a"), TTL, 0, t0).is_some());
        assert!(cache.get(&service("c"), TTL, 0, t0).is_some());
    }

    #[test]
    fn replacing_or_removing_an_entry_evicts_nothing_else() {
        let (mut cache, t0) = (ResolveCache::new(2), Instant::now());
        cache.insert(service("a"), 0, resolution("a", 1), t0);
        cache.insert(service("b"), 0, resolution("b", 1), t0);
        assert!(!cache.insert(service("a"), 0, resolution("a", 2), t0));
        assert_eq!(cache.get(&service("a"), TTL, 0, t0).unwrap().answered, 2);
        assert!(cache.get(&service("b"), TTL, 0, t0).is_some());
        cache.remove(&service("a"));
        cache.remove(&service("a"));
        assert_eq!(cache.len(), 1);
        assert!(cache.get(&service("a"), TTL, 0, t0).is_none());
    }

    #[test]
    fn a_zero_capacity_still_holds_one() {
        let (mut cache, t0) = (ResolveCache::new(0), Instant::now());
        cache.insert(service("a"), 0, resolution("a", 1), t0);
        assert!(cache.get(&service("a"), TTL, 0, t0).is_some());
        assert!(cache.insert(service("b"), 0, resolution("b", 1), t0));
        assert_eq!(cache.len(), 1);
    }
}
