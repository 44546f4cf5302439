//! The component, built for `wasm32-wasip2`, embedded with the `wasmtime` crate through
//! its WIT interface (themis-testkit's `component`): it interoperates with the native core in both
//! directions.
//!
//! The host bindings are generated from `wit/themis.wit` at compile time and the guest's
//! from the same file; instantiation type-checks the built component against the WIT, so
//! neither side can drift from the contract without this test failing.

use themis_testkit::component as embed;
use themis_testkit::require;

use embed::exports::themis::mesh::types::Error;
use embed::{component_identity, instantiate, native};
use ring::rand::SystemRandom;
use themis_core::handshake::{self, Initiator};
use themis_core::{HandshakeConfig, HelloGuard, Identity, MeshName, PeerId};

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

#[test]
fn the_component_exports_exactly_the_wit_package() {
    if !require::cargo_build("builds the component for wasm32-wasip2") {
        return;
    }
    let (_, _, engine, component) = instantiate();
    let mut exports: Vec<String> = component
        .component_type()
        .exports(&engine)
        .map(|(name, _)| name.to_owned())
        .collect();
    exports.sort();
    assert_eq!(
        exports,
        [
            "themis:mesh/channel@0.1.0",
            "themis:mesh/identities@0.1.0",
            "themis:mesh/key-agreement@0.1.0",
            "themis:mesh/types@0.1.0",
            "wasi:cli/run@0.2.12",
        ]
    );
}

#[test]
fn identities_agree_with_the_native_core() {
    if !require::cargo_build("builds the component for wasm32-wasip2") {
        return;
    }
    let (mut store, themis, _, _) = instantiate();
    let ids = themis.themis_mesh_identities();
    let (made, id) = component_identity(&mut store, &themis);
    let id = id.to_vec();
    let public_key = ids.identity().call_public_key(&mut store, made).unwrap();
    let key: [u8; 32] = public_key.try_into().unwrap();
    assert_eq!(PeerId::derive(&key, "demo").0.to_vec(), id);

    // Key files cross over both ways with the same ids.
    let pem = ids.identity().call_to_key_file(&mut store, made).unwrap();
    let loaded = Identity::from_key_file(MeshName::new("demo").unwrap(), &pem).unwrap();
    assert_eq!(loaded.id().0.to_vec(), id);
    let n = native("demo");
    let theirs = ids
        .identity()
        .call_from_key_file(&mut store, "demo", &n.to_key_file())
        .unwrap()
        .unwrap();
    assert_eq!(
        ids.identity()
            .call_printable_id(&mut store, theirs)
            .unwrap(),
        n.printable_id()
    );

    assert!(ids
        .call_key_matches_id(&mut store, n.public_key(), &n.printable_id())
        .unwrap()
        .unwrap());
    assert!(!ids
        .call_key_matches_id(&mut store, &key, &n.printable_id())
        .unwrap()
        .unwrap());
    assert!(matches!(
        ids.identity()
            .call_generate(&mut store, "Not A Mesh")
            .unwrap(),
        Err(Error::InvalidMeshName(_))
    ));
    assert!(matches!(
        ids.call_parse_id(&mut store, "demo1notanid").unwrap(),
        Err(Error::InvalidId(_))
    ));
}

