//! What keeps a responder cheap to flood: sans-IO guards that a driver keeps per
//! listener (per worker in Envoy) and consults before any public-key work.
//!
//! * [`HelloGuard`]: the freshness window of message 1 (`timestamp_ms`, signed by the
//!   initiator) and a bounded cache of the Hellos seen within it. A Hello outside the
//!   window is refused (`Stale`) and a Hello already seen (`Replayed`) before any
//!   signature check, key generation or agreement: a replay costs one SHA-256.
//!   [`HelloGuard::peek`] runs these checks (and the other cheap ones) on a stream's
//!   first bytes for a driver that charges a [`HandshakeBudget`].
//! * [`SourceLimiter`]: a token bucket per source address, in a bounded table, for
//!   the handshakes a source may start.
//! * [`HandshakeBudget`]: the expensive answers (signature check, key generation,
//!   agreement, signature) one responder gives per second, whoever asks, with a share
//!   reserved for sources that recently completed a handshake ("known good"), so a
//!   flood from new addresses, each under its own bucket, cannot starve the peers
//!   already talking to it ("under load").
//!
//! All take the time as an argument (Unix milliseconds) and never allocate for a
//! message that has not proved itself: the replay cache learns a Hello only after its
//! signature verified, the known-good table a source only after its handshake was
//! confirmed, and a source table entry is the only state a connection attempt creates,
//! bounded by the table's capacity. See `docs/PROTOCOL.md` §3.5.

use alloc::collections::{BTreeMap, BTreeSet};
use core::net::IpAddr;

use crate::identity::{PeerId, PublicIdentity};
use crate::wire::{self, Hello, Kind};

/// How far a Hello's timestamp may be from the responder's clock, either way.
pub const DEFAULT_HELLO_WINDOW_MS: u64 = 60_000;

/// Hellos remembered per guard by default.
pub const DEFAULT_REPLAY_CACHE_ENTRIES: usize = 4096;

/// The key a Hello is remembered by: the first 16 bytes of its signature digest
/// (which covers every field, nonce and timestamp included). Finding another valid
/// Hello with the same key is a 2^128 second-preimage search.
pub type HelloKey = [u8; 16];

/// Why [`HelloGuard::check`] refused a Hello.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Freshness {
    /// The timestamp is outside the window.
    Stale,
    /// This Hello was seen within the window.
    Replayed,
}

/// What [`HelloGuard::peek`] says about a stream's first bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peek {
    /// Message 1 is not complete yet: read more.
    More,
    /// A Hello that passes every check before the signature: answering it costs the
    /// full handshake (the [`HandshakeBudget`] decides).
    Fresh,
    /// Refused by the handshake without public-key work (or not a Hello at all).
    Cheap,
}

/// The key [`HelloGuard`] remembers a Hello by, from its encoded body: the first 16
/// bytes of the digest its signature covers (`H("themis/1 hello signature" ‖ body)`,
/// `docs/PROTOCOL.md` §3.1, the digest `handshake` signs and checks).
fn hello_key(body_bytes: &[u8]) -> HelloKey {
    let mut key: HelloKey = [0; 16];
    key.copy_from_slice(&crate::transcript::hello(body_bytes)[..16]);
    key
}

/// The freshness window and the Hellos seen within it.
///
/// An entry lives until its Hello's timestamp leaves the window (`timestamp +
/// window`): after that the Hello is refused as stale anyway. When the cache is full
/// of live entries the one that expires first is forgotten ([`HelloGuard::evicted`]
/// counts them) rather than refusing new Hellos: the cache is a cost saving, not the
/// security argument (a replayed Hello never passes message 3), and refusing when full
/// would let anyone who can sign Hellos (every key pair makes a valid id) shut out
/// every new caller. A forgotten Hello replayed costs what any fresh Hello costs.
#[derive(Debug, Clone)]
pub struct HelloGuard {
    window_ms: u64,
    capacity: usize,
    /// Key → expiry (ms).
    seen: BTreeMap<HelloKey, u64>,
    /// (expiry, key), the first to expire first.
    by_expiry: BTreeSet<(u64, HelloKey)>,
    evicted: u64,
}

impl Default for HelloGuard {
    fn default() -> Self {
        HelloGuard::new(DEFAULT_HELLO_WINDOW_MS, DEFAULT_REPLAY_CACHE_ENTRIES)
    }
}

