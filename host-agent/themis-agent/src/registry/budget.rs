//! Token buckets: the budget of an operation that costs the DHT work (each
//! resolution that is not answered from the cache costs `replicas + 1` lookups), or
//! that hands out what must stay scarce (a workload's delegated keys). Sans-IO: the
//! caller passes the time.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::{Duration, Instant};

/// `per_sec` tokens a second, at most `burst` saved up; full at the start.
pub(super) struct TokenBucket {
    per_sec: f64,
    burst: f64,
    tokens: f64,
    at: Instant,
}

/// How long an empty bucket that never refills asks a caller to wait.
const NEVER_REFILLS: Duration = Duration::from_secs(60);

impl TokenBucket {
    /// A full bucket at `now` (`burst` at least one token).
    pub(super) fn new(per_sec: u32, burst: u32, now: Instant) -> Self {
        let burst = f64::from(burst.max(1));
        TokenBucket {
            per_sec: f64::from(per_sec),
            burst,
            tokens: burst,
            at: now,
        }
    }

    /// `per_minute` tokens a minute, at most `burst` saved up; full at `now`.
    fn per_minute(per_minute: u32, burst: u32, now: Instant) -> Self {
        TokenBucket {
            per_sec: f64::from(per_minute) / 60.0,
            ..TokenBucket::new(0, burst, now)
        }
    }

    /// Whether the bucket holds its whole burst at `now` (as a new one would).
    fn is_full(&mut self, now: Instant) -> bool {
        self.refill(now);
        self.tokens >= self.burst
    }

    fn refill(&mut self, now: Instant) {
        let earned = now.saturating_duration_since(self.at).as_secs_f64() * self.per_sec;
        self.tokens = (self.tokens + earned).min(self.burst);
        self.at = self.at.max(now);
    }

    /// Takes a token at `now`, or says how long until one is available.
    pub(super) fn take(&mut self, now: Instant) -> Result<(), Duration> {
        self.refill(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            return Ok(());
        }
        if self.per_sec <= 0.0 {
            return Err(NEVER_REFILLS);
        }
        Err(Duration::from_secs_f64((1.0 - self.tokens) / self.per_sec))
    }
}

/// One [`TokenBucket`] per key (a workload, say), `per_minute` tokens a minute and
/// `burst` saved up each. A bucket that has refilled is forgotten once more than
/// [`PerKey::FORGET_OVER`] are held: it is the same as a new one.
pub(super) struct PerKey<K> {
    per_minute: u32,
    burst: u32,
    buckets: HashMap<K, TokenBucket>,
}

impl<K: Eq + Hash + Clone> PerKey<K> {
    /// Buckets this many are held before the full ones are forgotten.
    const FORGET_OVER: usize = 1024;

    pub(super) fn new(per_minute: u32, burst: u32) -> Self {
        PerKey {
            per_minute,
            burst,
            buckets: HashMap::new(),
        }
    }

    /// Takes one of `key`'s tokens at `now`, or says how long until one is available.
    pub(super) fn take(&mut self, key: &K, now: Instant) -> Result<(), Duration> {
        if self.buckets.len() > Self::FORGET_OVER {
            self.buckets.retain(|_, bucket| !bucket.is_full(now));
        }
        let (per_minute, burst) = (self.per_minute, self.burst);
        self.buckets
            .entry(key.clone())
            .or_insert_with(|| TokenBucket::per_minute(per_minute, burst, now))
            .take(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_then_refusals_with_the_wait_until_the_next_token() {
        let t0 = Instant::now();
        let mut bucket = TokenBucket::new(10, 3, t0);
        for _ in 0..3 {
            assert_eq!(bucket.take(t0), Ok(()));
        }
        let wait = bucket.take(t0).unwrap_err();
        assert_eq!(wait, Duration::from_millis(100));
        // Not yet earned a whole token...
        assert!(bucket.take(t0 + Duration::from_millis(50)).is_err());
        // ...and then it has.
        assert_eq!(bucket.take(t0 + Duration::from_millis(100)), Ok(()));
        assert!(bucket.take(t0 + Duration::from_millis(100)).is_err());
    }

    #[test]
    fn a_long_idle_saves_up_no_more_than_the_burst() {
        let t0 = Instant::now();
        let mut bucket = TokenBucket::new(10, 2, t0);
        let later = t0 + Duration::from_secs(3600);
        assert_eq!(bucket.take(later), Ok(()));
        assert_eq!(bucket.take(later), Ok(()));
        assert!(bucket.take(later).is_err());
    }

    #[test]
    fn a_zero_rate_allows_the_burst_then_never_refills() {
        let t0 = Instant::now();
        let mut bucket = TokenBucket::new(0, 0, t0);
        assert_eq!(bucket.take(t0), Ok(()), "a burst of zero still allows one");
        let later = t0 + Duration::from_secs(3600);
        assert_eq!(bucket.take(later), Err(NEVER_REFILLS));
    }

    #[test]
    fn a_clock_that_goes_back_earns_nothing() {
        let t0 = Instant::now() + Duration::from_secs(10);
        let mut bucket = TokenBucket::new(10, 1, t0);
        assert_eq!(bucket.take(t0), Ok(()));
        assert!(bucket.take(t0 - Duration::from_secs(5)).is_err());
    }

    #[test]
    fn each_key_has_its_own_budget_and_full_ones_are_forgotten() {
        let t0 = Instant::now();
        let mut budget = PerKey::new(60, 2);
        assert_eq!(budget.take(&"a", t0), Ok(()));
        assert_eq!(budget.take(&"a", t0), Ok(()));
        assert_eq!(budget.take(&"a", t0), Err(Duration::from_secs(1)));
        assert_eq!(budget.take(&"b", t0), Ok(()), "another key is not charged");
        assert_eq!(budget.take(&"a", t0 + Duration::from_secs(1)), Ok(()));
        // However many keys, spent buckets are kept; refilled ones are forgotten.
        let mut many = PerKey::new(1, 1);
        let n = PerKey::<u32>::FORGET_OVER as u32;
        for key in 0..=n {
            assert_eq!(many.take(&key, t0), Ok(()));
        }
        assert!(many.take(&0, t0).is_err(), "a spent bucket is kept");
        let later = t0 + Duration::from_secs(61);
        assert_eq!(many.take(&(n + 1), later), Ok(()));
        assert_eq!(many.buckets.len(), 1, "the refilled ones are forgotten");
    }
}
