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
    mesh_with(a, b, ALLOW_HANDLER)
}

/// [`mesh`] with B's policy (and whatever else the test config's policy slot holds).
fn mesh_with(a: Runtime, b: Runtime, policy: &str) -> Mesh {
    let mesh = Mesh::start_on(a, b, Some(policy));
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

/// The native module's counter `themis.<name>` on `envoy` (Envoy prefixes a dynamic
/// module's counters; the name after it is the Wasm filter's).
fn counter(envoy: &support::envoy::Envoy, name: &str) -> u64 {
    let stats = envoy.stats();
    let suffix = format!("custom.themis.{name}");
    let found: Vec<u64> = stats
        .iter()
        .filter(|(n, _)| n.ends_with(&suffix))
        .map(|(_, v)| *v)
        .collect();
    assert_eq!(found.len(), 1, "one counter *{suffix}: {stats:?}");
    found[0]
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
    // Who answered: what the connection proved, not what the callee's app claims
    // (the echo app's responses name a forged id and service).
    assert_eq!(r.header(PEER_ID), Some(mesh.check_id.as_str()), "{r}");
    assert_eq!(r.header(PEER_SERVICE), Some("check"), "{r}");

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
    let a = &mesh.envoy_a;
    assert_eq!(counter(a, "outbound.requests"), 4);
    assert_eq!(counter(a, "outbound.rejected.not_routed"), 1);
    assert_eq!(counter(a, "outbound.rejected.not_a_service"), 1);
    assert_eq!(counter(a, "outbound.rejected.no_instance"), 0);
    // The sockets count too, under the Wasm filter's role names.
    assert!(counter(a, "seal.established") >= 1);
    assert_eq!(counter(a, "seal.refused.ambiguous"), 0);
    let b = &mesh.envoy_b;
    assert!(counter(b, "inbound.allowed") >= 1);
    assert_eq!(counter(b, "inbound.refused.policy"), 0);
    // The pooled sealed connections are open, and counted so on both sides.
    assert!((1..=4).contains(&counter(a, "seal.active")));
    assert_eq!(counter(b, "inbound.active"), counter(a, "seal.active"));
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
    assert!(counter(&mesh.envoy_b, "inbound.refused.malformed") >= 2);
    assert_eq!(mesh.app.count(), 0, "a plaintext request reached the app");
}

/// A caller that connects and never completes the handshake (silent, or stalled after
/// part of message 1) does not hold its connection: the listener's handshake deadline
/// (10 s in the template) closes it, unanswered. The bound asserted is generous.
#[test]
fn a_caller_that_stalls_in_the_handshake_is_closed_by_a_native_callee() {
    use std::io::{Read, Write};
    if !require::filter_in_envoy("runs the native module in Envoy") {
        return;
    }
    let mesh = mesh(Runtime::Native, Runtime::Native);
    // Nothing at all; the start of a message 1 (version, kind Hello), never finished.
    let hello_start = [
        themis_core::wire::PROTOCOL_VERSION,
        themis_core::wire::Kind::Hello as u8,
    ];
    let stalled: [&[u8]; 2] = [b"", &hello_start];
    let waiting: Vec<(std::net::TcpStream, &[u8])> = stalled
        .iter()
        .map(|bytes| {
            let mut stream = std::net::TcpStream::connect(mesh.envoy_b.inbound).unwrap();
            stream.write_all(bytes).unwrap();
            stream
                .set_read_timeout(Some(std::time::Duration::from_secs(60)))
                .unwrap();
            (stream, *bytes)
        })
        .collect();
    for (mut stream, bytes) in waiting {
        let mut answer = Vec::new();
        let closed = stream.read_to_end(&mut answer);
        assert!(
            closed.is_ok(),
            "a caller that sent {bytes:?} still holds its connection after 60 s: {closed:?}"
        );
        assert!(answer.is_empty(), "it was answered {answer:?}");
    }
    // The callee still serves the mesh.
    let r = mesh.call("GET", "check", "/after", &[], b"");
    assert_eq!(r.status, 200, "{r}\n{}", mesh.logs());
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
    assert!(counter(&mesh.envoy_b, "inbound.refused.policy") >= 1);
    assert_eq!(counter(&mesh.envoy_b, "inbound.allowed"), 0);
    assert_eq!(mesh.app.count(), 0, "a denied request reached the app");
}

/// Fresh, validly signed Hellos (each from a new key pair) spread over several
/// sources, each far under its own `hellos_per_source` bucket, find the native
/// callee's handshake budget spent and are closed before any key work
/// (`refused.busy`), while the caller's pooled connection goes on with no new
/// handshake. The budget is tiny: 1 handshake a second, 10 at once, 90 % reserved
/// for known-good sources.
#[test]
fn a_flood_of_fresh_hellos_is_refused_busy_by_a_native_callee() {
    if !require::filter_in_envoy("runs the native module in Envoy") {
        return;
    }
    // (The policy slot of the test config: the policy, then the budget.)
    let policy = format!(
        r#"{ALLOW_HANDLER},"handshake_budget":{{"per_second":1,"burst":10}},"known_good_share_percent":90"#
    );
    let mesh = mesh_with(Runtime::Native, Runtime::Native, &policy);
    // One client connection: one worker of each Envoy, one pooled sealed connection
    // (the budget and the known-good sources are per worker).
    let mut caller = support::http::KeepAlive::connect(mesh.envoy_a.outbound);
    let r = caller.post("check", "/before", b"before").unwrap();
    assert_eq!(r.status, 200, "{r}\n{}", mesh.logs());
    let b = &mesh.envoy_b;
    let established = counter(b, "inbound.established");

    const SOURCES: u64 = 8;
    const FLOOD: u64 = SOURCES * 5;
    support::intruder::flood_fresh_hellos(&mesh.check_id, b.inbound, SOURCES, FLOOD);
    // At most the open share's burst (1) and one more a second were answered.
    support::process::wait_until(
        "the flood to be refused busy",
        std::time::Duration::from_secs(30),
        || (counter(b, "inbound.refused.busy") >= FLOOD / 2).then_some(()),
    );
    assert_eq!(counter(b, "inbound.refused.rate_limited"), 0);

    // The pooled caller goes on: no handshake, no refusal.
    for n in 0..5 {
        let r = caller
            .post("check", &format!("/after/{n}"), b"after")
            .unwrap_or_else(|e| panic!("call {n}: {e}\n{}", mesh.logs()));
        assert_eq!(r.status, 200, "call {n}: {r}\n{}", mesh.logs());
    }
    assert_eq!(
        counter(b, "inbound.established"),
        established,
        "the calls needed a new handshake"
    );
    assert_eq!(
        mesh.app.count(),
        6,
        "only the caller's calls reached the app"
    );
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
    assert!(counter(&mesh.envoy_a, "seal.refused.ambiguous") >= 1);
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
    mesh.b.revoke(&mesh.handler_id, &mesh_dir);
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
