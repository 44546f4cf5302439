//! Secure naming (issue 11): what hostile ring members can no longer do to a name.
//! Every node runs the records policy of `sim::records` (an endorsed record verifies,
//! at most `OWNER_LIMIT` instances per owner and key); the adversaries are admitted
//! ring members, some even endorsed for the name.

mod sim;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use sim::records::{merge, Record, RecordPolicy};
use sim::{Adversary, GetLie, Sim};
use themis_dht::message::Object;
use themis_dht::{Config, Event, Key, Message, Rejection, Request, Response};

const NAME: &[u8] = b"payments.prod";
const OWNER_LIMIT: usize = 4;
const TTL: u64 = 600_000;

/// A ring of `n` nodes running the records policy; also returns the policies'
/// verification counter.
fn ring(seed: u64, n: usize) -> (Sim, Arc<AtomicU64>) {
    let verifications = Arc::new(AtomicU64::new(0));
    let clock = Arc::new(AtomicU64::new(0));
    let (v, c) = (verifications.clone(), clock.clone());
    let mut sim = Sim::ring_with(
        seed,
        n,
        Config::default(),
        (1, 5),
        20,
        Some(Box::new(move || {
            Box::new(RecordPolicy {
                clock: c.clone(),
                verifications: v.clone(),
                owner_limit: OWNER_LIMIT,
            })
        })),
    );
    // The policies read the simulation's clock.
    sim.clock = clock;
    sim.run_for(1);
    (sim, verifications)
}

fn record(owner: u32, instance: u64, version: u64, now: u64) -> Record {
    Record {
        owner,
        instance,
        version,
        not_after: now + 3_600_000,
        name: NAME.to_vec(),
    }
}

fn store(sim: &mut Sim, owner_node: usize, value: Vec<u8>, k: u8) -> Event<usize> {
    let op = sim
        .op(owner_node, |n, now| n.store(now, NAME, value, k, TTL))
        .expect("store");
    sim.wait(owner_node, op, 10_000)
}

/// A request handed straight to node `a` as if from `from`; returns `a`'s answer.
fn ask(sim: &mut Sim, a: usize, from: usize, body: Request<usize>) -> Response<usize> {
    let (now, f) = (sim.now, sim.contact(from));
    sim.nodes[a].handle(now, f, Message::Request { id: 7, body });
    match sim.nodes[a].poll_transmit() {
        Some((to, Message::Response { id: 7, body })) if to.addr == from => body,
        other => panic!("no answer: {other:?}"),
    }
}

fn resolved(sim: &mut Sim, reader: usize, k: u8) -> (BTreeMap<(u32, u64), u64>, u8) {
    match &sim.resolve_all(&[reader], NAME, k)[0] {
        Event::Resolved {
            values, answered, ..
        } => (merge(NAME, values, sim.now).0, *answered),
        other => panic!("{other:?}"),
    }
}

#[test]
fn one_owners_junk_cannot_crowd_out_another_owner() {
    let (mut sim, _) = ring(21, 30);
    let holder = sim.responsible(&Key::object(NAME, 0));
    let [attacker, owner] = sim.sample(2, &[holder])[..] else {
        unreachable!()
    };
    // An endorsed but hostile owner (666) pre-fills the key with 300 instances, and
    // tries records in the honest owner's name it cannot sign.
    let mut refused = 0;
    for i in 0..300 {
        let junk = record(666, i, 0, sim.now).sign();
        let body = Request::Store {
            key: Key::object(NAME, 0),
            value: junk,
            ttl_ms: TTL,
        };
        refused += u32::from(ask(&mut sim, holder, attacker, body) == Response::Rejected);
    }
    for i in 0..10 {
        let body = Request::Store {
            key: Key::object(NAME, 0),
            value: record(1, 100 + i, 0, sim.now).forge(),
            ttl_ms: TTL,
        };
        assert_eq!(ask(&mut sim, holder, attacker, body), Response::Rejected);
    }
    let stats = sim.nodes[holder].stats();
    assert_eq!(refused, 300 - OWNER_LIMIT as u32);
    assert_eq!(
        stats.rejected(Rejection::OwnerFull),
        300 - OWNER_LIMIT as u64
    );
    assert_eq!(stats.rejected(Rejection::InvalidValue), 10);
    // The honest owner's instance still finds room.
    let honest = record(1, 1, 0, sim.now);
    assert!(matches!(
        store(&mut sim, owner, honest.sign(), 0),
        Event::Stored { stored: 1, .. }
    ));
    let (got, _) = resolved(&mut sim, attacker, 0);
    assert_eq!(got.get(&(1, 1)), Some(&0), "the honest instance resolves");
    assert_eq!(got.len(), 1 + OWNER_LIMIT, "and the attacker's four");
}

