//! The local API authorises callers by what the kernel says about them (SO_PEERCRED
//! and the caller's cgroup), tested with real processes under other uids in their own
//! cgroups, as a pod's sidecar and a hostile pod on the same node would be.
//!
//! Before attestation, any process that could open the socket got every workload's
//! private key and could register, deregister, capture and store at will: each
//! refusal below failed then.

use themis_testkit::agent as common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use serde_json::{json, Value};
use themis_testkit::cgroup::Tree;
use themis_testkit::require;

/// The uid Istio runs its sidecars as.
const PROXY_UID: u32 = 1337;

/// A cgroup tree `<root>/{pod-a,pod-b}/{proxy,app}`, removed on drop.
fn pods(test: &str) -> Tree {
    Tree::new(test, &["pod-a/proxy", "pod-a/app", "pod-b/proxy"])
}

/// The gates of every test here: cgroups, other uids (setpriv), curl.
fn attested(why: &str) -> bool {
    require::root(why)
        && require::tool("setpriv", "calls as other uids")
        && require::tool("curl", "calls the API from a process in a cgroup")
}

/// A command that runs what is appended to it (program, then arguments) as a real
/// process moved into `cgroup` and then, with `uid`, running as that uid.
fn in_cgroup_as(cgroup: &Path, uid: Option<u32>) -> Command {
    let drop_privileges = match uid {
        Some(uid) => format!("setpriv --reuid={uid} --regid={uid} --clear-groups "),
        None => String::new(),
    };
    let mut command = Command::new("sh");
    command.arg("-c").arg(format!(
        "echo $$ > {}/cgroup.procs && exec {drop_privileges}\"$0\" \"$@\"",
        cgroup.display()
    ));
    command
}