impl HelloGuard {
    /// A guard accepting timestamps within `window_ms` of the clock and remembering up
    /// to `capacity` Hellos (0: the window alone, no replay cache).
    pub fn new(window_ms: u64, capacity: usize) -> Self {
        HelloGuard {
            window_ms,
            capacity,
            seen: BTreeMap::new(),
            by_expiry: BTreeSet::new(),
            evicted: 0,
        }
    }

    /// The window, either way, in milliseconds.
    pub fn window_ms(&self) -> u64 {
        self.window_ms
    }

    /// Hellos remembered now (expired ones included until the next call).
    pub fn len(&self) -> usize {
        self.seen.len()
    }

    /// True if no Hello is remembered.
    pub fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }

    /// Live entries forgotten so far because the cache was full.
    pub fn evicted(&self) -> u64 {
        self.evicted
    }

    /// Checks a Hello's timestamp and key at `now_ms`; no state changes but the
    /// dropping of expired entries.
    pub fn check(
        &mut self,
        timestamp_ms: u64,
        key: &HelloKey,
        now_ms: u64,
    ) -> Result<(), Freshness> {
        self.expire(now_ms);
        if timestamp_ms.abs_diff(now_ms) > self.window_ms {
            return Err(Freshness::Stale);
        }
        match self.seen.contains_key(key) {
            true => Err(Freshness::Replayed),
            false => Ok(()),
        }
    }

    /// Remembers a Hello whose signature verified (and which [`HelloGuard::check`]
    /// accepted) until its timestamp leaves the window.
    pub fn remember(&mut self, timestamp_ms: u64, key: HelloKey, now_ms: u64) {
        if self.capacity == 0 {
            return;
        }
        self.expire(now_ms);
        if self.seen.contains_key(&key) {
            return;
        }
        if self.seen.len() >= self.capacity {
            if let Some(oldest) = self.by_expiry.pop_first() {
                self.seen.remove(&oldest.1);
                self.evicted += 1;
            }
        }
        let expires = timestamp_ms.saturating_add(self.window_ms);
        self.seen.insert(key, expires);
        self.by_expiry.insert((expires, key));
    }

    /// Remembers the whole message 1 `hello`, whose signature a handshake verified
    /// without this guard (with one of capacity 0, so that the guard's lock is not
    /// held across the public-key work), unless this guard refuses it now: `false` if
    /// it is stale, was seen meanwhile (a replay raced it on another connection), or
    /// is not a Hello. Check and remember are one step, so of two racing copies only
    /// one is claimed.
    pub fn claim(&mut self, hello: &[u8], now_ms: u64) -> bool {
        let Ok(signed) = Hello::decode(hello) else {
            return false;
        };
        let (timestamp_ms, key) = (
            signed.message.body.timestamp_ms,
            hello_key(signed.body_bytes),
        );
        if self.check(timestamp_ms, &key, now_ms).is_err() {
            return false;
        }
        self.remember(timestamp_ms, key, now_ms);
        true
    }

    /// The checks that come before any public-key work, on the first bytes `buf` a
    /// peer sent on a stream, for a driver that charges a [`HandshakeBudget`] only for
    /// Hellos that would cost a full answer: [`Peek::More`] until message 1 is
    /// complete (it is at most [`Kind::max_len`] bytes: anything longer is
    /// [`Peek::Cheap`]), then [`Peek::Fresh`] if it is a Hello to `me` (mesh and id),
    /// whose initiator key hashes to its id, within the window and not seen, and
    /// [`Peek::Cheap`] for anything else (the handshake refuses it without public-key
    /// work: not a Hello, malformed, stale, replayed, for someone else). Changes no
    /// state but the dropping of expired entries; the handshake checks it all again.
    pub fn peek(&mut self, buf: &[u8], me: &PublicIdentity, now_ms: u64) -> Peek {
        match buf.get(..2).map(wire::peek_kind) {
            None => return Peek::More,
            Some(Ok(Kind::Hello)) => {}
            Some(_) => return Peek::Cheap,
        }
        let len = match wire::frame_len(buf) {
            Ok(None) => return Peek::More,
            Ok(Some(len)) => len,
            Err(_) => return Peek::Cheap,
        };
        let Ok(signed) = Hello::decode(&buf[..len]) else {
            return Peek::Cheap;
        };
        let body = &signed.message.body;
        let fresh = self
            .check(body.timestamp_ms, &hello_key(signed.body_bytes), now_ms)
            .is_ok()
            && body.mesh == me.mesh().as_str()
            && body.responder_id == me.id().0
            && PeerId::derive(&body.initiator_key, body.mesh).0 == body.initiator_id;
        match fresh {
            true => Peek::Fresh,
            false => Peek::Cheap,
        }
    }

    /// Drops the entries whose Hellos are stale at `now_ms`.
    fn expire(&mut self, now_ms: u64) {
        while let Some(&(expires, key)) = self.by_expiry.first() {
            if expires >= now_ms {
                break;
            }
            self.by_expiry.pop_first();
            self.seen.remove(&key);
        }
    }
}

