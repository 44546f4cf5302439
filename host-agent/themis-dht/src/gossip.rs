//! Epidemic spread of the trust log's growth (revocations, admissions, grants) among the
//! members, as a sans-IO state machine: push on news, pull to repair.
//!
//! What spreads is a *version* — the size of the root-signed log a node holds — and
//! what a node does about a larger one is the driver's business: fetch the missing
//! leaves from the peer that claimed it and verify them against the root's checkpoint
//! (`themis-log`). So a peer can only lie by claiming more than it has; that costs one
//! failed fetch ([`Gossip::fetch_failed`]), after which the claim is forgotten and the
//! next peer's is taken. Peers are drawn from the verified membership, never from what
//! a peer names, so colluders cannot surround a node.
//!
//! * **Push** (fast): a node that learns a newer version tells `fanout` random members
//!   at once ([`Gossip::learned`]); each of those fetches and tells `fanout` more. The
//!   news crosses `N` nodes in about `log_fanout N` network round trips, not periods.
//! * **Pull** (repair): every `period` a node tells one random member what it holds
//!   ([`Gossip::handle_timeout`]); whichever of the two is behind fetches. A node that
//!   every push missed (silent or hostile pushers) catches up within a few periods.
//!
//! Randomness is passed in (`random`, one fresh `u64` per call), as time is.

use std::collections::{BTreeMap, VecDeque};

use serde::{Deserialize, Serialize};

use crate::key::Key;
use crate::membership::Members;
use crate::message::Contact;
use crate::Millis;

/// Most claims kept waiting while a fetch runs.
pub const MAX_CLAIMS: usize = 16;

/// Tunables.
#[derive(Debug, Clone)]
pub struct GossipConfig {
    /// Members told at once of news.
    pub fanout: usize,
    /// Period of the pull round (one random member).
    pub period: Millis,
    /// How long a fetch from one peer may take before another peer's claim is taken.
    pub fetch_timeout: Millis,
    /// How long the claims of a peer whose claim did not hold are ignored.
    pub distrust_for: Millis,
}

impl Default for GossipConfig {
    fn default() -> Self {
        GossipConfig {
            fanout: 3,
            period: 2_000,
            fetch_timeout: 1_000,
            distrust_for: 600_000,
        }
    }
}

/// The one gossip message: what the sender holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Have {
    /// The size of the sender's verified log.
    pub version: u64,
}

/// What the node asks its driver to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action<A> {
    /// Send `Have` to this member.
    Send(Contact<A>, Have),
    /// This member claims `version`, more than we hold: fetch what we lack from it,
    /// verify it, then call [`Gossip::learned`] (or [`Gossip::fetch_failed`]).
    Fetch(Contact<A>, u64),
}

/// Counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GossipStats {
    /// `Have`s sent (push and pull).
    pub sent: u64,
    /// Fetches asked for.
    pub fetches: u64,
    /// Fetches that failed or timed out (a peer that claimed more than it served).
    pub failed_fetches: u64,
}

/// One member's gossip state.
#[derive(Debug)]
pub struct Gossip<A> {
    me: Key,
    config: GossipConfig,
    version: u64,
    next_pull: Millis,
    /// The fetch in flight, if any: from whom, for what, until when.
    fetching: Option<(Key, u64, Millis)>,
    /// Claims above our version not yet fetched, by claimant (at most
    /// [`MAX_CLAIMS`]); the smallest is fetched first, so a peer that claims more than
    /// anyone has is tried last.
    claims: BTreeMap<Key, (Contact<A>, u64)>,
    /// Peers whose claim did not hold, and until when their claims are ignored (at
    /// most one entry per member).
    distrusted: BTreeMap<Key, Millis>,
    actions: VecDeque<Action<A>>,
    stats: GossipStats,
}

impl<A: Clone> Gossip<A> {
    /// A member `me` that holds the log up to `version`, first pulling at `now`.
    pub fn new(me: Key, config: GossipConfig, version: u64, now: Millis) -> Self {
        Gossip {
            me,
            next_pull: now,
            config,
            version,
            fetching: None,
            claims: BTreeMap::new(),
            distrusted: BTreeMap::new(),
            actions: VecDeque::new(),
            stats: GossipStats::default(),
        }
    }

    /// The version held.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Counters.
    pub fn stats(&self) -> &GossipStats {
        &self.stats
    }

