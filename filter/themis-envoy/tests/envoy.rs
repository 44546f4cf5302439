//! End-to-end tests of the filter in the real Envoy (`.venv/bin/envoy`, installed by
//! `scripts/setup.sh`), configured by rendering `deploy/envoy/sidecar.yaml`, with two
//! real `themis` agents in a DHT:
//!
//! * node A (127.0.0.31): agent A, Envoy A; workload `handler`;
//! * node B (127.0.0.32): agent B, Envoy B and an echo app; workload `check`.
//!
//! `handler`'s app calls `http://check/...` on Envoy A's outbound listener; Envoy A
//! resolves `check` through agent A and its router connects through the sealing
//! listener, which runs the key agreement with the instance's id and seals the byte
//! stream (HTTP/2) to Envoy B's inbound listener, which opens it, decides the policy
//! once per connection and hands the plaintext to its connection manager and the app.
//! A connection B refuses is closed: the caller sees a 503 from Envoy A. Each case
//! runs twice: `wasm::<case>` as above, and `native::<case>` with both sidecars on the
//! native module (`deploy/envoy/sidecar-native.yaml`: no sealing listener; the
//! module's transport socket seals on a cluster per called service). The filter
//! (release, wasm32-wasip1) and the `themis` binary are built by the tests
//! themselves, into `CARGO_TARGET_DIR`.

use themis_testkit as support;

use std::io::Write;
use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use support::app::seen_header;
use support::envoy::{
    inbound_config, outbound_config, AppProtocol, Envoy, Sidecar, ALLOW_HANDLER, ALLOW_NOBODY,
};
use support::http::{self, KeepAlive};
use support::mesh::{closed_port, random_hex, tempdir, Mesh, Runtime, IP_A, IP_B, IP_EVIL};
use support::mitm::{self, Mitm, Mode};
use support::process::{installed, wait_until, wait_until_or, Process};
use support::require;

use support::agent::MESH;

/// The headers the sidecars set: the inbound one from the connection's filter state,
/// the outbound one from its pick; and the outbound refusal's reason.
mod header {
    pub const PEER_ID: &str = "x-themis-peer-id";
    pub const PEER_SERVICE: &str = "x-themis-peer-service";
    pub const REJECT: &str = "x-themis-reject";
}

/// How long a counter gets to show what just happened.
const COUNT_LIMIT: Duration = Duration::from_secs(10);

/// A counter of the inbound role, 0 until it is first counted (counters are defined
/// on first use).
/// (Both runtimes count under the same names.)
fn stat_inbound(envoy: &Envoy, name: &str) -> u64 {
    envoy.themis_counter(&format!("inbound.{name}"))
}

fn stat_outbound(envoy: &Envoy, name: &str) -> u64 {
    envoy.themis_counter(&format!("outbound.{name}"))
}

fn stat_seal(envoy: &Envoy, name: &str) -> u64 {
    envoy.themis_counter(&format!("seal.{name}"))
}

/// The inbound refusals counted so far, by reason.
fn refusals(envoy: &Envoy) -> Vec<(String, u64)> {
    envoy.themis_counters("inbound.refused.")
}

/// Waits until Envoy B's counter `refused.<reason>` exceeds `before`.
fn wait_refused(mesh: &Mesh, reason: &str, before: u64, what: &str) {
    let name = format!("refused.{reason}");
    wait_until_or(
        &format!("{what}: Envoy B to count {name}"),
        COUNT_LIMIT,
        || (stat_inbound(&mesh.envoy_b, &name) > before).then_some(()),
        || {
            format!(
                "its refusals: {:?}\n{}",
                refusals(&mesh.envoy_b),
                mesh.logs()
            )
        },
    );
}

