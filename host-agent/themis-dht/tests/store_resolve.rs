//! Store and resolve with k + 1 replicas; graceful leave and crashes of replica holders.

mod sim;

use sim::Sim;
use themis_dht::{Config, Event, Key};

const N: usize = 200;
const NAME: &[u8] = b"payments.prod";
const VALUE: &[u8] = b"10.0.0.7:15006";
const K: u8 = 3;
const TTL: u64 = 900_000;
const REPUBLISH: u64 = 180_000;

/// Every resolve found exactly our value; returns how many resolves had 0, 1, ...,
/// `K + 1` replicas answer.
fn assert_all_resolved(events: &[Event<usize>], phase: &str) -> [usize; K as usize + 2] {
    let mut by_answered = [0; K as usize + 2];
    for e in events {
        match e {
            Event::Resolved {
                values,
                answered,
                replicas,
                ..
            } if values == &[VALUE.to_vec()] && *replicas == K + 1 => {
                by_answered[usize::from(*answered)] += 1
            }
            other => panic!("{phase}: resolve gave {other:?}"),
        }
    }
    by_answered
}

fn holders(sim: &mut Sim) -> Vec<usize> {
    (0..=K)
        .map(|r| sim.responsible(&Key::object(NAME, r)))
        .collect()
}

#[test]
fn store_resolve_survives_leave_and_crash_of_a_third() {
    let config = Config {
        republish_every: REPUBLISH,
        ..Config::default()
    };
    let mut sim = Sim::ring(3, N, config, (1, 10), 20);
    sim.run_for(20_000);
    let start = sim.now;

    let owner = sim.sample(1, &[0])[0];
    let op = sim
        .op(owner, |n, now| n.store(now, NAME, VALUE.to_vec(), K, TTL))
        .expect("store");
    assert_eq!(
        sim.wait(owner, op, 10_000),
        Event::Stored {
            op,
            stored: K + 1,
            replicas: K + 1
        }
    );
    for (r, h) in holders(&mut sim).into_iter().enumerate() {
        let key = Key::object(NAME, r as u8);
        assert_eq!(
            sim.nodes[h].values(&key, sim.now),
            vec![VALUE.to_vec()],
            "replica {r} not on its node {h}"
        );
    }

    let readers = sim.sample(50, &[owner]);
    let got = sim.resolve_all(&readers, NAME, K);
    assert_eq!(
        assert_all_resolved(&got, "after store")[usize::from(K) + 1],
        50,
        "every reader should hear from every replica"
    );

    // Graceful leave of every replica holder: the objects move to the successors.
    let leaving: Vec<usize> = holders(&mut sim)
        .into_iter()
        .filter(|&h| h != owner && h != 0)
        .collect();
    for &h in &leaving {
        sim.leave(h);
    }
    sim.converge(60_000)
        .unwrap_or_else(|e| panic!("after leave: {e}"));
    assert!(
        sim.now - start < REPUBLISH,
        "the owner must not have re-stored yet, or this proves nothing"
    );
    for (r, h) in holders(&mut sim).into_iter().enumerate() {
        let key = Key::object(NAME, r as u8);
        assert_eq!(
            sim.nodes[h].values(&key, sim.now),
            vec![VALUE.to_vec()],
            "replica {r} lost in the hand-over"
        );
    }
    let readers = sim.sample(50, &[owner]);
    let got = sim.resolve_all(&readers, NAME, K);
    assert_all_resolved(&got, "after leave");
    eprintln!(
        "{} replica holders left; every replica moved to its new node",
        leaving.len()
    );

    // Crash a third of the nodes, never the owner nor the bootstrap node.
    let live = sim.sorted().len();
    let victims = sim.sample(live.div_ceil(3), &[owner, 0]);
    for &v in &victims {
        sim.kill(v);
    }
    sim.converge(120_000)
        .unwrap_or_else(|e| panic!("after crash: {e}"));
    let surviving = holders(&mut sim)
        .into_iter()
        .enumerate()
        .filter(|&(r, h)| {
            !sim.nodes[h]
                .values(&Key::object(NAME, r as u8), sim.now)
                .is_empty()
        })
        .count();
    // While one replica is held, resolving works before any re-store: the replicas
    // that are gone answer nothing, the one left answers the value.
    let early = if surviving > 0 {
        let readers = sim.sample(50, &[owner]);
        let got = sim.resolve_all(&readers, NAME, K);
        assert_all_resolved(&got, "after crash, before the re-store")
    } else {
        [0; K as usize + 2]
    };
    // Whatever survived, the owner's next re-store puts every replica back.
    sim.run_for(REPUBLISH);
    for (r, h) in holders(&mut sim).into_iter().enumerate() {
        let key = Key::object(NAME, r as u8);
        assert_eq!(
            sim.nodes[h].values(&key, sim.now),
            vec![VALUE.to_vec()],
            "replica {r} not re-stored"
        );
    }
    let readers = sim.sample(50, &[owner]);
    let got = sim.resolve_all(&readers, NAME, K);
    let by_answered = assert_all_resolved(&got, "after crash");
    eprintln!(
        "killed {} of {} nodes: {surviving}/{} replicas still held; resolves by replicas answering \
         (0..={K}+1) {early:?}; after the re-store {by_answered:?}",
        victims.len(),
        victims.len() + sim.sorted().len(),
        K + 1
    );
}

