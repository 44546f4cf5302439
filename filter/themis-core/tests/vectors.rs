//! Known-answer tests: handshakes and records made with fixed keys and randomness,
//! checked into `tests/vectors/v3.json`. The same test runs natively and, compiled to
//! `wasm32-wasip2`, under wasmtime (`scripts/test.sh`), so every target must produce
//! the same bytes.
//!
//! Regenerate (only when the protocol changes on purpose):
//! `THEMIS_WRITE_VECTORS=1 cargo test -p themis-core --test vectors`

mod common;

use common::{with_rng, Transcript};
use ring::digest;
use serde::{Deserialize, Serialize};
use themis_core::handshake::{self, Initiator};
use themis_core::HelloGuard;
use themis_core::{ChannelMode, HandshakeConfig, Identity, MeshName, PeerId, Session, Suite};

const VECTORS: &str = include_str!("vectors/v3.json");

#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct Vectors {
    comment: String,
    mesh: String,
    identities: Vec<IdentityVector>,
    handshakes: Vec<HandshakeVector>,
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct IdentityVector {
    /// The 32 random bytes the key pair is generated from.
    key_seed: String,
    public_key: String,
    id: String,
    printable_id: String,
    key_file: String,
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct HandshakeVector {
    /// Indexes into `identities`.
    initiator: usize,
    responder: usize,
    initiator_suites: Vec<Suite>,
    responder_suites: Vec<Suite>,
    records_per_key: u64,
    /// Message 1's `timestamp_ms`; the responder checks it at the same time.
    timestamp_ms: u64,
    initiator_ephemeral: String,
    initiator_nonce: String,
    responder_ephemeral: String,
    responder_nonce: String,
    hello: String,
    hello_reply: String,
    confirm: String,
    session_id: u64,
    suite: Suite,
    records: Vec<RecordVector>,
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct RecordVector {
    from_initiator: bool,
    reply_to: Option<u64>,
    payload: String,
    record: String,
}

fn unhex<const N: usize>(s: &str) -> [u8; N] {
    hex::decode(s).unwrap().try_into().unwrap()
}

fn suites(list: &[Suite]) -> &'static [Suite] {
    match list {
        [Suite::Aes256Gcm, Suite::ChaCha20Poly1305] => &[Suite::Aes256Gcm, Suite::ChaCha20Poly1305],
        [Suite::ChaCha20Poly1305, Suite::Aes256Gcm] => &[Suite::ChaCha20Poly1305, Suite::Aes256Gcm],
        [Suite::Aes256Gcm] => &[Suite::Aes256Gcm],
        [Suite::ChaCha20Poly1305] => &[Suite::ChaCha20Poly1305],
        other => panic!("no static list for {other:?}"),
    }
}

fn make_identity(mesh: &MeshName, seed_hex: &str) -> (Identity, IdentityVector) {
    let seed: [u8; 32] = unhex(seed_hex);
    let identity = with_rng(&[&seed], |rng| Identity::generate(mesh.clone(), rng)).unwrap();
    let vector = IdentityVector {
        key_seed: seed_hex.to_string(),
        public_key: hex::encode(identity.public_key()),
        id: identity.id().to_string(),
        printable_id: identity.printable_id(),
        key_file: identity.to_key_file().to_string(),
    };
    (identity, vector)
}

/// The records each vector session exchanges: a request, its response, then a run
/// long enough to cross a rekey when `records_per_key` is small.
fn record_script() -> Vec<(bool, Option<u64>, Vec<u8>)> {
    let mut script = vec![
        (
            true,
            None,
            b"GET /check HTTP/1.1\r\nhost: check\r\n\r\n".to_vec(),
        ),
        (
            false,
            Some(1),
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok".to_vec(),
        ),
        (true, None, Vec::new()),
    ];
    script.extend((0..6u8).map(|i| (i % 2 == 0, None, vec![i; 1 + 37 * i as usize])));
    script
}

fn run_handshake(ids: &[Identity], spec: &HandshakeVector) -> HandshakeVector {
    let (a, b) = (&ids[spec.initiator], &ids[spec.responder]);
    let config_a = HandshakeConfig {
        suites: suites(&spec.initiator_suites),
        mode: ChannelMode::Stream,
        records_per_key: spec.records_per_key,
        carries: themis_core::Carries::HTTP2,
        options: themis_core::StreamOptions::NONE,
    };
    let config_b = HandshakeConfig {
        suites: suites(&spec.responder_suites),
        ..config_a.clone()
    };
    let (waiting, hello) = with_rng(
        &[
            &unhex::<32>(&spec.initiator_ephemeral),
            &unhex::<32>(&spec.initiator_nonce),
        ],
        |rng| Initiator::start(a, b.id(), &config_a, spec.timestamp_ms, rng),
    )
    .unwrap();
    let (pending, reply) = with_rng(
        &[
            &unhex::<32>(&spec.responder_ephemeral),
            &unhex::<32>(&spec.responder_nonce),
        ],
        |rng| {
            handshake::respond(
                b,
                &hello,
                &config_b,
                &mut HelloGuard::default(),
                spec.timestamp_ms,
                rng,
            )
        },
    )
    .unwrap();
    let (mut sa, confirm) = waiting.read_hello_reply(&reply).unwrap();
    let mut sb = pending.read_confirm(&confirm).unwrap();
    assert_eq!(sa.info().session_id, sb.info().session_id);
    assert_eq!(sa.info().peer_id, b.id());
    assert_eq!(sb.info().peer_id, a.id());
    let transcript = Transcript {
        hello,
        reply,
        confirm,
    };
    let records = record_script()
        .into_iter()
        .map(|(from_initiator, reply_to, payload)| {
            let (sender, receiver): (&mut Session, &mut Session) = if from_initiator {
                (&mut sa, &mut sb)
            } else {
                (&mut sb, &mut sa)
            };
            let (_, record) = sender.seal(&payload, reply_to).unwrap();
            let mut buf = record.clone();
            let opened = receiver.open_in_place(&mut buf).unwrap();
            assert_eq!(opened.payload, &payload[..]);
            assert_eq!(opened.reply_to, reply_to);
            RecordVector {
                from_initiator,
                reply_to,
                payload: hex::encode(&payload),
                record: hex::encode(&record),
            }
        })
        .collect();
    HandshakeVector {
        initiator_suites: spec.initiator_suites.clone(),
        responder_suites: spec.responder_suites.clone(),
        initiator_ephemeral: spec.initiator_ephemeral.clone(),
        initiator_nonce: spec.initiator_nonce.clone(),
        responder_ephemeral: spec.responder_ephemeral.clone(),
        responder_nonce: spec.responder_nonce.clone(),
        hello: hex::encode(&transcript.hello),
        hello_reply: hex::encode(&transcript.reply),
        confirm: hex::encode(&transcript.confirm),
        session_id: sa.info().session_id,
        suite: sa.info().suite,
        records,
        ..*spec
    }
}

fn compute(spec: &Vectors) -> Vectors {
    let mesh = MeshName::new(&spec.mesh).unwrap();
    let (ids, identities): (Vec<_>, Vec<_>) = spec
        .identities
        .iter()
        .map(|v| make_identity(&mesh, &v.key_seed))
        .unzip();
    Vectors {
        comment: spec.comment.clone(),
        mesh: spec.mesh.clone(),
        identities,
        handshakes: spec
            .handshakes
            .iter()
            .map(|h| run_handshake(&ids, h))
            .collect(),
    }
}

#[test]
fn vectors_reproduce_exactly() {
    let expected: Vectors = serde_json::from_str(VECTORS).unwrap();
    let actual = compute(&expected);
    if std::env::var_os("THEMIS_WRITE_VECTORS").is_some() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/vectors/v3.json");
        std::fs::write(path, serde_json::to_string_pretty(&actual).unwrap() + "\n").unwrap();
        return;
    }
    assert_eq!(actual.identities, expected.identities);
    for (a, e) in actual.handshakes.iter().zip(&expected.handshakes) {
        assert_eq!(a.hello, e.hello, "message 1");
        assert_eq!(a.hello_reply, e.hello_reply, "message 2");
        assert_eq!(a.confirm, e.confirm, "message 3");
        assert_eq!(a.records, e.records);
        assert_eq!(a, e);
    }
    assert_eq!(actual, expected);
}

