//! Attacks on the key agreement and the secure channel. Each test plays an attacker
//! with full control of the network (Dolev-Yao) and asserts the exact rejection.
//!
//! Crafted messages are signed here with ring directly, following the digests in
//! docs/PROTOCOL.md, so these tests also check that document.

mod common;

use common::{
    handshake, handshake_with, identity, open, with_lenient_rng, with_rng, Transcript, NOW_MS,
};
use ring::digest;
use ring::signature::Ed25519KeyPair;
use themis_core::handshake::{self, Initiator};
use themis_core::wire::{
    self, Hello, HelloBody, HelloReply, HelloReplyBody, Kind, Signature, WireError,
    MAX_HANDSHAKE_LEN, MAX_RECORD_PAYLOAD, RECORD_HEADER_LEN, RECORD_OVERHEAD,
};
use themis_core::HelloGuard;
use themis_core::{
    AwaitingConfirm, AwaitingHelloReply, Carries, ChannelError, ChannelMode, HandshakeConfig,
    HandshakeError, Identity, PeerId, StreamOptions, Suite, PROTOCOL_VERSION,
};

const MESH: &str = "adversary";
const ALICE: u8 = 1;
const BOB: u8 = 2;
const MALLORY: u8 = 3;

fn alice() -> Identity {
    identity(MESH, ALICE)
}
fn bob() -> Identity {
    identity(MESH, BOB)
}
fn mallory() -> Identity {
    identity(MESH, MALLORY)
}

fn config() -> HandshakeConfig {
    HandshakeConfig::default()
}

fn sha256(parts: &[&[u8]]) -> [u8; 32] {
    let mut ctx = digest::Context::new(&digest::SHA256);
    parts.iter().for_each(|p| ctx.update(p));
    ctx.finish().as_ref().try_into().unwrap()
}

/// Signs and encodes message 1 with the key of seed `signer` (docs/PROTOCOL.md §3.1).
fn craft_hello(body: &HelloBody<'_>, signer: u8) -> Vec<u8> {
    let mut bytes = postcard::to_allocvec(body).unwrap();
    let digest = sha256(&[b"themis/1 hello signature", &bytes]);
    let key = Ed25519KeyPair::from_seed_unchecked(&[signer; 32]).unwrap();
    let sig: [u8; 64] = key.sign(&digest).as_ref().try_into().unwrap();
    bytes.extend(postcard::to_allocvec(&Signature(sig)).unwrap());
    bytes
}

/// Signs and encodes message 2, bound to `hello` (docs/PROTOCOL.md §3.2).
fn craft_reply(hello: &[u8], body: &HelloReplyBody, signer: u8) -> Vec<u8> {
    let mut bytes = postcard::to_allocvec(body).unwrap();
    let digest = sha256(&[b"themis/1 hello-reply signature", &sha256(&[hello]), &bytes]);
    let key = Ed25519KeyPair::from_seed_unchecked(&[signer; 32]).unwrap();
    let sig: [u8; 64] = key.sign(&digest).as_ref().try_into().unwrap();
    bytes.extend(postcard::to_allocvec(&Signature(sig)).unwrap());
    bytes
}

/// Alice's state after sending a hello to `to`, deterministic for a given salt.
fn alice_starts(to: PeerId, config: &HandshakeConfig, salt: u8) -> (AwaitingHelloReply, Vec<u8>) {
    with_rng(&[&[salt; 32], &[salt ^ 0x11; 32]], |rng| {
        Initiator::start(&alice(), to, config, NOW_MS, rng)
    })
    .unwrap()
}

fn respond_as(
    who: &Identity,
    hello: &[u8],
    config: &HandshakeConfig,
    salt: u8,
) -> Result<(AwaitingConfirm, Vec<u8>), HandshakeError> {
    with_lenient_rng(&[&[salt ^ 0x22; 32], &[salt ^ 0x33; 32]], |rng| {
        handshake::respond(who, hello, config, &mut HelloGuard::default(), NOW_MS, rng)
    })
}

fn hello_body(bytes: &[u8]) -> HelloBody<'_> {
    Hello::decode(bytes).unwrap().message.body
}

fn reply_body(bytes: &[u8]) -> HelloReplyBody {
    HelloReply::decode(bytes).unwrap().message.body
}

// ---- Replay ------------------------------------------------------------------------

