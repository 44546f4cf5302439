//! Wire v3 through a real agent: `POST /v1/workloads/{workload}/delegate` delegates the
//! workload's handshake signing to the proxy's own short-lived key, with the workload's
//! endorsement, and refuses once the mesh root revoked the workload.

use std::time::Duration;

use themis_testkit::agent as common;

use common::{workdir, Agent, Spawn, MESH};
use ring::rand::SystemRandom;
use serde_json::{json, Value};
use themis_agent_client::Method;
use themis_core::handshake::{self, Initiator};
use themis_core::identity::PublicIdentity;
use themis_core::{
    Credential, DelegatedKey, Delegation, HandshakeConfig, HelloGuard, Identity, MeshName,
};
use themis_trust::{MeshRoot, Revocations, Verifier};

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

fn delegate(agent: &Agent, workload: &str, body: &Value) -> (u16, Value) {
    post(
        agent,
        &themis_contracts::paths::workload_delegate(workload),
        body,
    )
}

fn certificate(agent: &Agent, workload: &str, body: &Value) -> (u16, Value) {
    post(
        agent,
        &themis_contracts::paths::workload_certificate(workload),
        body,
    )
}

/// The mesh root of the test's mesh directory.
fn mesh_root(root: &std::path::Path) -> MeshRoot {
    std::fs::read_to_string(common::mesh_dir(root).join("mesh.root"))
        .unwrap()
        .trim()
        .parse()
        .expect("the mesh root")
}

fn post(agent: &Agent, path: &str, body: &Value) -> (u16, Value) {
    agent
        .call(Method::POST, path, Some(body))
        .expect("the agent answers")
}

/// Revokes `id` with the mesh root and waits until `ask` is refused for it: the
/// refusal's status and answer.
fn revoke_until_refused(
    agent: &Agent,
    root: &std::path::Path,
    id: &str,
    ask: impl Fn(&Agent) -> (u16, Value),
) -> (u16, Value) {
    let mesh_arg = common::mesh_dir(root).display().to_string();
    let (code, stdout, stderr) = agent.cli(&[
        "revoke",
        id,
        "--mesh-dir",
        &mesh_arg,
        "--reason",
        "stolen",
        "--publish",
    ]);
    assert_eq!(code, 0, "{stdout}{stderr}");
    agent.wait_for(
        "the revocation to be known",
        std::time::Duration::from_secs(30),
        |agent| {
            // Polling spends the workload's delegation budget: a 429 is not yet.
            let (code, answer) = ask(agent);
            (code != 200 && code != 429).then_some((code, answer))
        },
    )
}