#[test]
fn a_stale_record_is_refused_after_a_newer_one() {
    let (mut sim, _) = ring(22, 30);
    let [owner, replayer] = sim.sample(2, &[])[..] else {
        unreachable!()
    };
    let v1 = record(1, 1, 1, sim.now).sign();
    let v2 = record(1, 1, 2, sim.now).sign();
    assert!(matches!(
        store(&mut sim, owner, v1.clone(), 1),
        Event::Stored { stored: 2, .. }
    ));
    // The instance moves on: version 2 replaces version 1 in its slot.
    assert!(sim.nodes[owner].unstore(NAME, &v1));
    assert!(matches!(
        store(&mut sim, owner, v2.clone(), 1),
        Event::Stored { stored: 2, .. }
    ));
    for r in 0..2 {
        let key = Key::object(NAME, r);
        let holder = sim.responsible(&key);
        assert_eq!(sim.nodes[holder].values(&key, sim.now), vec![v2.clone()]);
        // Anyone replaying version 1 (or a same-version variant) is refused, counted.
        let before = sim.nodes[holder].stats().rejected(Rejection::Stale);
        for value in [v1.clone(), record(1, 1, 2, sim.now).sign()] {
            let body = Request::Store {
                key,
                value,
                ttl_ms: TTL,
            };
            let from = if holder == replayer { owner } else { replayer };
            assert_eq!(ask(&mut sim, holder, from, body), Response::Rejected);
        }
        assert_eq!(
            sim.nodes[holder].stats().rejected(Rejection::Stale),
            before + 2
        );
        assert_eq!(sim.nodes[holder].values(&key, sim.now), vec![v2.clone()]);
    }
    let (got, _) = resolved(&mut sim, replayer, 1);
    assert_eq!(got, BTreeMap::from([((1, 1), 2)]));
}