/// A token bucket's shape: `per_second` tokens added each second, up to `burst`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    /// Sustained handshakes per second.
    pub per_second: u32,
    /// Handshakes allowed at once after a quiet period.
    pub burst: u32,
}

/// Source table entries by default.
pub const DEFAULT_SOURCE_ENTRIES: usize = 4096;

/// A bucket, in thousandths of a token.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    milli_tokens: u64,
    refilled_ms: u64,
}

/// A token bucket per source address, in a table of bounded size.
///
/// When the table is full, a new source replaces the one refilled least recently:
/// that one's bucket is the likeliest to be full again, and a full bucket is the same
/// as no entry. An attacker with more addresses than the table holds can cycle its
/// entries back to a full burst; the table bounds memory, not that attacker.
#[derive(Debug, Clone)]
pub struct SourceLimiter {
    rate: Rate,
    capacity: usize,
    buckets: BTreeMap<IpAddr, Bucket>,
    /// (refilled, source), least recently refilled first.
    by_refill: BTreeSet<(u64, IpAddr)>,
}

impl SourceLimiter {
    /// A limiter with buckets of `rate` for up to `capacity` sources (at least 1).
    pub fn new(rate: Rate, capacity: usize) -> Self {
        SourceLimiter {
            rate,
            capacity: capacity.max(1),
            buckets: BTreeMap::new(),
            by_refill: BTreeSet::new(),
        }
    }

    /// Sources in the table.
    pub fn len(&self) -> usize {
        self.buckets.len()
    }

    /// True if the table is empty.
    pub fn is_empty(&self) -> bool {
        self.buckets.is_empty()
    }

    /// Takes a token from `source`'s bucket at `now_ms`; `false` if it has none.
    pub fn allow(&mut self, source: IpAddr, now_ms: u64) -> bool {
        const TOKEN: u64 = 1000;
        let full = u64::from(self.rate.burst) * TOKEN;
        let mut bucket = match self.buckets.get(&source) {
            Some(&b) => {
                self.by_refill.remove(&(b.refilled_ms, source));
                let elapsed = now_ms.saturating_sub(b.refilled_ms);
                Bucket {
                    milli_tokens: b
                        .milli_tokens
                        .saturating_add(elapsed.saturating_mul(u64::from(self.rate.per_second)))
                        .min(full),
                    // A clock that steps back mints nothing and re-anchors here (else
                    // no bucket would refill until it caught up again).
                    refilled_ms: now_ms,
                }
            }
            None => {
                if self.buckets.len() >= self.capacity {
                    if let Some((_, gone)) = self.by_refill.pop_first() {
                        self.buckets.remove(&gone);
                    }
                }
                Bucket {
                    milli_tokens: full,
                    refilled_ms: now_ms,
                }
            }
        };
        let allowed = bucket.milli_tokens >= TOKEN;
        if allowed {
            bucket.milli_tokens -= TOKEN;
        }
        self.buckets.insert(source, bucket);
        self.by_refill.insert((bucket.refilled_ms, source));
        allowed
    }
}

/// Expensive handshakes a responder answers by default, per second (per worker in
/// Envoy): far above what pooled connections need, far below what a flood sends.
pub const DEFAULT_HANDSHAKE_BUDGET: Rate = Rate {
    per_second: 200,
    burst: 400,
};

/// The share of the budget reserved for known-good sources, by default (percent).
pub const DEFAULT_KNOWN_GOOD_PERCENT: u8 = 50;

/// How long a source stays known good after its last confirmed handshake, by default.
pub const DEFAULT_KNOWN_GOOD_MS: u64 = 600_000;

