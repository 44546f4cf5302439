//! Real agents as separate processes on loopback: they form a ring, register and
//! resolve services through each other, leave gracefully without losing objects, and
//! survive losing a third of the nodes at once. With the agents' default routing (one
//! hop), and the leave and the loss again with Chord's (`--routing chord`), whose
//! hand-over and ring repair are their own.

use themis_testkit::agent as common;

use std::sync::Mutex;
use std::time::Duration;

use common::{ring, ring_routed, wait_stable, Agent, Routing, FAST};
use themis_dht::Key;

/// Held by the tests that run 32 agents, so that two such rings never share the
/// machine.
static THIRTY_TWO: Mutex<()> = Mutex::new(());

#[test]
fn three_agents_register_on_one_and_resolve_on_every_other() {
    let root = common::workdir();
    let agents = ring(root.path(), 3, FAST);
    wait_stable(&agents.iter().collect::<Vec<_>>(), Duration::from_secs(30));

    let registered = agents[1].register("check", "check-1", "127.0.0.1:15006");
    assert_eq!(
        registered["stored"], 5,
        "k = 4 (the default): five replicas: {registered}"
    );
    let check_id = registered["registration"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    for agent in &agents {
        let answer = agent.resolve("check").expect("resolve answers");
        let instances = answer["instances"].as_array().unwrap();
        assert_eq!(instances.len(), 1, "{}: {answer}", agent.name);
        assert_eq!(instances[0]["endpoint"], "127.0.0.1:15006");
        assert_eq!(instances[0]["id"], check_id.as_str());
    }

    // The tool, as people use it.
    let (code, out, err) = agents[2].cli(&["resolve", "check"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("127.0.0.1:15006") && out.contains(&check_id),
        "{out}"
    );
    let (code, out, _) = agents[0].cli(&["ring"]);
    assert_eq!(code, 0);
    assert!(
        out.contains("predecessor") && out.contains("successor 0"),
        "{out}"
    );

    // A second instance with metadata, on a node the operator granted check too; the
    // proxy of check-1 can fetch its key.
    let (code, _, err) = agents[2].cli(&[
        "register",
        "check",
        "--workload",
        "check-2",
        "--endpoint",
        "127.0.0.1:15007",
    ]);
    assert_ne!(
        code, 0,
        "a node without a grant for check registers nothing"
    );
    assert!(err.contains("may not serve check"), "{err}");
    agents[2].grant("check");
    agents[2].cli(&[
        "register",
        "check",
        "--workload",
        "check-2",
        "--endpoint",
        "127.0.0.1:15007",
        "--meta",
        "version=v2",
    ]);
    let answer = agents[0].resolve("check").unwrap();
    assert_eq!(answer["instances"].as_array().unwrap().len(), 2, "{answer}");
    let v2 = answer["instances"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["endpoint"] == "127.0.0.1:15007")
        .unwrap();
    assert_eq!(v2["metadata"]["version"], "v2");
    let (status, key) = agents[1].get("/v1/workloads/check-1/key").unwrap();
    assert_eq!(status, 200);
    assert_eq!(key["id"], check_id.as_str());
    assert!(key["private_key_pem"]
        .as_str()
        .unwrap()
        .starts_with("-----BEGIN PRIVATE KEY-----"));
    let key_file = agents[1].dir.join("workloads/check-1.key");
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(key_file).unwrap().permissions(),
    );
    assert_eq!(mode & 0o777, 0o600);

    // Deregistration withdraws the instance everywhere at once (a signed tombstone),
    // not when its record expires.
    let (code, _, err) = agents[1].cli(&["deregister", "check", "--workload", "check-1"]);
    assert_eq!(code, 0, "{err}");
    for agent in &agents {
        assert_eq!(
            agent.endpoints("check").unwrap(),
            vec!["127.0.0.1:15007"],
            "{}",
            agent.name
        );
    }
}

#[test]
fn graceful_leave_hands_objects_over() {
    graceful_leave(None);
}

/// Chord's leave: the hand-over and `Leaving` to the neighbours its stabilisation
/// found (no membership, no farewell announcement).
#[test]
fn graceful_leave_hands_objects_over_with_chord() {
    graceful_leave(Some(Routing::Chord));
}

fn graceful_leave(routing: Option<Routing>) {
    // One copy only (k = 0) and no re-storing during the test: if the leaving holder
    // did not hand its objects over, they would be gone.
    // (A flag given twice: the last wins.)
    let overrides = [
        "--replicas",
        "0",
        "--republish-secs",
        "300",
        "--record-ttl-secs",
        "600",
    ];
    let extra: Vec<&str> = FAST.iter().copied().chain(overrides).collect();
    let root = common::workdir();
    let mut agents = ring_routed(root.path(), 4, &extra, routing);
    wait_stable(&agents.iter().collect::<Vec<_>>(), Duration::from_secs(30));

    // Register services on agent-0 until one lands on another node than its owner.
    let (service, holder) = (0..32)
        .find_map(|i| {
            let service = format!("svc-{i}");
            let key = hex::encode(Key::object(service.as_bytes(), 0).0);
            let (_, found) = agents[0].get(&format!("/v1/debug/find/{key}")).unwrap();
            let holder = agents
                .iter()
                .position(|a| a.id == found["node"]["id"].as_str().unwrap())?;
            (holder != 0).then_some((service, holder))
        })
        .expect("some name is held by another node");
    agents[0].register(&service, "w", "127.0.0.1:8080");
    let (_, ring_view) = agents[holder].get("/v1/ring").unwrap();
    assert_eq!(
        ring_view["objects"].as_array().unwrap().len(),
        1,
        "{ring_view}"
    );

    assert_eq!(
        agents[holder].terminate(),
        Some(0),
        "a clean exit after SIGTERM"
    );
    assert!(agents[holder].log().contains("left the ring"));
    for (i, agent) in agents.iter().enumerate().filter(|(i, _)| *i != holder) {
        let endpoints =
            agent.wait_for("resolution after the leave", Duration::from_secs(20), |a| {
                a.endpoints(&service).filter(|e| !e.is_empty())
            });
        assert_eq!(endpoints, vec!["127.0.0.1:8080"], "agent-{i}");
    }
}

#[test]
fn thirty_two_agents_survive_a_third_killed() {
    thirty_two_lose_a_third(None);
}

/// Chord repairs its ring from the successor lists: the survivors' lists close
/// over the dead.
#[test]
fn thirty_two_agents_survive_a_third_killed_with_chord() {
    thirty_two_lose_a_third(Some(Routing::Chord));
}

fn thirty_two_lose_a_third(routing: Option<Routing>) {
    let _alone = THIRTY_TWO.lock().unwrap_or_else(|e| e.into_inner());
    let root = common::workdir();
    let mut agents = ring_routed(root.path(), 32, FAST, routing);
    // (With one hop, until every agent holds all 32 members.)
    wait_stable(&agents.iter().collect::<Vec<_>>(), Duration::from_secs(90));
    let one_hop = routing != Some(Routing::Chord);

    // Eight services, registered on the first eight nodes, resolved on all 32.
    let services: Vec<(String, String)> = (0..8)
        .map(|i| {
            let (service, endpoint) = (format!("service-{i}"), format!("127.0.0.1:{}", 20000 + i));
            agents[i].register(&service, &format!("w{i}"), &endpoint);
            (service, endpoint)
        })
        .collect();
    for agent in &agents {
        for (service, endpoint) in &services {
            assert_eq!(
                agent.endpoints(service),
                Some(vec![endpoint.clone()]),
                "{} resolving {service}",
                agent.name
            );
        }
    }

    // SIGKILL a third (none of the owners): no farewell, no hand-over.
    for agent in agents.iter_mut().skip(8).step_by(2).take(11) {
        agent.kill();
    }
    let survivors: Vec<&Agent> = agents.iter().filter(|a| a.pid().is_some()).collect();
    assert_eq!(survivors.len(), 21);
    if !one_hop {
        wait_stable(&survivors, Duration::from_secs(90));
    }
    for agent in &survivors {
        for (service, endpoint) in &services {
            let endpoints =
                agent.wait_for("resolution after the kill", Duration::from_secs(30), |a| {
                    a.endpoints(service).filter(|e| !e.is_empty())
                });
            assert_eq!(
                endpoints,
                vec![endpoint.clone()],
                "{} resolving {service}",
                agent.name
            );
        }
        // One hop takes no liveness from peers: the dead, who said no goodbye, are
        // still members (until their announcements lapse); the survivor passed over
        // those its own requests found dead and asked the next member.
        if one_hop {
            assert_eq!(members(agent), Some(32), "{}", agent.name);
        }
    }
}

/// How many members the agent routes over (one-hop routing).
fn members(agent: &Agent) -> Option<u64> {
    agent.get("/v1/ring")?.1["members"].as_u64()
}
