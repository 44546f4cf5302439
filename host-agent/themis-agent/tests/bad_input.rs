//! Bad input on every entry point is rejected with a reason, counted, and the agent
//! keeps serving.
//!
//! Real `themis agent` processes on loopback, each with its metrics on a port of its
//! own; this test process plays the attacker on every door the agent has: raw bytes
//! on the agent-to-agent port before any handshake, handshakes from identities that
//! do not add up, an authenticated agent sending frames the overlay must refuse, a
//! fake agent that answers lookups without progress, the local API and the `themis`
//! tool, and records in the DHT that do not verify. Each case checks the exact reason
//! the agent gives (in its answer and in its counters) and then that it still serves.

use themis_testkit::agent as common;

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::BytesMut;
use common::{sample, Agent, Metered, MESH};
use ring::digest;
use ring::rand::{SecureRandom, SystemRandom};
use ring::signature::{Ed25519KeyPair, KeyPair};
use serde_json::{json, Value};
use themis_agent::gossip::RosterFrame;
use themis_agent::overlay::Frame;
use themis_agent::roster::Credentials;
use themis_agent_client::Method;
use themis_core::handshake::Initiator;
use themis_core::wire::{
    self, Hello, HelloBody, Kind, RecordHeader, Signature, MAX_RECORD_PAYLOAD, PROTOCOL_VERSION,
    TAG_LEN,
};
use themis_core::{HandshakeConfig, Identity, MeshName, PeerId, SessionInfo};
use themis_dht::message::{MAX_AVOID, MAX_VALUE_LEN};
use themis_dht::{in_open, Contact, Key, Message, Object, Request, Response};
use themis_testkit::process::poll_until;
use themis_trust::{
    chain_from_pem, Admission, Announcement, Grant, InstanceValue, Record, Signed, ADMISSION_LABEL,
    ANNOUNCEMENT_LABEL, GRANT_LABEL, RECORD_LABEL,
};

// ---- helpers -------------------------------------------------------------------------

/// How long a counter may take to show a change: DHT counters are copied out of the
/// node once a second, and a refused connection is counted just after it is closed.
const COUNTER_WAIT: Duration = Duration::from_secs(15);

/// A listening address that nobody listens on, named as "where I accept agent
/// connections" by test peers that never get called back.
fn nowhere() -> SocketAddr {
    "127.0.0.1:9".parse().unwrap()
}

fn identity(mesh: &str) -> Identity {
    Identity::generate(MeshName::new(mesh).unwrap(), &SystemRandom::new()).unwrap()
}