/// Known-good sources remembered by default.
pub const DEFAULT_KNOWN_GOOD_ENTRIES: usize = 1024;

/// The highest known-good share: at 100 % no new peer could ever complete a
/// handshake (and so never become known good).
pub const MAX_KNOWN_GOOD_PERCENT: u8 = 90;

/// The shape of a [`HandshakeBudget`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BudgetConfig {
    /// Expensive handshakes per second and at once, every source together.
    pub rate: Rate,
    /// The part of `rate` (rate and burst, 0..=[`MAX_KNOWN_GOOD_PERCENT`]) only
    /// known-good sources may use; the rest is open to every source.
    pub known_good_percent: u8,
    /// How long a source stays known good after a confirmed handshake.
    pub known_good_ms: u64,
    /// Known-good sources remembered (at least 1); when full, the one confirmed
    /// least recently is forgotten.
    pub known_good_entries: usize,
}

impl Default for BudgetConfig {
    fn default() -> Self {
        BudgetConfig {
            rate: DEFAULT_HANDSHAKE_BUDGET,
            known_good_percent: DEFAULT_KNOWN_GOOD_PERCENT,
            known_good_ms: DEFAULT_KNOWN_GOOD_MS,
            known_good_entries: DEFAULT_KNOWN_GOOD_ENTRIES,
        }
    }
}

/// What [`HandshakeBudget::allow`] decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Answer it, from the reserved share (a known-good source).
    Reserved,
    /// Answer it, from the open share.
    Open,
    /// Over the budget: refuse it now, before any public-key work.
    Busy,
}

impl Admission {
    /// True unless [`Admission::Busy`].
    pub fn admitted(self) -> bool {
        self != Admission::Busy
    }
}

/// One share's bucket, in millionths of a handshake (so that a percentage of any
/// integer rate refills exactly).
#[derive(Debug, Clone, Copy)]
struct Share {
    micro: u64,
    refilled_ms: u64,
    /// Millionths added per millisecond.
    per_ms: u64,
    full: u64,
}

const MICRO: u64 = 1_000_000;

impl Share {
    fn new(rate: Rate, percent: u64) -> Self {
        // per_second × 10^6 / 1000 per ms, × percent / 100.
        let per_ms = u64::from(rate.per_second) * 10 * percent;
        let mut full = u64::from(rate.burst) * 10_000 * percent;
        if percent > 0 {
            // A share that exists holds at least one handshake.
            full = full.max(MICRO);
        }
        Share {
            micro: full,
            refilled_ms: 0,
            per_ms,
            full,
        }
    }

    fn take(&mut self, now_ms: u64) -> bool {
        let elapsed = now_ms.saturating_sub(self.refilled_ms);
        self.micro = self
            .micro
            .saturating_add(elapsed.saturating_mul(self.per_ms))
            .min(self.full);
        // A clock that steps back mints nothing and re-anchors here (else the budget
        // would stay empty until it caught up again).
        self.refilled_ms = now_ms;
        let allowed = self.micro >= MICRO;
        if allowed {
            self.micro -= MICRO;
        }
        allowed
    }
}

/// The expensive handshakes one responder answers ("under load"), with a share
/// reserved for the sources it knows.
///
/// The rule: the budget (`rate`) is split in two token buckets. The *reserved* share
/// (`known_good_percent` of the rate and of the burst) is drawn only by known-good
/// sources: addresses whose handshake was confirmed (message 3, and, in the
/// drivers, allowed by the policy) within `known_good_ms`. The *open* share (the
/// rest) is drawn by every source, known-good ones once their reserved share is empty.
/// A fresh Hello that finds no token is refused at once ([`Admission::Busy`]), before
/// any public-key work. So a flood from new addresses can take the open share and
/// no more: the peers already talking to this responder keep the reserved share for
/// their new connections, and their pooled connections need no handshake at all.
///
/// A driver charges the budget only for Hellos that pass every cheaper check
/// ([`HelloGuard::peek`] says [`Peek::Fresh`], and the source's own
/// [`SourceLimiter`] bucket): a replay or a stale Hello costs it nothing.
///
/// State: two buckets and the known-good table, which learns a source only from a
/// confirmed handshake (never from an unauthenticated message) and holds at most
/// `known_good_entries`, forgetting the least recently confirmed when full.
#[derive(Debug, Clone)]
pub struct HandshakeBudget {
    config: BudgetConfig,
    reserved: Share,
    open: Share,
    /// Source → when its last handshake was confirmed (ms).
    known: BTreeMap<IpAddr, u64>,
    /// (confirmed, source), the least recently confirmed first.
    by_confirmed: BTreeSet<(u64, IpAddr)>,
}

