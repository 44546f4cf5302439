//! The endorsement a caller carries in message 1 (wire v3) is checked, end to end,
//! with the real Envoy B on both runtimes and real agents. A test-only caller, made
//! from the protocol core's stream initiator with a delegated key of its own, claims
//! `handler` to Envoy B (`allow service handler`). Its id is registered nowhere, so
//! only what it carries can make its claim count: a resolution lists it for no
//! service. It carries, each on a connection of its own:
//!
//! * a genuine endorsement (node A's record for this very id, under node A's grant
//!   of `handler`): the positive control, allowed by the endorsement it carried;
//! * a forged one (the record and its grant signed by the caller's own key);
//! * a withdrawn one (node A's genuine tombstone for this id: no endpoint);
//! * another id's (node A's genuine record, for a key that is not the caller's).
//!
//! Each of the last three is refused: the call gets no answer, Envoy B counts a
//! `refused.policy`, and the app receives nothing.

use themis_testkit as support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use ring::rand::SystemRandom;
use support::agent::MESH;
use support::mesh::{Mesh, Runtime};
use support::process::wait_until_or;
use support::{intruder, require};
use themis_core::stream::{Meta, StreamInitiator};
use themis_core::{
    Credential, DelegatedKey, Delegation, HandshakeConfig, Identity, MeshName, PeerId,
};
use themis_trust::{Grant, InstanceValue, Metadata, Record, Signed, GRANT_LABEL, RECORD_LABEL};

/// How long a counter gets to show what just happened.
const COUNT_LIMIT: Duration = Duration::from_secs(10);

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// `signer`'s record of `workload_key` as an instance of `handler` at `endpoint`
/// (`None`: a tombstone), valid for a minute, under `grants`: an encoded
/// `InstanceValue`, as agents store it and sidecars carry it.
fn endorsement(
    signer: &Identity,
    grants: Vec<Signed>,
    workload_key: [u8; 32],
    endpoint: Option<SocketAddr>,
) -> Vec<u8> {
    let now = now_ms();
    let record = Record {
        mesh: MESH.into(),
        service: "handler".into(),
        workload_key,
        endpoint,
        metadata: Metadata::new(),
        issued_at: now,
        not_after: now + 60_000,
    };
    InstanceValue {
        grants,
        record: Signed::sign(signer, RECORD_LABEL, &record),
    }
    .encode()
}

/// What one call of the test-only caller came to.
#[derive(Debug, Default)]
struct Called {
    /// Whether the session opened (message 2 verified): a refusal comes after it.
    opened: bool,
    /// The response's first header block (HPACK) and body, if one came: HTTP/2
    /// frames of stream 1. (Envoy B's HTTP/2 server speaks first, its SETTINGS riding
    /// on message 2, so plaintext comes back even on a refused connection.)
    headers: Option<Vec<u8>>,
    body: Vec<u8>,
}

impl Called {
    /// An answer `:status 200` (HPACK static index 8) whose body has `marker`.
    fn answered_200_with(&self, marker: &str) -> bool {
        self.headers
            .as_deref()
            .is_some_and(|h| h.first() == Some(&0x88))
            && String::from_utf8_lossy(&self.body).contains(marker)
    }
}

/// An HTTP/2 frame.
fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut f = (payload.len() as u32).to_be_bytes()[1..].to_vec();
    f.extend_from_slice(&[kind, flags]);
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

const DATA: u8 = 0;
const HEADERS: u8 = 1;
const SETTINGS: u8 = 4;
const END_STREAM: u8 = 1;
const END_HEADERS: u8 = 4;
const ACK: u8 = 1;

/// The client preface, SETTINGS and `GET path` on stream 1 (HPACK: `:method GET`,
/// `:scheme http` indexed; `:path` and `:authority check` literal, not indexed).
fn h2_get(path: &str) -> Vec<u8> {
    let mut block = vec![0x82, 0x86, 0x04, path.len() as u8];
    block.extend_from_slice(path.as_bytes());
    block.extend_from_slice(&[0x01, 5]);
    block.extend_from_slice(b"check");
    let mut bytes = themis_core::stream::HTTP2_PREFACE.to_vec();
    bytes.extend(frame(SETTINGS, 0, 0, &[]));
    bytes.extend(frame(HEADERS, END_STREAM | END_HEADERS, 1, &block));
    bytes
}

