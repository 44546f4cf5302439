//! One-hop routing through real agents (issue 23, docs/PROTOCOL.md §6.14): 32 agents
//! on loopback gossip their signed addresses until each holds the full membership,
//! resolve with no lookup through others, and a revocation published to one agent
//! reaches all 32 by gossip, with the trust log's periodic sync turned off so that
//! gossip is all that carries it. The reach is printed (`--nocapture`); the bound
//! asserted is generous (the target is 5 s at p99; the figure belongs to
//! benchmarks/RESULTS.md).

use themis_testkit::agent as common;

use std::time::{Duration, Instant};

use common::{Agent, MESH};
use serde_json::json;
use themis_agent_client::Method;
use themis_core::{MeshName, PeerId};
use themis_testkit::process::{poll_until, wait_until};
use themis_trust::{chain_from_pem, InstanceValue, Record, Signed, RECORD_LABEL};

const AGENTS: usize = 32;

/// The harness's fast settings, with one-hop routing, gossip every 500 ms and the
/// log's backstop sync off.
fn one_hop() -> Vec<&'static str> {
    let more = [
        "--routing",
        "one-hop",
        "--gossip-ms",
        "500",
        "--log-sync-ms",
        "3600000",
    ];
    common::FAST.iter().copied().chain(more).collect()
}

fn members(agent: &Agent) -> Option<u64> {
    agent.get("/v1/ring")?.1["members"].as_u64()
}

fn log_size(agent: &Agent) -> u64 {
    agent
        .get("/v1/log")
        .and_then(|(_, s)| s["size"].as_u64())
        .unwrap_or(0)
}

/// Publishes through `via` a revocation of a fresh id; returns the log size it made,
/// how long the operator's command took (until `via` held the log), and for each
/// agent how long after that it held the log (0 for `via`).
fn revocation_reach(
    agents: &[Agent],
    via: &Agent,
    mesh_dir: &std::path::Path,
    salt: u8,
) -> (u64, Duration, Vec<Duration>) {
    let id = PeerId([salt; 32]).printable(&MeshName::new(MESH).unwrap());
    let started = Instant::now();
    via.revoke_many(&[id], mesh_dir);
    let published = started.elapsed();
    let target = log_size(via);
    let mut reached: Vec<Option<Duration>> = vec![None; agents.len()];
    // Who is missing after 60 s is asserted below, by name.
    poll_until(Duration::from_secs(60), || {
        for (i, agent) in agents.iter().enumerate() {
            if reached[i].is_none() && log_size(agent) >= target {
                reached[i] = Some(started.elapsed());
            }
        }
        reached.iter().all(Option::is_some).then_some(())
    });
    let missing: Vec<&str> = agents
        .iter()
        .zip(&reached)
        .filter(|(_, r)| r.is_none())
        .map(|(a, _)| a.name.as_str())
        .collect();
    assert!(
        missing.is_empty(),
        "never got log size {target}: {missing:?}"
    );
    let mut times: Vec<Duration> = reached
        .into_iter()
        .flatten()
        .map(|t| t.saturating_sub(published))
        .collect();
    times.sort();
    (target, published, times)
}

fn percentile(sorted: &[Duration], p: usize) -> Duration {
    sorted[(sorted.len() * p).div_ceil(100).max(1) - 1]
}