    /// Our verified log grew to `version` (the operator gave it to us, or a fetch
    /// verified): tell `fanout` random members.
    pub fn learned(&mut self, now: Millis, version: u64, members: &Members<A>, random: u64) {
        if self
            .fetching
            .as_ref()
            .is_some_and(|&(_, wanted, _)| wanted <= version)
        {
            self.fetching = None;
        }
        if version <= self.version {
            return self.next_claim(now);
        }
        self.version = version;
        self.claims.retain(|_, (_, claimed)| *claimed > version);
        for peer in members.random_others(&self.me, self.config.fanout, random) {
            self.send(peer);
        }
        self.next_claim(now);
    }

    /// The fetch from the peer we asked did not bring what it claimed (it served
    /// less, or what does not verify): its claims are ignored for `distrust_for`.
    pub fn fetch_failed(&mut self, now: Millis) {
        self.give_up_fetch(now, true);
    }

    /// The fetch ended without proving the peer a liar (it could not be reached, or
    /// what it held was no longer news): the next claim is taken, nobody distrusted.
    /// A fetch that verified calls [`Gossip::learned`] instead.
    pub fn fetch_done(&mut self, now: Millis) {
        self.give_up_fetch(now, false);
    }

    fn give_up_fetch(&mut self, now: Millis, distrust: bool) {
        if let Some((peer, _, _)) = self.fetching.take() {
            if distrust {
                self.stats.failed_fetches += 1;
                self.distrusted
                    .insert(peer, now.saturating_add(self.config.distrust_for));
            }
        }
        self.next_claim(now);
    }

    /// A member told us what it holds.
    pub fn on_have(&mut self, now: Millis, from: Contact<A>, have: Have) {
        if from.id == self.me {
            return;
        }
        let distrusted = self
            .distrusted
            .get(&from.id)
            .is_some_and(|&until| until > now);
        if have.version > self.version && !distrusted {
            if self.claims.len() < MAX_CLAIMS || self.claims.contains_key(&from.id) {
                self.claims.insert(from.id, (from, have.version));
            }
            self.next_claim(now);
        } else if have.version < self.version && !distrusted {
            // It is behind: tell it, and it fetches from us.
            self.send(from);
        }
    }

    /// Pull round and fetch timeouts.
    pub fn handle_timeout(&mut self, now: Millis, members: &Members<A>, random: u64) {
        if let Some((_, _, until)) = self.fetching {
            if until <= now {
                self.give_up_fetch(now, true);
            }
        }
        if self.next_pull <= now {
            self.next_pull = now.saturating_add(self.config.period);
            self.distrusted.retain(|_, until| *until > now);
            if let Some(peer) = members.random_others(&self.me, 1, random).pop() {
                self.send(peer);
            }
        }
    }

    /// When [`Gossip::handle_timeout`] is next due.
    pub fn poll_timeout(&self) -> Millis {
        match self.fetching {
            Some((_, _, until)) => until.min(self.next_pull),
            None => self.next_pull,
        }
    }

    /// The next thing to do.
    pub fn poll_action(&mut self) -> Option<Action<A>> {
        self.actions.pop_front()
    }

    fn send(&mut self, to: Contact<A>) {
        self.stats.sent += 1;
        let have = Have {
            version: self.version,
        };
        self.actions.push_back(Action::Send(to, have));
    }

