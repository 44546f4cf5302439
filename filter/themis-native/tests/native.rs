//! The native runtime in the real Envoy (`.venv/bin/envoy`, 1.40) with two real
//! agents: node A (`handler`) and node B (`check`, the echo app), each sidecar on the
//! runtime a test names (`deploy/envoy/sidecar-native.yaml` or the Wasm one). The
//! module (`libthemis_native.so`, release) is built by the tests themselves.

use themis_testkit as support;

use support::app::seen_header;
use support::envoy::ALLOW_HANDLER;
use support::mesh::{Mesh, Runtime};
use support::require;

const PEER_ID: &str = "x-themis-peer-id";
const PEER_SERVICE: &str = "x-themis-peer-service";

/// `check` registered at Envoy B and resolved where A's runtime needs it.
fn mesh(a: Runtime, b: Runtime) -> Mesh {
    let mesh = Mesh::start_on(a, b, Some(ALLOW_HANDLER));
    mesh.register("check", "check", mesh.envoy_b.inbound);
    if a == Runtime::Native {
        mesh.envoy_a
            .wait_native_resolves("check", mesh.envoy_b.inbound);
    }
    if b == Runtime::Native {
        let handler_at = mesh.envoy_a.inbound;
        mesh.envoy_b.wait_native_resolves("handler", handler_at);
    }
    mesh
}

/// A call from `handler` to `check` by name: the body arrives whole, the callee's
/// app learns the caller from its sidecar only (a forged header is gone), the
/// caller learns who answered.
fn call_is_sealed_and_attributed(mesh: &Mesh) {
    let body = b"is 7 prime?";
    let r = mesh.call(
        "POST",
        "check",
        "/check?n=7",
        &[
            ("x-themis-peer-id", "forged"),
            ("content-type", "text/plain"),
        ],
        body,
    );
    assert_eq!(r.status, 200, "{r}\n{}", mesh.logs());
    let echo = r.json();
    assert_eq!(echo["body"], "is 7 prime?", "{echo}");
    assert_eq!(
        seen_header(&echo, PEER_ID),
        [mesh.handler_id.as_str()],
        "{echo}"
    );
    assert_eq!(seen_header(&echo, PEER_SERVICE), ["handler"], "{echo}");
    assert!(!echo["headers"].to_string().contains("forged"), "{echo}");
    assert_eq!(r.header(PEER_ID), Some(mesh.check_id.as_str()), "{r}");

    // 1 MiB each way, byte for byte.
    let big: Vec<u8> = (0..1 << 20)
        .map(|i: u32| b'a' + (i.wrapping_mul(2_654_435_761) >> 27) as u8 % 26)
        .collect();
    let r = mesh.call("POST", "check", "/big", &[], &big);
    assert_eq!(r.status, 200, "{r}\n{}", mesh.logs());
    let echo = r.json();
    assert_eq!(echo["body_len"], big.len());
    assert!(
        echo["body"].as_str() == Some(std::str::from_utf8(&big).unwrap()),
        "the body changed on the way"
    );
}

#[test]
fn native_sidecars_call_each_other() {
    if !require::filter_in_envoy("runs the native module in Envoy") {
        return;
    }
    let mesh = mesh(Runtime::Native, Runtime::Native);
    call_is_sealed_and_attributed(&mesh);

    // A name this sidecar has no sealing cluster for is answered here, and counted
    // under the Wasm filter's names.
    let r = mesh.call("GET", "billing", "/", &[], b"");
    assert_eq!(r.status, 503, "{r}");
    assert_eq!(r.header("x-themis-reject"), Some("not_routed"), "{r}");
    let r = mesh.call("GET", "under_score", "/", &[], b"");
    assert_eq!(r.header("x-themis-reject"), Some("not_a_service"), "{r}");
    let counter = |name: &str| -> u64 {
        let stats = mesh.envoy_a.stats();
        let suffix = format!("themis.outbound.{name}");
        let found: Vec<u64> = stats
            .iter()
            .filter(|(n, _)| n.ends_with(&suffix))
            .map(|(_, v)| *v)
            .collect();
        assert_eq!(found.len(), 1, "one counter *{suffix}: {stats:?}");
        found[0]
    };
    assert_eq!(counter("requests"), 4);
    assert_eq!(counter("rejected.not_routed"), 1);
    assert_eq!(counter("rejected.not_a_service"), 1);
    assert_eq!(counter("rejected.no_instance"), 0);
}

#[test]
fn a_native_caller_reaches_a_wasm_callee() {
    if !require::filter_in_envoy("runs the native module in Envoy") {
        return;
    }
    call_is_sealed_and_attributed(&mesh(Runtime::Native, Runtime::Wasm));
}

#[test]
fn a_wasm_caller_reaches_a_native_callee() {
    if !require::filter_in_envoy("runs the native module in Envoy") {
        return;
    }
    call_is_sealed_and_attributed(&mesh(Runtime::Wasm, Runtime::Native));
}

/// Waits (bounded) until `envoy`'s log says `needle`.
fn wait_log(envoy: &support::envoy::Envoy, needle: &str, what: &str) {
    support::process::wait_until(what, std::time::Duration::from_secs(20), || {
        envoy.log_tail(400).contains(needle).then_some(())
    });
}

