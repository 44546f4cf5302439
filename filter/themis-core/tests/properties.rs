#![cfg(not(target_family = "wasm"))]
//! Property tests of the core: round trips, totality of every decoder and state
//! machine on hostile bytes, the printable ids' checksum, the datagram replay window
//! and stream framing.
//!
//! Handshakes are deterministic (fixed randomness), so a property that needs a
//! session makes a fresh one per case; those properties run fewer cases because a
//! handshake costs a few Ed25519 and X25519 operations.

mod common;

use std::sync::OnceLock;

use common::{handshake_with, open, with_lenient_rng, Transcript, NOW_MS};
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::{select, subsequence, Index};
use themis_core::handshake::{self, Initiator, DEFAULT_RECORDS_PER_KEY};
use themis_core::wire::{
    self, Confirm, Hello, HelloReply, Kind, RecordHeader, RECORD_HEADER_LEN, RECORD_OVERHEAD,
    TAG_LEN,
};
use themis_core::HelloGuard;
use themis_core::{
    AwaitingConfirm, AwaitingHelloReply, ChannelError, ChannelMode, HandshakeConfig, Identity,
    MeshName, PeerId, Session, Suite,
};

const MESH: &str = "prop";
/// The salt of every deterministic handshake here.
const SALT: u8 = 0x5a;
/// The Bech32 data alphabet.
const BECH32_CHARSET: &str = "qpzry9x8gf2tvdw0s3jn54khce6mua7l";

// ---------------------------------------------------------------------------------
// Fixtures

fn alice() -> &'static Identity {
    static ID: OnceLock<Identity> = OnceLock::new();
    ID.get_or_init(|| common::identity(MESH, 0xa1))
}

fn bob() -> &'static Identity {
    static ID: OnceLock<Identity> = OnceLock::new();
    ID.get_or_init(|| common::identity(MESH, 0xb0))
}

fn config(suite: Suite, mode: ChannelMode) -> HandshakeConfig {
    HandshakeConfig {
        suites: suite.only(),
        mode,
        records_per_key: DEFAULT_RECORDS_PER_KEY,
        ..HandshakeConfig::default()
    }
}

/// A fresh session pair (alice initiates), identical for identical arguments.
fn sessions(config: &HandshakeConfig) -> (Session, Session, Transcript) {
    handshake_with(alice(), bob(), config, SALT)
}

/// Alice's deterministic message 1 to bob, and the state waiting for the answer.
fn start() -> (AwaitingHelloReply, Vec<u8>) {
    with_lenient_rng(&[&[SALT; 32], &[SALT ^ 0x11; 32]], |rng| {
        Initiator::start(
            alice(),
            bob().id(),
            &HandshakeConfig::default(),
            NOW_MS,
            rng,
        )
    })
    .expect("alice starts")
}

/// Bob's deterministic answer to `hello`.
fn respond(hello: &[u8]) -> Result<(AwaitingConfirm, Vec<u8>), themis_core::HandshakeError> {
    with_lenient_rng(&[&[SALT ^ 0x22; 32], &[SALT ^ 0x33; 32]], |rng| {
        handshake::respond(
            bob(),
            hello,
            &HandshakeConfig::default(),
            &mut HelloGuard::default(),
            NOW_MS,
            rng,
        )
    })
}

/// The genuine messages of the deterministic handshake, and a genuine first record
/// from alice to bob in that session.
struct Genuine {
    hello: Vec<u8>,
    reply: Vec<u8>,
    confirm: Vec<u8>,
    session_id: u64,
    record: Vec<u8>,
}

const GENUINE_PAYLOAD: &[u8] = b"the genuine record";

fn genuine() -> &'static Genuine {
    static GENUINE: OnceLock<Genuine> = OnceLock::new();
    GENUINE.get_or_init(|| {
        let (waiting, hello) = start();
        let (pending, reply) = respond(&hello).expect("bob answers");
        let (mut a, confirm) = waiting
            .read_hello_reply(&reply)
            .expect("alice reads the reply");
        pending
            .read_confirm(&confirm)
            .expect("bob reads the confirmation");
        let (_, record) = a.seal(GENUINE_PAYLOAD, None).expect("alice seals");
        Genuine {
            hello,
            reply,
            confirm,
            session_id: a.info().session_id,
            record,
        }
    })
}