#[test]
fn a_replayed_hello_never_yields_a_confirmed_session() {
    let (_, _, t) = handshake(&alice(), &bob());
    // Mallory replays Alice's hello; Bob answers with fresh randomness.
    let (pending, reply) = respond_as(&bob(), &t.hello, &config(), 0x99).unwrap();
    assert_ne!(reply, t.reply);
    // She cannot compute a key confirmation: neither Alice's old one ...
    assert_eq!(
        pending.read_confirm(&t.confirm).err(),
        Some(HandshakeError::BadKeyConfirmation)
    );
    // ... nor one with the right session id and a guessed MAC.
    let (pending, _) = respond_as(&bob(), &t.hello, &config(), 0x99).unwrap();
    let guess = wire::Confirm {
        version: PROTOCOL_VERSION,
        kind: Kind::Confirm as u8,
        session_id: pending.session_id(),
        mac: [0; 32],
    };
    let guess = postcard::to_allocvec(&guess).unwrap();
    assert_eq!(
        pending.read_confirm(&guess).err(),
        Some(HandshakeError::BadKeyConfirmation)
    );
}

#[test]
fn a_replayed_hello_reply_fails_a_new_handshake() {
    let (_, _, old) = handshake(&alice(), &bob());
    let (waiting, _) = alice_starts(bob().id(), &config(), 0x77);
    // The old reply is signed over the old hello's hash.
    assert_eq!(
        waiting.read_hello_reply(&old.reply).err(),
        Some(HandshakeError::BadSignature)
    );
}

#[test]
fn a_replayed_confirm_fails_another_handshake() {
    let (_, _, old) = handshake(&alice(), &bob());
    let (_, hello) = alice_starts(bob().id(), &config(), 0x77);
    let (pending, _) = respond_as(&bob(), &hello, &config(), 0x77).unwrap();
    assert_eq!(
        pending.read_confirm(&old.confirm).err(),
        Some(HandshakeError::BadKeyConfirmation)
    );
}

#[test]
fn replayed_records_are_rejected() {
    let (mut a, mut b, _) = handshake(&alice(), &bob());
    let (_, r1) = a.seal(b"one", None).unwrap();
    assert_eq!(open(&mut b, &r1).unwrap(), b"one");
    assert_eq!(open(&mut b, &r1), Err(ChannelError::Replay(1)));
}

#[test]
fn reordered_and_dropped_stream_records_are_rejected() {
    let (mut a, mut b, _) = handshake(&alice(), &bob());
    let records: Vec<_> = (0..3).map(|i| a.seal(&[i], None).unwrap().1).collect();
    assert_eq!(
        open(&mut b, &records[1]),
        Err(ChannelError::OutOfOrder {
            expected: 1,
            got: 2
        })
    );
    assert_eq!(open(&mut b, &records[0]).unwrap(), [0]);
    // Record 2 was dropped by the attacker: record 3 shows the gap.
    assert_eq!(
        open(&mut b, &records[2]),
        Err(ChannelError::OutOfOrder {
            expected: 2,
            got: 3
        })
    );
}

#[test]
fn datagrams_may_reorder_but_each_opens_once() {
    let config = HandshakeConfig {
        mode: ChannelMode::Datagram,
        ..config()
    };
    let (mut a, mut b, _) = handshake_with(&alice(), &bob(), &config, 5);
    let records: Vec<_> = (0..200u8).map(|i| a.seal(&[i], None).unwrap().1).collect();
    for i in [3usize, 0, 2, 1, 9, 5] {
        assert_eq!(open(&mut b, &records[i]).unwrap(), [i as u8]);
    }
    assert_eq!(open(&mut b, &records[5]), Err(ChannelError::Replay(6)));
    assert_eq!(open(&mut b, &records[199]).unwrap(), [199]);
    // Record 4 (seq 5) is now more than the window behind the newest.
    assert_eq!(open(&mut b, &records[4]), Err(ChannelError::Replay(5)));
    assert_eq!(open(&mut b, &records[100]).unwrap(), [100]);
}

// ---- Reflection --------------------------------------------------------------------