#[test]
fn thirty_two_one_hop_agents_resolve_and_a_revocation_reaches_all_by_gossip() {
    let dir = common::workdir();
    let root = dir.path();
    let agents = common::ring(root, AGENTS, &one_hop());
    for agent in &agents {
        agent.wait_for("the full membership", Duration::from_secs(60), |a| {
            (members(a)? == AGENTS as u64).then_some(())
        });
    }

    // A service on one node resolves on every node (the holders computed, not looked up).
    agents[5].register("check", "check-0", "127.0.0.1:15006");
    for agent in &agents {
        agent.wait_for("check's instance", Duration::from_secs(30), |a| {
            (a.endpoints("check")? == ["127.0.0.1:15006"]).then_some(())
        });
    }

    // Revocations published to one agent, carried by gossip alone.
    let mesh_dir = common::mesh_dir(root);
    let (first_size, _, first) = revocation_reach(&agents, &agents[7], &mesh_dir, 0x51);
    let (size, command, times) = revocation_reach(&agents, &agents[19], &mesh_dir, 0x52);
    assert!(size > first_size);
    eprintln!(
        "one-hop gossip, {AGENTS} agents on loopback, pull every 500 ms: the first publication \
         (admissions, grant, revocation: {first_size} leaves) reached all in {:?} (p50 {:?}); \
         a second revocation (log size {size}; the operator's command took {command:?}) reached \
         every agent after the publishing one held it p50 {:?}, p99 {:?}, max {:?}",
        first.last().unwrap(),
        percentile(&first, 50),
        percentile(&times, 50),
        percentile(&times, 99),
        times.last().unwrap(),
    );
    // Generous: the target is 5 s at p99 on an idle machine.
    assert!(
        *times.last().unwrap() <= Duration::from_secs(20),
        "{times:?}"
    );
    // Every agent enforces it.
    for agent in &agents {
        let (_, known) = agent.get("/v1/revocations").unwrap();
        assert!(
            known["revocations"].as_array().unwrap().len() >= 2,
            "{}",
            agent.name
        );
    }
}

/// A record signed with a granted node's own key (stolen, or its agent modified)
/// whose endpoint is not at the address that node signed, as `POST /v1/debug/store`
/// offers it to the ring through another agent.
fn endorse_at(node_dir: &std::path::Path, workload: u8, endpoint: &str) -> Vec<u8> {
    let (node, _) = common::node_credentials(node_dir);
    let pem = std::fs::read_to_string(node_dir.join("grants").join("check.pem")).unwrap();
    let now = themis_agent::trust::unix_millis();
    let record = Record {
        mesh: MESH.into(),
        service: "check".into(),
        workload_key: [workload; 32],
        endpoint: Some(endpoint.parse().unwrap()),
        metadata: Default::default(),
        issued_at: now,
        not_after: now + 60_000,
    };
    InstanceValue {
        grants: chain_from_pem(&pem).unwrap(),
        record: Signed::sign(&node, RECORD_LABEL, &record),
    }
    .encode()
}

/// Waits until every agent resolves `check` to exactly `endpoints` (sorted).
fn wait_for_endpoints(agents: &[Agent], endpoints: &[&str]) {
    for agent in agents {
        agent.wait_for(
            &format!("check at {endpoints:?}"),
            Duration::from_secs(30),
            |a| {
                let mut got = a.endpoints("check")?;
                got.sort();
                (got == endpoints).then_some(())
            },
        );
    }
}

/// Offers `value` as an instance of `check` to the ring through `agent`
/// (`POST /v1/debug/store`, 3 replicas): its status and answer.
fn debug_store(agent: &Agent, value: &[u8]) -> (u16, serde_json::Value) {
    let body = json!({ "name": "check", "value": hex::encode(value), "hex": true, "replicas": 2 });
    agent
        .call(Method::POST, "/v1/debug/store", Some(&body))
        .unwrap()
}

/// Endpoints are owned (issue 23): with one-hop routing, an instance's endpoint must
/// be at the IP its endorsing node signed. A granted node's agent will not register
/// one elsewhere, and a record endorsed elsewhere with the node's own key and grant is
/// refused by every agent's check (the one replica holders and resolvers run); the
/// same record at the node's own address is taken, so the refusal is the endpoint's.
#[test]
fn a_granted_node_cannot_point_its_service_at_another_address() {
    let dir = common::workdir();
    let root = dir.path();
    let agents = common::ring(root, 4, &one_hop());
    for agent in &agents {
        agent.wait_for("the full membership", Duration::from_secs(60), |a| {
            (members(a)? == 4).then_some(())
        });
    }
    let endorser = &agents[1];
    endorser.register("check", "check-0", "127.0.0.1:15006");

    let body = json!({ "endpoint": "10.9.9.9:15006" });
    let (status, answer) = endorser
        .call(
            Method::PUT,
            "/v1/services/check/instances/check-1",
            Some(&body),
        )
        .unwrap();
    assert_eq!(status, 400, "registered an endpoint elsewhere: {answer}");
    let why = answer["error"].as_str().unwrap_or_default();
    assert!(why.contains("endpoint does not belong"), "{answer}");

    let elsewhere = endorse_at(&endorser.dir, 0xe1, "10.9.9.9:15006");
    for agent in &agents {
        let (status, answer) = debug_store(agent, &elsewhere);
        assert_ne!(status, 200, "{}: stored {answer}", agent.name);
    }
    let own = endorse_at(&endorser.dir, 0xe2, "127.0.0.1:15099");
    let (status, answer) = debug_store(&agents[3], &own);
    assert_eq!(status, 200, "{answer}");
    wait_for_endpoints(&agents, &["127.0.0.1:15006", "127.0.0.1:15099"]);
}

