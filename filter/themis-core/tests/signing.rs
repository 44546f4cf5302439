//! Delegated signing: the handshake run with only the public identity, its messages
//! signed by someone else (the node agent) through `handshake::sign_message`.
//!
//! * the two-phase path sends the same bytes as the one-shot path with the same
//!   randomness, and the sessions work;
//! * a wrong signature fed back is refused (nothing is sent);
//! * the signer refuses anything but a handshake message of its own identity;
//! * streams hold the app's bytes while the signature is awaited, under any cuts, and
//!   resume with the same wire bytes as the one-shot streams.

#![allow(deprecated)] // ring's fixed test generators, as in the other tests

mod common;

use common::{identity, with_rng, NOW_MS};
use ring::test::rand::FixedByteRandom;
use themis_core::handshake::{self, sign_message, signing_digest, Initiator, SigningError, ToSign};
use themis_core::stream::{Meta, Refusal, StreamInitiator, StreamResponder, HTTP2_PREFACE};
use themis_core::wire::{Kind, WireError, MAX_HANDSHAKE_LEN};
use themis_core::{HandshakeConfig, HandshakeError, HelloGuard, Identity};

const MESH: &str = "demo";

fn alice() -> Identity {
    identity(MESH, 0xa1)
}

fn bob() -> Identity {
    identity(MESH, 0xb0)
}

const INIT_RNG: [&[u8]; 2] = [&[0x11; 32], &[0x12; 32]];
const RESP_RNG: [&[u8]; 2] = [&[0x21; 32], &[0x22; 32]];

/// Message 1 both ways, then message 2 both ways: the same bytes; the two-phase
/// states complete the handshake.
#[test]
fn two_phase_messages_are_byte_identical_to_one_shot() {
    let (a, b) = (alice(), bob());
    let config = HandshakeConfig::default();
    let (_, hello) = with_rng(&INIT_RNG, |rng| {
        Initiator::start(&a, b.id(), &config, NOW_MS, rng)
    })
    .unwrap();
    let pending = with_rng(&INIT_RNG, |rng| {
        Initiator::start_unsigned(a.public(), b.id(), &config, NOW_MS, rng)
    })
    .unwrap();
    let to_sign = pending.to_sign();
    assert_eq!((to_sign.kind, to_sign.hello_hash), (Kind::Hello, None));
    assert!(hello.starts_with(&to_sign.body));
    let signature = sign_message(&a, &to_sign).unwrap();
    let (waiting, hello2) = pending.finish(&signature).unwrap();
    assert_eq!(hello, hello2);

    let (_, reply) = with_rng(&RESP_RNG, |rng| {
        handshake::respond(&b, &hello, &config, &mut HelloGuard::default(), NOW_MS, rng)
    })
    .unwrap();
    let pending = with_rng(&RESP_RNG, |rng| {
        handshake::respond_unsigned(
            b.public(),
            &hello,
            &config,
            &mut HelloGuard::default(),
            NOW_MS,
            rng,
        )
    })
    .unwrap();
    assert_eq!(pending.peer_id(), a.id());
    let to_sign = pending.to_sign();
    assert_eq!(to_sign.kind, Kind::HelloReply);
    assert!(to_sign.hello_hash.is_some());
    let signature = sign_message(&b, &to_sign).unwrap();
    let (confirming, reply2) = pending.finish(&signature).unwrap();
    assert_eq!(reply, reply2);

    let (mut sa, confirm) = waiting.read_hello_reply(&reply2).unwrap();
    let mut sb = confirming.read_confirm(&confirm).unwrap();
    let (_, mut record) = sa.seal(b"delegated", None).unwrap();
    assert_eq!(sb.open_in_place(&mut record).unwrap().payload, b"delegated");
}

