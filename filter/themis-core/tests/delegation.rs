//! Wire v3: handshakes signed by a delegated key, and what each side refuses. The
//! attacker holds a delegation of its own, a stolen expired one, or one issued for
//! another workload or mesh, and tries every field.

mod common;

use common::{identity, mesh, NOW_MS};
use ring::rand::SystemRandom;
use themis_core::delegation::{self, DelegationError, MAX_LIFETIME_MS};
use themis_core::handshake::{self, Initiator};
use themis_core::wire::{self, Hello, MAX_ENDORSEMENT_LEN};
use themis_core::{
    Carries, Credential, DelegatedKey, Delegation, HandshakeConfig, HandshakeError, HelloGuard,
    Identity, StreamOptions,
};

const MESH: &str = "delegated";
const HOUR: u64 = 3600 * 1000;

fn credential_for(
    workload: &Identity,
    issued_ms: u64,
    lifetime_ms: u64,
    endorsement: &[u8],
) -> Credential {
    let key = DelegatedKey::generate(&SystemRandom::new()).unwrap();
    let d = Delegation::issue(workload, *key.public_key(), issued_ms, lifetime_ms);
    Credential::new(
        workload.public().clone(),
        key,
        d,
        endorsement.to_vec(),
        issued_ms,
    )
    .unwrap()
}

/// Runs a whole handshake; returns both sessions' infos or the first error.
fn run(
    a: &dyn themis_core::HandshakeSigner,
    b: &dyn themis_core::HandshakeSigner,
    config_a: &HandshakeConfig,
    config_b: &HandshakeConfig,
    now_ms: u64,
) -> Result<(themis_core::SessionInfo, themis_core::SessionInfo), HandshakeError> {
    let rng = SystemRandom::new();
    let (waiting, hello) = Initiator::start(a, b.identity().id(), config_a, now_ms, &rng)?;
    let mut guard = HelloGuard::default();
    let (pending, reply) = handshake::respond(b, &hello, config_b, &mut guard, now_ms, &rng)?;
    let (sa, confirm) = waiting.read_hello_reply(&reply)?;
    let sb = pending.read_confirm(&confirm)?;
    Ok((sa.info().clone(), sb.info().clone()))
}

/// What `responder` answers to `hello` (a fresh replay guard), as an error.
fn refusal_of(responder: &Identity, hello: &[u8], now_ms: u64) -> HandshakeError {
    let config = HandshakeConfig::default();
    let mut guard = HelloGuard::default();
    handshake::respond(
        responder,
        hello,
        &config,
        &mut guard,
        now_ms,
        &SystemRandom::new(),
    )
    .err()
    .expect("the responder refuses")
}

#[test]
fn delegated_keys_authenticate_the_workload_id_and_carry_endorsements() {
    let (alice, bob) = (identity(MESH, 1), identity(MESH, 2));
    let a = credential_for(&alice, NOW_MS, HOUR, b"alice's record");
    let b = credential_for(&bob, NOW_MS, HOUR, b"bob's record");
    let config = HandshakeConfig::default();
    let (ia, ib) = run(&a, &b, &config, &config, NOW_MS + 1000).unwrap();
    assert_eq!(ia.peer_id, bob.id());
    assert_eq!(ib.peer_id, alice.id());
    assert_eq!(ia.peer_endorsement, b"bob's record");
    assert_eq!(ib.peer_endorsement, b"alice's record");
    // A delegated side meets an own-key side (an agent, a v3 peer without one).
    let (ia, _) = run(&a, &bob, &config, &config, NOW_MS).unwrap();
    assert_eq!(ia.peer_id, bob.id());
    assert!(ia.peer_endorsement.is_empty());
}

#[test]
fn an_expired_or_future_delegation_is_refused_by_the_peer() {
    let (alice, bob) = (identity(MESH, 1), identity(MESH, 2));
    let a = credential_for(&alice, NOW_MS, HOUR, b"");
    let config = HandshakeConfig::default();
    let skew = delegation::MAX_CLOCK_SKEW_MS;
    // Within skew either side: accepted.
    assert!(run(&a, &bob, &config, &config, NOW_MS + HOUR + skew - 1).is_ok());
    assert!(run(&a, &bob, &config, &config, NOW_MS - skew).is_ok());
    for now in [NOW_MS + HOUR + skew, NOW_MS - skew - 1] {
        let rng = SystemRandom::new();
        // The Hello is made at `now`, so freshness passes; the delegation does not.
        let (_, hello) = Initiator::start(&a, bob.id(), &config, now, &rng).unwrap();
        let err = refusal_of(&bob, &hello, now);
        assert!(
            matches!(
                err,
                HandshakeError::Delegation(DelegationError::Expired | DelegationError::NotYetValid)
            ),
            "{err:?}"
        );
    }
    // The responder's expired delegation is refused by the initiator.
    let b = credential_for(&bob, NOW_MS - 2 * HOUR, HOUR, b"");
    let err = run(&alice, &b, &config, &config, NOW_MS).err().unwrap();
    assert_eq!(err, HandshakeError::Delegation(DelegationError::Expired));
}

