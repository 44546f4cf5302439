//! Bad input at every entry point is refused with a typed, counted reason, and the
//! node keeps working.

mod sim;

use sim::Sim;
use themis_dht::message::{
    Object, MAX_AVOID, MAX_HANDOVER_OBJECTS, MAX_NAME_LEN, MAX_REPLICAS, MAX_SUCCESSORS,
    MAX_VALUES_PER_KEY, MAX_VALUE_LEN,
};
use themis_dht::{Config, Contact, Event, Key, Message, Node, Rejection, Request, Response};

fn ring() -> Sim {
    Sim::ring(7, 8, Config::default(), (0, 0), 20)
}

/// A key half the ring away from node `i`: its lookup needs a remote step.
fn far_key(sim: &Sim, i: usize) -> Key {
    sim.nodes[i].contact().id.finger_target(255)
}

#[test]
fn user_operations_check_their_arguments() {
    let mut sim = ring();
    let n = &mut sim.nodes[1];
    let big = vec![0u8; MAX_VALUE_LEN + 1];
    assert_eq!(
        n.store(0, b"svc", big, 1, 1000),
        Err(Rejection::ValueTooLarge)
    );
    assert_eq!(
        n.store(0, b"svc", b"v".to_vec(), MAX_REPLICAS + 1, 1000),
        Err(Rejection::TooManyReplicas)
    );
    assert_eq!(
        n.resolve(0, b"svc", MAX_REPLICAS + 1),
        Err(Rejection::TooManyReplicas)
    );
    assert_eq!(
        n.resolve(0, &[b'x'; MAX_NAME_LEN + 1], 0),
        Err(Rejection::NameTooLong)
    );
    assert_eq!(n.create(0), Err(Rejection::AlreadyJoined));
    let s = n.stats();
    assert_eq!(s.rejected(Rejection::ValueTooLarge), 1);
    assert_eq!(s.rejected(Rejection::TooManyReplicas), 2);
    assert_eq!(s.rejected(Rejection::NameTooLong), 1);

    let mut lone = Node::new(
        Contact {
            id: Key([9; 32]),
            addr: 99usize,
        },
        Config::default(),
    );
    assert_eq!(lone.find(0, Key([1; 32])), Err(Rejection::NotJoined));
    lone.handle(
        0,
        sim.contact(1),
        Message::Request {
            id: 1,
            body: Request::Ping,
        },
    );
    assert_eq!(lone.stats().rejected(Rejection::NotRunning), 1);
    assert!(
        lone.poll_transmit().is_none(),
        "an idle node answers nothing"
    );
}

#[test]
fn oversize_messages_are_refused_before_use() {
    let mut sim = ring();
    let (a, b) = (1, 2);
    let c = |id| Contact {
        id: Key([id; 32]),
        addr: 0usize,
    };
    let bad: Vec<Message<usize>> = vec![
        Message::Request {
            id: 1,
            body: Request::Store {
                key: Key([1; 32]),
                value: vec![0; MAX_VALUE_LEN + 1],
                ttl_ms: 1,
            },
        },
        Message::Request {
            id: 2,
            body: Request::FindStep {
                key: Key([1; 32]),
                avoid: vec![Key([2; 32]); MAX_AVOID + 1],
            },
        },
        Message::Request {
            id: 3,
            body: Request::Handover {
                objects: vec![
                    Object {
                        key: Key([1; 32]),
                        value: vec![1],
                        ttl_ms: 1
                    };
                    MAX_HANDOVER_OBJECTS + 1
                ],
            },
        },
        Message::Request {
            id: 4,
            body: Request::Leaving {
                predecessor: None,
                successors: vec![c(3); MAX_SUCCESSORS + 1],
            },
        },
        Message::Response {
            id: 5,
            body: Response::Values {
                values: vec![vec![1]; MAX_VALUES_PER_KEY + 1],
            },
        },
        Message::Response {
            id: 6,
            body: Response::Neighbours {
                predecessor: None,
                successors: vec![c(3); MAX_SUCCESSORS + 1],
            },
        },
    ];
    let count = bad.len() as u64;
    for msg in bad {
        sim.inject(b, a, msg);
    }
    sim.run_for(10);
    assert_eq!(sim.nodes[a].stats().rejected(Rejection::OverLimit), count);
    assert!(
        sim.nodes[a].objects(sim.now).is_empty(),
        "nothing from a refused message was stored"
    );
    still_works(&mut sim, a);
}

#[test]
fn stray_and_forged_responses_are_ignored() {
    let mut sim = ring();
    let a = 1;
    let key = far_key(&sim, a);

    // A response to a request never made.
    sim.inject(
        2,
        a,
        Message::Response {
            id: 987_654,
            body: Response::Ack,
        },
    );
    // A message claiming to be from the node itself.
    let me = sim.contact(a);
    sim.op(a, |n, now| {
        n.handle(
            now,
            me,
            Message::Request {
                id: 1,
                body: Request::Ping,
            },
        )
    });
    sim.run_for(10);

    // Start a lookup and hold its first step back.
    let op = sim.op(a, |n, now| n.find(now, key)).expect("find");
    let (to, step) = {
        // `op` drained the transmit into the queue; take it out by replaying by hand.
        sim.take_queued(a).expect("a FindStep was sent")
    };
    let Message::Request {
        id,
        body: Request::FindStep { .. },
    } = step.clone()
    else {
        panic!("{step:?}")
    };
    // A third node answers for the peer we asked, claiming a bogus responsible node: ignored.
    let forger = (0..sim.nodes.len())
        .find(|&i| i != a && i != to)
        .expect("a third node");
    let bogus = Message::Response {
        id,
        body: Response::Responsible {
            node: sim.contact(forger),
        },
    };
    sim.inject(forger, a, bogus);
    // The peer we asked answers with the wrong kind of response: dropped from the lookup.
    sim.inject(
        to,
        a,
        Message::Response {
            id,
            body: Response::Values { values: vec![] },
        },
    );
    sim.run_for(10);
    let s = sim.nodes[a].stats();
    assert_eq!(s.rejected(Rejection::UnknownRequest), 1);
    assert_eq!(s.rejected(Rejection::FromSelf), 1);
    assert_eq!(s.rejected(Rejection::UnexpectedSender), 1);
    assert_eq!(s.rejected(Rejection::UnexpectedResponse), 1);
    // ...and the lookup still ends with the right node, through another candidate.
    match sim.wait(a, op, 10_000) {
        Event::Found { node, .. } => assert_eq!(node.addr, sim.responsible(&key)),
        other => panic!("{other:?}"),
    }
    still_works(&mut sim, a);
}

/// The node still finds keys, stores and resolves, and the ring is intact.
fn still_works(sim: &mut Sim, a: usize) {
    let key = far_key(sim, a);
    let op = sim.op(a, |n, now| n.find(now, key)).expect("find");
    match sim.wait(a, op, 10_000) {
        Event::Found { node, .. } => assert_eq!(node.addr, sim.responsible(&key)),
        other => panic!("{other:?}"),
    }
    let op = sim
        .op(a, |n, now| n.store(now, b"svc", b"v".to_vec(), 2, 60_000))
        .expect("store");
    assert!(matches!(
        sim.wait(a, op, 10_000),
        Event::Stored { stored: 3, .. }
    ));
    let got = sim.resolve_all(&[a], b"svc", 2);
    assert!(matches!(&got[0], Event::Resolved { values, .. } if values == &[b"v".to_vec()]));
    assert_eq!(sim.ring_errors(), 0);
}