/// Pods have their own IPs (Kubernetes): the root grants a node its pod range
/// (`themis node range`), the node's agent tells it with its announcement, and an
/// endpoint in that range is the node's — registered by its agent, taken by every
/// other. Outside it, or in that range for another node, refused as before. A newer
/// grant (a narrower range) withdraws the older one, with no restart.
#[test]
fn a_nodes_pods_in_the_range_the_root_granted_it_are_its_endpoints() {
    let dir = common::workdir();
    let root = dir.path();
    let first = Agent::spawn(
        root,
        "agent-0",
        common::Spawn {
            extra: &one_hop(),
            ..common::Spawn::default()
        },
    );
    let kube_dir = root.join("agent-1");
    std::fs::create_dir_all(&kube_dir).unwrap();
    common::admit(root, &kube_dir);
    let mesh = common::mesh_dir(root);
    common::operator(&[
        "node".as_ref(),
        "range".as_ref(),
        "10.244.1.0/24".as_ref(),
        "--mesh-dir".as_ref(),
        mesh.as_os_str(),
        "--node".as_ref(),
        kube_dir.as_os_str(),
    ]);
    let spawn = |name: &str| {
        Agent::spawn(
            root,
            name,
            common::Spawn {
                join: Some(&first.contact),
                extra: &one_hop(),
                ..common::Spawn::default()
            },
        )
    };
    let (kube, other) = (spawn("agent-1"), spawn("agent-2"));
    assert!(
        kube.log().contains("granted this node an address range"),
        "{}",
        kube.log_tail()
    );
    let agents = [first, kube, other];
    for agent in &agents {
        agent.wait_for("the full membership", Duration::from_secs(60), |a| {
            (members(a)? == 3).then_some(())
        });
    }
    let [_, kube, other] = &agents;
    kube.register("check", "check-pod", "10.244.1.7:15006");
    other.register("check", "check-own", "127.0.0.1:15007");
    let put = |agent: &Agent, workload: &str, endpoint: &str| {
        let body = json!({ "endpoint": endpoint });
        let path = format!("/v1/services/check/instances/{workload}");
        agent.call(Method::PUT, &path, Some(&body)).unwrap()
    };
    for (agent, endpoint) in [(kube, "10.244.2.7:15006"), (other, "10.244.1.8:15006")] {
        let (status, answer) = put(agent, "check-elsewhere", endpoint);
        assert_eq!(
            status, 400,
            "{}: registered {endpoint}: {answer}",
            agent.name
        );
    }
    // Offered to the ring with the other node's own key and grant: refused by all.
    let squatted = endorse_at(&other.dir, 0xe3, "10.244.1.9:15006");
    for agent in &agents {
        let (status, answer) = debug_store(agent, &squatted);
        assert_ne!(status, 200, "{}: stored {answer}", agent.name);
    }
    wait_for_endpoints(&agents, &["10.244.1.7:15006", "127.0.0.1:15007"]);

    // The root narrows the node's range to its lower half: a newer grant, published
    // through another agent. The node announces it by itself, from its trust log (no
    // restart); the older grant, which its earlier announcement binds, no longer
    // counts anywhere, so the upper half is nobody's.
    common::operator(&[
        "node".as_ref(),
        "range".as_ref(),
        "10.244.1.0/25".as_ref(),
        "--mesh-dir".as_ref(),
        mesh.as_os_str(),
        "--node".as_ref(),
        kube_dir.as_os_str(),
    ]);
    agents[0].publish_log(&mesh);
    // Once the node holds the newer grant, the upper half is refused at once; the
    // lower half is the node's again once it announced the new grant (which bound
    // no address before: the old one no longer counts).
    kube.wait_for("the upper half refused", Duration::from_secs(30), |a| {
        let (status, _) = put(a, "check-upper", "10.244.1.200:15006");
        (status == 400).then_some(())
    });
    kube.wait_for(
        "the lower half under the new grant",
        Duration::from_secs(30),
        |a| {
            let (status, _) = put(a, "check-lower", "10.244.1.9:15006");
            (status == 200).then_some(())
        },
    );
    assert!(
        kube.log()
            .contains("the trust log holds a newer address range grant"),
        "{}",
        kube.log_tail()
    );
    let (status, answer) = put(kube, "check-upper", "10.244.1.200:15006");
    assert_eq!(status, 400, "registered in the withdrawn half: {answer}");
    let upper = endorse_at(&kube.dir, 0xe4, "10.244.1.200:15006");
    for agent in &agents {
        agent.wait_for("the withdrawn half refused", Duration::from_secs(30), |a| {
            (debug_store(a, &upper).0 != 200).then_some(())
        });
    }
    wait_for_endpoints(
        &agents,
        &["10.244.1.7:15006", "10.244.1.9:15006", "127.0.0.1:15007"],
    );
}