// ---------------------------------------------------------------------------------
// Strategies

fn suite() -> impl Strategy<Value = Suite> {
    select(Suite::ALL.to_vec())
}

fn mode() -> impl Strategy<Value = ChannelMode> {
    select(vec![ChannelMode::Stream, ChannelMode::Datagram])
}

/// `reply_to` as a caller passes it. `Some(0)` is refused (0 on the wire means "no
/// reply"; see `reply_to_zero_is_refused`).
fn reply_to() -> impl Strategy<Value = Option<u64>> {
    proptest::option::of(1..=u64::MAX)
}

/// Arbitrary bytes, and arbitrary bytes behind a valid preamble (version 1 and a
/// known kind) so that they get past the first check.
fn junk() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        vec(any::<u8>(), 0..700),
        (1u8..=4, vec(any::<u8>(), 0..700)).prop_map(|(kind, mut bytes)| {
            bytes.splice(..0, [wire::PROTOCOL_VERSION, kind]);
            bytes
        }),
    ]
}

/// `genuine` with one change that always makes it differ: a byte flipped, cut short,
/// or extended.
fn mutant(genuine: &[u8]) -> impl Strategy<Value = Vec<u8>> {
    let (flip, cut, extend) = (genuine.to_vec(), genuine.to_vec(), genuine.to_vec());
    prop_oneof![
        (any::<Index>(), 1..=u8::MAX).prop_map(move |(at, mask)| {
            let mut bytes = flip.clone();
            bytes[at.index(flip.len())] ^= mask;
            bytes
        }),
        any::<Index>().prop_map(move |at| cut[..at.index(cut.len())].to_vec()),
        vec(any::<u8>(), 1..64).prop_map(move |tail| [&extend[..], &tail].concat()),
    ]
}

/// Hostile stand-ins for a handshake message: junk, or the genuine one changed.
fn hostile(genuine: &[u8]) -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![junk(), mutant(genuine)]
}

/// Records with the right session id and a consistent length, but forged contents:
/// they get through every check before the AEAD (small sequence numbers pass the
/// replay window, huge ones exercise the key-epoch selection).
fn forged_record() -> impl Strategy<Value = Vec<u8>> {
    let seq = prop_oneof![0..4u64, any::<u64>()];
    (seq, any::<u64>(), vec(any::<u8>(), TAG_LEN..TAG_LEN + 64)).prop_map(
        |(seq, reply_to, body)| {
            let header = RecordHeader {
                version: wire::PROTOCOL_VERSION,
                kind: Kind::Record as u8,
                session_id: genuine().session_id,
                seq,
                reply_to,
                len: (body.len() - TAG_LEN) as u32,
            };
            [&header.encode()[..], &body].concat()
        },
    )
}

/// Strings that look like printable ids: an hrp, the separator, data characters.
fn id_like() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        "[a-zA-Z0-9.-]{1,40}1[qpzry9x8gf2tvdw0s3jn54khce6mua7l]{0,70}"
    ]
}

fn mesh_name() -> impl Strategy<Value = String> {
    "[a-z0-9][a-z0-9.-]{0,30}"
}

// ---------------------------------------------------------------------------------
// Key files

/// PKCS#8 v1 (RFC 8410) for an Ed25519 seed.
fn pkcs8_v1(seed: &[u8; 32]) -> Vec<u8> {
    const PREFIX: &[u8] = &[
        0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04,
        0x20,
    ];
    [PREFIX, seed].concat()
}

/// PKCS#8 v2 (RFC 8410, `OneAsymmetricKey`) carrying a public key too.
fn pkcs8_v2(seed: &[u8; 32], public_key: &[u8; 32]) -> Vec<u8> {
    const PREFIX: &[u8] = &[
        0x30, 0x51, 0x02, 0x01, 0x01, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04,
        0x20,
    ];
    [PREFIX, seed, &[0x81, 0x21, 0x00], public_key].concat()
}

fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &b)| n | u32::from(b) << (16 - 8 * i));
        for i in 0..4 {
            let c = if i <= chunk.len() {
                ALPHABET[(n >> (18 - 6 * i) & 63) as usize]
            } else {
                b'='
            };
            out.push(c as char);
        }
    }
    out
}

/// A PEM `PRIVATE KEY` around `der`, with the 64-character lines RFC 7468 asks for.
fn pem(der: &[u8]) -> String {
    let b64 = base64(der);
    let lines: Vec<&str> = b64
        .as_bytes()
        .chunks(64)
        .map(|l| std::str::from_utf8(l).unwrap())
        .collect();
    format!(
        "-----BEGIN PRIVATE KEY-----\n{}\n-----END PRIVATE KEY-----\n",
        lines.join("\n")
    )
}

fn identity_from_seed(seed: &[u8; 32]) -> Identity {
    with_lenient_rng(&[&seed[..]], |rng| {
        Identity::generate(MeshName::new(MESH).unwrap(), rng)
    })
    .unwrap()
}

fn key_file_text() -> impl Strategy<Value = String> {
    let seed = [7; 32];
    let v1 = pkcs8_v1(&seed);
    let v2 = pkcs8_v2(&seed, identity_from_seed(&seed).public_key());
    let text = pem(&v1);
    prop_oneof![
        any::<String>(),
        mutant(&v1).prop_map(|der| pem(&der)),
        mutant(&v2).prop_map(|der| pem(&der)),
        vec(any::<u8>(), 0..120).prop_map(|der| pem(&der)),
        (any::<Index>(), any::<char>()).prop_map(move |(at, c)| {
            let mut chars: Vec<char> = text.chars().collect();
            *at.get_mut(&mut chars) = c;
            chars.into_iter().collect()
        }),
    ]
}

// ---------------------------------------------------------------------------------
// Round trips

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// Every record opens to what was sealed, whatever the suite, mode and direction,
    /// and `seal` and `seal_in_place` produce the same bytes from the same state.
    #[test]
    fn seal_open_round_trip(
        suite in suite(),
        mode in mode(),
        records in vec((any::<bool>(), vec(any::<u8>(), 0..8192), reply_to()), 1..6),
    ) {
        let config = config(suite, mode);
        // Two identical pairs: one seals with the Vec API, the other in place.
        let (mut a1, mut b1, _) = sessions(&config);
        let (mut a2, mut b2, _) = sessions(&config);
        prop_assert_eq!(a1.info().suite, suite);
        let mut next_seq = [1u64, 1u64];
        for (from_initiator, payload, reply_to) in records {
            let (sender1, receiver1, sender2, receiver2) = if from_initiator {
                (&mut a1, &mut b1, &mut a2, &mut b2)
            } else {
                (&mut b1, &mut a1, &mut b2, &mut a2)
            };
            let (seq, record) = sender1.seal(&payload, reply_to).unwrap();
            let mut in_place = vec![0u8; payload.len() + RECORD_OVERHEAD];
            in_place[RECORD_HEADER_LEN..][..payload.len()].copy_from_slice(&payload);
            let seq_in_place = sender2.seal_in_place(&mut in_place, reply_to).unwrap();

            let expected_seq = &mut next_seq[usize::from(from_initiator)];
            prop_assert_eq!(seq, *expected_seq);
            *expected_seq += 1;
            prop_assert_eq!(seq_in_place, seq);
            prop_assert_eq!(&in_place, &record);
            prop_assert_eq!(record.len(), payload.len() + RECORD_OVERHEAD);

            for (receiver, record) in [(receiver1, record), (receiver2, in_place)] {
                let mut buf = record;
                let opened = receiver.open_in_place(&mut buf).unwrap();
                prop_assert_eq!(opened.seq, seq);
                prop_assert_eq!(opened.reply_to, reply_to);
                prop_assert_eq!(&opened.payload[..], &payload[..]);
            }
        }
    }

    /// Rekeying is invisible: with a tiny `records_per_key` a run of records crosses
    /// many epochs, in both modes, and each one opens.
    #[test]
    fn rekeying_is_transparent(
        suite in suite(),
        mode in mode(),
        records_per_key in 0u64..6,
        count in 1usize..40,
    ) {
        let config = HandshakeConfig { records_per_key, ..config(suite, mode) };
        let (mut a, mut b, _) = sessions(&config);
        for i in 0..count {
            let payload = i.to_le_bytes();
            let (seq, record) = a.seal(&payload, None).unwrap();
            prop_assert_eq!(open(&mut b, &record), Ok(payload.to_vec()), "record {}", seq);
        }
    }
}

