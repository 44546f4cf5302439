//! Two "hosts": network namespaces joined by a veth pair, an agent in each, talking
//! over the link between them (not loopback). Needs root (skipped without it;
//! scripts/test.sh runs it).

use std::time::Duration;

use themis_testkit::agent::{self as common, wait_stable, Agent, Spawn, FAST};
use themis_testkit::netns::{self, Net};
use themis_testkit::require;

#[test]
fn agents_on_two_hosts_joined_by_a_veth_pair() {
    if !require::root("creates network namespaces") {
        return;
    }
    let root = common::workdir();
    let hosts = Net::create("agents");
    let addrs = [Net::NODE4, Net::PEER4];
    let listen = [format!("{}:7400", addrs[0]), format!("{}:7400", addrs[1])];
    let mut a = Agent::spawn(
        root.path(),
        "host-a",
        Spawn {
            listen: &listen[0],
            netns: Some(&hosts.node),
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

    b.register("check", "check-1", &format!("{}:15006", addrs[1]));
    assert_eq!(
        a.endpoints("check"),
        Some(vec![format!("{}:15006", addrs[1])])
    );
    a.register("handler", "handler-1", &format!("{}:15006", addrs[0]));
    assert_eq!(
        b.endpoints("handler"),
        Some(vec![format!("{}:15006", addrs[0])])
    );

    // The link goes down: each side detects the failure by timeouts and drops the
    // other. When it comes back, b joins again through a and the ring heals.
    hosts.set_peer_link(false);
    b.wait_for("failure detection", Duration::from_secs(30), |b| {
        let (_, ring) = b.get("/v1/ring")?;
        (ring["successors"][0]["addr"] != listen[0].as_str()).then_some(())
    });
    hosts.set_peer_link(true);
    wait_stable(&[&a, &b], Duration::from_secs(60));
    for agent in [&a, &b] {
        agent.wait_for(
            "resolution over the restored link",
            Duration::from_secs(30),
            |x| x.endpoints("handler").filter(|e| e.len() == 1),
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
