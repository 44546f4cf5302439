//! End-to-end tests of the filter in the real Envoy (`.venv/bin/envoy`, installed by
//! `scripts/setup.sh`), configured by rendering `deploy/envoy/sidecar.yaml`, with two
//! real `themis` agents in a DHT:
//!
//! * node A (127.0.0.31): agent A, Envoy A; workload `handler`;
//! * node B (127.0.0.32): agent B, Envoy B and an echo app; workload `check`.
//!
//! `handler`'s app calls `http://check/...` on Envoy A's outbound listener; Envoy A
//! resolves `check` through agent A, runs the handshake with the instance's id and
//! sends the request sealed to Envoy B's inbound listener, which opens it and calls
//! the app. The filter (release, wasm32-wasip1) and the `themis` binary are built by
//! the tests themselves, into `CARGO_TARGET_DIR`.

mod support;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use support::app::seen_header;
use support::envoy::{inbound_config, outbound_config, Envoy, Sidecar};
use support::http;
use support::mesh::{closed_port, random_hex, tempdir, Mesh, IP_A, IP_B, IP_DEAD, IP_MITM};
use support::mitm::{Mitm, Mode};
use support::process::{on_path, wait_until, Process};

use support::agent_harness::MESH;
use themis_envoy::protocol::{header, path};

fn stat_inbound(envoy: &Envoy, name: &str) -> u64 {
    envoy.stat(&format!("wasmcustom.themis.inbound.{name}"))
}

fn stat_outbound(envoy: &Envoy, name: &str) -> u64 {
    envoy.stat(&format!("wasmcustom.themis.outbound.{name}"))
}

/// A body that is not a repetition of a short pattern (so a reordering shows).
fn varied_body(len: usize) -> Vec<u8> {
    let mut x: u32 = 0x1234_5678;
    (0..len)
        .map(|_| {
            x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            b'a' + (x >> 24) as u8 % 26
        })
        .collect()
}

#[test]
fn handler_calls_check_by_name() {
    let mesh = Mesh::standard();
    let body = b"is 7 prime?";
    let r = mesh.call(
        "POST",
        "check",
        "/check?n=7",
        &[
            ("x-custom", "custom-value-1"),
            ("x-themis-peer-id", "forged"),
            ("content-type", "text/plain"),
        ],
        body,
    );
    assert_eq!(r.status, 200, "{r}\n{}", mesh.logs());
    let echo = r.json();
    assert_eq!(echo["method"], "POST", "{echo}");
    assert_eq!(echo["path"], "/check?n=7", "{echo}");
    assert_eq!(echo["body"], "is 7 prime?", "{echo}");
    assert_eq!(seen_header(&echo, "x-custom"), ["custom-value-1"], "{echo}");
    assert_eq!(seen_header(&echo, "content-type"), ["text/plain"], "{echo}");
    // The app learns who called, from the filter only: the forged value is gone.
    assert_eq!(
        seen_header(&echo, header::PEER_ID),
        [mesh.handler_id.as_str()],
        "{echo}"
    );
    assert_eq!(
        seen_header(&echo, header::PEER_SERVICE),
        ["handler"],
        "{echo}"
    );
    assert!(
        !echo["headers"].to_string().contains("forged"),
        "the forged peer id reached the app: {echo}"
    );
    // The caller learns who answered.
    assert_eq!(
        r.header(header::PEER_ID),
        Some(mesh.check_id.as_str()),
        "{r}"
    );
    assert_eq!(r.header(header::PEER_SERVICE), Some("check"), "{r}");
    assert_eq!(
        r.header("x-app"),
        Some("echo"),
        "the app's headers come back: {r}"
    );
    assert_eq!(mesh.app.count(), 1);

    // 64 KiB each way.
    let big = varied_body(64 * 1024);
    let r = mesh.call("POST", "check", "/big", &[], &big);
    assert_eq!(r.status, 200, "{r}\n{}", mesh.logs());
    let echo = r.json();
    assert_eq!(echo["body_len"], big.len(), "{}", r.text().len());
    assert!(
        echo["body"].as_str() == Some(std::str::from_utf8(&big).unwrap()),
        "the 64 KiB body changed on the way"
    );
    assert_eq!(mesh.app.count(), 2);
    assert!(stat_outbound(&mesh.envoy_a, "sealed") >= 2);
    assert!(stat_inbound(&mesh.envoy_b, "opened") >= 2);
}

