//! One-hop routing (see [`crate::membership`]): with the full membership given by the
//! driver, the node computes every key's holder itself and sends `Store`s and `Get`s
//! straight to it. No `FindStep` leaves the node, so no other node can steer where its
//! objects go or whom it asks for them.

use std::fmt::Debug;
use std::hash::Hash;

use super::{Event, Node, Pend, State};
use crate::key::{in_open, Key, KEY_BITS};
use crate::lookup::{Lookup, Purpose};
use crate::membership::{holder, Members};
use crate::message::{Contact, Request, Response};
use crate::{Millis, Rejection};

impl<A: Clone + Eq + Hash + Debug> Node<A> {
    /// Switches the node to one-hop routing over `members` (or gives it a newer list):
    /// every member the driver has verified (in the agent: each node key the trust log
    /// admitted, with the address that key signed). This node should be among them.
    ///
    /// From then on the node routes nothing through others: the holder of a key is the
    /// first member at or after it that this node has not itself seen fail, its
    /// predecessor and successor list come from the list (not from what neighbours say),
    /// and Chord's stabilisation stops. An idle node starts at once (reporting
    /// [`Event::Joined`] when another member is its successor); a join still in
    /// flight completes silently; a newcomer between our predecessor and us is handed the
    /// objects it now holds.
    pub fn set_members(&mut self, now: Millis, members: Members<A>) {
        if self.state == State::Left {
            return;
        }
        let me = self.me.id;
        let predecessor = members.counter_clockwise_from(&me).next().cloned();
        let successors: Vec<Contact<A>> = members
            .clockwise_from(&me)
            .filter(|c| c.id != me)
            .take(self.config.successors)
            .cloned()
            .collect();
        let newcomer = match (&self.table.predecessor, &predecessor) {
            (Some(old), Some(new)) => in_open(&new.id, &old.id, &me).then(|| new.clone()),
            _ => None,
        };
        self.table.predecessor = predecessor;
        self.table.set_successors(successors);
        // Fingers too, so that a peer still routing the Chord way through us is
        // answered in O(log N) steps.
        for i in 0..KEY_BITS {
            let target = *self.table.target(i);
            if let Some(c) = members.clockwise_from(&target).find(|c| c.id != me) {
                self.table.set_finger(i, c.clone());
            }
        }
        self.liveness.sweep(now, &members);
        let before = self.members.replace(members);
        if self.state == State::Joined {
            if let Some(new) = newcomer {
                let objects = self.store.objects_outside(Some((&new.id, &me)), now);
                self.send_handover(now, &new, objects);
            }
            if let Some(before) = before {
                self.restore_what_departed_members_held(now, &before);
            }
        }
        if self.state != State::Joined {
            self.start_maintenance(now);
            let successor = self.table.successor().clone();
            if successor.id != me {
                self.events.push_back(Event::Joined { successor });
            }
        }
    }

    /// A member that left the list (revoked, its announcement or admission expired)
    /// may have handed nothing over. Where it held every replica of one of our names,
    /// nothing of that name is left until we store it again: we do so now, at the new
    /// holders, rather than at the next republish. A name with a replica left at a
    /// listed member still resolves and waits for the republish: every agent owns the
    /// revocations' name, so re-storing whatever a departed member held would send
    /// every agent's copy to one new holder at once.
    ///
    /// The old holders are the first members clockwise under the old list, without
    /// this node's liveness marks: a replica passed over to the next member is not
    /// seen here, and is left to the republish too.
    fn restore_what_departed_members_held(&mut self, now: Millis, before: &Members<A>) {
        let Some(members) = &self.members else { return };
        let departed = |key: &Key| {
            before
                .clockwise_from(key)
                .next()
                .is_some_and(|held_by| members.get(&held_by.id).is_none())
        };
        let mut lost: Vec<(Key, Vec<u8>, Millis)> = Vec::new();
        for ((name, value), owned) in &self.owned {
            let keys: Vec<Key> = (0..=owned.k).map(|r| Key::object(name, r)).collect();
            if keys.iter().all(departed) {
                lost.extend(keys.into_iter().map(|key| (key, value.clone(), owned.ttl)));
            }
        }
        for (key, value, ttl_ms) in lost {
            self.stats.republished += 1;
            let purpose = Purpose::Store {
                op: None,
                value,
                ttl_ms,
            };
            self.direct(now, key, purpose, 0);
        }
    }

    /// The membership one-hop routing uses, if the driver has given one.
    pub fn members(&self) -> Option<&Members<A>> {
        self.members.as_ref()
    }

    /// How many members this node passes over now, having seen them fail.
    pub fn members_down(&self, now: Millis) -> usize {
        self.liveness.down_count(now)
    }

    /// Carries out `purpose` for `key` at its holder, without a lookup.
    pub(super) fn direct(&mut self, now: Millis, key: Key, purpose: Purpose, tries: u8) {
        let Some(members) = &self.members else {
            unreachable!("one-hop routing without members")
        };
        let found = holder(members, &self.liveness, &key, now, self.config.successors).cloned();
        let remote = found.clone().filter(|node| node.id != self.me.id);
        let body = match &purpose {
            Purpose::Store { value, ttl_ms, .. } => Some(Request::Store {
                key,
                value: value.clone(),
                ttl_ms: *ttl_ms,
            }),
            Purpose::Get(_) => Some(Request::Get { key }),
            _ => None,
        };
        match (remote, body) {
            (Some(node), Some(body)) => {
                let pend = Pend::Direct {
                    key,
                    purpose,
                    tries,
                };
                self.request(now, node, body, pend);
            }
            // Everything else completes here, as a lookup answered from our own table
            // would: a key we hold, a `find`, or no member at all.
            _ => {
                let lid = self.fresh_id();
                self.lookups
                    .insert(lid, Lookup::new(key, purpose, Vec::new()));
                self.complete(now, lid, found);
            }
        }
    }

    pub(super) fn direct_answered(
        &mut self,
        now: Millis,
        key: Key,
        purpose: Purpose,
        tries: u8,
        answer: Response<A>,
    ) {
        match (&purpose, answer) {
            (Purpose::Get(op), Response::Values { values }) => {
                self.resolve_step(*op, Some(values), 0)
            }
            (Purpose::Store { op, .. }, Response::Ack) => self.store_done(*op, true),
            (Purpose::Store { op, .. }, Response::Rejected) => {
                self.reject(Rejection::Refused);
                self.store_done(*op, false);
            }
            _ => {
                self.reject(Rejection::UnexpectedResponse);
                self.direct_failed(now, key, purpose, tries, false);
            }
        }
    }

    /// A direct request failed. A timeout has marked the holder down, so asking again
    /// reaches the member that takes over its keys; a wrong answer is not retried (the
    /// peer is up and chose it).
    pub(super) fn direct_failed(
        &mut self,
        now: Millis,
        key: Key,
        purpose: Purpose,
        tries: u8,
        timed_out: bool,
    ) {
        if timed_out && tries < self.config.retries {
            self.stats.retries += 1;
            return self.direct(now, key, purpose, tries + 1);
        }
        match purpose {
            Purpose::Get(op) => self.resolve_step(op, None, 0),
            Purpose::Store { op, .. } => self.store_done(op, false),
            _ => {}
        }
    }
}