/// The app learnt who called from the inbound filter: `handler`'s id and service.
fn assert_caller_is_handler(mesh: &Mesh, echo: &serde_json::Value) {
    assert_eq!(
        seen_header(echo, header::PEER_ID),
        [mesh.handler_id.as_str()],
        "{echo}"
    );
    assert_eq!(
        seen_header(echo, header::PEER_SERVICE),
        ["handler"],
        "{echo}"
    );
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

fn handler_calls_check_by_name(runtime: Runtime) {
    if !require::filter_in_envoy("runs the filter") {
        return;
    }
    let mesh = Mesh::standard_on(runtime);
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
    assert_caller_is_handler(&mesh, &echo);
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
    // Each call came on its own client connection, which Envoy may run on either of
    // its two workers, each with its own pool: at most one key agreement per worker
    // (many calls on one client connection: `keep_alive_calls_share_one_handshake`).
    // (On the TLS binding the key agreement is Envoy's TLS handshake, which the
    // validator counts as established.)
    let handshakes = match runtime {
        Runtime::Tls => stat_seal(&mesh.envoy_a, "established"),
        _ => stat_seal(&mesh.envoy_a, "handshakes"),
    };
    assert!((1..=2).contains(&handshakes), "{handshakes} key agreements");
    assert_eq!(stat_inbound(&mesh.envoy_b, "allowed"), handshakes);
}

/// Many requests that find no resolution at once wait on one agent call per worker.
/// (One call each, 96 at once, is more connections than the agent takes from one
/// caller: the calls it closed reached the app as 503s; the benchmark's 64
/// connections hit it whenever a resolution expired.)
fn concurrent_first_calls_share_one_resolution(runtime: Runtime) {
    if !require::filter_in_envoy("runs the filter") {
        return;
    }
    let mesh = Mesh::standard_on(runtime);
    if runtime == Runtime::Native {
        mesh.envoy_a
            .wait_native_resolves("check", mesh.envoy_b.inbound);
    }
    // The Wasm runtime's agent calls go through this cluster (the native runtime
    // resolves on a thread of its own, never per request).
    let wasm = runtime == Runtime::Wasm;
    let agent_calls = || match wasm {
        true => mesh.envoy_a.stat("cluster.themis_agent.upstream_rq_total"),
        false => 0,
    };
    let calls_before = agent_calls();
    let start = std::sync::Barrier::new(96);
    let statuses: Vec<(u16, String)> = std::thread::scope(|scope| {
        let calls: Vec<_> = (0..96)
            .map(|n| {
                let (mesh, start) = (&mesh, &start);
                scope.spawn(move || {
                    start.wait();
                    let r = mesh.call("GET", "check", &format!("/burst/{n}"), &[], b"");
                    (
                        r.status,
                        r.header("x-themis-reject").unwrap_or("").to_owned(),
                    )
                })
            })
            .collect();
        calls.into_iter().map(|c| c.join().unwrap()).collect()
    });
    let calls = agent_calls() - calls_before;
    eprintln!("{runtime:?}: 96 concurrent first calls made {calls} agent call(s)");
    // One resolution per worker (two), and room for the revocations' long polls
    // answered meanwhile; one call per request made 15 and 46 in two runs.
    assert!(calls <= 8, "{calls} agent calls for 96 requests");
    let failed: Vec<&(u16, String)> = statuses.iter().filter(|(s, _)| *s != 200).collect();
    assert!(
        failed.is_empty(),
        "{} of 96 concurrent first calls failed: {:?}\n{}",
        failed.len(),
        &failed[..failed.len().min(5)],
        mesh.logs()
    );
}

/// Key agreements a worker makes to a callee for an HTTP/1.1 app's calls: one, or on
/// native sidecars two (the first call goes over HTTP/2 and learns that the callee
/// takes HTTP/1.1 as is; the calls after it go over an HTTP/1.1 connection).
fn http1_agreements(runtime: Runtime) -> u64 {
    match runtime {
        Runtime::Native => 2,
        // One HTTP/2 connection over TLS.
        Runtime::Wasm | Runtime::Tls | Runtime::TlsAndChannel => 1,
    }
}

/// HTTP/1.1 keep-alive: the calls of one client connection run on one worker and
/// share its pooled sealed connection(s), so the key agreements do not grow with the
/// calls.
fn keep_alive_calls_share_one_handshake(runtime: Runtime) {
    if !require::filter_in_envoy("runs the filter") {
        return;
    }
    let mesh = Mesh::standard_on(runtime);
    let mut client = KeepAlive::connect(mesh.envoy_a.outbound);
    let calls = 50;
    for n in 0..calls {
        let body = format!("call {n}");
        let r = client
            .post("check", &format!("/keep/{n}"), body.as_bytes())
            .unwrap_or_else(|e| panic!("call {n}: {e}\n{}", mesh.logs()));
        assert_eq!(r.status, 200, "call {n}: {r}\n{}", mesh.logs());
        assert_eq!(r.json()["body"], body.as_str(), "{r}");
    }
    assert_eq!(mesh.app.count(), calls);
    let agreements = http1_agreements(runtime);
    assert_eq!(stat_seal(&mesh.envoy_a, "handshakes"), agreements);
    assert_eq!(stat_inbound(&mesh.envoy_b, "established"), agreements);
    assert_eq!(stat_inbound(&mesh.envoy_b, "allowed"), agreements);
}

/// The caller's app cannot speak for the sidecars: any `x-themis-*` header it sends
/// (in any case) is gone before the callee's app, which sees the true peer id; the
/// routing headers cannot send the call elsewhere either.
fn forged_themis_headers_never_reach_the_callee(runtime: Runtime) {
    if !require::filter_in_envoy("runs the filter") {
        return;
    }
    let mesh = Mesh::standard_on(runtime);
    // Where a forged destination would send the call: it counts connections.
    let trap = std::net::TcpListener::bind((IP_EVIL, 0)).unwrap();
    trap.set_nonblocking(true).unwrap();
    let trap_addr = trap.local_addr().unwrap().to_string();
    let forged = format!("FORGED{}", random_hex(8));
    let forged_peer = "00".repeat(32);
    let r = mesh.call(
        "GET",
        "check",
        "/forged",
        &[
            ("X-Themis-Peer-Id", forged.as_str()),
            ("x-THEMIS-peer-service", forged.as_str()),
            ("X-Themis-Anything", forged.as_str()),
            ("x-themis-destination", trap_addr.as_str()),
            ("X-Themis-Expect-Peer", forged_peer.as_str()),
        ],
        b"",
    );
    assert_eq!(r.status, 200, "{r}\n{}", mesh.logs());
    let echo = r.json();
    assert!(
        !echo["headers"].to_string().contains(&forged),
        "a forged header reached the app: {echo}"
    );
    assert_caller_is_handler(&mesh, &echo);
    let themis: Vec<&str> = echo["headers"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|pair| pair[0].as_str())
        .filter(|name| name.to_ascii_lowercase().starts_with("x-themis-"))
        .collect();
    assert_eq!(themis, [header::PEER_ID, header::PEER_SERVICE], "{echo}");
    assert_eq!(
        r.header(header::PEER_ID),
        Some(mesh.check_id.as_str()),
        "{r}"
    );
    assert!(trap.accept().is_err(), "the forged destination was called");
    assert_eq!(mesh.app.count(), 1);
}

fn count(haystack: &[u8], needle: &[u8]) -> usize {
    haystack
        .windows(needle.len())
        .filter(|w| *w == needle)
        .count()
}

/// `len` random characters of `alphabet`.
fn marker_of(alphabet: &[u8], len: usize) -> String {
    hex::decode(random_hex(len))
        .unwrap()
        .iter()
        .map(|b| alphabet[*b as usize % alphabet.len()] as char)
        .collect()
}

fn capture_holds_no_plaintext(runtime: Runtime) {
    if !(require::filter_in_envoy("runs the filter")
        && require::root("captures packets")
        && require::tool("tcpdump", "captures packets"))
    {
        return;
    }
    let tcpdump = installed("tcpdump");
    let mesh = Mesh::standard_on(runtime);
    let dir = mesh.dir.path();
    let capture = dir.join("inbound.pcap");
    let port = mesh.envoy_b.inbound.port();
    let mut command = Command::new(tcpdump);
    command
        .args(["-i", "lo", "-U", "--immediate-mode", "-n", "-w"])
        .arg(&capture)
        .arg(format!("tcp port {port}"));
    let mut dump = Process::spawn("tcpdump", command, &dir.join("tcpdump.log"));
    dump.wait_running("tcpdump to listen", Duration::from_secs(15), |p| {
        p.log().contains("listening on").then_some(())
    });

    // Between the sidecars the stream is HTTP/2, whose HPACK would Huffman-code a
    // hex marker in a header even in plaintext: the path and header markers are
    // made of characters with Huffman codes longer than 8 bits, which HPACK sends
    // as they are.
    let path_marker = marker_of(b"~@$!+", 24);
    let header_marker = marker_of(b"#$@[]^{|}~", 24);
    let body_marker = format!("BODYMARK{}", random_hex(8));
    let rounds = 4;
    let mut body_bytes = 0;
    for i in 0..rounds {
        let path = format!("/{path_marker}/{i}");
        let body = format!("{{\"secret\":\"{body_marker}\",\"round\":{i}}}");
        body_bytes += body.len();
        let r = mesh.call(
            "POST",
            "check",
            &path,
            &[("x-marker", header_marker.as_str())],
            body.as_bytes(),
        );
        assert_eq!(r.status, 200, "{r}\n{}", mesh.logs());
        let echo = r.json();
        // The markers did travel, to the app and back.
        assert_eq!(echo["path"], path.as_str());
        assert_eq!(seen_header(&echo, "x-marker"), [header_marker.as_str()]);
        assert_eq!(echo["body"], body.as_str());
        assert_eq!(echo["marker"], mesh.app_marker.as_str());
    }
    // Plaintext sent to the same port afterwards: once it is in the capture, so is
    // everything before it (-U writes each packet as it comes), and the capture does
    // show plaintext when there is some.
    let sentinel = format!("SENTINEL{}", random_hex(8));
    assert!(mitm::replay(mesh.envoy_b.inbound, sentinel.as_bytes(), false).closed);
    wait_until(
        "the capture to hold the sentinel",
        Duration::from_secs(15),
        || {
            let bytes = std::fs::read(&capture).unwrap_or_default();
            (count(&bytes, sentinel.as_bytes()) > 0).then_some(())
        },
    );
    let status = dump.stop().expect("tcpdump ran");
    assert!(
        status.success() || status.code().is_none(),
        "tcpdump: {status}: {}",
        dump.log()
    );
    let bytes = std::fs::read(&capture).unwrap();
    assert!(
        bytes.len() > body_bytes,
        "the capture ({} bytes) cannot hold the calls",
        bytes.len()
    );
    for marker in [&path_marker, &header_marker, &body_marker, &mesh.app_marker] {
        assert_eq!(
            count(&bytes, marker.as_bytes()),
            0,
            "{marker} is readable on the wire between the Envoys"
        );
    }
}

/// A request line, in place of a record.
const PLAINTEXT: &[u8] = b"GET /secret HTTP/1.1\r\nhost: check\r\n\r\n";

fn mitm_tampering_is_rejected(runtime: Runtime) {
    if !require::filter_in_envoy("runs the filter") {
        return;
    }
    let mesh = Mesh::start_on(runtime, runtime, Some(ALLOW_HANDLER));
    // At node B's address: with one-hop routing (the agents' default) an instance's
    // endpoint must be at its node's.
    let mitm = Mitm::start(IP_B, mesh.envoy_b.inbound);
    mesh.register("check", "check", mitm.addr);
    // Bodies of several records (up to 64 KiB of plaintext each, with the large
    // records both runtimes take), so that there is a next record to swap with.
    let body = varied_body(200 * 1024);
    let call = |path: &str| mesh.call("POST", "check", path, &[], &body);

    // Pass-through: the proxy is transparent, and sees only sealed bytes.
    let recorded = mitm::pass_through(&mesh, &mitm, &body);
    for c in &recorded {
        assert_eq!(count(&c.to_a, mesh.app_marker.as_bytes()), 0);
    }

    // Replay of a whole recorded connection, straight to Envoy B: all at once (the
    // rest arrives before B's reply), or paced like the original (B's fresh reply
    // does not match the recorded confirmation).
    // A worker that saw the Hello already refuses it at once (`replay`, no crypto);
    // the other worker answers it once and refuses it later, as named here.
    for (paced, reason) in [(false, "out_of_turn"), (true, "handshake")] {
        let either = || {
            stat_inbound(&mesh.envoy_b, &format!("refused.{reason}"))
                + stat_inbound(&mesh.envoy_b, "refused.replay")
        };
        let before = either();
        let replayed = mitm::replay(mesh.envoy_b.inbound, &recorded[0].to_b, paced);
        let what = format!("replay (paced: {paced})");
        assert!(replayed.closed, "{what}: Envoy B kept the connection open");
        wait_until_or(
            &format!("{what} to be counted"),
            COUNT_LIMIT,
            || (either() > before).then_some(()),
            || mesh.logs(),
        );
        assert_eq!(mesh.app.count(), 2, "{what} reached the app");
    }

    // Tampering with a record, on a connection the call opens (record 0 is the
    // Meta record) or one still pooled: the connection is closed before the app.
    // A stream cut in the middle of a record is closed unopened and counted.
    let cases = [
        (Mode::Flip(1), Some("tampered")),
        (Mode::Truncate(1), Some("truncated")),
        (Mode::Reorder(1), Some("replay")),
        (Mode::Inject(1, PLAINTEXT), Some("malformed")),
        (Mode::Flip(0), Some("tampered")),
    ];
    for (n, (mode, reason)) in cases.into_iter().enumerate() {
        if mode == Mode::Flip(0) {
            // The Meta record: only on a new connection.
            mitm.disconnect();
        }
        let counter = reason.map(|r| format!("refused.{r}"));
        let before = counter.as_ref().map(|c| stat_inbound(&mesh.envoy_b, c));
        mitm::tampered_call(&mesh, &mitm, mode, &format!("/tampered/{n}"), &body);
        if let (Some(reason), Some(before)) = (reason, before) {
            wait_refused(&mesh, reason, before, &format!("{mode:?}"));
        }
    }

    // And the mesh recovers once the proxy behaves.
    let r = call("/after");
    assert_eq!(r.status, 200, "{r}\n{}", mesh.logs());
    assert_eq!(mesh.app.count(), 3);
}

fn direct_plaintext_request_is_rejected(runtime: Runtime) {
    if !require::filter_in_envoy("runs the filter") {
        return;
    }
    let mesh = Mesh::standard_on(runtime);
    let mut h2 = themis_core::stream::HTTP2_PREFACE.to_vec();
    // An empty SETTINGS frame, as a client sends after the preface.
    h2.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
    // On the TLS binding BoringSSL refuses it (a TLS alert, Envoy's
    // ssl.connection_error) before the validator runs.
    let tls_errors = || -> u64 {
        let stats = mesh.envoy_b.stats();
        stats
            .iter()
            .filter(|(n, _)| n.starts_with("listener.") && n.ends_with(".ssl.connection_error"))
            .map(|(_, v)| *v)
            .sum()
    };
    for (what, bytes) in [("HTTP/1.1", PLAINTEXT.to_vec()), ("HTTP/2", h2)] {
        let before = stat_inbound(&mesh.envoy_b, "refused.malformed");
        let tls_before = tls_errors();
        let answer = mitm::replay(mesh.envoy_b.inbound, &bytes, false);
        assert!(answer.closed, "{what}: Envoy B kept the connection open");
        let answered = String::from_utf8_lossy(&answer.answer);
        if runtime == Runtime::Tls {
            assert!(
                !answered.contains("HTTP/"),
                "{what}: Envoy B answered {answered:?}"
            );
            wait_until_or(
                &format!("{what}: Envoy B to count a TLS connection error"),
                COUNT_LIMIT,
                || (tls_errors() > tls_before).then_some(()),
                || format!("{:?}", mesh.envoy_b.stats()),
            );
        } else {
            assert!(
                answer.answer.is_empty(),
                "{what}: Envoy B answered {answered:?}"
            );
            wait_refused(&mesh, "malformed", before, what);
        }
    }
    assert_eq!(mesh.app.count(), 0, "a plaintext request reached the app");
}

/// The callee decides once per connection, when the caller proved its id: a caller
/// its policy does not allow has its connection closed before any byte reaches the
/// app, and the calling app sees a 503 from its own sidecar.
fn policy_refuses_a_caller_it_does_not_allow(runtime: Runtime) {
    if !require::filter_in_envoy("runs the filter") {
        return;
    }
    let mesh = Mesh::start_on(
        runtime,
        runtime,
        Some(r#"{"allow":[{"service":"someone-else"}]}"#),
    );
    mesh.register("check", "check", mesh.envoy_b.inbound);
    let r = mesh.call("GET", "check", "/denied", &[], b"");
    assert_eq!(r.status, 503, "{r}\n{}", mesh.logs());
    wait_refused(&mesh, "policy", 0, "the denied call");
    assert_eq!(stat_inbound(&mesh.envoy_b, "allowed"), 0);
    assert_eq!(mesh.app.count(), 0, "a denied request reached the app");

    // A second sidecar of the same workload that allows `handler`, registered as
    // another service.
    let open = mesh.start_envoy_b("envoy-b-open", Some(ALLOW_HANDLER));
    open.wait_identity();
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
    assert_eq!(stat_inbound(&open, "refused.policy"), 0);
    assert_eq!(stat_inbound(&open, "allowed"), 1);
}

#[test]
fn bad_configuration_is_rejected() {
    if !require::filter_in_envoy("runs the filter") {
        return;
    }
    let dir = tempdir();
    let socket = dir.path().join("no-agent.sock");
    let app: SocketAddr = closed_port(IP_B);
    let limit = Duration::from_secs(60);
    let root = format!("{}:{}", MESH, "11".repeat(32));
    let good_outbound = outbound_config(&root, "handler", "handler");
    let good_inbound = inbound_config(&root, "check", "check", Some(ALLOW_HANDLER));
    let base = |role: &str, extra: &str| {
        format!(r#"{{"role":"{role}","mesh_root":"{root}","workload":"handler"{extra}}}"#)
    };
    let cases = [
        (
            "unknown-key",
            base("outbound", r#","private_key":"x""#),
            good_inbound.clone(),
            "themis filter configuration: unknown field `private_key`",
            "outbound",
        ),
        // A key of the callout design: refused, not silently ignored.
        (
            "removed-key",
            good_outbound.clone(),
            base("inbound", r#","app_cluster":"app""#),
            "themis filter configuration: unknown field `app_cluster`",
            "inbound",
        ),
        (
            "unknown-role",
            good_outbound.clone(),
            base("responder", ""),
            "themis filter configuration: unknown variant `responder`",
            "inbound",
        ),
        // The outbound and sealing roles cannot enforce a policy.
        (
            "outbound-policy",
            base("outbound", r#","policy":{"allow":[{"service":"check"}]}"#),
            good_inbound.clone(),
            "themis filter configuration: policy: policies are enforced by the inbound role",
            "outbound",
        ),
    ];
    // The module is pinned (fetched, then checked): Envoy configures the plugin after
    // the fetch, so a refused configuration fails the filter closed rather than
    // stopping Envoy; either way the log says why.
    for (name, outbound, inbound, expected, refused_role) in cases {
        let (status, log) = Envoy::start_refused(
            dir.path(),
            name,
            &Sidecar {
                app_protocol: AppProtocol::Http1,
                ip: IP_A,
                agent_socket: &socket,
                app,
                outbound_config: &outbound,
                inbound_config: &inbound,
            },
            expected,
            limit,
        );
        assert!(
            log.contains(expected),
            "{name}: Envoy's log does not say {expected:?} within {limit:?}:\n{log}"
        );
        // The refused role never runs (its plugin fails closed on every worker).
        let configured = format!("themis {refused_role} filter for workload");
        assert!(
            !log.contains(&configured),
            "{name}: the {refused_role} role was configured anyway:\n{log}"
        );
        if let Some(status) = status {
            assert!(
                !status.success(),
                "{name}: Envoy exited successfully:\n{log}"
            );
        }
    }
}

/// A caller may reach a pod whose sidecar is up before its app listens (the node
/// controller registers a pod once its sidecar has started; an app also restarts):
/// the inbound sidecar tries the app again rather than answer 503, and the call is
/// answered once the app listens. The app starts only after the sidecar has seen its
/// connection refused, so the test fails without the retry.
fn a_call_that_arrives_before_the_app_listens_is_answered_once_it_does(runtime: Runtime) {
    if !require::filter_in_envoy("runs the filter") {
        return;
    }
    let mesh = Mesh::start_on(runtime, runtime, Some(ALLOW_HANDLER));
    let app_at = closed_port(IP_B);
    let starting = mesh.start_sidecar_of_app(app_at, "envoy-b-starting", Some(ALLOW_HANDLER));
    starting.wait_identity();
    mesh.register("check", "check", starting.inbound);
    let refused = || starting.stat("cluster.app.upstream_cx_connect_fail");
    std::thread::scope(|scope| {
        let call = scope.spawn(|| mesh.call("GET", "check", "/while-starting", &[], b""));
        wait_until_or(
            "the sidecar finds no app yet",
            COUNT_LIMIT,
            || (refused() >= 1).then_some(()),
            || format!("{}\n{}", starting.log_tail(40), mesh.logs()),
        );
        assert!(!call.is_finished(), "answered before the app started");
        let app = support::app::App::start_at(app_at, &mesh.app_marker);
        let r = call.join().expect("the call");
        assert_eq!(r.status, 200, "{r}\n{}", starting.log_tail(40));
        assert!(
            String::from_utf8_lossy(&r.body).contains(&mesh.app_marker),
            "{r}"
        );
        assert_eq!(app.count(), 1, "the app saw the call once");
    });
}

fn unknown_service_and_dead_instance(runtime: Runtime) {
    if !require::filter_in_envoy("runs the filter") {
        return;
    }
    let mesh = Mesh::start_on(runtime, runtime, Some(ALLOW_HANDLER));
    // A second instance of `check` that never answers, registered before anything
    // resolves `check` (the filter caches resolutions); at node B's address, as an
    // instance's endpoint must be with one-hop routing (the agents' default).
    let dead = closed_port(IP_B);
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
            r.header(header::REJECT),
            Some("no_instance" | "resolve_failed")
        ),
        "no {} header naming the failure: {r}",
        header::REJECT
    );
    assert_eq!(mesh.app.count(), 0);

    // Each call picks one of the two at random. A call sent to the dead one fails
    // (503) and marks it down on that worker (for `down_secs`, 10 s: far longer than
    // these calls take), so it fails at most once per worker (two), out of 40 calls
    // that would otherwise fail half the time.
    let (mut served, mut failed) = (0, 0u64);
    for n in 0..40 {
        let r = mesh.call("GET", "check", &format!("/live/{n}"), &[], b"");
        match r.status {
            200 => {
                served += 1;
                assert_eq!(
                    r.header(header::PEER_ID),
                    Some(mesh.check_id.as_str()),
                    "{r}"
                );
            }
            503 => failed += 1,
            _ => panic!("call {n}: {r}\n{}", mesh.logs()),
        }
    }
    assert!(
        (1..=2).contains(&failed),
        "{failed} calls failed: the dead instance was {} \n{}",
        if failed == 0 {
            "never tried"
        } else {
            "not avoided"
        },
        mesh.logs()
    );
    assert_eq!(stat_outbound(&mesh.envoy_a, "peer_unreachable"), failed);
    assert_eq!(mesh.app.count(), served);
}
/// Issue 11's impostor, end to end: a node admitted to the mesh (so it holds a valid
/// mesh key and takes part in the ring) but granted neither `check` nor `handler`.
/// On the old code its self-signed record made it an instance of `check` (part of
/// check's traffic went to it), and registering as `handler` passed
/// `allow service handler`. Now: its agent refuses to register it, the ring refuses
/// its forged records, no agent or filter resolves it, no call reaches it, and its
/// claim to be `handler` does not pass the policy.
fn an_admitted_node_without_a_grant_cannot_serve_or_claim_a_name(runtime: Runtime) {
    if !require::filter_in_envoy("runs the filter") {
        return;
    }
    use themis_trust::{Grant, InstanceValue, Metadata, Record, Signed, GRANT_LABEL, RECORD_LABEL};

    let mesh = Mesh::start_on(
        runtime,
        runtime,
        Some(r#"{"allow":[{"service":"handler"}]}"#),
    );
    mesh.register("check", "check", mesh.envoy_b.inbound);
    let root = mesh.dir.path();
    let c = support::agent::Agent::spawn(
        root,
        "agent-c",
        support::agent::Spawn {
            listen: &format!("{IP_EVIL}:0"),
            join: Some(&mesh.a.contact),
            ..Default::default()
        },
    );
    c.wait_joined();
    // Where the impostor would like check's traffic to go: it counts connections.
    let trap = std::net::TcpListener::bind((IP_EVIL, 0)).unwrap();
    let trap_addr = trap.local_addr().unwrap();
    trap.set_nonblocking(true).unwrap();
    let trapped = || {
        let mut n = 0;
        while trap.accept().is_ok() {
            n += 1;
        }
        n
    };

    // 1. Through its own agent: refused, nothing stored.
    let body = serde_json::json!({ "endpoint": trap_addr.to_string() });
    for service in ["check", "handler"] {
        let (status, answer) = c
            .call(
                hyper::Method::PUT,
                &format!("/v1/services/{service}/instances/evil"),
                Some(&body),
            )
            .unwrap();
        assert_eq!(status, 403, "{answer}");
        assert_eq!(answer["reason"], "not_granted", "{answer}");
    }

    // 2. Forged records stored directly: self-granted, and under a real grant for
    //    another service. The replica holders verify and refuse them.
    let mesh_name = themis_core::MeshName::new(MESH).unwrap();
    let node_pem = std::fs::read_to_string(c.dir.join("node.key")).unwrap();
    let node = themis_core::Identity::from_key_file(mesh_name.clone(), &node_pem).unwrap();
    support::agent::grant(root, &c.dir, "other");
    let other_grant = themis_trust::chain_from_pem(
        &std::fs::read_to_string(c.dir.join("grants/other.pem")).unwrap(),
    )
    .unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let forged = |service: &str, grants: Vec<Signed>| {
        let record = Record {
            mesh: MESH.into(),
            service: service.into(),
            workload_key: *node.public_key(),
            endpoint: Some(trap_addr),
            metadata: Metadata::new(),
            issued_at: now,
            not_after: now + 60_000,
        };
        let value = InstanceValue {
            grants,
            record: Signed::sign(&node, RECORD_LABEL, &record),
        };
        hex::encode(value.encode())
    };
    let self_grant = |service: &str| {
        vec![Signed::sign(
            &node,
            GRANT_LABEL,
            &Grant {
                mesh: MESH.into(),
                service: service.into(),
                grantee: *node.public_key(),
                delegate: false,
                issued_at: now,
                not_after: None,
            },
        )]
    };
    for (service, grants) in [
        ("check", self_grant("check")),
        ("check", other_grant.clone()),
        ("handler", self_grant("handler")),
        ("handler", other_grant),
    ] {
        let store = serde_json::json!({
            "name": service, "value": forged(service, grants), "hex": true, "replicas": 2,
        });
        let (status, answer) = c
            .call(hyper::Method::POST, "/v1/debug/store", Some(&store))
            .unwrap();
        // Refused by the value policy before it leaves (422), or by every replica
        // holder (nothing stored); raw Store frames that skip the sender's own check
        // are refused by the holders (host-agent/themis-agent/tests/trust.rs).
        let refused = status == 422 || (status == 200 && answer["stored"] == 0);
        assert!(
            refused,
            "a forged {service} record was stored: {status} {answer}"
        );
    }

    // 3. Nobody resolves the impostor; every call reaches the real check.
    for agent in [&mesh.a, &mesh.b, &c] {
        let answer = agent.resolve("check").unwrap();
        let ids: Vec<&str> = answer["instances"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["id"].as_str().unwrap())
            .collect();
        assert_eq!(ids, [mesh.check_id.as_str()], "{}: {answer}", agent.name);
        let handler = agent.resolve("handler").unwrap();
        assert_eq!(
            handler["instances"].as_array().unwrap().len(),
            1,
            "{handler}"
        );
    }
    for i in 0..20 {
        let r = mesh.call("GET", "check", &format!("/n/{i}"), &[], b"");
        assert_eq!(r.status, 200, "{r}\n{}", mesh.logs());
    }
    assert_eq!(mesh.app.count(), 20);
    assert_eq!(trapped(), 0, "a call reached the impostor");

    // 4. The impostor's own sidecar claims to be `handler`: check's policy
    //    (allow service handler) finds the DHT does not list it as handler and closes
    //    the connection; the app sees nothing.
    let (code, out, err) = c.cli(&["workload", "evil"]);
    assert_eq!(code, 0, "{out}{err}");
    let envoy_c = Envoy::start(
        root,
        "envoy-c",
        &Sidecar {
            app_protocol: AppProtocol::Http1,
            ip: IP_EVIL,
            agent_socket: &c.dir.join("agent.sock"),
            app: closed_port(IP_EVIL),
            outbound_config: &outbound_config(&support::envoy::mesh_root(root), "evil", "handler"),
            inbound_config: &inbound_config(
                &support::envoy::mesh_root(root),
                "evil",
                "handler",
                Some(ALLOW_NOBODY),
            ),
        },
    );
    envoy_c.wait_identity();
    let refused = stat_inbound(&mesh.envoy_b, "refused.policy");
    let r = http::request(
        envoy_c.outbound,
        "GET",
        "/as-handler",
        &[("host", "check")],
        b"",
    );
    assert_eq!(r.status, 503, "{r}\n{}", envoy_c.log_tail(30));
    wait_refused(&mesh, "policy", refused, "the impostor's call");
    // It did reach Envoy B with a key agreement of its own: the policy refused it.
    assert_eq!(stat_seal(&envoy_c, "established"), 1);
    assert_eq!(
        mesh.app.count(),
        20,
        "the impostor's request reached the app"
    );
    drop(envoy_c);
}

/// How many of Envoy's threads logged that the filter of VM `vm` holds `count`
/// revocations (`[time][thread][level]...` lines).
fn threads_holding_revocations(envoy: &Envoy, vm: &str, count: usize) -> usize {
    let said = format!("{vm}: themis: {count} revocation(s) in force (");
    envoy
        .log_tail(usize::MAX)
        .lines()
        .filter(|l| l.contains(&said))
        .filter_map(|l| l.split("][").nth(1).map(str::to_owned))
        .collect::<std::collections::BTreeSet<_>>()
        .len()
}

/// Waits until `envoy`'s inbound role holds `count` revocations: on Wasm every
/// thread's filter polls its agent on its own (the main thread and both workers must
/// say so); the native module's one thread polls for all. Each page read must have
/// been proven by the trust log's checkpoint (one signature), none entry by entry.
fn wait_holds_revocation(envoy: &Envoy, runtime: Runtime, count: usize) {
    let native_said = format!("themis native: {count} revocations in force (");
    wait_until(
        "Envoy B's inbound filters to hold the revocations",
        Duration::from_secs(60),
        || {
            let held = match runtime {
                Runtime::Wasm => threads_holding_revocations(envoy, "themis-inbound", count) >= 3,
                Runtime::Native | Runtime::Tls | Runtime::TlsAndChannel => {
                    envoy.log_tail(usize::MAX).contains(&native_said)
                }
            };
            held.then_some(())
        },
    );
    for line in envoy.log_tail(usize::MAX).lines() {
        let Some((_, counts)) = line.split_once(" in force (") else {
            continue;
        };
        let read = counts.split(" read, ").next();
        let proven = counts
            .split(" read, ")
            .nth(1)
            .and_then(|p| p.split(' ').next());
        assert_eq!(read, proven, "a page not proven by the checkpoint: {line}");
    }
}

/// Every revocation `agent` lists, read page by page as filters read them (the whole
/// list of thousands is past the test client's answer limit); `None` if it does not
/// answer.
fn revoked_ids(agent: &support::agent::Agent) -> Option<Vec<String>> {
    let (mut list, mut ids) = (0, Vec::new());
    loop {
        let path = themis_contracts::paths::revocations_since(list, ids.len(), 0);
        let (_, page) = agent.get(&path)?;
        if page["from"].as_u64()? == 0 {
            ids.clear();
        }
        list = page["list"].as_u64()?;
        let listed = page["revocations"].as_array()?;
        ids.extend(
            listed
                .iter()
                .filter_map(|r| r["id"].as_str().map(str::to_owned)),
        );
        if listed.is_empty() || ids.len() >= page["total"].as_u64()? as usize {
            return Some(ids);
        }
    }
}

/// Revocation end to end (issue 11): the operator revokes `handler`'s workload key and
/// publishes it through agent B. Within the stated bound (the agents' revocation poll,
/// here 0.5 s, plus the filter's poll of its agent, here 1 s) Envoy B refuses
/// handler's connections, including the one it established before, the app sees none
/// of handler's requests any more, and no agent resolves handler.
fn a_revoked_workload_is_refused_by_the_filter_and_the_agents(runtime: Runtime) {
    if !require::filter_in_envoy("runs the filter") {
        return;
    }
    let mesh = Mesh::standard_on(runtime);
    // A client connection kept across the revocation: its calls ride the sealed
    // connection established before it.
    let mut kept = KeepAlive::connect(mesh.envoy_a.outbound);
    let r = kept.post("check", "/before", b"").unwrap();
    assert_eq!(r.status, 200, "{r}\n{}", mesh.logs());

    // Handler's key after 4,999 others in the trust log: a
    // list of thousands (some 7 MB as one answer, past the native filter's 4 MiB
    // answer limit: every refresh failed, and the key stayed accepted) is read by
    // bounded pages and enforced like a list of one.
    let mesh_dir = mesh.dir.path().join("mesh");
    let mesh_name = themis_core::MeshName::new(MESH).unwrap();
    let mut revoked: Vec<String> = (0..4_999u32)
        .map(|i| {
            let mut id = [0xa5; 32];
            id[..4].copy_from_slice(&i.to_be_bytes());
            themis_core::PeerId(id).printable(&mesh_name)
        })
        .collect();
    mesh.b.revoke_many(&revoked, &mesh_dir);
    wait_holds_revocation(&mesh.envoy_b, runtime, revoked.len());
    // Then handler's alone, with agent A frozen meanwhile: B's filter, not A's
    // agent, must be what stops the kept connection (agent A, learning it from B's
    // log as fast as B's filter does, withdraws handler's certificate, and Envoy A
    // then fails the call itself). Called just before, so Envoy A needs nothing of
    // its agent for the kept call.
    // (Bounded retries: on a loaded machine a record renewal can leave Envoy A
    // without an instance of check for a moment.)
    wait_until_or(
        "a call just before the revocation",
        Duration::from_secs(30),
        || (kept.post("check", "/just-before", b"").ok()?.status == 200).then_some(()),
        || mesh.logs(),
    );
    let frozen = Frozen::freeze(&mesh.a);
    revoked.push(mesh.handler_id.clone());
    mesh.b.revoke_many(&revoked[revoked.len() - 1..], &mesh_dir);
    wait_holds_revocation(&mesh.envoy_b, runtime, revoked.len());
    // Requests made before the filter learnt it were served; none after, on the
    // connection established before or on new ones.
    let served = mesh.app.count();
    let r = kept
        .post("check", "/kept", b"")
        .unwrap_or_else(|e| panic!("the kept connection: {e}\n{}", mesh.logs()));
    assert_eq!(
        r.status, 503,
        "the established connection still serves: {r}"
    );
    // (Counted by the worker that cut the connection: bounded wait, not a snapshot.)
    wait_refused(&mesh, "revoked", 0, "the revoked caller's connection");
    drop(frozen);
    for i in 0..4 {
        let r = mesh.call("GET", "check", &format!("/again/{i}"), &[], b"");
        assert_eq!(r.status, 503, "{r}\n{}", mesh.logs());
    }
    assert_eq!(
        mesh.app.count(),
        served,
        "a revoked caller's request reached the app"
    );

    // Agent A learnt it from the trust log (published through B), and neither
    // agent resolves the revoked instance any more.
    for agent in [&mesh.a, &mesh.b] {
        wait_until(
            "the agent to know the revocation",
            Duration::from_secs(30),
            || revoked_ids(agent)?.contains(&mesh.handler_id).then_some(()),
        );
        // (A fresh resolution is a DHT lookup: on a loaded machine one may time out.)
        wait_until(
            "the agent to resolve no instance of handler",
            Duration::from_secs(30),
            || {
                let handler = agent.resolve("handler")?;
                handler["instances"].as_array()?.is_empty().then_some(())
            },
        );
    }
}

/// A revocation reaches the filter as soon as its agent has it (issue 23): the filter
/// long-polls its agent, so a sidecar whose poll period is an hour still holds a new
/// revocation within seconds. (Before, it held it at its next poll: an hour here.)
fn a_revocation_reaches_the_filter_at_once_not_at_its_poll_period(runtime: Runtime) {
    if !require::filter_in_envoy("runs the filter") {
        return;
    }
    let mesh = Mesh::standard_on(runtime);
    let mesh_dir = mesh.dir.path().join("mesh");
    let mesh_name = themis_core::MeshName::new(MESH).unwrap();
    let id = |b: u8| themis_core::PeerId([b; 32]).printable(&mesh_name);
    // One revocation before the sidecar starts: its first poll (at start) returns it,
    // and the log line says the first poll is done.
    mesh.b.revoke_many(&[id(0x61)], &mesh_dir);
    let hour = |config: String| {
        config.replace(
            r#""revocation_poll_secs":1"#,
            r#""revocation_poll_secs":3600"#,
        )
    };
    let root = mesh.dir.path();
    let slow = runtime.start(
        root,
        "envoy-slow",
        &Sidecar {
            app_protocol: AppProtocol::Http1,
            ip: IP_B,
            agent_socket: &mesh.b.dir.join("agent.sock"),
            app: mesh.app.addr,
            outbound_config: &hour(outbound_config(
                &support::envoy::mesh_root(root),
                "check",
                "check",
            )),
            inbound_config: &hour(inbound_config(
                &support::envoy::mesh_root(root),
                "check",
                "check",
                Some(ALLOW_HANDLER),
            )),
        },
    );
    slow.wait_identity();
    wait_holds_revocation(&slow, runtime, 1);
    let published = Instant::now();
    mesh.b.revoke_many(&[id(0x62)], &mesh_dir);
    wait_holds_revocation(&slow, runtime, 2);
    eprintln!(
        "{runtime:?}: the sidecar held the new revocation {:?} after the operator's command began (poll period 1 h)",
        published.elapsed()
    );
}

/// An agent frozen (`SIGSTOP`) for a test, thawed (`SIGCONT`) when dropped, even on
/// a failed assertion, so it can be stopped by its pid at the end.
struct Frozen(u32);

impl Frozen {
    fn freeze(agent: &support::agent::Agent) -> Frozen {
        let pid = agent.pid().expect("the agent runs");
        signal(pid, "-STOP");
        Frozen(pid)
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        signal(self.0, "-CONT");
    }
}

fn signal(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill {signal} {pid}");
}

/// A fresh Hello to `to` (Envoy B's inbound listener, workload `check`) from a key
/// of the mesh made now, from `source`: whether it was answered with message 2.
fn fresh_hello_answered(mesh: &Mesh, source: &str, to: SocketAddr) -> bool {
    let (mesh_name, check) = themis_core::PeerId::parse(&mesh.check_id).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let from = source.parse().unwrap();
        let hello = support::intruder::hello_from(mesh_name.as_str(), from, to, check);
        tokio::time::timeout(Duration::from_secs(10), hello)
            .await
            .ok()
            .flatten()
            .is_some_and(|(_, answered)| answered)
    })
}

/// A feed of revocations that froze lets no new caller in (issue 42): agent B stops
/// answering (frozen with `SIGSTOP`, as an agent that hangs or withholds its
/// answers), and once its revocations are older than `revocations_max_age_secs` (60
/// here) the inbound filter refuses a caller it never saw before any public-key work,
/// counted `refused.revocations_stale` and alarmed in its log; thawed, the agent is
/// read again and a new caller is answered. (Before, a frozen feed kept the last list
/// forever: a key revoked meanwhile stayed accepted, and nothing said so.)
fn a_frozen_revocations_feed_lets_no_new_caller_in(runtime: Runtime) {
    if !require::filter_in_envoy("runs the filter") {
        return;
    }
    let mesh = Mesh::start_on(runtime, runtime, Some(ALLOW_HANDLER));
    let strict = mesh.start_envoy_b(
        "envoy-strict",
        // (The policy slot of the test config: the policy, then the setting.)
        Some(&format!(r#"{ALLOW_HANDLER},"revocations_max_age_secs":60"#)),
    );
    strict.wait_identity();
    // A caller it never saw, a key made now: answered while the feed is fresh.
    assert!(
        fresh_hello_answered(&mesh, "127.0.0.36", strict.inbound),
        "a fresh Hello was not answered: {}",
        strict.log_tail(30)
    );

    let frozen = Frozen::freeze(&mesh.b);
    let froze = Instant::now();
    // Every inbound filter closed: on Wasm each thread's reads its feed on its own
    // (the main thread and both workers must say so), the native module's one thread
    // reads for all.
    let threads_saying = |said: &str| {
        strict
            .log_tail(usize::MAX)
            .lines()
            .filter(|l| l.contains(said))
            .filter(|l| runtime.is_native() || l.contains("themis-inbound:"))
            .filter_map(|l| l.split("][").nth(1).map(str::to_owned))
            .collect::<std::collections::BTreeSet<_>>()
            .len()
    };
    let threads = if runtime.is_native() { 1 } else { 3 };
    let all_say = |what: &str, said: &str, limit: u64| {
        wait_until_or(
            what,
            Duration::from_secs(limit),
            || (threads_saying(said) >= threads).then_some(()),
            || strict.log_tail(30),
        )
    };
    all_say(
        "the strict sidecar to close to new callers",
        "past revocations_max_age_secs: new callers are refused",
        150,
    );
    eprintln!(
        "{runtime:?}: closed to new callers {:?} after the agent froze",
        froze.elapsed()
    );
    assert!(
        !fresh_hello_answered(&mesh, "127.0.0.37", strict.inbound),
        "a new caller was answered with the feed {:?} old",
        froze.elapsed()
    );
    wait_refused_at(&strict, "revocations_stale", 1, "the new caller");

    drop(frozen);
    all_say(
        "the strict sidecar to read its agent again",
        "the revocations are read again",
        60,
    );
    assert!(
        fresh_hello_answered(&mesh, "127.0.0.38", strict.inbound),
        "a new caller was not answered once the agent answered: {}",
        strict.log_tail(30)
    );
}

/// A dotted service name (`check.default.svc`, as Kubernetes names a Service) is a
/// name everywhere: the agent registers it, the outbound filter routes the app's call
/// to it by its host (it answered 400 when the filter had a name rule of its own), and
/// the caller learns the service that answered.
fn a_dotted_service_name_resolves_and_is_called(runtime: Runtime) {
    if !require::filter_in_envoy("runs the filter") {
        return;
    }
    let mesh = Mesh::start_on(runtime, runtime, Some(ALLOW_HANDLER));
    mesh.register("check.default.svc", "check", mesh.envoy_b.inbound);
    let r = mesh.call("GET", "check.default.svc:8080", "/dotted", &[], b"");
    assert_eq!(r.status, 200, "{r}\n{}", mesh.logs());
    assert_eq!(r.json()["path"], "/dotted", "{r}");
    assert_eq!(
        r.header(header::PEER_SERVICE),
        Some("check.default.svc"),
        "{r}"
    );
    assert_eq!(
        r.header(header::PEER_ID),
        Some(mesh.check_id.as_str()),
        "{r}"
    );
    assert_eq!(mesh.app.count(), 1);
}

/// Waits until `envoy`'s inbound counter `refused.<reason>` reaches `at_least`.
fn wait_refused_at(envoy: &Envoy, reason: &str, at_least: u64, what: &str) {
    let name = format!("refused.{reason}");
    wait_until_or(
        &format!("{what}: {name} to reach {at_least}"),
        COUNT_LIMIT,
        || (stat_inbound(envoy, &name) >= at_least).then_some(()),
        || {
            format!(
                "it stayed at {}; refusals: {:?}\n{}",
                stat_inbound(envoy, &name),
                refusals(envoy),
                envoy.log_tail(30)
            )
        },
    );
}

/// Connects to `target` from `source` (a 127.x address: on one machine every other
/// client is 127.0.0.1), sends `bytes` and reads until the server closes or goes
/// quiet. Returns (closed, what the server sent).
fn send_from(source: &str, target: SocketAddr, bytes: &[u8]) -> (bool, Vec<u8>) {
    use std::io::Read;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .unwrap();
    let mut stream = runtime.block_on(async {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind(format!("{source}:0").parse().unwrap()).unwrap();
        let stream = socket.connect(target).await.unwrap();
        stream.into_std().unwrap()
    });
    stream.set_nonblocking(false).unwrap();
    stream.set_read_timeout(Some(COUNT_LIMIT)).unwrap();
    let _ = stream.write_all(bytes);
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return (true, answer),
            Ok(n) => answer.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return (false, answer)
            }
            Err(_) => return (true, answer),
        }
    }
}

/// Issue 13: floods of message 1 are refused before any public-key work and counted
/// by reason. A Hello captured from a real call and replayed to the inbound listener
/// is refused at once (`refused.replay`) by a worker that saw it (each worker keeps
/// its own cache: the other worker answers it once, and it fails at message 3 as
/// before); one replayed after the freshness window is `stale`; a source over its
/// handshake budget is closed (`refused.rate_limited`) while another source, and the
/// mesh's own calls, are not; nothing of it reaches the app.
fn hello_floods_are_refused_cheaply_and_counted_by_reason(runtime: Runtime) {
    if !require::filter_in_envoy("runs the filter") {
        return;
    }
    let mesh = Mesh::start_on(runtime, runtime, Some(ALLOW_HANDLER));
    // At node B's address, as an instance's endpoint must be with one-hop routing.
    let mitm = Mitm::start(IP_B, mesh.envoy_b.inbound);
    mesh.register("check", "check", mitm.addr);
    let r = mesh.call("GET", "check", "/first", &[], b"");
    assert_eq!(r.status, 200, "{r}\n{}", mesh.logs());
    let captured_at = Instant::now();
    mitm.disconnect();
    let recorded = mitm.connections();
    let to_b = &recorded[0].to_b;
    let hello_len = themis_core::wire::frame_len(to_b).unwrap().unwrap();
    let hello = &to_b[..hello_len];
    assert_eq!(mesh.app.count(), 1);

    // The captured Hello, replayed again and again from an address of its own.
    const REPLAYS: u64 = 6;
    let before = stat_inbound(&mesh.envoy_b, "refused.replay");
    let mut cheap = 0;
    for n in 0..REPLAYS {
        let (closed, answer) = send_from("127.0.0.36", mesh.envoy_b.inbound, hello);
        if closed && answer.is_empty() {
            cheap += 1;
        } else {
            // The worker that had not seen it: message 2, then it waits for message
            // 3 that never comes. That worker remembers the Hello now.
            assert!(!answer.is_empty(), "replay {n}: closed with an answer?");
        }
    }
    assert!(
        cheap >= REPLAYS - 1,
        "only {cheap} of {REPLAYS} replays were refused at once\n{}",
        mesh.logs()
    );
    wait_refused_at(&mesh.envoy_b, "replay", before + cheap, "replayed Hellos");
    assert_eq!(mesh.app.count(), 1, "a replayed Hello reached the app");

    // A sidecar of the same workload with a one-second window and a budget of one
    // handshake per source and second (per worker): the captured Hello is valid for
    // it, but stale once a second has passed.
    let limited = mesh.start_envoy_b(
        "envoy-b-limited",
        // (The policy slot of the test config: the policy, then the flood settings.)
        Some(&format!(
            r#"{ALLOW_HANDLER},"hellos_per_source":{{"per_second":1,"burst":1}},"hello_window_secs":1"#
        )),
    );
    limited.wait_identity();
    mesh.register("check-limited", "check", limited.inbound);
    // Time itself is the condition here: the Hello must be older than the window.
    if let Some(rest) = Duration::from_millis(2_500).checked_sub(captured_at.elapsed()) {
        std::thread::sleep(rest);
    }
    let (closed, answer) = send_from("127.0.0.37", limited.inbound, hello);
    assert!(closed && answer.is_empty(), "a stale Hello was answered");
    wait_refused_at(&limited, "stale", 1, "the stale Hello");

    // One source opens connections as fast as it can (junk bytes: what is admitted is
    // refused as malformed, the rest before its bytes are looked at).
    const FLOOD: u64 = 20;
    for n in 0..FLOOD {
        let (closed, _) = send_from(IP_EVIL, limited.inbound, PLAINTEXT);
        assert!(closed, "flood connection {n} was kept open");
    }
    let limited_count = stat_inbound(&limited, "refused.rate_limited");
    assert!(
        limited_count >= FLOOD / 2,
        "only {limited_count} of {FLOOD} flood connections were rate limited; refusals: {:?}",
        refusals(&limited)
    );
    wait_refused_at(
        &limited,
        "malformed",
        FLOOD - limited_count,
        "admitted flood connections",
    );
    // Another source is not limited by the first one's flood.
    let malformed = stat_inbound(&limited, "refused.malformed");
    let (closed, _) = send_from("127.0.0.38", limited.inbound, PLAINTEXT);
    assert!(closed);
    wait_refused_at(&limited, "malformed", malformed + 1, "another source");
    assert_eq!(
        stat_inbound(&limited, "refused.rate_limited"),
        limited_count,
        "another source was rate limited"
    );

    // The mesh's own calls go on, to both sidecars; nothing of the flood got through.
    for (service, n) in [("check-limited", 2), ("check", 3)] {
        let r = mesh.call("GET", service, "/after", &[], b"");
        assert_eq!(r.status, 200, "{service}: {r}\n{}", limited.log_tail(30));
        assert_eq!(mesh.app.count(), n);
    }
}

/// Issue 13, "under load": fresh, validly signed Hellos (each from a new key pair:
/// every key pair is a valid id) spread over several sources, each far under its own
/// `hellos_per_source` bucket, find the worker's handshake budget spent and are
/// closed before any key work (`refused.busy`), while the caller that holds a pooled
/// connection keeps getting its answers over it, with no new handshake. The budget
/// is tiny here: 1 handshake a second and 10 at once per worker, 90 % of it reserved
/// for known-good sources, so new sources share one handshake per worker and one
/// more every 10 s.
fn a_flood_of_fresh_hellos_from_many_sources_is_refused_busy_and_pooled_callers_keep_going(
    runtime: Runtime,
) {
    if !require::filter_in_envoy("runs the filter") {
        return;
    }
    let mesh = Mesh::start_on(runtime, runtime, Some(ALLOW_HANDLER));
    let budgeted = mesh.start_envoy_b(
        "envoy-b-budget",
        // (The policy slot of the test config: the policy, then the budget.)
        Some(&format!(
            r#"{ALLOW_HANDLER},"handshake_budget":{{"per_second":1,"burst":10}},"known_good_share_percent":90"#
        )),
    );
    budgeted.wait_identity();
    mesh.register("check-budget", "check", budgeted.inbound);
    let mut caller = KeepAlive::connect(mesh.envoy_a.outbound);
    // Two calls: on native sidecars the second holds the HTTP/1.1 connection.
    for n in 0..2 {
        let r = caller
            .post("check-budget", &format!("/before/{n}"), b"before")
            .unwrap();
        assert_eq!(r.status, 200, "{r}\n{}", budgeted.log_tail(30));
    }
    let established = stat_inbound(&budgeted, "established");
    assert_eq!(established, http1_agreements(runtime));

    // The flood: each connection sends one fresh Hello and goes away.
    const SOURCES: u64 = 8;
    const FLOOD: u64 = SOURCES * 5;
    support::intruder::flood_fresh_hellos(&mesh.check_id, budgeted.inbound, SOURCES, FLOOD);
    // At most one handshake per worker, plus one per 10 s, was answered.
    wait_refused_at(&budgeted, "busy", FLOOD / 2, "fresh Hellos over the budget");
    assert_eq!(
        stat_inbound(&budgeted, "refused.rate_limited"),
        0,
        "each source was under its own bucket; refusals: {:?}",
        refusals(&budgeted)
    );

    // The pooled caller goes on over its connection: no handshake, no refusal.
    for n in 0..5 {
        let body = format!("after {n}");
        let r = caller
            .post("check-budget", &format!("/after/{n}"), body.as_bytes())
            .unwrap_or_else(|e| panic!("call {n}: {e}\n{}", budgeted.log_tail(30)));
        assert_eq!(r.status, 200, "call {n}: {r}\n{}", budgeted.log_tail(30));
        assert_eq!(r.json()["body"], body.as_str(), "{r}");
    }
    assert_eq!(
        stat_inbound(&budgeted, "established"),
        established,
        "the calls needed a new handshake"
    );
    assert_eq!(
        mesh.app.count(),
        7,
        "only the caller's calls reached the app"
    );
}

/// A full replay cache forgets the live Hello that expires first and says so
/// (`replay_cache_evicted`; a replay of the forgotten one would cost a full answer and
/// still fail at message 3), and the mesh's calls go on. Both roles of a sidecar show
/// that they hold the workload's key (`identity`: per worker on Wasm, once per
/// process on the native runtime).
fn a_full_replay_cache_forgets_a_hello_and_counts_it(runtime: Runtime) {
    if !require::filter_in_envoy("runs the filter") {
        return;
    }
    let mesh = Mesh::start_on(runtime, runtime, Some(ALLOW_HANDLER));
    let small = mesh.start_envoy_b(
        "envoy-b-small-cache",
        // (The policy slot of the test config: the policy, then the cache's size.)
        Some(&format!(r#"{ALLOW_HANDLER},"replay_cache_entries":1"#)),
    );
    small.wait_identity();
    for role in ["seal", "inbound"] {
        let held = small.themis_counter(&format!("{role}.identity"));
        assert!(held >= 1, "{role}.identity is {held}");
    }
    // Three fresh Hellos on two workers: one worker takes two, with room for one.
    support::intruder::flood_fresh_hellos(&mesh.check_id, small.inbound, 3, 3);
    wait_evicted(&small);
    mesh.register("check-small", "check", small.inbound);
    let r = mesh.call("GET", "check-small", "/after", &[], b"");
    assert_eq!(r.status, 200, "{r}\n{}", small.log_tail(30));
}

/// Waits until `envoy` counts a Hello forgotten from a full replay cache.
fn wait_evicted(envoy: &Envoy) {
    wait_until_or(
        "replay_cache_evicted",
        COUNT_LIMIT,
        || (stat_inbound(envoy, "replay_cache_evicted") > 0).then_some(()),
        || {
            format!(
                "its inbound counters: {:?}",
                envoy.themis_counters("inbound.")
            )
        },
    );
}

/// What a rotation replaces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Rotated {
    /// check's workload key: a new workload of check on node B.
    Workload,
    /// Node B's key: a new node (C) runs check's next instance.
    Node,
}

/// Where node C, the next node of a rotation, listens.
const IP_NEXT: &str = "127.0.0.39";

/// Issue 20, rotation without downtime: while handler calls check without pause, check's
/// key (or its node's) is replaced: the next instance is endorsed and resolved first,
/// the old one withdrawn once no caller picks it, and its key revoked through the
/// trust log last. No call fails, and after the revocation every answer comes from the
/// next key.
fn rotation_under_continuous_calls(runtime: Runtime, rotated: Rotated) {
    if !require::filter_in_envoy("runs the filter") {
        return;
    }
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Mutex;

    let mesh = Mesh::standard_on(runtime);
    let old_at = mesh.envoy_b.inbound;
    let next_node;
    let (agent, ip, workload) = match rotated {
        Rotated::Workload => (&mesh.b, IP_B, "check-next"),
        Rotated::Node => {
            next_node = support::agent::Agent::spawn(
                mesh.dir.path(),
                "agent-c",
                support::agent::Spawn {
                    listen: &format!("{IP_NEXT}:0"),
                    join: Some(&mesh.a.contact),
                    ..Default::default()
                },
            );
            next_node.wait_joined();
            (&next_node, IP_NEXT, "check")
        }
    };
    let next_id = support::mesh::create_workload(agent, workload);
    let next = mesh.start_sidecar(agent, ip, workload, "envoy-next", Some(ALLOW_HANDLER));
    next.wait_identity();
    agent.register_with(
        "check",
        workload,
        &next.inbound.to_string(),
        runtime.labels(None),
    );
    mesh.wait_resolves(
        &mesh.a,
        "check",
        &[&old_at.to_string(), &next.inbound.to_string()],
    );
    if runtime == Runtime::Native {
        mesh.envoy_a.wait_native_resolves("check", next.inbound);
    }

    let stop = AtomicBool::new(false);
    let answers: Mutex<Vec<(u16, String)>> = Mutex::new(Vec::new());
    let revoked_at = Mutex::new(usize::MAX);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            // Bounded: at most 5 minutes of calls, 20 ms apart.
            for n in 0..15_000 {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let r = mesh.call("GET", "check", &format!("/rotate/{n}"), &[], b"");
                let peer = r.header(header::PEER_ID).unwrap_or("").to_owned();
                answers.lock().unwrap().push((r.status, peer));
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        // Withdraw the old instance, and wait until handler's sidecar no longer picks it.
        let (status, answer) = mesh
            .b
            .call(
                hyper::Method::DELETE,
                "/v1/services/check/instances/check",
                None,
            )
            .unwrap();
        assert_eq!(status, 200, "{answer}");
        wait_until(
            "node A to resolve only the next instance",
            Duration::from_secs(30),
            || {
                let endpoints = mesh.a.endpoints("check")?;
                (endpoints == [next.inbound.to_string()]).then_some(())
            },
        );
        // Envoy A no longer picks the old instance: on every thread that resolved check
        // (the native module's one, or each Wasm worker, whose resolutions live
        // `resolve_ttl_secs`, 10 s), the latest resolution lists the next one only.
        let old = format!(" at {old_at}");
        wait_until_or(
            "Envoy A's resolutions of check to drop the old instance",
            Duration::from_secs(60),
            || {
                let log = mesh.envoy_a.log_tail(usize::MAX);
                let mut latest = std::collections::BTreeMap::new();
                for line in log.lines().filter(|l| l.contains(": check resolves to [")) {
                    let thread = line.split("][").nth(1).unwrap_or("");
                    latest.insert(thread.to_owned(), line.contains(&old));
                }
                (!latest.is_empty() && latest.values().all(|has_old| !has_old)).then_some(())
            },
            || mesh.envoy_a.log_tail(30),
        );
        // Then the old key goes, through the trust log.
        let retired = match rotated {
            Rotated::Workload => mesh.check_id.clone(),
            Rotated::Node => mesh.b.id.clone(),
        };
        *revoked_at.lock().unwrap() = answers.lock().unwrap().len();
        mesh.a.revoke(&retired, &mesh.dir.path().join("mesh"));
        mesh.a
            .wait_for("the revocation", Duration::from_secs(30), |a| {
                let (_, known) = a.get("/v1/revocations")?;
                known["revocations"]
                    .as_array()?
                    .iter()
                    .any(|r| r["id"] == retired.as_str())
                    .then_some(())
            });
        // Calls go on until ten more were answered, each after the revocation is known.
        let known_at = answers.lock().unwrap().len();
        wait_until(
            "ten calls answered after the revocation",
            Duration::from_secs(60),
            || (answers.lock().unwrap().len() >= known_at + 10).then_some(()),
        );
        stop.store(true, Ordering::Relaxed);
    });
    let answers = answers.into_inner().unwrap();
    let revoked_at = revoked_at.into_inner().unwrap();
    let failed: Vec<(usize, &(u16, String))> = answers
        .iter()
        .enumerate()
        .filter(|(_, (status, _))| *status != 200)
        .collect();
    assert!(
        failed.is_empty(),
        "{rotated:?}: {} of {} calls failed (call, answer), the revocation at call \
         {revoked_at}: {:?}\n{}\n--- envoy-next:\n{}\n--- agent A:\n{}",
        failed.len(),
        answers.len(),
        &failed[..failed.len().min(5)],
        mesh.logs(),
        next.log_tail(30),
        mesh.a.log_tail()
    );
    let after = &answers[revoked_at..];
    eprintln!(
        "{rotated:?} rotation ({runtime:?}): {} calls, none failed, {} after the revocation",
        answers.len(),
        after.len()
    );
    assert!(
        after.len() >= 10,
        "only {} calls after the revocation",
        after.len()
    );
    assert!(
        after.iter().all(|(_, peer)| *peer == next_id),
        "{rotated:?}: answered by another key after the revocation"
    );
}

fn a_workload_key_is_rotated_under_continuous_calls(runtime: Runtime) {
    rotation_under_continuous_calls(runtime, Rotated::Workload);
}

fn a_node_key_is_rotated_under_continuous_calls(runtime: Runtime) {
    rotation_under_continuous_calls(runtime, Rotated::Node);
}

// Every end-to-end test above runs on both runtimes of the filter, on both sidecars:
// `wasm::<test>` and `native::<test>`.
themis_testkit::on_both_runtimes!(
    handler_calls_check_by_name,
    concurrent_first_calls_share_one_resolution,
    keep_alive_calls_share_one_handshake,
    forged_themis_headers_never_reach_the_callee,
    capture_holds_no_plaintext,
    mitm_tampering_is_rejected,
    direct_plaintext_request_is_rejected,
    policy_refuses_a_caller_it_does_not_allow,
    unknown_service_and_dead_instance,
    a_call_that_arrives_before_the_app_listens_is_answered_once_it_does,
    an_admitted_node_without_a_grant_cannot_serve_or_claim_a_name,
    a_revoked_workload_is_refused_by_the_filter_and_the_agents,
    a_revocation_reaches_the_filter_at_once_not_at_its_poll_period,
    a_frozen_revocations_feed_lets_no_new_caller_in,
    a_dotted_service_name_resolves_and_is_called,
    hello_floods_are_refused_cheaply_and_counted_by_reason,
    a_flood_of_fresh_hellos_from_many_sources_is_refused_busy_and_pooled_callers_keep_going,
    a_full_replay_cache_forgets_a_hello_and_counts_it,
    a_workload_key_is_rotated_under_continuous_calls,
    a_node_key_is_rotated_under_continuous_calls,
);

// The data-path cases that matter most on the TLS binding (docs/PROTOCOL.md §8) too:
// `tls::<test>`.
themis_testkit::on_the_tls_binding!(
    handler_calls_check_by_name,
    forged_themis_headers_never_reach_the_callee,
    capture_holds_no_plaintext,
    direct_plaintext_request_is_rejected,
    policy_refuses_a_caller_it_does_not_allow,
    a_revoked_workload_is_refused_by_the_filter_and_the_agents,
    a_workload_key_is_rotated_under_continuous_calls,
);