#[test]
fn reflected_records_are_rejected() {
    let (mut a, mut b, _) = handshake(&alice(), &bob());
    let (_, to_bob) = a.seal(b"for bob", None).unwrap();
    // Sent back to Alice: same session id and sequence number, other direction's key.
    assert_eq!(open(&mut a, &to_bob), Err(ChannelError::Authentication));
    let (_, to_alice) = b.seal(b"for alice", None).unwrap();
    assert_eq!(open(&mut b, &to_alice), Err(ChannelError::Authentication));
}

#[test]
fn reflected_handshake_messages_are_rejected() {
    let (waiting, hello) = alice_starts(bob().id(), &config(), 1);
    // Alice's hello reflected to Alice as a responder: it names Bob.
    assert_eq!(
        respond_as(&alice(), &hello, &config(), 1).err(),
        Some(HandshakeError::NotForMe)
    );
    // ... and as the reply she waits for.
    assert_eq!(
        waiting.read_hello_reply(&hello).err(),
        Some(HandshakeError::Wire(WireError::UnexpectedKind {
            expected: Kind::HelloReply,
            got: Kind::Hello
        }))
    );
    // Bob's reply reflected to Bob as a hello.
    let (_, reply) = respond_as(&bob(), &hello, &config(), 1).unwrap();
    assert_eq!(
        respond_as(&bob(), &reply, &config(), 1).err(),
        Some(HandshakeError::Wire(WireError::UnexpectedKind {
            expected: Kind::Hello,
            got: Kind::HelloReply
        }))
    );
}

// ---- Tampering ---------------------------------------------------------------------

/// Every byte of `message`, XORed with each mask, must make `stage` fail.
fn assert_every_flip_fails<E: std::fmt::Debug>(
    message: &[u8],
    mut stage: impl FnMut(&[u8]) -> Result<(), E>,
) {
    for i in 0..message.len() {
        for mask in [0x01u8, 0x80, 0xff] {
            let mut tampered = message.to_vec();
            tampered[i] ^= mask;
            assert!(
                stage(&tampered).is_err(),
                "flipping byte {i} with {mask:#04x} was accepted"
            );
        }
    }
}

#[test]
fn every_byte_of_every_handshake_message_is_protected() {
    let salt = 0x42;
    let t: Transcript = handshake_with(&alice(), &bob(), &config(), salt).2;
    assert_every_flip_fails(&t.hello, |m| {
        respond_as(&bob(), m, &config(), salt).map(drop)
    });
    assert_every_flip_fails(&t.reply, |m| {
        let (waiting, _) = alice_starts(bob().id(), &config(), salt);
        waiting.read_hello_reply(m).map(drop)
    });
    assert_every_flip_fails(&t.confirm, |m| {
        let (pending, _) = respond_as(&bob(), &t.hello, &config(), salt).unwrap();
        pending.read_confirm(m).map(drop)
    });
    // The untampered messages still complete (the loops above would pass vacuously
    // if the deterministic re-runs did not reproduce the original handshake).
    let (waiting, _) = alice_starts(bob().id(), &config(), salt);
    assert!(waiting.read_hello_reply(&t.reply).is_ok());
    let (pending, _) = respond_as(&bob(), &t.hello, &config(), salt).unwrap();
    assert!(pending.read_confirm(&t.confirm).is_ok());
}

#[test]
fn tampering_with_the_version_and_kind_bytes_is_named() {
    let t = handshake(&alice(), &bob()).2;
    let mut hello = t.hello.clone();
    hello[0] = 1; // version 1's Hello had no timestamp
    assert_eq!(
        respond_as(&bob(), &hello, &config(), 0).err(),
        Some(HandshakeError::Wire(WireError::UnsupportedVersion(1)))
    );
    hello[0] = PROTOCOL_VERSION;
    hello[1] = 77;
    assert_eq!(
        respond_as(&bob(), &hello, &config(), 0).err(),
        Some(HandshakeError::Wire(WireError::UnknownKind(77)))
    );
    let mut confirm = t.confirm.clone();
    confirm[0] = 0;
    let (pending, _) = respond_as(&bob(), &t.hello, &config(), 0x42).unwrap();
    assert_eq!(
        pending.read_confirm(&confirm).err(),
        Some(HandshakeError::Wire(WireError::UnsupportedVersion(0)))
    );
}

