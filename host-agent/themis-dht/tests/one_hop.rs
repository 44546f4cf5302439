//! One-hop routing on small rings: holders computed from the membership, no lookups
//! through others, neighbours that cannot rewire the ring, newcomers handed their
//! objects, and members that fail passed over by the node that saw it only.

mod sim;

use sim::Sim;
use themis_dht::{Config, Contact, Event, Key, Members, Message, Node, Request};

fn members_of(sim: &Sim, nodes: impl IntoIterator<Item = usize>) -> Members<usize> {
    Members::new(nodes.into_iter().map(|i| sim.contact(i)))
}

/// The member at or after `key`, from the sorted ids of `members`.
fn holder_of(members: &Members<usize>, key: &Key) -> usize {
    members.clockwise_from(key).next().expect("members").addr
}

#[test]
fn stores_and_resolves_go_straight_to_the_holders() {
    let mut sim = Sim::one_hop(21, 16, Config::default(), (1, 5), None);
    let members = sim.nodes[0].members().expect("one hop").clone();
    let op = sim
        .op(3, |n, now| n.store(now, b"svc", b"v1".to_vec(), 4, 600_000))
        .expect("store");
    assert!(matches!(
        sim.wait(3, op, 5_000),
        Event::Stored { stored: 5, .. }
    ));
    for r in 0..=4 {
        let key = Key::object(b"svc", r);
        let h = holder_of(&members, &key);
        assert_eq!(sim.nodes[h].values(&key, sim.now), vec![b"v1".to_vec()]);
    }
    let got = sim.resolve_all(&[7], b"svc", 4);
    assert!(
        matches!(&got[0], Event::Resolved { values, answered: 5, replicas: 5, hops: 0, .. } if values == &[b"v1".to_vec()]),
        "{got:?}"
    );
    let lookups: u64 = sim.nodes.iter().map(|n| n.stats().lookup_hops).sum();
    assert_eq!(lookups, 0, "no FindStep was sent");
}

#[test]
fn a_resolve_sends_only_gets_to_the_computed_holders() {
    let contacts: Vec<Contact<usize>> = (0..8)
        .map(|i| Contact {
            id: Key([i as u8 * 31; 32]),
            addr: i,
        })
        .collect();
    let members = Members::new(contacts.clone());
    let mut node = Node::new(contacts[0].clone(), Config::default());
    node.set_members(0, members.clone());
    assert!(matches!(node.poll_event(), Some(Event::Joined { .. })));
    node.resolve(0, b"svc", 3).expect("resolve");
    let mut asked = Vec::new();
    while let Some((to, msg)) = node.poll_transmit() {
        let Message::Request {
            body: Request::Get { key },
            ..
        } = msg
        else {
            panic!("a one-hop resolve sent {msg:?}")
        };
        assert_eq!(to.addr, holder_of(&members, &key));
        asked.push(key);
    }
    let ours = (0..=3)
        .filter(|&r| holder_of(&members, &Key::object(b"svc", r)) == 0)
        .count();
    assert_eq!(asked.len() + ours, 4, "one Get per replica not held here");
}

#[test]
fn a_holder_that_fails_is_passed_over_by_whoever_saw_it_fail() {
    let mut sim = Sim::one_hop(22, 12, Config::default(), (1, 5), None);
    let members = sim.nodes[0].members().expect("one hop").clone();
    let key = Key::object(b"svc", 0);
    let dead = holder_of(&members, &key);
    let next = members
        .clockwise_from(&key)
        .nth(1)
        .expect("twelve members")
        .addr;
    sim.kill(dead);
    let owner = (0..12).find(|&i| i != dead && i != next).expect("an owner");
    let op = sim
        .op(owner, |n, now| {
            n.store(now, b"svc", b"v".to_vec(), 0, 600_000)
        })
        .expect("store");
    assert!(matches!(
        sim.wait(owner, op, 10_000),
        Event::Stored { stored: 1, .. }
    ));
    assert_eq!(sim.nodes[owner].stats().retries, 1);
    assert_eq!(sim.nodes[next].values(&key, sim.now), vec![b"v".to_vec()]);
    assert_eq!(sim.nodes[owner].members_down(sim.now), 1);

    // Another node has seen nothing fail: it asks the holder first, then the next.
    let reader = (0..12)
        .find(|&i| ![dead, next, owner].contains(&i))
        .expect("a reader");
    assert_eq!(sim.nodes[reader].members_down(sim.now), 0);
    let got = sim.resolve_all(&[reader], b"svc", 0);
    assert!(
        matches!(&got[0], Event::Resolved { values, answered: 1, .. } if values == &[b"v".to_vec()]),
        "{got:?}"
    );
    assert_eq!(sim.nodes[reader].stats().retries, 1);
    // The member stays one: back up, it is asked again once its time is served.
    assert_eq!(sim.nodes[reader].members().expect("one hop").len(), 12);
}

