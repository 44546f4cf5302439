//! One-hop routing: the full, verified membership of the ring, and what this node has
//! seen itself of its members' liveness.
//!
//! Chord's multi-hop lookup trusts every node on the path; colluders that answer with
//! one of their own at or past the key cannot be told from the truth (see the crate
//! documentation). When every node knows every member — the admitted node keys come
//! from the trust log, each with an address signed by that key — a node computes the
//! replica holders of `h(name ‖ r)` itself and asks them directly: there is no path
//! left to hijack. This is Dynamo's zero-hop DHT and Gupta–Liskov–Rodrigues' one-hop
//! routing, with the membership verified rather than gossiped on trust (as in
//! Fireflies).
//!
//! Liveness is the one thing that cannot be verified offline, so it is never taken
//! from peers: a member is passed over only while *this* node has seen it fail
//! (a request of ours timed out) or heard its own signed farewell, and even then for a
//! bounded time. A peer that calls a live holder dead therefore hides nothing; a peer
//! that calls a dead one alive costs one timeout, after which the next member clockwise
//! is asked.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::key::Key;
use crate::message::Contact;
use crate::Millis;

/// The ring's members, sorted by id; cheap to clone and share (a driver builds it once
/// per change of the trust log or of an address, and hands the same list to its node).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Members<A> {
    sorted: Arc<[Contact<A>]>,
}

impl<A: Clone> Members<A> {
    /// The members, in any order; a repeated id keeps its first contact.
    pub fn new(contacts: impl IntoIterator<Item = Contact<A>>) -> Self {
        let mut list: Vec<Contact<A>> = contacts.into_iter().collect();
        list.sort_by_key(|c| c.id);
        list.dedup_by(|later, first| later.id == first.id);
        Members {
            sorted: list.into(),
        }
    }

    /// How many members there are.
    pub fn len(&self) -> usize {
        self.sorted.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.sorted.is_empty()
    }

    /// The member with this id.
    pub fn get(&self, id: &Key) -> Option<&Contact<A>> {
        let at = self.sorted.binary_search_by(|c| c.id.cmp(id)).ok()?;
        Some(&self.sorted[at])
    }

    /// Every member once, clockwise from the first at or after `key` (Chord's
    /// successor of the key first).
    pub fn clockwise_from(&self, key: &Key) -> impl Iterator<Item = &Contact<A>> {
        let n = self.sorted.len();
        let at = self.sorted.partition_point(|c| &c.id < key);
        (0..n).map(move |i| &self.sorted[(at + i) % n])
    }

    /// Every member but `id` once, counter-clockwise from the one before it.
    pub fn counter_clockwise_from(&self, id: &Key) -> impl Iterator<Item = &Contact<A>> {
        let n = self.sorted.len();
        let at = self.sorted.partition_point(|c| &c.id < id);
        let id = *id;
        (1..=n)
            .map(move |i| &self.sorted[(at + n - i) % n])
            .filter(move |c| c.id != id)
    }

    /// The `i`-th member by id.
    pub fn at(&self, i: usize) -> Option<&Contact<A>> {
        self.sorted.get(i)
    }

    /// All members, by id.
    pub fn iter(&self) -> impl Iterator<Item = &Contact<A>> {
        self.sorted.iter()
    }

    /// Up to `count` distinct members other than `me`, drawn with `random` (one fresh
    /// random word; the draws are spread from it). Bounded: a few draws per member
    /// wanted, so it ends on any membership.
    pub fn random_others(&self, me: &Key, count: usize, random: u64) -> Vec<Contact<A>> {
        let n = self.sorted.len();
        let others = n - usize::from(self.get(me).is_some());
        let want = count.min(others);
        let mut out: Vec<Contact<A>> = Vec::with_capacity(want);
        let mut state = random;
        for _ in 0..want * 8 {
            if out.len() == want {
                break;
            }
            state = splitmix(state);
            let c = &self.sorted[(state % n as u64) as usize];
            if &c.id != me && !out.iter().any(|o| o.id == c.id) {
                out.push(c.clone());
            }
        }
        out
    }
}

/// SplitMix64: spreads one random word over several draws.
fn splitmix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// What this node has seen of its peers' liveness: nothing any peer said, only requests
/// of its own that went unanswered and farewells the peers sent themselves.
#[derive(Debug, Default)]
pub(crate) struct Liveness {
    /// Peers passed over, and until when.
    down: BTreeMap<Key, Millis>,
}

impl Liveness {
    /// `id` failed us (or said goodbye): pass it over until `until`.
    pub(crate) fn failed(&mut self, id: Key, until: Millis) {
        self.down.insert(id, until);
    }

    /// We heard from `id`: it is up.
    pub(crate) fn heard(&mut self, id: &Key) {
        self.down.remove(id);
    }

    /// Whether `id` is passed over now.
    pub(crate) fn is_down(&self, id: &Key, now: Millis) -> bool {
        self.down.get(id).is_some_and(|&until| until > now)
    }

    /// Forgets what has run out, and peers no longer members.
    pub(crate) fn sweep<A>(&mut self, now: Millis, members: &Members<A>)
    where
        A: Clone,
    {
        self.down
            .retain(|id, until| *until > now && members.get(id).is_some());
    }

