//! Full handshakes, both sides in memory, side by side in one group: Themis, the
//! raw `ring` operations it is made of (its lower limit), rustls TLS 1.3 mTLS and
//! snow Noise XX.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use ring::rand::SystemRandom;
use themis_benchmarks::noise::NoisePeers;
use themis_benchmarks::primitives::HandshakeOps;
use themis_benchmarks::themis::Peers;
use themis_benchmarks::tls::Tls;
use themis_core::HandshakeConfig;

fn handshake(c: &mut Criterion) {
    let rng = SystemRandom::new();
    let peers = Peers::generate(&rng);
    let config = HandshakeConfig::default();
    let ops = HandshakeOps::new(&peers.handshake(&config, &rng), &rng);
    let tls = Tls::new();
    let noise = NoisePeers::generate();

    let mut group = c.benchmark_group("handshake");
    group.bench_function("themis", |b| {
        b.iter(|| black_box(peers.handshake(&config, &rng)))
    });
    group.bench_function("primitive_sum", |b| b.iter(|| black_box(ops.run(&rng))));
    group.bench_function("rustls_tls13_mtls", |b| {
        b.iter(|| black_box(tls.connected()))
    });
    group.bench_function("snow_noise_xx", |b| b.iter(|| black_box(noise.handshake())));
    group.finish();
}

criterion_group!(benches, handshake);
criterion_main!(benches);
