//! Delegated signing through a real agent: `POST /v1/workloads/{workload}/sign` signs
//! a handshake message of that workload and nothing else, and
//! `GET /v1/workloads/{workload}/identity` gives the public identity a sidecar needs.

use themis_testkit::agent as common;

use common::{metered, sample, scrape, workdir, Agent, Spawn, MESH};
use ring::rand::SystemRandom;
use serde_json::{json, Value};
use themis_agent_client::Method;
use themis_core::handshake::{self, Initiator};
use themis_core::identity::PublicIdentity;
use themis_core::{HandshakeConfig, HelloGuard, Identity, MeshName, PeerId};

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

fn sign(agent: &Agent, workload: &str, body: &Value) -> (u16, Value) {
    agent
        .call(
            Method::POST,
            &format!("/v1/workloads/{workload}/sign"),
            Some(body),
        )
        .expect("the agent answers")
}

#[test]
fn the_agent_signs_its_workloads_handshake_messages_and_nothing_else() {
    let root = workdir();
    let (args, metrics) = metered(&[]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let agent = Agent::spawn(
        root.path(),
        "a",
        Spawn {
            extra: &args,
            ..Spawn::default()
        },
    );
    let mesh = MeshName::new(MESH).unwrap();
    let config = HandshakeConfig::default();
    let rng = SystemRandom::new();
    for workload in ["check", "other"] {
        let (code, _) = agent
            .call(Method::PUT, &format!("/v1/workloads/{workload}"), None)
            .unwrap();
        assert!(code == 200 || code == 201, "creating {workload}: {code}");
    }

    // The public identity: all the sidecar gets; the key hashes to the id.
    let (code, answer) = agent.get("/v1/workloads/check/identity").unwrap();
    assert_eq!(code, 200, "{answer}");
    assert!(answer.get("private_key_pem").is_none(), "{answer}");
    let mut key = [0u8; 32];
    hex::decode_to_slice(answer["public_key"].as_str().unwrap(), &mut key).unwrap();
    let me = PublicIdentity::new(key, mesh.clone());
    assert_eq!(answer["id"], me.printable_id());
    assert_eq!(answer["mesh"], MESH);
    assert_eq!(answer["workload"], "check");
    let (code, _) = agent.get("/v1/workloads/nobody/identity").unwrap();
    assert_eq!(code, 404);

    // A Hello of its own: signed, and the signature completes message 1.
    let peer = Identity::generate(mesh.clone(), &rng).unwrap();
    let pending = Initiator::start_unsigned(&me, peer.id(), &config, now_ms(), &rng).unwrap();
    let hello = pending.to_sign();
    let request = json!({ "kind": "hello", "body": hex::encode(&hello.body) });
    let (code, answer) = sign(&agent, "check", &request);
    assert_eq!(code, 200, "{answer}");
    let mut signature = [0u8; 64];
    hex::decode_to_slice(answer["signature"].as_str().unwrap(), &mut signature).unwrap();
    let (_, hello_bytes) = pending.finish(&signature).expect("the signature verifies");
    // The peer accepts the message signed this way.
    assert!(handshake::respond(
        &peer,
        &hello_bytes,
        &config,
        &mut HelloGuard::default(),
        now_ms(),
        &rng
    )
    .is_ok());

    // No Hello for later (or from long ago): a compromised sidecar cannot stock signed
    // Hellos that outlive it.
    for skew in [-3_600_000i64, 3_600_000] {
        let at = now_ms().saturating_add_signed(skew);
        let pending = Initiator::start_unsigned(&me, peer.id(), &config, at, &rng).unwrap();
        let request = json!({ "kind": "hello", "body": hex::encode(&pending.to_sign().body) });
        let (code, answer) = sign(&agent, "check", &request);
        assert_eq!(
            (code, answer["reason"].as_str()),
            (422, Some("stale")),
            "{answer}"
        );
    }

    // A reply of its own, to a Hello from the peer.
    let (_, peer_hello) = Initiator::start(&peer, me.id(), &config, now_ms(), &rng).unwrap();
    let pending = handshake::respond_unsigned(
        &me,
        &peer_hello,
        &config,
        &mut HelloGuard::default(),
        now_ms(),
        &rng,
    )
    .unwrap();
    let reply = pending.to_sign();
    let request = json!({
        "kind": "hello_reply",
        "body": hex::encode(&reply.body),
        "hello_hash": hex::encode(reply.hello_hash.unwrap()),
    });
    let (code, answer) = sign(&agent, "check", &request);
    assert_eq!(code, 200, "{answer}");
    hex::decode_to_slice(answer["signature"].as_str().unwrap(), &mut signature).unwrap();
    assert!(pending.finish(&signature).is_ok());

    // Another workload's message: the body names another key.
    let (code, answer) = sign(
        &agent,
        "other",
        &json!({ "kind": "hello", "body": hex::encode(&hello.body) }),
    );
    assert_eq!(
        (code, answer["reason"].as_str()),
        (403, Some("not_mine")),
        "{answer}"
    );
    // A Hello of some other key entirely, asked of our workload.
    let stranger = Initiator::start_unsigned(peer.public(), me.id(), &config, now_ms(), &rng)
        .unwrap()
        .to_sign();
    let (code, answer) = sign(
        &agent,
        "check",
        &json!({ "kind": "hello", "body": hex::encode(&stranger.body) }),
    );
    assert_eq!(
        (code, answer["reason"].as_str()),
        (403, Some("not_mine")),
        "{answer}"
    );

    // Garbage, oversize, wrong kind, bad hex, unknown fields, unknown workload.
    let body = hex::encode(&hello.body);
    let refused = [
        (
            json!({ "kind": "hello", "body": "00ff00ff" }),
            422,
            "malformed",
        ),
        (
            json!({ "kind": "hello", "body": hex::encode(b"GET / HTTP/1.1\r\n") }),
            422,
            "malformed",
        ),
        (
            json!({ "kind": "hello", "body": "00".repeat(3100) }),
            400,
            "too_large",
        ),
        (json!({ "kind": "confirm", "body": body }), 400, "bad_kind"),
        (
            json!({ "kind": "statement", "body": body }),
            400,
            "bad_kind",
        ),
        (
            json!({ "kind": "hello_reply", "body": body, "hello_hash": "00".repeat(32) }),
            422,
            "malformed",
        ),
        (
            json!({ "kind": "hello", "body": body, "hello_hash": "00".repeat(32) }),
            422,
            "hello_hash",
        ),
        (json!({ "kind": "hello", "body": "zz" }), 400, "bad_hex"),
        (
            json!({ "kind": "hello_reply", "body": body, "hello_hash": "abcd" }),
            400,
            "bad_hex",
        ),
        (
            json!({ "kind": "hello", "body": body, "digest": "00" }),
            422,
            "bad_request",
        ),
        (json!({ "kind": "hello" }), 422, "bad_request"),
    ];
    for (request, status, reason) in &refused {
        let (code, answer) = sign(&agent, "check", request);
        assert_eq!(
            (code, answer["reason"].as_str()),
            (*status, Some(*reason)),
            "{request}: {answer}"
        );
    }
    // Over the API's body limit.
    let huge = json!({ "kind": "hello", "body": "00".repeat(20_000) });
    let (code, _) = sign(&agent, "check", &huge);
    assert_eq!(code, 413);
    let (code, answer) = sign(&agent, "nobody", &request);
    assert_eq!((code, answer["reason"].as_str()), (404, Some("not_found")));

    // Counted: two signatures, every refusal by reason.
    let text = scrape(metrics).unwrap();
    let signed = |kind| {
        sample(
            &text,
            "themis_handshake_signatures_total",
            &[("kind", kind)],
        )
    };
    assert_eq!((signed("hello"), signed("hello_reply")), (1, 1), "{text}");
    let refused_for = |reason| {
        sample(
            &text,
            "themis_handshake_sign_refused_total",
            &[("reason", reason)],
        )
    };
    assert_eq!(refused_for("not_mine"), 2, "{text}");
    assert_eq!(refused_for("malformed"), 3, "{text}");
    assert_eq!(refused_for("bad_kind"), 2, "{text}");
    assert_eq!(refused_for("not_found"), 1, "{text}");
    assert!(refused_for("bad_request") >= 3, "{text}");
    // The ids in answers are the workload's own.
    assert_eq!(PeerId::derive(&key, MESH), me.id());
}

/// A deleted workload leaves nothing that signs: its key file is gone, its identity
/// and signatures are not found, and a workload made again under its name has a new
/// id (a Kubernetes pod made again under the same name is a new workload). One still
/// registered is not deleted: deregistered first.
#[test]
fn a_deleted_workload_leaves_no_key_and_its_name_gets_a_new_id() {
    let root = workdir();
    let agent = Agent::spawn(root.path(), "a", Spawn::default());
    let create = || {
        let (code, answer) = agent
            .call(Method::PUT, "/v1/workloads/web-0", None)
            .unwrap();
        assert_eq!(code, 201, "{answer}");
        answer["id"].as_str().unwrap().to_owned()
    };
    let delete = || {
        agent
            .call(Method::DELETE, "/v1/workloads/web-0", None)
            .unwrap()
    };
    let first = create();
    let key_file = agent.dir.join("workloads/web-0.key");
    assert!(key_file.exists(), "no key file at {}", key_file.display());

    agent.register_with("check", "web-0", "127.0.0.1:15006", None);
    let (code, answer) = delete();
    assert_eq!(code, 409, "{answer}");
    assert_eq!(answer["reason"], "registered", "{answer}");
    assert!(key_file.exists(), "a registered workload's key was deleted");

    let (code, answer) = agent
        .call(Method::DELETE, "/v1/services/check/instances/web-0", None)
        .unwrap();
    assert_eq!(code, 200, "{answer}");
    let (code, answer) = delete();
    assert_eq!(code, 200, "{answer}");
    assert_eq!(answer["workload"], "web-0");
    assert_eq!(answer["id"], first.as_str(), "{answer}");
    assert!(!key_file.exists(), "the key file outlived the workload");
    let (code, _) = agent.get("/v1/workloads/web-0/identity").unwrap();
    assert_eq!(code, 404);
    let hello = json!({ "kind": "hello", "body": hex::encode([0u8; 32]) });
    let (code, answer) = sign(&agent, "web-0", &hello);
    assert_eq!(code, 404, "a deleted workload signed: {answer}");
    let (code, _) = delete();
    assert_eq!(code, 404, "deleted twice");

    let second = create();
    assert_ne!(second, first, "the name got its old identity back");
}