#[test]
fn every_byte_of_a_record_is_protected_and_failures_change_nothing() {
    let (mut a, mut b, _) = handshake(&alice(), &bob());
    let (seq, record) = a.seal(b"GET /secret HTTP/1.1", Some(7)).unwrap();
    assert_every_flip_fails(&record, |m| open(&mut b, m).map(drop));
    // Named rejections by field: version, kind, session id, sequence number, reply_to,
    // length, ciphertext, tag.
    let flip = |i: usize| {
        let mut r = record.clone();
        r[i] ^= 0x01;
        r
    };
    assert_eq!(
        open(&mut b, &flip(0)),
        Err(ChannelError::Wire(WireError::UnsupportedVersion(
            PROTOCOL_VERSION ^ 0x01
        )))
    );
    assert_eq!(
        open(&mut b, &flip(1)),
        Err(ChannelError::Wire(WireError::UnknownKind(5)))
    );
    assert_eq!(open(&mut b, &flip(2)), Err(ChannelError::WrongSession));
    assert_eq!(open(&mut b, &flip(10)), Err(ChannelError::Replay(0)));
    assert_eq!(open(&mut b, &flip(18)), Err(ChannelError::Authentication));
    assert_eq!(
        open(&mut b, &flip(26)),
        Err(ChannelError::LengthMismatch {
            expected: record.len() + 1,
            got: record.len()
        })
    );
    assert_eq!(
        open(&mut b, &flip(RECORD_HEADER_LEN)),
        Err(ChannelError::Authentication)
    );
    assert_eq!(
        open(&mut b, &flip(record.len() - 1)),
        Err(ChannelError::Authentication)
    );
    // None of that moved the receiver: the genuine record still opens, exactly once.
    let mut buf = record.clone();
    let opened = b.open_in_place(&mut buf).unwrap();
    assert_eq!(
        (opened.seq, opened.reply_to, &opened.payload[..]),
        (seq, Some(7), &b"GET /secret HTTP/1.1"[..])
    );
}

#[test]
fn records_of_another_session_are_rejected() {
    let (mut a1, _, _) = handshake_with(&alice(), &bob(), &config(), 1);
    let (_, mut b2, _) = handshake_with(&alice(), &bob(), &config(), 2);
    let (_, record) = a1.seal(b"x", None).unwrap();
    assert_eq!(open(&mut b2, &record), Err(ChannelError::WrongSession));
    // Rewriting the session id does not help: the header is authenticated.
    let mut rewritten = record.clone();
    rewritten[2..10].copy_from_slice(&b2.info().session_id.to_le_bytes());
    assert_eq!(open(&mut b2, &rewritten), Err(ChannelError::Authentication));
}

#[test]
fn a_response_must_answer_its_request() {
    let (mut a, mut b, _) = handshake(&alice(), &bob());
    let (request, r) = a.seal(b"request", None).unwrap();
    open(&mut b, &r).unwrap();
    let (_, reply) = b
        .seal(b"response to something else", Some(request + 6))
        .unwrap();
    let mut buf = reply.clone();
    let opened = a.open_in_place(&mut buf).unwrap();
    assert_eq!(
        opened.expect_reply_to(request),
        Err(ChannelError::UnexpectedReply {
            expected: request,
            got: Some(request + 6)
        })
    );
    let (_, reply) = b.seal(b"response", Some(request)).unwrap();
    let mut buf = reply.clone();
    assert_eq!(
        a.open_in_place(&mut buf).unwrap().expect_reply_to(request),
        Ok(())
    );
}

// ---- Truncation and oversize input --------------------------------------------------

#[test]
fn truncated_messages_are_rejected() {
    let t = handshake(&alice(), &bob()).2;
    let truncated = Err(HandshakeError::Wire(WireError::Truncated));
    for len in 0..t.hello.len() {
        assert_eq!(
            respond_as(&bob(), &t.hello[..len], &config(), 0).map(drop),
            truncated,
            "hello[..{len}]"
        );
        assert_eq!(wire::frame_len(&t.hello[..len]), Ok(None));
    }
    for len in 0..t.reply.len() {
        let (waiting, _) = alice_starts(bob().id(), &config(), 0x42);
        assert_eq!(
            waiting.read_hello_reply(&t.reply[..len]).map(drop),
            truncated,
            "reply[..{len}]"
        );
    }
    for len in 0..t.confirm.len() {
        let (pending, _) = respond_as(&bob(), &t.hello, &config(), 0x42).unwrap();
        assert_eq!(
            pending.read_confirm(&t.confirm[..len]).map(drop),
            truncated,
            "confirm[..{len}]"
        );
    }
    let (mut a, mut b, _) = handshake(&alice(), &bob());
    let (_, record) = a.seal(b"0123456789", None).unwrap();
    for len in 0..record.len() {
        let expected = if len < RECORD_HEADER_LEN {
            ChannelError::Wire(WireError::Truncated)
        } else {
            ChannelError::LengthMismatch {
                expected: record.len(),
                got: len,
            }
        };
        assert_eq!(
            open(&mut b, &record[..len]),
            Err(expected),
            "record[..{len}]"
        );
    }
    assert_eq!(open(&mut b, &record).unwrap(), b"0123456789");
}