    /// How many peers are passed over now.
    pub(crate) fn down_count(&self, now: Millis) -> usize {
        self.down.values().filter(|&&until| until > now).count()
    }
}

/// The holder of `key` as this node sees the ring now: the first member at or after it
/// that this node has not seen down, skipping at most `max_skip` down members (so that
/// a node that has seen a whole neighbourhood fail still asks someone). A request to the
/// holder that times out marks it down, so asking again reaches the next member, which
/// takes over the key while the holder is away.
pub(crate) fn holder<'m, A: Clone>(
    members: &'m Members<A>,
    liveness: &Liveness,
    key: &Key,
    now: Millis,
    max_skip: usize,
) -> Option<&'m Contact<A>> {
    let mut skipped = 0;
    for c in members.clockwise_from(key) {
        if liveness.is_down(&c.id, now) && skipped < max_skip {
            skipped += 1;
            continue;
        }
        return Some(c);
    }
    members.clockwise_from(key).next()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members(ids: &[u64]) -> Members<u64> {
        Members::new(ids.iter().map(|&i| Contact {
            id: Key::from_low(i),
            addr: i,
        }))
    }

    #[test]
    fn the_holder_is_the_first_member_at_or_after_the_key() {
        let m = members(&[50, 10, 30, 10]);
        assert_eq!(m.len(), 3, "the repeated id is kept once");
        let live = Liveness::default();
        let at = |k: u64| holder(&m, &live, &Key::from_low(k), 0, 8).map(|c| c.addr);
        assert_eq!(at(10), Some(10));
        assert_eq!(at(11), Some(30));
        assert_eq!(at(50), Some(50));
        assert_eq!(at(51), Some(10), "wraps around the ring");
    }

    #[test]
    fn a_member_seen_down_is_passed_over_for_a_while_only() {
        let m = members(&[10, 30, 50]);
        let mut live = Liveness::default();
        live.failed(Key::from_low(30), 1_000);
        let at = |live: &Liveness, now| holder(&m, live, &Key::from_low(20), now, 8);
        assert_eq!(at(&live, 999).map(|c| c.addr), Some(50));
        assert_eq!(
            at(&live, 1_000).map(|c| c.addr),
            Some(30),
            "down until 1000"
        );
        live.heard(&Key::from_low(30));
        assert_eq!(
            at(&live, 0).map(|c| c.addr),
            Some(30),
            "heard from: up again"
        );
    }

    #[test]
    fn asking_again_after_a_failure_reaches_the_next_member() {
        let m = members(&[10, 30, 50, 70]);
        let mut live = Liveness::default();
        let at = |live: &Liveness| holder(&m, live, &Key::from_low(20), 0, 8).map(|c| c.addr);
        assert_eq!(at(&live), Some(30));
        live.failed(Key::from_low(30), u64::MAX);
        live.failed(Key::from_low(50), u64::MAX);
        assert_eq!(at(&live), Some(70), "30 and 50 are down: skipped");
    }

    #[test]
    fn when_everyone_is_down_someone_is_still_asked() {
        let m = members(&[10, 30]);
        let mut live = Liveness::default();
        live.failed(Key::from_low(10), u64::MAX);
        live.failed(Key::from_low(30), u64::MAX);
        let h = holder(&m, &live, &Key::from_low(20), 0, 8);
        assert_eq!(h.map(|c| c.addr), Some(30));
        assert_eq!(
            holder(&m, &live, &Key::from_low(20), 0, 1).map(|c| c.addr),
            Some(10),
            "one skip allowed: the second down member is asked"
        );
    }

    #[test]
    fn the_sweep_forgets_expired_and_departed_peers() {
        let m = members(&[10]);
        let mut live = Liveness::default();
        live.failed(Key::from_low(10), 100);
        live.failed(Key::from_low(99), 100);
        live.sweep(50, &m);
        assert_eq!(live.down_count(50), 1, "99 is no member");
        live.sweep(100, &m);
        assert_eq!(live.down_count(0), 0);
    }

    #[test]
    fn random_others_are_distinct_never_me_and_end_on_tiny_rings() {
        let m = members(&[10, 30, 50, 70]);
        for seed in 0..50 {
            let got = m.random_others(&Key::from_low(30), 3, seed);
            assert_eq!(got.len(), 3, "seed {seed}");
            assert!(got.iter().all(|c| c.addr != 30));
            let mut ids: Vec<u64> = got.iter().map(|c| c.addr).collect();
            ids.sort_unstable();
            ids.dedup();
            assert_eq!(ids.len(), 3);
        }
        assert!(members(&[10])
            .random_others(&Key::from_low(10), 3, 1)
            .is_empty());
        assert!(members(&[])
            .random_others(&Key::from_low(10), 3, 1)
            .is_empty());
        assert_eq!(
            members(&[10, 30])
                .random_others(&Key::from_low(99), 5, 1)
                .len(),
            2
        );
    }

    #[test]
    fn counter_clockwise_skips_the_start() {
        let m = members(&[10, 30, 50]);
        let order: Vec<u64> = m
            .counter_clockwise_from(&Key::from_low(30))
            .map(|c| c.addr)
            .collect();
        assert_eq!(order, vec![10, 50]);
    }
}