/// Runs the key agreement with the component as initiator and the native core as
/// responder, then exchanges records both ways and tampers with one.
#[test]
fn component_initiator_with_native_responder() {
    if !require::cargo_build("builds the component for wasm32-wasip2") {
        return;
    }
    let (mut store, themis, _, _) = instantiate();
    let (ka, ch) = (
        themis.themis_mesh_key_agreement(),
        themis.themis_mesh_channel(),
    );
    let bob = native("demo");
    let (alice, alice_id) = component_identity(&mut store, &themis);

    let (waiting, hello) = ka
        .initiator()
        .call_start(&mut store, alice, &bob.id().0)
        .unwrap()
        .unwrap();
    let (pending, reply) = handshake::respond(
        &bob,
        &hello,
        &HandshakeConfig::default(),
        &mut HelloGuard::default(),
        now_ms(),
        &SystemRandom::new(),
    )
    .unwrap();
    let (session, confirm) = ka
        .initiator()
        .call_finish(&mut store, waiting, &reply)
        .unwrap()
        .unwrap();
    let mut bob_session = pending.read_confirm(&confirm).unwrap();
    assert_eq!(bob_session.info().peer_id.0, alice_id);
    assert_eq!(
        ch.session().call_peer_id(&mut store, session).unwrap(),
        bob.id().0.to_vec()
    );

    // Component → native.
    let (seq, mut record) = ch
        .session()
        .call_seal(&mut store, session, b"GET /check", None)
        .unwrap()
        .unwrap();
    let opened = bob_session.open_in_place(&mut record).unwrap();
    assert_eq!((opened.seq, &*opened.payload), (seq, &b"GET /check"[..]));
    // Native → component, answering it.
    let (_, record) = bob_session.seal(b"200 prime", Some(seq)).unwrap();
    let opened = ch
        .session()
        .call_open(&mut store, session, &record)
        .unwrap()
        .unwrap();
    assert_eq!(
        (opened.reply_to, opened.payload.as_slice()),
        (Some(seq), &b"200 prime"[..])
    );
    // Replayed and tampered records are refused.
    assert!(matches!(
        ch.session()
            .call_open(&mut store, session, &record)
            .unwrap(),
        Err(Error::Channel(_))
    ));
    let (_, mut record) = bob_session.seal(b"next", None).unwrap();
    let last = record.len() - 1;
    record[last] ^= 1;
    assert!(matches!(
        ch.session()
            .call_open(&mut store, session, &record)
            .unwrap(),
        Err(Error::Channel(_))
    ));
}

/// The native core initiates; the component responds.
#[test]
fn native_initiator_with_component_responder() {
    if !require::cargo_build("builds the component for wasm32-wasip2") {
        return;
    }
    let (mut store, themis, _, _) = instantiate();
    let (ka, ch) = (
        themis.themis_mesh_key_agreement(),
        themis.themis_mesh_channel(),
    );
    let alice = native("demo");
    let (bob, bob_id) = component_identity(&mut store, &themis);

    let (waiting, hello) = Initiator::start(
        &alice,
        PeerId(bob_id),
        &HandshakeConfig::default(),
        now_ms(),
        &SystemRandom::new(),
    )
    .unwrap();
    let (pending, reply) = ka
        .responder()
        .call_respond(&mut store, bob, &hello)
        .unwrap()
        .unwrap();
    let (mut alice_session, confirm) = waiting.read_hello_reply(&reply).unwrap();
    let session = ka
        .responder()
        .call_finish(&mut store, pending, &confirm)
        .unwrap()
        .unwrap();
    assert_eq!(
        ch.session()
            .call_peer_printable_id(&mut store, session)
            .unwrap(),
        alice.printable_id()
    );

    for i in 0..3u8 {
        let (seq, record) = alice_session.seal(&[i; 100], None).unwrap();
        let opened = ch
            .session()
            .call_open(&mut store, session, &record)
            .unwrap()
            .unwrap();
        assert_eq!((opened.seq, opened.payload), (seq, vec![i; 100]));
        let (_, mut answer) = ch
            .session()
            .call_seal(&mut store, session, &[i], Some(seq))
            .unwrap()
            .unwrap();
        let opened = alice_session.open_in_place(&mut answer).unwrap();
        assert_eq!((opened.reply_to, &*opened.payload), (Some(seq), &[i][..]));
    }

    // A Hello for another id, and a bad confirmation, are refused by the component.
    let other = native("demo");
    let (_, hello) = Initiator::start(
        &alice,
        other.id(),
        &HandshakeConfig::default(),
        now_ms(),
        &SystemRandom::new(),
    )
    .unwrap();
    assert!(matches!(
        ka.responder()
            .call_respond(&mut store, bob, &hello)
            .unwrap(),
        Err(Error::Handshake(_))
    ));
    let (waiting, hello) = Initiator::start(
        &alice,
        PeerId(bob_id),
        &HandshakeConfig::default(),
        now_ms(),
        &SystemRandom::new(),
    )
    .unwrap();
    let (pending, reply) = ka
        .responder()
        .call_respond(&mut store, bob, &hello)
        .unwrap()
        .unwrap();
    let (_, mut confirm) = waiting.read_hello_reply(&reply).unwrap();
    confirm[10] ^= 1;
    assert!(matches!(
        ka.responder()
            .call_finish(&mut store, pending, &confirm)
            .unwrap(),
        Err(Error::Handshake(_))
    ));
}
