//! The sealed byte stream of the sidecars (`themis_core::stream`) under hostile peers:
//! arbitrary bytes, cut arbitrarily, fed to a fresh responder and to an initiator
//! waiting for message 2. Nothing panics; nothing but the responder's own preface
//! reaches its app before a peer completed a genuine handshake (which the fuzzer
//! cannot forge), and once refused, an end stays refused.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use ring::rand::SystemRandom;
use themis_core::stream::{Meta, StreamInitiator, StreamResponder, HTTP2_PREFACE};
use themis_core::{HandshakeConfig, HelloGuard};
use themis_fuzz::{peers, NOW_MS};

#[derive(Arbitrary, Debug)]
struct Input {
    /// Pieces as they arrive from the network.
    to_responder: Vec<Vec<u8>>,
    to_initiator: Vec<Vec<u8>>,
    /// What the responder's app writes meanwhile.
    app_writes: Vec<Vec<u8>>,
}

fuzz_target!(|input: Input| {
    let rng = SystemRandom::new();
    let config = HandshakeConfig::default();
    let peers = peers();

    let mut responder = StreamResponder::new(HTTP2_PREFACE);
    let mut guard = HelloGuard::default();
    let mut to_app = Vec::new();
    let mut refused = false;
    for (i, piece) in input.to_responder.iter().enumerate() {
        match responder.from_peer(piece, &peers.responder, &config, &mut guard, NOW_MS, &rng) {
            Ok(out) => {
                assert!(!refused, "accepted bytes after a refusal");
                assert!(out.to_peer.is_empty());
                to_app.extend_from_slice(&out.to_app);
            }
            Err(_) => refused = true,
        }
        if let Some(write) = input.app_writes.get(i) {
            let _ = responder.from_app(write);
        }
    }
    assert!(responder.established().is_none(), "a forged handshake completed");
    assert!(to_app.is_empty() || to_app == HTTP2_PREFACE, "bytes reached the app: {to_app:?}");

    let (mut initiator, _hello) = StreamInitiator::start(
        &peers.initiator,
        peers.responder.id(),
        Meta::default(),
        &config,
        NOW_MS,
        &rng,
    )
    .expect("a handshake starts");
    assert!(initiator.from_app(b"held until the handshake is done").unwrap().is_empty());
    for piece in &input.to_initiator {
        if let Ok(out) = initiator.from_peer(piece) {
            // Message 2 is signed by the responder over our fresh ephemeral key: the
            // fuzzer cannot make one, so nothing is released.
            assert!(out.to_peer.is_empty() && out.to_app.is_empty());
        }
    }
    assert!(!initiator.is_open());
});