#[test]
fn oversize_input_is_rejected() {
    let t = handshake(&alice(), &bob()).2;
    let mut extra = t.hello.clone();
    extra.push(0);
    assert_eq!(
        respond_as(&bob(), &extra, &config(), 0).err(),
        Some(HandshakeError::Wire(WireError::TrailingBytes(1)))
    );
    let mut huge = t.hello.clone();
    huge.resize(MAX_HANDSHAKE_LEN + 1, 0);
    assert_eq!(
        respond_as(&bob(), &huge, &config(), 0).err(),
        Some(HandshakeError::Wire(WireError::TooLarge {
            len: MAX_HANDSHAKE_LEN + 1,
            max: MAX_HANDSHAKE_LEN
        }))
    );

    let (mut a, mut b, _) = handshake(&alice(), &bob());
    // A payload over the limit is refused before anything is sealed ...
    let mut big = vec![0u8; MAX_RECORD_PAYLOAD + 1 + RECORD_OVERHEAD];
    assert_eq!(
        a.seal_in_place(&mut big, None),
        Err(ChannelError::PayloadTooLarge(MAX_RECORD_PAYLOAD + 1))
    );
    assert_eq!(
        a.seal_in_place(&mut [0u8; RECORD_OVERHEAD - 1], None),
        Err(ChannelError::BufferTooSmall)
    );
    // ... and a header claiming one is refused before anything is read.
    let (_, record) = a.seal(b"small", None).unwrap();
    let mut claims_more = record.clone();
    claims_more[26..30].copy_from_slice(&(MAX_RECORD_PAYLOAD as u32 + 1).to_le_bytes());
    let too_large = WireError::TooLarge {
        len: MAX_RECORD_PAYLOAD + 1 + RECORD_OVERHEAD,
        max: wire::MAX_RECORD_LEN,
    };
    assert_eq!(
        open(&mut b, &claims_more),
        Err(ChannelError::Wire(too_large))
    );
    assert_eq!(wire::frame_len(&claims_more), Err(too_large));
    // The largest length a header can claim: no overflow on 32-bit targets (Wasm).
    let mut claims_all = record.clone();
    claims_all[26..30].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(matches!(
        open(&mut b, &claims_all),
        Err(ChannelError::Wire(WireError::TooLarge { .. }))
    ));
    assert_eq!(open(&mut b, &record).unwrap(), b"small");
    // The largest payload allowed goes through.
    let mut max = vec![7u8; MAX_RECORD_PAYLOAD + RECORD_OVERHEAD];
    a.seal_in_place(&mut max, None).unwrap();
    assert_eq!(
        b.open_in_place(&mut max).unwrap().payload.len(),
        MAX_RECORD_PAYLOAD
    );
}

// ---- Identity: wrong mesh, key/id mismatch, wrong recipient, forgery ---------------

#[test]
fn a_peer_of_another_mesh_is_rejected() {
    let stranger = identity("other-mesh", ALICE);
    let (_, hello) = with_rng(&[&[1; 32], &[2; 32]], |rng| {
        Initiator::start(&stranger, bob().id(), &config(), NOW_MS, rng)
    })
    .unwrap();
    assert_eq!(
        respond_as(&bob(), &hello, &config(), 0).err(),
        Some(HandshakeError::WrongMesh)
    );
    // The same key pair has another id in another mesh.
    assert_ne!(stranger.id(), alice().id());
}

