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

/// `check` registered at Envoy B and resolved where A's runtime needs it, and
/// `handler` where B's needs it.
fn mesh(a: Runtime, b: Runtime) -> Mesh {
    let mesh = Mesh::start_on(a, b, Some(ALLOW_HANDLER));
    mesh.register("check", "check", mesh.envoy_b.inbound);
    if b.is_native() {
        let handler_at = mesh.envoy_a.inbound;
        mesh.envoy_b.wait_native_resolves("handler", handler_at);
    }
    mesh
}

/// [`mesh`], if this machine runs the native module in Envoy.
fn started(a: Runtime, b: Runtime) -> Option<Mesh> {
    require::filter_in_envoy("runs the native module in Envoy").then(|| mesh(a, b))
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

/// The sum of Envoy's own stats on `envoy` whose name ends with `suffix` (a TLS
/// context's, a listener's: Envoy names them by cluster or address).
fn summed(envoy: &support::envoy::Envoy, suffix: &str) -> u64 {
    summed_of(envoy, "", suffix)
}

/// Envoy's own stat `name` on `envoy` (0 if it has none yet).
fn stat(envoy: &support::envoy::Envoy, name: &str) -> u64 {
    envoy
        .stats()
        .iter()
        .find(|(n, _)| *n == name)
        .map_or(0, |(_, v)| *v)
}

/// Sends small HTTP/1.1 calls from `handler` to `check` until one was carried as
/// HTTP/1.1 (the caller's worker learnt, on an HTTP/2 connection, that the callee
/// takes it), at most `calls`; each answered by `check` and attributed to it. An app
/// header that claims the carrying is ignored. Returns how many were carried so.
fn calls_carried_as_http1(mesh: &Mesh, calls: usize) -> u64 {
    let carried = || {
        stat(
            &mesh.envoy_a,
            "cluster.themis_to_check_http1.upstream_rq_total",
        )
    };
    for _ in 0..calls {
        let r = mesh.call("GET", "check", "/", &[("x-themis-carry", "http/1.1")], b"");
        assert_eq!(r.status, 200, "{r}\n{}", mesh.logs());
        assert_eq!(r.header(PEER_ID), Some(mesh.check_id.as_str()), "{r}");
        assert!(
            !r.json()["headers"].to_string().contains("x-themis-carry"),
            "{r}"
        );
        if carried() > 0 {
            break;
        }
    }
    carried()
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
    let Some(mesh) = started(Runtime::Native, Runtime::Native) else {
        return;
    };
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

    // HTTP/1.1 as the app wrote it, once the callee said (signed) that it takes it:
    // an HTTP/1.1 sealing connection, and an HTTP/1.1 codec at the callee.
    assert!(calls_carried_as_http1(&mesh, 16) >= 1, "{}", mesh.logs());
    assert!(stat(b, "http.themis_inbound.downstream_cx_http1_total") >= 1);
    assert_eq!(counter(a, "seal.refused.handshake"), 0);
}

#[test]
fn a_native_caller_reaches_a_wasm_callee() {
    let Some(mesh) = started(Runtime::Native, Runtime::Wasm) else {
        return;
    };
    // Its first delegation came before `handler` was registered.
    mesh.envoy_a.wait_seal_carries_endorsement();
    call_is_sealed_and_attributed(&mesh);
    mesh.assert_claim_checked_by_the_carried_endorsement();
    // A Wasm callee takes HTTP/2 only and never says otherwise: the native caller
    // converts every HTTP/1.1 call, whatever the app's header claims.
    assert_eq!(calls_carried_as_http1(&mesh, 8), 0);
    assert_eq!(
        stat(
            &mesh.envoy_a,
            "cluster.themis_to_check_http1.upstream_cx_total"
        ),
        0
    );
}

#[test]
fn a_wasm_caller_reaches_a_native_callee() {
    if !require::filter_in_envoy("runs the native module in Envoy") {
        return;
    }
    call_is_sealed_and_attributed(&mesh(Runtime::Wasm, Runtime::Native));
}

/// A caller that connects and never completes the handshake (silent, or stalled after
/// part of message 1) does not hold its connection: the native listener's handshake
/// deadline (its `transport_socket_connect_timeout`, rendered from the inbound
/// configuration's `handshake_timeout_secs`, 10 s by default) or the Wasm filter's
/// own closes it, unanswered, and counts it. The bound asserted is generous.
fn a_caller_that_stalls_in_the_handshake_is_closed(runtime: Runtime) {
    use std::io::{Read, Write};
    if !require::filter_in_envoy("runs the filter in Envoy") {
        return;
    }
    let mesh = mesh(runtime, runtime);
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
    // Both runtimes count the deadline's closes (the native one, Envoy's listener's).
    let timed_out = mesh
        .envoy_b
        .themis_counter("inbound.refused.handshake_timeout");
    assert_eq!(timed_out, 2, "{}", mesh.logs());
    // The callee still serves the mesh.
    let r = mesh.call("GET", "check", "/after", &[], b"");
    assert_eq!(r.status, 200, "{r}\n{}", mesh.logs());
}

#[test]
fn a_caller_that_stalls_in_the_handshake_is_closed_by_a_native_callee() {
    a_caller_that_stalls_in_the_handshake_is_closed(Runtime::Native);
}

#[test]
fn a_caller_that_stalls_in_the_handshake_is_closed_by_a_wasm_callee() {
    a_caller_that_stalls_in_the_handshake_is_closed(Runtime::Wasm);
}

/// Two ids registered for `check` at one address: which one the app was promised
/// cannot be told, so the native caller refuses to connect there (`ambiguous`)
/// rather than authenticate whichever answers.
#[test]
fn two_identities_at_one_address_are_refused_by_a_native_caller() {
    let Some(mesh) = started(Runtime::Native, Runtime::Native) else {
        return;
    };
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

/// The TLS binding end to end (docs/PROTOCOL.md §8): Envoy's own TLS 1.3 on both
/// sides, the certificate from the agent's SDS, the module
/// as Envoy's validator; the call is attributed as on the Themis channel, and the
/// callee's access log names the caller by the URI SAN TLS proved.
#[test]
fn tls_sidecars_call_each_other() {
    let Some(mesh) = started(Runtime::Tls, Runtime::Tls) else {
        return;
    };
    call_is_sealed_and_attributed(&mesh);
    let (a, b) = (&mesh.envoy_a, &mesh.envoy_b);
    assert!(counter(a, "seal.established") >= 1);
    assert!(counter(b, "inbound.allowed") >= 1);
    assert_eq!(counter(b, "inbound.refused.policy"), 0);
    // Envoy's own TLS carried it: its handshakes, TLS 1.3, and the peer's principal.
    assert!(summed(b, "ssl.versions.TLSv1.3") >= 1, "{:?}", b.stats());
    assert!(summed(a, "ssl.versions.TLSv1.3") >= 1, "{:?}", a.stats());
    b.wait_log("inbound POST /check?n=7 peer=spiffe://test/svc/handler -> 200");
}

/// `openssl s_client` to `at` with TLS 1.3, presenting `cert` (certificate, key, and
/// any chain after it) or none, then one HTTP/1.1 request: what it printed.
fn tls_client(at: std::net::SocketAddr, cert: Option<&[&std::path::Path]>) -> String {
    tls_client_with(at, cert, &[])
}

/// [`tls_client`] with more of s_client's arguments (`-sess_out FILE`, say).
fn tls_client_with(
    at: std::net::SocketAddr,
    cert: Option<&[&std::path::Path]>,
    more: &[&std::ffi::OsStr],
) -> String {
    let mut command = std::process::Command::new("openssl");
    command.args([
        "s_client",
        "-connect",
        &at.to_string(),
        "-tls1_3",
        "-alpn",
        "http/1.1",
    ]);
    command.args([
        "-servername",
        "check.test.themis.invalid",
        "-ign_eof",
        "-quiet",
    ]);
    command.args(more);
    if let Some(files) = cert {
        command.arg("-cert").arg(files[0]).arg("-key").arg(files[1]);
        if let Some(chain) = files.get(2) {
            command.arg("-cert_chain").arg(chain);
        }
    }
    let mut child = command
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("openssl");
    use std::io::Write;
    let _ = child
        .stdin
        .take()
        .unwrap()
        .write_all(b"GET /check?n=7 HTTP/1.1\r\nhost: check\r\nconnection: close\r\n\r\n");
    // s_client ends when the server closes; bounded in case it does not.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Runs `openssl` with `line`'s words; panics with its output if it fails.
fn openssl(line: &str) {
    let out = std::process::Command::new("openssl")
        .args(line.split_whitespace())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "openssl {line}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// What a TLS callee refuses in the handshake, each counted, none reaching its app: a
/// caller with no certificate, one with a CA-signed certificate (the mTLS pair's
/// kind), one with a CA chain, and a real Themis certificate of a member the policy
/// does not allow (its workload's, from the agent). A revoked caller is refused from
/// its next handshake on.
#[test]
fn a_tls_callee_refuses_in_the_handshake() {
    let Some(mesh) = started(Runtime::Tls, Runtime::Tls) else {
        return;
    };
    let b = &mesh.envoy_b;
    let dir = mesh.dir.path();
    let app_before = mesh.app.count();
    let answered = |out: &str| out.contains("HTTP/1.1 ");

    // No certificate: BoringSSL refuses before the validator runs.
    let out = tls_client(b.inbound, None);
    assert!(!answered(&out), "{out}");

    // A CA-signed certificate naming an allowed caller's principal, alone and with
    // its CA.
    let p = |name: &str| dir.join(name).display().to_string();
    let p256 = "-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes";
    openssl(&format!(
        "req -x509 {p256} -keyout {} -out {} -subj /CN=mesh-ca -days 1",
        p("ca.key"),
        p("ca.pem")
    ));
    openssl(&format!(
        "req {p256} -keyout {} -out {} -subj /CN=themis",
        p("leaf.key"),
        p("leaf.csr")
    ));
    std::fs::write(
        dir.join("leaf.ext"),
        "subjectAltName=URI:spiffe://test/svc/handler\n",
    )
    .unwrap();
    openssl(&format!(
        "x509 -req -in {} -CA {} -CAkey {} -CAcreateserial -out {} -days 1 -extfile {}",
        p("leaf.csr"),
        p("ca.pem"),
        p("ca.key"),
        p("leaf.pem"),
        p("leaf.ext")
    ));
    let before = counter(b, "inbound.refused.certificate");
    let (leaf, key, ca) = (
        dir.join("leaf.pem"),
        dir.join("leaf.key"),
        dir.join("ca.pem"),
    );
    let out = tls_client(b.inbound, Some(&[&leaf, &key]));
    assert!(!answered(&out), "{out}");
    let out = tls_client(b.inbound, Some(&[&leaf, &key, &ca]));
    assert!(!answered(&out), "{out}");
    assert_eq!(
        counter(b, "inbound.refused.certificate"),
        before + 2,
        "{}",
        mesh.logs()
    );

    // A member's own Themis certificate, which proves it, but of no allowed service.
    support::mesh::create_workload(&mesh.a, "intruder");
    let socket = mesh.a.dir.join("agent.sock");
    let [cert, key] =
        support::envoy::certificate_files(&socket, "intruder", &dir.join("intruder-tls"));
    let before = counter(b, "inbound.refused.policy");
    let out = tls_client(b.inbound, Some(&[&cert, &key]));
    assert!(!answered(&out), "{out}");
    assert_eq!(
        counter(b, "inbound.refused.policy"),
        before + 1,
        "{}",
        mesh.logs()
    );
    assert!(b
        .log_tail(usize::MAX)
        .contains("refused.policy: spiffe://test/id/test1"));

    assert_eq!(
        mesh.app.count(),
        app_before,
        "a refused caller reached the app"
    );
    // The positive control: the same client with a certificate of the allowed
    // caller (handler's, as its sidecar gets them) is answered by the app.
    // It keeps any session the callee would let it resume.
    let [cert, key] =
        support::envoy::certificate_files(&socket, "handler", &dir.join("handler-tls"));
    let session = dir.join("handler.tls-session");
    let out = tls_client_with(
        b.inbound,
        Some(&[&cert, &key]),
        &["-sess_out".as_ref(), session.as_os_str()],
    );
    assert!(out.contains("HTTP/1.1 200"), "{out}\n{}", mesh.logs());
    assert_eq!(mesh.app.count(), app_before + 1);
    // The no-certificate handshake was Envoy's own refusal.
    assert_eq!(summed(b, "ssl.fail_verify_no_cert"), 1, "{:?}", b.stats());

    // Revoked: its established (pooled) connection ends on its next bytes, and its
    // next handshakes are refused (the same certificate, within its lifetime), once
    // the callee's module holds the revocation.
    let mut kept = support::http::KeepAlive::connect(mesh.envoy_a.outbound);
    let r = kept.post("check", "/before", b"").unwrap();
    assert_eq!(r.status, 200, "{r}\n{}", mesh.logs());
    mesh.b.revoke(&mesh.handler_id, &dir.join("mesh"));
    support::process::wait_until(
        "the revoked caller's handshake to be refused",
        std::time::Duration::from_secs(30),
        || {
            let out = tls_client(b.inbound, Some(&[&cert, &key]));
            (counter(b, "inbound.refused.revoked") >= 1 && !answered(&out)).then_some(())
        },
    );
    let served = mesh.app.count();
    let out = tls_client(b.inbound, Some(&[&cert, &key]));
    assert!(!answered(&out), "{out}");
    // A resumed session would skip the validator: resumption is off, so the callee
    // issued no ticket to resume with; were one issued, offering it is refused too.
    if session.exists() {
        let out = tls_client_with(
            b.inbound,
            Some(&[&cert, &key]),
            &["-sess_in".as_ref(), session.as_os_str()],
        );
        assert!(
            !answered(&out),
            "a revoked caller resumed its session: {out}"
        );
    }
    let ssl: Vec<(String, u64)> = b
        .stats()
        .into_iter()
        .filter(|(n, _)| n.contains(".ssl."))
        .collect();
    let reused = summed(b, "ssl.session_reused");
    assert_eq!(reused, 0, "the callee resumed a session: {ssl:?}");
    let r = kept
        .post("check", "/kept", b"")
        .unwrap_or_else(|e| panic!("the kept connection: {e}\n{}", mesh.logs()));
    assert_ne!(r.status, 200, "the pooled TLS connection still serves: {r}");
    assert_eq!(
        mesh.app.count(),
        served,
        "a revoked caller's request reached the app"
    );
    assert!(
        b.log_tail(usize::MAX)
            .contains("was revoked; its connection ends"),
        "{}",
        mesh.logs()
    );
}

/// Envoy's own features see a TLS peer: a stock `envoy.filters.network.rbac` on the
/// callee's inbound chain, by the URI SAN, admits the caller it names and refuses
/// one it does not (Envoy's RBAC counts both), with no Themis code in the decision.
#[test]
fn envoys_own_rbac_decides_on_a_tls_peer_by_its_uri_san() {
    let Some(mesh) = started(Runtime::Tls, Runtime::Tls) else {
        return;
    };
    let dir = mesh.dir.path();
    let rendered = std::fs::read_to_string(dir.join("envoy-b.yaml")).unwrap();
    // As `themis sidecar render --rbac-principal` writes it.
    let with_rbac = |principal: &str| {
        let yaml = themis_bootstrap::with_rbac(&rendered, &[principal.to_owned()]);
        assert_eq!(yaml.matches("envoy.filters.network.rbac").count(), 1);
        yaml
    };
    for (service, principal, admitted) in [
        ("check-open", "spiffe://test/svc/handler", true),
        ("check-limited", "spiffe://test/svc/payments", false),
    ] {
        let envoy = support::envoy::Envoy::start_yaml(dir, service, &with_rbac(principal));
        mesh.register(service, "check", envoy.inbound);
        let served = mesh.app.count();
        let r = mesh.call("GET", service, "/check?n=7", &[], b"");
        let rbac = |name: &str| stat(&envoy, &format!("themis_rbac.rbac.{name}"));
        match admitted {
            true => {
                assert_eq!(r.status, 200, "{r}\n{}", mesh.logs());
                assert_eq!(rbac("allowed"), 1, "{:?}", envoy.stats());
                assert_eq!(mesh.app.count(), served + 1);
            }
            false => {
                assert_ne!(r.status, 200, "{r}");
                assert!(rbac("denied") >= 1, "{:?}", envoy.stats());
                assert_eq!(mesh.app.count(), served, "a denied caller reached the app");
            }
        }
    }
}

/// The requests of `cluster` on `envoy` so far (Envoy's `upstream_rq_total`).
fn requests_of(envoy: &support::envoy::Envoy, cluster: &str) -> u64 {
    stat(envoy, &format!("cluster.{cluster}.upstream_rq_total"))
}

/// Negotiated by what the callee's record signs (docs/PROTOCOL.md §8.7): a sidecar
/// that speaks TLS and the Themis channel calls a callee whose record names no
/// transport (an older peer: the channel alone) over the channel, and one whose
/// record names `tls` over TLS, from the same outbound listener.
#[test]
fn a_caller_takes_the_transport_the_callees_record_names() {
    let Some(mesh) = started(Runtime::TlsAndChannel, Runtime::Native) else {
        return;
    };
    let a = &mesh.envoy_a;
    call_is_sealed_and_attributed(&mesh);
    assert!(requests_of(a, "themis_to_check") >= 1, "{:?}", a.stats());
    assert_eq!(requests_of(a, "themis_tls"), 0, "{:?}", a.stats());

    // A TLS-only sidecar of the same workload, its record naming tls.
    let tls = mesh.start_sidecar_on(
        Runtime::Tls,
        (&mesh.b, support::mesh::IP_B, "check"),
        "envoy-tls",
        Some(ALLOW_HANDLER),
    );
    tls.wait_identity();
    let at = tls.inbound.to_string();
    mesh.b
        .register_with("check-open", "check", &at, Runtime::Tls.labels(None));
    mesh.wait_resolves(&mesh.a, "check-open", &[&at]);
    a.wait_native_resolves("check-open", tls.inbound);
    tls.wait_endorsed_certificate("check-open");
    let served = mesh.app.count();
    let r = mesh.call("GET", "check-open", "/", &[], b"");
    assert_eq!(r.status, 200, "{r}\n{}", mesh.logs());
    assert_eq!(r.header(PEER_ID), Some(mesh.check_id.as_str()), "{r}");
    assert_eq!(mesh.app.count(), served + 1);
    assert_eq!(requests_of(a, "themis_tls"), 1, "{:?}", a.stats());
    assert_eq!(requests_of(a, "themis_to_check-open"), 0);
    assert!(
        summed(&tls, "ssl.versions.TLSv1.3") >= 1,
        "{:?}",
        tls.stats()
    );
}

/// A callee that takes both: a Wasm caller (the channel alone) is answered over the
/// channel's chain, a TLS caller (the handler's certificate, from its agent) over the
/// TLS chain, on the one inbound listener; the policy holds on both.
#[test]
fn a_callee_that_takes_both_answers_a_wasm_caller_and_a_tls_caller() {
    let Some(mesh) = started(Runtime::Wasm, Runtime::TlsAndChannel) else {
        return;
    };
    let b = &mesh.envoy_b;
    call_is_sealed_and_attributed(&mesh);
    assert!(counter(b, "inbound.allowed") >= 1, "{}", mesh.logs());
    let tls_handshakes = |envoy: &support::envoy::Envoy| summed(envoy, "ssl.handshake");
    assert_eq!(tls_handshakes(b), 0, "the Wasm caller's bytes went to TLS");

    let dir = mesh.dir.path();
    let socket = mesh.a.dir.join("agent.sock");
    let [cert, key] =
        support::envoy::certificate_files(&socket, "handler", &dir.join("handler-tls"));
    let served = mesh.app.count();
    let out = tls_client(b.inbound, Some(&[&cert, &key]));
    assert!(out.contains("HTTP/1.1 200"), "{out}\n{}", mesh.logs());
    assert_eq!(mesh.app.count(), served + 1);
    assert_eq!(tls_handshakes(b), 1, "{:?}", b.stats());
    // Not allowed on TLS either: a member of no allowed service.
    support::mesh::create_workload(&mesh.a, "intruder");
    let [cert, key] =
        support::envoy::certificate_files(&socket, "intruder", &dir.join("intruder-tls"));
    let out = tls_client(b.inbound, Some(&[&cert, &key]));
    assert!(!out.contains("HTTP/1.1 "), "{out}");
    assert_eq!(
        mesh.app.count(),
        served + 1,
        "a refused caller reached the app"
    );
}

/// No downgrade: a TLS-only callee is never called over the channel. A caller that
/// speaks the channel alone does not call it (its record names tls: 503, no
/// connection), and bytes of the channel sent to it anyway (under a record that names
/// no transport, as a rogue node could sign for its own service) are refused by
/// Envoy's TLS before anything reaches the app.
#[test]
fn a_tls_only_callee_is_not_called_over_the_channel() {
    let Some(mesh) = started(Runtime::Wasm, Runtime::Tls) else {
        return;
    };
    let b = &mesh.envoy_b;
    // Its listeners on node B's address (Envoy names their stats by the address as
    // configured, port 0: the two share them; nothing calls its outbound one).
    let listeners = format!("listener.{}_", b.inbound.ip());
    let connections = || -> u64 {
        b.stats()
            .iter()
            .filter(|(n, _)| n.starts_with(&listeners) && n.ends_with(".downstream_cx_total"))
            .map(|(_, v)| *v)
            .sum()
    };
    let before = connections();
    let served = mesh.app.count();
    let r = mesh.call("GET", "check", "/", &[], b"");
    assert_eq!(r.status, 503, "{r}");
    assert_eq!(r.header("x-themis-reject"), Some("no_instance"), "{r}");
    assert!(
        mesh.envoy_a.log_tail(usize::MAX).contains(
            r#"takes "tls" (its record's themis.transport), and this sidecar speaks themis"#
        ),
        "{}",
        mesh.logs()
    );
    assert_eq!(connections(), before, "the channel's caller connected");

    // The same listener under a record that says nothing of TLS.
    let at = b.inbound.to_string();
    mesh.b.register("check-lied", "check", &at);
    mesh.wait_resolves(&mesh.a, "check-lied", &[&at]);
    let errors = |envoy: &support::envoy::Envoy| summed(envoy, "ssl.connection_error");
    let r = mesh.call("GET", "check-lied", "/", &[], b"");
    assert_ne!(r.status, 200, "{r}");
    assert!(
        connections() > before,
        "the channel's caller never connected: {r}"
    );
    assert!(errors(b) >= 1, "{:?}", b.stats());
    assert_eq!(
        mesh.app.count(),
        served,
        "a channel caller reached a TLS-only app"
    );
}

/// `yaml` (the TLS binding's bootstrap) with its inbound HTTP connection manager
/// closing every connection after one request: each call to it a new handshake.
fn one_request_per_connection(yaml: String) -> String {
    let inbound = yaml
        .find("stat_prefix: themis_inbound")
        .expect("an inbound HTTP connection manager");
    let options = "common_http_protocol_options: {headers_with_underscores_action: DROP_HEADER";
    let at = inbound
        + yaml[inbound..]
            .find(options)
            .expect("its common HTTP protocol options")
        + options.len();
    format!(
        "{}, max_requests_per_connection: 1{}",
        &yaml[..at],
        &yaml[at..]
    )
}

/// The sum of `envoy`'s stats named `prefix`…`suffix`.
fn summed_of(envoy: &support::envoy::Envoy, prefix: &str, suffix: &str) -> u64 {
    envoy
        .stats()
        .iter()
        .filter(|(n, _)| n.starts_with(prefix) && n.ends_with(suffix))
        .map(|(_, v)| *v)
        .sum()
}

/// Certificates rotate under calls that each take a fresh handshake, and none fails:
/// the agent's SDS pushes both sidecars a new certificate every few seconds (the
/// tests' records live 10 s, and a certificate is renewed with its record), and the
/// callee closes every connection after one request, so each call is a new TLS 1.3
/// handshake, checked by both validators against the certificates then current.
#[test]
fn certificates_rotate_under_calls_that_each_take_a_fresh_handshake() {
    let Some(mesh) = started(Runtime::Tls, Runtime::Tls) else {
        return;
    };
    let once = mesh.start_edited_sidecar_on(
        Runtime::Tls,
        (&mesh.b, support::mesh::IP_B, "check"),
        "envoy-once",
        Some(ALLOW_HANDLER),
        &one_request_per_connection,
    );
    once.wait_identity();
    let at = once.inbound.to_string();
    mesh.b
        .register_with("check-open", "check", &at, Runtime::Tls.labels(None));
    mesh.wait_resolves(&mesh.a, "check-open", &[&at]);
    mesh.envoy_a
        .wait_native_resolves("check-open", once.inbound);
    once.wait_endorsed_certificate("check-open");

    let a = &mesh.envoy_a;
    let certificates = |envoy: &support::envoy::Envoy| summed_of(envoy, "sds.", ".update_success");
    let handshakes = || summed_of(&once, "listener.", "ssl.handshake");
    let (a_before, b_before, handshakes_before) =
        (certificates(a), certificates(&once), handshakes());
    assert!(
        a_before >= 1 && b_before >= 1,
        "no SDS certificate counted: {:?}",
        once.stats()
    );
    let mut answers: Vec<(u16, Option<String>)> = Vec::new();
    // Bounded: at most 90 s of calls, 40 ms apart, until each side took three more
    // certificates.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(90);
    while certificates(a) < a_before + 3 || certificates(&once) < b_before + 3 {
        assert!(
            std::time::Instant::now() < deadline,
            "three rotations took over 90 s (A {a_before} → {}, B {b_before} → {})",
            certificates(a),
            certificates(&once)
        );
        let r = mesh.call(
            "GET",
            "check-open",
            &format!("/rotate/{}", answers.len()),
            &[],
            b"",
        );
        answers.push((r.status, r.header(PEER_ID).map(str::to_owned)));
        std::thread::sleep(std::time::Duration::from_millis(40));
    }
    let failed: Vec<&(u16, Option<String>)> = answers
        .iter()
        .filter(|(status, peer)| *status != 200 || peer.as_deref() != Some(mesh.check_id.as_str()))
        .collect();
    assert!(
        failed.is_empty(),
        "{} of {} calls failed across the rotations: {:?}\n{}\n--- envoy-once:\n{}",
        failed.len(),
        answers.len(),
        &failed[..failed.len().min(5)],
        mesh.logs(),
        once.log_tail(30)
    );
    let fresh = handshakes() - handshakes_before;
    assert!(
        fresh >= answers.len() as u64,
        "{fresh} handshakes for {} calls: the calls shared connections",
        answers.len()
    );
    eprintln!(
        "{} calls, each a fresh handshake ({fresh}), across {} and {} new certificates",
        answers.len(),
        certificates(a) - a_before,
        certificates(&once) - b_before
    );
}

/// The sum of Envoy B's TLS connection errors on its listeners (BoringSSL refused a
/// record, or the handshake).
fn tls_errors(envoy: &support::envoy::Envoy) -> u64 {
    summed_of(envoy, "listener.", ".ssl.connection_error")
}

/// A man in the middle on the TLS binding sees TLS records only, and gets nothing of
/// his through: a whole recorded connection replayed, and each record tampered with
/// (a bit flipped, one cut short, two swapped, plaintext in place of one, and record
/// 0, the caller's encrypted Certificate and Finished, flipped on a new connection),
/// fails the call, never reaches the app, and is counted by Envoy B as a TLS error.
#[test]
fn a_man_in_the_middle_of_a_tls_connection_gets_nothing_through() {
    use support::mitm::{self, Framing, Mitm, Mode};
    if !require::filter_in_envoy("runs the native module in Envoy") {
        return;
    }
    let mesh = Mesh::start_on(Runtime::Tls, Runtime::Tls, Some(ALLOW_HANDLER));
    let b = &mesh.envoy_b;
    let mitm = Mitm::start_framed(support::mesh::IP_B, b.inbound, Framing::Tls);
    mesh.register("check", "check", mitm.addr);
    b.wait_endorsed_certificate("check");
    // Bodies of several TLS records (16 KiB each), so that there is a next to swap with.
    let body: Vec<u8> = (0..200 * 1024u32)
        .map(|i| b'a' + (i * 7 % 26) as u8)
        .collect();
    let call = |path: &str| mesh.call("POST", "check", path, &[], &body);

    let recorded = mitm::pass_through(&mesh, &mitm, &body);

    // The recorded connection again, straight to B: B's fresh ServerHello makes other
    // keys, so the caller's recorded flight no longer decrypts.
    let before = tls_errors(b);
    let replayed = mitm::replay(b.inbound, &recorded[0].to_b, false);
    assert!(replayed.closed, "Envoy B kept the replayed connection open");
    support::process::wait_until_or(
        "the replay to be counted as a TLS error",
        std::time::Duration::from_secs(10),
        || (tls_errors(b) > before).then_some(()),
        || format!("{:?}", b.stats()),
    );
    assert_eq!(mesh.app.count(), 2, "the replay reached the app");

    const PLAINTEXT: &[u8] = b"GET /secret HTTP/1.1\r\nhost: check\r\n\r\n";
    let cases = [
        Mode::Flip(1),
        Mode::Truncate(1),
        Mode::Reorder(1),
        Mode::Inject(1, PLAINTEXT),
        Mode::Flip(0),
    ];
    for (n, mode) in cases.into_iter().enumerate() {
        if mode == Mode::Flip(0) {
            // The caller's handshake flight: only on a new connection.
            mitm.disconnect();
        }
        // A record cut short, then the close, is no TLS error to BoringSSL: B sees the
        // caller go mid-stream, and drops what it began.
        let refused = |b: &support::envoy::Envoy| match mode {
            Mode::Truncate(_) => {
                summed_of(b, "http.themis_inbound.", "downstream_cx_destroy_remote")
            }
            _ => tls_errors(b),
        };
        let errors = refused(b);
        mitm::tampered_call(&mesh, &mitm, mode, &format!("/tampered/{n}"), &body);
        support::process::wait_until_or(
            &format!("{mode:?}: Envoy B to count the refusal"),
            std::time::Duration::from_secs(10),
            || (refused(b) > errors).then_some(()),
            || format!("{:?}", b.stats()),
        );
    }

    // And the mesh recovers once the proxy behaves.
    let r = call("/after");
    assert_eq!(r.status, 200, "{r}\n{}", mesh.logs());
    assert_eq!(mesh.app.count(), 3);
}