#[test]
fn handover_and_leaving_from_a_non_neighbour_change_nothing() {
    let (mut sim, _) = ring(23, 30);
    let a = sim.sample(1, &[])[0];
    let pred = sim.nodes[a].predecessor().expect("in a ring").addr;
    let succs: Vec<usize> = sim.nodes[a].successors().iter().map(|c| c.addr).collect();
    let mut not = succs.clone();
    not.extend([a, pred]);
    let x = sim.sample(1, &not)[0];
    let routing = |sim: &Sim| {
        (
            sim.nodes[a].predecessor().cloned(),
            sim.nodes[a].successors().to_vec(),
        )
    };
    let before = routing(&sim);
    // A valid record of a name `a` holds replica 0 of.
    let name = (0..)
        .map(|i| format!("svc-{i}").into_bytes())
        .find(|n| sim.responsible(&Key::object(n, 0)) == a)
        .expect("some name lands on a");
    let key = Key::object(&name, 0);
    let value = Record {
        name,
        ..record(1, 1, 0, sim.now)
    }
    .sign();
    let object = Object {
        key,
        value: value.clone(),
        ttl_ms: TTL,
    };
    let handover = Request::Handover {
        objects: vec![object.clone()],
    };
    assert_eq!(ask(&mut sim, a, x, handover.clone()), Response::Rejected);
    let leaving = Request::Leaving {
        predecessor: Some(sim.contact(x)),
        successors: vec![sim.contact(x), sim.contact(pred)],
    };
    assert_eq!(ask(&mut sim, a, x, leaving), Response::Rejected);
    assert_eq!(sim.nodes[a].stats().rejected(Rejection::NotNeighbour), 2);
    assert!(sim.nodes[a].objects(sim.now).is_empty(), "nothing stored");
    assert_eq!(routing(&sim), before, "routing unchanged");
    // Notify keeps Chord's rule: x is not between our predecessor and us.
    assert_eq!(ask(&mut sim, a, x, Request::Notify), Response::Ack);
    assert_eq!(routing(&sim), before);
    // A successor that leaves may hand us its successors, not a predecessor.
    let s2 = succs[1];
    let leaving = Request::Leaving {
        predecessor: Some(sim.contact(x)),
        successors: Vec::new(),
    };
    assert_eq!(ask(&mut sim, a, s2, leaving), Response::Ack);
    assert_eq!(sim.nodes[a].predecessor().map(|p| p.addr), Some(pred));
    assert!(sim.nodes[a].successors().iter().all(|c| c.addr != s2));
    // Our predecessor is still heard, even when its hand-over arrives after its
    // `Leaving` (for a request timeout; then it is a stranger like any other).
    let pp = sim.nodes[pred].predecessor().cloned();
    let leaving = Request::Leaving {
        predecessor: pp.clone(),
        successors: Vec::new(),
    };
    assert_eq!(ask(&mut sim, a, pred, leaving), Response::Ack);
    assert_eq!(sim.nodes[a].predecessor().cloned(), pp);
    assert_eq!(ask(&mut sim, a, pred, handover.clone()), Response::Ack);
    assert_eq!(sim.nodes[a].stats().rejected(Rejection::NotNeighbour), 2);
    assert_eq!(sim.nodes[a].values(&key, sim.now), vec![value]);
    let later = sim.now + Config::default().request_timeout + 1;
    let from = sim.contact(pred);
    let msg = Message::Request {
        id: 8,
        body: handover,
    };
    sim.nodes[a].handle(later, from, msg);
    assert!(matches!(
        sim.nodes[a].poll_transmit(),
        Some((
            _,
            Message::Response {
                id: 8,
                body: Response::Rejected
            }
        ))
    ));
    assert_eq!(sim.nodes[a].stats().rejected(Rejection::NotNeighbour), 3);
    // `pred` never really left: stabilisation puts it back.
    sim.converge(30_000).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn withholding_and_lying_replica_holders_do_not_hide_the_honest_records() {
    let (mut sim, _) = ring(24, 40);
    let k = 2;
    let holders: Vec<usize> = (0..=k)
        .map(|r| sim.responsible(&Key::object(NAME, r)))
        .collect();
    assert!(
        holders[0] != holders[1] && holders[1] != holders[2] && holders[0] != holders[2],
        "choose another seed: replicas share a holder"
    );
    let owner = sim.sample(1, &holders)[0];
    // Two instances; instance 1 is at version 2, version 1 went before.
    let old = record(1, 1, 1, sim.now);
    let a1 = store(&mut sim, owner, old.sign(), k);
    sim.nodes[owner].unstore(NAME, &old.sign());
    let (new, other) = (record(1, 1, 2, sim.now), record(1, 2, 1, sim.now));
    let a2 = store(&mut sim, owner, new.sign(), k);
    let b = store(&mut sim, owner, other.sign(), k);
    for e in [a1, a2, b] {
        assert!(matches!(e, Event::Stored { stored: 3, .. }), "{e:?}");
    }
    let truth = BTreeMap::from([((1, 1), 2), ((1, 2), 1)]);
    // Replica 0's holder withholds; replica 1's answers junk, forgeries and the old
    // version of instance 1 (which it kept).
    sim.adversaries
        .insert(holders[0], Adversary::get(GetLie::Withhold));
    let lies = vec![
        vec![0xee; 80],
        record(1, 1, 9, sim.now).forge(),
        record(1, 3, 1, sim.now).forge(),
        old.sign(),
    ];
    sim.adversaries
        .insert(holders[1], Adversary::get(GetLie::Answer(lies)));
    let readers = sim.sample(20, &holders);
    for reader in readers {
        let (got, answered) = resolved(&mut sim, reader, k);
        assert_eq!(got, truth, "reader {reader}");
        assert_eq!(answered, k + 1);
    }
    // With only the liars' answers the truth is out of reach: the honest replica is the
    // one that counts, and the union keeps it.
    sim.adversaries
        .insert(holders[2], Adversary::get(GetLie::Withhold));
    let (got, _) = resolved(&mut sim, owner, k);
    assert_eq!(got, BTreeMap::from([((1, 1), 1)]), "only the stale record");
}

#[test]
fn the_policys_refusals_are_counted_and_answered_rejected() {
    let (mut sim, verifications) = ring(25, 20);
    let key = Key::object(NAME, 0);
    let holder = sim.responsible(&key);
    let from = sim.sample(1, &[holder])[0];
    let before = verifications.load(Ordering::Relaxed);
    let expired = Record {
        not_after: sim.now,
        ..record(1, 1, 0, sim.now)
    };
    let elsewhere = Record {
        name: b"another.name".to_vec(),
        ..record(1, 1, 0, sim.now)
    };
    for value in [
        record(1, 1, 0, sim.now).forge(),
        expired.sign(),
        elsewhere.sign(),
        b"not a record".to_vec(),
    ] {
        let body = Request::Store {
            key,
            value,
            ttl_ms: TTL,
        };
        assert_eq!(ask(&mut sim, holder, from, body), Response::Rejected);
    }
    assert_eq!(
        sim.nodes[holder].stats().rejected(Rejection::InvalidValue),
        4
    );
    assert_eq!(verifications.load(Ordering::Relaxed) - before, 4);
    assert!(sim.nodes[holder].values(&key, sim.now).is_empty());
    // Our own store of a value our policy refuses fails at once.
    let now = sim.now;
    assert_eq!(
        sim.nodes[from].store(now, NAME, record(1, 1, 0, sim.now).forge(), 1, TTL),
        Err(Rejection::InvalidValue)
    );
    assert_eq!(sim.nodes[from].stats().rejected(Rejection::InvalidValue), 1);
    // A valid record is kept no longer than it is valid.
    let short = Record {
        not_after: sim.now + 5_000,
        ..record(1, 1, 0, sim.now)
    };
    assert!(matches!(
        store(&mut sim, from, short.sign(), 0),
        Event::Stored { stored: 1, .. }
    ));
    assert_eq!(sim.nodes[holder].values(&key, sim.now).len(), 1);
    sim.run_for(5_000);
    assert!(sim.nodes[holder].values(&key, sim.now).is_empty());
}
