//! A noise-robust cross-check of the "Themis ÷ its lower limit" ratios: criterion
//! runs one benchmark after the other, so on a shared machine a change of load
//! between them shows up as a difference. Here the two operations alternate, one
//! run each, so both see the same load; the quantiles of each are compared.
//!
//! `cargo run --release -p themis-benchmarks --bin paired`

use std::hint::black_box;
use std::time::Instant;

use ring::aead;
use ring::rand::SystemRandom;
use themis_benchmarks::primitives::{HandshakeOps, RawAead, TAG_LEN};
use themis_benchmarks::themis::{config_for, seal_open_in_place, Peers};
use themis_core::wire::RECORD_OVERHEAD;
use themis_core::{HandshakeConfig, Suite};

const QUANTILES: [f64; 3] = [0.05, 0.25, 0.5];

/// Alternates `a` and `b` `runs` times and prints their quantiles and `a ÷ b`.
fn paired(name: &str, runs: usize, mut a: impl FnMut(), mut b: impl FnMut()) {
    let time = |op: &mut dyn FnMut()| {
        let start = Instant::now();
        op();
        start.elapsed().as_secs_f64() * 1e6
    };
    let (mut ta, mut tb): (Vec<f64>, Vec<f64>) =
        (0..runs).map(|_| (time(&mut a), time(&mut b))).unzip();
    ta.sort_by(f64::total_cmp);
    tb.sort_by(f64::total_cmp);
    for q in QUANTILES {
        let i = (q * runs as f64) as usize;
        println!(
            "| {name} | p{:.0} | {:.1} µs | {:.1} µs | {:.3} |",
            q * 100.0,
            ta[i],
            tb[i],
            ta[i] / tb[i]
        );
    }
}

fn main() {
    let rng = SystemRandom::new();
    let peers = Peers::generate(&rng);
    let config = HandshakeConfig::default();
    let ops = HandshakeOps::new(&peers.handshake(&config, &rng), &rng);

    println!("| pair (a vs b) | quantile | a | b | a ÷ b |\n|---|---|---:|---:|---:|");
    paired(
        "handshake: themis vs primitive_sum",
        3000,
        || {
            black_box(peers.handshake(&config, &rng));
        },
        || {
            black_box(ops.run(&rng));
        },
    );
    let size = 1000 * 1024;
    for (name, suite, algorithm) in [
        (
            "1000KB: themis_in_place vs ring_aes256gcm_raw",
            Suite::Aes256Gcm,
            &aead::AES_256_GCM,
        ),
        (
            "1000KB: themis_chacha_in_place vs ring_chacha20poly1305_raw",
            Suite::ChaCha20Poly1305,
            &aead::CHACHA20_POLY1305,
        ),
    ] {
        let (mut sender, mut receiver) = peers.sessions(&config_for(suite), &rng);
        let mut record = vec![0u8; size + RECORD_OVERHEAD];
        let mut raw = RawAead::new(algorithm, &rng);
        let mut buf = vec![0u8; size + TAG_LEN];
        paired(
            name,
            1000,
            || {
                black_box(seal_open_in_place(&mut sender, &mut receiver, &mut record));
            },
            || {
                black_box(raw.seal_open(&mut buf));
            },
        );
    }
}
