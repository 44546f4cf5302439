//! The eclipse defence: peers that answer `FindStep` without progress, or name a
//! responsible node that cannot be, are dropped and lookups still find the true
//! responsible node.

mod sim;

use sim::{Adversary, FindLie, Sim};
use themis_dht::{Config, Event, Key, Rejection};

#[test]
fn lookups_route_around_peers_that_make_no_progress() {
    let mut sim = Sim::ring(4, 200, Config::default(), (1, 10), 20);
    sim.run_for(20_000);
    let bad = sim.sample(8, &[0]);
    let lies = [
        FindLie::PointsAtItself,
        FindLie::PointsBackwards,
        FindLie::ResponsibleBeforeKey,
        FindLie::ClaimsItself,
    ];
    for (n, &b) in bad.iter().enumerate() {
        sim.adversaries
            .insert(b, Adversary::find(lies[n % lies.len()]));
    }

    // Random keys, plus the keys just past each adversary: those the adversary would be
    // asked about last, where only the successor lists of honest peers help.
    let mut keys: Vec<Key> = (0..300).map(|_| sim.random_key()).collect();
    for &b in &bad {
        let id = sim.nodes[b].contact().id;
        keys.extend((0..20).map(|i| id.wrapping_add(Key::from_low(i + 1))));
    }
    let mut ops = Vec::new();
    for key in keys {
        let from = sim.sample(1, &bad)[0];
        let op = sim.op(from, |n, now| n.find(now, key)).expect("find");
        ops.push((from, op, key));
    }
    let pairs: Vec<_> = ops.iter().map(|&(i, op, _)| (i, op)).collect();
    sim.wait_all(&pairs, 60_000);
    for &(i, op, key) in &ops {
        match sim.event(i, op).cloned() {
            Some(Event::Found { node, .. }) => {
                assert_eq!(
                    node.addr,
                    sim.responsible(&key),
                    "lookup of {key:?} from {i} was misled"
                )
            }
            other => panic!("lookup of {key:?} from {i}: {other:?}"),
        }
    }
    let count =
        |sim: &Sim, r| -> u64 { sim.live().map(|i| sim.nodes[i].stats().rejected(r)).sum() };
    let no_progress = count(&sim, Rejection::NoProgress);
    let bad_responsible = count(&sim, Rejection::BadResponsible);
    assert!(no_progress > 0, "the misrouting adversaries were never met");
    assert!(
        bad_responsible > 0,
        "the false `Responsible` adversaries were never met"
    );
    eprintln!(
        "{} lookups correct; adversaries dropped {no_progress} times for no progress, \
         {bad_responsible} times for naming an impossible responsible node",
        ops.len()
    );
}