#[test]
fn resolve_hears_every_replica_and_empty_ones_hide_nothing() {
    let mut sim = Sim::ring(5, 50, Config::default(), (0, 0), 20);
    let before = holders(&mut sim);
    let mut not = before.clone();
    not.push(0);
    let owner = sim.sample(1, &not)[0];
    let op = sim
        .op(owner, |n, now| n.store(now, NAME, VALUE.to_vec(), K, TTL))
        .expect("store");
    sim.wait(owner, op, 10_000);
    // The holders of replicas 0 and 1 crash (the bootstrap node excepted).
    let gone: Vec<usize> = before[..2].iter().copied().filter(|&h| h != 0).collect();
    for &h in &gone {
        sim.kill(h);
    }
    assert_eq!(
        gone.len(),
        2,
        "choose another seed: a replica is on the bootstrap node"
    );
    sim.converge(60_000).unwrap_or_else(|e| panic!("{e}"));
    // The new holders of replicas 0 and 1 hold nothing (no re-store yet) and answer
    // so; the value still comes from replicas 2 and 3.
    for (r, &h) in holders(&mut sim).iter().enumerate().take(2) {
        assert!(sim.nodes[h]
            .values(&Key::object(NAME, r as u8), sim.now)
            .is_empty());
    }
    let reader = sim.sample(1, &[owner])[0];
    match &sim.resolve_all(&[reader], NAME, K)[0] {
        Event::Resolved {
            values,
            answered,
            replicas,
            ..
        } => {
            assert_eq!(values, &[VALUE.to_vec()]);
            assert_eq!((*answered, *replicas), (K + 1, K + 1));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn newcomers_take_over_the_keys_they_become_responsible_for() {
    let config = Config {
        republish_every: REPUBLISH,
        ..Config::default()
    };
    let mut sim = Sim::ring(6, 40, config, (1, 10), 20);
    let owner = sim.sample(1, &[0])[0];
    let op = sim
        .op(owner, |n, now| n.store(now, NAME, VALUE.to_vec(), K, TTL))
        .expect("store");
    sim.wait(owner, op, 10_000);
    let before = holders(&mut sim);
    for _ in 0..200 {
        let i = sim.add_node();
        sim.join(i, 0);
        sim.run_for(20);
    }
    sim.converge(60_000).unwrap_or_else(|e| panic!("{e}"));
    assert!(sim.now < REPUBLISH, "the owner must not have re-stored yet");
    let after = holders(&mut sim);
    assert_ne!(
        before, after,
        "choose another seed: no replica changed hands"
    );
    for (r, h) in after.into_iter().enumerate() {
        let key = Key::object(NAME, r as u8);
        assert_eq!(
            sim.nodes[h].values(&key, sim.now),
            vec![VALUE.to_vec()],
            "replica {r} not handed to node {h}"
        );
    }
}