#[test]
fn the_agent_delegates_to_the_proxys_key_with_the_endorsement_and_stops_at_revocation() {
    let root = workdir();
    let agent = Agent::spawn(root.path(), "a", Spawn::default());
    let mesh = MeshName::new(MESH).unwrap();
    let rng = SystemRandom::new();
    // Before its workload registers: a delegation with no endorsement, to be asked
    // again within seconds (not at half its life).
    themis_testkit::mesh::create_workload(&agent, "check-1");
    let key = DelegatedKey::generate(&rng).unwrap();
    let request = json!({ "delegated_key": hex::encode(key.public_key()), "lifetime_secs": 600 });
    let asked = now_ms();
    let (code, answer) = delegate(&agent, "check-1", &request);
    assert_eq!(code, 200, "{answer}");
    assert!(answer["endorsement"].is_null(), "{answer}");
    let renew_at = answer["renew_at_ms"].as_u64().unwrap();
    assert!(
        renew_at <= now_ms() + themis_agent::signing::UNENDORSED_RENEW_MS,
        "renew at {renew_at}, asked at {asked}"
    );
    agent.register("check", "check-1", "127.0.0.1:15001");

    // The proxy's key, delegated: the answer verifies and makes a working credential.
    let key = DelegatedKey::generate(&rng).unwrap();
    let request = json!({ "delegated_key": hex::encode(key.public_key()), "lifetime_secs": 600 });
    let (code, answer) = delegate(&agent, "check-1", &request);
    assert_eq!(code, 200, "{answer}");
    let mut public = [0u8; 32];
    hex::decode_to_slice(
        answer["identity"]["public_key"].as_str().unwrap(),
        &mut public,
    )
    .unwrap();
    let me = PublicIdentity::new(public, mesh.clone());
    assert_eq!(answer["identity"]["id"], me.printable_id());
    let delegation =
        Delegation::decode(&hex::decode(answer["delegation"].as_str().unwrap()).unwrap()).unwrap();
    assert_eq!(delegation.not_after_ms - delegation.not_before_ms, 600_000);
    assert!(answer["renew_at_ms"].as_u64().unwrap() <= delegation.renew_at_ms());
    assert_eq!(answer["service"], "check");
    let endorsement = hex::decode(answer["endorsement"].as_str().unwrap()).unwrap();

    // The endorsement is the record a peer checks offline: check, for this very key.
    let mesh_root = mesh_root(root.path());
    let revoked = Revocations::new();
    let verifier = Verifier {
        root: &mesh_root,
        now_ms: now_ms(),
        revoked: &revoked,
    };
    let instance = verifier
        .instance(&endorsement, "check")
        .expect("endorsed for check");
    assert_eq!(instance.id, me.id());

    // A handshake signed by the proxy's key alone, accepted by a peer as the workload.
    let credential = Credential::new(me.clone(), key, delegation, endorsement, now_ms()).unwrap();
    let peer = Identity::generate(mesh.clone(), &rng).unwrap();
    let config = HandshakeConfig::default();
    let (waiting, hello) =
        Initiator::start(&credential, peer.id(), &config, now_ms(), &rng).unwrap();
    let (pending, reply) = handshake::respond(
        &peer,
        &hello,
        &config,
        &mut HelloGuard::default(),
        now_ms(),
        &rng,
    )
    .unwrap();
    let (session, confirm) = waiting.read_hello_reply(&reply).unwrap();
    let peer_side = pending.read_confirm(&confirm).unwrap();
    assert_eq!(peer_side.info().peer_id, me.id());
    assert_eq!(session.info().peer_id, peer.id());
    assert_eq!(
        verifier
            .instance(&peer_side.info().peer_endorsement, "check")
            .unwrap()
            .id,
        me.id()
    );

    // Bad input: a clear refusal, nothing issued.
    let (code, answer) = delegate(&agent, "check-1", &json!({ "delegated_key": "zz" }));
    assert_eq!(
        (code, answer["reason"].as_str()),
        (400, Some("bad_hex")),
        "{answer}"
    );
    let (code, _) = delegate(
        &agent,
        "check-1",
        &json!({ "delegated_key": "00", "extra": 1 }),
    );
    assert_eq!(code, 422);
    let (code, answer) = delegate(&agent, "nobody", &request);
    assert_eq!(code, 404, "{answer}");

    // Revoked by the mesh root: no new delegation.
    let (code, answer) = revoke_until_refused(&agent, root.path(), &me.printable_id(), |agent| {
        delegate(agent, "check-1", &request)
    });
    assert_eq!(
        (code, answer["reason"].as_str()),
        (403, Some("revoked")),
        "{answer}"
    );
}

/// A compromised proxy sizes neither its keys' lives nor their number: a day asked
/// is the agent's maximum given (an hour by default, `--max-delegation-secs` less),
/// for a delegation and a certificate alike; past the workload's budget both are
/// refused with 429 while another workload's proxy is still served; each delegated
/// key is in the agent's log.
#[test]
fn the_agent_caps_a_delegations_life_and_how_many_a_workload_is_given() {
    let root = workdir();
    let rng = SystemRandom::new();
    let day = json!(24 * 3600);
    let lifetime = |answer: &Value| {
        let d = Delegation::decode(&hex::decode(answer["delegation"].as_str().unwrap()).unwrap())
            .unwrap();
        d.not_after_ms - d.not_before_ms
    };
    let ask = |agent: &Agent, workload: &str| {
        let key = DelegatedKey::generate(&rng).unwrap();
        let key = hex::encode(key.public_key());
        let body = json!({ "delegated_key": key, "lifetime_secs": day });
        (key, delegate(agent, workload, &body))
    };

    // The default: at most an hour, whatever is asked; less is given as asked.
    let agent = Agent::spawn(root.path(), "a", Spawn::default());
    themis_testkit::mesh::create_workload(&agent, "check-1");
    let (key, (code, answer)) = ask(&agent, "check-1");
    assert_eq!(code, 200, "{answer}");
    assert_eq!(lifetime(&answer), 3_600_000, "a day asked, an hour given");
    agent.wait_for(
        "the delegated key in the log",
        Duration::from_secs(10),
        |a| a.log().contains(&key).then_some(()),
    );
    let request = json!({ "delegated_key": key, "lifetime_secs": 600 });
    let (code, answer) = delegate(&agent, "check-1", &request);
    assert_eq!((code, lifetime(&answer)), (200, 600_000), "{answer}");
    drop(agent);

    // Configured lower, with a budget of three: a certificate capped as well, then
    // refusals for this workload only.
    let root = workdir();
    let extra: Vec<&str> = [
        "--max-delegation-secs",
        "300",
        "--delegation-burst",
        "3",
        "--delegations-per-minute",
        "1",
    ]
    .into_iter()
    .chain(common::FAST.iter().copied())
    .collect();
    let agent = Agent::spawn(
        root.path(),
        "a",
        Spawn {
            extra: &extra,
            ..Spawn::default()
        },
    );
    themis_testkit::mesh::create_workload(&agent, "check-1");
    themis_testkit::mesh::create_workload(&agent, "check-2");
    let (_, (code, answer)) = ask(&agent, "check-1");
    assert_eq!((code, lifetime(&answer)), (200, 300_000), "{answer}");
    let (code, issued) = certificate(&agent, "check-1", &json!({ "lifetime_secs": day }));
    assert_eq!(code, 200, "{issued}");
    let issued_for = issued["not_after_ms"]
        .as_u64()
        .unwrap()
        .saturating_sub(now_ms());
    assert!(
        issued_for <= 300_000,
        "the certificate lives {issued_for} ms"
    );
    let (_, (code, answer)) = ask(&agent, "check-1");
    assert_eq!(code, 200, "the third of the burst: {answer}");
    let (_, (code, answer)) = ask(&agent, "check-1");
    assert_eq!(
        (code, answer["reason"].as_str()),
        (429, Some("rate_limited")),
        "{answer}"
    );
    let (code, issued) = certificate(&agent, "check-1", &json!({}));
    assert_eq!(
        code, 429,
        "a certificate is taken from the same budget: {issued}"
    );
    let (_, (code, answer)) = ask(&agent, "check-2");
    assert_eq!(code, 200, "another workload is not charged: {answer}");
}