/// The vectors' recorded messages, replayed into fresh state machines, are accepted:
/// this checks the receiving side against the file rather than against itself.
#[test]
fn recorded_messages_are_accepted() {
    let v: Vectors = serde_json::from_str(VECTORS).unwrap();
    let mesh = MeshName::new(&v.mesh).unwrap();
    let ids: Vec<Identity> = v
        .identities
        .iter()
        .map(|i| Identity::from_key_file(mesh.clone(), &i.key_file).unwrap())
        .collect();
    for h in &v.handshakes {
        let config = HandshakeConfig {
            suites: suites(&h.responder_suites),
            mode: ChannelMode::Stream,
            records_per_key: h.records_per_key,
            carries: themis_core::Carries::HTTP2,
            // Recorded before stream options: what a v3 peer of that build reads.
            options: themis_core::StreamOptions::NONE,
        };
        let (pending, reply) = with_rng(
            &[
                &unhex::<32>(&h.responder_ephemeral),
                &unhex::<32>(&h.responder_nonce),
            ],
            |rng| {
                handshake::respond(
                    &ids[h.responder],
                    &hex::decode(&h.hello).unwrap(),
                    &config,
                    &mut HelloGuard::default(),
                    h.timestamp_ms,
                    rng,
                )
            },
        )
        .unwrap();
        assert_eq!(hex::encode(reply), h.hello_reply);
        let mut responder = pending
            .read_confirm(&hex::decode(&h.confirm).unwrap())
            .unwrap();
        assert_eq!(responder.info().session_id, h.session_id);
        assert_eq!(responder.info().suite, h.suite);
        for r in h.records.iter().filter(|r| r.from_initiator) {
            let mut record = hex::decode(&r.record).unwrap();
            let opened = responder.open_in_place(&mut record).unwrap();
            assert_eq!(hex::encode(&opened.payload), r.payload);
        }
    }
}

