//! One iterative lookup, driven by its initiator, with the paper's eclipse defence:
//! every `Closer` answer must be strictly closer (clockwise) to the key than the peer
//! that gave it, and a `Responsible` answer must name a node at or past the key other
//! than the peer itself (only a node alone in its ring is responsible for every key,
//! and the initiator is in the ring too, unless it is joining). A peer
//! that breaks either rule, or does not answer, is dropped from the lookup, added to the
//! `avoid` list sent with later steps, and the lookup goes on with the best candidate
//! left. The peer that referred us to a dropped one becomes a candidate again: asked
//! anew with the longer `avoid` list, an honest referrer names another route.

use std::collections::{BTreeMap, BTreeSet};

use crate::key::{distance, in_half_open, Key};
use crate::message::{Contact, Response, MAX_AVOID};
use crate::{OpId, Rejection};

/// What the lookup is for; decides what the node does with the result.
#[derive(Debug, Clone)]
pub(crate) enum Purpose {
    Join,
    Finger(usize),
    Find(OpId),
    Store {
        op: Option<OpId>,
        value: Vec<u8>,
        ttl_ms: u64,
    },
    Get(OpId),
}

#[derive(Debug)]
pub(crate) struct Lookup<A> {
    pub(crate) key: Key,
    pub(crate) purpose: Purpose,
    /// Remote `FindStep`s sent so far.
    pub(crate) hops: u32,
    /// Untried candidates by their distance to the key: the first is the best.
    candidates: BTreeMap<Key, Contact<A>>,
    /// Peers queried; only a referrer of a dropped peer is asked again.
    tried: BTreeSet<Key>,
    /// Peers dropped; never asked again. Each drop re-offers at most one referrer, so a
    /// lookup asks at most twice as many peers as it meets.
    dropped: BTreeSet<Key>,
    /// Who named each candidate.
    referrer: BTreeMap<Key, Contact<A>>,
    /// The most recently dropped peers, sent along so honest peers route around them.
    avoid: Vec<Key>,
}

impl<A: Clone> Lookup<A> {
    pub(crate) fn new(key: Key, purpose: Purpose, seeds: Vec<Contact<A>>) -> Self {
        let mut l = Lookup {
            key,
            purpose,
            hops: 0,
            candidates: BTreeMap::new(),
            tried: BTreeSet::new(),
            dropped: BTreeSet::new(),
            referrer: BTreeMap::new(),
            avoid: Vec::new(),
        };
        for c in seeds {
            l.offer(c);
        }
        l
    }

    pub(crate) fn avoid(&self) -> &[Key] {
        &self.avoid
    }

    fn offer(&mut self, c: Contact<A>) {
        if !self.tried.contains(&c.id) && !self.dropped.contains(&c.id) {
            self.candidates.insert(distance(&c.id, &self.key), c);
        }
    }

    /// The best untried candidate, marked as tried.
    pub(crate) fn next_candidate(&mut self) -> Option<Contact<A>> {
        let (_, c) = self.candidates.pop_first()?;
        self.tried.insert(c.id);
        Some(c)
    }

    /// Drops a peer that failed this lookup.
    pub(crate) fn drop_peer(&mut self, id: Key) {
        if !self.dropped.insert(id) {
            return;
        }
        self.candidates.retain(|_, c| c.id != id);
        if let Some(r) = self.referrer.remove(&id) {
            if self.tried.remove(&r.id) {
                self.offer(r);
            }
        }
        if self.avoid.len() == MAX_AVOID {
            self.avoid.remove(0);
        }
        self.avoid.push(id);
    }