#[test]
fn reply_to_zero_is_refused() {
    let (mut a, mut b, _) = sessions(&HandshakeConfig::default());
    assert_eq!(
        a.seal(b"x", Some(0)).err(),
        Some(ChannelError::InvalidReplyTo)
    );
    // Nothing was used up: the next record is still number 1.
    let (seq, record) = a.seal(b"x", None).unwrap();
    assert_eq!((seq, open(&mut b, &record)), (1, Ok(b"x".to_vec())));
}

proptest! {
    /// The printable form parses back to the mesh and id it was made from.
    #[test]
    fn printable_ids_round_trip(id in any::<[u8; 32]>(), mesh in mesh_name()) {
        let mesh = MeshName::new(&mesh).unwrap();
        let printable = PeerId(id).printable(&mesh);
        prop_assert_eq!(PeerId::parse(&printable), Ok((mesh.clone(), PeerId(id))));
        prop_assert_eq!(PeerId::parse_in(&printable, &mesh), Ok(PeerId(id)));
    }

    /// Bech32m detects any one substituted character, in the mesh name, the id or
    /// the checksum.
    #[test]
    fn printable_ids_detect_a_substitution(
        id in any::<[u8; 32]>(),
        mesh in mesh_name(),
        at in any::<Index>(),
        replacement in any::<Index>(),
    ) {
        let mesh = MeshName::new(&mesh).unwrap();
        let mut chars: Vec<char> = PeerId(id).printable(&mesh).chars().collect();
        // Every position but the separator, which follows the mesh name.
        let positions: Vec<usize> = (0..chars.len()).filter(|&i| i != mesh.as_str().len()).collect();
        let at = *at.get(&positions);
        let alternatives: Vec<char> = BECH32_CHARSET.chars().filter(|&c| c != chars[at]).collect();
        chars[at] = *replacement.get(&alternatives);
        let typo: String = chars.into_iter().collect();
        prop_assert!(PeerId::parse(&typo).is_err(), "{} parsed", typo);
    }
}

// ---------------------------------------------------------------------------------
// Totality: hostile bytes give errors, never panics