/// The id is SHA-256(public key || mesh name), computed here independently of the core.
#[test]
fn ids_are_the_hash_of_key_and_mesh() {
    let v: Vectors = serde_json::from_str(VECTORS).unwrap();
    for i in &v.identities {
        let mut input = hex::decode(&i.public_key).unwrap();
        input.extend_from_slice(v.mesh.as_bytes());
        assert_eq!(hex::encode(digest::digest(&digest::SHA256, &input)), i.id);
        let (mesh, id) = PeerId::parse(&i.printable_id).unwrap();
        assert_eq!(mesh.as_str(), v.mesh);
        assert_eq!(id.to_string(), i.id);
    }
}

/// HKDF-Expand to `N` bytes with ring's own API.
fn expand<const N: usize>(prk: &ring::hkdf::Prk, label: &[u8]) -> [u8; N] {
    struct Len(usize);
    impl ring::hkdf::KeyType for Len {
        fn len(&self) -> usize {
            self.0
        }
    }
    let mut out = [0u8; N];
    prk.expand(&[label], Len(N))
        .unwrap()
        .fill(&mut out)
        .unwrap();
    out
}

/// The key schedule recomputed from docs/PROTOCOL.md §3.3, §3.4 and §4 with ring
/// alone, from the vectors' randomness: the session id, the Confirm message, and every
/// record the initiator sent (across a rekey in the second vector). This checks the
/// implementation against the specification, not against itself.
#[test]
fn key_schedule_follows_the_spec() {
    use ring::{aead, agreement, hkdf, hmac};
    let v: Vectors = serde_json::from_str(VECTORS).unwrap();
    for h in &v.handshakes {
        let (hello, reply) = (
            hex::decode(&h.hello).unwrap(),
            hex::decode(&h.hello_reply).unwrap(),
        );
        let reply_share = themis_core::wire::HelloReply::decode(&reply)
            .unwrap()
            .message
            .body
            .ephemeral;
        let ephemeral = with_rng(&[&unhex::<32>(&h.initiator_ephemeral)], |rng| {
            agreement::EphemeralPrivateKey::generate(&agreement::X25519, rng)
        })
        .unwrap();
        let dh = agreement::agree_ephemeral(
            ephemeral,
            &agreement::UnparsedPublicKey::new(&agreement::X25519, &reply_share),
            |secret| secret.to_vec(),
        )
        .unwrap();
        let th: [u8; 32] = {
            let mut ctx = digest::Context::new(&digest::SHA256);
            for part in [&b"themis/1 transcript"[..], &hello, &reply] {
                ctx.update(part);
            }
            ctx.finish().as_ref().try_into().unwrap()
        };
        let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, &th).extract(&dh);

        let session_id = u64::from_le_bytes(expand(&prk, b"themis/1 session id"));
        assert_eq!(session_id, h.session_id);
        let k_confirm: [u8; 32] = expand(&prk, b"themis/1 confirm");
        let mac = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, &k_confirm), &th);
        let mut confirm = vec![themis_core::PROTOCOL_VERSION, 3];
        confirm.extend(session_id.to_le_bytes());
        confirm.extend(mac.as_ref());
        assert_eq!(hex::encode(confirm), h.confirm);

        let algorithm = match h.suite {
            Suite::Aes256Gcm => &aead::AES_256_GCM,
            Suite::ChaCha20Poly1305 => &aead::CHACHA20_POLY1305,
        };
        let receiver = unhex::<32>(&v.identities[h.responder].id);
        let mut secret: [u8; 32] = expand(&prk, b"themis/1 traffic i2r");
        let mut epoch = 0;
        for r in h.records.iter().filter(|r| r.from_initiator) {
            let mut record = hex::decode(&r.record).unwrap();
            let seq = u64::from_le_bytes(record[10..18].try_into().unwrap());
            while epoch < seq / h.records_per_key {
                secret = expand(
                    &hkdf::Prk::new_less_safe(hkdf::HKDF_SHA256, &secret),
                    b"themis/1 next secret",
                );
                epoch += 1;
            }
            let key: [u8; 32] = expand(
                &hkdf::Prk::new_less_safe(hkdf::HKDF_SHA256, &secret),
                b"themis/1 key",
            );
            let key = aead::LessSafeKey::new(aead::UnboundKey::new(algorithm, &key).unwrap());
            let mut nonce = [0u8; 12];
            nonce[4..].copy_from_slice(&seq.to_be_bytes());
            let mut aad = record[..30].to_vec();
            aad.extend(receiver);
            let plaintext = key
                .open_in_place(
                    aead::Nonce::assume_unique_for_key(nonce),
                    aead::Aad::from(aad),
                    &mut record[30..],
                )
                .unwrap();
            assert_eq!(hex::encode(plaintext), r.payload, "record {seq}");
        }
        assert!(
            epoch > 0 || h.records_per_key > 8,
            "the rekey vector crosses an epoch"
        );
    }
}
