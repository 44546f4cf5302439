//! One record sealed and opened per iteration, for 1 KB to 1000 KB payloads:
//! Themis in place (AES-256-GCM and ChaCha20-Poly1305), raw `ring` AEAD (the limit),
//! rustls TLS 1.3 (AES-256-GCM) and snow's Noise transport (ChaCha20-Poly1305).

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use ring::aead;
use ring::rand::SystemRandom;
use themis_benchmarks::primitives::{RawAead, TAG_LEN};
use themis_benchmarks::themis::{config_for, seal_open_in_place, Peers};
use themis_benchmarks::tls::Tls;
use themis_benchmarks::{noise, size_label, RECORD_SIZES};
use themis_core::wire::RECORD_OVERHEAD;
use themis_core::{HandshakeConfig, Suite};

fn seal_open(c: &mut Criterion) {
    let rng = SystemRandom::new();
    let peers = Peers::generate(&rng);
    let tls = Tls::new();
    let noise_peers = noise::NoisePeers::generate();

    let mut group = c.benchmark_group("seal_open");
    for size in RECORD_SIZES {
        group.throughput(Throughput::Bytes(size as u64));
        let id = |name| BenchmarkId::new(name, size_label(size));

        let themis = [
            (
                "themis_in_place",
                HandshakeConfig::default(),
                Suite::Aes256Gcm,
            ),
            (
                "themis_chacha_in_place",
                config_for(Suite::ChaCha20Poly1305),
                Suite::ChaCha20Poly1305,
            ),
        ];
        for (name, config, suite) in themis {
            let (mut sender, mut receiver) = peers.sessions(&config, &rng);
            assert_eq!(sender.info().suite, suite);
            let mut record = vec![0u8; size + RECORD_OVERHEAD];
            group.bench_function(id(name), |b| {
                b.iter(|| black_box(seal_open_in_place(&mut sender, &mut receiver, &mut record)))
            });
        }

        let raw = [
            ("ring_aes256gcm_raw", &aead::AES_256_GCM),
            ("ring_chacha20poly1305_raw", &aead::CHACHA20_POLY1305),
        ];
        for (name, algorithm) in raw {
            let mut aead = RawAead::new(algorithm, &rng);
            let mut buf = vec![0u8; size + TAG_LEN];
            group.bench_function(id(name), |b| b.iter(|| black_box(aead.seal_open(&mut buf))));
        }

        let payload = vec![0x5au8; size];
        let mut received = vec![0u8; size];

        let mut link = tls.connected();
        group.bench_function(id("rustls"), |b| {
            b.iter(|| assert_eq!(link.send(&payload, &mut received), size))
        });

        let (mut sender, mut receiver) = noise_peers.handshake();
        let mut wire = vec![0u8; noise::MAX_MESSAGE];
        group.bench_function(id("snow_transport"), |b| {
            b.iter(|| {
                let got = noise::send(
                    &mut sender,
                    &mut receiver,
                    &payload,
                    &mut wire,
                    &mut received,
                );
                assert_eq!(got, size);
            })
        });
    }
    group.finish();
}

criterion_group!(benches, seal_open);
criterion_main!(benches);