proptest! {
    /// The wire decoders and the text parsers return on any input. (That they agree
    /// with each other is the `wire_decoders` fuzz target's check.)
    #[test]
    fn decoders_are_total(bytes in junk()) {
        let _ = wire::peek_kind(&bytes);
        let _ = wire::frame_len(&bytes);
        let _ = Hello::decode(&bytes);
        let _ = HelloReply::decode(&bytes);
        let _ = Confirm::decode(&bytes);
        let _ = RecordHeader::decode(&bytes);
        let text = String::from_utf8_lossy(&bytes);
        if let Ok(mesh) = MeshName::new(&text) {
            prop_assert_eq!(mesh.as_str(), &*text);
        }
        let _ = PeerId::parse(&text);
    }

    #[test]
    fn id_parsing_is_total(text in id_like()) {
        if let Ok((mesh, id)) = PeerId::parse(&text) {
            prop_assert_eq!(id.printable(&mesh), text.clone());
        }
        let _ = MeshName::new(&text);
    }

    #[test]
    fn key_file_loading_is_total(text in key_file_text()) {
        if let Ok(identity) = Identity::from_key_file(MeshName::new(MESH).unwrap(), &text) {
            let again = Identity::from_key_file(identity.mesh().clone(), &identity.to_key_file());
            prop_assert_eq!(again.unwrap().id(), identity.id());
        }
    }

    /// A key file holds the seed `Identity::generate` draws; a v2 file's public key
    /// must match it.
    #[test]
    fn key_files_load(seed in any::<[u8; 32]>(), at in any::<Index>(), mask in 1..=u8::MAX) {
        let mesh = MeshName::new(MESH).unwrap();
        let expected = identity_from_seed(&seed);
        let v1 = Identity::from_key_file(mesh.clone(), &pem(&pkcs8_v1(&seed))).unwrap();
        prop_assert_eq!(v1.id(), expected.id());
        let v2 = Identity::from_key_file(mesh.clone(), &pem(&pkcs8_v2(&seed, expected.public_key())));
        prop_assert_eq!(v2.unwrap().id(), expected.id());
        let mut wrong = *expected.public_key();
        wrong[at.index(32)] ^= mask;
        let mismatched = Identity::from_key_file(mesh, &pem(&pkcs8_v2(&seed, &wrong)));
        prop_assert_eq!(mismatched.unwrap_err(), themis_core::KeyFileError::KeyMismatch);
    }

    /// The responder rejects anything but the genuine message 1, and returns.
    #[test]
    fn respond_is_total(bytes in hostile(&genuine().hello)) {
        prop_assert_eq!(respond(&bytes).is_ok(), bytes == genuine().hello);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn read_hello_reply_is_total(bytes in hostile(&genuine().reply)) {
        let (waiting, _) = start();
        prop_assert_eq!(waiting.read_hello_reply(&bytes).is_ok(), bytes == genuine().reply);
    }

    #[test]
    fn read_confirm_is_total(bytes in hostile(&genuine().confirm)) {
        let (_, hello) = start();
        let (pending, _) = respond(&hello).unwrap();
        prop_assert_eq!(pending.read_confirm(&bytes).is_ok(), bytes == genuine().confirm);
    }

    /// Opening hostile bytes fails and changes nothing: the genuine record still
    /// opens afterwards.
    #[test]
    fn open_is_total_and_failures_change_nothing(
        mode in mode(),
        bytes in prop_oneof![junk(), mutant(&genuine().record), forged_record()],
    ) {
        let (mut a, mut b, _) = sessions(&HandshakeConfig { mode, ..HandshakeConfig::default() });
        let (_, record) = a.seal(GENUINE_PAYLOAD, None).unwrap();
        prop_assert_eq!(&record, &genuine().record);
        prop_assume!(bytes != record);
        for session in [&mut b, &mut a] {
            let mut buf = bytes.clone();
            prop_assert!(session.open_in_place(&mut buf).is_err());
        }
        prop_assert_eq!(open(&mut b, &record), Ok(GENUINE_PAYLOAD.to_vec()));
    }
}

// ---------------------------------------------------------------------------------
// Ordering

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// Datagrams may arrive in any order, with gaps: each opens exactly once, a
    /// second copy is a replay, and the ones held back still open later.
    #[test]
    fn datagrams_open_once_in_any_order(
        suite in suite(),
        delivered in subsequence((1..=64u64).collect::<Vec<_>>(), 1..=64).prop_shuffle(),
    ) {
        let (mut a, mut b, _) = sessions(&config(suite, ChannelMode::Datagram));
        let records: Vec<Vec<u8>> =
            (1..=64u64).map(|i| a.seal(&i.to_le_bytes(), Some(i)).unwrap().1).collect();
        let record = |seq: u64| records[seq as usize - 1].clone();
        for &seq in &delivered {
            let mut buf = record(seq);
            let opened = b.open_in_place(&mut buf).unwrap();
            prop_assert_eq!((opened.seq, opened.reply_to), (seq, Some(seq)));
            prop_assert_eq!(&opened.payload[..], &seq.to_le_bytes()[..]);
        }
        for &seq in &delivered {
            let mut buf = record(seq);
            prop_assert_eq!(b.open_in_place(&mut buf).unwrap_err(), ChannelError::Replay(seq));
        }
        for seq in (1..=64u64).filter(|seq| !delivered.contains(seq)) {
            prop_assert_eq!(open(&mut b, &record(seq)), Ok(seq.to_le_bytes().to_vec()));
        }
    }

    /// A stream carrying the handshake and records, read in arbitrary chunks, splits
    /// back into exactly the messages sent.
    #[test]
    fn stream_framing_splits_messages(
        payloads in vec((any::<bool>(), vec(any::<u8>(), 0..600)), 0..6),
        chunk_sizes in vec(1usize..=300, 1..20),
    ) {
        let (mut a, mut b, transcript) = sessions(&HandshakeConfig::default());
        let mut messages = vec![transcript.hello, transcript.reply, transcript.confirm];
        for (from_initiator, payload) in payloads {
            let sender = if from_initiator { &mut a } else { &mut b };
            messages.push(sender.seal(&payload, None).unwrap().1);
        }
        let stream = messages.concat();

        let mut received = Vec::new();
        let mut buf = Vec::new();
        let mut rest = &stream[..];
        for &size in chunk_sizes.iter().cycle() {
            if rest.is_empty() {
                break;
            }
            let (chunk, tail) = rest.split_at(size.min(rest.len()));
            buf.extend_from_slice(chunk);
            rest = tail;
            while let Some(n) = wire::frame_len(&buf).unwrap() {
                if n > buf.len() {
                    break;
                }
                received.push(buf.drain(..n).collect::<Vec<u8>>());
            }
        }
        prop_assert!(buf.is_empty(), "{} bytes left over", buf.len());
        prop_assert_eq!(received, messages);
    }
}

