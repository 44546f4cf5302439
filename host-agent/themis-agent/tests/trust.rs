//! Secure naming, admission and revocation, attacked at the process level (issue 11).
//!
//! Real `themis agent` processes on loopback with the fast timers of `common`, a mesh
//! created and nodes admitted with the operator's `themis` commands, and this test
//! process playing the attacker: an impostor node without a grant, nodes without a
//! valid admission, an admitted node grinding a ring position, a replayed record, a
//! revoked workload and node, and an agent that dies. Each test says why it would
//! have failed before mesh trust.
//!
//! No test asserts a wall-clock duration: each waits for the outcome with a generous
//! deadline (the revocation test's deadline is the stated bound plus slack) and prints
//! how long it took.

use themis_testkit::agent as common;

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{Agent, Spawn, MESH};
use ring::rand::SystemRandom;
use serde_json::{json, Value};
use themis_agent::overlay::Frame;
use themis_agent_client::Method;
use themis_core::{Identity, MeshName, PeerId};
use themis_dht::{distance, Key, Message, Request, Response};
use themis_testkit::process::{poll_until, wait_until};
use themis_trust::{
    chain_from_pem, Grant, InstanceValue, Record, Signed, GRANT_LABEL, RECORD_LABEL,
};

// ---- helpers -------------------------------------------------------------------------

const FRAMES_REFUSED: &str = "themis_frames_refused_total";
const RECORDS_REFUSED: &str = "themis_registry_records_refused_total";
const DHT_REJECTIONS: &str = "themis_dht_rejections_total";

/// Extra replicas of each record: the agents' default (five copies), which the
/// tests check in the resolutions they get.
const K: u8 = 4;

/// How long any outcome may take to show before a test gives up.
const DEADLINE: Duration = Duration::from_secs(30);

use common::Metered as Node;

/// Starts `n` agents (the first creates the ring, the others join through it) with
/// `more` flags, and waits until the ring is stable.
fn ring(root: &Path, n: usize, more: &[&str]) -> Vec<Node> {
    ring_of(root, n, more, Node::spawn)
}

/// [`ring`] pinned to Chord routing, for the tests whose subject is Chord itself.
fn chord_ring(root: &Path, n: usize, more: &[&str]) -> Vec<Node> {
    ring_of(root, n, more, Node::spawn_chord)
}

fn ring_of(
    root: &Path,
    n: usize,
    more: &[&str],
    spawn: fn(&Path, &str, Option<&str>, &[&str]) -> Node,
) -> Vec<Node> {
    let first = spawn(root, "agent-0", None, more);
    let contact = first.agent.contact.clone();
    let mut nodes = vec![first];
    for i in 1..n {
        let name = format!("agent-{i}");
        nodes.push(spawn(root, &name, Some(&contact), more));
    }
    let agents: Vec<&Agent> = nodes.iter().map(|n| &n.agent).collect();
    common::wait_stable(&agents, DEADLINE);
    nodes
}

/// A counter summed over several agents.
fn total(nodes: &[&Node], name: &str, labels: &[(&str, &str)]) -> u64 {
    nodes.iter().map(|n| n.value(name, labels)).sum()
}

/// Waits until the counter, summed over `nodes`, reaches `at_least`; returns it.
fn wait_total(nodes: &[&Node], name: &str, labels: &[(&str, &str)], at_least: u64) -> u64 {
    wait_until(&format!("{name}{labels:?} >= {at_least}"), DEADLINE, || {
        Some(total(nodes, name, labels)).filter(|v| *v >= at_least)
    })
}

/// The printable ids of the instances of `service` the agent resolves (fresh), or
/// `None` if the resolution failed.
fn instance_ids(agent: &Agent, service: &str) -> Option<Vec<String>> {
    let answer = agent.resolve(service)?;
    Some(
        answer["instances"]
            .as_array()?
            .iter()
            .map(|i| i["id"].as_str().unwrap().to_owned())
            .collect(),
    )
}

/// Waits until every agent resolves `service` to exactly `ids` (in any order).
fn wait_resolved(nodes: &[&Node], service: &str, ids: &[&str]) {
    let mut want: Vec<String> = ids.iter().map(|s| (*s).to_owned()).collect();
    want.sort();
    for n in nodes {
        wait_until(
            &format!("{}: {service} resolving to {want:?}", n.agent.name),
            DEADLINE,
            || {
                let mut got = instance_ids(&n.agent, service)?;
                got.sort();
                (got == want).then_some(())
            },
        );
    }
}

fn identity(mesh: &str) -> Identity {
    Identity::generate(MeshName::new(mesh).unwrap(), &SystemRandom::new()).unwrap()
}

fn now_ms() -> u64 {
    themis_agent::trust::unix_millis()
}

/// An instance record of `service` for `workload` at `endpoint`.
fn record(service: &str, workload: &[u8; 32], endpoint: &str, issued_at: u64, ttl: u64) -> Record {
    Record {
        mesh: MESH.into(),
        service: service.into(),
        workload_key: *workload,
        endpoint: Some(endpoint.parse().unwrap()),
        metadata: Default::default(),
        issued_at,
        not_after: issued_at + ttl,
    }
}

/// `record` signed by `signer` behind the grant chain `grants`, encoded for the DHT.
fn value(grants: &[Signed], signer: &Identity, record: &Record) -> Vec<u8> {
    InstanceValue {
        grants: grants.to_vec(),
        record: Signed::sign(signer, RECORD_LABEL, record),
    }
    .encode()
}

/// A grant of `service` to `grantee`, signed by `signer` (not necessarily the root).
fn grant_by(signer: &Identity, service: &str, grantee: &[u8; 32]) -> Signed {
    Signed::sign(
        signer,
        GRANT_LABEL,
        &Grant {
            mesh: MESH.into(),
            service: service.into(),
            grantee: *grantee,
            delegate: false,
            issued_at: now_ms(),
            not_after: None,
        },
    )
}

/// The grant chain the operator wrote for `service` into the node directory `dir`.
fn chain(dir: &Path, service: &str) -> Vec<Signed> {
    let text = std::fs::read_to_string(dir.join("grants").join(format!("{service}.pem")));
    chain_from_pem(&text.unwrap()).unwrap()
}

/// The record inside a stored value.
fn record_of(value: &[u8]) -> (InstanceValue, Record) {
    let v = InstanceValue::decode(value).unwrap();
    let r = postcard::from_bytes(&v.record.body).unwrap();
    (v, r)
}

/// `POST /v1/debug/store` of a binary value under `name` (`K + 1` replicas).
fn debug_store(agent: &Agent, name: &str, value: &[u8]) -> (u16, Value) {
    let body = json!({ "name": name, "value": hex::encode(value), "hex": true, "replicas": K });
    agent
        .call(Method::POST, "/v1/debug/store", Some(&body))
        .expect("the API answers")
}