/// tcpdump, installed by scripts/setup.sh.
fn tcpdump_binary() -> PathBuf {
    on_path("tcpdump").expect("tcpdump is not installed: run scripts/setup.sh")
}

fn count(haystack: &[u8], needle: &[u8]) -> usize {
    haystack
        .windows(needle.len())
        .filter(|w| *w == needle)
        .count()
}

#[test]
fn capture_holds_no_plaintext() {
    let tcpdump = tcpdump_binary();
    let mesh = Mesh::standard();
    let dir = mesh.dir.path();
    let capture = dir.join("inbound.pcap");
    let port = mesh.envoy_b.inbound.port();
    let mut command = Command::new(tcpdump);
    command
        .args(["-i", "lo", "-U", "--immediate-mode", "-n", "-w"])
        .arg(&capture)
        .arg(format!("tcp port {port}"));
    let mut dump = Process::spawn("tcpdump", command, &dir.join("tcpdump.log"));
    wait_until("tcpdump to listen", Duration::from_secs(15), || {
        if let Some(status) = dump.exited() {
            panic!("tcpdump exited ({status}): {}", dump.log());
        }
        dump.log().contains("listening on").then_some(())
    });

    let path_marker = format!("PATHMARK{}", random_hex(8));
    let header_marker = format!("HDRMARK{}", random_hex(8));
    let body_marker = format!("BODYMARK{}", random_hex(8));
    let rounds = 4;
    for i in 0..rounds {
        let path = format!("/{path_marker}/{i}");
        let body = format!("{{\"secret\":\"{body_marker}\",\"round\":{i}}}");
        let r = mesh.call(
            "POST",
            "check",
            &path,
            &[("x-marker", header_marker.as_str())],
            body.as_bytes(),
        );
        assert_eq!(r.status, 200, "{r}\n{}", mesh.logs());
        let echo = r.json();
        // The markers did travel, in both directions.
        assert_eq!(echo["path"], path.as_str());
        assert_eq!(seen_header(&echo, "x-marker"), [header_marker.as_str()]);
        assert_eq!(echo["body"], body.as_str());
        assert_eq!(echo["marker"], mesh.app_marker.as_str());
    }
    // tcpdump writes each packet as it comes (-U): wait for every exchange's head.
    let request_path = path::REQUEST.as_bytes();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let seen = count(&std::fs::read(&capture).unwrap_or_default(), request_path);
        if seen >= rounds {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the capture holds {seen} of the {rounds} request exchanges after 15 s; tcpdump:\n{}",
            dump.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let status = dump.stop().expect("tcpdump ran");
    assert!(
        status.success() || status.code().is_none(),
        "tcpdump: {status}: {}",
        dump.log()
    );
    let bytes = std::fs::read(&capture).unwrap();
    assert!(!bytes.is_empty(), "the capture is empty");
    assert!(
        count(&bytes, request_path) >= rounds,
        "the capture lacks the request exchanges"
    );
    assert!(
        count(&bytes, path::HELLO.as_bytes()) >= 1,
        "the capture lacks the handshake"
    );
    for marker in [&path_marker, &header_marker, &body_marker, &mesh.app_marker] {
        assert_eq!(
            count(&bytes, marker.as_bytes()),
            0,
            "{marker} is readable on the wire between the Envoys"
        );
    }
}

#[test]
fn mitm_tampering_is_rejected() {
    let mesh = Mesh::start(None);
    let mitm = Mitm::start(IP_MITM, mesh.envoy_b.inbound);
    mesh.register("check", "check", mitm.addr);
    let call = |n: u32| {
        mesh.call(
            "POST",
            "check",
            &format!("/mitm/{n}"),
            &[],
            b"through the proxy",
        )
    };

    // Pass-through: the proxy is transparent.
    for n in 0..2 {
        let r = call(n);
        assert_eq!(r.status, 200, "{r}\n{}", mesh.logs());
    }
    assert_eq!(mesh.app.count(), 2);
    let recorded = mitm.recorded();
    assert!(
        recorded.len() >= 2,
        "the proxy saw {} request exchanges",
        recorded.len()
    );

    // Replay: the last exchange again, on a new connection straight to Envoy B.
    let replay_before = stat_inbound(&mesh.envoy_b, "rejected.replay");
    let replayed = recorded.last().unwrap();
    let r = http::exchange(mesh.envoy_b.inbound, replayed).expect("Envoy B answers the replay");
    assert_eq!(r.status, 400, "{r}\n{}", mesh.logs());
    assert_eq!(r.header(header::REJECT), Some("replay"), "{r}");
    assert_eq!(mesh.app.count(), 2, "the replayed request reached the app");
    assert!(stat_inbound(&mesh.envoy_b, "rejected.replay") > replay_before);

    // Tampering: every change of a request record is refused before the app.
    for (n, mode) in [Mode::Flip, Mode::Truncate, Mode::Reorder]
        .into_iter()
        .enumerate()
    {
        mitm.set_mode(mode);
        let (tampered_before, changed_before) = (
            stat_inbound(&mesh.envoy_b, "rejected.tampered"),
            mitm.tampered(),
        );
        let r = call(10 + n as u32);
        assert!(
            mitm.tampered() > changed_before,
            "{mode:?}: the proxy changed nothing"
        );
        assert!(
            !(200..300).contains(&r.status),
            "{mode:?}: a tampered request succeeded: {r}"
        );
        assert_eq!(
            mesh.app.count(),
            2,
            "{mode:?}: a tampered request reached the app"
        );
        assert!(
            stat_inbound(&mesh.envoy_b, "rejected.tampered") > tampered_before,
            "{mode:?}: Envoy B did not count it as tampered\n{}",
            mesh.logs()
        );
    }

    // And the mesh recovers once the proxy behaves.
    mitm.set_mode(Mode::Pass);
    let r = call(99);
    assert_eq!(r.status, 200, "{r}\n{}", mesh.logs());
    assert_eq!(mesh.app.count(), 3);
}

#[test]
fn direct_plaintext_request_is_rejected() {
    let mesh = Mesh::standard();
    let inbound = mesh.envoy_b.inbound;
    let get = http::request(inbound, "GET", "/check", &[("host", "check")], b"");
    let post = http::request(inbound, "POST", "/check", &[("host", "check")], b"hello");
    // Even the Themis paths need the right method.
    let get_themis = http::request(inbound, "GET", path::REQUEST, &[("host", "themis")], b"");
    for r in [&get, &post, &get_themis] {
        assert_eq!(r.status, 401, "{r}");
        assert_eq!(r.header(header::REJECT), Some("plaintext"), "{r}");
    }
    assert_eq!(mesh.app.count(), 0, "a plaintext request reached the app");
    assert!(stat_inbound(&mesh.envoy_b, "rejected.plaintext") >= 3);
}

#[test]
fn policy_denies_with_403() {
    let mesh = Mesh::start(Some(r#"{"allow":[{"service":"someone-else"}]}"#));
    mesh.register("check", "check", mesh.envoy_b.inbound);
    let r = mesh.call("GET", "check", "/denied", &[], b"");
    assert_eq!(r.status, 403, "{r}\n{}", mesh.logs());
    let text = r.text();
    assert!(
        text.contains("not allowed") && text.contains(&mesh.handler_id),
        "the body does not say why: {r}"
    );
    assert_eq!(mesh.app.count(), 0, "a denied request reached the app");
    assert!(stat_inbound(&mesh.envoy_b, "rejected.policy") >= 1);

    // A second sidecar of the same workload that allows `handler`, registered as
    // another service.
    let open = mesh.start_envoy_b("envoy-b-open", Some(r#"{"allow":[{"service":"handler"}]}"#));
    mesh.register("check-open", "check", open.inbound);
    let r = mesh.call("GET", "check-open", "/allowed", &[], b"");
    assert_eq!(
        r.status,
        200,
        "{r}\n{}\n--- envoy-b-open:\n{}",
        mesh.logs(),
        open.log_tail(30)
    );
    let echo = r.json();
    assert_eq!(
        seen_header(&echo, header::PEER_SERVICE),
        ["handler"],
        "{echo}"
    );
    assert_eq!(mesh.app.count(), 1);
    assert_eq!(stat_inbound(&open, "rejected.policy"), 0);
}

#[test]
fn bad_configuration_is_rejected() {
    let dir = tempdir();
    let socket = dir.path().join("no-agent.sock");
    let app: SocketAddr = closed_port(IP_B);
    let limit = Duration::from_secs(60);
    let root = format!("{}:{}", MESH, "11".repeat(32));
    let good_inbound = inbound_config(&root, "check", "check", None);
    let cases = [
        (
            "unknown-key",
            format!(r#"{{"role":"outbound","mesh_root":"{root}","workload":"handler","private_key":"x"}}"#),
            good_inbound.clone(),
            "themis filter configuration: unknown field `private_key`",
        ),
        (
            "no-app-cluster",
            outbound_config(&root, "check", "check"),
            format!(r#"{{"role":"inbound","mesh_root":"{root}","workload":"check"}}"#),
            "themis filter configuration: app_cluster",
        ),
    ];
    for (name, outbound, inbound, expected) in cases {
        let (status, log) = Envoy::start_refused(
            dir.path(),
            name,
            &Sidecar {
                ip: IP_A,
                agent_socket: &socket,
                app,
                outbound_config: &outbound,
                inbound_config: &inbound,
            },
            limit,
        );
        let status = status.unwrap_or_else(|| {
            panic!("{name}: Envoy still ran {limit:?} after starting with a bad filter configuration:\n{log}")
        });
        assert!(
            !status.success(),
            "{name}: Envoy exited successfully:\n{log}"
        );
        assert!(
            log.contains(expected),
            "{name}: Envoy's log does not say {expected:?}:\n{log}"
        );
    }
}

#[test]
fn unknown_service_and_dead_instance() {
    let mesh = Mesh::start(None);
    // A second instance of `check` that never answers, registered before anything
    // resolves `check` (the filter caches resolutions).
    let dead = closed_port(IP_DEAD);
    mesh.b.register("check", "check-dead", &dead.to_string());
    mesh.register("check", "check", mesh.envoy_b.inbound);
    mesh.wait_resolves(
        &mesh.a,
        "check",
        &[&dead.to_string(), &mesh.envoy_b.inbound.to_string()],
    );

    let r = mesh.call("GET", "nosuch", "/", &[], b"");
    assert_eq!(r.status, 503, "{r}\n{}", mesh.logs());
    assert!(
        matches!(
            r.header(header::ERROR),
            Some("no_instance" | "resolve_failed")
        ),
        "no {} header naming the failure: {r}",
        header::ERROR
    );

    let calls = 20;
    for n in 0..calls {
        let r = mesh.call("GET", "check", &format!("/live/{n}"), &[], b"");
        assert_eq!(r.status, 200, "request {n}: {r}\n{}", mesh.logs());
        assert_eq!(
            r.header(header::PEER_ID),
            Some(mesh.check_id.as_str()),
            "{r}"
        );
    }
    assert_eq!(mesh.app.count(), calls);
    // The dead instance was tried first at least once (the order is random: all 20
    // starting with the live one has probability 2^-20), and skipped.
    assert!(
        stat_outbound(&mesh.envoy_a, "rejected.handshake_failed") >= 1,
        "the dead instance was never tried\n{}",
        mesh.logs()
    );
}