fn random_bytes<const N: usize>() -> [u8; N] {
    let mut out = [0u8; N];
    SystemRandom::new().fill(&mut out).unwrap();
    out
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn encode(frame: &Frame) -> Vec<u8> {
    postcard::to_allocvec(frame).unwrap()
}

/// A DHT request frame from the peer whose admission credential is `admission`.
fn dht(listen: SocketAddr, admission: &[u8], id: u64, body: Request<SocketAddr>) -> Vec<u8> {
    encode(&Frame::Dht {
        listen,
        admission: admission.to_vec(),
        message: Message::Request { id, body },
    })
}

/// A test peer the mesh operator admitted (`themis node admit`): its key and its
/// encoded admission. Hostile peers need one to reach the DHT at all.
struct Admitted {
    me: Identity,
    admission: Vec<u8>,
}

impl Admitted {
    /// Admits (once) the node `root/name` in the test mesh and loads its credentials.
    fn new(root: &Path, name: &str) -> Admitted {
        let (me, admission) = common::admitted_peer(root, name);
        Admitted { me, admission }
    }

    /// A DHT request frame from this peer.
    fn dht(&self, listen: SocketAddr, id: u64, body: Request<SocketAddr>) -> Vec<u8> {
        dht(listen, &self.admission, id, body)
    }
}

/// Waits on a metered agent's counters (a trait: [`Metered`] is the test kit's).
trait Counters {
    fn wait_at_least(&self, name: &str, labels: &[(&str, &str)], at_least: u64) -> u64;
    fn expect(&self, name: &str, labels: &[(&str, &str)], want: u64);
}

impl Counters for Metered {
    /// Waits until the sample reaches `at_least`; returns it.
    fn wait_at_least(&self, name: &str, labels: &[(&str, &str)], at_least: u64) -> u64 {
        let (mut text, mut v) = (String::new(), 0);
        let reached = poll_until(COUNTER_WAIT, || {
            text = self.scrape();
            v = sample(&text, name, labels);
            (v >= at_least).then_some(v)
        });
        assert!(
            reached.is_some(),
            "{}: {name}{labels:?} is {v}, expected at least {at_least}\n{}\nlog:\n{}",
            self.agent.name,
            relevant(&text),
            self.agent.log_tail()
        );
        v
    }

    /// Waits until the sample reaches `want`, and checks it went no further.
    fn expect(&self, name: &str, labels: &[(&str, &str)], want: u64) {
        let got = self.wait_at_least(name, labels, want);
        assert_eq!(got, want, "{}: {name}{labels:?}", self.agent.name);
    }
}

fn key_of(agent: &Agent) -> Key {
    Key(PeerId::parse(&agent.id).unwrap().1 .0)
}

/// The counters these tests look at, for failure messages.
fn relevant(text: &str) -> String {
    text.lines()
        .filter(|l| {
            !l.starts_with('#')
                && [
                    "channel_failures",
                    "frames_refused",
                    "dht_rejections",
                    "records_refused",
                    "handshakes",
                ]
                .iter()
                .any(|m| l.contains(m))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn inbound(reason: &str) -> [(&str, &str); 2] {
    [("direction", "inbound"), ("reason", reason)]
}

const CHANNEL_FAILURES: &str = "themis_channel_failures_total";
const FRAMES_REFUSED: &str = "themis_frames_refused_total";
const DHT_REJECTIONS: &str = "themis_dht_rejections_total";
const RECORDS_REFUSED: &str = "themis_registry_records_refused_total";
const HANDSHAKES: &str = "themis_handshakes_total";

/// Waits until the agent closes `s` without having sent a byte.
fn expect_closed_unanswered(s: &mut TcpStream, what: &str) {
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut buf = [0u8; 1024];
    match s.read(&mut buf) {
        Ok(0) => {}
        // The agent closed with our bytes unread: the kernel resets instead.
        Err(e) if e.kind() == ErrorKind::ConnectionReset => {}
        Ok(n) => panic!("{what}: the agent answered {n} bytes: {:02x?}", &buf[..n]),
        Err(e) => panic!("{what}: the connection was not closed: {e}"),
    }
}

/// Connects, sends `bytes` and waits until the agent hangs up without a word.
fn send_raw(addr: SocketAddr, bytes: &[u8], what: &str) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(bytes).unwrap();
    expect_closed_unanswered(&mut s, what);
}

/// Reads one whole handshake message or record.
fn read_message(s: &mut TcpStream) -> Vec<u8> {
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    loop {
        if let Some(len) = wire::frame_len(&buf).unwrap() {
            if buf.len() >= len {
                buf.truncate(len);
                return buf;
            }
        }
        let n = s.read(&mut chunk).unwrap();
        assert!(n > 0, "the agent closed the connection mid-handshake");
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// Message 1 with `body`, signed by `key` (docs/PROTOCOL.md §3.1).
fn signed_hello(body: &HelloBody<'_>, key: &Ed25519KeyPair) -> Vec<u8> {
    let mut bytes = postcard::to_allocvec(body).unwrap();
    let mut ctx = digest::Context::new(&digest::SHA256);
    ctx.update(b"themis/1 hello signature");
    ctx.update(&bytes);
    let sig: [u8; 64] = key.sign(ctx.finish().as_ref()).as_ref().try_into().unwrap();
    bytes.extend(postcard::to_allocvec(&Signature(sig)).unwrap());
    bytes
}

/// A full handshake as an admitted node of the mesh, then a `Ping`: the agent still
/// accepts agents and answers them, with its own admission in the answer.
fn ping_works(rt: &tokio::runtime::Runtime, agent: &Metered) {
    let peer = Admitted::new(&agent.root, "pinger");
    let answer = rt.block_on(async {
        let mut stream = themis_net::connect(
            &peer.me,
            agent.listen(),
            agent.peer_id(),
            &themis_net::Config::default(),
        )
        .await
        .unwrap();
        stream
            .request(&peer.dht(nowhere(), 77, Request::Ping))
            .await
            .unwrap()
    });
    match postcard::from_bytes::<Frame>(&answer).unwrap() {
        Frame::Dht {
            listen,
            admission,
            message: Message::Response { id: 77, body },
        } => {
            assert_eq!(body, Response::Ack);
            assert_eq!(listen, agent.listen());
            let root = mesh_root(&agent.root);
            let revoked = themis_trust::Revocations::new();
            let verifier = themis_trust::Verifier {
                root: &root,
                now_ms: now_ms(),
                revoked: &revoked,
            };
            verifier
                .admission_of(&admission, &agent.peer_id())
                .expect("the agent's answer carries its own admission");
        }
        other => panic!("{}: a ping got {other:?}", agent.agent.name),
    }
}

/// The test mesh's public root.
fn mesh_root(root: &Path) -> themis_trust::MeshRoot {
    let text = std::fs::read_to_string(common::mesh_dir(root).join("mesh.root")).unwrap();
    text.parse().unwrap()
}

/// Unix milliseconds now.
fn now_ms() -> u64 {
    themis_agent::trust::unix_millis()
}

/// Register + resolve through the API: the agent still does its job.
fn register_and_resolve_work(agent: &Agent, service: &str) {
    agent.register(service, "still-here", "127.0.0.1:18080");
    let endpoints = agent.endpoints(service).expect("resolve answers");
    assert_eq!(endpoints, vec!["127.0.0.1:18080".to_owned()]);
}

// ---- 1. the agent port, before any handshake -------------------------------------------

/// Bytes that are no Themis handshake are refused from the first bytes that give them
/// away, counted as `channel_failures{direction="inbound"}` by reason, and the
/// connection is closed without an answer; the port keeps accepting agents.
#[test]
fn junk_before_the_handshake_is_refused_and_counted() {
    let dir = common::workdir();
    let a = Metered::spawn(dir.path(), "agent-0", None, &[]);
    let addr = a.listen();
    let rt = runtime();

    // Opened first and never written to: the 5 s handshake timeout runs out while the
    // other cases are played.
    let mut idle = TcpStream::connect(addr).unwrap();

    // Not Themis at all: the first byte is not the protocol version.
    send_raw(
        addr,
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        "an HTTP request",
    );
    a.expect(CHANNEL_FAILURES, &inbound("malformed"), 1);

    // Random bytes (the first one kept off version 3, where the parse would merely
    // wait for more).
    let mut junk: [u8; 256] = random_bytes();
    junk[0] = 0xa5;
    send_raw(addr, &junk, "random bytes");
    a.expect(CHANNEL_FAILURES, &inbound("malformed"), 2);

    // A record header claiming a payload over the 1 MiB limit: refused from the
    // 30-byte header, before anything is buffered for it.
    let oversize = RecordHeader {
        version: PROTOCOL_VERSION,
        kind: Kind::Record as u8,
        session_id: 1,
        seq: 0,
        reply_to: 0,
        len: u32::try_from(MAX_RECORD_PAYLOAD + 1).unwrap(),
    };
    send_raw(addr, &oversize.encode(), "an oversize record header");
    a.expect(CHANNEL_FAILURES, &inbound("malformed"), 3);

    // A Hello whose mesh name claims 64 KiB: refused once more than the 3072 bytes a
    // handshake message may have (wire v3) are in.
    let mut long_hello = vec![PROTOCOL_VERSION, Kind::Hello as u8, 0x03, 0x80, 0x80, 0x10];
    long_hello.extend([0xff, 0xff, 0x03]); // the mesh name's length, 65535
    long_hello.resize(themis_core::wire::MAX_HANDSHAKE_LEN + 100, b'a');
    send_raw(addr, &long_hello, "a Hello with a 64 KiB mesh name");
    a.expect(CHANNEL_FAILURES, &inbound("malformed"), 4);

    // A well-formed (empty) record where the Hello must come.
    let mut record = RecordHeader { len: 0, ..oversize }.encode().to_vec();
    record.extend([0u8; TAG_LEN]);
    send_raw(addr, &record, "a record before the handshake");
    a.expect(CHANNEL_FAILURES, &inbound("malformed"), 5);

    // A genuine Hello cut short, then the connection closed. tokio-util reports a
    // stream that ends inside a message as an I/O error ("bytes remaining on
    // stream"), which themis-net counts as "io".
    let (_, hello) = Initiator::start(
        &identity(MESH),
        a.peer_id(),
        &HandshakeConfig::default(),
        now_ms(),
        &SystemRandom::new(),
    )
    .unwrap();
    let mut cut = TcpStream::connect(addr).unwrap();
    cut.write_all(&hello[..hello.len() / 2]).unwrap();
    cut.shutdown(Shutdown::Write).unwrap();
    expect_closed_unanswered(&mut cut, "a truncated Hello");
    a.expect(CHANNEL_FAILURES, &inbound("io"), 1);

    // The silent connection is dropped by the handshake timeout.
    expect_closed_unanswered(&mut idle, "an idle connection");
    a.expect(CHANNEL_FAILURES, &inbound("timeout"), 1);

    // Each case was counted once, under its own reason, and none made a session.
    let text = a.scrape();
    assert_eq!(
        sample(&text, CHANNEL_FAILURES, &inbound("malformed")),
        5,
        "{}",
        relevant(&text)
    );
    assert_eq!(sample(&text, HANDSHAKES, &[("direction", "inbound")]), 0);

    // And the port still serves agents, the API still answers.
    ping_works(&rt, &a);
    a.expect(HANDSHAKES, &[("direction", "inbound")], 1);
    register_and_resolve_work(&a.agent, "after-junk");
}

// ---- 2. handshakes from identities that do not add up ----------------------------------

/// Each way a Hello can misrepresent its sender or its target is refused with its own
/// reason, without an answer, and counted; so is a key confirmation that does not
/// match. A genuine handshake still succeeds afterwards.
#[test]
fn handshakes_that_do_not_add_up_are_refused_by_reason() {
    let dir = common::workdir();
    let a = Metered::spawn(dir.path(), "agent-0", None, &[]);
    let (addr, agent_id) = (a.listen(), a.peer_id());
    let rt = runtime();
    let (rng, config) = (SystemRandom::new(), HandshakeConfig::default());
    let alice = identity(MESH);
    let mallory = Ed25519KeyPair::from_seed_unchecked(&random_bytes::<32>()).unwrap();
    let (_, hello) = Initiator::start(&alice, agent_id, &config, now_ms(), &rng).unwrap();
    let alice_body = || Hello::decode(&hello).unwrap().message.body;

    // Mallory claims Alice's id but can only sign with her own key, which does not hash
    // to that id. The signature itself is valid: the id check is what refuses it.
    let claims_alice = HelloBody {
        initiator_key: mallory.public_key().as_ref().try_into().unwrap(),
        ..alice_body()
    };
    send_raw(
        addr,
        &signed_hello(&claims_alice, &mallory),
        "Mallory's key under Alice's id",
    );
    a.expect(CHANNEL_FAILURES, &inbound("key_id_mismatch"), 1);

    // Alice's key and id, signed by Mallory.
    send_raw(
        addr,
        &signed_hello(&alice_body(), &mallory),
        "Alice's Hello signed by Mallory",
    );
    a.expect(CHANNEL_FAILURES, &inbound("bad_signature"), 1);

    // Alice's Hello with one bit of its signature flipped.
    let mut flipped = hello.clone();
    *flipped.last_mut().unwrap() ^= 0x01;
    send_raw(addr, &flipped, "a Hello with a flipped signature bit");
    a.expect(CHANNEL_FAILURES, &inbound("bad_signature"), 2);

    // A genuine identity of another mesh.
    let stranger = identity("other");
    let (_, other_mesh) = Initiator::start(&stranger, agent_id, &config, now_ms(), &rng).unwrap();
    send_raw(addr, &other_mesh, "a Hello from mesh \"other\"");
    a.expect(CHANNEL_FAILURES, &inbound("wrong_mesh"), 1);

    // A genuine Hello meant for another node.
    let (_, elsewhere) =
        Initiator::start(&alice, PeerId(random_bytes()), &config, now_ms(), &rng).unwrap();
    send_raw(addr, &elsewhere, "a Hello for another id");
    a.expect(CHANNEL_FAILURES, &inbound("not_for_me"), 1);

    // A genuine Hello, the agent's genuine reply, and a key confirmation with a flipped
    // bit in its MAC.
    let (waiting, hello) = Initiator::start(&alice, agent_id, &config, now_ms(), &rng).unwrap();
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(&hello).unwrap();
    let reply = read_message(&mut s);
    let (_session, mut confirm) = waiting.read_hello_reply(&reply).unwrap();
    *confirm.last_mut().unwrap() ^= 0x01;
    s.write_all(&confirm).unwrap();
    expect_closed_unanswered(&mut s, "a bad key confirmation");
    a.expect(CHANNEL_FAILURES, &inbound("handshake"), 1);

    // None of them got a session; each reason was counted once.
    let text = a.scrape();
    assert_eq!(sample(&text, HANDSHAKES, &[("direction", "inbound")]), 0);
    for (reason, n) in [
        ("key_id_mismatch", 1),
        ("bad_signature", 2),
        ("wrong_mesh", 1),
        ("not_for_me", 1),
        ("handshake", 1),
        ("malformed", 0),
    ] {
        assert_eq!(
            sample(&text, CHANNEL_FAILURES, &inbound(reason)),
            n,
            "{reason}\n{}",
            relevant(&text)
        );
    }

    // Alice herself still gets in.
    ping_works(&rt, &a);
    a.expect(HANDSHAKES, &[("direction", "inbound")], 1);
    assert_eq!(a.agent.get("/v1/status").unwrap().0, 200);
}

// ---- 3. an authenticated agent sending frames the overlay must refuse ------------------

/// An admitted agent of the mesh, properly authenticated, sends frames that are not
/// well-formed DHT requests. Each one is answered with `Frame::Refused` and its reason,
/// counted, and the session stays up: a well-formed `Ping` on the same connection
/// afterwards is answered. (Its first frame is a well-formed `Ping`: a connection is
/// admitted by a frame carrying a valid admission, and one that has not been admitted
/// is closed by its first frame that proves nothing; see admission.rs.)
#[test]
fn an_authenticated_peer_sending_bad_frames_is_refused_frame_by_frame() {
    let dir = common::workdir();
    let a = Metered::spawn(dir.path(), "agent-0", None, &[]);
    let rt = runtime();
    let peer = Admitted::new(dir.path(), "hostile");
    let dht = |listen, id, body| peer.dht(listen, id, body);
    let mut stream = rt
        .block_on(themis_net::connect(
            &peer.me,
            a.listen(),
            a.peer_id(),
            &themis_net::Config::default(),
        ))
        .unwrap();
    let mut ask = |payload: &[u8]| -> Frame {
        let answer = rt.block_on(stream.request(payload)).unwrap();
        postcard::from_bytes::<Frame>(&answer).unwrap()
    };
    let refused = |frame: Frame| match frame {
        Frame::Refused { reason } => reason,
        other => panic!("expected a refusal, got {other:?}"),
    };

    let mut random: [u8; 64] = random_bytes();
    random[0] = 0x7f; // no such frame variant (0 is Dht, 1 is Refused)
    let oversize_value = Request::Store {
        key: Key(random_bytes()),
        value: vec![0u8; MAX_VALUE_LEN + 1],
        ttl_ms: 1_000,
    };
    let long_avoid = Request::FindStep {
        key: Key(random_bytes()),
        avoid: (0..=MAX_AVOID).map(|_| Key(random_bytes())).collect(),
    };
    let zero: SocketAddr = "0.0.0.0:0".parse().unwrap();
    let port_zero: SocketAddr = "127.0.0.1:0".parse().unwrap();
    // (what, payload, refusal the peer hears, frames_refused reason it is counted under
    // or None for refusals of the DHT node, which counts them itself)
    let cases: Vec<(&str, Vec<u8>, &str, Option<&str>)> = vec![
        ("an empty frame", Vec::new(), "malformed", Some("malformed")),
        (
            "random bytes",
            random.to_vec(),
            "malformed",
            Some("malformed"),
        ),
        (
            "a refusal sent as a request",
            encode(&Frame::Refused {
                reason: "no".into(),
            }),
            "unexpected_refusal",
            Some("unexpected_refusal"),
        ),
        (
            "a response nobody asked for",
            encode(&Frame::Dht {
                listen: nowhere(),
                admission: peer.admission.clone(),
                message: Message::Response {
                    id: 1,
                    body: Response::Ack,
                },
            }),
            "response_without_request",
            Some("response_without_request"),
        ),
        (
            "listening on 0.0.0.0:0",
            dht(zero, 2, Request::Ping),
            "bad_listen_address",
            Some("bad_listen_address"),
        ),
        (
            "listening on port 0",
            dht(port_zero, 3, Request::Ping),
            "bad_listen_address",
            Some("bad_listen_address"),
        ),
        (
            "a FindStep with an avoid list over MAX_AVOID",
            dht(nowhere(), 4, long_avoid),
            "rejected",
            None,
        ),
        (
            "a Store of a value over MAX_VALUE_LEN",
            dht(nowhere(), 5, oversize_value),
            "rejected",
            None,
        ),
    ];
    match ask(&dht(nowhere(), 41, Request::Ping)) {
        Frame::Dht {
            message: Message::Response { id: 41, .. },
            ..
        } => {}
        other => panic!("the admitting ping got {other:?}"),
    }
    let mut frames_refused = std::collections::BTreeMap::<&str, u64>::new();
    let mut over_limit = 0;
    for (what, payload, reason, counted) in cases {
        assert_eq!(refused(ask(&payload)), reason, "{what}");
        match counted {
            Some(label) => {
                let n = frames_refused.entry(label).or_default();
                *n += 1;
                a.expect(FRAMES_REFUSED, &[("reason", label)], *n);
            }
            None => {
                over_limit += 1;
                a.expect(DHT_REJECTIONS, &[("reason", "OverLimit")], over_limit);
            }
        }
    }

    // The same session, a well-formed request: answered.
    match ask(&dht(nowhere(), 42, Request::Ping)) {
        Frame::Dht {
            listen,
            message: Message::Response { id: 42, body },
            ..
        } => {
            assert_eq!(body, Response::Ack);
            assert_eq!(listen, a.listen());
        }
        other => panic!("a ping got {other:?}"),
    }

    // Refused frames never cost the session: no channel failure, one session, open.
    let text = a.scrape();
    for reason in ["malformed", "authentication", "replay", "record", "closed"] {
        assert_eq!(sample(&text, CHANNEL_FAILURES, &inbound(reason)), 0);
    }
    assert_eq!(sample(&text, HANDSHAKES, &[("direction", "inbound")]), 1);
    assert_eq!(
        sample(&text, "themis_sessions", &[("direction", "inbound")]),
        1
    );
    // DHT refusals are counted by the node, not a second time as refused frames.
    assert_eq!(sample(&text, FRAMES_REFUSED, &[("reason", "rejected")]), 0);
    drop(stream);
    register_and_resolve_work(&a.agent, "after-bad-frames");
}

// ---- 3b. peers the mesh root did not admit ---------------------------------------------

/// An admission credential for `node`, signed by `signer` (the mesh key, or not).
fn admission_by(
    signer: &Identity,
    node: &Identity,
    mesh: &str,
    issued_at: u64,
    not_after: Option<u64>,
) -> Vec<u8> {
    Signed::sign(
        signer,
        ADMISSION_LABEL,
        &Admission {
            mesh: mesh.into(),
            node_key: *node.public_key(),
            issued_at,
            not_after,
        },
    )
    .encode()
}

/// Peers that complete the handshake (a genuine key of the mesh: the channel cannot
/// tell them apart) but hold no admission of this mesh's root reach nothing: every DHT
/// request they send is refused before the DHT sees it, answered `Refused` with the
/// reason, and counted in `themis_frames_refused{reason="not_admitted_*"}`. The
/// cases: no admission at all (each request kind tried), a ring member's admission
/// copied (another key), a self-signed admission, one from another mesh root that
/// uses the same mesh name, one with a forged root signature, and root-signed ones
/// that are expired, for another mesh, or issued in the future. The two-agent ring
/// they target stays as it was and keeps serving.
///
/// Each request goes on a connection of its own: the first frame refused for its
/// admission closes the connection (issue 21).
///
/// (Before admission, every key of the mesh was a DHT peer: a `Notify` from any of
/// them could make it an agent's predecessor.)
#[test]
fn unadmitted_peers_are_refused_by_reason_and_the_ring_is_unaffected() {
    let dir = common::workdir();
    let x = Metered::spawn(dir.path(), "agent-0", None, &[]);
    let y = Metered::spawn(dir.path(), "agent-1", Some(&x.agent.contact), &[]);
    common::wait_stable(&[&x.agent, &y.agent], Duration::from_secs(30));
    let rt = runtime();
    let mesh_key = common::mesh_key(dir.path());
    let now = now_ms();
    let hour = 3_600_000;

    // Another mesh root with the same mesh name, and a node it admitted.
    let other_mesh = dir.path().join("other-mesh");
    common::operator(&[
        "mesh".as_ref(),
        "create".as_ref(),
        MESH.as_ref(),
        "--out".as_ref(),
        other_mesh.as_os_str(),
    ]);
    let outsider_dir = dir.path().join("outsider");
    common::operator(&[
        "node".as_ref(),
        "admit".as_ref(),
        "--mesh-dir".as_ref(),
        other_mesh.as_os_str(),
        "--out".as_ref(),
        outsider_dir.as_os_str(),
    ]);

    // (peer, the admission it presents, the reason it is refused for)
    let mut cases: Vec<(Identity, Vec<u8>, &str)> = Vec::new();
    let stranger = identity(MESH);
    cases.push((stranger, Vec::new(), "not_admitted_malformed"));
    let copier = identity(MESH);
    let copied = common::node_credentials(&y.agent.dir).1;
    cases.push((copier, copied, "not_admitted_wrong_key"));
    let selfish = identity(MESH);
    let self_signed = admission_by(&selfish, &selfish, MESH, now, None);
    cases.push((selfish, self_signed, "not_admitted_not_from_root"));
    let (outsider, foreign) = common::node_credentials(&outsider_dir);
    cases.push((outsider, foreign, "not_admitted_not_from_root"));
    let forger = identity(MESH);
    let mut forged = Signed::decode(&admission_by(&forger, &forger, MESH, now, None)).unwrap();
    forged.signer = *mesh_key.public_key();
    cases.push((forger, forged.encode(), "not_admitted_bad_signature"));
    let lapsed = identity(MESH);
    let expired = admission_by(&mesh_key, &lapsed, MESH, now - 2 * hour, Some(now - hour));
    cases.push((lapsed, expired, "not_admitted_expired"));
    let other = identity(MESH);
    let other_mesh_admission = admission_by(&mesh_key, &other, "other", now, None);
    cases.push((other, other_mesh_admission, "not_admitted_wrong_mesh"));
    let early = identity(MESH);
    let future = admission_by(&mesh_key, &early, MESH, now + hour, None);
    cases.push((early, future, "not_admitted_from_the_future"));

    let listen: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let every_kind = |first: u64| -> Vec<(u64, Request<SocketAddr>)> {
        let object = Object {
            key: Key::object(b"victim", 0),
            value: b"planted".to_vec(),
            ttl_ms: 60_000,
        };
        let requests = vec![
            Request::Ping,
            Request::Notify,
            Request::GetNeighbours,
            Request::FindStep {
                key: key_of(&y.agent),
                avoid: Vec::new(),
            },
            Request::Get {
                key: Key::object(b"victim", 0),
            },
            Request::Store {
                key: object.key,
                value: object.value.clone(),
                ttl_ms: 60_000,
            },
            Request::Handover {
                objects: vec![object],
            },
            Request::Leaving {
                predecessor: None,
                successors: Vec::new(),
            },
        ];
        (first..).zip(requests).collect()
    };
    let mut expected = std::collections::BTreeMap::<&str, u64>::new();
    for (i, (peer, admission, reason)) in cases.iter().enumerate() {
        // The first peer tries every request kind; the others a join step and a Notify.
        let mut requests = every_kind(0);
        if i > 0 {
            requests.retain(|(_, r)| matches!(r, Request::Notify | Request::FindStep { .. }));
        }
        let answers: Vec<Frame> = rt.block_on(async {
            let mut answers = Vec::new();
            for (id, body) in requests {
                let mut stream = themis_net::connect(
                    peer,
                    x.listen(),
                    x.peer_id(),
                    &themis_net::Config::default(),
                )
                .await
                .unwrap_or_else(|e| panic!("{reason}: the handshake itself must succeed: {e}"));
                let answer = stream
                    .request(&dht(listen, admission, id, body))
                    .await
                    .unwrap();
                answers.push(postcard::from_bytes::<Frame>(&answer).unwrap());
                match stream.recv().await {
                    Ok(None) | Err(_) => {}
                    Ok(Some(_)) => panic!("{reason}: more after the refusal"),
                }
            }
            answers
        });
        for answer in &answers {
            match answer {
                // The peer learns only "rejected"; the reason is in the metrics.
                Frame::Refused { reason: got } => assert_eq!(got, "rejected", "{reason}"),
                other => panic!("{reason}: answered {other:?}"),
            }
        }
        let n = expected.entry(reason).or_default();
        *n += answers.len() as u64;
        x.expect(FRAMES_REFUSED, &[("reason", reason)], *n);
    }

    // None of them reached the DHT: no rejection by the node, nothing planted, no
    // stranger in x's routing state; the ring is the same two agents and serves.
    let text = x.scrape();
    for reason in ["NotNeighbour", "InvalidValue"] {
        assert_eq!(
            sample(&text, DHT_REJECTIONS, &[("reason", reason)]),
            0,
            "{reason}"
        );
    }
    let (_, ring) = x.agent.get("/v1/ring").unwrap();
    assert_eq!(ring["predecessor"]["id"], y.agent.id.as_str(), "{ring}");
    assert_eq!(ring["successors"][0]["id"], y.agent.id.as_str(), "{ring}");
    assert_eq!(ring["objects"], json!([]), "{ring}");
    common::wait_stable(&[&x.agent, &y.agent], Duration::from_secs(30));
    y.agent.register("after-strangers", "w", "127.0.0.1:18081");
    let endpoints = x
        .agent
        .endpoints("after-strangers")
        .expect("resolve answers");
    assert_eq!(endpoints, vec!["127.0.0.1:18081".to_owned()]);
    ping_works(&rt, &x);
}

// ---- 4. a fake agent that answers lookups without progress -----------------------------

/// The fake agent's answers: `FindStep` → "ask me" (no progress, the eclipse attack),
/// `GetNeighbours` → the two real agents, anything else → `Ack`, each with the fake's
/// admission (the operator admitted it: a compromised node, not an outsider). It
/// records the keys it was asked about.
fn fake_answer(
    (me, admission): (&Contact<SocketAddr>, &[u8]),
    neighbours: &(Contact<SocketAddr>, Contact<SocketAddr>),
    asked: &Mutex<Vec<Key>>,
    request: &[u8],
) -> Vec<u8> {
    let frame = match postcard::from_bytes::<Frame>(request) {
        Ok(Frame::Dht {
            message: Message::Request { id, body },
            ..
        }) => {
            let body = match body {
                Request::FindStep { key, .. } => {
                    asked.lock().unwrap().push(key);
                    Response::Closer { node: me.clone() }
                }
                Request::GetNeighbours => Response::Neighbours {
                    predecessor: Some(neighbours.0.clone()),
                    successors: vec![neighbours.1.clone(), neighbours.0.clone()],
                },
                _ => Response::Ack,
            };
            Frame::Dht {
                listen: me.addr,
                admission: admission.to_vec(),
                message: Message::Response { id, body },
            }
        }
        _ => Frame::Refused {
            reason: "fake".into(),
        },
    };
    encode(&frame)
}

/// A fake agent joins between two real ones and answers every lookup step with itself
/// (no progress). The agent that routes through it drops it from the lookup and counts
/// `NoProgress`; the find never returns the fake's answer, ends with a JSON result or
/// error, and the agent keeps serving.
///
/// Why two real agents and not one: a lone agent that adopts the fake as predecessor
/// and successor covers the whole ring from its own table ((fake, me] is its own,
/// (me, fake] the fake's), so no lookup ever leaves it. With a real `a` and `b` and
/// the fake `f` in between, `a` has `b` as predecessor and `f` as successor, and every
/// key in (f, b] must be looked up through `f`. The keys are chosen in that arc, so
/// no iteration over random keys is needed.
#[test]
fn a_peer_that_answers_lookups_without_progress_is_dropped() {
    let dir = common::workdir();
    // Chord: the subject is Chord's lookup through other nodes (and the fake's
    // `Notify` making it a predecessor); one-hop routing sends no `FindStep` at all.
    let x = Metered::spawn_chord(dir.path(), "agent-0", None, &[]);
    let y = Metered::spawn_chord(dir.path(), "agent-1", Some(&x.agent.contact), &[]);
    common::wait_stable(&[&x.agent, &y.agent], Duration::from_secs(30));

    let fake = Admitted::new(dir.path(), "fake");
    let admission = fake.admission.clone();
    let fake = Arc::new(fake.me);
    let f = Key(fake.id().0);
    // `a` is the real agent just before the fake on the ring, `b` the one just after.
    let (a, b) = if in_open(&f, &key_of(&x.agent), &key_of(&y.agent)) {
        (&x, &y)
    } else {
        (&y, &x)
    };
    let contact = |m: &Metered| Contact {
        id: key_of(&m.agent),
        addr: m.listen(),
    };
    let (a_contact, b_contact) = (contact(a), contact(b));
    let ring_of = |m: &Metered| m.agent.get("/v1/ring").filter(|(s, _)| *s == 200);
    b.agent
        .wait_for("a as predecessor", Duration::from_secs(30), |_| {
            ring_of(b).filter(|(_, r)| r["predecessor"]["id"] == a.agent.id.as_str())
        });

    let rt = runtime();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let me = Contact {
        id: f,
        addr: listener.local_addr().unwrap(),
    };
    let asked = Arc::new(Mutex::new(Vec::<Key>::new()));
    let handler = {
        let (me, neighbours, asked) = (me.clone(), (a_contact, b_contact), asked.clone());
        let admission = admission.clone();
        move |_peer: Arc<SessionInfo>, request: BytesMut| {
            let answer = fake_answer((&me, &admission), &neighbours, &asked, &request);
            async move { answer }
        }
    };
    let server = rt.spawn(themis_net::serve(
        listener,
        fake.clone(),
        themis_net::Config::default(),
        Arc::new(handler),
        Arc::new(themis_net::NetStats::default()),
    ));

    // "I may be your predecessor", to b: f is in (a, b), so b adopts it; a learns it
    // from b in its next stabilisation round and takes it as successor.
    let client = themis_net::Client::new(fake.clone(), themis_net::ClientConfig::default());
    let notify = dht(me.addr, &admission, 1, Request::Notify);
    let answer = rt
        .block_on(client.request(b.peer_id(), b.listen(), &notify))
        .unwrap();
    assert!(
        matches!(
            postcard::from_bytes::<Frame>(&answer).unwrap(),
            Frame::Dht {
                message: Message::Response {
                    id: 1,
                    body: Response::Ack
                },
                ..
            }
        ),
        "Notify was not acknowledged"
    );
    let fake_id = fake.printable_id();
    b.agent
        .wait_for("the fake as predecessor", Duration::from_secs(30), |_| {
            ring_of(b).filter(|(_, r)| r["predecessor"]["id"] == fake_id.as_str())
        });
    let fake_is_successor_of_a = || {
        a.agent
            .wait_for("the fake as successor", Duration::from_secs(30), |_| {
                ring_of(a).filter(|(_, r)| {
                    r["successors"][0]["id"] == fake_id.as_str()
                        && r["predecessor"]["id"] == b.agent.id.as_str()
                })
            });
    };

    // Keys in (f, b]: a must ask f, the only node it knows in (a, key).
    let kb = key_of(&b.agent);
    let keys = [
        f.wrapping_add(Key::from_low(1)),
        kb.wrapping_add(Key([0xff; 32])), // b - 1
        kb,
    ];
    let no_progress = [("reason", "NoProgress")];
    for key in keys {
        // Should a time out the fake under load, it forgets it and answers locally;
        // the fake is learnt again through stabilisation, and the find is repeated.
        let mut attempts = 0;
        let (status, answer, before) = loop {
            attempts += 1;
            fake_is_successor_of_a();
            let before = a.value(DHT_REJECTIONS, &no_progress);
            let (status, answer) = a
                .agent
                .get(&format!("/v1/debug/find/{}", hex::encode(key.0)))
                .expect("the API answers");
            if asked.lock().unwrap().contains(&key) {
                break (status, answer, before);
            }
            assert!(
                attempts < 5,
                "find {key} never went through the fake: {status} {answer}"
            );
        };
        // Routed around the fake to the node really responsible: with the fake
        // dropped, a's own successor list names b next.
        assert_eq!(status, 200, "find {key}: {answer}");
        assert_eq!(answer["node"]["id"], b.agent.id.as_str(), "{answer}");
        a.wait_at_least(DHT_REJECTIONS, &no_progress, before + 1);
    }
    // No assertion on `BadResponsible`: the fake never answers `Responsible`, so it can
    // earn none; only a real neighbour can, when under load it has timed out every
    // successor and, alone in its own table, names itself for every key (seen once in
    // a loaded unprivileged run). That lie-shaped answer is rightly refused; it is not
    // this test's subject.

    // a still serves: its status, its ring, and finds it can answer itself.
    assert_eq!(a.agent.get("/v1/status").unwrap().0, 200);
    assert!(ring_of(a).is_some());
    let own = a
        .agent
        .get(&format!(
            "/v1/debug/find/{}",
            hex::encode(key_of(&a.agent).0)
        ))
        .unwrap();
    assert_eq!(own.0, 200, "{}", own.1);
    assert_eq!(own.1["node"]["id"], a.agent.id.as_str());

    server.abort();
    drop(client);
    rt.shutdown_timeout(Duration::from_secs(5));
}

// ---- 5. the local API and the `themis` tool --------------------------------------------

/// A request with a raw body over the API socket, for bodies `Agent::call` cannot
/// send (it sends JSON values): returns the status and the JSON answer.
fn raw_call(
    agent: &Agent,
    method: &str,
    path: &str,
    content_type: Option<&str>,
    body: &[u8],
) -> (u16, Value) {
    let mut s = std::os::unix::net::UnixStream::connect(agent.dir.join("agent.sock")).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let content_type = content_type.map_or(String::new(), |t| format!("content-type: {t}\r\n"));
    let head = format!(
        "{method} {path} HTTP/1.1\r\nhost: themis-agent\r\n{content_type}content-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    // The agent may answer (413, say) and close before an oversize body is all
    // written: the write then fails with EPIPE, and the answer is still there to read.
    let _ = s.write_all(body);
    let mut out = Vec::new();
    s.read_to_end(&mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    assert!(
        !head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked"),
        "{head}"
    );
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    let value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: not JSON: {body:?}"));
    (status, value)
}

/// Checks an API error: its status, that it is JSON with a message, and its reason.
fn api_error(answer: Option<(u16, Value)>, status: u16, reason: &str, what: &str) -> Value {
    let (got, body) = answer.unwrap_or_else(|| panic!("{what}: no JSON answer"));
    assert_eq!(got, status, "{what}: {body}");
    assert!(body["error"].is_string(), "{what}: {body}");
    assert_eq!(body["reason"], reason, "{what}: {body}");
    body
}

/// Every kind of bad request to the local API gets a JSON error with a fitting status
/// and a stable reason, and the `themis` tool turns them into exit codes and messages;
/// the agent registers and resolves as before afterwards.
#[test]
fn bad_api_requests_get_json_errors_and_the_cli_reports_them() {
    let dir = common::workdir();
    let a = Metered::spawn(dir.path(), "agent-0", None, &[]);
    let agent = &a.agent;
    let put = |path: &str, body: Value| agent.call(Method::PUT, path, Some(&body));
    let endpoint = |e: &str| json!({ "endpoint": e });

    api_error(
        agent.get("/v1/nothing-here"),
        404,
        "unknown_endpoint",
        "an unknown endpoint",
    );
    api_error(
        agent.call(Method::POST, "/v1/status", None),
        405,
        "method_not_allowed",
        "POST /v1/status",
    );
    api_error(
        agent.call(Method::DELETE, "/v1/debug/store", None),
        405,
        "method_not_allowed",
        "DELETE /v1/debug/store",
    );

    let register = "/v1/services/web/instances/web-1";
    api_error(
        Some(raw_call(
            agent,
            "PUT",
            register,
            Some("application/json"),
            b"{\"endpoint\": ",
        )),
        400,
        "bad_request",
        "malformed JSON",
    );
    api_error(
        Some(raw_call(
            agent,
            "PUT",
            register,
            None,
            b"{\"endpoint\": \"127.0.0.1:1\"}",
        )),
        415,
        "bad_request",
        "a body without a JSON content type",
    );
    api_error(
        put(register, json!({ "endpoint": "127.0.0.1:1", "port": 80 })),
        422,
        "bad_request",
        "an unknown field",
    );
    let big = "x".repeat(17 * 1024);
    api_error(
        put(
            register,
            json!({ "endpoint": "127.0.0.1:1", "metadata": { "k": big } }),
        ),
        413,
        "bad_request",
        "a 17 KiB body",
    );
    api_error(
        put(
            "/v1/services/Bad%20Name/instances/web-1",
            endpoint("127.0.0.1:1"),
        ),
        400,
        "bad_request",
        "service \"Bad Name\"",
    );
    api_error(
        put("/v1/services/web/instances/..%2Fx", endpoint("127.0.0.1:1")),
        400,
        "bad_request",
        "workload \"../x\"",
    );
    api_error(
        agent.call(Method::PUT, "/v1/workloads/..%2Fx", None),
        400,
        "bad_request",
        "creating workload \"../x\"",
    );
    assert!(!agent.dir.join("x.key").exists());
    assert!(!agent
        .dir
        .join("workloads")
        .join("..")
        .join("x.key")
        .exists());
    api_error(
        put(register, endpoint("0.0.0.0:80")),
        400,
        "bad_request",
        "endpoint 0.0.0.0:80",
    );
    api_error(
        put(register, endpoint("127.0.0.1:0")),
        400,
        "bad_request",
        "endpoint port 0",
    );
    api_error(
        agent.call(Method::DELETE, "/v1/services/web/instances/nobody", None),
        404,
        "not_found",
        "deregistering what is not registered",
    );
    api_error(
        agent.get("/v1/workloads/nobody/key"),
        404,
        "not_found",
        "the key of an unknown workload",
    );
    let (status, unknown) = agent
        .get("/v1/services/nobody-serves-this?fresh=true")
        .unwrap();
    assert_eq!(status, 200, "{unknown}");
    assert_eq!(unknown["instances"], json!([]));
    assert_eq!(unknown["refused"], 0);
    api_error(
        agent.get("/v1/services/web?fresh=maybe"),
        400,
        "bad_request",
        "a bad query value",
    );
    api_error(
        agent.get("/v1/services/web?stale=true"),
        400,
        "bad_request",
        "an unknown query parameter",
    );
    api_error(
        agent.get("/v1/debug/find/not-hex"),
        400,
        "bad_request",
        "a non-hex key",
    );
    api_error(
        agent.get(&format!("/v1/debug/find/{}", "a".repeat(63))),
        400,
        "bad_request",
        "a 63-digit key",
    );
    api_error(
        agent.call(
            Method::POST,
            "/v1/debug/store",
            Some(&json!({ "name": "n", "value": "v", "replicas": 8 })),
        ),
        422,
        "rejected",
        "a store with 8 extra replicas",
    );
    api_error(
        agent.call(
            Method::POST,
            "/v1/debug/store",
            Some(&json!({ "name": "n", "value": "v".repeat(MAX_VALUE_LEN + 1) })),
        ),
        422,
        "rejected",
        "a store of a value over the limit",
    );
    api_error(
        agent.get(&format!("/v1/debug/values/{}", "n".repeat(256))),
        422,
        "rejected",
        "values of a name over 255 bytes",
    );
    // The DHT counted the operations it refused.
    a.expect(DHT_REJECTIONS, &[("reason", "TooManyReplicas")], 1);
    a.expect(DHT_REJECTIONS, &[("reason", "ValueTooLarge")], 1);
    a.expect(DHT_REJECTIONS, &[("reason", "NameTooLong")], 1);

    // The tool: no agent behind the socket.
    let missing = dir.path().join("no-agent-here.sock");
    let out = Command::new(common::themis_binary())
        .arg("--socket")
        .arg(&missing)
        .arg("status")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains(&*missing.to_string_lossy()), "{stderr}");
    assert!(stderr.contains("cannot reach the agent"), "{stderr}");

    // The tool: the agent's refusal, on stderr, exit 1.
    let (code, stdout, stderr) = agent.cli(&[
        "register",
        "web",
        "--workload",
        "web-1",
        "--endpoint",
        "nonsense",
    ]);
    assert_eq!(code, 1, "{stdout}{stderr}");
    assert!(stderr.starts_with("error: "), "{stderr}");
    assert!(stderr.contains("invalid socket address"), "{stderr}");
    assert!(stderr.contains("422"), "{stderr}");
    let (code, _, stderr) = agent.cli(&[
        "register",
        "web",
        "--workload",
        "web-1",
        "--endpoint",
        "0.0.0.0:80",
    ]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("not 0.0.0.0"), "{stderr}");
    // A name that would break the URL is refused by the tool itself.
    let (code, _, stderr) = agent.cli(&[
        "register",
        "a/b",
        "--workload",
        "w",
        "--endpoint",
        "127.0.0.1:1",
    ]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("not a valid name"), "{stderr}");

    // Nothing was registered by any of it, and the agent still does its job.
    let (_, workloads) = agent.get("/v1/workloads").unwrap();
    assert_eq!(workloads["registrations"], json!([]));
    register_and_resolve_work(agent, "web");
    let (code, stdout, stderr) = agent.cli(&["resolve", "web", "--fresh"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("127.0.0.1:18080"), "{stdout}");
}

// ---- 6. stored records that do not verify ----------------------------------------------

/// An instance record of `service` for `workload` at 127.0.0.1:7000, valid over
/// `[issued_at, not_after)`.
fn record(service: &str, workload: &Identity, issued_at: u64, not_after: u64) -> Record {
    Record {
        mesh: MESH.into(),
        service: service.into(),
        workload_key: *workload.public_key(),
        endpoint: Some("127.0.0.1:7000".parse().unwrap()),
        metadata: Default::default(),
        issued_at,
        not_after,
    }
}

/// The stored form: `record` signed by `signer`, behind the grant chain `grants`.
fn instance_value(grants: &[Signed], signer: &Identity, record: &Record) -> InstanceValue {
    InstanceValue {
        grants: grants.to_vec(),
        record: Signed::sign(signer, RECORD_LABEL, record),
    }
}

/// The admitted `peer` announces its address ([`nowhere`], the address its frames
/// name) in a roster request on `stream`, as an agent's gossip does, and the agent
/// answers it (a roster answer).
async fn announce(stream: &mut themis_net::SecureStream, peer: &Admitted) {
    let announcement = Signed::sign(
        &peer.me,
        ANNOUNCEMENT_LABEL,
        &Announcement {
            mesh: MESH.into(),
            address: nowhere(),
            issued_at: now_ms(),
            leaving: false,
            address_range: None,
        },
    )
    .encode();
    let request = Frame::Roster(RosterFrame {
        admission: Some(peer.admission.clone()),
        log_size: 0,
        log_root: Some([0; 32]),
        digest: Some([0; 32]),
        members: vec![Credentials {
            admission: Some(peer.admission.clone()),
            announcement,
            address_range: None,
        }],
        want: None,
        buckets_wanted: false,
        buckets: Vec::new(),
        next: None,
    });
    let answer = stream.request(&encode(&request)).await.unwrap();
    let answer = postcard::from_bytes::<Frame>(&answer).unwrap();
    assert!(
        matches!(answer, Frame::Roster(_)),
        "the announcement was not answered: {answer:?}"
    );
}

/// The grant chain the operator wrote for `service` into the node directory `dir`.
fn chain(dir: &Path, service: &str) -> Vec<Signed> {
    let text = std::fs::read_to_string(dir.join("grants").join(format!("{service}.pem")));
    chain_from_pem(&text.unwrap()).unwrap()
}

/// Values are kept only if they verify against the mesh root, so nothing forged is
/// ever there to resolve. Junk stored through the debug API is refused by the agent's
/// own store (as it would be by every replica holder: 422 `rejected`). An admitted
/// peer storing straight into the replica holder with `Store` frames fares no better:
/// an unendorsed record, one under a grant it signed itself, under a grant for
/// another service, signed by a key the grant does not name, for another mesh or
/// another service, with a flipped signature bit, expired, from the future, with a
/// lifetime over a day, with too much metadata, or junk, is each answered `Rejected`
/// and counted under its reason. A genuinely endorsed record stored the same way
/// beside them is acknowledged and is all that resolves.
///
/// The peer first announces its address, as every agent's gossip does: with one-hop
/// routing (the default) a record is trusted only at an IP its endorser announced.
///
/// (Before mesh trust, any record signed by the key inside it was stored and
/// resolved: a fresh unrelated key was an instance of `spoofed`.)
#[test]
fn stored_records_that_do_not_verify_are_refused_and_counted() {
    let dir = common::workdir();
    let a = Metered::spawn(dir.path(), "agent-0", None, &[]);
    let agent = &a.agent;

    // Junk under a service name, through the debug API: refused before it is stored.
    api_error(
        agent.call(
            Method::POST,
            "/v1/debug/store",
            Some(&json!({ "name": "forged", "value": "not a record", "replicas": 2 })),
        ),
        422,
        "rejected",
        "junk stored through the debug API",
    );
    a.expect(RECORDS_REFUSED, &[("reason", "malformed")], 1);
    a.expect(DHT_REJECTIONS, &[("reason", "InvalidValue")], 1);
    let resolved = agent.resolve("forged").expect("resolve answers");
    assert_eq!(resolved["instances"], json!([]), "{resolved}");
    assert_eq!(resolved["refused"], 0, "nothing was stored: {resolved}");

    // An admitted node, granted `elsewhere` and `spoofed` by the operator, stores
    // values itself under replica 0 of "spoofed", straight into this agent.
    let publisher = Admitted::new(dir.path(), "publisher");
    let publisher_dir = dir.path().join("publisher");
    for service in ["spoofed", "elsewhere"] {
        common::grant(dir.path(), &publisher_dir, service);
    }
    let (spoofed, elsewhere) = (
        chain(&publisher_dir, "spoofed"),
        chain(&publisher_dir, "elsewhere"),
    );
    let me = &publisher.me;
    let now = now_ms();
    let minute = 60_000;
    let workload = identity(MESH);
    let fresh = record("spoofed", &workload, now, now + minute);
    let self_granted = Signed::sign(
        me,
        GRANT_LABEL,
        &Grant {
            mesh: MESH.into(),
            service: "spoofed".into(),
            grantee: *me.public_key(),
            delegate: false,
            issued_at: now,
            not_after: None,
        },
    );
    let mut flipped = instance_value(&spoofed, me, &fresh);
    flipped.record.signature[0] ^= 0x01;
    let mut crowded = fresh.clone();
    crowded.metadata = (0..17).map(|i| (format!("k{i}"), "v".into())).collect();
    let forged: Vec<(&str, Vec<u8>)> = vec![
        (
            "chain_length",
            instance_value(&[], &workload, &fresh).encode(),
        ),
        (
            "not_from_root",
            instance_value(&[self_granted], me, &fresh).encode(),
        ),
        (
            "wrong_service",
            instance_value(&elsewhere, me, &fresh).encode(),
        ),
        (
            "wrong_service",
            instance_value(
                &elsewhere,
                me,
                &record("elsewhere", &workload, now, now + minute),
            )
            .encode(),
        ),
        (
            "not_granted",
            instance_value(&spoofed, &workload, &fresh).encode(),
        ),
        (
            "wrong_mesh",
            instance_value(
                &spoofed,
                me,
                &Record {
                    mesh: "other".into(),
                    ..fresh.clone()
                },
            )
            .encode(),
        ),
        ("bad_signature", flipped.encode()),
        (
            "expired",
            instance_value(
                &spoofed,
                me,
                &record("spoofed", &workload, now - 20 * minute, now - 10 * minute),
            )
            .encode(),
        ),
        (
            "from_the_future",
            instance_value(
                &spoofed,
                me,
                &record("spoofed", &workload, now + 60 * minute, now + 61 * minute),
            )
            .encode(),
        ),
        (
            "bad_lifetime",
            instance_value(
                &spoofed,
                me,
                &record("spoofed", &workload, now, now + 25 * 60 * minute),
            )
            .encode(),
        ),
        ("too_large", instance_value(&spoofed, me, &crowded).encode()),
        ("malformed", b"not a record either".to_vec()),
    ];
    let genuine = instance_value(&spoofed, me, &fresh).encode();
    let rt = runtime();
    let answers: Vec<Response<SocketAddr>> = rt.block_on(async {
        let mut stream =
            themis_net::connect(me, a.listen(), a.peer_id(), &themis_net::Config::default())
                .await
                .unwrap();
        announce(&mut stream, &publisher).await;
        let mut answers = Vec::new();
        let values = forged.iter().map(|(_, v)| v.clone()).chain([genuine]);
        for (i, value) in values.enumerate() {
            let store = Request::Store {
                key: Key::object(b"spoofed", 0),
                value,
                ttl_ms: 60_000,
            };
            let answer = stream
                .request(&publisher.dht(nowhere(), i as u64, store))
                .await
                .unwrap();
            match postcard::from_bytes::<Frame>(&answer).unwrap() {
                Frame::Dht {
                    message: Message::Response { body, .. },
                    ..
                } => answers.push(body),
                other => panic!("store {i}: {other:?}"),
            }
        }
        answers
    });
    // (With one-hop routing the publisher is a member now, at an address where nothing
    // answers: replicas it would hold are asked of it, time out, and are asked of the
    // next member, this agent.)
    let (genuine_answer, forged_answers) = answers.split_last().unwrap();
    for ((reason, _), answer) in forged.iter().zip(forged_answers) {
        assert_eq!(*answer, Response::Rejected, "the {reason} value was kept");
    }
    assert_eq!(
        *genuine_answer,
        Response::Ack,
        "the genuine value was refused"
    );
    let mut by_reason = std::collections::BTreeMap::<&str, u64>::new();
    for (reason, _) in &forged {
        *by_reason.entry(reason).or_default() += 1;
    }
    // The junk through the debug API was the first malformed value.
    *by_reason.get_mut("malformed").unwrap() += 1;
    for (reason, n) in by_reason {
        a.expect(RECORDS_REFUSED, &[("reason", reason)], n);
    }
    a.expect(
        DHT_REJECTIONS,
        &[("reason", "InvalidValue")],
        1 + forged.len() as u64,
    );

    let resolved = agent.resolve("spoofed").expect("resolve answers");
    assert_eq!(
        resolved["refused"], 0,
        "nothing forged was kept: {resolved}"
    );
    let instances = resolved["instances"].as_array().unwrap();
    assert_eq!(instances.len(), 1, "{resolved}");
    assert_eq!(instances[0]["id"], workload.printable_id().as_str());
    assert_eq!(instances[0]["endpoint"], "127.0.0.1:7000");
    assert_eq!(instances[0]["endorser"], me.printable_id().as_str());

    register_and_resolve_work(agent, "after-forgeries");
}