#[test]
fn a_key_that_does_not_hash_to_the_claimed_id_is_rejected() {
    // Mallory claims Alice's id but must sign with her own key.
    let (_, hello) = alice_starts(bob().id(), &config(), 1);
    let mut body = hello_body(&hello);
    body.initiator_key = *mallory().public_key();
    let forged = craft_hello(&body, MALLORY);
    assert_eq!(
        respond_as(&bob(), &forged, &config(), 0).err(),
        Some(HandshakeError::KeyIdMismatch)
    );

    // Mallory intercepts Alice's hello to Bob and answers as herself, properly bound
    // to Alice and signed: Alice meant to reach Bob's id, and Mallory's key is not it.
    let (waiting, hello) = alice_starts(bob().id(), &config(), 1);
    let (_, bobs_reply) = respond_as(&bob(), &hello, &config(), 0).unwrap();
    let body = HelloReplyBody {
        responder_key: *mallory().public_key(),
        ..reply_body(&bobs_reply)
    };
    let spliced = craft_reply(&hello, &body, MALLORY);
    assert_eq!(
        waiting.read_hello_reply(&spliced).err(),
        Some(HandshakeError::KeyIdMismatch)
    );
}

#[test]
fn a_message_meant_for_another_id_is_rejected() {
    let (_, hello) = alice_starts(bob().id(), &config(), 1);
    assert_eq!(
        respond_as(&mallory(), &hello, &config(), 0).err(),
        Some(HandshakeError::NotForMe)
    );

    // Bob's genuine reply to Mallory, delivered to Alice who is waiting for Bob.
    let (_, mallory_hello) = with_rng(&[&[1; 32], &[2; 32]], |rng| {
        Initiator::start(&mallory(), bob().id(), &config(), NOW_MS, rng)
    })
    .unwrap();
    let (_, reply_to_mallory) = respond_as(&bob(), &mallory_hello, &config(), 0).unwrap();
    let (waiting, _) = alice_starts(bob().id(), &config(), 1);
    assert_eq!(
        waiting.read_hello_reply(&reply_to_mallory).err(),
        Some(HandshakeError::NotForMe)
    );
}

#[test]
fn forged_signatures_are_rejected() {
    let (waiting, hello) = alice_starts(bob().id(), &config(), 1);
    // Mallory signs Alice's hello with her own key.
    assert_eq!(
        respond_as(
            &bob(),
            &craft_hello(&hello_body(&hello), MALLORY),
            &config(),
            0
        )
        .err(),
        Some(HandshakeError::BadSignature)
    );
    // Mallory signs Bob's reply with her own key.
    let (_, reply) = respond_as(&bob(), &hello, &config(), 0).unwrap();
    let forged = craft_reply(&hello, &reply_body(&reply), MALLORY);
    assert_eq!(
        waiting.read_hello_reply(&forged).err(),
        Some(HandshakeError::BadSignature)
    );
}

// ---- Negotiation -------------------------------------------------------------------

#[test]
fn suite_downgrade_is_detected() {
    let chacha_only = HandshakeConfig {
        suites: &[Suite::ChaCha20Poly1305],
        ..config()
    };
    let (waiting, hello) = alice_starts(bob().id(), &chacha_only, 1);
    // Adding AES to Alice's offer breaks her signature.
    let mut offer = hello.clone();
    offer[2] |= 0b10;
    assert_eq!(
        respond_as(&bob(), &offer, &config(), 0).err(),
        Some(HandshakeError::BadSignature)
    );
    // A reply (genuinely signed by Bob) choosing a suite Alice did not offer.
    let (_, reply) = respond_as(&bob(), &hello, &config(), 0).unwrap();
    let body = HelloReplyBody {
        suite: 0b10,
        ..reply_body(&reply)
    };
    assert_eq!(
        waiting
            .read_hello_reply(&craft_reply(&hello, &body, BOB))
            .err(),
        Some(HandshakeError::SuiteNotOffered)
    );
}