// ---------------------------------------------------------------------------------
// Regressions: core issues these tests and the fuzz targets found, now fixed.

/// An id is 256 bits; its 52 Bech32 characters hold 260, so the last character
/// carries 4 padding bits. `PeerId::parse` does not check that they are zero, so
/// every id has 16 spellings that parse to it, and anything that compares printable
/// ids as text (allow or deny lists, logs) can be given an alias.
#[test]
fn printable_ids_are_canonical() {
    let canonical = "demo1qqqsyqcyq5rqwzqfpg9scrgwpugpzysnzs23v9ccrydpk8qarc0s2tjh7v";
    // The same id with the padding bits of the last data character ('s' -> 'l') set,
    // and a valid checksum.
    let alias = "demo1qqqsyqcyq5rqwzqfpg9scrgwpugpzysnzs23v9ccrydpk8qarc0l4xptp5";
    let (mesh, id) = PeerId::parse(canonical).unwrap();
    assert_eq!(id.printable(&mesh), canonical);
    assert!(
        PeerId::parse(alias).is_err(),
        "{alias} parsed as {mesh}/{id}"
    );
}

/// `frame_len` refuses a handshake message longer than `MAX_HANDSHAKE_LEN`, both
/// while it is incomplete and once all of it is buffered (it used to return the
/// length of a complete one).
#[test]
fn frame_len_bounds_complete_handshake_messages() {
    // Version, kind, suites, records per key (varint 16), a mesh name of 3200 bytes,
    // five 32-byte fields, the timestamp (varint 1), carries, no delegation, no
    // endorsement, signature.
    let mut hello = vec![wire::PROTOCOL_VERSION, 1, 3, 16, 0x80, 0x19];
    hello.extend([b'a'; 3200]);
    hello.extend([0; 5 * 32 + 1 + 3 + 64]);
    assert!(matches!(
        wire::frame_len(&hello[..3100]),
        Err(wire::WireError::TooLarge { .. })
    ));
    assert!(matches!(
        Hello::decode(&hello),
        Err(wire::WireError::TooLarge { .. })
    ));
    let framed = wire::frame_len(&hello);
    assert!(
        matches!(framed, Err(wire::WireError::TooLarge { .. })),
        "{framed:?}"
    );
}