/// One API call by a real process: moved into `cgroup`, then (with `uid`) running as
/// that uid, `curl` over the socket. Returns the status and the JSON answer.
fn call_as(
    socket: &Path,
    cgroup: &Path,
    uid: Option<u32>,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> (u16, Value) {
    let out = in_cgroup_as(cgroup, uid)
        .args(["curl", "-sS", "--max-time", "10", "-w", "\n%{http_code}"])
        .arg("--unix-socket")
        .arg(socket)
        .args(["-X", method, "-H", "content-type: application/json"])
        .args(
            body.map(|b| vec!["--data".to_owned(), b.to_string()])
                .unwrap_or_default(),
        )
        .arg(format!("http://agent{path}"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    let code = code.trim().parse().unwrap_or_else(|_| {
        panic!(
            "curl gave no status: {text} {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (code, serde_json::from_str(body).unwrap_or(Value::Null))
}

/// One SDS stream by a real process in `cgroup` (as `uid`): `curl` over HTTP/2 on
/// the API socket, asking for `workload`'s secret and half-closing. Returns the
/// grpc-status and the secrets' names and certificate PEMs that came back.
fn sds_as(
    socket: &Path,
    cgroup: &Path,
    uid: Option<u32>,
    workload: &str,
    scratch: &Path,
) -> (Option<u32>, Vec<(String, String)>) {
    use prost::Message;
    use themis_agent::sds::{DiscoveryRequest, DiscoveryResponse, Secret};
    let request = DiscoveryRequest {
        resource_names: vec![workload.to_owned()],
        type_url: themis_agent::sds::SECRET_TYPE.to_owned(),
        ..DiscoveryRequest::default()
    }
    .encode_to_vec();
    // gRPC's framing: uncompressed, a 4-byte length, the message.
    let mut body = vec![0u8];
    body.extend((request.len() as u32).to_be_bytes());
    body.extend(request);
    let body_file = scratch.join(format!("sds-{workload}.in"));
    std::fs::write(&body_file, body).unwrap();
    std::fs::set_permissions(&body_file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = in_cgroup_as(cgroup, uid)
        .args(["curl", "-sS", "--max-time", "10", "--http2-prior-knowledge"])
        .args(["-D", "-"])
        .arg("--unix-socket")
        .arg(socket)
        .args(["-H", "content-type: application/grpc", "-H", "te: trailers"])
        .arg("--data-binary")
        .arg(format!("@{}", body_file.display()))
        .arg(format!(
            "http://agent{}",
            themis_agent::sds::STREAM_SECRETS_PATH
        ))
        .output()
        .unwrap();
    let raw = out.stdout;
    // Headers, then the body's frames, then the trailers: the status is in either.
    let text = String::from_utf8_lossy(&raw);
    let status = text
        .rsplit_once("grpc-status: ")
        .and_then(|(_, v)| v.split_whitespace().next()?.parse().ok());
    let mut secrets = Vec::new();
    if let Some(start) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
        let mut frames = &raw[start + 4..];
        while frames.len() >= 5 && frames[0] == 0 {
            let len = u32::from_be_bytes(frames[1..5].try_into().unwrap()) as usize;
            let Some(message) = frames.get(5..5 + len) else {
                break;
            };
            let response = DiscoveryResponse::decode(message).expect("a DiscoveryResponse");
            for any in response.resources {
                let secret = Secret::decode(any.value.as_slice()).expect("a Secret");
                let pem = secret
                    .tls_certificate
                    .and_then(|tls| tls.certificate_chain?.inline_bytes)
                    .map(|b| String::from_utf8(b).unwrap())
                    .expect("a TLS certificate, inline PEM");
                secrets.push((secret.name, pem));
            }
            frames = &frames[5 + len..];
        }
    }
    (status, secrets)
}

/// The DER of a PEM certificate.
fn der_of(pem: &str) -> Vec<u8> {
    use base64::Engine;
    let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    base64::engine::general_purpose::STANDARD
        .decode(body)
        .unwrap()
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// The socket's directories must be passable for a non-root caller (the agent's
/// state dir is only the test's temporary directory here).
fn open_path_to(socket: &Path) {
    for dir in socket.ancestors().skip(1).take(3) {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
}

#[test]
fn a_sidecar_gets_only_its_own_workload_and_nothing_of_the_operators() {
    if !attested("creates cgroups and calls as other uids") {
        return;
    }
    let work = workdir();
    let pods = pods("attest-sidecar");
    // The operator calls from the agent's own cgroup (where this test runs), never
    // from a pod: so root inside a pod is not the operator.
    let operator_cgroup = pods.cgroup("host");
    let node = Metered::spawn(
        work.path(),
        "node",
        None,
        &["--operator-cgroup", operator_cgroup.to_str().unwrap()],
    );
    let agent = &node.agent;
    let socket = agent.dir.join("agent.sock");
    open_path_to(&socket);
    agent.grant("check");
    let mode = std::fs::metadata(&socket).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o666, "anyone may connect; calls are authorised");

    // The operator binds each workload to its pod (cgroup and proxy uid): through the
    // API, and with the tool.
    let owner = json!({"owner": {"cgroup": pods.cgroup("pod-a"), "uid": PROXY_UID}});
    let (code, answer) = agent
        .call(
            themis_agent_client::Method::PUT,
            "/v1/workloads/a",
            Some(&owner),
        )
        .unwrap();
    assert_eq!(code, 201, "{answer}");
    assert_eq!(answer["owner"]["uid"], PROXY_UID);
    let pod_b = pods.cgroup("pod-b");
    let uid = PROXY_UID.to_string();
    let (code, out, err) = agent.cli(&[
        "workload",
        "b",
        "--owner-cgroup",
        pod_b.to_str().unwrap(),
        "--owner-uid",
        &uid,
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains(&format!("bound to cgroup {} uid 1337", pod_b.display())),
        "{out}"
    );

    let sidecar_a = (pods.cgroup("pod-a/proxy"), Some(PROXY_UID));
    let sidecar_b = (pods.cgroup("pod-b/proxy"), Some(PROXY_UID));
    let call = |who: &(PathBuf, Option<u32>), method: &str, path: &str, body: Option<&Value>| {
        call_as(&socket, &who.0, who.1, method, path, body)
    };

    // Each sidecar gets its own workload's public identity and has its own Hellos
    // signed...
    let hello_of = |identity: &Value| hello_sign_request(identity, MESH);
    let delegate_request = json!({ "delegated_key": hex::encode([7u8; 32]) });
    let mut hellos = std::collections::BTreeMap::new();
    for (who, workload) in [(&sidecar_a, "a"), (&sidecar_b, "b")] {
        let (code, identity) = call(
            who,
            "GET",
            &format!("/v1/workloads/{workload}/identity"),
            None,
        );
        assert_eq!(code, 200, "{identity}");
        assert_eq!(identity["workload"], workload);
        let hello = hello_of(&identity);
        let (code, signed) = call(
            who,
            "POST",
            &format!("/v1/workloads/{workload}/sign"),
            Some(&hello),
        );
        assert_eq!(code, 200, "{signed}");
        assert!(signed["signature"].is_string());
        hellos.insert(workload, hello);
        // Wire v3: a delegation to its own short-lived key, too.
        let (code, delegated) = call(
            who,
            "POST",
            &format!("/v1/workloads/{workload}/delegate"),
            Some(&delegate_request),
        );
        assert_eq!(code, 200, "{delegated}");
        assert!(delegated["delegation"].is_string());
    }
    // ...and not the other's: not its identity, not a signature in its name (even of
    // a well-formed Hello of that workload), and no private key, not even its own.
    for (who, mine, other) in [(&sidecar_a, "a", "b"), (&sidecar_b, "b", "a")] {
        for (method, path, body) in [
            ("GET", format!("/v1/workloads/{other}/identity"), None),
            (
                "POST",
                format!("/v1/workloads/{other}/sign"),
                Some(&hellos[other]),
            ),
            (
                "POST",
                format!("/v1/workloads/{other}/delegate"),
                Some(&delegate_request),
            ),
        ] {
            let (code, answer) = call(who, method, &path, body);
            assert_eq!(
                (code, answer["reason"].as_str()),
                (403, Some("not_owner")),
                "{path}: {answer}"
            );
        }
        for workload in [mine, other] {
            let (code, answer) = call(who, "GET", &format!("/v1/workloads/{workload}/key"), None);
            assert_eq!(
                (code, answer["reason"].as_str()),
                (403, Some("not_operator")),
                "{answer}"
            );
            assert!(answer.get("private_key_pem").is_none());
        }
    }
    // The same over SDS (gRPC on the same socket): each sidecar gets its own
    // workload's TLS certificate, and a stream asking for the other's ends with
    // PERMISSION_DENIED and nothing in it.
    for (who, mine, other) in [(&sidecar_a, "a", "b"), (&sidecar_b, "b", "a")] {
        let (status, secrets) = sds_as(&socket, &who.0, who.1, mine, work.path());
        assert_eq!(status, Some(0), "{mine}: {secrets:?}");
        assert_eq!(secrets.len(), 1, "{mine}");
        assert_eq!(secrets[0].0, mine);
        assert!(secrets[0].1.starts_with("-----BEGIN CERTIFICATE-----\n"));
        let (status, secrets) = sds_as(&socket, &who.0, who.1, other, work.path());
        assert_eq!(
            (status, secrets.len()),
            (Some(7), 0),
            "{other} to {mine}'s sidecar"
        );
    }
    // Istio's name for a proxy's own certificate (what an Istio sidecar's Envoy asks
    // for, pilot-agent pointing it at this socket): each sidecar gets its own
    // workload's, under that name.
    let mesh = themis_core::MeshName::new(MESH).unwrap();
    for (who, mine) in [(&sidecar_a, "a"), (&sidecar_b, "b")] {
        let (status, secrets) = sds_as(&socket, &who.0, who.1, "default", work.path());
        assert_eq!((status, secrets.len()), (Some(0), 1), "{mine}: {secrets:?}");
        assert_eq!(secrets[0].0, "default");
        let peer = themis_x509::verify(&der_of(&secrets[0].1), &mesh, now_ms()).unwrap();
        let (_, identity) = call(who, "GET", &format!("/v1/workloads/{mine}/identity"), None);
        assert_eq!(peer.identity.printable_id(), identity["id"], "{mine}'s own");
    }
    // The app beside the sidecar (another uid, same pod) is not the sidecar.
    let app_a = (pods.cgroup("pod-a/app"), Some(1000));
    let (code, _) = call(&app_a, "POST", "/v1/workloads/a/sign", Some(&hellos["a"]));
    assert_eq!(code, 403);
    let (code, _) = call(
        &app_a,
        "POST",
        "/v1/workloads/a/delegate",
        Some(&delegate_request),
    );
    assert_eq!(code, 403);
    let (status, secrets) = sds_as(&socket, &app_a.0, app_a.1, "a", work.path());
    assert_eq!(
        (status, secrets.len()),
        (Some(7), 0),
        "the app asked for a's certificate"
    );
    // Nor its "own" certificate: no workload is bound to its uid; nor root's in the pod.
    for who in [&app_a, &(pods.cgroup("pod-a/app"), None)] {
        let (status, secrets) = sds_as(&socket, &who.0, who.1, "default", work.path());
        assert_eq!(
            (status, secrets.len()),
            (Some(7), 0),
            "{who:?} asked for its own"
        );
    }

    // Everything of the operator's is refused to a sidecar — and to root in a pod.
    let root_in_pod = (pods.cgroup("pod-a/app"), None);
    let register = json!({"endpoint": "127.0.0.1:15006"});
    let store = json!({"name": "check", "value": "forged"});
    let capture =
        json!({"endpoint": "127.0.0.1:15006", "capture": {"cgroup": pods.cgroup("pod-b")}});
    for who in [&sidecar_a, &root_in_pod] {
        for (method, path, body) in [
            ("PUT", "/v1/workloads/b", None),
            // Deleting a workload (so that its name gets a new key): not even its own.
            ("DELETE", "/v1/workloads/a", None),
            ("DELETE", "/v1/workloads/b", None),
            ("PUT", "/v1/services/check/instances/a", Some(&register)),
            ("PUT", "/v1/services/check/instances/b", Some(&capture)),
            ("DELETE", "/v1/services/check/instances/b", None),
            ("GET", "/v1/workloads", None),
            ("GET", "/v1/capture", None),
            ("POST", "/v1/debug/store", Some(&store)),
            ("GET", "/v1/debug/values/check", None),
            ("POST", "/v1/revocations", Some(&json!({"revocation": "x"}))),
            // The trust log is the operator's to hand over.
            ("POST", "/v1/log", Some(&json!({"copy": "x"}))),
        ] {
            let (code, answer) = call(who, method, path, body);
            assert_eq!(
                (code, answer["reason"].as_str()),
                (403, Some("not_operator")),
                "{method} {path} by {who:?}: {answer}"
            );
        }
        // What the ring tells anybody stays open.
        for path in [
            "/v1/status",
            "/v1/services/check",
            "/v1/revocations",
            "/v1/log",
        ] {
            let (code, answer) = call(who, "GET", path, None);
            assert_eq!(code, 200, "{path}: {answer}");
        }
    }

    // The operator still does everything, including any workload's key.
    let (code, out, err) = agent.cli(&[
        "register",
        "check",
        "--workload",
        "a",
        "--endpoint",
        "127.0.0.1:15006",
    ]);
    assert_eq!(code, 0, "{out}{err}");
    for workload in ["a", "b"] {
        let (code, _) = agent.get(&format!("/v1/workloads/{workload}/key")).unwrap();
        assert_eq!(code, 200);
    }
    // A capture must stay inside the pod the workload is bound to: the operator
    // cannot (by mistake or as a confused deputy) capture another pod for it.
    let (code, answer) = agent
        .call(
            themis_agent_client::Method::PUT,
            "/v1/services/check/instances/a",
            Some(&capture),
        )
        .unwrap();
    assert_eq!(
        (code, answer["reason"].as_str()),
        (403, Some("outside_owner")),
        "{answer}"
    );

    // Every refusal is counted by reason.
    let text = scrape(node.metrics).unwrap();
    let refused = |reason| sample(&text, "themis_api_refused_total", &[("reason", reason)]);
    // 5, the three /delegate calls above, and the three SDS streams.
    assert_eq!(refused("not_owner"), 11, "{text}");
    assert_eq!(refused("not_operator"), 28, "{text}");
}

/// The node controller's uid, from where the operator calls (on Kubernetes, its
/// container beside the agent's), meshes pods and takes no identity: it binds new
/// workloads to pods and deletes pods' workloads, but reads no key, publishes nothing,
/// moves no workload from the owner it has (another pod's, the operator's), binds
/// none to its own cgroups, and signs as no one. Before, the controller was the
/// operator: it could read every workload's private key.
#[test]
fn the_node_controller_meshes_pods_and_takes_no_identity() {
    if !attested("creates cgroups and calls as another uid") {
        return;
    }
    const CONTROLLER_UID: u32 = 65532;
    let work = workdir();
    // The controller calls from "host", where the operator may; pods are elsewhere.
    let pods = Tree::new("attest-controller", &["host", "pod-a/proxy", "pod-b/proxy"]);
    let operator_cgroup = pods.cgroup("host");
    let node = Metered::spawn(
        work.path(),
        "node",
        None,
        &[
            "--operator-cgroup",
            operator_cgroup.to_str().unwrap(),
            "--controller-uid",
            &CONTROLLER_UID.to_string(),
        ],
    );
    let agent = &node.agent;
    let socket = agent.dir.join("agent.sock");
    open_path_to(&socket);
    agent.grant("check");
    // An identity of the operator's, bound to no pod.
    let (code, _) = agent
        .call(themis_agent_client::Method::PUT, "/v1/workloads/ops", None)
        .unwrap();
    assert_eq!(code, 201);
    let controller = |method: &str, path: &str, body: Option<&Value>| {
        call_as(
            &socket,
            &operator_cgroup,
            Some(CONTROLLER_UID),
            method,
            path,
            body,
        )
    };
    let refused = |method: &str, path: &str, body: Option<&Value>, reason: &str| {
        let (code, answer) = controller(method, path, body);
        assert_eq!(
            (code, answer["reason"].as_str()),
            (403, Some(reason)),
            "{method} {path} by the controller: {answer}"
        );
        assert!(answer.get("private_key_pem").is_none());
    };

    // What it is for: a pod's workload made and bound, listed, bound again the same.
    let owner_of = |pod: &str| json!({"owner": {"cgroup": pods.cgroup(pod), "uid": PROXY_UID}});
    let (code, answer) = controller("PUT", "/v1/workloads/a", Some(&owner_of("pod-a")));
    assert_eq!(code, 201, "{answer}");
    let (code, answer) = controller("PUT", "/v1/workloads/a", Some(&owner_of("pod-a")));
    assert_eq!(code, 200, "{answer}");
    let (code, answer) = controller("GET", "/v1/workloads", None);
    assert_eq!(code, 200, "{answer}");
    assert_eq!(answer["owners"]["a"]["uid"], PROXY_UID, "{answer}");

    // No identity that exists changes hands: pod-a's moved to pod-b, the operator's
    // handed to a pod.
    refused(
        "PUT",
        "/v1/workloads/a",
        Some(&owner_of("pod-b")),
        "bound_elsewhere",
    );
    refused(
        "PUT",
        "/v1/workloads/ops",
        Some(&owner_of("pod-a")),
        "bound_elsewhere",
    );
    // None bound where the controller (or the operator) runs, or around it, or to no pod.
    let ours = json!({"owner": {"cgroup": operator_cgroup, "uid": CONTROLLER_UID}});
    let around = json!({"owner": {"cgroup": pods.cgroup(""), "uid": CONTROLLER_UID}});
    for body in [Some(&ours), Some(&around), None] {
        refused("PUT", "/v1/workloads/c", body, "not_a_pod");
    }
    let (code, _) = agent.get("/v1/workloads/c/key").unwrap();
    assert_eq!(code, 404, "a refused binding made no key");
    // A pod's registration carries the pod's capture.
    let register = json!({"endpoint": "127.0.0.1:15006"});
    refused(
        "PUT",
        "/v1/services/check/instances/a",
        Some(&register),
        "not_a_pod",
    );
    // It deletes pods' workloads, not the operator's.
    refused("DELETE", "/v1/workloads/ops", None, "not_a_pod");

    // Nothing else of the operator's: no key (not even of a pod it bound), no
    // revocation, no log copy, no debug, not the capture's state.
    let store = json!({"name": "check", "value": "forged"});
    for (method, path, body) in [
        ("GET", "/v1/workloads/a/key", None),
        ("GET", "/v1/workloads/ops/key", None),
        ("POST", "/v1/revocations", Some(&json!({"revocation": "x"}))),
        ("POST", "/v1/log", Some(&json!({"copy": "x"}))),
        ("POST", "/v1/debug/store", Some(&store)),
        ("GET", "/v1/debug/values/check", None),
        ("GET", "/v1/capture", None),
    ] {
        refused(method, path, body, "not_operator");
    }
    // And it is not a pod's proxy: no identity, no signature.
    refused("GET", "/v1/workloads/a/identity", None, "not_owner");
    let (status, secrets) = sds_as(
        &socket,
        &operator_cgroup,
        Some(CONTROLLER_UID),
        "a",
        work.path(),
    );
    assert_eq!(
        (status, secrets.len()),
        (Some(7), 0),
        "a's certificate to the controller"
    );

    // Its uid in a pod is nobody.
    let (code, answer) = call_as(
        &socket,
        &pods.cgroup("pod-b/proxy"),
        Some(CONTROLLER_UID),
        "GET",
        "/v1/workloads",
        None,
    );
    assert_eq!(
        (code, answer["reason"].as_str()),
        (403, Some("not_operator"))
    );

    // A pod gone: its workload deleted, key and all; asked again, not found.
    let (code, answer) = controller("DELETE", "/v1/workloads/a", None);
    assert_eq!(code, 200, "{answer}");
    let (code, answer) = controller("DELETE", "/v1/workloads/a", None);
    assert_eq!(code, 404, "{answer}");
    for workload in ["a", "ops"] {
        let (code, _) = agent.get(&format!("/v1/workloads/{workload}/key")).unwrap();
        assert_eq!(code, if workload == "a" { 404 } else { 200 }, "{workload}");
    }
}

#[test]
fn a_workload_bound_to_no_pod_is_only_the_operators() {
    if !attested("creates cgroups and calls as another uid") {
        return;
    }
    let work = workdir();
    let pods = pods("attest-unbound");
    let node = Metered::spawn(work.path(), "node", None, &[]);
    let socket = node.agent.dir.join("agent.sock");
    open_path_to(&socket);
    let (code, _) = node
        .agent
        .call(themis_agent_client::Method::PUT, "/v1/workloads/a", None)
        .unwrap();
    assert_eq!(code, 201);
    let (code, answer) = call_as(
        &socket,
        &pods.cgroup("pod-a/proxy"),
        Some(PROXY_UID),
        "GET",
        "/v1/workloads/a/identity",
        None,
    );
    assert_eq!(
        (code, answer["reason"].as_str()),
        (403, Some("unbound_workload")),
        "{answer}"
    );
    // A bad owner is refused with the rule.
    let bad = json!({"owner": {"cgroup": "/etc"}});
    let (code, answer) = node
        .agent
        .call(
            themis_agent_client::Method::PUT,
            "/v1/workloads/a",
            Some(&bad),
        )
        .unwrap();
    assert_eq!(code, 400, "{answer}");
}

/// With no `--operator-cgroup`, only callers in exactly the agent's own cgroup are the
/// operator: root in a pod reads no key and binds nothing. Before, the default was
/// "any cgroup", and this root got every workload's private key.
#[test]
fn root_in_a_pod_is_not_the_operator_by_default() {
    if !attested("creates cgroups and calls as root from a pod") {
        return;
    }
    let work = workdir();
    let pods = pods("attest-default");
    let node = Metered::spawn(work.path(), "node", None, &[]);
    let agent = &node.agent;
    let socket = agent.dir.join("agent.sock");
    open_path_to(&socket);
    // The test runs in the agent's own cgroup: it is the operator.
    let owner = json!({"owner": {"cgroup": pods.cgroup("pod-a"), "uid": PROXY_UID}});
    let (code, answer) = agent
        .call(
            themis_agent_client::Method::PUT,
            "/v1/workloads/a",
            Some(&owner),
        )
        .unwrap();
    assert_eq!(code, 201, "{answer}");
    let (code, _) = agent.get("/v1/workloads/a/key").unwrap();
    assert_eq!(code, 200);

    let root_in_pod = pods.cgroup("pod-b/proxy");
    for (method, path, body) in [
        ("GET", "/v1/workloads/a/key", None),
        ("PUT", "/v1/workloads/b", Some(&owner)),
        ("GET", "/v1/workloads", None),
    ] {
        let (code, answer) = call_as(&socket, &root_in_pod, None, method, path, body);
        assert_eq!(
            (code, answer["reason"].as_str()),
            (403, Some("not_operator")),
            "{method} {path} by root in a pod: {answer}"
        );
        assert!(answer.get("private_key_pem").is_none());
    }

    // An owner must name the proxy's uid, or say that any uid will do.
    let no_uid = json!({"owner": {"cgroup": pods.cgroup("pod-b")}});
    let (code, answer) = agent
        .call(
            themis_agent_client::Method::PUT,
            "/v1/workloads/b",
            Some(&no_uid),
        )
        .unwrap();
    assert_eq!(code, 400, "{answer}");
    assert!(
        answer["error"].as_str().unwrap().contains("any_uid"),
        "{answer}"
    );
    let pod_b = pods.cgroup("pod-b");
    let (code, _, err) = agent.cli(&["workload", "b", "--owner-cgroup", pod_b.to_str().unwrap()]);
    assert_eq!(code, 2, "the tool refuses before calling: {err}");
    assert!(err.contains("--owner-uid"), "{err}");
    let (code, out, err) = agent.cli(&[
        "workload",
        "b",
        "--owner-cgroup",
        pod_b.to_str().unwrap(),
        "--any-uid",
    ]);
    assert_eq!(code, 0, "{out}{err}");
}

/// A pod that opens connection after connection to the API socket is held to its
/// per-cgroup cap (the rest are closed at once and counted), while the operator and
/// another pod's sidecar are still served. Before, the socket had no cap: a pod could
/// hold connections until the agent ran out of file descriptors.
#[test]
fn a_pod_cannot_hold_every_api_connection() {
    if !attested("creates cgroups and calls from them")
        || !require::tool("python3", "holds connections")
    {
        return;
    }
    const CAP: usize = themis_agent::local_socket::MAX_PER_CGROUP;
    let opened = CAP + 36;
    let work = workdir();
    let pods = pods("attest-cap");
    let node = Metered::spawn(work.path(), "node", None, &[]);
    let agent = &node.agent;
    let socket = agent.dir.join("agent.sock");
    open_path_to(&socket);
    let owner = json!({"owner": {"cgroup": pods.cgroup("pod-b"), "uid": PROXY_UID}});
    let (code, answer) = agent
        .call(
            themis_agent_client::Method::PUT,
            "/v1/workloads/b",
            Some(&owner),
        )
        .unwrap();
    assert_eq!(code, 201, "{answer}");

    // The hoarder: opens `opened` connections, waits until the agent has closed the
    // ones over the cap (or 20 s), prints how many it closed, and holds the rest
    // until its stdin closes.
    let script = r#"
import socket, sys, time
path, n, expect = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
socks = []
for _ in range(n):
    s = socket.socket(socket.AF_UNIX); s.connect(path); s.setblocking(False); socks.append(s)
def closed():
    c = 0
    for s in socks:
        try:
            if s.recv(1, socket.MSG_PEEK) == b"": c += 1
        except BlockingIOError:
            pass
    return c
deadline = time.time() + 20
while closed() < expect and time.time() < deadline:
    time.sleep(0.05)
time.sleep(0.5)
print(closed(), flush=True)
sys.stdin.read()
"#;
    let mut hoarder = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "echo $$ > {}/cgroup.procs && exec python3 -c \"$0\" \"$@\"",
            pods.cgroup("pod-a/app").display()
        ))
        .args([
            script,
            socket.to_str().unwrap(),
            &opened.to_string(),
            &(opened - CAP).to_string(),
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(hoarder.stdout.as_mut().unwrap()),
        &mut line,
    )
    .unwrap();
    let closed: usize = line.trim().parse().unwrap();

    // While the hoarder holds its share: the operator and pod-b's sidecar get in.
    let (code, _) = agent.get("/v1/status").unwrap();
    assert_eq!(code, 200);
    let (code, answer) = call_as(
        &socket,
        &pods.cgroup("pod-b/proxy"),
        Some(PROXY_UID),
        "GET",
        "/v1/workloads/b/identity",
        None,
    );
    assert_eq!(code, 200, "{answer}");
    drop(hoarder.stdin.take());
    hoarder.wait().unwrap();

    assert_eq!(
        closed,
        opened - CAP,
        "connections over the cap are closed at once"
    );
    let text = scrape(node.metrics).unwrap();
    assert_eq!(
        sample(
            &text,
            "themis_api_refused_total",
            &[("reason", "over_connection_cap")]
        ),
        (opened - CAP) as u64,
        "{text}"
    );
}