impl Default for HandshakeBudget {
    fn default() -> Self {
        HandshakeBudget::new(BudgetConfig::default())
    }
}

impl HandshakeBudget {
    /// A budget of this shape, both shares full. A `known_good_percent` above
    /// [`MAX_KNOWN_GOOD_PERCENT`] is taken as that.
    pub fn new(config: BudgetConfig) -> Self {
        let percent = u64::from(config.known_good_percent.min(MAX_KNOWN_GOOD_PERCENT));
        HandshakeBudget {
            config: BudgetConfig {
                known_good_entries: config.known_good_entries.max(1),
                ..config
            },
            reserved: Share::new(config.rate, percent),
            open: Share::new(config.rate, 100 - percent),
            known: BTreeMap::new(),
            by_confirmed: BTreeSet::new(),
        }
    }

    /// The shape it was made with.
    pub fn config(&self) -> &BudgetConfig {
        &self.config
    }

    /// Known-good sources remembered now (expired ones included until the next call).
    pub fn known_good(&self) -> usize {
        self.known.len()
    }

    /// Whether `source` is known good at `now_ms`.
    pub fn is_known_good(&mut self, source: IpAddr, now_ms: u64) -> bool {
        self.expire(now_ms);
        self.known.contains_key(&source)
    }

    /// Charges one expensive handshake from `source` at `now_ms`: the reserved share
    /// first if `source` is known good, then the open share; [`Admission::Busy`] if
    /// neither has a token. Creates no state.
    pub fn allow(&mut self, source: IpAddr, now_ms: u64) -> Admission {
        if self.is_known_good(source, now_ms) && self.reserved.take(now_ms) {
            return Admission::Reserved;
        }
        match self.open.take(now_ms) {
            true => Admission::Open,
            false => Admission::Busy,
        }
    }

    /// A driver's one step for the first bytes `first` a peer sent on a stream to `me`:
    /// `None` until message 1 is complete ([`Peek::More`]); then [`Admission::Open`]
    /// uncharged for what the handshake refuses cheaply anyway ([`Peek::Cheap`]), and
    /// for a fresh Hello ([`Peek::Fresh`]) the charge from `source` (or from the open
    /// share, for a source the driver cannot name).
    pub fn charge_first(
        &mut self,
        guard: &mut HelloGuard,
        first: &[u8],
        me: &PublicIdentity,
        source: Option<IpAddr>,
        now_ms: u64,
    ) -> Option<Admission> {
        match guard.peek(first, me, now_ms) {
            Peek::More => None,
            Peek::Cheap => Some(Admission::Open),
            Peek::Fresh => Some(match source {
                Some(source) => self.allow(source, now_ms),
                None => self.allow_unknown(now_ms),
            }),
        }
    }

    /// Charges a handshake from a source the driver cannot name (not an IP): the open
    /// share only.
    pub fn allow_unknown(&mut self, now_ms: u64) -> Admission {
        match self.open.take(now_ms) {
            true => Admission::Open,
            false => Admission::Busy,
        }
    }

    /// `source` completed a handshake at `now_ms` (the driver calls this once the
    /// peer proved its id, and was allowed): it is known good for `known_good_ms`.
    pub fn confirmed(&mut self, source: IpAddr, now_ms: u64) {
        self.expire(now_ms);
        if let Some(at) = self.known.remove(&source) {
            self.by_confirmed.remove(&(at, source));
        } else if self.known.len() >= self.config.known_good_entries {
            if let Some((_, gone)) = self.by_confirmed.pop_first() {
                self.known.remove(&gone);
            }
        }
        self.known.insert(source, now_ms);
        self.by_confirmed.insert((now_ms, source));
    }

    /// Forgets the sources confirmed longer than `known_good_ms` before `now_ms`.
    fn expire(&mut self, now_ms: u64) {
        while let Some(&(at, source)) = self.by_confirmed.first() {
            if at.saturating_add(self.config.known_good_ms) >= now_ms {
                break;
            }
            self.by_confirmed.pop_first();
            self.known.remove(&source);
        }
    }
}