/// Calls `check` at Envoy B (`to`, id `peer`) as `me`, claiming `handler` and carrying
/// `endorsement`, with one HTTP/2 request for `path`; reads until stream 1 ends or
/// Envoy B closes the connection.
fn call_carrying(
    me: &Identity,
    endorsement: Vec<u8>,
    to: SocketAddr,
    peer: PeerId,
    path: &str,
) -> Called {
    let rng = SystemRandom::new();
    let now = now_ms();
    // A delegated key, as a sidecar signs with (wire v3); the endorsement rides with it.
    let key = DelegatedKey::generate(&rng).unwrap();
    let delegation = Delegation::issue(me, *key.public_key(), now, 3_600_000);
    let credential = Credential::new(me.public().clone(), key, delegation, endorsement, now)
        .expect("a delegation of our own");
    let meta = Meta {
        service: Some("handler".into()),
    };
    let (mut stream, hello) = StreamInitiator::start(
        &credential,
        peer,
        meta,
        &HandshakeConfig::default(),
        now,
        &rng,
    )
    .unwrap();
    let held = stream.from_app(&h2_get(path)).unwrap();
    assert!(held.is_empty(), "held until the session opens");

    let mut tcp = TcpStream::connect(to).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    tcp.write_all(&hello).unwrap();
    let mut called = Called::default();
    let (mut plain, mut buf) = (Vec::new(), [0u8; 16 * 1024]);
    let mut ended = false;
    while !ended {
        let n = match tcp.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                panic!("Envoy B neither answered nor closed within 20 s")
            }
            // A reset after a refusal: closed too.
            Err(_) => break,
        };
        let out = match stream.from_peer(&buf[..n]) {
            Ok(out) => out,
            Err(refusal) => panic!("Envoy B sent what the caller refuses: {refusal}"),
        };
        let mut to_peer = out.to_peer;
        plain.extend_from_slice(&out.to_app);
        // Whole frames: stream 1's headers and body; SETTINGS acknowledged.
        while plain.len() >= 9 {
            let len = u32::from_be_bytes([0, plain[0], plain[1], plain[2]]) as usize;
            if plain.len() < 9 + len {
                break;
            }
            let (kind, flags) = (plain[3], plain[4]);
            let id = u32::from_be_bytes([plain[5], plain[6], plain[7], plain[8]]) & 0x7fff_ffff;
            let payload = plain[9..9 + len].to_vec();
            plain.drain(..9 + len);
            match (kind, id) {
                (SETTINGS, 0) if flags & ACK == 0 => {
                    to_peer.extend(stream.from_app(&frame(SETTINGS, ACK, 0, &[])).unwrap())
                }
                (HEADERS, 1) => {
                    called.headers.get_or_insert(payload);
                }
                (DATA, 1) => called.body.extend_from_slice(&payload),
                _ => {}
            }
            if id == 1 && matches!(kind, HEADERS | DATA) && flags & END_STREAM != 0 {
                ended = true;
            }
        }
        if !to_peer.is_empty() && tcp.write_all(&to_peer).is_err() {
            break;
        }
    }
    called.opened = stream.is_open();
    called
}

/// Resolutions agent B served (from its cache or the DHT): what its sidecars asked.
fn resolutions(mesh: &Mesh) -> u64 {
    let text = support::agent::scrape(mesh.b_metrics).expect("agent B's metrics");
    ["hit", "miss"]
        .iter()
        .map(|r| support::agent::sample(&text, "themis_resolve_cache_total", &[("result", r)]))
        .sum()
}

