//! Edge cases of tiny rings: one node alone, two nodes, and leaving down to one.

mod sim;

use sim::Sim;
use themis_dht::{Config, Event, Key};

#[test]
fn a_lone_node_stores_and_resolves_locally() {
    let mut sim = Sim::new(8, Config::default(), (0, 0));
    let a = sim.add_node();
    sim.create(a);
    let op = sim
        .op(a, |n, now| n.store(now, b"svc", b"v".to_vec(), 3, 60_000))
        .expect("store");
    assert_eq!(
        sim.wait(a, op, 1_000),
        Event::Stored {
            op,
            stored: 4,
            replicas: 4
        }
    );
    let got = sim.resolve_all(&[a], b"svc", 3);
    assert!(
        matches!(&got[0], Event::Resolved { values, answered: 4, replicas: 4, hops: 0, .. } if values == &[b"v".to_vec()])
    );
    let key = Key([7; 32]);
    let op = sim.op(a, |n, now| n.find(now, key)).expect("find");
    assert!(matches!(sim.wait(a, op, 1_000), Event::Found { node, hops: 0, .. } if node.addr == a));
    assert_eq!(sim.delivered, 0, "a lone node sends nothing");
}

#[test]
fn rings_of_two_and_three_converge_and_shrink_back_to_one() {
    let mut sim = Sim::ring(9, 3, Config::default(), (1, 10), 20);
    let op = sim
        .op(1, |n, now| n.store(now, b"svc", b"v".to_vec(), 2, 600_000))
        .expect("store");
    assert!(matches!(
        sim.wait(1, op, 5_000),
        Event::Stored { stored: 3, .. }
    ));
    sim.leave(2);
    sim.converge(30_000)
        .unwrap_or_else(|e| panic!("two left: {e}"));
    sim.leave(1);
    sim.converge(30_000)
        .unwrap_or_else(|e| panic!("one left: {e}"));
    assert_eq!(
        sim.nodes[0].successor().id,
        sim.nodes[0].contact().id,
        "alone again"
    );
    // Everything was handed to node 0 on the way.
    let got = sim.resolve_all(&[0], b"svc", 2);
    assert!(
        matches!(&got[0], Event::Resolved { values, answered: 3, replicas: 3, .. } if values == &[b"v".to_vec()])
    );
}