/// Two histories of one length are a fork (§6.13) that sizes alone never show: with
/// the log's periodic sync off, gossip alone must bring every agent to see it. The
/// root signs one more revocation on each of two copies of the mesh (the same size,
/// two roots); one agent holds the second, away from the others, then joins them.
#[test]
fn two_histories_of_one_length_are_seen_by_gossip_alone() {
    two_histories_of_one_length(&[]);
}

/// Issue 42: on a loaded machine the one exchange that compares a member's other
/// history timed out, and the fork it would have proven was never raised. Every
/// agent fails its first comparison here on purpose (the agent's test-only fault
/// injection, read in debug builds alone): each must try again until it proves the
/// fork. (The agents 0 to 2 compare with agent-3 alone: without a retry they never
/// would.)
#[test]
fn a_fork_is_seen_though_the_first_comparison_fails() {
    two_histories_of_one_length(&[("THEMIS_TEST_FAIL_FORK_COMPARES", "1")]);
}

/// Three agents on one history, and a fourth that joins them with another of the
/// same length, every one with `env`: each must see the fork.
fn two_histories_of_one_length(env: &[(&str, &str)]) {
    let dir = common::workdir();
    let root = dir.path();
    let extra = one_hop();
    let spawn = |name: &str, join: Option<&str>| {
        let options = common::Spawn {
            join,
            extra: &extra,
            env,
            ..common::Spawn::default()
        };
        Agent::spawn(root, name, options)
    };
    let mut agents = vec![spawn("agent-0", None)];
    let contact = agents[0].contact.clone();
    for i in 1..3 {
        agents.push(spawn(&format!("agent-{i}"), Some(&contact)));
    }
    for agent in &agents {
        agent.wait_joined();
    }
    let mesh_dir = common::mesh_dir(root);
    let away_dir = root.join("agent-3");
    std::fs::create_dir_all(&away_dir).unwrap();
    common::admit(root, &away_dir);
    let twin = common::twin_mesh(root);
    let revoke = |agent: &Agent, mesh: &std::path::Path, salt: u8| {
        let id = PeerId([salt; 32]).printable(&MeshName::new(MESH).unwrap());
        let (code, out, err) = agent.revoke_ids(&[id], mesh, true);
        assert_eq!(code, 0, "{out}{err}");
    };
    revoke(&agents[0], &mesh_dir, 0x21);
    let size = log_size(&agents[0]);
    for agent in &agents {
        agent.wait_for("the first history", Duration::from_secs(30), |a| {
            (log_size(a) == size).then_some(())
        });
    }
    let mut away = spawn("agent-3", None);
    revoke(&away, &twin, 0x22);
    assert_eq!(log_size(&away), size, "the twin history is as long");
    assert_eq!(away.terminate(), Some(0));
    agents.push(spawn("agent-3", Some(&contact)));
    for agent in &agents {
        agent.wait_for("the fork to be seen", Duration::from_secs(60), |a| {
            let (_, status) = a.get("/v1/log")?;
            (!status["forks"].as_array()?.is_empty()).then_some(())
        });
        assert_eq!(
            log_size(agent),
            size,
            "{}: neither history replaced the other",
            agent.name
        );
    }
}

