//! The benchmark drivers do what their names claim.

use ring::rand::SystemRandom;
use rustls::HandshakeKind;
use themis_benchmarks::primitives::{HandshakeOps, RawAead, TAG_LEN};
use themis_benchmarks::themis::{config_for, seal_open_in_place, Peers};
use themis_benchmarks::{noise, tls::Tls};
use themis_core::wire::RECORD_OVERHEAD;
use themis_core::{HandshakeConfig, Suite};

#[test]
fn themis_sessions_use_the_requested_suite_and_carry_records() {
    let rng = SystemRandom::new();
    let peers = Peers::generate(&rng);
    for (config, suite) in [
        (HandshakeConfig::default(), Suite::Aes256Gcm),
        (config_for(Suite::ChaCha20Poly1305), Suite::ChaCha20Poly1305),
    ] {
        let (mut a, mut b) = peers.sessions(&config, &rng);
        assert_eq!((a.info().suite, b.info().suite), (suite, suite));
        let mut record = vec![7u8; 1000 + RECORD_OVERHEAD];
        for _ in 0..3 {
            assert_eq!(seal_open_in_place(&mut a, &mut b, &mut record), 1000);
        }
    }
}

#[test]
fn primitive_sum_and_raw_aead_run() {
    let rng = SystemRandom::new();
    let peers = Peers::generate(&rng);
    let ops = HandshakeOps::new(&peers.handshake(&HandshakeConfig::default(), &rng), &rng);
    ops.run(&rng);
    let mut raw = RawAead::new(&ring::aead::AES_256_GCM, &rng);
    assert_eq!(raw.seal_open(&mut [0u8; 100 + TAG_LEN]), 100);
}

#[test]
fn tls_is_a_full_mutually_authenticated_tls13_handshake() {
    let tls = Tls::new();
    for _ in 0..2 {
        let mut link = tls.connected();
        assert_eq!(link.client.handshake_kind(), Some(HandshakeKind::Full));
        assert_eq!(link.server.handshake_kind(), Some(HandshakeKind::Full));
        assert_eq!(
            link.client.protocol_version(),
            Some(rustls::ProtocolVersion::TLSv1_3)
        );
        let suite = link
            .client
            .negotiated_cipher_suite()
            .expect("suite")
            .suite();
        assert_eq!(suite, rustls::CipherSuite::TLS13_AES_256_GCM_SHA384);
        assert!(
            link.server.peer_certificates().is_some(),
            "the client authenticated"
        );
        let payload = vec![1u8; 100_000];
        let mut received = vec![0u8; payload.len()];
        assert_eq!(link.send(&payload, &mut received), payload.len());
        assert_eq!(received, payload);
    }
}

#[test]
fn noise_xx_carries_large_payloads_in_chunks() {
    let (mut a, mut b) = noise::NoisePeers::generate().handshake();
    let payload: Vec<u8> = (0..200_000u32).map(|i| i as u8).collect();
    let mut received = vec![0u8; payload.len()];
    let mut wire = vec![0u8; noise::MAX_MESSAGE];
    assert_eq!(
        noise::send(&mut a, &mut b, &payload, &mut wire, &mut received),
        payload.len()
    );
    assert_eq!(received, payload);
}
