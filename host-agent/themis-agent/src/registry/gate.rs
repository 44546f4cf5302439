//! Which resolutions reach the DHT: the resolution cache and the two budgets in
//! front of it, decided in one place. A resolution is answered from the cache when
//! it may be, refused when over a budget with nothing cached to fall back on, and
//! otherwise let through to a lookup. The node's operator is not budgeted.
//!
//! Sans-IO: the caller passes the time and the revocation generation, and records
//! metrics from the decision.

use std::time::{Duration, Instant};

use super::budget::TokenBucket;
use super::resolve_cache::ResolveCache;
use super::{RegistryConfig, Resolution};
use crate::names::ServiceName;

/// The two budgets on resolutions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Budget {
    /// Resolutions that skip the cache (`?fresh=true`).
    Fresh,
    /// Resolutions that miss the cache (fresh ones included).
    Lookups,
}

/// What to do with a resolution.
#[derive(Debug)]
pub(super) enum Decision {
    /// Answer from the cache; `limited` names the budget that sent it there, if one did.
    Cached {
        /// The cached resolution (marked `cached`).
        resolution: Resolution,
        /// The budget that was exhausted, when the caller had asked to skip the cache.
        limited: Option<Budget>,
    },
    /// Refuse: over `budget`, and nothing cached to answer with.
    Refused {
        /// The exhausted budget.
        budget: Budget,
        /// When it has a token again.
        retry_after: Duration,
    },
    /// Look the service up in the DHT (then [`ResolveGate::remember`] the answer).
    Lookup,
}

/// The resolution cache and the budgets of what bypasses it.
pub(super) struct ResolveGate {
    cache: ResolveCache,
    cache_ttl: Duration,
    fresh: TokenBucket,
    lookups: TokenBucket,
}

impl ResolveGate {
    /// An empty cache and full budgets at `now`, as `config` sets them.
    pub(super) fn new(config: &RegistryConfig, now: Instant) -> Self {
        ResolveGate {
            cache: ResolveCache::new(config.cache_capacity),
            cache_ttl: config.cache_ttl,
            fresh: TokenBucket::new(config.fresh_per_sec, config.fresh_burst, now),
            lookups: TokenBucket::new(config.lookups_per_sec, config.lookups_burst, now),
        }
    }

    /// Decides a resolution of `service` at `now`, under revocation generation
    /// `generation`: `fresh` skips the cache, `unbudgeted` (the operator) draws from
    /// no budget.
    pub(super) fn decide(
        &mut self,
        service: &ServiceName,
        fresh: bool,
        unbudgeted: bool,
        generation: u64,
        now: Instant,
    ) -> Decision {
        let ttl = self.cache_ttl;
        if !fresh {
            if let Some(resolution) = self.cache.get(service, ttl, generation, now) {
                return Decision::Cached {
                    resolution,
                    limited: None,
                };
            }
        } else if let Some(retry_after) =
            (!unbudgeted).then(|| self.fresh.take(now).err()).flatten()
        {
            // Over the budget of cache-skipping lookups: the cached answer if there
            // is one (it says `cached: true`), else a refusal.
            return self.cached_or_refused(service, generation, now, Budget::Fresh, retry_after);
        }
        if let Some(retry_after) = (!unbudgeted)
            .then(|| self.lookups.take(now).err())
            .flatten()
        {
            // Ever-new names would each cost `replicas + 1` DHT lookups: over the
            // budget, refused (a fresh one over it is served from the cache if it can;
            // a cached one already missed).
            if !fresh {
                return Decision::Refused {
                    budget: Budget::Lookups,
                    retry_after,
                };
            }
            return self.cached_or_refused(service, generation, now, Budget::Lookups, retry_after);
        }
        Decision::Lookup
    }

    fn cached_or_refused(
        &mut self,
        service: &ServiceName,
        generation: u64,
        now: Instant,
        budget: Budget,
        retry_after: Duration,
    ) -> Decision {
        match self.cache.get(service, self.cache_ttl, generation, now) {
            Some(resolution) => Decision::Cached {
                resolution,
                limited: Some(budget),
            },
            None => Decision::Refused {
                budget,
                retry_after,
            },
        }
    }

    /// Caches what a lookup found at `now` under `generation`; `true` if another
    /// service was evicted for it.
    pub(super) fn remember(
        &mut self,
        service: ServiceName,
        generation: u64,
        resolution: Resolution,
        now: Instant,
    ) -> bool {
        self.cache.insert(service, generation, resolution, now)
    }

    /// Forgets the cached resolution of `service` (its registrations here changed).
    pub(super) fn forget(&mut self, service: &ServiceName) {
        self.cache.remove(service);
    }
}

#[cfg(test)]
mod tests {
    use super::super::resolve_cache::tests::{resolution, service};
    use super::*;