/// An agent that stops says goodbye (issue 23): its signed leaving announcement takes
/// it out of every peer's membership, so nobody asks it as a holder and waits for a
/// timeout; restarted, it announces itself again and is a member once more.
#[test]
fn a_stopping_agent_leaves_the_membership_and_comes_back() {
    let dir = common::workdir();
    let root = dir.path();
    let mut agents = common::ring(root, 4, &one_hop());
    let members_are = |agents: &[Agent], n: u64| {
        for agent in agents {
            agent.wait_for(&format!("{n} members"), Duration::from_secs(30), |a| {
                (members(a)? == n).then_some(())
            });
        }
    };
    members_are(&agents, 4);
    let mut leaving = agents.pop().unwrap();
    let code = leaving.terminate();
    assert_eq!(code, Some(0), "{}", leaving.log_tail());
    assert!(
        leaving.log().contains("said goodbye to the membership"),
        "{}",
        leaving.log_tail()
    );
    members_are(&agents, 3);
    let back = Agent::spawn(
        root,
        "agent-3",
        common::Spawn {
            join: Some(&agents[0].contact),
            extra: &one_hop(),
            ..common::Spawn::default()
        },
    );
    agents.push(back);
    members_are(&agents, 4);
}

/// Gossip fails closed (issue 23): a stranger with a self-made key, presenting no
/// admission or a real node's copied one, and announcing itself in a roster frame,
/// is answered `rejected` (or not at all), learns no member, and is not taken into
/// the membership.
#[test]
fn a_stranger_gets_nothing_of_the_roster_and_is_no_member() {
    use std::sync::Arc;
    use themis_agent::gossip::RosterFrame;
    use themis_agent::overlay::Frame;
    use themis_trust::{Announcement, ANNOUNCEMENT_LABEL};

    let dir = common::workdir();
    let root = dir.path();
    let agents = common::ring(root, 2, &one_hop());
    for agent in &agents {
        agent.wait_for("2 members", Duration::from_secs(30), |a| {
            (members(a)? == 2).then_some(())
        });
    }
    let target = &agents[0];
    let stolen = common::node_credentials(&agents[1].dir).1;
    let stranger = Arc::new(themis_testkit::intruder::self_made_key(MESH));
    let announcement = Signed::sign(
        &stranger,
        ANNOUNCEMENT_LABEL,
        &Announcement {
            mesh: MESH.into(),
            address: "127.0.0.1:9".parse().unwrap(),
            issued_at: themis_agent::trust::unix_millis(),
            leaving: false,
            address_range: None,
        },
    )
    .encode();
    let requests = [vec![0x5a; 64], stolen].map(|admission| {
        Frame::Roster(RosterFrame {
            admission: Some(admission.clone()),
            log_size: u64::MAX,
            log_root: Some([0; 32]),
            digest: Some([0; 32]),
            members: vec![themis_agent::roster::Credentials {
                admission: Some(admission),
                announcement: announcement.clone(),
                address_range: None,
            }],
            want: None,
            buckets_wanted: false,
            buckets: Vec::new(),
            next: None,
        })
        .encode()
    });
    common::assert_strangers_refused(&target.contact, &stranger, &requests);
    // Without an admission, as a member's requests go: the stranger is asked for one
    // and told nothing else (not the log's size, not the roster's digest).
    let bare = Frame::Roster(RosterFrame {
        admission: None,
        log_size: 0,
        log_root: Some([0; 32]),
        digest: Some([0; 32]),
        members: Vec::new(),
        want: None,
        buckets_wanted: false,
        buckets: Vec::new(),
        next: None,
    })
    .encode();
    let (id, addr) = target.contact.split_once('@').unwrap();
    let peer = themis_core::PeerId::parse_in(id, stranger.mesh()).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let client = themis_net::Client::new(stranger.clone(), themis_net::ClientConfig::default());
    let answer = runtime.block_on(client.request(peer, addr.parse().unwrap(), &bare));
    match answer.map(|bytes| postcard::from_bytes::<Frame>(&bytes)) {
        Ok(Ok(Frame::Refused { reason })) => {
            assert_eq!(reason, themis_agent::gossip::ADMISSION_WANTED)
        }
        Err(_) => {} // closed before answering: nothing either
        other => panic!("a stranger without an admission was answered: {other:?}"),
    }
    // A non-event, so a window: three of the target's pulls (500 ms apart here) in
    // which nothing the stranger sent may make it a member later.
    std::thread::sleep(Duration::from_millis(1_500));
    assert_eq!(members(target), Some(2), "{}", target.log_tail());
}