/// A signer that is confused (another key, another message) or lying (garbage)
/// cannot make either side send anything.
#[test]
fn a_wrong_signature_is_refused() {
    let (a, b) = (alice(), bob());
    let config = HandshakeConfig::default();
    let start = || {
        with_rng(&INIT_RNG, |rng| {
            Initiator::start_unsigned(a.public(), b.id(), &config, NOW_MS, rng)
        })
        .unwrap()
    };
    let good = sign_message(&a, &start().to_sign()).unwrap();
    // Bob's valid signature over a Hello of his own: the wrong key and message.
    let bobs = with_rng(&INIT_RNG, |rng| {
        Initiator::start_unsigned(b.public(), a.id(), &config, NOW_MS, rng)
    })
    .unwrap();
    let other_sig = sign_message(&b, &bobs.to_sign()).unwrap();
    let mut flipped = good;
    flipped[5] ^= 1;
    for bad in [[0u8; 64], other_sig, flipped] {
        assert_eq!(
            start().finish(&bad).err(),
            Some(HandshakeError::BadOwnSignature)
        );
    }
    let (_, hello) = start().finish(&good).unwrap();

    let respond = || {
        with_rng(&RESP_RNG, |rng| {
            handshake::respond_unsigned(
                b.public(),
                &hello,
                &config,
                &mut HelloGuard::default(),
                NOW_MS,
                rng,
            )
        })
        .unwrap()
    };
    // Alice's signature on message 1 is not Bob's on message 2.
    assert_eq!(
        respond().finish(&good).err(),
        Some(HandshakeError::BadOwnSignature)
    );
    assert_eq!(
        respond().finish(&[7u8; 64]).err(),
        Some(HandshakeError::BadOwnSignature)
    );
    let bobs_good = sign_message(&b, &respond().to_sign()).unwrap();
    assert!(respond().finish(&bobs_good).is_ok());
}

/// The signer signs only a Hello or HelloReply body of its own identity, whole and
/// well-formed; the digest is computed by the signer, per kind.
#[test]
fn the_signer_refuses_anything_but_its_own_handshake_messages() {
    let (a, b) = (alice(), bob());
    let config = HandshakeConfig::default();
    let hello = with_rng(&INIT_RNG, |rng| {
        Initiator::start_unsigned(a.public(), b.id(), &config, NOW_MS, rng)
    })
    .unwrap()
    .to_sign();
    let reply = {
        let (_, hello_bytes) = with_rng(&INIT_RNG, |rng| {
            Initiator::start(&a, b.id(), &config, NOW_MS, rng)
        })
        .unwrap();
        with_rng(&RESP_RNG, |rng| {
            handshake::respond_unsigned(
                b.public(),
                &hello_bytes,
                &config,
                &mut HelloGuard::default(),
                NOW_MS,
                rng,
            )
        })
        .unwrap()
        .to_sign()
    };
    assert!(signing_digest(a.public(), &hello).is_ok());
    assert!(signing_digest(b.public(), &reply).is_ok());
    // A body naming another key: Bob will not sign Alice's Hello, nor Alice Bob's reply.
    assert_eq!(sign_message(&b, &hello), Err(SigningError::NotMine));
    assert_eq!(sign_message(&a, &reply), Err(SigningError::NotMine));
    // The same key in another mesh is another identity.
    let elsewhere = identity("other", 0xa1);
    assert_eq!(elsewhere.public_key(), a.public_key());
    assert_eq!(sign_message(&elsewhere, &hello), Err(SigningError::NotMine));
    // Kinds that are never signed, and a kind that is not the body's.
    for kind in [Kind::Confirm, Kind::Record] {
        let asked = ToSign {
            kind,
            ..hello.clone()
        };
        assert_eq!(sign_message(&a, &asked), Err(SigningError::Kind(kind)));
    }
    let as_reply = ToSign {
        kind: Kind::HelloReply,
        hello_hash: Some([0; 32]),
        ..hello.clone()
    };
    assert!(matches!(
        sign_message(&a, &as_reply),
        Err(SigningError::Malformed {
            error: WireError::UnexpectedKind { .. },
            ..
        })
    ));
    // The Hello hash goes with a reply only.
    let hashed_hello = ToSign {
        hello_hash: Some([0; 32]),
        ..hello.clone()
    };
    assert_eq!(
        sign_message(&a, &hashed_hello),
        Err(SigningError::HelloHash)
    );
    let unhashed_reply = ToSign {
        hello_hash: None,
        ..reply.clone()
    };
    assert_eq!(
        sign_message(&b, &unhashed_reply),
        Err(SigningError::HelloHash)
    );
    // Garbage, a truncated body, trailing bytes, an oversize body, another version.
    let with_body = |body: Vec<u8>| ToSign {
        body,
        ..hello.clone()
    };
    let mut trailing = hello.body.clone();
    trailing.push(0);
    let mut oversize = hello.body.clone();
    oversize.resize(MAX_HANDSHAKE_LEN + 1, 0);
    let mut old_version = hello.body.clone();
    old_version[0] = 1;
    for body in [
        Vec::new(),
        b"GET / HTTP/1.1\r\n".to_vec(),
        hello.body[..hello.body.len() - 1].to_vec(),
        trailing,
        oversize,
        old_version,
    ] {
        assert!(
            matches!(
                sign_message(&a, &with_body(body.clone())),
                Err(SigningError::Malformed { .. })
            ),
            "{body:02x?}"
        );
    }
    // The same body is signed differently per kind (domain separation).
    assert_ne!(
        signing_digest(a.public(), &hello).unwrap(),
        signing_digest(b.public(), &reply).unwrap()
    );
}