fn carried_endorsements_are_checked(runtime: Runtime) {
    if !require::filter_in_envoy("runs the filter") {
        return;
    }
    let mesh = Mesh::standard_on(runtime);
    let mesh_name = MeshName::new(MESH).unwrap();
    let (_, check) = PeerId::parse(&mesh.check_id).unwrap();
    let to = mesh.envoy_b.inbound;

    // Node A's key and its grant of `handler` (it runs handler): what a genuine
    // endorsement is made of.
    mesh.a.grant("handler");
    let node_a = Identity::from_key_file(
        mesh_name.clone(),
        &std::fs::read_to_string(mesh.a.dir.join("node.key")).unwrap(),
    )
    .unwrap();
    let grant_a = themis_trust::chain_from_pem(
        &std::fs::read_to_string(mesh.a.dir.join("grants/handler.pem")).unwrap(),
    )
    .unwrap();

    // The caller: a key of its own (a valid id in the mesh), registered nowhere.
    let caller = intruder::self_made_key(MESH);
    let someone_else = intruder::self_made_key(MESH);
    let caller_key = *caller.public_key();
    let at: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let self_grant = vec![Signed::sign(
        &caller,
        GRANT_LABEL,
        &Grant {
            mesh: MESH.into(),
            service: "handler".into(),
            grantee: caller_key,
            delegate: false,
            issued_at: now_ms(),
            not_after: None,
        },
    )];
    let genuine = endorsement(&node_a, grant_a.clone(), caller_key, Some(at));
    let forged = endorsement(&caller, self_grant, caller_key, Some(at));
    let withdrawn = endorsement(&node_a, grant_a.clone(), caller_key, None);
    let others = endorsement(&node_a, grant_a, *someone_else.public_key(), Some(at));

    let refused = || mesh.envoy_b.themis_counter("inbound.refused.policy");
    let allowed = || mesh.envoy_b.themis_counter("inbound.allowed");

    // The positive control: the same caller, path and claim with the genuine one.
    // The caller's id is registered nowhere, so only the endorsement can let it in;
    // and agent B is asked for no resolution (the claim is checked offline).
    let asked = resolutions(&mesh);
    let called = call_carrying(&caller, genuine, to, check, "/endorsed");
    assert!(
        called.answered_200_with(&mesh.app_marker),
        "a caller carrying a genuine endorsement was not answered by the app: {called:?} \
         ({:?})\n{}",
        String::from_utf8_lossy(&called.body),
        mesh.logs()
    );
    assert_eq!(mesh.app.count(), 1);
    assert_eq!(
        resolutions(&mesh),
        asked,
        "the callee resolved a claim the endorsement proves\n{}",
        mesh.logs()
    );
    // The Wasm callee also says so (the native module logs no allowed connection).
    if runtime == Runtime::Wasm {
        let log = std::fs::read_to_string(mesh.envoy_b.log_path()).unwrap_or_default();
        assert!(
            log.contains(&format!(
                "{} (service Some(\"handler\"), by the endorsement it carried) connected",
                caller.printable_id()
            )),
            "the genuine endorsement was not what let the caller in:\n{}",
            mesh.logs()
        );
    }
    assert_eq!(refused(), 0, "{}", mesh.logs());

    for (what, carried) in [
        ("a forged endorsement", forged),
        ("a withdrawn endorsement (a tombstone)", withdrawn),
        ("another id's endorsement", others),
    ] {
        let (before, let_in, served) = (refused(), allowed(), mesh.app.count());
        let called = call_carrying(&caller, carried, to, check, "/not-endorsed");
        assert!(
            called.opened,
            "{what}: the key agreement itself failed, so the endorsement was never checked"
        );
        assert!(
            called.headers.is_none() && called.body.is_empty(),
            "{what}: Envoy B answered {called:?}\n{}",
            mesh.logs()
        );
        wait_until_or(
            &format!("{what}: Envoy B to count refused.policy"),
            COUNT_LIMIT,
            || (refused() > before).then_some(()),
            || mesh.logs(),
        );
        assert_eq!(allowed(), let_in, "{what}: counted as allowed");
        assert_eq!(
            mesh.app.count(),
            served,
            "{what}: the app received the call"
        );
    }
}

themis_testkit::on_both_runtimes!(carried_endorsements_are_checked);