#[test]
fn a_delegation_of_another_workload_or_mesh_is_refused() {
    let (alice, bob, mallory) = (identity(MESH, 1), identity(MESH, 2), identity(MESH, 3));
    let config = HandshakeConfig::default();
    let rng = SystemRandom::new();
    // Mallory's delegated key, with Mallory's delegation, claiming Alice's id and key.
    let stolen = DelegatedKey::generate(&rng).unwrap();
    let mallorys = Delegation::issue(&mallory, *stolen.public_key(), NOW_MS, HOUR);
    assert_eq!(
        Credential::new(alice.public().clone(), stolen, mallorys, vec![], NOW_MS).err(),
        Some(DelegationError::BadSignature)
    );
    // The same delegation issued in another mesh by a key of the same bytes.
    let other_mesh = identity("elsewhere", 1);
    let key = DelegatedKey::generate(&rng).unwrap();
    let foreign = Delegation::issue(&other_mesh, *key.public_key(), NOW_MS, HOUR);
    assert_eq!(
        foreign.verify(alice.public(), NOW_MS),
        Err(DelegationError::BadSignature)
    );
    // A delegation to one key used with another.
    let key = DelegatedKey::generate(&rng).unwrap();
    let other = DelegatedKey::generate(&rng).unwrap();
    let d = Delegation::issue(&alice, *other.public_key(), NOW_MS, HOUR);
    assert_eq!(
        Credential::new(alice.public().clone(), key, d, vec![], NOW_MS).err(),
        Some(DelegationError::KeyMismatch)
    );
    // On the wire: Alice's honest credential, but the Hello rewritten to claim Bob's
    // key and id fails at the peer — the delegation names Alice's key.
    let a = credential_for(&alice, NOW_MS, HOUR, b"");
    let (_, hello) = Initiator::start(&a, mallory.id(), &config, NOW_MS, &rng).unwrap();
    let decoded = Hello::decode(&hello).unwrap();
    let mut body = decoded.message.body.clone();
    body.initiator_key = *bob.public_key();
    body.initiator_id = bob.id().0;
    let mut forged = postcard::to_allocvec(&body).unwrap();
    forged.extend_from_slice(&decoded.message.signature.0);
    let err = refusal_of(&mallory, &forged, NOW_MS);
    assert_eq!(
        err,
        HandshakeError::Delegation(DelegationError::BadSignature)
    );
}

#[test]
fn every_field_of_a_delegation_is_signed() {
    let alice = identity(MESH, 1);
    let key = DelegatedKey::generate(&SystemRandom::new()).unwrap();
    let d = Delegation::issue(&alice, *key.public_key(), NOW_MS, HOUR);
    assert_eq!(d.verify(alice.public(), NOW_MS), Ok(()));
    let encoded = d.encode();
    // Every bit flipped: it no longer decodes, or no longer verifies.
    for i in 0..encoded.len() {
        for bit in [0x01u8, 0x80] {
            let mut bytes = encoded.clone();
            bytes[i] ^= bit;
            if let Some(t) = Delegation::decode(&bytes) {
                let verdict = t.verify(alice.public(), NOW_MS);
                assert!(verdict.is_err(), "byte {i} bit {bit}");
            }
        }
    }
    // Truncation and trailing bytes do not decode.
    for n in 0..encoded.len() {
        assert!(Delegation::decode(&encoded[..n]).is_none());
    }
    let mut longer = encoded.clone();
    longer.push(0);
    assert!(Delegation::decode(&longer).is_none());
}

#[test]
fn lifetimes_are_capped_and_the_renewal_is_at_half() {
    let alice = identity(MESH, 1);
    let key = DelegatedKey::generate(&SystemRandom::new()).unwrap();
    let d = Delegation::issue(&alice, *key.public_key(), NOW_MS, 10 * MAX_LIFETIME_MS);
    assert_eq!(d.not_after_ms - d.not_before_ms, MAX_LIFETIME_MS);
    assert_eq!(d.renew_at_ms(), NOW_MS + MAX_LIFETIME_MS / 2);
    // A hand-made delegation of too long a lifetime, even if signed, is refused.
    let long = Delegation {
        not_after_ms: NOW_MS + MAX_LIFETIME_MS + 1,
        ..d
    };
    assert_eq!(
        long.verify(alice.public(), NOW_MS),
        Err(DelegationError::BadLifetime)
    );
}

#[test]
fn the_stream_protocol_is_negotiated_like_alpn() {
    let (alice, bob) = (identity(MESH, 1), identity(MESH, 2));
    let any = Carries::HTTP1.or(Carries::HTTP2).or(Carries::TCP);
    let h1_only = HandshakeConfig {
        carries: Carries::HTTP1,
        ..Default::default()
    };
    let h2_only = HandshakeConfig {
        carries: Carries::HTTP2,
        ..Default::default()
    };
    let all = HandshakeConfig {
        carries: any,
        ..Default::default()
    };
    // A native caller offering both meets a Wasm (HTTP/2-only) callee: HTTP/2.
    let (ia, ib) = run(&alice, &bob, &all, &h2_only, NOW_MS).unwrap();
    assert_eq!((ia.carries, ib.carries), (Carries::HTTP2, Carries::HTTP2));
    // An HTTP/1.1 caller meets a callee that takes anything: HTTP/1.1.
    let (ia, _) = run(&alice, &bob, &h1_only, &all, NOW_MS).unwrap();
    assert_eq!(ia.carries, Carries::HTTP1);
    // Nothing in common: refused by the responder.
    assert_eq!(
        run(&alice, &bob, &h1_only, &h2_only, NOW_MS).err(),
        Some(HandshakeError::NoCommonCarries)
    );
}