/// Plaintext HTTP/1.1 or HTTP/2 sent straight to a native inbound listener: closed,
/// unanswered, and nothing reaches the app.
#[test]
fn plaintext_to_a_native_callee_is_refused() {
    if !require::filter_in_envoy("runs the native module in Envoy") {
        return;
    }
    let mesh = mesh(Runtime::Native, Runtime::Native);
    let mut h2 = themis_core::stream::HTTP2_PREFACE.to_vec();
    h2.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
    let h1 = b"GET /secret HTTP/1.1\r\nhost: check\r\n\r\n".to_vec();
    for (what, bytes) in [("HTTP/1.1", h1), ("HTTP/2", h2)] {
        let answer = support::mitm::replay(mesh.envoy_b.inbound, &bytes, false);
        assert!(answer.closed, "{what}: Envoy B kept the connection open");
        assert!(
            answer.answer.is_empty(),
            "{what}: Envoy B answered {:?}",
            answer.answer
        );
    }
    wait_log(
        &mesh.envoy_b,
        "refused.malformed",
        "Envoy B to log the refusal",
    );
    assert_eq!(mesh.app.count(), 0, "a plaintext request reached the app");
}

/// A caller the native callee's policy does not allow: its connection is closed
/// before any byte reaches the app; the calling app sees a 503.
#[test]
fn a_native_callee_refuses_a_caller_its_policy_does_not_allow() {
    if !require::filter_in_envoy("runs the native module in Envoy") {
        return;
    }
    let mesh = Mesh::start_on(
        Runtime::Native,
        Runtime::Native,
        Some(r#"{"allow":[{"service":"someone-else"}]}"#),
    );
    mesh.register("check", "check", mesh.envoy_b.inbound);
    mesh.envoy_a
        .wait_native_resolves("check", mesh.envoy_b.inbound);
    let r = mesh.call("GET", "check", "/denied", &[], b"");
    assert_eq!(r.status, 503, "{r}\n{}", mesh.logs());
    wait_log(
        &mesh.envoy_b,
        "refused.policy",
        "Envoy B to log the refusal",
    );
    assert_eq!(mesh.app.count(), 0, "a denied request reached the app");
}

/// Two ids registered for `check` at one address: which one the app was promised
/// cannot be told, so the native caller refuses to connect there (`ambiguous`)
/// rather than authenticate whichever answers.
#[test]
fn two_identities_at_one_address_are_refused_by_a_native_caller() {
    if !require::filter_in_envoy("runs the native module in Envoy") {
        return;
    }
    let mesh = mesh(Runtime::Native, Runtime::Native);
    let r = mesh.call("GET", "check", "/before", &[], b"");
    assert_eq!(r.status, 200, "{r}\n{}", mesh.logs());
    support::mesh::create_workload(&mesh.b, "check-twin");
    mesh.b
        .register("check", "check-twin", &mesh.envoy_b.inbound.to_string());
    let at = format!(" at {}", mesh.envoy_b.inbound);
    support::process::wait_until(
        "Envoy A to resolve two ids at one address",
        std::time::Duration::from_secs(40),
        || {
            let log = mesh.envoy_a.log_tail(400);
            let last = log
                .lines()
                .rfind(|l| l.contains("themis native: check resolves to"))?;
            (last.matches(&at).count() == 2).then_some(())
        },
    );
    // The outbound role picks either id; a pick of the twin needs a new connection
    // (one pool per expected id), which the socket refuses. Bounded.
    let refused = (0..20).any(|n| {
        let r = mesh.call("GET", "check", &format!("/after/{n}"), &[], b"");
        assert!(matches!(r.status, 200 | 503), "{r}\n{}", mesh.logs());
        mesh.envoy_a.log_tail(400).contains("refused.ambiguous")
    });
    assert!(
        refused,
        "no connection was refused as ambiguous\n{}",
        mesh.logs()
    );
}

/// A caller revoked while its sealed connection is pooled: the native callee learns
/// the revocation from its agent and ends the established connection at its next
/// byte, either way; no request of the revoked caller reaches the app after that.
#[test]
fn a_revoked_caller_is_cut_off_by_a_native_callee() {
    if !require::filter_in_envoy("runs the native module in Envoy") {
        return;
    }
    let mesh = mesh(Runtime::Native, Runtime::Native);
    for i in 0..3 {
        let r = mesh.call("GET", "check", &format!("/before/{i}"), &[], b"");
        assert_eq!(r.status, 200, "{r}\n{}", mesh.logs());
    }
    let mesh_dir = mesh.dir.path().join("mesh");
    let (code, out, err) = mesh.b.cli(&[
        "revoke",
        &mesh.handler_id,
        "--mesh-dir",
        mesh_dir.to_str().unwrap(),
        "--reason",
        "test: stolen",
        "--publish",
    ]);
    assert_eq!(code, 0, "{out}{err}");
    wait_log(
        &mesh.envoy_b,
        "themis native: 1 revocations",
        "Envoy B's module to hold the revocation",
    );
    let served = mesh.app.count();
    for i in 0..4 {
        let r = mesh.call("GET", "check", &format!("/after/{i}"), &[], b"");
        assert_eq!(r.status, 503, "{r}\n{}", mesh.logs());
    }
    assert_eq!(
        mesh.app.count(),
        served,
        "a revoked caller's request reached the app"
    );
    wait_log(
        &mesh.envoy_b,
        "refused.revoked",
        "Envoy B to log the revoked caller",
    );
}