/// The TLS binding through a real agent (docs/PROTOCOL.md §8):
/// `POST /v1/workloads/{workload}/certificate` makes a P-256 key and its certificate,
/// which the sidecar's check takes as the workload, endorsed for its service, under
/// the mesh root, and by its SNI name only; the key is the certificate's; once the
/// root revoked the workload, none is made.
#[test]
fn the_agent_makes_the_proxys_tls_certificate_and_stops_at_revocation() {
    let root = workdir();
    let agent = Agent::spawn(root.path(), "a", Spawn::default());
    themis_testkit::mesh::create_workload(&agent, "check-1");
    agent.register("check", "check-1", "127.0.0.1:15001");
    let (code, issued) = certificate(&agent, "check-1", &json!({ "lifetime_secs": 600 }));
    assert_eq!(code, 200, "{issued}");
    let der = hex::decode(issued["certificate"].as_str().unwrap()).unwrap();
    let mesh_root = mesh_root(root.path());
    let revoked = Revocations::new();
    let verifier = Verifier {
        root: &mesh_root,
        now_ms: now_ms(),
        revoked: &revoked,
    };
    let sni = issued["sni_name"].as_str().unwrap();
    let proven = themis_sidecar::tls::check(&der, Some(sni), &verifier).expect("a peer as check");
    assert_eq!(
        proven.id.printable(&mesh_root.mesh),
        issued["identity"]["id"]
    );
    assert_eq!(proven.service.as_deref(), Some("check"));
    assert_eq!(proven.principal, format!("spiffe://{MESH}/svc/check"));
    assert_eq!(issued["principal"], proven.principal.as_str());
    assert_eq!(
        proven.not_after_ms,
        issued["not_after_ms"].as_u64().unwrap()
    );
    assert!(issued["renew_at_ms"].as_u64().unwrap() < proven.not_after_ms);
    // The private key is the certificate's: the key the delegation names.
    let key = hex::decode(issued["private_key"].as_str().unwrap()).unwrap();
    let key = themis_x509::TlsKey::from_pkcs8(&key, &SystemRandom::new()).unwrap();
    let peer = themis_x509::verify(&der, &mesh_root.mesh, now_ms()).unwrap();
    assert_eq!(peer.key_sha256, key.spki_sha256());
    // Asked under another peer's SNI name: refused.
    let stranger = Identity::generate(mesh_root.mesh.clone(), &SystemRandom::new()).unwrap();
    let elsewhere = themis_x509::sni_name(&stranger.id(), &mesh_root.mesh);
    assert!(themis_sidecar::tls::check(&der, Some(&elsewhere), &verifier).is_err());
    // Bad input: a clear refusal.
    let (code, _) = certificate(&agent, "check-1", &json!({ "extra": 1 }));
    assert_eq!(code, 422);
    let (code, answer) = certificate(&agent, "nobody", &json!({}));
    assert_eq!(code, 404, "{answer}");

    // Revoked by the mesh root: no new certificate.
    let id = issued["identity"]["id"].as_str().unwrap();
    let (code, answer) = revoke_until_refused(&agent, root.path(), id, |agent| {
        certificate(agent, "check-1", &json!({}))
    });
    assert_eq!(
        (code, answer["reason"].as_str()),
        (403, Some("revoked")),
        "{answer}"
    );
}
