//! The sidecar's secure defaults (issue 21), each as the attack it stops, with the
//! real Envoy and real `themis` agents:
//!
//! * a sidecar with no `policy` refuses every caller; admitting any member of the
//!   mesh takes `"allow_any_caller": true`, which is warned about and shown in stats;
//! * a caller's claimed service makes the callee resolve it (DHT lookups) only when
//!   the callee's policy names that service;
//! * a caller's `x_themis_peer_id` (and other underscore spellings) never reaches a
//!   WSGI app, whose server would read it as `HTTP_X_THEMIS_PEER_ID`;
//! * the sidecar refuses a module whose bytes differ from the SHA-256 it pins.

use themis_testkit as support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use support::apps::PyServer;
use support::envoy::{
    inbound_config, outbound_config, render_pinned, AppProtocol, Envoy, Sidecar, ALLOW_HANDLER,
};
use support::mesh::{closed_port, create_workload, tempdir, Mesh, IP_B};
use support::module::{filter_pin, ModuleServer};
use support::pair::Nodes;
use support::process::wait_until_or;
use support::require;

/// How long a counter gets to show what just happened.
const COUNT_LIMIT: Duration = Duration::from_secs(10);

/// Waits (bounded) until `envoy`'s stat `name` reaches `at_least`.
fn wait_stat(envoy: &Envoy, name: &str, at_least: u64, what: &str) {
    let value = || envoy.stats().get(name).copied().unwrap_or(0);
    wait_until_or(
        &format!("{what}: {name} to reach {at_least}"),
        COUNT_LIMIT,
        || (value() >= at_least).then_some(()),
        || format!("it is {}\n{}", value(), envoy.log_tail(40)),
    );
}