/// An option is on only if both sides take it; a peer of a build before it (which
/// neither offers nor echoes it) is met with the option off, not refused.
#[test]
fn stream_options_are_on_only_if_both_sides_take_them() {
    let (alice, bob) = (identity(MESH, 1), identity(MESH, 2));
    let large = HandshakeConfig::default();
    assert_eq!(large.options, StreamOptions::LARGE_RECORDS, "the default");
    let plain = HandshakeConfig {
        options: StreamOptions::NONE,
        ..Default::default()
    };
    for (a, b, agreed) in [
        (&large, &large, StreamOptions::LARGE_RECORDS),
        (&large, &plain, StreamOptions::NONE),
        (&plain, &large, StreamOptions::NONE),
        (&plain, &plain, StreamOptions::NONE),
    ] {
        let (ia, ib) = run(&alice, &bob, a, b, NOW_MS).unwrap();
        assert_eq!((ia.options, ib.options), (agreed, agreed));
        assert_eq!((ia.carries, ib.carries), (Carries::HTTP2, Carries::HTTP2));
    }
    assert_eq!(StreamOptions::NONE.record_payload(), 16 * 1024);
    assert_eq!(StreamOptions::LARGE_RECORDS.record_payload(), 64 * 1024);
}

#[test]
fn an_oversize_endorsement_is_refused() {
    let (alice, bob) = (identity(MESH, 1), identity(MESH, 2));
    let config = HandshakeConfig::default();
    let a = credential_for(&alice, NOW_MS, HOUR, &vec![7; MAX_ENDORSEMENT_LEN]);
    assert!(run(&a, &bob, &config, &config, NOW_MS).is_ok());
    let a = credential_for(&alice, NOW_MS, HOUR, &vec![7; MAX_ENDORSEMENT_LEN + 1]);
    let err = run(&a, &bob, &config, &config, NOW_MS).err().unwrap();
    assert_eq!(err, HandshakeError::Endorsement);
    // Past the message limit it does not even decode.
    let a = credential_for(&alice, NOW_MS, HOUR, &vec![7; wire::MAX_HANDSHAKE_LEN]);
    let err = run(&a, &bob, &config, &config, NOW_MS).err().unwrap();
    assert!(
        matches!(err, HandshakeError::Wire(wire::WireError::TooLarge { .. })),
        "{err:?}"
    );
    let _ = mesh(MESH);
}

/// The rolling-upgrade decision (docs/PROTOCOL.md §3): v3 does not speak v2, and
/// fails closed. A v2 peer's message 1 is refused by its first byte, before any
/// public-key work, and a v2 responder refuses a v3 Hello the same way: a connection
/// between a v2 and a v3 sidecar is refused, never downgraded.
#[test]
fn a_v2_peer_is_refused_by_its_first_byte() {
    let (alice, bob) = (identity(MESH, 1), identity(MESH, 2));
    let config = HandshakeConfig::default();
    let rng = SystemRandom::new();
    let (_, mut hello) = Initiator::start(&alice, bob.id(), &config, NOW_MS, &rng).unwrap();
    hello[0] = 2;
    let err = refusal_of(&bob, &hello, NOW_MS);
    assert_eq!(
        err,
        HandshakeError::Wire(wire::WireError::UnsupportedVersion(2))
    );
    assert_eq!(
        wire::frame_len(&hello),
        Err(wire::WireError::UnsupportedVersion(2))
    );
}

/// A delegation is for one purpose: a handshake key's never counts for a TLS
/// certificate's key (docs/PROTOCOL.md §8) and the other way round, though both
/// delegate 32 bytes under the same workload key.
#[test]
fn a_delegation_counts_only_for_its_purpose() {
    use themis_core::delegation::Purpose;
    let workload = identity(MESH, 1);
    let key = [7u8; 32];
    let handshake = Delegation::issue(&workload, key, NOW_MS, HOUR);
    let tls = Delegation::issue_for(Purpose::TlsKey, &workload, key, NOW_MS, HOUR);
    assert_eq!(handshake.verify(workload.public(), NOW_MS), Ok(()));
    assert_eq!(
        tls.verify_for(Purpose::TlsKey, workload.public(), NOW_MS),
        Ok(())
    );
    assert_eq!(
        handshake.verify_for(Purpose::TlsKey, workload.public(), NOW_MS),
        Err(DelegationError::BadSignature)
    );
    assert_eq!(
        tls.verify(workload.public(), NOW_MS),
        Err(DelegationError::BadSignature)
    );
}
