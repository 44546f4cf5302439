//! Two "hosts": network namespaces joined by a veth pair, an agent in each, talking
//! over the link between them (not loopback), with the agents' default routing (one
//! hop) and with Chord's. Needs root (skipped without it; scripts/test.sh runs it).

use std::time::Duration;

use themis_testkit::agent::{self as common, wait_stable, Agent, Routing, Spawn, FAST};
use themis_testkit::netns::{self, Net};
use themis_testkit::require;

#[test]
fn agents_on_two_hosts_joined_by_a_veth_pair() {
    two_hosts("agents", None);
}

/// Chord: each side drops the other from its successor list by timeouts, and the ring
/// heals through its bootstrap node once the link is back.
#[test]
fn chord_agents_on_two_hosts_joined_by_a_veth_pair() {
    two_hosts("chord", Some(Routing::Chord));
}

fn two_hosts(name: &str, routing: Option<Routing>) {
    if !require::root("creates network namespaces") {
        return;
    }
    let root = common::workdir();
    let hosts = Net::create(name);
    let addrs = [Net::NODE4, Net::PEER4];
    let listen = [format!("{}:7400", addrs[0]), format!("{}:7400", addrs[1])];
    let mut a = Agent::spawn(
        root.path(),
        "host-a",
        Spawn {
            listen: &listen[0],
            netns: Some(&hosts.node),
            routing,
            ..Spawn::default()
        },
    );
    let mut b = Agent::spawn(
        root.path(),
        "host-b",
        Spawn {
            listen: &listen[1],
            join: Some(&a.contact),
            extra: FAST,
            netns: Some(&hosts.peer),
            routing,
            env: &[],
        },
    );
    a.wait_joined();
    b.wait_joined();
    wait_stable(&[&a, &b], Duration::from_secs(30));

    // Each sees the other at its address on the link.
    let (_, ring) = a.get("/v1/ring").unwrap();
    assert_eq!(ring["successors"][0]["addr"], listen[1].as_str(), "{ring}");
    let (_, ring) = b.get("/v1/ring").unwrap();
    assert_eq!(ring["successors"][0]["addr"], listen[0].as_str(), "{ring}");

    let check = format!("{}:15006", addrs[1]);
    let handler = format!("{}:15006", addrs[0]);
    b.register("check", "check-1", &check);
    assert_eq!(a.endpoints("check"), Some(vec![check.clone()]));
    a.register("handler", "handler-1", &handler);
    assert_eq!(b.endpoints("handler"), Some(vec![handler.clone()]));

    hosts.set_peer_link(false);
    if routing == Some(Routing::Chord) {
        // The link goes down: each side detects the failure by timeouts and drops
        // the other. When it comes back, b joins again through a and the ring heals.
        b.wait_for("failure detection", Duration::from_secs(30), |b| {
            let (_, ring) = b.get("/v1/ring")?;
            (ring["successors"][0]["addr"] != listen[0].as_str()).then_some(())
        });
        hosts.set_peer_link(true);
        wait_stable(&[&a, &b], Duration::from_secs(60));
    } else {
        // The link goes down: the other stays a member (one hop takes no liveness
        // from peers), each side passes it over once its own requests to it time
        // out, and still resolves its own service, from itself. The other's records
        // lapse here (10 s), their owner unable to re-store them across the cut: from
        // then on the other's service resolves only over the link. When the link is
        // back (once it hears from the other, or its 30 s pass is over), each asks
        // the other again.
        for (agent, service, endpoint) in [(&b, "check", &check), (&a, "handler", &handler)] {
            agent.wait_for(
                "its own service with the link down",
                Duration::from_secs(30),
                |x| {
                    x.endpoints(service)
                        .filter(|e| e.as_slice() == std::slice::from_ref(endpoint))
                },
            );
        }
        for (agent, service) in [(&a, "check"), (&b, "handler")] {
            agent.wait_for(
                "the other's records to lapse with the link down",
                Duration::from_secs(30),
                |x| x.endpoints(service).filter(|e| e.is_empty()),
            );
        }
        hosts.set_peer_link(true);
    }
    // Each resolves the other's service over the restored link.
    for (agent, service, endpoint) in [(&a, "check", &check), (&b, "handler", &handler)] {
        agent.wait_for(
            "resolution over the restored link",
            Duration::from_secs(60),
            |x| {
                x.endpoints(service)
                    .filter(|e| e.as_slice() == std::slice::from_ref(endpoint))
            },
        );
    }
    assert!(b.log().contains("joined the ring"));

    assert_eq!(b.terminate(), Some(0));
    assert_eq!(a.terminate(), Some(0));
    let names = [hosts.node.clone(), hosts.peer.clone()];
    drop(hosts);
    for ns in names {
        assert!(!netns::exists(&ns), "{ns} was not deleted");
    }
}
