//! Resolving a service: the [gate](super::gate) decides whether the cache answers,
//! a budget refuses, or the DHT is asked; what the DHT returns is
//! [judged](super::verdicts) against the mesh root and the revocations. `explain`
//! always asks the DHT and shows every verdict with the trust log behind it.

use std::time::{Duration, Instant};

use super::gate::{Budget, Decision};
use super::verdicts::{judge, leaves_behind, Judged};
use super::{Explanation, Registry, RegistryError, Resolution, Verdict};
use crate::names::ServiceName;

impl Registry {
    /// The live, endorsed instances of `service`, from the cache unless `fresh` (or
    /// a revocation arrived since it was cached). Fresh lookups draw from a budget,
    /// and every lookup that misses the cache from another, unless `unbudgeted` (the
    /// node's operator).
    pub async fn resolve(
        &self,
        service: &ServiceName,
        fresh: bool,
        unbudgeted: bool,
    ) -> Result<Resolution, RegistryError> {
        let generation = self.trust.generation();
        let decision = self
            .gate()
            .decide(service, fresh, unbudgeted, generation, Instant::now());
        match decision {
            Decision::Cached {
                resolution,
                limited,
            } => {
                if let Some(budget) = limited {
                    self.count_limited(budget, "served_cached");
                }
                self.metrics.resolve_cache(true);
                return Ok(resolution);
            }
            Decision::Refused {
                budget,
                retry_after,
            } => {
                self.count_limited(budget, "refused");
                return Err(self.over_budget(budget, retry_after));
            }
            Decision::Lookup => {}
        }
        self.metrics.resolve_cache(false);
        let (resolution, _) = self.lookup(service).await?;
        let evicted = self.gate().remember(
            service.clone(),
            generation,
            resolution.clone(),
            Instant::now(),
        );
        if evicted {
            self.metrics.resolve_cache_evicted();
        }
        Ok(resolution)
    }

    /// Counts a resolution over `budget`, served from the cache or refused (`outcome`).
    fn count_limited(&self, budget: Budget, outcome: &'static str) {
        match budget {
            Budget::Fresh => self.metrics.resolve_fresh_limited(outcome),
            Budget::Lookups => self.metrics.resolve_lookups_limited(outcome),
        }
    }

    /// The refusal of a resolution over `budget`.
    fn over_budget(&self, budget: Budget, retry_after: Duration) -> RegistryError {
        match budget {
            Budget::Fresh => RegistryError::RateLimited {
                per_sec: self.config.fresh_per_sec,
                retry_after,
            },
            Budget::Lookups => RegistryError::LookupsLimited {
                per_sec: self.config.lookups_per_sec,
                retry_after,
            },
        }
    }

    /// Every value stored for `service` (all replicas), with why it is or is not
    /// trusted.
    pub async fn explain(&self, service: &ServiceName) -> Result<Explanation, RegistryError> {
        let (resolution, mut verdicts) = self.lookup(service).await?;
        // The log's leaves behind each verdict, with their proofs.
        let log = self.trust.log().status();
        for verdict in &mut verdicts {
            verdict.log = leaves_behind(verdict, service, &log.leaves);
        }
        Ok(Explanation {
            service: service.clone(),
            mesh_root: self.trust.root().to_string(),
            answered: resolution.answered,
            replicas: resolution.replicas,
            values: verdicts,
            instances: resolution.instances,
            log_checkpoint: log.checkpoint,
        })
    }

    /// Resolves `service` in the DHT, verifies every value against the mesh root and
    /// the revocations, and keeps the newest record of each instance.
    async fn lookup(
        &self,
        service: &ServiceName,
    ) -> Result<(Resolution, Vec<Verdict>), RegistryError> {
        let found = self
            .overlay
            .resolve(service.as_str().as_bytes(), self.config.replicas)
            .await?;
        let judged = judge(
            &found.values,
            service,
            self.overlay.mesh(),
            &self.trust,
            &self.metrics,
        );
        let refused = judged.refused();
        let Judged {
            instances,
            verdicts,
        } = judged;
        let resolution = Resolution {
            service: service.clone(),
            instances,
            cached: false,
            refused,
            answered: found.answered,
            replicas: found.replicas,
        };
        Ok((resolution, verdicts))
    }
}