/// xorshift64*: reproducible cuts.
struct Prng(u64);

impl Prng {
    fn below(&mut self, n: usize) -> usize {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        (x.wrapping_mul(0x2545_f491_4f6c_dd1d) % n as u64) as usize
    }

    fn pieces<'a>(&mut self, bytes: &'a [u8]) -> Vec<&'a [u8]> {
        let mut out = Vec::new();
        let mut rest = bytes;
        while !rest.is_empty() {
            let n = 1 + self.below(rest.len().min(64));
            out.push(&rest[..n]);
            rest = &rest[n..];
        }
        out
    }
}

fn meta() -> Meta {
    Meta {
        service: Some("handler".into()),
    }
}

/// What one whole connection put on the wire and handed each app.
#[derive(Debug, PartialEq, Eq)]
struct Run {
    i2r: Vec<u8>,
    r2i: Vec<u8>,
    resp_app: Vec<u8>,
    init_app: Vec<u8>,
}

/// A whole connection, each side signing with its own key (`delegated`: through the
/// two-phase API, with the app's and the peer's bytes cut by `cuts` and written while
/// the signatures are awaited).
fn run(delegated: bool, cuts: &mut Prng) -> Run {
    let (a, b) = (alice(), bob());
    let config = HandshakeConfig::default();
    let (init_rng, resp_rng) = (FixedByteRandom { byte: 1 }, FixedByteRandom { byte: 2 });
    let request = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\nGET /check, and then some";
    let answer = b"SETTINGS and the response";
    let mut out = Run {
        i2r: Vec::new(),
        r2i: Vec::new(),
        resp_app: Vec::new(),
        init_app: Vec::new(),
    };
    let mut guard = HelloGuard::default();
    let mut resp = StreamResponder::new(HTTP2_PREFACE);
    let mut init = if delegated {
        let mut init =
            StreamInitiator::start_unsigned(a.public(), b.id(), meta(), &config, NOW_MS, &init_rng)
                .unwrap();
        // The app writes, in pieces, while the agent signs: all held.
        for piece in cuts.pieces(request) {
            assert!(init.from_app(piece).unwrap().is_empty());
            assert!(init.to_sign().is_some());
        }
        let signature = sign_message(&a, &init.to_sign().unwrap()).unwrap();
        out.i2r = init.signed(&signature).unwrap();
        assert!(init.to_sign().is_none());
        init
    } else {
        let (mut init, hello) =
            StreamInitiator::start(&a, b.id(), meta(), &config, NOW_MS, &init_rng).unwrap();
        assert!(init.from_app(request).unwrap().is_empty());
        out.i2r = hello;
        init
    };
    // Message 1 to the responder, cut anywhere.
    let hello = out.i2r.clone();
    for piece in cuts.pieces(&hello) {
        let got = if delegated {
            assert!(resp.to_sign().is_none(), "asked to sign a partial Hello");
            resp.from_peer_unsigned(piece, b.public(), &config, &mut guard, NOW_MS, &resp_rng)
        } else {
            resp.from_peer(piece, &b, &config, &mut guard, NOW_MS, &resp_rng)
        }
        .unwrap();
        out.resp_app.extend_from_slice(&got.to_app);
        assert!(got.to_peer.is_empty());
    }
    if delegated {
        // Nothing for the app until message 2 is signed; empty reads are harmless.
        assert!(out.resp_app.is_empty());
        let nothing = resp
            .from_peer_unsigned(&[], b.public(), &config, &mut guard, NOW_MS, &resp_rng)
            .unwrap();
        assert_eq!(nothing.to_app.len() + nothing.to_peer.len(), 0);
        let signature = sign_message(&b, &resp.to_sign().unwrap()).unwrap();
        let signed = resp.signed(&signature).unwrap();
        assert!(signed.to_peer.is_empty());
        out.resp_app.extend_from_slice(&signed.to_app);
    }
    assert_eq!(out.resp_app, HTTP2_PREFACE);
    // The app's answer carries message 2.
    for piece in cuts.pieces(answer) {
        out.r2i.extend(resp.from_app(piece).unwrap());
    }
    let r2i = out.r2i.clone();
    let mut to_resp = Vec::new();
    for piece in cuts.pieces(&r2i) {
        let got = init.from_peer(piece).unwrap();
        out.init_app.extend_from_slice(&got.to_app);
        to_resp.extend(got.to_peer);
    }
    out.i2r.extend_from_slice(&to_resp);
    for piece in cuts.pieces(&to_resp) {
        let got = if delegated {
            resp.from_peer_unsigned(piece, b.public(), &config, &mut guard, NOW_MS, &resp_rng)
        } else {
            resp.from_peer(piece, &b, &config, &mut guard, NOW_MS, &resp_rng)
        }
        .unwrap();
        out.resp_app.extend_from_slice(&got.to_app);
    }
    // The responder's held answer leaves sealed on its next write.
    let rest = resp.from_app(b"").unwrap();
    out.r2i.extend_from_slice(&rest);
    out.init_app.extend(init.from_peer(&rest).unwrap().to_app);
    assert_eq!(resp.established().unwrap().peer_id, a.id());
    out
}