/// The node responsible for `key`, as `via` finds it.
fn holder(via: &Agent, key: Key) -> (PeerId, SocketAddr) {
    let path = format!("/v1/debug/find/{}", hex::encode(key.0));
    let (status, found) = via.get(&path).expect("the API answers");
    assert_eq!(status, 200, "find {key}: {found}");
    let id = PeerId::parse(found["node"]["id"].as_str().unwrap())
        .unwrap()
        .1;
    (id, found["node"]["addr"].as_str().unwrap().parse().unwrap())
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Opens a secure session to `to` as `me` and sends each request in a DHT frame
/// carrying `admission` (and a listening address nobody listens on); returns the
/// answers.
fn ask(
    rt: &tokio::runtime::Runtime,
    (me, admission): (&Identity, &[u8]),
    to: (PeerId, SocketAddr),
    requests: Vec<Request<SocketAddr>>,
) -> Vec<Frame> {
    let nowhere: SocketAddr = "127.0.0.1:9".parse().unwrap();
    ask_as(rt, (me, admission, nowhere), to, requests)
}

/// [`ask`], naming `listen` as where `me` accepts agent connections.
fn ask_as(
    rt: &tokio::runtime::Runtime,
    (me, admission, listen): (&Identity, &[u8], SocketAddr),
    to: (PeerId, SocketAddr),
    requests: Vec<Request<SocketAddr>>,
) -> Vec<Frame> {
    rt.block_on(async {
        let mut stream = None;
        let mut answers = Vec::new();
        for (id, body) in (1..).zip(requests) {
            if stream.is_none() {
                stream = Some(
                    themis_net::connect(me, to.1, to.0, &themis_net::Config::default())
                        .await
                        .expect("the handshake succeeds: the channel only checks the key"),
                );
            }
            let frame = Frame::Dht {
                listen,
                admission: admission.to_vec(),
                message: Message::Request { id, body },
            };
            let answer = stream
                .as_mut()
                .expect("connected above")
                .request(&postcard::to_allocvec(&frame).unwrap())
                .await
                .unwrap();
            let answer = postcard::from_bytes::<Frame>(&answer).unwrap();
            // A frame refused for its admission closes the connection (issue 21):
            // the next request goes on a new one.
            if matches!(answer, Frame::Refused { .. }) {
                stream = None;
            }
            answers.push(answer);
        }
        answers
    })
}

/// The DHT response in an answer frame.
fn response(frame: &Frame) -> &Response<SocketAddr> {
    match frame {
        Frame::Dht {
            message: Message::Response { body, .. },
            ..
        } => body,
        other => panic!("expected a DHT response, got {other:?}"),
    }
}

/// Runs `themis agent` in `dir` expecting it to refuse to start; returns its stderr.
fn refused_start(dir: &Path, extra: &[&str]) -> String {
    let log = dir.with_extension("stderr");
    let mut child = Command::new(common::themis_binary())
        .args(["agent", "--listen", "127.0.0.1:0", "--metrics", "off"])
        .arg("--state-dir")
        .arg(dir)
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let status = poll_until(DEADLINE, || child.try_wait().unwrap()).unwrap_or_else(|| {
        let _ = child.kill();
        let _ = child.wait();
        panic!("the agent in {} did not refuse to start", dir.display());
    });
    let stderr = std::fs::read_to_string(&log).unwrap();
    assert!(
        !status.success(),
        "the agent in {} started: {stderr}",
        dir.display()
    );
    stderr
}

/// `themis --json explain <service>` on the agent.
fn explain(agent: &Agent, service: &str) -> Value {
    let (code, stdout, stderr) = agent.cli(&["--json", "explain", service]);
    assert_eq!(code, 0, "{stderr}");
    serde_json::from_str(&stdout).unwrap()
}

// ---- a. an impostor with a mesh key but no grant ---------------------------------------

/// An admitted node that was never granted `check` cannot become an instance of it by
/// any door. Registering through its own agent is refused (403 `not_granted`, the
/// message naming `themis service grant`; nothing registered or stored). Values it
/// forges — under a grant it signed itself, under its genuine grant for another
/// service, under the honest node's grant copied out of the honest record, with no
/// grant — are refused by its own agent's debug store (422) and, sent as `Store`
/// frames by an admitted hostile peer straight to each replica holder of `check`,
/// answered `Rejected` by every holder, each counted by reason. Every agent resolves
/// only the honest instance; `themis explain check` shows it trusted.
///
/// Before mesh trust a record needed only a signature by the key inside it: the
/// impostor's self-signed record was stored and resolved (the old
/// `stored_records_that_do_not_verify_are_refused_and_counted` showed a fresh key
/// accepted as an instance of `spoofed`), and registration had no grant to check.
#[test]
fn a_an_impostor_without_a_grant_never_becomes_an_instance() {
    let dir = common::workdir();
    let root = dir.path();
    let nodes = ring(root, 3, &[]);
    let all: Vec<&Node> = nodes.iter().collect();
    let (honest, impostor) = (&nodes[1], &nodes[2]);
    let registered = honest.agent.register("check", "check-1", "127.0.0.1:18001");
    let honest_id = registered["registration"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    wait_resolved(&all, "check", &[&honest_id]);
    // The impostor's node holds a grant, only for another service.
    impostor.agent.grant("handler");

    // 1. Through its own agent: the API and the tool.
    let body = json!({ "endpoint": "127.0.0.1:18666" });
    let (status, answer) = impostor
        .agent
        .call(
            Method::PUT,
            "/v1/services/check/instances/evil",
            Some(&body),
        )
        .unwrap();
    assert_eq!(status, 403, "{answer}");
    assert_eq!(answer["reason"], "not_granted", "{answer}");
    let error = answer["error"].as_str().unwrap();
    assert!(error.contains("themis service grant check"), "{error}");
    assert!(
        error.contains("handler"),
        "names what it may serve: {error}"
    );
    let (code, _, stderr) = impostor.agent.cli(&[
        "register",
        "check",
        "--workload",
        "evil",
        "--endpoint",
        "127.0.0.1:18666",
    ]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("may not serve check"), "{stderr}");
    let (_, workloads) = impostor.agent.get("/v1/workloads").unwrap();
    assert_eq!(workloads["registrations"], json!([]), "{workloads}");

    // 2. Forged values, through the impostor's own agent's debug store.
    let (node_key, _) = common::node_credentials(&impostor.agent.dir);
    let honest_value = {
        let resolved = nodes[0].agent.resolve("check").unwrap();
        hex::decode(resolved["instances"][0]["record"].as_str().unwrap()).unwrap()
    };
    let (copied, _) = record_of(&honest_value);
    let evil = identity(MESH);
    let forged_record = record(
        "check",
        evil.public_key(),
        "127.0.0.1:18666",
        now_ms(),
        60_000,
    );
    let forged: Vec<(&str, Vec<u8>)> = vec![
        (
            "not_from_root",
            value(
                &[grant_by(&node_key, "check", node_key.public_key())],
                &node_key,
                &forged_record,
            ),
        ),
        (
            "wrong_service",
            value(
                &chain(&impostor.agent.dir, "handler"),
                &node_key,
                &forged_record,
            ),
        ),
        (
            "not_granted",
            value(&copied.grants, &node_key, &forged_record),
        ),
        ("chain_length", value(&[], &evil, &forged_record)),
    ];
    for (reason, v) in &forged {
        let (status, answer) = debug_store(&impostor.agent, "check", v);
        assert_eq!(status, 422, "{reason}: {answer}");
        assert_eq!(answer["reason"], "rejected", "{reason}: {answer}");
    }
    for (reason, _) in &forged {
        wait_total(&[impostor], RECORDS_REFUSED, &[("reason", reason)], 1);
    }

    // 3. The same values as `Store` frames from an admitted hostile peer, straight to
    // each replica holder of `check`.
    let (mallory, admission) = common::admitted_peer(root, "mallory");
    let rt = runtime();
    for r in 0..=K {
        let key = Key::object(b"check", r);
        let to = holder(&nodes[0].agent, key);
        let stores = forged
            .iter()
            .map(|(_, v)| Request::Store {
                key,
                value: v.clone(),
                ttl_ms: 60_000,
            })
            .collect();
        for ((reason, _), answer) in forged
            .iter()
            .zip(ask(&rt, (&mallory, &admission), to, stores))
        {
            assert_eq!(
                *response(&answer),
                Response::Rejected,
                "replica {r}: the {reason} value was kept"
            );
        }
    }
    // Each value: once at the impostor's agent, once at each of the K + 1 replica
    // holders.
    let each = 1 + u64::from(K) + 1;
    for (reason, _) in &forged {
        let n = wait_total(&all, RECORDS_REFUSED, &[("reason", reason)], each);
        assert_eq!(n, each, "{reason}");
    }
    let invalid = each * forged.len() as u64;
    wait_total(&all, DHT_REJECTIONS, &[("reason", "InvalidValue")], invalid);

    // Nothing forged is stored anywhere: every agent resolves the honest instance only,
    // with nothing to refuse.
    wait_resolved(&all, "check", &[&honest_id]);
    for n in &all {
        let resolved = n.agent.resolve("check").unwrap();
        assert_eq!(resolved["replicas"], K + 1, "{resolved}");
        assert_eq!(resolved["refused"], 0, "{}: {resolved}", n.agent.name);
        assert_eq!(resolved["instances"][0]["endpoint"], "127.0.0.1:18001");
    }
    let explained = explain(&nodes[0].agent, "check");
    assert_eq!(
        explained["instances"].as_array().unwrap().len(),
        1,
        "{explained}"
    );
    let values = explained["values"].as_array().unwrap();
    assert!(
        values
            .iter()
            .any(|v| v["id"] == honest_id.as_str() && v["verdict"] == "trusted"),
        "{explained}"
    );
    assert!(
        values.iter().all(|v| v["verdict"] != "refused"),
        "{explained}"
    );
    let (code, text, _) = nodes[0].agent.cli(&["explain", "check"]);
    assert_eq!(code, 0);
    assert!(text.contains("TRUSTED"), "{text}");
    assert!(text.contains(&honest_id), "{text}");
    assert!(text.contains("1 live instance(s)"), "{text}");
    println!("{text}");
}

// ---- a, continued: what a hostile replica holder hands the resolver ---------------

/// What the hostile holder keeps and serves.
struct Hoard {
    /// Values stored with it (it keeps them: it does not withhold).
    stored: Vec<(Key, Vec<u8>)>,
    /// Extra values it answers every `Get` of `check` with.
    forged: Vec<Vec<u8>>,
}

/// The hostile holder's answers: a plausible Chord node between `p` and `q` that
/// stores what it is given and answers `Get` for `check` with it plus `forged`.
fn hostile_answer(
    (me, admission): (&themis_dht::Contact<SocketAddr>, &[u8]),
    (p, q): &(
        themis_dht::Contact<SocketAddr>,
        themis_dht::Contact<SocketAddr>,
    ),
    hoard: &std::sync::Mutex<Hoard>,
    request: &[u8],
) -> Vec<u8> {
    let Ok(Frame::Dht {
        message: Message::Request { id, body },
        ..
    }) = postcard::from_bytes::<Frame>(request)
    else {
        return postcard::to_allocvec(&Frame::Refused {
            reason: "hostile".into(),
        })
        .unwrap();
    };
    let mut hoard = hoard.lock().unwrap();
    let body = match body {
        Request::FindStep { key, .. } if themis_dht::in_half_open(&key, &me.id, &q.id) => {
            Response::Responsible { node: q.clone() }
        }
        Request::FindStep { .. } => Response::Closer { node: q.clone() },
        Request::GetNeighbours => Response::Neighbours {
            predecessor: Some(p.clone()),
            successors: vec![q.clone(), p.clone()],
        },
        Request::Get { key } => {
            let mut values: Vec<Vec<u8>> = hoard
                .stored
                .iter()
                .filter(|(k, _)| *k == key)
                .map(|(_, v)| v.clone())
                .collect();
            if (0..=K).any(|r| Key::object(b"check", r) == key) {
                values.extend(hoard.forged.iter().cloned());
            }
            Response::Values { values }
        }
        Request::Store { key, value, .. } => {
            hoard.stored.push((key, value));
            Response::Ack
        }
        Request::Handover { objects } => {
            hoard
                .stored
                .extend(objects.into_iter().map(|o| (o.key, o.value)));
            Response::Ack
        }
        _ => Response::Ack,
    };
    postcard::to_allocvec(&Frame::Dht {
        listen: me.addr,
        admission: admission.to_vec(),
        message: Message::Response { id, body },
    })
    .unwrap()
}

/// An admitted node turned hostile holds replicas of `check` and answers `Get` with
/// everything it can think of: a record under a grant it signed itself, one under the
/// honest node's grant copied from the honest record, one under its own genuine grant
/// for another service, junk, and the honest instance's superseded record. These
/// values do reach the resolver (the holder is really responsible for a replica), and
/// each is refused there with its reason: `themis explain check` lists them as
/// refused with why, the old record as superseded, and the honest instance, at its
/// current endpoint, as the only one trusted; every agent resolves just that.
///
/// (The holder's key is generated by the test until it lands on a replica of `check`
/// and then admitted with `--existing-key`, only to make the case deterministic: an
/// operator-generated key lands there with the same odds as any node's.)
///
/// Before mesh trust, resolution stopped at the first replica that answered and
/// believed any record signed by the key inside it: this holder alone decided what
/// `check` resolved to.
#[test]
fn a_hostile_replica_holder_cannot_make_resolution_lie() {
    let dir = common::workdir();
    let root = dir.path();
    // Chord: the hostile holder joins the Chord way (its `Notify` makes it q's
    // predecessor and p's successor); one-hop routing ignores `Notify`.
    let nodes = chord_ring(root, 2, &[]);
    let all: Vec<&Node> = nodes.iter().collect();
    let contact = |n: &Node| themis_dht::Contact {
        id: Key(n.peer_id().0),
        addr: n.listen(),
    };
    let (x, y) = (contact(&nodes[0]), contact(&nodes[1]));

    // The replica of `check` with the widest arc before its holder q; the hostile key
    // goes in that arc, between the object id and q, so it is the replica's holder.
    let (key, p, q) = (0..=K)
        .map(|r| {
            let key = Key::object(b"check", r);
            if themis_dht::in_half_open(&key, &x.id, &y.id) {
                (key, x.clone(), y.clone())
            } else {
                (key, y.clone(), x.clone())
            }
        })
        .max_by_key(|(key, _, q)| distance(key, &q.id))
        .unwrap();
    let hostile = (1u64..)
        .map(|_| identity(MESH))
        .find(|h| distance(&key, &Key(h.id().0)) < distance(&key, &q.id))
        .unwrap();
    let hostile_dir = root.join("hostile");
    std::fs::create_dir_all(&hostile_dir).unwrap();
    themis_agent::keystore::write(&hostile_dir.join("node.key"), &hostile).unwrap();
    common::admit(root, &hostile_dir);
    common::grant(root, &hostile_dir, "handler");
    let (hostile, admission) = common::node_credentials(&hostile_dir);
    let hostile = std::sync::Arc::new(hostile);

    let rt = runtime();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let me = themis_dht::Contact {
        id: Key(hostile.id().0),
        addr: listener.local_addr().unwrap(),
    };
    let hoard = std::sync::Arc::new(std::sync::Mutex::new(Hoard {
        stored: Vec::new(),
        forged: Vec::new(),
    }));
    let handler = {
        let (me, admission, neighbours, hoard) = (
            me.clone(),
            admission.clone(),
            (p.clone(), q.clone()),
            hoard.clone(),
        );
        move |_peer: std::sync::Arc<themis_core::SessionInfo>, request: bytes::BytesMut| {
            let answer = hostile_answer((&me, &admission), &neighbours, &hoard, &request);
            async move { answer }
        }
    };
    let server = rt.spawn(themis_net::serve(
        listener,
        hostile.clone(),
        themis_net::Config::default(),
        std::sync::Arc::new(handler),
        std::sync::Arc::new(themis_net::NetStats::default()),
    ));

    // It joins as any admitted node would: q adopts it as predecessor, p as successor.
    let q_node = all.iter().find(|n| n.peer_id().0 == q.id.0).unwrap();
    let p_node = all.iter().find(|n| n.peer_id().0 == p.id.0).unwrap();
    let answers = ask_as(
        &rt,
        (&hostile, &admission, me.addr),
        (q_node.peer_id(), q.addr),
        vec![Request::Notify],
    );
    assert_eq!(*response(&answers[0]), Response::Ack);
    let hostile_id = hostile.printable_id();
    wait_until("the hostile node in the ring", DEADLINE, || {
        let (_, pr) = p_node.agent.get("/v1/ring")?;
        let (_, qr) = q_node.agent.get("/v1/ring")?;
        (pr["successors"][0]["id"] == hostile_id.as_str()
            && qr["predecessor"]["id"] == hostile_id.as_str())
        .then_some(())
    });
    assert_eq!(holder(&p_node.agent, key).0 .0, me.id.0);

    // The honest instance, registered, then moved: its first record is now stale.
    let first = nodes[0]
        .agent
        .register("check", "check-1", "127.0.0.1:18001");
    let honest_id = first["registration"]["id"].as_str().unwrap().to_owned();
    let stale = {
        let resolved = nodes[0].agent.resolve("check").unwrap();
        hex::decode(resolved["instances"][0]["record"].as_str().unwrap()).unwrap()
    };
    nodes[0]
        .agent
        .register("check", "check-1", "127.0.0.1:18002");
    let (copied, _) = record_of(&stale);
    let evil = identity(MESH);
    let forged_record = record(
        "check",
        evil.public_key(),
        "127.0.0.1:18666",
        now_ms(),
        60_000,
    );
    let forged: Vec<(&str, &str, Vec<u8>)> = vec![
        (
            "not_from_root",
            "not signed by the mesh root",
            value(
                &[grant_by(&hostile, "check", hostile.public_key())],
                &hostile,
                &forged_record,
            ),
        ),
        (
            "not_granted",
            "not signed by the granted key",
            value(&copied.grants, &hostile, &forged_record),
        ),
        (
            "wrong_service",
            "made for another service",
            value(&chain(&hostile_dir, "handler"), &hostile, &forged_record),
        ),
        ("malformed", "malformed", b"junk".to_vec()),
    ];
    hoard.lock().unwrap().forged = forged
        .iter()
        .map(|(_, _, v)| v.clone())
        .chain([stale.clone()])
        .collect();

    // Every agent resolves the honest instance at its new endpoint, and only it.
    wait_resolved(&all, "check", &[&honest_id]);
    for n in &all {
        let resolved = n.agent.resolve("check").unwrap();
        assert_eq!(
            resolved["instances"][0]["endpoint"], "127.0.0.1:18002",
            "{resolved}"
        );
        assert_eq!(resolved["refused"], forged.len(), "{resolved}");
        for (reason, _, _) in &forged {
            assert!(
                n.value(RECORDS_REFUSED, &[("reason", reason)]) >= 1,
                "{reason}"
            );
        }
    }
    let explained = explain(&p_node.agent, "check");
    let values = explained["values"].as_array().unwrap();
    for (_, why, _) in &forged {
        assert!(
            values
                .iter()
                .any(|v| v["verdict"] == "refused" && v["reason"].as_str().unwrap().contains(why)),
            "no value refused for {why:?}: {explained}"
        );
    }
    let verdict_of = |endpoint: &str| {
        values
            .iter()
            .filter(|v| v["id"] == honest_id.as_str() && v["endpoint"] == endpoint)
            .map(|v| v["verdict"].as_str().unwrap().to_owned())
            .collect::<Vec<_>>()
    };
    assert_eq!(verdict_of("127.0.0.1:18002"), ["trusted"], "{explained}");
    assert_eq!(verdict_of("127.0.0.1:18001"), ["superseded"], "{explained}");
    let (_, text, _) = p_node.agent.cli(&["explain", "check"]);
    println!("{text}");
    server.abort();
}

// ---- b. a node without a valid admission cannot join -----------------------------------

/// An agent needs its own admission, valid for its key under the mesh root it is
/// configured with, to start at all: without `admission.pem` it refuses to start and
/// says to run `themis node admit`; with another node's admission (another key), or
/// with an admission from another mesh root of the same mesh name checked against
/// this mesh's root, likewise. A node admitted by another root (same mesh name),
/// running with that root, starts but cannot join this ring: the bootstrap agent
/// refuses every join attempt (`not_admitted_not_from_root`, counted), the node stays
/// out, and the ring does not learn of it.
///
/// Before admission any key of the mesh started and joined: the mesh name was the
/// only credential.
#[test]
fn b_a_node_without_a_valid_admission_cannot_join() {
    let dir = common::workdir();
    let root = dir.path();
    let bootstrap = Node::spawn(root, "agent-0", None, &[]);
    let join = ["--join", bootstrap.agent.contact.as_str()];
    let mesh = common::mesh_dir(root);
    let our_root = std::fs::read_to_string(mesh.join("mesh.root")).unwrap();

    // No admission at all (the mesh root is there).
    let lost = root.join("lost");
    std::fs::create_dir_all(&lost).unwrap();
    std::fs::copy(mesh.join("mesh.root"), lost.join("mesh.root")).unwrap();
    let stderr = refused_start(&lost, &join);
    assert!(stderr.contains("admission.pem"), "{stderr}");
    assert!(stderr.contains("themis node admit"), "{stderr}");
    // And it made no node key of its own, which the operator's `themis node admit`
    // would then have to refuse (or admit a key the operator did not generate).
    assert!(
        !lost.join("node.key").exists(),
        "the refused agent created a node key"
    );

    // Another node's admission (the bootstrap's), next to a key of its own.
    let borrowed = root.join("borrowed");
    std::fs::create_dir_all(&borrowed).unwrap();
    std::fs::copy(mesh.join("mesh.root"), borrowed.join("mesh.root")).unwrap();
    let theirs = bootstrap.agent.dir.join("admission.pem");
    std::fs::copy(theirs, borrowed.join("admission.pem")).unwrap();
    let stderr = refused_start(&borrowed, &join);
    assert!(
        stderr.contains("the admission is for another key"),
        "{stderr}"
    );
    assert!(stderr.contains("themis node admit"), "{stderr}");

    // Another mesh root with the same mesh name admits a node.
    let other_mesh = root.join("other-mesh");
    common::operator(&[
        "mesh".as_ref(),
        "create".as_ref(),
        MESH.as_ref(),
        "--out".as_ref(),
        other_mesh.as_os_str(),
    ]);
    let foreign_dir = root.join("foreign");
    common::operator(&[
        "node".as_ref(),
        "admit".as_ref(),
        "--mesh-dir".as_ref(),
        other_mesh.as_os_str(),
        "--out".as_ref(),
        foreign_dir.as_os_str(),
    ]);
    // Checked against this mesh's root, it does not start.
    let stderr = refused_start(&foreign_dir, &["--mesh-root", our_root.trim()]);
    assert!(stderr.contains("themis node admit"), "{stderr}");
    // With its own root it starts, and cannot join.
    let (extra, _) = common::metered(&join);
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    let foreign = Agent::spawn(
        root,
        "foreign",
        Spawn {
            extra: &extra,
            ..Spawn::default()
        },
    );
    let reason = [("reason", "not_admitted_not_from_root")];
    wait_total(&[&bootstrap], FRAMES_REFUSED, &reason, 2);
    let (_, status) = foreign.get("/v1/status").unwrap();
    assert_eq!(status["joined"], false, "{status}");
    let (_, ring) = bootstrap.agent.get("/v1/ring").unwrap();
    assert!(!ring.to_string().contains(&foreign.id), "{ring}");
    assert!(
        foreign.log().contains("joining the ring"),
        "{}",
        foreign.log_tail()
    );
}

// ---- c. an admitted node grinding a ring position --------------------------------------

/// An admitted node grinds keys until one sits just after the object id of `check`'s
/// first replica (within 1/1024 of the ring), which would make it that replica's
/// holder, and takes part with its old admission: every request — `Notify` to become
/// the holder's predecessor, a join step, a `Store` and a `Get` at the object id — is
/// refused as `not_admitted_wrong_key` and counted; the holder and the ring are
/// unchanged. Its own key with its own admission is still a peer (the admission is
/// valid, for that key only), and the operator will not admit a key the node chose
/// (`themis node admit` refuses an existing key without `--existing-key`).
///
/// Why grinding gains nothing: a ring position is `H(node key ‖ mesh)` and the
/// admission names the node key. The operator generates that key (`themis node
/// admit`), so the position is uniform and unchosen; a node that wants another
/// position needs another key, hence another admission, which only the offline mesh
/// key signs. An admitted node therefore holds any given object with the same 1/N
/// chance as an honest one, and what it holds it can only withhold: values are
/// verified end to end and every replica is asked.
///
/// Before admission, any freshly ground key of the mesh was a peer, and `Notify` made
/// it the predecessor of the node after it: about 2N key generations to take over an
/// object.
#[test]
fn c_grinding_a_ring_position_gains_nothing() {
    let dir = common::workdir();
    let root = dir.path();
    let nodes = ring(root, 2, &[]);
    let (mallory, admission) = common::admitted_peer(root, "mallory");
    let target = Key::object(b"check", 0);
    let started = Instant::now();
    let (ground, tries) = (1u64..)
        .map(|i| (identity(MESH), i))
        .find(|(id, _)| {
            let d = distance(&target, &Key(id.id().0));
            d.0[0] == 0 && d.0[1] < 0x40
        })
        .unwrap();
    println!(
        "ground a key {tries} tries ({:?}) after h(check‖0)",
        started.elapsed()
    );
    let to = holder(&nodes[0].agent, target);
    let holder_node = nodes.iter().find(|n| n.peer_id() == to.0).unwrap();
    let before = holder_node.agent.get("/v1/ring").unwrap().1;

    let reason = "not_admitted_wrong_key";
    let requests = vec![
        Request::Notify,
        Request::FindStep {
            key: Key(ground.id().0),
            avoid: Vec::new(),
        },
        Request::Store {
            key: target,
            value: b"planted".to_vec(),
            ttl_ms: 60_000,
        },
        Request::Get { key: target },
    ];
    let n = requests.len() as u64;
    for answer in ask(&runtime(), (&ground, &admission), to, requests) {
        match answer {
            // The peer learns only "rejected"; the reason is in the metrics.
            Frame::Refused { reason: got } => assert_eq!(got, "rejected", "{reason}"),
            other => panic!("the ground key was answered {other:?}"),
        }
    }
    let counted = wait_total(&[holder_node], FRAMES_REFUSED, &[("reason", reason)], n);
    assert_eq!(counted, n);

    // Nothing moved: the holder's predecessor is the one it had, the ring still finds
    // it responsible, and it holds nothing planted.
    let after = holder_node.agent.get("/v1/ring").unwrap().1;
    assert_eq!(after["predecessor"], before["predecessor"], "{after}");
    assert_eq!(after["objects"], json!([]), "{after}");
    for n in &nodes {
        assert_eq!(holder(&n.agent, target).0, to.0);
    }

    // The admission itself is fine, for its own key.
    let answers = ask(&runtime(), (&mallory, &admission), to, vec![Request::Ping]);
    assert_eq!(*response(&answers[0]), Response::Ack);

    // And the operator does not admit a key the node brings.
    let chosen = root.join("chosen");
    std::fs::create_dir_all(&chosen).unwrap();
    themis_agent::keystore::write(&chosen.join("node.key"), &ground).unwrap();
    let mesh = common::mesh_dir(root);
    let out = Command::new(common::themis_binary())
        .args(["node", "admit", "--mesh-dir"])
        .arg(&mesh)
        .arg("--out")
        .arg(&chosen)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("--existing-key"), "{stderr}");
    assert!(!chosen.join("admission.pem").exists());
}

// ---- d. a deregistered instance cannot be brought back ---------------------------------

/// The record of a deregistered instance, captured from the DHT before it was
/// withdrawn and stored again through another agent, is refused by every replica
/// holder (`Stale`: the signed tombstone in its slot is newer) and the instance stays
/// withdrawn everywhere; once the record's `not_after` has passed, even the agent
/// asked to store it refuses it (`expired`).
///
/// Before mesh trust, tombstones lived 60 s and were not re-stored, and records never
/// expired: after a minute the old bytes could be stored again and the instance came
/// back.
#[test]
fn d_a_deregistered_instance_cannot_be_stored_again() {
    let dir = common::workdir();
    let nodes = ring(dir.path(), 3, &[]);
    let all: Vec<&Node> = nodes.iter().collect();
    let registered = nodes[1]
        .agent
        .register("check", "check-1", "127.0.0.1:18001");
    let id = registered["registration"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    wait_resolved(&all, "check", &[&id]);

    // The bytes anyone can read from the DHT: the newest record of the instance.
    let (status, values) = nodes[0]
        .agent
        .get(&format!("/v1/debug/values/check?replicas={K}"))
        .unwrap();
    assert_eq!(status, 200, "{values}");
    let old = values["values"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| hex::decode(v["hex"].as_str().unwrap()).unwrap())
        .max_by_key(|v| record_of(v).1.issued_at)
        .expect("the record is stored");
    let not_after = record_of(&old).1.not_after;

    let (status, answer) = nodes[1]
        .agent
        .call(Method::DELETE, "/v1/services/check/instances/check-1", None)
        .unwrap();
    assert_eq!(status, 200, "{answer}");
    wait_resolved(&all, "check", &[]);

    // Stored again through another agent, while the record is still within its
    // validity: its own policy lets it through, every holder refuses it as stale.
    let stale_before = total(&all, DHT_REJECTIONS, &[("reason", "Stale")]);
    let (status, stored) = debug_store(&nodes[2].agent, "check", &old);
    assert!(
        now_ms() < not_after,
        "the replay came too late to show Stale; the record expired at {not_after}"
    );
    assert_eq!(status, 200, "{stored}");
    assert_eq!(
        stored["stored"], 0,
        "a holder took the old record: {stored}"
    );
    wait_total(
        &all,
        DHT_REJECTIONS,
        &[("reason", "Stale")],
        stale_before + u64::from(K) + 1,
    );
    wait_resolved(&all, "check", &[]);
    let explained = explain(&nodes[0].agent, "check");
    let values = explained["values"].as_array().unwrap();
    assert!(
        values.iter().all(|v| v["verdict"] == "withdrawn"),
        "{explained}"
    );
    assert!(!values.is_empty(), "the tombstone is stored: {explained}");

    // After its not_after, the record is refused before it is stored at all.
    let wait = Duration::from_millis(not_after.saturating_sub(now_ms()) + 200);
    println!("waiting {wait:?} for the replayed record's not_after");
    std::thread::sleep(wait);
    let (status, answer) = debug_store(&nodes[2].agent, "check", &old);
    assert_eq!(status, 422, "{answer}");
    assert_eq!(answer["reason"], "rejected", "{answer}");
    wait_total(&[&nodes[2]], RECORDS_REFUSED, &[("reason", "expired")], 1);
    wait_resolved(&all, "check", &[]);
}

// ---- e. revocation --------------------------------------------------------------------

/// How often the agents in the revocation test look for revocations.
const REVOCATION_POLL_MS: u64 = 500;
/// The agents' operation timeout (the default; FAST does not change it).
const OP_TIMEOUT_MS: u64 = 10_000;

/// Revokes `id` through `via` (`themis revoke --publish`), then waits until none of
/// `watchers` resolves `id` as an instance of `service` any more; returns how long
/// each took. Each must within the stated bound — one revocation poll plus one
/// operation timeout — plus slack for the resolution itself.
fn revoke_and_measure(
    root: &Path,
    via: &Agent,
    id: &str,
    watchers: &[&Node],
    service: &str,
) -> Vec<(String, Duration)> {
    let mesh = common::mesh_dir(root);
    let started = Instant::now();
    let mesh_arg = mesh.display().to_string();
    let (code, stdout, stderr) = via.cli(&[
        "revoke",
        id,
        "--mesh-dir",
        &mesh_arg,
        "--reason",
        "key stolen",
        "--publish",
    ]);
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(stdout.contains("published"), "{stdout}");
    let bound = Duration::from_millis(REVOCATION_POLL_MS + OP_TIMEOUT_MS);
    let limit = bound + Duration::from_secs(5);
    let mut took = Vec::new();
    for n in watchers {
        wait_until(
            &format!("{}: {id} dropped from {service}", n.agent.name),
            limit.saturating_sub(started.elapsed()),
            || {
                let ids = instance_ids(&n.agent, service)?;
                (!ids.iter().any(|i| i == id)).then_some(())
            },
        );
        took.push((n.agent.name.clone(), started.elapsed()));
    }
    println!(
        "revocation of {id} through {}: dropped by {took:?} (bound {bound:?})",
        via.name
    );
    took
}

/// A revocation published through one agent of four reaches every agent within the
/// stated bound (one `--revocation-poll-ms` plus one operation timeout), each agent
/// then refusing the key in resolution; measured and printed. First a workload is
/// revoked: it drops out everywhere, the honest instance beside it stays, its agent
/// refuses to register it again (403, `revoked`), and records for it signed by its
/// node — one issued 30 s ahead (newer than anything), one years ahead — are refused
/// (`revoked`, `from_the_future`). Then the node endorsing another instance is
/// revoked: its instance drops out everywhere, its DHT frames are refused
/// (`not_admitted_revoked`), and what it registers afterwards never appears.
/// `themis explain` shows a revoked record still stored as refused, for a revoked key.
///
/// Before mesh trust there was no revocation: a stolen workload key kept working, and
/// could sign `serial = u64::MAX` to beat every later tombstone and re-registration.
#[test]
fn e_a_revoked_key_is_refused_everywhere_within_the_bound() {
    let dir = common::workdir();
    let root = dir.path();
    let poll_ms = REVOCATION_POLL_MS.to_string();
    let nodes = ring(root, 4, &["--revocation-poll-ms", &poll_ms]);
    let all: Vec<&Node> = nodes.iter().collect();
    let w1 = nodes[1].agent.register("check", "w1", "127.0.0.1:18001");
    let w2 = nodes[2].agent.register("check", "w2", "127.0.0.1:18002");
    let w1 = w1["registration"]["id"].as_str().unwrap().to_owned();
    let w2 = w2["registration"]["id"].as_str().unwrap().to_owned();
    wait_resolved(&all, "check", &[&w1, &w2]);
    let resolved = nodes[0].agent.resolve("check").unwrap();
    let w1_key: [u8; 32] = resolved["instances"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["id"] == w1.as_str())
        .map(|i| hex::decode(i["public_key"].as_str().unwrap()).unwrap())
        .unwrap()
        .try_into()
        .unwrap();

    // 1. The workload w1, through agent-0.
    revoke_and_measure(root, &nodes[0].agent, &w1, &all, "check");
    wait_resolved(&all, "check", &[&w2]);
    for n in &all {
        let (_, known) = n.agent.get("/v1/revocations").unwrap();
        assert!(
            known["revocations"]
                .as_array()
                .unwrap()
                .iter()
                .any(|r| r["id"] == w1.as_str() && r["reason"] == "key stolen"),
            "{}: {known}",
            n.agent.name
        );
    }
    let explained = explain(&nodes[3].agent, "check");
    for v in explained["values"].as_array().unwrap() {
        if v["id"] == w1.as_str() {
            assert_eq!(v["verdict"], "refused", "{explained}");
            assert!(
                v["reason"].as_str().unwrap().contains("revoked"),
                "{explained}"
            );
        }
    }
    // Its agent will not register it again: it knows the key is revoked.
    let body = json!({ "endpoint": "127.0.0.1:18001" });
    let (status, answer) = nodes[1]
        .agent
        .call(Method::PUT, "/v1/services/check/instances/w1", Some(&body))
        .unwrap();
    assert_eq!(status, 403, "{answer}");
    assert_eq!(answer["reason"], "revoked", "{answer}");
    // Serial games: records for w1 its (unrevoked, granted) node signs, dated ahead.
    let (node1, _) = common::node_credentials(&nodes[1].agent.dir);
    let grants = chain(&nodes[1].agent.dir, "check");
    let year = 365 * 24 * 3_600_000;
    for (ahead, reason) in [(30_000, "revoked"), (10 * year, "from_the_future")] {
        let forged = record(
            "check",
            &w1_key,
            "127.0.0.1:18001",
            now_ms() + ahead,
            60_000,
        );
        let (status, answer) =
            debug_store(&nodes[3].agent, "check", &value(&grants, &node1, &forged));
        assert_eq!(status, 422, "{reason}: {answer}");
        wait_total(&[&nodes[3]], RECORDS_REFUSED, &[("reason", reason)], 1);
    }
    wait_resolved(&all, "check", &[&w2]);

    // 2. The node endorsing w2 (agent-2), through agent-0.
    let others = [&nodes[0], &nodes[1], &nodes[3]];
    revoke_and_measure(root, &nodes[0].agent, &nodes[2].agent.id, &others, "check");
    wait_resolved(&others, "check", &[]);
    let n = wait_total(
        &others,
        FRAMES_REFUSED,
        &[("reason", "not_admitted_revoked")],
        1,
    );
    println!("frames of the revoked node refused so far: {n}");
    // What the revoked node registers now never appears elsewhere, whatever its own
    // agent answers (it may not even have learnt of its revocation: its peers no
    // longer talk to it).
    let body = json!({ "endpoint": "127.0.0.1:18003" });
    let answer = nodes[2]
        .agent
        .call(Method::PUT, "/v1/services/check/instances/w3", Some(&body));
    println!("the revoked node registering w3: {answer:?}");
    for n in others {
        let ids = wait_until("a resolution", DEADLINE, || instance_ids(&n.agent, "check"));
        assert_eq!(ids, Vec::<String>::new(), "{}", n.agent.name);
    }
}

// ---- f. a stopped agent's records expire -----------------------------------------------

/// An agent that registered an instance is killed (SIGKILL: no tombstone, no leave).
/// Its records are no longer renewed, and the other agents stop resolving the instance
/// once the last record's `not_after` has passed (3 s records here); the time is
/// printed, relative to the kill and to that `not_after`.
///
/// Before mesh trust, records carried no expiry: replica holders dropped them after
/// their store TTL, but nothing in the record itself bounded how long a copy could be
/// stored again and believed.
#[test]
fn f_a_stopped_agents_records_expire() {
    let dir = common::workdir();
    let short = ["--record-ttl-secs", "3", "--republish-secs", "1"];
    let mut nodes = ring(dir.path(), 3, &short);
    let registered = nodes[2]
        .agent
        .register("check", "check-1", "127.0.0.1:18001");
    let id = registered["registration"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    {
        let all: Vec<&Node> = nodes.iter().collect();
        wait_resolved(&all, "check", &[&id]);
    }
    nodes[2].agent.kill();
    let killed = Instant::now();
    let killed_ms = now_ms();
    let survivors = [&nodes[0], &nodes[1]];
    let mut last_not_after = 0;
    for n in survivors {
        wait_until(
            &format!("{}: the killed agent's instance gone", n.agent.name),
            DEADLINE,
            || {
                let answer = n.agent.resolve("check")?;
                let instances = answer["instances"].as_array()?;
                for i in instances {
                    last_not_after = last_not_after.max(i["not_after"].as_u64().unwrap());
                }
                // Gone, as every replica holder says (not merely unanswered while the
                // ring heals around the dead node).
                let all_answered = answer["answered"] == answer["replicas"];
                (instances.is_empty() && all_answered).then_some(())
            },
        );
    }
    let gone = now_ms();
    println!(
        "instance gone everywhere {:?} after the kill ({} ms after the kill, last not_after seen {} ms after it, gone {} ms after that)",
        killed.elapsed(),
        gone - killed_ms,
        last_not_after.saturating_sub(killed_ms),
        gone.saturating_sub(last_not_after),
    );
}

/// g. Revocations survive a restart: an agent killed after learning one refuses the
/// key from its first moment back, before it has polled the DHT (on the old code
/// there were no revocations; on the first version of this one they lived in memory).
#[test]
fn g_a_restarted_agent_still_knows_its_revocations() {
    let dir = common::workdir();
    let root = dir.path();
    let mut agent = Agent::spawn(root, "agent-0", Spawn::default());
    agent.wait_joined();
    let stolen = identity(MESH).printable_id();
    let mesh = common::mesh_dir(root);
    let (code, out, err) = agent.cli(&[
        "revoke",
        &stolen,
        "--mesh-dir",
        mesh.to_str().unwrap(),
        "--reason",
        "test",
        "--publish",
    ]);
    assert_eq!(code, 0, "{out}{err}");
    agent.kill();
    // Back with a poll period far beyond the test: only the saved file can tell it.
    let agent = Agent::spawn(
        root,
        "agent-0",
        Spawn {
            extra: &["--metrics", "off", "--revocation-poll-ms", "3600000"],
            ..Spawn::default()
        },
    );
    let (_, known) = agent.get("/v1/revocations").unwrap();
    let ids: Vec<&str> = known["revocations"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["id"].as_str())
        .collect();
    assert_eq!(ids, [stolen.as_str()], "{known}");
    assert!(
        agent.log().contains("loaded saved revocations"),
        "{}",
        agent.log_tail()
    );

    // And it stores it in the ring again: the copy it held before the kill died with
    // it (a one-node ring), so a node that joins now can learn it only from that.
    agent.wait_joined();
    let newcomer = Agent::spawn(
        root,
        "agent-1",
        Spawn {
            join: Some(&agent.contact),
            ..Spawn::default()
        },
    );
    newcomer.wait_joined();
    newcomer.wait_for(
        "the revocation, from the ring",
        Duration::from_secs(30),
        |a| {
            let (_, known) = a.get("/v1/revocations")?;
            (known["revocations"][0]["id"] == stolen.as_str()).then_some(())
        },
    );
}

/// h. A filter follows the agent's revocations by page, from where it stands: every
/// revocation is listed once across the pages, each page is bounded however many the
/// mesh holds (a whole list of thousands once outgrew the native filter's answer
/// limit, and every refresh then failed), a held poll is answered by the next one
/// learnt, and a restarted agent's list is another, read from its first.
/// `themis revocations` reads the agent's list by page: 4,000 revocations with their
/// log proofs are more than one answer may carry (the client's 4 MiB limit), and the
/// tool still lists each once. Before, it asked for the whole list and failed past
/// ~3,000.
#[test]
fn h_the_operators_tool_lists_more_revocations_than_one_answer_holds() {
    let dir = common::workdir();
    let root = dir.path();
    let mesh = common::mesh_dir(root);
    let agent = Agent::spawn(root, "agent-0", Spawn::default());
    agent.wait_joined();
    let count = 4_000;
    let mut ids: Vec<String> = (0..count).map(|_| identity(MESH).printable_id()).collect();
    agent.revoke_many(&ids, &mesh);
    // The whole list in one answer is past the client's limit (what the tool asked
    // for before), while the agent answers a page.
    assert!(
        agent.get(themis_contracts::paths::REVOCATIONS).is_none(),
        "the whole list fits one answer: the test proves nothing"
    );
    let (code, _) = agent
        .get(&themis_contracts::paths::revocations_since(0, 0, 0))
        .unwrap();
    assert_eq!(code, 200);
    let (code, out, err) = agent.cli(&["--json", "revocations"]);
    assert_eq!(code, 0, "{err}");
    let listed: serde_json::Value = serde_json::from_str(&out).unwrap();
    let mut by_tool: Vec<&str> = listed["revocations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap())
        .collect();
    by_tool.sort();
    ids.sort();
    assert_eq!(by_tool, ids, "each revocation listed once");
    let (code, out, _) = agent.cli(&["revocations"]);
    assert_eq!(code, 0);
    assert!(
        out.starts_with(&format!("{count} revocation(s)\n")),
        "{out:.200}"
    );
}

#[test]
fn h_revocations_are_served_by_bounded_pages_from_a_position() {
    let dir = common::workdir();
    let root = dir.path();
    let mesh = common::mesh_dir(root);
    let mut agent = Agent::spawn(root, "agent-0", Spawn::default());
    agent.wait_joined();
    let page_limit = themis_contracts::paths::MAX_REVOCATIONS_PAGE;
    let count = 2 * page_limit + 88;
    let ids: Vec<String> = (0..count).map(|_| identity(MESH).printable_id()).collect();
    agent.revoke_many(&ids, &mesh);
    let page_of = |agent: &Agent, list: u64, from: usize, wait_ms: u64| {
        let path = themis_contracts::paths::revocations_since(list, from, wait_ms);
        let (code, page) = agent.get(&path).unwrap();
        assert_eq!(code, 200, "{page}");
        let listed: Vec<String> = page["revocations"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["id"].as_str().unwrap().to_owned())
            .collect();
        assert!(listed.len() <= page_limit, "{} in one page", listed.len());
        assert!(page["checkpoint"].is_string(), "the log proves them");
        (
            page["list"].as_u64().unwrap(),
            page["from"].as_u64().unwrap() as usize,
            page["total"].as_u64().unwrap() as usize,
            listed,
        )
    };
    // Another list's position (0 is no agent's): answered from the first.
    let (list, from, total, mut read) = page_of(&agent, 0, 123, 0);
    assert_eq!((from, total, read.len()), (0, count, page_limit));
    while read.len() < total {
        let (same, from, _, page) = page_of(&agent, list, read.len(), 0);
        assert_eq!((same, from), (list, read.len()));
        read.extend(page);
    }
    let mut sorted = read.clone();
    sorted.sort();
    sorted.dedup();
    let mut expected = ids.clone();
    expected.sort();
    assert_eq!(sorted, expected, "each revocation listed once");
    // Past the end and not held: an empty page.
    let (_, _, _, none) = page_of(&agent, list, count, 0);
    assert!(none.is_empty());
    // Held past the end: answered with the next revocation learnt.
    let late = identity(MESH).printable_id();
    let asked = std::thread::scope(|s| {
        let held = s.spawn(|| page_of(&agent, list, count, 20_000));
        std::thread::sleep(Duration::from_millis(300));
        agent.revoke(&late, &mesh);
        held.join().unwrap()
    });
    assert_eq!(
        (asked.1, asked.2, asked.3),
        (count, count + 1, vec![late.clone()])
    );
    // Restarted: another list, and the old position is read from the first.
    agent.kill();
    let agent = Agent::spawn(root, "agent-0", Spawn::default());
    let (again, from, total, page) = page_of(&agent, list, count, 0);
    assert_ne!(again, list, "a restarted agent's list is another");
    assert_eq!((from, total, page.len()), (0, count + 1, page_limit));
}
