//! When to compare a member's other history of the trust log (docs/PROTOCOL.md
//! §6.14): a member that gossips as many leaves as this node holds, under another
//! root, holds another history of the root's, and its checkpoint is fetched and
//! compared through the log's own exchange (`log_sync`; a fork is kept as evidence,
//! §6.13). A sans-IO state machine, time passed in, as `themis_dht::gossip` is.
//!
//! A member's history of one size is compared once, unless the exchange fails:
//! then again, with backoff, up to [`MAX_COMPARES`] exchanges. Gossip alone would
//! not bring it back (sizes that agree start no fetch, and a member says the same
//! root until its log grows), so an exchange lost to a timeout on a loaded machine
//! would leave a noticed fork unproven for good (issue 42).

use std::collections::HashMap;

use themis_dht::{Key, Millis};

use crate::log_sync::Synced;

/// The most exchanges a member's history of one size is compared in: a member that
/// keeps failing them (away, or refusing) costs that many per log growth.
pub const MAX_COMPARES: u32 = 8;

/// The longest wait before comparing again, ms.
pub const MAX_BACKOFF_MS: Millis = 60_000;

/// The comparisons of members' other histories, by member.
#[derive(Debug)]
pub struct Histories {
    /// The wait after the first failed exchange (doubled after each further one).
    backoff: Millis,
    by_member: HashMap<Key, Comparison>,
}

/// The comparison of one member's history of one size.
#[derive(Debug)]
struct Comparison {
    size: u64,
    /// Exchanges started.
    tries: u32,
    state: State,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// An exchange is under way.
    Running,
    /// The last one failed: compare again at this time.
    RetryAt(Millis),
    /// Proven a fork, shown consistent, or given up.
    Settled,
}

impl Histories {
    /// No comparison yet; a failed exchange is tried again `backoff` ms later (then
    /// after twice that, up to [`MAX_BACKOFF_MS`]): the gossip period, say.
    pub fn new(backoff: Millis) -> Histories {
        Histories {
            backoff: backoff.max(1),
            by_member: HashMap::new(),
        }
    }

    /// The member `member` holds another history of `size` leaves: whether to compare
    /// it now (once per member and size; a retry is [`Histories::due`]'s).
    pub fn noticed(&mut self, member: Key, size: u64) -> bool {
        if self
            .by_member
            .get(&member)
            .is_some_and(|held| held.size == size)
        {
            return false;
        }
        let comparison = Comparison {
            size,
            tries: 1,
            state: State::Running,
        };
        self.by_member.insert(member, comparison);
        true
    }

    /// The exchange comparing `member`'s history of `size` came to `synced` at
    /// `now`. One that could not be made or was refused (a timeout, a peer not
    /// ready, what does not verify) is tried again later, a bounded number of times;
    /// any other result settles the comparison.
    pub fn done(&mut self, now: Millis, member: Key, size: u64, synced: &Synced) {
        let Some(held) = self.by_member.get_mut(&member) else {
            return;
        };
        if held.size != size || held.state != State::Running {
            // A comparison of an older size, overtaken.
            return;
        }
        let failed = matches!(synced, Synced::Unreachable | Synced::Refused(_));
        held.state = if failed && held.tries < MAX_COMPARES {
            let shift = (held.tries - 1).min(16);
            let wait = self.backoff.saturating_mul(1 << shift).min(MAX_BACKOFF_MS);
            State::RetryAt(now.saturating_add(wait))
        } else {
            State::Settled
        };
    }

    /// When the next retry is due, if one is waiting.
    pub fn poll_timeout(&self) -> Option<Millis> {
        self.by_member
            .values()
            .filter_map(|held| match held.state {
                State::RetryAt(at) => Some(at),
                _ => None,
            })
            .min()
    }