    /// Starts a fetch of the best claim if none runs.
    fn next_claim(&mut self, now: Millis) {
        if self.fetching.is_some() {
            return;
        }
        let Some(id) = self
            .claims
            .iter()
            .filter(|(_, (_, claimed))| *claimed > self.version)
            .min_by_key(|(_, (_, claimed))| *claimed)
            .map(|(id, _)| *id)
        else {
            self.claims.clear();
            return;
        };
        let Some((from, version)) = self.claims.remove(&id) else {
            return;
        };
        self.stats.fetches += 1;
        self.fetching = Some((
            from.id,
            version,
            now.saturating_add(self.config.fetch_timeout),
        ));
        self.actions.push_back(Action::Fetch(from, version));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members(n: u64) -> Members<u64> {
        Members::new((0..n).map(|i| Contact {
            id: Key::from_low(i),
            addr: i,
        }))
    }

    fn drain(g: &mut Gossip<u64>) -> Vec<Action<u64>> {
        std::iter::from_fn(|| g.poll_action()).collect()
    }

    #[test]
    fn news_is_pushed_to_fanout_distinct_members_not_ourselves() {
        let m = members(10);
        let mut g = Gossip::new(Key::from_low(0), GossipConfig::default(), 1, 0);
        g.learned(0, 2, &m, 42);
        let sent = drain(&mut g);
        assert_eq!(sent.len(), 3);
        let mut to: Vec<u64> = sent
            .iter()
            .map(|a| match a {
                Action::Send(c, Have { version: 2 }) => c.addr,
                other => panic!("{other:?}"),
            })
            .collect();
        to.sort();
        to.dedup();
        assert_eq!(to.len(), 3);
        assert!(!to.contains(&0));
    }

    #[test]
    fn a_larger_claim_is_fetched_once_and_a_false_one_costs_one_fetch() {
        let m = members(10);
        let mut g = Gossip::new(Key::from_low(0), GossipConfig::default(), 5, 0);
        let liar = m.get(&Key::from_low(3)).cloned().expect("member");
        let honest = m.get(&Key::from_low(4)).cloned().expect("member");
        g.on_have(0, liar.clone(), Have { version: u64::MAX });
        assert_eq!(drain(&mut g), vec![Action::Fetch(liar.clone(), u64::MAX)]);
        assert_eq!(g.version(), 5, "a claim is not a version");
        // While that fetch runs, a smaller honest claim waits; the lie fails.
        g.on_have(1, honest.clone(), Have { version: 6 });
        assert!(drain(&mut g).is_empty(), "one fetch at a time");
        g.fetch_failed(10);
        assert_eq!(drain(&mut g), vec![Action::Fetch(honest, 6)]);
        g.learned(30, 6, &m, 7);
        assert_eq!(g.version(), 6);
        assert_eq!(g.stats().failed_fetches, 1);
        // The liar's claims are ignored for a while: no second fetch, and not told.
        assert!(drain(&mut g)
            .iter()
            .all(|a| matches!(a, Action::Send(_, Have { version: 6 }))));
        g.on_have(40, liar.clone(), Have { version: u64::MAX });
        g.on_have(40, liar.clone(), Have { version: 1 });
        assert!(drain(&mut g).is_empty());
        let later = 10 + GossipConfig::default().distrust_for;
        // A fetch that merely found nothing new distrusts nobody.
        let other = m.get(&Key::from_low(5)).cloned().expect("member");
        g.on_have(later - 1, other.clone(), Have { version: 7 });
        assert_eq!(drain(&mut g), vec![Action::Fetch(other.clone(), 7)]);
        g.fetch_done(later - 1);
        g.on_have(later - 1, other.clone(), Have { version: 7 });
        assert_eq!(drain(&mut g), vec![Action::Fetch(other, 7)]);
        g.fetch_done(later - 1);
        g.on_have(later, liar.clone(), Have { version: u64::MAX });
        assert_eq!(drain(&mut g), vec![Action::Fetch(liar, u64::MAX)]);
    }

    #[test]
    fn the_smallest_claim_above_ours_is_fetched_first() {
        let m = members(10);
        let mut g = Gossip::new(Key::from_low(0), GossipConfig::default(), 5, 0);
        let a = m.get(&Key::from_low(1)).cloned().expect("member");
        let b = m.get(&Key::from_low(2)).cloned().expect("member");
        let c = m.get(&Key::from_low(3)).cloned().expect("member");
        g.on_have(0, a.clone(), Have { version: 9 });
        g.on_have(0, b.clone(), Have { version: 1_000_000 });
        g.on_have(0, c.clone(), Have { version: 7 });
        g.fetch_failed(0);
        assert_eq!(drain(&mut g)[1], Action::Fetch(c, 7));
    }

    #[test]
    fn a_fetch_that_hangs_times_out() {
        let m = members(4);
        let mut g = Gossip::new(Key::from_low(0), GossipConfig::default(), 1, 0);
        let silent = m.get(&Key::from_low(1)).cloned().expect("member");
        g.on_have(0, silent, Have { version: 2 });
        drain(&mut g);
        g.handle_timeout(999, &m, 1);
        assert_eq!(g.stats().failed_fetches, 0);
        g.handle_timeout(1_000, &m, 1);
        assert_eq!(g.stats().failed_fetches, 1);
    }

    #[test]
    fn a_member_behind_is_told_and_pulls_go_out_every_period() {
        let m = members(4);
        let mut g = Gossip::new(Key::from_low(0), GossipConfig::default(), 3, 0);
        let behind = m.get(&Key::from_low(2)).cloned().expect("member");
        g.on_have(0, behind.clone(), Have { version: 1 });
        assert_eq!(
            drain(&mut g),
            vec![Action::Send(behind, Have { version: 3 })]
        );
        g.handle_timeout(0, &m, 9);
        assert_eq!(drain(&mut g).len(), 1);
        g.handle_timeout(1_999, &m, 9);
        assert!(drain(&mut g).is_empty());
        assert_eq!(g.poll_timeout(), 2_000);
    }
}