#[test]
fn neighbours_cannot_rewire_a_one_hop_node() {
    let mut sim = Sim::one_hop(23, 8, Config::default(), (0, 0), None);
    let me = 0;
    let pred = sim.nodes[me].predecessor().expect("a predecessor").clone();
    let succs = sim.nodes[me].successors().to_vec();
    // A stranger (not a member) and a member each claim to be our predecessor, and our
    // predecessor leaves naming a colluder as our successor.
    let stranger = sim.add_node();
    sim.inject(
        stranger,
        me,
        Message::Request {
            id: 1,
            body: Request::Notify,
        },
    );
    let member = succs.last().expect("successors").addr;
    sim.inject(
        member,
        me,
        Message::Request {
            id: 2,
            body: Request::Notify,
        },
    );
    sim.inject(
        pred.addr,
        me,
        Message::Request {
            id: 3,
            body: Request::Leaving {
                predecessor: Some(sim.contact(stranger)),
                successors: vec![sim.contact(stranger)],
            },
        },
    );
    sim.run_for(100);
    assert_eq!(sim.nodes[me].predecessor(), Some(&pred));
    assert_eq!(sim.nodes[me].successors(), &succs[..]);
    // The leaver's own farewell does count for its own liveness.
    assert_eq!(sim.nodes[me].members_down(sim.now), 1);
}

#[test]
fn a_newcomer_is_handed_what_it_now_holds() {
    let mut sim = Sim::one_hop(24, 6, Config::default(), (1, 5), None);
    for s in 0..40 {
        let name = format!("svc-{s}");
        let op = sim
            .op(s % 6, |n, now| {
                n.store(now, name.as_bytes(), b"v".to_vec(), 0, 600_000)
            })
            .expect("store");
        sim.wait(s % 6, op, 5_000);
    }
    // A seventh node is admitted: every member is given the new list.
    let new = sim.add_node();
    let members = members_of(&sim, 0..=new);
    for i in 0..=new {
        sim.op(i, |n, now| n.set_members(now, members.clone()));
    }
    sim.run_for(1_000);
    let mut moved = 0;
    for s in 0..40 {
        let key = Key::object(format!("svc-{s}").as_bytes(), 0);
        if holder_of(&members, &key) == new {
            assert_eq!(sim.nodes[new].values(&key, sim.now), vec![b"v".to_vec()]);
            moved += 1;
        }
    }
    assert!(moved > 0, "the newcomer holds some of the 40 names");
    let got = sim.resolve_all(&[1], b"svc-0", 0);
    assert!(matches!(&got[0], Event::Resolved { answered: 1, values, .. } if values.len() == 1));
}

#[test]
fn what_only_a_revoked_member_held_is_stored_again_by_its_owners_at_once() {
    let mut sim = Sim::one_hop(25, 6, Config::default(), (1, 5), None);
    let revoked = 5;
    // Names with one replica (k = 0) and with two (k = 1), owned by the other five.
    let names: Vec<(String, u8)> = (0..60)
        .map(|s| (format!("svc-{s}"), u8::from(s % 2 == 1)))
        .collect();
    for (s, (name, k)) in names.iter().enumerate() {
        let owner = s % revoked;
        let op = sim
            .op(owner, |n, now| {
                n.store(now, name.as_bytes(), b"v".to_vec(), *k, 600_000)
            })
            .expect("store");
        sim.wait(owner, op, 5_000);
    }
    let republished = |sim: &Sim| -> u64 { sim.nodes.iter().map(|n| n.stats().republished).sum() };
    let before = members_of(&sim, 0..=revoked);
    let held_only_by_revoked = |name: &str, k: u8| {
        (0..=k).all(|r| holder_of(&before, &Key::object(name.as_bytes(), r)) == revoked)
    };
    let lost: Vec<&(String, u8)> = names
        .iter()
        .filter(|(name, k)| held_only_by_revoked(name, *k))
        .collect();
    assert!(
        lost.iter().any(|(_, k)| *k == 0) && lost.iter().any(|(_, k)| *k == 1),
        "the revoked member held every replica of some names of each kind: {lost:?}"
    );

    // A list given again unchanged stores nothing again.
    let quiet = republished(&sim);
    sim.op(0, |n, now| n.set_members(now, before.clone()));
    assert_eq!(
        republished(&sim),
        quiet,
        "an unchanged list stores nothing again"
    );

    // The member's key is revoked: it says no farewell and hands nothing over, and
    // every other member is given the list without it long before the next
    // republish (60 s).
    sim.kill(revoked);
    let after = members_of(&sim, 0..revoked);
    for i in 0..revoked {
        sim.op(i, |n, now| n.set_members(now, after.clone()));
    }
    sim.run_for(1_000);
    // Only the names it held alone were stored again, each replica once.
    let restored: u64 = lost.iter().map(|(_, k)| u64::from(*k) + 1).sum();
    assert_eq!(republished(&sim) - quiet, restored);
    for (name, k) in &lost {
        for r in 0..=*k {
            let key = Key::object(name.as_bytes(), r);
            assert_eq!(
                sim.nodes[holder_of(&after, &key)].values(&key, sim.now),
                vec![b"v".to_vec()],
                "{name} replica {r} at its new holder"
            );
        }
    }
    // Every name resolves from every member, the others from the replica left.
    for (name, k) in &names {
        for event in sim.resolve_all(&[0, 1, 2, 3, 4], name.as_bytes(), *k) {
            assert!(
                matches!(&event, Event::Resolved { values, .. } if values == &[b"v".to_vec()]),
                "{name}: {event:?}"
            );
        }
    }
}