    /// The comparisons to try again at `now`: each member and size, its exchange
    /// taken as under way (report it to [`Histories::done`]).
    pub fn due(&mut self, now: Millis) -> Vec<(Key, u64)> {
        let mut due = Vec::new();
        for (member, held) in &mut self.by_member {
            if matches!(held.state, State::RetryAt(at) if at <= now) {
                held.state = State::Running;
                held.tries += 1;
                due.push((*member, held.size));
            }
        }
        due
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PERIOD: Millis = 500;
    const PEER: Key = Key([7; 32]);

    #[test]
    fn a_member_and_size_is_compared_once_when_it_settles() {
        let mut histories = Histories::new(PERIOD);
        assert!(histories.noticed(PEER, 5));
        assert!(!histories.noticed(PEER, 5), "one exchange at a time");
        histories.done(100, PEER, 5, &Synced::Fork);
        assert!(
            !histories.noticed(PEER, 5),
            "a fork proven is not asked again"
        );
        assert_eq!(histories.poll_timeout(), None);
        assert!(histories.due(u64::MAX).is_empty());
        assert!(histories.noticed(PEER, 6), "a new size is compared again");
        histories.done(200, PEER, 6, &Synced::Consistent);
        assert!(histories.due(u64::MAX).is_empty());
    }

    /// Issue 42: the first exchange timed out on a loaded machine, and the fork it
    /// would have proven was never raised.
    #[test]
    fn a_failed_comparison_is_tried_again_until_it_proves_the_fork() {
        let mut histories = Histories::new(PERIOD);
        assert!(histories.noticed(PEER, 5));
        histories.done(1_000, PEER, 5, &Synced::Unreachable);
        assert_eq!(histories.poll_timeout(), Some(1_000 + PERIOD));
        assert!(!histories.noticed(PEER, 5), "gossip does not hurry a retry");
        assert!(histories.due(1_000 + PERIOD - 1).is_empty());
        assert_eq!(histories.due(1_000 + PERIOD), vec![(PEER, 5)]);
        assert!(histories.due(u64::MAX).is_empty(), "one retry under way");
        histories.done(2_000, PEER, 5, &Synced::Refused("by_peer"));
        assert_eq!(
            histories.poll_timeout(),
            Some(2_000 + 2 * PERIOD),
            "backoff"
        );
        assert_eq!(histories.due(2_000 + 2 * PERIOD), vec![(PEER, 5)]);
        histories.done(3_000, PEER, 5, &Synced::Fork);
        assert_eq!(histories.poll_timeout(), None, "proven: settled");
    }

    #[test]
    fn retries_are_bounded_and_back_off_to_a_cap() {
        let mut histories = Histories::new(PERIOD);
        assert!(histories.noticed(PEER, 5));
        let mut now = 0;
        let mut waits = Vec::new();
        for _ in 1..MAX_COMPARES {
            histories.done(now, PEER, 5, &Synced::Unreachable);
            let at = histories.poll_timeout().expect("a retry");
            waits.push(at - now);
            now = at;
            assert_eq!(histories.due(now), vec![(PEER, 5)]);
        }
        histories.done(now, PEER, 5, &Synced::Unreachable);
        assert_eq!(histories.poll_timeout(), None, "given up");
        assert!(!histories.noticed(PEER, 5));
        assert_eq!(&waits[..4], &[PERIOD, 2 * PERIOD, 4 * PERIOD, 8 * PERIOD]);
        let mut slow = Histories::new(40_000);
        assert!(slow.noticed(PEER, 5));
        slow.done(0, PEER, 5, &Synced::Unreachable);
        assert_eq!(slow.due(40_000), vec![(PEER, 5)]);
        slow.done(40_000, PEER, 5, &Synced::Unreachable);
        assert_eq!(slow.poll_timeout(), Some(40_000 + MAX_BACKOFF_MS), "capped");
        // A retry of an older size reports to nothing.
        assert!(histories.noticed(PEER, 6));
        histories.done(now, PEER, 5, &Synced::Unreachable);
        assert_eq!(histories.poll_timeout(), None);
    }
}