/// Issue 21 (4): an authenticated member of the mesh calls a sidecar that has no
/// policy. It must be refused (fail closed), counted and logged; admitting anyone is
/// an explicit, visible choice.
#[test]
fn a_sidecar_without_a_policy_refuses_every_caller() {
    if !require::filter_in_envoy("runs the filter") {
        return;
    }
    let mesh = Mesh::start(None);
    mesh.register("check", "check", mesh.envoy_b.inbound);
    let r = mesh.call("GET", "check", "/no-policy", &[], b"");
    assert_eq!(
        r.status,
        503,
        "a sidecar without a policy let an authenticated caller through: {r}\n{}",
        mesh.logs()
    );
    wait_stat(
        &mesh.envoy_b,
        "wasmcustom.themis.inbound.refused.no_policy",
        1,
        "the call to a sidecar without a policy",
    );
    assert_eq!(mesh.app.count(), 0, "a refused request reached the app");
    let log = mesh.envoy_b.log_tail(2000);
    assert!(
        log.contains("closing the connection (no_policy)")
            && log.contains("no policy: deny by default"),
        "the refusal is logged with its reason:\n{log}"
    );

    // The permissive choice, said out loud: a warning at start and a gauge.
    let open = mesh.start_envoy_b("envoy-b-any", Some(r#"{"allow_any_caller":true}"#));
    open.wait_identity();
    let log = open.log_tail(2000);
    assert!(
        log.contains("policy allow_any_caller: EVERY authenticated member of mesh"),
        "no warning about allow_any_caller:\n{log}"
    );
    assert!(open.stat("wasmcustom.themis.inbound.allow_any_caller") >= 1);
    mesh.register("check-any", "check", open.inbound);
    let r = mesh.call("GET", "check-any", "/any", &[], b"");
    assert_eq!(r.status, 200, "{r}\n{}", open.log_tail(30));
    assert_eq!(mesh.app.count(), 1);
}

/// Resolutions agent B served (from its cache or the DHT): what its sidecars asked.
fn resolutions(mesh: &Mesh) -> u64 {
    let text = support::agent::scrape(mesh.b_metrics).expect("agent B's metrics");
    ["hit", "miss"]
        .iter()
        .map(|r| support::agent::sample(&text, "themis_resolve_cache_total", &[("result", r)]))
        .sum()
}

/// Issue 21 (3): every caller claims a service, and a claim costs the callee a
/// resolution (k+1 DHT lookups). A callee whose policy admits `handler` by its id
/// must not resolve what `handler` claims; one whose policy names the service must.
#[test]
fn a_callers_claim_is_resolved_only_when_the_policy_names_it() {
    if !require::filter_in_envoy("runs the filter") {
        return;
    }
    let mesh = Mesh::start(Some(r#"{"allow":[{"service":"handler"}]}"#));
    mesh.register("check", "check", mesh.envoy_b.inbound);
    let by_id = format!(r#"{{"allow":[{{"id":"{}"}}]}}"#, mesh.handler_id);
    let envoy_id = mesh.start_envoy_b("envoy-b-by-id", Some(&by_id));
    envoy_id.wait_identity();
    mesh.register("check-by-id", "check", envoy_id.inbound);

    let before = resolutions(&mesh);
    let r = mesh.call("GET", "check-by-id", "/by-id", &[], b"");
    assert_eq!(r.status, 200, "{r}\n{}", envoy_id.log_tail(30));
    // No wait: the callee resolves a claim while it holds the caller's bytes (its
    // connection is `Verifying` until agent B answers), so a resolution made for this
    // call was counted by agent B before the call was answered.
    let after = resolutions(&mesh);
    assert_eq!(
        after, before,
        "the callee resolved the caller's claim although its policy admits the caller by id"
    );
    assert!(
        r.json().to_string().contains(&mesh.handler_id),
        "the app learnt the caller's id: {r}"
    );

    // A policy that names the claimed service checks the claim against the
    // endorsement the caller carried in message 1 (wire v3: its sidecar signs with a
    // key the agent delegated): offline, no resolution either. The caller's sidecar
    // started before `handler` was registered: its next delegation (5 s later)
    // brings the endorsement.
    mesh.envoy_a.wait_seal_carries_endorsement();
    let r = mesh.call("GET", "check", "/by-service", &[], b"");
    assert_eq!(r.status, 200, "{r}\n{}", mesh.logs());
    // No wait, as above: a resolution for the call would have been counted by now.
    assert_eq!(
        resolutions(&mesh),
        after,
        "the callee resolved a claim the caller's endorsement proves\n{}",
        mesh.logs()
    );
    mesh.assert_claim_checked_by_the_carried_endorsement();
}

/// Issue 19 (2): a Wasm sidecar signs its handshakes with a key its agent delegated
/// to it (one agent call per worker and renewal, not one per connection), on both
/// sides: agent B signed no handshake message for its callee's sidecar, only its
/// delegations, while the callee answered the caller's Hello.
#[test]
fn wasm_sidecars_sign_their_handshakes_with_a_delegated_key() {
    if !require::filter_in_envoy("runs the filter") {
        return;
    }
    let mesh = Mesh::start(Some(r#"{"allow":[{"service":"handler"}]}"#));
    mesh.register("check", "check", mesh.envoy_b.inbound);
    let signed = |kind: &str| {
        let text = support::agent::scrape(mesh.b_metrics).expect("agent B's metrics");
        support::agent::sample(
            &text,
            "themis_handshake_signatures_total",
            &[("kind", kind)],
        )
    };
    let r = mesh.call("GET", "check", "/delegated", &[], b"");
    assert_eq!(r.status, 200, "{r}\n{}", mesh.logs());
    assert!(
        mesh.envoy_b.stat("wasmcustom.themis.inbound.established") >= 1,
        "{}",
        mesh.logs()
    );
    assert_eq!(signed("hello_reply"), 0, "agent B signed a message 2");
    assert_eq!(signed("hello"), 0, "agent B signed a message 1");
    // Each VM of each role of Envoy B asked (two workers' and the main thread's).
    assert!(signed("delegation") >= 6, "{}", mesh.logs());
    // Nor did either sidecar fall back to its agent for the handshake.
    assert_eq!(mesh.envoy_a.themis_counter("seal.agent_signed"), 0);
    assert_eq!(mesh.envoy_b.themis_counter("inbound.agent_signed"), 0);
    let log = std::fs::read_to_string(mesh.envoy_b.log_path()).unwrap();
    assert!(
        log.contains("signs its handshakes with a delegated key"),
        "{}",
        mesh.logs()
    );
}

/// A sidecar kept keyless (`"delegated_keys": false`, and how every sidecar runs
/// until its first delegation is answered or against an agent without `/delegate`):
/// the agent signs each of its handshake messages, on both sides, and a callee
/// checks its claimed service against a resolution, since it carries no endorsement.
#[test]
fn a_keyless_sidecar_has_its_agent_sign_and_its_claim_resolved() {
    if !require::filter_in_envoy("runs the filter") {
        return;
    }
    let keyless = |role: &'static str| {
        move |yaml: &str| {
            let at = format!(r#""role":"{role}""#);
            assert!(
                yaml.contains(&at),
                "no {role} role in the sidecar's configuration"
            );
            yaml.replace(&at, &format!(r#"{at},"delegated_keys":false"#))
        }
    };
    let nodes = Nodes::start();
    let app = support::app::App::start(IP_B, "RESPMARK-keyless");
    let envoy_a = nodes.envoy_a_edited(None, &[], keyless("seal"));
    let envoy_b =
        nodes.envoy_b_serving_edited("check", app.addr, AppProtocol::Http1, keyless("inbound"));
    let r = support::http::request(
        envoy_a.outbound,
        "GET",
        "/keyless",
        &[("host", "check")],
        b"",
    );
    assert_eq!(
        r.status,
        200,
        "{r}\n{}\n{}",
        envoy_a.log_tail(30),
        envoy_b.log_tail(30)
    );
    assert!(envoy_a.themis_counter("seal.agent_signed") >= 1);
    assert!(envoy_b.themis_counter("inbound.agent_signed") >= 1);
    let log = envoy_b.log_tail(usize::MAX);
    assert!(
        log.contains(r#"(service Some("handler")) connected"#),
        "the callee did not check the claim by a resolution:\n{log}"
    );
    // (Its sealing role, not edited, signs with a delegated key.)
    let inbound_delegated = log
        .lines()
        .any(|l| l.contains("themis-inbound") && l.contains("with a delegated key"));
    assert!(!inbound_delegated, "{log}");
}

/// Issue 21 (6): the caller (`handler`) sends another workload's id in headers that
/// differ from `x-themis-peer-id` only by underscores. The inbound HCM strips
/// `x-themis-*`, which these are not; a WSGI server (wsgiref) maps each onto
/// `HTTP_X_THEMIS_PEER_ID`. The app must only ever see the caller's true id.
#[test]
fn underscore_spellings_of_the_peer_headers_never_reach_a_wsgi_app() {
    if !require::filter_in_envoy("runs the filter") {
        return;
    }
    let nodes = Nodes::start();
    let victim = create_workload(&nodes.b, "victim");
    let wsgi = PyServer::start(nodes.path(), "wsgi-app", "wsgi_echo.py", IP_B, &[]);
    let envoy_a = nodes.envoy_a(None, &[]);
    let envoy_b = nodes.envoy_b_serving("wsgi", wsgi.addr, AppProtocol::Http1);
    let forged_ids = [
        "x_themis_peer_id",
        "X_THEMIS_PEER_ID",
        "x_themis-peer-id",
        "x-themis_peer_id",
        "x-themis-peer_id",
        "X-Themis_Peer-Id",
    ];
    let call = |headers: &[(&str, &str)]| {
        let mut all = vec![("host", "wsgi")];
        all.extend_from_slice(headers);
        let r = support::http::request(envoy_a.outbound, "GET", "/env", &all, b"");
        assert_eq!(
            r.status,
            200,
            "{headers:?}: {r}\n--- envoy-a:\n{}\n--- envoy-b:\n{}\n--- app:\n{}",
            envoy_a.log_tail(20),
            envoy_b.log_tail(20),
            wsgi.log()
        );
        r.json()
    };
    let check = |environ: &serde_json::Value, sent: &str| {
        assert_eq!(
            environ["HTTP_X_THEMIS_PEER_ID"].as_str(),
            Some(nodes.handler_id.as_str()),
            "sent {sent}: the app's environ names someone else as the caller: {environ}"
        );
        assert_eq!(
            environ["HTTP_X_THEMIS_PEER_SERVICE"].as_str(),
            Some("handler"),
            "sent {sent}: {environ}"
        );
    };
    // The control: what the app sees for an honest call.
    check(&call(&[]), "nothing forged");
    for name in forged_ids {
        check(&call(&[(name, &victim)]), name);
    }
    check(
        &call(&[("x_themis_peer_service", "admin")]),
        "x_themis_peer_service",
    );
    let all: Vec<(&str, &str)> = forged_ids.iter().map(|n| (*n, victim.as_str())).collect();
    check(&call(&all), "every spelling at once");
    let dropped: u64 = envoy_b
        .stats()
        .iter()
        .filter(|(n, _)| n.contains("dropped_headers_with_underscores"))
        .map(|(_, v)| v)
        .sum();
    assert!(
        dropped >= forged_ids.len() as u64,
        "Envoy B counted {dropped} dropped underscore headers:\n{}",
        envoy_b.stats_matching("underscore")
    );
}

/// The real filter with a custom section appended: a valid module that loads and
/// runs, whose bytes are not the pinned ones.
fn tampered_module() -> Vec<u8> {
    let mut bytes = std::fs::read(support::build::filter_wasm()).unwrap();
    // Custom section (id 0) of 7 bytes: a 6-byte name and nothing else.
    bytes.extend_from_slice(&[0, 7, 6]);
    bytes.extend_from_slice(b"tamper");
    bytes
}

/// Issue 21 (7): the module a sidecar loads is swapped (the file on the node, or what
/// its server serves). The sidecar pins the real module's SHA-256: it must refuse
/// the other bytes and fail closed, and load the real ones.
#[test]
fn a_module_whose_bytes_differ_from_the_pin_is_refused() {
    if !require::filter_in_envoy("runs the filter") {
        return;
    }
    let dir = tempdir();
    let root = format!("{}:{}", support::agent::MESH, "11".repeat(32));
    let pinned = filter_pin().sha256.clone();
    let agent_socket = dir.path().join("no-agent.sock");
    let (outbound, inbound) = (
        outbound_config(&root, "check", "check"),
        inbound_config(&root, "check", "check", Some(ALLOW_HANDLER)),
    );
    let sidecar = Sidecar {
        app_protocol: AppProtocol::Http1,
        ip: IP_B,
        agent_socket: &agent_socket,
        app: closed_port(IP_B),
        outbound_config: &outbound,
        inbound_config: &inbound,
    };

    // The swapped module, served where the sidecar fetches it; the pin is the real
    // module's hash.
    let tampered = tampered_module();
    assert_ne!(support::module::sha256_hex(&tampered), pinned);
    let swapped = ModuleServer::start(tampered);
    let yaml = render_pinned(&sidecar, &swapped.pin(&pinned));
    let mut refused = Envoy::start_yaml(dir.path(), "envoy-swapped", &yaml);
    wait_stat(
        &refused,
        "wasm.remote_load_fetch_failures",
        1,
        "fetching a module whose hash is not the pin",
    );
    let stats = refused.stats();
    assert_eq!(
        stats.get("wasm.remote_load_fetch_successes").copied(),
        Some(0),
        "Envoy accepted bytes whose hash is not the pin"
    );
    let ran: Vec<&String> = stats
        .keys()
        .filter(|n| n.starts_with("wasmcustom.themis"))
        .collect();
    assert!(ran.is_empty(), "the swapped module ran: {ran:?}");
    // Fail closed: a connection to the inbound listener is closed, no byte through.
    let mut peer = TcpStream::connect(refused.inbound).unwrap();
    peer.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let _ = peer.write_all(&[0u8; 64]);
    let mut answer = Vec::new();
    let _ = peer.read_to_end(&mut answer);
    assert!(
        answer.is_empty(),
        "the inbound listener answered {answer:?}"
    );
    let log = refused.log_tail(400);
    assert!(
        log.contains("Plugin configured to fail closed failed to load"),
        "{log}"
    );
    assert!(
        !log.contains("filter for workload check in mesh"),
        "the swapped module was configured:\n{log}"
    );
    refused.stop();

    // The positive control: the real bytes, same pin, load and run.
    let real = ModuleServer::start(std::fs::read(support::build::filter_wasm()).unwrap());
    let yaml = render_pinned(&sidecar, &real.pin(&pinned));
    let loaded = Envoy::start_yaml(dir.path(), "envoy-pinned", &yaml);
    wait_stat(
        &loaded,
        "wasm.remote_load_fetch_successes",
        1,
        "fetching the pinned module",
    );
    wait_until_or(
        "the pinned module to configure",
        COUNT_LIMIT,
        || {
            loaded
                .log_tail(400)
                .contains("themis inbound filter for workload check in mesh")
                .then_some(())
        },
        || loaded.log_tail(40),
    );
}