    /// Takes `queried`'s answer. `Ok(Some(node))`: the lookup is done; `Ok(None)`: go
    /// on with [`Lookup::next_candidate`]; `Err`: the answer broke the rules and the peer
    /// was dropped.
    pub(crate) fn on_answer(
        &mut self,
        queried: &Contact<A>,
        answer: Response<A>,
    ) -> Result<Option<Contact<A>>, Rejection> {
        let q = &queried.id;
        // `(q, q]` is the whole ring: a peer naming itself claims to be alone.
        let joining = matches!(self.purpose, Purpose::Join);
        let verdict = match answer {
            // A join looks up the joiner's own id, which no node in the ring has yet:
            // naming it would make the joiner its own successor, alone but "joined".
            Response::Responsible { node }
                if in_half_open(&self.key, q, &node.id)
                    && (node.id != *q || joining)
                    && !(joining && node.id == self.key) =>
            {
                return Ok(Some(node))
            }
            Response::Responsible { .. } => Rejection::BadResponsible,
            Response::Closer { node } if distance(&node.id, &self.key) < distance(q, &self.key) => {
                if !self.tried.contains(&node.id) && !self.dropped.contains(&node.id) {
                    self.referrer.insert(node.id, queried.clone());
                    self.offer(node);
                }
                return Ok(None);
            }
            Response::Closer { .. } => Rejection::NoProgress,
            _ => Rejection::UnexpectedResponse,
        };
        self.drop_peer(*q);
        Err(verdict)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(v: u8) -> Contact<u8> {
        let mut id = [0u8; 32];
        id[31] = v;
        Contact {
            id: Key(id),
            addr: v,
        }
    }

    #[test]
    fn best_candidate_first_and_progress_required() {
        let key = c(100).id;
        let find = Purpose::Find(OpId(1));
        let mut l = Lookup::new(key, find, vec![c(10), c(50), c(30)]);
        assert_eq!(l.next_candidate().unwrap().addr, 50);
        // Not closer than the peer that answered: dropped.
        assert_eq!(
            l.on_answer(&c(50), Response::Closer { node: c(40) }),
            Err(Rejection::NoProgress)
        );
        assert_eq!(
            l.on_answer(&c(50), Response::Closer { node: c(50) }),
            Err(Rejection::NoProgress)
        );
        assert_eq!(l.avoid(), &[c(50).id]);
        assert_eq!(l.next_candidate().unwrap().addr, 30);
        assert_eq!(
            l.on_answer(&c(30), Response::Closer { node: c(90) }),
            Ok(None)
        );
        assert_eq!(l.next_candidate().unwrap().addr, 90);
        // The responsible node must be at or past the key.
        assert_eq!(
            l.on_answer(&c(90), Response::Responsible { node: c(95) }),
            Err(Rejection::BadResponsible)
        );
        // ...and not the answerer itself: that claims a ring of one, where we are not.
        assert_eq!(
            l.on_answer(&c(90), Response::Responsible { node: c(90) }),
            Err(Rejection::BadResponsible)
        );
        assert_eq!(
            l.on_answer(&c(90), Response::Responsible { node: c(120) }),
            Ok(Some(c(120)))
        );
    }

    #[test]
    fn a_ring_of_one_is_believed_only_when_joining() {
        let key = c(100).id;
        let mut join = Lookup::new(key, Purpose::Join, vec![c(10)]);
        assert_eq!(join.next_candidate().unwrap().addr, 10);
        assert_eq!(
            join.on_answer(&c(10), Response::Responsible { node: c(10) }),
            Ok(Some(c(10)))
        );
        let mut find = Lookup::new(key, Purpose::Find(OpId(1)), vec![c(10)]);
        assert_eq!(find.next_candidate().unwrap().addr, 10);
        assert_eq!(
            find.on_answer(&c(10), Response::Responsible { node: c(10) }),
            Err(Rejection::BadResponsible)
        );
    }

    #[test]
    fn a_join_never_finds_the_joiner_itself() {
        // Found by the dht_node fuzz target: a bootstrap answering our join with our
        // own id made us report `Joined` with ourselves as successor, alone.
        let me = c(100);
        let mut join = Lookup::new(me.id, Purpose::Join, vec![c(10), c(20)]);
        assert_eq!(join.next_candidate().unwrap().addr, 20);
        assert_eq!(
            join.on_answer(&c(20), Response::Responsible { node: me.clone() }),
            Err(Rejection::BadResponsible)
        );
        // The lookup goes on with the others.
        assert_eq!(join.next_candidate().unwrap().addr, 10);
        assert_eq!(
            join.on_answer(&c(10), Response::Responsible { node: c(110) }),
            Ok(Some(c(110)))
        );
        // Outside a join, a key's responsible node may well be the asker itself.
        let mut find = Lookup::new(me.id, Purpose::Find(OpId(1)), vec![c(20)]);
        assert_eq!(find.next_candidate().unwrap().addr, 20);
        assert_eq!(
            find.on_answer(&c(20), Response::Responsible { node: me.clone() }),
            Ok(Some(me))
        );
    }

    #[test]
    fn dropped_peers_are_not_offered_again() {
        let key = c(100).id;
        let mut l = Lookup::new(key, Purpose::Join, vec![c(10)]);
        l.drop_peer(c(60).id);
        assert_eq!(
            l.on_answer(&c(10), Response::Closer { node: c(60) }),
            Ok(None)
        );
        assert_eq!(l.next_candidate().unwrap().addr, 10);
        assert!(l.next_candidate().is_none());
    }

    #[test]
    fn referrer_is_asked_again_when_its_referral_fails() {
        let key = c(100).id;
        let mut l = Lookup::new(key, Purpose::Join, vec![c(10)]);
        assert_eq!(l.next_candidate().unwrap().addr, 10);
        assert_eq!(
            l.on_answer(&c(10), Response::Closer { node: c(60) }),
            Ok(None)
        );
        assert_eq!(l.next_candidate().unwrap().addr, 60);
        l.drop_peer(c(60).id); // timed out
        assert_eq!(l.next_candidate().unwrap().addr, 10);
        assert_eq!(l.avoid(), &[c(60).id]);
        // Named again despite the avoid list: ignored, and nobody is left.
        assert_eq!(
            l.on_answer(&c(10), Response::Closer { node: c(60) }),
            Ok(None)
        );
        assert!(l.next_candidate().is_none());
    }

    #[test]
    fn avoid_list_is_bounded() {
        let mut l = Lookup::<u8>::new(c(100).id, Purpose::Join, vec![]);
        for v in 0..20 {
            l.drop_peer(c(v).id);
        }
        assert_eq!(l.avoid().len(), MAX_AVOID);
        assert_eq!(l.avoid()[MAX_AVOID - 1], c(19).id);
    }

    proptest::proptest! {
        /// Whatever peers answer, a lookup sends at most one query per peer it meets
        /// plus one per drop (the referrer asked again), and only accepts a responsible
        /// node at or past the key.
        #[test]
        fn any_answers_terminate_and_respect_the_rules(
            key in 0u8..=255,
            seeds in proptest::collection::vec(0u8..20, 1..5),
            answers in proptest::collection::vec((proptest::bool::ANY, 0u8..20, proptest::bool::ANY), 0..100),
        ) {
            let key = c(key).id;
            let mut l = Lookup::new(key, Purpose::Join, seeds.into_iter().map(c).collect());
            let mut asked = 0;
            let mut answers = answers.into_iter();
            while let Some(q) = l.next_candidate() {
                asked += 1;
                proptest::prop_assert!(asked <= 40, "20 peers + at most 20 drops");
                let Some((responsible, node, timeout)) = answers.next() else { break };
                if timeout {
                    l.drop_peer(q.id);
                    continue;
                }
                let answer = if responsible {
                    Response::Responsible { node: c(node) }
                } else {
                    Response::Closer { node: c(node) }
                };
                if let Ok(Some(found)) = l.on_answer(&q, answer) {
                    proptest::prop_assert!(in_half_open(&key, &q.id, &found.id));
                    break;
                }
            }
        }
    }
}