/// A responder (genuinely signed) that claims a stream option the initiator did not
/// offer, or several protocols, is refused: neither side can be moved to records
/// larger than it reads.
#[test]
fn a_stream_option_not_offered_is_refused() {
    let plain = HandshakeConfig {
        options: StreamOptions::NONE,
        ..config()
    };
    let (waiting, hello) = alice_starts(bob().id(), &plain, 1);
    let (_, reply) = respond_as(&bob(), &hello, &config(), 0).unwrap();
    assert_eq!(
        reply_body(&reply).carries,
        Carries::HTTP2.0,
        "nothing echoed"
    );
    // Turning the option on in her offer breaks her signature.
    let mut offer = hello_body(&hello);
    offer.carries |= StreamOptions::LARGE_RECORDS.0;
    let mut tampered_offer = postcard::to_allocvec(&offer).unwrap();
    tampered_offer.extend_from_slice(&hello[hello.len() - 64..]);
    assert_eq!(
        respond_as(&bob(), &tampered_offer, &config(), 0).err(),
        Some(HandshakeError::BadSignature)
    );
    for carries in [
        Carries::HTTP2.0 | StreamOptions::LARGE_RECORDS.0,
        Carries::HTTP2.0 | 0b1000_0000,
        Carries::HTTP2.0 | Carries::TCP.0,
    ] {
        let body = HelloReplyBody {
            carries,
            ..reply_body(&reply)
        };
        let (waiting, _) = alice_starts(bob().id(), &plain, 1);
        assert_eq!(
            waiting
                .read_hello_reply(&craft_reply(&hello, &body, BOB))
                .err(),
            Some(HandshakeError::CarriesNotOffered),
            "carries byte {carries:#b}"
        );
    }
    // Bob's own reply, untouched, is accepted.
    assert!(waiting.read_hello_reply(&reply).is_ok());
}

#[test]
fn no_common_suite_is_reported() {
    let aes_only = HandshakeConfig {
        suites: &[Suite::Aes256Gcm],
        ..config()
    };
    let chacha_only = HandshakeConfig {
        suites: &[Suite::ChaCha20Poly1305],
        ..config()
    };
    let (_, hello) = alice_starts(bob().id(), &aes_only, 1);
    assert_eq!(
        respond_as(&bob(), &hello, &chacha_only, 0).err(),
        Some(HandshakeError::NoCommonSuite)
    );
    let none = HandshakeConfig {
        suites: &[],
        ..config()
    };
    let started = with_rng(&[], |rng| {
        Initiator::start(&alice(), bob().id(), &none, NOW_MS, rng)
    });
    assert_eq!(started.err(), Some(HandshakeError::NoSuitesConfigured));
}

#[test]
fn low_order_key_shares_are_rejected() {
    let (_, hello) = alice_starts(bob().id(), &config(), 1);
    for share in [[0u8; 32], {
        let mut one = [0u8; 32];
        one[0] = 1;
        one
    }] {
        let forged = craft_hello(
            &HelloBody {
                ephemeral: share,
                ..hello_body(&hello)
            },
            ALICE,
        );
        assert_eq!(
            respond_as(&bob(), &forged, &config(), 0).err(),
            Some(HandshakeError::BadKeyShare)
        );
    }
}

// ---- Rekeying ----------------------------------------------------------------------

#[test]
fn the_rekey_interval_is_agreed_and_old_records_stay_dead() {
    let short = HandshakeConfig {
        records_per_key: 3,
        ..config()
    };
    // Alice rekeys every 3 records, Bob by default: they agree on 3. Were Bob to keep
    // his own setting, Alice's record 3 (the first of epoch 1) would fail to open.
    let (waiting, hello) = alice_starts(bob().id(), &short, 9);
    let (pending, reply) = respond_as(&bob(), &hello, &config(), 9).unwrap();
    let (mut a, confirm) = waiting.read_hello_reply(&reply).unwrap();
    let mut b = pending.read_confirm(&confirm).unwrap();
    let mut first = None;
    for i in 0..20u8 {
        let (_, record) = a.seal(&[i; 16], None).unwrap();
        assert_eq!(open(&mut b, &record).unwrap(), [i; 16]);
        first.get_or_insert(record);
        let (_, back) = b.seal(&[i], None).unwrap();
        assert_eq!(open(&mut a, &back).unwrap(), [i]);
    }
    assert_eq!(open(&mut b, &first.unwrap()), Err(ChannelError::Replay(1)));

    // A responder may not stretch the initiator's interval, even with a valid signature.
    let (waiting, hello) = alice_starts(bob().id(), &short, 9);
    let stretched = HelloReplyBody {
        records_per_key: 4,
        ..reply_body(&reply)
    };
    assert_eq!(
        waiting
            .read_hello_reply(&craft_reply(&hello, &stretched, BOB))
            .err(),
        Some(HandshakeError::BadRekeyInterval)
    );
}