/// The membership's upkeep as real agents send it: once their rosters agree, each
/// pull is a comparison of about 80 bytes (a 74-byte request, a 10-byte answer: no
/// admission, no news, no digests), read from the agents' own
/// `themis_gossip_sent_bytes` over a quiet window. The rate is printed (the pull
/// period here is 500 ms; the default is 2 s); what is asserted is the frames' size.
#[test]
fn agreeing_agents_send_comparisons_of_under_a_hundred_bytes() {
    let dir = common::workdir();
    let root = dir.path();
    let quiet = [
        ("--log-sync-ms", "3600000"),
        ("--revocation-poll-ms", "3600000"),
    ];
    let more = ["--routing", "one-hop", "--gossip-ms", "500"];
    let first = common::Metered::spawn_setting(root, "agent-0", None, &quiet, &more);
    let contact = first.agent.contact.clone();
    let mut agents = vec![first];
    for i in 1..4 {
        let name = format!("agent-{i}");
        let agent = common::Metered::spawn_setting(root, &name, Some(&contact), &quiet, &more);
        agents.push(agent);
    }
    for metered in &agents {
        metered
            .agent
            .wait_for("4 members", Duration::from_secs(30), |a| {
                (members(a)? == 4).then_some(())
            });
    }
    let counts = |m: &common::Metered| {
        let text = m.scrape();
        ["request", "answer"].map(|kind| {
            let labels = [("kind", kind)];
            (
                common::sample(&text, "themis_gossip_sent_frames_total", &labels),
                common::sample(&text, "themis_gossip_sent_bytes_total", &labels),
            )
        })
    };
    let requests = |c: &[[(u64, u64); 2]]| c.iter().map(|c| c[0].0).collect::<Vec<_>>();
    // The news of the joins is passed on in an agent's next 3 requests: once every
    // agent sent 3 more than when all knew 4 members, only comparisons are left.
    let known = requests(&agents.iter().map(counts).collect::<Vec<_>>());
    wait_until(
        "every agent to send 3 requests after the joins",
        Duration::from_secs(30),
        || {
            let now = requests(&agents.iter().map(counts).collect::<Vec<_>>());
            now.iter()
                .zip(&known)
                .all(|(n, k)| *n >= k + 3)
                .then_some(())
        },
    );
    // The quiet window: until 40 requests (about ten pulls each) were sent in it.
    let before: Vec<_> = agents.iter().map(counts).collect();
    let began = Instant::now();
    wait_until(
        "40 gossip requests in the quiet window",
        Duration::from_secs(60),
        || {
            let now = requests(&agents.iter().map(counts).collect::<Vec<_>>());
            let sent: u64 = now.iter().zip(requests(&before)).map(|(n, b)| n - b).sum();
            (sent >= 40).then_some(())
        },
    );
    let window = began.elapsed();
    let after: Vec<_> = agents.iter().map(counts).collect();
    let mut sent = [(0, 0); 2];
    for (b, a) in before.iter().zip(&after) {
        for kind in 0..2 {
            sent[kind].0 += a[kind].0 - b[kind].0;
            sent[kind].1 += a[kind].1 - b[kind].1;
        }
    }
    let [(requests, request_bytes), (answers, answer_bytes)] = sent;
    assert!(requests > 0 && answers > 0, "no gossip in {window:?}");
    let per_agent_bits =
        (request_bytes + answer_bytes) as f64 * 8.0 / agents.len() as f64 / window.as_secs_f64();
    eprintln!(
        "4 agents that agree, {window:?}: {requests} requests ({} B each on average), \
         {answers} answers ({} B); {per_agent_bits:.0} bit/s per agent at a 500 ms pull \
         ({:.0} at the default 2 s)",
        request_bytes / requests,
        answer_bytes / answers,
        per_agent_bits / 4.0
    );
    assert!(
        request_bytes <= 100 * requests,
        "{request_bytes} B in {requests} requests"
    );
    assert!(
        answer_bytes <= 20 * answers,
        "{answer_bytes} B in {answers} answers"
    );
}