#[test]
fn streams_wait_for_the_signature_and_resume_under_any_cuts() {
    let one_shot = run(false, &mut Prng(1));
    assert_eq!(
        one_shot.resp_app,
        [HTTP2_PREFACE, b"GET /check, and then some"].concat()
    );
    assert_eq!(one_shot.init_app, b"SETTINGS and the response");
    for seed in 1..200 {
        let delegated = run(true, &mut Prng((seed * 0x9e37_79b9) | 1));
        assert_eq!(delegated, one_shot, "seed {seed}");
    }
}

#[test]
fn peer_bytes_while_the_signature_is_awaited_are_out_of_turn() {
    let (a, b) = (alice(), bob());
    let config = HandshakeConfig::default();
    let rng = FixedByteRandom { byte: 3 };
    let mut init =
        StreamInitiator::start_unsigned(a.public(), b.id(), meta(), &config, NOW_MS, &rng).unwrap();
    assert!(matches!(
        init.from_peer(b"\x02\x02"),
        Err(Refusal::OutOfTurn(_))
    ));
    // Closed: a late signature does not revive it.
    assert!(init.signed(&[0; 64]).is_err());

    let mut init =
        StreamInitiator::start_unsigned(a.public(), b.id(), meta(), &config, NOW_MS, &rng).unwrap();
    // A wrong signature ends the stream.
    assert!(matches!(
        init.signed(&[0; 64]),
        Err(Refusal::Handshake(HandshakeError::BadOwnSignature))
    ));
    assert!(init.from_app(b"x").is_err());

    let (_, hello) = Initiator::start(&a, b.id(), &config, NOW_MS, &rng).unwrap();
    let mut guard = HelloGuard::default();
    let mut resp = StreamResponder::new(HTTP2_PREFACE);
    resp.from_peer_unsigned(&hello, b.public(), &config, &mut guard, NOW_MS, &rng)
        .unwrap();
    assert!(resp.to_sign().is_some());
    assert!(matches!(
        resp.from_peer_unsigned(b"\x02", b.public(), &config, &mut guard, NOW_MS, &rng),
        Err(Refusal::OutOfTurn(_))
    ));
    assert!(resp.signed(&[0; 64]).is_err());
    // The app's bytes while the signature is awaited: held; message 2 then leaves at
    // once (there is no later write to carry it).
    let mut guard = HelloGuard::default();
    let mut resp = StreamResponder::new(HTTP2_PREFACE);
    let (_, hello) = Initiator::start(&a, b.id(), &config, NOW_MS + 1, &rng).unwrap();
    resp.from_peer_unsigned(&hello, b.public(), &config, &mut guard, NOW_MS, &rng)
        .unwrap();
    assert!(resp.from_app(b"early").unwrap().is_empty());
    let signature = sign_message(&b, &resp.to_sign().unwrap()).unwrap();
    let out = resp.signed(&signature).unwrap();
    assert_eq!(out.to_app, HTTP2_PREFACE);
    assert!(!out.to_peer.is_empty());
}
