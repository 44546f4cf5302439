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

/// Found by the `dht_node` fuzz target: a bootstrap that answers our join with our own
/// id (directly, or by pointing us back at ourselves) made us report `Joined` with
/// ourselves as successor, alone in a "ring". The join now fails instead.
#[test]
fn a_join_answered_with_our_own_id_fails() {
    let me = Contact {
        id: Key([0x80; 32]),
        addr: 1usize,
    };
    let boot = Contact {
        id: Key([0x03; 32]),
        addr: 2usize,
    };
    for answer in [
        Response::Responsible { node: me.clone() },
        Response::Closer { node: me.clone() },
    ] {
        let mut n = Node::new(me.clone(), Config::default());
        n.join(0, boot.clone()).unwrap();
        // The bootstrap is asked again after a bad answer; it keeps giving it.
        while let Some((to, msg)) = n.poll_transmit() {
            assert_eq!(to, boot);
            let Message::Request { id, .. } = msg else {
                panic!("a join sends requests only")
            };
            let body = answer.clone();
            n.handle(1, boot.clone(), Message::Response { id, body });
        }
        assert_eq!(n.poll_event(), Some(Event::JoinFailed));
        assert!(!n.is_joined());
        if matches!(answer, Response::Responsible { .. }) {
            assert_eq!(n.stats().rejected(Rejection::BadResponsible), 1);
        }
    }
}

/// Found by the `dht_node` fuzz target: a node that lost every contact, rejoined and
/// failed went idle, and an idle node ignored `handle_timeout`, so an operation still
/// waiting on a request then was never reported. Its requests now time out as usual.
#[test]
fn operations_complete_after_a_failed_rejoin() {
    let contact = |b: u8, addr: usize| Contact {
        id: Key([b; 32]),
        addr,
    };
    let (me, boot, succ) = (contact(0x80, 1), contact(0x03, 2), contact(0x90, 3));
    let mut n = Node::new(me, Config::default());
    let request_to = |n: &mut Node<usize>, to: &Contact<usize>| loop {
        match n.poll_transmit() {
            Some((c, Message::Request { id, .. })) if &c == to => return id,
            Some(_) => continue,
            None => panic!("no request to {to:?}"),
        }
    };
    n.join(0, boot.clone()).unwrap();
    let id = request_to(&mut n, &boot);
    let body = Response::Responsible { node: succ.clone() };
    n.handle(0, boot.clone(), Message::Response { id, body });
    assert!(matches!(n.poll_event(), Some(Event::Joined { .. })));
    n.handle_timeout(0); // stabilise: GetNeighbours to our successor
    let _ = request_to(&mut n, &succ);
    // A find that waits on our successor until 1010.
    let op = n.find(10, Key([0x20; 32])).unwrap();
    let _ = request_to(&mut n, &succ);
    // At 1000 the successor has not answered GetNeighbours: we are cut off and rejoin
    // through the bootstrap, which refuses; the node is idle again.
    n.handle_timeout(1000);
    let id = request_to(&mut n, &boot);
    let body = Response::Rejected;
    n.handle(1001, boot.clone(), Message::Response { id, body });
    assert_eq!(n.poll_event(), Some(Event::JoinFailed));
    assert!(!n.is_joined());
    // The find still times out and is reported.
    assert!(n.poll_timeout().is_some_and(|t| t <= 1010));
    n.handle_timeout(1010);
    assert!(matches!(n.poll_event(), Some(Event::NotFound { op: o, .. }) if o == op));
}