    fn config() -> RegistryConfig {
        RegistryConfig {
            cache_ttl: Duration::from_secs(5),
            cache_capacity: 8,
            fresh_per_sec: 1,
            fresh_burst: 1,
            lookups_per_sec: 1,
            lookups_burst: 2,
            ..RegistryConfig::default()
        }
    }

    fn is_lookup(decision: &Decision) -> bool {
        matches!(decision, Decision::Lookup)
    }

    /// A gate made at `t0` that holds service `a` resolved at `t0`.
    fn with_a_cached(config: &RegistryConfig) -> (ResolveGate, ServiceName, Instant) {
        let t0 = Instant::now();
        let mut gate = ResolveGate::new(config, t0);
        let a = service("a");
        gate.remember(a.clone(), 0, resolution("a", 5), t0);
        (gate, a, t0)
    }

    #[test]
    fn a_cached_service_is_answered_without_a_lookup_until_it_expires() {
        let t0 = Instant::now();
        let mut gate = ResolveGate::new(&config(), t0);
        let a = service("a");
        assert!(is_lookup(&gate.decide(&a, false, false, 0, t0)));
        gate.remember(a.clone(), 0, resolution("a", 5), t0);
        for _ in 0..10 {
            let Decision::Cached {
                resolution,
                limited: None,
            } = gate.decide(&a, false, false, 0, t0)
            else {
                panic!("not answered from the cache");
            };
            assert!(resolution.cached);
        }
        // Expired: a lookup again (drawing the lookups budget's second token).
        let later = t0 + Duration::from_secs(5);
        assert!(is_lookup(&gate.decide(&a, false, false, 0, later)));
    }

    #[test]
    fn a_revocation_sends_a_cached_service_back_to_the_dht() {
        let (mut gate, a, t0) = with_a_cached(&config());
        assert!(is_lookup(&gate.decide(&a, false, false, 1, t0)));
    }

    #[test]
    fn ever_new_names_are_refused_once_the_lookups_budget_is_spent() {
        let t0 = Instant::now();
        let mut gate = ResolveGate::new(&config(), t0);
        assert!(is_lookup(&gate.decide(&service("n1"), false, false, 0, t0)));
        assert!(is_lookup(&gate.decide(&service("n2"), false, false, 0, t0)));
        let Decision::Refused {
            budget: Budget::Lookups,
            retry_after,
        } = gate.decide(&service("n3"), false, false, 0, t0)
        else {
            panic!("a third new name within the burst was let through");
        };
        assert_eq!(retry_after, Duration::from_secs(1));
        // The operator is not budgeted.
        assert!(is_lookup(&gate.decide(&service("n3"), false, true, 0, t0)));
        // A second later, one more token.
        let later = t0 + Duration::from_secs(1);
        assert!(is_lookup(&gate.decide(
            &service("n3"),
            false,
            false,
            0,
            later
        )));
    }

    #[test]
    fn a_fresh_resolution_over_budget_falls_back_to_the_cache_or_is_refused() {
        let (mut gate, a, t0) = with_a_cached(&config());
        // The one fresh token: a lookup despite the cache.
        assert!(is_lookup(&gate.decide(&a, true, false, 0, t0)));
        // Over the fresh budget: the cached answer, saying which budget sent it there.
        let Decision::Cached {
            resolution,
            limited: Some(Budget::Fresh),
        } = gate.decide(&a, true, false, 0, t0)
        else {
            panic!("not served from the cache");
        };
        assert!(resolution.cached);
        // Over it with nothing cached: refused.
        let decision = gate.decide(&service("b"), true, false, 0, t0);
        assert!(matches!(
            decision,
            Decision::Refused {
                budget: Budget::Fresh,
                ..
            }
        ));
        // The operator skips the cache whenever asked.
        assert!(is_lookup(&gate.decide(&a, true, true, 0, t0)));
    }

    #[test]
    fn a_fresh_resolution_over_the_lookups_budget_falls_back_to_the_cache() {
        let (mut gate, a, t0) = with_a_cached(&RegistryConfig {
            fresh_burst: 10,
            ..config()
        });
        assert!(is_lookup(&gate.decide(&a, true, false, 0, t0)));
        assert!(is_lookup(&gate.decide(&a, true, false, 0, t0)));
        let decision = gate.decide(&a, true, false, 0, t0);
        assert!(matches!(
            decision,
            Decision::Cached {
                limited: Some(Budget::Lookups),
                ..
            }
        ));
        let decision = gate.decide(&service("b"), true, false, 0, t0);
        assert!(matches!(
            decision,
            Decision::Refused {
                budget: Budget::Lookups,
                ..
            }
        ));
    }

    #[test]
    fn a_forgotten_service_is_looked_up_again() {
        let (mut gate, a, t0) = with_a_cached(&config());
        gate.forget(&a);
        assert!(is_lookup(&gate.decide(&a, false, false, 0, t0)));
    }
}
